//! Queue pairs (RC only): creation, the state machine, the data path.
//!
//! An iWARP queue pair gets its connection from the connection manager:
//! it is created in RESET, moved to INIT (receives may be posted from
//! then on; they are handed to the connection when it is set up, so a Send
//! the peer issues at once finds a buffer), and reaches RTS only when
//! `rdma_connect`/`rdma_accept` attach an engine connection ([`QpShared::attach`]).
//!
//! # State transitions (`ibv_modify_qp`)
//!
//! RESET → INIT → (INIT | RTR); RTS only through the connection manager
//! (iWARP: siw answers EINVAL without a connection); RTS → SQD is iWARP's
//! graceful close (librdmacm's `rdma_disconnect` does exactly this); any
//! state → ERR (flush) or RESET. Anything else, or an `IBV_QP_CUR_STATE`
//! that is not the current state, fails with EINVAL.
//!
//! # Posting
//!
//! * Opcodes: SEND, SEND_WITH_INV, RDMA_WRITE, RDMA_READ (one scatter
//!   entry); everything else fails with EINVAL and `bad_wr` set, as siw's
//!   provider does (WRITE_WITH_IMM, SEND_WITH_IMM, atomics, LOCAL_INV,
//!   BIND_MW, TSO). Fence is accepted and has no effect (the engine runs a
//!   queue pair's requests in order).
//! * Inline data (up to the QP's `max_inline_data`) is copied at post time
//!   into a per-QP registered ring, one slot per send-queue entry.
//! * The send queue holds `max_send_wr` requests; an unsignalled request
//!   leaves it when a later signalled one completes and is polled (the
//!   verbs rule every device follows). A full queue fails with ENOMEM.
//! * Posting before RTS fails with ENOTCONN (siw); posting in ERR
//!   completes the request with `IBV_WC_WR_FLUSH_ERR`.

use std::collections::VecDeque;
use std::ffi::{c_int, c_uint};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use warpsock_engine::{
    Access, Event, Mr, Negotiated, PostError, Qp, QpInit, QpOptions, RecvWr, SendOp, SendWr, Sge,
    Sgl, Wc, WcOpcode, WcStatus,
};

use crate::abi::*;
use crate::cq::{self, CqShared};
use crate::ctx::{Ctx, CtxShared};
use crate::device::{ctx_is_ours, MAX_INLINE, MAX_QP_WR, MAX_RD_ATOM, MAX_SGE, MAX_SGE_RD};
use crate::kick::{Kicker, KICK_WR_ID, MAX_KICKS};
use crate::mem::{pd_is_ours, PdObj, PdShared};
use crate::real::forward;
use crate::util::{lock, null};

mod post;

pub use post::{post_recv, post_send};

/// How long a queue pair waits for the peer's FIN after a local
/// disconnect before it reports the connection gone anyway.
pub const CLOSE_WAIT: Duration = Duration::from_secs(2);

/// How a connection ended, for whoever watches it (the CM id).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// Closed (by either side, or failed).
    Closed,
}

/// Called once when a queue pair's connection ends.
pub type EndHook = Box<dyn FnOnce(End) + Send>;

/// A send-queue entry not yet retired.
#[derive(Debug, Clone, Copy)]
struct SqEntry {
    wr_id: u64,
}

/// Mutable state of a queue pair.
#[derive(Debug)]
pub struct QpState {
    /// `enum ibv_qp_state`.
    pub state: c_uint,
    /// The connection, once attached.
    pub eng: Option<Qp>,
    eng_num: Option<u32>,
    /// Receives posted before the connection exists.
    pre_recvs: Vec<RecvWr>,
    /// Send-queue entries posted and not yet retired.
    sq: VecDeque<SqEntry>,
    /// Requests ever posted (selects the inline slot).
    posted: u64,
    /// `qp_access_flags`.
    pub access: c_uint,
    /// Responder resources (IRD) and initiator depth (ORD).
    pub ird: u8,
    /// See `ird`.
    pub ord: u8,
    end_reported: bool,
    close_deadline: Option<Instant>,
    /// The initiator's kick past siw's accept race ([`crate::kick`]).
    kick: Kicker,
}

