//! The receive path: every receive call on an offloaded socket lands in
//! [`Sock::recvmsg`]. It takes, in turn, what the progress thread queued
//! (datagrams read during a connection's set-up, or every datagram with
//! `WARPSOCK_CALLER_RECV=0`), the ready connections (read and served by the
//! call itself, `super::serve`) and the hidden kernel UDP socket, taking
//! turns between sources that all hold datagrams. A blocking call that
//! finds nothing polls the doorbell, the kernel socket and the socket's
//! connections itself (no thread hand-off on the reply path), optionally
//! busy-polling first, and leaves them parked when it returns a datagram
//! (`super::park`: no `epoll_ctl` per round trip).
//!
//! ## Why a blocking receive polls before it reads (the wait model)
//!
//! A blocking round trip costs each side a `poll`, a read and a send where
//! kernel UDP makes a blocking `recvfrom` and a send (sockperf: 6.02
//! system calls per round trip against 4.01). The poll is there because
//! three sources feed an offloaded socket and a thread blocked in a read
//! of one connection sees only that one: the hidden kernel UDP socket
//! (peers without the preload, a peer that fell back, and the proofs of
//! new connections' ports: a new peer's set-up waits for the acceptor to
//! read its proof there) and the doorbell (new connections, what the
//! progress thread put on the ready list, `shutdown(SHUT_RD)` from
//! another thread, held datagrams announced). Nothing but data, a signal,
//! the read's own timeout or a shutdown of the connection ends a blocked
//! TCP read. A direct blocking read is safe only with a bound on how long
//! the other two sources can wait, and none of the shortcuts gives one:
//! - *Only while the kernel socket can receive nothing new* (a connected
//!   socket whose peer is proved and offloaded): sockperf's ends are both
//!   unconnected (`sendto`/`recvfrom`, checked with `strace`), and even a
//!   connected socket receives the proofs of its next connection there.
//! - *A bounded direct read* (the next step, not built yet): make each
//!   connection's descriptor blocking once it is set up (every other read
//!   and write of it already passes `MSG_DONTWAIT`) with `SO_RCVTIMEO` at
//!   a bound T (~1 ms) set once; a blocking call holding one established,
//!   parked connection and nothing else reads it directly for up to T and
//!   then polls as now. It must not block under the connection's locks:
//!   the progress thread takes `order` for every event of the connection
//!   (a flush on `EPOLLOUT`, its timers) and would stall every socket for
//!   up to T, and senders take `st`; so it needs a reader token that the
//!   other read paths respect, and a per-thread buffer appended under the
//!   locks afterwards. And it must poll every K-th wait even while the
//!   connection keeps delivering faster than T: `take` reads the kernel
//!   socket only when a poll saw it readable, so direct reads alone would
//!   starve it. Kernel datagrams and doorbell events then wait at most
//!   about T (or K deliveries); 6.02 -> about 4 + 2/K calls per round trip.
//! - *Waking the blocked reader*: a private real-time signal from the
//!   progress thread (watching the kernel socket and the doorbell while a
//!   reader is blocked) needs a handler installed in the program, meets
//!   the program's signal masks and its own use of the signal, and costs a
//!   thread wake-up per kernel datagram. `io_uring` (one `io_uring_enter`:
//!   a read of the connection and standing polls of the other two) leaves
//!   a read in flight when another source wins, which needs the same
//!   reader token and a buffer owned by the connection, and falls back to
//!   the poll where `io_uring` is refused (containers' seccomp).
//!
//! The busy-poll path makes no poll: a spin is one non-blocking read of
//! the lone parked connection (`Conn::glance`, no claim; `Sock::recv_lone`
//! on a socket fed by nothing else: one look at the socket, then the read),
//! about 600 user instructions with the preload's entry and one system
//! call against kernel UDP's 64 and one.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use libc::{c_int, msghdr};
use smallvec::SmallVec;

use super::config;
use super::conn::{Conn, DGRAM_OVERHEAD, EPOLLIN, HINT_UP};
use super::core::frame::{self, NONCE_LEN, PROOF_LEN};
use super::park;
use super::serve::{hold_frame, Served, Via};
use super::sock::{Inner, Sock};
use super::stats::{self, STATS};
use crate::shim::iov;
use crate::shim::reactor;
use crate::shim::socket::{Wait, POLL_ALONE_MAX};
use crate::shim::sys::{self, errno, lock, set_errno};

