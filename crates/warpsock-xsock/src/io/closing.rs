//! The orderly close: the end of stream after every byte sent, then the
//! linger for the peer's FIN — blocking ([`XSocket::close`],
//! [`XSocket::linger_after_close`]) or in non-blocking steps
//! ([`XSocket::close_begin`], [`XSocket::close_step`]) for a thread that
//! closes many sockets at once (the preload's reaper: one slow peer must
//! not hold up the others' closes, and a thread per close was unbounded).
//! Both run the same decisions ([`Closing`]'s looks, sans-IO: what the
//! books say in, what to do out); only the waiting differs — the blocking
//! calls wait in the engine, a stepper polls [`XSocket::tcp_fd`] for
//! [`XSocket::close_events`] up to [`Closing::deadline`].

use std::sync::atomic::Ordering;
use std::sync::MutexGuard;
use std::time::{Duration, Instant};

use super::sndbuf::reset;
use super::socket::{State, XSocket};

/// Where a close stands ([`Closing::phase`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Bytes sent and the end of stream are leaving (as credits come
    /// back); the bound is the linger, started again while they leave.
    Sending,
    /// They left, or the close gave up on them; the engine's socket stays
    /// open, the peer's input discarded, until the peer's FIN or the
    /// linger ([`XSocket::linger_after_close`] says why).
    Lingering,
    /// Over: the socket may be dropped (its engine's socket closes then).
    Done,
}

/// How a program's close began ([`XSocket::close_begin_or_reset`]).
#[derive(Debug)]
pub enum Begun {
    /// The orderly close, to step ([`XSocket::close_step`]).
    Orderly(Closing),
    /// Received bytes were left unread: the connection resets as the
    /// socket drops (its `SO_LINGER` is 0 now).
    Reset,
}

/// An orderly close made in steps ([`XSocket::close_step`]).
#[derive(Debug)]
pub struct Closing {
    linger: Duration,
    deadline: Instant,
    /// The stream's send sequence at the last look: progress starts the
    /// bound again.
    sent: u64,
    phase: Phase,
    /// How [`Phase::Sending`] ended: every byte and the end of stream
    /// left (`true`), or the close gave up on them.
    all_left: Option<bool>,
}

/// What the books say while sending ([`Closing::look_sending`]).
#[derive(Debug, Clone, Copy)]
struct SendLook {
    /// Nothing left to send: no output owed, every transmit slot free, no
    /// send queued.
    idle: bool,
    /// The connection failed or the peer's FIN closed it.
    over: bool,
    /// The stream's send sequence.
    seq: u64,
    /// Sends queued (bytes send calls returned for, never sent).
    queued: bool,
}

/// What to do after a look while sending.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Act {
    /// Wait (for the engine, or until the deadline).
    Wait,
    /// Sending is over: `reset` the connection first (bytes lost) if so,
    /// then disconnect (the engine's FIN after what it holds). `idle`:
    /// everything left.
    Finish { idle: bool, reset: bool },
}

impl Closing {
    fn new(linger: Duration, now: Instant, sent: u64) -> Self {
        Self {
            linger,
            deadline: now + linger,
            sent,
            phase: Phase::Sending,
            all_left: None,
        }
    }

    /// Where the close stands.
    pub fn phase(&self) -> Phase {
        self.phase
    }

    /// When the phase's bound ends (moved later while bytes leave): the
    /// latest time to step again.
    pub fn deadline(&self) -> Instant {
        self.deadline
    }

    /// Once sending is over: whether every byte and the end of stream left
    /// (`false`: given up on, the connection reset if bytes were lost).
    pub fn all_left(&self) -> Option<bool> {
        self.all_left
    }

    /// The sending phase's decision: over when nothing is left or the
    /// connection is; the bound starts again with progress; at the bound,
    /// a reset if sends are still queued (their bytes were never sent: the
    /// peer must not read a clean end after a short stream; review
    /// r20-xbuf S2).
    fn look_sending(&mut self, l: SendLook, now: Instant) -> Act {
        if l.idle || l.over {
            return Act::Finish {
                idle: l.idle,
                reset: false,
            };
        }
        if l.seq != self.sent {
            self.sent = l.seq;
            self.deadline = now + self.linger;
        }
        if now >= self.deadline {
            return Act::Finish {
                idle: false,
                reset: l.queued,
            };
        }
        Act::Wait
    }

