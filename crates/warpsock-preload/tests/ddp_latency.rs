//! The 8-byte latency path of DDP-mode sockets under the preload, counted
//! (no timings): `tests/c/ddp_pingpong.c` runs an 8-byte ping-pong between
//! two processes over one switched connection (200 warm-up round trips,
//! then the count asked for), under the library built with its test
//! hooks, which count heap allocations. Two runs of different lengths:
//! the difference is the cost of the extra round trips, set-up excluded.

mod common;

use std::time::Duration;

use common::{c_program, command_with, finish, preload_so_with_hooks, Run};

fn pingpong(rounds: u64, mode: &str) -> Run {
    pingpong_with(rounds, mode, &[])
}

/// [`pingpong`] with more environment variables for both processes.
fn pingpong_with(rounds: u64, mode: &str, env: &[(&str, &str)]) -> Run {
    let args = [rounds.to_string(), "1".to_owned(), mode.to_owned()];
    let mut c = command_with(
        &c_program("ddp_pingpong"),
        &args,
        Some(preload_so_with_hooks()),
    );
    c.env("WARPSOCK_CRC", "0");
    c.envs(env.iter().copied());
    let r = finish(
        c.spawn().expect("spawn ddp_pingpong"),
        Duration::from_secs(120),
    );
    r.assert_ok(&format!("ddp_pingpong {rounds} {mode}"));
    assert_eq!(r.stat("ddp_switched"), 2, "{}", r.stderr);
    r
}

/// A program that polls before each receive (`poll` then `read`, both
/// processes): its polls allocate nothing once warm. Before, each poll of
/// a DDP socket allocated its descriptor list and its claim (2 per poll,
/// 4 per round trip in the two processes: 4,000 in 1,000 round trips).
/// The bound leaves room for the odd allocation off the data path (the
/// progress thread's rounds at a scheduler pause).
#[test]
fn polls_of_a_ddp_socket_allocate_nothing() {
    let (short, long) = (pingpong(100, "poll"), pingpong(1_100, "poll"));
    let (a, b) = (short.stat("heap_allocs"), long.stat("heap_allocs"));
    assert!(
        b.saturating_sub(a) <= 100,
        "{} heap allocations in 1,000 round trips with a poll before each receive \
         ({a} in the short run, {b} in the long one)",
        b.saturating_sub(a)
    );
}

/// The engine's small writes are raw system calls (`sendto`, not libc's
/// `send`): they never reach the interposed `send` and its guard. In an
/// 8 B ping-pong with blocking calls, what the library's own calls bring
/// to the interposer under the guard (the audit of the test-hooks build,
/// both processes) is then about one call per message — the engine's
/// receive — where each message's write added one more (about 4,000 in
/// 1,000 round trips before, 2,000 now).
#[test]
fn the_engines_small_writes_skip_the_interposer() {
    guarded_calls_at_most("block", 3_000);
}

/// Asserts that in 1,000 round trips of `mode` (a run of 1,100 less one of
/// 100) at most `bound` of the library's own calls reached the interposer.
fn guarded_calls_at_most(mode: &str, bound: u64) {
    let (short, long) = (pingpong(100, mode), pingpong(1_100, mode));
    let (a, b) = (short.stat("reentry_guarded"), long.stat("reentry_guarded"));
    let per = b.saturating_sub(a);
    assert!(
        per <= bound,
        "{per} library calls reached the interposer in 1,000 {mode} round trips \
         ({a} in the short run, {b} in the long one)"
    );
}

/// The engine's non-blocking reads are raw system calls too (`recvfrom`,
/// not libc's `recv`). With busy polling (`MSG_DONTWAIT` receives, both
/// processes) every read the engine makes — each message's, and each empty
/// spin's — went through the interposed `recv` and its guard: at least one
/// a message, 2,000 in 1,000 round trips (13,594 in one run, with the
/// spins). Now none of the library's own calls reaches the interposer; the
/// bound leaves room for the odd call off the data path.
#[test]
fn the_engines_polling_reads_skip_the_interposer() {
    guarded_calls_at_most("busy", 500);
}

/// A `poll` of one DDP socket for input (the `poll` then `read` program)
/// answers from its own round: the reply the round processed shows as
/// `POLLIN` on the program's descriptor (`interpose::wait::alone`), so no
/// poll waits again for the doorbell and the socket rings none per
/// message (a poll that missed its reply waited on until the doorbell rang
/// for it: 1,200 bells a process in 1,000 round trips and the warm-up).
/// The bound leaves room for a bell at the set-up.
#[test]
fn a_poll_of_a_ddp_socket_answers_from_its_own_round() {
    let r = pingpong(1_000, "poll");
    let bells = r.stat("ddp_bells");
    assert!(
        bells <= 20,
        "{bells} doorbells in 1,200 round trips with a poll before each receive: {}",
        r.stderr
    );
    assert!(r.stat("ddp_poll_rounds") >= 2_000, "{}", r.stderr);
}

/// A select loop (`select` for input, then a non-blocking `recv`, both
/// processes): each `select` naming the DDP socket is made as a poll
/// (`interpose::wait::select::polled`), which watches the connection
/// itself and answers from its own round — no doorbell rung per message,
/// no round of the progress thread's. With
/// `WARPSOCK_DDP_SELECT_DIRECT=0` the selects see the socket through its
/// doorbell, as before: the progress thread takes every reply in and
/// rings for it.
#[test]
fn a_select_of_a_ddp_socket_answers_from_its_own_round() {
    let r = pingpong(1_000, "select");
    let (bells, bg) = (r.stat("ddp_bells"), r.stat("ddp_bg_rounds"));
    assert!(
        bells <= 20 && bg <= 100,
        "{bells} doorbells and {bg} progress-thread rounds in 1,200 round trips \
         with a select before each receive: {}",
        r.stderr
    );
    assert!(r.stat("ddp_poll_rounds") >= 2_000, "{}", r.stderr);
    let d = pingpong_with(1_000, "select", &[("WARPSOCK_DDP_SELECT_DIRECT", "0")]);
    assert!(
        d.stat("ddp_bells") >= 1_000 && d.stat("ddp_bg_rounds") >= 1_000,
        "the doorbell path: {}",
        d.stderr
    );
}

