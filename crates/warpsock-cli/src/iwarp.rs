//! The warpsock tests: `k` queue pairs per thread on one context and one
//! completion queue (see [`crate::work`] for roles and the FIN exchange).
//!
//! Messages on a queue pair besides the data (all are RDMAP Sends):
//!
//! * **FIN**: Send with Solicited Event, 8 bytes: the side's count of data
//!   messages sent (or received, for a passive side). Every side keeps one
//!   receive of its peer for it.
//! * **NOTIFY** (RDMA Write latency, both ways): zero-byte Send right after
//!   each Write, so the target learns that the Write was placed (iWARP has
//!   no Write with Immediate). The Write latency is thus "Write + notify".
//! * **CREDIT** (Send bandwidth, sink → source): zero-byte Send, one per
//!   [`credit_batch`] data receives the sink has reposted. iWARP has no
//!   receiver-not-ready retry: a Send that finds no receive kills the
//!   connection, so the sender keeps count.
//!
//! Tests:
//!
//! * Send latency: the pinger Sends `size` bytes, the ponger Sends the
//!   same receive buffer back; the pinger measures from post to its receive
//!   completion.
//! * Write latency: Write + NOTIFY to the peer's region, the ponger checks
//!   it and Writes its region back into the pinger's + NOTIFY.
//! * Read latency: one RDMA Read of `size` bytes from the peer's region.
//! * Bandwidth: `window` Sends / Writes / Reads in flight per queue pair
//!   until the budget is spent, then the FINs. Memory is touched as a TCP
//!   program that reuses one buffer touches it: each Send or Write is
//!   gathered from its own 16-byte stamp slot plus one body shared by all
//!   messages of the thread (see [`crate::data`]), Send receives scatter
//!   the same way, every Write of a connection goes to its one target
//!   region (which must hold the last Write, in full, when the FIN
//!   arrives), and every Read lands in one region, checked against the
//!   source's constant stamp.
//!
//! Private data: see [`crate::ctl`].

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use warpsock_engine::{
    connect, Access, Context, ContextOptions, Cq, Listener, Mr, Pd, Progress, Qp, QpInit,
    QpOptions, RecvWr, SendOp, SendWr, Sgl, Wc, WcOpcode,
};

use crate::data::{check, check_pattern, fill, gathered, stamp, stamp_spots};
use crate::meter::Meter;
use crate::opts::{ProgressMode, Role, Spec, Transport};
use crate::tcp::IDLE;
use crate::work::{Job, Pacer, Stats, MAX_SETUPS};
use crate::Error;

/// Access rights of the data regions.
const DATA_ACCESS: Access =
    Access(Access::LOCAL_WRITE.0 | Access::REMOTE_WRITE.0 | Access::REMOTE_READ.0);

