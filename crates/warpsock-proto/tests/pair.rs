//! End-to-end scenarios between two in-memory connections: every
//! operation in both roles, CRC and markers on and off, and the same
//! scenarios with the byte stream cut at random points. The handshake is
//! in `handshake.rs`, closing and ordering rules in `lifecycle.rs`, the
//! receive fast paths in `rx_paths.rs`.

mod util;

use util::{pattern, recv_wr, sge, Cut, Pair, Rng};
use warpsock_proto::{Access, SendOp, SendWr, Sge, WcOpcode, WcStatus, WorkCompletion};

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
        .post_recv(recv_wr(
            100,
            [
                sge(0x1000, 30_000, b_rbuf),
                sge(0x1000 + 30_000, 40_000, b_rbuf),
            ]
            .into(),
        ))
        .unwrap();
    p.b.conn
        .post_recv(recv_wr(101, sge(0x1000 + 70_000, 1_000, b_rbuf).into()))
        .unwrap();
    p.b.conn
        .post_recv(recv_wr(102, sge(0x1000 + 71_000, 1_000, b_rbuf).into()))
        .unwrap();
    p.a.conn
        .post_recv(recv_wr(200, sge(0x30_0000, 64, a_rbuf).into()))
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
