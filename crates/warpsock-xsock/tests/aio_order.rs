//! A plain send after an asynchronous send that is still queued
//! (`XSocket::aio_send` waiting for credits, or behind an earlier one):
//! its bytes go behind the queued ones — a stream delivers bytes in call
//! order, and message mode messages in call order.

use std::time::Instant;

use warpsock_xsock::io::{AioOp, Completion, RecvFlags, XSocket};

mod net;

use net::{pattern, recv_exact, switch_both, tcp_pair, unbuffered, LIMIT};

/// Small non-blocking sends from `xa` until the peer's window is full
/// (`EAGAIN`: no credit left); the messages sent.
fn fill_window(xa: &XSocket) -> Vec<Vec<u8>> {
    let mut sent = Vec::new();
    for i in 0..1000u64 {
        let m = pattern(100, 1000 + i);
        match xa.send(&m, true, None) {
            Ok(n) => {
                assert_eq!(n, m.len());
                sent.push(m);
            }
            Err(e) => {
                assert_eq!(e.raw_os_error(), Some(libc::EAGAIN), "{e}");
                return sent;
            }
        }
    }
    panic!("the window never filled");
}

/// Collects `x`'s `n` completions of asynchronous sends, in order.
fn send_completions(x: &XSocket, n: usize) -> Vec<Completion> {
    let mut done = Vec::new();
    let t = Instant::now();
    while done.len() < n {
        assert!(t.elapsed() < LIMIT, "{done:?}");
        x.aio_poll(&mut done, 8);
        std::thread::yield_now();
    }
    assert!(done.iter().all(|c| c.op == AioOp::Send), "{done:?}");
    done
}

/// Two asynchronous sends queued behind a full window, then the reader
/// takes the window's bytes (the credits come back), then a plain send:
/// the reader sees the asynchronous sends' bytes first, then the plain
/// one's — in stream mode by content, in message mode message by message.
fn plain_send_after_queued_aio_sends(msg_mode: bool) {
    let (a, b) = tcp_pair();
    let (xa, xb) = switch_both(&a, &b, &unbuffered());
    xb.set_msg_mode(msg_mode);
    let filler = fill_window(&xa);
    let one = pattern(3000, 1);
    let two = pattern(5000, 2);
    let plain = pattern(8, 3);
    #[allow(unsafe_code)]
    // SAFETY: both buffers live until their completions are collected
    // (below, before they are dropped).
    unsafe {
        xa.aio_send(one.as_ptr(), one.len(), 1).unwrap();
        xa.aio_send(two.as_ptr(), two.len(), 2).unwrap();
    }
    assert_eq!(xa.aio_pending(), 2, "both wait for credits");
    // The reader frees the window (its reads return the credits).
    let mut want = Vec::new();
    if msg_mode {
        for m in &filler {
            let mut buf = [0u8; 200];
            let (n, eor) = xb
                .recv(&mut buf, RecvFlags::default(), Some(LIMIT))
                .unwrap();
            assert!(eor && buf[..n] == m[..], "a filler message whole");
        }
    } else {
        let all: Vec<u8> = filler.concat();
        assert!(recv_exact(&xb, all.len()) == all);
    }
    for m in [&one, &two, &plain] {
        want.push(m.clone());
    }
    assert_eq!(xa.send(&plain, false, Some(LIMIT)).unwrap(), plain.len());
    if msg_mode {
        for (i, m) in want.iter().enumerate() {
            let mut buf = vec![0u8; 10_000];
            let (n, eor) = xb
                .recv(&mut buf, RecvFlags::default(), Some(LIMIT))
                .unwrap();
            assert!(eor, "message {i} whole");
            assert!(
                buf[..n] == m[..],
                "message {i} ({} bytes) in call order: got {n} bytes",
                m.len()
            );
        }
    } else {
        let all: Vec<u8> = want.concat();
        let got = recv_exact(&xb, all.len());
        assert!(
            got[..one.len()] == one[..],
            "the first asynchronous send first"
        );
        assert!(got == all, "bytes in call order");
    }
    let done = send_completions(&xa, 2);
    let got: Vec<_> = done.iter().map(|c| (c.cookie, c.result)).collect();
    assert_eq!(got, [(1, Ok(one.len())), (2, Ok(two.len()))]);
}

