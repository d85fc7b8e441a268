//! The listener against hostile peers (issue 15, finding 1): handshakes
//! run side by side, so silent, dribbling and flooding peers never delay a
//! good one; each pending handshake has a deadline, and there is a cap on
//! how many are pending (the oldest is evicted).

mod common;

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::LIMIT;
use warpsock_engine::{connect, CmError, Context, Listener, Progress, QpInit};

/// A good client in its own thread: connects, reports how long setup took.
fn good_client(addr: SocketAddr) -> std::thread::JoinHandle<Result<Duration, CmError>> {
    std::thread::spawn(move || {
        let ctx = Context::new(Progress::Caller).unwrap();
        let (pd, cq) = (ctx.alloc_pd(), ctx.create_cq(4).unwrap());
        let t0 = Instant::now();
        let qp = connect(addr, &QpInit::new(&pd, &cq))?;
        let took = t0.elapsed();
        drop(qp);
        Ok(took)
    })
}

/// Accepts until a Request arrives (failed handshakes are noted), and
/// accepts it.
fn serve_one(l: &Listener, failures: &mut Vec<CmError>) {
    let ctx = Context::new(Progress::Caller).unwrap();
    let (pd, cq) = (ctx.alloc_pd(), ctx.create_cq(4).unwrap());
    let until = Instant::now() + LIMIT;
    while Instant::now() < until {
        match l.accept(Some(LIMIT)) {
            Ok(req) => {
                let _qp = req.accept(&QpInit::new(&pd, &cq), b"").unwrap();
                return;
            }
            Err(e) => failures.push(e),
        }
    }
    panic!("no good request within {LIMIT:?}: {failures:?}");
}

/// Ten silent connections and one that dribbles its MPA Request a byte at
/// a time are pending when a good client connects: it is served at once
/// (a listener that read one handshake at a time made it wait out each
/// silent peer's whole MPA timeout, here 30 s each).
#[test]
fn silent_and_dribbling_peers_do_not_delay_a_good_one() {
    let mut l = Listener::bind("127.0.0.1:0").unwrap();
    l.set_mpa_timeout(Duration::from_secs(30));
    let addr = l.local_addr().unwrap();
    let silent: Vec<TcpStream> = (0..10).map(|_| TcpStream::connect(addr).unwrap()).collect();
    let (stop_tx, stop_rx) = mpsc::channel::<()>();
    // Connected here, before the good client, so it is pending for sure.
    let mut s = TcpStream::connect(addr).unwrap();
    let dribbler = std::thread::spawn(move || {
        for b in b"MPA ID Req Frame\x10\x02\x00\x04\x00\x01\x00\x01" {
            if s.write_all(&[*b]).is_err()
                || stop_rx.recv_timeout(Duration::from_millis(100)).is_ok()
            {
                break;
            }
        }
    });
    let client = good_client(addr);
    let mut failures = Vec::new();
    serve_one(&l, &mut failures);
    let took = client.join().unwrap().unwrap();
    assert!(
        took < Duration::from_secs(10),
        "the good client waited {took:?} behind silent peers"
    );
    assert!(failures.is_empty(), "{failures:?}");
    assert_eq!(
        l.pending(),
        11,
        "the silent and dribbling ones are still pending"
    );
    let _ = stop_tx.send(());
    dribbler.join().unwrap();
    drop(silent);
}

