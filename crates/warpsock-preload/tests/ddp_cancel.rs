//! `pthread_cancel` of a thread blocked in a call of a DDP-mode socket
//! (`tests/c/cancel.c`: the calls blocked on a switched pair;
//! `tests/c/cancelswitch.c`: in a switch, a residue socket's wait, a
//! connect's wait; `tests/c/cancelexit.c`: exit, `_exit`, exec; issue 12):
//! the thread ends with
//! `PTHREAD_CANCELED`, as over TCP, and the socket goes on working from
//! another thread with nothing lost. Before, the process aborted ("FATAL:
//! exception not rethrown": glibc's forced unwind started in a
//! cancellation point inside the library's wait). Each case also runs over
//! plain TCP without the preload, the behaviour matched. Also run under
//! ASan by `scripts/test-xsock.sh`.

mod common;

use common::run_case;

/// Case `name` of `tests/c/cancel.c`, plain then preloaded.
fn case(name: &str) {
    case_with("cancel", name, |_| {});
}

/// Case `name` of `tests/c/<prog>.c`, plain then preloaded, with `check`
/// of the preloaded run.
fn case_with(prog: &str, name: &str, check: impl Fn(&common::Run)) {
    for preload in [false, true] {
        let r = run_case(prog, name, preload);
        if preload {
            assert_eq!(r.stat("ddp_switched"), 2, "{}", r.stderr);
            check(&r);
        }
    }
}

/// Fails with the library's waits in libc's cancellation points (abort),
/// or with the cancel not acted on at the entry point (the read returns).
#[test]
fn a_blocked_read_is_cancelled() {
    case("read");
}

#[test]
fn a_blocked_waitall_recv_is_cancelled() {
    case("waitall");
}

/// The accepted end's read (the other side of the switch).
#[test]
fn a_blocked_read_of_the_accepted_end_is_cancelled() {
    case("accepted");
}

/// A write blocked on credits and send-buffer room (the peer not
/// reading): the peer reads the stream in order after, up to a marker.
#[test]
fn a_blocked_send_is_cancelled() {
    case("send");
}

/// A `poll` of a socket with a mapping (the poll stands in for the
/// progress thread): cancelled (its raw sleep is ended by the signal the
/// interposed `pthread_cancel` sends; fails, hanging, without it), and
/// its stand-in ended by the poll itself: the peer's `rioread` is
/// answered with no call of the socket running, and no stand-in was left
/// to lapse (review r22-e item 3, r23-c item 6: since the lease the
/// `rioread` is answered anyway, a second later; fails with the poll's
/// `wait_end` skipped on a failed wait).
#[test]
fn a_blocked_poll_is_cancelled_and_its_stand_in_ends() {
    case_with("cancel", "poll", |r| {
        assert_eq!(r.stat("ddp_stand_lapses"), 0, "{}", r.stderr);
    });
}

/// Not a cancel: a `siglongjmp` out of a handler that interrupted that
/// standing `poll` (it never returns to the library, its stand-in stays
/// counted): the stand-in lapses after its lease and the peer's `rioread`
/// is answered all the same (review r22-e item 3; hung for good before,
/// and hangs with the progress thread given no timer for the lapse).
#[test]
fn a_standing_poll_left_by_siglongjmp_lapses() {
    case_with("cancel", "jump", |r| {
        assert!(r.stat("ddp_stand_lapses") >= 1, "{}", r.stderr);
    });
}

/// A thread whose cancellation is disabled: the signal the preload's
/// `pthread_cancel` sends does not end its read with `EINTR` although the
/// program has a handler without `SA_RESTART` (fails so when the wait
/// takes it for any signal); once it enables cancellation, its next read
/// is cancelled.
#[test]
fn a_read_with_cancellation_disabled_goes_on_then_is_cancelled() {
    case("disabled");
}

