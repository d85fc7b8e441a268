//! A connection's watch: what the progress thread's epoll asks of its
//! descriptor ([`Interest`]), and who reads its input meanwhile: the
//! progress thread, a receive call or poll that claimed it, a
//! non-blocking receive's glance, or nobody while it is parked
//! (`super::super::park`).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use libc::c_int;

use super::{Conn, Interest, EPOLLET, EPOLLIN, EPOLLOUT, HDR_LEN, HINT_UP};
use crate::shim::reactor::Reactor;
use crate::shim::sys::lock;
use crate::udp::config;
use crate::udp::park;
use crate::udp::stats::{self, STATS};

impl Interest {
    /// Tells the progress thread's epoll of a changed mask (`old` is the
    /// mask before the change); each such `epoll_ctl` is counted
    /// (`conn_epoll_mods`: the cost parking exists to avoid).
    pub(super) fn rewatch(&self, eng: &Reactor, id: u64, old: u32) {
        if self.mask() != old && self.fd >= 0 {
            stats::inc(&STATS.conn_epoll_mods);
            eng.modify(self.fd, id, self.mask());
        }
    }

    pub(super) fn mask(&self) -> u32 {
        // A receive call that claimed the connection, or left it parked,
        // serves it: the progress thread watches neither its input nor,
        // on the ready list, its arrivals (the call that takes it over or
        // the wait that gives it back changes the watch, and `epoll_ctl`
        // reports what is already there).
        let ours = self.callers > 0 || self.parked.is_some();
        let read = self.read && !ours;
        let edge = !read && self.edge && !ours;
        let m = (if read || edge { EPOLLIN } else { 0 })
            | (if self.write { EPOLLOUT } else { 0 })
            | (if edge { EPOLLET } else { 0 });
        // Nothing asked for: a socket still reports `EPOLLHUP` and
        // `EPOLLERR` whatever the mask, and level-triggered it reports them
        // at every wait. An unproved connection holding back what it read
        // (its end of stream seen, or half a buffer) and then reset woke
        // the progress thread in a loop until its deadline, as would a
        // claimed, parked or paused one; edge-triggered, once.
        if m == 0 {
            EPOLLET
        } else {
            m
        }
    }
}

impl Conn {
    /// Changes epoll interest (leaf lock). Reading (or not) ends being on
    /// the ready list.
    pub(in crate::udp) fn set_interest(
        &self,
        eng: &Reactor,
        read: Option<bool>,
        write: Option<bool>,
    ) {
        let mut i = lock(&self.ev);
        let old = i.mask();
        if let Some(r) = read {
            i.read = r;
            i.edge = false;
            park::clear(&mut i.parked);
        }
        if let Some(w) = write {
            i.write = w;
        }
        i.rewatch(eng, self.id, old);
        self.note_handback(&mut i, eng);
    }

    /// A blocking receive takes over reading this connection: the progress
    /// thread stops watching it for input. Returns the descriptor to poll,
    /// or `None` if the progress thread does not read it now (setting up,
    /// paused) and the caller should leave it alone.
    pub(in crate::udp) fn claim(&self, eng: &Reactor) -> Option<c_int> {
        let mut i = lock(&self.ev);
        if i.fd < 0 || !i.read {
            return None;
        }
        #[cfg(feature = "test-hooks")]
        stats::inc(&stats::CLAIMS);
        if i.parked.is_some() {
            // Taking a parked connection over changes nothing for the
            // progress thread (it was not watching it): it stays parked
            // while claimed, and the claim's end leaves it so (no clock
            // reading, no count, no look at the park list per call); its
            // timer sees it was used (`super::park`).
            i.callers += 1;
            i.used = true;
            return Some(i.fd);
        }
        let old = i.mask();
        i.callers += 1;
        i.rewatch(eng, self.id, old);
        Some(i.fd)
    }

    /// A non-blocking receive looks at a parked connection (which nothing
    /// else watches) without claiming it: returns the descriptor to read,
    /// or `None` if it is not parked and reading. Nothing to undo: a claim
    /// of a parked connection changes only the count of callers, which
    /// keeps its timer from giving it back while a call waits on it, and a
    /// non-blocking call does not wait. The mark `used` keeps the timer off
    /// it for another grace period all the same; a wait in another thread
    /// that gives it back meanwhile (`park::release_all`) leaves it to the
    /// progress thread, which serves it under `order` as the call does.
    /// (A claim and its end cost about 150 instructions per connection and
    /// call, two such calls per round trip and side in an event loop.)
    pub(in crate::udp) fn glance(&self) -> Option<c_int> {
        let mut i = lock(&self.ev);
        if i.fd < 0 || !i.read || i.parked.is_none() {
            return None;
        }
        i.used = true;
        Some(i.fd)
    }

