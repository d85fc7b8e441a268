//! A straight send leaves a DDP-mode socket quiet (issue 12,
//! `XSocket::set_quiet_sent`): a one-FPDU message the engine wrote inline
//! and whole, with nothing left behind, sets the flag the send's take of
//! the lock cleared, so a busy poller's spin right after its send is the
//! engine's read alone — no take of the lock, no round. Every send that
//! leaves something behind leaves the flag down: bytes the kernel did not
//! take (the engine's backlog), the last credit taken, a message sent from
//! a transmit slot (its completion to reap). And a long busy ping-pong
//! through quiet spins loses nothing, never stalls, and ends with the
//! credits a fresh pair has.

use std::io::ErrorKind;
use std::time::Instant;

use warpsock_xsock::io::{Options, RecvFlags, XSocket};

mod net;

use net::{
    engine_socket_readable, opts, pattern, set_buf, small_window, spin_call, switch_both, tcp_pair,
    unbuffered, LIMIT, NONBLOCKING,
};

/// One spin as the preload makes it: `None` on `EAGAIN`, quiet or not.
fn spin_once(x: &XSocket, buf: &mut [u8]) -> Option<usize> {
    match spin_call(x, &mut [buf], NONBLOCKING) {
        Ok((n, _)) => Some(n),
        Err(e) if e.kind() == ErrorKind::WouldBlock => None,
        Err(e) => panic!("spinning receive: {e}"),
    }
}

/// Spins until a message of `n` bytes arrives whole (small messages: one
/// receive takes one), bounded by [`LIMIT`].
fn spin_message(x: &XSocket, n: usize, what: &str) -> Vec<u8> {
    let mut buf = vec![0; n.max(1)];
    let t = Instant::now();
    loop {
        assert!(t.elapsed() < LIMIT, "{what}: no message");
        if let Some(k) = spin_once(x, &mut buf) {
            assert_eq!(k, n, "{what}: a part of the message");
            buf.truncate(n);
            return buf;
        }
    }
}

/// A few round trips of 8 B through sends and spins: past the first
/// FPDUs (the core's general path), both ends established.
fn warm_up(xa: &XSocket, xb: &XSocket) {
    for i in 0..4 {
        xa.send(&pattern(8, i), false, Some(LIMIT)).unwrap();
        assert_eq!(spin_message(xb, 8, "warm-up"), pattern(8, i));
        xb.send(&pattern(8, i + 100), false, Some(LIMIT)).unwrap();
        assert_eq!(spin_message(xa, 8, "warm-up"), pattern(8, i + 100));
    }
}

/// Non-blocking 8 B sends from `xa` (its peer reads none meanwhile) until
/// the books refuse one: how many went — the credits `xa` held, less the
/// one a CREDIT keeps (`Stream::may_send`). `xb` then reads them all.
fn window_left(xa: &XSocket, xb: &XSocket) -> u64 {
    let mut n = 0;
    loop {
        match xa.send(&pattern(8, 7000 + n), true, None) {
            Ok(8) => n += 1,
            Err(e) if e.kind() == ErrorKind::WouldBlock => break,
            r => panic!("send {n}: {r:?}"),
        }
        assert!(n <= 1000, "no end to the window");
    }
    for i in 0..n {
        assert_eq!(spin_message(xb, 8, "window"), pattern(8, 7000 + i));
    }
    n
}

/// After a straight send (one FPDU, written inline and whole), the socket
/// is quiet, and the spins that follow — the peer has not answered yet —
/// are the engine's read alone: no counted take of the socket's lock, a
/// read of the engine's socket each. The answer is taken by the one spin
/// that reads it, and every later send leaves it quiet again. Both ends,
/// as a ping-pong's. Fails with the send's take of the lock clearing the
/// flag for good (the first spin then makes the receive's round).
#[test]
fn a_straight_send_leaves_the_socket_quiet_and_the_next_spins_read_alone() {
    let (a, b) = tcp_pair();
    let (xa, xb) = switch_both(&a, &b, &opts());
    warm_up(&xa, &xb);
    for round in 0..20u64 {
        let at = format!("round {round}");
        for (x, y, seed) in [(&xa, &xb, round), (&xb, &xa, round + 500)] {
            let inline = x.inline_sends();
            assert_eq!(x.send(&pattern(8, seed), false, Some(LIMIT)).unwrap(), 8);
            assert_eq!(x.inline_sends() - inline, 1, "{at}: not inline");
            assert!(x.quiet_now(), "{at}: not quiet after a straight send");
            let (locks, reads) = (x.state_locks(), x.socket_reads());
            for _ in 0..10 {
                assert_eq!(spin_once(x, &mut [0; 8]), None, "{at}");
            }
            assert_eq!(x.state_locks(), locks, "{at}: a spin took the lock");
            // One read may be skipped after a short one (the engine's
            // `drained_hint`, as its round skips it).
            assert!(
                x.socket_reads() - reads >= 9,
                "{at}: the spins did not read the engine's socket"
            );
            // The peer, quiet too (its own send left it so): its spin
            // takes the message.
            assert_eq!(spin_message(y, 8, &at), pattern(8, seed), "{at}");
        }
    }
}

