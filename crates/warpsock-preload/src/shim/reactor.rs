//! The progress thread: one per process, started with the first managed
//! socket that needs it. It owns an epoll instance over the descriptors the
//! socket kinds register (each under a token, with a [`Handler`] that is
//! told of its readiness) and a timer list (handlers with a deadline:
//! connection set-up timeouts, retry back-off, flush deadlines).
//!
//! Application threads register descriptors and change interest with
//! `epoll_ctl` directly (it is thread-safe); they wake the thread through an
//! eventfd only when a new timer must be taken into account.
//!
//! The reactor knows nothing of any socket kind: it calls handlers.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicPtr, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use libc::c_int;
use warpsock_engine::fds;

use super::sys;

/// What an epoll token stands for: told of readiness and timers, from the
/// progress thread (never while the reactor holds a lock).
pub(crate) trait Handler: Send + Sync {
    /// Readiness `events` (epoll bits) on the registered descriptor.
    fn on_ready(&self, reactor: &'static Reactor, events: u32);

    /// The next time [`Handler::on_timer`] should run (only asked of
    /// handlers on the timer list; `None`: no deadline now).
    fn deadline(&self) -> Option<Instant> {
        None
    }

    /// A deadline may have passed (`now` is the reactor's clock reading).
    /// Returns true once the handler needs no more timers.
    fn on_timer(&self, _reactor: &'static Reactor, _now: Instant) -> bool {
        true
    }

    /// Whether the handler holds data not yet handed to the kernel (exit
    /// and exec wait for that, bounded).
    fn pending(&self) -> bool {
        false
    }
}

type Reg = Arc<dyn Handler>;

const WAKE_TOKEN: u64 = 0;

/// The progress engine.
pub(crate) struct Reactor {
    /// The process that created the engine (and owns its connections).
    pid: libc::pid_t,
    epfd: c_int,
    wakefd: c_int,
    next_id: AtomicU64,
    regs: Mutex<HashMap<u64, Reg>>,
    timers: Mutex<HashMap<u64, Reg>>,
    /// What the thread's clock readings count from.
    epoch: Instant,
    /// When the thread will wake (ns after `epoch`): [`AWAKE`] while it
    /// handles events, [`SCANNING`] while it looks at the deadlines.
    wake_at: AtomicU64,
    /// `epoll_pwait2` (µs timeouts) is missing: `epoll_wait` (ms) instead.
    coarse: AtomicBool,
    /// When every timer handler was last asked (ns after `epoch`): those
    /// without a deadline due are asked once a second, so that finished
    /// ones leave the list.
    swept: AtomicU64,
}

/// How often every timer handler is asked, due or not.
const SWEEP: Duration = Duration::from_secs(1);

const AWAKE: u64 = 0;
const SCANNING: u64 = u64::MAX;

static ENGINE: AtomicPtr<Reactor> = AtomicPtr::new(std::ptr::null_mut());

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Wake-ups of the progress thread (each return from its wait).
static WAKEUPS: AtomicU64 = AtomicU64::new(0);

/// Events the progress thread's wait returned for a token with no handler
/// (deregistered). One is possible when an event in a batch closes another
/// that was in the same batch; a stream of them is a descriptor closed
/// while still in the epoll set (a file kept alive elsewhere, e.g. by a
/// program's `poll` on its number, stays in the set and reports `EPOLLHUP`
/// whatever the mask: the thread spins). [`Reactor::unwatch`] before every
/// close keeps it at a handful.
static STRAY: AtomicU64 = AtomicU64::new(0);

/// The reactor's counters, `(name, value)`, for the stats report.
pub(crate) fn counters() -> [(&'static str, u64); 2] {
    [
        ("reactor_wakeups", WAKEUPS.load(Ordering::Relaxed)),
        ("reactor_stray_events", STRAY.load(Ordering::Relaxed)),
    ]
}

/// Connection events and timers being handled right now (any thread).
static HANDLING: AtomicU64 = AtomicU64::new(0);

/// Counts a connection event or timer in progress: a connection that dies
/// in one stops counting as pending before its queued datagrams have gone
/// out by kernel UDP, and `busy` must cover that gap.
pub(crate) struct Handling;

impl Handling {
    pub(crate) fn enter() -> Self {
        HANDLING.fetch_add(1, Ordering::SeqCst);
        Self
    }
}

impl Drop for Handling {
    fn drop(&mut self) {
        HANDLING.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The process's engine, created (and its thread started) on first use.
/// Returns `None` if the kernel refused the epoll instance or the thread.
pub(crate) fn get() -> Option<&'static Reactor> {
    let p = ENGINE.load(Ordering::Acquire);
    if !p.is_null() {
        // SAFETY: a published engine is leaked and never freed.
        return Some(unsafe { &*p });
    }
    // SAFETY: plain syscalls creating new descriptors.
    let (epfd, wakefd) = unsafe {
        (
            fds::lift(libc::epoll_create1(libc::EPOLL_CLOEXEC)),
            fds::lift(libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK)),
        )
    };
    if epfd < 0 || wakefd < 0 {
        sys::close(epfd);
        sys::close(wakefd);
        return None;
    }
    let e = Box::new(Reactor {
        // SAFETY: getpid has no preconditions.
        pid: unsafe { libc::getpid() },
        epfd,
        wakefd,
        next_id: AtomicU64::new(1),
        regs: Mutex::new(HashMap::new()),
        timers: Mutex::new(HashMap::new()),
        epoch: Instant::now(),
        wake_at: AtomicU64::new(AWAKE),
        coarse: AtomicBool::new(false),
        swept: AtomicU64::new(0),
    });
    let mut ev = libc::epoll_event {
        events: libc::EPOLLIN as u32,
        u64: WAKE_TOKEN,
    };
    // SAFETY: registering our own eventfd with our own epoll instance.
    unsafe { super::real::epoll_ctl(epfd, libc::EPOLL_CTL_ADD, wakefd, &mut ev) };
    let raw = Box::into_raw(e);
    match ENGINE.compare_exchange(
        std::ptr::null_mut(),
        raw,
        Ordering::AcqRel,
        Ordering::Acquire,
    ) {
        Ok(_) => {
            // SAFETY: `raw` is now published and lives for the process.
            let eng: &'static Reactor = unsafe { &*raw };
            let spawned = sys::with_async_signals_blocked(|| {
                std::thread::Builder::new()
                    .name("warpsock-progress".into())
                    .spawn(move || eng.run())
            });
            if spawned.is_err() {
                return None;
            }
            Some(eng)
        }
        Err(other) => {
            // SAFETY: we lost the race; `raw` was never shared.
            let mine = unsafe { Box::from_raw(raw) };
            sys::close(mine.epfd);
            sys::close(mine.wakefd);
            // SAFETY: the winner's engine is leaked and never freed.
            Some(unsafe { &*other })
        }
    }
}

/// The progress thread's kernel id (0: none started). Kernel ids are
/// not reused while the thread lives: no other thread of the process
/// matches it. A forked child clears it ([`forget_after_fork`]): the
/// parent's thread is not the child's, and once it ends (the parent
/// exits) the kernel may give its id to one of the child's threads.
static THREAD: AtomicI32 = AtomicI32::new(0);

/// Whether the calling thread is the progress thread: a socket's last
/// reference may go there (`xsock::follow::Ready`), whose close must not
/// wait (`SO_LINGER`'s: every socket's progress would wait with it).
/// The engine must be this process's too ([`Reactor::is_owner`]): a child
/// made without the fork handlers (`_Fork`, `clone`, `syscall(SYS_fork)`)
/// keeps the parent's engine and thread id, which the kernel may give one
/// of its threads once the parent's thread ended (review r27-c item 6).
pub(crate) fn on_progress_thread() -> bool {
    let t = THREAD.load(Ordering::Acquire);
    // SAFETY: gettid has no preconditions.
    t != 0 && t == unsafe { libc::gettid() } && current().is_some_and(Reactor::is_owner)
}

/// The engine if one runs, without starting it.
pub(crate) fn current() -> Option<&'static Reactor> {
    let p = ENGINE.load(Ordering::Acquire);
    // SAFETY: a published engine is leaked and never freed.
    (!p.is_null()).then(|| unsafe { &*p })
}

/// In a forked child: forget the parent's engine (its thread does not exist
/// here). Its memory is leaked; a new one starts if the child offloads.
/// And its thread's id: kept, a thread of the child that the kernel gave
/// that id once the parent's thread ended passed for the progress thread,
/// and its `SO_LINGER` closes did not wait (review r26-b item 5).
pub(crate) fn forget_after_fork() {
    ENGINE.store(std::ptr::null_mut(), Ordering::Release);
    THREAD.store(0, Ordering::Release);
}

impl Reactor {
    /// Whether the calling process owns this engine: false in a vforked
    /// child (which shares the parent's memory, so the engine is still
    /// published there, but its thread and connections are the parent's)
    /// and in any child made without the fork handlers.
    pub(crate) fn is_owner(&self) -> bool {
        sys::getpid() == self.pid
    }

