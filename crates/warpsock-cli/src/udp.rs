//! The host UDP baseline (and, with the preload library in both
//! processes, the UDP offload layer): one connected UDP socket pair per
//! flow, plus a companion TCP connection that carries the setup (token and
//! ports) and the FINs, since a datagram FIN could be lost.
//!
//! Datagrams are built like TCP messages (stamps + shared body, one
//! `writev` / `readv` each). Nothing is retransmitted: a bandwidth sender
//! sends as fast as the socket takes datagrams, receivers count what
//! arrives (loss = sent − received), and a ping without an answer within
//! [`LOSS_TIMEOUT`] counts as lost. The FIN carries the sender's count:
//! after it a receiver keeps draining until that many datagrams arrived or
//! none came for [`GRACE`]. Bandwidth is what arrived over the receiver's
//! arrival span.

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use crate::data::{check_pattern, fill, gathered};
use crate::meter::Meter;
use crate::opts::{Role, Transport};
use crate::tcp::{accept_n, idle_error, poll_many, IDLE};
use crate::work::{Job, Pacer, Stats};
use crate::Error;

/// A ping unanswered this long is lost.
pub(crate) const LOSS_TIMEOUT: Duration = Duration::from_millis(50);
/// After the peer's FIN, receive until no datagram came for this long.
pub(crate) const GRACE: Duration = Duration::from_millis(20);
/// The same under the UDP offload layer, which loses nothing but may
/// still be delivering what it buffered.
pub(crate) const OFFLOAD_GRACE: Duration = Duration::from_millis(1000);

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
    let mut t = crate::tcp::connect(addr, token)?;
    let u = UdpSocket::bind(SocketAddr::new(t.local_addr()?.ip(), 0))?;
    t.write_all(&u.local_addr()?.port().to_be_bytes())?;
    let mut b = [0u8; 2];
    t.set_read_timeout(Some(Duration::from_secs(10)))?;
    t.read_exact(&mut b)?;
    u.connect(SocketAddr::new(addr.ip(), port_of(b)))?;
    Ok(Flow { u, t })
}

/// Server side: `n` companions (with the token), each with its own UDP
/// socket connected to the client's.
pub(crate) fn accept(l: &TcpListener, token: u64, n: usize) -> Result<Vec<Flow>, Error> {
    accept_n(l, token, n)?
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

/// Binds a UDP socket on `ip` to a port number chosen up front (free for
/// TCP too), not to port 0: the offload layer listens on the matching TCP
/// port only for sockets bound to a named port.
fn bind_numbered(ip: std::net::IpAddr) -> Result<UdpSocket, Error> {
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

fn pieces<'a>(own: &'a [u8], body: &'a [u8], size: usize) -> [&'a [u8]; 3] {
    if gathered(size) {
        [&own[..8], &body[8..size - 8], &own[8..16]]
    } else {
        [own, &[], &[]]
    }
}

fn pieces_mut<'a>(own: &'a mut [u8], body: &'a mut [u8], size: usize) -> [&'a mut [u8]; 3] {
    if gathered(size) {
        let (h, t) = own.split_at_mut(8);
        [h, &mut body[8..size - 8], &mut t[..8]]
    } else {
        [own, &mut [], &mut []]
    }
}

fn stamp_own(own: &mut [u8], size: usize, seq: u64) {
    let b = seq.to_le_bytes();
    if gathered(size) {
        own[..8].copy_from_slice(&b);
        own[8..16].copy_from_slice(&b);
    } else {
        crate::data::stamp(own, seq);
    }
}

/// The sequence number a datagram carries, if it is whole and
/// consistent (both stamps agree; with `full`, the pattern too).
fn check_any(own: &[u8], body: &[u8], size: usize, full: bool) -> Option<u64> {
    if gathered(size) {
        let h = u64::from_le_bytes(own[..8].try_into().expect("8 bytes"));
        let ok = own[8..16] == own[..8] && (!full || check_pattern(&body[8..size - 8], 8));
        return ok.then_some(h);
    }
    let n = size.min(8);
    let mut b = [0u8; 8];
    b[..n].copy_from_slice(&own[..n]);
    let seq = u64::from_le_bytes(b);
    crate::data::check(own, seq, full).then_some(seq)
}

