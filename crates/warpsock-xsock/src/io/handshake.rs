//! Runs a [`Switch`] on a real TCP socket: the urgent mark, reading the
//! residue up to the peer's mark, peeking at the MPA Request, then MPA and
//! the queue pair through the engine.

use std::io;
use std::mem::ManuallyDrop;
use std::net::TcpStream;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, RawFd};
use std::time::{Duration, Instant};

use warpsock_engine::{CmError, ConnectRequest};

use super::residue_cap::{Charge, ResidueBudget};
use super::settings::{Options, RtoMin};
use super::socket::XSocket;
use super::sys;
use crate::switch::{role, Role, Step, Switch, SwitchError, BUSY, MARK};

/// Why a switch did not produce a DDP-mode socket.
#[derive(Debug)]
pub enum Failure {
    /// No switch happened: the socket is an intact TCP socket; `residue`
    /// (the peer's bytes before its mark, already read) must reach the
    /// application before anything read from the socket. `watch`: the
    /// responder gave up waiting for the MPA Request; the bytes behind the
    /// peer's mark must be checked with
    /// [`classify_request`](crate::switch::classify_request) before they are
    /// delivered.
    Refused {
        /// Why.
        error: SwitchError,
        /// Bytes read from the peer before its mark.
        residue: Vec<u8>,
        /// Watch for a late MPA Request.
        watch: bool,
    },
    /// The switch had committed when it failed: the connection is broken
    /// (and has been reset).
    Broken {
        /// `EPROTO`, `ECONNRESET`, `ETIMEDOUT`, ...
        errno: i32,
        /// What failed.
        what: String,
    },
}

impl Failure {
    /// The `errno` for `setsockopt`.
    pub fn errno(&self) -> i32 {
        match self {
            Self::Refused { error, .. } => error.errno(),
            Self::Broken { errno, .. } => *errno,
        }
    }

    fn io(e: io::Error) -> Self {
        Self::Broken {
            errno: e.raw_os_error().unwrap_or(libc::EIO),
            what: e.to_string(),
        }
    }

    fn cm(e: CmError) -> Self {
        let errno = match &e {
            CmError::Timeout { .. } => libc::ETIMEDOUT,
            CmError::Rejected { .. } | CmError::Refused { .. } => libc::ECONNREFUSED,
            CmError::Io(io) => io.raw_os_error().unwrap_or(libc::EPROTO),
            _ => libc::EPROTO,
        };
        Self::Broken {
            errno,
            what: e.to_string(),
        }
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Refused { error, .. } => write!(f, "{error}; the socket stays plain TCP"),
            Self::Broken { what, .. } => write!(f, "the switch failed after it committed: {what}"),
        }
    }
}

/// Switches the connected TCP socket `fd` into DDP mode (both ends call
/// this). On success the returned socket owns a duplicate of `fd`; `fd`
/// itself still refers to the same connection (the caller decides what the
/// application's descriptor becomes). The roles come from the addresses
/// ([`crate::switch::role`]).
pub fn switch_fd(fd: BorrowedFd<'_>, opts: &Options) -> Result<XSocket, Failure> {
    switch_fd_as(fd, opts, None)
}

/// [`switch_fd`] with the role given by the caller (`None`: from the
/// addresses). Policy mode gives the connecting end the initiator's role
/// and the accepting end the responder's: a preloaded server then never
/// marks before its client did, so a client without warpsock sees no
/// urgent byte at all (an urgent byte is invisible to its reads, not to
/// its `poll`: curl takes `POLLPRI` while connecting for a failed connect).
/// Both ends must choose their roles the same way.
pub fn switch_fd_as(
    fd: BorrowedFd<'_>,
    opts: &Options,
    role_given: Option<Role>,
) -> Result<XSocket, Failure> {
    switch_fd_declinable(fd, opts, role_given, &|_| None)
}