    /// A fresh token.
    pub(crate) fn new_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Adds `fd` to the epoll set under token `id`.
    pub(crate) fn register(&self, fd: c_int, id: u64, events: u32, reg: Reg) -> bool {
        lock(&self.regs).insert(id, reg);
        let mut ev = libc::epoll_event { events, u64: id };
        // SAFETY: epoll_ctl on our epoll instance with a valid event struct.
        let r = unsafe { super::real::epoll_ctl(self.epfd, libc::EPOLL_CTL_ADD, fd, &mut ev) };
        if r != 0 {
            lock(&self.regs).remove(&id);
        }
        r == 0
    }

    /// Records a token whose descriptor is added later with `add_fd`.
    pub(crate) fn register_token(&self, id: u64, reg: Reg) {
        lock(&self.regs).insert(id, reg);
    }

    /// Adds `fd` under an existing token (a connection's new socket).
    pub(crate) fn add_fd(&self, fd: c_int, id: u64, events: u32) -> bool {
        let mut ev = libc::epoll_event { events, u64: id };
        // SAFETY: as in `register`.
        unsafe { super::real::epoll_ctl(self.epfd, libc::EPOLL_CTL_ADD, fd, &mut ev) == 0 }
    }

    /// Changes the interest of a registered descriptor.
    pub(crate) fn modify(&self, fd: c_int, id: u64, events: u32) {
        let mut ev = libc::epoll_event { events, u64: id };
        // SAFETY: as in `register`.
        unsafe { super::real::epoll_ctl(self.epfd, libc::EPOLL_CTL_MOD, fd, &mut ev) };
    }

