//! Listeners and incoming connection requests.

use std::ffi::c_char;
use std::time::Duration;

use warpsock_engine::{ConnectRequest, Listener};

use crate::context::warpsock_pd;
use crate::cq::warpsock_cq;
use crate::error::{cm_error, fail, io_error, warpsock_result};
use crate::ffi::{
    to_boxed_mut_ptr, try_cstr, try_mut_from_ptr, try_out, try_ref_from_ptr, try_slice, try_take,
    Castable,
};
use crate::panic::ffi_panic_boundary;
use crate::qp::{copy_addr, copy_out, warpsock_qp};
use crate::qp_config::{check_private_data, qp_init, warpsock_qp_config, QpConfig};

/// `timeout_ms` value of `warpsock_listener_accept` that waits without
/// limit.
pub const WARPSOCK_ACCEPT_FOREVER: u64 = u64::MAX;

/// A TCP listener that accepts iWARP connections. Not bound to a context:
/// each accepted request becomes a queue pair in the context of the
/// protection domain it is accepted with.
pub struct warpsock_listener {
    _private: [u8; 0],
}

impl Castable for warpsock_listener {
    type RustType = Listener;
}

/// An incoming connection whose MPA Request has arrived: accept it
/// (`warpsock_conn_request_accept`), reject it
/// (`warpsock_conn_request_reject`), or free it
/// (`warpsock_conn_request_free`, which closes the TCP connection without
/// a reply).
pub struct warpsock_conn_request {
    _private: [u8; 0],
}

impl Castable for warpsock_conn_request {
    type RustType = ConnectRequest;
}

/// Listens on `addr` (`"ip:port"`; port 0 picks a free port, see
/// `warpsock_listener_local_addr`) and stores the listener in `*out`.
///
/// Errors: `WARPSOCK_RESULT_ADDRESS_IN_USE`, `WARPSOCK_RESULT_ADDRESS_RESOLVE`,
/// `WARPSOCK_RESULT_IO`, `WARPSOCK_RESULT_INVALID_PARAMETER` (not UTF-8).
#[no_mangle]
pub extern "C" fn warpsock_listener_bind(
    addr: *const c_char,
    out: *mut *mut warpsock_listener,
) -> warpsock_result {
    ffi_panic_boundary! {
        let addr = try_cstr!(addr);
        let out = try_out!(out);
        let Ok(addr) = addr.to_str() else {
            return fail(warpsock_result::InvalidParameter, "the address is not UTF-8");
        };
        match Listener::bind(addr) {
            Ok(l) => {
                out.write(to_boxed_mut_ptr(l));
                warpsock_result::Ok
            }
            Err(e) => io_error(&e),
        }
    }
}

/// Stops listening and frees the listener (NULL is ignored). Requests
/// already accepted are unaffected.
#[no_mangle]
pub extern "C" fn warpsock_listener_free(listener: *mut warpsock_listener) {
    ffi_panic_boundary! {
        drop(try_take!(listener));
    }
}

/// Writes the bound address as `"ip:port"` (NUL-terminated) into `buf`
/// and its length without the NUL into `*out_n`.
///
/// Errors: `WARPSOCK_RESULT_INSUFFICIENT_SIZE` (64 bytes always suffice),
/// `WARPSOCK_RESULT_IO`.
#[no_mangle]
pub extern "C" fn warpsock_listener_local_addr(
    listener: *const warpsock_listener,
    buf: *mut c_char,
    len: usize,
    out_n: *mut usize,
) -> warpsock_result {
    ffi_panic_boundary! {
        match try_ref_from_ptr!(listener).local_addr() {
            Ok(a) => copy_addr(a, buf, len, out_n),
            Err(e) => io_error(&e),
        }
    }
}

/// Stores the bound TCP port in `*out_port`.
#[no_mangle]
pub extern "C" fn warpsock_listener_port(
    listener: *const warpsock_listener,
    out_port: *mut u16,
) -> warpsock_result {
    ffi_panic_boundary! {
        let l = try_ref_from_ptr!(listener);
        let out = try_out!(out_port);
        match l.local_addr() {
            Ok(a) => {
                out.write(a.port());
                warpsock_result::Ok
            }
            Err(e) => io_error(&e),
        }
    }
}

/// Sets how long `warpsock_listener_accept` waits for a connected peer's
/// MPA Request, in milliseconds (default 10 000; 0 is refused).
#[no_mangle]
pub extern "C" fn warpsock_listener_set_mpa_timeout(
    listener: *mut warpsock_listener,
    timeout_ms: u64,
) -> warpsock_result {
    ffi_panic_boundary! {
        let l = try_mut_from_ptr!(listener);
        if timeout_ms == 0 {
            return fail(warpsock_result::InvalidParameter, "the MPA timeout must be positive");
        }
        l.set_mpa_timeout(Duration::from_millis(timeout_ms));
        warpsock_result::Ok
    }
}

