//! `Connection::send_inline`: a Send built as one FPDU at once, with no
//! send-queue entry, is byte for byte the FPDU a posted unsignalled Send of
//! the same bytes gives — whatever the length (every pad, small and large
//! builders), CRC and markers on or off, interleaved with posted Sends (one
//! MSN sequence) — and it is refused, changing nothing, whenever anything
//! is queued ahead of it or it would not fit one FPDU.

mod util;

use util::{pattern, recv_wr, send_wr, sge, Cut, Pair, Twins};
use warpsock_proto::conn::TxSegment;
use warpsock_proto::wire::ddp;
use warpsock_proto::{Access, Config, SendOp, SendWr};

/// The bytes of `seg` as they go on the wire (sealed first).
fn wire(p: &mut Pair, seg: &mut TxSegment) -> Vec<u8> {
    assert!(seg.seal(&p.a.reg));
    let mut out = Vec::new();
    assert!(seg.write_to(&p.a.reg, &mut out));
    out
}

/// A posted unsignalled Send of `len` bytes at `addr` of `stag`, as the
/// core's next segment.
fn posted(p: &mut Pair, addr: u64, len: u32, stag: u32) -> Vec<u8> {
    let wr = SendWr {
        signaled: false,
        ..send_wr(9, sge(addr, len, stag).into())
    };
    p.a.conn.post_send(wr).unwrap();
    let mut seg = TxSegment::default();
    assert!(p.a.conn.next_segment(&p.a.reg, &mut seg));
    assert!(!p.a.conn.has_pending_output());
    wire(p, &mut seg)
}

#[test]
fn an_inline_send_is_the_posted_send_byte_for_byte() {
    for (crc, markers) in [(false, false), (true, false), (false, true), (true, true)] {
        let cfg = |c: &mut Config| {
            c.crc = crc;
            c.markers = markers;
        };
        // `x` sends inline (and posts every fifth), `y` posts everything.
        let Twins {
            mut x,
            mut y,
            data,
            xs,
            ys,
            dst,
        } = Twins::new(cfg);
        let room = x.a.conn.config().mulpdu - ddp::UNTAGGED_HDR_LEN;
        let lens: Vec<usize> = (0..=70).chain([500, 511, 512, room - 1, room]).collect();
        let what = format!("CRC {crc}, markers {markers}");
        let inline0 = x.a.conn.tx_counts().inline_sends;
        let (mut xb, mut yb) = (Vec::new(), Vec::new());
        let mut seg = TxSegment::default();
        for (i, &len) in lens.iter().enumerate() {
            x.b.conn
                .post_recv(recv_wr(i as u64, sge(0x8000, 4096, dst).into()))
                .unwrap();
            let cut = len.min(5);
            let at = 3 * i % 64;
            yb.extend(posted(&mut y, 0x1000 + at as u64, len as u32, ys));
            if i % 5 == 4 {
                xb.extend(posted(&mut x, 0x1000 + at as u64, len as u32, xs));
                continue;
            }
            let parts = [&data[at..at + cut], &data[at + cut..at + len]];
            assert!(x.a.conn.send_inline(&parts, &mut seg), "{what}: {len} B");
            assert!(!x.a.conn.has_pending_output(), "{what}");
            let got = wire(&mut x, &mut seg);
            assert_eq!(got, yb[xb.len()..], "{what}: inline Send of {len} B");
            xb.extend(got);
        }
        assert_eq!(xb, yb, "{what}");
        assert_eq!(x.a.conn.sq_outstanding(), 0, "{what}");
        let inlined = lens.len() - lens.len() / 5;
        assert_eq!(
            x.a.conn.tx_counts().inline_sends - inline0,
            inlined as u64,
            "{what}"
        );
        // No completion for either kind (unsignalled), and the peer takes
        // every message in order, CRC checked when on.
        x.unsignalled_sends_arrive(&xb, &lens, &what);
    }
}

