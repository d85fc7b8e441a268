//! `udp`: the host UDP baseline, and the datagram endpoint every UDP
//! transport shares ([`Datagrams`]; the UDP offload runs this same code
//! with both processes under the preload library).
//!
//! One connected UDP socket pair per flow, plus a companion TCP connection
//! to the server's control port that carries the setup (token and ports)
//! and the FINs, since a datagram FIN could be lost.
//!
//! Datagrams are built like TCP messages (stamps + shared body, one
//! `writev` / `readv` each). Nothing is retransmitted: a bandwidth sender
//! sends as fast as the socket takes datagrams, receivers count what
//! arrives (loss = sent − received), and a ping without an answer within
//! [`LOSS_TIMEOUT`] counts as lost. The FIN carries the sender's count:
//! after it a receiver keeps draining until that many datagrams arrived or
//! none came for the transport's grace time. Bandwidth is what arrived
//! over the receiver's arrival span.

use std::io::{self, Read, Write};
use std::net::{IpAddr, Shutdown, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use super::gso::{Batch, Gro};
use super::sock::{self, poll_sockets, Frame, Pass, CONNECT_WAIT};
use crate::driver::{self, Accept, Addrs, Endpoint, Event, Job, Link, Listeners, Ready};
use crate::spec::{Family, Role, TransportInfo};
use crate::stats::Jitter;
use crate::Error;

/// A ping unanswered this long is lost.
pub(crate) const LOSS_TIMEOUT: Duration = Duration::from_millis(50);

/// What it is.
pub(crate) static INFO: TransportInfo = TransportInfo {
    name: "udp",
    label: "host UDP",
    help: "host UDP through plain sockets (datagrams; loss is counted)",
    family: Family::Datagram,
    crc: false,
    pull: false,
    baseline: "udp",
    quick: false,
    setup: false,
    preload: None,
};

/// The transport: host UDP; after the peer's FIN, receive until no
/// datagram came for 20 ms.
pub(crate) static UDP: Datagrams = Datagrams {
    info: &INFO,
    grace: Duration::from_millis(20),
    gso: false,
};

/// A datagram transport: this file's flows, described by `info`, with
/// `grace`: how long a receiver drains after the peer's FIN while
/// datagrams are missing; `gso`: bandwidth flows batch their datagrams
/// themselves ([`super::gso`]: `UDP_SEGMENT` sends, `UDP_GRO` receives).
pub(crate) struct Datagrams {
    pub(crate) info: &'static TransportInfo,
    pub(crate) grace: Duration,
    pub(crate) gso: bool,
}

impl Link for Datagrams {
    fn info(&self) -> &'static TransportInfo {
        self.info
    }

    fn connect(&self, job: &Job<'_>, to: &Addrs) -> Result<Box<dyn Endpoint>, Error> {
        let f = connect(to.ctl, to.token)?;
        Ok(Box::new(UdpEndpoint::new(job, vec![f], self)?))
    }

    fn accept(
        &self,
        job: &Job<'_>,
        at: &Listeners<'_>,
        threads: usize,
        ready: Ready<'_>,
    ) -> Result<Vec<Box<dyn Endpoint>>, Error> {
        ready()?;
        let flows = accept(at.ctl, at.token, job.spec.conns)?;
        driver::endpoints(flows, threads, |fs| UdpEndpoint::new(job, fs, self))
    }
}

/// A UDP socket pair and its companion TCP connection.
pub(crate) struct Flow {
    u: UdpSocket,
    t: TcpStream,
}

fn port_of(b: [u8; 2]) -> u16 {
    u16::from_be_bytes(b)
}

/// Client side: companion connection to the control port, then the UDP
/// socket connected to the server's.
pub(crate) fn connect(addr: SocketAddr, token: u64) -> Result<Flow, Error> {
    let mut t = sock::connect(addr, token)?;
    let u = UdpSocket::bind(SocketAddr::new(t.local_addr()?.ip(), 0))?;
    t.write_all(&u.local_addr()?.port().to_be_bytes())?;
    let mut b = [0u8; 2];
    t.set_read_timeout(Some(CONNECT_WAIT))?;
    t.read_exact(&mut b)?;
    u.connect(SocketAddr::new(addr.ip(), port_of(b)))?;
    Ok(Flow { u, t })
}

