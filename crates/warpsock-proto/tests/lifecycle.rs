//! A connection's life after the handshake, between two in-memory
//! connections: close flushes everything in order, each way a stream can
//! end keeps its cause, ORD bounds outstanding Reads, and the responder
//! issues every operation too.

mod util;

use std::time::Instant;

use util::{pattern, recv_wr, send_wr, sge, Cut, Pair, Rng};
use warpsock_proto::wire::terminate::TermCode;
use warpsock_proto::{
    Access, CloseReason, Config, ConnectError, Connection, Event, PdId, QpState, Role, SendOp,
    SendWr, Sge, Sgl, TransportError, WcStatus,
};

#[test]
fn close_flushes_everything_in_order() {
    let mut p = Pair::new(|_| {}, |_| {}, Cut::Whole);
    p.establish();
    let sink = p.a.region(0, vec![0; 8], Access::LOCAL_WRITE);
    for i in 0..3 {
        p.a.conn
            .post_recv(recv_wr(10 + i, sge(0, 8, sink).into()))
            .unwrap();
    }
    // Reads that the peer can never answer (nothing is delivered).
    for i in 0..2 {
        p.a.conn
            .post_send(SendWr {
                wr_id: i,
                op: SendOp::Read {
                    remote_addr: 0,
                    rkey: 0x1234,
                },
                sgl: sge(0, 8, sink).into(),
                signaled: true,
            })
            .unwrap();
    }
    p.a.conn.close();
    p.a.pump();
    let ids: Vec<_> = p.a.wcs.iter().map(|w| (w.wr_id, w.status)).collect();
    assert_eq!(
        ids,
        vec![
            (0, WcStatus::WrFlushError),
            (1, WcStatus::WrFlushError),
            (10, WcStatus::WrFlushError),
            (11, WcStatus::WrFlushError),
            (12, WcStatus::WrFlushError),
        ]
    );
    assert!(p.a.events.contains(&Event::Closed(CloseReason::Local)));
    assert_eq!(p.a.conn.close_reason(), Some(CloseReason::Local));
    assert_eq!(p.a.conn.state(), QpState::Error);
    // Posting after close completes at once with a flush error.
    p.a.conn.post_recv(recv_wr(99, Sgl::new())).unwrap();
    p.a.pump();
    assert_eq!(p.a.wcs.last().unwrap().wr_id, 99);
    // Peer EOF on the other side flushes and reports Closed too, saying
    // the peer closed.
    p.b.conn.handle_eof();
    p.b.pump();
    assert!(p.b.events.contains(&Event::Closed(CloseReason::PeerClosed)));
}

/// Each way a stream can end is told apart: a reset and a timeout (as the
/// engine classifies its socket errors) keep their cause in the Closed
/// event and the connection's close reason, a Terminate from the peer
/// names its code, and a later failure never overwrites the first cause.
#[test]
fn close_reasons_keep_their_cause() {
    for e in [
        TransportError::Reset,
        TransportError::TimedOut,
        TransportError::Os(113),
    ] {
        let mut p = Pair::new(|_| {}, |_| {}, Cut::Whole);
        p.establish();
        p.a.conn.handle_transport_error(e);
        p.a.pump();
        let want = CloseReason::Transport(e);
        assert!(
            p.a.events.contains(&Event::Closed(want)),
            "{:?}",
            p.a.events
        );
        assert_eq!(p.a.conn.close_reason(), Some(want));
        // A FIN seen afterwards does not replace the cause.
        p.a.conn.handle_eof();
        assert_eq!(p.a.conn.close_reason(), Some(want));
    }
    // Setup: a reset before the Reply is a transport failure, not EOF.
    let mut a = Connection::new(Config::new(Role::Initiator, PdId(1)), Instant::now());
    a.handle_transport_error(TransportError::Reset);
    let evs: Vec<_> = std::iter::from_fn(|| a.poll_event()).collect();
    assert_eq!(
        evs,
        vec![Event::ConnectFailed(ConnectError::Transport(
            TransportError::Reset
        ))]
    );
    // The peer's Terminate: B receives a Send with no receive posted.
    let mut p = Pair::new(|_| {}, |_| {}, Cut::Whole);
    p.establish();
    let src = p.a.region(0, pattern(16, 1), Access::LOCAL_READ);
    p.a.conn
        .post_send(send_wr(
            1,
            Sge {
                addr: 0,
                length: 16,
                lkey: src,
            }
            .into(),
        ))
        .unwrap();
    p.run();
    let code = TermCode::DDP_UNTAGGED_NO_BUFFER;
    assert_eq!(
        p.b.conn.close_reason(),
        Some(CloseReason::Terminated {
            code,
            by_peer: false
        })
    );
    let by_peer = CloseReason::Terminated {
        code,
        by_peer: true,
    };
    assert!(
        p.a.events.contains(&Event::Closed(by_peer)),
        "{:?}",
        p.a.events
    );
    assert_eq!(by_peer.to_string(), format!("peer sent Terminate {code}"));
}

