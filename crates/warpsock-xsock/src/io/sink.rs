//! Reads into the program's own buffer through a sink: a blocking stream
//! read large enough (`zcopy_min`) offers its buffer to the engine as the
//! target of the peer's next DATA messages, so their bytes are placed
//! there with no copy out of a receive slot (the zero-copy half of the
//! "Placement" section of the crate docs). The copied reads that decide
//! when a sink applies are in `data.rs`.

use std::io;
use std::sync::MutexGuard;
use std::time::Instant;

use warpsock_engine::{Access, Mr};

use super::settings::Count;
use super::socket::{State, XSocket};
use crate::stream::SinkState;

/// The tagged offset a sink or mapping of `len` bytes is registered at:
/// not the buffer's address (a SINK or IOMAP would tell the peer where
/// our memory is), and never a range an earlier registration of this
/// process used — each takes the next stretch of a space that starts at a
/// random page, a guard page after it — so a Write or Read that names a
/// stale STag (its slot reused, its 8-bit key drawn again) with an offset
/// of the old range fails the bounds check rather than landing in the new
/// region (helper 33's and 34's reviews, session 35).
pub(super) fn private_iova(len: usize) -> u64 {
    use std::hash::{BuildHasher, RandomState};
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::OnceLock;
    const PAGE: u64 = 4096;
    /// Where the space starts: 2^44 up to 2^46, a random page.
    static START: OnceLock<u64> = OnceLock::new();
    static USED: AtomicU64 = AtomicU64::new(0);
    let start = *START.get_or_init(|| {
        let r = RandomState::new().hash_one(std::process::id());
        (1 << 44) + (r & ((1 << 45) - 1) & !(PAGE - 1))
    });
    let span = (len as u64)
        .div_ceil(PAGE)
        .saturating_add(1)
        .saturating_mul(PAGE);
    // 2^47 bytes of registrations before the space wraps to its start.
    let at = USED.fetch_add(span, Ordering::Relaxed) % (1 << 47);
    start + at
}

impl XSocket {
    /// Whether the peer's RDMA Writes placed the `len` bytes its
    /// SINK_DONE says it wrote into the sink `mr`, in order from its start
    /// ([`warpsock_engine::Mr::remote_written`]). A peer that claims more
    /// would make the read return bytes it never sent — the buffer's old
    /// contents, which the program may well send back (an echo, a proxy):
    /// the connection fails with `EPROTO` and a Terminate instead
    /// (helper 33's review, session 35). An honest writer writes the sink
    /// in order from its start, and its SINK_DONE follows its Writes in
    /// the stream: they were placed before it was delivered.
    pub(super) fn sink_truly_filled(&self, st: &mut State, mr: &Mr, len: u32) -> bool {
        let placed = mr.remote_written();
        if placed >= u64::from(len) {
            return true;
        }
        st.peer_broke = true;
        self.fail(
            st,
            libc::EPROTO,
            format!(
                "the peer broke the protocol: its SINK_DONE says {len} bytes, its Writes placed {placed}"
            ),
        );
        self.qp.terminate(super::socket::TERMINATE_CODE);
        false
    }

    /// The start of a vectored read (blocking, stream mode) whose buffers
    /// open with small ones followed by one of at least `zcopy_min` bytes:
    /// if nothing is queued, the large buffer is offered as a sink for the
    /// bytes after the small ones' (they come as DATA and are copied).
    /// Returns how many bytes of `bufs` (from the start, in order) it
    /// filled (0 if it did not apply), and whether a signal stopped it
    /// with some filled (the call returns them: review r22-b item 5).
    pub(super) fn recv_into_later_sink(
        &self,
        bufs: &mut [&mut [u8]],
        waitall: bool,
        deadline: Option<Instant>,
    ) -> io::Result<(usize, bool)> {
        /// The small buffers' bytes at most: they are copied.
        const MAX_SKIP: usize = 4096;
        let Some(i) = bufs.iter().position(|b| b.len() >= self.opts.zcopy_min) else {
            return Ok((0, false));
        };
        let skip: usize = bufs[..i].iter().map(|b| b.len()).sum();
        if i == 0 || skip == 0 || skip > MAX_SKIP {
            return Ok((0, false));
        }
        let mut st = self.lock();
        if !Self::idle_reader(&st) || !Self::sink_usable(&st) || !st.s.sink_due() {
            return Ok((0, false));
        }
        let (head, rest) = bufs.split_at_mut(i);
        let (st, copied, placed, signalled) = self.recv_sink(st, head, rest[0], waitall, deadline);
        let err = Self::dead(&st);
        drop(st);
        match err {
            Some(e) if copied + placed == 0 => Err(e),
            None if signalled && copied + placed == 0 => {
                Err(io::Error::from_raw_os_error(libc::EINTR))
            }
            _ => Ok((copied + placed, signalled)),
        }
    }

