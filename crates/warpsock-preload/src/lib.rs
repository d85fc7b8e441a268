//! # warpsock-preload: the UDP offload layer
//!
//! `LD_PRELOAD=libwarpsock_preload.so WARPSOCK_UDP_OFFLOAD=1 program …` carries
//! the UDP datagrams of an unmodified program over kernel TCP connections
//! (segmentation and receive offload, large batches, flow control), the way
//! the 2005 "emulated UDP Offload Engine" carried them over a TOE. Without
//! `WARPSOCK_UDP_OFFLOAD=1` the library only passes calls through.
//!
//! ## What happens
//!
//! * **Connection management.** A UDP socket joins the layer when it binds a
//!   port the policy allows, connects to, or sends to, an eligible
//!   destination (default: every unicast IPv4/IPv6 address, every port but
//!   53; multicast, broadcast and sockets with `SO_BROADCAST` stay on the
//!   kernel). The first datagram to a destination opens a TCP connection to
//!   the same host on the same port number (plus `WARPSOCK_TCP_PORT_OFFSET`);
//!   later datagrams reuse it. A socket that binds a port also listens on the
//!   matching TCP port; its receive calls return datagrams from the kernel
//!   UDP socket and from every accepted connection alike, and replies to a
//!   sender travel back over the connection that sender opened.
//! * **Data management.** Datagrams sent while a connection is being set up
//!   are queued. If the peer refuses or cannot be reached, the progress
//!   thread retries with exponential back-off (`WARPSOCK_RETRIES`,
//!   `WARPSOCK_RETRY_MS`), then sends the queued datagrams by kernel UDP and
//!   keeps that destination on kernel UDP for `WARPSOCK_FALLBACK_SECS`, so a
//!   preloaded sender still reaches a plain receiver. A peer that accepts TCP
//!   but does not answer the hello within `WARPSOCK_HELLO_TIMEOUT_MS` is not
//!   warpsock: immediate fallback. Nothing is dropped silently: every path is
//!   counted, and `WARPSOCK_STATS=1` prints the counters on stderr at exit.
//!   At exit, queued datagrams get `WARPSOCK_LINGER_MS` to reach the kernel;
//!   `_exit`/`_Exit` (which skip the exit handlers) give them
//!   `WARPSOCK_EXIT_LINGER_MS` and print the counters, but only in the
//!   process that owns the connections: a forked child has forgotten them
//!   (nothing is sent twice) and a vforked child, which shares the parent's
//!   memory, is recognised by its pid and exits at once.
//! * **Receiving: batches served by the program's own calls.** With
//!   `WARPSOCK_CALLER_RECV` on (default), the progress thread does not read
//!   established connections: on input it puts the connection on the
//!   socket's ready list and rings the doorbell. Receive calls (`recv`,
//!   `recvfrom`, `recvmsg`, `read`, …) read a ready connection in chunks of
//!   up to 256 KiB and copy each datagram from that buffer straight into the
//!   program's buffer (many datagrams per system call, one copy, no
//!   allocation, no thread hand-off), round robin over the ready
//!   connections. A blocking call that finds nothing polls the connections
//!   (at most 16) with the kernel UDP socket and the doorbell itself and
//!   reads the connection it finds readable directly (no ready list, no
//!   doorbell unless more is in hand), so a ping-pong involves no thread
//!   switch on either side. A call that returns a datagram leaves those
//!   connections *parked* for the next receive call (no `epoll_ctl` to hand
//!   them to the progress thread and back: a round trip costs each side a
//!   poll, a read and a send, as with kernel UDP's two calls plus the
//!   poll); `select`, `pselect` and the `epoll_wait` family give parked
//!   connections back before they wait, while a non-blocking receive that
//!   finds nothing leaves them parked (`udp::park`). Why a blocking
//!   receive polls before it reads (one system call more than kernel UDP)
//!   and what a direct read would need is in `udp::recv`. With
//!   `WARPSOCK_BUSY_POLL_US=N` it first spins for up to N µs before it
//!   sleeps (lowest latency, one CPU busy while a receive waits).
//!   `WARPSOCK_CALLER_RECV=0` leaves reading to the progress thread, which
//!   queues datagrams for the calls (the layer's first design). Datagrams of
//!   one connection are delivered in order.
//! * **Out-of-order delivery.** With `WARPSOCK_STRIPES=K` (2..=16) the first
//!   datagram to a destination opens K connections to it, and each datagram
//!   goes over one of them: round-robin, skipping a stripe that still has
//!   datagrams queued in user space (its TCP send buffer is full: slow, or
//!   recovering a lost segment) when another has none, else the least
//!   queued. The receiver delivers whatever arrives first, so a lost segment
//!   stalls only its stripe's share (UDP promises no order); each datagram
//!   travels on exactly one connection, so it arrives exactly once. The
//!   receiver groups the K connections by the stripe extension of their
//!   preamble (below) and stripes its replies over the same group. If some
//!   stripes fail, the others carry the destination; it falls back to kernel
//!   UDP only when none is up. `tx_stripeN_dgrams`/`rx_stripeN_dgrams` count
//!   each stripe's datagrams.
//! * **Readiness.** The descriptor number the program holds is one end of an
//!   AF_UNIX stream socketpair. The progress thread writes a doorbell byte to
//!   the other end when datagrams arrive over TCP or the hidden kernel UDP
//!   socket becomes readable (and again for each arrival on a ready
//!   connection), and receive calls drain the doorbells when nothing is
//!   left. So poll, ppoll, select, pselect and epoll (level and edge
//!   triggered, a wake-up per arrival) work on the program's own descriptor
//!   set, unchanged. Socket options, names and ioctls are
//!   forwarded to the hidden UDP socket.
//! * **Transport control.** Offload connections get `TCP_NODELAY`, the
//!   congestion control `WARPSOCK_TCP_CONGESTION` (default `bbr`; empty keeps
//!   the kernel default; a failure keeps it too and is counted) and, with
//!   `WARPSOCK_PACING_RATE` (bytes/s), `SO_MAX_PACING_RATE`. The program's own
//!   TCP sockets are never touched.
//! * **Sending: batches by construction.** A datagram to an idle connection
//!   is written at once (header and payload in one `sendmsg`) unless the
//!   program is streaming: it sent less than 20 µs before, with no receive
//!   call in between (request and response always go at once). A stream's
//!   datagrams are appended to the connection's buffer, and the sending call
//!   itself writes it once it holds `WARPSOCK_TX_BATCH` bytes (64 KiB: tens
//!   of datagrams per system call); a shorter tail is written by the
//!   progress thread `WARPSOCK_TX_DELAY_US` (200 µs) after its first
//!   datagram, the most batching delays a datagram. Buffers are bounded
//!   (`WARPSOCK_SNDBUF` per connection; a full one makes the sender wait,
//!   or drops after a second without progress, see the trust model).
//! * **The second path: UDP GSO/GRO.** Toward a destination that does not
//!   run the preload (its TCP port refuses, or answers without a hello),
//!   `WARPSOCK_UDP_MODE=auto` (default) sends by kernel UDP with generic
//!   segmentation offload: a stream's datagrams to one destination (equal
//!   sizes, the last may be shorter; at most 64, at most 65,507 bytes) go in
//!   one `sendmsg` with `UDP_SEGMENT`, under the same batching rule, and
//!   the kernel cuts them into ordinary datagrams (the receiver sees plain
//!   UDP). `WARPSOCK_UDP_MODE=gso` takes this path for every destination
//!   (no TCP) and turns `UDP_GRO` on, cutting the coalesced buffers the
//!   kernel then delivers back into datagrams; `tcp` never uses it. A
//!   kernel that refuses GSO makes the socket send one by one.
//!   `tx_gso_dgrams`, `tx_gso_sends`, `rx_gro_buffers` count it.
//!
//! ## Wire format on an offload connection
//!
//! All integers big endian.
//!
//! ```text
//! acceptor → connector, once:  "WSUA" | version (1) | caps (u8) | 2 reserved bytes (0)
//!   if caps & 2 (proof):       nonce (16 random bytes)
//! connector → acceptor, once:  "WSUD" | version (1) | flags (u8) | UDP source port (u16)
//!   if flags & 1 (stripe):     group (u32, ≠ 0) | index (u8) | count (u8, 2..=16) | 2 reserved (0)
//! connector → acceptor, by kernel UDP from the claimed port to the acceptor's UDP port:
//!                              "WSUP" | version (1) | 3 reserved (0) | nonce (16)
//! then both ways, per datagram: length (u32, ≤ 65535; ≤ 65507 from IPv4) | payload
//! control frame:               0x8000_0000 | kind << 16 | length, then payload
//!   kind 1 (acceptor → connector, no payload): the proof was seen
//! ```
//!
//! The acceptor speaks first so a connector never sends a byte to a TCP
//! service that is not warpsock. The preamble names the sender's UDP port:
//! the TCP source port is ephemeral, and the receiver reports
//! (TCP peer address, preamble port) as the datagram's source, but only
//! once that claim is proved (see the trust model). `caps` bit 0 says the
//! acceptor understands the stripe extension; only then does a striped
//! connection set `flags` bit 0 and send it (the K connections of one sender
//! socket to one destination share a random group number and carry indices
//! 0..K). With K = 1, or to an acceptor without the capability, the
//! preamble is the original 8 bytes (flags 0).
//!
//! ## Trust model
//!
//! Anything that can reach a preloaded program's offload listener (the TCP
//! port of each bound UDP port) is untrusted. The layer gives such a peer
//! no more than kernel UDP would: it may send datagrams to the program, and
//! it gets replies to what it sent, nothing else.
//!
//! * **A claimed source is proved before anything is delivered.** The
//!   acceptor's hello carries a fresh random nonce; the connector sends it
//!   back in a proof datagram *by kernel UDP, from the UDP port its preamble
//!   claims*, to the acceptor's UDP port. Only when that datagram arrives
//!   from the connection's TCP peer address and the claimed port does the
//!   connection deliver; so datagrams are reported as coming from
//!   address:port only if they were sent by whoever holds that UDP socket,
//!   exactly what kernel UDP guarantees (an unprivileged process cannot send
//!   from a port another socket holds). A socket connected to a peer hears
//!   the proof only from that peer (the kernel filters it). Proof datagrams
//!   are taken off the hidden UDP socket before the program reads it; while
//!   connections wait for one (and for three seconds after, for re-sent
//!   copies), a 24-byte datagram that looks exactly like a proof is dropped
//!   instead of delivered. Claims of port 0 or an excluded port
//!   (`WARPSOCK_UDP_EXCLUDE_PORTS`) are refused outright, and
//!   `WARPSOCK_UDP_ADDRS` restricts which peers may connect at all.
//! * **Routes adopted from inbound connections carry replies only.** A send
//!   to a destination goes over an accepted connection only after that
//!   connection delivered a datagram from the destination; a fresh
//!   destination always gets its own outbound connection (or kernel UDP), so
//!   no inbound connection can capture traffic meant for a UDP service.
//! * **Everything a peer can drive is bounded.** Accepted connections per
//!   socket (`WARPSOCK_MAX_ACCEPTED`; more are closed at once, their senders
//!   fall back to kernel UDP), of those still unproved
//!   (`WARPSOCK_MAX_PENDING`; a new one closes the oldest), and the time to
//!   send the preamble and proof (`WARPSOCK_PREAMBLE_TIMEOUT_MS`). When the
//!   process runs out of descriptors the listener pauses for 100 ms instead
//!   of spinning. The receive queue charges each datagram its payload plus a
//!   fixed 128 bytes against `WARPSOCK_RCVBUF` and holds at most
//!   `WARPSOCK_RCVQ_DGRAMS` datagrams; beyond that the connections are not
//!   read, so TCP flow control holds the sender back. A datagram longer
//!   than its source's family allows (65,507 bytes over IPv4) closes the
//!   connection. Peers that stop reading cannot block the program's sends
//!   for long either, however many: a blocking send that finds a
//!   connection's buffer full waits for room (back-pressure for a receiver
//!   that keeps reading), but at most until that peer made no progress for
//!   5 s (`tx_stall_drops`), and each socket's sends wait at most 5 s in
//!   all, refilled at 5 s a minute, on peers that made no progress for a
//!   second or sends that waited a second; beyond that a full connection's
//!   datagrams are dropped at once (`tx_stall_budget_drops`), as kernel UDP
//!   drops what it cannot send.
//! * What the layer does not defend: the TCP connection is not encrypted or
//!   authenticated beyond the proof (as UDP is not), and a privileged
//!   process on the peer's host can send from any port there (as with UDP).
//!
//! tests/attacks.rs runs each of these attacks against a preloaded program
//! and checks that it fails, that a legitimate peer is still served, and
//! that memory and CPU stay bounded.
//!
//! ## Configuration
//!
//! | variable | meaning | default |
//! |---|---|---|
//! | `WARPSOCK_UDP_OFFLOAD` | `1` turns the layer on | off |
//! | `WARPSOCK_UDP_PORTS` | ports offloaded, e.g. `5001,9000-9100` | all |
//! | `WARPSOCK_UDP_EXCLUDE_PORTS` | ports never offloaded | `53` |
//! | `WARPSOCK_UDP_ADDRS` | destination prefixes offloaded, e.g. `127.0.0.0/8,::1` | all unicast |
//! | `WARPSOCK_TCP_PORT_OFFSET` | TCP port = UDP port + offset | `0` |
//! | `WARPSOCK_TCP_CONGESTION` | congestion control of offload connections | `bbr` |
//! | `WARPSOCK_PACING_RATE` | `SO_MAX_PACING_RATE` in bytes/s | unset |
//! | `WARPSOCK_RETRIES`, `WARPSOCK_RETRY_MS` | connection retries, first back-off | `3`, `10` |
//! | `WARPSOCK_CONNECT_TIMEOUT_MS`, `WARPSOCK_HELLO_TIMEOUT_MS` | set-up timeouts | `1000`, `500` |
//! | `WARPSOCK_PREAMBLE_TIMEOUT_MS` | an accepted connection's preamble and proof are due within | `3000` |
//! | `WARPSOCK_MAX_ACCEPTED`, `WARPSOCK_MAX_PENDING` | accepted connections per socket, of them unproved | `128`, `16` |
//! | `WARPSOCK_RCVQ_DGRAMS` | datagrams queued per socket at most | `65536` |
//! | `WARPSOCK_FALLBACK_SECS` | how long a destination stays on kernel UDP | `10` |
//! | `WARPSOCK_UDP_MODE` | `tcp`, `gso` or `auto` (above) | `auto` |
//! | `WARPSOCK_TX_BATCH`, `WARPSOCK_TX_DELAY_US` | a stream's batch size, the most a datagram waits for it (`0`: no batching) | 64 KiB, `200` |
//! | `WARPSOCK_SNDBUF`, `WARPSOCK_RCVBUF` | buffer bounds in bytes (the receive bound charges 128 bytes per datagram on top) | 4 MiB, 8 MiB |
//! | `WARPSOCK_LINGER_MS` | exit waits this long for queued datagrams | `2000` |
//! | `WARPSOCK_EXIT_LINGER_MS` | `_exit`/`_Exit` wait this long (owner process only) | `500` |
//! | `WARPSOCK_STRIPES` | connections per destination (out-of-order delivery) | `1` |
//! | `WARPSOCK_CALLER_RECV` | `0`: blocking receives wait for the progress thread | on |
//! | `WARPSOCK_BUSY_POLL_US` | a blocking receive spins this long before sleeping | `0` (off) |
//! | `WARPSOCK_DDP_SOCKETS_MAX` | DDP sockets live at once, lingering closes included (beyond: policy connections stay TCP, an explicit switch fails with `ENOBUFS`) | an eighth of RAM in receive slots, 128..4096 |
//! | `WARPSOCK_STATS` | `1` prints the counters on stderr at exit | off |
//!
//! ## Limits
//!
//! * Calls that bypass libc (raw `syscall`, io_uring) on an offloaded socket
//!   see the AF_UNIX end, not a UDP socket.
//! * A socket that becomes managed (UDP adoption, a DDP switch) or plain
//!   again (after a refused switch) changes which file its descriptor number
//!   names; the program's epoll registrations of the number are carried over
//!   (`shim::epollcarry`) for epoll sets made through `epoll_create` or
//!   `epoll_create1` while `/proc` is mounted. Sets made by a raw system call
//!   or inherited across `exec` keep watching the old file. A swap reads the
//!   known sets' registrations once (linear in their number). A `close` (or
//!   `dup2` over) of a managed number, or of one whose file the library
//!   still holds (a switch's plain outcome), takes the number's
//!   registrations out of the sets the process made
//!   (`shim::epollcarry::before_close`), as the kernel does at a file's
//!   last close; unlike the kernel's, also when the program holds another
//!   number of that file. `close_range` and `closefrom` close the
//!   managed numbers in their range as `close` does
//!   (`interpose/ranges.rs`); the other numbers there, and a stream's
//!   `fclose`, close below the interposer and leave them until the
//!   library's own descriptor of the file closes.
//! * A DDP socket's epoll registrations are followed through the
//!   interposed `epoll_ctl` (`shim::epollwatch`: the program's set watches
//!   the connection itself). A registration made by a raw `epoll_ctl`
//!   system call, sets the process did not make through
//!   `epoll_create`/`epoll_create1`, and every set once the process forked
//!   see DDP sockets through the progress thread's doorbells, as before.
//! * After `fork`, offloaded sockets stay offloaded in the parent; in the
//!   child they become plain kernel UDP sockets (datagrams arriving over TCP
//!   are received by the parent). Before `execve`/`execv`/`execvp`/`execvpe`/
//!   `execveat`/`fexecve` and the variadic `execl`/`execle`/`execlp`
//!   (x86-64: `interpose/execl.rs`) inherited offloaded sockets become
//!   plain kernel UDP sockets; a raw `execve` system call is not
//!   interposed: it neither waits for DDP sockets' bytes nor demotes nor
//!   marks (`posix_spawn`, `system`, `popen` need none: the parent keeps
//!   its sockets). A vforked child
//!   that execs re-points its own descriptors but leaves the (shared) table
//!   and queues to the parent.
//! * stdio: `fdopen` of a managed socket returns a `fopencookie` stream over
//!   the interposed `read`/`write`/`close`; `vdprintf` and (x86-64)
//!   `dprintf` send through the interposed `write` (`interpose/stdio.rs`).
//!   `freopen` of such a stream fails (`EINVAL`; `ENXIO` for a `NULL`
//!   path), the stream closed as glibc's failed `freopen` leaves one.
//!   A socket managed after its `fdopen`, and `stdout` `dup2`ed onto a
//!   managed socket, keep glibc's stream, whose bytes miss the library.
//! * With `WARPSOCK_STRIPES` > 1 datagrams to one destination are delivered
//!   in no particular order even without loss; programs that rely on
//!   loopback's ordering (not a UDP promise) should keep the default. The
//!   reorder depth is bounded by the stripes' buffers only: at unlimited
//!   offered load (buffers full) a datagram can overtake megabytes, and a
//!   program whose end-of-test marker relies on order (iperf 2's final
//!   datagram) may close its socket before the last datagrams of other
//!   stripes arrive (they are then discarded, as kernel UDP would).
//! * `shutdown()` on an offloaded socket is emulated (the hidden kernel
//!   socket keeps sending the offload's own datagrams): `SHUT_WR` makes
//!   sends fail with `EPIPE` but raises no `SIGPIPE`.
//! * In `gso` mode (`UDP_GRO` on) no ancillary data is delivered at all.
//! * Ancillary data (`IP_PKTINFO`, timestamps) is only delivered for
//!   datagrams that arrive by kernel UDP; `recvmmsg`'s timeout is not applied
//!   per entry.
//! * A program that uses one port number for both its own TCP and its UDP
//!   (iperf3: control connection and UDP data on 5201) collides with the
//!   default mapping: the offload listener cannot bind, and the sender's
//!   offload connection reaches the program's TCP listener, which is not
//!   warpsock (fallback to kernel UDP after `WARPSOCK_HELLO_TIMEOUT_MS`).
//!   Give both sides the same `WARPSOCK_TCP_PORT_OFFSET` (any offset whose
//!   TCP port is free), as `scripts/test-preload.sh` does for iperf3 `-u`.
//! * Accepted connections feed the socket that owns the listener; a socket
//!   that connects gives its TCP port back so that a socket bound to the same
//!   port later can listen (the iperf/socat server pattern).
//!
//! ## Structure, and how a new kind of socket plugs in
//!
//! ```text
//!   interpose (the exported symbols: one mark load, then dispatch)
//!       |                    \
//!   udp (a kind: Kind + Socket)   <next kind, e.g. DDP-mode TCP>
//!       |        \
//!   udp::core     shim (fd table, real calls, guard, reactor, doorbell, sys)
//!   (sans-IO)
//! ```
//!
//! * `shim` is the shared infrastructure and imports no kind: the real
//!   calls (`dlsym(RTLD_NEXT)`), the per-thread re-entrancy guard and panic
//!   boundary, the descriptor table (one mark byte per descriptor: managed,
//!   or a candidate of kind *k*; an object per managed descriptor), the
//!   progress thread (epoll + timers driving `Handler`s), the doorbell pair
//!   that makes the program's own poll/select/epoll see a managed socket's
//!   readiness, and small syscall wrappers.
//! * `interpose` holds the exported symbols and the list of kinds
//!   (`interpose::KINDS`). A call on a descriptor whose mark is 0 goes to the
//!   real function after that one relaxed load; a managed descriptor's call
//!   goes to its `Socket` object; a candidate's `bind`, `connect` or
//!   first send asks its kind to adopt it.
//! * `udp` is the UDP offload: `udp::core` is its protocol logic, sans-IO
//!   (connection phases, buffers, routes and policy; time passed in, unit
//!   tests with simulated time), and the rest is the driver that carries
//!   the core's decisions out on sockets.
//!
//! A new kind (say, TCP sockets switched into DDP mode) is a module beside
//! `udp` that:
//! 1. implements `shim::socket::Socket` for its socket object (receive and
//!    send calls are required; names, options and ioctls default to the
//!    hidden kernel socket, `kernel_fd`);
//! 2. implements `shim::socket::Kind`: which `socket()` calls make
//!    candidates (`wants`), when a candidate is adopted (`bound`, `adopt`),
//!    and its exit/exec hooks; adopting means moving the kernel socket to a
//!    private descriptor and making the program's number name a doorbell
//!    end (`shim::doorbell`) or anything else, then `shim::fdtable::insert`;
//! 3. registers its descriptors with the progress thread
//!    (`shim::reactor::get()`, one `Handler` per token) if it needs
//!    background progress or timers;
//! 4. keeps its protocol logic sans-IO in its own `core` module;
//! 5. is appended to `interpose::KINDS`. If it needs a call the layer does
//!    not interpose yet (for instance `setsockopt` on a candidate), that
//!    entry point gains a dispatch to a new `Kind` method with a default
//!    that does nothing, so the other kinds are unaffected.

