//! Completion queues ([`Cq`]): polling, waiting, and a pollable fd.
//!
//! A busy-polling caller's empty round is short ([`Cq::poll_news`]): a
//! context's lone queue pair with nothing queued, staged, held or owed is
//! read, and nothing else done — the full round's exact effect when the
//! read finds nothing (the argument is `Cq::idle_round`'s).

use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use crate::asleep;
use crate::context::{Context, Progress, Shared, State};
use crate::driver::{ParkedRead, Sleep};
use crate::error::{Error, Result};
use crate::mr::thread_borrows;
use crate::qp::{Qp, QpNews};
use crate::sys::EventFd;
use crate::wc::{CqSlot, Wc};

/// Longest single sleep of a caller parked in a blocking read (see
/// [`Cq::wait`]): it wakes this often to re-check its deadline and
/// anything another thread left it.
const PARK_SLICE: Duration = Duration::from_millis(10);

/// Where [`Cq::wait_rounds`] starts.
enum Start<'a> {
    /// At its first round.
    Fresh,
    /// After a first round that found the queue empty and no park (this
    /// lock found it).
    Drained(MutexGuard<'a, State>),
    /// After a first round's parked read that brought nothing (or bytes
    /// that completed nothing: `first::Resume`), woken at this instant,
    /// the way it says (`wait_for`'s, or a first park in the caller's
    /// hands: `cq/first.rs`).
    Slept(Instant, Woke),
}

/// How a parked sleep ended ([`Cq::sleep_parked`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Woke {
    /// Its read timed out (`EAGAIN` after `SO_RCVTIMEO`): it slept its
    /// whole slice.
    TimedOut,
    /// A signal ended it (`EINTR`), sooner, with nothing read.
    Interrupted,
    /// Its read brought bytes (those of a completion, or ones that
    /// complete nothing: an RDMA Write or Read Response placed, part of
    /// an FPDU, a bare credit), EOF or an error: sooner, too.
    Read,
}

impl Woke {
    /// How the parked read's result `res` ended its sleep. Only `EAGAIN`
    /// (`WouldBlock`) is the read's own timeout: `ETIMEDOUT` (`TimedOut`)
    /// is the connection declared dead (retransmissions or keepalive given
    /// up, `TCP_USER_TIMEOUT`), at any moment — an error like any other.
    #[inline]
    fn of(res: &io::Result<usize>) -> Self {
        match res {
            Err(e) => match e.kind() {
                io::ErrorKind::WouldBlock => Self::TimedOut,
                io::ErrorKind::Interrupted => Self::Interrupted,
                _ => Self::Read,
            },
            Ok(_) => Self::Read,
        }
    }
}

/// The error [`Cq::wait_news`] returns when a signal ended its sleep.
#[cold]
fn interrupted() -> Error {
    Error::Sys {
        what: "wait",
        source: io::Error::from_raw_os_error(libc::EINTR),
    }
}

/// What a quiet read brought ([`Cq::read_quiet`]): bytes, an end or an
/// error, or the full round made; the context's lock is held until
/// [`Self::finish`] (or a [`Self::predict`] that takes). Drop it only
/// through them: dropped, a read's bytes stay staged for the next round.
#[derive(Debug)]
pub struct QuietRead<'a> {
    cq: &'a Cq,
    qp: &'a Qp,
    st: MutexGuard<'a, State>,
    /// The short round's read took something in: `qp`'s service is due
    /// (else the full round was made, or none: progress-thread mode).
    service: bool,
}

impl QuietRead<'_> {
    /// The predicted receive (issue 12): when the short round's read
    /// came back short with exactly one whole FPDU that the core predicts
    /// — a one-FPDU Send into the head receive (see
    /// `warpsock_proto::Connection::rx_send_predicted`) — `take` gets that
    /// receive's `wr_id` and the payload where the read put it, under the
    /// context's lock. If it takes it, the core has advanced and posted
    /// the receive again in place (no completion, no service round, no
    /// copy into the receive's buffer): its answer and `qp`'s news, the
    /// lock released. `take` must not call into this context. Only where
    /// the receive's completion would come to this queue, with its notify
    /// fd not maintained (`Cq::notify_fd`: a completion would signal it).
    /// `Err`: nothing changed; [`Self::finish`] as usual. Always inlined
    /// (one caller, the quiet spin): the preload's build left it a call
    /// that returned its result and the lock through memory.
    #[inline(always)]
    pub fn predict<R>(
        mut self,
        take: impl FnOnce(u64, &[u8]) -> Option<R>,
    ) -> std::result::Result<(R, QpNews), Self> {
        if !self.service {
            return Err(self);
        }
        match self.cq.predicted(&mut self.st, self.qp, take) {
            Some(got) => Ok((got, self.st.news(self.qp.qi))),
            None => Err(self),
        }
    }

    /// The rest of the round: `qp`'s service when its short round's read
    /// took something in (as `Cq::round_for`), then the completions
    /// drained into `out` and `qp`'s news.
    pub fn finish(mut self, out: &mut [Wc]) -> (usize, QpNews) {
        let inner = &self.cq.sh.inner;
        if self.service {
            self.st.service(self.qp.qi, &inner.epoll);
            self.st.reap(&inner.epoll);
        }
        let n = self.st.cq(self.cq.id).drain_into(out);
        (n, self.cq.news_of(&self.st, self.qp))
    }
}

