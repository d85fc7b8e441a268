//! The connection manager: TCP connect/listen, the MPA exchange with
//! private data, accept/reject, socket options.
//!
//! * this module: options ([`TcpOptions`], [`QpOptions`], [`QpInit`]) and
//!   the initiator ([`connect`], [`connect_stream`]), which runs setup
//!   synchronously on the calling thread over a blocking socket;
//! * `listener`: the responder ([`Listener`], [`ConnectRequest`]), which
//!   runs many handshakes at once without blocking on any;
//! * `mpa`: driving the core's MPA state machine over a socket with the
//!   real clock ([`Connection::poll_timeout`] /
//!   [`Connection::handle_timeout`]), feeding it exactly the bytes it asks
//!   for so nothing of the FPDU stream is consumed;
//! * [`CmError`] (in `crate::error`, which the handle modules depend on).
//!
//! Once established, the connection and its socket move into the context's
//! progress engine as a [`Qp`].

mod listener;
mod mpa;

use std::io;
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use warpsock_proto::wire::{fpdu, mpa as wire_mpa};
use warpsock_proto::{Config, Connection, Event, RecvWr, Role, RtrOffer};

use crate::cq::Cq;
use crate::pd::Pd;
use crate::qp::Qp;
use crate::sys;

pub use crate::error::CmError;
pub use listener::{
    ConnectRequest, Listener, ACCEPT_PAUSE, DEFAULT_MAX_PENDING, DEFAULT_MPA_REQUEST_TIMEOUT,
};
use mpa::{drive_mpa, MpaDone, MpaExchange};

/// Largest application private data in an MPA Request or Reply: 251 bytes
/// keeps the frame within Linux siw's 256-byte limit (with the 4-byte
/// enhanced IRD/ORD word and a spare byte).
pub const MAX_PRIVATE_DATA: usize = wire_mpa::SIW_MAX_ULP_PRIVATE_DATA_LEN;

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
    /// Largest ULPDU per FPDU; `None` sizes FPDUs to the kernel's GSO unit
    /// (as many whole TCP segments as fit in 64 KiB, as siw does with GSO
    /// allowed); towards a loopback address, where no wire segments the
    /// stream and `TCP_MAXSEG` at setup is only half the peer's first
    /// window, to the largest FPDU MPA allows (64 KiB). One FPDU per TCP
    /// segment (siw's default) is `mulpdu_for_mss(mss)`.
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

/// Connects to `addr` (each resolved address in turn), runs the MPA
/// exchange as initiator and returns the established queue pair.
///
/// Errors say what failed: [`CmError::Refused`] (nothing listening),
/// [`CmError::Unreachable`], [`CmError::Timeout`] (TCP connect or MPA
/// reply), [`CmError::Rejected`] (with the responder's private data),
/// [`CmError::Mpa`] (bad or incompatible reply), [`CmError::Closed`] (the
/// peer closed or reset the connection, or it timed out, during setup).
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
                // Out of the program's numbers (`crate::fds`).
                sock = Some(crate::fds::lift_owned(s));
                break;
            }
            Err(e) => last = CmError::from_connect(a, e, opts.connect_timeout),
        }
    }
    connect_stream(sock.ok_or(last)?, init)
}

/// The segment size FPDUs are fitted to when [`QpOptions::mulpdu`] is
/// `None` (see [`gso_segment`]): towards a loopback address, the largest
/// FPDU MPA's 16-bit length allows (64 KiB); on other paths, the kernel's
/// GSO unit, as many whole `TCP_MAXSEG` segments as fit in 64 KiB.
///
/// On loopback there is no wire to segment for: the kernel queues the
/// sender's whole 64 KiB GSO buffers at the receiver, and `TCP_MAXSEG`
/// (≈ 32 KiB at setup) is not a path property but half the peer's first
/// window (`tcp_bound_to_half_wnd`). FPDUs of that size cost the receiver
/// one read per 32 KiB (its placement reads end at FPDU boundaries);
/// 64 KiB FPDUs halve the reads and wake-ups per MiB. A siw peer behind a
/// loopback port forward (qemu) received 32 KiB FPDUs over its 1,500-byte
/// link before, so fitting segments was already moot there.
fn fpdu_segment(sock: &TcpStream, peer: SocketAddr) -> usize {
    let loopback = match peer.ip() {
        std::net::IpAddr::V4(a) => a.is_loopback(),
        std::net::IpAddr::V6(a) => {
            a.is_loopback() || a.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback())
        }
    };
    if loopback {
        // `mulpdu_for_mss` turns this into the largest 8-aligned FPDU.
        return 1 << 16;
    }
    gso_segment(sys::tcp_mss(sock.as_raw_fd()).unwrap_or(1448))
}

