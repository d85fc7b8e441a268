//! librdmacm on warpsock: event channels, CM ids, and the connection
//! manager operations, with rdma_cm's iWARP behaviour.
//!
//! # Event sequences
//!
//! * Active: `rdma_resolve_addr` → ADDR_RESOLVED (or ADDR_ERROR),
//!   `rdma_resolve_route` → ROUTE_RESOLVED, `rdma_connect` → ESTABLISHED
//!   with the responder's private data, or REJECTED (the peer's MPA Reply
//!   had the Reject bit: status -ECONNRESET as siw reports it, with the
//!   reject's private data; nothing listening: -ECONNREFUSED, as an iWARP
//!   RNIC reports it; the peer closed or reset the stream during the MPA
//!   exchange: -ECONNRESET, as siw reports it), UNREACHABLE (-ETIMEDOUT,
//!   -EHOSTUNREACH, -ENETUNREACH) or CONNECT_ERROR (a malformed or
//!   incompatible MPA frame: -EPROTO). See [`outcome`].
//! * Passive: CONNECT_REQUEST on the listener's channel, carrying a new id
//!   and the initiator's private data; `rdma_accept` → ESTABLISHED on the
//!   new id; `rdma_reject` sends an MPA Reply with the Reject bit.
//! * Either side: DISCONNECTED once the connection has ended (local
//!   `rdma_disconnect`, the peer's FIN, a Terminate, a reset), exactly once.
//!
//! IRD/ORD: `responder_resources` is the MPA IRD we offer,
//! `initiator_depth` the ORD we want; `RDMA_MAX_RESP_RES`/`RDMA_MAX_INIT_DEPTH`
//! (255) mean the device maximum (128), larger values are EINVAL. On a
//! CONNECT_REQUEST, `initiator_depth` is the peer's IRD and
//! `responder_resources` the peer's ORD (the kernel's iw_cm mapping).
//!
//! Private data: over iWARP rdma_cm adds no header; the application's
//! bytes are the MPA private data (up to 251 bytes, siw's limit). A
//! Request carrying more than 255 (MPA allows 512) is closed unanswered,
//! as siw closes one with more than 256: the event's length is a `u8`.
//!
//! # Synchronous ids
//!
//! An id created without a channel gets a private one and waits inside
//! each call for that call's event, which stays in `id->event` (librdmacm's
//! `ucma_complete`). A channel made non-blocking turns those waits into
//! EAGAIN, as rsockets expects.
//!
//! # Threads and bounds
//!
//! A listener accepts TCP connections on its own thread, which reads the
//! MPA Requests side by side without blocking (the engine's `Listener`: at
//! most [`MAX_HANDSHAKES`] at once, a newer connection evicting the
//! oldest, each bounded by the MPA timeout from its TCP accept), so
//! neither a silent peer nor a flood of them delays or locks out another;
//! at most `backlog` requests (at most [`MAX_BACKLOG`]) wait for the
//! program's accept or reject, more are closed. A request the program
//! never received goes with its listener or channel (its id destroyed,
//! its connection closed); one it received and never answers is kept
//! until it does, or destroys the id, as librdmacm's (no timeout). `rdma_connect` runs its TCP connect and MPA exchange on a
//! thread and reports the outcome as an event.

mod addr;
mod id;
pub mod outcome;
pub mod poke;

pub use addr::{rdma_freeaddrinfo, rdma_getaddrinfo, route_source};
pub use id::*;

use std::ffi::{c_char, c_int, c_uint};
use std::sync::{Arc, Mutex};

use crate::abi_cm::*;
use crate::util::{lock, null, set_errno, EventQueue};

/// Longest private data accepted (siw's limit with the MPA v2 IRD/ORD word).
pub const MAX_PRIVATE_DATA: usize = warpsock_engine::MAX_PRIVATE_DATA;
/// MPA Requests read at once by one listener.
pub const MAX_HANDSHAKES: usize = 64;
/// The most requests a listener keeps waiting for the program's accept or
/// reject, whatever its `rdma_listen` backlog (the kernel's ucma default
/// `net.rdma_ucm.max_backlog`; a backlog of 0 or less means this, too),
/// and never more than a quarter of the process's descriptor limit.
pub const MAX_BACKLOG: usize = 1024;

