//! How a DDP socket's doorbell is waited on by calls that see the socket
//! through it alone (`select`, `pselect`, the `epoll_wait` family):
//! [`doorbell_wait`] puts the process's sockets on the progress thread's
//! watch from the first such call on (for epoll, only those no set of the
//! program's watches itself: `shim::epollwatch`).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use super::{DdpSock, SOCKS};
use crate::shim::fdtable;

/// The program has waited in a call that sees DDP sockets only through
/// their doorbells (`select`, `pselect`), or the `epoll_wait` family.
pub(super) static DOORBELL_WAITS: AtomicBool = AtomicBool::new(false);

/// The program has waited in `select` or `pselect` (or in an epoll set
/// while its sets could not watch connections themselves:
/// `shim::epollwatch`): every DDP socket keeps the progress thread's
/// watch.
pub(super) static SELECT_WAITS: AtomicBool = AtomicBool::new(false);

/// Doorbell bytes written for DDP sockets (`ddp_bells` of
/// `WARPSOCK_STATS`): each costs a `sendto` here and a drain later.
pub(in crate::xsock) static BELLS: AtomicU64 = AtomicU64::new(0);

/// Before the program waits in `select` or `pselect` (`always`), or the
/// `epoll_wait` family: those see a DDP socket only through its doorbell,
/// which only the progress thread rings while the program waits — unless
/// an epoll set watches the socket's connection itself
/// (`shim::epollwatch`). From the first such call on, every DDP socket of
/// the process, present and future, keeps the progress thread's watch
/// ([`XSocket::set_background`]; after an epoll wait only while no set of
/// the program's watches its connection,
/// [`XSocket::set_epoll_background`]): which sockets a `select` waits on
/// is not known here, and a socket another thread switches and adds to a
/// set this thread already waits on must be watched too. Programs that
/// only make blocking calls and `poll` never get here, and their sockets
/// wake no thread besides their own.
pub(crate) fn doorbell_wait(always: bool) {
    if DOORBELL_WAITS.load(Ordering::Relaxed) && (!always || SELECT_WAITS.load(Ordering::Relaxed)) {
        return;
    }
    let first = !DOORBELL_WAITS.swap(true, Ordering::SeqCst);
    let first_always = always && !SELECT_WAITS.swap(true, Ordering::SeqCst);
    if !first && !first_always {
        return;
    }
    let socks: Vec<Arc<DdpSock>> = SOCKS.lock().values().filter_map(Weak::upgrade).collect();
    // A socket closed meanwhile whose last reference this walk holds
    // closes here with no wait (review r26-b item 1: the program's
    // `epoll_wait` stalled for another thread's lingering close).
    let held: Vec<Arc<DdpSock>> = fdtable::without_close_waits(|| {
        // Each socket watched from now on, and the readable bytes nobody
        // rang for shown (no one could wait on the doorbell until now:
        // see `DdpSock::reflect`; nor, for a `select` after epoll waits,
        // input those waits reported themselves: `shim::epollwatch`) —
        // where its lock is free now.
        socks
            .into_iter()
            .filter(|s| !s.try_watch_and_show(always))
            .collect()
    });
    if !held.is_empty() {
        finish_walk(held, always);
    }
}

/// The rest of [`doorbell_wait`]'s walk: sockets whose lock another
/// thread held. Made on a thread of the library's: the program's wait
/// goes on at once, and a bell rung then wakes it as any later one would.
/// That thread only tries the locks too, round after round (1 ms apart,
/// doubling up to [`WALK_RETRY_MAX`]), dropping each socket as it is done:
/// a lock held for good (a thread that faulted under it,
/// `tests/c/ddpstuck.c` `late`) keeps that socket's try going, not the
/// program's first `select` or epoll wait, and not the other sockets
/// (review 47 item 2; review 49: a thread waiting for each lock in turn
/// left every socket behind a stuck one unwatched, and its reference
/// held, for ever). Up to two such threads a process (the epoll walk's,
/// the `select` walk's), each ending once its sockets are done. Made here,
/// waiting, if no thread can be started.
fn finish_walk(held: Vec<Arc<DdpSock>>, always: bool) {
    let theirs = held.clone();
    let spawned = crate::shim::sys::spawn_library_thread("warpsock-walk", move || {
        // A library thread for good (as the reaper): not cancelled, its
        // calls not the program's, its drops handing closes over at once
        // (`fdtable::without_close_waits`).
        crate::shim::sys::no_cancel();
        let mut left = theirs;
        let mut pause = std::time::Duration::from_millis(1);
        while !left.is_empty() {
            crate::shim::guard::enter((), || {
                fdtable::without_close_waits(|| left.retain(|s| !s.try_watch_and_show(always)));
            });
            if left.is_empty() {
                break;
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(WALK_RETRY_MAX);
        }
    });
    // Ours go without a close's wait, as the walk's (a last reference),
    // dropped at the closure's end.
    fdtable::without_close_waits(move || {
        if spawned.is_err() {
            for s in held {
                if always {
                    s.keep_watched();
                } else {
                    s.keep_epoll_watched();
                }
                s.x.show_now(|r| s.reflect(r));
            }
        }
    });
}

/// The longest pause between two rounds of [`finish_walk`]'s tries.
const WALK_RETRY_MAX: std::time::Duration = std::time::Duration::from_secs(1);

impl DdpSock {
    /// The progress thread watches this socket from now on
    /// ([`doorbell_wait`]).
    pub(super) fn keep_watched(&self) {
        if !self.background.swap(true, Ordering::AcqRel) {
            self.x.set_background(true);
        }
    }

    /// The progress thread watches this socket from now on while no epoll
    /// set of the program's watches its connection ([`doorbell_wait`]).
    pub(super) fn keep_epoll_watched(&self) {
        if !self.epoll_background.swap(true, Ordering::AcqRel) {
            self.x.set_epoll_background(true);
        }
    }

    /// [`Self::keep_watched`] (`always`: a `select`'s) or
    /// [`Self::keep_epoll_watched`], and the look shown, in one take of the
    /// socket's lock if it is free now ([`doorbell_wait`]'s walk): false,
    /// having done nothing, if another thread holds it.
    fn try_watch_and_show(&self, always: bool) -> bool {
        let flag = if always {
            &self.background
        } else {
            &self.epoll_background
        };
        // Set twice at worst (two walks at once): the same flag, on.
        let watch = !flag.load(Ordering::Acquire);
        if !self
            .x
            .try_watch_and_show(watch, !always, |r| self.reflect(r))
        {
            return false;
        }
        if watch {
            flag.store(true, Ordering::Release);
        }
        true
    }

    /// Signal-driven I/O turned on or off ([`crate::shim::socket::Socket::set_async`]):
    /// on, every arrival rings a bell (the kernel's `SIGIO` on the
    /// doorbell's end) with no waiter in sight, so the progress thread
    /// watches the socket from now on (as for `select`: a signal is due
    /// while no call of the program runs). Bytes queued before signal
    /// nothing, as over TCP (`fasync` only registers).
    pub(crate) fn signal_driven(&self, on: bool) {
        if !self.signals.swap(on, Ordering::SeqCst) && on {
            self.keep_watched();
        }
    }
}
