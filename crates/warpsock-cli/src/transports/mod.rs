//! Every transport the bench compares, one file each, and the registry
//! that lists them.
//!
//! # Adding a transport
//!
//! 1. A file `src/transports/NAME.rs` with a `static INFO:`
//!    [`TransportInfo`] (name, label, family, CRC rows, baseline, whether
//!    it needs the preload and with which environment) and a `static` that
//!    implements [`Link`]: how the client connects and the server accepts,
//!    each side ending with an [`Endpoint`](crate::driver::Endpoint) the
//!    driver runs. A transport that is the same code as another under a
//!    different environment reuses that code (see `udp_offload.rs`: eight
//!    lines of description over [`udp::Datagrams`]).
//! 2. One line in [`ALL`] below (and `mod NAME;`).
//!
//! Nothing else changes: the option parser, the plan, the control
//! protocol, the server, the preloaded passes, the tables, the JSON, the
//! figures and the summary all go through this registry.

mod ddp_socket;
mod gso;
mod iwarp;
mod riowrite;
mod sock;
mod tcp;
mod udp;
mod udp_gso;
mod udp_host_gso;
mod udp_offload;

use crate::driver::Link;
use crate::spec::Transport;

/// Every transport, in table order.
pub(crate) static ALL: &[&dyn Link] = &[
    &tcp::Tcp,
    &udp::UDP,
    &udp_offload::UDP_OFFLOAD,
    &udp_gso::UDP_GSO,
    &udp_host_gso::UDP_HOST_GSO,
    &iwarp::SEND,
    &iwarp::WRITE,
    &iwarp::READ,
    &ddp_socket::DdpSocket,
    &riowrite::RioWrite,
];

/// Every transport, in table order.
pub(crate) fn all() -> impl Iterator<Item = Transport> {
    ALL.iter().map(|l| Transport(l.info()))
}

/// The transport called `name`.
pub(crate) fn find(name: &str) -> Option<Transport> {
    all().find(|t| t.name() == name)
}

/// How the two sides of `t` connect.
pub(crate) fn link(t: Transport) -> &'static dyn Link {
    *ALL.iter()
        .find(|l| l.info().name == t.name())
        .expect("a Transport comes from the registry")
}

/// Table order of `t`.
pub(crate) fn rank(t: Transport) -> usize {
    ALL.iter()
        .position(|l| l.info().name == t.name())
        .unwrap_or(usize::MAX)
}

/// `--transports` element: a registered name, or an error listing them.
pub(crate) fn parse(s: &str) -> Result<Transport, String> {
    find(s.trim()).ok_or_else(|| {
        let names: Vec<&str> = all().map(Transport::name).collect();
        format!("'{s}': unknown transport (one of {})", names.join(", "))
    })
}

/// The description of every transport, for `--help`.
pub(crate) fn help() -> String {
    all()
        .map(|t| format!("{}: {}", t.name(), t.help))
        .collect::<Vec<_>>()
        .join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_found() {
        for (i, t) in all().enumerate() {
            assert_eq!(find(t.name()), Some(t));
            assert_eq!(rank(t), i);
            assert_eq!(link(t).info().name, t.name());
            assert!(find(t.baseline).is_some(), "{t}: baseline");
        }
        assert!(parse("carrier-pigeon").unwrap_err().contains(
            "one of tcp, udp, udp-offload, udp-gso, udp-host-gso, send, write, read, ddp-socket, riowrite"
        ));
    }
}
