//! The process's budget of live DDP sockets (`WARPSOCK_DDP_SOCKETS_MAX`,
//! `xsock::budget`): each DDP socket maps its receive slots (4 MiB by
//! default), which a peer can make resident, so a process holds at most
//! this many at once. Beyond it an explicit switch fails with `ENOBUFS`,
//! the socket an ordinary TCP socket, and policy mode leaves the
//! connection plain TCP; a place comes back once a DDP socket's close has
//! finished (`tests/c/ddpbudget.c`).

mod common;

use std::io::{BufRead, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::*;

/// Budget 2, one process (a pair's two ends are two DDP sockets): a
/// third socket's explicit switch fails with `ENOBUFS` and the connection
/// carries bytes both ways as TCP; a closed end whose close lingers for
/// its peer's FIN keeps its place; after the DDP pair's closes (one end
/// closed, its peer reading the end of stream, then the other), the same
/// connection switches at both ends and carries bytes in DDP mode. Fails
/// without the budget (the third switch waits for its peer's and fails
/// with `ECONNREFUSED` after the switch timeout), and with the place given
/// back at the program's close rather than when the socket is dropped
/// (the switch during the linger is admitted, and fails the same way).
#[test]
fn an_explicit_switch_beyond_the_budget_fails_with_enobufs_until_a_socket_is_gone() {
    let mut cmd = command(&c_program("ddpbudget"), &["explicit".into()], true);
    // Room for the two ends' admissions, each looked for while the
    // closes finish, to come apart.
    cmd.env("WARPSOCK_DDP_SOCKETS_MAX", "2")
        .env("WARPSOCK_SWITCH_TIMEOUT_MS", "5000")
        // The closed end's linger, during which its place stays taken, is
        // far longer than the look that finds it taken.
        .env("WARPSOCK_LINGER_MS", "10000");
    let r = finish(
        cmd.spawn().expect("spawn ddpbudget"),
        Duration::from_secs(60),
    );
    r.assert_ok("ddpbudget explicit");
    assert!(r.stdout.contains("ddpbudget: ok"), "{}", r.stdout);
    assert_eq!(r.stat("ddp_switched"), 4, "{}", r.stderr);
    assert!(r.stat("ddp_budget_over") >= 3, "{}", r.stderr);
}

/// Budget 1 at a policy-mode server: its first client's connection
/// switches; a second, made while the first is open, stays plain TCP at
/// the server (`ddp_budget_over`), the client falling back, and echoes
/// every byte — as does the first after it. Fails without the budget: the
/// second switches too (the client reads DDP mode on it; the server
/// counts 2).
#[test]
fn a_policy_connection_beyond_the_budget_stays_plain_and_echoes() {
    let mut cmd = command(&c_program("acceptstall"), &[], true);
    cmd.env("WARPSOCK_DDP_ADDRS", "127.0.0.1/32")
        .env("WARPSOCK_DDP_FALLBACK_MS", "1000")
        .env("WARPSOCK_DDP_SOCKETS_MAX", "1");
    let (child, mut out, port) = spawn_ready("acceptstall", cmd);
    let mut cl = command(
        &c_program("ddpbudget"),
        &["client".into(), port.to_string()],
        true,
    );
    // The second connection's client waits this long for the server's
    // mark, which never comes, then goes on as TCP.
    cl.env("WARPSOCK_DDP_ADDRS", "127.0.0.1/32")
        .env("WARPSOCK_DDP_FALLBACK_MS", "300");
    let client = finish(
        cl.spawn().expect("spawn ddpbudget"),
        Duration::from_secs(60),
    );
    let mut q = TcpStream::connect(("127.0.0.1", port)).unwrap();
    q.write_all(b"quit").unwrap();
    // Its last line read (a closed pipe would end it before its report).
    let mut last = String::new();
    let _ = out.read_line(&mut last);
    let server = finish(child, Duration::from_secs(30));
    client.assert_ok("ddpbudget client");
    assert!(client.stdout.contains("ddpbudget: ok"), "{}", client.stdout);
    assert_eq!(server.code, Some(0), "the server: {}", server.stderr);
    assert_eq!(server.stat("ddp_switched"), 1, "{}", server.stderr);
    assert!(server.stat("ddp_budget_over") >= 1, "{}", server.stderr);
    assert_eq!(client.stat("ddp_switched"), 1, "{}", client.stderr);
}