    /// Sending ended (`idle`: all left): the linger for the peer's FIN
    /// begins, its bound the linger.
    fn lingering(&mut self, idle: bool, now: Instant) {
        self.all_left = Some(idle);
        self.phase = Phase::Lingering;
        self.deadline = now + self.linger;
    }

    /// The linger's decision: over at the peer's FIN (`closed`: the TCP
    /// connection is finished both ways) or at the bound.
    fn look_lingering(&mut self, closed: bool, now: Instant) -> bool {
        if closed || now >= self.deadline {
            self.phase = Phase::Done;
        }
        self.phase == Phase::Done
    }
}

/// `attempt` until it gives `Some`, tried again (yielding between) until
/// `patience` passed: one try with a patience of zero.
fn within<T>(patience: Duration, mut attempt: impl FnMut() -> Option<T>) -> Option<T> {
    let end = Instant::now().checked_add(patience);
    loop {
        if let Some(t) = attempt() {
            return Some(t);
        }
        if end.is_none_or(|e| Instant::now() >= e) {
            return None;
        }
        std::thread::yield_now();
    }
}

impl XSocket {
    /// Orderly close: the end of stream goes after everything sent; waits
    /// up to `linger` for it to leave (a peer that stopped reading may hold
    /// it up), then disconnects. Returns whether everything left in time.
    ///
    /// The linger bounds a close that makes no progress: while stream bytes
    /// leave (the peer reads, credits come back) it starts again. One that
    /// gives up with bytes still queued — sends returned, never sent —
    /// resets the connection: the peer gets `ECONNRESET`, not a clean end
    /// after a short stream (review r20-xbuf S2; `io/sndbuf.rs`).
    pub fn close(&self, linger: Duration) -> bool {
        let mut st = self.lock();
        let mut c = self.begin_locked(&mut st, linger, Instant::now());
        loop {
            self.drive_now(&mut st);
            match c.look_sending(self.send_look(&st), Instant::now()) {
                Act::Wait => {
                    // A close is not interrupted (its bound is the linger
                    // time).
                    st = self.wait(st, Some(c.deadline));
                }
                Act::Finish { idle, reset } => {
                    drop(st);
                    self.finish_sending(reset);
                    return idle;
                }
            }
        }
    }

    /// After [`Self::close`]: keeps the engine's socket open, driving it
    /// (the peer's input discarded), until the peer's FIN or `bound`, as
    /// the engine's own linger does for a dropped queue pair
    /// ([`warpsock_engine::Qp`]'s drop). That linger needs progress, and
    /// this socket's context is its own and caller-driven: dropping the
    /// socket drops the context, which closes the engine's socket at once.
    /// A peer still reading our last messages returns credits for them
    /// (every fourth), and a closed TCP socket answers them with a reset:
    /// our kernel drops what it had not sent yet (the peer's receive
    /// window held it back), and the peer's engine fails (`ECONNRESET`, or
    /// `EPIPE` once our FIN is in) before it read the rest and our end of
    /// stream (task xclose: the benchmark's bidirectional DDP-socket test,
    /// about 1 run in 13 in CI). Over TCP the reader sends nothing back
    /// but acknowledgements, which a closed socket absorbs. Each wait is
    /// a slice (50 ms: input the engine discards ends no wait), so the
    /// look at the FIN may come that much after it. Returns whether the
    /// peer's FIN came.
    pub fn linger_after_close(&self, bound: Duration) -> bool {
        let now = Instant::now();
        let mut c = Closing::new(bound, now, 0);
        c.lingering(true, now);
        let mut st = self.lock();
        loop {
            if c.look_lingering(self.qp.is_closed(), Instant::now()) {
                return self.qp.is_closed();
            }
            // Not interrupted either (bounded by `bound`).
            st = self.wait(st, Some(c.deadline));
        }
    }

    /// Whether the socket holds received bytes no read took — unread
    /// stream bytes in the receive slots (a message-mode part held for
    /// its end included) or the residue of the switch — after a round of
    /// progress, which takes in what the engine's socket holds (the
    /// peer's DATA there is bytes received, as in TCP's receive queue;
    /// its credit returns and other control messages are not). A close
    /// that finds some resets the connection, as Linux's `tcp_close`
    /// (`data_was_unread`: RST, not FIN; RFC 2525 §2.17): the peer must
    /// not take a request dropped unread for a clean end. Not once both
    /// streams ended (our `SHUT_WR`, the peer's end): TCP's socket is
    /// CLOSED then, and `tcp_close` sends nothing (diffuzz seeds 57 and
    /// 110: the peer got `ECONNRESET` where TCP's got nothing).
    pub fn unread(&self) -> bool {
        self.unread_locked(&mut self.lock())
    }