/// A completion queue.
#[derive(Debug)]
pub struct Cq {
    pub(crate) sh: Arc<Shared>,
    pub(crate) id: usize,
    /// The queue's eventfd (see [`Cq::notify_fd`]), shared with its
    /// state; made at the first `notify_fd`.
    notify: Arc<OnceLock<EventFd>>,
    /// An interruptible wait ([`Cq::wait_news`]) on this queue slept a
    /// whole slice with nothing since one last had a completion come
    /// within its first park: the next one is taken to wait long as
    /// well, and sleeps in `poll` from its first park (see
    /// `Cq::wait_rounds`) — a caller that waits in slices (a blocking
    /// read's 50 ms in xsock) waits again and again, and each wait's
    /// first park would otherwise be the read whose timeout can swallow a
    /// signal. Cleared only by a completion within a wait's first park
    /// (review r22-d item 1). A hint only, read and written relaxed: it
    /// picks a sleep, nothing else.
    idle: AtomicBool,
}

impl Context {
    /// Creates a completion queue. `capacity` sizes its initial storage;
    /// completions are never dropped when more arrive.
    pub fn create_cq(&self, capacity: usize) -> Result<Cq> {
        let mut slot = CqSlot::new();
        slot.entries.reserve(capacity);
        let notify = Arc::clone(&slot.notify);
        let mut st = self.sh.inner.lock();
        let id = match st.cqs.iter().position(Option::is_none) {
            Some(i) => i,
            None => {
                st.cqs.push(None);
                st.cqs.len() - 1
            }
        };
        st.cqs[id] = Some(slot);
        Ok(Cq {
            sh: Arc::clone(&self.sh),
            id,
            notify,
            idle: AtomicBool::new(false),
        })
    }
}

impl Cq {
    /// Moves up to `out.len()` completions into `out` and returns how many.
    /// In caller-driven mode this first makes one non-blocking round of
    /// progress.
    pub fn poll(&self, out: &mut [Wc]) -> usize {
        let inner = &self.sh.inner;
        let mut st = inner.lock();
        if inner.progress == Progress::Caller {
            inner.progress_locked(&mut st);
        }
        st.cq(self.id).drain_into(out)
    }

    /// [`Self::poll`], then `qp`'s news ([`QpNews`]) under the same lock.
    ///
    /// A busy-polling caller's empty round is short (issue 12): when `qp`
    /// is its context's only queue pair and nothing else can be due, the
    /// round is `qp`'s socket read alone (`Cq::idle_round`).
    #[inline]
    pub fn poll_news(&self, out: &mut [Wc], qp: &Qp) -> (usize, QpNews) {
        let (n, news, _) = self.poll_news_idle(out, qp);
        (n, news)
    }

    /// [`Self::poll_news`], and whether its round was the short empty one
    /// (`idle_round`): `qp` is its context's only queue pair, its socket
    /// read found nothing (or was skipped after a short read), and nothing
    /// was staged, held, reported, queued for output or completed — so
    /// until its caller posts or polls again, only bytes, an end or an
    /// error on the socket can change anything (a quiet socket's spin
    /// builds on it, [`Self::read_if_idle`]: `warpsock_xsock`'s
    /// `io/quiet.rs`, issue 12).
    /// Apart from [`QpNews`], which every post returns: a field there cost
    /// a blocking ping-pong ~40 instructions per round trip (callgrind).
    pub fn poll_news_idle(&self, out: &mut [Wc], qp: &Qp) -> (usize, QpNews, bool) {
        let inner = &self.sh.inner;
        let mut st = inner.lock();
        // `QpNews::rx_drained` tells of this round's reads (or later ones).
        if Arc::ptr_eq(&self.sh, &qp.sh) {
            if let Some(Some(q)) = st.qps.get_mut(qp.qi) {
                q.rx_drained = false;
            }
        }
        if inner.progress == Progress::Caller && self.round_for(&mut st, qp) {
            return (0, st.news(qp.qi), true);
        }
        let n = st.cq(self.id).drain_into(out);
        (n, self.news_of(&st, qp), false)
    }

