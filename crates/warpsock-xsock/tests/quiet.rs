//! A busy-polling receive of a quiet socket (issue 12,
//! `XSocket::recv_quiet`): once an empty round found the socket quiet, a
//! spin is the engine's read alone — no counted take of the lock, no
//! round — and never in the way of what a receive must see: the peer's
//! next message (taken in and returned by the spin that reads it), or
//! bytes another call took in under the lock meanwhile. (`tests/spin.rs` spins through it too:
//! credits returned, a queued send, the end of stream, a Terminate, a
//! reset.)

use std::io::ErrorKind;
use std::sync::atomic::Ordering;
use std::time::Instant;

use warpsock_xsock::io::{RecvFlags, XSocket};

mod net;

use net::{
    engine_socket_readable, opts, pattern, quiet_and_empty, rto_min_us, small_window, spin_call,
    switch_both, tcp_pair, LIMIT, NONBLOCKING,
};

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
    quiet_answer_predicted(xa, buf, flags, false)
}

/// [`quiet_answer`], through the predicted receive or not (`predicted`:
/// the spin's read brought one whole FPDU, a DATA message that fits, and
/// it was taken where the read put it; else the usual path's).
fn quiet_answer_predicted(
    xa: &XSocket,
    buf: &mut [u8],
    flags: RecvFlags,
    predicted: bool,
) -> (usize, bool) {
    let (answers, taken) = (xa.quiet_answers(), xa.predicted_answers());
    let r = spin_call(xa, &mut [buf], flags).expect("the spin's receive");
    assert_eq!(xa.quiet_answers() - answers, 1, "not the spin's own answer");
    assert_eq!(
        xa.predicted_answers() - taken,
        u64::from(predicted),
        "predicted (want {predicted})"
    );
    r
}

/// A quiet spin whose read brings the arrival receives it as the usual
/// receive would (review r23-b item 4): a peek leaves it for the next
/// receive; a `MSG_WAITALL` takes every message the read brought, up to
/// its length (item 1: it returned the first alone); a message longer
/// than the buffer leaves its rest for the next; message mode returns
/// one message and its end. Each through the spin's own path, not the
/// predicted receive (a peek, `MSG_WAITALL`, a buffer too small, two
/// FPDUs in one read), but for one message alone in message mode.
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
    // One message alone in message mode: predicted, with its end.
    arrive_while_quiet(&xa, &xb, &[pattern(8, 7)], wire8);
    let mut buf = [0; 16];
    assert_eq!(
        quiet_answer_predicted(&xa, &mut buf, NONBLOCKING, true),
        (8, true),
        "message mode, one message"
    );
    assert_eq!(buf[..8], pattern(8, 7)[..], "message mode, one message");
}

/// Single messages from `xb` to `xa`, each alone on `xa`'s engine socket
/// when a quiet spin reads it, until one is taken by the predicted
/// receive (at most eight): an end's first FPDU is the core's general
/// path's (its first FPDU makes the connection established), and so is
/// one a spin meets while not quiet; from then on every such message is
/// predicted.
fn until_predicted(xa: &XSocket, xb: &XSocket) {
    let wire8 = wire_len(xa, xb, 8);
    for i in 0..8 {
        let taken = xa.predicted_answers();
        arrive_while_quiet(xa, xb, &[pattern(8, i)], wire8);
        assert_eq!(spin_message(xa, 8), pattern(8, i));
        if xa.predicted_answers() > taken {
            return;
        }
    }
    panic!("no message predicted");
}

