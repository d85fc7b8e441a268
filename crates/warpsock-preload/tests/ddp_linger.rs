//! `close` with `SO_LINGER` {1, N > 0} on a DDP-mode socket, as Linux's
//! (`tests/c/ddplinger.c`): it waits until the bytes and the end of
//! stream are acknowledged, or N s, then returns 0 — the program may
//! `_exit` at once after it, as over TCP — and a signal ends the wait,
//! the close still 0. Each case runs the same program over plain TCP too
//! (the comparison), then in DDP mode.

use std::time::Duration;

mod common;

/// Runs `ddplinger <mode>` preloaded (small windows: 32 slots of 4 KiB;
/// `WARPSOCK_LINGER_MS=500`, shorter than every case's `SO_LINGER`), or
/// plain TCP; the run must succeed.
fn run(mode: &str, preload: bool) {
    run_with(mode, preload.then(common::preload_so), &[]);
}

/// [`run`] preloading `so` if given (else plain TCP), with `env` too (over
/// the defaults).
fn run_with(mode: &str, so: Option<&'static std::path::Path>, env: &[(&str, &str)]) {
    let preload = so.is_some();
    let mut args = vec![mode.to_owned()];
    if !preload {
        args.push("plain".to_owned());
    }
    let child = common::command_with(&common::c_program("ddplinger"), &args, so)
        .env("WARPSOCK_DDP_SLOTS", "32")
        .env("WARPSOCK_DDP_SLOT_KB", "4")
        .env("WARPSOCK_LINGER_MS", "500")
        .env("WARPSOCK_SWITCH_TIMEOUT_MS", "5000")
        .envs(env.iter().copied())
        .spawn()
        .expect("spawn ddplinger");
    let r = common::finish(child, Duration::from_secs(60));
    println!("{}", r.stdout.trim());
    r.assert_ok(&format!("ddplinger {} (preload {preload})", args.join(" ")));
    if preload {
        // The reader's count (the writer `_exit`s: no counters).
        assert!(r.stat("ddp_switched") >= 1, "{}", r.stderr);
    }
}

/// The writer `_exit`s right after its close while the reader, paused
/// until then, still has the stream's tail to read: the close waited for
/// it to be acknowledged, so the reader reads every byte, then 0.
#[test]
fn a_lingering_close_sends_every_byte_before_it_returns() {
    run("drain", false);
    run("drain", true);
}

/// The reader reads nothing more: the close returns 0 once its linger
/// time (2 s) passed, not before, and not much after; the reader then
/// gets the rest or a reset, never a clean end after a short stream.
#[test]
fn a_lingering_close_returns_after_its_time() {
    run("stuck", false);
    run("stuck", true);
}

/// A signal (its handler without `SA_RESTART`) during the wait ends it:
/// the close returns 0 at once, as Linux's (`sk_stream_wait_close` stops
/// at a pending signal; the descriptor is gone).
#[test]
fn a_signal_ends_a_lingering_close_which_returns_0() {
    run("signal", false);
    run("signal", true);
}

/// A signal handler that forks inside that wait, its child returning from
/// the handler into the close (review r28-e item 4): the child's close
/// returns 0 as a plain close, neither stepping nor handing over the
/// parent's close on the shared engine socket — the child runs one
/// thread, no reaper of its own — and the parent's close goes on: the
/// reader gets every byte, then 0 (or a reset, as `signal`). Fails
/// ("ended with 2": the child's reaper thread) with the child going on
/// with the parent's close as its own.
#[test]
fn a_child_forked_in_a_lingering_closes_wait_leaves_the_parents_close() {
    run("sigfork", false);
    run("sigfork", true);
}

/// A `pthread_cancel` of a thread in that wait ends it too: the thread
/// ends cancelled at once — at its next cancellation point after the
/// close returned 0 (the descriptor is gone; over TCP glibc 2.36 unwinds
/// out of the close itself).
#[test]
fn a_cancel_ends_a_lingering_close() {
    run("cancel", false);
    run("cancel", true);
}

