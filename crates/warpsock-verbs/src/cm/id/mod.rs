//! CM ids and the operations on them: the id objects and their events,
//! create/destroy, binding and resolution and options here; the passive
//! side, connections, CM-made queue pairs and the calls iWARP does not
//! support in the submodules (which see this module's private helpers).

mod cm_qp;
mod conn;
mod listen;
#[cfg(test)]
mod listen_tests;
mod unsupported;

pub use cm_qp::*;
pub use conn::*;
pub use listen::*;
pub use unsupported::*;

use std::ffi::{c_int, c_uint, c_void};
use std::net::{SocketAddr, TcpListener};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

use warpsock_engine::{CmError, ConnectRequest, Listener, Negotiated};

use super::addr::route_source;
use super::outcome::{connect_failed, ended_before_reply, Backoff};
use super::{
    channel_queue, destroy_undelivered, new_channel, rdma_ack_cm_event, rdma_destroy_event_channel,
    rdma_get_cm_event, EventObj, EventPtr, MAX_BACKLOG, MAX_HANDSHAKES, MAX_PRIVATE_DATA,
};
use crate::abi::*;
use crate::abi_cm::*;
use crate::config::debug;
use crate::cq::{ibv_create_comp_channel, ibv_create_cq, ibv_destroy_comp_channel, ibv_destroy_cq};
use crate::device::{self, MAX_RD_ATOM};
use crate::mem::ibv_alloc_pd;
use crate::qp::{self, ibv_create_qp, ibv_destroy_qp, ibv_modify_qp, QpShared};
use crate::sock::{from_c, to_c};
use crate::util::{errno, fail, lock, set_errno};

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
            let ctx = crate::open::ibv_open_device(device::ptr());
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
    /// Its thread's; shut down to stop it.
    listener: Arc<Listener>,
    /// Set before the shutdown: the thread's `accept` failing then is the
    /// stop, not an error.
    stop: Arc<AtomicBool>,
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
/// counted against `owner`, and returns whether it did: not once `owner`
/// is destroyed, nor once its channel is.
fn push(owner: &Arc<IdShared>, about: *mut rdma_cm_id, kind: c_uint, ev: Ev<'_>) -> bool {
    let st = lock(&owner.st);
    if !st.alive {
        return false;
    }
    let me = owner.id_ptr();
    // SAFETY: the owner is alive (checked under its lock): its id is
    // live, and its channel's allocation always is.
    let q = unsafe { channel_queue((*me).channel) };
    drop(st);
    // The program destroyed the channel under a live id: nobody can
    // receive the event (librdmacm's closed descriptor loses it too).
    let Some(q) = q else {
        return false;
    };
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
    if let Err(EventPtr(raw)) = q.push(EventPtr(raw)) {
        // The channel was destroyed since the look above.
        // SAFETY: the Box made above, which no queue took.
        drop(unsafe { Box::from_raw(raw) });
        return false;
    }
    true
}

/// An event about the id itself.
fn push_self(sh: &Arc<IdShared>, kind: c_uint, ev: Ev<'_>) {
    push(sh, sh.id_ptr(), kind, ev);
}

/// Every live id this library made, by address (as the queue pair
/// registry in [`crate::qp`]): an `rdma_*` call on anything else — a
/// destroyed, misaligned or foreign pointer — fails with EINVAL instead
/// of being dereferenced (librdmacm itself would crash or read garbage).
fn live_ids() -> &'static Mutex<std::collections::HashSet<usize>> {
    static IDS: OnceLock<Mutex<std::collections::HashSet<usize>>> = OnceLock::new();
    IDS.get_or_init(Default::default)
}

