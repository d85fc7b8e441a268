//! One iWARP connection: MPA negotiation, then an RDMAP/DDP queue pair over
//! the MPA byte stream (siw `siw_cm.c`, `siw_qp.c`, `siw_qp_rx.c`,
//! `siw_qp_tx.c`).
//!
//! # Driving a connection
//!
//! A [`Connection`] is a state machine. The engine (or a test) owns the TCP
//! stream and the clock and, in any order:
//!
//! * feeds received bytes through one of the receive entry points below;
//! * drains bytes to send with [`Connection::poll_transmit`] (copying) or
//!   [`Connection::next_segment`] (a gather list of inline bytes and
//!   registered memory, for `writev`/`sendmsg` without a staging copy);
//! * calls [`Connection::handle_timeout`] when [`Connection::poll_timeout`]
//!   expires, and tells the end of the stream with
//!   [`Connection::handle_eof`] (FIN) or
//!   [`Connection::handle_transport_error`] (reset, timeout, socket error),
//!   so the cause reaches the application;
//! * drains [`Connection::poll_event`] and [`Connection::poll_completion`]
//!   after each of the above.
//!
//! # The receive entry points
//!
//! [`Connection::rx_step`] is the query: it says what the next stream bytes
//! are for. The five calls that consume them, and when to make each:
//!
//! | call | when | what it does |
//! |---|---|---|
//! | [`Connection::handle_input`] | you hold received bytes in a buffer and do not place payload yourself (tests, the MPA phase, simple engines) | everything: framing, placement by copy, CRC; returns bytes consumed (fewer only when [`RxStep::Blocked`]) |
//! | [`Connection::rx_fpdu`] | [`Connection::rx_step`] is [`RxStep::Bytes`] and your buffer may start with one whole FPDU | one pass over a whole small FPDU (header checks, copy, one CRC call); returns 0 if the FPDU is not all there, and then you go on with `rx_bytes` |
//! | [`Connection::rx_bytes`] | [`Connection::rx_step`] is [`RxStep::Bytes`] | consumes framing (MPA frame, FPDU header, marker, pad, CRC), at most what the step asked for |
//! | [`Connection::rx_placed`] | [`Connection::rx_step`] was [`RxStep::Place`] and you wrote payload bytes into that range yourself (straight from the socket) | folds the placed bytes into the CRC where they lie and advances |
//! | [`Connection::rx_planned`] | [`Connection::rx_step`] was [`RxStep::Place`], [`Connection::rx_plan`] laid out the message's next FPDUs, and you read the stream over that layout in one `readv` | checks each header the ordinary way, takes payload as placed only where it belongs, re-feeds the rest from the first wrong guess |
//!
//! The engine's loop is: while bytes are staged, `rx_fpdu`, else by
//! `rx_step`: `rx_bytes` for [`RxStep::Bytes`], a direct read into the range
//! and `rx_placed` for [`RxStep::Place`] (or, for a large payload the core
//! can plan beyond, one read over [`Connection::rx_plan`]'s layout and
//! `rx_planned`), stop for [`RxStep::Blocked`],
//! discard for [`RxStep::Closed`]. Mixing them at any byte boundary is
//! allowed: each resumes exactly where the last stopped.
//!
//! Nothing here reads a clock or touches a socket: time is an argument.

mod cm;
mod rx;
mod tx;
mod txseg;

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use warpsock_wire::fpdu;
use warpsock_wire::mpa::EnhancedParams;
use warpsock_wire::terminate::TermCode;

use crate::mem::{PdId, Range, Stag};
use crate::ring::Ring;
use crate::verbs::{RecvWr, SendWr, Sgl, WcOpcode, WcStatus, WorkCompletion, WorkQueue};

pub use cm::AcceptError;
pub use rx::{RxPiece, RxStep};
pub use tx::{pieces_of, GatheredFpdu, TxCounts};
pub use txseg::{TxPart, TxSegment};

/// Which end of the TCP connection this is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    /// Connected out; sends the MPA Request and the first FPDU.
    Initiator,
    /// Accepted; answers the MPA Request.
    Responder,
}

