//! A one-sided call against a peer that never answers is bounded by the
//! timeout asked (the preload passes `SO_RCVTIMEO` / `SO_SNDTIMEO`; issue
//! 12, session 35's review): a Read cannot be withdrawn, so at the timeout
//! the connection fails (`ETIMEDOUT`) and the call returns — not a wait
//! for good.

use std::sync::mpsc::channel;
use std::time::Duration;

use warpsock_xsock::io::RecvFlags;

mod net;

use net::{opts, switch_both, tcp_pair, LIMIT};

/// The target maps a readable region and tells the reader so through the
/// stream; then it never makes a call again (its caller-driven engine
/// never answers). A `rioread` bounded by 1 s fails with `ETIMEDOUT`, and
/// the connection with it. Fails with the bound ignored (the call never
/// returns: the test's own `LIMIT` ends it).
#[test]
fn a_rioread_of_a_silent_peer_times_out() {
    let (a, b) = tcp_pair();
    let (xa, xb) = switch_both(&a, &b, &opts());
    let mut region = vec![7u8; 4096];
    #[allow(unsafe_code)]
    // SAFETY: `region` outlives both sockets (dropped last).
    let off = unsafe { xb.riomap(region.as_mut_ptr(), region.len(), false, true, Some(0)) };
    assert_eq!(off.unwrap(), 0);
    xb.send(b"mapped", false, Some(LIMIT)).unwrap();
    let mut m = [0u8; 6];
    xa.recv(&mut m, RecvFlags::default(), Some(LIMIT)).unwrap();
    assert_eq!(&m, b"mapped");
    let (tx, rx) = channel();
    std::thread::scope(|sc| {
        sc.spawn(|| {
            let mut back = [0u8; 16];
            let r = xa.rioread_as(&mut back, 0, false, Some(Duration::from_secs(1)));
            let _ = tx.send(r);
        });
        let r = rx.recv_timeout(LIMIT);
        let Ok(r) = r else {
            // Unblock the call (the test failed): the target answers.
            let mut d = [0u8; 1];
            let _ = xb.recv(&mut d, RecvFlags::default(), Some(Duration::from_secs(1)));
            panic!("the bounded rioread did not return within {LIMIT:?}");
        };
        let e = r.expect_err("a read the peer never answered");
        assert_eq!(e.raw_os_error(), Some(libc::ETIMEDOUT), "{e}");
    });
    let e = xa.send(b"x", false, Some(LIMIT)).unwrap_err();
    assert_eq!(
        e.raw_os_error(),
        Some(libc::ETIMEDOUT),
        "the connection failed: {e}"
    );
    drop((xa, xb));
    drop(region);
}
