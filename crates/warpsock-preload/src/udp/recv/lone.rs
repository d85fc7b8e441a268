//! A non-blocking receive's short path on a socket fed by one parked
//! connection ([`Sock::recv_lone`]), and the look for datagrams polls
//! held ([`Sock::serve_held`]): split from `recv.rs`, whose module docs
//! give the wait model they serve.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use libc::{c_int, msghdr};
use smallvec::SmallVec;

use super::super::config;
use super::super::conn::{Conn, HINT_UP};
use super::super::serve::{Served, Via};
use super::super::sock::Sock;
use super::super::stats::{self, STATS};
use super::driven::DRIVEN_INLINE;
use crate::shim::reactor;
use crate::shim::sys::{lock, set_errno};

#[cfg(test)]
mod tests;

impl Sock {
    /// A non-blocking receive on a socket fed by one parked connection and
    /// nothing else: a busy-poll spin, and in an event loop the receive
    /// after a poll and the drain to `EAGAIN`. One look under the socket's
    /// lock finds what `take` would (nothing queued, none ready, no
    /// doorbell, the kernel socket not marked readable, no `UDP_GRO`
    /// buffer) and glances at the connection (`Conn::glance`), which is
    /// then served as the general path below would serve it after `take`
    /// and `Driven::claim`: its held datagram first, else one read. What
    /// that path added per call (a second look at the socket, a walk of
    /// its connections with their `Arc`s, the socket's `Weak` upgraded,
    /// the claim's bookkeeping, the socket's lock twice more in `serve`)
    /// found nothing it did not. `None`: another case (or the connection
    /// changed meanwhile); the general path decides, as if this had not
    /// looked.
    ///
    /// # Safety
    /// `msg` must be a valid msghdr whose buffers are writable.
    pub(super) unsafe fn recv_lone(&self, msg: &mut msghdr, flags: c_int) -> Option<isize> {
        if self.gro.is_some() || !config::get().caller_recv {
            return None;
        }
        let eng = reactor::current()?;
        let (c, peer, holds) = {
            let g = lock(&self.inner);
            // (A listed connection does not read, `Conn::set_ready` under
            // this lock: `glance` below refuses it too.)
            if g.owned.len() != 1
                || g.bells != 0
                || g.udp_maybe
                || !g.rxq.is_empty()
                || !g.ready.is_empty()
            {
                return None;
            }
            let c = g.owned.values().next()?;
            if c.hint.load(Ordering::Relaxed) != HINT_UP {
                return None;
            }
            c.glance()?;
            let c = c.clone();
            (c, g.peer, self.holds.load(Ordering::Acquire))
        };
        let held = c.held.swap(false, Ordering::Acquire);
        // SAFETY: the application's msghdr (contract).
        match unsafe { self.serve(eng, &c, msg, flags, Via::Lone, peer) } {
            Served::Dgram(n) => {
                if held {
                    // The socket's only connection held the datagram: every
                    // hold counted when it was looked at is served.
                    self.holds_seen.fetch_max(holds, Ordering::Relaxed);
                }
                stats::inc(&STATS.rx_lone);
                Some(n)
            }
            // Nothing, and the connection lives (one that died in the read
            // is marked dead by then, under `st`): `EAGAIN` now, without the
            // watch's lock (`Conn::still_reading`, which the general path
            // asks so as not to poll a connection it must give up; this
            // path polls nothing).
            Served::Nothing | Served::Spent if c.hint.load(Ordering::Relaxed) == HINT_UP => {
                // A poll in another thread may have held a datagram on the
                // connection since this read found nothing (the poll said
                // readable): `held_or_again` serves it.
                #[cfg(test)]
                tests::after_empty_serve(self, &c);
                // SAFETY: the application's msghdr (contract).
                let r = unsafe { self.held_or_again(msg, flags, Some(1)) };
                if r < 0 {
                    stats::inc(&STATS.rx_lone);
                }
                Some(r)
            }
            Served::Nothing | Served::Spent => None,
        }
    }

