//! What an active side's failed connection setup becomes: the rdma_cm
//! event type and status Linux gives for the same failure on iWARP.
//!
//! The kernel path is: the iWARP driver reports `IW_CM_EVENT_CONNECT_REPLY`
//! with a status, and `cma_iw_handler()` (drivers/infiniband/core/cma.c)
//! maps -ECONNRESET and -ECONNREFUSED to REJECTED, -ETIMEDOUT to
//! UNREACHABLE, anything else to CONNECT_ERROR, passing the status on.
//! siw (siw_cm.c) reports -ECONNRESET for an MPA Reply with the Reject bit
//! and for a peer that closes or resets the stream while siw awaits the
//! MPA Reply (`SIW_CM_WORK_PEER_CLOSE` in `SIW_EPSTATE_AWAIT_MPAREP`), and
//! -ETIMEDOUT when the Reply does not come in time.
//!
//! # Retrying a stream that is reset before the MPA Reply
//!
//! A TCP forwarder in front of a port where nothing listens yet (qemu's
//! slirp `hostfwd`, as used with the siw VM; docker-proxy; `ssh -L`)
//! accepts the connection and then closes or resets it, where a host would
//! have refused the SYN. A server that re-listens between connections,
//! like perftest `-R` (its handshake connection, then the test's), is
//! briefly in that state. So a stream that ends before any MPA Reply is
//! tried again, a bounded number of times ([`Backoff`]: 5 more attempts
//! over about 3 s); only then is the failure reported (REJECTED
//! -ECONNRESET, as above).

use std::ffi::{c_int, c_uint};
use std::time::Duration;

use warpsock_engine::proto::ConnectError;
use warpsock_engine::{CloseReason, CmError, TransportError};

use crate::abi_cm::*;

/// The event, its status and private data for a failed `rdma_connect`.
pub fn connect_failed(e: &CmError) -> (c_uint, c_int, Vec<u8>) {
    let rejected = |status| (RDMA_CM_EVENT_REJECTED, status, Vec::new());
    let unreachable = |status| (RDMA_CM_EVENT_UNREACHABLE, status, Vec::new());
    match e {
        CmError::Rejected { private_data, .. } => (
            RDMA_CM_EVENT_REJECTED,
            -libc::ECONNRESET,
            private_data.clone(),
        ),
        // Nothing listening: an iWARP RNIC's answer.
        CmError::Refused { .. } => rejected(-libc::ECONNREFUSED),
        CmError::Unreachable { source, .. } => {
            unreachable(-source.raw_os_error().unwrap_or(libc::EHOSTUNREACH))
        }
        CmError::Timeout { .. } => unreachable(-libc::ETIMEDOUT),
        // The peer closed or reset the stream during the MPA exchange.
        CmError::Closed {
            reason: CloseReason::PeerClosed | CloseReason::Transport(TransportError::Reset),
            ..
        }
        | CmError::Mpa(ConnectError::Eof | ConnectError::Transport(TransportError::Reset)) => {
            rejected(-libc::ECONNRESET)
        }
        CmError::Closed {
            reason: CloseReason::Transport(TransportError::TimedOut),
            ..
        }
        | CmError::Mpa(ConnectError::Timeout | ConnectError::Transport(TransportError::TimedOut)) => {
            unreachable(-libc::ETIMEDOUT)
        }
        CmError::Io(io) => match io.raw_os_error() {
            Some(libc::ECONNRESET | libc::EPIPE) | None => rejected(-libc::ECONNRESET),
            Some(libc::ETIMEDOUT) => unreachable(-libc::ETIMEDOUT),
            Some(e) => (RDMA_CM_EVENT_CONNECT_ERROR, -e, Vec::new()),
        },
        // Malformed or incompatible MPA frames, local errors.
        _ => (RDMA_CM_EVENT_CONNECT_ERROR, -libc::EPROTO, Vec::new()),
    }
}

