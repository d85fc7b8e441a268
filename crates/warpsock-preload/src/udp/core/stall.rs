//! How long a blocking send may wait for room on a full connection.
//!
//! Waiting is what gives a live but slower receiver back-pressure instead
//! of loss; a peer that stops reading must not turn it into a freeze.
//! Two bounds:
//!
//! * **Per connection** ([`STALL`]): a send waits at most until the
//!   connection's peer made no progress (the kernel took none of its
//!   bytes) for `STALL`; from then on every datagram to it is dropped at
//!   once, as kernel UDP drops what a full path cannot take.
//! * **Per socket** ([`StallBudget`]): a send that has waited [`GRACE`],
//!   or waits on a connection whose peer made no progress for `GRACE`, is
//!   a *stall*, charged whole (its first `GRACE` included) to a budget of
//!   `STALL`, refilled at `STALL` per [`WINDOW`]. A wait goes on only
//!   while the budget covers it (at least `GRACE` left before it is a
//!   stall, anything once it is); otherwise a send that finds any
//!   connection full drops the datagram at once (`tx_stall_budget_drops`).
//!   Without it, N connections that ask for replies and never read,
//!   stalled one after another, froze a single-threaded program for
//!   N × `STALL` (issue 13), and a peer that read a few bytes every few
//!   seconds could hold it for as long as it went on; with it, for `STALL` at once and `STALL`
//!   per `WINDOW` in the long run, however many peers do it.
//!
//! A receiver that keeps making room within `GRACE` costs nothing: it
//! keeps its back-pressure (iperf's zero loss).

use std::time::{Duration, Instant};

/// A send waits at most this long since its connection's peer last made
/// progress. Long enough that a live receiver on a loaded machine is not
/// taken for one that stopped.
pub(crate) const STALL: Duration = Duration::from_secs(5);

/// A send waiting this long, or on a peer that made no progress for this
/// long, is a stall, charged to the socket's budget from its start.
pub(crate) const GRACE: Duration = Duration::from_secs(1);

/// The budget refills at `STALL` per this long (at most one twelfth of the
/// time blocked on stalled peers, in the long run).
pub(crate) const WINDOW: Duration = Duration::from_secs(60);

/// What a send that found its connection full does next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Full {
    /// Wait for room (then ask again).
    Wait,
    /// Drop the datagram: this connection made no progress for `STALL`.
    Stalled,
    /// Drop the datagram: the socket's budget for stalls is spent.
    Spent,
}

/// One socket's budget of time waiting on stalled connections.
#[derive(Debug)]
pub(crate) struct StallBudget {
    /// Budget left in nanoseconds (negative: owed; a stall is charged as
    /// it is seen, so the last one may overdraw).
    left: i128,
    /// When `left` was last refilled.
    at: Instant,
}

/// One blocking send's wait: when it began, and how much of it is
/// already charged.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Waiting {
    since: Instant,
    charged: Instant,
}

impl Waiting {
    /// A send that starts waiting at `now`.
    pub(crate) fn new(now: Instant) -> Self {
        Self {
            since: now,
            charged: now,
        }
    }
}

fn nanos(d: Duration) -> i128 {
    d.as_nanos() as i128
}

impl StallBudget {
    /// A full budget.
    pub(crate) fn new(now: Instant) -> Self {
        Self {
            left: nanos(STALL),
            at: now,
        }
    }

    fn refill(&mut self, now: Instant) {
        let dt = now.saturating_duration_since(self.at);
        self.at = now.max(self.at);
        let gain = nanos(dt) * nanos(STALL) / nanos(WINDOW);
        self.left = (self.left + gain).min(nanos(STALL));
    }

