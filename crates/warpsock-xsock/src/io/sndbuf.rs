//! The send buffer past the credits: what a send call leaves in it
//! ([`buffer`]), how its runs are posted (`post_step`, for
//! `rio::post_sends`, which posts the queued sends in order) — the orderly
//! close that lingers for them is `io/closing.rs` ([`XSocket::close`]) —
//! and the process's view of
//! the send buffers: how many bytes wait in them, and which connections
//! hold some. Over TCP the kernel
//! sends a socket buffer after `close` and after the process; here the
//! bytes leave only while someone drives the socket, so a close or an
//! exit that gives up on them must not end the stream cleanly: the peer
//! would read a short stream and then a normal end. Such a connection is
//! reset instead (the peer gets `ECONNRESET`, as a TCP reader whose
//! peer's data was lost does; review r20-xbuf S2).
//!
//! The counts are the buffering process's: a child made by `fork` sees
//! none of its parent's (it neither waits for them at its exit nor
//! resets its parent's connections). Its own count from zero once its
//! fork handler called [`forget_after_fork`] (the preload's does); a
//! child made without it does not count its own (stated limit).

use std::os::fd::RawFd;
use std::sync::atomic::{AtomicI32, AtomicU64, AtomicUsize, Ordering};

use std::collections::VecDeque;

use smallvec::SmallVec;
use warpsock_engine::{SendOp, SendWr};

use super::forklist::ForkList;
use super::gather::{Gather, Src};
use super::rio::{raw_slice, AioSend};
use super::socket::{State, XSocket};
use crate::stream::TxStep;
use crate::wire::{Hello, HDR_LEN};

/// What one run of buffered bytes costs against the send buffer's bound
/// besides its bytes: its queue entry. Charged so that the bound bounds
/// memory, as TCP's charges each buffer's overhead (`sk_wmem_queued`
/// counts truesize): runs are never merged across send calls (message
/// mode's ends), so 1-byte writes into a 1 MiB bound of bytes alone held
/// a million entries, ~96 MiB (review r21-send #4).
pub(crate) const RUN_COST: usize = size_of::<AioSend>();

/// Bytes in the send buffers of the process's sockets.
static BUFFERED: AtomicUsize = AtomicUsize::new(0);
/// Bytes that left the send buffers of the process's sockets, posted to
/// the engine, ever: it only grows ([`posted_bytes`]).
static POSTED: AtomicU64 = AtomicU64::new(0);
/// The engine sockets of the connections with bytes buffered; a child
/// made by `fork` starts a list of its own ([`forget_after_fork`]).
static HOLDERS: ForkList<RawFd> = ForkList::new();
/// The process that buffered (0: none yet).
static OWNER: AtomicI32 = AtomicI32::new(0);

/// In a child made by `fork`, from its fork handler (the child's only
/// thread): the parent's buffered bytes and holders are not the child's —
/// it neither waits for them at its exit nor resets the parent's
/// connections — and its own buffering counts from zero (review r21-send
/// #8: the owner stayed the parent, so a child of a parent that had
/// buffered never counted its own bytes, and its exit neither waited for
/// them nor reset those peers). The parent's list is left as it is (its
/// lock may be held by a thread that does not exist here). The process's
/// counters keep their list unless its lock was held
/// (`settings::counters_after_fork`).
pub fn forget_after_fork() {
    BUFFERED.store(0, Ordering::Release);
    OWNER.store(0, Ordering::Release);
    HOLDERS.forget();
    super::settings::counters_after_fork();
}

fn pid() -> i32 {
    // SAFETY: getpid has no preconditions.
    #[allow(unsafe_code)]
    unsafe {
        libc::getpid()
    }
}

fn ours() -> bool {
    OWNER.load(Ordering::Acquire) == pid()
}

/// `n` bytes entered the send buffer of the connection on `fd`; `holder`
/// is its registration (set here when the buffer was empty).
pub(crate) fn add(holder: &mut Option<RawFd>, fd: RawFd, n: usize) {
    let _ = OWNER.compare_exchange(0, pid(), Ordering::AcqRel, Ordering::Acquire);
    BUFFERED.fetch_add(n, Ordering::AcqRel);
    if holder.is_none() {
        *holder = Some(fd);
        HOLDERS.lock().push(fd);
    }
}

