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
//! * Bandwidth: `window` Sends / Writes / Reads in flight until the budget
//!   is spent; then DONE and ACK. Memory is touched as a TCP program that
//!   reuses one buffer touches it: each Send or Write is gathered from its
//!   own 16-byte stamp slot plus one body shared by all messages (see
//!   [`crate::data`]), Send receives scatter the same way, every Write goes
//!   to the one target region (the server checks that it holds the last
//!   Write, in full), and every Read lands in one region whose contents are
//!   checked against the source's constant stamp.
//!
//! Private data: see [`crate::ctl`].

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use warpsock_engine::{
    connect, Access, Context, ContextOptions, Cq, Listener, Mr, Pd, Progress, Qp, QpInit,
    QpOptions, RecvWr, SendOp, SendWr, Sge, Wc, WcOpcode,
};

use crate::ctl::Tally;
use crate::data::{check, check_pattern, fill, gathered, stamp, stamp_spots};
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

/// Constant sequence stamp of the RDMA Read source.
const READ_SEQ: u64 = 0x5eed_0000_0000_0001;

/// `size`-byte messages in `n` slots: each slot is the whole message for
/// small sizes, or a 16-byte head/tail stamp pair around one body shared
/// by all slots for [`gathered`] sizes (sent with a gather list, received
/// with a scatter list). See [`crate::data`].
struct Frames {
    stamps: Mr,
    body: Option<Mr>,
    size: usize,
    slot: usize,
}

impl Frames {
    /// `n` slots; a small slot holds at least `min_slot` bytes (receives
    /// that may also take an 8-byte control message).
    fn new(pd: &Pd, n: usize, size: usize, min_slot: usize) -> Self {
        let gather = gathered(size);
        let slot = if gather { 16 } else { size.max(min_slot) };
        let stamps = pd.alloc(n.max(1) * slot, DATA_ACCESS);
        let body = gather.then(|| {
            let b = pd.alloc(size, DATA_ACCESS);
            b.with_bytes_mut(fill);
            b
        });
        if !gather {
            stamps.with_bytes_mut(|b| {
                for s in b.chunks_exact_mut(slot) {
                    fill(&mut s[..size]);
                    stamp(&mut s[..size], u64::MAX);
                }
            });
        }
        Self {
            stamps,
            body,
            size,
            slot,
        }
    }

    /// Gather list of message `i`.
    fn sgl(&self, i: usize) -> Vec<Sge> {
        let off = i * self.slot;
        match &self.body {
            Some(b) => vec![
                self.stamps.sge(off, 8),
                b.sge(8, (self.size - 16) as u32),
                self.stamps.sge(off + 8, 8),
            ],
            None => vec![self.stamps.sge(off, self.size as u32)],
        }
    }

    /// Scatter list of a receive into slot `i` (the whole slot).
    fn recv_sgl(&self, i: usize) -> Vec<Sge> {
        match &self.body {
            Some(_) => self.sgl(i),
            None => vec![self.stamps.sge(i * self.slot, self.slot as u32)],
        }
    }

    fn stamp(&self, i: usize, seq: u64) {
        let off = i * self.slot;
        let size = self.size;
        self.stamps.with_bytes_mut(|b| match &self.body {
            Some(_) => {
                b[off..off + 8].copy_from_slice(&seq.to_le_bytes());
                b[off + 8..off + 16].copy_from_slice(&seq.to_le_bytes());
            }
            None => stamp(&mut b[off..off + size], seq),
        });
    }

    /// Whether slot `i` holds a `len`-byte message `seq` (and, if `full`,
    /// the pattern everywhere else).
    fn check(&self, i: usize, len: usize, seq: u64, full: bool) -> bool {
        if len != self.size {
            return false;
        }
        let off = i * self.slot;
        let size = self.size;
        let stamps_ok = self.stamps.with_bytes(|b| match &self.body {
            Some(_) => {
                b[off..off + 8] == seq.to_le_bytes() && b[off + 8..off + 16] == seq.to_le_bytes()
            }
            None => check(&b[off..off + size], seq, full),
        });
        stamps_ok
            && match (&self.body, full) {
                (Some(b), true) => b.with_bytes(|b| check_pattern(&b[8..size - 8], 8)),
                _ => true,
            }
    }

    /// The first 8 bytes of slot `i`, little-endian (a control message).
    fn head_u64(&self, i: usize) -> u64 {
        let mut b = [0u8; 8];
        self.stamps.read(i * self.slot, &mut b);
        u64::from_le_bytes(b)
    }
}

/// How one side lays out its memory for a test.
#[derive(Debug, Clone, Copy)]
struct Layout {
    /// Message slots sent from (Sends, Writes).
    tx: usize,
    /// Receives posted (and reposted).
    rx: usize,
    /// Receives take data messages of `size` bytes (else: 8-byte control
    /// messages only).
    rx_data: bool,
    /// A contiguous `size`-byte region advertised to the peer (Write target,
    /// Read source or sink).
    region: bool,
}

