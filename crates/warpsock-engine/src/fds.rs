//! Where a library's own descriptors live: out of the program's way.
//!
//! Linux gives every new descriptor the lowest free number (POSIX), and
//! programs count on it: an event loop sized to its connections indexes
//! arrays by descriptor number (wrk's `aeCreateEventLoop(10 + 3 x
//! connections)` refuses a number past its size, a "connect error"), and
//! `select` stops at `FD_SETSIZE`. A library that opens descriptors of its
//! own inside the program's process — the preload's DDP-mode socket holds
//! eight for the program's one (issue 12) — pushes the program's numbers
//! up by that many unless it puts its own elsewhere. So a library sets a
//! *floor* ([`set_floor`], [`set_floor_from_limit`]) and every descriptor
//! it makes is placed at the lowest free number at or above it:
//! [`lift`] moves one the kernel just made (a `fcntl(F_DUPFD_CLOEXEC,
//! floor)` and a `close` of the low number), [`dup_lifted`] duplicates one
//! there directly. The program's own numbers then stay as dense as without
//! the library (`tests/fds.rs`; the preload's `fdnumbers.c`).
//!
//! The floor is half the soft `RLIMIT_NOFILE`, at most [`MAX_FLOOR`]: room
//! above it for the library, below it for the program, and a kernel
//! descriptor table no larger than a program with that many descriptors
//! would have (a `fork` copies it up to the highest open number). With no
//! room left above the floor (or a floor at or past the limit, which
//! `F_DUPFD` refuses with `EINVAL`), a descriptor stays where the kernel
//! made it: lifting never makes a call fail that would have worked. The
//! floor is 0 — nothing moves — until a library sets it: the engine's
//! other users (the `warpsock` command, the C ABI) have no program to
//! keep out of the way of.
//!
//! Raw system calls ([`crate::rawsys`]'s rule): a preload's interposed
//! `fcntl` and `close` are not re-entered, and none is a cancellation
//! point.
#![allow(unsafe_code)]

use std::os::fd::{FromRawFd, IntoRawFd, RawFd};
use std::sync::atomic::{AtomicI32, Ordering};

/// The highest floor [`set_floor_from_limit`] sets, whatever the limit:
/// under a soft limit of 32,768 or more a program keeps its numbers below
/// 16,384 dense, and the library's start there.
pub const MAX_FLOOR: RawFd = 16_384;

/// The floor; 0: descriptors stay where the kernel made them.
static FLOOR: AtomicI32 = AtomicI32::new(0);

/// The lowest non-zero floor ever set (0: none): descriptors lifted
/// under an earlier, lower floor stay where they were when a program
/// raises its limit (redis), so the library's own may begin there.
static LOWEST_FLOOR: AtomicI32 = AtomicI32::new(0);

/// Sets the floor (0: off).
pub fn set_floor(floor: RawFd) {
    let floor = floor.max(0);
    FLOOR.store(floor, Ordering::Relaxed);
    if floor > 0 {
        let _ = LOWEST_FLOOR.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |l| {
            (l == 0 || floor < l).then_some(floor)
        });
    }
}

/// The floor now.
pub fn floor() -> RawFd {
    FLOOR.load(Ordering::Relaxed)
}

/// The lowest non-zero floor ever set (0: none yet): where the library's
/// lifted descriptors may begin.
pub fn lowest_floor() -> RawFd {
    LOWEST_FLOOR.load(Ordering::Relaxed)
}

/// The floor for a soft `RLIMIT_NOFILE` of `soft` descriptors: half of
/// it, at most [`MAX_FLOOR`].
pub fn floor_for_limit(soft: u64) -> RawFd {
    RawFd::try_from(soft / 2).map_or(MAX_FLOOR, |f| f.min(MAX_FLOOR))
}

/// Sets the floor from the process's soft `RLIMIT_NOFILE` now
/// ([`floor_for_limit`]; unchanged if the limit cannot be read) and
/// returns it. Cheap (one system call): a library calls it again before
/// it makes descriptors, as a program may change its limit (redis raises
/// it at start).
pub fn set_floor_from_limit() -> RawFd {
    let mut l = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit into `l`.
    let r = unsafe {
        libc::syscall(
            libc::SYS_getrlimit,
            libc::c_long::from(libc::RLIMIT_NOFILE),
            &mut l as *mut libc::rlimit,
        )
    };
    if r == 0 {
        set_floor(floor_for_limit(l.rlim_cur));
    }
    floor()
}

/// `fcntl(fd, F_DUPFD_CLOEXEC, from)`: the new descriptor, or -1 with
/// `errno` set.
fn dup_from(fd: RawFd, from: RawFd) -> RawFd {
    // SAFETY: F_DUPFD_CLOEXEC takes integers alone; no memory is touched.
    unsafe {
        libc::syscall(
            libc::SYS_fcntl,
            libc::c_long::from(fd),
            libc::c_long::from(libc::F_DUPFD_CLOEXEC),
            libc::c_long::from(from),
        ) as RawFd
    }
}

/// A close-on-exec duplicate of `fd` at the lowest free number at or above
/// the floor, or at the lowest free number if there is none up there: the
/// new descriptor, or -1 with `errno` set (`EMFILE`: none free at all).
pub fn dup_lifted(fd: RawFd) -> RawFd {
    let f = floor();
    if f > 0 {
        let high = dup_from(fd, f);
        if high >= 0 {
            return high;
        }
    }
    dup_from(fd, 0)
}

/// Moves `fd`, a descriptor the caller just made and owns alone, to the
/// lowest free number at or above the floor: returns its new number (its
/// old one closed; close-on-exec set), or `fd` itself — left as it was —
/// when it is already there, the floor is off, or nothing is free up
/// there. Never fails: a descriptor that cannot move stays usable.
pub fn lift(fd: RawFd) -> RawFd {
    let f = floor();
    if f == 0 || fd < 0 || fd >= f {
        return fd;
    }
    let high = dup_from(fd, f);
    if high < 0 {
        return fd;
    }
    // SAFETY: `fd` is the caller's own, now duplicated at `high`; nothing
    // else names it (the caller just made it).
    unsafe { libc::syscall(libc::SYS_close, libc::c_long::from(fd)) };
    high
}

/// [`lift`] of a handle the caller just made (a socket, a listener).
pub fn lift_owned<T: IntoRawFd + FromRawFd>(handle: T) -> T {
    let fd = lift(handle.into_raw_fd());
    // SAFETY: `fd` is the handle's descriptor, moved up or as it was; the
    // new handle owns it as the old one did.
    unsafe { T::from_raw_fd(fd) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_floor_is_half_the_limit_up_to_its_cap() {
        assert_eq!(floor_for_limit(1024), 512);
        assert_eq!(floor_for_limit(1), 0);
        assert_eq!(floor_for_limit(32_768), MAX_FLOOR);
        assert_eq!(floor_for_limit(1 << 20), MAX_FLOOR);
        assert_eq!(floor_for_limit(u64::MAX), MAX_FLOOR);
    }
}