mod driven;
mod lone;
use driven::{spare, Driven, DRIVEN_INLINE};

/// What a program's wait found on one of the socket's connections
/// (`Sock::woke`).
enum Woke {
    /// Nothing for the program.
    Nothing,
    /// A whole datagram, read into the connection's buffer.
    Held,
    /// Other input, taken up the long way.
    Handled,
}

/// What one look at the socket's sources found.
enum Pick {
    /// The call's result.
    Done(isize),
    /// A ready connection to serve.
    Conn(Arc<Conn>),
    /// Something changed (a proof was taken off): look again.
    Again,
    /// Nothing to receive now.
    Nothing,
}

impl Sock {
    /// recvmsg(2) on the application's descriptor (every receive call lands
    /// here).
    ///
    /// # Safety
    /// `msg` must be a valid msghdr whose buffers are writable.
    pub(crate) unsafe fn recvmsg(&self, msg: &mut msghdr, flags: c_int) -> isize {
        let nonblock = flags & libc::MSG_DONTWAIT != 0 || self.nonblocking.load(Ordering::Relaxed);
        if !self.recv_seen.load(Ordering::Relaxed) {
            self.recv_seen.store(true, Ordering::Relaxed);
        }
        if nonblock && !self.shut_rd.load(Ordering::Relaxed) {
            // SAFETY: the application's msghdr (contract).
            if let Some(r) = unsafe { self.recv_lone(msg, flags) } {
                return r;
            }
        }
        // A non-blocking call never waits: no lock and no clock reading for
        // a deadline (a busy-poll loop makes one such call per spin).
        let deadline = if nonblock {
            None
        } else {
            lock(&self.inner).rcvtimeo.map(|t| Instant::now() + t)
        };
        let (namelen, ctllen) = (msg.msg_namelen, msg.msg_controllen);
        let mut udp_hint = false;
        let mut driven: Option<Driven> = None;
        let mut spin_until: Option<Instant> = None;
        // System calls a non-blocking call made looking at parked
        // connections (the counters of one that finds nothing).
        let mut looks = 0;
        loop {
            // Looked at on every wake-up too: `shutdown(SHUT_RD)` from
            // another thread rings the doorbell to end a blocked call, as
            // it does on a kernel UDP socket (iperf 2 stops its receiving
            // threads so at SIGTERM).
            if self.shut_rd.load(Ordering::Relaxed) {
                msg.msg_namelen = 0;
                msg.msg_controllen = 0;
                msg.msg_flags = 0;
                return 0;
            }
            // SAFETY: the application's msghdr (contract).
            if let Some(r) = unsafe { self.take(msg, flags, namelen, ctllen, &mut udp_hint) } {
                if let Some(d) = driven.as_mut() {
                    d.park = r >= 0;
                }
                return r;
            }
            if nonblock && (driven.is_some() || !park::any()) {
                // Parked connections looked at: they stay parked. A program
                // that spins on non-blocking receives, or waits in poll and
                // reads until EAGAIN, takes them over again for free; a
                // real wait gives them back (`super::park`).
                let counted = driven.as_mut().map(|d| {
                    d.park = true;
                    looks
                });
                // SAFETY: the application's msghdr (contract).
                return unsafe { self.held_or_again(msg, flags, counted) };
            }
            // A non-blocking call neither waits nor spins: no clock reading.
            let now = (!nonblock).then(Instant::now);
            let wait = match (now, deadline) {
                (None, _) => 0,
                (Some(now), Some(d)) => {
                    let left = d.saturating_duration_since(now);
                    if left.is_zero() {
                        set_errno(libc::EAGAIN);
                        return -1;
                    }
                    left.as_micros().div_ceil(1000).min(i32::MAX as u128) as c_int
                }
                (Some(_), None) => -1,
            };
            // From here on the call watches the socket's connections itself
            // (a non-blocking call: the parked ones, which nothing else
            // watches, once).
            let d = driven.get_or_insert_with(|| Driven::claim(self.arc(), nonblock));
            if nonblock && d.conns.is_empty() {
                // SAFETY: the application's msghdr (contract).
                return unsafe { self.held_or_again(msg, flags, None) };
            }
            if let Some(eng) = d.eng {
                // A datagram the program's poll read waits in a
                // connection's buffer (the common case after a poll): served
                // with no system call, blocking or not. Its connection is
                // parked, so among those claimed (`Conn::held`).
                for (c, fd) in &d.conns {
                    if c.held.swap(false, Ordering::Relaxed) && c.still(*fd) {
                        let peer = self.peer();
                        // SAFETY: the application's msghdr (contract).
                        let served = unsafe { self.serve(eng, c, msg, flags, Via::Direct, peer) };
                        if let Served::Dgram(n) = served {
                            d.park = true;
                            return n;
                        }
                    }
                }
            }
            if nonblock {
                if let Some(eng) = d.eng.filter(|_| d.all_up()) {
                    // A non-blocking call reads a lone parked connection at
                    // once: one system call when nothing is there, as on a
                    // kernel UDP socket. Several are polled at once below
                    // (one call, not a read each: the sources behind the
                    // doorbell and the kernel socket were just looked at
                    // by `take`).
                    if let [(c, fd)] = &d.conns[..] {
                        if c.still(*fd) {
                            looks += 1;
                            // SAFETY: the application's msghdr (contract).
                            match unsafe {
                                self.serve(eng, c, msg, flags, Via::Direct, self.peer())
                            } {
                                Served::Dgram(n) => {
                                    d.park = true;
                                    return n;
                                }
                                // Nothing, and the connection still reads:
                                // `EAGAIN` now. `take` looked at the other
                                // sources just before; another pass (the
                                // socket's lock, the ready list) per spin
                                // of a busy-poll loop found nothing new.
                                Served::Nothing | Served::Spent if c.still_reading(*fd) => {
                                    d.park = true;
                                    // SAFETY: the application's msghdr.
                                    return unsafe { self.held_or_again(msg, flags, Some(looks)) };
                                }
                                Served::Nothing | Served::Spent => {}
                            }
                        }
                        d.prune();
                        continue;
                    }
                }
            }
            if let (None, Some(now)) = (spin_until, now) {
                let bp = config::get().busy_poll.unwrap_or(Duration::ZERO);
                spin_until = Some(deadline.map_or(now + bp, |dl| dl.min(now + bp)));
            }
            let spinning = now.is_some_and(|now| spin_until.is_some_and(|t| now < t));
            let mut p: SmallVec<[libc::pollfd; 2 + DRIVEN_INLINE]> = SmallVec::new();
            for fd in [self.bell.app, self.udp]
                .into_iter()
                .chain(d.conns.iter().map(|c| c.1))
            {
                p.push(libc::pollfd {
                    fd,
                    events: libc::POLLIN,
                    revents: 0,
                });
            }
            // Raw (`sys::poll`): libc's `poll` is a cancellation point,
            // whose `pthread_cancel` unwound through the library (the
            // process aborted); the cancel's signal ends the raw sleep, the
            // call fails with `EINTR` and its entry point acts on it.
            let n = sys::poll(&mut p, if spinning { 0 } else { wait });
            looks += u64::from(nonblock);
            if n < 0 && errno() == libc::EINTR && sys::signal_ends_call() {
                set_errno(libc::EINTR);
                return -1;
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
                            if c.hint.load(Ordering::Relaxed) == HINT_UP && r & libc::POLLIN != 0 {
                                // Delivering: this call reads it itself
                                // (no ready list, no doorbell, no change of
                                // the progress thread's watch).
                                // SAFETY: the application's msghdr (contract).
                                let served = unsafe {
                                    self.serve(eng, c, msg, flags, Via::Direct, self.peer())
                                };
                                if let Served::Dgram(n) = served {
                                    d.park = true;
                                    return n;
                                }
                            } else {
                                // poll and epoll share their bit values on Linux.
                                c.handle(eng, &d.sock, (r & !libc::POLLNVAL) as u16 as u32, true);
                            }
                        }
                        stale |= !c.still(*fd) || !c.reading();
                    }
                }
                if stale {
                    d.prune();
                }
            }
        }
    }

    /// One pass over the sources; `None` if none had anything.
    ///
    /// # Safety
    /// `msg` must be a valid msghdr whose buffers are writable.
    unsafe fn take(
        &self,
        msg: &mut msghdr,
        flags: c_int,
        namelen: libc::socklen_t,
        ctllen: usize,
        udp_hint: &mut bool,
    ) -> Option<isize> {
        // Bounded: each round serves, or drains a connection off the list.
        // A connection whose steps ran out (`Served::Spent`) is served once
        // a call: it is listed again at the back, behind the others.
        let mut spent: Option<Arc<Conn>> = None;
        for _ in 0..64 {
            let mut resume = Vec::new();
            let mut found = Vec::new();
            // SAFETY: the application's msghdr (contract).
            let pick = unsafe {
                self.pick(
                    msg,
                    flags,
                    namelen,
                    ctllen,
                    *udp_hint,
                    &mut found,
                    &mut resume,
                )
            };
            if matches!(pick, Pick::Again) {
                *udp_hint = true;
            }
            if !found.is_empty() || !resume.is_empty() {
                let e = errno();
                if let Some(eng) = reactor::current() {
                    self.proved(eng, found);
                    let me = self.arc();
                    for c in resume {
                        // Whole frames may wait in its buffer, which no
                        // readiness event announces: take them now.
                        c.set_interest(eng, Some(true), None);
                        c.handle(eng, &me, EPOLLIN, false);
                    }
                }
                set_errno(e);
            }
            match pick {
                Pick::Done(r) => return Some(r),
                Pick::Conn(c) => {
                    if spent.as_ref().is_some_and(|s| Arc::ptr_eq(s, &c)) {
                        // Round the list: the rest is the next call's.
                        return None;
                    }
                    let eng = reactor::current()?;
                    let peer = self.peer();
                    // SAFETY: the application's msghdr (contract).
                    match unsafe { self.serve(eng, &c, msg, flags, Via::Ready, peer) } {
                        Served::Dgram(r) => return Some(r),
                        Served::Spent => spent = Some(c),
                        Served::Nothing => {}
                    }
                }
                Pick::Again => {}
                Pick::Nothing => return None,
            }
        }
        None
    }

    /// Looks at the sources once (under `inner`): returns a datagram from
    /// the queue or the kernel socket, or the ready connection to serve.
    ///
    /// # Safety
    /// `msg` must be a valid msghdr whose buffers are writable.
    #[allow(clippy::too_many_arguments)]
    unsafe fn pick(
        &self,
        msg: &mut msghdr,
        flags: c_int,
        namelen: libc::socklen_t,
        ctllen: usize,
        udp_hint: bool,
        found: &mut Vec<(SocketAddr, [u8; NONCE_LEN])>,
        resume: &mut Vec<Arc<Conn>>,
    ) -> Pick {
        let peek = flags & libc::MSG_PEEK != 0;
        let mut g = lock(&self.inner);
        // Both kinds of source hold datagrams: take turns. A peek takes no
        // turn: the receive after it returns the datagram it saw (as
        // `Sock::next_size` sizes it).
        let udp_first = !g.udp_turn;
        if !peek {
            g.udp_turn = udp_first;
        }
        let tcp = !g.rxq.is_empty() || !g.ready.is_empty();
        if udp_first && g.udp_maybe && tcp {
            // SAFETY: the application's msghdr (contract).
            if let Some(r) = unsafe { self.recv_kernel(&mut g, msg, flags, namelen, ctllen, found) }
            {
                return Pick::Done(r);
            }
        }
        if let Some(d) = g.rxq.front() {
            // SAFETY: msg_iov describes writable iovecs (contract).
            let copied = unsafe { iov::scatter(msg.msg_iov, msg.msg_iovlen, &d.data) };
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
                let charge = full + DGRAM_OVERHEAD;
                let left = self.rx_bytes.fetch_sub(charge, Ordering::Relaxed) - charge;
                let n = self.rx_dgrams.fetch_sub(1, Ordering::Relaxed) - 1;
                let cfg = config::get();
                if !g.paused.is_empty() && left <= cfg.rcvbuf / 2 && n <= cfg.rcvq_dgrams / 2 {
                    resume.append(&mut g.paused);
                }
            }
            // Datagrams a receive call read itself were queued without a
            // doorbell: ring for what is left.
            if (!g.rxq.is_empty() || !g.ready.is_empty()) && g.bells == 0 {
                self.ring(&mut g);
            }
            self.settle(&mut g);
            return Pick::Done(if flags & libc::MSG_TRUNC != 0 {
                full
            } else {
                copied
            } as isize);
        }
        if let Some(c) = g.ready.front() {
            return Pick::Conn(c.clone());
        }
        if g.udp_maybe || udp_hint || self.gro_pending() {
            // SAFETY: the application's msghdr (contract).
            return match unsafe { self.recv_kernel(&mut g, msg, flags, namelen, ctllen, found) } {
                Some(r) => Pick::Done(r),
                None if found.is_empty() => {
                    g.udp_maybe = false;
                    self.settle(&mut g);
                    Pick::Nothing
                }
                // A proof was read: look again.
                None => Pick::Again,
            };
        }
        self.settle(&mut g);
        Pick::Nothing
    }

    /// Receives from the hidden kernel UDP socket into the program's
    /// `msg` (caller holds `inner`). While accepted connections wait for
    /// the proof of their port, proof datagrams are taken off first (into
    /// `found`) and never returned to the program. Returns the call's
    /// result, or `None` when nothing (but maybe a proof) was there.
    ///
    /// # Safety
    /// `msg` must be a valid msghdr whose buffers are writable.
    unsafe fn recv_kernel(
        &self,
        g: &mut Inner,
        msg: &mut msghdr,
        flags: c_int,
        namelen: libc::socklen_t,
        ctllen: usize,
        found: &mut Vec<(SocketAddr, [u8; NONCE_LEN])>,
    ) -> Option<isize> {
        let peek = flags & libc::MSG_PEEK != 0;
        let (_proofs, head) = self.proofs_off(g, found);
        #[cfg(feature = "test-hooks")]
        if !found.is_empty() {
            proof_gap();
        }
        if !head {
            // Nothing was left: what arrived since may be a re-sent copy
            // of a proof. Its arrival rings the doorbell (`on_udp_ready`),
            // and the next look takes proofs off first again.
            return None;
        }
        msg.msg_namelen = namelen;
        msg.msg_controllen = ctllen;
        if let Some(gro) = &self.gro {
            // UDP_GRO is on: coalesced buffers are cut here. Only in `gso`
            // mode, where no socket listens: no proof is ever due, so none
            // can be in these buffers (tests/attacks.rs
            // `a_gro_receiver_accepts_no_connection`).
            debug_assert!(_proofs.is_none(), "UDP_GRO on a socket awaiting proofs");
            // SAFETY: the application's msghdr (contract).
            let r = unsafe { self.gro_recv(&mut lock(gro), msg, flags) };
            if r.is_some() {
                self.gro_served(g, peek);
            }
            return r;
        }
        // SAFETY: the application's msghdr, passed to its kernel socket.
        let r = unsafe { sys::recvmsg_raw(self.udp, msg, flags | libc::MSG_DONTWAIT) };
        if r < 0 {
            let e = errno();
            if e != libc::EAGAIN {
                return Some(-1);
            }
            return None;
        }
        if _proofs.is_some() && r == PROOF_LEN as isize && !peek {
            // A proof that arrived after the look at the head.
            let mut head = Vec::with_capacity(PROOF_LEN);
            // SAFETY: the iovecs were just written by the kernel.
            for part in unsafe { iov::parts(msg.msg_iov, msg.msg_iovlen) } {
                head.extend_from_slice(&part[..part.len().min(PROOF_LEN - head.len())]);
            }
            if let Some(n) = frame::parse_proof(&head) {
                // SAFETY: the kernel wrote msg_namelen bytes of address.
                match unsafe { sys::addr_from_raw(msg.msg_name.cast(), msg.msg_namelen) } {
                    Some(src) => found.push((src, n)),
                    None => stats::inc(&STATS.proofs_bad),
                }
                return None;
            }
        }
        if !peek {
            stats::inc(&STATS.rx_kernel_dgrams);
        }
        if g.bells > 0 && !peek && !self.udp_readable() {
            g.udp_maybe = false;
            self.settle(g);
        }
        Some(r)
    }
}

