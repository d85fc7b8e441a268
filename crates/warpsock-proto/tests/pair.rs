//! End-to-end scenarios between two in-memory connections: every
//! operation in both roles, CRC and markers on and off, and the same
//! scenarios with the byte stream cut at random points.

mod util;

use std::time::{Duration, Instant};

use util::{pattern, Cut, Pair, Rng};
use warpsock_proto::wire::mpa;
use warpsock_proto::wire::terminate::TermCode;
use warpsock_proto::{
    Access, CloseReason, Config, ConnectError, Connection, Event, PdId, QpState, RecvWr, Role,
    RtrOffer, RtrType, SendOp, SendWr, Sge, Sgl, TransportError, WcOpcode, WcStatus,
    WorkCompletion,
};

#[derive(Clone, Copy, Debug)]
struct Opts {
    crc_a: bool,
    crc_b: bool,
    markers_a: bool,
    markers_b: bool,
    mulpdu: usize,
}

impl Default for Opts {
    fn default() -> Self {
        Self {
            crc_a: false,
            crc_b: false,
            markers_a: false,
            markers_b: false,
            mulpdu: 1442,
        }
    }
}

/// What a scenario produced: completions and final memory, compared across cuts.
#[derive(Debug, PartialEq, Eq)]
struct Outcome {
    a_wcs: Vec<WorkCompletion>,
    b_wcs: Vec<WorkCompletion>,
    b_write_region: Vec<u8>,
    a_read_sink: Vec<u8>,
    b_recv: Vec<u8>,
    a_recv: Vec<u8>,
    b_inv_valid: bool,
}

fn sge(addr: u64, length: u32, lkey: u32) -> Sge {
    Sge { addr, length, lkey }
}

