//! Nothing a peer sends after it broke the protocol reaches the reader
//! (issue 12; session 35's review): a bad message followed at once by the
//! end of stream fails the read with `EPROTO` — the end is not taken for a
//! clean one (Linux's `tcp_recvmsg` reports the socket's error before its
//! shutdown).

use warpsock_xsock::io::RecvFlags;

mod net;

use net::{opts, switch_both, tcp_pair, LIMIT};

/// An unknown message kind, then the end of stream, sent back to back:
/// the reader's read fails with `EPROTO`. Fails with the end processed
/// after the error (`Ok(0)`).
#[test]
fn the_end_behind_a_bad_message_is_not_a_clean_end() {
    let (a, b) = tcp_pair();
    let (xa, xb) = switch_both(&a, &b, &opts());
    xa.inject_raw_message(&[0x63, 0, 0, 0, 0, 0, 0, 0]);
    xa.shutdown(false, true);
    // Both ends driven at once (caller-driven engines: the breaker's
    // Sends may wait in its engine for the reader's first FPDU, RFC 6581).
    std::thread::scope(|sc| {
        sc.spawn(|| {
            let mut buf = [0u8; 8];
            let _ = xa.recv(&mut buf, RecvFlags::default(), Some(LIMIT));
        });
        let mut buf = [0u8; 8];
        let r = xb.recv(&mut buf, RecvFlags::default(), Some(LIMIT));
        let e = r.expect_err("the end behind a bad message read as a clean end");
        assert_eq!(e.raw_os_error(), Some(libc::EPROTO), "{e}");
    });
}
