//! What a peer can make the books hold is bounded (review r20-xdead2a
//! #4): mappings it announces, and sinks it offers with their answers. A
//! peer past a bound fails the connection (`StreamError::TooMany`, which
//! the socket answers with a Terminate) instead of growing our memory.

mod util;

use util::{encode, hello, repost_all};
use warpsock_xsock::stream::{PEER_MAPS_MAX, PEER_SINKS_MAX};
use warpsock_xsock::wire::{Body, IoMapAd, Msg, SinkAd};
use warpsock_xsock::{Stream, StreamError};

/// Feeds `s` the peer's messages `bodies` in turn as a well-behaved peer
/// would send them credit-wise: each returns the credits our messages
/// took since the last, and our returns are posted and sent as they fall
/// due. Returns the first error, and after how many messages.
fn feed(s: &mut Stream, bodies: impl Iterator<Item = Body>) -> Option<(usize, StreamError)> {
    let mut ours = 0;
    for (i, body) in bodies.enumerate() {
        let m = encode(Msg {
            credits: std::mem::take(&mut ours),
            body,
        });
        if let Err(e) = s.on_message(i as u32 % 16, &m) {
            return Some((i, e));
        }
        repost_all(s);
        while s.poll_msg().is_some() {
            ours += 1;
        }
    }
    None
}

#[test]
fn a_peer_cannot_announce_mappings_without_end() {
    let map = |i: u64| {
        Body::IoMap(IoMapAd {
            offset: i << 20,
            len: 4096,
            to: 0,
            stag: 7,
            access: 3,
        })
    };
    let mut s = Stream::new(hello(16, 256), hello(16, 256));
    // Announcing the same offsets again replaces, and is not counted.
    let again = (0..PEER_MAPS_MAX as u64)
        .chain(0..PEER_MAPS_MAX as u64)
        .map(map);
    assert_eq!(feed(&mut s, again), None);
    assert!(s.peer_map(5 << 20, 10, true).is_ok());
    assert_eq!(
        feed(&mut s, [map(PEER_MAPS_MAX as u64)].into_iter()),
        Some((
            0,
            StreamError::TooMany {
                what: "mappings",
                max: PEER_MAPS_MAX
            }
        ))
    );
}

#[test]
fn a_peer_cannot_offer_sinks_without_end() {
    let sink = |id: u32| {
        Body::Sink(SinkAd {
            id,
            len: 1 << 20,
            rx_seq: 0,
            stag: 9,
            to: 0,
            waitall: false,
        })
    };
    // The first sink is at our position (in use), the others wait behind
    // it: a well-behaved reader offers one at a time.
    let mut s = Stream::new(hello(16, 256), hello(16, 256));
    assert_eq!(
        feed(&mut s, (1..=PEER_SINKS_MAX as u32 + 1).map(sink)),
        Some((
            PEER_SINKS_MAX,
            StreamError::TooMany {
                what: "sinks",
                max: PEER_SINKS_MAX
            }
        ))
    );
    // Sinks behind our position are declined at once; their answers wait
    // for credits we do not have (the peer returns none) and count too.
    let mut s = Stream::new(hello(16, 256), hello(16, 256));
    while s.credits() > 1 {
        assert!(matches!(
            s.tx_data(10, true),
            warpsock_xsock::TxStep::Data { .. }
        ));
    }
    let mut got = None;
    for id in 1..=PEER_SINKS_MAX as u32 + 1 {
        let m = encode(Msg {
            credits: 0,
            body: sink(id),
        });
        if let Err(e) = s.on_message(id, &m) {
            got = Some((id, e));
            break;
        }
    }
    assert_eq!(
        got,
        Some((
            PEER_SINKS_MAX as u32 + 1,
            StreamError::TooMany {
                what: "sinks",
                max: PEER_SINKS_MAX
            }
        ))
    );
    assert!(s.has_output(), "the answers wait for credits");
}

