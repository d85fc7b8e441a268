//! Planned reads (`rx_plan` / `rx_planned`): several FPDUs of one message
//! read over one scatter list, checked by the ordinary receive path. Each
//! stream is fed twice — as a socket driver with planned reads would (cut
//! into reads of varied sizes, headers split across reads) and through
//! `handle_input` in one piece — and the two receivers must end the same:
//! the same completions, the same Terminates, the same bytes delivered;
//! and a wrong guess may leave bytes only inside the receive or Read sink
//! the message was allowed to fill.

mod util;

use util::{pattern, recv_wr, send_wr, sge, Cut, Pair, Rng, Side};
use warpsock_proto::wire::terminate::TermCode;
use warpsock_proto::{Access, Event, RxPiece, RxStep, SendOp, SendWr, Stag, WcStatus};

/// A byte outside every receive and sink: must never change.
const SENTINEL: u8 = 0xa5;

/// Lays `bytes` over `plan` as one `readv` would; returns how many fit.
fn scatter(b: &mut Side, plan: &[RxPiece], bytes: &[u8], stage: &mut Vec<u8>) -> usize {
    stage.clear();
    stage.resize(RxPiece::staged(plan), 0);
    let (mut at, mut soff) = (0, 0);
    for p in plan {
        let left = bytes.len() - at;
        match *p {
            RxPiece::Place(r) => {
                let k = (r.len as usize).min(left);
                let dst = b.reg.slice_mut(r.stag, r.offset, k).expect("planned range");
                dst.copy_from_slice(&bytes[at..at + k]);
                at += k;
            }
            RxPiece::Stage(n) => {
                let k = n.min(left);
                stage[soff..soff + k].copy_from_slice(&bytes[at..at + k]);
                soff += n;
                at += k;
            }
        }
    }
    at
}

#[derive(Debug, Default, PartialEq, Eq)]
struct Reads {
    /// Reads in all.
    reads: usize,
    /// Planned reads, and those that did not follow their plan.
    planned: usize,
    missed: usize,
}

/// Feeds `wire` to `b` as the engine's driver does, each read at most
/// `size()` bytes: framing read alone, payload placed where `rx_step`
/// says, and where the core plans, one read over the plan.
fn feed_planned(b: &mut Side, wire: &[u8], mut size: impl FnMut() -> usize) -> Reads {
    let mut plan = Vec::new();
    let mut stage = Vec::new();
    let mut r = Reads::default();
    let mut at = 0;
    while at < wire.len() {
        let lim = size().clamp(1, wire.len() - at);
        let chunk = &wire[at..at + lim];
        r.reads += 1;
        match b.conn.rx_step() {
            RxStep::Place(p) if b.conn.rx_plan(1 << 20, 64, &mut plan) => {
                assert_eq!(
                    plan[0],
                    RxPiece::Place(p),
                    "a plan starts where the step is"
                );
                let n = scatter(b, &plan, chunk, &mut stage);
                r.planned += 1;
                if !b.conn.rx_planned(&plan, n, &stage, &mut b.reg) {
                    r.missed += 1;
                }
                at += n;
            }
            RxStep::Place(p) => {
                let k = (p.len as usize).min(lim);
                let dst = b.reg.slice_mut(p.stag, p.offset, k).unwrap();
                dst.copy_from_slice(&chunk[..k]);
                let placed = dst.to_vec();
                b.conn.rx_placed(&placed);
                at += k;
            }
            RxStep::Bytes(_) => {
                let k = b.conn.rx_bytes(chunk, &mut b.reg);
                assert!(k > 0);
                at += k;
            }
            RxStep::Closed => at = wire.len(),
            RxStep::Blocked => panic!("blocked in full operation"),
        }
    }
    b.pump();
    r
}

/// What a receiver ended with.
#[derive(Debug, PartialEq, Eq)]
struct Outcome {
    wcs: Vec<(u64, WcStatus, u32)>,
    terminates: Vec<(TermCode, bool)>,
}

fn outcome(b: &Side) -> Outcome {
    Outcome {
        wcs: b
            .wcs
            .iter()
            .map(|w| (w.wr_id, w.status, w.byte_len))
            .collect(),
        terminates: b
            .events
            .iter()
            .filter_map(|e| match e {
                Event::Terminated { code, by_peer } => Some((*code, *by_peer)),
                _ => None,
            })
            .collect(),
    }
}

