//! The interposed libc entry points.
//!
//! Each one first asks the descriptor table whether the descriptor is an
//! offloaded socket (or a UDP socket that may become one); everything else
//! goes straight to the real function after one relaxed atomic load. The
//! offload paths run under a thread-local guard (calls the library itself
//! makes never re-enter them) and `catch_unwind` (a bug becomes `EIO`, never
//! an unwind into C).

#![allow(clippy::missing_safety_doc)]

use std::mem::zeroed;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use libc::{
    c_char, c_int, c_uint, c_ulong, c_void, iovec, mmsghdr, msghdr, size_t, sockaddr, socklen_t,
    ssize_t,
};

use crate::shim::fdtable::{self, MANAGED};
use crate::shim::guard::{busy, enter};
use crate::shim::socket::{Adoption, Kind, PeerName, SockOpt, Socket};
use crate::shim::sys::{self, set_errno};
use crate::shim::{epollcarry, reactor, real};

/// The kinds of managed socket. A descriptor is a candidate of at most one
/// (the first whose `wants` says yes); its mark in the descriptor table
/// is its 1-based index here.
pub(crate) static KINDS: &[&dyn Kind] = &[&crate::udp::UDP, &crate::xsock::DDP];

/// A data call on `fd`: `$offload` (a closure) with the managed socket,
/// or the expression `$real`. The pass-through check, all that it costs a
/// descriptor the library does not manage, is a byte of the descriptor
/// table; the managed path is a function of its own (`#[inline(never)]`),
/// so that the check and the jump to the real function need no stack
/// frame (inlined, the managed path's frame cost a kernel socket's `send`
/// 31 instructions, not 15).
macro_rules! dispatch {
    ($fd:expr, $real:expr, $offload:expr $(,)?) => {{
        #[cfg(feature = "test-hooks")]
        crate::shim::hooks::audit::call();
        if fdtable::maybe_managed($fd) {
            dispatch_managed($fd, move || $real, $offload)
        } else {
            $real
        }
    }};
}

/// The waiting calls: `poll`, `ppoll`, `select`, `pselect`, the
/// `epoll_wait` family.
pub mod wait;

pub(crate) mod adopting;

/// Interposed calls over the thread's own hold of the table's lock.
#[cfg(test)]
mod held_calls;

/// The entry points over a kind's socket.
#[cfg(test)]
mod tests;

/// The receiving and sending calls.
pub mod io;

/// `sendfile` and `splice` with a managed socket at one end.
pub mod transfer;

/// `fdopen`, `freopen`, `vdprintf`, `dprintf`: stdio on a managed socket.
pub mod stdio;

/// `dup`, `dup2`, `dup3`: a copy of a managed descriptor names its socket.
pub mod dups;

/// `close_range`, `closefrom`: a managed number in the range is closed as
/// `close` closes it.
pub mod ranges;
use dups::{dup_held, dup_refused, propagate};

/// glibc's second names of the interposed calls (`__poll`, `__read`, …).
pub mod aliases;

/// POSIX AIO on a managed socket: run by the library (glibc's own read the
/// doorbell).
pub mod aio;

/// `pthread_cancel` and the entry points' looks at a pending cancel.
pub mod cancel;
pub(crate) use cancel::{cancel_first, cancel_point, cancellable, cancellable_int};

/// `execl`, `execle`, `execlp`: the variadic execs, as their `v` forms.
#[cfg(target_arch = "x86_64")]
pub mod execl;

/// Feature marker: this library carries the UDP offload's
/// `WARPSOCK_UDP_MODE=gso|auto` path (UDP_SEGMENT/UDP_GRO). Programs probe
/// for it with `dlsym(RTLD_DEFAULT, "warpsock_feature_udp_gso")` (the
/// benchmark's apps suite does); its value means nothing. Another kind adds
/// its own `warpsock_feature_*` symbol the same way.
#[cfg_attr(not(test), export_name = "warpsock_feature_udp_gso")]
#[used]
pub static FEATURE_UDP_GSO: u8 = 1;

