//! When a DDP socket needs a progress thread: the watch a background
//! thread keeps on the engine's TCP socket ([`XSocket::tcp_fd`], changed
//! through [`XSocket::set_watch`]) and the round it runs on each event
//! ([`XSocket::progress_if_idle`]).
//!
//! The watch is on demand. A program that sends and receives with blocking
//! calls reads the socket itself in each receive (the system calls of
//! plain TCP); a thread woken for every arrival besides cost two context
//! switches per message and did nothing the next call would not do. So
//! the watch is off unless something must happen while no call of the
//! program runs:
//!
//! * the program waits through its descriptor in a call that sees the
//!   socket only through the progress thread — `select`
//!   ([`XSocket::set_background`]), the `epoll_wait` family while no
//!   epoll set of the program's watches the engine's socket itself
//!   ([`XSocket::set_epoll_background`], [`XSocket::set_direct`]), or a
//!   `poll` that cannot watch the engine's socket itself
//!   ([`XSocket::poller`]);
//! * it waits for writability after a send found no credit
//!   ([`XSocket::set_writable_wait`], [`XSocket::want_writable`]): credits
//!   come back with input. Until the waiter ends the wait, not merely
//!   until a round finds the socket writable: see `set_writable_wait`;
//! * the protocol owes the peer something: messages wait for a transmit
//!   slot or a credit, the engine holds bytes for a full send buffer
//!   ([`warpsock_engine::Qp::send_backlog`]: output space is watched
//!   then), asynchronous or one-sided operations are in flight, buffers
//!   are mapped for the peer's one-sided reads, or the connection is not
//!   established yet (RFC 6581: a responder's sends wait for the
//!   initiator's first FPDU).
//!
//! While a call is parked in the engine the watch is off whatever is
//! wanted: the call reads the socket itself, and re-arms when it takes
//! over again. So, for input alone, while a program's `poll` that watches
//! the engine's socket itself waits ([`XSocket::stand_in`]): it makes the
//! round for what arrives (issue 12: a one-sided Write's target, its
//! mapping watched for, had both its `poll` and the progress thread woken
//! for every arrival, taking turns on the socket's lock).

use std::os::fd::RawFd;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::settings::{Count, Readiness};
use super::socket::{State, XSocket};

mod owed;
pub use owed::Round;

impl XSocket {
    /// What the socket can do, without a round of progress. Readable as a
    /// read of any size would return without waiting: in message mode, a
    /// part of a message that a read returns only once its end comes (the
    /// peer holds credits for the rest) is not readable (review r19-xdead
    /// item 6).
    pub fn readiness_now(&self) -> Readiness {
        Self::readiness_polled(&self.lock_look())
    }

    /// [`Self::readiness_now`], shown by `show` under the socket's lock.
    /// A look shown after the lock's release can land after a receive on
    /// another thread that took the bytes and showed its own look: a
    /// doorbell rung for bytes already read, readable to an event loop
    /// whose read then fails with `EAGAIN` (wrk counted a read error: a
    /// switch's look at its end, shown from the switch's thread after the
    /// program's first read; session 43). As the progress thread's rounds
    /// show theirs ([`Self::progress_if_idle`]).
    pub fn show_now(&self, show: impl FnOnce(Readiness)) {
        let st = self.lock_look();
        show(Self::readiness_polled(&st));
    }

    /// [`Self::readiness`] (a round first), shown by `show` under the
    /// socket's lock, as [`Self::show_now`].
    pub fn show_after_round(&self, show: impl FnOnce(Readiness)) {
        let mut st = self.lock();
        self.drive_now(&mut st);
        show(Self::readiness_polled(&st));
    }

    /// What the socket can do now (after a non-blocking round of
    /// progress), as [`Self::readiness_now`].
    pub fn readiness(&self) -> Readiness {
        let mut seen = Readiness::default();
        self.show_after_round(|r| seen = r);
        seen
    }

