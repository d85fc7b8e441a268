//! The slots' anonymous mappings, kept for the next socket.
//!
//! A DDP connection's set-up and end made and unmapped two mappings of
//! MiBs on each side. The unmapping was the dearest part of it: with the
//! process's threads on both CPUs it flushes the other CPU's TLB by an
//! interprocessor interrupt, a VM exit on a virtual machine (session 37's
//! profile of a policy-mode connection loop: 16 % of the client's CPU
//! time and 24 % of the server's in `munmap`, in the orderly-close
//! reaper), and the next connection's first touches of fresh pages
//! faulted again.
//!
//! So a socket's mapping goes back to a small process-wide cache when it
//! is dropped, if few of its pages are in memory (a short connection's:
//! at most [`RESIDENT_MAX`] bytes; a bulk one's MiBs are unmapped, not
//! kept in memory), and the next socket wanting the same length takes it. It is
//! cleared before it is kept — the pages in memory (`mincore`) written
//! with zeros where they are not zero already, the others dropped — so a
//! taken mapping is zero as a fresh one is, and no byte of one connection
//! can reach another.
//! At most [`KEPT_MAX`] are kept. The cache's lock is only tried (a
//! mapping is made or unmapped instead when it is busy): a forked child
//! whose parent's thread held it at the fork never waits for it.

use std::sync::Mutex;

/// The most mappings kept.
const KEPT_MAX: usize = 8;

/// The most bytes of a mapping in memory for it to be kept.
const RESIDENT_MAX: usize = 256 << 10;

/// Kept mappings: (address, length), each zero.
static KEPT: Mutex<Vec<(usize, usize)>> = Mutex::new(Vec::new());

/// A zeroed private anonymous mapping of `len` bytes (a whole number of
/// pages or not): a kept one of that length, or a new one.
pub(super) fn take(len: usize) -> std::io::Result<*mut u8> {
    if let Ok(mut k) = KEPT.try_lock() {
        if let Some(i) = k.iter().position(|&(_, l)| l == len) {
            return Ok(k.swap_remove(i).0 as *mut u8);
        }
    }
    // SAFETY: a private anonymous mapping of `len` bytes, the caller's
    // until it gives it back.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error());
    }
    Ok(p.cast())
}

/// Gives back the mapping `p` of `len` bytes ([`take`]'s): kept, cleared,
/// in place of the oldest kept one if [`KEPT_MAX`] are (its length may be
/// one no socket asks for any more: the slots' count follows
/// `SO_SNDBUF`), or unmapped.
///
/// # Safety
/// `p`/`len` are a mapping [`take`] returned, given back once, and not
/// used by the caller (nor the engine) again.
pub(super) unsafe fn give_back(p: *mut u8, len: usize) {
    // SAFETY: the caller's mapping, no longer used by anyone else.
    if unsafe { clear(p, len) } {
        if let Ok(mut k) = KEPT.try_lock() {
            let evicted = (k.len() >= KEPT_MAX).then(|| k.remove(0));
            k.push((p as usize, len));
            drop(k);
            if let Some((q, n)) = evicted {
                // SAFETY: a kept mapping, taken off the list: ours alone.
                unsafe { libc::munmap(q as *mut libc::c_void, n) };
            }
            return;
        }
    }
    // SAFETY: the caller's mapping, unmapped once, here.
    unsafe { libc::munmap(p.cast(), len) };
}

/// The size of a page (`sysconf`; 4 KiB if it cannot say).
fn page() -> usize {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(n).ok().filter(|&n| n > 0).unwrap_or(4096)
}