#[test]
fn an_inline_send_waits_behind_anything_queued() {
    let mut p = Pair::new(|_| {}, |_| {}, Cut::Whole);
    let mut seg = TxSegment::default();
    let bytes = [1u8; 8];
    // Before the FPDU phase: nothing to send it on.
    assert!(!p.a.conn.send_inline(&[&bytes], &mut seg));
    p.establish();
    let src = p.a.region(0x1000, pattern(64, 1), Access::LOCAL_READ);
    // A posted request not yet handed out is ahead of it.
    p.a.conn
        .post_send(send_wr(1, sge(0x1000, 8, src).into()))
        .unwrap();
    assert!(!p.a.conn.send_inline(&[&bytes], &mut seg));
    assert!(p.a.conn.next_segment(&p.a.reg, &mut seg));
    // Larger than one FPDU: refused, whatever else.
    let room = p.a.conn.config().mulpdu - ddp::UNTAGGED_HDR_LEN;
    let big = vec![0u8; room + 1];
    assert!(!p.a.conn.send_inline(&[&big], &mut seg));
    assert_eq!(p.a.conn.tx_counts().inline_sends, 0);
    // Nothing queued: taken, and the MSN follows the posted Send's.
    assert!(p.a.conn.send_inline(&[&bytes], &mut seg));
    assert_eq!(p.a.conn.tx_counts().inline_sends, 1);
    // A closed connection refuses it.
    p.a.conn.close();
    assert!(!p.a.conn.send_inline(&[&bytes], &mut seg));
}

/// The FPDU an inline Send builds in place (`TxState::small_fpdu`) against
/// bytes written out by hand from RFC 5044 §6.1, RFC 5041 §4.3 and RFC
/// 5040 §4.3 — as siw's `siw_tx_hdt` sends them (siw-compat.md: rping's
/// start message): length field, DDP control (version 1, L), RDMAP control
/// (version 1, Send), QN 0, MSN, MO 0, payload, pad to four, CRC field
/// (zero with CRC off). Every pad length, one buffer or two.
#[test]
fn an_inline_send_is_rfc_5044_byte_for_byte() {
    let (mut p, mut seg) = established();
    let data = pattern(64, 11);
    for (i, len) in [8usize, 0, 1, 2, 3, 5, 64].into_iter().enumerate() {
        let cut = len / 2;
        let parts = [&data[..cut], &data[cut..len]];
        assert!(p.a.conn.send_inline(&parts, &mut seg), "{len} B");
        let got = wire(&mut p, &mut seg);
        let ulpdu = 18 + len;
        let mut want = vec![0u8, ulpdu as u8, 0x41, 0x43, 0, 0, 0, 0, 0, 0, 0, 0];
        want.extend_from_slice(&(i as u32 + 1).to_be_bytes());
        want.extend_from_slice(&[0, 0, 0, 0]);
        want.extend_from_slice(&data[..len]);
        want.resize(want.len() + (4 - (2 + ulpdu) % 4) % 4 + 4, 0);
        assert_eq!(got, want, "inline Send of {len} B");
        assert_eq!(seg.len(), want.len());
    }
}

/// An established pair (CRC, markers off) and a segment to build into.
fn established() -> (Pair, TxSegment) {
    let mut p = Pair::new(|_| {}, |_| {}, Cut::Whole);
    p.establish();
    (p, TxSegment::default())
}

/// Each condition of "nothing queued ahead" on its own (review of
/// `a2943e8`: dropping any of them failed no test before).
#[test]
fn an_inline_send_waits_for_a_message_in_progress() {
    let (mut p, mut seg) = established();
    let bytes = [2u8; 8];
    let room = p.a.conn.config().mulpdu - ddp::UNTAGGED_HDR_LEN;
    let len = 3 * room as u32;
    let src =
        p.a.region(0x1000, pattern(len as usize, 3), Access::LOCAL_READ);
    p.a.conn
        .post_send(send_wr(1, sge(0x1000, len, src).into()))
        .unwrap();
    // Its first FPDU is out, the rest is not: the message is in progress.
    assert!(p.a.conn.next_segment(&p.a.reg, &mut seg));
    assert!(!p.a.conn.send_inline(&[&bytes], &mut seg));
    while p.a.conn.next_segment(&p.a.reg, &mut seg) {}
    assert!(p.a.conn.send_inline(&[&bytes], &mut seg));
}

