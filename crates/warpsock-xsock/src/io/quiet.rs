//! A busy-polling receive of a quiet socket (issue 12): a non-blocking
//! receive that finds nothing costs the preload's entry, the socket's lock
//! taken without its bookkeeping, and the engine's read of its TCP socket
//! alone (`Cq::read_if_idle`) — not the short round of `io/wait.rs` (~950
//! instructions: the receive's general loop, the engine's news, the
//! settle and the watch's rearm). Host TCP's empty spin is the libc call
//! and one system call; every spin longer than that delays seeing the
//! answer by half a spin on average, on each side, every round trip. The
//! read that brings the answer is the receive's: what it took in is
//! serviced under the engine's same lock and copied to the program under
//! the socket's same lock ([`XSocket::recv_quiet`]). Session 22's spin
//! `ppoll`ed the engine's socket without any lock and then made the usual
//! receive, so an answer cost two system calls where host TCP's costs one
//! (~225 ns each on this host) and two engine rounds (BENCHMARKS §6,
//! session 23). The first spin after a call that took the lock still
//! makes its round, which finds the socket quiet — but after a straight
//! send that left nothing behind (a ping-pong's send), which leaves the
//! socket quiet itself (below).
//!
//! `XSocket::quiet` says that nothing but bytes (EOF, an error) on the
//! engine's TCP socket can make a receive return anything else than
//! `EAGAIN`. It is set by an empty round (`XSocket::set_quiet`) under
//! the socket's lock, when the engine's round was its short empty one
//! ([`warpsock_engine::Cq::poll_news_idle`]: nothing staged, held, reported,
//! queued for output or completed; the queue pair alone in its context),
//! the socket's end of the round was its rearm alone (`settled`: no
//! event, no asynchronous operation in flight, no control message owed)
//! and the books hold nothing for a reader, nor an end, an error or a
//! shut reading side, with no other thread in the engine (`driving`). It
//! is cleared by every take of the lock (`XSocket::lock`, and the
//! waiting thread's re-take in `wait_for_driver`): every writer of what it
//! sums up — a send, a post, a shutdown, a round of the progress thread,
//! a waiting call's engine round — takes the lock first, so no change can
//! happen while it is set. Looks that write nothing (a vectored receive's
//! readiness after its round, `readiness_now`, `readable_bytes`) take it
//! with `XSocket::lock_look`, which leaves the flag (review r22-c item 2).
//!
//! A straight send sets it again as it ends (`XSocket::set_quiet_sent`,
//! under the lock it took): a one-FPDU DATA message the engine built and
//! wrote inline and whole (`send_inline`: no send request, so no
//! completion now or later), its news (the engine's after the write)
//! with no backlog and no event, nothing posted and left unreaped, no
//! other send call in its course, the books' terms above (the send
//! changed none of them: `tx_straight` leaves nothing owed) and the books
//! still writable. What such a send changes — a credit of the peer's
//! taken, our unreturned slots returned with the DATA, the send sequence,
//! the engine's MSN and the bytes written — is no input to a receive. The
//! engine's own state is not the send's to vouch for (the round's
//! `idle_round` term): the spin's read makes the short round only where
//! the engine has nothing staged, held, reported, queued for output or
//! completed (`Cq::read_quiet`), and the full round otherwise, whose
//! result the spin takes the usual way. A send that leaves anything behind
//! leaves the flag down: bytes the kernel did not take (the engine's
//! backlog: its next transmit pass's), a message from a transmit slot (a
//! Send with a completion, reaped or not), an event, the last credit it
//! may use taken (conservative: the next send then waits on the peer's
//! CREDIT), any send the straight path declines (a message longer than
//! a slot or `zcopy_min`, a send behind queued ones: the general path,
//! after which only a round sets it). A small vectored send is straight
//! (one message of its parts, inline) and keeps it. A blocking reader's
//! send (the socket's last one-buffer receive could block,
//! `State::rx_blocks`) leaves it down too: that reader's next receive
//! blocks and never spins, and the flag only cost its send the terms and
//! the preload's receive a frame (~55 instructions a blocking 8 B round
//! trip and process); a non-blocking receive puts it back. Unless the
//! socket busy-polls (`Options::busy_poll`): a blocking reader's receive
//! then spins on the same read first ([`XSocket::recv_busy`]), so its
//! send sets the flag as a non-blocking reader's does.
//! `tests/quiet_send.rs`.
//!
//! A receive that sees it set tries the lock (a thread that holds it is
//! working: the receive goes the usual way after it), looks at the flag
//! again under it (a thread that took and left the lock since cleared
//! it), and makes the engine's short empty round again: its read, the
//! engine's own (an end or an error it meets is the engine's to handle —
//! a `ppoll` or a peek would see a reset the read must then report; a
//! peek also clears the socket's error). Nothing there: `EAGAIN`, the
//! flag and the books untouched. Anything there — bytes, EOF, an error —
//! and the engine services it at once; the flag goes down (the books
//! change) and the receive takes the completions as `drive_take` does,
//! then, unless a DATA message went straight into the buffer, goes on
//! in the general loop under the same lock. No other reader of the
//! engine's socket can be at work meanwhile: each takes the lock first (a
//! call's round, the progress thread's), which cleared the flag — also a
//! wait that then reads with the lock released (`driving`), while which
//! the flag is never set and which the spin checks as well.
//!
//! The predicted receive (issue 12): when that read brings exactly one
//! whole FPDU — a one-FPDU Send into the head receive (our oldest posted
//! slot), one DATA message that fits the program's one buffer, in a plain
//! receive (not a peek, not `MSG_WAITALL`) — it is taken where the
//! engine's read put it ([`warpsock_engine::QuietRead::predict`]): the
//! core advances as its straight path would and posts the receive again
//! in place, the books count the DATA read and its slot posted
//! (`take_predicted`), and the bytes go from the read straight into the
//! program's buffer. No completion, no service round, no copy into the
//! slot, no repost call. The rest of the call is the usual take's
//! (`predicted_taken`: the counts, the receive-only end's RTO, `settle`
//! — a CREDIT now due goes there). Everything else — a part of an FPDU,
//! two FPDUs, a CRC that does not match, another kind of FPDU, a
//! CREDIT, a buffer too small, a message-mode part — is the usual
//! path's, unchanged.
//!
//! No bound on the quiet spins in a row (as `FULL_ROUND` bounds the
//! short rounds): the flag is down whenever any of its inputs may change,
//! and a bound would hide a missing term from the tests, which then pass
//! by waiting (`tests/spin.rs` spins through [`XSocket::recv_quiet`] as
//! the preload does).

