//! Configuration from environment variables, and the offload policy.
//!
//! Read once, on first use. Malformed values are reported once on stderr and
//! the default is kept; they never abort the program.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::OnceLock;
use std::time::Duration;

/// An address prefix such as `127.0.0.0/8` or `::1/128`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Cidr {
    addr: IpAddr,
    len: u8,
}

impl Cidr {
    /// Parses `a.b.c.d/n`, `x::y/n` or a bare address (full-length prefix).
    pub(crate) fn parse(s: &str) -> Option<Self> {
        let (a, l) = match s.split_once('/') {
            Some((a, l)) => (a, Some(l)),
            None => (s, None),
        };
        let addr: IpAddr = a.trim().parse().ok()?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let len = match l {
            Some(l) => l.trim().parse::<u8>().ok().filter(|&n| n <= max)?,
            None => max,
        };
        Some(Self { addr, len })
    }

    /// Whether `ip` lies in this prefix. IPv4-mapped IPv6 addresses match IPv4
    /// prefixes.
    pub(crate) fn contains(&self, ip: IpAddr) -> bool {
        let ip = canonical(ip);
        match (self.addr, ip) {
            (IpAddr::V4(p), IpAddr::V4(a)) => {
                let mask = if self.len == 0 {
                    0
                } else {
                    u32::MAX << (32 - u32::from(self.len))
                };
                u32::from(p) & mask == u32::from(a) & mask
            }
            (IpAddr::V6(p), IpAddr::V6(a)) => {
                let mask = if self.len == 0 {
                    0
                } else {
                    u128::MAX << (128 - u32::from(self.len))
                };
                u128::from(p) & mask == u128::from(a) & mask
            }
            _ => false,
        }
    }
}

/// Maps IPv4-mapped IPv6 addresses to IPv4, leaves others alone.
pub(crate) fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(v6),
        },
        v4 => v4,
    }
}

/// Parses `53,5000-5100` into inclusive ranges.
pub(crate) fn parse_ports(s: &str) -> Option<Vec<(u16, u16)>> {
    let mut out = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (lo, hi) = match part.split_once('-') {
            Some((a, b)) => (a.trim().parse().ok()?, b.trim().parse().ok()?),
            None => {
                let p = part.parse().ok()?;
                (p, p)
            }
        };
        if lo > hi {
            return None;
        }
        out.push((lo, hi));
    }
    Some(out)
}

/// Which UDP traffic is carried over TCP.
#[derive(Clone, Debug)]
pub(crate) struct Policy {
    /// Ports offloaded (`None`: every port).
    pub(crate) ports: Option<Vec<(u16, u16)>>,
    /// Ports never offloaded (default: 53).
    pub(crate) exclude: Vec<(u16, u16)>,
    /// Destination prefixes offloaded (`None`: every unicast address).
    pub(crate) nets: Option<Vec<Cidr>>,
    /// Directed broadcast addresses of the local interfaces.
    pub(crate) broadcasts: Vec<Ipv4Addr>,
}

impl Policy {
    /// Whether a socket bound to (or sending from/to) `port` is eligible.
    pub(crate) fn port_ok(&self, port: u16) -> bool {
        if port == 0 || self.exclude.iter().any(|&(a, b)| (a..=b).contains(&port)) {
            return false;
        }
        match &self.ports {
            Some(r) => r.iter().any(|&(a, b)| (a..=b).contains(&port)),
            None => true,
        }
    }

