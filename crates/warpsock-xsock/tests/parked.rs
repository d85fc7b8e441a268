//! The blocking receive's predicted take (issue 12,
//! `io/wait/predicted.rs`): a blocking receive of a small buffer with no
//! timeout parks in the engine's read, and when that read brings one
//! whole FPDU — a DATA message that fits the buffer — takes it where the
//! read put it, with no completion. Everything else goes the usual way,
//! with the same result: two messages in one read, a buffer shorter than
//! the message.
//!
//! The receives here are blocking with no timeout (the straight path
//! declines a timed one). A peer thread that fails drops its socket, which
//! ends the reader's wait (the end of the stream): no hang.

use std::io::Write;
use std::net::{TcpListener, TcpStream};
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Instant;

use warpsock_xsock::io::{switch_fd_as, Options, RecvFlags, XSocket};
use warpsock_xsock::Role;

mod net;

use net::{opts, pattern, switch_both, tcp_pair, LIMIT};

/// A blocking receive with no flag, with `SO_RCVTIMEO` [`LIMIT`] if
/// `TIMED` (the benchmark's reads carry one): the straight path's.
fn recv_blocking_as<const TIMED: bool>(x: &XSocket, buf: &mut [u8]) -> (usize, bool) {
    x.recv(buf, RecvFlags::default(), TIMED.then_some(LIMIT))
        .expect("blocking receive")
}

/// A blocking receive with no flag and no timeout.
fn recv_blocking(x: &XSocket, buf: &mut [u8]) -> (usize, bool) {
    recv_blocking_as::<false>(x, buf)
}

/// Waits (bounded by [`LIMIT`]) until `x`'s receive drives the engine,
/// parked or about to park in its read.
fn until_parked(x: &XSocket, what: &str) {
    let t = Instant::now();
    while !x.parked() {
        assert!(t.elapsed() < LIMIT, "{what}: the reader never parked");
        std::thread::yield_now();
    }
}

/// Drives `x` (bounded by [`LIMIT`]) until it owes its socket nothing:
/// established (a responder took in the initiator's first FPDU) and every
/// message it queued written. The engines here are caller-driven (no
/// progress thread): a send that could not go at once returns with its
/// message queued, written only by a later call on `x` — and the writers
/// here make none until the reader has the message. A responder's Send
/// waits for the initiator's first FPDU (RFC 6581): with a forwarder
/// between the ends, slow to pass that FPDU on under load, the writer's
/// wait timed out, its `x` dropped, and the reader saw the end of stream
/// in message 0's place (`a_split_fpdu_is_one_wait_of_the_receive`, 15
/// runs in 300 under two CPU hogs). Owing nothing, `x` asks no progress
/// thread to watch its socket (`io/watch.rs`).
fn until_owes_nothing(x: &XSocket, what: &str) {
    let t = Instant::now();
    loop {
        x.progress();
        if x.watching() == XSocket::WATCH_OFF {
            return;
        }
        assert!(
            t.elapsed() < LIMIT,
            "{what}: the socket still owes its peer"
        );
        std::thread::yield_now();
    }
}

/// Waits (bounded by [`LIMIT`]) until the peer's TCP acknowledged every
/// byte `x` wrote to its socket (`SIOCOUTQ` 0): those bytes are in the
/// peer's TCP receive queue, unless a call on the peer read them since.
/// (After [`until_owes_nothing`]: the engine wrote everything it had.)
fn until_acked(x: &XSocket, what: &str) {
    let t = Instant::now();
    loop {
        let mut n: libc::c_int = 0;
        // SAFETY: SIOCOUTQ (= TIOCOUTQ) writes one int.
        let r = unsafe { libc::ioctl(x.tcp_fd(), libc::TIOCOUTQ, &mut n) };
        assert_eq!(r, 0, "{what}: SIOCOUTQ");
        if n == 0 {
            return;
        }
        assert!(t.elapsed() < LIMIT, "{what}: {n} bytes never acknowledged");
        std::thread::yield_now();
    }
}