/// Every operation in both directions.
fn scenario(o: Opts, cut: Cut) -> Outcome {
    let mut p = Pair::new(
        |c| {
            c.crc = o.crc_a;
            c.markers = o.markers_a;
            c.mulpdu = o.mulpdu;
        },
        |c| {
            c.crc = o.crc_b;
            c.markers = o.markers_b;
            c.mulpdu = o.mulpdu;
        },
        cut,
    );
    p.establish();
    let neg = p.a.conn.negotiated().unwrap().clone();
    assert_eq!(neg.crc, o.crc_a || o.crc_b);
    assert_eq!(neg.markers_tx, o.markers_b);
    assert_eq!(neg.markers_rx, o.markers_a);

    // Initiator memory.
    let a_src =
        p.a.region(0x10_0000, pattern(200_000, 1), Access::LOCAL_READ);
    let a_sink = p.a.region(0x20_0000, vec![0; 60_000], Access::LOCAL_WRITE);
    let a_rbuf = p.a.region(0x30_0000, vec![0; 64], Access::LOCAL_WRITE);
    // Responder memory.
    let b_rbuf = p.b.region(0x1000, vec![0; 72_000], Access::LOCAL_WRITE);
    let b_wr =
        p.b.region(0x4000_0000, vec![0; 90_000], Access::REMOTE_WRITE);
    let b_src =
        p.b.region(0x5000_0000, pattern(60_000, 7), Access::REMOTE_READ);
    let b_inv = p.b.region(
        0x6000_0000,
        vec![0; 16],
        Access::REMOTE_WRITE | Access::REMOTE_INVALIDATE,
    );
    let b_tx =
        p.b.region(0x7000_0000, b"pong!".to_vec(), Access::LOCAL_READ);

    // Responder receives: a 70,000-byte receive over two SGEs, then two more.
    p.b.conn
        .post_recv(RecvWr {
            wr_id: 100,
            sgl: [
                sge(0x1000, 30_000, b_rbuf),
                sge(0x1000 + 30_000, 40_000, b_rbuf),
            ]
            .into(),
        })
        .unwrap();
    p.b.conn
        .post_recv(RecvWr {
            wr_id: 101,
            sgl: sge(0x1000 + 70_000, 1_000, b_rbuf).into(),
        })
        .unwrap();
    p.b.conn
        .post_recv(RecvWr {
            wr_id: 102,
            sgl: sge(0x1000 + 71_000, 1_000, b_rbuf).into(),
        })
        .unwrap();
    p.a.conn
        .post_recv(RecvWr {
            wr_id: 200,
            sgl: sge(0x30_0000, 64, a_rbuf).into(),
        })
        .unwrap();

    let send = |wr_id, op, sgl: Vec<Sge>, signaled| SendWr {
        wr_id,
        op,
        sgl: sgl.into(),
        signaled,
    };
    // A 65,000-byte Send gathered from two pieces.
    p.a.conn
        .post_send(send(
            1,
            SendOp::Send {
                solicited: false,
                invalidate: None,
            },
            vec![
                sge(0x10_0000, 40_000, a_src),
                sge(0x10_0000 + 100_000, 25_000, a_src),
            ],
            true,
        ))
        .unwrap();
    // An 80,000-byte Write at offset 5.
    p.a.conn
        .post_send(send(
            2,
            SendOp::Write {
                remote_addr: 0x4000_0005,
                rkey: b_wr,
            },
            vec![sge(0x10_0000 + 1_000, 80_000, a_src)],
            true,
        ))
        .unwrap();
    // A 50,000-byte Read from offset 3 of the responder's source.
    p.a.conn
        .post_send(send(
            3,
            SendOp::Read {
                remote_addr: 0x5000_0003,
                rkey: b_src,
            },
            vec![sge(0x20_0000 + 10, 50_000, a_sink)],
            true,
        ))
        .unwrap();
    // Unsignaled Send with Solicited Event.
    p.a.conn
        .post_send(send(
            4,
            SendOp::Send {
                solicited: true,
                invalidate: None,
            },
            vec![sge(0x10_0000 + 7, 10, a_src)],
            false,
        ))
        .unwrap();
    // Zero-length Send with Invalidate of the responder's STag.
    p.a.conn
        .post_send(send(
            5,
            SendOp::Send {
                solicited: false,
                invalidate: Some(b_inv),
            },
            vec![],
            true,
        ))
        .unwrap();
    p.run();
    // The responder answers with a Send.
    p.b.conn
        .post_send(send(
            9,
            SendOp::Send {
                solicited: false,
                invalidate: None,
            },
            vec![sge(0x7000_0000, 5, b_tx)],
            true,
        ))
        .unwrap();
    p.run();
    Outcome {
        a_wcs: p.a.wcs.clone(),
        b_wcs: p.b.wcs.clone(),
        b_write_region: p.b.mem(b_wr).to_vec(),
        a_read_sink: p.a.mem(a_sink).to_vec(),
        b_recv: p.b.mem(b_rbuf).to_vec(),
        a_recv: p.a.mem(a_rbuf).to_vec(),
        b_inv_valid: p.b.reg.info(b_inv).unwrap().valid,
    }
}