/// `dispatch!` of a descriptor that may be managed.
#[inline(never)]
fn dispatch_managed<R>(
    fd: c_int,
    real: impl FnOnce() -> R,
    offload: impl FnOnce(&Arc<dyn Socket>) -> R,
) -> R {
    #[cfg(feature = "test-hooks")]
    crate::shim::hooks::audit::managed_look();
    if busy() {
        return real();
    }
    // The data calls are cancellation points: a noted cancel is acted on
    // before the call (nothing of the library is live yet; a plain
    // descriptor's call is glibc's, which acts itself; review r23-c item 2).
    cancel_first();
    // A number a borrower (a vforked child) closed raw and reused: its
    // own, not the parent's socket (review r29-c item 2).
    if fdtable::borrowed_here(fd) {
        return real();
    }
    fdtable::with_marked(fd, real, offload)
}

#[inline]
fn managed(fd: c_int) -> Option<Arc<dyn Socket>> {
    #[cfg(feature = "test-hooks")]
    crate::shim::hooks::audit::call();
    if !fdtable::maybe_managed(fd) || busy() {
        return None;
    }
    // As in `dispatch_managed` (its users: `recvmmsg`, `sendmmsg`, ...).
    cancel_first();
    fdtable::get(fd)
}

/// The kind whose candidate a descriptor marked `mark` is, if that kind
/// may act on it now: not inside library code, nor over the thread's own
/// hold of the table's lock (a signal handler there: an adoption's or a
/// switch's side effects — a handshake on the wire, a registration —
/// would come before the table refused the new socket; the call stays a
/// plain one instead, `fdtable::held`; review r20-xhaz2b item 1).
pub(crate) fn acting_kind(mark: u8) -> Option<&'static &'static dyn Kind> {
    if busy() || fdtable::over_hold() {
        return None;
    }
    KINDS.get(fdtable::candidate_kind(mark)? - 1)
}

/// The managed socket behind `fd` (whose mark is `mark`, non-zero), or the
/// one its kind makes of the candidate `fd` about to talk to `dest()`.
pub(crate) fn target(
    fd: c_int,
    mark: u8,
    dest: impl FnOnce() -> Option<SocketAddr>,
) -> Option<Arc<dyn Socket>> {
    #[cfg(feature = "test-hooks")]
    crate::shim::hooks::audit::call();
    if busy() {
        return None;
    }
    // As in `dispatch_managed` (`sendto`, `sendmsg`, `connect`).
    cancel_first();
    if mark & MANAGED != 0 {
        return fdtable::get(fd);
    }
    let kind = acting_kind(mark)?;
    let dest = dest()?;
    // One adoption of a socket at a time, and only of one that is still a
    // candidate (`adopting`: per socket — a policy-mode connect's adoption
    // is its switch, which may wait for the peer). The claim is taken and
    // held inside the library (`enter`): a signal handler's call on this
    // thread meanwhile stays plain instead of waiting on this claim or
    // the claims' lock, which only the interrupted frame lets go.
    enter(None, || {
        let _one = adopting::Claim::take(fd);
        let mark = fdtable::mark(fd);
        if mark & MANAGED != 0 {
            return fdtable::get(fd);
        }
        fdtable::candidate_kind(mark)?;
        match kind.adopt(fd, dest) {
            Adoption::Adopted(s) => Some(s),
            Adoption::NotThis => None,
            Adoption::Never => {
                fdtable::set_candidate(fd, 0);
                None
            }
        }
    })
}