/// `n` buffered bytes were posted to the engine (`rio::post_sends`).
pub(crate) fn posted(n: usize) {
    POSTED.fetch_add(n as u64, Ordering::Relaxed);
}

/// Bytes the send buffers of the process's sockets have posted to the
/// engine so far: a measure of progress that only grows, whatever other
/// threads add meanwhile (the preload's exit restarts its wait while it
/// grows; review r21-b #4: the buffered level, which a writing thread
/// holds up, hid progress).
pub fn posted_bytes() -> u64 {
    POSTED.load(Ordering::Relaxed)
}

/// `n` bytes left a send buffer (posted, dropped with the connection or
/// the socket); `empty`: none is left in it.
pub(crate) fn sub(holder: &mut Option<RawFd>, n: usize, empty: bool) {
    // Saturating: bytes of a socket made before a fork, dropped in the
    // child, left a count the child zeroed (`forget_after_fork`).
    let _ = BUFFERED.fetch_update(Ordering::AcqRel, Ordering::Acquire, |b| {
        Some(b.saturating_sub(n))
    });
    if let Some(fd) = holder.filter(|_| empty) {
        *holder = None;
        let mut h = HOLDERS.lock();
        if let Some(i) = h.iter().position(|&f| f == fd) {
            h.swap_remove(i);
        }
    }
}

/// Bytes that send calls of this process left in the send buffers of its
/// sockets, not yet sent: a program that exits without closing waits for
/// them, up to a bound (the preload's exit), then
/// [`reset_buffered`].
pub fn buffered_bytes() -> usize {
    if ours() {
        BUFFERED.load(Ordering::Acquire)
    } else {
        0
    }
}

/// Resets every connection of this process that still holds buffered
/// bytes (at exit, once the wait for them ended): the peer gets
/// `ECONNRESET`, not a clean end after a short stream. Returns how many.
pub fn reset_buffered() -> usize {
    if !ours() {
        return 0;
    }
    let h = HOLDERS.lock();
    for &fd in h.iter() {
        reset(fd);
    }
    h.len()
}

/// [`reset_buffered`] if the list's lock is free now, else `None` and no
/// reset (one try: an exit interrupted inside a call of its own thread,
/// which may hold the lock, retries a bounded while then leaves those
/// connections to the kernel). Allocates nothing.
pub fn try_reset_buffered() -> Option<usize> {
    if !ours() {
        return Some(0);
    }
    let h = HOLDERS.try_lock()?;
    for &fd in h.iter() {
        reset(fd);
    }
    Some(h.len())
}

/// Calls `f` with the engine socket of each of this process's connections
/// that hold buffered bytes now (those [`reset_buffered`] would reset),
/// under the list's lock: a connection leaves the list (its send buffer's
/// drop, `State` before the queue pair that owns the descriptor) before
/// its descriptor is closed, so each number names its connection's socket
/// while `f` runs (review r22-a item 1: a copy of the list, used after the
/// lock was let go, could name a socket another thread opened since). For
/// an `exec` that gave up on their bytes (the preload's), which marks them
/// to be reset by the kernel's close at the exec rather than resets them
/// now: an exec that fails returns to a program that goes on using them.
/// `f` must not take a socket's lock.
pub fn for_each_holder(mut f: impl FnMut(RawFd)) {
    if !ours() {
        return;
    }
    for &fd in HOLDERS.lock().iter() {
        f(fd);
    }
}

/// Resets the TCP connection on `fd` at once (an RST; the descriptor stays
/// valid): [`warpsock_engine::reset_now`].
pub(crate) fn reset(fd: RawFd) {
    warpsock_engine::reset_now(fd);
}

/// The smallest send buffer bound `SO_SNDBUF` sets ([`XSocket::set_sndbuf`]):
/// a page, about Linux's `SOCK_MIN_SNDBUF`.
pub const SNDBUF_MIN: usize = 4 << 10;
/// The largest, unless the socket was built with more (`Options::sndbuf`).
pub const SNDBUF_MAX: usize = 64 << 20;

