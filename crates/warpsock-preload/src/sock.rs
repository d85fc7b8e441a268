//! Offloaded UDP sockets (`Sock`) and their TCP connections (`Conn`): the
//! connection management layer (routes, listeners, accepts, the hello and
//! preamble) and the data management layer (queueing while connecting,
//! bounded retry with back-off, fallback to kernel UDP).
//!
//! Lock order: `Sock::inner` may be held while taking a `Conn`'s interest
//! lock, never a `Conn`'s state lock; a `Conn`'s state lock is never held
//! while taking `Sock::inner`. Work that needs both is split: the connection
//! side returns what happened and the caller applies it to the socket.
//! A `Conn`'s receive lock (`rx`) is taken first of all, by whoever reads
//! the connection (the progress thread or a blocking receive call), and held
//! until what was read is queued on the socket, so that datagrams from one
//! connection are queued in the order they were sent.

use std::collections::{HashMap, VecDeque};
use std::mem::{size_of, zeroed};
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use libc::{c_int, iovec, msghdr, sockaddr, socklen_t};

use crate::config;
use crate::engine::{self, Engine, Reg};
use crate::fdtable;
use crate::frame::{self, Parsed, ParsedPreamble, HDR_LEN, HELLO_LEN, PREAMBLE_LEN};
use crate::real;
use crate::stats::{self, STATS};
use crate::sys::{self, errno, set_errno};

const EPOLLIN: u32 = libc::EPOLLIN as u32;
const EPOLLOUT: u32 = libc::EPOLLOUT as u32;
const EPOLLERR: u32 = libc::EPOLLERR as u32;
const EPOLLHUP: u32 = libc::EPOLLHUP as u32;
const EPOLLET: u32 = libc::EPOLLET as u32;
/// Receive buffer per connection.
const RXBUF: usize = 256 << 10;
/// Most bytes read from one connection per readiness event (fairness).
const READ_BUDGET: usize = 1 << 20;
/// Doorbell bytes outstanding at most (the descriptor is readable anyway;
/// below this every arrival writes one, so edge-triggered waiters wake).
const MAX_BELLS: usize = 4096;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// `a` as this socket family reports it, without IPv6 flow info, so that it
/// can key a route and compare equal to what recvfrom reports.
pub(crate) fn norm(a: SocketAddr, family: c_int) -> SocketAddr {
    match sys::for_family(a, family) {
        SocketAddr::V6(mut v6) => {
            v6.set_flowinfo(0);
            SocketAddr::V6(v6)
        }
        v4 => v4,
    }
}

/// Largest UDP payload to `dest` (what the kernel would accept).
fn max_payload(dest: &SocketAddr) -> usize {
    match config::canonical(dest.ip()) {
        IpAddr::V4(_) => 65_507,
        IpAddr::V6(_) => 65_527,
    }
}

/// Total length of an iovec array.
///
/// # Safety
/// `iov` must point to `n` valid iovecs (or `n == 0`).
unsafe fn iov_len(iov: *const iovec, n: usize) -> usize {
    if iov.is_null() {
        return 0;
    }
    // SAFETY: per the contract.
    unsafe { std::slice::from_raw_parts(iov, n) }
        .iter()
        .map(|v| v.iov_len)
        .sum()
}

/// Copies `data` into the iovecs; returns the bytes copied.
///
/// # Safety
/// `iov` must point to `n` iovecs describing writable memory.
unsafe fn copy_to_iov(iov: *const iovec, n: usize, data: &[u8]) -> usize {
    if iov.is_null() {
        return 0;
    }
    let mut done = 0;
    // SAFETY: per the contract.
    for v in unsafe { std::slice::from_raw_parts(iov, n) } {
        if done == data.len() {
            break;
        }
        let k = v.iov_len.min(data.len() - done);
        // SAFETY: the iovec is writable for iov_len >= k bytes.
        unsafe { std::ptr::copy_nonoverlapping(data[done..].as_ptr(), v.iov_base.cast(), k) };
        done += k;
    }
    done
}

/// Appends the bytes the iovecs describe to `out`.
///
/// # Safety
/// `iov` must point to `n` iovecs describing readable memory.
unsafe fn gather(iov: *const iovec, n: usize, out: &mut Vec<u8>) {
    if iov.is_null() {
        return;
    }
    // SAFETY: per the contract.
    for v in unsafe { std::slice::from_raw_parts(iov, n) } {
        if v.iov_len > 0 {
            // SAFETY: the iovec is readable for iov_len bytes.
            out.extend_from_slice(unsafe {
                std::slice::from_raw_parts(v.iov_base.cast::<u8>(), v.iov_len)
            });
        }
    }
}

/// Sets congestion control, pacing and no-delay on an offload connection.
fn tune(fd: c_int) {
    let cfg = config::get();
    sys::set_int(fd, libc::IPPROTO_TCP, libc::TCP_NODELAY, 1);
    if let Some(cc) = &cfg.congestion {
        // SAFETY: the option value is the name's bytes with the given length.
        let r = unsafe {
            real::setsockopt(
                fd,
                libc::IPPROTO_TCP,
                libc::TCP_CONGESTION,
                cc.as_ptr().cast(),
                cc.len() as socklen_t,
            )
        };
        stats::inc(if r == 0 {
            &STATS.cc_set
        } else {
            &STATS.cc_failed
        });
    }
    if let Some(rate) = cfg.pacing_rate {
        let r64 = rate;
        // SAFETY: a u64 option value of the given length (kernels >= 5.x); the
        // u32 form below for older kernels.
        let mut r = unsafe {
            real::setsockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_MAX_PACING_RATE,
                (&r64 as *const u64).cast(),
                8,
            )
        };
        if r != 0 {
            let r32 = rate.min(u64::from(u32::MAX - 1)) as u32;
            // SAFETY: as above with a u32.
            r = unsafe {
                real::setsockopt(
                    fd,
                    libc::SOL_SOCKET,
                    libc::SO_MAX_PACING_RATE,
                    (&r32 as *const u32).cast(),
                    4,
                )
            };
        }
        if r == 0 {
            stats::inc(&STATS.pacing_set);
        }
    }
}

/// Which socket owns the listener of each TCP port.
static LISTENERS: Mutex<Option<HashMap<u16, std::sync::Weak<Sock>>>> = Mutex::new(None);

/// The connections that carry one destination's datagrams: one, or the K
/// stripes of `WARPSOCK_STRIPES` (sender), or the connections a striped
/// sender opened to us (receiver, grouped by the preamble's group number;
/// replies are striped over them too).
struct Group {
    conns: Vec<Arc<Conn>>,
    /// The stripe group number (0: not striped).
    id: u32,
    /// Round-robin position.
    next: usize,
}

impl Group {
    fn one(c: Arc<Conn>) -> Self {
        Self {
            conns: vec![c],
            id: 0,
            next: 0,
        }
    }

    /// The connection for the next datagram: round-robin over the stripes,
    /// skipping those with datagrams still queued in user space (their TCP
    /// send buffer is full: slow, or recovering a lost segment) when another
    /// has none; else the least queued. Established stripes before those
    /// still being set up; stripes retrying after a failure last.
    fn pick(&mut self) -> Arc<Conn> {
        let k = self.conns.len();
        if k == 1 {
            return self.conns[0].clone();
        }
        let start = self.next % k;
        self.next = start + 1;
        let mut best: Option<(u8, usize, usize)> = None;
        for j in 0..k {
            let i = (start + j) % k;
            let c = &self.conns[i];
            let rank = match c.hint.load(Ordering::Relaxed) {
                HINT_UP => 0,
                HINT_SETUP => 1,
                _ => 2,
            };
            let q = c.queued.load(Ordering::Relaxed);
            if rank == 0 && q == 0 {
                return c.clone();
            }
            if best.is_none_or(|(r, bq, _)| (rank, q) < (r, bq)) {
                best = Some((rank, q, i));
            }
        }
        self.conns[best.map_or(start, |b| b.2)].clone()
    }

    /// Forgets `c`; returns whether the group is now empty.
    fn remove(&mut self, c: &Arc<Conn>) -> bool {
        self.conns.retain(|x| !Arc::ptr_eq(x, c));
        self.conns.is_empty()
    }
}

/// A random non-zero stripe group number.
fn group_id() -> u32 {
    let mut b = [0u8; 4];
    // SAFETY: getrandom writes at most 4 bytes into `b`.
    let r = unsafe { libc::getrandom(b.as_mut_ptr().cast(), 4, libc::GRND_NONBLOCK) };
    let mut v = u32::from_ne_bytes(b);
    if r != 4 {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        // SAFETY: getpid has no preconditions.
        v = t ^ (unsafe { libc::getpid() } as u32).rotate_left(16);
    }
    v.max(1)
}

/// A datagram received over TCP, waiting for the application.
struct Dgram {
    src: SocketAddr,
    data: Vec<u8>,
}

