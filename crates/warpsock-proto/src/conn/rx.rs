//! The receive path: MPA frame reassembly, FPDU parsing from any split of
//! the byte stream, DDP placement and RDMAP semantics (siw `siw_qp_rx.c`:
//! `siw_tcp_rx_data`, `siw_get_hdr`, `siw_proc_send`, `siw_proc_write`,
//! `siw_proc_rreq`, `siw_proc_rresp`, `siw_proc_terminate`).
//!
//! The stream is consumed in phases, each resumable at any byte:
//! marker (when negotiated) → header (length, DDP/RDMAP header, Read
//! Request / Terminate body) → payload (placed into registered memory) →
//! pad and CRC. Every check that decides *where* payload goes happens on
//! the header, before a single payload byte is placed, so a bad header
//! never writes outside a registered, permitted range. Effects that
//! complete work (receive completions, Read completions, Read Requests,
//! Terminate) happen only after the CRC has been verified.

use warpsock_wire::crc::{self, Crc32c};
use warpsock_wire::ddp::{self, Opcode, Placement, ReadRequest, SegmentHeader};
use warpsock_wire::marker::{Marker, MARKER_LEN, MARKER_SPACING};
use warpsock_wire::terminate::{ControlLayout, TermCode, Terminate};
use warpsock_wire::{fpdu, mpa};

use super::cm::Attach;
use super::{CloseReason, CmState, Connection, Event, IrqEntry, QpState, RtrType};
use crate::mem::{Access, Backing, MemError, Range, Registry};
use crate::verbs::{WcOpcode, WcStatus, WorkCompletion, WorkQueue};

/// Largest Terminate ULPDU we keep (header + control + length + DDP + RDMAP).
const MAX_TERMINATE_ULPDU: usize = ddp::UNTAGGED_HDR_LEN + 4 + 2 + ddp::UNTAGGED_HDR_LEN + 28;

/// What the receive path needs next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RxStep {
    /// Up to this many bytes of framing (control frame, header, marker,
    /// pad, CRC): pass them to [`Connection::rx_bytes`].
    Bytes(usize),
    /// Up to `range.len` payload bytes belong at `range` of a registered
    /// region: write them there, then call [`Connection::rx_placed`] with
    /// the placed bytes.
    Place(Range),
    /// Nothing is accepted until the application acts (the responder has
    /// not yet accepted the MPA Request). Stop reading.
    Blocked,
    /// The stream is finished (closed or terminated); discard input.
    Closed,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum Phase {
    /// Collecting an MPA Request/Reply.
    #[default]
    Mpa,
    /// Responder waiting for accept/reject.
    Paused,
    /// Collecting the FPDU header (and small bodies).
    Header,
    /// Placing payload.
    Payload,
    /// Skipping payload we do not keep (an over-long Terminate).
    Skip,
    /// Collecting pad + CRC.
    Trailer,
    /// Finished.
    Discard,
}

/// What the current segment does once its CRC checks out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum Effect {
    #[default]
    None,
    Send,
    WriteDone,
    ReadResponse,
    ReadRequest,
    Terminate,
    RtrSend,
}

/// A Send message being received (one at a time, siw "packet intersection").
#[derive(Debug)]
struct SendMsg {
    targets: Vec<Range>,
    capacity: u64,
    placed: u64,
}

#[derive(Debug, Default)]
pub(super) struct RxState {
    phase: Phase,
    crc_on: bool,
    markers: bool,
    /// Stream position since the start of full operation (markers).
    pos: u64,
    /// Position of the current FPDU's first byte.
    fpdu_start: u64,
    in_marker: bool,
    marker: Vec<u8>,
    buf: Vec<u8>,
    want: usize,
    crc: Crc32c,
    // Current segment.
    ulpdu_len: usize,
    hdr: Option<SegmentHeader>,
    payload_len: usize,
    payload_done: usize,
    targets: Vec<Range>,
    target_idx: usize,
    target_off: u64,
    effect: Effect,
    // Messages in progress.
    send: Option<SendMsg>,
    /// The scatter list of the last finished Send, kept for the next one
    /// (no allocation per message).
    spare_send_targets: Vec<Range>,
    tagged_in_progress: Option<Opcode>,
    expected_msn: [u32; 3],
    rtr_pending: bool,
}

