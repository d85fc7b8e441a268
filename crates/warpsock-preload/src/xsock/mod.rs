//! DDP mode: TCP sockets switched into iWARP, the extended sockets of the
//! RDDP research, as a kind of managed socket on the shared infrastructure
//! (`crate::shim`). The protocol (the in-band switch, the stream and
//! message protocol over RDMAP Sends, sinks, one-sided and asynchronous
//! operations) is the `warpsock-xsock` crate; this module maps calls onto
//! it.
//!
//! | module | what it does |
//! |---|---|
//! | `config` | `WARPSOCK_DDP_PORTS`/`ADDRS` (policy mode), `WARPSOCK_CRC`, timeouts, sizes |
//! | `sock` | a DDP-mode socket: doorbell readiness, the data calls, options, orderly close |
//! | `residue` | a TCP socket whose switch failed after reading the peer's pre-switch bytes |
//! | `budget` | the bound on live DDP sockets (`WARPSOCK_DDP_SOCKETS_MAX`): their receive slots' memory |
//! | `switching` | an accepted connection, or a policy-mode client's, switching on a thread of its own, so neither `accept` nor `connect` waits on the peer |
//! | `plain_peers` | policy mode's memory of servers that did not switch: their next connections stay plain at once |
//! | `linger` | how long an exit waits for the bytes sockets still hold (restarted while they leave) |
//! | `reaper` | the one thread that finishes every close (bytes, end of stream, linger), bounded |
//! | `census` | the exit's closes of the sockets left open, its look at the live sockets' engine backlogs, and their reset |
//! | [`api`] | the extended calls of `warpsock_sockets.h` (`warpsock_riomap`, ...) |
//!
//! How a socket gets here:
//! * `setsockopt(fd, SOL_WARPSOCK, WARPSOCK_DDP_MODE, &one, sizeof one)`
//!   on a connected TCP socket switches it now (both programs do this);
//!   on a listening socket, connections it accepts switch; on a socket not
//!   yet connected, it switches when `connect` succeeds.
//! * Policy mode: with `WARPSOCK_DDP_PORTS` and/or `WARPSOCK_DDP_ADDRS`
//!   set, TCP sockets are candidates from `socket()`, and a connection
//!   whose port (remote port for `connect`, local port for `accept`) and
//!   peer address match switches at connect/accept time, so unmodified
//!   programs run over iWARP. A peer that does not switch leaves the
//!   connection plain TCP within `WARPSOCK_DDP_FALLBACK_MS` (at once if it
//!   sends first), nothing lost; a server that did so is then remembered
//!   a while, its next connections plain at once (`plain_peers`). The connecting end initiates the switch,
//!   so a plain client of a preloaded server never gets an urgent byte; a
//!   preloaded client sends a plain server one, invisible to its reads.

pub mod api;
mod budget;
mod census;
pub(crate) mod config;
mod exit;
mod follow;
mod optval;
mod pending;
pub(crate) use optval::{int_arg, put_bytes, put_int, put_int_as};
pub(crate) use pending::note_sndbuf;
use pending::{inode, listeners_sndbuf, pending, set_pending};
mod linger;
mod plain_peers;
mod reaper;
mod residue;
pub(crate) mod sock;
mod switching;
#[cfg(test)]
mod test_pair;

use std::net::SocketAddr;
use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use libc::{c_int, c_void, socklen_t};
use warpsock_xsock::io::{switch_fd_declinable, Commit, Failure, Options, XSocket};
use warpsock_xsock::switch::SwitchError;
use warpsock_xsock::Role;

use crate::shim::socket::{Adoption, Kind, SockOpt, Socket};
use crate::shim::sys::{self, set_errno};
use crate::shim::{fdtable, real};
use residue::ResidueSock;
use sock::{DdpSock, Kept};

/// The option level of DDP mode (`warpsock_sockets.h`). Linux socket
/// option levels are protocol numbers (below 256) or `SOL_*` constants
/// below 300; this one is far above any of them.
pub const SOL_WARPSOCK: c_int = 0x5753_0000;
/// Option levels from here on belong to a kind ([`Kind::plain_sockopt`]).
pub(crate) const FIRST_OWN_LEVEL: c_int = SOL_WARPSOCK;
/// `int`: 1 switches into DDP mode (read: the mode).
pub const WARPSOCK_DDP_MODE: c_int = 1;
/// `int`: 1 message mode, 0 stream mode.
pub const WARPSOCK_MSG_MODE: c_int = 2;
/// `int`, read only: whether MPA CRC32c is on.
pub const WARPSOCK_CRC: c_int = 3;

/// Feature marker: this library carries DDP mode and its policy mode
/// (`WARPSOCK_DDP_PORTS`/`ADDRS`). Programs probe for it with
/// `dlsym(RTLD_DEFAULT, "warpsock_feature_ddp_ports")` (the benchmark's
/// apps suite does, for its `ddp-socket` rows); its value means nothing.
#[cfg_attr(not(test), export_name = "warpsock_feature_ddp_ports")]
#[used]
pub static FEATURE_DDP_PORTS: u8 = 1;

