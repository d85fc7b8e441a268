//! The interposed waiting calls. `poll`/`ppoll` over a managed socket
//! also watch its connections (input there wakes the call directly, with
//! no thread hand-off); so do the program's epoll sets, which hold the
//! connections too (`epoll`, `shim::epollwatch`); `select` and
//! `pselect` see managed sockets through their doorbells only, so each
//! kind first makes sure its doorbells tell the truth
//! (`Kind::before_wait`).

use libc::c_int;
use smallvec::SmallVec;

use super::{cancel_first, cancel_point, KINDS};
use crate::shim::fdtable;
use crate::shim::guard::{busy, enter};
use crate::shim::real;
use crate::shim::socket::{kernel_asks, PollCall, Socket, Wait, POLL_ALONE_MAX, WAIT_CHUNK};
use crate::shim::sys::{self, set_errno};

/// Before a wait that sees managed sockets through their doorbells only.
fn before_doorbell_wait() {
    if !busy() {
        enter((), || {
            for k in KINDS {
                k.before_wait();
            }
        });
    }
}

pub mod epoll;
pub mod select;

/// `poll`/`ppoll` over `fds`: managed sockets waited on for input add
/// their extra descriptors (their connections), so that input on them
/// wakes this call directly; what they report is taken up and shown on the
/// program's descriptor. A managed socket waited on for room whose send
/// would fail now is waited on through the descriptor it names
/// (`Socket::write_wait`), so that `POLLOUT` is exact. `wait(fds, left)` is the real call with at most
/// `left` to wait (`None`: no limit), `timeout` the caller's bound. Returns
/// the call's result; a wake-up that turns out to be nothing for the
/// program waits again for the rest of the time.
fn poll_with(
    fds: &mut [libc::pollfd],
    timeout: Option<std::time::Duration>,
    wait: PollCall<'_>,
) -> c_int {
    // The clock is read only for a bounded wait that is not a mere look
    // (`poll(…, 0)` and `poll(…, -1)` read none; an event loop's round trip
    // makes one of each): the first wait is the caller's bound, and only a
    // wake-up that turned out to be nothing waits again, for what is left.
    let start = timeout
        .filter(|t| !t.is_zero())
        .map(|_| std::time::Instant::now());
    let mut again = false;
    loop {
        let left = if again {
            remaining(timeout, start, std::time::Instant::now())
        } else {
            timeout
        };
        again = true;
        let (n, count) = match alone(fds, left, wait) {
            Some(n) => (n, shown(fds)),
            None => match general(fds, left, wait) {
                Ok(r) => r,
                Err(done) if kicked(done) => continue,
                Err(done) => return done,
            },
        };
        if n < 0 {
            if kicked(n) {
                continue;
            }
            return n;
        }
        if answered(count, n, timeout, start) {
            return count;
        }
    }
}

/// The input a poll may ask of a managed socket: `POLLIN`, and
/// `POLLRDNORM` or `POLLRDHUP` alone (a poll for the peer's half-close:
/// it went to the doorbell alone, which nothing rang while the progress
/// thread's watch was off; review 57).
const INPUT: i16 = libc::POLLIN | libc::POLLRDNORM | libc::POLLRDHUP;