/// Before exec (or in a forked child): every managed socket that survives
/// becomes its plain kernel socket again, under the same number.
pub(crate) fn demote_all(only_inheritable: bool) {
    // A vforked child about to exec shares the parent's memory: it
    // re-points its own descriptors but leaves the table (the parent's) and
    // the parent's queues alone.
    let vforked = reactor::current().is_some_and(|e| !e.is_owner());
    let mut over_hold = false;
    for (fd, s) in fdtable::all_to_demote() {
        // SAFETY: fcntl/dup3 on descriptors of the table; no pointers.
        unsafe {
            let fdfl = real::fcntl(fd, libc::F_GETFD, 0);
            if fdfl < 0 || (only_inheritable && fdfl & libc::FD_CLOEXEC != 0) {
                continue;
            }
            sys::set_nonblocking(s.demote_fd(), s.nonblocking());
            let cloexec = if fdfl & libc::FD_CLOEXEC != 0 {
                libc::O_CLOEXEC
            } else {
                0
            };
            real::dup3(s.demote_fd(), fd, cloexec);
        }
        if vforked {
            continue;
        }
        // The state may be locked by a thread that no longer exists (fork):
        // never drop it here.
        match fdtable::remove(fd) {
            // Before an exec (every thread alive): kept for its failure.
            Ok(Some(old)) if only_inheritable => {
                sys::lock(&DEMOTED_FOR_EXEC).push((fd, old));
                drop(s);
                continue;
            }
            Ok(Some(old)) => std::mem::forget(old),
            Ok(None) => {}
            // Over the thread's hold (a handler's fork or exec): a child's
            // removals are made when the hold ends (`fdtable::held`).
            Err(_) => over_hold = true,
        }
        std::mem::forget(s);
    }
    if over_hold && !only_inheritable {
        fdtable::forget_at_hold_end();
    }
}

fn one_iov(buf: *mut c_void, len: size_t) -> iovec {
    iovec {
        iov_base: buf,
        iov_len: len,
    }
}

fn empty_msg() -> msghdr {
    // SAFETY: msghdr is plain data; all-zero is an empty message.
    unsafe { zeroed() }
}

// ---- creation, naming, options -------------------------------------------

/// Interposed `socket(2)`: a socket some kind wants becomes its candidate.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn socket(domain: c_int, ty: c_int, protocol: c_int) -> c_int {
    #[cfg(feature = "test-hooks")]
    crate::shim::hooks::audit::call();
    // SAFETY: forwarding the caller's arguments.
    let fd = unsafe { real::socket(domain, ty, protocol) };
    if fd >= 0 && !busy() {
        let kind = KINDS
            .iter()
            .position(|k| k.wants(domain, ty, protocol) && k.enabled())
            .map_or(0, |i| i + 1);
        if kind != 0 || fdtable::mark(fd) != 0 {
            fdtable::set_candidate(fd, kind);
        }
    }
    fd
}

/// Interposed `bind(2)`: the candidate's kind may adopt the socket (the
/// UDP offload does for an eligible port, and opens its TCP listener).
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn bind(fd: c_int, addr: *const sockaddr, len: socklen_t) -> c_int {
    if let Some(s) = managed(fd) {
        return enter(-1, || s.bind(addr, len));
    }
    // SAFETY: forwarding the caller's arguments.
    let r = unsafe { real::bind(fd, addr, len) };
    if r == 0 {
        if let Some(kind) = acting_kind(fdtable::mark(fd)) {
            // SAFETY: the kernel accepted `addr` of `len` bytes.
            if let Some(a) = unsafe { sys::addr_from_raw(addr, len) } {
                enter((), || kind.bound(fd, a));
            }
        }
    }
    r
}

/// Interposed `connect(2)`: a candidate that connects to a destination its
/// kind takes is adopted; otherwise it stays a kernel socket for good.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C-unwind" fn connect(fd: c_int, addr: *const sockaddr, len: socklen_t) -> c_int {
    // A cancellation point (`real::connect` is glibc's, with nothing
    // droppable live across it; the managed socket's own connect acts here
    // first: review r23-c item 1).
    cancel_first();
    let mark = fdtable::mark(fd);
    if mark & MANAGED != 0 {
        if let Some(s) = managed(fd) {
            return enter(-1, || s.connect(addr, len));
        }
    }
    // SAFETY: forwarding the caller's arguments.
    let mut r = unsafe { real::connect(fd, addr, len) };
    let kind = fdtable::candidate_kind(mark).and_then(|k| KINDS.get(k - 1));
    if r != 0 && sys::errno() == libc::EINPROGRESS {
        if let Some(k) = acting_kind(mark) {
            // SAFETY: the kernel took `addr` of `len` bytes.
            let dest = unsafe { sys::addr_from_raw(addr, len) };
            if enter(false, || k.finish_connect(fd, dest)) {
                r = 0;
            }
        }
    }
    if r != 0 && !busy() {
        // A policy-mode wait for the connection (`finish_connect`) that a
        // pending cancel ended: acted on here, with nothing of the library
        // live (glibc's own `connect` acted itself, if it was that).
        cancel_point(r as isize);
    }
    if r != 0 || kind.is_none() || busy() {
        return r;
    }
    // SAFETY: the kernel accepted `addr` of `len` bytes.
    let dest = unsafe { sys::addr_from_raw(addr, len) };
    if dest.is_some() {
        match target(fd, mark, || dest) {
            Some(s) => return enter(-1, || s.connect(addr, len)),
            None => fdtable::set_candidate(fd, 0),
        }
    }
    0
}

