//! The perftest `-R` client: control connection, data connection, the
//! three bandwidth tests, and the verification passes.

use std::net::{SocketAddr, ToSocketAddrs};
use std::time::{Duration, Instant};

use warpsock_engine::{
    Access, Context, Mr, Pd, Progress, QpInit, RecvWr, SendOp, SendWr, Wc, WcOpcode,
};

use crate::chan::{connect_retrying, Chan};
use crate::msg::{self, BwReport, Dest};
use crate::{Error, Params, Provoke, Report, Test};
use warpsock_engine::proto::wire::terminate::TermCode;

/// Receive buffers on the control connection (perftest's messages are at
/// most [`msg::DEST_LEN`] bytes).
const CTRL_RECVS: u64 = 4;
const CTRL_BUF: usize = 64;
/// `wr_id` of control Sends.
const WR_CTRL_SEND: u64 = 1 << 40;
/// Waits for the reply to the first control message before a kick.
const KICK_AFTER: Duration = Duration::from_secs(1);
const MAX_KICKS: u32 = 3;
/// Reads per pattern in a verified Read test.
const VERIFY_BATCH: u64 = 16;

/// The control connection: perftest's lock-step message exchange.
struct Ctrl {
    ch: Chan,
    send: Mr,
    recv: Mr,
    exchanged: u32,
}

impl Ctrl {
    fn open(ctx: &Context, pd: &Pd, addr: SocketAddr, p: &Params) -> Result<Self, Error> {
        let cq = ctx.create_cq(64)?;
        let send = pd.alloc(CTRL_BUF, Access::LOCAL_READ);
        let recv = pd.alloc(CTRL_BUF * CTRL_RECVS as usize, Access::LOCAL_WRITE);
        let mut init = QpInit::new(pd, &cq);
        init.options.crc = p.crc;
        init.options.peer_to_peer = false;
        init.options.ird = 1;
        init.options.ord = 1;
        init.options.sq_depth = 16;
        init.options.rq_depth = 16;
        init.options.connect_timeout = p.timeout;
        init.options.mpa_timeout = p.timeout;
        for i in 0..CTRL_RECVS {
            init.recvs.push(recv_wr(&recv, i));
        }
        let qp = connect_retrying(addr, &init, p.timeout, "control connection")?;
        Ok(Self {
            ch: Chan::new(qp, cq),
            send,
            recv,
            exchanged: 0,
        })
    }

    /// Sends `mine`, waits for the peer's message of the same step and
    /// returns it (the receive is re-posted).
    fn xchg(
        &mut self,
        mine: &[u8],
        step: &'static str,
        timeout: Duration,
    ) -> Result<Vec<u8>, Error> {
        self.send.write(0, mine);
        self.ch
            .qp
            .post_send(SendWr {
                wr_id: WR_CTRL_SEND,
                op: SendOp::Send {
                    solicited: false,
                    invalidate: None,
                },
                sgl: self.send.sge(0, mine.len() as u32).into(),
                signaled: true,
            })
            .map_err(|e| Error::Post { step, source: e })?;
        let is_recv = |w: &Wc| w.opcode == WcOpcode::Recv;
        let wc = if self.exchanged == 0 {
            // The first message may sit unread in siw (accept race): kick.
            let start = Instant::now();
            let mut slice = KICK_AFTER;
            loop {
                let left = timeout.saturating_sub(start.elapsed());
                let kick = self.ch.kicks < MAX_KICKS && left > slice;
                match self
                    .ch
                    .wait_for(is_recv, step, if kick { slice } else { left })?
                {
                    Some(wc) => break wc,
                    None if kick => {
                        self.ch.kick()?;
                        slice *= 2;
                    }
                    None => {
                        return Err(Error::Timeout {
                            step,
                            after: timeout,
                        })
                    }
                }
            }
        } else {
            self.ch.wait(is_recv, step, timeout)?
        };
        self.ch.wait(|w| w.wr_id == WR_CTRL_SEND, step, timeout)?;
        let slot = wc.wr_id;
        let mut got = vec![0u8; wc.byte_len as usize];
        self.recv.read(slot as usize * CTRL_BUF, &mut got);
        self.ch
            .qp
            .post_recv(recv_wr(&self.recv, slot))
            .map_err(|e| Error::Post { step, source: e })?;
        self.exchanged += 1;
        Ok(got)
    }

