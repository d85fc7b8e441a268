//! The transmit half of a [`Conn`]: a datagram handed over by the
//! program's send call is written at once to an idle connection or appended
//! to the send buffer (batching by construction; see [`Conn::send`]); a
//! send that finds it full waits for room as `core::stall` decides. The
//! receive half and the connection's life cycle are in the parent module.

use super::*;
use crate::udp::core::stall::{Full, StallBudget, Waiting};

/// iovecs a direct write builds on the stack: the header and up to three
/// of the program's.
const INLINE_IOVS: usize = 4;

impl Conn {
    /// Application thread: hand one datagram to this connection.
    ///
    /// Batching by construction: a datagram to an idle connection is
    /// written at once, header and payload in one call, when the program
    /// is not streaming (the previous send was at least [`STREAM_GAP`] ago,
    /// or the program received in between: request and response). A
    /// streaming program's datagrams are appended to the send buffer, which
    /// the sending call itself writes once it holds `WARPSOCK_TX_BATCH`
    /// bytes; a tail shorter than that is written by the progress thread
    /// `WARPSOCK_TX_DELAY_US` after its first datagram (the bound on the
    /// delay batching adds), or by the next send after that time.
    ///
    /// `Ok(Sent::Dropped)`: a full connection's datagram dropped as
    /// `core::stall` decides (counted here, as that drop only).
    ///
    /// # Safety
    /// `iov` must point to `n` iovecs describing readable memory.
    #[allow(clippy::too_many_arguments)]
    pub(in crate::udp) unsafe fn send(
        &self,
        eng: &Reactor,
        iov: *const iovec,
        n: usize,
        len: usize,
        nonblock: bool,
        sndtimeo: Option<Duration>,
        interactive: bool,
        stalls: &Mutex<StallBudget>,
    ) -> Result<Sent, SendErr> {
        let cfg = config::get();
        // A send after a receive (request and response) is no part of a
        // stream and starts none: it reads no clock (`last_send` is
        // cleared, so the next send, if no receive comes between, is
        // written at once too, and the one after it batches).
        let clock = (!interactive).then(Instant::now);
        let mut st = lock(&self.st);
        let streaming = clock.is_some_and(|now| {
            !cfg.tx_delay.is_zero()
                && st
                    .last_send
                    .is_some_and(|t| now.saturating_duration_since(t) < STREAM_GAP)
        });
        st.last_send = clock;
        // `SO_SNDTIMEO`'s end, from the call's start (an interactive send's
        // from its first wait: it read no clock before).
        let mut until = None;
        let mut waited = false;
        let mut waiting = None;
        let mut flushed_room = true;
        loop {
            let phase = st.setup.phase();
            if phase == Phase::Dead {
                return Err(SendErr::Retry);
            }
            if st.setup.retrying() {
                return Err(SendErr::Kernel);
            }
            if phase == Phase::Established && st.tx.is_idle() && !streaming {
                // SAFETY: per the contract.
                return unsafe { self.send_now(&mut st, eng, iov, n, len) }.map(|()| Sent::Taken);
            }
            let pending = st.tx.queued();
            if pending > 0 && pending + HDR_LEN + len > cfg.sndbuf {
                if phase == Phase::Established && flushed_room {
                    // Full: write what the kernel takes now, here (no
                    // wait for the progress thread to notice room), while
                    // it takes something.
                    if self.flush(&mut st, eng).is_err() {
                        return Err(SendErr::Died(self.die(&mut st)));
                    }
                    flushed_room = st.tx.queued() < pending;
                    if flushed_room {
                        stats::inc(&STATS.tx_full_flushes);
                        continue;
                    }
                }
                if nonblock {
                    return Err(SendErr::Errno(libc::EAGAIN));
                }
                if phase == Phase::Established {
                    // How long to wait for a peer that may have stopped
                    // reading (`core::stall`): dropped as kernel UDP drops
                    // what a full path cannot take.
                    let t = Instant::now();
                    let w = waiting.get_or_insert_with(|| Waiting::new(t));
                    match lock(stalls).full(w, t, st.progress) {
                        Full::Wait => {}
                        Full::Stalled => {
                            stats::inc(&STATS.tx_stall_drops);
                            return Ok(Sent::Dropped);
                        }
                        Full::Spent => {
                            stats::inc(&STATS.tx_stall_budget_drops);
                            return Ok(Sent::Dropped);
                        }
                    }
                }
                if !waited {
                    stats::inc(&STATS.tx_waits);
                    waited = true;
                }
                let deadline = *until.get_or_insert_with(|| {
                    sndtimeo.map(|t| clock.unwrap_or_else(Instant::now) + t)
                });
                let wait = match deadline {
                    Some(d) => {
                        let left = d.saturating_duration_since(Instant::now());
                        if left.is_zero() {
                            return Err(SendErr::Errno(libc::EAGAIN));
                        }
                        left.min(Duration::from_millis(100))
                    }
                    None => Duration::from_millis(100),
                };
                st = self
                    .cv
                    .wait_timeout(st, wait)
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
                continue;
            }
            let now = clock.unwrap_or_else(Instant::now);
            if st.tx.is_idle() {
                st.progress = now;
            }
            // SAFETY: per the contract.
            st.tx.push(len, &unsafe { iov::parts(iov, n) });
            stats::inc(&STATS.tx_coalesced);
            let mut arm = None;
            if phase == Phase::Established && !self.write_pending() {
                // (While the kernel's buffer is full the progress thread
                // writes when it has room; a write per send would only
                // fail.)
                if st.tx.queued() >= cfg.tx_batch || st.flush_at.is_some_and(|t| now >= t) {
                    // A batch: written by this call (no thread hand-off).
                    st.flush_at = None;
                    stats::inc(&STATS.tx_batches);
                    if self.flush(&mut st, eng).is_err() {
                        return Err(SendErr::Died(self.die(&mut st)));
                    }
                } else if st.flush_at.is_none() {
                    let t = now + cfg.tx_delay;
                    st.flush_at = Some(t);
                    arm = Some(t);
                }
            }
            self.note_queued(&st);
            drop(st);
            if let Some(t) = arm {
                eng.wake_by(t);
            }
            return Ok(Sent::Taken);
        }
    }

