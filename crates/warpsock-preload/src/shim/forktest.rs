//! Tests' forks with a bound: a child that hangs is killed and reported,
//! not waited for (`xsock::sock::forked`, `epollcarry`).

use libc::c_int;
use std::time::Duration;

use super::sys;

/// How long a child may take before it counts as hung: a bound for a
/// broken run (the child is killed and the test fails), not a measure —
/// a child that does not hang ends in microseconds.
pub(crate) const HUNG: Duration = Duration::from_secs(30);

/// Forks; the child runs `child` and `_exit`s with the status it returns.
/// The child's status as [`within`] waits for it: on a pidfd (the end of
/// the child is the event, the bound only ends a hang).
pub(crate) fn child_within(child: impl FnOnce() -> i32) -> Option<i32> {
    // SAFETY: the child runs the test's closure (the fork handlers' work,
    // the library's calls under test) and `_exit`s, never returning into
    // the harness.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
    if pid == 0 {
        let status = child();
        // SAFETY: ends the child, no unwinding into the harness.
        unsafe { libc::_exit(status) };
    }
    within(pid)
}

/// Child `pid`'s exit status, -1 if a signal ended it, or `None` if it
/// was still running after [`HUNG`] (then killed).
pub(crate) fn within(pid: libc::pid_t) -> Option<i32> {
    // SAFETY: pidfd_open of our own child, no pointers.
    let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) } as c_int;
    assert!(
        pidfd >= 0,
        "pidfd_open: {}",
        std::io::Error::last_os_error()
    );
    let mut p = [libc::pollfd {
        fd: pidfd,
        events: libc::POLLIN,
        revents: 0,
    }];
    let ended = loop {
        let n = sys::poll(&mut p, HUNG.as_millis() as c_int);
        if n < 0 && sys::errno() == libc::EINTR {
            continue;
        }
        break n > 0;
    };
    sys::close(pidfd);
    if !ended {
        // SAFETY: our own child, not reaped yet.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
    let mut status = 0;
    // SAFETY: our own child.
    let r = unsafe { libc::waitpid(pid, &mut status, 0) };
    assert_eq!(r, pid, "waitpid: {}", std::io::Error::last_os_error());
    if !ended {
        return None;
    }
    Some(if libc::WIFEXITED(status) {
        libc::WEXITSTATUS(status)
    } else {
        -1
    })
}
