//! A send call's bookkeeping around its posts: a post ([`XSocket::post`];
//! moved from `io/socket.rs` past 900 lines), the batch it hands the
//! engine at once ([`XSocket::post_deferred`]), the retransmission timeout
//! of a receive-only end, and the zero-copy calls still read by the
//! engine: their requests in flight ([`CallWrs`]) and the bound on what a
//! timed one leaves to private copies ([`XSocket::timed_room`]). (Moved
//! from `io/data.rs`, which passed 900 lines.)

use std::collections::VecDeque;

use warpsock_engine::proto::SendWr;

use super::socket::{State, XSocket, WR_KIND, WR_RIO};

impl XSocket {
    /// Posts `wr` to the engine, or into the batch a send call collects
    /// ([`Self::post_deferred`]). A post that fails fails the connection
    /// (`ENOBUFS`); a one-sided request it was completes at once
    /// (`rio::post_failed`: no completion will come for it).
    pub(crate) fn post(&self, st: &mut State, wr: SendWr) {
        st.posts += 1;
        st.unreaped = true;
        if let Some(d) = st.deferred.as_mut() {
            return d.push(wr);
        }
        let wr_id = wr.wr_id;
        match self.qp.post_send_news(wr) {
            Ok(n) => st.news = Some(n),
            Err(e) => {
                self.fail(st, libc::ENOBUFS, format!("cannot post: {e:?}"));
                if wr_id & WR_KIND == WR_RIO {
                    super::rio::post_failed(st, wr_id, libc::ENOBUFS);
                }
            }
        }
        // A send call rearms the watch as it returns, and its waits on the
        // way (`settle`): a rearm after each of its posts would only work
        // out the same watch once more (while a call sends, the backlog
        // is its own to flush: see `rearm`).
        if st.sending == 0 {
            self.rearm(st);
        }
    }

    /// Hands the posts a send call held back (`State::deferred`: a call
    /// of several messages collects them until its end or its next wait)
    /// to the engine in one batch, and posts at once again. One transmit
    /// pass then writes their FPDUs in one gathered `sendmsg`: a 1 MiB
    /// write was four, one per 256 KiB message, each ending in a short TCP
    /// segment of its own (20 segments per MiB against host TCP's 17).
    /// Never left set while the lock is let go: other threads post then.
    #[inline]
    pub(crate) fn post_deferred(&self, st: &mut State) {
        // A call of one small message collected nothing.
        if st.deferred.is_some() {
            self.post_collected(st);
        }
    }

    fn post_collected(&self, st: &mut State) {
        let Some(mut wrs) = st.deferred.take() else {
            return;
        };
        if wrs.is_empty() {
            return;
        }
        // The news read with the batch's transmit, under the engine's lock
        // it took (not in a second take after it: a round of another
        // thread's between the two could show an end it took in after the
        // batch was written — `send_call` counts a batch whose own news
        // shows the connection's end as not handed over).
        // The ids, for a one-sided request a failure leaves unposted
        // (below): collected only for a batch that holds one (a bulk
        // send's batches allocate nothing more).
        let is_rio = |id: u64| id & WR_KIND == WR_RIO;
        let ids: Vec<u64> = if wrs.iter().any(|w| is_rio(w.wr_id)) {
            wrs.iter().map(|w| w.wr_id).collect()
        } else {
            Vec::new()
        };
        let (r, news) = self.qp.post_send_batch_news(wrs.drain(..));
        match r {
            Ok(_) => st.news = Some(news),
            Err(e) => {
                self.fail(st, libc::ENOBUFS, format!("cannot post: {e:?}"));
                // Those not posted never complete: a one-sided one among
                // them completes now (`rio::post_failed`); those posted
                // before the failure complete as the connection ends.
                for &id in ids.iter().skip(e.posted).filter(|&&id| is_rio(id)) {
                    super::rio::post_failed(st, id, libc::ENOBUFS);
                }
            }
        }
        if st.sending == 0 {
            self.rearm(st);
        }
    }

    /// We send stream bytes (DATA, a sink Write, a one-sided Write): the
    /// smallest retransmission timeout a receive-only end had goes back to
    /// the kernel's ([`Options::rto_min`](super::Options::rto_min)), so
    /// our data is retransmitted as host TCP's would be; an end that sends
    /// first never has it lowered. Once.
    pub(crate) fn restore_rto(&self, st: &mut State) {
        if let Some(us) = st.rto.on_sent() {
            super::handshake::set_rto_min_us(self.tcp_fd, us);
        }
    }

