//! A program that exits without closing its DDP-mode sockets
//! (`tests/c/ddpexitopen.c`): its exit closes them as `close` would —
//! every byte, the end of stream, then the linger for the peer's FIN
//! (`census::ExitCloses`) — so the peer reads the whole stream and then
//! 0, as over TCP, where the kernel sends them after the process.

use std::time::Duration;

mod common;

/// Runs `ddpexitopen <mode>` preloaded (small windows: 32 slots of
/// 4 KiB; `WARPSOCK_LINGER_MS=linger_ms`), or plain TCP.
fn run(mode: &str, preload: bool, linger_ms: u32) -> common::Run {
    let mut args = vec![mode.to_owned()];
    if !preload {
        args.push("plain".to_owned());
    }
    let child = common::command(&common::c_program("ddpexitopen"), &args, preload)
        .env("WARPSOCK_DDP_SLOTS", "32")
        .env("WARPSOCK_DDP_SLOT_KB", "4")
        .env("WARPSOCK_LINGER_MS", linger_ms.to_string())
        .env("WARPSOCK_SWITCH_TIMEOUT_MS", "5000")
        .spawn()
        .expect("spawn ddpexitopen");
    let r = common::finish(child, Duration::from_secs(60));
    println!("{}", r.stdout.trim());
    r.assert_ok(&format!(
        "ddpexitopen {} (preload {preload})",
        args.join(" ")
    ));
    if preload {
        assert_eq!(r.stat("ddp_switched"), 2, "{}", r.stderr);
    }
    r
}

/// The writer exits with the stream's tail still in the kernels; its
/// reader reads it only once the writer's FIN is queued: every byte, then
/// 0, as over TCP (the plain run). Fails with the exit's closes removed
/// (the exit ends the process: the reader's credit returns meet the
/// closed socket, whose reset drops the tail — ECONNRESET).
#[test]
fn an_exit_without_close_sends_every_byte_and_the_end() {
    run("live", false, 10_000);
    run("live", true, 10_000);
}

/// The same, the reader keeping its end open until the writer is gone:
/// the writer's exit waits for that FIN one `WARPSOCK_LINGER_MS` at most
/// (a wait without bound would never end: the run's limit).
#[test]
fn an_exit_waits_for_a_silent_peer_one_bound_at_most() {
    run("silent", false, 500);
    run("silent", true, 500);
}

/// As the first, the writer closing its end before it exits: the close
/// is the library's reaper's, and the exit waits for it to end — its
/// linger for the reader's FIN included. Fails with the exit waiting
/// only while the close sends (ECONNRESET, as above).
#[test]
fn an_exit_waits_for_a_close_lingering_for_the_peers_fin() {
    run("close", false, 10_000);
    run("close", true, 10_000);
}

/// The writer's main thread exits while its second thread writes without
/// end: the exit's close shuts the write side under that thread, whose
/// send must not kill the process with `SIGPIPE` (over TCP it goes on
/// until the process ends): the writer's status is 0, its reader reads
/// the pattern to a clean end. Fails with the thread's send left to fail
/// (`park_if_exiting` removed: the writer dies of SIGPIPE).
#[test]
fn an_exit_under_a_thread_still_writing_ends_with_its_status() {
    run("thread", false, 10_000);
    run("thread", true, 10_000);
}

/// A program that exits with the peer's bytes received and never read:
/// its exit's close resets the connection, as TCP's (`data_was_unread`):
/// the peer's read fails with `ECONNRESET`. Fails with the exit's look
/// (`XSocket::unread`) removed: the read returns 0.
#[test]
fn an_exit_with_unread_bytes_resets_the_peer() {
    run("unread", false, 10_000);
    run("unread", true, 10_000);
}

/// A program that set `SO_LINGER` {1, 0} and exits: its exit's close is
/// abortive, as TCP's: the peer's read after the 8 B sent fails with
/// `ECONNRESET`. Fails with the exit's look at `SO_LINGER` removed (the
/// read returns 0).
#[test]
fn an_exit_with_so_linger_zero_resets_the_peer() {
    run("abort", false, 10_000);
    run("abort", true, 10_000);
}

/// Runs `ddpexitsig <mode>` preloaded (`WARPSOCK_LINGER_MS=300`), or
/// plain TCP; the run must succeed: every writer, whose signal handler
/// calls `exit(7)`, ended with that status within the program's limit
/// (20 s; one that did not was killed).
fn run_sig(mode: &str, preload: bool) -> common::Run {
    run_sig_linger(mode, preload, 300)
}

