//! `tcp`: the host TCP baseline. Plain sockets with `TCP_NODELAY`, moving
//! the same messages as the warpsock tests in the same process layout; a
//! data connection goes to the server's control port and starts with the
//! session token.
//!
//! Each message is written with one `writev` and read with `readv`: for
//! sizes from [`crate::data::GATHER_MIN`] up, the connection's 8-byte head
//! and tail stamps around one body shared by every connection of the
//! thread (the same memory a warpsock message touches), else one whole
//! buffer per connection.
//!
//! One connection of a latency, one-way or CPU test in event mode runs on
//! a blocking socket (one `write` / `read` per step, as a plain program
//! does); bidirectional tests, several connections per thread and busy
//! polling use non-blocking sockets and `poll`, spinning for the busy-poll
//! time before sleeping. The FIN is `shutdown(SHUT_WR)`; the peer's FIN is
//! end-of-file.

use std::io::{self, IoSlice, IoSliceMut, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use super::sock::{self, idle_error, linger0, poll_sockets, Frame, Pass, StreamBody};
use crate::driver::{self, Addrs, Endpoint, Event, Job, Link, Listeners, Ready, IDLE};
use crate::spec::{Family, Role, TransportInfo};
use crate::stats::Stats;
use crate::Error;

/// The transport.
pub(crate) struct Tcp;

/// What it is.
pub(crate) static INFO: TransportInfo = TransportInfo {
    name: "tcp",
    label: "host TCP",
    help: "host TCP through plain sockets (the baseline)",
    family: Family::Stream,
    crc: false,
    pull: false,
    baseline: "tcp",
    quick: true,
    setup: true,
    preload: None,
};

impl Link for Tcp {
    fn info(&self) -> &'static TransportInfo {
        &INFO
    }

    fn connect(&self, job: &Job<'_>, to: &Addrs) -> Result<Box<dyn Endpoint>, Error> {
        let s = sock::connect(to.ctl, to.token)?;
        Ok(Box::new(TcpEndpoint::new(job, vec![s])?))
    }

    fn accept(
        &self,
        job: &Job<'_>,
        at: &Listeners<'_>,
        threads: usize,
        ready: Ready<'_>,
    ) -> Result<Vec<Box<dyn Endpoint>>, Error> {
        ready()?;
        let streams = sock::accept_n(at.ctl, at.token, job.spec.conns)?;
        driver::endpoints(streams, threads, |ss| TcpEndpoint::new(job, ss))
    }

    /// Until the budget is spent: connect, send the token, read it back and
    /// close with a reset (`SO_LINGER` 0, so that no TIME_WAIT piles up);
    /// then one connection with the inverted token tells the server to
    /// stop.
    fn setup_client(&self, job: &Job<'_>, to: &Addrs) -> Result<Stats, Error> {
        let st = driver::setups(job, || {
            let mut s = sock::connect(to.ctl, to.token)?;
            let mut b = [0u8; 8];
            s.set_read_timeout(Some(IDLE))?;
            s.read_exact(&mut b)?;
            linger0(&s);
            Ok(b == to.token.to_le_bytes())
        })?;
        let mut s = sock::connect(to.ctl, !to.token)?;
        let mut b = [0u8; 1];
        s.set_read_timeout(Some(IDLE))?;
        let _ = s.read(&mut b);
        Ok(st)
    }

    /// Accept, answer the token, until the stop connection.
    fn setup_serve(
        &self,
        job: &Job<'_>,
        at: &Listeners<'_>,
        ready: Ready<'_>,
    ) -> Result<Stats, Error> {
        ready()?;
        let mut st = Stats::default();
        loop {
            let (mut s, v) = at.ctl.accept(IDLE)?;
            s.set_nodelay(true)?;
            if v == !at.token {
                return Ok(st);
            }
            if v != at.token {
                return Err(Error::msg("a TCP data connection with a wrong token"));
            }
            s.write_all(&v.to_le_bytes())?;
            st.received(job.epoch, 8, true);
            linger0(&s);
        }
    }
}

/// Skips `off` bytes of `p`; the rest as (piece, offset) for a vectored
/// call.
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

