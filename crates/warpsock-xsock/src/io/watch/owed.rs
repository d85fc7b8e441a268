//! The progress thread's rounds never wait long for a socket's lock: a
//! round it cannot make now is owed, and its timer makes it later.
//!
//! The progress thread serves every socket of the process, so a wait for
//! one socket's lock held up all of them. A lock is held for good by a
//! thread that faulted under it (a receive's copy into a buffer it cannot
//! write) and never comes back: its handler waits for ever, `siglongjmp`s
//! out of the call, or `_exit`s. An event on that socket's connection then
//! stopped every other socket's progress: a `select` on another
//! connection waited for ever, an exit's flush of another connection's
//! send buffer waited out its linger (`tests/c/ddpstuck.c`). The stand-in
//! timer's calls were the first found there (`XSocket::stand_expiry`);
//! this is the round's part.
//!
//! So [`XSocket::progress_round`] only tries the lock, for up to
//! [`XSocket::ROUND_SPIN`] (a program's call holds it for its books: a
//! short stretch, unless its thread was preempted there), once for a
//! socket already owed a round. Still held, the
//! round is owed: [`XSocket::owed_due`] says when the timer makes it
//! ([`XSocket::owed_round`], one try), [`XSocket::OWED_RETRY`] later, each
//! try in a row that finds the lock held doubling the wait up to
//! [`XSocket::OWED_RETRY_MAX`] — a lock held for good wakes the progress
//! thread that often and no more. A round made meanwhile (the next
//! event's) pays what was owed.
//!
//! Nothing is lost by the delay: the round owed reads whatever the event
//! announced, whenever it is made (the watch is edge-triggered: no new
//! edge comes for those bytes). A call that holds the lock to drive the
//! socket reads them itself.
//!
//! Not covered (program threads, not the progress thread): a call of the
//! program's on the stuck socket itself waits for its lock (the socket is
//! the faulted call's; nothing else of it can go on). (The first `select` or
//! epoll wait of a process, whose walk of every socket takes each lock,
//! leaves a socket whose lock is held to a thread of the preload's:
//! `XSocket::try_watch_and_show`, the preload's `doorbell_wait`; review 47
//! item 2.)
//!
//! Only the progress thread reads and writes the books here (its events
//! and its timers run on it alone), so relaxed loads and stores do.

use std::sync::atomic::Ordering;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use super::super::settings::Readiness;
use super::XSocket;

/// What [`XSocket::progress_round`] came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Round {
    /// The round was made.
    Made,
    /// Skipped: a call of the program drives the socket (it processes what
    /// arrives, and tells others: [`XSocket::set_on_progress`]).
    Skipped,
    /// The socket's lock stayed held: the round is owed
    /// ([`XSocket::owed_round`]). `time_it`: none was owed before, so the
    /// caller puts the socket on its timer list (its deadline
    /// [`XSocket::owed_due`]); a socket already owed a round is on it.
    Owed {
        /// The caller gives the socket a timer.
        time_it: bool,
    },
}

/// [`XSocket::owed`]: no round owed, and no timer entry for one.
const NONE: u64 = 0;
/// [`XSocket::owed`]: the round owed was made, its timer entry not yet
/// told: due at once, so that the entry leaves the list at the timer's
/// next pass (else every pass asks its deadline until the next sweep, a
/// second away, each ask a try of the socket's lock).
const PAID: u64 = 1;

/// The clock the owed rounds' deadlines are kept on (nanoseconds from the
/// first look, above [`PAID`]).
fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

fn ns(t: Instant) -> u64 {
    (t.saturating_duration_since(epoch()).as_nanos() as u64).max(PAID + 1)
}

impl XSocket {
    /// How long after a try that found the lock held the timer tries
    /// again, the first time (doubled by each try in a row that finds it
    /// held, up to [`Self::OWED_RETRY_MAX`]).
    pub const OWED_RETRY: Duration = Duration::from_millis(1);

    /// The longest wait between two tries of an owed round.
    pub const OWED_RETRY_MAX: Duration = Duration::from_millis(128);

    /// How long the progress thread tries the lock on an event before the
    /// round is owed: longer than a program's call holds it for its
    /// longest books (a copy of MiBs between a slot and its buffer, ~100
    /// µs a MiB here), so that only a lock held for good, or a holder
    /// preempted for longer, costs the timer's delay.
    pub const ROUND_SPIN: Duration = Duration::from_millis(1);

