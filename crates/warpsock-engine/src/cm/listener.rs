//! The responder's side: [`Listener`] runs the MPA handshakes of many
//! connecting peers at once, [`ConnectRequest`] is one whose Request
//! arrived, to accept or reject.
//!
//! # Hostile peers
//!
//! Anything that listens is exposed: a peer may connect and send nothing,
//! dribble its Request a byte at a time, or open connections in a flood.
//! So the listener reads every pending handshake without blocking, side
//! by side: a silent or slow peer never delays a good one. Each pending
//! handshake has a deadline ([`Listener::set_mpa_timeout`], 5 s by
//! default, siw's responder timeout) counted from the TCP accept — not
//! renewed by progress, so dribbling cannot stretch it — and there are at
//! most [`Listener::set_max_pending`] of them (64 by default): a new
//! connection beyond that evicts the oldest pending one — read first: one
//! whose Request has come is kept — so a flood of silent connections
//! cannot lock good peers out either (they would have to be opened faster
//! than a good peer completes its Request), and a burst of good ones loses
//! none. While as many Requests as that wait for the application, new
//! connections wait in the kernel's queue. Each pending handshake holds
//! one socket and about 1 KiB.
//!
//! Out of descriptors or memory (`EMFILE`, `ENFILE`, `ENOBUFS`,
//! `ENOMEM` from `accept(2)`), the connection stays in the kernel's queue
//! and the listening socket stays readable: the listener reports it once
//! ([`CmError::Io`] with the errno), stops taking connections for
//! [`ACCEPT_PAUSE`] at a time — the pending handshakes go on meanwhile —
//! and tries again, instead of returning the error at once on every call
//! (a caller that looped on it spun a CPU, and no pending Request was
//! read again).

use std::collections::VecDeque;
use std::io;
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use warpsock_proto::{AcceptError, Connection, Registry, Role};

use super::mpa::{drive_mpa, MpaDone, MpaExchange};
use super::{check_private_data, fpdu_segment, CmError, QpInit, MAX_PRIVATE_DATA};
use crate::mem::Mem;
use crate::qp::Qp;
use crate::sys;

/// Default of [`Listener::set_mpa_timeout`]: siw's responder waits 5 s for
/// the MPA Request after the TCP accept (`siw_cm.h`).
pub const DEFAULT_MPA_REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// Default of [`Listener::set_max_pending`].
pub const DEFAULT_MAX_PENDING: usize = 64;
/// How long a listener leaves its queue alone after `accept(2)` ran out
/// of descriptors or memory (see the module docs).
pub const ACCEPT_PAUSE: Duration = Duration::from_millis(100);

/// One connection in its MPA handshake, on a non-blocking socket.
#[derive(Debug)]
struct Handshake {
    sock: TcpStream,
    local: SocketAddr,
    peer: SocketAddr,
    mpa: MpaExchange,
}

impl Handshake {
    /// Reads what has arrived and advances the exchange: `Ok(Some(..))`
    /// once the Request is complete, `Ok(None)` when it needs more.
    fn on_readable(&mut self) -> Result<Option<warpsock_proto::ConnectRequest>, CmError> {
        loop {
            match self.mpa.advance(&self.sock)? {
                Some(MpaDone::Request(r)) => return Ok(Some(r)),
                Some(MpaDone::Established) => {
                    unreachable!("a responder is established only by accepting")
                }
                None => {}
            }
            if self.mpa.read_from(&self.sock) {
                return Ok(None);
            }
        }
    }

    /// When the handshake's deadline passes.
    fn deadline(&self) -> Option<Instant> {
        self.mpa.conn.poll_timeout()
    }
}

/// What [`Listener::accept`] keeps between calls.
#[derive(Debug, Default)]
struct Pending {
    handshakes: Vec<Handshake>,
    /// Requests that arrived and are not yet returned: they go first, so
    /// a good peer never waits behind failure reports.
    ready: VecDeque<ConnectRequest>,
    /// Failed handshakes not yet reported (one per call, after `ready`).
    failed: VecDeque<CmError>,
    /// `accept(2)` ran out of descriptors or memory: no new connection is
    /// taken before this.
    paused_until: Option<Instant>,
    /// The exhaustion is reported (until a connection is taken again).
    starved: bool,
}

