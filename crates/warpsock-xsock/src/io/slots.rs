//! The memory of a socket's receive and transmit slots: owned here and
//! registered with the engine as caller memory ([`Pd::register_raw`]), so
//! the data path reads a received slot and fills a free transmit slot
//! directly. The engine's own region borrow (`Mr::with_bytes`) takes the
//! context lock twice and wakes its condition variable (a `futex` system
//! call) on every access — three times per small message — which is what
//! the stream path paid per message before.
//!
//! The contract that makes direct access sound is the one `ibv_reg_mr`
//! memory has: a slot is touched by us only while the engine does not use
//! it — a receive slot between its completion and its repost, a transmit
//! slot between its completion (or before its first post) and its next
//! post. The socket's books (`tx_free`, the stream's reposts) and its lock
//! keep every slot with exactly one owner.
#![allow(unsafe_code)]

use std::ptr::NonNull;

use warpsock_engine::{Access, Mr, Pd, Sge};

/// `count` slots of `size` bytes, registered for `access`.
pub(crate) struct SlotMem {
    /// Dropped (deregistered) before the memory is freed.
    mr: std::mem::ManuallyDrop<Mr>,
    mem: NonNull<u8>,
    len: usize,
}

// SAFETY: the memory is a plain heap allocation owned by this value; who
// touches which part of it is governed by the slot contract above, under
// the socket's lock.
unsafe impl Send for SlotMem {}
// SAFETY: as above.
unsafe impl Sync for SlotMem {}

/// Where the slots start in their mapping: half a page in. Every slot is
/// a whole number of pages, so a page-aligned start put every slot at the
/// page offset of the C library's large buffers (16: its mmap'd blocks),
/// and each copy between a slot and a program's buffer stalled on 4 KiB
/// aliasing (the 1 MiB stream, 3-4 % below the heap-allocated slots'
/// throughput in session 36's sets).
const SKEW: usize = 2048;

impl SlotMem {
    /// `len` bytes of zeroed memory of its own (an anonymous mapping, a
    /// fresh one or one a closed socket gave back: [`mapping`]),
    /// registered for `access`.
    ///
    /// A mapping, not the heap: the C library serves a freed block of this
    /// size (MiBs: the slots of a connection) from its heap once its mmap
    /// threshold has risen past it, and `calloc` then clears it all — about
    /// half a millisecond per 4 MiB, twice per connection on each side,
    /// most of a DDP connection's setup (session 36: 564 connections a
    /// second with 16 slots of 256 KiB, 2,866 with 4 of 16 KiB). A fresh
    /// mapping's pages are zero when first touched, and a socket touches
    /// only the slots it uses.
    pub(crate) fn new(pd: &Pd, len: usize, access: Access) -> std::io::Result<Self> {
        let mem = if len == 0 {
            NonNull::dangling()
        } else {
            let p = mapping::take(len + SKEW)?;
            // SAFETY: within the mapping.
            NonNull::new(unsafe { p.add(SKEW) }).expect("a mapping is not at 0")
        };
        // SAFETY: the mapping lives until `drop`, which deregisters it
        // first; what the engine and we touch is kept apart by the slot
        // contract (module docs).
        let mr = unsafe { pd.register_raw(mem.as_ptr(), len, access) };
        Ok(Self {
            mr: std::mem::ManuallyDrop::new(mr),
            mem,
            len,
        })
    }

    /// Bytes in all.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The engine's entry for bytes `at..at + len`.
    pub(crate) fn sge(&self, at: usize, len: u32) -> Sge {
        self.mr.sge(at, len)
    }

    /// Bytes `at..at + len`, to read.
    ///
    /// # Safety
    /// The range lies in slots the engine is not using (module docs) and
    /// no `bytes_mut` of it is alive.
    pub(crate) unsafe fn bytes(&self, at: usize, len: usize) -> &[u8] {
        assert!(at + len <= self.len, "slot range out of bounds");
        // SAFETY: in bounds (checked); exclusive of the engine and of
        // writers by the caller's contract.
        unsafe { std::slice::from_raw_parts(self.mem.as_ptr().add(at), len) }
    }

    /// Bytes `at..at + len`, to write.
    ///
    /// # Safety
    /// The range lies in slots the engine is not using and the caller
    /// owns (module docs), and no other view of it is alive.
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn bytes_mut(&self, at: usize, len: usize) -> &mut [u8] {
        assert!(at + len <= self.len, "slot range out of bounds");
        // SAFETY: in bounds (checked); unique by the caller's contract.
        unsafe { std::slice::from_raw_parts_mut(self.mem.as_ptr().add(at), len) }
    }
}

/// `out.copy_from_slice(src)` (equal lengths), a short one without the
/// call: a slice copy of a length not known at compile time is a call of
/// the C library's `memcpy` (~12 instructions with its dispatch for 8
/// bytes, issue 12). From 4 to 16 bytes it is two overlapping words (the
/// first and the last 4 or 8 bytes), each loaded and then stored.
#[inline(always)]
pub(crate) fn copy_short(out: &mut [u8], src: &[u8]) {
    let n = src.len();
    let out = &mut out[..n];
    if (8..=16).contains(&n) {
        let a = u64::from_ne_bytes(src[..8].try_into().expect("8 bytes"));
        let b = u64::from_ne_bytes(src[n - 8..].try_into().expect("8 bytes"));
        out[..8].copy_from_slice(&a.to_ne_bytes());
        out[n - 8..].copy_from_slice(&b.to_ne_bytes());
    } else if (4..8).contains(&n) {
        let a = u32::from_ne_bytes(src[..4].try_into().expect("4 bytes"));
        let b = u32::from_ne_bytes(src[n - 4..].try_into().expect("4 bytes"));
        out[..4].copy_from_slice(&a.to_ne_bytes());
        out[n - 4..].copy_from_slice(&b.to_ne_bytes());
    } else {
        copy_long(out, src);
    }
}

/// [`copy_short`]'s other lengths: `memcpy`, in a call of its own (inlined,
/// the compiler merged the short path's last word into this call).
#[inline(never)]
fn copy_long(out: &mut [u8], src: &[u8]) {
    out.copy_from_slice(src);
}

impl Drop for SlotMem {
    fn drop(&mut self) {
        // SAFETY: `mr` is not used again; deregistered before the memory
        // it names is freed (later engine accesses fail their lookup).
        unsafe { std::mem::ManuallyDrop::drop(&mut self.mr) };
        if self.len > 0 {
            // SAFETY: `mem`/`len` are the mapping `new` took, given back
            // once, here, and not touched again.
            unsafe { mapping::give_back(self.mem.as_ptr().sub(SKEW), self.len + SKEW) };
        }
    }
}

mod mapping;

#[cfg(test)]
mod tests {
    use super::copy_short;

    #[test]
    fn a_short_copy_is_the_slice_copy_at_every_length() {
        let src: Vec<u8> = (1..=40).collect();
        for n in 0..=40 {
            for at in [0, 3] {
                let mut out = [0u8; 48];
                copy_short(&mut out[at..at + n], &src[..n]);
                let mut want = [0u8; 48];
                want[at..at + n].copy_from_slice(&src[..n]);
                assert_eq!(out, want, "{n} bytes at {at}");
            }
        }
    }
}
