//! CM ids and the operations on them.

use std::ffi::{c_int, c_uint, c_void};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

use warpsock_engine::{CmError, ConnectRequest, Negotiated};

use super::addr::route_source;
use super::outcome::{connect_failed, ended_before_reply, Backoff};
use super::{
    channel_queue, new_channel, rdma_ack_cm_event, rdma_destroy_event_channel, rdma_get_cm_event,
    EventObj, EventPtr, MAX_HANDSHAKES, MAX_PRIVATE_DATA,
};
use crate::abi::*;
use crate::abi_cm::*;
use crate::config::debug;
use crate::cq::{ibv_create_comp_channel, ibv_create_cq, ibv_destroy_comp_channel, ibv_destroy_cq};
use crate::device::{self, MAX_RD_ATOM};
use crate::mem::ibv_alloc_pd;
use crate::qp::{self, ibv_create_qp, ibv_destroy_qp, ibv_modify_qp, QpShared};
use crate::sock::{from_c, to_c};
use crate::util::{errno, fail, lock};

/// How long `rdma_connect` waits for the TCP connection.
pub const TCP_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The engine's setup error for a failed TCP connect (as its own
/// `connect` reports them).
fn tcp_error(addr: SocketAddr, e: std::io::Error) -> CmError {
    match e.raw_os_error() {
        Some(libc::ECONNREFUSED) => CmError::Refused { addr },
        Some(libc::EHOSTUNREACH | libc::ENETUNREACH | libc::EADDRNOTAVAIL) => {
            CmError::Unreachable { addr, source: e }
        }
        Some(libc::ETIMEDOUT) => CmError::Timeout {
            addr: Some(addr),
            stage: "TCP connect",
            after: TCP_CONNECT_TIMEOUT,
        },
        _ => CmError::Io(e),
    }
}

/// How long a listener waits for a connected peer's MPA Request.
pub const MPA_TIMEOUT: Duration = Duration::from_secs(10);

/// The process-wide context every id uses (librdmacm, too, opens each
/// device once), and its default protection domain.
fn cm_device() -> Result<(*mut ibv_context, *mut ibv_pd), c_int> {
    static C: OnceLock<Result<(usize, usize), c_int>> = OnceLock::new();
    let r = C.get_or_init(|| {
        // SAFETY: our own device and context.
        unsafe {
            let ctx = device::ibv_open_device(device::ptr());
            if ctx.is_null() {
                return Err(errno());
            }
            let pd = ibv_alloc_pd(ctx);
            if pd.is_null() {
                return Err(errno());
            }
            Ok((ctx as usize, pd as usize))
        }
    });
    r.map(|(c, p)| (c as *mut ibv_context, p as *mut ibv_pd))
}

/// An id: rdma-core's private prefix (see [`CmaIdPrivate`]) and our state.
#[repr(C)]
pub struct IdObj {
    /// `struct rdma_cm_id` and the fields rsockets reads.
    pub p: CmaIdPrivate,
    /// The rest.
    pub sh: Arc<IdShared>,
}

/// The shared part of an id (its threads hold it).
#[derive(Debug)]
pub struct IdShared {
    obj: AtomicPtr<IdObj>,
    st: Mutex<IdSt>,
    cv: Condvar,
}

#[derive(Debug)]
struct Listen {
    stop: OwnedFd,
    thread: Option<JoinHandle<()>>,
}

#[derive(Debug, Default)]
struct IdSt {
    alive: bool,
    /// Events handed to the program and not acknowledged.
    unacked: usize,
    /// The bound (maybe listening) socket before `rdma_listen` takes it.
    bound: Option<OwnedFd>,
    listen: Option<Listen>,
    backlog: usize,
    /// Connection requests waiting for accept/reject (listener).
    waiting: Arc<AtomicUsize>,
    /// Passive id: the request to accept or reject, and the listener's
    /// count it is in.
    request: Option<(ConnectRequest, Arc<AtomicUsize>)>,
    peer_ird: u8,
    peer_ord: u8,
    resolved_addr: bool,
    resolved_route: bool,
    connecting: bool,
    connected: bool,
    disconnected: bool,
    qp: Option<Arc<QpShared>>,
    reuseaddr: bool,
    afonly: Option<bool>,
    own_channel: bool,
}

