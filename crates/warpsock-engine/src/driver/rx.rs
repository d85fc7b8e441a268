//! The receive half of the socket driver (the core's `conn/rx.rs` is its
//! protocol side): staging buffers, direct placement with `readv`, the
//! blocking read a waiting caller parks in.

use std::io::{self, IoSliceMut};
use std::os::fd::{AsRawFd, RawFd};
use std::time::Duration;

use warpsock_proto::{Registry, RxPiece, RxStep};

use super::QpSlot;
use crate::mem::{self, Mem};
use crate::sys;

/// Staging buffer for framing (and small payloads read together with it).
const RX_BUF: usize = 64 * 1024;
/// Spare staging buffers a context keeps.
const RX_POOL_MAX: usize = 4;
/// Staging bytes read together with directly placed payload: enough for a
/// trailer, the next header and a Read Request body.
const RX_TAIL: usize = 256;
/// An FPDU payload at least this long counts as large (see
/// `Staging::large`).
const LARGE_PAYLOAD: usize = 4096;
/// Most payload bytes one planned read (several FPDUs of one message) asks
/// for.
const RX_PLAN: usize = 1 << 20;
/// Bytes one service call reads from one socket before yielding (fairness).
const RX_BUDGET: usize = 8 << 20;

/// A context's spare staging buffers (see the module docs).
#[derive(Debug, Default)]
pub(crate) struct RxPool {
    spare: Vec<Box<[u8]>>,
}

impl RxPool {
    // The pool's steps are inlined with their rare paths (a buffer made,
    // a spare dropped) kept out of line: a busy poller's every empty spin
    // asks `next_spare` and every predicted answer `take` and `give`
    // (issue 12: ~80 instructions a ping-pong's round trip as calls).
    // Always: as `#[inline]` alone they stayed calls inside the quiet
    // spin's large frame (`recv_quiet_locked`), ~20 instructions each.
    #[inline(always)]
    fn take(&mut self) -> Box<[u8]> {
        match self.spare.pop() {
            Some(b) => b,
            None => Self::fresh(),
        }
    }

    /// The buffer [`Self::take`] would return next, left in the pool.
    #[inline(always)]
    fn next_spare(&mut self) -> &mut [u8] {
        if self.spare.is_empty() {
            self.add_spare();
        }
        self.spare.last_mut().expect("one spare at least")
    }

    #[inline]
    fn give(&mut self, buf: Box<[u8]>) {
        if self.spare.len() < RX_POOL_MAX {
            self.spare.push(buf);
        } else {
            Self::discard(buf);
        }
    }

    /// A new staging buffer.
    #[cold]
    #[inline(never)]
    fn fresh() -> Box<[u8]> {
        vec![0; RX_BUF].into_boxed_slice()
    }

    #[cold]
    #[inline(never)]
    fn add_spare(&mut self) {
        self.spare.push(Self::fresh());
    }

    /// A buffer given back to a full pool: freed.
    #[cold]
    #[inline(never)]
    fn discard(buf: Box<[u8]>) {
        drop(buf);
    }
}

/// Staging buffer (borrowed from the [`RxPool`] while in use) with a
/// read window.
#[derive(Debug, Default)]
pub(super) struct Staging {
    /// Borrowed while receiving and while staged bytes are left over.
    buf: Option<Box<[u8]>>,
    start: usize,
    end: usize,
    /// Large payloads stream in (`note_payload`: the last large FPDU came
    /// after the last two messages that began with a small one; a
    /// receive's 8-byte scatter entry in a 64 KiB FPDU is not a small
    /// message): read framing in small pieces, so the payload behind it is
    /// placed directly, not staged.
    large: bool,
    /// Messages in a row that began with a small FPDU (`note_payload`).
    smalls: u8,
    /// The layout of the last planned read (kept for its allocation).
    plan: Vec<RxPiece>,
}

impl Staging {
    /// Drops whatever is staged (the connection is dead).
    pub(super) fn clear(&mut self) {
        self.start = 0;
        self.end = 0;
        self.buf = None;
    }

    /// Whether staged bytes wait to be fed to the core.
    pub(super) fn has_staged(&self) -> bool {
        self.start < self.end
    }
}

/// A blocking read of one queue pair's socket, taken out of the context
/// lock by a waiting caller ([`QpSlot::park`] … [`QpSlot::unpark`]).
#[derive(Debug)]
pub(crate) struct ParkedRead {
    /// The queue pair's index in its context (`State::qps`).
    pub(crate) qi: usize,
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

