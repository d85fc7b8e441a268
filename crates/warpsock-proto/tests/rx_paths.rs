//! The transmit and receive fast paths between two in-memory connections:
//! small payloads travel inline with their header, whole FPDUs are taken in
//! one pass (and cut ones step by step, with the same results), and the
//! payload length the engine sizes its reads by is the FPDU's.

mod util;

use util::{pattern, recv_wr, send_wr, sge, Cut, Pair};
use warpsock_proto::{Access, Event, RecvWr, SendOp, SendWr, WcStatus};

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
                .post_recv(recv_wr(i as u64, sge(0x2000, 256, dst).into()))
                .unwrap();
            p.a.conn
                .post_send(send_wr(i as u64, sge(0x10_0000 + 3, len, src).into()))
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

/// Feeds `wire` to `b` step by step, placing payload where
/// [`RxStep::Place`] says (as an engine's `readv` would), and calls
/// `at_place` before each placement.
fn feed_stepped(
    b: &mut util::Side,
    wire: &[u8],
    mut at_place: impl FnMut(&warpsock_proto::Connection, warpsock_proto::Range),
) {
    use warpsock_proto::RxStep;
    let mut at = 0;
    while at < wire.len() {
        match b.conn.rx_step() {
            RxStep::Bytes(_) => at += b.conn.rx_bytes(&wire[at..], &mut b.reg),
            RxStep::Place(r) => {
                at_place(&b.conn, r);
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
}

/// `rx_payload_len` gives the whole FPDU's payload while a Send is placed
/// into a scattered receive: the first range is the 8-byte head entry of
/// a 16 KiB payload, and an engine that sized its reads by the range (as
/// the socket driver once did) took the stream for one of small messages
/// and pulled the next FPDU's payload through its staging buffer.
#[test]
fn payload_length_is_the_fpdus_not_the_ranges() {
    // One FPDU for the whole Send, as the engine frames (64 KiB MULPDU).
    let mut p = Pair::new(|c| c.mulpdu = 65_000, |c| c.mulpdu = 65_000, Cut::Whole);
    p.establish();
    let len = 16 * 1024;
    let src = p.a.region(0x10_0000, pattern(len, 3), Access::LOCAL_READ);
    let head = p.b.region(0x2000, vec![0; 8], Access::LOCAL_WRITE);
    let body = p.b.region(0x8000, vec![0; len], Access::LOCAL_WRITE);
    p.b.conn
        .post_recv(recv_wr(
            1,
            [sge(0x2000, 8, head), sge(0x8000, len as u32 - 8, body)].into(),
        ))
        .unwrap();
    p.a.conn
        .post_send(send_wr(1, sge(0x10_0000, len as u32, src).into()))
        .unwrap();
    let mut wire = Vec::new();
    p.a.conn.poll_transmit(&p.a.reg, &mut wire, 1 << 20);
    let b = &mut p.b;
    let mut ranges = Vec::new();
    feed_stepped(b, &wire, |conn, r| {
        ranges.push((r.len, conn.rx_payload_len()));
    });
    assert_eq!(ranges, [(8, len), (len as u64 - 8, len)]);
    b.pump();
    assert_eq!(b.wcs.len(), 1);
    assert_eq!(b.wcs[0].status, WcStatus::Success);
    assert!(b.mem(head) == &pattern(len, 3)[..8]);
    assert!(b.mem(body)[..len - 8] == pattern(len, 3)[8..]);
}

/// `rx_payload_start` says, once per FPDU (at its first placement step
/// only), whether the FPDU continues a message: a Send of three FPDUs
/// gives `false`, then `true` twice, and nothing at a second step of the
/// same FPDU (a receive of two scatter entries); an RDMA Write of three
/// the same. `rx_whole_fpdu` says it, with the payload length, of FPDUs
/// taken whole by `rx_fpdu`: a Send's and a Write's first FPDU began a
/// message, the others did not. An engine sizes its reads by them: a
/// large message's short last FPDU does not make the stream one of small
/// messages.
#[test]
fn payload_start_tells_a_message_s_first_fpdu_from_the_rest() {
    let mulpdu = 4096;
    let mut p = Pair::new(|c| c.mulpdu = mulpdu, |c| c.mulpdu = mulpdu, Cut::Whole);
    p.establish();
    // Two full FPDUs (4,096-byte ULPDUs, 18-byte headers) and a short one.
    let len = 2 * (4096 - 18) + 100;
    let src = p.a.region(0x10_0000, pattern(len, 5), Access::LOCAL_READ);
    let head = p.b.region(0x2000, vec![0; 8], Access::LOCAL_WRITE);
    let body = p.b.region(0x8000, vec![0; 2 * len], Access::LOCAL_WRITE);
    let sink = p.b.region(
        0x4_0000,
        vec![0; len],
        Access::LOCAL_WRITE | Access::REMOTE_WRITE,
    );
    p.b.conn
        .post_recv(recv_wr(
            1,
            [sge(0x2000, 8, head), sge(0x8000, len as u32 - 8, body)].into(),
        ))
        .unwrap();
    p.b.conn
        .post_recv(recv_wr(
            2,
            sge(0x8000 + len as u64, len as u32, body).into(),
        ))
        .unwrap();
    let send = |p: &mut Pair, wr_id: u64| {
        p.a.conn
            .post_send(send_wr(wr_id, sge(0x10_0000, len as u32, src).into()))
            .unwrap();
        let mut wire = Vec::new();
        p.a.conn.poll_transmit(&p.a.reg, &mut wire, 1 << 20);
        wire
    };
    let write = |p: &mut Pair, wr_id: u64| {
        p.a.conn
            .post_send(SendWr {
                wr_id,
                op: SendOp::Write {
                    remote_addr: 0x4_0000,
                    rkey: sink,
                },
                sgl: sge(0x10_0000, len as u32, src).into(),
                signaled: true,
            })
            .unwrap();
        let mut wire = Vec::new();
        p.a.conn.poll_transmit(&p.a.reg, &mut wire, 1 << 20);
        wire
    };
    // Step by step: `rx_payload_start` at each placement.
    let stepped = |b: &mut util::Side, wire: &[u8]| {
        let mut starts = Vec::new();
        feed_stepped(b, wire, |conn, _| starts.push(conn.rx_payload_start()));
        starts
    };
    // Whole: `rx_whole_fpdu` after each `rx_fpdu`.
    let whole = |b: &mut util::Side, wire: &[u8]| {
        let mut at = 0;
        let mut seen = Vec::new();
        while at < wire.len() {
            let n = b.conn.rx_fpdu(&wire[at..], &mut b.reg);
            assert!(n > 0, "an FPDU taken whole at {at}");
            seen.push(b.conn.rx_whole_fpdu(&wire[at..]).unwrap());
            at += n;
        }
        seen
    };
    assert_eq!(p.b.conn.rx_payload_start(), None, "before a header");
    let wire = send(&mut p, 1);
    let starts = stepped(&mut p.b, &wire);
    assert_eq!(starts, [Some(false), None, Some(true), Some(true)]);
    let wire = write(&mut p, 2);
    assert_eq!(
        stepped(&mut p.b, &wire),
        [Some(false), Some(true), Some(true)]
    );
    let full = 4096 - 18;
    let wire = send(&mut p, 3);
    assert_eq!(
        whole(&mut p.b, &wire),
        [(full, true), (full, false), (100, false)]
    );
    let wire = write(&mut p, 4);
    let full_tagged = 4096 - 14;
    let last_tagged = len - 2 * full_tagged;
    assert_eq!(
        whole(&mut p.b, &wire),
        [
            (full_tagged, true),
            (full_tagged, false),
            (last_tagged, false)
        ]
    );
    assert_eq!(p.b.conn.rx_whole_fpdu(&wire[..3]), None, "too short");
    p.b.pump();
    assert_eq!(p.b.wcs.len(), 2);
    assert!(p.b.wcs.iter().all(|w| w.status == WcStatus::Success));
    assert!(p.b.mem(sink) == &pattern(len, 5)[..]);
}

/// `retarget_recvs` changes the buffers of posted receives no Send has
/// started into (the next Send lands in the new ones) and offers none for
/// the receive a Send is being placed into (it completes where it began).
#[test]
fn retargeted_receives_take_the_next_send_and_a_started_one_stays() {
    let mut p = Pair::new(|_| {}, |_| {}, Cut::Whole);
    p.establish();
    let src = p.a.region(0x10_0000, pattern(4096, 7), Access::LOCAL_READ);
    let dst = p.b.region(0x2000, vec![0; 4096], Access::LOCAL_WRITE);
    let alt = p.b.region(0x9000, vec![0; 4096], Access::LOCAL_WRITE);
    let wire = small_send_wire(&mut p, 1, (src, 0x10_0000, 1000), (dst, 0x2000, 1024));
    p.b.conn
        .post_recv(RecvWr {
            wr_id: 2,
            sgl: sge(0x2400, 1024, dst).into(),
        })
        .unwrap();
    // Half of the first Send arrives: its receive has started.
    let half = wire.len() / 2;
    let mut off = 0;
    while off < half {
        let k = p.b.conn.handle_input(&wire[off..half], &mut p.b.reg);
        if k == 0 {
            break;
        }
        off += k;
    }
    assert!(off > 0, "the Send's header was taken");
    let mut seen = Vec::new();
    p.b.conn.retarget_recvs(|id, sgl| {
        seen.push((id, sgl.is_some()));
        if let Some(s) = sgl {
            *s = sge(0x9000, 1024, alt).into();
        }
        true
    });
    assert_eq!(seen, [(1, false), (2, true)]);
    while off < wire.len() {
        let k = p.b.conn.handle_input(&wire[off..], &mut p.b.reg);
        assert!(k > 0);
        off += k;
    }
    p.a.pump();
    p.b.pump();
    let wc = p.b.wcs.pop().expect("first receive completed");
    assert_eq!((wc.wr_id, wc.byte_len), (1, 1000));
    assert_eq!(&p.b.mem(dst)[..1000], &pattern(4096, 7)[..1000]);
    // The next Send goes where receive 2 now points.
    let wire = small_send_wire(&mut p, 3, (src, 0x10_0100, 500), (dst, 0x2800, 1024));
    assert_eq!(p.b.conn.handle_input(&wire, &mut p.b.reg), wire.len());
    p.a.pump();
    p.b.pump();
    let wc = p.b.wcs.pop().expect("second receive completed");
    assert_eq!((wc.wr_id, wc.byte_len), (2, 500));
    assert_eq!(&p.b.mem(alt)[..500], &pattern(4096, 7)[0x100..0x100 + 500]);
    assert!(p.b.mem(dst)[0x400..0x800].iter().all(|&x| x == 0));
}

/// `rx_wants_bytes` (an engine's question before a blocking read that can
/// only take framing) is `rx_step` being `Bytes`, at every byte of the
/// stream: the MPA exchange, headers, payload placed from 1 byte to several
/// FPDUs, pad and CRC, markers inside payload, and the discarding after a
/// CRC error. Fed one byte at a time, CRC and markers on and off.
#[test]
fn rx_wants_bytes_is_rx_step_asking_for_bytes_at_every_byte() {
    use warpsock_proto::RxStep;
    fn same(side: &util::Side, at: &str) {
        let step = side.conn.rx_step();
        assert_eq!(
            side.conn.rx_wants_bytes(),
            matches!(step, RxStep::Bytes(_)),
            "{at}: {step:?}"
        );
    }
    for (crc, markers) in [(false, false), (true, false), (false, true), (true, true)] {
        let cfg = |c: &mut warpsock_proto::Config| {
            c.crc = crc;
            c.markers = markers;
        };
        let mut p = Pair::new(cfg, cfg, Cut::Whole);
        same(&p.a, "before the MPA exchange");
        same(&p.b, "before the MPA exchange");
        p.establish();
        let src =
            p.a.region(0x10_0000, pattern(40_000, 5), Access::LOCAL_READ);
        let dst = p.b.region(0x2000, vec![0; 40_000], Access::LOCAL_WRITE);
        for (i, len) in [0u32, 1, 8, 64, 65, 1500, 40_000].into_iter().enumerate() {
            p.b.conn
                .post_recv(recv_wr(i as u64, sge(0x2000, 40_000, dst).into()))
                .unwrap();
            p.a.conn
                .post_send(send_wr(i as u64, sge(0x10_0000, len, src).into()))
                .unwrap();
        }
        let mut out = Vec::new();
        p.a.conn.poll_transmit(&p.a.reg, &mut out, 1 << 20);
        // A CRC error in the last FPDU's trailer (with CRC on): the rest
        // of the stream is discarded.
        if crc {
            let last = out.len() - 1;
            out[last] ^= 0x40;
        }
        for (k, byte) in out.iter().enumerate() {
            let at = format!("CRC {crc}, markers {markers}, byte {k}");
            same(&p.b, &at);
            assert_eq!(p.b.conn.handle_input(&[*byte], &mut p.b.reg), 1, "{at}");
        }
        same(&p.b, "at the end");
        if crc {
            assert!(!p.b.conn.rx_wants_bytes(), "reading on after a CRC error");
        }
    }
}
