//! The initiator's "kick" past Linux siw's accept race (sans-IO: time is
//! passed in; [`crate::qp`] posts the Write, the context's notifier asks
//! every [`crate::ctx::WATCH`]).
//!
//! # The siw behaviour it works around
//!
//! Linux siw's `siw_accept()` (drivers/infiniband/sw/siw/siw_cm.c, 6.1)
//! sends the MPA Reply and only *then* hands the socket's receive callback
//! to the queue pair (`siw_qp_socket_assoc()`). An FPDU that arrives in
//! between is seen by the connection manager's `siw_cm_llp_data_ready()`,
//! which ignores data once the endpoint is in RDMA mode, and it then sits
//! unread in the socket until *more* data arrives. An initiator that sends
//! its first message right after the Reply and waits for the answer, as
//! rping, perftest's `-R` handshake and rsockets all do, waits forever.
//! Under qemu TCG the window is wide: 2 to 6 connections in 12 stalled.
//!
//! # What is done
//!
//! On a connection this side initiated, once the program has posted a
//! send-queue request, if nothing has come from the peer (no receive and
//! no RDMA Read response completed) after [`KICK_AFTER`], the queue pair
//! sends a zero-length RDMA Write to STag 1, TO 0 — the frame siw itself
//! sends as its peer-to-peer RTR, and which RFC 5040 responders (siw, and
//! warpsock's `warpsock-proto`) accept without an STag check because it
//! places nothing. Its arrival makes siw read the stalled FPDU. It is
//! unsignalled (a program never sees it; a flushed one is dropped by
//! [`is_kick`]), and bounded: at most [`MAX_KICKS`], with doubling waits
//! (1 s, 3 s, 7 s after the first post), never after the first answer.
//! Passive sides never kick: siw as an initiator has no such window.

use std::time::{Duration, Instant};

/// How long an initiator waits for the peer's first answer before kicking.
pub const KICK_AFTER: Duration = Duration::from_secs(1);
/// Kicks per connection at most.
pub const MAX_KICKS: u32 = 3;
/// `wr_id` of a kick: a non-canonical address (bits 48..63 neither all 0
/// nor all 1), so no program's pointer-valued `wr_id` collides with it,
/// and far above any counter a program would use.
pub const KICK_WR_ID: u64 = 0x5753_4b49_434b_0001;

/// Whether an engine completion is a kick's (a flushed or failed kick:
/// successful ones are unsignalled and complete silently).
pub fn is_kick(wr_id: u64, is_write: bool, byte_len: u32) -> bool {
    wr_id == KICK_WR_ID && is_write && byte_len == 0
}

/// One connection's kick state.
#[derive(Debug, Clone, Default)]
pub struct Kicker {
    /// Only connections this side initiated kick.
    initiator: bool,
    /// When the program first posted to the send queue.
    first_post: Option<Instant>,
    /// Something came from the peer: never kick again.
    heard: bool,
    /// Kicks sent.
    sent: u32,
}

impl Kicker {
    /// State for a new connection; `initiator` if this side connected.
    pub fn new(initiator: bool) -> Self {
        Self {
            initiator,
            ..Self::default()
        }
    }

    /// Whether this connection may still kick (cheap check for the post path).
    pub fn waiting_for_first_post(&self) -> bool {
        self.initiator && self.first_post.is_none()
    }

    /// The program posted a send-queue request at `now`.
    pub fn posted(&mut self, now: Instant) {
        if self.initiator && self.first_post.is_none() {
            self.first_post = Some(now);
        }
    }

    /// The peer's first message has arrived (a receive or Read response
    /// completed): no kick is needed any more.
    pub fn heard(&mut self) {
        self.heard = true;
    }

    /// Kicks sent so far.
    pub fn sent(&self) -> u32 {
        self.sent
    }

    /// Whether to send a kick at `now`; counts it if so.
    pub fn due(&mut self, now: Instant) -> bool {
        if !self.initiator || self.heard || self.sent >= MAX_KICKS {
            return false;
        }
        let Some(t0) = self.first_post else {
            return false;
        };
        // Kick k is due (2^(k+1) - 1) x KICK_AFTER after the first post.
        let wait = KICK_AFTER * ((1u32 << (self.sent + 1)) - 1);
        if now.duration_since(t0) < wait {
            return false;
        }
        self.sent += 1;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn initiator_kicks_at_1_3_7_seconds_then_stops() {
        let t0 = Instant::now();
        let mut k = Kicker::new(true);
        assert!(!k.due(t0 + Duration::from_secs(10)), "no post yet");
        k.posted(t0);
        k.posted(t0 + Duration::from_millis(500)); // the clock starts once
        assert!(!k.due(t0 + Duration::from_millis(999)));
        assert!(k.due(t0 + Duration::from_secs(1)));
        assert!(!k.due(t0 + Duration::from_secs(1)), "once per step");
        assert!(!k.due(t0 + Duration::from_millis(2999)));
        assert!(k.due(t0 + Duration::from_secs(3)));
        assert!(k.due(t0 + Duration::from_secs(7)));
        assert!(!k.due(t0 + Duration::from_secs(100)), "bounded");
        assert_eq!(k.sent(), MAX_KICKS);
    }

    #[test]
    fn an_answer_or_the_passive_role_means_no_kick() {
        let t0 = Instant::now();
        let mut k = Kicker::new(true);
        k.posted(t0);
        k.heard();
        assert!(!k.due(t0 + Duration::from_secs(5)));
        let mut p = Kicker::new(false);
        p.posted(t0);
        assert!(!p.waiting_for_first_post());
        assert!(!p.due(t0 + Duration::from_secs(5)));
    }

    #[test]
    fn only_the_kick_wr_id_on_an_empty_write_is_a_kick() {
        assert!(is_kick(KICK_WR_ID, true, 0));
        assert!(!is_kick(KICK_WR_ID, false, 0));
        assert!(!is_kick(KICK_WR_ID, true, 4));
        assert!(!is_kick(1, true, 0));
    }
}