/// This kind's place in `interpose::KINDS` (1-based), for candidate marks.
const KIND: usize = 2;

/// The DDP-mode kind.
pub(crate) struct Ddp;

/// The DDP-mode kind, as the interposition layer lists it.
pub(crate) static DDP: Ddp = Ddp;

/// Connections switched into DDP mode.
static SWITCHED: AtomicU64 = AtomicU64::new(0);
/// Switch attempts that left the connection plain TCP (peer without
/// warpsock, or not switching: policy fallbacks included).
static REFUSED: AtomicU64 = AtomicU64::new(0);
/// Switch attempts that failed after committing (connection reset).
static BROKEN: AtomicU64 = AtomicU64::new(0);

/// The `WARPSOCK_STATS=1` lines of DDP mode.
fn report() -> String {
    let c = warpsock_xsock::io::counters();
    let v = |a: &AtomicU64| a.load(Ordering::Relaxed);
    let s = format!(
        "ddp_switched {}\nddp_refused {}\nddp_broken {}\nddp_rx_bytes {}\nddp_rx_copied {}\nddp_rx_placed {}\nddp_tx_bytes {}\nddp_tx_msgs {}\nddp_tx_copied {}\nddp_bg_rounds {}\nddp_poll_rounds {}\nddp_watch_changes {}\nddp_bells {}\nddp_sink_offers {}\nddp_stand_lapses {}\nddp_closes_cut {}\nddp_switch_bg {}\nddp_switch_over {}\nddp_switch_peer_over {}\nddp_switch_busy {}\nddp_plain_remembered {}\nddp_budget_over {}\nddp_accept_declined {}\nddp_accept_holds_lapsed {}\nddp_switch_no_fds {}\nddp_epoll_direct {}\nddp_rx_looks {}\nddp_rounds_owed {}\nddp_tx_buffered {}\n",
        v(&SWITCHED),
        v(&REFUSED),
        v(&BROKEN),
        v(&c.rx_bytes),
        v(&c.rx_copied),
        v(&c.rx_placed),
        v(&c.tx_bytes),
        v(&c.tx_msgs),
        v(&c.tx_copied),
        v(&c.bg_rounds),
        v(&c.poll_rounds),
        v(&c.watch_changes),
        v(&sock::BELLS),
        v(&c.sink_offers),
        v(&c.stand_lapses),
        v(&reaper::CUT),
        v(&switching::STARTED),
        v(&switching::OVER),
        v(&switching::PEER_OVER),
        v(&switching::BUSY_ANSWERED),
        v(&plain_peers::REMEMBERED),
        v(&budget::OVER),
        v(&switching::DECLINES),
        v(&switching::HOLDS_LAPSED),
        v(&NO_DESCRIPTORS),
        v(&crate::shim::epollwatch::REPORTED),
        v(&c.rx_looks),
        v(&c.rounds_owed),
        warpsock_xsock::io::posted_bytes(),
    );
    #[cfg(feature = "test-hooks")]
    let s = s + &format!(
        "ddp_quiet_eagains {}\nddp_busy_quiet {}\n",
        v(&sock::QUIET_EAGAINS),
        v(&sock::BUSY_QUIET)
    );
    s
}

/// In a child made by `fork` (its fork handler, the only thread): the
/// send buffers' bookkeeping and the closes under way are the parent's
/// (review r21-send #8): the child's exit waits for its own bytes only.
pub(crate) fn after_fork_child() {
    // A child forked while the parent's exit closed its sockets is not
    // exiting (its sends must not park for good; review r25-c item 2).
    sock::close::EXITING.store(0, Ordering::Release);
    linger::forget_closing_after_fork();
    sock::close::forget_own_after_fork();
    reaper::forget_after_fork();
    warpsock_xsock::io::forget_after_fork();
    census::forget_armed_after_fork();
    sock::forget_after_fork();
    switching::forget_after_fork();
    budget::forget_after_fork();
}

/// Before a `fork`: the background switches end first
/// ([`switching::settle_before_fork`]), for at most the longest a switch
/// waits on its peer, and a second for its engine's exchange.
pub(crate) fn settle_switches_before_fork() {
    // Nothing read (no allocation: a signal handler's fork) with none.
    if !switching::under_way() {
        return;
    }
    let cfg = config::get();
    let longest = [&cfg.request, &cfg.policy]
        .iter()
        .map(|o| o.limits.mark_timeout + o.limits.request_timeout)
        .max()
        .unwrap_or_default();
    switching::settle_before_fork(longest + std::time::Duration::from_secs(1));
}

/// Before a `fork`, after [`settle_switches_before_fork`]: a busy answer's
/// duplicate of the program's connection being made is recorded first,
/// and none is made until [`after_fork_parent`] (the child closes the
/// copy it gets: `switching::late_busy`). Async-signal-safe.
pub(crate) fn hold_busy_answers_for_fork() {
    switching::hold_answers_for_fork();
}

