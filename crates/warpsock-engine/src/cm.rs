//! The connection manager: TCP connect/listen, the MPA exchange with
//! private data, accept/reject, socket options.
//!
//! Setup runs synchronously on the calling thread over a blocking socket:
//! the core's MPA state machine is driven with the real clock
//! ([`Connection::poll_timeout`] / [`Connection::handle_timeout`]), reading
//! exactly the bytes it asks for so nothing of the FPDU stream is consumed.
//! Once established, the connection and its socket move into the context's
//! progress engine as a [`Qp`].

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use warpsock_proto::wire::{fpdu, mpa};
use warpsock_proto::{
    AcceptError, CloseReason, Config, ConnectError, Connection, Event, PostError, RecvWr, Registry,
    Role, RtrOffer, RxStep,
};

use crate::cq::Cq;
use crate::driver::transport_error;
use crate::mem::Mem;
use crate::pd::Pd;
use crate::qp::Qp;
use crate::sys;

/// Largest application private data in an MPA Request or Reply: 251 bytes
/// keeps the frame within Linux siw's 256-byte limit (with the 4-byte
/// enhanced IRD/ORD word and a spare byte).
pub const MAX_PRIVATE_DATA: usize = mpa::SIW_MAX_ULP_PRIVATE_DATA_LEN;

/// TCP socket options applied to every connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TcpOptions {
    /// `TCP_NODELAY` (default on: FPDUs go out at once, as siw does).
    pub nodelay: bool,
    /// `TCP_USER_TIMEOUT`: unacknowledged data older than this kills the
    /// connection, so a dead peer flushes every request in bounded time
    /// (default 10 s). Zero leaves the kernel default.
    pub user_timeout: Duration,
    /// Keepalive idle time before the first probe (default 5 s); zero
    /// disables keepalive.
    pub keepalive_idle: Duration,
    /// Keepalive probe interval (default 1 s).
    pub keepalive_interval: Duration,
    /// Unanswered keepalive probes before the connection is dropped
    /// (default 5).
    pub keepalive_count: u32,
    /// `SO_SNDBUF`, if set (default: the kernel's autotuning).
    pub send_buffer: Option<usize>,
    /// `SO_RCVBUF`, if set (default: the kernel's autotuning).
    pub recv_buffer: Option<usize>,
}

impl Default for TcpOptions {
    fn default() -> Self {
        Self {
            nodelay: true,
            user_timeout: Duration::from_secs(10),
            keepalive_idle: Duration::from_secs(5),
            keepalive_interval: Duration::from_secs(1),
            keepalive_count: 5,
            send_buffer: None,
            recv_buffer: None,
        }
    }
}

impl TcpOptions {
    fn apply(&self, s: &TcpStream) -> io::Result<()> {
        let fd = s.as_raw_fd();
        s.set_nodelay(self.nodelay)?;
        if !self.user_timeout.is_zero() {
            sys::set_user_timeout(fd, self.user_timeout)?;
        }
        if !self.keepalive_idle.is_zero() {
            sys::set_keepalive(
                fd,
                self.keepalive_idle,
                self.keepalive_interval,
                self.keepalive_count,
            )?;
        }
        if let Some(b) = self.send_buffer {
            sys::set_send_buffer(fd, b)?;
        }
        if let Some(b) = self.recv_buffer {
            sys::set_recv_buffer(fd, b)?;
        }
        Ok(())
    }
}

