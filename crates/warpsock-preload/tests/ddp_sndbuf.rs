//! The send buffer of a DDP-mode socket through the calls TCP programs
//! use — `SO_SNDBUF`, `SIOCOUTQ`/`SIOCOUTQNSD`, non-blocking sends at its
//! bound — and the progress thread that empties it while the program
//! makes no call (`tests/c/sndbuf.c`; review r20-xbuf M3, issue 12).

mod common;

use common::{c_program, command, finish};

fn run(mode: &str, sndbuf: &str) {
    run_switching(mode, sndbuf, 2);
}

/// [`run`], the program switching `switched` sockets in all.
fn run_switching(mode: &str, sndbuf: &str, switched: u64) {
    let child = command(&c_program("sndbuf"), &[mode.to_string()], true)
        .env("WARPSOCK_DDP_SLOTS", "4")
        .env("WARPSOCK_DDP_SLOT_KB", "1")
        .env("WARPSOCK_DDP_SNDBUF", sndbuf)
        .spawn()
        .expect("spawn sndbuf");
    let r = finish(child, std::time::Duration::from_secs(60));
    r.assert_ok(&format!("sndbuf {mode}"));
    assert_eq!(r.stat("ddp_switched"), switched, "{}", r.stderr);
}

/// Buffered (`WARPSOCK_DDP_SNDBUF=65536`): `SO_SNDBUF` is the bound and
/// sets it, `SIOCOUTQ` counts the buffered bytes and goes to 0, the
/// progress thread sends them, a send at the bound is partial, then
/// `EAGAIN`.
#[test]
fn the_send_buffer_through_the_tcp_calls() {
    run("on", "65536");
}

/// Unbuffered (`WARPSOCK_DDP_SNDBUF=0`): `SO_SNDBUF` reads the credit
/// window (never 0) and a set leaves buffering off; `SIOCOUTQ` goes to 0
/// once the window was read.
#[test]
fn without_a_send_buffer_so_sndbuf_is_the_credit_window() {
    run("off", "0");
}

/// `SO_SNDBUF` set before the switch — on a listener in DDP mode (the
/// accepted connection inherits it, as the kernel's does) and on a socket
/// before connect (iperf3 `-w`) — is the send buffer's bound after it,
/// clamped as a set after the switch: it went to the kernel socket alone.
#[test]
fn so_sndbuf_set_before_the_switch_is_the_bound_after_it() {
    run("before", "65536");
}

/// `SO_SNDBUF` set on a plain listener (not in DDP mode) is the bound of
/// an accepted connection the program switches later, as Linux's accepted
/// socket inherits it (1ca1adf's known limit: it reached the kernel socket
/// alone); another listener's is not taken, nor a value set on the
/// listener after the connection was made, nor a v6-only listener's on
/// the same port (review r22-a items 6, 9).
#[test]
fn so_sndbuf_of_a_plain_listener_is_the_bound_of_its_switched_connection() {
    run_switching("plain", "65536", 6);
}

/// `sendfile` with no offset on a non-blocking DDP socket whose peer reads
/// only after `EAGAIN`: the file position moves by the bytes sent only,
/// and the peer gets the file whole (review r22-b item 1: the read before
/// a send that failed moved it, and the retry skipped up to 1 MiB).
#[test]
fn sendfile_with_no_offset_keeps_the_file_position_when_the_send_fails() {
    run("sendfile", "65536");
}

/// A blocking send of at least `WARPSOCK_ZCOPY_MIN` (64 KiB) goes from
/// the program's buffer and never into the send buffer: with a peer that
/// does not read it takes the credit window alone (`SO_SNDTIMEO` ends its
/// wait with a partial count of at most the window), where TCP's send
/// would return once the rest fit its socket buffer — the bound the
/// README states, not a stall (task xstall: a 4 MiB `write` with 1 MiB of
/// `SO_SNDBUF` and a 128 KiB window blocked behind a paused reader).
/// Copied sends after it take the send buffer past the window.
#[test]
fn a_zero_copy_send_takes_the_credit_window_not_the_send_buffer() {
    run("zcopy", "65536");
}