/// The credit window `peer`'s hello announces, as `SO_SNDBUF` reports it
/// for a socket without a send buffer ([`XSocket::sndbuf`]): at most
/// [`SNDBUF_MAX`].
fn window_reported(peer: Hello) -> usize {
    // The window is the peer's word: its hello may announce up to
    // `MAX_SLOTS` slots of `MAX_SLOT_SIZE`, ~64 GiB, which the preload
    // reported as `INT_MAX`, and a program that sizes a buffer (or a
    // write) by `SO_SNDBUF` allocated 2 GiB at a hostile peer's say
    // (helper 73's review, item 6). Bounded by the most `SO_SNDBUF` reads
    // on any socket of ours that has a buffer — what a set can make it,
    // as Linux's never reads more than its own ceiling (`wmem_max`
    // doubled) whatever the peer's window: a TCP program gets a figure
    // of this side's making, never one the peer inflates. An honest
    // peer's default window (4 MiB) is reported as before. What the
    // window lets a send hand over is bounded elsewhere by this side too
    // (transmit slots, the engine's queue: `TX_SEGS`, `TX_BATCH`).
    (usize::from(peer.slots) * (peer.slot_size as usize).saturating_sub(HDR_LEN)).min(SNDBUF_MAX)
}

impl XSocket {
    /// The send buffer's bound in bytes (`SO_SNDBUF`): what send calls may
    /// leave in it past the credits. A socket without one (built with
    /// `Options::sndbuf` 0 — `WARPSOCK_DDP_SNDBUF=0` under the preload),
    /// whose sends wait for credits, reports its credit window instead:
    /// the bytes the peer's receive slots take before it reads, which a
    /// send hands over without waiting — never 0, which a program that
    /// sizes its writes by `SO_SNDBUF` (half of it, say) would loop on
    /// (review r21-send #10; TCP never reports less than 4,608) — and at
    /// most [`SNDBUF_MAX`] (`window_reported`).
    pub fn sndbuf(&self) -> usize {
        let st = self.lock();
        if st.aio.cap > 0 {
            return st.aio.cap;
        }
        window_reported(st.s.peer())
    }

    /// Sets the send buffer's bound (`setsockopt(SO_SNDBUF)`), clamped to
    /// [`SNDBUF_MIN`]..=max([`SNDBUF_MAX`], `Options::sndbuf`), and returns
    /// what [`Self::sndbuf`] reports then. Not doubled as Linux doubles `SO_SNDBUF` (its half is kernel
    /// bookkeeping; here every byte is payload). A socket without a buffer
    /// keeps none: `Options::sndbuf` 0 (`WARPSOCK_DDP_SNDBUF=0`) turns
    /// buffering off whatever the program asks (the credit window is
    /// reported still). Bytes
    /// already held past a smaller bound stay and go out as credits come;
    /// send calls find no room until they have.
    pub fn set_sndbuf(&self, bytes: usize) -> usize {
        {
            let mut st = self.lock();
            if st.aio.cap > 0 {
                st.aio.cap = bytes.clamp(SNDBUF_MIN, SNDBUF_MAX.max(self.opts.sndbuf));
            }
        }
        self.sndbuf()
    }

    /// What an exit waits for besides the send buffer: the bytes the
    /// engine sealed and holds because the kernel's send buffer is full
    /// ([`warpsock_engine::Qp::send_backlog`]; the progress thread writes
    /// them as the kernel drains), and the bytes the kernel accepted from
    /// the engine so far, a count that only grows (the wait's progress).
    /// Bytes still in the backlog when the process ends are never sent:
    /// the kernel would end the stream cleanly after a short one (review
    /// r21-b #4), so an exit that gives up on them resets the connection
    /// ([`Self::reset_now`]). Takes the engine's lock, not the socket's.
    pub fn engine_backlog(&self) -> (u64, u64) {
        (self.qp.send_backlog(), self.qp.io_stats().write_bytes)
    }

    /// [`Self::engine_backlog`] if the engine's lock is free now, else
    /// `None` (one try, as [`try_reset_buffered`]).
    pub fn try_engine_backlog(&self) -> Option<(u64, u64)> {
        self.qp.try_send_backlog()
    }

