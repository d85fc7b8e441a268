//! The host TCP baseline: plain sockets with `TCP_NODELAY`, moving the
//! same messages as the warpsock tests in the same process layout.
//!
//! Each message is written with one `writev` and read with `readv`: for
//! sizes from [`GATHER_MIN`] up, the connection's 8-byte head and tail
//! stamps around one body shared by every connection of the thread (the
//! same memory a warpsock message touches), else one whole buffer per
//! connection. A data connection starts with the 8-byte token.
//!
//! One connection of a latency, one-way or CPU test in event mode runs on
//! a blocking socket (one `write` / `read` per step, as a plain program
//! does); bidirectional tests, several connections per thread and busy
//! polling use non-blocking sockets and `poll`, spinning for the busy-poll
//! time before sleeping. The FIN is `shutdown(SHUT_WR)` (see
//! [`crate::work`]).

use std::io::{self, IoSlice, IoSliceMut, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use crate::data::{check, check_pattern, fill, gathered, stamp};
use crate::meter::Meter;
use crate::opts::{Role, Transport};
use crate::work::{Job, Pacer, Stats};
use crate::Error;

/// A side that waits longer than this for its peer gives up.
pub(crate) const IDLE: Duration = Duration::from_secs(30);

/// Waits until `fd` is ready for `events` (`POLLIN`/`POLLOUT`), at most `t`.
pub(crate) fn poll_fd(fd: i32, events: i16, t: Duration) -> io::Result<bool> {
    let mut p = [libc::pollfd {
        fd,
        events,
        revents: 0,
    }];
    poll_many(&mut p, t)
}

/// `poll` over several descriptors, at most `t`; whether any is ready.
pub(crate) fn poll_many(p: &mut [libc::pollfd], t: Duration) -> io::Result<bool> {
    let ms = t.as_millis().min(i32::MAX as u128) as i32;
    loop {
        // SAFETY: `p` is a valid slice of pollfd for its length.
        let r = unsafe { libc::poll(p.as_mut_ptr(), p.len() as libc::nfds_t, ms) };
        if r >= 0 {
            return Ok(r > 0);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

pub(crate) fn idle_error() -> io::Error {
    io::Error::new(
        io::ErrorKind::TimedOut,
        format!("the peer sent nothing for {} s", IDLE.as_secs()),
    )
}

/// Accepts one connection within `timeout`.
pub(crate) fn accept_timeout(l: &TcpListener, timeout: Duration) -> io::Result<TcpStream> {
    l.set_nonblocking(true)?;
    let deadline = Instant::now() + timeout;
    let res = loop {
        match l.accept() {
            Ok((s, _)) => break Ok(s),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "the client did not open its data connection in time",
                    ));
                }
                poll_fd(l.as_raw_fd(), libc::POLLIN, left)?;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => break Err(e),
        }
    };
    l.set_nonblocking(false)?;
    let s = res?;
    s.set_nonblocking(false)?;
    Ok(s)
}

/// Opens a data connection and sends the token.
pub(crate) fn connect(addr: SocketAddr, token: u64) -> Result<TcpStream, Error> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(10))
        .map_err(|e| Error::msg(format!("TCP data connection to {addr}: {e}")))?;
    s.set_nodelay(true)?;
    s.write_all(&token.to_le_bytes())?;
    Ok(s)
}

/// Accepts `n` data connections that start with the token.
pub(crate) fn accept_n(l: &TcpListener, token: u64, n: usize) -> Result<Vec<TcpStream>, Error> {
    (0..n)
        .map(|_| {
            let mut s = accept_timeout(l, Duration::from_secs(10))?;
            s.set_read_timeout(Some(Duration::from_secs(10)))?;
            let mut t = [0u8; 8];
            s.read_exact(&mut t)?;
            if u64::from_le_bytes(t) != token {
                return Err(Error::msg("a TCP data connection with a wrong token"));
            }
            s.set_nodelay(true)?;
            Ok(s)
        })
        .collect()
}

/// The pieces of one message: the whole message (small sizes), or head
/// stamp + shared body + tail stamp.
fn parts<'a>(own: &'a [u8], body: &'a [u8], size: usize) -> [&'a [u8]; 3] {
    if gathered(size) {
        [&own[..8], &body[8..size - 8], &own[8..16]]
    } else {
        [own, &[], &[]]
    }
}

