//! Stream-mode send buffering past the credits (issue 12): a send that
//! finds too few credits copies its bytes into the socket's send buffer
//! and returns, as TCP's does, so a client that pipelines many small
//! requests before it reads an answer does not deadlock against a
//! one-thread server (each 8 B answer takes one of the client's receive
//! slots whole; TCP's buffers count bytes, not messages).

use std::sync::atomic::Ordering;
use std::thread;
use std::time::Instant;

use warpsock_xsock::io::{Options, RecvFlags, XSocket};

mod net;

use net::{opts, pattern, recv_exact, switch_both, tcp_pair, LIMIT};

/// Request `i`: a length byte, then `len - 1` bytes of pattern `i`
/// (8 to 64 bytes in all).
fn request(i: usize) -> Vec<u8> {
    let len = 8 + (i * 7) % 57;
    let mut r = vec![len as u8];
    r.extend(pattern(len - 1, i as u64));
    r
}

/// The server's answer to request `req`: its bytes reversed, each plus
/// one (the answer names the request it answers).
fn answer(req: &[u8]) -> Vec<u8> {
    req.iter().rev().map(|b| b.wrapping_add(1)).collect()
}

/// Reads `x` to its end of stream in reads of `chunk` bytes (each bounded
/// by [`LIMIT`]); at most `max` bytes.
fn read_to_end(x: &XSocket, chunk: usize, max: usize) -> Vec<u8> {
    let mut got = Vec::new();
    let mut buf = vec![0u8; chunk];
    loop {
        let (n, _) = x.recv(&mut buf, RecvFlags::default(), Some(LIMIT)).unwrap();
        if n == 0 {
            return got;
        }
        got.extend_from_slice(&buf[..n]);
        assert!(got.len() <= max, "more bytes than written");
    }
}

/// The next read of `x` is its end of stream.
fn expect_eof(x: &XSocket, what: &str) {
    let mut end = [0u8; 8];
    let (k, _) = x.recv(&mut end, RecvFlags::default(), Some(LIMIT)).unwrap();
    assert_eq!(k, 0, "{what}");
}

/// A blocking one-thread server: reads a request, writes its answer,
/// `n` times, then closes (orderly: the close lingers until every
/// buffered answer has left). Every call bounded by [`LIMIT`] (a hang
/// fails the test).
fn serve(x: &XSocket, n: usize) {
    for i in 0..n {
        let head = recv_exact(x, 1);
        let mut req = head.clone();
        req.extend(recv_exact(x, usize::from(head[0]) - 1));
        let a = answer(&req);
        let sent = x
            .send(&a, false, Some(LIMIT))
            .unwrap_or_else(|e| panic!("server's answer {i}: {e}"));
        assert_eq!(sent, a.len(), "answer {i} whole");
    }
    assert!(x.close(LIMIT), "the server's answers all left");
}

/// The client writes all `n` requests (blocking sends bounded by
/// [`LIMIT`]), then reads every answer and checks each by content, then
/// the end of stream.
fn pipeline(o: &Options, n: usize) {
    let (a, b) = tcp_pair();
    let (xa, xb) = switch_both(&a, &b, o);
    thread::scope(|sc| {
        let server = sc.spawn(|| serve(&xb, n));
        for i in 0..n {
            let r = request(i);
            let sent = xa
                .send(&r, false, Some(LIMIT))
                .unwrap_or_else(|e| panic!("client's request {i}: {e}"));
            assert_eq!(sent, r.len(), "request {i} whole");
        }
        for i in 0..n {
            let want = answer(&request(i));
            let got = recv_exact(&xa, want.len());
            assert!(got == want, "answer {i} by content");
        }
        expect_eof(&xa, "the end of stream after the answers");
        server.join().unwrap();
    });
}

#[test]
fn a_client_that_pipelines_two_thousand_requests_does_not_deadlock() {
    pipeline(&opts(), 2000);
}

