//! The transmit half of the socket driver (the core's `conn/tx.rs` is its
//! protocol side): segments sealed and queued, one gathered `sendmsg` for
//! many of them, send-queue completions held until their bytes are
//! written.

use std::io::{self, IoSlice};
use std::os::fd::AsRawFd;

use warpsock_proto::conn::pieces_of;
use warpsock_proto::wire::ddp::Opcode;
use warpsock_proto::{Registry, TxPart, TxSegment, WcStatus, WorkQueue};

use super::{QpSlot, CONTROL_MAX};
use crate::mem::Mem;
use crate::sys;
use crate::wc::{push_wc, CqSlot};

/// Unwritten bytes queued before the first `sendmsg`.
const TX_BATCH: usize = 4 << 20;
/// Segments queued at most.
const TX_SEGS: usize = 512;
/// The largest segment buffer kept for reuse: an FPDU's room of inline
/// bytes (an inline Send copies at most one FPDU's payload).
const POOLED_BYTES: usize = 128 << 10;
/// FPDUs of one gathered write at most ([`QpSlot::tx_gathered`]): with
/// loopback's ~64 KiB FPDUs, `TX_BATCH` of bytes — the most its copy of
/// what the socket did not take can be.
const GATHER_FPDUS: usize = 64;

impl QpSlot {
    /// Produces and writes segments until the socket would block or there
    /// is nothing more to send.
    pub(super) fn tx(&mut self, reg: &Registry<Mem>, cqs: &mut [Option<CqSlot>]) {
        // Once the core has said it has nothing more, it says so until it
        // is given input or a post, neither of which happens in here:
        // asking again after the write would be an empty call (one of
        // the four `next_segment` calls per message was). It says so with
        // the last segment too (`has_pending_output`): a message of one
        // FPDU is one call, not a second, empty one.
        let mut exhausted = false;
        self.io.tx_passes += 1;
        if self.txq.is_empty() && !self.dead {
            match self.tx_direct(reg, cqs) {
                Direct::Done => return,
                Direct::Exhausted => exhausted = true,
                Direct::Queued => {}
            }
        }
        while !self.dead {
            // Refill the queue.
            // (Asking `has_pending_output` before the first call as well
            // would skip the receive side's empty call too; tried and
            // dropped: with that loop siw in the test VM reported MPA CRC
            // errors, 5 runs of 5 (1 in 6 without it), on streams whose
            // every FPDU CRC checks out in the host-side capture. The cause
            // turned out to be siw's split-trailer bug (protocol-notes
            // §7.12), which a tighter loop only hits more often through
            // qemu's re-segmentation; worth trying again.)
            while !exhausted
                && self.txq.len() < TX_SEGS
                && (self.queued - self.written) < TX_BATCH as u64
            {
                let mut seg = self.pool.pop().unwrap_or_default();
                if !self.conn.next_segment(reg, &mut seg) {
                    self.pool.push(seg);
                    exhausted = true;
                    break;
                }
                if !seg.seal(reg) {
                    // A payload region vanished under an active request.
                    let read_response = seg.opcode() == Some(Opcode::RdmaReadResponse);
                    self.pool.push(seg);
                    self.fail_segment(read_response, cqs);
                    break;
                }
                self.count_waiting(seg.opcode(), seg.len());
                self.queued += seg.len() as u64;
                self.txq.push_back(seg);
                self.collect(cqs);
                exhausted = !self.conn.has_pending_output();
            }
            if self.txq.is_empty() {
                break;
            }
            let mut iov = recycle(std::mem::take(&mut self.iov_store));
            let mut skip = self.tx_off;
            let mut vanished = false;
            'gather: for seg in &self.txq {
                for p in seg.parts() {
                    let bytes = match *p {
                        TxPart::Inline { start, end } => &seg.inline_bytes()[start..end],
                        TxPart::Memory(r) => match reg.range_slice(&r, r.len as usize) {
                            Some(b) => b,
                            None => {
                                vanished = true;
                                break 'gather;
                            }
                        },
                    };
                    if skip >= bytes.len() {
                        skip -= bytes.len();
                        continue;
                    }
                    iov.push(IoSlice::new(&bytes[skip..]));
                    skip = 0;
                    if iov.len() == sys::IOV_MAX {
                        break 'gather;
                    }
                }
            }
            if iov.is_empty() && vanished {
                self.iov_store = recycle(iov);
                // A region went away under segments already queued (the
                // front one possibly half written): the stream cannot be
                // framed any more. Everything is flushed, and the peer
                // learns now (not when the QP is dropped), by a reset: a
                // FIN mid-FPDU read at a socket layer as a clean end after
                // a short stream (helper 69's review: the bytes a send had
                // returned for, queued behind a Read Response from a
                // mapping a close let go, were lost with no error).
                self.abort();
                sys::reset_now(self.sock.as_raw_fd());
                break;
            }
            let sent = sys::send_vectored(self.sock.as_raw_fd(), &iov);
            self.iov_store = recycle(iov);
            self.io.writes += 1;
            match sent {
                Ok(n) => {
                    self.io.write_bytes += n as u64;
                    self.advance_tx(n);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.io.writes_blocked += 1;
                    break;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => self.fail_with(&e),
            }
        }
        // The caller (`service_tx`) releases the held completions next.
    }

