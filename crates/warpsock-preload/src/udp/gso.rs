//! The second offload path: kernel UDP with generic segmentation offload.
//! A streaming program's datagrams to one destination are gathered
//! ([`Batch`]) and handed to the kernel in one `sendmsg` with `UDP_SEGMENT`,
//! which cuts them back into ordinary datagrams on the wire: a receiver
//! without the preload sees nothing new. The same adaptive rule as on
//! connections decides what is batched (a lone datagram, or one after a
//! receive, goes at once; a stream waits at most `WARPSOCK_TX_DELAY_US`).
//! On a socket in `gso` mode `UDP_GRO` is on too, and the coalesced
//! buffers the kernel then returns are cut back into datagrams here.
//!
//! Which path a destination takes (`WARPSOCK_UDP_MODE`): `tcp` offload
//! connections, kernel UDP when the peer does not run the preload; `gso`
//! this path for every destination; `auto` (default) connections to peers
//! that run the preload and this path for the others.

use std::mem::{size_of, zeroed};
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use libc::{c_int, msghdr};

use super::config;
use super::conn::{max_dgram, STREAM_GAP};
use super::core::gso::{segments, Batch, Send};
use super::sock::{Inner, Sock};
use super::stats::{self, STATS};
use crate::shim::iov;
use crate::shim::reactor::{Handler, Reactor};
use crate::shim::sys::{self, errno, lock, set_errno};

/// `SOL_UDP` options (linux/udp.h), not in the libc crate for glibc.
const SOL_UDP: c_int = 17;
const UDP_SEGMENT: c_int = 103;
const UDP_GRO: c_int = 104;

/// A batch the kernel would not take now (its send buffer is full) is
/// tried again this much later by the progress thread.
const RETRY: Duration = Duration::from_millis(1);

/// A socket's GSO state (behind `Sock::gso`).
#[derive(Default)]
pub(super) struct Gso {
    batch: Batch,
    /// When the progress thread sends the batch.
    flush_at: Option<Instant>,
    last_send: Option<Instant>,
    /// The kernel refused GSO (too old, or the route cannot): datagrams go
    /// one by one.
    off: bool,
}

/// A coalesced `UDP_GRO` buffer being handed out (behind `Sock::gro`).
pub(super) struct Gro {
    buf: Vec<u8>,
    len: usize,
    pos: usize,
    seg: usize,
    src: Option<SocketAddr>,
}

impl Gro {
    pub(super) fn new() -> Self {
        Self {
            buf: vec![0; 1 << 16],
            len: 0,
            pos: 0,
            seg: 0,
            src: None,
        }
    }
}

/// Turns `UDP_GRO` on for a socket; whether the kernel took it.
pub(super) fn enable_gro(udp: c_int) -> bool {
    sys::set_int(udp, SOL_UDP, UDP_GRO, 1)
}

impl Sock {
    /// Sends one datagram to `dest` on the GSO path (every send call whose
    /// destination takes it lands here).
    ///
    /// # Safety
    /// `msg` must be a valid msghdr whose buffers are readable.
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn gso_send(
        &self,
        eng: &'static Reactor,
        dest: SocketAddr,
        msg: &msghdr,
        flags: c_int,
        len: usize,
        interactive: bool,
        sndtimeo: Option<Duration>,
    ) -> isize {
        let cfg = config::get();
        let nonblock = flags & libc::MSG_DONTWAIT != 0 || self.nonblocking.load(Ordering::Relaxed);
        let max = max_dgram(&dest);
        let now = Instant::now();
        let mut g = lock(&self.gso);
        let streaming = !interactive
            && !cfg.tx_delay.is_zero()
            && g.last_send
                .is_some_and(|t| now.saturating_duration_since(t) < STREAM_GAP);
        g.last_send = Some(now);
        if g.off || len == 0 || len > max || (!streaming && g.batch.is_empty()) {
            // Alone (or not for GSO): after what is gathered, at once.
            if let Err(e) = self.gso_flush(&mut g, nonblock) {
                set_errno(e);
                return -1;
            }
            drop(g);
            stats::inc(&STATS.tx_gso_alone);
            // SAFETY: forwarding the caller's valid msghdr.
            return unsafe { self.kernel_send(msg, flags, sndtimeo) };
        }
        if !g.batch.fits(&dest, len, max) {
            if let Err(e) = self.gso_flush(&mut g, nonblock) {
                set_errno(e);
                return -1;
            }
        }
        // SAFETY: msg_iov describes readable iovecs (contract).
        let parts = unsafe { iov::parts(msg.msg_iov, msg.msg_iovlen) };
        g.batch.push(dest, &parts, len);
        stats::inc(&STATS.tx_gso_dgrams);
        let mut arm = None;
        if g.batch.full(max) || g.flush_at.is_some_and(|t| now >= t) {
            // A batch, sent by this call (no thread hand-off). A datagram
            // gathered is the program's as sent: an error now is the
            // batch's, reported by no call (as with a full path).
            let _ = self.gso_flush(&mut g, nonblock);
        } else if g.flush_at.is_none() {
            let t = now + cfg.tx_delay;
            g.flush_at = Some(t);
            arm = Some(t);
        }
        drop(g);
        if let Some(t) = arm {
            eng.wake_by(t);
        }
        len as isize
    }

