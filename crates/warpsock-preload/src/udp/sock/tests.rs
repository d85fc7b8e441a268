//! An offloaded socket on loopback, for the tests of the `udp` module
//! ([`offloaded`]); the doorbell after FIONREAD.

use std::io::Write;
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::os::fd::IntoRawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::Sock;
use crate::shim::reactor::{self, Handler, Reactor};
use crate::shim::sys::{self, errno, lock};
use crate::udp::conn::Conn;
use crate::udp::core::frame::{self, NONCE_LEN};
use crate::udp::core::setup::PROOF_LINGER;

/// A kernel UDP socket on 127.0.0.1 switched to the offload layer (the
/// descriptor it had is the doorbell's end now), and the progress thread.
pub(in crate::udp) fn offloaded() -> (&'static Reactor, Arc<Sock>) {
    let eng = reactor::get().expect("the progress thread");
    let u = UdpSocket::bind("127.0.0.1:0").unwrap();
    (eng, Sock::transpose(u.into_raw_fd()).expect("offloaded"))
}

/// An accepted connection on loopback, established, carrying datagrams
/// from `from` (its descriptor's far end returned, to write frames into;
/// in no socket; registered with the progress thread, its events
/// ignored).
pub(in crate::udp) fn established(eng: &Reactor, from: SocketAddr) -> (Arc<Conn>, TcpStream) {
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
    let fd = lock(&conn.st).fd;
    assert!(eng.register(fd, conn.id, 0, Arc::new(Nobody)));
    (conn, far)
}

/// A handler that does nothing (the connection's events are the test's).
struct Nobody;

impl Handler for Nobody {
    fn on_ready(&self, _: &'static Reactor, _: u32) {}
}

/// Bytes waiting in the connection's socket (`SIOCINQ`).
pub(in crate::udp) fn inq(conn: &Conn) -> usize {
    let fd = lock(&conn.st).fd;
    let mut n: libc::c_int = 0;
    // SAFETY: FIONREAD writes one int.
    assert_eq!(unsafe { libc::ioctl(fd, libc::FIONREAD, &mut n) }, 0);
    n as usize
}

/// Writes `bytes` into the connection from its far end and waits (20 s
/// at most) until they all wait in its socket.
pub(in crate::udp) fn arrive(conn: &Conn, far: &mut TcpStream, bytes: &[u8]) {
    let want = inq(conn) + bytes.len();
    far.write_all(bytes).unwrap();
    let end = Instant::now() + Duration::from_secs(20);
    while inq(conn) < want {
        assert!(
            Instant::now() < end,
            "{} of {want} bytes arrived",
            inq(conn)
        );
        std::thread::yield_now();
    }
}

/// One datagram of `payload` as the offload frames it.
pub(in crate::udp) fn framed(payload: &[u8]) -> Vec<u8> {
    [frame::header(payload.len()).as_slice(), payload].concat()
}

/// Runs `f` with a msghdr over `buf` (one iovec, no name, no control).
pub(in crate::udp) fn with_msg<R>(buf: &mut [u8], f: impl FnOnce(&mut libc::msghdr) -> R) -> R {
    let mut io = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: plain data; all-zero is an empty msghdr.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut io;
    msg.msg_iovlen = 1;
    f(&mut msg)
}

/// A non-blocking receive into a 64-byte buffer: its bytes, or the errno.
pub(in crate::udp) fn recv_nonblocking(sock: &Sock) -> Result<Vec<u8>, i32> {
    let mut buf = [0u8; 64];
    // SAFETY: the msghdr describes `buf`, writable for the call.
    let n = with_msg(&mut buf, |msg| unsafe {
        sock.recvmsg(msg, libc::MSG_DONTWAIT)
    });
    if n < 0 {
        Err(errno())
    } else {
        Ok(buf[..n as usize].to_vec())
    }
}

/// Whether `fd` reads as ready within `ms`.
pub(in crate::udp) fn readable(fd: libc::c_int, ms: libc::c_int) -> bool {
    let mut p = [libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    }];
    sys::poll(&mut p, ms) > 0
}