#[test]
fn ord_limits_outstanding_reads() {
    let mut p = Pair::new(|c| c.ord = 2, |c| c.ird = 2, Cut::Whole);
    p.establish();
    let src = p.b.region(0, pattern(100, 3), Access::REMOTE_READ);
    let sink = p.a.region(0, vec![0; 500], Access::LOCAL_WRITE);
    for i in 0..5u64 {
        p.a.conn
            .post_send(SendWr {
                wr_id: i,
                op: SendOp::Read {
                    remote_addr: i * 10,
                    rkey: src,
                },
                sgl: sge(i * 100, 10, sink).into(),
                signaled: true,
            })
            .unwrap();
    }
    // Only ORD Read Requests go out before responses come back.
    p.step();
    let reqs = p.a.sent[24..]
        .chunks(52)
        .filter(|c| c.len() == 52 && c[3] == 0x41)
        .count();
    assert_eq!(reqs, 2);
    p.run();
    assert_eq!(p.a.wcs.len(), 5);
    assert!(p.a.wcs.iter().all(|w| w.status == WcStatus::Success));
    for i in 0..5usize {
        assert_eq!(
            &p.a.mem(sink)[i * 100..i * 100 + 10],
            &pattern(100, 3)[i * 10..i * 10 + 10]
        );
    }
}

/// The responder issues every operation too (after the initiator's first
/// FPDU has released its send side), with CRC and markers on.
#[test]
fn responder_initiated_operations() {
    for (crc, markers) in [(false, false), (true, true)] {
        let mut p = Pair::new(
            |c| {
                c.crc = crc;
                c.markers = markers;
            },
            |c| c.markers = markers,
            Cut::Random {
                rng: Rng(0xfeed),
                max: 700,
            },
        );
        p.establish();
        // Initiator memory the responder targets.
        let a_w = p.a.region(0x100, vec![0; 30_000], Access::REMOTE_WRITE);
        let a_r = p.a.region(0x9000, pattern(30_000, 4), Access::REMOTE_READ);
        let a_recv = p.a.region(0, vec![0; 30_000], Access::LOCAL_WRITE);
        let b_src = p.b.region(0, pattern(30_000, 8), Access::LOCAL_READ);
        let b_sink = p.b.region(0x7000, vec![0; 30_000], Access::LOCAL_WRITE);
        let b_recv = p.b.region(0x1_0000, vec![0; 8], Access::LOCAL_WRITE);
        p.a.conn
            .post_recv(recv_wr(50, sge(0, 30_000, a_recv).into()))
            .unwrap();
        p.b.conn
            .post_recv(recv_wr(60, sge(0x1_0000, 8, b_recv).into()))
            .unwrap();
        // The initiator's first FPDU (an empty Send) opens the responder's side.
        p.a.conn.post_send(send_wr(1, Sgl::new())).unwrap();
        let ops = [
            (
                10,
                SendOp::Write {
                    remote_addr: 0x100 + 7,
                    rkey: a_w,
                },
                sge(0, 20_000, b_src),
            ),
            (
                11,
                SendOp::Read {
                    remote_addr: 0x9000 + 3,
                    rkey: a_r,
                },
                sge(0x7000, 25_000, b_sink),
            ),
            (
                12,
                SendOp::Send {
                    solicited: true,
                    invalidate: None,
                },
                sge(100, 29_000, b_src),
            ),
        ];
        for (wr_id, op, s) in ops {
            p.b.conn
                .post_send(SendWr {
                    wr_id,
                    op,
                    sgl: s.into(),
                    signaled: true,
                })
                .unwrap();
        }
        p.run();
        let b: Vec<_> =
            p.b.wcs
                .iter()
                .map(|w| (w.wr_id, w.status, w.byte_len))
                .collect();
        assert_eq!(
            b,
            vec![
                (60, WcStatus::Success, 0),
                (10, WcStatus::Success, 20_000),
                (11, WcStatus::Success, 25_000),
                (12, WcStatus::Success, 29_000),
            ]
        );
        let a: Vec<_> =
            p.a.wcs
                .iter()
                .map(|w| (w.wr_id, w.status, w.byte_len, w.solicited))
                .collect();
        assert_eq!(
            a,
            vec![
                (1, WcStatus::Success, 0, false),
                (50, WcStatus::Success, 29_000, true)
            ]
        );
        let src = pattern(30_000, 8);
        assert_eq!(&p.a.mem(a_w)[7..20_007], &src[..20_000]);
        assert!(p.a.mem(a_w)[..7].iter().all(|&x| x == 0));
        assert_eq!(&p.b.mem(b_sink)[..25_000], &pattern(30_000, 4)[3..25_003]);
        assert_eq!(&p.a.mem(a_recv)[..29_000], &src[100..29_100]);
    }
}
