//! What the transmit path promises an engine that asks for segments: a
//! message of one FPDU is one `next_segment` call (the core says "nothing
//! more" with it through `has_pending_output`, and keeps that promise), and
//! a small FPDU built in one piece has exactly the bytes RFC 5044 framing
//! of its header and payload gives (length field, ULPDU, pad, CRC).

mod util;

use util::{pattern, recv_wr, send_wr, sge, Cut, Pair};
use warpsock_proto::conn::TxSegment;
use warpsock_proto::wire::ddp::{self, Opcode, Placement, ReadRequest, SegmentHeader};
use warpsock_proto::wire::fpdu;
use warpsock_proto::{Access, SendOp, SendWr, WcStatus};

/// The bytes of `seg` as they go on the wire (sealed first).
fn wire(p: &mut Pair, seg: &mut TxSegment) -> Vec<u8> {
    assert!(seg.seal(&p.a.reg));
    let mut out = Vec::new();
    assert!(seg.write_to(&p.a.reg, &mut out));
    out
}

/// An 8-byte Send is one segment, after which the core has nothing more,
/// and asking anyway gives nothing (counted as an empty ask); two Sends
/// posted together leave output pending after the first. With markers the
/// same holds (the small FPDU then takes the general path).
#[test]
fn a_one_fpdu_message_is_one_ask() {
    for (crc, markers) in [(false, false), (true, false), (false, true), (true, true)] {
        let mut p = Pair::new(
            |c| {
                c.crc = crc;
                c.markers = markers;
            },
            |c| {
                c.crc = crc;
                c.markers = markers;
            },
            Cut::Whole,
        );
        p.establish();
        let src = p.a.region(0x1000, pattern(64, 1), Access::LOCAL_READ);
        let dst = p.b.region(0x2000, vec![0; 64], Access::LOCAL_WRITE);
        for i in 0..3 {
            p.b.conn
                .post_recv(recv_wr(i, sge(0x2000, 64, dst).into()))
                .unwrap();
        }
        let what = format!("CRC {crc}, markers {markers}");
        let empty0 = p.a.conn.tx_counts().empty_asks;
        let mut seg = TxSegment::default();

        p.a.conn
            .post_send(send_wr(1, sge(0x1000, 8, src).into()))
            .unwrap();
        assert!(p.a.conn.has_pending_output(), "{what}");
        assert!(p.a.conn.next_segment(&p.a.reg, &mut seg), "{what}");
        assert!(!p.a.conn.has_pending_output(), "{what}");
        assert_eq!(p.a.conn.tx_counts().empty_asks, empty0, "{what}");
        let mut bytes = wire(&mut p, &mut seg);
        assert!(!p.a.conn.next_segment(&p.a.reg, &mut seg), "{what}");
        assert_eq!(p.a.conn.tx_counts().empty_asks, empty0 + 1, "{what}");

        for id in [2, 3] {
            p.a.conn
                .post_send(send_wr(id, sge(0x1000 + id, 8, src).into()))
                .unwrap();
        }
        assert!(p.a.conn.next_segment(&p.a.reg, &mut seg), "{what}");
        assert!(p.a.conn.has_pending_output(), "{what}");
        bytes.extend(wire(&mut p, &mut seg));
        assert!(p.a.conn.next_segment(&p.a.reg, &mut seg), "{what}");
        assert!(!p.a.conn.has_pending_output(), "{what}");
        bytes.extend(wire(&mut p, &mut seg));
        assert_eq!(p.a.conn.tx_counts().empty_asks, empty0 + 1, "{what}");

        // The peer takes all three, CRC checked when on.
        assert_eq!(p.b.conn.handle_input(&bytes, &mut p.b.reg), bytes.len());
        p.a.pump();
        p.b.pump();
        assert_eq!(p.b.wcs.len(), 3, "{what}: {:?}", p.b.wcs);
        assert!(
            p.b.wcs.iter().all(|w| w.status == WcStatus::Success),
            "{what}: {:?}",
            p.b.wcs
        );
        assert_eq!(&p.b.mem(dst)[..8], &pattern(64, 1)[3..11], "{what}");
    }
}

