//! MPA between two in-memory connections: the golden Request and Reply,
//! private data and IRD/ORD negotiation (RFC 6581), a revision-1 peer, a
//! reject with private data, timeouts in both roles, peer-to-peer RTR
//! frames for Write and Read, and a responder that sends nothing before
//! the initiator's first FPDU.

mod util;

use std::time::Duration;

use util::{recv_wr, send_wr, sge, Cut, Pair};
use warpsock_proto::wire::mpa;
use warpsock_proto::{Access, ConnectError, Event, QpState, RtrOffer, RtrType, SendOp, SendWr};

#[test]
fn golden_mpa_request_and_reply() {
    let mut p = Pair::new(|_| {}, |_| {}, Cut::Whole);
    p.establish();
    let mut req = b"MPA ID Req Frame".to_vec();
    req.extend_from_slice(&[0x10, 2, 0, 4, 0, 16, 0, 16]);
    assert_eq!(p.a.sent, req);
    let mut rep = b"MPA ID Rep Frame".to_vec();
    rep.extend_from_slice(&[0x10, 2, 0, 4, 0, 16, 0, 16]);
    assert_eq!(p.b.sent, rep);
    assert_eq!(p.b.conn.state(), QpState::Rts);
}

#[test]
fn private_data_and_ird_ord_negotiation() {
    let mut p = Pair::new(
        |c| {
            c.private_data = b"hello responder".to_vec();
            c.ird = 4;
            c.ord = 200;
        },
        |c| {
            c.ird = 8;
            c.ord = 2;
        },
        Cut::Whole,
    );
    p.b.accept_with = Some(b"hi initiator".to_vec());
    p.establish();
    let req = p.b.events.iter().find_map(|e| match e {
        Event::ConnectRequest(r) => Some(r.clone()),
        _ => None,
    });
    let req = req.unwrap();
    assert_eq!(req.private_data, b"hello responder");
    assert_eq!(req.params.unwrap().ird, 4);
    let na = p.a.conn.negotiated().unwrap();
    let nb = p.b.conn.negotiated().unwrap();
    assert_eq!(na.peer_private_data, b"hi initiator");
    assert_eq!(nb.peer_private_data, b"hello responder");
    // Responder: ORD = min(2, peer IRD 4) = 2; IRD = max(8, peer ORD 200) capped at 128.
    assert_eq!((nb.ird, nb.ord), (128, 2));
    // Initiator: ORD = min(200, responder IRD 128); IRD covers responder ORD.
    assert_eq!((na.ord, na.ird), (128, 4));
}

#[test]
fn rev1_peer_is_accepted() {
    let mut p = Pair::new(|c| c.mpa_revision = 1, |_| {}, Cut::Whole);
    p.establish();
    assert_eq!(&p.a.sent[16..20], &[0, 1, 0, 0]);
    assert_eq!(&p.b.sent[16..20], &[0, 1, 0, 0]);
    assert_eq!(p.a.conn.negotiated().unwrap().revision, 1);
}

#[test]
fn reject_with_private_data() {
    let mut p = Pair::new(|_| {}, |_| {}, Cut::Whole);
    p.b.accept_with = None;
    p.run();
    assert!(matches!(p.b.events[0], Event::ConnectRequest(_)));
    p.b.conn.reject(b"go away").unwrap();
    p.run();
    assert!(p.a.events.contains(&Event::Rejected(b"go away".to_vec())));
    assert_eq!(p.b.sent[16], 0x30, "R + S flags");
    assert!(p.a.conn.wants_close() && p.b.conn.wants_close());
    assert!(p.b.conn.accept(&[]).is_err());
}

