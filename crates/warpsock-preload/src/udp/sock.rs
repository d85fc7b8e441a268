//! An offloaded UDP socket (`Sock`): its hidden kernel UDP socket, its
//! doorbell, its receive queue and its routes; created from a program's
//! kernel UDP socket by [`Sock::transpose`]. The listener and the send and
//! receive paths are in `super::listen`, `super::send` and `super::recv`.
//!
//! Lock order: `Sock::inner` may be held while taking a `Conn`'s interest
//! lock, never a `Conn`'s state lock; a `Conn`'s state lock is never held
//! while taking `Sock::inner` (see `super::conn`).

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use libc::{c_int, sockaddr, socklen_t};
use smallvec::{smallvec, SmallVec};
use warpsock_engine::fds;

use super::config;
use super::conn::{Conn, Room, DGRAM_OVERHEAD, EPOLLIN};
use super::core::frame::{self, NONCE_LEN};
use super::core::gso::Mode;
use super::core::routes::Routes;
use super::core::stall::StallBudget;
use super::gso::{enable_gro, Gro, Gso, GsoTimer};
use super::stats::{self, STATS};
use crate::shim::doorbell::Doorbell;
use crate::shim::reactor::{self, Handler, Reactor};
use crate::shim::sys::{self, errno, lock, set_errno};
use crate::shim::{fdtable, real};

mod proofs;
#[cfg(test)]
pub(in crate::udp) mod tests;

const EPOLLET: u32 = libc::EPOLLET as u32;

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

/// A datagram received over TCP, waiting for the application.
pub(super) struct Dgram {
    pub(super) src: SocketAddr,
    pub(super) data: Vec<u8>,
}

/// An offloaded UDP socket.
///
/// The application's descriptor number refers to the program's end of a
/// [`Doorbell`] pair, rung whenever datagrams are queued or the hidden
/// kernel UDP socket (`udp`) becomes readable, so poll/select/epoll on the
/// application's descriptor report exactly when a receive call has
/// something to return. The doorbells are drained when both sources are
/// empty.
pub(crate) struct Sock {
    /// This socket, for registering handlers from `&self` methods.
    me: Weak<Self>,
    /// The process that adopted it (`Socket::owner_pid`): a child made
    /// without the fork handlers borrows its parent's entry.
    pub(crate) pid: i32,
    /// Epoll token of the hidden UDP socket.
    pub(crate) id: u64,
    /// AF_INET or AF_INET6.
    pub(crate) family: c_int,
    /// The kernel UDP socket, under a private descriptor.
    pub(crate) udp: c_int,
    pub(super) bell: Doorbell,
    /// Application descriptors naming this socket.
    refs: AtomicUsize,
    /// O_NONBLOCK of the application's open file description.
    pub(crate) nonblocking: AtomicBool,
    /// What `inner.rxq` is charged: payload bytes plus `DGRAM_OVERHEAD`
    /// per datagram (read without the lock).
    pub(super) rx_bytes: AtomicUsize,
    /// Datagrams in `inner.rxq` (read without the lock).
    pub(super) rx_dgrams: AtomicUsize,
    /// Accepted connections whose port is not proved yet, and proofs seen
    /// lately (`inner.pending` and `inner.recent`): while non-zero,
    /// datagrams on the hidden UDP socket are checked for proofs before
    /// anything else reads them.
    pub(super) proofs: AtomicUsize,
    /// Serialises looking for proofs at the head of the hidden UDP socket
    /// with reading it (a proof peeked by one thread must not be read as
    /// data by another).
    pub(super) proof_lock: Mutex<()>,
    /// `shutdown(SHUT_RD)`: receive calls return 0 (emulated: the hidden
    /// kernel socket still carries the offload's own datagrams).
    pub(super) shut_rd: AtomicBool,
    /// `shutdown(SHUT_WR)`: send calls fail with EPIPE.
    pub(super) shut_wr: AtomicBool,
    /// A receive call came since the last send (the sender's batching
    /// then writes at once: request and response).
    pub(super) recv_seen: AtomicBool,
    /// Datagrams polls read into the socket's connections (`Conn::held`),
    /// counted up after each `held` is set. A receive call looks for held
    /// connections (`Sock::serve_held`) only while this differs from
    /// `holds_seen`; a set `held` is never missed.
    pub(super) holds: AtomicU64,
    /// The count of `holds` the receive calls have looked behind: set
    /// (never lowered) by a look over every connection, and by a receive
    /// that served the held datagram of the socket's lone connection
    /// (`super::recv`'s lone path: nothing else could hold one then).
    pub(super) holds_seen: AtomicU64,
    /// On the list of sockets whose held datagrams a `select` or
    /// `epoll_wait` announces first (`super::recv::announce_held`).
    pub(super) holding_listed: AtomicBool,
    /// A non-blocking send found its connection's buffer full: that
    /// connection and the datagram's length, until a send succeeds
    /// (`Sock::write_wait`).
    pub(super) tx_blocked: Mutex<Option<(Weak<Conn>, usize)>>,
    /// `tx_blocked` is set (read without its lock on every send).
    pub(super) tx_full: AtomicBool,
    /// Time this socket's blocking sends may still wait on connections
    /// whose peer stopped reading (`super::core::stall`). A leaf lock,
    /// taken under a connection's `st`.
    pub(super) stalls: Mutex<StallBudget>,
    pub(super) inner: Mutex<Inner>,
    /// The GSO path's batch (`super::gso`).
    pub(super) gso: Mutex<Gso>,
    /// `UDP_GRO` is on (`gso` mode): kernel reads go through this buffer.
    pub(super) gro: Option<Mutex<Gro>>,
}

