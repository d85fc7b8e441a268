//! A blocking receive with busy polling (`Options::busy_poll`, the
//! preload's `WARPSOCK_BUSY_POLL_US`; `XSocket::recv_busy`): a quiet
//! socket's spin is the engine's read alone, as a busy-polling program's
//! own non-blocking spin is, so the answer to a blocking ping-pong's send
//! is taken by that read; a spin that runs out goes on to the usual
//! blocking receive, which still gets what comes later.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use warpsock_xsock::io::{Options, RecvFlags, XSocket};

mod net;

use net::{opts, pattern, switch_both, tcp_pair, LIMIT};

/// A blocking receive that is not a peek.
const BLOCKING: RecvFlags = RecvFlags {
    peek: false,
    nonblocking: false,
    waitall: false,
};

/// [`opts`] with blocking receives spinning for `busy_poll` first.
fn busy(busy_poll: Duration) -> Options {
    Options {
        busy_poll,
        ..opts()
    }
}

/// `rounds` 8-byte round trips: `xa` sends and takes the answer by
/// `recv_busy`, a thread of `xb`'s echoes with blocking calls. Returns the
/// answers `xa`'s quiet read took (`quiet_answers`).
fn ping_pong(xa: &XSocket, xb: &XSocket, rounds: u64) -> u64 {
    let before = xa.quiet_answers();
    std::thread::scope(|sc| {
        sc.spawn(|| {
            let mut buf = [0; 8];
            for _ in 0..rounds {
                let (n, _) = xb.recv(&mut buf, BLOCKING, Some(LIMIT)).unwrap();
                assert_eq!(n, 8);
                xb.send(&buf, false, Some(LIMIT)).unwrap();
            }
        });
        for round in 0..rounds {
            xa.send(&pattern(8, round), false, Some(LIMIT)).unwrap();
            let mut buf = [0; 8];
            let (r, _) = xa.recv_busy(&mut [&mut buf[..]], BLOCKING, Some(LIMIT));
            assert_eq!(r.unwrap().0, 8, "round {round}");
            assert_eq!(buf[..], pattern(8, round)[..], "round {round}");
        }
    });
    xa.quiet_answers() - before
}

/// With a busy poll longer than any answer takes, every answer after the
/// first few is the quiet read's (the reader's straight send leaves the
/// socket quiet, as a non-blocking reader's does); without one, none is
/// (a blocking reader's sends leave the flag down, and `recv_busy` is the
/// usual receive). Fails with the spin gone from `recv_busy`, or with a
/// busy-polling blocking reader's sends leaving the flag down (0 answers).
#[test]
fn a_busy_polling_blocking_reader_takes_its_answers_by_the_quiet_read() {
    const ROUNDS: u64 = 50;
    let (a, b) = tcp_pair();
    let (xa, xb) = switch_both(&a, &b, &busy(LIMIT));
    let answers = ping_pong(&xa, &xb, ROUNDS);
    assert!(
        answers >= ROUNDS / 2,
        "{answers} of {ROUNDS} answers taken by the quiet read"
    );
    let (a, b) = tcp_pair();
    let (xa, xb) = switch_both(&a, &b, &opts());
    assert_eq!(ping_pong(&xa, &xb, ROUNDS), 0, "without a busy poll");
}

/// A spin that runs out (1 ms) is followed by the usual blocking receive:
/// the peer answers only once that receive waits in the engine (counted,
/// `Counters::waits`), and the call returns the answer — not `EAGAIN`
/// (the spin's own result), nor a hang. Fails with the spin's end
/// returning its `EAGAIN`, or not going on to the wait.
#[test]
fn a_spent_spin_goes_on_to_the_usual_blocking_receive() {
    let (a, b) = tcp_pair();
    let (xa, xb) = switch_both(&a, &b, &busy(Duration::from_millis(1)));
    // A first round trip: the reader's send leaves its socket quiet.
    ping_pong(&xa, &xb, 1);
    for round in 0..3u64 {
        xa.send(&pattern(8, round), false, Some(LIMIT)).unwrap();
        let mut ping = [0; 8];
        assert_eq!(xb.recv(&mut ping, BLOCKING, Some(LIMIT)).unwrap().0, 8);
        let waits = xa.stats().waits.load(Ordering::Relaxed);
        std::thread::scope(|sc| {
            sc.spawn(|| {
                let t = Instant::now();
                while xa.stats().waits.load(Ordering::Relaxed) == waits {
                    assert!(
                        t.elapsed() < LIMIT,
                        "round {round}: the receive never waited"
                    );
                    std::thread::yield_now();
                }
                xb.send(&ping, false, Some(LIMIT)).unwrap();
            });
            let mut buf = [0; 8];
            let (r, _) = xa.recv_busy(&mut [&mut buf[..]], BLOCKING, Some(LIMIT));
            assert_eq!(r.unwrap().0, 8, "round {round}");
            assert_eq!(buf[..], pattern(8, round)[..], "round {round}");
        });
    }
}

/// A zero timeout expires at once: no spin, even with a busy poll of 20 s
/// on a quiet, idle socket — the call fails at once as without one.
/// Fails with the spin made first (the call returns after 20 s).
#[test]
fn a_zero_timeout_makes_no_spin() {
    let (a, b) = tcp_pair();
    let (xa, xb) = switch_both(&a, &b, &busy(LIMIT));
    // A first round trip: the reader's send leaves its socket quiet.
    ping_pong(&xa, &xb, 1);
    xa.send(&pattern(8, 1), false, Some(LIMIT)).unwrap();
    let t = Instant::now();
    let mut buf = [0; 8];
    let (r, _) = xa.recv_busy(&mut [&mut buf[..]], BLOCKING, Some(Duration::ZERO));
    assert!(r.is_err(), "{r:?}");
    assert!(t.elapsed() < LIMIT / 2, "returned after {:?}", t.elapsed());
}
