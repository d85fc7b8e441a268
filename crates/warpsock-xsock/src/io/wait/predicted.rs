//! The blocking receive's predicted take (issue 12): a receive's wait
//! ([`XSocket::recv_straight`], [`XSocket::wait_take`]) parks in the engine's read as any
//! driving wait does, but through [`warpsock_engine::Cq::park_first`], so
//! that when the read brings bytes the socket's lock is taken again
//! *before* the engine services them. Then, when they are exactly one
//! whole FPDU — a one-FPDU Send into our oldest posted slot, one DATA
//! message that fits the caller's buffer — it is taken where the read put
//! it, as the busy-polling spin's predicted receive takes it
//! (`io/quiet.rs`: [`XSocket::take_predicted`], the same books): no
//! completion, no service round, no copy into the slot, no repost. The
//! general path it replaces cost a blocking 8 B ping-pong ~1,900
//! instructions a receive after the read (the engine's service and
//! drain, `take_direct`, the batched repost; BENCHMARKS §6 session 30).
//!
//! Everything else — a read with no bytes (a slice's timeout, a signal),
//! a part of an FPDU, two FPDUs, a CREDIT, another kind of FPDU, a buffer
//! too small, a message-mode part, other work due in the engine (another
//! thread's post while the read slept: `QpSlot::rx_alone`) — goes the way
//! the engine's wait ([`warpsock_engine::Cq::wait_news`]) and `drive_end`
//! took it before, with the same result: a read that completed nothing
//! goes on in the engine's rounds (`Resume`), with the socket's lock let
//! go again. The socket's lock is held while the engine services bytes
//! the take declined (as the quiet spin holds it): the lock order is the
//! socket's, then the engine's, as everywhere.
//!
//! Every receive that drives the engine's wait with its buffer takes
//! this path ([`XSocket::wait_take`]): the straight path's (timed or not:
//! the benchmark's blocking reads carry an `SO_RCVTIMEO`), and the
//! general loop's (`MSG_WAITALL`'s rest; a message's part too, where the
//! take always declines: the books hold bytes unread). Not a second
//! reader's (it waits on the driver), a peek's, nor a sink's or placed
//! read's (`io/sink.rs`, `io/placed.rs`).

use std::sync::atomic::Ordering;
use std::sync::MutexGuard;
use std::time::Duration;

use warpsock_engine::{asleep, First, Parked, QpNews, Resume, Unparked, Wc};

use super::{Drive, Waiter, Woken};
use crate::io::socket::{State, XSocket, WCS};

/// The rest of a first park's wait, made with the socket's lock let go.
enum Wait<'a> {
    /// The read brought no bytes (a slice's timeout, a signal, EOF or an
    /// error are `Unparked::into_wait`'s to report).
    Unparked(Unparked<'a>),
    /// Its bytes completed nothing.
    Resume(Resume<'a>),
}

/// How the first park's wait ended, for `drive_end`.
enum Ended<'a> {
    /// The engine's wait's answer (the socket's lock not held).
    Waited(warpsock_engine::Result<(usize, Option<QpNews>)>),
    /// Completions serviced under the socket's lock, taken again.
    Locked(MutexGuard<'a, State>, usize, QpNews),
}

impl XSocket {
    /// The wait of [`XSocket::wait_take`] (up to `slice`) for a receive
    /// that drives the engine (`st.driving` down), which tries the
    /// predicted take first (see the module's docs).
    #[inline(always)]
    pub(super) fn wait_predicted<'a>(
        &'a self,
        mut st: MutexGuard<'a, State>,
        slice: Duration,
        buf: &mut [u8],
    ) -> (MutexGuard<'a, State>, Option<(usize, bool)>, Woken) {
        let drive = self.drive_begin(&mut st, Waiter::Reader);
        let owner = drive.owner;
        drop(st);
        let mut wcs = [Wc::default(); WCS];
        let ended = match self.cq.park_first(&mut wcs, slice, &self.qp) {
            First::Parked(park) => {
                let woke = asleep::owned(owner, || park.sleep());
                let woke = if woke.brought_bytes() {
                    let mut st = self.lock();
                    let take = |wr_id, payload: &[u8]| {
                        #[cfg(test)]
                        super::tests::maybe_panic_in_take();
                        self.take_predicted(&mut st, wr_id, payload, &mut buf[..])
                    };
                    match woke.take(&mut wcs, take) {
                        Ok(Parked::Taken(got, news)) => {
                            return self.parked_taken(st, got, news, drive);
                        }
                        Ok(Parked::Completed(n, news)) => Ok(Ended::Locked(st, n, news)),
                        // Bytes that completed nothing: the wait goes on
                        // as the engine's would, the socket's lock let go.
                        Ok(Parked::Nothing(resume)) => {
                            drop(st);
                            Err(Wait::Resume(resume))
                        }
                        Err(woke) => {
                            drop(st);
                            Err(Wait::Unparked(woke))
                        }
                    }
                } else {
                    Err(Wait::Unparked(woke))
                };
                match woke {
                    Ok(ended) => ended,
                    Err(wait) => Ended::Waited(asleep::owned(owner, || match wait {
                        Wait::Resume(resume) => resume.into_wait(&mut wcs),
                        Wait::Unparked(woke) => woke.into_wait(&mut wcs),
                    })),
                }
            }
            First::Drained(n, news) => Ended::Waited(Ok((n, Some(news)))),
            First::Usual => Ended::Waited(asleep::owned(owner, || {
                self.cq.wait_news(&mut wcs, slice, &self.qp)
            })),
        };
        let (st, n, news, intr) = match ended {
            Ended::Waited(waited) => {
                let (n, news, intr) = Self::waited(waited);
                (self.lock(), n, news, intr)
            }
            Ended::Locked(st, n, news) => (st, n, Some(news), Woken::NoSignal),
        };
        self.drive_end(st, &wcs[..n], news, drive, intr, Waiter::Reader, Some(buf))
    }

    /// The end of a wait whose read the predicted take took (`got`: the
    /// receive's result; `news`: the engine's after it; `drive` the
    /// wait's start): what `drive_end` does after `take_direct` of
    /// the only completion — the driving marks down, the counts of the
    /// take, `processed` (a receive-only end's RTO lowered; a batch of
    /// freed slots the usual path's takes left posted now, as
    /// `predicted_taken` does: this take posted its own slot, so the batch
    /// would never grow), `settle`, the other threads woken, and the
    /// writer's report (the call consumes the message: no reader is told).
    #[inline(never)]
    fn parked_taken<'a>(
        &'a self,
        mut st: MutexGuard<'a, State>,
        got: (usize, bool),
        news: QpNews,
        drive: Drive<'_>,
    ) -> (MutexGuard<'a, State>, Option<(usize, bool)>, Woken) {
        let posts = drive.end();
        st.driving = false;
        self.parked.store(false, Ordering::Release);
        // Another thread's post meanwhile may have left newer news.
        st.news = (st.posts == posts).then_some(news);
        st.parked_predicted += 1;
        self.predicted_books(&mut st, got.0);
        if st.news.is_none() {
            self.reap(&mut st);
        }
        self.settle(&mut st);
        self.wake(&st);
        self.report_for_writer(&st);
        (st, Some(got), Woken::NoSignal)
    }
}
