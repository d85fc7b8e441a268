//! The send buffer's bound (review r20-xbuf M3), `SO_SNDBUF` and
//! `SIOCOUTQ` (loopback; the peer reads only when a test says so, and one
//! thread drives both ends in turn: no progress thread in this crate).

use std::time::{Duration, Instant};

use super::RUN_COST;
use crate::io::test_pair::{pair_with, small};
use crate::io::{RecvFlags, XSocket, SNDBUF_MAX, SNDBUF_MIN};

const LIMIT: Duration = Duration::from_secs(20);

const NB: RecvFlags = RecvFlags {
    peek: false,
    nonblocking: true,
    waitall: false,
};

/// The send buffer's bytes.
fn buffered(x: &XSocket) -> usize {
    x.lock().aio.buf.len()
}

/// What it holds against its bound: bytes, and a run's cost per call.
fn held(x: &XSocket) -> usize {
    x.lock().aio.held()
}

/// The byte at stream position `i`.
fn pat(i: usize) -> u8 {
    (i as u8).wrapping_mul(31).wrapping_add((i >> 8) as u8)
}

/// Non-blocking sends of 1,000 bytes (the stream's next bytes) until the
/// first one that buffers: the window is full and the buffer holds that
/// call's 1,000 bytes. Returns the bytes sent.
fn fill_window(x: &XSocket, sent: &mut Vec<u8>) {
    for _ in 0..100 {
        let c: Vec<u8> = (sent.len()..sent.len() + 1000).map(pat).collect();
        assert_eq!(x.send(&c, true, None).unwrap(), 1000);
        sent.extend_from_slice(&c);
        if buffered(x) > 0 {
            assert_eq!(buffered(x), 1000, "one call's bytes");
            return;
        }
    }
    panic!("the window never filled");
}

/// The peer reads everything `xa` sent (`want`), `xa` driven in turn so
/// that its buffered bytes go as credits come back.
fn read_all(xa: &XSocket, xb: &XSocket, want: &[u8]) {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let start = Instant::now();
    while got.len() < want.len() {
        assert!(start.elapsed() < LIMIT, "{} of {}", got.len(), want.len());
        match xb.recv(&mut buf, NB, None) {
            Ok((n, _)) => got.extend_from_slice(&buf[..n]),
            Err(e) => assert_eq!(e.raw_os_error(), Some(libc::EAGAIN), "{e}"),
        }
        xa.progress();
    }
    assert!(got == want, "the stream in order");
}

/// A non-blocking send into a nearly full buffer returns a partial count
/// (what the room takes), the next `EAGAIN`; after every call the buffer
/// holds at most its bound — its bytes and a run's cost per send call
/// (review r21-send #4) — and the reader gets every byte counted.
#[test]
fn the_bound_gives_a_partial_count_then_eagain_and_is_never_passed() {
    // The window's overflow call, 9 whole calls and 500 bytes of a tenth.
    let bound = 10 * (1000 + RUN_COST) + RUN_COST + 500;
    let (xa, xb) = pair_with(&small(bound));
    let mut sent = Vec::new();
    fill_window(&xa, &mut sent);
    let mut counts = Vec::new();
    for _ in 0..100 {
        let c: Vec<u8> = (sent.len()..sent.len() + 1000).map(pat).collect();
        let r = xa.send(&c, true, None);
        assert!(held(&xa) <= bound, "{} held past {bound}", held(&xa));
        match r {
            Ok(n) => {
                sent.extend_from_slice(&c[..n]);
                counts.push(n);
            }
            Err(e) => {
                assert_eq!(e.raw_os_error(), Some(libc::EAGAIN), "{e}");
                break;
            }
        }
    }
    assert_eq!(counts, [vec![1000; 9], vec![500]].concat());
    assert_eq!(held(&xa), bound);
    assert_eq!(buffered(&xa), 10 * 1000 + 500);
    read_all(&xa, &xb, &sent);
    assert_eq!(buffered(&xa), 0);
}

/// `writev` at the bound: a partial count inside an iovec (its head taken,
/// the rest not) and at an iovec boundary (the first whole, the second
/// not at all); the reader gets exactly the bytes counted, in order.
#[test]
fn writev_at_the_bound_stops_inside_an_iovec_or_at_its_boundary() {
    for inside in [true, false] {
        let bound = 6_000;
        let (xa, xb) = pair_with(&small(bound));
        let mut sent = Vec::new();
        fill_window(&xa, &mut sent);
        // What the writev's run takes: the room less its cost.
        let room = bound - (1000 + RUN_COST) - RUN_COST;
        let first = if inside { room - 200 } else { room };
        let a: Vec<u8> = (sent.len()..sent.len() + first).map(pat).collect();
        let b: Vec<u8> = (sent.len() + first..sent.len() + first + 500)
            .map(pat)
            .collect();
        let n = xa.send_vectored(&[&a, &b], true, None).unwrap();
        assert_eq!(n, room, "inside {inside}");
        assert_eq!(held(&xa), bound);
        sent.extend_from_slice(&a);
        sent.extend_from_slice(&b[..room - first]);
        let e = xa.send_vectored(&[&b], true, None).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EAGAIN));
        read_all(&xa, &xb, &sent);
    }
}

