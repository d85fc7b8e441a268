//! A TCP socket in DDP mode, as the program sees it: the program's
//! descriptor number names one end of a doorbell pair, the TCP socket
//! moves to a private descriptor (names and options go to it), and the data
//! calls run the sockets-over-DDP protocol ([`XSocket`]).
//!
//! Readiness: whoever processes arrivals while no call of the program runs
//! — the program's own `poll`, which watches the engine's TCP socket next
//! to the doorbell ([`Socket::wait_begin`]), or the progress thread, whose
//! watch is on only when the socket needs it (`warpsock_xsock::io`'s
//! `watch` module: for good once the program waits in `select` or
//! `epoll_wait`, [`doorbell_wait`]) — runs a round of progress. After that
//! round and after every data call, [`DdpSock::reflect`] makes the
//! doorbell follow the socket: a bell when something new arrived and
//! the socket is readable (bytes, end of stream, an error, an asynchronous
//! completion), drained bells when nothing is left to read. A send that
//! would block (no credit) makes the program's end unwritable until
//! credits return, so `POLLOUT`/`EPOLLOUT` wait like a full TCP socket's.
//! When the connection is finished both ways the pair hangs up
//! (`POLLHUP`), with `POLLERR` if it failed, until the program takes the
//! error (`Doorbell::fail`, `DdpSock::take_error`). A program thread blocked in a call may process what
//! arrives for another thread that waits in `poll`: its call reflects that
//! on return, and the arrivals counter makes it a new edge.

use std::collections::HashMap;
use std::mem::ManuallyDrop;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use libc::{c_int, c_ulong, c_void, msghdr, sockaddr, socklen_t};
use smallvec::SmallVec;
use warpsock_xsock::io::{Readiness, XSocket};

use super::follow::Follow;
use crate::shim::doorbell::Doorbell;
use crate::shim::socket::{PeerName, Socket, Wait, WAIT_READABLE};
use crate::shim::sys::{errno, set_errno};
use crate::shim::{fdtable, real};
use crate::shim::{reactor, sigio};
use warpsock_xsock::io::ForkLock;

mod calls;
#[cfg(feature = "test-hooks")]
pub(super) use calls::{BUSY_QUIET, QUIET_EAGAINS};
pub(crate) use waits::doorbell_wait;
pub(in crate::xsock) use waits::BELLS;
use waits::{DOORBELL_WAITS, SELECT_WAITS};
mod dead;
mod waits;
pub(crate) use dead::{borrows_memory, shares_memory};
pub(super) use dead::{dead_end, dead_ends_made, refuse_forked_switch};
pub(in crate::xsock) mod close;
#[cfg(test)]
pub(super) mod forked;
mod opts;
/// The interposer's tests' fixture (the kinds name no `interpose`).
#[cfg(test)]
pub(crate) use close::tests::as_a_close_finds_it;

use close::{CLOSED, CLOSED_ABORTIVE};

pub(crate) use opts::Kept;
use opts::Timeout;

/// A DDP-mode socket.
pub(crate) struct DdpSock {
    /// Taken by the last drop, to close it in the background ([`Drop`]).
    pub(crate) x: ManuallyDrop<XSocket>,
    /// The program closed it ([`Socket::release`]): [`CLOSED`] or
    /// [`CLOSED_ABORTIVE`], made when the last reference goes.
    closing: AtomicU8,
    /// The close is counted in `linger::CLOSING` since the program's close
    /// (`reaper::Counted::release`): the last drop takes the count over.
    counted: AtomicBool,
    /// The program's `SO_LINGER` time in seconds at its close, if it set
    /// {1, N > 0} ([`Socket::release`]; 0: none): the last drop's close
    /// waits for the bytes to be acknowledged, N s at most (`close.rs`).
    linger_s: AtomicI32,
    /// The TCP socket, off the program's number (names, options): the
    /// engine's handle ([`XSocket::tcp_fd`]), open while `x` is, which
    /// this socket's drop hands on last.
    kfd: c_int,
    bell: Doorbell,
    pub(super) id: u64,
    /// The progress thread's references ([`super::follow::Pins`]).
    pins: Arc<super::follow::Pins>,
    refs: AtomicUsize,
    nonblocking: AtomicBool,
    /// The progress thread watches this socket for good
    /// ([`doorbell_wait`] for `select`, or a set that cannot watch its
    /// connection: [`Socket::direct_failed`]).
    background: AtomicBool,
    /// The progress thread watches this socket for good while no epoll
    /// set of the program's watches its connection ([`doorbell_wait`] for
    /// the `epoll_wait` family; `XSocket::set_epoll_background`).
    epoll_background: AtomicBool,
    /// Program `poll`s waiting on this socket now (between
    /// [`Socket::wait_begin`] and [`Socket::wait_end`]): the only waiters
    /// besides `select`/`epoll` ([`DOORBELL_WAITS`]) and a signal
    /// ([`Self::signals`]) that a bell can wake.
    polls: AtomicUsize,
    /// Signal-driven I/O is on (`O_ASYNC`; [`Socket::set_async`]): every
    /// bell is a `SIGIO`.
    signals: AtomicBool,
    rcvtimeo: Timeout,
    sndtimeo: Timeout,
    /// The program's options kept, read back, and not applied ([`Kept`]).
    kept: Kept,
    /// The doorbell's books ([`Follow`]).
    inner: Follow,
    /// The process that switched it: a forked child's copies of its
    /// parent's sockets are the parent's (`census`).
    pub(super) pid: i32,
}