/// [`run_sig`] with `WARPSOCK_LINGER_MS=linger_ms`.
fn run_sig_linger(mode: &str, preload: bool, linger_ms: u32) -> common::Run {
    run_sig_with(mode, preload.then(common::preload_so), linger_ms)
}

/// [`run_sig_linger`] preloading `so` (none: plain TCP).
fn run_sig_with(mode: &str, so: Option<&std::path::Path>, linger_ms: u32) -> common::Run {
    let preload = so.is_some();
    let mut args = vec![mode.to_owned()];
    if !preload {
        args.push("plain".to_owned());
    }
    let child = common::command_with(&common::c_program("ddpexitsig"), &args, so)
        .env("WARPSOCK_LINGER_MS", linger_ms.to_string())
        .env("WARPSOCK_SWITCH_TIMEOUT_MS", "5000")
        .spawn()
        .expect("spawn ddpexitsig");
    let r = common::finish(child, Duration::from_secs(120));
    println!("{}", r.stdout.trim());
    r.assert_ok(&format!(
        "ddpexitsig {} (preload {preload})",
        args.join(" ")
    ));
    r
}

/// The DDP sockets the run's reports count (none without a report).
fn switched(r: &common::Run) -> u64 {
    r.stats().get("ddp_switched").copied().unwrap_or(0)
}

/// A signal handler's `exit` over a call of its thread that holds the
/// socket's lock (the library's copy into a buffer the program cannot
/// write faults, and the program's SIGSEGV handler exits): the process
/// ends, as over TCP (review r25-c item 3). The exit, entered inside the
/// library, makes no closes of its own and no report (`WARPSOCK_STATS`:
/// none in the run's output — the writer's is the only one it could
/// have). Hangs (the program's limit kills the writer: a failure) with
/// the interrupted exit's path removed: the exit's close takes the
/// socket's lock again.
#[test]
fn an_exit_from_a_handler_over_a_call_holding_the_lock_ends() {
    run_sig("fault", false);
    let r = run_sig("fault", true);
    assert_eq!(switched(&r), 0, "a report: {}", r.stderr);
}

/// A SIGTERM handler's `exit` over a thread spinning in `send` and
/// `recv(MSG_DONTWAIT)` (20 writers): wherever the signal lands, inside a
/// call or not, the process ends with the handler's status. Those that
/// it interrupted outside the library closed their socket (a report
/// each); the others landed inside (the spinning calls never sleep: no
/// report), and at least one must have, or the run exercised nothing:
/// the run is made again, three at most (about half land inside here).
/// With the interrupted exit's path removed, a writer whose signal landed
/// under the socket's lock hangs (the program's limit kills it: a
/// failure).
#[test]
fn an_exit_from_a_sigterm_handler_over_a_spinning_thread_ends() {
    run_sig("spin", false);
    let mut inside = 0;
    for _ in 0..3 {
        let r = run_sig("spin", true);
        inside = 20 - switched(&r);
        println!("{inside} of 20 signals landed inside the library");
        if inside > 0 {
            break;
        }
    }
    assert!(inside > 0, "no signal landed inside the library in 3 runs");
}

/// The same two with the handlers calling `_exit`: the process ends with
/// the handler's status, as over TCP. The interposed `_exit` makes its
/// blocking flush of the send buffers' and engines' bytes only outside
/// the library (the guard not set) or over a call's sleep that holds no
/// lock (`sleep_sendnow` below); over any other stretch of a call its
/// flush only tries each lock and allocates nothing (`faultnow_tail`
/// below). Fails (the writer hangs until the program's limit) with the
/// blocking flush made over such a stretch too: it waits on a lock the
/// interrupted call holds.
#[test]
fn an_underscore_exit_from_a_handler_over_a_call_ends() {
    run_sig("faultnow", false);
    run_sig("faultnow", true);
    run_sig("spinnow", false);
    run_sig("spinnow", true);
}

/// The main thread's `exit` while another thread is stopped for good
/// inside a call that holds the socket's lock (its SIGSEGV handler, over
/// the library's copy into a buffer it cannot write, waits for ever): the
/// exit's close cannot have the lock and leaves the socket to the kernel
/// (`census::retry`); the process ends with the exit's status, as over
/// TCP. Hangs (the program's limit kills the writer: a failure) with the
/// exit's closes taking the socket's lock as before (`unread`).
#[test]
fn an_exit_while_another_thread_holds_the_lock_for_good_ends() {
    run_sig("stopped", false);
    run_sig("stopped", true);
}