    /// The end of a non-blocking receive that found nothing else: a
    /// datagram a poll held, from wherever its connection is now
    /// ([`Sock::serve_held`]), or `EAGAIN`, counted as an empty call that
    /// made `looks` system calls looking (`None`: not counted).
    ///
    /// # Safety
    /// `msg` must be a valid msghdr whose buffers are writable.
    #[inline]
    pub(super) unsafe fn held_or_again(
        &self,
        msg: &mut msghdr,
        flags: c_int,
        looks: Option<u64>,
    ) -> isize {
        // SAFETY: the caller's contract.
        if let Some(n) = unsafe { self.serve_held(msg, flags) } {
            return n;
        }
        if let Some(looks) = looks {
            stats::inc(&STATS.rx_nb_empty);
            stats::add(&STATS.rx_nb_empty_looks, looks);
        }
        set_errno(libc::EAGAIN);
        -1
    }

    /// Serves a datagram a poll read (`hold_frame`) from whichever of the
    /// socket's connections holds one, claimed, parked or not: a
    /// non-blocking receive found nothing else. The parked path
    /// (`Driven`) reaches a held datagram only while its connection is
    /// parked; one given back meanwhile (`Conn::unclaim`, `park::release_all`,
    /// `set_interest`) is announced by the progress thread's timer only
    /// later, and one moved to the ready list after `take` looked is no
    /// longer parked: the receive returned `EAGAIN` although the poll had
    /// said readable. Two atomic loads when every hold was looked behind
    /// (`Sock::holds_seen`).
    ///
    /// # Safety
    /// `msg` must be a valid msghdr whose buffers are writable.
    #[inline]
    pub(super) unsafe fn serve_held(&self, msg: &mut msghdr, flags: c_int) -> Option<isize> {
        let holds = self.holds.load(Ordering::Acquire);
        if holds == self.holds_seen.load(Ordering::Relaxed) {
            return None;
        }
        // SAFETY: the caller's contract.
        unsafe { self.serve_held_look(msg, flags, holds) }
    }

    /// [`Sock::serve_held`]'s look, behind the `holds` count `holds`.
    ///
    /// # Safety
    /// `msg` must be a valid msghdr whose buffers are writable.
    #[inline(never)]
    unsafe fn serve_held_look(&self, msg: &mut msghdr, flags: c_int, holds: u64) -> Option<isize> {
        let eng = reactor::current()?;
        stats::inc(&STATS.rx_held_looks);
        let (held, front) = {
            let g = lock(&self.inner);
            let held: SmallVec<[Arc<Conn>; DRIVEN_INLINE]> = g.held().cloned().collect();
            // None held any more: the progress thread may have announced
            // it since `take` looked, on the ready list first, then
            // un-held (`Conn::handle`, under this lock between the two):
            // then it is on the list now.
            let front = held.is_empty().then(|| g.ready.front().cloned()).flatten();
            (held, front)
        };
        // Every hold counted so far is behind this look, unless another
        // held connection waits after the one served (then the next
        // receive looks again).
        let mut seen = true;
        let mut served = None;
        if let Some(c) = front {
            let peer = self.peer();
            // SAFETY: the application's msghdr (contract).
            let r = unsafe { self.serve(eng, &c, msg, flags, Via::Ready, peer) };
            if let Served::Dgram(n) = r {
                served = Some(n);
            }
        } else {
            for c in &held {
                if served.is_some() {
                    seen = false;
                    break;
                }
                if c.held.swap(false, Ordering::Acquire) {
                    let peer = self.peer();
                    // SAFETY: the application's msghdr (contract).
                    let r = unsafe { self.serve(eng, c, msg, flags, Via::Direct, peer) };
                    if let Served::Dgram(n) = r {
                        served = Some(n);
                    }
                }
            }
        }
        if seen {
            self.holds_seen.fetch_max(holds, Ordering::Relaxed);
        }
        served
    }
}