/// Zero-length ready-to-receive message types for peer-to-peer setup
/// (RFC 6581 §3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RtrType {
    /// Zero-length RDMA Write (siw's choice; STag 1, TO 0).
    Write,
    /// Zero-length RDMA Read (Chelsio's default).
    Read,
    /// Zero-length Send: accepted as responder when it is all the
    /// initiator offers; never offered by us.
    Send,
}

/// Peer-to-peer RTR offer of an initiator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct RtrOffer {
    /// Offer a zero-length Write.
    pub write: bool,
    /// Offer a zero-length Read.
    pub read: bool,
}

/// Connection parameters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Initiator or responder.
    pub role: Role,
    /// Ask for CRC (it is on if either side asks).
    pub crc: bool,
    /// Ask the peer to send markers (per direction, RFC 5044 §7.1).
    pub markers: bool,
    /// MPA revision to request (1, or 2 for RFC 6581 enhanced setup).
    pub mpa_revision: u8,
    /// Inbound RDMA Read queue depth we offer.
    pub ird: u16,
    /// Outbound RDMA Read queue depth we want.
    pub ord: u16,
    /// Largest IRD/ORD we agree to (siw: 128).
    pub max_ird_ord: u16,
    /// Largest IRD a peer may raise ours to by asking for a larger ORD
    /// (relaxed negotiation, as siw): each inbound Read the peer may have
    /// outstanding is state we keep. Capped by `max_ird_ord` too.
    pub max_ird: u16,
    /// Initiator: offer peer-to-peer mode with these RTR types (never
    /// Send-only). Responder: ignored (the peer's offer decides).
    pub p2p: Option<RtrOffer>,
    /// Responder: when the initiator offers both a Write and a Read RTR,
    /// choose the Read (as an RNIC that prefers Read RTR would). Off: the
    /// Write, as Linux siw chooses.
    pub prefer_read_rtr: bool,
    /// Initiator: ULP private data for the MPA Request (≤ 508 bytes; ≤ 251
    /// to stay within siw's limit).
    pub private_data: Vec<u8>,
    /// Largest ULPDU to emit (default: one FPDU per 1448-byte MSS, as siw).
    pub mulpdu: usize,
    /// How long to wait for the peer's MPA Request or Reply.
    pub mpa_timeout: Duration,
    /// Depth of the send queue (outstanding send work requests).
    pub sq_depth: usize,
    /// Depth of the receive queue.
    pub rq_depth: usize,
    /// Protection domain the queue pair belongs to.
    pub pd: PdId,
}

impl Config {
    /// Defaults for `role` in `pd`: MPA rev 2 enhanced, CRC off, no
    /// markers, IRD = ORD = 16, siw-sized FPDUs, 10 s MPA timeout.
    pub fn new(role: Role, pd: PdId) -> Self {
        Self {
            role,
            crc: false,
            markers: false,
            mpa_revision: 2,
            ird: 16,
            ord: 16,
            max_ird_ord: 128,
            max_ird: 128,
            p2p: None,
            prefer_read_rtr: false,
            private_data: Vec::new(),
            mulpdu: fpdu::mulpdu_for_mss(1448),
            mpa_timeout: Duration::from_secs(10),
            sq_depth: 1024,
            rq_depth: 1024,
            pd,
        }
    }
}

/// What the MPA exchange settled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Negotiated {
    /// MPA revision in use.
    pub revision: u8,
    /// CRC on in both directions.
    pub crc: bool,
    /// We insert markers into what we send.
    pub markers_tx: bool,
    /// The peer inserts markers into what it sends.
    pub markers_rx: bool,
    /// Inbound Read Requests we accept at once.
    pub ird: u16,
    /// Outbound Read Requests we may have outstanding.
    pub ord: u16,
    /// Peer-to-peer RTR in use.
    pub rtr: Option<RtrType>,
    /// ULP private data the peer sent.
    pub peer_private_data: Vec<u8>,
}

