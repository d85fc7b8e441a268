//! Zero-copy reads by retargeting posted receives: a blocking read of at
//! least `zcopy_min` bytes that finds nothing queued points the receives
//! we posted for the peer's Sends — those no byte has reached yet — at
//! its own buffers, so the DATA messages already on their way (and those
//! sent later) are placed there by the engine, with no copy out of a slot.
//!
//! Each retargeted receive keeps the slot's capacity and layout around a
//! window of the program's buffer: the first [`MAX_CONTROL_LEN`] bytes of
//! the message (header, and a control message's whole body, or the first
//! 32 payload bytes of a DATA message) still go into the slot, then up to
//! a slot's payload into the program's buffer at the stream position the
//! message is expected at, then whatever is left into the slot after that
//! window (so a message longer than the window reads on from the slot at
//! the offset the books say). Receives `k` of a read expect their bytes
//! one slot payload apart; a message that carries less (a short DATA, a
//! control message) shifts the later ones, which are then moved back
//! into place (a copy, counted as one).
//!
//! The contract with the program's memory (what TCP promises a reader):
//! * only receives at the front of the queue are retargeted, and only
//!   while every receive before them has been processed, so the bytes the
//!   call delivers never reach a window the engine may still write;
//! * before the call returns — with data, at its timeout, at the end of
//!   the stream, on an error — every retargeted receive that has not
//!   started is pointed back at its slot, and one a message is being
//!   placed into is waited for (its bytes are delivered with the call);
//!   a peer that never finishes that message fails the connection within
//!   `sink_cancel_timeout` and the registrations are dropped first, so no
//!   byte reaches the program's memory after the call;
//! * bytes past the length the call returns may have been written (as
//!   scratch), never bytes before it.
//!
//! `MSG_PEEK`, message mode, non-blocking calls and reads that find bytes
//! queued use the slots (a copy), as do small reads.

use std::sync::MutexGuard;
use std::time::Instant;

use warpsock_engine::{Access, Mr, Sgl};

use super::settings::Count;
use super::socket::{State, XSocket};
use crate::wire::{HDR_LEN, MAX_CONTROL_LEN};

/// A receive pointed at the program's buffers.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Retargeted {
    /// The receive (its slot).
    pub(crate) slot: u32,
    /// Where in the read (offset into the buffers taken as one) the
    /// message's first payload byte belongs if it arrives as expected.
    pub(crate) pos: usize,
    /// Bytes of the program's buffers in its window (after the payload
    /// bytes that stay in the slot).
    pub(crate) window: usize,
}

/// Payload bytes of a message that stay in the slot, before the window.
const HEAD: usize = MAX_CONTROL_LEN - HDR_LEN;

/// Offset into `bufs` taken as one: (buffer, offset in it).
fn locate(bufs: &[&mut [u8]], mut pos: usize) -> (usize, usize) {
    for (i, b) in bufs.iter().enumerate() {
        if pos < b.len() {
            return (i, pos);
        }
        pos -= b.len();
    }
    (bufs.len(), 0)
}

/// Copies `src` to offset `pos` of `bufs` taken as one.
fn write_at(bufs: &mut [&mut [u8]], mut pos: usize, mut src: &[u8]) {
    while !src.is_empty() {
        let (i, o) = locate(bufs, pos);
        let k = src.len().min(bufs[i].len() - o);
        bufs[i][o..o + k].copy_from_slice(&src[..k]);
        src = &src[k..];
        pos += k;
    }
}

/// Moves `n` bytes of `bufs` (taken as one) from offset `from` back to
/// `to` (`to < from`; the ranges may overlap).
fn move_back(bufs: &mut [&mut [u8]], mut from: usize, mut to: usize, mut n: usize) {
    debug_assert!(to < from);
    while n > 0 {
        let (i, oi) = locate(bufs, from);
        let (j, oj) = locate(bufs, to);
        let k = n.min(bufs[i].len() - oi).min(bufs[j].len() - oj);
        if i == j {
            bufs[i].copy_within(oi..oi + k, oj);
        } else {
            // `to < from`, so the destination buffer comes first.
            let (a, b) = bufs.split_at_mut(i);
            a[j][oj..oj + k].copy_from_slice(&b[0][oi..oi + k]);
        }
        from += k;
        to += k;
        n -= k;
    }
}

/// The registered buffers of a placed read.
struct Windows {
    mrs: Vec<Mr>,
    /// Offset of each buffer in the read.
    starts: Vec<usize>,
    total: usize,
}