    /// [`Self::read`] for an interruptible wait past its first empty slice
    /// (see `Cq::wait_rounds`): sleeps in `poll` on the socket for up to
    /// `timeout`, then reads what is there without blocking. A signal that
    /// ends the sleep is always `Interrupted`: `poll` looks for a pending
    /// signal before it looks at its timeout, whose high-resolution timer
    /// leaves no window worth the name — where the blocking read's
    /// `SO_RCVTIMEO` (in jiffies) returns `EAGAIN` to a signal that wakes it
    /// after the timeout's jiffy passed (Linux `tcp_recvmsg_locked` checks
    /// `!timeo` before `signal_pending`), about the last quarter of each
    /// slice here (issue 12). `WouldBlock`: the timeout passed.
    ///
    /// `POLLERR` alone with nothing to read is an entry in the socket's
    /// error queue (`SO_TIMESTAMPING`'s transmit stamps, `IP_RECVERR`'s
    /// ICMP errors: options set on this socket — by a program before the
    /// switch, whose stamps for bytes sent before it can come after the
    /// preload turned them off, review r23-a item 2), which `poll` reports
    /// at once for as long as it stays: the wait slept no more and spun at
    /// 100 % CPU (review r22-d item 2). Nobody here reads them: they are
    /// dropped ([`sys::drain_error_queue`]) and the slice ends as one that
    /// timed out (`WouldBlock`: the caller's next round sleeps again, its
    /// deadline its own). Only if there were none (the socket's own error,
    /// which the read below reports, or another reader took them) does it
    /// sleep in the blocking read (its timeout the slice, set by `park`),
    /// with that read's signal race.
    ///
    /// On a socket switched in band (`warpsock_xsock`, the preload's
    /// DDP-mode sockets, whose progress thread runs this) the drop finds
    /// nothing, and takes nothing the program could have read: the
    /// entries that socket's program would see over TCP cannot exist.
    /// Its options that make them are kept off the socket from the
    /// switch's start (`SO_TIMESTAMPING`'s transmit flags, the
    /// `SO_TIMESTAMP(NS)` forms, `IP_RECVERR`, `IPV6_RECVERR`; a socket
    /// with `SO_ZEROCOPY` on is not switched; the preload's `Kept`), the
    /// engine sets none itself and sends without control messages or
    /// `MSG_ZEROCOPY`, and TCP queues ICMP errors only while it connects
    /// (`tcp_v4_err`/`tcp_v6_err` call `ip(v6)_icmp_error` in `SYN_SENT`
    /// and `SYN_RECV` alone). Stamps of bytes the program sent before the
    /// switch with the options on all come before the switch's last read
    /// (the peer's last frame acknowledges them) and the switch drops them
    /// (`warpsock_xsock`'s `last_entries`): what the program reads with
    /// `MSG_ERRQUEUE` is `EAGAIN` (preload: `DdpSock::recv_full`), as over
    /// a path that makes no stamps. The drop stays for sockets handed over
    /// otherwise (`connect_stream` on a socket with such options on).
    /// `marked` runs the `poll` (the sleep that reads nothing: see
    /// `crate::asleep`).
    pub(crate) fn read_polled(
        &mut self,
        timeout: Duration,
        marked: impl FnOnce(&mut dyn FnMut() -> io::Result<i16>) -> io::Result<i16>,
    ) -> io::Result<usize> {
        let fd = self.fd;
        let revents = marked(&mut || sys::poll_readable(fd, timeout))?;
        if revents == 0 {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        match sys::recv_dontwait(self.fd, &mut self.buf[..self.cap]) {
            Err(e)
                if e.kind() == io::ErrorKind::WouldBlock
                    && revents & (libc::POLLIN | libc::POLLHUP) == 0 =>
            {
                if revents & libc::POLLERR != 0 && sys::drain_error_queue(self.fd) > 0 {
                    return Err(e);
                }
                self.read()
            }
            r => r,
        }
    }

    /// Gives the staging buffer back when the slot went away meanwhile.
    pub(crate) fn discard(self, pool: &mut RxPool) {
        pool.give(self.buf);
    }
}

/// Notes an FPDU with `payload` bytes (`continues`: it continues a
/// message earlier FPDUs began) in a staging buffer's `large` and `smalls`
/// ([`Staging::large`]): at its first placement step (`rx_payload_start`),
/// or once `rx_fpdu` took it whole (`rx_whole_fpdu`; a small one only
/// while the reads are small). A large payload makes the reads small;
/// small payloads make them large again only from the second message in a
/// row that begins with one. Neither the short last FPDU of a large
/// message (a 128 KiB write is two 64 KiB FPDUs and one of 56 payload
/// bytes) nor one short message between large ones (a program's short
/// write) does: behind either, the next message's first FPDU was read
/// whole into staging and copied, and, being exactly a staging buffer's
/// length, so was every FPDU after it (a read of 64 KiB at an FPDU's start
/// finds one whole FPDU, which `rx_fpdu` takes without a placement step):
/// about two thirds of an `iperf3` stream's bytes went kernel → staging →
/// slot → program. Not noted: one-FPDU Sends taken by the predicted path
/// or in a planned read's tail, which neither end small reads nor count
/// toward their end.
#[inline]
fn note_payload(large: &mut bool, smalls: &mut u8, payload: usize, continues: bool) {
    if payload >= LARGE_PAYLOAD {
        *large = true;
        *smalls = 0;
    } else if !continues {
        *smalls = smalls.saturating_add(1);
        if *smalls >= 2 {
            *large = false;
        }
    }
}

impl QpSlot {
    /// Prepares a blocking read for a caller about to sleep, if this slot's
    /// next input can only be framing (no payload to place directly,
    /// nothing staged, nothing waiting to be written — a blocked transmit
    /// needs epoll's writability). The read times out after `timeout`
    /// (rounded up to whole milliseconds, at least one). `qi`: this slot's
    /// index, kept in the read (built once, where the caller returns it).
    pub(crate) fn park(
        &mut self,
        qi: usize,
        pool: &mut RxPool,
        timeout: Duration,
    ) -> Option<ParkedRead> {
        if self.parked
            || self.is_done()
            || self.rd_closed
            || self.detached.is_some()
            || !self.txq.is_empty()
            || self.rx.has_staged()
            || self.conn.wants_close()
            || !self.conn.rx_wants_bytes()
        {
            return None;
        }
        // The same timeout as the last park (a blocking ping-pong's every
        // receive asks for one park slice) needs no rounding again.
        if self.park_for != Some(timeout) {
            let ms = timeout.as_nanos().div_ceil(1_000_000).max(1);
            let t = Duration::from_millis(ms.min(u64::MAX as u128) as u64);
            if self.rcvtimeo != Some(t) {
                self.sock.set_read_timeout(Some(t)).ok()?;
                self.rcvtimeo = Some(t);
            }
            self.park_for = Some(timeout);
        }
        let buf = self.rx.buf.take().unwrap_or_else(|| pool.take());
        let cap = if self.rx.large { RX_TAIL } else { buf.len() };
        self.parked = true;
        Some(ParkedRead {
            qi,
            slot_id: self.id,
            fd: self.sock.as_raw_fd(),
            buf,
            cap,
        })
    }