/// `select` and `epoll_wait` of the socket (its doorbell, passed on to
/// libc's, a cancellation point itself): the unwind crosses the
/// interposed entry point.
#[test]
fn a_blocked_select_or_epoll_wait_is_cancelled() {
    case("select");
    case("epoll");
}

/// A cancel requested while the thread's cancellation was disabled and it
/// was in no call: once enabled, its `poll` of the socket is cancelled at
/// once (its raw sleep would never end: hangs without the look at the
/// `poll`'s start).
#[test]
fn a_poll_after_a_pending_cancel_is_cancelled() {
    case("pending");
}

/// A thread blocked in `accept` of a plain listener (passed on to glibc's,
/// a cancellation point): its unwind crosses the interposed entry point
/// (review r23-c item 1: an `extern "C"` one is undefined behaviour).
#[test]
fn a_blocked_accept_is_cancelled() {
    case("accept");
}

/// A `close` of the DDP-mode socket by a thread with a cancel pending: it
/// is cancelled before anything changes, and the socket stays open and
/// working (review r23-c item 1; fails, the socket closed, when the cancel
/// is acted on only in glibc's close, after the table's entry was taken).
#[test]
fn a_close_with_a_cancel_pending_is_cancelled_first() {
    case("close");
}

/// A writer whose 1 B writes never wait (the peer reads everything) is
/// cancelled at a write's start; a self-cancel is acted on at the next
/// read's start, with data there (it stays for the next reader) or not
/// (review r23-c item 2: both returned, or hung).
#[test]
fn a_flowing_writer_and_a_self_cancel_are_cancelled() {
    case("stream");
    case("self");
}

/// A thread cancelled while its `setsockopt(WARPSOCK_DDP_MODE)` waits for
/// a peer that switches late, either end (both roles of the handshake):
/// the switch goes on to the end, `setsockopt` returns 0 and the thread
/// is cancelled at its next cancellation point (a read). Aborted ("FATAL:
/// exception not rethrown") with a libc cancellation point in the switch:
/// the responder's pause between looks at the MPA Request
/// (`std::thread::sleep`), the MPA exchange's reads and writes (std's
/// `TcpStream`: libc's `recv`/`send`).
#[test]
fn a_thread_cancelled_in_a_switch_that_completes_late_is_cancelled_after() {
    case_with("cancelswitch", "switch", |_| {});
    case_with("cancelswitch", "switchpeer", |_| {});
}

/// A blocking `recvfrom` of an offloaded UDP socket (the UDP kind, on
/// with `WARPSOCK_UDP_OFFLOAD=1` in every preloaded run): cancelled as
/// over kernel UDP, and the socket receives after. Aborted with its wait
/// in libc's `poll` (glibc's handler unwound from it through the library).
#[test]
fn a_blocked_recvfrom_of_an_offloaded_udp_socket_is_cancelled() {
    case_with("cancel", "udprecv", |r| {
        assert!(r.stat("sockets_offloaded") >= 1, "{}", r.stderr);
    });
}

/// A socket's last close made in `dup2` (no cancellation point) by a
/// thread with a cancel pending and enabled, orderly and abortive
/// (`SO_LINGER` 0): `dup2` returns, the thread is cancelled at its next
/// cancellation point, and the peer reads the end of the stream (or the
/// reset). The close closed its descriptors with libc's `close` (the
/// thread unwound from inside the library: the run hung, the engine's
/// socket never closed) and the reset's disconnect was libc's `connect`
/// (aborted, "FATAL: exception not rethrown").
#[test]
fn a_last_close_in_dup2_with_a_cancel_pending_completes() {
    case("dup2");
    case("dup2abort");
}

/// `exit` by a thread with a cancel pending and enabled while a DDP-mode
/// socket holds bytes its peer never reads: the process ends with the
/// thread's status after the exit's wait for those bytes. Aborted with the
/// exit handler's wait in libc's `nanosleep` (and its counters' report in
/// libc's `write`), both cancellation points. The same for `_exit` (the
/// library's flush before it) and `execv` of `/bin/true` (its wait before
/// the exec): the process ends with status 0 (no counters are printed
/// there).
#[test]
fn exit_exit_now_or_exec_with_a_cancel_pending_ends_the_process() {
    case_with("cancelexit", "exit", |_| {});
    for name in ["exitnow", "exec"] {
        for preload in [false, true] {
            run_case("cancelexit", name, preload);
        }
    }
}

