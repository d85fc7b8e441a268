//! A message taken by a waiting reader as it lands ([`Stream::take_message`]),
//! and the admission every message passes first (shared with
//! [`Stream::on_message`]).

use super::{Stream, StreamError};
use crate::wire::{Body, Msg, HDR_LEN};

/// DATA a waiting reader took straight out of its slot
/// ([`Stream::take_message`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Taken {
    /// Where its stream bytes start in the message (after the header).
    pub off: usize,
    /// How many there are (all of them: the reader had room).
    pub len: usize,
    /// It ended one of the peer's send calls.
    pub eom: bool,
}

impl Stream {
    /// [`Self::on_message`] for a Send that lands while a reader waits
    /// with room for `room` bytes and nothing is unread: if it is DATA
    /// whose bytes (at least one) all fit — and end one of the peer's
    /// send calls, if `eom_only` — the books count them as received *and
    /// consumed* at once (credits, the peer's call boundary and its sinks
    /// as `on_message` tells them; the slot freed, see
    /// [`Self::post_reposts`]) and the reader copies them from the slot
    /// where [`Taken`] says. `None`: anything else (another kind, an
    /// empty or longer DATA, bytes already unread, a message `on_message`
    /// would reject), with nothing changed — hand it to `on_message` as
    /// usual.
    pub fn take_message(
        &mut self,
        slot: u32,
        bytes: &[u8],
        room: usize,
        eom_only: bool,
    ) -> Option<Taken> {
        self.take_inner(slot, bytes, room, eom_only, false)
    }

    /// [`Self::take_message`] of a message whose slot is posted again at
    /// once, alone (the predicted receive's, issue 12): the books are
    /// exactly those of `take_message` followed by
    /// [`Self::post_last_freed`] — the slot is not pushed on the reposts
    /// to be popped again, and `freed_trigger` not raised to be lowered:
    /// `unreturned` and `trigger` count it at once (as a call each, the
    /// push and the pop were ~25 instructions a take;
    /// `tests/predicted_books.rs` compares the two).
    #[inline]
    pub fn take_message_reposted(
        &mut self,
        slot: u32,
        bytes: &[u8],
        room: usize,
        eom_only: bool,
    ) -> Option<Taken> {
        self.take_inner(slot, bytes, room, eom_only, true)
    }

    /// [`Self::take_message`], and with `reposted`
    /// [`Self::take_message_reposted`].
    #[inline(always)]
    fn take_inner(
        &mut self,
        slot: u32,
        bytes: &[u8],
        room: usize,
        eom_only: bool,
        reposted: bool,
    ) -> Option<Taken> {
        if self.readable_bytes != 0 || bytes.len() <= HDR_LEN || bytes.len() - HDR_LEN > room {
            return None;
        }
        let Some(
            msg @ Msg {
                body: Body::Data { eom },
                ..
            },
        ) = Msg::parse_data(bytes)
        else {
            return None;
        };
        // What `admit` and `data_arrived` would reject is `on_message`'s
        // to report.
        if (eom_only && !eom)
            || self.eof
            || self.used >= u32::from(self.local.slots)
            || self.credits + u32::from(msg.credits) > u32::from(self.peer.slots)
        {
            return None;
        }
        let len = bytes.len() - HDR_LEN;
        self.admit(&msg).ok()?;
        self.data_arrived(len, eom).ok()?;
        if reposted {
            // `free` then `post_last_freed`: creditable at once.
            self.unreturned += 1;
            self.trigger += 1;
        } else {
            self.free(slot);
        }
        Some(Taken {
            off: HDR_LEN,
            len,
            eom,
        })
    }

    /// Counts a message into our slots and the credits it returns (every
    /// message, before its body is looked at).
    ///
    /// A message that finds every slot counted (a peer that sent without
    /// a credit) is an overrun and is not counted: `used` never exceeds
    /// `slots`, which the books' `slots - used` (the peer's credits as far
    /// as we know) rely on (review r19-xdead item 7: counted first, it
    /// underflowed there — a panic under the socket's lock in a debug
    /// build — before the Terminate went).
    pub(super) fn admit(&mut self, msg: &Msg) -> Result<(), StreamError> {
        if self.used >= u32::from(self.local.slots) {
            return Err(StreamError::Overrun {
                slots: self.local.slots,
            });
        }
        self.used += 1;
        let credits = self.credits + u32::from(msg.credits);
        if credits > u32::from(self.peer.slots) {
            return Err(StreamError::CreditOverflow {
                credits,
                slots: self.peer.slots,
            });
        }
        self.credits = credits;
        Ok(())
    }

    /// `len` stream bytes arrived as DATA (`eom`: ending one of the
    /// peer's send calls): the stream position, the peer's call boundary
    /// and the sinks they decline. Returns whether there were any (an
    /// empty DATA only marks the boundary).
    #[inline]
    pub(super) fn data_arrived(&mut self, len: usize, eom: bool) -> Result<bool, StreamError> {
        if self.eof {
            return Err(StreamError::DataAfterEof);
        }
        self.rx_mid_call = !eom;
        if len == 0 {
            return Ok(false);
        }
        self.sinks_declined_by_stream(Some(self.rx_seq + len as u64));
        self.rx_seq += len as u64;
        Ok(true)
    }
}