/// Every live DDP socket by the address of its object (the extended calls
/// find theirs from the descriptor table's `dyn Socket`). A forked child
/// starts a table of its own ([`forget_after_fork`]).
pub(super) static SOCKS: ForkLock<HashMap<usize, Weak<DdpSock>>> = ForkLock::new();

/// The process that switched the latest socket (0: none): a process that
/// switched none (a forked or vforked child of one that did) has no
/// socket of its own in [`SOCKS`], and its exit does not touch the lock
/// (a parent's thread may have held it at the fork; `census`).
pub(super) static SOCKS_OWNER: AtomicI32 = AtomicI32::new(0);

/// In a child made by `fork` (its fork handler, the only thread): the
/// table of DDP sockets and its owner are the parent's. The child's first
/// `select` or `epoll_wait` ([`doorbell_wait`], whose first run walks
/// the table) found its copy there when the parent had never waited in
/// one: it locked the table and each socket's books — a lock a thread of
/// the parent's held at the fork stays held for good, the child hung —
/// and rang the bell of a readable socket of the parent's, on the
/// doorbell pair the child's descriptors share with the parent (a byte
/// the parent's books did not count, never drained; issue 12). The
/// child's first switch locked the table too. The child starts a table of
/// its own (the parent's is left, not locked: the sockets are the
/// parent's, never dropped here, as `interpose::demote_all` leaves the
/// descriptor table's); its exit, `exec` and census see none but its own,
/// as with `SOCKS_OWNER`'s pid check, which now starts from none too.
pub(crate) fn forget_after_fork() {
    SOCKS.forget();
    SOCKS_OWNER.store(0, Ordering::Release);
}

/// The DDP socket behind the program's descriptor `fd`, or the errno of
/// an extended call on it: `EBADF` (not open), `ENOTSOCK` (no DDP
/// socket), `EAGAIN` (a non-blocking connection still switching in the
/// background).
pub(crate) fn lookup(fd: c_int) -> Result<Arc<DdpSock>, c_int> {
    let ddp = |s: &Arc<dyn Socket>| {
        let key = Arc::as_ptr(s).cast::<()>() as usize;
        SOCKS.lock().get(&key).and_then(Weak::upgrade)
    };
    let none = || {
        // SAFETY: fcntl(F_GETFD) only probes the descriptor.
        let open = unsafe { real::fcntl(fd, libc::F_GETFD, 0) } >= 0;
        if open {
            libc::ENOTSOCK
        } else {
            libc::EBADF
        }
    };
    let s = fdtable::get(fd).ok_or_else(none)?;
    if let Some(d) = ddp(&s) {
        return Ok(d);
    }
    // A connection switching in the background: its outcome (the
    // extended calls right after `accept`).
    s.settle_wait()?;
    fdtable::get(fd).and_then(|s| ddp(&s)).ok_or_else(none)
}

/// How a program's `poll` waits on a DDP socket ([`Socket::wait_begin`]):
/// it watches the engine's TCP socket itself. Zero-sized, as
/// [`PollerClaim`]: boxing it allocates nothing.
struct DirectClaim;

/// [`DirectClaim`] for a `poll` that stands in for the progress thread's
/// watch while it waits (`XSocket::stand_in`): taken when the watch is on
/// for input alone as the poll begins (a mapping the peer may write or
/// read, asynchronous operations in flight) — one load otherwise, so a
/// ping-pong's poll, the watch off, pays nothing more.
struct StandInClaim;

/// How a program's `poll` waits on a DDP socket another thread's call is
/// parked on (it reads the socket): the progress thread watches for this
/// poll after that call.
struct PollerClaim;

