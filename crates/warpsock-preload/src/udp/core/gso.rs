//! The UDP GSO path: a burst of datagrams to one destination gathered into
//! one `UDP_SEGMENT` send (the kernel cuts it back into ordinary datagrams
//! on the wire, so a receiver without the preload sees nothing new), and a
//! `UDP_GRO` buffer cut back into datagrams on a preloaded receiver.
//!
//! Pure bookkeeping over bytes: the driver (`crate::udp::gso`) does the
//! system calls.

use std::net::SocketAddr;

/// Most segments one GSO send may carry (`UDP_MAX_SEGMENTS` of Linux 4.18;
/// later kernels allow 128).
pub(crate) const MAX_SEGMENTS: usize = 64;

/// Which path a socket's datagrams take (`WARPSOCK_UDP_MODE`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    /// TCP offload to peers that run the preload; kernel UDP otherwise.
    Tcp,
    /// Kernel UDP with GSO batching for every destination (no TCP).
    Gso,
    /// TCP offload to peers that run the preload; GSO otherwise.
    Auto,
}

impl Mode {
    /// Parses `tcp`, `gso` or `auto`.
    pub(crate) fn parse(s: &str) -> Option<Self> {
        match s.trim() {
            "tcp" => Some(Self::Tcp),
            "gso" => Some(Self::Gso),
            "auto" => Some(Self::Auto),
            _ => None,
        }
    }

    /// Whether destinations are first tried over TCP.
    pub(crate) fn tcp(self) -> bool {
        self != Self::Gso
    }

    /// Whether kernel UDP sends are batched with GSO.
    pub(crate) fn gso(self) -> bool {
        self != Self::Tcp
    }
}

/// Datagrams gathered for one GSO send: all of `seg` bytes but the last,
/// which may be shorter (and then closes the batch), to one destination.
#[derive(Debug, Default)]
pub(crate) struct Batch {
    dest: Option<SocketAddr>,
    buf: Vec<u8>,
    seg: usize,
    count: usize,
    /// The last datagram was shorter than `seg`: nothing may follow.
    closed: bool,
}

/// A batch taken for sending.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Send {
    pub(crate) dest: SocketAddr,
    pub(crate) buf: Vec<u8>,
    /// Segment size (`UDP_SEGMENT`); the buffer is one datagram when
    /// `count` is 1.
    pub(crate) seg: usize,
    pub(crate) count: usize,
}

impl Batch {
    /// Whether nothing is gathered.
    pub(crate) fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Whether a datagram of `len` bytes to `dest` may join, with at most
    /// `max_total` bytes in one send (what the destination's family allows
    /// a UDP payload: the kernel refuses larger GSO sends).
    pub(crate) fn fits(&self, dest: &SocketAddr, len: usize, max_total: usize) -> bool {
        if self.count == 0 {
            return len > 0;
        }
        self.dest.as_ref() == Some(dest)
            && !self.closed
            && len > 0
            && len <= self.seg
            && self.count < MAX_SEGMENTS
            && self.buf.len() + len <= max_total
    }

    /// Appends a datagram gathered from `parts` (`len` bytes; the caller
    /// checked [`Batch::fits`]).
    pub(crate) fn push(&mut self, dest: SocketAddr, parts: &[&[u8]], len: usize) {
        if self.count == 0 {
            self.dest = Some(dest);
            self.seg = len;
            self.closed = false;
        } else if len < self.seg {
            self.closed = true;
        }
        for p in parts {
            self.buf.extend_from_slice(p);
        }
        self.count += 1;
    }

    /// Whether the batch can take no datagram of its segment size more.
    pub(crate) fn full(&self, max_total: usize) -> bool {
        self.closed || self.count >= MAX_SEGMENTS || self.buf.len() + self.seg > max_total
    }

    /// Takes the batch for sending.
    pub(crate) fn take(&mut self) -> Option<Send> {
        if self.count == 0 {
            return None;
        }
        let s = Send {
            dest: self.dest.take()?,
            buf: std::mem::take(&mut self.buf),
            seg: self.seg,
            count: self.count,
        };
        self.count = 0;
        self.closed = false;
        Some(s)
    }
}

/// Cuts a `UDP_GRO` buffer of `len` bytes into datagrams of `seg` bytes
/// (the last may be shorter): their ranges.
pub(crate) fn segments(len: usize, seg: usize) -> impl Iterator<Item = std::ops::Range<usize>> {
    let seg = if seg == 0 { len.max(1) } else { seg };
    (0..len).step_by(seg).map(move |s| s..(s + seg).min(len))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(p: u16) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], p))
    }

    const MAX: usize = 65_507;

    #[test]
    fn equal_datagrams_gather_until_the_size_or_count_limit() {
        let mut b = Batch::default();
        let data = vec![7u8; 1470];
        let mut n = 0;
        while b.fits(&d(1), 1470, MAX) {
            b.push(d(1), &[&data[..100], &data[100..]], 1470);
            n += 1;
        }
        assert_eq!(n, 44, "65,507 / 1,470");
        assert!(b.full(MAX));
        let s = b.take().unwrap();
        assert_eq!((s.seg, s.count, s.buf.len()), (1470, 44, 44 * 1470));
        assert!(b.is_empty() && b.take().is_none());
        // Small datagrams stop at the segment count.
        for _ in 0..MAX_SEGMENTS {
            assert!(b.fits(&d(1), 8, MAX));
            b.push(d(1), &[b"12345678"], 8);
        }
        assert!(!b.fits(&d(1), 8, MAX) && b.full(MAX));
    }

    #[test]
    fn a_shorter_datagram_closes_the_batch_and_a_longer_one_does_not_fit() {
        let mut b = Batch::default();
        b.push(d(1), &[&[1; 100]], 100);
        assert!(!b.fits(&d(1), 101, MAX), "longer than the segment");
        assert!(!b.fits(&d(2), 100, MAX), "another destination");
        assert!(!b.fits(&d(1), 0, MAX), "empty datagrams go alone");
        b.push(d(1), &[&[2; 60]], 60);
        assert!(!b.fits(&d(1), 60, MAX), "nothing after a short one");
        assert!(b.full(MAX));
        let s = b.take().unwrap();
        assert_eq!((s.seg, s.count, s.buf.len()), (100, 2, 160));
        assert!(!Batch::default().fits(&d(1), 0, MAX));
    }

    #[test]
    fn gro_buffers_cut_back_into_the_datagrams() {
        let r: Vec<_> = segments(3000, 1400).collect();
        assert_eq!(r, [0..1400, 1400..2800, 2800..3000]);
        assert_eq!(segments(1400, 1400).collect::<Vec<_>>(), vec![(0..1400)]);
        assert_eq!(
            segments(5, 0).collect::<Vec<_>>(),
            vec![(0..5)],
            "no GRO: one"
        );
        assert_eq!(segments(0, 100).count(), 0);
    }

    #[test]
    fn modes() {
        assert_eq!(Mode::parse("gso"), Some(Mode::Gso));
        assert_eq!(Mode::parse(" auto "), Some(Mode::Auto));
        assert_eq!(Mode::parse("udp"), None);
        assert!(Mode::Tcp.tcp() && !Mode::Tcp.gso());
        assert!(!Mode::Gso.tcp() && Mode::Gso.gso());
        assert!(Mode::Auto.tcp() && Mode::Auto.gso());
    }
}
