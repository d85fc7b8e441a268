//! The interposed epoll calls. The sets the program makes are recorded
//! (`shim::epollcarry`: a managed socket's swap carries their
//! registrations); its registrations of managed sockets are followed, and
//! the set watches their connections too (`shim::epollwatch`: the
//! connection's TCP socket in the program's set, with a tag as data); and
//! a wait takes the tags out of its results, makes the rounds they ask
//! for (reporting the program's event itself, or collecting the
//! doorbells' events those rang), before it returns (`epoll_with`).

use std::time::{Duration, Instant};

use libc::{c_int, c_void, epoll_event};

use super::super::KINDS;
use super::remaining;
use crate::shim::guard::{busy, enter};
use crate::shim::real;
use crate::shim::socket::NEVER_SHOWN;
use crate::shim::{epollcarry, epollwatch, fdtable};

/// Interposed `epoll_create(2)`: the set is recorded so that a managed
/// socket's descriptor swap carries the program's registrations
/// (`shim::epollcarry`).
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn epoll_create(size: c_int) -> c_int {
    // SAFETY: forwarding the caller's argument.
    recorded(unsafe { real::epoll_create(size) })
}

/// Interposed `epoll_create1(2)`: as `epoll_create`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn epoll_create1(flags: c_int) -> c_int {
    // SAFETY: forwarding the caller's argument.
    recorded(unsafe { real::epoll_create1(flags) })
}

/// Records a set the program made (not one the library made for itself).
fn recorded(epfd: c_int) -> c_int {
    if !busy() && epfd >= 0 {
        epollcarry::created(epfd);
        epollwatch::set_made();
    }
    epfd
}

/// Interposed `epoll_ctl(2)`: the real call, then, for a managed socket
/// the call added or removed, the set's watch of its connection
/// (`shim::epollwatch`). A plain descriptor costs the descriptor table's
/// one check (and, once the process made a tag base, a look at the data).
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn epoll_ctl(
    epfd: c_int,
    op: c_int,
    fd: c_int,
    ev: *mut epoll_event,
) -> c_int {
    let managed = fdtable::maybe_managed(fd);
    // A managed socket's registration asks without what its kind never
    // shows (`hide_never_shown`), in the program's own call: a change made
    // after it would re-arm an `EPOLLONESHOT` registration another
    // thread's wait had taken already. Its event is read first (a bad
    // pointer faults here where the kernel would fail it with `EFAULT`, as
    // a managed socket's receive into a bad buffer does).
    let mut asked = (managed && op != libc::EPOLL_CTL_DEL && !ev.is_null())
        // SAFETY: the caller's event, which ADD and MOD read.
        .then(|| unsafe { *ev });
    let call_ev = match asked.as_mut() {
        Some(e) if e.events & NEVER_SHOWN as u16 as u32 != 0 => {
            hide_never_shown(fd, e);
            e as *mut epoll_event
        }
        _ => ev,
    };
    // SAFETY: forwarding the caller's arguments (its event, or a copy of
    // it with what the socket never shows taken out).
    let r = unsafe { real::epoll_ctl(epfd, op, fd, call_ev) };
    if r != 0 || busy() {
        return r;
    }
    if asked.is_none() && op != libc::EPOLL_CTL_DEL && !ev.is_null() {
        // SAFETY: the caller's event (ADD and MOD: read by the kernel
        // already).
        asked = Some(unsafe { *ev });
    }
    if let Some(e) = asked {
        // Checked against the tag base, once the process has one.
        epollwatch::program_data(e.u64);
    }
    if managed {
        enter((), || {
            let Some(s) = fdtable::get(fd) else { return };
            // DEL: only the number counts.
            let e = asked.unwrap_or(epoll_event { events: 0, u64: 0 });
            let reg = epollwatch::Reg {
                fd,
                events: e.events,
                data: e.u64,
            };
            if !s.epoll_change(epfd, op, reg) {
                epollwatch::follow(epfd, op, reg, &s);
            }
        });
    }
    r
}

/// Takes out of `e`, the program's registration (`ADD` or `MOD`) of the
/// managed descriptor `fd` asking for one of [`NEVER_SHOWN`], what the
/// socket `fd` names never shows (`Socket::never_shows`: a DDP socket's
/// doorbell would show `EPOLLWRBAND`, TCP never does).
#[cold]
fn hide_never_shown(fd: c_int, e: &mut epoll_event) {
    if busy() {
        return;
    }
    enter((), || {
        if let Some(s) = fdtable::get(fd) {
            e.events &= !fdtable::hide_of(&*s);
        }
    });
}

