//! The credit books of a [`Stream`] (SDP's rule, see the [parent
//! module](super)): slots freed and their reposts, the returns owed to the
//! peer and when a CREDIT of our own is due, and whether we may send.

use super::Stream;
use crate::wire::{Body, Msg};

impl Stream {
    /// A message's slot is free (read, or never holding stream bytes):
    /// to be posted again, and creditable once it is
    /// ([`Self::post_reposts`]).
    pub(super) fn free(&mut self, slot: u32) {
        self.freed_trigger += 1;
        self.reposts.push(slot);
    }

    /// A CREDIT's slot is free: as [`Self::free`], but its return makes
    /// no CREDIT of our own due (see `trigger`).
    pub(super) fn free_credit(&mut self, slot: u32) {
        self.reposts.push(slot);
    }

    /// Posts the slots freed since the last call again: `post` gets them,
    /// in order, and posts them, answering `Err(k)` if only the first `k`
    /// were (a post that failed part-way: the engine's
    /// `BatchPostError::posted`). Only the slots posted count as
    /// returnable to the peer; the rest never are — they stay in `used`,
    /// so no CREDIT promises the peer a receive that does not exist
    /// (review r17, item 3: every slot handed out counted before, posted
    /// or not). Returns whether the post failed.
    ///
    /// A freed slot is creditable only once it is posted again (issue 12,
    /// design (b) of session 16's note): a message never returns a credit
    /// for a slot whose receive is not posted, which would let the peer's
    /// Send find no receive (siw terminates it). So the I/O side may leave
    /// freed slots to a later repost ([`Self::repost_due`]) and post them
    /// in a batch.
    #[inline]
    pub fn post_reposts(&mut self, post: impl FnOnce(&[u32]) -> Result<(), usize>) -> bool {
        let r = post(&self.reposts);
        let n = self.reposts.len() as u32;
        self.reposts.clear();
        match r {
            Ok(()) => {
                self.unreturned += n;
                self.trigger += self.freed_trigger;
                self.freed_trigger = 0;
                false
            }
            Err(k) => {
                self.reposted_part((k as u32).min(n));
                true
            }
        }
    }

    /// The slot freed last, by a DATA message read (`take_message`'s
    /// `free`), is posted again alone, ahead of any freed slots
    /// still waiting for theirs (`XSocket::repost`'s batch, which keeps
    /// its order): the predicted receive's, which the engine posts again
    /// in place (issue 12). Creditable at once, as [`Self::post_reposts`]
    /// makes its slots. The credit sums are the batch's: `unreturned` +
    /// the unposted and `trigger` + `freed_trigger` are what they would be
    /// had the slot joined the batch, so a CREDIT is due (`credit_due`,
    /// [`Self::repost_due`]'s ask) exactly when it would have been.
    #[inline]
    pub fn post_last_freed(&mut self, slot: u32) {
        let last = self.reposts.pop();
        debug_assert_eq!(last, Some(slot), "not the slot freed last");
        self.freed_trigger -= 1;
        self.unreturned += 1;
        self.trigger += 1;
    }

    /// [`Self::post_reposts`] of a post that posted only `k` slots: of
    /// them, as many as were freed by messages other than CREDIT, at most,
    /// make a CREDIT of our own due (`trigger`: which ones the order does
    /// not say, and a failed post fails the connection).
    #[cold]
    fn reposted_part(&mut self, k: u32) {
        self.unreturned += k;
        self.trigger += self.freed_trigger.min(k);
        self.freed_trigger = 0;
    }

