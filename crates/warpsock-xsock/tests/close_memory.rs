//! No byte the peer sends reaches the program's memory after its close
//! (`XSocket::close_begin`, the preload's reaper's close: `close(2)`
//! returns at once, and the program may free what it handed over): its
//! mappings and the buffers of its asynchronous receives are let go as
//! the close begins. Before, a peer's `riowrite` into a mapping, or its
//! bytes into an asynchronous receive's sink, landed there for as long as
//! the close lasted (up to the linger).

use std::time::Instant;

use warpsock_xsock::io::{Phase, RecvFlags, XSocket};

mod net;

use net::{opts, pattern, switch_both, tcp_pair, LIMIT};

/// Steps `x`'s close (begun) to its end, driving `peer` too, until
/// `touched` says the program's memory was written or `LIMIT`: whether it
/// was.
fn close_to_end(
    x: &XSocket,
    peer: &XSocket,
    mut c: warpsock_xsock::io::Closing,
    touched: impl Fn() -> bool,
) -> bool {
    let t = Instant::now();
    loop {
        if touched() {
            return true;
        }
        if x.close_step(&mut c, Instant::now()) == Phase::Done || t.elapsed() > LIMIT {
            return touched();
        }
        peer.progress();
        std::thread::yield_now();
    }
}

/// A peer's one-sided write into a mapping after the close fails (the
/// mapping is gone: a remote protection error ends the connection, as
/// bytes after a TCP close draw a reset) and writes nothing.
#[test]
fn a_mapping_takes_no_write_after_the_close() {
    let (a, b) = tcp_pair();
    let (xa, xb) = switch_both(&a, &b, &opts());
    let mut target = vec![0u8; 64 << 10];
    #[allow(unsafe_code)]
    // SAFETY: `target` outlives both sockets (dropped last).
    let off =
        unsafe { xa.riomap(target.as_mut_ptr(), target.len(), true, false, None) }.expect("riomap");
    // The peer knows the mapping once it read what was sent after it.
    xa.send(b"m", false, Some(LIMIT)).unwrap();
    let mut m = [0u8; 1];
    xb.recv(&mut m, RecvFlags::default(), Some(LIMIT)).unwrap();
    let c = xa.close_begin(LIMIT, Instant::now());
    let data = pattern(target.len(), 3);
    // Sent (its completion is local) or refused: either way, not placed.
    let _ = xb.riowrite(&data, off);
    let at = target.as_ptr();
    let touched = || {
        // SAFETY: `target` is alive; the engine writes it only in the
        // steps of this thread, between these reads.
        #[allow(unsafe_code)]
        unsafe { std::slice::from_raw_parts(at, data.len()) }
            .iter()
            .any(|&b| b != 0)
    };
    assert!(
        !close_to_end(&xa, &xb, c, touched),
        "the peer's write landed after the close"
    );
    drop((xa, xb));
    drop(target);
}

/// The bytes a peer sends into an asynchronous receive's sink after the
/// close are not placed there (the sink is gone with the receive).
#[test]
fn an_asynchronous_receive_takes_no_byte_after_the_close() {
    let (a, b) = tcp_pair();
    let (xa, xb) = switch_both(&a, &b, &opts());
    let mut buf = vec![0u8; 1 << 20];
    #[allow(unsafe_code)]
    // SAFETY: `buf` outlives both sockets (dropped last).
    unsafe { xa.aio_recv(buf.as_mut_ptr(), buf.len(), 1) }.expect("aio_recv");
    let t = Instant::now();
    while !xb.peer_sink_offered() {
        assert!(t.elapsed() < LIMIT, "the peer never heard of a sink");
        // Both driven: a responder's first message waits for the
        // initiator's first FPDU (RFC 6581).
        xa.progress();
        xb.progress();
        std::thread::yield_now();
    }
    let c = xa.close_begin(LIMIT, Instant::now());
    let data = pattern(buf.len(), 5);
    let at = buf.as_ptr();
    let len = buf.len();
    let touched = || {
        // SAFETY: as in the test above.
        #[allow(unsafe_code)]
        unsafe { std::slice::from_raw_parts(at, len) }
            .iter()
            .any(|&b| b != 0)
    };
    let landed = std::thread::scope(|sc| {
        let sender = sc.spawn(|| {
            // Sent or refused: either way, not placed.
            let _ = xb.send(&data, false, Some(LIMIT));
        });
        let landed = close_to_end(&xa, &xb, c, touched);
        sender.join().unwrap();
        landed
    });
    assert!(
        !landed,
        "the peer's bytes landed in the receive's buffer after the close"
    );
    drop((xa, xb));
    drop(buf);
}