/// An offloaded UDP socket.
///
/// The application's descriptor number refers to one end of an AF_UNIX
/// stream socketpair; the other end (`bell_tx`) receives a "doorbell" byte
/// whenever datagrams are queued or the hidden kernel UDP socket (`udp`)
/// becomes readable, so poll/select/epoll on the application's descriptor
/// report exactly when a receive call has something to return. The
/// doorbells are drained when both sources are empty.
pub(crate) struct Sock {
    /// Epoll token of the hidden UDP socket.
    pub(crate) id: u64,
    /// AF_INET or AF_INET6.
    pub(crate) family: c_int,
    /// The kernel UDP socket, under a private descriptor.
    pub(crate) udp: c_int,
    /// Our own handle on the application's end of the pair.
    bell_rx: c_int,
    /// The end we write doorbells to.
    bell_tx: c_int,
    /// Application descriptors naming this socket.
    refs: AtomicUsize,
    /// O_NONBLOCK of the application's open file description.
    pub(crate) nonblocking: AtomicBool,
    /// Bytes queued in `inner.rxq` (read without the lock).
    rx_bytes: AtomicUsize,
    /// Blocking waits left that leave reading to the progress thread (set
    /// when a caller-driven read found a stream's batch).
    drive_skip: AtomicUsize,
    inner: Mutex<Inner>,
}

struct Inner {
    rxq: VecDeque<Dgram>,
    bells: usize,
    /// The hidden UDP socket may hold datagrams (set by its edge-triggered
    /// readiness, cleared when a receive finds it empty).
    udp_maybe: bool,
    routes: HashMap<SocketAddr, Group>,
    owned: HashMap<u64, Arc<Conn>>,
    fallback: HashMap<SocketAddr, Instant>,
    peer: Option<SocketAddr>,
    listener: Option<(c_int, u64)>,
    rcvtimeo: Option<Duration>,
    sndtimeo: Option<Duration>,
    broadcast: bool,
    paused: Vec<Arc<Conn>>,
    closed: bool,
}

impl Drop for Sock {
    fn drop(&mut self) {
        sys::close(self.udp);
        sys::close(self.bell_rx);
        sys::close(self.bell_tx);
        let l = lock(&self.inner).listener.take();
        if let Some((fd, _)) = l {
            sys::close(fd);
        }
    }
}

enum Route {
    Kernel(bool),
    Conn(Arc<Conn>),
}

impl Sock {
    /// Switches the kernel UDP socket `fd` to the offload layer: the socket
    /// moves to a private descriptor and `fd` becomes the application's end
    /// of a doorbell socketpair. Returns the new state (already in the
    /// descriptor table) or an errno, in which case `fd` is unchanged.
    pub(crate) fn transpose(fd: c_int) -> Result<Arc<Self>, c_int> {
        let eng = engine::get().ok_or(libc::ENOMEM)?;
        let family = sys::get_int(fd, libc::SOL_SOCKET, libc::SO_DOMAIN).ok_or_else(errno)?;
        // SAFETY: fcntl/socketpair/dup3 on descriptors we were handed or
        // create here; no pointers except the socketpair out-array.
        unsafe {
            let fl = real::fcntl(fd, libc::F_GETFL, 0);
            let fdfl = real::fcntl(fd, libc::F_GETFD, 0);
            if fl < 0 || fdfl < 0 {
                return Err(errno());
            }
            let udp = real::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0);
            if udp < 0 {
                return Err(errno());
            }
            // Replies and the preamble name the local port: make sure there is one.
            if sys::local_addr(udp).is_none_or(|a| a.port() == 0) {
                let any: SocketAddr = if family == libc::AF_INET6 {
                    (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
                } else {
                    (std::net::Ipv4Addr::UNSPECIFIED, 0).into()
                };
                let (ss, len) = sys::addr_to_raw(&any);
                real::bind(udp, (&ss as *const libc::sockaddr_storage).cast(), len);
            }
            let mut sv = [-1; 2];
            if libc::socketpair(
                libc::AF_UNIX,
                libc::SOCK_STREAM | libc::SOCK_CLOEXEC,
                0,
                sv.as_mut_ptr(),
            ) != 0
            {
                let e = errno();
                sys::close(udp);
                return Err(e);
            }
            let (a, b) = (sv[0], sv[1]);
            sys::set_nonblocking(b, true);
            let nonblocking = fl & libc::O_NONBLOCK != 0;
            sys::set_nonblocking(a, nonblocking);
            let s = Arc::new(Self {
                id: eng.new_id(),
                family,
                udp,
                bell_rx: a,
                bell_tx: b,
                refs: AtomicUsize::new(0),
                nonblocking: AtomicBool::new(nonblocking),
                rx_bytes: AtomicUsize::new(0),
                drive_skip: AtomicUsize::new(0),
                inner: Mutex::new(Inner {
                    rxq: VecDeque::new(),
                    bells: 0,
                    udp_maybe: true,
                    routes: HashMap::new(),
                    owned: HashMap::new(),
                    fallback: HashMap::new(),
                    peer: None,
                    listener: None,
                    rcvtimeo: sys::get_timeo(udp, libc::SO_RCVTIMEO),
                    sndtimeo: sys::get_timeo(udp, libc::SO_SNDTIMEO),
                    broadcast: sys::get_int(udp, libc::SOL_SOCKET, libc::SO_BROADCAST)
                        .is_some_and(|v| v != 0),
                    paused: Vec::new(),
                    closed: false,
                }),
            });
            if !eng.register(udp, s.id, EPOLLIN | EPOLLET, Reg::Udp(s.clone())) {
                return Err(errno());
            }
            // Publish before the swap: our paths only ever use `udp`.
            if let Some(old) = fdtable::insert(fd, s.clone()) {
                old.release();
            }
            let cloexec = if fdfl & libc::FD_CLOEXEC != 0 {
                libc::O_CLOEXEC
            } else {
                0
            };
            if real::dup3(a, fd, cloexec) < 0 {
                let e = errno();
                fdtable::remove(fd);
                s.release();
                return Err(e);
            }
            stats::inc(&STATS.sockets_offloaded);
            Ok(s)
        }
    }

    /// One more application descriptor names this socket.
    pub(crate) fn add_ref(&self) {
        self.refs.fetch_add(1, Ordering::AcqRel);
    }

    /// An application descriptor naming this socket was closed. On the last
    /// one, the listener closes and connections close once their queued
    /// datagrams have reached the kernel (or kernel UDP, on failure).
    pub(crate) fn release(self: &Arc<Self>) {
        if self.refs.fetch_sub(1, Ordering::AcqRel) != 1 {
            return;
        }
        let (listener, conns) = {
            let mut g = lock(&self.inner);
            g.closed = true;
            g.rxq.clear();
            self.rx_bytes.store(0, Ordering::Relaxed);
            (
                g.listener.take(),
                g.owned.values().cloned().collect::<Vec<_>>(),
            )
        };
        let Some(eng) = engine::current() else { return };
        eng.deregister(self.id, Some(self.udp));
        if let Some((l, id)) = listener {
            eng.deregister(id, Some(l));
            sys::close(l);
        }
        for c in conns {
            if let Some((dest, frames)) = c.close_or_linger() {
                self.conn_gone(eng, &c, dest, frames, false);
            }
        }
    }

    /// Opens the TCP listener that matches the bound UDP port (if the policy
    /// allows the port and the TCP port is free).
    pub(crate) fn listen(self: &Arc<Self>) {
        let cfg = config::get();
        let Some(eng) = engine::get() else { return };
        let Some(local) = sys::local_addr(self.udp) else {
            return;
        };
        if !cfg.policy.port_ok(local.port()) || lock(&self.inner).listener.is_some() {
            return;
        }
        let tcp = SocketAddr::new(local.ip(), cfg.tcp_port(local.port()));
        // SAFETY: creating and configuring a new socket we own.
        let l = unsafe {
            real::socket(
                self.family,
                libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                0,
            )
        };
        if l < 0 {
            stats::inc(&STATS.listen_failed);
            return;
        }
        sys::set_int(l, libc::SOL_SOCKET, libc::SO_REUSEADDR, 1);
        if self.family == libc::AF_INET6 {
            if let Some(v) = sys::get_int(self.udp, libc::IPPROTO_IPV6, libc::IPV6_V6ONLY) {
                sys::set_int(l, libc::IPPROTO_IPV6, libc::IPV6_V6ONLY, v);
            }
        }
        tune(l);
        let (ss, len) = sys::addr_to_raw(&tcp);
        // SAFETY: bind/listen on our own socket with a valid address.
        let ok = unsafe {
            real::bind(l, (&ss as *const libc::sockaddr_storage).cast(), len) == 0
                && libc::listen(l, 1024) == 0
        };
        if !ok {
            let e = errno();
            sys::close(l);
            let owner = lock(&LISTENERS)
                .get_or_insert_with(HashMap::new)
                .get(&tcp.port())
                .and_then(std::sync::Weak::upgrade);
            if e == libc::EADDRINUSE
                && owner.is_some_and(|o| !Arc::ptr_eq(&o, self) && o.hand_over_listener(eng, self))
            {
                lock(&LISTENERS)
                    .get_or_insert_with(HashMap::new)
                    .insert(tcp.port(), Arc::downgrade(self));
                stats::inc(&STATS.listeners);
            } else {
                stats::inc(&STATS.listen_failed);
            }
            return;
        }
        let id = eng.new_id();
        lock(&self.inner).listener = Some((l, id));
        if eng.register(l, id, EPOLLIN, Reg::Listener(self.clone())) {
            lock(&LISTENERS)
                .get_or_insert_with(HashMap::new)
                .insert(tcp.port(), Arc::downgrade(self));
            stats::inc(&STATS.listeners);
        } else {
            lock(&self.inner).listener = None;
            sys::close(l);
            stats::inc(&STATS.listen_failed);
        }
    }