    /// Sends what is gathered (caller holds `gso`). A full socket buffer:
    /// a blocking caller waits for room; otherwise the batch stays for the
    /// progress thread and `EAGAIN` is returned.
    pub(super) fn gso_flush(&self, g: &mut Gso, nonblock: bool) -> Result<(), c_int> {
        let Some(s) = g.batch.take() else {
            g.flush_at = None;
            return Ok(());
        };
        loop {
            match self.send_batch(&s) {
                Ok(()) => {
                    g.flush_at = None;
                    return Ok(());
                }
                Err(libc::EINTR) => {}
                Err(libc::EAGAIN) if !nonblock => {
                    let mut p = [libc::pollfd {
                        fd: self.udp,
                        events: libc::POLLOUT,
                        revents: 0,
                    }];
                    sys::poll(&mut p, 100);
                }
                Err(libc::EAGAIN) => {
                    // Put it back for later (the progress thread retries).
                    g.batch = Batch::default();
                    let parts: Vec<&[u8]> = s.buf.chunks(s.seg).collect();
                    for p in parts {
                        g.batch.push(s.dest, &[p], p.len());
                    }
                    g.flush_at = Some(Instant::now() + RETRY);
                    return Err(libc::EAGAIN);
                }
                Err(libc::EIO | libc::EINVAL | libc::ENOPROTOOPT | libc::EOPNOTSUPP)
                    if s.count > 1 =>
                {
                    // No GSO here: one by one from now on.
                    g.off = true;
                    stats::inc(&STATS.tx_gso_off);
                    for p in s.buf.chunks(s.seg) {
                        let one = Send {
                            dest: s.dest,
                            buf: p.to_vec(),
                            seg: p.len(),
                            count: 1,
                        };
                        if self.send_batch(&one).is_err() {
                            stats::inc(&STATS.tx_lost);
                        }
                    }
                    g.flush_at = None;
                    return Ok(());
                }
                Err(_) => {
                    // The path refused them (as kernel UDP would each).
                    stats::add(&STATS.tx_lost, s.count as u64);
                    g.flush_at = None;
                    return Ok(());
                }
            }
        }
    }

    /// One `sendmsg`: the datagrams of `s`, with `UDP_SEGMENT` when more
    /// than one.
    fn send_batch(&self, s: &Send) -> Result<(), c_int> {
        let (ss, alen) = sys::addr_to_raw(&s.dest);
        let mut iov = libc::iovec {
            iov_base: s.buf.as_ptr() as *mut _,
            iov_len: s.buf.len(),
        };
        // Room for one cmsg carrying a u16.
        let mut cbuf = [0u64; 4];
        // SAFETY: msghdr is plain data; zero is a valid empty value.
        let mut m: msghdr = unsafe { zeroed() };
        m.msg_name = (&ss as *const libc::sockaddr_storage).cast_mut().cast();
        m.msg_namelen = alen;
        m.msg_iov = &mut iov;
        m.msg_iovlen = 1;
        if s.count > 1 {
            // SAFETY: CMSG_SPACE is a pure computation.
            let space = unsafe { libc::CMSG_SPACE(size_of::<u16>() as u32) } as usize;
            m.msg_control = cbuf.as_mut_ptr().cast();
            m.msg_controllen = space;
            // SAFETY: the control buffer holds one cmsg of that size.
            unsafe {
                let c = libc::CMSG_FIRSTHDR(&m);
                (*c).cmsg_level = SOL_UDP;
                (*c).cmsg_type = UDP_SEGMENT;
                (*c).cmsg_len = libc::CMSG_LEN(size_of::<u16>() as u32) as usize;
                (libc::CMSG_DATA(c) as *mut u16).write_unaligned(s.seg as u16);
            }
        }
        // SAFETY: `m` describes our buffer, address and control data.
        let r = unsafe { sys::sendmsg_raw(self.udp, &m, libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL) };
        if r < 0 {
            return Err(errno());
        }
        stats::inc(&STATS.tx_gso_sends);
        Ok(())
    }