    /// The readiness a poll is given (level-triggered: a poll that says
    /// readable is followed by a read that does not block, as for TCP;
    /// review r19-xdead item 6). In message mode, bytes held count only
    /// when a read of any size returns them ([`crate::stream::Stream::msg_readable`]): a
    /// part of a message whose end has not come, while the peer holds
    /// credits for the rest, is not readable, and a non-blocking read
    /// would fail with `EAGAIN` (an event loop woken for it spun until the
    /// rest came). Edge-triggered waiters still get their edge: a part
    /// becomes readable only with an arrival (its end, or the DATA that
    /// leaves the peer short), and the round that processes it reports
    /// this look.
    ///
    /// Not the look taken after every call ([`Self::readiness_of`], where
    /// a held part counts: it costs the 8 B round trip nothing). After a
    /// receive that failed, the preload takes this one
    /// ([`Self::readiness_now`]), so the doorbell a program polls is
    /// drained by the `EAGAIN` a held part gave it.
    #[inline(never)]
    pub(crate) fn readiness_polled(st: &State) -> Readiness {
        let mut r = Self::readiness_of(st);
        if r.readable
            && st.msg_mode
            && st.residue_off == st.residue.len()
            && !(r.rdhup || r.error || st.shut_rd || st.aio.has_completions())
            && !st.s.msg_readable()
        {
            r.readable = false;
        }
        r
    }

    /// The engine's TCP socket. A progress thread registers it for
    /// [`Self::watching`] (edge-triggered epoll), follows
    /// [`Self::set_watch`], and calls [`Self::progress_if_idle`] on each
    /// event.
    pub fn tcp_fd(&self) -> RawFd {
        self.tcp_fd
    }

    /// Sets how the progress thread's watch of [`Self::tcp_fd`] is changed
    /// (`EPOLL_CTL_MOD` to the events given: see the module docs for when
    /// it is on). Called with the socket's lock held: it must not call
    /// back into this socket. Once per socket; later calls are ignored.
    pub fn set_watch(&self, f: Box<dyn Fn(u32) + Send + Sync>) {
        let _ = self.watch.set(f);
    }

    /// Sets what a thread blocked in a call does after it processed
    /// arrivals (the progress thread skips a socket a call is driving, so
    /// the call tells, e.g. a doorbell that another thread's `poll` waits
    /// on). Called with the socket's lock held: it must not call back into
    /// this socket. Once per socket; later calls are ignored.
    pub fn set_on_progress(&self, f: Box<dyn Fn(Readiness) + Send + Sync>) {
        let _ = self.on_progress.set(f);
    }

    /// The events the progress thread watches [`Self::tcp_fd`] for now:
    /// [`Self::WATCH_OFF`], [`Self::WATCH_INPUT`] or
    /// [`Self::WATCH_EVENTS`].
    pub fn watching(&self) -> u32 {
        self.watching.load(Ordering::Acquire)
    }

    /// Whether a call of the program is parked in the engine (it reads the
    /// socket itself meanwhile).
    pub fn parked(&self) -> bool {
        self.parked.load(Ordering::Acquire)
    }

    /// Changes the watch to `events`, under the socket's lock (`st`):
    /// every writer of [`Self::watching`] holds it, so a load and a store
    /// when it changes are the swap they replace — and a rearm that
    /// changes nothing (most: twice per round trip) costs a plain load,
    /// not an `xchg` (implicitly locked, a full barrier).
    pub(crate) fn set_watching(&self, st: &State, events: u32) {
        debug_assert!(self.st.try_lock().is_err(), "watch set without the lock");
        if self.watching.load(Ordering::Relaxed) != events {
            self.watching.store(events, Ordering::Release);
            self.count(st, Count::WatchChanges, 1);
            if let Some(f) = self.watch.get() {
                f(events);
            }
        }
    }