/// One wait of `poll_with`'s general path: the managed sockets' extra
/// descriptors added, their wake-ups taken up and shown on the program's
/// descriptors. Returns the real call's result and the count of the
/// program's descriptors that show something, or `Err`: the call's
/// answer (no managed socket took part). Out of line: the fast path's
/// calls do not pay for its frame.
#[inline(never)]
fn general(
    fds: &mut [libc::pollfd],
    left: Option<std::time::Duration>,
    wait: PollCall<'_>,
) -> Result<(c_int, c_int), c_int> {
    // Inline (no allocation) for the common few descriptors.
    let mut ext: SmallVec<[libc::pollfd; 8]> = SmallVec::from_slice(fds);
    let mut waits: SmallVec<[_; 2]> = SmallVec::new();
    // (program's index, index in `ext`) of sockets waited on for room.
    let mut outs: SmallVec<[(usize, usize); 2]> = SmallVec::new();
    for (i, p) in fds.iter().enumerate() {
        let Some(s) = fdtable::get(p.fd) else {
            continue;
        };
        ext[i].events = kernel_asks(&*s, p).events;
        if p.events & libc::POLLOUT != 0 {
            if let Some(fd) = s.write_wait() {
                ext[i].events &= !libc::POLLOUT;
                outs.push((i, ext.len()));
                ext.push(libc::pollfd {
                    fd,
                    events: libc::POLLOUT,
                    revents: 0,
                });
            }
        }
        // Input, or no event but those every poll gets (`POLLERR`,
        // `POLLHUP`: a poll for the connection's failure or end alone,
        // `events` 0 or `POLLERR`) where the socket asks for it
        // (`Socket::watch_for_end`): driven as for input. Before, such a
        // poll went to the doorbell alone, which nothing drove while the
        // progress thread's watch was off: a reset showed only at the
        // program's next call (diffuzz seed 292).
        if p.events & INPUT == 0 && (p.events & libc::POLLOUT != 0 || !s.watch_for_end()) {
            continue;
        }
        if let Some(w) = s.wait_begin() {
            let start = ext.len();
            ext.extend(w.fds.iter().map(|&fd| libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            }));
            waits.push((i, s, w, start));
        }
    }
    if waits.is_empty() && outs.is_empty() {
        // As asked of the kernel (`kernel_asks`).
        let n = wait(&mut ext, left);
        for (p, x) in fds.iter_mut().zip(&ext) {
            p.revents = x.revents;
        }
        return Err(n);
    }
    let chunked = chunked(waits.iter().any(|(_, _, w, _)| w.chunked), left);
    let n = wait(&mut ext, if chunked { Some(WAIT_CHUNK) } else { left });
    let e = if n < 0 { sys::errno() } else { 0 };
    // (program's index, bits its socket shows: `Socket::wait_end`).
    let mut shows: SmallVec<[(usize, i16); 2]> = SmallVec::new();
    for (i, s, w, start) in waits {
        let revents: SmallVec<[i16; 8]> = ext[start..start + w.fds.len()]
            .iter()
            .map(|p| p.revents)
            .collect();
        let bits = s.wait_end(w, &revents);
        if bits != 0 {
            shows.push((i, bits));
        }
    }
    if n < 0 {
        set_errno(e);
        return Ok((n, 0));
    }
    if chunked && n == 0 && shows.is_empty() {
        // A chunk of a longer wait ran out: a wake-up for nothing, and
        // `poll_with` waits again for what is left.
        return Ok((1, 0));
    }
    let room = libc::POLLOUT | libc::POLLERR | libc::POLLHUP | libc::POLLNVAL;
    let writable: SmallVec<[usize; 2]> = outs
        .iter()
        .filter(|(_, j)| ext[*j].revents & room != 0)
        .map(|(i, _)| *i)
        .collect();
    let mut count = 0;
    for (i, p) in fds.iter_mut().enumerate() {
        p.revents = ext[i].revents;
        if let Some(&(_, bits)) = shows.iter().find(|(j, _)| *j == i) {
            p.revents |= asked(p, bits);
        }
        if writable.contains(&i) {
            p.revents |= libc::POLLOUT;
        }
        if p.revents != 0 {
            count += 1;
        }
    }
    Ok((n, count))
}

