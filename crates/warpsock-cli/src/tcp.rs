//! The host TCP baseline: plain `std::net` sockets with `TCP_NODELAY`,
//! moving the same messages as the warpsock tests in the same process
//! layout.
//!
//! * Latency: the client writes a `size`-byte message, the server reads it
//!   whole and writes it back; one round trip per message.
//! * Bandwidth: the client writes messages back to back (one `write` of
//!   `size` bytes each), the server reads and checks each one.
//!
//! Both end the same way: the client shuts down its sending side, the
//! server sees end-of-file at a message boundary and answers with the
//! number of messages it received (8 bytes, little-endian); the client's
//! clock stops when that answer arrives.
//!
//! With `--busy-poll` the sockets are non-blocking and a waiting side spins
//! on `recv` for the busy-poll time before it sleeps in `poll`.

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use crate::ctl::Tally;
use crate::data::{check, fill, stamp};
use crate::meter::{Meter, Outcome};
use crate::opts::{Spec, Test};
use crate::Error;

/// A side that waits longer than this for its peer gives up.
pub(crate) const IDLE: Duration = Duration::from_secs(30);

/// A TCP stream that reads and writes whole messages, blocking or spinning.
struct Stream {
    s: TcpStream,
    busy: Duration,
}

/// Waits until `fd` is ready for `events` (`POLLIN`/`POLLOUT`), at most `t`.
pub(crate) fn poll_fd(fd: i32, events: i16, t: Duration) -> io::Result<bool> {
    let mut p = libc::pollfd {
        fd,
        events,
        revents: 0,
    };
    let ms = t.as_millis().min(i32::MAX as u128) as i32;
    loop {
        // SAFETY: one valid pollfd, count 1.
        let r = unsafe { libc::poll(&mut p, 1, ms) };
        if r >= 0 {
            return Ok(r > 0);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

fn idle_error() -> io::Error {
    io::Error::new(
        io::ErrorKind::TimedOut,
        format!("the peer sent nothing for {} s", IDLE.as_secs()),
    )
}

impl Stream {
    fn new(s: TcpStream, busy: Duration) -> io::Result<Self> {
        s.set_nodelay(true)?;
        if busy.is_zero() {
            s.set_read_timeout(Some(IDLE))?;
            s.set_write_timeout(Some(IDLE))?;
        } else {
            s.set_nonblocking(true)?;
        }
        Ok(Self { s, busy })
    }

    /// Waits for readiness after `WouldBlock`: spins until `spin_until`,
    /// then sleeps in `poll`.
    fn wait(&self, events: i16, spin_until: Instant) -> io::Result<()> {
        if Instant::now() < spin_until {
            std::hint::spin_loop();
            return Ok(());
        }
        if poll_fd(self.s.as_raw_fd(), events, IDLE)? {
            Ok(())
        } else {
            Err(idle_error())
        }
    }

    /// Reads exactly `buf.len()` bytes; `Ok(false)` on end-of-file before
    /// the first byte.
    fn read_msg(&mut self, buf: &mut [u8]) -> io::Result<bool> {
        let spin_until = Instant::now() + self.busy;
        let mut got = 0;
        while got < buf.len() {
            match self.s.read(&mut buf[got..]) {
                Ok(0) if got == 0 => return Ok(false),
                Ok(0) => {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the peer closed the connection mid-message",
                    ))
                }
                Ok(n) => got += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock && !self.busy.is_zero() => {
                    self.wait(libc::POLLIN, spin_until)?;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Err(idle_error()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(true)
    }

    fn write_msg(&mut self, buf: &[u8]) -> io::Result<()> {
        let mut put = 0;
        while put < buf.len() {
            match self.s.write(&buf[put..]) {
                Ok(n) => put += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock && !self.busy.is_zero() => {
                    self.wait(libc::POLLOUT, Instant::now())?;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
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

/// Client side of a TCP test against the server's control address.
pub(crate) fn client(
    addr: SocketAddr,
    token: u64,
    spec: &Spec,
    meter: &mut Meter<'_>,
) -> Result<Outcome, Error> {
    let s = TcpStream::connect_timeout(&addr, Duration::from_secs(10))
        .map_err(|e| Error::msg(format!("TCP data connection to {addr}: {e}")))?;
    let mut st = Stream::new(s, spec.busy_poll())?;
    st.write_msg(&token.to_le_bytes())?;
    let mut msg = vec![0u8; spec.size];
    fill(&mut msg);
    let mut out = Outcome::default();
    let mut seq = 0u64;
    meter.restart();
    let t0 = Instant::now();
    match spec.test {
        Test::Lat => {
            let mut echo = vec![0u8; spec.size];
            while meter.more(seq) {
                stamp(&mut msg, seq);
                let t = Instant::now();
                st.write_msg(&msg)?;
                if !st.read_msg(&mut echo)? {
                    return Err(Error::msg("the server closed the TCP connection"));
                }
                let rtt = t.elapsed();
                out.tally.add(spec.size, check(&echo, seq, spec.verify));
                if !meter.warming(seq) {
                    out.rtts_ns.push(rtt.as_nanos() as u64);
                }
                seq += 1;
            }
        }
        Test::Bw => {
            while meter.more(seq) {
                stamp(&mut msg, seq);
                st.write_msg(&msg)?;
                seq += 1;
                meter.account(spec.size as u64);
            }
        }
    }
    st.s.shutdown(Shutdown::Write)?;
    let mut ack = [0u8; 8];
    if !st.read_msg(&mut ack)? {
        return Err(Error::msg(
            "the server closed the TCP connection without its count",
        ));
    }
    out.elapsed = t0.elapsed();
    let got = u64::from_le_bytes(ack);
    if got != seq {
        return Err(Error::msg(format!(
            "sent {seq} messages but the server received {got}"
        )));
    }
    out.sent = seq;
    out.data_bytes = seq * spec.size as u64;
    out.intervals = meter.finish();
    Ok(out)
}

/// Server side of a TCP test: accepts the client's data connection on the
/// control listener and runs until the client's end-of-file.
pub(crate) fn serve(l: &TcpListener, token: u64, spec: &Spec) -> Result<Tally, Error> {
    let s = accept_timeout(l, Duration::from_secs(10))?;
    let mut st = Stream::new(s, spec.busy_poll())?;
    let mut t = [0u8; 8];
    if !st.read_msg(&mut t)? || u64::from_le_bytes(t) != token {
        return Err(Error::msg("a TCP data connection with a wrong token"));
    }
    let mut buf = vec![0u8; spec.size];
    let mut tally = Tally::default();
    while st.read_msg(&mut buf)? {
        let ok = check(&buf, tally.msgs, spec.verify);
        tally.add(spec.size, ok);
        if spec.test == Test::Lat {
            st.write_msg(&buf)?;
        }
    }
    st.write_msg(&tally.msgs.to_le_bytes())?;
    Ok(tally)
}