impl IdShared {
    pub(super) fn delivered(&self) {
        lock(&self.st).unacked += 1;
    }

    pub(super) fn acked(&self) {
        let mut st = lock(&self.st);
        st.unacked = st.unacked.saturating_sub(1);
        self.cv.notify_all();
    }

    fn id_ptr(&self) -> *mut rdma_cm_id {
        self.obj.load(Ordering::Acquire).cast()
    }
}

/// What an event carries besides its type.
#[derive(Default)]
struct Ev<'a> {
    status: c_int,
    pdata: &'a [u8],
    responder_resources: u8,
    initiator_depth: u8,
    listen: Option<*mut rdma_cm_id>,
}

/// Queues an event about `about` (an id pointer) on `owner`'s channel,
/// counted against `owner`. Does nothing once `owner` is destroyed.
fn push(owner: &Arc<IdShared>, about: *mut rdma_cm_id, kind: c_uint, ev: Ev<'_>) {
    let st = lock(&owner.st);
    if !st.alive {
        return;
    }
    let me = owner.id_ptr();
    // SAFETY: the owner is alive (checked under its lock): its id and
    // channel are live.
    let q = unsafe { channel_queue((*me).channel) };
    drop(st);
    let mut e: Box<EventObj> = Box::new(EventObj {
        // SAFETY: all-zero is valid for the event's plain C parts.
        ibv: unsafe { std::mem::zeroed() },
        pdata: [0; 256],
        owner: Arc::clone(owner),
    });
    let n = ev.pdata.len().min(255);
    e.pdata[..n].copy_from_slice(&ev.pdata[..n]);
    e.ibv.id = about;
    e.ibv.listen_id = ev.listen.unwrap_or(std::ptr::null_mut());
    e.ibv.event = kind;
    e.ibv.status = ev.status;
    let c = &mut e.ibv.param.conn;
    c.private_data_len = n as u8;
    c.responder_resources = ev.responder_resources;
    c.initiator_depth = ev.initiator_depth;
    let raw = Box::into_raw(e);
    // SAFETY: `raw` is live; the pointer targets its own pdata.
    unsafe {
        if n > 0 {
            (*raw).ibv.param.conn.private_data = (*raw).pdata.as_ptr().cast();
        }
    }
    q.push(EventPtr(raw));
}

/// An event about the id itself.
fn push_self(sh: &Arc<IdShared>, kind: c_uint, ev: Ev<'_>) {
    push(sh, sh.id_ptr(), kind, ev);
}

/// The id behind a program's pointer.
///
/// # Safety
/// `id` came from this library and is not destroyed.
unsafe fn shared<'a>(id: *mut rdma_cm_id) -> &'a Arc<IdShared> {
    // SAFETY: `p.id` is the first field of IdObj.
    unsafe { &(*id.cast::<IdObj>()).sh }
}

/// librdmacm's `ucma_complete`: for a synchronous id, waits for the next
/// event into `id->event` (acknowledging the previous one) and turns an
/// error event into -1/errno.
unsafe fn complete(id: *mut rdma_cm_id) -> c_int {
    let p = id.cast::<CmaIdPrivate>();
    // SAFETY: a live id of ours.
    unsafe {
        if (*p).sync == 0 {
            return 0;
        }
        if !(*id).event.is_null() {
            rdma_ack_cm_event((*id).event);
            (*id).event = std::ptr::null_mut();
        }
        if rdma_get_cm_event((*id).channel, &mut (*id).event) != 0 {
            return -1;
        }
        let ev = &*(*id).event;
        if ev.status != 0 {
            return if ev.event == RDMA_CM_EVENT_REJECTED {
                fail(libc::ECONNREFUSED)
            } else {
                fail(ev.status.abs())
            };
        }
    }
    0
}

