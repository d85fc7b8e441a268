//! One thread's memory and queues for `k` queue pairs ([`Group`]), how
//! its messages are laid out in registered memory ([`Frames`]), work
//! request ids, and connecting with the region and credits in the MPA
//! private data.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use warpsock_engine::{
    connect, Access, Context, ContextOptions, Cq, Listener, Mr, Pd, Progress, Qp, QpInit,
    QpOptions, RecvWr, SendOp, SendWr, Sgl, Wc,
};

use super::Op;
use crate::data::{check, check_pattern, fill, gathered, stamp, stamp_spots};
use crate::driver::IDLE;
use crate::spec::{ProgressMode, Role, Spec};
use crate::Error;

/// Access rights of the data regions.
const DATA_ACCESS: Access =
    Access(Access::LOCAL_WRITE.0 | Access::REMOTE_WRITE.0 | Access::REMOTE_READ.0);

/// Receives the sink reposts per CREDIT message.
pub(super) fn credit_batch(window: usize) -> usize {
    (window / 2).max(1)
}

/// Constant sequence stamp of the RDMA Read source.
const READ_SEQ: u64 = 0x5eed_0000_0000_0001;

/// `size`-byte messages in `n` slots: each slot is the whole message for
/// small sizes, or a 16-byte head/tail stamp pair around one body shared
/// by all slots for [`gathered`] sizes (sent with a gather list, received
/// with a scatter list). See [`crate::data`].
pub(super) struct Frames {
    pub(super) stamps: Mr,
    pub(super) body: Option<Mr>,
    pub(super) size: usize,
    pub(super) slot: usize,
}

