//! DDP mode configuration from the environment.

use std::net::SocketAddr;
use std::sync::OnceLock;
use std::time::Duration;

use warpsock_xsock::io::Options;
use warpsock_xsock::switch::Limits;

use crate::udp::core::policy::{parse_ports, Cidr};

/// The most bytes an accepted connection's background switch reads
/// before the peer's mark (`xsock::switching`): with up to
/// `SWITCHING_MAX` (64) switches under way, a flood of clients that write
/// without marking holds at most 64 MiB in all — what one connection
/// could hold when the switch ran inside `accept` — where each could
/// hold `Limits::residue_max` (64 MiB). An honest client's bytes before
/// its switch beyond this fail the switch (`ResidueFull`): the connection
/// stays plain TCP, every byte delivered.
pub(crate) const ACCEPTED_RESIDUE_MAX: usize = 1 << 20;

/// What the environment asked for.
pub(crate) struct Config {
    /// `WARPSOCK_DDP_PORTS`: connections to (connect) or on (accept) these
    /// ports switch at once.
    ports: Option<Vec<(u16, u16)>>,
    /// `WARPSOCK_DDP_ADDRS`: ... with peers in these prefixes.
    addrs: Option<Vec<Cidr>>,
    /// Sockets switched on request (`setsockopt`).
    pub(crate) request: Options,
    /// Sockets switched by the policy, at connect/accept time.
    pub(crate) policy: Options,
    /// Accepted connections of a listener set to DDP mode, switched in
    /// the background: [`Config::request`] with the residue bounded to
    /// [`ACCEPTED_RESIDUE_MAX`].
    pub(crate) accepted: Options,
    /// How long `close` lets queued bytes and the end of stream leave.
    pub(crate) linger: Duration,
    /// `WARPSOCK_DDP_EPOLL_DIRECT` (on unless `0`): the program's epoll
    /// sets watch DDP sockets' connections themselves
    /// (`shim::epollwatch`); off, an epoll wait sees them through the
    /// progress thread's doorbells, as a `select` does.
    pub(crate) epoll_direct: bool,
    /// `WARPSOCK_DDP_SELECT_DIRECT` (on unless `0`): a `select` whose sets
    /// name a managed socket is made as a poll, which watches the sockets'
    /// connections itself (`interpose::wait::select::polled`); off, it
    /// sees them through the progress thread's doorbells.
    pub(crate) select_direct: bool,
    /// `WARPSOCK_DDP_CLOSING_MAX`: the most closes the reaper holds at a
    /// time (`reaper`: past it the oldest lingering one is cut short).
    /// Each keeps its engine's socket and context (descriptors, slot
    /// memory) until its peer's FIN or the linger; 256 by default, at
    /// least 1 ([`closing_max`]). The reaper's table of the closes still
    /// sending, which an `_exit` whose reaper does not answer resets, has
    /// as many places (`reaper::Reaper::sending`).
    pub(crate) closing_max: usize,
    /// `WARPSOCK_DDP_SOCKETS_MAX`: the most DDP sockets live at once,
    /// switches under way and closes still lingering included
    /// (`budget`): past it policy mode leaves a connection plain TCP and
    /// an explicit switch fails with `ENOBUFS`. By default all their
    /// receive slots together take at most an eighth of the physical
    /// memory, 128 to 4096 sockets ([`sockets_max`]).
    pub(crate) sockets_max: usize,
    /// Longest wait for a non-blocking connect the policy finishes.
    pub(crate) connect_timeout: Duration,
    /// `WARPSOCK_DDP_ACCEPT_HOLD_MS`: how long a policy-mode switch of an
    /// accepted connection, its client's Request come, waits for the
    /// program's first use of the connection before it answers; a `fork`
    /// meanwhile declines it (`switching::slot::hold`). A quarter of
    /// `WARPSOCK_DDP_FALLBACK_MS` by default (250 ms), at most half the
    /// client's wait for the answer ([`accept_hold`]).
    pub(crate) accept_hold: Duration,
    /// `WARPSOCK_DDP_PLAIN_MEMORY_MS`: how long policy mode remembers a
    /// server that did not switch (no mark within the fallback time), its
    /// later connections left plain TCP at once (`plain_peers`); 0: never.
    pub(crate) plain_memory: Duration,
    /// The test hooks' settings, read here once: a lingering close's
    /// hooks run in a `close` that may be a signal handler's, where
    /// `std::env::var` (allocation, the environment's lock) must not.
    #[cfg(feature = "test-hooks")]
    pub(crate) hooks: Hooks,
}

