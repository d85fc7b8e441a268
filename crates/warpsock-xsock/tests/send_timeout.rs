//! A blocking zero-copy send (`zcopy_min` bytes or more) with a timeout
//! (`SO_SNDTIMEO`) against a peer that stopped reading returns at its
//! timeout with the bytes it handed over, as TCP's send with its bytes in
//! the kernel: the requests the engine has not read yet go out from
//! private copies (`Mr::keep_private_copy`), so the caller's buffer is its
//! own again, and the peer, reading later, gets every byte as it was.
//! Before, the call waited for the engine to finish reading the caller's
//! buffer, with no bound: for as long as the peer did not read (helper
//! 68's review).

use std::sync::mpsc::channel;
use std::time::{Duration, Instant};

use std::net::TcpStream;

use warpsock_xsock::io::{Completion, Options, RecvFlags, XSocket};

mod net;

use net::{await_aio_sink, opts, pattern, set_buf, switch_both, tcp_pair, LIMIT};

#[test]
fn a_timed_zero_copy_send_returns_and_its_bytes_still_arrive() {
    let (a, b) = tcp_pair();
    // Small kernel buffers at both ends: the credits (16 x 256 KiB) are
    // more than the kernels hold while the peer does not read.
    set_buf(&b, libc::SO_RCVBUF, 64 << 10);
    set_buf(&a, libc::SO_SNDBUF, 64 << 10);
    let (xa, xb) = switch_both(&a, &b, &opts());
    let want = pattern(4 << 20, 21);
    let mut data = want.clone();
    let (tx, rx) = channel();
    let sent = std::thread::scope(|sc| {
        let (data, xa) = (&data, &xa);
        sc.spawn(move || {
            let r = xa.send(data, false, Some(Duration::from_secs(1)));
            let _ = tx.send(r.map_err(|e| e.raw_os_error()));
        });
        rx.recv_timeout(LIMIT).map_err(|_| {
            // Unblocks the call (bounded), for the scope to end.
            let mut buf = vec![0u8; 1 << 20];
            for _ in 0..400 {
                let _ = xb.recv(
                    &mut buf,
                    RecvFlags::default(),
                    Some(Duration::from_millis(50)),
                );
                if rx.try_recv().is_ok() {
                    break;
                }
            }
        })
    });
    let n = match sent {
        Ok(Ok(n)) => n,
        other => panic!("the timed send: {other:?} (Err(()): still blocked after {LIMIT:?})"),
    };
    assert!(n > 0 && n <= want.len(), "{n} bytes sent");
    // The caller's buffer is its own again: changed, then gone.
    data.fill(0xEE);
    drop(data);
    // The peer reads on: every byte handed over, as it was. In small
    // reads (copies: a sink would wait for the sender, which no call
    // drives while the reader waits), the sender's engine driven between
    // them to send the rest as the window opens.
    let mut got = vec![0u8; n];
    let mut at = 0;
    let t = Instant::now();
    while at < n {
        assert!(t.elapsed() < LIMIT, "the peer got {at} of {n} bytes");
        xa.progress();
        let end = n.min(at + (16 << 10));
        match xb.recv(
            &mut got[at..end],
            RecvFlags::default(),
            Some(Duration::from_millis(20)),
        ) {
            Ok((0, _)) => panic!("end of stream after {at} of {n} bytes"),
            Ok((k, _)) => at += k,
            Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::WouldBlock, "{e}"),
        }
    }
    assert!(
        got == want[..n],
        "the bytes the peer got differ from those sent"
    );
}

/// The window of timed zero-copy sends at the default send buffer.
const WINDOW: usize = 4 << 20;

/// A switched pair whose reader `xb` offered a sink of `len` bytes (an
/// asynchronous receive into `sink`) that `xa`'s sends write into, and
/// small kernel buffers at both ends: once nothing drives `xb`, the
/// stream stalls after a few hundred KiB.
struct Stalled {
    xa: XSocket,
    xb: XSocket,
    /// The receive's completions, collected by `aio_poll`.
    done: Vec<Completion>,
    /// The receive's buffer: dropped after the sockets.
    sink: Vec<u8>,
    _tcp: (TcpStream, TcpStream),
}

impl Stalled {
    fn new(len: usize) -> Self {
        let (a, b) = tcp_pair();
        set_buf(&b, libc::SO_RCVBUF, 64 << 10);
        set_buf(&a, libc::SO_SNDBUF, 64 << 10);
        let o = Options {
            sinks: true,
            ..opts()
        };
        let (xa, xb) = switch_both(&a, &b, &o);
        let mut sink = vec![0u8; len];
        // SAFETY: `sink` outlives the receive: the sockets are dropped
        // first (the fields' order), and the test reads it only once the
        // receive completed.
        unsafe { xb.aio_recv(sink.as_mut_ptr(), sink.len(), 9) }.unwrap();
        let mut done = Vec::new();
        await_aio_sink(&xa, &xb, &mut done);
        Self {
            xa,
            xb,
            done,
            sink,
            _tcp: (a, b),
        }
    }