    /// Whether a stream read finds nothing to deliver and may wait for the
    /// next bytes in its own buffers (a sink or retargeted receives).
    fn idle_reader(st: &State) -> bool {
        st.residue_off == st.residue.len()
            && st.s.readable() == 0
            && !st.s.eof()
            && !st.shut_rd
            && !st.msg_mode
            && !st.over()
            && st.zero_copy_idle()
    }

    /// Whether a sink offered now could be used: the peer takes one only at
    /// its own stream position (no byte of its in flight), so not while
    /// the rest of one of its send calls is on the way — the last DATA did
    /// not end the call ([`Stream::peer_mid_call`](crate::Stream::peer_mid_call)) —
    /// unless the peer cannot send any (it lacks credits: the offer carries
    /// them). Such a read waits for the DATA and copies it, as a read of
    /// bytes already queued does; an offer there cost a SINK and a
    /// SINK_DONE(0) — two small Sends, a `sendto` and a `recvfrom` each —
    /// for nothing (session 13: 4 of each per MiB in the 1 MiB bench, 99 %
    /// of it copied all the same). A peer between calls may be idle (a
    /// reply, a read posted ahead): that read offers, unless earlier such
    /// offers were declined ([`Stream::sink_due`](crate::Stream::sink_due):
    /// a writer that starts its next call at once).
    pub(super) fn sink_usable(st: &State) -> bool {
        !st.s.peer_mid_call() || st.s.peer_stalled()
    }

    /// The start of a blocking vectored read of at least `zcopy_min` bytes
    /// (stream mode) that finds nothing queued: placed into its buffers
    /// (`io/placed.rs`). Returns how many bytes of `bufs` (from the start,
    /// in order) it filled (0 if it did not apply), and whether a signal
    /// stopped it with some filled (as [`Self::recv_into_later_sink`]).
    pub(super) fn recv_into_placed(
        &self,
        bufs: &mut [&mut [u8]],
        waitall: bool,
        deadline: Option<Instant>,
    ) -> io::Result<(usize, bool)> {
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        if total < self.opts.zcopy_min {
            return Ok((0, false));
        }
        let st = self.lock();
        if !Self::idle_reader(&st) {
            return Ok((0, false));
        }
        let (st, r) = self.recv_placed(st, bufs, 0, waitall, deadline);
        let err = Self::dead(&st);
        drop(st);
        match (r, err) {
            (Some((n, signalled)), _) if n > 0 => Ok((n, signalled)),
            (_, Some(e)) => Err(e),
            (Some((_, true)), None) => Err(io::Error::from_raw_os_error(libc::EINTR)),
            _ => Ok((0, false)),
        }
    }

    /// Copies readable stream bytes into the unfilled part of `head` (the
    /// buffers before a sink offered ahead), `done` bytes of which are
    /// filled. Returns the new `done`.
    fn fill_head(&self, st: &mut State, head: &mut [&mut [u8]], mut done: usize) -> usize {
        let mut at = 0;
        for b in head.iter_mut() {
            let end = at + b.len();
            if done < end {
                let n = st.s.readable().min(end - done);
                if n == 0 {
                    break;
                }
                self.copy_out(st, &mut b[done - at..done - at + n], false);
                done += n;
            }
            at = end;
        }
        done
    }

