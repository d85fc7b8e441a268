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
