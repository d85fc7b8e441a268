//! A blocking wait's first park, in the caller's hands (issue 12): the
//! predicted receive of a blocking reader.
//!
//! [`Cq::wait_news`] parks a blocking wait in a read of its queue pair's
//! socket, and services what the read brings under the context's lock
//! before it returns: the core frames the FPDU, completes the receive,
//! the caller drains the completion, copies the payload out of the
//! receive's buffer and posts the buffer again — the general path,
//! ~1,900 instructions of a blocking 8 B ping-pong's receive after its
//! read (callgrind, BENCHMARKS §6 session 30). A busy-polling reader's
//! answer skips all that ([`crate::QuietRead::predict`]): one whole FPDU,
//! a one-FPDU Send into the head receive, is taken where the read put it.
//! The caller's take runs under its own lock (`warpsock_xsock`'s socket
//! lock), which comes before the context's; a wait holds neither while it
//! sleeps, and takes the context's alone when it wakes.
//!
//! So the first park is split here: [`Cq::park_first`] parks as
//! [`Cq::wait_news`]'s first round would (the same terms: caller-driven,
//! no busy polling, not an idle queue's wait, no region borrowed, this
//! queue empty), and returns with no lock held; [`Park::sleep`] is the
//! parked read; then either [`Unparked::take`], with the caller's own lock
//! taken again first — the context's lock, the bytes staged, and the
//! prediction tried where the quiet spin's applies (`qp` alone in its
//! context, nothing else due: `QpSlot::rx_alone`, asked again because
//! other threads may post while the read sleeps), else the usual service
//! and drain (and where that completed nothing — part of an FPDU, a
//! placed Write — [`Resume::into_wait`] with the caller's lock let go:
//! the wait's rounds, as [`Cq::wait_news`]'s go on after such a park) —
//! or [`Unparked::into_wait`] with no lock of the caller's (a read that
//! brought no bytes: the wait goes on exactly as [`Cq::wait_news`]'s
//! would, its rounds and the signal's report).

use std::io;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{interrupted, Cq, Start, Woke, PARK_SLICE};
use crate::context::Progress;
use crate::driver::ParkedRead;
use crate::error::Result;
use crate::qp::{Qp, QpNews};
use crate::wc::Wc;

/// What [`Cq::park_first`] did.
#[derive(Debug)]
pub enum First<'a> {
    /// Parked: sleep in [`Park::sleep`], with none of the caller's locks
    /// held.
    Parked(Park<'a>),
    /// Completions were queued: this many drained into `out`, and the
    /// queue pair's news (as [`Cq::wait_news`] returns them).
    Drained(usize, QpNews),
    /// No park here (or not at once: [`Cq::wait_news`] may still park,
    /// e.g. a context with a dropped queue pair lingering): wait with
    /// [`Cq::wait_news`].
    Usual,
}

/// A first park, not slept yet ([`Cq::park_first`]). Dropped without
/// [`Self::sleep`], it hands the read back unmade (the queue pair's
/// rounds read its socket again).
#[derive(Debug)]
#[must_use]
pub struct Park<'a> {
    cq: &'a Cq,
    qp: &'a Qp,
    timeout: Duration,
    read: Option<ParkedRead>,
}

/// A first park that slept ([`Park::sleep`]): its read's result, not yet
/// handed back to the queue pair. Go on with [`Self::take`] or
/// [`Self::into_wait`]; dropped, the result is handed back and serviced
/// (the completions stay queued for the next wait).
#[derive(Debug)]
#[must_use]
pub struct Unparked<'a> {
    cq: &'a Cq,
    qp: &'a Qp,
    timeout: Duration,
    read: Option<(ParkedRead, io::Result<usize>)>,
}

/// The rest of a first park's wait, whose read brought bytes that
/// completed nothing ([`Parked::Nothing`]).
#[derive(Debug)]
#[must_use]
pub struct Resume<'a> {
    cq: &'a Cq,
    qp: &'a Qp,
    timeout: Duration,
}

