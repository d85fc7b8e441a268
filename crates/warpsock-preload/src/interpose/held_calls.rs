//! The interposed calls over the calling thread's own hold of the
//! descriptor table's lock (a signal handler that interrupted `close`,
//! `dup2` or a locked look-up; staged here by the thread holding the lock
//! itself): they fail with `EDEADLK` before any side effect, never wait for
//! the lock (the table's `held` module docs; reviews r19-lead-haz note 5,
//! r20-xhaz2b items 1 and 4). The table's own look-ups over a hold are
//! tested with the table (`shim/fdtable/tests/held.rs`).

use std::mem::size_of;
use std::sync::Arc;

use libc::c_int;

use crate::interpose;
use crate::shim::fdtable::tests::support::{
    dummy, hold_write, inode, same, serial, within_a_minute, Kernel, IN_COPY,
};
use crate::shim::fdtable::{
    fork_prepare, fork_release, fork_release_child, get, insert, mark, prepare, remove,
    set_candidate, BITS,
};
use crate::shim::socket::Socket;
use crate::shim::sys::{errno, set_errno};

/// The errno a call left, cleared first.
fn errno_of<T>(f: impl FnOnce() -> T) -> (T, c_int) {
    set_errno(0);
    let r = f();
    (r, errno())
}

/// The interposed `dup` calls over the thread's hold fail with `EDEADLK`
/// and change nothing: no duplicate is made, the descriptor stays managed.
#[test]
fn dup_over_the_threads_hold_fails_and_changes_nothing() {
    let _serial = serial();
    prepare();
    // SAFETY: a new descriptor of this test's.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
    assert!(fd >= 0);
    let a = dummy();
    assert!(insert(fd, a.clone()).unwrap().is_none());
    let r = within_a_minute("dup over its thread's hold", move || {
        let held = hold_write();
        // SAFETY: the interposers, on the test's descriptor.
        let duped = errno_of(|| unsafe { interpose::dups::dup(fd) });
        // SAFETY: as above (a number no test opens).
        let duped2 = errno_of(|| unsafe { interpose::dups::dup2(fd, 60_079) });
        drop(held);
        (duped, duped2)
    });
    assert_eq!(r.0, (-1, libc::EDEADLK), "dup");
    assert_eq!(r.1, (-1, libc::EDEADLK), "dup2");
    assert!(same(&get(fd), &a), "no longer managed");
    // SAFETY: a query of a number no test opens.
    let dup_flags = unsafe { libc::fcntl(60_079, libc::F_GETFD) };
    assert!(dup_flags < 0, "duplicated");
    assert!(same(&remove(fd).unwrap(), &a));
    // SAFETY: the test's descriptor.
    unsafe { libc::close(fd) };
}

/// The interposed `close` over the thread's hold returns 0 at once and is
/// made when the hold ends (review r20-xhaz3 item 2; programs do not
/// retry a `close` that failed): meanwhile the number stays open (not
/// reused), close-on-exec, and managed, and a second close of it fails
/// with `EBADF`; after, it is no longer managed, the table's reference is
/// gone, and the program's descriptor is closed (the pipe's reader sees
/// its end; this test holds `serial`, which every test that forks holds).
#[test]
fn close_over_the_threads_hold_is_made_when_the_hold_ends() {
    let _serial = serial();
    prepare();
    let mut p = [0; 2];
    // SAFETY: a new pipe of this test's.
    let made = unsafe { libc::pipe2(p.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) };
    assert_eq!(made, 0);
    let [rd, wr] = p;
    // SAFETY: on the test's descriptor (no test execs: see above).
    unsafe { libc::fcntl(wr, libc::F_SETFD, 0) };
    let a = dummy();
    assert!(insert(wr, a.clone()).unwrap().is_none());
    let a2 = a.clone();
    let r = within_a_minute("close over its thread's hold", move || {
        let held = hold_write();
        let refs = Arc::strong_count(&a2);
        // SAFETY: the interposer, on the test's descriptor.
        let closed = errno_of(|| unsafe { interpose::close(wr) });
        // The object is kept, not its address (review r21-haz item 7).
        let kept = Arc::strong_count(&a2) == refs + 1;
        // SAFETY: as above.
        let again = errno_of(|| unsafe { interpose::close(wr) });
        // SAFETY: a query of the test's descriptor.
        let flags = unsafe { libc::fcntl(wr, libc::F_GETFD) };
        let managed = same(&get(wr), &a2);
        drop(held);
        (closed, again, flags, managed && kept)
    });
    let (closed, again, flags, managed) = r;
    assert_eq!(closed, (0, 0), "close");
    assert_eq!(again, (-1, libc::EBADF), "the second close");
    assert_eq!(
        flags,
        libc::FD_CLOEXEC,
        "not open and close-on-exec meanwhile"
    );
    assert!(managed, "not managed (and its object kept) meanwhile");
    assert!(get(wr).is_none(), "still managed after the hold");
    assert_eq!(Arc::strong_count(&a), 1, "the table's reference kept");
    let mut b = [0u8; 1];
    // SAFETY: a read of the test's pipe into a live buffer.
    let n = unsafe { libc::read(rd, b.as_mut_ptr().cast(), 1) };
    assert_eq!(n, 0, "the writer's descriptor is open (not its end)");
    // SAFETY: the test's descriptor.
    unsafe { libc::close(rd) };
}

