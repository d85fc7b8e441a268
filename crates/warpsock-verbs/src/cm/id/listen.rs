//! Passive side: `rdma_listen`, the accept loop with its bounded MPA
//! handshakes, CONNECT_REQUEST offers and `rdma_get_request`.

use super::*;

/// `rdma_listen`: binds a wildcard address first if the id is unbound.
#[no_mangle]
pub unsafe extern "C" fn rdma_listen(id: *mut rdma_cm_id, backlog: c_int) -> c_int {
    if !id_is_live(id) {
        return fail(libc::EINVAL);
    }
    if id.is_null() {
        return fail(libc::EINVAL);
    }
    // SAFETY: a live id of ours.
    let sh = Arc::clone(unsafe { shared(id) });
    if lock(&sh.st).bound.is_none() {
        let mut any: libc::sockaddr_storage =
            // SAFETY: all-zero storage.
            unsafe { std::mem::zeroed() };
        to_c((std::net::Ipv4Addr::UNSPECIFIED, 0).into(), &mut any);
        // SAFETY: forwarded.
        if unsafe { rdma_bind_addr(id, (&mut any as *mut libc::sockaddr_storage).cast()) } != 0 {
            return -1;
        }
    }
    let mut st = lock(&sh.st);
    if st.listen.is_some() {
        return fail(libc::EINVAL);
    }
    let Some(fd) = st.bound.take() else {
        return fail(libc::EINVAL);
    };
    // As the kernel's ucma: 0 or less, or more than its maximum, is the
    // maximum — and at most a quarter of the descriptors the process may
    // open: each waiting request is a socket in this process, not a kernel
    // object as with ucma (helper 82: a backlog of 0, `ucmatose`'s and
    // `rdma_server`'s, let a peer hold 1,024 of a default limit's 1,024).
    let backlog = backlog_for(backlog, descriptor_share());
    st.backlog = backlog;
    // SAFETY: listen on our bound socket.
    if unsafe { libc::listen(fd.as_raw_fd(), backlog.min(4096) as c_int) } != 0 {
        let e = errno();
        st.bound = Some(fd);
        return fail(e);
    }
    let listener = match Listener::from_std(TcpListener::from(fd)) {
        Ok(mut l) => {
            l.set_mpa_timeout(MPA_TIMEOUT);
            l.set_max_pending(MAX_HANDSHAKES);
            Arc::new(l)
        }
        Err(e) => return fail(e.raw_os_error().unwrap_or(libc::EIO)),
    };
    let stop = Arc::new(AtomicBool::new(false));
    let weak = Arc::downgrade(&sh);
    let waiting = Arc::clone(&st.waiting);
    let (l2, stop2) = (Arc::clone(&listener), Arc::clone(&stop));
    let t = std::thread::Builder::new()
        .name("warpsock-cm-listen".into())
        .spawn(move || accept_loop(&l2, &stop2, &weak, &waiting, backlog));
    match t {
        Ok(t) => {
            st.listen = Some(Listen {
                listener,
                stop,
                thread: Some(t),
            });
            0
        }
        Err(_) => fail(libc::EAGAIN),
    }
}

