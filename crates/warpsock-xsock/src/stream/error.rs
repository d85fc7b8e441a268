//! Why a [`Stream`](super::Stream) refuses: the peer broke the DDP-socket
//! protocol ([`StreamError`], which ends the connection), or a one-sided
//! access falls outside what the peer announced ([`MapError`]).

use std::fmt;

use crate::wire::WireError;

/// The peer broke the protocol; the connection must end.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum StreamError {
    /// A malformed message.
    Wire(WireError),
    /// The peer sent more messages than it had credits for.
    Overrun {
        /// Our slots.
        slots: u16,
    },
    /// The peer returned more credits than it could owe.
    CreditOverflow {
        /// Credits we would hold.
        credits: u32,
        /// The peer's slots.
        slots: u16,
    },
    /// SINK_DONE for a sink we did not offer, or out of order.
    UnknownSink(u32),
    /// SINK_DONE placed bytes where it may not (after data it had declined
    /// with, or past the sink's end).
    SinkMisuse {
        /// Sink number.
        id: u32,
        /// Bytes it claims.
        len: u32,
    },
    /// Stream bytes after the peer's EOF.
    DataAfterEof,
    /// A late close ([`Body::ClosedLate`](crate::wire::Body::ClosedLate))
    /// before the peer's EOF: it says a close came after the end.
    ClosedLateBeforeEof,
    /// The peer made us hold more of something than the protocol lets a
    /// well-behaved peer make us hold (a queue it could otherwise grow
    /// without bound).
    TooMany {
        /// What: mappings ([`PEER_MAPS_MAX`](super::PEER_MAPS_MAX)) or
        /// sinks ([`PEER_SINKS_MAX`](super::PEER_SINKS_MAX)).
        what: &'static str,
        /// The bound.
        max: usize,
    },
}

impl fmt::Display for StreamError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Wire(e) => write!(f, "malformed message: {e}"),
            Self::Overrun { slots } => write!(
                f,
                "the peer sent more messages than the {slots} receive slots it was granted"
            ),
            Self::CreditOverflow { credits, slots } => write!(
                f,
                "the peer returned credits it never had ({credits} for {slots} slots)"
            ),
            Self::UnknownSink(id) => write!(f, "SINK_DONE for sink {id}, which is not outstanding"),
            Self::SinkMisuse { id, len } => {
                write!(
                    f,
                    "SINK_DONE of {len} bytes for sink {id} breaks the stream order"
                )
            }
            Self::DataAfterEof => f.write_str("stream bytes after the peer's end of stream"),
            Self::ClosedLateBeforeEof => {
                f.write_str("a close after the end of stream before the peer's end of stream")
            }
            Self::TooMany { what, max } => {
                write!(f, "the peer made us hold more than {max} {what}")
            }
        }
    }
}

impl std::error::Error for StreamError {}

impl From<WireError> for StreamError {
    fn from(e: WireError) -> Self {
        Self::Wire(e)
    }
}

/// Why a one-sided access cannot go ahead.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MapError {
    /// No mapping announced by the peer covers the range.
    NotMapped,
    /// The mapping does not allow that access.
    Access,
}
