//! The unit of output the transmit path hands an engine ([`TxSegment`]):
//! one MPA frame or FPDU as a gather list of bytes the core built and
//! ranges of registered memory, with its CRC sealed over exactly those
//! bytes.

use warpsock_wire::crc::Crc32c;
use warpsock_wire::ddp::Opcode;

use crate::mem::{Backing, Range, Registry};

/// One piece of a [`TxSegment`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TxPart {
    /// Bytes `start..end` of [`TxSegment::inline_bytes`].
    Inline {
        /// First byte.
        start: usize,
        /// One past the last byte.
        end: usize,
    },
    /// Payload in registered memory.
    Memory(Range),
}

/// A unit of output: a control frame or one FPDU, as a gather list.
#[derive(Debug, Clone, Default)]
pub struct TxSegment {
    pub(super) buf: Vec<u8>,
    parts: Vec<TxPart>,
    /// Index in `buf` of the 4 CRC bytes, when CRC is negotiated.
    pub(super) crc_at: Option<usize>,
    len: usize,
    /// The RDMAP opcode of the FPDU (None: an MPA frame).
    pub(super) opcode: Option<Opcode>,
}

impl TxSegment {
    /// The pieces, in wire order.
    pub fn parts(&self) -> &[TxPart] {
        &self.parts
    }

    /// The buffer [`TxPart::Inline`] indexes into.
    pub fn inline_bytes(&self) -> &[u8] {
        &self.buf
    }

    /// Total bytes on the wire.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the segment is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The RDMAP opcode of the FPDU this segment carries, or `None` for an
    /// MPA Request/Reply. An engine uses it to tell, without parsing the
    /// bytes back (markers may sit inside the header), whether the
    /// payload is its own request's buffer or a region it exposes to the
    /// peer ([`Opcode::RdmaReadResponse`]).
    pub fn opcode(&self) -> Option<Opcode> {
        self.opcode
    }

    pub(super) fn clear(&mut self) {
        self.buf.clear();
        self.parts.clear();
        self.crc_at = None;
        self.len = 0;
        self.opcode = None;
    }

    /// Makes the segment the bytes of `pieces`, already framed and sealed
    /// (what the socket did not take of a gathered Send's FPDUs,
    /// [`Connection::send_gathered`](super::Connection::send_gathered)):
    /// inline bytes, no CRC left to compute. `opcode`: the FPDUs'.
    pub fn set_framed<'a>(&mut self, opcode: Opcode, pieces: impl IntoIterator<Item = &'a [u8]>) {
        self.clear();
        self.opcode = Some(opcode);
        for p in pieces {
            self.push_inline(p);
        }
    }

    /// Drops the buffer's allocation if it is larger than `max` bytes (a
    /// gathered Send's copied rest, up to megabytes): an engine keeps
    /// spent segments for reuse, and one such rest would otherwise stay
    /// allocated for the connection's life.
    pub fn release_large(&mut self, max: usize) {
        if self.buf.capacity() > max {
            self.buf = Vec::new();
        }
    }

    pub(super) fn push_inline(&mut self, bytes: &[u8]) {
        if bytes.is_empty() {
            return;
        }
        let start = self.buf.len();
        self.buf.extend_from_slice(bytes);
        self.note_inline(start);
    }

    /// Counts the bytes of the buffer from `start` (written into it
    /// directly) as the segment's next inline bytes.
    pub(super) fn note_inline(&mut self, start: usize) {
        self.len += self.buf.len() - start;
        if let Some(TxPart::Inline { end, .. }) = self.parts.last_mut() {
            if *end == start {
                *end = self.buf.len();
                return;
            }
        }
        self.parts.push(TxPart::Inline {
            start,
            end: self.buf.len(),
        });
    }

    pub(super) fn push_memory(&mut self, r: Range) {
        if r.len == 0 {
            return;
        }
        self.len += r.len as usize;
        self.parts.push(TxPart::Memory(r));
    }

    /// Computes the CRC trailer over the segment's bytes (reading payload
    /// from `reg`). Returns false if a payload region has disappeared.
    ///
    /// Inline, the look for a CRC field only: without CRC (negotiated
    /// off) there is nothing to compute, and every small Send asks.
    #[inline]
    pub fn seal<B: Backing>(&mut self, reg: &Registry<B>) -> bool {
        match self.crc_at {
            None => true,
            Some(at) => self.seal_crc(reg, at),
        }
    }

    #[inline(never)]
    fn seal_crc<B: Backing>(&mut self, reg: &Registry<B>, at: usize) -> bool {
        let mut c = Crc32c::new();
        for p in &self.parts {
            match *p {
                // The CRC field is the segment's last 4 bytes, possibly
                // at the end of an inline part that holds more.
                TxPart::Inline { start, end } => c.update(&self.buf[start.min(at)..end.min(at)]),
                TxPart::Memory(r) => match reg.range_slice(&r, r.len as usize) {
                    Some(b) => c.update(b),
                    None => return false,
                },
            };
        }
        self.buf[at..at + 4].copy_from_slice(&c.trailer());
        true
    }

    /// Appends the (sealed) segment's bytes to `out`. Returns false if a
    /// payload region has disappeared.
    pub fn write_to<B: Backing>(&self, reg: &Registry<B>, out: &mut Vec<u8>) -> bool {
        for p in &self.parts {
            match *p {
                TxPart::Inline { start, end } => out.extend_from_slice(&self.buf[start..end]),
                TxPart::Memory(r) => match reg.range_slice(&r, r.len as usize) {
                    Some(b) => out.extend_from_slice(b),
                    None => return false,
                },
            }
        }
        true
    }
}