/// The common shape, one managed socket waited on for input only (maybe
/// beside plain descriptors, at most `POLL_ALONE_MAX` in all), taken by
/// its kind's fast path (`Socket::poll_alone`), or, for a lone socket of a
/// kind without one (DDP), by `lone`: the real call's result with every
/// `revents` set, or `None` for the general path.
fn alone(
    fds: &mut [libc::pollfd],
    left: Option<std::time::Duration>,
    wait: PollCall<'_>,
) -> Option<c_int> {
    let [p] = fds else {
        return among(fds, left, wait);
    };
    // The common case: the caller checked that it may be managed.
    if p.events & (libc::POLLIN | libc::POLLOUT) != libc::POLLIN {
        return None;
    }
    let s = fdtable::get(p.fd)?;
    if let Some(n) = s.poll_alone(fds, 0, left, wait) {
        return Some(n);
    }
    Some(lone(&*s, &mut fds[0], left, wait))
}

/// `general`'s work for one managed socket `s` waited on for input only
/// (its descriptor `p`), without its lists: `wait_begin`, the real call
/// over the program's descriptor and the socket's, `wait_end`. Returns the
/// real call's result with `p.revents` set as `general` sets it.
fn lone(
    s: &dyn Socket,
    p: &mut libc::pollfd,
    left: Option<std::time::Duration>,
    wait: PollCall<'_>,
) -> c_int {
    let Some(w) = s.wait_begin() else {
        let mut q = kernel_asks(s, p);
        let n = wait(std::slice::from_mut(&mut q), left);
        p.revents = q.revents;
        return n;
    };
    if chunked(w.chunked, left) {
        return lone_chunk(s, p, w, wait);
    }
    let mut ext: SmallVec<[libc::pollfd; 4]> = SmallVec::new();
    ext.push(kernel_asks(s, p));
    ext.extend(w.fds.iter().map(|&fd| libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    }));
    let n = wait(&mut ext, left);
    let e = if n < 0 { sys::errno() } else { 0 };
    let revents: SmallVec<[i16; 4]> = ext[1..].iter().map(|x| x.revents).collect();
    let bits = s.wait_end(w, &revents);
    if n < 0 {
        set_errno(e);
        return n;
    }
    p.revents = ext[0].revents | asked(p, bits);
    n
}

/// Of the bits `Socket::wait_end` says the program's descriptor `p`
/// shows, those its poll reports: the ones asked for, and `POLLERR` and
/// `POLLHUP` always (as the kernel's poll). A descriptor that shows
/// nothing else shows nothing (the common wake-up: one test more for a
/// poll that did not ask for `POLLIN`, a `POLLRDHUP` alone).
#[inline(always)]
fn asked(p: &libc::pollfd, bits: i16) -> i16 {
    if bits == libc::POLLIN && p.events & libc::POLLIN != 0 {
        return libc::POLLIN;
    }
    bits & (p.events | libc::POLLERR | libc::POLLHUP)
}

/// `lone` for a socket whose wait asks for chunks (`Wait::chunked`), the
/// caller's bound longer: one chunk, as `lone` waits, and a chunk that
/// runs out is, as in `general`, a wake-up for nothing (`poll_with` waits
/// again). Out of line and with lists of its own (a `Vec` per chunk): the
/// direct poll's path pays a test for it, and keeps its inlined
/// `SmallVec` code (a shared copy cost it ~60 instructions).
#[inline(never)]
fn lone_chunk(s: &dyn Socket, p: &mut libc::pollfd, w: Wait, wait: PollCall<'_>) -> c_int {
    let mut ext = Vec::with_capacity(1 + w.fds.len());
    ext.push(kernel_asks(s, p));
    ext.extend(w.fds.iter().map(|&fd| libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    }));
    let n = wait(&mut ext, Some(WAIT_CHUNK));
    let e = if n < 0 { sys::errno() } else { 0 };
    let revents: Vec<i16> = ext[1..].iter().map(|x| x.revents).collect();
    let bits = s.wait_end(w, &revents);
    if n < 0 {
        set_errno(e);
        return n;
    }
    p.revents = ext[0].revents | asked(p, bits);
    if n == 0 && bits == 0 {
        return 1;
    }
    n
}

