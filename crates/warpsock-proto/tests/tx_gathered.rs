//! `Connection::send_gathered`: a Send of any length framed at once, its
//! payload left in the caller's buffers, is — once the engine writes each
//! FPDU's head, payload pieces and trailer in order — byte for byte what a
//! posted unsignalled Send of the same bytes gives: the same split into
//! FPDUs, the same MSN sequence (interleaved with inline and posted
//! Sends), the same CRC; the peer takes every message whole. It is
//! refused, changing nothing, whenever anything is queued ahead of it,
//! MPA markers are on, or it would take more FPDUs than allowed.

mod util;

use util::{pattern, recv_wr, send_wr, sge, Cut, Pair, Twins};
use warpsock_proto::conn::{pieces_of, GatheredFpdu, TxSegment};
use warpsock_proto::wire::ddp;
use warpsock_proto::{Access, Config, SendWr};

/// The wire bytes of a gathered Send's FPDUs, as the engine writes them.
fn assembled(parts: &[&[u8]], frames: &[GatheredFpdu]) -> Vec<u8> {
    let mut out = Vec::new();
    for f in frames {
        out.extend_from_slice(f.head());
        pieces_of(parts, f.payload(), |b| out.extend_from_slice(b));
        out.extend_from_slice(f.trailer());
    }
    assert_eq!(
        out.len(),
        frames.iter().map(GatheredFpdu::len).sum::<usize>()
    );
    out
}

/// A posted unsignalled Send of `len` bytes at `addr` of `stag`: every
/// segment the core gives for it, sealed and written out.
fn posted(p: &mut Pair, addr: u64, len: u32, stag: u32) -> Vec<u8> {
    let wr = SendWr {
        signaled: false,
        ..send_wr(9, sge(addr, len, stag).into())
    };
    p.a.conn.post_send(wr).unwrap();
    let mut out = Vec::new();
    let mut seg = TxSegment::default();
    while p.a.conn.next_segment(&p.a.reg, &mut seg) {
        assert!(seg.seal(&p.a.reg));
        assert!(seg.write_to(&p.a.reg, &mut out));
        if !p.a.conn.has_pending_output() {
            break;
        }
    }
    out
}

/// A small `mulpdu`, so that a few hundred bytes take several FPDUs.
const MULPDU: usize = 120;

#[test]
fn a_gathered_send_is_the_posted_send_byte_for_byte() {
    for crc in [false, true] {
        let cfg = |c: &mut Config| {
            c.crc = crc;
            c.mulpdu = MULPDU;
        };
        // `x` sends gathered (every fourth posted, every fifth inline when
        // it fits), `y` posts everything.
        let Twins {
            mut x,
            mut y,
            data,
            xs,
            ys,
            dst,
        } = Twins::new(cfg);
        let room = x.a.conn.config().mulpdu - ddp::UNTAGGED_HDR_LEN;
        assert_eq!(room, MULPDU - ddp::UNTAGGED_HDR_LEN);
        // Every pad, one FPDU's room and around it, several FPDUs, a last
        // FPDU of one byte.
        let lens: Vec<usize> = (0..=9)
            .chain([room - 1, room, room + 1, 2 * room, 3 * room + 1, 1000, 2047])
            .collect();
        let what = format!("CRC {crc}");
        let (mut xb, mut yb) = (Vec::new(), Vec::new());
        let mut frames = Vec::new();
        let mut seg = TxSegment::default();
        let (mut gathered, mut multi) = (0, 0);
        for (i, &len) in lens.iter().enumerate() {
            x.b.conn
                .post_recv(recv_wr(i as u64, sge(0x8000, 4096, dst).into()))
                .unwrap();
            let at = 5 * i % 64;
            yb.extend(posted(&mut y, 0x1000 + at as u64, len as u32, ys));
            if i % 4 == 3 {
                xb.extend(posted(&mut x, 0x1000 + at as u64, len as u32, xs));
                continue;
            }
            // Three parts, cut anywhere (an empty one too).
            let (c1, c2) = (len / 3, len / 3 + len / 4);
            let parts = [
                &data[at..at + c1],
                &data[at + c1..at + c2],
                &data[at + c2..at + len],
            ];
            if i % 5 == 4 && len <= room {
                assert!(x.a.conn.send_inline(&parts, &mut seg), "{what}: {len} B");
                assert!(seg.seal(&x.a.reg));
                let mut got = Vec::new();
                assert!(seg.write_to(&x.a.reg, &mut got));
                xb.extend(got);
                continue;
            }
            frames.clear();
            assert!(
                x.a.conn.send_gathered(&parts, &mut frames, 64),
                "{what}: {len} B"
            );
            assert!(!x.a.conn.has_pending_output(), "{what}");
            assert_eq!(frames.len(), len.div_ceil(room).max(1), "{what}: {len} B");
            gathered += 1;
            multi += usize::from(frames.len() > 1);
            let got = assembled(&parts, &frames);
            assert_eq!(got, yb[xb.len()..], "{what}: gathered Send of {len} B");
            xb.extend(got);
        }
        assert!(multi >= 4, "{what}: {multi} multi-FPDU Sends");
        assert_eq!(xb, yb, "{what}");
        assert_eq!(x.a.conn.sq_outstanding(), 0, "{what}");
        assert_eq!(x.a.conn.tx_counts().gathered_sends, gathered, "{what}");
        // No completion (unsignalled), and the peer takes every message
        // whole, in order, CRC checked when on.
        x.unsignalled_sends_arrive(&xb, &lens, &what);
    }
}

