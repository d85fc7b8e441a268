//! A busy-polling receive of a quiet socket (issue 12,
//! `XSocket::recv_quiet`): once an empty round found the socket quiet, a
//! spin is the engine's read alone — no counted take of the lock, no
//! round — and never in the way of what a receive must see: the peer's
//! next message (taken in and returned by the spin that reads it), or
//! bytes another call took in under the lock meanwhile. (`tests/spin.rs` spins through it too:
//! credits returned, a queued send, the end of stream, a Terminate, a
//! reset.)

use std::io::ErrorKind;
use std::time::Instant;

use warpsock_xsock::io::{RecvFlags, XSocket};

mod net;

use net::{opts, pattern, quiet_and_empty, spin_call, switch_both, tcp_pair, LIMIT, NONBLOCKING};

/// One spin as the preload makes it: `None` on `EAGAIN`, quiet or not.
fn spin_once(x: &XSocket, buf: &mut [u8]) -> Option<usize> {
    match spin_call(x, &mut [buf], NONBLOCKING) {
        Ok((n, _)) => Some(n),
        Err(e) if e.kind() == ErrorKind::WouldBlock => None,
        Err(e) => panic!("spinning receive: {e}"),
    }
}

/// Spins (`spin`, one spin into the caller's buffers) until one returns,
/// bounded by [`LIMIT`]: its count (`what` names it in the failure).
fn spin_until_some(
    x: &XSocket,
    mut spin: impl FnMut(&XSocket) -> Option<usize>,
    what: &str,
) -> usize {
    let t = Instant::now();
    loop {
        assert!(t.elapsed() < LIMIT, "{what}");
        if let Some(n) = spin(x) {
            return n;
        }
    }
}

/// Spins until a message of `n` bytes arrives whole (8 B messages: one
/// receive takes one).
fn spin_message(x: &XSocket, n: usize) -> Vec<u8> {
    let mut buf = vec![0; n];
    let k = spin_until_some(x, |x| spin_once(x, &mut buf), "no message");
    assert_eq!(k, n, "a part of the message");
    buf
}

/// Spins of an idle socket (`spin`, each `EAGAIN`; the round that finds
/// nothing may first return a credit that is due) until one leaves it
/// quiet, at most 100: whether one did.
fn spins_leave_it_quiet(x: &XSocket, spin: impl Fn(&XSocket) -> Option<usize>) -> bool {
    (0..100).any(|_| {
        assert_eq!(spin(x), None);
        quiet_and_empty(x)
    })
}