/// The shared part of a queue pair.
pub struct QpShared {
    /// The context.
    pub ctx: Arc<CtxShared>,
    /// The number programs see (`ibv_qp.qp_num`, `ibv_wc.qp_num`).
    pub qp_num: u32,
    /// The program's `ibv_qp` (for async events).
    pub ibv: *mut ibv_qp,
    /// Its domain.
    pub pd: Arc<PdShared>,
    /// Send CQ.
    pub send_cq: Arc<CqShared>,
    /// Receive CQ.
    pub recv_cq: Arc<CqShared>,
    /// Capabilities granted.
    pub cap: ibv_qp_cap,
    /// Every send request signalled.
    pub sig_all: bool,
    inline: Option<Mr>,
    /// State.
    pub st: Mutex<QpState>,
    /// Receives and RDMA Read responses completed, i.e. messages from the
    /// peer (counted by [`cq::translate`], sampled by the kick, see
    /// [`crate::kick`]).
    pub heard: AtomicU64,
    /// Called once when the connection ends.
    on_end: Mutex<Option<EndHook>>,
}

// SAFETY: `ibv` is only handed back to the program (async events); all
// other state is Send + Sync.
unsafe impl Send for QpShared {}
// SAFETY: as above.
unsafe impl Sync for QpShared {}

impl std::fmt::Debug for QpShared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QpShared")
            .field("qp_num", &self.qp_num)
            .finish()
    }
}

/// `struct ibv_qp` plus its state.
#[repr(C)]
pub struct QpObj {
    /// The ABI part.
    pub ibv: ibv_qp,
    /// The rest.
    pub sh: Arc<QpShared>,
}

static NEXT_QPN: AtomicU32 = AtomicU32::new(0x100);

/// Every live queue pair by number (`rdma_connect`/`rdma_accept` with
/// `conn_param->qp_num` name a QP the program created itself).
fn registry() -> &'static Mutex<std::collections::HashMap<u32, std::sync::Weak<QpShared>>> {
    static R: std::sync::OnceLock<
        Mutex<std::collections::HashMap<u32, std::sync::Weak<QpShared>>>,
    > = std::sync::OnceLock::new();
    R.get_or_init(Default::default)
}

/// The live queue pair with this number.
pub fn by_num(qp_num: u32) -> Option<Arc<QpShared>> {
    lock(registry())
        .get(&qp_num)
        .and_then(std::sync::Weak::upgrade)
}

/// The queue pair behind a program's pointer.
///
/// # Safety
/// `qp` is a live QP of a `warpsock0` context.
pub unsafe fn shared<'a>(qp: *mut ibv_qp) -> &'a Arc<QpShared> {
    // SAFETY: `ibv` is the first field of the repr(C) QpObj.
    unsafe { &(*qp.cast::<QpObj>()).sh }
}

/// Whether a QP is ours.
///
/// # Safety
/// `qp` is NULL or live.
pub unsafe fn qp_is_ours(qp: *const ibv_qp) -> bool {
    // SAFETY: per the contract.
    !qp.is_null() && unsafe { ctx_is_ours((*qp).context) }
}

fn flush_wc(qp_num: u32, wr_id: u64, opcode: c_uint) -> ibv_wc {
    ibv_wc {
        wr_id,
        status: IBV_WC_WR_FLUSH_ERR,
        opcode,
        qp_num,
        ..ibv_wc::default()
    }
}

fn post_errno(e: PostError) -> c_int {
    match e {
        PostError::QueueFull => libc::ENOMEM,
        _ => libc::EINVAL,
    }
}

impl QpShared {
    /// Whether this QP completes into CQ `id`.
    pub fn uses_cq(&self, id: u64) -> bool {
        self.send_cq.id == id || self.recv_cq.id == id
    }

    /// Retires send-queue entries up to the one completed with `wr_id`
    /// (completions come in posting order; unsignalled entries before a
    /// signalled one go with it).
    pub fn retire(&self, wr_id: u64) {
        let mut st = lock(&self.st);
        while let Some(e) = st.sq.pop_front() {
            if e.wr_id == wr_id {
                break;
            }
        }
    }

