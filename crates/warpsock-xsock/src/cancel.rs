//! `pthread_cancel` of a thread blocked in a call of a DDP-mode socket
//! (issue 12).
//!
//! glibc (read in sysdeps/nptl and nptl of 2.34 to 2.41: `pthread_cancel.c`,
//! `cancellation.c`, `pthread_testcancel.c`) marks the target cancelled and
//! acts on the mark only in the target: at a cancellation point
//! (`__pthread_enable_asynccancel` as one of libc's wrappers starts,
//! `pthread_testcancel`), or in the handler of its cancellation signal (32,
//! `SIGCANCEL`, `SA_RESTART`) when the target is in asynchronous mode —
//! inside such a wrapper, or with `PTHREAD_CANCEL_ASYNCHRONOUS`. 2.36 to
//! 2.40 send the signal only then; 2.34, 2.35 and 2.41 on always, and their
//! handler does nothing else. Acting is a forced unwind from that point.
//! Inside the library's frames it cannot cross their `extern "C"` entry
//! points: the process aborted ("FATAL: exception not rethrown"), where a
//! TCP socket's blocked `read` ends its thread with `PTHREAD_CANCELED`.
//!
//! So the library never calls a cancellation point while it works for an
//! application's call (its system calls are raw; engine `sys.rs`,
//! `io/sys.rs`, the preload's doorbell and `poll`). A pending cancel is
//! then a mark that nothing acts on inside the library; this module ends
//! the call's wait for it and acts on it at the outermost frame:
//!
//! 1. The preload's `pthread_cancel` calls glibc's, then [`note`]s the
//!    target's thread id and sends it `SIGCANCEL` itself: glibc's handler
//!    does nothing more for a thread already marked, but the signal ends
//!    the raw sleep the thread may be in (`ppoll`, `epoll_pwait`, a read
//!    with a timeout, a second reader's futex wait fail with `EINTR`,
//!    whatever `SA_RESTART` says).
//!    (Where glibc sent it too, this one more is as harmless.)
//! 2. A wait that a signal ended, or whose slice ended with nothing, asks
//!    [`pending`]: the socket call then ends as for a signal whose handler
//!    has no `SA_RESTART` (`EINTR`, or the bytes it moved), with every lock
//!    and count of the call given back on the way out, as for any return.
//! 3. The interposed entry point, once its call failed and nothing of the
//!    library is live on the stack, calls [`act`]: `pthread_testcancel`,
//!    whose unwind then starts in a frame with no destructors and crosses
//!    only `extern "C-unwind"` entry points (RFC 2945: a forced unwind
//!    through frames without destructors is allowed).
//!
//! Not covered: `PTHREAD_CANCEL_ASYNCHRONOUS` (the signal's handler unwinds
//! at once, wherever the thread is; README). A thread whose cancellation is
//! disabled keeps its mark here until it enables it and a wait looks again;
//! the signal sent with the mark does not end its wait ([`after_signal`]).
//! A call that moved bytes before its wait ended (a send that buffered
//! part, a `MSG_WAITALL` read short of its length) returns their count,
//! and the cancel is acted on at the thread's next cancellation point or
//! failed call; TCP's call unwinds there, its count lost.
#![allow(unsafe_code)]

use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicUsize, Ordering};

/// Threads with a cancel noted and not yet acted on: per slot, the
/// thread's handle (`pthread_t`; 0: free) and kernel id. A few at a time
/// are plenty (a thread is cancelled once); when every slot is taken the
/// oldest is overwritten (a lost mark only means the call waits on, as
/// before). A thread is known by its handle and its id together: either
/// alone may be another, later thread's (review r23-c item 3).
const SLOTS: usize = 16;
static NOTED_TH: [AtomicUsize; SLOTS] = [const { AtomicUsize::new(0) }; SLOTS];
static NOTED_TID: [AtomicI32; SLOTS] = [const { AtomicI32::new(0) }; SLOTS];
/// Per slot: the signal sent with the note has not been accounted for
/// ([`after_signal`]).
static KICKED: [AtomicBool; SLOTS] = [const { AtomicBool::new(false) }; SLOTS];
/// Bit `i`: slot `i` is taken. The one load every check costs while none
/// is (a bit mask, not a count: a count raced with the overwrite of a full
/// table and could reach 0 with a slot taken; review r23-c item 7).
static TAKEN: AtomicU32 = AtomicU32::new(0);
/// The slot the next overwrite takes.
static NEXT: AtomicUsize = AtomicUsize::new(0);