    /// Whether the freed slots must be posted now ([`Self::post_reposts`])
    /// rather than left for a later repost: `false` only when leaving
    /// them changes nothing the peer could wait for. Now when
    /// - a batch is full: `return_every - 1` slots (the reposts of a
    ///   ping-pong's answers ride together; a batch never makes a CREDIT
    ///   due by itself, which needs `return_every` unreturned);
    /// - a CREDIT would be due with them counted (`credit_due` as if they
    ///   were posted): the peer short, or a quarter of the window held —
    ///   every return `poll_msg` would make today is made at once, so the
    ///   peer is never left shorter than without the batch;
    /// - we hold fewer than two credits: our last credit goes only with
    ///   a CREDIT (`may_send`), which counts posted slots only.
    ///
    /// With fewer than 12 slots the batch is one slot: no slot is left.
    /// Otherwise the I/O side must ask again wherever the answer may have
    /// changed: after every batch of completions it processes (an arrival
    /// that makes the peer short posts them), after reads, and wherever
    /// the books block a message of its own (`XSocket::repost_if_due`: our
    /// own sends may have taken `credits` below two since the last ask, and
    /// the last credit goes only with a CREDIT — review r17). The DATA
    /// sent meanwhile returns the slots posted before it. When this is `false`
    /// for slots of DATA (what the socket leaves: a reader's takes), the
    /// peer holds at least two credits (such a slot makes a CREDIT due
    /// when it holds fewer), so nothing it sends waits for them — with one
    /// exception, after the peer's EOF ([`Self::eof`]): a peer holding one
    /// credit that has sent nothing but CREDITs since its EOF gets no
    /// return (`Stream::after_eof_return_due`), so the slots stay
    /// unposted while it holds one. What it may send then is a CREDIT,
    /// which one credit allows, and a peer of this build with anything
    /// else queued sends one (`credit_due`'s case after our own
    /// EOF), after which it holds none and gets the return; once it sends
    /// anything else (a SINK, SINK_CANCEL, IOMAP, IOUNMAP: a half-closed
    /// peer still reading) the returns, and this rule, are as before its
    /// EOF. (An older half-closed peer at one credit whose first such
    /// message waits gets the slots with our next DATA.)
    #[inline]
    pub fn repost_due(&self) -> bool {
        let n = self.reposts.len() as u32;
        n != 0
            && (n + 1 >= self.return_every()
                || self.credits < 2
                || self.credit_due_with(self.unreturned + n, self.trigger + self.freed_trigger))
    }

    /// Freed slots not yet posted again ([`Self::post_reposts`]).
    pub fn unposted(&self) -> usize {
        self.reposts.len()
    }

    /// Freed slots that make a CREDIT of our own due: a quarter of the
    /// window (at least 2).
    ///
    /// A CREDIT travels alone on the reverse TCP direction, and Linux
    /// repairs a lost lone segment only by a loss probe after 2 RTT +
    /// `tcp_rto_min` (200 ms; `tcp_schedule_loss_probe`), not by fast
    /// retransmit, which needs later segments to be acknowledged. So a
    /// lost return must leave the peer enough credits to send us the
    /// messages that make the next return due: the next return's segment
    /// then follows the lost one, and its SACK repairs it in one RTT. With
    /// returns every half window the peer, which keeps its last credit for
    /// a message that returns credits, is left at most `slots / 2 - 1`
    /// sendable messages after a lost return of `slots / 2`: one short, and
    /// the stream stopped for the probe (session 12, `BENCHMARKS.md` §6:
    /// 11 probes in three 1 % loss runs, 0.49 GB/s). A quarter leaves a
    /// reader that keeps up `3 * slots / 4 - 1` more messages to come,
    /// room for the next return and then some.
    /// `tests/credit_loss.rs` holds back each of the reader's messages in
    /// turn and checks that another follows.
    fn return_every(&self) -> u32 {
        (u32::from(self.local.slots) / 4).max(2)
    }

    /// Whether a message other than CREDIT (DATA, a queued control
    /// message) may go: two credits at least. The last one is kept for a
    /// CREDIT (`credit_due`), so our reader can always give the peer its
    /// slots back. Before, DATA could take it when it carried a return:
    /// into a window whose reader does not read until its own send call
    /// ends (a one-thread program that sends, then reads), after which
    /// the slots our reader freed could never go back and both ends
    /// waited for ever, where TCP completes (review r19-xdead, item 1;
    /// `tests/stream.rs` `a_side_that_reads_after_its_sends_still_gets_them_out`).
    /// This rule alone does not save a client that pipelines ~30 small
    /// requests before it reads against a one-thread server: each blocks
    /// in a send once the other's slots are full of messages (one per
    /// slot). The socket layer's send buffer does (`Options::sndbuf`: the
    /// buffer, not the peer's slots, holds the sends past the credits,
    /// each call's end kept; `tests/pipeline.rs`).
    #[inline]
    pub(crate) fn may_send(&self) -> bool {
        self.credits >= 2
    }

    /// [`TxStep::Blocked`](super::TxStep::Blocked), noted: a send call
    /// waits for credits (`send_waits`).
    pub(super) fn blocked(&mut self) -> super::TxStep {
        self.tx_flags |= Self::TX_WAITING;
        super::TxStep::Blocked
    }

    /// Whether a message of ours waits for credits — a send call that
    /// `tx_data` blocked, or a queued control message — and a CREDIT would
    /// take one of the two it needs (we hold two at most). A send call
    /// that gave up waiting (a non-blocking call's `EAGAIN`, a timeout)
    /// still counts until the next call goes through `tx_data`.
    #[inline]
    fn send_waits(&self) -> bool {
        (self.tx_flags & Self::TX_WAITING != 0 || !self.out.is_empty()) && self.credits <= 2
    }