    /// A send finds its connection full at `now` (again, after a wait, or
    /// for the first time: `w` fresh); the connection's peer last made
    /// progress at `progress`. Charges the wait so far if it is a stall
    /// and says whether to go on waiting.
    pub(crate) fn full(&mut self, w: &mut Waiting, now: Instant, progress: Instant) -> Full {
        let idle = now.saturating_duration_since(progress);
        let waited = now.saturating_duration_since(w.since);
        self.refill(now);
        let stall = idle >= GRACE || waited >= GRACE;
        if stall {
            // Charged whole, from the start of this send's wait (the part
            // before GRACE too).
            self.left -= nanos(now.saturating_duration_since(w.charged));
            w.charged = now.max(w.charged);
        }
        if idle >= STALL {
            Full::Stalled
        } else if self.left <= 0 || (!stall && self.left < nanos(GRACE)) {
            // A wait not yet a stall goes on only if the budget covers
            // what it is charged should it become one.
            Full::Spent
        } else {
            Full::Wait
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SLICE: Duration = Duration::from_millis(100);

    /// A send on a connection whose peer last progressed at `progress`,
    /// polling every `SLICE` from `now` as the driver does; returns the
    /// verdict and when it came.
    fn send(b: &mut StallBudget, now: Instant, progress: Instant) -> (Full, Instant) {
        let mut w = Waiting::new(now);
        let mut t = now;
        loop {
            match b.full(&mut w, t, progress) {
                Full::Wait => t += SLICE,
                f => return (f, t),
            }
        }
    }

    #[test]
    fn one_stalled_peer_waits_stall_since_its_progress() {
        let t0 = Instant::now();
        let mut b = StallBudget::new(t0);
        let (f, t) = send(&mut b, t0, t0);
        assert_eq!((f, t - t0), (Full::Stalled, STALL));
        // Later datagrams to it drop at once.
        assert_eq!(send(&mut b, t, t0), (Full::Stalled, t));
    }

    #[test]
    fn many_stalled_peers_one_after_another_cost_one_stall() {
        let t0 = Instant::now();
        let mut b = StallBudget::new(t0);
        let mut t = t0;
        let mut blocked = Duration::ZERO;
        for _ in 0..8 {
            // Each fills (progress) just as the previous one is dropped.
            let (_, end) = send(&mut b, t, t);
            blocked += end - t;
            t = end + Duration::from_millis(1);
        }
        assert_eq!(blocked, STALL, "not 8 x STALL");
        // And a fresh one drops at once too (full, budget spent).
        assert_eq!(send(&mut b, t, t), (Full::Spent, t));
    }

    #[test]
    fn a_slow_reader_keeps_its_back_pressure() {
        let t0 = Instant::now();
        let mut b = StallBudget::new(t0);
        // Ten minutes of sends, each waiting for the room the peer's next
        // read makes, 900 ms later.
        let mut t = t0;
        while t < t0 + Duration::from_secs(600) {
            let (progress, room) = (t, t + Duration::from_millis(900));
            let mut w = Waiting::new(t);
            while t < room {
                assert_eq!(b.full(&mut w, t, progress), Full::Wait, "at {:?}", t - t0);
                t += SLICE;
            }
        }
    }

    #[test]
    fn a_trickling_reader_is_charged_too() {
        let t0 = Instant::now();
        let mut b = StallBudget::new(t0);
        // For a window, a program sends every 10 ms to a peer that takes a
        // few bytes every 900 ms and a datagram's room every 2.7 s:
        // progress, but each send waits past GRACE.
        let mut t = t0;
        let (mut blocked, mut dropped) = (Duration::ZERO, 0);
        while t < t0 + WINDOW {
            let start = t;
            let mut w = Waiting::new(t);
            loop {
                let k = ((t - t0).as_millis() / 900) as u32;
                let progress = t0 + Duration::from_millis(900) * k;
                if t - start >= Duration::from_millis(2700) {
                    break; // room: sent
                }
                match b.full(&mut w, t, progress) {
                    Full::Wait => t += SLICE,
                    f => {
                        assert_eq!(f, Full::Spent);
                        dropped += 1;
                        break;
                    }
                }
            }
            blocked += t - start;
            t += Duration::from_millis(10);
        }
        // The budget and what a window refills (and the last slice of the
        // few sends that got room), not a window's worth.
        assert!(blocked <= STALL * 2 + GRACE, "{blocked:?}");
        assert!(dropped > 1000, "{dropped}");
    }

    #[test]
    fn the_budget_refills_over_the_window() {
        let t0 = Instant::now();
        let mut b = StallBudget::new(t0);
        let (_, t) = send(&mut b, t0, t0);
        assert_eq!(send(&mut b, t, t), (Full::Spent, t));
        // Half a window later, half a STALL of budget more: a stall that
        // long (and the refill while it lasts), then spent again.
        let t1 = t + WINDOW / 2;
        let (f, end) = send(&mut b, t1, t1);
        assert_eq!(f, Full::Spent);
        let d = end - t1;
        assert!(d > STALL / 2 && d < STALL / 2 + GRACE, "{d:?}");
        assert_eq!(send(&mut b, end, end), (Full::Spent, end));
        // Many windows of nothing: the whole budget, not more.
        let t2 = end + WINDOW * 3;
        assert_eq!(send(&mut b, t2, t2), (Full::Stalled, t2 + STALL));
    }

    #[test]
    fn a_pause_shorter_than_grace_costs_nothing() {
        let t0 = Instant::now();
        let mut b = StallBudget::new(t0);
        // A thousand 900 ms pauses, each ended by progress.
        let mut t = t0;
        for _ in 0..1000 {
            let mut w = Waiting::new(t);
            for k in 0..9 {
                assert_eq!(b.full(&mut w, t + SLICE * k, t), Full::Wait);
            }
            t += Duration::from_millis(900);
        }
        // The budget is whole: one stalled peer still gets its STALL.
        assert_eq!(send(&mut b, t, t), (Full::Stalled, t + STALL));
    }
}
