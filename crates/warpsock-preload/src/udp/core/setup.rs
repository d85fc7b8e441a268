//! Connection phases: set-up, retry with back-off, give-up (fallback) and
//! the accepted side's preamble deadline, as a state machine with time
//! passed in.
//!
//! The driver (`crate::udp::conn`) owns the socket. It asks [`Setup`] what to
//! do after each event (`connect_started`, `connected`, `failed`, the hello
//! or preamble parsed) and when [`Setup::deadline`] passes
//! ([`Setup::on_timer`]), and carries out the returned [`Step`]. Because a
//! timer can run late (the thread was descheduled after the answer arrived),
//! the driver first checks [`Setup::awaited`] readiness and handles that
//! event instead of the timeout.

use std::time::{Duration, Instant};

/// Set-up timing (from the configuration).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Timing {
    /// Attempts after the first before giving up (`WARPSOCK_RETRIES`).
    pub(crate) retries: u32,
    /// Back-off before the first retry; doubles per retry (`WARPSOCK_RETRY_MS`).
    pub(crate) retry_base: Duration,
    /// A connect attempt's bound (`WARPSOCK_CONNECT_TIMEOUT_MS`).
    pub(crate) connect_timeout: Duration,
    /// The acceptor's hello must arrive within this (`WARPSOCK_HELLO_TIMEOUT_MS`).
    pub(crate) hello_timeout: Duration,
    /// An accepted connection's preamble must arrive within this
    /// (`WARPSOCK_PREAMBLE_TIMEOUT_MS`).
    pub(crate) preamble_timeout: Duration,
}

/// Where a connection stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Phase {
    /// Outgoing: waiting before the next attempt (or the first one).
    Backoff,
    /// Outgoing: non-blocking connect in progress.
    Connecting,
    /// Outgoing: connected, waiting for the peer's hello.
    AwaitHello,
    /// Accepted: hello sent, waiting for the peer's preamble.
    AwaitPreamble,
    /// Carrying datagrams both ways.
    Established,
    /// Closed; its descriptor is gone.
    Dead,
}

/// Why an outgoing connection gave up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum GiveUp {
    /// Every attempt failed (refused, unreachable, timed out).
    Exhausted,
    /// Something accepted TCP but did not answer as warpsock in time.
    NotWarpsock,
}

/// What the driver does next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Step {
    /// Nothing now.
    Wait,
    /// Start a non-blocking connect now, then report `connect_started`
    /// (or `failed`).
    Connect,
    /// The connect attempt took too long: report `failed`.
    ConnectTimedOut,
    /// The attempt failed and another follows after the back-off; meanwhile
    /// the destination is served by kernel UDP.
    Retry,
    /// Close the connection and fall back to kernel UDP for the destination.
    GiveUp(GiveUp),
    /// Close an accepted connection whose preamble did not arrive in time.
    Close,
}

/// Readiness that answers the current wait.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Awaited {
    /// Nothing (not waiting on the socket).
    Nothing,
    /// The connect completes (writable).
    Writable,
    /// The hello or preamble arrives (readable).
    Readable,
}

/// The set-up state of one connection.
#[derive(Clone, Debug)]
pub(crate) struct Setup {
    phase: Phase,
    attempts: u32,
    deadline: Option<Instant>,
}

impl Setup {
    /// An outgoing connection: its first attempt is due now.
    pub(crate) fn outgoing(now: Instant) -> Self {
        Self {
            phase: Phase::Backoff,
            attempts: 0,
            deadline: Some(now),
        }
    }

    /// An accepted connection (hello sent): the preamble is due within
    /// the timeout.
    pub(crate) fn accepted(now: Instant, t: &Timing) -> Self {
        Self {
            phase: Phase::AwaitPreamble,
            attempts: 0,
            deadline: Some(now + t.preamble_timeout),
        }
    }

    /// The current phase.
    pub(crate) fn phase(&self) -> Phase {
        self.phase
    }

    /// When [`Setup::on_timer`] is next due (`None`: no timer needed).
    pub(crate) fn deadline(&self) -> Option<Instant> {
        self.deadline
    }

    /// Whether an earlier attempt failed and the connection is not up: the
    /// destination's datagrams go by kernel UDP meanwhile.
    pub(crate) fn retrying(&self) -> bool {
        self.attempts > 0
            && matches!(
                self.phase,
                Phase::Backoff | Phase::Connecting | Phase::AwaitHello
            )
    }

    /// Whether data handed to the connection waits for the set-up.
    pub(crate) fn setting_up(&self) -> bool {
        matches!(
            self.phase,
            Phase::Backoff | Phase::Connecting | Phase::AwaitHello
        )
    }

    /// Whether the connection no longer needs timers.
    pub(crate) fn timers_done(&self) -> bool {
        matches!(self.phase, Phase::Established | Phase::Dead)
    }

    /// The readiness that would answer the current wait.
    pub(crate) fn awaited(&self) -> Awaited {
        match self.phase {
            Phase::Connecting => Awaited::Writable,
            Phase::AwaitHello | Phase::AwaitPreamble => Awaited::Readable,
            _ => Awaited::Nothing,
        }
    }

    /// The deadline may have passed.
    pub(crate) fn on_timer(&mut self, now: Instant, t: &Timing) -> Step {
        if self.timers_done() || self.deadline.is_none_or(|d| d > now) {
            return Step::Wait;
        }
        match self.phase {
            Phase::Backoff if self.attempts > t.retries => Step::GiveUp(GiveUp::Exhausted),
            Phase::Backoff => Step::Connect,
            Phase::Connecting => Step::ConnectTimedOut,
            Phase::AwaitHello => Step::GiveUp(GiveUp::NotWarpsock),
            Phase::AwaitPreamble => Step::Close,
            Phase::Established | Phase::Dead => Step::Wait,
        }
    }

