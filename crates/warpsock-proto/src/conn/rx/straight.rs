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
//!
//! The predicted receive ([`Connection::rx_send_predicted`], issue 12)
//! makes the same checks on a read that is exactly one such FPDU and
//! hands the payload where it lies to the caller instead of copying it
//! into the receive, which is posted again in place: a busy poller's
//! answer without a completion.

use warpsock_wire::ddp::{self, Opcode};
use warpsock_wire::{crc, fpdu};

use super::super::{Connection, PostedRecv, QpState};
use super::Phase;
use crate::mem::{Access, Backing, Range, Registry};
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

/// What [`Connection::straight_checked`] found of a one-FPDU Send the
/// straight path serves.
struct Checked {
    solicited: bool,
    /// The head receive's one buffer, checked for local write.
    target: Range,
    payload_len: usize,
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
        let Some(c) = self.straight_checked(data, ulpdu_len, total, reg) else {
            return false;
        };
        let r = c.target;
        let Some(dst) = reg.range_slice_mut(&r, c.payload_len) else {
            return false;
        };
        let at = 2 + ddp::UNTAGGED_HDR_LEN;
        dst.copy_from_slice(&data[at..at + c.payload_len]);
        let (payload_len, solicited) = (c.payload_len, c.solicited);
        let done = self.straight_advance(total, ulpdu_len, c);
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

    /// The predicted receive (issue 12): when `data` is exactly one whole
    /// FPDU (nothing before or after it) that the straight path would
    /// take — a one-FPDU untagged Send (not Send with Solicited Event),
    /// the connection in RTS past its first FPDU, at an FPDU boundary
    /// without markers, not closing — `take` gets the head receive's
    /// `wr_id` and the payload where it lies in `data`. If it takes it
    /// (`Some`), the connection advances as the straight path would and
    /// the receive is posted again in place: popped from the head of the
    /// receive queue and pushed at its back, as [`Self::post_recv`] of the
    /// same work request in RTS does — and no completion is queued, the
    /// payload is not copied into the receive's buffer. The state is then
    /// exactly the general path's after the FPDU, the completion's
    /// removal and the repost of the same request (`tests/rx_predicted.rs`).
    ///
    /// `None` (declined here, or by `take`): nothing changed; the caller
    /// feeds `data` as usual ([`Self::rx_fpdu`], [`Self::rx_bytes`]).
    /// What is left to the general path: a partial FPDU, more than one,
    /// a tagged or non-Send FPDU, Send with Solicited Event (its
    /// completion's flag), a CRC that does not match, a receive of several
    /// buffers or too short, an unexpected MSN or queue, RTR pending, a
    /// Send in progress, markers, any state but RTS, a close under way.
    pub fn rx_send_predicted<B: Backing, R>(
        &mut self,
        data: &[u8],
        reg: &Registry<B>,
        take: impl FnOnce(u64, &[u8]) -> Option<R>,
    ) -> Option<R> {
        let rx = &self.rx;
        if self.qp != QpState::Rts
            || !self.first_fpdu_seen
            || self.wants_close()
            || rx.phase != Phase::Header
            || rx.markers
            || !rx.buf.is_empty()
            || data.len() < 2 + ddp::UNTAGGED_HDR_LEN
            || data[2] & ddp::DDP_TAGGED != 0
        {
            return None;
        }
        let ulpdu_len = usize::from(u16::from_be_bytes([data[0], data[1]]));
        let total = 2 + ulpdu_len + fpdu::pad_len(ulpdu_len) + fpdu::CRC_LEN;
        if data.len() != total || ulpdu_len < ddp::UNTAGGED_HDR_LEN {
            return None;
        }
        let (c, backing) = self.straight_checked_with(data, ulpdu_len, total, reg)?;
        let r = c.target;
        // The straight path's copy needs the range's bytes (a region
        // gone under it declines there): `Registry::slice`'s test, on the
        // backing the check found (the same slot: no second look-up).
        let start = usize::try_from(r.offset).ok()?;
        if c.solicited
            || backing
                .bytes()
                .get(start..start.checked_add(c.payload_len)?)
                .is_none()
        {
            return None;
        }
        let wr_id = self.rq.front()?.wr.wr_id;
        let at = 2 + ddp::UNTAGGED_HDR_LEN;
        let got = take(wr_id, &data[at..at + c.payload_len])?;
        self.straight_step(total, ulpdu_len, c);
        // The head receive popped and pushed at the back, in place
        // (inlined: `Ring::rotate_one`): the queue holds it
        // (`straight_checked` found it at the front).
        self.rq.rotate_one();
        Some(got)
    }

