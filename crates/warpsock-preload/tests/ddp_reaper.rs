//! Closes of DDP-mode sockets whose peers never close (`tests/c/ddpreaper.c`):
//! each lingers for the peer's FIN (`XSocket::linger_after_close`), up to
//! `WARPSOCK_LINGER_MS`. A thread per close held one thread per such
//! connection for the whole linger, unbounded; the process's one reaper
//! thread steps them all, and holds at most `WARPSOCK_DDP_CLOSING_MAX`.

mod common;

use std::sync::{Mutex, MutexGuard};

/// One case at a time: each spawns hundreds of DDP-mode sockets in two
/// processes, too many at once for a 2-core CI (review r25-a item 13c).
fn serial() -> MutexGuard<'static, ()> {
    static ONE: Mutex<()> = Mutex::new(());
    ONE.lock().unwrap_or_else(|e| e.into_inner())
}

/// Descriptors one switched connection holds in each process of
/// `ddpreaper` (9 seen: the program's, the engine's socket, doorbells,
/// eventfds...; 11 with `keep`'s copies), with one to spare; and the
/// processes' others, with room.
const FDS_PER_CONN: u64 = 12;
const FDS_OTHER: u64 = 64;

/// `n` connections, or as many as the hard `RLIMIT_NOFILE` leaves room for
/// (`ddpreaper` raises its soft limit to it) if that is fewer, at least
/// `min`; `None` (the case skipped, said on stderr) if not even `min` fit
/// (review r25-a item 13a: a hard limit of 1,024 failed with `EMFILE`).
fn conns(n: usize, min: usize) -> Option<usize> {
    // SAFETY: rlimit is plain data; getrlimit writes the local.
    let hard = unsafe {
        let mut rl: libc::rlimit = std::mem::zeroed();
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl), 0);
        rl.rlim_max
    };
    let fit = if hard == libc::RLIM_INFINITY {
        n
    } else {
        (hard.saturating_sub(FDS_OTHER) / FDS_PER_CONN).saturating_sub(1) as usize
    };
    if fit < min {
        eprintln!(
            "skipped: the hard RLIMIT_NOFILE ({hard}) leaves room for {fit} connections, \
             fewer than the case's {min} (it needs about {} descriptors a connection)",
            FDS_PER_CONN
        );
        return None;
    }
    Some(n.min(fit))
}

/// Runs `ddpreaper <args>` preloaded with the settings of [`run`] (`env`
/// added or overriding).
fn spawn(args: &[String], held: usize, env: &[(&str, &str)]) -> common::Run {
    let child = common::command(&common::c_program("ddpreaper"), args, true)
        .env("WARPSOCK_LINGER_MS", "20000")
        .env("WARPSOCK_DDP_CLOSING_MAX", held.to_string())
        .env("WARPSOCK_DDP_SLOTS", "4")
        .env("WARPSOCK_DDP_SLOT_KB", "4")
        .envs(env.iter().copied())
        .env("WARPSOCK_SWITCH_TIMEOUT_MS", "5000")
        .spawn()
        .expect("spawn ddpreaper");
    let r = common::finish(child, std::time::Duration::from_secs(90));
    println!("{}", r.stdout.trim());
    r.assert_ok(&format!("ddpreaper {}", args.join(" ")));
    r
}

/// Runs `ddpreaper <n> <held> [keep]` preloaded, the linger (20 s) longer
/// than the run, `WARPSOCK_DDP_CLOSING_MAX=held`, small windows (4 slots
/// of 4 KiB: the last connection's bytes wait in its send buffer); `keep`:
/// the program holds a copy of every engine socket.
fn run(n: usize, held: usize, keep: bool) -> common::Run {
    let mut args = vec![n.to_string(), held.to_string()];
    if keep {
        args.push("keep".to_owned());
    }
    let r = spawn(&args, held, &[]);
    assert_eq!(r.stat("ddp_switched"), 2 * (n as u64 + 1), "{}", r.stderr);
    r
}

/// 200 closes whose peers never close (fewer where the descriptor limit
/// says so, [`conns`]), then one whose peer reads: the
/// writer's thread count grows by at most 2 (fails with a thread per
/// close: 200 more), its last close completes — the peer reads every
/// byte and the end of stream — while the 200 still linger (their engine
/// sockets still held, each in the reaper's epoll set: fails with the
/// poll of every held socket at each wake, review r25-a item 14), and
/// none was cut short.
#[test]
fn closes_whose_peers_never_close_take_one_thread() {
    let _one = serial();
    let Some(n) = conns(200, 20) else { return };
    let r = run(n, 256, false);
    assert_eq!(r.stat("ddp_closes_cut"), 0, "{}", r.stderr);
}

/// The same with at most 50 closes held: past 50 the oldest lingering
/// close is cut short (151 of the 201), the last one completes all the
/// same, and 50 at most are held (fails with no bound: 200 held). Fewer
/// connections where the descriptor limit says so ([`conns`]), at least
/// 70: 21 or more cut. The program keeps a copy of each engine socket: a
/// cut close leaves the reaper's epoll set all the same (fails with the
/// removal in `Held`'s drop skipped: the set keeps the cut ones, 200).
#[test]
fn past_the_bound_the_oldest_lingering_close_is_cut() {
    let _one = serial();
    let held = 50;
    let Some(n) = conns(200, held + 20) else {
        return;
    };
    let r = run(n, held, true);
    assert_eq!(
        r.stat("ddp_closes_cut"),
        (n + 1 - held) as u64,
        "{}",
        r.stderr
    );
}

/// A child forked by a process whose reaper runs closes a connection of
/// its own: the peer reads every byte and the end of stream. The parent's
/// reaper thread is not the child's (fails without the child forgetting
/// it: the close waits in a queue no thread takes, the child's exit gives
/// up on the bytes after the linger and resets the connection), and the
/// child does not carry the parent's reaper's epoll set and eventfd
/// (fails without their close in the fork handler: the child's check
/// finds the set, exit 1).
#[test]
fn a_forked_child_closes_with_a_reaper_of_its_own() {
    let _one = serial();
    let r = spawn(&["fork".to_owned()], 256, &[]);
    // Four ends; the writing child's count starts from its parent's one.
    assert_eq!(r.stat("ddp_switched"), 5, "{}", r.stderr);
}

/// The same, the child's bytes held in its engine behind small kernel
/// buffers (no send buffer: they count as sent), its peer reading only
/// once it closed: its exit waits while the close still sends (counted
/// from the hand-over to the end of sending), and the peer reads every
/// byte and the end of stream (fails with the close not counted: the
/// child exits at once, and the peer reads a short stream).
#[test]
fn an_exit_waits_for_a_close_still_sending() {
    let _one = serial();
    let env = [("WARPSOCK_DDP_SNDBUF", "0"), ("WARPSOCK_DDP_SLOT_KB", "16")];
    let r = spawn(&["forkexit".to_owned()], 256, &env);
    assert_eq!(r.stat("ddp_switched"), 5, "{}", r.stderr);
}