/// Zeroes the mapping `p` (`len` bytes), if at most [`RESIDENT_MAX`]
/// bytes of its pages are in memory; returns whether it did. Those pages are
/// written with zeros (only the ones not zero already); the others are
/// dropped (`MADV_DONTNEED`, run by run): a page written and then
/// swapped out is not in memory either, and would come back with its
/// bytes. A run of pages never touched has nothing to drop, and its
/// `madvise` takes no TLB flush (no entry of it was present).
///
/// # Safety
/// As [`give_back`]'s.
unsafe fn clear(p: *mut u8, len: usize) -> bool {
    let page = page();
    let pages = len.div_ceil(page);
    let mut resident = vec![0u8; pages];
    // SAFETY: `p` is page-aligned (a mapping's start), `resident` has a
    // byte for each of its pages.
    if unsafe { libc::mincore(p.cast(), len, resident.as_mut_ptr()) } != 0 {
        return false;
    }
    if resident.iter().filter(|&&r| r & 1 != 0).count() * page > RESIDENT_MAX {
        return false;
    }
    let mut gap_from = None;
    // Each page's residence, then `None` past the last (a gap's end).
    let pages_in = resident
        .iter()
        .map(|&r| Some(r & 1 != 0))
        .chain(std::iter::once(None));
    for (i, here) in pages_in.enumerate() {
        if here == Some(false) {
            gap_from.get_or_insert(i);
            continue;
        }
        if let Some(g) = gap_from.take() {
            let end = (i * page).min(len);
            // SAFETY: whole pages of the mapping (the last one's tail
            // too: `madvise` rounds the length up), which nobody uses.
            let r = unsafe {
                libc::madvise(p.add(g * page).cast(), end - g * page, libc::MADV_DONTNEED)
            };
            if r != 0 {
                return false;
            }
        }
        if here == Some(true) {
            let at = i * page;
            let n = page.min(len - at);
            // SAFETY: within the mapping, which nobody else uses.
            let bytes = unsafe { std::slice::from_raw_parts_mut(p.add(at), n) };
            // Only a written page: a page read but never written is the
            // shared zero page, which a write would make a page of our own.
            if !all_zero(bytes) {
                bytes.fill(0);
            }
        }
    }
    true
}