/// Interposed `epoll_wait(2)`: see `epoll_with`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C-unwind" fn epoll_wait(
    epfd: c_int,
    events: *mut epoll_event,
    max: c_int,
    timeout: c_int,
) -> c_int {
    epoll_with(epfd, events, max, millis(timeout), &mut |evs, n, left| {
        // SAFETY: forwarding the caller's set and (part of) its array.
        unsafe { real::epoll_wait(epfd, evs, n, to_millis(left, timeout)) }
    })
}

/// Interposed `epoll_pwait(2)`: see `epoll_with`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C-unwind" fn epoll_pwait(
    epfd: c_int,
    events: *mut epoll_event,
    max: c_int,
    timeout: c_int,
    mask: *const libc::sigset_t,
) -> c_int {
    epoll_with(epfd, events, max, millis(timeout), &mut |evs, n, left| {
        // SAFETY: forwarding the caller's arguments.
        unsafe { real::epoll_pwait(epfd, evs, n, to_millis(left, timeout), mask) }
    })
}

/// Interposed `epoll_pwait2(2)` (glibc 2.35): see `epoll_with`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C-unwind" fn epoll_pwait2(
    epfd: c_int,
    events: *mut epoll_event,
    max: c_int,
    timeout: *const libc::timespec,
    mask: *const libc::sigset_t,
) -> c_int {
    // SAFETY: the caller's timespec, if any.
    let asked = unsafe { timeout.as_ref() }.map(|t| {
        Duration::new(
            u64::try_from(t.tv_sec).unwrap_or(0),
            u32::try_from(t.tv_nsec).unwrap_or(0),
        )
    });
    epoll_with(epfd, events, max, asked, &mut |evs, n, left| {
        let ts = left.map(|l| libc::timespec {
            tv_sec: l.as_secs().min(libc::time_t::MAX as u64) as libc::time_t,
            tv_nsec: l.subsec_nanos() as libc::c_long,
        });
        let tp = match (&ts, left == asked) {
            // The caller's own bound first: passed as it is (a malformed
            // one gets the kernel's EINVAL).
            (_, true) => timeout,
            (Some(t), false) => t as *const libc::timespec,
            (None, false) => std::ptr::null(),
        };
        // SAFETY: forwarding the caller's arguments (the symbol exists: the
        // program linked against it).
        unsafe { real::epoll_pwait2(epfd, evs, n, tp.cast::<c_void>(), mask) }
    })
}

/// An epoll timeout in milliseconds as a bound (`None`: none).
fn millis(ms: c_int) -> Option<Duration> {
    u64::try_from(ms).ok().map(Duration::from_millis)
}

/// What is `left` in milliseconds for the real call: the caller's own
/// `asked` at first (the same bound), else rounded up.
fn to_millis(left: Option<Duration>, asked: c_int) -> c_int {
    match left {
        None => -1,
        Some(l) if millis(asked) == Some(l) => asked,
        Some(l) => c_int::try_from(l.as_nanos().div_ceil(1_000_000)).unwrap_or(c_int::MAX),
    }
}

/// Before an epoll wait: the watches the program's registrations left
/// end (`epollwatch::release_idle`), and each kind's doorbells tell the
/// truth where the set does not watch the connections itself
/// (`Kind::before_epoll_wait`).
fn before_epoll_wait() {
    enter((), || {
        // (A socket whose last reference this takes closes with no wait:
        // another thread's `close` may have let go of it meanwhile.)
        fdtable::without_close_waits(epollwatch::release_idle);
        for k in KINDS {
            k.before_epoll_wait();
        }
    });
}

