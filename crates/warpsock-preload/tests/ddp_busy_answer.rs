//! A preloaded server in policy mode with no switching place for a client
//! (its host's share of the places held) tells a warpsock client so at
//! once — an urgent `BUSY` where its mark would go (`ddp_switch_busy`) —
//! whether the client's mark came before the accept (answered by the
//! accept) or after it (answered by the watch, `xsock::switching::
//! late_busy`). Before, the client waited out its fallback on every such
//! connection.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::policy::*;
use common::*;

/// A preloaded policy-mode server (every address of 127/8 switches, its
/// mark timeout 10 s), stopped, and `n` connections from 127.0.0.1 that
/// marked their switch meanwhile, waiting in its listener's queue: the
/// server, its stdout, its port, the connections.
fn stopped_server_and_marked(
    n: usize,
) -> (
    std::process::Child,
    std::io::BufReader<std::process::ChildStdout>,
    u16,
    Vec<TcpStream>,
) {
    let mut cmd = command(&c_program("acceptstall"), &[], true);
    cmd.env("WARPSOCK_DDP_ADDRS", "127.0.0.0/8");
    let (child, out, port) = policy_server_with("acceptstall", 10_000, cmd);
    signal(&child, libc::SIGSTOP);
    let marked = (0..n)
        .map(|_| {
            let t = connect_from([127, 0, 0, 1], port);
            mark(&t);
            t
        })
        .collect();
    (child, out, port, marked)
}

/// Sends `sig` to our own child.
fn signal(child: &std::process::Child, sig: libc::c_int) {
    // SAFETY: a signal to our own child.
    assert_eq!(unsafe { libc::kill(child.id() as libc::pid_t, sig) }, 0);
}

/// A preloaded policy-mode `connrate` making one connection to `port`
/// from 127.0.0.1, its fallback 60 s (beyond the tests' bounds).
fn one_connection(port: u16) -> std::process::Child {
    connrate_client(port, 1, 30, 60_000)
        .spawn()
        .expect("spawn connrate")
}

/// `client`'s run, which must have made its connection (its echo back).
fn connected(client: Run) -> Run {
    assert!(
        client.code == Some(0) && client.stdout.starts_with("conns 1 "),
        "the client past the places: {:?} {} {}",
        client.code,
        client.stdout,
        client.stderr
    );
    client
}

/// Clients past their host's share of the switching places whose marks
/// came before the server accepted them (a burst behind the backlog: the
/// server is stopped while 70 clients connect and mark) hear at once that
/// the server is busy (`BUSY`, counted in `ddp_switch_busy`), where a
/// warpsock client waited out its fallback before going on as TCP. The
/// 48 within the share get the server's mark back (their switches wait for
/// the Request). Without the answer, the 22 heard nothing.
#[test]
fn clients_past_the_places_hear_at_once_that_the_server_is_busy() {
    const CLIENTS: u64 = 70;
    let (child, mut out, port, clients) = stopped_server_and_marked(CLIENTS as usize);
    signal(&child, libc::SIGCONT);
    // One bound for all: a server that answers none fails in 30 s.
    let deadline = Instant::now() + Duration::from_secs(30);
    let answers: Vec<Option<u8>> = clients.iter().map(|t| urgent_answer(t, deadline)).collect();
    let count = |b: u8| answers.iter().filter(|&&a| a == Some(b)).count() as u64;
    assert_eq!(
        (count(0xD7), count(0xD8)),
        (48, CLIENTS - 48),
        "marks back and busy answers: {answers:x?}"
    );
    drop(clients);
    let run = quit_server(child, &mut out, connect_from([127, 0, 0, 3], port));
    assert_eq!(
        (
            run.stat("ddp_switch_peer_over"),
            run.stat("ddp_switch_busy")
        ),
        (CLIENTS - 48, CLIENTS - 48),
        "{}",
        run.stderr
    );
}