    /// Whether datagrams to `dest` go over TCP. `so_broadcast` is the socket's
    /// SO_BROADCAST option: such sockets keep IPv4 traffic on the kernel path.
    pub(crate) fn dest_ok(&self, dest: &SocketAddr, so_broadcast: bool) -> bool {
        if !self.port_ok(dest.port()) {
            return false;
        }
        let ip = canonical(dest.ip());
        let unicast = match ip {
            IpAddr::V4(v4) => {
                !(v4.is_multicast()
                    || v4.is_broadcast()
                    || v4.is_unspecified()
                    || so_broadcast
                    || self.broadcasts.contains(&v4))
            }
            IpAddr::V6(v6) => !(v6.is_multicast() || v6.is_unspecified()),
        };
        if !unicast {
            return false;
        }
        match &self.nets {
            Some(n) => n.iter().any(|c| c.contains(ip)),
            None => true,
        }
    }
}

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
    /// `WARPSOCK_RETRIES`: connection attempts after the first (default 3).
    pub(crate) retries: u32,
    /// `WARPSOCK_RETRY_MS`: first back-off, doubled per retry (default 10).
    pub(crate) retry_base: Duration,
    /// `WARPSOCK_CONNECT_TIMEOUT_MS` (default 1000).
    pub(crate) connect_timeout: Duration,
    /// `WARPSOCK_HELLO_TIMEOUT_MS`: how long a connected peer has to prove it
    /// is warpsock before the destination falls back to UDP (default 500).
    pub(crate) hello_timeout: Duration,
    /// `WARPSOCK_FALLBACK_SECS`: how long a destination stays on kernel UDP
    /// after the TCP path failed (default 10).
    pub(crate) fallback_for: Duration,
    /// `WARPSOCK_SNDBUF`: bytes buffered per connection before senders wait
    /// (default 4 MiB).
    pub(crate) sndbuf: usize,
    /// `WARPSOCK_RCVBUF`: bytes queued per socket before the connections
    /// feeding it stop being read, which back-pressures the senders through
    /// TCP flow control (default 8 MiB).
    pub(crate) rcvbuf: usize,
    /// `WARPSOCK_LINGER_MS`: how long exit waits for buffered datagrams to
    /// reach the kernel (default 2000).
    pub(crate) linger: Duration,
    /// `WARPSOCK_EXIT_LINGER_MS`: how long `_exit`/`_Exit` (which skip the
    /// exit handlers) wait for buffered datagrams, in the process that owns
    /// the connections only (default 500, at most `linger`).
    pub(crate) exit_linger: Duration,
    /// `WARPSOCK_STRIPES`: connections one destination's datagrams are
    /// striped over (1..=16, default 1).
    pub(crate) stripes: usize,
    /// `WARPSOCK_TEST_UDP_READY_DELAY_MS`, for tests only (undocumented
    /// otherwise): the progress thread waits this long before handling an
    /// arrival on a hidden kernel UDP socket, so that a test can make a
    /// receive call take the datagram first, deterministically.
    pub(crate) test_udp_ready_delay: Option<Duration>,
    /// `WARPSOCK_CALLER_RECV` (default on; `0` turns it off): a blocking
    /// receive reads the socket's connections itself instead of waiting for
    /// the progress thread to hand datagrams over.
    pub(crate) caller_recv: bool,
    /// `WARPSOCK_BUSY_POLL_US`: a blocking receive spins this long, checking
    /// its sources without sleeping, before it sleeps (default 0: off).
    pub(crate) busy_poll: Option<Duration>,
    /// `WARPSOCK_TEST_TIMER_DELAY_MS`, for tests only: the progress thread
    /// waits this long before looking at its timers, as if it had been
    /// descheduled between its wait and the timers, so a test can make a
    /// set-up answer arrive after the deadline but before the timer runs.
    pub(crate) test_timer_delay: Option<Duration>,
}

fn warn(var: &str, val: &str) {
    eprintln!("warpsock-preload: ignoring malformed {var}={val:?}");
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

fn env_flag(var: &str) -> bool {
    matches!(
        std::env::var(var).as_deref(),
        Ok("1" | "yes" | "true" | "on")
    )
}

fn interface_broadcasts() -> Vec<Ipv4Addr> {
    let mut out = Vec::new();
    let mut ifap: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `ifap` with a list we free below.
    if unsafe { libc::getifaddrs(&mut ifap) } != 0 {
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
            retries: env_num("WARPSOCK_RETRIES", 3),
            retry_base: Duration::from_millis(env_num("WARPSOCK_RETRY_MS", 10)),
            connect_timeout: Duration::from_millis(env_num("WARPSOCK_CONNECT_TIMEOUT_MS", 1000)),
            hello_timeout: Duration::from_millis(env_num("WARPSOCK_HELLO_TIMEOUT_MS", 500)),
            fallback_for: Duration::from_secs(env_num("WARPSOCK_FALLBACK_SECS", 10)),
            sndbuf: env_num("WARPSOCK_SNDBUF", 4 << 20usize).max(128 << 10),
            rcvbuf: env_num("WARPSOCK_RCVBUF", 8 << 20usize).max(128 << 10),
            linger: Duration::from_millis(env_num("WARPSOCK_LINGER_MS", 2000)),
            exit_linger: Duration::from_millis(env_num("WARPSOCK_EXIT_LINGER_MS", 500)),
            stripes: env_num("WARPSOCK_STRIPES", 1usize).clamp(1, crate::frame::MAX_STRIPES),
            test_udp_ready_delay: Some(env_num("WARPSOCK_TEST_UDP_READY_DELAY_MS", 0u64))
                .filter(|&ms| ms > 0)
                .map(Duration::from_millis),
            caller_recv: !matches!(
                std::env::var("WARPSOCK_CALLER_RECV")
                    .as_deref()
                    .map(str::trim),
                Ok("0" | "no" | "false" | "off")
            ),
            busy_poll: Some(env_num("WARPSOCK_BUSY_POLL_US", 0u64))
                .filter(|&us| us > 0)
                .map(Duration::from_micros),
            test_timer_delay: Some(env_num("WARPSOCK_TEST_TIMER_DELAY_MS", 0u64))
                .filter(|&ms| ms > 0)
                .map(Duration::from_millis),
        }
    }

    /// The TCP port that carries datagrams for UDP port `udp`.
    pub(crate) fn tcp_port(&self, udp: u16) -> u16 {
        udp.wrapping_add(self.port_offset)
    }
}

