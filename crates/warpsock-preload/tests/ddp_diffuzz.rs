//! A differential sequence fuzzer over a DDP-mode pair (`tests/c/
//! diffuzz.c`, helper 58's): each seed drives the same random sequence of
//! sockets calls on both ends of a loopback pair — sends and receives of
//! every form and flag, peeks, the queue ioctls, poll/select/epoll,
//! options, shutdowns, closes with and without unread bytes — and prints
//! one line a call. Run over kernel TCP (no preload: the specification),
//! then preloaded with both ends switched, CRC off and on: the transcripts
//! must be the same. It found the CLOSE_WAIT hang-up, the credits a
//! reader that only looks never returned, the reset behind a shutdown's
//! `EPIPE` and behind this end's `SHUT_RD` (review 58); then (session 50)
//! `getpeername` and `shutdown` once TCP's socket is CLOSED, the first
//! send to a closed peer (taken, then its reset), bytes to a peer shut
//! both ways (a reset), a close with unread bytes once both ways were shut
//! (no reset), and a `MSG_TRUNC` drain or a `poll` for `POLLERR` alone
//! that lost or missed a reset.
//!
//! Session 53: `POLLWRBAND`, which a DDP socket's doorbell showed beside
//! `POLLOUT` (to `poll` and to an epoll registration asking for it) and
//! TCP never shows, is compared now (`Socket::never_shows`).
//!
//! Left out (`FUZZ_SKIP`), known and documented in the README: `SIOCOUTQ`
//! after the end (TCP's counts what its closed connection never had
//! acknowledged).

mod common;

use std::time::Duration;

use common::{c_program, command, finish};

/// The differences left out of the comparison (see the module docs).
const SKIP: &str = "outq";

/// Seed `seed`'s transcript over TCP (`ddp` false) or switched.
fn transcript(seed: u32, ddp: bool, crc: bool) -> String {
    let mode = if ddp { "ddp" } else { "plain" };
    let mut cmd = command(&c_program("diffuzz"), &[mode.into(), seed.to_string()], ddp);
    cmd.env("FUZZ_SKIP", SKIP)
        .env("WARPSOCK_CRC", if crc { "1" } else { "0" });
    let r = finish(
        cmd.spawn().expect("spawn diffuzz"),
        Duration::from_secs(150),
    );
    r.assert_ok(&format!("diffuzz {mode} {seed}"));
    assert!(
        r.stdout.ends_with("end\n"),
        "diffuzz {mode} {seed}: {}",
        r.stdout
    );
    r.stdout
}

/// Every seed's transcript, switched, is TCP's: the first line that
/// differs is named.
fn same(seeds: impl IntoIterator<Item = u32>, crc: bool) {
    for seed in seeds {
        let tcp = transcript(seed, false, crc);
        let ddp = transcript(seed, true, crc);
        if let Some((t, d)) = tcp.lines().zip(ddp.lines()).find(|(t, d)| t != d) {
            panic!("seed {seed} (CRC {crc}): TCP `{t}`, DDP mode `{d}`");
        }
        assert_eq!(tcp, ddp, "seed {seed} (CRC {crc})");
    }
}

#[test]
fn switched_pairs_answer_as_tcp_crc_off() {
    same(1..=24, false);
}

#[test]
fn switched_pairs_answer_as_tcp_crc_on() {
    same(101..=112, true);
}

/// Seeds that found session 50's differences, each failing without its
/// fix: 37, 104 and 108 a send to a closing peer (the close's EOF says so),
/// 57 and 110 a close with unread bytes once both streams ended (no
/// reset), 187 `POLLERR` after a hang-up (the doorbell's release), 292 and
/// 295 a `poll` for `POLLERR` alone (the socket driven), 296 a `MSG_TRUNC`
/// drain that took the error; session 57's 3650, bytes sent right after
/// the peer's close (its close begun, and its end of stream sent, in the
/// program's `close`, not later by the reaper, whose first step took the
/// bytes in first and reset: `ECONNRESET` where TCP's read 0).
#[test]
fn switched_pairs_answer_as_tcp_found_seeds() {
    same([37, 57, 104, 108, 110, 187, 292, 295, 296, 3650], false);
}
