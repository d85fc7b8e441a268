//! [`XSocket`]: one DDP-mode socket — the [`Stream`] books driven over an
//! engine queue pair.
//!
//! Each socket has its own caller-driven engine context, so a blocking
//! receive sleeps in a blocking read of the TCP socket itself (the system
//! calls of plain TCP), and one thread at a time drives the engine for it:
//! the others wait on the socket's wake word ([`XSocket::wakes`], a
//! futex) and are woken when that thread has processed what arrived.
//! Everything the engine completes goes through [`XSocket::process`] under
//! the socket's lock, whichever thread polled it. Between calls nothing
//! drives it unless its owner watches it (`io/watch.rs`: the preload's
//! progress thread): bytes a send left with the engine for a full kernel
//! send buffer leave in a later call, or in [`XSocket::close`], which
//! drives the engine until everything has left.
//!
//! Memory: `slots` receive slots of `slot_size` bytes (what the peer may
//! send into without asking) and as many transmit slots for copies. A
//! send call of at least `zcopy_min` bytes that may block is sent from the
//! caller's buffer (registered for the call; the call returns when the
//! engine has handed every byte to the kernel), a smaller or non-blocking
//! one is copied into transmit slots — in stream mode, what finds no
//! credit into the send buffer first, at most `sndbuf` bytes
//! ([`super::rio`]). A receive of at least `zcopy_min`
//! bytes that finds nothing queued offers the caller's buffer as a sink
//! (see [`crate::stream`]).

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError, TryLockError};

use warpsock_engine::{
    Context, Cq, Event, Mr, Pd, Qp, QpNews, RecvWr, SendOp, SendWr, Wc, WcOpcode, WcStatus,
};

use warpsock_engine::proto::wire::terminate::TermCode;

use warpsock_engine::proto::ring::Ring;

use super::gather::Src;
use super::placed::Retargeted;
use super::rio::{Aio, LocalMap};
use super::settings::{Count, Counters, Options, Readiness};
use super::slots::SlotMem;
use crate::stream::Stream;
use crate::wire::{Msg, MAX_CONTROL_LEN};

/// Identifies a send work request: what it holds until it completes.
/// `WR_SLOT | slot`: a transmit slot. `WR_CALL | (slot + 1) << 36 | call`:
/// a request of zero-copy call `call` (`slot + 1`: the transmit slot of
/// its header, 0 if none).
pub(crate) const WR_SLOT: u64 = 1 << 60;
pub(crate) const WR_CALL: u64 = 2 << 60;
pub(crate) const WR_RIO: u64 = 3 << 60;
pub(crate) const WR_KIND: u64 = 0xF << 60;
pub(crate) const CALL_BITS: u32 = 36;
/// Completions taken from the engine per look. Small: the array is
/// initialised at every look (a ping-pong's takes one or two; sixteen cost
/// about 100 instructions a look, 5 % of a busy-polling receive), and more
/// are taken by looking again.
pub(super) const WCS: usize = 4;

