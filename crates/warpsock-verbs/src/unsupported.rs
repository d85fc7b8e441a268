//! libibverbs calls iWARP (and so `warpsock0`) has no use for, answered
//! the way an iWARP device answers them instead of letting the real
//! library read provider state our objects do not have: address handles
//! and multicast (UD/InfiniBand only), memory re-registration and
//! dma-buf regions, enhanced connection establishment (mlx5). Objects of a
//! real device are forwarded as everywhere else.

use std::ffi::{c_int, c_void};

use crate::abi::*;
use crate::device::ctx_is_ours;
use crate::mem::pd_is_ours;
use crate::qp::qp_is_ours;
use crate::real::forward;
use crate::util::null;

/// `ibv_create_ah`: no address handles over iWARP (siw returns none).
#[no_mangle]
pub unsafe extern "C" fn ibv_create_ah(pd: *mut ibv_pd, attr: *mut c_void) -> *mut c_void {
    // SAFETY: the program passes a live PD.
    if unsafe { pd_is_ours(pd) } {
        return null(libc::EOPNOTSUPP);
    }
    forward!(ibv_create_ah(pd, attr) : fn(*mut ibv_pd, *mut c_void) -> *mut c_void, null(libc::EINVAL))
}

/// `ibv_destroy_ah`: none exist here.
#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_ah(ah: *mut c_void) -> c_int {
    forward!(ibv_destroy_ah(ah) : fn(*mut c_void) -> c_int, libc::EINVAL)
}

/// `ibv_create_ah_from_wc`: as `ibv_create_ah`.
#[no_mangle]
pub unsafe extern "C" fn ibv_create_ah_from_wc(
    pd: *mut ibv_pd,
    wc: *mut ibv_wc,
    grh: *mut c_void,
    port: u8,
) -> *mut c_void {
    // SAFETY: the program passes a live PD.
    if unsafe { pd_is_ours(pd) } {
        return null(libc::EOPNOTSUPP);
    }
    forward!(
        ibv_create_ah_from_wc(pd, wc, grh, port) : fn(*mut ibv_pd, *mut ibv_wc, *mut c_void, u8) -> *mut c_void,
        null(libc::EINVAL)
    )
}

/// `ibv_init_ah_from_wc`: as `ibv_create_ah`.
#[no_mangle]
pub unsafe extern "C" fn ibv_init_ah_from_wc(
    ctx: *mut ibv_context,
    port: u8,
    wc: *mut ibv_wc,
    grh: *mut c_void,
    attr: *mut c_void,
) -> c_int {
    // SAFETY: the program passes a live context.
    if unsafe { ctx_is_ours(ctx) } {
        return libc::EOPNOTSUPP;
    }
    forward!(
        ibv_init_ah_from_wc(ctx, port, wc, grh, attr)
            : fn(*mut ibv_context, u8, *mut ibv_wc, *mut c_void, *mut c_void) -> c_int,
        libc::EINVAL
    )
}

/// `ibv_attach_mcast`: no multicast over iWARP.
#[no_mangle]
pub unsafe extern "C" fn ibv_attach_mcast(qp: *mut ibv_qp, gid: *const ibv_gid, lid: u16) -> c_int {
    // SAFETY: the program passes a live QP.
    if unsafe { qp_is_ours(qp) } {
        return libc::EOPNOTSUPP;
    }
    forward!(ibv_attach_mcast(qp, gid, lid) : fn(*mut ibv_qp, *const ibv_gid, u16) -> c_int, libc::EINVAL)
}

/// `ibv_detach_mcast`: as `ibv_attach_mcast`.
#[no_mangle]
pub unsafe extern "C" fn ibv_detach_mcast(qp: *mut ibv_qp, gid: *const ibv_gid, lid: u16) -> c_int {
    // SAFETY: the program passes a live QP.
    if unsafe { qp_is_ours(qp) } {
        return libc::EOPNOTSUPP;
    }
    forward!(ibv_detach_mcast(qp, gid, lid) : fn(*mut ibv_qp, *const ibv_gid, u16) -> c_int, libc::EINVAL)
}

