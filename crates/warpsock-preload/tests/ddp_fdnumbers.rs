//! The program's descriptor numbers with DDP-mode sockets open
//! (`tests/c/fdnumbers.c`; issue 12): the library's own descriptors, four
//! a DDP-mode socket besides the program's number, live from a floor up
//! (`warpsock_engine::fds`), so the program's numbers are the ones plain
//! TCP gives. Before, each switch took the lowest free numbers: wrk sized
//! its event loop to 10 + 3 x its connections and counted every number
//! past it as a connect error (half of its 10 connections to nginx in
//! policy mode failed). Each case also runs without the preload, the
//! numbering it asks for.

mod common;

use common::run_case;

/// Eight pairs switched in one process: each end's number, and the lowest
/// free number after them, are plain TCP's.
#[test]
fn ddp_mode_sockets_leave_the_programs_numbers_dense() {
    run_case("fdnumbers", "dense", false);
    let r = run_case("fdnumbers", "dense", true);
    assert_eq!(r.stat("ddp_switched"), 16, "{}", r.stderr);
}

/// Under a soft limit of 100, six pairs' library descriptors overflow
/// the room above the floor (50): they are placed below it, and every
/// switch still succeeds.
#[test]
fn library_descriptors_past_their_room_go_low_and_the_switches_succeed() {
    run_case("fdnumbers", "crowded", false);
    let r = run_case("fdnumbers", "crowded", true);
    assert_eq!(r.stat("ddp_switched"), 12, "{}", r.stderr);
    assert_eq!(r.stat("ddp_switch_no_fds"), 0, "{}", r.stderr);
}

/// What a DDP-mode socket costs in descriptors, each end: the program's
/// number (its doorbell's end), the library's hold on that end, the
/// bell's other end, the TCP socket (the engine's handle, which the
/// library's socket uses too), and the engine context's epoll set —
/// five. Before, each end held eight: the engine's completion queue made
/// its eventfd though nobody asked for it (`Cq::notify_fd`, which the
/// preload never calls), a caller-driven context made a wake eventfd that
/// only a progress thread's wait is rung through, and the library kept a
/// duplicate of the TCP socket of its own. A program's descriptor limit divided by this
/// is how many DDP connections it can hold (the budget's `EMFILE`
/// fallback to TCP past it).
#[test]
fn a_ddp_mode_end_holds_five_descriptors() {
    let per_end = |r: &common::Run| -> u64 {
        let line = r.stdout.lines().find_map(|l| l.strip_prefix("per_end "));
        line.unwrap_or_else(|| panic!("no per_end line: {}", r.stdout))
            .trim()
            .parse()
            .unwrap()
    };
    assert_eq!(per_end(&run_case("fdnumbers", "perend", false)), 1);
    let r = run_case("fdnumbers", "perend", true);
    assert_eq!(r.stat("ddp_switched"), 10, "{}", r.stderr);
    assert!(
        per_end(&r) <= 5,
        "{} descriptors an end:\n{}",
        per_end(&r),
        r.stderr
    );
}

/// `ioctl(FIOCLEX)` and `ioctl(FIONCLEX)` on a DDP-mode socket set and
/// clear close-on-exec on the program's own number, as on a TCP socket
/// (helper 77: they reached the library's handle on the TCP socket, the
/// engine's own since session 58, so a `FIONCLEX` then `exec` leaked the
/// connection into the new image, and the program's number kept its
/// flag).
#[test]
fn fioclex_and_fionclex_act_on_the_programs_number() {
    run_case("fdnumbers", "cloexec", false);
    let r = run_case("fdnumbers", "cloexec", true);
    assert_eq!(r.stat("ddp_switched"), 2, "{}", r.stderr);
}
