//! Connection phases: set-up, retry with back-off, give-up (fallback), the
//! accepted side's preamble and source-port proof deadline, and the
//! connecting side's proof re-sends, as a state machine with time passed
//! in.
//!
//! ## The source-port proof
//!
//! A connecting socket claims its UDP port in the preamble; the accepting
//! side delivers nothing from the connection until the claim is proved. Its
//! hello carries a fresh nonce, and the connector sends that nonce back in
//! a proof datagram *by kernel UDP, from the claimed port*, to the
//! acceptor's UDP port; the acceptor checks that the datagram's source is
//! the connection's TCP peer address with the claimed port. So only a
//! process holding the UDP socket of that address and port (exactly whoever
//! could send kernel UDP datagrams from it) gets datagrams delivered as
//! coming from it. The acceptor answers with a control frame
//! ([`super::frame::CTRL_PROVEN`]); until then the connector re-sends the
//! proof (UDP may be lost) at growing intervals, a bounded number of
//! times.
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
    /// Accepted: preamble read, waiting for the proof of its port (nothing
    /// is delivered yet).
    AwaitProof,
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
    /// Close an accepted connection whose preamble or proof did not
    /// arrive in time.
    Close,
    /// Send the source-port proof datagram (again).
    SendProof,
}

/// First wait before the proof datagram is sent again; each later wait is
/// four times the one before.
pub(crate) const PROOF_RESEND_FIRST: Duration = Duration::from_millis(100);
/// Proof datagrams sent at most (the first included): at 0, 0.1, 0.5 and
/// 2.1 s after the hello.
pub(crate) const PROOF_SENDS: u32 = 4;
/// How long after the proof the acceptor still recognises (and drops)
/// re-sent copies of it: longer than the whole re-send schedule.
pub(crate) const PROOF_LINGER: Duration = Duration::from_secs(3);

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
    /// Connector: when the proof is due again (until the acceptor's
    /// answer), and how many were sent.
    proof_due: Option<Instant>,
    proofs_sent: u32,
    /// Connector: the proof was sent and not answered yet.
    unanswered: bool,
}

impl Setup {
    /// An outgoing connection: its first attempt is due now.
    pub(crate) fn outgoing(now: Instant) -> Self {
        Self {
            phase: Phase::Backoff,
            attempts: 0,
            deadline: Some(now),
            proof_due: None,
            proofs_sent: 0,
            unanswered: false,
        }
    }

    /// An accepted connection (hello sent): the preamble is due within
    /// the timeout.
    pub(crate) fn accepted(now: Instant, t: &Timing) -> Self {
        Self {
            phase: Phase::AwaitPreamble,
            attempts: 0,
            deadline: Some(now + t.preamble_timeout),
            proof_due: None,
            proofs_sent: 0,
            unanswered: false,
        }
    }

    /// The current phase.
    pub(crate) fn phase(&self) -> Phase {
        self.phase
    }

    /// When [`Setup::on_timer`] is next due (`None`: no timer needed).
    pub(crate) fn deadline(&self) -> Option<Instant> {
        match (self.deadline, self.proof_due) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
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
        self.phase == Phase::Dead || (self.phase == Phase::Established && self.proof_due.is_none())
    }

    /// Whether datagrams from the connection may be delivered.
    pub(crate) fn delivering(&self) -> bool {
        self.phase == Phase::Established
    }

    /// The readiness that would answer the current wait: only for the
    /// connecting side, where a timeout taken late would wrongly fall back
    /// (an accepted connection's deadline is strict: a peer trickling bytes
    /// must not keep it open).
    pub(crate) fn awaited(&self) -> Awaited {
        match self.phase {
            Phase::Connecting => Awaited::Writable,
            Phase::AwaitHello => Awaited::Readable,
            _ => Awaited::Nothing,
        }
    }

    /// The deadline may have passed.
    pub(crate) fn on_timer(&mut self, now: Instant, t: &Timing) -> Step {
        if self.timers_done() {
            return Step::Wait;
        }
        if self.proof_due.is_some_and(|d| d <= now) {
            return self.proof_sent(now);
        }
        if self.deadline.is_none_or(|d| d > now) {
            return Step::Wait;
        }
        match self.phase {
            Phase::Backoff if self.attempts > t.retries => Step::GiveUp(GiveUp::Exhausted),
            Phase::Backoff => Step::Connect,
            Phase::Connecting => Step::ConnectTimedOut,
            Phase::AwaitHello => Step::GiveUp(GiveUp::NotWarpsock),
            Phase::AwaitPreamble | Phase::AwaitProof => Step::Close,
            Phase::Established | Phase::Dead => Step::Wait,
        }
    }

    /// Connector: the hello asked for the proof; established now (data
    /// flows), with the proof to send at once and again until answered.
    /// Returns [`Step::SendProof`].
    pub(crate) fn prove(&mut self, now: Instant) -> Step {
        self.established();
        self.proofs_sent = 0;
        self.unanswered = true;
        self.proof_sent(now)
    }