thread_local! {
    /// A poll's descriptor list, kept per thread between polls: a poll of
    /// a DDP socket allocates nothing once warm (it allocated the list
    /// and its claim at every call: 2 allocations per 8 B round trip).
    static SPARE_FDS: std::cell::Cell<Vec<c_int>> = const { std::cell::Cell::new(Vec::new()) };
}

impl DdpSock {
    /// The socket's `SO_RCVTIMEO` and `SO_SNDTIMEO` (`None`: none set),
    /// for the extended calls that wait (`warpsock_rioread`,
    /// `warpsock_riowrite`).
    pub(crate) fn timeouts(&self) -> (Option<Duration>, Option<Duration>) {
        (self.rcvtimeo.get(), self.sndtimeo.get())
    }

    /// `WARPSOCK_TEST_PASS_HOLD_FD` (test-hooks): the program's lingering
    /// close (its release, before the socket leaves the progress thread's
    /// watch) asks for a pass of the progress thread over the socket (an
    /// output event, always there) and waits until it holds its reference
    /// ([`super::follow::Pins::hold_a_pass`]): the close meets a pass
    /// under way every time (`tests/ddp_linger.rs`'s busy case).
    #[cfg(feature = "test-hooks")]
    fn hold_a_pass(&self) {
        // Nothing, not even a system call, unless the test asked for it:
        // the close's own count of them (`interpose::tests::
        // a_close_in_the_switching_process_makes_one_getpid`) holds under
        // this feature too.
        if super::config::get().hooks.pass_hold_fd.is_none() {
            return;
        }
        let lingers = super::census::linger_as_set(self.x.tcp_fd())
            .is_some_and(|l| l.l_onoff != 0 && l.l_linger > 0);
        let Some(eng) = reactor::current().filter(|e| e.is_owner()) else {
            return;
        };
        if !lingers || !fdtable::close_may_wait() || reactor::on_progress_thread() {
            return;
        }
        self.pins
            .hold_a_pass(|| eng.modify(self.x.tcp_fd(), self.id, libc::EPOLLOUT as u32));
    }

