//! A connection's send buffer: the preamble (outgoing connections), then
//! framed datagrams, and how much of it the kernel has taken.
//!
//! Pure bookkeeping over bytes: the driver writes [`TxBuf::unsent`] and
//! reports [`TxBuf::written`]; when a connection fails, [`TxBuf::take_unsent`]
//! and [`TxBuf::die`] recover the whole datagrams that never reached the
//! kernel, so that they can go by kernel UDP (none twice, none half).

use super::frame::{self, Stripe, HDR_LEN, PREAMBLE_LEN};

/// Bytes already written after which the written prefix is dropped (up to
/// a frame boundary) instead of growing the buffer further.
const COMPACT_AT: usize = 1 << 20;

/// The send buffer of one connection.
#[derive(Debug, Default)]
pub(crate) struct TxBuf {
    out: Vec<u8>,
    /// Bytes of `out` already written.
    off: usize,
    /// A frame boundary at or before `off` (or the end of the preamble).
    boundary: usize,
    /// Length of the preamble at the front of `out` while it is unsent.
    preamble: usize,
}

impl TxBuf {
    /// An outgoing connection's buffer: the preamble naming `port`, sent
    /// first once the acceptor's hello arrives.
    pub(crate) fn outgoing(port: u16) -> Self {
        Self {
            out: frame::preamble(port).to_vec(),
            off: 0,
            boundary: PREAMBLE_LEN,
            preamble: PREAMBLE_LEN,
        }
    }

    /// Whether every byte has been written.
    pub(crate) fn is_idle(&self) -> bool {
        self.off == self.out.len()
    }

    /// Bytes not yet written.
    pub(crate) fn queued(&self) -> usize {
        self.out.len() - self.off
    }

    /// Whether nothing at all has been written yet (the preamble is intact
    /// at the front).
    pub(crate) fn untouched(&self) -> bool {
        self.off == 0 && self.preamble > 0 && self.boundary == self.preamble
    }

    /// Turns the untouched preamble into a striped one. Returns whether it
    /// did.
    pub(crate) fn stripe(&mut self, s: Stripe) -> bool {
        if !self.untouched() || self.preamble != PREAMBLE_LEN {
            return false;
        }
        self.boundary = frame::extend_preamble(&mut self.out, s);
        self.preamble = self.boundary;
        true
    }

    /// Appends a control frame of `kind` (no payload).
    pub(crate) fn push_control(&mut self, kind: u16) {
        self.out.extend_from_slice(&frame::control(kind));
    }

    /// Appends one datagram, gathered from `parts`.
    pub(crate) fn push(&mut self, len: usize, parts: &[&[u8]]) {
        self.out.extend_from_slice(&frame::header(len));
        for p in parts {
            self.out.extend_from_slice(p);
        }
    }

    /// Starts over with one datagram of which the kernel took `written`
    /// bytes already (header included): a direct write on an idle
    /// connection that was cut short.
    pub(crate) fn rest_of(&mut self, len: usize, parts: &[&[u8]], written: usize) {
        self.out.clear();
        self.off = 0;
        self.boundary = 0;
        self.preamble = 0;
        self.push(len, parts);
        self.off = written.min(self.out.len());
    }

    /// The bytes to write next.
    pub(crate) fn unsent(&self) -> &[u8] {
        &self.out[self.off..]
    }

    /// The kernel took `n` more bytes.
    pub(crate) fn written(&mut self, n: usize) {
        self.off = (self.off + n).min(self.out.len());
        if self.off >= self.preamble {
            self.preamble = 0;
        }
        if self.off == self.out.len() {
            self.out.clear();
            self.off = 0;
            self.boundary = 0;
        } else if self.off >= COMPACT_AT && self.boundary <= self.off {
            // Drop what is written, up to the last frame boundary.
            let mut b = self.boundary;
            while let Some(len) = frame::frame_len(&self.out[b..]) {
                if b + len > self.off {
                    break;
                }
                b += len;
            }
            self.out.drain(..b);
            self.off -= b;
            self.boundary = 0;
        }
    }

    /// An attempt failed before anything was written: takes the queued
    /// datagrams out (to go by kernel UDP now), keeping the preamble for
    /// the next attempt.
    pub(crate) fn take_unsent(&mut self) -> Vec<Vec<u8>> {
        if !self.untouched() || self.out.len() <= self.preamble {
            return Vec::new();
        }
        let frames = frame::frames_from(&self.out, self.preamble, 0);
        let out = frames
            .into_iter()
            .map(|(p, l)| self.out[p..p + l].to_vec())
            .collect();
        self.out.truncate(self.preamble);
        out
    }

