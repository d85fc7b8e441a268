//! Socket options and the busy-polling fast path on DDP-mode sockets
//! (`tests/c/sockopt.c`; issue 12, review r22-c). Each case also runs
//! without the preload (plain TCP), the behaviour it asks for. Also run
//! under ASan by `scripts/test-xsock.sh`.

mod common;

use common::{c_program, finish, run_case};

/// Runs case `name`; `preload`: with the library, whose reports must count
/// both ends switched (`soerr*`: one, the killed peer's report is lost;
/// `emfile`: a pair, then one end whose peer's report is lost).
fn case(name: &str, preload: bool) -> common::Run {
    let r = run_case("sockopt", name, preload);
    if preload {
        let ends = match name {
            _ if name.starts_with("soerr") => 1,
            "emfile" => 3,
            // Four pairs switched, two failed.
            "stampsbefore" => 8,
            "oobinline" => 0,
            _ => 2,
        };
        assert_eq!(r.stat("ddp_switched"), ends, "{}", r.stderr);
    }
    r
}

/// Runs case `name` under the build of the library with the test hooks,
/// with `env` added; the run must succeed.
fn hooks_case(name: &str, env: &[(&str, &str)]) -> common::Run {
    let child = common::command_with(
        &c_program("sockopt"),
        &[name.to_owned()],
        Some(common::preload_so_with_hooks()),
    )
    .env("WARPSOCK_SWITCH_TIMEOUT_MS", "2000")
    .envs(env.iter().copied())
    .spawn()
    .expect("spawn sockopt");
    let r = finish(child, std::time::Duration::from_secs(60));
    r.assert_ok(&format!("sockopt {name} (test hooks)"));
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

/// A reset the program has not met yet: `SO_ERROR` gives `ECONNRESET`
/// once, then 0; `recv` then returns 0 and `send` fails with `EPIPE`, as
/// Linux's TCP (review r22-c item 4). The library's round takes the reset
/// in first: the engine's TCP socket's `SO_ERROR`, read instead, cleared
/// the kernel's error and left the engine a clean end.
#[test]
fn so_error_reports_a_reset_once() {
    case("soerror", false);
    case("soerror", true);
}

/// The same after a poll whose round took the reset in: fails with the
/// library's error reported by every `SO_ERROR` (it stays the connection's
/// state) instead of once.
#[test]
fn so_error_reports_a_reset_the_library_took_in_once() {
    case("soerrpoll", false);
    case("soerrpoll", true);
}

/// A read that reported the reset is TCP's `sk_err` cleared too: the next
/// read returns 0 and `SO_ERROR` 0 (fails with the read's report not
/// counted: `ECONNRESET` again).
#[test]
fn a_read_that_reported_a_reset_clears_it() {
    case("soerrrecv", false);
    case("soerrrecv", true);
}

/// Transmit stamps and error reports (`SO_TIMESTAMPING`, `IP_RECVERR`
/// before the switch; `SO_TIMESTAMPING`, `SO_TIMESTAMPNS` after it) on a
/// DDP-mode socket are kept and read back, never set on the engine's TCP
/// socket, whose error queue stays empty over 2,000 8 B sends (review
/// r22-e item 2); `MSG_ERRQUEUE` gets `EAGAIN` (over TCP: a stamp). Fails
/// with a set after the switch forwarded (the options on under it, 1 stamp
/// in its queue) and with a value set before it left on (the options
/// under it; with the check of them removed, the switch itself is refused:
/// `ECONNREFUSED`).
#[test]
fn stamps_and_error_reports_stay_off_the_engines_socket() {
    case("stamps", false);
    case("stamps", true);
}

/// Stamps of bytes sent before the switch, with `SO_TIMESTAMPING`
/// (`TX_ACK`) on, that reach the kernel socket during the switch — most of
/// them waited unsent behind the peer's closed window until its switch read
/// them — do not fail it and do not stay in the engine's socket's error
/// queue (review r23-a item 2: the drain at the switch's start was the only
/// one; `stamps` sends nothing before it). Fails with the drain of the
/// switch's waits removed (the initiator's wait for the peer's mark takes
/// `POLLERR` for the end of stream: `ECONNREFUSED`, 10 runs of 10; with
/// the drain at the switch's end removed too, as before, the same); the
/// drain at the end alone is rarely seen (1 run of 10: an entry left).
#[test]
fn stamps_that_come_during_the_switch_are_dropped() {
    case("latestamps", false);
    case("latestamps", true);
}

/// A switch short of descriptors is declined before its handshake
/// (session 39): the call fails with `EMFILE`, nothing was sent, and the
/// connection is a working TCP socket — the peer's bytes, sent after its
/// own switch timed out, arrive — at every budget below the one that
/// switches (k = 0, 3, 6, 9, 12 free; 15 switches), counted in
/// `ddp_switch_no_fds`, none in `ddp_broken`. Before, it ran out after it
/// committed and had to reset the connection (review r23-a item 3: never
/// the peer's framing as bytes).
#[test]
fn a_switch_short_of_descriptors_is_declined_before_its_handshake() {
    case("emfile", false);
    let r = case("emfile", true);
    assert!(r.stat("ddp_switch_no_fds") >= 5, "{}", r.stderr);
    assert_eq!(r.stat("ddp_broken"), 0, "{}", r.stderr);
}

/// An initiator whose descriptors run short after its mark (the program
/// took them) looks again before its MPA Request and withdraws: `EMFILE`,
/// the connection a working TCP socket both ways, counted in
/// `ddp_switch_no_fds`, none in `ddp_broken`. Before, it committed with 3
/// numbers free, ran out and reset the connection (the responder's
/// answer had this look since review 40; the initiator's did not).
#[test]
fn an_initiator_short_of_descriptors_withdraws_before_its_request() {
    case("emfilecommit", false);
    let r = case("emfilecommit", true);
    assert_eq!(r.stat("ddp_switch_no_fds"), 1, "{}", r.stderr);
    assert_eq!(r.stat("ddp_broken"), 0, "{}", r.stderr);
}

/// The kept options read back as Linux's TCP answers them (its socket
/// flags: which of the four `SO_TIMESTAMP` names reads 1, and
/// `SO_TIMESTAMPING_NEW`'s flags only when set through it), and refuse
/// what it refuses: a sequence of sets, each followed by every option's
/// read-back, prints the same lines over DDP as over TCP — also reads of
/// lengths 0 and 2 (and `SO_RCVTIMEO`'s 4), which Linux truncates, and
/// `IP_RECVERR`'s byte form (review r23-a item 7). Fails with
/// `SO_TIMESTAMP_NEW` read as the kernel's `SO_TIMESTAMP_OLD` is (also
/// 0 with `SO_TIMESTAMPNS` on), with the short lengths refused (`EINVAL`,
/// as before) and with `IP_RECVERR`'s byte form not given (2 bytes).
#[test]
fn kept_stamp_options_read_back_as_tcps() {
    let tcp = case("stampopts", false);
    let ddp = case("stampopts", true);
    assert_eq!(tcp.stdout, ddp.stdout);
}

/// `SO_ZEROCOPY` on a DDP-mode socket, whose `MSG_ZEROCOPY` sends would
/// never get the notice a program holds each buffer for (review r23-a item
/// 1): refused with `EOPNOTSUPP` after the switch (reads 0; the sends are
/// plain), and a socket with it on before the switch is not switched (the
/// connection stays TCP and gets the notices). Fails with the option kept
/// (the set succeeds) and with the switch made with it on (it succeeds).
#[test]
fn zero_copy_is_refused_on_a_ddp_mode_socket() {
    case("zerocopy", false);
    let r = case("zerocopy", true);
    assert_eq!(r.stat("ddp_refused"), 1, "{}", r.stderr);
}

/// `SO_OOBINLINE` on: urgent bytes stay in the socket's stream, where
/// the switch's marks would reach the program — the switch is refused
/// before anything is sent (`EOPNOTSUPP`), the connection plain TCP both
/// ways (helper 66's review). Fails with the switch tried (the mark sent:
/// the peer's `POLLPRI`, and the switch's wait for its answer).
#[test]
fn a_switch_is_refused_with_urgent_bytes_inline() {
    case("oobinline", false);
    let r = case("oobinline", true);
    assert_eq!(r.stat("ddp_refused"), 1, "{}", r.stderr);
}

/// Stamp options set before the switch (`stampopts` sets them after it)
/// read back after it as Linux's TCP answers them, and after a failed
/// switch as they were (review r23-a item 5). Fails with
/// `SO_TIMESTAMPING_NEW` not seen at the switch (it read 0 after it), with
/// the failed switch's put-back through `SO_TIMESTAMPING` (its
/// `SO_TIMESTAMPING_NEW` read 0), and with the put-back's former order
/// (the `SO_TIMESTAMP_NEW` read back as `SO_TIMESTAMP`).
#[test]
fn stamp_options_set_before_the_switch_read_back_as_tcps() {
    let tcp = case("stampsbefore", false);
    let ddp = case("stampsbefore", true);
    assert_eq!(tcp.stdout, ddp.stdout);
}

/// `SO_TIMESTAMPING` as Linux 5.15 on takes it (`sock_set_timestamping`):
/// an int or a `struct so_timestamping` (flags, `bind_phc`; read back as
/// 8 bytes), refused with `EINVAL` for a bit beyond the running kernel's
/// mask, `OPT_ID_TCP` without `OPT_ID`, `OPT_STATS` without `OPT_TSONLY`,
/// and `OPT_ID` turned on once the connection is reset (`TCP_CLOSE`),
/// `EOPNOTSUPP` for `BIND_PHC` on an unbound socket: the same calls print
/// the same lines over DDP as over TCP. Fails with the former checks (the
/// int alone: every refusal accepted, the struct read back as 4 bytes).
#[test]
fn so_timestamping_takes_the_struct_and_refuses_as_linux() {
    let tcp = case("stampstruct", false);
    let ddp = case("stampstruct", true);
    assert_eq!(tcp.stdout, ddp.stdout);
}

/// `SOF_TIMESTAMPING_OPT_ID`'s key, set before a switch that fails, is
/// the program's after it: the stamps count bytes from the set on, as
/// TCP's (keys 7 then 15). Fails with the options all turned off at the
/// switch (the put-back's set started the key again: 7 then 7).
#[test]
fn a_failed_switch_keeps_the_stamp_key() {
    let tcp = run_case("sockopt", "stampkey", false);
    let ddp = run_case("sockopt", "stampkey", true);
    assert_eq!(tcp.stdout, ddp.stdout);
    assert_eq!(ddp.stat("ddp_switched"), 0, "{}", ddp.stderr);
}

/// The error queue with `IP_RECVERR` and receive-only `SO_TIMESTAMPING`
/// on: `recvmsg(MSG_ERRQUEUE)` answers `EAGAIN` with the peer's bytes
/// waiting, and `poll` shows `POLLIN` alone, as TCP's (which queues no
/// ICMP error on an established connection and made no stamp); the
/// engine's socket's queue is empty. No entry of the program's exists to
/// pass through (the engine's `read_polled` says why). Fails with
/// `MSG_ERRQUEUE` read as a plain read (the 8 bytes: review r22-e item
/// 2's former behaviour).
#[test]
fn the_error_queue_answers_as_tcps_with_recverr_and_receive_stamps_on() {
    let tcp = case("errqueueopts", false);
    let ddp = case("errqueueopts", true);
    assert_eq!(tcp.stdout, ddp.stdout);
}

/// A reset taken by a read: poll then shows `POLLIN|POLLHUP|POLLRDHUP`
/// without `POLLERR`, as Linux's TCP once `sk_err` was taken (review r22-e
/// item 6: an event loop whose `POLLERR` branch only reads `SO_ERROR` would
/// spin if it stayed), and the next read returns 0. Before the read both
/// add `POLLERR` (`tests/ddp_pollerr.rs`). Fails with the hang-up not
/// shown (`Follow::reflect_locked` without `hang_up`).
#[test]
fn poll_after_a_reset_was_read_shows_the_hang_up_without_pollerr() {
    case("soerrhup", false);
    case("soerrhup", true);
}

/// An abortive close (`SO_LINGER` {1, 0}, then `close`) resets the
/// connection at once, as TCP's: the peer's blocking read fails with
/// `ECONNRESET`. Fails with the orderly close made first (the README's
/// former known limit: its end of stream and FIN came before the reset,
/// and the read returned 0).
#[test]
fn an_abortive_close_resets_the_peer() {
    case("abort", false);
    case("abort", true);
}

/// Abortive closes TCP's way in the cases 69772fb's `abort` did not cover
/// (review r23-a item 8): the close of one of two descriptors (`dup`)
/// sends nothing, the last one resets (fails with a reset at the first:
/// the message sent through the second never arrives); `SO_LINGER` {1, 0}
/// set before the switch (fails with the abortive check removed: 0); the
/// peer's bytes left unread (fails with that check removed: 0).
#[test]
fn abortive_closes_of_a_dup_a_value_set_before_and_unread_bytes_as_tcps() {
    for name in ["abortdup", "abortbefore", "abortunread"] {
        case(name, false);
        case(name, true);
    }
}

/// An orderly close with the peer's bytes received and never read resets
/// the connection, as TCP's (`tcp_close`'s `data_was_unread`, RFC 2525
/// §2.17; review r23-a item 9): the peer's blocking read fails with
/// `ECONNRESET`. `closeunread`: stream bytes poll said were there;
/// `closeheld`: in message mode, the start of a message whose end has not
/// come (the part the receive slots hold). Both fail with the reaper's
/// look (`XSocket::unread`) removed: the read returns 0, a clean end.
#[test]
fn an_orderly_close_with_unread_bytes_resets_the_peer() {
    for name in ["closeunread", "closeheld"] {
        case(name, false);
        case(name, true);
    }
}

/// `shutdown(SHUT_WR)`, then an abortive close: the peer, whose stream had
/// ended (TCP's `CLOSE_WAIT`), reads 0 and its send fails with `EPIPE`, as
/// Linux's `tcp_reset` there (review r23-a item 8). Fails with the DDP
/// peer's reset reported as `ECONNRESET` (the send), as before.
#[test]
fn an_abortive_close_after_shutdown_is_epipe_to_the_peer() {
    case("abortshut", false);
    case("abortshut", true);
}

/// A close (abortive, then orderly) while another thread is blocked in a
/// read of the socket acts as that read returns, as Linux's (the call holds
/// the file; review r23-a item 4): the read goes on and returns the 8 B the
/// peer sends after the close, then the peer gets the reset (`ECONNRESET`)
/// or the end of stream. Fails with the close made at once (the blocked
/// read fails with `ECONNRESET`, or returns 0).
#[test]
fn a_close_waits_for_a_blocked_read_of_another_thread() {
    for name in ["abortblocked", "closeblocked"] {
        case(name, false);
        case(name, true);
    }
}

/// An orderly close made while an exec that gave up on the socket's bytes
/// has marked it `SO_LINGER` {1, 0} for the exec's close (the library's
/// mark, review r23-a item 10): when the exec fails, the peer reads every
/// byte, then end of stream. Through a build with the test hooks (the
/// exec waits in that window for the test's closing thread). Fails with
/// the close reading the socket's live `SO_LINGER` (the reset: the peer's
/// read fails with `ECONNRESET`).
#[test]
fn a_close_during_an_exec_that_failed_is_the_programs_orderly_one() {
    case("execarmed", false);
    hooks_case("execarmed", &[("WARPSOCK_LINGER_MS", "1000")]);
}

/// A blocking read after non-blocking ones that found nothing (the socket
/// quiet: their `EAGAIN` without the lock) waits for the peer's bytes,
/// sent only once it is called (review r22-c item 3): fails with the
/// guard of the lock-free `EAGAIN` on non-blocking calls removed
/// (`EAGAIN`). Through a build with the test hooks, the non-blocking reads
/// are seen to take that fast path (`ddp_quiet_eagains`; fails with it
/// removed).
#[test]
fn a_blocking_read_after_empty_spins_blocks() {
    case("blockafter", false);
    case("blockafter", true);
    let r = hooks_case("blockafter", &[]);
    assert!(r.stat("ddp_quiet_eagains") >= 1, "{}", r.stderr);
}