/// Whether `id` is a live id made here (only its address is looked at).
pub(crate) fn id_is_live(id: *const rdma_cm_id) -> bool {
    !id.is_null() && lock(live_ids()).contains(&(id as usize))
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
    lock(live_ids()).insert(raw as usize);
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

/// Stops a listener's thread: a listening socket shut down wakes its
/// wait in `accept` (whose `accept(2)` then fails); the pending
/// handshakes and queued connections close as the listener goes.
fn stop_listen(l: &mut Listen) {
    l.stop.store(true, Ordering::Release);
    // SAFETY: the listener's socket, open while `l.listener` is held.
    unsafe { libc::shutdown(l.listener.as_fd().as_raw_fd(), libc::SHUT_RDWR) };
    if let Some(t) = l.thread.take() {
        let _ = t.join();
    }
}

/// `rdma_destroy_id`: waits until every event it delivered is
/// acknowledged (as librdmacm); undelivered ones are dropped.
#[no_mangle]
pub unsafe extern "C" fn rdma_destroy_id(id: *mut rdma_cm_id) -> c_int {
    if !id_is_live(id) {
        return fail(libc::EINVAL);
    }
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
    // SAFETY: the id's channel is ours (its allocation is never freed);
    // a destroyed one holds no events.
    if let Some(q) = unsafe { channel_queue((*id).channel) } {
        let mut undelivered = Vec::new();
        q.remove_if(|e| {
            // SAFETY: undelivered events are Boxes owned by the queue.
            let mine = unsafe { Arc::ptr_eq(&(*e.0).owner, &sh) };
            if mine {
                undelivered.push(EventPtr(e.0));
            }
            mine
        });
        drop(q);
        // SAFETY: removed from the queue: ours; its lock is released.
        unsafe { destroy_undelivered(undelivered) };
    }
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
        lock(live_ids()).remove(&(id as usize));
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
    if !id_is_live(id) {
        return fail(libc::EINVAL);
    }
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
    if !id_is_live(id) {
        return fail(libc::EINVAL);
    }
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
    if !id_is_live(id) {
        return fail(libc::EINVAL);
    }
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

/// `rdma_migrate_id`: moves the id (and its undelivered events) to
/// another channel; NULL makes it synchronous with a private channel.
#[no_mangle]
pub unsafe extern "C" fn rdma_migrate_id(
    id: *mut rdma_cm_id,
    channel: *mut rdma_event_channel,
) -> c_int {
    if !id_is_live(id) {
        return fail(libc::EINVAL);
    }
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
    // SAFETY: channels of ours (their allocations are never freed).
    let Some(nq) = (unsafe { channel_queue(new) }) else {
        // The program's channel, destroyed already.
        return fail(libc::EBADF);
    };
    // SAFETY: live channels and id.
    unsafe {
        // A synchronous id's last event is its own (librdmacm acks it).
        if (*id.cast::<CmaIdPrivate>()).sync != 0 && !(*id).event.is_null() {
            rdma_ack_cm_event((*id).event);
            (*id).event = std::ptr::null_mut();
        }
        let old = (*id).channel;
        let mut moved = Vec::new();
        // A destroyed old channel holds no events.
        if let Some(oq) = channel_queue(old) {
            oq.remove_if(|e| {
                let mine = Arc::ptr_eq(&(*e.0).owner, &sh);
                if mine {
                    moved.push(EventPtr(e.0));
                }
                mine
            });
        }
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
            // The new channel destroyed meanwhile: its events go as a
            // destroyed channel's do.
            let lost: Vec<EventPtr> = moved.into_iter().filter_map(|e| nq.push(e).err()).collect();
            destroy_undelivered(lost);
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
    if !id_is_live(id) {
        return fail(libc::EINVAL);
    }
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
    if !id_is_live(id) {
        return 0;
    }
    // SAFETY: a live id.
    unsafe { from_c((&(*id).route.addr.src as *const libc::sockaddr_storage).cast()) }
        .map_or(0, |a| a.port().to_be())
}

/// `rdma_get_dst_port` (network order).
#[no_mangle]
pub unsafe extern "C" fn rdma_get_dst_port(id: *mut rdma_cm_id) -> u16 {
    if !id_is_live(id) {
        return 0;
    }
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
    if !id_is_live(id) {
        set_errno(libc::EINVAL);
        return;
    }
    if id.is_null() {
        return;
    }
    // SAFETY: a live id of ours.
    unsafe {
        rdma_destroy_qp(id);
        rdma_destroy_id(id);
    }
}
