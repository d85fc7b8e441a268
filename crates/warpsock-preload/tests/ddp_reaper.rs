//! Closes of DDP-mode sockets whose peers never close (`tests/c/ddpreaper.c`):
//! each lingers for the peer's FIN (`XSocket::linger_after_close`), up to
//! `WARPSOCK_LINGER_MS`. A thread per close held one thread per such
//! connection for the whole linger, unbounded; the process's one reaper
//! thread steps them all, and holds at most `WARPSOCK_DDP_CLOSING_MAX`.

mod common;

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

/// Runs `ddpreaper <n> <held>` preloaded, the linger (20 s) longer than
/// the run, `WARPSOCK_DDP_CLOSING_MAX=held`, small windows (4 slots of
/// 4 KiB: the last connection's bytes wait in its send buffer).
fn run(n: usize, held: usize) -> common::Run {
    let r = spawn(&[n.to_string(), held.to_string()], held, &[]);
    assert_eq!(r.stat("ddp_switched"), 2 * (n as u64 + 1), "{}", r.stderr);
    r
}

/// 200 closes whose peers never close, then one whose peer reads: the
/// writer's thread count grows by at most 2 (fails with a thread per
/// close: 200 more), its last close completes — the peer reads every
/// byte and the end of stream — while the 200 still linger (their engine
/// sockets still held), and none was cut short.
#[test]
fn closes_whose_peers_never_close_take_one_thread() {
    let r = run(200, 256);
    assert_eq!(r.stat("ddp_closes_cut"), 0, "{}", r.stderr);
}

/// The same with at most 50 closes held: past 50 the oldest lingering
/// close is cut short (151 of the 201), the last one completes all the
/// same, and 50 at most are held (fails with no bound: 200 held).
#[test]
fn past_the_bound_the_oldest_lingering_close_is_cut() {
    let r = run(200, 50);
    assert_eq!(r.stat("ddp_closes_cut"), 151, "{}", r.stderr);
}

/// A child forked by a process whose reaper runs closes a connection of
/// its own: the peer reads every byte and the end of stream. The parent's
/// reaper thread is not the child's (fails without the child forgetting
/// it: the close waits in a queue no thread takes, the child's exit gives
/// up on the bytes after the linger and resets the connection).
#[test]
fn a_forked_child_closes_with_a_reaper_of_its_own() {
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
    let env = [("WARPSOCK_DDP_SNDBUF", "0"), ("WARPSOCK_DDP_SLOT_KB", "16")];
    let r = spawn(&["forkexit".to_owned()], 256, &env);
    assert_eq!(r.stat("ddp_switched"), 5, "{}", r.stderr);
}
