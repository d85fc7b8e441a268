//! The device context: the unit of progress. [`Context`] is the handle;
//! [`Inner`] is the shared state behind one lock ([`State`]) with the
//! epoll set, the wake-up eventfd and the progress thread.
//!
//! The other handles ([`crate::Pd`], [`crate::Mr`], [`crate::Cq`],
//! [`crate::Qp`]) each hold an `Arc<Shared>` and live in their own
//! modules, which add their constructors to [`Context`]; this module
//! depends only on the socket driver below it.

use std::io;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError, TryLockError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use warpsock_proto::{Connection, Event, Registry};

use crate::driver::{
    Allowed, ParkedRead, ParkedSleeps, QpSlot, RxPool, Sleep, WaitCounters, WaitStats,
};
use crate::error::{Error, Result};
use crate::mem::Mem;
use crate::sys::{self, Epoll, EventFd, Ready};
use crate::wc::CqSlot;

/// Epoll token of the context's wake-up eventfd.
const WAKE_TOKEN: u64 = u64::MAX;
/// Up to this many queue pairs, caller-driven progress tries each socket
/// directly instead of asking epoll which are ready.
const DIRECT_POLL_MAX: usize = 8;
/// How often the progress thread looks for lingering sockets to close.
const LINGER_TICK: Duration = Duration::from_millis(50);
/// Default of [`ContextOptions::linger`].
pub const DEFAULT_LINGER: Duration = Duration::from_secs(2);

/// How a context makes progress.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum Progress {
    /// Progress happens inside the application's calls: posts transmit at
    /// once, [`crate::Cq::poll`] and [`crate::Cq::wait`] receive. Lowest
    /// latency; nothing moves while the application is away computing.
    #[default]
    Caller,
    /// A background thread per context receives and finishes transmits, so
    /// operations complete while the application computes. The application
    /// blocks in [`crate::Cq::wait`] or on the completion queue's fd.
    Thread,
}

/// Options for [`Context::with_options`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContextOptions {
    /// Progress mode.
    pub progress: Progress,
    /// Caller-driven mode: how long [`crate::Cq::wait`] spins polling the
    /// sockets before it sleeps in the kernel (zero: sleep at once).
    /// Spinning trades a CPU for latency. None inside
    /// [`crate::spun::after_spin`] (its caller spun already).
    pub busy_poll: Duration,
    /// How long a dropped queue pair keeps its socket open, discarding
    /// input, waiting for the peer's FIN (default 2 s; see
    /// [`crate::Qp`]'s `Drop`). When it ends with bytes still unwritten,
    /// their requests complete as flushed.
    pub linger: Duration,
}

impl Default for ContextOptions {
    fn default() -> Self {
        Self {
            progress: Progress::Caller,
            busy_poll: Duration::ZERO,
            linger: DEFAULT_LINGER,
        }
    }
}

/// Everything one context owns, behind one lock.
#[derive(Debug)]
pub(crate) struct State {
    pub(crate) reg: Registry<Mem>,
    pub(crate) qps: Vec<Option<QpSlot>>,
    pub(crate) cqs: Vec<Option<CqSlot>>,
    /// Receive staging buffers shared by the queue pairs.
    pub(crate) rx_pool: RxPool,
    /// Dropped queue pairs still lingering (see [`QpSlot::detached`]).
    pub(crate) detached: usize,
    /// Whether the queue pairs' sockets are registered with the context's
    /// epoll. Always in progress-thread mode; in caller-driven mode only
    /// from the first time a caller needs epoll (see [`Self::watch_all`]).
    pub(crate) watching: bool,
    /// Application closures reading region bytes right now
    /// ([`crate::Mr::with_bytes`]): nothing may be placed meanwhile.
    pub(crate) readers: usize,
    /// Application closures writing region bytes right now
    /// ([`crate::Mr::with_bytes_mut`]): nothing may be placed or gathered.
    pub(crate) writers: usize,
    /// Progress was skipped for a borrow: the last borrow to end makes it
    /// up.
    pub(crate) deferred: bool,
    /// Times [`Inner::lock`] took the lock (a diagnostic: see
    /// [`Context::lock_count`]). Counted under the lock, a plain add: an
    /// atomic counter beside the mutex was a `lock xadd` per take.
    pub(crate) locks: u64,
    /// Callers' sleeps in parked reads ([`Context::wait_stats`]).
    pub(crate) parked_sleeps: ParkedSleeps,
}

