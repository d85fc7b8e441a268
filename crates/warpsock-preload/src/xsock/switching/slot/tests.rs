//! The places of switches under way, and one peer's share of them.

use std::net::IpAddr;
use std::sync::atomic::Ordering;
use std::sync::PoisonError;
use std::time::{Duration, Instant};

use super::super::tests::{accepted_from, SERIAL};
use super::super::{start, PEER_OVER};
use super::*;
use crate::shim::sys;

/// A remote peer's block, seen from a global IPv6 address elsewhere.
fn ip(s: &str) -> Option<PeerBlock> {
    let local = "2001:db8:ffff::1".parse().ok();
    Some(PeerBlock::of(s.parse().expect("an address"), local))
}

/// The tests' own places: every switch of another test (which holds
/// `SERIAL` no longer) given back first — one that returned while its
/// switches still end must not leave places taken here (helper 62).
fn idle() {
    let deadline = Instant::now() + Duration::from_secs(20);
    while under_way() {
        assert!(Instant::now() < deadline, "switches still under way");
        std::thread::yield_now();
    }
}

/// One peer (an address; an IPv6 /64) holds at most [`PEER_SHARE`]
/// places: its next take is refused while another peer's, and a
/// program's own client's (no peer), still find one; every place taken
/// is [`NoPlace::Full`] for anyone. Places given back are free again.
#[test]
fn one_peer_holds_at_most_its_share_of_the_places() {
    let _serial = SERIAL.lock().unwrap_or_else(PoisonError::into_inner);
    idle();
    let mut held: Vec<Slot> = (0..PEER_SHARE)
        .map(|_| Slot::take(ip("192.0.2.7")).expect("a place"))
        .collect();
    assert_eq!(Slot::take(ip("192.0.2.7")).err(), Some(NoPlace::PeerShare));
    assert_eq!(
        Slot::take(ip("::ffff:192.0.2.7")).err(),
        Some(NoPlace::PeerShare),
        "an IPv4-mapped address is its IPv4 one"
    );
    held.push(Slot::take(ip("192.0.2.8")).expect("another peer's place"));
    held.push(Slot::take(None).expect("a client's place"));
    // An IPv6 /64 is one peer: its hosts share one share.
    let v6: Vec<Slot> = (0..SWITCHING_MAX - held.len())
        .map(|i| Slot::take(ip(&format!("2001:db8:0:1::{:x}", i + 1))).expect("a place"))
        .collect();
    assert_eq!(Slot::take(ip("192.0.2.9")).err(), Some(NoPlace::Full));
    drop(v6);
    held.truncate(PEER_SHARE - 1);
    assert!(Slot::take(ip("192.0.2.7")).is_ok(), "its share again");
    drop(held);
    let v6: Vec<Slot> = (0..PEER_SHARE)
        .map(|i| Slot::take(ip(&format!("2001:db8:0:1::{:x}", i + 1))).expect("a place"))
        .collect();
    assert_eq!(
        Slot::take(ip("2001:db8:0:1:ffff::1")).err(),
        Some(NoPlace::PeerShare),
        "the same /64"
    );
    assert!(Slot::take(ip("2001:db8:0:2::1")).is_ok(), "another /64");
    drop(v6);
}

/// Where a /64 is a link or this end's own subnet (a LAN, a cluster),
/// each address is a peer of its own; a remote /64 is one peer.
#[test]
fn a_link_or_our_own_subnet_counts_by_address() {
    let block = |peer: &str, local: &str| {
        PeerBlock::of(
            peer.parse().unwrap(),
            Some(local.parse::<IpAddr>().unwrap()),
        )
    };
    let here = "2001:db8:5:1::10";
    assert_ne!(
        block("2001:db8:5:1::1", here),
        block("2001:db8:5:1::2", here)
    );
    assert_ne!(block("fe80::1", here), block("fe80::2", here));
    assert_eq!(
        block("2001:db8:6:1::1", here),
        block("2001:db8:6:1::2", here)
    );
    assert_ne!(
        block("2001:db8:6:1::1", here),
        block("2001:db8:6:2::1", here)
    );
    assert_eq!(
        block("::ffff:192.0.2.7", here),
        block("192.0.2.7", "192.0.2.1"),
        "an IPv4-mapped address is its IPv4 one"
    );
    assert_ne!(block("192.0.2.7", here), block("192.0.2.8", here));
}

/// An accepted connection whose peer holds its share stays plain TCP,
/// its switch not tried, counted (`ddp_switch_peer_over`); another
/// peer's connection still starts its switch.
#[test]
fn a_connection_past_its_peers_share_stays_plain() {
    let _serial = SERIAL.lock().unwrap_or_else(PoisonError::into_inner);
    idle();
    let held: Vec<Slot> = (0..PEER_SHARE)
        .map(|_| Slot::take(ip("127.0.0.1")).expect("a place"))
        .collect();
    let opts = Box::leak(Box::default());
    let (fd, _c) = accepted_from([127, 0, 0, 1]);
    let over = PEER_OVER.load(Ordering::Relaxed);
    let mut tried = false;
    let r = start(fd, opts, false, (None, false), |_| {
        tried = true;
        Ok(None)
    });
    assert_eq!(r.err(), Some(libc::EAGAIN));
    assert!(!tried, "the switch was tried past the peer's share");
    assert_eq!(PEER_OVER.load(Ordering::Relaxed), over + 1);
    let (other, _d) = accepted_from([127, 0, 0, 2]);
    let mut tried = false;
    let r = start(other, opts, false, (None, false), |_| {
        tried = true;
        Err(libc::EPERM)
    });
    assert_eq!(
        r.err(),
        Some(libc::EPERM),
        "refused by `prepare`, once tried"
    );
    assert!(tried, "another peer's switch was not tried");
    drop(held);
    sys::close(fd);
    sys::close(other);
}
