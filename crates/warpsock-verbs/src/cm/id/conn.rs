//! Connections: `rdma_connect` (with its retry, see `cm/outcome.rs`),
//! `rdma_accept`, `rdma_reject`, `rdma_disconnect`, `rdma_establish`,
//! `rdma_init_qp_attr`, and ESTABLISHED/DISCONNECTED on the id.

use super::*;
use crate::cm::poke::{self, POKE_AFTER};

/// Resolves `RDMA_MAX_*` (255) to the device maximum; larger is EINVAL.
fn depth(v: u8) -> Result<u8, c_int> {
    match v {
        RDMA_MAX_DEPTH => Ok(MAX_RD_ATOM),
        v if v > MAX_RD_ATOM => Err(libc::EINVAL),
        v => Ok(v),
    }
}

/// The QP a connect/accept uses: `id->qp`, or the one `qp_num` names.
unsafe fn qp_for(id: *mut rdma_cm_id, param: *const rdma_conn_param) -> Option<Arc<QpShared>> {
    // SAFETY: a live id of ours; the program's parameters.
    unsafe {
        if !(*id).qp.is_null() {
            return Some(Arc::clone(qp::shared((*id).qp)));
        }
        if param.is_null() {
            return None;
        }
        qp::by_num((*param).qp_num)
    }
}

/// Private data of a connect/accept/reject, checked against the limit.
unsafe fn pdata<'a>(p: *const c_void, len: u8) -> Result<&'a [u8], c_int> {
    if len == 0 || p.is_null() {
        return Ok(&[]);
    }
    if usize::from(len) > MAX_PRIVATE_DATA {
        return Err(libc::EINVAL);
    }
    // SAFETY: the program's buffer of `len` bytes.
    Ok(unsafe { std::slice::from_raw_parts(p.cast(), usize::from(len)) })
}

/// Links the QP's end to DISCONNECTED on the id.
fn link_end(sh: &Arc<IdShared>, qp: &QpShared) {
    let w = Arc::downgrade(sh);
    qp.on_end(Box::new(move |_| {
        if let Some(sh) = w.upgrade() {
            let fire = {
                let mut st = lock(&sh.st);
                let f = st.connected && !st.disconnected;
                st.disconnected = true;
                f
            };
            if fire {
                push_self(&sh, RDMA_CM_EVENT_DISCONNECTED, Ev::default());
            }
        }
    }));
}

fn established(sh: &Arc<IdShared>, qp: &Arc<QpShared>, neg: Option<&Negotiated>, pdata: &[u8]) {
    {
        let mut st = lock(&sh.st);
        st.connecting = false;
        st.connected = true;
        st.qp = Some(Arc::clone(qp));
    }
    let (ird, ord) = neg.map_or((1, 1), |n| (n.ird.min(255) as u8, n.ord.min(255) as u8));
    push_self(
        sh,
        RDMA_CM_EVENT_ESTABLISHED,
        Ev {
            pdata,
            responder_resources: ird,
            initiator_depth: ord,
            ..Ev::default()
        },
    );
    // After ESTABLISHED is queued: a connection that has already ended
    // (the peer failed at once) reports DISCONNECTED from inside this
    // call, and it must come second (misuse.c's local-bounds case saw it
    // first when the client's QP failed right after its ESTABLISHED).
    link_end(sh, qp);
}