fn check_outcome(out: &Outcome) {
    let src = pattern(200_000, 1);
    let bsrc = pattern(60_000, 7);
    let ok = |wr_id, opcode, byte_len| (wr_id, WcStatus::Success, opcode, byte_len);
    let a: Vec<_> = out
        .a_wcs
        .iter()
        .map(|w| (w.wr_id, w.status, w.opcode, w.byte_len))
        .collect();
    assert_eq!(
        a,
        vec![
            ok(1, WcOpcode::Send, 65_000),
            ok(2, WcOpcode::RdmaWrite, 80_000),
            ok(3, WcOpcode::RdmaRead, 50_000),
            ok(5, WcOpcode::Send, 0),
            ok(200, WcOpcode::Recv, 5),
        ]
    );
    let b: Vec<_> = out
        .b_wcs
        .iter()
        .map(|w| {
            (
                w.wr_id,
                w.status,
                w.opcode,
                w.byte_len,
                w.solicited,
                w.invalidated.is_some(),
            )
        })
        .collect();
    assert_eq!(
        b,
        vec![
            (100, WcStatus::Success, WcOpcode::Recv, 65_000, false, false),
            (101, WcStatus::Success, WcOpcode::Recv, 10, true, false),
            (102, WcStatus::Success, WcOpcode::Recv, 0, false, true),
            (9, WcStatus::Success, WcOpcode::Send, 5, false, false),
        ]
    );
    // Send data, scattered over two SGEs, gathered from two pieces.
    assert_eq!(&out.b_recv[..40_000], &src[..40_000]);
    assert_eq!(&out.b_recv[40_000..65_000], &src[100_000..125_000]);
    assert!(out.b_recv[65_000..70_000].iter().all(|&x| x == 0));
    assert_eq!(&out.b_recv[70_000..70_010], &src[7..17]);
    // Write landed at offset 5 and nowhere else.
    assert!(out.b_write_region[..5].iter().all(|&x| x == 0));
    assert_eq!(&out.b_write_region[5..80_005], &src[1_000..81_000]);
    assert!(out.b_write_region[80_005..].iter().all(|&x| x == 0));
    // Read result.
    assert!(out.a_read_sink[..10].iter().all(|&x| x == 0));
    assert_eq!(&out.a_read_sink[10..50_010], &bsrc[3..50_003]);
    assert!(out.a_read_sink[50_010..].iter().all(|&x| x == 0));
    assert_eq!(&out.a_recv[..5], b"pong!");
    assert!(
        !out.b_inv_valid,
        "Send with Invalidate invalidated the STag"
    );
}

#[test]
fn every_operation_crc_off() {
    check_outcome(&scenario(Opts::default(), Cut::Whole));
}

#[test]
fn every_operation_crc_on_either_side() {
    for (crc_a, crc_b) in [(true, false), (false, true), (true, true)] {
        let o = Opts {
            crc_a,
            crc_b,
            ..Opts::default()
        };
        check_outcome(&scenario(o, Cut::Whole));
    }
}

#[test]
fn every_operation_with_markers() {
    for (markers_a, markers_b, crc) in [
        (true, false, true),
        (false, true, false),
        (true, true, true),
    ] {
        let o = Opts {
            markers_a,
            markers_b,
            crc_a: crc,
            ..Opts::default()
        };
        check_outcome(&scenario(o, Cut::Whole));
    }
}

#[test]
fn large_fpdus() {
    check_outcome(&scenario(
        Opts {
            mulpdu: 65_000,
            crc_a: true,
            ..Opts::default()
        },
        Cut::Whole,
    ));
}

/// The same scenarios with the byte stream cut at random points, 1 byte
/// to 64 KiB: results are identical to uncut delivery.
#[test]
fn random_cuts_give_identical_results() {
    let configs = [
        Opts::default(),
        Opts {
            crc_a: true,
            ..Opts::default()
        },
        Opts {
            crc_b: true,
            markers_a: true,
            markers_b: true,
            ..Opts::default()
        },
        Opts {
            mulpdu: 9000,
            crc_a: true,
            markers_b: true,
            ..Opts::default()
        },
    ];
    let mut seed = 0x9E37_79B9_7F4A_7C15u64;
    for o in configs {
        let reference = scenario(o, Cut::Whole);
        check_outcome(&reference);
        for max in [1usize, 3, 17, 512, 1500, 65_536] {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let got = scenario(
                o,
                Cut::Random {
                    rng: Rng(seed | 1),
                    max,
                },
            );
            assert_eq!(got, reference, "cut max {max} with {o:?}");
        }
    }
}

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
        p.b.conn
            .post_recv(RecvWr {
                wr_id: 1,
                sgl: sge(0, 3, r).into(),
            })
            .unwrap();
        p.a.conn
            .post_send(SendWr {
                wr_id: 1,
                op: SendOp::Send {
                    solicited: false,
                    invalidate: None,
                },
                sgl: sge(0, 3, s).into(),
                signaled: true,
            })
            .unwrap();
        p.run();
        assert_eq!(p.b.mem(r), b"abc");
    }
}