/// After a `fork`, in the parent: what [`hold_busy_answers_for_fork`]
/// held goes on.
pub(crate) fn after_fork_parent() {
    switching::release_answers_after_fork();
}

/// Whether accepted connections are switching in the background now (a
/// `select` then looks for numbers still switching among its own:
/// `interpose::wait::select`).
pub(crate) fn switches_under_way() -> bool {
    switching::under_way()
}

fn is_tcp(fd: c_int) -> bool {
    let dom = sys::get_int(fd, libc::SOL_SOCKET, libc::SO_DOMAIN);
    let ty = sys::get_int(fd, libc::SOL_SOCKET, libc::SO_TYPE);
    let proto = sys::get_int(fd, libc::SOL_SOCKET, libc::SO_PROTOCOL);
    matches!(dom, Some(libc::AF_INET | libc::AF_INET6))
        && ty == Some(libc::SOCK_STREAM)
        && proto == Some(libc::IPPROTO_TCP)
}

/// Where a switch's outcome goes: the program's descriptor number and the
/// kernel socket the switch runs on — `fd` itself for a switch made inside
/// the program's call, or the private duplicate of a connection switching
/// in the background ([`switching`]), whose numbers take the outcome.
#[derive(Clone, Copy)]
pub(crate) struct At<'a> {
    /// The program's descriptor number.
    pub(crate) fd: c_int,
    /// The connection's kernel socket.
    pub(crate) kernel: c_int,
    /// The switching socket whose numbers take the outcome.
    from: Option<&'a switching::SwitchingSock>,
}

impl At<'_> {
    /// The program's own socket `fd`, switched inside its call.
    pub(crate) fn own(fd: c_int) -> Self {
        Self {
            fd,
            kernel: fd,
            from: None,
        }
    }

    /// Makes the program's descriptor number(s) name `target` (an end of
    /// ours) and `sock`, keeping close-on-exec and epoll registrations.
    pub(crate) fn install(&self, target: c_int, sock: Arc<dyn Socket>) -> Result<(), c_int> {
        match self.from {
            None => fdtable::swap_in(self.fd, target, sock),
            Some(sw) => sw.install(target, Some(sock)),
        }
    }

    /// The program's file status flags for the outcome: `fl`, read from
    /// the kernel socket before the switch, with the `O_NONBLOCK` the
    /// program set on a switching socket meanwhile.
    fn file_flags(&self, fl: c_int) -> c_int {
        match self.from {
            Some(sw) if sw.nonblocking() => fl | libc::O_NONBLOCK,
            Some(_) => fl & !libc::O_NONBLOCK,
            None => fl,
        }
    }
}

/// Switches connected socket `fd` with `opts`; on success it is a managed
/// DDP socket, on failure it stays (or is made, to deliver the residue) a
/// TCP socket. `connect`: the adopting `connect` is still to return
/// (`Some(errno)` to return on failure). Returns the errno of a failure.
fn switch(
    fd: c_int,
    opts: &Options,
    msg_mode: bool,
    connect: Option<c_int>,
    role: Option<Role>,
) -> Result<(), c_int> {
    // Beyond the budget of DDP sockets: refused before anything is noted
    // or sent (not the one try), the connection plain TCP (`budget`).
    let place = budget::admit().ok_or(libc::ENOBUFS)?;
    let sndbuf = prepare(fd)?;
    switch_at(At::own(fd), opts, (msg_mode, connect, role, sndbuf), place)
}

