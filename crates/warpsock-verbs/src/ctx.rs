//! A device context (`ibv_open_device` on `warpsock0`): the ABI-exact
//! `verbs_context` programs see, one caller-driven engine context, and the
//! two helper threads that keep things moving while the program is not in
//! a verbs call.
//!
//! # Why two threads, and when they run
//!
//! The engine context is caller-driven: a program spinning on
//! `ibv_poll_cq` receives inside that call, with no thread hand-off (on a
//! 2-CPU machine a spinning program and a progress thread fight for the
//! CPU, and the thread loses). But programs also rely on progress they do
//! not drive: a passive RDMA Write/Read target (perftest's `ib_write_bw`
//! server) never polls; an event-driven program (rping, rsockets) sleeps
//! in `ibv_get_cq_event` or `poll` on the channel fd.
//!
//! * The **driver** makes progress (receives, transmits, answers Read
//!   Requests) by sleeping in the engine's own wait on a hidden CQ, in
//!   [`SLICE`] rounds. It backs off while the program keeps calling the
//!   data path (a round in which `ibv_poll_cq`/`ibv_post_*` were called and
//!   no CQ is armed), checking again every [`BACKOFF`]; arming a CQ (the
//!   program is about to sleep) wakes it at once.
//! * The **notifier** sleeps in `epoll` on the engine's per-CQ
//!   notification fds of armed CQs and turns a completion on an armed CQ
//!   into a completion-channel event. While queue pairs are connected it
//!   also looks at their connections every [`WATCH`] (and on every wake-up)
//!   to report ends (`RDMA_CM_EVENT_DISCONNECTED`, `IBV_EVENT_QP_FATAL`).
//!
//! # What a context knows of its objects
//!
//! This module sits below the CQs and queue pairs that use it: it sees a
//! CQ only as [`CqWake`] and a connected queue pair only as [`QpHooks`]
//! (both implemented in their own modules), and its `ops` table is filled
//! by whoever opens it ([`Ctx::open`]).

use std::collections::HashMap;
use std::ffi::{c_int, c_uint, c_void};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

use warpsock_engine::{Context, Progress, Wc};

use crate::abi::{self, ibv_context, ibv_context_ops, verbs_context};
use crate::util::{lock, EventQueue};

/// Length of one driver round.
pub const SLICE: Duration = Duration::from_millis(2);
/// How long the driver stays away while the program is polling.
pub const BACKOFF: Duration = Duration::from_millis(1);
/// How often connections are checked for their end while any is up.
pub const WATCH: Duration = Duration::from_millis(20);

/// Epoll token of the notifier's wake-up eventfd.
const WAKE: u64 = u64::MAX;

/// What the notifier asks of a CQ it watches: its engine notification fd
/// turned readable.
pub trait CqWake: Send + Sync + std::fmt::Debug {
    /// Queues the CQ's completion event if it is armed.
    fn notify_ready(&self);
}

/// What a context asks of a connected queue pair: the notifier's look at
/// its connection, and the hooks CQs call for the pair's completions.
pub trait QpHooks: Send + Sync + std::fmt::Debug {
    /// The number programs see (`ibv_qp.qp_num`, `ibv_wc.qp_num`).
    fn qp_num(&self) -> u32;
    /// The notifier's periodic look at the connection (its end, kicks).
    fn watch_connection(&self);
    /// A completion of this pair is about to be handed to the program
    /// (send-queue bookkeeping, what the peer sent).
    fn completed(&self, w: &Wc);
    /// Whether the pair uses the CQ with this id.
    fn uses_cq(&self, cq_id: u64) -> bool;
    /// A fatal local error (the CQ overran): `IBV_EVENT_QP_FATAL`, then ERR.
    fn fatal(&self);
}

/// An asynchronous event (`ibv_get_async_event`): its type and element.
#[derive(Debug, Clone, Copy)]
pub struct AsyncEvent {
    /// `enum ibv_event_type`.
    pub kind: c_uint,
    /// The CQ, QP or SRQ it concerns.
    pub element: *mut c_void,
}

// SAFETY: the element pointer is only handed back to the program, which
// owns the object it names; this crate never dereferences it.
unsafe impl Send for AsyncEvent {}

