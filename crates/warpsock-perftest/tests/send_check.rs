//! send-check between two warpsock ends on loopback: the protocol's
//! credits, verification and result message, without siw.

use std::time::Duration;

use warpsock_engine::RtrOffer;
use warpsock_engine::{Listener, RtrType};
use warpsock_perftest::send_check::{client, server_on, Params};

/// The server's listener: 127.0.0.1, port 0, bound before the client
/// starts (no other program can take the port in between).
fn listener() -> (Listener, u16) {
    let l = Listener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    (l, port)
}

fn params(port: u16, n: u64, s: u32) -> Params {
    Params {
        host: "127.0.0.1".into(),
        port,
        n,
        s,
        window: 5,
        depth: 3,
        crc: false,
        p2p: None,
        prefer_read_rtr: false,
        timeout: Duration::from_secs(20),
    }
}

#[test]
fn every_byte_arrives_and_is_verified() {
    for (n, s, crc, p2p) in [
        (1000, 1, false, None),
        (300, 65537, true, None),
        (
            7,
            1 << 20,
            false,
            Some(RtrOffer {
                write: true,
                read: false,
            }),
        ),
    ] {
        let (l, port) = listener();
        let mut sp = params(port, n, s);
        sp.crc = crc;
        let srv = std::thread::spawn(move || server_on(l, &sp));
        let mut cp = params(port, n, s);
        cp.p2p = p2p;
        let c = client(&cp).expect("client");
        let r = srv.join().unwrap().expect("server");
        assert!(c.ok() && r.ok(), "{}\n{}", c.client_line(), r.server_line());
        assert_eq!(r.local.messages, n);
        assert_eq!(r.local.bytes, n * u64::from(s));
        assert_eq!(c.remote, Some(r.local));
        assert_eq!(r.local.checksum, c.local.checksum);
        assert_eq!(r.crc, crc);
        assert_eq!(r.rtr.is_some(), p2p.is_some());
    }
}

#[test]
fn the_server_rejects_other_parameters() {
    let (l, port) = listener();
    let sp = params(port, 10, 100);
    let srv = std::thread::spawn(move || server_on(l, &sp));
    let mut cp = params(port, 10, 101);
    cp.timeout = Duration::from_secs(2);
    assert!(client(&cp).is_err());
    let e = srv.join().unwrap().unwrap_err().to_string();
    assert!(e.contains("rejected"), "{e}");
}

#[test]
fn a_responder_can_choose_read_rtr() {
    let (l, port) = listener();
    let mut sp = params(port, 200, 4099);
    sp.crc = true;
    sp.prefer_read_rtr = true;
    let srv = std::thread::spawn(move || server_on(l, &sp));
    let mut cp = params(port, 200, 4099);
    cp.p2p = Some(RtrOffer {
        write: true,
        read: true,
    });
    let c = client(&cp).expect("client");
    let r = srv.join().unwrap().expect("server");
    assert!(c.ok() && r.ok(), "{}\n{}", c.client_line(), r.server_line());
    assert_eq!(c.rtr, Some(RtrType::Read));
    assert_eq!(r.rtr, Some(RtrType::Read));
    assert_eq!(c.remote, Some(r.local));
    assert!(r.crc && c.crc);
}

#[test]
fn the_read_rtr_server_needs_both_offered() {
    let (l, port) = listener();
    let mut sp = params(port, 10, 100);
    sp.prefer_read_rtr = true;
    let srv = std::thread::spawn(move || server_on(l, &sp));
    let mut cp = params(port, 10, 100);
    cp.p2p = Some(RtrOffer {
        write: true,
        read: false,
    });
    cp.timeout = Duration::from_secs(2);
    assert!(client(&cp).is_err());
    let e = srv.join().unwrap().unwrap_err().to_string();
    assert!(e.contains("did not offer both"), "{e}");
}
