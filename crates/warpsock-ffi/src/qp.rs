//! Queue pairs: connect, post work requests, events, addresses (their
//! configuration is in `qp_config`, the work request types in `wr`).

use std::ffi::c_char;
use std::net::SocketAddr;

use warpsock_engine::{connect, CloseReason, Event, Qp, QpState, RecvWr, SendOp, SendWr, Sge, Sgl};

use crate::context::warpsock_pd;
use crate::cq::warpsock_cq;
use crate::error::{close_reason_code, cm_error, fail, post_error, warpsock_result};
use crate::ffi::{
    slice_from, to_boxed_mut_ptr, try_cstr, try_from, try_out, try_ref_from_ptr, try_take,
    Castable, OutBuf,
};
use crate::panic::ffi_panic_boundary;
use crate::qp_config::{qp_init, warpsock_qp_config, QpConfig};
use crate::wr::{
    warpsock_recv_wr, warpsock_send_wr, warpsock_sge, WARPSOCK_SEND_SIGNALED,
    WARPSOCK_SEND_SOLICITED,
};

/// Largest private data in an MPA Request or Reply, in bytes (keeps the
/// frame within Linux siw's limit).
pub const WARPSOCK_MAX_PRIVATE_DATA: usize = 251;

/// Queue pair state (`warpsock_qp_state`).
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum warpsock_qp_state {
    /// Before MPA completes.
    Idle = 0,
    /// Ready to send and receive.
    Rts = 1,
    /// Graceful close in progress.
    Closing = 2,
    /// A Terminate was sent or received; draining.
    Terminate = 3,
    /// Dead; every request has been flushed.
    Error = 4,
}

/// Kind of a connection event (`warpsock_event.kind`).
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum warpsock_event_kind {
    /// No event is waiting.
    None = 0,
    /// The queue pair reached RTS (see `warpsock_qp_negotiated`).
    Established = 1,
    /// A Terminate was sent or received: `term_*` and `by_peer` say which
    /// error and who sent it.
    Terminated = 2,
    /// The stream ended (local close or peer FIN); no more I/O.
    Closed = 3,
    /// An event this version of the C API has no kind for.
    Other = 99,
}

/// A connection event of a queue pair (`warpsock_qp_poll_event`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct warpsock_event {
    /// A `warpsock_event_kind` value.
    pub kind: u32,
    /// Terminated: the layer nibble (0 RDMAP, 1 DDP, 2 LLP).
    pub term_layer: u8,
    /// Terminated: the error type nibble.
    pub term_etype: u8,
    /// Terminated: the error code byte.
    pub term_ecode: u8,
    /// Terminated: the peer sent it (else we did).
    pub by_peer: bool,
    /// Closed: how the connection ended, as a `warpsock_result` in the 5xx
    /// group (`WARPSOCK_RESULT_PEER_CLOSED`, `..._PEER_RESET`,
    /// `..._CONNECTION_TIMED_OUT`, `..._TERMINATE_RECEIVED`, ...), or
    /// `WARPSOCK_RESULT_IO` for another socket error; else 0.
    pub cause: u32,
}

/// Peer-to-peer ready-to-receive message in use (`warpsock_negotiated.rtr`).
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum warpsock_rtr {
    /// No peer-to-peer RTR.
    None = 0,
    /// Zero-length RDMA Write.
    Write = 1,
    /// Zero-length RDMA Read.
    Read = 2,
    /// Zero-length Send.
    Send = 3,
}

/// What the MPA exchange settled (`warpsock_qp_negotiated`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct warpsock_negotiated {
    /// MPA revision in use.
    pub revision: u8,
    /// CRC on in both directions.
    pub crc: bool,
    /// We insert markers into what we send.
    pub markers_tx: bool,
    /// The peer inserts markers into what it sends.
    pub markers_rx: bool,
    /// Inbound RDMA Read Requests accepted at once.
    pub ird: u16,
    /// Outbound RDMA Read Requests we may have outstanding.
    pub ord: u16,
    /// A `warpsock_rtr` value.
    pub rtr: u32,
    /// Length of the peer's private data (`warpsock_qp_peer_private_data`).
    pub peer_private_data_len: usize,
}