    /// After a round or a post by a thread that is not parked: the watch
    /// the socket needs now (module docs). Output space only while the
    /// engine holds a backlog: a writable socket reports `EPOLLOUT` at
    /// every change of interest and with every arriving segment. And not
    /// while a send call runs ([`State::sending`]): the call flushes the
    /// backlog and the messages that wait for credits itself, in its
    /// waits, and rearms when it returns. A large blocking send fills the
    /// socket's buffer at every post, and watching from each post to the
    /// wait that follows it turned the watch on and off again, two
    /// `epoll_ctl` per post.
    #[inline(always)]
    pub(crate) fn rearm(&self, st: &mut State) {
        if self.parked() {
            return;
        }
        let backlog = self.backlog(st);
        let ww = self.writable_wait.load(Ordering::Relaxed);
        st.watch_ww = ww;
        let want = Self::watch_wanted(st, backlog, ww);
        self.set_watching(st, want);
    }

    /// The watch [`Self::rearm`] sets for the books `st`, the engine's
    /// send backlog `backlog` and the writability wait `ww` (changes
    /// nothing).
    #[inline(always)]
    fn watch_wanted(st: &State, backlog: u64, ww: bool) -> u32 {
        let calls_flush = st.sending > 0;
        let want = if !calls_flush && backlog > 0 {
            Self::WATCH_EVENTS
        } else if Self::owes_progress(st) || ww || (!calls_flush && st.s.has_output()) {
            Self::WATCH_INPUT
        } else {
            Self::WATCH_OFF
        };
        if want == Self::WATCH_INPUT && Self::stood_in(st, ww) {
            Self::WATCH_OFF
        } else {
            want
        }
    }

    /// Whether the watch is what [`Self::rearm`] would set now for the
    /// `writable_wait` it last looked at (a debug build's check of a path
    /// that leaves it, `predicted_taken`, which does so only while that
    /// value stands): true while a wait drives the engine (`parked`: the
    /// rearm leaves it) or the books hold no news to read the backlog
    /// from.
    pub(crate) fn watch_current(&self, st: &State) -> bool {
        self.parked()
            || st.news.is_none_or(|n| {
                self.watching.load(Ordering::Relaxed)
                    == Self::watch_wanted(st, n.backlog, st.watch_ww)
            })
    }

    /// Whether a `poll` standing in ([`Self::stand_in`]) covers what the
    /// watch for input is wanted for. Not when something waits on the
    /// program's descriptor alone, woken only by the progress thread's
    /// rounds: a `poll` that does not watch the engine's socket
    /// (`pollers`), `select` or `epoll` (`background`), a wait for
    /// writability (`writable_wait`: the standing poll's round may leave
    /// input readable and then rings no doorbell, so the credits' look
    /// would not reach the writer's gate; session 21's lost wake-up).
    /// Output space (the engine's backlog, [`Self::WATCH_EVENTS`]) stays
    /// watched: the poll asks input of the engine's socket alone.
    #[inline]
    fn stood_in(st: &State, ww: bool) -> bool {
        st.stand_ins > 0 && st.pollers == 0 && !Self::bell_waited(st) && !ww
    }

    /// How long after it began a stand-in lapses unless another begins:
    /// twice the longest real wait of a `poll` that stands in (the
    /// preload's 500 ms: a longer one is made of waits that long, each
    /// ending its stand-in and beginning another; a poll's thread may be
    /// late between two of its waits, and a lapse then only wakes the
    /// progress thread for nothing).
    pub const STAND_LEASE: Duration = Duration::from_millis(1000);

    /// [`Self::stand_in`]`(true)`, its lease taken: whether the poll
    /// stands in, and whether the progress thread has no timer yet for
    /// the stand-ins' lapse ([`Self::stand_lapse`]): the caller then gives
    /// it one (one per lapse period, not one per poll). Cost of the lease:
    /// a clock read per standing wait, and while polls stand in the
    /// progress thread wakes at each lapse deadline (about once a second)
    /// and is woken once per lapse period to take the timer (review r23-c
    /// item 10).
    #[inline(never)]
    pub fn stand_in_timed(&self) -> (bool, bool) {
        let mut st = self.lock();
        if self.parked() {
            return (false, false);
        }
        st.stand_ins += 1;
        st.stand_by = Some(Instant::now() + Self::STAND_LEASE);
        let time_it = !std::mem::replace(&mut st.stand_timed, true);
        self.rearm(&mut st);
        (true, time_it)
    }