/// A quiet spin whose read brings one whole FPDU, a DATA message that
/// fits the buffer, takes it through the predicted receive (copied from
/// the engine's read, no completion), CRC off and on: the message, the
/// counts of a take, and the socket quiet again after the next empty
/// round, ready for the next. Fails with the predicted receive never
/// taken (`predicted_answers`), or its books wrong (the next message lost
/// or its slot never posted again: the next rounds).
#[test]
fn a_quiet_spin_takes_one_message_through_the_predicted_receive() {
    for crc in [false, true] {
        let (a, b) = tcp_pair();
        let o = warpsock_xsock::io::Options { crc, ..opts() };
        let (xa, xb) = switch_both(&a, &b, &o);
        assert_eq!(xa.crc(), crc);
        until_predicted(&xa, &xb);
        let wire8 = wire_len(&xa, &xb, 8);
        for round in 0..5u64 {
            let at = format!("round {round}, CRC {crc}");
            let (copied, taken) = (
                xa.stats().rx_copied.load(Ordering::Relaxed),
                xa.stats().rx_taken.load(Ordering::Relaxed),
            );
            arrive_while_quiet(&xa, &xb, &[pattern(8, round)], wire8);
            let mut buf = [0; 64];
            assert_eq!(
                quiet_answer_predicted(&xa, &mut buf, NONBLOCKING, true),
                (8, false),
                "{at}"
            );
            assert_eq!(buf[..8], pattern(8, round)[..], "{at}");
            assert_eq!(
                xa.stats().rx_copied.load(Ordering::Relaxed) - copied,
                8,
                "{at}"
            );
            assert_eq!(
                xa.stats().rx_taken.load(Ordering::Relaxed) - taken,
                1,
                "{at}"
            );
            assert_eq!(xa.readable_bytes(), 0, "{at}");
            // Both ways still: our answer.
            xa.send(&pattern(8, round + 100), false, Some(LIMIT))
                .unwrap();
            assert_eq!(spin_message(&xb, 8), pattern(8, round + 100), "{at}");
        }
    }
}

/// Sends `n` messages from `xb` to `xa`, each alone on `xa`'s engine
/// socket before `xa` spins for it (through `spin`: one buffer, or two),
/// in a window of 16 slots with no send buffer: a send that found no
/// credit would wait for the reader's return. Checks every byte; returns
/// the messages the predicted receive took and `xa`'s transmit passes (its
/// credit returns: it sends nothing else), and of those the returns made
/// by the spins that took a message (a return due after a read goes at
/// once, in that call's `settle`, not with a later call).
fn one_way(n: u64, vectored: bool) -> (u64, u64, u64) {
    let (a, b) = tcp_pair();
    let (xa, xb) = switch_both(&a, &b, &small_window());
    until_predicted(&xa, &xb);
    let (taken, passes) = (xa.predicted_answers(), xa.tx_passes());
    let mut at_take = 0;
    for i in 0..n {
        let m = pattern(1 + (i as usize * 37) % 200, i);
        assert!(
            spins_leave_it_quiet(&xa, spin_plain),
            "message {i}: never quiet"
        );
        let t = Instant::now();
        assert_eq!(
            xb.send(&m, false, Some(LIMIT)).unwrap(),
            m.len(),
            "message {i}"
        );
        assert!(t.elapsed() < LIMIT, "message {i}: the writer stalled");
        let t = Instant::now();
        while !engine_socket_readable(&xa) {
            assert!(t.elapsed() < LIMIT, "message {i} never came");
        }
        let mut got = vec![0; 256];
        let before = xa.tx_passes();
        let k = if vectored {
            let (h, body) = got.split_at_mut(4);
            let mut bufs: [&mut [u8]; 2] = [h, body];
            spin_until_some(
                &xa,
                |x| match spin_call(x, &mut bufs, NONBLOCKING) {
                    Ok((n, _)) => Some(n),
                    Err(e) if e.kind() == ErrorKind::WouldBlock => None,
                    Err(e) => panic!("spinning receive: {e}"),
                },
                "no message",
            )
        } else {
            spin_until_some(&xa, |x| spin_once(x, &mut got), "no message")
        };
        assert_eq!(got[..k], m[..], "message {i}");
        at_take += xa.tx_passes() - before;
    }
    (
        xa.predicted_answers() - taken,
        xa.tx_passes() - passes,
        at_take,
    )
}