/// Whether the real wait is a chunk ([`WAIT_CHUNK`]) of the caller's
/// `left` (`None`: no limit): when a managed socket's wait asks for chunks
/// (`asked`, `Wait::chunked`) and `left` is longer. A chunk that runs out
/// is a wake-up for nothing: `poll_with` waits again for what is left,
/// each wait begun and ended anew.
#[inline(always)]
fn chunked(asked: bool, left: Option<std::time::Duration>) -> bool {
    asked && left.is_none_or(|l| l > WAIT_CHUNK)
}

/// `alone` of several descriptors: one of them managed (out of line, so
/// that the lone descriptor's case keeps its frame small).
#[inline(never)]
fn among(
    fds: &mut [libc::pollfd],
    left: Option<std::time::Duration>,
    wait: PollCall<'_>,
) -> Option<c_int> {
    if fds.len() > POLL_ALONE_MAX {
        return None;
    }
    let mut at = None;
    for (i, p) in fds.iter().enumerate() {
        if fdtable::maybe_managed(p.fd) {
            // A second managed socket, one waited on for room, or one
            // waited on for its end alone (`general` may drive it): the
            // general path.
            if at.is_some() || p.events & (libc::POLLIN | libc::POLLOUT) != libc::POLLIN {
                return None;
            }
            at = Some(i);
        }
    }
    let at = at?;
    fdtable::get(fds[at].fd)?.poll_alone(fds, at, left, wait)
}

/// How many of the program's descriptors show something.
fn shown(fds: &[libc::pollfd]) -> c_int {
    match fds {
        [p] => c_int::from(p.revents != 0),
        _ => fds.iter().filter(|p| p.revents != 0).count() as c_int,
    }
}

/// Whether a wait whose real call returned `n` (not an error), `count` of
/// the program's descriptors showing something, is the call's answer: a
/// wake-up for nothing (`n > 0`, `count == 0`) waits again while time is
/// left.
fn answered(
    count: c_int,
    n: c_int,
    timeout: Option<std::time::Duration>,
    start: Option<std::time::Instant>,
) -> bool {
    count > 0
        || n == 0
        || remaining(timeout, start, std::time::Instant::now()).is_some_and(|l| l.is_zero())
}

/// What is left at `now` of a wait bounded by `timeout` (`None`: no bound)
/// that started at `start` (`None`: a zero bound, nothing left).
pub(super) fn remaining(
    timeout: Option<std::time::Duration>,
    start: Option<std::time::Instant>,
    now: std::time::Instant,
) -> Option<std::time::Duration> {
    let t = timeout?;
    Some(start.map_or(std::time::Duration::ZERO, |s| {
        t.saturating_sub(now.saturating_duration_since(s))
    }))
}

/// Whether any of `fds` is a managed socket (waited on for input, room,
/// or only what every poll gets: `POLLERR`, `POLLHUP`).
fn polls_managed(fds: *const libc::pollfd, n: libc::nfds_t) -> bool {
    if fds.is_null() || n == 0 || busy() {
        return false;
    }
    // SAFETY: the caller's array of `n` pollfds.
    unsafe { std::slice::from_raw_parts(fds, n as usize) }
        .iter()
        .any(|p| fdtable::maybe_managed(p.fd))
}

/// `poll(2)`'s timeout for `left`: whole milliseconds, rounded up from
/// whole microseconds (-1: no limit). In 64 bits: the 128-bit division of
/// `Duration::as_micros` cost a poll about 60 instructions.
fn ms_of(left: Option<std::time::Duration>) -> c_int {
    left.map_or(-1, |d| {
        let micros = u64::from(d.subsec_micros());
        d.as_secs()
            .saturating_mul(1000)
            .saturating_add(micros.div_ceil(1000))
            .min(i32::MAX as u64) as c_int
    })
}