/// `rdma_connect`: TCP connect and MPA exchange on a thread; the outcome
/// is an event (a synchronous id waits for it).
#[no_mangle]
pub unsafe extern "C" fn rdma_connect(id: *mut rdma_cm_id, param: *mut rdma_conn_param) -> c_int {
    if !id_is_live(id) {
        return fail(libc::EINVAL);
    }
    if id.is_null() || param.is_null() {
        return fail(libc::EINVAL);
    }
    // SAFETY: a live id of ours; the program's parameters.
    let (sh, p) = unsafe { (Arc::clone(shared(id)), *param) };
    let (Ok(ird), Ok(ord)) = (depth(p.responder_resources), depth(p.initiator_depth)) else {
        return fail(libc::EINVAL);
    };
    // SAFETY: the program's private data.
    let pd = match unsafe { pdata(p.private_data, p.private_data_len) } {
        Ok(d) => d.to_vec(),
        Err(e) => return fail(e),
    };
    // SAFETY: as above.
    let Some(qp) = (unsafe { qp_for(id, param) }) else {
        return fail(libc::EINVAL);
    };
    // SAFETY: a live id of ours.
    let Some(dst) =
        (unsafe { from_c((&(*id).route.addr.dst as *const libc::sockaddr_storage).cast()) })
    else {
        return fail(libc::EINVAL);
    };
    {
        let mut st = lock(&sh.st);
        if !st.resolved_route || st.connecting || st.connected {
            return fail(libc::EINVAL);
        }
        if !matches!(lock(&qp.st).state, IBV_QPS_INIT | IBV_QPS_RTR) {
            return fail(libc::EINVAL);
        }
        st.connecting = true;
    }
    let opts = qp.options(ird, ord, &pd);
    let sh2 = Arc::clone(&sh);
    let t = std::thread::Builder::new()
        .name("warpsock-cm-connect".into())
        .spawn(move || {
            let Ok(mut init) = qp.take_init(opts) else {
                lock(&sh.st).connecting = false;
                push_self(
                    &sh,
                    RDMA_CM_EVENT_CONNECT_ERROR,
                    Ev {
                        status: -libc::EINVAL,
                        ..Ev::default()
                    },
                );
                return;
            };
            let attempt = || {
                crate::sock::tcp_connect(dst, TCP_CONNECT_TIMEOUT)
                    .map_err(|e| tcp_error(dst, e))
                    .and_then(|sock| poke::exchange(sock, dst, &init, POKE_AFTER))
            };
            let mut backoff = Backoff::default();
            let res = loop {
                match attempt() {
                    Err(e) if ended_before_reply(&e) => match backoff.next_wait() {
                        Some(wait) => {
                            debug!("connect to {dst}: {e}; trying again in {wait:?}");
                            std::thread::sleep(wait);
                        }
                        None => break Err(e),
                    },
                    res => break res,
                }
            };
            match res {
                Ok(eng) => {
                    drop(init);
                    let neg = eng.negotiated();
                    let local = eng.local_addr();
                    {
                        // The source port is known now (getsockname for rsockets).
                        let st = lock(&sh.st);
                        if st.alive {
                            // SAFETY: the id is alive (its lock held).
                            unsafe { to_c(local, &mut (*sh.id_ptr()).route.addr.src) };
                        }
                    }
                    qp.attach(eng, neg.as_ref(), true);
                    let peer = neg
                        .as_ref()
                        .map(|n| n.peer_private_data.clone())
                        .unwrap_or_default();
                    established(&sh, &qp, neg.as_ref(), &peer);
                }
                Err(e) => {
                    debug!("connect to {dst} failed: {e}");
                    let recvs = std::mem::take(&mut init.recvs);
                    drop(init);
                    qp.setup_failed(recvs);
                    lock(&sh.st).connecting = false;
                    let (kind, status, data) = connect_failed(&e);
                    push_self(
                        &sh,
                        kind,
                        Ev {
                            status,
                            pdata: &data,
                            ..Ev::default()
                        },
                    );
                }
            }
        });
    if t.is_err() {
        lock(&sh2.st).connecting = false;
        return fail(libc::EAGAIN);
    }
    // SAFETY: a live id of ours.
    unsafe { complete(id) }
}

/// `rdma_accept`: sends the MPA Reply; ESTABLISHED follows on the id.
#[no_mangle]
pub unsafe extern "C" fn rdma_accept(id: *mut rdma_cm_id, param: *mut rdma_conn_param) -> c_int {
    if !id_is_live(id) {
        return fail(libc::EINVAL);
    }
    if id.is_null() {
        return fail(libc::EINVAL);
    }
    // SAFETY: a live id of ours.
    let sh = Arc::clone(unsafe { shared(id) });
    let (peer_ird, peer_ord) = {
        let st = lock(&sh.st);
        if st.request.is_none() {
            return fail(libc::EINVAL);
        }
        (st.peer_ird, st.peer_ord)
    };
    // The parameters are checked before the request is taken: a call
    // that fails on them leaves it to accept or reject again (as
    // librdmacm checks them before the kernel sees the call).
    // Defaults without parameters: what the initiator asked for.
    let (ird, ord, pd) = if param.is_null() {
        (
            peer_ord.min(MAX_RD_ATOM),
            peer_ird.min(MAX_RD_ATOM),
            Vec::new(),
        )
    } else {
        // SAFETY: the program's parameters and private data.
        let p = unsafe { *param };
        let (Ok(i), Ok(o)) = (depth(p.responder_resources), depth(p.initiator_depth)) else {
            return fail(libc::EINVAL);
        };
        // SAFETY: as above.
        match unsafe { pdata(p.private_data, p.private_data_len) } {
            Ok(d) => (i, o, d.to_vec()),
            Err(e) => return fail(e),
        }
    };
    // SAFETY: as above.
    let Some(qp) = (unsafe { qp_for(id, param) }) else {
        return fail(libc::EINVAL);
    };
    let Some((req, waiting)) = lock(&sh.st).request.take() else {
        return fail(libc::EINVAL);
    };
    waiting.fetch_sub(1, Ordering::AcqRel);
    let mut init = match qp.take_init(qp.options(ird, ord, &[])) {
        Ok(i) => i,
        Err(e) => return fail(e),
    };
    match req.accept(&init, &pd) {
        Ok(eng) => {
            drop(init);
            let neg = eng.negotiated();
            qp.attach(eng, neg.as_ref(), false);
            established(&sh, &qp, neg.as_ref(), &[]);
        }
        Err(e) => {
            debug!("accept failed: {e}");
            let recvs = std::mem::take(&mut init.recvs);
            drop(init);
            qp.setup_failed(recvs);
            return fail(match e {
                CmError::PrivateDataTooLong { .. } => libc::EINVAL,
                CmError::Io(io) => io.raw_os_error().unwrap_or(libc::ECONNRESET),
                _ => libc::ECONNRESET,
            });
        }
    }
    // SAFETY: a live id of ours.
    unsafe { complete(id) }
}

