//! Process-wide counters for every path a datagram can take, printed on
//! stderr at exit when `WARPSOCK_STATS=1`.

use std::fmt::Write;
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
            pub(crate) fn for_each(&self, mut f: impl FnMut(&'static str, u64)) {
                $( f(stringify!($name), self.$name.load(Ordering::Relaxed)); )*
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
    /// Datagrams handed to an offload connection (written or buffered; not
    /// the stall drops, counted only as those).
    tx_tcp_dgrams,
    /// Payload bytes handed to an offload connection (likewise).
    tx_tcp_bytes,
    /// Datagrams written to TCP by the sending call itself (connection idle).
    tx_direct,
    /// Datagrams queued behind others and coalesced into larger writes.
    tx_coalesced,
    /// Writes of buffered data (by the progress thread or a batch's sender).
    tx_flush_writes,
    /// Batches written by the sending call itself (the buffer reached
    /// `WARPSOCK_TX_BATCH`, or its tail's delay had passed).
    tx_batches,
    /// Batch tails written by the progress thread after
    /// `WARPSOCK_TX_DELAY_US`.
    tx_tail_flushes,
    /// Datagrams sent by kernel UDP because the policy excludes them.
    tx_kernel_policy,
    /// Datagrams gathered into GSO sends (the GSO path).
    tx_gso_dgrams,
    /// `sendmsg` calls on the GSO path (with `UDP_SEGMENT` when more than
    /// one datagram).
    tx_gso_sends,
    /// Datagrams on the GSO path sent alone at once (not streaming).
    tx_gso_alone,
    /// GSO batches a stream left, sent by the progress thread after
    /// `WARPSOCK_TX_DELAY_US`.
    tx_gso_tails,
    /// Sockets whose kernel refused GSO (datagrams go one by one).
    tx_gso_off,
    /// Datagrams sent by kernel UDP because the destination has fallen back.
    tx_kernel_fallback,
    /// Queued datagrams re-sent by kernel UDP when their connection failed.
    tx_requeued_udp,
    /// Datagrams lost: partly written to a connection that then died, or
    /// refused by kernel UDP during a fallback.
    tx_lost,
    /// Sends that waited for buffer space (back-pressure).
    tx_waits,
    /// Sends that found the send buffer full and made room by writing it
    /// themselves (no wait for the progress thread).
    tx_full_flushes,
    /// Polls for `POLLOUT` on a socket whose send buffer was full that
    /// waited for the connection to take more (exact writability: a
    /// sender that polls does not spin).
    tx_room_waits,
    /// Datagrams dropped because the connection's peer stopped reading
    /// (its buffer full and no progress for `STALL`, 5 s), as kernel UDP
    /// drops what it cannot send (`core::stall`).
    tx_stall_drops,
    /// Datagrams dropped because their connection was full while the
    /// socket's budget for waiting on stalled peers was spent (many peers
    /// that stopped reading: `core::stall`).
    tx_stall_budget_drops,
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
    /// Accepted connections closed because no preamble (or no proof of its
    /// port) arrived within `WARPSOCK_PREAMBLE_TIMEOUT_MS`.
    preamble_timeouts,
    /// Accepted connections closed because their preamble claimed port 0,
    /// an excluded port, or an address outside `WARPSOCK_UDP_ADDRS`.
    preamble_refused,
    /// Accepted connections refused at once: their TCP peer is outside
    /// `WARPSOCK_UDP_ADDRS`, or the listener's socket already has
    /// `WARPSOCK_MAX_ACCEPTED` of them.
    accepts_refused,
    /// Accepted connections still without a proved port closed to make
    /// room for a new one (`WARPSOCK_MAX_PENDING`).
    pending_evicted,
    /// Times a listener stopped accepting for a while because the process
    /// ran out of descriptors (EMFILE, ENFILE) or memory.
    accept_pauses,
    /// Source-port proofs that matched an accepted connection (its
    /// datagrams are delivered from then on).
    proofs_ok,
    /// Proof datagrams that matched no connection, or came from another
    /// address than the connection's peer (dropped, never delivered).
    proofs_bad,
    /// Routes of ours that never came up, replaced by an accepted
    /// connection from the same sender once its proof landed (the program
    /// had answered that sender before the connection was adopted).
    routes_replaced,
    /// Proof datagrams sent (connecting side, re-sends included).
    proofs_sent,
    /// Established connections that ended (EOF, reset, error).
    conns_closed,
    /// Datagrams received over TCP.
    rx_tcp_dgrams,
    /// Payload bytes received over TCP.
    rx_tcp_bytes,
    /// Reads of an offload connection that returned data (each may hold
    /// many datagrams: with `rx_tcp_dgrams`, the receive side's system
    /// calls per datagram).
    rx_tcp_reads,
    /// Datagrams received from the kernel UDP socket of an offloaded socket
    /// (a peek receives none).
    rx_kernel_dgrams,
    /// Coalesced `UDP_GRO` buffers cut back into datagrams.
    rx_gro_buffers,
    /// TCP datagrams dropped because a connected socket's peer differs.
    rx_filtered,
    /// Receive calls that left a connection's rest for the next call after
    /// `serve::SERVE_STEPS` steps without a datagram (a flood from a peer
    /// a connected socket does not hear).
    rx_serve_budget,
    /// Times the receive queue was full and reading was paused.
    rx_paused,
    /// Datagrams a blocking receive call read from a connection itself
    /// (caller-driven receive), without the progress thread.
    rx_caller_dgrams,
    /// Arrivals on a connection that woke the program's own poll/ppoll
    /// (its connections are watched by that call: no thread hand-off).
    rx_poll_wakes,
    /// Non-blocking receives that looked at parked connections and found
    /// nothing (`EAGAIN`: the drain after a wake-up, a busy-poll spin).
    rx_nb_empty,
    /// System calls those made looking (a read of a lone connection or one
    /// a poll saw a datagram on, else one poll over all): about one each.
    rx_nb_empty_looks,
    /// Non-blocking receives on a socket fed by one parked connection and
    /// nothing else, answered by its short path (`Sock::recv_lone`: one
    /// look at the socket, the connection's held datagram or one read),
    /// with a datagram or `EAGAIN`.
    rx_lone,
    /// Looks over a socket's connections for a datagram a poll held
    /// (`Sock::serve_held`, under the socket's lock): none while the
    /// receives that follow each poll serve what it held.
    rx_held_looks,
    /// Datagrams the program's poll read into a connection's buffer and
    /// left there for the next receive call (`Conn::held`): that call
    /// makes no system call for them.
    rx_poll_holds,
    /// Polls of an offloaded socket alone, for input, that took its lone
    /// parked connection over on the fast path (`Sock::poll_alone`): no
    /// claim of every connection, descriptor list or spare blocks.
    rx_poll_alone,
    /// Connections that joined their socket's ready list while parked or
    /// claimed by a receive call, and stayed parked (unwatched, no
    /// `epoll_ctl`) until drained.
    rx_parked_ready,
    /// Receive calls and polls that left a connection parked
    /// (`super::park`): the next receive call takes it over with no
    /// `epoll_ctl`. One that took it over parked leaves it so, uncounted.
    rx_parks,
    /// Parked connections given back to the progress thread (a wait the
    /// library does not drive, a non-blocking receive that found nothing,
    /// or the grace period's end).
    rx_unparks,
    /// `epoll_ctl` calls changing what the progress thread watches on a
    /// connection: the watch handed between receive calls and the progress
    /// thread, a connection joining or leaving the ready list, write
    /// interest. A parked round trip makes none.
    conn_epoll_mods,
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
    /// Destinations whose datagrams are striped over several connections
    /// (`WARPSOCK_STRIPES` > 1), counted where the stripes were opened.
    stripe_groups,
    /// Connections that announced the stripe extension (the acceptor's
    /// hello offered it).
    stripe_ext_sent,
    /// Accepted connections that joined the stripe group of an earlier
    /// connection from the same sender socket.
    stripe_joins,
    /// `_exit`/`_Exit` calls in the process owning the connections that
    /// found datagrams still queued and waited for them (bounded).
    exit_flushes,
    /// `_exit`/`_Exit` calls in a forked or vforked child: no flush.
    exit_child_skips,
}

/// Per-stripe datagram counts (index = the connection's stripe; an
/// unstriped connection is stripe 0).
pub(crate) struct StripeStats {
    pub(crate) tx: [AtomicU64; super::core::frame::MAX_STRIPES],
    pub(crate) rx: [AtomicU64; super::core::frame::MAX_STRIPES],
}

/// The per-stripe counters.
pub(crate) static STRIPES: StripeStats = StripeStats {
    tx: [const { AtomicU64::new(0) }; super::core::frame::MAX_STRIPES],
    rx: [const { AtomicU64::new(0) }; super::core::frame::MAX_STRIPES],
};

/// Counts `n` datagrams on stripe `i`, sent (`tx`) or received.
#[inline]
pub(crate) fn stripe(i: usize, tx: bool, n: u64) {
    let a = if tx { &STRIPES.tx } else { &STRIPES.rx };
    add(&a[i.min(super::core::frame::MAX_STRIPES - 1)], n);
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

/// The library's heap allocations (`alloc` and `realloc` calls), counted
/// in builds with the test hooks only: the tests bound them per round trip
/// (`heap_allocs` in the report).
#[cfg(feature = "test-hooks")]
mod counting {
    use std::alloc::{GlobalAlloc, Layout, System};
    use std::sync::atomic::{AtomicU64, Ordering};

    pub(super) static ALLOCS: AtomicU64 = AtomicU64::new(0);

    struct Counting;

    // SAFETY: every call is forwarded to `System` unchanged.
    unsafe impl GlobalAlloc for Counting {
        unsafe fn alloc(&self, l: Layout) -> *mut u8 {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
            // SAFETY: the caller's contract, forwarded.
            unsafe { System.alloc(l) }
        }
        unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
            // SAFETY: the caller's contract, forwarded.
            unsafe { System.alloc_zeroed(l) }
        }
        unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
            // SAFETY: the caller's contract, forwarded.
            unsafe { System.dealloc(p, l) }
        }
        unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
            // SAFETY: the caller's contract, forwarded.
            unsafe { System.realloc(p, l, n) }
        }
    }

    #[global_allocator]
    static COUNTING: Counting = Counting;
}