/// A `close` made by another library's atfork handler, inside
/// `fork_prepare`'s hold, is made in both processes when the hold ends
/// (the program closed before it forked): in the parent the table's
/// reference is dropped; in the child the number is closed and no longer
/// managed, its object forgotten, not dropped (a thread that did not
/// follow the fork may hold its state locked; review r20-xhaz3 item 2).
#[test]
fn a_close_inside_the_fork_hold_is_made_in_both_processes() {
    let _serial = serial();
    prepare();
    // SAFETY: a new descriptor of this test's.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
    assert!(fd >= 0);
    let a = dummy();
    assert!(insert(fd, a.clone()).unwrap().is_none());
    fork_prepare();
    // SAFETY: the interposer, on the test's descriptor.
    let closed = errno_of(|| unsafe { interpose::close(fd) });
    // SAFETY: the child queries the table and its descriptor, `_exit`s.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        fork_release_child();
        // SAFETY: a query of the child's descriptor.
        let gone = unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0;
        // Forgotten: the table's reference and the one the close kept.
        let ok = closed == (0, 0) && gone && get(fd).is_none() && Arc::strong_count(&a) == 3;
        // SAFETY: leaves the child at once (no test harness in it).
        unsafe { libc::_exit(if ok { 0 } else { 1 }) };
    }
    fork_release();
    assert!(pid > 0, "fork");
    assert_eq!(closed, (0, 0), "close");
    assert!(get(fd).is_none(), "still managed in the parent");
    assert_eq!(Arc::strong_count(&a), 1, "the table's reference kept");
    let mut status = 0;
    // SAFETY: our child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "the child's close (status {status:#x})"
    );
}

/// A new pipe's two ends (close-on-exec).
fn pipe() -> [c_int; 2] {
    let mut p = [0; 2];
    // SAFETY: a new pipe of the caller's.
    let made = unsafe { libc::pipe2(p.as_mut_ptr(), libc::O_CLOEXEC) };
    assert_eq!(made, 0);
    p
}

/// A fork from a handler over the thread's hold: the child's demotion
/// (`demote_all`, as the library's atfork child handler makes it) lists
/// the low descriptors without the lock and puts each socket's kernel
/// descriptor at its number at once; their removals, refused over the
/// hold, are made when the hold ends, the objects forgotten (review
/// r20-xhaz3 item 3: the child kept the parent's sockets, whose state a
/// thread that did not follow may hold locked). The parent's table is
/// unchanged.
#[test]
fn a_fork_over_the_threads_hold_demotes_in_the_child() {
    let _serial = serial();
    prepare();
    let (prog, kern) = (pipe(), pipe());
    let (fd, k) = (prog[0], kern[0]);
    let s: Arc<dyn Socket> = Arc::new(Kernel(k));
    assert!(insert(fd, s.clone()).unwrap().is_none());
    let want = inode(k);
    assert_ne!(inode(fd), want);
    let status = within_a_minute("a fork over its thread's hold", move || {
        let held = hold_write();
        fork_prepare();
        // SAFETY: the child demotes, changes nothing else, `_exit`s.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            fork_release_child();
            interpose::demote_all(false);
            let put = inode(fd) == want;
            let kept_meanwhile = get(fd).is_some();
            drop(held);
            let ok = put && kept_meanwhile && get(fd).is_none();
            // SAFETY: leaves the child at once (no test harness in it).
            unsafe { libc::_exit(if ok { 0 } else { 1 }) };
        }
        fork_release();
        drop(held);
        let mut status = 0;
        // SAFETY: our child.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        status
    });
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "the child's demotion (status {status:#x})"
    );
    assert!(same(&get(fd), &s), "the parent's table changed");
    assert_ne!(inode(fd), want, "the parent's descriptor changed");
    assert!(same(&remove(fd).unwrap(), &s));
    for d in prog.into_iter().chain(kern) {
        // SAFETY: the test's descriptors.
        unsafe { libc::close(d) };
    }
}

