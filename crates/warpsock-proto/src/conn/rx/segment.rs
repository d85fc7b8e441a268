//! One FPDU's header and end: the DDP/RDMAP header checked and dispatched
//! (where its payload goes, which receive it completes, a Read Request's
//! or Terminate's body), and once the trailer and CRC are in, the
//! segment's effects (completions, Read Responses queued, Terminates
//! acted on). Effects wait for the CRC (RFC 5044 §8: a segment that fails
//! it is not acted on).

use warpsock_wire::ddp::{self, Opcode, Placement, ReadRequest, SegmentHeader};
use warpsock_wire::terminate::{ControlLayout, TermCode, Terminate};
use warpsock_wire::{crc, fpdu};

use super::super::cm::Attach;
use super::super::{CloseReason, Connection, Event, IrqEntry, QpState, Role, RtrType};
use super::{Effect, Phase, RxState, SendMsg, MAX_TERMINATE_ULPDU};
use crate::mem::{Access, Backing, MemError, Range, Registry};
use crate::verbs::{WcOpcode, WcStatus, WorkCompletion, WorkQueue};

fn tagged_code(e: MemError) -> TermCode {
    // siw `siw_tagged_error`: DDP has no access-rights code, siw reports
    // an access violation on a Write as "invalid STag".
    match e {
        MemError::InvalidStag | MemError::Access => TermCode::DDP_TAGGED_INVALID_STAG,
        MemError::BaseBounds => TermCode::DDP_TAGGED_BASE_BOUNDS,
        MemError::PdMismatch => TermCode::DDP_TAGGED_STAG_NOT_ASSOCIATED,
        MemError::ToWrap => TermCode::DDP_TAGGED_TO_WRAP,
    }
}

fn rdmap_code(e: MemError) -> TermCode {
    // siw `siw_rdmap_error` (RFC 5040 §7.2 remote protection errors).
    match e {
        MemError::InvalidStag => TermCode::RDMAP_INVALID_STAG,
        MemError::BaseBounds => TermCode::RDMAP_BASE_BOUNDS,
        MemError::Access => TermCode::RDMAP_ACCESS,
        MemError::PdMismatch => TermCode::RDMAP_STAG_NOT_ASSOCIATED,
        MemError::ToWrap => TermCode::RDMAP_TO_WRAP,
    }
}

impl Connection {
    pub(super) fn header_progress<B: Backing>(&mut self, reg: &mut Registry<B>) {
        let rx = &mut self.rx;
        if rx.buf.len() == 4 && rx.hdr.is_none() {
            rx.ulpdu_len = usize::from(u16::from_be_bytes([rx.buf[0], rx.buf[1]]));
            let hdr_len = if rx.buf[2] & ddp::DDP_TAGGED != 0 {
                ddp::TAGGED_HDR_LEN
            } else {
                ddp::UNTAGGED_HDR_LEN
            };
            let want = 2 + hdr_len.min(rx.ulpdu_len);
            if want > 4 {
                rx.want = want;
                return;
            }
        }
        if rx.hdr.is_none() {
            let seg_len = rx.ulpdu_len as u16;
            if rx.ulpdu_len < 2 {
                // Not even the DDP and RDMAP control bytes: what follows
                // the length field is pad, never a header to parse.
                self.send_terminate(TermCode::DDP_LOCAL_CATASTROPHIC, Attach::Nothing);
                self.rx.phase = Phase::Discard;
                return;
            }
            let hdr = match SegmentHeader::parse(&rx.buf[2..2 + rx.ulpdu_len.min(rx.buf.len() - 2)])
            {
                Ok(h) => h,
                Err(e) => {
                    self.terminate_for_wire_error(e);
                    self.rx.phase = Phase::Discard;
                    return;
                }
            };
            rx.hdr = Some(hdr);
            let body = match hdr.opcode {
                Opcode::RdmaReadRequest => ddp::READ_REQUEST_LEN,
                Opcode::Terminate => rx.ulpdu_len.min(MAX_TERMINATE_ULPDU) - hdr.len(),
                _ => 0,
            };
            if hdr.opcode == Opcode::RdmaReadRequest && rx.ulpdu_len != hdr.len() + body {
                // siw drops a Read Request carrying payload (or cut short);
                // we say why first.
                let h = rx.buf[2..2 + hdr.len()].to_vec();
                self.send_terminate(
                    TermCode::RDMAP_CATASTROPHIC_STREAM,
                    Attach::Ddp {
                        segment_len: seg_len,
                        header: &h,
                    },
                );
                self.rx.phase = Phase::Discard;
                return;
            }
            if body > 0 {
                rx.want = 2 + hdr.len() + body;
                return;
            }
        }
        self.dispatch_header(reg);
    }