/// Server side: `n` companions (with the token), each with its own UDP
/// socket connected to the client's.
pub(crate) fn accept(l: &dyn Accept, token: u64, n: usize) -> Result<Vec<Flow>, Error> {
    sock::accept_n(l, token, n)?
        .into_iter()
        .map(|mut t| {
            let mut b = [0u8; 2];
            t.read_exact(&mut b)?;
            let u = bind_numbered(t.local_addr()?.ip())?;
            u.connect(SocketAddr::new(t.peer_addr()?.ip(), port_of(b)))?;
            t.write_all(&u.local_addr()?.port().to_be_bytes())?;
            Ok(Flow { u, t })
        })
        .collect()
}

/// Binds a UDP socket on `ip` to a port number chosen up front, not to
/// port 0: the offload layer listens on the matching TCP port only for
/// sockets bound to a named port. The port is one the kernel just gave a
/// TCP listener (free for TCP too); a race with another program for it
/// is retried.
fn bind_numbered(ip: IpAddr) -> Result<UdpSocket, Error> {
    let mut last = None;
    for _ in 0..20 {
        let port = TcpListener::bind(SocketAddr::new(ip, 0))?
            .local_addr()?
            .port();
        match UdpSocket::bind(SocketAddr::new(ip, port)) {
            Ok(u) => return Ok(u),
            Err(e) => last = Some(e),
        }
    }
    Err(Error::msg(format!(
        "cannot bind a UDP socket on {ip}: {}",
        last.map_or_else(String::new, |e| e.to_string())
    )))
}

/// `writev` of the message pieces on a connected socket.
fn send_parts(fd: i32, p: [&[u8]; 3]) -> io::Result<usize> {
    let iov: Vec<libc::iovec> = p
        .iter()
        .filter(|x| !x.is_empty())
        .map(|x| libc::iovec {
            iov_base: x.as_ptr() as *mut libc::c_void,
            iov_len: x.len(),
        })
        .collect();
    // SAFETY: the iovecs point into live slices for the call's duration.
    let r = unsafe { libc::writev(fd, iov.as_ptr(), iov.len() as i32) };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r as usize)
    }
}

/// `readv` of one datagram into the message pieces.
fn recv_parts(fd: i32, p: [&mut [u8]; 3]) -> io::Result<usize> {
    let iov: Vec<libc::iovec> = p
        .into_iter()
        .filter(|x| !x.is_empty())
        .map(|x| libc::iovec {
            iov_base: x.as_mut_ptr().cast(),
            iov_len: x.len(),
        })
        .collect();
    // SAFETY: the iovecs point into live, exclusively borrowed slices.
    let r = unsafe { libc::readv(fd, iov.as_ptr(), iov.len() as i32) };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r as usize)
    }
}

/// Whether `size`-byte datagrams of a bandwidth test carry their send time
/// (CLOCK_MONOTONIC ns, in bytes 8..16, between the stamps, instead of the
/// pattern there) for the receiver's jitter: whole messages from 24 bytes
/// up to the gather size.
fn carries_time(size: usize) -> bool {
    size >= 24 && !crate::data::gathered(size)
}