impl RxState {
    /// Stops accepting input: everything that arrives is discarded.
    pub(super) fn discard(&mut self) {
        self.phase = Phase::Discard;
    }

    pub(super) fn begin_fpdu_phase(&mut self, crc_on: bool, markers: bool, await_rtr: bool) {
        self.rtr_pending = await_rtr;
        self.crc_on = crc_on;
        self.markers = markers;
        self.pos = 0;
        self.expected_msn = [1, 1, 1];
        self.start_fpdu();
    }

    fn start_fpdu(&mut self) {
        self.phase = Phase::Header;
        self.buf.clear();
        self.want = 4;
        self.crc.reset();
        self.fpdu_start = self.pos;
        self.hdr = None;
        self.effect = Effect::None;
        self.targets.clear();
        self.target_idx = 0;
        self.target_off = 0;
        self.payload_done = 0;
        self.payload_len = 0;
        self.in_marker = self.markers && self.pos % MARKER_SPACING == 0;
        self.marker.clear();
    }

    fn to_next_marker(&self) -> usize {
        if self.markers {
            (MARKER_SPACING - self.pos % MARKER_SPACING) as usize
        } else {
            usize::MAX
        }
    }

    /// Advances the stream position, noting when a marker is due.
    fn advance(&mut self, n: usize) {
        self.pos += n as u64;
        if self.markers && self.pos % MARKER_SPACING == 0 {
            self.in_marker = true;
            self.marker.clear();
        }
    }
}

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
    /// Payload bytes of the FPDU being received, once its header is in
    /// (while [`Self::rx_step`] says [`RxStep::Place`], the payload the
    /// range is part of).
    ///
    /// An engine sizes its reads by it: a Send's payload is placed in as
    /// many ranges as its receive has scatter entries (an 8-byte stamp
    /// and a body, say), and a short range in a large FPDU does not make
    /// the stream one of small messages.
    pub fn rx_payload_len(&self) -> usize {
        self.rx.payload_len
    }

    /// What the receive path needs next (the direct placement contract).
    pub fn rx_step(&self) -> RxStep {
        let rx = &self.rx;
        match rx.phase {
            Phase::Discard => return RxStep::Closed,
            Phase::Paused => return RxStep::Blocked,
            Phase::Mpa => return RxStep::Bytes(rx.want.max(mpa::HEADER_LEN) - rx.buf.len()),
            _ => {}
        }
        if rx.in_marker {
            return RxStep::Bytes(MARKER_LEN - rx.marker.len());
        }
        let room = rx.to_next_marker();
        match rx.phase {
            Phase::Header | Phase::Trailer => RxStep::Bytes((rx.want - rx.buf.len()).min(room)),
            Phase::Skip => RxStep::Bytes((rx.payload_len - rx.payload_done).min(room)),
            Phase::Payload => {
                let Some(&t) = rx.targets.get(rx.target_idx) else {
                    // Targets always cover the payload (checked on the
                    // header); never index past them.
                    return RxStep::Closed;
                };
                let left_in_target = (t.len - rx.target_off) as usize;
                let len = left_in_target
                    .min(rx.payload_len - rx.payload_done)
                    .min(room);
                RxStep::Place(Range {
                    stag: t.stag,
                    offset: t.offset + rx.target_off,
                    len: len as u64,
                })
            }
            Phase::Mpa | Phase::Paused | Phase::Discard => unreachable!("handled above"),
        }
    }

    /// Feeds framing bytes. Consumes at most the number of bytes the step
    /// asked for and returns how many it took.
    ///
    /// Call when [`Self::rx_step`] is [`RxStep::Bytes`] (and
    /// [`Self::rx_fpdu`] declined): MPA frames, FPDU headers and bodies,
    /// markers, pad and CRC. See the module docs for the four entry points.
    pub fn rx_bytes<B: Backing>(&mut self, data: &[u8], reg: &mut Registry<B>) -> usize {
        let n = match self.rx_step() {
            RxStep::Bytes(n) => n.min(data.len()),
            RxStep::Closed => return data.len(),
            _ => return 0,
        };
        if n == 0 {
            return 0;
        }
        let chunk = &data[..n];
        if self.rx.phase == Phase::Mpa {
            self.rx.buf.extend_from_slice(chunk);
            self.mpa_progress();
            return n;
        }
        if self.rx.in_marker {
            self.rx.marker.extend_from_slice(chunk);
            if self.rx.crc_on {
                self.rx.crc.update(chunk);
            }
            self.rx.pos += n as u64;
            if self.rx.marker.len() == MARKER_LEN {
                self.rx.in_marker = false;
                self.check_marker();
            }
            return n;
        }
        match self.rx.phase {
            Phase::Header => {
                self.rx.buf.extend_from_slice(chunk);
                if self.rx.crc_on {
                    self.rx.crc.update(chunk);
                }
                self.rx.advance(n);
                if self.rx.buf.len() == self.rx.want {
                    self.header_progress(reg);
                }
            }
            Phase::Skip => {
                if self.rx.crc_on {
                    self.rx.crc.update(chunk);
                }
                self.rx.advance(n);
                self.rx.payload_done += n;
                if self.rx.payload_done == self.rx.payload_len {
                    self.enter_trailer();
                }
            }
            Phase::Trailer => {
                let pad = fpdu::pad_len(self.rx.ulpdu_len);
                // Pad bytes are covered by the CRC, the CRC bytes are not.
                let trailer_start = self.rx.want - pad - fpdu::CRC_LEN;
                let before = self.rx.buf.len() - trailer_start;
                let covered = pad.saturating_sub(before).min(n);
                if self.rx.crc_on {
                    self.rx.crc.update(&chunk[..covered]);
                }
                self.rx.buf.extend_from_slice(chunk);
                self.rx.advance(n);
                if self.rx.buf.len() == self.rx.want {
                    self.finish_segment(reg);
                }
            }
            _ => {}
        }
        n
    }

    /// Reports payload bytes written at the range of the last
    /// [`RxStep::Place`] (`placed.len()` ≤ its length). The CRC is computed
    /// over `placed` where it lies.
    ///
    /// Call after writing payload yourself straight into the range
    /// [`Self::rx_step`] returned as [`RxStep::Place`] (e.g. with `readv`
    /// from the socket), with exactly the bytes written.
    pub fn rx_placed(&mut self, placed: &[u8]) {
        let RxStep::Place(r) = self.rx_step() else {
            return;
        };
        let n = placed.len().min(r.len as usize);
        // Without negotiated CRC the trailer is ignored: skip the work.
        if self.rx.crc_on {
            self.rx.crc.update(&placed[..n]);
        }
        self.payload_placed(n);
    }

    /// Consumes one whole FPDU from the front of `data` in a single pass,
    /// when the receive path stands at an FPDU boundary and all of the
    /// FPDU is there: the header is checked exactly as
    /// [`Self::rx_bytes`] would, the payload is copied to where
    /// [`RxStep::Place`] would have said, and the CRC is computed in one
    /// call over the contiguous bytes instead of piece by piece. Returns
    /// the bytes consumed; 0 means "not here" and the caller goes on with
    /// [`Self::rx_step`]. It may also stop partway (a region gone under
    /// the placement, a Terminate's body): the step-by-step path then
    /// resumes exactly where it stopped, with the same state it would
    /// have had.
    ///
    /// This is the small-message path (a Send, an RDMA Write or Read
    /// Response, a Read Request that arrived in one read): about half the
    /// receive-side work per FPDU of the step-by-step path, which costs a
    /// state-machine step and a CRC update per piece (length, header,
    /// payload, pad).
    ///
    /// Call when [`Self::rx_step`] is [`RxStep::Bytes`] and you hold staged
    /// bytes that may begin with a whole FPDU; on 0 go on with
    /// [`Self::rx_step`] and [`Self::rx_bytes`].
    pub fn rx_fpdu<B: Backing>(&mut self, data: &[u8], reg: &mut Registry<B>) -> usize {
        let rx = &self.rx;
        if rx.phase != Phase::Header || rx.markers || !rx.buf.is_empty() || data.len() < 4 {
            return 0;
        }
        let ulpdu_len = usize::from(u16::from_be_bytes([data[0], data[1]]));
        let total = 2 + ulpdu_len + fpdu::pad_len(ulpdu_len) + fpdu::CRC_LEN;
        let hdr_len = if data[2] & ddp::DDP_TAGGED != 0 {
            ddp::TAGGED_HDR_LEN
        } else {
            ddp::UNTAGGED_HDR_LEN
        };
        // RDMAP control (the byte after DDP control): opcode in bits 0-3.
        let body = match data[3] & 0x0f {
            op if op == Opcode::RdmaReadRequest as u8 => ddp::READ_REQUEST_LEN,
            op if op == Opcode::Terminate as u8 => return 0,
            _ => 0,
        };
        if data.len() < total || ulpdu_len < hdr_len + body {
            // Partial, or too short for its header: the checks of the
            // step-by-step path report it.
            return 0;
        }
        let head = 2 + hdr_len + body;
        let rx = &mut self.rx;
        rx.buf.extend_from_slice(&data[..head]);
        rx.pos += head as u64;
        rx.ulpdu_len = ulpdu_len;
        rx.want = head;
        self.header_progress(reg);
        if self.rx.phase == Phase::Header && self.rx.hdr.is_some() && self.rx.buf.len() == head {
            // A body (Read Request): the header part asked for it, and it
            // is already in.
            self.header_progress(reg);
        }
        let mut off = head;
        while self.rx.phase == Phase::Payload {
            let RxStep::Place(r) = self.rx_step() else {
                break;
            };
            let n = r.len as usize;
            let Some(dst) = reg.slice_mut(r.stag, r.offset, n) else {
                break;
            };
            dst.copy_from_slice(&data[off..off + n]);
            off += n;
            self.payload_placed(n);
        }
        if self.rx.phase != Phase::Trailer {
            // An error (the stream is discarded from here) or a step the
            // caller takes: the CRC covers what was consumed.
            if self.rx.crc_on {
                self.rx.crc.update(&data[..off]);
            }
            return off;
        }
        let rx = &mut self.rx;
        rx.buf.extend_from_slice(&data[off..total]);
        rx.pos += (total - off) as u64;
        if rx.crc_on {
            // Length, header, payload and pad: everything but the CRC.
            rx.crc.update(&data[..total - fpdu::CRC_LEN]);
        }
        self.finish_segment(reg);
        total
    }

    /// Payload bookkeeping after `n` bytes were placed at the current
    /// [`RxStep::Place`] range (the CRC is the caller's).
    fn payload_placed(&mut self, n: usize) {
        let rx = &mut self.rx;
        rx.payload_done += n;
        rx.target_off += n as u64;
        if rx.target_off == rx.targets[rx.target_idx].len {
            rx.target_idx += 1;
            rx.target_off = 0;
        }
        rx.advance(n);
        if rx.payload_done == rx.payload_len {
            self.enter_trailer();
        }
    }

    /// Feeds received bytes, copying payload into registered memory.
    /// Returns how many bytes were consumed (less than `data.len()` only
    /// when the receive path is [`RxStep::Blocked`]).
    ///
    /// Call with any bytes read from the stream when you do not place
    /// payload yourself; it drives [`Self::rx_fpdu`], [`Self::rx_bytes`]
    /// and placement by copy for you. Do not mix it into a
    /// [`RxStep::Place`] you have started but not reported.
    pub fn handle_input<B: Backing>(&mut self, data: &[u8], reg: &mut Registry<B>) -> usize {
        let mut off = 0;
        while off < data.len() {
            match self.rx_step() {
                RxStep::Bytes(_) => {
                    let whole = self.rx_fpdu(&data[off..], reg);
                    if whole > 0 {
                        off += whole;
                        continue;
                    }
                    let n = self.rx_bytes(&data[off..], reg);
                    if n == 0 {
                        break;
                    }
                    off += n;
                }
                RxStep::Place(r) => {
                    let n = (r.len as usize).min(data.len() - off);
                    match reg.slice_mut(r.stag, r.offset, n) {
                        Some(dst) => {
                            dst.copy_from_slice(&data[off..off + n]);
                            self.rx_placed(&data[off..off + n]);
                            off += n;
                        }
                        None => {
                            // The region vanished after its header was
                            // checked: stop placing, end the stream.
                            self.send_terminate(TermCode::DDP_LOCAL_CATASTROPHIC, Attach::Nothing);
                            self.rx.phase = Phase::Discard;
                        }
                    }
                }
                RxStep::Blocked => break,
                RxStep::Closed => return data.len(),
            }
        }
        off
    }

    fn mpa_progress(&mut self) {
        let rx = &mut self.rx;
        if rx.buf.len() < mpa::HEADER_LEN {
            rx.want = mpa::HEADER_LEN;
            return;
        }
        let total = mpa::frame_len(&rx.buf).unwrap_or(mpa::HEADER_LEN);
        let pd_len = total - mpa::HEADER_LEN;
        if pd_len <= mpa::MAX_PRIVATE_DATA_LEN && rx.buf.len() < total {
            rx.want = total;
            return;
        }
        // Complete (or oversized, which parsing rejects from the header).
        let frame = std::mem::take(&mut rx.buf);
        rx.phase = Phase::Paused;
        self.on_mpa_frame(&frame);
        match self.cm {
            CmState::AwaitAccept => self.rx.phase = Phase::Paused,
            CmState::Fpdu => {}
            _ => self.rx.phase = Phase::Discard,
        }
    }

    /// Validates a marker (RFC 5044 §4.3): FPDUPTR is the distance back to
    /// the current FPDU's length field (0 for a marker that starts an
    /// FPDU). Both conventions for markers inside an FPDU that began with
    /// a marker (distance to the marker or to the length field) are
    /// accepted.
    fn check_marker(&mut self) {
        let at = self.rx.pos - 4;
        let m = [
            self.rx.marker[0],
            self.rx.marker[1],
            self.rx.marker[2],
            self.rx.marker[3],
        ];
        let ptr = u64::from(Marker::from_bytes(m).fpduptr);
        let at_start = self.rx.phase == Phase::Header && self.rx.buf.is_empty();
        let ok = if at_start {
            ptr == 0
        } else {
            let d = at - self.rx.fpdu_start;
            ptr == d || (self.rx.fpdu_start % MARKER_SPACING == 0 && ptr + 4 == d)
        };
        if !ok {
            self.send_terminate(TermCode::MPA_MARKER, Attach::Nothing);
            self.rx.phase = Phase::Discard;
        }
    }

    fn header_progress<B: Backing>(&mut self, reg: &mut Registry<B>) {
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
                let new_msg = self.rx.send.is_none();
                if new_msg && self.rq.is_empty() {
                    return self.terminate_ddp(TermCode::DDP_UNTAGGED_NO_BUFFER);
                }
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
                let mut skip = msg.placed;
                let mut left = payload_len as u64;
                for t in &msg.targets {
                    if left == 0 {
                        break;
                    }
                    if skip >= t.len {
                        skip -= t.len;
                        continue;
                    }
                    let take = (t.len - skip).min(left);
                    seg_targets.push(Range {
                        stag: t.stag,
                        offset: t.offset + skip,
                        len: take,
                    });
                    skip = 0;
                    left -= take;
                }
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
            Placement::Untagged { .. } => {
                // Terminate: its body is in the buffer; anything beyond
                // what we keep is skipped.
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
                        self.rx.targets.push(Range {
                            stag: sink.stag,
                            offset: sink.offset + u64::from(head.received),
                            len: payload_len as u64,
                        });
                    }
                    self.rx.effect = Effect::ReadResponse;
                }
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

    fn enter_trailer(&mut self) {
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
    fn finish_segment<B: Backing>(&mut self, reg: &mut Registry<B>) {
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
        self.first_fpdu_seen = true;
        let payload = self.rx.payload_len as u64;
        match self.rx.effect {
            Effect::None | Effect::WriteDone => {}
            Effect::RtrSend => self.rx.expected_msn[0] = self.rx.expected_msn[0].wrapping_add(1),
            Effect::Send => {
                let msg = self.rx.send.as_mut().expect("send in progress");
                msg.placed += payload;
                if hdr.last {
                    let placed = msg.placed;
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
            }
            Effect::Terminate => {
                let body = &self.rx.buf
                    [2 + ddp::UNTAGGED_HDR_LEN..end - 4 - fpdu::pad_len(self.rx.ulpdu_len)];
                // Ambiguous control words (`20 05/06/07`) read as the RFC
                // 6581 MPA errors only where those can occur: an initiator's
                // first FPDU, telling the responder that its Reply was
                // unacceptable. Anywhere else they are siw's RDMAP
                // remote-operation errors in its little-endian layout.
                let prefer = if first && self.cfg.role == super::Role::Responder {
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
        self.rx.phase = Phase::Discard;
        self.events
            .push_back(Event::Closed(CloseReason::Terminated {
                code,
                by_peer: true,
            }));
    }
}
