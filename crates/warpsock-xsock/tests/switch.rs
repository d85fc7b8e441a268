//! The switch protocol against a model of TCP with urgent data (one urgent
//! byte marks a position; ordinary reads skip it and stop at it), with
//! simulated time. Two programs write bytes, then call `setsockopt` at
//! given times (or never: a peer without warpsock), then go on. Every
//! combination of timings must end in one of two ways: both ends switched
//! (each read the other's MPA frame right after the other's mark), or both
//! are plain TCP and each program read exactly the bytes the other wrote,
//! in order, whatever the switch attempts did.

use std::time::{Duration, Instant};

use warpsock_xsock::switch::{
    classify_request, Limits, Request, Role, Step, Switch, SwitchError, BUSY, MARK, MPA_REQ_KEY,
};
use warpsock_xsock::wire::Hello;

/// One direction of a TCP connection: bytes with an urgent flag.
#[derive(Debug, Default)]
struct Dir {
    bytes: Vec<(u8, bool)>,
    /// Arrival time of each byte (ms).
    at: Vec<u64>,
    /// Next byte the receiver reads.
    pos: usize,
}

impl Dir {
    fn push(&mut self, now: u64, delay: u64, data: &[u8], urgent: bool) {
        for &b in data {
            self.bytes.push((b, urgent));
            self.at.push(now + delay);
        }
    }
    fn arrived(&self, now: u64) -> usize {
        self.at.partition_point(|&t| t <= now)
    }
    /// Ordinary read of everything arrived (urgent bytes skipped).
    fn read_all(&mut self, now: u64) -> Vec<u8> {
        let end = self.arrived(now);
        let out = self.bytes[self.pos..end]
            .iter()
            .filter(|(_, u)| !u)
            .map(|(b, _)| *b)
            .collect();
        self.pos = end;
        out
    }
    /// Reads up to the next urgent byte; returns the bytes and whether the
    /// read position is now at an (arrived) urgent byte.
    fn read_to_mark(&mut self, now: u64) -> (Vec<u8>, Option<u8>) {
        let end = self.arrived(now);
        let mut out = Vec::new();
        while self.pos < end {
            let (b, u) = self.bytes[self.pos];
            if u {
                return (out, Some(b));
            }
            out.push(b);
            self.pos += 1;
        }
        (out, None)
    }
    /// Ordinary bytes arrived ahead of the next urgent byte, not consumed.
    fn ahead_of_mark(&self, now: u64) -> usize {
        self.bytes[self.pos..self.arrived(now).max(self.pos)]
            .iter()
            .take_while(|(_, u)| !u)
            .count()
    }
    /// Bytes after the urgent byte at the read position, not consumed.
    fn peek_after_mark(&self, now: u64) -> Vec<u8> {
        let end = self.arrived(now);
        self.bytes[self.pos + 1..end.max(self.pos + 1)]
            .iter()
            .filter(|(_, u)| !u)
            .map(|(b, _)| *b)
            .collect()
    }
    /// Consumes the urgent byte at the read position and `n` bytes after.
    fn consume_after_mark(&mut self, n: usize) {
        self.pos += 1 + n;
    }
}

fn mpa_request() -> Vec<u8> {
    let hello = Hello {
        slots: 16,
        slot_size: 65536,
    }
    .encode();
    let mut b = MPA_REQ_KEY.to_vec();
    b.extend_from_slice(&[0x50, 2]);
    b.extend_from_slice(&(4 + hello.len() as u16).to_be_bytes());
    b.extend_from_slice(&[0, 16, 0, 16]);
    b.extend_from_slice(&hello);
    b
}

const REPLY: &[u8] = b"MPA ID Rep Frame";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Pending,
    Switched,
    Plain,
    /// Committed, then found the peer did not follow: the connection is
    /// reset (never silently wrong).
    Broken,
}

struct Prog {
    role: Role,
    /// When the program calls setsockopt (None: never; no warpsock).
    switch_at: Option<u64>,
    pre: Vec<u8>,
    post: Vec<u8>,
    sw: Option<Switch>,
    outcome: Outcome,
    read: Vec<u8>,
    residue: Vec<u8>,
    wrote_post: bool,
    /// Initiator after Connect: waiting for the Reply.
    awaiting_reply: bool,
    /// The program is stopped (e.g. SIGSTOP) between these times.
    stopped: Option<(u64, u64)>,
    /// Responder that gave up waiting for the Request: it watches the
    /// position behind the initiator's mark.
    watch: bool,
}