    fn terminate_ddp(&mut self, code: TermCode) {
        let hdr_len = self.rx.hdr.map_or(0, |h| h.len());
        let h = self.rx.buf[2..2 + hdr_len].to_vec();
        self.send_terminate(
            code,
            Attach::Ddp {
                segment_len: self.rx.ulpdu_len as u16,
                header: &h,
            },
        );
        self.rx.phase = Phase::Discard;
    }

    fn complete_recv_error(&mut self, status: WcStatus) {
        if let Some(r) = self.rq.pop_front() {
            self.completions.push_back(WorkCompletion {
                wr_id: r.wr.wr_id,
                status,
                opcode: WcOpcode::Recv,
                queue: WorkQueue::Recv,
                byte_len: 0,
                invalidated: None,
                solicited: false,
            });
        }
    }

    /// All header bytes are in: decide where the payload goes.
    fn dispatch_header<B: Backing>(&mut self, reg: &mut Registry<B>) {
        let Some(hdr) = self.rx.hdr else { return };
        let payload_len = self.rx.ulpdu_len - (self.rx.buf.len() - 2);
        self.rx.payload_len = payload_len;
        let pd = self.cfg.pd;
        match hdr.placement {
            Placement::Untagged { qn, msn, mo, .. } if hdr.opcode.is_send() => {
                if self.rx.rtr_pending
                    && self.neg.as_ref().and_then(|n| n.rtr) == Some(RtrType::Send)
                    && payload_len == 0
                    && mo == 0
                    && hdr.last
                {
                    self.rx.effect = Effect::RtrSend;
                    return self.begin_payload();
                }
                // QN, MSN and MO first, then the receive: siw's order
                // (`siw_send_check_ntoh`, then `siw_proc_send`'s look-up
                // of the receive queue element), so that a peer's bad
                // header is reported as itself with no receive posted
                // too (RFC 5041 §7.2 codes 0x01, 0x03, 0x04 before 0x02).
                if qn != ddp::queue::SEND {
                    return self.terminate_ddp(TermCode::DDP_UNTAGGED_INVALID_QN);
                }
                if msn != self.rx.expected_msn[0] {
                    return self.terminate_ddp(TermCode::DDP_UNTAGGED_MSN_RANGE);
                }
                let placed = self.rx.send.as_ref().map_or(0, |s| s.placed);
                if u64::from(mo) != placed {
                    return self.terminate_ddp(TermCode::DDP_UNTAGGED_INVALID_MO);
                }
                let new_msg = self.rx.send.is_none();
                if new_msg && self.rq.is_empty() {
                    return self.terminate_ddp(TermCode::DDP_UNTAGGED_NO_BUFFER);
                }
                if new_msg {
                    let recv = &self.rq[0].wr;
                    let mut targets = std::mem::take(&mut self.rx.spare_send_targets);
                    targets.clear();
                    let mut capacity = 0u64;
                    for s in &recv.sgl {
                        match reg.check(
                            pd,
                            s.lkey,
                            s.addr,
                            u64::from(s.length),
                            Access::LOCAL_WRITE,
                        ) {
                            Ok(r) => {
                                capacity += r.len;
                                if r.len > 0 {
                                    targets.push(r);
                                }
                            }
                            Err(_) => {
                                self.complete_recv_error(WcStatus::LocalProtectionError);
                                return self.terminate_ddp(TermCode::DDP_LOCAL_CATASTROPHIC);
                            }
                        }
                    }
                    self.rx.send = Some(SendMsg {
                        targets,
                        capacity,
                        placed: 0,
                    });
                }
                let RxState {
                    send,
                    targets: seg_targets,
                    ..
                } = &mut self.rx;
                let msg = send.as_ref().expect("send in progress");
                if msg.placed + payload_len as u64 > msg.capacity {
                    // siw reports a too-long Send as "no buffer" (0x02).
                    self.complete_recv_error(WcStatus::LocalLengthError);
                    return self.terminate_ddp(TermCode::DDP_UNTAGGED_NO_BUFFER);
                }
                // Slice the receive's scatter list to [placed, placed+len)
                // (`start_fpdu` emptied the segment's list).
                super::plan::walk(&msg.targets, msg.placed, payload_len as u64, |r| {
                    seg_targets.push(r);
                });
                self.rx.effect = Effect::Send;
                self.begin_payload();
            }
            Placement::Untagged { qn, msn, .. } if hdr.opcode == Opcode::RdmaReadRequest => {
                if qn != ddp::queue::READ_REQUEST {
                    return self.terminate_ddp(TermCode::DDP_UNTAGGED_INVALID_QN);
                }
                if msn != self.rx.expected_msn[1] {
                    return self.terminate_ddp(TermCode::DDP_UNTAGGED_MSN_RANGE);
                }
                self.rx.effect = Effect::ReadRequest;
                self.begin_payload();
            }
            Placement::Untagged { qn, .. } => {
                // Terminate: on its own queue (RFC 5040 §5.1, QN 2), else
                // the DDP "invalid QN" of any other message there (helper
                // 68's review: one on QN 0 was taken as the peer's
                // Terminate). Its body is in the buffer; anything beyond
                // what we keep is skipped.
                if qn != ddp::queue::TERMINATE {
                    return self.terminate_ddp(TermCode::DDP_UNTAGGED_INVALID_QN);
                }
                self.rx.effect = Effect::Terminate;
                self.begin_payload();
            }
            Placement::Tagged { stag, to } => {
                if let Some(op) = self.rx.tagged_in_progress {
                    if op != hdr.opcode {
                        // Two tagged messages interleaved ("packet intersection").
                        return self.terminate_ddp(TermCode::RDMAP_CATASTROPHIC_STREAM);
                    }
                }
                if hdr.opcode == Opcode::RdmaWrite {
                    if payload_len > 0 {
                        match reg.check(pd, stag, to, payload_len as u64, Access::REMOTE_WRITE) {
                            Ok(r) => self.rx.targets.push(r),
                            Err(e) => return self.terminate_ddp(tagged_code(e)),
                        }
                    }
                    self.rx.effect = Effect::WriteDone;
                } else {
                    let Some(head) = self.orq.front() else {
                        // siw `siw_proc_rresp`: no outstanding Read.
                        return self.terminate_ddp(TermCode::DDP_LOCAL_CATASTROPHIC);
                    };
                    if stag != head.sink_stag {
                        return self.terminate_ddp(TermCode::DDP_TAGGED_INVALID_STAG);
                    }
                    if to != head.sink_to.wrapping_add(u64::from(head.received))
                        || u64::from(head.received) + payload_len as u64 > u64::from(head.size)
                    {
                        return self.terminate_ddp(TermCode::DDP_TAGGED_BASE_BOUNDS);
                    }
                    if payload_len > 0 {
                        let sink = head.sink.expect("sized reads have a sink");
                        if head.received == 0 {
                            // siw `siw_proc_rresp` resolves and checks the
                            // sink on the Response's first FPDU with payload
                            // (`siw_check_sge` over the whole sink, local
                            // write), not when the Read was posted: one
                            // invalidated since — by the peer's Send with
                            // Invalidate (RFC 5040) or locally — or
                            // deregistered fails `siw_check_mem`'s
                            // `stag_valid` (or `siw_mem_id2obj`). Another
                            // registration under the same STag is not the
                            // sink (`Range::serial`). Later FPDUs are not
                            // checked again: siw holds the sink referenced
                            // (`wqe->mem[0]`) until the Read ends.
                            let (seq, size) = (head.seq, u64::from(head.size));
                            let checked = reg
                                .check(pd, sink.stag, head.sink_to, size, Access::LOCAL_WRITE)
                                .and_then(|r| {
                                    if r.serial == sink.serial {
                                        Ok(())
                                    } else {
                                        Err(MemError::InvalidStag)
                                    }
                                });
                            if let Err(e) = checked {
                                // `wc_status = SIW_WC_LOC_PROT_ERR`, then
                                // Terminate DDP / tagged buffer /
                                // `siw_tagged_error`.
                                if let Some(seq) = seq {
                                    self.finish_sq(seq, WcStatus::LocalProtectionError);
                                }
                                return self.terminate_ddp(tagged_code(e));
                            }
                        }
                        self.rx.targets.push(Range {
                            stag: sink.stag,
                            offset: sink.offset + u64::from(head.received),
                            len: payload_len as u64,
                            serial: sink.serial,
                        });
                    }
                    self.rx.effect = Effect::ReadResponse;
                }
                self.rx.tagged_continues = self.rx.tagged_in_progress.is_some();
                self.rx.tagged_in_progress = (!hdr.last).then_some(hdr.opcode);
                self.begin_payload();
            }
        }
    }

