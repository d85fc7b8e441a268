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

use std::sync::mpsc;
use std::time::Instant;

use warpsock_xsock::io::{Options, RecvFlags, XSocket};

mod net;

use net::{opts, pattern, switch_both, tcp_pair, LIMIT};

/// A blocking receive with no flag and no timeout: the straight path's.
fn recv_blocking(x: &XSocket, buf: &mut [u8]) -> (usize, bool) {
    x.recv(buf, RecvFlags::default(), None)
        .expect("blocking receive")
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

/// `rounds` 8 B messages from `xb` to `xa`, each sent once `xa` took the
/// one before and its next blocking receive is parked (so its read brings
/// that one FPDU alone), in stream or message mode: every byte and
/// boundary, and how many `xa` took through the predicted take.
fn lone_messages(o: &Options, msg_mode: bool, rounds: u64) -> u64 {
    let (a, b) = tcp_pair();
    let (xa, xb) = switch_both(&a, &b, o);
    xa.set_msg_mode(msg_mode);
    xb.set_msg_mode(msg_mode);
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
            let (n, eor) = recv_blocking(xa, &mut buf);
            let at = format!("message {i}, message mode {msg_mode}");
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
/// mode: every message, and all but the first few predicted (the first
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
            let taken = lone_messages(&o, msg_mode, 40);
            assert!(
                taken >= 30,
                "CRC {crc}, message mode {msg_mode}: {taken} of 40 predicted"
            );
        }
    }
}

/// What the predicted take declines goes the usual way, with the usual
/// result: two messages that one read brings (the first returned, the
/// second read from the books with no wait), and a message longer than
/// the buffer (the stream's first bytes, then the rest) — none of them
/// predicted.
#[test]
fn a_parked_read_it_cannot_take_alone_is_received_as_usual() {
    let (a, b) = tcp_pair();
    let (xa, xb) = switch_both(&a, &b, &opts());
    let (go, sent) = mpsc::channel::<()>();
    std::thread::scope(|s| {
        let xa = &xa;
        s.spawn(move || {
            // Warm up: the first FPDUs are the general path's anyway.
            for i in 0..4 {
                until_parked(xa, "warm-up");
                xb.send(&pattern(8, i), false, Some(LIMIT)).expect("send");
            }
            // Two messages in one go, sent before the reader's receive.
            let two = [pattern(8, 10), pattern(8, 11)].concat();
            xb.send(&two[..8], false, Some(LIMIT)).expect("send");
            xb.send(&two[8..], false, Some(LIMIT)).expect("send");
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
        sent.recv_timeout(LIMIT).expect("the two messages");
        let before = xa.parked_predictions();
        // Both on the socket (or read already): the engine's read, when
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
