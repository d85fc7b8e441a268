//! Test fixtures shared by warpsock's crates (a dev-dependency only; never
//! published).
//!
//! Before this crate each crate's `tests/` carried its own copy of the same
//! helpers. They live here once:
//!
//! - [`ports`]: loopback listeners on port 0 (pass the listener, never a
//!   port number that someone else may take first), and [`lease_port`] for
//!   programs that must bind a port themselves;
//! - [`rng`]: the xorshift64* generator and the deterministic byte
//!   [`pattern`] both ends of a transfer compute to verify the bytes;
//! - [`verbs`]: [`wait_n`] completions with a bound, Send work-request
//!   builders;
//! - [`child`]: child processes with a time limit, killed by pid when the
//!   limit passes or the guard drops;
//! - [`cdylib()`]: a workspace package's shared library, built for the test
//!   run's profile before a test loads it (`cargo test` builds none).
//!
//! Every wait here is bounded ([`LIMIT`] unless the caller gives another)
//! and synchronises on an event (a completion, a pidfd, a pipe), never on a
//! sleep.
//!
//! Use from integration tests (`tests/*.rs`) only: a crate's own unit tests
//! would see a second copy of its types through this crate.

pub mod cdylib;
pub mod child;
pub mod ports;
pub mod rng;
pub mod verbs;

pub use cdylib::cdylib;
pub use child::{finish, listening_port, wait_exit, Finished, Guard};
pub use ports::{
    is_leased, lease_port, loopback_listener, loopback_udp, try_lease_port, PortLease, RefusingPort,
};
pub use rng::{pattern, Rng};
pub use verbs::{send, send_wr, wait_n, LIMIT};