/// A signal that comes inside the close before its wait began (the
/// library built with test-hooks sends it after the close's begin,
/// `WARPSOCK_TEST_LINGER_SIGNAL`) ends the wait at once too, as Linux's:
/// the close blocks signals before its work (review r26-b item 4).
#[test]
fn a_signal_before_a_lingering_closes_wait_ends_it() {
    run("early", false);
    let usr1 = libc::SIGUSR1.to_string();
    run_with(
        "early",
        Some(common::preload_so_with_hooks()),
        &[("WARPSOCK_TEST_LINGER_SIGNAL", &usr1)],
    );
}

/// A lingering close whose wait a signal ended before it was acknowledged
/// stays counted while it hands itself to the reaper: an exit made then
/// by another thread waits for it (the process lives through the
/// hand-over's hold: its second byte comes), and the reader gets every
/// byte, then 0 (review r26-b item 3: the count dropped before the
/// hand-over's, which may first start the reaper; the exit then did not
/// wait, the process ended 1 ms after, and the reader got `ECONNRESET`).
/// The test-hooks build holds the hand-over 1 s
/// (`WARPSOCK_TEST_HANDOVER_GAP_FD`, set by the program: a byte before
/// the hold, one after), within the exit's bound (`WARPSOCK_LINGER_MS`
/// 5 s here).
#[test]
fn an_exit_during_a_lingering_closes_hand_over_waits_for_it() {
    run("gap", false);
    run_with(
        "gap",
        Some(common::preload_so_with_hooks()),
        &[("WARPSOCK_LINGER_MS", "5000")],
    );
}

/// A signal handler that calls `exit(0)` and runs as a lingering close
/// ends — its wait ended by another signal with bytes still in the send
/// buffer; the test-hooks build sends the handler's signal
/// (`WARPSOCK_TEST_LINGER_SIGNAL_AFTER`) before the close's mask is put
/// back, where it runs — finds the close handed to the reaper, which
/// sends on while the exit waits: the reader gets every byte, then 0,
/// and the writer ends well within the exit's bound (`WARPSOCK_LINGER_MS`
/// 20 s here; review r27-c item 1: the close was still the handler's
/// thread's, and the exit waited that bound for it with nothing stepping
/// it).
#[test]
fn an_exit_from_a_handler_as_a_lingering_close_ends_waits_for_the_reaper() {
    run("sigexit", false);
    let usr2 = libc::SIGUSR2.to_string();
    run_with(
        "sigexit",
        Some(common::preload_so_with_hooks()),
        &[
            ("WARPSOCK_TEST_LINGER_SIGNAL_AFTER", &usr2),
            ("WARPSOCK_LINGER_MS", "20000"),
        ],
    );
}

/// A signal handler that calls `exit(0)` and runs inside a lingering
/// close's wait (the reader's signal while the writer sleeps there, its
/// tail unsent: no hook) steps that close itself while it waits, and does
/// not wait for its count, its own thread's: the reader gets every byte,
/// then 0 (in DDP mode or `ECONNRESET` after every byte, as in the
/// `_exit` case below), and the writer ends well within the exit's bound
/// (`WARPSOCK_LINGER_MS` 20 s here; review r27-c item 1(b): the exit
/// waited that bound for the close's count with nothing stepping the
/// close, then reset the peer). Plain: the kernel's close ends at the
/// signal, and its handler's exit leaves the rest to the kernel.
#[test]
fn an_exit_from_a_handler_inside_a_lingering_closes_wait_steps_it() {
    run("sigin", false);
    run_with(
        "sigin",
        Some(common::preload_so()),
        &[("WARPSOCK_LINGER_MS", "20000")],
    );
}

