//! Completion queues and work completions.

use std::os::fd::AsRawFd;
use std::time::Duration;

use warpsock_engine::{Cq, Wc, WcOpcode, WcStatus};

use crate::context::warpsock_context;
use crate::error::{
    close_reason_code, close_reason_detail, engine_error, io_error, warpsock_result,
};
use crate::ffi::{
    to_boxed_mut_ptr, try_out, try_out_buf, try_ref_from_ptr, try_take, Castable, OutBuf,
};
use crate::panic::ffi_panic_boundary;

/// `timeout_us` value of `warpsock_cq_wait` that waits without limit.
pub const WARPSOCK_WAIT_FOREVER: u64 = u64::MAX;

/// `warpsock_wc.wc_flags` bit: the completed receive took a Send with
/// Invalidate; `invalidated_rkey` names the local STag the peer
/// invalidated.
pub const WARPSOCK_WC_WITH_INV: u32 = 1;
/// `warpsock_wc.wc_flags` bit: the received Send asked for a solicited
/// event.
pub const WARPSOCK_WC_SOLICITED: u32 = 2;

/// Completions moved per engine call when filling a caller array.
const CHUNK: usize = 32;

/// Outcome of a work request (`warpsock_wc.status`; the subset of
/// `ibv_wc_status` iWARP produces).
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum warpsock_wc_status {
    /// The operation completed.
    Success = 0,
    /// A local buffer was too small (e.g. an incoming Send exceeded the
    /// receive).
    LocalLengthError = 1,
    /// A local STag was invalid, out of bounds, or lacked the access right.
    LocalProtectionError = 2,
    /// The queue pair entered the error state before the request completed
    /// (disconnect, peer failure): the request was flushed.
    WrFlushError = 3,
    /// The peer reported a protection error for this request.
    RemoteAccessError = 4,
    /// The peer reported an operation error for this request.
    RemoteOperationError = 5,
    /// The request itself was malformed.
    LocalQpOperationError = 6,
    /// The stream failed (CRC, framing, Terminate) while the request was
    /// active.
    FatalError = 7,
    /// A status this version of the C API has no code for.
    GeneralError = 99,
}

impl warpsock_wc_status {
    /// Every status, in numeric order.
    pub const ALL: &'static [Self] = &[
        Self::Success,
        Self::LocalLengthError,
        Self::LocalProtectionError,
        Self::WrFlushError,
        Self::RemoteAccessError,
        Self::RemoteOperationError,
        Self::LocalQpOperationError,
        Self::FatalError,
        Self::GeneralError,
    ];

    fn from_engine(s: WcStatus) -> Self {
        match s {
            WcStatus::Success => Self::Success,
            WcStatus::LocalLengthError => Self::LocalLengthError,
            WcStatus::LocalProtectionError => Self::LocalProtectionError,
            WcStatus::WrFlushError => Self::WrFlushError,
            WcStatus::RemoteAccessError => Self::RemoteAccessError,
            WcStatus::RemoteOperationError => Self::RemoteOperationError,
            WcStatus::LocalQpOperationError => Self::LocalQpOperationError,
            WcStatus::FatalError => Self::FatalError,
            _ => Self::GeneralError,
        }
    }

    /// A short description.
    pub fn message(self) -> &'static std::ffi::CStr {
        match self {
            Self::Success => c"success",
            Self::LocalLengthError => c"local length error",
            Self::LocalProtectionError => c"local protection error",
            Self::WrFlushError => c"work request flushed",
            Self::RemoteAccessError => c"remote access error",
            Self::RemoteOperationError => c"remote operation error",
            Self::LocalQpOperationError => c"local queue pair operation error",
            Self::FatalError => c"fatal stream error",
            Self::GeneralError => c"general error",
        }
    }
}

/// What a completion is for (`warpsock_wc.opcode`).
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum warpsock_wc_opcode {
    /// A Send work request (any Send variant).
    Send = 0,
    /// An RDMA Write work request.
    RdmaWrite = 1,
    /// An RDMA Read work request.
    RdmaRead = 2,
    /// A receive that took an incoming Send.
    Recv = 128,
}

