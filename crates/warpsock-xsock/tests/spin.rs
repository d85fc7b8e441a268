//! A busy-polling reader's empty rounds end short (issue 12: the engine's
//! read alone, `Cq::poll_news`, and no settle, `XSocket::settled`), or
//! take no round at all (a quiet socket's spin is the engine's read
//! alone, `XSocket::recv_quiet`: every spin here asks it first, as the
//! preload's receive does), and miss nothing a full round would do: the
//! credits its reads free go back to the peer, a send queued behind the
//! transmit window still goes, and the peer's message, end of stream,
//! Terminate or reset is seen.

use std::io::ErrorKind;
use std::sync::mpsc::channel;
use std::time::{Duration, Instant};

use warpsock_xsock::io::{RecvFlags, XSocket};

mod net;

use net::{
    opts, pattern, recv_exact, set_buf, spin_call, switch_both, tcp_pair, LIMIT, NONBLOCKING,
};

/// Empty rounds a reader spins once it has read everything (fewer than
/// the full round every 1,024 makes anyway; a test that fails only by
/// waiting out `LIMIT` may still pass on that round).
const SPINS: usize = 100;

/// A non-blocking receive into `buf` as the preload makes it.
fn spin_recv_call(x: &XSocket, buf: &mut [u8]) -> std::io::Result<(usize, bool)> {
    spin_call(x, &mut [buf], NONBLOCKING)
}

/// A non-blocking receive into `buf` (one spin): `None` on `EAGAIN`.
fn spin_once(x: &XSocket, buf: &mut [u8]) -> Option<usize> {
    match spin_recv_call(x, buf) {
        Ok((n, _)) => Some(n),
        Err(e) if e.kind() == ErrorKind::WouldBlock => None,
        Err(e) => panic!("spinning receive: {e}"),
    }
}

/// `n` bytes received by busy polling, `chunk` bytes a call at most.
fn spin_recv(x: &XSocket, n: usize, chunk: usize) -> Vec<u8> {
    let mut out = vec![0; n];
    let mut got = 0;
    let t = Instant::now();
    while got < n {
        assert!(t.elapsed() < LIMIT, "spun out with {got}/{n}");
        let end = (got + chunk).min(n);
        if let Some(k) = spin_once(x, &mut out[got..end]) {
            assert!(k > 0, "end of stream after {got}/{n}");
            got += k;
        }
    }
    out
}

/// A window of messages lands before the reader looks; it reads them in
/// 4-byte pieces, straight from its books, then spins while the writer,
/// left with one credit, sends a quarter window more: the credits must
/// have come back while the reader read and spun (each read flushes what
/// its consumption made due, `copy_out`; a spin settles what the books
/// still owe). (A data message needs two credits, or one with a credit
/// return of the writer's own to carry: a window is the slots but one.)
#[test]
fn a_spinning_reader_returns_the_credits_its_reads_free() {
    let (a, b) = tcp_pair();
    let o = opts();
    let window = u64::from(o.slots) - 1;
    let more = window + window / 4;
    let (xa, xb) = switch_both(&a, &b, &o);
    let (sent_tx, sent_rx) = channel::<()>();
    let (go_tx, go_rx) = channel::<()>();
    let xa = &xa;
    std::thread::scope(|sc| {
        let writer = sc.spawn(move || {
            for i in 0..window {
                xa.send(&pattern(8, i), false, Some(LIMIT)).unwrap();
            }
            sent_tx.send(()).unwrap();
            go_rx.recv_timeout(LIMIT).unwrap();
            for i in window..more {
                let r = xa.send(&pattern(8, i), false, Some(Duration::from_secs(5)));
                assert_eq!(r.ok(), Some(8), "message {i}: no credit came back");
            }
        });
        sent_rx.recv_timeout(LIMIT).unwrap();
        let all = spin_recv(&xb, 8 * window as usize, 4);
        for i in 0..window {
            let m = &all[8 * i as usize..][..8];
            assert_eq!(m, pattern(8, i), "message {i}");
        }
        for _ in 0..SPINS {
            assert_eq!(spin_once(&xb, &mut [0; 8]), None);
        }
        go_tx.send(()).unwrap();
        writer.join().unwrap();
    });
    for i in window..more {
        assert_eq!(recv_exact(&xb, 8), pattern(8, i), "message {i}");
    }
}