use std::sync::atomic::Ordering;
use std::sync::MutexGuard;
use std::time::{Duration, Instant};

use warpsock_engine::{QpNews, Wc};

use super::settings::{Count, Readiness, RecvFlags};
use super::socket::{State, XSocket, WCS};

/// Empty reads of [`XSocket::recv_busy`]'s spin between two yields of the
/// CPU.
const YIELD_EVERY: u32 = 16;

/// What [`XSocket::recv_quiet`] did.
#[derive(Debug)]
pub enum Spun {
    /// Nothing came: the receive returns `EAGAIN` (the socket stays quiet).
    Empty,
    /// The receive was made: its result and the readiness it left.
    Done(std::io::Result<(usize, bool)>, Readiness),
    /// Make the receive as usual.
    Usual,
}

impl XSocket {
    /// A non-blocking receive of a quiet socket (`flags.nonblocking`; an
    /// empty list of buffers goes the usual way): [`Spun::Empty`] when the engine's read of its TCP
    /// socket found nothing (the call returns `EAGAIN`); what it brought
    /// taken in and the receive made, under the same lock
    /// ([`Spun::Done`], one buffer), or processed into the books for the
    /// usual receive ([`Spun::Usual`], several); `Usual` also when the
    /// socket is not quiet or another thread holds its lock.
    #[inline]
    pub fn recv_quiet(&self, bufs: &mut [&mut [u8]], flags: RecvFlags) -> Spun {
        debug_assert!(flags.nonblocking);
        if !self.quiet.load(Ordering::Acquire) || bufs.is_empty() {
            return Spun::Usual;
        }
        self.recv_quiet_locked(bufs, flags)
    }

