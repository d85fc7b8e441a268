//! How a DDP socket's doorbell follows the socket's readiness
//! ([`Follow::reflect`]), with the books it keeps for that under its own
//! lock ([`Inner`]) and a lock-free answer for the commonest look — one
//! that changes nothing but the count of arrivals seen ([`Follow::quiet`]).

use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use warpsock_xsock::io::{Readiness, Round, XSocket};

use super::sock::DdpSock;
use crate::shim::doorbell::Doorbell;
use crate::shim::guard::enter;
use crate::shim::reactor::{self, Handler, Reactor};
use crate::shim::sys::lock;

/// What the doorbell pair does for [`Follow::reflect`] ([`Doorbell`]; a
/// recording fake in the tests).
pub(crate) trait Bell {
    /// Writes one bell unless the count is at its bound; counts it.
    fn ring(&self, count: &mut usize) -> bool;
    /// Reads every outstanding bell; the count becomes 0.
    fn drain(&self, count: &mut usize);
    /// Makes the program's end report writability (`on`) or not.
    fn set_writable(&self, on: bool);
    /// The peer ended its stream: the pair shows `POLLRDHUP` and
    /// `POLLIN` for good ([`Doorbell::shut_reading`]).
    fn read_closed(&self);
    /// Hangs the pair up (`POLLHUP`).
    fn hang_up(&self);
    /// Hangs the pair up with `POLLERR` ([`Doorbell::fail`]).
    fn fail(&self);
}

impl Bell for Doorbell {
    fn ring(&self, count: &mut usize) -> bool {
        Self::ring(self, count)
    }

    fn drain(&self, count: &mut usize) {
        Self::drain(self, count);
    }

    fn set_writable(&self, on: bool) {
        Self::set_writable(self, on);
    }

    fn read_closed(&self) {
        Self::shut_reading(self);
    }

    fn hang_up(&self) {
        Self::hang_up(self);
    }

    fn fail(&self) {
        Self::fail(self);
    }
}

pub(crate) struct Inner {
    pub(crate) bells: usize,
    /// [`Readiness::arrivals`] when the doorbell last followed the socket.
    pub(crate) seen: u64,
    pub(crate) write_gated: bool,
    /// `shutdown(SHUT_WR)` was made: the gate stays open for good (a send
    /// fails with `EPIPE` at once, and TCP's poll reports `POLLOUT`).
    pub(crate) write_shut: bool,
    pub(crate) hung_up: bool,
    /// The peer's end of stream shows on the doorbell ([`Bell::read_closed`]):
    /// readable for good, no bell rings or is drained from now on.
    pub(crate) read_closed: bool,
    /// The connection failed and the doorbell shows it ([`Bell::fail`],
    /// or the hang-up alone if the error was taken already): no bell
    /// rings or is drained from now on.
    pub(crate) failed: bool,
    /// The connection's error was reported to the program (`SO_ERROR`, or
    /// a call that failed with it: `DdpSock::take_error`); the doorbell's
    /// `POLLERR` is taken away with it ([`Doorbell::clear_error`]), or,
    /// taken before the failure's look lands, never raised
    /// ([`Follow::reflect`]).
    pub(crate) error_taken: bool,
    /// The `connect` call that adopted the socket is still to return.
    pub(crate) connect_pending: bool,
}

/// [`Follow::quiet`] when a look could change something.
const NOT_QUIET: u64 = u64::MAX;
/// [`Follow::quiet`]'s bit set while a holder has the books (counts of
/// arrivals never reach it).
const HELD: u64 = 1 << 63;

/// The doorbell's books ([`Inner`]) and, outside their lock, the `seen`
/// they stand at while a look that is neither readable nor hung up would
/// change nothing but `seen` ([`Follow::reflect`]).
pub(crate) struct Follow {
    inner: Mutex<Inner>,
    /// `seen` while no bell is out and writes are not gated, else
    /// [`NOT_QUIET`]; with [`HELD`] set while a holder has the books (set
    /// by [`Follow::lock`], cleared by the store as it lets go,
    /// [`Books`]); moved on without the lock by the looks that change
    /// only `seen`, while no one holds it ([`Follow::reflect`]).
    quiet: AtomicU64,
    /// Looks that took the lock (the tests see the skips).
    #[cfg(test)]
    locked: std::sync::atomic::AtomicUsize,
}

