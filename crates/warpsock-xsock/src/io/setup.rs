//! Setting up an [`XSocket`]: its own caller-driven engine context, the
//! slot memory, and the queue pair over the switched TCP socket, as the
//! initiator ([`XSocket::connect`]) or the responder
//! ([`XSocket::accept`]).

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::net::TcpStream;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

use warpsock_engine::{
    connect_stream, Access, CmError, ConnectRequest, Context, ContextOptions, Cq, Pd, Progress, Qp,
    QpInit, RecvWr,
};

use super::rio::Aio;
use super::settings::Options;
use super::slots::SlotMem;
use super::socket::{State, XSocket};
use crate::stream::Stream;
use crate::wire::Hello;
use warpsock_engine::proto::ring::Ring;

/// Source of [`XSocket::wait_word`]s: even (the low bit is a send's
/// mark), from 2 (0 is no owner), never reused — 2^63 sockets a process.
static NEXT_WORD: AtomicUsize = AtomicUsize::new(2);

struct Engine {
    ctx: Context,
    pd: Pd,
    cq: Cq,
    rx: SlotMem,
    tx: SlotMem,
}

fn engine(opts: &Options, tx_slots: u16) -> Result<Engine, CmError> {
    let ctx = Context::with_options(ContextOptions {
        progress: Progress::Caller,
        busy_poll: opts.busy_poll,
        ..ContextOptions::default()
    })
    .map_err(|e| CmError::Io(e.into()))?;
    let pd = ctx.alloc_pd();
    let cq = ctx
        .create_cq(usize::from(opts.slots) * 2 + 16)
        .map_err(|e| CmError::Io(e.into()))?;
    let size = opts.slot_size as usize;
    let rx = SlotMem::new(&pd, usize::from(opts.slots) * size, Access::LOCAL_WRITE)
        .map_err(CmError::Io)?;
    let tx =
        SlotMem::new(&pd, usize::from(tx_slots) * size, Access::LOCAL_READ).map_err(CmError::Io)?;
    Ok(Engine {
        ctx,
        pd,
        cq,
        rx,
        tx,
    })
}

fn qp_init<'a>(e: &'a Engine, opts: &Options) -> QpInit<'a> {
    let mut init = QpInit::new(&e.pd, &e.cq);
    init.options.crc = opts.crc;
    init.options.mpa_timeout = opts.limits.request_timeout;
    init.options.sq_depth = 4 * usize::from(opts.slots) + 64;
    init.options.rq_depth = usize::from(opts.slots);
    // The connection's TCP options stay the program's, as over TCP: the
    // engine's defaults (a 10 s `TCP_USER_TIMEOUT`, keepalive after 5 s)
    // are for RDMA peers. Since Linux 5.1 the user timeout also ends
    // zero-window probing, so a reader that stopped reading for 10 s
    // killed the writer's connection with ETIMEDOUT (a 1 MiB blocking
    // writer against a 15 s stall, session 21), where TCP blocks the
    // writer for as long as the reader waits. Zero: left as they are.
    init.options.tcp.user_timeout = std::time::Duration::ZERO;
    init.options.tcp.keepalive_idle = std::time::Duration::ZERO;
    let size = opts.slot_size;
    init.recvs = (0..u32::from(opts.slots))
        .map(|slot| RecvWr {
            wr_id: u64::from(slot),
            sgl: e.rx.sge(slot as usize * size as usize, size).into(),
        })
        .collect();
    init
}

fn proto_error(what: impl std::fmt::Display) -> CmError {
    CmError::Io(io::Error::new(io::ErrorKind::InvalidData, what.to_string()))
}

impl XSocket {
    /// Initiator: MPA on `sock` (whose next bytes are ours to send), with
    /// `residue` the peer's bytes read before its mark (taken only if the
    /// queue pair is made: a rejected switch delivers it as TCP's).
    pub(crate) fn connect(
        sock: TcpStream,
        opts: &Options,
        residue: &mut Vec<u8>,
    ) -> Result<Self, CmError> {
        let e = engine(opts, opts.slots.saturating_add(4))?;
        let mut init = qp_init(&e, opts);
        init.options.private_data = opts.hello().encode().to_vec();
        let tcp_fd = sock.as_raw_fd();
        let qp = connect_stream(sock, &init)?;
        let n = qp
            .negotiated()
            .ok_or_else(|| proto_error("no MPA negotiation"))?;
        let peer = Hello::parse(&n.peer_private_data).map_err(proto_error)?;
        Ok(Self::new(
            e,
            qp,
            opts,
            peer,
            std::mem::take(residue),
            tcp_fd,
        ))
    }