/// The receive side's memory: one region, receives at given windows.
const RX_BASE: u64 = 0x4_0000;
const RX_LEN: usize = 64 * 1024;

/// A pair with small FPDUs (`mulpdu`), a source region on `a` and a
/// sentinel-filled region on `b`.
fn pair(crc: bool, mulpdu: usize) -> (Pair, Stag, Stag) {
    let mut p = Pair::new(
        |c| {
            c.crc = crc;
            c.mulpdu = mulpdu;
        },
        |c| {
            c.crc = crc;
            c.mulpdu = mulpdu;
        },
        Cut::Whole,
    );
    p.establish();
    let src = p.a.region(
        0x10_0000,
        pattern(RX_LEN, 7),
        Access::LOCAL_READ | Access::REMOTE_READ,
    );
    let dst = p.b.region(
        RX_BASE,
        vec![SENTINEL; RX_LEN],
        Access::LOCAL_WRITE | Access::REMOTE_WRITE,
    );
    (p, src, dst)
}

/// Everything `a` has to send, as one byte string.
fn drain(a: &mut Side) -> Vec<u8> {
    let mut wire = Vec::new();
    while a.conn.poll_transmit(&a.reg, &mut wire, 1 << 20) > 0 {}
    wire
}

/// A receive of `[8-byte head, body]` at `off` in b's region (the
/// bench's scattered layout), `cap` bytes in all.
fn post_recv(p: &mut Pair, dst: Stag, wr_id: u64, off: u64, cap: u32) {
    p.b.conn
        .post_recv(recv_wr(
            wr_id,
            [
                sge(RX_BASE + off, 8, dst),
                sge(RX_BASE + off + 8, cap - 8, dst),
            ]
            .into(),
        ))
        .unwrap();
}

fn post_send(p: &mut Pair, src: Stag, wr_id: u64, from: u64, len: u32) {
    p.a.conn
        .post_send(send_wr(wr_id, sge(0x10_0000 + from, len, src).into()))
        .unwrap();
}

/// Read sizes: a fixed size, or random ones (1 byte to 3 FPDUs) that
/// split headers and trailers anywhere.
fn sizes(kind: usize, mulpdu: usize) -> Box<dyn FnMut() -> usize> {
    match kind {
        0 => Box::new(|| 1 << 20),
        1 => Box::new(move || mulpdu + 1),
        k => {
            let mut rng = Rng((k as u64 * 0x9e37_79b9) | 1);
            Box::new(move || 1 + rng.below(3 * mulpdu as u64) as usize)
        }
    }
}

/// Runs `scenario` (which posts on a fresh pair and returns the wire
/// `b` is to receive, maybe edited) twice — planned reads and
/// `handle_input` — for CRC off and on and several read patterns, and
/// checks both ends agree. `windows` are the byte ranges of b's region
/// a message may fill; everything else must keep the sentinel. Returns
/// the reads of the whole-stream pattern with CRC off.
fn differential(
    mulpdu: usize,
    windows: &[(usize, usize)],
    scenario: impl Fn(&mut Pair, Stag, Stag, bool) -> Vec<u8>,
    check: impl Fn(&Outcome, bool),
) -> Reads {
    let mut first = None;
    for crc in [false, true] {
        for kind in 0..8 {
            let (mut x, src, dst) = pair(crc, mulpdu);
            let wire = scenario(&mut x, src, dst, crc);
            let (mut y, src_y, dst_y) = pair(crc, mulpdu);
            assert_eq!(scenario(&mut y, src_y, dst_y, crc), wire, "deterministic");
            let reads = feed_planned(&mut x.b, &wire, sizes(kind, mulpdu));
            let mut at = 0;
            while at < wire.len() {
                let k = y.b.conn.handle_input(&wire[at..], &mut y.b.reg);
                assert!(k > 0);
                at += k;
            }
            y.b.pump();
            let (got, want) = (outcome(&x.b), outcome(&y.b));
            let what = format!("crc {crc}, reads {kind}: {reads:?}");
            assert_eq!(got, want, "{what}");
            check(&got, crc);
            // Delivered bytes agree; nothing outside the windows changed.
            let (mx, my) = (x.b.mem(dst), y.b.mem(dst_y));
            for (i, &u) in mx.iter().enumerate() {
                let inside = windows.iter().any(|&(s, e)| (s..e).contains(&i));
                if !inside {
                    assert_eq!(u, SENTINEL, "byte {i} outside the receives, {what}");
                }
            }
            for w in &got.wcs {
                if w.1 == WcStatus::Success && w.0 < 100 {
                    let (s, _) = windows[w.0 as usize];
                    let n = w.2 as usize;
                    assert!(
                        mx[s..s + n] == my[s..s + n],
                        "receive {} bytes, {what}",
                        w.0
                    );
                }
            }
            if first.is_none() {
                first = Some(reads);
            }
        }
    }
    first.expect("ran")
}

