//! Policy mode against a server without warpsock: the first connection's
//! switch waits out the fallback for the server's mark, and the process
//! then remembers that server (`xsock::plain_peers`): its next connections
//! to it stay plain TCP from their `connect` on, with no wait. Before,
//! every connection paid the whole fallback (a `curl` loop against a plain
//! web server: a second a request).

mod common;

use std::io::{BufRead, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::*;

const CONNS: u32 = 5;

/// `connrate` (preloaded, policy mode for 127.0.0.1, fallback 300 ms and
/// the memory `memory_ms`) makes [`CONNS`] echo round trips to a plain
/// `acceptstall` (no preload): its run.
fn against_a_plain_server(memory_ms: u32) -> Run {
    let (server, mut out, port) = spawn_ready(
        "acceptstall",
        command(&c_program("acceptstall"), &[], false),
    );
    let mut cl = policy::connrate_client(port, CONNS, 60, 300);
    cl.env("WARPSOCK_DDP_PLAIN_MEMORY_MS", memory_ms.to_string());
    let client = finish(cl.spawn().expect("spawn connrate"), Duration::from_secs(60));
    let mut q = TcpStream::connect(("127.0.0.1", port)).unwrap();
    q.write_all(b"quit").unwrap();
    let mut last = String::new();
    let _ = out.read_line(&mut last);
    let _ = finish(server, Duration::from_secs(30));
    assert!(
        client.code == Some(0) && client.stdout.starts_with(&format!("conns {CONNS} ")),
        "the client's round trips to a plain server: {:?} {} {}",
        client.code,
        client.stdout,
        client.stderr
    );
    client
}

/// One fallback, then plain at once: one switch refused (no mark within
/// the fallback), the other connections left plain by the memory.
#[test]
fn a_plain_server_costs_one_fallback_then_its_connections_are_plain_at_once() {
    let client = against_a_plain_server(60_000);
    assert_eq!(
        (
            client.stat("ddp_refused"),
            client.stat("ddp_plain_remembered")
        ),
        (1, u64::from(CONNS) - 1),
        "{}",
        client.stderr
    );
}

/// `WARPSOCK_DDP_PLAIN_MEMORY_MS=0`: every connection tries its switch
/// (and waits out its fallback), as before.
#[test]
fn with_no_memory_every_connection_tries_its_switch() {
    let client = against_a_plain_server(0);
    assert_eq!(
        (
            client.stat("ddp_refused"),
            client.stat("ddp_plain_remembered")
        ),
        (u64::from(CONNS), 0),
        "{}",
        client.stderr
    );
}
