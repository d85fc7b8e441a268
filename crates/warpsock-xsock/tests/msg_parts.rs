//! Message mode's parts over real switched sockets (issue 12, review
//! r19-xdead): a part of a message (its end not yet arrived) that a read
//! or a peek returned, and what a peek promised.

use std::time::{Duration, Instant};

use warpsock_xsock::io::{AioOp, Completion, RecvFlags, XSocket};

mod net;

use net::{pattern, small_window, switch_both, tcp_pair, LIMIT};

const SHORT: Option<Duration> = Some(Duration::from_secs(4));

fn errno(r: std::io::Result<impl std::fmt::Debug>) -> Option<i32> {
    r.err().and_then(|e| e.raw_os_error())
}

/// A pair of the small window (16 slots of 1 KiB) where `xa`, which
/// sent `xb` 15 messages of 8 B (down to its last credit, kept for a
/// CREDIT), waits until `xb` holds them all.
fn after_a_burst(held: bool) -> (XSocket, XSocket) {
    let (a, b) = tcp_pair();
    let (xa, xb) = switch_both(&a, &b, &small_window());
    xa.set_msg_mode(true);
    // `held`: `xb` holds the burst in its slots — a message-mode reader's
    // are not merged (`XSocket::merge_unread`), so the credits stay out.
    xb.set_msg_mode(held);
    for i in 0..15u8 {
        assert_eq!(xa.send(&[i; 8], false, SHORT).unwrap(), 8);
    }
    let t = Instant::now();
    while xb.readable_bytes() < 15 * 8 {
        assert!(t.elapsed() < LIMIT, "the burst did not arrive");
        xb.progress();
    }
    (xa, xb)
}

/// `xa` (message mode) holds a part of `xb`'s message — `xb`'s send
/// stopped at its last credit, non-blocking — and, besides, `xb`'s
/// CREDIT, unreturned: the peer is short only while it is held. Returns
/// the pair and the message.
///
/// The CREDIT is held because a send call of `xa`'s waits for the credit
/// it would take (a non-blocking one's `EAGAIN`, and `xa` holds two
/// credits) and `xa` holds `xb`'s DATA: `Stream::credit_due`'s term
/// against the CREDIT livelock.
fn holding_a_part_and_a_credit() -> (XSocket, XSocket, Vec<u8>) {
    let (xa, xb) = after_a_burst(true);
    assert_eq!(
        errno(xa.send(&[15; 8], true, None)),
        Some(libc::EAGAIN),
        "the last credit is kept for a CREDIT"
    );
    // One message read: `xa`, short, gets its slot back in a CREDIT.
    let mut buf = [0u8; 8];
    let (n, _) = xb.recv(&mut buf, RecvFlags::default(), SHORT).unwrap();
    assert_eq!(&buf[..n], &[0; 8]);
    // Two windows: `xb` sends until its last credit, the rest waits.
    let m = pattern(32 << 10, 7);
    let sent = xb.send(&m, true, None).unwrap();
    assert!(sent > 0 && sent < m.len(), "sent {sent} of {}", m.len());
    (xa, xb, m)
}

/// What a peek returned as a part, a read returns, even after a send of
/// ours returned the slots that made the part due (review r19-xdead item
/// 3): the peer no longer needs a return then, and the part, not the
/// message's end, would wait — `EAGAIN` for a non-blocking read of bytes
/// the peek had just returned.
#[test]
fn a_peeked_part_stays_readable_after_our_own_send() {
    let (xa, xb, m) = holding_a_part_and_a_credit();
    let peek = RecvFlags {
        peek: true,
        ..RecvFlags::default()
    };
    let mut seen = vec![0u8; 64 << 10];
    // Blocking: returns once the part is due (the peer short).
    let (p, eor) = xa.recv(&mut seen, peek, SHORT).unwrap();
    assert!(!eor && p > 0 && p < m.len(), "peeked {p} ({eor})");
    assert_eq!(&seen[..p], &m[..p]);
    // Our message returns the CREDIT's slot: the peer holds two credits
    // again. (`xb` does not run: nothing more of its message comes.)
    assert_eq!(xa.send(b"answer!!", false, SHORT).unwrap(), 8);
    let mut got = vec![0u8; 64 << 10];
    let nb = RecvFlags {
        nonblocking: true,
        ..RecvFlags::default()
    };
    let (n, eor) = xa
        .recv(&mut got, nb, None)
        .expect("the peeked part is readable");
    assert_eq!((n, eor), (p, false));
    assert_eq!(&got[..n], &m[..n]);
    drop(xb);
}