/// The responder's view of an MPA Request, for the accept/reject decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectRequest {
    /// Revision requested.
    pub revision: u8,
    /// Peer asked for CRC.
    pub crc: bool,
    /// Peer asked for markers.
    pub markers: bool,
    /// Peer's IRD/ORD word (enhanced requests).
    pub params: Option<EnhancedParams>,
    /// ULP private data.
    pub private_data: Vec<u8>,
}

/// Why connection setup failed.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConnectError {
    /// No MPA Request/Reply within the configured time.
    Timeout,
    /// The peer's Request/Reply was malformed.
    Malformed(warpsock_wire::WireError),
    /// The peer's Reply refused our options (markers, RTR, IRD).
    Incompatible(TermCode),
    /// The peer closed the TCP stream (FIN) during setup.
    Eof,
    /// The TCP stream failed during setup (reset, timeout, another socket
    /// error: see [`Connection::handle_transport_error`]).
    Transport(TransportError),
}

impl std::fmt::Display for ConnectError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Timeout => f.write_str("no MPA request/reply from the peer in time"),
            Self::Malformed(e) => write!(f, "malformed MPA frame from the peer: {e}"),
            Self::Incompatible(c) => write!(f, "MPA negotiation failed: {c}"),
            Self::Eof => f.write_str("peer closed the connection during MPA setup"),
            Self::Transport(e) => write!(f, "{e} during MPA setup"),
        }
    }
}

/// How the transport under a connection failed, as the engine saw it on
/// its socket (the core never sees a socket: the engine classifies the
/// `errno` and hands it in with [`Connection::handle_transport_error`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum TransportError {
    /// The peer reset the connection (`ECONNRESET`, `EPIPE`).
    Reset,
    /// The connection timed out: data stayed unacknowledged past
    /// `TCP_USER_TIMEOUT`, or keepalive probes went unanswered
    /// (`ETIMEDOUT`).
    TimedOut,
    /// Another socket error, by its `errno` value.
    Os(i32),
}

impl std::fmt::Display for TransportError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Reset => f.write_str("peer reset the connection"),
            Self::TimedOut => f.write_str("connection timed out (peer unreachable or dead)"),
            Self::Os(e) => write!(f, "socket error (errno {e})"),
        }
    }
}

/// Why an established connection ended: carried by [`Event::Closed`],
/// kept by [`Connection::close_reason`], and what an engine attaches to
/// the completions it flushed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum CloseReason {
    /// Closed locally ([`Connection::close`]: a disconnect, or a reject).
    Local,
    /// The peer closed the TCP stream (FIN).
    PeerClosed,
    /// The transport failed (reset, timeout, socket error).
    Transport(TransportError),
    /// A Terminate ended the stream.
    Terminated {
        /// The error it reports.
        code: TermCode,
        /// Whether the peer sent it (else we did).
        by_peer: bool,
    },
    /// A local work request failed (a bad local buffer, or a region
    /// deregistered under an active request) and took the queue pair to
    /// Error with it.
    LocalError,
}

impl std::fmt::Display for CloseReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Local => f.write_str("closed locally"),
            Self::PeerClosed => f.write_str("peer closed the connection"),
            Self::Transport(e) => e.fmt(f),
            Self::Terminated {
                code,
                by_peer: true,
            } => write!(f, "peer sent Terminate {code}"),
            Self::Terminated {
                code,
                by_peer: false,
            } => write!(f, "sent Terminate {code} to the peer"),
            Self::LocalError => f.write_str("a local work request failed"),
        }
    }
}

impl std::error::Error for ConnectError {}

/// Something the application must hear about.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Event {
    /// Responder: a valid MPA Request arrived; call [`Connection::accept`]
    /// or [`Connection::reject`].
    ConnectRequest(ConnectRequest),
    /// The queue pair reached RTS.
    Established(Negotiated),
    /// Initiator: the responder rejected us (R bit) with this private data.
    Rejected(Vec<u8>),
    /// Setup failed.
    ConnectFailed(ConnectError),
    /// A Terminate was sent (`by_peer` false) or received (true).
    Terminated {
        /// The error it reports.
        code: TermCode,
        /// Whether the peer sent it.
        by_peer: bool,
    },
    /// The stream ended (and why); no more I/O.
    Closed(CloseReason),
}

