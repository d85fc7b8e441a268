//! The interposed `select(2)` and `pselect(2)`.
//!
//! A call whose read or write set names a managed socket is made as the
//! interposed `poll` makes its wait (`select/polled.rs`): the sockets'
//! connections are watched by the call itself, and their input taken up
//! on the caller's thread; a call that names none is the real one. The
//! rest of this module is every call's path with
//! `WARPSOCK_DDP_SELECT_DIRECT=0`.
//!
//! There, a managed socket is seen through its doorbell, the file its number
//! names, so the real call serves it. One case needs more: an accepted
//! connection that switches in the background (`xsock::switching`) ends
//! with its number naming another open file, and the kernel's select,
//! which looks each number up again when woken but stays queued only on
//! the files it first found, would not hear of input on the new one. A
//! select over such a number also watches the switch's own descriptor
//! (`Socket::file_change`, readable at its end), and waits again from
//! the caller's sets when only that one fired — on the new file now.
//! (Until session 38 such a select waited in 20 ms slices, whatever its
//! numbers were: a select-loop server took ~14 ms more for each connection
//! whose first bytes came after its switch's end, 70 connections a second
//! where a poll-loop server made 3,900.)
//!
//! A signal is never lost between two waits: the asynchronous signals are
//! blocked from the first wait to the return, and each wait is a
//! `pselect` that puts the caller's mask (a `pselect`'s own, or the
//! thread's) in place atomically: a signal that came between two waits is
//! pending then, and fails the next with `EINTR` after its handler ran,
//! as it fails the kernel's one wait. (Handled between them, it used to
//! let the wait go on to its bound: a program's `SIGALRM` or `SIGCHLD`
//! loop waited out the whole timeout.)
//!
//! These waits are the real ones, libc's cancellation points: a
//! `pthread_cancel` of the thread unwinds from them through these frames
//! (`extern "C-unwind"`; what they hold is dropped on the way), as
//! without the library.

use std::sync::Arc;
use std::time::{Duration, Instant};

use libc::c_int;
use smallvec::SmallVec;

use super::before_doorbell_wait;
use crate::shim::fdtable;
use crate::shim::real;
use crate::shim::socket::Socket;
use crate::shim::sys::{self, set_errno};

/// Interposed `select(2)`: see the module's docs.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C-unwind" fn select(
    n: c_int,
    r: *mut libc::fd_set,
    w: *mut libc::fd_set,
    e: *mut libc::fd_set,
    timeout: *mut libc::timeval,
) -> c_int {
    let route = polled::route(n, [r, w]);
    if route == Route::Doorbells {
        before_doorbell_wait();
    }
    if route == Route::Real || route == Route::Doorbells && !crate::xsock::switches_under_way() {
        // SAFETY: forwarding the caller's arguments.
        return unsafe { real::select(n, r, w, e, timeout) };
    }
    // SAFETY: the caller's timeval, if any, is readable.
    let bound = match unsafe { timeout.as_ref() }.map(select_bound) {
        Some(Err(())) => {
            set_errno(libc::EINVAL);
            return -1;
        }
        Some(Ok(b)) => Some(b),
        None => None,
    };
    let start = Instant::now();
    let got = if let Route::Polled(n) = route {
        polled::select(n, [r, w, e], bound, None)
    } else {
        watching_changes(n, [r, w, e], bound, None, switching, real_pselect)
    };
    // SAFETY: the caller's timeval, if any, is writable (select's own
    // contract: Linux writes the time left into it).
    if let (Some(t), Some(b)) = (unsafe { timeout.as_mut() }, bound) {
        let left = b.saturating_sub(start.elapsed());
        t.tv_sec = left.as_secs() as libc::time_t;
        t.tv_usec = left.subsec_micros() as libc::suseconds_t;
    }
    got
}