    /// Removes a token (and its descriptor, if given, from the epoll set).
    pub(crate) fn deregister(&self, id: u64, fd: Option<c_int>) {
        if let Some(fd) = fd {
            self.unwatch(fd);
        }
        lock(&self.regs).remove(&id);
    }

    /// Takes `fd` out of the epoll set; call it before closing a watched
    /// descriptor. `close` alone leaves it in the set while anything else
    /// holds the file: a program's `poll` holds every descriptor it waits
    /// on until it returns, and a blocking receive polls its connections
    /// that way. The set then keeps reporting the closed socket's
    /// `EPOLLHUP` (reported whatever the mask) under a token nobody
    /// handles, and the progress thread spins until that poll returns
    /// (seen: 20 s, a victim's whole `SO_RCVTIMEO`, at 100% CPU).
    pub(crate) fn unwatch(&self, fd: c_int) {
        let mut ev = libc::epoll_event { events: 0, u64: 0 };
        // SAFETY: as in `register`.
        unsafe { super::real::epoll_ctl(self.epfd, libc::EPOLL_CTL_DEL, fd, &mut ev) };
    }

    /// Whether the epoll set holds descriptor number `fd` under token `id`,
    /// as `/proc/self/fdinfo` lists it.
    #[cfg(test)]
    pub(crate) fn watches(&self, fd: c_int, id: u64) -> bool {
        let info =
            std::fs::read_to_string(format!("/proc/self/fdinfo/{}", self.epfd)).unwrap_or_default();
        let (tfd, data) = (format!("tfd: {fd:>8} "), format!(" data: {id:>16x} "));
        info.lines()
            .any(|l| l.starts_with(&tfd) && l.contains(&data))
    }

    /// Puts the handler of token `id` on the timer list (until its
    /// `on_timer` says it is done) and wakes the thread so it recomputes its
    /// sleep.
    pub(crate) fn add_timer(&self, id: u64, handler: Reg) {
        lock(&self.timers).entry(id).or_insert(handler);
        self.wake();
    }

    /// Puts the handler registered under token `id` on the timer list,
    /// under a key of its own (an entry of that handler being taken off
    /// the list as done meanwhile takes only itself off), and wakes the
    /// thread.
    pub(crate) fn add_timer_of(&self, id: u64) {
        let Some(h) = lock(&self.regs).get(&id).cloned() else {
            return;
        };
        self.add_timer(self.new_id(), h);
    }