/// Queue pair state (RFC 5040 §6 / siw `enum siw_qp_state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QpState {
    /// Before MPA completes.
    Idle,
    /// Ready to send and receive.
    Rts,
    /// Graceful close in progress.
    Closing,
    /// A Terminate was sent or received; draining.
    Terminate,
    /// Dead; every request has been flushed.
    Error,
}

/// Why a post failed immediately.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum PostError {
    /// The queue is at its configured depth.
    QueueFull,
    /// The request is malformed (e.g. a Read with more than one SGE, a
    /// message above 2^32 - 1 bytes).
    Invalid,
}

impl std::fmt::Display for PostError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::QueueFull => "work queue full",
            Self::Invalid => "malformed work request",
        })
    }
}

impl std::error::Error for PostError {}

/// One outstanding send-queue request, in posting order.
#[derive(Debug)]
struct SqSlot {
    wr_id: u64,
    opcode: WcOpcode,
    byte_len: u32,
    signaled: bool,
    status: Option<WcStatus>,
}

/// A send-queue request not yet (fully) transmitted.
#[derive(Debug)]
struct PendingSend {
    seq: u64,
    wr: SendWr,
}

/// A posted receive with its checked scatter list.
#[derive(Debug)]
struct PostedRecv {
    wr: RecvWr,
}

/// An outbound Read awaiting its response.
#[derive(Debug)]
struct OrqEntry {
    /// SQ sequence of the Read WR (None for the RTR Read).
    seq: Option<u64>,
    sink_stag: Stag,
    sink_to: u64,
    size: u32,
    received: u32,
    sink: Option<Range>,
}

/// An inbound Read to answer.
#[derive(Debug)]
struct IrqEntry {
    sink_stag: Stag,
    sink_to: u64,
    size: u32,
    source: Option<Range>,
}

/// MPA negotiation progress.
#[derive(Debug, Clone, PartialEq, Eq)]
enum CmState {
    /// Initiator: Request queued/sent, waiting for the Reply.
    AwaitReply,
    /// Responder: waiting for the Request.
    AwaitRequest,
    /// Responder: Request delivered, waiting for accept/reject.
    AwaitAccept,
    /// Full operation phase.
    Fpdu,
    /// Nothing more to do.
    Done,
}

/// An iWARP connection (one queue pair on one TCP stream).
#[derive(Debug)]
pub struct Connection {
    cfg: Config,
    cm: CmState,
    qp: QpState,
    neg: Option<Negotiated>,
    peer_request: Option<ConnectRequest>,
    deadline: Option<Instant>,
    events: VecDeque<Event>,
    completions: VecDeque<WorkCompletion>,

    // Send side.
    sq: VecDeque<SqSlot>,
    sq_base: u64,
    pending: VecDeque<PendingSend>,
    irq: VecDeque<IrqEntry>,
    orq: VecDeque<OrqEntry>,
    tx: tx::TxState,

    // Receive side.
    rq: Ring<PostedRecv>,
    rx: rx::RxState,
    /// The responder may send only after the first FPDU arrived.
    first_fpdu_seen: bool,
    /// The socket should be shut down once the send side drains.
    close_after_flush: bool,
    /// Why the connection ended (first cause wins).
    close_reason: Option<CloseReason>,
}

