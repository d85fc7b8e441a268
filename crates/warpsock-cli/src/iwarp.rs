//! The warpsock tests over one engine queue pair per test.
//!
//! Messages on the queue pair besides the data (all are RDMAP Sends):
//!
//! * **DONE** (client → server): Send with Solicited Event, 8 bytes: the
//!   number of data messages (or Reads) the client issued. It always finds
//!   a receive: the client never uses the server's last receive credit.
//! * **ACK** (server → client): Send with Solicited Event, 8 bytes: the
//!   number of data messages the server received. The client's clock stops
//!   when it arrives.
//! * **NOTIFY** (RDMA Write latency, both ways): zero-byte Send right after
//!   each Write, so the target learns that the Write was placed (iWARP has
//!   no Write with Immediate). The Write latency is thus "Write + notify".
//! * **CREDIT** (Send bandwidth, server → client): zero-byte Send, one per
//!   [`credit_batch`] receives the server has reposted. iWARP has no
//!   receiver-not-ready retry: a Send that finds no receive kills the
//!   connection, so the sender keeps count.
//!
//! Tests:
//!
//! * Send latency: the client Sends `size` bytes, the server Sends the same
//!   receive buffer back; the client measures from post to its receive
//!   completion.
//! * Write latency: Write + NOTIFY to the server's region, the server Writes
//!   the bytes back into the client's region + NOTIFY.
//! * Read latency: one RDMA Read of `size` bytes from the server's region.
//! * Bandwidth: `window` Sends / Writes / Reads in flight, each from (or
//!   into) its own `size`-byte slot, until the budget is spent; then DONE
//!   and ACK. Writes go to server slot `seq % window`; the server checks
//!   the final contents of every slot (the last Write into each).
//!
//! Private data: see [`crate::ctl`].

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use warpsock_engine::{
    connect, Access, Context, ContextOptions, Cq, Listener, Mr, Pd, Progress, Qp, QpInit,
    QpOptions, RecvWr, SendOp, SendWr, Wc, WcOpcode,
};

use crate::ctl::Tally;
use crate::data::{check, fill, stamp, stamp_spots};
use crate::meter::{Meter, Outcome};
use crate::opts::{ProgressMode, Spec, Test, Transport};
use crate::tcp::IDLE;
use crate::Error;

/// Access rights of the data regions.
const DATA_ACCESS: Access =
    Access(Access::LOCAL_WRITE.0 | Access::REMOTE_WRITE.0 | Access::REMOTE_READ.0);
/// `wr_id` of DONE and ACK.
const CTL_ID: u64 = u64::MAX;
/// `wr_id` of unsignaled data Sends / NOTIFY / CREDIT.
const QUIET_ID: u64 = u64::MAX - 1;

/// Receives the server reposts per CREDIT message.
pub(crate) fn credit_batch(window: usize) -> usize {
    (window / 2).max(1)
}

/// How one side lays out its memory for a test.
#[derive(Debug, Clone, Copy)]
struct Layout {
    /// Data slots of `size` bytes in the region advertised to the peer.
    data_slots: usize,
    /// Receive buffers posted (and reposted).
    pool: usize,
    /// Length of each receive buffer.
    pool_len: usize,
}

impl Layout {
    fn new(spec: &Spec, server: bool) -> Self {
        let (w, big) = (spec.window, spec.size.max(8));
        let (data_slots, pool, pool_len) = match (spec.test, spec.transport, server) {
            (Test::Lat, Transport::Send, _) => (1, 4, big),
            (Test::Lat, Transport::Write, false) => (2, 4, 8),
            (Test::Lat, _, _) => (1, 4, 8),
            (Test::Bw, Transport::Send, true) => (1, 2 * w, big),
            (Test::Bw, Transport::Send, false) => (w, 16, 8),
            (Test::Bw, _, _) => (w, 4, 8),
        };
        Self {
            data_slots,
            pool,
            pool_len,
        }
    }
}

/// The peer's advertised region.
#[derive(Debug, Clone, Copy)]
struct Remote {
    addr: u64,
    rkey: u32,
}

/// One side of a test: its context, memory and queue pair.
struct End {
    _ctx: Context,
    cq: Cq,
    data: Mr,
    pool: Mr,
    ctl: Mr,
    lay: Layout,
    spec: Spec,
    wcs: [Wc; 64],
}