    /// A blocking receive with busy polling ([`super::Options::busy_poll`],
    /// the preload's `WARPSOCK_BUSY_POLL_US`), `timeout` as
    /// [`Self::recv_vectored_ready`]'s: a quiet socket's spin is the
    /// engine's read alone ([`Self::recv_quiet`], as a busy-polling
    /// program's own non-blocking spin is), for up to the busy poll; if
    /// nothing came, the usual blocking receive follows, whose wait sleeps
    /// without spinning again ([`warpsock_engine::spun::after_spin`]).
    /// The engine's own spin (its wait's rounds: the lock, a round, the
    /// drain, the clock and a `sched_yield` per spin) made a blocking
    /// 8 B ping-pong with `WARPSOCK_BUSY_POLL_US=50` ~4 % slower per round
    /// trip than the same program spinning on non-blocking reads (BENCHMARKS
    /// §6, sessions 33 and 35).
    ///
    /// Anything else is the usual blocking receive at once, its wait
    /// spinning as the engine's does: no busy poll, a zero timeout (one
    /// that expires at once), `MSG_WAITALL` (the
    /// quiet read returns what came, not a full buffer), a socket not
    /// quiet, or made busy by what the read brought without a message for
    /// the call (a credit return: `EAGAIN` from the quiet read) — such a
    /// call may spin up to twice the busy poll in all.
    ///
    /// The timeout (`SO_RCVTIMEO`) counts from the spin's end, as Linux's
    /// busy poll (`SO_BUSY_POLL`) runs before the receive's wait and its
    /// timeout. A signal whose handler runs during the spin does not end
    /// the call, as in the engine's spin (`warpsock_engine::Cq::wait_news`).
    pub fn recv_busy(
        &self,
        bufs: &mut [&mut [u8]],
        flags: RecvFlags,
        timeout: Option<Duration>,
    ) -> (std::io::Result<(usize, bool)>, Readiness) {
        debug_assert!(!flags.nonblocking);
        let spin = self.opts.busy_poll;
        // A zero timeout expires at once: no spin.
        let expires_now = timeout.is_some_and(|t| t.is_zero());
        if !spin.is_zero() && !flags.waitall && !bufs.is_empty() && !expires_now {
            let quiet = RecvFlags {
                nonblocking: true,
                ..flags
            };
            // The clock is read once the first read came up empty (an
            // answer found at once reads none), as the engine's spin does.
            let mut until = None;
            let mut empty = 0u32;
            loop {
                match self.recv_quiet(bufs, quiet) {
                    Spun::Empty => {}
                    Spun::Done(Err(e), _) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                    Spun::Done(r, ready) => return (r, ready),
                    Spun::Usual => break,
                }
                let now = Instant::now();
                if now >= *until.get_or_insert(now + spin) {
                    return warpsock_engine::spun::after_spin(|| {
                        self.recv_vectored_ready(bufs, flags, timeout)
                    });
                }
                // A yield now and then: free when this CPU has nothing
                // else to run, and lets a peer (or the thread that would
                // send the answer) sharing the CPU run before the spin
                // ends, as the engine's spin yields every round (a
                // ping-pong's answer comes within the first few reads,
                // which yield never; helper 32's review).
                empty += 1;
                if empty.is_multiple_of(YIELD_EVERY) {
                    std::thread::yield_now();
                }
            }
        }
        self.recv_vectored_ready(bufs, flags, timeout)
    }

    /// Whether blocking receives busy-poll ([`super::Options::busy_poll`]):
    /// [`Self::recv_busy`] spins for them.
    #[inline]
    pub fn busy_polls(&self) -> bool {
        !self.opts.busy_poll.is_zero()
    }

    /// Whether the socket was quiet at this look (one relaxed load): a
    /// caller's hint that [`Self::recv_quiet`] may apply, to keep every
    /// other receive's path as it was.
    #[inline(always)]
    pub fn quiet_now(&self) -> bool {
        self.quiet.load(Ordering::Relaxed)
    }

