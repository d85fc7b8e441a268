//! The interposed `close`, `dup2` and `dup3` of a number registered in an
//! epoll set this process made, whose file the library holds too: the
//! registration goes with the number as the kernel's would
//! (`shim::epollcarry::before_close`). Made here so that the shim's tests
//! never name the interposer.

use crate::shim::epollcarry::close_testing::{close_all, held_and_registered, reported};

/// The interposed `close` of a number whose file the library holds
/// takes the number's registration with it (the library's own
/// descriptor keeps the file open, and the kernel's close alone
/// would leave it reporting the closed number).
#[test]
fn the_interposed_close_of_a_held_number_takes_its_registration() {
    let (a, (lib, held), b, ep) = held_and_registered();
    assert_eq!(reported(ep), 1);
    // SAFETY: the interposed close of our descriptor.
    assert_eq!(unsafe { super::super::close(a) }, 0);
    assert_eq!(reported(ep), 0, "the closed number is still reported");
    drop(held);
    close_all(&[lib, b, ep]);
}

/// Review 37 item A2: a `dup2` of a copy of the number over it keeps
/// the file open, so its registration stays, as the kernel's does.
#[test]
fn a_dup2_over_a_number_of_the_same_file_keeps_its_registration() {
    let (a, (lib, held), b, ep) = held_and_registered();
    assert_eq!(reported(ep), 1);
    // SAFETY: a copy of our descriptor.
    let n = unsafe { libc::dup(a) };
    // SAFETY: the interposed dup2 of our descriptors.
    assert_eq!(unsafe { super::super::dups::dup2(n, a) }, a);
    assert_eq!(reported(ep), 1, "the registration went");
    drop(held);
    close_all(&[a, n, lib, b, ep]);
}

/// Review 37 item A3: a `dup3` that fails (flags other than
/// `O_CLOEXEC`) closes nothing, so the registration stays.
#[test]
fn a_failed_dup3_over_a_number_keeps_its_registration() {
    let (a, (lib, held), b, ep) = held_and_registered();
    // SAFETY: a new socket of ours.
    let other = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0) };
    // SAFETY: the interposed dup3 of our descriptors, with bad flags.
    let r = unsafe { super::super::dups::dup3(other, a, 0x4000_0000) };
    assert_eq!((r, crate::shim::sys::errno()), (-1, libc::EINVAL));
    assert_eq!(reported(ep), 1, "the registration went");
    drop(held);
    close_all(&[a, other, lib, b, ep]);
}

/// Review 37 item A4: a forked child's close of an inherited number
/// leaves the registration in a set its parent made (one registration
/// of the two processes, the parent's copy of the file still open).
#[test]
fn a_forked_childs_close_leaves_its_parents_registration() {
    let (a, (lib, held), b, ep) = held_and_registered();
    let status = crate::shim::forktest::child_within(|| {
        // SAFETY: the child's close of its copy.
        unsafe { super::super::close(a) }
    });
    assert_eq!(status, Some(0), "the child's close");
    assert_eq!(
        reported(ep),
        1,
        "the child's close took the parent's registration"
    );
    drop(held);
    close_all(&[a, lib, b, ep]);
}