impl Prog {
    fn new(role: Role, switch_at: Option<u64>, pre: usize, post: usize, seed: u8) -> Self {
        Self {
            role,
            switch_at,
            pre: (0..pre)
                .map(|i| (i as u8).wrapping_mul(31) ^ seed)
                .collect(),
            post: (0..post)
                .map(|i| (i as u8).wrapping_mul(17) ^ seed ^ 0x55)
                .collect(),
            sw: None,
            outcome: Outcome::Pending,
            read: Vec::new(),
            residue: Vec::new(),
            wrote_post: false,
            awaiting_reply: false,
            stopped: None,
            watch: false,
        }
    }
}

const DELAY: u64 = 1;

struct Sim {
    base: Instant,
    limits: Limits,
}

impl Sim {
    fn t(&self, ms: u64) -> Instant {
        self.base + Duration::from_millis(ms)
    }

    /// One program's work at time `now`.
    fn tick(&self, p: &mut Prog, inb: &mut Dir, out: &mut Dir, now: u64) {
        if p.stopped.is_some_and(|(a, b)| now >= a && now < b) {
            return;
        }
        match p.outcome {
            Outcome::Switched | Outcome::Broken => return,
            Outcome::Plain => {
                if !p.wrote_post {
                    out.push(now, DELAY, &p.post, false);
                    p.wrote_post = true;
                }
                let r = std::mem::take(&mut p.residue);
                p.read.extend_from_slice(&r);
                if p.watch {
                    match classify_request(&inb.peek_after_mark(now)) {
                        Request::Undecided { .. } => return,
                        Request::NotWarpsock => p.watch = false,
                        Request::Warpsock(_) | Request::BadHello(_) => {
                            p.outcome = Outcome::Broken;
                            return;
                        }
                    }
                }
                let more = inb.read_all(now);
                p.read.extend_from_slice(&more);
                return;
            }
            Outcome::Pending => {}
        }
        if p.awaiting_reply {
            let (_, at) = inb.read_to_mark(now);
            if at.is_none() {
                return;
            }
            let after = inb.peek_after_mark(now);
            if after.len() < REPLY.len() {
                if after.len() == after.iter().zip(REPLY).take_while(|(a, b)| a == b).count() {
                    return;
                }
            } else if &after[..REPLY.len()] == REPLY {
                p.outcome = Outcome::Switched;
                return;
            }
            // The initiator's engine reads a non-Reply: EPROTO, reset.
            p.outcome = Outcome::Broken;
            return;
        }
        let Some(at) = p.switch_at else {
            // No warpsock: reads everything (urgent bytes are invisible).
            let more = inb.read_all(now);
            p.read.extend_from_slice(&more);
            if !p.wrote_post {
                out.push(now, DELAY, &p.post, false);
                p.wrote_post = true;
            }
            return;
        };
        if now < at {
            // Before it switches, the program does not read (so the peer's
            // bytes pile up as residue, the worst case).
            return;
        }
        let sw =
            p.sw.get_or_insert_with(|| Switch::new(p.role, self.limits, self.t(now)));
        loop {
            match sw.step() {
                Step::SendMark { .. } => {
                    out.push(now, DELAY, &[MARK], true);
                    sw.on_marked(self.t(now));
                }
                Step::AwaitMark { room: 0, .. } if inb.ahead_of_mark(now) > 0 => {
                    // Policy mode: left for the program.
                    sw.on_bytes_ahead(inb.ahead_of_mark(now));
                }
                Step::AwaitMark { .. } => {
                    let (bytes, mark) = inb.read_to_mark(now);
                    p.residue.extend_from_slice(&bytes);
                    sw.on_bytes(bytes.len(), self.t(now));
                    if matches!(sw.step(), Step::Failed(_)) {
                        continue;
                    }
                    match mark {
                        Some(b) => sw.on_mark(b),
                        None => {
                            sw.on_timeout(self.t(now));
                            if matches!(sw.step(), Step::AwaitMark { .. }) {
                                return;
                            }
                        }
                    }
                }
                Step::AwaitRequest { .. } => {
                    let b = inb.peek_after_mark(now);
                    sw.on_peek(&b);
                    if matches!(sw.step(), Step::AwaitRequest { .. }) {
                        sw.on_timeout(self.t(now));
                        if matches!(sw.step(), Step::AwaitRequest { .. }) {
                            return;
                        }
                    }
                }
                Step::Connect => {
                    out.push(now, DELAY, &mpa_request(), false);
                    p.awaiting_reply = true;
                    return;
                }
                Step::Accept(_) => {
                    inb.consume_after_mark(mpa_request().len());
                    out.push(now, DELAY, REPLY, false);
                    p.outcome = Outcome::Switched;
                    return;
                }
                Step::Reject(e) => panic!("unexpected reject: {e}"),
                Step::Failed(e) => {
                    assert!(
                        e.errno() == libc::ECONNREFUSED,
                        "a failed switch says ECONNREFUSED: {e}"
                    );
                    p.watch = matches!(e, SwitchError::NoRequest { .. });
                    p.outcome = Outcome::Plain;
                    return;
                }
            }
        }
    }
}

