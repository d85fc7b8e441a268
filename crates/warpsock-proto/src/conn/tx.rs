//! The transmit path: MPA frames, then RDMAP messages segmented into
//! FPDUs of at most `mulpdu` ULPDU bytes (siw `siw_qp_tx.c`:
//! `siw_qp_sq_proc_tx`, `siw_tx_hdt`, `siw_prepare_fpdu`).
//!
//! A segment is handed out as a gather list ([`TxSegment`]): inline bytes
//! the core built (length field, DDP/RDMAP header, pad, markers, CRC) and
//! ranges of registered memory (payload), so an engine can `writev` the
//! caller's buffers without a staging copy. Payloads of at most 64 bytes
//! are the exception: they are copied inline, because a gather entry costs
//! the kernel more than the copy (measured with the engine's `hop`
//! example). The CRC, when negotiated, is computed by [`TxSegment::seal`]
//! over exactly those bytes.
//!
//! Scheduling follows siw (`siw_activate_tx`): the P2P RTR message first;
//! between messages, Read Responses (in request order) before new
//! send-queue work, but only `IRQ_BURST_SQ_ACTIVE` of them in a row while
//! the send queue has a message that could start, so the peer's Read
//! Requests never starve our own requests; a Read waits while ORD Reads
//! are outstanding (the send queue stalls behind it, preserving order).
//! Send and Write requests complete once their last byte is handed to the
//! transport (iWARP has no end-to-end ack); Reads complete when their
//! response has arrived.

use warpsock_wire::ddp::{self, Opcode, ReadRequest};
use warpsock_wire::fpdu;
use warpsock_wire::marker::{self, Marker, MARKER_SPACING};

use super::txseg::TxSegment;
use super::{CloseReason, Connection, OrqEntry, QpState, Role, RtrType};
use crate::mem::{Access, Backing, Range, Registry, Stag};
use crate::verbs::{SendOp, WcStatus};

mod gathered;
mod head;
pub use gathered::{pieces_of, GatheredFpdu};
use head::{copy_short, Head, HEAD_MAX};

/// Payloads up to this size travel inline in their segment's buffer
/// (copied when the segment is built) rather than as a gather entry.
const INLINE_PAYLOAD_MAX: u64 = 64;

/// Read Responses sent in a row, at most, while the send queue has a
/// message that could start (siw: `SIW_IRQ_MAXBURST_SQ_ACTIVE`, 4, i.e.
/// three responses, then one send-queue message). One here: the two queues
/// alternate message by message. A Read Request of our own is a few bytes,
/// and while it waits behind the peer's responses, the peer's whole Read
/// window for *us* runs dry (bidirectional Reads, session 11: each side's
/// requests waited behind up to ORD = 8 MiB of responses). Anything the
/// send queue holds otherwise is at most as large as a response, so
/// alternating is fair to both.
pub(crate) const IRQ_BURST_SQ_ACTIVE: u32 = 1;

#[derive(Debug, Clone, Copy)]
enum MsgKind {
    Send {
        opcode: Opcode,
        msn: u32,
        inv_stag: Stag,
    },
    Write {
        stag: Stag,
        to: u64,
    },
    ReadResponse {
        stag: Stag,
        to: u64,
    },
    ReadRequest {
        msn: u32,
        body: ReadRequest,
    },
}

#[derive(Debug)]
struct TxMsg {
    kind: MsgKind,
    sources: Vec<Range>,
    total: u64,
    sent: u64,
    /// SQ sequence to complete when sent (Send/Write).
    complete: Option<u64>,
    /// Pop the IRQ head when sent (Read Response).
    irq: bool,
}

/// Where [`TxState::small_open`] put an FPDU in a segment's buffer.
struct SmallAt {
    /// Its first byte (the length field's).
    start: usize,
    /// Its payload's bytes, zero until filled.
    payload: std::ops::Range<usize>,
}

/// The pieces of `sources` (a message's payload, in order) covering
/// message bytes `sent..sent + take`.
fn pieces(sources: &[Range], mut skip: u64, mut left: u64) -> impl Iterator<Item = Range> + '_ {
    sources.iter().filter_map(move |s| {
        if left == 0 {
            return None;
        }
        if skip >= s.len {
            skip -= s.len;
            return None;
        }
        let n = (s.len - skip).min(left);
        let r = Range {
            stag: s.stag,
            offset: s.offset + skip,
            len: n,
            serial: s.serial,
        };
        skip = 0;
        left -= n;
        Some(r)
    })
}

