//! Waiting for the engine: the one thread that drives a socket's engine
//! at a time, the others waiting for it on the socket's wake word
//! ([`XSocket::wait`]), and the receive call's direct take of a message
//! that lands while it waits ([`XSocket::wait_take`], whose wait tries
//! the predicted take of a lone message first: `wait/predicted.rs`) or
//! in the round a non-blocking one drives ([`XSocket::drive_take`]).
//!
//! A busy-polling receive's empty round is short (issue 12): the engine's
//! round is its socket read alone when nothing else can be due
//! ([`warpsock_engine::Cq::poll_news`]), and the socket's end of the round
//! is the watch's rearm alone when it owes nothing ([`XSocket::settled`]);
//! each states why it is the full round's exact effect.

use std::sync::atomic::Ordering;
use std::sync::{MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use warpsock_engine::{QpNews, Wc, WcOpcode};

use super::settings::{Count, RecvFlags};
use super::socket::{State, XSocket, WCS};

/// Who waits in [`XSocket::wait_inner`] (and `wait/predicted.rs`): the call's own kind, not the
/// socket's (another thread may send while this one closes).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Waiter {
    /// A receive call: input it processes is its own.
    Reader,
    /// A send call, counted in `sending`.
    Sender,
    /// Any other call (a close, a request's wait).
    Other,
}

/// Whether a signal ended a wait's sleep, and what the handlers ask
/// ([`super::sys::restart_after_signal`]), decided as the wait ends,
/// before it takes the socket's lock again: the ~65 system calls of that
/// look are not made with the lock held, where every other thread's call
/// on the socket would wait for them (review r22-b item 7). Read by
/// [`XSocket::stop_for_signal`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum Woken {
    /// No signal ended it.
    #[default]
    NoSignal,
    /// A signal did, and every handler that could have run asked for a
    /// restart.
    Restart,
    /// A signal did, and not every handler asked for a restart.
    Stop,
    /// A `pthread_cancel` of this thread is pending (`crate::cancel`): the
    /// call ends as for `Stop`, and its entry point acts on the cancel.
    Cancel,
}

impl Woken {
    /// After a sleep a signal ended: a pending cancel (the preload sends
    /// glibc's `SIGCANCEL` to end the sleep; its handler has `SA_RESTART`),
    /// nothing if that signal came for a cancel the thread does not act on
    /// now (disabled), else what the handlers ask.
    #[cold]
    fn after_signal() -> Self {
        match crate::cancel::after_signal() {
            Some(true) => Self::Cancel,
            // The preload's own signal, for a cancel not acted on now.
            Some(false) => Self::NoSignal,
            None if super::sys::restart_after_signal() => Self::Restart,
            None => Self::Stop,
        }
    }

    /// After a slice that brought nothing and no signal ended: a pending
    /// cancel that no signal announced (one noted before the wait began,
    /// or whose signal came between sleeps), else nothing. One relaxed
    /// load while no cancel is noted; off the fast paths (a wait with
    /// completions does not look).
    #[inline(always)]
    fn after_slice() -> Self {
        if crate::cancel::any() && crate::cancel::pending() {
            Self::Cancel
        } else {
            Self::NoSignal
        }
    }
}

/// A wait's longest sleep before its call looks again (a deadline's
/// rest, if shorter).
const SLICE: Duration = Duration::from_millis(50);

/// A wait that drives the engine (`XSocket::drive_begin`): the word that
/// names it in its sleeps' marks and the count of posts at its start,
/// taken back by its end (`drive_end`, `parked_taken`: [`Drive::end`]).
/// Dropped before that — the wait unwound: a panic, which the preload
/// catches and fails the call with — it undoes the wait's marks
/// (`XSocket::undo_drive`): else `driving` stayed set and every later
/// receive waited for a driver that never comes back (review r30-b
/// item 3; the engine's read is handed back by its own drops,
/// `warpsock_engine::Park`).
#[must_use]
struct Drive<'a> {
    x: &'a XSocket,
    owner: usize,
    posts: u64,
}

impl Drive<'_> {
    /// The wait ended as it should: its count of posts, and no undo.
    #[inline(always)]
    fn end(self) -> u64 {
        let posts = self.posts;
        std::mem::forget(self);
        posts
    }
}

impl Drop for Drive<'_> {
    fn drop(&mut self) {
        self.x.undo_drive();
    }
}