fn alloc_id(
    channel: *mut rdma_event_channel,
    context: *mut c_void,
    ps: c_uint,
) -> Result<*mut rdma_cm_id, c_int> {
    let (ch, sync) = if channel.is_null() {
        (new_channel()?, true)
    } else {
        (channel, false)
    };
    // SAFETY: all-zero is valid for the C parts (NULL pointers, zeros).
    let mut p: CmaIdPrivate = unsafe { std::mem::zeroed() };
    p.id.channel = ch;
    p.id.context = context;
    p.id.ps = ps;
    p.id.qp_type = IBV_QPT_RC;
    p.id.port_num = 1;
    p.sync = c_int::from(sync);
    let sh = Arc::new(IdShared {
        obj: AtomicPtr::new(std::ptr::null_mut()),
        st: Mutex::new(IdSt {
            alive: true,
            own_channel: sync,
            backlog: 128,
            ..IdSt::default()
        }),
        cv: Condvar::new(),
    });
    let raw = Box::into_raw(Box::new(IdObj { p, sh }));
    // SAFETY: just made.
    let sh: &Arc<IdShared> = unsafe { &(*raw).sh };
    sh.obj.store(raw, Ordering::Release);
    Ok(raw.cast())
}

/// Puts the id on `warpsock0` (`id->verbs`, `id->pd`).
unsafe fn attach_device(id: *mut rdma_cm_id) -> Result<(), c_int> {
    let (ctx, pd) = cm_device()?;
    // SAFETY: a live id of ours.
    unsafe {
        (*id).verbs = ctx;
        (*id).pd = pd;
    }
    Ok(())
}

/// `rdma_create_id`: TCP port space (RC) only; others fail with
/// EPROTONOSUPPORT (iWARP has no UD/IB port spaces).
#[no_mangle]
pub unsafe extern "C" fn rdma_create_id(
    channel: *mut rdma_event_channel,
    id: *mut *mut rdma_cm_id,
    context: *mut c_void,
    ps: c_uint,
) -> c_int {
    if id.is_null() {
        return fail(libc::EINVAL);
    }
    if ps != RDMA_PS_TCP {
        return fail(libc::EPROTONOSUPPORT);
    }
    match alloc_id(channel, context, ps) {
        Ok(p) => {
            // SAFETY: the program's out-pointer.
            unsafe { *id = p };
            0
        }
        Err(e) => fail(e),
    }
}

fn stop_listen(l: &mut Listen) {
    let one: u64 = 1;
    // SAFETY: 8 bytes to our eventfd.
    unsafe { libc::write(l.stop.as_raw_fd(), (&one as *const u64).cast(), 8) };
    if let Some(t) = l.thread.take() {
        let _ = t.join();
    }
}

/// `rdma_destroy_id`: waits until every event it delivered is
/// acknowledged (as librdmacm); undelivered ones are dropped.
#[no_mangle]
pub unsafe extern "C" fn rdma_destroy_id(id: *mut rdma_cm_id) -> c_int {
    if id.is_null() {
        return fail(libc::EINVAL);
    }
    // SAFETY: a live id of ours.
    let sh = Arc::clone(unsafe { shared(id) });
    // SAFETY: as above.
    unsafe {
        if !(*id).event.is_null() {
            rdma_ack_cm_event((*id).event);
            (*id).event = std::ptr::null_mut();
        }
    }
    let listen = lock(&sh.st).listen.take();
    if let Some(mut l) = listen {
        stop_listen(&mut l);
    }
    // SAFETY: the id's channel is live.
    let q = unsafe { channel_queue((*id).channel) };
    q.remove_if(|e| {
        // SAFETY: undelivered events are Boxes owned by the queue.
        let mine = unsafe { Arc::ptr_eq(&(*e.0).owner, &sh) };
        if mine {
            // SAFETY: as above; removed from the queue now.
            drop(unsafe { Box::from_raw(e.0) });
        }
        mine
    });
    let own = {
        let mut st = lock(&sh.st);
        while st.unacked > 0 {
            st = sh
                .cv
                .wait(st)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
        }
        st.alive = false;
        if let Some((_, waiting)) = st.request.take() {
            waiting.fetch_sub(1, Ordering::AcqRel);
        }
        if let Some(qp) = st.qp.take() {
            drop(qp);
        }
        st.own_channel
    };
    // SAFETY: our Box; the channel was ours if `own`.
    unsafe {
        let ch = (*id).channel;
        drop(Box::from_raw(id.cast::<IdObj>()));
        if own {
            rdma_destroy_event_channel(ch);
        }
    }
    0
}

