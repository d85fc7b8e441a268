//! `udp-gso`: the host-UDP flows of [`super::udp`] with both processes
//! under the preload's second offload path (`LD_PRELOAD=libwarpsock_preload.so
//! WARPSOCK_UDP_OFFLOAD=1 WARPSOCK_UDP_MODE=gso`): kernel UDP, a stream's
//! datagrams to one destination gathered into `UDP_SEGMENT` sends, and
//! `UDP_GRO` on the receiver. No TCP connection is involved, so datagrams
//! may be lost as with kernel UDP.

use std::time::Duration;

use super::udp::Datagrams;
use crate::spec::{Family, TransportInfo};

/// What it is.
pub(crate) static INFO: TransportInfo = TransportInfo {
    name: "udp-gso",
    label: "UDP GSO",
    help: "the host-UDP code with both sides under the preload's GSO path \
           (LD_PRELOAD=libwarpsock_preload.so WARPSOCK_UDP_OFFLOAD=1 WARPSOCK_UDP_MODE=gso: \
           kernel UDP, UDP_SEGMENT batches, UDP_GRO)",
    family: Family::Datagram,
    crc: false,
    pull: false,
    baseline: "udp",
    quick: false,
    setup: false,
    preload: Some(&[("WARPSOCK_UDP_OFFLOAD", "1"), ("WARPSOCK_UDP_MODE", "gso")]),
};

/// The transport. A batch's tail may still be on its way when the FIN
/// arrives (at most `WARPSOCK_TX_DELAY_US`): receivers drain a little
/// longer than plain UDP's.
pub(crate) static UDP_GSO: Datagrams = Datagrams {
    info: &INFO,
    grace: Duration::from_millis(50),
    gso: false,
};
