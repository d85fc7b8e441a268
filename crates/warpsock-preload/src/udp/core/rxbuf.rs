//! A connection's receive buffer: bytes read from the TCP stream and not
//! yet consumed, split into frames (datagrams) in place.
//!
//! The driver reads into [`RxBuf::spare`] (there is always room for a whole
//! frame of the largest size after [`RxBuf::spare`] compacts) and reports
//! [`RxBuf::filled`]; [`RxBuf::next_frame`] then hands out whole datagrams
//! one at a time. The buffer is allocated on first use and returned with
//! [`RxBuf::release`].

use std::ops::Range;

use super::frame::{self, Parsed, HDR_LEN, MAX_DGRAM};

/// Size of a connection's receive buffer.
pub(crate) const RXBUF: usize = 256 << 10;

/// The stream is not warpsock framing (or carries a datagram longer than
/// its source's family allows).
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Invalid;

/// One whole frame, consumed from the buffer.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Item {
    /// A datagram: its payload's range (see [`RxBuf::payload`]).
    Dgram(Range<usize>),
    /// A control frame of this kind, with its payload's range.
    Control(u16, Range<usize>),
}

/// The receive buffer of one connection.
#[derive(Debug, Default)]
pub(crate) struct RxBuf {
    buf: Vec<u8>,
    start: usize,
    end: usize,
}

impl RxBuf {
    /// Room to read into: at least one largest frame.
    pub(crate) fn spare(&mut self) -> &mut [u8] {
        if self.buf.is_empty() {
            self.buf = vec![0; RXBUF];
        }
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        }
        if self.buf.len() - self.end < MAX_DGRAM + HDR_LEN {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        &mut self.buf[self.end..]
    }

    /// `n` bytes were read into [`RxBuf::spare`].
    pub(crate) fn filled(&mut self, n: usize) {
        self.end = (self.end + n).min(self.buf.len());
    }

    /// Bytes read and not consumed.
    pub(crate) fn pending(&self) -> &[u8] {
        &self.buf[self.start..self.end]
    }

    /// What the next frame is, without consuming it.
    pub(crate) fn peek(&self) -> Parsed {
        frame::parse(self.pending())
    }

    /// Consumes `n` bytes of [`RxBuf::pending`] (a hello or preamble).
    pub(crate) fn consume(&mut self, n: usize) {
        self.start = (self.start + n).min(self.end);
    }

    /// The next whole frame, consumed; `Ok(None)` if the next one is not
    /// complete yet. A datagram longer than `max` (65,507 bytes from an
    /// IPv4 source) is invalid.
    pub(crate) fn next_frame(&mut self, max: usize) -> Result<Option<Item>, Invalid> {
        let (len, kind) = match frame::parse(self.pending()) {
            Parsed::Frame(len) if len > max => return Err(Invalid),
            Parsed::Frame(len) => (len, None),
            Parsed::Control(kind, len) => (len, Some(kind)),
            Parsed::Partial => return Ok(None),
            Parsed::Invalid => return Err(Invalid),
        };
        let p = self.start + HDR_LEN;
        self.start = p + len;
        Ok(Some(match kind {
            None => Item::Dgram(p..p + len),
            Some(k) => Item::Control(k, p..p + len),
        }))
    }

    /// The bytes of a range [`RxBuf::next_frame`] returned (valid until the
    /// next [`RxBuf::spare`]).
    pub(crate) fn payload(&self, r: Range<usize>) -> &[u8] {
        &self.buf[r]
    }

