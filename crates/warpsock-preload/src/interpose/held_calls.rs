//! The interposed calls over the calling thread's own hold of the
//! descriptor table's lock (a signal handler that interrupted `close`,
//! `dup2` or a locked look-up; staged here by the thread holding the lock
//! itself): they fail with `EDEADLK` before any side effect, never wait for
//! the lock (the table's `held` module docs; reviews r19-lead-haz note 5,
//! r20-xhaz2b items 1 and 4). The table's own look-ups over a hold are
//! tested with the table (`shim/fdtable/tests/held.rs`).

use std::mem::size_of;

use libc::c_int;

use crate::interpose;
use crate::shim::fdtable::tests::support::{dummy, hold_write, same, serial, within_a_minute};
use crate::shim::fdtable::{get, insert, mark, prepare, remove, set_candidate, BITS};
use crate::shim::sys::{errno, set_errno};

/// The errno a call left, cleared first.
fn errno_of<T>(f: impl FnOnce() -> T) -> (T, c_int) {
    set_errno(0);
    let r = f();
    (r, errno())
}

/// The interposed `close` and `dup` over the thread's hold fail with
/// `EDEADLK` and change nothing: the descriptor stays open and managed,
/// no duplicate is made.
#[test]
fn close_and_dup_over_the_threads_hold_fail_and_change_nothing() {
    let _serial = serial();
    prepare();
    // SAFETY: a new descriptor of this test's.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
    assert!(fd >= 0);
    let a = dummy();
    assert!(insert(fd, a.clone()).unwrap().is_none());
    let r = within_a_minute("close or dup over its thread's hold", move || {
        let held = hold_write();
        // SAFETY: the interposers, on the test's descriptor.
        let closed = errno_of(|| unsafe { interpose::close(fd) });
        // SAFETY: as above.
        let duped = errno_of(|| unsafe { interpose::dup(fd) });
        // SAFETY: as above (a number no test opens).
        let duped2 = errno_of(|| unsafe { interpose::dup2(fd, 60_079) });
        drop(held);
        (closed, duped, duped2)
    });
    assert_eq!(r.0, (-1, libc::EDEADLK), "close");
    assert_eq!(r.1, (-1, libc::EDEADLK), "dup");
    assert_eq!(r.2, (-1, libc::EDEADLK), "dup2");
    assert!(same(&get(fd), &a), "no longer managed");
    // SAFETY: a query of the test's descriptor.
    assert!(unsafe { libc::fcntl(fd, libc::F_GETFD) } >= 0, "closed");
    assert!(same(&remove(fd).unwrap(), &a));
    // SAFETY: the test's descriptor.
    unsafe { libc::close(fd) };
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
