//! Policy mode's memory of servers that did not switch.
//!
//! A policy-mode client's switch waits up to `WARPSOCK_DDP_FALLBACK_MS`
//! (1 s) for the server's mark, and the program's first call on the
//! connection waits with it. A server without warpsock never marks: every
//! connection to it paid the whole fallback — a `curl` loop against a
//! plain web server, one second a request. So a server that let a switch
//! time out (no mark at all,
//! [`SwitchError::NoPeer`](warpsock_xsock::switch::SwitchError::NoPeer))
//! is remembered, by its address and port, for
//! `WARPSOCK_DDP_PLAIN_MEMORY_MS` (60 s; 0: never), and the process's
//! policy-mode connections to it stay plain TCP from their `connect` on,
//! no mark sent, no wait (`ddp_plain_remembered`). A server that came back
//! with warpsock is tried again once its memory lapsed; an explicit switch
//! (`WARPSOCK_DDP_MODE`) is always tried.
//!
//! A warpsock server also lets a switch time out now and then — all its
//! switching places held, or its peer's share of them (`switching`), its
//! budget of DDP sockets spent, a switch thread late under load — and
//! leaves that connection plain. Such a refusal passes; the memory must
//! not make it last: a server that switched a connection of this process
//! within the span is known to run warpsock, and its timeouts are not
//! remembered (helper 62's review: a client bursting past the server's
//! share once ran plain for a minute).
//!
//! Bounded: at most [`ENTRIES`] servers, the one remembered longest ago
//! forgotten first (a client of many plain servers pays a fallback again
//! for the ones forgotten, nothing else). The lock is only tried: a
//! `fork` made while another thread held it leaves the child's copy held
//! for good, and a look that finds it held remembers nothing (the
//! connection tries its switch).

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, TryLockError};
use std::time::{Duration, Instant};

use super::config;

/// The most servers remembered at once.
pub(super) const ENTRIES: usize = 256;

/// Policy-mode connections left plain TCP because their server is
/// remembered (`ddp_plain_remembered`).
pub(crate) static REMEMBERED: AtomicU64 = AtomicU64::new(0);

/// A server as the memory knows it: its address (an IPv4-mapped one as
/// IPv4) and port, and a link-local address's scope (the interface: the
/// same address on another link is another server). Not `SocketAddrV6`'s
/// flow label, which a program's `connect` may set and `getpeername`
/// reads as 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Server {
    ip: IpAddr,
    port: u16,
    scope: u32,
}

impl From<SocketAddr> for Server {
    fn from(a: SocketAddr) -> Self {
        let scope = match a {
            SocketAddr::V6(v6) if v6.ip().is_unicast_link_local() => v6.scope_id(),
            _ => 0,
        };
        Self {
            ip: a.ip().to_canonical(),
            port: a.port(),
            scope,
        }
    }
}

/// What the memory knows of a server, until when.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Known {
    /// It let a switch time out: its connections stay plain.
    Plain,
    /// It switched a connection: a timeout of its is a passing refusal.
    Switches,
}

/// Servers that did not switch, or did, and until when each is known
/// (sans-IO: the time is passed in).
#[derive(Default)]
pub(super) struct Memory {
    until: Vec<(Server, Known, Instant)>,
}

impl Memory {
    const fn new() -> Self {
        Self { until: Vec::new() }
    }

    /// `server` let a switch time out at `now`: remembered as plain for
    /// `span` (0: not at all), unless it switched one within its span.
    pub(super) fn timed_out(&mut self, server: Server, now: Instant, span: Duration) {
        if !self.known(server, Known::Switches, now) {
            self.note(server, Known::Plain, now, span);
        }
    }

    /// `server` switched a connection at `now`: its timeouts within
    /// `span` are passing ones (and it is no longer remembered as plain).
    pub(super) fn switched(&mut self, server: Server, now: Instant, span: Duration) {
        self.note(server, Known::Switches, now, span);
    }

    /// Whether a connection to `server` stays plain at `now`.
    pub(super) fn remembered(&self, server: Server, now: Instant) -> bool {
        self.known(server, Known::Plain, now)
    }

    fn known(&self, server: Server, what: Known, now: Instant) -> bool {
        self.until
            .iter()
            .any(|&(s, k, u)| s == server && k == what && u > now)
    }

    /// The one entry of `server`, `what` until `now + span`; the entry
    /// known longest ago dropped for it when the memory is full.
    fn note(&mut self, server: Server, what: Known, now: Instant, span: Duration) {
        if span.is_zero() {
            return;
        }
        self.until.retain(|&(s, _, u)| s != server && u > now);
        if self.until.len() >= ENTRIES {
            let oldest = (0..self.until.len())
                .min_by_key(|&i| self.until[i].2)
                .expect("a full memory has entries");
            self.until.swap_remove(oldest);
        }
        self.until.push((server, what, now + span));
    }
}

static MEMORY: Mutex<Memory> = Mutex::new(Memory::new());

/// `f` over the memory if its lock is free now (the module docs: a
/// `fork` may have left it held), else `None`.
fn with_memory<T>(f: impl FnOnce(&mut Memory) -> T) -> Option<T> {
    match MEMORY.try_lock() {
        Ok(mut m) => Some(f(&mut m)),
        Err(TryLockError::Poisoned(p)) => Some(f(&mut p.into_inner())),
        Err(TryLockError::WouldBlock) => None,
    }
}

