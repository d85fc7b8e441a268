//! [`Sock::serve`] on a real socket and connection (loopback).

use std::io::Write;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::IntoRawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{Served, Via, SERVE_STEPS};
use crate::shim::reactor::Reactor;
use crate::shim::sys::lock;
use crate::udp::conn::Conn;
use crate::udp::core::frame::{self, HDR_LEN, NONCE_LEN};
use crate::udp::sock::tests::offloaded;
use crate::udp::sock::Sock;

/// An offloaded UDP socket and an established accepted connection into it
/// from `from` (its descriptor's far end returned to write frames into).
fn socket_and_conn(from: SocketAddr) -> (&'static Reactor, Arc<Sock>, Arc<Conn>, TcpStream) {
    let (eng, sock) = offloaded();
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let far = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let (c, tcp_peer) = l.accept().unwrap();
    let conn = Arc::new(Conn::accepted(
        eng.new_id(),
        c.into_raw_fd(),
        tcp_peer,
        [3; NONCE_LEN],
    ));
    {
        let mut st = lock(&conn.st);
        st.dest = Some(from);
        st.setup.established();
    }
    (eng, sock, conn, far)
}

/// Bytes waiting in the connection's socket (`SIOCINQ`).
fn inq(conn: &Conn) -> usize {
    let fd = lock(&conn.st).fd;
    let mut n: libc::c_int = 0;
    // SAFETY: FIONREAD writes one int.
    assert_eq!(unsafe { libc::ioctl(fd, libc::FIONREAD, &mut n) }, 0);
    n as usize
}

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
    let mut io = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: plain data; all-zero is an empty msghdr.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut io;
    msg.msg_iovlen = 1;
    // SAFETY: msg describes `buf`, writable for the call.
    match unsafe { sock.serve(eng, conn, &mut msg, 0, Via::Direct, Some(peer)) } {
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
    let (eng, sock, conn, mut far) = socket_and_conn(other);
    const N: usize = 1000;
    let one = [frame::header(8).as_slice(), b"floodfld"].concat();
    let all: Vec<u8> = one.iter().copied().cycle().take(one.len() * N).collect();
    far.write_all(&all).unwrap();
    // Loopback: the bytes are in the connection's socket within moments.
    let end = Instant::now() + Duration::from_secs(20);
    while inq(&conn) < all.len() {
        assert!(
            Instant::now() < end,
            "only {} of {} bytes arrived",
            inq(&conn),
            all.len()
        );
        std::thread::yield_now();
    }
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
    far.write_all(&[frame::header(8).as_slice(), b"for-peer"].concat())
        .unwrap();
    let end = Instant::now() + Duration::from_secs(20);
    while inq(&conn) < HDR_LEN + 8 {
        assert!(Instant::now() < end, "the peer's frame did not arrive");
        std::thread::yield_now();
    }
    assert_eq!(
        serve_once(eng, &sock, &conn, peer),
        (Some(8), b"for-peer".to_vec())
    );
}