/// A connected queue pair (one TCP connection). All functions on it may be
/// called from any thread, except that `warpsock_qp_free` and
/// `warpsock_qp_abort` must not race with other calls on it.
pub struct warpsock_qp {
    _private: [u8; 0],
}

impl Castable for warpsock_qp {
    type RustType = Qp;
}

/// Connects to `addr` (`"host:port"`, e.g. `"127.0.0.1:4791"`; each
/// resolved address is tried in turn), runs the MPA exchange as initiator
/// and stores the established queue pair in `*out`. Blocks until then.
/// `pd`, `send_cq` and `recv_cq` must come from one context; `config` may
/// be NULL for the defaults. Free the queue pair with `warpsock_qp_free`.
///
/// Errors say what failed: `WARPSOCK_RESULT_CONNECTION_REFUSED`,
/// `WARPSOCK_RESULT_UNREACHABLE`, `WARPSOCK_RESULT_TIMEOUT` (TCP connect or
/// MPA reply), `WARPSOCK_RESULT_REJECTED`, `WARPSOCK_RESULT_MPA_FAILED`,
/// `WARPSOCK_RESULT_ADDRESS_RESOLVE`, `WARPSOCK_RESULT_CONTEXT_MISMATCH`;
/// `warpsock_last_error_detail` has the address and the step.
#[no_mangle]
pub extern "C" fn warpsock_qp_connect(
    addr: *const c_char,
    pd: *const warpsock_pd,
    send_cq: *const warpsock_cq,
    recv_cq: *const warpsock_cq,
    config: *const warpsock_qp_config,
    out: *mut *mut warpsock_qp,
) -> warpsock_result {
    ffi_panic_boundary! {
        let addr = try_cstr!(addr);
        let out = try_out!(out);
        let defaults = QpConfig::default();
        let Some(init) = qp_init(pd, send_cq, recv_cq, config, &defaults) else {
            return warpsock_result::NullParameter;
        };
        let Ok(addr) = addr.to_str() else {
            return fail(warpsock_result::InvalidParameter, "the address is not UTF-8");
        };
        match connect(addr, &init) {
            Ok(qp) => {
                out.write(to_boxed_mut_ptr(qp));
                warpsock_result::Ok
            }
            Err(e) => cm_error(&e),
        }
    }
}

/// Disconnects gracefully (outstanding requests are flushed, bytes already
/// handed to the socket are delivered, FIN is sent) and frees the handle.
/// The socket lingers, its input discarded, until the peer's FIN (at most
/// 2 s, driven by later calls on the context), so a peer still sending is
/// not reset. NULL is ignored.
#[no_mangle]
pub extern "C" fn warpsock_qp_free(qp: *mut warpsock_qp) {
    ffi_panic_boundary! {
        drop(try_take!(qp));
    }
}

/// Abortive close: everything outstanding is flushed, the peer gets a TCP
/// reset, and the handle is freed. NULL is ignored.
#[no_mangle]
pub extern "C" fn warpsock_qp_abort(qp: *mut warpsock_qp) {
    ffi_panic_boundary! {
        try_take!(qp).abort();
    }
}

/// Graceful disconnect (`rdma_disconnect`) keeping the handle: outstanding
/// requests complete with `WARPSOCK_WC_STATUS_WR_FLUSH_ERROR`, bytes already
/// handed to the socket are delivered, then FIN is sent.
#[no_mangle]
pub extern "C" fn warpsock_qp_disconnect(qp: *const warpsock_qp) -> warpsock_result {
    ffi_panic_boundary! {
        try_ref_from_ptr!(qp).disconnect();
        warpsock_result::Ok
    }
}

/// The queue pair number reported in `warpsock_wc.qp_num` (0 for NULL).
#[no_mangle]
pub extern "C" fn warpsock_qp_num(qp: *const warpsock_qp) -> u32 {
    ffi_panic_boundary! {
        try_ref_from_ptr!(qp).qp_num()
    }
}

/// The state, a `warpsock_qp_state` value (`WARPSOCK_QP_STATE_ERROR` for
/// NULL).
#[no_mangle]
pub extern "C" fn warpsock_qp_get_state(qp: *const warpsock_qp) -> u32 {
    ffi_panic_boundary! {
        let Some(qp) = qp_ref(qp) else {
            return warpsock_qp_state::Error as u32;
        };
        (match qp.state() {
            QpState::Idle => warpsock_qp_state::Idle,
            QpState::Rts => warpsock_qp_state::Rts,
            QpState::Closing => warpsock_qp_state::Closing,
            QpState::Terminate => warpsock_qp_state::Terminate,
            QpState::Error => warpsock_qp_state::Error,
        }) as u32
    }
}

