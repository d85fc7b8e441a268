//! The in-band switch of an open TCP connection into iWARP, sans-IO: what
//! to do next and when to give up. The I/O side (the crate's socket layer,
//! which depends on this module and never the other way round)
//! performs the steps on the socket and reports what it saw.
//!
//! # The problem
//!
//! Both programs call `setsockopt(WARPSOCK_DDP_MODE)` on a connection that
//! may already carry bytes, in either direction, that the other side has
//! not read yet. Everything written before the switch must reach the
//! reader before anything after it, so each side must find the exact
//! position in the peer's stream where the peer switched. No pattern of
//! bytes can mark it — the application may write any bytes — and if the
//! peer does not run warpsock, or does not switch, nothing we do may change
//! what its application reads.
//!
//! # The design
//!
//! TCP has exactly one in-band position marker the application's bytes
//! cannot forge: the urgent pointer. Each side marks the position where
//! its stream switches by sending **one urgent byte** ([`MARK`],
//! `send(MSG_OOB)`). A receiver with `SO_OOBINLINE` off (the default)
//! never sees that byte among its data: a program that does not run
//! warpsock reads exactly the bytes it read before, and its reads merely
//! stop once at the mark (`SIOCATMARK`). A warpsock reader reads the
//! peer's bytes up to the mark into a *residue* that the application gets
//! first, then checks the urgent byte (peeked, so a foreign urgent byte is
//! left for the application).
//!
//! The two sides have fixed roles, from their addresses: the end with the
//! lower (address, port) is the **initiator** ([`Role`]). Policy mode, which
//! knows who connected, makes the connecting end the initiator instead
//! (the socket layer's `switch_fd_as`): a preloaded server then never marks towards a
//! client without warpsock (whose `poll` would show the urgent byte as
//! `POLLPRI`, which curl takes for a failed connect).
//!
//! 1. The initiator marks at once, then waits up to `mark_timeout` for the
//!    responder's mark.
//! 2. The responder waits up to `mark_timeout` for the initiator's mark and
//!    marks only after seeing it; then it waits up to `request_timeout`
//!    (twice `mark_timeout` by default) for the MPA Request, **peeking**:
//!    nothing is consumed until the bytes after the initiator's mark are a
//!    well-formed MPA Request carrying a warpsock hello.
//! 3. The initiator, having seen the responder's mark, sends the MPA
//!    Request right after its own mark: from here both run MPA (CRC per
//!    `WARPSOCK_CRC`) on the same stream, then RDMAP/DDP.
//!
//! Why nothing is lost or reordered when the switch fails:
//!
//! * Only the initiator's MPA Request and the responder's MPA Reply ever
//!   enter a stream, and each only after its sender has seen the other
//!   side's mark. A peer without warpsock never marks: the initiator times
//!   out having sent one invisible urgent byte, the responder having sent
//!   nothing at all. Their streams are untouched.
//! * A responder with no room to switch (the preload's switching places or
//!   DDP sockets at their bound) answers an initiator's mark that is
//!   already first in its stream with [`BUSY`] instead of its mark, and
//!   consumes the mark; the initiator consumes `BUSY` and goes on as TCP
//!   at once ([`SwitchError::Busy`]). Neither stream holds anything else
//!   of the switch, and neither program sees an urgent byte.
//! * An initiator that withdraws after both marks (its caller's last look
//!   before it commits: too few descriptors left, `io::Commit::Request`)
//!   sends nothing more: the responder finds its program's bytes, or
//!   nothing until its request timeout, where the Request belongs, and
//!   gives up as below.
//! * The responder consumes the bytes after the initiator's mark only once
//!   they are a valid warpsock MPA Request — a sequence the initiator sends
//!   only after it committed. A responder that finds the initiator's
//!   application bytes there instead (the initiator gave up earlier and
//!   went on as TCP) gives up too, having consumed nothing.
//! * The initiator commits only after seeing the responder's mark, which
//!   the responder sends only after seeing the initiator's; the responder
//!   then waits twice as long for the Request as the initiator waits for
//!   the mark, so the Request always comes in time unless the initiator is
//!   stopped (`SIGSTOP`, swapped out) for longer than that inside the
//!   switch. That case — the only one — ends loudly, never with a wrong
//!   byte: the initiator's engine finds the responder's plain bytes where
//!   the MPA Reply belongs and resets the connection, and the responder,
//!   which after giving up watches the position behind the initiator's
//!   mark ([`classify_request`]), resets rather than deliver a late
//!   Request as data.
//! * A responder that cannot serve the initiator's hello (another version),
//!   or that its caller declines before it answers (`io::Commit::Answer`:
//!   a fork, too few descriptors left),
//!   reads the Request and answers with an MPA Reject, then stops: the
//!   initiator reads that Reply and stops too. Each frame was consumed by
//!   its reader, and neither side sent anything else: the connection goes
//!   on as TCP, the bytes written after the Reply (read with it, by the
//!   engine) delivered first ([`SwitchError::Rejected`],
//!   [`SwitchError::Incompatible`]).
//! * The residue (the peer's bytes before its mark) is bounded: an honest
//!   peer wrote them before it switched, so they are at most its send
//!   buffer plus our receive buffer; a peer that writes on without marking
//!   is read until `residue_max` (64 MiB by default) and the switch then
//!   fails (`SwitchError::ResidueFull`), the residue held for the program
//!   — about ten times what the kernel's receive buffer would hold for an
//!   unread TCP connection (helper 31's review, session 35: a bound nearer
//!   the kernel's is open). The socket layer may bound the residues of
//!   all the switches under way together too (`io::ResidueBudget`,
//!   [`Switch::on_residue_refused`]: the switch fails the same way).
//!
//! Each side marks at most once per connection: a second urgent byte
//! before the peer has read past the first would turn the first into
//! ordinary data in the peer's kernel. A second `setsockopt` after a
//! failed switch therefore fails at once.
//!
//! In policy mode (`WARPSOCK_DDP_PORTS`) both sides switch at
//! connect/accept time, before any application byte: a peer whose first
//! byte is not a mark is not switching, and the switch ends at once
//! instead of waiting for the timeout.
#![forbid(unsafe_code)]

