//! The predicted receive (`Connection::rx_send_predicted`, issue 12)
//! against the general path: the same FPDU streams go to two responders.
//! One feeds each read to the predicted path first (the engine's quiet
//! read: it applies only to a read that is exactly one whole FPDU) and
//! takes what it takes, else feeds the read as usual; the other feeds every
//! read as usual (`handle_input`: the straight path where it applies). Both
//! then post again the receive of every successful receive completion, as
//! a sockets layer reposts its slot. After every action both must hold the
//! same state (the connection's whole `Debug`: receive state, queues, MSNs,
//! events), have sent the same bytes and consumed the same stream; a
//! predicted take must match the general side's one completion (its
//! `wr_id`, a successful receive, its length) and the bytes it placed, and
//! every other completion must be the same on both sides.

use std::collections::HashMap;
use std::time::Instant;

use proptest::prelude::*;

use warpsock_proto::wire::ddp::{Opcode, Placement, ReadRequest, SegmentHeader};
use warpsock_proto::wire::fpdu;
use warpsock_proto::wire::mpa::{EnhancedParams, Flags, FrameKind, RequestReply};
use warpsock_proto::{
    Access, Config, Connection, Event, PdId, RecvWr, Registry, Role, Sge, Stag, WcOpcode, WcStatus,
    WorkCompletion,
};

/// Regions every responder registers, in this order (so both sides of a
/// comparison have the same STags).
const REGIONS: [(u64, usize, Access); 4] = [
    (0x1000, 256, Access::LOCAL_WRITE),
    (0x2000, 256, Access::LOCAL_READ),
    (0x3000, 256, Access::REMOTE_WRITE),
    (0x4000, 256, Access::ALL),
];

struct Side {
    conn: Connection,
    reg: Registry<Vec<u8>>,
    stags: Vec<Stag>,
    sent: Vec<u8>,
    consumed: usize,
    next_wr: u64,
    /// Posted receives by `wr_id`: their scatter lists, to post again.
    posted: HashMap<u64, Vec<Sge>>,
    /// What the predicted path took: `wr_id` and payload.
    taken: Vec<(u64, Vec<u8>)>,
    /// Completions polled, in order.
    completions: Vec<WorkCompletion>,
}

/// A responder that accepted a scripted MPA Request (CRC as `crc`; with
/// `rtr`, peer-to-peer with a zero-length Send as the RTR message).
fn responder(now: Instant, crc: bool, rtr: bool) -> Side {
    let mut reg = Registry::new();
    let pd: PdId = reg.alloc_pd();
    let stags = REGIONS
        .iter()
        .map(|&(iova, len, access)| reg.register(pd, iova, vec![0; len], access, 0x11))
        .collect();
    let mut cfg = Config::new(Role::Responder, pd);
    cfg.ird = 4;
    let mut conn = Connection::new(cfg, now);
    let word = EnhancedParams {
        ird: 4,
        ord: 4,
        peer_to_peer: rtr,
        send_rtr: rtr,
        ..Default::default()
    }
    .to_bytes();
    let mut req = Vec::new();
    RequestReply {
        kind: FrameKind::Request,
        flags: Flags(Flags::ENHANCED).with(Flags::CRC, crc),
        revision: 2,
        private_data: &word,
    }
    .emit(&mut req);
    assert_eq!(conn.handle_input(&req, &mut reg), req.len());
    assert!(matches!(conn.poll_event(), Some(Event::ConnectRequest(_))));
    conn.accept(&[]).unwrap();
    let mut sent = Vec::new();
    conn.poll_transmit(&reg, &mut sent, 1 << 16);
    Side {
        conn,
        reg,
        stags,
        sent,
        consumed: 0,
        next_wr: 0,
        posted: HashMap::new(),
        taken: Vec::new(),
        completions: Vec::new(),
    }
}

/// One step of a script.
#[derive(Debug, Clone)]
enum Action {
    /// Posts a receive: (region index, offset, length) per entry.
    Recv(Vec<(usize, u64, u32)>),
    /// One read's bytes.
    Feed(Vec<u8>),
}

/// How the predicted side's `take` answers.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Take {
    /// Takes the payload.
    Yes,
    /// Declines it (the caller's own fallback: a buffer too small).
    No,
}