/// An epoll wait of at most `max` events into `events`, bounded by
/// `timeout` (`None`: none); `wait(events, max, left)` is the real call
/// with `left` to wait. The tags in the results (`shim::epollwatch`) are
/// taken out and their sockets' rounds made ([`sift`]); what a round
/// rang a bell for is collected without waiting into the rest of the
/// array (once: what a second look would find comes with the next wait).
/// A wake-up that was nothing for the program waits again for what is
/// left of `timeout`.
fn epoll_with(
    epfd: c_int,
    events: *mut epoll_event,
    max: c_int,
    timeout: Option<Duration>,
    wait: &mut dyn FnMut(*mut epoll_event, c_int, Option<Duration>) -> c_int,
) -> c_int {
    if busy() {
        return wait(events, max, timeout);
    }
    before_epoll_wait();
    if max <= 0 || events.is_null() {
        return wait(events, max, timeout);
    }
    // SAFETY: the caller's array of `max` events.
    let evs = unsafe { std::slice::from_raw_parts_mut(events, max as usize) };
    let level = still_level(epfd, evs);
    if level > 0 {
        // Reported again (level-triggered, still readable): the kernel's
        // events beside them, with no wait.
        let rest = &mut evs[level..];
        let m = wait(rest.as_mut_ptr(), rest.len() as c_int, Some(Duration::ZERO));
        return if m > 0 {
            sift(evs, level, m as usize).0 as c_int
        } else {
            level as c_int
        };
    }
    let start = timeout.filter(|t| !t.is_zero()).map(|_| Instant::now());
    let mut left = timeout;
    loop {
        let n = wait(events, max, left);
        // Looked at after the wait: a registration made while it slept
        // (another thread's, a background switch's) may be in the results.
        if n <= 0 || !epollwatch::active() {
            return n;
        }
        // SAFETY: the caller's array of `max` events, `n` of them written.
        let evs = unsafe { std::slice::from_raw_parts_mut(events, max as usize) };
        let (mut kept, rang) = sift(evs, 0, n as usize);
        if rang && kept < evs.len() {
            let rest = &mut evs[kept..];
            let m = wait(rest.as_mut_ptr(), rest.len() as c_int, Some(Duration::ZERO));
            if m > 0 {
                kept = sift(evs, kept, m as usize).0;
            }
        }
        if kept > 0 {
            return kept as c_int;
        }
        left = remaining(timeout, start, Instant::now());
        if left.is_some_and(|l| l.is_zero()) {
            return 0;
        }
    }
}

/// The `n` results of a wait written at `evs[from..]`, after the `from`
/// kept already, with the tags taken out: this process's make their
/// sockets' rounds on this thread, and a socket that shows something for
/// a registration the call reports itself ([`epollwatch::Reg::reported`])
/// gets the program's event in the tag's place; a parent's tags are
/// dropped. Events that come with the data of one kept already (a
/// collection's second report of a level-triggered registration, a
/// report beside its doorbell's own) are merged into it: one event per
/// registration, as the kernel reports. Returns how many are kept, at the
/// front in order, and whether a round rang a bell instead (the kernel
/// reports that one).
fn sift(evs: &mut [epoll_event], from: usize, n: usize) -> (usize, bool) {
    sift_with(evs, from, n, epollwatch::tag_kind, arrival)
}

/// [`sift`], the tags told apart by `kind` ([`epollwatch::tag_kind`]) and
/// their rounds made by `arrive` ([`arrival`]).
///
/// A first wait's own events (the kernel's, one per registration) are
/// kept as they come, except one with the data of a report made in this
/// sift for a tag that came before it in the array: that is its
/// doorbell's event beside the report (a bell rung for the same bytes,
/// by a call's round before the wait), merged into it. Before, the order
/// decided: a report after the doorbell's event was merged, one before
/// it was not, and the program was told of the socket twice in one wait:
/// wrk, whose handler read the response at the first and got `EAGAIN`
/// at the second, counted a read error (~1 run in 50 of 2 s, session 43).
/// Two of the program's own events with the same data are two
/// registrations, kept apart as the kernel keeps them.
fn sift_with(
    evs: &mut [epoll_event],
    from: usize,
    n: usize,
    kind: impl Fn(u64) -> Option<bool>,
    mut arrive: impl FnMut(u64) -> Option<epoll_event>,
) -> (usize, bool) {
    let mut kept = from;
    let mut rang = false;
    // Where this sift put reports of its own (not the kernel's events).
    let mut reports: smallvec::SmallVec<[usize; 8]> = smallvec::SmallVec::new();
    for i in from..from + n {
        let ev = evs[i];
        let data = ev.u64;
        let add = match kind(data) {
            None if from == 0 => {
                // The first wait's own events: one per registration, merged
                // only into a report of this sift's (its doorbell's event).
                if let Some(&k) = reports.iter().find(|&&k| evs[k].u64 == data) {
                    evs[k].events |= ev.events;
                } else {
                    evs[kept] = ev;
                    kept += 1;
                }
                continue;
            }
            None => ev,
            Some(false) => continue,
            Some(true) => match arrive(data) {
                Some(e) => e,
                None => {
                    rang = true;
                    continue;
                }
            },
        };
        let d = add.u64;
        if let Some(k) = evs[..kept].iter_mut().find(|k| k.u64 == d) {
            k.events |= add.events;
        } else {
            evs[kept] = add;
            reports.push(kept);
            kept += 1;
        }
    }
    (kept, rang)
}

