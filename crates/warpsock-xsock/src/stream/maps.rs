//! The one-sided access books of a [`Stream`]: the mappings we announce
//! to the peer (`riomap`/`riounmap`) and the look-up of those it announced
//! to us (moved out of `stream.rs`, past 900 lines).

use super::{MapError, Stream};
use crate::wire::{Body, IoMapAd, ACCESS_READ, ACCESS_WRITE};

impl Stream {
    /// Tells the peer about a local buffer it may access (`riomap`).
    pub fn announce_map(&mut self, ad: IoMapAd) {
        self.out.push_back(Body::IoMap(ad));
    }

    /// Tells the peer a mapping is gone (`riounmap`). Its announcement,
    /// if still queued, goes no more, and then neither does an unmap: the
    /// peer never heard of this mapping, and of an earlier one of the
    /// offset it hears the unmap queued ahead or heard it already
    /// (`riomap` refuses an offset mapped, so an earlier mapping was
    /// unmapped first). Otherwise the unmap goes, unless one of the offset
    /// is queued already. So a program that maps and unmaps in a loop
    /// while the peer returns no credits queues nothing for mappings the
    /// peer never heard of — with the library's offsets, each a new one
    /// (`riomap(-1)`), it queued an unmap a cycle without bound (helper
    /// 65's review; two messages a cycle before helper 33's). A queued
    /// unmap is never dropped: after map, unmap, map, unmap the peer kept
    /// the first mapping for good (helper 34's).
    pub fn announce_unmap(&mut self, offset: u64) {
        let before = self.out.len();
        self.out
            .retain(|b| !matches!(b, Body::IoMap(ad) if ad.offset == offset));
        if self.out.len() < before {
            return;
        }
        let queued = self
            .out
            .iter()
            .any(|b| matches!(b, Body::IoUnmap { offset: o } if *o == offset));
        if !queued {
            self.out.push_back(Body::IoUnmap { offset });
        }
    }

    /// Where `len` bytes at `offset` of the peer's mappings are: (STag,
    /// tagged offset), if a mapping the peer announced covers them and
    /// allows `write` (else read) access.
    pub fn peer_map(&self, offset: u64, len: u64, write: bool) -> Result<(u32, u64), MapError> {
        let (_, m) = self
            .peer_maps
            .range(..=offset)
            .next_back()
            .ok_or(MapError::NotMapped)?;
        let end = offset.checked_add(len).ok_or(MapError::NotMapped)?;
        if end > m.offset.saturating_add(m.len) {
            return Err(MapError::NotMapped);
        }
        let need = if write { ACCESS_WRITE } else { ACCESS_READ };
        if m.access & need == 0 {
            return Err(MapError::Access);
        }
        // The peer's tagged offset: wrapping, as the engine's sums over it.
        Ok((m.stag, m.to.wrapping_add(offset - m.offset)))
    }
}