    fn unread_locked(&self, st: &mut MutexGuard<'_, State>) -> bool {
        self.drive_now(st);
        !st.streams_ended() && st.residue.len() - st.residue_off + st.s.readable() > 0
    }

    /// The low bit of a driver's wait's owner word
    /// ([`warpsock_engine::asleep::owned`]), set for a send call's wait;
    /// the rest is the socket's [`Self::wait_word`] (every driver's wait).
    pub(crate) const OWNER_SENDING: usize = 1;

    /// The word every wait of this socket's calls names in its sleeps'
    /// marks ([`warpsock_engine::asleep::Slept::owner`], its low bit
    /// cleared: set, a send's). Even, non-zero and the process's only
    /// socket's: not its address, which a later socket may take once this
    /// one is gone (a mark left by a `siglongjmp` out of a sleep would then
    /// name that socket: review r27-b item 4).
    pub fn wait_word(&self) -> usize {
        self.word
    }

    /// An exit in a signal handler over this thread's wait on this socket
    /// (`slept`: [`warpsock_engine::asleep::abandon`]'s), which never comes
    /// back: the engine's parked read gives the reading side back
    /// ([`warpsock_engine::Cq::abandon_park`]), and the wait's marks go —
    /// the socket no longer driven nor parked, a send call's no longer
    /// counted (`sending`: else no flush or rearm but the call's) — so
    /// that rounds, the progress thread's included, and the exit's close
    /// read and write it again. `false`: the wait was not this socket's.
    /// The socket's lock is tried for 2 ms at most: not had, its marks
    /// stay (the close's steps drive it whatever they say). A wait is
    /// this socket's only if its owner word is this socket's
    /// ([`Self::wait_word`]): every driver's wait names its socket, a
    /// parked read's too; a stale mark (a `siglongjmp` out of the sleep
    /// left it) of a socket gone since names none (review r27-b item 4:
    /// with the address as the word, and the park's context key, also an
    /// address, the undo took a live socket's marks at that address).
    pub fn abandon_wait(&self, slept: warpsock_engine::asleep::Slept) -> bool {
        if slept.owner() & !Self::OWNER_SENDING != self.word {
            return false;
        }
        self.cq.abandon_park(slept);
        let end = Instant::now() + Duration::from_millis(2);
        loop {
            if let Some(mut st) = self.try_lock_now() {
                st.driving = false;
                self.parked.store(false, Ordering::Release);
                if slept.owner() & Self::OWNER_SENDING != 0 {
                    st.sending = st.sending.saturating_sub(1);
                    if st.sending == 0 {
                        self.rearm(&mut st);
                    }
                }
                self.wake(&st);
                return true;
            }
            if Instant::now() >= end {
                return true;
            }
            std::thread::sleep(Duration::from_micros(100));
        }
    }

    /// Begins an orderly close made in non-blocking steps: the end of
    /// stream is queued behind everything sent (as [`Self::close`]);
    /// `linger` bounds each phase as there. Then [`Self::close_step`]
    /// until it says [`Phase::Done`], each time [`Self::tcp_fd`] is ready
    /// for [`Self::close_events`] (a `poll`), and at [`Closing::deadline`]
    /// at the latest. Same bytes on the wire as [`Self::close`] then
    /// [`Self::linger_after_close`].
    pub fn close_begin(&self, linger: Duration, now: Instant) -> Closing {
        let mut st = self.lock();
        self.begin_locked(&mut st, linger, now)
    }

    /// A program's close as Linux's `tcp_close` makes it: a reset if
    /// received bytes are unread ([`Self::unread`]; `SO_LINGER` 0 is set,
    /// so the socket's drop resets the connection), else the orderly
    /// close begun ([`Self::close_begin`]). One look under one take of the
    /// socket's lock: bytes that arrive after it come after the close's
    /// "shut both ways" point and reset the connection
    /// (`XSocket::data_after_shutdown`). Two takes — the look, then the
    /// begin — let a round between them (the progress thread's) take in
    /// bytes that were then neither read nor answered with a reset
    /// (helper 61's review).
    pub fn close_begin_or_reset(&self, linger: Duration, now: Instant) -> Begun {
        self.begin_or_reset(&mut self.lock(), linger, now)
    }

