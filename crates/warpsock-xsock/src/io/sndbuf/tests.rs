//! The send buffer's bound (review r20-xbuf M3), `SO_SNDBUF` and
//! `SIOCOUTQ` (loopback; the peer reads only when a test says so, and one
//! thread drives both ends in turn: no progress thread in this crate).

use std::time::{Duration, Instant};

use crate::io::test_pair::{pair_with, small};
use crate::io::{RecvFlags, XSocket, SNDBUF_MAX, SNDBUF_MIN};

const LIMIT: Duration = Duration::from_secs(20);

const NB: RecvFlags = RecvFlags {
    peek: false,
    nonblocking: true,
    waitall: false,
};

fn buffered(x: &XSocket) -> usize {
    x.lock().aio.buf.len()
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
/// holds at most its bound, and the reader gets every byte counted.
#[test]
fn the_bound_gives_a_partial_count_then_eagain_and_is_never_passed() {
    let bound = 10_500;
    let (xa, xb) = pair_with(&small(bound));
    let mut sent = Vec::new();
    fill_window(&xa, &mut sent);
    let mut counts = Vec::new();
    for _ in 0..100 {
        let c: Vec<u8> = (sent.len()..sent.len() + 1000).map(pat).collect();
        let r = xa.send(&c, true, None);
        assert!(
            buffered(&xa) <= bound,
            "{} held past {bound}",
            buffered(&xa)
        );
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
    // 1,000 held after the window, then 9 whole calls and 500 of the next.
    assert_eq!(counts, [vec![1000; 9], vec![500]].concat());
    assert_eq!(buffered(&xa), bound);
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
        let room = bound - 1000;
        let first = if inside { room - 200 } else { room };
        let a: Vec<u8> = (sent.len()..sent.len() + first).map(pat).collect();
        let b: Vec<u8> = (sent.len() + first..sent.len() + first + 500)
            .map(pat)
            .collect();
        let n = xa.send_vectored(&[&a, &b], true, None).unwrap();
        assert_eq!(n, room, "inside {inside}");
        assert_eq!(buffered(&xa), bound);
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
    // What the buffer takes follows: 1,000 after the window, then 4,000.
    let mut sent = Vec::new();
    fill_window(&xa, &mut sent);
    let c: Vec<u8> = (sent.len()..sent.len() + 8_000).map(pat).collect();
    assert_eq!(xa.send(&c, true, None).unwrap(), 4_000);
    sent.extend_from_slice(&c[..4_000]);
    // Shrunk below what it holds: nothing dropped, nothing more taken.
    assert_eq!(xa.set_sndbuf(0), SNDBUF_MIN);
    assert_eq!(buffered(&xa), 5_000);
    let e = xa.send(&c[4_000..], true, None).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EAGAIN));
    read_all(&xa, &xb, &sent);
    // Built without a buffer (`WARPSOCK_DDP_SNDBUF=0`): none, whatever is
    // asked.
    let (xc, _xd) = pair_with(&small(0));
    assert_eq!(xc.set_sndbuf(100_000), 0);
    assert_eq!(xc.sndbuf(), 0);
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
    let held = buffered(&xa);
    assert_eq!(held, 20_000);
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
