//! What a peer's hello announces and `SO_SNDBUF` reports (part of
//! `loopback.rs`; helper 73's review, item 6).

use super::net::unbuffered;
use super::refusals::read_mpa_frame;
use super::*;

/// A peer that announces the largest window its hello may carry
/// (`MAX_SLOTS` slots of `MAX_SLOT_SIZE`, ~64 GiB) makes a socket without
/// a send buffer (`WARPSOCK_DDP_SNDBUF=0`), whose `SO_SNDBUF` reads the
/// credit window, report at most `SNDBUF_MAX` — what a set could make the
/// bound — not the peer's figure (clamped to `INT_MAX` by the preload: a
/// program that sizes a buffer by `SO_SNDBUF` allocated 2 GiB at the
/// peer's word). Fails without the bound. The peer here is a hand-made
/// responder: its mark, then an MPA Reply carrying that hello.
#[test]
fn a_peers_inflated_window_is_not_reported_as_so_sndbuf() {
    use warpsock_xsock::io::SNDBUF_MAX;
    use warpsock_xsock::wire::{MAX_SLOTS, MAX_SLOT_SIZE};
    let (a, b) = tcp_pair();
    let huge = warpsock_xsock::Hello {
        slots: MAX_SLOTS,
        slot_size: MAX_SLOT_SIZE,
    };
    let o = unbuffered();
    std::thread::scope(|sc| {
        let peer = sc.spawn(|| {
            let mut b = &b;
            send_mark(b);
            let req = read_mpa_frame(b);
            assert_eq!(&req[..16], warpsock_xsock::switch::MPA_REQ_KEY);
            // An accepting Reply: Enhanced MPA (IRD 16, ORD 0, no
            // peer-to-peer RTR: established at once), CRC as asked.
            let pd: Vec<u8> = [0, 16, 0, 0].into_iter().chain(huge.encode()).collect();
            let mut r = b"MPA ID Rep Frame".to_vec();
            r.extend_from_slice(&[0x10 | (req[16] & 0x40), req[17], 0, pd.len() as u8]);
            r.extend_from_slice(&pd);
            b.write_all(&r).unwrap();
        });
        let x = switch_fd_as(a.as_fd(), &o, Some(Role::Initiator)).unwrap();
        peer.join().unwrap();
        assert_eq!(x.peer_hello(), huge, "the peer's hello as announced");
        let window = usize::from(huge.slots) * huge.payload();
        assert!(window > 60 << 30, "{window}");
        assert_eq!(
            x.sndbuf(),
            SNDBUF_MAX,
            "SO_SNDBUF reads the peer's inflated window"
        );
        assert_eq!(x.set_sndbuf(1 << 20), SNDBUF_MAX, "no buffer: still");
    });
}
