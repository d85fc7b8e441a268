//! `recvmsg(MSG_ERRQUEUE)` on a DDP-mode socket (`tests/c/errqueue.c`):
//! `EAGAIN`, as TCP's empty error queue, never the stream's bytes (review
//! r22-e item 2). Also run over plain TCP without the preload.

mod common;

use common::{c_program, command, finish};

fn run(preload: bool) {
    let args: Vec<String> = if preload {
        vec![]
    } else {
        vec!["plain".into()]
    };
    let child = command(&c_program("errqueue"), &args, preload)
        .env("WARPSOCK_SWITCH_TIMEOUT_MS", "2000")
        .spawn()
        .expect("spawn errqueue");
    let r = finish(child, std::time::Duration::from_secs(60));
    r.assert_ok("errqueue");
    if preload {
        assert_eq!(r.stat("ddp_switched"), 2, "{}", r.stderr);
    }
}

/// Fails with the flag ignored (the call returns the peer's 8 bytes).
#[test]
fn the_error_queue_of_a_ddp_socket_is_empty_and_keeps_the_streams_bytes() {
    run(false);
    run(true);
}