/// A queued event (owned by the channel until delivered).
#[derive(Debug)]
pub struct EventPtr(pub *mut EventObj);
// SAFETY: a Box pointer moved between threads; only its receiver uses it.
unsafe impl Send for EventPtr {}

/// `struct rdma_event_channel` plus its queue.
///
/// The allocation outlives [`rdma_destroy_event_channel`]: it becomes a
/// husk (no queue, `fd` -1) kept for the next [`new_channel`]. Programs
/// call the channel after destroying it — rping's CM thread is still in
/// its `rdma_get_cm_event` loop while `main` destroys the channel and
/// returns (the `siw-rping-s-on` crash: 2 runs in 120 under load) — and
/// librdmacm's channel is a descriptor, whose stale use is `EBADF`, not a
/// crash. A stale pointer to a reused husk is the new channel, as a
/// reused descriptor number is. The husks are bounded by the most channels
/// live at once.
#[repr(C)]
pub struct ChannelObj {
    /// The ABI part (`fd` = the queue's eventfd; -1 once destroyed).
    pub ibv: rdma_event_channel,
    /// Events not yet delivered; `None` once destroyed.
    q: Mutex<Option<Arc<EventQueue<EventPtr>>>>,
}

/// A destroyed channel's allocation, for reuse.
struct Husk(*mut ChannelObj);
// SAFETY: a pointer to a Box nobody owns but this list.
unsafe impl Send for Husk {}

/// Destroyed channels, reused by [`new_channel`] (never freed).
static HUSKS: Mutex<Vec<Husk>> = Mutex::new(Vec::new());

/// `struct rdma_cm_event` plus its private data and the id it counts
/// against (acknowledging it releases that id's hold).
#[repr(C)]
pub struct EventObj {
    /// The ABI part.
    pub ibv: rdma_cm_event,
    /// Private data (`ibv.param.conn.private_data` points here).
    pub pdata: [u8; 256],
    /// The id whose unacknowledged-event count this event is in.
    pub owner: Arc<IdShared>,
}

/// `rdma_create_event_channel`.
#[no_mangle]
pub unsafe extern "C" fn rdma_create_event_channel() -> *mut rdma_event_channel {
    match new_channel() {
        Ok(c) => c,
        Err(e) => null(e),
    }
}

/// Makes a channel (in a destroyed channel's husk if there is one).
pub fn new_channel() -> Result<*mut rdma_event_channel, c_int> {
    let q = EventQueue::new().map_err(|e| e.raw_os_error().unwrap_or(libc::EMFILE))?;
    let fd = q.fd();
    let q = Some(Arc::new(q));
    if let Some(Husk(h)) = lock(&HUSKS).pop() {
        // SAFETY: a husk is a live allocation of ours that no channel uses.
        unsafe {
            *lock(&(*h).q) = q;
            (*h).ibv.fd = fd;
        }
        return Ok(h.cast());
    }
    let obj = Box::new(ChannelObj {
        ibv: rdma_event_channel { fd },
        q: Mutex::new(q),
    });
    Ok(Box::into_raw(obj).cast())
}

/// The queue behind a channel; `None` once the program destroyed it.
///
/// # Safety
/// `ch` comes from [`new_channel`] (live or destroyed: the allocation stays).
pub unsafe fn channel_queue(ch: *mut rdma_event_channel) -> Option<Arc<EventQueue<EventPtr>>> {
    // SAFETY: `ibv` is the first field of ChannelObj, which is never freed.
    lock(unsafe { &(*ch.cast::<ChannelObj>()).q }).clone()
}