/// Interposed `pselect(2)`: as `select`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C-unwind" fn pselect(
    n: c_int,
    r: *mut libc::fd_set,
    w: *mut libc::fd_set,
    e: *mut libc::fd_set,
    timeout: *const libc::timespec,
    mask: *const libc::sigset_t,
) -> c_int {
    let route = polled::route(n, [r, w]);
    if route == Route::Doorbells {
        before_doorbell_wait();
    }
    if route == Route::Real || route == Route::Doorbells && !crate::xsock::switches_under_way() {
        // SAFETY: forwarding the caller's arguments.
        return unsafe { real::pselect(n, r, w, e, timeout, mask) };
    }
    // SAFETY: the caller's timespec, if any, is readable.
    let bound = match unsafe { timeout.as_ref() } {
        Some(t) if t.tv_sec < 0 || !(0..1_000_000_000).contains(&t.tv_nsec) => {
            set_errno(libc::EINVAL);
            return -1;
        }
        Some(t) => Some(Duration::new(t.tv_sec as u64, t.tv_nsec as u32)),
        None => None,
    };
    // SAFETY: the caller's mask, if any, is readable (pselect's contract).
    let wait_mask = unsafe { mask.as_ref() };
    if let Route::Polled(n) = route {
        return polled::select(n, [r, w, e], bound, wait_mask);
    }
    watching_changes(n, [r, w, e], bound, wait_mask, switching, real_pselect)
}

/// A number's socket whose file is still to change, and the descriptor
/// readable when it has ([`Socket::file_change`]).
fn switching(fd: c_int) -> Option<(Arc<dyn Socket>, c_int)> {
    let s = fdtable::get(fd)?;
    let done = s.file_change()?;
    Some((s, done))
}

/// The real `pselect` over `n` bits of `sets`, for at most `left`, with
/// `mask` in place while it waits.
fn real_pselect(
    n: c_int,
    sets: [*mut libc::fd_set; 3],
    left: Option<Duration>,
    mask: *const libc::sigset_t,
) -> c_int {
    let ts = left.map(|d| libc::timespec {
        tv_sec: d.as_secs() as libc::time_t,
        tv_nsec: d.subsec_nanos() as libc::c_long,
    });
    let at = ts
        .as_ref()
        .map_or(std::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: the caller's sets (or ours, as long as `n` says), a timespec
    // and a mask of ours.
    unsafe { real::pselect(n, sets[0], sets[1], sets[2], at, mask) }
}

/// A `select` over the caller's `sets` (null: none; `n` bits each) for
/// at most `bound` (`None`: no bound) that also watches, for each of its
/// numbers whose file is still to change (`changing`: the socket, held
/// over the wait so its descriptor stays its own, and that descriptor),
/// that descriptor; when only those fired, it waits again from the
/// caller's sets for what is left. `wait`: the real `pselect` (`n`, the
/// sets, the time left, the mask to wait with). See the module's docs.
fn watching_changes<T>(
    n: c_int,
    sets: [*mut libc::fd_set; 3],
    bound: Option<Duration>,
    wait_mask: Option<&libc::sigset_t>,
    changing: impl Fn(c_int) -> Option<(T, c_int)>,
    mut wait: impl FnMut(
        c_int,
        [*mut libc::fd_set; 3],
        Option<Duration>,
        *const libc::sigset_t,
    ) -> c_int,
) -> c_int {
    let restore = Restore(sys::block_async_signals());
    let mask: *const libc::sigset_t = wait_mask.unwrap_or(&restore.0);
    // The sets are `n` bits long, rounded up to whole words: what the
    // kernel reads and writes, and what the caller allocated (libevent
    // sizes its own for its highest descriptor, below `FD_SETSIZE`; a
    // program with descriptors above it, larger) — `n` taken down to the
    // descriptor table's size first, as the kernel takes it (a `select`
    // of `getdtablesize()` numbers over a 128-byte set is a valid call).
    let n = clamped(n);
    let words = usize::try_from(n).unwrap_or(0).div_ceil(64);
    // Inline (no allocation: `select` is async-signal-safe) up to
    // `FD_SETSIZE`.
    let saved: [Option<Words>; 3] = sets.map(|p| {
        (!p.is_null()).then(|| {
            // SAFETY: the caller's set is readable for `words` words (the
            // kernel reads as much); it may not be aligned for them.
            (0..words)
                .map(|i| unsafe { p.cast::<u64>().add(i).read_unaligned() })
                .collect()
        })
    });
    let start = Instant::now();
    loop {
        let left = bound.map(|b| b.saturating_sub(start.elapsed()));
        for (p, s) in sets.iter().zip(&saved) {
            if let Some(s) = s {
                for (i, &word) in s.iter().enumerate() {
                    // SAFETY: the caller's set, writable for `words` words.
                    unsafe { p.cast::<u64>().add(i).write_unaligned(word) };
                }
            }
        }
        // The numbers' sockets whose files are to change, held until the
        // wait is over, and their descriptors: each number once, whichever
        // sets name it, and each socket once, whichever numbers name it.
        let mut held: SmallVec<[(T, c_int); 4]> = SmallVec::new();
        for word_at in 0..words {
            let mut bits = saved.iter().flatten().fold(0, |a, s| a | s[word_at]);
            while bits != 0 {
                let fd = (word_at * 64) as c_int + bits.trailing_zeros() as c_int;
                bits &= bits - 1;
                if fd >= n {
                    break;
                }
                if let Some((s, done)) = changing(fd) {
                    if !held.iter().any(|h| h.1 == done) {
                        held.push((s, done));
                    }
                }
            }
        }
        if held.is_empty() {
            return wait(n, sets, left, mask);
        }
        // The caller's sets widened to take the descriptors: ours.
        let top = held.iter().map(|h| h.1).max().unwrap_or(0);
        let n2 = n.max(top + 1);
        let words2 = usize::try_from(n2).unwrap_or(0).div_ceil(64);
        let mut ours: [Words; 3] = std::array::from_fn(|k| {
            let mut v: Words = smallvec::smallvec![0u64; words2];
            if let Some(s) = &saved[k] {
                v[..s.len()].copy_from_slice(s);
                // Bits at `n` and past it: the kernel ignored them in the
                // caller's sets; within the wider ones they would count.
                if n % 64 != 0 {
                    v[words - 1] &= (1u64 << (n % 64)) - 1;
                }
            }
            v
        });
        for &(_, done) in &held {
            ours[0][done as usize / 64] |= 1 << (done % 64);
        }
        let ptrs: [*mut libc::fd_set; 3] = std::array::from_fn(|k| {
            if sets[k].is_null() && k != 0 {
                std::ptr::null_mut()
            } else {
                ours[k].as_mut_ptr().cast()
            }
        });
        let got = wait(n2, ptrs, left, mask);
        if got < 0 {
            return got;
        }
        // Ours out of the count and the read set; the rest is the caller's.
        let mut fired = 0;
        for &(_, done) in &held {
            let bit = 1u64 << (done % 64);
            if ours[0][done as usize / 64] & bit != 0 {
                ours[0][done as usize / 64] &= !bit;
                fired += 1;
            }
        }
        drop(held);
        for (k, p) in sets.iter().enumerate() {
            if !p.is_null() {
                for (i, &word) in ours[k][..words].iter().enumerate() {
                    // SAFETY: the caller's set, writable for `words` words.
                    unsafe { p.cast::<u64>().add(i).write_unaligned(word) };
                }
            }
        }
        let count = got - fired;
        if count > 0 || fired == 0 || left.is_some_and(|l| l.is_zero()) {
            // Something of the caller's, or a timeout; or a look (zero
            // bound) that found only a switch's end: nothing of the
            // caller's, as a look that came a moment later.
            return count;
        }
        // Only switches ended: the numbers name their new files now.
    }
}

/// A set's words, inline up to `FD_SETSIZE` bits.
type Words = SmallVec<[u64; 16]>;

/// Puts the caller's signal mask back, on return and on unwind.
struct Restore(libc::sigset_t);

impl Drop for Restore {
    fn drop(&mut self) {
        // SAFETY: the saved set; the calling thread's mask only.
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &self.0, std::ptr::null_mut()) };
    }
}