/// `ibv_rereg_mr`: not supported (deregister and register again);
/// returns `IBV_REREG_MR_ERR_INPUT`-style failure with EOPNOTSUPP.
#[no_mangle]
pub unsafe extern "C" fn ibv_rereg_mr(
    mr: *mut ibv_mr,
    flags: c_int,
    pd: *mut ibv_pd,
    addr: *mut c_void,
    len: usize,
    access: c_int,
) -> c_int {
    // SAFETY: the program passes a live MR.
    if !mr.is_null() && unsafe { ctx_is_ours((*mr).context) } {
        crate::util::set_errno(libc::EOPNOTSUPP);
        return libc::EOPNOTSUPP;
    }
    forward!(
        ibv_rereg_mr(mr, flags, pd, addr, len, access)
            : fn(*mut ibv_mr, c_int, *mut ibv_pd, *mut c_void, usize, c_int) -> c_int,
        libc::EINVAL
    )
}

/// `ibv_reg_dmabuf_mr`: no dma-buf regions (a software device has no DMA).
#[no_mangle]
pub unsafe extern "C" fn ibv_reg_dmabuf_mr(
    pd: *mut ibv_pd,
    offset: u64,
    len: usize,
    iova: u64,
    fd: c_int,
    access: c_int,
) -> *mut ibv_mr {
    // SAFETY: the program passes a live PD.
    if unsafe { pd_is_ours(pd) } {
        return null(libc::EOPNOTSUPP);
    }
    forward!(
        ibv_reg_dmabuf_mr(pd, offset, len, iova, fd, access)
            : fn(*mut ibv_pd, u64, usize, u64, c_int, c_int) -> *mut ibv_mr,
        null(libc::EINVAL)
    )
}

/// `ibv_query_ece`: enhanced connection establishment is mlx5's.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_ece(qp: *mut ibv_qp, ece: *mut c_void) -> c_int {
    // SAFETY: the program passes a live QP.
    if unsafe { qp_is_ours(qp) } {
        return libc::EOPNOTSUPP;
    }
    forward!(ibv_query_ece(qp, ece) : fn(*mut ibv_qp, *mut c_void) -> c_int, libc::EINVAL)
}

/// `ibv_set_ece`: as `ibv_query_ece`.
#[no_mangle]
pub unsafe extern "C" fn ibv_set_ece(qp: *mut ibv_qp, ece: *mut c_void) -> c_int {
    // SAFETY: the program passes a live QP.
    if unsafe { qp_is_ours(qp) } {
        return libc::EOPNOTSUPP;
    }
    forward!(ibv_set_ece(qp, ece) : fn(*mut ibv_qp, *mut c_void) -> c_int, libc::EINVAL)
}

/// `ibv_get_pkey_index`: the one default P_Key is index 0.
#[no_mangle]
pub unsafe extern "C" fn ibv_get_pkey_index(ctx: *mut ibv_context, port: u8, pkey: u16) -> c_int {
    // SAFETY: the program passes a live context.
    if unsafe { ctx_is_ours(ctx) } {
        return if port == 1 && u16::from_be(pkey) == 0xffff {
            0
        } else {
            -libc::ENOENT
        };
    }
    forward!(ibv_get_pkey_index(ctx, port, pkey) : fn(*mut ibv_context, u8, u16) -> c_int, -libc::EINVAL)
}

/// `ibv_query_qp_data_in_order`: 0, "not guaranteed" (data of an RDMA
/// Write is placed as its segments arrive; only the completion orders it).
#[no_mangle]
pub unsafe extern "C" fn ibv_query_qp_data_in_order(qp: *mut ibv_qp, op: u32, flags: u32) -> c_int {
    // SAFETY: the program passes a live QP.
    if unsafe { qp_is_ours(qp) } {
        return 0;
    }
    forward!(ibv_query_qp_data_in_order(qp, op, flags) : fn(*mut ibv_qp, u32, u32) -> c_int, 0)
}