/// Refused, changing nothing (no MSN taken, no count), while anything is
/// queued ahead, with markers on, or beyond the FPDU bound; taken again
/// once the queue is empty.
#[test]
fn a_gathered_send_is_refused_whenever_it_would_not_be_the_posted_one() {
    let cfg = |c: &mut Config| c.mulpdu = MULPDU;
    let mut p = Pair::new(cfg, cfg, Cut::Whole);
    let mut frames = Vec::new();
    let room = MULPDU - ddp::UNTAGGED_HDR_LEN;
    let bytes = pattern(3 * room, 3);
    // Before the FPDU phase.
    assert!(!p.a.conn.send_gathered(&[&bytes], &mut frames, 64));
    p.establish();
    // A message in progress (its first FPDU out, the rest not).
    let src = p.a.region(0x1000, pattern(3 * room, 4), Access::LOCAL_READ);
    p.a.conn
        .post_send(send_wr(1, sge(0x1000, 3 * room as u32, src).into()))
        .unwrap();
    let mut seg = TxSegment::default();
    assert!(p.a.conn.next_segment(&p.a.reg, &mut seg));
    assert!(!p.a.conn.send_gathered(&[&bytes], &mut frames, 64));
    while p.a.conn.next_segment(&p.a.reg, &mut seg) {}
    // More FPDUs than allowed.
    assert!(!p.a.conn.send_gathered(&[&bytes], &mut frames, 2));
    assert!(frames.is_empty());
    assert_eq!(p.a.conn.tx_counts().gathered_sends, 0);
    // Taken: three FPDUs, MSN 2 (the posted Send had 1; the refusals took
    // none), MO 0, room, 2 room, the last flagged.
    assert!(p.a.conn.send_gathered(&[&bytes], &mut frames, 3));
    assert_eq!(frames.len(), 3);
    for (k, f) in frames.iter().enumerate() {
        let h = f.head();
        assert_eq!(&h[12..16], &2u32.to_be_bytes(), "FPDU {k}: MSN");
        assert_eq!(
            &h[16..20],
            &((k * room) as u32).to_be_bytes(),
            "FPDU {k}: MO"
        );
        assert_eq!(h[2] & 0x40 != 0, k == 2, "FPDU {k}: the L bit");
        assert_eq!(f.payload(), k * room..(k + 1) * room);
    }
    // The next Send's FPDUs go onto the end of the list (the engine writes
    // a list of Sends in one `sendmsg`): MSN 3, its offsets its own; a
    // refusal leaves the list as it was.
    let taken = frames.clone();
    assert!(!p.a.conn.send_gathered(&[&bytes], &mut frames, 2));
    assert_eq!(frames, taken);
    assert!(p
        .a
        .conn
        .send_gathered(&[&bytes[..room + 1]], &mut frames, 2));
    assert_eq!(frames[..3], taken[..]);
    assert_eq!(frames.len(), 5);
    for (k, f) in frames[3..].iter().enumerate() {
        assert_eq!(&f.head()[12..16], &3u32.to_be_bytes(), "FPDU {k}: MSN");
        assert_eq!(f.payload(), k * room..(k * room + room).min(room + 1));
    }
    // Markers on: refused (a marker would fall inside the payload).
    let mcfg = |c: &mut Config| {
        c.mulpdu = MULPDU;
        c.markers = true;
    };
    let mut m = Pair::new(mcfg, mcfg, Cut::Whole);
    m.establish();
    assert!(!m.a.conn.send_gathered(&[&bytes], &mut frames, 64));
    assert!(m.a.conn.send_inline(&[&bytes[..8]], &mut seg));
}
