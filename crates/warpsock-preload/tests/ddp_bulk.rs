//! The bulk data path of DDP-mode sockets under the preload, counted per
//! MiB from the `WARPSOCK_STATS` report (no timings): `tests/c/ddpbulk.c`
//! streams 1 MiB writes through one switched pair in one process.

mod common;

use common::run;

const MIB: u64 = 16;

fn bulk(mode: &str) -> common::Run {
    let r = run("ddpbulk", &[MIB.to_string(), mode.to_owned()], true);
    r.assert_ok(&format!("ddpbulk {mode}"));
    assert_eq!(r.stat("ddp_switched"), 2, "{}", r.stderr);
    assert_eq!(r.stat("ddp_rx_bytes"), MIB << 20, "{}", r.stderr);
    r
}

/// A reader that only makes blocking calls has no one to wake: its
/// receives ring no doorbell for the bytes they leave queued (each bell
/// was a `sendto`, and a drain of two `recvfrom` in the next receive: one
/// per message of a header-then-body reader, ~3 system calls per MiB).
#[test]
fn blocking_reads_ring_no_doorbell() {
    let r = bulk("block");
    assert_eq!(r.stat("ddp_bells"), 0, "{}", r.stderr);
}

/// A reader that waits in `poll`, or in `epoll_wait` from its second read
/// on, is woken for every read (a bell for bytes already queued when it
/// starts to wait, none while it does not).
#[test]
fn waiting_readers_are_woken() {
    for mode in ["poll", "epoll"] {
        let r = bulk(mode);
        // At most one bell per read (two reads per MiB), whoever rang.
        assert!(r.stat("ddp_bells") <= 2 * MIB + 4, "{mode}: {}", r.stderr);
    }
}

/// Asynchronous one-sided 1 MiB writes, four in flight, from a writer that
/// waits for their completions in `poll` on a non-blocking socket whose
/// send buffer is small (the engine holds a backlog at every wait: only a
/// round after output space returns sends it, the hang `WATCH_EVENTS`
/// prevents). Every write completes and the target's region holds the
/// bytes. The counters of the writer's waits are printed (`--nocapture`):
/// today the progress thread runs those rounds (`ddp_bg_rounds`) and rings
/// for the completions, where the program's own `poll` could.
#[test]
fn asynchronous_writes_complete_through_poll_with_a_full_send_buffer() {
    let r = run("riobulk", &[MIB.to_string()], true);
    r.assert_ok("riobulk");
    assert_eq!(r.stat("ddp_switched"), 2, "{}", r.stderr);
    println!(
        "riobulk {MIB} MiB: {} progress-thread rounds, {} poll rounds, {} bells, {} watch changes",
        r.stat("ddp_bg_rounds"),
        r.stat("ddp_poll_rounds"),
        r.stat("ddp_bells"),
        r.stat("ddp_watch_changes")
    );
}