/// Interposed `accept4(2)`: a candidate listener's kind may adopt the new
/// connection.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C-unwind" fn accept4(
    fd: c_int,
    addr: *mut sockaddr,
    len: *mut socklen_t,
    flags: c_int,
) -> c_int {
    // SAFETY: forwarding the caller's arguments.
    let n = unsafe { real::accept4(fd, addr, len, flags) };
    if n >= 0 {
        if let Some(kind) = acting_kind(fdtable::mark(fd)) {
            enter((), || kind.accepted(fd, n));
        }
    }
    n
}

/// Interposed `accept(2)`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C-unwind" fn accept(
    fd: c_int,
    addr: *mut sockaddr,
    len: *mut socklen_t,
) -> c_int {
    // SAFETY: same contract as accept4.
    unsafe { accept4(fd, addr, len, 0) }
}

/// A socket option at a level some kind owns, on an unmanaged descriptor.
pub(crate) fn plain_sockopt(fd: c_int, level: c_int, op: SockOpt) -> Option<c_int> {
    if busy() || level < crate::xsock::FIRST_OWN_LEVEL {
        return None;
    }
    // A switch over the thread's own hold of the table's lock would be
    // refused after its handshake (`acting_kind`): refused before it.
    if matches!(op, SockOpt::Set(..)) && fdtable::over_hold() {
        set_errno(libc::EDEADLK);
        return Some(-1);
    }
    enter(Some(-1), || {
        KINDS.iter().find_map(|k| k.plain_sockopt(fd, level, op))
    })
}

/// Interposed `close(2)`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C-unwind" fn close(fd: c_int) -> c_int {
    if fdtable::maybe_managed(fd) && !busy() {
        if fdtable::borrowed(fd, -1) {
            // A vforked child (or one made without the fork handlers):
            // the table and its sockets are its parent's, the descriptor
            // number alone is its own (review r29-a item 1).
            // SAFETY: closing the caller's descriptor.
            return unsafe { libc::syscall(libc::SYS_close, libc::c_long::from(fd)) } as c_int;
        }
        // `close` is a cancellation point: a pending cancel is acted on
        // before the table changes, as glibc's acts before its system call
        // (the descriptor stays open and managed), and the close below is
        // the raw system call: no cancellation point with the socket taken
        // out of the table (review r23-c item 1).
        warpsock_xsock::cancel::testcancel();
        match fdtable::remove(fd) {
            Ok(Some(s)) => {
                epollcarry::before_close(fd, true);
                // The number's registrations leave the sets' books too (a
                // `dup` of it may live on).
                enter((), || crate::shim::epollwatch::number_closed(&s, fd));
                // SAFETY: closing the caller's descriptor.
                let r = unsafe { libc::syscall(libc::SYS_close, libc::c_long::from(fd)) } as c_int;
                enter((), || s.release());
                return r;
            }
            Ok(None) => {}
            // A signal handler over this thread's hold of the table's
            // lock: made when the hold ends (`fdtable::held`).
            Err(_) => match fdtable::defer_close(fd) {
                Ok(true) => return 0,
                Ok(false) => {}
                Err(e) => {
                    set_errno(e);
                    return -1;
                }
            },
        }
    }
    if fdtable::mark(fd) != 0 {
        fdtable::set_candidate(fd, 0);
    }
    if !busy() {
        epollcarry::before_close(fd, false);
    }
    // SAFETY: forwarding the caller's argument.
    unsafe { real::close(fd) }
}