    /// [`Self::poll_news_idle`] for a caller that knows its last round was
    /// the short empty one and nothing was posted or polled since
    /// (`warpsock_xsock`'s quiet socket, issue 12): `None` when the short
    /// round found nothing again (`qp`'s socket read `EAGAIN`, or skipped
    /// after a short read) — nothing changed, no news asked for. Else the
    /// completions drained into `out` and `qp`'s news, as from
    /// `poll_news_idle` (its read took in bytes, an end or an error and
    /// `qp`'s service followed; or the short round did not apply and the
    /// full one was made).
    ///
    /// Why the read and not a `poll` of the socket first: the busy
    /// poller's answer then cost two system calls where host TCP's costs
    /// one (~225 ns each on this host with its mitigations), and a second
    /// round of the engine when the first had read already.
    pub fn read_if_idle(&self, out: &mut [Wc], qp: &Qp) -> Option<(usize, QpNews)> {
        self.read_quiet(qp).map(|r| r.finish(out))
    }

    /// [`Self::read_if_idle`] in two steps, for the predicted receive
    /// (issue 12): `None` when the short round found nothing (no byte
    /// looked at, no completion array needed); else what it read, the
    /// lock held, for [`QuietRead::predict`] and [`QuietRead::finish`].
    #[inline]
    pub fn read_quiet<'a>(&'a self, qp: &'a Qp) -> Option<QuietRead<'a>> {
        let inner = &self.sh.inner;
        let mut st = inner.lock();
        let mut service = false;
        if inner.progress == Progress::Caller {
            match self.idle_round(&mut st, qp) {
                Some(true) => return None,
                Some(false) => service = true,
                None => {
                    inner.progress_locked(&mut st);
                }
            }
        }
        Some(QuietRead {
            cq: self,
            qp,
            st,
            service,
        })
    }

    /// The predicted take of [`QuietRead::predict`], after its short
    /// round's read took bytes in (`idle_round`'s `Some(false)`: `qp` is
    /// this context's only queue pair, nothing borrowed, this queue
    /// drained), and of [`Unparked::take`], after a first park's read
    /// took bytes in (the same terms, and `rx_idle`'s, asked again after
    /// the sleep). `None`: nothing changed.
    #[inline(always)]
    fn predicted<R>(
        &self,
        st: &mut State,
        qp: &Qp,
        take: impl FnOnce(u64, &[u8]) -> Option<R>,
    ) -> Option<R> {
        let State {
            qps,
            cqs,
            reg,
            rx_pool,
            watching,
            ..
        } = st;
        let q = qps.get_mut(qp.qi)?.as_mut()?;
        if q.recv_cq != self.id || cqs.get(self.id)?.as_ref()?.armed() {
            return None;
        }
        let epoll = watching.then_some(&self.sh.inner.epoll);
        q.rx_predicted(qp.qi as u64, reg, rx_pool, epoll, take)
    }

    /// A caller-driven round of progress for a poll of this queue with
    /// `qp`'s news (the lock `st` held, this queue drained or not):
    /// `qp`'s short empty round when it applies (`idle_round`), else the
    /// full one. `true`: the short round found nothing (no completion to
    /// drain).
    #[inline(always)]
    fn round_for(&self, st: &mut State, qp: &Qp) -> bool {
        let inner = &self.sh.inner;
        match self.idle_round(st, qp) {
            Some(true) => return true,
            // The read took something in — bytes, EOF or an error — and
            // the rest of the round is `qp`'s service, as after a parked
            // read (`State::unpark`): always, also when the read ended the
            // connection (a reset: the core's flushed completions and its
            // `Closed` are collected there, and the socket leaves the
            // epoll set). `qp` is the only queue pair (see `idle_round`).
            Some(false) => {
                st.service(qp.qi, &inner.epoll);
                st.reap(&inner.epoll);
            }
            None => {
                inner.progress_locked(st);
            }
        }
        false
    }