use std::fmt;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::wire::{Hello, WireError};

/// The urgent byte that marks a switch.
pub const MARK: u8 = 0xD7;
/// The urgent byte a responder sends instead of its mark when it has no
/// room to switch the connection now (its switches under way, the
/// initiator's host's share of them, or its DDP sockets at their bound):
/// the initiator goes on as TCP at once ([`SwitchError::Busy`]) instead of
/// waiting out its mark timeout. Sent only where [`MARK`] would be — after
/// the initiator's mark, first in the responder's stream — and each
/// consumed by its reader, so neither program sees an urgent byte.
pub const BUSY: u8 = 0xD8;
/// An MPA Request starts with this key (RFC 5044 §7.1).
pub const MPA_REQ_KEY: &[u8; 16] = b"MPA ID Req Frame";
/// MPA Request/Reply header: key, flags, revision, private data length.
pub const MPA_HDR_LEN: usize = 20;
/// RFC 5044's limit on MPA private data.
pub const MPA_MAX_PD: usize = 512;

/// Which end of the connection does what.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    /// Marks first and sends the MPA Request.
    Initiator,
    /// Marks after the initiator and answers with the MPA Reply.
    Responder,
}

/// The role of the end at `local` talking to `peer`: the lower (address,
/// port) initiates. `None` for a connection to itself.
pub fn role(local: SocketAddr, peer: SocketAddr) -> Option<Role> {
    fn key(a: SocketAddr) -> ([u8; 16], u16) {
        let ip = match a.ip() {
            std::net::IpAddr::V4(v4) => v4.to_ipv6_mapped(),
            std::net::IpAddr::V6(v6) => v6,
        };
        (ip.octets(), a.port())
    }
    match key(local).cmp(&key(peer)) {
        std::cmp::Ordering::Less => Some(Role::Initiator),
        std::cmp::Ordering::Greater => Some(Role::Responder),
        std::cmp::Ordering::Equal => None,
    }
}

/// Time limits and bounds of a switch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Limits {
    /// How long to wait for the peer's mark.
    pub mark_timeout: Duration,
    /// Responder: how long to wait for the MPA Request after marking.
    pub request_timeout: Duration,
    /// Most bytes read into the residue while waiting for the mark.
    pub residue_max: usize,
    /// The switch happens before any application byte (policy mode): a
    /// peer byte before its mark means the peer is not switching.
    pub at_start: bool,
}

impl Default for Limits {
    fn default() -> Self {
        Self::with_timeout(Duration::from_secs(2))
    }
}