fn context(spec: &Spec) -> Result<Context, Error> {
    let progress = match spec.progress {
        ProgressMode::Caller => Progress::Caller,
        ProgressMode::Thread => Progress::Thread,
    };
    Ok(Context::with_options(ContextOptions {
        progress,
        busy_poll: spec.busy_poll(),
    })?)
}

fn qp_options(spec: &Spec) -> QpOptions {
    let depth = spec.window.max(16) as u16;
    QpOptions {
        crc: spec.crc,
        ird: depth,
        ord: depth,
        ..QpOptions::default()
    }
}

fn send_wr(wr_id: u64, sgl: Vec<warpsock_engine::Sge>, solicited: bool, signaled: bool) -> SendWr {
    SendWr {
        wr_id,
        op: SendOp::Send {
            solicited,
            invalidate: None,
        },
        sgl,
        signaled,
    }
}

fn describe(wc: &Wc, qp: &Qp) -> Error {
    let mut m = format!("{:?} completed with {:?}", wc.opcode, wc.status);
    let events: Vec<String> = std::iter::from_fn(|| qp.poll_event())
        .map(|e| format!("{e:?}"))
        .collect();
    if !events.is_empty() {
        m.push_str(&format!(" (connection: {})", events.join(", ")));
    }
    Error::msg(m)
}

impl End {
    fn new(pd: &Pd, ctx: Context, cq: Cq, spec: &Spec, server: bool) -> Self {
        let lay = Layout::new(spec, server);
        let data = pd.alloc(lay.data_slots * spec.size, DATA_ACCESS);
        data.with_bytes_mut(|b| {
            for (i, slot) in b.chunks_exact_mut(spec.size).enumerate() {
                fill(slot);
                // Read sources carry their slot number; others start invalid.
                let s = if server && spec.transport == Transport::Read {
                    i as u64
                } else {
                    u64::MAX
                };
                stamp(slot, s);
            }
        });
        let pool = pd.alloc(lay.pool * lay.pool_len, Access::LOCAL_WRITE);
        let ctl = pd.alloc(8, Access::LOCAL_WRITE);
        Self {
            _ctx: ctx,
            cq,
            data,
            pool,
            ctl,
            lay,
            spec: spec.clone(),
            wcs: [Wc::default(); 64],
        }
    }

    fn recv_wr(&self, slot: usize) -> RecvWr {
        RecvWr {
            wr_id: slot as u64,
            sgl: vec![self
                .pool
                .sge(slot * self.lay.pool_len, self.lay.pool_len as u32)],
        }
    }

    fn all_recvs(&self) -> Vec<RecvWr> {
        (0..self.lay.pool).map(|i| self.recv_wr(i)).collect()
    }

    fn advertise(&self) -> [u8; 12] {
        let mut a = [0u8; 12];
        a[..8].copy_from_slice(&self.data.addr().to_be_bytes());
        a[8..].copy_from_slice(&self.data.rkey().to_be_bytes());
        a
    }

    /// Waits for completions (at most `max`); any error completion fails.
    ///
    /// With busy polling the wait is cut into busy-poll-long slices, so a
    /// side that waits long (the target of RDMA Reads, which sees no
    /// completion per Read) keeps spinning instead of sleeping after the
    /// first slice — as it would if the engine told it of each request.
    fn wait(&mut self, qp: &Qp, max: usize) -> Result<usize, Error> {
        let slice = match self.spec.busy_poll() {
            d if d.is_zero() => IDLE,
            d => d.min(IDLE),
        };
        let deadline = Instant::now() + IDLE;
        let n = loop {
            let n = self.cq.wait(&mut self.wcs[..max], slice)?;
            if n > 0 {
                break n;
            }
            if Instant::now() >= deadline {
                return Err(Error::msg(format!(
                    "no completion for {} s (the peer stopped)",
                    IDLE.as_secs()
                )));
            }
        };
        if let Some(bad) = self.wcs[..n].iter().find(|w| !w.is_ok()) {
            return Err(describe(bad, qp));
        }
        Ok(n)
    }

    fn one(&mut self, qp: &Qp) -> Result<Wc, Error> {
        self.wait(qp, 1)?;
        Ok(self.wcs[0])
    }

    /// Checks receive buffer `slot` holding a `len`-byte message `seq`.
    fn check_pool(&self, slot: usize, len: usize, seq: u64) -> bool {
        let off = slot * self.lay.pool_len;
        len == self.spec.size
            && self
                .pool
                .with_bytes(|b| check(&b[off..off + len], seq, self.spec.verify))
    }