    fn take_unreturned(&mut self) -> u16 {
        let n = self.unreturned.min(u32::from(u16::MAX));
        self.unreturned -= n;
        self.trigger = self.trigger.min(self.unreturned);
        self.used -= n;
        n as u16
    }

    pub(super) fn stamp(&mut self, body: Body) -> Msg {
        self.credits -= 1;
        Msg {
            credits: self.take_unreturned(),
            body,
        }
    }

    /// Whether [`Self::poll_msg`] may have a message: something queued, or
    /// a credit return due now (`credit_due`, the very test `poll_msg`
    /// makes). When false,
    /// `poll_msg` gives `None` — after a DATA message, which returns every
    /// slot (a send call's end), and after a read that frees a slot whose
    /// credit rides on the next DATA (a ping-pong's answer: issue 12), so
    /// it is not asked.
    #[inline]
    pub fn owes_msg(&self) -> bool {
        // `trigger` only grows with `unreturned` and is clamped to it when
        // slots are returned: no slot unreturned, no credit due.
        debug_assert!(self.trigger <= self.unreturned, "trigger past unreturned");
        !self.out.is_empty()
            || (self.unreturned > 0 && self.credit_due())
            || self.tx_flags & Self::CLOSED_LATE_DUE != 0
    }

    /// Whether a CREDIT of our own is due now: the credit part of
    /// [`Self::poll_msg`], which asks it when nothing else is queued.
    ///
    /// Due when the peer cannot send data (fewer than two credits) and
    /// returning makes it able to, or — for slots of real messages only
    /// (see `trigger`) — when it has none at all or we hold a quarter of
    /// our slots' worth (`RETURN_EVERY`). A CREDIT we send is held by the
    /// peer until it has a real reason to answer, so with three or more
    /// slots two idle sides never trade CREDITs back and forth.
    ///
    /// Nor two busy ones. The rule: a return of CREDITs' slots alone
    /// (`trigger` 0) to a short peer is held back while a message of ours
    /// waits for the credit it would take (`send_waits`: a blocked send
    /// call, or a queued control message, and two credits at most) and we
    /// hold other messages of the peer's (`used > unreturned`: unread
    /// DATA). Without it, two ends whose readers hold all but two of each
    /// other's slots (message mode, each waiting for the end of a message
    /// longer than its window) traded CREDITs of one slot for ever: each
    /// CREDIT's arrival gave its receiver a second credit, spent at once
    /// on a CREDIT returning that one's slot to a peer now short in turn,
    /// before its blocked send call could use it — both ends busy,
    /// neither reader ever seeing the peer short (issue 12;
    /// `tests/msg_mode.rs`).
    ///
    /// Why it is enough: at two credits, held back, the credit goes to
    /// the waiting message, which carries the return (every message
    /// returns all unreturned slots), so the CREDIT was only ever a race
    /// with it. At one credit the waiting message cannot go anyway (it
    /// needs two), and the hold is safe for another reason: with our
    /// credits at one and nothing in flight, the peer holds all but one
    /// of its slots' worth of our messages unreturned, so once its reader
    /// reads them its return to us is due and not held (its `trigger` is
    /// above 0, or all it holds is unreturned) — and its own
    /// [`Self::msg_part_due`] is exactly "our credits at one or none": a
    /// hold at one credit waits only on a peer that does not read (review
    /// r20-xdead2b #4). And the peer is not left waiting for it: the DATA we hold is
    /// read once the peer is short ([`Self::msg_part_due`]), and the
    /// slots read make a return due that carries the CREDITs' slots too.
    /// With no message of ours waiting the return goes at once, so a
    /// message that fits the window arrives whole: a peer held short by
    /// our unreturned CREDITs' slots alone gets them back before its
    /// reader would have to take a part (review r19-xdead item 2; the
    /// term held them whenever DATA was held, and a one-way exchange's
    /// answer was read in two parts).
    ///
    /// (That term is `credit_due_with`'s first clause's alone — the
    /// others need `trigger` — and is left out of [`Self::repost_due`]'s
    /// ask, where it changes nothing: the slots left unposted there are
    /// reads', of DATA; CREDITs' slots are posted as they arrive.)
    ///
    /// One more case, after our own EOF has gone: holding one credit with
    /// a message queued (a SINK, SINK_CANCEL, IOMAP or IOUNMAP of a
    /// half-closed reader; it needs two), we spend the last on a CREDIT,
    /// empty if nothing is unreturned ([`Self::asks_after_own_eof`]) —
    /// once, until that message has gone (`asked_after_eof`).
    ///
    /// None once the carrier has the peer's FIN ([`Self::set_peer_fin`]):
    /// its TCP can send nothing more, and a CREDIT reaching its closed
    /// socket draws a reset.
    #[inline]
    pub(super) fn credit_due(&self) -> bool {
        !self.peer_fin && self.credit_due_any()
    }