/// The listener's thread: the engine's [`Listener`] reads the pending
/// MPA Requests side by side (at most [`MAX_HANDSHAKES`], the oldest
/// evicted by a newer connection, each for at most [`MPA_TIMEOUT`] from
/// its TCP accept), and each one that arrives is offered to the program.
/// Ends once `stop` is set (and the socket shut down: [`stop_listen`]).
fn accept_loop(
    l: &Listener,
    stop: &AtomicBool,
    listener: &Weak<IdShared>,
    waiting: &Arc<AtomicUsize>,
    backlog: usize,
) {
    while !stop.load(Ordering::Acquire) {
        match l.accept(None) {
            Ok(req) => match listener.upgrade() {
                Some(lst) => offer(&lst, req, waiting, backlog),
                None => return,
            },
            Err(_) if stop.load(Ordering::Acquire) => return,
            // Out of descriptors or memory: the engine pauses by itself.
            Err(CmError::Io(e))
                if !matches!(
                    e.raw_os_error(),
                    Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
                ) =>
            {
                // The listening socket failed: do not spin on it.
                debug!("listening socket: {e}");
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => debug!("incoming connection failed before its MPA Request: {e}"),
        }
    }
}

/// A connection request for the listener: a new id and CONNECT_REQUEST.
fn offer(l: &Arc<IdShared>, req: ConnectRequest, waiting: &Arc<AtomicUsize>, backlog: usize) {
    let lst = lock(&l.st);
    if !lst.alive || lst.listen.is_none() {
        return;
    }
    // The event's length is a u8 (MPA allows 512 bytes; siw refuses more
    // than 256): a prefix would pass for the whole.
    let n = req.private_data().len();
    if n > usize::from(u8::MAX) {
        debug!(
            "{} bytes of private data from {}, more than a CONNECT_REQUEST carries; closing",
            n,
            req.peer_addr()
        );
        return;
    }
    if waiting.load(Ordering::Acquire) >= backlog {
        debug!(
            "backlog of {backlog} requests full; closing {}",
            req.peer_addr()
        );
        return;
    }
    let lid = l.id_ptr();
    // SAFETY: the listener is alive (its lock held): its id is live.
    let (sync, channel, context) = unsafe {
        let p = lid.cast::<CmaIdPrivate>();
        ((*p).sync != 0, (*lid).channel, (*lid).context)
    };
    drop(lst);
    let Ok(child) = alloc_id(
        if sync { std::ptr::null_mut() } else { channel },
        context,
        RDMA_PS_TCP,
    ) else {
        return;
    };
    // SAFETY: the id just made.
    let csh = Arc::clone(unsafe { shared(child) });
    let (ird, ord) = req
        .request()
        .params
        .map_or((1, 1), |p| (p.ird.min(255) as u8, p.ord.min(255) as u8));
    let pdata = req.private_data().to_vec();
    // SAFETY: the id just made; not yet visible to the program.
    unsafe {
        let _ = attach_device(child);
        to_c(req.local_addr(), &mut (*child).route.addr.src);
        to_c(req.peer_addr(), &mut (*child).route.addr.dst);
    }
    waiting.fetch_add(1, Ordering::AcqRel);
    {
        let mut st = lock(&csh.st);
        st.peer_ird = ird;
        st.peer_ord = ord;
        st.request = Some((req, Arc::clone(waiting)));
    }
    let queued = push(
        l,
        child,
        RDMA_CM_EVENT_CONNECT_REQUEST,
        Ev {
            pdata: &pdata,
            initiator_depth: ird,
            responder_resources: ord,
            listen: Some(lid),
            ..Ev::default()
        },
    );
    if !queued {
        // Nowhere to report it (the listener's channel is destroyed): the
        // program never sees this id; it goes, and its connection with it.
        // SAFETY: our id, unseen by the program.
        unsafe { rdma_destroy_id(child) };
    }
}

/// `rdma_get_request` (synchronous listeners).
#[no_mangle]
pub unsafe extern "C" fn rdma_get_request(
    listen: *mut rdma_cm_id,
    id: *mut *mut rdma_cm_id,
) -> c_int {
    if !id_is_live(listen) {
        return fail(libc::EINVAL);
    }
    if listen.is_null() || id.is_null() {
        return fail(libc::EINVAL);
    }
    // SAFETY: a live id of ours.
    unsafe {
        if (*listen.cast::<CmaIdPrivate>()).sync == 0 {
            return fail(libc::EINVAL);
        }
        if !(*listen).event.is_null() {
            rdma_ack_cm_event((*listen).event);
            (*listen).event = std::ptr::null_mut();
        }
        let mut ev: *mut rdma_cm_event = std::ptr::null_mut();
        if rdma_get_cm_event((*listen).channel, &mut ev) != 0 {
            return -1;
        }
        let e = &*ev;
        let err = if e.event == RDMA_CM_EVENT_REJECTED {
            Some(libc::ECONNREFUSED)
        } else if e.status != 0 {
            Some(e.status.abs())
        } else if e.event != RDMA_CM_EVENT_CONNECT_REQUEST {
            Some(libc::EINVAL)
        } else {
            None
        };
        if let Some(err) = err {
            rdma_ack_cm_event(ev);
            return fail(err);
        }
        *id = e.id;
        (*e.id).event = ev;
    }
    0
}

/// The requests a listener asked for `asked` keeps waiting, with `share`
/// the most the process's descriptors allow ([`descriptor_share`]).
pub(super) fn backlog_for(asked: c_int, share: usize) -> usize {
    usize::try_from(asked)
        .ok()
        .filter(|&b| b > 0 && b < MAX_BACKLOG)
        .unwrap_or(MAX_BACKLOG)
        .min(share)
}

/// A quarter of the process's soft `RLIMIT_NOFILE` (at least 1): the most
/// requests one listener keeps waiting ([`rdma_listen`]).
pub(super) fn descriptor_share() -> usize {
    // SAFETY: rlimit is plain data, written by the call.
    let mut l: libc::rlimit = unsafe { std::mem::zeroed() };
    // SAFETY: getrlimit writes one rlimit into `l`.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) } != 0 {
        return MAX_BACKLOG;
    }
    usize::try_from(l.rlim_cur / 4).unwrap_or(usize::MAX).max(1)
}