/// Receive `i` of the Send tests: `RECV_CAP` bytes at `i * 12 KiB`.
const RECV_CAP: u32 = 8_000;

fn recv_at(i: usize) -> usize {
    i * 12_288
}

/// Posts receives `0..n` (see [`recv_at`]).
fn post_recvs(p: &mut Pair, dst: Stag, n: usize) {
    for i in 0..n {
        post_recv(p, dst, i as u64, recv_at(i) as u64, RECV_CAP);
    }
}

/// The windows a run of Sends of these lengths fills: each message's own
/// bytes, or (`whole`) its whole receive.
fn windows(lens: &[usize], whole: bool) -> Vec<(usize, usize)> {
    lens.iter()
        .enumerate()
        .map(|(i, &n)| {
            let n = if whole { RECV_CAP as usize } else { n };
            (recv_at(i), recv_at(i) + n)
        })
        .collect()
}

/// Messages `msgs` (each a list of FPDU payload lengths) as Sends 1, 2, …
fn sends(msgs: &[&[usize]], crc: bool) -> Vec<u8> {
    let mut wire = Vec::new();
    for (i, m) in msgs.iter().enumerate() {
        wire.extend(send_fpdus(i as u32 + 1, m, crc, i as u8 + 3));
    }
    wire
}

fn all_ok(o: &Outcome, lens: &[usize]) {
    let want: Vec<_> = lens
        .iter()
        .enumerate()
        .map(|(i, &n)| (i as u64, WcStatus::Success, n as u32))
        .collect();
    assert_eq!(o.wcs, want);
}

/// Equal Sends of several FPDUs into larger receives: the first is read
/// FPDU by FPDU (nothing to guess its length by), each later one in one
/// planned read up to exactly its end (every guess right, the short last
/// FPDU included), so no byte past any message's length is written —
/// whatever the CRC and however reads cut the stream.
#[test]
fn equal_messages_are_one_read_each_and_written_no_further() {
    let lens = [10_000; 3];
    let reads = differential(
        1000,
        &windows(&lens, false),
        |p, src, dst, _| {
            for i in 0..3 {
                post_recv(p, dst, i, recv_at(i as usize) as u64, 12_000);
                post_send(p, src, i, 100 * i, 10_000);
            }
            drain(&mut p.a)
        },
        |o, _| all_ok(o, &lens),
    );
    assert_eq!((reads.planned, reads.missed), (2, 0), "{reads:?}");
}

/// A message shorter than the one before: the guess runs past its end
/// into the rest of its receive; the stream from there on (the next
/// message's header and payload) is taken again the ordinary way and
/// lands in the next receive; nothing outside the receives changes.
#[test]
fn a_shorter_message_is_re_placed() {
    let lens = [7_000, 5_555, 2_000];
    let reads = differential(
        1000,
        &windows(&lens, true),
        |p, src, dst, _| {
            post_recvs(p, dst, 3);
            for (i, &n) in lens.iter().enumerate() {
                post_send(p, src, i as u64, 300 * i as u64, n as u32);
            }
            drain(&mut p.a)
        },
        |o, _| all_ok(o, &lens),
    );
    assert!(reads.missed >= 1, "{reads:?}");
}