    /// Connector: whether the acceptor's answer to the proof is still to
    /// come (it must be read even by a program that never receives: a TCP
    /// socket closed with unread input is reset, and loses what it had not
    /// sent yet).
    pub(crate) fn unanswered(&self) -> bool {
        self.unanswered
    }

    /// Counts a proof datagram sent now; schedules the next one.
    fn proof_sent(&mut self, now: Instant) -> Step {
        self.proofs_sent += 1;
        self.proof_due = (self.proofs_sent < PROOF_SENDS)
            .then(|| now + PROOF_RESEND_FIRST * 4u32.pow(self.proofs_sent - 1));
        Step::SendProof
    }

    /// Connector: the acceptor saw the proof.
    pub(crate) fn proven(&mut self) {
        self.proof_due = None;
        self.unanswered = false;
    }

    /// Acceptor: the preamble arrived; `proved` says whether the proof of
    /// its port did already (the datagram can overtake the preamble).
    pub(crate) fn preamble(&mut self, proved: bool) {
        if proved {
            self.established();
        } else {
            self.phase = Phase::AwaitProof;
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

    /// The hello (outgoing) arrived without asking for a proof, or the
    /// proof (accepted) did.
    pub(crate) fn established(&mut self) {
        self.phase = Phase::Established;
        self.deadline = None;
    }

    /// The connection is closed.
    pub(crate) fn dead(&mut self) {
        self.phase = Phase::Dead;
        self.deadline = None;
        self.proof_due = None;
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

    /// An outgoing connection whose TCP connect completed at `at`.
    fn connected(t0: Instant, at: Instant, t: &Timing) -> Setup {
        let mut s = Setup::outgoing(t0);
        assert_eq!(s.on_timer(t0, t), Step::Connect);
        s.connect_started(t0, t);
        s.connected(at, t);
        s
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
        let mut s = connected(t0, t0 + MS, &t);
        assert_eq!(s.awaited(), Awaited::Readable);
        let (now, step) = fire(&mut s, &t);
        assert_eq!(now, t0 + 501 * MS);
        assert_eq!(step, Step::GiveUp(GiveUp::NotWarpsock));
    }

    #[test]
    fn established_needs_no_timer() {
        let t = timing();
        let t0 = Instant::now();
        let mut s = connected(t0, t0, &t);
        s.established();
        assert!(s.timers_done() && s.deadline().is_none() && !s.setting_up());
        assert_eq!(s.on_timer(t0 + 3600 * 1000 * MS, &t), Step::Wait);
    }

    #[test]
    fn connector_resends_the_proof_until_answered_a_bounded_number_of_times() {
        let t = timing();
        let t0 = Instant::now();
        let mut s = connected(t0, t0, &t);
        assert_eq!(s.prove(t0), Step::SendProof);
        assert!(s.delivering(), "data flows while the proof is pending");
        assert!(!s.timers_done());
        let mut sent = vec![t0];
        while let Some(d) = s.deadline() {
            assert_eq!(s.on_timer(d, &t), Step::SendProof);
            sent.push(d);
        }
        assert_eq!(sent.len(), PROOF_SENDS as usize);
        let gaps: Vec<u128> = sent.windows(2).map(|w| (w[1] - w[0]).as_millis()).collect();
        assert_eq!(gaps, [100, 400, 1600]);
        assert!(sent[3] - sent[0] < PROOF_LINGER);
        assert!(s.timers_done());
        // Answered after the second: no more.
        let mut s = Setup::outgoing(t0);
        s.prove(t0);
        let d = s.deadline().unwrap();
        s.on_timer(d, &t);
        s.proven();
        assert!(s.timers_done() && s.deadline().is_none());
        assert!(!s.unanswered());
    }

    #[test]
    fn acceptor_delivers_only_after_the_proof_whichever_comes_first() {
        let t = timing();
        let t0 = Instant::now();
        let mut s = Setup::accepted(t0, &t);
        s.preamble(false);
        assert_eq!(s.phase(), Phase::AwaitProof);
        assert!(!s.delivering());
        assert_eq!(s.on_timer(t0 + 1999 * MS, &t), Step::Wait);
        assert_eq!(fire(&mut s, &t).1, Step::Close, "no proof in time");
        let mut s = Setup::accepted(t0, &t);
        s.preamble(false);
        s.established();
        assert!(s.delivering() && s.timers_done());
        let mut s = Setup::accepted(t0, &t);
        s.preamble(true);
        assert!(s.delivering(), "the proof overtook the preamble");
    }

    #[test]
    fn accepted_connection_must_send_its_preamble_in_time() {
        let t = timing();
        let t0 = Instant::now();
        let mut s = Setup::accepted(t0, &t);
        assert_eq!(s.awaited(), Awaited::Nothing);
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