impl Side {
    /// Acts `a`; `predict`: try the predicted path first on each read;
    /// `repost`: post again every receive that completes.
    fn act(&mut self, a: &Action, predict: Option<Take>, repost: bool) {
        match a {
            Action::Recv(sgl) => {
                let sgl: Vec<Sge> = sgl
                    .iter()
                    .map(|&(i, off, length)| Sge {
                        addr: REGIONS[i].0 + off,
                        length,
                        lkey: self.stags[i],
                    })
                    .collect();
                self.next_wr += 1;
                self.posted.insert(self.next_wr, sgl.clone());
                // A refused post (QP in Error) is refused on both sides.
                let _ = self.conn.post_recv(RecvWr {
                    wr_id: self.next_wr,
                    sgl: sgl.into(),
                });
            }
            Action::Feed(bytes) => {
                let took = predict.and_then(|t| {
                    self.conn
                        .rx_send_predicted(bytes, &self.reg, |wr_id, payload| {
                            (t == Take::Yes).then(|| (wr_id, payload.to_vec()))
                        })
                });
                match took {
                    // The receive is posted again in place by the take.
                    Some(got) => {
                        self.consumed += bytes.len();
                        self.taken.push(got);
                    }
                    None => self.consumed += self.conn.handle_input(bytes, &mut self.reg),
                }
            }
        }
        while let Some(wc) = self.conn.poll_completion() {
            if repost && wc.status == WcStatus::Success && wc.opcode == WcOpcode::Recv {
                self.repost(wc.wr_id);
            }
            self.completions.push(wc);
        }
        self.conn.poll_transmit(&self.reg, &mut self.sent, 1 << 16);
    }

    /// Posts receive `wr_id` again, the same request.
    fn repost(&mut self, wr_id: u64) {
        let sgl = self.posted[&wr_id].clone();
        let _ = self.conn.post_recv(RecvWr {
            wr_id,
            sgl: sgl.into(),
        });
    }

    /// The bytes of `len` at the start of receive `wr_id`'s one buffer.
    fn placed(&self, wr_id: u64, len: usize) -> Vec<u8> {
        let s = &self.posted[&wr_id][0];
        let i = self.stags.iter().position(|&t| t == s.lkey).expect("stag");
        let at = (s.addr - REGIONS[i].0) as usize;
        self.reg.backing(s.lkey).expect("region")[at..at + len].to_vec()
    }
}

/// Runs `script` through both paths and compares them after every
/// action; returns how many reads the predicted path took. `repost`: every
/// receive that completes is posted again (else only those of the
/// predicted takes, on the general side as well: the predicted path posts
/// them again in place).
fn differential(crc: bool, rtr: bool, take: Take, script: &[Action]) -> usize {
    differential_with(crc, rtr, take, true, script)
}

fn differential_with(crc: bool, rtr: bool, take: Take, repost: bool, script: &[Action]) -> usize {
    let now = Instant::now();
    let mut predicted = responder(now, crc, rtr);
    let mut general = responder(now, crc, rtr);
    assert_eq!(
        format!("{:?}", predicted.conn),
        format!("{:?}", general.conn)
    );
    for (i, a) in script.iter().enumerate() {
        let taken = predicted.taken.len();
        let done = general.completions.len();
        predicted.act(a, Some(take), repost);
        general.act(a, None, repost);
        if !repost && predicted.taken.len() > taken {
            let (wr_id, _) = predicted.taken[taken];
            general.repost(wr_id);
        }
        let at = format!("after action {i} ({a:?}) of {script:?}, CRC {crc}, RTR {rtr}");
        assert_eq!(
            format!("{:?}", predicted.conn),
            format!("{:?}", general.conn),
            "state {at}"
        );
        assert_eq!(predicted.consumed, general.consumed, "consumed {at}");
        assert_eq!(predicted.sent, general.sent, "sent {at}");
        let new = &general.completions[done..];
        if predicted.taken.len() > taken {
            let (wr_id, payload) = predicted.taken.last().expect("taken").clone();
            let [wc] = new else {
                panic!(
                    "{} completions on the general side for a take {at}",
                    new.len()
                );
            };
            assert_eq!(wc.wr_id, wr_id, "wr_id {at}");
            assert_eq!(wc.status, WcStatus::Success, "status {at}");
            assert_eq!(wc.opcode, WcOpcode::Recv, "opcode {at}");
            assert!(!wc.solicited, "a solicited Send predicted {at}");
            assert_eq!(wc.byte_len as usize, payload.len(), "length {at}");
            assert_eq!(
                general.placed(wr_id, payload.len()),
                payload,
                "payload {at}"
            );
        } else {
            assert_eq!(
                format!(
                    "{:?}",
                    &predicted.completions[predicted.completions.len() - new.len()..]
                ),
                format!("{new:?}"),
                "completions {at}"
            );
            assert_eq!(
                predicted.completions.len() + predicted.taken.len(),
                general.completions.len(),
                "completion count {at}"
            );
        }
    }
    assert_eq!(
        predicted.taken.len() + predicted.completions.len(),
        general.completions.len()
    );
    predicted.taken.len()
}

