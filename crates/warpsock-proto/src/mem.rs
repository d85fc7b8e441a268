//! Protection domains and memory regions: the STag table (siw `siw_mem.c`).
//!
//! An STag is `index << 8 | key`: the index selects a slot in the table and
//! the 8-bit key, chosen by the owner, must match. Each region belongs to a
//! protection domain, has an address range `[iova, iova + len)` and access
//! rights. Tagged offsets (TO) are addresses in that range, as with verbs'
//! virtually addressed regions.
//!
//! The table owns only metadata plus a *backing* (`B`) per region: whatever
//! gives the bytes. In-memory tests use `Vec<u8>`; the socket engine uses a
//! handle on caller memory. The core reads and writes region bytes only
//! through [`Backing`], and only inside ranges [`Registry::check`] approved,
//! so nothing outside a registered region is ever touched.

use std::fmt;

/// A steering tag: `index << 8 | key`.
pub type Stag = u32;

/// A protection domain handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PdId(pub u32);

/// Index of a region in the table (`stag >> 8`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RegionId(pub u32);

/// Access rights of a region (bit set, as `ibv_access_flags`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Access(pub u8);

impl Access {
    /// Local read (always implied for local gather).
    pub const LOCAL_READ: Self = Self(0);
    /// The local side may write (receives, Read sinks).
    pub const LOCAL_WRITE: Self = Self(1);
    /// The peer may RDMA Write.
    pub const REMOTE_WRITE: Self = Self(2);
    /// The peer may RDMA Read.
    pub const REMOTE_READ: Self = Self(4);
    /// The peer may invalidate the STag with Send with Invalidate.
    pub const REMOTE_INVALIDATE: Self = Self(8);
    /// Every right.
    pub const ALL: Self = Self(15);

    /// Whether every right in `other` is granted.
    pub const fn contains(self, other: Self) -> bool {
        self.0 & other.0 == other.0
    }
}

impl std::ops::BitOr for Access {
    type Output = Self;
    fn bitor(self, rhs: Self) -> Self {
        Self(self.0 | rhs.0)
    }
}

/// Bytes of a registered region.
pub trait Backing {
    /// The region's bytes.
    fn bytes(&self) -> &[u8];
    /// The region's bytes, writable.
    fn bytes_mut(&mut self) -> &mut [u8];
}

impl Backing for Vec<u8> {
    fn bytes(&self) -> &[u8] {
        self
    }
    fn bytes_mut(&mut self) -> &mut [u8] {
        self
    }
}

/// Why an STag/range check failed (siw `enum siw_access_state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MemError {
    /// No region with that index, wrong key, or invalidated.
    InvalidStag,
    /// The range is not inside the region.
    BaseBounds,
    /// The region lacks the needed right.
    Access,
    /// The region belongs to another protection domain.
    PdMismatch,
    /// `to + len` overflows 64 bits.
    ToWrap,
}

impl fmt::Display for MemError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::InvalidStag => "invalid STag",
            Self::BaseBounds => "base or bounds violation",
            Self::Access => "access rights violation",
            Self::PdMismatch => "STag not in this protection domain",
            Self::ToWrap => "tagged offset wraps",
        })
    }
}

impl std::error::Error for MemError {}

/// Metadata of one region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RegionInfo {
    /// Owning protection domain.
    pub pd: PdId,
    /// Full STag.
    pub stag: Stag,
    /// First address.
    pub iova: u64,
    /// Length in bytes.
    pub len: u64,
    /// Rights.
    pub access: Access,
    /// False once invalidated.
    pub valid: bool,
}

struct Slot<B> {
    info: RegionInfo,
    backing: B,
    /// The region's prefix the peer's RDMA Writes have placed, in order
    /// from its start ([`Registry::note_remote_write`]).
    written: u64,
    /// Which registration of the slot this is ([`Range::serial`]).
    serial: u32,
}

/// The STag table with protection domains.
pub struct Registry<B> {
    slots: Vec<Option<Slot<B>>>,
    free: Vec<u32>,
    next_pd: u32,
    /// The next registration's [`Range::serial`].
    next_serial: u32,
}

impl<B> fmt::Debug for Registry<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Registry")
            .field("regions", &self.slots.iter().flatten().count())
            .finish()
    }
}

