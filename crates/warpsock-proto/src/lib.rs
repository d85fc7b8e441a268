//! The sans-IO iWARP protocol core.
//!
//! `warpsock-proto` implements MPA negotiation (RFC 5044, RFC 6581), DDP
//! placement (RFC 5041) and RDMAP operations (RFC 5040) as a deterministic
//! state machine: bytes in, bytes, events and completions out. It contains
//! no networking code, starts no threads and reads no clock: the current
//! time is passed in where it matters. Two [`Connection`]s can therefore
//! be run against each other entirely in memory, with the byte stream cut,
//! delayed or corrupted at will, and the same code runs under the socket
//! engine.
//!
//! * [`mem`] — protection domains and the STag table;
//! * [`verbs`] — work requests and completions;
//! * [`ring`] — the posted-receive queue;
//! * [`conn`] — one connection/queue pair: setup, receive path with the
//!   direct-placement contract, transmit path as gather lists.
//!
//! The wire formats live in [`warpsock_wire`].
#![forbid(unsafe_code)]

pub mod conn;
pub mod mem;
pub mod ring;
pub mod verbs;

pub use conn::AcceptError;
pub use conn::{
    CloseReason, Config, ConnectError, ConnectRequest, Connection, Event, GatheredFpdu, Negotiated,
    PostError, QpState, Role, RtrOffer, RtrType, RxPiece, RxStep, TransportError, TxCounts, TxPart,
    TxSegment,
};
pub use mem::{Access, Backing, MemError, PdId, Range, Registry, Stag};
pub use verbs::{RecvWr, SendOp, SendWr, Sge, Sgl, WcOpcode, WcStatus, WorkCompletion, WorkQueue};
pub use warpsock_wire as wire;