/// What [`answer_busy`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BusyAnswer {
    /// The initiator's mark was first in its stream: [`BUSY`] went where
    /// our mark would, and the mark was consumed.
    Sent,
    /// Nothing from the peer yet (no byte, no mark — or its pointer
    /// known, the byte not here): a warpsock initiator's mark may still
    /// come, to answer then.
    NotYet,
    /// Never to answer: the peer's bytes came first, or after its mark
    /// (it went on as TCP), or another urgent byte, or this end wrote
    /// already (`BUSY` must be first in our stream, as a mark would be).
    Never,
}

/// A responder's answer when it has no room to switch the connection `fd`
/// now (the preload's switching places or DDP sockets at their bound): if
/// the initiator's mark is there, first in its stream (a switch at the
/// connection's start, as policy mode's), and this end wrote nothing,
/// sends [`BUSY`] where our mark would go and consumes the initiator's
/// ([`BusyAnswer::Sent`]) — the initiator then goes on as TCP at once
/// ([`SwitchError::Busy`]) instead of waiting out its mark timeout, and
/// our program sees no urgent byte. Otherwise nothing is sent, and the
/// answer says whether a mark may still come.
pub fn answer_busy(fd: BorrowedFd<'_>) -> io::Result<BusyAnswer> {
    let raw = fd.as_raw_fd();
    if !sys::sent_nothing(raw) {
        return Ok(BusyAnswer::Never);
    }
    if !sys::at_mark(raw)? {
        return Ok(if sys::readable(raw)? == 0 {
            BusyAnswer::NotYet
        } else {
            BusyAnswer::Never
        });
    }
    match sys::peek_urgent(raw)? {
        None => Ok(BusyAnswer::NotYet),
        // Bytes behind the mark, or its end: the initiator gave up waiting
        // for our answer and went on as TCP (a waiting one sends nothing
        // more). A peek at the mark reads past it (`SO_OOBINLINE` off),
        // where `FIONREAD` stops at it.
        Some(MARK) if !nothing_behind_mark(raw)? => Ok(BusyAnswer::Never),
        // In the stream (`SO_OOBINLINE`), where the program may read it
        // first: taken before the answer, and answered only if taken —
        // after a program's read of it, a take after the answer would be
        // of the client's first byte (helper 67's review).
        Some(MARK) if sys::urgent_inline(raw) => {
            if !sys::take_inline_mark(raw) {
                return Ok(BusyAnswer::Never);
            }
            sys::send_urgent(raw, BUSY, None)?;
            Ok(BusyAnswer::Sent)
        }
        Some(MARK) => {
            sys::send_urgent(raw, BUSY, None)?;
            sys::take_urgent(raw);
            Ok(BusyAnswer::Sent)
        }
        Some(_) => Ok(BusyAnswer::Never),
    }
}

/// Whether nothing follows the peer's mark at `fd`'s read position: a
/// peek finds no byte (`EAGAIN`) and no end of stream — with
/// `SO_OOBINLINE`, no byte but the mark itself, the stream's first.
fn nothing_behind_mark(fd: RawFd) -> io::Result<bool> {
    let inline = sys::urgent_inline(fd);
    let mut b = [0u8; 2];
    match sys::recv(fd, &mut b[..1 + usize::from(inline)], true) {
        // The mark alone, and no end behind it (a peek that finds bytes
        // does not tell an end after them).
        Ok(n) => Ok(inline && n == 1 && !sys::fin_received(fd)),
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(true),
        Err(e) => Err(e),
    }
}

/// The two points where a switch can still be declined with the
/// connection left a working TCP socket ([`switch_fd_declinable`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Commit {
    /// Responder: the initiator's Request came and is still to be
    /// answered.
    Answer,
    /// Initiator: both marks are seen, the Request is still to be sent.
    Request,
}