/// Binds a socket for `addr` (SO_REUSEADDR, as siw's listeners;
/// IPV6_V6ONLY per `rdma_set_option`).
fn bind_socket(addr: SocketAddr, afonly: Option<bool>) -> Result<(OwnedFd, SocketAddr), c_int> {
    let fam = if addr.is_ipv4() {
        libc::AF_INET
    } else {
        libc::AF_INET6
    };
    let fd = crate::sock::socket(fam, libc::SOCK_STREAM)
        .map_err(|e| e.raw_os_error().unwrap_or(libc::EMFILE))?;
    // SAFETY: plain system calls on a socket we own; results checked.
    unsafe {
        let one: c_int = 1;
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_REUSEADDR,
            (&one as *const c_int).cast(),
            4,
        );
        if fam == libc::AF_INET6 {
            let v: c_int = c_int::from(afonly.unwrap_or(false));
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::IPPROTO_IPV6,
                libc::IPV6_V6ONLY,
                (&v as *const c_int).cast(),
                4,
            );
        }
        let mut ss: libc::sockaddr_storage = std::mem::zeroed();
        let len = to_c(addr, &mut ss);
        if libc::bind(
            fd.as_raw_fd(),
            (&ss as *const libc::sockaddr_storage).cast(),
            len,
        ) != 0
        {
            return Err(errno());
        }
    }
    let local = crate::sock::local_addr(&fd).map_err(|e| e.raw_os_error().unwrap_or(libc::EIO))?;
    Ok((fd, local))
}

/// `rdma_bind_addr`: a specific address puts the id on `warpsock0`
/// (`id->verbs`), a wildcard leaves `verbs` NULL, as librdmacm.
#[no_mangle]
pub unsafe extern "C" fn rdma_bind_addr(id: *mut rdma_cm_id, addr: *mut libc::sockaddr) -> c_int {
    if id.is_null() {
        return fail(libc::EINVAL);
    }
    // SAFETY: the program's sockaddr.
    let Some(a) = (unsafe { from_c(addr) }) else {
        return fail(libc::EAFNOSUPPORT);
    };
    // SAFETY: a live id of ours.
    let sh = unsafe { shared(id) };
    let mut st = lock(&sh.st);
    if st.bound.is_some() || st.listen.is_some() {
        return fail(libc::EINVAL);
    }
    let (fd, local) = match bind_socket(a, st.afonly) {
        Ok(x) => x,
        Err(e) => return fail(e),
    };
    st.bound = Some(fd);
    drop(st);
    // SAFETY: a live id of ours.
    unsafe {
        to_c(local, &mut (*id).route.addr.src);
        if !a.ip().is_unspecified() {
            if let Err(e) = attach_device(id) {
                return fail(e);
            }
        }
    }
    0
}

/// `rdma_resolve_addr`: IPv4/IPv6 destinations; ADDR_RESOLVED with the
/// source address routing picks, or ADDR_ERROR with the routing error.
#[no_mangle]
pub unsafe extern "C" fn rdma_resolve_addr(
    id: *mut rdma_cm_id,
    src: *mut libc::sockaddr,
    dst: *mut libc::sockaddr,
    timeout_ms: c_int,
) -> c_int {
    let _ = timeout_ms;
    if id.is_null() {
        return fail(libc::EINVAL);
    }
    // SAFETY: the program's sockaddr.
    let Some(d) = (unsafe { from_c(dst) }) else {
        return fail(libc::EAFNOSUPPORT);
    };
    // SAFETY: a live id of ours.
    let sh = Arc::clone(unsafe { shared(id) });
    // SAFETY: the program's sockaddr (optional).
    if let Some(s) = unsafe { from_c(src) } {
        if lock(&sh.st).bound.is_none() {
            // SAFETY: forwarded.
            if unsafe { rdma_bind_addr(id, src) } != 0 {
                return -1;
            }
        }
        let _ = s;
    }
    // SAFETY: a live id of ours.
    if let Err(e) = unsafe { attach_device(id) } {
        return fail(e);
    }
    match route_source(d) {
        Ok(ip) => {
            // SAFETY: a live id of ours.
            unsafe {
                let bound = from_c((&(*id).route.addr.src as *const libc::sockaddr_storage).cast());
                let port = bound.map_or(0, |b| b.port());
                let src_ip = bound
                    .map(|b| b.ip())
                    .filter(|i| !i.is_unspecified())
                    .unwrap_or(ip);
                to_c(SocketAddr::new(src_ip, port), &mut (*id).route.addr.src);
                to_c(d, &mut (*id).route.addr.dst);
            }
            lock(&sh.st).resolved_addr = true;
            push_self(&sh, RDMA_CM_EVENT_ADDR_RESOLVED, Ev::default());
        }
        Err(e) => push_self(
            &sh,
            RDMA_CM_EVENT_ADDR_ERROR,
            Ev {
                status: -e,
                ..Ev::default()
            },
        ),
    }
    // SAFETY: a live id of ours.
    unsafe { complete(id) }
}

