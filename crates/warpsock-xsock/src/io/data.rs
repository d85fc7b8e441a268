//! The data path of [`XSocket`]: send calls (copied into transmit slots,
//! or sent from the caller's buffer) and receive calls (copied out of
//! receive slots, or placed into the caller's buffer through a sink).

use std::io;
use std::sync::MutexGuard;
use std::time::{Duration, Instant};

use warpsock_engine::{Access, Mr, SendOp, SendWr, Sgl};

use super::gather::{non_empty, Gather, Src};
use super::settings::{Count, Readiness, RecvFlags};
use super::socket::{State, XSocket, CALL_BITS, WR_CALL, WR_SLOT};
use crate::stream::TxStep;
use crate::wire::{Msg, HDR_LEN, MAX_CONTROL_LEN};

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
                let deadline = Self::deadline(timeout);
                let mut st = self.lock();
                if let Some(r) = self.send_straight(&mut st, &g) {
                    return (r, Self::readiness_of(&st));
                }
                self.send_locked(st, &g, nonblocking, deadline)
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
        let deadline = Self::deadline(timeout);
        let mut st = self.lock();
        if let Some(r) = self.send_straight(&mut st, &g) {
            return (r, Some(st));
        }
        self.send_locked(st, &g, nonblocking, deadline)
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
        if super::rio::write_shut(&st) || (st.peer_closed && st.error.is_none()) {
            return (Err(io::Error::from_raw_os_error(libc::EPIPE)), Some(st));
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
        // is the engine's read alone. Not for a blocking reader
        // (`State::rx_blocks`): its next receive would not spin.
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
        // A call of more than one message hands its posts to the engine
        // together (`XSocket::post_deferred`), at its end or before it
        // waits: one gathered `sendmsg` per call, not one per message.
        let batch = zcopy || total > self.opts.slot_size as usize - HDR_LEN;
        let mut signalled = false;
        // The bytes handed over while the connection lived ([`Self::handed`]):
        // what the call returns if it meets the connection's end.
        let mut handed = 0;
        while off < total {
            if batch && st.deferred.is_none() {
                st.deferred = Some(Vec::new());
            }
            if let Some(e) = Self::dead(&st) {
                self.post_deferred(&mut st);
                return (st, if handed > 0 { Ok(handed) } else { Err(e) });
            }
            // The peer's FIN, or our own end shut meanwhile by another
            // thread (`shutdown(SHUT_WR)` while this call waited): as
            // TCP's, the call fails with `EPIPE`, or returns what it sent.
            if st.peer_closed || super::rio::write_shut(&st) {
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
            let chunk = if zcopy {
                rest
            } else {
                rest.min(self.opts.slot_size as usize - HDR_LEN)
            };
            // Behind asynchronous sends made before the call: blocked
            // until their bytes are all posted (`rio::sends_ahead`).
            let step = if st.tx_free.is_empty() || super::rio::sends_ahead(self, &mut st) {
                TxStep::Blocked
            } else {
                st.s.tx_data(chunk, chunk == rest)
            };
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
                    Self::handed(&st, off, &mut handed);
                }
                TxStep::Data { msg, len } => {
                    let op = SendOp::Send {
                        solicited: false,
                        invalidate: None,
                    };
                    self.post_data(&mut st, call, op, Some(msg), src(off, len));
                    off += len;
                    Self::handed(&st, off, &mut handed);
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
                            Self::handed(&st, off, &mut handed);
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
                    Self::handed(&st, off, &mut handed);
                    let (guard, intr) = self.wait_intr(st, deadline);
                    st = guard;
                    // A signal ended the wait: what was sent, or `EINTR`.
                    if Self::stop_for_signal(intr, deadline.is_some()) {
                        signalled = true;
                        break;
                    }
                }
            }
        }
        if off == total {
            st.s.tx_end_call();
        }
        self.flush(&mut st);
        self.post_deferred(&mut st);
        self.reap_posted(&mut st);
        // A post of this call met the connection's end (the kernel socket
        // had the peer's reset, which nothing of ours had taken in yet:
        // the loop's check saw no error): as Linux's `tcp_sendmsg`, whose
        // copy stops at `sk_err`, the call returns the bytes handed over
        // before it, or fails with the error if none were — not `Ok` for
        // bytes nobody reads (as `send_straight`).
        let dead = Self::dead(&st);
        if dead.is_some() {
            off = handed;
        }
        self.count(&st, Count::TxBytes, off);
        if zcopy {
            // The caller's memory is read by the engine until its requests
            // complete: a signal does not end this wait (mark dropped).
            while Self::call_busy(&st, call) && !st.over() {
                st = self.wait(st, None);
            }
            Self::end_call(&mut st, call);
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
    #[inline(always)]
    fn handed(st: &State, off: usize, handed: &mut usize) {
        if st.error.is_none() && st.deferred.as_ref().is_none_or(|d| d.is_empty()) {
            *handed = off;
        }
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
        if hdr.is_some() {
            self.count(st, Count::TxMsgs, 1);
        }
        let Some(mrs) = src.mrs else {
            debug_assert!(src.len + HDR_LEN <= self.opts.slot_size as usize);
            self.count(st, Count::TxCopied, src.len);
            match hdr {
                Some(m) => self.post_msg(st, slot, m, src),
                None => {
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
        *st.call_wrs.entry(call).or_insert(0) += 1;
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

    // ------------------------------------------------------------------
    // Receive.

    /// Receives into `buf`. Returns the length and, in message mode,
    /// whether it ends a message (`MSG_EOR`). `Ok((0, _))` is the end of
    /// the stream. `timeout` bounds a blocking call (`SO_RCVTIMEO`).
    pub fn recv(
        &self,
        buf: &mut [u8],
        flags: RecvFlags,
        timeout: Option<Duration>,
    ) -> io::Result<(usize, bool)> {
        self.recv_guarded(buf, flags, timeout).1
    }

    /// The body of [`Self::recv`]: the socket's lock as the call left it,
    /// and the result. A blocking call of one small buffer, no flag and no
    /// timeout (a ping-pong's every receive) that finds nothing unread goes
    /// the straight path ([`Self::recv_straight`]); the general loop
    /// ([`Self::recv_locked`]) takes everything else, and what the straight
    /// path declines. Always inlined (into `recv` and
    /// `recv_vectored_ready`): as a call, its frame and the result moved
    /// through memory were ~40 instructions a receive (issue 12).
    #[inline(always)]
    fn recv_guarded(
        &self,
        buf: &mut [u8],
        flags: RecvFlags,
        timeout: Option<Duration>,
    ) -> (MutexGuard<'_, State>, io::Result<(usize, bool)>) {
        let deadline = Self::deadline(timeout);
        let mut st = self.lock();
        st.rx_blocks = !flags.nonblocking;
        if !self.recv_straight_fits(&st, flags, timeout, buf.len()) {
            return self.recv_locked(st, buf, flags, deadline);
        }
        match self.recv_straight(st, buf) {
            Ok((st, got)) => (st, Ok(got)),
            Err((st, intr)) => self.recv_locked_after(st, buf, flags, deadline, intr),
        }
    }

    /// Whether a large blocking read with `deadline` may offer its buffer
    /// as a sink ([`Options::sinks`]), or has its posted receives
    /// retargeted instead (`io/placed.rs`). Not a timed read
    /// (`SO_RCVTIMEO`): a sink offered and then withdrawn at the timeout
    /// waits for the peer's answer (the peer may be writing into the
    /// buffer), and a peer whose program makes no call answers nothing —
    /// an idle connection's timed 1 MiB read failed the socket with
    /// ETIMEDOUT after the timeout plus `sink_cancel_timeout` (11 s for a
    /// 1 s `SO_RCVTIMEO`; session 21), where TCP's returns `EAGAIN` at the
    /// timeout and the connection lives. Retargeting is undone locally;
    /// it waits only for a message already being placed. (Unless
    /// [`Options::sinks_timed`].)
    ///
    /// [`Options::sinks`]: super::Options::sinks
    /// [`Options::sinks_timed`]: super::Options::sinks_timed
    fn sinks_for(&self, deadline: Option<Instant>) -> bool {
        self.opts.sinks && (deadline.is_none() || self.opts.sinks_timed)
    }

    /// [`Self::recv_guarded`] from its lock on: the general loop.
    #[inline(always)]
    pub(super) fn recv_locked<'a>(
        &'a self,
        st: MutexGuard<'a, State>,
        buf: &mut [u8],
        flags: RecvFlags,
        deadline: Option<Instant>,
    ) -> (MutexGuard<'a, State>, io::Result<(usize, bool)>) {
        self.recv_locked_after(st, buf, flags, deadline, Default::default())
    }

    /// [`Self::recv_locked`] after a wait of the call whose sleep a signal
    /// ended if `intr` (the straight path's).
    #[inline(never)]
    fn recv_locked_after<'a>(
        &'a self,
        mut st: MutexGuard<'a, State>,
        buf: &mut [u8],
        flags: RecvFlags,
        deadline: Option<Instant>,
        mut intr: super::wait::Woken,
    ) -> (MutexGuard<'a, State>, io::Result<(usize, bool)>) {
        if buf.is_empty() {
            return (st, Ok((0, false)));
        }
        let sinks = self.sinks_for(deadline);
        let mut got = 0;
        // A signal ended a sleep of a sink or placed read with no restart.
        let mut stop = false;
        // Whether the engine was driven since the books were last looked
        // at. A call that finds its bytes processed already (by the
        // progress thread, or a previous call) returns without a round; a
        // blocking one that finds nothing goes straight to `wait`, which
        // reads the socket anyway. Only a call about to return empty, or
        // to offer a sink, makes a round first. (Each round costs a read
        // of the TCP socket, mostly `EAGAIN`: three of them per ping-pong
        // receive before.)
        let mut driven = false;
        // Whether this call may offer a sink ([`Stream::sink_due`], asked
        // once per call, when it first could).
        let mut sink_due: Option<bool> = None;
        // Whether the books may hold bytes for the call: not after a round
        // that ended short, empty (`XSocket::settled`: it changed nothing
        // that `read_now` looks at).
        let mut look = true;
        loop {
            let found = if std::mem::replace(&mut look, true) {
                self.read_now(&mut st, &mut buf[got..], flags.peek, got > 0)
            } else {
                None
            };
            if let Some((n, eor)) = found {
                got += n;
                if st.msg_mode || flags.peek || !flags.waitall || got == buf.len() {
                    return (st, Ok((got, eor)));
                }
                continue;
            }
            if st.s.eof() || st.shut_rd {
                return (st, Ok((got, false)));
            }
            if let Some(e) = Self::dead(&st) {
                let r = if got > 0 { Ok((got, false)) } else { Err(e) };
                return (st, r);
            }
            if st.peer_closed {
                // FIN without our end-of-stream message: the peer's
                // process ended; what arrived is all there is.
                return (st, Ok((got, false)));
            }
            let expired = deadline.is_some_and(|d| Instant::now() >= d);
            let rest = buf.len() - got;
            let mut sink = !flags.peek
                && !st.msg_mode
                && rest >= self.opts.zcopy_min
                && st.s.readable() == 0
                && (!sinks || Self::sink_usable(&st));
            if sink && sinks && !flags.nonblocking {
                sink = *sink_due.get_or_insert_with(|| st.s.sink_due()) && st.s.sink_room();
            }
            // A sink is offered after a round (bytes it would find make it
            // moot); receives are retargeted before one, so that what the
            // round reads is placed.
            if !driven && (flags.nonblocking || expired || (sink && sinks)) {
                driven = true;
                // A DATA message the round takes in and that fits is
                // copied straight into the buffer (`drive_take`).
                let out = (!flags.peek).then_some(&mut buf[got..]);
                match self.drive_take(&mut st, out) {
                    (_, Some((n, eor))) => {
                        got += n;
                        if st.msg_mode || !flags.waitall || got == buf.len() {
                            return (st, Ok((got, eor)));
                        }
                    }
                    (false, None) => look = st.idle_spins == 0,
                    (true, None) => {}
                }
                continue;
            }
            if flags.nonblocking {
                let r = if got > 0 {
                    Ok((got, false))
                } else {
                    // The call made its round and changes nothing more:
                    // the next may answer without the lock
                    // (`io/quiet.rs`).
                    self.set_quiet(&st);
                    Err(io::Error::from_raw_os_error(libc::EAGAIN))
                };
                return (st, r);
            }
            if expired {
                let r = if got > 0 {
                    Ok((got, false))
                } else {
                    Err(io::Error::from_raw_os_error(libc::EAGAIN))
                };
                return (st, r);
            }
            // Or of the last wait of this call (the straight path's, or
            // the loop's), checked before it would wait again (not on a
            // non-blocking call's path): `EINTR`.
            if stop || Self::stop_for_signal(std::mem::take(&mut intr), deadline.is_some()) {
                return (st, Self::interrupted(got));
            }
            if sink && !sinks {
                let (guard, r) =
                    self.recv_placed(st, &mut [&mut buf[got..]], 0, flags.waitall, deadline);
                st = guard;
                match r {
                    Some((n, signalled)) => {
                        got += n;
                        if n > 0 && (!flags.waitall || got == buf.len()) {
                            return (st, Ok((got, false)));
                        }
                        stop |= signalled;
                    }
                    None => (st, intr) = self.wait_as(st, deadline, true),
                }
                continue;
            }
            if sink {
                let (guard, _, n, signalled) =
                    self.recv_sink(st, &mut [], &mut buf[got..], flags.waitall, deadline);
                st = guard;
                got += n;
                if n > 0 && (!flags.waitall || got == buf.len()) {
                    return (st, Ok((got, false)));
                }
                stop |= signalled;
                continue;
            }
            if flags.peek {
                (st, intr) = self.wait_as(st, deadline, true);
                continue;
            }
            // A DATA message that lands in the wait and fits is copied
            // straight into the buffer (`wait_take`).
            let (guard, taken, woke) = self.wait_take(st, deadline, &mut buf[got..]);
            (st, intr) = (guard, woke);
            if let Some((n, eor)) = taken {
                got += n;
                if st.msg_mode || !flags.waitall || got == buf.len() {
                    return (st, Ok((got, eor)));
                }
            }
        }
    }

    /// [`Self::recv`] into the buffers of `bufs` in order (`readv`,
    /// `recvmsg`): stream bytes are copied (or placed) straight into each
    /// buffer; only a peek or message mode, whose one read must see one
    /// contiguous span, goes through a staging buffer.
    pub fn recv_vectored(
        &self,
        bufs: &mut [&mut [u8]],
        flags: RecvFlags,
        timeout: Option<Duration>,
    ) -> io::Result<(usize, bool)> {
        self.recv_vectored_ready(bufs, flags, timeout).0
    }

    /// [`Self::recv_vectored`], and the socket's readiness as the call
    /// left it: for one buffer (the usual `recv`, `read`, `recvmsg`) taken
    /// under the call's own lock, so a caller that reflects readiness after
    /// every call need not lock the socket again for it.
    pub fn recv_vectored_ready(
        &self,
        bufs: &mut [&mut [u8]],
        flags: RecvFlags,
        timeout: Option<Duration>,
    ) -> (io::Result<(usize, bool)>, Readiness) {
        if let [one] = bufs {
            let (st, r) = self.recv_guarded(one, flags, timeout);
            return (r, Self::readiness_of(&st));
        }
        let r = self.recv_scattered(bufs, flags, timeout);
        (r, Self::readiness_of(&self.lock_look()))
    }

    /// Delivers what is readable now into `out`: the pre-switch residue
    /// first (unless `more`: bytes were already delivered in this call and
    /// the residue must start a call of its own), then stream bytes
    /// (message mode: never past a message's end). Returns the length and
    /// whether it ends a message, or `None` if nothing is readable.
    ///
    /// Inlined: nothing unread (a blocking receive's first look, before it
    /// waits) is two loads here, not a call (issue 12); the two terms are
    /// the first two returns of [`Self::read_readable`].
    #[inline]
    pub(crate) fn read_now(
        &self,
        st: &mut State,
        out: &mut [u8],
        peek: bool,
        more: bool,
    ) -> Option<(usize, bool)> {
        if st.residue_off >= st.residue.len() && st.s.readable() == 0 {
            return None;
        }
        self.read_readable(st, out, peek, more)
    }

    /// [`Self::read_now`] past its look.
    #[inline(never)]
    fn read_readable(
        &self,
        st: &mut State,
        out: &mut [u8],
        peek: bool,
        more: bool,
    ) -> Option<(usize, bool)> {
        if st.residue_off < st.residue.len() {
            if more {
                return None;
            }
            let r = &st.residue[st.residue_off..];
            let n = r.len().min(out.len());
            out[..n].copy_from_slice(&r[..n]);
            if !peek {
                st.residue_off += n;
                if st.residue_off == st.residue.len() {
                    st.residue = Vec::new();
                    st.residue_off = 0;
                }
            }
            return Some((n, false));
        }
        let avail = st.s.readable();
        if avail == 0 || out.is_empty() {
            return None;
        }
        if st
            .s
            .segments()
            .next()
            .is_some_and(|s| st.retargeted.iter().any(|r| r.slot == s.slot))
        {
            // Bytes of another call's placed read (`io/placed.rs`): not in
            // the slot, and that call delivers them.
            return None;
        }
        let (n, eor) = if st.msg_mode {
            match st.s.message_end() {
                Some(end) if end <= out.len() => (end, true),
                Some(_) => (out.len(), false),
                // A part: the peer needs a return, or a peek saw it
                // (`msg_part_readable`), or the buffer is full. Only what
                // the peer being short or the latch released is latched
                // for the next read (`peeked_part`; a peek the latch let in
                // returns more: review r20-xdead2b #2): a peek that its
                // buffer filled leaves the message to be read whole (#1).
                None if st.s.msg_part_readable() || avail >= out.len() || st.s.eof() => {
                    let n = avail.min(out.len());
                    if peek && st.s.msg_part_readable() {
                        st.s.peeked_part(n);
                    }
                    (n, false)
                }
                None => return None,
            }
        } else {
            (avail.min(out.len()), false)
        };
        self.copy_out(st, &mut out[..n], peek);
        Some((n, eor))
    }

    /// Copies the first `out.len()` unread bytes out of the receive slots
    /// (and consumes them unless `peek`).
    pub(super) fn copy_out(&self, st: &mut State, out: &mut [u8], peek: bool) {
        let mut done = 0;
        for seg in st.s.segments() {
            if done == out.len() {
                break;
            }
            let k = (out.len() - done).min(seg.len as usize);
            let at = seg.slot as usize * self.opts.slot_size as usize + seg.off as usize;
            #[allow(unsafe_code)]
            // SAFETY: unread bytes of a completed receive; its slot is
            // reposted only once they are consumed.
            super::slots::copy_short(&mut out[done..done + k], unsafe { self.rx.bytes(at, k) });
            done += k;
        }
        if !peek {
            st.s.consume(out.len());
            self.count(st, Count::RxCopied, out.len());
            self.repost(st);
            self.flush(st);
        }
    }
}

mod scatter;

#[cfg(test)]
mod tests;