/// A writer whose bytes wait in the engine (the peer's socket buffers are
/// small and it does not read yet) and who then only busy-polls for the
/// answer: its spins write the backlog out, or the peer never gets the
/// bytes it answers.
#[test]
fn a_spinning_writer_sends_what_waits_behind_the_transmit_window() {
    let (a, b) = tcp_pair();
    set_buf(&a, libc::SO_SNDBUF, 8 << 10);
    set_buf(&b, libc::SO_RCVBUF, 8 << 10);
    let (xa, xb) = switch_both(&a, &b, &opts());
    let (len_tx, len_rx) = channel::<usize>();
    std::thread::scope(|sc| {
        sc.spawn(move || {
            let n = len_rx.recv_timeout(LIMIT).unwrap();
            assert_eq!(recv_exact(&xb, n), pattern(n, 3));
            xb.send(b"k", false, Some(LIMIT)).unwrap();
        });
        // Non-blocking sends of 8 KiB (copied into transmit slots) until
        // the credits or the slots refuse.
        let all = pattern(4 << 20, 3);
        let mut sent = 0;
        while let Ok(k @ 1..) = xa.send(&all[sent..sent + (8 << 10)], true, None) {
            sent += k;
        }
        assert!(sent > 64 << 10, "only {sent} bytes sent");
        len_tx.send(sent).unwrap();
        assert_eq!(spin_recv(&xa, 1, 1), b"k");
    });
}

/// The peer closes while the reader spins: a spin reads the end of
/// stream and returns 0.
#[test]
fn a_spinning_reader_sees_the_end_of_stream() {
    let (a, b) = tcp_pair();
    let (xa, xb) = switch_both(&a, &b, &opts());
    let (go_tx, go_rx) = channel::<()>();
    std::thread::scope(|sc| {
        sc.spawn(move || {
            go_rx.recv_timeout(LIMIT).unwrap();
            xa.send(b"last", false, Some(LIMIT)).unwrap();
            assert!(xa.close(LIMIT));
        });
        for _ in 0..SPINS {
            assert_eq!(spin_once(&xb, &mut [0; 8]), None);
        }
        go_tx.send(()).unwrap();
        assert_eq!(spin_recv(&xb, 4, 8), b"last");
        let t = Instant::now();
        loop {
            assert!(t.elapsed() < LIMIT, "no end of stream");
            if let Some(n) = spin_once(&xb, &mut [0; 8]) {
                assert_eq!(n, 0, "bytes after the last");
                break;
            }
        }
    });
}

/// A peer that breaks the sockets protocol spins for an answer: the
/// Terminate it is answered with ends its spin with `EPROTO`.
#[test]
fn a_spinning_protocol_breaker_sees_the_terminate() {
    let (a, b) = tcp_pair();
    let (xa, xb) = switch_both(&a, &b, &opts());
    xa.inject_raw_message(&[0x63, 0, 0, 0, 0, 0, 0, 0]);
    std::thread::scope(|sc| {
        sc.spawn(|| {
            let mut buf = [0u8; 8];
            xb.recv(&mut buf, RecvFlags::default(), Some(LIMIT))
                .unwrap_err()
        });
        let t = Instant::now();
        let e = loop {
            assert!(t.elapsed() < LIMIT, "no Terminate");
            match spin_recv_call(&xa, &mut [0; 8]) {
                Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                r => break r.unwrap_err(),
            }
        };
        assert_eq!(e.raw_os_error(), Some(libc::EPROTO), "{e}");
    });
    let (_, what) = xa.error().unwrap();
    assert!(what.contains("the peer terminated"), "{what}");
}

/// The peer's connection is reset while the reader spins: a spin's read
/// meets `ECONNRESET`, and the call returns it (the engine's round goes on
/// after the read that ended the connection: the flushed receives and the
/// `Closed` reach the socket).
#[test]
fn a_spinning_reader_sees_a_reset() {
    let (a, b) = tcp_pair();
    let (xa, xb) = switch_both(&a, &b, &opts());
    xb.send(b"one", false, Some(LIMIT)).unwrap();
    assert_eq!(spin_recv(&xa, 3, 8), b"one");
    for _ in 0..SPINS {
        assert_eq!(spin_once(&xa, &mut [0; 8]), None);
    }
    net::reset(b, &xb);
    let t = Instant::now();
    let e = loop {
        assert!(t.elapsed() < LIMIT, "no reset seen");
        match spin_recv_call(&xa, &mut [0; 8]) {
            Err(e) if e.kind() == ErrorKind::WouldBlock => {}
            r => break r.expect_err("bytes or the end of stream after a reset"),
        }
    };
    assert_eq!(e.raw_os_error(), Some(libc::ECONNRESET), "{e}");
    drop(xb);
}