/// The part of a context its objects and helper threads share.
#[derive(Debug)]
pub struct CtxShared {
    /// The engine context (caller-driven).
    pub eng: Context,
    /// Data-path calls so far (`ibv_poll_cq`, `ibv_post_*`): the driver
    /// stays away while this keeps moving and no CQ is armed.
    pub polls: AtomicU64,
    /// CQs armed for a completion event.
    pub armed: AtomicUsize,
    /// Connected queue pairs by the engine's queue pair number, for
    /// completions and the notifier's connection watch.
    qps: Mutex<HashMap<u32, Arc<dyn QpHooks>>>,
    /// Asynchronous events.
    pub async_events: EventQueue<AsyncEvent>,
    helpers: Mutex<Option<Helpers>>,
    /// Whether the driver is sleeping out a back-off.
    driver_idle: AtomicBool,
    driver_cv: Condvar,
    driver_mx: Mutex<()>,
    stop: AtomicBool,
    notifier: Notifier,
}

#[derive(Debug)]
struct Helpers {
    driver: JoinHandle<()>,
    notifier: JoinHandle<()>,
}

/// The notifier's epoll set: the wake-up eventfd and armed CQs' fds.
#[derive(Debug)]
struct Notifier {
    epoll: c_int,
    wake: c_int,
    cqs: Mutex<HashMap<u64, Weak<dyn CqWake>>>,
}

impl Drop for Notifier {
    fn drop(&mut self) {
        // SAFETY: closes descriptors this struct owns.
        unsafe {
            libc::close(self.epoll);
            libc::close(self.wake);
        }
    }
}

impl Notifier {
    fn new() -> std::io::Result<Self> {
        // SAFETY: plain system calls; results checked.
        unsafe {
            let epoll = libc::epoll_create1(libc::EPOLL_CLOEXEC);
            if epoll < 0 {
                return Err(std::io::Error::last_os_error());
            }
            let wake = libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK);
            if wake < 0 {
                let e = std::io::Error::last_os_error();
                libc::close(epoll);
                return Err(e);
            }
            let mut ev = libc::epoll_event {
                events: libc::EPOLLIN as u32,
                u64: WAKE,
            };
            libc::epoll_ctl(epoll, libc::EPOLL_CTL_ADD, wake, &mut ev);
            Ok(Self {
                epoll,
                wake,
                cqs: Mutex::new(HashMap::new()),
            })
        }
    }

    fn wake(&self) {
        let one: u64 = 1;
        // SAFETY: 8 bytes from a live u64 to our eventfd.
        unsafe { libc::write(self.wake, (&one as *const u64).cast(), 8) };
    }
}

impl CtxShared {
    /// Counts a data-path call (the driver's back-off signal).
    #[inline]
    pub fn touch(&self) {
        self.polls.fetch_add(1, Ordering::Relaxed);
    }

    /// A CQ was armed: the program may be about to sleep, so the driver
    /// must not be backing off.
    pub fn cq_armed(&self) {
        self.armed.fetch_add(1, Ordering::AcqRel);
        if self.driver_idle.load(Ordering::Acquire) {
            let _g = lock(&self.driver_mx);
            self.driver_cv.notify_all();
        }
    }

    /// Watches CQ `id`'s engine notification fd for one readiness
    /// (oneshot).
    pub fn watch_cq(&self, id: u64, cq: Weak<dyn CqWake>, fd: c_int, first: bool) {
        let mut ev = libc::epoll_event {
            events: (libc::EPOLLIN | libc::EPOLLONESHOT) as u32,
            u64: id,
        };
        if first {
            lock(&self.notifier.cqs).insert(id, cq);
        }
        let op = if first {
            libc::EPOLL_CTL_ADD
        } else {
            libc::EPOLL_CTL_MOD
        };
        // SAFETY: our epoll fd, a live event struct, the engine's fd.
        unsafe { libc::epoll_ctl(self.notifier.epoll, op, fd, &mut ev) };
    }