    /// The empty round of [`Self::poll_news`], short: `Some(true)` when
    /// it was made and found nothing — having done exactly what the full
    /// round (`Inner::progress_locked`, then the drain) would have done,
    /// which then returns no completion. `Some(false)`: its read took in
    /// bytes (staged, as a parked read's), EOF or an error (taken as a
    /// parked read's: the connection may be over), and `qp`'s service must
    /// follow, whatever state it left. `None`: nothing done; make the full
    /// round.
    ///
    /// Why the short round is the full one: it runs only for a context
    /// whose only queue pair is `qp` (`qps` of length one, so the full
    /// round would service `qp` alone), with no region borrowed
    /// (`readers`, `writers`: `State::allowed` lets the round receive and
    /// transmit, and defers nothing) and nothing for the drain to do on
    /// this queue (no completion queued: `CqSlot::is_drained`). `qp` of
    /// another context (`Arc::ptr_eq`), a dropped queue pair lingering
    /// (`detached`) and a notify fd left readable are defence only: the
    /// first is the caller's mix-up, the second cannot be while `qp`, the
    /// only slot, lives, and the third follows from no entry queued.
    /// `qp`'s own round
    /// is then `QpSlot::idle_round`, the call the full round's `service`
    /// makes first: with nothing staged, held, reported or owed to the
    /// socket and framing next, its read's `EAGAIN` (or a read skipped
    /// after a short one, as `rx_inner` skips it) ends that round too —
    /// no completion, event or output can come of it. Always inlined:
    /// used twice (a poll's round and a busy-polling wait's), it was left
    /// out of line, ~6 instructions more per poll (callgrind).
    #[inline(always)]
    fn idle_round(&self, st: &mut State, qp: &Qp) -> Option<bool> {
        if !Arc::ptr_eq(&self.sh, &qp.sh) || !st.one_qp_unborrowed() {
            return None;
        }
        let State {
            qps,
            cqs,
            rx_pool,
            watching,
            ..
        } = st;
        let (Some(Some(cq)), Some(Some(q))) = (cqs.get_mut(self.id), qps.get_mut(qp.qi)) else {
            return None;
        };
        if !cq.is_drained() {
            return None;
        }
        let epoll = watching.then_some(&self.sh.inner.epoll);
        let r = q.idle_round(qp.qi as u64, rx_pool, epoll);
        if r == Some(true) {
            q.count_short_round();
        }
        r
    }

    /// [`Self::poll_queued`], then `qp`'s news ([`QpNews`]) under the same
    /// lock.
    pub fn poll_queued_news(&self, out: &mut [Wc], qp: &Qp) -> (usize, QpNews) {
        let mut st = self.sh.inner.lock();
        let n = st.cq(self.id).drain_into(out);
        (n, self.news_of(&st, qp))
    }

    /// `qp`'s news read under this queue's lock `st` (a queue pair of
    /// another context is looked up under its own).
    fn news_of(&self, st: &State, qp: &Qp) -> QpNews {
        if Arc::ptr_eq(&self.sh, &qp.sh) {
            st.news(qp.qi)
        } else {
            // Another context's: its reads are not this round's.
            QpNews {
                rx_drained: false,
                ..qp.news()
            }
        }
    }

    /// Moves up to `out.len()` completions that are queued already into
    /// `out`, without a round of progress (no system call, in either
    /// mode): e.g. the completion of a Send that [`crate::Qp::post_send`]
    /// wrote out at once, reaped by the caller that posted it instead of
    /// by its next wait.
    pub fn poll_queued(&self, out: &mut [Wc]) -> usize {
        self.sh.inner.lock().cq(self.id).drain_into(out)
    }

    /// Like [`Self::poll`], but waits up to `timeout` for at least one
    /// completion. Returns 0 if none arrived in time.
    ///
    /// Caller-driven mode: drives progress, spinning for the context's
    /// `busy_poll` time, then sleeping in `epoll_wait` on the context's
    /// sockets. Progress-thread mode: sleeps until the thread delivers.
    /// Inside a [`crate::Mr::with_bytes`] closure on the same context it
    /// does not block (nothing can be received until the closure returns):
    /// it returns what is queued, like [`Self::poll`].
    pub fn wait(&self, out: &mut [Wc], timeout: Duration) -> Result<usize> {
        self.wait_for::<false>(out, timeout, None).map(|(n, _)| n)
    }