/// `n` taken down to the size of the process's descriptor table, as the
/// kernel's select takes it (`core_sys_select`); read (`FDSize` in
/// `/proc/self/status`) only past `FD_SETSIZE`, where a program may pass
/// the table's bound over smaller sets. `n` itself if that cannot be read.
fn clamped(n: c_int) -> c_int {
    clamp_of(n).unwrap_or(n)
}

/// [`clamped`], or `None` past `FD_SETSIZE` when the table's size cannot
/// be read (no `/proc`).
fn clamp_of(n: c_int) -> Option<c_int> {
    if n <= libc::FD_SETSIZE as c_int {
        return Some(n);
    }
    let size = sys::without_cancel(|| std::fs::read_to_string("/proc/self/status"))
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("FDSize:"))
                .and_then(|v| v.trim().parse::<c_int>().ok())
        });
    size.map(|s| n.min(s))
}

/// A `select` timeout as the kernel takes it: `EINVAL` for a negative
/// part, microseconds past a second carried into the seconds.
fn select_bound(t: &libc::timeval) -> Result<Duration, ()> {
    if t.tv_sec < 0 || t.tv_usec < 0 {
        return Err(());
    }
    Ok(
        Duration::from_secs(t.tv_sec as u64)
            .saturating_add(Duration::from_micros(t.tv_usec as u64)),
    )
}

mod polled;
use polled::Route;

#[cfg(test)]
mod tests;
