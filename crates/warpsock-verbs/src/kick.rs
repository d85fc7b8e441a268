//! The initiator's "kick" past Linux siw's accept race (sans-IO: time is
//! passed in; the queue pair posts the Write, the context's notifier asks
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
//! On a connection this side initiated, the notifier samples two counters
//! every [`crate::ctx::WATCH`]: requests the program has posted to the send
//! queue, and receives and RDMA Read responses completed (what the peer
//! sent). A post with no new completion after it starts a wait; a new
//! completion ends it. When a wait reaches [`KICK_AFTER`], the queue pair
//! sends a zero-length RDMA Write to STag 1, TO 0 — the frame siw itself
//! sends as its peer-to-peer RTR, and which RFC 5040 responders (siw, and
//! warpsock's `warpsock-proto`) accept without an STag check because it
//! places nothing. Its arrival makes siw read the stalled FPDU.
//!
//! The wait is measured from the program's latest unanswered post, and a
//! message from the peer restarts it rather than ending it: a peer may
//! well send on its own (rsockets' server sends its credits as soon as it
//! waits for data) while our FPDUs sit unread in siw's socket, so
//! "something came" does not prove that the peer read what we sent. Seen
//! with siw's rstream server: our client posted two messages (Write +
//! Send each), siw's credit update came 35 ms later, and 128 of our bytes
//! then sat in siw's socket (its `Recv-Q`) while rsockets spun in
//! `ibv_poll_cq` for an answer that could not come; ending the wait on
//! that credit update suppressed the kick (1 run in 6). A ping-pong whose
//! answers keep coming keeps restarting the wait and never kicks; a
//! connection that goes quiet after the program posted spends its kicks
//! (three empty frames at most). A kick is unsignalled (a program never
//! sees it; a flushed one is dropped by [`is_kick`]) and bounded: at most
//! [`MAX_KICKS`] per connection, each wait twice as long as the previous
//! (1 s, 2 s, 4 s). A one-way sender that never hears anything (an RDMA
//! Write stream) spends its kicks in its first 7 s: three empty frames.
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
    /// Posts and completions from the peer at the last sample.
    posted: u64,
    heard: u64,
    /// Since when the latest post has gone unanswered.
    waiting_since: Option<Instant>,
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

    /// Kicks sent so far.
    pub fn sent(&self) -> u32 {
        self.sent
    }

    /// A sample at `now` of the requests posted so far and the receives
    /// and Read responses completed so far. Whether to send a kick now
    /// (counted if so).
    pub fn due(&mut self, now: Instant, posted: u64, heard: u64) -> bool {
        if !self.initiator || self.sent >= MAX_KICKS {
            return false;
        }
        if heard != self.heard {
            self.heard = heard;
            // Restarts (never ends) a wait: see the module doc.
            if self.waiting_since.is_some() {
                self.waiting_since = Some(now);
            }
        }
        if posted != self.posted {
            self.posted = posted;
            self.waiting_since.get_or_insert(now);
        }
        let Some(since) = self.waiting_since else {
            return false;
        };
        if now.duration_since(since) < KICK_AFTER * (1u32 << self.sent) {
            return false;
        }
        self.sent += 1;
        // The next wait starts now and is twice as long.
        self.waiting_since = Some(now);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(t0: Instant, ms: u64) -> Instant {
        t0 + Duration::from_millis(ms)
    }

    #[test]
    fn an_unanswered_post_kicks_at_1_3_7_seconds_then_stops() {
        let t0 = Instant::now();
        let mut k = Kicker::new(true);
        assert!(!k.due(at(t0, 10_000), 0, 0), "nothing posted");
        assert!(!k.due(t0, 1, 0));
        assert!(
            !k.due(at(t0, 500), 2, 0),
            "a second post does not restart the wait"
        );
        assert!(!k.due(at(t0, 999), 2, 0));
        assert!(k.due(at(t0, 1000), 2, 0));
        assert!(!k.due(at(t0, 1020), 2, 0), "once per wait");
        assert!(!k.due(at(t0, 2999), 2, 0));
        assert!(k.due(at(t0, 3000), 2, 0));
        assert!(k.due(at(t0, 7000), 2, 0));
        assert!(!k.due(at(t0, 100_000), 2, 0), "bounded");
        assert_eq!(k.sent(), MAX_KICKS);
    }

    #[test]
    fn a_message_from_the_peer_after_our_posts_restarts_the_wait_instead_of_ending_it() {
        // siw's rstream server (the stall, 1 run in 6): we post two
        // messages (Write + Send each), siw's credit update arrives 35 ms
        // later, our bytes sit unread in siw's socket, nothing more comes.
        let t0 = Instant::now();
        let mut k = Kicker::new(true);
        assert!(!k.due(t0, 4, 0), "two Write + Send pairs posted");
        assert!(!k.due(at(t0, 40), 4, 1), "the peer's credit update");
        assert!(
            !k.due(at(t0, 1039), 4, 1),
            "1 s counts from the last message"
        );
        assert!(k.due(at(t0, 1040), 4, 1), "quiet for 1 s after it: kick");
        // The kick's answer restarts the wait once more; answers that keep
        // coming keep it from ever running out.
        assert!(!k.due(at(t0, 1060), 4, 2));
        assert!(!k.due(at(t0, 3059), 4, 2));
        assert!(
            k.due(at(t0, 3060), 4, 2),
            "still quiet: the second kick, 2 s on"
        );
    }

    #[test]
    fn answers_keep_restarting_the_wait_and_an_early_message_from_the_peer_does_not_prevent_it() {
        let t0 = Instant::now();
        let mut k = Kicker::new(true);
        // The peer sends first (rsockets' credits), then we post and
        // hear nothing more: siw's race. Still a kick after 1 s.
        assert!(!k.due(t0, 0, 1));
        assert!(!k.due(at(t0, 20), 1, 1));
        assert!(k.due(at(t0, 1020), 1, 1));
        // A ping-pong whose answers come in time never kicks.
        let mut p = Kicker::new(true);
        for i in 0..200u64 {
            assert!(!p.due(at(t0, i * 20), i + 1, i));
        }
        // The passive side never kicks.
        let mut s = Kicker::new(false);
        assert!(!s.due(t0, 1, 0));
        assert!(!s.due(at(t0, 5000), 1, 0));
    }

    #[test]
    fn only_the_kick_wr_id_on_an_empty_write_is_a_kick() {
        assert!(is_kick(KICK_WR_ID, true, 0));
        assert!(!is_kick(KICK_WR_ID, false, 0));
        assert!(!is_kick(KICK_WR_ID, true, 4));
        assert!(!is_kick(1, true, 0));
    }
}