impl Sock {
    /// A program's poll is about to wait for input: its connections (armed
    /// ones, at most 16) are watched by that poll too, claimed from the
    /// progress thread meanwhile.
    pub(super) fn wait_begin(&self) -> Option<Wait> {
        let d = Driven::claim(self.arc(), false);
        if d.conns.is_empty() {
            return None;
        }
        if let Some(eng) = d.eng {
            for (c, fd) in &d.conns {
                if c.held.load(Ordering::Relaxed) && c.still(*fd) {
                    // An earlier poll read a datagram the program has not
                    // received yet: announced the long way (ready list and
                    // doorbell; no longer held from then on), so that this
                    // poll returns at once. A program polls twice without
                    // receiving rarely.
                    c.handle(eng, &d.sock, EPOLLIN, false);
                }
            }
        }
        let (mut fds, mut claim) = spare::take();
        fds.extend(d.conns.iter().map(|c| c.1));
        *claim = Some(d);
        Some(Wait {
            fds,
            claim,
            chunked: false,
        })
    }

    /// The poll returned: a whole datagram waiting on a connection is read
    /// into its buffer (`hold_frame`) and makes the descriptor readable,
    /// for the program's next receive to serve from the parked connection
    /// with no system call; other input is taken up the long way
    /// (the connection joins the ready list, the doorbell rings, so the
    /// descriptor stays readable for whoever looks next). The connections
    /// stay parked (`super::park`). Returns whether anything is there to
    /// receive.
    pub(super) fn wait_end(&self, wait: Wait, revents: &[i16]) -> bool {
        let Ok(mut held) = wait.claim.downcast::<Option<Driven>>() else {
            return false;
        };
        let Some(mut d) = held.take() else {
            return false;
        };
        spare::give(wait.fds, held);
        let mut waiting = false;
        if let Some(eng) = d.eng {
            let peer = lock(&self.inner).peer;
            for ((c, fd), r) in d.conns.iter().zip(revents) {
                waiting |= matches!(self.woke(eng, c, *fd, *r, peer), Woke::Held);
            }
        }
        // Parked, not given back: the program receives next (or waits
        // again, which takes them over), so a round trip makes no
        // `epoll_ctl` (those `handle` moved to the ready list stay there).
        d.park = true;
        drop(d);
        // A held datagram answers already (the common wake-up): no lock.
        waiting || self.queued_any()
    }

