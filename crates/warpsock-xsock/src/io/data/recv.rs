//! The receive calls of [`XSocket`]: copied out of receive slots, or
//! placed into the caller's buffer through a sink (the send calls are in
//! `io/data.rs`).

use std::io;
use std::sync::MutexGuard;
use std::time::{Duration, Instant};

use super::super::settings::{Count, Readiness, RecvFlags};
use super::super::socket::{State, XSocket};

/// A receive timeout this long or longer has its deadline read only once
/// the straight path's wait ended without the call's bytes
/// ([`XSocket::recv_guarded`]).
const LAZY_DEADLINE: Duration = Duration::from_secs(1);

impl XSocket {
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
    /// and the result. A blocking call of one small buffer and no flag (a
    /// ping-pong's every receive) that finds nothing unread goes
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
        let mut st = self.lock();
        // A busy-polling socket's blocking reader spins first
        // (`XSocket::recv_busy`): its send sets the quiet flag.
        st.rx_blocks = !flags.nonblocking && self.opts.busy_poll.is_zero();
        // A zero timeout is a call that expires at once (the library's
        // API; the preload maps `SO_RCVTIMEO` 0 to none, as Linux): the
        // general loop's one round, no wait (review r30-b item 2).
        if !self.recv_straight_fits(&st, flags, buf.len()) || timeout.is_some_and(|t| t.is_zero()) {
            // The deadline (`SO_RCVTIMEO`) counts from the lock taken, as
            // Linux's `tcp_recvmsg` reads its timeout under the socket's
            // lock (review r30-b item 1).
            return self.recv_locked(st, buf, flags, Self::deadline(timeout));
        }
        // The straight wait's slice is the timeout itself, or less: the
        // call's deadline is needed only if that wait ends without the
        // bytes. A short timeout's is read now, from the lock; a long
        // one's (`LAZY_DEADLINE` or more, as a program's idle guard: the
        // benchmark's blocking sockets carry 30 s) only then — late by
        // that wait at most (a slice: 50 ms, ≤ 5 % of it), and the
        // call that gets its bytes in the wait, every receive of a
        // ping-pong, reads no clock (~90 instructions and a clock read a
        // receive; issue 12).
        let read_now = timeout
            .is_none_or(|t| t < LAZY_DEADLINE)
            .then(|| Self::deadline(timeout));
        match self.recv_straight(st, buf, timeout) {
            Ok((st, got)) => (st, Ok(got)),
            Err((st, intr)) => {
                let deadline = read_now.unwrap_or_else(|| Self::deadline(timeout));
                self.recv_locked_after(st, buf, flags, deadline, intr)
            }
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
    pub(super) fn sinks_for(&self, deadline: Option<Instant>) -> bool {
        self.opts.sinks && (deadline.is_none() || self.opts.sinks_timed)
    }

    /// [`Self::recv_guarded`] from its lock on: the general loop.
    #[inline(always)]
    pub(in crate::io) fn recv_locked<'a>(
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
        mut intr: super::super::wait::Woken,
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
            // A peer that broke the protocol: its end of stream, behind
            // the breach, is no clean end (helper 34's review).
            if st.peer_broke && got == 0 {
                if let Some(e) = Self::dead(&st) {
                    return (st, Err(e));
                }
            }
            // Linux's `tcp_recvmsg` order: the peer's FIN (`SOCK_DONE`),
            // then `sk_err`, then this end's own `SHUT_RD` — a reset after
            // `shutdown(SHUT_RD)` is `ECONNRESET` to the read (review 58's
            // fuzzer, seed 12: it read 0, the error left pending).
            if st.s.eof() || st.fin {
                return (st, Ok((got, false)));
            }
            if let Some(e) = Self::dead(&st) {
                let r = if got > 0 { Ok((got, false)) } else { Err(e) };
                return (st, r);
            }
            // Shut for reading: the end (0), once a round took in what
            // had arrived — Linux's read returns the bytes queued in the
            // socket before it reports the shutdown, and the peer's bytes
            // still in the engine's socket are queued ones (a read that
            // ended first, then found them, returned 0 and then data).
            if st.shut_rd && driven {
                return (st, Ok((got, false)));
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
                && st.zero_copy_idle()
                && (!sinks || Self::sink_usable(&st));
            if sink && sinks && !flags.nonblocking {
                sink = *sink_due.get_or_insert_with(|| st.s.sink_due()) && st.s.sink_room();
            }
            // A sink is offered after a round (bytes it would find make it
            // moot); receives are retargeted before one, so that what the
            // round reads is placed.
            if !driven && (flags.nonblocking || expired || st.shut_rd || (sink && sinks)) {
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
        // Another read's head, before its sink: its own copy takes it
        // (`fill_head`).
        if st.head_reserved && st.residue_off >= st.residue.len() {
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
            if more && st.msg_mode {
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
            if st.msg_mode || n == out.len() || self.placed_next(st) {
                return Some((n, false));
            }
            // Stream mode: the slots' bytes follow the residue's in the
            // same call, as in TCP's one queue (the residue holds merged
            // small messages too, `merge_unread`: a peek of them all, or
            // a read, must see on into the slots).
            let m = st.s.readable().min(out.len() - n);
            self.copy_out(st, &mut out[n..n + m], peek);
            return Some((n + m, false));
        }
        let avail = st.s.readable();
        if avail == 0 || out.is_empty() {
            return None;
        }
        if self.placed_next(st) {
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

    /// Whether the first unread bytes are another call's placed read's
    /// (`io/placed.rs`): not in their slot.
    fn placed_next(&self, st: &State) -> bool {
        st.s.segments()
            .next()
            .is_some_and(|s| st.retargeted.iter().any(|r| r.slot == s.slot))
    }

    /// Half the receive slots or more hold unread bytes (`process`): if
    /// they are small messages (together at most two slots' worth: the
    /// unread bytes a reader can see are then never less than that, 512
    /// KiB by default, above TCP's first receive window; larger messages
    /// fill as much in their slots, and are not copied twice), their
    /// bytes move to the residue, behind what it holds, and the slots are
    /// posted again, their credits returned. Without it a reader that
    /// looks before it reads (`FIONREAD`, or a `MSG_PEEK` of a whole
    /// request, until it is all there) saw at most the first 15 send
    /// calls of its peer, the rest, and a `SHUT_WR` behind them, held by
    /// the peer's credits for good, where TCP's one queue holds them all
    /// (review 58). Stream mode only (a message keeps its slot, its
    /// boundary). Bounded: the residue's unread bytes stay within the
    /// receive window (`slots * slot_size`), past which the credits stop
    /// the peer as before; a peer of small messages so holds at most
    /// twice the window here.
    #[cold]
    #[inline(never)]
    pub(in crate::io) fn merge_unread(&self, st: &mut State) {
        let size = self.opts.slot_size as usize;
        let bytes = st.s.readable();
        let window = usize::from(self.opts.slots) * size;
        if st.msg_mode
            || bytes == 0
            || bytes > 2 * size
            || st.residue.len() - st.residue_off + bytes > window
            || st.reads_reserved()
            || st.error.is_some()
            || st.peer_broke
        {
            return;
        }
        let mut residue = std::mem::take(&mut st.residue);
        // What was read of it goes first: a reader that keeps behind
        // would otherwise keep every byte it ever read here.
        residue.drain(..st.residue_off);
        st.residue_off = 0;
        let at = residue.len();
        residue.resize(at + bytes, 0);
        // Copied as a peek, then consumed: the consumption's flush may
        // reap and process more arrivals, and merge again — behind these
        // bytes, in the residue they are in by then.
        self.copy_out(st, &mut residue[at..], true);
        st.residue = residue;
        self.consumed(st, bytes);
    }

    /// Copies the first `out.len()` unread bytes out of the receive slots
    /// (and consumes them unless `peek`).
    pub(in crate::io) fn copy_out(&self, st: &mut State, out: &mut [u8], peek: bool) {
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
            super::super::slots::copy_short(&mut out[done..done + k], unsafe {
                self.rx.bytes(at, k)
            });
            done += k;
        }
        if !peek {
            self.consumed(st, out.len());
        }
    }

    /// The first `n` unread bytes were copied out of the slots: consumed,
    /// counted, their freed slots posted again and returned.
    fn consumed(&self, st: &mut State, n: usize) {
        st.s.consume(n);
        self.count(st, Count::RxCopied, n);
        self.repost(st);
        self.flush(st);
    }
}
