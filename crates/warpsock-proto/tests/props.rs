//! Property tests: random sequences of posted operations, random FPDU
//! sizes, CRC and markers on or off, random stream cuts. Every request
//! completes exactly once, in order per queue, with the right byte count,
//! and the right bytes land in the right place (and nowhere else).

mod util;

use proptest::prelude::*;
use util::{pattern, recv_wr, Cut, Pair, Rng};
use warpsock_proto::{Access, SendOp, SendWr, Sge, WcOpcode, WcStatus, WorkQueue};

#[derive(Debug, Clone, Copy)]
enum Op {
    Send(u32),
    Write(u32, u32),
    Read(u32, u32),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0u32..20_000).prop_map(Op::Send),
        (0u32..20_000, 0u32..10_000).prop_map(|(l, o)| Op::Write(l, o)),
        (0u32..20_000, 0u32..10_000).prop_map(|(l, o)| Op::Read(l, o)),
    ]
}

const SRC: u64 = 0x1_0000;
const WREG: u64 = 0x100_0000;
const RREG: u64 = 0x200_0000;
const SINK: u64 = 0x300_0000;
const RECV: u64 = 0x400_0000;

proptest! {
    #![proptest_config(ProptestConfig { cases: 40, ..ProptestConfig::default() })]

    #[test]
    fn operations_complete_once_in_order_with_right_data(
        ops in proptest::collection::vec(op(), 1..12),
        mulpdu in prop_oneof![Just(64usize), Just(1442), Just(9000), Just(65_000)],
        crc in any::<bool>(),
        markers in any::<bool>(),
        cut_max in prop_oneof![Just(1usize), Just(13), Just(4096), Just(65_536)],
        seed in any::<u64>(),
        ord in 1u16..4,
    ) {
        let mut p = Pair::new(
            |c| { c.crc = crc; c.mulpdu = mulpdu; c.markers = markers; c.ord = ord; },
            |c| { c.mulpdu = mulpdu; c.ird = 2; },
            Cut::Random { rng: Rng(seed | 1), max: cut_max },
        );
        p.establish();
        let src_data = pattern(40_000, 5);
        let rsrc_data = pattern(40_000, 9);
        let src = p.a.region(SRC, src_data.clone(), Access::LOCAL_READ);
        let sink = p.a.region(SINK, vec![0; 20_000 * 12], Access::LOCAL_WRITE);
        let wreg = p.b.region(WREG, vec![0; 30_000], Access::REMOTE_WRITE);
        let rreg = p.b.region(RREG, rsrc_data.clone(), Access::REMOTE_READ);
        let recv = p.b.region(RECV, vec![0; 20_000 * 12], Access::LOCAL_WRITE);
        let sends = ops.iter().filter(|o| matches!(o, Op::Send(_))).count();
        for i in 0..sends {
            p.b.conn.post_recv(recv_wr(1000 + i as u64, Sge { addr: RECV + (i as u64) * 20_000, length: 20_000, lkey: recv }.into())).unwrap();
        }
        let mut expect_write = vec![0u8; 30_000];
        for (i, o) in ops.iter().enumerate() {
            let (op, sgl) = match *o {
                Op::Send(l) => (SendOp::Send { solicited: i % 2 == 0, invalidate: None },
                    vec![Sge { addr: SRC + i as u64, length: l, lkey: src }]),
                Op::Write(l, off) => {
                    expect_write[off as usize..(off + l) as usize]
                        .copy_from_slice(&src_data[i..i + l as usize]);
                    (SendOp::Write { remote_addr: WREG + u64::from(off), rkey: wreg },
                     vec![Sge { addr: SRC + i as u64, length: l, lkey: src }])
                }
                Op::Read(l, off) => (SendOp::Read { remote_addr: RREG + u64::from(off), rkey: rreg },
                    vec![Sge { addr: SINK + (i as u64) * 20_000, length: l, lkey: sink }]),
            };
            p.a.conn.post_send(SendWr { wr_id: i as u64, op, sgl: sgl.into(), signaled: true }).unwrap();
        }
        p.run();

        // Send queue: each request once, in posting order, right length.
        let sq: Vec<_> = p.a.wcs.iter().filter(|w| w.queue == WorkQueue::Send).collect();
        prop_assert_eq!(sq.len(), ops.len());
        for (i, (w, o)) in sq.iter().zip(&ops).enumerate() {
            prop_assert_eq!(w.wr_id, i as u64);
            prop_assert_eq!(w.status, WcStatus::Success);
            let (opc, len) = match *o {
                Op::Send(l) => (WcOpcode::Send, l),
                Op::Write(l, _) => (WcOpcode::RdmaWrite, l),
                Op::Read(l, _) => (WcOpcode::RdmaRead, l),
            };
            prop_assert_eq!((w.opcode, w.byte_len), (opc, len));
        }
        // Receive queue: one completion per Send, in order, right bytes.
        let rq: Vec<_> = p.b.wcs.iter().filter(|w| w.queue == WorkQueue::Recv).collect();
        prop_assert_eq!(rq.len(), sends);
        let mut k = 0;
        for (i, o) in ops.iter().enumerate() {
            match *o {
                Op::Send(l) => {
                    let w = rq[k];
                    prop_assert_eq!(w.wr_id, 1000 + k as u64);
                    prop_assert_eq!(w.byte_len, l);
                    prop_assert_eq!(w.solicited, i % 2 == 0);
                    let at = k * 20_000;
                    prop_assert_eq!(&p.b.mem(recv)[at..at + l as usize], &src_data[i..i + l as usize]);
                    prop_assert!(p.b.mem(recv)[at + l as usize..at + 20_000].iter().all(|&b| b == 0));
                    k += 1;
                }
                Op::Read(l, off) => {
                    let at = i * 20_000;
                    prop_assert_eq!(
                        &p.a.mem(sink)[at..at + l as usize],
                        &rsrc_data[off as usize..(off + l) as usize]
                    );
                    prop_assert!(p.a.mem(sink)[at + l as usize..at + 20_000].iter().all(|&b| b == 0));
                }
                Op::Write(..) => {}
            }
        }
        prop_assert_eq!(p.b.mem(wreg), &expect_write[..]);
        prop_assert!(p.b.wcs.iter().all(|w| w.queue == WorkQueue::Recv));
    }
}