    /// Whether the socket's queue or ready list holds anything (the
    /// doorbell rings for both; input taken up by a wait's `handle` rang
    /// none).
    fn queued_any(&self) -> bool {
        let g = lock(&self.inner);
        !g.rxq.is_empty() || !g.ready.is_empty()
    }

    /// What a program's wait found on connection `c` (`revents` of its
    /// descriptor `fd`, which the wait watched) is taken up: a whole
    /// datagram is read into its buffer (`hold_frame`: the program's next
    /// receive serves it from the parked connection with no system call);
    /// other input the long way (`Conn::handle`: the connection joins the
    /// ready list, and the descriptor stays readable for whoever looks
    /// next).
    fn woke(
        &self,
        eng: &'static reactor::Reactor,
        c: &Arc<Conn>,
        fd: c_int,
        revents: i16,
        peer: Option<SocketAddr>,
    ) -> Woke {
        let r = revents & (libc::POLLIN | libc::POLLERR | libc::POLLHUP);
        if r == 0 {
            return Woke::Nothing;
        }
        // `hold_frame` looks at the descriptor itself (under `st`).
        if r == libc::POLLIN && c.hint.load(Ordering::Relaxed) == HINT_UP && hold_frame(c, fd, peer)
        {
            stats::inc(&STATS.rx_poll_wakes);
            self.holds.fetch_add(1, Ordering::Release);
            if !self.holding_listed.load(Ordering::Relaxed) {
                held::listed(self);
            }
            return Woke::Held;
        }
        if !c.still(fd) {
            return Woke::Nothing;
        }
        stats::inc(&STATS.rx_poll_wakes);
        // poll and epoll share their bit values on Linux.
        c.handle(eng, &self.arc(), r as u16 as u32, false);
        Woke::Handled
    }

