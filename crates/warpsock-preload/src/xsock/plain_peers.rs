//! Policy mode's memory of servers that did not switch.
//!
//! A policy-mode client's switch waits up to `WARPSOCK_DDP_FALLBACK_MS`
//! (1 s) for the server's mark, and the program's first call on the
//! connection waits with it. A server without warpsock never marks, and
//! neither does one whose switching places are all held (`switching`:
//! it leaves the connection plain TCP): every connection to it paid the
//! whole fallback — a `curl` loop against a plain web server, one second
//! a request. So a server that let one switch time out (no mark at all,
//! [`SwitchError::NoPeer`](warpsock_xsock::switch::SwitchError::NoPeer))
//! is remembered, by its address and port, for
//! `WARPSOCK_DDP_PLAIN_MEMORY_MS` (60 s; 0: never), and the process's
//! policy-mode connections to it stay plain TCP from their `connect` on,
//! no mark sent, no wait (`ddp_plain_remembered`). A server that came back
//! with warpsock, or with room, is tried again once its memory lapsed; an
//! explicit switch (`WARPSOCK_DDP_MODE`) is always tried.
//!
//! Bounded: at most [`ENTRIES`] servers, the one remembered longest ago
//! forgotten first (a client of many plain servers pays a fallback again
//! for the ones forgotten, nothing else).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::config;
use crate::shim::sys::lock;

/// The most servers remembered at once.
pub(super) const ENTRIES: usize = 256;

/// Policy-mode connections left plain TCP because their server is
/// remembered (`ddp_plain_remembered`).
pub(crate) static REMEMBERED: AtomicU64 = AtomicU64::new(0);

/// Servers that did not switch, and until when each is remembered
/// (sans-IO: the time is passed in).
#[derive(Default)]
pub(super) struct Memory {
    until: Vec<(SocketAddr, Instant)>,
}

impl Memory {
    const fn new() -> Self {
        Self { until: Vec::new() }
    }

    /// `server` did not switch at `now`: remembered for `span` (0: not
    /// at all), the entry of the server remembered longest ago dropped
    /// for it when the memory is full.
    pub(super) fn note(&mut self, server: SocketAddr, now: Instant, span: Duration) {
        if span.is_zero() {
            return;
        }
        let until = now + span;
        self.until.retain(|&(s, u)| s != server && u > now);
        if self.until.len() >= ENTRIES {
            let oldest = (0..self.until.len())
                .min_by_key(|&i| self.until[i].1)
                .expect("a full memory has entries");
            self.until.swap_remove(oldest);
        }
        self.until.push((server, until));
    }

    /// Whether `server` is remembered at `now`.
    pub(super) fn remembered(&self, server: SocketAddr, now: Instant) -> bool {
        self.until.iter().any(|&(s, u)| s == server && u > now)
    }
}

static MEMORY: Mutex<Memory> = Mutex::new(Memory::new());

/// A policy-mode switch with `server` timed out waiting for its mark.
pub(super) fn note(server: SocketAddr) {
    lock(&MEMORY).note(server, Instant::now(), config::get().plain_memory);
}

/// Whether a policy-mode connection to `server` stays plain TCP at once
/// (counted).
pub(super) fn remembered(server: SocketAddr) -> bool {
    let r = lock(&MEMORY).remembered(server, Instant::now());
    if r {
        REMEMBERED.fetch_add(1, Ordering::Relaxed);
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(port: u16) -> SocketAddr {
        ([192, 0, 2, 1], port).into()
    }

    const SPAN: Duration = Duration::from_secs(60);

    /// A server is remembered for its span, by address and port; noted
    /// again, from then on.
    #[test]
    fn a_server_is_remembered_for_its_span() {
        let t0 = Instant::now();
        let mut m = Memory::default();
        assert!(!m.remembered(addr(80), t0));
        m.note(addr(80), t0, SPAN);
        assert!(m.remembered(addr(80), t0 + SPAN / 2));
        assert!(!m.remembered(addr(81), t0), "another port");
        assert!(
            !m.remembered(([192, 0, 2, 2], 80).into(), t0),
            "another host"
        );
        assert!(!m.remembered(addr(80), t0 + SPAN), "lapsed");
        m.note(addr(80), t0 + SPAN, SPAN);
        assert!(m.remembered(addr(80), t0 + SPAN * 3 / 2), "noted again");
        assert_eq!(m.until.len(), 1, "one entry a server");
    }

    /// A span of 0 remembers nothing (`WARPSOCK_DDP_PLAIN_MEMORY_MS=0`).
    #[test]
    fn a_zero_span_remembers_nothing() {
        let t0 = Instant::now();
        let mut m = Memory::default();
        m.note(addr(80), t0, Duration::ZERO);
        assert!(!m.remembered(addr(80), t0));
    }

    /// Full, the memory forgets the server remembered longest ago, and
    /// lapsed entries go before that.
    #[test]
    fn a_full_memory_forgets_the_oldest() {
        let t0 = Instant::now();
        let mut m = Memory::default();
        for i in 0..ENTRIES {
            m.note(addr(i as u16), t0 + Duration::from_millis(i as u64), SPAN);
        }
        let later = t0 + Duration::from_secs(1);
        m.note(addr(9999), later, SPAN);
        assert_eq!(m.until.len(), ENTRIES);
        assert!(!m.remembered(addr(0), later), "the oldest forgotten");
        assert!(m.remembered(addr(1), later) && m.remembered(addr(9999), later));
        // Past the first ones' span: lapsed entries make the room.
        let lapsed = t0 + SPAN + Duration::from_millis(10);
        m.note(addr(10_000), lapsed, SPAN);
        assert!(m.until.len() < ENTRIES, "the lapsed ones dropped");
        assert!(m.remembered(addr(9999), lapsed) && m.remembered(addr(10_000), lapsed));
    }
}