/// The state behind `Sock::inner`.
pub(super) struct Inner {
    pub(super) rxq: VecDeque<Dgram>,
    /// Connections whose input the receive calls read themselves, served
    /// round robin (`super::serve`).
    pub(super) ready: VecDeque<Arc<Conn>>,
    pub(super) bells: usize,
    /// The hidden UDP socket may hold datagrams (set by its edge-triggered
    /// readiness, cleared when a receive finds it empty).
    pub(super) udp_maybe: bool,
    /// Receive calls alternate between the queue and the hidden UDP socket
    /// while both hold datagrams, so that neither source starves the other.
    pub(super) udp_turn: bool,
    pub(super) routes: Routes<Arc<Conn>>,
    pub(super) owned: HashMap<u64, Arc<Conn>>,
    pub(super) peer: Option<SocketAddr>,
    pub(super) listener: Option<(c_int, u64)>,
    pub(super) rcvtimeo: Option<Duration>,
    pub(super) sndtimeo: Option<Duration>,
    pub(super) broadcast: bool,
    pub(super) paused: Vec<Arc<Conn>>,
    pub(super) closed: bool,
    /// Accepted connections alive (at most `WARPSOCK_MAX_ACCEPTED`).
    pub(super) accepted: usize,
    /// Accepted connections whose port is not proved yet, oldest first (at
    /// most `WARPSOCK_MAX_PENDING`).
    pub(super) pending: VecDeque<Arc<Conn>>,
    /// The listener stopped accepting until then (out of descriptors).
    pub(super) accept_paused: Option<Instant>,
    /// Nonces of connections proved lately, until when re-sent copies of
    /// their proof are still dropped (`PROOF_LINGER`).
    pub(super) recent: VecDeque<(Instant, [u8; NONCE_LEN])>,
}

impl Inner {
    /// Forgets proofs older than `PROOF_LINGER`.
    fn expire_proofs(&mut self, now: Instant) {
        while self.recent.front().is_some_and(|(t, _)| *t <= now) {
            self.recent.pop_front();
        }
    }

    /// The connections holding a datagram a poll read (`Conn::held`).
    pub(super) fn held(&self) -> impl Iterator<Item = &Arc<Conn>> {
        self.owned
            .values()
            .filter(|c| c.held.load(Ordering::Relaxed))
    }
}

impl Drop for Sock {
    fn drop(&mut self) {
        sys::close(self.udp);
        let l = lock(&self.inner).listener.take();
        if let Some((fd, _)) = l {
            sys::close(fd);
        }
    }
}