    /// A parked read abandoned ([`crate::Cq::abandon_park`]): its buffer
    /// stays with the sleeping frame; rounds read the socket again.
    pub(crate) fn abandon_park(&mut self) {
        self.parked = false;
    }

    /// Takes back a parked read and its result: the bytes become staged
    /// input (fed to the core by the next service), EOF and errors are
    /// handled as a non-blocking read's would be.
    pub(crate) fn unpark(&mut self, p: ParkedRead, res: io::Result<usize>) {
        self.parked = false;
        self.io.parked_reads += 1;
        self.rx.buf = Some(p.buf);
        self.take_read(res, p.cap);
    }

    /// The empty busy-polling round's fast path (issue 12): when nothing
    /// is staged, held, reported or owed to the socket and the next input
    /// can only be framing, the read [`Self::rx_inner`] would make is made
    /// here, without asking the core for its step. `Some(true)`: it found
    /// nothing (`EAGAIN`) — the core saw no input, so the round has
    /// nothing to collect, deliver or count, and is over; also after a
    /// read that came back short, when [`Self::rx_inner`] would not read
    /// (`drained_hint`). `Some(false)`: the read's result is taken as a
    /// parked read's ([`Self::unpark`]) and the round goes on as usual.
    /// `None`: the fast path does not apply (nothing read).
    #[inline(always)]
    pub(super) fn rx_idle(&mut self, pool: &mut RxPool) -> Option<bool> {
        if self.parked || self.rx.has_staged() || !self.rx_alone() {
            return None;
        }
        if std::mem::take(&mut self.drained_hint) {
            if let Some(buf) = self.rx.buf.take() {
                pool.give(buf);
            }
            return Some(true);
        }
        // The read goes into the buffer the round would borrow — the
        // slot's, else the pool's next spare, left in the pool unless the
        // read brings something (an empty read moves no buffer).
        let fd = self.sock.as_raw_fd();
        let large = self.rx.large;
        let buf = match self.rx.buf.as_deref_mut() {
            Some(b) => b,
            None => pool.next_spare(),
        };
        let cap = if large { RX_TAIL } else { buf.len() };
        let res = sys::recv_dontwait_errno(fd, &mut buf[..cap]);
        if res == Err(libc::EAGAIN) {
            self.rx_drained = true;
            self.io.reads += 1;
            self.io.idle_reads += 1;
            if let Some(b) = self.rx.buf.take() {
                pool.give(b);
            }
            return Some(true);
        }
        if self.rx.buf.is_none() {
            self.rx.buf = Some(pool.take());
        }
        self.take_read(res.map_err(io::Error::from_raw_os_error), cap);
        Some(false)
    }

