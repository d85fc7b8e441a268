//! Planned reads: several FPDUs of one message taken by one scatter read.
//!
//! While a message spans several FPDUs, the layout of the stream ahead is
//! predictable: the next FPDU of a Send places at the receive's next
//! bytes, the next one of a Read Response at the sink's next bytes, each
//! about as long as the one being placed, with only a trailer and a
//! header between two payloads. [`Connection::rx_plan`] writes that guess
//! as a list of pieces ([`RxPiece::Place`] into memory, [`RxPiece::Stage`]
//! into the engine's staging buffer); the engine reads the stream over
//! them with one `readv`, and [`Connection::rx_planned`] then takes the
//! bytes in stream order.
//!
//! # What may be guessed
//!
//! Only where the peer's message is already allowed to write:
//!
//! * a **Send**: the receive it is being placed into, from the next
//!   unplaced byte up to the receive's capacity (the scatter list was
//!   checked for local write when the message began, and the receive is
//!   the engine's until it completes), and no further than the previous
//!   Send on the connection reached (nothing for the first one): equal
//!   messages are guessed to their exact end;
//! * a **Read Response**: the sink of the oldest outstanding Read, from
//!   the next unplaced byte up to the Read's size (the Read has not
//!   completed, so the application does not look at it yet).
//!
//! RDMA Writes are never guessed: where a Write ends is known only from
//! its last header, and the bytes behind it in the same region may be
//! the application's (a ring another Write filled earlier). Nothing is
//! guessed with markers negotiated, or behind an FPDU marked last.
//!
//! # Verification
//!
//! The plan only says where bytes landed; what they are is decided by the
//! ordinary receive path, byte by byte in stream order: every header is
//! parsed and checked as [`Connection::rx_bytes`] does (MSN, MO, STag,
//! bounds, a Terminate, CRC at the trailer), and payload that landed in a
//! [`RxPiece::Place`] counts as placed only where [`Connection::rx_step`]
//! itself says [`RxStep::Place`] at exactly that STag and offset.
//!
//! # A wrong guess
//!
//! At the first byte where the stream differs from the plan (a shorter or
//! longer FPDU, the end of the message, a Terminate, another STag or
//! queue), every byte read from there on is copied out of the pieces it
//! landed in, all of it before anything more is written, and fed through
//! [`Connection::handle_input`]: re-placed where its own header says. So
//! no byte is consumed twice or skipped, and payload that landed in a
//! wrong place is never counted as placed. The bytes a wrong guess wrote
//! stay inside the receive (beyond the completion's `byte_len`, or a
//! receive that completes in error) or inside the Read's sink (which the
//! Read's own data overwrites before it completes) — memory the message
//! was allowed to fill.
//!
//! **Unlike siw** (and RNICs), a Send shorter than the one before it can
//! leave stream bytes in its receive past the completion's `byte_len`
//! (up to the previous message's length; `docs/protocol-notes.md` §8).
//! A wrong guess costs one copy of the bytes read after it (bounded by
//! the plan, at most 1 MiB in the engine), whatever the peer sends.

use warpsock_wire::fpdu;
use warpsock_wire::terminate::TermCode;

use super::super::cm::Attach;
use super::super::Connection;
use super::{Effect, Phase, RxStep};
use crate::mem::{Backing, Range, Registry};

/// Most pieces one plan holds (each FPDU takes a staging piece and one
/// placement piece per scatter entry it touches).
const MAX_PIECES: usize = 64;

/// One piece of a planned read, in stream order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RxPiece {
    /// Payload expected to belong at this range: read straight into it.
    Place(Range),
    /// This many bytes read into the staging buffer, each piece right
    /// after the previous one: the trailer of one FPDU and the header of
    /// the next, or (the last piece) whatever follows the plan.
    Stage(usize),
}