    /// Offers `buf` as a sink — for the bytes after the `head` buffers'
    /// (empty: the next bytes), which are copied into them as they come —
    /// and waits until the peer filled or declined it. Returns the bytes
    /// copied into `head`, the bytes placed into `buf`, and whether a
    /// signal ended the wait ([`Self::stop_for_signal`]): the sink was
    /// then withdrawn as when the head's bytes start (cancelled, and the
    /// peer's answer awaited, bounded by `sink_cancel_timeout`: the peer
    /// may be writing into `buf`, which must not be given back before it
    /// is done), and the call returns what it has, or `EINTR`.
    pub(super) fn recv_sink<'a>(
        &'a self,
        mut st: MutexGuard<'a, State>,
        head: &mut [&mut [u8]],
        buf: &mut [u8],
        waitall: bool,
        deadline: Option<Instant>,
    ) -> (MutexGuard<'a, State>, usize, usize, bool) {
        let skip: usize = head.iter().map(|b| b.len()).sum();
        let mut copied = 0;
        let len = buf.len().min(u32::MAX as usize);
        #[allow(unsafe_code)]
        // SAFETY: `buf` outlives this call, which returns only once the
        // sink is final (the peer can no longer write into it) or the
        // connection is dead (no more placement); the engine writes it only
        // through the registration dropped before returning.
        // At a private tagged offset: the offer tells the peer no address
        // of ours (`private_iova`).
        let mr = unsafe {
            self.pd.register_raw_iova(
                buf.as_mut_ptr(),
                len,
                private_iova(len),
                Access::LOCAL_WRITE | Access::REMOTE_WRITE,
            )
        };
        let id =
            st.s.post_sink_after(skip as u32, mr.rkey(), mr.addr(), len as u32, waitall);
        st.head_reserved = skip > 0;
        self.count(&st, Count::SinkOffers, 1);
        self.flush(&mut st);
        // Once cancelled, the wait for the peer's answer is bounded too.
        let mut answer_by: Option<Instant> = None;
        let mut signalled = false;
        let placed = loop {
            copied = self.fill_head(&mut st, head, copied);
            match st.s.sink_state(id) {
                // Its bytes follow the head's, which came before its end
                // — if the peer's Writes placed them (else the connection
                // failed: nothing placed).
                SinkState::Filled { len, .. } => {
                    break if self.sink_truly_filled(&mut st, &mr, len) {
                        len as usize
                    } else {
                        0
                    };
                }
                SinkState::Declined => break 0,
                _ => {}
            }
            if st.over() {
                break 0;
            }
            let now = Instant::now();
            // Bytes for the head arrived: a read returns once some bytes
            // are there (the peer may send nothing more until answered), so
            // the sink is withdrawn — the peer's answer still reports what
            // it wrote (a sender in the middle of its call writes the rest
            // first).
            let head_started = copied > 0;
            if answer_by.is_none()
                && (head_started || signalled || deadline.is_some_and(|d| now >= d))
            {
                st.s.cancel_sink(id);
                self.flush(&mut st);
                answer_by = Some(now + self.opts.sink_cancel_timeout);
            }
            if answer_by.is_some_and(|by| now >= by) {
                // The peer may still write into the buffer: the connection
                // cannot go on. Dropping the registration below makes any
                // later Write fail its lookup (the engine then terminates
                // the stream), so nothing reaches the program's memory.
                self.fail(
                    &mut st,
                    libc::ETIMEDOUT,
                    format!(
                        "the peer did not answer a sink cancel within {:?}",
                        self.opts.sink_cancel_timeout
                    ),
                );
                self.qp.disconnect();
                break 0;
            }
            let (guard, intr) = self.wait_as(st, answer_by.or(deadline), true);
            st = guard;
            // Once withdrawn, the answer is awaited whatever signals come.
            if answer_by.is_none() {
                signalled = Self::stop_for_signal(intr, deadline.is_some());
            }
        };
        st.s.release_sink(id);
        copied = self.fill_head(&mut st, head, copied);
        st.head_reserved = false;
        // Placed bytes count only behind a full head (they follow it in
        // the stream: a head still short means the connection died first).
        let placed = if copied == skip { placed } else { 0 };
        self.count(&st, Count::RxPlaced, placed);
        drop(mr);
        (st, copied, placed, signalled)
    }
}