    /// A connect attempt is under way.
    pub(crate) fn connect_started(&mut self, now: Instant, t: &Timing) {
        self.phase = Phase::Connecting;
        self.deadline = Some(now + t.connect_timeout);
    }

    /// The attempt failed (refused, unreachable, reset, timed out): back
    /// off exponentially, or give up once the retries are spent.
    pub(crate) fn failed(&mut self, now: Instant, t: &Timing) -> Step {
        self.attempts += 1;
        if self.attempts > t.retries {
            return Step::GiveUp(GiveUp::Exhausted);
        }
        self.phase = Phase::Backoff;
        let shift = (self.attempts - 1).min(16);
        self.deadline = Some(now + t.retry_base * (1u32 << shift));
        Step::Retry
    }

    /// TCP is connected: the acceptor's hello is due.
    pub(crate) fn connected(&mut self, now: Instant, t: &Timing) {
        self.phase = Phase::AwaitHello;
        self.deadline = Some(now + t.hello_timeout);
    }

    /// The hello (outgoing) or the preamble (accepted) arrived.
    pub(crate) fn established(&mut self) {
        self.phase = Phase::Established;
        self.deadline = None;
    }

    /// The connection is closed.
    pub(crate) fn dead(&mut self) {
        self.phase = Phase::Dead;
        self.deadline = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn timing() -> Timing {
        Timing {
            retries: 3,
            retry_base: 10 * MS,
            connect_timeout: 1000 * MS,
            hello_timeout: 500 * MS,
            preamble_timeout: 2000 * MS,
        }
    }

    /// Runs the timer at `now` after jumping to the deadline.
    fn fire(s: &mut Setup, t: &Timing) -> (Instant, Step) {
        let now = s.deadline().expect("a deadline");
        (now, s.on_timer(now, t))
    }

    #[test]
    fn refused_attempts_back_off_exponentially_then_give_up() {
        let t = timing();
        let t0 = Instant::now();
        let mut s = Setup::outgoing(t0);
        assert_eq!(s.on_timer(t0, &t), Step::Connect, "first attempt at once");
        s.connect_started(t0, &t);
        assert!(!s.retrying());
        // Refused at once, three times: back-off 10, 20, 40 ms.
        let mut now = t0;
        for (i, wait) in [10u32, 20, 40].into_iter().enumerate() {
            assert_eq!(s.failed(now, &t), Step::Retry, "attempt {i}");
            assert!(s.retrying());
            assert_eq!(s.deadline(), Some(now + wait * MS));
            assert_eq!(s.on_timer(now + (wait - 1) * MS, &t), Step::Wait, "early");
            let (n, step) = fire(&mut s, &t);
            assert_eq!(step, Step::Connect);
            now = n;
            s.connect_started(now, &t);
        }
        assert_eq!(s.failed(now, &t), Step::GiveUp(GiveUp::Exhausted));
    }

    #[test]
    fn connect_timeout_counts_as_a_failure() {
        let t = timing();
        let t0 = Instant::now();
        let mut s = Setup::outgoing(t0);
        s.on_timer(t0, &t);
        s.connect_started(t0, &t);
        assert_eq!(s.awaited(), Awaited::Writable);
        assert_eq!(s.on_timer(t0 + 999 * MS, &t), Step::Wait);
        let (now, step) = fire(&mut s, &t);
        assert_eq!(now, t0 + 1000 * MS);
        assert_eq!(step, Step::ConnectTimedOut);
        assert_eq!(s.failed(now, &t), Step::Retry);
        assert_eq!(s.phase(), Phase::Backoff);
        assert_eq!(s.deadline(), Some(now + 10 * MS));
    }

    #[test]
    fn silent_acceptor_is_not_warpsock() {
        let t = timing();
        let t0 = Instant::now();
        let mut s = Setup::outgoing(t0);
        s.on_timer(t0, &t);
        s.connect_started(t0, &t);
        s.connected(t0 + MS, &t);
        assert_eq!(s.awaited(), Awaited::Readable);
        let (now, step) = fire(&mut s, &t);
        assert_eq!(now, t0 + 501 * MS);
        assert_eq!(step, Step::GiveUp(GiveUp::NotWarpsock));
    }

    #[test]
    fn established_needs_no_timer() {
        let t = timing();
        let t0 = Instant::now();
        let mut s = Setup::outgoing(t0);
        s.on_timer(t0, &t);
        s.connect_started(t0, &t);
        s.connected(t0, &t);
        s.established();
        assert!(s.timers_done() && s.deadline().is_none() && !s.setting_up());
        assert_eq!(s.on_timer(t0 + 3600 * 1000 * MS, &t), Step::Wait);
    }

    #[test]
    fn accepted_connection_must_send_its_preamble_in_time() {
        let t = timing();
        let t0 = Instant::now();
        let mut s = Setup::accepted(t0, &t);
        assert_eq!(s.awaited(), Awaited::Readable);
        assert!(
            !s.setting_up(),
            "nothing of ours waits on an accepted connection"
        );
        assert_eq!(s.on_timer(t0 + 1999 * MS, &t), Step::Wait);
        assert_eq!(fire(&mut s, &t).1, Step::Close);
        let mut ok = Setup::accepted(t0, &t);
        ok.established();
        assert_eq!(ok.on_timer(t0 + 5000 * MS, &t), Step::Wait);
    }
}