    /// Makes the program's descriptor at `at` (a connected TCP socket,
    /// `at.kernel`, that `x` now carries) a DDP-mode socket. `connect_pending`: adopted by a
    /// `connect` call that is still to return. `nonblocking`: the
    /// program's `O_NONBLOCK` as it was before the switch (the engine puts
    /// the kernel socket, whose open file description `fd` shares, in
    /// blocking mode for its own reads); `timeouts` and `kept` the
    /// program's options (kept here from now on).
    ///
    /// A failure here (`EMFILE` for the descriptors, as at a server's
    /// limit after the accept that fed the switch) finds the connection
    /// switched: the peer runs DDP on it. Left so, the program read the
    /// peer's framing from its TCP socket (review r23-a item 3). The
    /// connection is reset ([`XSocket::reset_now`]) and the program's
    /// options put back: the caller reports the reset.
    pub(crate) fn transpose(
        at: super::At<'_>,
        x: XSocket,
        msg_mode: bool,
        connect_pending: bool,
        timeouts: (Option<Duration>, Option<Duration>),
        kept: Kept,
        nonblocking: bool,
    ) -> Result<Arc<Self>, c_int> {
        let undo = |x: &XSocket, kept: &Kept, e: c_int| {
            x.reset_now();
            kept.put_back(at.kernel);
            e
        };
        let Some(eng) = reactor::get() else {
            return Err(undo(&x, &kept, libc::ENOMEM));
        };
        x.set_msg_mode(msg_mode);
        // SAFETY: fcntl/dup3 on descriptors we were handed or create here.
        unsafe {
            // The engine's own handle on the connection, no duplicate of
            // ours: `x` closes it only when it is dropped, and this socket
            // drops `x` last (one descriptor and two system calls a
            // connection less).
            let kfd = x.tcp_fd();
            let bell = match Doorbell::new(nonblocking) {
                Ok(b) => b,
                Err(e) => return Err(undo(&x, &kept, e)),
            };
            // Made before the socket (a forked child's copy stayed the
            // doorbell without one: `demote_fd`).
            if let Err(e) = dead_ends_made() {
                return Err(undo(&x, &kept, e));
            }
            let app_end = bell.app;
            let s = Arc::new(Self {
                id: eng.new_id(),
                inner: Follow::new(),
                rcvtimeo: Timeout::new(timeouts.0),
                sndtimeo: Timeout::new(timeouts.1),
                kept,
                x: ManuallyDrop::new(x),
                closing: AtomicU8::new(0),
                counted: AtomicBool::new(false),
                linger_s: AtomicI32::new(0),
                kfd,
                bell,
                pins: Arc::default(),
                refs: AtomicUsize::new(0),
                nonblocking: AtomicBool::new(nonblocking),
                background: AtomicBool::new(false),
                epoll_background: AtomicBool::new(false),
                polls: AtomicUsize::new(0),
                signals: AtomicBool::new(false),
                pid: libc::getpid(),
            });
            // The census's owner: set when none is (compare-exchange), or
            // over a process whose memory this one does not share (a
            // child made by `_Fork` or `clone` without `CLONE_VM`, its
            // copy of the parent's); never in memory shared with another
            // process (a vforked child's switch is refused before its
            // handshake: `shares_memory`), where the store made every
            // close of the parent's own sockets look forked away, leaked
            // with no end of stream (review r29-c item 3).
            let cur = SOCKS_OWNER.load(Ordering::Acquire);
            if cur != s.pid && (cur == 0 || !shares_memory(s.pid, cur)) {
                let _ =
                    SOCKS_OWNER.compare_exchange(cur, s.pid, Ordering::AcqRel, Ordering::Acquire);
            }
            let key = Arc::as_ptr(&s).cast::<()>() as usize;
            SOCKS.lock().insert(key, Arc::downgrade(&s));
            let forget = |e| {
                SOCKS.lock().remove(&key);
                undo(&s.x, &s.kept, e)
            };
            if !eng.register(
                s.x.tcp_fd(),
                s.id,
                s.x.watching(),
                Arc::new(super::follow::Ready(Arc::downgrade(&s), s.pins.clone())),
            ) {
                return Err(forget(errno()));
            }
            let (tcp_fd, id) = (s.x.tcp_fd(), s.id);
            s.x.set_watch(Box::new(move |events| {
                // Only the process whose reactor this is: a forked child
                // shares the parent's epoll instance, and must not change
                // what the parent's progress thread watches.
                if reactor::current().is_some_and(|e| std::ptr::eq(e, eng)) {
                    eng.modify(tcp_fd, id, events);
                }
            }));
            let weak = Arc::downgrade(&s);
            s.x.set_on_progress(Box::new(move |r| {
                // A program thread blocked in a call processed arrivals
                // (the progress thread skipped the socket meanwhile).
                if let Some(s) = weak.upgrade() {
                    s.reflect(r);
                }
            }));
            if SELECT_WAITS.load(Ordering::SeqCst) {
                s.keep_watched();
            } else if DOORBELL_WAITS.load(Ordering::SeqCst) {
                s.keep_epoll_watched();
            }
            if let Err(e) = at.install(app_end, s.clone()) {
                // (A swap undone released the socket: its close is a
                // reset now, or the engine's end of stream before it.)
                eng.deregister(s.id, Some(s.x.tcp_fd()));
                return Err(forget(e));
            }
            s.inner.lock().connect_pending = connect_pending;
            // The program's `SIGIO` settings came with its number (`sigio`).
            if sigio::is_on(app_end) {
                s.signal_driven(true);
            }
            // Bytes that arrived with the switch (the pre-switch residue).
            s.x.show_after_round(|r| s.reflect(r));
            Ok(s)
        }
    }