impl<B: Backing> Default for Registry<B> {
    fn default() -> Self {
        Self::new()
    }
}

/// A checked range inside a region.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Range {
    /// The region's STag (its index is `stag >> 8`).
    pub stag: Stag,
    /// Offset from the region's start.
    pub offset: u64,
    /// Length.
    pub len: u64,
    /// The registration [`Registry::check`] found the range in. A freed
    /// slot is reused at once (last freed, first reused) and the engine
    /// draws 8-bit keys at random, so one registration in 256 repeats the
    /// STag of the slot's last one; a range checked in the old region and
    /// used after (a Write's payload a peer withholds past the region's
    /// end, a Read Response queued behind a closed window) would reach the
    /// new region, which granted the peer nothing. The `range_*` look-ups
    /// find only the registration the range was checked in. (siw keeps
    /// the old region referenced while a placement or Response holds it:
    /// `siw_mem_get`/`siw_mem_put` in `siw_qp_rx.c`/`siw_qp_tx.c`.)
    pub serial: u32,
}

impl Range {
    /// The region index this range lies in.
    pub const fn region(&self) -> RegionId {
        RegionId(self.stag >> 8)
    }
}

impl<B: Backing> Registry<B> {
    /// An empty table. Index 0 is never handed out, so STag 0 (and the
    /// RTR STag 1, which has index 0) never names a region.
    pub fn new() -> Self {
        Self {
            slots: vec![None],
            free: Vec::new(),
            next_pd: 1,
            next_serial: 0,
        }
    }

    /// Allocates a protection domain.
    pub fn alloc_pd(&mut self) -> PdId {
        let pd = PdId(self.next_pd);
        self.next_pd += 1;
        pd
    }

    /// Registers `backing` as a region at `iova` with `access`, owned by `pd`,
    /// with the STag key `key`. Returns the STag.
    pub fn register(&mut self, pd: PdId, iova: u64, backing: B, access: Access, key: u8) -> Stag {
        let len = backing.bytes().len() as u64;
        let index = match self.free.pop() {
            Some(i) => i,
            None => {
                self.slots.push(None);
                (self.slots.len() - 1) as u32
            }
        };
        let stag = (index << 8) | u32::from(key);
        let serial = self.next_serial;
        self.next_serial = serial.wrapping_add(1);
        self.slots[index as usize] = Some(Slot {
            info: RegionInfo {
                pd,
                stag,
                iova,
                len,
                access,
                valid: true,
            },
            backing,
            written: 0,
            serial,
        });
        stag
    }

    /// Removes a region, returning its backing.
    pub fn deregister(&mut self, stag: Stag) -> Option<B> {
        let index = (stag >> 8) as usize;
        match self.slots.get(index) {
            Some(Some(s)) if s.info.stag == stag => {}
            _ => return None,
        }
        let slot = self.slots[index].take()?;
        self.free.push(index as u32);
        Some(slot.backing)
    }

    /// Metadata of a live region.
    pub fn info(&self, stag: Stag) -> Option<RegionInfo> {
        match self.slots.get((stag >> 8) as usize) {
            Some(Some(s)) if s.info.stag == stag => Some(s.info),
            _ => None,
        }
    }

    /// Notes a peer's RDMA Write placed at `r` (checked by [`Self::check`],
    /// its payload in and its CRC good): the region's written prefix grows
    /// when the Write starts at or before its end. A sender that writes a buffer in order
    /// from its start (as a sink's writer must) keeps the prefix equal to
    /// what it wrote; one that skips bytes leaves the prefix at the gap.
    /// For a consumer that must not take a peer's word for how much it
    /// wrote (a sink's SINK_DONE; issue 12, session 35's review).
    pub fn note_remote_write(&mut self, r: &Range) {
        if let Some(Some(s)) = self.slots.get_mut((r.stag >> 8) as usize) {
            if s.info.stag == r.stag && s.serial == r.serial && r.offset <= s.written {
                s.written = s.written.max(r.offset.saturating_add(r.len));
            }
        }
    }

    /// The prefix of a live region the peer's RDMA Writes have placed in
    /// order from its start ([`Self::note_remote_write`]).
    pub fn remote_written(&self, stag: Stag) -> Option<u64> {
        match self.slots.get((stag >> 8) as usize) {
            Some(Some(s)) if s.info.stag == stag => Some(s.written),
            _ => None,
        }
    }