/// Stages a proof datagram at the hidden socket's head whose arrival
/// rang the doorbell: it arrives while no proof is awaited (the progress
/// thread rings for it as the program's), then a proof with its nonce is
/// awaited (a re-sent copy of one seen, lingering).
fn rung_proof(sock: &Sock) -> (UdpSocket, SocketAddr) {
    let at = sys::local_addr(sock.udp).expect("bound");
    let nonce = [9; NONCE_LEN];
    let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
    tx.send_to(&frame::proof(&nonce), at).unwrap();
    assert!(readable(sock.bell.app, 20_000), "the arrival did not ring");
    let mut g = lock(&sock.inner);
    g.recent.push_back((Instant::now() + PROOF_LINGER, nonce));
    sock.count_proofs(&mut g);
    (tx, at)
}

/// FIONREAD that takes the last proof off the hidden socket settles the
/// doorbell, as the receive's look does: a proof whose arrival rang (it
/// came after the progress thread took proofs off, before it looked
/// whether the socket held more) left the program's descriptor readable
/// with nothing to receive, and an event loop that sizes before it reads
/// woke again and again. Staged by [`rung_proof`]; FIONREAD takes it off.
#[test]
fn fionread_that_takes_the_last_proof_off_settles_the_doorbell() {
    let (_eng, sock) = offloaded();
    let (tx, at) = rung_proof(&sock);
    assert_eq!(sock.next_size(), 0, "a proof is never sized");
    assert!(!sock.udp_readable(), "the proof was taken off");
    assert_eq!(lock(&sock.inner).bells, 0, "the doorbell is still rung");
    assert!(!readable(sock.bell.app, 0), "the descriptor reads as ready");
    // What arrives next rings again.
    tx.send_to(b"next", at).unwrap();
    let end = Instant::now() + Duration::from_secs(20);
    while !readable(sock.bell.app, 100) {
        assert!(Instant::now() < end, "the next datagram did not ring");
    }
    assert_eq!(sock.next_size(), 4);
}

/// After `shutdown(SHUT_RD)` the doorbell stays rung whatever a look finds:
/// FIONREAD taking the last proof off settled it, and a poll or epoll
/// waiting to learn of the shutdown (a receive returns 0 at once) was left
/// waiting.
#[test]
fn a_shutdown_for_reading_keeps_the_doorbell_rung() {
    let (_eng, sock) = offloaded();
    let _staged = rung_proof(&sock);
    // Unconnected: Linux shuts it down all the same and says ENOTCONN.
    assert_eq!(sock.shutdown(libc::SHUT_RD), -1);
    assert!(sock.shut_rd.load(std::sync::atomic::Ordering::Relaxed));
    assert_eq!(sock.next_size(), 0);
    assert!(!sock.udp_readable(), "the proof was taken off");
    assert!(
        readable(sock.bell.app, 0),
        "the shutdown's doorbell was drained"
    );
}

/// A pending error on the hidden socket (ICMP port unreachable after a
/// send on a connected socket: `ECONNREFUSED`) reaches the program's
/// receive while proofs are awaited: the look for proofs at the head
/// peeked, and a peek clears the error (`sock_error` in the kernel's
/// `__skb_recv_udp`), so the receive said `EAGAIN`.
#[test]
fn a_pending_error_is_received_while_proofs_are_awaited() {
    let (_eng, sock) = offloaded();
    {
        let mut g = lock(&sock.inner);
        g.recent
            .push_back((Instant::now() + PROOF_LINGER, [5; NONCE_LEN]));
        sock.count_proofs(&mut g);
    }
    // A port nobody listens on (bound, then closed).
    let closed = UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let (ss, len) = sys::addr_to_raw(&closed);
    // SAFETY: a sockaddr of `len` bytes.
    let r = unsafe { libc::connect(sock.udp, (&ss as *const libc::sockaddr_storage).cast(), len) };
    assert_eq!(r, 0);
    // SAFETY: a send from a static buffer on the hidden socket.
    let n = unsafe { libc::send(sock.udp, b"x".as_ptr().cast(), 1, 0) };
    assert_eq!(n, 1);
    let end = Instant::now() + Duration::from_secs(20);
    while !sock.udp_error_pending() && !readable(sock.bell.app, 0) {
        assert!(Instant::now() < end, "no ICMP error came back");
        std::thread::yield_now();
    }
    assert_eq!(recv_nonblocking(&sock), Err(libc::ECONNREFUSED));
    assert_eq!(recv_nonblocking(&sock), Err(libc::EAGAIN));
}