    /// [`Self::wait`], then, when it returns completions, `qp`'s news
    /// ([`QpNews`]) read under the lock it drained them with (`None`: the
    /// wait timed out, or ended without taking the lock again).
    ///
    /// Unlike [`Self::wait`], a sleep that a signal ends (`EINTR` from the
    /// parked read or from `epoll_wait`) and brought no completion ends
    /// the wait at once with [`Error::Sys`] of `EINTR`
    /// ([`Error::is_interrupted`]): the caller decides, as the kernel's
    /// socket calls do, whether its call fails with `EINTR` or waits
    /// again (signal(7); issue 12: a blocking read of a DDP-mode socket
    /// was never interrupted). Only a sleep the signal ended is seen: one that lands
    /// while the wait spins (`busy_poll`), services a round or waits on
    /// the condition variable (progress-thread mode, a region borrowed)
    /// runs its handler and the wait goes on; one whose sleep's round
    /// completed something all the same (another thread's post) returns
    /// that, unreported. A sleep is the parked read's only in a wait's
    /// first slice (unless the queue's waits sleep through slices: `idle`),
    /// where a signal that wakes it late in the slice may be taken for its
    /// timeout and lost; past it, `poll` (see `Cq::wait_rounds`).
    pub fn wait_news(
        &self,
        out: &mut [Wc],
        timeout: Duration,
        qp: &Qp,
    ) -> Result<(usize, Option<QpNews>)> {
        self.wait_for::<true>(out, timeout, Some(qp))
    }

    /// `INTR`: a sleep a signal ends ends the wait (see
    /// [`Self::wait_news`]; a constant: the blocking ping-pong's path pays
    /// nothing for it).
    fn wait_for<const INTR: bool>(
        &self,
        out: &mut [Wc],
        timeout: Duration,
        qp: Option<&Qp>,
    ) -> Result<(usize, Option<QpNews>)> {
        let inner = &self.sh.inner;
        if inner.progress == Progress::Caller
            && crate::spun::busy_poll(inner.busy_poll).is_zero()
            && timeout >= PARK_SLICE
        {
            // A blocking wait's first round (a blocking ping-pong's every
            // receive): what `wait_rounds`' first round does, with its
            // set-up (the borrow look-up, the clock and deadline
            // arithmetic, the epoll list) left to the rounds after it,
            // which most waits never reach.
            let mut st = inner.lock();
            // No region borrow of this context at all, so none of this
            // thread's: a borrow is counted here under this lock for as
            // long as it is in this thread's list (`mr::Borrow`), so
            // `thread_borrows` would say false. (One thread-local look-up
            // less per wait: in a shared library each is a call of
            // `__tls_get_addr`.)
            if st.readers + st.writers == 0 {
                debug_assert!(!thread_borrows(inner));
                let n = st.cq(self.id).drain_into(out);
                if n > 0 || out.is_empty() {
                    return Ok((n, qp.map(|qp| self.news_of(&st, qp))));
                }
                // Parked without reading the clock: its answer wakes a
                // ping-pong's receive long before the slice ends. Only a
                // sleep that brings nothing reads it (see `Start::Slept`).
                // An interruptible wait after one that found nothing in
                // its time sleeps in `poll` from its first park (`idle`):
                // the rounds do that.
                let p = if INTR && self.idle.load(Ordering::Relaxed) {
                    None
                } else {
                    st.park(PARK_SLICE)
                };
                let Some(p) = p else {
                    return self.wait_rounds::<INTR>(out, timeout, qp, Start::Drained(st));
                };
                return match self.sleep_parked(st, p, out, qp, None) {
                    Ok(r) => Ok(r),
                    Err(Woke::Interrupted) if INTR => Err(interrupted()),
                    Err(woke) => {
                        let start = Start::Slept(Instant::now(), woke);
                        self.wait_rounds::<INTR>(out, timeout, qp, start)
                    }
                };
            }
        }
        self.wait_rounds::<INTR>(out, timeout, qp, Start::Fresh)
    }