/// `rounds` 8 B messages from `xb` to `xa`, each sent once `xa` took the
/// one before and its next blocking receive is parked (so its read brings
/// that one FPDU alone), in stream or message mode: every byte and
/// boundary, and how many `xa` took through the predicted take.
fn lone_messages<const TIMED: bool>(o: &Options, msg_mode: bool, rounds: u64) -> u64 {
    let (a, b) = tcp_pair();
    let (xa, xb) = switch_both(&a, &b, o);
    xa.set_msg_mode(msg_mode);
    xb.set_msg_mode(msg_mode);
    until_owes_nothing(&xb, "the responder");
    let before = xa.parked_predictions();
    let (took, next) = mpsc::channel::<()>();
    std::thread::scope(|s| {
        let xa = &xa;
        s.spawn(move || {
            for i in 0..rounds {
                if i > 0 {
                    next.recv_timeout(LIMIT).expect("the reader stopped");
                }
                until_parked(xa, &format!("message {i}"));
                xb.send(&pattern(8, i), false, Some(LIMIT)).expect("send");
            }
            // `xb` dropped here: `xa`'s next receive sees the end.
        });
        for i in 0..rounds {
            let mut buf = [0; 64];
            let (n, eor) = recv_blocking_as::<TIMED>(xa, &mut buf);
            let at = format!("message {i}, message mode {msg_mode}, timed {TIMED}");
            assert_eq!(buf[..n], pattern(8, i)[..], "{at}");
            assert_eq!(eor, msg_mode, "{at}: the message's end");
            // The writer is gone after the last (its failure shows as
            // the end of stream above).
            let _ = took.send(());
        }
        assert_eq!(recv_blocking(xa, &mut [0; 8]).0, 0, "the end of stream");
    });
    xa.parked_predictions() - before
}

/// A lone 8 B message that lands in a parked blocking receive is taken
/// through the predicted take, CRC off and on, in stream and message
/// mode, with and without `SO_RCVTIMEO`: every message, and all but the
/// first few predicted (the first
/// FPDU of an end is the core's general path's: it makes the connection
/// established; a credit's return may share a read with a message).
/// Fails with the take never made (`parked_predictions` 0), or its books
/// wrong (a later message lost, or the stream stalled for want of a
/// slot reposted: 40 messages pass through 16 slots several times).
#[test]
fn a_parked_receive_takes_a_lone_message_where_the_read_put_it() {
    for crc in [false, true] {
        for msg_mode in [false, true] {
            let o = Options { crc, ..opts() };
            for (timed, taken) in [
                (false, lone_messages::<false>(&o, msg_mode, 40)),
                (true, lone_messages::<true>(&o, msg_mode, 40)),
            ] {
                assert!(
                    taken >= 30,
                    "CRC {crc}, message mode {msg_mode}, timed {timed}: {taken} of 40 predicted"
                );
            }
        }
    }
}

