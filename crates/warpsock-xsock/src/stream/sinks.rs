//! A [`Stream`]'s sinks (SDP's ZCopy, see the [parent module](super)):
//! the peer's offers seen by the I/O side, and our own — posted, offered,
//! cancelled, released.

use super::{MySink, SinkState, Stream, PEER_SINKS_MAX};
use crate::wire::{Body, SinkAd};

impl Stream {
    /// Whether the peer offered a sink we have not finished (in use, or
    /// offered ahead of the stream: the next bytes up to its position go as
    /// DATA, the following ones into it).
    pub fn sink_offered(&self) -> bool {
        !self.peer_sinks.is_empty()
    }

    /// The tagged offsets (`to`) of the sinks and mappings the peer has
    /// announced and the books hold: a diagnostic (tests check that ours
    /// are not addresses of our memory).
    #[doc(hidden)]
    pub fn peer_tagged_offsets(&self) -> Vec<u64> {
        let sinks = self.peer_sinks.iter().map(|s| s.ad.to);
        sinks.chain(self.peer_maps.values().map(|m| m.to)).collect()
    }

    /// Whether a sink the peer offered is in use: the next bytes of a send
    /// call go straight into the reader's buffer.
    pub fn sink_ready(&self) -> bool {
        self.peer_sinks.front().is_some_and(|s| s.active)
    }

    /// Marks the first `n` unread bytes read; slots read to the end are
    /// freed (see [`Self::post_reposts`]).
    ///
    /// # Panics
    /// If fewer than `n` bytes are unread.
    pub fn consume(&mut self, mut n: usize) {
        assert!(n <= self.readable_bytes, "consume past the unread bytes");
        self.readable_bytes -= n;
        while n > 0 {
            let s = self.segs.front_mut().expect("bytes are unread");
            let k = n.min(s.len as usize);
            s.off += k as u32;
            s.len -= k as u32;
            n -= k;
            if s.len == 0 {
                let slot = s.slot;
                self.segs.pop_front();
                self.free(slot);
            }
        }
    }

    /// Whether a read that could offer a sink now should (call it once per
    /// such read; `false`: read the slots as usual). The I/O side asks only
    /// between the peer's send calls (never while [`Self::peer_mid_call`]):
    /// there the peer may be idle (the offer is filled) or already in its
    /// next call (declined), and only the offers' outcomes tell which.
    ///
    /// A sink is used only if no stream byte is in flight when it arrives;
    /// a reader that is behind the writer (a window of messages always on
    /// the way) has every offer declined, and each costs a SINK and a
    /// SINK_DONE — two Sends, two socket reads and a registration — for
    /// nothing (session 14: 0.56 such offers per MiB in the 1 MiB bench,
    /// one at most per writer's call, every one declined). So after `n`
    /// declines in a row only every `2^min(n, 4)`-th such read offers one
    /// (every 16th at most), and one filled sink brings back an offer per
    /// read: a reader that posts its reads ahead of the data keeps all of
    /// them placed.
    pub fn sink_due(&mut self) -> bool {
        if !self.sink_room() {
            return false;
        }
        let every = 1u32 << self.declines.min(4);
        self.passed += 1;
        if self.passed >= every {
            self.passed = 0;
            true
        } else {
            false
        }
    }

    /// Whether a sink offered now keeps the peer within [`PEER_SINKS_MAX`].
    /// A sink the stream declined (DATA past its position came first) is
    /// final to us at once, but the peer still holds it, or its SINK_DONE
    /// queued behind credits it may lack, until that answer arrives; a
    /// reader that offered again at each decline (an `aio_recv` posted
    /// ahead at every empty look, while the writer streams) made the peer
    /// hold five and fail the connection with `TooMany` (session 22:
    /// `test-xsock.sh`'s `aio` case, 2 runs in 4). So no offer while
    /// `PEER_SINKS_MAX - 1` of ours wait for their answers: the peer holds
    /// at most that many, one short of its bound. Asked at every offer (a
    /// `MSG_WAITALL` read may offer more than once in one call).
    pub fn sink_room(&self) -> bool {
        self.sinks
            .iter()
            .filter(|s| !s.state.is_final() || s.done_pending)
            .count()
            < PEER_SINKS_MAX - 1
    }