#[test]
fn mpa_timeouts_both_roles() {
    // Nothing is delivered: the responder never sees a request, the
    // initiator never sees a reply.
    let mut p = Pair::new(
        |c| c.mpa_timeout = Duration::from_secs(10),
        |c| c.mpa_timeout = Duration::from_secs(5),
        Cut::Whole,
    );
    p.advance(Duration::from_secs(4));
    assert!(p.b.events.is_empty());
    p.advance(Duration::from_secs(2));
    assert_eq!(
        p.b.events,
        vec![Event::ConnectFailed(ConnectError::Timeout)]
    );
    assert!(p.a.events.is_empty());
    p.advance(Duration::from_secs(5));
    assert_eq!(
        p.a.events,
        vec![Event::ConnectFailed(ConnectError::Timeout)]
    );
}

#[test]
fn p2p_write_and_read_rtr() {
    // (offer, chosen, responder prefers Read)
    for (offer, want, prefer_read) in [
        (
            RtrOffer {
                write: true,
                read: false,
            },
            RtrType::Write,
        ),
        (
            RtrOffer {
                write: false,
                read: true,
            },
            RtrType::Read,
        ),
        (
            RtrOffer {
                write: true,
                read: true,
            },
            RtrType::Write,
        ),
    ]
    .into_iter()
    .map(|(offer, want)| (offer, want, false))
    .chain([(
        RtrOffer {
            write: true,
            read: true,
        },
        RtrType::Read,
        true,
    )]) {
        let mut p = Pair::new(
            |c| c.p2p = Some(offer),
            |c| c.prefer_read_rtr = prefer_read,
            Cut::Whole,
        );
        p.run();
        assert!(p.a.established() && p.b.established(), "{offer:?}");
        assert_eq!(p.a.conn.negotiated().unwrap().rtr, Some(want));
        assert_eq!(p.b.conn.negotiated().unwrap().rtr, Some(want));
        // The initiator's first FPDU is the zero-length RTR message.
        let f = &p.a.sent[24..];
        match want {
            RtrType::Write => assert_eq!(
                &f[..16],
                &[0, 14, 0xc1, 0x40, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0]
            ),
            _ => {
                assert_eq!(&f[..4], &[0, 46, 0x41, 0x41]);
                // ... answered by a zero-length Read Response.
                assert_eq!(&p.b.sent[24..28], &[0, 14, 0xc1, 0x42]);
            }
        }
        // Traffic flows afterwards.
        let s = p.a.region(0, b"abc".to_vec(), Access::LOCAL_READ);
        let r = p.b.region(0, vec![0; 3], Access::LOCAL_WRITE);
        p.b.conn.post_recv(recv_wr(1, sge(0, 3, r).into())).unwrap();
        p.a.conn.post_send(send_wr(1, sge(0, 3, s).into())).unwrap();
        p.run();
        assert_eq!(p.b.mem(r), b"abc");
    }
}

#[test]
fn responder_sends_nothing_before_first_fpdu() {
    let mut p = Pair::new(|_| {}, |_| {}, Cut::Whole);
    p.run();
    let s = p.b.region(0, b"early".to_vec(), Access::LOCAL_READ);
    p.b.conn.post_send(send_wr(7, sge(0, 5, s).into())).unwrap();
    p.run();
    assert_eq!(
        p.b.sent.len(),
        mpa::HEADER_LEN + 4,
        "only the MPA reply went out"
    );
    // The initiator's first FPDU (a Write) releases it.
    let dst = p.b.region(0x100, vec![0; 1], Access::REMOTE_WRITE);
    let one = p.a.region(0, vec![9], Access::LOCAL_READ);
    let r = p.a.region(0x10, vec![0; 5], Access::LOCAL_WRITE);
    p.a.conn
        .post_recv(recv_wr(1, sge(0x10, 5, r).into()))
        .unwrap();
    p.a.conn
        .post_send(SendWr {
            wr_id: 1,
            op: SendOp::Write {
                remote_addr: 0x100,
                rkey: dst,
            },
            sgl: sge(0, 1, one).into(),
            signaled: true,
        })
        .unwrap();
    p.run();
    assert_eq!(p.a.mem(r), b"early");
}
