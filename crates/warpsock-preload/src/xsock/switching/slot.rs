//! The bound on switches under way ([`SWITCHING_MAX`]), the ids a
//! `fork` waits for ([`settle_before_fork`]), and the hold of an accepted
//! connection's answer until the program uses it or forks ([`hold`]).

use std::hash::BuildHasher;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use super::SWITCHING_MAX;
use crate::shim::sys;

/// Switches under way (threads running).
static UNDER_WAY: AtomicUsize = AtomicUsize::new(0);

/// The most switches of accepted connections under way for one peer
/// ([`PeerBlock`]): three quarters of the places, so that clients from
/// elsewhere find a quarter free whatever one peer holds. A client that connects and then stalls
/// (a slow-loris) holds its place up to the mark and Request timeouts (3 s
/// by default); without a share, 64 of them from one host left every
/// other preloaded client plain TCP, each after its own fallback wait
/// (helper 60). A program's own clients' switches (policy mode's
/// `connect`) have their bound apart (`start::ClientSwitch`).
pub(super) const PEER_SHARE: usize = SWITCHING_MAX * 3 / 4;

/// Why no place was taken ([`Slot::take`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum NoPlace {
    /// Every place is taken.
    Full,
    /// The peer holds its share ([`PEER_SHARE`]).
    PeerShare,
}

/// One place of [`RUNNING`] (and one of [`UNDER_WAY`]), given back when
/// dropped.
pub(super) struct Slot {
    pub(super) at: usize,
    pub(super) id: u64,
}