    /// connect(2) on the application's descriptor.
    pub(crate) fn connect(self: &Arc<Self>, addr: *const sockaddr, len: socklen_t) -> c_int {
        // SAFETY: forwarding the application's arguments to the kernel socket.
        let r = unsafe { real::connect(self.udp, addr, len) };
        if r != 0 {
            return r;
        }
        // SAFETY: the kernel accepted `addr` of `len` bytes.
        let peer = unsafe { sys::addr_from_raw(addr, len) }.map(|a| norm(a, self.family));
        lock(&self.inner).peer = peer;
        0
    }

    /// A connected socket gives its listener to `to`, an unconnected socket
    /// bound to the same port later (the iperf/socat server pattern: the
    /// socket that heard the first datagram connects to its sender, and a
    /// new socket takes over the port for everyone else).
    fn hand_over_listener(&self, eng: &Engine, to: &Arc<Self>) -> bool {
        let taken = {
            let mut g = lock(&self.inner);
            if g.peer.is_none() {
                return false;
            }
            g.listener.take()
        };
        let Some((l, old)) = taken else { return false };
        let id = eng.new_id();
        eng.deregister(old, None);
        eng.register_token(id, Reg::Listener(to.clone()));
        eng.modify(l, id, EPOLLIN);
        lock(&to.inner).listener = Some((l, id));
        true
    }

    /// setsockopt(2) on the application's descriptor.
    pub(crate) fn setsockopt(
        &self,
        level: c_int,
        name: c_int,
        val: *const libc::c_void,
        len: socklen_t,
    ) -> c_int {
        // SAFETY: forwarding the application's arguments to the kernel socket.
        let r = unsafe { real::setsockopt(self.udp, level, name, val, len) };
        if r == 0 && level == libc::SOL_SOCKET {
            match name {
                libc::SO_RCVTIMEO => lock(&self.inner).rcvtimeo = sys::get_timeo(self.udp, name),
                libc::SO_SNDTIMEO => lock(&self.inner).sndtimeo = sys::get_timeo(self.udp, name),
                libc::SO_BROADCAST => {
                    lock(&self.inner).broadcast =
                        sys::get_int(self.udp, libc::SOL_SOCKET, name).is_some_and(|v| v != 0);
                }
                _ => {}
            }
        }
        r
    }

    /// FIONREAD: the size of the next datagram.
    pub(crate) fn next_size(&self) -> Option<usize> {
        lock(&self.inner).rxq.front().map(|d| d.data.len())
    }

    /// Writes a doorbell byte (caller holds `inner`).
    fn ring(&self, g: &mut Inner) {
        if g.bells >= MAX_BELLS {
            return;
        }
        // SAFETY: a one-byte write to our own nonblocking socket.
        let r = unsafe {
            real::send(
                self.bell_tx,
                b"!".as_ptr().cast(),
                1,
                libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
            )
        };
        if r == 1 {
            g.bells += 1;
            stats::inc(&STATS.doorbells);
        }
    }

    /// Drains the doorbells once nothing is left to receive (caller holds
    /// `inner`).
    ///
    /// `udp_maybe` is only a hint (it starts true, and nothing clears it
    /// while receive calls are served from `rxq`), so it is checked against
    /// the kernel socket here: a datagram that arrives after the check gives
    /// a new edge, and `on_udp_ready` rings again once we release `inner`.
    /// Trusting the stale hint left a doorbell behind with nothing to
    /// receive, and the descriptor read as ready.
    fn settle(&self, g: &mut Inner) {
        if g.bells == 0 || !g.rxq.is_empty() {
            return;
        }
        if g.udp_maybe {
            if self.udp_readable() {
                return;
            }
            g.udp_maybe = false;
        }
        let mut buf = [0u8; 512];
        loop {
            // SAFETY: reading into a local buffer from our own socket.
            let r = unsafe {
                real::recv(
                    self.bell_rx,
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    libc::MSG_DONTWAIT,
                )
            };
            if r <= 0 {
                break;
            }
        }
        g.bells = 0;
    }

    /// Whether a receive on the hidden UDP socket would return something
    /// now: a datagram or a pending error.
    fn udp_readable(&self) -> bool {
        let mut p = [libc::pollfd {
            fd: self.udp,
            events: libc::POLLIN,
            revents: 0,
        }];
        sys::poll(&mut p, 0) > 0 && p[0].revents & (libc::POLLIN | libc::POLLERR) != 0
    }

    /// Progress thread: datagrams arrived on the hidden UDP socket.
    ///
    /// A blocking receive also polls that socket and may already have taken
    /// the datagram (under `inner`, so the check here is exact): then there
    /// is nothing to ring for, and a doorbell would be a spurious wake-up.
    pub(crate) fn on_udp_ready(&self) {
        if let Some(d) = config::get().test_udp_ready_delay {
            std::thread::sleep(d);
        }
        let mut g = lock(&self.inner);
        if g.closed || !self.udp_readable() {
            return;
        }
        g.udp_maybe = true;
        self.ring(&mut g);
    }

    /// Progress thread: accept every pending connection on the listener.
    pub(crate) fn on_accept(self: &Arc<Self>, eng: &'static Engine) {
        let Some((lfd, _)) = lock(&self.inner).listener else {
            return;
        };
        loop {
            // SAFETY: sockaddr_storage is plain data.
            let mut ss: libc::sockaddr_storage = unsafe { zeroed() };
            let mut len = size_of::<libc::sockaddr_storage>() as socklen_t;
            // SAFETY: accept4 on our listener with valid out pointers.
            let c = unsafe {
                libc::accept4(
                    lfd,
                    (&mut ss as *mut libc::sockaddr_storage).cast(),
                    &mut len,
                    libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                )
            };
            if c < 0 {
                break;
            }
            stats::inc(&STATS.accepts);
            tune(c);
            let hello = frame::hello();
            // SAFETY: an 8-byte write to a fresh socket we own.
            let w = unsafe {
                real::send(
                    c,
                    hello.as_ptr().cast(),
                    HELLO_LEN,
                    libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
                )
            };
            // SAFETY: the kernel wrote `len` bytes of address.
            let peer =
                unsafe { sys::addr_from_raw((&ss as *const libc::sockaddr_storage).cast(), len) };
            if w != HELLO_LEN as isize || peer.is_none() {
                sys::close(c);
                continue;
            }
            let conn = Arc::new(Conn::new(eng.new_id(), c, Phase::AwaitPreamble, None, peer));
            {
                let mut g = lock(&self.inner);
                if g.closed {
                    sys::close(c);
                    return;
                }
                g.owned.insert(conn.id, conn.clone());
            }
            lock(&conn.ev).read = true;
            if !eng.register(c, conn.id, EPOLLIN, Reg::Conn(self.clone(), conn.clone())) {
                lock(&self.inner).owned.remove(&conn.id);
                sys::close(c);
            }
        }
    }

    /// An accepted connection named its sender: route replies over it. A
    /// stripe whose group already feeds us joins that group (replies are
    /// striped over the group); otherwise the first connection keeps the
    /// route.
    fn adopt_route(&self, remote: SocketAddr, conn: &Arc<Conn>, group: u32) {
        let mut g = lock(&self.inner);
        match g.routes.entry(remote) {
            std::collections::hash_map::Entry::Vacant(v) => {
                let mut grp = Group::one(conn.clone());
                grp.id = group;
                v.insert(grp);
            }
            std::collections::hash_map::Entry::Occupied(mut o) => {
                let grp = o.get_mut();
                if group != 0 && grp.id == group && !grp.conns.iter().any(|c| Arc::ptr_eq(c, conn))
                {
                    grp.conns.push(conn.clone());
                    stats::inc(&STATS.stripe_joins);
                }
            }
        }
    }

    /// Whether the receive queue is over its limit.
    fn rx_full(&self) -> bool {
        self.rx_bytes.load(Ordering::Relaxed) > config::get().rcvbuf
    }

    /// Progress thread: queue datagrams that arrived on `conn`.
    fn deliver(
        &self,
        eng: &Engine,
        src: SocketAddr,
        data: Vec<Vec<u8>>,
        conn: &Arc<Conn>,
        from_caller: bool,
    ) {
        let mut g = lock(&self.inner);
        if g.closed {
            return;
        }
        if let Some(p) = g.peer {
            if p.ip() != src.ip() || p.port() != src.port() {
                stats::add(&STATS.rx_filtered, data.len() as u64);
                return;
            }
        }
        let (mut n, mut bytes) = (0u64, 0usize);
        for d in data {
            bytes += d.len();
            n += 1;
            g.rxq.push_back(Dgram { src, data: d });
        }
        stats::add(&STATS.rx_tcp_dgrams, n);
        stats::stripe(conn.stripe.load(Ordering::Relaxed), false, n);
        stats::add(&STATS.rx_tcp_bytes, bytes as u64);
        let total = self.rx_bytes.fetch_add(bytes, Ordering::Relaxed) + bytes;
        if from_caller {
            // The receive call that read them takes the first at once and
            // rings for the rest (see `recvmsg`).
            stats::add(&STATS.rx_caller_dgrams, n);
        } else if n > 0 {
            self.ring(&mut g);
        }
        if total > config::get().rcvbuf && !g.paused.iter().any(|c| Arc::ptr_eq(c, conn)) {
            g.paused.push(conn.clone());
            conn.set_interest(eng, Some(false), None);
            stats::inc(&STATS.rx_paused);
        }
    }

