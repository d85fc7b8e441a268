//! [`CmError`]: why connection setup failed.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use warpsock_proto::{CloseReason, ConnectError, PostError, TransportError};

use super::transport_error;

/// Why connection setup failed. Its `Debug` prints the length of
/// [`CmError::Rejected`]'s `early` bytes, not the bytes (the peer's
/// application data).
#[derive(thiserror::Error)]
#[non_exhaustive]
pub enum CmError {
    /// The address did not resolve.
    #[error("cannot resolve the address: {0}")]
    Resolve(#[source] io::Error),
    /// Nothing accepts connections at that address and port.
    #[error("connection refused by {addr}: nothing is listening on that port")]
    Refused {
        /// Address tried.
        addr: SocketAddr,
    },
    /// No route to the host or network.
    #[error("{addr} is unreachable: {source}")]
    Unreachable {
        /// Address tried.
        addr: SocketAddr,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// A setup step did not finish in time.
    #[error("timed out after {after:?} waiting for the {stage}{}", peer_suffix(*.addr))]
    Timeout {
        /// The peer, when known.
        addr: Option<SocketAddr>,
        /// Which step: "TCP connect", "TCP accept", "MPA reply", "MPA request".
        stage: &'static str,
        /// The time allowed.
        after: Duration,
    },
    /// The connection ended during setup: the peer closed it (FIN), reset
    /// it, it timed out, or another socket error ended it.
    #[error("{reason} while waiting for the {stage}{}", peer_suffix(*.addr))]
    Closed {
        /// The peer, when known.
        addr: Option<SocketAddr>,
        /// Which step: "MPA reply", "MPA request", "MPA reply send".
        stage: &'static str,
        /// How it ended.
        reason: CloseReason,
    },
    /// The responder rejected the connection with this private data
    /// ([`CmError::rejected`] makes one; fields may be added).
    #[non_exhaustive]
    #[error("the peer rejected the connection ({} bytes of private data)", .private_data.len())]
    Rejected {
        /// The responder's private data.
        private_data: Vec<u8>,
        /// Stream bytes read behind the Reply: after a Reject the
        /// connection is the peer's byte stream again (a switch made in
        /// band, `warpsock_xsock`), and these come first in it.
        early: Vec<u8>,
    },
    /// MPA negotiation failed (malformed frame, incompatible options).
    #[error("MPA setup failed: {0}")]
    Mpa(#[source] ConnectError),
    /// Private data longer than [`crate::MAX_PRIVATE_DATA`].
    #[error("private data of {len} bytes is too long (at most {max} bytes)")]
    PrivateDataTooLong {
        /// Length given.
        len: usize,
        /// Limit.
        max: usize,
    },
    /// The protection domain and completion queues of a [`crate::QpInit`] come
    /// from different contexts.
    #[error("protection domain and completion queues belong to different contexts")]
    ContextMismatch,
    /// A receive in [`crate::QpInit::recvs`] could not be posted.
    #[error("cannot post an initial receive: {0}")]
    Post(#[source] PostError),
    /// The listener held as many pending MPA handshakes as it allows
    /// ([`crate::Listener::set_max_pending`]); a newer connection took this
    /// one's place and it was closed.
    #[error("{addr} evicted: its MPA handshake was the oldest of {max} pending")]
    Evicted {
        /// The peer whose connection was closed.
        addr: SocketAddr,
        /// The limit.
        max: usize,
    },
    /// Another socket error.
    #[error("socket error: {0}")]
    Io(#[source] io::Error),
}

impl std::fmt::Debug for CmError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Resolve(e) => f.debug_tuple("Resolve").field(e).finish(),
            Self::Refused { addr } => f.debug_struct("Refused").field("addr", addr).finish(),
            Self::Unreachable { addr, source } => f
                .debug_struct("Unreachable")
                .field("addr", addr)
                .field("source", source)
                .finish(),
            Self::Timeout { addr, stage, after } => f
                .debug_struct("Timeout")
                .field("addr", addr)
                .field("stage", stage)
                .field("after", after)
                .finish(),
            Self::Closed {
                addr,
                stage,
                reason,
            } => f
                .debug_struct("Closed")
                .field("addr", addr)
                .field("stage", stage)
                .field("reason", reason)
                .finish(),
            // The peer's stream bytes (up to about 530) by their count:
            // they are its application's data, and errors get logged.
            Self::Rejected {
                private_data,
                early,
            } => f
                .debug_struct("Rejected")
                .field("private_data", private_data)
                .field("early_len", &early.len())
                .finish(),
            Self::Mpa(e) => f.debug_tuple("Mpa").field(e).finish(),
            Self::PrivateDataTooLong { len, max } => f
                .debug_struct("PrivateDataTooLong")
                .field("len", len)
                .field("max", max)
                .finish(),
            Self::ContextMismatch => f.write_str("ContextMismatch"),
            Self::Post(e) => f.debug_tuple("Post").field(e).finish(),
            Self::Evicted { addr, max } => f
                .debug_struct("Evicted")
                .field("addr", addr)
                .field("max", max)
                .finish(),
            Self::Io(e) => f.debug_tuple("Io").field(e).finish(),
        }
    }
}

fn peer_suffix(addr: Option<SocketAddr>) -> String {
    addr.map(|a| format!(" (peer {a})")).unwrap_or_default()
}

impl CmError {
    /// A [`CmError::Rejected`] with the responder's `private_data` and no
    /// stream bytes behind the Reply (the variant is `#[non_exhaustive]`:
    /// for tests and adapters outside this crate).
    pub fn rejected(private_data: Vec<u8>) -> Self {
        Self::Rejected {
            private_data,
            early: Vec::new(),
        }
    }

    /// Whether another attempt may succeed because the peer was not there
    /// yet: nothing listened, or the stream was closed or reset (or went
    /// silent) before the MPA exchange finished. A VM's slirp port forward
    /// accepts the host side of a TCP connection and resets it when nothing
    /// listens inside the guest yet, so a client of a server that re-listens
    /// between connections (perftest `-R`, `rping -s -P`) sees a reset
    /// where a local server would refuse. Rejections, incompatible MPA
    /// parameters and local errors are final.
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Refused { .. } | Self::Timeout { .. } => true,
            Self::Closed { reason, .. } => matches!(
                reason,
                CloseReason::PeerClosed
                    | CloseReason::Transport(TransportError::Reset | TransportError::TimedOut)
            ),
            Self::Mpa(e) => matches!(
                e,
                ConnectError::Eof
                    | ConnectError::Timeout
                    | ConnectError::Transport(TransportError::Reset | TransportError::TimedOut)
            ),
            Self::Io(e) | Self::Unreachable { source: e, .. } => matches!(
                e.kind(),
                io::ErrorKind::ConnectionReset
                    | io::ErrorKind::ConnectionAborted
                    | io::ErrorKind::UnexpectedEof
                    | io::ErrorKind::BrokenPipe
            ),
            _ => false,
        }
    }