pub(crate) struct State {
    pub(crate) s: Stream,
    pub(crate) tx_free: Vec<u32>,
    /// Send work requests per zero-copy call still outstanding.
    pub(crate) call_wrs: HashMap<u64, super::posts::CallWrs>,
    /// Zero-copy send calls that returned at their timeout with requests
    /// the engine had not read yet: their registrations (on private
    /// copies) and the bytes copied, dropped as the last request completes
    /// ([`XSocket::release_orphan`]). At most one per such call.
    pub(crate) orphans: Vec<(u64, Vec<Mr>, usize)>,
    /// Registrations kept past the program's close on private copies (the
    /// sinks of its asynchronous receives: `rio::detach_program_memory`),
    /// until the socket goes.
    pub(crate) kept: Vec<Mr>,
    /// The program's memory was detached (its close:
    /// `XSocket::try_detach_program_memory`).
    pub(crate) detached: bool,
    pub(crate) next_id: u64,
    /// Why the connection ended, once it did.
    pub(crate) error: Option<(i32, String)>,
    pub(crate) driving: bool,
    /// Threads asleep on [`XSocket::wakes`] (a wake-up is a system call:
    /// made only when someone waits).
    pub(crate) waiters: usize,
    pub(crate) residue: Vec<u8>,
    pub(crate) residue_off: usize,
    pub(crate) msg_mode: bool,
    pub(crate) shut_rd: bool,
    /// The stream bytes received ([`Stream::rx_seq`]) when this end was
    /// shut both ways (`shutdown(SHUT_RDWR)`, or its close began): a byte
    /// beyond them resets the connection, as TCP's
    /// ([`XSocket::data_after_shutdown`]).
    pub(crate) shut_both_at: Option<u64>,
    pub(crate) peer_closed: bool,
    /// The peer's FIN came with no failure before it (TCP's `SOCK_DONE`):
    /// reads end (0) before they report a failure that came after it (the
    /// reset a send to the closed peer draws).
    pub(crate) fin: bool,
    /// The peer broke the protocol (a message refused, a sink claim its
    /// Writes do not back): nothing it sent after reaches the books, and a
    /// read does not take an end of stream behind it for a clean end.
    pub(crate) peer_broke: bool,
    pub(crate) aio: Aio,
    pub(crate) maps: BTreeMap<u64, LocalMap>,
    /// Completions processed ([`Readiness::arrivals`]).
    pub(crate) arrivals: u64,
    /// The program waits for this socket through its descriptor in calls
    /// that see it only through the progress thread (`select`, `epoll`):
    /// see [`XSocket::set_background`].
    pub(crate) background: bool,
    /// The program waits in epoll sets ([`XSocket::set_epoll_background`]):
    /// watched by the progress thread while no set of the program's
    /// watches the engine's socket itself ([`Self::direct`]).
    pub(crate) epoll_background: bool,
    /// The program's epoll sets that watch the engine's socket themselves
    /// ([`XSocket::set_direct`]).
    pub(crate) direct: u32,
    /// Program `poll`s waiting on the socket that do not watch the engine's
    /// socket themselves ([`XSocket::poller`]).
    pub(crate) pollers: u32,
    /// Program `poll`s that watch the engine's socket themselves and stand
    /// in for the progress thread while they wait ([`XSocket::stand_in`]).
    pub(crate) stand_ins: u32,
    /// When the stand-ins lapse: [`XSocket::STAND_LEASE`] after the last
    /// one began (see [`XSocket::stand_in_timed`]).
    pub(crate) stand_by: Option<std::time::Instant>,
    /// A timer of the progress thread's looks at the stand-ins' lapse
    /// ([`XSocket::stand_lapse`]).
    pub(crate) stand_timed: bool,
    /// The engine announced the connection established (a responder's
    /// sends wait for the initiator's first FPDU until then: RFC 6581).
    pub(crate) established: bool,
    /// Send calls running now. Each flushes the engine's backlog itself
    /// (its waits watch output space), so the progress thread's watch
    /// follows the backlog only once the last of them returned (see
    /// [`XSocket::rearm`]).
    pub(crate) sending: u32,
    /// Our posted receives (slots), oldest first: the order the engine
    /// fills them in. Popped as their completions are processed.
    pub(crate) posted: Ring<u32>,
    /// Receives a placed read pointed at the program's buffers
    /// (`io/placed.rs`).
    pub(crate) retargeted: Vec<Retargeted>,
    /// A placed read is under way (its receives retargeted, or to be
    /// again: [`Self::zero_copy_idle`]).
    pub(crate) placed_reader: bool,
    /// A sink offered behind a head (`recv_into_later_sink`) waits for
    /// the head's stream bytes, which are its reader's: no other read
    /// takes stream bytes meanwhile ([`Self::reads_reserved`]).
    pub(crate) head_reserved: bool,
    /// Of the slots the books freed and did not post again yet, those of
    /// messages a waiting reader took as they landed (`take_direct`): the
    /// only ones [`XSocket::repost`] leaves for a batch.
    pub(crate) taken_unposted: u32,
    /// The engine's backlog and pending events as the last call on the
    /// engine reported them (`None`: a call that does not report them ran
    /// since): [`XSocket::rearm`] and the events check read them here
    /// instead of taking the engine's lock again.
    pub(crate) news: Option<QpNews>,
    /// Send requests posted so far: a wait that saw none posted while it
    /// waited drained everything the engine queued itself.
    pub(crate) posts: u64,
    /// A request was posted since the last [`XSocket::reap`]: its
    /// completion may wait in the engine's queue (an inline Send makes
    /// none, so a send call that posted nothing skips the look).
    pub(crate) unreaped: bool,
    /// When a receive-only end's `TCP_RTO_MIN_US` is lowered ([`Options::rto_min`]).
    pub(crate) rto: super::settings::RtoMin,
    /// Posts a send call holds back for one batch (`XSocket::post_deferred`).
    pub(crate) deferred: Option<Vec<SendWr>>,
    /// Empty rounds in a row that ended short, without a settle
    /// (`XSocket::settled`); 0: the last round was a full one.
    pub(crate) idle_spins: u32,
    /// The last round ended short and the engine's was its short empty one
    /// ([`warpsock_engine::Cq::poll_news_idle`]): `io/quiet.rs`.
    pub(crate) idle_round: bool,
    /// The `writable_wait` the last [`XSocket::rearm`] set the watch for
    /// (it is written without the lock: a predicted take skips the rearm
    /// only while it is unchanged, `io/quiet.rs` `take_settled`).
    pub(crate) watch_ww: bool,
    /// Times a call took the lock ([`XSocket::state_locks`]): counted
    /// under it, a plain add (an atomic beside the mutex was a `lock xadd`
    /// per take).
    pub(crate) locks: u64,
    /// Answers a quiet socket's spin took in under its own lock
    /// ([`XSocket::quiet_answers`]; `io/quiet.rs`).
    pub(crate) quiet_answers: u64,
    /// Of them, those the predicted receive took
    /// ([`XSocket::predicted_answers`]; `io/quiet.rs`).
    pub(crate) predicted_answers: u64,
    /// Blocking receives whose parked read the predicted take took
    /// ([`XSocket::parked_predictions`]; `io/wait/predicted.rs`).
    pub(crate) parked_predicted: u64,
    /// The last one-buffer receive (`recv_guarded`) could block: a
    /// blocking reader, whose receives never spin, so a straight send
    /// leaves the flag down (`XSocket::set_quiet_sent` not asked: its
    /// terms were ~35 instructions of a blocking ping-pong's send, and the
    /// flag sent the next receive through the preload's spin frame only
    /// to go on). A non-blocking receive puts it back (issue 12), and a
    /// busy-polling socket's blocking one never sets it: that reader spins
    /// first (`XSocket::recv_busy`).
    pub(crate) rx_blocks: bool,
}