/// What the predicted take declines goes the usual way, with the usual
/// result: two messages that one read brings (the first returned, the
/// second read from the books with no wait), and a message longer than
/// the buffer (the stream's first bytes, then the rest) — none of them
/// predicted.
///
/// The two messages are sent while the reader makes no call on `xa` (it
/// took every warm-up message and waits for the word), and the word comes
/// once both are in `xa`'s TCP receive queue ([`until_acked`]): then its
/// next read brings both. (They were sent as soon as the last warm-up
/// message was: under load the reader's warm-up read could come between
/// the two sends and bring the first alone, its receive take that one
/// from the books, and the next parked read bring the second alone — one
/// whole FPDU into a buffer it fits, the predicted take's, rightly: 20
/// runs in 500 under two CPU hogs. Unloaded, both were mostly read in the
/// warm-up's reads, and no read of the two came to the take at all.)
#[test]
fn a_parked_read_it_cannot_take_alone_is_received_as_usual() {
    let (a, b) = tcp_pair();
    let (xa, xb) = switch_both(&a, &b, &opts());
    let (go, sent) = mpsc::channel::<()>();
    let (warm, warmed) = mpsc::channel::<()>();
    std::thread::scope(|s| {
        let xa = &xa;
        s.spawn(move || {
            // Warm up: the first FPDUs are the general path's anyway.
            for i in 0..4 {
                until_parked(xa, "warm-up");
                xb.send(&pattern(8, i), false, Some(LIMIT)).expect("send");
            }
            // Two messages in one go, sent before the reader's receive,
            // while nothing reads `xa`'s socket: the reader took the
            // warm-up and makes no call until `go`.
            warmed.recv_timeout(LIMIT).expect("the reader stopped");
            let two = [pattern(8, 10), pattern(8, 11)].concat();
            xb.send(&two[..8], false, Some(LIMIT)).expect("send");
            xb.send(&two[8..], false, Some(LIMIT)).expect("send");
            until_owes_nothing(&xb, "the two messages");
            until_acked(&xb, "the two messages");
            go.send(()).expect("reader gone");
            // A 16 B message into the reader's 4 B buffer.
            until_parked(xa, "the long message");
            xb.send(&pattern(16, 12), false, Some(LIMIT)).expect("send");
        });
        for i in 0..4 {
            let mut buf = [0; 8];
            assert_eq!(recv_blocking(xa, &mut buf), (8, false));
            assert_eq!(buf[..], pattern(8, i)[..], "warm-up {i}");
        }
        warm.send(()).expect("the writer stopped");
        sent.recv_timeout(LIMIT).expect("the two messages");
        let before = xa.parked_predictions();
        // Both in the socket, neither read yet: the engine's read, when
        // the receive parks, brings both FPDUs.
        let mut buf = [0; 8];
        assert_eq!(recv_blocking(xa, &mut buf), (8, false));
        assert_eq!(buf[..], pattern(8, 10)[..], "the first of two");
        assert_eq!(recv_blocking(xa, &mut buf), (8, false));
        assert_eq!(buf[..], pattern(8, 11)[..], "the second of two");
        let mut got = Vec::new();
        while got.len() < 16 {
            let mut small = [0; 4];
            let (n, _) = recv_blocking(xa, &mut small);
            assert!(n > 0, "the end of stream inside the long message");
            got.extend_from_slice(&small[..n]);
        }
        assert_eq!(got, pattern(16, 12), "the long message");
        assert_eq!(
            xa.parked_predictions(),
            before,
            "two FPDUs or a short buffer predicted"
        );
    });
}

/// Forwards `from` to `to` until EOF, the switch's urgent mark passed on
/// as urgent. With `split` set (a byte count, taken once), a read longer
/// than it goes on in two writes: its first `split` bytes, then — once
/// the reader's socket `drained` holds nothing (its parked read took
/// them) — the rest.
fn forward(from: TcpStream, mut to: TcpStream, split: Option<(Arc<AtomicUsize>, RawFd)>) {
    let (rf, wf) = (from.as_raw_fd(), to.as_raw_fd());
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let mut at: libc::c_int = 0;
        // SAFETY: SIOCATMARK (0x8905, linux/sockios.h) writes one int.
        unsafe { libc::ioctl(rf, 0x8905, &mut at) };
        if at != 0 {
            let mut b = [0u8; 1];
            // SAFETY: one byte into `b`.
            let n = unsafe { libc::recv(rf, b.as_mut_ptr().cast(), 1, libc::MSG_OOB) };
            if n == 1 {
                // SAFETY: one byte from `b`.
                unsafe { libc::send(wf, b.as_ptr().cast(), 1, libc::MSG_OOB) };
                continue;
            }
        }
        let mut p = libc::pollfd {
            fd: rf,
            events: libc::POLLIN | libc::POLLPRI,
            revents: 0,
        };
        // SAFETY: one pollfd on the stack.
        unsafe { libc::poll(&mut p, 1, LIMIT.as_millis() as i32) };
        if p.revents & libc::POLLPRI != 0 && p.revents & libc::POLLIN == 0 {
            continue;
        }
        // SAFETY: into `buf`, its length.
        let n = unsafe { libc::recv(rf, buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) };
        if n <= 0 {
            let e = std::io::Error::last_os_error();
            if n < 0
                && matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted
                )
            {
                continue;
            }
            break;
        }
        let n = n as usize;
        let cut = split
            .as_ref()
            .map_or(0, |(k, _)| k.swap(0, Ordering::SeqCst));
        let sent = if cut > 0 && cut < n {
            let drained = split.as_ref().map_or(-1, |(_, fd)| *fd);
            to.write_all(&buf[..cut]).is_ok() && {
                until_drained(drained);
                to.write_all(&buf[cut..n]).is_ok()
            }
        } else {
            to.write_all(&buf[..n]).is_ok()
        };
        if !sent {
            break;
        }
    }
    let _ = to.shutdown(std::net::Shutdown::Write);
}

