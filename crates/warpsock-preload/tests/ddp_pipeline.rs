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