/// Failure reports kept for [`Listener::accept`] to return: a flood adds
/// them faster than one per call, so the oldest beyond this are dropped
/// (their connections are closed either way).
const MAX_FAILURE_REPORTS: usize = 64;

impl Pending {
    fn report(&mut self, e: CmError) {
        if self.failed.len() >= MAX_FAILURE_REPORTS {
            self.failed.pop_front();
        }
        self.failed.push_back(e);
    }
}

/// A TCP listener that accepts iWARP connections, running the MPA
/// handshakes of connecting peers concurrently (see the module docs).
#[derive(Debug)]
pub struct Listener {
    sock: TcpListener,
    mpa_timeout: Duration,
    max_pending: usize,
    pending: Mutex<Pending>,
}

impl Listener {
    /// Listens on `addr` (port 0 picks a free port; see [`Self::local_addr`]).
    pub fn bind<A: ToSocketAddrs>(addr: A) -> io::Result<Self> {
        Self::from_std(crate::fds::lift_owned(TcpListener::bind(addr)?))
    }

    /// Runs on a TCP listener the caller opened (made non-blocking here).
    pub fn from_std(sock: TcpListener) -> io::Result<Self> {
        sock.set_nonblocking(true)?;
        Ok(Self {
            sock,
            mpa_timeout: DEFAULT_MPA_REQUEST_TIMEOUT,
            max_pending: DEFAULT_MAX_PENDING,
            pending: Mutex::new(Pending::default()),
        })
    }