impl Connection {
    /// Plans one read of the payload being placed and of the FPDUs of the
    /// same message expected behind it (see the module docs: what may be
    /// guessed), at most `max_payload` payload bytes, ending in a
    /// `tail`-byte staging piece. Returns false (and leaves `plan` empty)
    /// when there is nothing to guess beyond the current FPDU; then read
    /// as [`RxStep::Place`] says.
    ///
    /// Call when [`Self::rx_step`] is [`RxStep::Place`]. The staging
    /// pieces together take [`RxPiece::staged`] bytes.
    pub fn rx_plan(&self, max_payload: usize, tail: usize, plan: &mut Vec<RxPiece>) -> bool {
        plan.clear();
        let rx = &self.rx;
        if rx.phase != Phase::Payload || rx.markers || rx.in_marker {
            return false;
        }
        let Some(hdr) = rx.hdr else { return false };
        if hdr.last {
            return false;
        }
        let head_sink;
        // The message's scatter list, where in it the next FPDU begins,
        // and where the message must end.
        let (targets, mut next_at, end): (&[Range], u64, u64) = match rx.effect {
            Effect::Send => {
                // No further than the previous Send reached: a stream of
                // equal messages is guessed to its exact end, so a wrong
                // guess (and bytes written past a completion's length)
                // comes only with a message shorter than the one before
                // or FPDUs of uneven length, and the first message is not
                // guessed at all.
                let (Some(msg), Some(last)) = (rx.send.as_ref(), rx.last_send_len) else {
                    return false;
                };
                (
                    &msg.targets[..],
                    msg.placed + rx.payload_len as u64,
                    msg.capacity.min(last),
                )
            }
            Effect::ReadResponse => {
                let Some(head) = self.orq.front() else {
                    return false;
                };
                let Some(sink) = head.sink else { return false };
                head_sink = [sink];
                (
                    &head_sink,
                    u64::from(head.received) + rx.payload_len as u64,
                    u64::from(head.size),
                )
            }
            _ => return false,
        };
        // The rest of the current FPDU's payload, as `rx_step` walks it.
        let mut left = (rx.payload_len - rx.payload_done) as u64;
        for (i, t) in rx.targets.iter().enumerate().skip(rx.target_idx) {
            if left == 0 {
                break;
            }
            let skip = if i == rx.target_idx { rx.target_off } else { 0 };
            let take = (t.len - skip).min(left);
            plan.push(RxPiece::Place(Range {
                stag: t.stag,
                offset: t.offset + skip,
                len: take,
                serial: t.serial,
            }));
            left -= take;
        }
        let full = rx.payload_len as u64;
        let hdr_len = 2 + hdr.len();
        let mut ulpdu = rx.ulpdu_len;
        let mut payload = (rx.payload_len - rx.payload_done) as u64;
        let mut fpdus = 0;
        while next_at < end {
            let len = full.min(end - next_at);
            if payload + len > max_payload as u64
                || plan.len() + 2 + pieces_of(targets, next_at, len) > MAX_PIECES
            {
                break;
            }
            plan.push(RxPiece::Stage(
                fpdu::pad_len(ulpdu) + fpdu::CRC_LEN + hdr_len,
            ));
            push_slice(targets, next_at, len, plan);
            ulpdu = hdr.len() + len as usize;
            next_at += len;
            payload += len;
            fpdus += 1;
        }
        if fpdus == 0 {
            plan.clear();
            return false;
        }
        plan.push(RxPiece::Stage(tail));
        true
    }

    /// Takes the `n` bytes one read scattered over `plan` (from
    /// [`Self::rx_plan`], in order; fewer than the plan holds if the
    /// stream had fewer): [`RxPiece::Place`] bytes where they lie,
    /// [`RxPiece::Stage`] bytes from `stage` (the staging pieces back to
    /// back from its start). Everything is consumed. Returns false if the
    /// stream differed from the plan (the bytes from there on were copied
    /// and fed through [`Self::handle_input`]; see the module docs) or
    /// ended in it (a Terminate, a CRC error: the rest is discarded).
    pub fn rx_planned<B: Backing>(
        &mut self,
        plan: &[RxPiece],
        n: usize,
        stage: &[u8],
        reg: &mut Registry<B>,
    ) -> bool {
        let mut start = 0; // stream offset of the piece
        let mut soff = 0; // staging offset of the next staging piece
        for (i, piece) in plan.iter().enumerate() {
            if start >= n {
                break;
            }
            let len = piece_len(*piece);
            let k = len.min(n - start);
            let last = i + 1 == plan.len();
            let diverged_at = match *piece {
                RxPiece::Stage(_) if last => {
                    // Whatever follows the plan: the ordinary path.
                    self.feed_all(&stage[soff..soff + k], reg);
                    return true;
                }
                RxPiece::Stage(_) => self.take_framing(&stage[soff..soff + k], reg),
                RxPiece::Place(p) => self.take_placed(p, k, reg),
            };
            if let RxPiece::Stage(_) = piece {
                soff += len;
            }
            match diverged_at {
                Ok(()) => {}
                Err(Stop::Closed) => return false,
                Err(Stop::Diverged(at)) => {
                    match gather(plan, i, at, n - start, stage, soff, reg) {
                        Some(spill) => self.feed_all(&spill, reg),
                        None => self.region_gone(),
                    }
                    return false;
                }
            }
            start += len;
        }
        true
    }

    /// Feeds framing of a staging piece between two planned payloads.
    fn take_framing<B: Backing>(
        &mut self,
        bytes: &[u8],
        reg: &mut Registry<B>,
    ) -> Result<(), Stop> {
        let mut at = 0;
        while at < bytes.len() {
            match self.rx_step() {
                RxStep::Bytes(_) => {
                    let k = self.rx_bytes(&bytes[at..], reg);
                    if k == 0 {
                        return Err(Stop::Diverged(at));
                    }
                    at += k;
                }
                RxStep::Closed => return Err(Stop::Closed),
                // Payload where the plan has framing.
                RxStep::Place(_) | RxStep::Blocked => return Err(Stop::Diverged(at)),
            }
        }
        Ok(())
    }

