//! The connection management layer's receiving side: the TCP listener that
//! matches a bound UDP port, accepting connections (hello first), handing
//! the listener over to a later socket on the same port, and adopting the
//! route back to a sender that named itself in its preamble.

use std::collections::HashMap;
use std::mem::{size_of, zeroed};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, Weak};

use libc::{c_int, socklen_t};

use super::config;
use super::conn::{tune, Conn, EPOLLIN};
use super::core::frame::{self, HELLO_LEN};
use super::core::routes::Adopted;
use super::sock::{ConnEvents, Listening, Sock};
use super::stats::{self, STATS};
use crate::shim::reactor::{self, Reactor};
use crate::shim::real;
use crate::shim::sys::{self, errno, lock};

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
    pub(super) fn on_accept(self: &Arc<Self>, eng: &'static Reactor) {
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
            let Some(peer) = peer.filter(|_| w == HELLO_LEN as isize) else {
                sys::close(c);
                continue;
            };
            self.accepted(eng, c, peer);
        }
    }

    /// Takes an accepted connection `c` (hello sent) from `peer` into the
    /// socket; its preamble is due within `WARPSOCK_PREAMBLE_TIMEOUT_MS`.
    fn accepted(self: &Arc<Self>, eng: &'static Reactor, c: c_int, peer: SocketAddr) {
        let conn = Arc::new(Conn::accepted(eng.new_id(), c, peer));
        {
            let mut g = lock(&self.inner);
            if g.closed {
                sys::close(c);
                return;
            }
            g.owned.insert(conn.id, conn.clone());
        }
        let h = Arc::new(ConnEvents::new(self.clone(), conn.clone()));
        if !eng.register(c, conn.id, EPOLLIN, h.clone()) {
            lock(&self.inner).owned.remove(&conn.id);
            sys::close(c);
            return;
        }
        eng.add_timer(conn.id, h);
    }

    /// An accepted connection named its sender: route replies over it. A
    /// stripe whose group already feeds us joins that group (replies are
    /// striped over the group); otherwise the first connection keeps the
    /// route.
    pub(super) fn adopt_route(&self, remote: SocketAddr, conn: &Arc<Conn>, group: u32) {
        if lock(&self.inner).routes.adopt(remote, conn, group) == Adopted::Joined {
            stats::inc(&STATS.stripe_joins);
        }
    }
}
