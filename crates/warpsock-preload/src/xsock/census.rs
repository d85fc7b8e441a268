//! The exit's census of the live DDP sockets ([`SOCKS`]): the bytes
//! their engines hold behind full kernel send buffers, which the exit
//! waits for (`linger`), and the reset of those it gave up on (review
//! r21-b #4). Apart from `sock` so that it stays under the size limit;
//! it uses `sock`, which never names it.

use std::sync::atomic::Ordering;
use std::sync::Mutex;

use libc::{c_int, socklen_t};

use super::sock::{DdpSock, SOCKS, SOCKS_OWNER};
use crate::shim::guard::enter;
use crate::shim::real;
use crate::shim::sys::lock;

/// At exit (and `exec`, `_exit`): the bytes the process's live DDP
/// sockets' engines hold behind full kernel send buffers, summed, and the
/// bytes their kernels accepted so far
/// ([`warpsock_xsock::io::XSocket::engine_backlog`]; the sum drops when a
/// socket leaves the set). The exit waits for the first
/// (the progress thread writes them as the kernels drain) and resets
/// what it gives up on ([`reset_backlogged`]): else the kernel sends a
/// clean end after a short stream (review r21-b #4). Allocates nothing
/// (an exit handler, other threads still running); holds [`SOCKS`] while
/// it takes each engine's lock, an order nothing reverses (no path holds
/// an engine's lock and then takes `SOCKS`).
pub(crate) fn engine_backlogs() -> (u64, u64) {
    let mut sum = (0, 0);
    each_own_sock(|s| {
        let (held, written) = s.x.engine_backlog();
        sum.0 += held;
        sum.1 += written;
    });
    sum
}

/// At exit, once the wait gave up: resets every live DDP socket of the
/// process whose engine still holds bytes ([`engine_backlogs`]).
pub(crate) fn reset_backlogged() {
    each_own_sock(|s| {
        if s.x.engine_backlog().0 > 0 {
            s.x.reset_now();
        }
    });
}

/// Runs `f` on each live DDP socket this process switched, under the
/// guard (a socket whose last reference another thread dropped meanwhile
/// is dropped here: its engine's calls are library calls).
fn each_own_sock(mut f: impl FnMut(&DdpSock)) {
    // SAFETY: getpid has no preconditions.
    let me = unsafe { libc::getpid() };
    if SOCKS_OWNER.load(Ordering::Acquire) != me {
        return;
    }
    enter((), || {
        let socks = lock(&SOCKS);
        for s in socks.iter().flat_map(|m| m.values()) {
            if let Some(s) = s.upgrade().filter(|s| s.pid == me) {
                f(&s);
            }
        }
    });
}

/// A connection [`arm_exec_reset`] marked: its engine socket's descriptor,
/// the socket's inode (its identity at the undo: the number may have been
/// closed and given to another socket meanwhile), and its `SO_LINGER`
/// before (the program's, if it set one: it reaches the same socket).
struct Armed {
    fd: c_int,
    ino: u64,
    was: libc::linger,
}

static ARMED: Mutex<Vec<Armed>> = Mutex::new(Vec::new());

/// `fd`'s `SO_LINGER`, or `None` if it is not a socket's.
fn linger_of(fd: c_int) -> Option<libc::linger> {
    let mut l = libc::linger {
        l_onoff: 0,
        l_linger: 0,
    };
    let mut len = size_of::<libc::linger>() as socklen_t;
    // SAFETY: getsockopt into a `linger` on the stack, its size given.
    let r = unsafe {
        real::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&mut l as *mut libc::linger).cast(),
            &mut len,
        )
    };
    (r == 0).then_some(l)
}

fn set_linger(fd: c_int, l: libc::linger) {
    // SAFETY: setsockopt reading a `linger` on the stack, its size given.
    unsafe {
        real::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&l as *const libc::linger).cast(),
            size_of::<libc::linger>() as socklen_t,
        )
    };
}

/// Before an `exec` whose wait gave up: each connection of this process
/// that still holds bytes — in its send buffer (`reset_buffered`'s, closes
/// under way included) or in its engine's backlog ([`reset_backlogged`]'s)
/// — is marked to be reset by the kernel's close at the exec (`SO_LINGER`
/// on, 0 s: Linux's `tcp_close` then sends RST, not FIN). The exec closes
/// every descriptor of the library's (close-on-exec) and the program's
/// managed ones (close-on-exec, or demoted to a dead socket), so the
/// peer gets `ECONNRESET`, as at exit, and not a clean end after a short
/// stream (the exec lost those bytes with the process image). Not reset
/// now, as the exit does: an exec that fails returns to a program that
/// keeps its connections ([`disarm_exec_reset`] takes the marks back). A
/// forked or vforked child's copies of its parent's connections are not
/// its own (the counts are the parent's): it marks none, so its exec
/// never resets the parent's. The socket another process still holds (a
/// child that inherited it) is not closed by this exec: the mark is left
/// to its close (the bytes are lost all the same).
pub(crate) fn arm_exec_reset() {
    let mut fds = warpsock_xsock::io::buffered_holders();
    each_own_sock(|s| {
        if s.x.engine_backlog().0 > 0 {
            fds.push(s.x.tcp_fd());
        }
    });
    fds.sort_unstable();
    fds.dedup();
    let mut armed = lock(&ARMED);
    for fd in fds {
        let Some(was) = linger_of(fd) else {
            continue;
        };
        armed.push(Armed {
            fd,
            ino: super::inode(fd),
            was,
        });
        set_linger(
            fd,
            libc::linger {
                l_onoff: 1,
                l_linger: 0,
            },
        );
    }
}

/// The exec returned (it failed): each connection [`arm_exec_reset`]
/// marked gets its `SO_LINGER` back, if its number still names the same
/// socket — a later close ends it cleanly again (or as the program set).
pub(crate) fn disarm_exec_reset() {
    for a in lock(&ARMED).drain(..) {
        if super::inode(a.fd) == a.ino {
            set_linger(a.fd, a.was);
        }
    }
}