/// Interposed `fcntl(2)`. Declared with one integer argument: on the
/// supported ABIs (x86-64, AArch64) a variadic caller passes it in the same
/// register, and commands without an argument ignore it.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C-unwind" fn fcntl(fd: c_int, cmd: c_int, arg: usize) -> c_int {
    if matches!(cmd, libc::F_DUPFD | libc::F_DUPFD_CLOEXEC) && dup_refused(fd, -1) {
        return -1;
    }
    // Looked up first: a socket that refuses (`fdtable::held`) fails the
    // call before the program's descriptor changes.
    let setfl = if cmd == libc::F_SETFL {
        managed(fd)
    } else {
        None
    };
    if setfl.as_ref().is_some_and(fdtable::is_refused) {
        set_errno(libc::EDEADLK);
        return -1;
    }
    if matches!(cmd, libc::F_DUPFD | libc::F_DUPFD_CLOEXEC) {
        return dup_held(fd, || {
            // SAFETY: forwarding the caller's arguments.
            let r = unsafe { real::fcntl(fd, cmd, arg) };
            if r >= 0 {
                propagate(fd, r);
            }
            r
        });
    }
    // SAFETY: forwarding the caller's arguments.
    let r = unsafe { real::fcntl(fd, cmd, arg) };
    if r >= 0 {
        if let (libc::F_SETFL, Some(s)) = (cmd, setfl) {
            s.set_nonblocking(arg as c_int & libc::O_NONBLOCK != 0);
            s.set_async(arg as c_int & libc::O_ASYNC != 0);
        }
    }
    r
}

/// Interposed `fcntl64` (same as `fcntl` on 64-bit targets).
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C-unwind" fn fcntl64(fd: c_int, cmd: c_int, arg: usize) -> c_int {
    // SAFETY: same contract as fcntl.
    unsafe { fcntl(fd, cmd, arg) }
}

/// Interposed `ioctl(2)` (one integer argument; see `fcntl`).
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn ioctl(fd: c_int, req: c_ulong, arg: usize) -> c_int {
    let Some(s) = managed(fd) else {
        // SAFETY: forwarding the caller's arguments.
        return unsafe { real::ioctl(fd, req, arg) };
    };
    enter(-1, || match req {
        libc::FIONBIO | libc::FIOASYNC if fdtable::is_refused(&s) => {
            set_errno(libc::EDEADLK);
            -1
        }
        // Both on the file the number names (the doorbell's end: the
        // kernel signals its readiness), not the socket's own call.
        libc::FIONBIO | libc::FIOASYNC => {
            // SAFETY: forwarding to the application's descriptor.
            let r = unsafe { real::ioctl(fd, req, arg) };
            if r == 0 && arg != 0 {
                // SAFETY: both take an int in-pointer.
                let on = unsafe { *(arg as *const c_int) } != 0;
                if req == libc::FIONBIO {
                    s.set_nonblocking(on);
                } else {
                    s.set_async(on);
                }
            }
            r
        }
        // Close-on-exec is the number's own flag, not the file's: the
        // program's number, which the exec path looks at
        // (`demote_all`). Passed on to the managed socket they set or
        // cleared the flag of the library's handle on the kernel socket
        // (the engine's own for a DDP socket: a `FIONCLEX` and an `exec`
        // leaked the connection into the new image; helper 77).
        libc::FIOCLEX | libc::FIONCLEX => {
            // SAFETY: forwarding to the application's descriptor.
            unsafe { real::ioctl(fd, req, arg) }
        }
        _ => s.ioctl(req, arg),
    })
}

