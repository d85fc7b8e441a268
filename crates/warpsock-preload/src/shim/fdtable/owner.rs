//! Which process the table's entries are: the first owner (a fast path
//! while none was ever put in), each entry's own owner, and the process
//! that borrowed the table (a child made by `vfork`, or without the fork
//! handlers, that sees its parent's entries): its `close` and `dup`s of
//! them, and its calls on a number it reused, are the plain system calls.

use std::sync::atomic::{AtomicI32, Ordering};

use libc::c_int;

use super::{maybe_managed, with_marked};

/// Whether any socket was ever put in the table by this process or the
/// one whose memory it copied or shares ([`super::insert`]: the first one's
/// pid; 0: none yet). [`borrowed`]'s fast path alone: while it is 0 no
/// entry can be borrowed and no `getpid` is made. A child made by `fork`
/// starts at none (its fork handler: `fork_release_child`, before
/// `demote_all` forgets the parent's entries).
pub(super) static OWNER: AtomicI32 = AtomicI32::new(0);

/// The first process that put a socket in the table ([`OWNER`]; 0:
/// none yet): a child made without the fork handlers sees its parent's.
pub(crate) fn first_owner() -> i32 {
    OWNER.load(Ordering::Acquire)
}

/// The process that made `fd`'s socket managed ([`Socket::owner_pid`];
/// 0: `fd` is not managed, or its kind names none).
fn owner_of(fd: c_int) -> i32 {
    if fd < 0 || !maybe_managed(fd) {
        return 0;
    }
    with_marked(fd, || 0, |s| s.owner_pid())
}

/// Whether the entry of `a` or of `b` (-1: none) is another process's
/// while this one sees it: a child made by `vfork` (or by `clone` or
/// `_Fork`, which run no fork handler) of the process that made that
/// socket managed. It shares (`vfork`) or copied its parent's memory —
/// the table, the sockets, the engine — but its descriptors are its own,
/// and whatever it does with the library's state acts on the parent's
/// connections (review r29-a item 1: its `close` of an inherited DDP
/// descriptor removed the parent's entry, deregistered the socket from
/// the parent's engine and dropped it, `Qp::drop` ending the connection
/// the parent still uses; an offloaded UDP socket's close marked the
/// parent's socket closed, dropped its queues and closed its
/// connections). Its `close` and `dup`s of such descriptors are the
/// system calls alone (`interpose::close`, `interpose::propagate`).
/// Decided per entry, by the entry's own owner ([`Socket::owner_pid`]):
/// such a child's own sockets (a switch or adoption of its own) are its
/// own, and their closes the library's (review r29-c item 1: a global
/// owner, the table's first, made a `_Fork` child's close of its own DDP
/// socket the raw system call: the socket stayed in the table, the
/// engine kept the connection open, the peer never read the end of
/// stream). One `getpid` per call on a managed descriptor, none while no
/// socket was ever put in ([`OWNER`]) and none for plain ones.
pub(crate) fn borrowed(a: c_int, b: c_int) -> bool {
    if OWNER.load(Ordering::Acquire) == 0 {
        return false;
    }
    let (pa, pb) = (owner_of(a), owner_of(b));
    if pa == 0 && pb == 0 {
        return false;
    }
    let me = super::super::sys::getpid();
    let borrowed = (pa != 0 && pa != me) || (pb != 0 && pb != me);
    if borrowed {
        // Its raw close leaves the number's mark and entry (the parent's):
        // the calls on the number from now on are plain in this process
        // ([`borrowed_here`]; review r29-c item 2).
        BORROWER.store(me, Ordering::Release);
    }
    borrowed
}

/// A process that made a raw close or `dup` of a borrowed entry
/// ([`borrowed`]; 0: none): its descriptor numbers may name something
/// else now (an `open`, `socket`, `accept` or `dup2` reusing the number)
/// while the mark and entry, the parent's, stay (review r29-c item 2: a
/// vforked child's `close(s); open("/dev/null")` then `write` went to the
/// parent's DDP socket, and the parent's peer read the child's bytes).
/// Shared with the parent by a `vfork` child: the parent, when it runs
/// again (the child exited or exec'd), finds another pid here and clears
/// it ([`borrowed_here`]).
pub(super) static BORROWER: AtomicI32 = AtomicI32::new(0);

/// Whether a call on managed descriptor `fd` is the plain call in this
/// process: it is the [`BORROWER`] and `fd`'s entry is another
/// process's. One relaxed load while no process borrowed the table; a
/// `getpid` (and, in the borrower, a look-up of the entry's owner) only
/// after one did. Another pid there is a borrower gone (a `vfork`
/// suspends its parent's thread until the child execs or exits): cleared,
/// and the call is managed. Not covered: a thread of a multi-threaded
/// parent calling on a managed descriptor while the vforked child runs
/// clears it too, and the child's later calls on a reused number reach
/// the parent's socket again.
#[inline]
pub(crate) fn borrowed_here(fd: c_int) -> bool {
    BORROWER.load(Ordering::Relaxed) != 0 && borrowed_here_slow(fd)
}

/// [`borrowed_here`] once a process borrowed the table.
#[cold]
#[inline(never)]
fn borrowed_here_slow(fd: c_int) -> bool {
    let b = BORROWER.load(Ordering::Acquire);
    if b == 0 {
        return false;
    }
    let me = super::super::sys::getpid();
    if b == me {
        let o = owner_of(fd);
        return o != 0 && o != me;
    }
    let _ = BORROWER.compare_exchange(b, 0, Ordering::AcqRel, Ordering::Relaxed);
    false
}