/// The same through tiny slots: the buffered bytes go out in many
/// coalesced messages of a slot's payload (the send buffer, 512 KiB, holds
/// every request — 2,000 of ~36 bytes, each call's run charged its
/// bookkeeping too, review r21-send #4: 128 KiB no longer did — past it a
/// blocking send waits, as over TCP, where a client that pipelines more
/// than both buffers hold deadlocks too).
#[test]
fn pipelining_through_tiny_slots() {
    let o = Options {
        slots: 4,
        slot_size: Options::slot_size_for(256),
        sndbuf: 512 << 10,
        ..opts()
    };
    pipeline(&o, 2000);
}

/// Non-blocking sends to a peer that does not read yet: the window fills,
/// the rest is buffered (every call takes all its bytes); then a close in
/// the writer's thread drains the buffer and sends the end of stream after
/// it, while the reader reads with reads of another size: bytes and order
/// kept exactly, then 0.
#[test]
fn buffered_bytes_then_the_end_of_stream() {
    let (a, b) = tcp_pair();
    let (xa, xb) = switch_both(&a, &b, &opts());
    let all: Vec<u8> = (0..3000).flat_map(request).collect();
    for i in 0..3000 {
        let r = request(i);
        assert_eq!(xa.send(&r, true, None).unwrap(), r.len(), "request {i}");
    }
    thread::scope(|sc| {
        let writer = sc.spawn(|| assert!(xa.close(LIMIT), "everything left"));
        let got = read_to_end(&xb, 777, all.len());
        assert!(got == all, "bytes and order kept");
        writer.join().unwrap();
    });
}

/// Non-blocking 4,000-byte sends to a peer that does not read: the
/// window fills, then the 64 KiB send buffer; the call that finds less
/// room than it has takes what fits (a partial count, as TCP's; none if
/// the room left is no more than a run's bookkeeping, which the bound
/// charges too), the next gets `EAGAIN` — the buffer never grows past its
/// bound. Returns the bytes taken.
fn fill_window_and_buffer(xa: &XSocket) -> Vec<u8> {
    let mut taken = Vec::new();
    let mut partial = 0;
    for i in 0..1000u64 {
        let m = pattern(4000, 500 + i);
        match xa.send(&m, true, None) {
            Ok(n) => {
                assert!(n > 0 && n <= m.len());
                if n < m.len() {
                    partial += 1;
                }
                taken.extend_from_slice(&m[..n]);
            }
            Err(e) => {
                assert_eq!(e.raw_os_error(), Some(libc::EAGAIN), "{e}");
                assert!(partial <= 1, "one call at most took part of its bytes");
                return taken;
            }
        }
    }
    panic!("the send buffer never filled");
}

fn small_buffer() -> Options {
    Options {
        sndbuf: 64 << 10,
        ..opts()
    }
}

/// A blocking send waits while the send buffer is full; another thread
/// shuts the write side meanwhile: the waiting send fails with `EPIPE`
/// (as a TCP send blocked in `sk_stream_wait_memory`), and the reader
/// gets every byte buffered before the shutdown, then the end of stream.
/// The test waits for the sender to be parked (its socket's wait
/// counter), not for a time.
#[test]
fn a_send_blocked_on_a_full_buffer_fails_with_epipe_when_the_write_side_shuts() {
    let (a, b) = tcp_pair();
    let (xa, xb) = switch_both(&a, &b, &small_buffer());
    let taken = fill_window_and_buffer(&xa);
    let waits = xa.stats().waits.load(Ordering::Relaxed);
    thread::scope(|sc| {
        let sender = sc.spawn(|| xa.send(&[9u8; 100], false, Some(LIMIT)));
        let t = Instant::now();
        while xa.stats().waits.load(Ordering::Relaxed) == waits {
            assert!(t.elapsed() < LIMIT, "the send never waited");
            assert!(!sender.is_finished(), "the send did not block");
            thread::yield_now();
        }
        xa.shutdown(false, true);
        let e = sender.join().unwrap().unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EPIPE), "{e}");
    });
    // The writer's end is driven by its close (no progress thread here).
    thread::scope(|sc| {
        let writer = sc.spawn(|| assert!(xa.close(LIMIT), "everything left"));
        let got = recv_exact(&xb, taken.len());
        assert!(got == taken, "the buffered bytes, in order");
        expect_eof(&xb, "then the end of stream");
        writer.join().unwrap();
    });
}

