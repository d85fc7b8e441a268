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
//! parked read; then either [`Slept::take`], with the caller's own lock
//! taken again first — the context's lock, the bytes staged, and the
//! prediction tried where the quiet spin's applies (`qp` alone in its
//! context, nothing else due: `QpSlot::rx_alone`, asked again because
//! other threads may post while the read sleeps), else the usual service
//! and drain — or [`Slept::into_wait`] with no lock of the caller's (a
//! read that brought no bytes: the wait goes on exactly as
//! [`Cq::wait_news`]'s would, its rounds and the signal's report).

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
    /// No park here: wait with [`Cq::wait_news`].
    Usual,
}

/// A first park, not slept yet ([`Cq::park_first`]). Drop it only through
/// [`Self::sleep`] and what follows: dropped, the queue pair stays parked
/// and no round reads its socket again.
#[derive(Debug)]
#[must_use]
pub struct Park<'a> {
    cq: &'a Cq,
    qp: &'a Qp,
    timeout: Duration,
    read: ParkedRead,
}

/// A first park that slept ([`Park::sleep`]): its read's result, not yet
/// handed back to the queue pair. Drop it only through [`Self::take`] or
/// [`Self::into_wait`].
#[derive(Debug)]
#[must_use]
pub struct Slept<'a> {
    park: Park<'a>,
    res: io::Result<usize>,
}

/// What [`Slept::take`] did with a read that brought bytes.
#[derive(Debug)]
pub enum Parked<R> {
    /// The prediction's take took the FPDU: its answer and the queue
    /// pair's news.
    Taken(R, QpNews),
    /// Serviced as usual: this many completions drained into `out` (maybe
    /// none: part of an FPDU, a placed Write), and the news.
    Completed(usize, QpNews),
}

impl Cq {
    /// [`Self::wait_news`]'s first round for a wait of up to `timeout`,
    /// split so that its caller sleeps and takes its own lock again before
    /// the read is serviced (see the module's docs): [`First::Drained`]
    /// when completions are queued, [`First::Parked`] when the round parks
    /// in a read of `qp`'s socket (`qp` alone in this context), and
    /// [`First::Usual`] where [`Self::wait_news`] would not park at once
    /// (progress-thread mode, busy polling, a timeout under one park
    /// slice, an interruptible wait that sleeps in `poll` from its first
    /// park after an idle one, a region borrowed, another queue pair, or
    /// the queue pair's own terms: `QpSlot::park`). The lock is released
    /// on return.
    pub fn park_first<'a>(&'a self, out: &mut [Wc], timeout: Duration, qp: &'a Qp) -> First<'a> {
        let inner = &self.sh.inner;
        if inner.progress != Progress::Caller
            || !inner.busy_poll.is_zero()
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
        // pair) is `qp`'s.
        if st.qps.len() != 1 || st.detached != 0 {
            return First::Usual;
        }
        match st.park(PARK_SLICE) {
            Some(read) => {
                debug_assert_eq!(read.qi, qp.qi);
                First::Parked(Park {
                    cq: self,
                    qp,
                    timeout,
                    read,
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
    pub fn sleep(mut self) -> Slept<'a> {
        let res = self.read.read();
        Slept { park: self, res }
    }
}

impl<'a> Slept<'a> {
    /// Whether the read brought bytes: then [`Self::take`] (under the
    /// caller's lock), else [`Self::into_wait`] (with none).
    pub fn brought_bytes(&self) -> bool {
        matches!(self.res, Ok(n) if n > 0)
    }

    /// The read's bytes taken in under the context's lock, which the
    /// caller takes after its own (its lock comes first): when they are
    /// exactly one whole FPDU that [`crate::QuietRead::predict`] would
    /// take — and the terms that spin relies on still hold after the sleep
    /// (`qp` alone in its context, no region borrowed, this queue empty,
    /// nothing held, reported, queued or owed: `QpSlot::rx_alone`) —
    /// `take` gets the head receive's `wr_id` and the payload
    /// ([`Parked::Taken`]; `take` must not call into this context), else
    /// the usual service and drain ([`Parked::Completed`]). `Err(self)`:
    /// the read brought no bytes (nothing done; [`Self::into_wait`] with
    /// the caller's lock released).
    pub fn take<R>(
        self,
        out: &mut [Wc],
        take: impl FnOnce(u64, &[u8]) -> Option<R>,
    ) -> std::result::Result<Parked<R>, Self> {
        if !self.brought_bytes() {
            return Err(self);
        }
        let Park { cq, qp, read, .. } = self.park;
        let inner = &cq.sh.inner;
        let mut st = inner.lock();
        st.parked_sleeps.count(false);
        let Some(qi) = st.unpark_staged(read, self.res) else {
            let n = st.cq(cq.id).drain_into(out);
            return Ok(Parked::Completed(n, cq.news_of(&st, qp)));
        };
        let alone = st.qps.len() == 1
            && st.detached == 0
            && st.readers + st.writers == 0
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
        let n = st.cq(cq.id).drain_into(out);
        Ok(Parked::Completed(n, cq.news_of(&st, qp)))
    }

    /// The wait goes on as [`Cq::wait_news`]'s after its first park (the
    /// caller holds none of its locks): the read's result serviced and the
    /// queue drained; a sleep a signal ended with nothing ends the wait
    /// with `EINTR` ([`crate::Error::is_interrupted`]); one that brought
    /// nothing goes on in the wait's rounds until `timeout` (counted from
    /// the park).
    pub fn into_wait(self, out: &mut [Wc]) -> Result<(usize, Option<QpNews>)> {
        let Park {
            cq,
            qp,
            timeout,
            read,
        } = self.park;
        match cq.unparked(read, self.res, out, Some(qp), false) {
            Ok(r) => Ok(r),
            Err(Woke::Interrupted) => Err(interrupted()),
            Err(woke) => {
                let start = Start::Slept(Instant::now(), woke);
                cq.wait_rounds::<true>(out, timeout, Some(qp), start)
            }
        }
    }
}