/// An epoll loop (`epoll_wait` then a non-blocking `recv`, both
/// processes): the set watches the connection itself
/// (`shim::epollwatch`), and its `epoll_wait` reports each reply from its
/// own round, with no bell rung and no progress thread woken for it
/// (`ddp_epoll_direct`: at least one report per message of 1,200 round
/// trips a process; before, the progress thread rang a bell per message,
/// ~2,400, and the wait collected it), and its round asks the kernel for
/// nothing after a read that came back short (`ddp_rx_looks`:
/// `QpNews::rx_drained`). The bells' bound leaves room for
/// the set-up's. With `WARPSOCK_DDP_EPOLL_DIRECT=0` the bells are back:
/// the counters tell the two ways apart.
#[test]
fn an_epoll_loop_hears_its_replies_from_its_own_set() {
    let r = pingpong(1_000, "epoll");
    let direct = r.stat("ddp_epoll_direct");
    assert!(
        direct >= 2_000,
        "{direct} replies reported by the epoll waits themselves in 1,200 round trips: {}",
        r.stderr
    );
    let bells = r.stat("ddp_bells");
    assert!(
        bells <= 20,
        "{bells} doorbells in 1,200 epoll round trips: {}",
        r.stderr
    );
    // Each round's read came back short: no `FIONREAD` after it
    // (`ddp_rx_looks`; one per reply before, ~2,400).
    let looks = r.stat("ddp_rx_looks");
    assert!(
        looks <= 50,
        "{looks} FIONREADs of the rounds for 2,400 replies: {}",
        r.stderr
    );
    let off = pingpong_with(1_000, "epoll", &[("WARPSOCK_DDP_EPOLL_DIRECT", "0")]);
    assert_eq!(off.stat("ddp_epoll_direct"), 0, "{}", off.stderr);
    assert!(
        off.stat("ddp_bells") >= 2_000,
        "the progress thread's bells, switched off: {}",
        off.stderr
    );
}

/// Redis's event loop (`ae`, both processes): the socket goes into the
/// set for output before each send and for input before each receive,
/// and out of it after each (`EPOLL_CTL_ADD` and `DEL`, 4 a message). The
/// set keeps watching the connection between a `DEL` and the next `ADD`
/// (`epollwatch::Table::uncover`): the progress thread's watch is not
/// armed and disarmed for each (`ddp_watch_changes`: ~4 a message before,
/// ~9,600 in 1,200 round trips; the bound leaves room for the set-up's),
/// and the waits still report the replies themselves.
#[test]
fn an_ae_loop_keeps_its_watch_across_del_and_add() {
    let r = pingpong(1_000, "ae");
    let changes = r.stat("ddp_watch_changes");
    assert!(
        changes <= 100,
        "{changes} changes of the progress thread's watch in 1,200 round trips: {}",
        r.stderr
    );
    let direct = r.stat("ddp_epoll_direct");
    assert!(
        direct >= 2_000,
        "{direct} replies reported by the epoll waits themselves: {}",
        r.stderr
    );
}

/// The benchmark's busy mode: `readv` and `writev` of one iovec on an
/// `O_NONBLOCK` socket (`vbusy`). One iovec takes the one-buffer calls
/// (`recv_one`, `send_one`: no message header built; issue 12); the
/// exchange is the program's check, and its empty spins are the quiet
/// socket's (`ddp_quiet_eagains`: every round trip of 1,200 spins at least
/// once on each side before its answer comes, unless the answer was always
/// there first — the bound: one spin in every other round trip).
#[test]
fn one_iovec_reads_and_writes_spin_on_the_quiet_socket() {
    let r = pingpong(1_000, "vbusy");
    let spins = r.stat("ddp_quiet_eagains");
    assert!(
        spins >= 500,
        "{spins} quiet empty spins in 1,200 round trips of readv/writev: {}",
        r.stderr
    );
}

/// Blocking calls with `WARPSOCK_BUSY_POLL_US` (`block`, both processes):
/// each receive after a send finds the socket quiet and spins on the
/// engine's read first (`XSocket::recv_busy`; `ddp_busy_quiet`: a quarter
/// of the 2,400 receives of 1,200 round trips at least — a receive may
/// find the socket busy after a round of the progress thread's). Without the setting none
/// goes that way (an empty round can leave a blocking reader's socket
/// quiet: nothing spins for it; CI saw such receives counted when the
/// routing looked at the flag alone). The exchange is the program's check. Fails with
/// the preload's blocking receive not routed there, or with a busy-polling
/// blocking reader's sends leaving the flag down (`State::rx_blocks`; 0
/// both ways).
#[test]
fn a_busy_polling_blocking_receive_spins_on_the_quiet_socket() {
    let r = pingpong_with(1_000, "block", &[("WARPSOCK_BUSY_POLL_US", "200")]);
    let spun = r.stat("ddp_busy_quiet");
    assert!(
        spun >= 600,
        "{spun} of 2,400 blocking receives spun on the quiet socket: {}",
        r.stderr
    );
    let plain = pingpong(100, "block");
    assert_eq!(plain.stat("ddp_busy_quiet"), 0, "{}", plain.stderr);
}
