//! Readiness for managed sockets: the doorbell pair.
//!
//! The descriptor number the program holds is one end of an AF_UNIX stream
//! socketpair ([`Doorbell::app`]). Whoever makes data available to the
//! program (the progress thread, or a receive call that read more than it
//! returns) writes a doorbell byte to the other end ([`Doorbell::ring`]); a
//! receive call that finds nothing left drains them ([`Doorbell::drain`]). So
//! poll, ppoll, select, pselect and epoll (level and edge triggered: one
//! wake-up per rung batch) work on the program's own descriptor set,
//! unchanged. The count of bytes outstanding is kept by the caller, under
//! the lock that also guards what the bells announce, so that a drain never
//! races a ring.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use libc::c_int;
use warpsock_engine::fds;

use super::{real, sys};

/// Forks the process made, counted as each ends ([`fork_end`]): a doorbell
/// made before one may have its library end held by a child too
/// ([`Doorbell::fail`]).
static FORKS: AtomicU64 = AtomicU64::new(0);

/// Forks under way: counted in the atfork prepare handler, before the
/// child's copy of the descriptors ([`fork_begin`]), until the parent's
/// (or the child's) handler ([`fork_end`]). [`FORKS`] alone moves only
/// after the copy, so a `fail` between the two saw nothing (review r25-c
/// item 5).
static FORKING: AtomicU64 = AtomicU64::new(0);

/// [`Doorbell::fail`]s between their look at the forks and their `dup3`
/// over the library's end ([`Failing`]): a fork waits for them
/// ([`fork_begin`]).
static FAILING: AtomicU64 = AtomicU64::new(0);

/// Forks that went on with a `fail` possibly in its stretch, not waited
/// for ([`fork_begin`]: its own thread's, or past [`FORK_WAIT_BOUND`]):
/// such a `fail` sees the count move by its `dup3` and falls back to
/// shutting the program's end down ([`Doorbell::fail`]).
static UNWAITED: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// This thread's [`Failing`] stretches under way: more than one if a
    /// signal handler's `fail` runs over one (a fault signal is not
    /// blocked there). A fork from this thread (a handler's) does not
    /// wait for them: they cannot go on until it returns.
    static STRETCHES: Cell<u64> = const { Cell::new(0) };
}

/// How long a fork waits at most for the `fail`s in their stretch: a few
/// non-blocking system calls each, unless their thread is stopped or
/// left the stretch without its drop (a fault handler's `siglongjmp` or
/// `pthread_exit`, a seccomp kill of the thread; review r27-a item 3).
/// Such a stretch left unended stays counted in [`FAILING`] for the
/// process's life: every later fork of any thread but its own waits this
/// bound, 100 ms each (review r27-c item 7).
const FORK_WAIT_BOUND: Duration = Duration::from_millis(100);

/// The atfork prepare handler: a fork begins; its copy of the descriptors
/// is still to come. It waits for the `fail`s that looked before it
/// counted ([`Failing`]), other than its own thread's ([`STRETCHES`]):
/// none of them then holds the library's end between its look and its
/// `dup3` when the copy is made. Those are a few non-blocking system
/// calls, on a thread whose asynchronous signals are blocked, and they
/// take no lock: no deadlock with the locks the other prepare handlers
/// hold. The wait is bounded ([`FORK_WAIT_BOUND`]): a fault signal's
/// handler can fork over its own thread's stretch, or leave it without
/// its count given back. A fork that goes on with a `fail` possibly in
/// its stretch is counted ([`UNWAITED`]): that `fail` falls back to
/// shutting the program's end down.
pub(crate) fn fork_begin() {
    FORKING.fetch_add(1, Ordering::SeqCst);
    let mine = STRETCHES.with(Cell::get);
    let mut since = None;
    let mut round = 0;
    while FAILING.load(Ordering::SeqCst) > mine {
        #[cfg(test)]
        tests::hook(&tests::FORK_WAITS);
        if since.get_or_insert_with(Instant::now).elapsed() >= FORK_WAIT_BOUND {
            break;
        }
        sys::pause(round);
        round = round.saturating_add(1);
    }
    if FAILING.load(Ordering::SeqCst) > 0 {
        UNWAITED.fetch_add(1, Ordering::SeqCst);
    }
}