    /// Makes sure the thread looks at its timers by `deadline` (a handler
    /// already on the timer list moved its deadline earlier): wakes it only
    /// if it sleeps past that.
    pub(crate) fn wake_by(&self, deadline: Instant) {
        let d = self.ns(deadline);
        let w = self.wake_at.load(Ordering::SeqCst);
        if w != AWAKE && w > d {
            self.wake();
        }
    }

    fn ns(&self, t: Instant) -> u64 {
        (t.saturating_duration_since(self.epoch).as_nanos() as u64).clamp(1, SCANNING - 1)
    }

    /// Waits for events at most `timeout` (`None`: until one comes), with
    /// microsecond precision where the kernel has `epoll_pwait2` (5.11).
    fn wait(&self, events: &mut [libc::epoll_event], timeout: Option<Duration>) -> c_int {
        if !self.coarse.load(Ordering::Relaxed) {
            let ts = timeout.map(sys::timespec);
            let tsp = ts
                .as_ref()
                .map_or(std::ptr::null(), |t| t as *const libc::timespec);
            // SAFETY: `events` is writable for its length; `tsp` is null or
            // a valid timespec; no signal mask.
            let n = unsafe {
                libc::syscall(
                    libc::SYS_epoll_pwait2,
                    self.epfd,
                    events.as_mut_ptr(),
                    events.len() as c_int,
                    tsp,
                    std::ptr::null::<libc::sigset_t>(),
                    0usize,
                )
            } as c_int;
            if n >= 0 || sys::errno() != libc::ENOSYS {
                return n;
            }
            self.coarse.store(true, Ordering::Relaxed);
        }
        let ms = timeout.map_or(-1, |d| {
            d.as_micros().div_ceil(1000).min(i32::MAX as u128) as c_int
        });
        // The raw `epoll_pwait`: libc's `epoll_wait` is a cancellation
        // point.
        warpsock_engine::rawsys::epoll_pwait(self.epfd, events, ms)
    }

    /// Wakes the progress thread.
    pub(crate) fn wake(&self) {
        let one: u64 = 1;
        // SAFETY: writing 8 bytes to our eventfd (raw: a program thread
        // wakes it inside its call, where libc's `write`, a cancellation
        // point, would act on a pending `pthread_cancel`).
        unsafe { sys::write_raw(self.wakefd, (&one as *const u64).cast(), 8) };
    }

    /// Whether any connection still holds datagrams not yet in the kernel.
    pub(crate) fn busy(&self) -> bool {
        let mut hs: Vec<Reg> = lock(&self.regs).values().cloned().collect();
        hs.extend(lock(&self.timers).values().cloned());
        hs.iter().any(|r| r.pending()) || HANDLING.load(Ordering::SeqCst) > 0
    }