    /// The timer [`Self::stand_in_timed`] asked for could not be given:
    /// the next stand-in asks again.
    pub fn stand_untimed(&self) {
        self.lock().stand_timed = false;
    }

    /// When the stand-ins lapse, if any poll stands in (the progress
    /// thread's timer's deadline). Never waits for the socket's lock: a
    /// thread that holds it for good (a signal handler's `_exit` over a
    /// receive's copy that faulted under it) stopped the progress thread
    /// here, and with it every other socket's progress — the exit's flush
    /// of another connection's send buffer waited out its linger
    /// (`ddp_exitclose` under load). Held, the timer asks again
    /// [`Self::STAND_RETRY`] later (a lock held for good wakes the
    /// progress thread at that pace, a cost kept to one process that is
    /// exiting anyway).
    pub fn stand_expiry(&self) -> Option<Instant> {
        let Some(st) = self.try_lock_now() else {
            // A round owed asks again at its back-off's pace
            // ([`Self::owed_due`]), and the lapse with it: not this one's
            // 10 ms, which would wake the thread that often for a lock
            // held for good (review 47 item 1).
            return (!self.owes_round()).then(|| Instant::now() + Self::STAND_RETRY);
        };
        st.stand_by.filter(|_| st.stand_ins > 0)
    }

    /// How soon a stand-in timer whose socket's lock was held looks again.
    pub const STAND_RETRY: Duration = Duration::from_millis(10);

    /// The progress thread's timer at `now`: stand-ins that lapsed are
    /// forgotten (every live one began again within the lease) and the
    /// watch follows. A `poll` that never returned (a `siglongjmp` out of
    /// a handler that interrupted it) left its stand-in counted, and the
    /// watch for input stayed off for good: nothing processed arrivals
    /// while no call ran, and a peer's `rioread` waited for ever (review
    /// r22-e item 3). Now for one lease at most. A standing poll begins
    /// again well within the lease, so a live one never lapses. Returns whether the timer is done (no stand-in
    /// left); the next stand-in asks for a new one.
    pub fn stand_lapse(&self, now: Instant) -> bool {
        // Not waited for either (see `stand_expiry`): looked at again.
        let Some(mut st) = self.try_lock_now() else {
            return false;
        };
        if st.stand_ins > 0 && st.stand_by.is_some_and(|t| t <= now) {
            self.count(&st, Count::StandLapses, st.stand_ins as usize);
            st.stand_ins = 0;
            self.rearm(&mut st);
        }
        if st.stand_ins == 0 {
            st.stand_timed = false;
            return true;
        }
        false
    }

    /// A program's `poll` that watches [`Self::tcp_fd`] for input itself
    /// starts (`true`) or ends (`false`) its system call, and makes a
    /// round ([`Self::progress_for_poll`]) whenever that socket shows
    /// something: while it waits, the progress thread's watch for input is
    /// off (see `stood_in` for when it stays on), as for a call
    /// parked in the engine. Every start needs its end, right after the
    /// system call returns: the watch is back on then, and epoll checks
    /// readiness when the interest changes, so what came after the poll's
    /// last look (its timeout, a bounded round) is reported to the progress
    /// thread. Returns whether the poll stands in: not when a call is
    /// parked (the poll then waits through the progress thread,
    /// [`Self::poller`]); its end is called only then.
    #[inline(never)]
    pub fn stand_in(&self, on: bool) -> bool {
        let mut st = self.lock();
        if on {
            if self.parked() {
                return false;
            }
            st.stand_ins += 1;
            st.stand_by = Some(Instant::now() + Self::STAND_LEASE);
        } else {
            st.stand_ins = st.stand_ins.saturating_sub(1);
        }
        self.rearm(&mut st);
        true
    }

    /// The engine's send backlog: as its last call reported it, else
    /// asked (with the events, kept for the next look).
    fn backlog(&self, st: &mut State) -> u64 {
        st.news.get_or_insert_with(|| self.qp.news()).backlog
    }