impl State {
    /// What progress may do to registered memory now.
    pub(crate) fn allowed(&mut self) -> Allowed {
        let a = Allowed {
            rx: self.readers == 0 && self.writers == 0,
            tx: self.writers == 0,
        };
        if a != Allowed::ALL {
            self.deferred = true;
        }
        a
    }

    pub(crate) fn service(&mut self, qi: usize, epoll: &Epoll) -> bool {
        self.round(qi, epoll, QpSlot::service).unwrap_or(false)
    }

    /// Runs a service round `f` ([`QpSlot::service`] or
    /// [`QpSlot::service_round`]) on queue pair `qi`, if it is there.
    #[inline]
    fn round<R>(
        &mut self,
        qi: usize,
        epoll: &Epoll,
        f: impl FnOnce(
            &mut QpSlot,
            u64,
            &mut Registry<Mem>,
            &mut [Option<CqSlot>],
            &mut RxPool,
            Option<&Epoll>,
            Allowed,
        ) -> R,
    ) -> Option<R> {
        let allowed = self.allowed();
        let Self {
            reg,
            qps,
            cqs,
            rx_pool,
            ..
        } = self;
        match qps.get_mut(qi) {
            Some(Some(q)) => Some(f(
                q,
                qi as u64,
                reg,
                cqs,
                rx_pool,
                self.watching.then_some(epoll),
                allowed,
            )),
            _ => None,
        }
    }

    /// Registers every queue pair's socket with epoll, from now on.
    ///
    /// A socket in an epoll set costs the kernel a callback on every
    /// segment that arrives (about 220 ns per 8-byte hop on loopback here,
    /// 4% of a TCP ping-pong), so caller-driven contexts leave their
    /// sockets out until a caller is about to sleep in `epoll_wait` or
    /// there are too many queue pairs to try each directly. Once on, it
    /// stays on (registering costs a system call per socket).
    pub(crate) fn watch_all(&mut self, epoll: &Epoll) {
        if self.watching {
            return;
        }
        self.watching = true;
        for (qi, q) in self.qps.iter_mut().enumerate() {
            if let Some(q) = q {
                q.update_interest(qi as u64, Some(epoll));
            }
        }
    }

    fn live_qps(&self) -> usize {
        self.qps.iter().flatten().filter(|q| !q.is_done()).count()
    }

    /// Closes the dropped queue pairs whose linger is over. Requests whose
    /// bytes never reached the socket complete as flushed first.
    ///
    /// Inline, the look at the count only: it is asked after every
    /// parked read, and almost always none is detached.
    #[inline]
    pub(crate) fn reap(&mut self, epoll: &Epoll) {
        if self.detached != 0 {
            self.reap_detached(epoll);
        }
    }

    #[inline(never)]
    fn reap_detached(&mut self, epoll: &Epoll) {
        let now = Instant::now();
        let Self { qps, cqs, .. } = self;
        for slot in qps.iter_mut() {
            if slot.as_ref().is_some_and(|q| q.reapable(now)) {
                if let Some(mut q) = slot.take() {
                    q.finish(cqs);
                    q.unregister(epoll);
                }
                self.detached -= 1;
            }
        }
    }

    /// The context's terms for a queue pair's short round or predicted
    /// take (`Cq::idle_round`, `Unparked::take`): one queue pair slot and
    /// no dropped one lingering (so a round services that one alone), and
    /// no region borrowed (a round receives and transmits, deferring
    /// nothing).
    #[inline(always)]
    pub(crate) fn one_qp_unborrowed(&self) -> bool {
        self.qps.len() == 1 && self.detached == 0 && self.readers + self.writers == 0
    }