impl State {
    /// A fresh id for a call or request (fits the 36 bits a zero-copy
    /// call's work request ids have for it).
    pub(crate) fn next_id(&mut self) -> u64 {
        self.next_id = (self.next_id + 1) & ((1 << CALL_BITS) - 1);
        self.next_id
    }

    pub(crate) fn tx_free_len(&self) -> usize {
        self.tx_free.len()
    }

    /// No zero-copy read is under way — no placed read, and every sink
    /// offered final (`Stream::sinks_final`) — so a read may start one.
    /// One at a time: a placed read's positions count from its own start
    /// (a second one's receives, retargeted behind the first's, would be
    /// taken by the first as its own, at offsets past its buffers), and
    /// a sink is offered only with none outstanding
    /// (`Stream::post_sink_after`). A second large read, on another
    /// thread or an asynchronous receive, copies instead (helper 65's
    /// review: `aio_recv` then a blocking `recv`, or two threads'
    /// blocking reads, hit the sink's assertion with the lock held).
    pub(crate) fn zero_copy_idle(&self) -> bool {
        !self.placed_reader && self.s.sinks_final()
    }

    /// Nothing can arrive or leave any more: the connection failed, or the
    /// peer's FIN closed it. Waits for the peer end here.
    pub(crate) fn over(&self) -> bool {
        self.error.is_some() || self.peer_closed
    }

    /// Established, not over and no read's bytes reserved
    /// ([`Self::reads_reserved`]): freed slots may wait for a batched
    /// repost (`XSocket::repost`).
    #[inline]
    pub(crate) fn steady(&self) -> bool {
        self.established && !self.over() && !self.reads_reserved()
    }

    /// Whether stream bytes about to come are a zero-copy read's: receives
    /// retargeted at its buffers (`io/placed.rs`), or the head before a
    /// later sink ([`Self::head_reserved`]). Another read then takes none
    /// of them — no direct or predicted take, no merge into the residue,
    /// no copy (`read_now`). Before, a second reader's copy took a later
    /// sink's head, and the sink's reader, its head short, dropped what the
    /// peer had placed (helper 67's review).
    #[inline]
    pub(crate) fn reads_reserved(&self) -> bool {
        !self.retargeted.is_empty() || self.head_reserved
    }
}