/// What a switch is about to begin on `fd` checks and notes (its one try):
/// refused here, the connection stays plain TCP with nothing sent.
/// Returns the `SO_SNDBUF` noted for it.
fn prepare(fd: c_int) -> Result<Option<usize>, c_int> {
    // The process that makes the switch.
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() };
    // A vforked child (a `clone(CLONE_VM)` task) of a process whose
    // sockets it sees: its switch would change its parent's memory (the
    // census's owner: the parent's own closes were then leaked with no
    // end of stream; the table; the engine). Refused before anything is
    // noted or sent: the socket stays plain TCP (review r29-c item 3).
    if sock::borrows_memory(pid) {
        return Err(libc::EOPNOTSUPP);
    }
    let mut p = pending(fd);
    if p.tried {
        return Err(libc::EALREADY);
    }
    if urgent_inline(fd) {
        // The switch's marks are urgent bytes, which such a socket reads
        // in its stream (an accepted connection's is answered busy in
        // `switching::start`): declined as `SO_ZEROCOPY` below, nothing
        // sent (helper 66's review).
        REFUSED.fetch_add(1, Ordering::Relaxed);
        return Err(libc::EOPNOTSUPP);
    }
    if sys::get_int(fd, libc::SOL_SOCKET, libc::SO_ZEROCOPY).is_some_and(|v| v != 0) {
        // Its `MSG_ZEROCOPY` sends would wait for notices only TCP makes
        // (`Kept`, review r23-a item 1): declined before the handshake, as
        // by a peer without the library (policy mode: the connection stays
        // TCP; an explicit switch fails, the connection plain).
        REFUSED.fetch_add(1, Ordering::Relaxed);
        return Err(libc::EOPNOTSUPP);
    }
    // Where the library's descriptors go, from the limit now (a program
    // may have raised it since the last switch: `warpsock_engine::fds`).
    warpsock_engine::fds::set_floor_from_limit();
    // The process's dead ends first (a forked child's copy of this
    // switch becomes one: `sock::refuse_forked_switch`), then room for
    // the switch's own.
    sock::dead_ends_made()?;
    if !sys::descriptors_free(fd, SWITCH_DESCRIPTORS) {
        // Near `RLIMIT_NOFILE`: the switch would run out of descriptors
        // after it committed, which resets the connection (a server at
        // its limit reset its next client; session 39). Declined before
        // the handshake instead, not noted as the one try (the program
        // may free some and ask again): policy mode leaves the connection
        // plain TCP, an explicit switch fails with `EMFILE`.
        REFUSED.fetch_add(1, Ordering::Relaxed);
        NO_DESCRIPTORS.fetch_add(1, Ordering::Relaxed);
        return Err(libc::EMFILE);
    }
    p.tried = true;
    p.ddp = false;
    set_pending(fd, p);
    Ok(p.sndbuf)
}

/// Whether `fd` reads urgent bytes in its stream (`SO_OOBINLINE`): no
/// switch on it (`prepare`, `switching::start`).
fn urgent_inline(fd: c_int) -> bool {
    sys::get_int(fd, libc::SOL_SOCKET, libc::SO_OOBINLINE).is_some_and(|v| v != 0)
}

/// The most descriptors a switch takes: its switching socket's 4
/// (`switching::start`: the TCP socket's duplicate, a doorbell pair, the
/// end's eventfd) and what it takes once it answers
/// ([`ANSWER_DESCRIPTORS`]). A DDP connection keeps 5 (`README.md`).
const SWITCH_DESCRIPTORS: usize = 4 + ANSWER_DESCRIPTORS;

/// The most a switch still takes when it answers the peer: the engine's
/// (the queue pair's duplicate of the socket, the context's epoll set; a
/// caller-driven context makes no wake eventfd, and its completion queue
/// none: `Cq::notify_fd` is never called) and the DDP socket's (its
/// doorbell pair; it uses the engine's duplicate) — 6 for a process's first
/// DDP socket, whose progress thread's own come too (a policy-mode
/// server at its limit, when the engine still made both eventfds: 9 free
/// at the answer switched, 8 reset the client; session 39) — and four to
/// spare.
const ANSWER_DESCRIPTORS: usize = 10;

/// What a connection a switch left plain takes when the peer's bytes read
/// before its mark go first (`ResidueSock`: a duplicate of the socket and
/// a doorbell pair).
const RESIDUE_DESCRIPTORS: usize = 3;

/// Switches declined for want of descriptors (`ddp_switch_no_fds`).
static NO_DESCRIPTORS: AtomicU64 = AtomicU64::new(0);

/// Whether a switch on `fd` declines at its last look before it commits:
/// fewer than [`ANSWER_DESCRIPTORS`] numbers are free and `may()` allows
/// declining (counted in [`NO_DESCRIPTORS`]).
fn short_to_answer(fd: c_int, may: impl FnOnce() -> bool) -> bool {
    let short = !sys::descriptors_free(fd, ANSWER_DESCRIPTORS) && may();
    if short {
        NO_DESCRIPTORS.fetch_add(1, Ordering::Relaxed);
    }
    short
}

/// What the program asked of a switch: the message mode, the adopting
/// `connect`'s errno, the role, the noted `SO_SNDBUF`.
type Asked = (bool, Option<c_int>, Option<Role>, Option<usize>);