#[derive(Debug, Default)]
pub(super) struct TxState {
    /// Raw MPA frames to send before anything else.
    pub(super) control: Vec<u8>,
    /// A Terminate ULPDU to send, after which nothing else is sent.
    pub(super) terminate: Option<Vec<u8>>,
    /// The RTR message still to send (initiator, P2P).
    pub(super) rtr: Option<RtrType>,
    fpdu_phase: bool,
    crc_on: bool,
    markers: bool,
    pos: u64,
    len_field_pos: u64,
    cur: Option<TxMsg>,
    next_send_msn: u32,
    next_read_msn: u32,
    done: bool,
    /// The source list of the last finished message, kept for the next
    /// one (no allocation per message).
    spare_sources: Vec<Range>,
    /// Read Responses started in a row while the send queue had a message
    /// ready (see [`IRQ_BURST_SQ_ACTIVE`]).
    irq_burst: u32,
    /// What the schedule made our own Read Requests wait for.
    pub(super) counts: TxCounts,
    /// One more than the longest payload [`Connection::send_inline`] may
    /// carry now; 0: none may go (something is queued ahead of it, or the
    /// connection is not in its FPDU phase in RTS). Its whole test in one
    /// word (issue 12: the ten fields and the FPDU room were ~25
    /// instructions per inline Send): `Connection::inline_limit_now`,
    /// stored by `Connection::inline_changed` wherever one of its inputs
    /// changes.
    pub(super) inline_limit: usize,
}

/// Counts of the transmit schedule (a diagnostic; see
/// [`Connection::tx_counts`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct TxCounts {
    /// Read Responses started while the send queue's next request was a
    /// Read that could start: each made that Read Request wait.
    pub responses_ahead_of_read: u64,
    /// Their payload bytes.
    pub response_bytes_ahead_of_read: u64,
    /// [`Connection::next_segment`] calls that returned nothing. An
    /// engine that stops asking once [`Connection::has_pending_output`]
    /// says there is nothing more makes such calls only when output is
    /// held back (flow of Reads, the responder's first FPDU rule, a
    /// failed start), not one after every message.
    pub empty_asks: u64,
    /// Sends built by [`Connection::send_inline`] (no send-queue entry).
    pub inline_sends: u64,
    /// Sends framed by [`Connection::send_gathered`] (no send-queue
    /// entry, the payload written from the caller's buffers).
    pub gathered_sends: u64,
}

impl TxState {
    pub(super) fn begin_fpdu_phase(&mut self, crc_on: bool, markers: bool) {
        self.fpdu_phase = true;
        self.crc_on = crc_on;
        self.markers = markers;
        self.pos = 0;
        self.next_send_msn = 1;
        self.next_read_msn = 1;
    }

    pub(super) fn abort_message(&mut self) {
        self.cur = None;
    }

    /// The kind of a Send built at once, with no send-queue entry (an
    /// inline or a gathered Send: unsignalled, not solicited, no
    /// invalidate), taking the next MSN of the Send queue.
    #[inline(always)]
    fn unposted_send(&mut self) -> MsgKind {
        let msn = self.next_send_msn;
        self.next_send_msn = msn.wrapping_add(1);
        MsgKind::Send {
            opcode: Opcode::Send,
            msn,
            inv_stag: 0,
        }
    }

    fn marker_due(&self) -> bool {
        self.markers && marker::is_marker_position(self.pos)
    }

    fn emit_marker(&mut self, seg: &mut TxSegment, at_fpdu_start: bool) {
        let ptr = if at_fpdu_start {
            0
        } else {
            (self.pos - self.len_field_pos) as u16
        };
        seg.push_inline(&Marker { fpduptr: ptr }.to_bytes());
        self.pos += 4;
    }

    fn begin_fpdu(&mut self, seg: &mut TxSegment) {
        if self.marker_due() {
            self.emit_marker(seg, true);
        }
        self.len_field_pos = self.pos;
    }

