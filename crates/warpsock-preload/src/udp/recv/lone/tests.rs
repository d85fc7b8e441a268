//! [`Sock::recv_lone`]'s look at the socket: what sends the call the
//! general way. Each test stages a state the look guards against without
//! a doorbell (a blocking call's poll loop lists a connection, or queues
//! what it read, before the doorbell rings for it) and receives through
//! [`Sock::recvmsg`], as the program does.

use std::cell::RefCell;
use std::net::TcpStream;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::shim::reactor::Reactor;
use crate::shim::sys::lock;
use crate::udp::conn::{Conn, DGRAM_OVERHEAD, HINT_UP};
use crate::udp::sock::tests::{arrive, established, framed, offloaded, readable, recv_nonblocking};
use crate::udp::sock::{Dgram, Sock};

/// What a test runs in `recv_lone` after its read of the lone connection
/// found nothing, before its look for held datagrams: another thread's
/// doing in that gap (once).
type Gap = Box<dyn FnOnce(&Sock, &Arc<Conn>)>;

thread_local! {
    static AFTER_EMPTY_SERVE: RefCell<Option<Gap>> = const { RefCell::new(None) };
}

/// The seam in `recv_lone` (unit tests only).
pub(super) fn after_empty_serve(sock: &Sock, c: &Arc<Conn>) {
    if let Some(f) = AFTER_EMPTY_SERVE.with(|a| a.borrow_mut().take()) {
        f(sock, c);
    }
}

/// A socket fed by one established connection and nothing else, as
/// `recv_lone` looks for it: the connection is the socket's, up, parked
/// (a receive call returned a datagram from it), the hidden kernel socket
/// looked at and empty, no doorbell.
fn lone() -> (&'static Reactor, Arc<Sock>, Arc<Conn>, TcpStream) {
    let (eng, sock) = offloaded();
    let (conn, far) = established(eng, "127.0.0.1:3333".parse().unwrap());
    let fd = lock(&conn.st).fd;
    conn.hint.store(HINT_UP, Ordering::Relaxed);
    assert_eq!(conn.claim(eng), Some(fd));
    assert!(conn.unclaim(eng, fd, true), "parked");
    {
        let mut g = lock(&sock.inner);
        g.owned.insert(conn.id, conn.clone());
        g.udp_maybe = false;
    }
    (eng, sock, conn, far)
}

/// Nothing anywhere: the short path's `EAGAIN`.
#[test]
fn a_lone_parked_connection_with_nothing_answers_eagain() {
    let (_eng, sock, _conn, _far) = lone();
    assert_eq!(recv_nonblocking(&sock), Err(libc::EAGAIN));
}

/// A datagram queued without a doorbell (a receive call read it itself)
/// is received: the short path saw only the connection and answered
/// `EAGAIN` without its look at the queue.
#[test]
fn a_datagram_queued_without_a_doorbell_is_received() {
    let (_eng, sock, _conn, _far) = lone();
    let data = b"queued".to_vec();
    sock.rx_bytes
        .fetch_add(data.len() + DGRAM_OVERHEAD, Ordering::Relaxed);
    sock.rx_dgrams.fetch_add(1, Ordering::Relaxed);
    lock(&sock.inner).rxq.push_back(Dgram {
        src: "127.0.0.1:4444".parse().unwrap(),
        data,
    });
    assert_eq!(recv_nonblocking(&sock), Ok(b"queued".to_vec()));
    assert_eq!(recv_nonblocking(&sock), Err(libc::EAGAIN));
}

/// A connection listed without a doorbell (a blocking call's poll loop
/// lists it, then rings) is served off the list, which reads on for the
/// datagram behind and keeps the descriptor readable for it: the short
/// path served it as a lone connection, took it off the list, and the
/// second datagram waited in its socket with nothing to announce it (the
/// connection parked: unwatched), a lost wake-up.
#[test]
fn a_connection_listed_without_a_doorbell_keeps_the_next_datagram_announced() {
    let (eng, sock, conn, mut far) = lone();
    arrive(&conn, &mut far, &framed(b"first"));
    {
        let mut st = lock(&conn.st);
        assert!(matches!(
            Conn::read_some(&mut st),
            crate::udp::conn::Rd::Data(_)
        ));
    }
    arrive(&conn, &mut far, &framed(b"second"));
    assert!(!conn.ready.swap(true, Ordering::Relaxed));
    lock(&sock.inner).ready.push_back(conn.clone());
    conn.set_ready(eng);
    // Refused by the glance as well as by the look at the list.
    assert_eq!(conn.glance(), None, "a listed connection glanced at");
    assert_eq!(recv_nonblocking(&sock), Ok(b"first".to_vec()));
    assert!(
        readable(sock.bell.app, 0),
        "a datagram waits and the descriptor does not read as ready"
    );
    assert_eq!(recv_nonblocking(&sock), Ok(b"second".to_vec()));
}

/// A datagram a poll in another thread held after the short path's read
/// found nothing (the poll said readable) is received by the same call:
/// without its look for held datagrams the call answered `EAGAIN`.
/// Staged: in that gap (`after_empty_serve`) the datagram arrives and the
/// poll's wake-up takes it up (`Sock::woke`: `hold_frame`).
#[test]
fn a_datagram_a_poll_held_meanwhile_is_received() {
    let (eng, sock, conn, far) = lone();
    let far = RefCell::new(far);
    AFTER_EMPTY_SERVE.with(|a| {
        *a.borrow_mut() = Some(Box::new(move |sock: &Sock, c: &Arc<Conn>| {
            arrive(c, &mut far.borrow_mut(), &framed(b"held"));
            let fd = lock(&c.st).fd;
            assert!(matches!(
                sock.woke(eng, c, fd, libc::POLLIN, None),
                super::super::Woke::Held
            ));
        }));
    });
    assert_eq!(recv_nonblocking(&sock), Ok(b"held".to_vec()));
    assert!(
        AFTER_EMPTY_SERVE.with(|a| a.borrow().is_none()),
        "the short path was not taken"
    );
    assert!(!conn.held.load(Ordering::Relaxed));
    assert_eq!(recv_nonblocking(&sock), Err(libc::EAGAIN));
}