    fn begin_payload(&mut self) {
        let rx = &mut self.rx;
        rx.payload_done = 0;
        rx.target_idx = 0;
        rx.target_off = 0;
        if rx.payload_len == 0 {
            self.enter_trailer();
        } else if rx.targets.is_empty() {
            rx.phase = Phase::Skip;
        } else {
            rx.phase = Phase::Payload;
        }
    }

    pub(super) fn enter_trailer(&mut self) {
        let body = self.body_len();
        let rx = &mut self.rx;
        rx.phase = Phase::Trailer;
        rx.buf.truncate(2 + rx.hdr.map_or(0, |h| h.len()) + body);
        rx.want = rx.buf.len() + fpdu::pad_len(rx.ulpdu_len) + fpdu::CRC_LEN;
    }

    fn body_len(&self) -> usize {
        match self.rx.hdr.map(|h| h.opcode) {
            Some(Opcode::RdmaReadRequest) => ddp::READ_REQUEST_LEN,
            Some(Opcode::Terminate) => {
                self.rx.ulpdu_len.min(MAX_TERMINATE_ULPDU) - ddp::UNTAGGED_HDR_LEN
            }
            _ => 0,
        }
    }

    /// Pad and CRC are in: verify, then apply the segment's effect.
    pub(super) fn finish_segment<B: Backing>(&mut self, reg: &mut Registry<B>) {
        let end = self.rx.buf.len();
        let trailer = [
            self.rx.buf[end - 4],
            self.rx.buf[end - 3],
            self.rx.buf[end - 2],
            self.rx.buf[end - 1],
        ];
        if self.rx.crc_on && crc::trailer(self.rx.crc.value()) != trailer && !cfg!(fuzzing) {
            // RFC 5044 §8 / siw: LLP/MPA CRC error, nothing attached.
            self.send_terminate(TermCode::MPA_CRC, Attach::Nothing);
            self.rx.phase = Phase::Discard;
            return;
        }
        let hdr = self.rx.hdr.expect("header parsed");
        let first = !self.first_fpdu_seen;
        if first {
            self.saw_first_fpdu();
        }
        let payload = self.rx.payload_len as u64;
        match self.rx.effect {
            Effect::None => {}
            // The Write's payload is placed and its CRC good: its ranges
            // count into the regions' written prefixes now — not at its
            // header, which a lying peer can send behind a SINK_DONE with
            // the payload withheld, the prefix then covering bytes never
            // placed when the SINK_DONE is looked at (helper 34's review).
            Effect::WriteDone => {
                for r in &self.rx.targets {
                    reg.note_remote_write(r);
                }
            }
            Effect::RtrSend => self.rx.expected_msn[0] = self.rx.expected_msn[0].wrapping_add(1),
            Effect::Send => {
                let msg = self.rx.send.as_mut().expect("send in progress");
                msg.placed += payload;
                if hdr.last {
                    let placed = msg.placed;
                    self.rx.last_send_len = Some(placed);
                    if let Some(done) = self.rx.send.take() {
                        self.rx.spare_send_targets = done.targets;
                    }
                    self.rx.expected_msn[0] = self.rx.expected_msn[0].wrapping_add(1);
                    let mut invalidated = None;
                    if let Placement::Untagged { inv_stag, .. } = hdr.placement {
                        if hdr.opcode.invalidates() {
                            if let Err(e) = reg.invalidate(self.cfg.pd, inv_stag, true) {
                                // siw `siw_invalidate_stag`: unknown STag →
                                // remote operation 0x09; another PD (or no
                                // right) → remote protection 0x09.
                                let code = if e == MemError::InvalidStag {
                                    TermCode::RDMAP_OPERATION_CANNOT_INVALIDATE
                                } else {
                                    TermCode::RDMAP_PROTECTION_CANNOT_INVALIDATE
                                };
                                self.complete_recv_error(WcStatus::RemoteOperationError);
                                return self.terminate_ddp(code);
                            }
                            invalidated = Some(inv_stag);
                        }
                    }
                    let r = self.rq.pop_front().expect("receive was checked");
                    self.completions.push_back(WorkCompletion {
                        wr_id: r.wr.wr_id,
                        status: WcStatus::Success,
                        opcode: WcOpcode::Recv,
                        queue: WorkQueue::Recv,
                        byte_len: placed as u32,
                        invalidated,
                        solicited: hdr.opcode.solicited(),
                    });
                }
            }
            Effect::ReadResponse => {
                let head = self.orq.front_mut().expect("checked on header");
                head.received += payload as u32;
                if hdr.last {
                    if head.received != head.size {
                        return self.terminate_ddp(TermCode::DDP_TAGGED_BASE_BOUNDS);
                    }
                    let head = self.orq.pop_front().expect("present");
                    if let Some(seq) = head.seq {
                        self.finish_sq(seq, WcStatus::Success);
                    }
                }
            }
            Effect::ReadRequest => {
                let body = &self.rx.buf[2 + ddp::UNTAGGED_HDR_LEN..2 + ddp::UNTAGGED_HDR_LEN + 28];
                let rr = ReadRequest::parse(body).expect("length checked");
                let ird = self.neg.as_ref().map_or(0, |n| n.ird);
                if self.irq.len() >= usize::from(ird) {
                    return self.terminate_ddp(TermCode::RDMAP_CATASTROPHIC_STREAM);
                }
                let source = if rr.size == 0 {
                    None
                } else {
                    match reg.check(
                        self.cfg.pd,
                        rr.src_stag,
                        rr.src_to,
                        u64::from(rr.size),
                        Access::REMOTE_READ,
                    ) {
                        Ok(r) => Some(r),
                        Err(e) => {
                            let h = self.rx.buf[2..2 + ddp::UNTAGGED_HDR_LEN].to_vec();
                            let b = self.rx.buf
                                [2 + ddp::UNTAGGED_HDR_LEN..2 + ddp::UNTAGGED_HDR_LEN + 28]
                                .to_vec();
                            self.send_terminate(
                                rdmap_code(e),
                                Attach::DdpRdmap {
                                    segment_len: self.rx.ulpdu_len as u16,
                                    header: &h,
                                    rdmap: &b,
                                },
                            );
                            self.rx.phase = Phase::Discard;
                            return;
                        }
                    }
                };
                self.rx.expected_msn[1] = self.rx.expected_msn[1].wrapping_add(1);
                self.irq.push_back(IrqEntry {
                    sink_stag: rr.sink_stag,
                    sink_to: rr.sink_to,
                    size: rr.size,
                    source,
                });
                self.inline_changed();
            }
            Effect::Terminate => {
                let body = &self.rx.buf
                    [2 + ddp::UNTAGGED_HDR_LEN..end - 4 - fpdu::pad_len(self.rx.ulpdu_len)];
                // Ambiguous control words (`20 05/06/07`) read as the RFC
                // 6581 MPA errors only where those can occur: an initiator's
                // first FPDU, telling the responder that its Reply was
                // unacceptable. Anywhere else they are siw's RDMAP
                // remote-operation errors in its little-endian layout.
                let prefer = if first && self.cfg.role == Role::Responder {
                    ControlLayout::Rfc
                } else {
                    ControlLayout::SiwLittleEndian
                };
                let code = Terminate::parse_preferring(body, prefer)
                    .map(|(t, _)| t.control.code)
                    .unwrap_or(TermCode::RDMAP_OPERATION_UNSPECIFIED);
                self.on_peer_terminate(code);
                return;
            }
        }
        if first && self.rx.rtr_pending {
            self.rx.rtr_pending = false;
            self.announce_established();
        }
        if self.rx.phase != Phase::Discard {
            self.rx.start_fpdu();
        }
    }

    /// The peer sent a Terminate: the oldest unfinished send-queue request
    /// carries the peer's verdict, everything else is flushed.
    fn on_peer_terminate(&mut self, code: TermCode) {
        self.events.push_back(Event::Terminated {
            code,
            by_peer: true,
        });
        let status = match (code.layer, code.etype) {
            (0, 1) | (1, 1) => Some(WcStatus::RemoteAccessError),
            (0, 2) | (1, 2) => Some(WcStatus::RemoteOperationError),
            _ => Some(WcStatus::FatalError),
        };
        if let (Some(status), Some(slot)) =
            (status, self.sq.iter_mut().find(|s| s.status.is_none()))
        {
            slot.status = Some(status);
        }
        self.note_close(CloseReason::Terminated {
            code,
            by_peer: true,
        });
        self.enter_error();
        self.qp = QpState::Error;
        self.close_after_flush = true;
        self.inline_changed();
        self.rx.phase = Phase::Discard;
        self.events
            .push_back(Event::Closed(CloseReason::Terminated {
                code,
                by_peer: true,
            }));
    }
}