    /// A program's poll of its socket alone takes this connection over
    /// (`Sock::poll_alone`), only if parked and reading (else `None`: the
    /// general path claims it): it glances at it ([`Conn::glance`]), and a
    /// poll that may wait counts itself among its pollers until
    /// [`Conn::poll_done`], which keeps the park timer off it however long
    /// the wait (a claim's count of callers, without its lock: a claim and
    /// its end cost the poll about 100 instructions). The glance's `used`
    /// covers the timer's first look. Either poll may hold a datagram
    /// (`hold_frame`) without a claim: if the connection was given back
    /// meanwhile (`park::release_all` from a wait in another thread, or
    /// the timer with the poller descheduled for a grace period), the
    /// poll starts its hand-back timer ([`Conn::held_unclaimed`]); input
    /// it did not hold the progress thread, watching the connection again,
    /// reads under `order` as the poll does.
    pub(in crate::udp) fn take_parked(&self, wait: bool) -> Option<c_int> {
        let fd = self.glance()?;
        if wait {
            #[cfg(feature = "test-hooks")]
            stats::inc(&stats::CLAIMS);
            self.pollers.fetch_add(1, Ordering::Release);
        }
        Some(fd)
    }

    /// A poll that took the connection over without a claim
    /// ([`Conn::take_parked`]) read a datagram into its buffer
    /// (`hold_frame`): if the connection was given back to the progress
    /// thread meanwhile (a `select` or `epoll_wait` in another thread,
    /// `park::release_all`, or the timer), no readiness event announces
    /// bytes already read, and the give-back saw nothing held; its
    /// hand-back timer, due now, announces them ([`Conn::note_handback`]).
    /// Still parked: nothing (its next taker serves it). The hold is set
    /// before this looks, and a give-back after it sees the hold.
    pub(in crate::udp) fn held_unclaimed(&self, eng: &Reactor) {
        self.note_handback(&mut lock(&self.ev), eng);
    }

    /// A waiting poll that took the connection over ([`Conn::take_parked`])
    /// returned.
    pub(in crate::udp) fn poll_done(&self) {
        self.pollers.fetch_sub(1, Ordering::Release);
    }

    /// Undoes `claim`. Returns whether the descriptor is still `fd`.
    /// With `park`, the last claim leaves the connection parked instead of
    /// watched by the progress thread again (`super::park`), if it still
    /// reads `fd`.
    /// A connection that joined the ready list meanwhile parks too: it
    /// stays on the list, unwatched, until a receive call drains it
    /// ([`Conn::drained`]).
    pub(in crate::udp) fn unclaim(self: &Arc<Self>, eng: &Reactor, fd: c_int, park: bool) -> bool {
        let mut i = lock(&self.ev);
        if park && i.parked.is_some() && i.fd == fd && fd >= 0 && (i.read || i.edge) {
            // Parked when claimed, and parked again: only the count of
            // callers changes. The mask stays (a parked connection is
            // ours whatever the count), and nothing is given back, so
            // there is no held datagram to hand back (the round trip's
            // common case: about 60 instructions per call fewer).
            i.callers = i.callers.saturating_sub(1);
            return true;
        }
        let old = i.mask();
        i.callers = i.callers.saturating_sub(1);
        if i.callers == 0 {
            let given_back = std::mem::take(&mut i.given_back);
            if !(park && (i.read || i.edge) && i.fd == fd && fd >= 0) {
                // Given back (a connection claimed while parked is still
                // marked parked: `claim`).
                park::clear(&mut i.parked);
            } else if given_back {
                // `park::release_all` gave it back during the claim: a wait
                // elsewhere relies on the progress thread watching it.
            } else if i.parked.is_none() {
                if i.edge {
                    stats::inc(&STATS.rx_parked_ready);
                }
                i.parked = Some(Instant::now());
                park::parked(self, &mut i.listed);
            }
            // Else parked when claimed, and still: nothing changes.
        }
        i.rewatch(eng, self.id, old);
        self.note_handback(&mut i, eng);
        i.fd == fd
    }

    /// The connection joins its socket's ready list: the progress thread
    /// stops reading it and is told of new arrivals only (edge-triggered),
    /// unless a receive call holds it (claimed: it parks when the call
    /// returns, and nothing watches it until a wait gives it back) or it
    /// is parked: then it stays parked, unwatched, until the receive calls
    /// drain it or a wait gives it back (`super::super::park`). A
    /// non-blocking receive that read more than one datagram of a parked
    /// connection it glanced at (`Conn::glance`, no claim) put it here; had
    /// this given it back, each such read cost two `epoll_ctl` (the ready
    /// list's watch, then the drained one's; `tests/readiness.rs`
    /// `bulk_receives_after_poll_keep_connections_parked`).
    pub(in crate::udp) fn set_ready(&self, eng: &Reactor) {
        let mut i = lock(&self.ev);
        let old = i.mask();
        i.read = false;
        i.edge = true;
        if i.parked.is_some() {
            stats::inc(&STATS.rx_parked_ready);
        }
        i.rewatch(eng, self.id, old);
    }