fn qp_ref<'a>(qp: *const warpsock_qp) -> Option<&'a Qp> {
    // SAFETY: the calling extern functions document that `qp` is NULL or
    // a live handle.
    unsafe { try_from(qp) }
}

/// Whether the TCP connection is finished in both directions (closed,
/// reset or failed); `true` for NULL.
#[no_mangle]
pub extern "C" fn warpsock_qp_is_closed(qp: *const warpsock_qp) -> bool {
    ffi_panic_boundary! {
        qp_ref(qp).is_none_or(Qp::is_closed)
    }
}

/// The `errno` of the socket error that ended the connection
/// (`ECONNRESET`, `ETIMEDOUT` from the TCP user timeout or keepalive, ...),
/// or 0 if none did (it is open, or ended with FIN, a Terminate or a local
/// close) or `qp` is NULL.
#[no_mangle]
pub extern "C" fn warpsock_qp_socket_errno(qp: *const warpsock_qp) -> i32 {
    ffi_panic_boundary! {
        qp_ref(qp)
            .and_then(Qp::socket_error)
            .and_then(|e| e.raw_os_error())
            .unwrap_or(0)
    }
}

/// How the connection ended, as a `warpsock_result` in the 5xx group
/// (`WARPSOCK_RESULT_PEER_CLOSED`, `..._PEER_RESET`,
/// `..._CONNECTION_TIMED_OUT`, `..._TERMINATE_RECEIVED`,
/// `..._TERMINATE_SENT`, `..._LOCAL_ERROR`, `..._CLOSED_LOCALLY`;
/// `WARPSOCK_RESULT_IO` for another socket error: see
/// `warpsock_qp_socket_errno`), or 0 (`WARPSOCK_RESULT_OK`) while it is
/// open or for NULL. `warpsock_result_str` gives its text.
#[no_mangle]
pub extern "C" fn warpsock_qp_close_reason(qp: *const warpsock_qp) -> u32 {
    ffi_panic_boundary! {
        qp_ref(qp)
            .and_then(Qp::close_reason)
            .map_or(0, |r| close_reason_code(r) as u32)
    }
}

fn build_sgl(ptr: *const warpsock_sge, n: usize) -> Option<Sgl> {
    // SAFETY: the post functions document that `sg_list` is valid for
    // `num_sge` reads (or NULL with `num_sge` 0) during the call.
    let s = unsafe { slice_from(ptr, n) }?;
    Some(s.iter().map(Sge::from).collect())
}

/// Posts a send-queue work request (Send, Send with Invalidate, RDMA Write,
/// RDMA Read) and starts transmitting it at once. The request and its
/// scatter/gather list are copied; the buffers they name must stay
/// untouched until the completion.
///
/// Errors: `WARPSOCK_RESULT_QUEUE_FULL`, `WARPSOCK_RESULT_INVALID_WORK_REQUEST`
/// (unknown opcode, a Read without exactly one scatter element, ...).
/// Errors in the buffers themselves and a dead queue pair surface as error
/// completions instead.
#[no_mangle]
pub extern "C" fn warpsock_qp_post_send(
    qp: *const warpsock_qp,
    wr: *const warpsock_send_wr,
) -> warpsock_result {
    ffi_panic_boundary! {
        let qp = try_ref_from_ptr!(qp);
        // SAFETY: `wr` is NULL or points to a valid `warpsock_send_wr`
        // (this function's contract); it is only read.
        let Some(wr) = (unsafe { wr.as_ref() }) else {
            return warpsock_result::NullParameter;
        };
        let Some(sgl) = build_sgl(wr.sg_list, wr.num_sge) else {
            return warpsock_result::NullParameter;
        };
        let op = match wr.opcode {
            0 => SendOp::Send { solicited: wr.send_flags & WARPSOCK_SEND_SOLICITED != 0, invalidate: None },
            1 => SendOp::Send {
                solicited: wr.send_flags & WARPSOCK_SEND_SOLICITED != 0,
                invalidate: Some(wr.invalidate_rkey),
            },
            2 => SendOp::Write { remote_addr: wr.remote_addr, rkey: wr.rkey },
            3 => SendOp::Read { remote_addr: wr.remote_addr, rkey: wr.rkey },
            other => {
                return fail(
                    warpsock_result::InvalidWorkRequest,
                    format_args!("unknown work request opcode {other}"),
                )
            }
        };
        let known = WARPSOCK_SEND_SIGNALED | WARPSOCK_SEND_SOLICITED;
        if wr.send_flags & !known != 0 {
            return fail(
                warpsock_result::InvalidWorkRequest,
                format_args!("send flags {:#x} have unknown bits", wr.send_flags),
            );
        }
        let swr = SendWr {
            wr_id: wr.wr_id,
            op,
            sgl,
            signaled: wr.send_flags & WARPSOCK_SEND_SIGNALED != 0,
        };
        match qp.post_send(swr) {
            Ok(()) => warpsock_result::Ok,
            Err(e) => post_error(e),
        }
    }
}