    /// Inline FPDU bytes, with markers inserted at 512-octet positions.
    fn inline(&mut self, seg: &mut TxSegment, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            if self.marker_due() {
                self.emit_marker(seg, false);
            }
            let n = if self.markers {
                bytes
                    .len()
                    .min((MARKER_SPACING - self.pos % MARKER_SPACING) as usize)
            } else {
                bytes.len()
            };
            seg.push_inline(&bytes[..n]);
            self.pos += n as u64;
            bytes = &bytes[n..];
        }
    }

    fn memory(&mut self, seg: &mut TxSegment, mut r: Range) {
        while r.len > 0 {
            if self.marker_due() {
                self.emit_marker(seg, false);
            }
            let n = if self.markers {
                r.len.min(MARKER_SPACING - self.pos % MARKER_SPACING)
            } else {
                r.len
            };
            seg.push_memory(Range { len: n, ..r });
            self.pos += n;
            r.offset += n;
            r.len -= n;
        }
    }

    /// A whole FPDU without markers whose payload is at most
    /// [`INLINE_PAYLOAD_MAX`] bytes, built in place at the end of the
    /// segment's buffer as one inline part: `head` (length field, DDP/RDMAP
    /// header, a Read Request's body) encoded there, the payload bytes
    /// `fill` writes after it (a message's sources, or an inline Send's
    /// bytes), pad and the CRC field — the bytes [`Self::inline`] piece by
    /// piece and [`Self::finish_fpdu`] would produce, with no stack copy
    /// of the head or the FPDU in between (an 8-byte Send's FPDU was three
    /// `inline` calls, each a marker check and a `Vec` extend; then a head
    /// and an FPDU built on the stack and copied twice). Returns false, having added
    /// nothing, when `fill` does (a payload region has gone): the caller's general path
    /// keeps such a piece as a memory part, which [`TxSegment::seal`]
    /// reports.
    ///
    /// Always inlined: `fill` is a closure, so each caller has its own
    /// copy anyway, and the frame (a dozen register saves and restores,
    /// ~20 instructions an 8-byte Send: issue 12) is its caller's.
    #[inline(always)]
    fn small_fpdu(
        &mut self,
        seg: &mut TxSegment,
        head: &Head,
        fill: impl FnOnce(&mut [u8]) -> bool,
    ) -> bool {
        let at = self.small_open(seg, head);
        if !fill(&mut seg.buf[at.payload.clone()]) {
            seg.buf.truncate(at.start);
            return false;
        }
        self.small_close(seg, &at);
        true
    }

    /// [`Self::small_fpdu`]'s first half: the FPDU's bytes appended to the
    /// segment's buffer, `head` encoded, the payload's bytes (at
    /// [`SmallAt::payload`]) zero for the caller to fill, then pad and the
    /// CRC field. Either [`Self::small_close`] follows, or the caller cuts
    /// the buffer back to [`SmallAt::start`]. Split from its closure so an
    /// inline Send copies its bytes in its own frame (a `fill` closure of
    /// a copy loop was a call of its own, not inlined: issue 12).
    #[inline(always)]
    fn small_open(&self, seg: &mut TxSegment, head: &Head) -> SmallAt {
        let take = head.payload_len();
        debug_assert!(!self.markers && take as u64 <= INLINE_PAYLOAD_MAX);
        let h = head.len();
        // The ULPDU is everything after the 2-byte length field; pad it to
        // a multiple of four, then the CRC field (zeros until `seal` fills
        // it when CRC is on): both zeros, as the buffer grows.
        let body = h + take;
        let n = body + fpdu::pad_len(body - 2) + 4;
        const MAX: usize = HEAD_MAX + INLINE_PAYLOAD_MAX as usize + 3 + 4;
        let start = seg.buf.len();
        // Zeros of a constant length, cut to the FPDU's: the pad and the
        // CRC field stay zero.
        seg.buf.extend_from_slice(&[0u8; MAX]);
        seg.buf.truncate(start + n);
        head.write(&mut seg.buf[start..]);
        SmallAt {
            start,
            payload: start + h..start + body,
        }
    }

    /// [`Self::small_fpdu`]'s second half: the FPDU [`Self::small_open`]
    /// appended (its payload filled) becomes the segment's next inline
    /// bytes, in the stream's count.
    #[inline(always)]
    fn small_close(&mut self, seg: &mut TxSegment, at: &SmallAt) {
        let n = seg.buf.len() - at.start;
        self.len_field_pos = self.pos;
        seg.note_inline(at.start);
        if self.crc_on {
            seg.crc_at = Some(at.start + n - 4);
        }
        self.pos += n as u64;
    }

    /// Pad and the CRC field (zeros until [`TxSegment::seal`] fills them
    /// when CRC is on).
    fn finish_fpdu(&mut self, seg: &mut TxSegment, ulpdu_len: usize) {
        self.inline(seg, &[0u8; 3][..fpdu::pad_len(ulpdu_len)]);
        if self.marker_due() {
            self.emit_marker(seg, false);
        }
        // The CRC field joins the inline bytes before it (one gather entry
        // fewer: a small FPDU is one buffer); with CRC on,
        // [`TxSegment::seal`] fills it in place, and with CRC off it stays
        // zero.
        let at = seg.buf.len();
        seg.push_inline(&[0; 4]);
        if self.crc_on {
            seg.crc_at = Some(at);
        }
        self.pos += 4;
    }
}