/// Interposed `poll(2)`: see `poll_with`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C-unwind" fn poll(
    fds: *mut libc::pollfd,
    n: libc::nfds_t,
    timeout: c_int,
) -> c_int {
    if !polls_managed(fds, n) {
        // SAFETY: forwarding the caller's arguments.
        return unsafe { real::poll(fds, n, timeout) };
    }
    // SAFETY: the caller's array of `n` pollfds.
    let fds = unsafe { std::slice::from_raw_parts_mut(fds, n as usize) };
    let bound = (timeout >= 0).then(|| std::time::Duration::from_millis(timeout as u64));
    cancel_first();
    let r = enter(-1, || {
        poll_with(fds, bound, &mut |p, left| {
            // Whole milliseconds, as `poll` takes them.
            let ms = ms_of(left);
            let ts = (ms >= 0).then(|| libc::timespec {
                tv_sec: libc::time_t::from(ms / 1000),
                tv_nsec: libc::c_long::from(ms % 1000) * 1_000_000,
            });
            // Marked: no lock is held over the sleep (an exit in a
            // handler over it may close the sockets: `at_exit`).
            // SAFETY: `p` is a valid pollfd array; no mask.
            warpsock_engine::asleep::unlocked(|| unsafe {
                sys::ppoll_raw(
                    p.as_mut_ptr(),
                    p.len() as libc::nfds_t,
                    ts,
                    std::ptr::null(),
                )
            })
        })
    });
    cancel_point(r as isize);
    r
}

/// Whether a wait of `poll_with` that returned `r` was ended by the signal
/// the preload's `pthread_cancel` sent to a thread whose cancellation is
/// disabled now (`warpsock_xsock::cancel::after_signal`): it then waits
/// again for what is left, as over TCP, where no signal or a handler that
/// does nothing leaves the poll asleep — not `EINTR`. Only on a wait that
/// failed.
#[cold]
fn kicked(r: c_int) -> bool {
    r < 0
        && warpsock_xsock::cancel::any()
        && sys::errno() == libc::EINTR
        && warpsock_xsock::cancel::after_signal() == Some(false)
}

/// Whether a fortified poll's array of `fdslen` bytes holds `n` entries:
/// glibc's `__poll_chk` and `__ppoll_chk` abort (`__chk_fail`) otherwise.
fn fortified_fits(n: libc::nfds_t, fdslen: libc::size_t) -> bool {
    fdslen / size_of::<libc::pollfd>() >= n as usize
}

/// Interposed `__poll_chk`: what a program built with `_FORTIFY_SOURCE`
/// calls for `poll` when the count is not a constant and the array's size
/// is known (glibc's `bits/poll2.h`; Debian's memcached, for one). Before,
/// nothing interposed it, and such a poll of a DDP-mode socket waited on
/// the doorbell alone, which nothing rings while the progress thread's
/// watch is off: for ever (review r22-e item 1). The size check stays
/// glibc's: an array too short goes to the real one, which aborts.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C-unwind" fn __poll_chk(
    fds: *mut libc::pollfd,
    n: libc::nfds_t,
    timeout: c_int,
    fdslen: libc::size_t,
) -> c_int {
    if !fortified_fits(n, fdslen) {
        // SAFETY: forwarding the caller's arguments (glibc fails the check).
        return unsafe { real::__poll_chk(fds, n, timeout, fdslen) };
    }
    // SAFETY: the caller's array of `n` pollfds, checked above.
    unsafe { poll(fds, n, timeout) }
}

/// Interposed `__ppoll_chk`: `ppoll` for `_FORTIFY_SOURCE` programs, as
/// [`__poll_chk`].
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C-unwind" fn __ppoll_chk(
    fds: *mut libc::pollfd,
    n: libc::nfds_t,
    timeout: *const libc::timespec,
    mask: *const libc::sigset_t,
    fdslen: libc::size_t,
) -> c_int {
    if !fortified_fits(n, fdslen) {
        // SAFETY: forwarding the caller's arguments (glibc fails the check).
        return unsafe { real::__ppoll_chk(fds, n, timeout, mask, fdslen) };
    }
    // SAFETY: the caller's array of `n` pollfds, checked above.
    unsafe { ppoll(fds, n, timeout, mask) }
}

