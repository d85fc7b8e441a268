//! Transmit scheduling between the peer's Read Responses and our own send
//! queue (siw `siw_activate_tx`): responses go first, but while the send
//! queue has a message ready they alternate with it, so a Read Request of
//! ours never waits behind the peer's whole Read window.

mod util;

use warpsock_proto::wire::ddp::Opcode;
use warpsock_proto::{Access, Config, SendOp, SendWr, TxSegment, WcOpcode, WcStatus};

use util::{pattern, sge, Cut, Pair};

/// Bytes of each Read.
const LEN: usize = 64 << 10;
/// Reads the initiator has outstanding at the responder.
const READS: usize = 4;

fn read(wr_id: u64, remote_addr: u64, rkey: u32, sink: u64, lkey: u32) -> SendWr {
    SendWr {
        wr_id,
        op: SendOp::Read { remote_addr, rkey },
        sgl: sge(sink, LEN as u32, lkey).into(),
        signaled: true,
    }
}

/// Side `b` holds `READS` of `a`'s Read Requests when it posts a Read of
/// its own. Before its request, `b` may send one Read Response (one
/// message, `LEN` payload bytes), not all of them; every Read of both
/// sides then completes with the right bytes.
#[test]
fn own_read_request_waits_behind_one_read_response_at_most() {
    // Deep enough read queues both ways for all of these Reads.
    let deep = |c: &mut Config| {
        c.ird = 8;
        c.ord = 8;
    };
    let mut p = Pair::new(deep, deep, Cut::Whole);
    p.establish();
    let a_src = p.a.region(0x10_0000, pattern(LEN, 3), Access::REMOTE_READ);
    let a_sink =
        p.a.region(0x20_0000, vec![0; READS * LEN], Access::LOCAL_WRITE);
    let b_src = p.b.region(0x30_0000, pattern(LEN, 9), Access::REMOTE_READ);
    let b_sink = p.b.region(0x40_0000, vec![0; LEN], Access::LOCAL_WRITE);
    for i in 0..READS {
        let sink = 0x20_0000 + (i * LEN) as u64;
        p.a.conn
            .post_send(read(i as u64, 0x30_0000, b_src, sink, a_sink))
            .unwrap();
    }
    // `a`'s requests reach `b` before `b` transmits anything.
    let mut out = Vec::new();
    p.a.conn.poll_transmit(&p.a.reg, &mut out, 1 << 20);
    assert_eq!(p.b.conn.handle_input(&out, &mut p.b.reg), out.len());
    p.b.conn
        .post_send(read(100, 0x10_0000, a_src, 0x40_0000, b_sink))
        .unwrap();

    // `b`'s segments up to its Read Request, delivered to `a` as they go.
    let mut seg = TxSegment::default();
    let mut response_bytes = 0;
    loop {
        assert!(
            p.b.conn.next_segment(&p.b.reg, &mut seg),
            "b ran out of segments before its Read Request"
        );
        assert!(seg.seal(&p.b.reg));
        let mut bytes = Vec::new();
        assert!(seg.write_to(&p.b.reg, &mut bytes));
        assert_eq!(p.a.conn.handle_input(&bytes, &mut p.a.reg), bytes.len());
        match seg.opcode() {
            Some(Opcode::RdmaReadRequest) => break,
            Some(Opcode::RdmaReadResponse) => response_bytes += bytes.len(),
            other => panic!("unexpected segment {other:?}"),
        }
    }
    // One response's payload plus its framing (a few FPDUs' headers), far
    // from the READS responses the old order (every response first) sent.
    assert!(
        (LEN..LEN + LEN / 8).contains(&response_bytes),
        "{response_bytes} bytes of Read Responses went out before b's Read Request"
    );
    // The schedule counts what it made the request wait for (what the
    // engine reports per queue pair, `Qp::io_stats`).
    let c = p.b.conn.tx_counts();
    assert_eq!(
        (c.responses_ahead_of_read, c.response_bytes_ahead_of_read),
        (1, LEN as u64),
        "{c:?}"
    );
    assert_eq!(p.a.conn.tx_counts().responses_ahead_of_read, 0);

    p.run();
    let done = |wcs: &[warpsock_proto::WorkCompletion]| {
        wcs.iter()
            .filter(|w| w.opcode == WcOpcode::RdmaRead && w.status == WcStatus::Success)
            .count()
    };
    assert_eq!(done(&p.a.wcs), READS, "a: {:?}", p.a.wcs);
    assert_eq!(done(&p.b.wcs), 1, "b: {:?}", p.b.wcs);
    for i in 0..READS {
        assert!(p.a.mem(a_sink)[i * LEN..(i + 1) * LEN] == pattern(LEN, 9)[..]);
    }
    assert!(p.b.mem(b_sink) == &pattern(LEN, 3)[..]);
}