/// `rdma_resolve_route`: iWARP needs no path records; ROUTE_RESOLVED.
#[no_mangle]
pub unsafe extern "C" fn rdma_resolve_route(id: *mut rdma_cm_id, timeout_ms: c_int) -> c_int {
    let _ = timeout_ms;
    if id.is_null() {
        return fail(libc::EINVAL);
    }
    // SAFETY: a live id of ours.
    let sh = Arc::clone(unsafe { shared(id) });
    {
        let mut st = lock(&sh.st);
        if !st.resolved_addr {
            return fail(libc::EINVAL);
        }
        st.resolved_route = true;
    }
    push_self(&sh, RDMA_CM_EVENT_ROUTE_RESOLVED, Ev::default());
    // SAFETY: a live id of ours.
    unsafe { complete(id) }
}

/// `rdma_listen`: binds a wildcard address first if the id is unbound.
#[no_mangle]
pub unsafe extern "C" fn rdma_listen(id: *mut rdma_cm_id, backlog: c_int) -> c_int {
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
    let backlog = if backlog <= 0 { 128 } else { backlog as usize };
    st.backlog = backlog;
    // SAFETY: listen on our bound socket.
    if unsafe { libc::listen(fd.as_raw_fd(), backlog.min(4096) as c_int) } != 0 {
        let e = errno();
        st.bound = Some(fd);
        return fail(e);
    }
    let listener = TcpListener::from(fd);
    if listener.set_nonblocking(true).is_err() {
        return fail(libc::EIO);
    }
    // SAFETY: a new eventfd, owned below.
    let stop = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    if stop < 0 {
        return fail(errno());
    }
    // SAFETY: a descriptor we just made.
    let stop = unsafe { OwnedFd::from_raw_fd(stop) };
    let stop_fd = stop.as_raw_fd();
    let weak = Arc::downgrade(&sh);
    let waiting = Arc::clone(&st.waiting);
    let t = std::thread::Builder::new()
        .name("warpsock-cm-listen".into())
        .spawn(move || accept_loop(listener, stop_fd, weak, waiting, backlog));
    match t {
        Ok(t) => {
            st.listen = Some(Listen {
                stop,
                thread: Some(t),
            });
            0
        }
        Err(_) => fail(libc::EAGAIN),
    }
}