/// The switch of the connection at `at`, [`prepare`]d, with its `place`
/// in the budget of DDP sockets: kept by the DDP socket it makes (given
/// back when its slot memory goes), dropped if it fails.
fn switch_at(at: At<'_>, opts: &Options, asked: Asked, place: budget::Place) -> Result<(), c_int> {
    let (msg_mode, connect, role, sndbuf) = asked;
    let fd = at.kernel;
    // The whole switch with this thread's cancellation disabled (put back
    // as it returns): a cancel that comes meanwhile stays pending, acted
    // on by the entry point if its call fails, else at the thread's next
    // cancellation point (README: the switch is none). Its waits and
    // system calls are raw, but the failure paths drop std's and the
    // engine's descriptors (`TcpStream`, `OwnedFd`: libc's `close`, a
    // cancellation point), where a pending cancel unwound from inside the
    // library and the process aborted ("FATAL: exception not rethrown";
    // review r25-a item 3).
    let _cancel_off = sys::CancelOff::new();
    // The process that makes the switch: a signal handler's `fork` during
    // it makes a child that returns into it (below).
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() };
    let timeouts = (
        sys::get_timeo(fd, libc::SO_RCVTIMEO),
        sys::get_timeo(fd, libc::SO_SNDTIMEO),
    );
    // The program's file status flags, before the switch: the engine puts
    // the kernel socket in blocking mode for its own reads (a waiting
    // queue pair sleeps in a `recv` with a timeout), and the program's
    // descriptor shares that open file description. The program's
    // `O_NONBLOCK` lives on in the managed socket's own flag, or is put
    // back if the switch fails.
    // SAFETY: fcntl on the program's open socket.
    let fl = unsafe { real::fcntl(fd, libc::F_GETFL, 0) };
    if fl < 0 {
        return Err(sys::errno());
    }
    // The program's low-water mark, stamps and error reports move into the
    // managed socket, off the kernel socket, which the engine reads (the
    // same kernel socket): its blocking reads waited for the mark (the MPA
    // reply's read timed out: the switch failed) and its readiness checks
    // (poll, epoll, the quiet spin's ppoll) reported nothing below it
    // (review r22-c item 1); stamps filled its error queue, charged to its
    // receive space (r22-e item 2). Put back if the switch fails. Taken
    // after the last early return (r22-e item 8: one before it left the
    // mark at 1).
    let kept = Kept::take(fd);
    // SAFETY: `fd` is open for the whole call: the program's socket in
    // its call, or a switching socket's own duplicate.
    let b = unsafe { BorrowedFd::borrow_raw(fd) };
    // A background switch of policy mode holds its answer to the client's
    // Request until the program uses the connection, and is declined if
    // the process forks first (`switching::slot::hold`): an unmodified
    // forking server's child can serve the plain connection. A listener
    // the program set to DDP mode asked for DDP: its switches end as they
    // would (a DDP socket's copy in a child is refused).
    // Before it answers, it looks again for the descriptors it still
    // needs (`ANSWER_DESCRIPTORS`): switches held at once each took their
    // switching socket's at the start, and one that answered before may
    // have taken the rest (review 40 item 4) — declined, the connection
    // plain, rather than reset after the answer. One switch answers at a
    // time (`AnswerTurn`, held until this function returns: the DDP socket
    // made, or the switch over): two let go at once both found room for
    // one, and one of them ran out after its answer.
    // An initiator looks again before its Request, an explicit responder
    // before its answer, for the same reason (the program or other
    // switches may have taken the numbers since the start): the switch
    // withdrawn or declined with `EMFILE`, the connection plain, rather
    // than reset after it. (They do not take turns.)
    let turn: std::cell::Cell<Option<switching::AnswerTurn>> = std::cell::Cell::new(None);
    // Withdrawn or declined, the connection goes on plain — through a
    // residue socket if the peer's bytes before its mark were read; with
    // too few numbers even for that it commits as before (a reset is
    // loud, a lost residue would not be).
    let short = || short_to_answer(fd, || sys::descriptors_free(fd, RESIDUE_DESCRIPTORS));
    let decline = |point: Commit| match point {
        Commit::Request => short().then_some(SwitchError::Withdrawn),
        Commit::Answer if opts.limits.at_start => at.from.and_then(|s| {
            if s.hold_declined(config::get().accept_hold) {
                return Some(SwitchError::Declined);
            }
            // Taken once (a second look would wait on itself).
            let held = turn.take().unwrap_or_else(switching::AnswerTurn::take);
            turn.set(Some(held));
            short_to_answer(at.kernel, || true).then_some(SwitchError::NoDescriptors)
        }),
        // Helper 73 item 4: an explicit responder answered, ran out, reset.
        Commit::Answer => short().then_some(SwitchError::NoDescriptors),
    };
    let r = switch_fd_declinable(b, opts, role, &decline);
    // A policy-mode client's switch (its role given; an explicit switch
    // takes its role from the addresses) that saw no mark from its server:
    // the next connections to it stay plain at once, unless the server
    // switched one lately (`plain_peers`).
    if opts.limits.at_start && role == Some(Role::Initiator) {
        match &r {
            Err(Failure::Refused {
                error: SwitchError::NoPeer { .. },
                ..
            }) => {
                if let Some(server) = sys::peer_addr(fd) {
                    plain_peers::timed_out(server);
                }
            }
            Ok(x) => plain_peers::switched(x.peer_addr()),
            Err(_) => {}
        }
    }
    #[cfg(test)]
    sock::forked::hook(&sock::forked::AFTER_HANDSHAKE);
    // What follows commits the switch (or its failure) to the connection,
    // with asynchronous signals blocked: a handler's `fork` comes before
    // it or after. One that came before (in the handshake's waits: the
    // child returns into them) makes a child whose connection is its
    // parent's, which commits the switch — a DDP socket of the child's on
    // it (its calls and its own engine's progress thread took the parent's
    // frames from the shared socket), or, on a failure, a reset, a
    // shutdown and a change of the shared file's flags (the parent's
    // connection broken; issue 12). Such a child makes nothing of it: its
    // descriptor is refused as the fork handlers refuse its copies of
    // the parent's DDP sockets ([`sock::refuse_forked_switch`]). A
    // vforked child (no fork handler; the parent's engine) is not one.
    // Before, a fork inside `DdpSock::transpose` also made the child
    // register the connection in the parent's epoll set (shared with the
    // child): the second registration failed (`EEXIST`), and whichever
    // process's it was reset the connection.
    sys::with_async_signals_blocked(|| {
        #[cfg(test)]
        sock::forked::hook(&sock::forked::IN_COMMIT);
        if sock::close::forked_child(pid) {
            return Err(sock::refuse_forked_switch(
                at.fd,
                r,
                fl & libc::O_NONBLOCK != 0,
            ));
        }
        commit(
            at,
            r,
            (sndbuf, msg_mode, connect, timeouts, kept, fl),
            place,
        )
    })
}

