//! Queue pairs made through the CM: `rdma_create_qp`/`rdma_create_qp_ex`
//! (with the CQs librdmacm makes for them) and `rdma_destroy_qp`.

use super::*;

/// `rdma_create_qp`.
#[no_mangle]
pub unsafe extern "C" fn rdma_create_qp(
    id: *mut rdma_cm_id,
    pd: *mut ibv_pd,
    attr: *mut ibv_qp_init_attr,
) -> c_int {
    if !id_is_live(id) {
        return fail(libc::EINVAL);
    }
    if id.is_null() || attr.is_null() {
        return fail(libc::EINVAL);
    }
    // SAFETY: a live id of ours; the program's attributes.
    unsafe {
        if !(*id).qp.is_null() || (*id).verbs.is_null() {
            return fail(libc::EINVAL);
        }
        let pd = if pd.is_null() { (*id).pd } else { pd };
        if pd.is_null() || (*pd).context != (*id).verbs {
            return fail(libc::EINVAL);
        }
        let a = &mut *attr;
        let made = create_cqs(
            id,
            if a.send_cq.is_null() {
                a.cap.max_send_wr.max(1)
            } else {
                0
            },
            if a.recv_cq.is_null() {
                a.cap.max_recv_wr.max(1)
            } else {
                0
            },
        );
        if made.is_err() {
            destroy_cqs(id);
            return -1;
        }
        if a.send_cq.is_null() {
            a.send_cq = (*id).send_cq;
        }
        if a.recv_cq.is_null() {
            a.recv_cq = (*id).recv_cq;
        }
        let qp = ibv_create_qp(pd, attr);
        if qp.is_null() {
            let e = errno();
            destroy_cqs(id);
            return fail(e);
        }
        let mut qa: ibv_qp_attr = std::mem::zeroed();
        qa.qp_state = IBV_QPS_INIT;
        let mut m = 0;
        rdma_init_qp_attr(id, &mut qa, &mut m);
        let r = ibv_modify_qp(qp, &mut qa, m);
        if r != 0 {
            ibv_destroy_qp(qp);
            destroy_cqs(id);
            return fail(r);
        }
        (*id).qp = qp;
        (*id).pd = pd;
    }
    0
}

/// `rdma_create_qp_ex`: the basic attributes plus a PD; extended ones
/// (send ops flags, create flags, TSO, RSS, XRC) fail with EOPNOTSUPP.
#[no_mangle]
pub unsafe extern "C" fn rdma_create_qp_ex(id: *mut rdma_cm_id, attr: *mut c_void) -> c_int {
    if !id_is_live(id) {
        return fail(libc::EINVAL);
    }
    if attr.is_null() {
        return fail(libc::EINVAL);
    }
    // `struct ibv_qp_init_attr_ex` starts with `ibv_qp_init_attr`'s fields.
    // SAFETY: the program's struct is at least that long.
    unsafe {
        let comp_mask = *attr
            .cast::<u8>()
            .add(QP_INIT_ATTR_EX_COMP_MASK)
            .cast::<u32>();
        let pd = *attr
            .cast::<u8>()
            .add(QP_INIT_ATTR_EX_PD)
            .cast::<*mut ibv_pd>();
        if comp_mask & !IBV_QP_INIT_ATTR_PD != 0 {
            return fail(libc::EOPNOTSUPP);
        }
        let pd = if comp_mask & IBV_QP_INIT_ATTR_PD != 0 {
            pd
        } else {
            std::ptr::null_mut()
        };
        rdma_create_qp(id, pd, attr.cast())
    }
}

unsafe fn create_cqs(id: *mut rdma_cm_id, send: u32, recv: u32) -> Result<(), ()> {
    // SAFETY: a live id of ours on warpsock0.
    unsafe {
        for (size, ch, cq) in [
            (recv, &mut (*id).recv_cq_channel, &mut (*id).recv_cq),
            (send, &mut (*id).send_cq_channel, &mut (*id).send_cq),
        ] {
            if size == 0 {
                continue;
            }
            *ch = ibv_create_comp_channel((*id).verbs);
            if ch.is_null() {
                return Err(());
            }
            *cq = ibv_create_cq((*id).verbs, size as c_int, id.cast(), *ch, 0);
            if cq.is_null() {
                return Err(());
            }
        }
    }
    Ok(())
}

/// librdmacm's `ucma_destroy_cqs`: the CQs and channels `rdma_create_qp`
/// made (or the program put in the id).
unsafe fn destroy_cqs(id: *mut rdma_cm_id) {
    // SAFETY: a live id of ours; its CQ/channel fields are ours or NULL.
    unsafe {
        if !(*id).recv_cq.is_null() {
            ibv_destroy_cq((*id).recv_cq);
            if !(*id).send_cq.is_null() && (*id).send_cq != (*id).recv_cq {
                ibv_destroy_cq((*id).send_cq);
            }
            (*id).send_cq = std::ptr::null_mut();
            (*id).recv_cq = std::ptr::null_mut();
        }
        if !(*id).recv_cq_channel.is_null() {
            ibv_destroy_comp_channel((*id).recv_cq_channel);
            if !(*id).send_cq_channel.is_null() && (*id).send_cq_channel != (*id).recv_cq_channel {
                ibv_destroy_comp_channel((*id).send_cq_channel);
            }
            (*id).send_cq_channel = std::ptr::null_mut();
            (*id).recv_cq_channel = std::ptr::null_mut();
        }
    }
}

/// `rdma_destroy_qp`.
#[no_mangle]
pub unsafe extern "C" fn rdma_destroy_qp(id: *mut rdma_cm_id) {
    if !id_is_live(id) {
        set_errno(libc::EINVAL);
        return;
    }
    if id.is_null() {
        return;
    }
    // SAFETY: a live id of ours.
    unsafe {
        if !(*id).qp.is_null() {
            ibv_destroy_qp((*id).qp);
            (*id).qp = std::ptr::null_mut();
        }
        destroy_cqs(id);
    }
}