    /// Makes the doorbell pair follow readiness `r` ([`Follow::reflect`]:
    /// a bell if readable and something arrived or no bell is out, but only
    /// if a bell can wake anyone, [`Self::bell_heard`]; drained bells if
    /// nothing is readable; writability released; a hang-up).
    #[inline]
    pub(super) fn reflect(&self, r: Readiness) {
        if self.inner.reflect(r, self, || self.bell_heard()) {
            BELLS.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Whether a bell can wake anyone: the program waits, or may wait, on
    /// its descriptor — in `select`/`epoll` ([`DOORBELL_WAITS`], from the
    /// first such call on) or in a `poll` running now. A program that only
    /// makes blocking calls (a bulk reader) has no waiter: a bell for the
    /// bytes a receive left queued cost a `sendto` and then a drain (two
    /// `recvfrom`) in the next receive, per message. A waiter that comes
    /// later looks first: `wait_begin` and [`doorbell_wait`] ring for what
    /// is readable then (`reflect` rings whenever no bell is out), after
    /// making themselves seen here (sequentially consistent on both sides).
    fn bell_heard(&self) -> bool {
        DOORBELL_WAITS.load(Ordering::SeqCst)
            || self.polls.load(Ordering::SeqCst) > 0
            || self.signals.load(Ordering::SeqCst)
    }

    /// After collecting asynchronous completions: the bells follow what is
    /// left.
    pub(crate) fn settle_after_aio(&self) {
        self.x.show_now(|r| self.reflect(r));
    }
}

/// The program's non-empty buffers of `msg`, each as `part` makes it of
/// the slice (a few inline: a data call allocates nothing for them).
/// Pushed one by one: collecting a filtered iterator into the `SmallVec`
/// cost a send call about 100 instructions more (callgrind).
///
/// # Safety
/// `msg`'s iovecs must be valid for the lifetime used.
unsafe fn iovs<'a, T>(msg: &msghdr, part: impl Fn(&'a mut [u8]) -> T) -> SmallVec<[T; 4]> {
    let mut out = SmallVec::new();
    if msg.msg_iov.is_null() || msg.msg_iovlen == 0 {
        return out;
    }
    // SAFETY: the caller's contract.
    let v = unsafe { std::slice::from_raw_parts(msg.msg_iov, msg.msg_iovlen) };
    for i in v {
        if i.iov_len > 0 && !i.iov_base.is_null() {
            // SAFETY: each iovec names a valid buffer (caller's contract).
            out.push(part(unsafe {
                std::slice::from_raw_parts_mut(i.iov_base.cast::<u8>(), i.iov_len)
            }));
        }
    }
    out
}

/// The total length of `msg`'s iovecs, and whether every one of nonzero
/// length has a null base (there is some length, and [`iovs`] leaves
/// all of it out).
///
/// # Safety
/// As [`iovs`].
unsafe fn iov_total(msg: &msghdr) -> (usize, bool) {
    if msg.msg_iov.is_null() || msg.msg_iovlen == 0 {
        return (0, false);
    }
    // SAFETY: the caller's contract.
    let v = unsafe { std::slice::from_raw_parts(msg.msg_iov, msg.msg_iovlen) };
    let total: usize = v.iter().map(|i| i.iov_len).sum();
    let any = v.iter().any(|i| i.iov_len > 0 && !i.iov_base.is_null());
    (total, total > 0 && !any)
}

impl Socket for DdpSock {
    fn kernel_fd(&self) -> c_int {
        self.kfd
    }

    fn never_shows(&self) -> i16 {
        crate::shim::socket::TCP_NEVER_SHOWS
    }

    fn demote_fd(&self) -> c_int {
        // What the program's number becomes in a forked child or after
        // exec: the DDP stream cannot be shared with a process that does
        // not run its protocol.
        dead_end(self.nonblocking())
    }

    fn watch_for_end(&self) -> bool {
        // Once the engine read the peer's FIN its socket is readable for
        // good, and a poll asking for no input would wake for it again and
        // again with nothing to show (helper 61's review): nothing but the
        // program's own calls can fail the connection then.
        !self.x.read_closed()
    }

    fn peer_name(&self) -> PeerName {
        if self.x.tcp_closed() {
            PeerName::Closed
        } else {
            PeerName::Connected(self.x.peer_addr())
        }
    }

    fn managed_target(&self) -> Option<c_int> {
        Some(self.bell.app)
    }

    fn owner_pid(&self) -> i32 {
        self.pid
    }

    fn add_ref(&self) {
        self.refs.fetch_add(1, Ordering::AcqRel);
    }