/// Connections claimed by receive calls and polls (`Conn::claim`), counted
/// in builds with the test hooks only (`conn_claims` in the report): a
/// non-blocking receive claims none (`Conn::glance`).
#[cfg(feature = "test-hooks")]
pub(crate) static CLAIMS: AtomicU64 = AtomicU64::new(0);

/// The report printed at exit, on stderr. Formatted on the stack and
/// written with the raw system call: no allocation and no lock, so that an
/// exit over a stretch of the library that may hold one (a signal
/// handler's `exit` over a busy send, `ExitOver::Locks`: the linger is
/// skipped there, not the report) prints it as any exit does. A loaded
/// pre-check's `iperf3 -u -R` server, stopped by SIGTERM in one of its
/// sends, printed none (session 34). Whole lines, a few at a time: the
/// handler may run on a small alternate signal stack.
pub(crate) fn print_report() {
    let mut out = ReportOut {
        text: StackText::new(),
    };
    let _ = write_report(&mut out);
    out.flush();
}

/// The report's lines, gathered into whole-line writes of stderr.
struct ReportOut {
    text: StackText<1024>,
}

impl ReportOut {
    /// Appends `line` (a whole line, ending in a newline), writing out what is
    /// gathered first when it does not fit.
    fn line(&mut self, line: &str) {
        if self.text.write_str(line).is_err() {
            self.flush();
            // A line longer than the buffer: written alone.
            if self.text.write_str(line).is_err() {
                write_stderr(line.as_bytes());
            }
        }
    }

