//! The warpsock engine: iWARP (RDMAP/DDP/MPA) over real TCP sockets, and
//! the verbs-style Rust API on top of it.
//!
//! The protocol itself lives in the sans-IO core ([`warpsock_proto`]); this
//! crate owns what the core must not: sockets, threads and time.
//!
//! # API overview
//!
//! | object | verbs analogue | made by |
//! |---|---|---|
//! | [`Context`] | `ibv_context` + progress engine | [`Context::new`] ([`Progress::Caller`] or [`Progress::Thread`]) |
//! | [`Pd`] | `ibv_pd` | [`Context::alloc_pd`] |
//! | [`Mr`] | `ibv_mr` (lkey = rkey = STag) | [`Pd::register`], [`Pd::alloc`], `unsafe` [`Pd::register_raw`] |
//! | [`Cq`] | `ibv_cq` + completion channel | [`Context::create_cq`]; [`Cq::poll`], [`Cq::wait`], [`Cq::notify_fd`] |
//! | [`Qp`] | `ibv_qp` + `rdma_cm_id` | [`connect`], [`Listener::accept`] → [`ConnectRequest::accept`]; on a TCP connection already open: [`connect_stream`], [`ConnectRequest::read`] |
//! | [`Wc`] | `ibv_wc` | [`Cq::poll`] |
//!
//! Work requests are the core's types, re-exported: [`SendWr`] with a
//! [`SendOp`] (Send, Send with Solicited Event / Invalidate, RDMA Write,
//! RDMA Read), [`RecvWr`], and [`Sge`] (build one with [`Mr::sge`]).
//!
//! Every object is owned; dropping it cleans up (a [`Qp`] disconnects, an
//! [`Mr`] deregisters, the progress thread stops with the last handle). A
//! dropped [`Qp`]'s socket lingers, its input discarded, until the peer's
//! FIN (at most [`ContextOptions::linger`], 2 s by default), so a peer
//! still sending is never reset: a reset would make the peer's kernel drop
//! what we sent last. Every posted work request completes exactly once:
//! with its result, or flushed.
//!
//! # Progress
//!
//! * [`Progress::Caller`]: posts transmit at once; [`Cq::poll`] and
//!   [`Cq::wait`] receive. [`ContextOptions::busy_poll`] makes `wait` spin
//!   before it sleeps, for the lowest latency. With one connection in the
//!   context, `wait` sleeps in a blocking read of its socket (outside the
//!   context lock, so other threads may post meanwhile): a message then
//!   costs the system calls of plain TCP, one `sendmsg` and one `recv`.
//! * [`Progress::Thread`]: a background thread per context moves data
//!   while the application computes; [`Cq::wait`] sleeps until a
//!   completion arrives, and [`Cq::notify_fd`] (made at its first call)
//!   is readable while the queue is non-empty.
//!
//! # Data path
//!
//! Payload is placed straight from the socket into registered memory
//! (`readv` into the region at the offset the DDP header names, CRC32c
//! folded over it in place), and sent with one gathered `sendmsg` of
//! headers, registered memory and CRC trailers — no staging copy in either
//! direction (payloads of at most 64 bytes excepted: copying them next to
//! their header is cheaper than one more gather entry). FPDUs are sized to
//! the TCP MSS as Linux siw does. See the `engine` module source for
//! details.
//!
//! # Errors never hang
//!
//! A connection that dies (peer crash, reset, `TCP_USER_TIMEOUT` or
//! keepalive expiry, see [`TcpOptions`]) flushes every outstanding work
//! request with an error completion that says why ([`Wc::cause`],
//! [`Wc::result`]: "peer closed the connection", "peer reset the
//! connection", "connection timed out", "peer sent Terminate …");
//! [`Qp::close_reason`] and [`Event::Closed`] carry the same cause and
//! [`Qp::socket_error`] the `errno`. Setup errors are [`CmError`]s that say
//! which step failed and how. Every error converts into the crate's
//! [`Error`].
//!
//! # Memory
//!
//! Owned regions ([`Pd::register`], [`Pd::alloc`]) are safe: their bytes
//! are reached through [`Mr::read`], [`Mr::write`], [`Mr::with_bytes`],
//! whose closure runs outside the context lock and may call back into the
//! engine. STag keys are random (RFC 5042 §5), laid out as siw does
//! (`index << 8 | key`).
//! Caller memory ([`Pd::register_raw`]) follows the verbs contract: the
//! memory must stay valid while registered and the application must not
//! touch the parts operations are in flight on.
//!
//! # Examples
//!
//! Send and receive (the responder pre-posts its receive in
//! [`QpInit::recvs`], so the Send always finds a buffer):
//!
//! ```
//! use std::time::Duration;
//! use warpsock_engine::{connect, Access, Context, Listener, Progress, QpInit, RecvWr, SendOp, SendWr, Wc};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let listener = Listener::bind("127.0.0.1:0")?;
//! let addr = listener.local_addr()?;
//! let server = std::thread::spawn(move || {
//!     let ctx = Context::new(Progress::Caller).unwrap();
//!     let (pd, cq) = (ctx.alloc_pd(), ctx.create_cq(16).unwrap());
//!     let buf = pd.alloc(64, Access::LOCAL_WRITE);
//!     let mut init = QpInit::new(&pd, &cq);
//!     init.recvs.push(RecvWr { wr_id: 7, sgl: buf.sge(0, 64).into() });
//!     let _qp = listener.accept_qp(&init, b"", None).unwrap();
//!     let mut wc = [Wc::default()];
//!     assert_eq!(cq.wait(&mut wc, Duration::from_secs(10)).unwrap(), 1);
//!     assert!(wc[0].is_ok() && wc[0].wr_id == 7);
//!     buf.to_vec()[..wc[0].byte_len as usize].to_vec()
//! });
//!
//! let ctx = Context::new(Progress::Caller)?;
//! let (pd, cq) = (ctx.alloc_pd(), ctx.create_cq(16)?);
//! let qp = connect(addr, &QpInit::new(&pd, &cq))?;
//! let msg = pd.register(b"hello, iWARP".to_vec(), Access::LOCAL_READ);
//! qp.post_send(SendWr {
//!     wr_id: 1,
//!     op: SendOp::Send { solicited: false, invalidate: None },
//!     sgl: msg.sge(0, 12).into(),
//!     signaled: true,
//! })?;
//! let mut wc = [Wc::default()];
//! assert_eq!(cq.wait(&mut wc, Duration::from_secs(10))?, 1);
//! assert!(wc[0].is_ok());
//! assert_eq!(server.join().unwrap(), b"hello, iWARP");
//! # Ok(()) }
//! ```
//!
//! RDMA Write: the responder advertises a region's address and rkey in its
//! MPA private data; the initiator writes into it, then tells it with a
//! Send (a Write raises no completion at the target):
//!
//! ```
//! use std::time::Duration;
//! use warpsock_engine::{connect, Access, Context, Listener, Progress, QpInit, RecvWr, SendOp, SendWr, Sgl, Wc};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let listener = Listener::bind("127.0.0.1:0")?;
//! let addr = listener.local_addr()?;
//! let server = std::thread::spawn(move || {
//!     let ctx = Context::new(Progress::Thread).unwrap();
//!     let (pd, cq) = (ctx.alloc_pd(), ctx.create_cq(16).unwrap());
//!     let target = pd.alloc(4096, Access::REMOTE_WRITE);
//!     let note = pd.alloc(8, Access::LOCAL_WRITE);
//!     let mut init = QpInit::new(&pd, &cq);
//!     init.recvs.push(RecvWr { wr_id: 1, sgl: note.sge(0, 8).into() });
//!     let mut pdata = target.addr().to_be_bytes().to_vec();
//!     pdata.extend_from_slice(&target.rkey().to_be_bytes());
//!     let _qp = listener.accept_qp(&init, &pdata, None).unwrap();
//!     let mut wc = [Wc::default()];
//!     assert_eq!(cq.wait(&mut wc, Duration::from_secs(10)).unwrap(), 1);
//!     let mut got = vec![0; 5];
//!     target.read(100, &mut got);
//!     got
//! });
//!
//! let ctx = Context::new(Progress::Caller)?;
//! let (pd, cq) = (ctx.alloc_pd(), ctx.create_cq(16)?);
//! let qp = connect(addr, &QpInit::new(&pd, &cq))?;
//! let pdata = qp.negotiated().unwrap().peer_private_data;
//! let remote_addr = u64::from_be_bytes(pdata[..8].try_into()?);
//! let rkey = u32::from_be_bytes(pdata[8..12].try_into()?);
//! let src = pd.register(b"warp!".to_vec(), Access::LOCAL_READ);
//! qp.post_send(SendWr {
//!     wr_id: 1,
//!     op: SendOp::Write { remote_addr: remote_addr + 100, rkey },
//!     sgl: src.sge(0, 5).into(),
//!     signaled: true,
//! })?;
//! qp.post_send(SendWr {
//!     wr_id: 2,
//!     op: SendOp::Send { solicited: true, invalidate: None },
//!     sgl: Sgl::new(),
//!     signaled: true,
//! })?;
//! let mut wc = [Wc::default(); 2];
//! let mut done = 0;
//! while done < 2 {
//!     done += cq.wait(&mut wc[done..], Duration::from_secs(10))?;
//! }
//! assert!(wc.iter().all(Wc::is_ok));
//! assert_eq!(server.join().unwrap(), b"warp!");
//! # Ok(()) }
//! ```
//!
//! RDMA Read: the initiator reads a region the responder exposes with
//! `REMOTE_READ`; the Read completes when the data is in the local sink:
//!
//! ```
//! use std::time::Duration;
//! use warpsock_engine::{connect, Access, Context, Listener, Progress, QpInit, SendOp, SendWr, Wc};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let listener = Listener::bind("127.0.0.1:0")?;
//! let addr = listener.local_addr()?;
//! let (tx, rx) = std::sync::mpsc::channel::<()>();
//! let server = std::thread::spawn(move || {
//!     let ctx = Context::new(Progress::Thread).unwrap();
//!     let (pd, cq) = (ctx.alloc_pd(), ctx.create_cq(16).unwrap());
//!     let source = pd.register(b"read me remotely".to_vec(), Access::REMOTE_READ);
//!     let mut pdata = source.addr().to_be_bytes().to_vec();
//!     pdata.extend_from_slice(&source.rkey().to_be_bytes());
//!     let _qp = listener.accept_qp(&QpInit::new(&pd, &cq), &pdata, None).unwrap();
//!     // The progress thread answers the Read; stay connected until done.
//!     rx.recv().unwrap();
//! });
//!
//! let ctx = Context::new(Progress::Caller)?;
//! let (pd, cq) = (ctx.alloc_pd(), ctx.create_cq(16)?);
//! let qp = connect(addr, &QpInit::new(&pd, &cq))?;
//! let pdata = qp.negotiated().unwrap().peer_private_data;
//! let remote_addr = u64::from_be_bytes(pdata[..8].try_into()?);
//! let rkey = u32::from_be_bytes(pdata[8..12].try_into()?);
//! let sink = pd.alloc(16, Access::LOCAL_WRITE);
//! qp.post_send(SendWr {
//!     wr_id: 3,
//!     op: SendOp::Read { remote_addr, rkey },
//!     sgl: sink.sge(0, 16).into(),
//!     signaled: true,
//! })?;
//! let mut wc = [Wc::default()];
//! assert_eq!(cq.wait(&mut wc, Duration::from_secs(10))?, 1);
//! assert!(wc[0].is_ok());
//! assert_eq!(sink.to_vec(), b"read me remotely");
//! tx.send(())?;
//! server.join().unwrap();
//! # Ok(()) }
//! ```
//!
//! # Layout
//!
//! Modules depend one way, top to bottom: the handles ([`Pd`] in `pd`,
//! [`Mr`] in `mr`, [`Cq`] in `cq`, [`Qp`] in `qp`, the connection manager in
//! `cm`) sit on the context (`context`: the shared state, the progress
//! thread), which sits on the socket driver (`driver`, with its `rx` and
//! `tx` halves mirroring the core's), which sits on the leaves: `wc`
//! (completions), `mem` (region memory), `sys` (system calls), `error`.
#![deny(unsafe_code)]

