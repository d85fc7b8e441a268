//! The UDP offload's configuration, from environment variables.
//!
//! Read once, on first use. Malformed values are reported once on stderr and
//! the default is kept; they never abort the program.

use std::net::Ipv4Addr;
use std::sync::OnceLock;
use std::time::Duration;

use super::core::gso::Mode;
use super::core::policy::{parse_ports, Cidr, Policy};
use super::core::setup::Timing;

/// Everything the environment configures.
#[derive(Clone, Debug)]
pub(crate) struct Config {
    /// `WARPSOCK_UDP_OFFLOAD=1`: the layer is on. Off by default.
    pub(crate) enabled: bool,
    /// `WARPSOCK_STATS=1`: print the counters on stderr at exit.
    pub(crate) stats: bool,
    /// The offload policy.
    pub(crate) policy: Policy,
    /// `WARPSOCK_TCP_PORT_OFFSET`: TCP port = UDP port + offset (mod 65536).
    pub(crate) port_offset: u16,
    /// `WARPSOCK_TCP_CONGESTION` (default `bbr`; empty: leave the kernel's).
    pub(crate) congestion: Option<String>,
    /// `WARPSOCK_PACING_RATE` in bytes per second (SO_MAX_PACING_RATE).
    pub(crate) pacing_rate: Option<u64>,
    /// Set-up timing: `WARPSOCK_RETRIES` (attempts after the first,
    /// default 3), `WARPSOCK_RETRY_MS` (first back-off, doubled per retry,
    /// default 10), `WARPSOCK_CONNECT_TIMEOUT_MS` (default 1000),
    /// `WARPSOCK_HELLO_TIMEOUT_MS` (how long a connected peer has to prove it
    /// is warpsock before the destination falls back to UDP, default 500),
    /// `WARPSOCK_PREAMBLE_TIMEOUT_MS` (how long an accepted connection may
    /// stay silent before it is closed, default 3000).
    pub(crate) timing: Timing,
    /// `WARPSOCK_FALLBACK_SECS`: how long a destination stays on kernel UDP
    /// after the TCP path failed (default 10).
    pub(crate) fallback_for: Duration,
    /// `WARPSOCK_SNDBUF`: bytes buffered per connection before senders wait
    /// (default 4 MiB).
    pub(crate) sndbuf: usize,
    /// `WARPSOCK_RCVBUF`: bytes queued per socket before the connections
    /// feeding it stop being read, which back-pressures the senders through
    /// TCP flow control (default 8 MiB). Each datagram is charged its
    /// payload plus a fixed overhead (`sock::DGRAM_OVERHEAD`).
    pub(crate) rcvbuf: usize,
    /// `WARPSOCK_LINGER_MS`: how long exit waits for buffered datagrams to
    /// reach the kernel (default 2000).
    pub(crate) linger: Duration,
    /// `WARPSOCK_EXIT_LINGER_MS`: how long `_exit`/`_Exit` (which skip the
    /// exit handlers) wait for buffered datagrams, in the process that owns
    /// the connections only (default 500, at most `linger`).
    pub(crate) exit_linger: Duration,
    /// `WARPSOCK_UDP_MODE`: `tcp` (offload connections; kernel UDP to peers
    /// without the preload), `gso` (kernel UDP with GSO batching for every
    /// destination, and `UDP_GRO` on receivers), `auto` (default:
    /// connections to peers that run the preload, GSO for the others).
    pub(crate) mode: Mode,
    /// `WARPSOCK_TX_DELAY_US`: how long a streaming program's datagrams may
    /// wait in a connection's buffer for a batch to fill (default 200; 0
    /// writes every datagram at once).
    pub(crate) tx_delay: Duration,
    /// `WARPSOCK_TX_BATCH`: bytes buffered before the sending call writes
    /// them (default 64 KiB).
    pub(crate) tx_batch: usize,
    /// `WARPSOCK_MAX_ACCEPTED`: accepted connections one socket keeps at
    /// most (more are refused: their senders fall back to kernel UDP;
    /// default 128).
    pub(crate) max_accepted: usize,
    /// `WARPSOCK_MAX_PENDING`: accepted connections without a proved port
    /// one socket keeps at most; a new one closes the oldest (default 16).
    pub(crate) max_pending: usize,
    /// `WARPSOCK_RCVQ_DGRAMS`: datagrams queued per socket at most, besides
    /// the byte bound (default 65536).
    pub(crate) rcvq_dgrams: usize,
    /// `WARPSOCK_STRIPES`: connections one destination's datagrams are
    /// striped over (1..=16, default 1).
    pub(crate) stripes: usize,
    /// `WARPSOCK_CALLER_RECV` (default on; `0` turns it off): a blocking
    /// receive reads the socket's connections itself instead of waiting for
    /// the progress thread to hand datagrams over.
    pub(crate) caller_recv: bool,
    /// `WARPSOCK_BUSY_POLL_US`: a blocking receive spins this long, checking
    /// its sources without sleeping, before it sleeps (default 0: off).
    pub(crate) busy_poll: Option<Duration>,
}