/// Waits (bounded by [`LIMIT`]) until socket `fd`'s receive queue is
/// empty (`SIOCINQ`).
fn until_drained(fd: RawFd) {
    let t = Instant::now();
    loop {
        let mut n: libc::c_int = 0;
        // SAFETY: SIOCINQ writes one int.
        let r = unsafe { libc::ioctl(fd, libc::FIONREAD, &mut n) };
        if r != 0 || n == 0 || t.elapsed() > LIMIT {
            return;
        }
        std::thread::yield_now();
    }
}

/// A message whose FPDU comes in two parts, the first in a parked read
/// of its own (it completes nothing), is still one wait of the receive:
/// the engine's wait goes on in its rounds (`Parked::Nothing`, review
/// r30-a item 1), as the wait before the predicted take did — not a
/// second wait whose first park is the unmarked blocking read again.
/// `a` <-> a forwarder <-> `b`, which splits one of `b`'s FPDUs.
#[test]
fn a_split_fpdu_is_one_wait_of_the_receive() {
    let split = Arc::new(AtomicUsize::new(0));
    let l1 = TcpListener::bind("127.0.0.1:0").unwrap();
    let a = TcpStream::connect(l1.local_addr().unwrap()).unwrap();
    let (p1, _) = l1.accept().unwrap();
    let l2 = TcpListener::bind("127.0.0.1:0").unwrap();
    let p2 = TcpStream::connect(l2.local_addr().unwrap()).unwrap();
    let (b, _) = l2.accept().unwrap();
    for s in [&p1, &p2] {
        s.set_nodelay(true).unwrap();
    }
    let (p1r, p2r) = (p1.try_clone().unwrap(), p2.try_clone().unwrap());
    let to_a = Some((Arc::clone(&split), a.as_raw_fd()));
    let fwd = [
        std::thread::spawn(move || forward(p1r, p2, None)),
        std::thread::spawn(move || forward(p2r, p1, to_a)),
    ];
    let o = opts();
    let (xa, xb) = std::thread::scope(|sc| {
        let ta = sc.spawn(|| switch_fd_as(a.as_fd(), &o, Some(Role::Initiator)));
        let tb = sc.spawn(|| switch_fd_as(b.as_fd(), &o, Some(Role::Responder)));
        match (ta.join().unwrap(), tb.join().unwrap()) {
            (Ok(x), Ok(y)) => (x, y),
            (ra, rb) => panic!("switch: {:?} / {:?}", ra.err(), rb.err()),
        }
    });
    until_owes_nothing(&xb, "the responder");
    let (go, next) = mpsc::channel::<()>();
    std::thread::scope(|s| {
        let xa = &xa;
        let split = &split;
        s.spawn(move || {
            for i in 0..5u64 {
                next.recv_timeout(LIMIT).expect("the reader stopped");
                until_parked(xa, &format!("message {i}"));
                if i == 4 {
                    split.store(10, Ordering::SeqCst);
                }
                xb.send(&pattern(8, i), false, Some(LIMIT)).expect("send");
            }
        });
        for i in 0..5u64 {
            let before = xa.stats().waits.load(Ordering::Relaxed);
            go.send(()).expect("the writer stopped");
            let mut buf = [0u8; 64];
            let (n, _) = recv_blocking(xa, &mut buf);
            assert_eq!(buf[..n], pattern(8, i)[..], "message {i}");
            let waits = xa.stats().waits.load(Ordering::Relaxed) - before;
            assert_eq!(waits, 1, "message {i}'s receive waited {waits} times");
        }
        assert_eq!(split.load(Ordering::SeqCst), 0, "the FPDU was not split");
    });
    drop((xa, a, b));
    for f in fwd {
        f.join().unwrap();
    }
}
