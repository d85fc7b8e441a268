//! A connection's descriptor and the progress thread's epoll set.

use std::net::{TcpListener, TcpStream};
use std::os::fd::IntoRawFd;
use std::sync::Arc;

use super::Conn;
use crate::shim::reactor::{self, Handler, Reactor};
use crate::shim::sys::{self, lock};
use crate::udp::core::frame::NONCE_LEN;

/// A handler that does nothing (the test looks at the epoll set only).
struct Nobody;

impl Handler for Nobody {
    fn on_ready(&self, _: &'static Reactor, _: u32) {}
}

/// An accepted connection on loopback (its descriptor, and the peer's end
/// to keep open), registered with the progress thread with no interest, as
/// while a receive call claims it.
fn accepted() -> (&'static Reactor, Arc<Conn>, libc::c_int, TcpStream) {
    let eng = reactor::get().expect("the progress thread");
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let peer = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let (c, from) = l.accept().unwrap();
    let fd = c.into_raw_fd();
    let conn = Arc::new(Conn::accepted(eng.new_id(), fd, from, [7; NONCE_LEN]));
    assert!(eng.register(fd, conn.id, 0, Arc::new(Nobody)));
    (eng, conn, fd, peer)
}

/// A connection closed while something else holds its socket's file (a
/// blocking receive call polling the descriptor does; here a duplicate)
/// leaves the progress thread's epoll set. `close` alone left it there:
/// the set kept reporting the closed socket's `EPOLLHUP` (whatever the
/// mask) under a token nobody handles, and the progress thread spun until
/// the poll returned (a victim's 20 s receive timeout, under 300 silent
/// connections whose evictions closed the ones its receive was polling).
#[test]
fn a_closed_connection_leaves_the_epoll_set_while_its_file_lives_on() {
    let (eng, conn, fd, _peer) = accepted();
    assert!(eng.watches(fd, conn.id));
    // The receive call's poll: another reference to the file.
    // SAFETY: duplicating a descriptor this test owns.
    let held = unsafe { libc::dup(fd) };
    assert!(held >= 0);
    let _ = conn.die(&mut lock(&conn.st));
    assert!(
        !eng.watches(fd, conn.id),
        "the closed connection's socket is still in the progress thread's epoll set"
    );
    sys::close(held);
    eng.deregister(conn.id, None);
}

/// Whatever the connection's state, its watch is level-triggered only
/// while it asks for input or room to write: a socket reports `EPOLLHUP`
/// and `EPOLLERR` whatever the mask, and a level-triggered watch asking
/// for nothing reported a reset socket's at every wait (an unproved
/// connection holding back its input, then reset: the progress thread
/// spun until the deadline; `tests/attacks.rs`
/// `held_input_of_a_reset_connection_spins_nothing`).
#[test]
fn a_watch_that_asks_nothing_is_edge_triggered() {
    let (et, inp, out) = (
        libc::EPOLLET as u32,
        libc::EPOLLIN as u32,
        libc::EPOLLOUT as u32,
    );
    for bits in 0..32u32 {
        let i = super::Interest {
            fd: 3,
            read: bits & 1 != 0,
            write: bits & 2 != 0,
            callers: usize::from(bits & 4 != 0),
            edge: bits & 8 != 0,
            parked: (bits & 16 != 0).then(std::time::Instant::now),
            listed: false,
            used: false,
            handback: None,
            given_back: false,
        };
        let m = i.mask();
        assert!(
            m & (inp | out) != 0 || m & et != 0,
            "state {bits:05b}: mask {m:#x} is level-triggered and asks nothing"
        );
        let ours = i.callers > 0 || i.parked.is_some();
        assert_eq!(
            m & inp != 0,
            (i.read || i.edge) && !ours,
            "state {bits:05b}"
        );
        assert_eq!(m & out != 0, i.write, "state {bits:05b}");
    }
}

/// A non-blocking receive's look at a parked connection
/// ([`Conn::glance`]) leaves nothing to undo: it counts no caller (a claim
/// would keep the progress thread off the connection until given back),
/// so a wait that gives parked connections back gives it back whole; it
/// marks the connection used, so that the park timer keeps it parked for
/// another grace period; and it sees only parked connections (the others
/// are the progress thread's or a blocking call's). What the glancing
/// call then does keeps it parked: the ready list if it read more than
/// one datagram, and the drain off it.
#[test]
fn a_glance_at_a_parked_connection_claims_nothing() {
    let (eng, conn, fd, _peer) = accepted();
    assert_eq!(conn.glance(), None, "a connection that is not parked");
    // A blocking call's claim, then its end with a datagram: parked.
    assert_eq!(conn.claim(eng), Some(fd));
    assert!(conn.unclaim(eng, fd, true));
    let since = lock(&conn.ev).parked.expect("parked");
    // Taken over while parked (a poll, a blocking receive) and left parked
    // again: the count of callers goes back to none, the park's time and
    // mask stay as they were.
    let mask = lock(&conn.ev).mask();
    for _ in 0..2 {
        assert_eq!(conn.claim(eng), Some(fd));
    }
    assert_eq!(lock(&conn.ev).callers, 2);
    for _ in 0..2 {
        assert!(conn.unclaim(eng, fd, true));
    }
    {
        let i = lock(&conn.ev);
        assert_eq!(i.callers, 0, "a claim's end left a caller counted");
        assert_eq!(i.parked, Some(since));
        assert_eq!(i.mask(), mask);
    }
    // Paused (a full queue) while parked: its input is not the call's.
    lock(&conn.ev).read = false;
    assert_eq!(conn.glance(), None, "a connection that does not read");
    lock(&conn.ev).read = true;
    lock(&conn.ev).used = false;
    assert_eq!(conn.glance(), Some(fd));
    {
        let i = lock(&conn.ev);
        assert_eq!(i.callers, 0, "a glance counted a caller");
        assert!(i.used, "a glance left the connection unmarked");
        assert!(i.parked.is_some());
    }
    // The glancing receive read more than one datagram: the connection
    // joins the ready list and stays parked (unwatched, no `epoll_ctl`),
    // and so when the receives drain it.
    let mask = lock(&conn.ev).mask();
    conn.set_ready(eng);
    assert_eq!(
        lock(&conn.ev).parked,
        Some(since),
        "the ready list unparked it"
    );
    assert_eq!(lock(&conn.ev).mask(), mask);
    conn.drained(eng);
    assert_eq!(lock(&conn.ev).parked, Some(since));
    assert_eq!(lock(&conn.ev).mask(), mask);
    // The timer after the grace period: used since, so parked again.
    let later = std::time::Instant::now() + crate::udp::park::grace() * 2;
    assert!(!conn.unpark(eng, Some(later)));
    assert!(lock(&conn.ev).parked.is_some());
    // A wait that gives parked connections back: the progress thread
    // watches its input again at once, as if never looked at.
    assert!(conn.released(eng));
    {
        let i = lock(&conn.ev);
        assert!(i.parked.is_none());
        assert_eq!(i.mask() & libc::EPOLLIN as u32, libc::EPOLLIN as u32);
    }
    let _ = conn.die(&mut lock(&conn.st));
    eng.deregister(conn.id, None);
}

/// A poll of a lone parked connection that may wait ([`Conn::take_parked`])
/// keeps the park timer off it however long it waits, without a claim's
/// lock: the timer's looks, each a grace period apart, leave it parked
/// while the poll is counted, and give it back at the first look after the
/// poll returned and its glance's mark was taken. A poll that does not
/// wait only glances.
#[test]
fn a_waiting_poll_keeps_the_park_timer_off_its_connection() {
    let (eng, conn, fd, _peer) = accepted();
    assert_eq!(
        conn.take_parked(true),
        None,
        "a connection that is not parked"
    );
    assert_eq!(conn.claim(eng), Some(fd));
    assert!(conn.unclaim(eng, fd, true));
    let grace = crate::udp::park::grace();
    let mut at = std::time::Instant::now();
    assert_eq!(conn.take_parked(true), Some(fd));
    assert_eq!(
        lock(&conn.ev).callers,
        0,
        "a poll took the claim's lock count"
    );
    for _ in 0..3 {
        at += grace * 2;
        assert!(
            !conn.unpark(eng, Some(at)),
            "given back under a waiting poll"
        );
        assert!(lock(&conn.ev).parked.is_some());
    }
    conn.poll_done();
    // `poll(…, 0)`: a glance, no poller counted.
    assert_eq!(conn.take_parked(false), Some(fd));
    at += grace * 2;
    assert!(
        !conn.unpark(eng, Some(at)),
        "the glance's mark re-parks it once"
    );
    at += grace * 2;
    assert!(conn.unpark(eng, Some(at)), "parked on with no poll waiting");
    let _ = conn.die(&mut lock(&conn.st));
    eng.deregister(conn.id, None);
}

/// A datagram a poll held without a claim on a connection given back
/// meanwhile (a `select` or `epoll_wait` in another thread) is announced
/// by the hand-back timer, due at once; on a connection still parked,
/// nothing is started (its next taker serves it).
#[test]
fn a_hold_on_a_connection_given_back_meanwhile_is_handed_back() {
    let (eng, conn, fd, _peer) = accepted();
    assert_eq!(conn.claim(eng), Some(fd));
    assert!(conn.unclaim(eng, fd, true));
    assert_eq!(conn.take_parked(false), Some(fd));
    // Still parked: nothing to announce.
    conn.held.store(true, std::sync::atomic::Ordering::Relaxed);
    conn.held_unclaimed(eng);
    assert!(lock(&conn.ev).handback.is_none());
    // Given back between the glance and the hold (nothing held then).
    conn.held.store(false, std::sync::atomic::Ordering::Relaxed);
    assert!(conn.released(eng));
    assert!(lock(&conn.ev).handback.is_none());
    conn.held.store(true, std::sync::atomic::Ordering::Relaxed);
    conn.held_unclaimed(eng);
    assert!(
        lock(&conn.ev).handback.is_some(),
        "a held datagram on a given-back connection has nothing to announce it"
    );
    let _ = conn.die(&mut lock(&conn.st));
    eng.deregister(conn.id, None);
}

/// A wait in another thread that sees only the doorbell (`select`,
/// `epoll_wait`: `park::release_all`) gives a parked connection back while
/// a waiting poll has it claimed: the claim's end leaves it to the progress
/// thread. It parked it again, unwatched, and that wait was blind to the
/// connection's input until the park timer gave it back (10 ms). The claim
/// after that parks as before.
#[test]
fn a_claim_given_back_meanwhile_does_not_park_again() {
    let (eng, conn, fd, _peer) = accepted();
    let input = libc::EPOLLIN as u32;
    assert_eq!(conn.claim(eng), Some(fd));
    assert!(conn.unclaim(eng, fd, true));
    assert!(lock(&conn.ev).parked.is_some(), "parked");
    // A waiting poll claims it; another thread's wait gives it back.
    assert_eq!(conn.claim(eng), Some(fd));
    assert!(conn.released(eng));
    assert!(conn.unclaim(eng, fd, true));
    {
        let i = lock(&conn.ev);
        assert!(i.parked.is_none(), "parked again after release_all");
        assert_eq!(i.mask() & input, input, "not watched for input");
    }
    // The next claim and its end park it again.
    assert_eq!(conn.claim(eng), Some(fd));
    assert!(conn.unclaim(eng, fd, true));
    assert!(
        lock(&conn.ev).parked.is_some(),
        "not parked by the next claim"
    );
    let _ = conn.die(&mut lock(&conn.st));
    eng.deregister(conn.id, None);
}