    /// With exactly one connection in the context, prepares a blocking read
    /// of it for a caller about to sleep (see [`crate::Cq::wait`]).
    pub(crate) fn park(&mut self, timeout: Duration) -> Option<ParkedRead> {
        if self.readers + self.writers > 0 {
            return None;
        }
        let mut live = self
            .qps
            .iter()
            .enumerate()
            .filter_map(|(i, q)| q.as_ref().filter(|q| !q.is_done()).map(|_| i));
        let (Some(qi), None) = (live.next(), live.next()) else {
            return None;
        };
        let Self { qps, rx_pool, .. } = self;
        let q = qps[qi].as_mut()?;
        q.park(qi, rx_pool, timeout)
    }

    /// A parked read that never comes back (its thread's exit in a signal
    /// handler over the sleep: [`crate::Cq::abandon_park`]): the queue pair
    /// (if still the same one) reads its socket in rounds again.
    pub(crate) fn abandon_park(&mut self, qi: usize, slot_id: u64) {
        if let Some(Some(q)) = self.qps.get_mut(qi) {
            if q.id == slot_id {
                q.abandon_park();
            }
        }
    }

    /// Hands a parked read's result back to its queue pair (if that is
    /// still the same one) and services it.
    pub(crate) fn unpark(&mut self, p: ParkedRead, res: io::Result<usize>, epoll: &Epoll) {
        if let Some(qi) = self.unpark_staged(p, res) {
            self.service_unparked(qi, epoll);
        }
    }

    /// [`Self::unpark`]'s first half: the read's result handed back to its
    /// queue pair (its bytes staged, EOF or an error taken), not serviced.
    /// `Some`: the queue pair's index, for [`Self::service_unparked`]
    /// (which must follow unless the staged bytes are taken otherwise:
    /// `Cq::park_first`'s prediction); `None`: the slot went away, the
    /// read's buffer is given back.
    #[inline(always)]
    pub(crate) fn unpark_staged(&mut self, p: ParkedRead, res: io::Result<usize>) -> Option<usize> {
        let qi = p.qi;
        match self.qps.get_mut(qi) {
            Some(Some(q)) if q.id == p.slot_id => {
                q.unpark(p, res);
                Some(qi)
            }
            _ => {
                p.discard(&mut self.rx_pool);
                None
            }
        }
    }

    /// [`Self::unpark`]'s second half: queue pair `qi`'s service round
    /// over what its parked read staged, and the reap.
    pub(crate) fn service_unparked(&mut self, qi: usize, epoll: &Epoll) {
        // The caller drains its queue next: whether the round produced
        // anything is not asked.
        self.round(qi, epoll, QpSlot::service_round);
        self.reap(epoll);
    }

    pub(crate) fn qp(&mut self, qi: usize) -> &mut QpSlot {
        self.qps[qi]
            .as_mut()
            .expect("queue pair handle outlives its slot")
    }

    pub(crate) fn cq(&mut self, ci: usize) -> &mut CqSlot {
        self.cqs[ci].as_mut().expect("CQ handle outlives its slot")
    }
}

/// The shared part of a context.
#[derive(Debug)]
pub(crate) struct Inner {
    state: Mutex<State>,
    /// Signalled when completions arrive (progress-thread mode) and when
    /// the last borrow of region bytes ends: through [`Inner::notify`],
    /// never directly.
    cv: Condvar,
    /// Threads in [`Inner::wait_cv`] (counted under the lock). Signalling
    /// a condition variable is a `futex` wake system call even with
    /// nobody waiting, and the common notifiers (every borrow's end, every
    /// progress round of the progress thread) run on the data path: with
    /// this count they cost nothing when nobody waits (session 9: one
    /// `futex` per Send completion the bandwidth test checked).
    cv_waiters: AtomicUsize,
    pub(crate) epoll: Epoll,
    /// Wakes the progress thread out of its `epoll_wait`. Made only for
    /// a progress-thread context: a caller-driven one never rings it
    /// (nothing sleeps for it to wake), so it holds no descriptor for it
    /// (each DDP socket of the preload: one less).
    wake: Option<EventFd>,
    pub(crate) progress: Progress,
    pub(crate) busy_poll: Duration,
    pub(crate) linger: Duration,
    shutdown: AtomicBool,
    /// Sleeps of callers and the progress thread ([`Context::wait_stats`]).
    pub(crate) waits: WaitCounters,
}