    fn check_data(&self, slot: usize, seq: u64) -> bool {
        let (off, len) = (slot * self.spec.size, self.spec.size);
        self.data
            .with_bytes(|b| check(&b[off..off + len], seq, self.spec.verify))
    }

    fn stamp_data(&self, slot: usize, seq: u64) {
        let (off, len) = (slot * self.spec.size, self.spec.size);
        self.data
            .with_bytes_mut(|b| stamp(&mut b[off..off + len], seq));
    }

    /// Overwrites a slot's stamps so a Read that does not land is noticed.
    fn spoil_data(&self, slot: usize) {
        let off = slot * self.spec.size;
        self.data.with_bytes_mut(|b| {
            for (o, n) in stamp_spots(self.spec.size) {
                b[off + o..off + o + n].fill(0xa5);
            }
        });
    }

    fn pool_u64(&self, slot: usize) -> u64 {
        let mut b = [0u8; 8];
        self.pool.read(slot * self.lay.pool_len, &mut b);
        u64::from_le_bytes(b)
    }

    /// Posts DONE or ACK carrying `v`.
    fn post_ctl(&self, qp: &Qp, v: u64) -> Result<(), Error> {
        self.ctl.write(0, &v.to_le_bytes());
        qp.post_send(send_wr(CTL_ID, vec![self.ctl.sge(0, 8)], true, true))?;
        Ok(())
    }
}

fn parse_be(b: &[u8]) -> u64 {
    b.iter().fold(0, |a, &x| (a << 8) | u64::from(x))
}

/// Client side of a warpsock test against the server's data port.
pub(crate) fn client(
    addr: SocketAddr,
    token: u64,
    spec: &Spec,
    meter: &mut Meter<'_>,
) -> Result<Outcome, Error> {
    let ctx = context(spec)?;
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq(256)?;
    let mut e = End::new(&pd, ctx.clone(), cq, spec, false);
    let mut init = QpInit::new(&pd, &e.cq);
    init.options = qp_options(spec);
    init.options.private_data = token.to_le_bytes().to_vec();
    init.options.private_data.extend_from_slice(&e.advertise());
    init.recvs = e.all_recvs();
    let qp = connect(addr, &init)
        .map_err(|err| Error::from(err).context(format!("iWARP connection to {addr}")))?;
    let pdata = qp
        .negotiated()
        .map(|n| n.peer_private_data)
        .unwrap_or_default();
    if pdata.len() < 16 {
        return Err(Error::msg("the server's MPA private data is too short"));
    }
    let remote = Remote {
        addr: parse_be(&pdata[..8]),
        rkey: parse_be(&pdata[8..12]) as u32,
    };
    let credits = parse_be(&pdata[12..16]) as usize;
    let mut out = Outcome::default();
    meter.restart();
    let t0 = Instant::now();
    let sent = match spec.test {
        Test::Lat => lat_client(&mut e, &qp, remote, meter, &mut out)?,
        Test::Bw => bw_client(&mut e, &qp, remote, credits, meter, &mut out)?,
    };
    // DONE, then wait for the ACK (credits may still arrive).
    e.post_ctl(&qp, sent)?;
    let acked = loop {
        let wc = e.one(&qp)?;
        if wc.opcode == WcOpcode::Recv {
            if wc.solicited {
                break e.pool_u64(wc.wr_id as usize);
            }
            qp.post_recv(e.recv_wr(wc.wr_id as usize))?;
        }
    };
    out.elapsed = t0.elapsed();
    let counted = matches!(
        (spec.test, spec.transport),
        (_, Transport::Send) | (Test::Lat, Transport::Write)
    );
    if counted && acked != sent {
        return Err(Error::msg(format!(
            "sent {sent} messages but the server received {acked}"
        )));
    }
    out.sent = sent;
    out.intervals = meter.finish();
    Ok(out)
}