/// The atfork parent handler: the fork's copy is made (the child holds
/// every descriptor made before it, the parent every one the child
/// holds). Counted before the fork stops counting as under way.
pub(crate) fn fork_end() {
    FORKS.fetch_add(1, Ordering::SeqCst);
    FORKING.fetch_sub(1, Ordering::SeqCst);
}

/// The atfork child handler: as [`fork_end`], the child's only thread the
/// one that forked. [`FAILING`] starts from that thread's own stretches
/// ([`STRETCHES`]: a handler's fork over one, whose drop comes after the
/// handler returns): a `fail` of another thread may have counted itself
/// (and been about to back off, [`Failing::enter`]) when the copy was
/// made; that thread is not in the child, and the child's next fork would
/// wait for it. [`FORKING`] starts from none: glibc 2.36 runs the prepare
/// handlers with its `atfork_lock` released, so another thread's fork
/// may have counted itself before this one's copy, and the child saw a
/// fork under way for ever (every failure a hang-up only, without
/// `POLLERR`; review r27-a item 5).
pub(crate) fn fork_end_child() {
    FAILING.store(STRETCHES.with(Cell::get), Ordering::SeqCst);
    FORKS.fetch_add(1, Ordering::SeqCst);
    FORKING.store(0, Ordering::SeqCst);
}

/// A [`Doorbell::fail`]'s stretch from its look at the forks to its
/// `dup3`, counted in [`FAILING`]. The count comes before the look and a
/// fork's [`FORKING`] before its look at [`FAILING`] (all `SeqCst`), so
/// of a `fail` and a fork at least one sees the other: the `fail` sees the
/// fork under way (and hangs up only), or the fork waits for the `fail`
/// to have made its `dup3` before it copies the descriptors (review r26-a
/// item 5).
///
/// Counted in [`FAILING`] first, then in this thread's [`STRETCHES`],
/// and given back in the other order: a fork from a signal handler of
/// this thread between the two counts (or the two drops) waits for this
/// `fail` as another thread's, up to the bound, and never sees a stretch
/// of its own thread that [`FAILING`] does not count (it would then wait
/// for one `fail` of another thread too few).
struct Failing {
    /// [`UNWAITED`] at the count.
    unwaited: u64,
}

impl Failing {
    /// Counts a `fail`; `None` (not counted) if a fork may have copied the
    /// pair made when [`FORKS`] was `before` ([`forked_since`]).
    fn enter(before: u64) -> Option<Self> {
        FAILING.fetch_add(1, Ordering::SeqCst);
        STRETCHES.with(|n| n.set(n.get() + 1));
        let me = Self {
            unwaited: UNWAITED.load(Ordering::SeqCst),
        };
        (!forked_since(before)).then_some(me)
    }

    /// Whether a fork went on since the count without waiting for this
    /// stretch ([`UNWAITED`] moved): its child may hold the library's
    /// end with the byte. A fork that moved it before the count's load of
    /// [`UNWAITED`] was under way before the look at the forks that
    /// follows (it counts itself first), so that look saw it and there is
    /// no stretch; one that moves it after this call's load copies the
    /// descriptors after the `dup3`.
    fn unwaited_since(&self) -> bool {
        UNWAITED.load(Ordering::SeqCst) != self.unwaited
    }
}