/// A preloaded policy-mode client past its host's share of the server's
/// switching places (48 marked connections from its address hold them),
/// its mark in before the server accepts it, goes on as plain TCP at once
/// on the server's busy answer: its fallback (60 s) outlasts the test's
/// bound, so only the answer can end its switch in time. Nothing lost (its
/// echo), the server not remembered as one without warpsock.
#[test]
fn a_preloaded_client_past_the_places_goes_on_as_tcp_at_once() {
    const SHARE: usize = 48;
    let (child, mut out, port, holders) = stopped_server_and_marked(SHARE);
    let client = one_connection(port);
    // The client's mark in (its switch runs in the background of its
    // `connect`), the server still stopped.
    let held: Vec<u16> = holders
        .iter()
        .map(|t| t.local_addr().unwrap().port())
        .collect();
    let clients_mark_in = || marks_queued(port).iter().any(|p| !held.contains(p));
    let deadline = Instant::now() + Duration::from_secs(20);
    while !clients_mark_in() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(2));
    }
    let queued = clients_mark_in();
    signal(&child, libc::SIGCONT);
    let client = connected(finish(client, Duration::from_secs(45)));
    assert!(queued, "the client's mark never came");
    assert_eq!(
        (
            client.stat("ddp_switched"),
            client.stat("ddp_refused"),
            client.stat("ddp_plain_remembered")
        ),
        (0, 1, 0),
        "{}",
        client.stderr
    );
    drop(holders);
    let run = quit_server(child, &mut out, connect_from([127, 0, 0, 3], port));
    assert_eq!(run.stat("ddp_switch_busy"), 1, "{}", run.stderr);
}

/// A connection to `port` from 127.0.0.1, once the server accepted it (by
/// `deadline`).
fn accepted_from_here(port: u16, deadline: Instant) -> TcpStream {
    let t = connect_from([127, 0, 0, 1], port);
    let from = t.local_addr().unwrap().port();
    while !accepted(port, from) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(2));
    }
    assert!(accepted(port, from), "never accepted");
    t
}

/// A client past the places whose mark comes after the server accepted its
/// connection (the accept seen in `/proc/net/tcp`) hears `BUSY` when the
/// mark comes: the watch answers it. A plain client's bytes first end its
/// watch untouched. A preloaded client past the places
/// (fallback 60 s, beyond the test's bound), accepted at once by the idle
/// server, goes on as TCP at once too.
#[test]
fn a_mark_after_the_accept_hears_busy_when_it_comes() {
    const SHARE: usize = 48;
    let mut cmd = command(&c_program("acceptstall"), &[], true);
    cmd.env("WARPSOCK_DDP_ADDRS", "127.0.0.0/8");
    let (child, mut out, port) = policy_server_with("acceptstall", 10_000, cmd);
    let deadline = Instant::now() + Duration::from_secs(30);
    // The share's places held: each holder's switch marked back.
    let holders: Vec<TcpStream> = (0..SHARE)
        .map(|_| {
            let t = connect_from([127, 0, 0, 1], port);
            mark(&t);
            assert_eq!(urgent_answer(&t, deadline), Some(0xD7), "a holder's place");
            t
        })
        .collect();
    let late = accepted_from_here(port, deadline);
    mark(&late);
    assert_eq!(
        urgent_answer(&late, deadline),
        Some(0xD8),
        "the late mark's answer"
    );
    // A plain client past the places, watched once accepted: its bytes
    // first end the watch, all of them the program's (its echo), and it
    // never gets an urgent byte.
    let mut plain = accepted_from_here(port, deadline);
    plain
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    plain.write_all(b"ping").unwrap();
    let mut echo = [0u8; 4];
    plain
        .read_exact(&mut echo)
        .expect("the plain client's echo");
    assert_eq!(&echo, b"ping");
    assert_eq!(
        urgent_answer(&plain, Instant::now()),
        None,
        "an urgent byte to a plain client"
    );
    let client = connected(finish(one_connection(port), Duration::from_secs(45)));
    assert_eq!(client.stat("ddp_refused"), 1, "{}", client.stderr);
    drop((holders, late, plain));
    let run = quit_server(child, &mut out, connect_from([127, 0, 0, 3], port));
    assert_eq!(run.stat("ddp_switch_busy"), 2, "{}", run.stderr);
}