/// Queue pair and connection options.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QpOptions {
    /// Send queue depth (outstanding send requests).
    pub sq_depth: usize,
    /// Receive queue depth.
    pub rq_depth: usize,
    /// Ask for CRC32c on every FPDU (on if either side asks).
    pub crc: bool,
    /// Ask the peer to insert MPA markers.
    pub markers: bool,
    /// Inbound RDMA Read depth offered.
    pub ird: u16,
    /// Outbound RDMA Read depth wanted.
    pub ord: u16,
    /// Largest IRD the peer may raise ours to by asking for a larger ORD
    /// (siw raises it up to 128, the default). Each inbound Read the peer
    /// may have outstanding is state we keep: lower it for a server
    /// exposed to untrusted peers.
    pub max_ird: u16,
    /// Initiator: offer peer-to-peer setup (RFC 6581) with the
    /// ready-to-receive message types in [`Self::rtr`], so the responder
    /// may send first. Linux siw accepts it. Default on.
    pub peer_to_peer: bool,
    /// Initiator, with [`Self::peer_to_peer`]: which zero-length RTR
    /// messages to offer — RDMA Write (siw's choice, the default), RDMA
    /// Read (Chelsio's default), or both (the responder picks the Write,
    /// unless it prefers Read: [`Self::prefer_read_rtr`]).
    /// Offering neither means no peer-to-peer setup. What was chosen is
    /// [`Negotiated::rtr`](warpsock_proto::Negotiated::rtr).
    pub rtr: RtrOffer,
    /// Responder: when the initiator offers both RTR types, choose the
    /// RDMA Read instead of the Write (default off, as siw).
    pub prefer_read_rtr: bool,
    /// Initiator: private data for the MPA Request (≤ [`MAX_PRIVATE_DATA`]).
    pub private_data: Vec<u8>,
    /// TCP connect timeout.
    pub connect_timeout: Duration,
    /// How long to wait for the peer's MPA Request/Reply.
    pub mpa_timeout: Duration,
    /// Largest ULPDU per FPDU; `None` sizes FPDUs to the TCP MSS as siw
    /// does (one FPDU per segment).
    pub mulpdu: Option<usize>,
    /// Socket options.
    pub tcp: TcpOptions,
}

impl Default for QpOptions {
    fn default() -> Self {
        Self {
            sq_depth: 1024,
            rq_depth: 1024,
            crc: false,
            markers: false,
            ird: 16,
            ord: 16,
            max_ird: 128,
            peer_to_peer: true,
            rtr: RtrOffer {
                write: true,
                read: false,
            },
            prefer_read_rtr: false,
            private_data: Vec::new(),
            connect_timeout: Duration::from_secs(10),
            mpa_timeout: Duration::from_secs(10),
            mulpdu: None,
            tcp: TcpOptions::default(),
        }
    }
}

impl QpOptions {
    fn config(&self, role: Role, pd: &Pd, mss: usize) -> Config {
        let mut c = Config::new(role, pd.id);
        c.crc = self.crc;
        c.markers = self.markers;
        c.ird = self.ird;
        c.ord = self.ord;
        c.max_ird = self.max_ird;
        let offered = self.rtr.write || self.rtr.read;
        c.p2p = (role == Role::Initiator && self.peer_to_peer && offered).then_some(self.rtr);
        c.prefer_read_rtr = self.prefer_read_rtr;
        c.private_data = self.private_data.clone();
        c.mulpdu = self
            .mulpdu
            .unwrap_or_else(|| fpdu::mulpdu_for_mss(mss.max(64)))
            .clamp(64, fpdu::MAX_ULPDU_LEN);
        c.mpa_timeout = self.mpa_timeout;
        c.sq_depth = self.sq_depth;
        c.rq_depth = self.rq_depth;
        c
    }
}

/// What a new queue pair is made of: its protection domain, completion
/// queues (all from one context) and options.
#[derive(Debug, Clone)]
pub struct QpInit<'a> {
    /// Protection domain of the queue pair.
    pub pd: &'a Pd,
    /// Completion queue for send-queue requests.
    pub send_cq: &'a Cq,
    /// Completion queue for receives.
    pub recv_cq: &'a Cq,
    /// Options.
    pub options: QpOptions,
    /// Receives posted before the connection goes live (before the MPA
    /// Reply is sent, or before the initiator's first FPDU), so a Send the
    /// peer issues right after setup always finds a buffer.
    pub recvs: Vec<RecvWr>,
}

impl<'a> QpInit<'a> {
    /// Default options with `pd` and one CQ for both queues.
    pub fn new(pd: &'a Pd, cq: &'a Cq) -> Self {
        Self {
            pd,
            send_cq: cq,
            recv_cq: cq,
            options: QpOptions::default(),
            recvs: Vec::new(),
        }
    }