/// Over the thread's hold, no kind acts on a candidate: an adoption
/// (`target`, for `connect`/`sendto`), `bind`'s, `accept`'s and a
/// finished `connect`'s hooks, and a switch (`setsockopt` at the kinds'
/// level) would have their side effects — a handshake on the wire, a
/// registration, a bound port — before the table refused the new socket
/// (review r20-xhaz2b item 1). The call stays a plain one, the descriptor
/// a candidate; after the hold the kind acts again.
#[test]
fn no_kind_acts_over_the_threads_hold() {
    let _serial = serial();
    let fd = 60_091;
    set_candidate(fd, 1);
    let m = mark(fd);
    assert!(interpose::acting_kind(m).is_some());
    let r = within_a_minute("a kind's hook over its thread's hold", move || {
        let held = hold_write();
        let acting = interpose::acting_kind(m).is_some();
        let asked = std::cell::Cell::new(false);
        let adopted = interpose::target(fd, m, || {
            asked.set(true);
            None
        })
        .is_some();
        let one: c_int = 1;
        let switch = errno_of(|| {
            interpose::plain_sockopt(
                fd,
                crate::xsock::FIRST_OWN_LEVEL,
                crate::shim::socket::SockOpt::Set(
                    1,
                    (&one as *const c_int).cast(),
                    size_of::<c_int>() as libc::socklen_t,
                ),
            )
        });
        drop(held);
        (acting, asked.get(), adopted, switch)
    });
    assert_eq!(
        r,
        (false, false, false, (Some(-1), libc::EDEADLK)),
        "(a kind acting, an adoption asked, adopted, the switch)"
    );
    assert_eq!(mark(fd), m, "no longer a candidate");
    assert!(interpose::acting_kind(m).is_some(), "after the hold");
    set_candidate(fd, 0);
}

/// Over the thread's hold, the calls on a managed descriptor that only
/// the refusing socket answers (one at or above `BITS`) and whose effect
/// is the program's descriptor's own fail with `EDEADLK` before it is
/// made: `fcntl(F_SETFL)`, `ioctl(FIONBIO)`, and the names fail the same
/// way (no `EBADF` of the refusing socket's kernel descriptor; review
/// r20-xhaz2b item 4). The number is not open: a call made would fail
/// with `EBADF`.
#[test]
fn descriptor_calls_on_the_refusing_socket_fail_first() {
    let _serial = serial();
    prepare();
    let high = BITS as c_int + 91;
    assert!(insert(high, dummy()).unwrap().is_none());
    let r = within_a_minute("a descriptor call over its thread's hold", move || {
        let held = hold_write();
        let on: c_int = 1;
        // SAFETY: the interposers; the pointers are live locals.
        let calls = unsafe {
            let mut sa: libc::sockaddr_storage = std::mem::zeroed();
            let mut len = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
            let sa = (&mut sa as *mut libc::sockaddr_storage).cast();
            [
                errno_of(|| interpose::fcntl(high, libc::F_SETFL, libc::O_NONBLOCK as usize)),
                errno_of(|| interpose::ioctl(high, libc::FIONBIO, &on as *const c_int as usize)),
                errno_of(|| interpose::getsockname(high, sa, &mut len)),
                errno_of(|| interpose::getpeername(high, sa, &mut len)),
            ]
        };
        drop(held);
        calls
    });
    assert_eq!(r, [(-1, libc::EDEADLK); 4], "(F_SETFL, FIONBIO, names)");
    assert!(remove(high).unwrap().is_some());
}