/// The FPDU segment for a path with `TCP_MAXSEG` `mss`: as many whole
/// segments as fit in the largest FPDU (64 KiB), which is what siw sends
/// when GSO is allowed (`siw_update_tcpseg`: `mss_cache × gso_segs`, the
/// kernel's GSO unit being at most 64 KiB). Linux TCP hands the device
/// (or software GSO) buffers of that size, so FPDUs start on a segment
/// boundary at the start of each one.
///
/// One FPDU per MSS (siw's default, `gso_seg_limit = 1`) only helps a
/// receiver that places each TCP segment on its own, out of order: a
/// hardware RNIC. A software receiver (warpsock, siw) reads the stream in
/// order anyway, and MSS-sized FPDUs cost it a header, a placement and a
/// copy out of staging per 1.4 KB: on a veth pair (MTU 1500, 1 % loss)
/// GSO-sized FPDUs took the engine's CPU per GB from 0.57–0.78 s to
/// 0.43–0.56 s for Send and Write (session 12, issue 12). A receiver
/// accepts any length the FPDU's 16-bit field allows (siw does; see
/// `siw-compat.md`); towards an RNIC that places per segment, set
/// [`QpOptions::mulpdu`] to `warpsock_proto::wire::fpdu::mulpdu_for_mss(mss)`.
fn gso_segment(mss: usize) -> usize {
    let mss = mss.clamp(64, 1 << 16);
    mss * ((1 << 16) / mss)
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
    // The queue pair reads in blocking mode with a timeout (the MPA
    // exchange polls, then reads what came): a socket adopted in
    // non-blocking mode (a program that connected non-blocking) would
    // make every wait spin in `recv`.
    sock.set_nonblocking(false).map_err(CmError::Io)?;
    opts.tcp.apply(&sock).map_err(CmError::Io)?;
    let mss = fpdu_segment(&sock, addrs.1);
    let mut conn = Connection::new(opts.config(Role::Initiator, init.pd, mss), Instant::now());
    init.post_initial(&mut conn)?;
    let mut x = MpaExchange::new(conn, Some(addrs.1));
    match drive_mpa(&sock, &mut x)? {
        MpaDone::Established => {
            let early = x.early();
            init.create(x.conn, sock, x.events, addrs, early)
        }
        MpaDone::Request(_) => {
            unreachable!("the core reports MPA Requests to responders only")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::gso_segment;
    use warpsock_proto::wire::fpdu::mulpdu_for_mss;

    /// Off loopback, FPDUs fill the GSO unit: whole MSS-sized segments,
    /// as many as fit in 64 KiB (an MTU-1500 path: 45 × 1448 B), not one
    /// segment each.
    #[test]
    fn fpdus_off_loopback_fill_whole_segments_of_the_gso_unit() {
        assert_eq!(gso_segment(1448), 45 * 1448);
        assert_eq!(gso_segment(8948), 7 * 8948);
        assert_eq!(gso_segment(65483), 65483);
        assert_eq!(gso_segment(1 << 16), 1 << 16);
        // A tiny or absurd MSS stays within MPA's length field.
        assert!(gso_segment(1) <= 1 << 16 && gso_segment(1) >= 64);
        assert!(gso_segment(1 << 20) <= 1 << 16);
        // Each FPDU carries more than 40 times what one MSS-sized one did.
        assert!(mulpdu_for_mss(gso_segment(1448)) > 40 * mulpdu_for_mss(1448));
    }
}