/// A long one-way stream through quiet spins, each message taken by the
/// predicted receive (its slot posted again at once), in a window of 16
/// slots: nothing lost, the writer never stalls, and the reader returns
/// its credits as the usual path does — a CREDIT every fourth message
/// (a quarter of the window), as the same stream read through spins into
/// two buffers, which the predicted receive leaves to the usual path
/// (its slots posted in batches of three). Over a multiple of four
/// messages, from fewer than four unreturned, that is exactly N / 4 for
/// both, each made by the spin that took the message that made it due.
/// Fails with the slot not counted posted (no return: the writer waits
/// for ever), counted twice (returns early), or the return left to a
/// later call (no `settle` after the take).
#[test]
fn a_one_way_stream_through_predicted_spins_returns_credits_as_the_usual_path() {
    const N: u64 = 300;
    let (predicted, returns, at_take) = one_way(N, false);
    assert_eq!(predicted, N, "not every message predicted");
    let (usual, usual_returns, usual_at_take) = one_way(N, true);
    assert_eq!(usual, 0, "a two-buffer spin predicted");
    assert_eq!(usual_returns, N / 4, "the usual path's credit returns");
    assert_eq!(usual_at_take, N / 4, "the usual path's returns at the take");
    assert_eq!(returns, N / 4, "credit returns");
    assert_eq!(at_take, N / 4, "credit returns at the take");
}

/// A stream whose reads mix the predicted receive and the usual path: a
/// message a spin meets while the socket is not quiet (the usual path's
/// take as it lands: its slot left for a batched repost), then a single
/// message read by a quiet spin (predicted all the same: its slot posted
/// alone, ahead of the batch), then two messages in one read and a
/// message longer than the buffer (read in two parts; the usual path).
/// Every byte in order, each single message predicted, and the window
/// never short: 60 rounds of five messages in 16 slots. Fails with the
/// batch counted posted with the predicted slot (the engine then holds
/// fewer receives than the peer's credits: its Send finds none), or the
/// predicted slot posted out of the books' order.
#[test]
fn a_stream_mixing_predicted_and_usual_receives_loses_nothing() {
    let (a, b) = tcp_pair();
    let (xa, xb) = switch_both(&a, &b, &small_window());
    until_predicted(&xa, &xb);
    let wire8 = wire_len(&xa, &xb, 8);
    for round in 0..60u64 {
        let at = format!("round {round}");
        let mut buf = [0; 8];
        // Not quiet when it comes: a take of the lock clears the flag.
        arrive_while_quiet(&xa, &xb, &[pattern(8, round + 3000)], wire8);
        xa.set_msg_mode(false);
        let taken = xa.predicted_answers();
        assert_eq!(spin_message(&xa, 8), pattern(8, round + 3000), "{at}");
        assert_eq!(xa.predicted_answers(), taken, "{at}: not quiet, predicted");
        arrive_while_quiet(&xa, &xb, &[pattern(8, round + 2000)], wire8);
        assert_eq!(
            quiet_answer_predicted(&xa, &mut buf, NONBLOCKING, true).0,
            8,
            "{at}: a single message with a batch waiting"
        );
        assert_eq!(buf[..], pattern(8, round + 2000)[..], "{at}");
        let two = [pattern(8, round), pattern(8, round + 1000)];
        arrive_while_quiet(&xa, &xb, &two, wire8);
        assert_eq!(quiet_answer(&xa, &mut buf, NONBLOCKING).0, 8, "{at}");
        assert_eq!(buf[..], two[0][..], "{at}");
        assert_eq!(spin_message(&xa, 8), two[1], "{at}");
        let m = pattern(16, round);
        xb.send(&m, false, Some(LIMIT)).unwrap();
        assert_eq!(spin_message(&xa, 8), m[..8], "{at}");
        assert_eq!(spin_message(&xa, 8), m[8..], "{at}");
    }
}

