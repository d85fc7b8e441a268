//! A TCP socket whose switch to DDP mode failed after reading some of the
//! peer's bytes (those it wrote before its mark): they are the program's,
//! so until it has read them the socket stays managed — reads return them
//! first, everything else goes to the TCP socket — and then the program's
//! descriptors become the plain TCP socket again.
//!
//! A responder that gave up waiting for the MPA Request also watches the
//! position behind the peer's mark (see `warpsock_xsock::switch`): a late
//! warpsock Request there is never delivered as data; the connection is
//! reset instead.
//!
//! While the watch cannot decide (nothing queued yet, or a Request's
//! prefix), a non-blocking read fails with `EAGAIN` and the doorbell is
//! drained: the progress thread watches the TCP socket for more than is
//! queued (`SO_RCVLOWAT` one past it, which Linux's `tcp_poll` keeps
//! `POLLIN` below) or the peer's end, and rings it then ([`Waiting`]).
//! Before, the bell rung at the wrap stayed, and an event loop woke for
//! every look and read `EAGAIN`: a peer that sent the mark and 13 bytes of
//! a Request's key and stopped spun the program's CPU for good, and a
//! prefix its end followed was never delivered, so the program never saw
//! the end and never closed the connection (review 59).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use libc::{c_int, c_void, msghdr, sockaddr, socklen_t};
use warpsock_engine::fds;
use warpsock_xsock::switch::{classify_request, Request};

use crate::shim::doorbell::Doorbell;
use crate::shim::reactor::{self, Handler, Reactor};
use crate::shim::socket::Socket;
use crate::shim::sys::{self, errno, lock, set_errno};
use crate::shim::{epollcarry, fdtable, real};

struct State {
    residue: Vec<u8>,
    off: usize,
    watch: bool,
    /// What the `connect` call that made the socket returns (`Some(errno)`
    /// or `Some(0)`), once.
    connect: Option<c_int>,
    bells: usize,
    /// The watch waits in the background (module docs).
    waiting: Option<Waiting>,
}

/// The progress thread's watch of the TCP socket for an undecided prefix.
struct Waiting {
    /// Its token.
    id: u64,
    /// The program's `SO_RCVLOWAT` (the watch sets its own meanwhile),
    /// restored when the watch ends; what it reads and sets meanwhile.
    lowat: c_int,
    /// The watch's own: one past the bytes queued.
    ours: c_int,
}

/// [`Waiting`]'s handler: more bytes or the peer's end ring the doorbell
/// (the program's next read looks again).
struct Wake(std::sync::Weak<ResidueSock>);

impl Handler for Wake {
    fn on_ready(&self, _reactor: &'static Reactor, _events: u32) {
        if let Some(s) = self.0.upgrade() {
            let mut st = lock(&s.st);
            if st.waiting.is_some() {
                s.bell.ring(&mut st.bells);
            }
        }
    }
}

/// A plain TCP socket with the peer's pre-switch bytes still to deliver.
pub(crate) struct ResidueSock {
    /// This socket, for [`Wake`].
    me: std::sync::Weak<Self>,
    kfd: c_int,
    /// Once demoted: the program's numbers name `kfd`'s file, plain to
    /// it (its `close` takes their epoll registrations, `epollcarry`).
    held: Mutex<Option<epollcarry::Held>>,
    bell: Doorbell,
    refs: AtomicUsize,
    nonblocking: AtomicBool,
    st: Mutex<State>,
}

impl ResidueSock {
    /// Wraps the program's descriptor at `at` (the TCP socket,
    /// `at.kernel`) if there is anything to deliver or watch; else leaves
    /// it alone. `connect`: the result the adopting `connect` returns.
    /// Returns whether it wrapped.
    ///
    /// Wrapping takes three descriptors (a duplicate of the socket and the
    /// doorbell's pair). Without them (`EMFILE`: the look for free ones
    /// before the switch is no reservation) the bytes read could never be
    /// delivered before the kernel's, nor a late Request kept from the
    /// program: the connection is reset (`ECONNRESET` to both ends' next
    /// calls), never left to read on past bytes it lost (helper 73), and
    /// the errno is returned.
    pub(crate) fn transpose(
        at: super::At<'_>,
        residue: Vec<u8>,
        watch: bool,
        connect: Option<c_int>,
    ) -> Result<Option<Arc<Self>>, c_int> {
        if residue.is_empty() && !watch && connect.is_none() {
            return Ok(None);
        }
        let kernel = at.kernel;
        let must_wrap = !residue.is_empty() || watch;
        Self::wrap(at, residue, watch, connect).inspect_err(|_| {
            if must_wrap {
                reset_connection(kernel);
            }
        })
    }