fn warn(var: &str, val: &str) {
    // Read inside a program's call: stderr's `write` is a cancellation
    // point.
    crate::shim::sys::without_cancel(|| {
        eprintln!("warpsock-preload: ignoring malformed {var}={val:?}");
    });
}

fn env_num<T: std::str::FromStr>(var: &str, default: T) -> T {
    match std::env::var(var) {
        Ok(v) => v.trim().parse().unwrap_or_else(|_| {
            warn(var, &v);
            default
        }),
        Err(_) => default,
    }
}

fn ms(var: &str, default: u64) -> Duration {
    Duration::from_millis(env_num(var, default))
}

fn env_flag(var: &str) -> bool {
    matches!(
        std::env::var(var).as_deref(),
        Ok("1" | "yes" | "true" | "on")
    )
}

fn interface_broadcasts() -> Vec<Ipv4Addr> {
    let mut out = Vec::new();
    let mut ifap: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `ifap` with a list we free below. Read
    // with cancellation disabled: its netlink calls are cancellation
    // points, and the configuration is read inside a program's call.
    if crate::shim::sys::without_cancel(|| unsafe { libc::getifaddrs(&mut ifap) }) != 0 {
        return out;
    }
    let mut p = ifap;
    while !p.is_null() {
        // SAFETY: `p` walks the list getifaddrs returned, which stays valid
        // until freeifaddrs.
        let ifa = unsafe { &*p };
        let bcast = ifa.ifa_ifu;
        if ifa.ifa_flags & libc::IFF_BROADCAST as u32 != 0 && !bcast.is_null() {
            // SAFETY: a non-null ifa_ifu with IFF_BROADCAST points to a sockaddr.
            if unsafe { (*bcast).sa_family } == libc::AF_INET as libc::sa_family_t {
                // SAFETY: AF_INET sockaddrs are sockaddr_in.
                let sin = unsafe { &*bcast.cast::<libc::sockaddr_in>() };
                out.push(Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)));
            }
        }
        p = ifa.ifa_next;
    }
    // SAFETY: `ifap` came from getifaddrs.
    unsafe { libc::freeifaddrs(ifap) };
    out
}

