//! The command's error: one line of text for the user.

use std::fmt;

/// A failed run, printed as `warpsock: error: <message>` with exit status 1.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Error(String);

impl Error {
    /// An error with this message.
    pub(crate) fn msg(m: impl fmt::Display) -> Self {
        Self(m.to_string())
    }

    /// The same error with `what: ` in front.
    pub(crate) fn context(self, what: impl fmt::Display) -> Self {
        Self(format!("{what}: {}", self.0))
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Error {}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        Self(e.to_string())
    }
}

impl From<warpsock_engine::CmError> for Error {
    fn from(e: warpsock_engine::CmError) -> Self {
        Self(e.to_string())
    }
}

impl From<warpsock_engine::Error> for Error {
    fn from(e: warpsock_engine::Error) -> Self {
        Self(e.to_string())
    }
}

impl From<warpsock_engine::BatchPostError> for Error {
    fn from(e: warpsock_engine::BatchPostError) -> Self {
        Self(format!("cannot post a work request: {e}"))
    }
}

impl From<warpsock_engine::PostError> for Error {
    fn from(e: warpsock_engine::PostError) -> Self {
        Self(format!("cannot post a work request: {e}"))
    }
}