/// A DDP-mode socket. Shared between threads (`Arc<XSocket>`).
pub struct XSocket {
    pub(crate) st: Mutex<State>,
    /// The wake sequence the threads that wait for the driving one sleep
    /// on (`wait_for_driver`): bumped and woken by [`XSocket::wake`], read and
    /// bumped under the socket's lock only. A raw futex, not a `Condvar`:
    /// std's wait goes back to sleep after a signal's handler ran, so a
    /// second blocked reader was never interrupted, where TCP's read
    /// fails with `EINTR` (signal(7)); the raw wait returns it (and is no
    /// cancellation point: `crate::cancel`).
    pub(crate) wakes: AtomicU32,
    pub(crate) opts: Options,
    pub(crate) _ctx: Context,
    pub(crate) pd: Pd,
    pub(crate) cq: Cq,
    pub(crate) qp: Qp,
    pub(crate) rx: SlotMem,
    pub(crate) tx: SlotMem,
    pub(crate) local: SocketAddr,
    pub(crate) peer: SocketAddr,
    /// The engine's TCP socket (for a progress thread's epoll set).
    pub(crate) tcp_fd: RawFd,
    /// This socket's share of [`counters`](super::counters) (which sums every socket's).
    pub(crate) stats: Arc<Counters>,
    /// See [`XSocket::set_on_progress`].
    pub(crate) on_progress: OnceLock<Box<dyn Fn(Readiness) + Send + Sync>>,
    /// `State::driving`, readable without the lock: the progress thread
    /// skips a socket a call is parked on without contending for the lock
    /// the call takes back when it wakes (see `progress_if_idle`).
    pub(crate) parked: AtomicBool,
    /// The round the progress thread owes, and its back-off (`watch/owed.rs`).
    pub(crate) owed: AtomicU64,
    pub(crate) owed_tries: AtomicU32,
    /// See [`XSocket::set_watch`].
    pub(crate) watch: OnceLock<Box<dyn Fn(u32) + Send + Sync>>,
    /// The events the progress thread watches [`Self::tcp_fd`] for now
    /// (what `watch` was last told; changed under the socket's lock).
    pub(crate) watching: AtomicU32,
    /// The program waits for writability after a send found no credit,
    /// from [`XSocket::set_writable_wait`]`(true)` (or
    /// [`XSocket::want_writable`]) until its waiter ends the wait with
    /// `set_writable_wait(false)`. Not cleared by a round that finds
    /// the socket writable: see `set_writable_wait`.
    pub(crate) writable_wait: AtomicBool,
    /// Nothing but the engine's TCP socket can change what a receive
    /// returns (`io/quiet.rs`). Set under the lock (an empty round's end,
    /// a straight send's), cleared by every take of it.
    pub(crate) quiet: AtomicBool,
    /// An epoll set of the program's watches [`XSocket::tcp_fd`] itself
    /// ([`XSocket::set_direct`]; `State::direct` > 0), mirrored for a
    /// look without the lock ([`XSocket::covered`]).
    pub(crate) covered: AtomicBool,
    /// The word its waits' sleep marks name ([`XSocket::wait_word`]):
    /// even, and never another socket's of the process, not even one at
    /// the same address after this one is gone.
    pub(crate) word: usize,
    /// What its owner keeps until the socket is dropped
    /// ([`XSocket::keep_until_dropped`]). Declared last: it drops after
    /// the slot memory ([`Self::rx`], [`Self::tx`]) is unmapped.
    pub(crate) kept: Option<Box<dyn std::any::Any + Send + Sync>>,
}

/// The Terminate we send when the peer breaks the sockets protocol (a
/// malformed message, a credit overrun, a misused sink): RDMAP layer,
/// remote operation error, unspecified — the message was a valid RDMAP
/// Send whose contents our upper layer rejects.
pub(crate) const TERMINATE_CODE: TermCode = TermCode::RDMAP_OPERATION_UNSPECIFIED;

impl XSocket {
    /// Counts `n` bytes in this socket's counters (the process's sum them)
    /// (received bytes are counted as copied or placed, and in total).
    ///
    /// Under the socket's lock (`_st`: every count is made with it held),
    /// so the socket's counters are a plain load and store, not a
    /// `lock xadd`: their writers are serialised by the lock and their
    /// readers ([`Self::stats`], the process's sum [`counters`](super::counters)) load
    /// whole values. The process's counters are summed from every
    /// socket's when they are read (`settings::socket_counters`), not
    /// added to here (issue 12: no locked instruction in a count).
    pub(crate) fn count(&self, _st: &State, what: Count, n: usize) {
        debug_assert!(self.st.try_lock().is_err(), "counted without the lock");
        let n = n as u64;
        let add = |c: &AtomicU64| c.store(c.load(Ordering::Relaxed) + n, Ordering::Relaxed);
        add(what.of(&self.stats));
        if matches!(what, Count::RxCopied | Count::RxPlaced) {
            add(&self.stats.rx_bytes);
        }
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        let mut st = self.st.lock().unwrap_or_else(PoisonError::into_inner);
        // Whoever takes the lock may change what `quiet` sums up.
        self.quiet.store(false, Ordering::Relaxed);
        st.locks += 1;
        st
    }

