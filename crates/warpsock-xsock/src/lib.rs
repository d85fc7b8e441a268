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
//! ## Placement: BCopy plus sinks (retargeted receives on request)
//!
//! Four designs are known for carrying a byte stream over RDMA:
//!
//! | design | small messages | large reads posted ahead | bytes already in flight when the read comes | copies per byte received |
//! |---|---|---|---|---|
//! | SDP BCopy: Sends into posted bounce buffers, credit flow control | one Send (one FPDU) | copied out of the bounce buffer | copied | 1 |
//! | SDP ZCopy (SinkAvail): the reader offers its buffer, the writer RDMA-Writes into it | — | written in place, after a round trip to offer | declined (the writer is past the offer's position): copied | 0 for a reader ahead, 1 behind |
//! | rsockets: RDMA Write into the peer's ring + a 4-byte Send to notify (iWARP has no immediate data) | a Write and a Send (two FPDUs) | copied out of the ring | copied | 1 |
//! | **retargeted receives** (ours): the reader points the receives it posted for the peer's Sends, those no byte has reached yet, at its own buffer | one Send | placed by the engine as the Sends arrive | placed, if the engine has not started them into a slot | ≈ 0 ahead (32 B per 256 KiB message), less than 1 behind |
//!
//! warpsock uses **BCopy for small reads and for bytes already queued,
//! and offers the buffer as a sink (SDP ZCopy) when a blocking read of at
//! least `zcopy_min` bytes (64 KiB by default, all of a vectored read's
//! buffers together; [`io::Options::zcopy_min`]) finds nothing queued**.
//! Retargeted receives (`io/placed.rs`) are chosen with
//! [`io::Options::sinks`] `= false` (`WARPSOCK_DDP_SINKS=0` in the
//! preload). Both place a 1 MiB read posted ahead of the data with no
//! copy (`tests/placed.rs`, `tests/stream.rs`). Retargeting also places
//! bytes already in flight, but in a quiet interleaved run (session 12,
//! `BENCHMARKS.md` §6) a 1 MiB stream moved about 20 % less with it
//! (median 0.74× host TCP against 0.88× with sinks, five rounds each),
//! so sinks are the default. Why, and what was measured:
//!
//! * *Bytes copied per byte received* (the socket's counters,
//!   [`io::XSocket::stats`]; process-wide [`io::counters`]): a reader that
//!   posts 1 MiB blocking or `MSG_WAITALL` reads ahead of the data copies
//!   1,024 of 8,388,608 bytes (0.00012: each message's first 32 payload
//!   bytes stay in the slot with its header; `tests/placed.rs`, asserted
//!   ≤ 0.05). A sink gets 0 there too, but only with no byte in flight:
//!   the bandwidth benchmark's reader (8 messages in flight) finds the
//!   sender ahead of every offer; retargeting places what arrives after
//!   the read began whether or not it was sent before, and needs no offer
//!   round trip. `warpsock bench --tests bw --sizes 1m --transports
//!   ddp-socket`, release, load 1.3, three interleaved rounds: 6–15 %
//!   copied (median 10 %) against 99.4–99.8 % with sinks. What is still
//!   copied is what the engine read past the read's buffers into plain
//!   slots (it reads up to 8 MiB a round), which only an engine that can
//!   stop before a receive would avoid. That run (not a quiet machine)
//!   was slower with retargeting, at about 8 % more CPU per GB, with the
//!   same system calls per MiB: a read that ends while a message is
//!   being placed into its buffer waits for that message. The quiet-run
//!   A/B command is in `BENCHMARKS.md` §6, session 12.
//!   BCopy and a remote ring copy every byte.
//! * *Semantics*: a retargeted receive is pointed back before the read
//!   returns (one a message is being placed into is waited for, bounded
//!   by `sink_cancel_timeout`), so no byte reaches the program's memory
//!   after its call — on a partial fill, a timeout, `shutdown`, a close or
//!   an error alike; only receives at the front of the queue, with every
//!   earlier completion processed, are retargeted, so bytes keep their
//!   order against those already queued; `MSG_PEEK`, message mode and
//!   non-blocking reads use the slots (`tests/placed.rs` covers each).
//!   Bytes of the buffer past the length a read returns may have been
//!   written as scratch (a message shorter than expected moves the later
//!   ones back, a copy the counters show).
//! * *FPDUs per small message*: BCopy is one Send (one FPDU: header and
//!   payload in one gathered `sendmsg`); rsockets on iWARP needs an RDMA
//!   Write into the ring **and** a 4-byte Send to notify (`RS_OPT_MSG_SEND`:
//!   iWARP has no immediate data), two FPDUs, two CRCs and two headers per
//!   message for the same copy count. The engine's per-FPDU cost is the
//!   dominant per-message cost (see `BENCHMARKS.md` §3), so the ring loses
//!   on latency without gaining on copies.
//!
//! ## The wire
//!
//! See [`wire`]. Every message is one RDMAP Send (opcode Send, untagged,
//! queue 0) starting with an 8-byte header; sink data travels as RDMA
//! Writes; `riowrite`/`rioread` are RDMA Writes and Reads to STags the peer
//! announced. Everything is plain RFC 5040/5041/5044 on the wire, so tshark
//! decodes a captured DDP-mode connection as MPA/DDP/RDMAP.
#![deny(unsafe_code)]

pub mod cancel;
pub mod io;
pub mod stream;
pub mod switch;
pub mod wire;

pub use stream::{MapError, Seg, SinkState, Stream, StreamError, TxStep};
pub use switch::{Limits, Role, Step, Switch, SwitchError};
pub use wire::Hello;
