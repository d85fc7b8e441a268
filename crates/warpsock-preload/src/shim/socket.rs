//! What a kind of managed socket implements.
//!
//! * [`Socket`]: one managed socket, named by one or more of the program's
//!   descriptors (the [`super::fdtable`] maps each to its object). The
//!   interposed calls on such a descriptor land here; every method has a
//!   default that forwards to the hidden kernel socket ([`Socket::kernel_fd`]),
//!   so a kind overrides only what it changes.
//! * [`Kind`]: how descriptors become managed (a kernel socket is first a
//!   *candidate* of one kind, from `socket()`, and is *adopted* when it binds
//!   or talks to a destination the kind's policy takes) and what the kind
//!   does at the process's life-cycle points (exec, exit, `_exit`, fork).
//!
//! Both are called under the re-entrancy guard ([`super::guard::enter`]);
//! their system calls go through [`super::real`].

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use libc::{c_int, c_ulong, c_void, msghdr, sockaddr, socklen_t};

use super::real;

/// One managed socket.
pub(crate) trait Socket: Send + Sync {
    /// The kernel socket calls are forwarded to (names, options, ioctls),
    /// and which the program's descriptor becomes again before exec and in
    /// a forked child.
    fn kernel_fd(&self) -> c_int;

    /// One more program descriptor names this socket (dup, fork table copy).
    fn add_ref(&self);

    /// A program descriptor naming this socket was closed; the last one
    /// ends the socket.
    fn release(&self);

    /// O_NONBLOCK of the program's open file description.
    fn nonblocking(&self) -> bool;

    /// The program changed O_NONBLOCK (`fcntl(F_SETFL)`, `ioctl(FIONBIO)`).
    fn set_nonblocking(&self, on: bool);

    /// The program turned signal-driven I/O on or off (`O_ASYNC` by
    /// `fcntl(F_SETFL)`, `ioctl(FIOASYNC)`), already made on the file its
    /// number names: a kind whose readiness only shows where a waiter can
    /// hear it makes it show for every arrival from then on, so that the
    /// kernel's `SIGIO` follows the socket as it follows TCP's.
    fn set_async(&self, _on: bool) {}

    /// Every receive call (`recv`, `recvfrom`, `recvmsg`, `read`, `readv`,
    /// the `_chk` forms, each `recvmmsg` entry) lands here.
    ///
    /// # Safety
    /// `msg` is a valid msghdr whose buffers are writable.
    unsafe fn recvmsg(&self, msg: &mut msghdr, flags: c_int) -> isize;

    /// Every send call (`send`, `sendto`, `sendmsg`, `write`, `writev`,
    /// each `sendmmsg` entry) lands here.
    ///
    /// # Safety
    /// `msg` is a valid msghdr whose buffers are readable.
    unsafe fn sendmsg(&self, msg: &msghdr, flags: c_int) -> isize;

    /// A receive into one buffer that asks for no name (`recv`, `read`,
    /// `recvfrom` without an address, their `_chk` forms): by default
    /// [`Self::recvmsg`] of one iovec; a kind may take the buffer as it is
    /// (no message header built and walked per call).
    ///
    /// # Safety
    /// `buf` is writable for `len` bytes (or null with `len` 0).
    unsafe fn recv_one(&self, buf: *mut c_void, len: usize, flags: c_int) -> isize {
        let mut v = libc::iovec {
            iov_base: buf,
            iov_len: len,
        };
        // SAFETY: msghdr is plain data; all-zero is an empty message.
        let mut m: msghdr = unsafe { std::mem::zeroed() };
        m.msg_iov = &mut v;
        m.msg_iovlen = 1;
        // SAFETY: `m` names the caller's writable buffer.
        unsafe { self.recvmsg(&mut m, flags) }
    }

    /// A send of one buffer to no address (`send`, `write`): by default
    /// [`Self::sendmsg`] of one iovec (see [`Self::recv_one`]).
    ///
    /// # Safety
    /// `buf` is readable for `len` bytes (or null with `len` 0).
    unsafe fn send_one(&self, buf: *const c_void, len: usize, flags: c_int) -> isize {
        let mut v = libc::iovec {
            iov_base: buf.cast_mut(),
            iov_len: len,
        };
        // SAFETY: as in `recv_one`.
        let mut m: msghdr = unsafe { std::mem::zeroed() };
        m.msg_iov = &mut v;
        m.msg_iovlen = 1;
        // SAFETY: `m` names the caller's readable buffer.
        unsafe { self.sendmsg(&m, flags) }
    }