    /// [`Self::transpose`]'s wrapping.
    fn wrap(
        at: super::At<'_>,
        residue: Vec<u8>,
        watch: bool,
        connect: Option<c_int>,
    ) -> Result<Option<Arc<Self>>, c_int> {
        // SAFETY: fcntl/dup3 on descriptors we were handed or create here.
        unsafe {
            let fl = real::fcntl(at.kernel, libc::F_GETFL, 0);
            let kfd = fds::dup_lifted(at.kernel);
            if fl < 0 || kfd < 0 {
                return Err(errno());
            }
            let nonblocking = fl & libc::O_NONBLOCK != 0;
            let bell = Doorbell::new(nonblocking).inspect_err(|_| sys::close(kfd))?;
            let app_end = bell.app;
            let s = Arc::new_cyclic(|me| Self {
                me: me.clone(),
                kfd,
                held: Mutex::new(None),
                bell,
                refs: AtomicUsize::new(0),
                nonblocking: AtomicBool::new(nonblocking),
                st: Mutex::new(State {
                    residue,
                    off: 0,
                    watch,
                    connect,
                    bells: 0,
                    waiting: None,
                }),
            });
            at.install(app_end, s.clone())?;
            let mut g = lock(&s.st);
            s.bell.ring(&mut g.bells);
            drop(g);
            Ok(Some(s))
        }
    }

    /// Whether there is nothing left to deliver or watch.
    fn done(st: &State) -> bool {
        st.off == st.residue.len() && !st.watch && st.connect.is_none()
    }

    /// The program's descriptors naming this socket become the TCP socket.
    fn demote(&self) {
        {
            let mut h = lock(&self.held);
            if h.is_none() {
                *h = Some(epollcarry::Held::new(self.kfd));
            }
        }
        let me = self as *const Self as *const ();
        for (fd, s) in fdtable::all() {
            if Arc::as_ptr(&s).cast::<()>() != me {
                continue;
            }
            // SAFETY: a query of the program's descriptor.
            let fdfl = unsafe { real::fcntl(fd, libc::F_GETFD, 0) };
            // A number closed behind the table is not opened again (a
            // signal handler's `close` over this library code passes
            // straight to libc, the guard set): only forgotten (review
            // r21-haz item 4; as `demote_all` skips it).
            if fdfl >= 0 {
                // Re-pointing the program's descriptor at the TCP socket
                // it was.
                sys::set_nonblocking(self.kfd, self.nonblocking.load(Ordering::Relaxed));
                let cloexec = if fdfl & libc::FD_CLOEXEC != 0 {
                    libc::O_CLOEXEC
                } else {
                    0
                };
                // The program has likely registered `fd` in its epoll set
                // by now (an event loop reading the residue).
                epollcarry::dup3_carrying(self.kfd, fd, cloexec);
            }
            // (`all` lists nothing where `remove` is refused.)
            if let Ok(Some(old)) = fdtable::remove(fd) {
                old.release();
            }
        }
    }

    /// Resets the connection (a late MPA Request came: module docs): the
    /// peer gets a reset (`ECONNRESET` to its reads), the Request's bytes
    /// queued here are dropped, never read, and from then on this end's
    /// reads return 0 and its sends fail with `EPIPE`, as after a reset
    /// the peer sent (Linux's `tcp_reset`: the error, reported once — the
    /// caller's call does — then `tcp_done`'s shutdown of both sides).
    ///
    /// How: `connect` to `AF_UNSPEC`, Linux's `tcp_disconnect` (RFC 793's
    /// ABORT: a reset sent in every synchronised state, the receive queue
    /// purged, the socket's error `ECONNRESET`), then the error taken
    /// (`SO_ERROR`: the caller's call reports it) and both sides shut,
    /// which marks the closed socket so (its `ENOTCONN` is expected). The
    /// program's descriptor keeps the socket (no close here: the
    /// program's). Before, `SO_LINGER` {1, 0} and `shutdown`: `SO_LINGER`
    /// acts only at the last close, so the shutdown sent a FIN — the peer
    /// read a clean end, not a reset — and the Request's bytes stayed
    /// queued, the next read's data.
    fn reset(&self) {
        reset_connection(self.kfd);
        let mut err: c_int = 0;
        let mut len = size_of::<c_int>() as socklen_t;
        // SAFETY: an int on the stack, its size given.
        unsafe {
            real::getsockopt(
                self.kfd,
                libc::SOL_SOCKET,
                libc::SO_ERROR,
                (&mut err as *mut c_int).cast(),
                &mut len,
            );
            real::shutdown(self.kfd, libc::SHUT_RDWR);
        }
    }

