//! The process's count of buffered bytes across `fork`
//! (`warpsock_xsock::io::forget_after_fork`, which the preload's fork
//! handler calls): the child starts from zero and counts its own bytes —
//! before, the parent stayed the count's owner, so a child of a parent
//! that had buffered never counted its own (its exit neither waited for
//! them nor reset those peers; review r21-send #8). One test in this
//! binary: the count is the process's.

use std::time::{Duration, Instant};

use warpsock_xsock::io::{buffered_bytes, forget_after_fork, reset_buffered};

mod net;

use net::{opts, pattern, switch_both, tcp_pair};

/// Non-blocking sends to a peer that does not read, past the window.
fn buffer_some(x: &warpsock_xsock::io::XSocket) {
    for c in pattern(100_000, 3).chunks(1000) {
        assert_eq!(x.send(c, true, None).unwrap(), c.len());
    }
}

/// The child's checks: an exit status naming the first that failed.
fn child() -> i32 {
    forget_after_fork();
    if buffered_bytes() != 0 {
        return 2;
    }
    let (a, b) = tcp_pair();
    let (xa, _xb) = switch_both(&a, &b, &opts());
    buffer_some(&xa);
    if buffered_bytes() == 0 {
        return 3; // its own bytes uncounted
    }
    if reset_buffered() != 1 {
        return 4; // its own connection, not the parent's
    }
    0
}

#[test]
fn a_forked_child_counts_its_own_buffered_bytes_from_zero() {
    let (a, b) = tcp_pair();
    let (xa, _xb) = switch_both(&a, &b, &opts());
    buffer_some(&xa);
    let parents = buffered_bytes();
    assert!(parents > 0);
    // SAFETY: the child runs `child` and leaves with `_exit`, touching
    // nothing of the parent's threads.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        let code = std::panic::catch_unwind(child).unwrap_or(9);
        // SAFETY: ends the child at once (no exit handlers, no unwinding).
        unsafe { libc::_exit(code) };
    }
    let start = Instant::now();
    let mut status = 0;
    loop {
        // SAFETY: waits for our own child, without blocking.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if r == pid {
            break;
        }
        if start.elapsed() > Duration::from_secs(20) {
            // SAFETY: our own child, by pid.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            panic!("the child did not finish");
        }
        std::thread::yield_now();
    }
    assert!(libc::WIFEXITED(status), "{status:#x}");
    assert_eq!(
        libc::WEXITSTATUS(status),
        0,
        "the child's check that failed"
    );
    assert_eq!(buffered_bytes(), parents, "the parent's count untouched");
}