/// A work completion (`ibv_wc`), filled by `warpsock_cq_poll` and
/// `warpsock_cq_wait`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct warpsock_wc {
    /// The request's `wr_id`.
    pub wr_id: u64,
    /// Outcome: a `warpsock_wc_status` value.
    pub status: u32,
    /// Kind of request: a `warpsock_wc_opcode` value.
    pub opcode: u32,
    /// Bytes transferred (received bytes for a receive; 0 on error).
    pub byte_len: u32,
    /// The queue pair it belongs to (`warpsock_qp_num`).
    pub qp_num: u32,
    /// With `WARPSOCK_WC_WITH_INV`: the local STag the peer invalidated.
    pub invalidated_rkey: u32,
    /// `WARPSOCK_WC_*` bits.
    pub wc_flags: u32,
    /// A failed completion: how its queue pair ended, as a
    /// `warpsock_result` in the 5xx group (`WARPSOCK_RESULT_PEER_RESET`,
    /// `WARPSOCK_RESULT_TERMINATE_RECEIVED`, ...), `WARPSOCK_RESULT_IO` for
    /// another socket error; 0 when unknown or on success.
    pub cause: u32,
    /// With `cause`: a Terminate's code as `layer << 16 | etype << 8 |
    /// ecode`, or a socket error's `errno`; else 0.
    pub cause_detail: u32,
}

impl From<&Wc> for warpsock_wc {
    fn from(w: &Wc) -> Self {
        let mut flags = 0;
        if w.invalidated.is_some() {
            flags |= WARPSOCK_WC_WITH_INV;
        }
        if w.solicited {
            flags |= WARPSOCK_WC_SOLICITED;
        }
        Self {
            wr_id: w.wr_id,
            status: warpsock_wc_status::from_engine(w.status) as u32,
            opcode: match w.opcode {
                WcOpcode::Send => warpsock_wc_opcode::Send,
                WcOpcode::RdmaWrite => warpsock_wc_opcode::RdmaWrite,
                WcOpcode::RdmaRead => warpsock_wc_opcode::RdmaRead,
                WcOpcode::Recv => warpsock_wc_opcode::Recv,
            } as u32,
            byte_len: w.byte_len,
            qp_num: w.qp_num,
            invalidated_rkey: w.invalidated.unwrap_or(0),
            wc_flags: flags,
            cause: w.cause.map_or(0, |c| close_reason_code(c) as u32),
            cause_detail: w.cause.map_or(0, close_reason_detail),
        }
    }
}

/// A completion queue. All functions on it may be called from any thread.
pub struct warpsock_cq {
    _private: [u8; 0],
}

impl Castable for warpsock_cq {
    type RustType = Cq;
}

/// Creates a completion queue in `ctx`. `capacity` sizes its initial
/// storage; completions are never dropped when more arrive. On success
/// stores it in `*out`; free it with `warpsock_cq_free`.
#[no_mangle]
pub extern "C" fn warpsock_cq_new(
    ctx: *const warpsock_context,
    capacity: usize,
    out: *mut *mut warpsock_cq,
) -> warpsock_result {
    ffi_panic_boundary! {
        let ctx = try_ref_from_ptr!(ctx);
        let out = try_out!(out);
        match ctx.create_cq(capacity) {
            Ok(cq) => {
                out.write(to_boxed_mut_ptr(cq));
                warpsock_result::Ok
            }
            Err(e) => engine_error(&e),
        }
    }
}

/// Frees a completion queue (NULL is ignored). Free the queue pairs that
/// use it first: completions for them are lost afterwards.
#[no_mangle]
pub extern "C" fn warpsock_cq_free(cq: *mut warpsock_cq) {
    ffi_panic_boundary! {
        drop(try_take!(cq));
    }
}

/// Converts engine completions into the caller's array from index `at`.
fn store(out: &mut OutBuf<'_, warpsock_wc>, at: usize, wcs: &[Wc]) {
    for (i, w) in wcs.iter().enumerate() {
        out.write(at + i, warpsock_wc::from(w));
    }
}

/// Moves completions into `out[at..]` without waiting; returns how many.
fn drain(cq: &Cq, out: &mut OutBuf<'_, warpsock_wc>, mut at: usize) -> usize {
    let start = at;
    let mut tmp = [Wc::default(); CHUNK];
    while at < out.len() {
        let want = (out.len() - at).min(CHUNK);
        let got = cq.poll(&mut tmp[..want]);
        store(out, at, &tmp[..got]);
        at += got;
        if got < want {
            break;
        }
    }
    at - start
}

