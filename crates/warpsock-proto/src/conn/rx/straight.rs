//! The one-FPDU Send's straight path: the common case of
//! [`Connection::rx_fpdu`] (a whole untagged Send or Send with Solicited
//! Event, Last, MO 0, the expected MSN on queue 0, no Send in progress, the
//! head posted receive one buffer the payload fits in) checked on the raw
//! bytes and finished in one go, without the header parse, the scatter
//! walk and the segment machinery.
//!
//! The contract: when it takes an FPDU, the connection ends in exactly the
//! state the general path (header → payload → trailer, `finish_segment`)
//! would leave — the same completion, receive queue, expected MSN, stream
//! position, last Send length and reset segment state — and no event. It
//! declines (and changes nothing) on anything else: a different opcode or
//! flag, an unexpected MSN or queue, RTR pending, a receive of several
//! buffers or one that is invalid or too short, a CRC that does not match
//! (RFC 5044 §8: the general path reports it, siw's "LLP/MPA CRC"), a
//! region gone under the copy. The general path then sees the FPDU exactly
//! as it would have.

use warpsock_wire::ddp::{self, Opcode};
use warpsock_wire::{crc, fpdu};

use super::super::Connection;
use super::Phase;
use crate::mem::{Access, Backing, Registry};
use crate::verbs::{WcOpcode, WcStatus, WorkCompletion, WorkQueue};

/// DDP control bits the straight path looks at (last, version; the
/// caller took only untagged headers); the reserved bits are ignored as
/// `SegmentHeader::parse` ignores them.
const DDP_MASK: u8 = ddp::DDP_LAST | ddp::DDP_VERSION_MASK;
/// A last segment of DDP version 1.
const DDP_SEND_LAST: u8 = ddp::DDP_LAST | ddp::DDP_VERSION;

fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

impl Connection {
    /// Takes the whole FPDU of `total` bytes at the front of `data` (its
    /// ULPDU `ulpdu_len` bytes, header untagged) when it is a one-FPDU
    /// Send the straight path serves; `false` leaves everything as it was.
    ///
    /// The caller ([`Connection::rx_fpdu`]) has checked the stream stands
    /// at an FPDU boundary without markers, that all `total` bytes are
    /// there and that the ULPDU holds an untagged header.
    pub(super) fn rx_send_straight<B: Backing>(
        &mut self,
        data: &[u8],
        ulpdu_len: usize,
        total: usize,
        reg: &mut Registry<B>,
    ) -> bool {
        debug_assert!(self.rx.phase == Phase::Header && self.rx.buf.is_empty());
        debug_assert!(data.len() >= total && ulpdu_len >= ddp::UNTAGGED_HDR_LEN);
        debug_assert!(data[2] & ddp::DDP_TAGGED == 0);
        if data[2] & DDP_MASK != DDP_SEND_LAST || data[3] >> 6 != ddp::RDMAP_VERSION {
            return false;
        }
        let solicited = match data[3] & 0x0f {
            op if op == Opcode::Send as u8 => false,
            op if op == Opcode::SendSe as u8 => true,
            _ => return false,
        };
        // Untagged header after the length and control bytes: invalidate
        // STag (2..6, unused by these opcodes), QN, MSN, MO (RFC 5041 §5).
        let hdr = &data[2..2 + ddp::UNTAGGED_HDR_LEN];
        let rx = &self.rx;
        if rx.rtr_pending
            || rx.send.is_some()
            || be32(hdr, 6) != ddp::queue::SEND
            || be32(hdr, 10) != rx.expected_msn[0]
            || be32(hdr, 14) != 0
        {
            return false;
        }
        let Some(head) = self.rq.front() else {
            return false;
        };
        let [s] = &head.wr.sgl[..] else {
            return false;
        };
        let payload_len = ulpdu_len - ddp::UNTAGGED_HDR_LEN;
        let Ok(r) = reg.check(
            self.cfg.pd,
            s.lkey,
            s.addr,
            u64::from(s.length),
            Access::LOCAL_WRITE,
        ) else {
            return false;
        };
        if payload_len as u64 > r.len {
            return false;
        }
        let crc_end = total - fpdu::CRC_LEN;
        if self.rx.crc_on && crc::trailer(crc::crc32c(&data[..crc_end])) != data[crc_end..total] {
            return false;
        }
        let Some(dst) = reg.slice_mut(r.stag, r.offset, payload_len) else {
            return false;
        };
        let at = 2 + ddp::UNTAGGED_HDR_LEN;
        dst.copy_from_slice(&data[at..at + payload_len]);
        // What finish_segment and start_fpdu leave after a Send's last
        // segment; the segment fields (buffer, want, CRC, header, effect,
        // targets, payload counts) are still at start_fpdu's values.
        let rx = &mut self.rx;
        rx.pos += total as u64;
        rx.fpdu_start = rx.pos;
        rx.ulpdu_len = ulpdu_len;
        rx.last_send_len = Some(payload_len as u64);
        rx.expected_msn[0] = rx.expected_msn[0].wrapping_add(1);
        rx.spare_send_targets.clear();
        if r.len > 0 {
            rx.spare_send_targets.push(r);
        }
        if !self.first_fpdu_seen {
            self.saw_first_fpdu();
        }
        let done = self.rq.pop_front().expect("head checked");
        self.completions.push_back(WorkCompletion {
            wr_id: done.wr.wr_id,
            status: WcStatus::Success,
            opcode: WcOpcode::Recv,
            queue: WorkQueue::Recv,
            byte_len: payload_len as u32,
            invalidated: None,
            solicited,
        });
        true
    }
}