pub mod interpose;
mod shim;
mod udp;
pub mod xsock;

/// In a child made by `fork`, from its fork handler: the reactor, the AIO
/// requests and the two kinds forget the parent's state (its engine,
/// sockets, closes, lists, workers). One place for the fork handler and the tests that stand in for
/// it, so no kind reaches into the other to do so.
pub(crate) fn kinds_after_fork_child() {
    shim::reactor::forget_after_fork();
    interpose::aio::forget_after_fork();
    xsock::after_fork_child();
    udp::after_fork_child();
}

// The handlers are only referenced from `.init_array`, which unit tests lack.
#[cfg_attr(test, allow(dead_code))]
mod init {
    use crate::interpose::{demote_all, KINDS};
    use crate::shim::{fdtable, real};

    extern "C" fn fork_prepare() {
        // Before anything is counted or held: the switches under way end
        // (they take the table's lock to commit).
        crate::xsock::settle_switches_before_fork();
        crate::xsock::hold_busy_answers_for_fork();
        // Before the copy of the descriptors (`Doorbell::fail`'s check).
        crate::shim::doorbell::fork_begin();
        fdtable::fork_prepare();
    }

    extern "C" fn fork_parent() {
        fdtable::fork_release();
        crate::xsock::after_fork_parent();
        crate::shim::doorbell::fork_end();
        // The child may wait on this process's epoll sets.
        crate::shim::epollwatch::fork_parent();
    }

