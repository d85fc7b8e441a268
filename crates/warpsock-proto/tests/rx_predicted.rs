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

mod util;

use std::collections::HashMap;
use std::time::Instant;

use proptest::prelude::*;

use warpsock_proto::{RecvWr, Sge, WcOpcode, WcStatus, WorkCompletion};

use util::rx::{
    fpdu_of, recv_of, responder, responder_with, script, steps, Action, Responder, KINDS, RECVS,
    REGIONS,
};

/// A responder and the books of its receives.
struct Side {
    rx: Responder,
    next_wr: u64,
    /// Posted receives by `wr_id`: their scatter lists, to post again.
    posted: HashMap<u64, Vec<Sge>>,
    /// What the predicted path took: `wr_id` and payload.
    taken: Vec<(u64, Vec<u8>)>,
    /// Completions polled, in order.
    completions: Vec<WorkCompletion>,
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
    /// A responder (as `responder`; its receive queue `rq_depth` deep,
    /// else the default) with no receive posted yet.
    fn new(now: Instant, crc: bool, rtr: bool, rq_depth: Option<usize>) -> Self {
        Self {
            rx: responder_with(now, crc, rtr, rq_depth),
            next_wr: 0,
            posted: HashMap::new(),
            taken: Vec::new(),
            completions: Vec::new(),
        }
    }

    /// Acts `a`; `predict`: try the predicted path first on each read;
    /// `repost`: post again every receive that completes.
    fn act(&mut self, a: &Action, predict: Option<Take>, repost: bool) {
        match a {
            Action::Recv(sgl) => {
                let sgl = self.rx.sgl(sgl);
                self.next_wr += 1;
                self.posted.insert(self.next_wr, sgl.clone());
                // A refused post (QP in Error) is refused on both sides.
                let _ = self.rx.conn.post_recv(RecvWr {
                    wr_id: self.next_wr,
                    sgl: sgl.into(),
                });
            }
            Action::Feed(bytes) => {
                let took = predict.and_then(|t| {
                    self.rx
                        .conn
                        .rx_send_predicted(bytes, &self.rx.reg, |wr_id, payload| {
                            (t == Take::Yes).then(|| (wr_id, payload.to_vec()))
                        })
                });
                match took {
                    // The receive is posted again in place by the take.
                    Some(got) => {
                        self.rx.consumed += bytes.len();
                        self.taken.push(got);
                    }
                    None => self.rx.consumed += self.rx.conn.handle_input(bytes, &mut self.rx.reg),
                }
            }
        }
        while let Some(wc) = self.rx.conn.poll_completion() {
            if repost && wc.status == WcStatus::Success && wc.opcode == WcOpcode::Recv {
                self.repost(wc.wr_id);
            }
            self.completions.push(wc);
        }
        self.rx
            .conn
            .poll_transmit(&self.rx.reg, &mut self.rx.sent, 1 << 16);
    }

    /// Posts receive `wr_id` again, the same request.
    fn repost(&mut self, wr_id: u64) {
        let sgl = self.posted[&wr_id].clone();
        let _ = self.rx.conn.post_recv(RecvWr {
            wr_id,
            sgl: sgl.into(),
        });
    }

    /// The bytes of `len` at the start of receive `wr_id`'s one buffer.
    fn placed(&self, wr_id: u64, len: usize) -> Vec<u8> {
        let s = &self.posted[&wr_id][0];
        let i = self
            .rx
            .stags
            .iter()
            .position(|&t| t == s.lkey)
            .expect("stag");
        let at = (s.addr - REGIONS[i].0) as usize;
        self.rx.reg.backing(s.lkey).expect("region")[at..at + len].to_vec()
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
    differential_in(crc, rtr, take, repost, None, script)
}

/// [`differential_with`], both responders' receive queues `rq_depth` deep
/// (else the default).
fn differential_in(
    crc: bool,
    rtr: bool,
    take: Take,
    repost: bool,
    rq_depth: Option<usize>,
    script: &[Action],
) -> usize {
    let now = Instant::now();
    let mut predicted = Side::new(now, crc, rtr, rq_depth);
    let mut general = Side::new(now, crc, rtr, rq_depth);
    assert_eq!(
        format!("{:?}", predicted.rx.conn),
        format!("{:?}", general.rx.conn)
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
            format!("{:?}", predicted.rx.conn),
            format!("{:?}", general.rx.conn),
            "state {at}"
        );
        assert_eq!(predicted.rx.consumed, general.rx.consumed, "consumed {at}");
        assert_eq!(predicted.rx.sent, general.rx.sent, "sent {at}");
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

/// A receive queue kept as deep as the connection allows (`rq_depth`,
/// which bounds the ring's growth: 1, 3 and 5 slots, every one in use):
/// each predicted take's repost in place moves the head alone
/// (`Ring::rotate_one`'s full case), and the queue, in order, matches the
/// general path's, which pops the receive and posts it again at the back.
#[test]
fn a_full_receive_queue_matches_the_general_path() {
    for crc in [false, true] {
        for depth in [1, 3, 5] {
            let mut steps = vec![(Some(0), 0, false)];
            steps.extend(std::iter::repeat_n((None, 0, false), 2 * depth + 2));
            let mut s: Vec<Action> = (1..depth).map(|_| Action::Recv(recv_of(0))).collect();
            s.extend(script(&steps, crc));
            let took = differential_in(crc, false, Take::Yes, true, Some(depth), &s);
            assert_eq!(took, 2 * depth + 2, "depth {depth} CRC {crc}");
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
        steps in steps(),
    ) {
        differential(crc, rtr, Take::Yes, &script(&steps, crc));
    }
}
