//! # warpsock-xsock: extended sockets over DDP
//!
//! The extended sockets interface of the RDDP research (Balaji et al.,
//! "Supporting RDMA capable network compatibility and features for regular
//! network adapters", OSU 2005): a program switches a connected TCP socket
//! into DDP mode with `setsockopt`, keeps byte-stream semantics on it, and
//! gains message boundaries, zero-copy placement, one-sided reads and
//! writes and asynchronous operations on the same descriptor.
//!
//! This crate is the protocol, in two parts:
//!
//! * the **sans-IO core** — [`wire`] (message formats), [`switch`] (the
//!   in-band switch of an open TCP connection: when to mark, what to wait
//!   for, when to give up, and why that never loses or reorders a byte) and
//!   [`stream`] (the stream/message protocol over RDMAP Sends: credits,
//!   sinks, mappings, end of stream). No sockets, no threads, no clock
//!   reads: time is passed in. Tested with simulated time and in-memory
//!   pairs;
//! * the **I/O side** — [`io`]: performs a switch on a real socket and runs
//!   the stream protocol over the warpsock engine ([`warpsock_engine`]),
//!   one engine queue pair per socket. The preload library
//!   (`libwarpsock_preload.so`) maps the socket calls of programs onto it.
//!
//! ## Placement: why BCopy plus receiver-offered sinks
//!
//! Three designs are known for carrying a byte stream over RDMA:
//!
//! | design | small messages | large reads posted ahead | copies per byte received |
//! |---|---|---|---|
//! | SDP BCopy: Sends into posted bounce buffers, credit flow control | one Send (one FPDU) | a copy out of the bounce buffer | 1 |
//! | SDP ZCopy (SinkAvail): the reader offers its buffer, the writer RDMA-Writes into it | — | written in place, plus a round trip to offer | 0 |
//! | rsockets: RDMA Write into the peer's ring + a 4-byte Send to notify (iWARP has no immediate data) | a Write and a Send (two FPDUs) | a copy out of the ring | 1 |
//!
//! warpsock uses **BCopy for everything and a sink when a read of at least
//! `zcopy_min` bytes (64 KiB by default) finds nothing queued** — the SDP
//! combination. Why, and what was measured:
//!
//! * *Bytes copied per byte received* (the process counters,
//!   [`io::counters`]): a reader that posts 1 MiB reads ahead of the data
//!   gets every byte placed by RDMA Write, 0 copied (the
//!   `large_reads_posted_ahead_are_placed_without_a_copy` test asserts
//!   ≤ 0.05 and measures 0); the same bytes through BCopy or a remote ring
//!   are copied once (1.0) — the ring cannot meet the zero-copy goal at all.
//! * *FPDUs per small message*: BCopy is one Send (one FPDU: header and
//!   payload in one gathered `sendmsg`); rsockets on iWARP needs an RDMA
//!   Write into the ring **and** a 4-byte Send to notify (`RS_OPT_MSG_SEND`:
//!   iWARP has no immediate data), two FPDUs, two CRCs and two headers per
//!   message for the same copy count. The engine's per-FPDU cost is the
//!   dominant per-message cost (see `BENCHMARKS.md` §3), so the ring loses
//!   on latency without gaining on copies.
//! * *Large streams that outrun the reader* stay on BCopy (a sink is
//!   offered only when nothing is queued and is declined if bytes are in
//!   flight), which pipelines up to `slots` messages; the wall-clock cost
//!   of that copy against host TCP is in `BENCHMARKS.md` (DDP-mode section,
//!   with its commands).
//!
//! ## The wire
//!
//! See [`wire`]. Every message is one RDMAP Send (opcode Send, untagged,
//! queue 0) starting with an 8-byte header; sink data travels as RDMA
//! Writes; `riowrite`/`rioread` are RDMA Writes and Reads to STags the peer
//! announced. Everything is plain RFC 5040/5041/5044 on the wire, so tshark
//! decodes a captured DDP-mode connection as MPA/DDP/RDMAP.
#![deny(unsafe_code)]

pub mod io;
pub mod stream;
pub mod switch;
pub mod wire;

pub use stream::{MapError, Seg, SinkState, Stream, StreamError, TxStep};
pub use switch::{Limits, Role, Step, Switch, SwitchError};
pub use wire::Hello;
