//! Driving the core's MPA exchange over a socket: the part shared by the
//! initiator's blocking [`drive_mpa`] and the listener's non-blocking
//! handshakes ([`super::listener`]).

use std::io;
use std::net::{SocketAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use warpsock_proto::wire::mpa;
use warpsock_proto::{
    CloseReason, Config, ConnectError, Connection, Event, Registry, Role, RxStep,
};

use super::CmError;
use crate::error::transport_error;
use crate::mem::Mem;
use crate::sys;

/// How an MPA exchange finished.
pub(super) enum MpaDone {
    /// Initiator: established.
    Established,
    /// Responder: the initiator's Request arrived.
    Request(warpsock_proto::ConnectRequest),
}

/// One MPA exchange in progress on a socket: the core's connection and the
/// bytes read from the socket and not yet fed to it.
///
/// Reads take whatever has arrived (up to a frame's maximum size) instead
/// of exactly the header and then the private data: one read per frame
/// instead of two, on the path every connection setup waits on. The core
/// is fed exactly what it asks for, so it stops at the frame's end and
/// what follows (FPDUs sent right behind the frame) stays for the queue
/// pair ([`Self::early`]).
#[derive(Debug)]
pub(super) struct MpaExchange {
    pub(super) conn: Connection,
    pub(super) peer: Option<SocketAddr>,
    /// Which frame we wait for: "MPA reply" or "MPA request".
    pub(super) stage: &'static str,
    buf: Box<[u8]>,
    /// Bytes read and not yet fed: `buf[off..end]`.
    off: usize,
    end: usize,
    /// Events other than the outcome, in order (the initiator's queue pair
    /// starts with them).
    pub(super) events: Vec<Event>,
}

impl MpaExchange {
    pub(super) fn new(conn: Connection, peer: Option<SocketAddr>) -> Self {
        let stage = match conn.config().role {
            Role::Initiator => "MPA reply",
            Role::Responder => "MPA request",
        };
        Self {
            conn,
            peer,
            stage,
            buf: vec![0; mpa::HEADER_LEN + mpa::MAX_PRIVATE_DATA_LEN].into_boxed_slice(),
            off: 0,
            end: 0,
            events: Vec::new(),
        }
    }

    /// A responder waiting `mpa_timeout` for the Request, with placeholder
    /// options (the application's replace them when it accepts:
    /// `Connection::accept_with`).
    pub(super) fn responder(peer: SocketAddr, mpa_timeout: Duration, now: Instant) -> Self {
        let mut reg: Registry<Mem> = Registry::new();
        let mut cfg = Config::new(Role::Responder, reg.alloc_pd());
        cfg.mpa_timeout = mpa_timeout;
        Self::new(Connection::new(cfg, now), Some(peer))
    }

    /// Stream bytes read beyond the MPA frame.
    pub(super) fn early(&self) -> Vec<u8> {
        self.buf[self.off..self.end].to_vec()
    }

    /// Sends what the core queued, reacts to its events and feeds it what
    /// was read. `Ok(Some(..))`: the exchange is over; `Ok(None)`: it needs
    /// more input (everything read has been fed).
    pub(super) fn advance(&mut self, sock: &TcpStream) -> Result<Option<MpaDone>, CmError> {
        let reg: Registry<Mem> = Registry::new();
        let mut reg_mut: Registry<Mem> = Registry::new();
        let mut out = Vec::new();
        loop {
            out.clear();
            self.conn.poll_transmit(&reg, &mut out, usize::MAX);
            if !out.is_empty() {
                sys::send_all(sock.as_raw_fd(), &out)
                    .map_err(|e| CmError::socket(self.peer, self.stage, e))?;
            }
            while let Some(e) = self.conn.poll_event() {
                match e {
                    Event::Established(_) => {
                        self.events.push(e);
                        return Ok(Some(MpaDone::Established));
                    }
                    Event::ConnectRequest(r) => return Ok(Some(MpaDone::Request(r))),
                    Event::Rejected(private_data) => {
                        return Err(CmError::Rejected {
                            private_data,
                            early: self.early(),
                        })
                    }
                    Event::ConnectFailed(e) => return Err(self.failed(sock, e)),
                    other => self.events.push(other),
                }
            }
            // The core stops reading only once setup is over one way or
            // the other, which the events above report; anything else ends
            // here with the cause it recorded.
            let RxStep::Bytes(want) = self.conn.rx_step() else {
                return Err(self.ended());
            };
            if self.off == self.end {
                return Ok(None);
            }
            let take = want.clamp(1, self.end - self.off);
            let k = self
                .conn
                .rx_bytes(&self.buf[self.off..self.off + take], &mut reg_mut);
            if k == 0 {
                return Err(self.ended());
            }
            self.off += k;
        }
    }

    /// Reads into the buffer (only called once everything read was fed),
    /// never blocking (`MSG_DONTWAIT`, whatever the socket's mode): what a
    /// read returns goes to the core, EOF and errors included. Returns
    /// whether the read would block. The raw system call, as the writes
    /// ([`sys::send_all`]): std's `read` is libc's `recv`, a cancellation
    /// point.
    pub(super) fn read_from(&mut self, sock: &TcpStream) -> bool {
        match sys::recv_dontwait(sock.as_raw_fd(), &mut self.buf) {
            Ok(0) => self.conn.handle_eof(),
            Ok(n) => (self.off, self.end) = (0, n),
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                return true
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => self.conn.handle_transport_error(transport_error(&e)),
        }
        false
    }

    /// The error for a failed setup (after sending what the core queued for
    /// it, e.g. a Terminate).
    fn failed(&mut self, sock: &TcpStream, e: ConnectError) -> CmError {
        let (addr, stage) = (self.peer, self.stage);
        match e {
            ConnectError::Timeout => CmError::Timeout {
                addr,
                stage,
                after: self.conn.config().mpa_timeout,
            },
            ConnectError::Eof => CmError::Closed {
                addr,
                stage,
                reason: CloseReason::PeerClosed,
            },
            ConnectError::Transport(t) => CmError::Closed {
                addr,
                stage,
                reason: CloseReason::Transport(t),
            },
            e => {
                let reg: Registry<Mem> = Registry::new();
                let mut out = Vec::new();
                self.conn.poll_transmit(&reg, &mut out, usize::MAX);
                let _ = sys::send_all(sock.as_raw_fd(), &out);
                CmError::Mpa(e)
            }
        }
    }

    fn ended(&self) -> CmError {
        CmError::Closed {
            addr: self.peer,
            stage: self.stage,
            reason: self.conn.close_reason().unwrap_or(CloseReason::Local),
        }
    }
}

/// Runs an MPA exchange on a blocking socket until established (initiator)
/// or a Request arrived (responder), with the real clock driving the
/// core's timeout. Returns how it finished; [`MpaExchange::early`] then has
/// the bytes read beyond the frame.
///
/// Each wait is a `poll` for input up to the core's deadline, then a read
/// of what came (it never blocks): `poll` also reports entries in the
/// socket's error queue (`POLLERR` with nothing to read), which a read
/// never takes, and those are dropped here ([`sys::drain_error_queue`]).
/// They are transmit stamps a program's `SO_TIMESTAMPING` asked for, of
/// bytes it sent before it handed the socket over (the preload's switch):
/// they come as the peer acknowledges them, during the exchange, and are
/// charged to the receive buffer. Left there, they filled it: a segment
/// that came then (the peer's last mark) was acknowledged with a zero
/// window (`ICSK_ACK_NOMEM`) that nothing reopened, and the peer's Reply
/// was dropped until the exchange's timeout (a blocking read waited it
/// out: the stamps do not end it). A drop takes at least one entry and
/// the deadline bounds the loop.
pub(super) fn drive_mpa(sock: &TcpStream, x: &mut MpaExchange) -> Result<MpaDone, CmError> {
    let fd = sock.as_raw_fd();
    loop {
        if let Some(done) = x.advance(sock)? {
            return Ok(done);
        }
        let now = Instant::now();
        let rest = match x.conn.poll_timeout() {
            Some(d) if now >= d => {
                x.conn.handle_timeout(now);
                continue;
            }
            Some(d) => Some(d - now),
            None => None,
        };
        let mut p = [libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        }];
        // Nothing ready (the deadline, or a signal): the clock is looked
        // at again above.
        if sys::poll(&mut p, rest).map_err(|e| CmError::socket(x.peer, x.stage, e))? == 0 {
            continue;
        }
        let ev = p[0].revents;
        if ev & libc::POLLERR != 0 && sys::drain_error_queue(fd) > 0 && ev & libc::POLLIN == 0 {
            continue;
        }
        x.read_from(sock);
    }
}