/// The sockets of set `epfd` a wait reported itself for a
/// level-triggered registration that are still readable
/// (`epollwatch::levels`): their events written at the front of `evs`
/// (as many as fit; the others are looked at by the next wait). Returns
/// how many.
fn still_level(epfd: c_int, evs: &mut [epoll_event]) -> usize {
    if !epollwatch::active() {
        return 0;
    }
    // (A socket whose last reference this holds closes with no wait.)
    enter(0, || {
        fdtable::without_close_waits(|| still_level_taken(epfd, evs))
    })
}

/// [`still_level`]'s work, inside the library.
fn still_level_taken(epfd: c_int, evs: &mut [epoll_event]) -> usize {
    let taken = epollwatch::levels(epfd);
    if taken.is_empty() {
        return 0;
    }
    {
        let mut n = 0;
        for (s, reg, tag) in taken {
            if n == evs.len() {
                // No room: looked at again by the next wait.
                epollwatch::mark_level(tag);
                continue;
            }
            let bits = s.direct_level() & reg.events;
            if bits != 0 {
                evs[n] = epoll_event {
                    events: bits,
                    u64: reg.data,
                };
                n += 1;
                epollwatch::mark_level(tag);
            }
        }
        n
    }
}

/// The round a tag asks for, on this thread (a socket whose last
/// reference this holds closes with no wait): the program's event to
/// report, if the registration is one the call reports itself and the
/// socket shows something it asked for.
fn arrival(tag: u64) -> Option<epoll_event> {
    enter(None, || {
        fdtable::without_close_waits(|| {
            let (s, reg) = epollwatch::arrival(tag)?;
            let Some(bits) = s.direct_arrival(reg.is_some()) else {
                // Asked again: the wait that follows sees it once the
                // other call's round is over.
                epollwatch::look_again(tag);
                return None;
            };
            // 0: shown on the doorbell (or nothing): collected.
            let reg = reg?;
            let bits = bits & (reg.events | (libc::EPOLLERR | libc::EPOLLHUP) as u32);
            if bits != 0 {
                epollwatch::REPORTED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if reg.events & libc::EPOLLET as u32 == 0 {
                    // Level-triggered: reported again while readable.
                    epollwatch::mark_level(tag);
                }
            }
            (bits != 0).then_some(epoll_event {
                events: bits,
                u64: reg.data,
            })
        })
    })
}

#[cfg(test)]
mod tests {
    use libc::epoll_event;

    use super::sift_with;

    const TAG: u64 = 1 << 63 | 0x55;
    const IN: u32 = libc::EPOLLIN as u32;
    const OUT: u32 = libc::EPOLLOUT as u32;

    fn ev(events: u32, data: u64) -> epoll_event {
        epoll_event { events, u64: data }
    }

    /// `evs` sifted as a first wait's results, the tag `TAG` reporting
    /// `EPOLLIN` for data 7: the events kept, as (events, data).
    fn sifted(mut evs: Vec<epoll_event>) -> Vec<(u32, u64)> {
        let n = evs.len();
        let kind = |d: u64| (d == TAG).then_some(true);
        let (kept, rang) = sift_with(&mut evs, 0, n, kind, |_| Some(ev(IN, 7)));
        assert!(!rang);
        evs[..kept].iter().map(|e| (e.events, e.u64)).collect()
    }

    /// A socket's report and its doorbell's own event in one wait are one
    /// event, whichever comes first in the kernel's array. Fails (two
    /// events for data 7, the report first: wrk's `EAGAIN`) with the
    /// first wait's own events kept unmerged.
    #[test]
    fn a_report_and_its_doorbells_event_are_one_in_either_order() {
        assert_eq!(sifted(vec![ev(IN, TAG), ev(IN, 7)]), [(IN, 7)]);
        assert_eq!(sifted(vec![ev(IN, 7), ev(IN, TAG)]), [(IN, 7)]);
        assert_eq!(
            sifted(vec![ev(IN, TAG), ev(OUT, 9), ev(IN | OUT, 7)]),
            [(IN | OUT, 7), (OUT, 9)]
        );
    }

    /// Two of the program's own registrations with the same data are two
    /// events, as the kernel reports them (no report of this sift's among
    /// them to merge into).
    #[test]
    fn the_programs_own_events_with_one_data_stay_apart() {
        assert_eq!(sifted(vec![ev(IN, 3), ev(OUT, 3)]), [(IN, 3), (OUT, 3)]);
        assert_eq!(
            sifted(vec![ev(IN, 3), ev(IN, TAG), ev(OUT, 3)]),
            [(IN, 3), (IN, 7), (OUT, 3)]
        );
    }
}
