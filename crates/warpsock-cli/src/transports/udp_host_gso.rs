//! `udp-host-gso`: host UDP as a program that batches by itself gets it,
//! the baseline for `udp-gso` (which gives unmodified programs the same
//! kernel paths): the host-UDP flows of [`super::udp`], no preload, with
//! a bandwidth sender gathering each flow's datagrams into `UDP_SEGMENT`
//! sends (up to 64 datagrams or 65,507 bytes, held at most 200 µs, sent at
//! once when the endpoint is about to wait) and the receiver reading with
//! `UDP_GRO` ([`super::gso`]). Ping-pong is plain host UDP.

use std::time::Duration;

use super::udp::Datagrams;
use crate::spec::{Family, TransportInfo};

/// What it is.
pub(crate) static INFO: TransportInfo = TransportInfo {
    name: "udp-host-gso",
    label: "host UDP GSO/GRO",
    help: "host UDP with the benchmark itself batching: UDP_SEGMENT sends of up to 64 \
           datagrams, UDP_GRO receives (no preload; the baseline for udp-gso)",
    family: Family::Datagram,
    crc: false,
    pull: false,
    baseline: "udp",
    quick: false,
    setup: false,
    preload: None,
};

/// The transport. A flow's batch is sent before its FIN, so receivers
/// drain as briefly as host UDP's.
pub(crate) static UDP_HOST_GSO: Datagrams = Datagrams {
    info: &INFO,
    grace: Duration::from_millis(20),
    gso: true,
};
