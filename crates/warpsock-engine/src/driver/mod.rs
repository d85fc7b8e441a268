//! The socket driver: one queue pair on its TCP socket. Its receive half
//! ([`rx`], direct placement) and transmit half ([`tx`], gathered
//! `sendmsg`) mirror the core's `conn/rx.rs` and `conn/tx.rs`; this module
//! holds what both share: the slot, the end of the connection (and its
//! cause), one round of progress, epoll interest.
//!
//! # Receive (direct placement)
//!
//! The core's [`Connection::rx_step`] says what the next stream bytes are:
//! framing ([`RxStep::Bytes`](warpsock_proto::RxStep::Bytes)) is read into
//! a staging buffer and fed to the core (a whole small FPDU in one pass with
//! [`Connection::rx_fpdu`], else [`Connection::rx_bytes`]); payload
//! ([`RxStep::Place`](warpsock_proto::RxStep::Place)) is read with one
//! `readv` straight into the registered region, with a short staging tail
//! in the same call that catches the trailer and the next header. The CRC
//! is folded over the placed bytes where they lie
//! ([`Connection::rx_placed`]). Only payload bytes that happened to arrive
//! in the staging buffer together with headers are copied.
//!
//! Staging buffers (64 KiB) are not owned by queue pairs: a queue pair
//! borrows one from its context's [`RxPool`] when it starts receiving and
//! gives it back as soon as everything staged has been fed to the core
//! (usually at the end of the same service call). A context therefore
//! needs about one staging buffer however many queue pairs it has; an idle
//! queue pair holds none.
//!
//! # Transmit
//!
//! Segments from [`Connection::next_segment`] are sealed (CRC) and queued;
//! one `sendmsg` gathers the inline bytes of many segments and the payload
//! straight from registered memory (up to [`sys::IOV_MAX`] iovecs). Partial
//! writes resume at the byte where they stopped.
//!
//! The core completes a Send or Write when its last segment is *handed
//! out*; the driver holds such send-queue completions until those bytes
//! are really written to the socket, so an application that reuses a buffer
//! after its completion never races the engine. If the connection dies
//! first — failure, abort, or the end of a dropped queue pair's linger —
//! the held completions become flush errors: every work request completes
//! exactly once.
//!
//! # Causes
//!
//! A socket error is classified ([`transport_error`]) and handed to the
//! core ([`Connection::handle_transport_error`]), so the connection's
//! [`CloseReason`] says "peer reset" or "timed out" rather than "closed",
//! and every failed completion carries it ([`crate::Wc::cause`]).

mod rx;
mod stats;
mod tx;

use std::collections::VecDeque;
use std::io::{self, IoSlice};
use std::net::{Shutdown, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use warpsock_proto::{
    CloseReason, Connection, Event, GatheredFpdu, Registry, Stag, TxPart, TxSegment, WorkCompletion,
};

pub(crate) use crate::error::transport_error;
use crate::mem::Mem;
use crate::sys::{self, Epoll};
use crate::wc::{cq_lens, CqSlot};

pub(crate) use rx::{ParkedRead, RxPool};
pub use stats::{IoStats, WaitStats, CONTROL_MAX};
pub(crate) use stats::{ParkedSleeps, Sleep, WaitCounters};

/// Source of [`QpSlot::id`]s.
static NEXT_SLOT_ID: AtomicU64 = AtomicU64::new(1);

/// What a round of progress may touch of registered memory, given the
/// application's borrows of region bytes (see the `mr` module): receiving
/// writes regions, transmitting reads them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Allowed {
    /// Receive (place into regions).
    pub(crate) rx: bool,
    /// Transmit (gather from regions).
    pub(crate) tx: bool,
}

impl Allowed {
    /// No borrow in the way.
    pub(crate) const ALL: Self = Self { rx: true, tx: true };
}

