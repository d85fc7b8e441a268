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
//!
//! This module holds the receive state, the entry points an engine
//! calls and the framing around FPDUs (MPA frames, markers, stream
//! position); `segment` holds what one FPDU means (header dispatch, and
//! its effects once its CRC is in); `plan` lays out reads of several
//! FPDUs of one message and checks what such a read brought.

mod plan;
mod segment;
mod straight;

pub use plan::RxPiece;

use warpsock_wire::crc::Crc32c;
use warpsock_wire::ddp::{self, Opcode, SegmentHeader};
use warpsock_wire::marker::{Marker, MARKER_LEN, MARKER_SPACING};
use warpsock_wire::terminate::TermCode;
use warpsock_wire::{fpdu, mpa};

use super::cm::Attach;
use super::{CmState, Connection};
use crate::mem::{Backing, Range, Registry};

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
    /// Length of the last Send received whole (how far a planned read
    /// guesses into the next one).
    last_send_len: Option<u64>,
    tagged_in_progress: Option<Opcode>,
    /// The tagged FPDU being received follows a non-last FPDU of its
    /// message (`tagged_in_progress` before its header).
    tagged_continues: bool,
    expected_msn: [u32; 3],
    rtr_pending: bool,
}

impl RxState {
    /// Stops accepting input: everything that arrives is discarded.
    pub(super) fn discard(&mut self) {
        self.phase = Phase::Discard;
    }

    /// A Send is being placed into the head posted receive (its buffers
    /// are resolved and in use until it completes).
    pub(super) fn send_in_progress(&self) -> bool {
        self.send.is_some()
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
        self.in_marker = self.markers && self.pos.is_multiple_of(MARKER_SPACING);
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
        if self.markers && self.pos.is_multiple_of(MARKER_SPACING) {
            self.in_marker = true;
            self.marker.clear();
        }
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

    /// At the start of an FPDU's payload (its header in, no payload byte
    /// placed yet): whether the FPDU continues a message that earlier
    /// FPDUs began — an untagged one at a message offset past 0 (RFC 5041
    /// §5.2, MO), a tagged one behind a non-last FPDU of its message.
    /// `None` before a header and once payload was placed (a second
    /// placement step of the same FPDU).
    ///
    /// An engine sizes its reads by the messages it sees: a message's
    /// short last FPDU (128 KiB in 64 KiB FPDUs ends with one of 56
    /// payload bytes) does not make the stream one of small messages.
    pub fn rx_payload_start(&self) -> Option<bool> {
        if self.rx.payload_done > 0 {
            return None;
        }
        match self.rx.hdr? {
            SegmentHeader {
                placement: ddp::Placement::Untagged { mo, .. },
                ..
            } => Some(mo > 0),
            _ => Some(self.rx.tagged_continues),
        }
    }

    /// Of an FPDU that [`Self::rx_fpdu`] just took whole (`fpdu`: its
    /// bytes as on the stream, MPA length first): its payload length and
    /// whether it began a message — an untagged one at message offset 0,
    /// a tagged one behind no unfinished message of its kind. What
    /// [`Self::rx_payload_len`] and [`Self::rx_payload_start`] tell of an
    /// FPDU received step by step. `None` if `fpdu` holds no header.
    pub fn rx_whole_fpdu(&self, fpdu: &[u8]) -> Option<(usize, bool)> {
        let ulpdu_len = usize::from(u16::from_be_bytes([*fpdu.first()?, *fpdu.get(1)?]));
        let h = SegmentHeader::parse(fpdu.get(2..)?).ok()?;
        let began = match h.placement {
            ddp::Placement::Untagged { mo, .. } => mo == 0,
            ddp::Placement::Tagged { .. } => !self.rx.tagged_continues,
        };
        Some((ulpdu_len.saturating_sub(h.len()), began))
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
                    serial: t.serial,
                })
            }
            Phase::Mpa | Phase::Paused | Phase::Discard => unreachable!("handled above"),
        }
    }

    /// Whether [`Self::rx_step`] is [`RxStep::Bytes`] — the next stream
    /// bytes are framing (an MPA frame, a header, a marker, pad and CRC,
    /// skipped payload) — without working out how many: what an engine
    /// asks before a read that may only take framing (a caller's blocking
    /// read of the socket, with no place to put payload).
    pub fn rx_wants_bytes(&self) -> bool {
        match self.rx.phase {
            Phase::Discard | Phase::Paused => false,
            Phase::Mpa | Phase::Header | Phase::Trailer | Phase::Skip => true,
            // A marker inside payload is framing too.
            Phase::Payload => self.rx.in_marker,
        }
    }

    /// Feeds framing bytes. Consumes at most the number of bytes the step
    /// asked for and returns how many it took.
    ///
    /// Call when [`Self::rx_step`] is [`RxStep::Bytes`] (and
    /// [`Self::rx_fpdu`] declined): MPA frames, FPDU headers and bodies,
    /// markers, pad and CRC. See the module docs for the entry points.
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
    /// payload, pad). A one-FPDU Send into a one-buffer receive goes
    /// straighter still (`straight`: checked on the raw bytes, finished in
    /// one go, the same state at the end).
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
        if hdr_len == ddp::UNTAGGED_HDR_LEN && self.rx_send_straight(data, ulpdu_len, total, reg) {
            return total;
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
            let Some(dst) = reg.range_slice_mut(&r, n) else {
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
                    match reg.range_slice_mut(&r, n) {
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
            ptr == d || (self.rx.fpdu_start.is_multiple_of(MARKER_SPACING) && ptr + 4 == d)
        };
        if !ok {
            self.send_terminate(TermCode::MPA_MARKER, Attach::Nothing);
            self.rx.phase = Phase::Discard;
        }
    }
}