impl XSocket {
    /// Wakes the threads waiting for the socket's state to change
    /// (`wait_for_driver`'s sleep on [`Self::wakes`]). Under the lock (`st`),
    /// as every read of the word: a waiter counted itself in `waiters` and
    /// read the word before it let the lock go, so this bump comes after
    /// that read, and its sleep either sees the new value (the futex
    /// returns at once) or is asleep when the wake comes — no wake-up is
    /// lost (the protocol of std's futex `Condvar::notify_all`).
    pub(crate) fn wake(&self, st: &State) {
        if st.waiters > 0 {
            self.wakes.fetch_add(1, Ordering::Relaxed);
            warpsock_engine::rawsys::futex_wake(&self.wakes, i32::MAX);
        }
    }

    /// Waits (until `deadline`) for something to happen: drives the engine
    /// itself if no other thread does, else waits for that thread. A wait
    /// a signal ended is not told: for waits that a signal must not end
    /// (a close, a request reading the caller's memory); see
    /// [`Self::wait_intr`].
    pub(crate) fn wait<'a>(
        &'a self,
        st: MutexGuard<'a, State>,
        deadline: Option<Instant>,
    ) -> MutexGuard<'a, State> {
        self.wait_inner(st, deadline, Waiter::Other, None).0
    }

    /// [`Self::wait`] for a send call (one that counts itself in
    /// `sending`), and whether a signal ended its sleep with nothing
    /// done: the waiting call's own answer, for it to pass to
    /// [`Self::stop_for_signal`] (review r22-b item 2: a mark kept in the
    /// socket's state outlived the call whose wait set it, and a later
    /// call, maybe another thread's, failed with `EINTR` with no signal).
    /// Its sleeps' marks say a send waits: an exit over them takes the
    /// call's count back ([`Self::abandon_wait`]; a wait that is no send
    /// never does, whatever other calls send: review r26-d item 2).
    pub(crate) fn wait_send<'a>(
        &'a self,
        st: MutexGuard<'a, State>,
        deadline: Option<Instant>,
    ) -> (MutexGuard<'a, State>, Woken) {
        let (st, _, intr) = self.wait_inner(st, deadline, Waiter::Sender, None);
        (st, intr)
    }

    /// [`Self::wait`] for a receive call (`reader`): input it processes is
    /// the call's own, so other threads are not told of it — the call
    /// consumes it and its caller reflects the readiness after (telling
    /// them meant ringing and draining the program's doorbell, two system
    /// calls, for every message a blocking reader received).
    ///
    /// Returns whether a signal ended its sleep with nothing done (as
    /// [`Self::wait_intr`]).
    pub(crate) fn wait_as<'a>(
        &'a self,
        st: MutexGuard<'a, State>,
        deadline: Option<Instant>,
        reader: bool,
    ) -> (MutexGuard<'a, State>, Woken) {
        let who = if reader {
            Waiter::Reader
        } else {
            Waiter::Other
        };
        let (st, _, intr) = self.wait_inner(st, deadline, who, None);
        (st, intr)
    }

    /// [`Self::wait_as`] for a receive call (stream or message mode, not a
    /// peek) whose buffer `out` waits with nothing unread: a DATA message
    /// that lands in the wait and fits `out` is copied into it at once
    /// (see [`Self::take_direct`]). Returns the bytes taken and whether
    /// they end a message (as [`Self::read_now`] would), if any were, and
    /// whether a signal ended its sleep with nothing done.
    /// Its wait tries the predicted take first (`io/wait/predicted.rs`):
    /// a lone DATA message the parked read brings is taken where the
    /// read put it.
    pub(crate) fn wait_take<'a>(
        &'a self,
        st: MutexGuard<'a, State>,
        deadline: Option<Instant>,
        out: &mut [u8],
    ) -> (MutexGuard<'a, State>, Option<(usize, bool)>, Woken) {
        let slice = Self::slice(deadline);
        if st.driving {
            return self.wait_for_driver(st, slice);
        }
        self.wait_predicted(st, slice, out)
    }

    /// A wait's sleep: [`SLICE`], or the rest until `deadline` if
    /// shorter.
    #[inline(always)]
    fn slice(deadline: Option<Instant>) -> Duration {
        deadline.map_or(SLICE, |d| {
            d.saturating_duration_since(Instant::now()).min(SLICE)
        })
    }

    /// Whether a receive call (`flags`, a buffer of `len` bytes) may go
    /// the straight path ([`Self::recv_straight`]; a timed call may: its
    /// wait ends by the call's deadline). Each term is a case the general
    /// loop (`recv_locked`, `io/data/recv.rs`) handles otherwise, declined
    /// here:
    ///
    /// * a flag: a peek leaves the bytes queued, a non-blocking call never
    ///   waits, `MSG_WAITALL` loops until the buffer is full;
    /// * an empty buffer (the call returns at once), or one of `zcopy_min`
    ///   bytes or more (a sink offer, or a placed read: `io/placed.rs`);
    /// * anything unread (the pre-switch residue, queued bytes): the
    ///   general loop's first look delivers it without a wait (or, in
    ///   message mode short of a message's end, waits for more);
    /// * the end of the stream, our end shut for reading, an error, the
    ///   peer's FIN: the call returns without waiting;
    /// * another thread driving the engine (a second reader: the wait is
    ///   on the wake word, with no take);
    /// * receives retargeted at another call's buffers (placement ahead of
    ///   the data: their bytes are that call's to deliver).
    #[inline(always)]
    pub(crate) fn recv_straight_fits(&self, st: &State, flags: RecvFlags, len: usize) -> bool {
        flags == RecvFlags::default()
            && len != 0
            && len < self.opts.zcopy_min
            && st.residue_off >= st.residue.len()
            && st.s.readable() == 0
            && !st.s.eof()
            && !st.shut_rd
            && st.error.is_none()
            && !st.peer_closed
            && !st.driving
            && !st.reads_reserved()
    }

    /// The blocking receive's straight path, for a call
    /// [`Self::recv_straight_fits`] admits: what the general loop would do
    /// for it, in the caller's frame — one wait (up to `timeout`, the
    /// call's `SO_RCVTIMEO`, or a slice, if shorter: no clock is read
    /// here; the caller reads the call's deadline under this lock, or for
    /// a timeout of a second or more only if this wait takes nothing,
    /// `recv_guarded`) that takes the
    /// DATA message landing in it straight into `buf` ([`Self::wait_take`]'s,
    /// whose predicted take takes a lone one where the engine's read put
    /// it).
    /// Returns the bytes taken and whether they end a message, or, when
    /// the wait took nothing (the loop would go round again, and looks at
    /// the deadline), the lock for the general loop to go on with and
    /// whether a signal ended the wait's sleep.
    #[inline(always)]
    #[allow(clippy::type_complexity)]
    pub(crate) fn recv_straight<'a>(
        &'a self,
        st: MutexGuard<'a, State>,
        buf: &mut [u8],
        timeout: Option<Duration>,
    ) -> Result<(MutexGuard<'a, State>, (usize, bool)), (MutexGuard<'a, State>, Woken)> {
        // `recv_straight_fits`: no other thread drives the engine.
        debug_assert!(!st.driving);
        let slice = timeout.map_or(SLICE, |t| t.min(SLICE));
        match self.wait_predicted(st, slice, buf) {
            (st, Some(got), _) => Ok((st, got)),
            (st, None, intr) => Err((st, intr)),
        }
    }

    #[inline(always)]
    fn wait_inner<'a>(
        &'a self,
        mut st: MutexGuard<'a, State>,
        deadline: Option<Instant>,
        who: Waiter,
        out: Option<&mut [u8]>,
    ) -> (MutexGuard<'a, State>, Option<(usize, bool)>, Woken) {
        let slice = Self::slice(deadline);
        if st.driving {
            return self.wait_for_driver(st, slice);
        }
        let drive = self.drive_begin(&mut st, who);
        let owner = drive.owner;
        drop(st);
        let mut wcs = [Wc::default(); WCS];
        // Each slice is one engine wait: after one that found nothing, the
        // engine's next waits sleep where a signal is not lost to a read's
        // timeout (`poll`, not the parked read: `warpsock_engine::Cq`'s
        // idle mark; issue 12).
        let waited =
            warpsock_engine::asleep::owned(owner, || self.cq.wait_news(&mut wcs, slice, &self.qp));
        let (n, news, intr) = Self::waited(waited);
        let st = self.lock();
        self.drive_end(st, &wcs[..n], news, drive, intr, who, out)
    }

    /// A wait while another thread drives the engine: sleeps until it
    /// wakes us (`wake`), for `slice`, or until a signal's handler runs —
    /// then the call decides as the driver's would (`stop_for_signal`): on
    /// TCP a second blocked reader's call fails with `EINTR` too
    /// (signal(7); a `Condvar`'s wait slept on through the handler). The
    /// word is read under the lock, which every bump of it holds
    /// (`wake`): a wake after this read ends the sleep, one before it is
    /// already seen.
    #[inline(never)]
    fn wait_for_driver<'a>(
        &'a self,
        mut st: MutexGuard<'a, State>,
        slice: Duration,
    ) -> (MutexGuard<'a, State>, Option<(usize, bool)>, Woken) {
        st.waiters += 1;
        let seq = self.wakes.load(Ordering::Relaxed);
        drop(st);
        let r = warpsock_engine::rawsys::futex_wait(&self.wakes, seq, slice);
        // Looked at before the lock is taken again (`Woken`).
        let intr = if r == -1 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR)
        {
            Woken::after_signal()
        } else {
            Woken::NoSignal
        };
        let mut st = self.st.lock().unwrap_or_else(PoisonError::into_inner);
        // A take of the lock as `lock`'s (not counted, as the wait's
        // re-take never was: `state_locks`): this call goes on changing
        // the books (`io/quiet.rs`).
        self.quiet.store(false, Ordering::Relaxed);
        st.waiters -= 1;
        let intr = match intr {
            Woken::NoSignal => Woken::after_slice(),
            woken => woken,
        };
        (st, None, intr)
    }

    /// The start of a wait that drives the engine itself (no other thread
    /// does: `st.driving` was down), under the lock `st`, which the caller
    /// then lets go for the sleep: the socket marked driven, the progress
    /// thread's watch off. Returns the wait's [`Drive`]: the word that
    /// names it in its sleeps' marks (`asleep::owned`), the count of
    /// posts, whose change at the end says another thread posted
    /// meanwhile, and the undo of the marks if the wait unwinds.
    #[inline(always)]
    fn drive_begin(&self, st: &mut State, who: Waiter) -> Drive<'_> {
        st.driving = true;
        self.parked.store(true, Ordering::Release);
        self.count(st, Count::Waits, 1);
        // The call reads the socket itself now (and the engine's wait
        // watches for output space while it holds a backlog): the progress
        // thread would only wake for what the call reads anyway — one more
        // context switch per message. Re-armed, if still wanted, when the
        // call takes over again (`settle` in `drive_end`; epoll checks
        // readiness when the interest changes, so what came meanwhile is
        // reported).
        self.set_watching(st, Self::WATCH_OFF);
        // Every driver's wait names the socket in its sleeps' marks (its
        // `word`, which no later socket reuses, as one at the same
        // address would its address: review r27-b item 4): an
        // exit in a signal handler over the sleep undoes this call's marks
        // (`driving`, `parked`, a send's `sending`), as it never comes back
        // (`XSocket::abandon_wait`). A receive's too: its sleep is not
        // always the parked read (which names the engine's context) — the
        // engine declines the park (a tx backlog, staged input, a close
        // under way) and sleeps in `epoll_wait`, marked with no context
        // (review r26-d item 1). The sending bit is this call's kind
        // (`wait_send`), not `st.sending`: that counts other threads'
        // sends too, and the undo took one of theirs (their own decrement
        // then underflowed; review r26-d item 2). Two thread-local stores
        // a blocking wait: none on the busy path, which never gets here.
        let owner = self.word
            | if who == Waiter::Sender {
                Self::OWNER_SENDING
            } else {
                0
            };
        Drive {
            x: self,
            owner,
            posts: st.posts,
        }
    }

    /// A driving wait's marks undone after it unwound ([`Drive`]'s drop):
    /// the lock taken whatever a panic left it (poisoned), the engine no
    /// longer driven, the progress thread's watch rearmed, and the waiting
    /// threads woken to drive it themselves.
    #[cold]
    #[inline(never)]
    fn undo_drive(&self) {
        let mut st = self.st.lock().unwrap_or_else(PoisonError::into_inner);
        self.quiet.store(false, Ordering::Relaxed);
        st.driving = false;
        self.parked.store(false, Ordering::Release);
        self.rearm(&mut st);
        self.wake(&st);
    }

    /// An engine wait's result as `drive_end` takes it: the completions,
    /// the news, and whether a signal ended its sleep with nothing done —
    /// decided before the socket's lock is taken again (`Woken`).
    #[inline(always)]
    fn waited(
        waited: warpsock_engine::Result<(usize, Option<QpNews>)>,
    ) -> (usize, Option<QpNews>, Woken) {
        match waited {
            Ok((n, news)) => (n, news, Woken::NoSignal),
            Err(e) if e.is_interrupted() => (0, None, Woken::after_signal()),
            Err(_) => (0, None, Woken::NoSignal),
        }
    }

    /// The end of a wait that drove the engine (`drive_begin`), under the
    /// socket's lock taken again: the completions `wcs` it brought (their
    /// news `news`; `drive` its start) processed — the first
    /// copied straight into `out` if it is DATA that fits
    /// ([`Self::take_direct`]) — and the books settled; or, with none, a
    /// round. Other threads are told.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    fn drive_end<'a>(
        &'a self,
        mut st: MutexGuard<'a, State>,
        wcs: &[Wc],
        news: Option<QpNews>,
        drive: Drive<'_>,
        mut intr: Woken,
        who: Waiter,
        out: Option<&mut [u8]>,
    ) -> (MutexGuard<'a, State>, Option<(usize, bool)>, Woken) {
        let posts = drive.end();
        let reader = who == Waiter::Reader;
        let n = wcs.len();
        st.driving = false;
        self.parked.store(false, Ordering::Release);
        let seen = st.arrivals;
        let mut taken = None;
        if n == 0 {
            // `intr` goes back to the waiting call alone, never into the
            // socket's state (a wait with completions had no signal end
            // its sleep: the engine drains nothing then).
            if intr == Woken::NoSignal {
                intr = Woken::after_slice();
            }
            self.drive_now(&mut st);
        } else {
            // Another thread's post meanwhile may have left newer news
            // than the wait's own.
            let alone = st.posts == posts;
            st.news = news.filter(|_| alone);
            // The wait read the socket and took in what it held: the rest
            // of what it queued is taken without another round, which
            // would only read the socket empty (one more system call per
            // message) — and without another look when the wait drained
            // the queue (fewer than it could take) and nothing was posted
            // since: the news it returned says what else there is.
            let mut wcs = wcs;
            if let (Some(out), [first, rest @ ..]) = (out, wcs) {
                taken = self.take_direct(&mut st, first, out);
                if taken.is_some() {
                    wcs = rest;
                }
            }
            if wcs.is_empty() {
                // The taken message was all (a ping-pong's answer):
                // `process` of nothing is its tail alone.
                self.processed(&mut st);
            } else {
                self.process(&mut st, wcs);
            }
            if !(alone && n < WCS && st.news.is_some()) {
                self.reap(&mut st);
            }
            self.settle(&mut st);
        }
        self.wake(&st);
        // Other threads may wait in poll for what this one processed; not
        // for a message the call took (it consumes it, see `wait_as`),
        // decided before the readiness is worked out for nothing (~45
        // instructions per taken message, issue 12) — unless a program
        // waits for writability (`writable_wait`): a reader that goes on
        // waiting after this (`MSG_WAITALL` short of its length, a
        // message's held part) would swallow the credits' look, and the
        // thread in `poll(POLLOUT)` would never be woken (review r21-send
        // item 1). One relaxed load on the taken message's path.
        let gated = self.writable_wait.load(Ordering::Relaxed);
        if st.arrivals != seen && (gated || !(reader && taken.is_some())) {
            let r = Self::readiness_of(&st);
            if gated || !(reader && r.readable) {
                if let Some(f) = self.on_progress.get() {
                    f(r);
                }
            }
        }
        (st, taken, intr)
    }

    /// Whether the call whose wait a signal ended (`intr`: that wait's
    /// answer) should stop waiting: it then fails with `EINTR`, or returns
    /// what it transferred, as a TCP socket's call does (signal(7),
    /// "Interruption of system calls and library functions by signal
    /// handlers"; issue 12). Not when every handler that could have run
    /// asked for a restart ([`super::sys::restart_after_signal`]) — unless
    /// `timed`: the socket has a timeout for the call's direction
    /// (`SO_RCVTIMEO`, `SO_SNDTIMEO`), with which Linux fails socket calls
    /// with `EINTR` even under `SA_RESTART`. The handlers were looked at
    /// as the wait ended ([`Woken`]), only if a signal ended it.
    #[inline(always)]
    pub(crate) fn stop_for_signal(intr: Woken, timed: bool) -> bool {
        match intr {
            Woken::NoSignal => false,
            Woken::Restart => timed,
            Woken::Stop | Woken::Cancel => true,
        }
    }

    /// A receive call's result when a signal ended its wait
    /// ([`Self::stop_for_signal`]): the `got` bytes it has, or `EINTR`.
    #[cold]
    pub(super) fn interrupted(got: usize) -> std::io::Result<(usize, bool)> {
        if got > 0 {
            Ok((got, false))
        } else {
            Err(std::io::Error::from_raw_os_error(libc::EINTR))
        }
    }

    /// [`Self::drive_now`], for a receive call (not a peek) whose buffer
    /// `out` finds nothing unread: a DATA message the round takes in first
    /// is copied into it at once if it fits, as in [`Self::wait_take`] (a
    /// busy-polling receive's answer). Returns whether anything completed,
    /// and the bytes taken and whether they end a message.
    pub(crate) fn drive_take(
        &self,
        st: &mut State,
        out: Option<&mut [u8]>,
    ) -> (bool, Option<(usize, bool)>) {
        let mut wcs = [Wc::default(); WCS];
        let mut n = 0;
        // A thread in `wait` may hold completions it polled with our lock
        // released: polling now could process later ones first (stream
        // bytes out of order). That thread processes everything in order
        // when it comes back.
        if !st.driving {
            let (polled, news, idle) = self.cq.poll_news_idle(&mut wcs, &self.qp);
            st.news = Some(news);
            if polled == 0 && self.settled(st) {
                st.idle_round = idle;
                return (false, None);
            }
            n = polled;
        }
        self.take_polled(st, &mut wcs, n, out)
    }

    /// The rest of [`Self::drive_take`] after its poll: the `n`
    /// completions in `wcs` (their news in `st.news`) processed in order,
    /// the first copied into `out` if it is a DATA message that fits, and
    /// the rest of the queue polled while batches come full; then the
    /// books settled. Also the quiet spin's, after the read that brought
    /// something (`io/quiet.rs`). Always inlined: out of line, its call
    /// cost a `poll`-then-`read` 8 B round trip ~30 instructions per
    /// process (callgrind, `notes/s23/count-mode.sh`).
    #[inline(always)]
    pub(crate) fn take_polled(
        &self,
        st: &mut State,
        wcs: &mut [Wc; WCS],
        mut n: usize,
        mut out: Option<&mut [u8]>,
    ) -> (bool, Option<(usize, bool)>) {
        let mut any = false;
        let mut taken = None;
        while n > 0 {
            any = true;
            let mut batch = &wcs[..n];
            if let (Some(out), [first, rest @ ..]) = (out.take(), batch) {
                taken = self.take_direct(st, first, out);
                if taken.is_some() {
                    batch = rest;
                }
            }
            self.process(st, batch);
            if n < WCS {
                break;
            }
            let (more, news) = self.cq.poll_queued_news(wcs, &self.qp);
            (n, st.news) = (more, Some(news));
        }
        st.idle_spins = 0;
        st.idle_round = false;
        self.settle(st);
        if any {
            self.report_for_writer(st);
        }
        (any, taken)
    }

    /// While a program waits for writability ([`Self::set_writable_wait`]),
    /// what a round processed is reported at once ([`Self::set_on_progress`]):
    /// the call that made the round may go on without a look that reaches
    /// the writer's gate — a large blocking receive rounds before it offers
    /// a sink or parks, a `MSG_WAITALL` short of its length waits again —
    /// and a credit it took in would wake no one (review r21-b item 1,
    /// r21-send item 1). Only rounds that processed something; one relaxed
    /// load then. Always inlined as that load (a predicted answer's every
    /// time: as `#[inline]` alone it stayed a call), the report out of
    /// line ([`Self::report_now`]).
    #[inline(always)]
    pub(super) fn report_for_writer(&self, st: &State) {
        if self.writable_wait.load(Ordering::Relaxed) {
            self.report_now(st);
        }
    }

    /// [`Self::report_for_writer`] while the program waits to write.
    #[inline(never)]
    fn report_now(&self, st: &State) {
        if let Some(f) = self.on_progress.get() {
            f(Self::readiness_of(st));
        }
    }

    /// The end of an empty round (no completion), short (issue 12): when
    /// the round brought no event and the socket owes nothing that
    /// [`Self::settle`] would send or move, only its watch is rearmed.
    /// Returns whether that was all; `false`: settle.
    ///
    /// Why it is all: `check_events` returns at once on news without an
    /// event; `pump` moves nothing with no asynchronous send or receive
    /// queued ([`super::rio::Aio`]; `in_flight` also counts one-sided
    /// operations, more than needed); `flush` sends nothing when the
    /// books owe no message ([`crate::stream::Stream::owes_msg`]); and
    /// `rearm` runs here as there. What the terms guard: `owes_msg` a
    /// message the books hold for the peer (the end-of-stream test of
    /// `tests/spin.rs` fails without it; credits freed by a read are
    /// flushed by that read, `copy_out`, and a return waiting for a
    /// transmit slot gets one only through a completion, a full round);
    /// the events an event that comes with no completion (the peer's FIN
    /// or reset while no receive is posted: not tested — a Terminate or a
    /// FIN with receives posted flushes them, and the round settles);
    /// `in_flight` asynchronous operations (defence: they move only
    /// through completions and posts). A send queued behind the transmit
    /// window, a Terminate or the peer's FIN keep the engine's short round
    /// off (`Cq::poll_news`), and what they bring is a completion or an
    /// event. Every [`Self::FULL_ROUND`]-th empty round settles all the
    /// same: a bound, not relied on (the tests spin 100 times, and their
    /// limits are longer than 1,024 spins: a test that only fails by
    /// waiting may pass on it).
    #[inline]
    fn settled(&self, st: &mut State) -> bool {
        if st.idle_spins >= Self::FULL_ROUND
            || st.news.is_some_and(|n| n.events)
            || st.aio.in_flight()
            || st.s.owes_msg()
        {
            return false;
        }
        st.idle_spins += 1;
        self.rearm(st);
        true
    }

    /// Empty rounds in a row that end without [`Self::settle`] before one
    /// that settles ([`Self::settled`]).
    pub(crate) const FULL_ROUND: u32 = 1024;

    /// A receive call waiting with its buffer `out` takes `wc`, the first
    /// completion of its wait, straight from the slot when it is a
    /// receive of DATA that fits, nothing is unread before it and the
    /// slot holds its bytes (not a placed read's: `io/placed.rs`): the
    /// books count it received and consumed at once
    /// ([`crate::stream::Stream::take_message`]) and the slot is freed as
    /// a read would free it, then reposted by the `process` that follows or
    /// left for a batch (`XSocket::repost`, `Stream::repost_due`). No segment is
    /// queued and read back, no second look of [`Self::read_now`].
    /// Message mode takes only a message's end (it returns `MSG_EOR`).
    /// `None`: not taken, nothing changed — `process` handles it.
    #[inline(always)]
    fn take_direct(&self, st: &mut State, wc: &Wc, out: &mut [u8]) -> Option<(usize, bool)> {
        if !wc.is_ok()
            || wc.opcode != WcOpcode::Recv
            || st.posted.front() != Some(&(wc.wr_id as u32))
            || st.residue_off < st.residue.len()
            || st.reads_reserved()
        {
            return None;
        }
        let slot = wc.wr_id as u32;
        let at = slot as usize * self.opts.slot_size as usize;
        #[allow(unsafe_code)]
        // SAFETY: the receive in `slot` completed; the slot is reposted
        // only after the books free it (below, when taken).
        let bytes = unsafe { self.rx.bytes(at, wc.byte_len as usize) };
        let t = st.s.take_message(slot, bytes, out.len(), st.msg_mode)?;
        super::slots::copy_short(&mut out[..t.len], &bytes[t.off..t.off + t.len]);
        st.posted.pop_front();
        st.taken_unposted += 1;
        st.arrivals += 1;
        self.count(st, Count::RxCopied, t.len);
        self.count(st, Count::RxTaken, 1);
        Some((t.len, st.msg_mode))
    }
}

mod predicted;

#[cfg(test)]
mod tests;