    fn run(&'static self) {
        sys::no_cancel();
        // SAFETY: gettid has no preconditions.
        THREAD.store(unsafe { libc::gettid() }, Ordering::Release);
        let mut events = vec![libc::epoll_event { events: 0, u64: 0 }; 256];
        loop {
            // A deadline moved earlier while we scan is seen by the scan, or
            // its owner sees SCANNING and wakes us (`wake_by`).
            self.wake_at.store(SCANNING, Ordering::SeqCst);
            let timeout = self.next_timeout();
            let plan = timeout.map_or(SCANNING - 1, |d| self.ns(Instant::now() + d));
            self.wake_at.store(plan, Ordering::SeqCst);
            let n = self.wait(&mut events, timeout);
            self.wake_at.store(AWAKE, Ordering::SeqCst);
            WAKEUPS.fetch_add(1, Ordering::Relaxed);
            if n < 0 {
                if sys::errno() == libc::EINTR {
                    continue;
                }
                sys::sleep(Duration::from_millis(1));
                continue;
            }
            for ev in &events[..n as usize] {
                let (id, bits) = (ev.u64, ev.events);
                if id == WAKE_TOKEN {
                    let mut v: u64 = 0;
                    // SAFETY: reading 8 bytes from our eventfd into `v`.
                    unsafe { sys::read_raw(self.wakefd, (&mut v as *mut u64).cast(), 8) };
                    continue;
                }
                let reg = lock(&self.regs).get(&id).cloned();
                // Never let a bug unwind out of the thread's loop.
                if let Some(h) = reg {
                    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        h.on_ready(self, bits);
                    }));
                } else {
                    STRAY.fetch_add(1, Ordering::Relaxed);
                }
            }
            self.run_timers();
        }
    }

    /// How long to sleep: until the earliest deadline (at most a second,
    /// as a safety net), or until an event when there is none.
    ///
    /// The handlers are asked with the timer list unlocked: a `deadline`
    /// takes its socket's locks, and an application thread holding one of
    /// those may be adding a timer (a new connection under its socket's
    /// lock), which would wait for the list forever.
    fn next_timeout(&self) -> Option<Duration> {
        let list: Vec<Reg> = lock(&self.timers).values().cloned().collect();
        let now = Instant::now();
        let mut best: Option<Duration> = None;
        for h in &list {
            if let Some(d) = h.deadline() {
                let left = d.saturating_duration_since(now);
                best = Some(best.map_or(left, |b| b.min(left)));
            }
        }
        match best {
            None if list.is_empty() => None,
            None => Some(Duration::from_secs(1)),
            Some(d) => Some(d.min(Duration::from_secs(1))),
        }
    }

    fn run_timers(&'static self) {
        #[cfg(feature = "test-hooks")]
        if let Some(d) = super::hooks::timer_delay() {
            // Late while any handler has a deadline (it may not be on the
            // list yet: a connection's first event can come before its
            // `add_timer`).
            let regs: Vec<Reg> = lock(&self.regs).values().cloned().collect();
            if regs.iter().any(|r| r.deadline().is_some()) {
                std::thread::sleep(d);
            }
        }
        let list: Vec<(u64, Reg)> = lock(&self.timers)
            .iter()
            .map(|(k, v)| (*k, v.clone()))
            .collect();
        if list.is_empty() {
            return;
        }
        let now = Instant::now();
        let sweep = self.ns(now) >= self.swept.load(Ordering::Relaxed) + SWEEP.as_nanos() as u64;
        if sweep {
            self.swept.store(self.ns(now), Ordering::Relaxed);
        }
        let mut done = Vec::new();
        for (id, h) in &list {
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                // Only what is due (the reactor wakes for every deadline and
                // event; most handlers have nothing to do then).
                if (sweep || h.deadline().is_some_and(|d| d <= now)) && h.on_timer(self, now) {
                    done.push(*id);
                }
            }));
        }
        if !done.is_empty() {
            let mut t = lock(&self.timers);
            for id in done {
                t.remove(&id);
            }
        }
    }
}