impl Drop for Failing {
    /// Saturating, as [`STRETCHES`]: a fault handler's fork between the
    /// two counts in [`Self::enter`], or between the two drops here,
    /// starts its child with [`FAILING`] at this thread's stretches and
    /// one decrement still to come; a plain `fetch_sub` wrapped it to
    /// `u64::MAX`, and every fork of that child waited its whole bound
    /// (review r27-c item 7).
    fn drop(&mut self) {
        STRETCHES.with(|n| n.set(n.get().saturating_sub(1)));
        let _ = FAILING.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |v| {
            Some(v.saturating_sub(1))
        });
    }
}

/// Whether a fork may have copied a descriptor made when [`FORKS`] was
/// `before`: one is under way, or one ended since. Loads in this order:
/// a fork that ends between them is seen by the second.
fn forked_since(before: u64) -> bool {
    FORKING.load(Ordering::SeqCst) > 0 || FORKS.load(Ordering::SeqCst) != before
}

/// Doorbell bytes outstanding at most: the descriptor is readable anyway,
/// and below this every arrival writes one, so edge-triggered waiters wake.
pub(crate) const MAX_BELLS: usize = 4096;

/// The two ends of a doorbell pair.
pub(crate) struct Doorbell {
    /// The end the program's descriptor number is made to name (our own
    /// handle on it stays open as long as the socket lives).
    pub(crate) app: c_int,
    /// The end bells are written to (non-blocking).
    tx: c_int,
    /// [`FORKS`] before the pair was made.
    forks: u64,
}

impl Doorbell {
    /// A new pair; the program's end is non-blocking if `nonblocking`.
    pub(crate) fn new(nonblocking: bool) -> Result<Self, c_int> {
        // Read before the pair is made: a fork that may copy the pair ends
        // after this (its `fork_end` counts after its copy), so its count
        // is not in it.
        let forks = FORKS.load(Ordering::SeqCst);
        let mut sv = [-1; 2];
        // Both ends made non-blocking by the one call (a connection makes
        // up to three pairs: four `fcntl`s each saved); the program's end
        // made blocking after, if asked. Its flags are known: `O_RDWR`.
        // SAFETY: socketpair writes two descriptors into `sv`.
        if unsafe {
            libc::socketpair(
                libc::AF_UNIX,
                libc::SOCK_STREAM | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
                0,
                sv.as_mut_ptr(),
            )
        } != 0
        {
            return Err(sys::errno());
        }
        // SAFETY: F_SETFL on the pair just made; no pointers.
        if !nonblocking && unsafe { real::fcntl(sv[0], libc::F_SETFL, libc::O_RDWR as usize) } < 0 {
            let e = sys::errno();
            sys::close(sv[0]);
            sys::close(sv[1]);
            return Err(e);
        }
        // Both out of the program's numbers (`warpsock_engine::fds`): the
        // program's own number is made to name `app` later (a `dup3`).
        Ok(Self {
            app: fds::lift(sv[0]),
            tx: fds::lift(sv[1]),
            forks,
        })
    }

    /// Writes one bell unless `*count` reached [`MAX_BELLS`]; counts it.
    /// Returns whether a byte was written.
    pub(crate) fn ring(&self, count: &mut usize) -> bool {
        if *count >= MAX_BELLS {
            return false;
        }
        // SAFETY: a one-byte write to our own nonblocking socket.
        let r = unsafe {
            sys::send_raw(
                self.tx,
                b"!".as_ptr(),
                1,
                libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
            )
        };
        if r == 1 {
            *count += 1;
        }
        r == 1
    }

    /// Reads every outstanding bell; `*count` becomes 0.
    pub(crate) fn drain(&self, count: &mut usize) {
        let mut buf = [0u8; 512];
        loop {
            // SAFETY: reading into a local buffer from our own socket.
            let r = unsafe { sys::recv_dontwait(self.app, buf.as_mut_ptr(), buf.len()) };
            if r <= 0 {
                break;
            }
        }
        *count = 0;
    }
}