impl Sock {
    /// Switches the kernel UDP socket `fd` to the offload layer: the socket
    /// moves to a private descriptor and `fd` becomes the application's end
    /// of a doorbell socketpair. Returns the new state (already in the
    /// descriptor table) or an errno, in which case `fd` is unchanged.
    pub(crate) fn transpose(fd: c_int) -> Result<Arc<Self>, c_int> {
        // The library's descriptors out of the program's numbers, from the
        // limit now (`warpsock_engine::fds`).
        fds::set_floor_from_limit();
        let eng = reactor::get().ok_or(libc::ENOMEM)?;
        let family = sys::get_int(fd, libc::SOL_SOCKET, libc::SO_DOMAIN).ok_or_else(errno)?;
        // SAFETY: fcntl/dup3 on descriptors we were handed or create here.
        unsafe {
            let fl = real::fcntl(fd, libc::F_GETFL, 0);
            if fl < 0 {
                return Err(errno());
            }
            let udp = fds::dup_lifted(fd);
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
            let nonblocking = fl & libc::O_NONBLOCK != 0;
            let bell = match Doorbell::new(nonblocking) {
                Ok(b) => b,
                Err(e) => {
                    sys::close(udp);
                    return Err(e);
                }
            };
            let app_end = bell.app;
            let s = Arc::new_cyclic(|me| Self {
                me: me.clone(),
                id: eng.new_id(),
                family,
                udp,
                bell,
                refs: AtomicUsize::new(0),
                nonblocking: AtomicBool::new(nonblocking),
                rx_bytes: AtomicUsize::new(0),
                rx_dgrams: AtomicUsize::new(0),
                proofs: AtomicUsize::new(0),
                proof_lock: Mutex::new(()),
                recv_seen: AtomicBool::new(false),
                holds: AtomicU64::new(0),
                holds_seen: AtomicU64::new(0),
                holding_listed: AtomicBool::new(false),
                tx_blocked: Mutex::new(None),
                tx_full: AtomicBool::new(false),
                stalls: Mutex::new(StallBudget::new(Instant::now())),
                shut_rd: AtomicBool::new(false),
                shut_wr: AtomicBool::new(false),
                inner: Mutex::new(Inner {
                    rxq: VecDeque::new(),
                    ready: VecDeque::new(),
                    bells: 0,
                    udp_maybe: true,
                    udp_turn: false,
                    routes: Routes::default(),
                    owned: HashMap::new(),
                    peer: None,
                    listener: None,
                    rcvtimeo: sys::get_timeo(udp, libc::SO_RCVTIMEO),
                    sndtimeo: sys::get_timeo(udp, libc::SO_SNDTIMEO),
                    broadcast: sys::get_int(udp, libc::SOL_SOCKET, libc::SO_BROADCAST)
                        .is_some_and(|v| v != 0),
                    paused: Vec::new(),
                    closed: false,
                    accepted: 0,
                    pending: VecDeque::new(),
                    accept_paused: None,
                    recent: VecDeque::new(),
                }),
                gso: Mutex::new(Gso::default()),
                gro: (config::get().mode == Mode::Gso && enable_gro(udp))
                    .then(|| Mutex::new(Gro::new())),
                pid: sys::getpid(),
            });
            if !eng.register(udp, s.id, EPOLLIN | EPOLLET, Arc::new(UdpReady(s.clone()))) {
                return Err(errno());
            }
            if config::get().mode.gso() {
                eng.add_timer(eng.new_id(), Arc::new(GsoTimer(s.clone())));
            }
            // Publish before the swap (our paths only ever use `udp`); a
            // socket the program registered in epoll before its first send
            // keeps its registration.
            fdtable::swap_in(fd, app_end, s.clone())?;
            stats::inc(&STATS.sockets_offloaded);
            Ok(s)
        }
    }

    /// This socket as an `Arc` (it is always owned by one while in use).
    pub(super) fn arc(&self) -> Arc<Self> {
        self.me
            .upgrade()
            .expect("a socket in use is owned by an Arc")
    }

    /// A weak reference to this socket.
    pub(super) fn weak(&self) -> Weak<Self> {
        self.me.clone()
    }