    /// Responder: answer the MPA Request `req` whose hello was `peer`.
    pub(crate) fn accept(
        req: ConnectRequest,
        tcp_fd: RawFd,
        peer: Hello,
        opts: &Options,
        residue: Vec<u8>,
    ) -> Result<Self, CmError> {
        let e = engine(opts, opts.slots.saturating_add(4))?;
        let init = qp_init(&e, opts);
        let qp = req.accept(&init, &opts.hello().encode())?;
        Ok(Self::new(e, qp, opts, peer, residue, tcp_fd))
    }

    fn new(
        e: Engine,
        qp: Qp,
        opts: &Options,
        peer: Hello,
        residue: Vec<u8>,
        tcp_fd: RawFd,
    ) -> Self {
        // The dispositions before any signal could end a wait of the
        // process's DDP sockets (once per process: `restart_after_signal`).
        super::sys::note_dispositions();
        let tx_slots = (e.tx.len() / opts.slot_size as usize) as u32;
        Self {
            st: Mutex::new(State {
                s: Stream::new(opts.hello(), peer),
                tx_free: (0..tx_slots).rev().collect(),
                call_wrs: HashMap::new(),
                orphans: Vec::new(),
                kept: Vec::new(),
                detached: false,
                next_id: 0,
                error: None,
                driving: false,
                waiters: 0,
                residue,
                residue_off: 0,
                msg_mode: false,
                shut_rd: false,
                shut_both_at: None,
                peer_closed: false,
                fin: false,
                peer_broke: false,
                aio: Aio::new(opts.sndbuf),
                maps: BTreeMap::new(),
                arrivals: 0,
                background: false,
                epoll_background: false,
                direct: 0,
                pollers: 0,
                stand_ins: 0,
                stand_by: None,
                stand_timed: false,
                established: false,
                sending: 0,
                // `qp_init` posts every slot, in order: the ring is full
                // in the steady state (`Ring::rotate_one`'s cheap case).
                posted: {
                    let mut p = Ring::with_limit(usize::from(opts.slots));
                    p.extend(0..u32::from(opts.slots));
                    p
                },
                retargeted: Vec::new(),
                placed_reader: false,
                head_reserved: false,
                taken_unposted: 0,
                news: None,
                posts: 0,
                unreaped: false,
                idle_spins: 0,
                idle_round: false,
                watch_ww: false,
                locks: 0,
                quiet_answers: 0,
                predicted_answers: 0,
                parked_predicted: 0,
                rx_blocks: false,
                rto: super::settings::RtoMin::Kernel,
                deferred: None,
            }),
            wakes: AtomicU32::new(0),
            opts: opts.clone(),
            local: qp.local_addr(),
            peer: qp.peer_addr(),
            tcp_fd,
            stats: super::settings::socket_counters(),
            on_progress: OnceLock::new(),
            parked: AtomicBool::new(false),
            owed: AtomicU64::new(0),
            owed_tries: AtomicU32::new(0),
            watch: OnceLock::new(),
            watching: AtomicU32::new(Self::WATCH_OFF),
            writable_wait: AtomicBool::new(false),
            quiet: AtomicBool::new(false),
            covered: AtomicBool::new(false),
            word: NEXT_WORD.fetch_add(2, Ordering::Relaxed),
            _ctx: e.ctx,
            pd: e.pd,
            cq: e.cq,
            qp,
            rx: e.rx,
            tx: e.tx,
            kept: None,
        }
    }

    /// Keeps `token` until this socket is dropped, after its slot memory
    /// is unmapped (one token a socket: a second replaces, and drops, the
    /// first). The preload library keeps the socket's place in its
    /// process's budget of DDP sockets here, so the place is given back
    /// by whichever of its paths drops the socket last (the program's
    /// close, a close finished in the background, an exit's).
    pub fn keep_until_dropped(&mut self, token: Box<dyn std::any::Any + Send + Sync>) {
        self.kept = Some(token);
    }
}

/// A socket shows its two ends (its books are behind its lock).
impl std::fmt::Debug for XSocket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("XSocket")
            .field("local", &self.local)
            .field("peer", &self.peer)
            .finish_non_exhaustive()
    }
}
