//! The library's descriptors out of the program's numbers
//! (`warpsock_engine::fds`): a process of its own, as the floor is
//! process-wide.

use std::os::fd::RawFd;

use warpsock_engine::fds;

/// The lowest free number now.
fn lowest_free() -> RawFd {
    // SAFETY: a duplicate of stderr, closed at once.
    unsafe {
        let fd = libc::dup(2);
        assert!(fd >= 0);
        libc::close(fd);
        fd
    }
}

/// Whether `fd` is open, and its close-on-exec flag.
fn open_cloexec(fd: RawFd) -> Option<bool> {
    // SAFETY: F_GETFD reads a flag; no memory.
    let fl = unsafe { libc::fcntl(fd, libc::F_GETFD) };
    (fl >= 0).then_some(fl & libc::FD_CLOEXEC != 0)
}

fn eventfd() -> RawFd {
    // SAFETY: a new eventfd of this test's.
    let fd = unsafe { libc::eventfd(0, 0) };
    assert!(fd >= 0);
    fd
}

/// One test (the floor is the process's): every case in turn.
#[test]
fn descriptors_go_above_the_floor_and_stay_usable_when_they_cannot() {
    // Off: nothing moves.
    fds::set_floor(0);
    let e = eventfd();
    assert_eq!(fds::lift(e), e);
    assert_eq!(open_cloexec(e), Some(false));

    // On: moved to the lowest free number at or above the floor, the low
    // number closed, close-on-exec set; the program's next number is the
    // one it would have had.
    let low = lowest_free();
    let floor = 200;
    fds::set_floor(floor);
    let made = eventfd();
    assert_eq!(made, low);
    let lifted = fds::lift(made);
    assert!(lifted >= floor, "{lifted}");
    assert_eq!(open_cloexec(made), None, "the low number was left open");
    assert_eq!(open_cloexec(lifted), Some(true));
    assert_eq!(lowest_free(), low);
    let second = fds::lift(eventfd());
    assert_eq!(second, lifted + 1, "the next free number up there");
    // A descriptor already above the floor stays.
    assert_eq!(fds::lift(second), second);

    // A duplicate goes up there directly.
    let dup = fds::dup_lifted(e);
    assert_eq!(dup, second + 1);
    assert_eq!(open_cloexec(dup), Some(true));
    assert_eq!(lowest_free(), low);

    // A std handle moves with its descriptor and still works.
    let l = fds::lift_owned(std::net::TcpListener::bind("127.0.0.1:0").unwrap());
    let lifted_listener = std::os::fd::AsRawFd::as_raw_fd(&l);
    assert_eq!(lifted_listener, dup + 1);
    assert!(l.local_addr().unwrap().port() != 0);
    drop(l);
    assert_eq!(lowest_free(), low);

    // A floor at or past the soft limit (F_DUPFD refuses it): the
    // descriptor stays where it was, open; a duplicate is made low.
    let mut l = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit.
    assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) }, 0);
    fds::set_floor(RawFd::try_from(l.rlim_cur).unwrap_or(RawFd::MAX));
    let stays = eventfd();
    assert_eq!(fds::lift(stays), stays);
    assert_eq!(open_cloexec(stays), Some(false));
    let dup_low = fds::dup_lifted(e);
    assert!(dup_low >= 0 && dup_low < floor, "{dup_low}");

    // From the limit: half of it, at most the cap.
    let set = fds::set_floor_from_limit();
    assert_eq!(set, fds::floor_for_limit(l.rlim_cur));
    assert_eq!(fds::floor(), set);
    assert!(set > 0 && set <= fds::MAX_FLOOR);

    for fd in [e, lifted, second, dup, stays, dup_low] {
        // SAFETY: this test's own descriptors.
        unsafe { libc::close(fd) };
    }
    fds::set_floor(0);
}