/// `sendfile` to the DDP-mode socket from an empty pipe (the preload's
/// send path reads it; Linux's own sendfile refuses a pipe: the plain run
/// checks `EINVAL`): cancelled in its wait for the pipe, and the pipe's
/// bytes go out after. Aborted with the read in libc's `read` inside the
/// library; hangs with the raw read and no wait before it.
#[test]
fn a_sendfile_waiting_for_its_pipe_is_cancelled() {
    case("sendfile");
}

/// A read of a socket whose switch failed for want of the MPA Request
/// after the peer's mark (a peer that sent the mark by hand): the socket
/// watches the bytes behind the mark for a late Request
/// (`xsock::residue`), the read waits there and is cancelled; the peer's
/// bytes are read as data after. Aborted with that wait in libc's `poll`.
#[test]
fn a_read_watching_for_a_late_request_is_cancelled() {
    for preload in [false, true] {
        let r = run_case("cancelswitch", "watch", preload);
        if preload {
            assert_eq!(r.stat("ddp_refused"), 1, "{}", r.stderr);
            assert_eq!(r.stat("ddp_switched"), 0, "{}", r.stderr);
        }
    }
}

/// Not a cancel: the watch case's socket (its switch failed; a residue
/// socket, `xsock::residue`), blocking: `recvmsg(MSG_ERRQUEUE)`,
/// `recv(MSG_OOB)`, `recv(MSG_DONTWAIT)` and `MSG_DONTWAIT` sends into a
/// full buffer return at once with TCP's results; a zero-length `recv`
/// blocks as TCP's; a blocking 1 MiB send returns 1 MiB and an 8 B
/// `MSG_WAITALL` recv 8 across two writes (review r25-a item 2: the wait
/// made before each call of a blocking socket blocked the first four; the
/// last two, with each call `MSG_DONTWAIT`, fail without the rest's loop).
#[test]
fn a_residue_sockets_calls_keep_tcps_flags() {
    for preload in [false, true] {
        let r = run_case("cancelswitch", "watchflags", preload);
        if preload {
            assert_eq!(r.stat("ddp_refused"), 1, "{}", r.stderr);
            assert_eq!(r.stat("ddp_switched"), 0, "{}", r.stderr);
        }
    }
}

/// Not a cancel: the watch case's socket, the peer's bytes behind its mark
/// a prefix of an MPA Request and no more: a blocking read with
/// `SO_RCVTIMEO` 1 s times out (`EAGAIN`), its thread's CPU time under
/// a quarter of the wait and its sleeps (voluntary context switches)
/// under 60; after the peer's end the prefix is read as data, then the
/// end (review r25-a item 9: the peeked prefix kept the wait returning at
/// once, the read spun a CPU and never timed out; hangs — the case's 20 s
/// bound fails it — without the pauses, and after the end without its
/// check; review r26-b item 9: pauses capped at 5 ms slept about 200
/// times a second).
#[test]
fn a_read_watching_a_partial_late_request_times_out_without_spinning() {
    for preload in [false, true] {
        let r = run_case("cancelswitch", "watchpartial", preload);
        if preload {
            assert_eq!(r.stat("ddp_refused"), 1, "{}", r.stderr);
            assert_eq!(r.stat("ddp_switched"), 0, "{}", r.stderr);
        }
    }
}