    /// Resets the connection at once (an RST, as [`reset_buffered`] does
    /// for the connections with buffered bytes): for an exit that gave up
    /// on the bytes of the engine's backlog ([`Self::engine_backlog`]).
    pub fn reset_now(&self) {
        reset(self.tcp_fd);
    }

    /// The send queue as `ioctl(SIOCOUTQ)` reports it for TCP — bytes
    /// handed to the socket and not yet acknowledged — or, if `unsent`,
    /// as `SIOCOUTQNSD` — not yet sent — after a round of progress (as a
    /// TCP socket's queue moves with no call, so bytes that credits let go
    /// leave before the look). The sum of:
    ///
    /// * the send buffer's bytes and the unposted bytes of queued
    ///   asynchronous sends (the library holds them: no credit yet);
    /// * what the engine sealed into FPDUs and the kernel did not take yet
    ///   ([`warpsock_engine::Qp::send_backlog`]);
    /// * the kernel's own queue of the TCP connection under the socket
    ///   (`SIOCOUTQ` or `SIOCOUTQNSD` on it): unacknowledged, or unsent.
    ///
    /// The last two count wire bytes (MPA/DDP/RDMAP framing, message
    /// headers, and control messages such as credit returns come on top of
    /// the stream's bytes), so the figure is an upper bound of the stream
    /// bytes in flight; it is 0 exactly when nothing waits in the library
    /// and the peer's TCP acknowledged (or, `unsent`, the kernel sent)
    /// everything — when TCP's would be. Bytes in the peer's receive slots
    /// are acknowledged, as bytes in a TCP receiver's socket buffer are.
    pub fn send_queue_bytes(&self, unsent: bool) -> usize {
        let mut st = self.lock();
        self.drive_now(&mut st);
        let queued: usize = st
            .aio
            .sends
            .iter()
            .filter(|a| a.mr.is_some())
            .map(|a| a.len - a.off)
            .sum();
        let held = st.aio.buf.len() + queued;
        drop(st);
        held + self.qp.send_backlog() as usize + super::sys::out_queue(self.tcp_fd, unsent)
    }
}

/// Copies bytes `off..off + n` of plain send call `call` into the send
/// buffer, behind every queued send; `end`: they are the call's last.
/// They go out as credits come back (`rio::post_sends`), a slot's payload per
/// message at most, and never in one message with another call's bytes:
/// a run is one call's, and its last message carries the call's end only
/// if the run does (a message-mode reader — message mode is the reader's
/// setting, not on the wire — reads each send call as one message, as
/// without the buffer; review r20-xbuf S1). The caller checked the room
/// ([`room_for`]).
pub(crate) fn buffer(
    st: &mut State,
    g: &Gather<'_>,
    at: (usize, usize),
    call: u64,
    end: bool,
    fd: RawFd,
) {
    let (off, n) = at;
    debug_assert!(n > 0 && n <= room_for(st, call));
    let len = st.aio.buf.len();
    if st.aio.buf.capacity() < len + n {
        // Amortised, up to the bound: a reserve of exactly what each call
        // adds could reallocate and copy the whole buffer at every small
        // send (review r21-send #4).
        let want = (len + n)
            .max(2 * st.aio.buf.capacity())
            .min(st.aio.cap.max(len + n));
        st.aio.buf.reserve_exact(want - len);
    }
    g.slices(off, n, |b| st.aio.buf.extend(b));
    add(&mut st.aio.holder, fd, n);
    match st.aio.sends.back_mut() {
        Some(a) if joins(st.aio.unposted, a, call) => {
            a.len += n;
            a.end = end;
        }
        _ => {
            st.aio.runs += 1;
            st.aio.sends.push_back(AioSend {
                mr: None,
                len: n,
                off: 0,
                call,
                cookie: None,
                end,
            });
            st.aio.unposted += 1;
        }
    }
}

/// Whether bytes of send call `call` join run `a`, the back of the queue:
/// the same call's run, still unposted (the back is unposted while any
/// is), its end not reached; else they make a run of their own.
fn joins(unposted: usize, a: &AioSend, call: u64) -> bool {
    unposted > 0 && a.mr.is_none() && a.call == call && !a.end
}