    /// The connection failed during `stage` with a socket error.
    pub(crate) fn socket(addr: Option<SocketAddr>, stage: &'static str, e: io::Error) -> Self {
        match e.raw_os_error() {
            Some(n) if n != 0 => Self::Closed {
                addr,
                stage,
                reason: CloseReason::Transport(transport_error(&e)),
            },
            _ => Self::Io(e),
        }
    }

    pub(crate) fn from_connect(addr: SocketAddr, e: io::Error, after: Duration) -> Self {
        match e.raw_os_error() {
            Some(libc::ECONNREFUSED) => Self::Refused { addr },
            Some(libc::EHOSTUNREACH | libc::ENETUNREACH | libc::EADDRNOTAVAIL) => {
                Self::Unreachable { addr, source: e }
            }
            _ if e.kind() == io::ErrorKind::TimedOut => Self::Timeout {
                addr: Some(addr),
                stage: "TCP connect",
                after,
            },
            _ => Self::Io(e),
        }
    }
}

#[cfg(test)]
mod retry_tests {
    use super::*;
    use warpsock_proto::wire::terminate::TermCode;

    fn closed(reason: CloseReason) -> CmError {
        CmError::Closed {
            addr: None,
            stage: "MPA reply",
            reason,
        }
    }

    #[test]
    fn a_peer_not_there_yet_is_retryable_a_refusal_on_the_wire_is_not() {
        let addr: SocketAddr = "127.0.0.1:1".parse().unwrap();
        // slirp's forward: accepted, then reset before the MPA Reply.
        assert!(closed(CloseReason::Transport(TransportError::Reset)).is_retryable());
        assert!(closed(CloseReason::PeerClosed).is_retryable());
        assert!(CmError::Refused { addr }.is_retryable());
        assert!(CmError::Mpa(ConnectError::Eof).is_retryable());
        assert!(!CmError::Rejected {
            private_data: vec![],
            early: vec![]
        }
        .is_retryable());
        assert!(!CmError::rejected(vec![1]).is_retryable());
        assert!(!closed(CloseReason::Terminated {
            code: TermCode::ALL[0],
            by_peer: true
        })
        .is_retryable());
        assert!(!closed(CloseReason::Local).is_retryable());
        assert!(!CmError::Io(io::Error::from(io::ErrorKind::PermissionDenied)).is_retryable());
    }
}

#[cfg(test)]
mod debug_tests {
    use super::*;

    /// The peer's early stream bytes are not printed by `{:?}`, their
    /// count is (review r28-a item 10).
    #[test]
    fn debug_prints_the_early_bytes_length_not_the_bytes() {
        let e = CmError::Rejected {
            private_data: b"no".to_vec(),
            early: b"secret".to_vec(),
        };
        let d = format!("{e:?}");
        assert!(!d.contains("115"), "{d}"); // b's'
        assert!(d.contains("early_len: 6"), "{d}");
        assert_eq!(format!("{:?}", CmError::ContextMismatch), "ContextMismatch");
    }
}