impl Connection {
    /// Whether anything is queued for transmission. When false,
    /// [`Self::next_segment`] has nothing to give (the converse does not
    /// hold: output may be queued and held back).
    pub fn has_pending_output(&self) -> bool {
        let tx = &self.tx;
        !tx.control.is_empty()
            || tx.terminate.is_some()
            || (self.qp == QpState::Rts
                && (tx.cur.is_some()
                    || tx.rtr.is_some()
                    || !self.irq.is_empty()
                    || !self.pending.is_empty()))
    }

    /// Fills `seg` with the next control frame or FPDU to send. Returns
    /// false when there is nothing to send now. Call [`TxSegment::seal`]
    /// before writing the segment out.
    ///
    /// After a segment, [`Self::has_pending_output`] says whether asking
    /// again can give another: when it is false, this returns false until
    /// the connection is given input or a post (a message of one FPDU
    /// needs one call, not a second, empty one).
    pub fn next_segment<B: Backing>(&mut self, reg: &Registry<B>, seg: &mut TxSegment) -> bool {
        let got = self.fill_segment(reg, seg);
        if !got {
            self.tx.counts.empty_asks += 1;
        }
        // It takes control frames, the Terminate, the RTR and posted
        // requests, and starts and ends messages.
        self.inline_changed();
        got
    }

    /// [`TxState::inline_limit`] as the connection's state gives it now:
    /// the payload room of one untagged FPDU, plus one, if nothing is
    /// queued ahead of an inline Send (see [`Self::send_inline`]), else 0.
    fn inline_limit_now(&self) -> usize {
        let tx = &self.tx;
        let idle = tx.control.is_empty()
            && tx.terminate.is_none()
            && tx.fpdu_phase
            && !tx.done
            && tx.cur.is_none()
            && tx.rtr.is_none()
            && self.qp == QpState::Rts
            && self.irq.is_empty()
            && self.pending.is_empty()
            && (self.cfg.role != Role::Responder || self.first_fpdu_seen);
        let Some(whole) = self.cfg.mulpdu.checked_sub(ddp::UNTAGGED_HDR_LEN) else {
            return 0;
        };
        if !idle {
            return 0;
        }
        let room = self.fpdu_room(ddp::UNTAGGED_HDR_LEN).min(whole as u64);
        room as usize + 1
    }

    /// Stores [`Self::inline_limit_now`]: called wherever an input of it
    /// changes (the transmit state's queues, the QP state, the FPDU
    /// phase, the first FPDU seen, posted requests, Read Requests owed).
    /// `send_inline` asserts (debug builds) that it is up to date.
    pub(super) fn inline_changed(&mut self) {
        self.tx.inline_limit = self.inline_limit_now();
    }

    /// The peer's first FPDU arrived: a responder may send from now on
    /// (RFC 5044 §7.1.2). Out of line: once per connection.
    #[cold]
    #[inline(never)]
    pub(super) fn saw_first_fpdu(&mut self) {
        self.first_fpdu_seen = true;
        self.inline_changed();
    }