impl Limits {
    /// Limits for a mark timeout `t` (the request timeout is `2 t`).
    pub fn with_timeout(t: Duration) -> Self {
        Self {
            mark_timeout: t,
            request_timeout: t * 2,
            residue_max: 64 << 20,
            at_start: false,
        }
    }
}

/// What the I/O side does next.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Step {
    /// Send our mark (one urgent byte), then report [`Switch::on_marked`];
    /// give up at `deadline` ([`Switch::on_timeout`]): a peer that reads
    /// nothing keeps a full send buffer full, where an urgent byte waits
    /// too.
    SendMark {
        /// When to report [`Switch::on_timeout`]: the mark's own wait's
        /// (the initiator's, from its start; the responder's, for the
        /// initiator's mark), after which the peer no longer waits for
        /// ours either.
        deadline: Instant,
    },
    /// Read the peer's bytes into the residue (at most `room` more), stop
    /// at its mark, and report what happened; give up at `deadline`.
    AwaitMark {
        /// When to report [`Switch::on_timeout`].
        deadline: Instant,
        /// Residue bytes still allowed. 0 (policy mode,
        /// [`Limits::at_start`]): none are read — bytes queued ahead of
        /// the mark are reported with [`Switch::on_bytes_ahead`] and left
        /// in the stream, the program's.
        room: usize,
    },
    /// Peek (do not consume) the bytes after the peer's mark until `want`
    /// of them are there; report them with [`Switch::on_peek`].
    AwaitRequest {
        /// When to report [`Switch::on_timeout`].
        deadline: Instant,
        /// Bytes wanted.
        want: usize,
    },
    /// Initiator: run MPA now (send the Request). Past this point a failure
    /// breaks the connection.
    Connect,
    /// Responder: the warpsock MPA Request is next in the stream: read it
    /// and answer.
    Accept(Hello),
    /// Responder: a warpsock MPA Request we cannot serve is next in the
    /// stream. The initiator has committed, so it must be read and
    /// answered with an MPA Reject; the connection then goes on as TCP
    /// ([`SwitchError::Incompatible`] here, [`SwitchError::Rejected`] at
    /// the initiator).
    Reject(WireError),
    /// The switch failed; the connection is an intact TCP connection (the
    /// residue is read first).
    Failed(SwitchError),
}

/// Why a switch did not happen.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum SwitchError {
    /// No mark from the peer in time: it does not run warpsock or did not
    /// switch (`ECONNREFUSED`).
    NoPeer {
        /// The time waited.
        after: Duration,
    },
    /// Policy mode: the peer sent application bytes first (`ECONNREFUSED`).
    PeerNotSwitching,
    /// The peer sent more bytes before its mark than we buffer — this
    /// switch's bound, or the socket layer's over the switches under way
    /// ([`Switch::on_residue_refused`]) (`ECONNREFUSED`).
    ResidueFull {
        /// The bound (the bytes held, when the shared one was reached).
        max: usize,
    },
    /// The peer's urgent byte is not a warpsock mark (`ECONNREFUSED`).
    ForeignUrgent(u8),
    /// Our mark could not be sent in time: the send buffer stayed full
    /// (the peer reads nothing) (`ECONNREFUSED`). Nothing entered the
    /// stream: the connection goes on as TCP.
    MarkUnsent {
        /// The time it had.
        after: Duration,
    },
    /// Initiator: the responder's warpsock has no room to switch the
    /// connection now and said so ([`BUSY`]) (`ECONNREFUSED`). Nothing but
    /// the two urgent bytes, each consumed, entered the streams: the
    /// connection goes on as TCP.
    Busy,
    /// After the initiator's mark came bytes that are not a warpsock MPA
    /// Request: it gave up before us (`ECONNREFUSED`).
    NotARequest,
    /// The initiator's mark came, the MPA Request did not (`ECONNREFUSED`).
    NoRequest {
        /// The time waited after our mark.
        after: Duration,
    },
    /// The peer closed the connection during the switch (`ECONNRESET` if
    /// reset, else `ECONNREFUSED`); the residue is still delivered.
    PeerClosed,
    /// A connection to itself has no peer to switch with (`EINVAL`).
    SelfConnected,
    /// Initiator: the peer's warpsock answered our MPA Request with a
    /// Reject (it cannot serve our hello: another version, or limits it
    /// does not take) (`ECONNREFUSED`). The exchange's two frames are
    /// consumed, each by its reader: the connection goes on as TCP, the
    /// peer's bytes behind its Reply first in the residue.
    Rejected,
    /// Responder: the initiator's warpsock Request carries a hello we
    /// cannot serve; it was answered with a Reject (`EPROTO`) and the
    /// connection goes on as TCP.
    Incompatible(WireError),
    /// Responder: our side declined the switch before answering the
    /// Request (the process forked meanwhile: its child would get a copy
    /// of the connection it cannot use); the Request was answered with a
    /// Reject (`ECONNREFUSED`) and the connection goes on as TCP.
    Declined,
    /// Initiator: our side withdrew before it sent the MPA Request (too
    /// few descriptors were left to finish the switch: a switch that ran
    /// out after its Request would have to reset the connection)
    /// (`EMFILE`). Nothing but our mark entered the stream: the
    /// connection goes on as TCP, and the responder, which finds our
    /// program's bytes (or nothing) where the Request belongs, too.
    Withdrawn,
    /// Responder: our side declined the switch before answering the
    /// Request because too few descriptors were left to finish it (a
    /// switch that ran out after its Reply would have to reset the
    /// connection); the Request was answered with a Reject (`EMFILE`)
    /// and the connection goes on as TCP, the initiator's as well
    /// ([`SwitchError::Rejected`] there).
    NoDescriptors,
}