/// Whether `e` is a stream that the peer closed or reset before its MPA
/// Reply (what a forwarder with nothing behind it does): worth another
/// attempt, see the module doc.
pub fn ended_before_reply(e: &CmError) -> bool {
    matches!(
        e,
        CmError::Closed {
            reason: CloseReason::PeerClosed | CloseReason::Transport(TransportError::Reset),
            ..
        } | CmError::Mpa(ConnectError::Eof | ConnectError::Transport(TransportError::Reset))
    ) || matches!(e, CmError::Io(io) if matches!(io.raw_os_error(), Some(libc::ECONNRESET | libc::EPIPE)))
}

/// The waits between connection attempts: 100 ms doubling, 5 at most
/// (3.1 s in all).
#[derive(Debug, Clone)]
pub struct Backoff {
    next: Duration,
    left: u32,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            next: Duration::from_millis(100),
            left: 5,
        }
    }
}

impl Backoff {
    /// The wait before the next attempt, or None when none is left.
    pub fn next_wait(&mut self) -> Option<Duration> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        let w = self.next;
        self.next *= 2;
        Some(w)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io;

    fn kind(e: CmError) -> (c_uint, c_int) {
        let (k, s, _) = connect_failed(&e);
        (k, s)
    }

    #[test]
    fn a_peer_that_closes_or_resets_during_mpa_is_rejected_econnreset() {
        let closed = |reason| CmError::Closed {
            addr: None,
            stage: "MPA reply",
            reason,
        };
        let want = (RDMA_CM_EVENT_REJECTED, -libc::ECONNRESET);
        assert_eq!(kind(closed(CloseReason::PeerClosed)), want);
        assert_eq!(
            kind(closed(CloseReason::Transport(TransportError::Reset))),
            want
        );
        assert_eq!(kind(CmError::Mpa(ConnectError::Eof)), want);
        assert_eq!(
            kind(CmError::Mpa(ConnectError::Transport(TransportError::Reset))),
            want
        );
        assert_eq!(
            kind(CmError::Io(io::Error::from_raw_os_error(libc::ECONNRESET))),
            want
        );
    }

    #[test]
    fn only_a_stream_ended_before_the_reply_is_retried_and_boundedly() {
        assert!(ended_before_reply(&CmError::Mpa(ConnectError::Eof)));
        assert!(ended_before_reply(&CmError::Closed {
            addr: None,
            stage: "MPA reply",
            reason: CloseReason::Transport(TransportError::Reset),
        }));
        assert!(!ended_before_reply(&CmError::rejected(Vec::new())));
        assert!(!ended_before_reply(&CmError::Mpa(ConnectError::Timeout)));
        assert!(!ended_before_reply(&CmError::Refused {
            addr: "127.0.0.1:1".parse().unwrap()
        }));
        let mut b = Backoff::default();
        let waits: Vec<_> = std::iter::from_fn(|| b.next_wait()).collect();
        assert_eq!(waits.len(), 5);
        assert_eq!(waits.iter().sum::<Duration>(), Duration::from_millis(3100));
    }

    #[test]
    fn timeouts_are_unreachable_and_protocol_errors_connect_error() {
        assert_eq!(
            kind(CmError::Mpa(ConnectError::Timeout)),
            (RDMA_CM_EVENT_UNREACHABLE, -libc::ETIMEDOUT)
        );
        assert_eq!(
            kind(CmError::Closed {
                addr: None,
                stage: "MPA reply",
                reason: CloseReason::Transport(TransportError::TimedOut),
            }),
            (RDMA_CM_EVENT_UNREACHABLE, -libc::ETIMEDOUT)
        );
        assert_eq!(
            kind(CmError::Mpa(ConnectError::Incompatible(
                warpsock_engine::proto::wire::terminate::TermCode::MPA_INVALID_REQ_REP
            ))),
            (RDMA_CM_EVENT_CONNECT_ERROR, -libc::EPROTO)
        );
        let (k, s, pd) = connect_failed(&CmError::rejected(b"no".to_vec()));
        assert_eq!(
            (k, s, pd),
            (RDMA_CM_EVENT_REJECTED, -libc::ECONNRESET, b"no".to_vec())
        );
    }
}