/// The books, locked; [`Follow::quiet`] follows them when let go.
pub(crate) struct Books<'a> {
    g: MutexGuard<'a, Inner>,
    quiet: &'a AtomicU64,
}

impl Deref for Books<'_> {
    type Target = Inner;

    fn deref(&self) -> &Inner {
        &self.g
    }
}

impl DerefMut for Books<'_> {
    fn deref_mut(&mut self) -> &mut Inner {
        &mut self.g
    }
}

impl Drop for Books<'_> {
    fn drop(&mut self) {
        // Before the lock is let go (the guard field drops after this).
        let q = if self.g.bells == 0 && !self.g.write_gated {
            self.g.seen
        } else {
            NOT_QUIET
        };
        self.quiet.store(q, Ordering::Release);
    }
}

impl Follow {
    pub(crate) fn new() -> Self {
        Self {
            inner: Mutex::new(Inner {
                bells: 0,
                seen: 0,
                write_gated: false,
                write_shut: false,
                hung_up: false,
                read_closed: false,
                failed: false,
                error_taken: false,
                connect_pending: false,
            }),
            quiet: AtomicU64::new(0),
            #[cfg(test)]
            locked: std::sync::atomic::AtomicUsize::new(0),
        }
    }

    /// The books, locked: `quiet` marked [`HELD`] while they are held (the
    /// looks that would move `seen` on go to the lock meanwhile), with
    /// the `seen` the looks applied without it since the last holder let
    /// go.
    pub(crate) fn lock(&self) -> Books<'_> {
        let mut g = lock(&self.inner);
        let q = self.quiet.fetch_or(HELD, Ordering::Acquire);
        if q & HELD == 0 {
            g.seen = g.seen.max(q);
        }
        Books {
            g,
            quiet: &self.quiet,
        }
    }

    /// Makes `bell` follow readiness `r`: a bell if the socket is readable
    /// and something arrived since the last look (an edge-triggered waiter
    /// needs a new edge) or no bell is out — but only if `heard()` (a
    /// bell can wake anyone); the bells drained if nothing is readable;
    /// writability released once a send could move bytes again; a hang-up
    /// once finished both ways — with `POLLERR` if the connection failed
    /// ([`Bell::fail`]), unless the program took the error before this
    /// look landed (then the hang-up alone). Returns whether it rang.
    ///
    /// Readiness is taken under the socket's lock but applied here under
    /// another, so two threads' looks can land out of order: a program
    /// thread's look from before the progress thread processed a message
    /// (nothing readable) applied after the progress thread's ring drained
    /// that ring, and the program waited forever for a message already
    /// received (redis-benchmark -k 0 in policy mode: both ends idle,
    /// every queue empty). Arrivals only grow: a look older than the last
    /// one applied is stale and skipped.
    ///
    /// A look not readable and not hung up, while no bell is out and
    /// writes are not gated, changes nothing but `seen`: it is applied
    /// without the lock (a send call's look, and a receive's that took
    /// what it found: every call of a ping-pong). `quiet` holds `seen`
    /// while the books are in that state, else [`NOT_QUIET`], with
    /// [`HELD`] set while a holder has them ([`Self::lock`] sets it and
    /// takes `seen` from the value; the holder's store as it lets go
    /// clears it, [`Books`]). A look with no new arrivals returns on the
    /// load, held or not: it fits in the books' order right after the
    /// holder or look that wrote the value it read (a holder's changes
    /// count at its store), where applying it would change nothing. One
    /// with new arrivals, while no one holds the books, moves `seen` on
    /// with a compare-exchange from the value it read, so it fits right
    /// after the holder or look whose value it replaced, exactly where
    /// applying it under the lock would have made that one change; held
    /// (a holder may be ringing for an older look, which must not pass
    /// it), or a failed exchange (a holder came, or another look moved
    /// `seen` first), it takes the lock. A stale look (arrivals below
    /// `seen`) goes to the lock, which skips it. These looks never ring, so they cannot lose a bell, and
    /// the order of the looks that do is the lock's. The value alone
    /// decides (nothing else is read); acquire (a plain load on x86) puts
    /// the doorbell writes of the holder that stored it, made before its
    /// release store, before the call's return. An error is readable
    /// ([`Readiness::readable`]); it is asked anyway, as the locked look's
    /// first branch does.
    #[inline]
    pub(crate) fn reflect(
        &self,
        r: Readiness,
        bell: &impl Bell,
        heard: impl FnOnce() -> bool,
    ) -> bool {
        if !r.readable && !r.hup && !r.error {
            let q = self.quiet.load(Ordering::Acquire);
            // `NOT_QUIET`, and any value with `HELD`, is above every count
            // of arrivals.
            if q & !HELD == r.arrivals
                || (q < r.arrivals
                    && self
                        .quiet
                        .compare_exchange(q, r.arrivals, Ordering::AcqRel, Ordering::Acquire)
                        .is_ok())
            {
                return false;
            }
        }
        self.reflect_locked(r, bell, heard)
    }

    /// [`Self::reflect`] under the lock (apart, so that the lock-free
    /// answer costs no more than its test where it is inlined).
    #[inline(never)]
    fn reflect_locked(&self, r: Readiness, bell: &impl Bell, heard: impl FnOnce() -> bool) -> bool {
        #[cfg(test)]
        self.locked.fetch_add(1, Ordering::Relaxed);
        let mut g = self.lock();
        if r.arrivals < g.seen {
            return false;
        }
        let arrived = r.arrivals != g.seen;
        g.seen = r.arrivals;
        if r.error && !g.failed {
            // First: the hang-up and `POLLERR` in one wake-up (a bell
            // before it was an edge without them), readable for good. An
            // error the program took already (a failing call took it
            // before this look landed, `DdpSock::take_error`): the hang-up
            // alone — TCP's state once `sk_err` was read (HUP, IN, RDHUP,
            // OUT; no ERR). Not `POLLERR` raised and taken away a few
            // system calls later: a `poll` or `epoll_wait` in between
            // reported it for an error already taken (review r25-c item 6).
            if g.error_taken {
                bell.hang_up();
            } else {
                bell.fail();
            }
            g.failed = true;
            g.hung_up = true;
        }
        let mut closed_now = false;
        if r.rdhup && !g.read_closed {
            // TCP's poll shows `POLLRDHUP` from the peer's FIN on (an
            // event loop's sign of a half-closed connection); the pair
            // shows it once the hang-up below did not already.
            g.read_closed = true;
            if !g.hung_up && !r.hup {
                bell.read_closed();
                closed_now = true;
            }
        }
        let mut rang = false;
        if g.failed {
            // Readable for good; a drain would take the `POLLERR`.
        } else if g.read_closed {
            // Readable for good, and no bell can be written: a later
            // arrival (an asynchronous completion after the peer's FIN)
            // wakes its waiters by the shutdown made again, which wakes
            // every waiter of the program's end each time (AF_UNIX's
            // `unix_shutdown` has no early return): an edge, a `SIGIO`
            // (review 57: an edge-triggered waiter heard nothing).
            if arrived && !closed_now && !g.hung_up && !r.hup && heard() {
                bell.read_closed();
            }
        } else if r.readable {
            if (arrived || g.bells == 0) && heard() && bell.ring(&mut g.bells) {
                rang = true;
            }
        } else if g.bells > 0 {
            bell.drain(&mut g.bells);
        }
        if g.write_gated && r.writable {
            bell.set_writable(true);
            g.write_gated = false;
        }
        if r.hup && !g.hung_up {
            bell.hang_up();
            g.hung_up = true;
        }
        rang
    }
}