/// A message-mode reader behind a sender in stream mode (message mode is
/// the reader's setting): 40 non-blocking sends of 100 B before the first
/// read, most of them buffered, then 40 reads — each one send, whole,
/// with `MSG_EOR`, never two in one (review r20-xbuf S1: a buffered run
/// held many calls under one end mark).
#[test]
fn a_message_mode_reader_reads_each_buffered_send_alone() {
    let (a, b) = tcp_pair();
    let (xa, xb) = switch_both(&a, &b, &opts());
    xb.set_msg_mode(true);
    let sent: Vec<Vec<u8>> = (0..40).map(|i| pattern(100, i)).collect();
    for m in &sent {
        assert_eq!(xa.send(m, true, None).unwrap(), m.len());
    }
    thread::scope(|sc| {
        let writer = sc.spawn(|| assert!(xa.close(LIMIT), "everything left"));
        for (i, m) in sent.iter().enumerate() {
            let mut buf = [0u8; 300];
            let (n, eor) = xb
                .recv(&mut buf, RecvFlags::default(), Some(LIMIT))
                .unwrap();
            assert!(eor && buf[..n] == m[..], "send {i} alone, whole ({n} B)");
        }
        expect_eof(&xb, "then the end of stream");
        writer.join().unwrap();
    });
}

/// A blocking copied send of 60 KiB past the credits, to a message-mode
/// reader, through a 16 KiB send buffer: part is buffered while the call
/// waits, the rest goes after it — and the reader still reads the send
/// as one message with `MSG_EOR`, no false end where the buffered part
/// stops (review r20-xbuf S1).
#[test]
fn a_send_buffered_in_part_keeps_one_end() {
    let (a, b) = tcp_pair();
    let o = Options {
        sndbuf: 16 << 10,
        zcopy_min: 1 << 20,
        ..opts()
    };
    let (xa, xb) = switch_both(&a, &b, &o);
    xb.set_msg_mode(true);
    // The credits taken by small sends the reader reads first.
    let small: Vec<Vec<u8>> = (0..15).map(|i| pattern(10, 50 + i)).collect();
    for m in &small {
        assert_eq!(xa.send(m, true, None).unwrap(), m.len());
    }
    let big = pattern(60 << 10, 60);
    let waits = xa.stats().waits.load(Ordering::Relaxed);
    thread::scope(|sc| {
        let sender = sc.spawn(|| xa.send(&big, false, Some(LIMIT)));
        let t = Instant::now();
        while xa.stats().waits.load(Ordering::Relaxed) == waits && !sender.is_finished() {
            assert!(t.elapsed() < LIMIT, "the send never waited");
            thread::yield_now();
        }
        let mut buf = vec![0u8; 128 << 10];
        for (i, m) in small.iter().enumerate() {
            let (n, eor) = xb
                .recv(&mut buf, RecvFlags::default(), Some(LIMIT))
                .unwrap();
            assert!(eor && buf[..n] == m[..], "small send {i}");
        }
        let (n, eor) = xb
            .recv(&mut buf, RecvFlags::default(), Some(LIMIT))
            .unwrap();
        assert_eq!(
            (n, eor),
            (big.len(), true),
            "the 60 KiB send as one message"
        );
        assert!(buf[..n] == big[..]);
        assert_eq!(sender.join().unwrap().unwrap(), big.len());
    });
}