/// `WARPSOCK_TEST_*` settings of the lingering close's hooks (the
/// test-hooks build only; `sock/close.rs`, `reaper.rs`).
#[cfg(feature = "test-hooks")]
pub(crate) struct Hooks {
    /// `WARPSOCK_TEST_LINGER_SIGNAL`.
    pub(crate) linger_signal: Option<libc::c_int>,
    /// `WARPSOCK_TEST_LINGER_SIGNAL_AFTER`.
    pub(crate) linger_signal_after: Option<libc::c_int>,
    /// `WARPSOCK_TEST_HANDOVER_GAP_FD`.
    pub(crate) handover_gap_fd: Option<libc::c_int>,
    /// `WARPSOCK_TEST_PASS_HOLD_FD`.
    pub(crate) pass_hold_fd: Option<libc::c_int>,
}

/// The longest time setting taken: a day. Longer ones are taken as it,
/// far past any use, so that the sums and doublings made of them
/// (`Instant` + a timeout, `Limits::with_timeout`'s request wait) cannot
/// overflow, which panicked inside the call interposed (helper 73, item 7).
const MS_MAX: u64 = 24 * 60 * 60 * 1000;

fn env_ms(name: &str, default: u64) -> Duration {
    Duration::from_millis(ms_setting(std::env::var(name).ok().as_deref(), default))
}

/// A time setting's milliseconds: `v` parsed, else `default`, at most
/// [`MS_MAX`].
fn ms_setting(v: Option<&str>, default: u64) -> u64 {
    v.and_then(|v| v.trim().parse().ok())
        .unwrap_or(default)
        .min(MS_MAX)
}

fn env_num(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(default)
}

/// `name`'s count if set: `None` if unset, or malformed (said on stderr,
/// as the UDP layer's settings say theirs: a bound mistyped must not go
/// unnoticed), the default then.
fn env_count(name: &str) -> Option<u64> {
    let v = std::env::var(name).ok()?;
    let n = v.trim().parse().ok();
    if n.is_none() {
        // Read inside a program's call: stderr's `write` is a
        // cancellation point.
        crate::shim::sys::without_cancel(|| {
            eprintln!("warpsock-preload: ignoring malformed {name}={v:?}");
        });
    }
    n
}