    /// The bound address.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.sock.local_addr()
    }

    /// How long a connected peer has, from the TCP accept, to deliver its
    /// whole MPA Request (default 5 s).
    pub fn set_mpa_timeout(&mut self, t: Duration) {
        self.mpa_timeout = t;
    }

    /// How many connections may be in their MPA handshake at once (default
    /// 64, at least 1). A connection beyond that evicts the oldest pending
    /// one, which [`Self::accept`] reports as [`CmError::Evicted`].
    pub fn set_max_pending(&mut self, n: usize) {
        self.max_pending = n.max(1);
    }

    /// How many connections are in their MPA handshake now.
    pub fn pending(&self) -> usize {
        self.lock().handshakes.len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Pending> {
        self.pending.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Waits up to `timeout` (`None`: forever) for the next connection
    /// whose MPA Request has arrived, and returns it for the application to
    /// accept or reject. Handshakes run side by side while it waits (and
    /// only while some thread is in `accept`): a silent or slow peer never
    /// delays another.
    ///
    /// A peer whose handshake fails — no valid Request within the MPA
    /// timeout, a malformed one, a close or reset, eviction — is reported
    /// as an error from this call, one at a time, with its address, after
    /// every Request that has arrived (at most the last 64 such reports
    /// are kept); call `accept` again for the next peer. `CmError::Timeout` with stage
    /// "TCP accept" means nothing arrived in `timeout`. `accept(2)` out of
    /// descriptors or memory is reported once as [`CmError::Io`] with its
    /// errno while the pending handshakes go on (see the module docs);
    /// other errors of the listening socket are returned as they come.
    pub fn accept(&self, timeout: Option<Duration>) -> Result<ConnectRequest, CmError> {
        let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
        let mut p = self.lock();
        let mut fds: Vec<libc::pollfd> = Vec::new();
        loop {
            if let Some(r) = p.ready.pop_front() {
                return Ok(r);
            }
            if let Some(e) = p.failed.pop_front() {
                return Err(e);
            }
            // The pending handshakes advance (and time out) even when
            // the listening socket fails (helper 82: a lasting `accept(2)`
            // error, `EBADF` after a program's `closefrom`, froze them).
            let taken = self.take_new(&mut p);
            self.progress(&mut p, &fds);
            taken?;
            if !p.ready.is_empty() || !p.failed.is_empty() {
                continue;
            }
            let now = Instant::now();
            let left = deadline.map(|d| d.saturating_duration_since(now));
            if left.is_some_and(|l| l.is_zero()) {
                return Err(CmError::Timeout {
                    addr: None,
                    stage: "TCP accept",
                    after: timeout.unwrap_or_default(),
                });
            }
            // Sleep until the listener or a handshake is readable, or the
            // next handshake deadline; while paused, the listener (readable
            // with what it cannot take) is left out until the pause ends.
            let paused = p.paused_until.filter(|&u| u > now);
            let next = p
                .handshakes
                .iter()
                .filter_map(Handshake::deadline)
                .chain(paused)
                .min();
            let wait = match (left, next) {
                (l, Some(n)) => {
                    Some(l.map_or(n - now, |l| l.min(n.saturating_duration_since(now))))
                }
                (l, None) => l,
            };
            fds.clear();
            if paused.is_none() {
                fds.push(pollfd(self.sock.as_raw_fd()));
            }
            fds.extend(p.handshakes.iter().map(|h| pollfd(h.sock.as_raw_fd())));
            sys::poll(&mut fds, wait).map_err(CmError::Io)?;
        }
    }

    /// Takes every connection the kernel has completed (while fewer
    /// Requests than the cap wait for the application), reading the oldest
    /// pending handshake beyond the cap and evicting it if incomplete; out
    /// of descriptors or memory, pauses (see the module docs).
    fn take_new(&self, p: &mut Pending) -> Result<(), CmError> {
        if p.paused_until.is_some_and(|u| Instant::now() < u) {
            return Ok(());
        }
        p.paused_until = None;
        loop {
            // Requests the application has still to take number the cap:
            // the next connections wait in the kernel's queue (its backlog
            // bounds them), so that the sockets held stay a few times the
            // cap (pending, and ready) however many good clients come at
            // once.
            if p.ready.len() >= self.max_pending {
                return Ok(());
            }
            let (sock, peer) = match self.sock.accept() {
                Ok(x) => x,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                // The peer gave up between SYN and accept: nothing to do.
                Err(e) if e.kind() == io::ErrorKind::ConnectionAborted => continue,
                Err(e)
                    if matches!(
                        e.raw_os_error(),
                        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
                    ) =>
                {
                    p.paused_until = Instant::now().checked_add(ACCEPT_PAUSE);
                    if !std::mem::replace(&mut p.starved, true) {
                        p.report(CmError::Io(e));
                    }
                    return Ok(());
                }
                Err(e) => return Err(CmError::Io(e)),
            };
            p.starved = false;
            let sock = crate::fds::lift_owned(sock);
            let Ok(local) = sock.local_addr() else {
                continue;
            };
            if sock.set_nonblocking(true).is_err() {
                continue;
            }
            if p.handshakes.len() >= self.max_pending {
                // The oldest is the one started first (deadlines grow with
                // the accept time).
                let oldest = p.handshakes.remove(0);
                self.finish_or_evict(p, oldest);
            }
            let mpa = MpaExchange::responder(peer, self.mpa_timeout, Instant::now());
            p.handshakes.push(Handshake {
                sock,
                local,
                peer,
                mpa,
            });
        }
    }

    /// The oldest handshake `h`, made to give way to a new connection: read
    /// first, so that a Request already in its socket — a burst of good
    /// clients, more than the cap in one round, whose handshakes this
    /// call took before any was read — is not lost (helper 82's review:
    /// 49–128 of 300 good clients evicted); evicted only if still
    /// incomplete.
    fn finish_or_evict(&self, p: &mut Pending, mut h: Handshake) {
        match h.on_readable() {
            Ok(Some(request)) => {
                match ConnectRequest::from_handshake(h, request) {
                    Ok(r) => p.ready.push_back(r),
                    Err(e) => p.report(e),
                }
                return;
            }
            Err(e) => {
                p.report(e);
                return;
            }
            Ok(None) => {}
        }
        p.report(CmError::Evicted {
            addr: h.peer,
            max: self.max_pending,
        });
    }

    /// Advances every handshake that is readable per the last `poll` (or
    /// was not in it: new) or past its deadline; moves finished ones to
    /// `done`.
    fn progress(&self, p: &mut Pending, fds: &[libc::pollfd]) {
        let now = Instant::now();
        let polled = |fd: i32| fds.iter().find(|f| f.fd == fd);
        let mut i = 0;
        while i < p.handshakes.len() {
            let h = &mut p.handshakes[i];
            let expired = h.deadline().is_some_and(|d| now >= d);
            if expired {
                h.mpa.conn.handle_timeout(now);
            }
            let ready = polled(h.sock.as_raw_fd()).is_none_or(|f| f.revents != 0);
            let res = if expired || ready {
                h.on_readable()
            } else {
                Ok(None)
            };
            match res {
                Ok(None) => i += 1,
                Ok(Some(request)) => {
                    let h = p.handshakes.remove(i);
                    match ConnectRequest::from_handshake(h, request) {
                        Ok(r) => p.ready.push_back(r),
                        Err(e) => p.report(e),
                    }
                }
                Err(e) => {
                    p.handshakes.remove(i);
                    p.report(e);
                }
            }
        }
    }

    /// Accepts the next valid request with `private_data` (convenience for
    /// [`Self::accept`] + [`ConnectRequest::accept`]).
    pub fn accept_qp(
        &self,
        init: &QpInit<'_>,
        private_data: &[u8],
        timeout: Option<Duration>,
    ) -> Result<Qp, CmError> {
        self.accept(timeout)?.accept(init, private_data)
    }
}

/// The listening socket. `shutdown(2)` of it (Linux) ends the wait of a
/// thread in [`Listener::accept`], whose `accept(2)` then fails with
/// `EINVAL`: how a listener served by a thread of its own is stopped.
impl AsFd for Listener {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.sock.as_fd()
    }
}