/// Whether every byte of `bytes` is zero: 64 bytes at a time, each
/// block's OR folded without a branch (the compiler's vector code; a
/// byte-wise `any` stops at each byte: ~1 µs a page, ~1.8 % of a
/// policy-mode connection loop's CPU in `SlotMem::drop`, session 48).
fn all_zero(bytes: &[u8]) -> bool {
    let blocks = bytes.chunks_exact(64);
    let tail = blocks.remainder();
    tail.iter().all(|&b| b == 0)
        && blocks
            .into_iter()
            .all(|c| c.iter().fold(0u8, |a, &b| a | b) == 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE: usize = 4096;

    /// A length no socket's slots have (an odd number of bytes): the
    /// tests' mappings are not taken by sockets made meanwhile, nor
    /// theirs by the tests.
    const LEN: usize = 5 * PAGE + 2048 + 77;

    fn bytes(p: *mut u8, len: usize) -> &'static mut [u8] {
        // SAFETY: a mapping of the test's, `len` bytes.
        unsafe { std::slice::from_raw_parts_mut(p, len) }
    }

    /// A mapping written and given back is taken again zero: the same
    /// one (kept), or a new one.
    #[test]
    fn a_mapping_given_back_is_taken_again_zero() {
        let p = take(LEN).unwrap();
        bytes(p, LEN).fill(0xA5);
        // SAFETY: ours, given back once.
        unsafe { give_back(p, LEN) };
        let q = take(LEN).unwrap();
        assert!(
            bytes(q, LEN).iter().all(|&b| b == 0),
            "a taken mapping is not zero"
        );
        // SAFETY: as above.
        unsafe { give_back(q, LEN) };
    }

    /// A mapping given back is kept and taken again: the same address.
    /// (Retried: another test's socket may hold the cache's lock at the
    /// moment, and the mapping is then unmapped or made anew.)
    #[test]
    fn a_mapping_given_back_is_kept_for_the_next_one() {
        const LEN2: usize = 3 * PAGE + 2048 + 13;
        let reused = (0..100).any(|_| {
            let p = take(LEN2).unwrap();
            bytes(p, LEN2)[0] = 1;
            // SAFETY: ours, given back once.
            unsafe { give_back(p, LEN2) };
            // A mapping made meanwhile takes the hole an unmapped `p`
            // would have left (the kernel gives it to the next mapping).
            // SAFETY: a new mapping of ours, unmapped below.
            let other = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    LEN2,
                    libc::PROT_READ,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            let q = take(LEN2).unwrap();
            // SAFETY: as above.
            unsafe { give_back(q, LEN2) };
            // SAFETY: the mapping made above.
            unsafe { libc::munmap(other, LEN2) };
            p == q
        });
        assert!(reused, "a mapping given back was never taken again");
    }

    /// Given back while [`KEPT_MAX`] are kept, a mapping takes the
    /// oldest one's place: after `KEPT_MAX + 1` of one length the cache
    /// holds the last `KEPT_MAX` of them, in order. (Retried: another
    /// test's socket may give one back or take one meanwhile.)
    #[test]
    fn a_mapping_given_back_to_a_full_cache_replaces_the_oldest() {
        const LEN3: usize = 2 * PAGE + 1024 + 5;
        let ok = (0..50).any(|_| {
            let maps: Vec<usize> = (0..=KEPT_MAX)
                .map(|_| take(LEN3).unwrap() as usize)
                .collect();
            for &m in &maps {
                // SAFETY: ours, given back once.
                unsafe { give_back(m as *mut u8, LEN3) };
            }
            let kept: Vec<(usize, usize)> = KEPT.lock().unwrap().clone();
            let want: Vec<(usize, usize)> = maps[1..].iter().map(|&m| (m, LEN3)).collect();
            // Ours back out of the cache, and unmapped.
            let mut k = KEPT.lock().unwrap();
            k.retain(|&(m, l)| {
                if l == LEN3 {
                    // SAFETY: a mapping of this test's, off the list.
                    unsafe { libc::munmap(m as *mut libc::c_void, l) };
                }
                l != LEN3
            });
            drop(k);
            kept == want
        });
        assert!(ok, "the cache did not keep the last ones given back");
    }

    /// One with more pages in memory than [`RESIDENT_MAX`] is unmapped,
    /// not kept.
    #[test]
    fn a_mapping_mostly_in_memory_is_not_kept() {
        let len = RESIDENT_MAX + 3 * page() + 77;
        let p = take(len).unwrap();
        bytes(p, len).fill(1);
        // SAFETY: ours: a query of its pages.
        assert!(!unsafe { clear(p, len) }, "cleared");
        // SAFETY: ours, given back once.
        unsafe { give_back(p, len) };
        assert!(
            !KEPT.lock().unwrap().iter().any(|&(a, _)| a == p as usize),
            "kept"
        );
    }

    /// Clearing zeroes a written page among pages never touched.
    #[test]
    fn clearing_zeroes_a_written_page() {
        let len = 8 * PAGE;
        let p = take(len).unwrap();
        bytes(p, len)[3 * PAGE + 5] = 7;
        // SAFETY: ours.
        assert!(unsafe { clear(p, len) });
        assert!(bytes(p, len).iter().all(|&b| b == 0));
        // SAFETY: ours, unmapped once.
        unsafe { libc::munmap(p.cast(), len) };
    }

    /// The zero check sees a byte anywhere: each block, the tail past the
    /// last whole block, a page's last byte.
    #[test]
    fn the_zero_check_sees_any_byte() {
        for len in [0, 1, 63, 64, 65, 200, PAGE] {
            let mut v = vec![0u8; len];
            assert!(all_zero(&v), "{len} zero bytes");
            for at in 0..len {
                v[at] = 0x80;
                assert!(!all_zero(&v), "byte {at} of {len}");
                v[at] = 0;
            }
        }
    }
}