fn accept_loop(
    l: TcpListener,
    stop: c_int,
    listener: Weak<IdShared>,
    waiting: Arc<AtomicUsize>,
    backlog: usize,
) {
    let handshakes = Arc::new(AtomicUsize::new(0));
    loop {
        let mut fds = [
            libc::pollfd {
                fd: l.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: stop,
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: two live pollfds.
        unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
        if fds[1].revents != 0 {
            return;
        }
        let sock = match l.accept() {
            Ok((s, _)) => s,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                // Out of descriptors or memory: do not spin.
                debug!("accept failed: {e}");
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
        };
        if handshakes.load(Ordering::Acquire) >= MAX_HANDSHAKES {
            debug!("too many MPA handshakes in progress; closing a new connection");
            continue;
        }
        handshakes.fetch_add(1, Ordering::AcqRel);
        let (h, lw, w) = (
            Arc::clone(&handshakes),
            listener.clone(),
            Arc::clone(&waiting),
        );
        let spawned = std::thread::Builder::new()
            .name("warpsock-cm-mpa".into())
            .spawn(move || {
                let r = handshake(sock);
                h.fetch_sub(1, Ordering::AcqRel);
                if let (Some(req), Some(l)) = (r, lw.upgrade()) {
                    offer(&l, req, &w, backlog);
                }
            });
        if spawned.is_err() {
            handshakes.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

fn handshake(sock: TcpStream) -> Option<ConnectRequest> {
    match ConnectRequest::read(sock, MPA_TIMEOUT) {
        Ok(r) => Some(r),
        Err(e) => {
            debug!("incoming connection failed before its MPA Request: {e}");
            None
        }
    }
}

/// A connection request for the listener: a new id and CONNECT_REQUEST.
fn offer(l: &Arc<IdShared>, req: ConnectRequest, waiting: &Arc<AtomicUsize>, backlog: usize) {
    let lst = lock(&l.st);
    if !lst.alive || lst.listen.is_none() {
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
    push(
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
}

/// `rdma_get_request` (synchronous listeners).
#[no_mangle]
pub unsafe extern "C" fn rdma_get_request(
    listen: *mut rdma_cm_id,
    id: *mut *mut rdma_cm_id,
) -> c_int {
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
                    .and_then(|sock| warpsock_engine::connect_stream(sock, &init))
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
    if id.is_null() {
        return fail(libc::EINVAL);
    }
    // SAFETY: a live id of ours.
    let sh = Arc::clone(unsafe { shared(id) });
    let (req, waiting, peer_ird, peer_ord) = {
        let mut st = lock(&sh.st);
        let Some((req, w)) = st.request.take() else {
            return fail(libc::EINVAL);
        };
        (req, w, st.peer_ird, st.peer_ord)
    };
    waiting.fetch_sub(1, Ordering::AcqRel);
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
    if id.is_null() {
        return fail(libc::EINVAL);
    }
    // SAFETY: a live id of ours.
    let sh = unsafe { shared(id) };
    let Some((req, waiting)) = lock(&sh.st).request.take() else {
        return fail(libc::EINVAL);
    };
    waiting.fetch_sub(1, Ordering::AcqRel);
    // SAFETY: the program's private data.
    let d = match unsafe { pdata(data, len) } {
        Ok(d) => d,
        Err(e) => return fail(e),
    };
    match req.reject(d) {
        Ok(()) => 0,
        Err(_) => fail(libc::ECONNRESET),
    }
}

/// `rdma_disconnect`: graceful close (iWARP: the QP goes to SQD, FIN);
/// DISCONNECTED follows once the connection has ended.
#[no_mangle]
pub unsafe extern "C" fn rdma_disconnect(id: *mut rdma_cm_id) -> c_int {
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

/// `rdma_create_qp`.
#[no_mangle]
pub unsafe extern "C" fn rdma_create_qp(
    id: *mut rdma_cm_id,
    pd: *mut ibv_pd,
    attr: *mut ibv_qp_init_attr,
) -> c_int {
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

/// `rdma_migrate_id`: moves the id (and its undelivered events) to
/// another channel; NULL makes it synchronous with a private channel.
#[no_mangle]
pub unsafe extern "C" fn rdma_migrate_id(
    id: *mut rdma_cm_id,
    channel: *mut rdma_event_channel,
) -> c_int {
    if id.is_null() {
        return fail(libc::EINVAL);
    }
    // SAFETY: a live id of ours.
    let sh = Arc::clone(unsafe { shared(id) });
    let (new, sync) = if channel.is_null() {
        match new_channel() {
            Ok(c) => (c, true),
            Err(e) => return fail(e),
        }
    } else {
        (channel, false)
    };
    // SAFETY: live channels and id.
    unsafe {
        // A synchronous id's last event is its own (librdmacm acks it).
        if (*id.cast::<CmaIdPrivate>()).sync != 0 && !(*id).event.is_null() {
            rdma_ack_cm_event((*id).event);
            (*id).event = std::ptr::null_mut();
        }
        let old = (*id).channel;
        let oq = channel_queue(old);
        let nq = channel_queue(new);
        let mut moved = Vec::new();
        oq.remove_if(|e| {
            let mine = Arc::ptr_eq(&(*e.0).owner, &sh);
            if mine {
                moved.push(EventPtr(e.0));
            }
            mine
        });
        {
            let mut st = lock(&sh.st);
            while st.unacked > 0 {
                st = sh
                    .cv
                    .wait(st)
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
            }
            (*id).channel = new;
            (*id.cast::<CmaIdPrivate>()).sync = c_int::from(sync);
            let was_own = std::mem::replace(&mut st.own_channel, sync);
            drop(st);
            for e in moved {
                nq.push(e);
            }
            if was_own {
                rdma_destroy_event_channel(old);
            }
        }
    }
    0
}

/// `rdma_set_option`: TOS, REUSEADDR, AFONLY, ACK_TIMEOUT (accepted;
/// retransmission is TCP's); IB path records: EINVAL (not iWARP).
#[no_mangle]
pub unsafe extern "C" fn rdma_set_option(
    id: *mut rdma_cm_id,
    level: c_int,
    name: c_int,
    val: *mut c_void,
    len: usize,
) -> c_int {
    if id.is_null() || val.is_null() {
        return fail(libc::EINVAL);
    }
    // SAFETY: a live id of ours.
    let sh = unsafe { shared(id) };
    let int = || -> Option<c_int> {
        // SAFETY: the program's value of `len` bytes.
        (len >= 4).then(|| unsafe { *val.cast::<c_int>() })
    };
    match (level, name) {
        (RDMA_OPTION_ID, RDMA_OPTION_ID_TOS | RDMA_OPTION_ID_ACK_TIMEOUT) if len >= 1 => 0,
        (RDMA_OPTION_ID, RDMA_OPTION_ID_REUSEADDR) => match int() {
            Some(v) => {
                lock(&sh.st).reuseaddr = v != 0;
                0
            }
            None => fail(libc::EINVAL),
        },
        (RDMA_OPTION_ID, RDMA_OPTION_ID_AFONLY) => match int() {
            Some(v) => {
                lock(&sh.st).afonly = Some(v != 0);
                0
            }
            None => fail(libc::EINVAL),
        },
        (RDMA_OPTION_IB, RDMA_OPTION_IB_PATH) => fail(libc::EINVAL),
        _ => fail(libc::ENOSYS),
    }
}

/// `rdma_get_src_port` (network order).
#[no_mangle]
pub unsafe extern "C" fn rdma_get_src_port(id: *mut rdma_cm_id) -> u16 {
    // SAFETY: a live id.
    unsafe { from_c((&(*id).route.addr.src as *const libc::sockaddr_storage).cast()) }
        .map_or(0, |a| a.port().to_be())
}

/// `rdma_get_dst_port` (network order).
#[no_mangle]
pub unsafe extern "C" fn rdma_get_dst_port(id: *mut rdma_cm_id) -> u16 {
    // SAFETY: a live id.
    unsafe { from_c((&(*id).route.addr.dst as *const libc::sockaddr_storage).cast()) }
        .map_or(0, |a| a.port().to_be())
}

/// `rdma_get_devices`: the contexts librdmacm uses (`warpsock0`'s).
#[no_mangle]
pub unsafe extern "C" fn rdma_get_devices(num: *mut c_int) -> *mut *mut ibv_context {
    let Ok((ctx, _)) = cm_device() else {
        return std::ptr::null_mut();
    };
    // SAFETY: calloc of two pointers.
    let list = unsafe { libc::calloc(2, size_of::<*mut ibv_context>()) }.cast::<*mut ibv_context>();
    if list.is_null() {
        return list;
    }
    // SAFETY: two slots; the program's out-pointer.
    unsafe {
        *list = ctx;
        if !num.is_null() {
            *num = 1;
        }
    }
    list
}

/// `rdma_free_devices`.
#[no_mangle]
pub unsafe extern "C" fn rdma_free_devices(list: *mut *mut ibv_context) {
    // SAFETY: a list from rdma_get_devices.
    unsafe { libc::free(list.cast()) };
}

/// `rdma_create_ep`: a synchronous id for `res`: passive (`RAI_PASSIVE`:
/// bound) or active (address and route resolved), with a QP if
/// `qp_init_attr` is given.
#[no_mangle]
pub unsafe extern "C" fn rdma_create_ep(
    id: *mut *mut rdma_cm_id,
    res: *mut rdma_addrinfo,
    pd: *mut ibv_pd,
    qp_init_attr: *mut ibv_qp_init_attr,
) -> c_int {
    if id.is_null() || res.is_null() {
        return fail(libc::EINVAL);
    }
    let cm = match alloc_id(std::ptr::null_mut(), std::ptr::null_mut(), RDMA_PS_TCP) {
        Ok(c) => c,
        Err(e) => return fail(e),
    };
    // SAFETY: the program's addrinfo; our new id.
    unsafe {
        let r = &*res;
        let ok = if r.ai_flags & RAI_PASSIVE != 0 {
            rdma_bind_addr(cm, r.ai_src_addr) == 0
        } else {
            rdma_resolve_addr(cm, r.ai_src_addr, r.ai_dst_addr, 2000) == 0
                && rdma_resolve_route(cm, 2000) == 0
        };
        if ok && !qp_init_attr.is_null() {
            if (*cm).verbs.is_null() {
                let _ = attach_device(cm);
            }
            if rdma_create_qp(cm, pd, qp_init_attr) != 0 {
                let e = errno();
                rdma_destroy_id(cm);
                return fail(e);
            }
        }
        if !ok {
            let e = errno();
            rdma_destroy_id(cm);
            return fail(e);
        }
        *id = cm;
    }
    0
}

/// `rdma_destroy_ep`.
#[no_mangle]
pub unsafe extern "C" fn rdma_destroy_ep(id: *mut rdma_cm_id) {
    if id.is_null() {
        return;
    }
    // SAFETY: a live id of ours.
    unsafe {
        rdma_destroy_qp(id);
        rdma_destroy_id(id);
    }
}

/// `rdma_notify`: an InfiniBand-only event (EINVAL here).
#[no_mangle]
pub unsafe extern "C" fn rdma_notify(id: *mut rdma_cm_id, event: c_uint) -> c_int {
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
    let _ = (id, attr, ctx);
    fail(libc::ENOSYS)
}

/// See [`rdma_join_multicast`].
#[no_mangle]
pub unsafe extern "C" fn rdma_leave_multicast(
    id: *mut rdma_cm_id,
    addr: *mut libc::sockaddr,
) -> c_int {
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
    let _ = (id, pd, attr);
    fail(libc::EOPNOTSUPP)
}

/// See [`rdma_create_srq`].
#[no_mangle]
pub unsafe extern "C" fn rdma_create_srq_ex(id: *mut rdma_cm_id, attr: *mut c_void) -> c_int {
    let _ = (id, attr);
    fail(libc::EOPNOTSUPP)
}

/// `rdma_destroy_srq`: nothing to destroy.
#[no_mangle]
pub unsafe extern "C" fn rdma_destroy_srq(id: *mut rdma_cm_id) {
    let _ = id;
}

/// Enhanced connection establishment (`rdma_set_local_ece`,
/// `rdma_get_remote_ece`, `rdma_reject_ece`) is an mlx5/RoCE feature
/// (EOPNOTSUPP).
#[no_mangle]
pub unsafe extern "C" fn rdma_set_local_ece(id: *mut rdma_cm_id, ece: *mut c_void) -> c_int {
    let _ = (id, ece);
    fail(libc::EOPNOTSUPP)
}

/// See [`rdma_set_local_ece`].
#[no_mangle]
pub unsafe extern "C" fn rdma_get_remote_ece(id: *mut rdma_cm_id, ece: *mut c_void) -> c_int {
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
    let _ = (id, node, service, hints);
    fail(libc::EOPNOTSUPP)
}

/// See [`rdma_resolve_addrinfo`].
#[no_mangle]
pub unsafe extern "C" fn rdma_query_addrinfo(
    id: *mut rdma_cm_id,
    info: *mut *mut rdma_addrinfo,
) -> c_int {
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
    let _ = (id, event, status, arg);
    fail(libc::EOPNOTSUPP)
}