fn pollfd(fd: i32) -> libc::pollfd {
    libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    }
}

/// An incoming connection whose MPA Request has arrived: accept it (with
/// your options and private data) or reject it. Dropping it closes the TCP
/// connection without a reply.
#[derive(Debug)]
pub struct ConnectRequest {
    sock: TcpStream,
    local: SocketAddr,
    peer: SocketAddr,
    /// The responder connection, waiting for accept or reject.
    conn: Connection,
    request: warpsock_proto::ConnectRequest,
    /// Stream bytes that arrived behind the Request (the initiator must
    /// not send FPDUs before the Reply; if it did, the queue pair sees
    /// them as the start of its stream).
    early: Vec<u8>,
}

impl ConnectRequest {
    /// Runs the responder's side of the MPA exchange on a TCP connection
    /// accepted elsewhere (a blocking socket): waits up to `mpa_timeout`
    /// for the initiator's MPA Request. For connections accepted by a
    /// socket of your own (a [`Listener`] runs many handshakes at once by
    /// itself); run each on its own thread so that a slow peer never
    /// delays the next.
    pub fn read(sock: TcpStream, mpa_timeout: Duration) -> Result<Self, CmError> {
        let local = sock.local_addr().map_err(CmError::Io)?;
        let peer = sock.peer_addr().map_err(CmError::Io)?;
        // Blocking mode, as the queue pair and the exchange expect (as
        // `connect_stream`): an adopted socket may be non-blocking.
        sock.set_nonblocking(false)
            .map_err(|e| CmError::socket(Some(peer), "MPA request", e))?;
        let mut mpa = MpaExchange::responder(peer, mpa_timeout, Instant::now());
        match drive_mpa(&sock, &mut mpa)? {
            MpaDone::Request(request) => Ok(Self {
                early: mpa.early(),
                sock,
                local,
                peer,
                conn: mpa.conn,
                request,
            }),
            MpaDone::Established => {
                unreachable!("a responder is established only by accepting")
            }
        }
    }