/// glibc's cancellation signal (`SIGCANCEL`, `__SIGRTMIN`).
pub const SIGCANCEL: libc::c_int = 32;

unsafe extern "C-unwind" {
    /// May unwind (a forced unwind: the thread's cancellation).
    fn pthread_testcancel();
}

unsafe extern "C" {
    fn pthread_setcancelstate(state: libc::c_int, old: *mut libc::c_int) -> libc::c_int;
}

const PTHREAD_CANCEL_ENABLE: libc::c_int = 0;
const PTHREAD_CANCEL_DISABLE: libc::c_int = 1;

/// Notes a cancel requested for thread `th` (its handle) of kernel id
/// `tid`, after glibc's `pthread_cancel` marked it; `kicked`: the caller
/// sends it the signal too. First frees the slots of threads that are
/// gone (a thread cancelled in one of glibc's cancellation points never
/// comes back to take its note: `tgkill` of signal 0 fails with `ESRCH`;
/// at most one system call per slot taken, off every fast path).
pub fn note(th: usize, tid: libc::pid_t, kicked: bool) {
    if th == 0 || tid <= 0 {
        return;
    }
    sweep();
    let taken = TAKEN.load(Ordering::Acquire);
    for i in 0..SLOTS {
        if taken & (1 << i) != 0 && NOTED_TH[i].load(Ordering::Acquire) == th {
            NOTED_TID[i].store(tid, Ordering::Release);
            KICKED[i].store(kicked, Ordering::Release);
            return;
        }
    }
    for i in 0..SLOTS {
        if TAKEN.fetch_or(1 << i, Ordering::AcqRel) & (1 << i) == 0 {
            NOTED_TID[i].store(tid, Ordering::Release);
            KICKED[i].store(kicked, Ordering::Release);
            NOTED_TH[i].store(th, Ordering::Release);
            return;
        }
    }
    let i = NEXT.fetch_add(1, Ordering::Relaxed) % SLOTS;
    NOTED_TID[i].store(tid, Ordering::Release);
    KICKED[i].store(kicked, Ordering::Release);
    NOTED_TH[i].store(th, Ordering::Release);
}

/// Frees slot `i`.
fn free(i: usize) {
    NOTED_TH[i].store(0, Ordering::Release);
    TAKEN.fetch_and(!(1 << i), Ordering::AcqRel);
}

/// Frees the slots of threads that no longer exist.
fn sweep() {
    let taken = TAKEN.load(Ordering::Acquire);
    if taken == 0 {
        return;
    }
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() };
    for i in (0..SLOTS).filter(|i| taken & (1 << i) != 0) {
        let tid = NOTED_TID[i].load(Ordering::Acquire);
        // SAFETY: signal 0 to a thread of this process: only looks.
        let r = unsafe {
            libc::syscall(
                libc::SYS_tgkill,
                libc::c_long::from(pid),
                libc::c_long::from(tid),
                0 as libc::c_long,
            )
        };
        if r != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH) {
            free(i);
        }
    }
}

/// Whether any cancel is noted at all (one relaxed load).
#[inline(always)]
pub fn any() -> bool {
    TAKEN.load(Ordering::Relaxed) != 0
}

fn gettid() -> libc::pid_t {
    // SAFETY: no arguments; cannot fail.
    unsafe { libc::syscall(libc::SYS_gettid) as libc::pid_t }
}

/// This thread's slot, if a cancel is noted for it: its handle, then (on a
/// match only, a system call) its kernel id.
fn mine() -> Option<usize> {
    // SAFETY: no preconditions.
    let me = unsafe { libc::pthread_self() } as usize;
    let taken = TAKEN.load(Ordering::Acquire);
    let i =
        (0..SLOTS).find(|&i| taken & (1 << i) != 0 && NOTED_TH[i].load(Ordering::Acquire) == me)?;
    (NOTED_TID[i].load(Ordering::Acquire) == gettid()).then_some(i)
}

/// Whether this thread's cancellation is enabled now, read by disabling it
/// and putting it back (glibc has no other reading; neither call is a
/// cancellation point, and in deferred mode neither acts).
fn enabled() -> bool {
    let mut old = PTHREAD_CANCEL_DISABLE;
    // SAFETY: sets this thread's state, reads the old one into `old`.
    unsafe {
        if pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &mut old) != 0 {
            return false;
        }
        if old == PTHREAD_CANCEL_ENABLE {
            pthread_setcancelstate(PTHREAD_CANCEL_ENABLE, std::ptr::null_mut());
        }
    }
    old == PTHREAD_CANCEL_ENABLE
}