impl Config {
    /// Reads the configuration from the environment.
    pub(crate) fn from_env() -> Self {
        let list = |var: &str| std::env::var(var).ok().filter(|v| !v.trim().is_empty());
        let ports = list("WARPSOCK_UDP_PORTS").and_then(|v| {
            let p = parse_ports(&v);
            if p.is_none() {
                warn("WARPSOCK_UDP_PORTS", &v);
            }
            p
        });
        let exclude = match std::env::var("WARPSOCK_UDP_EXCLUDE_PORTS") {
            Ok(v) => parse_ports(&v).unwrap_or_else(|| {
                warn("WARPSOCK_UDP_EXCLUDE_PORTS", &v);
                vec![(53, 53)]
            }),
            Err(_) => vec![(53, 53)],
        };
        let nets = list("WARPSOCK_UDP_ADDRS").and_then(|v| {
            let n: Option<Vec<Cidr>> = v.split(',').map(|s| Cidr::parse(s.trim())).collect();
            if n.is_none() {
                warn("WARPSOCK_UDP_ADDRS", &v);
            }
            n
        });
        let enabled = env_flag("WARPSOCK_UDP_OFFLOAD");
        let congestion = match std::env::var("WARPSOCK_TCP_CONGESTION") {
            Ok(v) if v.trim().is_empty() => None,
            Ok(v) => Some(v.trim().to_owned()),
            Err(_) => Some("bbr".to_owned()),
        };
        let pacing: u64 = env_num("WARPSOCK_PACING_RATE", 0);
        Self {
            enabled,
            stats: env_flag("WARPSOCK_STATS"),
            policy: Policy {
                ports,
                exclude,
                nets,
                broadcasts: if enabled {
                    interface_broadcasts()
                } else {
                    Vec::new()
                },
            },
            port_offset: env_num("WARPSOCK_TCP_PORT_OFFSET", 0),
            congestion,
            pacing_rate: (pacing > 0).then_some(pacing),
            timing: Timing {
                retries: env_num("WARPSOCK_RETRIES", 3),
                retry_base: ms("WARPSOCK_RETRY_MS", 10),
                connect_timeout: ms("WARPSOCK_CONNECT_TIMEOUT_MS", 1000),
                hello_timeout: ms("WARPSOCK_HELLO_TIMEOUT_MS", 500),
                preamble_timeout: ms("WARPSOCK_PREAMBLE_TIMEOUT_MS", 3000),
            },
            fallback_for: Duration::from_secs(env_num("WARPSOCK_FALLBACK_SECS", 10)),
            sndbuf: env_num("WARPSOCK_SNDBUF", 4 << 20usize).max(128 << 10),
            rcvbuf: env_num("WARPSOCK_RCVBUF", 8 << 20usize).max(128 << 10),
            linger: Duration::from_millis(env_num("WARPSOCK_LINGER_MS", 2000)),
            exit_linger: Duration::from_millis(env_num("WARPSOCK_EXIT_LINGER_MS", 500)),
            mode: match std::env::var("WARPSOCK_UDP_MODE") {
                Ok(v) => Mode::parse(&v).unwrap_or_else(|| {
                    warn("WARPSOCK_UDP_MODE", &v);
                    Mode::Auto
                }),
                Err(_) => Mode::Auto,
            },
            tx_delay: Duration::from_micros(env_num("WARPSOCK_TX_DELAY_US", 200)),
            tx_batch: env_num("WARPSOCK_TX_BATCH", 64usize << 10).clamp(1, 1 << 20),
            max_accepted: env_num("WARPSOCK_MAX_ACCEPTED", 128usize).max(1),
            max_pending: env_num("WARPSOCK_MAX_PENDING", 16usize).max(1),
            rcvq_dgrams: env_num("WARPSOCK_RCVQ_DGRAMS", 65_536usize).max(16),
            stripes: env_num("WARPSOCK_STRIPES", 1usize).clamp(1, super::core::frame::MAX_STRIPES),
            caller_recv: !matches!(
                std::env::var("WARPSOCK_CALLER_RECV")
                    .as_deref()
                    .map(str::trim),
                Ok("0" | "no" | "false" | "off")
            ),
            busy_poll: Some(env_num("WARPSOCK_BUSY_POLL_US", 0u64))
                .filter(|&us| us > 0)
                .map(Duration::from_micros),
        }
    }

    /// The TCP port that carries datagrams for UDP port `udp`.
    pub(crate) fn tcp_port(&self, udp: u16) -> u16 {
        udp.wrapping_add(self.port_offset)
    }
}

static CFG: OnceLock<Config> = OnceLock::new();

/// The process-wide configuration.
pub(crate) fn get() -> &'static Config {
    CFG.get_or_init(Config::from_env)
}

/// The configuration if it was read already: no allocation, no lock (an
/// exit over a stretch that may hold one must not read the environment).
pub(crate) fn get_if_read() -> Option<&'static Config> {
    CFG.get()
}