/// Small FPDUs (payload of at most 64 bytes, no markers) built in one
/// piece equal the framing of their header and payload byte for byte: a
/// Send of every payload length 0..=64 (every pad), gathered from two
/// entries, an RDMA Write and a Read Request, CRC on and off.
#[test]
fn small_fpdus_in_one_piece_are_framed_exactly() {
    for crc in [false, true] {
        let mut p = Pair::new(|c| c.crc = crc, |c| c.crc = crc, Cut::Whole);
        p.establish();
        let data = pattern(128, 9);
        let src = p.a.region(0x1000, data.clone(), Access::LOCAL_READ);
        let mut seg = TxSegment::default();
        for (msn, len) in (1u32..).zip(0u32..=64) {
            // Two gather entries: the first 3 bytes (or fewer), the rest.
            let first = len.min(3);
            let sgl = [
                sge(0x1000 + 5, first, src),
                sge(0x1000 + 40, len - first, src),
            ];
            let wr = SendWr {
                sgl: sgl.into_iter().collect(),
                ..send_wr(u64::from(msn), Default::default())
            };
            p.a.conn.post_send(wr).unwrap();
            assert!(p.a.conn.next_segment(&p.a.reg, &mut seg));
            assert_eq!(seg.parts().len(), 1, "{len} B: {:?}", seg.parts());
            let got = wire(&mut p, &mut seg);
            let hdr = SegmentHeader {
                opcode: Opcode::Send,
                last: true,
                placement: Placement::Untagged {
                    inv_stag: 0,
                    qn: ddp::queue::SEND,
                    msn,
                    mo: 0,
                },
            };
            let mut ulpdu = Vec::new();
            hdr.emit(&mut ulpdu);
            ulpdu.extend_from_slice(&data[5..5 + first as usize]);
            ulpdu.extend_from_slice(&data[40..40 + (len - first) as usize]);
            let mut want = Vec::new();
            fpdu::emit(&[&ulpdu], crc, &mut want);
            assert_eq!(got, want, "Send of {len} B, CRC {crc}");
        }

        let write = SendWr {
            op: SendOp::Write {
                remote_addr: 0xabc0,
                rkey: 0x77,
            },
            ..send_wr(100, sge(0x1000 + 1, 13, src).into())
        };
        p.a.conn.post_send(write).unwrap();
        assert!(p.a.conn.next_segment(&p.a.reg, &mut seg));
        let got = wire(&mut p, &mut seg);
        let mut ulpdu = Vec::new();
        SegmentHeader {
            opcode: Opcode::RdmaWrite,
            last: true,
            placement: Placement::Tagged {
                stag: 0x77,
                to: 0xabc0,
            },
        }
        .emit(&mut ulpdu);
        ulpdu.extend_from_slice(&data[1..14]);
        let mut want = Vec::new();
        fpdu::emit(&[&ulpdu], crc, &mut want);
        assert_eq!(got, want, "Write, CRC {crc}");

        let sink = p.a.region(0x9000, vec![0; 32], Access::LOCAL_WRITE);
        let read = SendWr {
            op: SendOp::Read {
                remote_addr: 0x5000,
                rkey: 0x55,
            },
            ..send_wr(101, sge(0x9000, 32, sink).into())
        };
        p.a.conn.post_send(read).unwrap();
        assert!(p.a.conn.next_segment(&p.a.reg, &mut seg));
        let got = wire(&mut p, &mut seg);
        let mut ulpdu = Vec::new();
        SegmentHeader {
            opcode: Opcode::RdmaReadRequest,
            last: true,
            placement: Placement::Untagged {
                inv_stag: 0,
                qn: ddp::queue::READ_REQUEST,
                msn: 1,
                mo: 0,
            },
        }
        .emit(&mut ulpdu);
        ulpdu.extend_from_slice(
            &ReadRequest {
                sink_stag: sink,
                sink_to: 0x9000,
                size: 32,
                src_stag: 0x55,
                src_to: 0x5000,
            }
            .to_bytes(),
        );
        let mut want = Vec::new();
        fpdu::emit(&[&ulpdu], crc, &mut want);
        assert_eq!(got, want, "Read Request, CRC {crc}");
    }
}