/// `SO_SNDBUF`: reads the bound; a set is clamped and changes what the
/// buffer takes; a socket built without a buffer keeps none.
#[test]
fn so_sndbuf_reads_and_sets_the_bound() {
    let (xa, xb) = pair_with(&small(10_000));
    assert_eq!(xa.sndbuf(), 10_000);
    assert_eq!(xa.set_sndbuf(1), SNDBUF_MIN);
    assert_eq!(xa.set_sndbuf(usize::MAX), SNDBUF_MAX);
    assert_eq!(xa.set_sndbuf(5_000), 5_000);
    assert_eq!(xa.sndbuf(), 5_000);
    // What the buffer takes follows: 1,000 after the window, then the
    // rest of the bound (two runs' costs off).
    let mut sent = Vec::new();
    fill_window(&xa, &mut sent);
    let c: Vec<u8> = (sent.len()..sent.len() + 8_000).map(pat).collect();
    let took = 4_000 - 2 * RUN_COST;
    assert_eq!(xa.send(&c, true, None).unwrap(), took);
    sent.extend_from_slice(&c[..took]);
    // Shrunk below what it holds: nothing dropped, nothing more taken.
    assert_eq!(xa.set_sndbuf(0), SNDBUF_MIN);
    assert_eq!(held(&xa), 5_000);
    let e = xa.send(&c[took..], true, None).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EAGAIN));
    read_all(&xa, &xb, &sent);
    // Built without a buffer (`WARPSOCK_DDP_SNDBUF=0`): none, whatever is
    // asked; it reports the credit window, 4 slots of 1 KiB (never 0).
    let (xc, _xd) = pair_with(&small(0));
    assert_eq!(xc.set_sndbuf(100_000), 4 << 10);
    assert_eq!(xc.sndbuf(), 4 << 10);
    let mut sent = Vec::new();
    let e = loop {
        let c: Vec<u8> = (sent.len()..sent.len() + 1000).map(pat).collect();
        match xc.send(&c, true, None) {
            Ok(n) => sent.extend_from_slice(&c[..n]),
            Err(e) => break e,
        }
        assert!(sent.len() <= 4 << 10, "no buffer past the window");
    };
    assert_eq!(e.raw_os_error(), Some(libc::EAGAIN));
    assert_eq!(buffered(&xc), 0);
}

/// `SIOCOUTQ`: at least the bytes the buffer holds while it holds some,
/// at most what was sent plus framing; 0 once the reader took everything
/// and its TCP acknowledged it. (The kernel's queue of the connection
/// alone — what the ioctl reported before — is about 0 here: the peer's
/// TCP acknowledged the window.)
#[test]
fn siocoutq_counts_the_buffer_and_goes_to_zero() {
    let (xa, xb) = pair_with(&small(20_000));
    let mut sent = Vec::new();
    fill_window(&xa, &mut sent);
    let c: Vec<u8> = (sent.len()..sent.len() + 30_000).map(pat).collect();
    let n = xa.send(&c, true, None).unwrap();
    sent.extend_from_slice(&c[..n]);
    assert_eq!(held(&xa), 20_000);
    let held = buffered(&xa);
    assert_eq!(held, 20_000 - 2 * RUN_COST);
    let q = xa.send_queue_bytes(false);
    assert!(
        q >= held && q <= sent.len() + 1024,
        "{q}: {held} held, {} sent",
        sent.len()
    );
    let unsent = xa.send_queue_bytes(true);
    assert!(
        unsent >= held && unsent <= q,
        "{unsent} unsent, {q} unacknowledged"
    );
    read_all(&xa, &xb, &sent);
    let start = Instant::now();
    while xa.send_queue_bytes(false) > 0 {
        assert!(start.elapsed() < LIMIT, "{}", xa.send_queue_bytes(false));
        std::thread::yield_now();
    }
    assert_eq!(xa.send_queue_bytes(true), 0);
}

/// One-byte send calls: each is a run of its own (a message-mode reader
/// reads each as one message), and each run is charged against the bound,
/// so a 64 KiB bound holds a few hundred of them, not 64 Ki queue entries
/// (review r21-send #4: a 1 MiB bound of bytes alone held ~96 MiB).
#[test]
fn one_byte_writes_are_bounded_by_their_runs_too() {
    let bound = 64 << 10;
    let (xa, xb) = pair_with(&small(bound));
    let mut sent = Vec::new();
    fill_window(&xa, &mut sent);
    let mut calls = 0;
    loop {
        let b = [pat(sent.len())];
        match xa.send(&b, true, None) {
            Ok(1) => sent.push(b[0]),
            Ok(n) => panic!("{n}"),
            Err(e) => {
                assert_eq!(e.raw_os_error(), Some(libc::EAGAIN), "{e}");
                break;
            }
        }
        calls += 1;
        assert!(calls <= bound, "the bound never filled");
    }
    let runs = xa.lock().aio.sends.len();
    assert!(held(&xa) <= bound);
    assert_eq!(runs, calls + 1, "one run per call");
    assert!(runs <= bound / RUN_COST, "{runs} runs of {RUN_COST} B each");
    read_all(&xa, &xb, &sent);
    assert_eq!(held(&xa), 0);
}
