//! Two ends that both shut their sending side (`shutdown(SHUT_WR)` on
//! both), neither reading the other's data, each holding one credit with
//! a message queued that needs two (an IOUNMAP): the ends go quiet, as two
//! idle TCP ends do. Each may spend its last credit once on a CREDIT to
//! ask for returns (`Stream::credit_due`'s ask after our own EOF); before
//! that was once per episode, they traded one-slot CREDITs for ever
//! (review r28-d item 1). Sans-IO: two `Stream`s and the messages between
//! them, nothing else.

use warpsock_xsock::wire::{Body, Msg, MAX_CONTROL_LEN};
use warpsock_xsock::{Hello, Stream, TxStep};

/// `m` encoded, followed by `payload` bytes of stream data.
fn encode(m: Msg, payload: usize) -> Vec<u8> {
    let mut b = vec![0; MAX_CONTROL_LEN];
    let n = m.encode(&mut b);
    b.truncate(n);
    b.resize(n + payload, 7);
    b
}

/// One end: its stream and its posted receive slots.
struct End {
    s: Stream,
    posted: Vec<u32>,
}

impl End {
    fn new() -> Self {
        let hello = Hello {
            slots: 4,
            slot_size: 256,
        };
        Self {
            s: Stream::new(hello, hello),
            posted: vec![3, 2, 1, 0],
        }
    }

    /// A message from the peer lands in a posted slot.
    fn land(&mut self, b: &[u8]) {
        let slot = self
            .posted
            .pop()
            .expect("the peer sent with no slot posted");
        self.s.on_message(slot, b).unwrap();
    }

    /// Freed slots posted again.
    fn repost(&mut self) {
        let mut again = Vec::new();
        assert!(!self.s.post_reposts(|sl| {
            again.extend_from_slice(sl);
            Ok(())
        }));
        self.posted.extend(again);
    }

    /// Two 10-byte DATA messages, then the EOF.
    fn write_then_shut(&mut self) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        for _ in 0..2 {
            let TxStep::Data { msg, len } = self.s.tx_data(10, true) else {
                panic!("no credit for DATA");
            };
            out.push(encode(msg, len));
            self.s.tx_end_call();
        }
        self.s.shutdown_write();
        let m = self.s.poll_msg().expect("the EOF");
        assert_eq!(m.body, Body::Eof);
        out.push(encode(m, 0));
        out
    }
}

#[test]
fn two_half_closed_ends_that_read_nothing_go_quiet() {
    let (mut a, mut b) = (End::new(), End::new());
    let to_b = a.write_then_shut();
    let to_a = b.write_then_shut();
    to_b.iter().for_each(|m| b.land(m));
    to_a.iter().for_each(|m| a.land(m));
    for e in [&mut a, &mut b] {
        e.repost();
        assert!(e.s.poll_msg().is_none(), "nothing due before the unmaps");
        assert_eq!(e.s.credits(), 1, "one credit left after DATA, DATA, EOF");
        e.s.announce_unmap(0);
    }
    let (mut ma, mut mb) = (a.s.poll_msg(), b.s.poll_msg());
    let mut sent = 0;
    for _ in 0..50 {
        if ma.is_none() && mb.is_none() {
            // Quiet: each end asked at most once (two CREDITs each way
            // at most, the answers included).
            assert!(sent <= 4, "{sent} messages before the ends went quiet");
            assert!(a.s.has_output() && b.s.has_output(), "the unmaps wait");
            return;
        }
        for (m, to) in [(ma, &mut b), (mb, &mut a)] {
            if let Some(m) = m {
                assert_eq!(m.body, Body::Credit, "only CREDITs can go at one credit");
                sent += 1;
                to.land(&encode(m, 0));
            }
        }
        a.repost();
        b.repost();
        ma = a.s.poll_msg();
        mb = b.s.poll_msg();
    }
    panic!("still trading CREDITs after 50 rounds ({sent} messages): a {ma:?}, b {mb:?}");
}