    /// Progress thread: stop reading `conn` while the queue is full.
    fn pause(&self, eng: &Engine, conn: &Arc<Conn>) {
        let mut g = lock(&self.inner);
        if self.rx_full() && !g.paused.iter().any(|c| Arc::ptr_eq(c, conn)) {
            g.paused.push(conn.clone());
            conn.set_interest(eng, Some(false), None);
            stats::inc(&STATS.rx_paused);
        }
    }

    /// A connection is finished: forget it, and send the datagrams it still
    /// held by kernel UDP. With `fallback`, the destination stays on kernel
    /// UDP for a while.
    fn conn_gone(
        &self,
        eng: &Engine,
        conn: &Arc<Conn>,
        dest: Option<SocketAddr>,
        frames: Vec<Vec<u8>>,
        fallback: bool,
    ) {
        eng.deregister(conn.id, None);
        {
            let mut g = lock(&self.inner);
            g.owned.remove(&conn.id);
            g.paused.retain(|c| !Arc::ptr_eq(c, conn));
            if let Some(d) = dest {
                // Other stripes of the destination that work keep carrying
                // it: only a destination none of whose stripes is up falls
                // back (once, however many stripes gave up).
                let mut others_up = false;
                if let Some(grp) = g.routes.get_mut(&d) {
                    if grp.remove(conn) {
                        g.routes.remove(&d);
                    } else {
                        others_up = grp
                            .conns
                            .iter()
                            .any(|c| c.hint.load(Ordering::Relaxed) == HINT_UP);
                    }
                }
                if fallback && !others_up {
                    let now = Instant::now();
                    let until = now + config::get().fallback_for;
                    if g.fallback.insert(d, until).is_none_or(|t| t <= now) {
                        stats::inc(&STATS.fallbacks);
                    }
                }
            }
        }
        if let Some(d) = dest {
            self.send_frames_udp(&d, &frames);
        }
        conn.cv.notify_all();
    }

    /// Sends datagrams that were queued for a connection by kernel UDP.
    fn send_frames_udp(&self, dest: &SocketAddr, frames: &[Vec<u8>]) {
        let (ss, len) = sys::addr_to_raw(dest);
        for f in frames {
            if self.kernel_sendto(f, &ss, len) {
                stats::inc(&STATS.tx_requeued_udp);
            } else {
                stats::inc(&STATS.tx_lost);
            }
        }
    }

    /// Sends one datagram by kernel UDP from the progress thread, waiting a
    /// little for buffer space.
    fn kernel_sendto(&self, data: &[u8], ss: &libc::sockaddr_storage, len: socklen_t) -> bool {
        for _ in 0..50 {
            // SAFETY: sending a local buffer to a valid address on our socket.
            let r = unsafe {
                real::sendto(
                    self.udp,
                    data.as_ptr().cast(),
                    data.len(),
                    libc::MSG_DONTWAIT,
                    (ss as *const libc::sockaddr_storage).cast(),
                    len,
                )
            };
            if r >= 0 {
                return true;
            }
            if errno() != libc::EAGAIN {
                return false;
            }
            let mut p = [libc::pollfd {
                fd: self.udp,
                events: libc::POLLOUT,
                revents: 0,
            }];
            sys::poll(&mut p, 10);
        }
        false
    }

    /// sendmsg(2) on the application's descriptor (every send call lands here).
    ///
    /// # Safety
    /// `msg` must be a valid msghdr whose buffers are readable.
    pub(crate) unsafe fn sendmsg(self: &Arc<Self>, msg: &msghdr, flags: c_int) -> isize {
        let cfg = config::get();
        let Some(eng) = engine::get() else {
            // SAFETY: forwarding the caller's valid msghdr.
            return unsafe { self.kernel_send(msg, flags, None) };
        };
        // SAFETY: msg_name/msg_namelen come from the application's msghdr.
        let given = unsafe { sys::addr_from_raw(msg.msg_name.cast(), msg.msg_namelen) };
        let (peer, sndtimeo) = {
            let g = lock(&self.inner);
            (g.peer, g.sndtimeo)
        };
        let dest = match (msg.msg_name.is_null(), given) {
            (true, _) => peer,
            (false, Some(a)) => Some(a),
            (false, None) => None,
        };
        let Some(dest) = dest.map(|d| norm(d, self.family)) else {
            // SAFETY: as above; the kernel reports the error.
            return unsafe { self.kernel_send(msg, flags, sndtimeo) };
        };
        // SAFETY: msg_iov describes msg_iovlen iovecs.
        let len = unsafe { iov_len(msg.msg_iov, msg.msg_iovlen) };
        let nonblock = flags & libc::MSG_DONTWAIT != 0 || self.nonblocking.load(Ordering::Relaxed);
        loop {
            let route = {
                let mut g = lock(&self.inner);
                let now = Instant::now();
                if g.closed || !cfg.policy.dest_ok(&dest, g.broadcast) {
                    Route::Kernel(false)
                } else if g.fallback.get(&dest).is_some_and(|t| *t > now) {
                    Route::Kernel(true)
                } else {
                    g.fallback.remove(&dest);
                    match g.routes.get_mut(&dest) {
                        Some(grp) => Route::Conn(grp.pick()),
                        None => Route::Conn(self.open_group(&mut g, eng, dest)),
                    }
                }
            };
            match route {
                Route::Kernel(fb) => {
                    stats::inc(if fb {
                        &STATS.tx_kernel_fallback
                    } else {
                        &STATS.tx_kernel_policy
                    });
                    // SAFETY: forwarding the caller's valid msghdr.
                    return unsafe { self.kernel_send(msg, flags, sndtimeo) };
                }
                Route::Conn(c) => {
                    if len > max_payload(&dest) {
                        set_errno(libc::EMSGSIZE);
                        return -1;
                    }
                    // SAFETY: msg_iov describes readable iovecs.
                    match unsafe {
                        c.send(eng, msg.msg_iov, msg.msg_iovlen, len, nonblock, sndtimeo)
                    } {
                        Ok(()) => {
                            stats::inc(&STATS.tx_tcp_dgrams);
                            stats::add(&STATS.tx_tcp_bytes, len as u64);
                            stats::stripe(c.stripe.load(Ordering::Relaxed), true, 1);
                            return len as isize;
                        }
                        Err(SendErr::Retry) => {
                            // The connection died; forget it (if still routed) and retry.
                            let mut g = lock(&self.inner);
                            if g.routes.get_mut(&dest).is_some_and(|grp| grp.remove(&c)) {
                                g.routes.remove(&dest);
                            }
                        }
                        Err(SendErr::Died(frames)) => {
                            self.conn_gone(eng, &c, Some(dest), frames, false);
                        }
                        Err(SendErr::Errno(e)) => {
                            set_errno(e);
                            return -1;
                        }
                        Err(SendErr::Kernel) => {
                            stats::inc(&STATS.tx_kernel_fallback);
                            // SAFETY: forwarding the caller's valid msghdr.
                            return unsafe { self.kernel_send(msg, flags, sndtimeo) };
                        }
                    }
                }
            }
        }
    }