    /// `connect(2)`.
    fn connect(&self, addr: *const sockaddr, len: socklen_t) -> c_int {
        // SAFETY: forwarding the program's arguments to the kernel socket
        // (raw: no cancellation point inside the library).
        unsafe { super::sys::connect_raw(self.kernel_fd(), addr, len) }
    }

    /// `bind(2)`.
    fn bind(&self, addr: *const sockaddr, len: socklen_t) -> c_int {
        // SAFETY: forwarding the program's arguments to the kernel socket.
        unsafe { real::bind(self.kernel_fd(), addr, len) }
    }

    /// `setsockopt(2)`.
    fn setsockopt(&self, level: c_int, name: c_int, val: *const c_void, len: socklen_t) -> c_int {
        // SAFETY: forwarding the program's arguments to the kernel socket.
        unsafe { real::setsockopt(self.kernel_fd(), level, name, val, len) }
    }

    /// `shutdown(2)`.
    fn shutdown(&self, how: c_int) -> c_int {
        // SAFETY: forwarding the program's arguments to the kernel socket.
        unsafe { real::shutdown(self.kernel_fd(), how) }
    }

    /// A program's `poll`/`ppoll` is about to wait for input on this socket:
    /// descriptors to watch alongside it (so that the reply wakes the
    /// program itself, with no thread hand-off), claimed until
    /// [`Socket::wait_end`]. `None`: only the program's descriptor.
    fn wait_begin(&self) -> Option<Wait> {
        None
    }

    /// The wait returned; `revents` holds what each of the extra
    /// descriptors reported. Takes up what arrived, gives the descriptors
    /// back, and returns the poll bits the program's descriptor shows now
    /// beside what the real call saw on it (which came before what was
    /// taken up here): `POLLIN` if readable, and for a kind whose round
    /// may find the connection finished or failed, the hang-up's bits and
    /// `POLLERR` ([`WAIT_READABLE`], [`WAIT_HUNG_UP`], [`WAIT_FAILED`]).
    /// The caller keeps those the program asked for, and `POLLERR` and
    /// `POLLHUP` always, as the kernel's poll.
    fn wait_end(&self, wait: Wait, revents: &[i16]) -> i16 {
        let _ = (wait, revents);
        0
    }

    /// A program's `poll`/`ppoll` whose only managed descriptor is this
    /// socket's, `fds[at]`, waited on for input only, among at most
    /// [`POLL_ALONE_MAX`] descriptors (the event loop's common shape: the
    /// socket, maybe a plain descriptor or two beside it): the kind's fast
    /// path in place of [`Socket::wait_begin`], the real call and
    /// [`Socket::wait_end`]. `wait(fds, left)` is the real call. Returns
    /// the real call's result with every `revents` set as the general path
    /// would set it, or `None`: nothing was done, the general path follows.
    fn poll_alone(
        &self,
        fds: &mut [libc::pollfd],
        at: usize,
        left: Option<Duration>,
        wait: PollCall<'_>,
    ) -> Option<c_int> {
        let _ = (fds, at, left, wait);
        None
    }

    /// A program's `poll`/`ppoll` waits for `POLLOUT` on this socket: a
    /// descriptor whose `POLLOUT` says it instead of the program's (a send
    /// would fail with `EAGAIN` until then). `None`: the program's
    /// descriptor.
    fn write_wait(&self) -> Option<c_int> {
        None
    }

    /// Poll bits the kernel shows on the program's descriptor that this
    /// kind's sockets never show, taken out of what a `poll` or an epoll
    /// registration asks of the descriptor: a stream socket's descriptor
    /// is a doorbell (a Unix socket, whose `unix_poll` shows `POLLWRBAND`
    /// with `POLLOUT`) where TCP never shows `POLLWRBAND` (`tcp_poll`:
    /// [`TCP_NEVER_SHOWS`]). Asked only of a poll or registration that
    /// asks for one of [`NEVER_SHOWN`].
    fn never_shows(&self) -> i16 {
        0
    }

    /// A descriptor that becomes readable when the program's number stops
    /// naming this socket's file and names another (a switching socket's
    /// end: `xsock::switching`), while that is still to come. A `select`
    /// over the number watches it too (`interpose::wait::select`): the
    /// kernel's select stays queued on the files it first found and would
    /// not hear of the new file's input; readable at once if the change
    /// came already (the caller looked the number up before it: it looks
    /// again). `None`: the number keeps its file.
    fn file_change(&self) -> Option<c_int> {
        None
    }

