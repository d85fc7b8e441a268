//! `poll`/`ppoll` of programs built with `_FORTIFY_SOURCE`
//! (`tests/c/pollchk.c`): they call glibc's `__poll_chk`/`__ppoll_chk`,
//! which the library interposes like `poll`/`ppoll` (review r22-e item 1;
//! Debian's memcached imports `__poll_chk`). Each case also runs over plain
//! TCP without the preload.

mod common;

use common::{c_program, run_case};

fn case(name: &str, preload: bool) {
    let r = run_case("pollchk", name, preload);
    if preload {
        assert_eq!(r.stat("ddp_switched"), 2, "{}", r.stderr);
    }
}

/// The program really calls the fortified entry points (else the cases
/// below test plain `poll`).
#[test]
fn the_test_program_calls_the_fortified_polls() {
    let out = std::process::Command::new("nm")
        .arg("-D")
        .arg(c_program("pollchk"))
        .output()
        .expect("run nm");
    let syms = String::from_utf8_lossy(&out.stdout);
    assert!(syms.contains("__poll_chk"), "{syms}");
    assert!(syms.contains("__ppoll_chk"), "{syms}");
}

/// A fortified `poll` of a DDP-mode socket reports the peer's bytes: fails
/// without the interposed `__poll_chk` (the poll waits on the doorbell,
/// which nothing rings, and times out).
#[test]
fn a_fortified_poll_sees_a_ddp_sockets_input() {
    case("poll", false);
    case("poll", true);
}

/// The same for `ppoll` (`__ppoll_chk`).
#[test]
fn a_fortified_ppoll_sees_a_ddp_sockets_input() {
    case("ppoll", false);
    case("ppoll", true);
}