    /// Sends by the kernel UDP socket with the application's blocking mode.
    ///
    /// # Safety
    /// `msg` must be a valid msghdr.
    unsafe fn kernel_send(&self, msg: &msghdr, flags: c_int, sndtimeo: Option<Duration>) -> isize {
        let nonblock = flags & libc::MSG_DONTWAIT != 0 || self.nonblocking.load(Ordering::Relaxed);
        let deadline = sndtimeo.map(|t| Instant::now() + t);
        loop {
            // SAFETY: per the contract.
            let r = unsafe { real::sendmsg(self.udp, msg, flags | libc::MSG_DONTWAIT) };
            if r >= 0 || nonblock || errno() != libc::EAGAIN {
                return r;
            }
            let wait = match deadline {
                Some(d) => {
                    let left = d.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        set_errno(libc::EAGAIN);
                        return -1;
                    }
                    left.as_millis().clamp(1, i32::MAX as u128) as c_int
                }
                None => -1,
            };
            let mut p = [libc::pollfd {
                fd: self.udp,
                events: libc::POLLOUT,
                revents: 0,
            }];
            if sys::poll(&mut p, wait) < 0 && errno() == libc::EINTR {
                set_errno(libc::EINTR);
                return -1;
            }
        }
    }

    /// Creates the connections for `dest` (`WARPSOCK_STRIPES` of them) and
    /// starts connecting; returns the one for the first datagram (caller
    /// holds `inner`; nothing here takes it).
    fn open_group(
        self: &Arc<Self>,
        g: &mut Inner,
        eng: &'static Engine,
        dest: SocketAddr,
    ) -> Arc<Conn> {
        let k = config::get().stripes;
        let id = if k > 1 { group_id() } else { 0 };
        let mut grp = Group {
            conns: Vec::with_capacity(k),
            id,
            next: 0,
        };
        for i in 0..k {
            let stripe = (k > 1).then_some(frame::Stripe {
                group: id,
                index: i as u8,
                count: k as u8,
            });
            grp.conns.push(self.open_conn(g, eng, dest, stripe));
        }
        if k > 1 {
            stats::inc(&STATS.stripe_groups);
        }
        let first = grp.pick();
        g.routes.insert(dest, grp);
        first
    }

    /// Creates one connection for `dest` and starts connecting (caller
    /// holds `inner`; nothing here takes it).
    fn open_conn(
        self: &Arc<Self>,
        g: &mut Inner,
        eng: &'static Engine,
        dest: SocketAddr,
        stripe: Option<frame::Stripe>,
    ) -> Arc<Conn> {
        let port = sys::local_addr(self.udp).map_or(0, |a| a.port());
        let conn = Arc::new(Conn::new(
            eng.new_id(),
            -1,
            Phase::Backoff,
            Some(dest),
            None,
        ));
        if let Some(x) = stripe {
            conn.stripe.store(usize::from(x.index), Ordering::Relaxed);
        }
        eng.register_token(conn.id, Reg::Conn(self.clone(), conn.clone()));
        {
            let mut st = lock(&conn.st);
            st.stripe = stripe;
            st.out.extend_from_slice(&frame::preamble(port));
            st.boundary = PREAMBLE_LEN;
            st.deadline = Some(Instant::now());
            if let Err(e) = conn.start_attempt(&mut st, eng, self) {
                // Left in back-off: the progress thread retries or falls back.
                let _ = conn.note_failure(&mut st, e, &mut Vec::new());
            }
        }
        g.owned.insert(conn.id, conn.clone());
        eng.add_timer(self, &conn);
        conn
    }

    /// recvmsg(2) on the application's descriptor (every receive call lands
    /// here).
    ///
    /// # Safety
    /// `msg` must be a valid msghdr whose buffers are writable.
    pub(crate) unsafe fn recvmsg(self: &Arc<Self>, msg: &mut msghdr, flags: c_int) -> isize {
        let nonblock = flags & libc::MSG_DONTWAIT != 0 || self.nonblocking.load(Ordering::Relaxed);
        let peek = flags & libc::MSG_PEEK != 0;
        let deadline = lock(&self.inner).rcvtimeo.map(|t| Instant::now() + t);
        let (namelen, ctllen) = (msg.msg_namelen, msg.msg_controllen);
        let mut udp_hint = false;
        let mut driven: Option<Driven> = None;
        let mut spin_until: Option<Instant> = None;
        loop {
            {
                let mut g = lock(&self.inner);
                if let Some(d) = g.rxq.front() {
                    // SAFETY: msg_iov describes writable iovecs (contract).
                    let copied = unsafe { copy_to_iov(msg.msg_iov, msg.msg_iovlen, &d.data) };
                    let full = d.data.len();
                    if !msg.msg_name.is_null() {
                        // SAFETY: msg_name is writable for msg_namelen bytes.
                        unsafe {
                            sys::addr_write(&d.src, msg.msg_name.cast(), &mut msg.msg_namelen);
                        };
                    } else {
                        msg.msg_namelen = 0;
                    }
                    msg.msg_controllen = 0;
                    msg.msg_flags = if copied < full { libc::MSG_TRUNC } else { 0 };
                    if !peek {
                        g.rxq.pop_front();
                        let left = self.rx_bytes.fetch_sub(full, Ordering::Relaxed) - full;
                        if !g.paused.is_empty() && left <= config::get().rcvbuf / 2 {
                            if let Some(eng) = engine::current() {
                                for c in g.paused.drain(..) {
                                    c.set_interest(eng, Some(true), None);
                                }
                            }
                        }
                    }
                    // Datagrams a receive call read itself were queued
                    // without a doorbell: ring for what is left.
                    if !g.rxq.is_empty() && g.bells == 0 {
                        self.ring(&mut g);
                    }
                    self.settle(&mut g);
                    return if flags & libc::MSG_TRUNC != 0 {
                        full
                    } else {
                        copied
                    } as isize;
                }
                if g.udp_maybe || udp_hint {
                    msg.msg_namelen = namelen;
                    msg.msg_controllen = ctllen;
                    // SAFETY: the application's msghdr, passed to its kernel socket.
                    let r = unsafe { real::recvmsg(self.udp, msg, flags | libc::MSG_DONTWAIT) };
                    if r >= 0 {
                        stats::inc(&STATS.rx_kernel_dgrams);
                        if g.bells > 0 && !peek && !self.udp_readable() {
                            g.udp_maybe = false;
                            self.settle(&mut g);
                        }
                        return r;
                    }
                    let e = errno();
                    if e != libc::EAGAIN {
                        set_errno(e);
                        return -1;
                    }
                    g.udp_maybe = false;
                }
                self.settle(&mut g);
            }
            if nonblock {
                set_errno(libc::EAGAIN);
                return -1;
            }
            let now = Instant::now();
            let wait = match deadline {
                Some(d) => {
                    let left = d.saturating_duration_since(now);
                    if left.is_zero() {
                        set_errno(libc::EAGAIN);
                        return -1;
                    }
                    left.as_micros().div_ceil(1000).min(i32::MAX as u128) as c_int
                }
                None => -1,
            };
            // From here on the call reads the socket's connections itself.
            let d = driven.get_or_insert_with(|| Driven::claim(self));
            if spin_until.is_none() {
                let bp = config::get().busy_poll.unwrap_or(Duration::ZERO);
                spin_until = Some(deadline.map_or(now + bp, |dl| dl.min(now + bp)));
            }
            let spinning = spin_until.is_some_and(|t| now < t);
            let mut p = Vec::with_capacity(2 + d.conns.len());
            for fd in [self.bell_rx, self.udp]
                .into_iter()
                .chain(d.conns.iter().map(|c| c.1))
            {
                p.push(libc::pollfd {
                    fd,
                    events: libc::POLLIN,
                    revents: 0,
                });
            }
            let n = sys::poll(&mut p, if spinning { 0 } else { wait });
            if n < 0 {
                let e = errno();
                if e == libc::EINTR {
                    set_errno(e);
                    return -1;
                }
            }
            if n <= 0 {
                if spinning {
                    std::hint::spin_loop();
                }
                continue;
            }
            if spinning {
                stats::inc(&STATS.rx_busy_poll_hits);
            }
            udp_hint = p[1].revents & (libc::POLLIN | libc::POLLERR) != 0;
            let bits = libc::POLLIN | libc::POLLERR | libc::POLLHUP | libc::POLLNVAL;
            if let Some(eng) = d.eng {
                let mut stale = false;
                for (i, (c, fd)) in d.conns.iter().enumerate() {
                    let r = p[2 + i].revents & bits;
                    if r != 0 {
                        if r & libc::POLLNVAL == 0 && c.still(*fd) {
                            c.handle(eng, self, (r & !libc::POLLNVAL) as u16 as u32, true);
                        }
                        stale |= !c.still(*fd);
                    }
                }
                if stale {
                    d.prune();
                }
            }
        }
    }
}

/// The connections a blocking receive call reads itself while it waits
/// (caller-driven receive): claimed from the progress thread on the first
/// wait, given back when the call returns.
struct Driven {
    eng: Option<&'static Engine>,
    conns: Vec<(Arc<Conn>, c_int)>,
}

/// A socket fed by more connections than this is left to the progress
/// thread (one poll over many descriptors per receive would cost more).
const MAX_DRIVEN: usize = 16;
/// A caller-driven read that finds this many datagrams at once is serving a
/// stream: the next `STREAM_SKIP` blocking waits leave reading to the
/// progress thread, which then reads while the application consumes.
const STREAM_BATCH: usize = 16;
const STREAM_SKIP: usize = 256;

impl Driven {
    fn claim(sock: &Sock) -> Self {
        let mut d = Self {
            eng: None,
            conns: Vec::new(),
        };
        if !config::get().caller_recv {
            return d;
        }
        let skip = sock.drive_skip.load(Ordering::Relaxed);
        if skip > 0 {
            sock.drive_skip.store(skip - 1, Ordering::Relaxed);
            return d;
        }
        let Some(eng) = engine::current() else {
            return d;
        };
        d.eng = Some(eng);
        let g = lock(&sock.inner);
        if g.owned.len() > MAX_DRIVEN {
            return d;
        }
        for c in g.owned.values() {
            if let Some(fd) = c.claim(eng) {
                d.conns.push((c.clone(), fd));
            }
        }
        d
    }

    /// Gives back the connections whose descriptor changed or closed.
    fn prune(&mut self) {
        let Some(eng) = self.eng else { return };
        self.conns.retain(|(c, fd)| {
            if c.still(*fd) {
                return true;
            }
            c.unclaim(eng, *fd);
            false
        });
    }
}

impl Drop for Driven {
    fn drop(&mut self) {
        if let Some(eng) = self.eng {
            for (c, fd) in self.conns.drain(..) {
                c.unclaim(eng, fd);
            }
        }
    }
}

/// Where a connection stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Outgoing: waiting before the next attempt (or the first one).
    Backoff,
    /// Outgoing: non-blocking connect in progress.
    Connecting,
    /// Outgoing: connected, waiting for the peer's hello.
    AwaitHello,
    /// Accepted: hello sent, waiting for the peer's preamble.
    AwaitPreamble,
    /// Carrying datagrams both ways.
    Established,
    /// Closed; its descriptor is gone.
    Dead,
}