    /// Whether arrivals must be processed while no call runs (module docs),
    /// besides output the protocol owes (`State::s`'s, and the engine's
    /// backlog), which a running send call flushes itself.
    fn owes_progress(st: &State) -> bool {
        Self::bell_waited(st)
            || st.pollers > 0
            || !st.established
            || st.aio.in_flight()
            || !st.maps.is_empty()
            || Self::shut_watch(st)
    }

    /// A socket shut both ways whose peer may still send: its bytes reset
    /// the connection at once, as TCP's kernel does with no call
    /// ([`XSocket::shut_both`]), so the sender learns it. Not once the
    /// peer ended its stream or closed (nothing more can come: the
    /// engine's socket, readable at its end for good, would wake the
    /// progress thread every round) or the connection failed.
    #[inline]
    fn shut_watch(st: &State) -> bool {
        st.shut_both_at.is_some() && st.error.is_none() && !st.s.eof() && !st.peer_closed
    }

    /// Whether the program may wait on the socket's descriptor in a call
    /// that sees it through the progress thread's rounds alone: `select`
    /// ([`Self::set_background`]), or an epoll set while none of the
    /// program's sets watches the engine's socket itself
    /// ([`Self::set_epoll_background`], [`Self::set_direct`]).
    #[inline]
    fn bell_waited(st: &State) -> bool {
        st.background || (st.epoll_background && st.direct == 0)
    }

    /// The program waits in epoll sets (`epoll_wait`): as
    /// [`Self::set_background`], but only while no epoll set of the
    /// program's watches [`Self::tcp_fd`] itself ([`Self::set_direct`]).
    /// The preload turns it on for good once the program makes such a
    /// call.
    pub fn set_epoll_background(&self, on: bool) {
        let mut st = self.lock();
        st.epoll_background = on;
        self.rearm(&mut st);
    }

    /// An epoll set of the program's starts (`true`) or stops (`false`)
    /// watching [`Self::tcp_fd`] itself, and calls
    /// [`Self::progress_if_idle`] from the program's `epoll_wait` for what
    /// it reports (the preload's `shim::epollwatch`): while one does, an
    /// epoll wait needs no progress thread for input. Counted; every
    /// start needs its end.
    pub fn set_direct(&self, on: bool) {
        let mut st = self.lock();
        if on {
            st.direct += 1;
        } else {
            st.direct = st.direct.saturating_sub(1);
        }
        self.covered.store(st.direct > 0, Ordering::Release);
        self.rearm(&mut st);
    }

    /// Whether an epoll set of the program's watches [`Self::tcp_fd`]
    /// itself ([`Self::set_direct`]). Its edge for new bytes is the
    /// kernel's: a round another waiter makes (a `poll`'s) that drains
    /// the socket takes that edge away (epoll looks at the socket again
    /// as it reports), so that round must show what it found on the
    /// doorbell, where the set's registration of the program's number
    /// sees it.
    pub fn covered(&self) -> bool {
        self.covered.load(Ordering::Acquire)
    }

    /// The program waits for this socket through calls that see it only
    /// through the progress thread (`select`, `epoll_wait`): every arrival
    /// is processed and reflected as it comes, as before on-demand
    /// watching. The preload turns it on for good once the program makes
    /// such a call.
    pub fn set_background(&self, on: bool) {
        let mut st = self.lock();
        st.background = on;
        self.rearm(&mut st);
    }

    /// [`Self::set_background`] (or, `epoll`, [`Self::set_epoll_background`])
    /// on when `watch`, then the look [`Self::show_now`] shows, under one
    /// take of the lock — if it is free now. Returns false, having done
    /// nothing, if another thread holds it: a call under way, or one whose
    /// thread faulted under it and never comes back, which a program's
    /// first `select` walking every socket must not wait for (the
    /// preload's `doorbell_wait` then finishes that socket on a thread of
    /// its own; review 47 item 2).
    pub fn try_watch_and_show(
        &self,
        watch: bool,
        epoll: bool,
        show: impl FnOnce(Readiness),
    ) -> bool {
        let Some(mut st) = self.try_lock_now() else {
            return false;
        };
        if watch {
            if epoll {
                st.epoll_background = true;
            } else {
                st.background = true;
            }
            self.rearm(&mut st);
        }
        show(Self::readiness_polled(&st));
        true
    }

