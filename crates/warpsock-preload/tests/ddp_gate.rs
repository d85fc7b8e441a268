//! The write gate of a DDP-mode socket under the preload and the progress
//! thread's watch (`tests/c/gatewatch.c`; session 21, review r21-send
//! items 2 and 5, issue 12): a send that met `EAGAIN` keeps the engine's
//! socket watched for the credits until the program's writability opens,
//! and no longer; `shutdown(SHUT_WR)` opens it as TCP's poll does.

mod common;

use common::{c_program, command, finish};

#[test]
fn a_shut_gate_is_watched_until_it_opens() {
    let child = command(&c_program("gatewatch"), &[], true)
        .env("WARPSOCK_DDP_SLOTS", "4")
        .env("WARPSOCK_DDP_SLOT_KB", "1")
        .env("WARPSOCK_DDP_SNDBUF", "0")
        .spawn()
        .expect("spawn gatewatch");
    let r = finish(child, std::time::Duration::from_secs(60));
    r.assert_ok("gatewatch");
    assert_eq!(r.stat("ddp_switched"), 2, "{}", r.stderr);
}
