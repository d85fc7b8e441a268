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
//!   and the library's own descriptors above its floor stay open;
//! * `preadv2`/`pwritev2` at the current position (`tests/c/positioned.c`):
//!   a socket's `readv`/`writev` (the kernel's read the doorbell's bytes);
//! * `recv` with `MSG_TRUNC` (`tests/c/truncddp.c`): the bytes dropped,
//!   the buffer may be null (a null buffer read as the end of stream);
//! * signal-driven I/O (`O_ASYNC`, `F_SETOWN`, `F_SETSIG`, `FIOASYNC`;
//!   `shim/sigio.rs`, `tests/c/sigioddp.c`): an arrival is a `SIGIO`, and
//!   settings made before a switch follow the number (the doorbell
//!   signalled nothing; the engine's TCP socket kept signalling the
//!   program for its credits);
//! * POSIX AIO (`interpose/aio.rs`, `tests/c/aioddp.c`): requests run by
//!   the library, their results where glibc's `aio_error`/`aio_return`
//!   read them (glibc's own read the doorbell: `aio_read` waited for
//!   ever).

mod common;

use common::{over_tcp_then_ddp, run_case};

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
    over_tcp_then_ddp("passfd", 1);
}

#[test]
fn close_range_and_closefrom_close_ddp_sockets_as_close_does() {
    over_tcp_then_ddp("closerange", 6);
}

#[test]
fn preadv2_and_pwritev2_at_the_current_position_are_readv_and_writev() {
    over_tcp_then_ddp("positioned", 1);
}

#[test]
fn msg_trunc_drops_the_bytes_as_tcp_does() {
    over_tcp_then_ddp("truncddp", 1);
}

#[test]
fn signal_driven_io_signals_arrivals_as_over_tcp() {
    over_tcp_then_ddp("sigioddp", 3);
}

#[test]
fn posix_aio_on_a_ddp_socket_completes_as_over_tcp() {
    over_tcp_then_ddp("aioddp", 2);
}