/// A peek the latch alone let in latches what it returned (review
/// r20-xdead2b #2): a small peek of a due part, our own send (the part no
/// longer due), a large peek through the latch, a read of the latched
/// length — the rest the large peek returned is still readable (it gave
/// `EAGAIN`: the latch stopped at the first peek's length).
#[test]
fn a_peek_the_latch_let_in_extends_it() {
    let (xa, xb, m) = holding_a_part_and_a_credit();
    let t = Instant::now();
    while xa.readable_bytes() < 14 << 10 {
        assert!(t.elapsed() < LIMIT, "the parts did not arrive");
        xa.progress();
    }
    let peek = RecvFlags {
        peek: true,
        nonblocking: true,
        waitall: false,
    };
    let mut four = [0u8; 4];
    assert_eq!(xa.recv(&mut four, peek, None).unwrap(), (4, false));
    assert_eq!(xa.send(b"answer!!", false, SHORT).unwrap(), 8);
    let mut seen = vec![0u8; 64 << 10];
    let (p, eor) = xa.recv(&mut seen, peek, None).unwrap();
    assert_eq!((p, eor), (14 << 10, false));
    assert_eq!(xa.recv(&mut four, NB, None).unwrap(), (4, false));
    let mut got = vec![0u8; 64 << 10];
    let (n, eor) = xa.recv(&mut got, NB, None).expect("what the peek returned");
    assert_eq!((n, eor), (p - 4, false));
    assert_eq!(&got[..n], &m[4..p]);
    drop(xb);
}

/// A message that fits the window arrives in one read, whole, though the
/// peer holds our CREDIT unreturned and is short before its end (review
/// r19-xdead item 2): with no send of ours waiting, the CREDIT's slot
/// goes back at once and the peer sends the rest. (`credit_due`'s term
/// held it whenever we held DATA, and the reader took the message in two
/// parts, the first without `MSG_EOR`.)
#[test]
fn a_message_that_fits_is_read_whole_after_a_one_way_burst() {
    let (xa, xb) = after_a_burst(false);
    // All 15 read at once: one CREDIT of 15 to the short `xa`, which holds
    // its slot.
    let mut buf = [0u8; 15 * 8];
    assert_eq!(
        xb.recv(&mut buf, RecvFlags::default(), SHORT).unwrap().0,
        15 * 8
    );
    // 15 slots of the 16: `xb` holds 15 credits, sends 14 parts and waits
    // for the CREDIT's slot.
    let m = pattern(15 << 10, 9);
    std::thread::scope(|sc| {
        let tx = sc.spawn(|| xb.send(&m, false, SHORT));
        let mut got = vec![0u8; 64 << 10];
        let (n, eor) = xa.recv(&mut got, RecvFlags::default(), SHORT).unwrap();
        assert_eq!((n, eor), (m.len(), true), "the message in one read");
        assert_eq!(&got[..n], &m[..]);
        assert_eq!(tx.join().unwrap().unwrap(), m.len());
    });
}

/// Waits for one asynchronous completion of `x` (each `aio_poll` makes a
/// round of progress).
fn completion(x: &XSocket) -> Completion {
    let mut done = Vec::new();
    let t = Instant::now();
    while done.is_empty() {
        assert!(t.elapsed() < LIMIT, "no completion");
        x.aio_poll(&mut done, 1);
        std::thread::yield_now();
    }
    done[0]
}

/// An asynchronous receive in message mode tells, as `recv` does, whether
/// its bytes end a message (review r19-xdead item 5): a message of three
/// windows comes in parts (the peer short), and only its last part
/// carries the end.
#[test]
fn an_asynchronous_receive_carries_the_messages_end() {
    let (a, b) = tcp_pair();
    let (xa, xb) = switch_both(&a, &b, &small_window());
    xa.set_msg_mode(true);
    let m = pattern(48 << 10, 11);
    let mut buf = vec![0u8; 64 << 10];
    std::thread::scope(|sc| {
        let tx = sc.spawn(|| xb.send(&m, false, SHORT));
        let mut got = Vec::new();
        let mut parts = 0;
        loop {
            #[allow(unsafe_code)]
            // SAFETY: `buf` lives, untouched, until the completion is
            // collected (`completion`, below).
            unsafe { xa.aio_recv(buf.as_mut_ptr(), buf.len(), 5) }.unwrap();
            let c = completion(&xa);
            assert_eq!((c.cookie, c.op), (5, AioOp::Recv));
            let n = c.result.unwrap();
            assert!(n > 0, "end of stream");
            got.extend_from_slice(&buf[..n]);
            parts += 1;
            if c.eor {
                break;
            }
            assert!(got.len() < m.len(), "the message's end without MSG_EOR");
        }
        assert!(parts > 1, "three windows in one receive");
        assert!(got == m, "the parts put together are the message");
        assert_eq!(tx.join().unwrap().unwrap(), m.len());
    });
}