impl Inner {
    /// The context's lock, counted. Always inlined: every call into the
    /// engine takes it (a busy poller's every spin), and the preload's
    /// build left it a call (the xsock example's inlined it).
    #[inline(always)]
    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        let mut st = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        st.locks += 1;
        st
    }

    /// [`Self::lock`] if the lock is free now, else `None` (an exit
    /// interrupted inside a call of its own thread, which may hold it).
    pub(crate) fn try_lock(&self) -> Option<MutexGuard<'_, State>> {
        let mut st = match self.state.try_lock() {
            Ok(st) => st,
            Err(TryLockError::Poisoned(p)) => p.into_inner(),
            Err(TryLockError::WouldBlock) => return None,
        };
        st.locks += 1;
        Some(st)
    }

    /// Waits on the context's condition variable (the lock is released
    /// meanwhile).
    pub(crate) fn wait_cv<'a>(
        &self,
        st: MutexGuard<'a, State>,
        d: Duration,
    ) -> MutexGuard<'a, State> {
        // Counted while the lock is held: a notifier that changed the
        // state under the lock after this thread checked it sees the
        // count (the lock orders the two), so no wake-up is lost.
        self.cv_waiters.fetch_add(1, Ordering::SeqCst);
        let (st, r) = self
            .cv
            .wait_timeout(st, d)
            .unwrap_or_else(PoisonError::into_inner);
        self.cv_waiters.fetch_sub(1, Ordering::SeqCst);
        self.waits.count(Sleep::Cv, r.timed_out());
        st
    }

    /// Wakes the threads in [`Inner::wait_cv`], if there are any. Call it
    /// after the change it announces was made under the lock (with the
    /// lock still held or already released).
    pub(crate) fn notify(&self) {
        if self.cv_waiters.load(Ordering::SeqCst) > 0 {
            self.cv.notify_all();
        }
    }

    /// Threads waiting in [`Inner::wait_cv`] now.
    #[cfg(test)]
    pub(crate) fn cv_waiters(&self) -> usize {
        self.cv_waiters.load(Ordering::SeqCst)
    }

    /// Caller-driven progress over every queue pair that may have work.
    pub(crate) fn progress_locked(&self, st: &mut State) -> bool {
        let mut changed = false;
        if st.live_qps() <= DIRECT_POLL_MAX {
            for qi in 0..st.qps.len() {
                if st.qps[qi].as_ref().is_some_and(|q| !q.is_done()) {
                    changed |= st.service(qi, &self.epoll);
                }
            }
            st.reap(&self.epoll);
        } else {
            st.watch_all(&self.epoll);
            let mut ready = Vec::new();
            if self.epoll.wait(&mut ready, Some(Duration::ZERO)).is_ok() {
                for r in ready {
                    if r.token != WAKE_TOKEN {
                        changed |= st.service(r.token as usize, &self.epoll);
                    }
                }
            }
            st.reap(&self.epoll);
        }
        changed
    }

    /// Transmit progress for one queue pair right after a post (deferred
    /// while an application closure writes region bytes).
    pub(crate) fn kick(&self, st: &mut State, qi: usize) {
        if !st.allowed().tx {
            return;
        }
        let State {
            reg,
            qps,
            cqs,
            watching,
            ..
        } = st;
        let epoll = watching.then_some(&self.epoll);
        let changed = match qps.get_mut(qi) {
            Some(Some(q)) => q.service_tx(qi as u64, reg, cqs, epoll),
            _ => false,
        };
        if changed && self.progress == Progress::Thread {
            self.notify();
        }
    }

    /// The last borrow of region bytes ended: make up the progress it held
    /// back (transmits of posts made meanwhile; receives are picked up by
    /// the next poll, or by the progress thread, woken here).
    pub(crate) fn borrows_ended(&self, st: &mut State) {
        if !std::mem::take(&mut st.deferred) {
            return;
        }
        for qi in 0..st.qps.len() {
            if st.qps[qi].as_ref().is_some_and(|q| !q.is_done()) {
                self.kick(st, qi);
            }
        }
        self.notify();
        if let Some(wake) = &self.wake {
            // The progress thread re-checks its sockets.
            wake.notify();
        }
    }

    /// Adds an established connection as a queue pair.
    pub(crate) fn add_qp(
        self: &Arc<Self>,
        conn: Connection,
        sock: std::net::TcpStream,
        events: Vec<Event>,
        early: Vec<u8>,
        send_cq: usize,
        recv_cq: usize,
    ) -> usize {
        // The socket is in blocking mode (as connect and accept leave it):
        // the driver's own reads and writes say MSG_DONTWAIT; only a parked
        // caller's read sleeps (see `Cq::wait`).
        let mut st = self.lock();
        let qi = match st.qps.iter().position(Option::is_none) {
            Some(i) => i,
            None => {
                st.qps.push(None);
                st.qps.len() - 1
            }
        };
        let mut slot = QpSlot::new(conn, sock, qi as u32, send_cq, recv_cq);
        slot.events.extend(events);
        slot.update_interest(qi as u64, st.watching.then_some(&self.epoll));
        let staged = !early.is_empty();
        if staged {
            slot.stage(&early, &mut st.rx_pool);
        }
        st.qps[qi] = Some(slot);
        if staged {
            // Consume them now: epoll will not report bytes already read.
            if st.service(qi, &self.epoll) && self.progress == Progress::Thread {
                self.notify();
            }
        } else {
            self.kick(&mut st, qi);
        }
        qi
    }

    fn run_thread(self: Arc<Self>) {
        let mut ready: Vec<Ready> = Vec::with_capacity(256);
        let mut lingering = false;
        while !self.shutdown.load(Ordering::Acquire) {
            ready.clear();
            let timeout = lingering.then_some(LINGER_TICK);
            if self.epoll.wait(&mut ready, timeout).is_err() {
                std::thread::sleep(Duration::from_millis(1));
                continue;
            }
            let woken_by = |r: &Ready| r.token != WAKE_TOKEN;
            self.waits.count(Sleep::Epoll, !ready.iter().any(woken_by));
            let mut changed = false;
            {
                let mut st = self.lock();
                // While an application closure holds region bytes, nothing
                // can be placed: sleep until it is done instead of spinning
                // on level-triggered readiness.
                while st.readers + st.writers > 0 && !self.shutdown.load(Ordering::Acquire) {
                    st = self.wait_cv(st, LINGER_TICK);
                }
                for r in &ready {
                    if r.token == WAKE_TOKEN {
                        if let Some(wake) = &self.wake {
                            wake.clear();
                        }
                    } else {
                        changed |= st.service(r.token as usize, &self.epoll);
                    }
                }
                st.reap(&self.epoll);
                lingering = st.detached > 0;
            }
            if changed {
                self.notify();
            }
        }
    }
}