/// `rdma_destroy_event_channel`: undelivered events go with it. A call
/// blocked in `rdma_get_cm_event` on it stays blocked, as a `read` of a
/// closed descriptor's file does; later calls fail with `EBADF`.
#[no_mangle]
pub unsafe extern "C" fn rdma_destroy_event_channel(ch: *mut rdma_event_channel) {
    if ch.is_null() {
        return;
    }
    // SAFETY: a channel of ours (its allocation is never freed).
    let o = unsafe { &*ch.cast::<ChannelObj>() };
    let Some(q) = lock(&o.q).take() else {
        return; // destroyed before
    };
    // SAFETY: as above; the program's own `fd` field.
    unsafe { (*ch).fd = -1 };
    // Closed, so that an event another thread is pushing now (a listener's
    // request, `id::push`) comes back to it rather than into this queue.
    let undelivered = q.close();
    drop(q);
    // SAFETY: removed from the queue: ours; its lock is released.
    unsafe { destroy_undelivered(undelivered) };
    lock(&HUSKS).push(Husk(ch.cast()));
}

/// Frees events taken out of a queue undelivered. A CONNECT_REQUEST's
/// id, which the program never saw, is destroyed with it, closing the
/// request's connection (as librdmacm's kernel side,
/// `ucma_cleanup_ctx_events`): left, it was a leak of an id and a
/// socket, and its peer waited for a Reply that never came.
///
/// # Safety
/// The events are Boxes of ours no queue holds any more; no queue lock is
/// held (destroying an id takes its channel's).
pub(crate) unsafe fn destroy_undelivered(events: Vec<EventPtr>) {
    for EventPtr(e) in events {
        // SAFETY: per the contract.
        let e = unsafe { Box::from_raw(e) };
        let child = (e.ibv.event == RDMA_CM_EVENT_CONNECT_REQUEST).then_some(e.ibv.id);
        drop(e);
        if let Some(child) = child {
            // SAFETY: the request's own id, which only this event named.
            unsafe { rdma_destroy_id(child) };
        }
    }
}

/// `rdma_get_cm_event`: the next event (blocking unless the channel's fd
/// is non-blocking: then EAGAIN).
#[no_mangle]
pub unsafe extern "C" fn rdma_get_cm_event(
    ch: *mut rdma_event_channel,
    event: *mut *mut rdma_cm_event,
) -> c_int {
    if ch.is_null() || event.is_null() {
        set_errno(libc::EINVAL);
        return -1;
    }
    // SAFETY: a channel of ours, live or destroyed.
    let Some(q) = (unsafe { channel_queue(ch) }) else {
        set_errno(libc::EBADF);
        return -1;
    };
    match q.pop() {
        Ok(EventPtr(e)) => {
            // SAFETY: a live event Box; the program's out-pointer.
            unsafe {
                (*e).owner.delivered();
                *event = e.cast();
            }
            0
        }
        Err(e) => {
            set_errno(e);
            -1
        }
    }
}

/// `rdma_ack_cm_event`.
#[no_mangle]
pub unsafe extern "C" fn rdma_ack_cm_event(event: *mut rdma_cm_event) -> c_int {
    if event.is_null() {
        set_errno(libc::EINVAL);
        return -1;
    }
    // SAFETY: an event delivered by rdma_get_cm_event (a Box of ours).
    let e = unsafe { Box::from_raw(event.cast::<EventObj>()) };
    e.owner.acked();
    0
}

