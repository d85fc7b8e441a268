//! `pthread_cancel` of a thread in a call the library handles
//! (`warpsock_xsock::cancel`): the interposed `pthread_cancel`, and the
//! looks of the entry points (each `extern "C-unwind"`) at a pending
//! cancel, before their call and after a failed one, with nothing of the
//! library live on the stack.

#![allow(clippy::missing_safety_doc)]

use libc::{c_int, ssize_t};

use warpsock_xsock::cancel;

use crate::shim::real;

/// At an interposed cancellation point's start, with nothing of the
/// library on the stack: a cancel noted for this thread is acted on here,
/// as glibc's wrappers act at their start (POSIX: a pending cancel is
/// acted on before a cancellation point returns), so that a call that
/// would not wait or fail — a read that finds data, a send that finds
/// room, a `poll` whose raw sleep no signal will end — is cancelled too
/// (review r23-c item 2). One relaxed load while no cancel is noted.
#[inline(always)]
pub(crate) fn cancel_first() {
    if cancel::any() {
        cancel::act();
    }
}

/// At an interposed entry point, once its call returned `r` and nothing of
/// the library is live on the stack: a failed call (`EINTR`: a DDP-mode
/// socket's wait ended for a pending cancel) acts on this thread's
/// `pthread_cancel` here (`warpsock_xsock::cancel::act`: the thread
/// unwinds from this frame). One compare on a call that did not fail.
#[inline(always)]
pub(crate) fn cancel_point(r: isize) {
    if r < 0 && cancel::any() {
        cancel::act();
    }
}

/// An interposed cancellation point's body `call()`, then
/// [`cancel_point`]. The call's managed path acts on a noted cancel at its
/// start ([`cancel_first`] in `dispatch_managed`, `managed`, `target`);
/// a plain descriptor's is glibc's call, which does. (At this entry, before
/// the call, it cost the 8 B round trip ~20 instructions per process:
/// the arguments kept live across it.)
#[inline(always)]
pub(crate) fn cancellable(call: impl FnOnce() -> ssize_t) -> ssize_t {
    let r = call();
    cancel_point(r);
    r
}

/// [`cancellable`] of a call that returns an `int`.
#[inline(always)]
pub(crate) fn cancellable_int(call: impl FnOnce() -> c_int) -> c_int {
    let r = call();
    cancel_point(r as isize);
    r
}

/// Whether glibc's handler of its cancellation signal is installed: the
/// raw `rt_sigaction` (glibc's `sigaction` refuses the signal). glibc
/// installs it in `pthread_cancel`, but not on every path (a target that
/// already exited returns first), and the signal's default action ends
/// the process (review r23-c item 8).
fn sigcancel_handled() -> bool {
    let mut old = [0u64; 4];
    // SAFETY: reads the disposition of signal 32 into `old`, room for the
    // kernel's structure (handler, flags, restorer, mask); sets none.
    let r = unsafe {
        libc::syscall(
            libc::SYS_rt_sigaction,
            libc::c_long::from(cancel::SIGCANCEL),
            std::ptr::null::<u64>(),
            old.as_mut_ptr(),
            8 as libc::size_t,
        )
    };
    r == 0 && old[0] != libc::SIG_DFL as u64 && old[0] != libc::SIG_IGN as u64
}

/// Interposed `pthread_cancel(3)`: glibc's, then the target's cancel is
/// noted for the library and the target is sent glibc's cancellation
/// signal, which ends the raw sleep of a call on a DDP-mode socket (glibc
/// sends it itself only to a thread inside one of its cancellation points;
/// its handler does nothing more to a thread already marked). A self-cancel
/// is noted without the signal (the entry points act on it at their
/// start). See `warpsock_xsock::cancel`. The target's kernel id is read
/// from its CPU clock id (glibc's `pthread_getcpuclockid` is
/// `MAKE_THREAD_CPUCLOCK(tid, CPUCLOCK_SCHED)`, the kernel's encoding:
/// `!(clock >> 3)` is the id). `extern "C-unwind"`: glibc's call unwinds
/// in an asynchronous self-cancel.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C-unwind" fn pthread_cancel(th: libc::pthread_t) -> c_int {
    // SAFETY: the caller's thread handle, passed on.
    let r = unsafe { real::pthread_cancel(th) };
    if r != 0 {
        return r;
    }
    // SAFETY: pthread_self has no preconditions.
    if th == unsafe { libc::pthread_self() } {
        // SAFETY: no arguments.
        let tid = unsafe { libc::syscall(libc::SYS_gettid) } as libc::pid_t;
        cancel::note(th as usize, tid, false);
        return r;
    }
    let mut clock: libc::clockid_t = 0;
    // SAFETY: the caller's handle of a live thread (glibc's contract, as
    // for pthread_cancel itself); `clock` is written.
    if unsafe { libc::pthread_getcpuclockid(th, &mut clock) } != 0 {
        return r;
    }
    let tid = !(clock >> 3);
    let kick = sigcancel_handled();
    cancel::note(th as usize, tid, kick);
    if kick {
        // SAFETY: a signal to a thread of this process, whose handler is
        // glibc's (looked at just above).
        unsafe {
            libc::syscall(
                libc::SYS_tgkill,
                libc::c_long::from(libc::getpid()),
                libc::c_long::from(tid),
                libc::c_long::from(cancel::SIGCANCEL),
            )
        };
    }
    r
}