    fn check(&self, private_data: &[u8]) -> Result<(), CmError> {
        if !Arc::ptr_eq(&self.pd.sh, &self.send_cq.sh)
            || !Arc::ptr_eq(&self.pd.sh, &self.recv_cq.sh)
        {
            return Err(CmError::ContextMismatch);
        }
        check_private_data(private_data)
    }

    fn post_initial(&self, conn: &mut Connection) -> Result<(), CmError> {
        for r in &self.recvs {
            conn.post_recv(r.clone()).map_err(CmError::Post)?;
        }
        Ok(())
    }

    fn create(
        &self,
        conn: Connection,
        sock: TcpStream,
        events: Vec<Event>,
        (local, peer): (SocketAddr, SocketAddr),
        early: Vec<u8>,
    ) -> Result<Qp, CmError> {
        let inner = &self.pd.sh.inner;
        let qi = inner.add_qp(conn, sock, events, early, self.send_cq.id, self.recv_cq.id);
        Ok(Qp {
            sh: Arc::clone(&self.pd.sh),
            qi,
            local,
            peer,
        })
    }
}

fn check_private_data(pd: &[u8]) -> Result<(), CmError> {
    if pd.len() > MAX_PRIVATE_DATA {
        return Err(CmError::PrivateDataTooLong {
            len: pd.len(),
            max: MAX_PRIVATE_DATA,
        });
    }
    Ok(())
}

