//! libibverbs and librdmacm on warpsock: unmodified RDMA programs (rping,
//! perftest, libfabric's verbs provider, rdma-core's rsockets) run over
//! the user-space iWARP engine, with no RDMA device, kernel module or root,
//! and talk to each other and to Linux siw or iWARP RNICs.
//!
//! # How programs reach it
//!
//! `libwarpsock_verbs.so` is loaded with `LD_PRELOAD` in front of the
//! installed rdma-core (`warpsock run -- PROGRAM` does that). It defines
//! the libibverbs and librdmacm entry points; the dynamic linker binds the
//! program's (and rdma-core's own internal) calls to them first:
//!
//! * `ibv_get_device_list` returns the real devices followed by
//!   `warpsock0` (node type RNIC, transport iWARP). Every `ibv_*` call on
//!   a real device's objects is forwarded to the real libibverbs; calls on
//!   `warpsock0`'s objects are served here.
//! * The data path (`ibv_post_send`, `ibv_post_recv`, `ibv_poll_cq`,
//!   `ibv_req_notify_cq`) is inline in programs: it jumps through
//!   `context->ops`, which [`open`] fills with this crate's functions in
//!   ABI-exact `ibv_context`/`verbs_context` objects ([`abi`]).
//! * librdmacm is replaced whole (the real one needs the kernel's
//!   `/dev/infiniband/rdma_cm`): every id lives on `warpsock0` and every
//!   connection is warpsock's MPA/DDP/RDMAP over TCP ([`cm`]). Ids keep the
//!   layout prefix rdma-core's rsockets expects ([`abi_cm::CmaIdPrivate`]),
//!   so the real librdmacm's `rsocket()` family, and `librspreload.so`
//!   on top of it, run over warpsock unchanged.
//!
//! Why an interposer and not replacement `libibverbs.so.1`/`librdmacm.so.1`
//! on `LD_LIBRARY_PATH`: see the crate README.
//!
//! # Progress
//!
//! Each context is a caller-driven engine context ([`ctx`]): a program
//! spinning on `ibv_poll_cq` receives inside that call, as fast as the
//! engine's own caller-driven mode. A helper thread per context drives
//! progress whenever the program is not spinning — it armed a CQ and sleeps
//! on the completion channel, or it is a passive RDMA Write/Read target
//! that never polls — and a notifier thread turns completions on armed CQs
//! into completion-channel events and connection ends into
//! `RDMA_CM_EVENT_DISCONNECTED`.
//!
//! # Environment
//!
//! `WARPSOCK_CRC` (`1`: ask for MPA CRC32c on every connection),
//! `WARPSOCK_P2P` (`0`: initiators do not offer RFC 6581 peer-to-peer
//! setup), `WARPSOCK_VERBS_DEBUG` (`1`: log setup failures to stderr).
//! See [`config`].
//!
//! # Safety
//!
//! Every exported `ibv_*`/`rdma_*` function is `unsafe extern "C"`: its
//! contract is the one its libibverbs/librdmacm man page states (live
//! objects made by the same library, buffers of the stated sizes); the
//! functions check what can be checked (NULL, ownership, bounds) and report
//! the rest as the real library would.
#![allow(unsafe_code, clippy::missing_safety_doc)]

pub mod abi;
pub mod abi_cm;
#[cfg(test)]
mod abi_layout;
pub mod cm;
pub mod config;
pub mod cq;
pub mod ctx;
pub mod device;
pub mod kick;
pub mod mem;
pub mod open;
pub mod qp;
mod real;
pub mod sock;
pub mod unsupported;
mod util;

pub use util::EventQueue;
