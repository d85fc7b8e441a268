//! The books' message-mode rules, one state at a time (issue 12, reviews
//! r19-xdead and r20-xdead2a): when a CREDIT of CREDITs' slots goes back,
//! and what a peek of a part holds readable.

mod util;

use util::{encode, hello, repost_all};
use warpsock_xsock::wire::{Body, Msg};
use warpsock_xsock::{Stream, TxStep};

/// A CREDIT's slot alone is returned to a short peer (`Stream::credit_due`)
/// unless a send of ours waits for the credit it would take and we hold
/// other messages of the peer's: the waiting call's DATA carries the
/// return, and the DATA we hold makes a return due once read, which the
/// reader does then (`Stream::msg_part_due`). Two message-mode ends
/// holding all but two of each other's slots (`tests/msg_mode.rs`)
/// otherwise traded one-slot CREDITs for ever: each arrival made the peer
/// short and its return due at once, the send calls waiting on that
/// credit never got it. With no send waiting it goes at once, and a
/// message that fits the window is read whole (review r19-xdead item 2).
/// A DATA message of 10 bytes, `eom` as given.
fn data(eom: bool) -> Vec<u8> {
    let mut d = encode(Msg {
        credits: 0,
        body: Body::Data { eom },
    });
    d.extend_from_slice(&[7; 10]);
    d
}

/// A CREDIT returning `credits` slots.
fn credit(credits: u16) -> Vec<u8> {
    encode(Msg {
        credits,
        body: Body::Credit,
    })
}

/// Our send call waits: 15 messages sent, the last credit kept.
fn waiting() -> Stream {
    let mut s = Stream::new(hello(16, 256), hello(16, 256));
    for _ in 0..15 {
        assert!(matches!(s.tx_data(10, true), TxStep::Data { .. }));
    }
    assert_eq!(s.tx_data(10, true), TxStep::Blocked);
    s
}

/// [`waiting`], holding 14 parts of the peer's and its CREDIT of `n`
/// (which took a fifteenth slot): the peer holds one credit.
fn waiting_with_a_short_peer(n: u16) -> Stream {
    let mut s = waiting();
    for slot in 0..14 {
        s.on_message(slot, &data(false)).unwrap();
    }
    s.on_message(14, &credit(n)).unwrap();
    assert_eq!(repost_all(&mut s), [14]);
    assert!(s.msg_part_due());
    s
}

#[test]
fn a_credits_slot_alone_goes_back_unless_our_waiting_send_needs_the_credit() {
    let part = data(false);
    let mut s = waiting();
    for slot in 0..14 {
        s.on_message(slot, &part).unwrap();
    }
    assert!(!s.msg_part_due(), "the peer holds two credits");
    // The peer's CREDIT returns one (we hold two) and takes a third slot:
    // it holds one credit.
    s.on_message(14, &credit(1)).unwrap();
    assert_eq!(repost_all(&mut s), [14]);
    assert!(s.msg_part_due(), "the peer's one credit needs a return");
    assert!(
        !s.owes_msg() && s.poll_msg().is_none(),
        "a CREDIT for a CREDIT, with the credit our send waits for"
    );
    // The waiting call's DATA carries the return.
    assert!(matches!(s.tx_data(10, true), TxStep::Data { msg, .. } if msg.credits == 1));
    // The reader takes the parts: their return is due.
    s.consume(14 * 10);
    assert_eq!(repost_all(&mut s).len(), 14);
    assert!(matches!(s.poll_msg(), Some(m) if m.credits == 14 && m.body == Body::Credit));
    // A call that waited, with credits back since: the CREDIT leaves it
    // two.
    let mut s = waiting();
    s.on_message(0, &credit(15)).unwrap();
    assert_eq!(repost_all(&mut s), [0]);
    for slot in 1..15 {
        s.on_message(slot, &part).unwrap();
    }
    assert!(matches!(s.poll_msg(), Some(m) if m.credits == 1 && m.body == Body::Credit));
    // No send of ours waiting: four CREDITs' slots go back as soon as the
    // peer is short (11 parts of a 12-part message), and the message
    // arrives whole.
    let mut s = Stream::new(hello(16, 256), hello(16, 256));
    for slot in 0..4 {
        s.on_message(slot, &credit(0)).unwrap();
    }
    assert_eq!(repost_all(&mut s).len(), 4);
    for slot in 4..15 {
        s.on_message(slot, &part).unwrap();
    }
    assert!(matches!(s.poll_msg(), Some(m) if m.credits == 4 && m.body == Body::Credit));
    assert!(!s.msg_part_due());
    s.on_message(0, &data(true)).unwrap();
    assert_eq!(s.message_end(), Some(12 * 10));
    // Nothing else held (3 slots: the peer's two CREDITs): their slots go
    // back, or the peer, with one credit and maybe nothing to return,
    // could not send again.
    let mut s = Stream::new(hello(3, 256), hello(16, 256));
    s.on_message(0, &credit(0)).unwrap();
    s.on_message(1, &credit(0)).unwrap();
    assert_eq!(repost_all(&mut s).len(), 2);
    assert!(matches!(s.poll_msg(), Some(m) if m.credits == 2 && m.body == Body::Credit));
}

