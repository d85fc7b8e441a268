//! Result codes, their messages, and the per-thread detail of the last
//! failure. Modelled on rustls-ffi `error.rs`.
//!
//! The C functions that read them (`warpsock_result_str`, ...) are in
//! `error_text`: this module depends on nothing else of the crate, and
//! the pointer helpers (`ffi`) and the panic boundary (`panic`) depend on
//! it, one way.

use std::cell::RefCell;
use std::ffi::CStr;
use std::io;

use warpsock_engine::{CloseReason, CmError, PostError, TransportError};

/// The outcome of a warpsock call. `WARPSOCK_RESULT_OK` (0) is success;
/// everything else is an error whose text `warpsock_result_str` and
/// `warpsock_result_message` give. The numeric values are stable; related
/// codes share a hundred (1xx sockets and addresses, 2xx connection
/// setup, 3xx posting work requests, 4xx memory regions, 5xx how a
/// connection ended), leaving room for new codes in each group.
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum warpsock_result {
    /// Success.
    Ok = 0,
    /// A required pointer argument was NULL.
    NullParameter = 1,
    /// An argument had a value outside its allowed set or range (unknown
    /// enum value, address string that is not UTF-8, ...).
    InvalidParameter = 2,
    /// The output buffer is too small; nothing was written.
    InsufficientSize = 3,
    /// warpsock panicked (a bug): the call did nothing reliable.
    Panic = 4,
    /// A socket or system error (see `warpsock_last_error_detail`).
    Io = 100,
    /// The address did not resolve or has no usable entry.
    AddressResolve = 101,
    /// The address to listen on is already in use.
    AddressInUse = 102,
    /// Nothing accepts connections at that address and port.
    ConnectionRefused = 200,
    /// No route to the host or network.
    Unreachable = 201,
    /// A setup step (TCP connect, TCP accept, MPA request or reply) did
    /// not finish in time.
    Timeout = 202,
    /// The responder rejected the connection.
    Rejected = 203,
    /// MPA negotiation failed (malformed frame, incompatible options, or
    /// the connection closed during setup).
    MpaFailed = 204,
    /// Private data longer than `WARPSOCK_MAX_PRIVATE_DATA` bytes.
    PrivateDataTooLong = 205,
    /// The protection domain and completion queues come from different
    /// contexts.
    ContextMismatch = 206,
    /// The work queue is at its configured depth.
    QueueFull = 300,
    /// The work request is malformed (unknown opcode, a Read with more
    /// than one scatter element, a message above 2^32 - 1 bytes).
    InvalidWorkRequest = 301,
    /// An offset and length reach outside the memory region.
    OutOfBounds = 400,
    /// Locking the region's pages in RAM (`mlock`) failed.
    MemoryLock = 401,
    /// The peer closed the connection (TCP FIN).
    PeerClosed = 500,
    /// The peer reset the connection (TCP RST).
    PeerReset = 501,
    /// The connection timed out: sent data stayed unacknowledged past the
    /// TCP user timeout, or keepalive probes went unanswered (the peer is
    /// dead or unreachable).
    ConnectionTimedOut = 502,
    /// The peer sent a Terminate (its code is in the event or completion).
    TerminateReceived = 503,
    /// We sent the peer a Terminate (it broke the protocol; the code is in
    /// the event or completion).
    TerminateSent = 504,
    /// A local work request failed (bad local buffer, or a region
    /// deregistered under an active request) and took the queue pair down.
    LocalError = 505,
    /// The connection was closed locally (disconnect).
    ClosedLocally = 506,
}

impl warpsock_result {
    /// Every code, in numeric order.
    pub const ALL: &'static [Self] = &[
        Self::Ok,
        Self::NullParameter,
        Self::InvalidParameter,
        Self::InsufficientSize,
        Self::Panic,
        Self::Io,
        Self::AddressResolve,
        Self::AddressInUse,
        Self::ConnectionRefused,
        Self::Unreachable,
        Self::Timeout,
        Self::Rejected,
        Self::MpaFailed,
        Self::PrivateDataTooLong,
        Self::ContextMismatch,
        Self::QueueFull,
        Self::InvalidWorkRequest,
        Self::OutOfBounds,
        Self::MemoryLock,
        Self::PeerClosed,
        Self::PeerReset,
        Self::ConnectionTimedOut,
        Self::TerminateReceived,
        Self::TerminateSent,
        Self::LocalError,
        Self::ClosedLocally,
    ];

    /// The code with numeric value `n`, if there is one.
    pub fn from_u32(n: u32) -> Option<Self> {
        Self::ALL.iter().copied().find(|r| *r as u32 == n)
    }

    /// What the code means.
    pub fn message(self) -> &'static CStr {
        match self {
            Self::Ok => c"success",
            Self::NullParameter => c"a required pointer argument was NULL",
            Self::InvalidParameter => c"an argument is outside its allowed values",
            Self::InsufficientSize => c"the output buffer is too small",
            Self::Panic => c"internal error: warpsock panicked (please report this bug)",
            Self::Io => c"socket or system error",
            Self::AddressResolve => c"the address does not resolve",
            Self::AddressInUse => c"the address is already in use",
            Self::ConnectionRefused => {
                c"connection refused: nothing is listening at that address and port"
            }
            Self::Unreachable => c"the host or network is unreachable",
            Self::Timeout => c"connection setup timed out",
            Self::Rejected => c"the peer rejected the connection",
            Self::MpaFailed => c"MPA negotiation failed",
            Self::PrivateDataTooLong => c"private data is longer than 251 bytes",
            Self::ContextMismatch => {
                c"the protection domain and completion queues belong to different contexts"
            }
            Self::QueueFull => c"the work queue is full",
            Self::InvalidWorkRequest => c"malformed work request",
            Self::OutOfBounds => c"offset and length reach outside the memory region",
            Self::MemoryLock => c"cannot lock the memory region in RAM (mlock)",
            Self::PeerClosed => c"peer closed the connection",
            Self::PeerReset => c"peer reset the connection",
            Self::ConnectionTimedOut => c"connection timed out (peer dead or unreachable)",
            Self::TerminateReceived => c"peer sent a Terminate",
            Self::TerminateSent => c"sent a Terminate to the peer (it broke the protocol)",
            Self::LocalError => c"a local work request failed",
            Self::ClosedLocally => c"the connection was closed locally",
        }
    }
}