/// Bytes of send call `call` the send buffer takes now: its room, less a
/// new run's cost ([`RUN_COST`]) unless they join the call's run.
pub(crate) fn room_for(st: &State, call: u64) -> usize {
    let joined = st
        .aio
        .sends
        .back()
        .is_some_and(|a| joins(st.aio.unposted, a, call));
    let room = st.aio.room();
    if joined {
        room
    } else {
        room.saturating_sub(RUN_COST)
    }
}

/// One step of `rio::post_sends` for send `a` (`buf`: the send buffer, whose
/// front is `a`'s next bytes when it has no registration). Returns the
/// bytes posted, or `None` when the books block it.
pub(super) fn post_step(
    x: &XSocket,
    st: &mut State,
    a: &AioSend,
    buf: &VecDeque<u8>,
) -> Option<usize> {
    let rest = a.len - a.off;
    let (front, back) = buf.as_slices();
    let mut parts: SmallVec<[&[u8]; 2]> = SmallVec::new();
    let (off, avail) = match &a.mr {
        Some(mr) => {
            // SAFETY (of the slice below): `aio_send`'s caller keeps the
            // buffer valid and unchanged until completion.
            parts.push(raw_slice(mr.with_bytes(|b| b.as_ptr()), a.len));
            (a.off, rest)
        }
        None => {
            parts.extend([front, back].into_iter().filter(|b| !b.is_empty()));
            (0, rest.min(x.opts.slot_size as usize - HDR_LEN))
        }
    };
    let g = Gather::new(&parts);
    let mrs = a.mr.as_ref().map(std::slice::from_ref);
    let src = |n| Src {
        g: &g,
        mrs,
        off,
        len: n,
    };
    match st.s.tx_data(avail, avail == rest && a.end) {
        TxStep::Control => {
            x.flush(st);
            Some(0)
        }
        TxStep::Write { stag, to, len: n } => {
            let op = SendOp::Write {
                remote_addr: to,
                rkey: stag,
            };
            x.post_data(st, a.call, op, None, src(n));
            st.s.tx_wrote(n);
            Some(n)
        }
        TxStep::Data { msg, len: n } => {
            let op = SendOp::Send {
                solicited: false,
                invalidate: None,
            };
            x.post_data(st, a.call, op, Some(msg), src(n));
            Some(n)
        }
        TxStep::Blocked if x.repost_if_due(st) => Some(0),
        TxStep::Blocked => None,
    }
}

/// A one-sided request (RDMA Write or Read) made while sends had bytes
/// not yet posted: posted once the `ahead` sends queued before it are
/// posted whole, not past them (review r20-xbuf N5).
#[derive(Debug)]
pub(crate) struct HeldRio {
    /// Sends queued before it with bytes still unposted.
    ahead: usize,
    pub(super) wr: SendWr,
    write: bool,
}

/// Posts one-sided request `wr` (`write`: an RDMA Write) behind every send
/// queued before it. RDMAP orders a queue pair's Writes and Sends as they
/// are posted (RFC 5040 §5.5): bytes a send call returned for, still in
/// the send buffer behind missing credits (or an `aio_send` queued), must
/// not be overtaken by a later `riowrite`, whose data the peer may look
/// at once it has read them. So with sends queued (after a pump) it waits
/// for them (`release_held`), else it goes at once.
pub(super) fn post_rio_wr(x: &XSocket, st: &mut State, wr: SendWr, write: bool) {
    if super::rio::sends_ahead(x, st) {
        let ahead = st.aio.unposted;
        st.aio.held.push_back(HeldRio { ahead, wr, write });
        return;
    }
    post_held(x, st, wr, write);
}

fn post_held(x: &XSocket, st: &mut State, wr: SendWr, write: bool) {
    if write {
        x.restore_rto(st);
    }
    x.post(st, wr);
}

/// A queued send was posted whole (`rio::post_sends`): one fewer is ahead
/// of each held request; those with none ahead go now, before the next
/// send's bytes.
pub(super) fn release_held(x: &XSocket, st: &mut State) {
    for h in st.aio.held.iter_mut() {
        h.ahead -= 1;
    }
    while st.aio.held.front().is_some_and(|h| h.ahead == 0) {
        let h = st.aio.held.pop_front().expect("checked");
        post_held(x, st, h.wr, h.write);
    }
}

#[cfg(test)]
mod tests;
