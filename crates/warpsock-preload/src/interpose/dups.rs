//! `dup`, `dup2`, `dup3` (and `fcntl`'s `F_DUPFD`, in the parent module):
//! a copy of a managed descriptor names its socket in the table too, made
//! with the socket's own changes of its numbers held off.

use libc::c_int;

use super::{enter, MANAGED};
use crate::shim::fdtable;
use crate::shim::guard::busy;
use crate::shim::real;
use crate::shim::sys::set_errno;

/// `new` now names what `old` names (after a successful dup).
pub(super) fn propagate(old: c_int, new: c_int) {
    if old == new || busy() {
        return;
    }
    // A vforked child's `dup`s of, or over, a managed descriptor (one made
    // without the fork handlers: `fdtable::borrowed`) change its own
    // descriptors alone: the table is its parent's, whose socket a `dup2`
    // over its number released, and whose entry a copy made for a number
    // the parent may use for something else (review r29-a item 1). The
    // child's copy of a DDP descriptor stays its doorbell's end: an exec
    // makes a dead end only of the numbers the table holds.
    if (fdtable::mark(old) | fdtable::mark(new)) & MANAGED != 0 && fdtable::borrowed(old, new) {
        return;
    }
    // Not over the thread's hold of the table's lock (`dup_refused`):
    // not refused. One change (`copy`: a handler's close of `new` over it
    // closes the duplicate, not the socket `new` named before).
    match fdtable::copy(old, new) {
        Ok(fdtable::Copied::Managed(prev)) => {
            if let Some(prev) = prev {
                enter((), || prev.release());
            }
        }
        Ok(fdtable::Copied::Plain(prev)) => {
            if let Some(prev) = prev {
                enter((), || prev.release());
            }
            fdtable::set_candidate(
                new,
                fdtable::candidate_kind(fdtable::mark(old)).unwrap_or(0),
            );
        }
        Err(_) => {}
    }
}

/// Whether a `dup` of `old` onto `new` (-1: any) must fail with
/// `EDEADLK` before it is made: the call is over its thread's hold of the
/// table's lock (a signal handler), and the table would change
/// (`fdtable::held`).
pub(super) fn dup_refused(old: c_int, new: c_int) -> bool {
    if (fdtable::mark(old) != 0 || fdtable::mark(new) != 0) && !busy() && fdtable::over_hold() {
        set_errno(libc::EDEADLK);
        return true;
    }
    false
}

/// Before a `dup2`/`dup3` of `old` over `new` (`flags`: `dup3`'s): the
/// file `new` names is closed by the call, and its epoll registrations
/// with it (`epollcarry::before_close`) — unless the call fails first
/// (`old` not open, flags other than `O_CLOEXEC`) or `new` names the
/// same file as `old` (it stays open, registered).
fn before_dup_over(old: c_int, new: c_int, flags: c_int) {
    if old == new || busy() || flags & !libc::O_CLOEXEC != 0 {
        return;
    }
    let managed = fdtable::mark(new) & MANAGED != 0;
    if !managed && !crate::shim::epollcarry::holds_any() {
        // Nothing to clean (one atomic load): no `fstat`s on a plain
        // `dup2`'s way.
        return;
    }
    let file = |fd: c_int| {
        // SAFETY: fstat of the caller's descriptor into a zeroed local.
        unsafe {
            let mut st: libc::stat = std::mem::zeroed();
            (libc::fstat(fd, &mut st) == 0).then_some((st.st_dev, st.st_ino))
        }
    };
    let Some(from) = file(old) else {
        return;
    };
    if file(new).is_some_and(|to| to != from) {
        crate::shim::epollcarry::before_close(new, managed);
        if managed {
            // Its registrations leave the sets' books too (a `dup` of
            // it may live on).
            if let Some(s) = fdtable::get(new) {
                enter((), || crate::shim::epollwatch::number_closed(&s, new));
            }
        }
    }
}

/// `f`, a `dup` of `old` and its table entry, with the socket `old`
/// names holding off its own change of the number (`Socket::dup_begin`:
/// a connection switching in the background; review 36 item 2: the copy
/// was left on the old doorbell when the switch ended between the two).
pub(super) fn dup_held<R>(old: c_int, f: impl FnOnce() -> R) -> R {
    let s = if fdtable::mark(old) & MANAGED != 0 && !busy() {
        fdtable::get(old)
    } else {
        None
    };
    let held = s.as_ref().filter(|s| s.dup_begin());
    let r = f();
    if let Some(s) = held {
        s.dup_end();
    }
    r
}

/// Interposed `dup(2)`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn dup(fd: c_int) -> c_int {
    if dup_refused(fd, -1) {
        return -1;
    }
    dup_held(fd, || {
        // SAFETY: forwarding the caller's argument.
        let n = unsafe { real::dup(fd) };
        if n >= 0 && (fdtable::mark(fd) != 0 || fdtable::mark(n) != 0) {
            propagate(fd, n);
        }
        n
    })
}

/// Interposed `dup2(2)`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn dup2(old: c_int, new: c_int) -> c_int {
    if dup_refused(old, new) {
        return -1;
    }
    before_dup_over(old, new, 0);
    dup_held(old, || {
        // SAFETY: forwarding the caller's arguments.
        let n = unsafe { real::dup2(old, new) };
        if n >= 0 {
            propagate(old, new);
        }
        n
    })
}

/// Interposed `dup3(2)`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn dup3(old: c_int, new: c_int, flags: c_int) -> c_int {
    if dup_refused(old, new) {
        return -1;
    }
    before_dup_over(old, new, flags);
    dup_held(old, || {
        // SAFETY: forwarding the caller's arguments.
        let n = unsafe { real::dup3(old, new, flags) };
        if n >= 0 {
            propagate(old, new);
        }
        n
    })
}