    /// Checks the bytes behind the peer's mark for a late MPA Request.
    /// Returns an errno if the call must fail now.
    ///
    /// A blocking call waits while the bytes are undecided: with none
    /// queued, for the peer's bytes; with a prefix queued (only peeked, so
    /// it stays readable and a wait for `POLLIN` would return at once: the
    /// loop spun a CPU until the peer sent more, review r25-a item 9), in
    /// pauses between looks that the peer's end or an error ends at once:
    /// 200 µs doubling to 100 ms while the prefix stays as it was, back to
    /// 200 µs when a look sees more of it (a peer that stopped after a
    /// prefix costs a blocked reader about 10 looks a second, not 200 as
    /// with a 5 ms cap, review r26-b item 9; new bytes wake no pause —
    /// `POLLIN` holds already — so one that completes the prefix is seen
    /// up to a pause late, 100 ms at most, and only after the peer was
    /// silent about as long). A prefix the peer's end follows can never
    /// complete: it is data (delivered). One `SO_RCVTIMEO` deadline for
    /// all the waits, and a signal or a pending cancel ends them as
    /// [`sys::wait_fd`] says.
    ///
    /// The deadline's `EAGAIN` is a deliberate divergence from TCP (review
    /// r26-b item 8): Linux's `tcp_recvmsg` times out with `EAGAIN` only
    /// when nothing is queued, and here the prefix is queued — a TCP read
    /// would return it. It is withheld because it may yet be a Request's
    /// start, which must never be delivered as data (module docs); the
    /// README says so.
    ///
    /// The waits are made with the socket's lock (`st`, given and given
    /// back) let go, taken again after each, where the watch may have
    /// ended meanwhile (another reader's look decided it): so another
    /// thread's call goes on — a non-blocking read gets `EAGAIN` at once
    /// (its own look finds the prefix undecided), as Linux's `sk_wait_data`
    /// releases the socket lock while a reader sleeps; they blocked on the
    /// lock for as long as the peer stayed silent, no signal or cancel
    /// ending it (review r26-b item 7).
    fn check_watch<'a>(
        &'a self,
        mut st: MutexGuard<'a, State>,
        nonblocking: bool,
    ) -> (MutexGuard<'a, State>, Option<c_int>) {
        const PAUSE_MIN: Duration = Duration::from_micros(200);
        const PAUSE_MAX: Duration = Duration::from_millis(100);
        let mut buf = [0u8; warpsock_xsock::switch::MPA_HDR_LEN + 512];
        let mut deadline = None;
        let mut pause = PAUSE_MIN;
        let mut looked = 0;
        let mut ended = false;
        loop {
            // Counted before the peek: inline, an urgent byte ahead shows
            // as more queued than the peek finds (`urgent_ahead`).
            let queued = warpsock_xsock::io::readable(self.kfd).unwrap_or(0);
            // SAFETY: peeking into a local buffer.
            let n = unsafe {
                sys::recv_raw(
                    self.kfd,
                    buf.as_mut_ptr(),
                    buf.len(),
                    libc::MSG_PEEK | libc::MSG_DONTWAIT,
                )
            };
            if n == 0 {
                st.watch = false;
                return (st, None);
            }
            if n < 0 {
                let e = errno();
                if e != libc::EAGAIN {
                    // The socket's error (a reset, a timeout), taken by
                    // the peek: the call's, as TCP's read reports it.
                    return (st, Some(e));
                }
            }
            let seen = if n > 0 { &buf[..n as usize] } else { &[][..] };
            match classify_request(seen) {
                Request::NotWarpsock => {
                    st.watch = false;
                    return (st, None);
                }
                Request::Warpsock(_) | Request::BadHello(_) => {
                    self.reset();
                    st.watch = false;
                    return (st, Some(libc::ECONNRESET));
                }
                Request::Undecided { .. }
                    if n > 0
                        && warpsock_xsock::io::urgent_ahead(
                            self.kfd,
                            queued,
                            n as usize,
                            buf.len(),
                        ) =>
                {
                    // The peer's urgent byte lies ahead: a committed
                    // initiator sends its Request whole, with none inside,
                    // so the prefix is data (delivered). Undecided, the
                    // peek stopped at it while `tcp_poll` counted the bytes
                    // past it against `SO_RCVLOWAT`: the watch's wake-up
                    // came at once, every time, and an event loop read
                    // `EAGAIN` at a full CPU for as long as the peer kept
                    // the connection (helper 73).
                    st.watch = false;
                    return (st, None);
                }
                Request::Undecided { .. } if ended && n > 0 => {
                    // Every byte the peer sent before its end (or an
                    // error) is queued, and they are no Request.
                    st.watch = false;
                    return (st, None);
                }
                Request::Undecided { .. } => {
                    if nonblocking {
                        let end = libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR;
                        if n > 0 && !ended && sys::ready_now(self.kfd, libc::POLLRDHUP) & end != 0 {
                            // The peer's end (or an error) came behind the
                            // prefix: look again, the prefix is data.
                            ended = true;
                            continue;
                        }
                        self.wait_in_background(&mut st, n.max(0) as usize);
                        return (st, Some(libc::EAGAIN));
                    }
                    drop(st);
                    let waited = if n < 0 {
                        self.wait(libc::POLLIN, libc::SO_RCVTIMEO, &mut deadline)
                    } else {
                        if n != looked {
                            // More of the prefix came: the peer is
                            // sending, looks come quickly again.
                            looked = n;
                            pause = PAUSE_MIN;
                        }
                        let step = pause;
                        pause = (pause * 2).min(PAUSE_MAX);
                        self.pause(libc::POLLRDHUP, libc::SO_RCVTIMEO, &mut deadline, step)
                    };
                    st = lock(&self.st);
                    if !st.watch {
                        // Decided by another reader meanwhile.
                        return (st, None);
                    }
                    match waited {
                        Ok(ev) => {
                            let end = libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR;
                            ended |= ev & end != 0;
                        }
                        Err(e) => return (st, Some(e)),
                    }
                }
            }
        }
    }

    /// A non-blocking read found the watch undecided with `queued` bytes
    /// behind the mark: the doorbell is drained, and the progress thread
    /// rings it when more than those are queued or the peer ends (module
    /// docs). Without a progress thread the bell stays (the look comes
    /// again at the program's next wake-up, as before).
    fn wait_in_background(&self, st: &mut State, queued: usize) {
        let Some(eng) = reactor::get() else { return };
        let lowat = match &mut st.waiting {
            Some(w) => w.lowat,
            None => sys::get_int(self.kfd, libc::SOL_SOCKET, libc::SO_RCVLOWAT).unwrap_or(1),
        };
        let more = c_int::try_from(queued + 1).unwrap_or(c_int::MAX);
        if !sys::set_int(self.kfd, libc::SOL_SOCKET, libc::SO_RCVLOWAT, more) {
            return;
        }
        // One shot, armed again by the next look: a level-triggered watch
        // of a socket at its end would wake the progress thread for good.
        let events = (libc::EPOLLIN | libc::EPOLLRDHUP | libc::EPOLLONESHOT) as u32;
        match &mut st.waiting {
            Some(w) => {
                w.ours = more;
                eng.modify(self.kfd, w.id, events);
            }
            None => {
                let id = eng.new_id();
                if !eng.register(self.kfd, id, events, Arc::new(Wake(self.me.clone()))) {
                    sys::set_int(self.kfd, libc::SOL_SOCKET, libc::SO_RCVLOWAT, lowat);
                    return;
                }
                st.waiting = Some(Waiting {
                    id,
                    lowat,
                    ours: more,
                });
            }
        }
        // After the watch is armed: what came since the look rings again
        // (an `EPOLL_CTL_ADD`/`MOD` of a ready socket reports it at once;
        // its handler waits for this lock).
        self.bell.drain(&mut st.bells);
    }

    /// Ends [`Self::wait_in_background`]'s watch, if any: the watch was
    /// decided, or the socket goes.
    fn stop_waiting(&self, st: &mut State) {
        if let Some(w) = st.waiting.take() {
            if let Some(eng) = reactor::get() {
                eng.deregister(w.id, Some(self.kfd));
            }
            sys::set_int(self.kfd, libc::SOL_SOCKET, libc::SO_RCVLOWAT, w.lowat);
        }
    }

    /// The program's `recvmsg` of the TCP socket, with Linux's semantics
    /// for a `blocking` call and no system call that sleeps: each is made
    /// with `MSG_DONTWAIT`, and a blocking call waits outside them
    /// (`sys::wait_fd`, raw `ppoll`; one `SO_RCVTIMEO` deadline for the
    /// whole call). libc's `recvmsg` is a cancellation point, acted on
    /// inside the library (the process aborted), and the raw call's
    /// sleep would restart after the cancel's signal (`SA_RESTART`),
    /// never ending. Whatever the first try gives but `EAGAIN` is the
    /// call's result at once (review r25-a item 2: a wait before every
    /// call blocked those the kernel answers at once); a blocking call
    /// then goes on as `tcp_recvmsg` does: until its target — every byte
    /// with `MSG_WAITALL`, else `SO_RCVLOWAT`'s (at most the length, at
    /// least 1) — or the end, an error, the timeout or a signal, which
    /// end it with what it has, if anything.
    ///
    /// # Safety
    /// `msg` describes the caller's buffers.
    unsafe fn recv_kernel(&self, msg: &mut msghdr, flags: c_int, blocking: bool) -> isize {
        let f = flags | libc::MSG_DONTWAIT;
        // SAFETY: forwarding the caller's msghdr to the TCP socket.
        let r = unsafe { sys::recvmsg_raw(self.kfd, msg, f) };
        if !blocking || r == 0 || (r < 0 && errno() != libc::EAGAIN) {
            return r;
        }
        // SAFETY: the caller's iovecs.
        let iov = unsafe { iovecs(msg) };
        let total: usize = iov.iter().map(|v| v.iov_len).sum();
        let mut got = r.max(0) as usize;
        let mut deadline = None;
        let mut target = None;
        loop {
            if got > 0 {
                if got >= total {
                    return got as isize;
                }
                let t = *target.get_or_insert_with(|| {
                    if flags & libc::MSG_WAITALL != 0 {
                        total
                    } else {
                        let low = sys::get_int(self.kfd, libc::SOL_SOCKET, libc::SO_RCVLOWAT);
                        (low.unwrap_or(1).max(0) as usize).min(total).max(1)
                    }
                });
                if got >= t {
                    return got as isize;
                }
                if flags & libc::MSG_PEEK != 0 {
                    // A peek short of its target (a peek never takes
                    // bytes: the next would see the same ones): the
                    // kernel's own blocking call, which waits only for
                    // the rest (a cancel meanwhile is acted on once it
                    // returns).
                    // SAFETY: forwarding the caller's msghdr.
                    return unsafe { sys::recvmsg_raw(self.kfd, msg, flags) };
                }
            }
            let end = libc::POLLERR;
            if let Some(r) =
                self.wait_more(libc::POLLIN, libc::SO_RCVTIMEO, end, got, &mut deadline)
            {
                return r;
            }
            let r = if got == 0 {
                // SAFETY: forwarding the caller's msghdr.
                unsafe { sys::recvmsg_raw(self.kfd, msg, f) }
            } else {
                let mut rest = past(iov, got);
                // The rest of the caller's buffers; its name and control
                // were filled (or not) by the first part.
                let mut m = rest_msghdr(&mut rest, None);
                // SAFETY: `m` describes the rest of the caller's buffers.
                unsafe { sys::recvmsg_raw(self.kfd, &mut m, f) }
            };
            match r {
                0 => return got as isize,
                n if n > 0 => got += n as usize,
                _ if errno() == libc::EAGAIN => {}
                _ if got > 0 => return got as isize,
                _ => return -1,
            }
        }
    }

    /// The program's `sendmsg` on the TCP socket, as [`Self::recv_kernel`]:
    /// never a sleeping system call, the first try's result at once but
    /// `EAGAIN` of a `blocking` call (review r25-a item 2: a `MSG_DONTWAIT`
    /// send on a blocking socket waited for room), which then goes on as
    /// `tcp_sendmsg` does: until every byte went, or an error, the
    /// timeout (`SO_SNDTIMEO`) or a signal, which end it with the count
    /// sent, if any. The rest's sends take `MSG_NOSIGNAL`: Linux raises
    /// `SIGPIPE` only for a call that sent nothing.
    ///
    /// # Safety
    /// `msg` describes the caller's buffers.
    unsafe fn send_kernel(&self, msg: &msghdr, flags: c_int, blocking: bool) -> isize {
        let f = flags | libc::MSG_DONTWAIT;
        // SAFETY: forwarding the caller's msghdr to the TCP socket.
        let r = unsafe { sys::sendmsg_raw(self.kfd, msg, f) };
        if !blocking || (r < 0 && errno() != libc::EAGAIN) {
            return r;
        }
        // SAFETY: the caller's iovecs.
        let iov = unsafe { iovecs(msg) };
        let total: usize = iov.iter().map(|v| v.iov_len).sum();
        let mut got = r.max(0) as usize;
        let mut deadline = None;
        loop {
            if r >= 0 && got >= total {
                return got as isize;
            }
            let end = libc::POLLERR | libc::POLLHUP;
            if let Some(r) =
                self.wait_more(libc::POLLOUT, libc::SO_SNDTIMEO, end, got, &mut deadline)
            {
                return r;
            }
            let r = if got == 0 {
                // SAFETY: forwarding the caller's msghdr.
                unsafe { sys::sendmsg_raw(self.kfd, msg, f) }
            } else {
                let mut rest = past(iov, got);
                // The rest of the caller's buffers, to the caller's
                // destination.
                let m = rest_msghdr(&mut rest, Some(msg));
                // SAFETY: `m` describes the rest of the caller's buffers.
                unsafe { sys::sendmsg_raw(self.kfd, &m, f | libc::MSG_NOSIGNAL) }
            };
            match r {
                n if n >= 0 => {
                    got += n as usize;
                    if got >= total {
                        return got as isize;
                    }
                }
                _ if errno() == libc::EAGAIN => {}
                _ if got > 0 => return got as isize,
                _ => return -1,
            }
        }
    }

    /// Waits, in a blocking call that moved `got` bytes so far, for
    /// `events` (its timeout the option `name`, as [`Self::wait`]):
    /// `Some` of the call's result where the call ends — once any bytes
    /// went, their count, at an `end` event, the timeout or a signal
    /// (Linux ends the call with the bytes it has, the error left for the
    /// next one), else -1 with the wait's errno — `None` to try again.
    fn wait_more(
        &self,
        events: i16,
        name: c_int,
        end: i16,
        got: usize,
        deadline: &mut Option<(Instant, Option<Duration>)>,
    ) -> Option<isize> {
        match self.wait(events, name, deadline) {
            Ok(ev) if got > 0 && ev & end != 0 => Some(got as isize),
            Ok(_) => None,
            Err(_) if got > 0 => Some(got as isize),
            Err(e) => {
                set_errno(e);
                Some(-1)
            }
        }
    }

    /// A blocking call's wait for `events` on the TCP socket, up to the
    /// call's `deadline` (from the socket's `name` timeout, read at the
    /// first wait). `Err(errno)`: `EAGAIN` once it passed, `EINTR` (a
    /// signal, a pending cancel), as [`sys::wait_fd`].
    fn wait(
        &self,
        events: i16,
        name: c_int,
        deadline: &mut Option<(Instant, Option<Duration>)>,
    ) -> Result<i16, c_int> {
        let (start, timeo) =
            *deadline.get_or_insert_with(|| (Instant::now(), sys::get_timeo(self.kfd, name)));
        let left = timeo.map(|t| t.saturating_sub(start.elapsed()));
        sys::wait_fd(self.kfd, events, left)
    }

    /// [`Self::wait`] for at most `step` (a pause between looks): `Ok(0)`
    /// at the pause's end, `EAGAIN` once the call's `deadline` passed,
    /// `EINTR` at the pause's end if this thread has a cancel to act on
    /// (`warpsock_xsock::cancel::pending`: its signal may have come while
    /// the thread looked between two pauses, ending no sleep; the pauses
    /// went on for good then, a silent peer's, the cancel never acted on —
    /// the likely cause of one watchnb run, whose reader is cancelled
    /// while it pauses, stuck to its bound; the cancel module's rule 2: a
    /// wait whose slice ended with nothing asks).
    fn pause(
        &self,
        events: i16,
        name: c_int,
        deadline: &mut Option<(Instant, Option<Duration>)>,
        step: Duration,
    ) -> Result<i16, c_int> {
        let (start, timeo) =
            *deadline.get_or_insert_with(|| (Instant::now(), sys::get_timeo(self.kfd, name)));
        let left = timeo.map(|t| t.saturating_sub(start.elapsed()));
        if left.is_some_and(|l| l.is_zero()) {
            return Err(libc::EAGAIN);
        }
        let part = left.map_or(step, |l| l.min(step));
        match sys::wait_fd_part(self.kfd, events, Some(part), timeo.is_none()) {
            Err(libc::EAGAIN) if warpsock_xsock::cancel::pending() => Err(libc::EINTR),
            Err(libc::EAGAIN) => Ok(0),
            r => r,
        }
    }
}