/// A policy-mode switch with `server` timed out waiting for its mark.
pub(super) fn timed_out(server: SocketAddr) {
    let span = config::get().plain_memory;
    with_memory(|m| m.timed_out(server.into(), Instant::now(), span));
}

/// A policy-mode switch with `server` succeeded.
pub(super) fn switched(server: SocketAddr) {
    let span = config::get().plain_memory;
    with_memory(|m| m.switched(server.into(), Instant::now(), span));
}

/// Whether a policy-mode connection to `server` stays plain TCP at once
/// (counted).
pub(super) fn remembered(server: SocketAddr) -> bool {
    let r = with_memory(|m| m.remembered(server.into(), Instant::now())).unwrap_or(false);
    if r {
        REMEMBERED.fetch_add(1, Ordering::Relaxed);
    }
    r
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddrV6;

    use super::*;

    fn addr(port: u16) -> Server {
        SocketAddr::from(([192, 0, 2, 1], port)).into()
    }

    const SPAN: Duration = Duration::from_secs(60);

    /// A server is remembered for its span, by address and port; timed
    /// out again, from then on.
    #[test]
    fn a_server_is_remembered_for_its_span() {
        let t0 = Instant::now();
        let mut m = Memory::default();
        assert!(!m.remembered(addr(80), t0));
        m.timed_out(addr(80), t0, SPAN);
        assert!(m.remembered(addr(80), t0 + SPAN / 2));
        assert!(!m.remembered(addr(81), t0), "another port");
        let other = SocketAddr::from(([192, 0, 2, 2], 80)).into();
        assert!(!m.remembered(other, t0), "another host");
        assert!(!m.remembered(addr(80), t0 + SPAN), "lapsed");
        m.timed_out(addr(80), t0 + SPAN, SPAN);
        assert!(m.remembered(addr(80), t0 + SPAN * 3 / 2), "noted again");
        assert_eq!(m.until.len(), 1, "one entry a server");
    }

    /// A server that switched a connection within its span is known to
    /// run warpsock: its timeout (a full server's passing refusal) is not
    /// remembered. A switch also ends a plain memory.
    #[test]
    fn a_server_that_switched_lately_is_not_remembered_as_plain() {
        let t0 = Instant::now();
        let mut m = Memory::default();
        m.switched(addr(80), t0, SPAN);
        m.timed_out(addr(80), t0 + SPAN / 2, SPAN);
        assert!(!m.remembered(addr(80), t0 + SPAN / 2), "a passing refusal");
        m.timed_out(addr(80), t0 + SPAN, SPAN);
        assert!(m.remembered(addr(80), t0 + SPAN), "known no longer");
        m.switched(addr(80), t0 + SPAN, SPAN);
        assert!(!m.remembered(addr(80), t0 + SPAN), "it switched since");
    }

    /// The key: an IPv4-mapped address is its IPv4 one; a flow label is
    /// not part of it; a link-local address's scope is.
    #[test]
    fn a_server_is_keyed_by_address_port_and_link() {
        let t0 = Instant::now();
        let mut m = Memory::default();
        m.timed_out(addr(80), t0, SPAN);
        let mapped = SocketAddr::from(("::ffff:192.0.2.1".parse::<IpAddr>().unwrap(), 80));
        assert!(m.remembered(mapped.into(), t0));
        let v6 = |ip: &str, flow, scope| {
            Server::from(SocketAddr::V6(SocketAddrV6::new(
                ip.parse().unwrap(),
                80,
                flow,
                scope,
            )))
        };
        m.timed_out(v6("2001:db8::1", 0, 0), t0, SPAN);
        assert!(m.remembered(v6("2001:db8::1", 7, 0), t0), "flow label");
        m.timed_out(v6("fe80::1", 0, 2), t0, SPAN);
        assert!(m.remembered(v6("fe80::1", 0, 2), t0));
        assert!(!m.remembered(v6("fe80::1", 0, 3), t0), "another link");
    }

    /// A span of 0 remembers nothing (`WARPSOCK_DDP_PLAIN_MEMORY_MS=0`).
    #[test]
    fn a_zero_span_remembers_nothing() {
        let t0 = Instant::now();
        let mut m = Memory::default();
        m.timed_out(addr(80), t0, Duration::ZERO);
        assert!(!m.remembered(addr(80), t0));
    }

    /// Full, the memory forgets the server known longest ago, and lapsed
    /// entries go before that.
    #[test]
    fn a_full_memory_forgets_the_oldest() {
        let t0 = Instant::now();
        let mut m = Memory::default();
        for i in 0..ENTRIES {
            m.timed_out(addr(i as u16), t0 + Duration::from_millis(i as u64), SPAN);
        }
        let later = t0 + Duration::from_secs(1);
        m.timed_out(addr(9999), later, SPAN);
        assert_eq!(m.until.len(), ENTRIES);
        assert!(!m.remembered(addr(0), later), "the oldest forgotten");
        assert!(m.remembered(addr(1), later) && m.remembered(addr(9999), later));
        // Past the first ones' span: lapsed entries make the room.
        let lapsed = t0 + SPAN + Duration::from_millis(10);
        m.timed_out(addr(10_000), lapsed, SPAN);
        assert!(m.until.len() < ENTRIES, "the lapsed ones dropped");
        assert!(m.remembered(addr(9999), lapsed) && m.remembered(addr(10_000), lapsed));
    }
}