    /// [`Self::credit_due`] whether or not the peer's FIN has arrived.
    #[inline]
    fn credit_due_any(&self) -> bool {
        (self.credit_due_with(self.unreturned, self.trigger)
            && (self.trigger > 0 || self.used == self.unreturned || !self.send_waits()))
            || (self.credits == 1
                && !self.out.is_empty()
                && !self.asked_after_eof
                && self.asks_after_own_eof())
    }

    /// Whether our EOF has gone (queued, and no longer in `out`): at one
    /// credit with a message queued behind it, [`Self::credit_due`] then
    /// spends that credit on a CREDIT. After our EOF the peer returns
    /// nothing to a peer holding one credit that has sent it nothing but
    /// CREDITs since ([`Self::after_eof_return_due`]: so that a writer
    /// that wrote, closed and exited draws no segment to its orphaned
    /// socket), which is how our first SINK, SINK_CANCEL, IOMAP or
    /// IOUNMAP after the EOF would wait for the peer's next DATA — for
    /// ever if it waits for that map, or until `sink_cancel_timeout`
    /// fails the connection (review r28-c, item 1). Holding none, we get
    /// the peer's next return (a peer holding no credit is returned to
    /// after its EOF too); an older peer returns at one credit anyway.
    /// Cold: asked only at one credit with a message queued.
    #[cold]
    fn asks_after_own_eof(&self) -> bool {
        self.eof_sent()
    }

    /// [`Self::credit_due`] with `unreturned` slots returnable, `trigger`
    /// of them from messages other than CREDIT.
    ///
    /// After the peer's end of stream ([`Self::eof`]) a return is due only
    /// if the peer holds no credit at all, has sent us messages other
    /// than CREDIT since (and holds one credit at most), or still owes us
    /// a SINK_DONE ([`Self::after_eof_return_due`]): a writer that only
    /// wrote sends no DATA after its EOF, so a CREDIT is of no use to it,
    /// and it may have exited since — its kernel's orphaned socket
    /// answers any segment with a reset, which drops what it had not sent
    /// yet (issue 12: a writer's `write; close; _exit(0)` left the reader
    /// 2 MiB of 4, then `ECONNRESET`, where TCP's reader only
    /// acknowledges).
    #[inline]
    fn credit_due_with(&self, unreturned: u32, trigger: u32) -> bool {
        let peer_has = u32::from(self.local.slots) - self.used;
        let due = (unreturned > 0 && peer_has <= 1 && peer_has + unreturned >= 2)
            || (trigger > 0 && (peer_has == 0 || unreturned >= self.return_every()));
        due && self.credits >= 1 && (!self.eof || self.after_eof_return_due(peer_has))
    }

    /// Whether a return [`Self::credit_due_with`] finds due may go after
    /// the peer's EOF:
    /// - the peer holds no credit (`peer_has` 0: it spent its last on a
    ///   CREDIT for our DATA, which a half-closed peer still reads);
    /// - it holds one at most and has sent a SINK, SINK_CANCEL, IOMAP or
    ///   IOUNMAP since its EOF (`rx_after_eof`): a half-closed peer still
    ///   reading and acting on our stream, whose next such message needs
    ///   two credits — held at one, its SINK_CANCEL never left and its
    ///   interrupted read failed the connection with `ETIMEDOUT` after
    ///   `sink_cancel_timeout` (review r28-c, item 1); its returns are
    ///   then as before the EOF rule, at one credit or none. A writer
    ///   that only wrote sends none of these after its EOF (its one
    ///   credit would do for a CREDIT, and our DATA returns its slots as
    ///   ever), so it still gets no return;
    /// - or it still owes the SINK_DONE of a sink we offered (its EOF
    ///   declined the sink, but the answer, queued behind the EOF, needs
    ///   two credits and ends the peer's own close).
    ///
    /// Cold: asked only after the EOF.
    #[cold]
    fn after_eof_return_due(&self, peer_has: u32) -> bool {
        peer_has == 0
            || (self.rx_after_eof && peer_has <= 1)
            || self.sinks.iter().any(|s| s.done_pending)
    }

