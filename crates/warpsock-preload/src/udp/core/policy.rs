//! The offload policy: which UDP traffic is carried over TCP (ports,
//! address prefixes, broadcast and multicast stay on the kernel).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

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

    /// Whether an accepted connection may claim to carry datagrams from
    /// `src` (its TCP peer address with the port its preamble claims):
    /// never from port 0 or an excluded port, and only from the configured
    /// prefixes (`WARPSOCK_UDP_ADDRS` filters inbound too). The port list
    /// (`WARPSOCK_UDP_PORTS`) names our ports and destinations, not the
    /// peers' (often ephemeral) source ports, so it does not apply here.
    pub(crate) fn source_ok(&self, src: &SocketAddr) -> bool {
        let port = src.port();
        port != 0
            && !self.exclude.iter().any(|&(a, b)| (a..=b).contains(&port))
            && self.peer_ok(src.ip())
    }

    /// Whether a TCP peer at `ip` may connect to our listeners at all.
    pub(crate) fn peer_ok(&self, ip: IpAddr) -> bool {
        self.nets
            .as_ref()
            .is_none_or(|n| n.iter().any(|c| c.contains(ip)))
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

    #[test]
    fn inbound_sources() {
        let d = |s: &str| s.parse::<SocketAddr>().unwrap();
        let p = Policy {
            ports: Some(vec![(5001, 5001)]),
            nets: Some(vec![Cidr::parse("127.0.0.0/8").unwrap()]),
            ..policy()
        };
        assert!(p.source_ok(&d("127.0.0.1:40000")), "ephemeral source ports");
        assert!(!p.source_ok(&d("127.0.0.1:0")), "port 0");
        assert!(!p.source_ok(&d("127.0.0.1:53")), "excluded port");
        assert!(
            !p.source_ok(&d("10.1.2.3:40000")),
            "outside WARPSOCK_UDP_ADDRS"
        );
        assert!(p.source_ok(&d("[::ffff:127.0.0.1]:40000")), "v4-mapped");
        assert!(!p.peer_ok("10.1.2.3".parse().unwrap()));
        assert!(
            policy().peer_ok("10.1.2.3".parse().unwrap()),
            "no list: every peer"
        );
    }
}
