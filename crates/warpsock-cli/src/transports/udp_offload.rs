//! `udp-offload`: the host-UDP flows of [`super::udp`] with both
//! processes under the UDP offload layer (`LD_PRELOAD=libwarpsock_preload.so
//! WARPSOCK_UDP_OFFLOAD=1`), which carries every datagram over an
//! offloaded TCP connection. The bench runs it as a pass of preloaded
//! child processes (or in this process, when it runs preloaded itself).

use std::time::Duration;

use super::udp::Datagrams;
use crate::spec::{Family, TransportInfo};

/// What it is.
pub(crate) static INFO: TransportInfo = TransportInfo {
    name: "udp-offload",
    label: "UDP offload",
    help: "the host-UDP code with both sides under the UDP offload layer \
           (LD_PRELOAD=libwarpsock_preload.so WARPSOCK_UDP_OFFLOAD=1)",
    family: Family::Datagram,
    crc: false,
    pull: false,
    baseline: "udp",
    quick: false,
    setup: false,
    preload: Some(&[("WARPSOCK_UDP_OFFLOAD", "1")]),
};

/// The transport. The offload layer loses nothing but may still be
/// delivering what it buffered when the FIN arrives: receivers drain for
/// up to a second.
pub(crate) static UDP_OFFLOAD: Datagrams = Datagrams {
    info: &INFO,
    grace: Duration::from_millis(1000),
    gso: false,
};