/// What [`Unparked::take`] did with a read that brought bytes.
#[derive(Debug)]
pub enum Parked<'a, R> {
    /// The prediction's take took the FPDU: its answer and the queue
    /// pair's news.
    Taken(R, QpNews),
    /// Serviced as usual: this many completions (at least one) drained
    /// into `out`, and the news.
    Completed(usize, QpNews),
    /// Serviced as usual, and nothing completed (part of an FPDU, a
    /// placed Write): the wait goes on ([`Resume::into_wait`], with the
    /// caller's lock let go).
    Nothing(Resume<'a>),
}

impl Cq {
    /// [`Self::wait_news`]'s first round for a wait of up to `timeout`,
    /// split so that its caller sleeps and takes its own lock again before
    /// the read is serviced (see the module's docs): [`First::Drained`]
    /// when completions are queued, [`First::Parked`] when the round parks
    /// in a read of `qp`'s socket (`qp` alone in this context), and
    /// [`First::Usual`] otherwise (progress-thread mode, busy polling, a
    /// timeout under one park slice, an interruptible wait that sleeps in
    /// `poll` from its first park after an idle one, a region borrowed,
    /// another queue pair in the context, or the queue pair's own terms:
    /// `QpSlot::park`). The lock is released on return.
    pub fn park_first<'a>(&'a self, out: &mut [Wc], timeout: Duration, qp: &'a Qp) -> First<'a> {
        let inner = &self.sh.inner;
        if inner.progress != Progress::Caller
            || !crate::spun::busy_poll(inner.busy_poll).is_zero()
            || timeout < PARK_SLICE
            || self.idle.load(Ordering::Relaxed)
            || !Arc::ptr_eq(&self.sh, &qp.sh)
        {
            return First::Usual;
        }
        let mut st = inner.lock();
        if st.readers + st.writers != 0 {
            return First::Usual;
        }
        let n = st.cq(self.id).drain_into(out);
        if n > 0 || out.is_empty() {
            return First::Drained(n, st.news(qp.qi));
        }
        // `qp` the context's only slot, so the park (of the one live queue
        // pair) is `qp`'s (nothing borrowed: looked at above).
        if !st.one_qp_unborrowed() {
            return First::Usual;
        }
        match st.park(PARK_SLICE) {
            Some(read) => {
                debug_assert_eq!(read.qi, qp.qi);
                First::Parked(Park {
                    cq: self,
                    qp,
                    timeout,
                    read: Some(read),
                })
            }
            None => First::Usual,
        }
    }
}

impl<'a> Park<'a> {
    /// The parked read: sleeps until bytes, EOF, an error, a signal or the
    /// park's slice (`Cq::sleep_parked`'s blocking read; the caller marks
    /// the sleep for an exit in a signal handler, as it marks its wait).
    pub fn sleep(mut self) -> Unparked<'a> {
        let mut read = self.read.take().expect("a park not slept has its read");
        let res = read.read();
        Unparked {
            cq: self.cq,
            qp: self.qp,
            timeout: self.timeout,
            read: Some((read, res)),
        }
    }
}

impl Drop for Park<'_> {
    /// A park never slept: its read handed back unmade. (Inlined as the
    /// look: every park's drop after its sleep took the read, ~17
    /// instructions a receive as a call.)
    #[inline(always)]
    fn drop(&mut self) {
        if let Some(read) = self.read.take() {
            give_back(self.cq, read, Err(io::ErrorKind::WouldBlock.into()));
        }
    }
}

/// A parked read `read` and its result `res` handed back to its queue
/// pair and serviced, its completions left queued (a [`Park`] or an
/// [`Unparked`] dropped with it).
#[cold]
#[inline(never)]
fn give_back(cq: &Cq, read: ParkedRead, res: io::Result<usize>) {
    let inner = &cq.sh.inner;
    inner.lock().unpark(read, res, &inner.epoll);
}

impl<'a> Unparked<'a> {
    /// Whether the read brought bytes: then [`Self::take`] (under the
    /// caller's lock), else [`Self::into_wait`] (with none).
    pub fn brought_bytes(&self) -> bool {
        matches!(self.read, Some((_, Ok(n))) if n > 0)
    }

