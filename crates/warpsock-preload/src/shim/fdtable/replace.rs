//! A switching socket's descriptor numbers take its outcome
//! (`xsock::switching`): each number that still names the switching
//! socket comes to name the outcome's open file and object, under one
//! write hold of the table's lock, so that a program's `close` of the
//! number (which takes the entry out under that lock before its system
//! call) comes wholly before the change (the number is skipped: it may
//! be another file by now) or wholly after it (it closes the outcome).

use std::sync::Arc;

use libc::c_int;

use super::{address, drop_freed, same_file, write_map, Socket};

/// If `fd` names the object at address `only` and still the open file
/// `was` (the switching socket's doorbell end: a number the program
/// closed behind the table — `close_range`, a raw `close` — and opened
/// again, or one a `dup2` of its own is about to name, is not taken),
/// makes it name the open file `target` (`dup3`, carrying its
/// close-on-exec flag and the program's epoll registrations, those made
/// meanwhile too) and the object `sock` (`None`: no object, an unmanaged
/// descriptor); the object it named loses the number's reference.
/// Returns whether it did. Over the thread's hold of the table's lock,
/// fails with `EDEADLK` and changes nothing.
///
/// The epoll sets' registrations are read under the table's write lock:
/// a few reads of `/proc` once per switching number, while the other
/// threads' changes to the table wait.
pub(crate) fn replace_if(
    fd: c_int,
    only: usize,
    was: c_int,
    target: c_int,
    sock: Option<Arc<dyn Socket>>,
) -> Result<bool, c_int> {
    let mut m = write_map()?;
    if m.get(fd).map(|s| address(&s)) != Some(only) || !same_file(fd, was) {
        return Ok(false);
    }
    // SAFETY: a query of the program's descriptor.
    let fdfl = unsafe { super::super::real::fcntl(fd, libc::F_GETFD, 0) };
    if fdfl < 0 {
        return Ok(false);
    }
    let cloexec = if fdfl & libc::FD_CLOEXEC != 0 {
        libc::O_CLOEXEC
    } else {
        0
    };
    let old = super::super::epollcarry::inode(fd);
    let hide = sock.as_deref().map_or(0, super::hide_of);
    // epoll's sets and `/proc` only: nothing in the carry takes the
    // table's lock.
    let (n, mut regs) = super::super::epollcarry::dup3_carrying_sets(target, fd, cloexec, hide);
    if n < 0 {
        return Err(super::super::sys::errno());
    }
    if let Some(old) = old {
        regs.extend(super::super::epollcarry::carry_late(fd, old, hide));
        regs.sort_unstable_by_key(|r| r.epfd);
        regs.dedup_by_key(|r| r.epfd);
    }
    if let Some(s) = &sock {
        s.add_ref();
    }
    let watched = sock.clone();
    let (prev, free) = m.put(fd, sock);
    drop(m);
    drop_freed(free);
    if let Some(prev) = prev {
        prev.release();
    }
    // The sets that hold the number watch the new socket's connection
    // (`epollwatch`), outside the table's lock.
    if let Some(s) = watched {
        for r in regs {
            super::super::epollwatch::registered(r.epfd, &s, r.watched(fd));
        }
    }
    Ok(true)
}