/// Whether bytes wait on `x`'s engine socket (a `poll` that does not
/// wait).
fn engine_socket_readable(x: &XSocket) -> bool {
    let mut p = libc::pollfd {
        fd: x.tcp_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one pollfd on the stack for the call's duration.
    unsafe { libc::poll(&mut p, 1, 0) == 1 }
}

fn spin_plain(x: &XSocket) -> Option<usize> {
    spin_once(x, &mut [0; 8])
}

/// After one empty spin that makes its round, the spins of an idle
/// socket are the engine's read alone: no counted take of the socket's
/// lock, a read of the engine's socket each; the peer's next message is
/// taken in and returned by the spin that reads it, and the spin after
/// it makes its round again. Fails with the socket never found quiet
/// (every spin locks), the engine's socket not read (the message never
/// comes; a `poll` of it instead: no reads) or the answer left to the
/// usual receive (`quiet_answers`, review r23-b item 4).
#[test]
fn a_quiet_socket_spins_on_the_engines_read_and_takes_the_next_message() {
    let (a, b) = tcp_pair();
    let (xa, xb) = switch_both(&a, &b, &opts());
    for round in 0..3u64 {
        xb.send(&pattern(8, round), false, Some(LIMIT)).unwrap();
        assert_eq!(spin_message(&xa, 8), pattern(8, round), "round {round}");
        // The round that finds nothing (its credit return, if one is due,
        // goes first: spins until one finds the socket quiet, bounded).
        assert!(
            spins_leave_it_quiet(&xa, spin_plain),
            "round {round}: an idle socket never quiet"
        );
        let (locks, reads) = (xa.state_locks(), xa.socket_reads());
        for _ in 0..50 {
            assert_eq!(spin_once(&xa, &mut [0; 8]), None);
        }
        assert_eq!(
            xa.state_locks(),
            locks,
            "round {round}: spins took the lock"
        );
        // One read may be skipped after a short one (the engine's
        // `drained_hint`, as its round skips it).
        assert!(
            xa.socket_reads() - reads >= 49,
            "round {round}: spins did not read the engine's socket"
        );
        // The next message: wait until it is on the engine's socket, so
        // that one spin takes it.
        xb.send(&pattern(8, round + 10), false, Some(LIMIT))
            .unwrap();
        let t = Instant::now();
        while !engine_socket_readable(&xa) {
            assert!(t.elapsed() < LIMIT, "round {round}: the message never came");
        }
        let answers = xa.quiet_answers();
        let mut buf = [0; 8];
        assert_eq!(spin_once(&xa, &mut buf), Some(8), "round {round}");
        assert_eq!(buf[..], pattern(8, round + 10)[..], "round {round}");
        assert_eq!(
            xa.quiet_answers() - answers,
            1,
            "round {round}: the answer was not the spin's own"
        );
    }
}

/// Another call takes the peer's message in under the lock while the
/// socket is quiet (`readiness`, a poll's look, drives the engine: the
/// bytes leave the engine's TCP socket for the books). The next spin must
/// return it at once — the engine's socket is empty now, so only the
/// lock's take telling the flag down can send the spin to the books.
/// Fails with the take not clearing the flag (the spin says `EAGAIN`).
#[test]
fn bytes_another_call_took_in_are_seen_by_the_next_spin() {
    let (a, b) = tcp_pair();
    let (xa, xb) = switch_both(&a, &b, &opts());
    for round in 0..3u64 {
        assert!(
            spins_leave_it_quiet(&xa, spin_plain),
            "round {round}: an idle socket never quiet"
        );
        xb.send(&pattern(8, round), false, Some(LIMIT)).unwrap();
        let t = Instant::now();
        while !xa.readiness().readable {
            assert!(t.elapsed() < LIMIT, "round {round}: the message never came");
        }
        let mut buf = [0; 8];
        assert_eq!(
            spin_once(&xa, &mut buf),
            Some(8),
            "round {round}: the spin missed bytes in the books"
        );
        assert_eq!(buf[..], pattern(8, round)[..], "round {round}");
    }
}

/// The peer's end of stream, while the socket is quiet: the spin that
/// meets it returns 0, and so does every one after (the flag is not set
/// again over an ended stream).
#[test]
fn a_quiet_socket_sees_the_end_of_stream_and_keeps_it() {
    let (a, b) = tcp_pair();
    let (xa, xb) = switch_both(&a, &b, &opts());
    assert!(
        spins_leave_it_quiet(&xa, spin_plain),
        "an idle socket never quiet"
    );
    assert!(xb.close(LIMIT));
    let n = spin_until_some(&xa, spin_plain, "no end of stream");
    assert_eq!(n, 0, "bytes from a closed peer");
    for _ in 0..10 {
        assert_eq!(spin_once(&xa, &mut [0; 8]), Some(0));
        // The flag itself: the engine's read reports the end every time,
        // so a spin would not say `EAGAIN` even with the flag left set
        // (review r23-b item 3).
        assert!(!xa.quiet_now(), "quiet after the end of stream");
    }
}

/// Spins into two buffers (`readv`, a `recvmsg` with a header and a body)
/// and the looks that change nothing (`readiness_now`, `readable_bytes`)
/// leave the socket quiet: after the round that finds it so, the spins
/// take the lock-free `EAGAIN` (review r22-c item 2), and the peer's next
/// message still comes. Fails with those looks taking the lock as writers
/// do (they cleared the flag each time: never quiet after a vectored spin).
#[test]
fn vectored_spins_and_plain_looks_keep_a_quiet_socket_quiet() {
    let (a, b) = tcp_pair();
    let (xa, xb) = switch_both(&a, &b, &opts());
    let spin_vectored = |x: &XSocket| -> Option<usize> {
        let (mut h, mut body) = ([0u8; 4], [0u8; 4]);
        let mut bufs: [&mut [u8]; 2] = [&mut h, &mut body];
        match spin_call(x, &mut bufs, NONBLOCKING) {
            Ok((n, _)) => Some(n),
            Err(e) if e.kind() == ErrorKind::WouldBlock => None,
            Err(e) => panic!("spinning receive: {e}"),
        }
    };
    for round in 0..3u64 {
        assert!(
            spins_leave_it_quiet(&xa, spin_vectored),
            "round {round}: vectored spins never left it quiet"
        );
        assert!(!xa.readiness_now().readable);
        assert_eq!(xa.readable_bytes(), 0);
        assert!(quiet_and_empty(&xa), "round {round}: a look cleared quiet");
        xb.send(&pattern(8, round), false, Some(LIMIT)).unwrap();
        let n = spin_until_some(&xa, spin_vectored, &format!("round {round}: no message"));
        assert_eq!(n, 8, "round {round}");
    }
}

/// Bytes waiting on `x`'s engine socket (`FIONREAD`).
fn engine_socket_bytes(x: &XSocket) -> usize {
    let mut n: libc::c_int = 0;
    // SAFETY: FIONREAD writes one int.
    let r = unsafe { libc::ioctl(x.tcp_fd(), libc::FIONREAD, &mut n) };
    assert_eq!(r, 0, "FIONREAD");
    n as usize
}

/// Makes `xa` quiet, has `xb` send `msgs` (each a send call), and waits
/// until all of them are on `xa`'s engine socket (`wire`: the bytes one
/// of them takes there, learnt by [`wire_len`]), so that one spin's read
/// takes them all.
fn arrive_while_quiet(xa: &XSocket, xb: &XSocket, msgs: &[Vec<u8>], wire: usize) {
    assert!(
        spins_leave_it_quiet(xa, spin_plain),
        "an idle socket never quiet"
    );
    for m in msgs {
        xb.send(m, false, Some(LIMIT)).unwrap();
    }
    let t = Instant::now();
    while engine_socket_bytes(xa) < wire * msgs.len() {
        assert!(t.elapsed() < LIMIT, "the messages never came");
    }
}

/// The bytes an `n`-byte send takes on `xa`'s engine socket (one such
/// send, received and counted while it waits there).
fn wire_len(xa: &XSocket, xb: &XSocket, n: usize) -> usize {
    assert!(
        spins_leave_it_quiet(xa, spin_plain),
        "an idle socket never quiet"
    );
    xb.send(&pattern(n, 99), false, Some(LIMIT)).unwrap();
    let t = Instant::now();
    while !engine_socket_readable(xa) {
        assert!(t.elapsed() < LIMIT, "the message never came");
    }
    let wire = engine_socket_bytes(xa);
    assert_eq!(spin_message(xa, n), pattern(n, 99));
    wire
}

/// One spin of `xa` with `flags` into `buf` that must take what arrived
/// itself (`quiet_answers`): its result.
fn quiet_answer(xa: &XSocket, buf: &mut [u8], flags: RecvFlags) -> (usize, bool) {
    let answers = xa.quiet_answers();
    let r = spin_call(xa, &mut [buf], flags).expect("the spin's receive");
    assert_eq!(xa.quiet_answers() - answers, 1, "not the spin's own answer");
    r
}

/// A quiet spin whose read brings the arrival receives it as the usual
/// receive would (review r23-b item 4): a peek leaves it for the next
/// receive; a `MSG_WAITALL` takes every message the read brought, up to
/// its length (item 1: it returned the first alone); a message longer
/// than the buffer leaves its rest for the next; message mode returns
/// one message and its end. Each through the spin's own path.
#[test]
fn a_quiet_spins_answer_is_the_usual_receives() {
    let (a, b) = tcp_pair();
    let (xa, xb) = switch_both(&a, &b, &opts());
    let wire8 = wire_len(&xa, &xb, 8);
    let peek = RecvFlags {
        peek: true,
        ..NONBLOCKING
    };
    let waitall = RecvFlags {
        waitall: true,
        ..NONBLOCKING
    };
    // A peek, then the receive.
    arrive_while_quiet(&xa, &xb, &[pattern(8, 1)], wire8);
    let mut buf = [0; 8];
    assert_eq!(quiet_answer(&xa, &mut buf, peek).0, 8, "peek");
    assert_eq!(buf[..], pattern(8, 1)[..], "peek");
    assert_eq!(spin_message(&xa, 8), pattern(8, 1), "after the peek");
    // Two messages in one read, MSG_WAITALL of both.
    arrive_while_quiet(&xa, &xb, &[pattern(8, 2), pattern(8, 3)], wire8);
    let mut buf = [0; 16];
    assert_eq!(quiet_answer(&xa, &mut buf, waitall).0, 16, "MSG_WAITALL");
    assert_eq!(buf[..8], pattern(8, 2)[..], "MSG_WAITALL");
    assert_eq!(buf[8..], pattern(8, 3)[..], "MSG_WAITALL");
    // A message longer than the buffer.
    let wire16 = wire_len(&xa, &xb, 16);
    arrive_while_quiet(&xa, &xb, &[pattern(16, 4)], wire16);
    let mut buf = [0; 8];
    assert_eq!(quiet_answer(&xa, &mut buf, NONBLOCKING).0, 8, "a part");
    assert_eq!(buf[..], pattern(16, 4)[..8], "a part");
    assert_eq!(spin_message(&xa, 8), pattern(16, 4)[8..], "the rest");
    // Message mode: one message a receive, with its end.
    xa.set_msg_mode(true);
    arrive_while_quiet(&xa, &xb, &[pattern(8, 5), pattern(8, 6)], wire8);
    let mut buf = [0; 16];
    assert_eq!(
        quiet_answer(&xa, &mut buf, NONBLOCKING),
        (8, true),
        "message mode"
    );
    assert_eq!(buf[..8], pattern(8, 5)[..], "message mode");
    assert_eq!(spin_message(&xa, 8), pattern(8, 6), "the next message");
}