/// Posts a receive for an incoming Send. The request and its scatter list
/// are copied; the buffers must stay untouched until the completion.
///
/// Errors: `WARPSOCK_RESULT_QUEUE_FULL`, `WARPSOCK_RESULT_INVALID_WORK_REQUEST`.
#[no_mangle]
pub extern "C" fn warpsock_qp_post_recv(
    qp: *const warpsock_qp,
    wr: *const warpsock_recv_wr,
) -> warpsock_result {
    ffi_panic_boundary! {
        let qp = try_ref_from_ptr!(qp);
        // SAFETY: `wr` is NULL or points to a valid `warpsock_recv_wr`
        // (this function's contract); it is only read.
        let Some(wr) = (unsafe { wr.as_ref() }) else {
            return warpsock_result::NullParameter;
        };
        let Some(sgl) = build_sgl(wr.sg_list, wr.num_sge) else {
            return warpsock_result::NullParameter;
        };
        match qp.post_recv(RecvWr { wr_id: wr.wr_id, sgl }) {
            Ok(()) => warpsock_result::Ok,
            Err(e) => post_error(e),
        }
    }
}

/// Stores the next connection event in `*out`; its kind is
/// `WARPSOCK_EVENT_KIND_NONE` when none is waiting.
#[no_mangle]
pub extern "C" fn warpsock_qp_poll_event(
    qp: *const warpsock_qp,
    out: *mut warpsock_event,
) -> warpsock_result {
    ffi_panic_boundary! {
        let qp = try_ref_from_ptr!(qp);
        let out = try_out!(out);
        let mut ev = warpsock_event::default();
        ev.kind = match qp.poll_event() {
            None => warpsock_event_kind::None,
            Some(Event::Established(_)) => warpsock_event_kind::Established,
            Some(Event::Terminated { code, by_peer }) => {
                ev.term_layer = code.layer;
                ev.term_etype = code.etype;
                ev.term_ecode = code.ecode;
                ev.by_peer = by_peer;
                warpsock_event_kind::Terminated
            }
            Some(Event::Closed(reason)) => {
                ev.cause = close_reason_code(reason) as u32;
                if let CloseReason::Terminated { code, by_peer } = reason {
                    ev.term_layer = code.layer;
                    ev.term_etype = code.etype;
                    ev.term_ecode = code.ecode;
                    ev.by_peer = by_peer;
                }
                warpsock_event_kind::Closed
            }
            Some(_) => warpsock_event_kind::Other,
        } as u32;
        out.write(ev);
        warpsock_result::Ok
    }
}

/// Stores what MPA negotiated in `*out`.
///
/// Errors: `WARPSOCK_RESULT_INVALID_PARAMETER` if nothing was negotiated
/// (cannot happen for a connected queue pair).
#[no_mangle]
pub extern "C" fn warpsock_qp_negotiated(
    qp: *const warpsock_qp,
    out: *mut warpsock_negotiated,
) -> warpsock_result {
    ffi_panic_boundary! {
        let qp = try_ref_from_ptr!(qp);
        let out = try_out!(out);
        let Some(n) = qp.negotiated() else {
            return fail(warpsock_result::InvalidParameter, "the queue pair negotiated nothing");
        };
        out.write(warpsock_negotiated {
            revision: n.revision,
            crc: n.crc,
            markers_tx: n.markers_tx,
            markers_rx: n.markers_rx,
            ird: n.ird,
            ord: n.ord,
            rtr: match n.rtr {
                None => warpsock_rtr::None,
                Some(warpsock_engine::proto::RtrType::Write) => warpsock_rtr::Write,
                Some(warpsock_engine::proto::RtrType::Read) => warpsock_rtr::Read,
                Some(warpsock_engine::proto::RtrType::Send) => warpsock_rtr::Send,
            } as u32,
            peer_private_data_len: n.peer_private_data.len(),
        });
        warpsock_result::Ok
    }
}

