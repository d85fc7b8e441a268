//! Process-wide counters for every path a datagram can take, printed on
//! stderr at exit when `WARPSOCK_STATS=1`.

use std::sync::atomic::{AtomicU64, Ordering};

macro_rules! counters {
    ($( $(#[doc = $doc:literal])* $name:ident, )*) => {
        /// One counter per path; all relaxed atomics.
        pub(crate) struct Stats {
            $( $(#[doc = $doc])* pub(crate) $name: AtomicU64, )*
        }

        /// The counters.
        pub(crate) static STATS: Stats = Stats { $( $name: AtomicU64::new(0), )* };

        impl Stats {
            /// `(name, value)` for every counter, in declaration order.
            pub(crate) fn snapshot(&self) -> Vec<(&'static str, u64)> {
                vec![$( (stringify!($name), self.$name.load(Ordering::Relaxed)), )*]
            }
        }
    };
}

counters! {
    /// UDP sockets switched to the offload layer.
    sockets_offloaded,
    /// TCP listeners opened for bound UDP ports.
    listeners,
    /// Listeners that could not be opened (port taken by a TCP program).
    listen_failed,
    /// Datagrams handed to an offload connection.
    tx_tcp_dgrams,
    /// Payload bytes handed to an offload connection.
    tx_tcp_bytes,
    /// Datagrams written to TCP by the sending call itself (connection idle).
    tx_direct,
    /// Datagrams queued behind others and coalesced into larger writes.
    tx_coalesced,
    /// Writes of coalesced data done by the progress thread.
    tx_flush_writes,
    /// Datagrams sent by kernel UDP because the policy excludes them.
    tx_kernel_policy,
    /// Datagrams sent by kernel UDP because the destination has fallen back.
    tx_kernel_fallback,
    /// Queued datagrams re-sent by kernel UDP when their connection failed.
    tx_requeued_udp,
    /// Datagrams lost: partly written to a connection that then died, or
    /// refused by kernel UDP during a fallback.
    tx_lost,
    /// Sends that waited for buffer space (back-pressure).
    tx_waits,
    /// TCP connection attempts.
    connects,
    /// Attempts that established a warpsock connection.
    connect_ok,
    /// Attempts that failed (refused, unreachable, timed out, reset).
    connect_failed,
    /// Attempts scheduled after a back-off.
    connect_retries,
    /// Peers that accepted TCP but did not answer as warpsock.
    hello_failed,
    /// Destinations switched to kernel UDP after the retries ran out.
    fallbacks,
    /// Connections accepted.
    accepts,
    /// Accepted connections dropped for a bad preamble or framing.
    protocol_errors,
    /// Established connections that ended (EOF, reset, error).
    conns_closed,
    /// Datagrams received over TCP.
    rx_tcp_dgrams,
    /// Payload bytes received over TCP.
    rx_tcp_bytes,
    /// Datagrams received from the kernel UDP socket of an offloaded socket.
    rx_kernel_dgrams,
    /// TCP datagrams dropped because a connected socket's peer differs.
    rx_filtered,
    /// Times the receive queue was full and reading was paused.
    rx_paused,
    /// Datagrams a blocking receive call read from a connection itself
    /// (caller-driven receive), without the progress thread.
    rx_caller_dgrams,
    /// Blocking receives whose data turned up while busy-polling
    /// (`WARPSOCK_BUSY_POLL_US`), before the call went to sleep.
    rx_busy_poll_hits,
    /// Connection set-up timeouts not taken because the socket was ready
    /// when the timer ran (the event was handled instead).
    timer_rescues,
    /// Doorbell bytes written to make the application's descriptor readable.
    doorbells,
    /// Congestion control set on an offload connection.
    cc_set,
    /// Congestion control could not be set (kernel default kept).
    cc_failed,
    /// Pacing rate set on an offload connection.
    pacing_set,
}

/// Adds `n` to a counter.
#[inline]
pub(crate) fn add(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

/// Adds one to a counter.
#[inline]
pub(crate) fn inc(c: &AtomicU64) {
    add(c, 1);
}

/// The report printed at exit.
pub(crate) fn report() -> String {
    let mut s = format!("warpsock udp-offload stats (pid {}):\n", std::process::id());
    for (name, v) in STATS.snapshot() {
        s.push_str(&format!("  {name:<20} {v}\n"));
    }
    s
}