    /// The terms of [`Self::rx_idle`] that are the connection's own, not
    /// the read's: nothing held, reported, queued for the socket, closing
    /// or owed to it, and the next input framing (no payload to place) —
    /// so a round's only work can be the input a read brings. Also asked
    /// of a parked read's bytes before they are predicted
    /// (`Cq::park_first`: other threads may have posted while it slept).
    #[inline(always)]
    pub(crate) fn rx_alone(&self) -> bool {
        !(self.dead
            || self.rd_closed
            || !self.held.is_empty()
            || !self.txq.is_empty()
            || self.conn.has_reports()
            || self.conn.wants_close()
            || self.conn.has_pending_output()
            || !self.conn.rx_wants_bytes())
    }

    /// The predicted receive (issue 12), right after [`Self::rx_idle`]'s
    /// read took bytes in (`Some(false)`), or a first park's
    /// (`Cq::park_first`: [`Self::rx_alone`] asked again after the sleep,
    /// with `rx_idle`'s other terms — the connection's, as below, are
    /// those): when that read came back short
    /// (the socket drained) with exactly one whole FPDU that the core
    /// predicts ([`Connection::rx_send_predicted`]: a one-FPDU Send into
    /// the head receive), `take` gets the receive's `wr_id` and the
    /// payload where the read put it; if it takes it, the core has
    /// advanced and posted the receive again in place, and what the rest
    /// of the round (`service_round`) would have done is done here:
    ///
    /// - `rx`/`rx_inner`: `feed_staged` consumed every staged byte (the
    ///   window is reset) and the staging buffer goes back to the pool;
    ///   the drained hint is taken (its read came back short, so
    ///   `rx_inner` reads no more: a full read declines here, as the round
    ///   would read again);
    /// - `collect`: nothing to collect — `rx_idle` found no report, and a
    ///   predicted take queues no completion and no event (the core
    ///   declines before its first FPDU, whose `Established` is one);
    /// - the transmit pass: not wanted (`rx_idle` found nothing queued,
    ///   pending or closing, and a Send received makes no output), so the
    ///   round's `deliver_held` (nothing held: `rx_idle`) and
    ///   `update_interest`, made here (the interest is unchanged: no end,
    ///   nothing queued — a no-op but for a socket not yet registered).
    ///
    /// `None`: nothing taken, nothing changed; the round goes on as usual.
    ///
    /// [`Connection::rx_send_predicted`]: warpsock_proto::Connection::rx_send_predicted
    #[inline(always)]
    pub(crate) fn rx_predicted<R>(
        &mut self,
        token: u64,
        reg: &Registry<Mem>,
        pool: &mut RxPool,
        epoll: Option<&sys::Epoll>,
        take: impl FnOnce(u64, &[u8]) -> Option<R>,
    ) -> Option<R> {
        if !self.drained_hint || self.dead || self.rd_closed || self.rx.start != 0 {
            return None;
        }
        let buf = self.rx.buf.as_deref()?;
        let got = self
            .conn
            .rx_send_predicted(&buf[..self.rx.end], reg, take)?;
        self.rx.end = 0;
        self.drained_hint = false;
        if let Some(b) = self.rx.buf.take() {
            pool.give(b);
        }
        self.update_interest(token, epoll);
        Some(got)
    }