/// A call that waited, then gave up, leaves no wait behind once a later
/// send goes (review r20-xdead2b #1): a straight send did not clear the
/// flag, and CREDITs' slots were held back for a message that no longer
/// waited. A call that finds it set goes the general path once
/// (`tx_straight` declines), which clears it; the next CREDIT's slot goes
/// back to the short peer at once.
#[test]
fn a_send_after_a_call_that_gave_up_leaves_no_wait() {
    let mut s = waiting_with_a_short_peer(1);
    assert!(s.poll_msg().is_none(), "held for the waiting call");
    // That call gave up; the next goes the general path, with the return.
    assert!(s.tx_straight(10).is_none(), "a call was left blocked");
    assert!(matches!(s.tx_data(10, true), TxStep::Data { msg, .. } if msg.credits == 1));
    // The next CREDIT leaves us two credits and the peer short again.
    s.on_message(15, &credit(1)).unwrap();
    assert_eq!(repost_all(&mut s), [15]);
    assert!(s.msg_part_due());
    assert!(matches!(s.poll_msg(), Some(m) if m.credits == 1 && m.body == Body::Credit));
}

/// The hold needs two credits at most (review r20-xdead2b #3): with three
/// (a CREDIT of two), the CREDIT's slot goes back to the short peer though
/// a call waits — the call keeps two.
#[test]
fn at_three_credits_a_credits_slot_goes_back_though_a_call_waits() {
    let mut s = waiting_with_a_short_peer(2);
    assert!(matches!(s.poll_msg(), Some(m) if m.credits == 1 && m.body == Body::Credit));
}

/// The latch of a part a peek returned (`Stream::peeked_part`, review
/// r20-xdead2a #2) holds exactly the peeked bytes, counted from the read
/// position, until they are read: a latch that never expires, or sits
/// `n` bytes too far or at `n` from the stream's start, fails it. The
/// peer holds 2 credits or more throughout (`msg_part_due` false).
#[test]
fn a_peeked_parts_latch_holds_its_bytes_until_they_are_read() {
    let data = |eom, len| {
        let mut d = encode(Msg {
            credits: 0,
            body: Body::Data { eom },
        });
        d.extend(std::iter::repeat_n(7, len));
        d
    };
    let mut s = Stream::new(hello(16, 256), hello(16, 256));
    // The read position past the peek's length: 200.
    s.on_message(0, &data(true, 200)).unwrap();
    s.consume(200);
    assert_eq!(repost_all(&mut s), [0]);
    // Part A, peeked.
    s.on_message(1, &data(false, 100)).unwrap();
    assert!(!s.msg_part_readable());
    s.peeked_part(100);
    assert!(!s.msg_part_due() && s.msg_part_readable(), "A peeked");
    // Part B arrives: A is still unread.
    s.on_message(2, &data(false, 100)).unwrap();
    assert!(s.msg_part_readable(), "A unread");
    // A read: B was never peeked.
    s.consume(100);
    assert!(!s.msg_part_readable(), "B is not due, nor peeked");
    s.peeked_part(50);
    assert!(s.msg_part_readable());
    s.consume(50);
    assert!(!s.msg_part_readable(), "the peeked 50 bytes read");
}