#[test]
fn responder_sends_nothing_before_first_fpdu() {
    let mut p = Pair::new(|_| {}, |_| {}, Cut::Whole);
    p.run();
    let s = p.b.region(0, b"early".to_vec(), Access::LOCAL_READ);
    p.b.conn
        .post_send(SendWr {
            wr_id: 7,
            op: SendOp::Send {
                solicited: false,
                invalidate: None,
            },
            sgl: sge(0, 5, s).into(),
            signaled: true,
        })
        .unwrap();
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
        .post_recv(RecvWr {
            wr_id: 1,
            sgl: sge(0x10, 5, r).into(),
        })
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

#[test]
fn close_flushes_everything_in_order() {
    let mut p = Pair::new(|_| {}, |_| {}, Cut::Whole);
    p.establish();
    let sink = p.a.region(0, vec![0; 8], Access::LOCAL_WRITE);
    for i in 0..3 {
        p.a.conn
            .post_recv(RecvWr {
                wr_id: 10 + i,
                sgl: sge(0, 8, sink).into(),
            })
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
    p.a.conn
        .post_recv(RecvWr {
            wr_id: 99,
            sgl: Sgl::new(),
        })
        .unwrap();
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
        .post_send(SendWr {
            wr_id: 1,
            op: SendOp::Send {
                solicited: false,
                invalidate: None,
            },
            sgl: Sge {
                addr: 0,
                length: 16,
                lkey: src,
            }
            .into(),
            signaled: true,
        })
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
            .post_recv(RecvWr {
                wr_id: 50,
                sgl: sge(0, 30_000, a_recv).into(),
            })
            .unwrap();
        p.b.conn
            .post_recv(RecvWr {
                wr_id: 60,
                sgl: sge(0x1_0000, 8, b_recv).into(),
            })
            .unwrap();
        // The initiator's first FPDU (an empty Send) opens the responder's side.
        p.a.conn
            .post_send(SendWr {
                wr_id: 1,
                op: SendOp::Send {
                    solicited: false,
                    invalidate: None,
                },
                sgl: Sgl::new(),
                signaled: true,
            })
            .unwrap();
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

/// Payloads of at most 64 bytes are copied into the segment next to their
/// header (header, payload, pad and trailer are one gather entry, CRC on or
/// off: `seal` fills the trailer in place); larger ones stay references to
/// registered memory. Either way the peer receives the same bytes, CRC
/// checked when on.
#[test]
fn small_payloads_travel_inline() {
    use warpsock_proto::conn::{TxPart, TxSegment};
    for crc in [false, true] {
        let mut p = Pair::new(|c| c.crc = crc, |c| c.crc = crc, Cut::Whole);
        p.establish();
        let src = p.a.region(0x10_0000, pattern(256, 3), Access::LOCAL_READ);
        let dst = p.b.region(0x2000, vec![0; 256], Access::LOCAL_WRITE);
        for (i, (len, inline)) in [
            (1u32, true),
            (7, true),
            (64, true),
            (65, false),
            (200, false),
        ]
        .into_iter()
        .enumerate()
        {
            p.b.conn
                .post_recv(RecvWr {
                    wr_id: i as u64,
                    sgl: sge(0x2000, 256, dst).into(),
                })
                .unwrap();
            p.a.conn
                .post_send(SendWr {
                    wr_id: i as u64,
                    op: SendOp::Send {
                        solicited: false,
                        invalidate: None,
                    },
                    sgl: sge(0x10_0000 + 3, len, src).into(),
                    signaled: true,
                })
                .unwrap();
            let mut seg = TxSegment::default();
            assert!(p.a.conn.next_segment(&p.a.reg, &mut seg));
            let parts = seg.parts();
            let memory = parts
                .iter()
                .filter(|x| matches!(x, TxPart::Memory(_)))
                .count();
            let what = format!("{len} B, CRC {crc}: {parts:?}");
            if inline {
                assert_eq!(memory, 0, "{what}");
                assert_eq!(parts.len(), 1, "{what}");
            } else {
                assert_eq!(memory, 1, "{what}");
            }
            assert!(seg.seal(&p.a.reg));
            let mut wire = Vec::new();
            assert!(seg.write_to(&p.a.reg, &mut wire));
            assert_eq!(p.b.conn.handle_input(&wire, &mut p.b.reg), wire.len());
            p.a.pump();
            p.b.pump();
            let wc = p.b.wcs.pop().expect("receive completed");
            assert_eq!((wc.status, wc.byte_len), (WcStatus::Success, len), "{what}");
            assert_eq!(
                &p.b.mem(dst)[..len as usize],
                &pattern(256, 3)[3..3 + len as usize],
                "{what}"
            );
        }
    }
}

/// Posts a receive of `recv_len` bytes at `dst_addr` on b and a signaled
/// Send of `len` bytes from `src_addr` on a, and returns the Send's
/// segment as it goes on the wire (sealed).
fn small_send_wire(
    p: &mut Pair,
    wr_id: u64,
    (src, src_addr, len): (u32, u64, u32),
    (dst, dst_addr, recv_len): (u32, u64, u32),
) -> Vec<u8> {
    use warpsock_proto::conn::TxSegment;
    p.b.conn
        .post_recv(RecvWr {
            wr_id,
            sgl: sge(dst_addr, recv_len, dst).into(),
        })
        .unwrap();
    p.a.conn
        .post_send(SendWr {
            wr_id,
            op: SendOp::Send {
                solicited: false,
                invalidate: None,
            },
            sgl: sge(src_addr, len, src).into(),
            signaled: true,
        })
        .unwrap();
    let mut seg = TxSegment::default();
    assert!(p.a.conn.next_segment(&p.a.reg, &mut seg));
    assert!(seg.seal(&p.a.reg));
    let mut wire = Vec::new();
    assert!(seg.write_to(&p.a.reg, &mut wire));
    wire
}

/// `rx_fpdu` takes a small FPDU in one pass when all of it is in hand —
/// exactly one FPDU, even with the next one behind it — and declines (0)
/// a cut one, which the step-by-step path then takes. Either way the
/// receive completes with the right bytes; and a corrupted CRC ends the
/// stream with the same Terminate by either path.
#[test]
fn whole_fpdus_are_taken_in_one_pass() {
    use warpsock_proto::wire::terminate::TermCode;
    for crc in [false, true] {
        let mut p = Pair::new(|c| c.crc = crc, |c| c.crc = crc, Cut::Whole);
        p.establish();
        let src = p.a.region(0x10_0000, pattern(256, 5), Access::LOCAL_READ);
        let dst = p.b.region(0x2000, vec![0; 256], Access::LOCAL_WRITE);
        // Two 40-byte Sends back to back on the wire.
        let mut wire = Vec::new();
        for i in 0..2u64 {
            wire.extend(small_send_wire(
                &mut p,
                i,
                (src, 0x10_0000 + 40 * i, 40),
                (dst, 0x2000 + 100 * i, 100),
            ));
        }
        let one = wire.len() / 2;
        let b = &mut p.b;
        // Cut short: declined, nothing consumed.
        assert_eq!(b.conn.rx_fpdu(&wire[..one - 1], &mut b.reg), 0, "crc {crc}");
        // Whole, with the next FPDU behind it: exactly the first.
        assert_eq!(b.conn.rx_fpdu(&wire, &mut b.reg), one, "crc {crc}");
        // The second one cut: the step-by-step path takes it in pieces.
        assert_eq!(b.conn.handle_input(&wire[one..one + 7], &mut b.reg), 7);
        assert_eq!(b.conn.rx_fpdu(&wire[one + 7..], &mut b.reg), 0);
        assert_eq!(b.conn.handle_input(&wire[one + 7..], &mut b.reg), one - 7);
        b.pump();
        let got: Vec<(u64, u32)> = b.wcs.iter().map(|w| (w.wr_id, w.byte_len)).collect();
        assert_eq!(got, [(0, 40), (1, 40)], "crc {crc}");
        assert!(b.wcs.iter().all(|w| w.status == WcStatus::Success));
        assert_eq!(&b.mem(dst)[..40], &pattern(256, 5)[..40]);
        assert_eq!(&b.mem(dst)[100..140], &pattern(256, 5)[40..80]);
    }
    // A bad CRC, whole (one pass) or byte by byte (step by step): the
    // same Terminate, and the receive is not completed.
    let mut terms = Vec::new();
    for bytewise in [false, true] {
        let mut p = Pair::new(|c| c.crc = true, |c| c.crc = true, Cut::Whole);
        p.establish();
        let src = p.a.region(0x10_0000, pattern(64, 9), Access::LOCAL_READ);
        let dst = p.b.region(0x2000, vec![0; 64], Access::LOCAL_WRITE);
        let mut wire = small_send_wire(&mut p, 1, (src, 0x10_0000, 20), (dst, 0x2000, 64));
        *wire.last_mut().unwrap() ^= 0x40;
        let b = &mut p.b;
        if bytewise {
            for k in 0..wire.len() {
                b.conn.handle_input(&wire[k..k + 1], &mut b.reg);
            }
        } else {
            assert_eq!(b.conn.rx_fpdu(&wire, &mut b.reg), wire.len());
        }
        b.pump();
        assert!(b.wcs.iter().all(|w| w.status != WcStatus::Success));
        let term = b
            .events
            .iter()
            .find_map(|e| match e {
                Event::Terminated {
                    code,
                    by_peer: false,
                } => Some(*code),
                _ => None,
            })
            .expect("a Terminate went out");
        terms.push(term);
    }
    assert_eq!(terms, [TermCode::MPA_CRC, TermCode::MPA_CRC]);
}

/// `rx_payload_len` gives the whole FPDU's payload while a Send is placed
/// into a scattered receive: the first range is the 8-byte head entry of
/// a 16 KiB payload, and an engine that sized its reads by the range (as
/// the socket driver once did) took the stream for one of small messages
/// and pulled the next FPDU's payload through its staging buffer.
#[test]
fn payload_length_is_the_fpdus_not_the_ranges() {
    use warpsock_proto::RxStep;
    // One FPDU for the whole Send, as the engine frames (64 KiB MULPDU).
    let mut p = Pair::new(|c| c.mulpdu = 65_000, |c| c.mulpdu = 65_000, Cut::Whole);
    p.establish();
    let len = 16 * 1024;
    let src = p.a.region(0x10_0000, pattern(len, 3), Access::LOCAL_READ);
    let head = p.b.region(0x2000, vec![0; 8], Access::LOCAL_WRITE);
    let body = p.b.region(0x8000, vec![0; len], Access::LOCAL_WRITE);
    p.b.conn
        .post_recv(RecvWr {
            wr_id: 1,
            sgl: [sge(0x2000, 8, head), sge(0x8000, len as u32 - 8, body)].into(),
        })
        .unwrap();
    p.a.conn
        .post_send(SendWr {
            wr_id: 1,
            op: SendOp::Send {
                solicited: false,
                invalidate: None,
            },
            sgl: sge(0x10_0000, len as u32, src).into(),
            signaled: true,
        })
        .unwrap();
    let mut wire = Vec::new();
    p.a.conn.poll_transmit(&p.a.reg, &mut wire, 1 << 20);
    let b = &mut p.b;
    let mut at = 0;
    let mut ranges = Vec::new();
    while at < wire.len() {
        match b.conn.rx_step() {
            RxStep::Bytes(_) => at += b.conn.rx_bytes(&wire[at..], &mut b.reg),
            RxStep::Place(r) => {
                ranges.push((r.len, b.conn.rx_payload_len()));
                let n = r.len as usize;
                let dst = b.reg.slice_mut(r.stag, r.offset, n).unwrap();
                dst.copy_from_slice(&wire[at..at + n]);
                let placed = dst.to_vec();
                b.conn.rx_placed(&placed);
                at += n;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(ranges, [(8, len), (len as u64 - 8, len)]);
    b.pump();
    assert_eq!(b.wcs.len(), 1);
    assert_eq!(b.wcs[0].status, WcStatus::Success);
    assert!(b.mem(head) == &pattern(len, 3)[..8]);
    assert!(b.mem(body)[..len - 8] == pattern(len, 3)[8..]);
}