/// `name` (`getsockname`/`getpeername`) of the descriptor that holds
/// `fd`'s name: its managed socket's kernel socket, or `fd`; -1 with
/// `EDEADLK` for a socket that refuses (`fdtable::held`).
///
/// The managed socket is held across the call: its kernel socket is a
/// number of the library's, closed when the object goes. A switching
/// socket whose switch ends meanwhile goes as soon as its thread lets it
/// (`xsock::switching`), and the number, taken again by the next
/// `accept`'s doorbell, then gave that socketpair's name: a preloaded
/// redis-server in protected mode read a plain client's address as
/// "/unixsocket" and refused it (a CI run of `scripts/test-xsock.sh`).
fn with_name_fd(fd: c_int, name: impl FnOnce(c_int) -> c_int) -> c_int {
    match managed(fd) {
        Some(s) if fdtable::is_refused(&s) => {
            set_errno(libc::EDEADLK);
            -1
        }
        Some(s) => {
            #[cfg(feature = "test-hooks")]
            crate::shim::hooks::name_gap(crate::xsock::switches_under_way);
            name(s.kernel_fd())
        }
        None => name(fd),
    }
}

/// Interposed `getsockname(2)`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn getsockname(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int {
    // SAFETY: forwarding the caller's arguments.
    with_name_fd(fd, |fd| unsafe { real::getsockname(fd, addr, len) })
}

/// Interposed `getpeername(2)`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn getpeername(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int {
    let ours = managed(fd).map(|s| enter(PeerName::Kernel, || s.peer_name()));
    if let Some(PeerName::Closed) = ours {
        // Linux's `inet_getname` answers for TCP's CLOSE before it looks
        // at the caller's buffer.
        set_errno(libc::ENOTCONN);
        return -1;
    }
    // SAFETY: forwarding the caller's arguments.
    let r = with_name_fd(fd, |fd| unsafe { real::getpeername(fd, addr, len) });
    if r < 0 && sys::errno() == libc::ENOTCONN {
        if let Some(PeerName::Connected(peer)) = ours {
            // After the peer's close, TCP's CLOSE_WAIT: still the peer's
            // name (review 58: `ENOTCONN`, a server's log line at the end
            // of a connection failed).
            if addr.is_null() || len.is_null() {
                set_errno(libc::EFAULT);
                return -1;
            }
            // SAFETY: the caller's buffer of `*len` bytes.
            unsafe { sys::addr_write(&peer, addr, len) };
            return 0;
        }
    }
    r
}

/// Interposed `getsockopt(2)`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn getsockopt(
    fd: c_int,
    level: c_int,
    name: c_int,
    val: *mut c_void,
    len: *mut socklen_t,
) -> c_int {
    if let Some(s) = managed(fd) {
        return enter(-1, || s.getsockopt(level, name, val, len));
    }
    if let Some(r) = plain_sockopt(fd, level, SockOpt::Get(name, val, len)) {
        return r;
    }
    // SAFETY: forwarding the caller's arguments.
    unsafe { real::getsockopt(fd, level, name, val, len) }
}

/// Interposed `setsockopt(2)`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn setsockopt(
    fd: c_int,
    level: c_int,
    name: c_int,
    val: *const c_void,
    len: socklen_t,
) -> c_int {
    if let Some(s) = managed(fd) {
        return enter(-1, || s.setsockopt(level, name, val, len));
    }
    if let Some(r) = plain_sockopt(fd, level, SockOpt::Set(name, val, len)) {
        return r;
    }
    // SAFETY: forwarding the caller's arguments.
    let r = unsafe { real::setsockopt(fd, level, name, val, len) };
    if r == 0 && (level, name) == (libc::SOL_SOCKET, libc::SO_SNDBUF) && !busy() {
        // Carried into DDP mode's send buffer at a switch.
        let e = sys::errno();
        enter((), || crate::xsock::note_sndbuf(fd, val, len));
        set_errno(e);
    }
    r
}

/// Interposed `shutdown(2)`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn shutdown(fd: c_int, how: c_int) -> c_int {
    match managed(fd) {
        Some(s) => enter(-1, || s.shutdown(how)),
        // SAFETY: forwarding the caller's arguments.
        None => unsafe { real::shutdown(fd, how) },
    }
}

