//! The progress engine: per-queue-pair receive (direct placement) and
//! transmit (gathered `sendmsg`) over a non-blocking TCP socket, completion
//! routing to completion queues, and the shared state behind a context.
//!
//! # Receive (direct placement)
//!
//! The core's [`Connection::rx_step`] says what the next stream bytes are:
//! framing ([`RxStep::Bytes`]) is read into a staging buffer and fed to
//! [`Connection::rx_bytes`]; payload ([`RxStep::Place`]) is read
//! with one `readv` straight into the registered region, with a short
//! staging tail in the same call that catches the trailer and the next
//! header. The CRC is folded over the placed bytes where they lie
//! ([`Connection::rx_placed`]). Only payload bytes that happened to arrive
//! in the staging buffer together with headers are copied.
//!
//! Staging buffers (64 KiB) are not owned by queue pairs: a queue pair
//! borrows one from its context's [`RxPool`] when it starts receiving and
//! gives it back as soon as everything staged has been fed to the core
//! (usually at the end of the same service call). Since one context
//! services its queue pairs one at a time under its lock, a context needs
//! about one staging buffer however many queue pairs it has; only a queue
//! pair whose core is paused with staged bytes left over keeps its own
//! until they are consumed. An idle queue pair holds none.
//!
//! # Transmit
//!
//! Segments from [`Connection::next_segment`] are sealed (CRC) and queued;
//! one `sendmsg` gathers the inline bytes of many segments and the payload
//! straight from registered memory (up to [`sys::IOV_MAX`] iovecs). Partial
//! writes resume at the byte where they stopped.
//!
//! The core completes a Send or Write when its last segment is *handed
//! out*; the engine holds such send-queue completions until those bytes
//! are really written to the socket, so an application that reuses a buffer
//! after its completion never races the engine. If the connection dies
//! first, the held completions become flush errors.

use std::collections::VecDeque;
use std::io::{self, IoSlice, IoSliceMut};
use std::net::{Shutdown, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use warpsock_proto::wire::ddp::Opcode;
use warpsock_proto::{
    Connection, Event, Registry, RxStep, TxPart, TxSegment, WcStatus, WorkCompletion, WorkQueue,
};

use crate::mem::Mem;
use crate::sys::{self, Epoll, EventFd};
use crate::Wc;

/// Staging buffer for framing (and small payloads read together with it).
const RX_BUF: usize = 64 * 1024;
/// Spare staging buffers a context keeps.
const RX_POOL_MAX: usize = 4;
/// Staging bytes read together with directly placed payload: enough for a
/// trailer, the next header and a Read Request body.
const RX_TAIL: usize = 256;
/// A payload at least this long counts as large (see `Staging::large`).
const LARGE_PAYLOAD: usize = 4096;
/// Bytes one service call reads from one socket before yielding (fairness).
const RX_BUDGET: usize = 8 << 20;
/// Unwritten bytes queued before the first `sendmsg`.
const TX_BATCH: usize = 4 << 20;
/// Segments queued at most.
const TX_SEGS: usize = 512;
/// Source of [`QpSlot::id`]s.
static NEXT_SLOT_ID: AtomicU64 = AtomicU64::new(1);

/// A completion queue's state.
#[derive(Debug)]
pub(crate) struct CqSlot {
    pub(crate) entries: VecDeque<Wc>,
    pub(crate) notify: EventFd,
    /// The notify fd is readable.
    pub(crate) signaled: bool,
    /// The application asked for the notify fd; until then it is not
    /// maintained (two system calls per completion saved).
    pub(crate) armed: bool,
}

impl CqSlot {
    pub(crate) fn new() -> io::Result<Self> {
        Ok(Self {
            entries: VecDeque::new(),
            notify: EventFd::new()?,
            signaled: false,
            armed: false,
        })
    }

    /// Starts maintaining the notify fd (readable iff entries are queued).
    pub(crate) fn arm(&mut self) {
        self.armed = true;
        if !self.entries.is_empty() && !self.signaled {
            self.signaled = true;
            self.notify.notify();
        }
    }

    fn push(&mut self, wc: Wc) {
        self.entries.push_back(wc);
        if self.armed && !self.signaled {
            self.signaled = true;
            self.notify.notify();
        }
    }

    /// Moves up to `out.len()` completions out; clears the notify fd when
    /// the queue runs empty.
    pub(crate) fn drain_into(&mut self, out: &mut [Wc]) -> usize {
        let n = out.len().min(self.entries.len());
        for (slot, wc) in out.iter_mut().zip(self.entries.drain(..n)) {
            *slot = wc;
        }
        if self.entries.is_empty() && self.signaled {
            self.signaled = false;
            self.notify.clear();
        }
        n
    }
}

/// A context's spare staging buffers (see the module docs).
#[derive(Debug, Default)]
pub(crate) struct RxPool {
    spare: Vec<Box<[u8]>>,
}

impl RxPool {
    fn take(&mut self) -> Box<[u8]> {
        self.spare
            .pop()
            .unwrap_or_else(|| vec![0; RX_BUF].into_boxed_slice())
    }

    fn give(&mut self, buf: Box<[u8]>) {
        if self.spare.len() < RX_POOL_MAX {
            self.spare.push(buf);
        }
    }
}

/// Staging buffer (borrowed from the [`RxPool`] while in use) with a
/// read window.
#[derive(Debug)]
struct Staging {
    /// Borrowed while receiving and while staged bytes are left over.
    buf: Option<Box<[u8]>>,
    start: usize,
    end: usize,
    /// The last payload seen was large: read framing in small pieces.
    large: bool,
}

/// One queue pair on its socket.
///
/// The socket stays in blocking mode: every engine read and write passes
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
    rx: Staging,
    txq: VecDeque<TxSegment>,
    /// Bytes of the front segment already written.
    tx_off: usize,
    pool: Vec<TxSegment>,
    /// The gather list's allocation, kept between `sendmsg` calls (no
    /// allocation per message on the latency path).
    iov_store: Vec<IoSlice<'static>>,
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
    /// The last (parked) read came back short: the socket is drained.
    drained_hint: bool,
    /// Dropped by the application: kept open, discarding input, until the
    /// peer's FIN or this deadline, so that closing never resets a
    /// connection whose peer is still sending (a reset would make the
    /// peer's kernel discard what we sent last).
    pub(crate) detached: Option<Instant>,
}