/// Waits at most `bound` until no handler holds data not yet handed to the
/// kernel (before exit and exec). Only the process that owns the reactor
/// waits: a vforked child sees the parent's reactor (shared memory) but
/// must neither block the parent nor touch its state. Returns whether there
/// was anything to wait for.
pub(crate) fn linger(bound: Duration) -> bool {
    let Some(eng) = current() else {
        return false;
    };
    if !eng.is_owner() || !eng.busy() {
        return false;
    }
    let start = Instant::now();
    while eng.busy() && start.elapsed() < bound {
        sys::sleep(Duration::from_millis(1));
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc::{channel, Sender};

    /// A forked child's thread whose id is the parent's progress thread's
    /// (the kernel reuses ids once a thread ended) is not the progress
    /// thread after the child's fork handler: staged in a child whose
    /// only thread takes the id as the recorded one.
    #[test]
    fn a_forked_child_forgets_the_progress_threads_id() {
        // SAFETY: the child only stores and loads atomics, then `_exit`s.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
        if pid == 0 {
            // SAFETY: gettid has no preconditions.
            THREAD.store(unsafe { libc::gettid() }, Ordering::Release);
            // (The id alone: the engine, if any, is the parent's, which
            // `on_progress_thread` also looks at since review r27-c item
            // 6.)
            forget_after_fork();
            let ok = THREAD.load(Ordering::Acquire) == 0 && !on_progress_thread();
            // SAFETY: ends the child, no handler or destructor run.
            unsafe { libc::_exit(if ok { 0 } else { 1 }) };
        }
        let mut st = 0;
        // SAFETY: waiting for our own child.
        assert_eq!(unsafe { libc::waitpid(pid, &mut st, 0) }, pid);
        assert!(
            libc::WIFEXITED(st) && libc::WEXITSTATUS(st) == 0,
            "the child still took itself for the progress thread ({st:#x})"
        );
    }

    /// A child made without the fork handlers (as by `_Fork`) keeps the
    /// parent's engine and progress thread's id: one of its threads that
    /// the kernel gave that id is still not the progress thread (the
    /// engine is not the child's). Staged in a forked child whose only
    /// thread takes the id as the recorded one, with no
    /// `forget_after_fork`.
    #[test]
    fn a_child_without_fork_handlers_is_not_the_progress_thread() {
        let eng = get().expect("the progress thread");
        assert!(eng.is_owner());
        // SAFETY: the child only stores and loads atomics and calls
        // getpid/gettid, then `_exit`s.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
        if pid == 0 {
            // SAFETY: gettid has no preconditions.
            THREAD.store(unsafe { libc::gettid() }, Ordering::Release);
            let ok = current().is_some() && !on_progress_thread();
            // SAFETY: ends the child, no handler or destructor run.
            unsafe { libc::_exit(if ok { 0 } else { 1 }) };
        }
        let mut st = 0;
        // SAFETY: waiting for our own child.
        assert_eq!(unsafe { libc::waitpid(pid, &mut st, 0) }, pid);
        assert!(
            libc::WIFEXITED(st) && libc::WEXITSTATUS(st) == 0,
            "the child took itself for the progress thread ({st:#x})"
        );
    }

    /// A timer handler whose `deadline` takes a lock of its own (as a
    /// socket's does) and says when it first tried after `skip` answers.
    struct Locking {
        lock: Arc<Mutex<()>>,
        skip: AtomicU64,
        asked: Mutex<Option<Sender<()>>>,
    }

    impl Handler for Locking {
        fn on_ready(&self, _: &'static Reactor, _: u32) {}

        fn deadline(&self) -> Option<Instant> {
            let skipped = self
                .skip
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok();
            if skipped {
                return Some(Instant::now() + Duration::from_secs(60));
            }
            if let Some(tx) = lock(&self.asked).take() {
                let _ = tx.send(());
            }
            let _g = lock(&self.lock);
            Some(Instant::now() + Duration::from_secs(60))
        }

        fn on_timer(&self, _: &'static Reactor, _: Instant) -> bool {
            let _g = lock(&self.lock);
            false
        }
    }

    /// The progress thread asks a handler for its deadline while an
    /// application thread holds that handler's lock and adds a timer (a new
    /// connection under its socket's lock): the timer is added (the thread
    /// asked with the timer list unlocked) instead of both waiting forever.
    #[test]
    fn adding_a_timer_under_a_lock_a_deadline_wants_does_not_deadlock() {
        let eng = get().expect("the progress thread");
        // Asleep with no timer (so the order of the questions below holds).
        let idle = Instant::now() + Duration::from_secs(30);
        while eng.wake_at.load(Ordering::SeqCst) != SCANNING - 1 {
            assert!(Instant::now() < idle, "the progress thread never slept");
            std::thread::yield_now();
        }
        // No sweep while the test runs: a sweep calls `on_timer` unasked,
        // which waits for `held` (the thread would wait there, never
        // asking the deadline), and one is due whenever the thread has
        // run a `SWEEP` since its last (started by an earlier test). Put
        // back when the test ends, failed or not.
        struct Unswept(&'static Reactor, u64);
        impl Drop for Unswept {
            fn drop(&mut self) {
                self.0.swept.store(self.1, Ordering::Relaxed);
            }
        }
        let later = eng.ns(Instant::now() + Duration::from_secs(3600));
        let _unswept = Unswept(eng, eng.swept.swap(later, Ordering::Relaxed));
        let held = Arc::new(Mutex::new(()));
        let (asked_tx, asked) = channel();
        let g = lock(&held);
        // Woken by `add_timer`, the thread asks once whether the timer is
        // due, then for the deadline it sleeps until: that second question
        // is the one asked while scanning the list.
        eng.add_timer(
            eng.new_id(),
            Arc::new(Locking {
                lock: held.clone(),
                skip: AtomicU64::new(1),
                asked: Mutex::new(Some(asked_tx)),
            }),
        );
        // The progress thread is now inside `deadline`, waiting for `held`.
        asked
            .recv_timeout(Duration::from_secs(30))
            .expect("the progress thread asks for the deadline");
        let (done_tx, done) = channel();
        let other = Arc::new(Locking {
            lock: Arc::new(Mutex::new(())),
            skip: AtomicU64::new(0),
            asked: Mutex::new(None),
        });
        std::thread::spawn(move || {
            eng.add_timer(eng.new_id(), other);
            let _ = done_tx.send(());
        });
        let added = done.recv_timeout(Duration::from_secs(30)).is_ok();
        drop(g);
        assert!(
            added,
            "add_timer waited for the timer list the progress thread held"
        );
    }
}