/// The iovecs of `msg` (none if it has none): the caller's array, which
/// lives for its call (the calls through `msg` write its buffers, never
/// the array).
///
/// # Safety
/// `msg` describes the caller's buffers, for `'a`.
unsafe fn iovecs<'a>(msg: &msghdr) -> &'a [libc::iovec] {
    if msg.msg_iov.is_null() || msg.msg_iovlen == 0 {
        return &[];
    }
    // SAFETY: the caller's `msg_iovlen` iovecs.
    unsafe { std::slice::from_raw_parts(msg.msg_iov, msg.msg_iovlen) }
}

/// A msghdr of the buffers `rest` (which must outlive its use), with no
/// control and the address of `to`, if given (a send's destination).
fn rest_msghdr(rest: &mut [libc::iovec], to: Option<&msghdr>) -> msghdr {
    // SAFETY: msghdr is plain data; all-zero is an empty one.
    let mut m: msghdr = unsafe { std::mem::zeroed() };
    if let Some(to) = to {
        m.msg_name = to.msg_name;
        m.msg_namelen = to.msg_namelen;
    }
    m.msg_iov = rest.as_mut_ptr();
    m.msg_iovlen = rest.len();
    m
}

/// `iov` past its first `n` bytes.
fn past(iov: &[libc::iovec], mut n: usize) -> Vec<libc::iovec> {
    let mut rest = Vec::with_capacity(iov.len());
    for v in iov {
        if n >= v.iov_len {
            n -= v.iov_len;
            continue;
        }
        rest.push(libc::iovec {
            // SAFETY: within the caller's buffer of `iov_len` bytes.
            iov_base: unsafe { v.iov_base.cast::<u8>().add(n) }.cast(),
            iov_len: v.iov_len - n,
        });
        n = 0;
    }
    rest
}