    /// [`Self::wait_for`]'s rounds, from `start`.
    ///
    /// The queue's `idle` mark says its interruptible waits (`INTR`) sleep
    /// through whole slices: it is set by any of their sleeps that timed
    /// out with nothing (and at a deadline), and cleared only by a
    /// completion that came within a wait's first park (a ping-pong's
    /// answer). Cleared by any completion, a blocked call whose waits kept
    /// ending with completions not its own (credits, another thread's send
    /// completions, a `MSG_WAITALL` chunk) started each with the blocking
    /// read, and its signal race (below) came back (review r22-d item 1).
    ///
    /// An interruptible wait past its first empty slice (`patient`: it
    /// started from a first park that brought nothing, or after a wait that
    /// found nothing in its time, or a parked sleep here came back empty)
    /// sleeps in `poll` on the socket, then reads it
    /// (`ParkedRead::read_polled`), not in the blocking read: that read's
    /// timeout (`SO_RCVTIMEO`, in jiffies) returns `EAGAIN`, not `EINTR`,
    /// when a signal wakes it after the timeout's jiffy passed but before
    /// its timer fired — about the last quarter of every slice here (Linux
    /// `tcp_recvmsg_locked` checks `!timeo` before `signal_pending`), so a
    /// blocking call's interruption was lost about one time in five (issue
    /// 12). `poll` checks for the signal first and times out on a
    /// high-resolution timer. The first park stays the read: a ping-pong's
    /// answer comes within it, one system call, and it costs the 8 B path
    /// nothing; a signal that lands in that first slice may still be lost
    /// so (README). Cost when it applies: `poll` and a read per slice, in
    /// waits already idle for a slice (10 ms). The socket stays out of
    /// epoll (`State::watch_all` would keep it in for good, a kernel
    /// callback per arriving segment after).
    #[inline(never)]
    fn wait_rounds<const INTR: bool>(
        &self,
        out: &mut [Wc],
        timeout: Duration,
        qp: Option<&Qp>,
        start: Start<'_>,
    ) -> Result<(usize, Option<QpNews>)> {
        let inner = &self.sh.inner;
        let mut patient =
            INTR && (matches!(start, Start::Slept(..)) || self.idle.load(Ordering::Relaxed));
        // No park yet (`wait_for`'s, `Unparked::into_wait`'s and `Resume::into_wait`'s is `Start::Slept`; the mark is set
        // here if it slept its slice with nothing: off the 8 B path).
        let mut first_park = !matches!(start, Start::Slept(..));
        if INTR && matches!(start, Start::Slept(_, Woke::TimedOut)) {
            self.idle.store(true, Ordering::Relaxed);
        }
        let news = |st: &State| qp.map(|qp| self.news_of(st, qp));
        if matches!(start, Start::Fresh) && thread_borrows(inner) {
            return Ok(match qp {
                Some(qp) => {
                    let (n, news) = self.poll_news(out, qp);
                    (n, Some(news))
                }
                None => (self.poll(out), None),
            });
        }
        if inner.progress == Progress::Thread {
            let deadline = Instant::now().checked_add(timeout);
            let left = |now: Instant| deadline.map(|d| d.saturating_duration_since(now));
            let mut st = inner.lock();
            loop {
                let n = st.cq(self.id).drain_into(out);
                if n > 0 || out.is_empty() {
                    return Ok((n, news(&st)));
                }
                let wait = match left(Instant::now()) {
                    Some(d) if d.is_zero() => return Ok((0, None)),
                    Some(d) => d,
                    None => Duration::from_secs(3600),
                };
                st = inner.wait_cv(st, wait);
            }
        }
        let mut ready = Vec::new();
        // Without busy polling, ask epoll first: every service round leaves
        // nothing behind that epoll would not report (unread input, queued
        // output), so a round now would only cost a futile read.
        let busy_poll = crate::spun::busy_poll(inner.busy_poll);
        let mut drive = !busy_poll.is_zero();
        // The clock is read only once a round has come up empty: a wait
        // that finds its completion at once (the common case in a
        // ping-pong) costs no clock read. The timeout and the spin then
        // count from that first empty round.
        let mut clock: Option<(Option<Instant>, Instant)> = None;
        let mut first = None;
        match start {
            Start::Fresh => {}
            // `wait_for`'s first round, its park declined: as this loop's
            // first round after the park it tries (no busy polling, so
            // `drive` was false: no progress missed).
            Start::Drained(st) => first = Some(st),
            // `wait_for`'s first round slept in a parked read that brought
            // nothing, without the clock: the timeout counts from one slice
            // before `now` if the read timed out (it slept that long), else
            // from `now` (it may have slept far less: counting a slice
            // would end the wait early; this is late by under the first
            // park's length, about a slice plus the kernel's timer
            // rounding).
            Start::Slept(now, woke) => {
                let slept = match woke {
                    Woke::TimedOut => PARK_SLICE,
                    Woke::Interrupted | Woke::Read => Duration::ZERO,
                };
                clock = Some((now.checked_add(timeout - slept), now));
            }
        }
        loop {
            let mut st = match first.take() {
                Some(st) => st,
                None => {
                    let mut st = inner.lock();
                    // A busy-polling wait's spin (`busy_poll`, e.g. the
                    // preload's WARPSOCK_BUSY_POLL_US) is a poll's round:
                    // the short empty one when `qp` is alone and nothing
                    // else is due (issue 12; the queue was drained by the
                    // round before, as `idle_round` asks).
                    if drive {
                        match qp {
                            Some(qp) => {
                                self.round_for(&mut st, qp);
                            }
                            None => {
                                inner.progress_locked(&mut st);
                            }
                        }
                    }
                    let n = st.cq(self.id).drain_into(out);
                    if n > 0 || out.is_empty() {
                        return Ok((n, news(&st)));
                    }
                    st
                }
            };
            drive = true;
            let now = Instant::now();
            let (deadline, spin_until) =
                *clock.get_or_insert_with(|| (now.checked_add(timeout), now + busy_poll));
            let rest = deadline.map(|d| d.saturating_duration_since(now));
            if rest.is_some_and(|d| d.is_zero()) {
                if INTR && !self.idle.load(Ordering::Relaxed) {
                    self.idle.store(true, Ordering::Relaxed);
                }
                return Ok((0, None));
            }
            if st.readers + st.writers > 0 {
                // Another thread's closure holds region bytes: nothing can
                // be received until it ends (it signals the condvar).
                drop(inner.wait_cv(st, rest.map_or(PARK_SLICE, |d| d.min(PARK_SLICE))));
                continue;
            }
            if now < spin_until {
                drop(st);
                // Yield between rounds: free when this CPU has nothing else
                // to run, and lets a peer sharing the CPU answer.
                std::thread::yield_now();
                continue;
            }
            // With one connection, sleep in a blocking read of its socket
            // instead of in epoll: the bytes that wake us are already read
            // (no separate readiness call), and the read's timeout is a
            // timer-wheel timeout, not epoll's high-resolution one — about
            // as cheap as a blocking TCP read. The lock is released while
            // asleep; posts from other threads go on meanwhile. Parked
            // under the lock that found the queue empty: one take of the
            // lock per sleep, not two.
            let slice = rest.map_or(PARK_SLICE, |d| d.min(PARK_SLICE));
            let parked = st.park(slice);
            if let Some(p) = parked {
                let poll = (INTR && patient).then_some(slice);
                let slept = self.sleep_parked(st, p, out, qp, poll);
                match slept {
                    Ok(r) => {
                        if INTR && first_park && self.idle.load(Ordering::Relaxed) {
                            self.idle.store(false, Ordering::Relaxed);
                        }
                        return Ok(r);
                    }
                    Err(Woke::Interrupted) if INTR => return Err(interrupted()),
                    Err(woke) => {
                        if INTR && woke == Woke::TimedOut {
                            self.idle.store(true, Ordering::Relaxed);
                        }
                        patient = INTR;
                    }
                }
                first_park = false;
                // Serviced just now: look again before another round.
                drive = false;
                continue;
            }
            st.watch_all(&inner.epoll);
            drop(st);
            ready.clear();
            let woken = asleep::unlocked(|| inner.epoll.wait(&mut ready, rest))
                .map_err(Error::sys("epoll_wait"))?;
            inner.waits.count(Sleep::Epoll, ready.is_empty());
            if !woken && INTR {
                return Err(interrupted());
            }
        }
    }