/// An FPDU with `ulpdu` (header and body) and the trailer: CRC when `crc`
/// (flipped when `bad_crc`), zeros without.
fn frame(ulpdu: &[u8], crc: bool, bad_crc: bool) -> Vec<u8> {
    let mut v = Vec::new();
    fpdu::emit(&[ulpdu], crc, &mut v);
    if bad_crc {
        let n = v.len();
        v[n - 1] ^= 0x5a;
    }
    v
}

fn untagged(op: Opcode, last: bool, qn: u32, msn: u32, mo: u32, inv: u32) -> Vec<u8> {
    let h = SegmentHeader {
        opcode: op,
        last,
        placement: Placement::Untagged {
            inv_stag: inv,
            qn,
            msn,
            mo,
        },
    };
    h.to_bytes()[..h.len()].to_vec()
}

/// The FPDU kinds a script draws from; `msn` is the Send MSN the stream
/// expects next if every Send so far was taken.
fn fpdu_of(kind: u8, msn: u32, crc: bool, stags: &[Stag]) -> Vec<u8> {
    let send = |op, last, qn, msn, mo, inv, len: usize| {
        let mut u = untagged(op, last, qn, msn, mo, inv);
        u.extend((0..len).map(|i| (i as u8).wrapping_mul(7).wrapping_add(kind)));
        frame(&u, crc, false)
    };
    match kind {
        // The straight path's case, and its solicited twin.
        0 => send(Opcode::Send, true, 0, msn, 0, 0, 8),
        1 => send(Opcode::SendSe, true, 0, msn, 0, 0, 40),
        2 => send(Opcode::Send, true, 0, msn, 0, 0, 0),
        // A payload that fills the receive (64 bytes) and one past it.
        3 => send(Opcode::Send, true, 0, msn, 0, 0, 64),
        4 => send(Opcode::Send, true, 0, msn, 0, 0, 65),
        // Each header condition broken in turn.
        5 => send(Opcode::Send, false, 0, msn, 0, 0, 8),
        6 => send(Opcode::Send, true, 0, msn, 8, 0, 8),
        7 => send(Opcode::Send, true, 0, msn.wrapping_add(1), 0, 0, 8),
        8 => send(Opcode::Send, true, 1, msn, 0, 0, 8),
        9 => send(Opcode::SendInvalidate, true, 0, msn, 0, stags[3], 8),
        10 => send(Opcode::SendSeInvalidate, true, 0, msn, 0, 0x4242, 8),
        11 => {
            let mut f = send(Opcode::Send, true, 0, msn, 0, 0, 8);
            f.truncate(f.len() - 4);
            let mut u = f[2..].to_vec();
            u.truncate(u.len() - fpdu::pad_len(u.len()));
            frame(&u, crc, true)
        }
        // Control bytes: tagged bit, DDP version, RDMAP version, reserved
        // bits (ignored by both), an undefined opcode.
        12..=16 => {
            let mut u = untagged(Opcode::Send, true, 0, msn, 0, 0);
            match kind {
                12 => u[0] |= 0x80,
                13 => u[0] = (u[0] & !0x03) | 0x02,
                14 => u[1] = (u[1] & 0x3f) | 0x80,
                15 => {
                    u[0] |= 0x3c;
                    u[1] |= 0x30;
                }
                _ => u[1] = (u[1] & 0xf0) | 0x0b,
            }
            u.extend_from_slice(&[1, 2, 3, 4, 5]);
            frame(&u, crc, false)
        }
        // Other messages: an RDMA Write, a Read Request, an unexpected
        // Read Response, a Terminate from the peer.
        17 => {
            let h = SegmentHeader {
                opcode: Opcode::RdmaWrite,
                last: true,
                placement: Placement::Tagged {
                    stag: stags[2],
                    to: 0x3010,
                },
            };
            let mut u = h.to_bytes()[..h.len()].to_vec();
            u.extend_from_slice(&[9; 12]);
            frame(&u, crc, false)
        }
        18 => {
            let mut u = untagged(Opcode::RdmaReadRequest, true, 1, 1, 0, 0);
            u.extend_from_slice(
                &ReadRequest {
                    sink_stag: 0x99,
                    sink_to: 0,
                    size: 16,
                    src_stag: stags[3],
                    src_to: 0x4000,
                }
                .to_bytes(),
            );
            frame(&u, crc, false)
        }
        19 => {
            let h = SegmentHeader {
                opcode: Opcode::RdmaReadResponse,
                last: true,
                placement: Placement::Tagged { stag: 0x99, to: 0 },
            };
            let mut u = h.to_bytes()[..h.len()].to_vec();
            u.extend_from_slice(&[1; 4]);
            frame(&u, crc, false)
        }
        _ => {
            let mut u = untagged(Opcode::Terminate, true, 2, 1, 0, 0);
            u.extend_from_slice(&[0x11, 0x02, 0x00, 0x00]);
            frame(&u, crc, false)
        }
    }
}