/// This host's monotonic clock, ns.
fn now_ns() -> u64 {
    // SAFETY: timespec is plain data.
    let mut t: libc::timespec = unsafe { std::mem::zeroed() };
    // SAFETY: a valid out pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut t) };
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// The bits of a sequence number a `size`-byte datagram carries.
fn seq_mask(size: usize) -> u64 {
    if size >= 8 {
        u64::MAX
    } else {
        (1u64 << (8 * size)) - 1
    }
}

fn would_block(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::WouldBlock || e.raw_os_error() == Some(libc::ENOBUFS)
}

/// A local firewall dropped the datagram on its way out (`EPERM`): it
/// counts as sent and lost, as on the wire.
fn dropped(r: io::Result<usize>) -> io::Result<usize> {
    match r {
        Err(e) if e.raw_os_error() == Some(libc::EPERM) => Ok(0),
        r => r,
    }
}

struct FlowState {
    f: Flow,
    /// What arrived last on this flow (its own stamps; bodies are shared).
    rx: Frame,
    /// A datagram the socket would not take yet (its sequence number).
    pending: Option<u64>,
    /// The ping out and not answered.
    ping: Option<u64>,
    /// Pong: the datagram in `rx` waits to be echoed.
    echo_due: bool,
    fin_buf: [u8; 8],
    fin_got: usize,
    peer_eof: bool,
    peer_fin_told: bool,
    /// Last datagram (or the peer's FIN) seen once the FIN arrived.
    drain_last: Option<Instant>,
    /// Datagrams received on this flow.
    rx_count: u64,
    /// RFC 3550 interarrival jitter of the timestamped datagrams.
    jitter: Jitter,
    /// Datagrams gathered for one `UDP_SEGMENT` send (a batching
    /// transport's data source), and whether the socket refused the last
    /// attempt to send them.
    batch: Option<Batch>,
    stuck: bool,
    /// A batching transport's data sink: `UDP_GRO` receives.
    gro: Option<Gro>,
}

impl FlowState {
    fn peer_fin(&self) -> bool {
        self.fin_got == 8
    }

    /// Whether receiving is over: the peer's FIN is in and either every
    /// datagram it counted arrived, or none came for `grace`.
    fn drained(&self, receives: bool, now: Instant, grace: Duration) -> bool {
        self.peer_fin()
            && (!receives
                || self.rx_count >= u64::from_le_bytes(self.fin_buf)
                || self.drain_last.is_some_and(|t| now >= t + grace))
    }
}

/// One thread's datagram flows.
struct UdpEndpoint {
    flows: Vec<FlowState>,
    role: Role,
    size: usize,
    verify: bool,
    busy: Duration,
    grace: Duration,
    tx: Frame,
    tx_body: Vec<u8>,
    rx_body: Vec<u8>,
    /// The datagrams carry their send time (bandwidth tests, see
    /// [`carries_time`]).
    timed: bool,
    /// The pattern bytes a send time stands in for.
    pat: [u8; 16],
}

impl UdpEndpoint {
    fn new(job: &Job<'_>, flows: Vec<Flow>, link: &Datagrams) -> Result<Self, Error> {
        let size = job.spec.size;
        let (batches, gro) = match job.role {
            Role::Source => (link.gso, false),
            Role::Sink => (false, link.gso),
            Role::Both => (link.gso, link.gso),
            Role::Ping | Role::Pong => (false, false),
        };
        let mut fs = Vec::with_capacity(flows.len());
        for f in flows {
            f.u.set_nonblocking(true)?;
            f.t.set_nonblocking(true)?;
            let fd = f.u.as_raw_fd();
            fs.push(FlowState {
                batch: if batches { Batch::new(size) } else { None },
                stuck: false,
                gro: if gro { Gro::on(fd) } else { None },
                f,
                rx: Frame::new(size),
                pending: None,
                ping: None,
                echo_due: false,
                fin_buf: [0; 8],
                fin_got: 0,
                peer_eof: false,
                peer_fin_told: false,
                drain_last: None,
                rx_count: 0,
                jitter: Jitter::default(),
            });
        }
        Ok(Self {
            flows: fs,
            role: job.role,
            size,
            verify: job.spec.verify,
            busy: job.spec.busy_poll(),
            grace: link.grace,
            tx: Frame::new(size),
            tx_body: sock::body(size),
            rx_body: sock::body(size),
            timed: carries_time(size) && !matches!(job.role, Role::Ping | Role::Pong),
            pat: {
                let mut p = [0u8; 16];
                crate::data::fill(&mut p);
                p
            },
        })
    }

    /// Sends datagram `seq` on flow `i`; `false` if the socket would not
    /// take it now.
    fn send(&mut self, i: usize, seq: u64) -> Result<bool, Error> {
        self.tx.stamp(seq);
        if self.timed {
            self.tx.own[8..16].copy_from_slice(&now_ns().to_le_bytes());
        }
        if self.flows[i].batch.is_some() {
            if self.flows[i].batch.as_ref().is_some_and(Batch::is_full) && !self.flush(i)? {
                return Ok(false);
            }
            let b = self.flows[i].batch.as_mut().expect("batching");
            b.push(self.tx.parts(&self.tx_body));
            if b.due() {
                self.flush(i)?;
            }
            return Ok(true);
        }
        let fd = self.flows[i].f.u.as_raw_fd();
        match dropped(send_parts(fd, self.tx.parts(&self.tx_body))) {
            Ok(_) => Ok(true),
            Err(e) if would_block(&e) => Ok(false),
            Err(e) => Err(Error::msg(format!("UDP send: {e}"))),
        }
    }

    /// Sends flow `i`'s batch; `false` if the socket would not take it now
    /// (it is tried again once the socket is writable).
    fn flush(&mut self, i: usize) -> Result<bool, Error> {
        let s = &mut self.flows[i];
        let Some(b) = s.batch.as_mut() else {
            return Ok(true);
        };
        let sent = b
            .flush(s.f.u.as_raw_fd())
            .map_err(|e| Error::msg(format!("UDP send: {e}")))?;
        s.stuck = !sent;
        Ok(sent)
    }

    /// Receives what waits on flow `i` (a pong stops at one datagram, to
    /// echo it before the next overwrites it).
    fn receive(&mut self, i: usize, out: &mut Vec<Event>) -> Result<bool, Error> {
        let (role, size, verify) = (self.role, self.size, self.verify);
        let s = &mut self.flows[i];
        let fd = s.f.u.as_raw_fd();
        let mut moved = false;
        for _ in 0..64 {
            if s.echo_due {
                break;
            }
            let parts = s.rx.parts_mut(&mut self.rx_body);
            let got = match s.gro.as_mut() {
                Some(g) => g.read_into(fd, parts),
                None => recv_parts(fd, parts),
            };
            match got {
                Ok(n) => {
                    moved = true;
                    if self.timed && n == size {
                        // Both clocks are this host's.
                        let sent = u64::from_le_bytes(s.rx.own[8..16].try_into().expect("8"));
                        s.rx.own[8..16].copy_from_slice(&self.pat[8..16]);
                        s.jitter.arrived(now_ns() as i64 - sent as i64);
                    }
                    let seq = if n == size {
                        s.rx.seq_of(&self.rx_body, verify)
                    } else {
                        None
                    };
                    s.rx_count += 1;
                    if s.peer_fin() {
                        s.drain_last = Some(Instant::now());
                    }
                    // Short datagrams carry the low bytes of the number.
                    let answer = match (s.ping, seq) {
                        (Some(want), Some(got)) if want & seq_mask(size) == got => {
                            s.ping = None;
                            true
                        }
                        _ => false,
                    };
                    s.echo_due = role == Role::Pong;
                    out.push(Event::Arrived {
                        conn: i,
                        len: n,
                        ok: seq.is_some(),
                        answer,
                    });
                }
                Err(e) if would_block(&e) => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(Error::msg(format!("UDP receive: {e}"))),
            }
        }
        Ok(moved)
    }

    /// Reads the peer's FIN (8 bytes) and end-of-file on the companion.
    fn companion(&mut self, i: usize) -> Result<bool, Error> {
        let s = &mut self.flows[i];
        let mut moved = false;
        while !s.peer_eof {
            let r = if s.peer_fin() {
                let mut x = [0u8; 1];
                s.f.t.read(&mut x)
            } else {
                s.f.t.read(&mut s.fin_buf[s.fin_got..])
            };
            match r {
                Ok(0) if !s.peer_fin() => {
                    return Err(Error::msg("the peer closed the UDP flow without its FIN"))
                }
                Ok(0) => {
                    s.peer_eof = true;
                    moved = true;
                }
                Ok(n) if !s.peer_fin() => {
                    s.fin_got += n;
                    moved = true;
                    if s.peer_fin() {
                        s.drain_last = Some(Instant::now());
                    }
                }
                Ok(_) => return Err(Error::msg("unexpected bytes after the peer's FIN")),
                Err(e) if would_block(&e) => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(moved)
    }

    /// The earliest end of a drain in progress.
    fn drain_deadline(&self) -> Option<Instant> {
        self.flows
            .iter()
            .filter(|s| !s.peer_fin_told)
            .filter_map(|s| s.drain_last)
            .map(|t| t + self.grace + Duration::from_millis(1))
            .min()
    }
}

impl Pass for UdpEndpoint {
    fn pass(&mut self, out: &mut Vec<Event>) -> Result<bool, Error> {
        let receives = self.role.receives();
        let mut moved = false;
        for i in 0..self.flows.len() {
            if self.flows[i].stuck {
                moved |= self.flush(i)?;
            }
            if let Some(seq) = self.flows[i].pending {
                if self.send(i, seq)? {
                    self.flows[i].pending = None;
                    out.push(Event::Sent { conn: i });
                    moved = true;
                }
            }
            if receives {
                moved |= self.receive(i, out)?;
            }
            moved |= self.companion(i)?;
            let now = Instant::now();
            let s = &mut self.flows[i];
            if !s.peer_fin_told && s.peer_eof && s.drained(receives, now, self.grace) {
                s.peer_fin_told = true;
                out.push(Event::PeerFin { conn: i });
                moved = true;
            }
        }
        Ok(moved)
    }

    fn fds(&self, into: &mut Vec<libc::pollfd>) {
        for s in &self.flows {
            let mut events = 0;
            if self.role.receives() && !s.echo_due {
                events |= libc::POLLIN;
            }
            if s.pending.is_some() || s.stuck {
                events |= libc::POLLOUT;
            }
            into.push(libc::pollfd {
                fd: s.f.u.as_raw_fd(),
                events,
                revents: 0,
            });
            into.push(libc::pollfd {
                fd: s.f.t.as_raw_fd(),
                events: if s.peer_eof { 0 } else { libc::POLLIN },
                revents: 0,
            });
        }
    }
}

impl Endpoint for UdpEndpoint {
    fn conns(&self) -> usize {
        self.flows.len()
    }

    fn ready(&self, conn: usize) -> bool {
        self.flows[conn].pending.is_none()
    }

    fn start(&mut self, conn: usize, seq: u64) -> Result<bool, Error> {
        if self.role == Role::Ping {
            self.flows[conn].ping = Some(seq);
        }
        if self.send(conn, seq)? {
            return Ok(false);
        }
        self.flows[conn].pending = Some(seq);
        Ok(true)
    }

    fn echo(&mut self, conn: usize) -> Result<(), Error> {
        let s = &mut self.flows[conn];
        if !std::mem::take(&mut s.echo_due) {
            return Ok(());
        }
        match send_parts(s.f.u.as_raw_fd(), s.rx.parts(&self.rx_body)) {
            // A full socket buffer drops the echo, as on a lossy link.
            Err(e) if !would_block(&e) => Err(Error::msg(format!("UDP echo: {e}"))),
            _ => Ok(()),
        }
    }

    fn fin(&mut self, conn: usize, count: u64) -> Result<bool, Error> {
        if self.flows[conn]
            .batch
            .as_ref()
            .is_some_and(|b| !b.is_empty())
        {
            // The batch's datagrams go before the FIN that counts them.
            self.flows[conn].f.u.set_nonblocking(false)?;
            let sent = self.flush(conn);
            self.flows[conn].f.u.set_nonblocking(true)?;
            sent?;
        }
        let t = &mut self.flows[conn].f.t;
        t.set_nonblocking(false)?;
        t.write_all(&count.to_le_bytes())?;
        t.shutdown(Shutdown::Write)?;
        t.set_nonblocking(true)?;
        Ok(true)
    }

    fn poll(&mut self, until: Instant, out: &mut Vec<Event>) -> Result<(), Error> {
        if until > Instant::now() {
            // About to wait: what is gathered goes now.
            for i in 0..self.flows.len() {
                if self.flows[i].batch.as_ref().is_some_and(|b| !b.is_empty()) {
                    self.flush(i)?;
                }
            }
        }
        let until = self.drain_deadline().map_or(until, |d| d.min(until));
        let busy = self.busy;
        poll_sockets(self, busy, until, false, out)
    }

    fn loss_timeout(&self) -> Option<Duration> {
        Some(LOSS_TIMEOUT)
    }

    fn jitter_ns(&self) -> Option<f64> {
        // The flows' mean, over those that received timestamped datagrams.
        let js: Vec<f64> = self.flows.iter().filter_map(|s| s.jitter.ns()).collect();
        (!js.is_empty()).then(|| js.iter().sum::<f64>() / js.len() as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bandwidth_datagrams_carry_their_send_time() {
        assert!(!carries_time(23), "the tail stamp would overlap");
        assert!(carries_time(24) && carries_time(1470));
        assert!(!carries_time(crate::data::GATHER_MIN), "gathered: none");
        let (a, b) = (now_ns(), now_ns());
        assert!(a > 0 && b >= a);
    }

    #[test]
    fn short_datagrams_carry_the_low_bytes() {
        assert_eq!(seq_mask(1), 0xff);
        assert_eq!(seq_mask(7), 0x00ff_ffff_ffff_ffff);
        assert_eq!(seq_mask(8), u64::MAX);
    }

    #[test]
    fn flow_setup_and_one_way() {
        let (l, port) = warpsock_testkit::loopback_listener();
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let server = std::thread::spawn(move || accept(&l, 9, 1).unwrap());
        let c = connect(addr, 9).unwrap();
        let s = server.join().unwrap().pop().unwrap();
        c.u.send(b"12345678").unwrap();
        let mut b = [0u8; 16];
        s.u.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        assert_eq!(s.u.recv(&mut b).unwrap(), 8);
        assert_eq!(&b[..8], b"12345678");
    }
}