    extern "C" fn fork_child() {
        // The parent holds every descriptor the child was given.
        crate::shim::doorbell::fork_end_child();
        // The epoll sets' and the stdio streams' lists are kept, their
        // locks start afresh (neither is held across the fork).
        crate::shim::epollcarry::fork_child();
        crate::shim::epollwatch::fork_child();
        crate::interpose::stdio::fork_child();
        crate::interpose::adopting::fork_child();
        fdtable::fork_release_child();
        crate::kinds_after_fork_child();
        demote_all(false);
    }

    extern "C" fn at_exit() {
        // The exiting thread's cancellation, for good: the kinds' exit
        // waits (the DDP sockets' linger, `xsock::linger`: libc's
        // `nanosleep`; the counters' report: `write`) are libc
        // cancellation points, and a thread that calls `exit` with a
        // cancel pending and enabled was unwound from one of them inside
        // this handler (the process aborted: "FATAL: exception not
        // rethrown"). Its cancellation no longer matters: it is ending
        // the process. (Not in `_exit`'s flush nor `exec`'s: a vforked
        // child's thread is its parent's.)
        crate::shim::sys::no_cancel();
        let _ = std::panic::catch_unwind(|| {
            // What the exit runs over, once for the stdio flush and every
            // kind (a sleep's wait given back first); then the library's
            // stdio streams' tails, while their sockets are open
            // (`interpose::stdio`).
            let over = crate::interpose::exit_over();
            crate::interpose::stdio::flush_at_exit(over);
            crate::interpose::exit_kinds(KINDS, over);
        });
    }

    extern "C" fn init() {
        let _ = std::panic::catch_unwind(|| {
            // Resolved now: `_exit` may run in a vforked child, where dlsym
            // (locks, allocation) is not safe.
            real::prepare_exit();
            fdtable::prepare();
            let mut hooks = false;
            for k in KINDS {
                k.loaded();
                hooks |= k.needs_hooks();
            }
            if hooks {
                // SAFETY: registering plain extern "C" handlers that never unwind.
                unsafe {
                    libc::pthread_atfork(Some(fork_prepare), Some(fork_parent), Some(fork_child));
                    libc::atexit(at_exit);
                }
            }
        });
    }

    /// Runs `init` when the library is loaded.
    #[cfg(not(test))]
    #[used]
    #[link_section = ".init_array"]
    static INIT: extern "C" fn() = init;
}
