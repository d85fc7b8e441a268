//! Linux UDP segmentation offload, used by the datagram endpoint when a
//! transport asks for it (`udp-native-gso`, the host-UDP baseline a program
//! that batches by itself would reach): a sender gathers a flow's
//! datagrams into one buffer and hands it to the kernel with one `sendmsg`
//! carrying `UDP_SEGMENT` (the kernel cuts it into datagrams of the
//! segment size); a receiver turns `UDP_GRO` on and reads many datagrams
//! per `recvmsg`, their segment size in the control message.

use std::io;
use std::mem::{size_of, zeroed};
use std::time::{Duration, Instant};

/// At most this many datagrams per send (the kernel's `UDP_MAX_SEGMENTS`).
const MAX_SEGMENTS: usize = 64;

/// At most this many bytes per send (an IPv4 datagram's payload limit).
const MAX_BYTES: usize = 65_507;

/// A datagram waits at most this long for its batch to fill (a paced
/// sender's batches go out on time; an idle endpoint sends at once).
pub(crate) const MAX_DELAY: Duration = Duration::from_micros(200);

/// `SOL_UDP` options (linux/udp.h).
const UDP_SEGMENT: libc::c_int = 103;
const UDP_GRO: libc::c_int = 104;

/// Room for one control message holding an `int` or a `u16`.
const CMSG_ROOM: usize = 32;

/// The datagrams of one flow waiting to be sent as one batch.
pub(crate) struct Batch {
    buf: Vec<u8>,
    /// Datagrams in `buf`, each `seg` bytes.
    n: usize,
    seg: usize,
    /// Datagrams per batch.
    max: usize,
    /// When the first datagram in `buf` was added.
    since: Option<Instant>,
}

impl Batch {
    /// A batch of `size`-byte datagrams; `None` when at most one would fit.
    pub(crate) fn new(size: usize) -> Option<Self> {
        let max = MAX_SEGMENTS.min(MAX_BYTES / size.max(1));
        (max > 1).then(|| Self {
            buf: Vec::with_capacity(max * size),
            n: 0,
            seg: size,
            max,
            since: None,
        })
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// Whether it should go now: full, or its first datagram waited
    /// [`MAX_DELAY`].
    pub(crate) fn due(&self) -> bool {
        self.n >= self.max || self.since.is_some_and(|t| t.elapsed() >= MAX_DELAY)
    }

    pub(crate) fn is_full(&self) -> bool {
        self.n >= self.max
    }

    /// Appends one datagram, given as pieces (`seg` bytes in all).
    pub(crate) fn push(&mut self, parts: [&[u8]; 3]) {
        debug_assert!(!self.is_full());
        for p in parts {
            self.buf.extend_from_slice(p);
        }
        self.n += 1;
        self.since.get_or_insert_with(Instant::now);
    }

    /// Sends what is gathered on the connected socket `fd`. `Ok(false)`:
    /// the socket would not take it now (kept). A path that refuses the
    /// segment size (`EINVAL`, `EIO`: the route's MTU is smaller, or no
    /// GSO) gets the datagrams one by one from then on.
    pub(crate) fn flush(&mut self, fd: i32) -> io::Result<bool> {
        while self.n > 0 {
            if self.max > 1 && self.n > 1 {
                match send_segmented(fd, &self.buf, self.seg) {
                    Ok(()) => {
                        self.clear(self.n);
                        continue;
                    }
                    Err(e) if matches!(e.raw_os_error(), Some(libc::EINVAL | libc::EIO)) => {
                        self.max = 1;
                    }
                    Err(e) => return blocked_or(e),
                }
            }
            // One datagram at a time.
            // SAFETY: the first `seg` bytes of `buf` are live.
            let r = unsafe { libc::send(fd, self.buf.as_ptr().cast(), self.seg, 0) };
            if r < 0 {
                return blocked_or(io::Error::last_os_error());
            }
            self.clear(1);
        }
        Ok(true)
    }

    /// Forgets the first `k` datagrams.
    fn clear(&mut self, k: usize) {
        self.buf.drain(..k * self.seg);
        self.n -= k;
        if self.n == 0 {
            self.since = None;
        }
    }
}

/// `Ok(false)` for a full socket buffer; a firewall's drop (`EPERM`) is
/// sent and lost, as on the wire; anything else is an error.
fn blocked_or(e: io::Error) -> io::Result<bool> {
    match e.raw_os_error() {
        Some(libc::EAGAIN | libc::ENOBUFS) => Ok(false),
        Some(libc::EPERM) => Ok(true),
        _ => Err(e),
    }
}

/// One `sendmsg` of `buf` cut into `seg`-byte datagrams by the kernel.
fn send_segmented(fd: i32, buf: &[u8], seg: usize) -> io::Result<()> {
    let mut iov = libc::iovec {
        iov_base: buf.as_ptr() as *mut libc::c_void,
        iov_len: buf.len(),
    };
    let mut ctl = [0u64; CMSG_ROOM / 8];
    // SAFETY: msghdr is plain data.
    let mut m: libc::msghdr = unsafe { zeroed() };
    m.msg_iov = &mut iov;
    m.msg_iovlen = 1;
    m.msg_control = ctl.as_mut_ptr().cast();
    // SAFETY: CMSG_SPACE only computes a size.
    m.msg_controllen = unsafe { libc::CMSG_SPACE(size_of::<u16>() as u32) } as usize;
    // SAFETY: the control buffer holds one u16 message (CMSG_ROOM bytes).
    unsafe {
        let c = libc::CMSG_FIRSTHDR(&m);
        (*c).cmsg_level = libc::SOL_UDP;
        (*c).cmsg_type = UDP_SEGMENT;
        (*c).cmsg_len = libc::CMSG_LEN(size_of::<u16>() as u32) as usize;
        std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<u16>(), seg as u16);
    }
    // SAFETY: every pointer in `m` is live for the call.
    let r = unsafe { libc::sendmsg(fd, &m, 0) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    if r as usize != buf.len() {
        return Err(io::Error::other(format!(
            "UDP_SEGMENT send took {r} of {} bytes",
            buf.len()
        )));
    }
    Ok(())
}

/// What one `UDP_GRO` receive brought, handed out a datagram at a time.
pub(crate) struct Gro {
    buf: Vec<u8>,
    len: usize,
    off: usize,
    seg: usize,
}

impl Gro {
    /// Turns `UDP_GRO` on for `fd`; `None` where the kernel has no GRO for
    /// UDP sockets (the flow then reads datagram by datagram).
    pub(crate) fn on(fd: i32) -> Option<Self> {
        let one: libc::c_int = 1;
        // SAFETY: an int option.
        let r = unsafe {
            libc::setsockopt(
                fd,
                libc::SOL_UDP,
                UDP_GRO,
                (&one as *const libc::c_int).cast(),
                size_of::<libc::c_int>() as u32,
            )
        };
        (r == 0).then(|| Self {
            buf: vec![0; 65_536],
            len: 0,
            off: 0,
            seg: 0,
        })
    }