    /// Whether the peer cannot send more stream bytes until some are read:
    /// it has no credit left, or one and (as far as we know) nothing to
    /// return with it. (A sink offered then is used: `XSocket`'s
    /// `sink_usable`.)
    pub fn peer_stalled(&self) -> bool {
        let peer_has = u32::from(self.local.slots) - self.used;
        peer_has == 0 || (peer_has == 1 && self.credits == u32::from(self.peer.slots))
    }

    /// Whether a message-mode reader that holds part of a message, not
    /// its end, must take the part now (the read returns it without
    /// `MSG_EOR`; the end comes with it later): the peer holds at most
    /// one credit, so it can send the rest only after a return from us —
    /// its last credit goes only with a CREDIT (`may_send`).
    ///
    /// Its own return would be of our messages that its application
    /// read, and it may never read them first: its reader may wait for the end of
    /// our own message longer than its window, holding our parts as we
    /// hold its (both ends sending at once, each sender down to its last
    /// credit: a deadlock, issue 12, `tests/stream.rs`
    /// `message_mode_both_ways_past_the_window`), or its one thread may be
    /// blocked in the send of this very message. [`Self::peer_stalled`]'s
    /// "one credit and we hold all ours" (the peer holds none of our
    /// messages) sees neither.
    ///
    /// Why it is enough: the reader takes every part it holds, and the
    /// slots freed make our return due (`credit_due`: the peer has at most
    /// one credit, and two with them), sent by the read's own flush with
    /// our last credit if need be (DATA never takes it: `may_send`), or
    /// carried by our next message; with
    /// it the peer sends on. Our own sends need no return from it: a peer
    /// holding our parts applies this rule too. What it costs: a message
    /// that needs the peer's last credit (`slots` parts, sent after a
    /// return) may come in two reads, and so may one sent while a send of
    /// ours waits for credits and we hold the peer's CREDITs unreturned
    /// (`credit_due` keeps those for our waiting message). Otherwise a
    /// part is taken only when the message does not fit the slots left to
    /// the peer: short with it unfinished, the peer first gets every
    /// return due to it, CREDITs' slots included (`tests/msg_parts.rs`
    /// `a_message_that_fits_is_read_whole_after_a_one_way_burst`).
    #[inline]
    pub fn msg_part_due(&self) -> bool {
        u32::from(self.local.slots) - self.used <= 1
    }

    /// Whether a message-mode reader may return the part of a message it
    /// holds (not its end) now: [`Self::msg_part_due`], or a peek saw
    /// those bytes as a part ([`Self::peeked_part`]) and they are not all
    /// read yet.
    ///
    /// `msg_part_due` turns false when our own message returns slots to
    /// the peer (a send of ours after the peek), and the bytes a peek
    /// returned would then wait for the message's end: a non-blocking
    /// read would fail with `EAGAIN`, a blocking one wait for the peer.
    /// TCP's rule is that what a peek returned, a read returns (review
    /// r19-xdead item 3). The latch needs no memory past the current
    /// message: it is a stream position, behind the read position once
    /// the peeked bytes are read.
    #[inline]
    pub fn msg_part_readable(&self) -> bool {
        self.msg_part_due() || self.rx_peeked > self.rx_seq - self.readable_bytes as u64
    }

    /// Whether a message-mode read of any size returns some of the bytes
    /// held now: the first message's end has arrived
    /// ([`Self::message_end`]), its part may be returned
    /// ([`Self::msg_part_readable`]), or the stream ended. A part that is
    /// none of these (the peer holds credits for the rest, and no peek saw
    /// it) is returned only to a buffer it fills. Each such part reaches
    /// one of these while the peer sends: its end arrives, or the peer
    /// runs short ([`Self::msg_part_due`], which only an arrival makes
    /// true). Walks the segments: asked where a poll asks, not after
    /// every call.
    pub fn msg_readable(&self) -> bool {
        self.msg_part_readable() || self.eof || self.message_end().is_some()
    }

    /// A message-mode peek returned the first `n` unread bytes as a part
    /// of a message (its end not among them) because the peer was short
    /// ([`Self::msg_part_due`]): they stay readable
    /// ([`Self::msg_part_readable`]) until read. (A peek that only filled
    /// its buffer latches nothing: the message is read whole unless the
    /// reader's buffer is smaller.)
    pub fn peeked_part(&mut self, n: usize) {
        let at = self.rx_seq - self.readable_bytes as u64 + n as u64;
        self.rx_peeked = self.rx_peeked.max(at);
    }
}