impl Connection {
    /// A connection in the MPA phase. An initiator queues its MPA Request
    /// at once; both roles arm the MPA timeout from `now`.
    pub fn new(cfg: Config, now: Instant) -> Self {
        let cm = match cfg.role {
            Role::Initiator => CmState::AwaitReply,
            Role::Responder => CmState::AwaitRequest,
        };
        let mut c = Self {
            deadline: Some(now + cfg.mpa_timeout),
            cm,
            qp: QpState::Idle,
            neg: None,
            peer_request: None,
            events: VecDeque::new(),
            completions: VecDeque::new(),
            sq: VecDeque::new(),
            sq_base: 0,
            pending: VecDeque::new(),
            irq: VecDeque::new(),
            orq: VecDeque::new(),
            tx: tx::TxState::default(),
            rq: Ring::with_limit(cfg.rq_depth),
            rx: rx::RxState::default(),
            first_fpdu_seen: false,
            close_after_flush: false,
            close_reason: None,
            cfg,
        };
        if c.cfg.role == Role::Initiator {
            c.queue_mpa_request();
        }
        c
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// Queue pair state.
    pub fn state(&self) -> QpState {
        self.qp
    }

    /// What MPA settled, once established.
    pub fn negotiated(&self) -> Option<&Negotiated> {
        self.neg.as_ref()
    }

    /// Next event, if any.
    #[inline]
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// Whether [`Self::poll_completion`] or [`Self::poll_event`] would give
    /// anything (a look that takes nothing: a driver that collects after
    /// every write asks it first).
    #[inline]
    pub fn has_reports(&self) -> bool {
        !self.completions.is_empty() || !self.events.is_empty()
    }

    /// Next work completion, if any (send-queue completions in posting
    /// order, receive completions in arrival order).
    #[inline]
    pub fn poll_completion(&mut self) -> Option<WorkCompletion> {
        self.completions.pop_front()
    }

    /// When [`Self::handle_timeout`] must next be called.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.deadline
    }

    /// Handles expiry of the MPA timer.
    pub fn handle_timeout(&mut self, now: Instant) {
        let Some(d) = self.deadline else { return };
        if now < d {
            return;
        }
        self.deadline = None;
        if matches!(
            self.cm,
            CmState::AwaitReply | CmState::AwaitRequest | CmState::AwaitAccept
        ) {
            self.fail_setup(ConnectError::Timeout);
        }
    }

    /// Whether the engine should shut down / close the TCP stream once
    /// [`Self::poll_transmit`] has nothing more to send.
    pub fn wants_close(&self) -> bool {
        self.close_after_flush
    }

    /// Whether nothing more will ever be sent or received.
    pub fn is_finished(&self) -> bool {
        self.close_after_flush && !self.has_pending_output()
    }

    /// Posts a send-queue request. Local buffers are checked when the
    /// request is started;
    /// a Send or RDMA Write completes as soon as its last segment has been
    /// handed out by [`Self::next_segment`] / [`Self::poll_transmit`] (iWARP
    /// has no end-to-end acknowledgement; siw completes at the same point),
    /// so an engine that promises "written to the socket" holds the
    /// completion until the bytes are out. An RDMA Read completes when its
    /// response has been placed and its CRC checked. a bad one completes with
    /// [`WcStatus::LocalProtectionError`] and moves the QP to Error.
    /// Posting to a dead QP completes the request with a flush error.
    pub fn post_send(&mut self, wr: SendWr) -> Result<(), PostError> {
        if self.sq.len() >= self.cfg.sq_depth {
            return Err(PostError::QueueFull);
        }
        let total: u64 = wr.sgl.iter().map(|s| u64::from(s.length)).sum();
        let opcode = match wr.op {
            crate::verbs::SendOp::Send { .. } => WcOpcode::Send,
            crate::verbs::SendOp::Write { .. } => WcOpcode::RdmaWrite,
            crate::verbs::SendOp::Read { .. } => {
                if wr.sgl.len() > 1 {
                    return Err(PostError::Invalid);
                }
                WcOpcode::RdmaRead
            }
        };
        let byte_len = u32::try_from(total).map_err(|_| PostError::Invalid)?;
        let seq = self.sq_base + self.sq.len() as u64;
        self.sq.push_back(SqSlot {
            wr_id: wr.wr_id,
            opcode,
            byte_len,
            signaled: wr.signaled,
            status: None,
        });
        if matches!(
            self.qp,
            QpState::Error | QpState::Terminate | QpState::Closing
        ) {
            self.finish_sq(seq, WcStatus::WrFlushError);
        } else {
            self.pending.push_back(PendingSend { seq, wr });
            self.inline_changed();
        }
        Ok(())
    }