/// The references the progress thread takes to a socket ([`Ready`]),
/// shared with the socket: a lingering close waits for them to go
/// ([`Pins::close`]), and none is taken after it.
///
/// The last reference makes the close (`sock/close.rs`), and a lingering
/// one (`SO_LINGER` {1, N > 0}) waits only where that reference is the
/// closer's: one the progress thread held through the program's `close`
/// — a pass over the socket, which a send buffer's bytes (set small with
/// `SO_SNDBUF`) keep it making — made the close there, handed to the
/// background unbegun, and the program's `close` returned at once with
/// the bytes still unsent: a writer that `_exit`s then (as Linux allows
/// once the lingering close returned) lost them, its peer reading a
/// clean end after a short stream (task xstall; `tests/ddp_linger.rs`
/// `a_lingering_close_waits_while_the_progress_thread_drives_the_socket`).
#[derive(Default)]
pub(super) struct Pins {
    /// Passes of the progress thread holding a reference now.
    held: AtomicU32,
    /// The program closed the socket with a lingering close: no more.
    closed: AtomicBool,
    /// The test hook's request: the next pass holds its reference
    /// ([`Self::hold_a_pass`]).
    #[cfg(feature = "test-hooks")]
    hold: AtomicBool,
    /// A pass holds it for the hook now.
    #[cfg(feature = "test-hooks")]
    holding: AtomicBool,
    /// The lingering close waits for the passes ([`Self::close`]): the
    /// hook's pass lets go.
    #[cfg(feature = "test-hooks")]
    waiting: AtomicBool,
}

