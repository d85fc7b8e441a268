//! The I/O side: switches a real socket ([`switch_fd`]) and runs the
//! stream protocol over the warpsock engine ([`XSocket`]).

mod data;
mod rio;
mod socket;
mod switch;
mod sys;

pub use rio::{AioOp, Completion};
pub use socket::{counters, Counters, Options, Readiness, RecvFlags, XSocket};
pub use switch::{switch_fd, switch_fd_as, Failure};