    /// [`Self::close_begin_or_reset`] if the socket's lock is free now,
    /// else `None` and nothing done (one try: the caller retries, a
    /// bounded while — an exit, whose own thread or another stopped one
    /// may hold it for good).
    pub fn try_close_begin_or_reset(&self, linger: Duration, now: Instant) -> Option<Begun> {
        Some(self.begin_or_reset(&mut self.try_lock_now()?, linger, now))
    }

    fn begin_or_reset(
        &self,
        st: &mut MutexGuard<'_, State>,
        linger: Duration,
        now: Instant,
    ) -> Begun {
        if self.unread_locked(st) {
            reset(self.tcp_fd);
            Begun::Reset
        } else {
            Begun::Orderly(self.begin_locked(st, linger, now))
        }
    }

    /// One non-blocking step of a close ([`Self::close_begin`]): a round
    /// of progress (the engine reads what its socket holds, a bounded
    /// amount, and writes what it can), then the look of the phase — the
    /// end of sending (then disconnect, and the linger begins at once) or
    /// of the linger. Returns the phase after it.
    pub fn close_step(&self, c: &mut Closing, now: Instant) -> Phase {
        self.close_step_with(c, now, || Some(self.lock()))
            .unwrap_or(c.phase)
    }

    /// [`Self::close_step`] if the socket's lock is free now, else `None`
    /// and no step (as [`Self::try_close_begin_or_reset`]).
    pub fn try_close_step(&self, c: &mut Closing, now: Instant) -> Option<Phase> {
        self.close_step_with(c, now, || self.try_lock_now())
    }