#[test]
fn an_inline_send_waits_for_a_read_response_owed() {
    let (mut p, mut seg) = established();
    let bytes = [4u8; 8];
    // The initiator reads from the responder, which owes the response.
    let src = p.b.region(0x1000, pattern(64, 5), Access::REMOTE_READ);
    let sink = p.a.region(0x2000, vec![0; 64], Access::LOCAL_WRITE);
    p.a.conn
        .post_send(SendWr {
            wr_id: 7,
            op: SendOp::Read {
                remote_addr: 0x1000,
                rkey: src,
            },
            sgl: sge(0x2000, 64, sink).into(),
            signaled: true,
        })
        .unwrap();
    // One round: the request reaches b, which has not answered yet (and
    // has seen the initiator's first FPDU: only the response is ahead).
    p.step();
    assert!(p.b.conn.has_pending_output(), "b owes the Read Response");
    assert!(!p.b.conn.send_inline(&[&bytes], &mut seg));
    p.run();
    assert_eq!(p.a.mem(sink), &pattern(64, 5)[..]);
    assert!(p.b.conn.send_inline(&[&bytes], &mut seg));
}

/// RFC 5044 §7.1.2 (siw): the responder sends nothing before the
/// initiator's first FPDU; an inline send must not either.
#[test]
fn the_responder_sends_inline_only_after_the_first_fpdu() {
    let (mut p, mut seg) = established();
    let bytes = [6u8; 8];
    assert!(!p.b.conn.send_inline(&[&bytes], &mut seg));
    let sink = p.b.region(0x3000, vec![0; 8], Access::LOCAL_WRITE);
    p.b.conn
        .post_recv(recv_wr(1, sge(0x3000, 8, sink).into()))
        .unwrap();
    assert!(p.a.conn.send_inline(&[&bytes], &mut seg));
    let out = wire(&mut p, &mut seg);
    assert_eq!(p.b.conn.handle_input(&out, &mut p.b.reg), out.len());
    p.b.pump();
    assert_eq!(p.b.mem(sink), &bytes[..]);
    assert!(p.b.conn.send_inline(&[&bytes], &mut seg));
}

/// Peer-to-peer mode (RFC 6581): the initiator's RTR goes first.
#[test]
fn an_inline_send_waits_for_the_rtr() {
    let offer = warpsock_proto::RtrOffer {
        write: true,
        read: false,
    };
    let mut p = Pair::new(|c| c.p2p = Some(offer), |_| {}, Cut::Whole);
    let mut seg = TxSegment::default();
    let bytes = [8u8; 8];
    for _ in 0..20 {
        p.step();
        if p.a.established() {
            break;
        }
    }
    // Established, its RTR not yet sent: refused.
    assert!(p.a.established() && p.a.conn.has_pending_output());
    assert!(!p.a.conn.send_inline(&[&bytes], &mut seg));
    p.run();
    assert!(p.a.conn.send_inline(&[&bytes], &mut seg));
}

/// The length bound (`TxState::inline_limit`, the test kept in one word):
/// one FPDU's room exactly is taken, a byte more is refused, in one part
/// or split, and a refused call changes nothing (the next Send's MSN).
#[test]
fn an_inline_send_takes_one_fpdus_room_and_not_a_byte_more() {
    let (mut p, mut seg) = established();
    let room = p.a.conn.config().mulpdu - ddp::UNTAGGED_HDR_LEN;
    let data = pattern(room + 1, 13);
    for parts in [
        [&data[..room + 1], &data[..0]],
        [&data[..room / 2], &data[room / 2..]],
    ] {
        assert!(!p.a.conn.send_inline(&parts, &mut seg), "a byte over");
    }
    assert_eq!(p.a.conn.tx_counts().inline_sends, 0);
    assert!(p
        .a
        .conn
        .send_inline(&[&data[..room / 2], &data[room / 2..room]], &mut seg));
    let got = wire(&mut p, &mut seg);
    assert_eq!(u16::from_be_bytes([got[0], got[1]]) as usize, room + 18);
    // MSN 1: the refused calls took none.
    assert_eq!(&got[12..16], &1u32.to_be_bytes());
    assert_eq!(&got[20..20 + room], &data[..room]);
}

/// The initiator may send inline as soon as the MPA Reply is taken in
/// (`enter_fpdu` opens the FPDU phase), before any other transmit call.
#[test]
fn the_initiator_sends_inline_as_soon_as_established() {
    let mut p = Pair::new(|_| {}, |_| {}, Cut::Whole);
    let mut seg = TxSegment::default();
    for _ in 0..20 {
        if p.a.established() {
            break;
        }
        assert!(!p.a.conn.send_inline(&[&[1u8; 8]], &mut seg));
        p.step();
    }
    assert!(p.a.established());
    assert!(p.a.conn.send_inline(&[&[1u8; 8]], &mut seg));
}
