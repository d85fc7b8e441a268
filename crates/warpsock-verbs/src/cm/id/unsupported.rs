//! The librdmacm calls iWARP has no use for: InfiniBand-only events,
//! multicast, shared receive queues, ECE and ib_acm/user-written events.
//! Each checks its id like every other call (EINVAL for one this library
//! did not make) and then fails with the errno rdma-core's own library
//! gives on a device without the feature.

use std::ffi::{c_int, c_uint, c_void};

use super::id_is_live;
use crate::abi::*;
use crate::abi_cm::*;
use crate::util::{fail, set_errno};

/// `rdma_notify`: an InfiniBand-only event (EINVAL here).
#[no_mangle]
pub unsafe extern "C" fn rdma_notify(id: *mut rdma_cm_id, event: c_uint) -> c_int {
    if !id_is_live(id) {
        return fail(libc::EINVAL);
    }
    let _ = (id, event);
    fail(libc::EINVAL)
}

/// Multicast (`rdma_join_multicast`, `_ex`, `rdma_leave_multicast`):
/// iWARP has none (ENOSYS).
#[no_mangle]
pub unsafe extern "C" fn rdma_join_multicast(
    id: *mut rdma_cm_id,
    addr: *mut libc::sockaddr,
    ctx: *mut c_void,
) -> c_int {
    if !id_is_live(id) {
        return fail(libc::EINVAL);
    }
    let _ = (id, addr, ctx);
    fail(libc::ENOSYS)
}

/// See [`rdma_join_multicast`].
#[no_mangle]
pub unsafe extern "C" fn rdma_join_multicast_ex(
    id: *mut rdma_cm_id,
    attr: *mut c_void,
    ctx: *mut c_void,
) -> c_int {
    if !id_is_live(id) {
        return fail(libc::EINVAL);
    }
    let _ = (id, attr, ctx);
    fail(libc::ENOSYS)
}

/// See [`rdma_join_multicast`].
#[no_mangle]
pub unsafe extern "C" fn rdma_leave_multicast(
    id: *mut rdma_cm_id,
    addr: *mut libc::sockaddr,
) -> c_int {
    if !id_is_live(id) {
        return fail(libc::EINVAL);
    }
    let _ = (id, addr);
    fail(libc::ENOSYS)
}

/// SRQs through the CM (`rdma_create_srq`, `_ex`): none (EOPNOTSUPP).
#[no_mangle]
pub unsafe extern "C" fn rdma_create_srq(
    id: *mut rdma_cm_id,
    pd: *mut ibv_pd,
    attr: *mut c_void,
) -> c_int {
    if !id_is_live(id) {
        return fail(libc::EINVAL);
    }
    let _ = (id, pd, attr);
    fail(libc::EOPNOTSUPP)
}

/// See [`rdma_create_srq`].
#[no_mangle]
pub unsafe extern "C" fn rdma_create_srq_ex(id: *mut rdma_cm_id, attr: *mut c_void) -> c_int {
    if !id_is_live(id) {
        return fail(libc::EINVAL);
    }
    let _ = (id, attr);
    fail(libc::EOPNOTSUPP)
}

/// `rdma_destroy_srq`: nothing to destroy.
#[no_mangle]
pub unsafe extern "C" fn rdma_destroy_srq(id: *mut rdma_cm_id) {
    if !id_is_live(id) {
        set_errno(libc::EINVAL);
        return;
    }
    let _ = id;
}

/// Enhanced connection establishment (`rdma_set_local_ece`,
/// `rdma_get_remote_ece`, `rdma_reject_ece`) is an mlx5/RoCE feature
/// (EOPNOTSUPP).
#[no_mangle]
pub unsafe extern "C" fn rdma_set_local_ece(id: *mut rdma_cm_id, ece: *mut c_void) -> c_int {
    if !id_is_live(id) {
        return fail(libc::EINVAL);
    }
    let _ = (id, ece);
    fail(libc::EOPNOTSUPP)
}

/// See [`rdma_set_local_ece`].
#[no_mangle]
pub unsafe extern "C" fn rdma_get_remote_ece(id: *mut rdma_cm_id, ece: *mut c_void) -> c_int {
    if !id_is_live(id) {
        return fail(libc::EINVAL);
    }
    let _ = (id, ece);
    fail(libc::EOPNOTSUPP)
}

/// See [`rdma_set_local_ece`].
#[no_mangle]
pub unsafe extern "C" fn rdma_reject_ece(
    id: *mut rdma_cm_id,
    data: *const c_void,
    len: u8,
    reason: u8,
) -> c_int {
    if !id_is_live(id) {
        return fail(libc::EINVAL);
    }
    let _ = (id, data, len, reason);
    fail(libc::EOPNOTSUPP)
}

/// Asynchronous address resolution through ib_acm (`rdma_resolve_addrinfo`,
/// `rdma_query_addrinfo`) and user-written events (`rdma_write_cm_event`):
/// EOPNOTSUPP.
#[no_mangle]
pub unsafe extern "C" fn rdma_resolve_addrinfo(
    id: *mut rdma_cm_id,
    node: *const std::ffi::c_char,
    service: *const std::ffi::c_char,
    hints: *const rdma_addrinfo,
) -> c_int {
    if !id_is_live(id) {
        return fail(libc::EINVAL);
    }
    let _ = (id, node, service, hints);
    fail(libc::EOPNOTSUPP)
}

/// See [`rdma_resolve_addrinfo`].
#[no_mangle]
pub unsafe extern "C" fn rdma_query_addrinfo(
    id: *mut rdma_cm_id,
    info: *mut *mut rdma_addrinfo,
) -> c_int {
    if !id_is_live(id) {
        return fail(libc::EINVAL);
    }
    let _ = (id, info);
    fail(libc::EOPNOTSUPP)
}

/// See [`rdma_resolve_addrinfo`].
#[no_mangle]
pub unsafe extern "C" fn rdma_write_cm_event(
    id: *mut rdma_cm_id,
    event: c_uint,
    status: c_int,
    arg: u64,
) -> c_int {
    if !id_is_live(id) {
        return fail(libc::EINVAL);
    }
    let _ = (id, event, status, arg);
    fail(libc::EOPNOTSUPP)
}