/// A blocking read of one queue pair's socket, taken out of the context
/// lock by a waiting caller ([`QpSlot::park`] … [`QpSlot::unpark`]).
#[derive(Debug)]
pub(crate) struct ParkedRead {
    pub(crate) slot_id: u64,
    fd: RawFd,
    buf: Box<[u8]>,
    cap: usize,
}

impl ParkedRead {
    /// Sleeps in `recv` until bytes, EOF, an error or the timeout given to
    /// [`QpSlot::park`] (`WouldBlock`).
    pub(crate) fn read(&mut self) -> io::Result<usize> {
        sys::recv_wait(self.fd, &mut self.buf[..self.cap])
    }

    /// Gives the staging buffer back when the slot went away meanwhile.
    pub(crate) fn discard(self, pool: &mut RxPool) {
        pool.give(self.buf);
    }
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
            rx: Staging {
                buf: None,
                start: 0,
                end: 0,
                large: false,
            },
            txq: VecDeque::new(),
            tx_off: 0,
            pool: Vec::new(),
            iov_store: Vec::new(),
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
            drained_hint: false,
            detached: None,
        }
    }

    /// Prepares a blocking read for a caller about to sleep, if this slot's
    /// next input can only be framing (no payload to place directly,
    /// nothing staged, nothing waiting to be written — a blocked transmit
    /// needs epoll's writability). The read times out after `timeout`
    /// (rounded up to whole milliseconds, at least one).
    pub(crate) fn park(&mut self, pool: &mut RxPool, timeout: Duration) -> Option<ParkedRead> {
        if self.parked
            || self.is_done()
            || self.rd_closed
            || self.detached.is_some()
            || !self.txq.is_empty()
            || self.rx.start < self.rx.end
            || self.conn.wants_close()
            || !matches!(self.conn.rx_step(), RxStep::Bytes(_))
        {
            return None;
        }
        let ms = timeout.as_nanos().div_ceil(1_000_000).max(1);
        let t = Duration::from_millis(ms.min(u64::MAX as u128) as u64);
        if self.rcvtimeo != Some(t) {
            self.sock.set_read_timeout(Some(t)).ok()?;
            self.rcvtimeo = Some(t);
        }
        let buf = self.rx.buf.take().unwrap_or_else(|| pool.take());
        let cap = if self.rx.large { RX_TAIL } else { buf.len() };
        self.parked = true;
        Some(ParkedRead {
            slot_id: self.id,
            fd: self.sock.as_raw_fd(),
            buf,
            cap,
        })
    }

    /// Takes back a parked read and its result: the bytes become staged
    /// input (fed to the core by the next service), EOF and errors are
    /// handled as a non-blocking read's would be.
    pub(crate) fn unpark(&mut self, p: ParkedRead, res: io::Result<usize>) {
        self.parked = false;
        self.rx.buf = Some(p.buf);
        match res {
            Ok(0) => {
                self.rd_closed = true;
                self.conn.handle_eof();
            }
            Ok(n) => {
                self.rx.start = 0;
                self.rx.end = n;
                self.drained_hint = n < p.cap;
            }
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
                ) => {}
            Err(e) => self.fail_with(&e),
        }
    }

    /// Stages stream bytes read before the slot existed (FPDUs that
    /// arrived right behind the MPA frame); the next service feeds them.
    pub(crate) fn stage(&mut self, bytes: &[u8], pool: &mut RxPool) {
        let mut buf = self.rx.buf.take().unwrap_or_else(|| pool.take());
        let n = bytes.len().min(buf.len());
        buf[..n].copy_from_slice(&bytes[..n]);
        self.rx.buf = Some(buf);
        self.rx.start = 0;
        self.rx.end = n;
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

    /// The socket failed with `e`: remembered (see `Qp::socket_error`),
    /// then everything outstanding is flushed.
    fn fail_with(&mut self, e: &io::Error) {
        if self.error.is_none() {
            self.error = e.raw_os_error();
        }
        self.fail();
    }

    fn fail(&mut self) {
        self.dead = true;
        self.conn.handle_eof();
        self.txq.clear();
        self.tx_off = 0;
        self.rx.start = 0;
        self.rx.end = 0;
        self.rx.buf = None;
    }

    /// Receives (see [`Self::rx_inner`]) with a staging buffer borrowed
    /// from `pool`, returned once nothing staged is left.
    fn rx(&mut self, reg: &mut Registry<Mem>, pool: &mut RxPool) {
        if self.parked {
            // A parked caller owns the reading side until it comes back.
            return;
        }
        if self.rx.buf.is_none() {
            self.rx.buf = Some(pool.take());
        }
        self.rx_inner(reg);
        if self.rx.start == self.rx.end {
            if let Some(buf) = self.rx.buf.take() {
                pool.give(buf);
            }
        }
    }

    /// Abortive close: everything outstanding is flushed and closing the
    /// socket (when the slot is dropped) sends RST instead of FIN.
    pub(crate) fn abort(&mut self) {
        let _ = sys::set_linger_zero(self.sock.as_raw_fd());
        self.conn.close();
        self.fail();
    }

    /// Receives as much as is available (bounded), placing payload directly.
    fn rx_inner(&mut self, reg: &mut Registry<Mem>) {
        let mut budget = RX_BUDGET;
        // A read that returned less than it asked for found the socket
        // drained: another read now would almost always be a futile
        // EAGAIN (one system call per message on the latency path). Data
        // that arrives later makes the socket readable again, and epoll is
        // level-triggered, so nothing is missed.
        let mut drained = std::mem::take(&mut self.drained_hint);
        loop {
            self.feed_staged(reg);
            if self.rx.start < self.rx.end || self.rd_closed || self.dead || budget == 0 || drained
            {
                return;
            }
            let Some(buf) = self.rx.buf.as_deref_mut() else {
                return;
            };
            // After a local close (or a Terminate) input is discarded.
            let step = if self.conn.wants_close() {
                RxStep::Closed
            } else {
                self.conn.rx_step()
            };
            let res = match step {
                RxStep::Place(r) => {
                    self.rx.large = r.len >= LARGE_PAYLOAD as u64;
                    let Some(dst) = reg.slice_mut(r.stag, r.offset, r.len as usize) else {
                        // The region was deregistered under an in-flight
                        // operation: the stream cannot continue. The peer
                        // gets a Terminate; the rest of its input is
                        // discarded.
                        self.conn.fail_local(None, false);
                        continue;
                    };
                    let want = dst.len();
                    let tail = &mut buf[..RX_TAIL];
                    match sys::recv_vectored_dontwait(
                        self.sock.as_raw_fd(),
                        &mut [IoSliceMut::new(dst), IoSliceMut::new(tail)],
                    ) {
                        Ok(0) => Ok(0),
                        Ok(n) => {
                            drained = n < want + RX_TAIL;
                            let placed = n.min(want);
                            // Re-borrow the placed bytes to fold them into the CRC.
                            if let Some(dst) = reg.slice(r.stag, r.offset, placed) {
                                self.conn.rx_placed(dst);
                            }
                            self.rx.start = 0;
                            self.rx.end = n - placed;
                            Ok(n)
                        }
                        Err(e) => Err(e),
                    }
                }
                RxStep::Bytes(_) | RxStep::Closed => {
                    // While large payloads stream in, read only about a
                    // header's worth here, so the payload behind it is
                    // placed directly instead of copied out of staging.
                    let cap = if self.rx.large { RX_TAIL } else { buf.len() };
                    let r = sys::recv_dontwait(self.sock.as_raw_fd(), &mut buf[..cap]);
                    if let Ok(n) = r {
                        drained = n < cap;
                        self.rx.start = 0;
                        self.rx.end = n;
                    }
                    r
                }
                RxStep::Blocked => return,
            };
            match res {
                Ok(0) => {
                    self.rd_closed = true;
                    self.conn.handle_eof();
                    return;
                }
                Ok(n) => budget = budget.saturating_sub(n),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    self.fail_with(&e);
                    return;
                }
            }
        }
    }

    /// Feeds staged bytes to the core (copying payload that arrived with
    /// framing into place).
    fn feed_staged(&mut self, reg: &mut Registry<Mem>) {
        while self.rx.start < self.rx.end {
            let Some(buf) = self.rx.buf.as_deref() else {
                break;
            };
            let staged = &buf[self.rx.start..self.rx.end];
            let closing = self.conn.wants_close();
            if !closing {
                // A whole small FPDU in one pass when it is all here (the
                // common case for small messages; the core declines
                // anything else at no cost), else piece by piece.
                let whole = self.conn.rx_fpdu(staged, reg);
                if whole > 0 {
                    self.rx.start += whole;
                    continue;
                }
            }
            let step = if closing {
                RxStep::Closed
            } else {
                self.conn.rx_step()
            };
            match step {
                RxStep::Bytes(_) => {
                    let k = self.conn.rx_bytes(staged, reg);
                    if k == 0 {
                        break;
                    }
                    self.rx.start += k;
                }
                RxStep::Place(r) => {
                    self.rx.large = r.len >= LARGE_PAYLOAD as u64;
                    let n = (r.len as usize).min(staged.len());
                    match reg.slice_mut(r.stag, r.offset, n) {
                        Some(dst) => {
                            dst.copy_from_slice(&staged[..n]);
                            self.conn.rx_placed(dst);
                            self.rx.start += n;
                        }
                        None => self.conn.fail_local(None, false),
                    }
                }
                RxStep::Closed => self.rx.start = self.rx.end,
                RxStep::Blocked => break,
            }
        }
        if self.rx.start == self.rx.end {
            self.rx.start = 0;
            self.rx.end = 0;
        }
    }

    /// Produces and writes segments until the socket would block or there
    /// is nothing more to send.
    fn tx(&mut self, reg: &Registry<Mem>, cqs: &mut [Option<CqSlot>]) {
        // Once the core has said it has nothing more, it says so until it
        // is given input or a post, neither of which happens in here:
        // asking again after the write would be an empty call (one of
        // the four `next_segment` calls per message was).
        let mut exhausted = false;
        while !self.dead {
            // Refill the queue.
            // (Asking `has_pending_output` before the first call as well
            // would skip the receive side's empty call too; tried and
            // dropped: with that loop siw in the test VM reported MPA CRC
            // errors, 5 runs of 5 (1 in 6 without it), on streams whose
            // every FPDU CRC checks out in the host-side capture — see
            // BENCHMARKS.md §3.)
            while !exhausted
                && self.txq.len() < TX_SEGS
                && (self.queued - self.written) < TX_BATCH as u64
            {
                let mut seg = self.pool.pop().unwrap_or_default();
                if !self.conn.next_segment(reg, &mut seg) {
                    self.pool.push(seg);
                    exhausted = true;
                    break;
                }
                if !seg.seal(reg) {
                    // A payload region vanished under an active request.
                    let read_response = self.segment_is_read_response(&seg);
                    self.pool.push(seg);
                    self.fail_segment(read_response, cqs);
                    break;
                }
                self.queued += seg.len() as u64;
                self.txq.push_back(seg);
                self.collect(cqs);
            }
            if self.txq.is_empty() {
                break;
            }
            let mut iov = recycle(std::mem::take(&mut self.iov_store));
            let mut skip = self.tx_off;
            let mut vanished = false;
            'gather: for seg in &self.txq {
                for p in seg.parts() {
                    let bytes = match *p {
                        TxPart::Inline { start, end } => &seg.inline_bytes()[start..end],
                        TxPart::Memory(r) => match reg.slice(r.stag, r.offset, r.len as usize) {
                            Some(b) => b,
                            None => {
                                vanished = true;
                                break 'gather;
                            }
                        },
                    };
                    if skip >= bytes.len() {
                        skip -= bytes.len();
                        continue;
                    }
                    iov.push(IoSlice::new(&bytes[skip..]));
                    skip = 0;
                    if iov.len() == sys::IOV_MAX {
                        break 'gather;
                    }
                }
            }
            if iov.is_empty() && vanished {
                self.iov_store = recycle(iov);
                // A region went away under segments already queued (the
                // front one possibly half written): the stream cannot be
                // framed any more. Everything is flushed, and the peer sees
                // the stream end now (not when the QP is dropped): FIN,
                // mid-FPDU.
                self.abort();
                let _ = self.sock.shutdown(Shutdown::Both);
                break;
            }
            let sent = sys::send_vectored(self.sock.as_raw_fd(), &iov);
            self.iov_store = recycle(iov);
            match sent {
                Ok(n) => self.advance_tx(n),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => self.fail_with(&e),
            }
        }
        // The caller (`service_tx`) releases the held completions next.
    }

    /// Whether `seg` carries an RDMA Read Response (its payload is our
    /// exposed region, not a local request's buffer). Unknown with
    /// markers, which may sit inside the header: then no.
    fn segment_is_read_response(&self, seg: &TxSegment) -> bool {
        if self.conn.negotiated().is_none_or(|n| n.markers_tx) {
            return false;
        }
        let Some(&TxPart::Inline { start, end }) = seg.parts().first() else {
            return false;
        };
        // MPA length (2), DDP control (1), RDMAP control: opcode in bits 0-3.
        let hdr = &seg.inline_bytes()[start..end];
        hdr.len() >= 4 && hdr[3] & 0x0f == Opcode::RdmaReadResponse as u8
    }

    /// A segment could not be sealed because its payload region is gone:
    /// the peer gets a Terminate (local catastrophic error), the request
    /// that segment belonged to completes with `LocalProtectionError`
    /// (unless it was the peer's Read, answered from our region), the rest
    /// is flushed. The segments queued before it still go out, so the
    /// stream stays framed.
    fn fail_segment(&mut self, read_response: bool, cqs: &mut [Option<CqSlot>]) {
        // The core completes a Send or Write when its last segment is
        // handed out: if this was that segment, its completion is already
        // waiting (every earlier one was collected after its segment).
        let mut marked = false;
        while let Some(mut wc) = self.conn.poll_completion() {
            match wc.queue {
                WorkQueue::Recv => push_wc(cqs, self.recv_cq, self.qp_num, wc),
                WorkQueue::Send => {
                    if wc.status == WcStatus::Success && !read_response {
                        wc.status = WcStatus::LocalProtectionError;
                        wc.byte_len = 0;
                        marked = true;
                    }
                    self.held.push_back((self.queued, wc));
                }
            }
        }
        self.conn.fail_local(None, !read_response && !marked);
    }

    fn advance_tx(&mut self, n: usize) {
        self.written += n as u64;
        self.tx_off += n;
        while let Some(front) = self.txq.front() {
            if self.tx_off < front.len() {
                break;
            }
            self.tx_off -= front.len();
            let seg = self.txq.pop_front().expect("front exists");
            self.pool.push(seg);
        }
    }

    /// Drains the core's completions and events: receive completions go
    /// out at once, send-queue completions wait for their bytes.
    fn collect(&mut self, cqs: &mut [Option<CqSlot>]) {
        while let Some(wc) = self.conn.poll_completion() {
            match wc.queue {
                WorkQueue::Recv => push_wc(cqs, self.recv_cq, self.qp_num, wc),
                WorkQueue::Send => self.held.push_back((self.queued, wc)),
            }
        }
        while let Some(e) = self.conn.poll_event() {
            self.events.push_back(e);
        }
    }

    fn release_held(&mut self, cqs: &mut [Option<CqSlot>]) {
        self.collect(cqs);
        while let Some(&(mark, mut wc)) = self.held.front() {
            if mark > self.written {
                if !self.dead {
                    break;
                }
                // Never reached the socket.
                wc.status = WcStatus::WrFlushError;
                wc.byte_len = 0;
            }
            self.held.pop_front();
            push_wc(cqs, self.send_cq, self.qp_num, wc);
        }
    }

    /// One round of progress: receive, transmit, close handling, epoll
    /// interest (when `epoll` is given). Returns whether completions or
    /// events were produced.
    pub(crate) fn service(
        &mut self,
        token: u64,
        reg: &mut Registry<Mem>,
        cqs: &mut [Option<CqSlot>],
        pool: &mut RxPool,
        epoll: Option<&Epoll>,
    ) -> bool {
        let before = self.events.len();
        let cq_before = cq_lens(cqs, self.send_cq, self.recv_cq);
        if !self.dead {
            self.rx(reg, pool);
            self.collect(cqs);
        }
        self.service_tx(token, reg, cqs, epoll);
        self.events.len() != before || cq_lens(cqs, self.send_cq, self.recv_cq) != cq_before
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

    /// Registers what the socket should be watched for, if the context
    /// watches its sockets with epoll (`epoll` is `None` until something
    /// needs it: see `State::watch_all`).
    pub(crate) fn update_interest(&mut self, token: u64, epoll: Option<&Epoll>) {
        let Some(epoll) = epoll else {
            return;
        };
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

/// Empties a gather list and hands its allocation over to a list of
/// another lifetime (an empty `Vec` of the same layout is collected in
/// place, without allocating).
fn recycle<'b>(mut v: Vec<IoSlice<'_>>) -> Vec<IoSlice<'b>> {
    v.clear();
    v.into_iter()
        .map(|_| unreachable!("the list is empty"))
        .collect()
}

fn cq_lens(cqs: &[Option<CqSlot>], a: usize, b: usize) -> (usize, usize) {
    let len = |i: usize| {
        cqs.get(i)
            .and_then(|c| c.as_ref())
            .map_or(0, |c| c.entries.len())
    };
    (len(a), len(b))
}

fn push_wc(cqs: &mut [Option<CqSlot>], cq: usize, qp_num: u32, wc: WorkCompletion) {
    if let Some(Some(cq)) = cqs.get_mut(cq) {
        cq.push(Wc::from_core(wc, qp_num));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recycled_gather_list_keeps_its_allocation() {
        let data = [1u8, 2, 3];
        let mut v: Vec<IoSlice<'_>> = Vec::with_capacity(64);
        v.push(IoSlice::new(&data));
        let ptr = v.as_ptr() as usize;
        let w: Vec<IoSlice<'static>> = recycle(v);
        assert!(w.is_empty());
        assert!(w.capacity() >= 64);
        assert_eq!(w.as_ptr() as usize, ptr);
    }
}
