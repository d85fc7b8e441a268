//! The connection management layer's receiving side: the TCP listener that
//! matches a bound UDP port, accepting connections (hello first), handing
//! the listener over to a later socket on the same port, and adopting the
//! route back to a sender that named itself in its preamble.

use std::collections::HashMap;
use std::mem::{size_of, zeroed};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use libc::{c_int, socklen_t};
use warpsock_engine::fds;

use super::config;
use super::conn::{tune, Conn, EPOLLIN};
use super::core::frame::{self, NONCE_LEN};
use super::core::routes::Adopted;
use super::sock::{ConnEvents, Listening, Sock};
use super::stats::{self, STATS};
use crate::shim::reactor::{self, Reactor};
use crate::shim::real;
use crate::shim::sys::{self, errno, lock};

/// How long a listener stops accepting after the process ran out of
/// descriptors or memory (level-triggered readiness would spin otherwise).
const ACCEPT_PAUSE: Duration = Duration::from_millis(100);

/// A fresh random nonce for an accepted connection's hello.
fn nonce() -> [u8; NONCE_LEN] {
    let mut n = [0u8; NONCE_LEN];
    let mut got = 0;
    while got < NONCE_LEN {
        let r = sys::getrandom(&mut n[got..], 0);
        if r > 0 {
            got += r as usize;
        } else if errno() != libc::EINTR {
            // No entropy source at all: a weak but unique fallback (the
            // proof still needs the datagram to come from the claimed port).
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos());
            n.copy_from_slice(&t.to_le_bytes()[..NONCE_LEN]);
            break;
        }
    }
    n
}

/// Which socket owns the listener of each TCP port.
static LISTENERS: Mutex<Option<HashMap<u16, Weak<Sock>>>> = Mutex::new(None);

fn owner_of(port: u16) -> Option<Arc<Sock>> {
    lock(&LISTENERS)
        .get_or_insert_with(HashMap::new)
        .get(&port)
        .and_then(Weak::upgrade)
}

fn set_owner(port: u16, sock: &Arc<Sock>) {
    lock(&LISTENERS)
        .get_or_insert_with(HashMap::new)
        .insert(port, Arc::downgrade(sock));
}

