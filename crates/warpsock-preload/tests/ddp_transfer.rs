//! `splice` and `sendfile` with a DDP-mode socket at one end
//! (`interpose/transfer.rs`, `tests/c/spliceddp.c`): each case passes
//! against the kernel's TCP first (the program is the specification),
//! then with every pair switched. Without the library's own `splice` the
//! kernel's moved the doorbell's wake-up bytes in the stream's place (the
//! first case hangs); without its refusal of a socket as `sendfile`'s
//! input, a DDP socket's doorbell was read as a file.

mod common;

use common::run_case;

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
