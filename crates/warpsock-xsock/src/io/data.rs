//! The data path of [`XSocket`]: send calls (copied into transmit slots,
//! or sent from the caller's buffer), here, and receive calls (copied out
//! of receive slots, or placed into the caller's buffer through a sink),
//! in `data/recv.rs`.

use std::io;
use std::sync::MutexGuard;
use std::time::{Duration, Instant};

use warpsock_engine::{Access, Mr, QpNews, SendOp, SendWr, Sgl};

use smallvec::SmallVec;

use super::gather::{non_empty, Gather, Src};
use super::settings::{Count, Readiness};
use super::socket::{State, XSocket, CALL_BITS, WR_CALL, WR_SLOT};
use crate::stream::TxStep;
use crate::wire::{Msg, HDR_LEN, MAX_CONTROL_LEN};
use listed::Listed;

impl XSocket {
    // ------------------------------------------------------------------
    // Send.

    /// Sends `buf` (TCP semantics: a blocking call sends everything, a
    /// non-blocking one what credits and the send buffer's room allow,
    /// `EAGAIN` if nothing). `timeout` bounds a blocking call
    /// (`SO_SNDTIMEO`). In stream mode a call may return with bytes still
    /// in the send buffer (as TCP's, in the socket buffer): they leave as
    /// credits come back, moved by the next call on the socket or the
    /// progress thread (see the `io::rio` module's docs).
    pub fn send(
        &self,
        buf: &[u8],
        nonblocking: bool,
        timeout: Option<Duration>,
    ) -> io::Result<usize> {
        self.send_vectored(&[buf], nonblocking, timeout)
    }

    /// [`Self::send`] of the bytes of `bufs` in order (`writev`,
    /// `sendmsg`): gathered straight from the caller's buffers — copied
    /// into transmit slots, or sent in place as a gather list — staged
    /// only in the send buffer, for what finds no credit (`io/sndbuf.rs`).
    pub fn send_vectored(
        &self,
        bufs: &[&[u8]],
        nonblocking: bool,
        timeout: Option<Duration>,
    ) -> io::Result<usize> {
        self.send_guarded(bufs, nonblocking, timeout).0
    }

    /// [`Self::send_vectored`], and the socket's readiness as the call
    /// left it, taken under the call's own lock (a caller that reflects
    /// readiness after every call — the preload's doorbell — need not
    /// lock the socket again for it).
    pub fn send_vectored_ready(
        &self,
        bufs: &[&[u8]],
        nonblocking: bool,
        timeout: Option<Duration>,
    ) -> (io::Result<usize>, Readiness) {
        // One buffer (`send`, `write`: a ping-pong's every send) tries the
        // straight path here, in this frame: `send_guarded`'s frame, its
        // scan of the list and its returned guard are ~40 instructions a
        // call. Anything else, or a call the straight path declines
        // (having done nothing), goes on with the lock as `send_guarded`.
        let (r, st) = match bufs {
            [b] if !b.is_empty() => {
                let g = Gather::new(bufs);
                let mut st = self.lock();
                if let Some(r) = self.send_straight(&mut st, &g) {
                    return (r, Self::readiness_of(&st));
                }
                // Read the clock for `SO_SNDTIMEO` only where the call may
                // wait: the straight path never does (~60 instructions a
                // timed send, issue 12).
                self.send_locked(st, &g, nonblocking, Self::deadline(timeout))
            }
            _ => self.send_guarded(bufs, nonblocking, timeout),
        };
        let st = st.unwrap_or_else(|| self.lock());
        (r, Self::readiness_of(&st))
    }

    /// When a call bounded by `timeout` (`SO_SNDTIMEO`) gives up.
    fn deadline(timeout: Option<Duration>) -> Option<Instant> {
        timeout.and_then(|t| Instant::now().checked_add(t))
    }