/// Why a send on a connection did not complete.
pub(crate) enum SendErr {
    /// The connection is gone: route again.
    Retry,
    /// The connection broke now; these datagrams still need sending.
    Died(Vec<Vec<u8>>),
    /// Fail the call with this errno.
    Errno(c_int),
    /// The connection is retrying after a failure: use kernel UDP meanwhile.
    Kernel,
}

struct Interest {
    fd: c_int,
    /// The progress thread reads the connection (false while set up for
    /// writing only, or paused for a full receive queue).
    read: bool,
    write: bool,
    /// Blocking receive calls reading the connection themselves: while
    /// non-zero the progress thread does not watch it for input.
    callers: usize,
}

impl Interest {
    fn mask(&self) -> u32 {
        let read = self.read && self.callers == 0;
        (if read { EPOLLIN } else { 0 }) | (if self.write { EPOLLOUT } else { 0 })
    }
}

/// Connection being set up (first attempt, or accepted awaiting the preamble).
const HINT_SETUP: u8 = 0;
/// Established.
const HINT_UP: u8 = 1;
/// Backing off after a failed attempt.
const HINT_RETRY: u8 = 2;
/// Closed.
const HINT_DEAD: u8 = 3;

/// One TCP connection carrying datagrams for one (socket, remote) pair.
pub(crate) struct Conn {
    /// Epoll token.
    pub(crate) id: u64,
    /// Stripe index (0 when not striped), for the per-stripe counters.
    stripe: AtomicUsize,
    /// Where the connection stands, readable without `st` (`HINT_*`).
    hint: AtomicU8,
    /// Bytes queued in user space (`out` not yet written), readable
    /// without `st`: picks the stripe for the next datagram.
    queued: AtomicUsize,
    st: Mutex<ConnSt>,
    /// Held from reading the connection to queueing what was read.
    rx: Mutex<()>,
    cv: Condvar,
    ev: Mutex<Interest>,
}

struct ConnSt {
    fd: c_int,
    phase: Phase,
    /// The remote UDP address (outgoing: the destination; accepted: the TCP
    /// peer's address with the port from the preamble).
    dest: Option<SocketAddr>,
    /// Accepted: the TCP peer address.
    tcp_peer: Option<SocketAddr>,
    /// Bytes to write: the preamble (outgoing), then frames.
    out: Vec<u8>,
    /// Bytes of `out` already written.
    off: usize,
    /// A frame boundary at or before `off` (or the end of the preamble).
    boundary: usize,
    rx: Vec<u8>,
    rs: usize,
    re: usize,
    attempts: u32,
    deadline: Option<Instant>,
    /// The socket was closed: close once everything is written.
    linger: bool,
    /// Outgoing striped connection: announced in the preamble when the
    /// acceptor's hello offers the extension.
    stripe: Option<frame::Stripe>,
}

enum Rd {
    Data(usize),
    Again,
    Eof,
    Err,
}

impl Conn {
    fn new(
        id: u64,
        fd: c_int,
        phase: Phase,
        dest: Option<SocketAddr>,
        tcp_peer: Option<SocketAddr>,
    ) -> Self {
        Self {
            id,
            stripe: AtomicUsize::new(0),
            hint: AtomicU8::new(HINT_SETUP),
            queued: AtomicUsize::new(0),
            st: Mutex::new(ConnSt {
                fd,
                phase,
                dest,
                tcp_peer,
                out: Vec::new(),
                off: 0,
                boundary: 0,
                rx: Vec::new(),
                rs: 0,
                re: 0,
                attempts: 0,
                deadline: None,
                linger: false,
                stripe: None,
            }),
            rx: Mutex::new(()),
            cv: Condvar::new(),
            ev: Mutex::new(Interest {
                fd,
                read: false,
                write: false,
                callers: 0,
            }),
        }
    }

    /// Changes epoll interest (leaf lock).
    fn set_interest(&self, eng: &Engine, read: Option<bool>, write: Option<bool>) {
        let mut i = lock(&self.ev);
        let old = i.mask();
        if let Some(r) = read {
            i.read = r;
        }
        if let Some(w) = write {
            i.write = w;
        }
        if i.mask() != old && i.fd >= 0 {
            eng.modify(i.fd, self.id, i.mask());
        }
    }

    /// A blocking receive takes over reading this connection: the progress
    /// thread stops watching it for input. Returns the descriptor to poll,
    /// or `None` if the progress thread does not read it now (setting up,
    /// paused) and the caller should leave it alone.
    fn claim(&self, eng: &Engine) -> Option<c_int> {
        let mut i = lock(&self.ev);
        if i.fd < 0 || !i.read {
            return None;
        }
        let old = i.mask();
        i.callers += 1;
        if i.mask() != old {
            eng.modify(i.fd, self.id, i.mask());
        }
        Some(i.fd)
    }

    /// Undoes `claim`. Returns whether the descriptor is still `fd`.
    fn unclaim(&self, eng: &Engine, fd: c_int) -> bool {
        let mut i = lock(&self.ev);
        let old = i.mask();
        i.callers = i.callers.saturating_sub(1);
        if i.mask() != old && i.fd >= 0 {
            eng.modify(i.fd, self.id, i.mask());
        }
        i.fd == fd
    }

    /// Whether the claimed descriptor is still this connection's.
    fn still(&self, fd: c_int) -> bool {
        lock(&self.ev).fd == fd
    }

    /// The next timer deadline, if the connection is being set up.
    pub(crate) fn deadline(&self) -> Option<Instant> {
        lock(&self.st).deadline
    }

    /// Whether datagrams handed to this connection are not yet in the kernel.
    pub(crate) fn has_pending(&self) -> bool {
        let st = lock(&self.st);
        matches!(
            st.phase,
            Phase::Backoff | Phase::Connecting | Phase::AwaitHello
        ) || st.off < st.out.len()
    }

    /// Starts a non-blocking connect (caller holds `st`).
    fn start_attempt(&self, st: &mut ConnSt, eng: &Engine, sock: &Sock) -> Result<(), c_int> {
        let cfg = config::get();
        let dest = st.dest.ok_or(libc::EINVAL)?;
        stats::inc(&STATS.connects);
        let tcp = SocketAddr::new(dest.ip(), cfg.tcp_port(dest.port()));
        // SAFETY: creating a socket we own.
        let fd = unsafe {
            real::socket(
                sock.family,
                libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                0,
            )
        };
        if fd < 0 {
            return Err(errno());
        }
        tune(fd);
        if let Some(local) = sys::local_addr(sock.udp) {
            if !local.ip().is_unspecified() {
                let (ss, len) = sys::addr_to_raw(&SocketAddr::new(local.ip(), 0));
                // SAFETY: binding our own socket to a valid address.
                unsafe { real::bind(fd, (&ss as *const libc::sockaddr_storage).cast(), len) };
            }
        }
        let (ss, len) = sys::addr_to_raw(&tcp);
        // SAFETY: connecting our own socket to a valid address.
        let r = unsafe { real::connect(fd, (&ss as *const libc::sockaddr_storage).cast(), len) };
        if r != 0 && errno() != libc::EINPROGRESS {
            let e = errno();
            sys::close(fd);
            return Err(e);
        }
        st.fd = fd;
        st.phase = Phase::Connecting;
        st.deadline = Some(Instant::now() + cfg.connect_timeout);
        {
            let mut i = lock(&self.ev);
            i.fd = fd;
            i.read = false;
            i.write = true;
        }
        if !eng.add_fd(fd, self.id, EPOLLOUT) {
            let e = errno();
            sys::close(fd);
            st.fd = -1;
            lock(&self.ev).fd = -1;
            return Err(e);
        }
        Ok(())
    }

    /// Records a failed attempt: back off, or give up once the retries are
    /// spent (returns true then). While backing off, the destination is
    /// served by kernel UDP: the datagrams queued so far are taken out
    /// (into `now`) to be sent that way at once, so that a receiver without
    /// the preload never gets a burst of stale datagrams.
    fn note_failure(&self, st: &mut ConnSt, _err: c_int, now: &mut Vec<Vec<u8>>) -> bool {
        let cfg = config::get();
        stats::inc(&STATS.connect_failed);
        if st.fd >= 0 {
            sys::close(st.fd);
            st.fd = -1;
            lock(&self.ev).fd = -1;
        }
        st.attempts += 1;
        if st.off == 0 && st.boundary == PREAMBLE_LEN && st.out.len() > PREAMBLE_LEN {
            let frames = frame::frames_from(&st.out, PREAMBLE_LEN, 0);
            now.extend(frames.into_iter().map(|(p, l)| st.out[p..p + l].to_vec()));
            st.out.truncate(PREAMBLE_LEN);
            self.note_queued(st);
            self.cv.notify_all();
        }
        if st.attempts <= cfg.retries {
            stats::inc(&STATS.connect_retries);
            self.hint.store(HINT_RETRY, Ordering::Relaxed);
            st.phase = Phase::Backoff;
            let shift = (st.attempts - 1).min(16);
            st.deadline = Some(Instant::now() + cfg.retry_base * (1u32 << shift));
            false
        } else {
            true
        }
    }