/// What every handle holds: the context, and (progress-thread mode) the
/// thread, stopped when the last handle goes.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) inner: Arc<Inner>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Drop for Shared {
    fn drop(&mut self) {
        self.inner.shutdown.store(true, Ordering::Release);
        if let Some(wake) = &self.inner.wake {
            wake.notify();
        }
        let t = self
            .thread
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(t) = t {
            let _ = t.join();
        }
    }
}

/// A device context: the unit of progress. Owns the sockets, memory
/// registrations and completion queues of everything created from it.
///
/// Cloning gives another handle on the same context. Objects created from
/// a context keep it alive; its progress thread (if any) stops when the
/// last of them is dropped.
#[derive(Debug, Clone)]
pub struct Context {
    pub(crate) sh: Arc<Shared>,
}

impl Context {
    /// A context with the given progress mode and default options.
    pub fn new(progress: Progress) -> Result<Self> {
        Self::with_options(ContextOptions {
            progress,
            ..Default::default()
        })
    }

    /// How many times the context's lock has been taken so far, by any
    /// call on any of its handles and by its progress thread (a
    /// diagnostic of the work per operation, counted rather than timed:
    /// an uncontended take is cheap, but a data path that takes it four
    /// times per message where one call could report everything pays
    /// for all four).
    ///
    /// Takes the context's lock: never call it with that lock held (a
    /// callback run under it), where it would wait for itself.
    pub fn lock_count(&self) -> u64 {
        // Not through `Inner::lock`: this look is not counted.
        let st = self.sh.inner.state.lock();
        st.unwrap_or_else(PoisonError::into_inner).locks
    }

