//! The progress thread: one per process, started with the first offloaded
//! socket. It owns an epoll instance over every hidden kernel UDP socket
//! (one-shot, to bridge their readiness to the application's descriptor),
//! every TCP listener and every offload connection, and a timer list for
//! connection attempts (connect and hello timeouts, retry back-off).
//!
//! Application threads register descriptors and change interest with
//! `epoll_ctl` directly (it is thread-safe); they wake the thread through an
//! eventfd only when a new timer must be taken into account.

use std::collections::HashMap;
use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use libc::c_int;

use crate::real;
use crate::sock::{Conn, Sock};

/// What an epoll token stands for.
#[derive(Clone)]
pub(crate) enum Reg {
    /// A hidden kernel UDP socket (one-shot readiness).
    Udp(Arc<Sock>),
    /// A TCP listener for a bound UDP port.
    Listener(Arc<Sock>),
    /// An offload connection and the socket it feeds.
    Conn(Arc<Sock>, Arc<Conn>),
}

const WAKE_TOKEN: u64 = 0;

/// The progress engine.
pub(crate) struct Engine {
    /// The process that created the engine (and owns its connections).
    pid: libc::pid_t,
    epfd: c_int,
    wakefd: c_int,
    next_id: AtomicU64,
    regs: Mutex<HashMap<u64, Reg>>,
    timers: Mutex<Vec<(Arc<Sock>, Arc<Conn>)>>,
}

static ENGINE: AtomicPtr<Engine> = AtomicPtr::new(std::ptr::null_mut());

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
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
pub(crate) fn get() -> Option<&'static Engine> {
    let p = ENGINE.load(Ordering::Acquire);
    if !p.is_null() {
        // SAFETY: a published engine is leaked and never freed.
        return Some(unsafe { &*p });
    }
    // SAFETY: plain syscalls creating new descriptors.
    let (epfd, wakefd) = unsafe {
        (
            libc::epoll_create1(libc::EPOLL_CLOEXEC),
            libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK),
        )
    };
    if epfd < 0 || wakefd < 0 {
        crate::sys::close(epfd);
        crate::sys::close(wakefd);
        return None;
    }
    let e = Box::new(Engine {
        // SAFETY: getpid has no preconditions.
        pid: unsafe { libc::getpid() },
        epfd,
        wakefd,
        next_id: AtomicU64::new(1),
        regs: Mutex::new(HashMap::new()),
        timers: Mutex::new(Vec::new()),
    });
    let mut ev = libc::epoll_event {
        events: libc::EPOLLIN as u32,
        u64: WAKE_TOKEN,
    };
    // SAFETY: registering our own eventfd with our own epoll instance.
    unsafe { libc::epoll_ctl(epfd, libc::EPOLL_CTL_ADD, wakefd, &mut ev) };
    let raw = Box::into_raw(e);
    match ENGINE.compare_exchange(
        std::ptr::null_mut(),
        raw,
        Ordering::AcqRel,
        Ordering::Acquire,
    ) {
        Ok(_) => {
            // SAFETY: `raw` is now published and lives for the process.
            let eng: &'static Engine = unsafe { &*raw };
            let spawned = std::thread::Builder::new()
                .name("warpsock-progress".into())
                .spawn(move || eng.run());
            if spawned.is_err() {
                return None;
            }
            Some(eng)
        }
        Err(other) => {
            // SAFETY: we lost the race; `raw` was never shared.
            let mine = unsafe { Box::from_raw(raw) };
            crate::sys::close(mine.epfd);
            crate::sys::close(mine.wakefd);
            // SAFETY: the winner's engine is leaked and never freed.
            Some(unsafe { &*other })
        }
    }
}

/// The engine if one runs, without starting it.
pub(crate) fn current() -> Option<&'static Engine> {
    let p = ENGINE.load(Ordering::Acquire);
    // SAFETY: a published engine is leaked and never freed.
    (!p.is_null()).then(|| unsafe { &*p })
}

/// In a forked child: forget the parent's engine (its thread does not exist
/// here). Its memory is leaked; a new one starts if the child offloads.
pub(crate) fn forget_after_fork() {
    ENGINE.store(std::ptr::null_mut(), Ordering::Release);
}

impl Engine {
    /// Whether the calling process owns this engine: false in a vforked
    /// child (which shares the parent's memory, so the engine is still
    /// published there, but its thread and connections are the parent's)
    /// and in any child made without the fork handlers.
    pub(crate) fn is_owner(&self) -> bool {
        // SAFETY: getpid has no preconditions (not cached by glibc >= 2.25).
        unsafe { libc::getpid() == self.pid }
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
        let r = unsafe { libc::epoll_ctl(self.epfd, libc::EPOLL_CTL_ADD, fd, &mut ev) };
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
        unsafe { libc::epoll_ctl(self.epfd, libc::EPOLL_CTL_ADD, fd, &mut ev) == 0 }
    }