impl Slot {
    /// A place for a switch, an accepted connection's from `peer` within
    /// that peer's share.
    pub(super) fn take(peer: Option<PeerBlock>) -> Result<Self, NoPlace> {
        if UNDER_WAY.fetch_add(1, Ordering::AcqRel) >= SWITCHING_MAX {
            UNDER_WAY.fetch_sub(1, Ordering::AcqRel);
            return Err(NoPlace::Full);
        }
        // A place is free: `UNDER_WAY` counts the places taken.
        let id = IDS.fetch_add(1, Ordering::Relaxed) + 1;
        let at = loop {
            if let Some(at) = RUNNING.iter().position(|r| {
                r.compare_exchange(0, id, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
            }) {
                break at;
            }
        };
        let slot = Self { at, id };
        if let Some(block) = peer {
            // Noted first, then counted (sequentially consistent: of two
            // racing takes for one peer each sees the other's note, so
            // the share is never passed; both may be refused at its edge).
            let key = block.key();
            PEERS[at].store(key, Ordering::SeqCst);
            let held = PEERS
                .iter()
                .filter(|p| p.load(Ordering::SeqCst) == key)
                .count();
            if held > PEER_SHARE {
                return Err(NoPlace::PeerShare);
            }
        }
        Ok(slot)
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        PEERS[self.at].store(0, Ordering::SeqCst);
        RUNNING[self.at].store(0, Ordering::Release);
        UNDER_WAY.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The peer of each place's switch ([`PeerBlock::key`]; 0: none, or a
/// client's switch).
static PEERS: [AtomicU64; SWITCHING_MAX] = [const { AtomicU64::new(0) }; SWITCHING_MAX];

/// The addresses that count as one peer for [`PEER_SHARE`]: an IPv4
/// address (an IPv4-mapped IPv6 one's too); an IPv6 address's /64, the
/// block a remote host is commonly given (one that rotates its addresses
/// within it is still one peer) — but where a /64 is a link or a subnet
/// of many hosts, each address is a peer: link-local peers, and peers in
/// this end's own /64 (a LAN's or a cluster's subnet; helper 62's review:
/// a cluster's nodes shared one share).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct PeerBlock(u128);

impl PeerBlock {
    /// The block of `peer`, seen from the local address `local`.
    pub(super) fn of(peer: IpAddr, local: Option<IpAddr>) -> Self {
        let prefix = |ip: IpAddr| match ip.to_canonical() {
            IpAddr::V6(v6) => Some(u128::from(v6) >> 64),
            IpAddr::V4(_) => None,
        };
        Self(match peer.to_canonical() {
            // As its IPv4-mapped address, a block of its own.
            IpAddr::V4(v4) => u128::from(v4.to_ipv6_mapped()),
            IpAddr::V6(v6) => {
                let whole = u128::from(v6);
                let own_subnet = local.and_then(prefix) == Some(whole >> 64);
                if v6.is_unicast_link_local() || own_subnet {
                    whole
                } else {
                    // Its /64 (as its address with interface id 0: a /64
                    // counted whole, its peers' addresses are never
                    // keyed by the /64, and the other way round).
                    whole >> 64 << 64
                }
            }
        })
    }

    /// Its key among [`PEERS`]: hashed with the process's own random key
    /// (a remote host cannot choose addresses that share another's key),
    /// never 0.
    pub(super) fn key(self) -> u64 {
        static KEY: OnceLock<std::collections::hash_map::RandomState> = OnceLock::new();
        KEY.get_or_init(Default::default).hash_one(self.0) | 1
    }
}

/// Whether a switch can start now (a slot is free).
#[cfg(test)]
pub(super) fn room() -> bool {
    UNDER_WAY.load(Ordering::Acquire) < SWITCHING_MAX
}

/// Whether any switch is under way (a `select` then looks for numbers still
/// switching: `interpose::wait::select`).
/// None is: no switch thread holds a switching socket any more.
pub(in crate::xsock) fn under_way() -> bool {
    UNDER_WAY.load(Ordering::Acquire) > 0
}

/// Whether a switch holds the turn to answer ([`AnswerTurn`]).
static ANSWERING: AtomicBool = AtomicBool::new(false);

/// A policy-mode switch's turn to answer its client: taken before it
/// looks for the descriptors it still needs, given back (dropped) once it
/// took them — its DDP socket made, or the switch over. One switch at a
/// time: two held switches let go at once (an event loop's wait over
/// both) both found room for one and one of them ran out after its
/// answer, resetting its client (review 40 item 4; a server 25-27
/// descriptors short of its limit, 4 runs of 16). The section is short
/// and waits on no peer (the Request is queued already; the Reply is a
/// send): the others wait in pauses that grow.
pub(in crate::xsock) struct AnswerTurn(());

impl AnswerTurn {
    pub(in crate::xsock) fn take() -> Self {
        let mut round = 0;
        while ANSWERING
            .compare_exchange_weak(false, true, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            sys::pause(round);
            round = round.saturating_add(1);
        }
        Self(())
    }
}

impl Drop for AnswerTurn {
    fn drop(&mut self) {
        ANSWERING.store(false, Ordering::Release);
    }
}

/// In a forked child: the parent's switching threads are not its own.
pub(in crate::xsock) fn forget_after_fork() {
    ANSWERING.store(false, Ordering::Release);
    UNDER_WAY.store(0, Ordering::Release);
    for r in RUNNING.iter().chain(&PEERS) {
        r.store(0, Ordering::Release);
    }
    LAST.with(|l| l.set(0));
}

/// Before a `fork` (the atfork prepare handler, before any lock of the
/// library is taken for the copy): the switches under way end first,
/// within their own deadlines, so that the child's copy of each such
/// connection is what it became — a plain one works in the child (a
/// forking server's child serves a client without warpsock), a DDP
/// socket's copy is refused as always — rather than a dead end. A
/// forking server pays the wait its `accept` paid before the switches
/// moved here; threaded and event-loop servers pay nothing. No lock is
/// taken (a polled count, yields and short sleeps): a handler's fork over
/// a thread that holds a lock a switch needs waits out the bound.
pub(in crate::xsock) fn settle_before_fork(bound: Duration) {
    // Only the connection this thread accepted last: a forking server
    // forks for it, and one connection a hostile peer holds in its switch
    // holds up no fork but its own accepter's (redis's BGSAVE is made by
    // the thread that accepts: it waits at most for its last client).
    // Async-signal-safe (a handler's fork): a thread-local id with no
    // destructor, and atomics.
    let id = LAST.with(std::cell::Cell::get);
    if id == 0 {
        return;
    }
    // A switch held for its program's first use ([`hold`]) is woken by
    // the decline below (`stir`: a futex wake, async-signal-safe).
    // Declined if its client's Request is still to be answered: the
    // switch then ends at once with the connection plain (the client falls
    // back at once), which the child can serve — a DDP socket's copy it
    // could not (socat's and inetd-style children read an empty stream
    // from preloaded clients; session 38). A switch past that point ends
    // as it would, and its DDP socket's copy is refused in the child.
    for (at, r) in RUNNING.iter().enumerate() {
        if r.load(Ordering::Acquire) == id {
            DECLINED[at].fetch_max(id, Ordering::AcqRel);
            stir(at);
        }
    }
    let deadline = Instant::now() + bound;
    let mut round = 0;
    while RUNNING.iter().any(|r| r.load(Ordering::Acquire) == id) && Instant::now() < deadline {
        sys::pause(round);
        round = round.saturating_add(1);
    }
}

thread_local! {
    /// The id of the switch of the connection this thread accepted last
    /// (0: none; [`settle_before_fork`]).
    static LAST: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// The ids of the switches under way, one place each (0: free).
static RUNNING: [AtomicU64; SWITCHING_MAX] = [const { AtomicU64::new(0) }; SWITCHING_MAX];

/// The switch ids a fork declined ([`settle_before_fork`]), at their
/// places in [`RUNNING`] (ids are never reused: a stale one declines
/// nothing).
static DECLINED: [AtomicU64; SWITCHING_MAX] = [const { AtomicU64::new(0) }; SWITCHING_MAX];

/// The place of switch `id`, if it is under way.
#[cfg(test)]
pub(super) fn place(id: u64) -> Option<usize> {
    RUNNING.iter().position(|r| r.load(Ordering::Acquire) == id)
}

/// Whether a fork declined switch `id` at place `at`.
fn declined(at: usize, id: u64) -> bool {
    DECLINED[at].load(Ordering::Acquire) == id
}

/// The switch ids the program used ([`used`], [`used_all`]) at their
/// places in [`RUNNING`]: a held switch answers its client.
static USED: [AtomicU64; SWITCHING_MAX] = [const { AtomicU64::new(0) }; SWITCHING_MAX];

/// Held switches declined by a fork or a close (`ddp_accept_declined`).
pub(crate) static DECLINES: AtomicU64 = AtomicU64::new(0);
/// Held switches that answered at their hold's bound, unused
/// (`ddp_accept_holds_lapsed`).
pub(crate) static HOLDS_LAPSED: AtomicU64 = AtomicU64::new(0);

/// One futex word per place, changed (and woken) when its switch is
/// declined or used: what a held switch sleeps on.
static STIRS: [AtomicU32; SWITCHING_MAX] = [const { AtomicU32::new(0) }; SWITCHING_MAX];

/// Wakes the switch held at place `at` to look again. Async-signal-safe
/// (an atomic and a system call: a handler's `fork`).
fn stir(at: usize) {
    STIRS[at].fetch_add(1, Ordering::AcqRel);
    sys::futex_wake(&STIRS[at]);
}

/// The program used the connection of switch `id` at place `at` (a call
/// on it, a wait over it, or its last close: `gone`): a hold ends, the
/// switch answering its client, or declining it if `gone` (no number
/// names it: nobody will read it).
pub(super) fn used(at: usize, id: u64, gone: bool) {
    // `fetch_max`: ids only grow, so a late call for a switch that ended
    // (its place since taken by a newer one) changes nothing of the
    // newer one's (review 40 item 5).
    if gone {
        DECLINED[at].fetch_max(id, Ordering::AcqRel);
    } else if USED[at].load(Ordering::Acquire) >= id {
        return;
    } else {
        USED[at].fetch_max(id, Ordering::AcqRel);
    }
    stir(at);
}

/// Every switch under way was used: an `epoll_wait` (or `select`) of
/// the process, which sees its connections through the descriptor
/// numbers alone — the one an event loop makes right after it
/// registered the connection it accepted.
pub(in crate::xsock) fn used_all() {
    if !under_way() {
        return;
    }
    for (at, r) in RUNNING.iter().enumerate() {
        let id = r.load(Ordering::Acquire);
        if id != 0 && USED[at].load(Ordering::Acquire) < id {
            USED[at].fetch_max(id, Ordering::AcqRel);
            stir(at);
        }
    }
}

/// The hold of a policy-mode switch of an accepted connection, its
/// client's Request come and still to be answered: waits until the
/// program uses the connection ([`used`], [`used_all`]), its process
/// forks ([`settle_before_fork`] declines it) or `bound` passes, and
/// returns whether it was declined (the switch then answers with an MPA
/// Reject: the connection stays plain TCP, which a forking server's child
/// can serve).
///
/// Why: a forking server's child gets a copy of the connection, which is
/// the parent's; a copy of a DDP socket is refused in the child (its
/// engine state is the parent's). Without the hold, a switch that
/// answered before the `fork` — any server that does work between
/// `accept` and `fork` (a log line, a reverse lookup; 200 µs was enough
/// on a quiet machine, session 39) — left the child a dead end and the
/// client an empty answer. A program that makes a call on the
/// connection first is not a forking server's parent: the switch goes on
/// at that call, which waits for it as for any switch under way.
pub(super) fn hold(at: usize, id: u64, bound: Duration) -> bool {
    let deadline = Instant::now() + bound;
    loop {
        let seen = STIRS[at].load(Ordering::Acquire);
        if declined(at, id) {
            DECLINES.fetch_add(1, Ordering::Relaxed);
            return true;
        }
        // No hold (`WARPSOCK_DDP_ACCEPT_HOLD_MS=0`): declined only by a
        // fork that came already.
        if USED[at].load(Ordering::Acquire) == id || bound.is_zero() {
            return false;
        }
        let now = Instant::now();
        if now >= deadline {
            HOLDS_LAPSED.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        sys::futex_wait(&STIRS[at], seen, Some(deadline - now));
    }
}

/// The last switch id given.
static IDS: AtomicU64 = AtomicU64::new(0);

/// Notes the switch of the connection this thread accepted last (`id`;
/// 0: it stays plain), which its `fork` waits for.
pub(super) fn accepted_last(id: u64) {
    LAST.with(|l| l.set(id));
}

#[cfg(test)]
mod tests;
