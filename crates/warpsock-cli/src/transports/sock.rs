//! Socket helpers shared by the host-socket transports: `poll`, bounded
//! accept, data connections that start with the session token, abortive
//! close, and the scatter/gather layout of one message.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use crate::data::{check, check_pattern, gathered, stamp};
use crate::driver::{Accept, Event, IDLE};
use crate::Error;

/// How long a data connection may take to open or to present its token.
pub(crate) const CONNECT_WAIT: Duration = Duration::from_secs(10);

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

/// One non-blocking pass of a host-socket endpoint over its sockets.
pub(crate) trait Pass {
    /// Moves what can move without waiting; events into `out`. Returns
    /// whether anything moved.
    fn pass(&mut self, out: &mut Vec<Event>) -> Result<bool, Error>;
    /// What each socket waits for, for `poll`.
    fn fds(&self, into: &mut Vec<libc::pollfd>);
}

/// How a host-socket endpoint waits: one pass; if nothing moved, spin
/// with passes for `busy`, then sleep in `poll` until a socket is ready
/// or `until`. With `blocking` sockets the pass itself waited.
pub(crate) fn poll_sockets(
    p: &mut impl Pass,
    busy: Duration,
    until: Instant,
    blocking: bool,
    out: &mut Vec<Event>,
) -> Result<(), Error> {
    if p.pass(out)? || !out.is_empty() || blocking {
        return Ok(());
    }
    let spin_end = Instant::now() + busy;
    let mut fds = Vec::new();
    loop {
        let now = Instant::now();
        if now >= until {
            return Ok(());
        }
        if now < spin_end {
            std::hint::spin_loop();
        } else {
            fds.clear();
            p.fds(&mut fds);
            poll_many(&mut fds, until - now)?;
        }
        if p.pass(out)? || !out.is_empty() {
            return Ok(());
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
    let mut s = TcpStream::connect_timeout(&addr, CONNECT_WAIT)
        .map_err(|e| Error::msg(format!("TCP data connection to {addr}: {e}")))?;
    s.set_nodelay(true)?;
    s.write_all(&token.to_le_bytes())?;
    Ok(s)
}

/// A plain listener as a source of data connections: accept, then read
/// the first 8 bytes (within [`CONNECT_WAIT`]).
impl Accept for TcpListener {
    fn accept(&self, timeout: Duration) -> io::Result<(TcpStream, u64)> {
        let mut s = accept_timeout(self, timeout)?;
        s.set_read_timeout(Some(CONNECT_WAIT))?;
        let mut t = [0u8; 8];
        s.read_exact(&mut t)?;
        s.set_read_timeout(None)?;
        Ok((s, u64::from_le_bytes(t)))
    }
}

/// Accepts `n` data connections that start with the token.
pub(crate) fn accept_n(l: &dyn Accept, token: u64, n: usize) -> Result<Vec<TcpStream>, Error> {
    (0..n)
        .map(|_| {
            let (s, t) = l.accept(CONNECT_WAIT)?;
            if t != token {
                return Err(Error::msg("a TCP data connection with a wrong token"));
            }
            s.set_nodelay(true)?;
            Ok(s)
        })
        .collect()
}

/// Closes with a reset when `s` is dropped.
pub(crate) fn linger0(s: &TcpStream) {
    let _ = warpsock_engine::set_linger_zero(s.as_raw_fd());
}

/// One message as host sockets move it: the whole message in `own` (small
/// sizes), or `own`'s 16 bytes of head and tail stamps around one body
/// shared by every message of the thread (see [`crate::data`]).
pub(crate) struct Frame {
    pub(crate) own: Vec<u8>,
    pub(crate) size: usize,
}

impl Frame {
    /// A frame for `size`-byte messages, its own bytes holding the pattern.
    pub(crate) fn new(size: usize) -> Self {
        let mut own = vec![0u8; if gathered(size) { 16 } else { size }];
        crate::data::fill(&mut own);
        Self { own, size }
    }

    /// Writes `seq` into the stamps.
    pub(crate) fn stamp(&mut self, seq: u64) {
        if gathered(self.size) {
            self.own[..8].copy_from_slice(&seq.to_le_bytes());
            self.own[8..16].copy_from_slice(&seq.to_le_bytes());
        } else {
            stamp(&mut self.own, seq);
        }
    }

    /// Whether this frame (with `body`) holds message `seq`; `full`: and
    /// the pattern everywhere else.
    pub(crate) fn check(&self, body: &[u8], seq: u64, full: bool) -> bool {
        if gathered(self.size) {
            self.own[..8] == seq.to_le_bytes()
                && self.own[8..16] == seq.to_le_bytes()
                && (!full || check_pattern(&body[8..self.size - 8], 8))
        } else {
            check(&self.own, seq, full)
        }
    }

    /// The sequence number a whole, consistent message carries (both
    /// stamps agree; with `full`, the pattern too). Short messages carry
    /// the low bytes of it.
    pub(crate) fn seq_of(&self, body: &[u8], full: bool) -> Option<u64> {
        if gathered(self.size) {
            let h = u64::from_le_bytes(self.own[..8].try_into().expect("8 bytes"));
            let ok = self.own[8..16] == self.own[..8]
                && (!full || check_pattern(&body[8..self.size - 8], 8));
            return ok.then_some(h);
        }
        let n = self.size.min(8);
        let mut b = [0u8; 8];
        b[..n].copy_from_slice(&self.own[..n]);
        let seq = u64::from_le_bytes(b);
        check(&self.own, seq, full).then_some(seq)
    }

    /// The pieces of the message: `[whole, -, -]` or `[head, body, tail]`.
    pub(crate) fn parts<'a>(&'a self, body: &'a [u8]) -> [&'a [u8]; 3] {
        if gathered(self.size) {
            [&self.own[..8], &body[8..self.size - 8], &self.own[8..16]]
        } else {
            [&self.own, &[], &[]]
        }
    }

    /// The same pieces to receive into.
    pub(crate) fn parts_mut<'a>(&'a mut self, body: &'a mut [u8]) -> [&'a mut [u8]; 3] {
        if gathered(self.size) {
            let (h, t) = self.own.split_at_mut(8);
            [h, &mut body[8..self.size - 8], &mut t[..8]]
        } else {
            [&mut self.own, &mut [], &mut []]
        }
    }
}