    /// A `poll` of the program starts (`true`) or ends (`false`) waiting on
    /// this socket without watching [`Self::tcp_fd`] itself: the progress
    /// thread watches meanwhile. Counted; every start needs its end.
    pub fn poller(&self, on: bool) {
        let mut st = self.lock();
        if on {
            st.pollers += 1;
        } else {
            st.pollers = st.pollers.saturating_sub(1);
        }
        self.rearm(&mut st);
    }

    /// A non-blocking send found no credit, and the program will wait for
    /// writability: starts the wait ([`Self::set_writable_wait`]`(true)`),
    /// makes a round of progress (the credits may have come) and returns
    /// the readiness after it. Arrivals are then processed with no call of
    /// the program until the waiter ends the wait itself with
    /// `set_writable_wait(false)` — a writable round does not end it (since
    /// session 21; before, it did). The preload calls
    /// `set_writable_wait(true)` and [`Self::readiness`] instead, so that
    /// its gate and the wait change under one lock of its own.
    pub fn want_writable(&self) -> Readiness {
        let mut st = self.lock();
        self.writable_wait.store(true, Ordering::Relaxed);
        self.drive_now(&mut st);
        Self::readiness_polled(&st)
    }

    /// Starts (`true`) or ends (`false`) the program's wait for
    /// writability ([`Self::want_writable`] starts it too). Takes no lock:
    /// a waiter calls it under its own lock, wherever it applies a look
    /// (the preload: where its doorbell's write gate opens, which may be
    /// inside [`Self::set_on_progress`]'s callback). The watch follows at
    /// the next round.
    ///
    /// The wait is the waiter's to end, not a round's. A round that found
    /// the socket writable used to end it, but the look that says so can
    /// reach the waiter late or not at all: the preload skips a look older
    /// than one it applied, and a `poll` round that leaves input readable
    /// rings nothing. Another round in between (a receive that flushed a
    /// CREDIT) may have spent the credit again: the waiter's gate stayed
    /// shut, the watch was off, and the peer's next credit sat unread in
    /// the kernel while the program waited for `POLLOUT` alone (the
    /// preload's `stream` C case, 1 run in 6 with a 64 KiB send buffer
    /// under load; session 21).
    pub fn set_writable_wait(&self, on: bool) {
        self.writable_wait.store(on, Ordering::Relaxed);
    }

    /// Nothing, edge-triggered: the progress thread sleeps through input
    /// and output space. (An empty mask would report a hang-up or an
    /// error level-triggered, again and again.)
    pub const WATCH_OFF: u32 = libc::EPOLLET as u32;

    /// [`Self::WATCH_EVENTS`] without output space: what the progress
    /// thread watches while the engine holds nothing for the kernel.
    pub const WATCH_INPUT: u32 = (libc::EPOLLIN | libc::EPOLLRDHUP | libc::EPOLLET) as u32;

    /// Input, the peer's FIN, and *output space*, edge-triggered: while
    /// the engine holds bytes for a full send buffer. The engine writes
    /// what it can and keeps the rest queued; only a round of progress
    /// after the buffer drains sends it. Without `EPOLLOUT` a program
    /// waiting in `poll` for credits that the peer can only return after
    /// receiving those queued bytes would wait forever (the stream case's
    /// hang under load: the sender's last DATA messages sat in its engine
    /// while both programs polled).
    pub const WATCH_EVENTS: u32 =
        (libc::EPOLLIN | libc::EPOLLOUT | libc::EPOLLRDHUP | libc::EPOLLET) as u32;