fn lat_client(
    e: &mut End,
    qp: &Qp,
    r: Remote,
    meter: &mut Meter<'_>,
    out: &mut Outcome,
) -> Result<u64, Error> {
    let size = e.spec.size;
    let mut seq = 0u64;
    while meter.more(seq) {
        let t;
        let ok = match e.spec.transport {
            Transport::Send => {
                e.stamp_data(0, seq);
                t = Instant::now();
                qp.post_send(send_wr(
                    QUIET_ID,
                    vec![e.data.sge(0, size as u32)],
                    false,
                    false,
                ))?;
                let wc = e.one(qp)?;
                let slot = wc.wr_id as usize;
                let ok =
                    wc.opcode == WcOpcode::Recv && e.check_pool(slot, wc.byte_len as usize, seq);
                qp.post_recv(e.recv_wr(slot))?;
                ok
            }
            Transport::Write => {
                e.stamp_data(0, seq);
                t = Instant::now();
                qp.post_send_batch([
                    SendWr {
                        wr_id: QUIET_ID,
                        op: SendOp::Write {
                            remote_addr: r.addr,
                            rkey: r.rkey,
                        },
                        sgl: vec![e.data.sge(0, size as u32)],
                        signaled: false,
                    },
                    send_wr(QUIET_ID, vec![], false, false),
                ])
                .map_err(|(_, err)| Error::from(err))?;
                let wc = e.one(qp)?;
                // The server wrote the bytes back into our slot 1.
                let ok = wc.opcode == WcOpcode::Recv && e.check_data(1, seq);
                qp.post_recv(e.recv_wr(wc.wr_id as usize))?;
                ok
            }
            Transport::Read => {
                e.spoil_data(0);
                t = Instant::now();
                qp.post_send(SendWr {
                    wr_id: 0,
                    op: SendOp::Read {
                        remote_addr: r.addr,
                        rkey: r.rkey,
                    },
                    sgl: vec![e.data.sge(0, size as u32)],
                    signaled: true,
                })?;
                let wc = e.one(qp)?;
                wc.opcode == WcOpcode::RdmaRead && e.check_data(0, 0)
            }
            Transport::Tcp => unreachable!("TCP runs in crate::tcp"),
        };
        let rtt = t.elapsed();
        out.tally.add(size, ok);
        if !meter.warming(seq) {
            out.rtts_ns.push(rtt.as_nanos() as u64);
        }
        seq += 1;
    }
    Ok(seq)
}

fn bw_client(
    e: &mut End,
    qp: &Qp,
    r: Remote,
    credits: usize,
    meter: &mut Meter<'_>,
    out: &mut Outcome,
) -> Result<u64, Error> {
    let (size, w) = (e.spec.size, e.spec.window);
    let transport = e.spec.transport;
    let batch = credit_batch(w);
    // Send: keep the server's last receive for DONE.
    let mut avail = if transport == Transport::Send {
        credits.saturating_sub(1)
    } else {
        usize::MAX
    };
    if avail == 0 {
        return Err(Error::msg("the server offers no receive credits"));
    }
    let mut free: Vec<usize> = (0..w).rev().collect();
    let mut seq = 0u64;
    let mut stop = false;
    loop {
        while !stop && !free.is_empty() && avail > 0 {
            if !meter.more(seq) {
                stop = true;
                break;
            }
            let slot = free.pop().expect("checked non-empty");
            let target = r.addr + (seq % w as u64) * size as u64;
            let sge = e.data.sge(slot * size, size as u32);
            let wr = match transport {
                Transport::Send => {
                    e.stamp_data(slot, seq);
                    send_wr(slot as u64, vec![sge], false, true)
                }
                Transport::Write => {
                    e.stamp_data(slot, seq);
                    SendWr {
                        wr_id: slot as u64,
                        op: SendOp::Write {
                            remote_addr: target,
                            rkey: r.rkey,
                        },
                        sgl: vec![sge],
                        signaled: true,
                    }
                }
                _ => {
                    e.spoil_data(slot);
                    SendWr {
                        wr_id: slot as u64 | ((seq % w as u64) << 32),
                        op: SendOp::Read {
                            remote_addr: target,
                            rkey: r.rkey,
                        },
                        sgl: vec![sge],
                        signaled: true,
                    }
                }
            };
            qp.post_send(wr)?;
            seq += 1;
            if transport == Transport::Send {
                avail -= 1;
            }
        }
        if stop && free.len() == w {
            break;
        }
        let n = e.wait(qp, 64)?;
        for i in 0..n {
            let wc = e.wcs[i];
            match wc.opcode {
                WcOpcode::Recv => {
                    // CREDIT: the server reposted `batch` receives.
                    avail += batch;
                    qp.post_recv(e.recv_wr(wc.wr_id as usize))?;
                }
                op => {
                    let slot = (wc.wr_id & 0xffff_ffff) as usize;
                    if op == WcOpcode::RdmaRead {
                        let ok = e.check_data(slot, wc.wr_id >> 32);
                        out.tally.add(wc.byte_len as usize, ok);
                    }
                    out.data_bytes += u64::from(wc.byte_len);
                    meter.account(u64::from(wc.byte_len));
                    free.push(slot);
                }
            }
        }
    }
    Ok(seq)
}