/// `rdma_event_str`.
#[no_mangle]
pub unsafe extern "C" fn rdma_event_str(event: c_uint) -> *const c_char {
    let s: &'static std::ffi::CStr = match event {
        RDMA_CM_EVENT_ADDR_RESOLVED => c"RDMA_CM_EVENT_ADDR_RESOLVED",
        RDMA_CM_EVENT_ADDR_ERROR => c"RDMA_CM_EVENT_ADDR_ERROR",
        RDMA_CM_EVENT_ROUTE_RESOLVED => c"RDMA_CM_EVENT_ROUTE_RESOLVED",
        RDMA_CM_EVENT_ROUTE_ERROR => c"RDMA_CM_EVENT_ROUTE_ERROR",
        RDMA_CM_EVENT_CONNECT_REQUEST => c"RDMA_CM_EVENT_CONNECT_REQUEST",
        RDMA_CM_EVENT_CONNECT_RESPONSE => c"RDMA_CM_EVENT_CONNECT_RESPONSE",
        RDMA_CM_EVENT_CONNECT_ERROR => c"RDMA_CM_EVENT_CONNECT_ERROR",
        RDMA_CM_EVENT_UNREACHABLE => c"RDMA_CM_EVENT_UNREACHABLE",
        RDMA_CM_EVENT_REJECTED => c"RDMA_CM_EVENT_REJECTED",
        RDMA_CM_EVENT_ESTABLISHED => c"RDMA_CM_EVENT_ESTABLISHED",
        RDMA_CM_EVENT_DISCONNECTED => c"RDMA_CM_EVENT_DISCONNECTED",
        RDMA_CM_EVENT_DEVICE_REMOVAL => c"RDMA_CM_EVENT_DEVICE_REMOVAL",
        RDMA_CM_EVENT_MULTICAST_JOIN => c"RDMA_CM_EVENT_MULTICAST_JOIN",
        RDMA_CM_EVENT_MULTICAST_ERROR => c"RDMA_CM_EVENT_MULTICAST_ERROR",
        RDMA_CM_EVENT_ADDR_CHANGE => c"RDMA_CM_EVENT_ADDR_CHANGE",
        RDMA_CM_EVENT_TIMEWAIT_EXIT => c"RDMA_CM_EVENT_TIMEWAIT_EXIT",
        _ => c"UNKNOWN EVENT",
    };
    s.as_ptr()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ptr::null_mut;

    fn errno() -> c_int {
        std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
    }

    /// rping's CM thread calls `rdma_get_cm_event` on the channel `main`
    /// destroyed as it returns: `EBADF`, as librdmacm's closed descriptor
    /// gives, not a read of freed memory (it crashed our rping server 2
    /// runs in 120 against siw under load).
    #[test]
    fn a_destroyed_channel_answers_ebadf() {
        // SAFETY: the C calls on a channel of ours, used after its
        // destruction on purpose (the allocation stays).
        unsafe {
            let ch = rdma_create_event_channel();
            assert!(!ch.is_null());
            assert!((*ch).fd >= 0);
            rdma_destroy_event_channel(ch);
            assert_eq!((*ch).fd, -1);
            let mut ev = null_mut();
            assert_eq!(rdma_get_cm_event(ch, &mut ev), -1);
            assert_eq!(errno(), libc::EBADF);
            assert!(ev.is_null());
            // Destroyed twice: nothing happens.
            rdma_destroy_event_channel(ch);
            // A new channel (in this husk or another) works.
            let ch2 = rdma_create_event_channel();
            assert!((*ch2).fd >= 0);
            let fl = libc::fcntl((*ch2).fd, libc::F_GETFL);
            assert_eq!(
                libc::fcntl((*ch2).fd, libc::F_SETFL, fl | libc::O_NONBLOCK),
                0
            );
            assert_eq!(rdma_get_cm_event(ch2, &mut ev), -1);
            assert_eq!(errno(), libc::EAGAIN);
            rdma_destroy_event_channel(ch2);
        }
    }

    /// An id outlives the channel the program destroyed under it: its
    /// destruction and a migration to the dead channel do not touch freed
    /// memory.
    #[test]
    fn an_id_outlives_its_destroyed_channel() {
        // SAFETY: as above.
        unsafe {
            let ch = rdma_create_event_channel();
            let mut id = null_mut();
            assert_eq!(rdma_create_id(ch, &mut id, null_mut(), RDMA_PS_TCP), 0);
            let mut other = null_mut();
            assert_eq!(rdma_create_id(ch, &mut other, null_mut(), RDMA_PS_TCP), 0);
            rdma_destroy_event_channel(ch);
            assert_eq!(rdma_migrate_id(other, ch), -1);
            assert_eq!(errno(), libc::EBADF);
            // Onto a channel of its own: its events come again.
            assert_eq!(rdma_migrate_id(other, null_mut()), 0);
            assert_eq!(rdma_destroy_id(other), 0);
            assert_eq!(rdma_destroy_id(id), 0);
        }
    }
}