impl Doorbell {
    /// Makes the program's end report (`on`) or not report `POLLOUT`: a
    /// socket whose sends would block fills the program end's send buffer
    /// with filler bytes (read back out here, never delivered), so its
    /// poll/select/epoll wait for writability like a full TCP socket's.
    /// Returns whether the state changed.
    pub(crate) fn set_writable(&self, on: bool) -> bool {
        let mut buf = [0u8; 4096];
        if on {
            let mut any = false;
            loop {
                // SAFETY: reading into a local buffer from our own socket.
                let r = unsafe { sys::recv_dontwait(self.tx, buf.as_mut_ptr(), buf.len()) };
                if r <= 0 {
                    return any;
                }
                any = true;
            }
        }
        let mut any = false;
        loop {
            // SAFETY: a write from a local buffer to our own socket.
            let r = unsafe {
                sys::send_raw(
                    self.app,
                    buf.as_ptr(),
                    buf.len(),
                    libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
                )
            };
            if r <= 0 {
                return any;
            }
            any = true;
        }
    }

    /// The peer ended its stream: the program's end reports `POLLRDHUP`
    /// and `POLLIN` from now on (AF_UNIX's `RCV_SHUTDOWN`), as a TCP
    /// socket after the peer's FIN, with a wake-up (an edge, a `SIGIO`) of
    /// its own. No bell can be rung after this.
    pub(crate) fn shut_reading(&self) {
        // SAFETY: shutting down our own socket.
        unsafe { real::shutdown(self.tx, libc::SHUT_WR) };
    }

    /// The socket is finished both ways: the program's end reports
    /// `POLLHUP` (and `POLLIN`, `POLLRDHUP`).
    ///
    /// A byte from the program's end is left unread in the library's end
    /// first: a failure after the hang-up (a reset drawn by bytes that
    /// came after a `shutdown(SHUT_RDWR)`) still shows `POLLERR` through
    /// [`Self::fail`]'s release, which needs an unread byte there and can
    /// no longer send one (the library's end is shut for reading). A
    /// release without a failure — the library's end closed after the
    /// program's ([`Drop`]) — reaches no program descriptor.
    pub(crate) fn hang_up(&self) {
        // SAFETY: a one-byte write to our own nonblocking socket (it may
        // fail: the peer shut already, or a write gate's filler fills
        // the buffer, which is unread too); shutting down our own socket.
        unsafe {
            sys::send_raw(
                self.app,
                b"!".as_ptr(),
                1,
                libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
            );
            real::shutdown(self.tx, libc::SHUT_RDWR);
        }
    }