    /// Sleeps in the parked read `p` (of queue pair `p.qi`) with the lock
    /// `st` (which prepared it) released, then services what it read and
    /// drains this queue into `out` under the lock again. `Err`: nothing
    /// completed, and how the sleep ended. (A sleep a signal ended reads
    /// nothing; a round that completed something all the same — another
    /// thread's post — returns it, and the interruption is not reported:
    /// no check on the ping-pong's path.)
    ///
    /// `poll`: sleep in `poll` on the socket up to that long, then read
    /// (`ParkedRead::read_polled`; counted as such), not in the blocking
    /// read. An argument, not a second copy of this function: a copy (or a
    /// generic one) made the optimiser stop inlining the send path's
    /// `tx_inline`, +15 instructions per 8 B round trip.
    fn sleep_parked(
        &self,
        st: MutexGuard<'_, State>,
        mut p: ParkedRead,
        out: &mut [Wc],
        qp: Option<&Qp>,
        poll: Option<Duration>,
    ) -> std::result::Result<(usize, Option<QpNews>), Woke> {
        drop(st);
        // The `poll` of a patient wait is marked: an exit in a handler over
        // it holds no lock here, and gives the park back
        // (`asleep::abandon`). Not the blocking read (the first slice's):
        // a signal delivered as it returns with bytes (the peer's framing,
        // credits) would have the exit drop them, and the stream's framing
        // with them — such an exit goes as over a locked stretch. The
        // handler cannot tell that return from a sleep the signal ended
        // (the count is in a register it does not see), and a mark that
        // could tell them apart needs a sleep that reads nothing (`poll`,
        // then the read, as past the first slice): a system call more
        // on every blocking ping-pong's receive, for an exit in its first
        // 10 ms (the README says so).
        let res = match poll {
            None => p.read(),
            Some(t) => {
                let park = asleep::Slept::park(self.context_key(), p.qi, p.slot_id);
                p.read_polled(t, |f| asleep::parked(park, f))
            }
        };
        self.unparked(p, res, out, qp, poll.is_some())
    }