    /// Counts the `k` bytes read into `p` as placed, as far as the receive
    /// path places there itself.
    fn take_placed<B: Backing>(
        &mut self,
        p: Range,
        k: usize,
        reg: &mut Registry<B>,
    ) -> Result<(), Stop> {
        let mut done = 0;
        while done < k {
            match self.rx_step() {
                RxStep::Place(r) if r.stag == p.stag && r.offset == p.offset + done as u64 => {
                    let m = (r.len as usize).min(k - done);
                    let Some(bytes) = reg.range_slice(&r, m) else {
                        self.region_gone();
                        return Err(Stop::Closed);
                    };
                    self.rx_placed(bytes);
                    done += m;
                }
                RxStep::Closed => return Err(Stop::Closed),
                _ => return Err(Stop::Diverged(done)),
            }
        }
        Ok(())
    }

    /// A region under the read vanished (not while the engine holds it):
    /// the stream cannot continue.
    fn region_gone(&mut self) {
        self.send_terminate(TermCode::DDP_LOCAL_CATASTROPHIC, Attach::Nothing);
        self.rx.phase = Phase::Discard;
    }

    /// [`Self::handle_input`] until all of `bytes` is consumed (it stops
    /// early only at [`RxStep::Blocked`], which full operation never is).
    fn feed_all<B: Backing>(&mut self, bytes: &[u8], reg: &mut Registry<B>) {
        let mut at = 0;
        while at < bytes.len() {
            let k = self.handle_input(&bytes[at..], reg);
            if k == 0 {
                break;
            }
            at += k;
        }
    }
}

/// Where a planned read stopped following the plan.
enum Stop {
    /// The stream is finished (a Terminate, an error): the rest is
    /// discarded, as [`Connection::handle_input`] would.
    Closed,
    /// The stream differs from the plan at this byte of the piece.
    Diverged(usize),
}

impl RxPiece {
    /// Total staging bytes of `plan` (the engine's staging buffer must
    /// hold them).
    pub fn staged(plan: &[Self]) -> usize {
        plan.iter()
            .map(|p| match p {
                Self::Stage(n) => *n,
                Self::Place(_) => 0,
            })
            .sum()
    }
}

fn piece_len(p: RxPiece) -> usize {
    match p {
        RxPiece::Stage(n) => n,
        RxPiece::Place(r) => r.len as usize,
    }
}

/// Copies the stream bytes from byte `at` of piece `i` on (`left` bytes
/// were read from the start of piece `i`; `soff` is the staging offset
/// just past piece `i` if it is a staging piece, else of the next one).
/// `None` if a region of the plan is gone.
fn gather<B: Backing>(
    plan: &[RxPiece],
    i: usize,
    at: usize,
    left: usize,
    stage: &[u8],
    soff: usize,
    reg: &Registry<B>,
) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(left - at);
    let mut left = left;
    // The staging offset of piece `i` itself.
    let mut s = match plan[i] {
        RxPiece::Stage(n) => soff - n,
        RxPiece::Place(_) => soff,
    };
    for (j, piece) in plan.iter().enumerate().skip(i) {
        if left == 0 {
            break;
        }
        let len = piece_len(*piece);
        let k = len.min(left);
        let from = if j == i { at } else { 0 };
        match *piece {
            RxPiece::Stage(_) => {
                out.extend_from_slice(&stage[s + from..s + k]);
                s += len;
            }
            RxPiece::Place(r) => out.extend_from_slice(&reg.range_slice(&r, k)?[from..]),
        }
        left -= k;
    }
    Some(out)
}

/// How many pieces [`push_slice`] would push.
fn pieces_of(targets: &[Range], at: u64, len: u64) -> usize {
    let mut n = 0;
    walk(targets, at, len, |_| n += 1);
    n
}

/// Pushes the ranges of `targets` (a scatter list read as one space) at
/// `[at, at + len)`.
fn push_slice(targets: &[Range], at: u64, len: u64, plan: &mut Vec<RxPiece>) {
    walk(targets, at, len, |r| plan.push(RxPiece::Place(r)));
}

/// Calls `f` with the pieces of `targets` (a scatter list read as one
/// space) that cover `[at, at + len)`, in order.
pub(super) fn walk(targets: &[Range], at: u64, len: u64, mut f: impl FnMut(Range)) {
    let mut skip = at;
    let mut left = len;
    for t in targets {
        if left == 0 {
            break;
        }
        if skip >= t.len {
            skip -= t.len;
            continue;
        }
        let take = (t.len - skip).min(left);
        f(Range {
            stag: t.stag,
            offset: t.offset + skip,
            len: take,
            serial: t.serial,
        });
        skip = 0;
        left -= take;
    }
}