    /// Receives from the hidden kernel UDP socket through the `UDP_GRO`
    /// buffer: the next datagram of a coalesced buffer, or a fresh read.
    /// `None` when nothing waits.
    ///
    /// # Safety
    /// `msg` must be a valid msghdr whose buffers are writable.
    pub(super) unsafe fn gro_recv(
        &self,
        gro: &mut Gro,
        msg: &mut msghdr,
        flags: c_int,
    ) -> Option<isize> {
        if gro.pos >= gro.len {
            gro.pos = 0;
            gro.len = 0;
            // SAFETY: sockaddr_storage is plain data.
            let mut ss: libc::sockaddr_storage = unsafe { zeroed() };
            let mut iov = libc::iovec {
                iov_base: gro.buf.as_mut_ptr().cast(),
                iov_len: gro.buf.len(),
            };
            let mut cbuf = [0u64; 8];
            // SAFETY: msghdr is plain data.
            let mut m: msghdr = unsafe { zeroed() };
            m.msg_name = (&mut ss as *mut libc::sockaddr_storage).cast();
            m.msg_namelen = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
            m.msg_iov = &mut iov;
            m.msg_iovlen = 1;
            m.msg_control = cbuf.as_mut_ptr().cast();
            m.msg_controllen = size_of::<[u64; 8]>();
            // SAFETY: `m` describes our buffers.
            let n = unsafe { sys::recvmsg_raw(self.udp, &mut m, libc::MSG_DONTWAIT) };
            if n < 0 {
                return None;
            }
            // SAFETY: the kernel wrote the control data of `m`.
            let seg = unsafe { gro_segment(&m) };
            gro.len = n as usize;
            gro.seg = if seg == 0 { gro.len } else { seg };
            // SAFETY: the kernel wrote msg_namelen bytes of address.
            gro.src = unsafe { sys::addr_from_raw(m.msg_name.cast(), m.msg_namelen) };
            if seg > 0 && gro.len > seg {
                stats::inc(&STATS.rx_gro_buffers);
            }
            if gro.len == 0 {
                // An empty datagram.
                // SAFETY: the application's msghdr (contract).
                return Some(unsafe { self.gro_hand(gro, msg, flags, 0..0) });
            }
        }
        let r = segments(gro.len - gro.pos, gro.seg)
            .next()
            .map(|r| r.start + gro.pos..r.end + gro.pos)?;
        // SAFETY: the caller's msghdr.
        Some(unsafe { self.gro_hand(gro, msg, flags, r) })
    }

    /// Hands datagram `r` of the GRO buffer to the program.
    ///
    /// # Safety
    /// As [`Sock::gro_recv`].
    unsafe fn gro_hand(
        &self,
        gro: &mut Gro,
        msg: &mut msghdr,
        flags: c_int,
        r: std::ops::Range<usize>,
    ) -> isize {
        let len = r.len();
        // SAFETY: msg_iov describes writable iovecs (contract).
        let copied = unsafe { iov::scatter(msg.msg_iov, msg.msg_iovlen, &gro.buf[r.clone()]) };
        match (&gro.src, msg.msg_name.is_null()) {
            (Some(src), false) => {
                let src = super::sock::norm(*src, self.family);
                // SAFETY: msg_name is writable for msg_namelen bytes.
                unsafe { sys::addr_write(&src, msg.msg_name.cast(), &mut msg.msg_namelen) };
            }
            _ => msg.msg_namelen = 0,
        }
        msg.msg_controllen = 0;
        msg.msg_flags = if copied < len { libc::MSG_TRUNC } else { 0 };
        if flags & libc::MSG_PEEK == 0 {
            gro.pos = r.end;
            if r.is_empty() {
                gro.len = 0;
            }
            stats::inc(&STATS.rx_kernel_dgrams);
        }
        (if flags & libc::MSG_TRUNC != 0 {
            len
        } else {
            copied
        }) as isize
    }