    /// A context with explicit options.
    pub fn with_options(opts: ContextOptions) -> Result<Self> {
        let epoll = Epoll::new().map_err(Error::sys("epoll_create1"))?;
        let wake = match opts.progress {
            Progress::Caller => None,
            Progress::Thread => {
                let wake = EventFd::new().map_err(Error::sys("eventfd"))?;
                epoll
                    .add(wake.as_raw_fd(), WAKE_TOKEN, sys::EP_IN)
                    .map_err(Error::sys("epoll_ctl"))?;
                Some(wake)
            }
        };
        let inner = Arc::new(Inner {
            state: Mutex::new(State {
                reg: Registry::new(),
                qps: Vec::new(),
                cqs: Vec::new(),
                rx_pool: RxPool::default(),
                detached: 0,
                watching: opts.progress == Progress::Thread,
                readers: 0,
                writers: 0,
                deferred: false,
                locks: 0,
                parked_sleeps: ParkedSleeps::default(),
            }),
            cv: Condvar::new(),
            cv_waiters: AtomicUsize::new(0),
            epoll,
            wake,
            progress: opts.progress,
            busy_poll: opts.busy_poll,
            linger: opts.linger,
            shutdown: AtomicBool::new(false),
            waits: WaitCounters::default(),
        });
        let thread = match opts.progress {
            Progress::Caller => None,
            Progress::Thread => {
                let i = Arc::clone(&inner);
                Some(
                    std::thread::Builder::new()
                        .name("warpsock-progress".into())
                        .spawn(move || i.run_thread())
                        .map_err(Error::sys("spawning the progress thread"))?,
                )
            }
        };
        Ok(Self {
            sh: Arc::new(Shared {
                inner,
                thread: Mutex::new(thread),
            }),
        })
    }

    /// The progress mode.
    pub fn progress_mode(&self) -> Progress {
        self.sh.inner.progress
    }

    /// How often this context's callers ([`crate::Cq::wait`]) and progress
    /// thread slept in the kernel, and how many of those sleeps ended with
    /// nothing to do (a diagnostic: wake-ups per MiB moved mean the same on
    /// a loaded machine; see also [`crate::Qp::io_stats`]). Takes the
    /// context's lock: not to be called with it held.
    pub fn wait_stats(&self) -> WaitStats {
        let inner = &self.sh.inner;
        // Not `Inner::lock`: a diagnostic's look is not a counted take
        // (`Self::lock_count`).
        let st = inner.state.lock().unwrap_or_else(PoisonError::into_inner);
        inner.waits.snapshot(&st.parked_sleeps)
    }

    /// Caller-driven mode: one non-blocking round of progress on every
    /// queue pair (receive and transmit). Returns whether anything
    /// completed. A no-op in progress-thread mode.
    pub fn progress(&self) -> bool {
        let inner = &self.sh.inner;
        if inner.progress != Progress::Caller {
            return false;
        }
        let mut st = inner.lock();
        inner.progress_locked(&mut st)
    }
}

#[cfg(test)]
impl Inner {
    /// The wake eventfd, if this context made one.
    pub(crate) fn wake_fd(&self) -> Option<std::os::fd::RawFd> {
        self.wake.as_ref().map(AsRawFd::as_raw_fd)
    }
}

#[cfg(test)]
impl Context {
    /// How many descriptors the context's epoll set watches (its
    /// `/proc/self/fdinfo` lists one `tfd:` line per registered fd).
    pub(crate) fn watched(&self) -> usize {
        let fd = self.sh.inner.epoll.as_raw_fd();
        std::fs::read_to_string(format!("/proc/self/fdinfo/{fd}"))
            .expect("fdinfo of the epoll fd")
            .lines()
            .filter(|l| l.starts_with("tfd:"))
            .count()
    }
}