    /// Stops watching a CQ that is being destroyed.
    pub fn unwatch_cq(&self, id: u64, fd: Option<c_int>) {
        lock(&self.notifier.cqs).remove(&id);
        if let Some(fd) = fd {
            // SAFETY: our epoll fd; a stale fd only makes this fail.
            unsafe {
                libc::epoll_ctl(
                    self.notifier.epoll,
                    libc::EPOLL_CTL_DEL,
                    fd,
                    std::ptr::null_mut(),
                )
            };
        }
    }

    /// Registers a connected queue pair and makes sure the helper threads
    /// run.
    pub fn add_qp(self: &Arc<Self>, eng_num: u32, qp: Arc<dyn QpHooks>) {
        lock(&self.qps).insert(eng_num, qp);
        self.start_helpers();
        let _g = lock(&self.driver_mx);
        self.driver_cv.notify_all();
        drop(_g);
        self.notifier.wake();
    }

    /// Forgets a queue pair (destroyed, reset).
    pub fn remove_qp(&self, eng_num: u32) {
        lock(&self.qps).remove(&eng_num);
    }

    /// The queue pair behind an engine queue pair number.
    pub fn qp(&self, eng_num: u32) -> Option<Arc<dyn QpHooks>> {
        lock(&self.qps).get(&eng_num).cloned()
    }

    /// The connected queue pairs.
    pub fn connected(&self) -> Vec<Arc<dyn QpHooks>> {
        lock(&self.qps).values().cloned().collect()
    }

    /// Queues an asynchronous event.
    pub fn async_event(&self, kind: c_uint, element: *mut c_void) {
        // The async event queue is never closed.
        let _ = self.async_events.push(AsyncEvent { kind, element });
    }

    fn start_helpers(self: &Arc<Self>) {
        let mut h = lock(&self.helpers);
        if h.is_some() || self.stop.load(Ordering::Acquire) {
            return;
        }
        let d = Arc::clone(self);
        let n = Arc::clone(self);
        let driver = std::thread::Builder::new()
            .name("warpsock-verbs-driver".into())
            .spawn(move || d.run_driver());
        let notifier = std::thread::Builder::new()
            .name("warpsock-verbs-notify".into())
            .spawn(move || n.run_notifier());
        if let (Ok(driver), Ok(notifier)) = (driver, notifier) {
            *h = Some(Helpers { driver, notifier });
        }
    }

    fn run_driver(&self) {
        let Ok(hidden) = self.eng.create_cq(1) else {
            return;
        };
        let mut buf = [Wc::default(); 1];
        let mut backoff = false;
        while !self.stop.load(Ordering::Acquire) {
            if lock(&self.qps).is_empty() {
                let g = lock(&self.driver_mx);
                let _ = self.driver_cv.wait_timeout(g, Duration::from_millis(100));
                continue;
            }
            let p0 = self.polls.load(Ordering::Relaxed);
            if backoff && self.armed.load(Ordering::Acquire) == 0 {
                let g = lock(&self.driver_mx);
                self.driver_idle.store(true, Ordering::Release);
                if self.armed.load(Ordering::Acquire) == 0 {
                    let _ = self.driver_cv.wait_timeout(g, BACKOFF);
                }
                self.driver_idle.store(false, Ordering::Release);
            } else {
                // Drives every queue pair of the context; the hidden CQ
                // never completes, so this returns after the slice.
                let _ = hidden.wait(&mut buf, SLICE);
            }
            backoff = self.polls.load(Ordering::Relaxed) != p0;
        }
    }

    fn run_notifier(&self) {
        let mut evs = [libc::epoll_event { events: 0, u64: 0 }; 32];
        while !self.stop.load(Ordering::Acquire) {
            let watching = !lock(&self.qps).is_empty();
            let timeout = if watching {
                WATCH.as_millis() as c_int
            } else {
                200
            };
            // SAFETY: our epoll fd and a live array of 32 events.
            let n = unsafe { libc::epoll_wait(self.notifier.epoll, evs.as_mut_ptr(), 32, timeout) };
            for ev in evs.iter().take(n.max(0) as usize) {
                let token = ev.u64;
                if token == WAKE {
                    let mut v: u64 = 0;
                    // SAFETY: non-blocking read of our eventfd.
                    unsafe { libc::read(self.notifier.wake, (&mut v as *mut u64).cast(), 8) };
                    continue;
                }
                let cq = lock(&self.notifier.cqs).get(&token).and_then(Weak::upgrade);
                if let Some(cq) = cq {
                    cq.notify_ready();
                }
            }
            for qp in self.connected() {
                qp.watch_connection();
            }
        }
    }