/// A socket whose lock a thread holds for good (its SIGSEGV handler, over
/// the library's copy into a buffer it cannot write, waits for ever) stops
/// no other socket's progress: with an event on that socket's connection,
/// another connection's `select` ping-pong (its doorbells rung by the
/// progress thread) goes on (`tests/c/ddpstuck.c`). Fails (the first
/// `select` sees nothing in 10 s) with the progress thread's round waiting
/// for the lock (`XSocket::progress_round` as `progress_if_idle`). `late`:
/// the process's first `select` comes after the fault, and its walk of
/// every socket (`doorbell_wait`) leaves the stuck one to a thread of the
/// library's; fails (the harness's 120 s) with the walk waiting for the
/// lock.
#[test]
fn a_lock_held_for_good_stops_no_other_sockets_progress() {
    for (so, mode) in [
        (None, Some("plain")),
        (Some(common::preload_so()), None),
        (Some(common::preload_so()), Some("late")),
    ] {
        let args: Vec<String> = mode.iter().map(|m| (*m).to_owned()).collect();
        let child = common::command_with(&common::c_program("ddpstuck"), &args, so)
            .spawn()
            .expect("spawn ddpstuck");
        let r = common::finish(child, Duration::from_secs(120));
        println!("{}", r.stdout.trim());
        r.assert_ok(&format!("ddpstuck {mode:?} (preload {})", so.is_some()));
    }
}

/// A thread that waits on a connection while another thread's `exit`
/// closes it (`recv`, `poll`, `epoll_wait`): the peer's FIN (or reset:
/// `wake_reset`) that answers the exit's close does not end that wait
/// (over TCP it comes after the process): the thread's "peer closed"
/// path (`_exit(3)`) never runs, and the process ends with the exit's
/// status (review r25-c item 4). Each wait fails with its part removed:
/// the receive's park at 0 (`wake_recv`) or at an error (`wake_reset`),
/// the poll's at a hang-up (`wake_poll`), the doorbell's silence
/// (`wake_epoll`); a send out of credits whose connection's peer resets
/// during the exit (`wake_send`) fails with `ECONNRESET` with the send's
/// park kept to `EPIPE` (review r26-a item 4).
#[test]
fn an_exit_s_close_answered_by_the_peer_wakes_no_other_thread() {
    for mode in [
        "wake_recv",
        "wake_reset",
        "wake_poll",
        "wake_epoll",
        "wake_send",
    ] {
        run_sig(mode, false);
        run_sig(mode, true);
    }
}

/// A SIGTERM handler's `exit` over the main thread's sleep in a blocking
/// `recv` (`sleep_recv`: a tail written on another connection just
/// before) or `send` (`sleep_send`: out of credits), a sleep that holds
/// no lock: the exit closes the sockets as from outside the library
/// (review r26-a item 1), so the tail's peer reads every byte the sends
/// returned for, in order, then a clean end, and the slept-on
/// connection's peer reads its end; the exit sees that peer's FIN
/// (`WARPSOCK_LINGER_MS` longer than the program's limit: a wait for it
/// to run out is a hang). Fails with every exit inside the library taken
/// as over a locked stretch (ECONNRESET or a short read), and hangs with
/// the sleep's parked read not given back (`abandon_wait`).
#[test]
fn an_exit_from_a_handler_over_a_lock_free_sleep_closes_every_socket() {
    for mode in ["sleep_recv", "sleep_send"] {
        run_sig_linger(mode, false, 30_000);
        run_sig_linger(mode, true, 30_000);
    }
}

/// The same over the main thread's sleep in `poll` (`sleep_poll`): the
/// exit over it leaves that wait's marks on the socket (its poll count,
/// its watch; review r26-d item 4) and still closes every socket as from
/// outside, the tail read whole and both ends clean. And after a
/// `siglongjmp` out of that poll (`jump_poll`: the call never returns,
/// its guard and its sleep's mark stay set), a SIGTERM handler's `exit`
/// over the program's own `pause()` holds no lock: the same orderly
/// closes (review r26-d item 3). Both fail (`ECONNRESET` after the tail)
/// with every exit inside the library, or after a jump out of it, taken
/// as over a locked stretch.
#[test]
fn an_exit_over_a_poll_or_after_a_jump_out_of_it_closes_every_socket() {
    for mode in ["sleep_poll", "jump_poll"] {
        run_sig_linger(mode, false, 30_000);
        run_sig_linger(mode, true, 30_000);
    }
}