/// Server side: prepares memory and receives for `spec`, calls `ready`
/// (which tells the client to connect), accepts the client's queue pair
/// and serves the test until DONE.
pub(crate) fn serve(
    listener: &Listener,
    token: u64,
    spec: &Spec,
    ready: impl FnOnce() -> Result<(), Error>,
) -> Result<Tally, Error> {
    let ctx = context(spec)?;
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq(256)?;
    let mut e = End::new(&pd, ctx.clone(), cq, spec, true);
    let mut init = QpInit::new(&pd, &e.cq);
    init.options = qp_options(spec);
    init.recvs = e.all_recvs();
    let mut reply = e.advertise().to_vec();
    reply.extend_from_slice(&(e.lay.pool as u32).to_be_bytes());
    ready()?;
    let req = listener
        .accept(Some(Duration::from_secs(10)))
        .map_err(|err| Error::from(err).context("waiting for the client's iWARP connection"))?;
    let pdata = req.private_data().to_vec();
    if pdata.len() < 20 || pdata[..8] != token.to_le_bytes() {
        let _ = req.reject(b"bad token");
        return Err(Error::msg("an iWARP connection with a wrong token"));
    }
    let remote = Remote {
        addr: parse_be(&pdata[8..16]),
        rkey: parse_be(&pdata[16..20]) as u32,
    };
    let qp = req.accept(&init, &reply)?;
    let mut tally = Tally::default();
    let batch = credit_batch(spec.window);
    let mut since_credit = 0;
    let (size, w) = (spec.size, spec.window as u64);
    let done = loop {
        let wc = e.one(&qp)?;
        let slot = wc.wr_id as usize;
        match wc.opcode {
            WcOpcode::Recv if wc.solicited => break e.pool_u64(slot),
            WcOpcode::Recv => match (spec.test, spec.transport) {
                (Test::Lat, Transport::Send) => {
                    let len = wc.byte_len as usize;
                    tally.add(len, e.check_pool(slot, len, tally.msgs));
                    // Echo from the receive buffer; repost it once sent.
                    let sge = e.pool.sge(slot * e.lay.pool_len, len as u32);
                    qp.post_send(send_wr(slot as u64, vec![sge], false, true))?;
                }
                (Test::Lat, Transport::Write) => {
                    tally.add(size, e.check_data(0, tally.msgs));
                    qp.post_send_batch([
                        SendWr {
                            wr_id: QUIET_ID,
                            op: SendOp::Write {
                                remote_addr: remote.addr + size as u64,
                                rkey: remote.rkey,
                            },
                            sgl: vec![e.data.sge(0, size as u32)],
                            signaled: false,
                        },
                        send_wr(QUIET_ID, vec![], false, false),
                    ])
                    .map_err(|(_, err)| Error::from(err))?;
                    qp.post_recv(e.recv_wr(slot))?;
                }
                (Test::Bw, Transport::Send) => {
                    let len = wc.byte_len as usize;
                    tally.add(len, e.check_pool(slot, len, tally.msgs));
                    qp.post_recv(e.recv_wr(slot))?;
                    since_credit += 1;
                    if since_credit == batch {
                        since_credit = 0;
                        qp.post_send(send_wr(QUIET_ID, vec![], false, false))?;
                    }
                }
                _ => return Err(Error::msg("unexpected Send from the client")),
            },
            WcOpcode::Send if wc.wr_id < e.lay.pool as u64 => qp.post_recv(e.recv_wr(slot))?,
            _ => {}
        }
    };
    if (spec.test, spec.transport) == (Test::Bw, Transport::Write) {
        // Writes raise nothing here: check the last Write into each slot.
        for k in 0..w.min(done) {
            let last = k + w * ((done - 1 - k) / w);
            let writes = (done - k).div_ceil(w);
            let ok = e.check_data(k as usize, last);
            tally.msgs += writes;
            tally.bytes += writes * size as u64;
            if ok {
                tally.verified += writes * size as u64;
            }
        }
    }
    e.post_ctl(&qp, tally.msgs)?;
    loop {
        let wc = e.one(&qp)?;
        if wc.wr_id == CTL_ID && wc.opcode == WcOpcode::Send {
            break;
        }
    }
    Ok(tally)
}