    /// `ioctl(2)` other than `FIONBIO` (which the interposition layer
    /// applies to the program's descriptor and reports through
    /// [`Socket::set_nonblocking`]).
    fn ioctl(&self, req: c_ulong, arg: usize) -> c_int {
        // SAFETY: forwarding the program's arguments to the kernel socket.
        unsafe { real::ioctl(self.kernel_fd(), req, arg) }
    }

    /// `getsockopt(2)`.
    fn getsockopt(
        &self,
        level: c_int,
        name: c_int,
        val: *mut c_void,
        len: *mut socklen_t,
    ) -> c_int {
        // SAFETY: forwarding the program's arguments to the kernel socket.
        unsafe { real::getsockopt(self.kernel_fd(), level, name, val, len) }
    }

    /// The descriptor the program's number becomes before exec and in a
    /// forked child (default: the kernel socket). A kind whose kernel
    /// socket carries a protocol the program must not write into raw
    /// gives something else.
    fn demote_fd(&self) -> c_int {
        self.kernel_fd()
    }

    /// The process that made this socket managed (its switch's or
    /// adoption's `getpid`; 0: any). A process other than it that finds
    /// the socket in its table borrows the entry: a child made without
    /// the fork handlers (`vfork`, `_Fork`, `clone`), whose `close` and
    /// `dup`s of it are the system calls alone ([`super::fdtable::borrowed`]).
    fn owner_pid(&self) -> i32 {
        0
    }

    /// A `dup` of one of the socket's numbers is about to be made (its
    /// system call, then its table entry): a kind whose sockets change
    /// under their numbers by themselves (`xsock::switching`) holds that
    /// change off until [`Self::dup_end`], so that the copy's open file and
    /// its entry are the same socket's. Returns whether it holds (then
    /// `dup_end` must follow); default: no.
    fn dup_begin(&self) -> bool {
        false
    }

    /// The `dup` [`Self::dup_begin`] held for is made.
    fn dup_end(&self) {}

    /// Waits until the socket is what it will be: a kind whose sockets
    /// change under the program's number by themselves (a connection
    /// switching in the background, `xsock::switching`) returns once the
    /// number names the outcome (default: at once). `Err(EAGAIN)`, without
    /// waiting, for such a socket in non-blocking mode whose outcome is
    /// not known yet.
    fn settle_wait(&self) -> Result<(), c_int> {
        Ok(())
    }

    /// The program added (`EPOLL_CTL_ADD`), changed or removed its
    /// registration `reg` of this socket in its epoll set `epfd`: a kind
    /// whose sockets change under the program's number by themselves (a
    /// switching connection) keeps it for what the socket becomes and
    /// returns `true`. Default `false`: [`super::epollwatch::follow`]
    /// follows it for this socket.
    fn epoll_change(&self, epfd: c_int, op: c_int, reg: super::epollwatch::Reg) -> bool {
        let _ = (epfd, op, reg);
        false
    }

    /// A descriptor of the library's that the program's epoll sets may
    /// watch for this socket's input themselves ([`super::epollwatch`]):
    /// its events are taken up by [`Self::direct_arrival`]. `None`
    /// (default): the sets see the socket through its doorbell alone.
    fn direct_watch(&self) -> Option<c_int> {
        None
    }

    /// One more (`true`) or one fewer of the program's epoll sets watches
    /// [`Self::direct_watch`]: while one does, an epoll wait needs no one
    /// else to take input up. Every start is followed by its end, or by
    /// the socket's end.
    fn direct_cover(&self, _on: bool) {}

    /// A set holding the socket cannot watch [`Self::direct_watch`] (not
    /// one the process made, the kernel refused): the socket's input must
    /// reach its doorbell without the program's calls, as before
    /// [`super::epollwatch`].
    fn direct_failed(&self) {}

    /// A program's epoll wait heard of input on [`Self::direct_watch`]:
    /// take it up. If `report`, the caller reports what the socket shows
    /// itself (returned: the epoll bits, `EPOLLIN` if readable, the
    /// hang-up's and `EPOLLERR`), and no bell is rung for input; else the
    /// doorbell shows it (returns 0). `None`: another thread's call is
    /// taking input up and may have missed what woke the wait — the
    /// caller looks again ([`super::epollwatch::look_again`]).
    fn direct_arrival(&self, report: bool) -> Option<u32> {
        let _ = report;
        Some(0)
    }

    /// A registration of the socket was added or changed in one of the
    /// program's epoll sets: input a wait reported itself (no bell) is
    /// shown on the doorbell now, for the kernel's look at the new
    /// registration ([`super::epollwatch::follow`]).
    fn direct_look(&self) {}

