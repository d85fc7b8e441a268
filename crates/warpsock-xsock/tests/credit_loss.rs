//! One lost credit return must not stop the stream.
//!
//! A reader's CREDIT messages travel alone on the reverse TCP direction,
//! and Linux repairs a lost lone segment only by a loss probe (2 RTT +
//! `tcp_rto_min`, 200 ms), not by fast retransmit, which needs a later
//! segment to be acknowledged. So whenever one of the reader's messages is
//! held back (lost, and everything after it on that direction with it:
//! TCP delivers in order), the writer must still hold enough credits to
//! send the messages that make the reader's next return due: that next
//! message is the later segment whose SACK repairs the lost one.
//!
//! Each case holds back the reader's k-th message (and all later ones), for
//! every k in turn, runs until nothing moves, and checks that the reader
//! put at least one more message on the wire.

use std::collections::VecDeque;

use warpsock_xsock::wire::{Hello, Msg, MAX_CONTROL_LEN};
use warpsock_xsock::{Stream, TxStep};

/// Steps after which a stalled pair is taken as stopped.
const QUIET_STEPS: u64 = 200;

struct End {
    s: Stream,
    /// Our receive slots still posted, in posting order.
    posted: VecDeque<u32>,
}

impl End {
    fn new(local: Hello, peer: Hello) -> Self {
        Self {
            s: Stream::new(local, peer),
            posted: (0..u32::from(local.slots)).collect(),
        }
    }

    fn deliver(&mut self, bytes: &[u8]) {
        let slot = self
            .posted
            .pop_front()
            .expect("a Send found no posted receive: credits were violated");
        self.s
            .on_message(slot, bytes)
            .unwrap_or_else(|e| panic!("protocol error: {e}"));
        self.repost();
    }

    fn repost(&mut self) {
        let posted = &mut self.posted;
        self.s.post_reposts(|freed| {
            posted.extend(freed);
            Ok(())
        });
    }
}

fn encode(m: Msg, payload: usize) -> Vec<u8> {
    let mut b = vec![0; MAX_CONTROL_LEN];
    let n = m.encode(&mut b);
    b.truncate(n);
    b.resize(n + payload, 0x5a);
    b
}

/// A writer with endless data and a reader that reads as soon as `chunk`
/// messages' worth of bytes are queued, over links of `delay` steps.
/// Returns how many messages the reader sent when its `hold`-th message
/// (counting from 0) and every later one never arrive.
fn reader_messages_with_hold(slots: u16, chunk: usize, delay: u64, hold: u64) -> u64 {
    let hello = Hello {
        slots,
        slot_size: 256,
    };
    let mut w = End::new(hello, hello);
    let mut r = End::new(hello, hello);
    let payload = hello.payload();
    let mut to_r: VecDeque<(u64, Vec<u8>)> = VecDeque::new();
    let mut to_w: VecDeque<(u64, Vec<u8>)> = VecDeque::new();
    let mut r_sent = 0u64;
    let mut last_move = 0u64;
    let mut now = 0u64;
    while now - last_move < QUIET_STEPS {
        // The writer: control first, then as much data as its credits allow.
        while let Some(m) = w.s.poll_msg() {
            to_r.push_back((now + delay, encode(m, 0)));
            last_move = now;
        }
        loop {
            match w.s.tx_data(1 << 20, false) {
                TxStep::Data { msg, len } => {
                    to_r.push_back((now + delay, encode(msg, len)));
                    last_move = now;
                }
                TxStep::Control => {
                    while let Some(m) = w.s.poll_msg() {
                        to_r.push_back((now + delay, encode(m, 0)));
                    }
                }
                TxStep::Blocked => break,
                TxStep::Write { .. } => unreachable!("no sink is offered"),
            }
        }
        now += 1;
        // The reader takes each message as it lands.
        while to_r.front().is_some_and(|(t, _)| *t <= now) {
            let (_, bytes) = to_r.pop_front().expect("front");
            r.deliver(&bytes);
            if r.s.readable() >= chunk * payload {
                let n = r.s.readable();
                r.s.consume(n);
                r.repost();
            }
            loop {
                // What `XSocket::flush` asks before `poll_msg`.
                let owes = r.s.owes_msg();
                let Some(m) = r.s.poll_msg() else { break };
                assert!(owes, "a credit return due with none owed");
                if r_sent < hold {
                    to_w.push_back((now + delay, encode(m, 0)));
                }
                r_sent += 1;
                last_move = now;
            }
        }
        while to_w.front().is_some_and(|(t, _)| *t <= now) {
            let (_, bytes) = to_w.pop_front().expect("front");
            w.deliver(&bytes);
        }
        assert!(now < 1_000_000, "the pair never settles");
    }
    r_sent
}

fn each_hold_is_followed(slots: u16, chunk: usize, delay: u64) {
    for hold in 0..3 * u64::from(slots) {
        let sent = reader_messages_with_hold(slots, chunk, delay, hold);
        assert!(
            sent > hold + 1,
            "{slots} slots, reads of {chunk} messages, delay {delay}: with the reader's \
             message {hold} held back it sent {sent} in all, none after it — the stream \
             waits for a loss probe"
        );
    }
}

/// The window a socket gets by default (`Options::default()`), whatever
/// it is set to.
#[test]
fn a_held_back_credit_return_is_followed_by_another_default_window() {
    let slots = warpsock_xsock::io::Options::default().slots;
    for chunk in [1, 2] {
        each_hold_is_followed(slots, chunk, 3);
    }
}

#[test]
fn a_held_back_credit_return_is_followed_by_another_16_slots() {
    for delay in [1, 3, 10] {
        for chunk in [1, 2, 4] {
            each_hold_is_followed(16, chunk, delay);
        }
    }
}

#[test]
fn a_held_back_credit_return_is_followed_by_another_32_and_64_slots() {
    for slots in [32, 64] {
        for chunk in [1, 4] {
            each_hold_is_followed(slots, chunk, 3);
        }
    }
}

#[test]
fn a_held_back_credit_return_is_followed_by_another_8_slots() {
    each_hold_is_followed(8, 1, 2);
}
