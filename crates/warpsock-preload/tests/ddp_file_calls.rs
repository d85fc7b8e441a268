//! Calls on a DDP-mode socket's number that the kernel would make on the
//! file the number names (the doorbell's end, a file of the library's),
//! each passing against the kernel's TCP first where it can:
//! * `splice` and `sendfile` with a DDP-mode socket at one end
//!   (`interpose/transfer.rs`, `tests/c/spliceddp.c`): each case passes
//!   against the kernel's TCP first (the program is the specification),
//!   then with every pair switched. Without the library's own `splice` the
//!   kernel's moved the doorbell's wake-up bytes in the stream's place
//!   (the first case hangs); without its refusal of a socket as
//!   `sendfile`'s input, a DDP socket's doorbell was read as a file;
//! * a DDP socket's descriptor in `SCM_RIGHTS` (`tests/c/passfd.c`):
//!   refused with `EOPNOTSUPP` (the kernel passed the doorbell end);
//! * `close_range` and `closefrom` (`interpose/ranges.rs`,
//!   `tests/c/closerange.c`): a DDP socket in the range is closed as
//!   `close` closes it (the kernel's close left the connection open and
//!   the number in the table: a new socket there wrote to the old peer),
//!   and the library's own descriptors above its floor stay open.

mod common;

use common::{c_program, command, finish, run_case};

/// Case, DDP pairs it switches.
const CASES: [(&str, u64); 4] = [
    ("from_socket", 2),
    ("to_socket", 2),
    ("refused", 1),
    ("sendfile", 2),
];

#[test]
fn splice_and_sendfile_answer_as_over_tcp() {
    for (case, pairs) in CASES {
        let tcp = run_case("spliceddp", case, false);
        assert!(
            tcp.stdout.contains(&format!("spliceddp {case}: ok")),
            "{}",
            tcp.stdout
        );
        let ddp = run_case("spliceddp", case, true);
        assert!(
            ddp.stdout.contains(&format!("spliceddp {case}: ok")),
            "{}",
            ddp.stdout
        );
        assert_eq!(
            ddp.stat("ddp_switched"),
            2 * pairs,
            "{case}: {}",
            ddp.stderr
        );
    }
}

#[test]
fn a_ddp_socket_is_not_passed_to_another_process() {
    let plain = command(&c_program("passfd"), &["plain".to_owned()], false)
        .spawn()
        .expect("spawn passfd");
    let r = finish(plain, std::time::Duration::from_secs(60));
    r.assert_ok("passfd plain");
    let ddp = command(&c_program("passfd"), &["refused".to_owned()], true)
        .spawn()
        .expect("spawn passfd");
    let r = finish(ddp, std::time::Duration::from_secs(60));
    r.assert_ok("passfd");
    assert!(r.stdout.contains("passfd: ok"), "{}", r.stdout);
    assert_eq!(r.stat("ddp_switched"), 2, "{}", r.stderr);
}

#[test]
fn close_range_and_closefrom_close_ddp_sockets_as_close_does() {
    for (args, preload) in [(vec!["plain".to_owned()], false), (vec![], true)] {
        let child = command(&c_program("closerange"), &args, preload)
            .spawn()
            .expect("spawn closerange");
        let r = finish(child, std::time::Duration::from_secs(60));
        r.assert_ok(&format!("closerange (preload {preload})"));
        assert!(r.stdout.contains("closerange: ok"), "{}", r.stdout);
        if preload {
            // Four pairs.
            assert_eq!(r.stat("ddp_switched"), 8, "{}", r.stderr);
        }
    }
}
