//! Receive calls served straight from the connections' buffers (the fast
//! path; `WARPSOCK_CALLER_RECV`, on by default).
//!
//! An established connection is either *armed* (the progress thread watches
//! it for input) or *ready* (on its socket's ready list). The progress
//! thread does not read a ready connection: when input arrives on an armed
//! one it moves it to the ready list and rings the doorbell, and that is
//! all; further arrivals on a ready connection (watched edge-triggered) ring
//! again, so that edge-triggered waiters wake per arrival as with kernel
//! UDP. The program's own receive calls then read the connection in
//! large chunks (up to the 256 KiB buffer per system call) and copy each
//! datagram from the buffer straight into the program's buffer: one copy,
//! no allocation and no thread hand-off per datagram. The ready list is
//! served round robin, one datagram per connection in turn, so no sender
//! can starve another. After a datagram, a connection with no whole
//! datagram left is read once more; only when that finds nothing is it
//! taken off the list and armed again (or, parked, left parked:
//! `super::park`), so that the program's descriptor
//! stays readable exactly while a receive call would return something.
//! A serve takes at most [`SERVE_STEPS`] discards and reads (frames a
//! connected socket discards, reads of a partial frame), and a receive
//! call serves a connection whose steps ran out no more ([`Served::Spent`]):
//! a flood from a peer the socket does not hear cannot keep it reading.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use libc::{c_int, msghdr};

use super::conn::{Conn, ConnSt, Rd};
use super::core::frame::{Parsed, CTRL_PROVEN, HDR_LEN};
use super::core::setup::Phase;
use super::sock::Sock;
use super::stats::{self, STATS};
use crate::shim::iov;
use crate::shim::reactor::Reactor;
use crate::shim::sys::{self, lock};

#[cfg(test)]
mod tests;

/// How a receive call came to serve a connection ([`Sock::serve`]).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Via {
    /// It is the front of the ready list.
    Ready,
    /// The call polled or claimed it, or a poll held its datagram.
    Direct,
    /// [`Sock::recv_lone`]: as `Direct`, after a look under the socket's
    /// lock that found its queue and ready list empty and no doorbell.
    Lone,
}

/// What serving one connection gave.
pub(super) enum Served {
    /// A datagram, and the call's return value.
    Dgram(isize),
    /// Nothing (the connection is drained, or closed).
    Nothing,
    /// Nothing yet: [`SERVE_STEPS`] discards and reads ran out before the
    /// connection's input did (a flood from a peer a connected socket does
    /// not hear). What is in hand stays announced; the call answers as it
    /// answers with nothing (`EAGAIN`, or its wait), and does not serve the
    /// connection again (`Sock::take`).
    Spent,
}

/// How many steps one [`Sock::serve`] takes before a discard or a read: a
/// frame discarded (a connected socket hears its peer only), or a read of
/// a partial frame. Past it the serve ends with [`Served::Spent`], the
/// rest left for the next call: a connection from a peer the socket does
/// not hear, flooded faster than the call discards, kept one call reading
/// for as long as the flood lasted, holding the connection's locks
/// (`order`, which the progress thread takes for each of the connection's
/// events) and its CPU. A deliverable whole frame is served whatever the
/// count (the read that completed it may be the last step).
pub(super) const SERVE_STEPS: usize = 64;

/// Whether a whole frame waits at the front of the buffer.
fn whole_frame(st: &ConnSt) -> bool {
    matches!(st.rx.peek(), Parsed::Frame(_) | Parsed::Control(..))
}

/// A poll saw `conn`'s descriptor `fd` readable: reads what waits into the
/// connection's buffer (the read the program's receive call would make
/// next) and says whether a whole datagram for the program is at its
/// front (then marked [`Conn::held`], under the connection's locks). Then
/// the program's descriptor reads as ready, the connection
/// stays parked, and the receive call serves the datagram from the buffer
/// with no system call (`Conn::held`; no ready list, no doorbell, no
/// `epoll_ctl`). This replaced a `MSG_PEEK` of the front (and, for
/// datagrams longer than the peek, a `SIOCINQ`): one system call per
/// datagram received on this path fewer. `false` sends the caller the long
/// way, which takes what was read from the buffer: bytes already in our
/// buffer, a partial, control or filtered frame, the end of the stream, an
/// error, nothing.
pub(super) fn hold_frame(conn: &Conn, fd: c_int, peer: Option<std::net::SocketAddr>) -> bool {
    // As `Sock::serve`: `order` first, held from reading until what was
    // read is announced (here by `held`, set before the locks go).
    let _order = lock(&conn.order);
    let mut st = lock(&conn.st);
    if st.fd != fd
        || !st.setup.delivering()
        || st.setup.unanswered()
        || !st.rx.pending().is_empty()
        || peer.is_some_and(|p| st.dest != Some(p))
    {
        return false;
    }
    if !matches!(Conn::read_some(&mut st), Rd::Data(_)) {
        return false;
    }
    match st.rx.peek() {
        Parsed::Frame(len) if len <= st.max_dgram => {
            stats::inc(&STATS.rx_poll_holds);
            conn.held.store(true, Ordering::Release);
            #[cfg(feature = "test-hooks")]
            super::events::handback_cue(b"h");
            true
        }
        _ => false,
    }
}