    /// Changes the interest of a registered descriptor.
    pub(crate) fn modify(&self, fd: c_int, id: u64, events: u32) {
        let mut ev = libc::epoll_event { events, u64: id };
        // SAFETY: as in `register`.
        unsafe { libc::epoll_ctl(self.epfd, libc::EPOLL_CTL_MOD, fd, &mut ev) };
    }

    /// Removes a token (and its descriptor, if given, from the epoll set).
    pub(crate) fn deregister(&self, id: u64, fd: Option<c_int>) {
        if let Some(fd) = fd {
            let mut ev = libc::epoll_event { events: 0, u64: 0 };
            // SAFETY: as in `register`.
            unsafe { libc::epoll_ctl(self.epfd, libc::EPOLL_CTL_DEL, fd, &mut ev) };
        }
        lock(&self.regs).remove(&id);
    }

    /// Puts a connection on the timer list and wakes the thread so it
    /// recomputes its sleep.
    pub(crate) fn add_timer(&self, sock: &Arc<Sock>, conn: &Arc<Conn>) {
        {
            let mut t = lock(&self.timers);
            if !t.iter().any(|(_, c)| Arc::ptr_eq(c, conn)) {
                t.push((sock.clone(), conn.clone()));
            }
        }
        self.wake();
    }

    /// Wakes the progress thread.
    pub(crate) fn wake(&self) {
        let one: u64 = 1;
        // SAFETY: writing 8 bytes to our eventfd.
        unsafe { real::write(self.wakefd, (&one as *const u64).cast(), 8) };
    }

    /// Whether any connection still holds datagrams not yet in the kernel.
    pub(crate) fn busy(&self) -> bool {
        let regs: Vec<Reg> = lock(&self.regs).values().cloned().collect();
        regs.iter()
            .any(|r| matches!(r, Reg::Conn(_, c) if c.has_pending()))
            || HANDLING.load(Ordering::SeqCst) > 0
    }

    fn run(&'static self) {
        let mut events = vec![libc::epoll_event { events: 0, u64: 0 }; 256];
        loop {
            let timeout = self.next_timeout();
            // SAFETY: `events` is a writable array of the given length.
            let n = unsafe {
                libc::epoll_wait(
                    self.epfd,
                    events.as_mut_ptr(),
                    events.len() as c_int,
                    timeout,
                )
            };
            if n < 0 {
                if crate::sys::errno() == libc::EINTR {
                    continue;
                }
                std::thread::sleep(Duration::from_millis(1));
                continue;
            }
            for ev in &events[..n as usize] {
                let (id, bits) = (ev.u64, ev.events);
                if id == WAKE_TOKEN {
                    let mut v: u64 = 0;
                    // SAFETY: reading 8 bytes from our eventfd into `v`.
                    unsafe { real::read(self.wakefd, (&mut v as *mut u64).cast(), 8) };
                    continue;
                }
                let reg = lock(&self.regs).get(&id).cloned();
                // Never let a bug unwind out of the thread's loop.
                let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| match reg {
                    Some(Reg::Udp(s)) => s.on_udp_ready(),
                    Some(Reg::Listener(s)) => s.on_accept(self),
                    Some(Reg::Conn(s, c)) => c.on_event(self, &s, bits),
                    None => {}
                }));
            }
            self.run_timers();
        }
    }

    fn next_timeout(&self) -> c_int {
        let t = lock(&self.timers);
        let now = Instant::now();
        let mut best: Option<Duration> = None;
        for (_, c) in t.iter() {
            if let Some(d) = c.deadline() {
                let left = d.saturating_duration_since(now);
                best = Some(best.map_or(left, |b| b.min(left)));
            }
        }
        match best {
            None if t.is_empty() => -1,
            None => 100,
            Some(d) => (d.as_micros().div_ceil(1000)).min(1000) as c_int,
        }
    }

    fn run_timers(&'static self) {
        if let Some(d) = crate::config::get().test_timer_delay {
            // Late while any connection is being set up (it may not be on
            // the list yet: its first event can come before `add_timer`).
            let regs: Vec<Reg> = lock(&self.regs).values().cloned().collect();
            if regs
                .iter()
                .any(|r| matches!(r, Reg::Conn(_, c) if c.deadline().is_some()))
            {
                std::thread::sleep(d);
            }
        }
        let list: Vec<(Arc<Sock>, Arc<Conn>)> = lock(&self.timers).clone();
        if list.is_empty() {
            return;
        }
        let now = Instant::now();
        let mut done = Vec::new();
        for (s, c) in &list {
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                if c.on_timer(self, s, now) {
                    done.push(c.id);
                }
            }));
        }
        if !done.is_empty() {
            lock(&self.timers).retain(|(_, c)| !done.contains(&c.id));
        }
    }
}