    fn shutdown(&self) {
        self.stop.store(true, Ordering::Release);
        {
            let _g = lock(&self.driver_mx);
            self.driver_cv.notify_all();
        }
        self.notifier.wake();
        if let Some(h) = lock(&self.helpers).take() {
            let _ = h.driver.join();
            let _ = h.notifier.join();
        }
    }
}

/// A `warpsock0` context: `verbs_context` (ending in the `ibv_context`
/// programs hold) followed by this crate's state.
#[repr(C)]
pub struct Ctx {
    /// The ABI part.
    pub vctx: verbs_context,
    /// Everything else.
    pub sh: Arc<CtxShared>,
}

impl Ctx {
    /// Opens a context on `warpsock0` whose inline data path jumps through
    /// `ops` and whose `query_port` extension is `query_port_ex`.
    pub fn open(
        device: *mut abi::ibv_device,
        ops: ibv_context_ops,
        query_port_ex: *mut c_void,
    ) -> std::io::Result<*mut ibv_context> {
        let eng = Context::new(Progress::Caller)?;
        let sh = Arc::new(CtxShared {
            eng,
            polls: AtomicU64::new(0),
            armed: AtomicUsize::new(0),
            qps: Mutex::new(HashMap::new()),
            async_events: EventQueue::new()?,
            helpers: Mutex::new(None),
            driver_idle: AtomicBool::new(false),
            driver_cv: Condvar::new(),
            driver_mx: Mutex::new(()),
            stop: AtomicBool::new(false),
            notifier: Notifier::new()?,
        });
        let mut ext = [std::ptr::null_mut(); abi::VERBS_CONTEXT_OPS];
        ext[abi::VCTX_QUERY_PORT] = query_port_ex;
        let async_fd = sh.async_events.fd();
        let mut ctx: Box<Self> = Box::new(Self {
            // SAFETY: all-zero bytes are a valid `pthread_mutex_t` initializer
            // on Linux/glibc (PTHREAD_MUTEX_INITIALIZER) and a valid value for
            // every other (pointer, integer, Option<fn>) field.
            vctx: unsafe { std::mem::zeroed() },
            sh,
        });
        ctx.vctx.ops = ext;
        ctx.vctx.sz = size_of::<verbs_context>();
        let c = &mut ctx.vctx.context;
        c.device = device;
        c.cmd_fd = -1;
        c.async_fd = async_fd;
        c.num_comp_vectors = 1;
        c.abi_compat = abi::VERBS_ABI_IS_EXTENDED;
        c.ops = ops;
        let raw = Box::into_raw(ctx);
        // SAFETY: `raw` is a live Box allocation.
        Ok(unsafe { std::ptr::addr_of_mut!((*raw).vctx.context) })
    }

    /// The context behind an `ibv_context` this crate made.
    ///
    /// # Safety
    /// `c` must come from [`Self::open`] and not be closed.
    pub unsafe fn from_ibv<'a>(c: *mut ibv_context) -> &'a Self {
        let off = std::mem::offset_of!(Self, vctx) + std::mem::offset_of!(verbs_context, context);
        // SAFETY: per the contract `c` points into a live `Ctx` at `off`.
        unsafe { &*(c.cast::<u8>().sub(off).cast::<Self>()) }
    }

    /// Closes a context: stops its helper threads and frees it.
    ///
    /// # Safety
    /// As [`Self::from_ibv`]; `c` is not used afterwards.
    pub unsafe fn close(c: *mut ibv_context) {
        let off = std::mem::offset_of!(Self, vctx) + std::mem::offset_of!(verbs_context, context);
        // SAFETY: per the contract; reclaims the Box made in `open`.
        let ctx = unsafe { Box::from_raw(c.cast::<u8>().sub(off).cast::<Self>()) };
        ctx.sh.shutdown();
    }
}
