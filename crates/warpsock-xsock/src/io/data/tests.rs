//! The data calls on a connected pair (loopback).

use super::*;
use crate::io::RecvFlags;

/// Posts deferred between calls (a panicked batched call's, its lock's
/// poison ignored): a small send does not go inline ahead of them, it
/// goes from a slot behind them, and arrives.
#[test]
fn a_straight_send_waits_behind_deferred_posts() {
    let (xa, xb) = crate::io::test_pair::pair();
    let t = Some(Duration::from_secs(20));
    let mut buf = [0u8; 8];
    assert_eq!(xa.send(&[1; 8], false, t).unwrap(), 8);
    assert_eq!(xb.recv(&mut buf, RecvFlags::default(), t).unwrap().0, 8);
    let inline0 = xa.inline_sends();
    assert!(inline0 > 0, "the straight path sends inline here");
    {
        // A batched call's first message, collected and not posted.
        let mut st = xa.lock();
        st.deferred = Some(Vec::new());
        let bytes = [3u8; 8];
        let parts: [&[u8]; 1] = [&bytes];
        let g = Gather::new(&parts);
        let msg = st.s.tx_straight(8).unwrap();
        let src = Src {
            g: &g,
            mrs: None,
            off: 0,
            len: 8,
        };
        let op = SendOp::Send {
            solicited: false,
            invalidate: None,
        };
        xa.post_from_slot(&mut st, 0, op, Some(msg), src);
        assert_eq!(st.deferred.as_ref().map(Vec::len), Some(1));
    }
    assert_eq!(xa.send(&[2; 8], false, t).unwrap(), 8);
    assert_eq!(
        xa.inline_sends(),
        inline0,
        "went inline past deferred posts"
    );
    for want in [[3; 8], [2; 8]] {
        assert_eq!(xb.recv(&mut buf, RecvFlags::default(), t).unwrap().0, 8);
        assert_eq!(buf, want);
    }
}

/// A message of at least `Options::gather_min` bytes, non-blocking or below the
/// zero-copy size, goes out gathered from the caller's buffer (no
/// transmit slot): one gathered Send per message while the engine has
/// nothing queued, every byte arriving in order though the caller
/// overwrites its buffer as each call returns. (The engine's own tests
/// make the socket take a gathered Send in part.)
#[test]
fn bulk_messages_go_out_gathered_from_the_callers_buffer() {
    let (xa, xb) = crate::io::test_pair::pair();
    let t = Some(Duration::from_secs(20));
    let g = xa.opts.gather_min;
    let sizes = [g, 40 << 10, 128 << 10, g + 1];
    let mut want = Vec::new();
    let mut buf = Vec::new();
    for (i, &n) in sizes.iter().enumerate() {
        buf.clear();
        buf.extend((0..n).map(|k| (k * 7 + i) as u8));
        want.extend_from_slice(&buf);
        let (g0, _) = xa.gathered_sends();
        let slots0 = xa.lock().tx_free.len();
        // Non-blocking for the size a blocking call sends zero-copy.
        let nonblocking = n >= xa.opts.zcopy_min;
        let mut sent = 0;
        while sent < n {
            match xa.send(&buf[sent..], nonblocking, t) {
                Ok(k) => sent += k,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    // The peer's credits: drain what arrived so far.
                    let mut sink = vec![0u8; 256 << 10];
                    let (k, _) = xb.recv(&mut sink, RecvFlags::default(), t).unwrap();
                    check_prefix(&mut want, &sink[..k]);
                }
                Err(e) => panic!("message {i}: {e}"),
            }
        }
        assert!(
            xa.gathered_sends().0 > g0,
            "message {i} of {n} B not gathered"
        );
        assert_eq!(
            xa.lock().tx_free.len(),
            slots0,
            "message {i}: a transmit slot was taken"
        );
        buf.fill(0xEE);
    }
    let mut got = vec![0u8; 256 << 10];
    while !want.is_empty() {
        let (k, _) = xb.recv(&mut got, RecvFlags::default(), t).unwrap();
        assert!(k > 0, "end of stream with {} B to come", want.len());
        check_prefix(&mut want, &got[..k]);
    }
}

/// `got` is the start of what `want` still expects: taken off it.
fn check_prefix(want: &mut Vec<u8>, got: &[u8]) {
    assert!(
        got.len() <= want.len(),
        "{} B more than sent",
        got.len() - want.len()
    );
    assert!(want[..got.len()] == *got, "bytes differ");
    want.drain(..got.len());
}