    /// One more application descriptor names this socket.
    pub(crate) fn add_ref(&self) {
        self.refs.fetch_add(1, Ordering::AcqRel);
    }

    /// An application descriptor naming this socket was closed. On the last
    /// one, the listener closes and connections close once their queued
    /// datagrams have reached the kernel (or kernel UDP, on failure).
    pub(crate) fn release(&self) {
        if self.refs.fetch_sub(1, Ordering::AcqRel) != 1 {
            return;
        }
        let (listener, conns) = {
            let mut g = lock(&self.inner);
            g.closed = true;
            g.rxq.clear();
            g.ready.clear();
            self.rx_bytes.store(0, Ordering::Relaxed);
            self.rx_dgrams.store(0, Ordering::Relaxed);
            (
                g.listener.take(),
                g.owned.values().cloned().collect::<Vec<_>>(),
            )
        };
        let Some(eng) = reactor::current() else {
            return;
        };
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

    /// connect(2) on the application's descriptor.
    pub(crate) fn connect(&self, addr: *const sockaddr, len: socklen_t) -> c_int {
        // SAFETY: forwarding the application's arguments to the kernel socket.
        let r = unsafe { sys::connect_raw(self.udp, addr, len) };
        if r != 0 {
            return r;
        }
        // SAFETY: the kernel accepted `addr` of `len` bytes.
        let peer = unsafe { sys::addr_from_raw(addr, len) }.map(|a| norm(a, self.family));
        lock(&self.inner).peer = peer;
        0
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

    /// shutdown(2) on the application's descriptor: emulated, because the
    /// hidden kernel socket must still send and receive the offload's own
    /// datagrams (source-port proofs) for connections already under way.
    /// As on a kernel UDP socket: after `SHUT_WR` sends fail with EPIPE
    /// (without SIGPIPE), after `SHUT_RD` receives return 0 at once.
    pub(crate) fn shutdown(&self, how: c_int) -> c_int {
        let Some((rd, wr)) = sys::shutdown_ways(how) else {
            return -1;
        };
        if rd {
            self.shut_rd.store(true, Ordering::Relaxed);
            let mut g = lock(&self.inner);
            self.ring(&mut g);
        }
        if wr {
            self.shut_wr.store(true, Ordering::Relaxed);
        }
        // Linux shuts an unconnected UDP socket down all the same, and
        // reports ENOTCONN.
        if sys::peer_addr(self.udp).is_none() {
            set_errno(libc::ENOTCONN);
            return -1;
        }
        0
    }

    /// FIONREAD (`SIOCINQ`): the size of the datagram the next receive
    /// returns, as kernel UDP reports it, by the receive's own choice
    /// (`Sock::pick`, then `serve_held`): the kernel socket when it is its
    /// turn among sources that all hold datagrams or when the queue and the
    /// ready list are empty, the queue, the ready list, then what a poll
    /// held (`Conn::held`).
    /// FIONREAD read 0 for a held datagram, and followed the connections
    /// while the receive took the kernel socket's datagram (issue 13).
    /// Proof datagrams at the kernel socket's head are taken off first, as
    /// the receive takes them (`Sock::proofs_off`), never sized. Nothing
    /// anywhere sizes 0, by this look alone: the kernel socket's own
    /// answer could size a proof that arrived since.
    pub(crate) fn next_size(&self) -> usize {
        let mut found = Vec::new();
        let n = self.next_size_of(&mut found);
        if !found.is_empty() {
            // The proofs taken off are handed on as the receive hands them.
            if let Some(eng) = reactor::current() {
                self.proved(eng, found);
            }
        }
        n.unwrap_or(0)
    }

    /// [`Sock::next_size`], the proofs it took off put in `found`.
    fn next_size_of(&self, found: &mut Vec<(SocketAddr, [u8; NONCE_LEN])>) -> Option<usize> {
        // Inline: no allocation per call (event loops make one per datagram).
        let conns: SmallVec<[Arc<Conn>; 4]> = {
            let mut g = lock(&self.inner);
            let tcp = !g.rxq.is_empty() || !g.ready.is_empty();
            // The turn is pinned to the source sized, so that the receive
            // takes that datagram even if the other source gets one first
            // (the progress thread announcing a connection's, or one
            // arriving on the kernel socket).
            if !tcp || !g.udp_turn {
                if let Some(n) = self.kernel_next(&mut g, found) {
                    g.udp_turn = false;
                    return Some(n);
                }
            }
            if tcp {
                g.udp_turn = true;
            }
            if let Some(d) = g.rxq.front() {
                return Some(d.data.len());
            }
            match g.ready.front() {
                Some(c) => smallvec![c.clone()],
                None => g.held().cloned().collect(),
            }
        };
        // Each connection's state lock without `inner` (lock order).
        conns.iter().find_map(|c| match lock(&c.st).rx.peek() {
            frame::Parsed::Frame(len) => Some(len),
            _ => None,
        })
    }

    /// The length of the datagram a receive would take from the hidden
    /// kernel socket now (caller holds `inner`; `None`: none there), proofs
    /// at its head taken off into `found` first. Noted
    /// for `pick` (`udp_maybe`), so that the receive after a FIONREAD
    /// takes the datagram it sized though the progress thread has not yet
    /// seen it arrive.
    fn kernel_next(
        &self,
        g: &mut Inner,
        found: &mut Vec<(SocketAddr, [u8; NONCE_LEN])>,
    ) -> Option<usize> {
        let n = match &self.gro {
            // Through the `UDP_GRO` buffer, cut as `gro_recv` cuts it (no
            // proof is ever due there: see `recv_kernel`).
            Some(gro) => self.gro_next(&lock(gro))?,
            None => {
                let before = found.len();
                let (_proofs, head) = self.proofs_off(g, found);
                // (A pending error alone sizes as kernel UDP sizes it: 0.)
                if !head || !self.udp_readable() {
                    if found.len() > before {
                        // The proofs' arrival may have rung the doorbell
                        // (one that came after the progress thread took
                        // proofs off, before it looked whether the socket
                        // held more): with them gone, settle as the
                        // receive's look does (`pick`), or the descriptor
                        // stayed readable with nothing to receive.
                        self.settle(g);
                    }
                    return None;
                }
                let mut n: c_int = 0;
                // SAFETY: FIONREAD writes an int to the pointer given.
                let r =
                    unsafe { real::ioctl(self.udp, libc::FIONREAD, &mut n as *mut c_int as usize) };
                if r < 0 {
                    return None;
                }
                n.max(0) as usize
            }
        };
        g.udp_maybe = true;
        Some(n)
    }

    /// Writes a doorbell byte (caller holds `inner`).
    pub(super) fn ring(&self, g: &mut Inner) {
        if self.bell.ring(&mut g.bells) {
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
    ///
    /// After `shutdown(SHUT_RD)` the doorbell stays rung: a receive returns
    /// 0 at once, and a wait that would learn of it must not be left
    /// waiting by a look that found nothing (FIONREAD taking a proof off).
    pub(super) fn settle(&self, g: &mut Inner) {
        if g.bells == 0
            || self.shut_rd.load(Ordering::Relaxed)
            || !g.rxq.is_empty()
            || !g.ready.is_empty()
            || self.gro_pending()
        {
            return;
        }
        if g.udp_maybe {
            if self.udp_readable() {
                return;
            }
            g.udp_maybe = false;
        }
        self.bell.drain(&mut g.bells);
    }

    /// Whether a receive on the hidden UDP socket would return something
    /// now: a datagram or a pending error.
    pub(super) fn udp_readable(&self) -> bool {
        let mut p = [libc::pollfd {
            fd: self.udp,
            events: libc::POLLIN,
            revents: 0,
        }];
        sys::poll(&mut p, 0) > 0 && p[0].revents & (libc::POLLIN | libc::POLLERR) != 0
    }

    /// Whether the hidden UDP socket holds a pending error (an ICMP error
    /// on a connected socket: `ECONNREFUSED`), which the next receive on it,
    /// a peek too, reports once and clears.
    pub(super) fn udp_error_pending(&self) -> bool {
        let mut p = [libc::pollfd {
            fd: self.udp,
            events: 0,
            revents: 0,
        }];
        sys::poll(&mut p, 0) > 0 && p[0].revents & libc::POLLERR != 0
    }

    /// Progress thread: datagrams arrived on the hidden UDP socket.
    ///
    /// A blocking receive also polls that socket and may already have taken
    /// the datagram (under `inner`, so the check here is exact): then there
    /// is nothing to ring for, and a doorbell would be a spurious wake-up.
    pub(super) fn on_udp_ready(&self, eng: &'static Reactor) {
        #[cfg(feature = "test-hooks")]
        if let Some(d) =
            crate::shim::hooks::udp_ready_delay(self.proofs.load(Ordering::Relaxed) > 0)
        {
            std::thread::sleep(d);
        }
        if self.proofs.load(Ordering::Relaxed) > 0 {
            let found = {
                let _p = lock(&self.proof_lock);
                self.take_proofs()
            };
            self.proved(eng, found);
            self.count_proofs(&mut lock(&self.inner));
        }
        let mut g = lock(&self.inner);
        if g.closed || !self.udp_readable() {
            return;
        }
        g.udp_maybe = true;
        self.ring(&mut g);
    }

    /// Whether the receive queue is over its limit.
    pub(super) fn rx_full(&self) -> bool {
        self.rx_bytes.load(Ordering::Relaxed) > config::get().rcvbuf
            || self.rx_dgrams.load(Ordering::Relaxed) >= config::get().rcvq_dgrams
    }

    /// Room left in the receive queue.
    pub(super) fn room(&self) -> Room {
        let cfg = config::get();
        Room {
            bytes: cfg
                .rcvbuf
                .saturating_sub(self.rx_bytes.load(Ordering::Relaxed)),
            dgrams: cfg
                .rcvq_dgrams
                .saturating_sub(self.rx_dgrams.load(Ordering::Relaxed)),
        }
    }

    /// Queues datagrams that arrived on `conn` (progress thread, or a
    /// blocking receive call that read them: `from_caller`).
    pub(super) fn deliver(
        &self,
        eng: &Reactor,
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
        conn.delivered.store(true, Ordering::Relaxed);
        stats::add(&STATS.rx_tcp_dgrams, n);
        stats::stripe(conn.stripe.load(Ordering::Relaxed), false, n);
        stats::add(&STATS.rx_tcp_bytes, bytes as u64);
        self.rx_dgrams.fetch_add(n as usize, Ordering::Relaxed);
        let charge = bytes + n as usize * DGRAM_OVERHEAD;
        self.rx_bytes.fetch_add(charge, Ordering::Relaxed);
        if from_caller {
            // The receive call that read them takes the first at once and
            // rings for the rest (see `recvmsg`).
            stats::add(&STATS.rx_caller_dgrams, n);
        } else if n > 0 {
            self.ring(&mut g);
        }
        if self.rx_full() && !g.paused.iter().any(|c| Arc::ptr_eq(c, conn)) {
            g.paused.push(conn.clone());
            conn.set_interest(eng, Some(false), None);
            stats::inc(&STATS.rx_paused);
        }
    }

    /// Stop reading `conn` while the queue is full (it may hold whole
    /// frames back: they are taken when the queue has room again).
    pub(super) fn pause(&self, eng: &Reactor, conn: &Arc<Conn>) {
        let mut g = lock(&self.inner);
        if !g.paused.iter().any(|c| Arc::ptr_eq(c, conn)) {
            g.paused.push(conn.clone());
            conn.set_interest(eng, Some(false), None);
            stats::inc(&STATS.rx_paused);
        }
    }

    /// A connection is finished: forget it, and send the datagrams it still
    /// held by kernel UDP. With `fallback`, the destination stays on kernel
    /// UDP for a while.
    pub(super) fn conn_gone(
        &self,
        eng: &Reactor,
        conn: &Arc<Conn>,
        dest: Option<SocketAddr>,
        frames: Vec<Vec<u8>>,
        fallback: bool,
    ) {
        eng.deregister(conn.id, None);
        // Whether an accepted connection may carry replies to `dest`
        // instead of a fallback.
        let mut proved = false;
        {
            let mut g = lock(&self.inner);
            g.owned.remove(&conn.id);
            g.paused.retain(|c| !Arc::ptr_eq(c, conn));
            g.ready.retain(|c| !Arc::ptr_eq(c, conn));
            if conn.inbound {
                g.accepted = g.accepted.saturating_sub(1);
                g.pending.retain(|c| !Arc::ptr_eq(c, conn));
                self.count_proofs(&mut g);
            }
            if let Some(d) = dest {
                // Other stripes of the destination that work keep carrying
                // it: only a destination none of whose stripes is up falls
                // back (once, however many stripes gave up).
                let others_up = g.routes.remove(&d, conn);
                if fallback && !others_up {
                    proved = g.owned.values().any(|c| c.proved());
                    if !proved
                        && g.routes
                            .fall_back(d, Instant::now(), config::get().fallback_for)
                    {
                        stats::inc(&STATS.fallbacks);
                    }
                }
            }
        }
        if let (Some(d), true) = (dest, proved) {
            // Our route to a sender we accepted a proved connection from
            // gave up (the sender does not listen): replies go back over
            // that connection rather than by kernel UDP.
            if !self.prefer_proved(eng, d) {
                let mut g = lock(&self.inner);
                if g.routes
                    .fall_back(d, Instant::now(), config::get().fallback_for)
                {
                    stats::inc(&STATS.fallbacks);
                }
            }
        }
        if let Some(d) = dest {
            self.send_frames_udp(&d, &frames);
        }
        conn.cv.notify_all();
    }

    /// Sends the proof datagram for `nonce` to `dest` by kernel UDP, from
    /// this socket's port (the one our preamble claims).
    pub(super) fn send_proof(&self, dest: &SocketAddr, nonce: &[u8; NONCE_LEN]) {
        let p = frame::proof(nonce);
        let (ss, len) = sys::addr_to_raw(dest);
        if self.kernel_sendto(&p, &ss, len) {
            stats::inc(&STATS.proofs_sent);
        }
    }

    /// Sends datagrams that were queued for a connection by kernel UDP.
    pub(super) fn send_frames_udp(&self, dest: &SocketAddr, frames: &[Vec<u8>]) {
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
                sys::sendto_raw(
                    self.udp,
                    data.as_ptr(),
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
}

// ---- what the progress thread calls -------------------------------------

/// The hidden kernel UDP socket of an offloaded socket (edge-triggered).
pub(super) struct UdpReady(Arc<Sock>);

impl Handler for UdpReady {
    fn on_ready(&self, reactor: &'static Reactor, _events: u32) {
        self.0.on_udp_ready(reactor);
    }
}

/// The TCP listener matching a bound UDP port.
pub(super) struct Listening(pub(super) Arc<Sock>);

impl Handler for Listening {
    fn on_ready(&self, reactor: &'static Reactor, _events: u32) {
        self.0.on_accept(reactor);
    }

    fn deadline(&self) -> Option<Instant> {
        lock(&self.0.inner).accept_paused
    }

    fn on_timer(&self, reactor: &'static Reactor, now: Instant) -> bool {
        self.0.resume_accepting(reactor, now)
    }
}

/// An offload connection and the socket it feeds.
pub(super) struct ConnEvents {
    sock: Arc<Sock>,
    conn: Arc<Conn>,
}

impl ConnEvents {
    pub(super) fn new(sock: Arc<Sock>, conn: Arc<Conn>) -> Self {
        Self { sock, conn }
    }
}

impl Handler for ConnEvents {
    fn on_ready(&self, reactor: &'static Reactor, events: u32) {
        self.conn.handle(reactor, &self.sock, events, false);
    }

    fn deadline(&self) -> Option<Instant> {
        self.conn.deadline()
    }

    fn on_timer(&self, reactor: &'static Reactor, now: Instant) -> bool {
        self.conn.on_timer(reactor, &self.sock, now)
    }

    fn pending(&self) -> bool {
        self.conn.has_pending()
    }
}
