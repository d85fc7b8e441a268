//! [`Sock::serve`] on a real socket and connection (loopback).

use std::net::SocketAddr;
use std::sync::Arc;

use super::{Served, Via, SERVE_STEPS};
use crate::shim::reactor::Reactor;
use crate::shim::sys::lock;
use crate::udp::conn::Conn;
use crate::udp::core::frame::HDR_LEN;
use crate::udp::sock::tests::{arrive, established, framed, inq, offloaded, with_msg};
use crate::udp::sock::Sock;

/// Bytes not taken yet: in the connection's buffer and in its socket.
fn left(conn: &Conn) -> usize {
    let buffered = lock(&conn.st).rx.pending().len();
    buffered + inq(conn)
}

/// One `serve` into a 64-byte buffer, for a socket connected to `peer`.
fn serve_once(
    eng: &'static Reactor,
    sock: &Sock,
    conn: &Arc<Conn>,
    peer: SocketAddr,
) -> (Option<isize>, Vec<u8>) {
    let mut buf = [0u8; 64];
    // SAFETY: the msghdr describes `buf`, writable for the call.
    let served = with_msg(&mut buf, |msg| unsafe {
        sock.serve(eng, conn, msg, 0, Via::Direct, Some(peer))
    });
    match served {
        Served::Dgram(n) => (Some(n), buf[..n as usize].to_vec()),
        Served::Nothing => (None, Vec::new()),
    }
}

/// A connected socket's receive discards what a peer it does not hear
/// sent, at most [`SERVE_STEPS`] frames a call: a flood of such frames
/// faster than the call discards them kept one call reading without end
/// (its CPU, and the connection's locks the progress thread needs). Here
/// 1,000 frames wait at once; each call takes a budget's worth and
/// answers nothing; the rest is the next calls'; the connection serves
/// its own peer's datagram afterwards.
#[test]
fn a_flood_from_a_peer_the_socket_does_not_hear_is_discarded_a_budget_a_call() {
    let other: SocketAddr = "127.0.0.1:1111".parse().unwrap();
    let peer: SocketAddr = "127.0.0.1:2222".parse().unwrap();
    let (eng, sock) = offloaded();
    let (conn, mut far) = established(eng, other);
    const N: usize = 1000;
    arrive(&conn, &mut far, &framed(b"floodfld").repeat(N));
    let mut calls = 0;
    while left(&conn) > 0 {
        let before = left(&conn);
        let (got, _) = serve_once(eng, &sock, &conn, peer);
        calls += 1;
        assert_eq!(got, None, "a datagram from a peer the socket does not hear");
        let taken = (before - left(&conn)) / (HDR_LEN + 8);
        assert!(
            taken <= SERVE_STEPS,
            "call {calls} discarded {taken} frames (at most {SERVE_STEPS} a call)"
        );
        assert!(taken > 0, "call {calls} discarded nothing");
    }
    assert!(calls >= N / SERVE_STEPS, "{calls} calls");
    // The socket's own peer's datagram still arrives.
    lock(&conn.st).dest = Some(peer);
    arrive(&conn, &mut far, &framed(b"for-peer"));
    assert_eq!(
        serve_once(eng, &sock, &conn, peer),
        (Some(8), b"for-peer".to_vec())
    );
}