/// Whether this thread has a cancel noted that it would act on now: its
/// socket call should end its wait (as for a signal without `SA_RESTART`).
/// Off every fast path: called after a wait a signal or its slice ended.
#[cold]
#[inline(never)]
pub fn pending() -> bool {
    any() && mine().is_some() && enabled()
}

/// After a sleep of this thread that a signal ended: `Some(true)`, a
/// cancel is pending ([`pending`]); `Some(false)`, the signal was the one
/// the preload's `pthread_cancel` sent with a cancel this thread does not
/// act on now (its cancellation disabled), accounted for now: the wait
/// goes on, as over TCP, where no signal comes (glibc 2.36 to 2.40) or
/// glibc's handler does nothing (else) — not `EINTR` for a handler
/// without `SA_RESTART`; `None`: neither, the program's handlers decide.
#[cold]
#[inline(never)]
pub fn after_signal() -> Option<bool> {
    if !any() {
        return None;
    }
    let i = mine()?;
    if enabled() {
        return Some(true);
    }
    KICKED[i].swap(false, Ordering::AcqRel).then_some(false)
}

/// glibc's `pthread_testcancel`: acts on this thread's pending cancel,
/// whoever asked for it (the thread unwinds from here), or returns. For
/// an entry point that must act before it changes anything (a `close`).
pub fn testcancel() {
    // SAFETY: as in `act`.
    unsafe { pthread_testcancel() };
}

/// At an interposed entry point whose call failed, with nothing of the
/// library live on the stack: acts on this thread's noted cancel, if it
/// has one and its cancellation is enabled (`pthread_testcancel`: the
/// thread unwinds from here and never returns). Returns otherwise.
#[cold]
#[inline(never)]
pub fn act() {
    if !any() {
        return;
    }
    let Some(i) = mine() else {
        return;
    };
    if !enabled() {
        return;
    }
    free(i);
    // SAFETY: glibc's; in deferred mode it unwinds (forced) to the thread's
    // start through this frame and the entry point's, neither of which has
    // anything to drop, or returns.
    unsafe { pthread_testcancel() };
}

#[cfg(test)]
mod tests {
    use super::*;

    fn me() -> usize {
        // SAFETY: no preconditions.
        unsafe { libc::pthread_self() as usize }
    }

    /// A noted thread is found by its own look and no other's; a note of
    /// a thread that is gone is freed by the next note (review r23-c item
    /// 3); a handle alone, with another thread's id, is not a match. (One
    /// test: the table is the process's.)
    #[test]
    fn a_noted_cancel_is_this_threads_alone_and_a_gone_ones_is_freed() {
        assert!(mine().is_none());
        note(me(), gettid(), false);
        note(me(), gettid(), false);
        assert_eq!(TAKEN.load(Ordering::Relaxed).count_ones(), 1, "one slot");
        assert!(mine().is_some());
        let other = std::thread::spawn(|| mine().is_some()).join().unwrap();
        assert!(!other, "another thread's look");
        assert_eq!(after_signal(), Some(true), "enabled: a cancel");
        free(mine().unwrap());
        // A thread that exits with its note untaken. Its join returns once
        // the kernel cleared its tid word, a little before the task is
        // released; until then `tgkill` still finds it (a CI pre-check on
        // a loaded host failed so: "the gone one freed", 2 slots for 1):
        // the test waits for the task to go, bounded.
        let (th, tid) = std::thread::spawn(|| (me(), gettid())).join().unwrap();
        let t0 = std::time::Instant::now();
        // SAFETY: signal 0 to a thread of this process: a look, no signal.
        while unsafe { libc::syscall(libc::SYS_tgkill, libc::getpid(), tid, 0) } == 0 {
            assert!(t0.elapsed().as_secs() < 10, "thread {tid} not released");
            std::thread::yield_now();
        }
        note(th, tid, true);
        assert_eq!(TAKEN.load(Ordering::Relaxed).count_ones(), 1);
        // Its handle, another id: not this thread's.
        note(me(), gettid().wrapping_add(1_000_000), false);
        assert!(mine().is_none(), "a handle with another id");
        assert_eq!(
            TAKEN.load(Ordering::Relaxed).count_ones(),
            1,
            "the gone one freed"
        );
        let i = (0..SLOTS)
            .find(|&i| TAKEN.load(Ordering::Relaxed) & (1 << i) != 0)
            .unwrap();
        free(i);
        assert!(!any());
    }
}