    /// Frees the buffer (the connection is closed).
    pub(crate) fn release(&mut self) {
        *self = Self::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stream(lens: &[usize]) -> Vec<u8> {
        let mut s = Vec::new();
        for (i, &l) in lens.iter().enumerate() {
            s.extend_from_slice(&frame::header(l));
            s.extend(std::iter::repeat_n(i as u8, l));
        }
        s
    }

    /// Feeds `s` in pieces of `cut` bytes; returns the datagrams.
    fn feed(s: &[u8], cut: usize) -> Result<Vec<Vec<u8>>, Invalid> {
        let mut rx = RxBuf::default();
        let mut out = Vec::new();
        for piece in s.chunks(cut) {
            let room = rx.spare();
            assert!(room.len() >= MAX_DGRAM + HDR_LEN);
            room[..piece.len()].copy_from_slice(piece);
            rx.filled(piece.len());
            while let Some(item) = rx.next_frame(MAX_DGRAM)? {
                match item {
                    Item::Dgram(r) => out.push(rx.payload(r).to_vec()),
                    Item::Control(..) => panic!("no control frames here"),
                }
            }
        }
        assert!(rx.pending().is_empty());
        Ok(out)
    }

    #[test]
    fn frames_survive_any_cut() {
        let lens = [0usize, 1, 1472, MAX_DGRAM, 3, MAX_DGRAM, 0];
        let s = stream(&lens);
        for cut in [1, 3, 4, 5, 1000, 65_539, 200_000, s.len()] {
            let got = feed(&s, cut).unwrap();
            let want: Vec<Vec<u8>> = lens
                .iter()
                .enumerate()
                .map(|(i, &l)| vec![i as u8; l])
                .collect();
            assert_eq!(got, want, "cut {cut}");
        }
    }

    #[test]
    fn oversized_frame_is_invalid() {
        let mut s = stream(&[2]);
        s.extend_from_slice(&[0, 1, 0, 0]);
        assert_eq!(feed(&s, 100), Err(Invalid));
    }

    #[test]
    fn ipv4_sources_send_at_most_65507_bytes() {
        let s = stream(&[frame::MAX_DGRAM_V4 + 1]);
        let mut rx = RxBuf::default();
        rx.spare()[..s.len()].copy_from_slice(&s);
        rx.filled(s.len());
        assert_eq!(rx.next_frame(frame::MAX_DGRAM_V4), Err(Invalid));
        let s = stream(&[frame::MAX_DGRAM_V4]);
        let mut rx = RxBuf::default();
        rx.spare()[..s.len()].copy_from_slice(&s);
        rx.filled(s.len());
        assert!(matches!(
            rx.next_frame(frame::MAX_DGRAM_V4),
            Ok(Some(Item::Dgram(r))) if r.len() == frame::MAX_DGRAM_V4
        ));
    }

    #[test]
    fn control_frames_come_out_as_such() {
        let mut s = frame::control(frame::CTRL_PROVEN).to_vec();
        s.extend(stream(&[1]));
        let mut rx = RxBuf::default();
        rx.spare()[..s.len()].copy_from_slice(&s);
        rx.filled(s.len());
        assert_eq!(
            rx.next_frame(MAX_DGRAM),
            Ok(Some(Item::Control(frame::CTRL_PROVEN, 4..4)))
        );
        assert!(matches!(rx.next_frame(MAX_DGRAM), Ok(Some(Item::Dgram(_)))));
        assert_eq!(rx.next_frame(MAX_DGRAM), Ok(None));
    }

    #[test]
    fn preamble_bytes_are_consumed_before_frames() {
        let mut s = frame::preamble(9).to_vec();
        s.extend(stream(&[5]));
        let mut rx = RxBuf::default();
        rx.spare()[..s.len()].copy_from_slice(&s);
        rx.filled(s.len());
        assert!(matches!(
            frame::parse_preamble(rx.pending()),
            frame::ParsedPreamble::Done(_, 8)
        ));
        rx.consume(8);
        let Some(Item::Dgram(r)) = rx.next_frame(MAX_DGRAM).unwrap() else {
            panic!("a datagram")
        };
        assert_eq!(rx.payload(r), &[0; 5]);
        rx.release();
        assert!(rx.pending().is_empty());
    }
}
