//! A `select` or `pselect` whose sets name a managed socket for input or
//! room, made as the interposed `poll` makes its wait (`poll_with`): the
//! sets become a `pollfd` list, each managed socket waited on for input
//! adds its connections, whose input wakes the call and is taken up on the
//! caller's thread, and the results go back into the sets as Linux's
//! select puts them (`fs/select.c`: readable for `POLLIN`, `POLLHUP` or
//! `POLLERR`, writable for `POLLOUT` or `POLLERR`, exceptional for
//! `POLLPRI`; a number that is not open fails the call with `EBADF`, its
//! sets as they were).
//!
//! Before, a `select` saw a DDP socket through its doorbell alone: every
//! arrival went through the progress thread (its read of the connection,
//! a doorbell byte, a wake-up of the program's `select`) — an `iperf3`
//! receiver's progress thread took ~46 % of a CPU reading for it. Now a
//! select loop is served as a poll loop is: by the calling thread.
//!
//! A signal is never lost between two waits (`poll_with` waits again after
//! a wake-up that was nothing for the caller): as in the doorbell path,
//! the asynchronous signals are blocked from the first wait to the return
//! and each wait is a `ppoll` with the caller's mask (a `pselect`'s own, or
//! the thread's) in place. A look (a zero bound) waits once and changes no
//! mask but a `pselect`'s own, for its one `ppoll`.
//!
//! A `select` that names no managed socket is the real one: nothing of
//! the library's is watched by it (before, every `select` turned the
//! process's DDP sockets over to the progress thread's watch for good, so
//! that their doorbells rang). `WARPSOCK_DDP_SELECT_DIRECT=0` keeps the
//! doorbell path (the module above) for every `select`.

use std::time::{Duration, Instant};

use libc::c_int;
use smallvec::SmallVec;

use super::super::{poll_with, ppoll_marked};
use super::{clamp_of, Restore, Words};
use crate::interpose::{cancel_first, cancel_point};
use crate::shim::fdtable;
use crate::shim::guard::{busy, enter};
use crate::shim::sys::{self, set_errno};

/// The events of `poll` that make a number readable, writable,
/// exceptional for `select` (Linux's `POLLIN_SET`, `POLLOUT_SET`,
/// `POLLEX_SET`).
const READABLE: i16 =
    libc::POLLIN | libc::POLLRDNORM | libc::POLLRDBAND | libc::POLLHUP | libc::POLLERR;
const WRITABLE: i16 = libc::POLLOUT | libc::POLLWRNORM | libc::POLLWRBAND | libc::POLLERR;
const EXCEPTIONAL: i16 = libc::POLLPRI;

/// Word `i` of the caller's set `p` (null: none) of `n` bits, the bits
/// at `n` and past it cleared (the kernel ignores them).
fn word(p: *mut libc::fd_set, i: usize, n: usize) -> u64 {
    if p.is_null() {
        return 0;
    }
    // SAFETY: the caller's set is readable for `n` bits rounded up to
    // words (what the kernel reads); it may not be aligned for them.
    let w = unsafe { p.cast::<u64>().add(i).read_unaligned() };
    match n - i * 64 {
        k if k >= 64 => w,
        k => w & ((1u64 << k) - 1),
    }
}

/// How a `select` is made ([`route`]).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Route {
    /// As a poll: its read or write set names a managed socket (`n`
    /// taken down as the kernel takes it).
    Polled(c_int),
    /// The real call: it names none (nothing of the library's to watch).
    Real,
    /// Through the doorbells (`WARPSOCK_DDP_SELECT_DIRECT=0`, or a call
    /// inside the library's own).
    Doorbells,
}

/// How the `select` over the read and write sets `sets` (null: none; `n`
/// bits each) is made. The scan reads the sets' numbers below the highest
/// ever managed alone (`fdtable::managed_below`): within what the caller
/// allocated (the kernel reads `n` bits, up to its table's size, which
/// every managed number is below), and nothing for a process that never
/// managed a socket.
pub(super) fn route(n: c_int, sets: [*mut libc::fd_set; 2]) -> Route {
    if busy() || !crate::xsock::config::get().select_direct {
        return Route::Doorbells;
    }
    let top = n.min(fdtable::managed_below());
    if top <= 0 || sets.iter().all(|p| p.is_null()) {
        return Route::Real;
    }
    // Past the low table (a managed number at or above 65536): the
    // kernel's clamp, read, bounds the scan; unknown, the doorbells.
    let Some(scan) = clamp_of(top) else {
        return Route::Doorbells;
    };
    let scan = scan as usize;
    let named = (0..scan.div_ceil(64)).any(|i| {
        let mut bits = word(sets[0], i, scan) | word(sets[1], i, scan);
        while bits != 0 {
            let fd = (i * 64) as c_int + bits.trailing_zeros() as c_int;
            if fdtable::maybe_managed(fd) {
                return true;
            }
            bits &= bits - 1;
        }
        false
    });
    if !named {
        return Route::Real;
    }
    // The call reads all `n` bits: past `FD_SETSIZE` only with the
    // kernel's clamp known.
    match if top == n {
        Some(scan as c_int)
    } else {
        clamp_of(n)
    } {
        Some(all) => Route::Polled(all),
        None => Route::Doorbells,
    }
}