    /// Takes `rights` from a region (a socket layer's close: a mapping
    /// the peer may read stays readable, no longer writable). Nothing if
    /// `stag` names no region.
    pub fn revoke(&mut self, stag: Stag, rights: Access) {
        if let Some(Some(s)) = self.slots.get_mut((stag >> 8) as usize) {
            if s.info.stag == stag {
                s.info.access = Access(s.info.access.0 & !rights.0);
            }
        }
    }

    /// Marks an STag invalid (Send with Invalidate, local invalidate).
    /// Fails with [`MemError::InvalidStag`] if it names no valid region,
    /// [`MemError::PdMismatch`] for another domain, [`MemError::Access`]
    /// if `remote` and the region does not allow remote invalidation.
    pub fn invalidate(&mut self, pd: PdId, stag: Stag, remote: bool) -> Result<(), MemError> {
        let slot = match self.slots.get_mut((stag >> 8) as usize) {
            Some(Some(s)) if s.info.stag == stag && s.info.valid => s,
            _ => return Err(MemError::InvalidStag),
        };
        if slot.info.pd != pd {
            return Err(MemError::PdMismatch);
        }
        if remote && !slot.info.access.contains(Access::REMOTE_INVALIDATE) {
            return Err(MemError::Access);
        }
        slot.info.valid = false;
        Ok(())
    }

    /// Makes an invalidated STag valid again (re-registration in place).
    pub fn revalidate(&mut self, stag: Stag) -> bool {
        match self.slots.get_mut((stag >> 8) as usize) {
            Some(Some(s)) if s.info.stag == stag => {
                s.info.valid = true;
                true
            }
            _ => false,
        }
    }

    /// Checks that `[addr, addr + len)` of `stag` may be used by `pd` with
    /// `access` (siw `siw_check_mem`): STag, PD, rights, bounds, in that order.
    /// Inlined: a receive's straight and predicted paths check their
    /// buffer per Send (as a call, ~34 instructions a take; issue 12).
    #[inline(always)]
    pub fn check(
        &self,
        pd: PdId,
        stag: Stag,
        addr: u64,
        len: u64,
        access: Access,
    ) -> Result<Range, MemError> {
        self.check_backing(pd, stag, addr, len, access)
            .map(|(r, _)| r)
    }

    /// [`Self::check`], and the region's backing found by the same look-up:
    /// what [`Self::slice`] would look up again (the predicted receive
    /// checks its buffer and copies into it per Send; issue 12).
    #[inline(always)]
    pub fn check_backing(
        &self,
        pd: PdId,
        stag: Stag,
        addr: u64,
        len: u64,
        access: Access,
    ) -> Result<(Range, &B), MemError> {
        // Looked at in place, not copied out (the receive's straight path
        // checks its buffer per Send).
        let slot = match self.slots.get((stag >> 8) as usize) {
            Some(Some(s)) if s.info.stag == stag && s.info.valid => s,
            _ => return Err(MemError::InvalidStag),
        };
        let info = &slot.info;
        if info.pd != pd {
            return Err(MemError::PdMismatch);
        }
        if !info.access.contains(access) {
            return Err(MemError::Access);
        }
        let end = addr.checked_add(len).ok_or(MemError::ToWrap)?;
        // Saturating: a region registered at an iova whose end passes
        // 2^64 (`ibv_reg_mr_iova2` takes any) ends at the top of the
        // space, not wrapped below its start (helper 68's review: the
        // sum overflowed, a panic where overflow is checked).
        if addr < info.iova || end > info.iova.saturating_add(info.len) {
            return Err(MemError::BaseBounds);
        }
        Ok((
            Range {
                stag,
                offset: addr - info.iova,
                len,
                serial: slot.serial,
            },
            &slot.backing,
        ))
    }

    /// Bytes `[offset, offset + len)` of the live region `stag`, or `None`
    /// if the region is gone (deregistered since it was checked) or the
    /// range does not fit. Validity and rights are not re-checked: this is
    /// for ranges [`Self::check`] approved earlier. Always inlined, as
    /// `check`: the predicted receive asks it per Send (the preload's
    /// build left it a call).
    #[inline(always)]
    pub fn slice(&self, stag: Stag, offset: u64, len: usize) -> Option<&[u8]> {
        let slot = match self.slots.get((stag >> 8) as usize) {
            Some(Some(s)) if s.info.stag == stag => s,
            _ => return None,
        };
        let start = usize::try_from(offset).ok()?;
        slot.backing.bytes().get(start..start.checked_add(len)?)
    }