    /// Takes the result of a read of up to `cap` bytes into the staging
    /// buffer made outside [`Self::rx_inner`]: bytes become staged input,
    /// EOF and errors are handled as its read's would be. Inlined as its
    /// bytes' case (every predicted answer's read: as a call, ~24
    /// instructions a take; issue 12); EOF and errors out of line
    /// ([`Self::take_read_end`]).
    #[inline(always)]
    fn take_read(&mut self, res: io::Result<usize>, cap: usize) {
        self.io.reads += 1;
        match res {
            Ok(n) if n > 0 => {
                self.io.read_bytes += n as u64;
                self.rx.start = 0;
                self.rx.end = n;
                self.drained_hint = n < cap;
                self.rx_drained = n < cap;
            }
            Ok(_) => {
                self.rx_drained = true;
                self.take_read_end(None);
            }
            Err(e) => self.take_read_end(Some(e)),
        }
    }

    /// [`Self::take_read`] of a read that brought no bytes: EOF (`None`)
    /// or the read's error.
    #[inline(never)]
    fn take_read_end(&mut self, err: Option<io::Error>) {
        match err {
            None => {
                self.rd_closed = true;
                self.conn.handle_eof();
            }
            Some(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
                ) => {}
            Some(e) => self.fail_with(&e),
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

    /// Receives (see [`Self::rx_inner`]) with a staging buffer borrowed
    /// from `pool`, returned once nothing staged is left.
    pub(super) fn rx(&mut self, reg: &mut Registry<Mem>, pool: &mut RxPool) {
        if self.parked {
            // A parked caller owns the reading side until it comes back.
            return;
        }
        if self.rx.buf.is_none() {
            self.rx.buf = Some(pool.take());
        }
        self.rx_inner(reg);
        if !self.rx.has_staged() {
            if let Some(buf) = self.rx.buf.take() {
                pool.give(buf);
            }
        }
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
            if self.rx.has_staged() || self.rd_closed || self.dead || budget == 0 || drained {
                return;
            }
            // After a local close (or a Terminate) input is discarded.
            let step = if self.conn.wants_close() {
                RxStep::Closed
            } else {
                self.conn.rx_step()
            };
            let planned = match step {
                RxStep::Place(_) => self.read_planned(reg, &mut drained),
                _ => None,
            };
            let res = match (planned, step) {
                (Some(res), _) => res,
                (None, RxStep::Place(r)) => {
                    let Some(buf) = self.rx.buf.as_deref_mut() else {
                        return;
                    };
                    // Noted for this read's size, kept only if it brings
                    // bytes: a read that finds none (`EAGAIN`) leaves the
                    // FPDU to be noted again by the next one.
                    let (mut large, mut smalls) = (self.rx.large, self.rx.smalls);
                    if let Some(continues) = self.conn.rx_payload_start() {
                        note_payload(
                            &mut large,
                            &mut smalls,
                            self.conn.rx_payload_len(),
                            continues,
                        );
                    }
                    let Some(dst) = reg.range_slice_mut(&r, r.len as usize) else {
                        // The region was deregistered under an in-flight
                        // operation: the stream cannot continue. The peer
                        // gets a Terminate; the rest of its input is
                        // discarded.
                        self.conn.fail_local(None, false);
                        continue;
                    };
                    let want = dst.len();
                    // Behind a large payload only the trailer and the next
                    // header are read along (the payload behind that is
                    // placed directly by the next read). Behind a small one
                    // (an MTU-sized FPDU: ~1.4 KB on a 1500-byte link) the
                    // whole staging buffer is: the FPDUs that follow are
                    // copied out of it, one read for dozens of FPDUs
                    // instead of one read each.
                    let cap = if large { RX_TAIL } else { buf.len() };
                    let tail = &mut buf[..cap];
                    self.io.reads += 1;
                    match sys::recv_vectored_dontwait(
                        self.sock.as_raw_fd(),
                        &mut [IoSliceMut::new(dst), IoSliceMut::new(tail)],
                    ) {
                        Ok(0) => Ok(0),
                        Ok(n) => {
                            (self.rx.large, self.rx.smalls) = (large, smalls);
                            drained = n < want + cap;
                            let placed = n.min(want);
                            // Re-borrow the placed bytes to fold them into the CRC.
                            if let Some(dst) = reg.range_slice(&r, placed) {
                                self.conn.rx_placed(dst);
                            }
                            self.rx.start = 0;
                            self.rx.end = n - placed;
                            Ok(n)
                        }
                        Err(e) => Err(e),
                    }
                }
                (None, RxStep::Bytes(_) | RxStep::Closed) => {
                    let Some(buf) = self.rx.buf.as_deref_mut() else {
                        return;
                    };
                    // While large payloads stream in, read only about a
                    // header's worth here, so the payload behind it is
                    // placed directly instead of copied out of staging.
                    let cap = if self.rx.large { RX_TAIL } else { buf.len() };
                    self.io.reads += 1;
                    let r = sys::recv_dontwait(self.sock.as_raw_fd(), &mut buf[..cap]);
                    if let Ok(n) = r {
                        drained = n < cap;
                        self.rx.start = 0;
                        self.rx.end = n;
                    }
                    r
                }
                (None, RxStep::Blocked) => return,
            };
            match res {
                Ok(0) => {
                    self.rx_drained = true;
                    self.rd_closed = true;
                    self.conn.handle_eof();
                    return;
                }
                Ok(n) => {
                    self.rx_drained = drained;
                    self.io.read_bytes += n as u64;
                    budget = budget.saturating_sub(n);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.rx_drained = true;
                    return;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    self.fail_with(&e);
                    return;
                }
            }
        }
    }

    /// One read of several FPDUs of the message being placed, laid out by
    /// the core's plan ([`Connection::rx_plan`]: payload straight into the
    /// receive or Read sink, trailer and next header into staging), and
    /// handed back to the core, which checks every header and takes the
    /// payload as placed only where it belongs ([`Connection::rx_planned`]).
    /// `None` when there is no plan worth a read (a small payload, the
    /// message's last FPDU, ranges that share memory): read as the step
    /// says.
    ///
    /// [`Connection::rx_plan`]: warpsock_proto::Connection::rx_plan
    /// [`Connection::rx_planned`]: warpsock_proto::Connection::rx_planned
    fn read_planned(
        &mut self,
        reg: &mut Registry<Mem>,
        drained: &mut bool,
    ) -> Option<io::Result<usize>> {
        if self.conn.rx_payload_len() < LARGE_PAYLOAD
            || !self.conn.rx_plan(RX_PLAN, RX_TAIL, &mut self.rx.plan)
        {
            return None;
        }
        let plan = &self.rx.plan;
        let buf = self.rx.buf.as_deref_mut()?;
        let staged = RxPiece::staged(plan);
        if staged > buf.len() {
            return None;
        }
        let places = plan.iter().filter_map(|p| match p {
            RxPiece::Place(r) => Some(*r),
            RxPiece::Stage(_) => None,
        });
        let mut places = mem::scatter_mut(reg, places)?.into_iter();
        let mut iov = Vec::with_capacity(plan.len());
        let mut rest = &mut buf[..staged];
        let mut want = 0;
        for p in plan {
            let piece = match p {
                RxPiece::Place(_) => places.next()?,
                RxPiece::Stage(n) => {
                    let (a, b) = std::mem::take(&mut rest).split_at_mut(*n);
                    rest = b;
                    a
                }
            };
            want += piece.len();
            iov.push(IoSliceMut::new(piece));
        }
        self.rx.large = true;
        self.rx.smalls = 0;
        self.io.reads += 1;
        let res = sys::recv_vectored_dontwait(self.sock.as_raw_fd(), &mut iov);
        drop(iov);
        if let Ok(n @ 1..) = res {
            self.io.planned_reads += 1;
            *drained = n < want;
            let stage = self.rx.buf.as_deref().unwrap_or_default();
            if !self.conn.rx_planned(&self.rx.plan, n, stage, reg) {
                self.io.plan_misses += 1;
            }
            self.rx.start = 0;
            self.rx.end = 0;
        }
        Some(res)
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
                    // A large FPDU read whole into staging makes the next
                    // reads small, their payload placed; small messages
                    // that come whole in the small reads make them large
                    // again (`note_payload`).
                    if whole >= LARGE_PAYLOAD || self.rx.large {
                        if let Some((payload, began)) = self.conn.rx_whole_fpdu(staged) {
                            note_payload(&mut self.rx.large, &mut self.rx.smalls, payload, !began);
                            if payload >= LARGE_PAYLOAD {
                                self.io.staged_copied += whole as u64;
                            }
                        }
                    }
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
                    if let Some(continues) = self.conn.rx_payload_start() {
                        note_payload(
                            &mut self.rx.large,
                            &mut self.rx.smalls,
                            self.conn.rx_payload_len(),
                            continues,
                        );
                    }
                    let n = (r.len as usize).min(staged.len());
                    match reg.range_slice_mut(&r, n) {
                        Some(dst) => {
                            self.io.staged_copied += n as u64;
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
}

#[cfg(test)]
mod tests;