/// FPDUs a peer sized unevenly: a short first one (the guess is made
/// from it, so the next, longer one runs into what the plan read as
/// framing), a message that ends on a full FPDU before the guess does
/// (the next message's payload belongs to another receive), a zero-length
/// FPDU in the middle. Each is taken the ordinary way from the first
/// differing byte.
#[test]
fn uneven_fpdus_are_re_placed() {
    let msgs: [&[usize]; 5] = [
        &[982, 982, 982],
        &[300, 982, 982, 500],
        &[982, 982],
        &[982, 0, 982, 982],
        &[700],
    ];
    let lens: Vec<usize> = msgs.iter().map(|m| m.iter().sum()).collect();
    let reads = differential(
        1000,
        &windows(&lens, true),
        |p, _, dst, crc| {
            post_recvs(p, dst, msgs.len());
            sends(&msgs, crc)
        },
        |o, _| all_ok(o, &lens),
    );
    assert!(reads.missed >= 2, "{reads:?}");
}

/// The peer gives up in the middle of a Send: its Terminate follows the
/// FPDUs it sent, and the receiver acts on it (not taking it for
/// payload), leaving the receive uncompleted as the ordinary path does.
#[test]
fn a_terminate_in_the_middle_is_seen() {
    differential(
        1000,
        &windows(&[RECV_CAP as usize; 2], true),
        |p, src, dst, _| {
            post_recvs(p, dst, 2);
            post_send(p, src, 0, 0, 7_000);
            let mut wire = drain(&mut p.a);
            post_send(p, src, 1, 0, 7_000);
            for _ in 0..3 {
                assert!(p.a.conn.poll_transmit(&p.a.reg, &mut wire, 1) > 0);
            }
            p.a.conn.fail_local(None, false);
            let mut rest = drain(&mut p.a);
            // Only the Terminate: drop any FPDU of the Send still queued
            // ahead of it (untagged, opcode Send).
            while rest.len() > 4 && rest[2] & 0x80 == 0 && rest[3] & 0x0f == 0x3 {
                let at = fpdu_start(&rest, 1);
                rest.drain(..at);
            }
            wire.extend(rest);
            wire
        },
        |o, _| {
            assert_eq!(o.wcs[0], (0, WcStatus::Success, 7_000), "{o:?}");
            assert!(o.wcs[1..].iter().all(|w| w.1 != WcStatus::Success), "{o:?}");
            assert!(
                o.terminates.iter().any(|&(_, by_peer)| by_peer),
                "the peer's Terminate was seen: {o:?}"
            );
        },
    );
}

/// What the guess did not expect inside a planned message: an MSN out of
/// range, a length field too short for any header (garbage), a corrupted
/// payload byte (caught by the CRC when on) — the same Terminate as the
/// ordinary path, and the message's receive does not complete.
#[test]
fn a_bad_fpdu_in_a_plan_ends_the_stream_the_same_way() {
    let first: &[usize] = &[982, 982, 982];
    for case in 0..3 {
        differential(
            1000,
            &windows(&[RECV_CAP as usize; 2], true),
            |p, _, dst, crc| {
                post_recvs(p, dst, 2);
                let mut wire = sends(&[first], crc);
                let second = wire.len();
                let mut m2 = send_fpdus(2, &[982, 982, 982], crc, 9);
                let at = fpdu_start(&m2, 1);
                match case {
                    // MSN: bytes 10..14 after the length field.
                    0 => m2[at + 12..at + 16].copy_from_slice(&7u32.to_be_bytes()),
                    // A length field of 1, then junk.
                    1 => {
                        m2.truncate(at);
                        m2.extend([0, 1, 0x41, 0x43, 0xde, 0xad, 0xbe, 0xef]);
                    }
                    // One payload byte of the second FPDU.
                    _ => m2[at + 2 + 18 + 100] ^= 0x20,
                }
                wire.extend(m2);
                assert!(wire.len() > second);
                wire
            },
            |o, crc| {
                assert_eq!(o.wcs[0], (0, WcStatus::Success, 2_946), "{o:?}");
                if case == 2 && !crc {
                    // Nothing to catch it with: delivered as sent.
                    assert_eq!(o.wcs.len(), 2, "{o:?}");
                    return;
                }
                assert!(o.wcs[1..].iter().all(|w| w.1 != WcStatus::Success), "{o:?}");
                assert_eq!(o.terminates.len(), 1, "{o:?}");
                assert!(!o.terminates[0].1, "{o:?}");
                if case == 2 {
                    assert_eq!(o.terminates[0].0, TermCode::MPA_CRC);
                }
            },
        );
    }
}