const KINDS: u8 = 21;

/// Receives a script posts: (region, offset, length) entries.
fn recv_of(kind: u8) -> Vec<(usize, u64, u32)> {
    match kind {
        // One buffer of 64 bytes: the straight path's receive.
        0 => vec![(0, 16, 64)],
        // Two buffers, a zero-length one, a region without local write,
        // a range past its region.
        1 => vec![(0, 0, 32), (3, 8, 32)],
        2 => vec![(0, 0, 0)],
        3 => vec![(1, 0, 64)],
        _ => vec![(0, 200, 64)],
    }
}

const RECVS: u8 = 5;

/// A script from drawn (receive kind or none, FPDU kind, whole or joined
/// with the next) steps; MSNs follow the Sends drawn.
fn script(steps: &[(Option<u8>, u8, bool)], crc: bool) -> Vec<Action> {
    let stags = responder(Instant::now(), crc, false).stags;
    let mut msn = 1u32;
    let mut out = Vec::new();
    let mut pending: Vec<u8> = Vec::new();
    for &(recv, kind, join) in steps {
        if let Some(r) = recv {
            if !pending.is_empty() {
                out.push(Action::Feed(std::mem::take(&mut pending)));
            }
            out.push(Action::Recv(recv_of(r)));
        }
        pending.extend(fpdu_of(kind, msn, crc, &stags));
        if matches!(kind, 0..=4) {
            msn = msn.wrapping_add(1);
        }
        if !join {
            out.push(Action::Feed(std::mem::take(&mut pending)));
        }
    }
    if !pending.is_empty() {
        out.push(Action::Feed(pending));
    }
    out
}

/// Every FPDU kind into each receive kind, CRC on and off, after a lead
/// Send (the first FPDU is never predicted), each FPDU alone in its read,
/// then a Send (into that receive again if the predicted path took the
/// FPDU and posted it again, else into a fresh one). Predicted exactly
/// where it must be: a valid one-FPDU Send, not solicited, into a
/// one-buffer receive it fits (FPDU kinds 0, 2, 3 into receive kind 0),
/// and the Send after it; not a Send with Solicited Event (kind 1), nor one
/// past its receive (4), nor a bad CRC (11, CRC on), nor into another
/// receive (after which the next Send is, if the stream goes on).
#[test]
fn every_kind_into_every_receive_matches_the_general_path() {
    for crc in [false, true] {
        for r in 0..RECVS {
            for kind in 0..KINDS {
                let steps = [
                    (Some(0), 0, false),
                    (Some(r), kind, false),
                    (Some(0), 0, false),
                ];
                let took = differential_with(crc, false, Take::Yes, false, &script(&steps, crc));
                let at = format!("kind {kind} receive {r} CRC {crc}");
                match (r, kind) {
                    (0, 0 | 2 | 3) => assert_eq!(took, 2, "{at}"),
                    // Into two buffers, or a zero-length Send into an
                    // empty buffer: the general path's, and the stream
                    // goes on.
                    (0, 1) | (1, 0..=3) | (2, 2) => assert_eq!(took, 1, "{at}"),
                    // Errors: the stream is over.
                    (_, 4) | (2.., 0..=3) => assert_eq!(took, 0, "{at}"),
                    (0, 11) if crc => assert_eq!(took, 0, "{at}"),
                    _ => {}
                }
            }
        }
    }
}

