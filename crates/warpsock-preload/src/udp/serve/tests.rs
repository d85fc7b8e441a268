//! [`Sock::serve`] on a real socket and connection (loopback).

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::{Served, Via, SERVE_STEPS};
use crate::shim::reactor::Reactor;
use crate::shim::sys::lock;
use crate::udp::conn::{Conn, READ_CAP};
use crate::udp::core::frame::HDR_LEN;
use crate::udp::sock::tests::{
    arrive, established, framed, inq, offloaded, readable, recv_nonblocking, with_msg,
};
use crate::udp::sock::Sock;

/// Bytes not taken yet: in the connection's buffer and in its socket.
fn left(conn: &Conn) -> usize {
    let buffered = lock(&conn.st).rx.pending().len();
    buffered + inq(conn)
}

/// What one `serve` gave: the datagram, nothing, or steps spent.
#[derive(Debug, PartialEq)]
enum Got {
    Dgram(Vec<u8>),
    Nothing,
    Spent,
}

/// One `serve` into a 256-byte buffer, reached `via`, for a socket
/// connected to `peer` (`None`: unconnected).
fn serve_once(
    eng: &'static Reactor,
    sock: &Sock,
    conn: &Arc<Conn>,
    via: Via,
    peer: Option<SocketAddr>,
) -> Got {
    let mut buf = [0u8; 256];
    // SAFETY: the msghdr describes `buf`, writable for the call.
    let served = with_msg(&mut buf, |msg| unsafe {
        sock.serve(eng, conn, msg, 0, via, peer)
    });
    match served {
        Served::Dgram(n) => Got::Dgram(buf[..n as usize].to_vec()),
        Served::Nothing => Got::Nothing,
        Served::Spent => Got::Spent,
    }
}

/// Puts `conn` on `sock`'s ready list without a doorbell, as a receive
/// call's wait lists it before it rings (`Conn::handle` from a caller).
fn listed(eng: &Reactor, sock: &Sock, conn: &Arc<Conn>) {
    assert!(!conn.ready.swap(true, Ordering::Relaxed));
    lock(&sock.inner).ready.push_back(conn.clone());
    conn.set_ready(eng);
}

fn is_listed(sock: &Sock, conn: &Arc<Conn>) -> bool {
    lock(&sock.inner).ready.iter().any(|c| Arc::ptr_eq(c, conn))
}

/// A connected socket's receive discards what a peer it does not hear
/// sent, at most [`SERVE_STEPS`] frames a serve: a flood of such frames
/// faster than the call discards them kept one call reading without end
/// (its CPU, and the connection's locks the progress thread needs). Here
/// 1,000 frames wait at once; each serve takes a budget's worth and
/// answers `Spent`; the rest is the next calls'; the connection serves
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
        let got = serve_once(eng, &sock, &conn, Via::Direct, Some(peer));
        calls += 1;
        let taken = (before - left(&conn)) / (HDR_LEN + 8);
        assert!(
            taken <= SERVE_STEPS,
            "call {calls} discarded {taken} frames (at most {SERVE_STEPS} a call)"
        );
        assert!(taken > 0, "call {calls} discarded nothing");
        if left(&conn) > 0 {
            assert_eq!(got, Got::Spent, "call {calls}");
            // What is left stays announced.
            assert!(is_listed(&sock, &conn), "call {calls}: not listed");
            assert!(readable(sock.bell.app, 0), "call {calls}: no doorbell");
        } else {
            assert_eq!(got, Got::Nothing, "the last call");
        }
    }
    assert!(calls >= N / SERVE_STEPS, "{calls} calls");
    // The socket's own peer's datagram still arrives.
    lock(&conn.st).dest = Some(peer);
    arrive(&conn, &mut far, &framed(b"for-peer"));
    assert_eq!(
        serve_once(eng, &sock, &conn, Via::Direct, Some(peer)),
        Got::Dgram(b"for-peer".to_vec())
    );
}

/// A datagram whose last part the serve's last step read is served: the
/// budget is spent only on discards and reads, never on the datagram in
/// hand. Checked before every step, it ended this serve with the datagram
/// whole in the buffer, the socket empty and the connection taken off the
/// list: nothing announced it again (a receive waited for good). Staged:
/// the connection listed, its reads capped at 2 bytes (`READ_CAP`), a
/// 128-byte frame: the 64th read completes it.
#[test]
fn a_datagram_completed_by_the_last_step_is_served() {
    let (eng, sock) = offloaded();
    let (conn, mut far) = established(eng, "127.0.0.1:1111".parse().unwrap());
    let payload = [b'x'; 124];
    let frame = framed(&payload);
    assert_eq!(frame.len(), 2 * SERVE_STEPS);
    arrive(&conn, &mut far, &frame);
    listed(eng, &sock, &conn);
    READ_CAP.with(|c| c.set(2));
    let got = serve_once(eng, &sock, &conn, Via::Ready, None);
    READ_CAP.with(|c| c.set(usize::MAX));
    assert_eq!(got, Got::Dgram(payload.to_vec()));
}

/// A receive on a connected socket whose ready list holds a flooded
/// connection from a peer it does not hear, then its peer's: the call
/// spends the flooded one's steps, then serves the peer's datagram; the
/// flooded one stays listed, behind, with the doorbell rung for it.
#[test]
fn a_flooded_connection_neither_starves_the_list_nor_loses_its_doorbell() {
    let other: SocketAddr = "127.0.0.1:1111".parse().unwrap();
    let peer: SocketAddr = "127.0.0.1:2222".parse().unwrap();
    let (eng, sock) = offloaded();
    lock(&sock.inner).peer = Some(peer);
    let (flooded, mut f) = established(eng, other);
    let (own, mut o) = established(eng, peer);
    arrive(
        &flooded,
        &mut f,
        &framed(b"floodfld").repeat(4 * SERVE_STEPS),
    );
    arrive(&own, &mut o, &framed(b"for-peer"));
    listed(eng, &sock, &flooded);
    listed(eng, &sock, &own);
    assert_eq!(recv_nonblocking(&sock), Ok(b"for-peer".to_vec()));
    assert!(is_listed(&sock, &flooded), "the flooded one left the list");
    assert!(readable(sock.bell.app, 0), "no doorbell for what is left");
    // The rest: a budget a call, the doorbell rung until it is gone.
    let mut calls = 0;
    while left(&flooded) > 0 {
        calls += 1;
        assert!(calls <= 4, "{calls} calls");
        let before = left(&flooded);
        assert_eq!(recv_nonblocking(&sock), Err(libc::EAGAIN));
        assert!(before - left(&flooded) <= SERVE_STEPS * (HDR_LEN + 8));
    }
}
