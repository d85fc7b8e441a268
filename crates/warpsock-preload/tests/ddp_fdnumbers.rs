//! The program's descriptor numbers with DDP-mode sockets open
//! (`tests/c/fdnumbers.c`; issue 12): the library's own descriptors, seven
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

/// Under a soft limit of 100, four pairs' library descriptors overflow
/// the room above the floor (50): they are placed below it, and every
/// switch still succeeds.
#[test]
fn library_descriptors_past_their_room_go_low_and_the_switches_succeed() {
    run_case("fdnumbers", "crowded", false);
    let r = run_case("fdnumbers", "crowded", true);
    assert_eq!(r.stat("ddp_switched"), 8, "{}", r.stderr);
    assert_eq!(r.stat("ddp_switch_no_fds"), 0, "{}", r.stderr);
}