/// Two FPDUs in one read, and one with the start of the next: not
/// predicted (the general path takes them); the Send after them is.
#[test]
fn two_fpdus_in_one_read_are_not_predicted() {
    let stags = responder(Instant::now(), false, false).stags;
    for crc in [false, true] {
        let f = |msn| fpdu_of(0, msn, crc, &stags);
        let two = [f(2), f(3)].concat();
        let and_part = [f(2), f(3)[..5].to_vec()].concat();
        for (read, rest) in [(two, Vec::new()), (and_part, f(3)[5..].to_vec())] {
            let mut s = vec![
                Action::Recv(recv_of(0)),
                Action::Recv(recv_of(0)),
                Action::Feed(f(1)),
                Action::Feed(read),
            ];
            if !rest.is_empty() {
                s.push(Action::Feed(rest));
            }
            s.push(Action::Feed(f(4)));
            assert_eq!(differential(crc, false, Take::Yes, &s), 1, "CRC {crc}");
        }
    }
}

/// A take the caller declines (`take` answers `None`: its buffer too
/// small, its books) leaves the connection as it was: the read then goes
/// the general way, with the same result.
#[test]
fn a_declined_take_changes_nothing() {
    for crc in [false, true] {
        let steps = [
            (Some(0), 0, false),
            (Some(0), 0, false),
            (Some(0), 3, false),
        ];
        assert_eq!(differential(crc, false, Take::No, &script(&steps, crc)), 0);
    }
}

/// The first FPDU, a Send while another is in progress (a non-last
/// segment before it), and the Sends while the RTR is awaited: the
/// general path.
#[test]
fn the_first_fpdu_a_send_in_progress_and_rtr_are_not_predicted() {
    for crc in [false, true] {
        assert_eq!(
            differential(crc, false, Take::Yes, &script(&[(Some(0), 0, false)], crc)),
            0
        );
        let steps = [(Some(0), 0, false), (Some(0), 5, false), (None, 0, false)];
        assert_eq!(differential(crc, false, Take::Yes, &script(&steps, crc)), 0);
        for kind in [0, 2] {
            let steps = [(Some(0), kind, false), (Some(0), 0, false)];
            differential(crc, true, Take::Yes, &script(&steps, crc));
        }
    }
}

/// A read of an FPDU split anywhere is not predicted (partial), nor its
/// rest.
#[test]
fn a_partial_fpdu_is_not_predicted() {
    let stags = responder(Instant::now(), false, false).stags;
    for crc in [false, true] {
        let lead = fpdu_of(0, 1, crc, &stags);
        let f = fpdu_of(0, 2, crc, &stags);
        for cut in 1..f.len() {
            let s = [
                Action::Recv(recv_of(0)),
                Action::Feed(lead.clone()),
                Action::Recv(recv_of(0)),
                Action::Feed(f[..cut].to_vec()),
                Action::Feed(f[cut..].to_vec()),
            ];
            assert_eq!(differential(crc, false, Take::Yes, &s), 0, "cut {cut}");
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Random streams of every kind, joined into reads at random.
    #[test]
    fn random_streams_match_the_general_path(
        crc in any::<bool>(),
        rtr in any::<bool>(),
        steps in prop::collection::vec(
            (prop::option::of(0..RECVS), 0..KINDS, any::<bool>()),
            1..10,
        ),
    ) {
        differential(crc, rtr, Take::Yes, &script(&steps, crc));
    }
}