/// `rdma_reject`: an MPA Reply with the Reject bit and the private data.
#[no_mangle]
pub unsafe extern "C" fn rdma_reject(id: *mut rdma_cm_id, data: *const c_void, len: u8) -> c_int {
    if !id_is_live(id) {
        return fail(libc::EINVAL);
    }
    if id.is_null() {
        return fail(libc::EINVAL);
    }
    // SAFETY: a live id of ours.
    let sh = unsafe { shared(id) };
    // Checked first: a failed call leaves the request (see rdma_accept).
    // SAFETY: the program's private data.
    let d = match unsafe { pdata(data, len) } {
        Ok(d) => d,
        Err(e) => return fail(e),
    };
    let Some((req, waiting)) = lock(&sh.st).request.take() else {
        return fail(libc::EINVAL);
    };
    waiting.fetch_sub(1, Ordering::AcqRel);
    match req.reject(d) {
        Ok(()) => 0,
        Err(_) => fail(libc::ECONNRESET),
    }
}

/// `rdma_disconnect`: graceful close (iWARP: the QP goes to SQD, FIN);
/// DISCONNECTED follows once the connection has ended.
#[no_mangle]
pub unsafe extern "C" fn rdma_disconnect(id: *mut rdma_cm_id) -> c_int {
    if !id_is_live(id) {
        return fail(libc::EINVAL);
    }
    if id.is_null() {
        return fail(libc::EINVAL);
    }
    // SAFETY: a live id of ours.
    let sh = unsafe { shared(id) };
    let qp = {
        let st = lock(&sh.st);
        if !st.connected {
            return fail(libc::EINVAL);
        }
        if st.disconnected {
            None
        } else {
            st.qp.clone()
        }
    };
    if let Some(qp) = qp {
        let _ = qp.disconnect();
    }
    if lock(&sh.st).disconnected {
        // Already reported (the peer closed first): nothing to wait for.
        return 0;
    }
    // SAFETY: a live id of ours.
    unsafe { complete(id) }
}

/// `rdma_establish`: over iWARP the connection is established by the
/// provider; 0 once connected, EINVAL before.
#[no_mangle]
pub unsafe extern "C" fn rdma_establish(id: *mut rdma_cm_id) -> c_int {
    if !id_is_live(id) {
        return fail(libc::EINVAL);
    }
    if id.is_null() {
        return fail(libc::EINVAL);
    }
    // SAFETY: a live id of ours.
    if lock(&unsafe { shared(id) }.st).connected {
        0
    } else {
        fail(libc::EINVAL)
    }
}

/// `rdma_init_qp_attr`: the kernel's iWARP answers (`iw_cm_init_qp_attr`):
/// INIT and RTR set state, access (remote read/write) and port; RTS needs
/// nothing (the connection moves the QP).
#[no_mangle]
pub unsafe extern "C" fn rdma_init_qp_attr(
    id: *mut rdma_cm_id,
    attr: *mut ibv_qp_attr,
    mask: *mut c_int,
) -> c_int {
    if !id_is_live(id) {
        return fail(libc::EINVAL);
    }
    if id.is_null() || attr.is_null() || mask.is_null() {
        return fail(libc::EINVAL);
    }
    // SAFETY: the program's out-pointers.
    unsafe {
        match (*attr).qp_state {
            IBV_QPS_INIT | IBV_QPS_RTR => {
                (*attr).qp_access_flags = (IBV_ACCESS_LOCAL_WRITE
                    | IBV_ACCESS_REMOTE_WRITE
                    | IBV_ACCESS_REMOTE_READ) as c_uint;
                (*attr).port_num = 1;
                *mask = IBV_QP_STATE | IBV_QP_ACCESS_FLAGS | IBV_QP_PORT;
            }
            IBV_QPS_RTS => *mask = 0,
            _ => return fail(libc::EINVAL),
        }
    }
    0
}