impl SwitchError {
    /// The `errno` a `setsockopt` reports for it.
    pub fn errno(&self) -> i32 {
        match self {
            Self::SelfConnected => libc::EINVAL,
            Self::Incompatible(_) => libc::EPROTO,
            Self::Withdrawn | Self::NoDescriptors => libc::EMFILE,
            _ => libc::ECONNREFUSED,
        }
    }
}

impl fmt::Display for SwitchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NoPeer { after } => write!(
                f,
                "the peer did not switch to DDP mode within {after:?} (it does not run warpsock, or its program did not ask)"
            ),
            Self::PeerNotSwitching => {
                f.write_str("the peer sent data before switching: it is not switching to DDP mode")
            }
            Self::ResidueFull { max } => write!(
                f,
                "the peer sent more than {max} bytes without switching to DDP mode"
            ),
            Self::ForeignUrgent(b) => write!(
                f,
                "the peer sent TCP urgent data (0x{b:02x}) that is not a warpsock switch mark"
            ),
            Self::MarkUnsent { after } => write!(
                f,
                "our switch mark could not be sent within {after:?}: the send buffer stayed full (the peer reads nothing)"
            ),
            Self::Busy => f.write_str(
                "the peer's warpsock had no room to switch this connection now (its switches under way, its share for our host, or its DDP sockets at their bound)",
            ),
            Self::NotARequest => f.write_str(
                "the peer's program went on with plain TCP data after its switch mark (it gave up first)",
            ),
            Self::NoRequest { after } => write!(
                f,
                "the peer marked its switch but sent no MPA Request within {after:?}"
            ),
            Self::PeerClosed => f.write_str("the peer closed the connection during the switch"),
            Self::SelfConnected => f.write_str("a connection to itself cannot switch to DDP mode"),
            Self::Rejected => f.write_str(
                "the peer's warpsock rejected our MPA Request (an incompatible DDP mode, or its process forked during the switch)",
            ),
            Self::Incompatible(e) => write!(f, "the peer's DDP mode is incompatible: {e}"),
            Self::Declined => f.write_str(
                "the switch was declined: the process forked during it (a child cannot use a DDP-mode connection)",
            ),
            Self::Withdrawn => f.write_str(
                "the switch was withdrawn before its MPA Request: too few descriptors free under RLIMIT_NOFILE to finish it",
            ),
            Self::NoDescriptors => f.write_str(
                "the switch was declined before its MPA Reply: too few descriptors free under RLIMIT_NOFILE to finish it",
            ),
        }
    }
}

impl std::error::Error for SwitchError {}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Initiator, or responder that saw the mark: our mark is to be sent.
    Mark,
    /// Waiting for the peer's mark.
    AwaitMark,
    /// Responder: waiting for the Request.
    AwaitRequest,
    /// Done; see `outcome`.
    Done,
}