/// What `exit` runs over ([`crate::shim::guard::ExitOver::now`]), found
/// once, before the stdio flush and every kind's exit handler; over a
/// call's sleep that holds no lock, that sleep's wait (it never comes
/// back) given back first (`xsock::census::abandon_wait`: its socket
/// read and driven again), once, so that the stdio streams' flush
/// ([`stdio::flush_at_exit`]) and the kinds' closes may use it (review
/// r27-b item 1: the stdio flush kept its own test, the guard, and
/// skipped every stream over such a sleep).
pub(crate) fn exit_over() -> crate::shim::guard::ExitOver {
    let over = crate::shim::guard::ExitOver::now();
    if let crate::shim::guard::ExitOver::Sleep(slept) = over {
        crate::xsock::abandon_wait_at_exit(slept);
    }
    over
}

/// Every kind's exit handler (`kinds`: [`KINDS`]), each told what the
/// exit runs over (`over`: [`exit_over`]), found once before the first
/// runs: the same for every kind whatever their order (review r26-d item
/// 6).
pub(crate) fn exit_kinds(kinds: &[&dyn Kind], over: crate::shim::guard::ExitOver) {
    for k in kinds {
        k.at_exit(over);
    }
}

// ---- _exit ---------------------------------------------------------------------

/// Every kind's `_exit` flush, with the thread's cancellation disabled
/// and put back before the real `_exit` (the flush waits in libc's
/// `nanosleep`, `xsock::linger`, and prints with its `write`: cancellation
/// points, where a thread with a cancel pending and enabled was unwound
/// through the library and the process aborted). Put back, not left
/// disabled: a vforked child's thread is its parent's.
fn exit_flush(over: crate::shim::guard::ExitOver) {
    sys::without_cancel(|| {
        for k in KINDS {
            k.exit_flush(over);
        }
    });
}

/// What `_exit`'s flush (`exit_flush`) runs over, the sleep's mark left
/// as it is (a vforked child's is its parent's thread's). Each kind's
/// flush keeps to what is safe there: over a call's sleep that holds no
/// lock, as from outside (review r26-d item 5); over a stretch of a call
/// that may hold a lock (a signal handler's `_exit` there, including the
/// first slice of every blocking receive), only a wait with every lock
/// tried and nothing allocated, or nothing (review r27-b item 2: before,
/// no kind flushed there, and the bytes a send had returned for were
/// lost or not by the timing of the signal).
fn exit_flush_over() -> crate::shim::guard::ExitOver {
    crate::shim::guard::ExitOver::seen()
}

/// Every kind's flush before exec, then the demotion of inherited managed
/// sockets.
fn before_exec() {
    // With the thread's cancellation disabled, put back before the exec
    // (see `exit_flush`: the kinds' lingers sleep in libc's `nanosleep`).
    enter((), || {
        sys::without_cancel(|| {
            for k in KINDS {
                k.before_exec();
            }
            demote_all(true);
        });
    });
}

/// The managed sockets an exec's demotion took out of the table
/// (`demote_all(true)`), each with its number and the table's reference:
/// put back if the exec fails ([`exec_failed`]).
static DEMOTED_FOR_EXEC: Mutex<Vec<(c_int, Arc<dyn Socket>)>> = Mutex::new(Vec::new());

/// After an exec that returned (it failed; errno kept): every kind's
/// undo of what its flush did only for an exec that is made, and each
/// socket the demotion took out of the table managed again at its number
/// if that still names the socket's demoted descriptor and the kind puts
/// it back ([`Socket::managed_target`]): a program whose exec failed
/// (`execvp` of a command not found) keeps its connections, where its
/// numbers named dead sockets for good and their connections were leaked
/// open (the demotion forgot them). Otherwise the demotion's reference is
/// released (the last: an orderly close).
fn exec_failed() {
    let e = sys::errno();
    enter((), || {
        let _cancel_off = sys::CancelOff::new();
        for k in KINDS {
            k.exec_failed();
        }
        let demoted = std::mem::take(&mut *sys::lock(&DEMOTED_FOR_EXEC));
        for (fd, s) in demoted {
            // `swap_in` takes a reference of its own; the demotion's is
            // released either way.
            let _back = s
                .managed_target()
                .filter(|_| same_inode(fd, s.demote_fd()))
                .is_some_and(|t| fdtable::swap_in(fd, t, s.clone()).is_ok());
            s.release();
        }
    });
    set_errno(e);
}