    fn release(&self) {
        if self.refs.fetch_sub(1, Ordering::AcqRel) != 1 {
            return;
        }
        if close::forked_away(self.pid) {
            // A child made by `fork` (its fork handlers ran) whose signal
            // handler forked inside the program's `close` (or `dup2`) of
            // this socket, after the table let it go and before this
            // release, and returned into it (issue 12): the socket and its
            // connection are the parent's, which closes them. Nothing of
            // the parent's here: no count in `linger::CLOSING` (the
            // child's exit waited for a close it never makes), no
            // lingering close's wait in `pins.close()` for passes of a
            // progress thread the child does not have (one under way at
            // the fork stays counted in the child's copy: 1 s), no lock of
            // `SOCKS` (a thread of the parent's may have held it at the
            // fork: the child blocked for good), and no close made at the
            // last reference: its drop forgets the socket
            // (`close::forget_forked_copy`). Told without a system call
            // (`close::forked_away`: the owner the fork handlers leave;
            // review r29-a item 3).
            return;
        }
        // From here on this is the process that switched the socket: a
        // child made without the fork handlers (`vfork`, `_Fork`,
        // `clone`) never releases its parent's sockets (its `close` and
        // `dup`s of them are the system calls alone:
        // `fdtable::borrowed`), so the engine-owner checks here, a
        // `getpid` each, are gone (review r29-a item 3).
        #[cfg(feature = "test-hooks")]
        self.hold_a_pass();
        // Counted before the socket leaves the census (`SOCKS`): an exit
        // from here to the hand-over (a call of another thread's may hold
        // the last reference for as long as it lasts) waits for its bytes
        // (review r27-c item 2).
        if !self.counted.swap(true, Ordering::AcqRel) {
            super::reaper::Counted::release();
        }
        if let Some(eng) = reactor::current() {
            eng.deregister(self.id, Some(self.x.tcp_fd()));
        }
        let key = self as *const Self as *const () as usize;
        SOCKS.lock().remove(&key);
        // No epoll set watches its connection any more.
        crate::shim::epollwatch::forget(key);
        // An abortive close (`SO_LINGER` {1, 0}, which the program set on
        // the TCP socket): a reset, as TCP's close, without the orderly
        // part — its end of stream, then the engine's FIN, reached the
        // peer before the reset (its read got 0, then `ECONNRESET`). Made,
        // as the orderly close, when the last reference goes ([`Drop`]):
        // at once, or as a call of another thread's in flight returns.
        let linger = super::census::linger_as_set(self.x.tcp_fd())
            .filter(|l| l.l_onoff != 0)
            .map(|l| l.l_linger);
        let abortive = linger == Some(0);
        // {1, N > 0}: the close waits (`close.rs`, `linger_close`).
        let linger_s = linger.filter(|&n| n > 0).unwrap_or(0);
        self.linger_s.store(linger_s, Ordering::Release);
        let how = if abortive { CLOSED_ABORTIVE } else { CLOSED };
        self.closing.store(how, Ordering::Release);
        // A close that may wait: the progress thread's references go
        // first, so that the last one is this thread's (or a call's), not
        // a pass's on the progress thread, whose close waits for nothing
        // (`follow::Pins`; task xstall).
        if linger_s > 0 && fdtable::close_may_wait() && !reactor::on_progress_thread() {
            self.pins.close();
        }
    }

    fn nonblocking(&self) -> bool {
        self.nonblocking.load(Ordering::Relaxed)
    }

    fn set_nonblocking(&self, on: bool) {
        self.nonblocking.store(on, Ordering::Relaxed);
    }

    fn set_async(&self, on: bool) {
        self.signal_driven(on);
    }

    unsafe fn recvmsg(&self, msg: &mut msghdr, flags: c_int) -> isize {
        msg.msg_namelen = 0;
        msg.msg_controllen = 0;
        msg.msg_flags = 0;
        // SAFETY: the caller's msghdr.
        let (total, null) = unsafe { iov_total(msg) };
        if flags & libc::MSG_TRUNC != 0 {
            return self.recv_discarding(total, flags);
        }
        if null {
            // Only null buffers (`iovs` leaves them out: the receive
            // returned 0, the end of stream).
            return self.recv_into_null(flags);
        }
        // SAFETY: the caller's msghdr.
        let mut bufs = unsafe { iovs(msg, |b| b) };
        let mut eor = false;
        let r = self.recv_bufs(&mut bufs, flags, &mut eor);
        if eor {
            msg.msg_flags |= libc::MSG_EOR;
        }
        r
    }

    unsafe fn sendmsg(&self, msg: &msghdr, flags: c_int) -> isize {
        // SAFETY: the caller's msghdr.
        let bufs = unsafe { iovs(msg, |b| &*b) };
        self.send_bufs(&bufs, flags)
    }

    unsafe fn recv_one(&self, buf: *mut c_void, len: usize, flags: c_int) -> isize {
        if flags & libc::MSG_TRUNC != 0 {
            return self.recv_discarding(len, flags);
        }
        if len == 0 || buf.is_null() {
            if len > 0 {
                // (An empty receive here returned 0, the end of stream.)
                return self.recv_into_null(flags);
            }
            return self.recv_bufs(&mut [], flags, &mut false);
        }
        // SAFETY: the caller's buffer of `len` bytes.
        let one = unsafe { std::slice::from_raw_parts_mut(buf.cast::<u8>(), len) };
        self.recv_bufs(&mut [one], flags, &mut false)
    }

    unsafe fn send_one(&self, buf: *const c_void, len: usize, flags: c_int) -> isize {
        if len == 0 || buf.is_null() {
            if len > 0 {
                // As TCP's copy from a null buffer (an empty send here
                // returned 0: a program's write loop spun).
                set_errno(libc::EFAULT);
                return -1;
            }
            return self.send_bufs(&[], flags);
        }
        // SAFETY: the caller's buffer of `len` bytes.
        let one = unsafe { std::slice::from_raw_parts(buf.cast::<u8>(), len) };
        self.send_bufs(&[one], flags)
    }