    /// The end of a parked sleep whose read `p` returned `res` (`polled`:
    /// a patient wait's `poll`-then-read): the read's result serviced and
    /// this queue drained into `out` under the lock, as in
    /// [`Self::sleep_parked`].
    fn unparked(
        &self,
        p: ParkedRead,
        res: io::Result<usize>,
        out: &mut [Wc],
        qp: Option<&Qp>,
        polled: bool,
    ) -> std::result::Result<(usize, Option<QpNews>), Woke> {
        let inner = &self.sh.inner;
        let woke = Woke::of(&res);
        let mut st = inner.lock();
        // A timeout (the socket's SO_RCVTIMEO, or poll's) or a signal
        // brought nothing.
        st.parked_sleeps.count(woke != Woke::Read);
        if polled {
            st.parked_sleeps.count_polled();
        }
        st.unpark(p, res, &inner.epoll);
        let n = st.cq(self.id).drain_into(out);
        if n > 0 {
            Ok((n, qp.map(|qp| self.news_of(&st, qp))))
        } else {
            Err(woke)
        }
    }

    /// The queue's notification fd: readable while completions are waiting
    /// in this queue (it becomes readable when one arrives and unreadable
    /// when [`Self::poll`]/[`Self::wait`] empties the queue). Put it in your
    /// own `poll`/`epoll` set in progress-thread mode; in caller-driven mode
    /// nothing arrives unless the application drives progress. The fd is
    /// maintained from the first call on (it costs two system calls per
    /// completion burst, so it is off until asked for). The descriptor
    /// itself is made by the first call, too: a queue that is only polled
    /// holds none (the preload's DDP sockets: one descriptor less each).
    /// Fails only there, as `eventfd(2)` does (`EMFILE`, `ENFILE`,
    /// `ENOMEM`).
    pub fn notify_fd(&self) -> io::Result<BorrowedFd<'_>> {
        let fd = match self.notify.get() {
            Some(fd) => fd,
            None => {
                let made = EventFd::new()?;
                // Another thread's first call may have won: its eventfd is
                // the queue's, and `made` is closed.
                let _ = self.notify.set(made);
                self.notify.get().expect("set just above")
            }
        };
        // Armed after the fd exists: an armed queue signals it
        // (`CqSlot::push`).
        self.sh.inner.lock().cq(self.id).arm();
        Ok(fd.as_fd())
    }

    /// Its context's identity: [`crate::asleep::abandon`]'s answer names
    /// the context of the parked read it gave back.
    pub fn context_key(&self) -> usize {
        Arc::as_ptr(&self.sh.inner) as usize
    }

    /// A parked read of this context that its thread's exit (in a signal
    /// handler over the sleep) abandoned ([`asleep::abandon`]'s `slept`):
    /// its queue pair reads its socket in rounds again, for the exit's
    /// closes. The lock is tried for 2 ms at most (another thread may hold
    /// it for good): not had, the park stays. Whether `slept` was this
    /// context's.
    pub fn abandon_park(&self, slept: asleep::Slept) -> bool {
        if !slept.is_park() || slept.key != self.context_key() {
            return false;
        }
        let end = Instant::now() + Duration::from_millis(2);
        loop {
            if let Some(mut st) = self.sh.inner.try_lock() {
                st.abandon_park(slept.qi, slept.slot_id);
                return true;
            }
            if Instant::now() >= end {
                return true;
            }
            std::thread::sleep(Duration::from_micros(100));
        }
    }

    /// Completions currently queued.
    pub fn len(&self) -> usize {
        self.sh.inner.lock().cq(self.id).entries.len()
    }

    /// Whether no completion is queued.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Drop for Cq {
    fn drop(&mut self) {
        self.sh.inner.lock().cqs[self.id] = None;
    }
}

mod first;
pub use first::{First, Park, Parked, Resume, Unparked};

#[cfg(test)]
mod tests;
