//! The exit's census of the live DDP sockets ([`SOCKS`]): the bytes
//! their engines hold behind full kernel send buffers, which the exit
//! waits for (`linger`), and the reset of those it gave up on (review
//! r21-b #4). Apart from `sock` so that it stays under the size limit;
//! it uses `sock`, which never names it.

use std::sync::atomic::Ordering;

use super::sock::{DdpSock, SOCKS, SOCKS_OWNER};
use crate::shim::guard::enter;
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