/// The machine's physical memory in bytes (0 if unknown).
fn phys_bytes() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let (pages, size) = unsafe {
        (
            libc::sysconf(libc::_SC_PHYS_PAGES),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    u64::try_from(pages)
        .unwrap_or(0)
        .saturating_mul(u64::try_from(size).unwrap_or(0))
}

impl Config {
    fn from_env() -> Self {
        let ports = std::env::var("WARPSOCK_DDP_PORTS")
            .ok()
            .and_then(|v| parse_ports(&v));
        let addrs = std::env::var("WARPSOCK_DDP_ADDRS").ok().map(|v| {
            v.split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .filter_map(Cidr::parse)
                .collect()
        });
        let crc = std::env::var("WARPSOCK_CRC").map_or(true, |v| v.trim() != "0");
        let d = Options::default();
        let mut base = Options {
            crc,
            slots: env_num("WARPSOCK_DDP_SLOTS", d.slots.into()).clamp(3, 4096) as u16,
            // KiB of payload per slot (the message header on top).
            slot_size: Options::slot_size_for(
                (env_num("WARPSOCK_DDP_SLOT_KB", u64::from(d.slot_size >> 10))
                    .clamp(1, (16 << 10) - 1)
                    << 10) as u32,
            ),
            zcopy_min: env_num("WARPSOCK_ZCOPY_MIN", 64 << 10) as usize,
            // At least a copied FPDU's worth (64 B: the core copies such
            // payloads next to their header anyway).
            gather_min: env_num("WARPSOCK_DDP_GATHER_MIN", d.gather_min as u64).max(64) as usize,
            // On by default, as TCP's socket buffer: a client that
            // pipelines requests against a one-thread server does not
            // deadlock (`tests/ddp_pipeline.rs`). It was off in session 20
            // for a lost wake-up of a program waiting for `POLLOUT` alone
            // (fixed: `XSocket::set_writable_wait`).
            sndbuf: env_num("WARPSOCK_DDP_SNDBUF", d.sndbuf as u64) as usize,
            sinks: env_num("WARPSOCK_DDP_SINKS", 1) != 0,
            busy_poll: Duration::from_micros(env_num("WARPSOCK_BUSY_POLL_US", 0)),
            rto_min: match env_num("WARPSOCK_DDP_RTO_MIN_US", u64::MAX) {
                u64::MAX => Options::default().rto_min,
                0 => None,
                us => Some(Duration::from_micros(us)),
            },
            ..Options::default()
        };
        base.limits = Limits::with_timeout(env_ms("WARPSOCK_SWITCH_TIMEOUT_MS", 2000));
        // Every switch's residue charged to the process's budget (request,
        // policy and accepted connections alike; policy mode reads none).
        super::budget::RESIDUE.set_max(residue_max(
            env_count("WARPSOCK_DDP_RESIDUE_MAX"),
            phys_bytes(),
        ));
        base.residue_budget = Some(&super::budget::RESIDUE);
        let mut policy = base.clone();
        policy.limits = Limits::with_timeout(env_ms("WARPSOCK_DDP_FALLBACK_MS", 1000));
        policy.limits.at_start = true;
        let accept_hold = accept_hold(
            std::env::var("WARPSOCK_DDP_ACCEPT_HOLD_MS")
                .ok()
                .and_then(|v| v.trim().parse().ok()),
            &policy.limits,
        );
        let sockets_max = sockets_max(
            env_count("WARPSOCK_DDP_SOCKETS_MAX"),
            phys_bytes(),
            u64::from(base.slots) * u64::from(base.slot_size),
        );
        let mut accepted = base.clone();
        accepted.limits.residue_max = accepted.limits.residue_max.min(ACCEPTED_RESIDUE_MAX);
        Self {
            ports,
            addrs,
            request: base,
            policy,
            accepted,
            linger: env_ms("WARPSOCK_LINGER_MS", 2000),
            epoll_direct: env_num("WARPSOCK_DDP_EPOLL_DIRECT", 1) != 0,
            select_direct: env_num("WARPSOCK_DDP_SELECT_DIRECT", 1) != 0,
            closing_max: closing_max(env_num("WARPSOCK_DDP_CLOSING_MAX", 256)),
            sockets_max,
            connect_timeout: env_ms("WARPSOCK_CONNECT_TIMEOUT_MS", 10_000),
            accept_hold,
            plain_memory: env_ms("WARPSOCK_DDP_PLAIN_MEMORY_MS", 60_000),
            #[cfg(feature = "test-hooks")]
            hooks: {
                let int = |name| {
                    std::env::var(name)
                        .ok()
                        .and_then(|v| v.trim().parse::<libc::c_int>().ok())
                };
                Hooks {
                    linger_signal: int("WARPSOCK_TEST_LINGER_SIGNAL"),
                    linger_signal_after: int("WARPSOCK_TEST_LINGER_SIGNAL_AFTER"),
                    handover_gap_fd: int("WARPSOCK_TEST_HANDOVER_GAP_FD"),
                    pass_hold_fd: int("WARPSOCK_TEST_PASS_HOLD_FD"),
                }
            },
        }
    }

    /// Whether a policy is set at all (TCP sockets are then candidates).
    pub(crate) fn policy_on(&self) -> bool {
        self.ports.is_some() || self.addrs.is_some()
    }

    /// Whether a connection on `port` with peer `peer` switches by policy.
    pub(crate) fn matches(&self, port: u16, peer: SocketAddr) -> bool {
        self.policy_on()
            && self
                .ports
                .as_ref()
                .is_none_or(|p| p.iter().any(|&(lo, hi)| (lo..=hi).contains(&port)))
            && self
                .addrs
                .as_ref()
                .is_none_or(|a| a.iter().any(|c| c.contains(peer.ip())))
    }
}

/// `WARPSOCK_DDP_CLOSING_MAX` as used: at least 1, and no upper bound
/// (review r29-a item 1: clamped to the 256 places of a fixed table, a
/// server's closes past them were given up or reset in normal running;
/// the reaper's table is sized from this now).
fn closing_max(v: u64) -> usize {
    usize::try_from(v).unwrap_or(usize::MAX).max(1)
}

/// `WARPSOCK_DDP_SOCKETS_MAX` as used ([`Config::sockets_max`]): `asked`
/// (0 taken as 1, as `WARPSOCK_DDP_CLOSING_MAX`'s), else as many sockets
/// as an eighth of `phys` bytes holds receive slots of `per_socket` bytes
/// each, 128 to 4096 (128 with the memory unknown: twice the switches
/// under way at once, `switching::SWITCHING_MAX`, so a small machine's
/// budget does not refuse what that bound admits).
fn sockets_max(asked: Option<u64>, phys: u64, per_socket: u64) -> usize {
    let n = asked.map_or_else(
        || (phys / 8 / per_socket.max(1)).clamp(128, 4096),
        |n| n.max(1),
    );
    usize::try_from(n).unwrap_or(usize::MAX)
}

/// `WARPSOCK_DDP_RESIDUE_MAX` as used: the bytes the residues of the
/// switches under way hold together (`budget::RESIDUE`): `asked` as set
/// (0: no switch holds any, one whose peer wrote before its mark fails),
/// else an eighth of `phys` bytes, 64 MiB to 256 MiB (256 MiB with the
/// memory unknown). At least 64 MiB, `Limits::residue_max`: one switch
/// alone is bounded as before, and four explicit switches at their bound
/// fill it; the 64 accepted connections' (1 MiB each,
/// [`ACCEPTED_RESIDUE_MAX`]) fit in its floor. About the kernel's own
/// bound on all TCP receive buffers (`tcp_mem`'s pressure point, a
/// sixteenth to an eighth of the memory).
fn residue_max(asked: Option<u64>, phys: u64) -> usize {
    let n = asked.unwrap_or_else(|| {
        if phys == 0 {
            256 << 20
        } else {
            (phys / 8).clamp(64 << 20, 256 << 20)
        }
    });
    usize::try_from(n).unwrap_or(usize::MAX)
}

/// The accepted connection's hold ([`Config::accept_hold`]): `asked`
/// milliseconds (a quarter of the mark timeout if unset), at most half
/// the client's wait for the answer to its Request (`request_timeout`),
/// so that the answer reaches a client that waits as long as ours would.
fn accept_hold(asked: Option<u64>, policy: &Limits) -> Duration {
    asked
        .map_or(policy.mark_timeout / 4, Duration::from_millis)
        .min(policy.request_timeout / 2)
}

/// The process's configuration (read once).
pub(crate) fn get() -> &'static Config {
    static C: OnceLock<Config> = OnceLock::new();
    C.get_or_init(Config::from_env)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A time setting past a day is a day: `u64::MAX` ms overflowed the
    /// sums made of it (`Instant` + the switch timeout, its doubling) and
    /// panicked inside the interposed call (helper 73, item 7).
    #[test]
    fn time_settings_are_at_most_a_day() {
        assert_eq!(ms_setting(Some("1500"), 2000), 1500);
        assert_eq!(ms_setting(Some(" 0 "), 2000), 0);
        assert_eq!(ms_setting(Some("x"), 2000), 2000);
        assert_eq!(ms_setting(None, 2000), 2000);
        let max = ms_setting(Some(&u64::MAX.to_string()), 2000);
        assert_eq!(max, MS_MAX);
        let t = Duration::from_millis(max);
        let l = Limits::with_timeout(t);
        let _ = std::time::Instant::now() + l.request_timeout + t;
    }

    /// review r29-a item 1: the bound on the closes held is the one set
    /// (the reaper's table is sized from it), 0 taken as 1.
    #[test]
    fn the_closes_held_are_bounded_by_the_setting() {
        assert_eq!(
            closing_max(4096),
            4096,
            "a bound set past 256 was not taken as set"
        );
        assert_eq!(closing_max(100_000), 100_000);
        assert_eq!(closing_max(0), 1);
        assert_eq!(closing_max(10), 10);
        assert_eq!(closing_max(256), 256, "the default");
    }

    /// The budget of DDP sockets: as set (0 as 1), else an eighth of the
    /// memory in receive slots, within 128..=4096.
    #[test]
    fn the_sockets_budget_is_an_eighth_of_memory_in_receive_slots() {
        let slots = 16 * (256 << 10);
        assert_eq!(sockets_max(Some(2), 1 << 40, slots), 2);
        assert_eq!(sockets_max(Some(0), 1 << 40, slots), 1);
        assert_eq!(sockets_max(Some(100_000), 1 << 30, slots), 100_000);
        // 16 GiB: 2 GiB of 4 MiB slots.
        assert_eq!(sockets_max(None, 16 << 30, slots), 512);
        assert_eq!(sockets_max(None, 8 << 30, slots), 256);
        assert_eq!(sockets_max(None, 1 << 30, slots), 128, "the floor");
        assert_eq!(sockets_max(None, 0, slots), 128, "memory unknown");
        assert_eq!(sockets_max(None, 1 << 50, slots), 4096, "the ceiling");
        assert_eq!(sockets_max(None, 1 << 30, 0), 4096);
    }

    /// The residues' budget: as set (0 too), else an eighth of the
    /// memory within 64..=256 MiB, 256 MiB with the memory unknown.
    #[test]
    fn the_residue_budget_is_as_set_or_an_eighth_of_memory() {
        assert_eq!(residue_max(Some(1 << 20), 1 << 40), 1 << 20);
        assert_eq!(residue_max(Some(0), 1 << 40), 0);
        assert_eq!(residue_max(None, 16 << 30), 256 << 20, "the ceiling");
        assert_eq!(residue_max(None, 1 << 30), 128 << 20);
        assert_eq!(residue_max(None, 256 << 20), 64 << 20, "the floor");
        assert_eq!(residue_max(None, 0), 256 << 20, "memory unknown");
    }

    /// An accepted connection's hold is a quarter of the fallback time
    /// unless set, and never reaches half the client's wait for its
    /// answer (a hold past it would time the client out).
    #[test]
    fn the_accept_hold_defaults_to_a_quarter_of_the_fallback_and_is_bounded() {
        let l = Limits::with_timeout(Duration::from_millis(1000));
        assert_eq!(accept_hold(None, &l), Duration::from_millis(250));
        assert_eq!(accept_hold(Some(40), &l), Duration::from_millis(40));
        assert_eq!(accept_hold(Some(0), &l), Duration::ZERO);
        assert_eq!(
            accept_hold(Some(60_000), &l),
            l.request_timeout / 2,
            "a hold past half the client's wait for the answer"
        );
    }
}