    /// What the socket shows now for a program's epoll wait that reported
    /// its input itself before ([`Self::direct_arrival`]), without a round:
    /// the epoll bits as `direct_arrival` gives them (0: nothing).
    fn direct_level(&self) -> u32 {
        0
    }

    /// The descriptor the program's number names while this socket is
    /// managed (what the switch put there), for an exec that failed after
    /// its demotion: the number is put back on it and the socket managed
    /// again. `None`: the kind does not put it back (the number stays on
    /// [`Self::demote_fd`], the socket released).
    fn managed_target(&self) -> Option<c_int> {
        None
    }

    /// What `getpeername` answers where the kernel socket does not know
    /// the program's connection: a DDP socket's engine ends its TCP
    /// connection at the peer's close (TCP's CLOSE_WAIT to the program:
    /// still connected), and keeps it after both ends shut their streams
    /// (TCP's CLOSE: `ENOTCONN`).
    fn peer_name(&self) -> PeerName {
        PeerName::Kernel
    }

    /// Whether a `poll` that asks for neither input nor room — only what
    /// every poll gets, `POLLERR` and `POLLHUP` (`events` 0, or
    /// `POLLERR`) — drives this socket ([`Self::wait_begin`]): a failure
    /// may still come that only a round of progress takes in. Not where
    /// the extra descriptors would stay ready with nothing to show (the
    /// poll would spin), nor for a kind whose wait does more than watch.
    fn watch_for_end(&self) -> bool {
        false
    }
}

/// [`Socket::peer_name`]'s answer.
pub(crate) enum PeerName {
    /// The kernel socket's answer stands.
    Kernel,
    /// Connected to this peer, whatever the kernel socket says.
    Connected(SocketAddr),
    /// Not connected any more (`ENOTCONN`), whatever the kernel socket
    /// says.
    Closed,
}

/// A kind of managed socket: adoption and life-cycle hooks.
pub(crate) trait Kind: Sync {
    /// Whether the kind is switched on at all (its environment variable).
    /// A kind that is off never sees a candidate.
    fn enabled(&self) -> bool;

    /// Whether a fresh `socket(domain, ty, protocol)` descriptor becomes a
    /// candidate of this kind.
    fn wants(&self, domain: c_int, ty: c_int, protocol: c_int) -> bool;

    /// A candidate was bound to `addr` (the real bind succeeded). The kind
    /// may adopt it here (the UDP offload opens its listener).
    fn bound(&self, fd: c_int, addr: SocketAddr);

    /// A candidate is about to talk to `dest` (after a successful
    /// `connect`, or before a send naming it): adopt it now, or not.
    fn adopt(&self, fd: c_int, dest: SocketAddr) -> Adoption;

    /// A candidate's non-blocking `connect` to `dest` returned
    /// `EINPROGRESS`: the kind may finish it (wait for the connection) and
    /// return true, so the call completes at once and [`Kind::adopt`]
    /// follows (default: no).
    fn finish_connect(&self, _fd: c_int, _dest: Option<SocketAddr>) -> bool {
        false
    }

    /// A candidate listening socket `listener` accepted `fd` (default:
    /// nothing; `fd` is a plain kernel socket).
    fn accepted(&self, _listener: c_int, _fd: c_int) {}

    /// `setsockopt`/`getsockopt` at an option level the kind owns, on a
    /// descriptor that is not managed (default: not the kind's level).
    /// Returns `None` if `level` is not the kind's.
    fn plain_sockopt(&self, _fd: c_int, _level: c_int, _op: SockOpt) -> Option<c_int> {
        None
    }

    /// When the library is loaded (before `main`).
    fn loaded(&self) {}

    /// Whether the kind needs the fork and exit handlers installed
    /// (default: when it is enabled).
    fn needs_hooks(&self) -> bool {
        self.enabled()
    }

    /// Before the program waits in a call that sees managed descriptors
    /// only through their doorbells (`select`, `pselect`): readiness must
    /// not depend on a later call of the program.
    fn before_wait(&self) {}

    /// Before the program waits in the `epoll_wait` family: as
    /// [`Self::before_wait`], except for sockets whose connections the
    /// program's sets watch themselves ([`super::epollwatch`]). Default:
    /// [`Self::before_wait`].
    fn before_epoll_wait(&self) {
        self.before_wait();
    }

    /// Before `execve` and friends: flush what must reach the kernel.
    fn before_exec(&self) {}