/// The program's state [`switch`] commits with: the noted `SO_SNDBUF`,
/// the message mode, the adopting `connect`'s errno, the timeouts, the
/// options kept, the file status flags before the switch.
type Noted = (
    Option<usize>,
    bool,
    Option<c_int>,
    (Option<std::time::Duration>, Option<std::time::Duration>),
    Kept,
    c_int,
);

/// [`switch`]'s outcome `r` committed to the program's socket at `at`:
/// the DDP socket, or the failure's.
fn commit(
    at: At<'_>,
    r: Result<XSocket, Failure>,
    noted: Noted,
    place: budget::Place,
) -> Result<(), c_int> {
    let (sndbuf, msg_mode, connect, timeouts, kept, fl) = noted;
    let fl = at.file_flags(fl);
    let fd = at.kernel;
    match r {
        Ok(mut x) => {
            // Given back when the socket's slot memory is unmapped,
            // whichever close drops it (`budget`).
            x.keep_until_dropped(Box::new(place));
            if let Some(b) = sndbuf {
                x.set_sndbuf(b);
            }
            let nonblocking = fl & libc::O_NONBLOCK != 0;
            let pending = connect.is_some();
            // Counted before `transpose` publishes the outcome: a program
            // that sees it (a background switch's `getsockopt`) and exits
            // at once reads it in its exit report (the count came after,
            // and `ddp_sndbuf`'s `before` case read 1 of 2 under load).
            SWITCHED.fetch_add(1, Ordering::Relaxed);
            match DdpSock::transpose(at, x, msg_mode, pending, timeouts, kept, nonblocking) {
                Ok(_) => Ok(()),
                Err(e) => {
                    SWITCHED.fetch_sub(1, Ordering::Relaxed);
                    // Switched, then reset (`DdpSock::transpose`: the
                    // peer runs DDP on it; review r23-a item 3), as a
                    // switch that breaks after it committed: the call
                    // fails with the cause (`EMFILE`); the program's
                    // descriptor, its TCP socket again, reads as one the
                    // peer reset — `ECONNRESET` once (the reset's
                    // `sk_err`), then end of stream (shut both ways, as
                    // `tcp_reset` leaves it: the call fails with
                    // `ENOTCONN` and shuts it all the same). Policy mode's
                    // `connect` succeeds: a reset just after it, as from a
                    // server that dropped the connection.
                    // SAFETY: fcntl and shutdown on the program's socket.
                    unsafe {
                        real::fcntl(fd, libc::F_SETFL, fl as usize);
                        real::shutdown(fd, libc::SHUT_RDWR);
                    }
                    BROKEN.fetch_add(1, Ordering::Relaxed);
                    Err(e)
                }
            }
        }
        Err(f) => {
            // SAFETY: as above.
            unsafe { real::fcntl(fd, libc::F_SETFL, fl as usize) };
            kept.put_back(fd);
            let errno = f.errno();
            let counter = match f {
                Failure::Refused { .. } => &REFUSED,
                Failure::Broken { .. } => &BROKEN,
            };
            counter.fetch_add(1, Ordering::Relaxed);
            if let Failure::Refused { residue, watch, .. } = f {
                ResidueSock::transpose(at, residue, watch, connect)?;
            }
            Err(errno)
        }
    }
}

impl Kind for Ddp {
    fn enabled(&self) -> bool {
        true
    }

    fn wants(&self, domain: c_int, ty: c_int, protocol: c_int) -> bool {
        config::get().policy_on()
            && (domain == libc::AF_INET || domain == libc::AF_INET6)
            && ty & 0xf == libc::SOCK_STREAM
            && (protocol == 0 || protocol == libc::IPPROTO_TCP)
    }

    fn bound(&self, _fd: c_int, _addr: SocketAddr) {}