/// A SIGTERM handler's `exit` over the main thread's `poll` while a stdio
/// stream (`fdopen` of a DDP socket) holds the whole tail in its buffer
/// (`sleep_stdio`): the exit flushes the stream before the sockets
/// close, and the peer reads the whole tail, then 0, as over TCP (review
/// r27-b item 1). Fails (the peer reads 0 bytes, then 0) with the stdio
/// exit flush skipping every stream inside the library.
#[test]
fn an_exit_over_a_poll_flushes_the_librarys_stdio_streams() {
    run_sig_linger("sleep_stdio", false, 30_000);
    run_sig_linger("sleep_stdio", true, 30_000);
}

/// A SIGTERM handler's `exit` over a stdio stream's `fflush` asleep in
/// the library's send out of credits (`sleep_stdio_send`, DDP mode only):
/// the exit's stdio flush leaves alone the stream whose write callback
/// the thread is inside (its lock is the thread's, and a second flush of
/// its buffer would send the prefix again); the peer reads a prefix of
/// the stream in order, then its end (review r27-b item 1). Fails
/// (bytes out of order) with that stream flushed.
#[test]
fn an_exit_inside_a_streams_write_does_not_flush_it_again() {
    run_sig_linger("sleep_stdio_send", true, 30_000);
}

/// A SIGSEGV handler's `_exit` over a receive's copy that faulted under
/// the socket's lock (`faultnow_tail`), a stretch that may hold a lock as
/// the first 10 ms slice of every blocking receive is, with a tail
/// buffered on a second connection: `_exit` waits for those bytes with
/// every lock only tried, and the peer reads, in order, at least every
/// byte the sends returned for (review r27-b item 2). Fails with no
/// flush over such a stretch (the peer reads the credits' worth only).
#[test]
fn an_underscore_exit_over_a_locked_stretch_flushes_the_send_buffers() {
    run_sig_linger("faultnow_tail", false, 30_000);
    run_sig_linger("faultnow_tail", true, 30_000);
}

/// The same `_exit` over a locked stretch with a close the program made
/// before (`faultnow_close`: the second connection closed after its tail,
/// small kernel buffers at both ends, so its engine still holds most of
/// the tail): the `_exit` waits for that close — its sending, then its
/// peer's kernel's acknowledgement — as from outside, and the peer reads
/// every byte the sends returned for, in order, then 0 (or, in DDP mode,
/// `ECONNRESET`). Fails with that `_exit` waiting for the send buffers
/// and the live sockets' engines alone (review r28-c item 9: the close's
/// bytes lost).
#[test]
fn an_underscore_exit_over_a_locked_stretch_waits_for_the_closes_made_before() {
    run_sig_linger("faultnow_close", false, 30_000);
    run_sig_linger("faultnow_close", true, 30_000);
}

/// A SIGTERM handler's `_exit` over the main thread's send asleep out of
/// credits (`sleep_sendnow`), a sleep that holds no lock: `_exit`'s flush
/// runs (before, none inside the library), the send's wait given back
/// first, so it reads the peer's credits and ends with the send buffer's
/// bytes gone (the test build's line), within the run's limit although
/// `WARPSOCK_LINGER_MS` is longer (review r26-d item 5); the peer reads,
/// in order, at least every byte the sends returned for, then 0 (or, in
/// DDP mode, `ECONNRESET`: the kernel's answer to credits that meet the
/// closed socket; review r27-b item 3). Fails with no flush inside the
/// library (no line), hangs with the wait not given back (the flush's
/// bound runs out past the limit), and fails with a flush that gives up
/// at once (the peer reads a short stream).
#[test]
fn an_underscore_exit_over_a_lock_free_sleep_flushes_the_send_buffers() {
    run_sig_linger("sleep_sendnow", false, 30_000);
    let r = run_sig_with(
        "sleep_sendnow",
        Some(common::preload_so_with_hooks()),
        30_000,
    );
    assert!(
        r.stderr.contains("warpsock test: exit flush idle"),
        "{}",
        r.stderr
    );
}