    /// The connection is closed: returns the whole datagrams not yet
    /// written, and how many were cut (partly written: lost).
    pub(crate) fn die(&mut self) -> (Vec<Vec<u8>>, u64) {
        let mut frames = Vec::new();
        let mut lost = 0;
        let from = self.boundary.max(self.preamble).min(self.out.len());
        for (pos, len) in frame::frames_from(&self.out, from, 0) {
            if pos - HDR_LEN >= self.off {
                frames.push(self.out[pos..pos + len].to_vec());
            } else if pos + len > self.off {
                lost += 1;
            }
        }
        *self = Self::default();
        (frames, lost)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dgram(tag: u8, len: usize) -> Vec<u8> {
        vec![tag; len]
    }

    fn filled(port: u16, lens: &[usize]) -> TxBuf {
        let mut t = TxBuf::outgoing(port);
        for (i, &l) in lens.iter().enumerate() {
            let d = dgram(i as u8, l);
            t.push(l, &[&d[..l / 2], &d[l / 2..]]);
        }
        t
    }

    #[test]
    fn preamble_then_frames_then_idle() {
        let mut t = filled(5001, &[3, 0, 7]);
        assert!(t.untouched());
        assert_eq!(&t.unsent()[..8], &frame::preamble(5001));
        assert_eq!(t.queued(), 8 + 4 + 3 + 4 + 4 + 7);
        t.written(10);
        assert!(!t.untouched() && !t.is_idle());
        let n = t.queued();
        t.written(n);
        assert!(t.is_idle());
        assert_eq!(t.queued(), 0);
    }

    #[test]
    fn failed_attempt_gives_back_queued_datagrams_and_keeps_the_preamble() {
        let mut t = filled(7, &[3, 5]);
        let back = t.take_unsent();
        assert_eq!(back, vec![dgram(0, 3), dgram(1, 5)]);
        assert_eq!(t.unsent(), &frame::preamble(7));
        assert!(t.take_unsent().is_empty());
    }

    #[test]
    fn striping_rewrites_an_untouched_preamble_only() {
        let s = Stripe {
            group: 9,
            index: 1,
            count: 2,
        };
        let mut t = filled(7, &[2]);
        assert!(t.stripe(s));
        assert!(!t.stripe(s), "once");
        assert!(matches!(
            frame::parse_preamble(t.unsent()),
            frame::ParsedPreamble::Done(p, 16) if p.stripe == Some(s)
        ));
        assert_eq!(t.take_unsent(), vec![dgram(0, 2)]);
        let mut w = filled(7, &[2]);
        w.written(1);
        assert!(!w.stripe(s));
    }

    #[test]
    fn die_recovers_whole_unwritten_datagrams_and_counts_cut_ones() {
        // Preamble 0..8, frames at 8 (3), 15 (5), 24 (2).
        let mut t = filled(7, &[3, 5, 2]);
        t.written(16); // inside the second frame
        let (frames, lost) = t.die();
        assert_eq!(frames, vec![dgram(2, 2)]);
        assert_eq!(lost, 1);
        assert!(t.is_idle());
        // Nothing written: every datagram comes back, the preamble does not.
        let mut t = filled(7, &[3, 5]);
        assert_eq!(t.die(), (vec![dgram(0, 3), dgram(1, 5)], 0));
    }

    #[test]
    fn short_direct_write_keeps_the_rest() {
        let mut t = TxBuf::default();
        let d = dgram(4, 10);
        t.rest_of(10, &[&d], 6);
        assert_eq!(t.unsent(), &d[2..]);
        assert_eq!(t.die(), (vec![], 1));
    }

    #[test]
    fn compaction_keeps_unwritten_frames_intact() {
        let mut t = TxBuf::outgoing(1);
        let big = dgram(1, 60_000);
        for _ in 0..40 {
            t.push(big.len(), &[&big]);
        }
        let total = t.queued();
        // Write in odd pieces past the compaction threshold.
        let mut done = 0;
        while done < COMPACT_AT + 12_345 {
            t.written(7_777);
            done += 7_777;
        }
        assert_eq!(t.queued(), total - done);
        assert!(t.out.len() < total, "the written prefix was dropped");
        let (frames, lost) = t.die();
        assert_eq!(lost, 1);
        assert!(frames.iter().all(|f| f == &big));
        assert_eq!(frames.len(), (total - done) / (big.len() + HDR_LEN));
    }
}