impl Socket for ResidueSock {
    fn kernel_fd(&self) -> c_int {
        self.kfd
    }

    fn never_shows(&self) -> i16 {
        crate::shim::socket::TCP_NEVER_SHOWS
    }

    fn add_ref(&self) {
        self.refs.fetch_add(1, Ordering::AcqRel);
    }

    fn release(&self) {
        self.refs.fetch_sub(1, Ordering::AcqRel);
    }

    fn nonblocking(&self) -> bool {
        self.nonblocking.load(Ordering::Relaxed)
    }

    fn set_nonblocking(&self, on: bool) {
        self.nonblocking.store(on, Ordering::Relaxed);
    }

    unsafe fn recvmsg(&self, msg: &mut msghdr, flags: c_int) -> isize {
        if flags & (libc::MSG_OOB | libc::MSG_ERRQUEUE) != 0 {
            // The urgent byte and the error queue: the TCP socket's own,
            // never the stream's bytes, and never waited for by Linux
            // (`EINVAL`, `EAGAIN` at once): straight to it (review r25-a
            // item 2: they waited for in-band bytes, for ever with none
            // to come).
            // SAFETY: forwarding the caller's msghdr to the TCP socket.
            return unsafe { sys::recvmsg_raw(self.kfd, msg, flags | libc::MSG_DONTWAIT) };
        }
        let nonblocking = flags & libc::MSG_DONTWAIT != 0 || self.nonblocking();
        let mut st = lock(&self.st);
        if st.off < st.residue.len() {
            let mut n = 0;
            // SAFETY: the caller's iovecs.
            let iov = unsafe { std::slice::from_raw_parts(msg.msg_iov, msg.msg_iovlen) };
            for v in iov {
                let k = v.iov_len.min(st.residue.len() - st.off - n);
                // SAFETY: the caller's buffer of iov_len bytes.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        st.residue[st.off + n..].as_ptr(),
                        v.iov_base.cast::<u8>(),
                        k,
                    );
                }
                n += k;
            }
            if flags & libc::MSG_PEEK == 0 {
                st.off += n;
            }
            msg.msg_namelen = 0;
            if Self::done(&st) {
                drop(st);
                self.demote();
            }
            return n as isize;
        }
        if st.watch {
            let (g, e) = self.check_watch(st, nonblocking);
            st = g;
            if !st.watch {
                self.stop_waiting(&mut st);
            }
            if let Some(e) = e {
                set_errno(e);
                return -1;
            }
        }
        let done = Self::done(&st);
        drop(st);
        if done {
            self.demote();
        }
        // SAFETY: the caller's msghdr.
        unsafe { self.recv_kernel(msg, flags, !nonblocking) }
    }

    unsafe fn sendmsg(&self, msg: &msghdr, flags: c_int) -> isize {
        let blocking = flags & libc::MSG_DONTWAIT == 0 && !self.nonblocking();
        // SAFETY: the caller's msghdr.
        unsafe { self.send_kernel(msg, flags, blocking) }
    }

    fn connect(&self, addr: *const sockaddr, len: socklen_t) -> c_int {
        let mut st = lock(&self.st);
        if let Some(e) = st.connect.take() {
            let done = Self::done(&st);
            drop(st);
            if done {
                self.demote();
            }
            if e != 0 {
                set_errno(e);
                return -1;
            }
            return 0;
        }
        drop(st);
        // SAFETY: forwarding to the TCP socket (connected: it answers at
        // once; raw, no cancellation point).
        unsafe { sys::connect_raw(self.kfd, addr, len) }
    }

    fn getsockopt(
        &self,
        level: c_int,
        name: c_int,
        val: *mut c_void,
        len: *mut socklen_t,
    ) -> c_int {
        if level == super::SOL_WARPSOCK {
            return match name {
                // Plain TCP: the switch failed.
                super::WARPSOCK_DDP_MODE | super::WARPSOCK_MSG_MODE | super::WARPSOCK_CRC => {
                    super::put_int(val, len, 0)
                }
                _ => {
                    set_errno(libc::ENOPROTOOPT);
                    -1
                }
            };
        }
        if (level, name) == (libc::SOL_SOCKET, libc::SO_RCVLOWAT) {
            if let Some(w) = &lock(&self.st).waiting {
                // The program's, not the watch's.
                return super::put_int(val, len, w.lowat);
            }
        }
        // SAFETY: forwarding the program's arguments to the TCP socket.
        unsafe { real::getsockopt(self.kfd, level, name, val, len) }
    }

    fn setsockopt(&self, level: c_int, name: c_int, val: *const c_void, len: socklen_t) -> c_int {
        if level == super::SOL_WARPSOCK {
            // A connection gets one switch attempt (see warpsock_xsock::switch).
            set_errno(libc::EALREADY);
            return -1;
        }
        let lowat = (level, name) == (libc::SOL_SOCKET, libc::SO_RCVLOWAT);
        let st = lowat.then(|| lock(&self.st));
        // SAFETY: forwarding the program's arguments to the TCP socket.
        let r = unsafe { real::setsockopt(self.kfd, level, name, val, len) };
        let e = errno();
        if let Some(mut st) = st {
            if let Some(w) = &mut st.waiting {
                // The kernel checked and took the program's value (as it
                // keeps it: read back); the watch's own goes back on.
                if r == 0 {
                    w.lowat = sys::get_int(self.kfd, libc::SOL_SOCKET, libc::SO_RCVLOWAT)
                        .unwrap_or(w.lowat);
                }
                sys::set_int(self.kfd, libc::SOL_SOCKET, libc::SO_RCVLOWAT, w.ours);
            }
        }
        set_errno(e);
        r
    }
}

impl Drop for ResidueSock {
    fn drop(&mut self) {
        // Out of the progress thread's set before the close (`Reactor::unwatch`).
        let mut st = lock(&self.st);
        self.stop_waiting(&mut st);
        drop(st);
        drop(lock(&self.held).take());
        sys::close(self.kfd);
    }
}

/// Resets the TCP connection of socket `fd`: a disconnect
/// (`connect(AF_UNSPEC)`, Linux's `tcp_disconnect`) sends an RST, purges
/// both queues and leaves the socket's error `ECONNRESET`, which its next
/// call reports.
fn reset_connection(fd: c_int) {
    let unspec = sockaddr {
        sa_family: libc::AF_UNSPEC as libc::sa_family_t,
        sa_data: [0; 14],
    };
    // SAFETY: a sockaddr on the stack, its size given.
    unsafe { sys::connect_raw(fd, &unspec, size_of::<sockaddr>() as socklen_t) };
}

#[cfg(test)]
mod tests;