    /// A listener's handshake whose Request arrived (its socket back in
    /// blocking mode, as the queue pair expects).
    fn from_handshake(
        h: Handshake,
        request: warpsock_proto::ConnectRequest,
    ) -> Result<Self, CmError> {
        h.sock
            .set_nonblocking(false)
            .map_err(|e| CmError::socket(Some(h.peer), "MPA request", e))?;
        Ok(Self {
            early: h.mpa.early(),
            sock: h.sock,
            local: h.local,
            peer: h.peer,
            conn: h.mpa.conn,
            request,
        })
    }

    /// The initiator's address.
    pub fn peer_addr(&self) -> SocketAddr {
        self.peer
    }

    /// The local address the initiator connected to.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// The initiator's private data.
    pub fn private_data(&self) -> &[u8] {
        &self.request.private_data
    }

    /// The MPA Request as the core parsed it (revision, CRC, markers,
    /// IRD/ORD).
    pub fn request(&self) -> &warpsock_proto::ConnectRequest {
        &self.request
    }

    /// Accepts: sends the MPA Reply with `private_data` (≤
    /// [`MAX_PRIVATE_DATA`]) and returns the queue pair.
    pub fn accept(self, init: &QpInit<'_>, private_data: &[u8]) -> Result<Qp, CmError> {
        init.check(private_data)?;
        init.options.tcp.apply(&self.sock).map_err(CmError::Io)?;
        let mss = fpdu_segment(&self.sock, self.peer);
        let cfg = init.options.config(Role::Responder, init.pd, mss);
        let mut conn = self.conn;
        conn.accept_with(cfg, private_data).map_err(accept_error)?;
        // Posted before the Reply goes out, so a Send right after setup
        // finds a buffer.
        init.post_initial(&mut conn)?;
        send_reply(&self.sock, self.peer, &mut conn)?;
        let mut events = Vec::new();
        while let Some(e) = conn.poll_event() {
            events.push(e);
        }
        let addrs = (self.local, self.peer);
        init.create(conn, self.sock, events, addrs, self.early)
    }

    /// Rejects: sends an MPA Reply with the Reject bit and `private_data`
    /// (≤ [`MAX_PRIVATE_DATA`]), then closes.
    pub fn reject(self, private_data: &[u8]) -> Result<(), CmError> {
        check_private_data(private_data)?;
        let mut conn = self.conn;
        conn.reject(private_data).map_err(accept_error)?;
        send_reply(&self.sock, self.peer, &mut conn)?;
        let _ = self.sock.shutdown(Shutdown::Write);
        Ok(())
    }

    /// Rejects as [`Self::reject`], without closing: returns the
    /// connection, whose next bytes out are whatever the caller writes
    /// after the Reply, and the bytes read behind the Request (an
    /// initiator sends none before the Reply). For an exchange made in
    /// band on a connection that goes on as a byte stream when refused
    /// (`warpsock_xsock`'s switch).
    pub fn refuse(self, private_data: &[u8]) -> Result<(TcpStream, Vec<u8>), CmError> {
        check_private_data(private_data)?;
        let mut conn = self.conn;
        conn.reject(private_data).map_err(accept_error)?;
        send_reply(&self.sock, self.peer, &mut conn)?;
        Ok((self.sock, self.early))
    }
}

/// Writes what the core queued (the MPA Reply) to the blocking socket
/// (raw system calls: [`sys::send_all`]).
fn send_reply(sock: &TcpStream, peer: SocketAddr, conn: &mut Connection) -> Result<(), CmError> {
    let reg: Registry<Mem> = Registry::new();
    let mut out = Vec::new();
    conn.poll_transmit(&reg, &mut out, usize::MAX);
    sys::send_all(sock.as_raw_fd(), &out)
        .map_err(|e| CmError::socket(Some(peer), "MPA reply send", e))
}

fn accept_error(e: AcceptError) -> CmError {
    match e {
        AcceptError::PrivateDataTooLong => CmError::PrivateDataTooLong {
            len: MAX_PRIVATE_DATA + 1,
            max: MAX_PRIVATE_DATA,
        },
        // `NoRequest`: a `ConnectRequest` always holds a pending request.
        e => CmError::Io(io::Error::new(io::ErrorKind::InvalidInput, e)),
    }
}