/// A blocking reader's straight send leaves the socket not quiet
/// (`State::rx_blocks`): its next receive blocks, and a blocking receive
/// never spins, so the flag would only cost the send its terms and the
/// preload's receive a frame. A non-blocking receive puts it back: the
/// next straight send leaves the socket quiet again. Fails with the
/// send asking `set_quiet_sent` whatever the last receive was.
#[test]
fn a_blocking_readers_straight_send_leaves_the_socket_not_quiet() {
    let (a, b) = tcp_pair();
    let (xa, xb) = switch_both(&a, &b, &opts());
    warm_up(&xa, &xb);
    let blocking = RecvFlags {
        nonblocking: false,
        ..NONBLOCKING
    };
    for round in 0..4u64 {
        let at = format!("round {round}");
        xa.send(&pattern(8, round), false, Some(LIMIT)).unwrap();
        let mut buf = [0; 8];
        assert_eq!(xb.recv(&mut buf, blocking, Some(LIMIT)).unwrap().0, 8);
        assert_eq!(buf.to_vec(), pattern(8, round), "{at}");
        let inline = xb.inline_sends();
        xb.send(&pattern(8, round + 100), false, Some(LIMIT))
            .unwrap();
        assert_eq!(xb.inline_sends() - inline, 1, "{at}: not inline");
        assert!(
            !xb.quiet_now(),
            "{at}: quiet after a blocking reader's send"
        );
        assert_eq!(spin_message(&xa, 8, &at), pattern(8, round + 100));
        // A spin (nothing there) makes xb a non-blocking reader again.
        assert_eq!(spin_once(&xb, &mut buf), None, "{at}");
        xb.send(&pattern(8, round + 200), false, Some(LIMIT))
            .unwrap();
        assert!(
            xb.quiet_now(),
            "{at}: not quiet after a spinning reader's send"
        );
        assert_eq!(spin_message(&xa, 8, &at), pattern(8, round + 200));
    }
}

/// A vectored send of a small message (several buffers, one DATA message)
/// goes the straight path inline just as a one-buffer send does, and
/// leaves the socket quiet as well: its bytes go out in order, and the
/// spins after it are the engine's read alone until the answer.
#[test]
fn a_vectored_straight_send_leaves_it_quiet_and_its_bytes_arrive_in_order() {
    let (a, b) = tcp_pair();
    let (xa, xb) = switch_both(&a, &b, &opts());
    warm_up(&xa, &xb);
    for round in 0..10u64 {
        let m = pattern(24, round);
        let parts: [&[u8]; 3] = [&m[..5], &m[5..6], &m[6..]];
        let inline = xa.inline_sends();
        assert_eq!(xa.send_vectored(&parts, false, Some(LIMIT)).unwrap(), 24);
        assert_eq!(xa.inline_sends() - inline, 1, "round {round}: not inline");
        assert!(xa.quiet_now(), "round {round}: not quiet");
        let locks = xa.state_locks();
        assert_eq!(spin_once(&xa, &mut [0; 8]), None);
        assert_eq!(xa.state_locks(), locks, "round {round}: the spin locked");
        assert_eq!(spin_message(&xb, 24, "vectored"), m, "round {round}");
        xb.send(&pattern(8, round), false, Some(LIMIT)).unwrap();
        assert_eq!(spin_message(&xa, 8, "answer"), pattern(8, round));
    }
}