    /// Posts a receive. Posting to a dead QP completes it with a flush error.
    pub fn post_recv(&mut self, wr: RecvWr) -> Result<(), PostError> {
        if self.rq.len() >= self.cfg.rq_depth {
            return Err(PostError::QueueFull);
        }
        let total: u64 = wr.sgl.iter().map(|s| u64::from(s.length)).sum();
        if u32::try_from(total).is_err() {
            return Err(PostError::Invalid);
        }
        if matches!(
            self.qp,
            QpState::Error | QpState::Terminate | QpState::Closing
        ) {
            self.completions.push_back(WorkCompletion {
                wr_id: wr.wr_id,
                status: WcStatus::WrFlushError,
                opcode: WcOpcode::Recv,
                queue: WorkQueue::Recv,
                byte_len: 0,
                invalidated: None,
                solicited: false,
            });
        } else {
            self.rq.push_back(PostedRecv { wr });
        }
        Ok(())
    }

    /// Visits the posted receives in the order incoming Sends consume
    /// them, oldest first, until `f` returns `false`: `f` gets each one's
    /// `wr_id` and its scatter list to change, or `None` for the receive a
    /// Send is being placed into now (its buffers are fixed until it
    /// completes). A receive whose list is changed here takes the next
    /// Send into the new buffers, which must pass the same checks as at
    /// posting (registered, local write) when that Send starts: a receive
    /// that fails them completes with a protection error, as a bad posted
    /// one does. This is how a sockets layer points receives it posted
    /// into its own slots at a program's buffer while no byte of theirs
    /// has arrived (zero-copy reads), and points them back after.
    pub fn retarget_recvs(&mut self, mut f: impl FnMut(u64, Option<&mut Sgl>) -> bool) {
        let busy = self.rx.send_in_progress();
        for (i, r) in self.rq.iter_mut().enumerate() {
            let sgl = (i > 0 || !busy).then_some(&mut r.wr.sgl);
            if !f(r.wr.wr_id, sgl) {
                return;
            }
        }
    }

    /// Send-queue requests posted and not yet completed.
    pub fn sq_outstanding(&self) -> usize {
        self.sq.len()
    }

    /// Whether a Read Response still to be sent reads region `stag` (an
    /// inbound Read Request queued or being answered).
    pub fn reads_pending_from(&self, stag: Stag) -> bool {
        self.irq
            .iter()
            .any(|e| e.source.is_some_and(|r| r.stag == stag))
    }

    /// Receives posted and not yet consumed.
    pub fn rq_outstanding(&self) -> usize {
        self.rq.len()
    }

    /// Graceful close (`rdma_disconnect`): outstanding requests are flushed,
    /// the QP goes to Error, and the engine should send FIN.
    pub fn close(&mut self) {
        self.close_for(CloseReason::Local);
    }

    /// Why the connection ended, once it has (the first cause: a reset
    /// that follows our own Terminate still reads as the Terminate).
    pub fn close_reason(&self) -> Option<CloseReason> {
        self.close_reason
    }

    /// Records the first cause of the end of the connection.
    fn note_close(&mut self, reason: CloseReason) {
        self.close_reason.get_or_insert(reason);
    }

    /// Closes for `reason`: flush, Error, ask for FIN, one
    /// [`Event::Closed`] carrying the first recorded cause.
    fn close_for(&mut self, reason: CloseReason) {
        self.note_close(reason);
        if self.close_after_flush {
            return;
        }
        if self.cm != CmState::Fpdu {
            self.cm = CmState::Done;
        }
        self.enter_error();
        self.close_after_flush = true;
        self.rx.discard();
        let reason = self.close_reason.unwrap_or(reason);
        self.events.push_back(Event::Closed(reason));
    }

