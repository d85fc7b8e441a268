//! What happens on a connection: readiness (connect completed, hello,
//! preamble, frames, EOF) and timers, handled by the progress thread or by
//! a blocking receive call that reads the connection itself. The decisions
//! are the core's ([`Setup`](super::core::setup::Setup), frames); this
//! module applies them to the connection and then to its socket.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use super::config;
use super::conn::{Conn, Rd, EPOLLERR, EPOLLHUP, EPOLLIN, EPOLLOUT, HINT_UP};
use super::core::frame::{self, ParsedPreamble, HELLO_LEN};
use super::core::setup::{Awaited, GiveUp, Phase, Step};
use super::sock::{norm, Sock};
use super::stats::{self, STATS};
use crate::shim::reactor::{Handling, Reactor};
use crate::shim::sys::{self, lock};

/// Most bytes read from one connection per readiness event (fairness).
const READ_BUDGET: usize = 1 << 20;
/// A caller-driven read that finds this many datagrams at once is serving a
/// stream: the next `STREAM_SKIP` blocking waits leave reading to the
/// progress thread, which then reads while the application consumes.
const STREAM_BATCH: usize = 16;
pub(super) const STREAM_SKIP: usize = 256;

impl Conn {
    /// Progress thread: a timer may have expired. Returns true once the
    /// connection no longer needs timers.
    pub(super) fn on_timer(
        self: &Arc<Self>,
        eng: &'static Reactor,
        sock: &Arc<Sock>,
        now: Instant,
    ) -> bool {
        let _busy = Handling::enter();
        let cfg = config::get();
        let mut st = lock(&self.st);
        if st.setup.timers_done() {
            return true;
        }
        if st.setup.deadline().is_none_or(|d| d > now) {
            return false;
        }
        // The answer may already be waiting: the thread can reach its timers
        // late (descheduled, or busy with other events) after the socket
        // became ready. Then handle the event, not the timeout.
        let want = match st.setup.awaited() {
            Awaited::Writable => libc::POLLOUT,
            Awaited::Readable => libc::POLLIN,
            Awaited::Nothing => 0,
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
                self.handle(eng, sock, p[0].revents as u16 as u32, false);
                return false;
            }
        }
        let mut now_udp = Vec::new();
        let (give_up, fallback) = match st.setup.on_timer(now, &cfg.timing) {
            Step::Wait | Step::Retry => (false, false),
            Step::Connect => match self.start_attempt(&mut st, eng, sock.family, sock.udp) {
                Ok(()) => (false, false),
                Err(_) => (self.note_failure(&mut st, &mut now_udp), true),
            },
            Step::ConnectTimedOut => (self.note_failure(&mut st, &mut now_udp), true),
            Step::GiveUp(GiveUp::Exhausted) => (true, true),
            Step::GiveUp(GiveUp::NotWarpsock) => {
                // Something accepted but does not speak warpsock: not a peer.
                stats::inc(&STATS.hello_failed);
                (true, true)
            }
            Step::Close => {
                // An accepted connection that never named its sender.
                stats::inc(&STATS.preamble_timeouts);
                (true, false)
            }
        };
        let dest = st.dest;
        if give_up {
            let mut frames = self.die(&mut st);
            drop(st);
            now_udp.append(&mut frames);
            sock.conn_gone(eng, self, dest, now_udp, fallback);
            return true;
        }
        drop(st);
        if let (Some(d), false) = (dest, now_udp.is_empty()) {
            sock.send_frames_udp(&d, &now_udp);
        }
        false
    }

    /// Readiness on the connection's socket, handled by the progress thread
    /// or (`from_caller`) by a blocking receive call that reads the
    /// connection itself: that call takes what arrived at once, so no
    /// doorbell is rung for it.
    pub(super) fn handle(
        self: &Arc<Self>,
        eng: &'static Reactor,
        sock: &Arc<Sock>,
        bits: u32,
        from_caller: bool,
    ) {
        // A connection that dies here hands its queued datagrams to kernel
        // UDP after it stops counting as pending: exit waits for that too.
        let _busy = Handling::enter();
        let _order = lock(&self.order);
        let mut dgrams: Vec<Vec<u8>> = Vec::new();
        let mut gone: Option<(Vec<Vec<u8>>, bool)> = None;
        let mut adopt = None;
        let mut pause = false;
        let mut src = None;
        let mut now_udp = Vec::new();
        {
            let mut st = lock(&self.st);
            match st.setup.phase() {
                Phase::Connecting if bits & (EPOLLOUT | EPOLLERR | EPOLLHUP) != 0 => {
                    let err =
                        sys::get_int(st.fd, libc::SOL_SOCKET, libc::SO_ERROR).unwrap_or(libc::EIO);
                    if err == 0 {
                        st.setup.connected(Instant::now(), &config::get().timing);
                        self.set_interest(eng, Some(true), Some(false));
                    } else if self.note_failure(&mut st, &mut now_udp) {
                        gone = Some((self.die(&mut st), true));
                    }
                }
                Phase::AwaitHello if bits & (EPOLLIN | EPOLLERR | EPOLLHUP) != 0 => {
                    let r = Self::read_some(&mut st);
                    if st.rx.pending().len() >= HELLO_LEN {
                        let hello = &st.rx.pending()[..HELLO_LEN];
                        if frame::check_hello(hello) {
                            let caps = frame::hello_caps(hello);
                            st.rx.consume(HELLO_LEN);
                            // A striped connection names its group, if the
                            // acceptor understands it (an older one gets
                            // the plain preamble: its stripes are then
                            // independent connections from one source).
                            // Nothing is written before the hello, so the
                            // preamble is still at the front.
                            if let Some(x) = st.stripe {
                                if caps & frame::CAP_STRIPES != 0 && st.tx.stripe(x) {
                                    stats::inc(&STATS.stripe_ext_sent);
                                }
                            }
                            st.setup.established();
                            self.hint.store(HINT_UP, Ordering::Relaxed);
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
                        && self.note_failure(&mut st, &mut now_udp)
                    {
                        gone = Some((self.die(&mut st), true));
                    }
                }
                Phase::AwaitPreamble | Phase::Established => {
                    if bits & EPOLLOUT != 0
                        && st.setup.phase() == Phase::Established
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
                                if st.setup.phase() == Phase::AwaitPreamble {
                                    match (frame::parse_preamble(st.rx.pending()), st.tcp_peer) {
                                        (ParsedPreamble::Done(p, used), Some(peer)) => {
                                            st.rx.consume(used);
                                            let remote = norm(
                                                SocketAddr::new(peer.ip(), p.port),
                                                sock.family,
                                            );
                                            st.dest = Some(remote);
                                            st.setup.established();
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
                                if st.setup.phase() == Phase::Established {
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
                && st.setup.phase() == Phase::Established
                && st.tx.is_idle()
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