/// The longest a lingering close waits for a pass of the progress thread
/// over its socket to end (a round of the engine; a bound, not a
/// synchronisation: past it the close goes to the background as before).
const PASS_WAIT: Duration = Duration::from_secs(1);

impl Pins {
    /// A pass of the progress thread may take a reference: `None` once a
    /// lingering close began ([`Self::close`]).
    fn pin(&self) -> Option<Pinned<'_>> {
        // SeqCst with `close`'s (a store, then a load of the other's):
        // either the pass sees `closed`, or the close sees it held.
        self.held.fetch_add(1, Ordering::SeqCst);
        if self.closed.load(Ordering::SeqCst) {
            self.held.fetch_sub(1, Ordering::SeqCst);
            return None;
        }
        Some(Pinned(self))
    }

    /// The program's lingering close (its release, before its own
    /// reference goes): no pass takes a reference from now on, and the
    /// passes under way end (their references go) before this returns,
    /// [`PASS_WAIT`] at most — so the program's reference is the last
    /// unless a call of another thread's holds one (whose return makes
    /// the close then, as Linux's `fdget`).
    ///
    /// A few yields (a pass is normally µs), then 200 µs sleeps: a pass
    /// that lasts does not cost the closer a core of the two this may
    /// run on (review r28-b item 6(a)).
    pub(super) fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        let end = Instant::now() + PASS_WAIT;
        let mut yields = 0u32;
        while self.held.load(Ordering::SeqCst) != 0 && Instant::now() < end {
            #[cfg(feature = "test-hooks")]
            self.waiting.store(true, Ordering::SeqCst);
            if yields < 64 {
                yields += 1;
                std::thread::yield_now();
            } else {
                crate::shim::sys::sleep(Duration::from_micros(200));
            }
        }
    }
}

#[cfg(feature = "test-hooks")]
impl Pins {
    /// `WARPSOCK_TEST_PASS_HOLD_FD`, from the program's lingering close
    /// (`DdpSock::hold_a_pass`, which `ask`s the progress thread for a
    /// pass): writes a byte (`w`) to that descriptor, then waits until a
    /// pass over the socket holds its reference, which it does between two
    /// bytes written there (`p`, `q`) until the close waits for it in
    /// [`Self::close`] — events, not times: a loaded host's delays change
    /// nothing (issue 12). The bounds (20 s for the pass, 2 s for the
    /// close's wait) only end a broken run: the close never waiting
    /// (a close that does not wait for the passes) leaves the pass holding
    /// its reference past the close's drop.
    pub(super) fn hold_a_pass(&self, ask: impl FnOnce()) {
        let Some(fd) = super::config::get().hooks.pass_hold_fd else {
            return;
        };
        self.hold.store(true, Ordering::SeqCst);
        // SAFETY: one byte from the stack to the test's descriptor.
        unsafe { crate::shim::sys::write_raw(fd, b"w".as_ptr().cast(), 1) };
        ask();
        let end = Instant::now() + Duration::from_secs(20);
        while !self.holding.load(Ordering::SeqCst) && Instant::now() < end {
            crate::shim::sys::sleep(Duration::from_millis(1));
        }
    }