impl Windows {
    /// Appends the entries for bytes `from..from + len` of the read.
    fn sges(&self, mut from: usize, mut len: usize, sgl: &mut Sgl) {
        for (mr, &start) in self.mrs.iter().zip(&self.starts) {
            let end = start + mr.len();
            if len == 0 {
                break;
            }
            if from >= end {
                continue;
            }
            let k = len.min(end - from);
            sgl.push(mr.sge(from - start, k as u32));
            from += k;
            len -= k;
        }
    }
}

impl XSocket {
    /// A blocking stream read of at least `zcopy_min` bytes into `bufs`
    /// (taken as one), of which the first `got` are filled, that found
    /// nothing queued: retargets posted receives at the buffers (module
    /// docs) and waits as `recv` does (`waitall`: until full). Returns the
    /// new `got` and whether a signal ended a wait
    /// ([`Self::stop_for_signal`]: the receives are pointed back first, a
    /// message being placed awaited, and the call returns what it has, or
    /// `EINTR`), or `None` if no receive could be retargeted now (a
    /// message is being placed into a slot, or completions are still to
    /// be processed): the caller then waits as for a copy.
    pub(crate) fn recv_placed<'a>(
        &'a self,
        mut st: MutexGuard<'a, State>,
        bufs: &mut [&mut [u8]],
        mut got: usize,
        waitall: bool,
        deadline: Option<Instant>,
    ) -> (MutexGuard<'a, State>, Option<(usize, bool)>) {
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        let mut starts = Vec::with_capacity(bufs.len());
        let mut at = 0;
        let mrs: Vec<Mr> = bufs
            .iter_mut()
            .filter(|b| !b.is_empty())
            .map(|b| {
                starts.push(at);
                at += b.len();
                #[allow(unsafe_code)]
                // SAFETY: `b` outlives this call, which returns only once
                // no receive is pointed at it any more (module docs) or the
                // connection is dead; the engine writes it only through this
                // registration, dropped before returning.
                unsafe {
                    self.pd
                        .register_raw(b.as_mut_ptr(), b.len(), Access::LOCAL_WRITE)
                }
            })
            .collect();
        let bufs: Vec<&mut [u8]> = bufs
            .iter_mut()
            .filter(|b| !b.is_empty())
            .map(|b| &mut **b)
            .collect();
        let mut bufs = bufs;
        let win = Windows { mrs, starts, total };
        if !self.retarget(&mut st, &win, got) {
            return (st, None);
        }
        st.placed_reader = true;
        let mut answer_by: Option<Instant> = None;
        // A read that has bytes takes what else is there without waiting
        // (one round: messages the socket holds are placed, not left to
        // land in slots once the receives are pointed back).
        let mut last_round = false;
        let mut signalled = false;
        loop {
            got = self.take_placed(&mut st, &mut bufs, got);
            let done = got == total
                || signalled
                || st.s.eof()
                || st.shut_rd
                || st.over()
                || deadline.is_some_and(|d| Instant::now() >= d);
            if done || (got > 0 && !waitall && last_round) {
                break;
            }
            if got > 0 && !waitall {
                last_round = true;
                self.drive_now(&mut st);
                continue;
            }
            if waitall {
                self.retarget(&mut st, &win, got);
            }
            let (guard, intr) = self.wait_as(st, deadline, true);
            st = guard;
            signalled = Self::stop_for_signal(intr, deadline.is_some());
        }
        // Point back what has not started; wait for what has.
        loop {
            self.untarget(&mut st);
            got = self.take_placed(&mut st, &mut bufs, got);
            if st.retargeted.is_empty() {
                break;
            }
            if st.over() {
                st.retargeted.clear();
                break;
            }
            let now = Instant::now();
            let by = *answer_by.get_or_insert(now + self.opts.sink_cancel_timeout);
            if now >= by {
                self.fail(
                    &mut st,
                    libc::ETIMEDOUT,
                    format!(
                        "the peer did not finish a message within {:?}",
                        self.opts.sink_cancel_timeout
                    ),
                );
                self.qp.disconnect();
                st.retargeted.clear();
                break;
            }
            st = self.wait_as(st, Some(by), true).0;
        }
        st.placed_reader = false;
        drop(win);
        (st, Some((got, signalled)))
    }

    /// Retargets the posted receives after those already retargeted (the
    /// front of the queue) at the rest of the read, from the position the
    /// next message is expected at. Returns whether any receive of this
    /// read is retargeted now.
    fn retarget(&self, st: &mut State, win: &Windows, got: usize) -> bool {
        let payload = self.opts.slot_size as usize - HDR_LEN;
        let size = self.opts.slot_size as usize;
        let State {
            retargeted,
            posted,
            s,
            driving,
            ..
        } = st;
        // Completions polled by a waiting thread, or queued bytes: their
        // messages precede the posted receives, at positions not known.
        if *driving || (retargeted.is_empty() && s.readable() > 0) {
            return !retargeted.is_empty();
        }
        let mut next = retargeted.last().map_or(got, |r| r.pos + payload);
        let mut expect = posted.iter();
        let mut ours = retargeted
            .iter()
            .map(|r| r.slot)
            .collect::<Vec<_>>()
            .into_iter()
            .peekable();
        let mut added = Vec::new();
        self.qp.retarget_recvs(|wr_id, sgl| {
            // Every receive before those visited was processed: the first
            // one visited must be the oldest we posted.
            if expect.next() != Some(&(wr_id as u32)) {
                return false;
            }
            if ours.peek() == Some(&(wr_id as u32)) {
                ours.next();
                return true;
            }
            let Some(sgl) = sgl else { return false };
            if ours.peek().is_some() || next + HEAD >= win.total {
                return false;
            }
            let slot = wr_id as u32;
            let base = slot as usize * size;
            let window = (win.total - next - HEAD).min(payload - HEAD);
            let mut new = Sgl::new();
            new.push(self.rx.sge(base, MAX_CONTROL_LEN as u32));
            win.sges(next + HEAD, window, &mut new);
            let spill = payload - HEAD - window;
            if spill > 0 {
                new.push(self.rx.sge(base + MAX_CONTROL_LEN + window, spill as u32));
            }
            *sgl = new;
            added.push(Retargeted {
                slot,
                pos: next,
                window,
            });
            next += payload;
            true
        });
        retargeted.append(&mut added);
        !retargeted.is_empty()
    }

    /// Points every retargeted receive that no message has started into
    /// back at its slot (and forgets it).
    fn untarget(&self, st: &mut State) {
        if st.retargeted.is_empty() {
            return;
        }
        let size = self.opts.slot_size;
        let mut back = Vec::new();
        self.qp.retarget_recvs(|wr_id, sgl| {
            let slot = wr_id as u32;
            if let (Some(sgl), true) = (sgl, st.retargeted.iter().any(|r| r.slot == slot)) {
                *sgl = self.rx.sge(slot as usize * size as usize, size).into();
                back.push(slot);
            }
            true
        });
        st.retargeted.retain(|r| !back.contains(&r.slot));
    }

    /// Delivers what arrived, in order, into the read from offset `got`:
    /// messages in retargeted receives (their first bytes copied out of
    /// the slot, the window's in place or moved back into place), and
    /// bytes queued in slots (copied). Returns the new `got`.
    fn take_placed(&self, st: &mut State, bufs: &mut [&mut [u8]], mut got: usize) -> usize {
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        let size = self.opts.slot_size as usize;
        let (mut copied, mut placed) = (0, 0);
        while got < total {
            let Some(seg) = st.s.segments().next().copied() else {
                break;
            };
            let at = seg.slot as usize * size + seg.off as usize;
            let n = match st.retargeted.iter().position(|r| r.slot == seg.slot) {
                Some(i) if seg.off as usize == HDR_LEN => {
                    let r = st.retargeted.remove(i);
                    let len = seg.len as usize;
                    let head = len.min(HEAD);
                    let window = (len - head).min(r.window);
                    #[allow(unsafe_code)]
                    // SAFETY: unread bytes of a completed receive (its slot
                    // is reposted only once they are consumed).
                    write_at(bufs, got, unsafe { self.rx.bytes(at, head) });
                    copied += head;
                    if window > 0 {
                        if r.pos == got {
                            placed += window;
                        } else {
                            move_back(bufs, r.pos + head, got + head, window);
                            copied += window;
                        }
                    }
                    head + window
                }
                _ => {
                    let k = (seg.len as usize).min(total - got);
                    #[allow(unsafe_code)]
                    // SAFETY: as above.
                    write_at(bufs, got, unsafe { self.rx.bytes(at, k) });
                    copied += k;
                    k
                }
            };
            st.s.consume(n);
            got += n;
        }
        if copied + placed > 0 {
            self.count(st, Count::RxCopied, copied);
            self.count(st, Count::RxPlaced, placed);
            self.repost(st);
            self.flush(st);
        }
        got
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn moves_back_across_buffers() {
        let mut a = [0u8; 3];
        let mut b = [0u8; 5];
        let mut c = [0u8; 4];
        let mut bufs: Vec<&mut [u8]> = vec![&mut a, &mut b, &mut c];
        write_at(&mut bufs, 5, &[1, 2, 3, 4, 5, 6, 7]);
        move_back(&mut bufs, 5, 1, 7);
        let all: Vec<u8> = bufs.iter().flat_map(|b| b.iter().copied()).collect();
        assert_eq!(&all[1..8], &[1, 2, 3, 4, 5, 6, 7]);
        assert_eq!(locate(&bufs, 8), (2, 0));
    }
}