/// Another kind of message right after a planned one ends early: an RDMA
/// Write (its own region, tagged header) where the guess expected the
/// Send to go on. Taken the ordinary way; the Write lands where it says.
#[test]
fn a_write_after_a_planned_send_is_re_placed() {
    use warpsock_proto::wire::ddp::{Opcode, Placement, SegmentHeader};
    use warpsock_proto::wire::fpdu;
    let mut wins = windows(&[RECV_CAP as usize; 3], true);
    wins.push((60_000, 60_500));
    differential(
        1000,
        &wins,
        |p, _, dst, crc| {
            post_recvs(p, dst, 3);
            let mut wire = sends(&[&[982, 982, 982], &[982, 982]], crc);
            let mut hdr = Vec::new();
            SegmentHeader {
                opcode: Opcode::RdmaWrite,
                last: true,
                placement: Placement::Tagged {
                    stag: dst,
                    to: RX_BASE + 60_000,
                },
            }
            .emit(&mut hdr);
            fpdu::emit(&[&hdr, &pattern(500, 1)], crc, &mut wire);
            wire.extend(send_fpdus(3, &[982, 100], crc, 8));
            wire
        },
        |o, _| all_ok(o, &[2_946, 1_964, 1_082]),
    );
}

/// Read Responses of many FPDUs: from the second FPDU on, one read per
/// Read, into the sink; uneven responses (a short first FPDU) are
/// re-placed; another STag mid-Read ends the stream as the ordinary path
/// does.
#[test]
fn read_responses_are_planned_into_the_sink() {
    let win = [(1024, 1024 + 9_000)];
    let reads = differential(
        1000,
        &win,
        |p, src, dst, _| read_responses(p, src, dst, 9_000, None),
        |o, _| assert_eq!(o.wcs, [(100, WcStatus::Success, 9_000)]),
    );
    assert_eq!((reads.planned, reads.missed), (1, 0), "{reads:?}");
    let reads = differential(
        1000,
        &win,
        |p, src, dst, crc| {
            use warpsock_proto::wire::ddp::{Opcode, Placement, SegmentHeader};
            use warpsock_proto::wire::fpdu;
            read_responses(p, src, dst, 9_000, None);
            let data = pattern(RX_LEN, 7);
            let mut wire = Vec::new();
            let mut off = 0;
            for (i, len) in [300, 982, 982, 982, 982, 982, 982, 982, 982, 844]
                .into_iter()
                .enumerate()
            {
                let mut hdr = Vec::new();
                SegmentHeader {
                    opcode: Opcode::RdmaReadResponse,
                    last: i == 9,
                    placement: Placement::Tagged {
                        stag: dst,
                        to: RX_BASE + 1024 + off as u64,
                    },
                }
                .emit(&mut hdr);
                fpdu::emit(&[&hdr, &data[64 + off..64 + off + len]], crc, &mut wire);
                off += len;
            }
            assert_eq!(off, 9_000);
            wire
        },
        |o, _| assert_eq!(o.wcs, [(100, WcStatus::Success, 9_000)]),
    );
    assert!(reads.missed >= 1, "{reads:?}");
    differential(
        1000,
        &win,
        |p, src, dst, _| read_responses(p, src, dst, 9_000, Some(3)),
        |o, _| {
            assert!(o.wcs.iter().all(|w| w.1 != WcStatus::Success), "{o:?}");
            assert_eq!(
                o.terminates,
                [(TermCode::DDP_TAGGED_INVALID_STAG, false)],
                "{o:?}"
            );
        },
    );
}