    /// Sets who is told when the connection ends.
    /// If the connection has already ended (a peer that fails at once can
    /// beat the CM to this call), `f` runs now.
    pub fn on_end(&self, f: EndHook) {
        let st = lock(&self.st);
        if st.end_reported {
            drop(st);
            f(End::Closed);
            return;
        }
        // Stored under the state lock: `watch_connection` marks the end
        // under it too, and takes the hook after.
        *lock(&self.on_end) = Some(f);
    }

    /// Engine options for connecting this QP (queue depths from its caps).
    pub fn options(&self, ird: u8, ord: u8, private_data: &[u8]) -> QpOptions {
        let cfg = crate::config::get();
        QpOptions {
            // Room for the kicks next to the program's own requests
            // (the program's limit is enforced in `post_send`).
            sq_depth: self.cap.max_send_wr.max(1) as usize + MAX_KICKS as usize,
            rq_depth: self.cap.max_recv_wr.max(1) as usize,
            crc: cfg.crc,
            peer_to_peer: cfg.p2p,
            ird: u16::from(ird),
            ord: u16::from(ord),
            private_data: private_data.to_vec(),
            ..QpOptions::default()
        }
    }

    /// Prepares a connection: the QP must be in INIT or RTR and not yet
    /// connected. Returns the engine's setup description, holding the
    /// receives posted so far.
    pub fn take_init(&self, options: QpOptions) -> Result<QpInit<'_>, c_int> {
        let mut st = lock(&self.st);
        if st.eng.is_some() || !matches!(st.state, IBV_QPS_INIT | IBV_QPS_RTR) {
            return Err(libc::EINVAL);
        }
        let recvs = std::mem::take(&mut st.pre_recvs);
        Ok(QpInit {
            pd: &self.pd.eng,
            send_cq: &self.send_cq.eng,
            recv_cq: &self.recv_cq.eng,
            options,
            recvs,
        })
    }

    /// Connection setup failed: the receives go back as flushed, the QP
    /// to ERR (as the kernel moves a QP whose connection failed).
    pub fn setup_failed(&self, recvs: Vec<RecvWr>) {
        let mut st = lock(&self.st);
        st.state = IBV_QPS_ERR;
        self.set_ibv_state(IBV_QPS_ERR);
        for r in recvs.into_iter().chain(st.pre_recvs.drain(..)) {
            self.recv_cq
                .push_stash(flush_wc(self.qp_num, r.wr_id, IBV_WC_RECV));
        }
    }

    /// Attaches an established connection: the QP is in RTS. `initiator`:
    /// this side connected (it may kick, see [`crate::kick`]).
    pub fn attach(self: &Arc<Self>, eng: Qp, neg: Option<&Negotiated>, initiator: bool) {
        let num = eng.qp_num();
        let mut st = lock(&self.st);
        // Receives posted while the connection was being set up.
        for r in st.pre_recvs.drain(..) {
            let _ = eng.post_recv(r);
        }
        st.state = IBV_QPS_RTS;
        if let Some(n) = neg {
            st.ird = n.ird.min(255) as u8;
            st.ord = n.ord.min(255) as u8;
        }
        st.eng = Some(eng);
        st.eng_num = Some(num);
        st.end_reported = false;
        st.kick = Kicker::new(initiator);
        drop(st);
        self.set_ibv_state(IBV_QPS_RTS);
        self.ctx.add_qp(num, Arc::clone(self) as _);
    }

    fn set_ibv_state(&self, s: c_uint) {
        if !self.ibv.is_null() {
            // SAFETY: the program's live QP; `state` is informational.
            unsafe { std::ptr::write_volatile(std::ptr::addr_of_mut!((*self.ibv).state), s) };
        }
    }

    /// Graceful disconnect (`rdma_disconnect`, modify to SQD): flush,
    /// FIN; the end is reported when the peer's FIN arrives (or after
    /// [`CLOSE_WAIT`]).
    pub fn disconnect(&self) -> Result<(), c_int> {
        let mut st = lock(&self.st);
        let Some(eng) = &st.eng else {
            return Err(libc::EINVAL);
        };
        eng.disconnect();
        if st.state == IBV_QPS_RTS {
            st.state = IBV_QPS_SQD;
        }
        st.close_deadline.get_or_insert(Instant::now() + CLOSE_WAIT);
        let s = st.state;
        drop(st);
        self.set_ibv_state(s);
        Ok(())
    }

    /// A fatal local error (CQ overrun): `IBV_EVENT_QP_FATAL`, then ERR.
    pub fn fatal(&self) {
        self.ctx.async_event(IBV_EVENT_QP_FATAL, self.ibv.cast());
        let mut st = lock(&self.st);
        if let Some(eng) = &st.eng {
            eng.disconnect();
        }
        st.state = IBV_QPS_ERR;
        drop(st);
        self.set_ibv_state(IBV_QPS_ERR);
    }

    /// The notifier's look at the connection: reports its end once.
    pub fn watch_connection(&self) {
        let mut st = lock(&self.st);
        if st.end_reported {
            return;
        }
        if st.eng.is_none() {
            return;
        }
        self.kick_if_due(&mut st);
        let Some(eng) = &st.eng else { return };
        let mut ended = false;
        while let Some(ev) = eng.poll_event() {
            match ev {
                Event::Terminated { .. } => {
                    self.ctx.async_event(IBV_EVENT_QP_FATAL, self.ibv.cast());
                    ended = true;
                }
                Event::Closed(_) => ended = true,
                _ => {}
            }
        }
        let dying = ended || eng.state() != warpsock_engine::QpState::Rts;
        let eng_closed = eng.is_closed();
        if dying {
            // Terminated, closed or failed: report the end once the stream
            // is finished, and at the latest after CLOSE_WAIT (a peer that
            // never sends its FIN must not hold DISCONNECTED back).
            st.close_deadline.get_or_insert(Instant::now() + CLOSE_WAIT);
        }
        let closed = eng_closed || st.close_deadline.is_some_and(|d| Instant::now() >= d);
        if !closed {
            return;
        }
        st.end_reported = true;
        st.state = IBV_QPS_ERR;
        drop(st);
        self.set_ibv_state(IBV_QPS_ERR);
        if let Some(f) = lock(&self.on_end).take() {
            f(End::Closed);
        }
    }

    /// Sends the initiator's kick when one is due ([`crate::kick`]).
    fn kick_if_due(&self, st: &mut QpState) {
        let heard = self.heard.load(Ordering::Relaxed);
        if !st.kick.due(Instant::now(), st.posted, heard) {
            return;
        }
        let Some(eng) = &st.eng else { return };
        if eng.state() != warpsock_engine::QpState::Rts {
            return;
        }
        let res = eng.post_send(SendWr {
            wr_id: KICK_WR_ID,
            op: SendOp::Write {
                remote_addr: 0,
                rkey: 1,
            },
            sgl: Sgl::new(),
            signaled: false,
        });
        crate::config::debug!(
            "qp {}: no answer from {} for a while after a post; kick {} (zero-length Write, siw accept race): {:?}",
            self.qp_num,
            eng.peer_addr(),
            st.kick.sent(),
            res
        );
    }

    fn detach(&self, st: &mut QpState) {
        if let Some(n) = st.eng_num.take() {
            self.ctx.remove_qp(n);
        }
        st.eng = None;
    }
}

