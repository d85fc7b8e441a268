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

    /// Tells the peer a mapping is gone (`riounmap`).
    pub fn announce_unmap(&mut self, offset: u64) {
        self.out.push_back(Body::IoUnmap { offset });
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