    fn connect(&self, _addr: *const sockaddr, _len: socklen_t) -> c_int {
        let mut g = self.inner.lock();
        if std::mem::take(&mut g.connect_pending) {
            return 0;
        }
        set_errno(libc::EISCONN);
        -1
    }

    fn bind(&self, _addr: *const sockaddr, _len: socklen_t) -> c_int {
        set_errno(libc::EINVAL);
        -1
    }

    fn setsockopt(&self, level: c_int, name: c_int, val: *const c_void, len: socklen_t) -> c_int {
        self.set_option(level, name, val, len)
    }

    fn getsockopt(
        &self,
        level: c_int,
        name: c_int,
        val: *mut c_void,
        len: *mut socklen_t,
    ) -> c_int {
        self.get_option(level, name, val, len)
    }

    fn shutdown(&self, how: c_int) -> c_int {
        self.shutdown_call(how)
    }

    fn direct_watch(&self) -> Option<c_int> {
        super::config::get().epoll_direct.then(|| self.x.tcp_fd())
    }

    fn direct_cover(&self, on: bool) {
        self.x.set_direct(on);
        if on {
            // What arrived before the set watched shows on the doorbell
            // (a round that did not ring while no one could wait).
            self.x.show_now(|r| self.reflect(r));
        }
    }

    fn direct_failed(&self) {
        self.keep_watched();
    }

    fn direct_arrival(&self, report: bool) -> Option<u32> {
        // As the progress thread's round: the look shown under the
        // socket's lock (no bell for bytes a receive took meanwhile).
        let mut shown = None;
        let made = self.x.progress_if_idle(|r| {
            if report && r.readable && !r.hup && !r.error && !r.rdhup {
                // Reported by the caller: no bell (a receive that leaves
                // bytes rings for them, as after a `poll`'s report). A
                // hang-up, an error or the peer's end of stream shows on
                // the doorbell itself (readable for good: the program's
                // registration of it reports there, which the caller
                // collects; reported here too, a set saw each twice).
                self.inner.reflect(r, self, || false);
                shown = Some(r);
            } else {
                self.reflect(r);
            }
        });
        if !made && !self.x.parked() {
            // A call drives the engine unparked (its last round, after
            // which a call parked no longer reads): what woke the wait
            // may have come after that round read. The progress thread's
            // watch is re-armed at the call's end (epoll looks at
            // readiness again); the program's set is asked to look again
            // by the caller.
            return None;
        }
        // Outside the socket's lock (a hang-up's look takes the books').
        Some(shown.map_or(0, |r| self.shown(r) as u16 as u32))
    }

    fn direct_look(&self) {
        self.x.show_now(|r| self.reflect(r));
    }

    fn direct_level(&self) -> u32 {
        let r = self.x.readiness_now();
        if r.readable && !r.hup && !r.error && !r.rdhup {
            WAIT_READABLE as u16 as u32
        } else {
            // Shown on the doorbell (a hang-up, an error, the peer's end
            // of stream: shown now if no look showed it yet), or nothing.
            if r.rdhup {
                self.reflect(r);
            }
            0
        }
    }

    fn wait_begin(&self) -> Option<Wait> {
        // Seen by `bell_heard` from now on (until `wait_end`): rings for
        // what arrives meanwhile.
        self.polls.fetch_add(1, Ordering::SeqCst);
        // What is processed already shows on the doorbell (a round that
        // did not ring for it, below or while no one waited, is followed
        // by this).
        let r = self.x.readiness_now();
        if r.readable {
            self.reflect(r);
        }
        if self.x.parked() {
            self.x.poller(true);
            return Some(Wait {
                fds: Vec::new(),
                claim: Box::new(PollerClaim),
                chunked: false,
            });
        }
        let mut fds = SPARE_FDS.take();
        fds.clear();
        fds.push(self.x.tcp_fd());
        let (claim, chunked): (Box<dyn std::any::Any>, _) =
            if self.x.watching() == XSocket::WATCH_INPUT && self.stand_in() {
                (Box::new(StandInClaim), true)
            } else {
                (Box::new(DirectClaim), false)
            };
        Some(Wait {
            fds,
            claim,
            chunked,
        })
    }