    /// The bytes timed sends left to copies, checked against the window.
    fn check_held(&self, what: &str) {
        let held = self.xa.send_copies_held();
        assert!(held <= WINDOW, "{held} bytes held in copies ({what})");
    }
}

/// A peer that offered a vast sink (a 64 MiB asynchronous receive) and
/// then stopped reading (nothing drives its socket): timed zero-copy sends
/// of 16 MiB each leave at most the window (4 MiB: the send buffer's
/// bound, at least 4 MiB) to private copies, however many are made — the
/// first returns with what it posted, the next ones find the window full
/// and fail with `EAGAIN` at their timeout, as TCP's with a full send
/// buffer. Every byte a call returned for still arrives, in order, once
/// the peer reads. Before, each call posted its whole 16 MiB into the
/// sink and copied what the engine had not sent: 16 MiB held per call.
#[test]
fn timed_zero_copy_sends_into_a_stalled_sink_hold_a_bounded_copy() {
    let mut p = Stalled::new(64 << 20);
    let want = pattern(64 << 20, 23);
    let mut sent = 0;
    let mut refused = 0;
    for _ in 0..3 {
        let part = &want[sent..sent + (16 << 20)];
        match p.xa.send(part, false, Some(Duration::from_millis(200))) {
            Ok(n) => sent += n,
            Err(e) => {
                assert_eq!(e.raw_os_error(), Some(libc::EAGAIN), "{e}");
                refused += 1;
            }
        }
        p.check_held(&format!("{sent} bytes sent"));
    }
    assert!(sent > 0 && sent < 16 << 20, "{sent} bytes sent");
    assert!(refused >= 1, "no call found the window full");
    // The peer reads: the receive completes with the bytes placed so far,
    // ordinary reads give the rest.
    p.xa.shutdown(false, true);
    let t = Instant::now();
    while p.done.is_empty() {
        assert!(t.elapsed() < LIMIT, "the receive never completed");
        p.xa.progress();
        p.xb.aio_poll(&mut p.done, 1);
        std::thread::yield_now();
    }
    let n = p.done[0].result.expect("the receive");
    let mut got = p.sink[..n].to_vec();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        assert!(
            t.elapsed() < LIMIT,
            "the peer got {} of {sent} bytes",
            got.len()
        );
        p.xa.progress();
        match p.xb.recv(
            &mut buf,
            RecvFlags::default(),
            Some(Duration::from_millis(20)),
        ) {
            Ok((0, _)) => break,
            Ok((k, _)) => got.extend_from_slice(&buf[..k]),
            Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::WouldBlock, "{e}"),
        }
    }
    assert_eq!(got.len(), sent, "bytes received");
    assert!(
        got == want[..sent],
        "the bytes the peer got differ from those sent"
    );
}

/// The window is the socket's, not each call's: two threads' timed
/// zero-copy sends into the stalled sink hold one window of copies
/// between them (helper 71's review: a call waiting for room lets the
/// lock go, and the other thread's call found a window of its own —
/// 8 MiB held).
#[test]
fn concurrent_timed_sends_share_one_window() {
    let p = Stalled::new(64 << 20);
    let data = pattern(16 << 20, 24);
    std::thread::scope(|sc| {
        for _ in 0..2 {
            let (xa, data) = (&p.xa, &data);
            sc.spawn(move || {
                let r = xa.send(data, false, Some(Duration::from_millis(500)));
                if let Err(e) = r {
                    assert_eq!(e.raw_os_error(), Some(libc::EAGAIN), "{e}");
                }
            });
        }
    });
    p.check_held("two threads");
}

/// A copy is held whole until its call's last request completes: a peer
/// that reads slowly, completing an orphan's first requests, reopens no
/// room while that copy is held (helper 71's review: the room counted an
/// orphan's bytes still in flight, and new calls' copies piled on the
/// old: 6-7 MiB held).
#[test]
fn a_slow_reader_does_not_stack_copies_past_the_window() {
    let p = Stalled::new(256 << 20);
    let data = pattern(16 << 20, 25);
    for i in 0..2000 {
        if i % 20 == 0 {
            let r = p.xa.send(&data, false, Some(Duration::from_millis(5)));
            if let Err(e) = r {
                assert_eq!(e.raw_os_error(), Some(libc::EAGAIN), "{e}");
            }
        } else {
            p.xa.progress();
            p.xb.progress();
        }
        p.check_held(&format!("turn {i}"));
    }
}