    /// In a pass holding its reference: the hold, if asked for.
    fn held_pass(&self) {
        let Some(fd) = super::config::get().hooks.pass_hold_fd else {
            return;
        };
        if self.hold.swap(false, Ordering::SeqCst) {
            // SAFETY: one byte from the stack to the test's descriptor.
            unsafe { crate::shim::sys::write_raw(fd, b"p".as_ptr().cast(), 1) };
            self.holding.store(true, Ordering::SeqCst);
            let end = Instant::now() + Duration::from_secs(2);
            while !self.waiting.load(Ordering::SeqCst) && Instant::now() < end {
                crate::shim::sys::sleep(Duration::from_millis(1));
            }
            // SAFETY: as above.
            unsafe { crate::shim::sys::write_raw(fd, b"q".as_ptr().cast(), 1) };
        }
    }
}

/// A pass's pin ([`Pins::pin`]), let go after its reference.
struct Pinned<'a>(&'a Pins);

impl Drop for Pinned<'_> {
    fn drop(&mut self) {
        self.0.held.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The socket's handler on the progress thread: its watch's events, and
/// the lapse of its stand-ins while a `poll` stands in. Each pass holds
/// a reference only under a pin ([`Pins`]).
pub(super) struct Ready(pub(super) Weak<DdpSock>, pub(super) Arc<Pins>);

impl Handler for Ready {
    fn on_ready(&self, reactor: &'static Reactor, _events: u32) {
        // The engine's calls made from here must not re-enter the
        // interposed entry points — including those of the last drop of
        // the socket, which may happen here (its close finished meanwhile:
        // not a lingering one, which waits for the pin to go).
        enter((), || {
            let Some(_pin) = self.1.pin() else { return };
            if let Some(s) = self.0.upgrade() {
                // Never a wait for the socket's lock, which a thread that
                // faulted under it holds for good: the round is owed
                // then, and made by the timer (`XSocket::progress_round`).
                if let Round::Owed { time_it: true } = s.x.progress_round(|r| s.reflect(r)) {
                    reactor.add_timer_of(s.id);
                }
                #[cfg(feature = "test-hooks")]
                self.1.held_pass();
            }
        });
    }

    /// On the timer list while a `poll` stands in (`DdpSock::stand_in`)
    /// or a round is owed (`on_ready`): the earlier of the stand-ins'
    /// lapse and the owed round's try.
    fn deadline(&self) -> Option<Instant> {
        enter(None, || {
            let _pin = self.1.pin()?;
            let s = self.0.upgrade()?;
            match (s.x.stand_expiry(), s.x.owed_due()) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            }
        })
    }

    fn on_timer(&self, _: &'static Reactor, now: Instant) -> bool {
        enter(true, || {
            let Some(_pin) = self.1.pin() else {
                return true;
            };
            self.0.upgrade().is_none_or(|s| {
                let owed = s.x.owed_round(now, |r| s.reflect(r));
                s.x.stand_lapse(now) && !owed
            })
        })
    }
}

impl DdpSock {
    /// `wait_begin` of a `poll` that may stand in for the progress thread
    /// (its watch is for input): whether it does
    /// (`XSocket::stand_in_timed`). The first stand-in of a lapse period
    /// puts the socket's handler on the progress thread's timer list, so
    /// that stand-ins a poll left counted when it never returned (a
    /// `siglongjmp` out of a handler that interrupted it) lapse and the
    /// watch comes back on with no call running (review r22-e item 3):
    /// its deadline is the lapse (`Ready::deadline`). Out of line, as
    /// `stood_end`.
    #[inline(never)]
    pub(super) fn stand_in(&self) -> bool {
        let (stands, time_it) = self.x.stand_in_timed();
        if time_it {
            match reactor::current() {
                Some(eng) => eng.add_timer_of(self.id),
                // No progress thread (a forked child's, before its own
                // starts): no timer, and the next stand-in asks again
                // (review r23-c item 9: the mark stayed set with no timer).
                None => self.x.stand_untimed(),
            }
        }
        stands
    }