    /// The next datagram, copied into `parts` (truncated to them, like
    /// `readv`): from what the last receive brought, else from a new
    /// receive on `fd`. Its length, or the receive's error.
    pub(crate) fn read_into(&mut self, fd: i32, parts: [&mut [u8]; 3]) -> io::Result<usize> {
        if self.off >= self.len {
            self.receive(fd)?;
        }
        let end = (self.off + self.seg).min(self.len);
        let d = &self.buf[self.off..end];
        self.off = end;
        let mut at = 0;
        for p in parts {
            let k = p.len().min(d.len() - at);
            p[..k].copy_from_slice(&d[at..at + k]);
            at += k;
        }
        Ok(d.len())
    }

    fn receive(&mut self, fd: i32) -> io::Result<()> {
        let mut iov = libc::iovec {
            iov_base: self.buf.as_mut_ptr().cast(),
            iov_len: self.buf.len(),
        };
        let mut ctl = [0u64; CMSG_ROOM / 8];
        // SAFETY: msghdr is plain data.
        let mut m: libc::msghdr = unsafe { zeroed() };
        m.msg_iov = &mut iov;
        m.msg_iovlen = 1;
        m.msg_control = ctl.as_mut_ptr().cast();
        m.msg_controllen = CMSG_ROOM;
        // SAFETY: every pointer in `m` is live for the call.
        let r = unsafe { libc::recvmsg(fd, &mut m, 0) };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        let len = r as usize;
        let mut seg = len;
        // SAFETY: walking the control messages the kernel wrote into `ctl`.
        unsafe {
            let mut c = libc::CMSG_FIRSTHDR(&m);
            while !c.is_null() {
                if (*c).cmsg_level == libc::SOL_UDP && (*c).cmsg_type == UDP_GRO {
                    let s = std::ptr::read_unaligned(libc::CMSG_DATA(c).cast::<libc::c_int>());
                    if s > 0 {
                        seg = s as usize;
                    }
                }
                c = libc::CMSG_NXTHDR(&m, c);
            }
        }
        (self.len, self.off, self.seg) = (len, 0, seg.max(1));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::UdpSocket;
    use std::os::fd::AsRawFd;

    #[test]
    fn a_batch_reaches_a_gro_receiver_and_a_plain_one_as_the_datagrams_sent() {
        let size = 1000;
        for gro in [true, false] {
            let r = UdpSocket::bind("127.0.0.1:0").unwrap();
            let s = UdpSocket::bind("127.0.0.1:0").unwrap();
            s.connect(r.local_addr().unwrap()).unwrap();
            r.connect(s.local_addr().unwrap()).unwrap();
            let mut b = Batch::new(size).unwrap();
            assert_eq!(b.max, 64);
            for i in 0..10u8 {
                b.push([&[i; 8][..], &vec![i; size - 16], &[i; 8][..]]);
            }
            assert!(b.flush(s.as_raw_fd()).unwrap());
            assert!(b.is_empty());
            let mut g = if gro { Gro::on(r.as_raw_fd()) } else { None };
            for i in 0..10u8 {
                let mut d = vec![0u8; size];
                let n = match g.as_mut() {
                    Some(g) => g.read_into(r.as_raw_fd(), [&mut d, &mut [], &mut []]),
                    None => r.recv(&mut d),
                }
                .unwrap();
                assert_eq!(n, size, "datagram {i} (gro {gro})");
                assert!(d.iter().all(|&x| x == i), "datagram {i} (gro {gro})");
            }
        }
    }

    #[test]
    fn big_datagrams_are_not_batched() {
        assert!(Batch::new(40_000).is_none());
        assert_eq!(Batch::new(30_000).unwrap().max, 2);
    }
}