    /// The length of the datagram [`Sock::gro_recv`] hands out next: the
    /// next of the buffer being handed out, or the first of the kernel's
    /// next buffer (peeked, with its `UDP_GRO` segment size: the kernel's
    /// FIONREAD sizes the whole buffer). `None`: nothing there, or only a
    /// pending error (which a peek would take from the receive).
    pub(super) fn gro_next(&self, gro: &Gro) -> Option<usize> {
        if gro.pos < gro.len {
            return segments(gro.len - gro.pos, gro.seg).next().map(|r| r.len());
        }
        let mut p = [libc::pollfd {
            fd: self.udp,
            events: libc::POLLIN,
            revents: 0,
        }];
        if sys::poll(&mut p, 0) <= 0
            || p[0].revents & (libc::POLLIN | libc::POLLERR) != libc::POLLIN
        {
            return None;
        }
        let mut cbuf = [0u64; 8];
        // SAFETY: msghdr is plain data; no buffer, only control data.
        let mut m: msghdr = unsafe { zeroed() };
        m.msg_control = cbuf.as_mut_ptr().cast();
        m.msg_controllen = size_of::<[u64; 8]>();
        let flags = libc::MSG_PEEK | libc::MSG_TRUNC | libc::MSG_DONTWAIT;
        // SAFETY: `m` describes our control buffer.
        let n = unsafe { sys::recvmsg_raw(self.udp, &mut m, flags) };
        if n < 0 {
            return None;
        }
        // SAFETY: the kernel wrote the control data of `m`.
        let seg = unsafe { gro_segment(&m) };
        Some(if seg == 0 {
            n as usize
        } else {
            seg.min(n as usize)
        })
    }

    /// `gro_recv` served a datagram (caller holds `inner`): a doorbell for
    /// what the buffer still holds; after its last, with nothing behind
    /// it, settled as a plain kernel receive is (the doorbell stayed, and
    /// the descriptor read as ready with nothing to receive).
    pub(super) fn gro_served(&self, g: &mut Inner, peek: bool) {
        if self.gro_pending() {
            if g.bells == 0 {
                self.ring(g);
            }
        } else if g.bells > 0 && !peek && !self.udp_readable() {
            g.udp_maybe = false;
            self.settle(g);
        }
    }

    /// Whether a coalesced buffer still holds datagrams.
    pub(super) fn gro_pending(&self) -> bool {
        self.gro.as_ref().is_some_and(|g| {
            let g = lock(g);
            g.pos < g.len
        })
    }
}

/// The `UDP_GRO` segment size in `m`'s control data (0: none, a lone
/// datagram).
///
/// # Safety
/// `m`'s control data must be what the kernel wrote.
unsafe fn gro_segment(m: &msghdr) -> usize {
    let mut seg = 0;
    // SAFETY: walking the control data the kernel wrote (contract).
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(m);
        while !c.is_null() {
            if (*c).cmsg_level == SOL_UDP && (*c).cmsg_type == UDP_GRO {
                seg = (libc::CMSG_DATA(c) as *const u16).read_unaligned() as usize;
            }
            c = libc::CMSG_NXTHDR(m, c);
        }
    }
    seg
}

/// The progress thread's entry for a socket's GSO batch: sends what a
/// stream left when its delay is up.
pub(super) struct GsoTimer(pub(super) Arc<Sock>);

impl Handler for GsoTimer {
    fn on_ready(&self, _reactor: &'static Reactor, _events: u32) {}

    fn deadline(&self) -> Option<Instant> {
        lock(&self.0.gso).flush_at
    }

    fn on_timer(&self, _reactor: &'static Reactor, now: Instant) -> bool {
        let mut g = lock(&self.0.gso);
        if g.flush_at.is_some_and(|t| t <= now) {
            stats::inc(&STATS.tx_gso_tails);
            let _ = self.0.gso_flush(&mut g, true);
        }
        drop(g);
        lock(&self.0.inner).closed && !self.pending()
    }

    fn pending(&self) -> bool {
        !lock(&self.0.gso).batch.is_empty()
    }
}