impl crate::ctx::QpHooks for QpShared {
    fn qp_num(&self) -> u32 {
        self.qp_num
    }

    fn watch_connection(&self) {
        Self::watch_connection(self);
    }

    fn completed(&self, w: &Wc) {
        let from_peer = matches!(w.opcode, WcOpcode::Recv | WcOpcode::RdmaRead);
        if from_peer && w.status == WcStatus::Success {
            self.heard.fetch_add(1, Ordering::Relaxed);
        }
        if w.opcode != WcOpcode::Recv {
            self.retire(w.wr_id);
        }
    }

    fn uses_cq(&self, cq_id: u64) -> bool {
        Self::uses_cq(self, cq_id)
    }

    fn fatal(&self) {
        Self::fatal(self);
    }
}

/// `ibv_create_qp`: RC only; capabilities up to the device's limits (more
/// is EINVAL, as siw); `max_inline_data` up to [`MAX_INLINE`].
#[no_mangle]
pub unsafe extern "C" fn ibv_create_qp(
    pd: *mut ibv_pd,
    attr: *mut ibv_qp_init_attr,
) -> *mut ibv_qp {
    // SAFETY: the program passes a live PD.
    if !unsafe { pd_is_ours(pd) } {
        return forward!(
            ibv_create_qp(pd, attr) : fn(*mut ibv_pd, *mut ibv_qp_init_attr) -> *mut ibv_qp,
            null(libc::ENODEV)
        );
    }
    if attr.is_null() {
        return null(libc::EINVAL);
    }
    // SAFETY: non-NULL attributes from the program.
    let a = unsafe { &mut *attr };
    if a.qp_type != IBV_QPT_RC {
        return null(libc::EOPNOTSUPP);
    }
    if !a.srq.is_null() {
        return null(libc::EOPNOTSUPP);
    }
    if a.send_cq.is_null()
        || a.recv_cq.is_null()
        // SAFETY: the program's CQs (NULL checked).
        || !unsafe { cq::cq_is_ours(a.send_cq) && cq::cq_is_ours(a.recv_cq) }
    {
        return null(libc::EINVAL);
    }
    let c = &a.cap;
    if c.max_send_wr > MAX_QP_WR
        || c.max_recv_wr > MAX_QP_WR
        || c.max_send_sge > MAX_SGE
        || c.max_recv_sge > MAX_SGE
        || c.max_inline_data > MAX_INLINE
    {
        return null(libc::EINVAL);
    }
    // SAFETY: ours.
    let pdo = unsafe { PdObj::from_ibv(pd) };
    // SAFETY: ours.
    let ctx = unsafe { Ctx::from_ibv((*pd).context) };
    // SAFETY: ours.
    let (scq, rcq) = unsafe {
        (
            Arc::clone(cq::shared(a.send_cq)),
            Arc::clone(cq::shared(a.recv_cq)),
        )
    };
    let cap = ibv_qp_cap {
        max_send_wr: c.max_send_wr.max(1),
        max_recv_wr: c.max_recv_wr.max(1),
        max_send_sge: c.max_send_sge.max(1),
        max_recv_sge: c.max_recv_sge.max(1),
        max_inline_data: c.max_inline_data,
    };
    a.cap = cap;
    let inline = (cap.max_inline_data > 0).then(|| {
        pdo.sh.eng.alloc(
            cap.max_inline_data as usize * cap.max_send_wr as usize,
            Access::LOCAL_WRITE,
        )
    });
    let qp_num = NEXT_QPN.fetch_add(1, Ordering::Relaxed) & 0x00ff_ffff;
    // SAFETY: zeroed mutex/cond are their static initializers on glibc.
    let mut ibv: ibv_qp = unsafe { std::mem::zeroed() };
    // SAFETY: a live PD.
    ibv.context = unsafe { (*pd).context };
    ibv.qp_context = a.qp_context;
    ibv.pd = pd;
    ibv.send_cq = a.send_cq;
    ibv.recv_cq = a.recv_cq;
    ibv.handle = qp_num;
    ibv.qp_num = qp_num;
    ibv.state = IBV_QPS_RESET;
    ibv.qp_type = IBV_QPT_RC;
    let raw = Box::into_raw(Box::new(QpObj {
        ibv,
        sh: Arc::new(QpShared {
            ctx: Arc::clone(&ctx.sh),
            qp_num,
            ibv: std::ptr::null_mut(),
            pd: Arc::clone(&pdo.sh),
            send_cq: scq,
            recv_cq: rcq,
            cap,
            sig_all: a.sq_sig_all != 0,
            inline,
            st: Mutex::new(QpState {
                state: IBV_QPS_RESET,
                eng: None,
                eng_num: None,
                pre_recvs: Vec::new(),
                sq: VecDeque::new(),
                posted: 0,
                access: 0,
                ird: 1,
                ord: 1,
                end_reported: false,
                close_deadline: None,
                kick: Kicker::default(),
            }),
            heard: AtomicU64::new(0),
            on_end: Mutex::new(None),
        }),
    }));
    // SAFETY: just made; no other reference to its Arc exists yet.
    unsafe {
        let sh = Arc::get_mut(&mut (*raw).sh).expect("fresh Arc");
        sh.ibv = raw.cast();
        sh.send_cq.users.fetch_add(1, Ordering::AcqRel);
        sh.recv_cq.users.fetch_add(1, Ordering::AcqRel);
        sh.pd.users.fetch_add(1, Ordering::AcqRel);
        lock(registry()).insert(qp_num, Arc::downgrade(&(*raw).sh));
    }
    raw.cast()
}