    /// A program's poll of this socket for input, its only managed
    /// descriptor among a few (`Socket::poll_alone`): the event loop's
    /// common shape, one established connection, parked, taken without the general path's
    /// claim of every connection, descriptor list and spare blocks
    /// (`Conn::take_parked`: a glance, and a poll that may wait counts
    /// itself a poller, which keeps the park timer off the connection);
    /// what woke the wait is taken up as `wait_end` takes it up (a hold
    /// on a connection given back meanwhile starts its hand-back timer,
    /// `Conn::held_unclaimed`), except that a wait that woke nothing on
    /// the connection takes no look at the socket's queue and ready list:
    /// with the caller reading, the queue stays empty, and what joins the
    /// ready list rings the doorbell, the program's descriptor, which the
    /// wait watched (but for a blocking receive in another thread, which
    /// lists a connection silently while it serves it, and rings for what
    /// is left when it returns). `None`, nothing done:
    /// any other shape (several connections, one not parked or not
    /// established, a datagram held already, no caller-driven receive).
    pub(super) fn poll_alone(
        &self,
        fds: &mut [libc::pollfd],
        at: usize,
        left: Option<Duration>,
        wait: crate::shim::socket::PollCall<'_>,
    ) -> Option<c_int> {
        if !config::get().caller_recv || fds.len() > POLL_ALONE_MAX || at >= fds.len() {
            return None;
        }
        let eng = reactor::current()?;
        let (c, peer) = {
            let g = lock(&self.inner);
            if g.owned.len() != 1 {
                return None;
            }
            (g.owned.values().next()?.clone(), g.peer)
        };
        if c.hint.load(Ordering::Relaxed) != HINT_UP || c.held.load(Ordering::Relaxed) {
            // A datagram an earlier poll held is announced by the general
            // path (`wait_begin`).
            return None;
        }
        let waits = left != Some(Duration::ZERO);
        let fd = c.take_parked(waits)?;
        stats::inc(&STATS.rx_poll_alone);
        let (n, r) = poll_beside(fds, fd, left, wait);
        let e = if n < 0 { errno() } else { 0 };
        let readable = match self.woke(eng, &c, fd, r, peer) {
            Woke::Held => {
                // Not claimed: a wait in another thread may have given the
                // connection back meanwhile (`park::release_all`).
                c.held_unclaimed(eng);
                true
            }
            Woke::Handled => self.queued_any(),
            Woke::Nothing => false,
        };
        if waits {
            c.poll_done();
        }
        if n < 0 {
            set_errno(e);
            return Some(n);
        }
        if readable {
            fds[at].revents |= libc::POLLIN;
        }
        Some(n)
    }
}