/// One connection's state.
struct Conn {
    s: TcpStream,
    tx: Frame,
    rx: Frame,
    /// Bytes of the message being written (`None`: none is).
    tx_off: Option<usize>,
    /// The message being written is an echo of the received one.
    echoing: bool,
    /// The message being written was left in flight by `start`: an
    /// `Event::Sent` is due when it is out.
    notify_sent: bool,
    /// The last message started (what an answer must carry).
    tx_seq: u64,
    /// A ping is out and its answer not yet in.
    awaiting: bool,
    /// Messages fully received.
    rx_seq: u64,
    rx_off: usize,
    /// Pong: the received message waits to be echoed.
    echo_due: bool,
    /// `fin` was called; `fin_late`: while a write was pending.
    fin_due: bool,
    fin_late: bool,
    shut: bool,
    eof: bool,
}

impl Conn {
    fn wants_rx(&self, role: Role) -> bool {
        if self.eof {
            return false;
        }
        match role {
            Role::Sink | Role::Both => true,
            Role::Source => self.shut,
            Role::Ping => (self.awaiting && self.tx_off.is_none()) || self.shut,
            Role::Pong => !self.echo_due && self.tx_off.is_none(),
        }
    }
}

/// One thread's TCP connections.
pub(super) struct TcpEndpoint {
    conns: Vec<Conn>,
    role: Role,
    size: usize,
    verify: bool,
    busy: Duration,
    blocking: bool,
    tx_body: StreamBody,
    /// Receives overwrite it; the pattern is only needed to echo from it.
    rx_body: StreamBody,
}

impl TcpEndpoint {
    pub(super) fn new(job: &Job<'_>, streams: Vec<TcpStream>) -> Result<Self, Error> {
        let spec = job.spec;
        let busy = spec.busy_poll();
        let blocking = streams.len() == 1 && job.role != Role::Both && busy.is_zero();
        let mut conns = Vec::with_capacity(streams.len());
        for s in streams {
            s.set_nodelay(true)?;
            s.set_nonblocking(!blocking)?;
            if blocking {
                s.set_read_timeout(Some(IDLE))?;
                s.set_write_timeout(Some(IDLE))?;
            }
            conns.push(Conn {
                s,
                tx: Frame::new(spec.size),
                rx: Frame::new(spec.size),
                tx_off: None,
                echoing: false,
                notify_sent: false,
                tx_seq: 0,
                awaiting: false,
                rx_seq: 0,
                rx_off: 0,
                echo_due: false,
                fin_due: false,
                fin_late: false,
                shut: false,
                eof: false,
            });
        }
        Ok(Self {
            conns,
            role: job.role,
            size: spec.size,
            verify: spec.verify,
            busy,
            blocking,
            tx_body: StreamBody::new(spec.size),
            rx_body: StreamBody::new(spec.size),
        })
    }

