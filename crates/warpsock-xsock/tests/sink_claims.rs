//! What a peer learns of our memory, and what it can claim about it
//! (issue 12; session 35's review): a SINK_DONE is not taken at its word —
//! the bytes it says it wrote into a reader's sink must have been placed
//! there by its RDMA Writes, else the read would return the buffer's old
//! contents as the peer's bytes (memory of the program's that an echo or
//! a proxy then sends to that peer); and the tagged offsets we announce
//! (a sink's, a mapping's) are not addresses of our memory.

use std::time::Instant;

use warpsock_xsock::io::{Options, RecvFlags};
use warpsock_xsock::wire::{Body, Msg, MAX_CONTROL_LEN};

mod net;

use net::{await_aio_sink, opts, pattern, switch_both, tcp_pair, LIMIT};

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
    lie_about_a_sink(false);
}

/// The same lie with the end of stream right behind it (one burst): the
/// read fails with `EPROTO`, not a clean end (`Ok(0)`: the end was in the
/// books before the claim was checked; helper 34's review).
#[test]
fn a_lying_sink_done_with_the_end_behind_it_is_no_clean_end() {
    lie_about_a_sink(true);
}

/// The same lie and end of stream to an asynchronous 1 MiB receive (its
/// sink offered as the receive is queued): it completes with `EPROTO`,
/// not a clean end (`Ok(0)`) nor the buffer's 0xAA. (Asynchronous
/// receives were untested against a breach since session 35. Here the
/// end of stream never reaches the books before the breach is seen, so
/// `pump_recvs`'s own check of the breach ahead of the end is not what
/// this reaches: its connection's error is.)
#[test]
fn a_lying_sink_done_with_the_end_behind_it_fails_an_asynchronous_receive() {
    let (a, b) = tcp_pair();
    let o = Options {
        sinks: true,
        ..opts()
    };
    let (xa, xb) = switch_both(&a, &b, &o);
    let mut buf = vec![0xAAu8; 1 << 20];
    // SAFETY: `buf` outlives the receive: its completion is collected
    // below, before `buf` goes.
    unsafe { xb.aio_recv(buf.as_mut_ptr(), buf.len(), 5) }.unwrap();
    let mut done = Vec::new();
    await_aio_sink(&xa, &xb, &mut done);
    let t = Instant::now();
    assert!(done.is_empty(), "{done:?}");
    xa.inject_raw_message(&lie(1 << 20));
    xa.shutdown(false, true);
    while done.is_empty() {
        assert!(t.elapsed() < LIMIT, "the receive never completed");
        xb.aio_poll(&mut done, 1);
        std::thread::yield_now();
    }
    assert_eq!((done[0].cookie, done[0].result), (5, Err(libc::EPROTO)));
    drop(buf);
}

/// A SINK_DONE for `len` bytes of the reader's first sink, encoded.
fn lie(len: u32) -> Vec<u8> {
    let mut out = [0u8; MAX_CONTROL_LEN];
    let lie = Msg {
        credits: 0,
        body: Body::SinkDone {
            id: 1,
            len,
            eom: false,
        },
    };
    let n = lie.encode(&mut out);
    out[..n].to_vec()
}

/// The lie, and the end of stream behind it if `end`.
fn lie_about_a_sink(end: bool) {
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
        xa.inject_raw_message(&lie(1 << 20));
        if end {
            xa.shutdown(false, true);
        }
        let r = reader.join().unwrap();
        let e = r.expect_err("the read returned bytes the peer never wrote");
        assert_eq!(e.raw_os_error(), Some(libc::EPROTO), "{e}");
    });
}

/// An honest peer fills a 1 MiB read's sink and the read returns its
/// bytes (the written prefix it placed is the MiB it says). The offsets
/// the offer and a mapping told it are not where our buffers are, and the
/// two ranges do not overlap (a stale STag's offset fails the bounds
/// check). Fails with the buffers' addresses announced (`to` = the
/// pointer), or with every registration at one offset.
#[test]
fn our_sinks_and_mappings_tell_the_peer_no_address() {
    let (a, b) = tcp_pair();
    let o = Options {
        sinks: true,
        ..opts()
    };
    let (xa, xb) = switch_both(&a, &b, &o);
    let src = pattern(1 << 20, 3);
    let (tx, rx) = std::sync::mpsc::channel();
    let sink_to = std::thread::scope(|sc| {
        let reader = sc.spawn(|| {
            let mut buf = vec![0xAAu8; 1 << 20];
            tx.send(buf.as_ptr() as u64).unwrap();
            let all = RecvFlags {
                waitall: true,
                ..BLOCKING
            };
            let (n, _) = xb.recv(&mut buf, all, Some(LIMIT)).unwrap();
            assert_eq!(n, 1 << 20);
            buf
        });
        let buf_at = rx.recv().unwrap();
        let t = Instant::now();
        while !xa.peer_sink_offered() {
            assert!(t.elapsed() < LIMIT, "the reader offered no sink");
            std::thread::yield_now();
        }
        let offsets = xa.peer_tagged_offsets();
        assert_eq!(offsets.len(), 1);
        assert_ne!(
            offsets[0], buf_at,
            "the sink's offset is the buffer's address"
        );
        assert_eq!(xa.send(&src, false, Some(LIMIT)).unwrap(), src.len());
        assert!(
            reader.join().unwrap() == src,
            "the read's bytes are the peer's"
        );
        offsets[0]
    });
    let mut target = vec![0u8; 8192];
    #[allow(unsafe_code)]
    // SAFETY: `target` outlives the mapping (the sockets are dropped first).
    let off = unsafe { xb.riomap(target.as_mut_ptr(), target.len(), true, true, Some(4096)) };
    assert_eq!(off.unwrap(), 4096);
    // The mapping reaches the peer with the stream.
    xb.send(b"mapped", false, None).unwrap();
    let mut m = [0u8; 6];
    xa.recv(&mut m, BLOCKING, Some(LIMIT)).unwrap();
    assert_eq!(&m, b"mapped");
    let offsets = xa.peer_tagged_offsets();
    assert_eq!(offsets.len(), 1);
    let map_to = offsets[0];
    assert_ne!(
        map_to,
        target.as_ptr() as u64,
        "the mapping's offset is the buffer's address"
    );
    let disjoint = map_to >= sink_to + (1 << 20) || map_to + 8192 <= sink_to;
    assert!(
        disjoint,
        "the sink at {sink_to:#x} and the mapping at {map_to:#x} overlap"
    );
    drop((xa, xb));
    drop(target);
}