    /// Whether every sink offered is final: the peer can write into none
    /// (one outstanding at a time, [`Self::post_sink_after`]).
    pub fn sinks_final(&self) -> bool {
        self.sinks.iter().all(|s| s.state.is_final())
    }

    /// Offers a registered buffer (`stag`, tagged offset `to`, `len` bytes)
    /// for the next stream bytes. Only when nothing is unread, the stream
    /// has not ended and no other sink is outstanding. `waitall`: the
    /// sender fills it completely (`MSG_WAITALL`).
    ///
    /// # Panics
    /// If those conditions do not hold.
    pub fn post_sink(&mut self, stag: u32, to: u64, len: u32, waitall: bool) -> u32 {
        self.post_sink_after(0, stag, to, len, waitall)
    }

    /// [`Self::post_sink`] for the stream bytes that follow the next `skip`
    /// ones (a vectored read whose first buffers are small: they take the
    /// `skip` bytes, which come as DATA, and the large buffer after them
    /// is the sink). The sender sends DATA up to the sink's position, then
    /// writes into it; bytes it had sent past that position already make it
    /// decline, as for any sink.
    ///
    /// # Panics
    /// As [`Self::post_sink`].
    pub fn post_sink_after(
        &mut self,
        skip: u32,
        stag: u32,
        to: u64,
        len: u32,
        waitall: bool,
    ) -> u32 {
        assert!(
            self.segs.is_empty() && !self.eof && self.sinks_final(),
            "a sink only on an empty queue, one at a time"
        );
        debug_assert!(self.sink_room(), "a sink only with room at the peer");
        let id = self.next_sink;
        self.next_sink = self.next_sink.wrapping_add(1).max(1);
        let ad = SinkAd {
            id,
            len,
            rx_seq: self.rx_seq + u64::from(skip),
            stag,
            to,
            waitall,
        };
        self.sinks.push_back(MySink {
            ad,
            state: SinkState::Queued,
            done_pending: false,
            released: false,
        });
        self.out.push_back(Body::Sink(ad));
        id
    }

    /// What sink `id` has become.
    ///
    /// # Panics
    /// If `id` was released or never offered.
    pub fn sink_state(&self, id: u32) -> SinkState {
        self.sinks
            .iter()
            .find(|s| s.ad.id == id)
            .map(|s| s.state)
            .expect("a sink that is not released")
    }

    /// Withdraws sink `id` (the reader gives up). A sink not yet offered is
    /// declined at once; an offered one waits for the peer's SINK_DONE
    /// (which may still report bytes placed).
    pub fn cancel_sink(&mut self, id: u32) {
        let Some(s) = self.sinks.iter_mut().find(|s| s.ad.id == id) else {
            return;
        };
        match s.state {
            SinkState::Queued => {
                s.state = SinkState::Declined;
                self.out
                    .retain(|b| !matches!(b, Body::Sink(ad) if ad.id == id));
            }
            SinkState::Offered => {
                s.state = SinkState::Cancelling;
                self.out.push_back(Body::SinkCancel { id });
            }
            _ => {}
        }
    }

    /// The I/O side is done with sink `id`: its state is final, or the
    /// connection is dead (nothing can be placed any more). Forgets it
    /// (once its SINK_DONE, if still due, has arrived).
    pub fn release_sink(&mut self, id: u32) {
        if let Some(s) = self.sinks.iter_mut().find(|s| s.ad.id == id) {
            if !s.state.is_final() {
                s.state = SinkState::Declined;
                s.done_pending = false;
            }
            s.released = true;
        }
        self.sinks
            .retain(|s| !(s.released && s.state.is_final() && !s.done_pending));
    }
}
