//! What the program's descriptor of a connection this process cannot
//! serve becomes: a forked child's copy of a DDP socket (or of a
//! switching one), the descriptor an `exec` keeps, a forked child's
//! return into a switch its parent makes; and whether a process is a
//! `vfork` child of the one whose sockets it sees (its switch refused).

use std::sync::atomic::{AtomicI32, Ordering};

use libc::c_int;
use warpsock_engine::fds;
use warpsock_xsock::io::XSocket;

use crate::shim::real;
use crate::shim::sys::{self, errno};

/// A switch a signal handler's `fork` split (`xsock::switch`), in the
/// child, which returned into it: `r`, the handshake's outcome, and the
/// connection are the parent's, whose own switch goes on. Nothing of it
/// is made here: `r` is forgotten, never dropped (an `XSocket`'s drop,
/// `Qp::drop`, shuts the connection; a failure's residue is the
/// parent's to deliver), and the program's descriptor `fd` becomes a
/// dead end, as the fork handlers make the child's copies of its
/// parent's DDP sockets (`interpose::demote_all`: `ENOTCONN`, `EPIPE`;
/// `O_NONBLOCK` if `nonblocking`, the program's flag before the switch,
/// and its close-on-exec flag kept). Returns the errno of the child's
/// call: `ECONNRESET`, a connection ended under it.
pub(in crate::xsock) fn refuse_forked_switch(
    fd: c_int,
    r: Result<XSocket, warpsock_xsock::io::Failure>,
    nonblocking: bool,
) -> c_int {
    std::mem::forget(r);
    // Made before any switch (`prepare`); made here too if they could
    // not be then (system calls only: this may run in a handler's child).
    let _ = dead_ends_made();
    let dead = dead_end(nonblocking);
    if dead >= 0 {
        // SAFETY: fcntl and dup3 on the program's descriptor and the
        // process's dead end (no pointers).
        unsafe {
            let fdfl = real::fcntl(fd, libc::F_GETFD, 0);
            let cloexec = if fdfl >= 0 && fdfl & libc::FD_CLOEXEC != 0 {
                libc::O_CLOEXEC
            } else {
                0
            };
            real::dup3(dead, fd, cloexec);
        }
    }
    libc::ECONNRESET
}

/// The process's dead ends ([`dead_end`]): blocking, non-blocking (-1:
/// not made yet).
static DEAD_ENDS: [AtomicI32; 2] = [AtomicI32::new(-1), AtomicI32::new(-1)];

/// Makes the process's two dead ends if they are not made yet (at the
/// first DDP or switching socket, never in a fork handler); the errno if
/// one cannot be made (`EMFILE`): no socket that needs them is made then.
pub(in crate::xsock) fn dead_ends_made() -> Result<(), c_int> {
    for (i, slot) in DEAD_ENDS.iter().enumerate() {
        if slot.load(Ordering::Acquire) >= 0 {
            continue;
        }
        // SAFETY: a new socket of ours (the real call: not the interposed
        // `socket`, which would look at the policy).
        let fd = unsafe { real::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
        if fd < 0 {
            return Err(errno());
        }
        // Out of the program's numbers, as every library descriptor.
        let fd = fds::lift(fd);
        sys::set_nonblocking(fd, i == 1);
        if slot
            .compare_exchange(-1, fd, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            // Another thread made this one meanwhile.
            sys::close(fd);
        }
    }
    Ok(())
}

/// What a forked child's copy of a DDP socket (or of a switching one)
/// and the descriptor an `exec` keeps become (duplicated onto the
/// program's number), with the program's `O_NONBLOCK` (`nonblocking`):
/// a TCP socket that never connected. Its reads fail with `ENOTCONN`,
/// its sends with `EPIPE` (and `SIGPIPE` unless `MSG_NOSIGNAL`, as TCP's),
/// its `poll` shows `POLLHUP`: the copy is refused with an error, as
/// issue 12 asks, where a closed socket pair's end (before session 39)
/// read as the peer's orderly end of stream, which a child could take for
/// its client's last word. Two for the whole process, made once
/// ([`dead_ends_made`]) and never closed: such a socket has no state a
/// copy could change (its calls fail at once, blocking or not), so every
/// copy can share it — one descriptor a connection fewer than a dead end
/// each (session 39: 9 a policy-mode server's DDP connection held). The
/// copies share its file status flags too: a child's `fcntl(F_SETFL)` of
/// its copy changes what every copy's `F_GETFL` reads (their calls fail
/// at once whatever the flag). -1 before they are made.
pub(in crate::xsock) fn dead_end(nonblocking: bool) -> c_int {
    DEAD_ENDS[usize::from(nonblocking)].load(Ordering::Acquire)
}

/// Whether process `me` (the caller, `getpid()`) shares its memory with
/// process `other`: `kcmp(KCMP_VM)` says so (0), or cannot say (a
/// seccomp filter, no `kcmp`: taken as shared, the safe answer). A gone
/// `other` (`ESRCH`) shares nothing. Asked only by a switch in a process
/// that sees another's pid as an owner (a child made without the fork
/// handlers), never per call.
pub(crate) fn shares_memory(me: i32, other: i32) -> bool {
    const KCMP_VM: libc::c_long = 1;
    // SAFETY: kcmp compares two processes' resources; no pointers.
    let r = unsafe {
        libc::syscall(
            libc::SYS_kcmp,
            libc::c_long::from(me),
            libc::c_long::from(other),
            KCMP_VM,
            0 as libc::c_long,
            0 as libc::c_long,
        )
    };
    r == 0 || (r < 0 && errno() != libc::ESRCH)
}

/// Whether process `me`, about to switch a socket, shares the memory of
/// the process whose sockets (DDP, or any the descriptor table holds) it
/// sees: a child made by `vfork` (or a `clone(CLONE_VM)` task) of such a
/// process. Its switch would write the census's owner, the table and
/// the engine of its parent's memory (review r29-c item 3): refused.
pub(crate) fn borrows_memory(me: i32) -> bool {
    [
        super::SOCKS_OWNER.load(Ordering::Acquire),
        crate::shim::fdtable::first_owner(),
    ]
    .into_iter()
    .any(|o| o != 0 && o != me && shares_memory(me, o))
}