/// Interposed `ppoll(2)`: see `poll_with`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C-unwind" fn ppoll(
    fds: *mut libc::pollfd,
    n: libc::nfds_t,
    timeout: *const libc::timespec,
    mask: *const libc::sigset_t,
) -> c_int {
    if !polls_managed(fds, n) {
        // SAFETY: forwarding the caller's arguments.
        return unsafe { real::ppoll(fds, n, timeout, mask) };
    }
    // SAFETY: the caller's array of `n` pollfds, and its timeout if given.
    let (fds, bound) = unsafe {
        (
            std::slice::from_raw_parts_mut(fds, n as usize),
            timeout.as_ref().map(|t| {
                std::time::Duration::new(
                    t.tv_sec.max(0) as u64,
                    t.tv_nsec.clamp(0, 999_999_999) as u32,
                )
            }),
        )
    };
    cancel_first();
    let r = enter(-1, || {
        // SAFETY: the caller's mask (ppoll's contract).
        poll_with(fds, bound, &mut |p, left| unsafe {
            ppoll_marked(p, left, mask)
        })
    });
    cancel_point(r as isize);
    r
}

/// The real `ppoll` of `p` for at most `left` (`None`: no limit) with
/// `mask` in place (null: the thread's), marked as a poll's sleep: no lock
/// is held over it (an exit in a handler over it may close the sockets:
/// `at_exit`).
///
/// # Safety
/// `mask` is null or a valid signal set.
pub(super) unsafe fn ppoll_marked(
    p: &mut [libc::pollfd],
    left: Option<std::time::Duration>,
    mask: *const libc::sigset_t,
) -> c_int {
    // SAFETY: `p` is a valid pollfd array; the caller vouches for `mask`.
    warpsock_engine::asleep::unlocked(|| unsafe {
        sys::ppoll_raw(
            p.as_mut_ptr(),
            p.len() as libc::nfds_t,
            left.map(sys::timespec),
            mask,
        )
    })
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::{ms_of, remaining};

    /// A wait that wakes for nothing waits again for what is left of the
    /// caller's bound (simulated time): never longer in all, never past it.
    #[test]
    fn a_wait_again_gets_what_is_left_of_the_bound() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        assert_eq!(remaining(None, None, t0 + ms(7)), None, "no bound");
        assert_eq!(remaining(Some(ms(0)), None, t0), Some(ms(0)), "a look");
        let b = Some(ms(50));
        assert_eq!(remaining(b, Some(t0), t0), Some(ms(50)));
        assert_eq!(remaining(b, Some(t0), t0 + ms(20)), Some(ms(30)));
        assert_eq!(remaining(b, Some(t0), t0 + ms(50)), Some(ms(0)));
        assert_eq!(remaining(b, Some(t0), t0 + ms(80)), Some(ms(0)), "past it");
    }

    /// A wait's bound in poll's milliseconds: rounded up from whole
    /// microseconds, as `Duration::as_micros().div_ceil(1000)` did, and
    /// capped.
    #[test]
    fn a_bound_in_milliseconds_rounds_whole_microseconds_up() {
        let cases = [
            (Duration::ZERO, 0),
            (Duration::from_nanos(999), 0),
            (Duration::from_nanos(1_000), 1),
            (Duration::from_micros(1_000), 1),
            (Duration::from_micros(1_001), 2),
            (Duration::from_millis(5_000), 5_000),
            (Duration::new(2, 999_999_999), 3_000),
            (Duration::new(3, 999), 3_000),
            (Duration::from_secs(u64::MAX), i32::MAX),
        ];
        for (d, want) in cases {
            assert_eq!(ms_of(Some(d)), want, "{d:?}");
            let old = d.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32;
            assert_eq!(ms_of(Some(d)), old, "{d:?} as before");
        }
        assert_eq!(ms_of(None), -1, "no limit");
    }
}