    /// After `execve` and friends returned (the exec failed): undo what
    /// [`Self::before_exec`] did only for an exec that is made.
    fn exec_failed(&self) {}

    /// From the `atexit` handler, which ran over `over` (found once for
    /// every kind).
    fn at_exit(&self, _over: super::guard::ExitOver) {}

    /// From `_exit`/`_Exit` (no exit handlers run), made over `over`
    /// ([`super::guard::ExitOver::seen`]: the sleep's mark left). Over a
    /// stretch that may hold locks ([`super::guard::ExitOver::Locks`])
    /// every lock only tried and nothing allocated, or nothing.
    fn exit_flush(&self, _over: super::guard::ExitOver) {}
}

/// A socket option call, for [`Kind::plain_sockopt`].
#[derive(Clone, Copy)]
pub(crate) enum SockOpt {
    /// `setsockopt(name, val, len)`.
    Set(c_int, *const c_void, socklen_t),
    /// `getsockopt(name, val, len)`.
    Get(c_int, *mut c_void, *mut socklen_t),
}

/// The most descriptors a poll may hold for [`Socket::poll_alone`].
pub(crate) const POLL_ALONE_MAX: usize = 7;

/// The real `poll`/`ppoll` of a program's wait: the descriptors, and how
/// long at most (`None`: no limit).
pub(crate) type PollCall<'a> = &'a mut dyn FnMut(&mut [libc::pollfd], Option<Duration>) -> c_int;

/// [`Socket::wait_end`]'s answer for a readable descriptor.
pub(crate) const WAIT_READABLE: i16 = libc::POLLIN;

/// [`Socket::wait_end`]'s answer for a descriptor hung up (finished both
/// ways): what a doorbell pair's hung-up end shows, but `POLLWRBAND`
/// (TCP's, [`TCP_NEVER_SHOWS`]).
pub(crate) const WAIT_HUNG_UP: i16 = libc::POLLIN
    | libc::POLLRDNORM
    | libc::POLLOUT
    | libc::POLLWRNORM
    | libc::POLLHUP
    | libc::POLLRDHUP;

/// What TCP's poll never shows (`tcp_poll` sets `POLLOUT | POLLWRNORM`
/// for room, never `POLLWRBAND`): [`Socket::never_shows`] of the stream
/// kinds, whose descriptor is a doorbell that would.
pub(crate) const TCP_NEVER_SHOWS: i16 = libc::POLLWRBAND;

/// The bits any kind's [`Socket::never_shows`] may name: a poll that asks
/// for none of them (the common one) is not looked at.
pub(crate) const NEVER_SHOWN: i16 = TCP_NEVER_SHOWS;

/// The events of the program's descriptor `p` of the socket `s` asked of
/// the kernel: what the program asked but what the kind never shows
/// ([`Socket::never_shows`]).
#[inline(always)]
pub(crate) fn kernel_asks(s: &dyn Socket, p: &libc::pollfd) -> libc::pollfd {
    let mut q = *p;
    if q.events & NEVER_SHOWN != 0 {
        q.events &= !s.never_shows();
    }
    q
}

/// [`Socket::wait_end`]'s answer for a hung-up descriptor whose
/// connection's error is pending (`POLLERR`).
pub(crate) const WAIT_FAILED: i16 = WAIT_HUNG_UP | libc::POLLERR;

/// Extra descriptors a program's wait watches for a managed socket, and
/// the kind's claim on them (given back when dropped).
pub(crate) struct Wait {
    /// The descriptors, watched for input.
    pub(crate) fds: Vec<c_int>,
    /// Whatever the kind needs back in [`Socket::wait_end`].
    pub(crate) claim: Box<dyn std::any::Any>,
    /// Whether the real wait lasts [`WAIT_CHUNK`] at most before
    /// [`Socket::wait_end`]: a longer one is made of such waits, each
    /// begun and ended (a DDP `poll` that stands in for the progress
    /// thread renews its lease so, `XSocket::STAND_LEASE`).
    pub(crate) chunked: bool,
}

/// The longest real wait of a [`Wait`] that is `chunked`.
pub(crate) const WAIT_CHUNK: Duration = Duration::from_millis(500);

/// What [`Kind::adopt`] decided.
pub(crate) enum Adoption {
    /// The descriptor is managed now, by this socket (already in the
    /// descriptor table).
    Adopted(Arc<dyn Socket>),
    /// Not for this destination: the call goes to the kernel socket, which
    /// stays a candidate (after a `connect`, it stops being one).
    NotThis,
    /// Never: the descriptor stops being a candidate.
    Never,
}