/// One queue pair on its socket.
///
/// The socket stays in blocking mode: every driver read and write passes
/// `MSG_DONTWAIT`, except the one blocking read a waiting caller may
/// [`park`](Self::park) in (see `Cq::wait`).
#[derive(Debug)]
pub(crate) struct QpSlot {
    /// Unique for the life of the process (slot indices are reused).
    pub(crate) id: u64,
    pub(crate) conn: Connection,
    pub(crate) sock: TcpStream,
    pub(crate) qp_num: u32,
    pub(crate) send_cq: usize,
    pub(crate) recv_cq: usize,
    pub(crate) events: VecDeque<Event>,
    rx: rx::Staging,
    txq: VecDeque<TxSegment>,
    /// Bytes of the front segment already written.
    tx_off: usize,
    pool: Vec<TxSegment>,
    /// The gather list's allocation, kept between `sendmsg` calls (no
    /// allocation per message on the latency path).
    iov_store: Vec<IoSlice<'static>>,
    /// A gathered Send's frames, kept between sends (`tx_gathered`).
    gathered: Vec<GatheredFpdu>,
    /// Stream bytes queued / written since establishment.
    queued: u64,
    written: u64,
    /// Send-queue completions waiting for their bytes to be written.
    held: VecDeque<(u64, WorkCompletion)>,
    /// Interest currently registered with epoll (0: not registered).
    interest: u32,
    /// Peer EOF seen.
    pub(crate) rd_closed: bool,
    /// FIN sent.
    pub(crate) wr_closed: bool,
    /// Socket error or abortive close: no more I/O.
    pub(crate) dead: bool,
    /// The socket error that ended the connection (`errno`), if one did.
    pub(crate) error: Option<i32>,
    /// A caller sleeps in a blocking read of this socket outside the lock
    /// (with the staging buffer): nobody else may read it meanwhile, and
    /// the slot must not be removed (its fd closed) until it is back.
    pub(crate) parked: bool,
    /// `SO_RCVTIMEO` currently set on the socket.
    rcvtimeo: Option<Duration>,
    /// The timeout the last park asked for (`rcvtimeo` is it rounded up).
    park_for: Option<Duration>,
    /// The last (parked) read came back short: the socket is drained.
    drained_hint: bool,
    /// The last read of the socket since [`crate::Cq::poll_news_idle`]
    /// began its round found it drained (a short count, `EAGAIN`, the end
    /// of stream): [`crate::QpNews::rx_drained`].
    pub(crate) rx_drained: bool,
    /// System calls made on the socket and what they moved (a
    /// diagnostic; the core's schedule counts are added on reading, see
    /// [`Self::io_stats`]).
    io: IoStats,
    /// Dropped by the application: kept open, discarding input, until the
    /// peer's FIN or this deadline, so that closing never resets a
    /// connection whose peer is still sending (a reset would make the
    /// peer's kernel discard what we sent last).
    pub(crate) detached: Option<Instant>,
}

impl QpSlot {
    pub(crate) fn new(
        conn: Connection,
        sock: TcpStream,
        qp_num: u32,
        send_cq: usize,
        recv_cq: usize,
    ) -> Self {
        Self {
            id: NEXT_SLOT_ID.fetch_add(1, Ordering::Relaxed),
            conn,
            sock,
            qp_num,
            send_cq,
            recv_cq,
            events: VecDeque::new(),
            rx: rx::Staging::default(),
            txq: VecDeque::new(),
            tx_off: 0,
            pool: Vec::new(),
            iov_store: Vec::new(),
            gathered: Vec::new(),
            queued: 0,
            written: 0,
            held: VecDeque::new(),
            interest: 0,
            rd_closed: false,
            wr_closed: false,
            dead: false,
            error: None,
            parked: false,
            rcvtimeo: None,
            park_for: None,
            drained_hint: false,
            rx_drained: false,
            io: IoStats::default(),
            detached: None,
        }
    }

    /// The socket's system-call counts, with the core's schedule counts.
    pub(crate) fn io_stats(&self) -> IoStats {
        let c = self.conn.tx_counts();
        IoStats {
            responses_ahead_of_read: c.responses_ahead_of_read,
            response_bytes_ahead_of_read: c.response_bytes_ahead_of_read,
            empty_asks: c.empty_asks,
            inline_sends: c.inline_sends,
            gathered_sends: c.gathered_sends,
            ..self.io
        }
    }