fn parts_mut<'a>(own: &'a mut [u8], body: &'a mut [u8], size: usize) -> [&'a mut [u8]; 3] {
    if gathered(size) {
        let (h, t) = own.split_at_mut(8);
        [h, &mut body[8..size - 8], &mut t[..8]]
    } else {
        [own, &mut [], &mut []]
    }
}

/// Skips `off` bytes of `p`; the rest as slices for a vectored call.
fn skip<T: AsRef<[u8]>>(p: &[T; 3], mut off: usize) -> Vec<(usize, usize)> {
    let mut out = Vec::with_capacity(3);
    for (i, x) in p.iter().enumerate() {
        let len = x.as_ref().len();
        if off >= len {
            off -= len;
            continue;
        }
        out.push((i, off));
        off = 0;
    }
    out
}

fn write_parts(s: &mut TcpStream, p: [&[u8]; 3], off: usize) -> io::Result<usize> {
    let iov: Vec<IoSlice<'_>> = skip(&p, off)
        .into_iter()
        .map(|(i, o)| IoSlice::new(&p[i][o..]))
        .collect();
    s.write_vectored(&iov)
}

fn read_parts(s: &mut TcpStream, p: [&mut [u8]; 3], off: usize) -> io::Result<usize> {
    let spots = skip(&p, off);
    let mut p = p;
    let mut iov: Vec<IoSliceMut<'_>> = Vec::with_capacity(3);
    for (i, x) in p.iter_mut().enumerate() {
        if let Some(&(_, o)) = spots.iter().find(|(j, _)| *j == i) {
            iov.push(IoSliceMut::new(&mut x[o..]));
        }
    }
    s.read_vectored(&mut iov)
}

/// A connection's own bytes: the whole message, or 16 bytes of stamps.
fn own_buf(size: usize) -> Vec<u8> {
    let mut v = vec![0u8; if gathered(size) { 16 } else { size }];
    if !gathered(size) {
        fill(&mut v);
    }
    v
}

fn stamp_own(own: &mut [u8], size: usize, seq: u64) {
    if gathered(size) {
        own[..8].copy_from_slice(&seq.to_le_bytes());
        own[8..16].copy_from_slice(&seq.to_le_bytes());
    } else {
        stamp(own, seq);
    }
}

pub(crate) fn check_own(own: &[u8], body: &[u8], size: usize, seq: u64, full: bool) -> bool {
    if gathered(size) {
        own[..8] == seq.to_le_bytes()
            && own[8..16] == seq.to_le_bytes()
            && (!full || check_pattern(&body[8..size - 8], 8))
    } else {
        check(own, seq, full)
    }
}

/// What a connection does next on its sending side.
enum Next {
    Data,
    Echo,
    Fin,
    Nothing,
}

/// One connection's state.
struct Conn {
    s: TcpStream,
    tx_own: Vec<u8>,
    rx_own: Vec<u8>,
    /// Messages fully sent (pings, data; echoes not counted).
    tx_seq: u64,
    /// Bytes of the message being written (`None`: none is).
    tx_off: Option<usize>,
    /// The message being written is an echo of the received one.
    echoing: bool,
    /// Messages fully received.
    rx_seq: u64,
    rx_off: usize,
    /// Pong: a received message waits to be echoed.
    echo_due: bool,
    /// Ping in flight since.
    ping_at: Option<Instant>,
    shut: bool,
    eof: bool,
}

impl Conn {
    fn finished(&self) -> bool {
        self.shut && self.eof && self.tx_off.is_none()
    }

    fn wants_rx(&self, role: Role) -> bool {
        if self.eof {
            return false;
        }
        match role {
            Role::Sink | Role::Both => true,
            Role::Source => self.shut,
            Role::Ping => (self.ping_at.is_some() && self.tx_off.is_none()) || self.shut,
            Role::Pong => !self.echo_due && self.tx_off.is_none(),
        }
    }
}