/// Runs two programs for 20 simulated seconds, 1 ms per tick.
fn run(limits: Limits, mut a: Prog, mut b: Prog) -> (Prog, Prog) {
    let sim = Sim {
        base: Instant::now(),
        limits,
    };
    let (mut ab, mut ba) = (Dir::default(), Dir::default());
    ab.push(0, DELAY, &a.pre, false);
    ba.push(0, DELAY, &b.pre, false);
    for now in 0..20_000 {
        sim.tick(&mut a, &mut ba, &mut ab, now);
        sim.tick(&mut b, &mut ab, &mut ba, now);
    }
    (a, b)
}

fn expect_consistent(a: &Prog, b: &Prog, what: &str) {
    // A program without warpsock is plain TCP throughout.
    let plain = |p: &Prog| match p.switch_at {
        None => Outcome::Plain,
        Some(_) => p.outcome,
    };
    match (plain(a), plain(b)) {
        (Outcome::Switched, Outcome::Switched) => {}
        (Outcome::Plain, Outcome::Plain) => {
            let mut want_a = b.pre.clone();
            want_a.extend_from_slice(&b.post);
            let mut want_b = a.pre.clone();
            want_b.extend_from_slice(&a.post);
            assert!(a.read == want_a, "{what}: a read the wrong bytes");
            assert!(b.read == want_b, "{what}: b read the wrong bytes");
        }
        other => panic!("{what}: inconsistent outcomes {other:?}"),
    }
}

const T: u64 = 2000;

fn limits() -> Limits {
    Limits::with_timeout(Duration::from_millis(T))
}

#[test]
fn every_timing_ends_switched_on_both_ends_or_plain_and_intact() {
    let times = [
        Some(0),
        Some(5),
        Some(700),
        Some(T - 3),
        Some(T + 3),
        Some(2 * T + 100),
        Some(5 * T),
        None,
    ];
    let sizes = [(0, 0), (1, 5), (30_000, 3), (3, 20_000)];
    let mut switched = 0;
    for ta in times {
        for tb in times {
            for (pa, pb) in sizes {
                let a = Prog::new(Role::Initiator, ta, pa, 10, 1);
                let b = Prog::new(Role::Responder, tb, pb, 20, 2);
                let what =
                    format!("initiator at {ta:?} ({pa} B before), responder at {tb:?} ({pb} B)");
                let (a, b) = run(limits(), a, b);
                expect_consistent(&a, &b, &what);
                if a.outcome == Outcome::Switched {
                    switched += 1;
                    // Both switched only if both asked within the timeout.
                    let (x, y) = (ta.unwrap(), tb.unwrap());
                    assert!(x.abs_diff(y) < T + 10, "{what}");
                }
                // Both asking within a second of each other always switches.
                if let (Some(x), Some(y)) = (ta, tb) {
                    if x.abs_diff(y) <= 700 {
                        assert_eq!(a.outcome, Outcome::Switched, "{what}");
                    }
                }
            }
        }
    }
    assert!(switched > 40);
}