/// Waits up to `timeout_ms` milliseconds (`WARPSOCK_ACCEPT_FOREVER`:
/// without limit) for a connection and its MPA Request, and stores the
/// request in `*out` for the application to accept or reject.
///
/// Errors: `WARPSOCK_RESULT_TIMEOUT` if no peer connected in time, or a
/// peer connected but sent no valid Request in time (call again for the
/// next peer); `WARPSOCK_RESULT_MPA_FAILED` for a malformed Request.
#[no_mangle]
pub extern "C" fn warpsock_listener_accept(
    listener: *const warpsock_listener,
    timeout_ms: u64,
    out: *mut *mut warpsock_conn_request,
) -> warpsock_result {
    ffi_panic_boundary! {
        let l = try_ref_from_ptr!(listener);
        let out = try_out!(out);
        let timeout = (timeout_ms != WARPSOCK_ACCEPT_FOREVER).then(|| Duration::from_millis(timeout_ms));
        match l.accept(timeout) {
            Ok(r) => {
                out.write(to_boxed_mut_ptr(r));
                warpsock_result::Ok
            }
            Err(e) => cm_error(&e),
        }
    }
}

/// Copies the initiator's private data into `buf` (`len` bytes) and
/// stores its length in `*out_n` (at most `WARPSOCK_MAX_PRIVATE_DATA`... or
/// up to 508 bytes from peers that ignore siw's limit).
///
/// Errors: `WARPSOCK_RESULT_INSUFFICIENT_SIZE` if it does not fit.
#[no_mangle]
pub extern "C" fn warpsock_conn_request_private_data(
    req: *const warpsock_conn_request,
    buf: *mut u8,
    len: usize,
    out_n: *mut usize,
) -> warpsock_result {
    ffi_panic_boundary! {
        copy_out(try_ref_from_ptr!(req).private_data(), buf, len, out_n)
    }
}

/// Writes the initiator's address as `"ip:port"` (NUL-terminated) into
/// `buf` and its length without the NUL into `*out_n`.
#[no_mangle]
pub extern "C" fn warpsock_conn_request_peer_addr(
    req: *const warpsock_conn_request,
    buf: *mut c_char,
    len: usize,
    out_n: *mut usize,
) -> warpsock_result {
    ffi_panic_boundary! {
        copy_addr(try_ref_from_ptr!(req).peer_addr(), buf, len, out_n)
    }
}

/// Accepts the request: sends the MPA Reply with `private_data` (`len` ≤
/// `WARPSOCK_MAX_PRIVATE_DATA` bytes; NULL when `len` is 0) and stores the
/// queue pair in `*out`. `pd`, `send_cq` and `recv_cq` must come from one
/// context; `config` may be NULL for the defaults (its receives are posted
/// before the Reply goes out).
///
/// The request is consumed whenever `req` is not NULL, even if the call
/// fails (the connection is then closed): do not use or free it again.
///
/// Errors: `WARPSOCK_RESULT_PRIVATE_DATA_TOO_LONG`,
/// `WARPSOCK_RESULT_CONTEXT_MISMATCH`, `WARPSOCK_RESULT_IO`, ...
#[no_mangle]
pub extern "C" fn warpsock_conn_request_accept(
    req: *mut warpsock_conn_request,
    pd: *const warpsock_pd,
    send_cq: *const warpsock_cq,
    recv_cq: *const warpsock_cq,
    config: *const warpsock_qp_config,
    private_data: *const u8,
    len: usize,
    out: *mut *mut warpsock_qp,
) -> warpsock_result {
    ffi_panic_boundary! {
        let req = try_take!(req);
        let out = try_out!(out);
        let data = try_slice!(private_data, len);
        let defaults = QpConfig::default();
        let Some(init) = qp_init(pd, send_cq, recv_cq, config, &defaults) else {
            return warpsock_result::NullParameter;
        };
        match req.accept(&init, data) {
            Ok(qp) => {
                out.write(to_boxed_mut_ptr(qp));
                warpsock_result::Ok
            }
            Err(e) => cm_error(&e),
        }
    }
}

/// Rejects the request: sends an MPA Reply with the Reject bit and
/// `private_data` (`len` ≤ `WARPSOCK_MAX_PRIVATE_DATA` bytes; NULL when
/// `len` is 0), then closes the connection.
///
/// The request is consumed whenever `req` is not NULL, even if the call
/// fails: do not use or free it again.
#[no_mangle]
pub extern "C" fn warpsock_conn_request_reject(
    req: *mut warpsock_conn_request,
    private_data: *const u8,
    len: usize,
) -> warpsock_result {
    ffi_panic_boundary! {
        let req = try_take!(req);
        let data = try_slice!(private_data, len);
        if let Err(e) = check_private_data(data) {
            return e;
        }
        match req.reject(data) {
            Ok(()) => warpsock_result::Ok,
            Err(e) => cm_error(&e),
        }
    }
}

/// Frees a request without answering it: the TCP connection is closed.
/// NULL is ignored.
#[no_mangle]
pub extern "C" fn warpsock_conn_request_free(req: *mut warpsock_conn_request) {
    ffi_panic_boundary! {
        drop(try_take!(req));
    }
}