/// Runs `job` on `streams` (all of this thread's connections).
pub(crate) fn run(job: &Job<'_>, streams: Vec<TcpStream>) -> Result<Stats, Error> {
    let spec = job.spec;
    let (size, role) = (spec.size, job.role);
    let k = streams.len();
    let busy = spec.busy_poll();
    let blocking = k == 1 && role != Role::Both && busy.is_zero();
    let mut conns = Vec::with_capacity(k);
    for s in streams {
        s.set_nodelay(true)?;
        s.set_nonblocking(!blocking)?;
        if blocking {
            s.set_read_timeout(Some(IDLE))?;
            s.set_write_timeout(Some(IDLE))?;
        }
        conns.push(Conn {
            s,
            tx_own: own_buf(size),
            rx_own: own_buf(size),
            tx_seq: 0,
            tx_off: None,
            echoing: false,
            rx_seq: 0,
            rx_off: 0,
            echo_due: false,
            ping_at: None,
            shut: false,
            eof: false,
        });
    }
    let mut tx_body = vec![0u8; if gathered(size) { size } else { 0 }];
    fill(&mut tx_body);
    // Receives overwrite it; the pattern is only needed to echo from it.
    let mut rx_body = vec![0u8; tx_body.len()];
    if role == Role::Pong {
        fill(&mut rx_body);
    }
    let active = role.active(Transport::Tcp);
    let mut meter = Meter::new(spec.budget, spec.test.is_latency(), job.tick);
    let mut pacer = Pacer::new(spec.rate);
    let mut st = Stats::default();
    let mut last_progress = Instant::now();
    let mut fds: Vec<libc::pollfd> = Vec::with_capacity(k);
    loop {
        let mut progress = false;
        let mut all_done = true;
        fds.clear();
        for c in &mut conns {
            if c.finished() {
                continue;
            }
            all_done = false;
            // Start the next message, or the FIN.
            if c.tx_off.is_none() && !c.shut {
                let next = match role {
                    Role::Source | Role::Both => Next::Data,
                    Role::Ping if c.ping_at.is_none() => Next::Data,
                    Role::Pong if c.echo_due => Next::Echo,
                    Role::Pong | Role::Sink if c.eof => Next::Fin,
                    _ => Next::Nothing,
                };
                let fin = match next {
                    Next::Data if meter.more(c.tx_seq) => {
                        pacer.pace(size);
                        stamp_own(&mut c.tx_own, size, c.tx_seq);
                        let now = Instant::now();
                        st.active_now(now);
                        if role == Role::Ping {
                            c.ping_at = Some(now);
                        }
                        c.tx_off = Some(0);
                        c.echoing = false;
                        false
                    }
                    Next::Data | Next::Fin => true,
                    Next::Echo => {
                        c.echo_due = false;
                        c.tx_off = Some(0);
                        c.echoing = true;
                        false
                    }
                    Next::Nothing => false,
                };
                if fin {
                    c.s.shutdown(Shutdown::Write)?;
                    c.shut = true;
                    progress = true;
                }
            }
            // Write.
            if let Some(off) = c.tx_off {
                let p = if c.echoing {
                    parts(&c.rx_own, &rx_body, size)
                } else {
                    parts(&c.tx_own, &tx_body, size)
                };
                match write_parts(&mut c.s, p, off) {
                    Ok(n) => {
                        progress = true;
                        let off = off + n;
                        if off < size {
                            c.tx_off = Some(off);
                        } else {
                            c.tx_off = None;
                            if !c.echoing {
                                c.tx_seq += 1;
                                st.sent += 1;
                            }
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock && !blocking => {}
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        return Err(idle_error().into())
                    }
                    Err(e) => return Err(e.into()),
                }
            }
            // Read (a bounded number of messages per round).
            let mut rounds = 0;
            while c.wants_rx(role) && rounds < 16 {
                rounds += 1;
                let p = parts_mut(&mut c.rx_own, &mut rx_body, size);
                match read_parts(&mut c.s, p, c.rx_off) {
                    Ok(0) if c.rx_off > 0 => {
                        return Err(Error::msg("the peer closed the connection mid-message"))
                    }
                    Ok(0) => {
                        c.eof = true;
                        progress = true;
                    }
                    Ok(n) => {
                        progress = true;
                        c.rx_off += n;
                        if c.rx_off == size {
                            c.rx_off = 0;
                            let seq = match role {
                                Role::Ping => c.tx_seq - 1,
                                _ => c.rx_seq,
                            };
                            let ok = check_own(&c.rx_own, &rx_body, size, seq, spec.verify);
                            c.rx_seq += 1;
                            st.received(job.epoch, size, ok);
                            match role {
                                Role::Pong => c.echo_due = true,
                                Role::Ping => {
                                    let t = c.ping_at.take().expect("a ping in flight");
                                    if !meter.warming(seq) {
                                        st.rtts_ns.push(t.elapsed().as_nanos() as u64);
                                    }
                                }
                                _ => {}
                            }
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock && !blocking => break,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e)
                        if matches!(
                            e.kind(),
                            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                        ) =>
                    {
                        return Err(idle_error().into())
                    }
                    Err(e) => return Err(e.into()),
                }
            }
            if c.finished() {
                if active {
                    st.active_now(Instant::now());
                }
                continue;
            }
            let mut ev = 0;
            if c.wants_rx(role) {
                ev |= libc::POLLIN;
            }
            if c.tx_off.is_some() {
                ev |= libc::POLLOUT;
            }
            fds.push(libc::pollfd {
                fd: c.s.as_raw_fd(),
                events: ev,
                revents: 0,
            });
        }
        if all_done {
            break;
        }
        let now = Instant::now();
        if progress {
            last_progress = now;
        } else if !blocking && now >= last_progress + busy {
            let any = fds.iter().any(|f| f.events != 0);
            let t = if any { IDLE } else { Duration::from_millis(1) };
            if !poll_many(&mut fds, t)? && any {
                return Err(idle_error().into());
            }
        } else {
            std::hint::spin_loop();
        }
    }
    Ok(st)
}

/// Connection setup, client side: until the budget is spent, connect,
/// send the token, read it back and close with a reset (`SO_LINGER` 0, so
/// that no TIME_WAIT piles up); then one connection with the inverted
/// token tells the server to stop. `rtts_ns` gets the time of each setup.
pub(crate) fn conn_client(job: &Job<'_>, addr: SocketAddr, token: u64) -> Result<Stats, Error> {
    let mut meter = Meter::new(job.spec.budget, false, job.tick);
    let mut st = Stats::default();
    let mut n = 0u64;
    while meter.more(n) && n < crate::work::MAX_SETUPS {
        let t = Instant::now();
        let mut s = connect(addr, token)?;
        let mut b = [0u8; 8];
        s.set_read_timeout(Some(IDLE))?;
        s.read_exact(&mut b)?;
        let ns = t.elapsed().as_nanos() as u64;
        let ok = b == token.to_le_bytes();
        st.active_now(t);
        st.active_now(Instant::now());
        st.received(job.epoch, 8, ok);
        st.rtts_ns.push(ns);
        st.sent += 1;
        linger0(&s);
        n += 1;
    }
    let mut s = connect(addr, !token)?;
    let mut b = [0u8; 1];
    s.set_read_timeout(Some(IDLE))?;
    let _ = s.read(&mut b);
    Ok(st)
}

/// Closes with a reset when `s` is dropped.
pub(crate) fn linger0(s: &TcpStream) {
    let l = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: valid socket and option of the size passed.
    unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&l as *const libc::linger).cast(),
            size_of::<libc::linger>() as libc::socklen_t,
        );
    }
}