    /// [`Self::lock`] if the lock is free now, else `None`: one try, no
    /// wait (an exit's closes, `closing.rs`: the exiting thread may hold
    /// it, interrupted, or another thread stopped inside a call).
    pub(crate) fn try_lock_now(&self) -> Option<MutexGuard<'_, State>> {
        let mut st = match self.st.try_lock() {
            Ok(st) => st,
            Err(TryLockError::Poisoned(p)) => p.into_inner(),
            Err(TryLockError::WouldBlock) => return None,
        };
        self.quiet.store(false, Ordering::Relaxed);
        st.locks += 1;
        Some(st)
    }

    /// A take of the lock for a look that changes nothing (readiness, the
    /// readable count): `quiet` stays as it is. Only for looks that write
    /// none of what `quiet` sums up (`io/quiet.rs`): a vectored receive's
    /// look after its round, `readiness_now` and `FIONREAD`'s count
    /// cleared the flag the call had just set, so `readv`/`recvmsg` with
    /// two buffers never took the lock-free `EAGAIN` (review r22-c item 2).
    /// Out of line: inlined, fat LTO's choices cost the blocking 8 B round
    /// trip ~5 instructions per process (callgrind, `notes/count.sh`).
    #[inline(never)]
    pub(crate) fn lock_look(&self) -> MutexGuard<'_, State> {
        let mut st = self.st.lock().unwrap_or_else(PoisonError::into_inner);
        st.locks += 1;
        st
    }

    // ------------------------------------------------------------------
    // Progress.

    /// Processes work completions polled by any thread. The connection
    /// events of the round are looked at by the caller after it (`settle`,
    /// or `reap`): once per round, not per batch of completions.
    pub(super) fn process(&self, st: &mut State, wcs: &[Wc]) {
        st.arrivals += wcs.len() as u64;
        for wc in wcs {
            if !wc.is_ok() {
                // The event that killed the queue pair (a Terminate, a
                // reset) names the cause better than the flush.
                self.check_events(st);
                // The peer's FIN flushes what is posted too: its process
                // ended (or it closed) and, as over TCP, that is the end of
                // the stream for reads and EPIPE for sends, not a protocol
                // error. (The core emits `Closed` before the flush
                // completions of that round, so it is seen first.)
                if !(wc.status == WcStatus::WrFlushError && st.peer_closed) {
                    self.fail(
                        st,
                        libc::EPROTO,
                        format!("{:?} on a work request", wc.status),
                    );
                } else if wc.wr_id & WR_KIND != WR_RIO {
                    // The library's own receive slots and sends, flushed by
                    // the peer's close: nothing a program collects, so no
                    // arrival. Counted, each was a new look after the end
                    // of stream the doorbell showed already, and an
                    // edge-triggered set got a second event where TCP's
                    // CLOSE_WAIT gives one (review 57). The close's own
                    // change is counted where it is taken (`poll_events`).
                    st.arrivals -= 1;
                }
                if wc.wr_id & WR_KIND == WR_RIO {
                    super::rio::on_completion(st, wc);
                }
                if wc.wr_id & WR_KIND == 0 {
                    st.posted.retain(|&s| s != wc.wr_id as u32);
                }
                self.release_wr(st, wc.wr_id);
                continue;
            }
            match wc.opcode {
                WcOpcode::Recv => {
                    let slot = wc.wr_id as u32;
                    debug_assert_eq!(st.posted.front(), Some(&slot));
                    // Receives complete in the order they were posted: the
                    // slot is the oldest (a scan of every posted slot cost
                    // ~465 instructions per message).
                    if st.posted.front() == Some(&slot) {
                        st.posted.pop_front();
                    } else {
                        st.posted.retain(|&s| s != slot);
                    }
                    let size = self.opts.slot_size as usize;
                    let at = slot as usize * size;
                    #[allow(unsafe_code)]
                    // SAFETY: the receive in `slot` completed and the slot is
                    // reposted only after the books free it.
                    let bytes = unsafe { self.rx.bytes(at, wc.byte_len as usize) };
                    // After the peer broke the protocol (earlier in this
                    // batch, or before) nothing it sent reaches the books —
                    // no DATA behind a bad message, no end of stream a read
                    // would take for a clean end (helper 33's review,
                    // session 35). Messages before a failure of our own
                    // (a timeout) still do: they came before it (helper
                    // 34's).
                    let r = if st.peer_broke {
                        Ok(())
                    } else {
                        st.s.on_message(slot, bytes)
                    };
                    if let Err(e) = r {
                        st.peer_broke = true;
                        self.fail(
                            st,
                            libc::EPROTO,
                            format!("the peer broke the protocol: {e}"),
                        );
                        // RFC 5040 §7: the stream ends with a Terminate, so
                        // the peer learns why (it reports EPROTO too).
                        self.qp.terminate(TERMINATE_CODE);
                    }
                }
                _ => {
                    if wc.wr_id & WR_KIND == WR_RIO {
                        super::rio::on_completion(st, wc);
                    }
                    self.release_wr(st, wc.wr_id);
                }
            }
        }
        // Before a merge could move them out of the slots.
        if st.shut_both_at.is_some() {
            self.data_after_shutdown(st);
        }
        if st.s.sent_into_peer_close() && st.error.is_none() {
            self.sent_into_peer_close(st);
        }
        // Half the slots hold bytes no one read: small ones are merged out
        // of them (`merge_unread`); one compare per batch otherwise.
        if st.s.unread_slots() * 2 >= usize::from(self.opts.slots) {
            self.merge_unread(st);
        }
        self.processed(st);
    }

    /// The end of [`Self::process`], after its completions: the
    /// retransmission timeout of a receive-only end, and the freed slots
    /// posted again (or left for a batch). All that `process` of no
    /// completion does, for a call that took its message itself
    /// (`take_direct`).
    #[inline]
    pub(super) fn processed(&self, st: &mut State) {
        self.lower_rto(st);
        self.repost(st);
    }

    fn release_wr(&self, st: &mut State, wr_id: u64) {
        match wr_id & WR_KIND {
            WR_SLOT => st.tx_free.push((wr_id & !WR_KIND) as u32),
            WR_CALL => {
                let call = wr_id & ((1 << CALL_BITS) - 1);
                let hdr = (wr_id & !WR_KIND) >> CALL_BITS;
                if hdr > 0 {
                    st.tx_free.push(hdr as u32 - 1);
                }
                if let Some(w) = st.call_wrs.get_mut(&call) {
                    if w.completed() && !st.orphans.is_empty() {
                        Self::release_orphan(st, call);
                    }
                }
            }
            _ => {}
        }
    }

    /// Posts again the receive slots the books freed. The slots of small
    /// messages a waiting reader took as they landed (a ping-pong's
    /// answers) are left for a batch, creditable to the peer only once
    /// posted, unless the books want them now
    /// ([`crate::stream::Stream::repost_due`]) or the connection is not in
    /// its steady state (not established or over, a receive retargeted).
    /// Any other freed slot posts them all.
    #[inline]
    pub(crate) fn repost(&self, st: &mut State) {
        let left = st.s.unposted();
        // Most rounds free nothing (a message's slot is freed when it is
        // read, after the round that received it); a taken answer's slot
        // mostly waits for the batch.
        if left == 0 || (left == st.taken_unposted as usize && !st.s.repost_due() && st.steady()) {
            return;
        }
        self.repost_now(st);
    }

    /// Posts the slots left for a batch if they must go now
    /// ([`Stream::repost_due`]); returns whether it posted. For a message
    /// the books block: [`Self::repost`] runs only in `process` and the
    /// reads, and our own messages, sent since, may have taken our credits
    /// down to the last, which goes only with a return — with the slots
    /// left unposted there is none, and a peer reading in message mode
    /// waits for the rest of a message whose slots we hold (a deadlock;
    /// review of `07d871f`, `tests/take.rs`).
    pub(crate) fn repost_if_due(&self, st: &mut State) -> bool {
        if st.s.unposted() > 0 && st.s.repost_due() {
            self.repost_now(st);
            return true;
        }
        false
    }

    /// Posts again every receive slot the books freed (a batch left by
    /// [`Self::repost`] included).
    pub(crate) fn repost_now(&self, st: &mut State) {
        st.taken_unposted = 0;
        let size = self.opts.slot_size;
        let State {
            s,
            posted,
            retargeted,
            ..
        } = &mut *st;
        let before = posted.len();
        // One take of the engine's lock for the batch; each slot is
        // counted posted as it goes (the engine stops at a failure), and
        // the books count only the slots it posted.
        let failed = s.post_reposts(|slots| {
            let wrs = slots.iter().map(|&slot| {
                posted.push_back(slot);
                if !retargeted.is_empty() {
                    retargeted.retain(|r| r.slot != slot);
                }
                RecvWr {
                    wr_id: u64::from(slot),
                    sgl: self.rx.sge(slot as usize * size as usize, size).into(),
                }
            });
            self.qp.post_recv_batch(wrs).map(drop).map_err(|e| {
                posted.truncate(before + e.posted);
                e.posted
            })
        });
        if !st.established || st.over() {
            // Outside RTS a receive is flushed at once (a transmit round).
            st.news = None;
        }
        if failed {
            self.fail(st, libc::EPROTO, "cannot repost a receive".into());
        }
    }

    /// Takes the queue pair's connection events into the books. Inlined:
    /// when the engine's last report says there is none (most rounds) that
    /// is all, without a call (issue 12).
    #[inline]
    pub(crate) fn check_events(&self, st: &mut State) {
        if st.news.is_some_and(|n| !n.events) {
            return;
        }
        self.poll_events(st);
    }

    #[inline(never)]
    fn poll_events(&self, st: &mut State) {
        while let Some(ev) = self.qp.poll_event() {
            match ev {
                Event::Terminated { code, by_peer } => {
                    let who = if by_peer { "the peer" } else { "we" };
                    self.fail(
                        st,
                        libc::EPROTO,
                        format!("{who} terminated the connection: {code}"),
                    );
                }
                Event::Established(_) => st.established = true,
                Event::Closed(reason) => self.on_closed(st, reason),
                _ => {}
            }
        }
        if let Some(n) = &mut st.news {
            n.events = false;
        }
    }

    pub(crate) fn fail(&self, st: &mut State, errno: i32, what: String) {
        if st.error.is_none() {
            if std::env::var_os("XSOCK_DEBUG").is_some() {
                let line = format!("xsock {} -> {}: {what}\n", self.local, self.peer);
                super::sys::debug_line(line.as_bytes());
            }
            st.error = Some((errno, what));
        }
        // The connection is going down: ask the engine from now on.
        st.news = None;
        self.wake(st);
    }

    /// Sends the control messages the books ask for (credits, sink offers
    /// and completions, mappings, EOF), as transmit slots allow.
    #[inline]
    pub(crate) fn flush(&self, st: &mut State) {
        // Nothing owed: most calls (a send call's end after its DATA).
        if st.s.owes_msg() {
            self.flush_owed(st);
        }
    }

    fn flush_owed(&self, st: &mut State) {
        let mut posted = false;
        while !st.tx_free.is_empty() {
            // A CREDIT alone (not a return riding on DATA): none to a peer
            // whose FIN our kernel has (`Stream::set_peer_fin`).
            if st.s.credit_next() && super::sys::fin_received(self.tcp_fd) {
                st.s.set_peer_fin();
            }
            let Some(m) = st.s.poll_msg() else {
                // A queued message (EOF, SINK, SINK_DONE) behind our last
                // credit, which may go only with a return.
                if st.s.has_output() && self.repost_if_due(st) {
                    continue;
                }
                break;
            };
            let slot = st.tx_free.pop().expect("checked");
            self.post_msg(st, slot, m, Src::NONE);
            posted = true;
        }
        // The engine wrote the messages out as they were posted: their
        // completions are queued now. Reaped here (no system call), not by
        // the next wait: a receive's CREDIT (every fourth 8 B message)
        // ended the next blocking receive's park at once, which rearmed the
        // watch and parked again — two more `epoll_ctl` per CREDIT while
        // the program waits in `select`/`epoll`, and a window, the watch
        // on, where an arrival woke the progress thread (`tests/watch.rs`
        // `a_credits_completion_ends_no_later_park`). Not in a send call:
        // it reaps at its end (`reap_posted`). Nor with asynchronous sends
        // or receives queued: what a reap brings them moves at once (the
        // pump, review r19-xaio item 7), and a pump from here would run
        // inside the pump that flushes (`rio::post_sends`, `pump_recvs`):
        // the next reap or round takes it, as before. Without them the
        // pump does nothing, and this is `reap`.
        if posted && st.sending == 0 && !st.aio.pumped() {
            self.reap_queued(st);
        }
    }

    /// Posts `m` (+ the bytes of `payload`, copied) from transmit slot
    /// `slot`.
    pub(crate) fn post_msg(&self, st: &mut State, slot: u32, m: Msg, payload: Src<'_>) {
        let size = self.opts.slot_size as usize;
        let at = slot as usize * size;
        // Encoded in the slot itself (through a stack buffer, it cost a
        // zeroed buffer and a copy per message).
        #[allow(unsafe_code)]
        // SAFETY: `slot` is a free transmit slot, ours until posted below;
        // the view ends before the next one's.
        let h = m.encode(unsafe { self.tx.bytes_mut(at, MAX_CONTROL_LEN.min(size)) });
        let n = h + payload.len;
        #[allow(unsafe_code)]
        // SAFETY: as above (the header's view is gone).
        payload.g.copy_to(payload.off, unsafe {
            self.tx.bytes_mut(at + h, payload.len)
        });
        self.post(
            st,
            SendWr {
                wr_id: WR_SLOT | u64::from(slot),
                op: SendOp::Send {
                    solicited: false,
                    invalidate: None,
                },
                sgl: self.tx.sge(at, n as u32).into(),
                signaled: true,
            },
        );
    }

    /// Processes the completions the engine queued already, with no round
    /// of progress (no system call): a Send that `post` wrote out
    /// at once completes then, so its transmit slot is free before the
    /// call returns and the next receive's wait is not spent on it (a
    /// ping-pong receive waited twice before: once returning the reply's
    /// Send completion alone, once for the peer's answer). Not while
    /// another thread holds completions it polled (see `drive_now`).
    pub(crate) fn reap(&self, st: &mut State) {
        // The completions may have brought credits (or freed transmit
        // slots) that queued sends wait for: they move now, not at the
        // next round (review r19-xaio, item 7).
        if self.reap_queued(st) && st.aio.sends_queued() {
            super::rio::pump(self, st);
        }
    }

    /// [`Self::reap`] without the pump of the queued sends (for the pump
    /// itself, `rio::post_sends`): returns whether anything completed.
    #[inline]
    pub(crate) fn reap_queued(&self, st: &mut State) -> bool {
        let mut wcs = [Wc::default(); WCS];
        let mut any = false;
        while !st.driving {
            let (n, news) = self.cq.poll_queued_news(&mut wcs, &self.qp);
            st.unreaped = false; // only a look that polled clears it
            st.news = Some(news);
            if n > 0 {
                any = true;
                self.process(st, &wcs[..n]);
            }
            if n < wcs.len() {
                break;
            }
        }
        if any {
            self.check_events(st);
        }
        any
    }

    /// [`Self::reap`] at the end of a send call, if it (or anything since
    /// the last reap) posted a request: a call whose messages all went
    /// inline left nothing in the engine's queue to look for. Always
    /// inlined: a load and a branch on the 8 B send (out of line since
    /// `flush_owed` reaps too, it cost the ping-pong ~9 instructions a
    /// round trip).
    #[inline(always)]
    pub(crate) fn reap_posted(&self, st: &mut State) {
        if st.unreaped {
            self.reap(st);
        }
    }

    /// One non-blocking round: polls the engine and processes. Returns
    /// whether anything arrived.
    pub fn progress(&self) -> bool {
        let mut st = self.lock();
        self.drive_now(&mut st)
    }

    /// One round of progress — the engine reads the socket until a read
    /// comes back short (it holds no more) — then everything it queued.
    /// Returns whether anything completed. (Rounds repeated until one
    /// completed nothing before: after a read that took in a message the
    /// next was always empty, one more system call per busy-polling
    /// receive than TCP's.)
    pub(crate) fn drive_now(&self, st: &mut State) -> bool {
        self.drive_take(st, None).0
    }

    /// The end of a round, without reading the socket: connection events,
    /// asynchronous operations, control messages owed, and the progress
    /// thread's watch. Always inlined: its steps are inlined tests but
    /// for the rearm's call, and as a call of its own (~10 instructions
    /// its frame and return) it cost every predicted answer
    /// (`predicted_taken`) and every round that processed something.
    #[inline(always)]
    pub(super) fn settle(&self, st: &mut State) {
        self.check_events(st);
        super::rio::pump(self, st);
        self.flush(st);
        self.rearm(st);
    }

    /// Before a send call moves bytes: a round of progress, unless the
    /// books let the call send now without news from the peer — a small
    /// send with a credit and a transmit slot on an established
    /// connection (a ping-pong's send: the round would only read an empty
    /// socket). A large one looks for a sink the peer may have offered.
    pub(crate) fn drive_before_send(&self, st: &mut State, large: bool) {
        let ready = st.established && !large && !st.tx_free.is_empty() && st.s.writable();
        if !ready {
            self.drive_now(st);
        }
    }

    /// The look taken after every call (the `*_ready` calls): in message
    /// mode a held part no read would return yet counts as readable here;
    /// where a poll asks, [`Self::readiness_polled`] tells it apart.
    /// Always inlined, as the 8 B path was counted.
    #[inline(always)]
    pub(crate) fn readiness_of(st: &State) -> Readiness {
        let err = st.error.is_some();
        // TCP's `RCV_SHUTDOWN`: the peer's FIN, or this end's own
        // `shutdown(SHUT_RD)` (Linux's poll shows `POLLRDHUP` for either,
        // and `POLLHUP` once both ways are shut; review 57).
        let rdhup = st.s.eof() || st.peer_closed || st.shut_rd;
        Readiness {
            readable: st.residue_off < st.residue.len()
                || st.s.readable() > 0
                || rdhup
                || err
                || st.shut_rd
                || st.aio.has_completions(),
            // After the peer's FIN a send does not block: it fails (EPIPE).
            // Writability follows the credits, not the send buffer's room
            // (`sndbuf::buffer`): a send with room does not block, but a
            // program that waits for `POLLOUT` waits for the credits (the
            // buffered bytes go first with them). The buffer's room as a
            // term here cost the 8 B ping-pong ~4 instructions per round
            // trip (its inlining; session 20).
            writable: st.over() || (st.s.writable() && !st.tx_free.is_empty()),
            rdhup,
            // TCP's `POLLHUP`: both ways shut, or a failure. The peer's
            // close alone is TCP's CLOSE_WAIT (`POLLIN|POLLOUT|POLLRDHUP`),
            // although the queue pair is over: an edge-triggered set saw
            // a second event, with the hang-up, where TCP's sees one
            // (review 57).
            // Our `SHUT_WR` counts from the call, as Linux's
            // `SEND_SHUTDOWN`, its end of stream queued behind
            // asynchronous sends or not (`rio::write_shut`).
            hup: st.error.is_some() || (rdhup && super::rio::write_shut(st)),
            error: err,
            arrivals: st.arrivals,
        }
    }

    pub(crate) fn dead(st: &State) -> Option<io::Error> {
        st.error
            .as_ref()
            .map(|(errno, _)| io::Error::from_raw_os_error(*errno))
    }
}

mod diag;
mod ended;
mod info;
