//! Memory behind registered regions: an owned buffer, or caller memory
//! given as a pointer and a length — both held as a raw pointer, so the
//! engine (under the context lock) and an application closure
//! ([`crate::Mr::with_bytes`], outside it) reach the bytes the same way.
//!
//! This is one of the few modules of the crate allowed to use `unsafe`
//! (with `sys` for system calls, and the slice constructors of
//! [`crate::Mr`] and [`crate::Pd::register_raw`]).
//!
//! # Who touches region bytes, and when
//!
//! * The engine, holding the context lock: it places received payload
//!   into regions and gathers payload out of them. It places only while
//!   no application closure borrows region bytes, and gathers only while
//!   none writes them (the counts in `State`, changed under the lock).
//! * The application, through [`crate::Mr`]'s closures, outside the lock,
//!   after registering its borrow under the lock (one writer or many
//!   readers per region).
//! * For caller memory ([`crate::Pd::register_raw`]), also the
//!   application directly, under the verbs contract: not the parts an
//!   operation is in flight on.
#![allow(unsafe_code)]

use std::ptr::NonNull;

use warpsock_proto::Backing;

/// The bytes of one region.
#[derive(Debug)]
pub(crate) struct Mem {
    ptr: NonNull<u8>,
    len: usize,
    /// Allocated here (from a `Box<[u8]>`) and freed on drop; else caller
    /// memory.
    owned: bool,
}

// SAFETY: a Mem is only dereferenced by the engine under the context lock
// (it lives in the Registry inside `Mutex<State>`) and by `Mr` closures
// under the borrow rules above; caller memory was promised valid and
// otherwise unaccessed by `Pd::register_raw`'s contract, so moving the
// handle between threads is sound.
unsafe impl Send for Mem {}

impl Mem {
    /// Takes ownership of `buf` (freed when the `Mem` is dropped).
    pub(crate) fn owned(buf: Box<[u8]>) -> Self {
        let len = buf.len();
        let ptr = NonNull::new(Box::into_raw(buf).cast::<u8>()).expect("Box is never null");
        Self {
            ptr,
            len,
            owned: true,
        }
    }

    /// Caller memory.
    ///
    /// # Safety
    /// `ptr..ptr+len` must be valid for reads and writes, and stay so and
    /// otherwise unaccessed (see the module doc) while registered.
    pub(crate) unsafe fn raw(ptr: *mut u8, len: usize) -> Self {
        Self {
            ptr: NonNull::new(ptr).unwrap_or(NonNull::dangling()),
            len,
            owned: false,
        }
    }

    /// Whether it was allocated here ([`Self::owned`]), not caller memory.
    pub(crate) fn is_owned(&self) -> bool {
        self.owned
    }

    /// First byte's address.
    pub(crate) fn addr(&self) -> u64 {
        self.ptr.as_ptr() as u64
    }

    /// Length in bytes.
    pub(crate) fn len(&self) -> usize {
        self.len
    }
}

impl Drop for Mem {
    fn drop(&mut self) {
        if self.owned {
            let slice = std::ptr::slice_from_raw_parts_mut(self.ptr.as_ptr(), self.len);
            // SAFETY: `ptr`/`len` came from `Box::into_raw` of a `Box<[u8]>`
            // of that length in `Mem::owned`, and are freed exactly once.
            drop(unsafe { Box::from_raw(slice) });
        }
    }
}