    fn fill_segment<B: Backing>(&mut self, reg: &Registry<B>, seg: &mut TxSegment) -> bool {
        seg.clear();
        if !self.tx.control.is_empty() {
            let control = std::mem::take(&mut self.tx.control);
            seg.push_inline(&control);
            return true;
        }
        if !self.tx.fpdu_phase || self.tx.done {
            return false;
        }
        if let Some(ulpdu) = self.tx.terminate.take() {
            seg.opcode = Some(Opcode::Terminate);
            self.tx.begin_fpdu(seg);
            self.tx.inline(seg, &fpdu::len_field(ulpdu.len()));
            self.tx.inline(seg, &ulpdu);
            self.tx.finish_fpdu(seg, ulpdu.len());
            self.tx.done = true;
            // The Terminate is out: the QP moves from Terminate to Error.
            self.qp = QpState::Error;
            return true;
        }
        if self.qp != QpState::Rts {
            return false;
        }
        // RFC 5044 §7.1.2 / siw: the responder sends nothing before the
        // initiator's first FPDU has arrived.
        if self.cfg.role == Role::Responder && !self.first_fpdu_seen {
            return false;
        }
        if self.tx.cur.is_none() && !self.start_message(reg) {
            return false;
        }
        self.emit_segment(reg, seg);
        true
    }

    /// Appends up to about `max` bytes of output to `out` (whole segments;
    /// at least one if any is ready). Returns the bytes appended.
    pub fn poll_transmit<B: Backing>(
        &mut self,
        reg: &Registry<B>,
        out: &mut Vec<u8>,
        max: usize,
    ) -> usize {
        let start = out.len();
        let mut seg = TxSegment::default();
        while out.len() - start < max.max(1) && self.next_segment(reg, &mut seg) {
            if !(seg.seal(reg) && seg.write_to(reg, out)) {
                // A region was deregistered under an active request.
                self.local_failure();
                break;
            }
        }
        out.len() - start
    }

    fn local_failure(&mut self) {
        if let Some(seq) = self.tx.cur.as_ref().and_then(|m| m.complete) {
            self.finish_sq(seq, WcStatus::LocalProtectionError);
        }
        self.close_for(CloseReason::LocalError);
    }

    /// Picks the next message; false if none can start now.
    /// Whether the send queue's next request is a Read.
    fn sq_front_is_read(&self) -> bool {
        self.pending
            .front()
            .is_some_and(|p| matches!(p.wr.op, SendOp::Read { .. }))
    }

    /// Counts of the transmit schedule so far.
    pub fn tx_counts(&self) -> TxCounts {
        self.tx.counts
    }

    /// Whether the send queue's next request could start now (a Read
    /// waits while ORD Reads are outstanding).
    fn sq_ready(&self) -> bool {
        let Some(next) = self.pending.front() else {
            return false;
        };
        if let SendOp::Read { .. } = next.wr.op {
            let ord = self.neg.as_ref().map_or(0, |n| n.ord);
            let outstanding = self.orq.iter().filter(|e| e.seq.is_some()).count();
            return outstanding < usize::from(ord.max(1));
        }
        true
    }