#[test]
fn a_peer_without_warpsock_reads_exactly_what_was_written() {
    for role in [Role::Initiator, Role::Responder] {
        let other = match role {
            Role::Initiator => Role::Responder,
            Role::Responder => Role::Initiator,
        };
        let a = Prog::new(role, Some(10), 5000, 100, 3);
        let b = Prog::new(other, None, 7000, 100, 4);
        let (a, b) = run(limits(), a, b);
        assert_eq!((a.outcome, b.outcome), (Outcome::Plain, Outcome::Pending));
        let mut want = b.pre.clone();
        want.extend_from_slice(&b.post);
        assert!(a.read == want);
        let mut want = a.pre.clone();
        want.extend_from_slice(&a.post);
        assert!(b.read == want, "the plain peer never sees the mark");
    }
}

/// Policy mode: both switch before any byte; a plain peer that talks
/// first ends the attempt at once (no timeout wait).
#[test]
fn policy_mode_falls_back_at_the_first_plain_byte() {
    let mut l = limits();
    l.at_start = true;
    let a = Prog::new(Role::Initiator, Some(0), 0, 10, 5);
    let b = Prog::new(Role::Responder, Some(0), 0, 10, 6);
    let (a, b) = run(l, a, b);
    assert_eq!(
        (a.outcome, b.outcome),
        (Outcome::Switched, Outcome::Switched)
    );
    for role in [Role::Initiator, Role::Responder] {
        let mut sw = Switch::new(role, l, Instant::now());
        if role == Role::Initiator {
            sw.on_marked(Instant::now());
        }
        sw.on_bytes(3, Instant::now());
        assert_eq!(sw.step(), Step::Failed(SwitchError::PeerNotSwitching));
        // None is read: the bytes ahead of a mark are the program's.
        let mut sw = Switch::new(role, l, Instant::now());
        if role == Role::Initiator {
            sw.on_marked(Instant::now());
        }
        assert!(matches!(sw.step(), Step::AwaitMark { room: 0, .. }));
        sw.on_bytes_ahead(0);
        assert!(matches!(sw.step(), Step::AwaitMark { .. }));
        sw.on_bytes_ahead(3);
        assert_eq!(sw.step(), Step::Failed(SwitchError::PeerNotSwitching));
    }
}

/// The one case the timeouts cannot cover: the initiator is stopped for
/// longer than the responder's wait, inside the switch, after it saw the
/// responder's mark. It then fails loudly (its engine reads the peer's
/// plain bytes where the MPA Reply belongs and resets); it never delivers
/// a wrong byte.
#[test]
fn an_initiator_stopped_inside_the_switch_breaks_loudly() {
    let mut a = Prog::new(Role::Initiator, Some(0), 0, 10, 7);
    // Stopped from just after the responder's mark arrives until long
    // after the responder's 2T wait.
    a.stopped = Some((1, 3 * T + 500));
    let b = Prog::new(Role::Responder, Some(0), 0, 10, 8);
    let (a, b) = run(limits(), a, b);
    // The responder gave up having consumed nothing and watches; the
    // initiator, once running, commits and finds no Reply: both reset.
    assert_eq!((a.outcome, b.outcome), (Outcome::Broken, Outcome::Broken));
    assert!(b.read.is_empty(), "the late Request was never read as data");
}

#[test]
fn a_foreign_urgent_byte_or_bad_request_ends_the_switch() {
    let l = limits();
    let now = Instant::now();
    let mut sw = Switch::new(Role::Responder, l, now);
    sw.on_mark(b'!');
    assert_eq!(sw.step(), Step::Failed(SwitchError::ForeignUrgent(b'!')));
    let mut sw = Switch::new(Role::Responder, l, now);
    sw.on_mark(MARK);
    sw.on_marked(now);
    sw.on_peek(b"MPA ID");
    assert!(matches!(sw.step(), Step::AwaitRequest { want: 20, .. }));
    sw.on_peek(b"MPA ID Req Frame\x10\x02\x00\x14\0\0\0\0");
    assert!(matches!(sw.step(), Step::AwaitRequest { want: 40, .. }));
    // Not a warpsock hello: another MPA speaker's request is left alone.
    sw.on_peek(b"MPA ID Req Frame\x10\x02\x00\x14\0\0\0\0rdma-cm private data");
    assert_eq!(sw.step(), Step::Failed(SwitchError::NotARequest));
    // A warpsock hello of another version must be answered (rejected).
    let mut sw = Switch::new(Role::Responder, l, now);
    sw.on_mark(MARK);
    sw.on_marked(now);
    let mut req = mpa_request();
    req[20 + 4 + 4] = 9;
    sw.on_peek(&req);
    assert!(matches!(sw.step(), Step::Reject(_)));
    let mut sw = Switch::new(Role::Responder, l, now);
    sw.on_mark(MARK);
    sw.on_marked(now);
    sw.on_peek(b"GET / HTTP/1.1");
    assert_eq!(sw.step(), Step::Failed(SwitchError::NotARequest));
}