    /// Writes what it can of connection `i`'s pending message and, once
    /// nothing is pending, its deferred FIN.
    fn write(&mut self, i: usize, out: &mut Vec<Event>) -> Result<bool, Error> {
        let blocking = self.blocking;
        let c = &mut self.conns[i];
        let mut moved = false;
        while let Some(off) = c.tx_off {
            let p = if c.echoing {
                c.rx.parts(&self.rx_body)
            } else {
                c.tx.parts(&self.tx_body)
            };
            match write_parts(&mut c.s, p, off) {
                Ok(n) => {
                    moved = true;
                    if off + n < self.size {
                        c.tx_off = Some(off + n);
                        continue;
                    }
                    c.tx_off = None;
                    if std::mem::take(&mut c.notify_sent) {
                        out.push(Event::Sent { conn: i });
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock && !blocking => break,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Err(idle_error().into()),
                Err(e) => return Err(e.into()),
            }
        }
        if c.fin_due && !c.shut && c.tx_off.is_none() {
            c.s.shutdown(Shutdown::Write)?;
            c.shut = true;
            moved = true;
            if c.fin_late {
                out.push(Event::FinDone { conn: i });
            }
        }
        Ok(moved)
    }

    /// Reads up to 16 messages of connection `i`.
    fn read(&mut self, i: usize, out: &mut Vec<Event>) -> Result<bool, Error> {
        let (role, size, verify, blocking) = (self.role, self.size, self.verify, self.blocking);
        let c = &mut self.conns[i];
        let mut moved = false;
        let mut rounds = 0;
        while c.wants_rx(role) && rounds < 16 {
            rounds += 1;
            match read_parts(&mut c.s, c.rx.parts_mut(&mut self.rx_body), c.rx_off) {
                Ok(0) if c.rx_off > 0 => {
                    return Err(Error::msg("the peer closed the connection mid-message"))
                }
                Ok(0) => {
                    c.eof = true;
                    moved = true;
                    out.push(Event::PeerFin { conn: i });
                }
                Ok(n) => {
                    moved = true;
                    c.rx_off += n;
                    if c.rx_off < size {
                        continue;
                    }
                    c.rx_off = 0;
                    let seq = if role == Role::Ping {
                        c.tx_seq
                    } else {
                        c.rx_seq
                    };
                    let ok = c.rx.check(&self.rx_body, seq, verify);
                    c.rx_seq += 1;
                    let answer = role == Role::Ping && std::mem::take(&mut c.awaiting);
                    if role == Role::Pong {
                        c.echo_due = true;
                    }
                    out.push(Event::Arrived {
                        conn: i,
                        len: size,
                        ok,
                        answer,
                    });
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock && !blocking => break,
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
        Ok(moved)
    }
}

impl Pass for TcpEndpoint {
    fn pass(&mut self, out: &mut Vec<Event>) -> Result<bool, Error> {
        let mut moved = false;
        for i in 0..self.conns.len() {
            moved |= self.write(i, out)?;
            moved |= self.read(i, out)?;
        }
        Ok(moved)
    }

    fn fds(&self, into: &mut Vec<libc::pollfd>) {
        for c in &self.conns {
            let mut events = 0;
            if c.wants_rx(self.role) {
                events |= libc::POLLIN;
            }
            if c.tx_off.is_some() {
                events |= libc::POLLOUT;
            }
            into.push(libc::pollfd {
                fd: c.s.as_raw_fd(),
                events,
                revents: 0,
            });
        }
    }
}

impl Endpoint for TcpEndpoint {
    fn conns(&self) -> usize {
        self.conns.len()
    }

    fn ready(&self, conn: usize) -> bool {
        let c = &self.conns[conn];
        c.tx_off.is_none() && !c.shut
    }

    fn start(&mut self, conn: usize, seq: u64) -> Result<bool, Error> {
        let c = &mut self.conns[conn];
        c.tx.stamp(seq);
        c.tx_seq = seq;
        c.awaiting = self.role == Role::Ping;
        c.tx_off = Some(0);
        c.echoing = false;
        c.notify_sent = true;
        // Written at once: no `Sent` (write() dropped it into `quiet`);
        // else it comes from a later pass.
        let mut quiet = Vec::new();
        self.write(conn, &mut quiet)?;
        Ok(self.conns[conn].tx_off.is_some())
    }

    fn echo(&mut self, conn: usize) -> Result<(), Error> {
        let c = &mut self.conns[conn];
        if c.echo_due && c.tx_off.is_none() {
            c.echo_due = false;
            c.echoing = true;
            c.tx_off = Some(0);
            let mut quiet = Vec::new();
            self.write(conn, &mut quiet)?;
        }
        Ok(())
    }

    fn fin(&mut self, conn: usize, _count: u64) -> Result<bool, Error> {
        let c = &mut self.conns[conn];
        c.fin_due = true;
        c.fin_late = c.tx_off.is_some();
        let mut quiet = Vec::new();
        self.write(conn, &mut quiet)?;
        Ok(self.conns[conn].shut)
    }

    fn poll(&mut self, until: Instant, out: &mut Vec<Event>) -> Result<(), Error> {
        let (busy, blocking) = (self.busy, self.blocking);
        poll_sockets(self, busy, until, blocking, out)
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
}