/// `xa` (message mode) holds 11 parts of `xb`'s message that no read of
/// a larger buffer returns now: `xb` sent 15 parts down to its last
/// credit and stopped (it does not run again until its next call), and
/// `xa` read 4 KiB of them (the peer short, as readiness checks; the read
/// itself is let in by its buffer being full), whose slots
/// went back at once in a CREDIT — the peer, as far as `xa` knows, holds
/// five credits. Returns the pair, the message, the bytes sent and the 4
/// KiB read.
fn holding_a_part_not_due() -> (XSocket, XSocket, Vec<u8>, usize, Vec<u8>) {
    let (a, b) = tcp_pair();
    let (xa, xb) = switch_both(&a, &b, &small_window());
    xa.set_msg_mode(true);
    let m = pattern(32 << 10, 13);
    let sent = xb.send(&m, true, None).unwrap();
    assert!(sent > 4096 && sent < m.len(), "sent {sent}");
    let t = Instant::now();
    while xa.readable_bytes() < sent {
        assert!(t.elapsed() < LIMIT, "the parts did not arrive");
        xa.progress();
    }
    // Readiness counts a held part only when a read of any size returns
    // it: no end, no latch, so the peer is short (review r20-xdead2b #7:
    // before message-mode readiness this held whenever bytes were held).
    assert!(
        xa.readiness().readable,
        "the peer is short: the part is due"
    );
    let mut small = vec![0u8; 4096];
    let (n, eor) = xa.recv(&mut small, RecvFlags::default(), SHORT).unwrap();
    assert_eq!((n, eor), (4096, false));
    assert_eq!(
        errno(xa.recv(&mut vec![0u8; 64 << 10], NB, None)),
        Some(libc::EAGAIN)
    );
    assert_eq!(xa.readable_bytes(), sent - 4096, "FIONREAD counts them");
    (xa, xb, m, sent, small)
}

const NB: RecvFlags = RecvFlags {
    peek: false,
    nonblocking: true,
    waitall: false,
};

/// A peek that its buffer filled — not the peer being short — releases
/// nothing for the next read (review r20-xdead2a #1): "peek the length
/// prefix, then read the message" reads the message whole, as before the
/// latch, and a non-blocking read of a larger buffer still finds it
/// incomplete.
#[test]
fn a_peek_its_buffer_filled_releases_no_part() {
    let (xa, _xb, m, _, _) = holding_a_part_not_due();
    let peek = RecvFlags {
        peek: true,
        nonblocking: true,
        ..RecvFlags::default()
    };
    let mut prefix = [0u8; 4];
    assert_eq!(xa.recv(&mut prefix, peek, None).unwrap(), (4, false));
    assert_eq!(&prefix, &m[4096..4100]);
    assert_eq!(
        errno(xa.recv(&mut vec![0u8; 64 << 10], NB, None)),
        Some(libc::EAGAIN)
    );
}

/// Level-triggered readiness agrees with the read (review r19-xdead item
/// 6): part of a message that no read would return now — not its end, the
/// peer not short, no peek — is not readable where a poll asks
/// (`readiness`, `readiness_now`: the preload's poll paths, and its look
/// after the `EAGAIN` such a part gives a receive); a non-blocking read
/// would fail, and an event loop woken for it spun until the rest came.
/// Once readable, a non-blocking read returns bytes, up to the message's
/// end.
#[test]
fn a_held_part_no_read_would_return_is_not_readable() {
    let (xa, xb, m, sent, small) = holding_a_part_not_due();
    let r = xa.readiness();
    assert!(!r.readable && !xa.readiness_now().readable, "{r:?}");
    let mut big = vec![0u8; 64 << 10];
    assert_eq!(errno(xa.recv(&mut big, NB, None)), Some(libc::EAGAIN));
    assert!(!xa.readiness_now().readable);
    // The rest comes: readable whenever a read returns, up to the end.
    let mut got = small;
    std::thread::scope(|sc| {
        let tx = sc.spawn(|| xb.send(&m[sent..], false, SHORT));
        let t = Instant::now();
        loop {
            assert!(t.elapsed() < LIMIT, "{} of {} bytes", got.len(), m.len());
            if !xa.readiness().readable {
                std::thread::yield_now();
                continue;
            }
            let (n, eor) = xa
                .recv(&mut big, NB, None)
                .expect("readable: a read returns");
            got.extend_from_slice(&big[..n]);
            if eor {
                break;
            }
        }
        assert_eq!(tx.join().unwrap().unwrap(), m.len() - sent);
    });
    assert!(got == m, "the message, in order");
}