    /// The read's bytes taken in under the context's lock, which the
    /// caller takes after its own (its lock comes first): when they are
    /// exactly one whole FPDU that [`crate::QuietRead::predict`] would
    /// take — and the terms that spin relies on still hold after the sleep
    /// (`qp` alone in its context, no region borrowed, this queue empty,
    /// nothing held, reported, queued or owed: `QpSlot::rx_alone`) —
    /// `take` gets the head receive's `wr_id` and the payload
    /// ([`Parked::Taken`]; `take` must not call into this context), else
    /// the usual service and drain ([`Parked::Completed`], or
    /// [`Parked::Nothing`] to wait on). `Err(self)`: the read brought no
    /// bytes (nothing done; [`Self::into_wait`] with the caller's lock
    /// let go).
    pub fn take<R>(
        mut self,
        out: &mut [Wc],
        take: impl FnOnce(u64, &[u8]) -> Option<R>,
    ) -> std::result::Result<Parked<'a, R>, Self> {
        if !self.brought_bytes() {
            return Err(self);
        }
        let (read, res) = self.read.take().expect("an unparked read not taken yet");
        let (cq, qp) = (self.cq, self.qp);
        let inner = &cq.sh.inner;
        let mut st = inner.lock();
        st.parked_sleeps.count(false);
        if let Some(qi) = st.unpark_staged(read, res) {
            let alone = st.one_qp_unborrowed()
                && st
                    .cqs
                    .get(cq.id)
                    .is_some_and(|c| c.as_ref().is_some_and(|c| c.is_drained()))
                && st.qps[qi].as_ref().is_some_and(|q| q.rx_alone());
            if alone {
                if let Some(got) = cq.predicted(&mut st, qp, take) {
                    return Ok(Parked::Taken(got, st.news(qi)));
                }
            }
            st.service_unparked(qi, &inner.epoll);
        }
        let n = st.cq(cq.id).drain_into(out);
        if n > 0 {
            return Ok(Parked::Completed(n, cq.news_of(&st, qp)));
        }
        Ok(Parked::Nothing(Resume {
            cq,
            qp,
            timeout: self.timeout,
        }))
    }

    /// The wait goes on as [`Cq::wait_news`]'s after its first park (the
    /// caller holds none of its locks): the read's result serviced and the
    /// queue drained; a sleep a signal ended with nothing ends the wait
    /// with `EINTR` ([`crate::Error::is_interrupted`]); one that brought
    /// nothing goes on in the wait's rounds until `timeout` (counted from
    /// the park if the read timed out, else from its end, as
    /// [`Cq::wait_news`] counts after its first park).
    pub fn into_wait(mut self, out: &mut [Wc]) -> Result<(usize, Option<QpNews>)> {
        let (read, res) = self.read.take().expect("an unparked read not taken yet");
        let (cq, qp) = (self.cq, self.qp);
        match cq.unparked(read, res, out, Some(qp), false) {
            Ok(r) => Ok(r),
            Err(Woke::Interrupted) => Err(interrupted()),
            Err(woke) => {
                let start = Start::Slept(Instant::now(), woke);
                cq.wait_rounds::<true>(out, self.timeout, Some(qp), start)
            }
        }
    }
}

impl Drop for Unparked<'_> {
    /// A result neither taken nor waited on: handed back and serviced, its
    /// completions left queued.
    #[inline(always)]
    fn drop(&mut self) {
        if let Some((read, res)) = self.read.take() {
            give_back(self.cq, read, res);
        }
    }
}

impl Resume<'_> {
    /// [`Unparked::into_wait`] after a read that brought bytes which
    /// completed nothing: the wait's rounds, as [`Cq::wait_news`]'s go on
    /// after such a first park (a patient sleep: `poll`, then the read),
    /// `timeout` counted from now (after the take's service: late by that
    /// and under a park slice at most, as there).
    pub fn into_wait(self, out: &mut [Wc]) -> Result<(usize, Option<QpNews>)> {
        let start = Start::Slept(Instant::now(), Woke::Read);
        self.cq
            .wait_rounds::<true>(out, self.timeout, Some(self.qp), start)
    }
}