/// `ibv_destroy_qp`: the connection is closed gracefully; completions
/// of the QP still queued are dropped from its CQs.
#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_qp(qp: *mut ibv_qp) -> c_int {
    // SAFETY: the program passes a live QP.
    if !unsafe { qp_is_ours(qp) } {
        return forward!(ibv_destroy_qp(qp) : fn(*mut ibv_qp) -> c_int, libc::EINVAL);
    }
    // SAFETY: reclaims the Box made in ibv_create_qp.
    let o = unsafe { Box::from_raw(qp.cast::<QpObj>()) };
    let sh = &o.sh;
    lock(registry()).remove(&sh.qp_num);
    lock(&sh.on_end).take();
    {
        let mut st = lock(&sh.st);
        sh.detach(&mut st);
    }
    sh.send_cq.users.fetch_sub(1, Ordering::AcqRel);
    sh.recv_cq.users.fetch_sub(1, Ordering::AcqRel);
    sh.pd.users.fetch_sub(1, Ordering::AcqRel);
    // Stashed completions of this QP go too.
    for cq in [&sh.send_cq, &sh.recv_cq] {
        lock(&cq.stash).retain(|w| w.qp_num != sh.qp_num);
    }
    0
}

fn valid_transition(cur: c_uint, new: c_uint, connected: bool) -> bool {
    match (cur, new) {
        (_, IBV_QPS_RESET) | (_, IBV_QPS_ERR) => true,
        (IBV_QPS_RESET, IBV_QPS_INIT) => true,
        (IBV_QPS_INIT, IBV_QPS_INIT | IBV_QPS_RTR) => true,
        (IBV_QPS_RTR, IBV_QPS_RTR) => true,
        (IBV_QPS_RTR, IBV_QPS_RTS) => connected,
        (IBV_QPS_RTS, IBV_QPS_SQD) => connected,
        (IBV_QPS_SQD, IBV_QPS_SQD) => true,
        _ => false,
    }
}

