//! Message mode over real switched sockets, both ends sending messages
//! longer than the other's receive window at the same time (issue 12):
//! each reader holds the parts of the peer's message in its slots, and
//! each sender, down to its last credit, can send that credit only with a
//! return — of slots holding its own message, which the other reader holds
//! the same way. A reader takes the parts it holds once the peer may need
//! a return from it (`Stream::msg_part_due`); before, both ends waited
//! forever. Every message must arrive whole and in order, checked by
//! content: its parts without `MSG_EOR`, its end with it. Every call is
//! bounded (a hang fails the test at its timeout).

use std::time::{Duration, Instant};

use warpsock_xsock::io::{Options, RecvFlags, XSocket};

mod net;

use net::{pattern, small_window, switch_both, tcp_pair, LIMIT};

/// Messages each end sends.
const MSGS: u64 = 6;

/// How each end's reader reads.
#[derive(Debug, Clone, Copy)]
enum Reader {
    /// A buffer larger than every message.
    Whole,
    /// A buffer shorter than every message but longer than the window
    /// (24 KiB): only the peer being short releases a part
    /// (`Stream::msg_part_due`), and a message's rest may fill the
    /// buffer (a part without `MSG_EOR`, review r19-xdead item 4).
    Small,
    /// A peek (as large as `Whole`'s buffer) before each read, which must
    /// return the bytes the peek saw.
    Peek,
}

/// The `i`-th message `seed`'s end sends: 2 to 4 windows long.
fn message(o: &Options, seed: u64, i: u64) -> Vec<u8> {
    let window = usize::from(o.slots) * (o.slot_size as usize - 8);
    pattern(
        window * 2 + window * (i as usize % 3) + 17 * i as usize,
        seed * 100 + i,
    )
}

/// Reads `MSGS` messages from `x` as `how` says; returns them, each put
/// together from its parts (a part returned without `MSG_EOR`, the end
/// with it).
fn read_messages(x: &XSocket, how: Reader) -> Vec<Vec<u8>> {
    let short = Some(Duration::from_secs(4));
    let size = match how {
        Reader::Small => 24 << 10,
        Reader::Whole | Reader::Peek => 256 << 10,
    };
    let mut buf = vec![0u8; size];
    let mut peeked = vec![0u8; size];
    let mut msgs = Vec::new();
    let mut cur = Vec::new();
    let t = Instant::now();
    while (msgs.len() as u64) < MSGS {
        assert!(
            t.elapsed() < LIMIT,
            "{} messages, {} bytes of the next",
            msgs.len(),
            cur.len()
        );
        let what = || format!("after {} messages and {} bytes", msgs.len(), cur.len());
        let mut seen = None;
        if let Reader::Peek = how {
            let peek = RecvFlags {
                peek: true,
                ..RecvFlags::default()
            };
            let (n, eor) = x
                .recv(&mut peeked, peek, short)
                .unwrap_or_else(|e| panic!("peek {}: {e}", what()));
            seen = Some((n, eor));
        }
        let (n, eor) = x
            .recv(&mut buf, RecvFlags::default(), short)
            .unwrap_or_else(|e| panic!("read {}: {e}", what()));
        assert!(n > 0, "end of stream {}", what());
        if let Some((p, peor)) = seen {
            // More of the message may have come since the peek (a part
            // peeked, then the whole read), never less.
            assert!(n >= p, "the read has less than the peek saw, {}", what());
            assert!(
                !peor || (n, eor) == (p, true),
                "the peek's end moved, {}",
                what()
            );
            assert!(
                peeked[..p] == buf[..p],
                "the peek saw other bytes, {}",
                what()
            );
        }
        cur.extend_from_slice(&buf[..n]);
        if eor {
            msgs.push(std::mem::take(&mut cur));
        }
    }
    msgs
}

/// Both ends in message mode, each with a sending and a reading thread,
/// send each other `MSGS` messages of 2 to 4 windows at once.
fn exchange(how: Reader) {
    let o = small_window();
    let (a, b) = tcp_pair();
    let (xa, xb) = switch_both(&a, &b, &o);
    xa.set_msg_mode(true);
    xb.set_msg_mode(true);
    let short = Some(Duration::from_secs(4));
    std::thread::scope(|sc| {
        for (x, seed) in [(&xa, 1), (&xb, 2)] {
            let o = &o;
            sc.spawn(move || {
                for i in 0..MSGS {
                    let m = message(o, seed, i);
                    let n = x
                        .send(&m, false, short)
                        .unwrap_or_else(|e| panic!("end {seed}'s send {i}: {e}"));
                    assert_eq!(n, m.len(), "end {seed}'s send {i} stopped short");
                }
            });
        }
        let ra = sc.spawn(|| read_messages(&xa, how));
        let rb = sc.spawn(|| read_messages(&xb, how));
        for (r, from) in [(ra, 2), (rb, 1)] {
            let got = r.join().unwrap();
            for (i, m) in got.iter().enumerate() {
                let want = message(&o, from, i as u64);
                assert_eq!(m.len(), want.len(), "{how:?}: message {i} from end {from}");
                assert!(*m == want, "{how:?}: message {i} from end {from} differs");
            }
        }
    });
}

#[test]
fn both_ends_send_messages_past_the_window_at_once() {
    exchange(Reader::Whole);
}

#[test]
fn both_ends_send_past_the_window_to_small_buffers() {
    exchange(Reader::Small);
}

#[test]
fn both_ends_send_past_the_window_to_peeking_readers() {
    exchange(Reader::Peek);
}
