//! The send path: every send call on an offloaded socket lands in
//! [`Sock::sendmsg`], which routes the datagram (policy, fallback, an
//! existing connection or a new stripe group) and hands it to a connection
//! or to kernel UDP.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use libc::{c_int, msghdr};

use super::config;
use super::conn::{max_dgram, Conn, SendErr, Sent};
use super::core::frame::Stripe;
use super::core::routes::{Group, Lookup};
use super::sock::{norm, ConnEvents, Inner, Sock};
use super::stats::{self, STATS};
use crate::shim::iov;
use crate::shim::reactor::{self, Reactor};
use crate::shim::sys::{self, errno, lock, set_errno};

/// A random non-zero stripe group number.
fn group_id() -> u32 {
    let mut b = [0u8; 4];
    let r = sys::getrandom(&mut b, libc::GRND_NONBLOCK);
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

/// Where one datagram goes.
enum Route {
    /// Kernel UDP (`true`: the destination has fallen back).
    Kernel(bool),
    /// Kernel UDP, batched with GSO (`super::gso`).
    Gso,
    Conn(Arc<Conn>),
}

impl Sock {
    /// sendmsg(2) on the application's descriptor (every send call lands here).
    ///
    /// # Safety
    /// `msg` must be a valid msghdr whose buffers are readable.
    pub(crate) unsafe fn sendmsg(&self, msg: &msghdr, flags: c_int) -> isize {
        let cfg = config::get();
        if self.shut_wr.load(Ordering::Relaxed) {
            set_errno(libc::EPIPE);
            return -1;
        }
        let Some(eng) = reactor::get() else {
            // SAFETY: forwarding the caller's valid msghdr.
            return unsafe { self.kernel_send(msg, flags, None) };
        };
        // SAFETY: msg_name/msg_namelen come from the application's msghdr.
        let given = unsafe { sys::addr_from_raw(msg.msg_name.cast(), msg.msg_namelen) };
        // SAFETY: msg_iov describes msg_iovlen iovecs.
        let len = unsafe { iov::len(msg.msg_iov, msg.msg_iovlen) };
        // The socket's lock, taken once for its peer and the route (the
        // first pass below).
        let g = lock(&self.inner);
        let (peer, sndtimeo) = (g.peer, g.sndtimeo);
        let mut first = Some(g);
        let dest = match (msg.msg_name.is_null(), given) {
            (true, _) => peer,
            (false, Some(a)) => Some(a),
            (false, None) => None,
        };
        let Some(dest) = dest.map(|d| norm(d, self.family)) else {
            drop(first);
            // SAFETY: as above; the kernel reports the error.
            return unsafe { self.kernel_send(msg, flags, sndtimeo) };
        };
        let nonblock = flags & libc::MSG_DONTWAIT != 0 || self.nonblocking.load(Ordering::Relaxed);
        // A receive since the last send: request and response, not a stream.
        let interactive = self.recv_seen.swap(false, Ordering::Relaxed);
        loop {
            let route = {
                let mut g = first.take().unwrap_or_else(|| lock(&self.inner));
                if g.closed || !cfg.policy.dest_ok(&dest, g.broadcast) {
                    Route::Kernel(false)
                } else if !cfg.mode.tcp() {
                    Route::Gso
                } else {
                    match g.routes.lookup(&dest, Instant::now) {
                        // A peer without the preload: the second path.
                        Lookup::Kernel if cfg.mode.gso() => Route::Gso,
                        Lookup::Kernel => Route::Kernel(true),
                        Lookup::Conn(c) => Route::Conn(c),
                        Lookup::Open => Route::Conn(self.open_group(&mut g, eng, dest)),
                    }
                }
            };
            let c = match route {
                Route::Kernel(fb) => {
                    stats::inc(if fb {
                        &STATS.tx_kernel_fallback
                    } else {
                        &STATS.tx_kernel_policy
                    });
                    // SAFETY: forwarding the caller's valid msghdr.
                    return unsafe { self.kernel_send(msg, flags, sndtimeo) };
                }
                Route::Gso => {
                    if len > max_dgram(&dest) {
                        set_errno(libc::EMSGSIZE);
                        return -1;
                    }
                    // SAFETY: the caller's valid msghdr.
                    return unsafe {
                        self.gso_send(eng, dest, msg, flags, len, interactive, sndtimeo)
                    };
                }
                Route::Conn(c) => c,
            };
            if len > max_dgram(&dest) {
                set_errno(libc::EMSGSIZE);
                return -1;
            }
            // SAFETY: msg_iov describes readable iovecs.
            match unsafe {
                c.send(
                    eng,
                    msg.msg_iov,
                    msg.msg_iovlen,
                    len,
                    nonblock,
                    sndtimeo,
                    interactive,
                    &self.stalls,
                )
            } {
                Ok(sent) => {
                    if self.tx_full.load(Ordering::Relaxed) {
                        self.tx_full.store(false, Ordering::Relaxed);
                        *lock(&self.tx_blocked) = None;
                    }
                    // A drop succeeds as kernel UDP's does, but is counted
                    // only as the drop (by `Conn::send`), not as sent.
                    if sent == Sent::Taken {
                        stats::inc(&STATS.tx_tcp_dgrams);
                        stats::add(&STATS.tx_tcp_bytes, len as u64);
                        stats::stripe(c.stripe.load(Ordering::Relaxed), true, 1);
                    }
                    return len as isize;
                }
                Err(SendErr::Retry) => {
                    // The connection died; forget it (if still routed) and retry.
                    lock(&self.inner).routes.remove(&dest, &c);
                }
                Err(SendErr::Died(frames)) => {
                    self.conn_gone(eng, &c, Some(dest), frames, false);
                }
                Err(SendErr::Errno(e)) => {
                    if e == libc::EAGAIN {
                        // Full: a poll for POLLOUT waits for room on it.
                        *lock(&self.tx_blocked) = Some((Arc::downgrade(&c), len));
                        self.tx_full.store(true, Ordering::Relaxed);
                    }
                    set_errno(e);
                    return -1;
                }
                Err(SendErr::Kernel) if self.prefer_proved(eng, dest) => {
                    // Our connection failed, but the destination proved
                    // itself on one it opened to us: route again.
                }
                Err(SendErr::Kernel) if cfg.mode.gso() => {
                    // Retrying after a failed attempt: the second path
                    // meanwhile.
                    // SAFETY: the caller's valid msghdr.
                    return unsafe {
                        self.gso_send(eng, dest, msg, flags, len, interactive, sndtimeo)
                    };
                }
                Err(SendErr::Kernel) => {
                    stats::inc(&STATS.tx_kernel_fallback);
                    // SAFETY: forwarding the caller's valid msghdr.
                    return unsafe { self.kernel_send(msg, flags, sndtimeo) };
                }
            }
        }
    }

    /// A program's `poll`/`ppoll` waits for `POLLOUT`: after a send that
    /// found its connection's buffer full, the connection's descriptor to
    /// wait on instead of the program's (whose doorbell is always
    /// writable: a sender that polls before each retry would spin), until
    /// the datagram fits. `None`: the program's descriptor says it.
    pub(crate) fn write_wait(&self) -> Option<c_int> {
        if !self.tx_full.load(Ordering::Relaxed) {
            return None;
        }
        let (conn, len) = lock(&self.tx_blocked).clone()?;
        let fd = conn.upgrade()?.room_wait(len)?;
        stats::inc(&STATS.tx_room_waits);
        Some(fd)
    }

    /// Sends by the kernel UDP socket with the application's blocking mode.
    ///
    /// # Safety
    /// `msg` must be a valid msghdr.
    pub(super) unsafe fn kernel_send(
        &self,
        msg: &msghdr,
        flags: c_int,
        sndtimeo: Option<Duration>,
    ) -> isize {
        let nonblock = flags & libc::MSG_DONTWAIT != 0 || self.nonblocking.load(Ordering::Relaxed);
        let deadline = sndtimeo.map(|t| Instant::now() + t);
        loop {
            // SAFETY: per the contract.
            let r = unsafe { sys::sendmsg_raw(self.udp, msg, flags | libc::MSG_DONTWAIT) };
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
            if sys::poll(&mut p, wait) < 0 && errno() == libc::EINTR && sys::signal_ends_call() {
                set_errno(libc::EINTR);
                return -1;
            }
        }
    }

    /// Creates the connections for `dest` (`WARPSOCK_STRIPES` of them) and
    /// starts connecting; returns the one for the first datagram (caller
    /// holds `inner`; nothing here takes it).
    fn open_group(&self, g: &mut Inner, eng: &'static Reactor, dest: SocketAddr) -> Arc<Conn> {
        let k = config::get().stripes;
        let id = if k > 1 { group_id() } else { 0 };
        let me = self.arc();
        let conns = (0..k)
            .map(|i| {
                let stripe = (k > 1).then_some(Stripe {
                    group: id,
                    index: i as u8,
                    count: k as u8,
                });
                me.open_conn(g, eng, dest, stripe)
            })
            .collect();
        if k > 1 {
            stats::inc(&STATS.stripe_groups);
        }
        g.routes.insert(dest, Group::new(conns, id))
    }

    /// Creates one connection for `dest` and starts connecting (caller
    /// holds `inner`; nothing here takes it).
    fn open_conn(
        self: &Arc<Self>,
        g: &mut Inner,
        eng: &'static Reactor,
        dest: SocketAddr,
        stripe: Option<Stripe>,
    ) -> Arc<Conn> {
        let port = sys::local_addr(self.udp).map_or(0, |a| a.port());
        let conn = Arc::new(Conn::outgoing(eng.new_id(), dest, port, stripe));
        let h = Arc::new(ConnEvents::new(self.clone(), conn.clone()));
        eng.register_token(conn.id, h.clone());
        {
            let mut st = lock(&conn.st);
            // The first attempt starts at once (the set-up's first deadline
            // is now).
            if conn
                .start_attempt(&mut st, eng, self.family, self.udp)
                .is_err()
            {
                // Left in back-off: the progress thread retries or falls back.
                let _ = conn.note_failure(&mut st, &mut Vec::new());
            }
        }
        g.owned.insert(conn.id, conn.clone());
        eng.add_timer(conn.id, h);
        conn
    }
}