    fn finish_connect(&self, fd: c_int, dest: Option<SocketAddr>) -> bool {
        let p = pending(fd);
        let wanted = p.ddp || config::get().policy_on();
        if !wanted || !is_tcp(fd) {
            return false;
        }
        // A remembered plain server's connection is no candidate: nothing
        // to finish, the program's non-blocking connect stays its own
        // (`plain_peers`).
        let cfg = config::get();
        if !p.ddp && dest.is_some_and(|d| cfg.matches(d.port(), d) && plain_peers::remembered(d)) {
            fdtable::set_candidate(fd, 0);
            return false;
        }
        // Finish the connection now, so the switch can begin from this
        // call (in the background in policy mode; a non-blocking connect
        // may succeed at once).
        let mut pf = [libc::pollfd {
            fd,
            events: libc::POLLOUT,
            revents: 0,
        }];
        // Raw (`sys::poll`, no cancellation point inside the library): the
        // signal of a cancel this thread does not act on now is no reason
        // to stop; a pending cancel ends the wait (`EINTR`) and the
        // interposed `connect` acts on it. One deadline for the whole
        // wait: each such signal resumed it with the full timeout again
        // (review r25-a item 10).
        let deadline = std::time::Instant::now().checked_add(config::get().connect_timeout);
        let n = loop {
            let left = deadline.map_or(std::time::Duration::MAX, |d| {
                d.saturating_duration_since(std::time::Instant::now())
            });
            let ms = left.as_nanos().div_ceil(1_000_000).min(i32::MAX as u128) as c_int;
            let n = sys::poll(&mut pf, ms);
            if n < 0 && sys::errno() == libc::EINTR && !sys::signal_ends_call() {
                continue;
            }
            break n;
        };
        if n == 0 {
            // Still in progress: the non-blocking connect's own errno (an
            // ignored signal's EINTR, left by an earlier poll, was
            // returned instead: Linux's non-blocking connect never fails
            // with it).
            set_errno(libc::EINPROGRESS);
        }
        if n <= 0 {
            return false;
        }
        let err = sys::get_int(fd, libc::SOL_SOCKET, libc::SO_ERROR).unwrap_or(-1);
        if err != 0 {
            if err > 0 {
                set_errno(err);
            }
            return false;
        }
        sys::peer_addr(fd).is_some_and(|d| p.ddp || config::get().matches(d.port(), d))
    }

    fn adopt(&self, fd: c_int, dest: SocketAddr) -> Adoption {
        let p = pending(fd);
        let cfg = config::get();
        let (opts, connect_err, role) = if p.ddp {
            (&cfg.request, libc::ECONNREFUSED, None)
        } else if cfg.matches(dest.port(), dest) {
            // A server that let a switch time out lately stays plain at
            // once (`plain_peers`): no mark, no fallback wait.
            if plain_peers::remembered(dest) {
                return Adoption::Never;
            }
            // Policy mode: a peer that does not switch leaves a working
            // TCP connection and connect succeeds. The connecting end
            // initiates (see `switch_fd_as`), in the background as an
            // accepted connection's responder does (`switching`): the
            // `connect` returns at once, as TCP's does once the kernel
            // queued the connection, and the program's first call that
            // needs the outcome waits for it (a non-blocking one fails
            // with `EAGAIN`; the descriptor becomes writable at the end).
            // A client that connects several times before it uses any
            // connection, to a server that accepts the next only after
            // reading the last (iperf 2's `-P`), got the first in DDP mode
            // and the others in TCP after the fallback each; an event
            // loop's connect stalled its other connections for the switch.
            // In this call instead: with no place free for it (or no
            // thread: then `prepare` noted the try, and the connection
            // stays plain), or on a socket not connected yet (a
            // `sendto` with an address, `MSG_FASTOPEN`, adopted it).
            if sys::peer_addr(fd).is_some() {
                match switching::start(
                    fd,
                    &cfg.policy,
                    p.msg_mode,
                    (Some(Role::Initiator), true),
                    prepare,
                ) {
                    // The switching socket itself, which answers the
                    // adopting `connect`: the table may name the outcome
                    // already.
                    Ok(s) => return Adoption::Adopted(s),
                    Err(libc::EAGAIN) => {}
                    Err(_) => return Adoption::Never,
                }
            }
            (&cfg.policy, 0, Some(Role::Initiator))
        } else {
            return Adoption::NotThis;
        };
        let r = switch(fd, opts, p.msg_mode, Some(connect_err), role);
        match (r, fdtable::get(fd)) {
            (_, Some(s)) => Adoption::Adopted(s),
            (Ok(()), None) => Adoption::Never,
            (Err(e), None) => {
                if connect_err != 0 {
                    // An explicit request failed: say so (the connection
                    // itself is up and plain).
                    set_errno(e);
                }
                Adoption::Never
            }
        }
    }