impl Frames {
    /// `n` slots; a small slot holds at least `min_slot` bytes (receives
    /// that may also take an 8-byte control message).
    pub(super) fn new(pd: &Pd, n: usize, size: usize, min_slot: usize) -> Self {
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
    pub(super) fn sgl(&self, i: usize) -> Sgl {
        let off = i * self.slot;
        match &self.body {
            Some(b) => [
                self.stamps.sge(off, 8),
                b.sge(8, (self.size - 16) as u32),
                self.stamps.sge(off + 8, 8),
            ]
            .into(),
            None => self.stamps.sge(off, self.size as u32).into(),
        }
    }

    /// Scatter list of a receive into slot `i` (the whole slot).
    pub(super) fn recv_sgl(&self, i: usize) -> Sgl {
        match &self.body {
            Some(_) => self.sgl(i),
            None => self.stamps.sge(i * self.slot, self.slot as u32).into(),
        }
    }

    pub(super) fn stamp(&self, i: usize, seq: u64) {
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
    pub(super) fn check(&self, i: usize, len: usize, seq: u64, full: bool) -> bool {
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
    pub(super) fn head_u64(&self, i: usize) -> u64 {
        let mut b = [0u8; 8];
        self.stamps.read(i * self.slot, &mut b);
        u64::from_le_bytes(b)
    }
}

/// `wr_id` kinds (bits 24..32; the connection is in bits 32.., the slot
/// in bits 0..24).
pub(super) const K_RECV: u64 = 0;
pub(super) const K_DATA: u64 = 1;
pub(super) const K_FIN: u64 = 2;
pub(super) const K_QUIET: u64 = 3;
pub(super) const K_ECHO: u64 = 4;

pub(super) fn wr_id(conn: usize, kind: u64, slot: usize) -> u64 {
    ((conn as u64) << 32) | (kind << 24) | slot as u64
}

pub(super) fn split_id(id: u64) -> (usize, u64, usize) {
    (
        (id >> 32) as usize,
        (id >> 24) & 0xff,
        (id & 0xff_ffff) as usize,
    )
}

pub(super) fn send_wr(wr_id: u64, sgl: Sgl, solicited: bool, signaled: bool) -> SendWr {
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

pub(super) fn context(spec: &Spec) -> Result<Context, Error> {
    let progress = match spec.progress {
        ProgressMode::Caller => Progress::Caller,
        ProgressMode::Thread => Progress::Thread,
    };
    Ok(Context::with_options(ContextOptions {
        progress,
        busy_poll: spec.busy_poll(),
        ..ContextOptions::default()
    })?)
}

pub(super) fn qp_options(spec: &Spec) -> QpOptions {
    let depth = spec.window.max(16) as u16;
    QpOptions {
        crc: spec.crc,
        ird: depth,
        ord: depth,
        sq_depth: QpOptions::default().sq_depth.max(4 * spec.window + 16),
        ..QpOptions::default()
    }
}

pub(super) fn parse_be(b: &[u8]) -> u64 {
    b.iter().fold(0, |a, &x| (a << 8) | u64::from(x))
}

/// The peer's advertised region and receive credits.
#[derive(Debug, Clone, Copy)]
pub(super) struct Remote {
    pub(super) addr: u64,
    pub(super) rkey: u32,
    pub(super) credits: usize,
}

/// Receives per connection: (count, they take data messages, how many are
/// kept back from the peer's credits for control messages).
pub(super) fn rx_plan(role: Role, t: Op, window: usize) -> (usize, bool, usize) {
    match (role, t) {
        (Role::Sink, Op::Send) => (2 * window + 1, true, 1),
        // Both directions: CREDITs land in data receives too, so one
        // receive is kept back for each CREDIT the peer can have in flight
        // (one per batch of the credits we advertise) and the FIN, plus one
        // spare. (A fixed 6 could run one short at a window of 3, where every
        // receive is its own batch.) Four windows of credits instead of two
        // (each side's CREDIT queues behind its own window of Sends) were
        // tried in session 8: no gain in an interleaved A/B of release
        // builds on a quiet machine (Send median 3.88 vs 3.85 GB/s), and
        // again in sessions 11-12: counted per MiB over 8 interleaved bibw
        // rounds (engine counters), two windows against four: sleeps 0.42
        // vs 0.39, sendmsg 1.96 vs 1.96, EAGAIN 1.14 vs 1.41, and the bytes
        // queued ahead of each CREDIT 0.97 vs 2.2 MiB. No win, more
        // receives posted: two.
        (Role::Both, Op::Send) => {
            let credits = 2 * window;
            let reserved = credits.div_ceil(credit_batch(window)) + 2;
            (credits + reserved, true, reserved)
        }
        (Role::Ping | Role::Pong, Op::Send) => (4, true, 1),
        _ => (16, false, 16),
    }
}

/// One thread's side of a test: context, memory for `k` connections.
pub(super) struct Group {
    pub(super) ctx: Context,
    pub(super) pd: Pd,
    pub(super) cq: Cq,
    pub(super) spec: Spec,
    pub(super) op: Op,
    /// Sources of Sends / Writes: `window` slots per connection.
    pub(super) tx: Frames,
    /// Receive buffers: `rx_n` slots per connection.
    pub(super) rx: Frames,
    pub(super) rx_n: usize,
    pub(super) reserved: usize,
    /// Advertised regions (Write target, Read source), one per connection.
    pub(super) region: Mr,
    /// Read sinks, one per connection.
    pub(super) sink: Mr,
    /// Bytes per connection in `region` and `sink`.
    pub(super) region_len: usize,
    pub(super) sink_len: usize,
    /// FIN values, 8 bytes per connection.
    pub(super) ctl: Mr,
    pub(super) wcs: Vec<Wc>,
}

impl Group {
    /// Memory and queues for `k` connections of `spec` in `role`.
    pub(super) fn new(spec: &Spec, op: Op, role: Role, k: usize) -> Result<Self, Error> {
        let ctx = context(spec)?;
        let pd = ctx.alloc_pd();
        let t = op;
        let size = spec.size;
        let w = spec.window;
        let (rx_n, rx_data, reserved) = rx_plan(role, t, w);
        let sends = matches!(t, Op::Send | Op::Write)
            && matches!(role, Role::Source | Role::Both | Role::Ping);
        let tx = Frames::new(&pd, if sends { k * w } else { 0 }, size, 0);
        let rx = if rx_data {
            Frames::new(&pd, k * rx_n, size, 8)
        } else {
            Frames::new(&pd, k * rx_n, 8, 8)
        };
        let read_src = t == Op::Read && matches!(role, Role::Source | Role::Both | Role::Pong);
        let need_region = match t {
            Op::Write => role != Role::Source,
            Op::Read => read_src,
            _ => false,
        };
        let need_sink = t == Op::Read && matches!(role, Role::Sink | Role::Both | Role::Ping);
        let region_len = if need_region { size } else { 8 };
        let sink_len = if need_sink { size } else { 8 };
        let region = pd.alloc(k * region_len, DATA_ACCESS);
        if need_region {
            region.with_bytes_mut(|b| {
                for r in b.chunks_exact_mut(size) {
                    fill(r);
                    stamp(r, if read_src { READ_SEQ } else { u64::MAX });
                }
            });
        }
        let sink = pd.alloc(k * sink_len, DATA_ACCESS);
        if need_sink {
            sink.with_bytes_mut(|b| {
                for r in b.chunks_exact_mut(size) {
                    fill(r);
                    for (o, n) in stamp_spots(size) {
                        r[o..o + n].fill(0xa5);
                    }
                }
            });
        }
        let cq = ctx.create_cq(k * (4 * w + rx_n + 8))?;
        let ctl = pd.alloc(8 * k, Access::LOCAL_WRITE);
        Ok(Self {
            ctx,
            pd,
            cq,
            spec: spec.clone(),
            op,
            tx,
            rx,
            rx_n,
            reserved,
            region,
            sink,
            region_len,
            sink_len,
            ctl,
            wcs: vec![Wc::default(); 64],
        })
    }

    pub(super) fn recv_wr(&self, conn: usize, slot: usize) -> RecvWr {
        RecvWr {
            wr_id: wr_id(conn, K_RECV, slot),
            sgl: self.rx.recv_sgl(conn * self.rx_n + slot),
        }
    }

    /// Queue pair set-up for connection `conn` (its receives posted).
    pub(super) fn init(&self, conn: usize) -> QpInit<'_> {
        let mut init = QpInit::new(&self.pd, &self.cq);
        init.options = qp_options(&self.spec);
        init.recvs = (0..self.rx_n).map(|s| self.recv_wr(conn, s)).collect();
        init
    }

    /// Region address, rkey and receive credits of connection `conn`.
    pub(super) fn advertise(&self, conn: usize) -> [u8; 16] {
        let mut a = [0u8; 16];
        let addr = self.region.addr() + (conn * self.region_len) as u64;
        a[..8].copy_from_slice(&addr.to_be_bytes());
        a[8..12].copy_from_slice(&self.region.rkey().to_be_bytes());
        a[12..].copy_from_slice(&((self.rx_n - self.reserved) as u32).to_be_bytes());
        a
    }

    pub(super) fn region_ok(&self, conn: usize, seq: u64) -> bool {
        let (o, n) = (conn * self.region_len, self.region_len);
        self.region
            .with_bytes(|b| check(&b[o..o + n], seq, self.spec.verify))
    }

    pub(super) fn sink_ok(&self, conn: usize) -> bool {
        let (o, n) = (conn * self.sink_len, self.sink_len);
        self.sink
            .with_bytes(|b| check(&b[o..o + n], READ_SEQ, self.spec.verify))
    }

    pub(super) fn spoil_sink(&self, conn: usize) {
        let (o, n) = (conn * self.sink_len, self.sink_len);
        self.sink.with_bytes_mut(|b| {
            for (so, sn) in stamp_spots(n) {
                b[o + so..o + so + sn].fill(0xa5);
            }
        });
    }

    /// Waits for completions until `until` at the latest.
    ///
    /// With busy polling the wait is cut into busy-poll-long slices, so a
    /// side that waits long (the target of RDMA Reads, which sees no
    /// completion per Read) keeps spinning instead of sleeping after the
    /// first slice.
    pub(super) fn wait(&mut self, until: Instant) -> Result<usize, Error> {
        let slice = match self.spec.busy_poll() {
            d if d.is_zero() => IDLE,
            d => d.min(IDLE),
        };
        loop {
            let left = until.saturating_duration_since(Instant::now());
            let n = self.cq.wait(&mut self.wcs, left.min(slice))?;
            if n > 0 || left.is_zero() || Instant::now() >= until {
                return Ok(n);
            }
        }
    }
}

/// An error completion, with its connection's events and socket error.
pub(super) fn describe(wc: &Wc, qp: &Qp) -> Error {
    let mut m = match wc.result() {
        Err(e) => e.to_string(),
        Ok(_) => format!("{:?} completed with {:?}", wc.opcode, wc.status),
    };
    let events: Vec<String> = std::iter::from_fn(|| qp.poll_event())
        .map(|e| format!("{e:?}"))
        .collect();
    if !events.is_empty() {
        m.push_str(&format!(" (connection: {})", events.join(", ")));
    }
    if let Some(e) = qp.socket_error() {
        m.push_str(&format!(" (socket: {e})"));
    }
    Error::msg(m)
}

/// A connected queue pair and what the peer advertised.
pub(super) struct Peer {
    pub(super) qp: Qp,
    pub(super) remote: Remote,
}

impl Peer {
    /// A signaled RDMA Read of the peer's whole region into connection
    /// `i`'s sink.
    pub(super) fn read_into(&self, g: &Group, i: usize) -> Result<(), Error> {
        self.qp.post_send(SendWr {
            wr_id: wr_id(i, K_DATA, 0),
            op: SendOp::Read {
                remote_addr: self.remote.addr,
                rkey: self.remote.rkey,
            },
            sgl: g.sink.sge(i * g.sink_len, g.spec.size as u32).into(),
            signaled: true,
        })?;
        Ok(())
    }

    /// An RDMA Write of `sgl` into the peer's region, then a zero-byte
    /// NOTIFY Send; neither signaled.
    pub(super) fn write_notify(&self, i: usize, sgl: Sgl) -> Result<(), Error> {
        self.qp
            .post_send_batch([
                SendWr {
                    wr_id: wr_id(i, K_QUIET, 0),
                    op: SendOp::Write {
                        remote_addr: self.remote.addr,
                        rkey: self.remote.rkey,
                    },
                    sgl,
                    signaled: false,
                },
                send_wr(wr_id(i, K_QUIET, 0), Sgl::new(), false, false),
            ])
            .map_err(Error::from)?;
        Ok(())
    }
}

pub(super) fn remote_of(p: &[u8]) -> Result<Remote, Error> {
    if p.len() < 16 {
        return Err(Error::msg("the peer's MPA private data is too short"));
    }
    Ok(Remote {
        addr: parse_be(&p[..8]),
        rkey: parse_be(&p[8..12]) as u32,
        credits: parse_be(&p[12..16]) as usize,
    })
}

/// Client side: one connection to the server's data port.
pub(super) fn connect_one(
    addr: SocketAddr,
    token: u64,
    spec: &Spec,
    op: Op,
    role: Role,
) -> Result<(Group, Peer), Error> {
    let g = Group::new(spec, op, role, 1)?;
    let mut init = g.init(0);
    init.options.private_data = token.to_le_bytes().to_vec();
    init.options.private_data.extend_from_slice(&g.advertise(0));
    let qp = connect(addr, &init)
        .map_err(|err| Error::from(err).context(format!("iWARP connection to {addr}")))?;
    let pdata = qp
        .negotiated()
        .map(|n| n.peer_private_data)
        .unwrap_or_default();
    let remote = remote_of(&pdata)?;
    drop(init);
    Ok((g, Peer { qp, remote }))
}

/// Server side: accepts `n` connections, spread over `groups` (connection
/// `i` goes to group `i % groups.len()`).
pub(super) fn accept_into(
    listener: &Listener,
    token: u64,
    groups: &[Group],
    n: usize,
) -> Result<Vec<Vec<Peer>>, Error> {
    let mut out: Vec<Vec<Peer>> = groups.iter().map(|_| Vec::new()).collect();
    for i in 0..n {
        let g = i % groups.len();
        let idx = out[g].len();
        let req = listener
            .accept(Some(Duration::from_secs(10)))
            .map_err(|err| Error::from(err).context("waiting for the client's iWARP connection"))?;
        let pdata = req.private_data().to_vec();
        if pdata.len() < 24 || pdata[..8] != token.to_le_bytes() {
            let _ = req.reject(b"bad token");
            return Err(Error::msg("an iWARP connection with a wrong token"));
        }
        let remote = remote_of(&pdata[8..])?;
        let qp = req.accept(&groups[g].init(idx), &groups[g].advertise(idx))?;
        out[g].push(Peer { qp, remote });
    }
    Ok(out)
}

/// One line of the engine's counters for this side's queue pairs, per MiB
/// moved in the busier direction (`WARPSOCK_ENGINE_STATS=1`; see
/// [`warpsock_engine::Qp::io_stats`] and
/// [`warpsock_engine::Context::wait_stats`]): read and write calls, bytes
/// per call, sleeps, and what Read Requests and control messages waited
/// behind. Counts, not times: they mean the same on a loaded machine.
pub(super) fn engine_stats(g: &Group, peers: &[Peer]) -> String {
    let mut t = warpsock_engine::IoStats::default();
    for p in peers {
        t += p.qp.io_stats();
    }
    let w = g.ctx.wait_stats();
    // Per MiB moved in the busier direction (a Send source receives only
    // credits; a bidirectional side moves about as much each way).
    let mib = (t.read_bytes.max(t.write_bytes) as f64 / f64::from(1 << 20)).max(1e-9);
    let avg_kib = |bytes: u64, n: u64| bytes as f64 / 1024.0 / (n.max(1) as f64);
    format!(
        "engine stats: {:.0} MiB, per MiB: reads {:.2} ({:.0} B/read, parked {:.2}, \
         planned {:.2}, missed {:.2}), \
         writes {:.2} ({:.0} B/write, EAGAIN {:.2}), sleeps {:.2} (epoll {:.2}, parked {:.2}, \
         cv {:.2}, empty {:.2}); read requests {} waited {:.0} KiB queued ahead on average, \
         {:.2} responses ({:.0} KiB) scheduled ahead per request; control msgs {} waited \
         {:.0} KiB on average",
        mib,
        t.reads as f64 / mib,
        t.bytes_per_read(),
        t.parked_reads as f64 / mib,
        t.planned_reads as f64 / mib,
        t.plan_misses as f64 / mib,
        t.writes as f64 / mib,
        t.bytes_per_write(),
        t.writes_blocked as f64 / mib,
        w.sleeps() as f64 / mib,
        w.epoll_sleeps as f64 / mib,
        w.parked_sleeps as f64 / mib,
        w.cv_sleeps as f64 / mib,
        w.empty_wakes as f64 / mib,
        t.read_requests,
        avg_kib(t.read_request_wait_bytes, t.read_requests),
        t.responses_ahead_of_read as f64 / (t.read_requests.max(1) as f64),
        avg_kib(t.response_bytes_ahead_of_read, t.read_requests),
        t.control_msgs,
        avg_kib(t.control_wait_bytes, t.control_msgs),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Both ways, the receives kept back cover every CREDIT the peer can
    /// have in flight (one per batch of our advertised credits) and the
    /// FIN: with 4 windows of credits and a fixed 6 kept back, windows of
    /// 8 and 64 ran out ("no buffer available" Terminates); with 2, a
    /// window of 3 could.
    #[test]
    fn bidirectional_send_keeps_back_a_receive_for_every_credit_in_flight() {
        for w in [1, 2, 3, 8, 31, 64] {
            let (n, data, reserved) = rx_plan(Role::Both, Op::Send, w);
            assert!(data);
            let advertised = n - reserved;
            assert!(advertised >= 2 * w, "window {w}: {advertised} credits");
            let credit_msgs = advertised.div_ceil(credit_batch(w));
            assert!(
                reserved > credit_msgs + 1,
                "window {w}: {reserved} kept back"
            );
        }
    }

    #[test]
    pub(super) fn frames_gather_stamps_around_one_body() {
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