/// Our own offers stay within the peer's bound (session 22: the `aio`
/// case failed with `TooMany` in 2 of 4 `test-xsock.sh` runs). Each offer
/// here is declined by DATA the writer sent before the offer reached it:
/// final to us at once, while the writer still holds it, or its answer
/// queued behind credits it lacks, until that SINK_DONE arrives (none does
/// here). A reader that offers whenever [`Stream::sink_due`] says so must
/// leave at most `PEER_SINKS_MAX - 1` unanswered, which the writer accepts
/// (`a_peer_cannot_offer_sinks_without_end`: it fails at the fifth).
#[test]
fn sinks_declined_by_the_stream_still_count_until_answered() {
    let mut reader = Stream::new(hello(16, 256), hello(16, 256));
    let mut offered = 0;
    for i in 0..64u32 {
        if reader.sink_due() {
            reader.post_sink(9, 0, 1 << 20, false);
        }
        while let Some(m) = reader.poll_msg() {
            offered += usize::from(matches!(m.body, Body::Sink(_)));
        }
        let mut d = encode(Msg {
            credits: 0,
            body: Body::Data { eom: true },
        });
        d.extend_from_slice(b"abc");
        reader.on_message(i % 16, &d).unwrap();
        reader.consume(3);
        repost_all(&mut reader);
    }
    assert_eq!(offered, PEER_SINKS_MAX - 1, "offers, none answered");
    assert!(!reader.sink_room(), "no room until answers come");
    // An answer makes room again.
    let done = encode(Msg {
        credits: 0,
        body: Body::SinkDone {
            id: 1,
            len: 0,
            eom: false,
        },
    });
    reader.on_message(0, &done).unwrap();
    assert!(reader.sink_room());
}

/// A peer's tagged offsets are its own to choose: near the top of the
/// range our sums over them wrap, as the engine's do, and the Write goes
/// (the peer's engine then refuses it, or not: its memory) — never a
/// panic under the socket's lock. Fails in a debug build with the plain
/// additions (helper 33's review, session 35): an IOMAP whose `to` is the
/// last byte's, then a write one byte in; a SINK ending at the top, then
/// its second Write.
#[test]
fn a_peers_tagged_offsets_near_the_top_wrap() {
    use warpsock_xsock::TxStep;
    let mut s = Stream::new(hello(16, 256), hello(16, 256));
    let map = Body::IoMap(IoMapAd {
        offset: 0,
        len: u64::MAX,
        to: u64::MAX,
        stag: 7,
        access: 3,
    });
    assert_eq!(feed(&mut s, [map].into_iter()), None);
    assert_eq!(s.peer_map(1, 1, true), Ok((7, 0)));

    let mut s = Stream::new(hello(16, 256), hello(16, 256));
    let sink = Body::Sink(SinkAd {
        id: 1,
        len: 1 << 20,
        rx_seq: 0,
        stag: 9,
        to: u64::MAX - 10,
        waitall: false,
    });
    assert_eq!(feed(&mut s, [sink].into_iter()), None);
    assert!(matches!(
        s.tx_data(100, true),
        TxStep::Write { to, len: 100, .. } if to == u64::MAX - 10
    ));
    s.tx_wrote(100);
    assert!(matches!(
        s.tx_data(100, true),
        TxStep::Write {
            to: 89,
            len: 100,
            ..
        }
    ));
}

/// Our own announcements are bounded too: a map and its unmap while the
/// map is still queued send neither, and one unmap of an offset is queued
/// at most: a thousand map/unmap cycles of one offset, or of a new offset
/// each (the library's, `riomap(-1)`), queue nothing. A queued unmap is
/// never dropped: map (sent), unmap, map, unmap (queued) sends the one
/// unmap, the peer's first mapping gone with it. Fails with every
/// announcement queued (the first message polled is the first cycle's
/// IOMAP), with an unmap queued for each new offset (helper 65's review),
/// or with the queued unmap dropped by the second map (nothing sent: the
/// peer keeps the first mapping).
#[test]
fn our_map_and_unmap_announcements_cancel_while_queued() {
    let ad = |offset: u64| IoMapAd {
        offset,
        len: 4096,
        to: 0,
        stag: 7,
        access: 3,
    };
    let unmap = |offset: u64| Body::IoUnmap { offset };
    let mut s = Stream::new(hello(16, 256), hello(16, 256));
    for _ in 0..1000 {
        s.announce_map(ad(1 << 20));
        s.announce_unmap(1 << 20);
    }
    for k in 0..1000 {
        s.announce_map(ad((4 + k) << 20));
        s.announce_unmap((4 + k) << 20);
    }
    assert!(s.poll_msg().is_none(), "cancelled announcements were sent");
    s.announce_map(ad(2 << 20));
    assert!(matches!(s.poll_msg().map(|m| m.body), Some(Body::IoMap(_))));
    s.announce_unmap(2 << 20);
    s.announce_map(ad(2 << 20));
    s.announce_unmap(2 << 20);
    assert_eq!(s.poll_msg().map(|m| m.body), Some(unmap(2 << 20)));
    assert!(s.poll_msg().is_none(), "more than the one unmap");
}
