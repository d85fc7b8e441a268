//! The one-FPDU Send's straight path against the general one: the same
//! FPDU streams (valid ones of every kind, and the malformed ones of
//! `malformed.rs`, each condition of the straight path broken in turn) go
//! to two responders, one given each action's bytes whole (whole FPDUs:
//! `rx_fpdu`, its straight path where it applies) and one given them a byte
//! at a time (the step-by-step path, which never takes an FPDU whole).
//! After every action both must hold the same state (the connection's
//! whole `Debug`: receive state, queues, MSNs, events, completions), have
//! sent the same bytes and written the same memory.

mod util;

use std::time::Instant;

use proptest::prelude::*;
use warpsock_proto::RecvWr;

use util::rx::{responder, script, steps, Action, Responder, KINDS, RECVS};

impl Responder {
    fn act(&mut self, a: &Action, whole: bool) {
        match a {
            Action::Recv(sgl) => {
                let sgl = self.sgl(sgl);
                // A refused post (QP in Error) is refused on both sides.
                let _ = self.conn.post_recv(RecvWr {
                    wr_id: 7,
                    sgl: sgl.into(),
                });
            }
            Action::Feed(bytes) if whole => {
                self.consumed += self.conn.handle_input(bytes, &mut self.reg);
            }
            Action::Feed(bytes) => {
                for b in bytes.chunks(1) {
                    self.consumed += self.conn.handle_input(b, &mut self.reg);
                }
            }
        }
        self.conn.poll_transmit(&self.reg, &mut self.sent, 1 << 16);
    }

    fn memory(&self) -> Vec<&[u8]> {
        self.stags
            .iter()
            .map(|&s| &self.reg.backing(s).expect("region")[..])
            .collect()
    }
}

/// Runs `script` through both paths and compares them after every action.
fn differential(crc: bool, rtr: bool, script: &[Action]) {
    let now = Instant::now();
    let mut whole = responder(now, crc, rtr);
    let mut bytewise = responder(now, crc, rtr);
    assert_eq!(format!("{:?}", whole.conn), format!("{:?}", bytewise.conn));
    for (i, a) in script.iter().enumerate() {
        whole.act(a, true);
        bytewise.act(a, false);
        let at = format!("after action {i} ({a:?}) of {script:?}, CRC {crc}, RTR {rtr}");
        assert_eq!(
            format!("{:?}", whole.conn),
            format!("{:?}", bytewise.conn),
            "state {at}"
        );
        assert_eq!(whole.consumed, bytewise.consumed, "consumed {at}");
        assert_eq!(whole.sent, bytewise.sent, "sent {at}");
        assert_eq!(whole.memory(), bytewise.memory(), "memory {at}");
    }
}

/// Every FPDU kind after each receive kind, CRC on and off, alone and
/// after a straight Send (so the MSN, position and spare scatter list the
/// straight path left are what the next FPDU meets).
#[test]
fn every_kind_after_every_receive_matches_the_general_path() {
    for crc in [false, true] {
        for r in 0..RECVS {
            for kind in 0..KINDS {
                for lead in [false, true] {
                    let mut steps = Vec::new();
                    if lead {
                        steps.push((Some(0), 0, false));
                    }
                    steps.push((Some(r), kind, false));
                    steps.push((Some(0), 0, false));
                    differential(crc, false, &script(&steps, crc));
                }
            }
        }
    }
}

/// Without a posted receive, and with a Send already in progress (a
/// non-last segment, then a last one claiming MO 0).
#[test]
fn no_receive_and_a_send_in_progress_take_the_general_path() {
    for crc in [false, true] {
        differential(crc, false, &script(&[(None, 0, false)], crc));
        differential(
            crc,
            false,
            &script(&[(Some(0), 5, false), (None, 0, false)], crc),
        );
        differential(
            crc,
            false,
            &script(&[(Some(0), 5, true), (None, 0, false)], crc),
        );
    }
}

/// While the RTR is awaited (peer-to-peer, Send RTR), the first Send is
/// the general path's: a zero-length one is the RTR (no receive used), a
/// longer one announces the connection established.
#[test]
fn an_awaited_rtr_takes_the_general_path() {
    for crc in [false, true] {
        for kind in [0, 2] {
            let steps = [(Some(0), kind, false), (Some(0), 0, false)];
            differential(crc, true, &script(&steps, crc));
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
        differential(crc, rtr, &script(&steps, crc));
    }
}
