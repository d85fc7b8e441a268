//! The I/O side: switches a real socket ([`switch_fd`]) and runs the
//! stream protocol over the warpsock engine ([`XSocket`]).
//!
//! Dependencies run one way: this module uses the sans-IO core
//! ([`crate::switch`], [`crate::stream`], [`crate::wire`]), which never
//! names it. Inside, `handshake` (the switch on a socket), `data` and
//! `rio` (the calls) build on `socket` (the books and the engine), which
//! uses only the leaf modules `gather`, `slots` and `sys` — and `rio`'s
//! per-socket state types. `setup` builds a socket (its engine context and
//! queue pair); `wait` drives the engine for a waiting call; `watch` says
//! when the socket needs a progress thread; `closing` is the orderly close,
//! blocking or in non-blocking steps; `forklist` (a leaf) is the
//! process-wide lock (or list) a forked child starts afresh; `residue_cap`
//! (a leaf) the budget the switches' residues share.

mod closing;
mod data;
mod forklist;
mod gather;
mod handshake;
mod placed;
mod posts;
mod quiet;
mod residue_cap;
mod rio;
mod settings;
mod setup;
mod sink;
mod slots;
mod sndbuf;
mod socket;
mod sys;
#[cfg(test)]
mod test_pair;
mod wait;
mod watch;

pub use closing::{Begun, Closing, Phase};
pub use forklist::{ForkList, ForkLock};
pub use handshake::{
    answer_busy, switch_fd, switch_fd_as, switch_fd_declinable, BusyAnswer, Commit, Failure,
};
pub use quiet::Spun;
pub use residue_cap::ResidueBudget;
pub use rio::{AioOp, Completion};
pub use settings::{counters, Counters, Options, Readiness, RecvFlags};
pub use sndbuf::{
    buffered_bytes, for_each_holder, forget_after_fork, posted_bytes, reset_buffered,
    try_reset_buffered, SNDBUF_MAX, SNDBUF_MIN,
};
pub use socket::XSocket;
pub use sys::{readable, restart_after_signal, urgent_ahead};
pub use watch::Round;