    fn close_step_with<'a>(
        &'a self,
        c: &mut Closing,
        now: Instant,
        lock: impl Fn() -> Option<MutexGuard<'a, State>>,
    ) -> Option<Phase> {
        if c.phase == Phase::Sending {
            let mut st = lock()?;
            self.drive_now(&mut st);
            match c.look_sending(self.send_look(&st), now) {
                Act::Wait => return Some(c.phase),
                Act::Finish { idle, reset } => {
                    drop(st);
                    self.finish_sending(reset);
                    c.lingering(idle, now);
                    // The FIN may be in already: looked at below.
                }
            }
        } else if c.phase == Phase::Lingering {
            let mut st = lock()?;
            self.drive_now(&mut st);
        }
        if c.phase == Phase::Lingering {
            c.look_lingering(self.qp.is_closed(), now);
        }
        Some(c.phase)
    }

    /// Ends a close at once (a stepper's cap on the closes it holds): one
    /// still sending gives up as at its bound (a reset if sends are still
    /// queued, then the disconnect); a lingering one stops lingering. The
    /// caller drops the socket then, which closes the engine's socket.
    pub fn close_cut(&self, c: &mut Closing) {
        self.close_cut_with(c, || Some(self.lock()));
    }

    /// [`Self::close_cut`] if the socket's lock is free now, else `false`
    /// and nothing done (as [`Self::try_close_begin_or_reset`]).
    pub fn try_close_cut(&self, c: &mut Closing) -> bool {
        self.close_cut_with(c, || self.try_lock_now())
    }

    fn close_cut_with<'a>(
        &'a self,
        c: &mut Closing,
        lock: impl FnOnce() -> Option<MutexGuard<'a, State>>,
    ) -> bool {
        if c.phase == Phase::Sending {
            // Anything still unsent — sends queued, messages in transmit
            // slots, the engine's backlog, our end of stream — is lost as
            // the caller drops the socket at once (no linger drives it
            // out), and the kernel's close would end the stream with a
            // FIN the peer reads as a clean end after a short stream: a
            // reset instead (review r25-a item 5; r20-xbuf S2).
            let lost = {
                let Some(st) = lock() else {
                    return false;
                };
                !self.send_look(&st).idle || self.qp.send_backlog() > 0
            };
            self.finish_sending(lost);
            c.all_left = Some(false);
        }
        c.phase = Phase::Done;
        true
    }

    /// The `poll` events a stepped close waits for on [`Self::tcp_fd`]:
    /// input (credits, the peer's FIN, bytes to discard), and output space
    /// while the engine holds bytes behind a full kernel send buffer
    /// ([`warpsock_engine::Qp::send_backlog`]). Errors and hang-ups are
    /// reported whatever is asked. No input once the engine read the
    /// peer's FIN: the socket stays readable (EOF) for good, and a stepper
    /// asking for it would wake at once every round — a spin until the
    /// backlog drains or the linger ends (review r25-a item 4); the
    /// deadline and the stepper's sweep cover what follows.
    pub fn close_events(&self) -> i16 {
        let input = if self.read_closed() { 0 } else { libc::POLLIN };
        if self.qp.send_backlog() > 0 {
            input | libc::POLLOUT
        } else {
            input
        }
    }

    /// Whether the engine has read the end of the peer's byte stream (its
    /// FIN) or the connection is over ([`warpsock_engine::Qp::read_closed`]).
    pub fn read_closed(&self) -> bool {
        self.qp.read_closed()
    }

    /// The program's close, in its own call, before it returns: the
    /// memory it handed over becomes its own again
    /// (`rio::detach_program_memory`). A close finished elsewhere later
    /// (the preload's reaper: `close(2)` returns at once) must make this
    /// first — by then the program may have freed that memory (session
    /// 55's CI: ASan saw the reaper copy a mapping the program had freed
    /// after its close). `None`: the socket's lock is taken now (a signal
    /// handler's close over a call holding it), nothing done; the close's
    /// start does it then. Once per socket.
    pub fn try_detach_program_memory(&self) -> Option<()> {
        let mut st = self.try_lock_now()?;
        self.detach_locked(&mut st);
        Some(())
    }

    /// [`Self::try_detach_program_memory`], tried again while another
    /// thread holds the socket's lock, until `patience` passed: a round of
    /// the progress thread (a socket with mappings is its), a look of
    /// another thread's, hold it a moment. One try gave up on them, and
    /// the close's start did the detach later, in the reaper — after the
    /// program may have freed or unmapped the memory the copy reads.
    /// Returns whether the memory is detached; with a `patience` of zero,
    /// one try (a caller that may hold the lock itself: a signal
    /// handler's close over a call).
    pub fn detach_program_memory_within(&self, patience: Duration) -> bool {
        within(patience, || self.try_detach_program_memory()).is_some()
    }

    /// [`Self::try_close_begin_or_reset`], tried again while another
    /// thread holds the socket's lock, until `patience` passed (as
    /// [`Self::detach_program_memory_within`]); `None`: not begun. The
    /// program's close begins here, in its own call: the unread look and
    /// the close's point (bytes that come after it reset the connection,
    /// `XSocket::data_after_shutdown`) are then the close's instant's. A
    /// close begun later by the preload's reaper took the peer's bytes
    /// sent after the program's close for bytes left unread, and reset
    /// with no end of stream: the peer, whose end of stream had come
    /// first over TCP, read `ECONNRESET` where TCP's read 0 (diffuzz seed
    /// 3650).
    pub fn close_begin_or_reset_within(
        &self,
        linger: Duration,
        patience: Duration,
    ) -> Option<Begun> {
        within(patience, || {
            self.try_close_begin_or_reset(linger, Instant::now())
        })
    }

    fn detach_locked(&self, st: &mut State) {
        if std::mem::replace(&mut st.detached, true) {
            return;
        }
        if !super::rio::detach_program_memory(self, st) {
            self.fail(
                st,
                libc::ENOMEM,
                "the close could not copy what it still sends from the program's memory".into(),
            );
            reset(self.tcp_fd);
            super::rio::forget_program_memory(self, st);
        }
    }

    fn begin_locked(&self, st: &mut State, linger: Duration, now: Instant) -> Closing {
        st.s.mark_closing();
        self.detach_locked(st);
        super::rio::shut_write(self, st);
        // Closed: shut both ways (bytes that come now reset the
        // connection, as at TCP's closed socket). Before the flush below,
        // whose reap may take in completions: the point is the close's.
        Self::shut_both(st);
        // Our end of stream (or the late word of a close after it) out
        // now, in the close's own call, as TCP's FIN goes with `close`:
        // left to the first step (the preload's reaper, later), a peer's
        // bytes sent meanwhile met the close first, and their reset
        // purged it from our kernel's queue — the peer read `ECONNRESET`
        // where TCP's read its end of stream first (diffuzz seed 3650).
        self.flush(st);
        Closing::new(linger, now, st.s.tx_seq())
    }

    fn send_look(&self, st: &State) -> SendLook {
        let tx_slots = self.tx.len() / self.opts.slot_size as usize;
        SendLook {
            // Zero-copy calls that returned at their timeout (`orphans`)
            // still have requests queued: their bytes are the stream's.
            idle: !st.s.has_output()
                && st.tx_free.len() == tx_slots
                && !st.aio.sends_queued()
                && st.orphans.is_empty(),
            over: st.over(),
            seq: st.s.tx_seq(),
            queued: st.aio.sends_queued(),
        }
    }

    /// Sending is over: the reset first if bytes were lost, then the
    /// engine's disconnect (its FIN after the bytes it holds).
    fn finish_sending(&self, lost: bool) {
        if lost {
            reset(self.tcp_fd);
        }
        self.qp.disconnect();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const L: Duration = Duration::from_millis(100);

    fn look(idle: bool, over: bool, seq: u64, queued: bool) -> SendLook {
        SendLook {
            idle,
            over,
            seq,
            queued,
        }
    }

    /// Progress starts the bound again; with none, the bound ends the
    /// sending phase — a reset only with sends still queued.
    #[test]
    fn sending_ends_at_its_bound_restarted_by_progress() {
        let t0 = Instant::now();
        let mut c = Closing::new(L, t0, 5);
        assert_eq!(
            c.look_sending(look(false, false, 5, true), t0 + L / 2),
            Act::Wait
        );
        assert_eq!(
            c.look_sending(look(false, false, 9, true), t0 + L),
            Act::Wait
        );
        assert_eq!(c.deadline(), t0 + 2 * L, "moved to the progress' look + L");
        assert_eq!(
            c.look_sending(look(false, false, 9, true), t0 + 2 * L),
            Act::Finish {
                idle: false,
                reset: true
            }
        );
        let mut c = Closing::new(L, t0, 5);
        assert_eq!(
            c.look_sending(look(false, false, 5, false), t0 + L),
            Act::Finish {
                idle: false,
                reset: false
            },
            "nothing queued: nothing lost"
        );
    }

    /// Everything left, or the connection is over: finished at once.
    #[test]
    fn sending_ends_when_idle_or_over() {
        let t0 = Instant::now();
        let mut c = Closing::new(L, t0, 0);
        assert_eq!(
            c.look_sending(look(true, false, 0, false), t0),
            Act::Finish {
                idle: true,
                reset: false
            }
        );
        assert_eq!(
            c.look_sending(look(false, true, 0, true), t0),
            Act::Finish {
                idle: false,
                reset: false
            }
        );
    }

    /// A mark left by a wait on a socket gone since (a `siglongjmp` out of
    /// the sleep) names no later socket, not even one at the gone one's
    /// address: an exit's undo over it leaves that socket's marks — another
    /// thread's send asleep on it, its driving — alone (review r27-b item
    /// 4). The socket's own wait's mark still undoes them.
    #[test]
    fn a_gone_sockets_wait_names_no_later_socket_at_its_address() {
        use warpsock_engine::asleep;
        let mark = |word: usize| {
            asleep::owned(word | XSocket::OWNER_SENDING, || {
                asleep::unlocked(|| asleep::slept().expect("marked"))
            })
        };
        let (a, _a_peer) = crate::io::test_pair::pair();
        let (b, _b_peer) = crate::io::test_pair::pair();
        let mut home = Box::new(a);
        let at = &*home as *const XSocket;
        let stale = mark(home.wait_word());
        // `a` is dropped, `b` takes its place: the same address.
        *home = b;
        assert_eq!(&*home as *const XSocket, at);
        let set = |x: &XSocket| {
            let mut st = x.lock();
            st.sending = 1;
            st.driving = true;
            x.parked.store(true, Ordering::Release);
        };
        let marks = |x: &XSocket| {
            let st = x.lock();
            (st.sending, st.driving, x.parked.load(Ordering::Acquire))
        };
        set(&home);
        assert!(!home.abandon_wait(stale), "the gone socket's wait");
        assert_eq!(marks(&home), (1, true, true), "left alone");
        assert!(home.abandon_wait(mark(home.wait_word())));
        assert_eq!(marks(&home), (0, false, false), "its own wait's undone");
    }

    /// The linger has a bound of its own from the end of sending, and ends
    /// at the peer's FIN before it.
    #[test]
    fn the_linger_ends_at_the_fin_or_its_bound() {
        let t0 = Instant::now();
        let mut c = Closing::new(L, t0, 0);
        c.lingering(true, t0 + L);
        assert_eq!(c.phase(), Phase::Lingering);
        assert_eq!(c.all_left(), Some(true));
        assert!(!c.look_lingering(false, t0 + L + L / 2));
        assert!(c.look_lingering(false, t0 + 2 * L));
        assert_eq!(c.phase(), Phase::Done);
        let mut c = Closing::new(L, t0, 0);
        c.lingering(false, t0);
        assert!(c.look_lingering(true, t0));
    }
}