    /// Closes the connection; returns the whole datagrams not yet written.
    fn die(&self, st: &mut ConnSt) -> Vec<Vec<u8>> {
        let mut frames = Vec::new();
        let mut from = st.boundary.min(st.out.len());
        // The preamble is not a frame.
        if from < PREAMBLE_LEN && st.boundary == PREAMBLE_LEN {
            from = PREAMBLE_LEN;
        }
        for (pos, len) in frame::frames_from(&st.out, from, 0) {
            let start = pos - HDR_LEN;
            if start >= st.off {
                frames.push(st.out[pos..pos + len].to_vec());
            } else if pos + len > st.off {
                stats::inc(&STATS.tx_lost);
            }
        }
        if st.fd >= 0 {
            sys::close(st.fd);
            st.fd = -1;
        }
        lock(&self.ev).fd = -1;
        st.phase = Phase::Dead;
        self.hint.store(HINT_DEAD, Ordering::Relaxed);
        self.queued.store(0, Ordering::Relaxed);
        st.deadline = None;
        st.out = Vec::new();
        st.off = 0;
        st.rx = Vec::new();
        self.cv.notify_all();
        frames
    }

    /// The socket was closed: close now if idle, else once drained.
    fn close_or_linger(&self) -> Option<(Option<SocketAddr>, Vec<Vec<u8>>)> {
        let mut st = lock(&self.st);
        let idle =
            matches!(st.phase, Phase::Established | Phase::AwaitPreamble) && st.off == st.out.len();
        if idle || st.phase == Phase::Dead {
            let dest = st.dest;
            Some((dest, self.die(&mut st)))
        } else {
            st.linger = true;
            None
        }
    }

    /// Writes as much of `out` as the socket takes (caller holds `st`).
    /// Returns an errno if the connection broke.
    fn flush(&self, st: &mut ConnSt, eng: &Engine) -> Result<(), c_int> {
        while st.off < st.out.len() {
            // SAFETY: writing initialized bytes of our buffer to our socket.
            let n = unsafe {
                real::send(
                    st.fd,
                    st.out[st.off..].as_ptr().cast(),
                    st.out.len() - st.off,
                    libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
                )
            };
            if n > 0 {
                st.off += n as usize;
                stats::inc(&STATS.tx_flush_writes);
                continue;
            }
            let e = errno();
            if n < 0 && e == libc::EINTR {
                continue;
            }
            if n < 0 && e == libc::EAGAIN {
                break;
            }
            return Err(if n == 0 { libc::EPIPE } else { e });
        }
        if st.off == st.out.len() {
            st.out.clear();
            st.off = 0;
            st.boundary = 0;
            self.set_interest(eng, None, Some(false));
            self.cv.notify_all();
        } else {
            if st.off >= (1 << 20) && st.boundary <= st.off {
                // Drop what is written, up to the last frame boundary.
                let mut b = st.boundary;
                while let Parsed::Frame(len) = frame::parse(&st.out[b..]) {
                    if b + HDR_LEN + len > st.off {
                        break;
                    }
                    b += HDR_LEN + len;
                }
                st.out.drain(..b);
                st.off -= b;
                st.boundary = 0;
                self.cv.notify_all();
            }
            self.set_interest(eng, None, Some(true));
        }
        self.note_queued(st);
        Ok(())
    }

    /// Publishes how much is queued in user space (caller holds `st`).
    fn note_queued(&self, st: &ConnSt) {
        self.queued
            .store(st.out.len().saturating_sub(st.off), Ordering::Relaxed);
    }

    /// Reads what the socket has into `rx` (caller holds `st`).
    fn read_some(st: &mut ConnSt) -> Rd {
        if st.rx.is_empty() {
            st.rx = vec![0; RXBUF];
        }
        if st.rs == st.re {
            st.rs = 0;
            st.re = 0;
        }
        if st.rx.len() - st.re < frame::MAX_DGRAM + HDR_LEN {
            st.rx.copy_within(st.rs..st.re, 0);
            st.re -= st.rs;
            st.rs = 0;
        }
        let re = st.re;
        // SAFETY: reading into the unused tail of our buffer.
        let n = unsafe {
            real::recv(
                st.fd,
                st.rx[re..].as_mut_ptr().cast(),
                st.rx.len() - re,
                libc::MSG_DONTWAIT,
            )
        };
        if n > 0 {
            st.re += n as usize;
            Rd::Data(n as usize)
        } else if n == 0 {
            Rd::Eof
        } else if matches!(errno(), libc::EAGAIN | libc::EINTR) {
            Rd::Again
        } else {
            Rd::Err
        }
    }

    /// Splits whole frames off `rx`. Returns false on a framing error.
    fn parse(st: &mut ConnSt, out: &mut Vec<Vec<u8>>) -> bool {
        loop {
            match frame::parse(&st.rx[st.rs..st.re]) {
                Parsed::Frame(len) => {
                    let p = st.rs + HDR_LEN;
                    out.push(st.rx[p..p + len].to_vec());
                    st.rs = p + len;
                }
                Parsed::Partial => return true,
                Parsed::Invalid => return false,
            }
        }
    }

    /// Application thread: hand one datagram to this connection.
    ///
    /// # Safety
    /// `iov` must point to `n` iovecs describing readable memory.
    unsafe fn send(
        &self,
        eng: &Engine,
        iov: *const iovec,
        n: usize,
        len: usize,
        nonblock: bool,
        sndtimeo: Option<Duration>,
    ) -> Result<(), SendErr> {
        let cfg = config::get();
        let hdr = frame::header(len);
        let deadline = sndtimeo.map(|t| Instant::now() + t);
        let mut st = lock(&self.st);
        let mut waited = false;
        loop {
            match st.phase {
                Phase::Dead => return Err(SendErr::Retry),
                Phase::Backoff | Phase::Connecting | Phase::AwaitHello if st.attempts > 0 => {
                    return Err(SendErr::Kernel);
                }
                Phase::Established if st.off == st.out.len() => {
                    // Idle: write now, header and payload in one call.
                    let mut v: Vec<iovec> = Vec::with_capacity(n + 1);
                    v.push(iovec {
                        iov_base: hdr.as_ptr() as *mut _,
                        iov_len: HDR_LEN,
                    });
                    if !iov.is_null() {
                        // SAFETY: per the contract.
                        v.extend_from_slice(unsafe { std::slice::from_raw_parts(iov, n) });
                    }
                    // SAFETY: msghdr is plain data; zero is a valid empty value.
                    let mut m: msghdr = unsafe { zeroed() };
                    m.msg_iov = v.as_mut_ptr();
                    m.msg_iovlen = v.len();
                    // SAFETY: the iovecs describe readable memory (contract, and `hdr`).
                    let w = unsafe {
                        real::sendmsg(st.fd, &m, libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL)
                    };
                    let total = HDR_LEN + len;
                    if w == total as isize {
                        stats::inc(&STATS.tx_direct);
                        return Ok(());
                    }
                    if w < 0 && !matches!(errno(), libc::EAGAIN | libc::EINTR) {
                        return Err(SendErr::Died(self.die(&mut st)));
                    }
                    st.out.clear();
                    st.out.extend_from_slice(&hdr);
                    // SAFETY: per the contract.
                    unsafe { gather(iov, n, &mut st.out) };
                    st.off = w.max(0) as usize;
                    st.boundary = 0;
                    self.note_queued(&st);
                    stats::inc(&STATS.tx_coalesced);
                    self.set_interest(eng, None, Some(true));
                    return Ok(());
                }
                _ => {
                    let pending = st.out.len() - st.off;
                    if pending > 0 && pending + HDR_LEN + len > cfg.sndbuf {
                        if nonblock {
                            return Err(SendErr::Errno(libc::EAGAIN));
                        }
                        if !waited {
                            stats::inc(&STATS.tx_waits);
                            waited = true;
                        }
                        let wait = match deadline {
                            Some(d) => {
                                let left = d.saturating_duration_since(Instant::now());
                                if left.is_zero() {
                                    return Err(SendErr::Errno(libc::EAGAIN));
                                }
                                left.min(Duration::from_millis(100))
                            }
                            None => Duration::from_millis(100),
                        };
                        st = self
                            .cv
                            .wait_timeout(st, wait)
                            .unwrap_or_else(|e| e.into_inner())
                            .0;
                        continue;
                    }
                    st.out.extend_from_slice(&hdr);
                    // SAFETY: per the contract.
                    unsafe { gather(iov, n, &mut st.out) };
                    self.note_queued(&st);
                    stats::inc(&STATS.tx_coalesced);
                    if st.phase == Phase::Established {
                        self.set_interest(eng, None, Some(true));
                    }
                    return Ok(());
                }
            }
        }
    }

    /// Progress thread: a timer may have expired. Returns true once the
    /// connection no longer needs timers.
    pub(crate) fn on_timer(
        self: &Arc<Self>,
        eng: &'static Engine,
        sock: &Arc<Sock>,
        now: Instant,
    ) -> bool {
        let _busy = engine::Handling::enter();
        self.timer(eng, sock, now)
    }