    /// Writes one datagram to an idle connection now, header and payload
    /// in one call (caller holds `st`); what the kernel does not take
    /// stays buffered for the progress thread.
    ///
    /// # Safety
    /// `iov` must point to `n` iovecs describing readable memory.
    unsafe fn send_now(
        &self,
        st: &mut ConnSt,
        eng: &Reactor,
        iov: *const iovec,
        n: usize,
        len: usize,
    ) -> Result<(), SendErr> {
        let hdr = frame::header(len);
        let head = iovec {
            iov_base: hdr.as_ptr() as *mut _,
            iov_len: HDR_LEN,
        };
        // SAFETY: per the contract.
        let user = unsafe { iov::iovecs(iov, n) };
        // The header and the program's iovecs: on the stack for a few (no
        // allocation, nor a growable vector's bookkeeping, per datagram).
        let mut inline = [head; INLINE_IOVS];
        let mut heap = Vec::new();
        let v: &mut [iovec] = if user.len() < INLINE_IOVS {
            inline[1..=user.len()].copy_from_slice(user);
            &mut inline[..=user.len()]
        } else {
            heap.reserve_exact(user.len() + 1);
            heap.push(head);
            heap.extend_from_slice(user);
            &mut heap
        };
        // SAFETY: msghdr is plain data; zero is a valid empty value.
        let mut m: msghdr = unsafe { zeroed() };
        m.msg_iov = v.as_mut_ptr();
        m.msg_iovlen = v.len();
        // SAFETY: the iovecs describe readable memory (contract, and `hdr`).
        let w = unsafe { sys::sendmsg_nowait(st.fd, &m, libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL) };
        if w == (HDR_LEN + len) as isize {
            stats::inc(&STATS.tx_direct);
            return Ok(());
        }
        if w < 0 && !matches!(errno(), libc::EAGAIN | libc::EINTR) {
            return Err(SendErr::Died(self.die(st)));
        }
        // SAFETY: per the contract.
        st.tx
            .rest_of(len, &unsafe { iov::parts(iov, n) }, w.max(0) as usize);
        st.progress = Instant::now();
        self.note_queued(st);
        stats::inc(&STATS.tx_coalesced);
        self.set_interest(eng, None, Some(true));
        Ok(())
    }
}