/// A `dup2(old, new)` (both ends of two new pipes, `old` managed if
/// `managed[0]`, `new` if `managed[1]`) during whose change of the table
/// a signal handler closes `new` (staged in `copy`'s write hold, before
/// the change). Natively `new` ends closed. Checks that it is closed and
/// not managed, and that the table keeps no reference of the object
/// `new` named, nor a second of `old`'s.
fn a_close_over_a_dups_change(managed: [bool; 2]) {
    let _serial = serial();
    prepare();
    let ([ra, old], [rb, new]) = (pipe(), pipe());
    let (s, prev) = (dummy(), dummy());
    for (fd, obj, on) in [(old, &s, managed[0]), (new, &prev, managed[1])] {
        if on {
            assert!(insert(fd, obj.clone()).unwrap().is_none());
        }
    }
    let (closed, duped) = within_a_minute("a close over a dup's change", move || {
        let closed = std::rc::Rc::new(std::cell::Cell::new((1, 0)));
        let c = closed.clone();
        IN_COPY.with(|h| {
            *h.borrow_mut() = Some(Box::new(move || {
                // SAFETY: the interposer, on the test's descriptor.
                c.set(errno_of(|| unsafe { interpose::close(new) }));
            }));
        });
        // SAFETY: the interposer, on the test's descriptors.
        let duped = unsafe { interpose::dups::dup2(old, new) };
        IN_COPY.with(|h| h.borrow_mut().take());
        (closed.get(), duped)
    });
    assert_eq!((closed, duped), ((0, 0), new), "(the close, the dup2)");
    assert_eq!(inode(new), 0, "the duplicate left open");
    assert!(get(new).is_none() && mark(new) == 0, "left managed");
    assert_eq!(Arc::strong_count(&prev), 1, "the table's reference kept");
    assert_eq!(
        Arc::strong_count(&s),
        1 + usize::from(managed[0]),
        "a second reference of the table's"
    );
    if managed[0] {
        assert!(same(&remove(old).unwrap(), &s));
    }
    for d in [ra, old, rb] {
        // SAFETY: the test's descriptors.
        unsafe { libc::close(d) };
    }
}

/// A handler's close of a dup's managed target over the dup's change of
/// the table is made when the hold ends and closes the duplicate: it
/// closed it at the end of the dup's look-up, before the dup's insert
/// made the closed number managed (review r21-haz item 4).
#[test]
fn a_close_over_a_dup_onto_a_managed_number_closes_the_duplicate() {
    a_close_over_a_dups_change([true, true]);
}

/// As above, the dup's source plain: the managed target's removal is
/// the dup's, and the close left to the hold's end closes the number.
#[test]
fn a_close_over_a_plain_dup_onto_a_managed_number_closes_the_duplicate() {
    a_close_over_a_dups_change([false, true]);
}

/// As above, the target not managed: the handler's close is a plain one,
/// made before the change; the change, made on a closed number, is
/// undone.
#[test]
fn a_plain_close_over_a_dups_change_leaves_the_number_unmanaged() {
    a_close_over_a_dups_change([true, false]);
}

/// As above, and the closed number is given to another file before the
/// change (another thread's `open`): the change is undone all the same,
/// the other file's number not managed, its calls never reaching the
/// socket (review r21-b item 6: the undo asked only whether the number
/// was open).
#[test]
fn a_number_reopened_over_a_dups_change_is_left_unmanaged() {
    let _serial = serial();
    prepare();
    let ([ra, old], [rb, new]) = (pipe(), pipe());
    let s = dummy();
    assert!(insert(old, s.clone()).unwrap().is_none());
    let duped = within_a_minute("a reopen over a dup's change", move || {
        IN_COPY.with(|h| {
            *h.borrow_mut() = Some(Box::new(move || {
                // SAFETY: the interposer, then libc (another file at the
                // number), on the test's descriptors.
                // `rb`: a file of its own (not `old`'s pipe, whose ends
                // share one inode; a managed socket's inode is its own).
                unsafe {
                    interpose::close(new);
                    libc::dup2(rb, new);
                }
            }));
        });
        // SAFETY: the interposer, on the test's descriptors.
        let duped = unsafe { interpose::dups::dup2(old, new) };
        IN_COPY.with(|h| h.borrow_mut().take());
        duped
    });
    assert_eq!(duped, new, "the dup2");
    assert_eq!(inode(new), inode(rb), "not the other file at the number");
    assert!(
        get(new).is_none() && mark(new) == 0,
        "the other file managed"
    );
    assert_eq!(
        Arc::strong_count(&s),
        2,
        "a second reference of the table's"
    );
    assert!(same(&remove(old).unwrap(), &s));
    for d in [ra, old, rb, new] {
        // SAFETY: the test's descriptors.
        unsafe { libc::close(d) };
    }
}
