//! Socket options and the busy-polling fast path on DDP-mode sockets
//! (`tests/c/sockopt.c`; issue 12, review r22-c). Each case also runs
//! without the preload (plain TCP), the behaviour it asks for. Also run
//! under ASan by `scripts/test-xsock.sh`.

mod common;

use common::{c_program, command, finish};

fn case(name: &str, preload: bool) -> common::Run {
    let mut args = vec![name.to_owned()];
    if !preload {
        args.push("plain".to_owned());
    }
    let child = command(&c_program("sockopt"), &args, preload)
        .env("WARPSOCK_SWITCH_TIMEOUT_MS", "2000")
        .spawn()
        .expect("spawn sockopt");
    let r = finish(child, std::time::Duration::from_secs(60));
    r.assert_ok(&format!("sockopt {name}"));
    if preload {
        assert_eq!(r.stat("ddp_switched"), 2, "{}", r.stderr);
    }
    r
}

/// `SO_RCVLOWAT` 1024, set before and after the switch, stays the
/// program's (read back) and never reaches the engine's TCP socket (review
/// r22-c item 1): fails with it forwarded after the switch (the
/// busy-polling reader's spin reports nothing below the mark: no answer)
/// and with the value set before the switch left on the kernel socket (the
/// switch's MPA reply read waits for 1024 bytes: the switch fails).
#[test]
fn a_busy_poller_with_a_low_water_mark_gets_each_8_byte_answer() {
    case("rcvlowat", false);
    case("rcvlowat", true);
}