    /// Fails the connection for a local reason the core cannot see (the
    /// engine lost a region it was placing into, or a socket error):
    /// sends Terminate RDMAP/local catastrophic (or `code`, when given),
    /// completes the active request with `LocalProtectionError` when
    /// `protection` is set, flushes the rest, and asks for close.
    pub fn fail_local(&mut self, code: Option<TermCode>, protection: bool) {
        if protection {
            if let Some(slot) = self.sq.iter_mut().find(|s| s.status.is_none()) {
                slot.status = Some(WcStatus::LocalProtectionError);
            }
        }
        self.send_terminate(
            code.unwrap_or(TermCode::RDMAP_LOCAL_CATASTROPHIC),
            cm::Attach::Nothing,
        );
        self.rx.discard();
    }

    /// The peer closed its side of the TCP stream (a read returned 0).
    pub fn handle_eof(&mut self) {
        self.handle_stream_end(None);
    }

    /// The TCP stream failed (the engine's read or write returned an
    /// error it classified as `e`). Like [`Self::handle_eof`], but the
    /// cause is kept: [`Event::ConnectFailed`] with
    /// [`ConnectError::Transport`] during setup, else [`Event::Closed`]
    /// with [`CloseReason::Transport`], and flushed requests name it.
    pub fn handle_transport_error(&mut self, e: TransportError) {
        self.handle_stream_end(Some(e));
    }

    fn handle_stream_end(&mut self, err: Option<TransportError>) {
        let reason = err.map_or(CloseReason::PeerClosed, CloseReason::Transport);
        if self.close_after_flush {
            // Already closing (our own close or Terminate came first); a
            // later failure is still worth recording if nothing was.
            self.note_close(reason);
            return;
        }
        match self.cm {
            CmState::AwaitReply | CmState::AwaitRequest | CmState::AwaitAccept => {
                self.note_close(reason);
                self.fail_setup(err.map_or(ConnectError::Eof, ConnectError::Transport));
            }
            _ => self.close_for(reason),
        }
    }

    // ----- completion bookkeeping ---------------------------------------

    /// Records the outcome of SQ request `seq` and releases every
    /// completion that is now at the head of the queue, in order.
    fn finish_sq(&mut self, seq: u64, status: WcStatus) {
        let Some(idx) = seq.checked_sub(self.sq_base) else {
            return;
        };
        if let Some(slot) = self.sq.get_mut(idx as usize) {
            if slot.status.is_none() {
                slot.status = Some(status);
            }
        }
        while let Some(head) = self.sq.front() {
            let Some(status) = head.status else { break };
            let head = self.sq.pop_front().expect("front exists");
            self.sq_base += 1;
            if head.signaled || status != WcStatus::Success {
                self.completions.push_back(WorkCompletion {
                    wr_id: head.wr_id,
                    status,
                    opcode: head.opcode,
                    queue: WorkQueue::Send,
                    byte_len: if status == WcStatus::Success {
                        head.byte_len
                    } else {
                        0
                    },
                    invalidated: None,
                    solicited: false,
                });
            }
        }
    }

    /// Moves the QP to Error and flushes every outstanding request:
    /// unfinished SQ requests complete with `WrFlushError` (unless already
    /// given a more specific status), then every posted receive.
    fn enter_error(&mut self) {
        if self.qp == QpState::Error {
            return;
        }
        self.qp = QpState::Error;
        self.deadline = None;
        self.pending.clear();
        self.orq.clear();
        self.irq.clear();
        self.tx.abort_message();
        self.inline_changed();
        for i in 0..self.sq.len() {
            if self.sq[i].status.is_none() {
                self.sq[i].status = Some(WcStatus::WrFlushError);
            }
        }
        let base = self.sq_base;
        self.finish_sq(base, WcStatus::WrFlushError);
        while let Some(r) = self.rq.pop_front() {
            self.completions.push_back(WorkCompletion {
                wr_id: r.wr.wr_id,
                status: WcStatus::WrFlushError,
                opcode: WcOpcode::Recv,
                queue: WorkQueue::Recv,
                byte_len: 0,
                invalidated: None,
                solicited: false,
            });
        }
    }

    fn fail_setup(&mut self, err: ConnectError) {
        self.cm = CmState::Done;
        self.events.push_back(Event::ConnectFailed(err));
        self.enter_error();
        self.close_after_flush = true;
        self.rx.discard();
    }
}