/// The real call `wait` over the program's descriptors `fds` (at most
/// [`POLL_ALONE_MAX`]) and a connection's descriptor `fd`, watched for
/// input: the call's result, with `fds`' `revents` set, and `fd`'s.
#[inline]
fn poll_beside(
    fds: &mut [libc::pollfd],
    fd: c_int,
    left: Option<Duration>,
    wait: crate::shim::socket::PollCall<'_>,
) -> (c_int, i16) {
    let conn = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    if let [p] = fds {
        // The common case, on the stack as it is.
        let mut ext = [*p, conn];
        let n = wait(&mut ext, left);
        p.revents = ext[0].revents;
        return (n, ext[1].revents);
    }
    poll_among(fds, conn, left, wait)
}

/// [`poll_beside`] of several descriptors (out of line: the lone one's
/// case keeps its frame small).
#[inline(never)]
fn poll_among(
    fds: &mut [libc::pollfd],
    conn: libc::pollfd,
    left: Option<Duration>,
    wait: crate::shim::socket::PollCall<'_>,
) -> (c_int, i16) {
    let mut ext = [conn; POLL_ALONE_MAX + 1];
    let k = fds.len().min(POLL_ALONE_MAX);
    ext[..k].copy_from_slice(&fds[..k]);
    ext[k] = conn;
    let n = wait(&mut ext[..=k], left);
    for (p, x) in fds.iter_mut().zip(&ext[..k]) {
        p.revents = x.revents;
    }
    (n, ext[k].revents)
}