/// Receives the sink reposts per CREDIT message.
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
    fn sgl(&self, i: usize) -> Sgl {
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
    fn recv_sgl(&self, i: usize) -> Sgl {
        match &self.body {
            Some(_) => self.sgl(i),
            None => self.stamps.sge(i * self.slot, self.slot as u32).into(),
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

/// `wr_id` kinds (bits 24..32; the connection is in bits 32.., the slot
/// in bits 0..24).
const K_RECV: u64 = 0;
const K_DATA: u64 = 1;
const K_FIN: u64 = 2;
const K_QUIET: u64 = 3;
const K_ECHO: u64 = 4;

fn wr_id(conn: usize, kind: u64, slot: usize) -> u64 {
    ((conn as u64) << 32) | (kind << 24) | slot as u64
}

fn split_id(id: u64) -> (usize, u64, usize) {
    (
        (id >> 32) as usize,
        (id >> 24) & 0xff,
        (id & 0xff_ffff) as usize,
    )
}

fn send_wr(wr_id: u64, sgl: Sgl, solicited: bool, signaled: bool) -> SendWr {
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

fn context(spec: &Spec) -> Result<Context, Error> {
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

fn qp_options(spec: &Spec) -> QpOptions {
    let depth = spec.window.max(16) as u16;
    QpOptions {
        crc: spec.crc,
        ird: depth,
        ord: depth,
        sq_depth: QpOptions::default().sq_depth.max(4 * spec.window + 16),
        ..QpOptions::default()
    }
}

fn parse_be(b: &[u8]) -> u64 {
    b.iter().fold(0, |a, &x| (a << 8) | u64::from(x))
}

/// The peer's advertised region and receive credits.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Remote {
    addr: u64,
    rkey: u32,
    credits: usize,
}

/// Receives per connection: (count, they take data messages, how many are
/// kept back from the peer's credits for control messages).
fn rx_plan(role: Role, t: Transport, window: usize) -> (usize, bool, usize) {
    match (role, t) {
        (Role::Sink, Transport::Send) => (2 * window + 1, true, 1),
        // Both directions: CREDITs land in data receives too.
        (Role::Both, Transport::Send) => (2 * window + 6, true, 6),
        (Role::Ping | Role::Pong, Transport::Send) => (4, true, 1),
        _ => (16, false, 16),
    }
}

/// One thread's side of a test: context, memory for `k` connections.
pub(crate) struct Group {
    _ctx: Context,
    pd: Pd,
    cq: Cq,
    spec: Spec,
    /// Sources of Sends / Writes: `window` slots per connection.
    tx: Frames,
    /// Receive buffers: `rx_n` slots per connection.
    rx: Frames,
    rx_n: usize,
    reserved: usize,
    /// Advertised regions (Write target, Read source), one per connection.
    region: Mr,
    /// Read sinks, one per connection.
    sink: Mr,
    /// Bytes per connection in `region` and `sink`.
    region_len: usize,
    sink_len: usize,
    /// FIN values, 8 bytes per connection.
    ctl: Mr,
    wcs: Vec<Wc>,
}

impl Group {
    /// Memory and queues for `k` connections of `spec` in `role`.
    pub(crate) fn new(spec: &Spec, role: Role, k: usize) -> Result<Self, Error> {
        let ctx = context(spec)?;
        let pd = ctx.alloc_pd();
        let t = spec.transport;
        let size = spec.size;
        let w = spec.window;
        let (rx_n, rx_data, reserved) = rx_plan(role, t, w);
        let sends = matches!(t, Transport::Send | Transport::Write)
            && matches!(role, Role::Source | Role::Both | Role::Ping);
        let tx = Frames::new(&pd, if sends { k * w } else { 0 }, size, 0);
        let rx = if rx_data {
            Frames::new(&pd, k * rx_n, size, 8)
        } else {
            Frames::new(&pd, k * rx_n, 8, 8)
        };
        let read_src =
            t == Transport::Read && matches!(role, Role::Source | Role::Both | Role::Pong);
        let need_region = match t {
            Transport::Write => role != Role::Source,
            Transport::Read => read_src,
            _ => false,
        };
        let need_sink =
            t == Transport::Read && matches!(role, Role::Sink | Role::Both | Role::Ping);
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
            _ctx: ctx,
            pd,
            cq,
            spec: spec.clone(),
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

    fn recv_wr(&self, conn: usize, slot: usize) -> RecvWr {
        RecvWr {
            wr_id: wr_id(conn, K_RECV, slot),
            sgl: self.rx.recv_sgl(conn * self.rx_n + slot),
        }
    }

    /// Queue pair set-up for connection `conn` (its receives posted).
    fn init(&self, conn: usize) -> QpInit<'_> {
        let mut init = QpInit::new(&self.pd, &self.cq);
        init.options = qp_options(&self.spec);
        init.recvs = (0..self.rx_n).map(|s| self.recv_wr(conn, s)).collect();
        init
    }

    /// Region address, rkey and receive credits of connection `conn`.
    fn advertise(&self, conn: usize) -> [u8; 16] {
        let mut a = [0u8; 16];
        let addr = self.region.addr() + (conn * self.region_len) as u64;
        a[..8].copy_from_slice(&addr.to_be_bytes());
        a[8..12].copy_from_slice(&self.region.rkey().to_be_bytes());
        a[12..].copy_from_slice(&((self.rx_n - self.reserved) as u32).to_be_bytes());
        a
    }

    fn region_ok(&self, conn: usize, seq: u64) -> bool {
        let (o, n) = (conn * self.region_len, self.region_len);
        self.region
            .with_bytes(|b| check(&b[o..o + n], seq, self.spec.verify))
    }

    fn sink_ok(&self, conn: usize) -> bool {
        let (o, n) = (conn * self.sink_len, self.sink_len);
        self.sink
            .with_bytes(|b| check(&b[o..o + n], READ_SEQ, self.spec.verify))
    }

    fn spoil_sink(&self, conn: usize) {
        let (o, n) = (conn * self.sink_len, self.sink_len);
        self.sink.with_bytes_mut(|b| {
            for (so, sn) in stamp_spots(n) {
                b[o + so..o + so + sn].fill(0xa5);
            }
        });
    }

    /// Waits for completions.
    ///
    /// With busy polling the wait is cut into busy-poll-long slices, so a
    /// side that waits long (the target of RDMA Reads, which sees no
    /// completion per Read) keeps spinning instead of sleeping after the
    /// first slice.
    fn wait(&mut self) -> Result<usize, Error> {
        let slice = match self.spec.busy_poll() {
            d if d.is_zero() => IDLE,
            d => d.min(IDLE),
        };
        // The idle clock starts at the first empty slice (no clock read
        // on the measured path when the completion is already there).
        let mut deadline = None;
        let n = loop {
            let n = self.cq.wait(&mut self.wcs, slice)?;
            if n > 0 {
                break n;
            }
            let now = Instant::now();
            if now >= *deadline.get_or_insert(now + IDLE) {
                return Err(Error::msg(format!(
                    "no completion for {} s (the peer stopped)",
                    IDLE.as_secs()
                )));
            }
        };
        Ok(n)
    }
}

/// An error completion, with its connection's events and socket error.
fn describe(wc: &Wc, qp: &Qp) -> Error {
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
pub(crate) struct Peer {
    qp: Qp,
    remote: Remote,
}

fn remote_of(p: &[u8]) -> Result<Remote, Error> {
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
pub(crate) fn connect_one(
    addr: SocketAddr,
    token: u64,
    spec: &Spec,
    role: Role,
) -> Result<(Group, Peer), Error> {
    let g = Group::new(spec, role, 1)?;
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
pub(crate) fn accept_into(
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

/// One connection's progress in [`run`].
struct ConnState {
    /// Free tx slots (local indices).
    free: Vec<usize>,
    /// Send credits left (Send sources).
    avail: usize,
    inflight: usize,
    tx_seq: u64,
    rx_seq: u64,
    budget_done: bool,
    fin_posted: bool,
    fin_done: bool,
    peer_fin: Option<u64>,
    since_credit: usize,
    ping_at: Option<Instant>,
}

/// Runs `job` on this thread's group and connections.
pub(crate) fn run(job: &Job<'_>, g: &mut Group, peers: Vec<Peer>) -> Result<Stats, Error> {
    let spec = job.spec;
    let (role, t) = (job.role, spec.transport);
    let (size, w) = (spec.size, spec.window);
    let active = role.active(t);
    let batch = credit_batch(w);
    let mut meter = Meter::new(spec.budget, spec.test.is_latency(), job.tick);
    let mut pacer = Pacer::new(spec.rate);
    let mut st = Stats::default();
    let mut cs: Vec<ConnState> = peers
        .iter()
        .map(|p| ConnState {
            free: (0..w).rev().collect(),
            // Keep the peer's receive for our FIN.
            avail: p.remote.credits,
            inflight: 0,
            tx_seq: 0,
            rx_seq: 0,
            budget_done: !active,
            fin_posted: false,
            fin_done: false,
            peer_fin: None,
            since_credit: 0,
            ping_at: None,
        })
        .collect();
    if t == Transport::Send
        && matches!(role, Role::Source | Role::Both)
        && cs.iter().any(|c| c.avail == 0)
    {
        return Err(Error::msg("the peer offers no receive credits"));
    }
    let qps: Vec<&Qp> = peers.iter().map(|p| &p.qp).collect();
    let reads = t == Transport::Read;
    loop {
        let mut all_done = true;
        for (i, c) in cs.iter_mut().enumerate() {
            if c.fin_done && c.peer_fin.is_some() {
                continue;
            }
            all_done = false;
            let p = &peers[i];
            if !c.budget_done {
                match role {
                    Role::Ping if c.ping_at.is_none() => {
                        if meter.more(c.tx_seq) {
                            let now = Instant::now();
                            st.active_now(now);
                            c.ping_at = Some(now);
                            post_ping(g, p, i, c.tx_seq)?;
                            c.tx_seq += 1;
                            st.sent += 1;
                        } else {
                            c.budget_done = true;
                        }
                    }
                    Role::Source | Role::Both if !reads => {
                        while !c.free.is_empty() && (t != Transport::Send || c.avail > 0) {
                            if !meter.more(c.tx_seq) {
                                c.budget_done = true;
                                break;
                            }
                            pacer.pace(size);
                            let slot = c.free.pop().expect("checked non-empty");
                            let gs = i * w + slot;
                            g.tx.stamp(gs, c.tx_seq);
                            let id = wr_id(i, K_DATA, slot);
                            let wr = if t == Transport::Send {
                                c.avail -= 1;
                                send_wr(id, g.tx.sgl(gs), false, true)
                            } else {
                                SendWr {
                                    wr_id: id,
                                    op: SendOp::Write {
                                        remote_addr: p.remote.addr,
                                        rkey: p.remote.rkey,
                                    },
                                    sgl: g.tx.sgl(gs),
                                    signaled: true,
                                }
                            };
                            st.active_now(Instant::now());
                            p.qp.post_send(wr)?;
                            c.tx_seq += 1;
                            st.sent += 1;
                            c.inflight += 1;
                        }
                    }
                    Role::Sink | Role::Both if reads => {
                        while c.inflight < w {
                            if !meter.more(c.tx_seq) {
                                c.budget_done = true;
                                break;
                            }
                            pacer.pace(size);
                            st.active_now(Instant::now());
                            p.qp.post_send(SendWr {
                                wr_id: wr_id(i, K_DATA, 0),
                                op: SendOp::Read {
                                    remote_addr: p.remote.addr,
                                    rkey: p.remote.rkey,
                                },
                                sgl: g.sink.sge(i * g.sink_len, size as u32).into(),
                                signaled: true,
                            })?;
                            c.tx_seq += 1;
                            st.sent += 1;
                            c.inflight += 1;
                        }
                    }
                    _ => {}
                }
            }
            if !c.fin_posted {
                let mine_over = if active {
                    c.budget_done && c.inflight == 0 && c.ping_at.is_none()
                } else {
                    c.peer_fin.is_some()
                };
                if mine_over {
                    let v = if active { c.tx_seq } else { c.rx_seq };
                    g.ctl.write(8 * i, &v.to_le_bytes());
                    p.qp.post_send(send_wr(
                        wr_id(i, K_FIN, 0),
                        g.ctl.sge(8 * i, 8).into(),
                        true,
                        true,
                    ))?;
                    c.fin_posted = true;
                }
            }
        }
        if all_done {
            break;
        }
        let n = g.wait()?;
        for k in 0..n {
            let wc = g.wcs[k];
            let (i, kind, slot) = split_id(wc.wr_id);
            let c = &mut cs[i];
            if !wc.is_ok() {
                if c.fin_done && c.peer_fin.is_some() {
                    // The peer closed after both FINs: receives flush.
                    continue;
                }
                return Err(describe(&wc, qps[i]));
            }
            let p = &peers[i];
            match (wc.opcode, kind) {
                (WcOpcode::Recv, _) => {
                    let gs = i * g.rx_n + slot;
                    let len = wc.byte_len as usize;
                    if wc.solicited {
                        let v = g.rx.head_u64(gs);
                        c.peer_fin = Some(v);
                        if t == Transport::Write && matches!(role, Role::Sink | Role::Both) {
                            // Writes raise nothing here, and all went to the
                            // one region: it must hold the last one, in full.
                            let ok = v > 0 && g.region_ok(i, v - 1);
                            st.received_many(job.epoch, v, size, ok);
                        }
                        if active {
                            st.active_now(Instant::now());
                        }
                        continue;
                    }
                    match (role, t, len) {
                        (Role::Source | Role::Both, Transport::Send, 0) => c.avail += batch,
                        (Role::Ping, Transport::Write, 0) => {
                            let seq = c.tx_seq - 1;
                            let ok = g.region_ok(i, seq);
                            st.received(job.epoch, size, ok);
                            ping_done(c, &meter, &mut st, seq);
                        }
                        (Role::Pong, Transport::Write, 0) => {
                            let ok = g.region_ok(i, c.rx_seq);
                            st.received(job.epoch, size, ok);
                            c.rx_seq += 1;
                            p.qp.post_send_batch([
                                SendWr {
                                    wr_id: wr_id(i, K_QUIET, 0),
                                    op: SendOp::Write {
                                        remote_addr: p.remote.addr,
                                        rkey: p.remote.rkey,
                                    },
                                    sgl: g.region.sge(i * g.region_len, size as u32).into(),
                                    signaled: false,
                                },
                                send_wr(wr_id(i, K_QUIET, 0), Sgl::new(), false, false),
                            ])
                            .map_err(Error::from)?;
                        }
                        (Role::Sink | Role::Both, Transport::Send, _) => {
                            let ok = g.rx.check(gs, len, c.rx_seq, spec.verify);
                            st.received(job.epoch, len, ok);
                            c.rx_seq += 1;
                            c.since_credit += 1;
                            if c.since_credit == batch {
                                c.since_credit = 0;
                                p.qp.post_send(send_wr(
                                    wr_id(i, K_QUIET, 0),
                                    Sgl::new(),
                                    false,
                                    false,
                                ))?;
                            }
                        }
                        (Role::Pong, Transport::Send, _) => {
                            let ok = g.rx.check(gs, len, c.rx_seq, spec.verify);
                            st.received(job.epoch, len, ok);
                            c.rx_seq += 1;
                            // Echo from the receive buffer; repost it once sent.
                            p.qp.post_send(send_wr(
                                wr_id(i, K_ECHO, slot),
                                g.rx.sgl(gs),
                                false,
                                true,
                            ))?;
                            continue;
                        }
                        (Role::Ping, Transport::Send, _) => {
                            let seq = c.tx_seq - 1;
                            let ok = g.rx.check(gs, len, seq, spec.verify);
                            st.received(job.epoch, len, ok);
                            ping_done(c, &meter, &mut st, seq);
                        }
                        _ => return Err(Error::msg("unexpected Send from the peer")),
                    }
                    p.qp.post_recv(g.recv_wr(i, slot))?;
                }
                (WcOpcode::RdmaRead, K_DATA) => {
                    let ok = g.sink_ok(i);
                    st.received(job.epoch, wc.byte_len as usize, ok);
                    if role == Role::Ping {
                        let seq = c.tx_seq - 1;
                        ping_done(c, &meter, &mut st, seq);
                    } else {
                        c.inflight -= 1;
                    }
                }
                (_, K_DATA) => {
                    c.inflight -= 1;
                    c.free.push(slot);
                }
                (_, K_FIN) => c.fin_done = true,
                (_, K_ECHO) => p.qp.post_recv(g.recv_wr(i, slot))?,
                _ => {}
            }
        }
    }
    close_gracefully(g, &peers);
    Ok(st)
}

/// Disconnects `peers` and keeps receiving until each peer has closed too
/// (or [`IDLE`] passes).
///
/// Both FINs being through does not make dropping safe: our FIN may still
/// sit in the socket's send buffer (a completion means handed to TCP, not
/// delivered), while the peer's credits or data keep arriving. Closing a
/// socket with input unread, or with input still to come, makes the kernel
/// reset the connection, which discards that FIN before the peer has read
/// it; the peer then fails with its receives flushed. A graceful
/// disconnect sends FIN after everything queued and discards (but reads)
/// input until the peer's FIN, so the final close is clean.
fn close_gracefully(g: &mut Group, peers: &[Peer]) {
    for p in peers {
        p.qp.disconnect();
    }
    let deadline = Instant::now() + IDLE;
    while peers.iter().any(|p| !p.qp.is_closed()) && Instant::now() < deadline {
        // Completions now are flushes of what was still posted: ignored.
        if g.cq.wait(&mut g.wcs, CLOSE_POLL).is_err() {
            break;
        }
    }
}

/// Wait slice while [`close_gracefully`] drains.
const CLOSE_POLL: Duration = Duration::from_millis(10);

/// A ping's answer arrived: record the round trip.
fn ping_done(c: &mut ConnState, meter: &Meter<'_>, st: &mut Stats, seq: u64) {
    if let Some(t) = c.ping_at.take() {
        if !meter.warming(seq) {
            st.rtts_ns.push(t.elapsed().as_nanos() as u64);
        }
    }
}

/// Posts ping `seq` on connection `i`.
fn post_ping(g: &Group, p: &Peer, i: usize, seq: u64) -> Result<(), Error> {
    let size = g.spec.size;
    match g.spec.transport {
        Transport::Send => {
            g.tx.stamp(i, seq);
            p.qp.post_send(send_wr(wr_id(i, K_QUIET, 0), g.tx.sgl(i), false, false))?;
        }
        Transport::Write => {
            g.tx.stamp(i, seq);
            p.qp.post_send_batch([
                SendWr {
                    wr_id: wr_id(i, K_QUIET, 0),
                    op: SendOp::Write {
                        remote_addr: p.remote.addr,
                        rkey: p.remote.rkey,
                    },
                    sgl: g.tx.sgl(i),
                    signaled: false,
                },
                send_wr(wr_id(i, K_QUIET, 0), Sgl::new(), false, false),
            ])
            .map_err(Error::from)?;
        }
        _ => {
            g.spoil_sink(i);
            p.qp.post_send(SendWr {
                wr_id: wr_id(i, K_DATA, 0),
                op: SendOp::Read {
                    remote_addr: p.remote.addr,
                    rkey: p.remote.rkey,
                },
                sgl: g.sink.sge(i * g.sink_len, size as u32).into(),
                signaled: true,
            })?;
        }
    }
    Ok(())
}

/// Waits for `want` completions of a connection-setup exchange.
fn wait_n(cq: &Cq, want: usize) -> Result<(), Error> {
    let mut wcs = [Wc::default(); 4];
    let mut got = 0;
    let deadline = Instant::now() + IDLE;
    while got < want {
        let n = cq.wait(&mut wcs[..want - got], IDLE)?;
        if let Some(bad) = wcs[..n].iter().find(|w| !w.is_ok()) {
            return Err(Error::msg(format!(
                "{:?} completed with {:?}",
                bad.opcode, bad.status
            )));
        }
        got += n;
        if n == 0 && Instant::now() >= deadline {
            return Err(Error::msg("no completion (the peer stopped)"));
        }
    }
    Ok(())
}

/// Connection setup, client side: until the budget is spent, connect
/// (TCP + MPA), Send 8 bytes and wait for the server's 8-byte answer, then
/// close abortively (as the TCP rows do); then one connection flagged
/// "stop", which the server rejects. `rtts_ns` gets each setup's time.
pub(crate) fn conn_client(job: &Job<'_>, addr: SocketAddr, token: u64) -> Result<Stats, Error> {
    let spec = job.spec;
    let ctx = context(spec)?;
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq(16)?;
    let buf = pd.alloc(16, Access::LOCAL_WRITE);
    buf.write(0, &token.to_le_bytes());
    let mut meter = Meter::new(spec.budget, false, job.tick);
    let mut st = Stats::default();
    let mut n = 0u64;
    let init_for = |stop: bool| {
        let mut init = QpInit::new(&pd, &cq);
        init.options = qp_options(spec);
        init.options.private_data = token.to_le_bytes().to_vec();
        init.options.private_data.push(u8::from(stop));
        init.recvs = vec![RecvWr {
            wr_id: 1,
            sgl: buf.sge(8, 8).into(),
        }];
        init
    };
    while meter.more(n) && n < MAX_SETUPS {
        let t = Instant::now();
        buf.write(8, &[0; 8]);
        let qp = connect(addr, &init_for(false))
            .map_err(|err| Error::from(err).context(format!("iWARP connection to {addr}")))?;
        qp.post_send(send_wr(2, buf.sge(0, 8).into(), false, true))?;
        wait_n(&cq, 2)?;
        let ns = t.elapsed().as_nanos() as u64;
        let mut b = [0u8; 8];
        buf.read(8, &mut b);
        st.active_now(t);
        st.active_now(Instant::now());
        st.received(job.epoch, 8, b == token.to_le_bytes());
        st.rtts_ns.push(ns);
        st.sent += 1;
        qp.abort();
        n += 1;
    }
    // The server rejects the stop request; that is the expected answer.
    let _ = connect(addr, &init_for(true));
    Ok(st)
}

/// Connection setup, server side: accept, receive the 8 bytes, Send them
/// back, close abortively; until the stop request.
pub(crate) fn conn_serve(
    epoch: Instant,
    listener: &Listener,
    token: u64,
    spec: &Spec,
    ready: impl FnOnce() -> Result<(), Error>,
) -> Result<Stats, Error> {
    let ctx = context(spec)?;
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq(16)?;
    let buf = pd.alloc(8, Access::LOCAL_WRITE);
    let mut st = Stats::default();
    ready()?;
    loop {
        let req = listener
            .accept(Some(IDLE))
            .map_err(|err| Error::from(err).context("waiting for the client's iWARP connection"))?;
        let pdata = req.private_data().to_vec();
        if pdata.len() < 9 || pdata[..8] != token.to_le_bytes() {
            let _ = req.reject(b"bad token");
            return Err(Error::msg("an iWARP connection with a wrong token"));
        }
        if pdata[8] == 1 {
            let _ = req.reject(b"stop");
            return Ok(st);
        }
        let mut init = QpInit::new(&pd, &cq);
        init.options = qp_options(spec);
        init.recvs = vec![RecvWr {
            wr_id: 1,
            sgl: buf.sge(0, 8).into(),
        }];
        let qp = req.accept(&init, &[])?;
        wait_n(&cq, 1)?;
        qp.post_send(send_wr(2, buf.sge(0, 8).into(), false, true))?;
        wait_n(&cq, 1)?;
        st.received(epoch, 8, true);
        qp.abort();
    }
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