/// The shared body of `size`-byte messages (empty below the gather size),
/// holding the pattern.
pub(crate) fn body(size: usize) -> Vec<u8> {
    let mut b = vec![0u8; if gathered(size) { size } else { 0 }];
    crate::data::fill(&mut b);
    b
}

/// Byte `i` of a [`StreamBody`] sits at an address `≡ i` modulo this.
pub(crate) const BODY_ALIGN: usize = 4096;

/// A [`body`] for a byte stream, placed so that byte `i` sits at an
/// address congruent to `i` modulo [`BODY_ALIGN`]: as in a program that
/// reads whole messages into a page-aligned buffer. The kernel copies
/// between these bytes and socket buffers whose data sits at the stream
/// offset's alignment (the sender's page fragments fill in stream order);
/// when the two alignments differ (a plain `Vec` of 1 MiB starts 16 bytes
/// into its page), every copy in `write` and `read` is misaligned, which
/// on this host's AMD EPYC cost ~1.6x the CPU per byte in a bidirectional
/// loopback test (BENCHMARKS.md §3).
pub(crate) struct StreamBody {
    buf: Vec<u8>,
    at: usize,
    len: usize,
}

impl StreamBody {
    /// The body of `size`-byte messages, holding the pattern.
    pub(crate) fn new(size: usize) -> Self {
        let len = if gathered(size) { size } else { 0 };
        let mut buf = vec![0u8; len + BODY_ALIGN];
        let at = buf.as_ptr().align_offset(BODY_ALIGN);
        crate::data::fill(&mut buf[at..at + len]);
        Self { buf, at, len }
    }
}

impl std::ops::Deref for StreamBody {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.buf[self.at..self.at + self.len]
    }
}

impl std::ops::DerefMut for StreamBody {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.buf[self.at..self.at + self.len]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The stream body sits where the stream puts its bytes (see
    /// [`StreamBody`]): byte `i` at an address `≡ i` modulo the page, so
    /// the body of a message whose start is page-aligned in the stream is
    /// copied without misalignment; and it holds the same bytes as [`body`].
    #[test]
    fn stream_body_is_aligned_like_the_stream() {
        for size in [100, crate::data::GATHER_MIN, 1 << 20, (1 << 20) + 24] {
            let mut b = StreamBody::new(size);
            assert_eq!(&b[..], &body(size)[..], "{size}");
            assert_eq!(b.as_ptr() as usize % BODY_ALIGN, 0, "{size}");
            let f = Frame::new(size);
            if gathered(size) {
                let [_, mid, _] = f.parts(&b);
                assert_eq!(mid.as_ptr() as usize % BODY_ALIGN, 8, "{size}");
            }
            let n = b.len();
            b[..n].fill(0);
        }
    }

    #[test]
    fn frames_stamp_and_check() {
        for size in [1, 8, 16, 100, crate::data::GATHER_MIN, 1 << 20] {
            let body = body(size);
            let mut f = Frame::new(size);
            f.stamp(0x1_0077);
            let mask = if size >= 8 {
                u64::MAX
            } else {
                (1 << (8 * size)) - 1
            };
            assert!(f.check(&body, 0x1_0077 & mask, true), "{size}");
            assert_eq!(f.seq_of(&body, true), Some(0x1_0077 & mask));
            let total: usize = f.parts(&body).iter().map(|p| p.len()).sum();
            assert_eq!(total, size);
            if gathered(size) {
                f.own[9] ^= 1;
                assert_eq!(f.seq_of(&body, false), None);
            }
        }
    }
}
