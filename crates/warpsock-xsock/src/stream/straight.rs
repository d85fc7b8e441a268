//! The books of a send call of one small message, decided by one look
//! ([`Stream::tx_straight`]): what the general path
//! ([`Stream::tx_data`], then [`Stream::tx_end_call`] and the flush of
//! [`Stream::poll_msg`]) would do for it, when that is only to stamp one
//! DATA message.

use super::Stream;
use crate::wire::{Body, Msg};

impl Stream {
    /// The DATA message (the call's end: `eom`) that sends all `len` (> 0)
    /// bytes of a send call, when the books let it go as one message with
    /// nothing else to do around it; else `None` having changed nothing
    /// (the caller takes the general path). Exactly [`Self::tx_data`]'s
    /// `TxStep::Data` for `avail = len`, `eom = true` — what the socket's
    /// general loop asks for a call of `len` bytes — when:
    ///
    /// * nothing is queued (`out` empty: `tx_data` would answer `Control`
    ///   or `Blocked`), our end is not shut, and no earlier call was left
    ///   blocked (`tx_flags` 0: `tx_data` clears `TX_WAITING`, this does
    ///   not, so a call that finds it set goes the general path once);
    /// * no sink is offered (`tx_data` would write into an active one, or
    ///   stop DATA at one offered ahead; with none, [`Self::tx_end_call`]
    ///   has nothing to finish or decline);
    /// * a credit lets DATA go (`may_send`) and `len` fits one message:
    ///   the peer's receive slot and our own, whose size is our transmit
    ///   slots' (`XSocket::send_call` chunks a call at its transmit slot's
    ///   payload before `tx_data` caps it at the peer's: where ours are
    ///   smaller, a message of the peer's size posted from a transmit slot
    ///   would overrun it; review r17, item 1).
    ///
    /// Afterwards [`Self::owes_msg`] is false: `out` is still empty and
    /// the message returned every unreturned slot (`take_unreturned` takes
    /// them all: `unreturned` is at most our slot count, a `u16`), so the
    /// call's flush has nothing to send.
    #[inline]
    pub fn tx_straight(&mut self, len: usize) -> Option<Msg> {
        debug_assert!(len > 0);
        if self.tx_flags != 0
            || !self.out.is_empty()
            || !self.peer_sinks.is_empty()
            || !self.may_send()
            || len > self.peer.payload().min(self.local.payload())
        {
            return None;
        }
        let msg = self.stamp(Body::Data { eom: true });
        self.tx_seq += len as u64;
        debug_assert!(!self.owes_msg(), "a straight send left a message owed");
        Some(msg)
    }
}