    /// A receive call drained the connection off the ready list: it reads
    /// again. A parked one stays parked (the bulk path: a poll, then
    /// receives until `EAGAIN`, with no `epoll_ctl`); others are watched
    /// by the progress thread again.
    pub(in crate::udp) fn drained(&self, eng: &Reactor) {
        let mut i = lock(&self.ev);
        let old = i.mask();
        i.read = true;
        i.edge = false;
        i.rewatch(eng, self.id, old);
    }

    /// The descriptor is closed: nothing to watch, nothing parked.
    pub(super) fn forget_fd(&self) {
        let mut i = lock(&self.ev);
        i.fd = -1;
        park::clear(&mut i.parked);
    }

    /// Whether the progress thread waits for room to write the buffer (the
    /// kernel's send buffer was full).
    pub(super) fn write_pending(&self) -> bool {
        lock(&self.ev).write
    }

    /// The descriptor to wait on (for `POLLOUT`) until a datagram of
    /// `len` bytes fits in the send buffer: `None` once it fits, or when
    /// the connection is not established (a send then says what to do).
    pub(in crate::udp) fn room_wait(&self, len: usize) -> Option<c_int> {
        if self.hint.load(Ordering::Relaxed) != HINT_UP {
            return None;
        }
        let queued = self.queued.load(Ordering::Relaxed);
        let fd = lock(&self.ev).fd;
        (fd >= 0 && queued > 0 && queued + HDR_LEN + len > config::get().sndbuf).then_some(fd)
    }

    /// Whether the connection's input is read now (not paused for a full
    /// queue, nor held back until its port is proved).
    pub(in crate::udp) fn reading(&self) -> bool {
        lock(&self.ev).read
    }

    /// Gives a parked connection back to the progress thread (`stale`:
    /// only one parked longer than `park::grace()` by `now`). Returns
    /// whether it was parked.
    pub(in crate::udp) fn unpark(&self, eng: &Reactor, stale: Option<Instant>) -> bool {
        self.unpark_locked(&mut lock(&self.ev), eng, stale)
    }

    /// `park::release_all` took the connection off its list: gives it back
    /// if parked (as [`Conn::unpark`]), and marks it unlisted.
    pub(in crate::udp) fn released(&self, eng: &Reactor) -> bool {
        let mut i = lock(&self.ev);
        i.listed = false;
        let given = self.unpark_locked(&mut i, eng, None);
        // Claimed meanwhile: its claims' end must not park it again.
        i.given_back = given && i.callers > 0;
        given
    }

    pub(super) fn unpark_locked(
        &self,
        i: &mut Interest,
        eng: &Reactor,
        stale: Option<Instant>,
    ) -> bool {
        let Some(since) = i.parked else { return false };
        if let Some(now) = stale {
            if since + park::grace() > now {
                return false;
            }
            if i.callers > 0
                || self.pollers.load(Ordering::Acquire) > 0
                || std::mem::take(&mut i.used)
            {
                // Taken over since the timer last looked (or now): still
                // in use, so parked for another grace period from now.
                i.parked = Some(now);
                return false;
            }
        }
        i.used = false;
        let old = i.mask();
        park::clear(&mut i.parked);
        i.rewatch(eng, self.id, old);
        self.note_handback(i, eng);
        stats::inc(&STATS.rx_unparks);
        true
    }

    /// After a change of `i`: a connection given back to the progress
    /// thread while it holds a datagram a poll read ([`Conn::held`]) gets
    /// its timer due now (a clock reading and a wake-up, on this path
    /// only). Bytes in our buffer make no readiness event; the timer
    /// announces them.
    pub(super) fn note_handback(&self, i: &mut Interest, eng: &Reactor) {
        if i.callers == 0
            && i.parked.is_none()
            && i.handback.is_none()
            && self.held.load(Ordering::Relaxed)
        {
            let now = Instant::now();
            i.handback = Some(now);
            eng.wake_by(now);
        }
    }

    /// Takes the hand-back mark ([`Interest::handback`]): whether a held
    /// datagram may need announcing.
    pub(in crate::udp) fn take_handback(&self) -> bool {
        lock(&self.ev).handback.take().is_some()
    }

    /// When a parked connection goes back to the progress thread at the
    /// latest (its timer; `super::park`), or when a held datagram given
    /// back is announced ([`Interest::handback`]: at once).
    pub(in crate::udp) fn park_deadline(&self) -> Option<Instant> {
        let i = lock(&self.ev);
        match (i.parked.map(|t| t + park::grace()), i.handback) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// An accepted connection, established (its sender's port proved),
    /// that delivered a datagram: replies may go back over it.
    pub(in crate::udp) fn proved(&self) -> bool {
        self.inbound
            && self.delivered.load(Ordering::Relaxed)
            && self.hint.load(Ordering::Relaxed) == HINT_UP
    }

    /// Whether the claimed descriptor is still this connection's.
    pub(in crate::udp) fn still(&self, fd: c_int) -> bool {
        lock(&self.ev).fd == fd
    }

    /// [`Conn::still`] and [`Conn::reading`] under one lock.
    pub(in crate::udp) fn still_reading(&self, fd: c_int) -> bool {
        let i = lock(&self.ev);
        i.fd == fd && i.read
    }
}