struct FlowState {
    f: Flow,
    tx_seq: u64,
    ping: Option<(u64, Instant)>,
    fin_sent: bool,
    fin_buf: [u8; 8],
    fin_got: usize,
    peer_eof: bool,
    /// Last datagram (or the peer's FIN) seen once the FIN arrived.
    drain_last: Option<Instant>,
    /// Datagrams received on this flow.
    rx_count: u64,
}

impl FlowState {
    fn peer_fin(&self) -> bool {
        self.fin_got == 8
    }

    /// Whether receiving is over: the peer's FIN is in and either every
    /// datagram it counted arrived, or none came for `grace`.
    fn drained(&self, now: Instant, grace: Duration) -> bool {
        self.peer_fin()
            && (self.rx_count >= u64::from_le_bytes(self.fin_buf)
                || self.drain_last.is_some_and(|t| now >= t + grace))
    }
}

/// Runs `job` on this thread's flows.
pub(crate) fn run(job: &Job<'_>, flows: Vec<Flow>) -> Result<Stats, Error> {
    let spec = job.spec;
    let (size, role) = (spec.size, job.role);
    let busy = spec.busy_poll();
    let receives = role != Role::Source;
    let grace = if spec.transport == Transport::UdpOffload {
        OFFLOAD_GRACE
    } else {
        GRACE
    };
    let mut fs = Vec::with_capacity(flows.len());
    for f in flows {
        f.u.set_nonblocking(true)?;
        f.t.set_nonblocking(true)?;
        fs.push(FlowState {
            f,
            tx_seq: 0,
            ping: None,
            fin_sent: false,
            fin_buf: [0; 8],
            fin_got: 0,
            peer_eof: false,
            drain_last: None,
            rx_count: 0,
        });
    }
    let own_len = if gathered(size) { 16 } else { size };
    let mut tx_own = vec![0u8; own_len];
    let mut rx_own = vec![0u8; own_len];
    fill(&mut tx_own);
    let mut tx_body = vec![0u8; if gathered(size) { size } else { 0 }];
    fill(&mut tx_body);
    let mut rx_body = vec![0u8; tx_body.len()];
    if role == Role::Pong {
        fill(&mut rx_body);
    }
    let mut meter = Meter::new(spec.budget, spec.test.is_latency(), job.tick);
    let mut pacer = Pacer::new(spec.rate);
    let mut st = Stats::default();
    let mut last_progress = Instant::now();
    let mut fds = Vec::new();
    loop {
        let mut progress = false;
        let mut all_done = true;
        let mut wait = IDLE;
        fds.clear();
        for s in &mut fs {
            let ufd = s.f.u.as_raw_fd();
            let now = Instant::now();
            let drained = !receives || s.drained(now, grace);
            if s.fin_sent && s.peer_eof && drained {
                continue;
            }
            all_done = false;
            let mut want_out = false;
            // Send.
            if !s.fin_sent {
                match role {
                    Role::Source | Role::Both => {
                        for _ in 0..16 {
                            if !meter.more(s.tx_seq) {
                                fin(s)?;
                                progress = true;
                                break;
                            }
                            pacer.pace(size);
                            stamp_own(&mut tx_own, size, s.tx_seq);
                            match dropped(send_parts(ufd, pieces(&tx_own, &tx_body, size))) {
                                Ok(_) => {
                                    s.tx_seq += 1;
                                    st.sent += 1;
                                    st.active_now(Instant::now());
                                    progress = true;
                                }
                                Err(e) if would_block(&e) => {
                                    want_out = true;
                                    break;
                                }
                                Err(e) => return Err(Error::msg(format!("UDP send: {e}"))),
                            }
                        }
                    }
                    Role::Ping => {
                        if let Some((_, t)) = s.ping {
                            if now >= t + LOSS_TIMEOUT {
                                st.lost += 1;
                                s.ping = None;
                            } else {
                                wait = wait.min(t + LOSS_TIMEOUT - now);
                            }
                        }
                        if s.ping.is_none() {
                            if meter.more(s.tx_seq) {
                                stamp_own(&mut tx_own, size, s.tx_seq);
                                let t = Instant::now();
                                match dropped(send_parts(ufd, pieces(&tx_own, &tx_body, size))) {
                                    Ok(_) => {
                                        s.ping = Some((s.tx_seq, t));
                                        s.tx_seq += 1;
                                        st.sent += 1;
                                        st.active_now(t);
                                        progress = true;
                                        wait = wait.min(LOSS_TIMEOUT);
                                    }
                                    Err(e) if would_block(&e) => want_out = true,
                                    Err(e) => return Err(Error::msg(format!("UDP send: {e}"))),
                                }
                            } else {
                                fin(s)?;
                                progress = true;
                            }
                        }
                    }
                    Role::Pong | Role::Sink => {
                        if s.peer_fin() && drained {
                            fin(s)?;
                            progress = true;
                        }
                    }
                }
            }
            // Receive.
            if receives {
                for _ in 0..64 {
                    match recv_parts(ufd, pieces_mut(&mut rx_own, &mut rx_body, size)) {
                        Ok(n) => {
                            progress = true;
                            let seq = if n == size {
                                check_any(&rx_own, &rx_body, size, spec.verify)
                            } else {
                                None
                            };
                            st.received(job.epoch, n, seq.is_some());
                            s.rx_count += 1;
                            if s.peer_fin() {
                                s.drain_last = Some(Instant::now());
                            }
                            match role {
                                Role::Pong => {
                                    if let Err(e) = send_parts(ufd, pieces(&rx_own, &rx_body, size))
                                    {
                                        if !would_block(&e) {
                                            return Err(Error::msg(format!("UDP echo: {e}")));
                                        }
                                    }
                                }
                                Role::Ping => {
                                    if let (Some((want, t)), Some(got)) = (s.ping, seq) {
                                        // Short datagrams carry the low bytes.
                                        if want & seq_mask(size) == got {
                                            if !meter.warming(got) {
                                                st.rtts_ns.push(t.elapsed().as_nanos() as u64);
                                            }
                                            s.ping = None;
                                        }
                                    }
                                }
                                _ => {}
                            }
                        }
                        Err(e) if would_block(&e) => break,
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        Err(e) => return Err(Error::msg(format!("UDP receive: {e}"))),
                    }
                }
            }
            // The companion: the peer's FIN (8 bytes), then end-of-file.
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
                        progress = true;
                    }
                    Ok(n) if !s.peer_fin() => {
                        s.fin_got += n;
                        progress = true;
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
            if let Some(t) = s.drain_last {
                wait = wait.min(
                    (t + grace).saturating_duration_since(Instant::now())
                        + Duration::from_millis(1),
                );
            }
            let mut ev = 0;
            if receives {
                ev |= libc::POLLIN;
            }
            if want_out {
                ev |= libc::POLLOUT;
            }
            fds.push(libc::pollfd {
                fd: ufd,
                events: ev,
                revents: 0,
            });
            fds.push(libc::pollfd {
                fd: s.f.t.as_raw_fd(),
                events: if s.peer_eof { 0 } else { libc::POLLIN },
                revents: 0,
            });
        }
        if all_done {
            break;
        }
        let now = Instant::now();
        if progress {
            last_progress = now;
        } else if now >= last_progress + busy {
            if !poll_many(&mut fds, wait)? && wait == IDLE {
                return Err(idle_error().into());
            }
        } else {
            std::hint::spin_loop();
        }
    }
    Ok(st)
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

/// Sends this side's FIN: its count of datagrams sent (echoes are not
/// counted).
fn fin(s: &mut FlowState) -> Result<(), Error> {
    let v = s.tx_seq;
    s.f.t.set_nonblocking(false)?;
    s.f.t.write_all(&v.to_le_bytes())?;
    s.f.t.shutdown(Shutdown::Write)?;
    s.f.t.set_nonblocking(true)?;
    s.fin_sent = true;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn datagram_stamps() {
        for size in [1, 8, 100, 5000] {
            let own_len = if gathered(size) { 16 } else { size };
            let mut own = vec![0u8; own_len];
            fill(&mut own);
            let mut body = vec![0u8; if gathered(size) { size } else { 0 }];
            fill(&mut body);
            stamp_own(&mut own, size, 0x1_0055);
            assert_eq!(
                check_any(&own, &body, size, true),
                Some(0x1_0055 & seq_mask(size))
            );
            if gathered(size) {
                own[9] ^= 1;
                assert_eq!(check_any(&own, &body, size, false), None);
            }
        }
    }

    #[test]
    fn flow_setup_and_one_way() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
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