/// The `select` over the caller's `sets` (null: none; `n` bits each, `n`
/// taken down already) for at most `bound` (`None`: no bound),
/// `wait_mask` the mask to wait with (`None`: the thread's), made as a
/// poll (module docs). Returns the number of bits set in the sets, or -1
/// with `errno` set (the sets then as they were).
pub(super) fn select(
    n: c_int,
    sets: [*mut libc::fd_set; 3],
    bound: Option<Duration>,
    wait_mask: Option<&libc::sigset_t>,
) -> c_int {
    cancel_first();
    let r = enter(-1, || {
        // A look (a zero bound: a rate-paced sender's `select` loop) waits
        // once: no mask to change.
        let restore = (bound != Some(Duration::ZERO)).then(|| Restore(sys::block_async_signals()));
        let mask: *const libc::sigset_t = match (wait_mask, &restore) {
            (Some(m), _) => m,
            (None, Some(r)) => &r.0,
            (None, None) => std::ptr::null(),
        };
        let n = n.max(0) as usize;
        let words = n.div_ceil(64);
        // Inline up to 16 numbers; past that the list is allocated, as the
        // interposed poll's is. `nums`: each entry's number (an entry
        // taken out of the wait below has -1 in `fds`).
        let mut fds: SmallVec<[libc::pollfd; 16]> = SmallVec::new();
        for i in 0..words {
            let [r, w, e] = sets.map(|p| word(p, i, n));
            let mut bits = r | w | e;
            while bits != 0 {
                let b = bits.trailing_zeros();
                bits &= bits - 1;
                let bit = 1u64 << b;
                let mut events = 0;
                for (set, ev) in [(r, libc::POLLIN), (w, libc::POLLOUT), (e, libc::POLLPRI)] {
                    if set & bit != 0 {
                        events |= ev;
                    }
                }
                fds.push(libc::pollfd {
                    fd: (i * 64) as c_int + b as c_int,
                    events,
                    revents: 0,
                });
            }
        }
        let nums: SmallVec<[c_int; 16]> = fds.iter().map(|p| p.fd).collect();
        let start = bound.filter(|b| !b.is_zero()).map(|_| Instant::now());
        loop {
            let left = super::super::remaining(bound, start, Instant::now());
            for p in fds.iter_mut() {
                p.revents = 0;
            }
            // SAFETY: a mask of ours, the caller's or null.
            let got = poll_with(&mut fds, left, &mut |p, left| unsafe {
                ppoll_marked(p, left, mask)
            });
            if got < 0 {
                return got;
            }
            if fds.iter().any(|p| p.revents & libc::POLLNVAL != 0) {
                set_errno(libc::EBADF);
                return -1;
            }
            let (out, count) = answers(&fds, &nums, words);
            if count > 0 || got == 0 || left.is_some_and(|l| l.is_zero()) {
                for (p, o) in sets.iter().zip(&out) {
                    if !p.is_null() {
                        for (i, &w) in o.iter().enumerate() {
                            // SAFETY: the caller's set, writable for `n`
                            // bits rounded up to words (what the kernel
                            // writes).
                            unsafe { p.cast::<u64>().add(i).write_unaligned(w) };
                        }
                    }
                }
                return count;
            }
            // Only what select does not report (poll always reports a
            // hang-up and an error: an except-only number's, a write-only
            // number's hang-up): Linux's select sleeps on. Those states
            // last, so their entries leave the wait, which goes on for
            // what is left.
            for p in fds.iter_mut().filter(|p| p.revents != 0) {
                p.fd = -1;
            }
        }
    });
    cancel_point(r as isize);
    r
}

/// The sets `fds`' results make (entry `k` is number `nums[k]`), `words`
/// words each, and how many bits they set.
fn answers(fds: &[libc::pollfd], nums: &[c_int], words: usize) -> ([Words; 3], c_int) {
    let mut out: [Words; 3] = std::array::from_fn(|_| smallvec::smallvec![0u64; words]);
    let mut count = 0;
    for (p, &fd) in fds.iter().zip(nums) {
        let (i, bit) = (fd as usize / 64, 1u64 << (fd % 64));
        for (k, (asked, shows)) in [
            (libc::POLLIN, READABLE),
            (libc::POLLOUT, WRITABLE),
            (libc::POLLPRI, EXCEPTIONAL),
        ]
        .into_iter()
        .enumerate()
        {
            if p.events & asked != 0 && p.revents & shows != 0 {
                out[k][i] |= bit;
                count += 1;
            }
        }
    }
    (out, count)
}