    /// `wait_end` of a `poll` that stood in for the progress thread
    /// (`XSocket::stand_in`), out of line (the ping-pong's poll, a direct
    /// one, pays no frame for it): as a direct poll's end, with the round
    /// made before the stand-in ends (the progress thread is not woken for
    /// what it reads), and the doorbell following the watch as the round
    /// left it — off while the poll stood in, unless someone waits on the
    /// doorbell alone (then it rings, as a direct poll's does).
    #[inline(never)]
    pub(super) fn stood_end(&self, revents: &[i16]) -> i16 {
        // (Its lease renewed by the next wait's `stand_in`, if the poll goes
        // on: `Wait::bound`.)
        let polled = if revents.first().is_some_and(|&r| r != 0) {
            self.x.progress_for_poll()
        } else {
            None
        };
        let watched = self.x.watching();
        self.x.stand_in(false);
        if let Some(r) = polled {
            // (And for an epoll set that watches the connection itself,
            // whose edge this round took: `XSocket::covered`.)
            if watched != XSocket::WATCH_OFF || !r.readable || self.x.covered() {
                self.reflect(r);
            }
            if r.readable {
                return self.shown(r);
            }
        }
        self.shown(self.x.readiness_now())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::sync::Arc;

    /// A doorbell that counts: `out` is the bells a waiter could see.
    #[derive(Default)]
    struct Fake {
        out: AtomicUsize,
        drains: AtomicUsize,
        fails: AtomicUsize,
        hang_ups: AtomicUsize,
        read_closes: AtomicUsize,
    }

    impl Bell for Fake {
        fn ring(&self, count: &mut usize) -> bool {
            *count += 1;
            self.out.fetch_add(1, Ordering::SeqCst);
            true
        }

        fn drain(&self, count: &mut usize) {
            *count = 0;
            self.out.store(0, Ordering::SeqCst);
            self.drains.fetch_add(1, Ordering::SeqCst);
        }

        fn set_writable(&self, _: bool) {}

        fn read_closed(&self) {
            self.read_closes.fetch_add(1, Ordering::SeqCst);
        }

        fn hang_up(&self) {
            self.hang_ups.fetch_add(1, Ordering::SeqCst);
        }

        fn fail(&self) {
            self.fails.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn look(readable: bool, arrivals: u64) -> Readiness {
        Readiness {
            readable,
            writable: true,
            arrivals,
            ..Readiness::default()
        }
    }

    #[test]
    fn a_look_that_changes_nothing_skips_the_lock_and_others_do_not() {
        let f = Follow::new();
        let b = Fake::default();
        let locked = || f.locked.load(Ordering::SeqCst);
        // Nothing arrived, nothing readable: quiet, no lock taken.
        assert!(!f.reflect(look(false, 0), &b, || true));
        assert_eq!(locked(), 0, "a look that changes nothing took the lock");
        // An arrival rings; the same look again changes nothing (a bell is
        // out: not quiet, so it takes the lock and finds nothing to do).
        assert!(f.reflect(look(true, 1), &b, || true));
        assert!(!f.reflect(look(true, 1), &b, || true));
        assert_eq!(locked(), 2);
        assert_eq!(b.out.load(Ordering::SeqCst), 1);
        // Read: drained, and quiet again at 1; the same look again skips.
        assert!(!f.reflect(look(false, 1), &b, || true));
        assert_eq!(b.out.load(Ordering::SeqCst), 0);
        assert_eq!(f.quiet.load(Ordering::SeqCst), 1);
        assert_eq!(locked(), 3);
        assert!(!f.reflect(look(false, 1), &b, || true));
        assert_eq!(locked(), 3, "the send call's look took the lock");
        // Hung up (not readable: as the fast path sees it): under the lock.
        f.reflect(
            Readiness {
                hup: true,
                ..look(false, 1)
            },
            &b,
            || true,
        );
        assert_eq!(locked(), 4);
        assert!(f.lock().hung_up);
        // A stale look is skipped under the lock.
        assert!(!f.reflect(look(true, 0), &b, || true));
        assert_eq!(b.out.load(Ordering::SeqCst), 0);
        // Writes gated: not quiet (the writable look must release them).
        f.lock().write_gated = true;
        assert_eq!(f.quiet.load(Ordering::SeqCst), NOT_QUIET);
        f.reflect(look(false, 1), &b, || true);
        assert!(!f.lock().write_gated);
        assert_eq!(f.quiet.load(Ordering::SeqCst), 1);
        // A new arrival already consumed (not readable) moves `seen` on,
        // without the lock (a predicted receive's look, every answer of a
        // ping-pong), and the next holder of the lock sees it: a look
        // older than it is stale there.
        let before = locked();
        assert!(!f.reflect(look(false, 2), &b, || true));
        assert_eq!(
            locked(),
            before,
            "a look that moved `seen` on took the lock"
        );
        assert_eq!(f.quiet.load(Ordering::SeqCst), 2);
        assert_eq!(f.lock().seen, 2);
        assert!(!f.reflect(look(true, 1), &b, || true), "a stale look rang");
        assert_eq!(b.out.load(Ordering::SeqCst), 0);
        // While a holder has the books, a look that changes nothing still
        // skips the lock (review r27-a item 7: it waited for the holder);
        // one that moves `seen` on waits for it.
        // (Another thread's look, bounded: one that waits for the lock
        // ends once the holder lets go, and the test fails.)
        std::thread::scope(|sc| {
            let held = f.lock();
            assert_eq!(f.quiet.load(Ordering::SeqCst), 2 | HELD);
            let before = locked();
            let (tx, rx) = std::sync::mpsc::channel();
            let (f, b) = (&f, &b);
            sc.spawn(move || tx.send(f.reflect(look(false, 2), b, || true)).unwrap());
            let skipped = rx.recv_timeout(Duration::from_secs(10));
            drop(held);
            assert_eq!(
                skipped,
                Ok(false),
                "a held look that changes nothing waited for the lock"
            );
            assert_eq!(locked(), before);
        });
        assert_eq!(f.quiet.load(Ordering::SeqCst), 2);
        // Readable with nobody to hear a bell: none. The same look once a
        // waiter came (a `poll` begins) must ring, though nothing arrived
        // since: readable looks never take the lock-free answer.
        assert!(!f.reflect(look(true, 3), &b, || false));
        assert_eq!(f.quiet.load(Ordering::SeqCst), 3);
        assert!(f.reflect(look(true, 3), &b, || true));
        assert_eq!(b.out.load(Ordering::SeqCst), 1);
    }

    /// A look of a failed connection fails the doorbell (`POLLERR` with
    /// the hang-up) once, instead of ringing, and nothing rings or drains
    /// after it (a drain's read would take the `POLLERR`); a failing look
    /// that lands after the program took the error (`DdpSock::take_error`
    /// ran first, its look older) hangs the doorbell up alone, never
    /// raising the `POLLERR` (review r25-c item 6: raised and taken away,
    /// a `poll` in between reported it). Fails with `fail` kept for that
    /// case, and with the ring kept after the failure.
    #[test]
    fn a_failed_look_fails_the_doorbell_once_and_rings_no_more() {
        let n = |a: &AtomicUsize| a.load(Ordering::SeqCst);
        let failed = |arrivals| Readiness {
            error: true,
            hup: true,
            rdhup: true,
            ..look(true, arrivals)
        };
        let f = Follow::new();
        let b = Fake::default();
        assert!(f.reflect(look(true, 1), &b, || true));
        assert!(!f.reflect(failed(2), &b, || true), "rang at the failure");
        assert_eq!((n(&b.fails), n(&b.hang_ups)), (1, 0));
        assert!(f.lock().failed && f.lock().hung_up);
        assert!(!f.reflect(failed(3), &b, || true), "rang after it");
        f.reflect(look(false, 4), &b, || true);
        assert_eq!((n(&b.fails), n(&b.drains)), (1, 0));
        // The error taken before the failing look landed.
        let f = Follow::new();
        let b = Fake::default();
        f.lock().error_taken = true;
        f.reflect(failed(1), &b, || true);
        assert_eq!((n(&b.fails), n(&b.hang_ups)), (0, 1));
        assert!(f.lock().failed && f.lock().hung_up);
        // Failed once: a later look neither fails nor hangs up again.
        f.reflect(failed(2), &b, || true);
        assert_eq!((n(&b.fails), n(&b.hang_ups)), (0, 1));
    }

    /// The peer's end of stream shows once (`POLLRDHUP` on the pair), and
    /// then nothing rings or drains (the pair is readable for good): a
    /// later arrival (an asynchronous completion) shuts the pair again,
    /// its waiters' wake-up, if someone may hear it; a look with nothing
    /// new does not. A hang-up in the same look makes it alone (its
    /// `SHUT_RDWR` shows `POLLRDHUP` too). Fails without the look at
    /// `rdhup`, with the ring kept after it, or without the shutdown made
    /// again.
    #[test]
    fn the_peers_end_of_stream_shows_once_and_rings_no_more() {
        let n = |a: &AtomicUsize| a.load(Ordering::SeqCst);
        let ended = |arrivals| Readiness {
            rdhup: true,
            ..look(true, arrivals)
        };
        let f = Follow::new();
        let b = Fake::default();
        assert!(f.reflect(look(true, 1), &b, || true));
        assert!(!f.reflect(ended(2), &b, || true), "rang at the end");
        assert_eq!((n(&b.read_closes), n(&b.out)), (1, 1));
        assert!(!f.reflect(ended(2), &b, || true), "rang after it");
        assert_eq!((n(&b.read_closes), n(&b.drains)), (1, 0));
        assert!(!f.reflect(ended(3), &b, || false), "rang after it");
        assert_eq!(n(&b.read_closes), 1, "shut again with no one to hear");
        assert!(!f.reflect(ended(4), &b, || true), "rang after it");
        assert_eq!((n(&b.read_closes), n(&b.drains)), (2, 0));
        // Finished both ways in the same look: the hang-up alone.
        let f = Follow::new();
        let b = Fake::default();
        let over = Readiness {
            hup: true,
            ..ended(1)
        };
        f.reflect(over, &b, || true);
        assert_eq!((n(&b.read_closes), n(&b.hang_ups)), (0, 1));
    }

    /// The race `reflect` is ordered for, with the lock-free look in it:
    /// threads take looks of one socket (arrivals counted, readable or
    /// not) under the socket's lock and apply them after it, in any order;
    /// whenever the socket is left readable, a bell is out once every look
    /// has landed — never a readable socket with no bell (the redis `-k 0`
    /// hang), whatever order the looks landed in.
    #[test]
    fn looks_applied_out_of_order_never_lose_a_bell() {
        #[derive(Default)]
        struct Sock {
            arrivals: u64,
            unread: u32,
        }
        for round in 0..200u64 {
            let sock = Arc::new(Mutex::new(Sock::default()));
            let f = Arc::new(Follow::new());
            let b = Arc::new(Fake::default());
            let threads: Vec<_> = (0..3u64)
                .map(|t| {
                    let (sock, f, b) = (sock.clone(), f.clone(), b.clone());
                    std::thread::spawn(move || {
                        let mut x = round * 7 + t * 13 + 1;
                        for _ in 0..300 {
                            x = x
                                .wrapping_mul(6364136223846793005)
                                .wrapping_add(1442695040888963407);
                            let r = {
                                let mut s = lock(&sock);
                                match (x >> 33) % 3 {
                                    // A message arrives (the progress thread).
                                    0 => {
                                        s.arrivals += 1;
                                        s.unread += 1;
                                    }
                                    // A receive reads everything.
                                    1 => s.unread = 0,
                                    // A send: a look of what is there.
                                    _ => {}
                                }
                                look(s.unread > 0, s.arrivals)
                            };
                            if (x >> 40) % 4 == 0 {
                                std::thread::yield_now();
                            }
                            f.reflect(r, &*b, || true);
                        }
                    })
                })
                .collect();
            for t in threads {
                t.join().unwrap();
            }
            let s = lock(&sock);
            // Every arrival was looked at after it, and `seen` only grows
            // (review r27-a item 9).
            assert_eq!(f.lock().seen, s.arrivals, "round {round}: seen");
            if s.unread > 0 {
                assert!(
                    b.out.load(Ordering::SeqCst) > 0,
                    "round {round}: readable, no bell out"
                );
            }
            // A last look of the settled socket leaves the bells exact.
            f.reflect(look(s.unread > 0, s.arrivals), &*b, || true);
            assert_eq!(
                b.out.load(Ordering::SeqCst) > 0,
                s.unread > 0,
                "round {round}"
            );
        }
    }
}