/// [`switch_fd_as`] that either side declines if `decline(at)` gives the
/// cause at its last point before it commits (`None`: it goes on). A
/// responder asked at [`Commit::Answer`] answers the Request with a Reject
/// (the cause is its error: [`SwitchError::Declined`] for a fork,
/// [`SwitchError::NoDescriptors`] short of descriptors), both frames
/// consumed, and the connection goes on as TCP — the initiator falls back
/// at once ([`SwitchError::Rejected`]). An initiator asked at
/// [`Commit::Request`] sends nothing more (the cause,
/// [`SwitchError::Withdrawn`]): the responder, waiting
/// for the Request, finds the program's bytes there (or nothing until its
/// request timeout) and goes on as TCP too. The preload declines the
/// switch of a connection its process forks during, and either side's when
/// too few descriptors are left to finish it (`xsock::switching`,
/// `xsock::switch_at`).
pub fn switch_fd_declinable(
    fd: BorrowedFd<'_>,
    opts: &Options,
    role_given: Option<Role>,
    decline: &dyn Fn(Commit) -> Option<SwitchError>,
) -> Result<XSocket, Failure> {
    let raw = fd.as_raw_fd();
    let broken = Failure::io;
    let stream = borrowed_stream(raw);
    let (local, peer) = match (stream.local_addr(), stream.peer_addr()) {
        (Ok(l), Ok(p)) => (l, p),
        (_, Err(e)) | (Err(e), _) => return Err(broken(e)),
    };
    // A connection to itself has no roles at all.
    let Some(by_addr) = role(local, peer) else {
        return Err(Failure::Refused {
            error: SwitchError::SelfConnected,
            residue: Vec::new(),
            watch: false,
        });
    };
    // The caller's file status flags: the engine puts its duplicate of the
    // socket in blocking mode (`FIONBIO`), which clears `O_NONBLOCK` on the
    // open file description the caller's descriptor shares; a switch that
    // leaves the connection TCP ([`Failure::Refused`]) puts them back
    // (review r28-a item 1: an event loop's next read blocked).
    let flags = sys::file_flags(raw).ok();
    let mut sw = Switch::new(role_given.unwrap_or(by_addr), opts.limits, Instant::now());
    let mut residue = Vec::new();
    // The residue's charge against the budget the switches share (helper
    // 73 item 8: N explicit switches against flooding peers held N times
    // `residue_max`), given back as this function returns: the residue
    // then leaves the switch for the program's stream.
    let mut charge = opts
        .residue_budget
        .map_or_else(Charge::unbounded, ResidueBudget::charge);
    let mut buf = vec![0u8; 64 << 10];
    // The peer ended its side while the Request was undecided: the next
    // peek sees every byte it sent.
    let mut peer_ended = false;
    // The undecided Request's last peek, and the pause after the next one
    // if it finds the same bytes.
    let mut peeked = None;
    let mut pause = PAUSE_MIN;
    loop {
        match sw.step() {
            Step::SendMark { deadline } => {
                if sys::send_urgent(raw, MARK, Some(deadline)).map_err(broken)? {
                    sw.on_marked(Instant::now());
                } else {
                    sw.on_timeout(Instant::now());
                }
            }
            Step::AwaitMark { deadline, room } => {
                if sys::at_mark(raw).map_err(broken)? {
                    match sys::peek_urgent(raw).map_err(broken)? {
                        Some(b) => {
                            sw.on_mark(b);
                            // Ours (a mark, or a busy responder's answer)
                            // is consumed; a foreign one is left for the
                            // program.
                            if !matches!(sw.step(), Step::Failed(SwitchError::ForeignUrgent(_))) {
                                sys::take_urgent(raw);
                            }
                        }
                        None => {
                            // The pointer is known, the byte not yet here.
                            if wait(raw, libc::POLLPRI, deadline).map_err(broken)? == 0 {
                                sw.on_timeout(Instant::now());
                            }
                        }
                    }
                    continue;
                }
                // Read only bytes already queued: a byte queued now is
                // known not to be the mark, while a recv at the mark
                // position with nothing queued yet could skip a mark that
                // arrives meanwhile.
                let queued = sys::readable(raw).map_err(broken)?;
                if queued == 0 {
                    let ev = wait(raw, libc::POLLIN | libc::POLLPRI, deadline).map_err(broken)?;
                    if ev == 0 {
                        sw.on_timeout(Instant::now());
                    } else if ev & (libc::POLLHUP | libc::POLLERR) != 0
                        && sys::readable(raw).map_err(broken)? == 0
                        && !sys::at_mark(raw).map_err(broken)?
                    {
                        sw.on_eof();
                    } else if ev & libc::POLLIN != 0
                        && sys::readable(raw).map_err(broken)? == 0
                        && !sys::at_mark(raw).map_err(broken)?
                    {
                        // Readable with nothing queued: end of stream.
                        let mut probe = [0u8; 1];
                        if sys::recv(raw, &mut probe, true).map_err(broken)? == 0 {
                            sw.on_eof();
                        }
                    }
                    continue;
                }
                if room == 0 {
                    // Policy mode: left for the program (`Step::AwaitMark`).
                    sw.on_bytes_ahead(queued);
                    continue;
                }
                let want = queued.min(room).min(buf.len()).max(1);
                // Charged before it is read: a full budget ends the switch
                // as its own bound would, the bytes queued left in the
                // socket, behind the residue.
                let want = charge.grant(want);
                if want == 0 {
                    sw.on_residue_refused();
                    continue;
                }
                match sys::recv(raw, &mut buf[..want], false) {
                    Ok(0) => {
                        charge.unused(want);
                        sw.on_eof();
                    }
                    Ok(n) => {
                        charge.unused(want - n);
                        residue.extend_from_slice(&buf[..n]);
                        sw.on_bytes(n, Instant::now());
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => charge.unused(want),
                    Err(e) => return Err(broken(e)),
                }
            }
            Step::AwaitRequest { deadline, want } => {
                if buf.len() < want {
                    buf.resize(want, 0);
                }
                // Counted before the peek: inline, an urgent byte ahead
                // shows as more queued than the peek finds.
                let queued = sys::readable(raw).map_err(broken)?;
                match sys::recv(raw, &mut buf[..want], true) {
                    Ok(0) => sw.on_eof(),
                    Ok(n) => {
                        sw.on_peek(&buf[..n]);
                        if let Step::AwaitRequest { want: more, .. } = sw.step() {
                            // Still undecided. After the peer's end, these
                            // are all the bytes there will be.
                            if peer_ended {
                                sw.on_eof();
                                continue;
                            }
                            // An urgent byte ahead: no Request (helper 73).
                            if sys::urgent_ahead(raw, queued, n, want) {
                                sw.on_urgent_ahead();
                                continue;
                            }
                            // The same prefix after a wait that said
                            // readable: the kernel reports input the peek
                            // cannot reach (memory pressure, which reports
                            // any byte; an urgent byte, which stops the
                            // peek, is told above): pause,
                            // doubling up to 100 ms, as the watch does
                            // (helper 32's review).
                            if peeked == Some(n) {
                                let left = deadline.saturating_duration_since(Instant::now());
                                sys::pause(pause.min(left));
                                pause = (pause * 2).min(PAUSE_MAX);
                            } else {
                                pause = PAUSE_MIN;
                            }
                            peeked = Some(n);
                            // Wait for `more` bytes: a prefix already
                            // queued makes `POLLIN` true at once, and the
                            // wait would spin on it (a peer that marked and
                            // sent half a Request held ~13 % of a CPU for
                            // the whole wait with 200 µs pauses; session 35).
                            let ev = wait_for_bytes(raw, more, deadline).map_err(broken)?;
                            if ev == 0 {
                                sw.on_timeout(Instant::now());
                            } else if ev & (libc::POLLRDHUP | libc::POLLHUP) != 0 {
                                peer_ended = true;
                            }
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        if wait(raw, libc::POLLIN, deadline).map_err(broken)? == 0 {
                            sw.on_timeout(Instant::now());
                        }
                    }
                    Err(e) => return Err(broken(e)),
                }
            }
            Step::Connect => {
                if let Some(error) = decline(Commit::Request) {
                    // Only our mark entered the stream: the connection is
                    // TCP, its flags as they were, the responder's bytes
                    // before its mark (read) first.
                    if let Some(fl) = flags {
                        sys::set_file_flags(raw, fl);
                    }
                    return Err(Failure::Refused {
                        error,
                        residue,
                        watch: false,
                    });
                }
                let rto = rto_plan(raw, opts.rto_min);
                let sock = lifted_clone(&stream).map_err(|e| committed(&stream, e))?;
                // The residue stays here unless the queue pair is made
                // (the peer may reject), and the program's `TCP_NODELAY`
                // is put back then (the exchange sets it: the engine's
                // `TcpOptions`).
                let nodelay = stream.nodelay().ok();
                return XSocket::connect(sock, opts, &mut residue)
                    .inspect(|x| {
                        x.lock().rto = rto;
                        last_entries(raw);
                    })
                    .map_err(|e| match e {
                        // The peer's Reply was its last frame, read: the
                        // stream goes on as TCP, its bytes behind the
                        // Reply (read with it) after the residue.
                        CmError::Rejected { early, .. } => {
                            if let Some(v) = nodelay {
                                let _ = stream.set_nodelay(v);
                            }
                            if let Some(fl) = flags {
                                sys::set_file_flags(raw, fl);
                            }
                            residue.extend_from_slice(&early);
                            Failure::Refused {
                                error: SwitchError::Rejected,
                                residue,
                                watch: false,
                            }
                        }
                        e => {
                            reset(&stream);
                            Failure::cm(e)
                        }
                    });
            }
            Step::Accept(peer_hello) => {
                // Declined before anything of ours entered the stream
                // after our mark (helper 73 item 4: an explicit responder
                // short of descriptors reset the connection here, where
                // policy mode declined): the Request is read and
                // answered with a Reject, and both ends go on as TCP, no
                // byte lost. The cause is the caller's (`EMFILE` for
                // descriptors). Past this point — the Reply sent, or the
                // descriptors for it gone after the look — the peer has
                // committed and a failure resets (`committed`,
                // `Failure::cm`): that distinction stays.
                if let Some(error) = decline(Commit::Answer) {
                    return Err(refuse(&stream, flags, residue, opts, error));
                }
                let rto = rto_plan(raw, opts.rto_min);
                let sock = lifted_clone(&stream).map_err(|e| committed(&stream, e))?;
                let tcp_fd = sock.as_raw_fd();
                let accepted = ConnectRequest::read(sock, opts.limits.request_timeout)
                    .and_then(|req| XSocket::accept(req, tcp_fd, peer_hello, opts, residue));
                let accepted = accepted.inspect(|x| {
                    x.lock().rto = rto;
                    last_entries(raw);
                });
                return accepted.map_err(|e| {
                    reset(&stream);
                    Failure::cm(e)
                });
            }
            Step::Reject(e) => {
                return Err(refuse(
                    &stream,
                    flags,
                    residue,
                    opts,
                    SwitchError::Incompatible(e),
                ));
            }
            Step::Failed(error) => {
                let watch = matches!(error, SwitchError::NoRequest { .. });
                return Err(Failure::Refused {
                    error,
                    residue,
                    watch,
                });
            }
        }
    }
}

/// The responder's Reject of the Request next in `stream` (`error`: why):
/// the Request is read (the initiator sends nothing behind it before the
/// Reply) and answered with a Reject, both frames consumed, and the
/// connection goes on as TCP, the caller's file status `flags` put back.
/// A failure here (no descriptor for the engine: `EMFILE`; a Request the
/// core turns down; the Reply's send) leaves the peer waiting in MPA with
/// its Request consumed: the connection is reset, as [`Failure::Broken`]
/// says and the Accept arm does (review r28-a item 2: left, the program
/// read on with the peer's bytes before its mark lost).
fn refuse(
    stream: &TcpStream,
    flags: Option<libc::c_int>,
    mut residue: Vec<u8>,
    opts: &Options,
    error: SwitchError,
) -> Failure {
    let sock = match lifted_clone(stream) {
        Ok(s) => s,
        Err(e) => return committed(stream, e),
    };
    let refused =
        ConnectRequest::read(sock, opts.limits.request_timeout).and_then(|req| req.refuse(&[]));
    match refused {
        Ok((_, early)) => {
            if let Some(fl) = flags {
                sys::set_file_flags(stream.as_raw_fd(), fl);
            }
            residue.extend_from_slice(&early);
            Failure::Refused {
                error,
                residue,
                watch: false,
            }
        }
        Err(c) => {
            reset(stream);
            Failure::Broken {
                errno: libc::EPROTO,
                what: format!("{error}; {c}"),
            }
        }
    }
}

/// How many times [`wait`] goes on past error-queue entries it dropped:
/// each time takes at least one, and only bytes sent before the switch
/// have any (their count is the bound; this one, for a loop's sake).
const WAITS_PAST_ENTRIES: usize = 64;

/// [`sys::wait`] for `events` until `deadline`, past entries in `fd`'s
/// error queue (review r23-a item 2): `poll` reports `POLLERR` for them,
/// whatever `events`, where there is nothing to read — the wait for the
/// peer's mark took that for its end of stream (the switch was refused),
/// the others spun. They are transmit stamps (or ICMP reports) for bytes
/// the program sent before the switch with `SO_TIMESTAMPING` (or
/// `IP_RECVERR`) on: the option's turning off (the preload's, before the
/// switch) stops new ones, not those of packets already marked (`TX_ACK`'s
/// come when the peer acknowledges them, during the switch). Dropped
/// ([`warpsock_engine::drain_error_queue`]: nobody reads them now), and
/// the wait goes on. `POLLERR` with a hang-up or no entry (the socket's
/// own error) is returned as before.
fn wait(fd: RawFd, events: i16, deadline: Instant) -> io::Result<i16> {
    for _ in 0..WAITS_PAST_ENTRIES {
        let ev = sys::wait(fd, events, Some(deadline))?;
        if ev & libc::POLLERR == 0
            || ev & (libc::POLLHUP | events) != 0
            || warpsock_engine::drain_error_queue(fd) == 0
        {
            return Ok(ev);
        }
    }
    sys::wait(fd, events, Some(deadline))
}

/// The first and the longest pause of a switch waiting for the rest of a
/// Request whose bytes did not change across a wait that said readable.
const PAUSE_MIN: Duration = Duration::from_micros(200);
const PAUSE_MAX: Duration = Duration::from_millis(100);

/// [`wait`] for input until `want` bytes are queued on `fd` (or its end,
/// an error, the deadline): the socket's low-water mark (`SO_RCVLOWAT`,
/// which `poll` honours for TCP) is `want` for the wait and put back after
/// it (where it cannot be set, the wait returns at once for the bytes
/// queued, and the caller's pauses keep its loop from spinning).
fn wait_for_bytes(fd: RawFd, want: usize, deadline: Instant) -> io::Result<i16> {
    let events = libc::POLLIN | libc::POLLRDHUP;
    let want = libc::c_int::try_from(want).unwrap_or(libc::c_int::MAX);
    let lowat = |v| set_int_option(fd, libc::SOL_SOCKET, libc::SO_RCVLOWAT, v);
    match int_option(fd, libc::SOL_SOCKET, libc::SO_RCVLOWAT) {
        Some(old) if lowat(want) => {
            let r = wait(fd, events, deadline);
            lowat(old);
            r
        }
        _ => wait(fd, events, deadline),
    }
}

/// `getsockopt` of one int option.
fn int_option(fd: RawFd, level: libc::c_int, name: libc::c_int) -> Option<libc::c_int> {
    let mut v: libc::c_int = 0;
    let mut n = size_of::<libc::c_int>() as libc::socklen_t;
    #[allow(unsafe_code)]
    // SAFETY: getsockopt writes at most `n` bytes into one int on the stack.
    let r =
        unsafe { libc::getsockopt(fd, level, name, (&mut v as *mut libc::c_int).cast(), &mut n) };
    (r == 0).then_some(v)
}

/// `setsockopt` of one int option; whether the kernel took it.
fn set_int_option(fd: RawFd, level: libc::c_int, name: libc::c_int, v: libc::c_int) -> bool {
    #[allow(unsafe_code)]
    // SAFETY: setsockopt reads one int from the stack.
    let r = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            (&v as *const libc::c_int).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    r == 0
}

/// After the switch: drops the last error-queue entries of bytes sent
/// before it (see [`wait`]). None come later: the peer's last message of
/// the exchange, just read, was sent after it read every byte this end
/// sent before its mark, so the acknowledgement of them all came with or
/// before it (the kernel takes an ACK before the data it carries), and
/// the send-time stamps before that; the exchange's own packets are not
/// marked. Left, they stayed for the connection's life: `POLLERR` on the
/// engine's socket, which the preload's progress thread's epoll returned
/// at every wait (it spun), as did the engine's polled sleeps.
fn last_entries(fd: RawFd) {
    warpsock_engine::drain_error_queue(fd);
}

/// `TCP_RTO_MIN_US` (`include/uapi/linux/tcp.h`, Linux 6.15).
const TCP_RTO_MIN_US: libc::c_int = 45;

/// The [`Options::rto_min`] plan of the committed connection: the
/// kernel's value, read now, to put back if a receive-only end lowers it
/// later ([`RtoMin`]). Nothing is set here. A kernel without the option
/// (`ENOPROTOOPT`) keeps its own throughout, as does one that refuses the
/// value later (`EINVAL`: below one jiffy, or above `TCP_RTO_MAX`): the
/// connection works either way, only a lost lone credit return waits
/// longer.
fn rto_plan(fd: RawFd, rto_min: Option<Duration>) -> RtoMin {
    if rto_min.is_none() {
        return RtoMin::Kernel;
    }
    RtoMin::new(rto_min, int_option(fd, libc::IPPROTO_TCP, TCP_RTO_MIN_US))
}

/// `setsockopt(TCP_RTO_MIN_US)`; whether the kernel took it.
pub(super) fn set_rto_min_us(fd: RawFd, us: i32) -> bool {
    set_int_option(fd, libc::IPPROTO_TCP, TCP_RTO_MIN_US, us)
}

/// The engine's own handle on the connection: a duplicate of `stream`
/// placed out of the program's numbers ([`warpsock_engine::fds`]), as
/// `TcpStream::try_clone` would make it otherwise (close-on-exec).
#[allow(unsafe_code)]
fn lifted_clone(stream: &TcpStream) -> io::Result<TcpStream> {
    let fd = warpsock_engine::fds::dup_lifted(stream.as_raw_fd());
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is the new duplicate, ours alone.
    Ok(unsafe { TcpStream::from_raw_fd(fd) })
}

/// The caller's socket as a `TcpStream` that never closes it.
#[allow(unsafe_code)]
fn borrowed_stream(fd: RawFd) -> ManuallyDrop<TcpStream> {
    // SAFETY: `fd` is the caller's open socket for the whole switch, and
    // ManuallyDrop keeps this handle from closing it.
    ManuallyDrop::new(unsafe { TcpStream::from_raw_fd(fd) })
}

/// A failure after both marks (the descriptor for the engine: `EMFILE`):
/// the peer goes on into MPA, so the connection is reset, as
/// [`Failure::Broken`] says (review r23-a item 3: left, the peer's Request,
/// or its DDP frames, reached the program as bytes).
fn committed(s: &TcpStream, e: io::Error) -> Failure {
    reset(s);
    Failure::io(e)
}

/// Resets the connection: a switch that fails after committing must not
/// leave a stream either side could misread. An RST at once
/// (`sndbuf::reset`: `SO_LINGER` 0 and a disconnect, which purges both
/// queues; `shutdown` alone, as before, sent a FIN after what was queued
/// and left the bytes received readable: the peer's MPA message or frames
/// reached the program, review r23-a item 3), then shut both ways: the
/// socket reads as one the peer reset (`ECONNRESET`, then end of stream).
fn reset(s: &TcpStream) {
    super::sndbuf::reset(s.as_raw_fd());
    let _ = s.shutdown(std::net::Shutdown::Both);
}
