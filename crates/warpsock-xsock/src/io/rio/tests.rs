//! Asynchronous sends and the plain send calls after them (loopback).

use std::time::Duration;

use crate::io::RecvFlags;

/// An asynchronous send queued and not yet pumped (as a round that
/// processed credits, `reap`, leaves it), with credits and a transmit
/// slot free: a small plain send — the straight path's case — goes behind
/// its bytes, not inline ahead of them; a non-blocking one too, at once
/// (not `EAGAIN` while the asynchronous send is posted but not complete).
///
/// (The lock is let go between the queueing and the send: a progress
/// round in between would pump the queued send and the test would pass
/// without reaching the guards. No progress thread runs here, so none
/// does.)
#[test]
fn a_straight_send_goes_behind_a_queued_asynchronous_send() {
    for nonblocking in [false, true] {
        straight_send_behind_a_queued_asynchronous_send(nonblocking);
    }
}

fn straight_send_behind_a_queued_asynchronous_send(nonblocking: bool) {
    let (xa, xb) = crate::io::test_pair::pair();
    let t = Some(Duration::from_secs(20));
    let mut buf = [0u8; 8];
    assert_eq!(xa.send(&[1; 8], false, t).unwrap(), 8);
    assert_eq!(xb.recv(&mut buf, RecvFlags::default(), t).unwrap().0, 8);
    let queued = [3u8; 8];
    {
        let mut st = xa.lock();
        // SAFETY: `queued` lives until the completion is collected below.
        #[allow(unsafe_code)]
        unsafe {
            xa.queue_send(&mut st, queued.as_ptr(), queued.len(), 9);
        };
        assert!(st.aio.sends_queued());
    }
    assert_eq!(xa.send(&[2; 8], nonblocking, t).unwrap(), 8);
    for want in [[3; 8], [2; 8]] {
        assert_eq!(xb.recv(&mut buf, RecvFlags::default(), t).unwrap().0, 8);
        assert_eq!(buf, want, "in call order");
    }
    assert!(!xa.lock().aio.sends_queued(), "the plain send pumped it");
    let mut done = Vec::new();
    let start = std::time::Instant::now();
    while done.is_empty() {
        assert!(start.elapsed() < Duration::from_secs(20));
        xa.aio_poll(&mut done, 1);
        std::thread::yield_now();
    }
    assert_eq!((done[0].cookie, done[0].result), (9, Ok(8)));
}

/// A reap (the completions the engine queued already, no round) that
/// processes completions pumps the queued sends: the credits or transmit
/// slots it brings are theirs now, not at the next round (review
/// r19-xaio, item 7: `readiness_of` said writable while the bytes waited).
/// Here the completion is a control message's Send, posted from a
/// transmit slot and written at once; the lock is held throughout, so no
/// other round pumps.
#[test]
fn a_reap_that_processes_completions_pumps_queued_sends() {
    let (xa, xb) = crate::io::test_pair::pair();
    let t = Some(Duration::from_secs(20));
    let mut buf = [0u8; 8];
    // Established both ways (a post before waits in the engine).
    assert_eq!(xa.send(&[1; 8], false, t).unwrap(), 8);
    assert_eq!(xb.recv(&mut buf, RecvFlags::default(), t).unwrap().0, 8);
    assert_eq!(xb.send(&[1; 8], false, t).unwrap(), 8);
    assert_eq!(xa.recv(&mut buf, RecvFlags::default(), t).unwrap().0, 8);
    let queued = [5u8; 8];
    {
        let mut st = xa.lock();
        // SAFETY: `queued` lives until the bytes are read below (the
        // completion is collected by the socket's drop at the latest).
        #[allow(unsafe_code)]
        unsafe {
            xa.queue_send(&mut st, queued.as_ptr(), queued.len(), 9);
        };
        // A mapping's end for an offset the peer never heard of: a control
        // message it ignores, posted from a transmit slot.
        st.s.announce_unmap(0x5eed);
        xa.flush(&mut st);
        assert!(st.aio.sends_queued() && st.unreaped);
        xa.reap(&mut st);
        assert!(!st.aio.sends_queued(), "the reap pumped the queued send");
    }
    assert_eq!(xb.recv(&mut buf, RecvFlags::default(), t).unwrap().0, 8);
    assert_eq!(buf, queued);
}