/// The pipelining client and its one-thread server in message mode: one
/// read per request and per answer, each whole with `MSG_EOR`.
#[test]
fn a_message_mode_client_that_pipelines_does_not_deadlock() {
    const N: usize = 2000;
    let (a, b) = tcp_pair();
    let (xa, xb) = switch_both(&a, &b, &opts());
    xa.set_msg_mode(true);
    xb.set_msg_mode(true);
    let read_one = |x: &XSocket| {
        let mut buf = [0u8; 128];
        let (n, eor) = x.recv(&mut buf, RecvFlags::default(), Some(LIMIT)).unwrap();
        assert!(eor, "one message per read");
        buf[..n].to_vec()
    };
    thread::scope(|sc| {
        let server = sc.spawn(|| {
            for i in 0..N {
                let req = read_one(&xb);
                assert!(req == request(i), "request {i} whole");
                let a = answer(&req);
                assert_eq!(xb.send(&a, false, Some(LIMIT)).unwrap(), a.len());
            }
            assert!(xb.close(LIMIT), "the server's answers all left");
        });
        for i in 0..N {
            let r = request(i);
            assert_eq!(
                xa.send(&r, false, Some(LIMIT)).unwrap(),
                r.len(),
                "request {i}"
            );
        }
        for i in 0..N {
            assert!(read_one(&xa) == answer(&request(i)), "answer {i} whole");
        }
        expect_eof(&xa, "the end of stream after the answers");
        server.join().unwrap();
    });
}

/// Buffered bytes read with large reads (at least `zcopy_min`, on an
/// empty queue: each offers its buffer as a sink): a sink the writer
/// takes while bytes wait in its send buffer is filled with those bytes,
/// the next in the stream, and every byte arrives once, in order.
#[test]
fn buffered_bytes_read_through_sinks() {
    let (a, b) = tcp_pair();
    let (xa, xb) = switch_both(&a, &b, &opts());
    let data = pattern(600 << 10, 77);
    let mut off = 0;
    // 15 small messages take the credits, then 4 KiB calls fill the
    // buffer with most of the rest.
    for _ in 0..15 {
        assert_eq!(xa.send(&data[off..off + 10], true, None).unwrap(), 10);
        off += 10;
    }
    while off < data.len() {
        let end = (off + 4096).min(data.len());
        assert_eq!(xa.send(&data[off..end], true, None).unwrap(), end - off);
        off = end;
    }
    thread::scope(|sc| {
        let writer = sc.spawn(|| assert!(xa.close(LIMIT), "everything left"));
        let got = read_to_end(&xb, 96 << 10, data.len());
        assert!(got == data, "bytes and order kept");
        writer.join().unwrap();
    });
}

/// Reads `x` to its end: every byte must be a prefix of `sent`, and the
/// end is either all of it then 0, or an error — never 0 after a short
/// stream. Returns whether the stream ended in an error.
fn all_or_an_error(x: &XSocket, sent: &[u8]) -> bool {
    let mut got = Vec::new();
    let mut buf = vec![0u8; 64 << 10];
    loop {
        match x.recv(&mut buf, RecvFlags::default(), Some(LIMIT)) {
            Ok((0, _)) => {
                assert!(
                    got == sent,
                    "a clean end after {} of {} bytes",
                    got.len(),
                    sent.len()
                );
                return false;
            }
            Ok((n, _)) => {
                got.extend_from_slice(&buf[..n]);
                assert!(got[..] == sent[..got.len()], "bytes in order");
            }
            Err(e) => {
                assert_ne!(e.raw_os_error(), Some(libc::EAGAIN), "{e}");
                return true;
            }
        }
    }
}

/// A close whose linger runs out with bytes still buffered (the reader
/// does not read meanwhile): the connection is reset, so the reader gets
/// the bytes that were sent and then an error — not a clean end after a
/// short stream (review r20-xbuf S2). The close's own bound orders it.
#[test]
fn a_close_that_gives_up_on_buffered_bytes_resets_the_connection() {
    let (a, b) = tcp_pair();
    let (xa, xb) = switch_both(&a, &b, &opts());
    let data = pattern(40 * 4096, 41);
    for c in data.chunks(4096) {
        assert_eq!(xa.send(c, true, None).unwrap(), c.len());
    }
    assert!(
        !xa.close(std::time::Duration::from_millis(100)),
        "it gave up"
    );
    assert!(all_or_an_error(&xb, &data), "the reader sees the loss");
}