    /// Completions were processed: an end that has received stream bytes
    /// (DATA or a sink Write) and sent none lowers its smallest
    /// retransmission timeout to [`Options::rto_min`](super::Options::rto_min)
    /// for its credit returns. Once.
    pub(crate) fn lower_rto(&self, st: &mut State) {
        if let Some(us) = st.rto.on_received(st.s.rx_seq()) {
            super::handshake::set_rto_min_us(self.tcp_fd, us);
        }
    }

    /// Whether zero-copy call `call` still has requests in flight (its
    /// memory is still read by the engine).
    pub(crate) fn call_busy(st: &State, call: u64) -> bool {
        st.call_wrs.get(&call).is_some_and(|w| !w.lens.is_empty())
    }

    /// Bytes of zero-copy call `call` in requests the engine has not
    /// completed.
    pub(crate) fn call_in_flight(st: &State, call: u64) -> usize {
        st.call_wrs.get(&call).map_or(0, |w| w.bytes)
    }

    /// How many more bytes a timed zero-copy call may post now: the bytes
    /// in flight of the timed calls and the copies of those that returned
    /// before their requests completed (`State::orphans`) stay within
    /// [`Self::timed_window`]. A timed call returns at its timeout with
    /// its incomplete requests moved to private copies (`send_locked`);
    /// without this bound a peer that offered a vast sink (up to 4 GiB)
    /// and stopped reading made each such call copy all it had posted
    /// into it, and the next call post as much again. Now the copies are
    /// bounded as TCP's send buffer bounds what a timed-out send leaves in
    /// the kernel, and a call that finds the window full waits, then
    /// fails with `EAGAIN` at its timeout, as TCP's with its buffer full.
    ///
    /// Counted per socket (helper 71's review): the bytes in flight of
    /// every timed call under way (another thread's too: a call that waits
    /// for room lets the lock go), and what each orphan's copy holds —
    /// freed whole only as its last request completes, not as its first
    /// ones do.
    pub(crate) fn timed_room(st: &State) -> usize {
        let copies = Self::copies_held(st);
        let live: usize = st
            .call_wrs
            .values()
            .filter(|w| w.timed)
            .map(|w| w.bytes)
            .sum();
        Self::timed_window(st).saturating_sub(copies + live)
    }

    /// Bytes the copies of timed zero-copy calls that returned before
    /// their requests completed hold (`State::orphans`).
    pub(crate) fn copies_held(st: &State) -> usize {
        st.orphans.iter().map(|o| o.2).sum()
    }

    /// The bytes timed zero-copy calls keep in flight at most
    /// ([`Self::timed_room`]): the socket's send buffer bound (`SO_SNDBUF`),
    /// at least [`TIMED_WINDOW_MIN`]. Posted in requests of a quarter of
    /// it at most, so that completions reopen it before it runs dry.
    pub(crate) fn timed_window(st: &State) -> usize {
        st.aio.cap.max(TIMED_WINDOW_MIN)
    }

    /// Forgets a finished zero-copy call.
    pub(crate) fn end_call(st: &mut State, call: u64) {
        st.call_wrs.remove(&call);
    }

    /// The last request of zero-copy call `call` completed: if the call
    /// returned before it (at its timeout, its registrations moved to
    /// private copies: `send_locked`), its registrations go now.
    #[cold]
    #[inline(never)]
    pub(crate) fn release_orphan(st: &mut State, call: u64) {
        if let Some(i) = st.orphans.iter().position(|o| o.0 == call) {
            st.orphans.swap_remove(i);
            Self::end_call(st, call);
        }
    }
}

/// The least window of timed zero-copy calls ([`XSocket::timed_window`]):
/// the peer's credits by default (16 slots of 256 KiB), so that a timed
/// call to a reading peer is not slowed by a small `SO_SNDBUF`.
pub(crate) const TIMED_WINDOW_MIN: usize = 4 << 20;

/// The send requests of a zero-copy call the engine has not completed:
/// their lengths in posting order. The engine completes a queue pair's
/// send requests in the order they were posted (RFC 5040 §5.5's ordering
/// of a queue's operations; siw's send queue completes in order too), so
/// a completion is the oldest's.
#[derive(Debug, Default)]
pub(crate) struct CallWrs {
    lens: VecDeque<usize>,
    /// The sum of `lens`.
    bytes: usize,
    /// A timed zero-copy call under way ([`XSocket::timed_room`]).
    pub(crate) timed: bool,
}

impl CallWrs {
    /// A request of `len` bytes was posted.
    pub(crate) fn posted(&mut self, len: usize) {
        self.lens.push_back(len);
        self.bytes += len;
    }

    /// The oldest request completed; returns whether none is left.
    pub(crate) fn completed(&mut self) -> bool {
        if let Some(len) = self.lens.pop_front() {
            self.bytes -= len;
        }
        self.lens.is_empty()
    }
}