    /// Whether a dropped (detached) slot may now be closed: the connection
    /// is finished both ways, or its linger time is over.
    pub(crate) fn reapable(&self, now: Instant) -> bool {
        !self.parked && self.detached.is_some_and(|d| self.is_done() || now >= d)
    }

    /// Whether the socket is finished with in both directions.
    pub(crate) fn is_done(&self) -> bool {
        self.dead || (self.rd_closed && self.wr_closed)
    }

    /// Why the connection ended, if it has.
    pub(crate) fn close_reason(&self) -> Option<CloseReason> {
        self.conn.close_reason()
    }

    /// The socket failed with `e`: remembered (see `Qp::socket_error`),
    /// told to the core with its cause, then everything outstanding is
    /// flushed.
    fn fail_with(&mut self, e: &io::Error) {
        if self.error.is_none() {
            self.error = e.raw_os_error();
        }
        self.conn.handle_transport_error(transport_error(e));
        self.fail();
    }

    /// No more I/O on this socket (the core has been told why).
    fn fail(&mut self) {
        self.dead = true;
        self.txq.clear();
        self.tx_off = 0;
        self.rx.clear();
    }

    /// Abortive close: everything outstanding is flushed and closing the
    /// socket (when the slot is dropped) sends RST instead of FIN.
    pub(crate) fn abort(&mut self) {
        let _ = sys::set_linger_zero(self.sock.as_raw_fd());
        self.conn.close();
        self.fail();
    }

    /// The end of a dropped queue pair's linger (or of its context):
    /// whatever never reached the socket is flushed, so every request
    /// still completes exactly once before the slot goes.
    pub(crate) fn finish(&mut self, cqs: &mut [Option<CqSlot>]) {
        self.conn.close();
        self.fail();
        self.release_held(cqs);
    }

    /// One round of progress: receive, transmit, close handling, epoll
    /// interest (when `epoll` is given), as far as `allowed` lets it touch
    /// registered memory. Returns whether completions or events were
    /// produced.
    pub(crate) fn service(
        &mut self,
        token: u64,
        reg: &mut Registry<Mem>,
        cqs: &mut [Option<CqSlot>],
        pool: &mut RxPool,
        epoll: Option<&Epoll>,
        allowed: Allowed,
    ) -> bool {
        let before = self.events.len();
        let cq_before = cq_lens(cqs, self.send_cq, self.recv_cq);
        self.service_round(token, reg, cqs, pool, epoll, allowed);
        self.events.len() != before || cq_lens(cqs, self.send_cq, self.recv_cq) != cq_before
    }

    /// [`Self::service`] without its answer (a parked read's waker drains
    /// the queue itself: whether the round produced anything is not
    /// asked, so the queues' lengths are not compared).
    #[inline]
    pub(crate) fn service_round(
        &mut self,
        token: u64,
        reg: &mut Registry<Mem>,
        cqs: &mut [Option<CqSlot>],
        pool: &mut RxPool,
        epoll: Option<&Epoll>,
        allowed: Allowed,
    ) {
        let collected = !self.dead && allowed.rx;
        // An empty read produces nothing (the answer `service` computes
        // for it is false as before).
        if collected && allowed.tx && self.idle_round(token, pool, epoll) == Some(true) {
            return;
        }
        if collected {
            self.rx(reg, pool);
            self.collect(cqs);
        }
        if allowed.tx && self.tx_wanted() {
            self.service_tx(token, reg, cqs, epoll);
        } else if allowed.tx {
            // Nothing to send: what a transmit pass does besides asking
            // the core for segments it does not have (about 340
            // instructions, after every receive and every empty
            // busy-polling round). siw's receive path never transmits
            // either: its send queue is scheduled only for work
            // (`siw_sq_start` on a post, a Read Response, a Terminate).
            if collected {
                self.deliver_held(cqs);
            } else {
                self.release_held(cqs);
            }
            self.update_interest(token, epoll);
        } else {
            self.collect(cqs);
        }
    }

