//! A reader that looks before it reads (`FIONREAD`, a `MSG_PEEK` of a
//! whole request until it is all there) over a switched pair: every send
//! call is a message in a receive slot of its own, and with 16 slots it
//! saw at most the first 15 of its peer's calls — the rest, and a
//! `SHUT_WR` behind them, held by the credits for good, where TCP's one
//! queue holds them all (review 58). Half the slots holding unread small
//! messages now move their bytes out of the slots
//! (`XSocket::merge_unread`), which go back to the peer. Every call is
//! bounded: a hang fails at its timeout.

use std::time::{Duration, Instant};

use warpsock_xsock::io::{Options, RecvFlags, XSocket};

mod net;
mod util;

use net::{pattern, small_window, switch_both, tcp_pair, unbuffered, LIMIT};
use util::Rng;

const PEEK: RecvFlags = RecvFlags {
    peek: true,
    nonblocking: true,
    waitall: false,
};

/// Peeks at `x` until `n` bytes are there (or its end, with `end`): the
/// bytes, or a failure after [`LIMIT`] naming what was there. Each look
/// is a poll's (a round of progress: a peek that finds bytes makes none),
/// then the peek.
fn peek_until(x: &XSocket, n: usize, end: bool) -> Vec<u8> {
    let mut buf = vec![0u8; n + 1];
    let t = Instant::now();
    loop {
        x.readiness();
        let k = x.recv(&mut buf, PEEK, None).map_or(0, |(k, _)| k);
        if k >= n && (!end || x.readiness().rdhup) {
            buf.truncate(k);
            return buf;
        }
        assert!(
            t.elapsed() < LIMIT,
            "a peek saw {k} of {n} bytes (end {}) after {LIMIT:?}",
            x.readiness().rdhup
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// `data` sent in blocking calls of `chunk` bytes, then (`shut`) the end
/// of stream, in a thread of `sc` (with no send buffer, `unbuffered`, a
/// call waits for its credits itself, driving its own engine).
fn send_in<'s>(
    sc: &'s std::thread::Scope<'s, '_>,
    x: &'s XSocket,
    data: &'s [u8],
    chunk: usize,
    shut: bool,
) {
    sc.spawn(move || {
        for c in data.chunks(chunk) {
            assert_eq!(x.send(c, false, Some(LIMIT)).unwrap(), c.len());
        }
        if shut {
            x.shutdown(false, true);
        }
    });
}

/// 40 sends of 10 bytes, none read: a peek sees all 400 (it saw 150),
/// and the read returns them in order.
#[test]
fn a_peek_sees_every_small_send_of_the_peer() {
    let (a, b) = tcp_pair();
    let (xa, xb) = switch_both(&a, &b, &unbuffered());
    let data = pattern(400, 1);
    std::thread::scope(|sc| {
        send_in(sc, &xa, &data, 10, false);
        assert_eq!(peek_until(&xb, 400, false), data);
    });
    assert_eq!(xb.readable_bytes(), 400);
    let mut got = vec![0u8; 1000];
    let (n, _) = xb
        .recv(&mut got, RecvFlags::default(), Some(LIMIT))
        .unwrap();
    assert_eq!(&got[..n], &data[..]);
}

/// 16 sends, then the sender's `SHUT_WR`: the end of stream arrives
/// behind them with nothing read (it waited for credits for good).
#[test]
fn the_end_of_stream_behind_small_sends_arrives_unread() {
    let (a, b) = tcp_pair();
    let (xa, xb) = switch_both(&a, &b, &unbuffered());
    let data = pattern(160, 2);
    std::thread::scope(|sc| {
        send_in(sc, &xa, &data, 10, true);
        assert_eq!(peek_until(&xb, 160, true), data);
    });
    let mut got = vec![0u8; 1000];
    let (n, _) = xb
        .recv(&mut got, RecvFlags::default(), Some(LIMIT))
        .unwrap();
    assert_eq!(&got[..n], &data[..]);
    let (n, _) = xb
        .recv(&mut got, RecvFlags::default(), Some(LIMIT))
        .unwrap();
    assert_eq!(n, 0, "the end of stream");
}

/// A reader that does not read holds at most twice the window (its
/// slots', and as much merged): past it the credits stop the sender again
/// (a send with no credit and no buffer gets `EAGAIN`). Then every byte
/// sent is read, in order.
#[test]
fn merged_bytes_stay_within_twice_the_window() {
    let o = small_window();
    let window = usize::from(o.slots) * 1024;
    let (a, b) = tcp_pair();
    let (xa, xb) = switch_both(&a, &b, &o);
    let data = pattern(4 * window, 3);
    let mut sent = 0usize;
    let t = Instant::now();
    // Non-blocking sends of 10 bytes, a fixed number of tries; the
    // reader's end merges as messages land (a peek drives it while the
    // sender waits for credits).
    for _ in 0..20_000 {
        assert!(t.elapsed() < LIMIT, "{sent} bytes sent after {LIMIT:?}");
        let held = xb.readable_bytes();
        assert!(held <= 2 * window, "{held} bytes held, window {window}");
        if sent + 10 > data.len() {
            break;
        }
        match xa.send(&data[sent..sent + 10], true, None) {
            Ok(n) => sent += n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                let _ = xb.recv(&mut [0u8; 1], PEEK, None);
                std::thread::sleep(Duration::from_micros(200));
            }
            Err(e) => panic!("send: {e}"),
        }
    }
    assert!(
        sent > 16 * 10,
        "no message past the 16 slots ({sent} bytes)"
    );
    assert!(sent < data.len(), "the sender never stopped ({sent} bytes)");
    let got = net::recv_exact(&xb, sent);
    assert_eq!(got, data[..sent]);
}

/// Random sends (mostly small, some of several slots) against a reader
/// that peeks, reads and lags at random, in a small window (merges come
/// often, and meet the window's bound): every byte arrives, in order.
#[test]
fn merged_and_slotted_bytes_arrive_in_order() {
    for seed in 1..=4u64 {
        let o = Options {
            sndbuf: 0,
            ..small_window()
        };
        let (a, b) = tcp_pair();
        let (xa, xb) = switch_both(&a, &b, &o);
        let total = 120_000;
        let data = pattern(total, seed);
        std::thread::scope(|sc| {
            sc.spawn(|| {
                let mut rng = Rng::new(seed);
                let mut off = 0;
                while off < total {
                    let n = if rng.chance(10) {
                        rng.range(1, 5000)
                    } else {
                        rng.range(1, 40)
                    } as usize;
                    let n = n.min(total - off);
                    let k = xa.send(&data[off..off + n], false, Some(LIMIT)).unwrap();
                    off += k;
                }
            });
            let mut rng = Rng::new(seed ^ 0xff);
            let mut got = Vec::with_capacity(total);
            let mut buf = vec![0u8; 8192];
            let t = Instant::now();
            while got.len() < total {
                assert!(t.elapsed() < LIMIT, "seed {seed}: {} of {total}", got.len());
                let want = (rng.range(1, 8192) as usize).min(total - got.len());
                if rng.chance(30) {
                    if let Ok((k, _)) = xb.recv(&mut buf[..want], PEEK, None) {
                        let at = got.len();
                        assert_eq!(&buf[..k], &data[at..at + k], "seed {seed}: peek at {at}");
                    }
                    continue;
                }
                if rng.chance(20) {
                    // The reader lags: messages pile up (and merge).
                    std::thread::sleep(Duration::from_millis(2));
                }
                let (k, _) = xb
                    .recv(&mut buf[..want], RecvFlags::default(), Some(LIMIT))
                    .unwrap();
                assert!(k > 0, "seed {seed}: end of stream at {}", got.len());
                let at = got.len();
                assert_eq!(&buf[..k], &data[at..at + k], "seed {seed}: read at {at}");
                got.extend_from_slice(&buf[..k]);
            }
        });
    }
}