    fn start_message<B: Backing>(&mut self, reg: &Registry<B>) -> bool {
        if let Some(rtr) = self.tx.rtr.take() {
            let kind = match rtr {
                RtrType::Write | RtrType::Send => MsgKind::Write { stag: 1, to: 0 },
                RtrType::Read => {
                    let msn = self.tx.next_read_msn;
                    self.tx.next_read_msn = msn.wrapping_add(1);
                    MsgKind::ReadRequest {
                        msn,
                        body: ReadRequest {
                            sink_stag: 0,
                            sink_to: 0,
                            size: 0,
                            src_stag: 1,
                            src_to: 0,
                        },
                    }
                }
            };
            self.tx.cur = Some(TxMsg {
                kind,
                sources: Vec::new(),
                total: 0,
                sent: 0,
                complete: None,
                irq: false,
            });
            return true;
        }
        if let Some(r) = self.irq.front() {
            let sq_ready = self.sq_ready();
            if !sq_ready || self.tx.irq_burst < IRQ_BURST_SQ_ACTIVE {
                self.tx.irq_burst = if sq_ready { self.tx.irq_burst + 1 } else { 0 };
                if sq_ready && self.sq_front_is_read() {
                    self.tx.counts.responses_ahead_of_read += 1;
                    self.tx.counts.response_bytes_ahead_of_read += u64::from(r.size);
                }
                self.tx.cur = Some(TxMsg {
                    kind: MsgKind::ReadResponse {
                        stag: r.sink_stag,
                        to: r.sink_to,
                    },
                    sources: r.source.into_iter().collect(),
                    total: u64::from(r.size),
                    sent: 0,
                    complete: None,
                    irq: true,
                });
                return true;
            }
            self.tx.irq_burst = 0;
        }
        if !self.sq_ready() {
            return false;
        }
        let p = self.pending.pop_front().expect("front exists");
        let need = match p.wr.op {
            SendOp::Read { .. } => Access::LOCAL_WRITE,
            _ => Access::LOCAL_READ,
        };
        let mut sources = std::mem::take(&mut self.tx.spare_sources);
        sources.clear();
        for s in &p.wr.sgl {
            match reg.check(self.cfg.pd, s.lkey, s.addr, u64::from(s.length), need) {
                Ok(r) => sources.push(r),
                Err(_) => {
                    // Local protection error: the request fails and the QP
                    // goes to Error (verbs semantics).
                    self.finish_sq(p.seq, WcStatus::LocalProtectionError);
                    self.close_for(CloseReason::LocalError);
                    return false;
                }
            }
        }
        let total: u64 = sources.iter().map(|r| r.len).sum();
        let (kind, complete) = match p.wr.op {
            SendOp::Send {
                solicited,
                invalidate,
            } => {
                let opcode = match (solicited, invalidate.is_some()) {
                    (false, false) => Opcode::Send,
                    (false, true) => Opcode::SendInvalidate,
                    (true, false) => Opcode::SendSe,
                    (true, true) => Opcode::SendSeInvalidate,
                };
                let msn = self.tx.next_send_msn;
                self.tx.next_send_msn = msn.wrapping_add(1);
                (
                    MsgKind::Send {
                        opcode,
                        msn,
                        inv_stag: invalidate.unwrap_or(0),
                    },
                    Some(p.seq),
                )
            }
            SendOp::Write { remote_addr, rkey } => (
                MsgKind::Write {
                    stag: rkey,
                    to: remote_addr,
                },
                Some(p.seq),
            ),
            SendOp::Read { remote_addr, rkey } => {
                let msn = self.tx.next_read_msn;
                self.tx.next_read_msn = msn.wrapping_add(1);
                let (sink_stag, sink_to) = p.wr.sgl.first().map_or((0, 0), |s| (s.lkey, s.addr));
                self.orq.push_back(OrqEntry {
                    seq: Some(p.seq),
                    sink_stag,
                    sink_to,
                    size: total as u32,
                    received: 0,
                    sink: sources.first().copied(),
                });
                let body = ReadRequest {
                    sink_stag,
                    sink_to,
                    size: total as u32,
                    src_stag: rkey,
                    src_to: remote_addr,
                };
                sources.clear();
                (MsgKind::ReadRequest { msn, body }, None)
            }
        };
        let total = if matches!(kind, MsgKind::ReadRequest { .. }) {
            0
        } else {
            total
        };
        self.tx.cur = Some(TxMsg {
            kind,
            sources,
            total,
            sent: 0,
            complete,
            irq: false,
        });
        true
    }

    /// The payload room of one FPDU with a header of `hdr_len` bytes.
    fn fpdu_room(&self, hdr_len: usize) -> u64 {
        self.cfg
            .mulpdu
            .min(fpdu::MAX_ULPDU_LEN)
            .saturating_sub(hdr_len)
            .max(1) as u64
    }