#[test]
fn a_plain_send_goes_behind_queued_asynchronous_sends() {
    plain_send_after_queued_aio_sends(false);
}

#[test]
fn a_plain_message_goes_behind_queued_asynchronous_messages() {
    plain_send_after_queued_aio_sends(true);
}

/// Reads `want` from `x`, then the end of stream.
fn read_then_eof(x: &XSocket, want: &[u8]) {
    let got = recv_exact(x, want.len());
    assert!(got == want, "the queued bytes before the end of stream");
    let mut buf = [0u8; 16];
    let (n, _) = x.recv(&mut buf, RecvFlags::default(), Some(LIMIT)).unwrap();
    assert_eq!(n, 0, "then the end of stream");
}

/// `shutdown(SHUT_WR)` after an asynchronous send still queued behind a
/// full window: the end of stream goes after its bytes (the reader gets
/// them all, then 0), a later send fails with `EPIPE` at once, and the
/// send completes whole.
#[test]
fn the_end_of_stream_goes_behind_a_queued_asynchronous_send() {
    let (a, b) = tcp_pair();
    let (xa, xb) = switch_both(&a, &b, &unbuffered());
    let filler = fill_window(&xa);
    let one = pattern(3000, 4);
    #[allow(unsafe_code)]
    // SAFETY: `one` lives until the completion is collected below.
    unsafe {
        xa.aio_send(one.as_ptr(), one.len(), 1).unwrap();
    }
    assert_eq!(xa.aio_pending(), 1, "waits for credits");
    xa.shutdown(false, true);
    let e = xa.send(b"late", true, None).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EPIPE), "{e}");
    let mut want = filler.concat();
    want.extend_from_slice(&one);
    let reader = std::thread::spawn(move || read_then_eof(&xb, &want));
    let done = send_completions(&xa, 1);
    assert_eq!((done[0].cookie, done[0].result), (1, Ok(one.len())));
    reader.join().unwrap();
}

/// `shutdown(SHUT_RDWR)` with an asynchronous send still queued behind a
/// full window (its end of stream waits behind it): the end is shut both
/// ways at once, as TCP's FIN_WAIT1 with `RCV_SHUTDOWN` (its FIN queued
/// behind unsent bytes), so bytes the peer sends now reset the
/// connection (Linux's `tcp_rcv_state_process`; RFC 2525 §2.17), and the
/// queued send completes with the reset; `POLLHUP` shows from the call
/// on. Fails with the "shut both ways"
/// point set only once the end of stream left (helper 61's review): the
/// bytes were taken in, unread, and nothing reset.
#[test]
fn bytes_after_a_shutdown_both_ways_behind_a_queued_send_reset() {
    let (a, b) = tcp_pair();
    let (xa, xb) = switch_both(&a, &b, &unbuffered());
    fill_window(&xa);
    let one = pattern(3000, 8);
    #[allow(unsafe_code)]
    // SAFETY: `one` lives until the completion is collected below.
    unsafe {
        xa.aio_send(one.as_ptr(), one.len(), 1).unwrap();
    }
    assert_eq!(xa.aio_pending(), 1, "waits for credits");
    xa.shutdown(true, true);
    // Shut both ways from the call, as Linux's `SHUTDOWN_MASK`: a hang-up.
    let r = xa.readiness();
    assert!(r.hup && r.rdhup, "{r:?}");
    assert_eq!(xb.send(b"late", false, Some(LIMIT)).unwrap(), 4);
    let t = Instant::now();
    while xa.error().is_none() {
        assert!(t.elapsed() < LIMIT, "no reset: the bytes were taken in");
        xa.progress();
        std::thread::yield_now();
    }
    let (errno, what) = xa.error().unwrap();
    assert_eq!(errno, libc::ECONNRESET, "{what}");
    assert!(what.contains("after this end shut both ways"), "{what}");
    let done = send_completions(&xa, 1);
    assert_eq!((done[0].cookie, done[0].result), (1, Err(libc::ECONNRESET)));
}

