//! A Send of any length built at once with its payload left where the
//! caller has it ([`Connection::send_gathered`]): the core frames it
//! (each FPDU's length field and DDP/RDMAP header, its pad and CRC
//! field) and the engine writes those pieces and the caller's bytes in
//! one gathered `sendmsg` — no copy of the payload into a segment or a
//! staging buffer first. [`Connection::send_inline`] copies its payload
//! into the segment, the right trade for a few bytes; for a bulk write
//! that copy was the sender's second-largest cost after the CRC (issue
//! 12: ~19 % of an `iperf3 -P 8` sender's thread, which TCP does not
//! pay). The engine copies only what the socket does not take at once.

use std::ops::Range;

use warpsock_wire::crc::Crc32c;
use warpsock_wire::ddp;
use warpsock_wire::fpdu;

use super::head::Head;
use crate::conn::Connection;

/// The head of an untagged Send FPDU: the length field and the DDP/RDMAP
/// header (RFC 5044 §6.1, RFC 5041 §4.3, RFC 5040 §4.3).
const HEAD_LEN: usize = 2 + ddp::UNTAGGED_HDR_LEN;

/// One FPDU of a gathered Send: the bytes the core built before and after
/// its payload, and which of the message's bytes it carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GatheredFpdu {
    head: [u8; HEAD_LEN],
    /// Pad (zeros to a multiple of four) and the CRC field (zero with CRC
    /// off).
    trailer: [u8; 7],
    trailer_len: u8,
    payload_start: usize,
    payload_end: usize,
}

impl GatheredFpdu {
    /// The length field and the DDP/RDMAP header.
    pub fn head(&self) -> &[u8] {
        &self.head
    }

    /// The message bytes it carries (offsets into the parts, read as one
    /// run).
    pub fn payload(&self) -> Range<usize> {
        self.payload_start..self.payload_end
    }

    /// The pad and the CRC field.
    pub fn trailer(&self) -> &[u8] {
        &self.trailer[..self.trailer_len as usize]
    }

    /// Its bytes on the wire.
    #[allow(clippy::len_without_is_empty)] // never empty: a head at least
    pub fn len(&self) -> usize {
        HEAD_LEN + (self.payload_end - self.payload_start) + self.trailer_len as usize
    }
}

/// Calls `f` with the pieces of `parts` (one run of bytes) covering
/// `range`, in order.
pub fn pieces_of<'a>(parts: &[&'a [u8]], range: Range<usize>, mut f: impl FnMut(&'a [u8])) {
    let (mut skip, mut left) = (range.start, range.len());
    for p in parts {
        if left == 0 {
            break;
        }
        if skip >= p.len() {
            skip -= p.len();
            continue;
        }
        let n = (p.len() - skip).min(left);
        f(&p[skip..skip + n]);
        skip = 0;
        left -= n;
    }
}

impl Connection {
    /// Frames an untagged Send of the bytes of `parts` (in order, any
    /// length) onto the end of `out`, one [`GatheredFpdu`] per FPDU,
    /// *now*, if nothing is queued ahead of it (as for
    /// [`Self::send_inline`]: RTS, the FPDU phase open, no control frame,
    /// Terminate, RTR, message in progress, Read Response or posted
    /// request, the responder's first-FPDU rule met), MPA markers are off
    /// (a marker would fall inside the caller's bytes) and it takes at
    /// most `max_fpdus` FPDUs. Returns false, having changed nothing,
    /// otherwise — the caller then posts the message as a request.
    /// Sends framed one after another, each written after the one before
    /// (a list of them in one `sendmsg`, the engine's
    /// `QpSlot::tx_gathered`), are the posted Sends one after another.
    ///
    /// The FPDUs are, byte for byte, those [`Self::post_send`] of an
    /// unsignalled Send of the same bytes followed by
    /// [`Self::next_segment`] gives: the same MSN sequence, the same split
    /// (`mulpdu`'s payload room per FPDU, as `emit_segment`), the same
    /// header encoder, `Head`. With CRC on, each CRC field is computed
    /// here over the head, the payload's pieces and the pad. No send-queue
    /// entry and no completion: the Send is complete once built (an
    /// unsignalled Send handed to the transport). The caller must write
    /// every FPDU in order, whole, before any other output of the
    /// connection.
    pub fn send_gathered(
        &mut self,
        parts: &[&[u8]],
        out: &mut Vec<GatheredFpdu>,
        max_fpdus: usize,
    ) -> bool {
        debug_assert_eq!(
            self.tx.inline_limit,
            self.inline_limit_now(),
            "TxState::inline_limit stale"
        );
        if self.tx.inline_limit == 0 || self.tx.markers {
            return false;
        }
        let total: usize = parts.iter().map(|p| p.len()).sum();
        let room = self.fpdu_room(ddp::UNTAGGED_HDR_LEN) as usize;
        if total.div_ceil(room).max(1) > max_fpdus {
            return false;
        }
        let kind = self.tx.unposted_send();
        let mut sent = 0;
        loop {
            let take = (total - sent).min(room);
            let last = sent + take == total;
            let head = Head::new(kind, sent as u64, take, last);
            debug_assert_eq!(head.len(), HEAD_LEN);
            let pad = fpdu::pad_len(head.ulpdu_len);
            let mut f = GatheredFpdu {
                head: [0; HEAD_LEN],
                trailer: [0; 7],
                trailer_len: (pad + 4) as u8,
                payload_start: sent,
                payload_end: sent + take,
            };
            head.write(&mut f.head);
            if self.tx.crc_on {
                let mut c = Crc32c::new();
                c.update(&f.head);
                pieces_of(parts, f.payload(), |b| {
                    c.update(b);
                });
                c.update(&f.trailer[..pad]);
                f.trailer[pad..pad + 4].copy_from_slice(&c.trailer());
            }
            // The stream's count, as `begin_fpdu` and `finish_fpdu` keep
            // it (markers are off: nothing else reads it).
            self.tx.len_field_pos = self.tx.pos;
            self.tx.pos += f.len() as u64;
            out.push(f);
            sent += take;
            if last {
                break;
            }
        }
        self.tx.counts.gathered_sends += 1;
        true
    }
}