/// Copies `bytes` into a caller buffer and stores the length, or fails with
/// `InsufficientSize` writing nothing.
pub(crate) fn copy_out(
    bytes: &[u8],
    buf: *mut u8,
    len: usize,
    out_n: *mut usize,
) -> warpsock_result {
    let Some(mut buf) = OutBuf::new(buf, len) else {
        return warpsock_result::NullParameter;
    };
    let Some(out_n) = crate::ffi::Out::new(out_n) else {
        return warpsock_result::NullParameter;
    };
    if bytes.len() > buf.len() {
        return fail(
            warpsock_result::InsufficientSize,
            format_args!(
                "{} bytes do not fit in a buffer of {}",
                bytes.len(),
                buf.len()
            ),
        );
    }
    buf.copy_from(bytes);
    out_n.write(bytes.len());
    warpsock_result::Ok
}

/// Writes `addr` as `"ip:port"` with a terminating NUL into a `char`
/// buffer; `*out_n` gets the length without the NUL.
pub(crate) fn copy_addr(
    addr: SocketAddr,
    buf: *mut c_char,
    len: usize,
    out_n: *mut usize,
) -> warpsock_result {
    let mut s = addr.to_string().into_bytes();
    s.push(0);
    let Some(out_n) = crate::ffi::Out::new(out_n) else {
        return warpsock_result::NullParameter;
    };
    let mut n = 0;
    match copy_out(&s, buf.cast(), len, &mut n) {
        warpsock_result::Ok => {
            out_n.write(n - 1);
            warpsock_result::Ok
        }
        e => e,
    }
}

/// Copies the private data the peer sent during setup into `buf` (`len`
/// bytes) and stores its length in `*out_n` (at most
/// `WARPSOCK_MAX_PRIVATE_DATA` bytes; 0 if none).
///
/// Errors: `WARPSOCK_RESULT_INSUFFICIENT_SIZE` if it does not fit.
#[no_mangle]
pub extern "C" fn warpsock_qp_peer_private_data(
    qp: *const warpsock_qp,
    buf: *mut u8,
    len: usize,
    out_n: *mut usize,
) -> warpsock_result {
    ffi_panic_boundary! {
        let qp = try_ref_from_ptr!(qp);
        let data = qp.negotiated().map(|n| n.peer_private_data).unwrap_or_default();
        copy_out(&data, buf, len, out_n)
    }
}

/// Writes the local socket address as `"ip:port"` (NUL-terminated) into
/// `buf` and its length without the NUL into `*out_n`.
///
/// Errors: `WARPSOCK_RESULT_INSUFFICIENT_SIZE` (64 bytes always suffice).
#[no_mangle]
pub extern "C" fn warpsock_qp_local_addr(
    qp: *const warpsock_qp,
    buf: *mut c_char,
    len: usize,
    out_n: *mut usize,
) -> warpsock_result {
    ffi_panic_boundary! {
        copy_addr(try_ref_from_ptr!(qp).local_addr(), buf, len, out_n)
    }
}

/// Writes the peer's socket address as `"ip:port"` (NUL-terminated) into
/// `buf` and its length without the NUL into `*out_n`.
///
/// Errors: `WARPSOCK_RESULT_INSUFFICIENT_SIZE` (64 bytes always suffice).
#[no_mangle]
pub extern "C" fn warpsock_qp_peer_addr(
    qp: *const warpsock_qp,
    buf: *mut c_char,
    len: usize,
    out_n: *mut usize,
) -> warpsock_result {
    ffi_panic_boundary! {
        copy_addr(try_ref_from_ptr!(qp).peer_addr(), buf, len, out_n)
    }
}