    /// Writable variant of [`Self::slice`].
    pub fn slice_mut(&mut self, stag: Stag, offset: u64, len: usize) -> Option<&mut [u8]> {
        let slot = match self.slots.get_mut((stag >> 8) as usize) {
            Some(Some(s)) if s.info.stag == stag => s,
            _ => return None,
        };
        let start = usize::try_from(offset).ok()?;
        slot.backing
            .bytes_mut()
            .get_mut(start..start.checked_add(len)?)
    }

    /// The live registration `r` was checked in (not another one in its
    /// slot under the same STag: [`Range::serial`]).
    #[inline(always)]
    fn range_slot(&self, r: &Range) -> Option<&Slot<B>> {
        // Not the STag alone: a peer that withholds a Write's payload (or
        // a Response behind its window) past the region's end must not
        // reach the next registration that draws the same key (RFC 5040
        // §8.1 / RFC 5042 §5.2: an STag grants access to one region; siw
        // holds the old one referenced instead).
        match self.slots.get((r.stag >> 8) as usize) {
            Some(Some(s)) if s.info.stag == r.stag && s.serial == r.serial => Some(s),
            _ => None,
        }
    }

    /// Bytes `[r.offset, r.offset + len)` of the region `r` was checked
    /// in, or `None` if that region is gone — deregistered, even with
    /// another registered in its slot under the same STag since
    /// ([`Range::serial`]) — or the range does not fit. What the receive
    /// and transmit paths read a checked range through.
    #[inline(always)]
    pub fn range_slice(&self, r: &Range, len: usize) -> Option<&[u8]> {
        let start = usize::try_from(r.offset).ok()?;
        self.range_slot(r)?
            .backing
            .bytes()
            .get(start..start.checked_add(len)?)
    }

    /// Writable variant of [`Self::range_slice`]: where payload is placed.
    #[inline(always)]
    pub fn range_slice_mut(&mut self, r: &Range, len: usize) -> Option<&mut [u8]> {
        let start = usize::try_from(r.offset).ok()?;
        let slot = match self.slots.get_mut((r.stag >> 8) as usize) {
            Some(Some(s)) if s.info.stag == r.stag && s.serial == r.serial => s,
            _ => return None,
        };
        slot.backing
            .bytes_mut()
            .get_mut(start..start.checked_add(len)?)
    }

    /// Backing of the region `r` was checked in ([`Self::range_slice`]'s
    /// look-up), for an engine that places several ranges at once.
    pub fn range_backing(&self, r: &Range) -> Option<&B> {
        self.range_slot(r).map(|s| &s.backing)
    }

    /// Backing of a region by STag (for tests and the engine).
    pub fn backing(&self, stag: Stag) -> Option<&B> {
        match self.slots.get((stag >> 8) as usize) {
            Some(Some(s)) if s.info.stag == stag => Some(&s.backing),
            _ => None,
        }
    }

