//! What happens on a connection: readiness (connect completed, hello,
//! preamble, frames, EOF), the proof of an accepted connection's port, and
//! timers, handled by the progress thread or by a blocking receive call
//! that reads the connection itself. The decisions are the core's
//! ([`Setup`](super::core::setup::Setup), frames, policy); this module
//! applies them to the connection and then to its socket.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use super::config;
use super::conn::{
    max_dgram, Conn, ConnSt, Parse, Rd, EPOLLERR, EPOLLHUP, EPOLLIN, EPOLLOUT, HINT_UP,
};
use super::core::frame::{self, ParsedHello, ParsedPreamble, CTRL_PROVEN};
use super::core::policy::canonical;
use super::core::routes::Adopted;
use super::core::rxbuf::RXBUF;
use super::core::setup::{Awaited, GiveUp, Phase, Step};
use super::sock::{norm, Sock};
use super::stats::{self, STATS};
use crate::shim::reactor::{Handling, Reactor};
use crate::shim::sys::{self, lock};

/// Most bytes read from one connection per readiness event (fairness).
const READ_BUDGET: usize = 1 << 20;

/// Whether the socket `fd` has input waiting (or an error, or EOF).
fn readable(fd: libc::c_int) -> bool {
    let mut p = [libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    }];
    fd >= 0 && sys::poll(&mut p, 0) > 0 && p[0].revents != 0
}

/// What handling an event decided for the socket, applied once the
/// connection's locks are released.
#[derive(Default)]
struct Outcome {
    dgrams: Vec<Vec<u8>>,
    /// The connection is closed: its unsent datagrams, and whether the
    /// destination falls back to kernel UDP.
    gone: Option<(Vec<Vec<u8>>, bool)>,
    /// The accepted connection's sender is proved: (remote, stripe group).
    proved: Option<(SocketAddr, u32)>,
    /// The receive queue is full: stop reading until it has room.
    pause: bool,
    /// Input for the receive calls to read themselves (`super::serve`).
    ready: bool,

    src: Option<SocketAddr>,
    /// Datagrams taken out of a failed attempt, to go by kernel UDP now.
    now_udp: Vec<Vec<u8>>,
}