    /// The connection failed, its error pending: the program's end reports
    /// `POLLERR` beside the hang-up ([`Self::hang_up`]'s `POLLHUP`,
    /// `POLLIN`, `POLLRDHUP`, and `POLLOUT`), as Linux's `tcp_poll` shows a
    /// pending `sk_err` — in one wake-up, so an edge-triggered `epoll`
    /// gets one edge with all of it, as TCP's reset gives. The library's
    /// end is released with a byte the program's end sent it unread: AF_UNIX's
    /// `unix_release_sock` then shuts its peer both ways and sets its
    /// `sk_err` (`ECONNRESET`, never read as such: the program's
    /// `SO_ERROR` is the library's) until [`Self::clear_error`] reads it.
    /// The descriptor number stays, on a socket whose peer is gone (a ring
    /// fails, a read of it ends). No bell rings and none is drained after
    /// this (a drain's read of the program's end would take `sk_err`).
    ///
    /// A forked child may hold a copy of the library's end (the pair was
    /// made before a fork): the release would not reach the socket, and a
    /// later one, the child's exit, would set `sk_err` after the program
    /// took the error. There, the hang-up alone, as before (no `POLLERR`).
    ///
    /// A fork racing this call (this runs on the progress thread or in a
    /// program's call, not under the descriptor table's lock that
    /// `fork_prepare` takes) does not copy the descriptors between the
    /// look at the forks and the `dup3`: the stretch is counted
    /// ([`Failing`]) and the fork's prepare handler waits for it
    /// ([`fork_begin`]), or the look sees the fork under way. Before, a
    /// second look after the `dup3` saw such a fork and shut the program's
    /// end down itself, but the byte was sent by then: the child's copy of
    /// the library's end, released at its exec or exit, seconds later, set
    /// `sk_err` after the program took the error, a `POLLERR` nothing
    /// cleared (review r26-a item 5). The stretch runs with asynchronous
    /// signals blocked (two `pthread_sigmask` calls more per failure;
    /// none on the data path), so few forks come from it; a fault signal's
    /// handler that forks (a crash reporter) does not wait for its own
    /// thread's stretch, and no fork waits past [`FORK_WAIT_BOUND`]
    /// (review r27-a item 3). Such a fork may copy the library's end with
    /// the byte: it is counted ([`UNWAITED`]), and this call, seeing the
    /// count move by its `dup3`, shuts the program's end down as before
    /// (the hang-up now; the `POLLERR` may still come, and stay, at the
    /// child's exec or exit).
    ///
    /// `vfork`, `posix_spawn`, `_Fork`, `clone` and `syscall(SYS_fork)` run
    /// no atfork handler: a child of theirs alive across this call holds
    /// a copy of the library's end (`CLOEXEC`: until its `exec`), so the
    /// `dup3` releases nothing and the program's end shows nothing yet.
    /// If the program meets the error meanwhile (a receive or send takes
    /// it, [`Self::clear_error`] reading an `SO_ERROR` of 0), the child's
    /// `exec` or exit then releases the byte and sets `sk_err`: a
    /// `POLLERR` nothing clears, as r26-a item 5's; not fixed here
    /// (review r27-a item 4: Python's `subprocess` forks with `vfork`).
    pub(crate) fn fail(&self) {
        sys::with_async_signals_blocked(|| self.fail_counted());
    }

    /// [`Self::fail`], its signals blocked.
    fn fail_counted(&self) {
        let Some(failing) = Failing::enter(self.forks) else {
            self.hang_up();
            return;
        };
        // Fails (`EAGAIN`) while a closed write gate's filler fills the
        // program end's buffer: that filler is unread too.
        // SAFETY: a one-byte write to our own nonblocking socket.
        unsafe {
            sys::send_raw(
                self.app,
                b"!".as_ptr(),
                1,
                libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
            )
        };
        #[cfg(test)]
        tests::hook(&tests::FAIL_WINDOW);
        let mut sv = [-1; 2];
        // SAFETY: socketpair writes two descriptors into `sv`; dup3 over
        // our own descriptor (the number stays ours); closing our own.
        unsafe {
            if libc::socketpair(
                libc::AF_UNIX,
                libc::SOCK_STREAM | libc::SOCK_CLOEXEC,
                0,
                sv.as_mut_ptr(),
            ) != 0
            {
                self.hang_up();
                return;
            }
            sys::close(sv[1]);
            if real::dup3(sv[0], self.tx, libc::O_CLOEXEC) < 0 {
                self.hang_up();
            } else if failing.unwaited_since() {
                // A fork that did not wait may hold the library's end:
                // the release may not have happened. `tx` names the
                // placeholder now: `hang_up` would shut that one.
                real::shutdown(self.app, libc::SHUT_RDWR);
            }
            sys::close(sv[0]);
        }
    }

    /// The program took the connection's error: the program's end's
    /// `POLLERR` ([`Self::fail`]) goes (`SO_ERROR` read, which clears it;
    /// the hang-up stays).
    pub(crate) fn clear_error(&self) {
        let _ = sys::get_int(self.app, libc::SOL_SOCKET, libc::SO_ERROR);
    }
}

