//! The process's count of bytes in send buffers
//! (`warpsock_xsock::io::buffered_bytes`, which the preload's exit waits
//! on): up while bytes wait, back to 0 once they are sent, and once a
//! socket holding some is dropped — a count left over would make every
//! exit of the process wait its whole linger. One test in this binary:
//! the count is the process's.

use std::time::Duration;

use warpsock_xsock::io::{buffered_bytes, posted_bytes};

mod net;

use net::{opts, pattern, recv_exact, switch_both, tcp_pair, LIMIT};

/// Non-blocking sends of `n` bytes in 1,000-byte calls to a peer that
/// does not read: past the window they are buffered.
fn send_past_the_window(x: &warpsock_xsock::io::XSocket, data: &[u8]) {
    for c in data.chunks(1000) {
        assert_eq!(x.send(c, true, None).unwrap(), c.len());
    }
}

#[test]
fn the_count_of_buffered_bytes_goes_back_to_zero() {
    assert_eq!(buffered_bytes(), 0);
    // Sent: the reader reads, the writer's close drives the buffer out.
    let (a, b) = tcp_pair();
    let (xa, xb) = switch_both(&a, &b, &opts());
    let data = pattern(100_000, 3);
    let posted = posted_bytes();
    send_past_the_window(&xa, &data);
    let held = buffered_bytes();
    assert!(held > 0, "bytes wait past the window");
    std::thread::scope(|sc| {
        let w = sc.spawn(|| assert!(xa.close(LIMIT)));
        assert!(recv_exact(&xb, data.len()) == data);
        w.join().unwrap();
    });
    assert_eq!(buffered_bytes(), 0, "all sent");
    // What left the buffer counts as posted (the exit's measure of
    // progress, which only grows).
    assert_eq!(posted_bytes() - posted, held as u64);
    // Dropped with bytes still buffered (the peer never reads; the close
    // gives up at once).
    let (a, b) = tcp_pair();
    let (xa, xb) = switch_both(&a, &b, &opts());
    send_past_the_window(&xa, &data);
    assert!(buffered_bytes() > 0);
    assert!(!xa.close(Duration::ZERO), "the peer holds the window");
    drop(xa);
    assert_eq!(
        buffered_bytes(),
        0,
        "a dropped socket's bytes leave the count"
    );
    drop(xb);
}