    /// The body of [`Self::send_vectored`]: the result and, unless the
    /// call let it go (nothing to send, or a zero-copy call: the caller's
    /// buffers are deregistered after it), the socket's lock.
    fn send_guarded(
        &self,
        bufs: &[&[u8]],
        nonblocking: bool,
        timeout: Option<Duration>,
    ) -> (io::Result<usize>, Option<MutexGuard<'_, State>>) {
        // The caller's own list when none is empty (one buffer: `send`,
        // `write`): no copy of it.
        let parts;
        let g = if bufs.iter().all(|b| !b.is_empty()) {
            Gather::new(bufs)
        } else {
            parts = non_empty(bufs);
            Gather::new(&parts)
        };
        if g.len() == 0 {
            return (Ok(0), None);
        }
        let mut st = self.lock();
        if let Some(r) = self.send_straight(&mut st, &g) {
            return (r, Some(st));
        }
        self.send_locked(st, &g, nonblocking, Self::deadline(timeout))
    }

    /// [`Self::send_guarded`] from its lock on, when the straight path
    /// declined: `g` holds at least one byte.
    #[inline(never)]
    fn send_locked<'a>(
        &'a self,
        mut st: MutexGuard<'a, State>,
        g: &Gather<'_>,
        nonblocking: bool,
        deadline: Option<Instant>,
    ) -> (io::Result<usize>, Option<MutexGuard<'a, State>>) {
        let total = g.len();
        // The connection's error before the shutdown's `EPIPE`, as Linux's
        // `tcp_sendmsg` reports `sk_err` first (`sk_stream_error`): a
        // reset after this end's `SHUT_WR` is `ECONNRESET` to the send
        // (the preload reports it once, then `EPIPE`; review 58).
        if let Some(e) = Self::dead(&st) {
            return (Err(e), Some(st));
        }
        if super::rio::write_shut(&st) {
            return (Err(io::Error::from_raw_os_error(libc::EPIPE)), Some(st));
        }
        if st.peer_closed || st.s.peer_socket_closed() {
            // The peer closed its socket (TCP's CLOSE_WAIT here): TCP
            // takes the call, and the peer's kernel answers the bytes with
            // a reset, `EPIPE` in CLOSE_WAIT (`tcp_reset`), which the next
            // send (with `SIGPIPE`), or `SO_ERROR`, reports; reads still
            // end with 0 first. The bytes are lost, as over TCP (diffuzz
            // `sendclosed`: this call failed with `EPIPE` at once).
            self.fail(
                &mut st,
                libc::EPIPE,
                format!("{total} bytes sent after the peer's close drew TCP's reset"),
            );
            return (Ok(total), Some(st));
        }
        let zcopy = !nonblocking && total >= self.opts.zcopy_min;
        let call = st.next_id();
        // Registered for the call, dropped when every request using them
        // completed (or the connection died).
        // (None for a copied call: nothing to drop on its way out.)
        let user_mrs: Option<Vec<Mr>> = zcopy.then(|| {
            g.parts
                .iter()
                .map(|b| {
                    #[allow(unsafe_code)]
                    // SAFETY: `b` outlives this call, which waits for every
                    // work request that reads it (or deregisters first:
                    // later accesses then fail their lookup), and the
                    // engine only reads it.
                    unsafe {
                        self.pd
                            .register_raw(b.as_ptr().cast_mut(), b.len(), Access::LOCAL_READ)
                    }
                })
                .collect()
        });
        st.sending += 1;
        let mrs = user_mrs.as_deref();
        let (mut st, r) = self.send_call(st, g, call, mrs, nonblocking, deadline);
        st.sending -= 1;
        self.rearm(&mut st);
        let Some(user_mrs) = user_mrs else {
            return (r, Some(st));
        };
        if Self::call_busy(&st, call) && !st.over() {
            // Its timeout passed with bytes posted that the engine has not
            // read yet (a peer that stopped reading: its window shut):
            // they go out from private copies, and the call returns now,
            // as a TCP send's at its `SO_SNDTIMEO` with its bytes in the
            // kernel (helper 68's review: it waited for the peer, with no
            // bound). The registrations live until the requests complete
            // (`XSocket::release_orphan`). Only the bytes posted are
            // copied (the call returns their count; no request names the
            // rest: helper 69's review, a 128 MiB call copied whole).
            // Of those, only the requests not completed (the last ones:
            // the engine completes in order) are still read: their bytes
            // alone are copied, within the window (`timed_room`).
            // A registration none of them names goes now (a copy, even
            // of zeros, takes its whole length of address space: helper
            // 71's review).
            let posted = r.as_ref().map_or(g.len(), |&n| n);
            let unread = posted.saturating_sub(Self::call_in_flight(&st, call))..posted;
            let mut start = 0;
            let mut copied = true;
            let mut kept = Vec::new();
            for mr in user_mrs {
                let keep = unread.start.saturating_sub(start).min(mr.len())
                    ..unread.end.saturating_sub(start).min(mr.len());
                start += mr.len();
                if !keep.is_empty() {
                    copied &= mr.keep_private_copy_of(keep, Access::LOCAL_READ);
                    kept.push(mr);
                }
            }
            let user_mrs = kept;
            if copied {
                // No longer a live timed call's: its copies count in the
                // window as what they hold (`timed_room`).
                if let Some(w) = st.call_wrs.get_mut(&call) {
                    w.timed = false;
                }
                st.orphans.push((call, user_mrs, unread.len()));
                return (r, Some(st));
            }
            // No memory for the copies: the connection fails (a reset:
            // the engine flushes every request, none reads the caller's
            // buffer once its registrations go below).
            self.fail(
                &mut st,
                libc::ENOMEM,
                "a send past its timeout could not copy what it still sends".into(),
            );
            super::sndbuf::reset(self.tcp_fd);
            self.qp.disconnect();
            Self::end_call(&mut st, call);
            drop(st);
            drop(user_mrs);
            return (Err(io::Error::from_raw_os_error(libc::ENOMEM)), None);
        }
        // Its entry goes too when the call returned early (the
        // connection's end, `EPIPE`): no request of it is read any more.
        Self::end_call(&mut st, call);
        drop(st);
        drop(user_mrs);
        (r, None)
    }

    /// A send call of one small copied message as one straight path: one
    /// look at the state ([`Stream::tx_straight`](crate::stream::Stream::tx_straight)
    /// and the tests below) decides that [`Self::send_call`] would stamp
    /// one DATA message of all `g`'s bytes, post it and do nothing else
    /// (the bytes fit one transmit slot and the peer's receive slot:
    /// `tx_straight`'s cap, our slot size being our `Hello`'s).
    /// Returns the call's result, or `None` having done nothing (the
    /// general path then runs). What the general path does and this one
    /// skips, each a no-op here:
    ///
    /// * `drive_before_send`'s round: not run for a small call on an
    ///   established connection with a transmit slot and a credit (its
    ///   `ready` test, made here);
    /// * the EPIPE and dead checks: the connection has no error, the peer's
    ///   FIN was not seen and our end is not shut;
    /// * a call id, the deadline's use, the registration list, the batch
    ///   (`deferred`): a copied call (`total < zcopy_min`) of one message
    ///   uses none of them, and `deferred` is never set between calls;
    /// * `tx_end_call`: no sink is offered, and stamping DATA offers none;
    /// * `flush`: nothing is queued and the DATA returned every unreturned
    ///   slot (`tx_straight`'s promise: `owes_msg` is false);
    /// * `post_deferred`: nothing deferred (above);
    /// * `rio::sends_ahead`: no asynchronous send has bytes unposted.
    ///
    /// `reap_posted` stays (a post from a slot, or an inline send the
    /// engine reported a backlog or events for, leaves something to reap),
    /// and the watch is rearmed once after it, as at the general path's
    /// end. An inline send that left nothing behind then leaves the socket
    /// quiet (`XSocket::set_quiet_sent`, `io/quiet.rs`): the spin after it
    /// is the engine's read alone.
    ///
    /// Always inlined (into `send_vectored_ready` and `send_guarded`), as
    /// is [`Self::send_inline`] into it: as calls, their frames and the
    /// message and `Src` passed through memory were ~55 instructions a
    /// send (issue 12).
    #[inline(always)]
    fn send_straight(&self, st: &mut State, g: &Gather<'_>) -> Option<io::Result<usize>> {
        let total = g.len();
        // Deferred posts between calls (`post_deferred` runs at every exit
        // of a send call, so only after a panic inside a batched one, its
        // lock's poison ignored): the message goes behind them, as
        // `post_data` puts it — an inline send would overtake them.
        // Asynchronous sends with bytes not yet posted (`aio_send`s
        // earlier than this call, queued as the books blocked them): the
        // message goes behind them, `send_call` pumping them first.
        if total >= self.opts.zcopy_min
            || st.deferred.is_some()
            || st.aio.sends_queued()
            || !st.established
            || st.error.is_some()
            || st.peer_closed
            || st.tx_free.is_empty()
        {
            return None;
        }
        let msg = st.s.tx_straight(total)?;
        let src = Src {
            g,
            mrs: None,
            off: 0,
            len: total,
        };
        st.sending += 1;
        // `post_data`, in this frame: nothing is deferred and the bytes
        // are copied, so it would try the inline send, then a slot.
        self.restore_rto(st);
        let inline = self.send_inline(st, msg, src);
        if !inline {
            let op = SendOp::Send {
                solicited: false,
                invalidate: None,
            };
            // No call id: a copied message's requests name their slot.
            self.post_from_slot(st, 0, op, Some(msg), src);
        }
        st.sending -= 1;
        self.reap_posted(st);
        // The write met the connection's end: the kernel socket had the
        // peer's reset, which nothing of ours had taken in yet (the
        // connection had no error above). The engine's write failed with
        // it and the connection recorded it (`poll_events`, through the
        // send's events): the call fails with it, as Linux's send on that
        // socket does (`ECONNRESET`, or `EPIPE` after the peer's end of
        // stream), not `Ok` for a message nobody reads (the preload's
        // `abortshut`: 4 runs in 90 under load).
        if let Some(e) = Self::dead(st) {
            self.rearm(st);
            return Some(Err(e));
        }
        self.count(st, Count::TxBytes, total);
        self.rearm(st);
        // The lock's take cleared the flag; an inline send that left
        // nothing behind sets it again (`io/quiet.rs`): the spin after it
        // is the engine's read alone. Not for a blocking reader of a
        // socket that does not busy-poll (`State::rx_blocks`): its next
        // receive would not spin.
        if inline && !st.rx_blocks {
            self.set_quiet_sent(st);
        }
        Some(Ok(total))
    }

    /// The body of a send call (`call`; `mrs`: the caller's buffers,
    /// registered for a zero-copy call), with the socket's lock held and
    /// given back.
    fn send_call<'a>(
        &'a self,
        mut st: MutexGuard<'a, State>,
        g: &Gather<'_>,
        call: u64,
        mrs: Option<&[Mr]>,
        nonblocking: bool,
        deadline: Option<Instant>,
    ) -> (MutexGuard<'a, State>, io::Result<usize>) {
        let total = g.len();
        let zcopy = mrs.is_some();
        let src = |off, len| Src { g, mrs, off, len };
        let mut off = 0;
        // One round at the call's start when it needs what the peer sent
        // meanwhile (credits, sink offers, and connection-phase input the
        // engine's first transmit may wait for: the crate's tests of a
        // socket that sends first hang without it); after that, rounds
        // only through `wait` when the books block the call.
        self.drive_before_send(&mut st, zcopy || total >= self.opts.zcopy_min);
        // A timed zero-copy call's bytes in flight count in the window of
        // every timed call of the socket (`timed_room`).
        if zcopy && deadline.is_some() {
            st.call_wrs.entry(call).or_default().timed = true;
        }
        // A call of more than one message hands its posts to the engine
        // together (`XSocket::post_deferred`; a copied call's DATA as a
        // gathered list, `data/listed.rs`), at its end or before it
        // waits: a gathered `sendmsg` per call, not one per message.
        let batch = zcopy || total > self.opts.slot_size as usize - HDR_LEN;
        let mut signalled = false;
        // The bytes handed over while the connection lived ([`Self::handed`]):
        // what the call returns if it meets the connection's end.
        let mut handed = 0;
        // Its DATA messages not yet handed to the engine (`data/listed.rs`):
        // handed over before anything else of the call goes.
        let mut listed = Listed::default();
        while off < total {
            if batch && st.deferred.is_none() {
                st.deferred = Some(Vec::new());
            }
            if let Some(e) = Self::dead(&st) {
                self.hand_over_listed(&mut st, &mut listed, g);
                self.post_deferred(&mut st);
                return (st, if handed > 0 { Ok(handed) } else { Err(e) });
            }
            // The peer's FIN, or our own end shut meanwhile by another
            // thread (`shutdown(SHUT_WR)` while this call waited): as
            // TCP's, the call fails with `EPIPE`, or returns what it sent.
            if st.peer_closed || super::rio::write_shut(&st) {
                self.hand_over_listed(&mut st, &mut listed, g);
                self.post_deferred(&mut st);
                let r = if off > 0 {
                    Ok(off)
                } else {
                    Err(io::Error::from_raw_os_error(libc::EPIPE))
                };
                return (st, r);
            }
            // A copy goes through one transmit slot per request (a sink
            // Write, or DATA after its header), so copied bytes go out at
            // most a slot's payload at a time; from the caller's registered
            // buffers, as much as the books allow.
            let rest = total - off;
            let chunk = if !zcopy {
                rest.min(self.opts.slot_size as usize - HDR_LEN)
            } else if deadline.is_some() {
                // A timed call keeps what its timeout may leave to copies
                // within the window (`timed_room`), in requests of a
                // quarter of it.
                let w = Self::timed_window(&st) / 4;
                rest.min(Self::timed_room(&st)).min(w)
            } else {
                rest
            };
            // Listed messages hold transmit slots until handed over: a
            // step is not blocked on slots the list holds.
            if st.tx_free.is_empty() {
                self.hand_over_listed(&mut st, &mut listed, g);
            }
            // Behind asynchronous sends made before the call: blocked
            // until their bytes are all posted (`rio::sends_ahead`).
            let step =
                if chunk == 0 || st.tx_free.is_empty() || super::rio::sends_ahead(self, &mut st) {
                    TxStep::Blocked
                } else {
                    st.s.tx_data(chunk, chunk == rest)
                };
            if !matches!(step, TxStep::Data { .. }) {
                self.hand_over_listed(&mut st, &mut listed, g);
            }
            match step {
                TxStep::Control => self.flush(&mut st),
                TxStep::Write { stag, to, len } => {
                    let op = SendOp::Write {
                        remote_addr: to,
                        rkey: stag,
                    };
                    self.post_data(&mut st, call, op, None, src(off, len));
                    st.s.tx_wrote(len);
                    off += len;
                    self.handed(&mut st, off, &mut handed);
                }
                TxStep::Data { msg, len } => {
                    // Listed: handed over later (not handed yet).
                    if listed.full() {
                        self.hand_over_listed(&mut st, &mut listed, g);
                    }
                    if listed.add(&mut st, self.opts.gather_min, msg, &src(off, len)) {
                        off += len;
                        continue;
                    }
                    self.hand_over_listed(&mut st, &mut listed, g);
                    let op = SendOp::Send {
                        solicited: false,
                        invalidate: None,
                    };
                    self.post_data(&mut st, call, op, Some(msg), src(off, len));
                    off += len;
                    self.handed(&mut st, off, &mut handed);
                }
                TxStep::Blocked => {
                    if self.repost_if_due(&mut st) {
                        continue;
                    }
                    // A copied call: what does not fit goes into the send
                    // buffer as far as it has room, and out as credits
                    // come back (`rio::post_sends`), its end kept.
                    if !zcopy {
                        let n = super::sndbuf::room_for(&st, call).min(total - off);
                        if n > 0 {
                            super::sndbuf::buffer(
                                &mut st,
                                g,
                                (off, n),
                                call,
                                off + n == total,
                                self.tcp_fd,
                            );
                            off += n;
                            self.handed(&mut st, off, &mut handed);
                            continue;
                        }
                    }
                    if nonblocking {
                        break;
                    }
                    if deadline.is_some_and(|d| Instant::now() >= d) {
                        break;
                    }
                    self.post_deferred(&mut st);
                    self.handed(&mut st, off, &mut handed);
                    let (guard, intr) = self.wait_send(st, deadline);
                    st = guard;
                    // A signal ended the wait: what was sent, or `EINTR`.
                    if Self::stop_for_signal(intr, deadline.is_some()) {
                        signalled = true;
                        break;
                    }
                }
            }
        }
        self.hand_over_listed(&mut st, &mut listed, g);
        if off == total {
            st.s.tx_end_call();
        }
        self.flush(&mut st);
        self.post_deferred(&mut st);
        // The last batch's hand-over counts as every post does: handed
        // over if its own news shows the connection alive (before, `handed`
        // kept the value from before the batch — 0 for a call of one
        // batch — so an end taken in after the batch was written would
        // fail the call for bytes already in the kernel; review r25-c
        // item 7).
        self.handed(&mut st, off, &mut handed);
        self.reap_posted(&mut st);
        // A post of this call met the connection's end (the kernel socket
        // had the peer's reset, which nothing of ours had taken in yet:
        // the loop's check saw no error): as Linux's `tcp_sendmsg`, whose
        // copy stops at `sk_err`, the call returns the bytes handed over
        // before it, or fails with the error if none were — not `Ok` for
        // bytes nobody reads (as `send_straight`). An end taken in after
        // the last post went leaves `handed` at `off`: the call returns
        // its bytes and the next call fails, as Linux's (`tcp_sendmsg`
        // returns what it copied; `sk_err` is the next call's).
        let dead = Self::dead(&st);
        if dead.is_some() {
            off = handed;
        }
        self.count(&st, Count::TxBytes, off);
        if zcopy {
            // The caller's memory is read by the engine until its requests
            // complete: a signal does not end this wait (mark dropped). The
            // call's timeout does: the caller (`send_locked`) then leaves
            // the rest to private copies.
            while Self::call_busy(&st, call) && !st.over() {
                if deadline.is_some_and(|d| Instant::now() >= d) {
                    break;
                }
                st = self.wait_send(st, deadline).0;
            }
            if !Self::call_busy(&st, call) || st.over() {
                Self::end_call(&mut st, call);
            }
        }
        if let (0, Some(e)) = (off, dead) {
            return (st, Err(e));
        }
        if off == 0 {
            // Non-blocking without a credit, SO_SNDTIMEO expired, a signal.
            let e = if signalled { libc::EINTR } else { libc::EAGAIN };
            return (st, Err(io::Error::from_raw_os_error(e)));
        }
        (st, Ok(off))
    }

    /// After a step of [`Self::send_call`] that left `off` of its bytes
    /// sent: `*handed` becomes `off` if every one of them is with the
    /// engine or in the send buffer (no post collected for a batch is
    /// still to hand over) and the connection has no error. A post that
    /// meets the connection's end leaves it where it was: its bytes, and
    /// those collected with them, did not go (Linux's `tcp_sendmsg`
    /// counts what it copied before `sk_err`).
    ///
    /// The post's own failure is taken in first: a post (`post_data` from
    /// a slot, the hand-over of a batch, `post_deferred`) keeps the news
    /// the engine read with its transmit, under the same lock, and a write
    /// that met the reset shows there as an event (`check_events` then
    /// records the error; with none, one load and a branch). Before, only
    /// an inline send took it in at once: a post from a slot, or a batch
    /// handed over before a wait, counted as handed over and the call
    /// returned `Ok` for bytes that never reached the kernel (review r25-c
    /// item 7; `tests/send_reset.rs`
    /// `a_hand_over_before_a_wait_that_meets_a_reset_fails_the_send`).
    #[inline(always)]
    fn handed(&self, st: &mut State, off: usize, handed: &mut usize) {
        self.check_events(st);
        if st.error.is_none() && st.deferred.as_ref().is_none_or(|d| d.is_empty()) {
            *handed = off;
        }
    }

    /// Sends DATA message `m` and the bytes of `src` (copied, not from
    /// registered buffers) as a Send built and written by the engine at
    /// once: no transmit slot, no send request, no completion to reap —
    /// the FPDUs, the MSN and the wire bytes are those the slot's posted
    /// Send would give. Below `Options::gather_min` bytes as one FPDU copied into
    /// the engine's segment ([`Qp::send_inline_news`](warpsock_engine::Qp::send_inline_news));
    /// from there on, in as many FPDUs as it takes, gathered from the
    /// caller's buffers ([`Self::send_gathered`]). Returns false, having
    /// done nothing, when the engine has anything queued ahead of it or
    /// the message does not fit one FPDU (inline) or 64 (gathered), or `m`
    /// is not DATA, or (gathered) the call sends several messages (those
    /// go as a list, `data/listed.rs`): the caller posts it from a slot.
    // Always inlined: see `send_straight`.
    #[inline(always)]
    pub(crate) fn send_inline(&self, st: &mut State, m: Msg, src: Src<'_>) -> bool {
        // The header in registers (`Msg::data_header`), not encoded into a
        // zeroed buffer (`Msg::encode`'s ~50 instructions a message).
        let Some(hdr) = m.data_header() else {
            return false;
        };
        if src.len >= self.opts.gather_min {
            // Not within a call of several messages (`State::deferred`
            // set): those go to the engine together — one `sendmsg` for
            // the call, not one a message (`tests/bulk.rs`
            // `a_1_mib_write_is_one_transmit_pass`), gathered as a list
            // (`data/listed.rs`) or from transmit slots.
            return st.deferred.is_none() && self.send_gathered(st, &hdr, src);
        }
        let news = match src.g.parts {
            // One buffer (`send`, `write`): the two slices as they are.
            [p] => self
                .qp
                .send_inline_news(&[&hdr, &p[src.off..src.off + src.len]]),
            _ => {
                let mut parts: SmallVec<[&[u8]; 5]> = SmallVec::new();
                parts.push(&hdr);
                src.g.slices(src.off, src.len, |b| parts.push(b));
                self.qp.send_inline_news(&parts)
            }
        };
        let Some(news) = news else {
            return false;
        };
        self.sent_at_once(st, news, 1, src.len);
        true
    }

    /// The books after `msgs` messages the engine wrote at once (`news`:
    /// the queue pair's after them; `copied`: their bytes copied on the
    /// way). As a post: its news is the newest (see `wait_as`); a blocked
    /// or failed write's pass is reaped, its error seen now, not a call
    /// late.
    #[inline(always)]
    pub(crate) fn sent_at_once(&self, st: &mut State, news: QpNews, msgs: usize, copied: usize) {
        st.posts += 1;
        st.news = Some(news);
        st.unreaped |= news.backlog > 0 || news.events;
        if news.events {
            self.check_events(st);
        }
        self.count(st, Count::TxMsgs, msgs);
        self.count(st, Count::TxCopied, copied);
        if st.sending == 0 {
            self.rearm(st);
        }
    }

    /// [`Self::send_inline`] of a message of at least
    /// `Options::gather_min` bytes: the engine frames it and writes the caller's bytes in the
    /// same gathered system call ([`Qp::send_gathered_news`](warpsock_engine::Qp::send_gathered_news)),
    /// copying only what the socket does not take at once. A non-blocking
    /// bulk sender's every message went through a transmit slot before (a
    /// copy of each byte TCP does not make: ~19 % of an `iperf3 -P 8`
    /// sender's thread, issue 12). Out of line: the 8 B path's frame is
    /// `send_inline`'s.
    #[inline(never)]
    fn send_gathered(&self, st: &mut State, hdr: &[u8], src: Src<'_>) -> bool {
        let mut parts: SmallVec<[&[u8]; 5]> = SmallVec::new();
        parts.push(hdr);
        src.g.slices(src.off, src.len, |b| parts.push(b));
        let Some(news) = self.qp.send_gathered_news(&parts) else {
            return false;
        };
        // Copied: what the socket did not take (the engine's backlog was
        // empty before), never more than the payload.
        self.sent_at_once(st, news, 1, (news.backlog as usize).min(src.len));
        true
    }

    /// Posts one DATA message (`hdr`) or sink Write of the bytes of `src`:
    /// in place from the caller's registered buffers if it has them (the
    /// header then from a transmit slot, held until the Send completes),
    /// else copied into a transmit slot. A free transmit slot must exist.
    pub(crate) fn post_data(
        &self,
        st: &mut State,
        call: u64,
        op: SendOp,
        hdr: Option<Msg>,
        src: Src<'_>,
    ) {
        self.restore_rto(st);
        // Not past posts still collected (`State::deferred`): the engine
        // would write it ahead of them.
        let behind = st.deferred.as_ref().is_some_and(|d| !d.is_empty());
        if let (Some(m), None, false) = (hdr, src.mrs, behind) {
            if self.send_inline(st, m, src) {
                return;
            }
        }
        self.post_from_slot(st, call, op, hdr, src);
    }

    /// [`Self::post_data`] from a transmit slot (not inline).
    #[inline(never)]
    fn post_from_slot(
        &self,
        st: &mut State,
        call: u64,
        op: SendOp,
        hdr: Option<Msg>,
        src: Src<'_>,
    ) {
        let slot = st.tx_free.pop().expect("a free transmit slot");
        let at = slot as usize * self.opts.slot_size as usize;
        let Some(mrs) = src.mrs else {
            match hdr {
                Some(m) => self.post_copied(st, slot, m, src),
                None => {
                    debug_assert!(src.len + HDR_LEN <= self.opts.slot_size as usize);
                    self.count(st, Count::TxCopied, src.len);
                    #[allow(unsafe_code)]
                    // SAFETY: `slot` is a free transmit slot, ours until
                    // posted below.
                    src.g
                        .copy_to(src.off, unsafe { self.tx.bytes_mut(at, src.len) });
                    self.post(
                        st,
                        SendWr {
                            wr_id: WR_SLOT | u64::from(slot),
                            op,
                            sgl: self.tx.sge(at, src.len as u32).into(),
                            signaled: true,
                        },
                    );
                }
            }
            return;
        };
        if hdr.is_some() {
            self.count(st, Count::TxMsgs, 1);
        }
        let mut sgl = Sgl::new();
        let mut wr_id = WR_CALL | call;
        match hdr {
            Some(m) => {
                #[allow(unsafe_code)]
                // SAFETY: as above: a free transmit slot, ours until posted.
                m.encode(unsafe { self.tx.bytes_mut(at, MAX_CONTROL_LEN) });
                sgl.push(self.tx.sge(at, HDR_LEN as u32));
                wr_id |= (u64::from(slot) + 1) << CALL_BITS;
            }
            None => st.tx_free.push(slot),
        }
        src.g.sges(src.off, src.len, mrs, &mut sgl);
        st.call_wrs.entry(call).or_default().posted(src.len);
        self.post(
            st,
            SendWr {
                wr_id,
                op,
                sgl,
                signaled: true,
            },
        );
    }

    /// Posts DATA message `m` of the bytes of `src` (not registered)
    /// copied into transmit slot `slot`, ours.
    pub(crate) fn post_copied(&self, st: &mut State, slot: u32, m: Msg, src: Src<'_>) {
        debug_assert!(src.len + HDR_LEN <= self.opts.slot_size as usize);
        self.count(st, Count::TxMsgs, 1);
        self.count(st, Count::TxCopied, src.len);
        self.post_msg(st, slot, m, src);
    }
}

mod listed;

mod recv;

mod scatter;

#[cfg(test)]
mod tests;