    /// An empty busy-polling round ([`Self::rx_idle`]): `Some(true)` when
    /// its read found nothing, so there is nothing to collect, deliver or
    /// write — only the epoll interest to keep, kept here: the round is
    /// over. `Some(false)`: the read took in bytes, EOF or an error,
    /// staged for the rest of the round; `None`: the fast path does not
    /// apply.
    #[inline(always)]
    pub(crate) fn idle_round(
        &mut self,
        token: u64,
        pool: &mut RxPool,
        epoll: Option<&Epoll>,
    ) -> Option<bool> {
        let empty = self.rx_idle(pool)?;
        if empty {
            self.update_interest(token, epoll);
        }
        Some(empty)
    }

    /// Whether a transmit pass has anything to do: segments queued or half
    /// written, output the core holds (control frames, a Terminate, Sends,
    /// Read Responses, RTR), or a close to finish with a FIN.
    fn tx_wanted(&self) -> bool {
        !self.dead
            && (!self.txq.is_empty()
                || self.conn.has_pending_output()
                || (self.conn.wants_close() && !self.wr_closed))
    }

    /// Transmit-only progress (after a post): no receive attempt, so a
    /// post costs one `sendmsg` at most. Returns whether completions or
    /// events were produced.
    pub(crate) fn service_tx(
        &mut self,
        token: u64,
        reg: &Registry<Mem>,
        cqs: &mut [Option<CqSlot>],
        epoll: Option<&Epoll>,
    ) -> bool {
        let before = self.events.len();
        let cq_before = cq_lens(cqs, self.send_cq, self.recv_cq);
        if !self.dead {
            self.tx(reg, cqs);
            if self.conn.wants_close()
                && self.txq.is_empty()
                && !self.conn.has_pending_output()
                && !self.wr_closed
                && !self.dead
            {
                let _ = self.sock.shutdown(Shutdown::Write);
                self.wr_closed = true;
            }
        }
        self.release_held(cqs);
        self.update_interest(token, epoll);
        self.events.len() != before || cq_lens(cqs, self.send_cq, self.recv_cq) != cq_before
    }

    /// Bytes sealed into segments and not yet accepted by the kernel (the
    /// socket's send buffer was full): only a round after it drains sends
    /// them.
    /// Whether output still to be written reads region `stag`: a Read
    /// Response the core has queued or is sending, or a segment sealed
    /// from it and not yet in the kernel.
    pub(crate) fn reads_region(&self, stag: Stag) -> bool {
        self.conn.reads_pending_from(stag)
            || self.txq.iter().any(|seg| {
                seg.parts()
                    .iter()
                    .any(|p| matches!(p, TxPart::Memory(r) if r.stag == stag))
            })
    }

    pub(crate) fn tx_backlog(&self) -> u64 {
        self.queued - self.written
    }

    /// Registers what the socket should be watched for, if the context
    /// watches its sockets with epoll (`epoll` is `None` until something
    /// needs it: see `State::watch_all`).
    ///
    /// Inlined: without epoll (no progress thread, a busy poller's every
    /// predicted answer) that is the whole of it, not a call (~13
    /// instructions a take; issue 12); the rest is [`Self::set_interest`].
    #[inline(always)]
    pub(crate) fn update_interest(&mut self, token: u64, epoll: Option<&Epoll>) {
        if let Some(epoll) = epoll {
            self.set_interest(token, epoll);
        }
    }

    /// [`Self::update_interest`] with the context's epoll.
    #[inline(never)]
    fn set_interest(&mut self, token: u64, epoll: &Epoll) {
        let mut want = 0;
        if !self.is_done() {
            if !self.rd_closed {
                want |= sys::EP_IN;
            }
            if !self.txq.is_empty() {
                want |= sys::EP_OUT;
            }
        }
        if want == self.interest {
            return;
        }
        let fd = self.sock.as_raw_fd();
        let r = match (self.interest, want) {
            (0, w) => epoll.add(fd, token, w),
            (_, 0) => epoll.delete(fd),
            (_, w) => epoll.modify(fd, token, w),
        };
        if r.is_ok() {
            self.interest = want;
        }
    }

    /// Removes the socket from epoll (before it is closed).
    pub(crate) fn unregister(&mut self, epoll: &Epoll) {
        if self.interest != 0 {
            let _ = epoll.delete(self.sock.as_raw_fd());
            self.interest = 0;
        }
    }
}