/// RDMA Writes are never guessed (where one ends is known only from its
/// last header; the bytes behind it may be the application's), nor is
/// anything with markers negotiated.
#[test]
fn writes_and_marked_streams_are_not_planned() {
    let (mut p, src, dst) = pair(false, 1000);
    p.a.conn
        .post_send(SendWr {
            wr_id: 1,
            op: SendOp::Write {
                remote_addr: RX_BASE,
                rkey: dst,
            },
            sgl: sge(0x10_0000, 5000, src).into(),
            signaled: true,
        })
        .unwrap();
    let wire = drain(&mut p.a);
    let reads = feed_planned(&mut p.b, &wire, || 1 << 20);
    assert_eq!(reads.planned, 0);
    assert!(p.b.mem(dst)[..5000] == pattern(RX_LEN, 7)[..5000]);
    // Markers both ways, equal Sends (planned without markers).
    let mut p = Pair::new(
        |c| {
            c.markers = true;
            c.mulpdu = 1000;
        },
        |c| {
            c.markers = true;
            c.mulpdu = 1000;
        },
        Cut::Whole,
    );
    p.establish();
    let src =
        p.a.region(0x10_0000, pattern(RX_LEN, 7), Access::LOCAL_READ);
    let dst =
        p.b.region(RX_BASE, vec![SENTINEL; RX_LEN], Access::LOCAL_WRITE);
    for i in 0..3 {
        post_recv(&mut p, dst, i, recv_at(i as usize) as u64, RECV_CAP);
        post_send(&mut p, src, i, 0, 5_000);
    }
    let wire = drain(&mut p.a);
    let reads = feed_planned(&mut p.b, &wire, || 1 << 20);
    assert_eq!(reads.planned, 0);
    assert_eq!(p.b.wcs.len(), 3);
    for i in 0..3 {
        let at = recv_at(i);
        assert!(p.b.mem(dst)[at..at + 5_000] == pattern(RX_LEN, 7)[..5_000]);
    }
}

/// b reads `len` bytes of a's region into its sink at offset 1024; the
/// responses a sends, with the STag of FPDU `bad` changed if given.
fn read_responses(p: &mut Pair, src: Stag, dst: Stag, len: u32, bad: Option<usize>) -> Vec<u8> {
    // The initiator's first FPDU (a zero-byte Send) lets b transmit.
    p.b.conn
        .post_recv(recv_wr(200, sge(RX_BASE, 0, dst).into()))
        .unwrap();
    post_send(p, src, 200, 0, 0);
    let first = drain(&mut p.a);
    assert_eq!(p.b.conn.handle_input(&first, &mut p.b.reg), first.len());
    p.b.pump();
    p.b.wcs.clear();
    p.b.conn
        .post_send(SendWr {
            wr_id: 100,
            op: SendOp::Read {
                remote_addr: 0x10_0000 + 64,
                rkey: src,
            },
            sgl: sge(RX_BASE + 1024, len, dst).into(),
            signaled: true,
        })
        .unwrap();
    let req = drain(&mut p.b);
    assert_eq!(p.a.conn.handle_input(&req, &mut p.a.reg), req.len());
    let mut wire = drain(&mut p.a);
    if let Some(k) = bad {
        // Tagged header: length (2), control (2), STag (4), TO (8).
        let at = fpdu_start(&wire, k);
        wire[at + 4] ^= 0x10;
    }
    wire
}

/// Offset of FPDU `k` (0-based) in a stream of FPDUs.
fn fpdu_start(wire: &[u8], k: usize) -> usize {
    let mut at = 0;
    for _ in 0..k {
        let ulpdu = usize::from(u16::from_be_bytes([wire[at], wire[at + 1]]));
        at += 2 + ulpdu + (4 - (2 + ulpdu) % 4) % 4 + 4;
    }
    at
}

/// The FPDUs of Send message `msn` with payloads of `lens` bytes (the
/// last one marked last), payload bytes from `pattern(_, seed)`.
fn send_fpdus(msn: u32, lens: &[usize], crc: bool, seed: u8) -> Vec<u8> {
    use warpsock_proto::wire::ddp::{Opcode, Placement, SegmentHeader};
    use warpsock_proto::wire::fpdu;
    let data = pattern(lens.iter().sum(), seed);
    let mut wire = Vec::new();
    let mut mo = 0;
    for (i, &len) in lens.iter().enumerate() {
        let mut hdr = Vec::new();
        SegmentHeader {
            opcode: Opcode::Send,
            last: i + 1 == lens.len(),
            placement: Placement::Untagged {
                inv_stag: 0,
                qn: 0,
                msn,
                mo: mo as u32,
            },
        }
        .emit(&mut hdr);
        fpdu::emit(&[&hdr, &data[mo..mo + len]], crc, &mut wire);
        mo += len;
    }
    wire
}