/// Moves up to `len` completions into `wcs` and stores how many in
/// `*out_n` (0 if none is waiting). In caller-driven mode this first makes
/// one non-blocking round of progress.
#[no_mangle]
pub extern "C" fn warpsock_cq_poll(
    cq: *const warpsock_cq,
    wcs: *mut warpsock_wc,
    len: usize,
    out_n: *mut usize,
) -> warpsock_result {
    ffi_panic_boundary! {
        let cq = try_ref_from_ptr!(cq);
        let mut wcs = try_out_buf!(wcs, len);
        let out_n = try_out!(out_n);
        out_n.write(drain(cq, &mut wcs, 0));
        warpsock_result::Ok
    }
}

/// Like `warpsock_cq_poll`, but waits up to `timeout_us` microseconds
/// (`WARPSOCK_WAIT_FOREVER`: without limit) for at least one completion.
/// Stores in `*out_n` how many arrived (0 when the time ran out).
///
/// Caller-driven mode: drives progress, spinning for the context's busy
/// poll time, then sleeping on the context's sockets. Progress-thread
/// mode: sleeps until the thread delivers.
///
/// Errors: `WARPSOCK_RESULT_IO` if waiting on the sockets fails.
#[no_mangle]
pub extern "C" fn warpsock_cq_wait(
    cq: *const warpsock_cq,
    wcs: *mut warpsock_wc,
    len: usize,
    timeout_us: u64,
    out_n: *mut usize,
) -> warpsock_result {
    ffi_panic_boundary! {
        let cq = try_ref_from_ptr!(cq);
        let mut wcs = try_out_buf!(wcs, len);
        let out_n = try_out!(out_n);
        let timeout = match timeout_us {
            WARPSOCK_WAIT_FOREVER => Duration::MAX,
            us => Duration::from_micros(us),
        };
        let mut tmp = [Wc::default(); CHUNK];
        let want = wcs.len().min(CHUNK);
        let got = match cq.wait(&mut tmp[..want], timeout) {
            Ok(n) => n,
            Err(e) => return engine_error(&e),
        };
        store(&mut wcs, 0, &tmp[..got]);
        let more = if got == want { drain(cq, &mut wcs, got) } else { 0 };
        out_n.write(got + more);
        warpsock_result::Ok
    }
}

/// Stores in `*out_fd` a file descriptor that is readable while
/// completions are waiting in the queue (readable when one arrives,
/// unreadable once `warpsock_cq_poll`/`warpsock_cq_wait` empty it). Put it
/// in your own `poll`/`epoll` set in progress-thread mode; in caller-driven
/// mode nothing arrives unless the application drives progress. The
/// descriptor belongs to the queue: do not close it. The first call makes
/// it, and fails as `eventfd(2)` does (`EMFILE`...).
#[no_mangle]
pub extern "C" fn warpsock_cq_notify_fd(
    cq: *const warpsock_cq,
    out_fd: *mut i32,
) -> warpsock_result {
    ffi_panic_boundary! {
        let cq = try_ref_from_ptr!(cq);
        let out_fd = try_out!(out_fd);
        match cq.notify_fd() {
            Ok(fd) => {
                out_fd.write(fd.as_raw_fd());
                warpsock_result::Ok
            }
            Err(e) => io_error(&e),
        }
    }
}

/// Completions currently queued (0 for NULL).
#[no_mangle]
pub extern "C" fn warpsock_cq_len(cq: *const warpsock_cq) -> usize {
    ffi_panic_boundary! {
        try_ref_from_ptr!(cq).len()
    }
}

/// A static NUL-terminated description of a `warpsock_wc_status` value
/// (never NULL; "unknown completion status" for other numbers).
#[no_mangle]
pub extern "C" fn warpsock_wc_status_str(status: u32) -> *const std::ffi::c_char {
    ffi_panic_boundary! {
        warpsock_wc_status::ALL
            .iter()
            .find(|s| **s as u32 == status)
            .map_or(c"unknown completion status", |s| s.message())
            .as_ptr()
    }
}
