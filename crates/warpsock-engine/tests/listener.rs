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