impl Backing for Mem {
    fn bytes(&self) -> &[u8] {
        // SAFETY: valid for `len` bytes while registered (owned: our own
        // allocation; raw: the caller's promise). The engine calls this
        // under the context lock and only while no application closure
        // writes region bytes; the borrow is tied to `&self`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as for `bytes`; the engine writes only while no
        // application closure borrows region bytes, and `&mut self` makes
        // the engine's borrow unique.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

/// Writable slices of several ranges of registered regions at once, in
/// the order given, for one scatter read (a planned receive). `None` if a
/// range is not inside its live region, or if two ranges overlap in
/// memory (also across regions that share memory): the slices are then
/// never aliased.
pub(crate) fn scatter_mut(
    reg: &mut warpsock_proto::Registry<Mem>,
    ranges: impl Iterator<Item = warpsock_proto::Range>,
) -> Option<Vec<&mut [u8]>> {
    let mut spans: Vec<(*mut u8, usize)> = Vec::new();
    for r in ranges {
        let m = reg.range_backing(&r)?;
        let off = usize::try_from(r.offset).ok()?;
        let len = usize::try_from(r.len).ok()?;
        if off.checked_add(len)? > m.len {
            return None;
        }
        spans.push((m.ptr.as_ptr().wrapping_add(off), len));
    }
    let mut sorted: Vec<(usize, usize)> = spans.iter().map(|&(p, n)| (p as usize, n)).collect();
    sorted.sort_unstable();
    if sorted.windows(2).any(|w| w[0].0 + w[0].1 > w[1].0) {
        return None;
    }
    Some(
        spans
            .into_iter()
            .map(|(addr, len)| {
                // SAFETY: each span lies inside a live region's memory
                // (checked against its length above; valid while
                // registered, see `Backing::bytes_mut`), no two spans
                // overlap (checked above), and the slices borrow `reg`
                // mutably, so nothing reaches region bytes through the
                // registry while they live — the same exclusion as
                // `Registry::slice_mut`, for several disjoint ranges. The
                // driver calls this only in a receive round its
                // `Allowed::rx` gate admits (no application closure
                // borrows region bytes; see the module docs).
                unsafe { std::slice::from_raw_parts_mut(addr, len) }
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use warpsock_proto::{Access, Range, Registry};

    /// Disjoint ranges of two regions come back as slices of their
    /// lengths, in order; a range past its region's end, an unknown
    /// STag, or two ranges that overlap (in one region, or in two
    /// regions over the same memory) give `None`.
    #[test]
    fn scatter_slices_are_disjoint_and_in_bounds() {
        let mut reg: Registry<Mem> = Registry::new();
        let pd = reg.alloc_pd();
        let a = reg.register(
            pd,
            0,
            Mem::owned(vec![0; 64].into()),
            Access::LOCAL_WRITE,
            1,
        );
        let b = reg.register(
            pd,
            0,
            Mem::owned(vec![0; 64].into()),
            Access::LOCAL_WRITE,
            2,
        );
        // Ranges as `Registry::check` gives them, with the serial of the
        // registration they were checked in (an unknown STag's is any).
        let serial = |reg: &Registry<Mem>, stag| {
            reg.check(pd, stag, 0, 0, Access::LOCAL_WRITE)
                .map_or(0, |r| r.serial)
        };
        let (sa, sb) = (serial(&reg, a), serial(&reg, b));
        let r = |stag, serial, offset, len| Range {
            stag,
            offset,
            len,
            serial,
        };
        let ok = scatter_mut(
            &mut reg,
            [r(a, sa, 8, 8), r(b, sb, 0, 64), r(a, sa, 0, 8)].into_iter(),
        )
        .expect("disjoint");
        assert_eq!(ok.iter().map(|s| s.len()).collect::<Vec<_>>(), [8, 64, 8]);
        assert!(scatter_mut(&mut reg, [r(a, sa, 60, 8)].into_iter()).is_none());
        assert!(scatter_mut(&mut reg, [r(a ^ 0x100, sa, 0, 8)].into_iter()).is_none());
        assert!(scatter_mut(&mut reg, [r(a, sa, 0, 16), r(a, sa, 8, 8)].into_iter()).is_none());
        // Another registration's range under the same STag.
        assert!(scatter_mut(&mut reg, [r(a, sa.wrapping_add(7), 0, 8)].into_iter()).is_none());
        // A second region over the first one's memory.
        let (ptr, len) = {
            let m = reg.backing(a).expect("a");
            (m.ptr.as_ptr(), m.len)
        };
        // SAFETY: `a`'s memory stays registered (and so allocated) while
        // `c` is; the test only reads slice lengths.
        let c = reg.register(pd, 0, unsafe { Mem::raw(ptr, len) }, Access::LOCAL_WRITE, 3);
        let sc = serial(&reg, c);
        assert!(scatter_mut(&mut reg, [r(a, sa, 0, 8), r(c, sc, 4, 8)].into_iter()).is_none());
        assert!(scatter_mut(&mut reg, [r(a, sa, 0, 8), r(c, sc, 8, 8)].into_iter()).is_some());
        reg.deregister(c);
    }
}
