//! A peer's SINK_DONE is not taken at its word (issue 12; session 35's
//! review): the bytes it says it wrote into a reader's sink must have been
//! placed there by its RDMA Writes, else the read would return the
//! buffer's old contents as the peer's bytes — memory of the program's
//! that an echo or a proxy then sends to that peer.

use std::time::Instant;

use warpsock_xsock::io::{Options, RecvFlags};
use warpsock_xsock::wire::{Body, Msg, MAX_CONTROL_LEN};

mod net;

use net::{opts, switch_both, tcp_pair, LIMIT};

/// A blocking receive that is not a peek.
const BLOCKING: RecvFlags = RecvFlags {
    peek: false,
    nonblocking: false,
    waitall: false,
};

/// A lying peer: the reader's blocking 1 MiB read offers its buffer (a
/// sink; the buffer holds 0xAA), and the peer, which wrote nothing into
/// it, answers SINK_DONE for the whole MiB. The read fails with `EPROTO`
/// (the connection with it) — not 1 MiB of 0xAA. Fails with the claim
/// trusted (`Ok(1048576)`).
#[test]
fn a_sink_done_for_bytes_never_written_fails_the_read() {
    let (a, b) = tcp_pair();
    let o = Options {
        sinks: true,
        ..opts()
    };
    let (xa, xb) = switch_both(&a, &b, &o);
    std::thread::scope(|sc| {
        let reader = sc.spawn(|| {
            let mut buf = vec![0xAAu8; 1 << 20];
            xb.recv(&mut buf, BLOCKING, Some(LIMIT))
        });
        let t = Instant::now();
        while !xa.peer_sink_offered() {
            assert!(t.elapsed() < LIMIT, "the reader offered no sink");
            std::thread::yield_now();
        }
        let mut out = [0u8; MAX_CONTROL_LEN];
        let lie = Msg {
            credits: 0,
            body: Body::SinkDone {
                id: 1,
                len: 1 << 20,
                eom: false,
            },
        };
        let n = lie.encode(&mut out);
        xa.inject_raw_message(&out[..n]);
        let r = reader.join().unwrap();
        let e = r.expect_err("the read returned bytes the peer never wrote");
        assert_eq!(e.raw_os_error(), Some(libc::EPROTO), "{e}");
    });
}