/// A CREDIT alone (a Send that is not DATA) read by a quiet spin is not
/// predicted: the usual path takes it into the books, and the spin says
/// `EAGAIN`. Fails with a CREDIT taken as a message.
#[test]
fn a_credit_alone_is_not_predicted() {
    let (a, b) = tcp_pair();
    let (xa, xb) = switch_both(&a, &b, &small_window());
    let mut credits = 0;
    for i in 0..12 {
        xa.send(&pattern(8, i), false, Some(LIMIT)).unwrap();
        assert!(
            spins_leave_it_quiet(&xa, spin_plain),
            "message {i}: never quiet"
        );
        let passes = xb.tx_passes();
        assert_eq!(spin_message(&xb, 8), pattern(8, i), "message {i}");
        if xb.tx_passes() == passes {
            continue;
        }
        // xb's read made its return due: a CREDIT on its way.
        credits += 1;
        let t = Instant::now();
        while !engine_socket_readable(&xa) {
            assert!(t.elapsed() < LIMIT, "message {i}: no credit return came");
        }
        let (answers, taken) = (xa.quiet_answers(), xa.predicted_answers());
        assert_eq!(spin_once(&xa, &mut [0; 8]), None, "a CREDIT read as bytes");
        assert_eq!(xa.quiet_answers() - answers, 1, "not the spin's read");
        assert_eq!(xa.predicted_answers(), taken, "a CREDIT predicted");
    }
    assert!(credits > 0, "no CREDIT in twelve messages");
}

/// The spin right after a predicted take reads the engine's socket: the
/// take consumed the short read's drained hint, as the round it stands for
/// does (`rx_inner` takes it). A message that is on the socket by then is
/// returned by that one spin (it makes the usual round: the take left the
/// socket not quiet). Fails with the hint left: that round skips its read
/// and says `EAGAIN`.
#[test]
fn the_spin_after_a_predicted_take_reads_the_next_message() {
    let (a, b) = tcp_pair();
    let (xa, xb) = switch_both(&a, &b, &opts());
    let wire8 = wire_len(&xa, &xb, 8);
    for round in 0..5u64 {
        // Ends with a predicted take (the usual take of the last round's
        // message left its slot for a batch, which comes first).
        until_predicted(&xa, &xb);
        let mut buf = [0; 8];
        xb.send(&pattern(8, round + 50), false, Some(LIMIT))
            .unwrap();
        let t = Instant::now();
        while engine_socket_bytes(&xa) < wire8 {
            assert!(t.elapsed() < LIMIT, "round {round}: the message never came");
        }
        assert!(!xa.quiet_now(), "round {round}: quiet after a take");
        assert_eq!(
            spin_once(&xa, &mut buf),
            Some(8),
            "round {round}: the spin after the take did not read"
        );
        assert_eq!(buf[..], pattern(8, round + 50)[..], "round {round}");
    }
}

/// A receive-only end whose first DATA is taken by the predicted receive
/// lowers its smallest retransmission timeout (`Options::rto_min`), as the
/// usual path's `process` does (`lower_rto`). The first DATA is predicted
/// only on an end that received an FPDU before it (the core's first FPDU
/// is the general path's: the responder's, which gets the initiator's
/// first FPDU at the switch; which end that is depends on the switch's
/// race): pairs are made until one's is, at most 30 (about three in five
/// are). Fails with the take not lowering it.
#[test]
fn a_predicted_first_data_lowers_a_receive_only_ends_rto() {
    let Some(kernel) = rto_min_us(&tcp_pair().0) else {
        eprintln!("TCP_RTO_MIN_US unsupported here (Linux < 6.15)");
        return;
    };
    let wire8 = {
        let (a, b) = tcp_pair();
        let (xa, xb) = switch_both(&a, &b, &opts());
        wire_len(&xa, &xb, 8)
    };
    for _ in 0..30 {
        let (a, b) = tcp_pair();
        let (xa, xb) = switch_both(&a, &b, &opts());
        assert_eq!(rto_min_us(&a), Some(kernel), "lowered before any DATA");
        arrive_while_quiet(&xa, &xb, &[pattern(8, 1)], wire8);
        let taken = xa.predicted_answers();
        assert_eq!(spin_message(&xa, 8), pattern(8, 1));
        if xa.predicted_answers() == taken {
            // The general path took it (and lowered it): a new pair.
            continue;
        }
        let low = rto_min_us(&a).expect("the option");
        assert!(
            (5000..=20_000).contains(&low) && low < kernel,
            "a receive-only end after its first DATA, predicted: {low} µs"
        );
        return;
    }
    panic!("no pair's first DATA predicted in 30");
}

