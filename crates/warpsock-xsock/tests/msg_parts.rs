//! Message mode's parts over real switched sockets (issue 12, review
//! r19-xdead): a part of a message (its end not yet arrived) that a read
//! or a peek returned, and what a peek promised.

use std::time::Duration;

use warpsock_xsock::io::{RecvFlags, XSocket};

mod net;

use net::{pattern, small_window, switch_both, tcp_pair};

const SHORT: Option<Duration> = Some(Duration::from_secs(4));

fn errno(r: std::io::Result<impl std::fmt::Debug>) -> Option<i32> {
    r.err().and_then(|e| e.raw_os_error())
}

/// A message-mode pair of the small window (16 slots of 1 KiB) where `xa`
/// holds a part of `xb`'s message (`xb`'s send stopped at its last credit,
/// non-blocking) and, besides, `xb`'s CREDITs, unreturned: the peer is
/// short only while they are held. Returns the pair and the message; the
/// part is `xa.readable_bytes()` long once `xa` has processed it.
///
/// The CREDITs are held because a send call of `xa`'s was blocked (a
/// non-blocking one's `EAGAIN`: `xa` sent 15 messages into `xb`'s 16
/// slots, its last credit kept for a CREDIT) and `xa` holds `xb`'s DATA:
/// `Stream::credit_due`'s term against the CREDIT livelock.
fn holding_a_part_and_credits() -> (XSocket, XSocket, Vec<u8>) {
    let o = small_window();
    let (a, b) = tcp_pair();
    let (xa, xb) = switch_both(&a, &b, &o);
    xa.set_msg_mode(true);
    xb.set_msg_mode(true);
    for i in 0..15u8 {
        assert_eq!(xa.send(&[i; 8], false, SHORT).unwrap(), 8);
    }
    assert_eq!(
        errno(xa.send(&[15; 8], true, None)),
        Some(libc::EAGAIN),
        "the last credit is kept for a CREDIT"
    );
    let mut buf = [0u8; 64];
    for i in 0..15u8 {
        let (n, eor) = xb.recv(&mut buf, RecvFlags::default(), SHORT).unwrap();
        assert_eq!((&buf[..n], eor), (&[i; 8][..], true));
    }
    // Two windows: `xb` sends until its last credit, the rest waits.
    let m = pattern(32 << 10, 7);
    let sent = xb.send(&m, true, None).unwrap();
    assert!(sent > 0 && sent < m.len(), "sent {sent} of {}", m.len());
    (xa, xb, m)
}

/// What a peek returned as a part, a read returns, even after a send of
/// ours returned the slots that made the part due (review r19-xdead item
/// 3): the peer no longer needs a return then, and the part, not the
/// message's end, would wait — `EAGAIN` for a non-blocking read of bytes
/// the peek had just returned.
#[test]
fn a_peeked_part_stays_readable_after_our_own_send() {
    let (xa, xb, m) = holding_a_part_and_credits();
    let peek = RecvFlags {
        peek: true,
        ..RecvFlags::default()
    };
    let mut seen = vec![0u8; 64 << 10];
    // Blocking: returns once the part is due (the peer short).
    let (p, eor) = xa.recv(&mut seen, peek, SHORT).unwrap();
    assert!(!eor && p > 0 && p < m.len(), "peeked {p} ({eor})");
    assert_eq!(&seen[..p], &m[..p]);
    // Our message returns the CREDITs' slots: the peer holds credits
    // again. (`xb` does not run: nothing more of its message comes.)
    assert_eq!(xa.send(b"answer!!", false, SHORT).unwrap(), 8);
    let mut got = vec![0u8; 64 << 10];
    let nb = RecvFlags {
        nonblocking: true,
        ..RecvFlags::default()
    };
    let (n, eor) = xa
        .recv(&mut got, nb, None)
        .expect("the peeked part is readable");
    assert_eq!((n, eor), (p, false));
    assert_eq!(&got[..n], &m[..n]);
    drop(xb);
}