/// Straight sends whose writes the kernel stops taking (4 KiB socket
/// buffers, the reader reads nothing): the send that left bytes in the
/// engine (its backlog, for a later transmit pass) leaves the socket not
/// quiet — until they are written, what the engine does is not the
/// read's alone — while every send before it, written whole, left it
/// quiet. Then the spins write the backlog out (the engine's full round)
/// and the reader gets every byte. Fails with the backlog not a term (the
/// flag set over bytes still owed to the socket).
#[test]
fn a_straight_send_that_leaves_a_backlog_leaves_the_socket_not_quiet() {
    const CALL: usize = 30_000;
    let (a, b) = tcp_pair();
    set_buf(&a, libc::SO_SNDBUF, 4096);
    set_buf(&b, libc::SO_RCVBUF, 4096);
    let (xa, xb) = switch_both(&a, &b, &unbuffered());
    warm_up(&xa, &xb);
    assert!(CALL < opts().zcopy_min);
    let data = pattern(16 * CALL, 8);
    let mut sent = 0;
    let mut backlogged = false;
    for k in 0..16 {
        // Written at once: one FPDU copied (inline), or gathered from the
        // caller's buffer (this size).
        let inline = at_once(&xa);
        match xa.send(&data[sent..sent + CALL], true, None) {
            Ok(n) => {
                assert_eq!(n, CALL, "send {k}: one message");
                sent += n;
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => break,
            Err(e) => panic!("send {k}: {e}"),
        }
        if at_once(&xa) == inline {
            // Refused at once (the backlog ahead of it): from a slot.
            assert!(!xa.quiet_now(), "send {k}: quiet after a post");
            continue;
        }
        if xa.engine_backlog().0 > 0 {
            assert!(!xa.quiet_now(), "send {k}: quiet with a backlog");
            backlogged = true;
            break;
        }
        assert!(xa.quiet_now(), "send {k}: written whole, not quiet");
    }
    assert!(
        backlogged,
        "no send written at once left a backlog ({sent} bytes)"
    );
    // The reader borrows `xb` (not dropped when it is done: its close
    // would end the writer's stream before the last look).
    std::thread::scope(|sc| {
        let reader = sc.spawn(|| {
            let mut got = vec![0; sent];
            let mut off = 0;
            let t = Instant::now();
            while off < sent {
                assert!(t.elapsed() < LIMIT, "the reader got {off} of {sent}");
                if let Some(n) = spin_once(&xb, &mut got[off..]) {
                    off += n;
                }
            }
            got
        });
        // The writer's spins drive its engine (no progress thread here).
        let t = Instant::now();
        while !reader.is_finished() {
            assert!(t.elapsed() < LIMIT, "the backlog never went out");
            assert_eq!(spin_once(&xa, &mut [0; 8]), None);
        }
        assert_eq!(reader.join().unwrap(), data[..sent]);
    });
}

/// Straight sends into a window the reader does not read (16 slots): each
/// leaves the socket quiet while the books still let a send go, and the
/// one that takes the last credit it may use leaves it not quiet. Fails
/// with writability not a term (the flag set with the next send waiting
/// on the peer's CREDIT).
#[test]
fn a_straight_send_that_takes_the_last_credit_leaves_the_socket_not_quiet() {
    let (a, b) = tcp_pair();
    let (xa, xb) = switch_both(&a, &b, &small_window());
    warm_up(&xa, &xb);
    let mut n = 0;
    loop {
        let inline = xa.inline_sends();
        assert_eq!(
            xa.send(&pattern(8, n), true, None).expect("a credit"),
            8,
            "send {n}"
        );
        assert_eq!(xa.inline_sends() - inline, 1, "send {n}: not inline");
        n += 1;
        if !xa.readiness_now().writable {
            assert!(!xa.quiet_now(), "send {n}: quiet with no credit left");
            break;
        }
        assert!(xa.quiet_now(), "send {n}: not quiet with credits left");
        assert!(n < 16, "more sends than slots");
    }
    for i in 0..n {
        assert_eq!(spin_message(&xb, 8, "window"), pattern(8, i));
    }
    // The reader's spins return the credits (a CREDIT is due).
    let t = Instant::now();
    while !xa.readiness().writable {
        assert!(t.elapsed() < LIMIT, "the credits never came back");
        assert_eq!(spin_once(&xb, &mut [0; 8]), None);
    }
}

/// A straight send too long for one FPDU (more than the queue pair's
/// MULPDU, within a slot and below `zcopy_min`), with gathered sends off,
/// goes from a transmit slot: a posted Send with a completion to reap,
/// not the inline write. It leaves the socket not quiet (the completion
/// is the usual path's to take, reaped or not), and the bytes arrive.
/// Fails with the flag set after any straight send, inline or not.
#[test]
fn a_straight_send_from_a_transmit_slot_leaves_the_socket_not_quiet() {
    let (a, b) = tcp_pair();
    set_buf(&a, libc::SO_SNDBUF, 4 << 20);
    let o = Options {
        zcopy_min: 1 << 20,
        gather_min: usize::MAX,
        ..opts()
    };
    let (xa, xb) = switch_both(&a, &b, &o);
    warm_up(&xa, &xb);
    let len = xa.mulpdu() + 100;
    assert!(len < o.zcopy_min && len < (512 << 10), "MULPDU {len}");
    for round in 0..3u64 {
        let m = pattern(len, round);
        let inline = xa.inline_sends();
        assert_eq!(xa.send(&m, true, None).unwrap(), len, "round {round}");
        assert_eq!(xa.inline_sends(), inline, "round {round}: inline");
        assert_eq!(xa.engine_backlog().0, 0, "round {round}: a backlog");
        assert!(!xa.quiet_now(), "round {round}: quiet after a post");
        spun_in_and_answered(&xa, &xb, &m, round);
    }
}

/// The same straight send of several FPDUs with gathered sends on (the
/// default): written at once from the caller's buffer (no transmit slot,
/// no completion), so with the socket's buffer taking it whole it leaves
/// the socket quiet, and the bytes arrive.
#[test]
fn a_straight_gathered_send_written_whole_leaves_the_socket_quiet() {
    let (a, b) = tcp_pair();
    set_buf(&a, libc::SO_SNDBUF, 4 << 20);
    let o = Options {
        zcopy_min: 1 << 20,
        ..opts()
    };
    let (xa, xb) = switch_both(&a, &b, &o);
    warm_up(&xa, &xb);
    let len = 2 * xa.mulpdu() + 100;
    assert!(len < o.zcopy_min && len < (256 << 10) && len >= o.gather_min);
    for round in 0..3u64 {
        let m = pattern(len, round);
        let (gathered, _) = xa.gathered_sends();
        assert_eq!(xa.send(&m, true, None).unwrap(), len, "round {round}");
        assert_eq!(
            xa.gathered_sends().0 - gathered,
            1,
            "round {round}: not gathered"
        );
        assert_eq!(xa.engine_backlog().0, 0, "round {round}: a backlog");
        assert!(xa.quiet_now(), "round {round}: written whole, not quiet");
        spun_in_and_answered(&xa, &xb, &m, round);
    }
}

/// `xb` spins until it has read `m` whole (the round's message from
/// `xa`), then answers with 8 bytes, which `xa` spins for.
fn spun_in_and_answered(xa: &XSocket, xb: &XSocket, m: &[u8], round: u64) {
    let len = m.len();
    let mut got = vec![0; len];
    let mut off = 0;
    let t = Instant::now();
    while off < len {
        assert!(t.elapsed() < LIMIT, "round {round}: got {off} of {len}");
        if let Some(k) = spin_once(xb, &mut got[off..]) {
            off += k;
        }
    }
    assert_eq!(got, m, "round {round}");
    xb.send(&pattern(8, round), false, Some(LIMIT)).unwrap();
    assert_eq!(spin_message(xa, 8, "answer"), pattern(8, round));
}

/// Messages `x` wrote at once, with no send request: inline (one FPDU
/// copied) or gathered from the caller's buffer.
fn at_once(x: &XSocket) -> u64 {
    x.inline_sends() + x.gathered_sends().0
}

/// A long busy ping-pong, each end in its own thread: a non-blocking send,
/// then non-blocking spins (through the quiet spin, as the preload's)
/// until the answer, 1 to 64 bytes a message, in a window of 16 slots.
/// Every send leaves its socket quiet (each thread alone on its socket, no
/// progress thread: nothing else clears it), no send finds the books
/// closed, every message arrives whole and in order, and at the end each
/// end holds the credits a fresh pair's does after one round trip (none
/// lost, none made up: as many 8 B sends go before the books refuse).
/// Fails with a spin that misses its answer (the thread never gets it),
/// a slot never credited back (a send refused), or the flag left down.
#[test]
fn a_long_busy_ping_pong_through_quiet_spins_loses_nothing_and_keeps_the_credits() {
    const N: u64 = 3000;
    let fresh = {
        let (a, b) = tcp_pair();
        let (xa, xb) = switch_both(&a, &b, &small_window());
        warm_up(&xa, &xb);
        (window_left(&xa, &xb), window_left(&xb, &xa))
    };
    let (a, b) = tcp_pair();
    let (xa, xb) = switch_both(&a, &b, &small_window());
    warm_up(&xa, &xb);
    let side = |x: &XSocket, first: bool| {
        let mut buf = [0u8; 64];
        let t = Instant::now();
        for i in 0..N {
            let len = 1 + (i as usize * 13) % 64;
            let (mine, theirs) = if first {
                (pattern(len, i), pattern(len, i + N))
            } else {
                (pattern(len, i + N), pattern(len, i))
            };
            let answer = |buf: &mut [u8; 64]| loop {
                assert!(t.elapsed() < LIMIT, "message {i}: stalled");
                if let Some(k) = spin_once(x, &mut buf[..]) {
                    assert_eq!(buf[..k], theirs[..], "message {i}");
                    break;
                }
            };
            if !first {
                answer(&mut buf);
            }
            assert_eq!(x.send(&mine, true, None).expect("a credit"), len);
            assert!(x.quiet_now(), "message {i}: not quiet after the send");
            if first {
                answer(&mut buf);
            }
        }
    };
    std::thread::scope(|sc| {
        let ta = sc.spawn(|| side(&xa, true));
        let tb = sc.spawn(|| side(&xb, false));
        ta.join().unwrap();
        tb.join().unwrap();
    });
    // Both quiet, nothing left on either engine socket.
    assert!(!engine_socket_readable(&xa) && !engine_socket_readable(&xb));
    assert_eq!(xa.readable_bytes() + xb.readable_bytes(), 0);
    assert_eq!(
        (window_left(&xa, &xb), window_left(&xb, &xa)),
        fresh,
        "the credits after {N} round trips"
    );
}

/// A straight send while the books hold bytes the program has not read
/// (a receive into 8 B took half of a 16 B message): the send leaves the
/// socket not quiet, and the next spin returns the rest at once — the
/// engine's socket is empty, so only the books have it. Fails with the
/// books' unread bytes not a term (the spin says `EAGAIN`).
#[test]
fn a_straight_send_with_unread_bytes_leaves_the_socket_not_quiet() {
    let (a, b) = tcp_pair();
    let (xa, xb) = switch_both(&a, &b, &opts());
    warm_up(&xa, &xb);
    for round in 0..5u64 {
        let m = pattern(16, round);
        xb.send(&m, false, Some(LIMIT)).unwrap();
        assert_eq!(spin_message(&xa, 8, "half"), m[..8], "round {round}");
        assert_eq!(xa.readable_bytes(), 8, "round {round}");
        let inline = xa.inline_sends();
        xa.send(&pattern(8, round), false, Some(LIMIT)).unwrap();
        assert_eq!(xa.inline_sends() - inline, 1, "round {round}: not inline");
        assert!(!xa.quiet_now(), "round {round}: quiet with bytes unread");
        let mut buf = [0; 8];
        assert_eq!(spin_once(&xa, &mut buf), Some(8), "round {round}");
        assert_eq!(buf[..], m[8..], "round {round}");
        assert_eq!(spin_message(&xb, 8, "answer"), pattern(8, round));
    }
}

/// A straight send after the peer ended its stream (`shutdown` of its
/// writing side: its end-of-stream message read, the books at their end):
/// the send still goes (a half-closed connection), leaves the socket not
/// quiet, and every spin after it returns the end (0), not `EAGAIN`.
/// Fails with the end of stream not a term.
#[test]
fn a_straight_send_after_the_peers_end_of_stream_leaves_it_not_quiet() {
    let (a, b) = tcp_pair();
    let (xa, xb) = switch_both(&a, &b, &opts());
    warm_up(&xa, &xb);
    xb.shutdown(false, true);
    let t = Instant::now();
    while spin_once(&xa, &mut [0; 8]) != Some(0) {
        assert!(t.elapsed() < LIMIT, "no end of stream");
    }
    for round in 0..3u64 {
        let inline = xa.inline_sends();
        xa.send(&pattern(8, round), false, Some(LIMIT)).unwrap();
        assert_eq!(xa.inline_sends() - inline, 1, "round {round}: not inline");
        assert!(!xa.quiet_now(), "round {round}: quiet after the end");
        assert_eq!(spin_once(&xa, &mut [0; 8]), Some(0), "round {round}");
        assert_eq!(spin_message(&xb, 8, "half-closed"), pattern(8, round));
    }
}