/// An orderly close after an asynchronous send still queued behind a full
/// window waits for its bytes, then sends the end of stream after them.
#[test]
fn a_close_waits_for_a_queued_asynchronous_send() {
    let (a, b) = tcp_pair();
    let (xa, xb) = switch_both(&a, &b, &unbuffered());
    let filler = fill_window(&xa);
    let one = pattern(3000, 5);
    #[allow(unsafe_code)]
    // SAFETY: `one` outlives `xa`'s close, which waits for the send (and
    // the engine reads no more after it).
    unsafe {
        xa.aio_send(one.as_ptr(), one.len(), 1).unwrap();
    }
    let mut want = filler.concat();
    want.extend_from_slice(&one);
    let reader = std::thread::spawn(move || read_then_eof(&xb, &want));
    assert!(xa.close(LIMIT), "everything left in time");
    reader.join().unwrap();
}

/// The peer's FIN (its process gone: no end-of-stream message, no error;
/// here a `shutdown(SHUT_WR)` of its TCP socket, which keeps reading, so
/// nothing resets) while an asynchronous send waits for credits that will
/// never come: it completes with `EPIPE` (not never), and a later
/// `aio_send` fails with `EPIPE`, as a plain send.
#[test]
fn a_queued_asynchronous_send_fails_when_the_peer_closes() {
    queued_send_at_the_peers_fin(false);
}

/// The same with this end's `SHUT_WR` made first, queued behind the send:
/// TCP's FIN_WAIT1 already, where the reset the lost bytes draw is
/// `ECONNRESET` (Linux's `tcp_reset`: `EPIPE` only in CLOSE_WAIT; helper
/// 62's review).
#[test]
fn a_queued_send_behind_our_shutdown_fails_with_the_reset_when_the_peer_closes() {
    queued_send_at_the_peers_fin(true);
}

fn queued_send_at_the_peers_fin(shut_first: bool) {
    let (a, b) = tcp_pair();
    let (xa, xb) = switch_both(&a, &b, &unbuffered());
    fill_window(&xa);
    let one = pattern(3000, 6);
    #[allow(unsafe_code)]
    // SAFETY: `one` lives until the completion is collected below.
    unsafe {
        xa.aio_send(one.as_ptr(), one.len(), 1).unwrap();
    }
    assert_eq!(xa.aio_pending(), 1, "waits for credits");
    if shut_first {
        xa.shutdown(false, true);
    }
    // SAFETY: a plain system call on `xb`'s TCP socket, open until the
    // end of the test.
    #[allow(unsafe_code)]
    let r = unsafe { libc::shutdown(xb.tcp_fd(), libc::SHUT_WR) };
    assert_eq!(r, 0);
    let done = send_completions(&xa, 1);
    let errno = if shut_first {
        libc::ECONNRESET
    } else {
        libc::EPIPE
    };
    assert_eq!((done[0].cookie, done[0].result), (1, Err(errno)));
    assert_eq!(xa.aio_pending(), 0);
    // A later one is refused with the connection's error.
    #[allow(unsafe_code)]
    // SAFETY: refused: nothing is queued.
    let e = unsafe { xa.aio_send(one.as_ptr(), one.len(), 2) }.unwrap_err();
    assert_eq!(e.raw_os_error(), Some(errno), "{e}");
}

/// A zero-length asynchronous send after one still queued behind a full
/// window completes after it, in call order (review r19-xaio, item 5: it
/// completed at once, ahead of the earlier one).
#[test]
fn a_zero_length_asynchronous_send_completes_in_call_order() {
    let (a, b) = tcp_pair();
    let (xa, xb) = switch_both(&a, &b, &unbuffered());
    let filler = fill_window(&xa);
    let one = pattern(3000, 7);
    #[allow(unsafe_code)]
    // SAFETY: `one` lives until the completions are collected below; the
    // second send has no bytes.
    unsafe {
        xa.aio_send(one.as_ptr(), one.len(), 1).unwrap();
        xa.aio_send(one.as_ptr(), 0, 2).unwrap();
    }
    let mut early = Vec::new();
    xa.aio_poll(&mut early, 8);
    assert!(
        early.is_empty(),
        "nothing completes ahead of the queued send: {early:?}"
    );
    assert_eq!(xa.aio_pending(), 2);
    let mut want = filler.concat();
    want.extend_from_slice(&one);
    let reader = std::thread::spawn(move || recv_exact(&xb, want.len()) == want);
    let done = send_completions(&xa, 2);
    let got: Vec<_> = done.iter().map(|c| (c.cookie, c.result)).collect();
    assert_eq!(got, [(1, Ok(one.len())), (2, Ok(0))]);
    assert!(reader.join().unwrap(), "the bytes in order");
}