/// The process-wide configuration.
pub(crate) fn get() -> &'static Config {
    static CFG: OnceLock<Config> = OnceLock::new();
    CFG.get_or_init(Config::from_env)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> Policy {
        Policy {
            ports: None,
            exclude: vec![(53, 53)],
            nets: None,
            broadcasts: vec![Ipv4Addr::new(10, 0, 0, 255)],
        }
    }

    #[test]
    fn cidr_matching() {
        let c = Cidr::parse("127.0.0.0/8").unwrap();
        assert!(c.contains("127.1.2.3".parse().unwrap()));
        assert!(c.contains("::ffff:127.0.0.1".parse().unwrap()));
        assert!(!c.contains("10.0.0.1".parse().unwrap()));
        let c6 = Cidr::parse("::1").unwrap();
        assert!(c6.contains("::1".parse().unwrap()));
        assert!(!c6.contains("::2".parse().unwrap()));
        assert!(Cidr::parse("0.0.0.0/0")
            .unwrap()
            .contains("8.8.8.8".parse().unwrap()));
        assert_eq!(Cidr::parse("1.2.3.4/33"), None);
        assert_eq!(Cidr::parse("nonsense"), None);
    }

    #[test]
    fn port_lists() {
        assert_eq!(
            parse_ports("53, 5000-5100,7"),
            Some(vec![(53, 53), (5000, 5100), (7, 7)])
        );
        assert_eq!(parse_ports("9-1"), None);
        assert_eq!(parse_ports("x"), None);
        assert_eq!(parse_ports(""), Some(vec![]));
    }

    #[test]
    fn default_policy() {
        let p = policy();
        let d = |s: &str| s.parse::<SocketAddr>().unwrap();
        assert!(p.dest_ok(&d("127.0.0.1:5001"), false));
        assert!(p.dest_ok(&d("[::1]:5001"), false));
        assert!(
            !p.dest_ok(&d("127.0.0.1:53"), false),
            "DNS stays on the kernel"
        );
        assert!(
            !p.dest_ok(&d("224.0.0.1:5001"), false),
            "multicast stays on the kernel"
        );
        assert!(!p.dest_ok(&d("[ff02::1]:5001"), false));
        assert!(!p.dest_ok(&d("255.255.255.255:5001"), false));
        assert!(
            !p.dest_ok(&d("10.0.0.255:5001"), false),
            "directed broadcast"
        );
        assert!(
            !p.dest_ok(&d("127.0.0.1:5001"), true),
            "SO_BROADCAST sockets"
        );
        assert!(!p.dest_ok(&d("127.0.0.1:0"), false));
    }

    #[test]
    fn configured_policy() {
        let p = Policy {
            ports: Some(vec![(5000, 5010)]),
            nets: Some(vec![Cidr::parse("127.0.0.0/8").unwrap()]),
            ..policy()
        };
        let d = |s: &str| s.parse::<SocketAddr>().unwrap();
        assert!(p.dest_ok(&d("127.0.0.1:5005"), false));
        assert!(!p.dest_ok(&d("127.0.0.1:5011"), false));
        assert!(!p.dest_ok(&d("[::1]:5005"), false));
        assert!(p.port_ok(5000) && !p.port_ok(4999));
    }
}
