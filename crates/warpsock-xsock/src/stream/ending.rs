//! The ends of a [`Stream`] (see the [parent module](super)): our end of
//! stream (`shutdown(SHUT_WR)`, `close`), what our close says of itself
//! (an EOF with `FLAG_CLOSED`, or the late word after a plain EOF), and
//! what the peer's close says: whether our bytes reached its closed
//! socket, which over TCP draws a reset.

use super::Stream;
use crate::stream::StreamError;
use crate::wire::{Body, Msg};

impl Stream {
    /// No more stream bytes from us (`shutdown(SHUT_WR)`, `close`): the
    /// EOF goes after everything sent so far; a sink in use is finished
    /// first, and sinks offered later are declined.
    pub fn shutdown_write(&mut self) {
        if self.tx_flags & Self::EOF_QUEUED != 0 {
            return;
        }
        self.tx_flags |= Self::EOF_QUEUED;
        if self.peer_sinks.front().is_some_and(|s| s.active) {
            self.finish_peer_sink(true);
        }
        self.settle_peer_sinks();
        self.out.push_back(if self.tx_flags & Self::CLOSING != 0 {
            self.closed_eof()
        } else {
            Body::Eof
        });
    }

    /// Our socket closes: our EOF says so ([`Body::Closed`]) — the one
    /// queued now or later, or one queued by a `shutdown(SHUT_WR)` that
    /// has not left yet. An EOF that left says nothing more (a second
    /// message would wait for a credit the peer need not return after
    /// our EOF, holding the close back): a word of its own says it, on
    /// a credit we hold (`closed_late`).
    pub fn mark_closing(&mut self) {
        self.tx_flags |= Self::CLOSING;
        let closed = self.closed_eof();
        if let Some(b) = self.out.iter_mut().find(|b| **b == Body::Eof) {
            *b = closed;
        } else if self.eof_sent() && self.late_close_sayable() {
            // Our EOF left plain (a `shutdown(SHUT_WR)` before): the
            // close says so in a word of its own ([`Self::closed_late`]).
            self.tx_flags |= Self::CLOSED_LATE_DUE;
        }
    }

    /// Our close's word after our EOF had left ([`Body::ClosedLate`], what
    /// we had received as [`Self::closed_eof`] says it), with the credit
    /// [`Self::mark_closing`] found: so that the peer tells its bytes that
    /// reach our closed socket, which its straight sends may make before
    /// it reads this (diffuzz's close race after a `SHUT_WR`, seeds 189
    /// and 465: the peer's `poll` never showed `POLLERR`), and fails its
    /// sends after it, as at TCP's closed socket.
    ///
    /// Said after the messages queued before it that may go
    /// ([`Self::poll_msg`]'s order: a SINK_DONE the peer's close waits
    /// for), and only while the peer's stream is
    /// open and we hold two credits at least
    /// ([`Self::late_close_sayable`]), else not at all: it would take our
    /// last, and a peer that sees us hold none returns credits after our
    /// EOF (`after_eof_return_due`), which a closed writer's orphaned
    /// socket answers with a reset (helper 74). Without them, the peer
    /// returns credits only as it reads our DATA, and the close would
    /// wait for that reader.
    #[cold]
    pub(super) fn closed_late(&mut self) -> Option<Msg> {
        self.tx_flags &= !Self::CLOSED_LATE_DUE;
        self.late_close_sayable().then(|| {
            self.stamp(Body::ClosedLate {
                received: self.rx_seq as u32,
            })
        })
    }

    /// Whether a late close ([`Body::ClosedLate`]) may be said now: the
    /// peer's stream open (once it ended, TCP's peer could send nothing
    /// either), its FIN not in, and two credits held (one left after it).
    fn late_close_sayable(&self) -> bool {
        !self.eof && !self.peer_fin && self.credits >= 2
    }

    /// The peer's word that it closed its socket after its EOF
    /// ([`Body::ClosedLate`]): as the close an EOF says
    /// ([`Self::peer_closed_with`]); before its EOF, a breach.
    #[cold]
    pub(super) fn on_closed_late(&mut self, received: u32) -> Result<(), StreamError> {
        if !self.eof {
            return Err(StreamError::ClosedLateBeforeEof);
        }
        self.peer_closed_with(Some(received));
        Ok(())
    }

    /// The peer closed its socket, having received `received` (the low
    /// 32 bits; `None`: not said): sends now draw TCP's reset, and ours
    /// past that count reached the closed socket.
    pub(super) fn peer_closed_with(&mut self, received: Option<u32>) {
        self.tx_flags |= Self::PEER_CLOSED;
        if received.is_some_and(|r| self.sent_beyond(r)) {
            self.tx_flags |= Self::SENT_INTO_CLOSE;
        }
    }

    /// Our close's EOF: it says what we had received (its low 32 bits),
    /// so that the peer tells its bytes that reached our closed socket
    /// ([`Self::sent_into_peer_close`]). Made as the close begins: what
    /// comes after it resets the connection here
    /// (`XSocket::data_after_shutdown`).
    fn closed_eof(&self) -> Body {
        Body::Closed {
            received: Some(self.rx_seq as u32),
        }
    }

    /// Whether stream bytes we sent are past `received`, the low 32 bits
    /// of the stream bytes the peer had received when it closed. Our bytes
    /// in flight are within the peer's window (its credits), so the low
    /// bits tell while that window is under 4 GiB (not told past it); a
    /// count past anything we sent is no one's (a lying peer: false).
    fn sent_beyond(&self, received: u32) -> bool {
        let window = u64::from(self.peer.slots) * self.peer.payload() as u64;
        let ahead = u64::from((self.tx_seq as u32).wrapping_sub(received));
        ahead != 0 && window < 1 << 32 && ahead <= window && ahead <= self.tx_seq
    }

    /// Whether stream bytes of ours reached the peer after it closed its
    /// socket, as its EOF says ([`Body::Closed`]'s `received`): sent
    /// before we knew of the close (no round read its EOF first: a send
    /// that goes straight), they met a closed socket, which over TCP
    /// answers them with a reset.
    pub fn sent_into_peer_close(&self) -> bool {
        self.tx_flags & Self::SENT_INTO_CLOSE != 0
    }

    /// Whether the peer's EOF said it closed its socket ([`Body::Closed`]):
    /// a send now is TCP's send to a closed socket, which draws a reset.
    pub fn peer_socket_closed(&self) -> bool {
        self.tx_flags & Self::PEER_CLOSED != 0
    }

    /// Whether our end of the stream is shut.
    pub fn is_write_shut(&self) -> bool {
        self.tx_flags & Self::EOF_QUEUED != 0
    }

    /// Whether our end of stream left (handed to the carrier: queued, and
    /// no longer waiting in the output for a credit).
    pub fn eof_sent(&self) -> bool {
        self.tx_flags & Self::EOF_QUEUED != 0
            && !self
                .out
                .iter()
                .any(|b| matches!(b, Body::Eof | Body::Closed { .. }))
    }
}