/// Connection setup, server side: accept, answer the token, until the
/// stop connection.
pub(crate) fn conn_serve(epoch: Instant, l: &TcpListener, token: u64) -> Result<Stats, Error> {
    let mut st = Stats::default();
    loop {
        let mut s = accept_timeout(l, IDLE)?;
        s.set_nodelay(true)?;
        s.set_read_timeout(Some(IDLE))?;
        let mut b = [0u8; 8];
        s.read_exact(&mut b)?;
        let v = u64::from_le_bytes(b);
        if v == !token {
            return Ok(st);
        }
        if v != token {
            return Err(Error::msg("a TCP data connection with a wrong token"));
        }
        s.write_all(&b)?;
        st.received(epoch, 8, true);
        linger0(&s);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skip_offsets() {
        let a = [1u8; 8];
        let b = [2u8; 100];
        let p: [&[u8]; 3] = [&a, &b, &a];
        assert_eq!(skip(&p, 0), vec![(0, 0), (1, 0), (2, 0)]);
        assert_eq!(skip(&p, 5), vec![(0, 5), (1, 0), (2, 0)]);
        assert_eq!(skip(&p, 8), vec![(1, 0), (2, 0)]);
        assert_eq!(skip(&p, 110), vec![(2, 2)]);
        let small: [&[u8]; 3] = [&b, &[], &[]];
        assert_eq!(skip(&small, 99), vec![(0, 99)]);
    }

    #[test]
    fn own_stamps_and_shared_body() {
        for size in [1, 16, crate::data::GATHER_MIN, 1 << 20] {
            let mut own = own_buf(size);
            let mut body = vec![0u8; if gathered(size) { size } else { 0 }];
            fill(&mut body);
            stamp_own(&mut own, size, 77);
            assert!(check_own(&own, &body, size, 77, true), "{size}");
            assert!(!check_own(&own, &body, size, 78, false) || size == 1);
            let total: usize = parts(&own, &body, size).iter().map(|p| p.len()).sum();
            assert_eq!(total, size);
        }
    }
}