    fn accepted(&self, listener: c_int, fd: c_int) {
        let p = pending(listener);
        if let Some(b) = p.sndbuf {
            // Inherited from the listener, as the kernel's `sk_sndbuf` is:
            // a switch now or later (the program's) carries it.
            let mut q = pending(fd);
            q.sndbuf.get_or_insert(b);
            set_pending(fd, q);
        }
        let cfg = config::get();
        let (opts, role) = if p.ddp {
            (&cfg.accepted, None)
        } else {
            let (Some(local), Some(peer)) = (sys::local_addr(fd), sys::peer_addr(fd)) else {
                return;
            };
            if !cfg.matches(local.port(), peer) {
                return;
            }
            // Policy mode: the accepting end responds, so a client without
            // warpsock never gets an urgent byte from us.
            (&cfg.policy, Some(Role::Responder))
        };
        // In the background (`switching`): the switch waits on the peer,
        // and `accept` must not. With no room for it, the connection stays
        // plain TCP (the peer falls back), its switch not tried.
        let _ = switching::start(fd, opts, p.msg_mode, (role, false), prepare);
    }

    fn plain_sockopt(&self, fd: c_int, level: c_int, op: SockOpt) -> Option<c_int> {
        if level != SOL_WARPSOCK {
            return None;
        }
        Some(match op {
            SockOpt::Get(name, val, len) => {
                let p = pending(fd);
                match name {
                    WARPSOCK_DDP_MODE | WARPSOCK_CRC => put_int(val, len, 0),
                    WARPSOCK_MSG_MODE => put_int(val, len, c_int::from(p.msg_mode)),
                    _ => {
                        set_errno(libc::ENOPROTOOPT);
                        -1
                    }
                }
            }
            SockOpt::Set(name, val, len) => set_plain(fd, name, val, len),
        })
    }

    fn before_wait(&self) {
        // An `epoll_wait` or `select` sees the connections through their
        // numbers alone: an event loop's, right after it registered the
        // connection it accepted, is that connection's first use.
        switching::used_all();
        sock::doorbell_wait(true);
    }

    fn before_epoll_wait(&self) {
        switching::used_all();
        // The sets watch the connections themselves (`shim::epollwatch`)
        // unless that is off or cannot be relied on in this process.
        sock::doorbell_wait(!config::get().epoll_direct || crate::shim::epollwatch::fallback());
    }

    fn before_exec(&self) {
        let counted = census::exec_begins();
        if !linger::linger(config::get().linger, census::engine_backlogs) && counted {
            // Given up: reset by the exec's close, not now (it may fail).
            census::arm_exec_reset();
            #[cfg(feature = "test-hooks")]
            crate::shim::hooks::exec_armed();
        }
    }

    fn exec_failed(&self) {
        census::exec_failed();
    }

    fn at_exit(&self, over: crate::shim::guard::ExitOver) {
        exit::at_exit(over);
    }

    fn exit_flush(&self, over: crate::shim::guard::ExitOver) {
        exit::flush(over);
    }

    fn needs_hooks(&self) -> bool {
        true
    }
}

/// An `exit` over a sleep of this thread's call that holds no lock
/// (`interpose::exit_over`): the socket it waited on is read and driven
/// again ([`census::abandon_wait`]), before the stdio flush and the
/// closes.
pub(crate) fn abandon_wait_at_exit(slept: warpsock_engine::asleep::Slept) {
    census::abandon_wait(slept);
}

/// `setsockopt(SOL_WARPSOCK)` on a socket not in DDP mode.
fn set_plain(fd: c_int, name: c_int, val: *const c_void, len: socklen_t) -> c_int {
    let fail = |e| {
        set_errno(e);
        -1
    };
    let Some(v) = int_arg(val, len) else {
        return fail(libc::EINVAL);
    };
    if !is_tcp(fd) {
        return fail(libc::EOPNOTSUPP);
    }
    let mut p = pending(fd);
    match (name, v) {
        (WARPSOCK_MSG_MODE, 0 | 1) => {
            p.msg_mode = v == 1;
            set_pending(fd, p);
            0
        }
        (WARPSOCK_DDP_MODE, 0) => {
            p.ddp = false;
            set_pending(fd, p);
            0
        }
        (WARPSOCK_DDP_MODE, 1) => {
            if p.tried {
                return fail(libc::EALREADY);
            }
            let listening =
                sys::get_int(fd, libc::SOL_SOCKET, libc::SO_ACCEPTCONN).is_some_and(|v| v != 0);
            if listening || sys::peer_addr(fd).is_none() {
                // Switch when connected, or on every accepted connection.
                p.ddp = true;
                set_pending(fd, p);
                fdtable::set_candidate(fd, KIND);
                return 0;
            }
            if p.sndbuf.is_none() {
                if let Some(b) = listeners_sndbuf(fd) {
                    p.sndbuf = Some(b);
                    set_pending(fd, p);
                }
            }
            match switch(fd, &config::get().request, p.msg_mode, None, None) {
                Ok(()) => 0,
                Err(e) => fail(e),
            }
        }
        (WARPSOCK_DDP_MODE | WARPSOCK_MSG_MODE, _) => fail(libc::EINVAL),
        _ => fail(libc::ENOPROTOOPT),
    }
}
