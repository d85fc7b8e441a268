//! The UDP offload's protocol logic, sans-IO: no sockets, no threads, no
//! clock reads. Time is passed in (`now: Instant`), bytes go in and out of
//! buffers, and decisions come back as values for the driver
//! (`crate::udp::conn`, `crate::udp::sock`) to carry out; every behaviour
//! is unit-tested here with simulated time, as `warpsock-proto` is.
//!
//! | module | what it decides |
//! |---|---|
//! | [`frame`] | the wire format: hello, preamble (and its stripe extension), datagram frames |
//! | [`gso`] | the GSO path: which datagrams join one `UDP_SEGMENT` send; cutting `UDP_GRO` buffers; the per-destination mode |
//! | [`policy`] | which traffic is offloaded: ports, prefixes, broadcast and multicast |
//! | [`setup`] | connection phases: connect, hello, preamble, retry with back-off, give-up |
//! | [`txbuf`] | a connection's send buffer: what is written, what a failure gives back |
//! | [`rxbuf`] | a connection's receive buffer: frames split in place |
//! | [`stall`] | how long a blocking send waits on a full connection: per connection, and the socket's budget for stalled peers |
//! | [`routes`] | which connection carries each destination: stripes, adoption, fallback |

pub(crate) mod frame;
pub(crate) mod gso;
pub(crate) mod policy;
pub(crate) mod routes;
pub(crate) mod rxbuf;
pub(crate) mod setup;
pub(crate) mod stall;
pub(crate) mod txbuf;