/// The same with a handler that calls `_exit(0)`: its flush steps the
/// close's sending out itself, not after its whole bound
/// (`WARPSOCK_LINGER_MS` 20 s), then waits for the peer's kernel's
/// acknowledgement of its bytes and end of stream; the reader gets every
/// byte, then 0 (or, in DDP mode, `ECONNRESET` after every byte: the
/// acknowledgement is the peer's kernel's, not its library's having read
/// the end, and a credit the reader returns in between meets the closed
/// socket, whose reset ends the stream; every byte is still required).
#[test]
fn an_underscore_exit_from_a_handler_inside_a_lingering_closes_wait_steps_it() {
    run("siginnow", false);
    run_with(
        "siginnow",
        Some(common::preload_so()),
        &[("WARPSOCK_LINGER_MS", "20000")],
    );
}

/// A handler's `_exit(0)` inside a lingering close whose peer stopped
/// reading (`siginstuck`: a 512 KiB tail read only after the writer
/// ended, the close still sending, no progress): the `_exit` waits one
/// bound (`WARPSOCK_LINGER_MS` 5 s) without progress in all, under 1.5
/// bounds, then resets the close still sending: the reader gets every
/// byte and 0, or `ECONNRESET`, never a clean end after a short stream.
/// Fails with the sending's bound followed by the acknowledgement's
/// (review r28-b item 5: 6004 ms with a 3 s bound). 5 s, not 3 s: the
/// 1.5 bounds leave 2.5 s for a loaded 2-core CI host's delays (review
/// r28-e item 6), two bounds still fail.
#[test]
fn an_underscore_exit_inside_a_stuck_lingering_close_waits_one_bound() {
    run("siginstuck", false);
    run_with(
        "siginstuck",
        Some(common::preload_so()),
        &[
            ("WARPSOCK_LINGER_MS", "5000"),
            ("WARPSOCK_ZCOPY_MIN", "67108864"),
        ],
    );
}

/// An ordinary close (no `SO_LINGER`) is counted from the program's
/// close: an exit made by another thread while the close hands itself
/// over (held 1 s by the test-hooks build) waits for it, and the reader
/// gets every byte, then 0 (review r27-c item 2: such a close was in no
/// count until the hand-over's, and the exit ended under it).
#[test]
fn an_exit_during_an_ordinary_closes_hand_over_waits_for_it() {
    run("gap0", false);
    run_with(
        "gap0",
        Some(common::preload_so_with_hooks()),
        &[("WARPSOCK_LINGER_MS", "5000")],
    );
}

/// A lingering close made while the library's progress thread drives the
/// socket (a small send buffer, `SO_SNDBUF` 4096, keeps it at it) waits
/// as any: that pass's reference goes before the program's (the close
/// waits for it), so the program's is the last and its close waits for
/// the bytes; the reader gets every byte, then 0. The test-hooks build
/// makes the close meet such a pass every time
/// (`WARPSOCK_TEST_PASS_HOLD_FD`, set by the program for
/// `DDPLINGER_PASS_HOLD` alone, so the second run passes with a library
/// built with test-hooks too; the pass holds its reference until the
/// close waits for it: events, no time window). Before (task xstall),
/// that pass's reference went last, the close was handed to the
/// background unbegun, the program's `close` returned at once and its
/// `_exit` lost the unsent bytes: a clean end after a short stream (1 run
/// in 10 without the hook).
#[test]
fn a_lingering_close_waits_while_the_progress_thread_drives_the_socket() {
    run("busy", false);
    run("busy", true);
    run_with(
        "busy",
        Some(common::preload_so_with_hooks()),
        &[("DDPLINGER_PASS_HOLD", "1")],
    );
}

/// A writer with `SO_SNDBUF` 4096 (its kernel socket's too) whose one
/// 4 MiB write leaves a 64 KiB tail behind a paused reader (receive
/// buffer 4096) sleeps in that write, in DDP mode as over TCP — the
/// zero-copy write waits until the engine handed its bytes to that small
/// kernel socket — and the reader's reads wake it: the write and the
/// lingering close return, and the reader gets every byte, then 0 (task
/// xstall (a): "sat in `epoll_pwait`" is TCP's behaviour, not a stall).
#[test]
fn a_small_send_buffer_sleeps_in_the_write_until_the_reader_reads_as_tcp() {
    run("small", false);
    run("small", true);
}