/// Sockets whose poll held a datagram (`hold_frame`): a wait that sees
/// them through their doorbells only (`select`, `epoll_wait`) announces
/// what they hold first ([`announce_held`]).
pub(super) mod held {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Weak};

    use super::{Conn, Sock, EPOLLIN};
    use crate::shim::reactor;
    use crate::shim::sys::lock;
    use warpsock_xsock::io::ForkLock;

    /// Listed sockets (each once: `Sock::holding_listed`), until the next
    /// wait takes the list. A child made by `fork` starts a list of its
    /// own ([`forget_after_fork`]).
    pub(in crate::udp) static LIST: ForkLock<Vec<Weak<Sock>>> = ForkLock::new();
    /// Whether `LIST` may hold any (one load per wait when none does).
    pub(in crate::udp) static ANY: AtomicBool = AtomicBool::new(false);

    /// In a child made by `fork` (its fork handler, the only thread): the
    /// listed sockets are the parent's (UDP kind, issue 12; as
    /// `park::forget_after_fork`). A child with an engine of its own
    /// announced them in its first `select` or `epoll_wait`
    /// ([`announce`]): it locked its copy of the list and each socket's
    /// state (held for good if a thread of the parent's held one at the
    /// fork: the child hung) and rang the doorbells of the parent's
    /// connections, which the two processes share (bytes the parent's
    /// books do not count). The child starts with none listed.
    pub(in crate::udp) fn forget_after_fork() {
        LIST.forget();
        ANY.store(false, Ordering::Release);
    }

    /// `sock`'s poll held a datagram and the socket is not listed: lists
    /// it (once per wait that took the list, not per poll).
    pub(super) fn listed(sock: &Sock) {
        if sock.holding_listed.swap(true, Ordering::Relaxed) {
            return;
        }
        LIST.lock().push(sock.weak());
        ANY.store(true, Ordering::Release);
    }

    /// See [`super::announce_held`].
    pub(super) fn announce() {
        // A load first: no locked instruction per wait when no poll held.
        if !ANY.load(Ordering::Relaxed) || !ANY.swap(false, Ordering::Acquire) {
            return;
        }
        let Some(eng) = reactor::current() else {
            return;
        };
        let socks = std::mem::take(&mut *LIST.lock());
        for s in socks.iter().filter_map(Weak::upgrade) {
            s.holding_listed.store(false, Ordering::Relaxed);
            let conns: Vec<Arc<Conn>> = lock(&s.inner)
                .owned
                .values()
                .filter(|c| c.held.load(Ordering::Relaxed))
                .cloned()
                .collect();
            for c in conns {
                // Ready list and doorbell, then no longer held.
                c.handle(eng, &s, EPOLLIN, false);
            }
        }
    }
}