    /// The first part of [`Self::ROUND_SPIN`], in which the processor is
    /// given away between two tries (`sched_yield`); after it the thread
    /// sleeps [`Self::ROUND_NAP`] between two: a thread that only yields
    /// never leaves its processor idle, and a holder preempted on the
    /// other one would not be pulled over to it.
    const ROUND_YIELDS: Duration = Duration::from_micros(50);

    /// The sleep between two tries after [`Self::ROUND_YIELDS`].
    const ROUND_NAP: Duration = Duration::from_micros(50);

    /// The progress thread's round on an event of its watch: as
    /// [`Self::progress_if_idle`] (the same round, `reflect` given the
    /// readiness under the lock), but the lock only tried: held through
    /// [`Self::ROUND_SPIN`] of tries, the round is owed (module docs). A
    /// socket already owed a round is tried once: its lock held that long
    /// already, a second event must not hold up the other sockets again,
    /// nor put the round owed later.
    pub fn progress_round(&self, reflect: impl FnOnce(Readiness)) -> Round {
        // As `progress_if_idle`: a call parked in the engine reads what
        // woke us when it wakes.
        if self.parked() {
            return Round::Skipped;
        }
        let owed = self.owes_round();
        // The clock is read once the lock was found held: an event whose
        // first try takes it (nearly all) reads none.
        let mut start = None;
        loop {
            if let Some(st) = self.try_lock_now() {
                self.owed_paid();
                return if self.round_locked(st, reflect) {
                    Round::Made
                } else {
                    Round::Skipped
                };
            }
            if owed {
                return Round::Owed { time_it: false };
            }
            let now = Instant::now();
            let spent = now.duration_since(*start.get_or_insert(now));
            if spent >= Self::ROUND_SPIN {
                return Round::Owed {
                    time_it: self.owe(now),
                };
            }
            if spent < Self::ROUND_YIELDS {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Self::ROUND_NAP);
            }
        }
    }

    /// Whether a round is owed (not paid yet).
    pub(crate) fn owes_round(&self) -> bool {
        self.owed.load(Ordering::Relaxed) > PAID
    }

    /// When the timer is to look at the round owed, if one is (or was, and
    /// its timer entry is still to be told: at once).
    pub fn owed_due(&self) -> Option<Instant> {
        match self.owed.load(Ordering::Relaxed) {
            NONE => None,
            n => Some(epoch() + Duration::from_nanos(n)),
        }
    }

    /// The progress thread's timer at `now`: the round owed, if it is due,
    /// made with one try of the lock (held: owed again, a longer wait).
    /// Returns whether a round is still owed.
    pub fn owed_round(&self, now: Instant, reflect: impl FnOnce(Readiness)) -> bool {
        let due = self.owed.load(Ordering::Relaxed);
        if due <= PAID {
            // (Paid: this entry is told, and leaves the list.)
            self.owed.store(NONE, Ordering::Relaxed);
            return false;
        }
        if ns(now) < due {
            return true;
        }
        if self.parked() {
            // The parked call reads what came, and tells others as it wakes.
            self.owed.store(NONE, Ordering::Relaxed);
            self.owed_tries.store(0, Ordering::Relaxed);
            return false;
        }
        match self.try_lock_now() {
            Some(st) => {
                self.owed.store(NONE, Ordering::Relaxed);
                self.owed_tries.store(0, Ordering::Relaxed);
                self.round_locked(st, reflect);
                false
            }
            None => {
                self.owe(now);
                true
            }
        }
    }

    /// A round owed from `now` on, due after the back-off's wait; returns
    /// whether the socket had no timer entry for one (none owed before,
    /// none paid and not yet told).
    fn owe(&self, now: Instant) -> bool {
        let tries = self.owed_tries.load(Ordering::Relaxed);
        self.owed_tries
            .store(tries.saturating_add(1), Ordering::Relaxed);
        self.stats.rounds_owed.fetch_add(1, Ordering::Relaxed);
        let wait = Self::OWED_RETRY
            .saturating_mul(1 << tries.min(8))
            .min(Self::OWED_RETRY_MAX);
        let before = self.owed.load(Ordering::Relaxed);
        self.owed.store(ns(now + wait), Ordering::Relaxed);
        before == NONE
    }

    /// A round was made on an event: what was owed is paid (its timer
    /// entry told at the timer's next pass).
    #[inline]
    fn owed_paid(&self) {
        if self.owed.load(Ordering::Relaxed) > PAID {
            self.owed.store(PAID, Ordering::Relaxed);
            self.owed_tries.store(0, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use super::{Round, XSocket};
    use crate::io::test_pair::pair;

    /// Runs `f` on another thread, bounded: a wait for the lock the test
    /// holds shows as a failure, not a hang.
    fn apart<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || tx.send(f()).unwrap());
        rx.recv_timeout(Duration::from_secs(30))
            .expect("the progress thread's round waited for the held lock")
    }

    /// With the socket's lock held (for good, as by a thread that faulted
    /// under it), the progress thread's round comes back owed instead of
    /// waiting, the first time asking for a timer; the timer's tries find
    /// it held and wait longer each time; once the lock is let go, the
    /// timer's round is made and reads what came meanwhile. Fails (a hang
    /// the bound ends) with the round's lock taken as
    /// `progress_if_idle`'s.
    #[test]
    fn a_held_lock_makes_the_round_owed_and_the_timer_makes_it() {
        let (a, b) = pair();
        let b = Arc::new(b);
        let held = b.st.lock().unwrap();
        a.send(b"ping", false, None).unwrap();
        let (first_owe, due_then, second_owe) = apart({
            let b = b.clone();
            move || {
                let first = b.progress_round(|_| panic!("reflected without a round"));
                let due = b.owed_due();
                // A second event: one try, the round owed no later.
                let second = b.progress_round(|_| panic!("reflected without a round"));
                (first, due, second)
            }
        });
        assert_eq!(first_owe, Round::Owed { time_it: true });
        assert_eq!(second_owe, Round::Owed { time_it: false });
        assert_eq!(b.owed_due(), due_then, "a second event put the round later");
        // The stand-in timer's deadline leaves the pace to the owed round's
        // back-off (not 10 ms for a lock held for good).
        assert_eq!(
            apart({
                let b = b.clone();
                move || b.stand_expiry()
            }),
            None
        );
        let first = b.owed_due().expect("a round is owed");
        // Not due yet: nothing tried.
        let before = first - Duration::from_micros(1);
        assert!(apart({
            let b = b.clone();
            move || b.owed_round(before, |_| panic!("made before it was due"))
        }));
        assert_eq!(b.owed_due(), Some(first));
        // Due, the lock still held: owed again, later.
        let still = apart({
            let b = b.clone();
            move || b.owed_round(first, |_| panic!("made with the lock held"))
        });
        assert!(still, "a round is still owed");
        let second = b.owed_due().expect("still owed");
        assert!(
            second > first && second - first >= XSocket::OWED_RETRY * 2,
            "no back-off: {first:?} then {second:?}"
        );
        drop(held);
        // Let go: the round is made when due, and reads what came.
        let mut seen = None;
        assert!(
            !b.owed_round(second, |r| seen = Some(r)),
            "the lock was free: the round is made"
        );
        assert!(b.owed_due().is_none(), "still owed after the round");
        let mut readable = seen.expect("the owed round reflected nothing").readable;
        let deadline = Instant::now() + Duration::from_secs(30);
        while !readable {
            // The bytes still on their way: an event's round reads them.
            assert!(Instant::now() < deadline, "the bytes never came");
            std::thread::yield_now();
            assert_eq!(b.progress_round(|r| readable = r.readable), Round::Made);
        }
        assert!(
            crate::io::counters()
                .rounds_owed
                .load(std::sync::atomic::Ordering::Relaxed)
                >= 2
        );
    }

    /// A round made on an event pays the round owed: the timer's entry is
    /// due at once, and its pass makes no round and ends it.
    #[test]
    fn a_round_made_on_an_event_pays_the_owed_one() {
        let (_a, b) = pair();
        let b = Arc::new(b);
        let held = b.st.lock().unwrap();
        let r = apart({
            let b = b.clone();
            move || b.progress_round(|_| {})
        });
        assert_eq!(r, Round::Owed { time_it: true });
        drop(held);
        assert_eq!(b.progress_round(|_| {}), Round::Made);
        let told = b
            .owed_due()
            .expect("the paid round's timer entry is not told");
        assert!(
            told <= Instant::now(),
            "the paid round's entry is not due at once"
        );
        assert!(!b.owed_round(Instant::now(), |_| panic!("a round paid was made again")));
        assert_eq!(b.owed_due(), None, "the entry was told and still owed");
    }
}