/// What the bytes after an initiator's mark are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Request {
    /// A prefix of an MPA Request: `want` bytes decide.
    Undecided {
        /// Bytes needed.
        want: usize,
    },
    /// Not a warpsock MPA Request (application bytes, or another MPA
    /// speaker's Request).
    NotWarpsock,
    /// A warpsock MPA Request with this hello.
    Warpsock(Hello),
    /// A warpsock MPA Request whose hello we cannot serve.
    BadHello(WireError),
}

/// Classifies the bytes that follow an initiator's mark (as far as they
/// have arrived). Used by the responder's switch, and after a switch that
/// gave up waiting for the Request: an initiator stopped for longer than
/// that wait may still send it, and the responder must then reset the
/// connection rather than deliver it as data (see the module docs).
pub fn classify_request(b: &[u8]) -> Request {
    let key = b.len().min(MPA_REQ_KEY.len());
    if b[..key] != MPA_REQ_KEY[..key] {
        return Request::NotWarpsock;
    }
    if b.len() < MPA_HDR_LEN {
        return Request::Undecided { want: MPA_HDR_LEN };
    }
    let pd_len = usize::from(u16::from_be_bytes([b[18], b[19]]));
    if pd_len > MPA_MAX_PD {
        return Request::NotWarpsock;
    }
    let want = MPA_HDR_LEN + pd_len;
    if b.len() < want {
        return Request::Undecided { want };
    }
    // Enhanced MPA (RFC 6581) puts 4 bytes of IRD/ORD before the
    // application's private data; the engine always sends them.
    let enhanced = b[16] & 0x10 != 0;
    let pd = &b[MPA_HDR_LEN..want];
    let app = if enhanced && pd.len() >= 4 {
        &pd[4..]
    } else {
        pd
    };
    match Hello::parse(app) {
        Ok(h) => Request::Warpsock(h),
        Err(WireError::NotHello) => Request::NotWarpsock,
        Err(e) => Request::BadHello(e),
    }
}

/// One switch attempt. Poll [`Self::step`] after every report.
#[derive(Debug, Clone)]
pub struct Switch {
    role: Role,
    limits: Limits,
    phase: Phase,
    deadline: Instant,
    residue: usize,
    want: usize,
    outcome: Option<Step>,
}

impl Switch {
    /// Starts a switch at `now`.
    pub fn new(role: Role, limits: Limits, now: Instant) -> Self {
        let phase = match role {
            Role::Initiator => Phase::Mark,
            Role::Responder => Phase::AwaitMark,
        };
        Self {
            role,
            limits,
            phase,
            deadline: now + limits.mark_timeout,
            residue: 0,
            want: MPA_HDR_LEN,
            outcome: None,
        }
    }

    /// Our role.
    pub fn role(&self) -> Role {
        self.role
    }

    /// What to do now.
    pub fn step(&self) -> Step {
        match self.phase {
            Phase::Mark => Step::SendMark {
                deadline: self.deadline,
            },
            Phase::AwaitMark => Step::AwaitMark {
                deadline: self.deadline,
                // Policy mode reads none: the first byte ahead of a mark
                // ends the switch, and left in the kernel's stream it is
                // every holder's of the socket — a forking server's child
                // reads it from its copy, where a residue held by the
                // library was the parent's alone (session 38: socat's
                // children read an empty stream from plain clients).
                room: if self.limits.at_start {
                    0
                } else {
                    self.limits.residue_max - self.residue
                },
            },
            Phase::AwaitRequest => Step::AwaitRequest {
                deadline: self.deadline,
                want: self.want,
            },
            Phase::Done => self.outcome.clone().expect("done has an outcome"),
        }
    }

    fn fail(&mut self, e: SwitchError) {
        self.phase = Phase::Done;
        self.outcome = Some(Step::Failed(e));
    }

    /// Our mark is sent, at `now`.
    pub fn on_marked(&mut self, now: Instant) {
        debug_assert_eq!(self.phase, Phase::Mark);
        match self.role {
            Role::Initiator => self.phase = Phase::AwaitMark,
            Role::Responder => {
                self.phase = Phase::AwaitRequest;
                self.deadline = now + self.limits.request_timeout;
            }
        }
    }