    /// [`Self::recv_quiet`] from the socket's lock on: taken without
    /// clearing the flag (the read changes nothing it sums up unless it
    /// brings something, and then it clears it). What keeps every other
    /// reader of the engine's socket out is the flag itself: each takes
    /// the lock first (a call's round, the progress thread's), and that
    /// take cleared it — also a wait's that then reads with the lock
    /// released (`driving`: the flag is never set while it is, and the
    /// spin checks it too). A thread that holds the lock now is working,
    /// and the spin goes the usual way after it. The flag is looked at
    /// again under the lock: a thread that took and left it since the
    /// first look cleared it. Out of line: inlined, its frame costs every
    /// receive of the preload (callgrind, as the `ppoll` it replaced did).
    #[inline(never)]
    fn recv_quiet_locked(&self, bufs: &mut [&mut [u8]], flags: RecvFlags) -> Spun {
        let Ok(mut st) = self.st.try_lock() else {
            return Spun::Usual;
        };
        // `driving`: a defence (review r23-b item 2) — quiet is never set
        // while a wait drives the engine with the lock released (its take
        // cleared the flag, `set_quiet` refuses), but a spin that read
        // while that wait holds completions would process later bytes
        // first, as `drive_take` guards.
        if !self.quiet.load(Ordering::Relaxed) || st.driving {
            return Spun::Usual;
        }
        let Some(read) = self.cq.read_quiet(&self.qp) else {
            return Spun::Empty;
        };
        // One buffer, a receive that takes (not a peek, not `MSG_WAITALL`):
        // the predicted receive first.
        let read = match bufs {
            [one] if !flags.peek && !flags.waitall => {
                let take =
                    |wr_id, payload: &[u8]| self.take_predicted(&mut st, wr_id, payload, one);
                match read.predict(take) {
                    Ok((got, news)) => return self.predicted_taken(st, got, news),
                    Err(read) => read,
                }
            }
            _ => read,
        };
        let mut wcs = [Wc::default(); WCS];
        let (n, news) = read.finish(&mut wcs);
        // From here the call changes the books: a take of the lock as any.
        self.quiet.store(false, Ordering::Relaxed);
        st.locks += 1;
        st.quiet_answers += 1;
        st.news = Some(news);
        let [one] = bufs else {
            self.take_polled(&mut st, &mut wcs, n, None);
            return Spun::Usual;
        };
        // A peek leaves what came in the books (the general loop reads
        // it), and so does a `MSG_WAITALL`: it returns every byte the read
        // brought, up to its length, not the first message alone (review
        // r23-b item 1).
        let direct = (!flags.peek && !flags.waitall).then_some(&mut one[..]);
        let r = match self.take_polled(&mut st, &mut wcs, n, direct) {
            (_, Some(got)) => Ok(got),
            // Not a DATA message that fit (a part of one, a credit, an
            // end): the general loop, which looks at the books first.
            (_, None) => {
                let (back, r) = self.recv_locked(st, one, flags, None);
                st = back;
                r
            }
        };
        Spun::Done(r, Self::readiness_of(&st))
    }

    /// The predicted receive's take (issue 12), under the engine's lock
    /// (no call into the engine here): the quiet spin's read (or a
    /// blocking wait's first park, `io/wait/predicted.rs`) brought
    /// exactly one whole FPDU, a one-FPDU Send into the head receive
    /// (`wr_id`, our oldest posted slot), its `payload` where the engine's
    /// read put it. Taken when it is one DATA message that fits `out` (in
    /// message mode, one that ends a message), as `take_direct` takes a
    /// completed receive's — the books count it received and read
    /// ([`crate::stream::Stream::take_message`]) — but copied from the
    /// read straight into `out`, and its slot, which the engine posts
    /// again in place, counted posted at once (`Stream::take_message_reposted`,
    /// `take_message` and `Stream::post_last_freed` in one:
    /// creditable to the peer from now on). `None`, nothing changed: the
    /// usual path (the engine services the FPDU, the receive completes).
    ///
    /// Only in the steady state, nothing unread before it, no receive
    /// retargeted. Freed slots waiting for their batched repost
    /// (`XSocket::repost`, the usual path's takes) are not this one's:
    /// it is posted alone ahead of them, in the order the engine has it
    /// (`posted` follows), and they are posted once the engine's lock is
    /// let go (`predicted_books`). The credit returns are the usual
    /// path's: the sums a CREDIT's due-ness is computed over (`unreturned`
    /// and the batch) are those of the slot joining the batch, so a
    /// CREDIT is due exactly when the usual path's would be
    /// (`Stream::repost_due` posts the batch for it), and the `settle`
    /// that follows sends it (`tests/predicted_books.rs`).
    pub(super) fn take_predicted(
        &self,
        st: &mut State,
        wr_id: u64,
        payload: &[u8],
        out: &mut [u8],
    ) -> Option<(usize, bool)> {
        let slot = wr_id as u32;
        if st.posted.front() != Some(&slot)
            || u64::from(slot) != wr_id
            || !st.steady()
            || st.residue_off < st.residue.len()
        {
            return None;
        }
        let t =
            st.s.take_message_reposted(slot, payload, out.len(), st.msg_mode)?;
        super::slots::copy_short(&mut out[..t.len], &payload[t.off..t.off + t.len]);
        // The head slot (checked above: the queue holds it) to the back,
        // as the engine reposts it: `pop_front` and `push_back` of it, in
        // place (`Ring::rotate_one`, inlined: `VecDeque::rotate_left` was
        // a call of std's, ~22 instructions a take).
        st.posted.rotate_one();
        Some((t.len, st.msg_mode))
    }