    /// The start of a pass with nothing queued: the core's next segment,
    /// and when it is the only output (a small message's one FPDU, the
    /// ping-pong case), its write straight from the segment — no queue of
    /// segments, no gather list built from it, and its completion straight
    /// to the completion queue when every byte went out (the general loop
    /// queued the segment, gathered it back out, popped it, and held the
    /// completion until `release_held`). Whatever is not simple (more
    /// output behind it, a partial or interrupted write, a segment of
    /// more than [`DIRECT_PARTS`] pieces or whose region is gone) is left
    /// queued for the general loop, exactly as it would have queued it.
    fn tx_direct(&mut self, reg: &Registry<Mem>, cqs: &mut [Option<CqSlot>]) -> Direct {
        let mut seg = self.pool.pop().unwrap_or_default();
        if !self.conn.next_segment(reg, &mut seg) {
            self.pool.push(seg);
            return Direct::Exhausted;
        }
        if !seg.seal(reg) {
            let read_response = seg.opcode() == Some(Opcode::RdmaReadResponse);
            self.pool.push(seg);
            self.fail_segment(read_response, cqs);
            return Direct::Exhausted;
        }
        self.count_waiting(seg.opcode(), seg.len());
        self.queued += seg.len() as u64;
        let more = self.conn.has_pending_output();
        let mut iov = [IoSlice::new(&[]); DIRECT_PARTS];
        let mut n = 0;
        let simple = !more
            && seg.parts().len() <= DIRECT_PARTS
            && seg.parts().iter().all(|p| {
                let bytes = match *p {
                    TxPart::Inline { start, end } => &seg.inline_bytes()[start..end],
                    TxPart::Memory(r) => match reg.range_slice(&r, r.len as usize) {
                        Some(b) => b,
                        None => return false,
                    },
                };
                iov[n] = IoSlice::new(bytes);
                n += 1;
                true
            });
        if !simple {
            self.txq.push_back(seg);
            self.collect(cqs);
            return if more {
                Direct::Queued
            } else {
                Direct::Exhausted
            };
        }
        let sent = sys::send_vectored(self.sock.as_raw_fd(), &iov[..n]);
        let len = seg.len();
        self.written_direct(Written::Held(seg), len, sent, cqs)
    }

    /// Builds a Send of the bytes of `parts` as one FPDU and writes it at
    /// once ([`warpsock_proto::Connection::send_inline`]), when nothing is
    /// queued here or in the core ahead of it. Written as
    /// [`Self::tx_direct`] writes: what the socket does not take (a partial
    /// or blocked write) is queued for the next transmit pass; no
    /// completion is made (the Send is unsignalled and complete once handed
    /// over). Returns `None`, having done nothing, if refused (anything
    /// queued ahead, or more than one FPDU); else `Some(full)`: whether the
    /// socket took the FPDU in part or not at all (the caller then watches
    /// it instead of writing into it again at once). Always inlined into
    /// its one caller (`Qp::send_inline_news`, the 8 B path's send): fat
    /// LTO's choice flipped with unrelated changes elsewhere in the engine
    /// (the wait code in cq.rs: +15 in d6fdf10's trials, +22 for review
    /// r22-d item 1), a call and its spills per send.
    #[inline(always)]
    pub(crate) fn tx_inline(
        &mut self,
        reg: &Registry<Mem>,
        cqs: &mut [Option<CqSlot>],
        parts: &[&[u8]],
    ) -> Option<bool> {
        if self.dead || !self.txq.is_empty() {
            return None;
        }
        // Built in place in the pool's last segment: it moves out of the
        // pool only if the socket does not take all of it.
        if self.pool.is_empty() {
            self.pool.push(TxSegment::default());
        }
        let seg = self.pool.last_mut().expect("a pooled segment");
        if !self.conn.send_inline(parts, seg) {
            return None;
        }
        // Every byte of the segment is inline: sealing reads no region.
        seg.seal(reg);
        let (len, opcode) = (seg.len(), seg.opcode());
        let sent = sys::send_vectored(self.sock.as_raw_fd(), &[IoSlice::new(seg.inline_bytes())]);
        self.io.tx_passes += 1;
        self.count_waiting(opcode, len);
        self.queued += len as u64;
        let full = match &sent {
            // Taken whole (every ping-pong send): `written_direct`'s `Done`
            // with the segment left in the pool, where it was built.
            Ok(k) if *k == len => {
                self.io.writes += 1;
                self.io.write_bytes += len as u64;
                self.written += len as u64;
                self.collect(cqs);
                return Some(false);
            }
            Ok(_) => true,
            Err(e) => e.kind() == io::ErrorKind::WouldBlock,
        };
        self.written_direct(Written::PoolTop, len, sent, cqs);
        Some(full)
    }