    /// The straight path's checks of the one-FPDU Send at the front of
    /// `data` (see [`Self::rx_send_straight`]): `None` for anything it
    /// does not serve. Changes nothing.
    #[inline(always)]
    fn straight_checked<B: Backing>(
        &self,
        data: &[u8],
        ulpdu_len: usize,
        total: usize,
        reg: &Registry<B>,
    ) -> Option<Checked> {
        self.straight_checked_with(data, ulpdu_len, total, reg)
            .map(|(c, _)| c)
    }

    /// [`Self::straight_checked`], and the backing of the head receive's
    /// region its check found ([`Registry::check_backing`]).
    #[inline(always)]
    fn straight_checked_with<'r, B: Backing>(
        &self,
        data: &[u8],
        ulpdu_len: usize,
        total: usize,
        reg: &'r Registry<B>,
    ) -> Option<(Checked, &'r B)> {
        if data[2] & DDP_MASK != DDP_SEND_LAST || data[3] >> 6 != ddp::RDMAP_VERSION {
            return None;
        }
        let solicited = match data[3] & 0x0f {
            op if op == Opcode::Send as u8 => false,
            op if op == Opcode::SendSe as u8 => true,
            _ => return None,
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
            return None;
        }
        let head = self.rq.front()?;
        let [s] = &head.wr.sgl[..] else {
            return None;
        };
        let payload_len = ulpdu_len - ddp::UNTAGGED_HDR_LEN;
        let (target, backing) = reg
            .check_backing(
                self.cfg.pd,
                s.lkey,
                s.addr,
                u64::from(s.length),
                Access::LOCAL_WRITE,
            )
            .ok()?;
        if payload_len as u64 > target.len {
            return None;
        }
        let crc_end = total - fpdu::CRC_LEN;
        if self.rx.crc_on && crc::trailer(crc::crc32c(&data[..crc_end])) != data[crc_end..total] {
            return None;
        }
        Some((
            Checked {
                solicited,
                target,
                payload_len,
            },
            backing,
        ))
    }

    /// What `finish_segment` and `start_fpdu` leave after a Send's last
    /// segment of `total` bytes (ULPDU `ulpdu_len`) that `c` checked; the
    /// segment fields (buffer, want, CRC, header, effect, targets, payload
    /// counts) are still at `start_fpdu`'s values. Returns the head
    /// receive, popped.
    #[inline(always)]
    fn straight_advance(&mut self, total: usize, ulpdu_len: usize, c: Checked) -> PostedRecv {
        self.straight_step(total, ulpdu_len, c);
        self.rq.pop_front().expect("head checked")
    }

    /// [`Self::straight_advance`] but for the head receive's pop: the
    /// predicted receive posts it again in place.
    #[inline(always)]
    fn straight_step(&mut self, total: usize, ulpdu_len: usize, c: Checked) {
        let rx = &mut self.rx;
        rx.pos += total as u64;
        rx.fpdu_start = rx.pos;
        rx.ulpdu_len = ulpdu_len;
        rx.last_send_len = Some(c.payload_len as u64);
        rx.expected_msn[0] = rx.expected_msn[0].wrapping_add(1);
        rx.spare_send_targets.clear();
        if c.target.len > 0 {
            rx.spare_send_targets.push(c.target);
        }
        if !self.first_fpdu_seen {
            self.saw_first_fpdu();
        }
    }
}