/// A peer that dribbles its Request slower than the deadline allows is cut
/// off at the deadline, counted from the TCP accept (progress does not
/// renew it), and reported with its address.
#[test]
fn a_dribbled_request_ends_at_the_deadline() {
    let mut l = Listener::bind("127.0.0.1:0").unwrap();
    l.set_mpa_timeout(Duration::from_millis(500));
    let addr = l.local_addr().unwrap();
    let dribbler = std::thread::spawn(move || {
        let mut s = TcpStream::connect(addr).unwrap();
        let me = s.local_addr().unwrap();
        for b in b"MPA ID Req Frame\x10\x02\x00\x04\x00\x01\x00\x01" {
            if s.write_all(&[*b]).is_err() {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        me
    });
    let t0 = Instant::now();
    let err = l.accept(Some(LIMIT)).unwrap_err();
    let took = t0.elapsed();
    let me = dribbler.join().unwrap();
    match err {
        CmError::Timeout {
            addr: Some(a),
            stage: "MPA request",
            ..
        } => assert_eq!(a, me),
        e => panic!("{e:?}"),
    }
    assert!(took < Duration::from_secs(2), "{took:?}");
}

/// With the pending handshakes at the cap, each new connection evicts the
/// oldest (reported with its address), and a good client still gets in
/// behind a flood of silent ones.
#[test]
fn a_flood_evicts_the_oldest_and_the_good_client_gets_in() {
    let mut l = Listener::bind("127.0.0.1:0").unwrap();
    l.set_mpa_timeout(Duration::from_secs(30));
    l.set_max_pending(4);
    let addr = l.local_addr().unwrap();
    let flood: Vec<TcpStream> = (0..12).map(|_| TcpStream::connect(addr).unwrap()).collect();
    let client = good_client(addr);
    let mut failures = Vec::new();
    serve_one(&l, &mut failures);
    assert!(client.join().unwrap().is_ok());
    // The evictions are reported after the good Request: collect them.
    loop {
        match l.accept(Some(Duration::from_millis(200))) {
            Err(CmError::Timeout {
                stage: "TCP accept",
                ..
            }) => break,
            Err(e) => failures.push(e),
            Ok(r) => panic!("an unexpected request from {}", r.peer_addr()),
        }
    }
    assert!(l.pending() <= 4, "{}", l.pending());
    let evicted: Vec<SocketAddr> = failures
        .iter()
        .map(|e| match e {
            CmError::Evicted { addr, max: 4 } => *addr,
            e => panic!("{e:?}"),
        })
        .collect();
    assert!(evicted.len() >= 8, "{failures:?}");
    let first = flood[0].local_addr().unwrap();
    assert!(
        evicted.contains(&first),
        "the oldest goes first: {evicted:?}"
    );
}

/// The bytes `s` sent and its peer has not acknowledged (`SIOCOUTQ`).
fn unacked(s: &TcpStream) -> i32 {
    use std::os::fd::AsRawFd;
    let mut n: libc::c_int = 0;
    // SAFETY: SIOCOUTQ writes one int into `n`.
    let r = unsafe { libc::ioctl(s.as_raw_fd(), libc::TIOCOUTQ, &mut n) };
    assert_eq!(r, 0, "SIOCOUTQ");
    n
}

/// Waits (bounded) until every byte `clients` sent is acknowledged: in
/// its socket at the listener's end.
fn wait_acknowledged(clients: &[TcpStream]) {
    let until = Instant::now() + LIMIT;
    while clients.iter().any(|c| unacked(c) > 0) {
        assert!(Instant::now() < until, "bytes not acknowledged");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// A burst of good clients, three times the cap, whose Requests have all
/// arrived before the listener's next call: that call takes every
/// connection the kernel queued before it reads any, and the oldest it
/// must drop for a newer one is read first — each is served, none
/// evicted. Before (helper 82's review), the handshakes past the cap were
/// evicted unread, Requests and all (8 of these 12).
#[test]
fn a_burst_of_good_clients_beyond_the_cap_is_served_whole() {
    let mut l = Listener::bind("127.0.0.1:0").unwrap();
    l.set_mpa_timeout(Duration::from_secs(30));
    l.set_max_pending(4);
    let addr = l.local_addr().unwrap();
    // An MPA v1 Request with two bytes of private data.
    const REQUEST: &[u8] = b"MPA ID Req Frame\x00\x01\x00\x02hi";
    let clients: Vec<TcpStream> = (0..12)
        .map(|_| {
            let mut c = TcpStream::connect(addr).unwrap();
            c.write_all(REQUEST).unwrap();
            c
        })
        .collect();
    // Every Request is in its socket at the listener's end.
    wait_acknowledged(&clients);
    let mut served = Vec::new();
    for _ in 0..clients.len() {
        match l.accept(Some(LIMIT)) {
            Ok(r) => served.push(r.peer_addr()),
            Err(e) => panic!("after {} served: {e:?}", served.len()),
        }
    }
    for c in &clients {
        let me = c.local_addr().unwrap();
        assert!(served.contains(&me), "{me} not served: {served:?}");
    }
}

/// A listening socket whose `accept(2)` keeps failing (here its number
/// made `/dev/null` under it: `ENOTSOCK`, as `EBADF` after a program's
/// `closefrom`) still lets the pending handshakes go on: a Request that
/// arrives is read and handed out after the error. Before (helper 82's
/// review), the error returned before any handshake was read, on every
/// call.
#[test]
fn a_failing_listening_socket_leaves_the_pending_handshakes_going() {
    use std::os::fd::{AsFd, AsRawFd};
    let l = Listener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let mut c = TcpStream::connect(addr).unwrap();
    // Taken, its Request still to come.
    match l.accept(Some(Duration::from_millis(50))) {
        Err(CmError::Timeout { .. }) => {}
        other => panic!("{other:?}"),
    }
    assert_eq!(l.pending(), 1);
    c.write_all(b"MPA ID Req Frame\x00\x01\x00\x02hi").unwrap();
    wait_acknowledged(std::slice::from_ref(&c));
    let null = std::fs::File::open("/dev/null").unwrap();
    let lfd = l.as_fd().as_raw_fd();
    // SAFETY: replaces the listener's own number with /dev/null; the
    // listener closes that number when dropped, as before.
    assert!(unsafe { libc::dup2(null.as_raw_fd(), lfd) } >= 0);
    let mut got = Vec::new();
    for _ in 0..3 {
        match l.accept(Some(LIMIT)) {
            Ok(r) => {
                assert_eq!(r.peer_addr(), c.local_addr().unwrap());
                return;
            }
            Err(e) => got.push(e),
        }
    }
    panic!("the pending Request never came: {got:?}");
}