    fn timer(self: &Arc<Self>, eng: &'static Engine, sock: &Arc<Sock>, now: Instant) -> bool {
        let mut st = lock(&self.st);
        if matches!(
            st.phase,
            Phase::Established | Phase::Dead | Phase::AwaitPreamble
        ) {
            return true;
        }
        let Some(d) = st.deadline else { return false };
        if d > now {
            return false;
        }
        // The answer may already be waiting: the thread can reach its timers
        // late (descheduled, or busy with other events) after the socket
        // became ready. Then handle the event, not the timeout.
        let want = match st.phase {
            Phase::Connecting => libc::POLLOUT,
            Phase::AwaitHello => libc::POLLIN,
            _ => 0,
        };
        if want != 0 && st.fd >= 0 {
            let mut p = [libc::pollfd {
                fd: st.fd,
                events: want,
                revents: 0,
            }];
            if sys::poll(&mut p, 0) > 0 && p[0].revents != 0 {
                drop(st);
                stats::inc(&STATS.timer_rescues);
                // poll and epoll share their bit values on Linux.
                self.on_event(eng, sock, p[0].revents as u16 as u32);
                return false;
            }
        }
        let mut now_udp = Vec::new();
        let give_up = match st.phase {
            Phase::Backoff if st.attempts > config::get().retries => true,
            Phase::Backoff => match self.start_attempt(&mut st, eng, sock) {
                Ok(()) => false,
                Err(e) => self.note_failure(&mut st, e, &mut now_udp),
            },
            Phase::Connecting => self.note_failure(&mut st, libc::ETIMEDOUT, &mut now_udp),
            Phase::AwaitHello => {
                // Something accepted but does not speak warpsock: not a peer.
                stats::inc(&STATS.hello_failed);
                true
            }
            _ => false,
        };
        let dest = st.dest;
        if give_up {
            let mut frames = self.die(&mut st);
            drop(st);
            now_udp.append(&mut frames);
            sock.conn_gone(eng, self, dest, now_udp, true);
            return true;
        }
        drop(st);
        if let (Some(d), false) = (dest, now_udp.is_empty()) {
            sock.send_frames_udp(&d, &now_udp);
        }
        false
    }

    /// Progress thread: readiness on the connection's socket.
    pub(crate) fn on_event(self: &Arc<Self>, eng: &'static Engine, sock: &Arc<Sock>, bits: u32) {
        self.handle(eng, sock, bits, false);
    }

    /// Readiness on the connection's socket, handled by the progress thread
    /// or (`from_caller`) by a blocking receive call that reads the
    /// connection itself: that call takes what arrived at once, so no
    /// doorbell is rung for it.
    fn handle(
        self: &Arc<Self>,
        eng: &'static Engine,
        sock: &Arc<Sock>,
        bits: u32,
        from_caller: bool,
    ) {
        // A connection that dies here hands its queued datagrams to kernel
        // UDP after it stops counting as pending: exit waits for that too.
        let _busy = engine::Handling::enter();
        let _order = lock(&self.rx);
        let mut dgrams: Vec<Vec<u8>> = Vec::new();
        let mut gone: Option<(Vec<Vec<u8>>, bool)> = None;
        let mut adopt = None;
        let mut pause = false;
        let mut src = None;
        let mut now_udp = Vec::new();
        {
            let mut st = lock(&self.st);
            match st.phase {
                Phase::Connecting if bits & (EPOLLOUT | EPOLLERR | EPOLLHUP) != 0 => {
                    let err =
                        sys::get_int(st.fd, libc::SOL_SOCKET, libc::SO_ERROR).unwrap_or(libc::EIO);
                    if err == 0 {
                        st.phase = Phase::AwaitHello;
                        st.deadline = Some(Instant::now() + config::get().hello_timeout);
                        self.set_interest(eng, Some(true), Some(false));
                    } else if self.note_failure(&mut st, err, &mut now_udp) {
                        gone = Some((self.die(&mut st), true));
                    }
                }
                Phase::AwaitHello if bits & (EPOLLIN | EPOLLERR | EPOLLHUP) != 0 => {
                    let r = Self::read_some(&mut st);
                    if st.re - st.rs >= HELLO_LEN {
                        if frame::check_hello(&st.rx[st.rs..st.rs + HELLO_LEN]) {
                            let caps = frame::hello_caps(&st.rx[st.rs..st.rs + HELLO_LEN]);
                            st.rs += HELLO_LEN;
                            // A striped connection names its group, if the
                            // acceptor understands it (an older one gets
                            // the plain preamble: its stripes are then
                            // independent connections from one source).
                            // Nothing is written before the hello, so the
                            // preamble is still at the front of `out`.
                            if let Some(x) = st.stripe {
                                if caps & frame::CAP_STRIPES != 0
                                    && st.off == 0
                                    && st.boundary == PREAMBLE_LEN
                                    && st.out.len() >= PREAMBLE_LEN
                                {
                                    st.boundary = frame::extend_preamble(&mut st.out, x);
                                    stats::inc(&STATS.stripe_ext_sent);
                                }
                            }
                            st.phase = Phase::Established;
                            self.hint.store(HINT_UP, Ordering::Relaxed);
                            st.deadline = None;
                            stats::inc(&STATS.connect_ok);
                            if self.flush(&mut st, eng).is_err() {
                                gone = Some((self.die(&mut st), false));
                            } else {
                                self.set_interest(eng, Some(true), None);
                                src = st.dest;
                                if !Self::parse(&mut st, &mut dgrams) {
                                    stats::inc(&STATS.protocol_errors);
                                    gone = Some((self.die(&mut st), false));
                                }
                            }
                        } else {
                            stats::inc(&STATS.hello_failed);
                            gone = Some((self.die(&mut st), true));
                        }
                    } else if matches!(r, Rd::Eof | Rd::Err)
                        && self.note_failure(&mut st, libc::ECONNRESET, &mut now_udp)
                    {
                        gone = Some((self.die(&mut st), true));
                    }
                }
                Phase::AwaitPreamble | Phase::Established => {
                    if bits & EPOLLOUT != 0
                        && st.phase == Phase::Established
                        && self.flush(&mut st, eng).is_err()
                    {
                        stats::inc(&STATS.conns_closed);
                        gone = Some((self.die(&mut st), false));
                    }
                    if gone.is_none() && bits & (EPOLLIN | EPOLLERR | EPOLLHUP) != 0 {
                        if sock.rx_full() && bits & (EPOLLERR | EPOLLHUP) == 0 {
                            pause = true;
                        } else {
                            let mut budget = 0;
                            loop {
                                let r = Self::read_some(&mut st);
                                if let Rd::Data(n) = r {
                                    budget += n;
                                }
                                if st.phase == Phase::AwaitPreamble && st.re - st.rs >= PREAMBLE_LEN
                                {
                                    let pre = frame::parse_preamble(&st.rx[st.rs..st.re]);
                                    match (pre, st.tcp_peer) {
                                        (ParsedPreamble::Done(p, used), Some(peer)) => {
                                            st.rs += used;
                                            let remote = norm(
                                                SocketAddr::new(peer.ip(), p.port),
                                                sock.family,
                                            );
                                            st.dest = Some(remote);
                                            st.phase = Phase::Established;
                                            self.hint.store(HINT_UP, Ordering::Relaxed);
                                            let group = p.stripe.map_or(0, |x| {
                                                self.stripe
                                                    .store(usize::from(x.index), Ordering::Relaxed);
                                                x.group
                                            });
                                            adopt = Some((remote, group));
                                        }
                                        (ParsedPreamble::Partial, Some(_)) => {}
                                        _ => {
                                            stats::inc(&STATS.protocol_errors);
                                            gone = Some((self.die(&mut st), false));
                                            break;
                                        }
                                    }
                                }
                                if st.phase == Phase::Established {
                                    src = st.dest;
                                    if !Self::parse(&mut st, &mut dgrams) {
                                        stats::inc(&STATS.protocol_errors);
                                        gone = Some((self.die(&mut st), false));
                                        break;
                                    }
                                }
                                match r {
                                    Rd::Data(_) if budget < READ_BUDGET => continue,
                                    Rd::Data(_) | Rd::Again => break,
                                    Rd::Eof | Rd::Err => {
                                        stats::inc(&STATS.conns_closed);
                                        gone = Some((self.die(&mut st), false));
                                        break;
                                    }
                                }
                            }
                        }
                    }
                }
                _ => {}
            }
            if gone.is_none()
                && st.linger
                && st.phase == Phase::Established
                && st.off == st.out.len()
            {
                gone = Some((self.die(&mut st), false));
            }
            if gone.is_some() || !now_udp.is_empty() {
                src = src.or(st.dest);
            }
        }
        if let (Some(d), false) = (src, now_udp.is_empty()) {
            sock.send_frames_udp(&d, &now_udp);
        }
        if let Some((r, group)) = adopt {
            sock.adopt_route(r, self, group);
        }
        if from_caller && dgrams.len() >= STREAM_BATCH {
            // A stream, not a ping-pong: the progress thread reading in
            // parallel with the application moves more.
            sock.drive_skip.store(STREAM_SKIP, Ordering::Relaxed);
        }
        if let (false, Some(s)) = (dgrams.is_empty(), src) {
            sock.deliver(eng, s, dgrams, self, from_caller);
        }
        if pause {
            sock.pause(eng, self);
        }
        if let Some((frames, fb)) = gone {
            sock.conn_gone(eng, self, src, frames, fb);
        }
    }
}