pub mod asleep;
mod cm;
mod context;
mod cq;
mod driver;
mod error;
pub mod fds;
mod mem;
mod mr;
mod pd;
mod qp;
pub mod rawsys;
pub mod spun;
mod sys;
mod wc;

pub use cm::{
    connect, connect_stream, CmError, ConnectRequest, Listener, QpInit, QpOptions, TcpOptions,
    ACCEPT_PAUSE, DEFAULT_MAX_PENDING, DEFAULT_MPA_REQUEST_TIMEOUT, MAX_PRIVATE_DATA,
};
pub use context::{Context, ContextOptions, Progress, DEFAULT_LINGER};
pub use cq::{Cq, First, Park, Parked, QuietRead, Resume, Unparked};
pub use driver::{IoStats, WaitStats, CONTROL_MAX};
pub use error::{BatchPostError, Error, Result};
pub use mr::Mr;
pub use pd::Pd;
pub use qp::{Qp, QpNews};
pub use sys::{drain_error_queue, reset_now, set_linger_zero};
pub use warpsock_proto as proto;
pub use warpsock_proto::{
    Access, CloseReason, Event, Negotiated, PostError, QpState, RecvWr, RtrOffer, RtrType, SendOp,
    SendWr, Sge, Sgl, Stag, TransportError, WcOpcode, WcStatus,
};
pub use wc::{status_text, Wc, WcError};