    /// A round of progress for a program's `poll` that watched
    /// [`Self::tcp_fd`] and saw it ready, unless an application thread is
    /// driving the socket right now. One round: the engine reads a
    /// bounded amount, and a level-triggered `poll` reports what is left
    /// at once. Returns the readiness after it, or `None` if skipped.
    pub fn progress_for_poll(&self) -> Option<Readiness> {
        if self.parked() {
            return None;
        }
        let mut st = self.lock();
        if st.driving {
            return None;
        }
        self.count(&st, Count::PollRounds, 1);
        self.drive_now(&mut st);
        Some(Self::readiness_polled(&st))
    }

    /// A round of progress on an event of the socket's connection, made by
    /// a program's thread (an epoll wait's that watches the connection
    /// itself), unless an application thread is driving the socket right
    /// now (it processes what arrives, and a second reader would take
    /// bytes from under it). `reflect` is given the readiness after it
    /// under the socket's lock, as [`Self::set_on_progress`]'s callback
    /// is: a look taken there and shown after the lock's release could
    /// come after a receive that took the bytes and its own look — a
    /// doorbell rung for bytes already read, readable to an event loop
    /// whose read then failed with `EAGAIN` (wrk counted a read error and
    /// reconnected, ~1 run in 15 of 1 s; session 40). Returns whether the
    /// round was made (`false`: skipped).
    ///
    /// Edge-triggered callers lose nothing: the engine reads a bounded
    /// amount per round, so rounds repeat while the kernel still holds
    /// unread bytes (an edge comes only with new bytes). A round whose
    /// last read found the socket drained (`QpNews::rx_drained`: a short
    /// read, the usual case) ends it with no `FIONREAD` (what comes later
    /// is a new edge); otherwise the kernel is asked
    /// ([`super::Counters::rx_looks`]).
    ///
    /// Waits for the socket's lock: the progress thread, which serves
    /// every socket, makes its rounds with [`Self::progress_round`]
    /// instead, which never waits for it long.
    pub fn progress_if_idle(&self, reflect: impl FnOnce(Readiness)) -> bool {
        // A call parked in the engine reads what woke us when it wakes, and
        // tells others then. Skipping it here needs no lock: the flag is
        // cleared before that call's last round of progress, so an event
        // that saw it set is covered by that round.
        if self.parked() {
            return false;
        }
        let st = self.lock();
        self.round_locked(st, reflect)
    }

    /// [`Self::progress_if_idle`]'s round, the lock taken (`st`).
    pub(super) fn round_locked(
        &self,
        mut st: std::sync::MutexGuard<'_, State>,
        reflect: impl FnOnce(Readiness),
    ) -> bool {
        self.count(&st, Count::BgRounds, 1);
        // Bounded: a peer that sends faster than we process must not keep
        // the progress thread here forever (new bytes bring a new edge).
        for _ in 0..64 {
            if st.driving {
                return false;
            }
            self.drive_now(&mut st);
            if st.error.is_some() || st.news.is_some_and(|n| n.rx_drained) {
                break;
            }
            self.count(&st, Count::RxLooks, 1);
            if super::sys::readable(self.tcp_fd).unwrap_or(0) == 0 {
                break;
            }
        }
        reflect(Self::readiness_polled(&st));
        true
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use crate::io::test_pair::pair;
    use crate::io::{Readiness, XSocket};

    /// The stand-in timer's calls on the progress thread never wait for
    /// the socket's lock: held (for good, by a thread that faulted under
    /// it and exits), the deadline is asked again soon and the lapse is
    /// not done. Before, the progress thread waited there, and every other
    /// socket's progress with it. The bound only ends a hang.
    #[test]
    fn the_stand_in_timer_never_waits_for_a_held_lock() {
        let (_a, b) = pair();
        let (got, ()) = with_lock_held(
            &std::sync::Arc::new(b),
            |b| {
                let now = Instant::now();
                let asked = b.stand_expiry();
                (asked.map(|d| d >= now), b.stand_lapse(now))
            },
            |_| (),
        );
        assert_eq!(
            got.expect("the timer waited for the lock"),
            (Some(true), false)
        );
    }

    /// Runs `f` on another thread while this one holds `b`'s lock: its
    /// result if it came within 30 s (`None`: it waited for the lock; the
    /// bound only ends a hang), and what `look` saw of the state just
    /// before the lock was let go.
    fn with_lock_held<T: Send + 'static, L>(
        b: &std::sync::Arc<XSocket>,
        f: impl FnOnce(&XSocket) -> T + Send + 'static,
        look: impl FnOnce(&crate::io::socket::State) -> L,
    ) -> (Option<T>, L) {
        let held = b.st.lock().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let t = {
            let b = b.clone();
            std::thread::spawn(move || tx.send(f(&b)).unwrap())
        };
        let got = rx.recv_timeout(Duration::from_secs(30)).ok();
        let seen = look(&held);
        drop(held);
        t.join().unwrap();
        (got, seen)
    }