/// `write; close; _exit(0)` (`tests/c/ddpclosenow.c`): the close, an
/// ordinary one, goes to the reaper, and `_exit` waits for it — its
/// bytes and end of stream handed to the kernel, then acknowledged by
/// the peer's kernel — so the reader, reading steadily, gets every byte,
/// then 0, as over TCP (the plain run), whose kernel sends them after the
/// process; in DDP mode 0 or `ECONNRESET` after every byte (a credit the
/// reader returns before its library reads the end meets the closed
/// socket, whose reset ends the stream; every byte is still required;
/// review r28-c item 10). Fails with `_exit` waiting for the send buffers alone, as before
/// (issue 12: 2097152 of 4194304 bytes, then `ECONNRESET`).
#[test]
fn write_close_underscore_exit_sends_every_byte() {
    for preload in [false, true] {
        let args: Vec<String> = if preload {
            Vec::new()
        } else {
            vec!["plain".to_owned()]
        };
        let child = common::command(&common::c_program("ddpclosenow"), &args, preload)
            .env("WARPSOCK_DDP_SLOTS", "32")
            .env("WARPSOCK_DDP_SLOT_KB", "4")
            .env("WARPSOCK_LINGER_MS", "2000")
            .env("WARPSOCK_SWITCH_TIMEOUT_MS", "5000")
            .spawn()
            .expect("spawn ddpclosenow");
        let r = common::finish(child, Duration::from_secs(60));
        println!("{}", r.stdout.trim());
        r.assert_ok(&format!("ddpclosenow (preload {preload})"));
        if preload {
            // The reader's count (the writer `_exit`s: no counters).
            assert!(r.stat("ddp_switched") >= 1, "{}", r.stderr);
        }
    }
}

/// A signal while `_exit` waits for a close's bytes (`tests/c/ddpexitmask.c`:
/// a reader that reads nothing, the writer asleep in its `_exit`'s wait)
/// runs no handler there: the handler's `exit(3)` would run the exit
/// handlers the program skipped and change its status (review r28-c item
/// 5); the writer ends with `_exit`'s 0, as over TCP (the plain run).
/// Fails with the flush's signals not blocked (status 3).
#[test]
fn a_signal_during_an_underscore_exits_wait_runs_no_handler() {
    for preload in [false, true] {
        let args: Vec<String> = if preload {
            Vec::new()
        } else {
            vec!["plain".to_owned()]
        };
        let child = common::command(&common::c_program("ddpexitmask"), &args, preload)
            .env("WARPSOCK_DDP_SLOTS", "32")
            .env("WARPSOCK_DDP_SLOT_KB", "4")
            .env("WARPSOCK_LINGER_MS", "2000")
            .env("WARPSOCK_SWITCH_TIMEOUT_MS", "5000")
            .spawn()
            .expect("spawn ddpexitmask");
        let r = common::finish(child, Duration::from_secs(60));
        println!("{}", r.stdout.trim());
        r.assert_ok(&format!("ddpexitmask (preload {preload})"));
    }
}

/// Runs `ddplateread <mode>` preloaded (32 slots of 4 KiB), or plain TCP.
fn run_late(mode: &str, preload: bool) -> common::Run {
    let mut args = vec![mode.to_owned()];
    if !preload {
        args.push("plain".to_owned());
    }
    let child = common::command(&common::c_program("ddplateread"), &args, preload)
        .env("WARPSOCK_DDP_SLOTS", "32")
        .env("WARPSOCK_DDP_SLOT_KB", "4")
        .env("WARPSOCK_SWITCH_TIMEOUT_MS", "5000")
        .spawn()
        .expect("spawn ddplateread");
    let r = common::finish(child, Duration::from_secs(60));
    println!("{}", r.stdout.trim());
    r.assert_ok(&format!(
        "ddplateread {} (preload {preload})",
        args.join(" ")
    ));
    r
}

/// A writer writes 96 KiB and is gone — it closes and `_exit`s, or is
/// killed (no close: no end-of-stream message, only its kernel's FIN) —
/// before its reader reads: the reader, once the writer is reaped, reads
/// every byte, then 0, as over TCP (the plain runs). The killed writer's
/// case fails without the reader's look at the carrier's FIN before a
/// CREDIT (xsock `Stream::set_peer_fin`): its CREDITs met the dead
/// writer's closed socket, whose reset ended the reads with ECONNRESET
/// (14 runs of 30, after every byte: its engine had read them all).
#[test]
fn a_reader_that_reads_after_its_writer_is_gone_gets_every_byte() {
    for mode in ["exit", "kill"] {
        run_late(mode, false);
        run_late(mode, true);
    }
}
