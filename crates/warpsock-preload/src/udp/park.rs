//! Parked connections: the round trip without `epoll_ctl`.
//!
//! A blocking receive call that waits reads its socket's connections
//! itself: it *claims* them from the progress thread (which stops watching
//! them for input) and polls them. Giving them back when the call returns
//! costs an `epoll_ctl`, and claiming them again in the next call another:
//! two system calls per round trip on each side of a ping-pong, which
//! carries only three others (the poll, the read, the send). So a call
//! that returns a datagram leaves its connections *parked*: unwatched,
//! and taken over by the next receive call for free.
//!
//! A connection that joins the ready list while a receive call holds it
//! (the call read more than one datagram: the bulk path) parks there too,
//! and stays parked when the receive calls drain it: a poll, then receives
//! until `EAGAIN`, makes no `epoll_ctl` either.
//!
//! Nothing rings the doorbell for a parked connection, so readiness on the
//! program's descriptor would lag; every way the program can wait for it
//! gives parked connections back first, so that it stays exact:
//! - a blocking receive claims them and polls them itself;
//! - a non-blocking receive looks at them once without claiming them
//!   (`Conn::glance`: nothing to give back when it returns) and leaves
//!   them parked when it returns `EAGAIN`: the program either receives again (a busy-poll
//!   loop, or the drain to `EAGAIN` after a wake-up) and takes them over
//!   for free, or waits, and every wait below gives them back or watches
//!   them (giving them back at each `EAGAIN` cost an `epoll_ctl` and a
//!   progress-thread wake-up per round trip: 5.2 and 3.9 in the suite's
//!   latency loop);
//! - `poll`/`ppoll` watch them itself (`Sock::wait_begin`);
//! - `select`, `pselect`, `epoll_wait`, `epoll_pwait` and `epoll_pwait2`
//!   give every parked connection back before they wait
//!   ([`release_all`], through `Kind::before_wait`); one that a waiting
//!   poll in another thread has claimed then is not parked again when that
//!   claim ends (`Interest::given_back`): the wait would have been blind
//!   to it until the timer below.
//!
//! Taking a parked connection over (a receive call's or a poll's claim)
//! leaves it marked parked, and the claim's end leaves the mark as it is:
//! per call, a lock and a count of callers, no clock reading and no look
//! at the park list. The mark's time is therefore the park's, not the last
//! use's: the timer below sees that the connection was taken over since it
//! last looked and parks it for another grace period instead.
//!
//! A wait the library does not see (`io_uring`, a blocking call on another
//! descriptor in a thread that never receives again) is covered by the
//! connection's timer: the progress thread gives back a connection parked
//! longer than [`GRACE`] the next time it looks at its timers (at the
//! latest after its one-second safety sleep).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use super::conn::Conn;
use super::stats::{self, STATS};
use crate::shim::reactor;
use warpsock_xsock::io::ForkLock;

/// How long a connection may stay parked before its timer gives it back.
const GRACE: Duration = Duration::from_millis(10);

/// [`GRACE`], or the test hook's value.
pub(super) fn grace() -> Duration {
    #[cfg(feature = "test-hooks")]
    if let Some(d) = crate::shim::hooks::park_grace() {
        return d;
    }
    GRACE
}

/// Connections parked now (all sockets).
pub(super) static PARKED: AtomicUsize = AtomicUsize::new(0);

/// Connections parked since the last [`release_all`] (some may have been
/// taken over or given back since: looked at then). A child made by
/// `fork` starts a list of its own ([`forget_after_fork`]).
pub(super) static LIST: ForkLock<Vec<Weak<Conn>>> = ForkLock::new();

/// Whether any connection is parked.
pub(super) fn any() -> bool {
    PARKED.load(Ordering::Relaxed) > 0
}

/// `conn` was just parked (caller holds its interest lock, whose `listed`
/// says whether `conn` is on `LIST` already; `LIST` is a leaf lock).
pub(super) fn parked(conn: &Arc<Conn>, listed: &mut bool) {
    PARKED.fetch_add(1, Ordering::Relaxed);
    stats::inc(&STATS.rx_parks);
    if *listed {
        // Parked again after a receive call: still on the list (only
        // `release_all` takes connections off it).
        return;
    }
    let mut l = LIST.lock();
    if l.len() >= 64 {
        // Bounded: connections closed since are forgotten.
        l.retain(|w| w.strong_count() > 0);
    }
    l.push(Arc::downgrade(conn));
    *listed = true;
}

/// Unparks the interest's mark (the caller re-computes the epoll mask).
pub(super) fn clear(mark: &mut Option<Instant>) {
    if mark.take().is_some() {
        // Never below 0: a forked child starts its count at 0
        // ([`forget_after_fork`]) while a connection it reaches may be
        // marked parked in the parent's memory (review r29-c item 5: the
        // count wrapped, [`any`] was true for good and every wait walked
        // the list).
        let _ = PARKED.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
            Some(v.saturating_sub(1))
        });
    }
}

/// Gives every parked connection back to the progress thread (the program
/// is about to wait in a call that only sees the doorbell).
pub(crate) fn release_all() {
    if !any() {
        return;
    }
    let Some(eng) = reactor::current() else {
        return;
    };
    let conns: Vec<Weak<Conn>> = std::mem::take(&mut *LIST.lock());
    for c in conns.iter().filter_map(Weak::upgrade) {
        c.released(eng);
    }
}

/// In a child made by `fork` (its fork handler, the only thread): the
/// parked connections and their list are the parent's (UDP kind, issue
/// 12; as the DDP sockets' table, 3d7d251). A child that started an
/// engine of its own (its first offload or switch) gave them back in its
/// first `select` or `epoll_wait` ([`release_all`]): it locked its copy of
/// the list — held for good if a thread of the parent's held it at the
/// fork: the child hung — then each connection's interest (the same) and
/// made its own engine watch the parent's connection. The child starts
/// with none parked and a list of its own (the parent's leaked, never
/// locked: its connections are the parent's).
pub(crate) fn forget_after_fork() {
    LIST.forget();
    PARKED.store(0, Ordering::Relaxed);
}