    fn flush(&mut self) {
        write_stderr(self.text.as_bytes());
        self.text.len = 0;
    }
}

/// Writes `bytes` whole to stderr by the raw system call (EINTR retried; a
/// failing stderr drops the rest, as `eprint!` would report nothing).
fn write_stderr(mut bytes: &[u8]) {
    while !bytes.is_empty() {
        // SAFETY: `bytes` is a live slice of its length.
        let n = unsafe {
            crate::shim::sys::write_raw(libc::STDERR_FILENO, bytes.as_ptr(), bytes.len())
        };
        if n < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
            continue;
        }
        if n <= 0 {
            return;
        }
        bytes = &bytes[n as usize..];
    }
}

/// The report's text (see [`print_report`]), a line at a time.
fn write_report(out: &mut ReportOut) -> std::fmt::Result {
    let mut one = StackText::<128>::new();
    writeln!(
        one,
        "warpsock udp-offload stats (pid {}):",
        std::process::id()
    )?;
    out.line(one.as_str());
    let mut line = |name: &str, v: u64| {
        let mut one = StackText::<128>::new();
        if writeln!(one, "  {name:<20} {v}").is_ok() {
            out.line(one.as_str());
        }
    };
    // The progress thread's own (`shim::reactor`), after the offload's.
    STATS.for_each(&mut line);
    for (name, v) in crate::shim::reactor::counters() {
        line(name, v);
    }
    #[cfg(feature = "test-hooks")]
    {
        line("heap_allocs", counting::ALLOCS.load(Ordering::Relaxed));
        line("managed_looks", crate::shim::hooks::audit::managed_looks());
        line("conn_claims", CLAIMS.load(Ordering::Relaxed));
    }
    // Per stripe: only stripes that carried something.
    for (dir, a) in [("tx", &STRIPES.tx), ("rx", &STRIPES.rx)] {
        for (i, c) in a.iter().enumerate() {
            let v = c.load(Ordering::Relaxed);
            if v > 0 {
                let mut name = StackText::<32>::new();
                write!(name, "{dir}_stripe{i}_dgrams")?;
                line(name.as_str(), v);
            }
        }
    }
    Ok(())
}

/// Text formatted into a fixed buffer (no allocation); a write that does
/// not fit fails and leaves the text as it was.
struct StackText<const N: usize> {
    buf: [u8; N],
    len: usize,
}

impl<const N: usize> StackText<N> {
    fn new() -> Self {
        Self {
            buf: [0; N],
            len: 0,
        }
    }

    fn as_bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }

    fn as_str(&self) -> &str {
        // Only whole `str`s are ever appended (`write_str`).
        std::str::from_utf8(self.as_bytes()).unwrap_or("")
    }
}

impl<const N: usize> Write for StackText<N> {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        let room = N - self.len;
        if s.len() > room {
            return Err(std::fmt::Error);
        }
        self.buf[self.len..self.len + s.len()].copy_from_slice(s.as_bytes());
        self.len += s.len();
        Ok(())
    }
}