/// A non-blocking predicted take of the 8-byte message `pattern(8, round)`
/// (`at` names the case in a failure).
fn take_predicted(xa: &XSocket, round: u64, at: &str) {
    let mut buf = [0; 8];
    assert_eq!(
        quiet_answer_predicted(xa, &mut buf, NONBLOCKING, true),
        (8, false),
        "{at}"
    );
    assert_eq!(buf, pattern(8, round)[..], "{at}");
}

/// A predicted take leaves the progress thread's watch as the full
/// settle would: its rearm is skipped when nothing the watch follows
/// changed (`take_settled`), so a socket that must be watched while no
/// call runs — a `select` loop's (`set_background`) — stays watched for
/// input after each answer, and one that needs no watch stays unwatched;
/// and the answer's readiness is the full look's (nothing left readable,
/// writable). Fails with the watch or the readiness of the take's short
/// tail wrong (the debug build's checks inside the take fail first).
#[test]
fn a_predicted_take_leaves_the_watch_and_readiness_as_settle_would() {
    for background in [true, false] {
        let (a, b) = tcp_pair();
        let (xa, xb) = switch_both(&a, &b, &opts());
        xa.set_background(background);
        until_predicted(&xa, &xb);
        let want = if background {
            XSocket::WATCH_INPUT
        } else {
            XSocket::WATCH_OFF
        };
        let wire8 = wire_len(&xa, &xb, 8);
        for round in 0..4u64 {
            let at = format!("round {round}, background {background}");
            arrive_while_quiet(&xa, &xb, &[pattern(8, round)], wire8);
            assert_eq!(xa.watching(), want, "{at}: before the take");
            take_predicted(&xa, round, &at);
            assert_eq!(xa.watching(), want, "{at}: after the take");
            let r = xa.readiness();
            assert!(
                !r.readable && r.writable && !r.hup && !r.error,
                "{at}: {r:?}"
            );
            // Both ways still: our answer.
            xa.send(&pattern(8, round + 100), false, Some(LIMIT))
                .unwrap();
            assert_eq!(spin_message(&xb, 8), pattern(8, round + 100), "{at}");
        }
    }
}

/// A writer's wait for writability begun (or ended) by another thread
/// while the socket is quiet — `set_writable_wait` is written without the
/// socket's lock — reaches the watch at the next predicted take as the
/// full settle's rearm would: the skipped rearm (`take_settled`) is taken
/// only while the wait is what the last rearm looked at. Helper 81's
/// review: before, the watch stayed off (or on) until the writer's own
/// round ("watch left stale"), and a debug build's check inside the take
/// failed.
#[test]
fn a_writable_wait_changed_while_quiet_reaches_the_watch_at_the_take() {
    for began in [true, false] {
        let (a, b) = tcp_pair();
        let (xa, xb) = switch_both(&a, &b, &opts());
        until_predicted(&xa, &xb);
        let wire8 = wire_len(&xa, &xb, 8);
        let (was, now) = if began {
            (XSocket::WATCH_OFF, XSocket::WATCH_INPUT)
        } else {
            (XSocket::WATCH_INPUT, XSocket::WATCH_OFF)
        };
        for round in 0..4u64 {
            let at = format!("round {round}, wait begun {began}");
            xa.set_writable_wait(!began);
            // A full look: its round rearms for the wait as it stands.
            let _ = xa.readiness();
            arrive_while_quiet(&xa, &xb, &[pattern(8, round)], wire8);
            assert_eq!(xa.watching(), was, "{at}: before the change");
            // As another thread would, without the socket's lock.
            xa.set_writable_wait(began);
            take_predicted(&xa, round, &at);
            assert_eq!(xa.watching(), now, "{at}: watch left stale");
        }
    }
}