    /// Rounds made by `round` on `b` (the `ping` sent from `a` first) until
    /// one shows the socket readable; each must show it under the socket's
    /// lock (`round` gets the socket and the check to call with each look).
    fn until_shown_readable(round: impl Fn(&XSocket, &mut dyn FnMut(Readiness))) -> XSocket {
        let (a, b) = pair();
        a.send(b"ping", false, None).unwrap();
        let t = Instant::now();
        let mut readable = false;
        while !readable {
            assert!(
                t.elapsed() < Duration::from_secs(30),
                "the bytes never came"
            );
            round(&b, &mut |r| {
                assert!(b.st.try_lock().is_err(), "shown with the lock let go");
                readable = r.readable;
            });
            std::thread::yield_now();
        }
        b
    }

    /// A look taken now is shown under the socket's lock, with a round
    /// first or without: no receive on another thread can take the bytes
    /// between the look and the doorbell it rings (a switch's look at its
    /// end, shown after the program's first read had taken the response:
    /// wrk's `EAGAIN`, session 43). Fails with the look shown after the
    /// lock's release.
    #[test]
    fn a_look_taken_now_is_shown_under_the_sockets_lock() {
        let b = until_shown_readable(|b, show| b.show_after_round(&mut *show));
        let mut shown = None;
        b.show_now(|r| {
            assert!(b.st.try_lock().is_err(), "shown with the lock let go");
            shown = Some(r.readable);
        });
        assert_eq!(shown, Some(true));
    }

    /// The first wait's walk (`try_watch_and_show`) never waits for a held
    /// lock: held, it does nothing (no flag set, no look shown) and says
    /// so; free, it sets the background flag asked for and shows the look
    /// under the lock. Fails with the walk waiting (the bound only ends a
    /// hang) or half done.
    #[test]
    fn the_walks_try_never_waits_for_a_held_lock() {
        let b = until_shown_readable(|b, show| b.show_after_round(&mut *show));
        let b = std::sync::Arc::new(b);
        let (got, background) = with_lock_held(
            &b,
            |b| {
                let mut shown = false;
                (b.try_watch_and_show(true, false, |_| shown = true), shown)
            },
            |st| st.background,
        );
        assert_eq!(got.expect("the walk waited for the lock"), (false, false));
        assert!(!background, "flag set without the lock");
        for epoll in [false, true] {
            let mut shown = None;
            let done = b.try_watch_and_show(true, epoll, |r| {
                assert!(b.st.try_lock().is_err(), "shown with the lock let go");
                shown = Some(r.readable);
            });
            assert!(done);
            assert_eq!(shown, Some(true), "the look: the bytes are readable");
            let st = b.st.lock().unwrap();
            assert_eq!((st.background, st.epoll_background), (true, epoll));
        }
    }

    /// The progress thread's look is shown under the socket's lock: no
    /// receive can take the bytes between the look and the doorbell it
    /// rings (a bell for bytes already read: an event loop's `EAGAIN`).
    #[test]
    fn the_progress_rounds_look_is_reflected_under_the_sockets_lock() {
        until_shown_readable(|b, show| {
            let made = b.progress_if_idle(&mut *show);
            assert!(made, "no call drives the socket: the round is made");
        });
    }
}
