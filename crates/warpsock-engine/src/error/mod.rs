//! The engine's error type.
//!
//! Each operation that can fail has its own error, naming what failed:
//! [`CmError`] for connection setup, [`PostError`] for a post,
//! [`BatchPostError`] for a batch post, [`WcError`] for a failed work
//! request. [`Error`] is the crate-level type every one of them converts
//! into, so an application can use one `Result` and `?` throughout; it
//! also covers the system calls behind a context or a completion queue.
//!
//! Errors live here, below the modules that raise them (`cm`, `qp`, `cq`,
//! ...), so that the dependency runs one way: handles import errors,
//! never the other way round.

use std::io;

use warpsock_proto::{PostError, TransportError};

use crate::wc::WcError;

mod cm;

pub use cm::CmError;

/// Any error of the engine's public API.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A system call the engine needed failed (creating an epoll set, an
    /// eventfd or the progress thread; waiting; `mlock`).
    #[error("{what} failed: {source}")]
    Sys {
        /// What the engine was doing.
        what: &'static str,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// Connection setup failed.
    #[error(transparent)]
    Cm(#[from] CmError),
    /// A post failed.
    #[error(transparent)]
    Post(#[from] PostError),
    /// A batch post stopped partway.
    #[error(transparent)]
    Batch(#[from] BatchPostError),
    /// A work request completed with an error.
    #[error(transparent)]
    Completion(#[from] WcError),
}

impl Error {
    pub(crate) fn sys(what: &'static str) -> impl FnOnce(io::Error) -> Self {
        move |source| Self::Sys { what, source }
    }

    /// Whether this is a wait a signal ended (`EINTR`; see
    /// [`crate::Cq::wait_news`]).
    pub fn is_interrupted(&self) -> bool {
        matches!(self, Self::Sys { source, .. } if source.kind() == io::ErrorKind::Interrupted)
    }
}

impl From<Error> for io::Error {
    /// System errors keep their OS error; the rest become `Other` with the
    /// message.
    fn from(e: Error) -> Self {
        match e {
            Error::Sys { source, .. } | Error::Cm(CmError::Io(source)) => source,
            e => Self::other(e),
        }
    }
}

/// [`crate::Qp::post_send_batch`] stopped at a request it could not post.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("posted {posted} work requests, then: {source}")]
pub struct BatchPostError {
    /// Requests posted before the failing one (they are being sent and
    /// will complete).
    pub posted: usize,
    /// Why the next one was refused.
    #[source]
    pub source: PostError,
}

/// A `Result` with the engine's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The core's view of a socket error: reset, timeout, or another `errno`.
pub(crate) fn transport_error(e: &io::Error) -> TransportError {
    match e.raw_os_error() {
        Some(libc::ECONNRESET | libc::EPIPE | libc::ECONNABORTED) => TransportError::Reset,
        Some(libc::ETIMEDOUT) => TransportError::TimedOut,
        Some(n) => TransportError::Os(n),
        None if e.kind() == io::ErrorKind::TimedOut => TransportError::TimedOut,
        None => TransportError::Os(libc::EIO),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Socket errors keep their meaning on the way to the core.
    #[test]
    fn socket_errors_are_classified() {
        let e = |n| transport_error(&io::Error::from_raw_os_error(n));
        assert_eq!(e(libc::ECONNRESET), TransportError::Reset);
        assert_eq!(e(libc::EPIPE), TransportError::Reset);
        assert_eq!(e(libc::ETIMEDOUT), TransportError::TimedOut);
        assert_eq!(
            e(libc::EHOSTUNREACH),
            TransportError::Os(libc::EHOSTUNREACH)
        );
    }
}