impl Sock {
    /// Puts `conn` on the ready list (its input is the receive calls' to
    /// read now) and stops the progress thread watching it; rings the
    /// doorbell if `ring` (a receive call that found the connection
    /// readable serves it without one).
    pub(super) fn mark_ready(&self, eng: &Reactor, conn: &Arc<Conn>, ring: bool) {
        let mut g = lock(&self.inner);
        if g.closed {
            return;
        }
        if !conn.ready.swap(true, Ordering::Relaxed) {
            g.ready.push_back(conn.clone());
            conn.set_ready(eng);
        }
        if ring {
            // One bell per arrival: a new edge for edge-triggered waiters.
            self.ring(&mut g);
        }
    }

    /// The socket's connected peer: a connected socket hears it only.
    pub(super) fn peer(&self) -> Option<std::net::SocketAddr> {
        lock(&self.inner).peer
    }

    /// Serves one datagram from `conn` into `msg`. `conn` is the front of
    /// the ready list: then it is rotated to the back (more to read) or
    /// armed again and taken off the list (drained). Or (`via` not
    /// [`Via::Ready`]) it is a connection the call reached itself (polled
    /// after claiming it, glanced at while parked, or holding a datagram a
    /// poll read): it stays watched as it was, and joins the ready list,
    /// with a doorbell, only if more is in hand.
    /// `peer` is the socket's connected peer ([`Sock::peer`], or read by
    /// the caller under the socket's lock it held anyway).
    ///
    /// # Safety
    /// `msg` must be a valid msghdr whose buffers are writable.
    pub(super) unsafe fn serve(
        &self,
        eng: &'static Reactor,
        conn: &Arc<Conn>,
        msg: &mut msghdr,
        flags: c_int,
        via: Via,
        peer: Option<std::net::SocketAddr>,
    ) -> Served {
        let direct = via != Via::Ready;
        let peek = flags & libc::MSG_PEEK != 0;
        let mut served = Served::Nothing;
        let mut more = false;
        let mut gone = None;
        // Held until the ready list says what was found (see below).
        let order = lock(&conn.order);
        let fd;
        {
            let mut st = lock(&conn.st);
            fd = st.fd;
            // Discards and reads so far (`SERVE_STEPS`), and whether they
            // ran out before the connection's input did.
            let mut steps = 0;
            let mut spent = false;
            while st.setup.delivering() {
                match st.rx.peek() {
                    Parsed::Frame(len) if len <= st.max_dgram => {
                        let Some(src) = st.dest else { break };
                        let payload = &st.rx.pending()[HDR_LEN..HDR_LEN + len];
                        if peer.is_some_and(|p| p != src) {
                            // A connected socket hears its peer only.
                            if steps == SERVE_STEPS {
                                spent = true;
                                break;
                            }
                            steps += 1;
                            stats::inc(&STATS.rx_filtered);
                            st.rx.consume(HDR_LEN + len);
                            continue;
                        }
                        // SAFETY: msg_iov describes writable iovecs (contract).
                        let copied = unsafe { iov::scatter(msg.msg_iov, msg.msg_iovlen, payload) };
                        if msg.msg_name.is_null() {
                            msg.msg_namelen = 0;
                        } else {
                            // SAFETY: msg_name is writable for msg_namelen bytes.
                            unsafe {
                                sys::addr_write(&src, msg.msg_name.cast(), &mut msg.msg_namelen);
                            }
                        }
                        msg.msg_controllen = 0;
                        msg.msg_flags = if copied < len { libc::MSG_TRUNC } else { 0 };
                        served = Served::Dgram(if flags & libc::MSG_TRUNC != 0 {
                            len
                        } else {
                            copied
                        } as isize);
                        if peek {
                            more = true;
                            break;
                        }
                        st.rx.consume(HDR_LEN + len);
                        conn.delivered.store(true, Ordering::Relaxed);
                        stats::inc(&STATS.rx_tcp_dgrams);
                        stats::inc(&STATS.rx_caller_dgrams);
                        stats::add(&STATS.rx_tcp_bytes, len as u64);
                        stats::stripe(conn.stripe.load(Ordering::Relaxed), false, 1);
                        // Readiness stays exact: keep the connection on the
                        // list only while a whole datagram is in hand.
                        more = whole_frame(&st);
                        // Look again even after a short read: a datagram
                        // that reached the socket since must keep the
                        // descriptor readable now, not once the progress
                        // thread notices it. (A direct read leaves the
                        // connection armed: the progress thread notices.)
                        while !more && !direct {
                            match Conn::read_some(&mut st) {
                                Rd::Data(_) => more = whole_frame(&st),
                                Rd::Again => break,
                                Rd::Eof | Rd::Err => {
                                    stats::inc(&STATS.conns_closed);
                                    gone = Some((conn.die(&mut st), st.dest));
                                    break;
                                }
                            }
                        }
                        break;
                    }
                    Parsed::Control(CTRL_PROVEN, len) if st.tcp_peer.is_none() => {
                        st.rx.consume(HDR_LEN + len);
                        st.setup.proven();
                    }
                    Parsed::Partial if steps == SERVE_STEPS => {
                        spent = true;
                        break;
                    }
                    Parsed::Partial => {
                        steps += 1;
                        match Conn::read_some(&mut st) {
                            Rd::Data(_) => {}
                            Rd::Again => break,
                            Rd::Eof | Rd::Err => {
                                stats::inc(&STATS.conns_closed);
                                gone = Some((conn.die(&mut st), st.dest));
                                break;
                            }
                        }
                    }
                    // Too long for its family, an unknown control frame, or
                    // not warpsock framing.
                    Parsed::Frame(_) | Parsed::Control(..) | Parsed::Invalid => {
                        stats::inc(&STATS.protocol_errors);
                        gone = Some((conn.die(&mut st), st.dest));
                        break;
                    }
                }
            }
            if spent {
                // The rest is the next call's, announced as any input in
                // hand is: a whole frame keeps the connection listed (at
                // the back) with a doorbell; a partial one waits for its
                // bytes in the socket, which the watch or the poll sees.
                stats::inc(&STATS.rx_serve_budget);
                served = Served::Spent;
                more = whole_frame(&st);
            }
            if st.setup.phase() == Phase::Dead {
                more = false;
            }
        }
        #[cfg(feature = "test-hooks")]
        if !more && !direct {
            crate::shim::hooks::serve_gap(fd);
        }
        #[cfg(not(feature = "test-hooks"))]
        let _ = fd;
        if via == Via::Lone && !more && gone.is_none() && !conn.ready.load(Ordering::Relaxed) {
            // The short path only (`recv_lone`): its look under the socket's
            // lock just before found the queue and the ready list empty and
            // no doorbell, this read left nothing in hand, and the
            // connection is not on the list (it joins under `order`, held
            // here): the update below would find nothing to change. (Any
            // other direct serve runs it: a blocking receive's poll loop
            // may have listed another connection without a doorbell,
            // `Conn::handle` from a caller, and this update rings for it.)
            drop(order);
            return served;
        }
        {
            // Still under `order`: the progress thread's `handle` of an
            // arrival since the last read (on a ready connection, watched
            // edge-triggered) reads it into the buffer and rings, under
            // `order`. Between that read and this update it rang for a
            // connection still on the list, which this update then took
            // off and armed (level-triggered, on an empty socket) and whose
            // bell `settle` drained: the datagrams sat in the buffer with
            // nothing to announce them, a lost wake-up for edge-triggered
            // epoll and for blocking receives alike. Now it handles the
            // arrival after this update, as on an armed connection.
            let mut g = lock(&self.inner);
            if let Some(i) = g.ready.iter().position(|c| Arc::ptr_eq(c, conn)) {
                let c = g.ready.remove(i).expect("index in range");
                if more {
                    g.ready.push_back(c);
                } else {
                    conn.ready.store(false, Ordering::Relaxed);
                    conn.drained(eng);
                }
            } else if direct && more && !g.closed && !conn.ready.swap(true, Ordering::Relaxed) {
                g.ready.push_back(conn.clone());
                conn.set_ready(eng);
            }
            if g.ready.is_empty() && g.rxq.is_empty() {
                self.settle(&mut g);
            } else if g.bells == 0 {
                // Served without a doorbell (the call found the connection
                // itself): the descriptor must read as ready for the rest.
                self.ring(&mut g);
            }
        }
        drop(order);
        if let Some((frames, dest)) = gone {
            self.conn_gone(eng, conn, dest, frames, false);
        }
        served
    }
}