/// `ibv_modify_qp`.
#[no_mangle]
pub unsafe extern "C" fn ibv_modify_qp(
    qp: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    mask: c_int,
) -> c_int {
    // SAFETY: the program passes a live QP.
    if !unsafe { qp_is_ours(qp) } {
        return forward!(
            ibv_modify_qp(qp, attr, mask) : fn(*mut ibv_qp, *mut ibv_qp_attr, c_int) -> c_int,
            libc::EINVAL
        );
    }
    if attr.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: ours; non-NULL attributes.
    let (sh, a) = unsafe { (shared(qp), &*attr) };
    let mut st = lock(&sh.st);
    if mask & IBV_QP_CUR_STATE != 0 && a.cur_qp_state != st.state {
        return libc::EINVAL;
    }
    if mask & IBV_QP_CAP != 0 {
        // Resizing queues is not supported (siw neither).
        return libc::EINVAL;
    }
    if mask & IBV_QP_MAX_QP_RD_ATOMIC != 0 {
        if a.max_rd_atomic > MAX_RD_ATOM {
            return libc::EINVAL;
        }
        st.ord = a.max_rd_atomic;
    }
    if mask & IBV_QP_MAX_DEST_RD_ATOMIC != 0 {
        if a.max_dest_rd_atomic > MAX_RD_ATOM {
            return libc::EINVAL;
        }
        st.ird = a.max_dest_rd_atomic;
    }
    if mask & IBV_QP_PORT != 0 && a.port_num != 1 {
        return libc::EINVAL;
    }
    if mask & IBV_QP_ACCESS_FLAGS != 0 {
        st.access = a.qp_access_flags;
    }
    if mask & IBV_QP_STATE == 0 {
        return 0;
    }
    let new = a.qp_state;
    // A connected QP ignores moves back to INIT/RTR and to RTS, as siw
    // does (`siw_qp_nextstate_from_rts`): programs that create their own
    // QP (rping -q) walk it INIT -> RTR -> RTS after the CM connected it.
    if st.state == IBV_QPS_RTS
        && st.eng.is_some()
        && matches!(new, IBV_QPS_INIT | IBV_QPS_RTR | IBV_QPS_RTS)
    {
        return 0;
    }
    if new > IBV_QPS_ERR || !valid_transition(st.state, new, st.eng.is_some()) {
        return libc::EINVAL;
    }
    match new {
        IBV_QPS_RESET => {
            sh.detach(&mut st);
            st.pre_recvs.clear();
            st.sq.clear();
        }
        IBV_QPS_ERR => {
            if let Some(eng) = &st.eng {
                eng.disconnect();
            }
            for r in st.pre_recvs.drain(..) {
                sh.recv_cq
                    .push_stash(flush_wc(sh.qp_num, r.wr_id, IBV_WC_RECV));
            }
        }
        IBV_QPS_SQD => {
            if let Some(eng) = &st.eng {
                eng.disconnect();
            }
            st.close_deadline.get_or_insert(Instant::now() + CLOSE_WAIT);
        }
        _ => {}
    }
    st.state = new;
    drop(st);
    sh.set_ibv_state(new);
    0
}