    /// The end of a quiet spin whose read the predicted receive took
    /// (`got`: the receive's result; `news`: the engine's after it): what
    /// `take_polled` does after `take_direct` — the counts of the take,
    /// `processed` (a receive-only end's RTO lowered, `lower_rto`; a
    /// waiting batch posted, at once here), the round's marks, `settle`
    /// (events: none, `news`; the asynchronous pump; a CREDIT now due;
    /// the rearm) and the writer's report. Not the engine's round: the
    /// take stands for it (`QuietRead::predict`).
    #[inline(never)]
    fn predicted_taken(
        &self,
        mut st: MutexGuard<'_, State>,
        got: (usize, bool),
        news: QpNews,
    ) -> Spun {
        // The call changed the books: a take of the lock as any.
        self.quiet.store(false, Ordering::Relaxed);
        st.locks += 1;
        st.quiet_answers += 1;
        st.predicted_answers += 1;
        st.news = Some(news);
        self.predicted_books(&mut st, got.0);
        st.idle_spins = 0;
        st.idle_round = false;
        if !self.take_settled(&st) {
            self.settle(&mut st);
            self.report_for_writer(&st);
            return Spun::Done(Ok(got), Self::readiness_of(&st));
        }
        // `settle` would do nothing (`take_settled`): not made.
        debug_assert!(
            self.watch_current(&st),
            "a predicted take's watch left stale"
        );
        self.report_for_writer(&st);
        let ready = Self::readiness_taken(&st);
        debug_assert_eq!(
            ready,
            Self::readiness_of(&st),
            "a predicted take's readiness"
        );
        Spun::Done(Ok(got), ready)
    }

    /// Whether [`Self::settle`] after a predicted take (`predicted_taken`,
    /// the books `st` after it) would change nothing, so that it need not
    /// run (~45 instructions an answer, most of them the watch's terms:
    /// issue 12). The socket was quiet up to the take, and every path that
    /// sets the flag does so under the lock right after `rearm`, with
    /// nothing changed between (`set_quiet` after an empty round's
    /// `settled` or `settle`, `set_quiet_sent` after `send_straight`'s
    /// rearm), and every other take of the lock clears it: the books are
    /// those the last rearm looked at but for what the take changed, the
    /// credit books of a DATA message read and its slot posted again. Of
    /// `settle`'s steps then: `check_events` returns on news without an
    /// event; `pump` moves nothing (nothing in flight: the flag's term);
    /// `flush` sends nothing when the books owe no message (the credit
    /// return the take may have made due is asked here, `owes_msg`); and
    /// `rearm` sets the watch it set last — its terms are the books' (the
    /// take changes none of them: no output queued, as `owes_msg` says)
    /// and the engine's backlog, none now as then (a read, no write). A
    /// failed repost (`predicted_books`) cleared the news: settled. The
    /// two terms kept outside the books: `parked` (never while quiet: a
    /// driving wait clears it, `driving` refuses it), and `writable_wait`,
    /// which another thread sets or clears without the lock (a gated
    /// writer, the preload's bell): the take settles only while it is
    /// what the last rearm set the watch for (`State::watch_ww`), so the
    /// watch follows it here exactly as `settle`'s rearm would (helper
    /// 81's review: without that look a writer's wait begun while the
    /// socket was quiet left the watch off until the writer's own round,
    /// and one ended left it on). A debug build checks the watch against
    /// `rearm`'s.
    #[inline(always)]
    fn take_settled(&self, st: &State) -> bool {
        st.news.is_some_and(|n| !n.events && n.backlog == 0)
            && !st.s.owes_msg()
            && self.writable_wait.load(Ordering::Relaxed) == st.watch_ww
    }

    /// [`Self::readiness_of`] after a predicted take that settled with
    /// nothing to do (`take_settled`): the socket was quiet, so none of
    /// its terms of an end, an error or a shut side is set (the flag's
    /// terms; the take changes none), no byte is unread (none was, and the
    /// take read the whole message) — readable only for an asynchronous
    /// completion still to collect. A debug build checks it against
    /// `readiness_of`.
    #[inline(always)]
    fn readiness_taken(st: &State) -> Readiness {
        Readiness {
            readable: st.aio.has_completions(),
            writable: st.s.writable() && !st.tx_free.is_empty(),
            rdhup: false,
            hup: false,
            error: false,
            arrivals: st.arrivals,
        }
    }