    /// A `pingpong_dest` exchange; checks the peer's message is one.
    fn hand_shake(&mut self, mine: &Dest, step: &'static str, t: Duration) -> Result<Dest, Error> {
        let got = self.xchg(&mine.encode(), step, t)?;
        Dest::decode(&got).ok_or(Error::Protocol {
            step,
            what: format!(
                "{} bytes where a {}-byte pingpong_dest was due",
                got.len(),
                msg::DEST_LEN
            ),
        })
    }
}

fn recv_wr(recv: &Mr, slot: u64) -> RecvWr {
    RecvWr {
        wr_id: slot,
        sgl: recv.sge(slot as usize * CTRL_BUF, CTRL_BUF as u32).into(),
    }
}

/// Fills `buf` with the pattern of message `tag` (8-byte words, each a
/// function of the tag and its index, so misplaced data never matches).
pub(crate) fn fill(buf: &mut [u8], tag: u64) {
    for (k, w) in buf.chunks_mut(8).enumerate() {
        let v = pattern_word(tag, k as u64).to_le_bytes();
        w.copy_from_slice(&v[..w.len()]);
    }
}

fn pattern_word(tag: u64, k: u64) -> u64 {
    (tag.wrapping_add(1)).wrapping_mul(0x9e37_79b9_7f4a_7c15)
        ^ k.wrapping_mul(0xff51_afd7_ed55_8ccd)
}

/// Checks `buf` against the pattern of `tag`; the first differing byte.
pub(crate) fn check(buf: &[u8], tag: u64) -> Option<usize> {
    for (k, w) in buf.chunks(8).enumerate() {
        let v = pattern_word(tag, k as u64).to_le_bytes();
        if w != &v[..w.len()] {
            let i = w
                .iter()
                .zip(v.iter())
                .position(|(a, b)| a != b)
                .unwrap_or(0);
            return Some(k * 8 + i);
        }
    }
    None
}