impl Drop for Doorbell {
    fn drop(&mut self) {
        sys::close(self.app);
        sys::close(self.tx);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;
    use std::sync::{mpsc, Mutex, PoisonError};
    use std::thread::LocalKey;
    use std::time::Duration;

    /// A hook: run once, on the thread that set it.
    type Hook = RefCell<Option<Box<dyn FnOnce()>>>;

    thread_local! {
        /// Run inside a `fail`'s counted stretch, after its byte.
        pub(super) static FAIL_WINDOW: Hook = const { RefCell::new(None) };
        /// Run when `fork_begin` finds a `fail` to wait for.
        pub(super) static FORK_WAITS: Hook = const { RefCell::new(None) };
    }

    /// A child forked between a stretch's two drops (its `FAILING` reset
    /// to the thread's stretches, 0 here, with the `FAILING` decrement
    /// still to come) does not wrap `FAILING`: it stays 0. Staged in a
    /// forked child, whose atomics are its own.
    #[test]
    fn a_stretchs_drop_after_the_childs_reset_does_not_wrap() {
        // SAFETY: the child only touches atomics and a thread-local
        // `Cell`, then `_exit`s.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
        if pid == 0 {
            STRETCHES.with(|n| n.set(1));
            let f = Failing { unwaited: 0 };
            FAILING.store(0, Ordering::SeqCst);
            drop(f);
            let ok = FAILING.load(Ordering::SeqCst) == 0 && STRETCHES.with(Cell::get) == 0;
            // SAFETY: ends the child, no handler or destructor run.
            unsafe { libc::_exit(if ok { 0 } else { 1 }) };
        }
        let mut st = 0;
        // SAFETY: waiting for our own child.
        assert_eq!(unsafe { libc::waitpid(pid, &mut st, 0) }, pid);
        assert!(
            libc::WIFEXITED(st) && libc::WEXITSTATUS(st) == 0,
            "FAILING wrapped in the child ({st:#x})"
        );
    }

    /// Runs the hook `at` of this thread, if set (once).
    pub(super) fn hook(at: &'static LocalKey<Hook>) {
        if let Some(f) = at.with(|h| h.borrow_mut().take()) {
            f();
        }
    }

    /// One test at a time: the fork counts are the process's.
    static ONE: Mutex<()> = Mutex::new(());

    /// Ends the fork the test began, however the test ends (the counts
    /// are the process's).
    struct UnderWay;

    impl UnderWay {
        fn begin() -> Self {
            fork_begin();
            Self
        }
    }

    impl Drop for UnderWay {
        fn drop(&mut self) {
            fork_end();
        }
    }

    /// What a `poll` of `fd` shows now.
    fn shown(fd: c_int) -> i16 {
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLIN | libc::POLLRDHUP,
            revents: 0,
        };
        // SAFETY: one pollfd on the stack.
        assert!(unsafe { libc::poll(&mut p, 1, 0) } >= 0);
        p.revents
    }

    /// A doorbell that fails while a fork is under way — the child's copy
    /// of the library's end made, the parent's atfork handler still to run
    /// — hangs the program's end up (HUP, IN, RDHUP; no ERR): the release
    /// cannot reach a socket the child holds too. Before, the fork was
    /// counted only by the parent's handler, so `fail` dropped the
    /// parent's reference alone and the program's end showed nothing
    /// (review r25-c item 5). With no fork, the failure shows `POLLERR`
    /// with the hang-up. Fails with `forked_since` not looking at the
    /// forks under way.
    #[test]
    fn a_failure_while_a_fork_is_under_way_hangs_the_program_end_up() {
        let _one = ONE.lock().unwrap_or_else(PoisonError::into_inner);
        let hung = libc::POLLHUP | libc::POLLIN | libc::POLLRDHUP;
        let d = Doorbell::new(true).unwrap();
        // SAFETY: a copy of our own descriptor (the child's, in effect).
        let child = unsafe { libc::dup(d.tx) };
        assert!(child >= 0);
        let fork = UnderWay::begin();
        d.fail();
        let r = shown(d.app);
        drop(fork);
        sys::close(child);
        assert_eq!((r & hung, r & libc::POLLERR), (hung, 0), "{r:#x}");
        let d = Doorbell::new(true).unwrap();
        d.fail();
        let r = shown(d.app);
        assert_eq!(r & (hung | libc::POLLERR), hung | libc::POLLERR, "{r:#x}");
    }