    fn wait_end(&self, wait: Wait, revents: &[i16]) -> i16 {
        self.polls.fetch_sub(1, Ordering::SeqCst);
        if wait.claim.is::<DirectClaim>() {
            SPARE_FDS.set(wait.fds);
            if revents.first().is_some_and(|&r| r != 0) {
                if let Some(r) = self.x.progress_for_poll() {
                    // This poll reports what it processed itself; the
                    // doorbell is rung for it only if someone may wait on
                    // the doorbell alone (the progress thread watches
                    // then): a bell costs a write here and a drain in the
                    // receive.
                    //
                    // And whenever the round leaves nothing readable: the
                    // look drains bells the round made stale, and opens a
                    // gated send's gate (a gate shut keeps the watch on,
                    // `XSocket::set_writable_wait`, so that look is applied
                    // above whenever the gate is shut). Not readable, a
                    // look rings nothing.
                    //
                    // And for an epoll set that watches the connection
                    // itself: this round took its edge (`XSocket::covered`;
                    // its wait found nothing for bytes the poll saw).
                    if self.x.watching() != XSocket::WATCH_OFF || !r.readable || self.x.covered() {
                        self.reflect(r);
                    }
                    // Readable after the round, under its lock: that is
                    // the answer (only a receive takes it away), without
                    // taking the socket's lock again to look.
                    if r.readable {
                        return self.shown(r);
                    }
                }
            }
        } else if wait.claim.is::<StandInClaim>() {
            SPARE_FDS.set(wait.fds);
            return self.stood_end(revents);
        } else if wait.claim.is::<PollerClaim>() {
            self.x.poller(false);
        }
        self.shown(self.x.readiness_now())
    }

    fn ioctl(&self, req: c_ulong, arg: usize) -> c_int {
        match req {
            libc::FIONREAD if arg != 0 => {
                // What arrived counts, processed or not (as the kernel's
                // queue does for TCP): nothing may have processed it yet.
                self.x.show_after_round(|r| self.reflect(r));
                // SAFETY: FIONREAD's argument is an int out-pointer.
                unsafe { *(arg as *mut c_int) = self.x.readable_bytes() as c_int };
                0
            }
            // SIOCOUTQ (= TIOCOUTQ) and SIOCOUTQNSD: the DDP stream's send
            // queue (`XSocket::send_queue_bytes`: the send buffer, the
            // engine's backlog, the kernel's queue under it).
            libc::TIOCOUTQ | SIOCOUTQNSD if arg != 0 => {
                let q = self.x.send_queue_bytes(req == SIOCOUTQNSD);
                // Its round may have moved readiness (as FIONREAD's).
                self.x.show_now(|r| self.reflect(r));
                // SAFETY: both requests' argument is an int out-pointer.
                unsafe { *(arg as *mut c_int) = q.min(c_int::MAX as usize) as c_int };
                0
            }
            // SAFETY: forwarding to the TCP socket.
            _ => unsafe { real::ioctl(self.kfd, req, arg) },
        }
    }
}

/// `SIOCOUTQNSD` (linux/sockios.h; the libc crate lacks it).
const SIOCOUTQNSD: c_ulong = 0x894B;

/// The doorbell as [`Follow::reflect`] drives it, with one duty more: the
/// write gate's opening ends the engine's wait for writability
/// ([`XSocket::set_writable_wait`]), under the books' lock like the gate's
/// shutting in `send_bufs`. Only there: a round that found the socket
/// writable ended the wait itself before, while its look could be skipped
/// (older than one applied) or not applied (a `poll` round that left input
/// readable), and the credit it saw spent again by a receive's CREDIT: a
/// shut gate, the watch off, the `stream` C case's hang.
///
/// Once the exit began its closes ([`close::exit_begun`]) nothing that
/// wakes a waiter is done — a bell, the gate's opening, a hang-up, an
/// error: what changes then is the peers' answers to those closes, which
/// TCP's process never sees (review r25-c item 4).
impl super::follow::Bell for DdpSock {
    fn ring(&self, count: &mut usize) -> bool {
        !close::exit_begun() && self.bell.ring(count)
    }

    fn drain(&self, count: &mut usize) {
        self.bell.drain(count);
    }

    fn set_writable(&self, on: bool) {
        if !on || !close::exit_begun() {
            self.bell.set_writable(on);
        }
        if on {
            self.x.set_writable_wait(false);
        }
    }

    fn read_closed(&self) {
        if !close::exit_begun() {
            self.bell.shut_reading();
        }
    }

    fn hang_up(&self) {
        if !close::exit_begun() {
            self.bell.hang_up();
        }
    }

    fn fail(&self) {
        if !close::exit_begun() {
            self.bell.fail();
        }
    }
}