/// `ibv_query_qp`.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_qp(
    qp: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    mask: c_int,
    init: *mut ibv_qp_init_attr,
) -> c_int {
    // SAFETY: the program passes a live QP.
    if !unsafe { qp_is_ours(qp) } {
        return forward!(
            ibv_query_qp(qp, attr, mask, init)
                : fn(*mut ibv_qp, *mut ibv_qp_attr, c_int, *mut ibv_qp_init_attr) -> c_int,
            libc::EINVAL
        );
    }
    if attr.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: ours.
    let sh = unsafe { shared(qp) };
    let st = lock(&sh.st);
    // SAFETY: all-zero is valid for this plain C struct; out-pointers
    // from the program.
    unsafe {
        *attr = std::mem::zeroed();
        let a = &mut *attr;
        a.qp_state = st.state;
        a.cur_qp_state = st.state;
        a.path_mtu = IBV_MTU_1024;
        a.qp_access_flags = st.access;
        a.cap = sh.cap;
        a.max_rd_atomic = st.ord;
        a.max_dest_rd_atomic = st.ird;
        a.port_num = 1;
        if !init.is_null() {
            let i = &mut *init;
            i.qp_context = (*qp).qp_context;
            i.send_cq = (*qp).send_cq;
            i.recv_cq = (*qp).recv_cq;
            i.srq = std::ptr::null_mut();
            i.cap = sh.cap;
            i.qp_type = IBV_QPT_RC;
            i.sq_sig_all = c_int::from(sh.sig_all);
        }
    }
    let _ = mask;
    0
}

/// `ibv_qp_to_qp_ex`: queue pairs here have no extended interface
/// (NULL: programs use `ibv_post_send`).
#[no_mangle]
pub unsafe extern "C" fn ibv_qp_to_qp_ex(qp: *mut ibv_qp) -> *mut std::ffi::c_void {
    // SAFETY: the program passes a live QP.
    if unsafe { qp_is_ours(qp) } {
        return null(libc::EOPNOTSUPP);
    }
    forward!(ibv_qp_to_qp_ex(qp) : fn(*mut ibv_qp) -> *mut std::ffi::c_void, std::ptr::null_mut())
}

/// `ibv_create_srq`: no shared receive queues (the engine has none).
#[no_mangle]
pub unsafe extern "C" fn ibv_create_srq(
    pd: *mut ibv_pd,
    attr: *mut ibv_srq_init_attr,
) -> *mut ibv_srq {
    // SAFETY: the program passes a live PD.
    if unsafe { pd_is_ours(pd) } {
        return null(libc::EOPNOTSUPP);
    }
    forward!(
        ibv_create_srq(pd, attr) : fn(*mut ibv_pd, *mut ibv_srq_init_attr) -> *mut ibv_srq,
        null(libc::ENODEV)
    )
}

/// `ops.post_srq_recv` (never reached: no SRQ exists here).
pub unsafe extern "C" fn post_srq_recv(
    srq: *mut ibv_srq,
    wr: *mut ibv_recv_wr,
    bad: *mut *mut ibv_recv_wr,
) -> c_int {
    let _ = srq;
    if !bad.is_null() {
        // SAFETY: the program's out-pointer.
        unsafe { *bad = wr };
    }
    libc::EOPNOTSUPP
}