    /// `n` of the peer's bytes before its mark were read into the residue,
    /// at `now`: past the mark's deadline the wait ends as at its timeout,
    /// bytes or not — a peer that writes on without marking, faster than
    /// we read (so the I/O side never finds the socket empty and waits),
    /// held the switch until the residue's bound (helper 68's review).
    pub fn on_bytes(&mut self, n: usize, now: Instant) {
        debug_assert_eq!(self.phase, Phase::AwaitMark);
        if n == 0 {
            return;
        }
        self.residue += n;
        if self.limits.at_start {
            self.fail(SwitchError::PeerNotSwitching);
        } else if self.residue >= self.limits.residue_max {
            self.fail(SwitchError::ResidueFull {
                max: self.limits.residue_max,
            });
        } else {
            self.on_timeout(now);
        }
    }

    /// The I/O side could not take more of the peer's bytes into the
    /// residue, below [`Limits::residue_max`]: a bound it keeps over
    /// several switches (the socket layer's budget of the residues of the
    /// switches under way) was reached. The switch fails as at its own
    /// bound ([`SwitchError::ResidueFull`], `max` the bytes it holds):
    /// the connection stays TCP, the residue delivered first. The bound
    /// is the caller's: this module keeps no state beyond the switch.
    pub fn on_residue_refused(&mut self) {
        debug_assert_eq!(self.phase, Phase::AwaitMark);
        if self.phase != Phase::Done {
            self.fail(SwitchError::ResidueFull { max: self.residue });
        }
    }

    /// `n` of the peer's bytes are queued ahead of its mark and were left
    /// there (`room` 0: policy mode): the peer is not switching.
    pub fn on_bytes_ahead(&mut self, n: usize) {
        debug_assert_eq!(self.phase, Phase::AwaitMark);
        if n > 0 {
            self.fail(SwitchError::PeerNotSwitching);
        }
    }

    /// The read position reached the peer's mark, whose urgent byte is
    /// `urgent` (peeked).
    pub fn on_mark(&mut self, urgent: u8) {
        debug_assert_eq!(self.phase, Phase::AwaitMark);
        if urgent == BUSY && self.role == Role::Initiator {
            return self.fail(SwitchError::Busy);
        }
        if urgent != MARK {
            return self.fail(SwitchError::ForeignUrgent(urgent));
        }
        match self.role {
            Role::Initiator => {
                self.phase = Phase::Done;
                self.outcome = Some(Step::Connect);
            }
            Role::Responder => self.phase = Phase::Mark,
        }
    }

    /// Responder: the bytes after the initiator's mark, as far as they have
    /// arrived (peeked: still in the stream).
    pub fn on_peek(&mut self, b: &[u8]) {
        debug_assert_eq!(self.phase, Phase::AwaitRequest);
        match classify_request(b) {
            Request::Undecided { want } => self.want = want,
            Request::NotWarpsock => self.fail(SwitchError::NotARequest),
            Request::Warpsock(h) => {
                self.phase = Phase::Done;
                self.outcome = Some(Step::Accept(h));
            }
            // A warpsock Request we cannot serve: it must still be
            // answered (the initiator has committed).
            Request::BadHello(e) => {
                self.phase = Phase::Done;
                self.outcome = Some(Step::Reject(e));
            }
        }
    }

    /// Responder: the peer's urgent byte lies ahead, inside the bytes
    /// after its mark that are not yet a whole Request (`io::urgent_ahead`:
    /// a peek stops at it). A committed initiator sends its Request whole,
    /// with no urgent byte inside: these bytes are the program's
    /// (`NotARequest`), not a Request to wait for until the deadline.
    pub fn on_urgent_ahead(&mut self) {
        if self.phase == Phase::AwaitRequest {
            self.fail(SwitchError::NotARequest);
        }
    }

    /// The peer closed the connection (FIN or reset).
    pub fn on_eof(&mut self) {
        if self.phase != Phase::Done {
            self.fail(SwitchError::PeerClosed);
        }
    }

    /// The deadline of the current step passed.
    pub fn on_timeout(&mut self, now: Instant) {
        if now < self.deadline || self.phase == Phase::Done {
            return;
        }
        match self.phase {
            Phase::Mark => self.fail(SwitchError::MarkUnsent {
                after: self.limits.mark_timeout,
            }),
            Phase::AwaitMark => self.fail(SwitchError::NoPeer {
                after: self.limits.mark_timeout,
            }),
            Phase::AwaitRequest => self.fail(SwitchError::NoRequest {
                after: self.limits.request_timeout,
            }),
            _ => {}
        }
    }
}
