//! A client that pipelines small requests before it reads any answer,
//! against a one-thread blocking server, both through the preload in DDP
//! mode (issue 12): `tests/c/ddppipeline.c`. It deadlocked once each
//! side's 8 B messages filled the other's receive slots; the send buffer
//! past the credits (`warpsock_xsock::io::Options::sndbuf`) lets it
//! finish as over TCP.

mod common;

/// Runs `tests/c/<name>.c` preloaded with the default send buffer
/// (`WARPSOCK_DDP_SNDBUF` unset: 1 MiB; the test fails if the default
/// turns it off) and `WARPSOCK_LINGER_MS=linger_ms`.
fn run_buffered(name: &str, args: &[String], linger_ms: u32) -> common::Run {
    let child = common::command(&common::c_program(name), args, true)
        .env_remove("WARPSOCK_DDP_SNDBUF")
        .env("WARPSOCK_LINGER_MS", linger_ms.to_string())
        .spawn()
        .expect("spawn the test program");
    common::finish(child, std::time::Duration::from_secs(60))
}

#[test]
fn a_pipelining_client_gets_every_answer_through_the_preload() {
    let r = run_buffered("ddppipeline", &["2000".to_owned()], 2000);
    r.assert_ok("ddppipeline 2000");
    assert_eq!(r.stat("ddp_switched"), 2, "{}", r.stderr);
    // The requests past the server's slots went through the send buffer
    // (`ddp_tx_buffered`, the bytes posted from it), which is what lets
    // the client finish.
    assert!(r.stat("ddp_tx_buffered") > 0, "{}", r.stderr);
}

/// A writer that leaves with bytes buffered (`tests/c/ddpexitlost.c`):
/// `live`, it exits without close while its reader reads (the exit waits
/// for the bytes, bounded by `WARPSOCK_LINGER_MS`); `exit` and `close`
/// then `_exit`, its reader reads only after it is gone (a short linger
/// keeps it quick). The reader gets every byte, or the bytes sent and then
/// `ECONNRESET` — never a clean end after a short stream (review r20-xbuf
/// S2; before the exit's wait, `live` got 120 of its 491,520 bytes, then
/// 0).
#[test]
fn a_writer_that_leaves_bytes_behind_resets_the_connection() {
    for (mode, linger_ms) in [("live", 2000), ("exit", 200), ("close", 200)] {
        let r = run_buffered("ddpexitlost", &[mode.to_owned()], linger_ms);
        r.assert_ok(&format!("ddpexitlost {mode}"));
        println!("{}", r.stdout.trim());
    }
}

/// A writer that execs with bytes buffered (`tests/c/ddpexitlost.c`): the
/// exec's wait gives up (its reader reads only after it is gone), and the
/// exec's close of the connection resets it (`SO_LINGER` 0 set on the
/// connections given up on): its reader gets `ECONNRESET`, not a clean end
/// after a short stream (the exit's reset was never made at exec). An exec
/// that fails after the same wait leaves the connection working and its
/// `SO_LINGER` as the program set it: the reader gets every byte, then a
/// clean end — an inheritable socket too, which the exec's demotion had
/// put on a dead socket for good, its connection leaked open.
#[test]
fn a_writer_that_execs_with_bytes_behind_resets_only_if_the_exec_is_made() {
    for mode in ["exec", "execfail", "execfailinherit"] {
        let r = run_buffered("ddpexitlost", &[mode.to_owned()], 200);
        r.assert_ok(&format!("ddpexitlost {mode}"));
        println!("{}", r.stdout.trim());
    }
}

/// A writer that leaves with bytes in its engine's backlog, behind a full
/// kernel send buffer (`tests/c/ddpexitbacklog.c`, no send buffer:
/// `WARPSOCK_DDP_SNDBUF=0`, and no zero-copy sends, which wait for the
/// kernel to take their bytes: `WARPSOCK_ZCOPY_MIN` 1 GiB): `live`, its reader starts reading as it
/// exits (the exit waits while the backlog leaves: every byte arrives);
/// `exit`, its reader reads only after it is gone (the wait gives up and
/// resets: `ECONNRESET` after what the kernel held). Never a clean end
/// after a short stream (review r21-b #4: the exit did not wait for the
/// backlog, and the kernel sent FIN after its own bytes). `exec`: as
/// `exit`, the writer execs instead: the exec's close resets the
/// connection it gave up on (`SO_LINGER` 0 set before the exec; the exec
/// ended it cleanly, after 0 bytes here); `execveat` and `fexecve` too
/// (glibc's do not go through `execve`: they were not interposed, review
/// r22-a item 5); `execl`, `execle` and `execlp` too (variadic, interposed
/// by naked entries: `interpose/execl.rs`).
#[test]
fn a_writer_that_exits_with_an_engine_backlog_loses_nothing_silently() {
    for (mode, linger_ms) in [
        ("live", 2000),
        ("exit", 200),
        ("exec", 200),
        ("execveat", 200),
        ("fexecve", 200),
        ("execl", 200),
        ("execle", 200),
        ("execlp", 200),
    ] {
        let child = common::command(
            &common::c_program("ddpexitbacklog"),
            &[mode.to_owned()],
            true,
        )
        .env("WARPSOCK_DDP_SNDBUF", "0")
        .env("WARPSOCK_ZCOPY_MIN", (1u32 << 30).to_string())
        .env("WARPSOCK_LINGER_MS", linger_ms.to_string())
        .spawn()
        .expect("spawn the test program");
        let r = common::finish(child, std::time::Duration::from_secs(60));
        r.assert_ok(&format!("ddpexitbacklog {mode}"));
        println!("{}", r.stdout.trim());
    }
}