impl Layout {
    fn new(spec: &Spec, server: bool) -> Self {
        let w = spec.window;
        let (tx, rx, rx_data, region) = match (spec.test, spec.transport, server) {
            (Test::Lat, Transport::Send, false) => (1, 4, true, false),
            (Test::Lat, Transport::Send, true) => (0, 4, true, false),
            (Test::Lat, Transport::Write, false) => (1, 4, false, true),
            (Test::Lat, _, _) => (0, 4, false, true),
            (Test::Bw, Transport::Send, true) => (0, 2 * w, true, false),
            (Test::Bw, Transport::Send, false) => (w, 16, false, false),
            (Test::Bw, Transport::Write, false) => (w, 4, false, false),
            (Test::Bw, _, _) => (0, 4, false, true),
        };
        Self {
            tx,
            rx,
            rx_data,
            region,
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
    /// Messages sent.
    tx: Frames,
    /// Receive buffers.
    rx: Frames,
    /// The advertised region (8 bytes when the test needs none).
    region: Mr,
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

fn send_wr(wr_id: u64, sgl: Vec<Sge>, solicited: bool, signaled: bool) -> SendWr {
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
        let tx = Frames::new(pd, lay.tx, spec.size, 0);
        let rx = if lay.rx_data {
            Frames::new(pd, lay.rx, spec.size, 8)
        } else {
            Frames::new(pd, lay.rx, 8, 8)
        };
        let region = if lay.region {
            let r = pd.alloc(spec.size, DATA_ACCESS);
            r.with_bytes_mut(|b| {
                fill(b);
                // The Read source carries a constant stamp; others start invalid.
                let read_src = server && spec.transport == Transport::Read;
                stamp(b, if read_src { READ_SEQ } else { u64::MAX });
            });
            r
        } else {
            pd.alloc(8, DATA_ACCESS)
        };
        let ctl = pd.alloc(8, Access::LOCAL_WRITE);
        Self {
            _ctx: ctx,
            cq,
            tx,
            rx,
            region,
            ctl,
            lay,
            spec: spec.clone(),
            wcs: [Wc::default(); 64],
        }
    }

    fn recv_wr(&self, slot: usize) -> RecvWr {
        RecvWr {
            wr_id: slot as u64,
            sgl: self.rx.recv_sgl(slot),
        }
    }

    fn all_recvs(&self) -> Vec<RecvWr> {
        (0..self.lay.rx).map(|i| self.recv_wr(i)).collect()
    }

    fn advertise(&self) -> [u8; 12] {
        let mut a = [0u8; 12];
        a[..8].copy_from_slice(&self.region.addr().to_be_bytes());
        a[8..].copy_from_slice(&self.region.rkey().to_be_bytes());
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

    /// Checks receive slot `slot` holding a `len`-byte message `seq`.
    fn check_rx(&self, slot: usize, len: usize, seq: u64) -> bool {
        self.rx.check(slot, len, seq, self.spec.verify)
    }

    /// Checks the region holding message `seq`.
    fn check_region(&self, seq: u64) -> bool {
        self.region.with_bytes(|b| check(b, seq, self.spec.verify))
    }

    /// Overwrites the region's stamps so a Read that does not land is noticed.
    fn spoil_region(&self) {
        self.region.with_bytes_mut(|b| {
            for (o, n) in stamp_spots(b.len()) {
                b[o..o + n].fill(0xa5);
            }
        });
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
                break e.rx.head_u64(wc.wr_id as usize);
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
                e.tx.stamp(0, seq);
                t = Instant::now();
                qp.post_send(send_wr(QUIET_ID, e.tx.sgl(0), false, false))?;
                let wc = e.one(qp)?;
                let slot = wc.wr_id as usize;
                let ok = wc.opcode == WcOpcode::Recv && e.check_rx(slot, wc.byte_len as usize, seq);
                qp.post_recv(e.recv_wr(slot))?;
                ok
            }
            Transport::Write => {
                e.tx.stamp(0, seq);
                t = Instant::now();
                qp.post_send_batch([
                    SendWr {
                        wr_id: QUIET_ID,
                        op: SendOp::Write {
                            remote_addr: r.addr,
                            rkey: r.rkey,
                        },
                        sgl: e.tx.sgl(0),
                        signaled: false,
                    },
                    send_wr(QUIET_ID, vec![], false, false),
                ])
                .map_err(|(_, err)| Error::from(err))?;
                let wc = e.one(qp)?;
                // The server wrote the bytes back into our region.
                let ok = wc.opcode == WcOpcode::Recv && e.check_region(seq);
                qp.post_recv(e.recv_wr(wc.wr_id as usize))?;
                ok
            }
            Transport::Read => {
                e.spoil_region();
                t = Instant::now();
                qp.post_send(SendWr {
                    wr_id: 0,
                    op: SendOp::Read {
                        remote_addr: r.addr,
                        rkey: r.rkey,
                    },
                    sgl: vec![e.region.sge(0, size as u32)],
                    signaled: true,
                })?;
                let wc = e.one(qp)?;
                wc.opcode == WcOpcode::RdmaRead && e.check_region(READ_SEQ)
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
    if transport == Transport::Read {
        // Every Read lands in the one region; it starts spoiled.
        e.spoil_region();
    }
    loop {
        while !stop && !free.is_empty() && avail > 0 {
            if !meter.more(seq) {
                stop = true;
                break;
            }
            let slot = free.pop().expect("checked non-empty");
            let wr = match transport {
                Transport::Send => {
                    e.tx.stamp(slot, seq);
                    send_wr(slot as u64, e.tx.sgl(slot), false, true)
                }
                Transport::Write => {
                    // Every Write goes to the one target region.
                    e.tx.stamp(slot, seq);
                    SendWr {
                        wr_id: slot as u64,
                        op: SendOp::Write {
                            remote_addr: r.addr,
                            rkey: r.rkey,
                        },
                        sgl: e.tx.sgl(slot),
                        signaled: true,
                    }
                }
                _ => SendWr {
                    wr_id: slot as u64,
                    op: SendOp::Read {
                        remote_addr: r.addr,
                        rkey: r.rkey,
                    },
                    sgl: vec![e.region.sge(0, size as u32)],
                    signaled: true,
                },
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
                    let slot = wc.wr_id as usize;
                    if op == WcOpcode::RdmaRead {
                        // The region holds the source's constant contents.
                        let ok = e.check_region(READ_SEQ);
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
    reply.extend_from_slice(&(e.lay.rx as u32).to_be_bytes());
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
    let size = spec.size;
    let done = loop {
        let wc = e.one(&qp)?;
        let slot = wc.wr_id as usize;
        match wc.opcode {
            WcOpcode::Recv if wc.solicited => break e.rx.head_u64(slot),
            WcOpcode::Recv => match (spec.test, spec.transport) {
                (Test::Lat, Transport::Send) => {
                    let len = wc.byte_len as usize;
                    tally.add(len, e.check_rx(slot, len, tally.msgs));
                    // Echo from the receive buffer; repost it once sent.
                    qp.post_send(send_wr(slot as u64, e.rx.sgl(slot), false, true))?;
                }
                (Test::Lat, Transport::Write) => {
                    tally.add(size, e.check_region(tally.msgs));
                    qp.post_send_batch([
                        SendWr {
                            wr_id: QUIET_ID,
                            op: SendOp::Write {
                                remote_addr: remote.addr,
                                rkey: remote.rkey,
                            },
                            sgl: vec![e.region.sge(0, size as u32)],
                            signaled: false,
                        },
                        send_wr(QUIET_ID, vec![], false, false),
                    ])
                    .map_err(|(_, err)| Error::from(err))?;
                    qp.post_recv(e.recv_wr(slot))?;
                }
                (Test::Bw, Transport::Send) => {
                    let len = wc.byte_len as usize;
                    tally.add(len, e.check_rx(slot, len, tally.msgs));
                    qp.post_recv(e.recv_wr(slot))?;
                    since_credit += 1;
                    if since_credit == batch {
                        since_credit = 0;
                        qp.post_send(send_wr(QUIET_ID, vec![], false, false))?;
                    }
                }
                _ => return Err(Error::msg("unexpected Send from the client")),
            },
            WcOpcode::Send if wc.wr_id < e.lay.rx as u64 => qp.post_recv(e.recv_wr(slot))?,
            _ => {}
        }
    };
    if (spec.test, spec.transport) == (Test::Bw, Transport::Write) {
        // Writes raise nothing here, and all went to the one region:
        // it must hold the last one, in full.
        let ok = done > 0 && e.check_region(done - 1);
        tally.msgs = done;
        tally.bytes = done * size as u64;
        if ok {
            tally.verified = tally.bytes;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_gather_stamps_around_one_body() {
        let ctx = Context::new(Progress::Caller).unwrap();
        let pd = ctx.alloc_pd();
        for (size, min_slot) in [(1, 8), (9, 0), (100, 8), (4096, 0), (1 << 20, 8)] {
            let f = Frames::new(&pd, 3, size, min_slot);
            for i in 0..3 {
                let sgl = f.sgl(i);
                let total: u32 = sgl.iter().map(|s| s.length).sum();
                assert_eq!(total as usize, size);
                assert_eq!(sgl.len(), if gathered(size) { 3 } else { 1 });
                let rx: u32 = f.recv_sgl(i).iter().map(|s| s.length).sum();
                assert!(rx as usize >= size.max(min_slot));
                f.stamp(i, 40 + i as u64);
            }
            for i in 0..3 {
                assert!(
                    f.check(i, size, 40 + i as u64, true),
                    "size {size} slot {i}"
                );
                assert!(!f.check(i, size, 41 + i as u64, false) || size < 8);
                assert!(!f.check(i, size + 1, 40 + i as u64, false));
            }
            // One body: memory is stamps plus at most one message.
            let bytes = f.stamps.len() + f.body.as_ref().map_or(0, Mr::len);
            assert!(bytes <= 3 * size.max(min_slot).max(16) + size, "{bytes}");
            if let Some(b) = &f.body {
                b.write(size / 2, &[0]);
                assert!(f.check(0, size, 40, false));
                assert!(!f.check(0, size, 40, true), "--verify checks the body");
            }
        }
    }
}