    /// Emits the next FPDU of the current message.
    fn emit_segment<B: Backing>(&mut self, reg: &Registry<B>, seg: &mut TxSegment) {
        let msg = self.tx.cur.take().expect("message in progress");
        let tagged = matches!(
            msg.kind,
            MsgKind::Write { .. } | MsgKind::ReadResponse { .. }
        );
        let hdr_len = if tagged {
            ddp::TAGGED_HDR_LEN
        } else {
            ddp::UNTAGGED_HDR_LEN
        };
        let take = (msg.total - msg.sent).min(self.fpdu_room(hdr_len));
        let last = msg.sent + take == msg.total;
        let head = Head::new(msg.kind, msg.sent, take as usize, last);
        seg.opcode = Some(head.opcode());
        let small = take <= INLINE_PAYLOAD_MAX;
        if small
            && !self.tx.markers
            && self.tx.small_fpdu(seg, &head, |out| {
                let mut n = 0;
                for r in pieces(&msg.sources, msg.sent, take) {
                    let Some(bytes) = reg.range_slice(&r, r.len as usize) else {
                        return false;
                    };
                    out[n..n + bytes.len()].copy_from_slice(bytes);
                    n += bytes.len();
                }
                true
            })
        {
            self.finish_message(msg, take, last);
            return;
        }
        self.tx.begin_fpdu(seg);
        self.tx.inline(seg, &head.bytes()[..head.len()]);
        // Gather the payload pieces covering [sent, sent + take). A small
        // payload is copied next to its header instead: one `sendmsg`
        // iovec fewer, which costs the kernel more than copying a few
        // bytes costs us (the bytes are read now rather than at the
        // write, which verbs allows: the buffer belongs to the request
        // until its completion).
        for r in pieces(&msg.sources, msg.sent, take) {
            // A region gone from under the request stays a memory part:
            // `TxSegment::seal` reports it.
            match reg.range_slice(&r, r.len as usize).filter(|_| small) {
                Some(bytes) => self.tx.inline(seg, bytes),
                None => self.tx.memory(seg, r),
            }
        }
        self.tx.finish_fpdu(seg, head.ulpdu_len);
        self.finish_message(msg, take, last);
    }

    /// Builds into `seg` an untagged Send of the bytes of `parts` (in
    /// order) as one whole FPDU, *now*, if nothing is queued ahead of it:
    /// the connection is in RTS with its FPDU phase open, no control frame,
    /// Terminate, RTR, message in progress, Read Response or posted
    /// request waits, the responder has seen the initiator's first FPDU
    /// (RFC 6581), and the bytes fit one FPDU (`mulpdu`). Returns false,
    /// having changed nothing, otherwise — the caller then posts the
    /// message as a request.
    ///
    /// The message is what [`Self::post_send`] of an unsignalled Send
    /// (not solicited, no invalidate) followed by [`Self::next_segment`]
    /// would give, byte for byte (same MSN sequence, same encoder:
    /// `Head` and the FPDU builders of `emit_segment`), without a
    /// send-queue entry, a message in progress or a completion: it is
    /// complete once built (iWARP completes a Send when its last byte is
    /// handed to the transport, and an unsignalled success produces no
    /// completion). Seal `seg` before writing it out, as any segment.
    pub fn send_inline(&mut self, parts: &[&[u8]], seg: &mut TxSegment) -> bool {
        debug_assert_eq!(
            self.tx.inline_limit,
            self.inline_limit_now(),
            "TxState::inline_limit stale"
        );
        let total: usize = parts.iter().map(|p| p.len()).sum();
        // Nothing queued ahead, and the bytes fit one FPDU (`mulpdu`): the
        // long test, kept in one word.
        if total >= self.tx.inline_limit {
            return false;
        }
        let kind = self.tx.unposted_send();
        let head = Head::new(kind, 0, total, true);
        seg.clear();
        seg.opcode = Some(head.opcode());
        self.tx.counts.inline_sends += 1;
        if total as u64 <= INLINE_PAYLOAD_MAX && !self.tx.markers {
            // `small_fpdu` with the copy in this frame (its bytes cannot
            // fail to be there, unlike a region's).
            let at = self.tx.small_open(seg, &head);
            let mut n = at.payload.start;
            for p in parts {
                copy_short(&mut seg.buf[n..n + p.len()], p);
                n += p.len();
            }
            self.tx.small_close(seg, &at);
            return true;
        }
        self.tx.begin_fpdu(seg);
        self.tx.inline(seg, &head.bytes()[..head.len()]);
        for p in parts {
            self.tx.inline(seg, p);
        }
        self.tx.finish_fpdu(seg, head.ulpdu_len);
        true
    }

    /// After an FPDU of `msg` carrying `take` payload bytes: completes the
    /// message if that was its `last`, else keeps it for the next FPDU.
    fn finish_message(&mut self, mut msg: TxMsg, take: u64, last: bool) {
        msg.sent += take;
        if last {
            if let Some(seq) = msg.complete {
                self.finish_sq(seq, WcStatus::Success);
            }
            if msg.irq {
                self.irq.pop_front();
            }
            self.tx.spare_sources = msg.sources;
        } else {
            self.tx.cur = Some(msg);
        }
    }
}