/// A mark that cannot be sent (a full send buffer) is given up at the
/// mark's deadline, the initiator's from its start, the responder's its
/// wait for the initiator's mark: `MarkUnsent`, `ECONNREFUSED`.
#[test]
fn a_mark_unsent_by_its_deadline_ends_the_switch() {
    let l = limits();
    let now = Instant::now();
    for role in [Role::Initiator, Role::Responder] {
        let mut sw = Switch::new(role, l, now);
        if role == Role::Responder {
            sw.on_mark(MARK);
        }
        let Step::SendMark { deadline } = sw.step() else {
            panic!("{role:?}: {:?}", sw.step());
        };
        assert_eq!(deadline, now + l.mark_timeout, "{role:?}");
        sw.on_timeout(deadline - Duration::from_millis(1));
        assert!(matches!(sw.step(), Step::SendMark { .. }), "not yet");
        sw.on_timeout(deadline);
        let Step::Failed(e) = sw.step() else {
            panic!("{role:?}: {:?}", sw.step());
        };
        assert_eq!(
            e,
            SwitchError::MarkUnsent {
                after: l.mark_timeout
            }
        );
        assert_eq!(e.errno(), libc::ECONNREFUSED);
    }
}

/// A responder with no room to switch answers the initiator's mark with
/// `BUSY`: the initiator ends its switch at once (`Busy`, `ECONNREFUSED`),
/// not at its mark timeout. From an initiator, `BUSY` is a foreign urgent
/// byte like any other.
#[test]
fn a_busy_responders_answer_ends_the_initiators_switch_at_once() {
    let l = limits();
    let now = Instant::now();
    let mut sw = Switch::new(Role::Initiator, l, now);
    assert!(matches!(sw.step(), Step::SendMark { .. }));
    sw.on_marked(now);
    assert!(matches!(sw.step(), Step::AwaitMark { .. }));
    sw.on_mark(BUSY);
    assert_eq!(sw.step(), Step::Failed(SwitchError::Busy));
    assert_eq!(SwitchError::Busy.errno(), libc::ECONNREFUSED);
    assert!(SwitchError::Busy.to_string().contains("no room"));
    let mut sw = Switch::new(Role::Responder, l, now);
    sw.on_mark(BUSY);
    assert_eq!(sw.step(), Step::Failed(SwitchError::ForeignUrgent(BUSY)));
}

/// A peer that writes on without marking ends the wait at the mark's
/// deadline even while its bytes keep coming (each read's `now` looked
/// at, not only an empty socket's wait), well before the residue's bound
/// (helper 68's review: a writer faster than the reader held the switch
/// until 64 MiB were read).
#[test]
fn bytes_that_keep_coming_end_the_wait_at_its_deadline() {
    let l = limits();
    let t0 = Instant::now();
    for role in [Role::Initiator, Role::Responder] {
        let mut sw = Switch::new(role, l, t0);
        if role == Role::Initiator {
            sw.on_marked(t0);
        }
        sw.on_bytes(1000, t0 + l.mark_timeout / 2);
        assert!(matches!(sw.step(), Step::AwaitMark { .. }), "{role:?}");
        sw.on_bytes(1000, t0 + l.mark_timeout * 2);
        assert_eq!(
            sw.step(),
            Step::Failed(SwitchError::NoPeer {
                after: l.mark_timeout
            }),
            "{role:?}"
        );
    }
}

#[test]
fn roles_come_from_the_addresses() {
    use warpsock_xsock::switch::role;
    let a = "127.0.0.1:5000".parse().unwrap();
    let b = "127.0.0.1:40000".parse().unwrap();
    assert_eq!(role(a, b), Some(Role::Initiator));
    assert_eq!(role(b, a), Some(Role::Responder));
    assert_eq!(role(a, a), None);
    let v6: std::net::SocketAddr = "[::1]:1".parse().unwrap();
    assert_eq!(role(v6, a), Some(Role::Initiator));
    assert_eq!(role(a, v6), Some(Role::Responder));
}