impl Conn {
    /// Progress thread: a timer may have expired (a set-up deadline, or a
    /// batch's tail to write). Returns true once the connection is closed
    /// (a live one stays on the timer list: its batches arm it).
    pub(super) fn on_timer(
        self: &Arc<Self>,
        eng: &'static Reactor,
        sock: &Arc<Sock>,
        now: Instant,
    ) -> bool {
        let _busy = Handling::enter();
        // Parked too long: whoever waits for the program's descriptor now
        // relies on the doorbell (`super::park`).
        self.unpark(eng, Some(now));
        if self.take_handback() && self.held.load(Ordering::Relaxed) {
            // A datagram a poll read waits in the buffer of a connection
            // given back since (`Conn::held`): the ready list and a
            // doorbell announce it, as an arrival would be, and only then
            // is it no longer held (`handle`). A receive call that took
            // the connection over first served it (and cleared `held`);
            // one that comes meanwhile finds it held or on the list. (It
            // was un-held first: a non-blocking receive between the two
            // found it in neither place and returned `EAGAIN` although the
            // poll had said readable.)
            #[cfg(feature = "test-hooks")]
            handback_gap();
            self.handle(eng, sock, EPOLLIN, false);
            #[cfg(feature = "test-hooks")]
            handback_cue(b"d");
        }
        let cfg = config::get();
        let mut st = lock(&self.st);
        if st.setup.phase() == Phase::Dead {
            return true;
        }
        if st.flush_at.is_some_and(|t| t <= now) {
            st.flush_at = None;
            if st.setup.phase() == Phase::Established && !st.tx.is_idle() {
                stats::inc(&STATS.tx_tail_flushes);
                if self.flush(&mut st, eng).is_err() {
                    stats::inc(&STATS.conns_closed);
                    let frames = self.die(&mut st);
                    let dest = st.dest;
                    drop(st);
                    sock.conn_gone(eng, self, dest, frames, false);
                    return true;
                }
            }
        }
        if st.setup.timers_done() || st.setup.deadline().is_none_or(|d| d > now) {
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
            #[cfg(feature = "test-hooks")]
            let wait_ms = crate::shim::hooks::late_timer_answer_wait_ms();
            #[cfg(not(feature = "test-hooks"))]
            let wait_ms = 0;
            if sys::poll(&mut p, wait_ms) > 0 && p[0].revents != 0 {
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
                // An accepted connection that never named (or proved) its
                // sender.
                stats::inc(&STATS.preamble_timeouts);
                (true, false)
            }
            Step::SendProof => {
                if let (Some(d), Some(n)) = (st.dest, st.proof) {
                    sock.send_proof(&d, &n);
                }
                (false, false)
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

    /// A proof datagram carrying this accepted connection's nonce came from
    /// `src` (by kernel UDP, to the socket's port). It proves the port the
    /// preamble claims if it came from the connection's TCP peer address
    /// with that port; then the connection delivers from now on.
    pub(super) fn prove_from(
        self: &Arc<Self>,
        eng: &'static Reactor,
        sock: &Arc<Sock>,
        src: SocketAddr,
    ) {
        let _busy = Handling::enter();
        let mut out = Outcome::default();
        let order = lock(&self.order);
        {
            let mut st = lock(&self.st);
            let peer = st.tcp_peer.map(|p| canonical(p.ip()));
            if peer != Some(canonical(src.ip())) {
                stats::inc(&STATS.proofs_bad);
                return;
            }
            let src = norm(src, sock.family);
            st.proved_src = Some(src);
            if st.setup.phase() == Phase::AwaitProof {
                if st.dest == Some(src) {
                    self.now_proven(&mut st, eng, &mut out);
                } else {
                    // A proof of another port than the one claimed.
                    stats::inc(&STATS.proofs_bad);
                }
            }
            out.src = st.dest;
        }
        let adopted = self.adopt_proved(sock, &mut out);
        drop(order);
        let proved = adopted.is_some();
        self.apply(eng, sock, out, adopted, false);
        if proved {
            // Input held back until now.
            self.handle(eng, sock, EPOLLIN, false);
        }
    }

    /// The accepted connection's port is proved (caller holds `st`):
    /// deliver from now on, and tell the connector to stop re-sending.
    fn now_proven(&self, st: &mut ConnSt, eng: &Reactor, out: &mut Outcome) {
        st.setup.established();
        self.hint.store(HINT_UP, Ordering::Relaxed);
        stats::inc(&STATS.proofs_ok);
        st.tx.push_control(CTRL_PROVEN);
        if self.flush(st, eng).is_err() {
            out.gone = Some((self.die(st), false));
            return;
        }
        self.set_interest(eng, Some(true), None);
        if let Some(d) = st.dest {
            out.proved = Some((d, st.group));
        }
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
        let mut out = Outcome::default();
        {
            let mut st = lock(&self.st);
            match st.setup.phase() {
                Phase::Connecting if bits & (EPOLLOUT | EPOLLERR | EPOLLHUP) != 0 => {
                    let err =
                        sys::get_int(st.fd, libc::SOL_SOCKET, libc::SO_ERROR).unwrap_or(libc::EIO);
                    if err == 0 {
                        st.setup.connected(Instant::now(), &config::get().timing);
                        self.set_interest(eng, Some(true), Some(false));
                    } else if self.note_failure(&mut st, &mut out.now_udp) {
                        out.gone = Some((self.die(&mut st), true));
                    }
                }
                Phase::AwaitHello if bits & (EPOLLIN | EPOLLERR | EPOLLHUP) != 0 => {
                    self.on_hello(&mut st, eng, sock, &mut out);
                }
                Phase::AwaitPreamble | Phase::AwaitProof | Phase::Established => {
                    if bits & EPOLLOUT != 0
                        && st.setup.phase() == Phase::Established
                        && self.flush(&mut st, eng).is_err()
                    {
                        stats::inc(&STATS.conns_closed);
                        out.gone = Some((self.die(&mut st), false));
                    }
                    if out.gone.is_none() && bits & (EPOLLIN | EPOLLERR | EPOLLHUP) != 0 {
                        // Set-up bytes (preamble) take no room in the queue.
                        if st.setup.delivering()
                            && config::get().caller_recv
                            && bits & (EPOLLERR | EPOLLHUP) == 0
                        {
                            // Receive calls read it themselves; but the
                            // answer to our proof is read here, for a
                            // program that never receives.
                            if st.setup.unanswered() && !self.take_answer(&mut st) {
                                stats::inc(&STATS.protocol_errors);
                                out.gone = Some((self.die(&mut st), false));
                            } else if st.rx.pending().is_empty()
                                && matches!(Self::read_some(&mut st), Rd::Eof | Rd::Err)
                            {
                                // The peer closed: nothing for a receive
                                // call. A doorbell for an end of stream
                                // made the descriptor readable with nothing
                                // to receive (iperf 2's server then sat in
                                // a receive for its whole SO_RCVTIMEO, 4 s,
                                // at every test's end and at SIGTERM).
                                stats::inc(&STATS.conns_closed);
                                out.gone = Some((self.die(&mut st), false));
                            } else {
                                out.ready = !st.setup.unanswered() || !st.rx.pending().is_empty();
                            }
                        } else if st.setup.delivering()
                            && sock.rx_full()
                            && bits & (EPOLLERR | EPOLLHUP) == 0
                        {
                            out.pause = true;
                        } else {
                            self.read_frames(&mut st, eng, sock, &mut out);
                        }
                    }
                }
                _ => {}
            }
            if out.gone.is_none()
                && st.linger
                && st.setup.phase() == Phase::Established
                && st.tx.is_idle()
            {
                out.gone = Some((self.die(&mut st), false));
            }
            if out.gone.is_some() || !out.now_udp.is_empty() {
                out.src = out.src.or(st.dest);
            }
            // Readiness stays exact: ready only with input really there (a
            // receive call may have read what woke us already).
            out.ready =
                out.ready && out.gone.is_none() && (!st.rx.pending().is_empty() || readable(st.fd));
        }
        if std::mem::take(&mut out.ready) {
            // Under `order`, so no receive call takes the input between the
            // look above and the doorbell.
            sock.mark_ready(eng, self, !from_caller);
            // On the ready list now: a datagram a poll held is announced
            // there (after, not before: a receive call looks for it in
            // both places, `Sock::serve_held`).
            self.held.store(false, Ordering::Relaxed);
        }
        let adopted = self.adopt_proved(sock, &mut out);
        drop(_order);
        self.apply(eng, sock, out, adopted, from_caller);
    }

    /// Adopts the route of an accepted connection that just proved its
    /// sender (`out.proved`) while the caller still holds `order`, so that
    /// no receive call takes a datagram from the connection before the
    /// route to its sender exists: a program that answers the first
    /// datagram at once answers over it. (Adopted after `order`, such an
    /// answer could find no route and open a connection of its own: two
    /// connections where one serves, seen on a loaded machine.) What the
    /// adoption leaves to do (our failed connections replaced) is for
    /// [`Self::apply`], after `order`.
    fn adopt_proved(
        self: &Arc<Self>,
        sock: &Sock,
        out: &mut Outcome,
    ) -> Option<(SocketAddr, Adopted<Arc<Self>>)> {
        let (remote, group) = out.proved.take()?;
        #[cfg(feature = "test-hooks")]
        crate::shim::hooks::adopt_delay();
        sock.pending_done(self);
        Some((remote, sock.adopt(remote, self, group)))
    }

    /// Reads the connection while the acceptor's answer to our proof is
    /// due, taking that answer (a control frame) off the front. Returns
    /// false on a framing error.
    fn take_answer(&self, st: &mut ConnSt) -> bool {
        if st.rx.pending().is_empty() {
            let _ = Self::read_some(st);
        }
        loop {
            match st.rx.peek() {
                frame::Parsed::Control(CTRL_PROVEN, len) => {
                    st.rx.consume(frame::HDR_LEN + len);
                    st.setup.proven();
                }
                frame::Parsed::Control(..) | frame::Parsed::Invalid => return false,
                frame::Parsed::Frame(_) | frame::Parsed::Partial => return true,
            }
        }
    }

    /// The hello arrived (or the connection failed before it did).
    fn on_hello(&self, st: &mut ConnSt, eng: &Reactor, sock: &Sock, out: &mut Outcome) {
        let r = Self::read_some(st);
        match frame::parse_hello(st.rx.pending()) {
            ParsedHello::Done(h, used) => {
                st.rx.consume(used);
                // A striped connection names its group, if the acceptor
                // understands it (an older one gets the plain preamble: its
                // stripes are then independent connections from one
                // source). Nothing is written before the hello, so the
                // preamble is still at the front.
                if let Some(x) = st.stripe {
                    if h.caps & frame::CAP_STRIPES != 0 && st.tx.stripe(x) {
                        stats::inc(&STATS.stripe_ext_sent);
                    }
                }
                match h.nonce {
                    Some(n) => {
                        st.proof = Some(n);
                        st.setup.prove(Instant::now());
                        if let Some(d) = st.dest {
                            sock.send_proof(&d, &n);
                        }
                    }
                    None => st.setup.established(),
                }
                self.hint.store(HINT_UP, Ordering::Relaxed);
                stats::inc(&STATS.connect_ok);
                if self.flush(st, eng).is_err() {
                    out.gone = Some((self.die(st), false));
                    return;
                }
                self.set_interest(eng, Some(true), None);
                out.src = st.dest;
                if config::get().caller_recv {
                    // Receive calls read what came with the hello.
                    out.ready = !st.rx.pending().is_empty();
                    return;
                }
                let mut room = sock.room();
                match Self::parse(st, &mut out.dgrams, &mut room) {
                    Parse::Done => {}
                    Parse::Full => out.pause = true,
                    Parse::Bad => {
                        stats::inc(&STATS.protocol_errors);
                        out.gone = Some((self.die(st), false));
                    }
                }
            }
            ParsedHello::Invalid => {
                stats::inc(&STATS.hello_failed);
                out.gone = Some((self.die(st), true));
            }
            ParsedHello::Partial => {
                if matches!(r, Rd::Eof | Rd::Err) && self.note_failure(st, &mut out.now_udp) {
                    out.gone = Some((self.die(st), true));
                }
            }
        }
    }

    /// Reads the accepted or established connection: the preamble, then
    /// frames while the socket's queue has room. Until the port is proved
    /// nothing is delivered and at most half a buffer is read.
    fn read_frames(&self, st: &mut ConnSt, eng: &Reactor, sock: &Sock, out: &mut Outcome) {
        let mut budget = 0;
        let mut room = sock.room();
        loop {
            if !st.setup.delivering() && st.rx.pending().len() >= RXBUF / 2 {
                // Held back until the port is proved (which reads again).
                self.set_interest(eng, Some(false), None);
                return;
            }
            let r = Self::read_some(st);
            if let Rd::Data(n) = r {
                budget += n;
            }
            if st.setup.phase() == Phase::AwaitPreamble {
                match (frame::parse_preamble(st.rx.pending()), st.tcp_peer) {
                    (ParsedPreamble::Done(p, used), Some(peer)) => {
                        st.rx.consume(used);
                        let remote = norm(SocketAddr::new(peer.ip(), p.port), sock.family);
                        if !config::get().policy.source_ok(&remote) {
                            stats::inc(&STATS.preamble_refused);
                            out.gone = Some((self.die(st), false));
                            return;
                        }
                        st.dest = Some(remote);
                        st.max_dgram = max_dgram(&remote);
                        st.group = p.stripe.map_or(0, |x| {
                            self.stripe.store(usize::from(x.index), Ordering::Relaxed);
                            x.group
                        });
                        let proved = st.proved_src == Some(remote);
                        if st.proved_src.is_some() && !proved {
                            // The proof came first, from another port.
                            stats::inc(&STATS.proofs_bad);
                        }
                        st.setup.preamble(proved);
                        if proved {
                            self.now_proven(st, eng, out);
                            if out.gone.is_some() {
                                return;
                            }
                        }
                    }
                    (ParsedPreamble::Partial, Some(_)) => {}
                    _ => {
                        stats::inc(&STATS.protocol_errors);
                        out.gone = Some((self.die(st), false));
                        return;
                    }
                }
            }
            if st.setup.delivering() && config::get().caller_recv {
                // Proved now: receive calls read the rest themselves.
                out.src = st.dest;
                if matches!(r, Rd::Eof | Rd::Err)
                    && !matches!(
                        st.rx.peek(),
                        frame::Parsed::Frame(_) | frame::Parsed::Control(..)
                    )
                {
                    // Reset or closed with no whole datagram left: nothing
                    // for a receive call (a reset socket polls readable, so
                    // the check below would have rung the doorbell with
                    // nothing to receive).
                    stats::inc(&STATS.conns_closed);
                    out.gone = Some((self.die(st), false));
                    return;
                }
                out.ready = true;
                return;
            }
            if st.setup.delivering() {
                out.src = st.dest;
                match Self::parse(st, &mut out.dgrams, &mut room) {
                    Parse::Done => {}
                    Parse::Full => {
                        out.pause = true;
                        return;
                    }
                    Parse::Bad => {
                        stats::inc(&STATS.protocol_errors);
                        out.gone = Some((self.die(st), false));
                        return;
                    }
                }
            }
            match r {
                Rd::Data(_) if budget < READ_BUDGET => continue,
                Rd::Data(_) | Rd::Again => return,
                Rd::Eof if !st.setup.delivering() && !st.rx.pending().is_empty() => {
                    // A short-lived sender said everything and closed before
                    // its proof was seen: keep what it said until the proof
                    // comes (or the deadline), reading no further.
                    self.set_interest(eng, Some(false), None);
                    return;
                }
                Rd::Eof | Rd::Err => {
                    stats::inc(&STATS.conns_closed);
                    out.gone = Some((self.die(st), false));
                    return;
                }
            }
        }
    }

    /// Applies what handling decided to the socket (no connection lock
    /// held).
    fn apply(
        self: &Arc<Self>,
        eng: &'static Reactor,
        sock: &Arc<Sock>,
        out: Outcome,
        adopted: Option<(SocketAddr, Adopted<Arc<Self>>)>,
        from_caller: bool,
    ) {
        if let (Some(d), false) = (out.src, out.now_udp.is_empty()) {
            sock.send_frames_udp(&d, &out.now_udp);
        }
        if let Some((r, a)) = adopted {
            sock.adopted(eng, r, a);
        }
        if out.ready {
            sock.mark_ready(eng, self, !from_caller);
        }
        if let (false, Some(s)) = (out.dgrams.is_empty(), out.src) {
            sock.deliver(eng, s, out.dgrams, self, from_caller);
        }
        if out.pause {
            sock.pause(eng, self);
        }

        if let Some((frames, fb)) = out.gone {
            sock.conn_gone(eng, self, out.src, frames, fb);
        }
    }
}

/// `WARPSOCK_TEST_HANDBACK_GAP_FD`: the test program's end of a socket
/// pair, if set.
#[cfg(feature = "test-hooks")]
fn handback_gap_fd() -> Option<libc::c_int> {
    use std::sync::OnceLock;
    static FD: OnceLock<Option<libc::c_int>> = OnceLock::new();
    *FD.get_or_init(|| {
        std::env::var("WARPSOCK_TEST_HANDBACK_GAP_FD")
            .ok()
            .and_then(|v| v.trim().parse().ok())
    })
}

/// With `WARPSOCK_TEST_HANDBACK_GAP_FD`: writes the one-byte cue `what`
/// to the test program: `h` when a poll held a datagram
/// (`super::serve::hold_frame`, in the program's own thread: the timer's
/// announcement follows), `d` when the timer has announced one (so that
/// the program's next round starts after it).
#[cfg(feature = "test-hooks")]
pub(super) fn handback_cue(what: &'static [u8; 1]) {
    if let Some(fd) = handback_gap_fd() {
        // SAFETY: a one-byte write from a static buffer to the test's socket.
        unsafe { crate::shim::real::send(fd, what.as_ptr().cast(), 1, libc::MSG_NOSIGNAL) };
    }
}

/// With `WARPSOCK_TEST_HANDBACK_GAP_FD`: each time the progress thread's timer
/// is about to announce a held datagram of a connection given back
/// (`Conn::on_timer`), it stops there, as if descheduled: it writes a byte
/// to this descriptor (the test program's cue to receive now) and waits
/// for a byte back (at most 5 s) before it goes on.
#[cfg(feature = "test-hooks")]
fn handback_gap() {
    let Some(fd) = handback_gap_fd() else { return };
    // SAFETY: a one-byte write from a static buffer to the test's socket.
    unsafe { crate::shim::real::send(fd, b"!".as_ptr().cast(), 1, libc::MSG_NOSIGNAL) };
    let mut p = [libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    }];
    if sys::poll(&mut p, 5000) > 0 {
        let mut b = [0u8; 1];
        // SAFETY: a one-byte read into a local buffer.
        unsafe { crate::shim::real::recv(fd, b.as_mut_ptr().cast(), 1, libc::MSG_DONTWAIT) };
    }
}