/// Runs one perftest bandwidth test against a `-R` server.
pub(crate) fn run(p: &Params) -> Result<Report, Error> {
    let addr = (p.host.as_str(), p.port)
        .to_socket_addrs()
        .map_err(Error::Io)?
        .next()
        .ok_or_else(|| Error::Io(std::io::Error::other("address did not resolve")))?;
    let t = p.timeout;
    let ctx = Context::new(Progress::Caller)?;
    let pd = ctx.alloc_pd();
    let mut ctrl = Ctrl::open(&ctx, &pd, addr, p)?;

    let v = ctrl.xchg(&msg::version_msg(), "version exchange", t)?;
    let server_version = msg::version_text(&v);
    ctrl.xchg(&4096u32.to_be_bytes(), "cycle buffer exchange", t)?;
    ctrl.xchg(&64u32.to_be_bytes(), "cache line exchange", t)?;
    ctrl.xchg(&msg::MTU_MSG, "MTU exchange", t)?;
    ctrl.hand_shake(&Dest::default(), "pre-connect hand shake", t)?;

    // The data connection.
    let size = p.size as usize;
    let cq = ctx.create_cq(4 * p.tx_depth + 64)?;
    let mut init = QpInit::new(&pd, &cq);
    let o = &mut init.options;
    o.crc = p.crc;
    o.peer_to_peer = false;
    o.ird = 128;
    o.ord = if p.test == Test::Read { 128 } else { 16 };
    o.sq_depth = 2 * p.tx_depth + 16;
    o.rq_depth = 16;
    o.connect_timeout = t;
    o.mpa_timeout = t;
    let data_access = Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE;
    let slots = p.tx_depth.max(2) + 1;
    let local = pd.alloc(size * slots, data_access);
    let credit = pd.alloc(8, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    // The server listens for it only after the exchange above (perftest's
    // own client retries too).
    let qp = connect_retrying(addr, &init, t, "data connection")?;
    let mut data = Chan::new(qp, cq);
    ctrl.hand_shake(&Dest::default(), "post-connect hand shake", t)?;

    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let psn = (nanos ^ std::process::id()) & 0xff_ffff;
    let mut mine = Dest {
        out_reads: if p.test == Test::Read { 128 } else { 1 },
        qpn: data.qp.qp_num(),
        psn,
        rkey: local.rkey(),
        vaddr: local.addr(),
        ..Dest::default()
    };
    if p.test == Test::Send {
        // perftest's iWARP credits: the server RDMA Writes its receive
        // count (u32, host order) here.
        mine.rkey = credit.rkey();
        mine.vaddr = credit.addr() + 4;
    }
    let pre = if p.test == Test::Send { 4 } else { 3 };
    let mut server = Dest::default();
    for i in 0..pre {
        let d = ctrl.hand_shake(&mine, "hand shake before the test", t)?;
        if i == 0 {
            server = d;
        }
    }

    let mut rep = Report {
        test: p.test,
        size: p.size,
        iters: p.iters,
        bytes: 0,
        elapsed: Duration::ZERO,
        verified_bytes: 0,
        extra_bytes: 0,
        server_version,
        server_rkey: server.rkey,
        server_vaddr: server.vaddr,
        kicks: 0,
        crc: data.qp.negotiated().is_some_and(|n| n.crc),
        terminated: None,
    };
    if let Some(pv) = p.provoke {
        rep.terminated = Some(provoke(p, pv, &mut data, &local, &server)?);
        rep.kicks = ctrl.ch.kicks + data.kicks;
        return Ok(rep);
    }
    match p.test {
        Test::Write => write_test(p, &mut data, &local, &server, &mut rep)?,
        Test::Read => read_test(p, &mut data, &local, &server, &mut rep)?,
        Test::Send => send_test(p, &mut data, &local, &credit, &mut rep)?,
    }

    if p.test != Test::Send {
        ctrl.hand_shake(&mine, "hand shake after the test", t)?;
        let secs = rep.elapsed.as_secs_f64().max(1e-9);
        let mbs = rep.bytes as f64 / secs / (1u64 << 20) as f64;
        let r = BwReport {
            size: u64::from(p.size),
            iters: p.iters,
            bw_peak: mbs,
            bw_avg: mbs,
            msg_rate: p.iters as f64 / secs / 1e6,
        };
        for m in r.messages() {
            ctrl.xchg(&m, "bandwidth report exchange", t)?;
        }
    }
    ctrl.hand_shake(&mine, "closing hand shake", t)?;
    rep.kicks = ctrl.ch.kicks + data.kicks;
    data.close();
    ctrl.ch.close();
    Ok(rep)
}

/// Makes siw terminate the data connection; returns the Terminate seen.
fn provoke(
    p: &Params,
    pv: Provoke,
    ch: &mut Chan,
    local: &Mr,
    server: &Dest,
) -> Result<(TermCode, bool), Error> {
    let step = "provoking a Terminate";
    let bad_key = server.rkey ^ 0x5a;
    // Far beyond perftest's 2 * max(size, 4096) buffer.
    let beyond = server.vaddr + 64 * u64::from(p.size.max(4096));
    let len = p.size.min(4096);
    let op = match pv {
        Provoke::WriteBadStag => SendOp::Write {
            remote_addr: server.vaddr,
            rkey: bad_key,
        },
        Provoke::WriteBounds => SendOp::Write {
            remote_addr: beyond,
            rkey: server.rkey,
        },
        Provoke::ReadBadStag => SendOp::Read {
            remote_addr: server.vaddr,
            rkey: bad_key,
        },
        Provoke::ReadBounds => SendOp::Read {
            remote_addr: beyond,
            rkey: server.rkey,
        },
        Provoke::SendTooLong => SendOp::Send {
            solicited: false,
            invalidate: None,
        },
    };
    let len = if pv == Provoke::SendTooLong {
        p.size + 8
    } else {
        len
    };
    post(
        ch,
        SendWr {
            wr_id: 1,
            op,
            sgl: local.sge(0, len).into(),
            signaled: true,
        },
        step,
    )?;
    // One more message behind it, in case siw left the first unread.
    match ch.wait_for(|_| false, step, Duration::from_secs(2)) {
        Err(Error::Terminated { code, by_peer, .. }) => return Ok((code, by_peer)),
        Err(e) => return Err(e),
        Ok(_) => {}
    }
    ch.kick()?;
    match ch.wait_for(|_| false, step, p.timeout) {
        Err(Error::Terminated { code, by_peer, .. }) => Ok((code, by_peer)),
        Err(e) => Err(e),
        Ok(_) => Err(Error::Timeout {
            step,
            after: p.timeout,
        }),
    }
}

fn post(ch: &Chan, wr: SendWr, step: &'static str) -> Result<(), Error> {
    ch.qp
        .post_send(wr)
        .map_err(|e| Error::Post { step, source: e })
}

/// ib_write_bw: `iters` RDMA Writes of `size` bytes into the server's
/// buffer (which is exactly one message long), at most `tx_depth`
/// outstanding; a final 8-byte RDMA Read makes the clock include the
/// placement of the last Write. With `verify`, every Write carries its own
/// pattern and the same remote bytes are RDMA Read back (on the same
/// connection, so after the Write is placed) and compared before the next
/// Write: lock-step, as any later Write would overwrite them.
fn write_test(
    p: &Params,
    ch: &mut Chan,
    local: &Mr,
    server: &Dest,
    rep: &mut Report,
) -> Result<(), Error> {
    let size = p.size as usize;
    let t = p.timeout;
    let step = "RDMA Write test";
    let start = Instant::now();
    let write = |i: u64, slot: usize, signaled: bool| SendWr {
        wr_id: i,
        op: SendOp::Write {
            remote_addr: server.vaddr,
            rkey: server.rkey,
        },
        sgl: local.sge(slot * size, p.size).into(),
        signaled,
    };
    let read = |i: u64, len: u32| SendWr {
        wr_id: i,
        op: SendOp::Read {
            remote_addr: server.vaddr,
            rkey: server.rkey,
        },
        sgl: local.sge(size, len).into(),
        signaled: true,
    };
    if p.verify {
        for i in 0..p.iters {
            local.with_bytes_mut(|b| fill(&mut b[..size], i));
            post(ch, write(i, 0, false), step)?;
            post(ch, read(i, p.size), step)?;
            ch.wait(|w| w.opcode == WcOpcode::RdmaRead && w.wr_id == i, step, t)?;
            if let Some(offset) = local.with_bytes(|b| check(&b[size..2 * size], i)) {
                return Err(Error::Mismatch {
                    iteration: i,
                    offset,
                });
            }
            rep.verified_bytes += u64::from(p.size);
        }
        rep.extra_bytes = p.iters * u64::from(p.size);
    } else {
        local.with_bytes_mut(|b| fill(&mut b[..size], 0));
        let (mut posted, mut done) = (0u64, 0u64);
        while done < p.iters {
            while posted < p.iters && posted - done < p.tx_depth as u64 {
                post(ch, write(posted, 0, true), step)?;
                posted += 1;
            }
            ch.wait(|w| w.opcode == WcOpcode::RdmaWrite, step, t)?;
            done += 1;
        }
        post(ch, read(u64::MAX - 1, 8), step)?;
        ch.wait(|w| w.opcode == WcOpcode::RdmaRead, step, t)?;
        rep.extra_bytes = 8;
    }
    rep.elapsed = start.elapsed();
    rep.bytes = p.iters * u64::from(p.size);
    Ok(())
}

/// ib_read_bw: `iters` RDMA Reads of `size` bytes from the server's
/// buffer, at most `tx_depth` (and the negotiated ORD) outstanding. With
/// `verify`, Reads go in batches of up to [`VERIFY_BATCH`]: an RDMA Write
/// first puts a new pattern into the server's buffer, then the batch's
/// Reads (served after it) are each compared with it.
fn read_test(
    p: &Params,
    ch: &mut Chan,
    local: &Mr,
    server: &Dest,
    rep: &mut Report,
) -> Result<(), Error> {
    let size = p.size as usize;
    let t = p.timeout;
    let step = "RDMA Read test";
    let ord = ch.qp.negotiated().map_or(1, |n| usize::from(n.ord.max(1)));
    let depth = p.tx_depth.min(ord).max(1) as u64;
    let batch = if p.verify {
        depth.min(VERIFY_BATCH)
    } else {
        u64::MAX
    };
    let start = Instant::now();
    let (mut posted, mut done) = (0u64, 0u64);
    while done < p.iters {
        if p.verify && posted == done && posted % batch == 0 {
            let tag = posted / batch;
            local.with_bytes_mut(|b| fill(&mut b[..size], tag));
            post(
                ch,
                SendWr {
                    wr_id: u64::MAX - 2,
                    op: SendOp::Write {
                        remote_addr: server.vaddr,
                        rkey: server.rkey,
                    },
                    sgl: local.sge(0, p.size).into(),
                    signaled: false,
                },
                step,
            )?;
            rep.extra_bytes += u64::from(p.size);
        }
        let batch_end = if p.verify {
            (done / batch + 1) * batch
        } else {
            u64::MAX
        };
        while posted < p.iters && posted - done < depth && posted < batch_end {
            // Sinks after the verification source slot.
            let sink = 1 + (posted % depth) as usize;
            post(
                ch,
                SendWr {
                    wr_id: posted,
                    op: SendOp::Read {
                        remote_addr: server.vaddr,
                        rkey: server.rkey,
                    },
                    sgl: local.sge(sink * size, p.size).into(),
                    signaled: true,
                },
                step,
            )?;
            posted += 1;
        }
        let want = done;
        ch.wait(
            |w| w.opcode == WcOpcode::RdmaRead && w.wr_id == want,
            step,
            t,
        )?;
        if p.verify {
            let sink = 1 + (want % depth) as usize;
            let tag = want / batch;
            if let Some(offset) =
                local.with_bytes(|b| check(&b[sink * size..(sink + 1) * size], tag))
            {
                return Err(Error::Mismatch {
                    iteration: want,
                    offset,
                });
            }
            rep.verified_bytes += u64::from(p.size);
        }
        done += 1;
    }
    rep.elapsed = start.elapsed();
    rep.bytes = p.iters * u64::from(p.size);
    Ok(())
}

/// ib_send_bw: `iters` Sends of `size` bytes, flow-controlled by perftest's
/// iWARP credits: at most `rx_depth` Sends beyond the count the server last
/// RDMA Wrote into our credit word.
fn send_test(
    p: &Params,
    ch: &mut Chan,
    local: &Mr,
    credit: &Mr,
    rep: &mut Report,
) -> Result<(), Error> {
    let t = p.timeout;
    let step = "Send test";
    local.with_bytes_mut(|b| fill(&mut b[..p.size as usize], 0));
    let start = Instant::now();
    let (mut posted, mut done) = (0u64, 0u64);
    let mut stalled_since: Option<Instant> = None;
    while done < p.iters {
        let mut c = [0u8; 4];
        credit.read(4, &mut c);
        let credits = u64::from(u32::from_le_bytes(c));
        let mut progressed = false;
        while posted < p.iters
            && posted - done < p.tx_depth as u64
            && posted + 1 - credits.min(posted + 1) < u64::from(p.rx_depth)
        {
            post(
                ch,
                SendWr {
                    wr_id: posted,
                    op: SendOp::Send {
                        solicited: false,
                        invalidate: None,
                    },
                    sgl: local.sge(0, p.size).into(),
                    signaled: true,
                },
                step,
            )?;
            posted += 1;
            progressed = true;
        }
        match ch.wait_for(
            |w| w.opcode == WcOpcode::Send,
            step,
            Duration::from_millis(20),
        )? {
            Some(_) => {
                done += 1;
                progressed = true;
            }
            None if done == posted => {
                // Waiting for credits only.
            }
            None => {}
        }
        if progressed {
            stalled_since = None;
        } else if stalled_since.get_or_insert_with(Instant::now).elapsed() > t {
            return Err(Error::Timeout {
                step: "Send test (credits)",
                after: t,
            });
        }
    }
    rep.elapsed = start.elapsed();
    rep.bytes = p.iters * u64::from(p.size);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pattern_roundtrip_and_detects_errors() {
        let mut b = vec![0u8; 1003];
        fill(&mut b, 7);
        assert_eq!(check(&b, 7), None);
        assert_eq!(check(&b, 8), Some(0));
        b[517] ^= 1;
        assert_eq!(check(&b, 7), Some(517));
    }
}
