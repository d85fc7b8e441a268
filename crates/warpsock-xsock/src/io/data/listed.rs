//! The DATA messages of a copied send call of several messages (a
//! non-blocking write, or a blocking one below `WARPSOCK_ZCOPY_MIN`,
//! longer than a transmit slot), written in gathered `sendmsg`s (one for a
//! 1 MiB write) from the caller's buffers ([`Qp::send_gathered_list_news`](warpsock_engine::Qp::send_gathered_list_news)):
//! no copy into the transmit slots but of what the engine does not take.
//!
//! `send_call` collects each message it stamps ([`Listed::add`]) while
//! nothing else of the call is collected for the engine ahead of it
//! (`State::deferred` empty), and hands the list over
//! ([`XSocket::hand_over_listed`]) before anything else of the call goes
//! to the engine or into the send buffer, before it waits, and at its end
//! — so the connection's messages keep their order. Each message still
//! takes its transmit slot while listed, as a copied one does: the books
//! (`tx_free`, the loop's blocked test) are those of the copied path, and
//! a message the engine does not take (something queued ahead of the
//! list, too many FPDUs) is copied into its slot and posted then, in
//! order, behind those it took. Before, each such message was copied into
//! its slot first (a 1 MiB non-blocking write: 1 MiB copied a call that
//! TCP does not copy, issue 12); gathering each message in a `sendmsg` of
//! its own measured worse than the copy (session 44).

use smallvec::SmallVec;

use super::super::gather::{Gather, Src};
use super::super::socket::{State, XSocket};
use crate::wire::{Msg, HDR_LEN};

/// Messages of one list at most: with 256 KiB slots, 4 MiB, a write the
/// engine takes in about two (at most 64 FPDUs of ~64 KiB on loopback,
/// 4 MiB, each).
const LISTED_MAX: usize = 16;

/// One listed message: its header, its transmit slot, its bytes of the
/// call.
#[derive(Clone, Copy)]
struct Entry {
    m: Msg,
    hdr: [u8; HDR_LEN],
    slot: u32,
    off: usize,
    len: usize,
}

/// The messages a send call listed, not yet handed to the engine.
#[derive(Default)]
pub(crate) struct Listed {
    msgs: SmallVec<[Entry; LISTED_MAX]>,
}

impl Listed {
    /// Whether the list takes no more messages: hand it over first.
    pub(crate) fn full(&self) -> bool {
        self.msgs.len() == LISTED_MAX
    }

    /// Lists DATA message `m` of the call's bytes `src` (copied: no
    /// registered buffers), taking a free transmit slot for it, if a list
    /// may take it: the call collects its posts (`State::deferred` set)
    /// and has none collected yet, the message is at least `gather_min`
    /// bytes and the list has room. Returns false, having done nothing,
    /// otherwise: hand the list over, then post the message.
    pub(crate) fn add(&mut self, st: &mut State, gather_min: usize, m: Msg, src: &Src<'_>) -> bool {
        if src.mrs.is_some()
            || src.len < gather_min
            || self.msgs.len() == LISTED_MAX
            || !st.deferred.as_ref().is_some_and(|d| d.is_empty())
        {
            return false;
        }
        let Some(hdr) = m.data_header() else {
            return false;
        };
        let Some(slot) = st.tx_free.pop() else {
            return false;
        };
        self.msgs.push(Entry {
            m,
            hdr,
            slot,
            off: src.off,
            len: src.len,
        });
        true
    }
}

impl XSocket {
    /// Hands the messages of `list` (bytes of `g`, the call's) to the
    /// engine in gathered writes — as many as the engine takes in one
    /// (its bounds: 64 FPDUs, 4 MiB), then the rest in another while the
    /// socket took the last whole; those it does not take are copied into
    /// their slots and posted behind them (collected, as every post of
    /// the call: `State::deferred`). The slots of those it took are free
    /// again. The list is empty after.
    pub(crate) fn hand_over_listed(&self, st: &mut State, list: &mut Listed, g: &Gather<'_>) {
        if list.msgs.is_empty() {
            return;
        }
        // Nothing of the call went to the engine or was collected since
        // the list's first message (`Listed::add`, and every other step
        // of `send_call` hands the list over first): the list goes first.
        debug_assert!(st.deferred.as_ref().is_some_and(|d| d.is_empty()));
        let listed = std::mem::take(&mut list.msgs);
        let mut parts: SmallVec<[SmallVec<[&[u8]; 3]>; LISTED_MAX]> = SmallVec::new();
        for e in &listed {
            let mut p: SmallVec<[&[u8]; 3]> = SmallVec::new();
            p.push(&e.hdr);
            g.slices(e.off, e.len, |b| p.push(b));
            parts.push(p);
        }
        let msgs: SmallVec<[&[&[u8]]; LISTED_MAX]> = parts.iter().map(|p| &p[..]).collect();
        let mut done = 0;
        while done < listed.len() {
            let Some((taken, news)) = self.qp.send_gathered_list_news(&msgs[done..]) else {
                break;
            };
            let sent = &listed[done..done + taken];
            for e in sent {
                st.tx_free.push(e.slot);
            }
            // Copied: what the socket did not take, never more than the
            // payloads.
            let bytes: usize = sent.iter().map(|e| e.len).sum();
            self.sent_at_once(st, news, taken, (news.backlog as usize).min(bytes));
            done += taken;
            if news.backlog > 0 || news.events {
                break;
            }
        }
        for e in &listed[done..] {
            let src = Src {
                g,
                mrs: None,
                off: e.off,
                len: e.len,
            };
            self.post_copied(st, e.slot, e.m, src);
        }
    }
}