    /// A fork that begins while a doorbell's `fail` is past its look at
    /// the forks (its byte sent, its `dup3` still to come) waits for the
    /// `dup3` before its copy: the child's copy is of the placeholder, so
    /// the program's end shows `POLLERR` at once, and once the program
    /// took it (`clear_error`) the child's release (its exit) raises
    /// nothing. Before, the fork copied the library's end in between: the
    /// program's end was shut down without `POLLERR`, and the child's
    /// release set `sk_err` after the error was taken, a `POLLERR` that
    /// stayed (review r26-a item 5). Fails with `fork_begin` not waiting
    /// for [`FAILING`].
    #[test]
    fn a_fork_waits_for_a_failure_past_its_look() {
        let _one = ONE.lock().unwrap_or_else(PoisonError::into_inner);
        let d = Doorbell::new(true).unwrap();
        let tx = d.tx;
        let (said, heard) = mpsc::channel();
        FAIL_WINDOW.with(|h| {
            *h.borrow_mut() = Some(Box::new(move || {
                let (say, hear) = mpsc::channel();
                let waits = say.clone();
                let forker = std::thread::spawn(move || {
                    FORK_WAITS.with(|h| {
                        *h.borrow_mut() = Some(Box::new(move || {
                            let _ = waits.send("waits");
                        }));
                    });
                    fork_begin();
                    // The child's copy of the descriptors, in effect.
                    // SAFETY: a copy of a descriptor the test holds.
                    let child = unsafe { libc::dup(tx) };
                    let _ = say.send("copied");
                    child
                });
                // The fork waits for this `fail`, or has made its copy.
                let first = hear.recv().unwrap();
                said.send((first, forker)).unwrap();
            }));
        });
        d.fail();
        let (first, forker) = heard.recv().unwrap();
        let child = forker.join().unwrap();
        fork_end();
        assert!(child >= 0);
        let failed = shown(d.app);
        d.clear_error();
        sys::close(child);
        let later = shown(d.app);
        assert_eq!(first, "waits");
        assert_eq!(failed & libc::POLLERR, libc::POLLERR, "{failed:#x}");
        assert_eq!(later & libc::POLLERR, 0, "{later:#x}");
    }

    /// A fork from the failing thread itself, inside its stretch (a fault
    /// signal's handler that forks: the stretch blocks only asynchronous
    /// signals) goes on at once, not waiting for that stretch, which
    /// cannot go on until it returns: before, it waited for ever (review
    /// r27-a item 3). Its child may hold the library's end with the byte
    /// (a copy here), so the `fail` falls back to shutting the program's
    /// end down (HUP, IN, RDHUP; no `POLLERR` while the copy lives).
    /// Fails with the fork waiting for its own thread's stretch ("waited",
    /// after the bound) or without the fallback (the program's end shows
    /// nothing: 0x0).
    #[test]
    fn a_fork_from_the_failing_threads_own_stretch_goes_on() {
        let _one = ONE.lock().unwrap_or_else(PoisonError::into_inner);
        let hung = libc::POLLHUP | libc::POLLIN | libc::POLLRDHUP;
        let d = Doorbell::new(true).unwrap();
        let tx = d.tx;
        let waited = std::rc::Rc::new(Cell::new(false));
        let child = std::rc::Rc::new(Cell::new(-1));
        let (w, c) = (waited.clone(), child.clone());
        FAIL_WINDOW.with(|h| {
            *h.borrow_mut() = Some(Box::new(move || {
                FORK_WAITS.with(|h| *h.borrow_mut() = Some(Box::new(move || w.set(true))));
                fork_begin();
                // The child's copy of the descriptors, in effect.
                // SAFETY: a copy of a descriptor the test holds.
                c.set(unsafe { libc::dup(tx) });
                fork_end();
            }));
        });
        d.fail();
        FORK_WAITS.with(|h| h.borrow_mut().take());
        let r = shown(d.app);
        sys::close(child.get());
        assert!(child.get() >= 0);
        assert!(
            !waited.get(),
            "the fork waited for its own thread's stretch"
        );
        assert_eq!(r & (hung | libc::POLLERR), hung, "{r:#x}");
    }

