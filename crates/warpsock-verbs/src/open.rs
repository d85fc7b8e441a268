//! Opening and closing `warpsock0` contexts, and their asynchronous
//! events: the calls that need both the device ([`crate::device`]) and a
//! context with its data path ([`crate::ctx`], [`crate::cq`],
//! [`crate::qp`]), kept here so those modules stay layered (device below
//! context below CQs and queue pairs).

use std::ffi::{c_int, c_void};
use std::sync::OnceLock;

use crate::abi::*;
use crate::ctx::Ctx;
use crate::device::{ctx_is_ours, is_ours, query_port_ex};
use crate::real::forward;
use crate::util::{lock, null, set_errno};

/// The inline data path of every `warpsock0` context.
fn data_path() -> ibv_context_ops {
    // SAFETY: all-zero is a valid `ibv_context_ops` (NULL pointers, `None`
    // function pointers).
    let mut ops: ibv_context_ops = unsafe { std::mem::zeroed() };
    ops.poll_cq = Some(crate::cq::poll_cq);
    ops.req_notify_cq = Some(crate::cq::req_notify_cq);
    ops.post_send = Some(crate::qp::post_send);
    ops.post_recv = Some(crate::qp::post_recv);
    ops.post_srq_recv = Some(crate::qp::post_srq_recv);
    ops
}

/// `ibv_open_device`.
#[no_mangle]
pub unsafe extern "C" fn ibv_open_device(dev: *mut ibv_device) -> *mut ibv_context {
    if is_ours(dev) {
        return match Ctx::open(dev, data_path(), query_port_ex as *mut c_void) {
            Ok(c) => c,
            Err(e) => null(e.raw_os_error().unwrap_or(libc::ENOMEM)),
        };
    }
    forward!(ibv_open_device(dev) : fn(*mut ibv_device) -> *mut ibv_context, null(libc::ENODEV))
}

/// `ibv_close_device`.
#[no_mangle]
pub unsafe extern "C" fn ibv_close_device(ctx: *mut ibv_context) -> c_int {
    // SAFETY: the program passes a live context.
    if unsafe { ctx_is_ours(ctx) } {
        // SAFETY: ours, and the program gives it up.
        unsafe { Ctx::close(ctx) };
        return 0;
    }
    forward!(ibv_close_device(ctx) : fn(*mut ibv_context) -> c_int, libc::EINVAL)
}

/// `ibv_get_async_event`: blocks on the context's async fd (or fails with
/// EAGAIN if the program made it non-blocking).
#[no_mangle]
pub unsafe extern "C" fn ibv_get_async_event(
    ctx: *mut ibv_context,
    event: *mut ibv_async_event,
) -> c_int {
    // SAFETY: the program passes a live context.
    if unsafe { ctx_is_ours(ctx) } {
        // SAFETY: ours.
        let c = unsafe { Ctx::from_ibv(ctx) };
        return match c.sh.async_events.pop() {
            Ok(ev) => {
                lock(delivered_events()).push((ev.element as usize, ev.kind));
                if !event.is_null() {
                    // SAFETY: non-NULL out-pointer.
                    unsafe {
                        *event = ibv_async_event {
                            element: ev.element,
                            event_type: ev.kind,
                        }
                    };
                }
                0
            }
            Err(e) => {
                set_errno(e);
                -1
            }
        };
    }
    forward!(
        ibv_get_async_event(ctx, event) : fn(*mut ibv_context, *mut ibv_async_event) -> c_int,
        -1
    )
}

/// Async events this library delivered and the program has not yet
/// acknowledged, by (element, type): `ibv_ack_async_event` must tell ours
/// from a real device's without touching the element (the program may
/// have destroyed it already).
fn delivered_events() -> &'static std::sync::Mutex<Vec<(usize, u32)>> {
    static D: OnceLock<std::sync::Mutex<Vec<(usize, u32)>>> = OnceLock::new();
    D.get_or_init(Default::default)
}

/// `ibv_ack_async_event`: ours carry no resources (destroying an object
/// does not wait for its async events); a real device's event goes back to
/// the real library.
#[no_mangle]
pub unsafe extern "C" fn ibv_ack_async_event(event: *mut ibv_async_event) {
    if event.is_null() {
        return;
    }
    // SAFETY: the program passes the event it got.
    let key = unsafe { ((*event).element as usize, (*event).event_type) };
    let ours = {
        let mut d = lock(delivered_events());
        match d.iter().position(|k| *k == key) {
            Some(i) => {
                d.swap_remove(i);
                true
            }
            None => false,
        }
    };
    if !ours {
        forward!(ibv_ack_async_event(event) : fn(*mut ibv_async_event) -> (), ());
    }
}