/// Why connection setup failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CmError {
    /// The address did not resolve.
    #[error("cannot resolve the address: {0}")]
    Resolve(#[source] io::Error),
    /// Nothing accepts connections at that address and port.
    #[error("connection refused by {addr}: nothing is listening on that port")]
    Refused {
        /// Address tried.
        addr: SocketAddr,
    },
    /// No route to the host or network.
    #[error("{addr} is unreachable: {source}")]
    Unreachable {
        /// Address tried.
        addr: SocketAddr,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// A setup step did not finish in time.
    #[error("timed out after {after:?} waiting for the {stage}{}", peer_suffix(*.addr))]
    Timeout {
        /// The peer, when known.
        addr: Option<SocketAddr>,
        /// Which step: "TCP connect", "TCP accept", "MPA reply", "MPA request".
        stage: &'static str,
        /// The time allowed.
        after: Duration,
    },
    /// The connection ended during setup: the peer closed it (FIN), reset
    /// it, it timed out, or another socket error ended it.
    #[error("{reason} while waiting for the {stage}{}", peer_suffix(*.addr))]
    Closed {
        /// The peer, when known.
        addr: Option<SocketAddr>,
        /// Which step: "MPA reply", "MPA request", "MPA reply send".
        stage: &'static str,
        /// How it ended.
        reason: CloseReason,
    },
    /// The responder rejected the connection with this private data.
    #[error("the peer rejected the connection ({} bytes of private data)", .private_data.len())]
    Rejected {
        /// The responder's private data.
        private_data: Vec<u8>,
    },
    /// MPA negotiation failed (malformed frame, incompatible options).
    #[error("MPA setup failed: {0}")]
    Mpa(#[source] ConnectError),
    /// Private data longer than [`MAX_PRIVATE_DATA`].
    #[error("private data of {len} bytes is too long (at most {max} bytes)")]
    PrivateDataTooLong {
        /// Length given.
        len: usize,
        /// Limit.
        max: usize,
    },
    /// The protection domain and completion queues of a [`QpInit`] come
    /// from different contexts.
    #[error("protection domain and completion queues belong to different contexts")]
    ContextMismatch,
    /// A receive in [`QpInit::recvs`] could not be posted.
    #[error("cannot post an initial receive: {0}")]
    Post(#[source] PostError),
    /// Another socket error.
    #[error("socket error: {0}")]
    Io(#[source] io::Error),
}

fn peer_suffix(addr: Option<SocketAddr>) -> String {
    addr.map(|a| format!(" (peer {a})")).unwrap_or_default()
}

impl CmError {
    /// The connection failed during `stage` with a socket error.
    fn socket(addr: Option<SocketAddr>, stage: &'static str, e: io::Error) -> Self {
        match e.raw_os_error() {
            Some(n) if n != 0 => Self::Closed {
                addr,
                stage,
                reason: CloseReason::Transport(transport_error(&e)),
            },
            _ => Self::Io(e),
        }
    }

    fn from_connect(addr: SocketAddr, e: io::Error, after: Duration) -> Self {
        match e.raw_os_error() {
            Some(libc::ECONNREFUSED) => Self::Refused { addr },
            Some(libc::EHOSTUNREACH | libc::ENETUNREACH | libc::EADDRNOTAVAIL) => {
                Self::Unreachable { addr, source: e }
            }
            _ if e.kind() == io::ErrorKind::TimedOut => Self::Timeout {
                addr: Some(addr),
                stage: "TCP connect",
                after,
            },
            _ => Self::Io(e),
        }
    }
}

/// How [`drive_mpa`] finished.
enum MpaDone {
    Established,
    Request(warpsock_proto::ConnectRequest),
}

/// Slack allowed between the MPA deadline and the end of a read timeout
/// set earlier: `SO_RCVTIMEO` is re-set only when a read could overshoot
/// the deadline by more than this (one system call saved per read).
const RCVTIMEO_SLACK: Duration = Duration::from_millis(10);

/// Runs the MPA exchange on a blocking socket until established (initiator)
/// or a Request arrived (responder). Returns how it finished and the bytes
/// read beyond the MPA frame (FPDUs the peer sent right behind it), which
/// belong to the queue pair's stream.
///
/// Reads take whatever has arrived (up to a frame's maximum size) instead
/// of exactly the header and then the private data: one read per frame
/// instead of two, on the path every connection setup waits on.
fn drive_mpa(
    sock: &TcpStream,
    peer: Option<SocketAddr>,
    conn: &mut Connection,
    events: &mut Vec<Event>,
) -> Result<(MpaDone, Vec<u8>), CmError> {
    let reg: Registry<Mem> = Registry::new();
    let mut reg_mut: Registry<Mem> = Registry::new();
    let timeout = conn.config().mpa_timeout;
    let stage = match conn.config().role {
        Role::Initiator => "MPA reply",
        Role::Responder => "MPA request",
    };
    let mut buf = [0u8; mpa::HEADER_LEN + mpa::MAX_PRIVATE_DATA_LEN];
    // Bytes read and not yet fed: buf[off..end].
    let (mut off, mut end) = (0, 0);
    let mut rcvtimeo: Option<Option<Duration>> = None;
    let mut out = Vec::new();
    loop {
        out.clear();
        conn.poll_transmit(&reg, &mut out, usize::MAX);
        if !out.is_empty() {
            (&*sock)
                .write_all(&out)
                .map_err(|e| CmError::socket(peer, stage, e))?;
        }
        while let Some(e) = conn.poll_event() {
            match e {
                Event::Established(_) => {
                    events.push(e);
                    return Ok((MpaDone::Established, buf[off..end].to_vec()));
                }
                Event::ConnectRequest(r) => {
                    return Ok((MpaDone::Request(r), buf[off..end].to_vec()))
                }
                Event::Rejected(private_data) => return Err(CmError::Rejected { private_data }),
                Event::ConnectFailed(ConnectError::Timeout) => {
                    return Err(CmError::Timeout {
                        addr: peer,
                        stage,
                        after: timeout,
                    })
                }
                Event::ConnectFailed(ConnectError::Eof) => {
                    return Err(CmError::Closed {
                        addr: peer,
                        stage,
                        reason: CloseReason::PeerClosed,
                    })
                }
                Event::ConnectFailed(ConnectError::Transport(t)) => {
                    return Err(CmError::Closed {
                        addr: peer,
                        stage,
                        reason: CloseReason::Transport(t),
                    })
                }
                Event::ConnectFailed(e) => {
                    // Send whatever the core queued (e.g. a Terminate).
                    out.clear();
                    conn.poll_transmit(&reg, &mut out, usize::MAX);
                    let _ = (&*sock).write_all(&out);
                    return Err(CmError::Mpa(e));
                }
                other => events.push(other),
            }
        }
        // The core stops reading only once setup is over one way or the
        // other, which the events above report; anything else ends here
        // with the cause it recorded.
        let ended = |conn: &Connection| CmError::Closed {
            addr: peer,
            stage,
            reason: conn.close_reason().unwrap_or(CloseReason::Local),
        };
        let RxStep::Bytes(want) = conn.rx_step() else {
            return Err(ended(conn));
        };
        if off < end {
            // Feed exactly what the core asks for, so that it stops at the
            // frame's end and what follows stays for the queue pair.
            let take = want.clamp(1, end - off);
            let k = conn.rx_bytes(&buf[off..off + take], &mut reg_mut);
            if k == 0 {
                return Err(ended(conn));
            }
            off += k;
            continue;
        }
        let now = Instant::now();
        let want_timeo = match conn.poll_timeout() {
            Some(d) if now >= d => {
                conn.handle_timeout(now);
                continue;
            }
            Some(d) => Some(d - now),
            None => None,
        };
        let stale = match (rcvtimeo, want_timeo) {
            (Some(Some(set)), Some(rest)) => set > rest + RCVTIMEO_SLACK,
            (Some(set), want) => set.is_some() != want.is_some(),
            (None, _) => true,
        };
        if stale {
            sock.set_read_timeout(want_timeo).map_err(CmError::Io)?;
            rcvtimeo = Some(want_timeo);
        }
        match (&*sock).read(&mut buf) {
            Ok(0) => conn.handle_eof(),
            Ok(n) => (off, end) = (0, n),
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock
                        | io::ErrorKind::TimedOut
                        | io::ErrorKind::Interrupted
                ) => {}
            Err(e) => conn.handle_transport_error(transport_error(&e)),
        }
    }
}

/// Connects to `addr` (each resolved address in turn), runs the MPA
/// exchange as initiator and returns the established queue pair.
///
/// Errors say what failed: [`CmError::Refused`] (nothing listening),
/// [`CmError::Unreachable`], [`CmError::Timeout`] (TCP connect or MPA
/// reply), [`CmError::Rejected`] (with the responder's private data),
/// [`CmError::Mpa`] (bad or incompatible reply).
pub fn connect<A: ToSocketAddrs>(addr: A, init: &QpInit<'_>) -> Result<Qp, CmError> {
    let opts = &init.options;
    init.check(&opts.private_data)?;
    let addrs: Vec<SocketAddr> = addr.to_socket_addrs().map_err(CmError::Resolve)?.collect();
    let mut last = CmError::Resolve(io::Error::new(
        io::ErrorKind::NotFound,
        "no address to connect to",
    ));
    let mut sock = None;
    for a in addrs {
        match TcpStream::connect_timeout(&a, opts.connect_timeout) {
            Ok(s) => {
                sock = Some(s);
                break;
            }
            Err(e) => last = CmError::from_connect(a, e, opts.connect_timeout),
        }
    }
    connect_stream(sock.ok_or(last)?, init)
}

/// Runs the MPA exchange as initiator on a TCP connection that is already
/// established (by the caller, or by an application that used it as a
/// plain byte stream first) and returns the queue pair on it.
///
/// The next byte the peer reads from the stream must be the MPA Request
/// this sends, and the next bytes we read must be its MPA Reply: whatever
/// the connection carried before has to be consumed by both ends first.
/// The socket's TCP options become those of `init`. Errors are those of
/// [`connect`] after its TCP step.
pub fn connect_stream(sock: TcpStream, init: &QpInit<'_>) -> Result<Qp, CmError> {
    let opts = &init.options;
    init.check(&opts.private_data)?;
    // Addresses now: a peer that resets right after setup makes them fail.
    let addrs = (
        sock.local_addr().map_err(CmError::Io)?,
        sock.peer_addr().map_err(CmError::Io)?,
    );
    opts.tcp.apply(&sock).map_err(CmError::Io)?;
    let mss = sys::tcp_mss(sock.as_raw_fd()).unwrap_or(1448);
    let mut conn = Connection::new(opts.config(Role::Initiator, init.pd, mss), Instant::now());
    init.post_initial(&mut conn)?;
    let mut events = Vec::new();
    match drive_mpa(&sock, Some(addrs.1), &mut conn, &mut events)? {
        (MpaDone::Established, early) => init.create(conn, sock, events, addrs, early),
        (MpaDone::Request(_), _) => {
            unreachable!("the core reports MPA Requests to responders only")
        }
    }
}

/// A TCP listener that accepts iWARP connections.
#[derive(Debug)]
pub struct Listener {
    sock: TcpListener,
    mpa_timeout: Duration,
}

impl Listener {
    /// Listens on `addr` (port 0 picks a free port; see [`Self::local_addr`]).
    pub fn bind<A: ToSocketAddrs>(addr: A) -> io::Result<Self> {
        let sock = TcpListener::bind(addr)?;
        sock.set_nonblocking(true)?;
        Ok(Self {
            sock,
            mpa_timeout: Duration::from_secs(10),
        })
    }

    /// The bound address.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.sock.local_addr()
    }

    /// How long [`Self::accept`] waits for a connected peer's MPA Request
    /// (default 10 s).
    pub fn set_mpa_timeout(&mut self, t: Duration) {
        self.mpa_timeout = t;
    }

    /// Waits up to `timeout` (`None`: forever) for a connection and its MPA
    /// Request, and returns the request for the application to accept or
    /// reject. A peer that connects but sends no valid Request in time
    /// gives an error (call `accept` again for the next peer).
    pub fn accept(&self, timeout: Option<Duration>) -> Result<ConnectRequest, CmError> {
        let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
        let (sock, _peer) = loop {
            match self.sock.accept() {
                Ok(x) => break x,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
                    if left.is_some_and(|l| l.is_zero()) {
                        return Err(CmError::Timeout {
                            addr: None,
                            stage: "TCP accept",
                            after: timeout.unwrap_or_default(),
                        });
                    }
                    sys::poll_readable(self.sock.as_raw_fd(), left).map_err(CmError::Io)?;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(CmError::Io(e)),
            }
        };
        // Accepted sockets are blocking (accept4 does not inherit the
        // listener's O_NONBLOCK); TCP options are applied on accept.
        ConnectRequest::read(sock, self.mpa_timeout)
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
    /// for the initiator's MPA Request. [`Listener::accept`] is TCP accept
    /// plus this; a server that must not let one slow peer delay the next
    /// accepts on its own socket and reads each Request on its own thread.
    pub fn read(sock: TcpStream, mpa_timeout: Duration) -> Result<Self, CmError> {
        let local = sock.local_addr().map_err(CmError::Io)?;
        let peer = sock.peer_addr().map_err(CmError::Io)?;
        // The responder reads the Request with placeholder options; the
        // application's options replace them when it accepts
        // (`Connection::accept_with`).
        let mut reg: Registry<Mem> = Registry::new();
        let mut cfg = Config::new(Role::Responder, reg.alloc_pd());
        cfg.mpa_timeout = mpa_timeout;
        let mut conn = Connection::new(cfg, Instant::now());
        let mut events = Vec::new();
        match drive_mpa(&sock, Some(peer), &mut conn, &mut events)? {
            (MpaDone::Request(request), early) => Ok(Self {
                sock,
                local,
                peer,
                conn,
                request,
                early,
            }),
            (MpaDone::Established, _) => {
                unreachable!("a responder is established only by accepting")
            }
        }
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
        let mss = sys::tcp_mss(self.sock.as_raw_fd()).unwrap_or(1448);
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
}

/// Writes what the core queued (the MPA Reply) to the blocking socket.
fn send_reply(sock: &TcpStream, peer: SocketAddr, conn: &mut Connection) -> Result<(), CmError> {
    let reg: Registry<Mem> = Registry::new();
    let mut out = Vec::new();
    conn.poll_transmit(&reg, &mut out, usize::MAX);
    (&*sock)
        .write_all(&out)
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