    /// Writable backing of a region by STag.
    pub fn backing_mut(&mut self, stag: Stag) -> Option<&mut B> {
        match self.slots.get_mut((stag >> 8) as usize) {
            Some(Some(s)) if s.info.stag == stag => Some(&mut s.backing),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stag_layout_and_checks() {
        let mut r: Registry<Vec<u8>> = Registry::new();
        let pd = r.alloc_pd();
        let other = r.alloc_pd();
        let s = r.register(pd, 0x1000, vec![0; 100], Access::REMOTE_WRITE, 0x5a);
        assert_eq!(s & 0xff, 0x5a);
        assert_eq!(s >> 8, 1);
        let ok = r.check(pd, s, 0x1010, 16, Access::REMOTE_WRITE).unwrap();
        assert_eq!((ok.region(), ok.offset, ok.len), (RegionId(1), 0x10, 16));
        assert_eq!(r.slice(s, 0x10, 4), Some(&[0u8; 4][..]));
        assert!(r.slice(s, 98, 4).is_none());
        assert_eq!(
            r.check(pd, s ^ 1, 0x1000, 1, Access::REMOTE_WRITE),
            Err(MemError::InvalidStag)
        );
        assert_eq!(
            r.check(other, s, 0x1000, 1, Access::REMOTE_WRITE),
            Err(MemError::PdMismatch)
        );
        assert_eq!(
            r.check(pd, s, 0x1000, 1, Access::REMOTE_READ),
            Err(MemError::Access)
        );
        assert_eq!(
            r.check(pd, s, 0xfff, 1, Access::REMOTE_WRITE),
            Err(MemError::BaseBounds)
        );
        assert_eq!(
            r.check(pd, s, 0x1060, 5, Access::REMOTE_WRITE),
            Err(MemError::BaseBounds)
        );
        assert_eq!(
            r.check(pd, s, u64::MAX, 2, Access::REMOTE_WRITE),
            Err(MemError::ToWrap)
        );
        assert!(r.check(pd, s, 0x1064, 0, Access::REMOTE_WRITE).is_ok());
        assert_eq!(r.invalidate(pd, s, true), Err(MemError::Access));
        assert_eq!(r.invalidate(other, s, false), Err(MemError::PdMismatch));
        r.invalidate(pd, s, false).unwrap();
        assert_eq!(
            r.check(pd, s, 0x1000, 1, Access::REMOTE_WRITE),
            Err(MemError::InvalidStag)
        );
        assert!(r.revalidate(s));
        assert!(r.deregister(s).is_some());
        assert!(r.info(s).is_none());
        let s2 = r.register(pd, 0, vec![0; 4], Access::ALL, 1);
        assert_eq!(s2 >> 8, 1, "slot reused");
        assert_eq!(
            r.check(pd, s, 0, 1, Access::LOCAL_READ),
            Err(MemError::InvalidStag)
        );
    }

    /// A region whose iova is near the top of the space (its end past
    /// 2^64: `ibv_reg_mr_iova2` takes any) is checked without overflow:
    /// its bytes up to the top are in bounds, nothing below its start is.
    #[test]
    fn a_region_at_the_top_of_the_space_checks_without_overflow() {
        let mut r: Registry<Vec<u8>> = Registry::new();
        let pd = r.alloc_pd();
        let iova = u64::MAX - 9;
        let s = r.register(pd, iova, vec![0; 100], Access::REMOTE_WRITE, 1);
        let ok = r.check(pd, s, iova + 2, 7, Access::REMOTE_WRITE).unwrap();
        assert_eq!((ok.offset, ok.len), (2, 7));
        assert_eq!(
            r.check(pd, s, iova - 1, 4, Access::REMOTE_WRITE),
            Err(MemError::BaseBounds)
        );
        assert_eq!(
            r.check(pd, s, iova, 11, Access::REMOTE_WRITE),
            Err(MemError::ToWrap)
        );
    }

    #[test]
    fn the_written_prefix_grows_only_with_writes_in_order() {
        let mut r: Registry<Vec<u8>> = Registry::new();
        let pd = r.alloc_pd();
        let s = r.register(pd, 0x1000, vec![0; 100], Access::REMOTE_WRITE, 1);
        let w = |r: &mut Registry<Vec<u8>>, at: u64, len: u64| {
            let range = r
                .check(pd, s, 0x1000 + at, len, Access::REMOTE_WRITE)
                .unwrap();
            r.note_remote_write(&range);
            r.remote_written(s).unwrap()
        };
        assert_eq!(r.remote_written(s), Some(0));
        // A gap: nothing placed from the start.
        assert_eq!(w(&mut r, 10, 10), 0);
        assert_eq!(w(&mut r, 0, 10), 10);
        // In order, then a rewrite of placed bytes, then past a gap.
        assert_eq!(w(&mut r, 10, 20), 30);
        assert_eq!(w(&mut r, 5, 10), 30);
        assert_eq!(w(&mut r, 40, 10), 30);
        assert_eq!(w(&mut r, 25, 75), 100);
        // Another registration in the same slot starts at 0.
        r.deregister(s);
        let t = r.register(pd, 0x1000, vec![0; 100], Access::REMOTE_WRITE, 2);
        assert_eq!(r.remote_written(t), Some(0));
        assert_eq!(r.remote_written(s), None);
    }
}