    /// The books after a predicted take of `len` bytes (the busy spin's,
    /// `predicted_taken`, and the parked read's, `io/wait/predicted.rs`):
    /// the arrival and the take counted, then what `processed` does — a
    /// receive-only end's RTO, and the freed slots. A batch the usual
    /// path's takes left (an answer met while not quiet, a wait's
    /// `take_direct`) is posted now, not left for more takes to fill:
    /// every predicted take posts its own slot, so the batch would never
    /// grow and each take would ask `repost_due` for it (~30 instructions
    /// an answer). Posted early, it changes no CREDIT: a CREDIT's
    /// due-ness is computed over `unreturned` + the batch either way.
    #[inline(always)]
    pub(super) fn predicted_books(&self, st: &mut State, len: usize) {
        st.arrivals += 1;
        self.count(st, Count::RxCopied, len);
        self.count(st, Count::RxTaken, 1);
        self.lower_rto(st);
        if st.s.unposted() > 0 {
            self.repost_now(st);
        }
    }

    /// At the end of an empty round (the call holds the lock `st`, has
    /// just made the round, and it processed nothing): marks the socket
    /// quiet when nothing but the engine's TCP socket can change what a
    /// receive returns (see the module's docs for each term).
    #[inline]
    pub(crate) fn set_quiet(&self, st: &State) {
        let idle = st.news.is_some_and(|n| !n.events && n.backlog == 0);
        if idle && st.idle_round && Self::books_quiet(st) {
            self.quiet.store(true, Ordering::Relaxed);
        }
    }

    /// At the end of a straight send (`send_straight`, the lock `st` held)
    /// whose one FPDU the engine built and wrote at once and whole
    /// (`send_inline`: no send request, so no completion now or later):
    /// marks the socket quiet when, after it, nothing but the engine's TCP
    /// socket can change what a receive returns — the terms of
    /// [`Self::set_quiet`] with the send's own news for the round's (the
    /// engine's after the write: no byte of it left queued, `backlog` 0,
    /// and no event), and the send's own marks: no request posted and
    /// left unreaped (`unreaped`), no other send call in its course
    /// (`sending`), and the books still writable (a send that took the
    /// last credit it may use leaves the next send waiting on the peer's
    /// CREDIT: conservative, the flag left down). The engine's state
    /// itself is not this call's to vouch for: the quiet spin's read makes
    /// the short round only where the engine has nothing staged, held,
    /// reported, queued for output or completed (`Cq::read_quiet`), and
    /// its full round otherwise, whose result the spin takes the usual
    /// way. A ping-pong's spin right after its send is then the engine's
    /// read alone, not the receive's full round (issue 12).
    ///
    /// Of the books' terms, those the straight path made sure of are not
    /// asked again (~25 instructions a send): no error (the send would
    /// have returned it), the peer's FIN not seen and no batch held back
    /// (its entry's tests), nothing queued or owed to the peer
    /// (`tx_straight` takes no call with anything queued, and its DATA
    /// returned every unreturned slot), and writable but for the credits
    /// (no end queued, no sink offered: `tx_straight`'s tests). A debug
    /// build checks the whole list against them.
    #[inline(always)]
    pub(crate) fn set_quiet_sent(&self, st: &State) {
        let idle = st.news.is_some_and(|n| !n.events && n.backlog == 0);
        let quiet = idle
            && !st.unreaped
            && st.sending == 0
            && st.s.may_send()
            && !st.driving
            && st.residue_off >= st.residue.len()
            && st.s.readable() == 0
            && !st.s.eof()
            && !st.shut_rd
            && !st.reads_reserved()
            && !st.aio.in_flight();
        debug_assert_eq!(
            quiet,
            idle && !st.unreaped && st.sending == 0 && st.s.writable() && Self::books_quiet(st),
            "a straight send's terms of the quiet flag"
        );
        if quiet {
            self.quiet.store(true, Ordering::Relaxed);
        }
    }

    /// The terms of the flag that are the socket's own (not the engine's):
    /// no other thread in the engine, nothing for a reader in the books
    /// (nor an end, an error or a shut reading side), nothing owed to the
    /// peer, no receive retargeted, no asynchronous operation in flight,
    /// no batch of posts held back (see the module's docs).
    #[inline(always)]
    fn books_quiet(st: &State) -> bool {
        !st.driving
            && st.residue_off >= st.residue.len()
            && st.s.readable() == 0
            && !st.s.eof()
            && !st.s.has_output()
            && !st.s.owes_msg()
            && !st.shut_rd
            && st.error.is_none()
            && !st.peer_closed
            && !st.reads_reserved()
            && !st.aio.in_flight()
            && st.deferred.is_none()
    }
}
