//! The books of the predicted receive (issue 12, `XSocket`'s quiet spin):
//! a DATA message taken straight from the engine's read has its slot
//! posted again at once and alone (`Stream::post_last_freed`), ahead of
//! any slots the usual path's takes left for a batched repost, which are
//! then posted too (`XSocket`'s `predicted_taken`). The peer must see the
//! same credit returns as if the slot had joined the batch: a CREDIT due
//! after the same messages, returning the same slots.

mod util;

use util::{encode, hello, Rng};
use warpsock_xsock::wire::{Body, Msg};
use warpsock_xsock::Stream;

/// A DATA message of 8 bytes returning `credits`.
fn data(credits: u16) -> Vec<u8> {
    let mut d = encode(Msg {
        credits,
        body: Body::Data { eom: true },
    });
    d.extend_from_slice(&[3; 8]);
    d
}

/// The usual path's repost after a take (`XSocket::repost`: every freed
/// slot is a take's, so the batch waits unless the books want it now).
fn repost_if_due(s: &mut Stream) {
    if s.unposted() > 0 && s.repost_due() {
        assert!(!s.post_reposts(|_| Ok(())));
    }
}

/// A one-way stream of `n` messages into `slots` slots read as they land,
/// each taken by the predicted receive or not as `rng` draws (`percent`
/// predicted), against the same stream read by the usual path alone:
/// after every message both owe a CREDIT or neither, and the CREDITs
/// return the same slots. The peer sends only with two credits (its last
/// is kept for a CREDIT) and returns our CREDITs' slots with its next
/// DATA, so the window's end is met too.
fn same_returns(slots: u16, n: u64, seed: u64, percent: u64) {
    let mut rng = Rng::new(seed);
    let mut usual = Stream::new(hello(slots, 256), hello(slots, 256));
    let mut predicted = Stream::new(hello(slots, 256), hello(slots, 256));
    // The predicted books made the long way (`take_message`, then
    // `post_last_freed`), kept step for step with `predicted`.
    let mut reference = Stream::new(hello(slots, 256), hello(slots, 256));
    // The peer's credits, as it counts them, and the slots of our CREDITs
    // it holds, which its next DATA returns (it reads them at once).
    let mut peer = u32::from(slots);
    let mut ours = 0;
    let mut slot = 0u32;
    for i in 0..n {
        let at = format!("message {i}, {slots} slots, seed {seed}");
        assert!(peer >= 2, "{at}: the peer stalled");
        peer -= 1;
        let m = data(std::mem::take(&mut ours));
        let take = |s: &mut Stream| {
            let t = s.take_message(slot, &m, 64, false).expect(&at);
            assert_eq!(t.len, 8, "{at}");
        };
        take(&mut usual);
        repost_if_due(&mut usual);
        // A predicted take posts its slot (`take_message_reposted`: the
        // take and `post_last_freed` in one, the books exactly theirs,
        // as `reference` makes them), then the batch waiting (at once:
        // `predicted_taken`); the usual path's take asks for the batch.
        if rng.chance(percent) {
            let t = predicted
                .take_message_reposted(slot, &m, 64, false)
                .expect(&at);
            assert_eq!(t.len, 8, "{at}");
            take(&mut reference);
            reference.post_last_freed(slot);
            assert_eq!(
                format!("{predicted:?}"),
                format!("{reference:?}"),
                "{at}: take_message_reposted's books"
            );
            for s in [&mut predicted, &mut reference] {
                assert!(!s.post_reposts(|_| Ok(())));
            }
        } else {
            for s in [&mut predicted, &mut reference] {
                take(s);
                repost_if_due(s);
            }
        }
        slot = (slot + 1) % u32::from(slots);
        assert_eq!(usual.owes_msg(), predicted.owes_msg(), "{at}: owed");
        if usual.owes_msg() {
            let (a, b) = (usual.poll_msg(), predicted.poll_msg());
            assert_eq!(reference.poll_msg(), b, "{at}: the reference's CREDIT");
            let (Some(a), Some(b)) = (a, b) else {
                panic!("{at}: a CREDIT owed and not given");
            };
            assert!(matches!(a.body, Body::Credit), "{at}");
            assert_eq!(a.credits, b.credits, "{at}: the slots returned");
            assert_eq!(format!("{:?}", a.body), format!("{:?}", b.body), "{at}");
            peer += u32::from(a.credits);
            ours += 1;
        }
    }
}

/// Windows of 4 to 64 slots, all messages predicted, none, and a mix.
#[test]
fn a_slot_posted_alone_returns_as_the_batch_would() {
    for slots in [4, 8, 12, 16, 64] {
        for (seed, percent) in [(1, 100), (2, 0), (3, 50), (4, 90), (5, 10), (6, 70)] {
            same_returns(slots, 2000, seed, percent);
        }
    }
}