/// Whether descriptors `a` and `b` name one file (device and inode).
fn same_inode(a: c_int, b: c_int) -> bool {
    let st = |fd| {
        // SAFETY: fstat into a zeroed stat on the stack.
        let mut st: libc::stat = unsafe { zeroed() };
        // SAFETY: as above.
        (unsafe { libc::fstat(fd, &mut st) } == 0).then_some((st.st_dev, st.st_ino))
    };
    st(a).is_some_and(|x| Some(x) == st(b))
}

/// `_exit`'s asynchronous signals blocked for good before its flush (which
/// may wait seconds for the closes' bytes), never put back: Linux's
/// `_exit` runs no more of the program's code, and a handler run in the
/// wait could `exit()` (running the exit handlers and stdio flush the
/// program skipped, with another status) or `siglongjmp` back into the
/// program out of its `_exit` (review r28-c item 5). A signal that comes
/// meanwhile stays pending and ends with the process. The faults are
/// never blocked; in a vforked child the mask is the child's own.
fn exit_signals_blocked() {
    let _ = sys::block_async_signals();
}

/// Interposed `_exit(2)`: the exit handlers are skipped, so datagrams still
/// queued on connections would be lost. The process that owns the
/// connections waits for them briefly (`WARPSOCK_EXIT_LINGER_MS`); a forked
/// or vforked child exits at once (see `Kind::exit_flush`).
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn _exit(status: c_int) -> ! {
    let over = exit_flush_over();
    exit_signals_blocked();
    enter((), || exit_flush(over));
    real::exit_now(false, status)
}

/// Interposed `_Exit(3)`: as `_exit`.
#[allow(non_snake_case)]
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn _Exit(status: c_int) -> ! {
    let over = exit_flush_over();
    exit_signals_blocked();
    enter((), || exit_flush(over));
    real::exit_now(true, status)
}

// ---- exec --------------------------------------------------------------------

/// Interposed `execve(2)`: offloaded sockets the new program inherits become
/// plain kernel UDP sockets first.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn execve(
    path: *const c_char,
    argv: *const *const c_char,
    envp: *const *const c_char,
) -> c_int {
    before_exec();
    // SAFETY: forwarding the caller's arguments.
    let r = unsafe { real::execve(path, argv, envp) };
    exec_failed();
    r
}

/// Interposed `execv(3)`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn execv(path: *const c_char, argv: *const *const c_char) -> c_int {
    before_exec();
    // SAFETY: forwarding the caller's arguments.
    let r = unsafe { real::execv(path, argv) };
    exec_failed();
    r
}

/// Interposed `execvp(3)`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn execvp(file: *const c_char, argv: *const *const c_char) -> c_int {
    before_exec();
    // SAFETY: forwarding the caller's arguments.
    let r = unsafe { real::execvp(file, argv) };
    exec_failed();
    r
}

/// Interposed `execveat(2)` (glibc's wrapper, 2.34 on: it does not go
/// through `execve`; review r22-a item 5).
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn execveat(
    dirfd: c_int,
    path: *const c_char,
    argv: *const *const c_char,
    envp: *const *const c_char,
    flags: c_int,
) -> c_int {
    before_exec();
    // SAFETY: forwarding the caller's arguments.
    let r = unsafe { real::execveat(dirfd, path, argv, envp, flags) };
    exec_failed();
    r
}

/// Interposed `fexecve(3)` (glibc's calls the `execveat` system call, or
/// its internal `execve`, neither through the interposed ones).
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn fexecve(
    fd: c_int,
    argv: *const *const c_char,
    envp: *const *const c_char,
) -> c_int {
    before_exec();
    // SAFETY: forwarding the caller's arguments.
    let r = unsafe { real::fexecve(fd, argv, envp) };
    exec_failed();
    r
}

/// Interposed `execvpe(3)`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn execvpe(
    file: *const c_char,
    argv: *const *const c_char,
    envp: *const *const c_char,
) -> c_int {
    before_exec();
    // SAFETY: forwarding the caller's arguments.
    let r = unsafe { real::execvpe(file, argv, envp) };
    exec_failed();
    r
}