/// Message for a number that is not a code.
pub(crate) const UNKNOWN: &CStr = c"unknown warpsock result code";

thread_local! {
    /// Text of the last failure on this thread.
    pub(crate) static DETAIL: RefCell<String> = const { RefCell::new(String::new()) };
}

/// Records `detail` as this thread's last failure and returns `code`.
pub(crate) fn fail(code: warpsock_result, detail: impl std::fmt::Display) -> warpsock_result {
    DETAIL.with(|d| {
        let mut d = d.borrow_mut();
        d.clear();
        use std::fmt::Write as _;
        let _ = write!(d, "{detail}");
    });
    code
}

/// The code for a connection-manager error (its text becomes the detail).
pub(crate) fn cm_error(e: &CmError) -> warpsock_result {
    let code = match e {
        CmError::Resolve(_) => warpsock_result::AddressResolve,
        CmError::Refused { .. } => warpsock_result::ConnectionRefused,
        CmError::Unreachable { .. } => warpsock_result::Unreachable,
        CmError::Timeout { .. } => warpsock_result::Timeout,
        CmError::Rejected { .. } => warpsock_result::Rejected,
        CmError::Mpa(_) => warpsock_result::MpaFailed,
        CmError::Closed { reason, .. } => close_reason_code(*reason),
        CmError::PrivateDataTooLong { .. } => warpsock_result::PrivateDataTooLong,
        CmError::ContextMismatch => warpsock_result::ContextMismatch,
        CmError::Post(p) => return post_error(*p),
        CmError::Io(io) => return io_error(io),
        _ => warpsock_result::Io,
    };
    fail(code, e)
}

/// The code that names how a connection ended (`Io` for a socket error
/// other than a reset or a timeout).
pub(crate) fn close_reason_code(r: CloseReason) -> warpsock_result {
    match r {
        CloseReason::Local => warpsock_result::ClosedLocally,
        CloseReason::PeerClosed => warpsock_result::PeerClosed,
        CloseReason::Transport(TransportError::Reset) => warpsock_result::PeerReset,
        CloseReason::Transport(TransportError::TimedOut) => warpsock_result::ConnectionTimedOut,
        CloseReason::Terminated { by_peer: true, .. } => warpsock_result::TerminateReceived,
        CloseReason::Terminated { by_peer: false, .. } => warpsock_result::TerminateSent,
        CloseReason::LocalError => warpsock_result::LocalError,
        _ => warpsock_result::Io,
    }
}

/// The detail that goes with [`close_reason_code`]: a Terminate's code
/// packed as `layer << 16 | etype << 8 | ecode`, a socket error's `errno`,
/// else 0.
pub(crate) fn close_reason_detail(r: CloseReason) -> u32 {
    match r {
        CloseReason::Terminated { code, .. } => {
            u32::from(code.layer) << 16 | u32::from(code.etype) << 8 | u32::from(code.ecode)
        }
        CloseReason::Transport(TransportError::Os(e)) => e as u32,
        _ => 0,
    }
}

/// The code for a failed post.
pub(crate) fn post_error(e: PostError) -> warpsock_result {
    let code = match e {
        PostError::QueueFull => warpsock_result::QueueFull,
        _ => warpsock_result::InvalidWorkRequest,
    };
    fail(code, e)
}

/// The code for a system error.
pub(crate) fn io_error(e: &io::Error) -> warpsock_result {
    io_code(e, e)
}

/// The code for an engine error (its text becomes the detail).
pub(crate) fn engine_error(e: &warpsock_engine::Error) -> warpsock_result {
    match e {
        warpsock_engine::Error::Sys { source, .. } => io_code(source, e),
        warpsock_engine::Error::Cm(c) => cm_error(c),
        warpsock_engine::Error::Post(p) => post_error(*p),
        _ => fail(warpsock_result::Io, e),
    }
}

fn io_code(e: &io::Error, detail: impl std::fmt::Display) -> warpsock_result {
    let code = match e.kind() {
        io::ErrorKind::AddrInUse => warpsock_result::AddressInUse,
        io::ErrorKind::AddrNotAvailable => warpsock_result::AddressResolve,
        io::ErrorKind::ConnectionRefused => warpsock_result::ConnectionRefused,
        io::ErrorKind::TimedOut => warpsock_result::Timeout,
        _ => warpsock_result::Io,
    };
    fail(code, detail)
}