    /// A `fail` that never gives its count back (its thread left the
    /// stretch by a fault handler's `siglongjmp`, or is stopped) holds a
    /// fork up for [`FORK_WAIT_BOUND`] at most; the fork is counted as
    /// not having waited ([`UNWAITED`]). Before, every later fork of the
    /// process hung in its prepare handler (review r27-a item 3). Fails
    /// (no answer within 10 s) without the bound.
    #[test]
    fn a_fork_waits_for_a_stretch_left_unended_a_bounded_time() {
        let _one = ONE.lock().unwrap_or_else(PoisonError::into_inner);
        // A stretch of a thread that left it, counted for ever.
        FAILING.fetch_add(1, Ordering::SeqCst);
        let unwaited = UNWAITED.load(Ordering::SeqCst);
        let (say, hear) = mpsc::channel();
        let forker = std::thread::spawn(move || {
            fork_begin();
            let _ = say.send(());
            fork_end();
        });
        let r = hear.recv_timeout(Duration::from_secs(10));
        FAILING.fetch_sub(1, Ordering::SeqCst);
        forker.join().unwrap();
        assert_eq!(r, Ok(()), "the fork still waits");
        assert_ne!(UNWAITED.load(Ordering::SeqCst), unwaited);
    }

    /// A real fork's child starts with no fork under way and, of the
    /// `fail`s counted, only its own thread's stretch (here: the fork
    /// made over it, as a fault handler's), which it then ends: its counts
    /// are all 0. Another thread's fork counted before the copy (glibc
    /// 2.36 runs the prepare handlers unlocked) and another thread's
    /// counted `fail` are in the parent's counts at the copy. Fails
    /// (exit status 2) with the child's [`FORKING`] only decremented
    /// (review r27-a item 5), and (status 1: [`FAILING`] wrapped below
    /// 0) with [`FAILING`] zeroed instead of set to the thread's own
    /// stretches (review r27-a item 6).
    #[test]
    fn a_forked_child_counts_no_fork_and_no_other_threads_failure() {
        let _one = ONE.lock().unwrap_or_else(PoisonError::into_inner);
        let own = Failing::enter(FORKS.load(Ordering::SeqCst));
        assert!(own.is_some(), "a fork under way");
        fork_begin();
        // Another thread's counted fail, another thread's fork.
        FAILING.fetch_add(1, Ordering::SeqCst);
        FORKING.fetch_add(1, Ordering::SeqCst);
        // SAFETY: the child makes no call but _exit (atomics, a
        // thread-local of this thread, no lock, no allocation).
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            fork_end_child();
            drop(own);
            let failing = FAILING.load(Ordering::SeqCst) != 0;
            let forking = FORKING.load(Ordering::SeqCst) != 0;
            // SAFETY: ends the child.
            unsafe { libc::_exit(i32::from(failing) | i32::from(forking) << 1) };
        }
        FORKING.fetch_sub(1, Ordering::SeqCst);
        FAILING.fetch_sub(1, Ordering::SeqCst);
        fork_end();
        drop(own);
        assert!(pid > 0);
        let mut st = 0;
        // SAFETY: our own child.
        assert_eq!(unsafe { libc::waitpid(pid, &mut st, 0) }, pid);
        assert!(libc::WIFEXITED(st), "{st:#x}");
        assert_eq!(libc::WEXITSTATUS(st), 0, "1: FAILING, 2: FORKING not 0");
    }
}