    /// Frames Sends of the bytes of `msgs` (each a message's `parts`, any
    /// length), in order, and writes them at once, their payloads gathered
    /// from where the caller has them
    /// ([`warpsock_proto::Connection::send_gathered`]: no copy into a
    /// segment first), in one `sendmsg`, when nothing is queued here or in
    /// the core ahead of them. What the socket does not take (a partial or
    /// blocked write) is copied into a segment of its own then and queued
    /// for the next pass, so the parts need live only for the call: at
    /// most [`GATHER_FPDUS`] FPDUs and `IOV_MAX` pieces in all, and
    /// `TX_BATCH` of payload unless the first message alone is more. No completion (the
    /// Sends are unsignalled and complete once handed over). Returns
    /// `None` having done nothing (the first message refused: anything
    /// queued ahead, too many FPDUs), else how many of the messages, from
    /// the first, it took (the rest are the caller's to post) and whether
    /// the socket took the FPDUs in part or not at all (as
    /// [`Self::tx_inline`]).
    pub(crate) fn tx_gathered(
        &mut self,
        cqs: &mut [Option<CqSlot>],
        msgs: &[&[&[u8]]],
    ) -> Option<(usize, bool)> {
        if self.dead || !self.txq.is_empty() {
            return None;
        }
        debug_assert_eq!(self.tx_off, 0, "nothing queued, nothing half written");
        let mut frames = std::mem::take(&mut self.gathered);
        frames.clear();
        // A head, the payload's pieces and a trailer an FPDU.
        let (mut taken, mut pieces, mut bytes) = (0, 0, 0);
        for parts in msgs {
            let per = 2 + parts.len();
            let max = (GATHER_FPDUS - frames.len()).min((sys::IOV_MAX - pieces) / per);
            let len: usize = parts.iter().map(|p| p.len()).sum();
            let before = frames.len();
            if max == 0
                || (taken > 0 && bytes + len > TX_BATCH)
                || !self.conn.send_gathered(parts, &mut frames, max)
            {
                break;
            }
            taken += 1;
            bytes += len;
            // At most: an FPDU's payload is one run of the parts.
            pieces += (frames.len() - before) * per;
        }
        if taken == 0 {
            self.gathered = frames;
            return None;
        }
        let mut iov = recycle(std::mem::take(&mut self.iov_store));
        let mut len = 0;
        // A message's first FPDU carries its bytes from 0 (MO 0).
        let mut at = 0;
        for (k, f) in frames.iter().enumerate() {
            if k > 0 && f.payload().start == 0 {
                at += 1;
            }
            iov.push(IoSlice::new(f.head()));
            pieces_of(msgs[at], f.payload(), |b| iov.push(IoSlice::new(b)));
            iov.push(IoSlice::new(f.trailer()));
            len += f.len();
        }
        debug_assert_eq!(at + 1, taken);
        let sent = sys::send_vectored(self.sock.as_raw_fd(), &iov);
        self.io.tx_passes += 1;
        self.io.writes += 1;
        self.count_waiting(Some(Opcode::Send), len);
        self.queued += len as u64;
        let (took, full) = match sent {
            Ok(k) => (k, k < len),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                self.io.writes_blocked += 1;
                (0, true)
            }
            // Nothing taken; the next pass writes it (as `written_direct`).
            Err(e) if e.kind() == io::ErrorKind::Interrupted => (0, false),
            Err(e) => {
                self.iov_store = recycle(iov);
                self.gathered = frames;
                self.fail_with(&e);
                return Some((taken, false));
            }
        };
        self.io.write_bytes += took as u64;
        self.written += took as u64;
        if took < len {
            // The rest, owned: the caller's buffers are its own again once
            // this returns.
            let mut seg = self.pool.pop().unwrap_or_default();
            let mut skip = took;
            seg.set_framed(
                Opcode::Send,
                iov.iter().filter_map(|s| {
                    if skip >= s.len() {
                        skip -= s.len();
                        return None;
                    }
                    let b = &s[std::mem::take(&mut skip)..];
                    Some(b)
                }),
            );
            self.io.gathered_copied += seg.len() as u64;
            self.txq.push_back(seg);
        }
        self.iov_store = recycle(iov);
        self.gathered = frames;
        self.collect(cqs);
        Some((taken, full))
    }

    /// After the one system call that wrote `seg` (`len` bytes), the only
    /// output (`sent`: its result): queues what the socket did not take.
    /// Always inlined (two callers): the frame, its register saves and the
    /// `Direct` an inline Send ignores are its callers' (issue 12).
    #[inline(always)]
    fn written_direct(
        &mut self,
        seg: Written,
        len: usize,
        sent: io::Result<usize>,
        cqs: &mut [Option<CqSlot>],
    ) -> Direct {
        self.io.writes += 1;
        let next = match sent {
            Ok(k) => {
                self.io.write_bytes += k as u64;
                self.written += k as u64;
                if k == len {
                    self.pool_back(seg);
                    Direct::Done
                } else {
                    self.tx_off = k;
                    self.queue(seg);
                    Direct::Exhausted
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                self.io.writes_blocked += 1;
                self.queue(seg);
                Direct::Done
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {
                self.queue(seg);
                Direct::Exhausted
            }
            Err(e) => {
                self.pool_back(seg);
                self.fail_with(&e);
                Direct::Done
            }
        };
        // The segment's completion (if it ended a message) is marked with
        // the stream position after it, as the general loop marks it.
        self.collect(cqs);
        next
    }

    /// A directly written segment is done with: back to the pool.
    fn pool_back(&mut self, seg: Written) {
        match seg {
            Written::Held(s) => self.pool.push(s),
            Written::PoolTop => {}
        }
    }

    /// A directly written segment the socket did not take (all): queued
    /// for the next pass.
    fn queue(&mut self, seg: Written) {
        let s = match seg {
            Written::Held(s) => s,
            Written::PoolTop => self.pool.pop().expect("the segment built in the pool"),
        };
        self.txq.push_back(s);
    }

    /// A segment could not be sealed because its payload region is gone:
    /// the peer gets a Terminate (local catastrophic error), the request
    /// that segment belonged to completes with `LocalProtectionError`
    /// (unless it was the peer's Read, answered from our region), the rest
    /// is flushed. The segments queued before it still go out, so the
    /// stream stays framed.
    fn fail_segment(&mut self, read_response: bool, cqs: &mut [Option<CqSlot>]) {
        // The core completes a Send or Write when its last segment is
        // handed out: if this was that segment, its completion is already
        // waiting (every earlier one was collected after its segment).
        let mut marked = false;
        while let Some(mut wc) = self.conn.poll_completion() {
            match wc.queue {
                WorkQueue::Recv => push_wc(cqs, self.recv_cq, self.qp_num, wc, &self.conn),
                WorkQueue::Send => {
                    if wc.status == WcStatus::Success && !read_response {
                        wc.status = WcStatus::LocalProtectionError;
                        wc.byte_len = 0;
                        marked = true;
                    }
                    self.held.push_back((self.queued, wc));
                }
            }
        }
        self.conn.fail_local(None, !read_response && !marked);
    }

    /// Counts what a Read Request or a small control message about to be
    /// queued waits behind: the bytes queued ahead of it and not yet
    /// written ([`super::IoStats::read_request_wait_bytes`]).
    fn count_waiting(&mut self, opcode: Option<Opcode>, len: usize) {
        let ahead = self.queued - self.written;
        if opcode == Some(Opcode::RdmaReadRequest) {
            self.io.read_requests += 1;
            self.io.read_request_wait_bytes += ahead;
        } else if len <= CONTROL_MAX {
            self.io.control_msgs += 1;
            self.io.control_wait_bytes += ahead;
        }
    }

    fn advance_tx(&mut self, n: usize) {
        self.written += n as u64;
        self.tx_off += n;
        while let Some(front) = self.txq.front() {
            if self.tx_off < front.len() {
                break;
            }
            self.tx_off -= front.len();
            let mut seg = self.txq.pop_front().expect("front exists");
            // A gathered Send's copied rest: not kept for reuse.
            seg.release_large(POOLED_BYTES);
            self.pool.push(seg);
        }
    }

    /// Drains the core's completions and events: receive completions go
    /// out at once, send-queue completions wait for their bytes.
    #[inline]
    pub(super) fn collect(&mut self, cqs: &mut [Option<CqSlot>]) {
        // Nothing to collect after most writes (an inline Send completes
        // nothing): one look instead of two empty pops.
        if self.conn.has_reports() {
            self.collect_reports(cqs);
        }
    }

    fn collect_reports(&mut self, cqs: &mut [Option<CqSlot>]) {
        while let Some(wc) = self.conn.poll_completion() {
            match wc.queue {
                WorkQueue::Recv => push_wc(cqs, self.recv_cq, self.qp_num, wc, &self.conn),
                // Every byte queued so far is written and nothing is held
                // ahead of it: nothing to wait for (`release_held` would
                // deliver it next, as it is).
                WorkQueue::Send if self.held.is_empty() && self.queued == self.written => {
                    push_wc(cqs, self.send_cq, self.qp_num, wc, &self.conn);
                }
                WorkQueue::Send => self.held.push_back((self.queued, wc)),
            }
        }
        while let Some(e) = self.conn.poll_event() {
            self.events.push_back(e);
        }
    }

    /// Delivers the held send-queue completions whose bytes are written;
    /// on a dead connection, the rest as flush errors (each exactly once).
    pub(super) fn release_held(&mut self, cqs: &mut [Option<CqSlot>]) {
        self.collect(cqs);
        self.deliver_held(cqs);
    }

    /// [`Self::release_held`] right after a [`Self::collect`] (nothing
    /// the core could have completed since).
    pub(super) fn deliver_held(&mut self, cqs: &mut [Option<CqSlot>]) {
        while let Some(&(mark, mut wc)) = self.held.front() {
            if mark > self.written {
                if !self.dead {
                    break;
                }
                // Never reached the socket.
                wc.status = WcStatus::WrFlushError;
                wc.byte_len = 0;
            }
            self.held.pop_front();
            push_wc(cqs, self.send_cq, self.qp_num, wc, &self.conn);
        }
    }
}

/// Pieces of a segment [`QpSlot::tx_direct`] writes from the stack: a small
/// FPDU is one, a large one without markers three (header, payload, pad
/// and CRC).
const DIRECT_PARTS: usize = 4;

/// Where the segment of a direct write is (see [`QpSlot::tx_inline`]).
enum Written {
    /// In hand ([`QpSlot::tx_direct`]).
    Held(TxSegment),
    /// The pool's last, built there in place ([`QpSlot::tx_inline`]).
    PoolTop,
}

/// What [`QpSlot::tx_direct`] left for the rest of the pass.
enum Direct {
    /// Nothing: the pass is over (all written, the socket is full, or the
    /// connection failed).
    Done,
    /// The core has nothing more; a segment may be queued to write.
    Exhausted,
    /// A segment is queued and the core has more.
    Queued,
}

/// Empties a gather list and hands its allocation over to a list of
/// another lifetime (an empty `Vec` of the same layout is collected in
/// place, without allocating).
fn recycle<'b>(mut v: Vec<IoSlice<'_>>) -> Vec<IoSlice<'b>> {
    v.clear();
    v.into_iter()
        .map(|_| unreachable!("the list is empty"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recycled_gather_list_keeps_its_allocation() {
        let data = [1u8, 2, 3];
        let mut v: Vec<IoSlice<'_>> = Vec::with_capacity(64);
        v.push(IoSlice::new(&data));
        let ptr = v.as_ptr() as usize;
        let w: Vec<IoSlice<'static>> = recycle(v);
        assert!(w.is_empty());
        assert!(w.capacity() >= 64);
        assert_eq!(w.as_ptr() as usize, ptr);
    }
}
