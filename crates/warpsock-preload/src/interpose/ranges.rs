//! The interposed `close_range(2)` and `closefrom(3)`: each managed
//! number in the range is closed as the interposed `close` closes one
//! (the socket's orderly close, its entry out of the table, its epoll
//! registrations out of the sets' books) before the kernel closes the
//! rest. Closed below the interposer, a DDP socket's number left its
//! connection open (the peer never read the end of stream) and its entry
//! in the table: the next file the program opened at that number was
//! taken for the socket, and a write to a new, unconnected socket went to
//! the old peer.
//!
//! The library's own descriptors live at or above its floor
//! (`warpsock_engine::fds`, half the soft `RLIMIT_NOFILE`; the lowest
//! floor it ever had, as a program that raises its limit leaves those
//! made before where they were): in a process whose library holds
//! sockets (the table's owner), the kernel's close stops below it, so a
//! `closefrom(3)` does not close the engine's sockets and the progress
//! thread's files from under them. Numbers of the program's at or above
//! that floor that the library does not manage (a program with more than
//! half its limit open) stay open there (`README.md`). A forked child's
//! copies of its parent's descriptors are its own to close: there the
//! whole range is closed.
//!
//! Flags other than none (`CLOSE_RANGE_CLOEXEC`: marks, closes nothing;
//! `CLOSE_RANGE_UNSHARE`: closes in the calling thread's own copy of the
//! table, which the library's table does not follow; unknown ones:
//! `EINVAL`) are the real call's. Neither call is a cancellation point,
//! nor is it made one here (the managed closes run with the thread's
//! cancellation disabled).

use libc::{c_int, c_uint};

use crate::shim::fdtable;
use crate::shim::sys;

/// Interposed `close_range(2)`: see the module's docs.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C-unwind" fn close_range(first: c_uint, last: c_uint, flags: c_uint) -> c_int {
    if first > last || flags != 0 {
        // The kernel's answers: `EINVAL` for the range or an unknown
        // flag, and the flags' own effects.
        return close_range_raw(first, last, flags);
    }
    close_managed(first, last);
    match kernels_part(first, last) {
        Some(last) => close_range_raw(first, last, 0),
        // All of the range is the library's: its managed numbers were
        // closed above.
        None => 0,
    }
}

/// Interposed `closefrom(3)` (glibc's calls the system call itself, past
/// the interposed `close_range`): see the module's docs.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C-unwind" fn closefrom(low: c_int) {
    let first = low.max(0) as c_uint;
    close_managed(first, c_uint::MAX);
    let Some(last) = kernels_part(first, c_uint::MAX) else {
        return;
    };
    if close_range_raw(first, last, 0) != 0 {
        // No `close_range` (Linux before 5.9): one by one, up to the
        // table's size (glibc walks `/proc/self/fd` there).
        let top = table_size().min(last.saturating_add(1));
        for fd in first..top {
            sys::close(fd as c_int);
        }
    }
}

/// Closes the managed numbers in `first..=last` as the program's `close`
/// of each would, with the thread's cancellation disabled.
fn close_managed(first: c_uint, last: c_uint) {
    if fdtable::managed_below() <= 0 {
        return;
    }
    sys::without_cancel(|| {
        for (fd, s) in fdtable::all() {
            drop(s);
            if (first..=last).contains(&(fd as c_uint)) {
                // SAFETY: the program's close of its own number.
                unsafe { super::close(fd) };
            }
        }
    });
}

/// The end of the part of `first..=last` the kernel closes: all of it,
/// unless the library of this process holds descriptors there (below its
/// lowest floor, then); `None` if nothing of it is left.
fn kernels_part(first: c_uint, last: c_uint) -> Option<c_uint> {
    let floor = warpsock_engine::fds::lowest_floor();
    let ours = floor > 0 && fdtable::first_owner() == sys::getpid();
    let last = if ours {
        last.min(floor as c_uint - 1)
    } else {
        last
    };
    (first <= last).then_some(last)
}

/// The raw `close_range` system call (0, or -1 with `errno` set).
fn close_range_raw(first: c_uint, last: c_uint, flags: c_uint) -> c_int {
    // SAFETY: integers only.
    let r = unsafe {
        libc::syscall(
            libc::SYS_close_range,
            libc::c_long::from(first),
            libc::c_long::from(last),
            libc::c_long::from(flags),
        )
    };
    // `errno` is the system call's.
    if r < 0 {
        -1
    } else {
        0
    }
}

/// The size of the process's descriptor table (its soft
/// `RLIMIT_NOFILE`), 65,536 if it cannot be read.
fn table_size() -> c_uint {
    // SAFETY: getrlimit writes one rlimit.
    let mut l: libc::rlimit = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) } == 0 {
        c_uint::try_from(l.rlim_cur).unwrap_or(c_uint::MAX)
    } else {
        65_536
    }
}
