//! The connections a blocking receive call drives itself ([`Driven`]) and
//! the per-thread spares of a poll's heap blocks ([`spare`]): split from
//! `recv.rs`, whose module docs give the wait model they serve.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use libc::c_int;
use smallvec::SmallVec;

use super::super::config;
use super::super::conn::{Conn, HINT_UP};
use super::super::sock::Sock;
use crate::shim::reactor::{self, Reactor};
use crate::shim::sys::lock;

/// The two heap blocks of a poll's [`Wait`] (its descriptor list and its
/// boxed claim), kept per thread for the next poll: a poll of one socket
/// allocates nothing once warm (they were the last two allocations per
/// `poll` of the event loop's round trip).
pub(super) mod spare {
    use std::cell::RefCell;

    use libc::c_int;

    use super::{Driven, DRIVEN_INLINE};

    /// Spares kept per thread (a poll of more offloaded sockets than this
    /// allocates for the others).
    const KEPT: usize = 4;

    type Claim = Box<Option<Driven>>;

    thread_local! {
        static SPARE: RefCell<Vec<(Vec<c_int>, Claim)>> = const { RefCell::new(Vec::new()) };
    }

    /// An empty descriptor list and an empty claim, from the thread's
    /// spares or new.
    pub(in super::super) fn take() -> (Vec<c_int>, Claim) {
        SPARE
            .try_with(|s| s.borrow_mut().pop())
            .ok()
            .flatten()
            .unwrap_or_else(|| (Vec::with_capacity(DRIVEN_INLINE), Box::new(None)))
    }

    /// Keeps a poll's blocks for the next (`claim` is empty: its
    /// connections were taken out).
    pub(in super::super) fn give(mut fds: Vec<c_int>, claim: Claim) {
        debug_assert!(claim.is_none());
        fds.clear();
        // A thread that is ending frees them instead.
        let _ = SPARE.try_with(|s| {
            let mut s = s.borrow_mut();
            if s.len() < KEPT {
                if s.capacity() == 0 {
                    s.reserve_exact(KEPT);
                }
                s.push((fds, claim));
            }
        });
    }
}

/// The connections a blocking receive call watches itself while it waits
/// (caller-driven receive): claimed from the progress thread on the first
/// wait, given back when the call returns. Only armed connections are
/// claimed (those on the ready list are the receive calls' already).
pub(super) struct Driven {
    pub(super) sock: Arc<Sock>,
    pub(super) eng: Option<&'static Reactor>,
    /// Inline up to [`DRIVEN_INLINE`]: no allocation per receive call.
    pub(super) conns: SmallVec<[(Arc<Conn>, c_int); DRIVEN_INLINE]>,
    /// The call returns a datagram, or a non-blocking call found nothing:
    /// leave the connections parked
    /// (`super::park`) rather than watched by the progress thread again.
    pub(super) park: bool,
    /// A non-blocking call's look at the parked connections
    /// ([`Conn::glance`]): nothing claimed, nothing to give back.
    pub(super) glance: bool,
}

/// A socket fed by more connections than this is left to the progress
/// thread (one poll over many descriptors per receive would cost more).
pub(super) const MAX_DRIVEN: usize = 16;

/// Connections a receive call holds without allocating: a ping-pong
/// socket has two (its own to the peer and the peer's to it).
pub(super) const DRIVEN_INLINE: usize = 4;

impl Driven {
    /// Claims the socket's armed connections (`glance`: looks at its
    /// parked ones, [`Conn::glance`]).
    pub(super) fn claim(sock: Arc<Sock>, glance: bool) -> Self {
        let mut d = Self {
            sock,
            eng: None,
            conns: SmallVec::new(),
            park: false,
            glance,
        };
        if !config::get().caller_recv {
            return d;
        }
        let Some(eng) = reactor::current() else {
            return d;
        };
        d.eng = Some(eng);
        {
            let g = lock(&d.sock.inner);
            if g.owned.len() <= MAX_DRIVEN {
                for c in g.owned.values() {
                    let fd = if glance { c.glance() } else { c.claim(eng) };
                    if let Some(fd) = fd {
                        d.conns.push((c.clone(), fd));
                    }
                }
            }
        }
        d
    }

    /// Whether every claimed connection is established (read by `serve`;
    /// others are polled and handled as events).
    pub(super) fn all_up(&self) -> bool {
        self.conns
            .iter()
            .all(|(c, _)| c.hint.load(Ordering::Relaxed) == HINT_UP)
    }

    /// Gives back the connections whose descriptor changed or closed, or
    /// whose input is paused, held back or on the ready list (polling those
    /// would spin).
    pub(super) fn prune(&mut self) {
        let Some(eng) = self.eng else { return };
        self.conns.retain(|(c, fd)| {
            if c.still_reading(*fd) {
                return true;
            }
            if !self.glance {
                c.unclaim(eng, *fd, false);
            }
            false
        });
    }
}

impl Drop for Driven {
    fn drop(&mut self) {
        if let (Some(eng), false) = (self.eng, self.glance) {
            for (c, fd) in self.conns.drain(..) {
                c.unclaim(eng, fd, self.park);
            }
        }
    }
}