impl Sock {
    /// Opens the TCP listener that matches the bound UDP port (if the policy
    /// allows the port and the TCP port is free).
    pub(crate) fn listen(self: &Arc<Self>) {
        let cfg = config::get();
        let Some(eng) = reactor::get() else { return };
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
        // Out of the program's numbers, as every library descriptor.
        let l = fds::lift(l);
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
            if e == libc::EADDRINUSE
                && owner_of(tcp.port())
                    .is_some_and(|o| !Arc::ptr_eq(&o, self) && o.hand_over_listener(eng, self))
            {
                set_owner(tcp.port(), self);
                stats::inc(&STATS.listeners);
            } else {
                stats::inc(&STATS.listen_failed);
            }
            return;
        }
        let id = eng.new_id();
        lock(&self.inner).listener = Some((l, id));
        if eng.register(l, id, EPOLLIN, Arc::new(Listening(self.clone()))) {
            set_owner(tcp.port(), self);
            stats::inc(&STATS.listeners);
        } else {
            lock(&self.inner).listener = None;
            sys::close(l);
            stats::inc(&STATS.listen_failed);
        }
    }

    /// A connected socket gives its listener to `to`, an unconnected socket
    /// bound to the same port later (the iperf/socat server pattern: the
    /// socket that heard the first datagram connects to its sender, and a
    /// new socket takes over the port for everyone else).
    fn hand_over_listener(&self, eng: &Reactor, to: &Arc<Self>) -> bool {
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
        eng.register_token(id, Arc::new(Listening(to.clone())));
        eng.modify(l, id, EPOLLIN);
        lock(&to.inner).listener = Some((l, id));
        true
    }

    /// Progress thread: accept every pending connection on the listener.
    ///
    /// A peer outside `WARPSOCK_UDP_ADDRS`, or beyond the socket's
    /// `WARPSOCK_MAX_ACCEPTED` connections, is closed at once (its sender
    /// falls back to kernel UDP); beyond `WARPSOCK_MAX_PENDING` connections
    /// still without a proved port, the oldest is closed. When the process
    /// runs out of descriptors the listener pauses for `ACCEPT_PAUSE`
    /// instead of spinning on its level-triggered readiness.
    pub(super) fn on_accept(self: &Arc<Self>, eng: &'static Reactor) {
        let cfg = config::get();
        let Some((lfd, lid)) = lock(&self.inner).listener else {
            return;
        };
        loop {
            // SAFETY: sockaddr_storage is plain data.
            let mut ss: libc::sockaddr_storage = unsafe { zeroed() };
            let mut len = size_of::<libc::sockaddr_storage>() as socklen_t;
            // SAFETY: accept4 on our listener with valid out pointers.
            let c = unsafe {
                sys::accept4_raw(
                    lfd,
                    (&mut ss as *mut libc::sockaddr_storage).cast(),
                    &mut len,
                    libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                )
            };
            if c < 0 {
                match errno() {
                    libc::EINTR | libc::ECONNABORTED | libc::EPROTO => continue,
                    libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM => {
                        self.pause_accepting(eng, lfd, lid);
                    }
                    _ => {}
                }
                return;
            }
            let c = fds::lift(c);
            stats::inc(&STATS.accepts);
            // SAFETY: the kernel wrote `len` bytes of address.
            let peer =
                unsafe { sys::addr_from_raw((&ss as *const libc::sockaddr_storage).cast(), len) };
            let full = lock(&self.inner).accepted >= cfg.max_accepted;
            let Some(peer) = peer.filter(|p| !full && cfg.policy.peer_ok(p.ip())) else {
                stats::inc(&STATS.accepts_refused);
                sys::close(c);
                continue;
            };
            tune(c);
            self.accepted(eng, c, peer);
        }
    }

    /// Out of descriptors: stop watching the listener for `ACCEPT_PAUSE`.
    fn pause_accepting(self: &Arc<Self>, eng: &'static Reactor, lfd: c_int, lid: u64) {
        stats::inc(&STATS.accept_pauses);
        lock(&self.inner).accept_paused = Some(Instant::now() + ACCEPT_PAUSE);
        eng.modify(lfd, lid, 0);
        eng.add_timer(lid, Arc::new(Listening(self.clone())));
    }

    /// Timer: accept again once the pause is over. Returns true when done.
    pub(super) fn resume_accepting(&self, eng: &'static Reactor, now: Instant) -> bool {
        let mut g = lock(&self.inner);
        match (g.accept_paused, g.listener) {
            (Some(t), Some((lfd, lid))) if t <= now => {
                g.accept_paused = None;
                eng.modify(lfd, lid, EPOLLIN);
                true
            }
            (Some(_), Some(_)) => false,
            _ => {
                g.accept_paused = None;
                true
            }
        }
    }

    /// Takes an accepted connection `c` from `peer` into the socket and
    /// sends the hello with a fresh nonce; the preamble and the proof of
    /// its port are due within `WARPSOCK_PREAMBLE_TIMEOUT_MS`. The
    /// connection counts as pending before the hello leaves, so that a proof
    /// answering it at once is recognised as one.
    fn accepted(self: &Arc<Self>, eng: &'static Reactor, c: c_int, peer: SocketAddr) {
        let cfg = config::get();
        let n = nonce();
        let conn = Arc::new(Conn::accepted(eng.new_id(), c, peer, n));
        // Watched before the socket lists it: a blocking receive call may
        // claim the connection the moment it is listed, and a claim
        // changes the progress thread's watch (`Conn::claim`), which must
        // exist by then. Registered after, the change failed and the
        // registration watched the descriptor level-triggered for input
        // while the connection's interest said it asked for nothing: an
        // unproved sender's end of stream then woke the progress thread
        // in a loop until the preamble deadline (the attacks CI flake).
        let h = Arc::new(ConnEvents::new(self.clone(), conn.clone()));
        if !eng.register(c, conn.id, EPOLLIN, h.clone()) {
            let _ = conn.die(&mut lock(&conn.st));
            return;
        }
        let evict = {
            let mut g = lock(&self.inner);
            if g.closed {
                drop(g);
                eng.deregister(conn.id, None);
                let _ = conn.die(&mut lock(&conn.st));
                return;
            }
            g.owned.insert(conn.id, conn.clone());
            g.accepted += 1;
            g.pending.push_back(conn.clone());
            let evict = (g.pending.len() > cfg.max_pending)
                .then(|| g.pending.pop_front())
                .flatten();
            self.count_proofs(&mut g);
            evict
        };
        #[cfg(feature = "test-hooks")]
        accept_gap();
        if let Some(old) = evict {
            stats::inc(&STATS.pending_evicted);
            let frames = old.die(&mut lock(&old.st));
            self.conn_gone(eng, &old, None, frames, false);
        }
        let hello = frame::hello(Some(&n));
        // SAFETY: a short write to a fresh socket we own.
        let w = unsafe {
            sys::send_raw(
                c,
                hello.as_ptr(),
                hello.len(),
                libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
            )
        };
        if w != hello.len() as isize {
            let frames = conn.die(&mut lock(&conn.st));
            self.conn_gone(eng, &conn, None, frames, false);
            return;
        }
        eng.add_timer(conn.id, h);
    }

    /// An accepted connection proved its sender: route replies over it
    /// (replies only: see `Routes::lookup`). A stripe whose group already
    /// feeds us joins that group (replies are striped over the group);
    /// otherwise the first route stays. The route change only (the socket's
    /// lock; the caller holds the connection's `order`: `Conn::adopt_proved`);
    /// [`Self::adopted`] does the rest.
    pub(super) fn adopt(
        &self,
        remote: SocketAddr,
        conn: &Arc<Conn>,
        group: u32,
    ) -> Adopted<Arc<Conn>> {
        lock(&self.inner).routes.adopt(remote, conn, group)
    }

    /// Applies what `Routes::adopt` did; returns whether the connection
    /// took over the route to `remote` (new, or in place of failed ones).
    pub(super) fn adopted(&self, eng: &Reactor, remote: SocketAddr, a: Adopted<Arc<Conn>>) -> bool {
        match a {
            Adopted::Joined => {
                stats::inc(&STATS.stripe_joins);
                false
            }
            Adopted::New => true,
            Adopted::Replaced(old) => {
                stats::inc(&STATS.routes_replaced);
                // Our own connections that failed: closed, their queued
                // datagrams sent by kernel UDP.
                for c in old {
                    let frames = {
                        let mut st = lock(&c.st);
                        c.die(&mut st)
                    };
                    self.conn_gone(eng, &c, Some(remote), frames, false);
                }
                true
            }
            Adopted::Ignored => false,
        }
    }

    /// Our route to `remote` failed (retrying, or given up): if an
    /// accepted connection proved `remote` and delivered from it, replies
    /// go back over that connection instead of kernel UDP (that sender
    /// connects but does not listen). Returns whether one took over.
    pub(super) fn prefer_proved(&self, eng: &Reactor, remote: SocketAddr) -> bool {
        let proved: Vec<Arc<Conn>> = lock(&self.inner)
            .owned
            .values()
            .filter(|c| c.proved())
            .cloned()
            .collect();
        // Their addresses are read without the socket's lock (lock order).
        let found = proved.into_iter().find_map(|c| {
            let st = lock(&c.st);
            let (dest, group) = (st.dest, st.group);
            drop(st);
            (dest == Some(remote)).then_some((group, c))
        });
        let Some((group, c)) = found else {
            return false;
        };
        let a = lock(&self.inner).routes.adopt(remote, &c, group);
        if matches!(a, Adopted::New) {
            stats::inc(&STATS.routes_replaced);
        }
        self.adopted(eng, remote, a)
    }
}

/// `WARPSOCK_TEST_ACCEPT_GAP_MS`: the progress thread waits this long after
/// an accepted connection joined its socket, before its hello is sent, as
/// if descheduled: a blocking receive call that starts meanwhile claims
/// the connection (`tests/attacks.rs`).
#[cfg(feature = "test-hooks")]
fn accept_gap() {
    use std::sync::OnceLock;
    static MS: OnceLock<Option<u64>> = OnceLock::new();
    let ms = *MS.get_or_init(|| {
        std::env::var("WARPSOCK_TEST_ACCEPT_GAP_MS")
            .ok()
            .and_then(|v| v.trim().parse().ok())
    });
    if let Some(ms) = ms {
        std::thread::sleep(Duration::from_millis(ms));
    }
}