/// Not a cancel: the watch case's socket, the peer's bytes behind its mark
/// a prefix of an MPA Request and no more, a thread's blocking read
/// waiting on them: another thread's `recv(MSG_DONTWAIT)`, then a `recv`
/// of the descriptor made `O_NONBLOCK`, each returns `EAGAIN` while the
/// read still waits; the read is then cancelled, and after the peer's end
/// the prefix is read as data (review r26-b item 7: the non-blocking
/// calls blocked on the socket's lock, held through the watch's waits;
/// fails so — the case's 10 s bound — with the lock kept over the waits).
#[test]
fn a_non_blocking_read_beside_a_watching_one_returns_at_once() {
    for preload in [false, true] {
        let r = run_case("cancelswitch", "watchnb", preload);
        if preload {
            assert_eq!(r.stat("ddp_refused"), 1, "{}", r.stderr);
            assert_eq!(r.stat("ddp_switched"), 0, "{}", r.stderr);
        }
    }
}

/// Not a cancel: the watch case's socket, whose peer then sends a whole
/// warpsock MPA Request: the responder's read fails with `ECONNRESET`,
/// its next read returns 0 (the Request is never data) and a send
/// `EPIPE`, and the peer's read fails with `ECONNRESET`, as after an
/// abortive close (the plain run's). Before, the watch's `SO_LINGER`
/// {1, 0} and `shutdown` sent a FIN: the peer read 0, and the Request's
/// bytes stayed queued for the responder's next read.
#[test]
fn a_late_request_resets_the_connection() {
    for preload in [false, true] {
        let r = run_case("cancelswitch", "watchreq", preload);
        if preload {
            assert_eq!(r.stat("ddp_refused"), 1, "{}", r.stderr);
            assert_eq!(r.stat("ddp_switched"), 0, "{}", r.stderr);
        }
    }
}

/// Not a cancel: a non-blocking connect of a socket asked for DDP mode
/// (the preload waits in the call for the connection,
/// `WARPSOCK_CONNECT_TIMEOUT_MS` 1 s here) whose SYN a full accept queue
/// drops, by a thread with cancellation disabled, cancelled every 50 ms
/// meanwhile (each the preload's signal, ignored by the wait): it returns
/// `EINPROGRESS` after about 1 s (review r25-a item 10: each signal
/// restarted the full timeout, and it never returned while they came; the
/// case's 15 s of signals fail it).
#[test]
fn a_connect_wait_keeps_one_deadline_across_ignored_signals() {
    for preload in [false, true] {
        let mut args = vec!["connectwait".to_owned()];
        if !preload {
            args.push("plain".to_owned());
        }
        let child = common::command(&common::c_program("cancelswitch"), &args, preload)
            .env("WARPSOCK_CONNECT_TIMEOUT_MS", "1000")
            .spawn()
            .expect("spawn cancelswitch");
        let r = common::finish(child, std::time::Duration::from_secs(60));
        r.assert_ok(&format!("cancelswitch connectwait (preload {preload})"));
    }
}

/// A thread cancelled in a switch that then fails (the initiator's, its
/// peer marking by hand and never answering the MPA Request): the
/// `setsockopt` fails and the thread is cancelled at its next
/// cancellation point. Aborted ("FATAL: exception not rethrown") with the
/// failure's drops in the thread (std's `TcpStream`, the engine's
/// descriptors: libc's `close`, a cancellation point; review r25-a item 3).
#[test]
fn a_thread_cancelled_in_a_switch_that_fails_is_cancelled_after() {
    for preload in [false, true] {
        let r = run_case("cancelswitch", "switchfail", preload);
        if preload {
            assert_eq!(r.stat("ddp_switched"), 0, "{}", r.stderr);
        }
    }
}

/// `sendfile` to a DDP-mode socket with `count` 0 (from an empty pipe, from
/// a file) returns 0, and with an offset from an empty pipe fails with
/// `ESPIPE`, each at once, as Linux's (which refuses a pipe: `EINVAL`, the
/// plain run). Review r25-a item 8: the pipe's cases waited for it to
/// become readable.
#[test]
fn a_sendfile_of_nothing_or_at_an_offset_of_a_pipe_returns_at_once() {
    case("sendfilezero");
}