/// A wait that sees offloaded sockets through their doorbells only
/// (`select`, `pselect`, the `epoll_wait` family) is about to look: a
/// datagram a poll read into a connection's buffer (`hold_frame`) makes
/// no readiness event, so it is announced now, in the caller's thread
/// (ready list and doorbell), not by the progress thread's timer after the
/// connection is given back: a `select` or `epoll_wait` with no timeout
/// said "not readable" while it waited. One atomic load when no poll held
/// anything.
pub(crate) fn announce_held() {
    held::announce();
}

/// `WARPSOCK_TEST_PROOF_GAP_MS`: the first receive call that takes a proof
/// off the hidden UDP socket waits this long before it reads the socket for
/// the program (as if descheduled): the proof's answer is then late, and
/// the connector's re-sent copy arrives meanwhile.
#[cfg(feature = "test-hooks")]
fn proof_gap() {
    use std::sync::atomic::AtomicBool;
    use std::sync::OnceLock;
    static MS: OnceLock<Option<u64>> = OnceLock::new();
    static FIRED: AtomicBool = AtomicBool::new(false);
    let ms = *MS.get_or_init(|| {
        std::env::var("WARPSOCK_TEST_PROOF_GAP_MS")
            .ok()
            .and_then(|v| v.trim().parse().ok())
    });
    if let Some(ms) = ms {
        if !FIRED.swap(true, Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(ms));
        }
    }
}
