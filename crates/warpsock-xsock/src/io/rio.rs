//! The richer interface on a DDP-mode socket: buffers registered for the
//! peer's one-sided access (`riomap`), one-sided writes and reads into the
//! peer's (`riowrite`, `rioread`), and asynchronous send, receive, write
//! and read that return at once and complete later — collected with
//! [`XSocket::aio_poll`] and signalled through the socket's readiness
//! (readable while completions wait).
//!
//! Like `rsockets`' `riomap`, a mapping is named by an offset (chosen by
//! the application, or by the library: `rsockets` takes the buffer's
//! address, which would tell the peer where this process's memory is —
//! ASLR's secret — so the library's offset is the registration's private
//! one, [`super::sink`]'s `private_iova`) and announced to the peer in
//! the stream, so the peer knows it once it has read anything sent after
//! the `riomap` call. A one-sided write is ordered with the stream: bytes
//! sent after it arrive after it is placed.
//!
//! Asynchronous sends keep call order with every other send: their bytes
//! go out in the order of the `aio_send` calls, each one's bytes posted
//! before the next one's (not held back until an earlier one completes),
//! and a plain send call (`send`, `write`, …) made after an asynchronous
//! send that is still queued — waiting for credits or a transmit slot —
//! goes behind its bytes: into the send buffer behind them (below), or,
//! full or off, it waits for them as for credits (a non-blocking call:
//! `EAGAIN`). A stream delivers the bytes in call
//! order, message mode the messages. `shutdown(SHUT_WR)` and `close` send
//! the end of stream after the queued sends' bytes (later sends fail with
//! `EPIPE` at once). Once the connection is over — failed, or closed by
//! the peer's FIN — the queued sends complete with the bytes they posted,
//! or with the error (`EPIPE` after the FIN) if none, and `aio_send`
//! fails as a plain send does. (A send call in another thread that
//! already waits mid-way is not behind an `aio_send` made meanwhile: their
//! bytes may interleave, as concurrent sends on a TCP socket may — in
//! message mode the waiting call's message is then split around the
//! asynchronous one's.)
//!
//! The same queue holds the send buffer of plain send calls (stream mode,
//! `sndbuf::buffer`): a copied call that finds too few credits, or no transmit
//! slot, copies what does not fit into it and returns, as TCP's send
//! returns with bytes in its socket buffer. The buffered bytes are one
//! run per send call (its end kept: see `sndbuf::buffer`), posted in order with them
//! by [`pump`] — from whichever call or round takes the credits in: a
//! later send, a receive's wait, `aio_poll`, a reap that processed
//! completions, `close`, or the preload's progress thread (the watch is
//! on for input while anything is queued: `Aio::in_flight`) — a slot's
//! payload per DATA message at most, never across a call's end. So a blocking send may return
//! with bytes still queued; without a progress thread (a bare
//! [`XSocket`]) they leave at the socket's next call. A program that
//! exits without closing: the preload's exit waits for them, bounded
//! (`buffered_bytes`), and resets a connection whose bytes it gave up on
//! (`reset_buffered`), as `close` does when its linger ends (`io/sndbuf.rs`). The buffer is
//! bounded in bytes (`Options::sndbuf`): a call that finds it full waits
//! (blocking) or returns a partial count or `EAGAIN`. Writability (`poll`)
//! still follows the credits. `shutdown(SHUT_WR)` and `close` send the end
//! of stream after the buffered bytes (`close` waits for them, up to its
//! linger); a send blocked meanwhile in another thread fails with `EPIPE`
//! (or returns what it sent), as TCP's; once the connection fails, the
//! buffered bytes are dropped and the next call reports the error.
//! So a message-mode reader (message mode is the reader's setting) reads
//! each send as one message, as without the buffer; each buffered call
//! still takes a receive slot of the peer's as it goes. A zero-copy call
//! never buffers (blocking, at least `zcopy_min`: it is sent from the
//! caller's buffer as credits come, no copy).
//!
//! Every one-sided call is one RDMA Write or Read, posted and transmitted
//! at once — or, made while sends have bytes not yet posted (the send
//! buffer's, queued asynchronous sends'), posted right after those bytes:
//! RDMAP keeps a queue pair's Writes and Sends in posted order (RFC 5040
//! §5.5), and a program that sends, then writes, expects the peer to see
//! the stream bytes before the write's (review r20-xbuf N5; `io/sndbuf.rs`). [`XSocket::aio_writev`] gathers several buffers into one Write
//! (the engine's scatter/gather list): a message built from pieces — a
//! header, a shared body, a trailer — costs one post, one transmit round
//! and one completion instead of one per piece.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::os::fd::RawFd;

use warpsock_engine::{Access, Mr, SendOp, SendWr, Wc};

use super::sndbuf::RUN_COST;
use super::socket::{State, XSocket, WR_RIO};
use crate::stream::{MapError, SinkState};
pub(crate) use maps::LocalMap;

/// Kind of an asynchronous operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(i32)]
pub enum AioOp {
    /// `warpsock_aio_send`.
    Send = 1,
    /// `warpsock_aio_recv`.
    Recv = 2,
    /// `warpsock_aio_write` (one-sided).
    Write = 3,
    /// `warpsock_aio_read` (one-sided).
    Read = 4,
}

/// A finished asynchronous operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Completion {
    /// The caller's cookie.
    pub cookie: u64,
    /// What it was.
    pub op: AioOp,
    /// Bytes transferred, or an `errno`.
    pub result: Result<usize, i32>,
    /// A receive's bytes end one of the peer's messages: message mode's
    /// `MSG_EOR`, as [`XSocket::recv`] gives it (never in stream mode, nor
    /// for other operations).
    pub eor: bool,
}

/// A send queued behind the credits: an asynchronous send's, or bytes of
/// plain send calls copied into the send buffer ([`Aio::buf`]).
#[derive(Debug)]
pub(super) struct AioSend {
    /// The caller's registered buffer (`aio_send`), or `None`: the bytes
    /// are the send buffer's first unposted ones (and a zero-length
    /// `aio_send`'s none).
    pub(super) mr: Option<Mr>,
    pub(super) len: usize,
    pub(super) off: usize,
    pub(super) call: u64,
    /// `None`: buffered bytes of plain send call `call` (no completion).
    pub(super) cookie: Option<u64>,
    /// Its last byte ends a send call (the DATA carrying it says so).
    pub(super) end: bool,
}

#[derive(Debug)]
struct AioRecv {
    ptr: *mut u8,
    len: usize,
    cookie: u64,
    sink: Option<(u32, Mr)>,
}

// SAFETY: the pointer is the caller's buffer, handed over by an unsafe
// `aio_recv` whose contract keeps it valid and untouched until the
// operation completes; it is only written under the socket lock.
#[allow(unsafe_code)]
unsafe impl Send for AioRecv {}

#[derive(Debug)]
struct RioOp {
    /// The registrations of the request's local segments (on private
    /// copies from the program's close on: [`detach_program_memory`]).
    mrs: Vec<Mr>,
    op: AioOp,
    len: usize,
    /// `Some`: asynchronous, complete with this cookie.
    cookie: Option<u64>,
}

/// Asynchronous and one-sided operations in progress, and completions
/// waiting to be collected.
#[derive(Debug, Default)]
pub(crate) struct Aio {
    /// Asynchronous sends, in call order: the first `sends.len() -
    /// unposted` posted whole, waiting for the engine to finish reading
    /// their buffers; the rest with bytes not yet posted (only the first
    /// of those may have posted some).
    pub(super) sends: VecDeque<AioSend>,
    /// Of `sends`, those with bytes not yet posted: a plain send call goes
    /// behind them ([`sends_ahead`]).
    pub(super) unposted: usize,
    /// Our end of the stream was asked for (`shutdown(SHUT_WR)`, `close`)
    /// while sends had bytes unposted: it goes once they are all posted
    /// ([`shut_write`]).
    shut_after: bool,
    /// The send buffer: bytes of plain send calls that found too few
    /// credits (stream mode, `sndbuf::buffer`), not yet posted, in order; the
    /// queued sends without a registration (`AioSend::mr`) hold them.
    pub(super) buf: VecDeque<u8>,
    /// Its bound in bytes (`Options::sndbuf`).
    pub(super) cap: usize,
    /// Runs of buffered bytes queued and not yet posted whole (of
    /// `sends`): each is charged [`RUN_COST`] against the bound.
    pub(super) runs: usize,
    /// Registered as holding buffered bytes (`sndbuf`), with the
    /// connection's engine socket.
    pub(super) holder: Option<RawFd>,
    /// One-sided requests made while sends had bytes unposted, in call
    /// order: each waits for the sends queued before it
    /// (`sndbuf::post_rio_wr`). Non-empty only while `unposted` is not 0.
    pub(super) held: VecDeque<super::sndbuf::HeldRio>,
    recvs: VecDeque<AioRecv>,
    rio: HashMap<u64, RioOp>,
    /// Results of synchronous one-sided operations, by id.
    sync_done: HashMap<u64, Result<usize, i32>>,
    done: VecDeque<Completion>,
}

impl Drop for Aio {
    fn drop(&mut self) {
        super::sndbuf::sub(&mut self.holder, self.buf.len(), true);
    }
}

impl Aio {
    /// Nothing queued, a send buffer of `cap` bytes.
    pub(crate) fn new(cap: usize) -> Self {
        let mut a = Self::default();
        a.cap = cap;
        a
    }

    /// What the send buffer holds against its bound: its bytes, and
    /// [`RUN_COST`] per run (a send call's bytes are a run of their own).
    pub(crate) fn held(&self) -> usize {
        self.buf.len() + self.runs * RUN_COST
    }

    /// Bytes the send buffer takes now (a new run's cost not deducted:
    /// see `sndbuf::room_for`).
    pub(crate) fn room(&self) -> usize {
        self.cap.saturating_sub(self.held())
    }

    pub(crate) fn has_completions(&self) -> bool {
        !self.done.is_empty()
    }

    /// Asynchronous sends with bytes not yet posted: a plain send goes
    /// behind them (see [`sends_ahead`]).
    #[inline]
    pub(crate) fn sends_queued(&self) -> bool {
        self.unposted != 0
    }

    /// Asynchronous sends or receives queued: what [`pump`] moves.
    #[inline]
    pub(crate) fn pumped(&self) -> bool {
        !self.sends.is_empty() || !self.recvs.is_empty()
    }

    /// Operations in flight (they progress only as the engine is driven).
    pub(crate) fn in_flight(&self) -> bool {
        !self.sends.is_empty() || !self.recvs.is_empty() || !self.rio.is_empty()
    }
}

/// A one-sided request finished (`wc` has a `WR_RIO` id).
pub(crate) fn on_completion(st: &mut State, wc: &Wc) {
    complete(
        st,
        wc.wr_id,
        if wc.is_ok() { None } else { Some(libc::EIO) },
    );
}

/// A one-sided request whose post failed (the connection failed with it):
/// it completes now with `errno`, as no completion will ever come for it —
/// a synchronous call waiting for it waited for good (helper 34's review,
/// session 35).
pub(crate) fn post_failed(st: &mut State, wr_id: u64, errno: i32) {
    complete(st, wr_id, Some(errno));
}

/// Completes the one-sided request `wr_id`: its length, or `errno`.
fn complete(st: &mut State, wr_id: u64, errno: Option<i32>) {
    let id = wr_id & !(0xF << 60);
    let Some(op) = st.aio.rio.remove(&id) else {
        return;
    };
    let result = match errno {
        None => Ok(op.len),
        Some(e) => Err(e),
    };
    match op.cookie {
        Some(cookie) => st.aio.done.push_back(Completion {
            cookie,
            op: op.op,
            result,
            eor: false,
        }),
        None => {
            st.aio.sync_done.insert(id, result);
        }
    }
}

/// Moves asynchronous sends and receives along (called after every round
/// of progress). Inlined: with neither queued (a program that makes no
/// asynchronous call, every round of a ping-pong) both loops would end at
/// their first `pop_front`, and this is the whole of it (issue 12: the call
/// and its two empty pops were ~20 instructions per round).
#[inline]
pub(crate) fn pump(x: &XSocket, st: &mut State) {
    if !st.aio.pumped() {
        return;
    }
    pump_sends(x, st);
    pump_recvs(x, st);
}

/// Whether a plain send call must wait (having done nothing): bytes of
/// asynchronous sends made before it are not all posted. Pumps them
/// first, so it waits only for what the books block: its own bytes go
/// behind theirs (a stream's bytes, message mode's messages, in call
/// order). Inlined: nothing queued is one look.
#[inline]
pub(crate) fn sends_ahead(x: &XSocket, st: &mut State) -> bool {
    if !st.aio.sends_queued() {
        return false;
    }
    pump_sends(x, st);
    // Posted whole is enough: the call's own posts go behind theirs in the
    // engine's queue (and an inline send only with nothing queued there).
    st.aio.sends_queued()
}

/// Our end of the stream (`shutdown(SHUT_WR)`, `close`), after the bytes
/// of the asynchronous sends queued before it: at once if none has bytes
/// unposted (after a pump), else once [`post_sends`] posted their last.
pub(crate) fn shut_write(x: &XSocket, st: &mut State) {
    if sends_ahead(x, st) {
        st.aio.shut_after = true;
    } else {
        st.s.shutdown_write();
    }
}

/// At the program's close (`XSocket::begin_locked`): the memory the
/// program handed over is its own again — no byte the peer sends reaches
/// it, and the engine reads none of it, after the close. The close returns
/// at once while the library ends the connection (the preload's reaper, up
/// to the linger), and the program may free or reuse that memory. Before,
/// a peer's `riowrite`, or the bytes it sent into a receive's sink, landed
/// there for as long as the close lasted.
///
/// * A mapping the peer may only write is deregistered: its later access
///   fails (a remote protection error ends the connection, as bytes after
///   a TCP close draw a reset).
/// * One it may read goes on from a private copy
///   ([`Mr::keep_private_copy`]), no longer writable, while a Read
///   Response from it is queued or under way
///   ([`warpsock_engine::Qp::reads_region`]): it may be queued ahead of
///   our last bytes and our end of stream, and a registration gone under
///   it lost those (helper 69's review: the peer read a clean end after a
///   short stream). Any other goes as a write-only one does, its bytes not
///   read: a program that freed it before its close (past `riomap`'s
///   contract, but harmless over TCP-minded code) had the copy read freed
///   memory (session 55's CI: ASan, `tests/c/xsock.c`'s aio case).
/// * Asynchronous receives not completed are dropped (their completions
///   could never be collected); a sink offered for one is withdrawn
///   (`SINK_CANCEL`), its registration kept on zeroed pages until the
///   socket goes (`State::kept`): bytes the peer had already sent into it
///   complete it as the peer says and count as received after the close
///   (a reset, as TCP's for bytes after a close), where a sink forgotten
///   made its late Write and completion a protocol breach (`EPROTO` at
///   both ends).
/// * Asynchronous sends and writes not completed go on from private
///   copies of their buffers, reads into zeroed pages: the orderly close
///   still sends what was queued before it, as TCP's sends the bytes its
///   calls took.
///
/// What a copy costs: the readable mappings and the pending sends' and
/// writes' buffers (receive destinations only the pages the peer's bytes
/// reach). `false`: a copy could not be allocated; the caller then
/// forgets the rest ([`forget_program_memory`]) and resets.
pub(crate) fn detach_program_memory(x: &XSocket, st: &mut State) -> bool {
    let mut ok = true;
    st.maps.retain(|_, m| {
        m.readable && x.qp.reads_region(m.mr.rkey()) && {
            let kept =
                m.mr.keep_private_copy_of(0..m.mr.len(), Access::REMOTE_WRITE);
            ok &= kept;
            kept
        }
    });
    for r in std::mem::take(&mut st.aio.recvs) {
        if let Some((id, mr)) = r.sink {
            st.s.cancel_sink(id);
            // Written only (no rights taken: LOCAL_READ is none).
            if mr.keep_private_copy_of(0..0, Access::LOCAL_READ) {
                st.kept.push(mr);
            } else {
                ok = false;
                st.s.release_sink(id);
            }
        }
    }
    for op in st.aio.rio.values() {
        for mr in &op.mrs {
            ok &= if op.op == AioOp::Read {
                mr.keep_private_copy_of(0..0, Access::LOCAL_READ)
            } else {
                mr.keep_private_copy()
            };
        }
    }
    for s in &st.aio.sends {
        if let Some(mr) = &s.mr {
            ok &= mr.keep_private_copy();
        }
    }
    ok
}

/// After [`detach_program_memory`] failed, the connection failed and
/// reset by the caller: every registration still on the program's memory
/// goes — the mappings' and the one-sided requests' here, the sends'
/// with them ([`pump`]: a failed connection's sends complete at once).
/// The requests that named them end with the connection.
pub(crate) fn forget_program_memory(x: &XSocket, st: &mut State) {
    debug_assert!(st.over());
    st.maps.clear();
    for op in st.aio.rio.values_mut() {
        op.mrs.clear();
    }
    pump(x, st);
}

/// Whether our end of the stream is shut, or waits to be behind queued
/// asynchronous sends ([`shut_write`]): send calls fail with `EPIPE`.
pub(crate) fn write_shut(st: &State) -> bool {
    st.s.is_write_shut() || st.aio.shut_after
}

fn pump_sends(x: &XSocket, st: &mut State) {
    debug_assert!(st.aio.unposted <= st.aio.sends.len());
    if !st.over() {
        post_sends(x, st);
    }
    complete_sends(st);
}

/// Posts the bytes of the queued sends, in call order, as far as the
/// books allow: each one's, once all posted, are followed at once by the
/// next one's (an asynchronous send completes later, `complete_sends`).
/// Buffered bytes go a slot's payload at a time at most, copied into a
/// transmit slot (or a sink), as a send call's copies.
fn post_sends(x: &XSocket, st: &mut State) {
    while st.aio.unposted > 0 {
        let i = st.aio.sends.len() - st.aio.unposted;
        let mut a = st.aio.sends.remove(i).expect("an unposted send");
        // Out of the state while its bytes are posted from it (nothing
        // below buffers).
        let mut buf = std::mem::take(&mut st.aio.buf);
        // (A shut end sends nothing more: a guard, `shut_write` shuts only
        // once every byte is posted.)
        while a.off < a.len && st.tx_free_len() > 0 && !st.s.is_write_shut() {
            let Some(n) = super::sndbuf::post_step(x, st, &a, &buf) else {
                break;
            };
            a.off += n;
            if a.mr.is_none() {
                buf.drain(..n);
                super::sndbuf::sub(&mut st.aio.holder, n, buf.is_empty());
                super::sndbuf::posted(n);
            }
        }
        if buf.is_empty() && buf.capacity() > 64 << 10 {
            // A burst's buffer is not kept by an idle socket.
            buf = VecDeque::new();
        }
        st.aio.buf = buf;
        let whole = a.off == a.len;
        let a_buffered = a.cookie.is_none();
        st.aio.sends.insert(i, a);
        if !whole {
            // Out of transmit slots whose sends the engine may have
            // completed already (written at their post): no input comes
            // for them, so a program that only waits in `poll` would wake
            // no round to free them (the `stream` C case's hang, 120 s).
            // Their completions are taken in here, and the sends go on.
            if st.tx_free_len() == 0 && st.unreaped && x.reap_queued(st) && st.tx_free_len() > 0 {
                continue;
            }
            // Waits for credits or a transmit slot.
            return;
        }
        st.aio.unposted -= 1;
        if a_buffered {
            st.aio.runs -= 1;
        }
        st.s.tx_end_call();
        x.flush(st);
        if !st.aio.held.is_empty() {
            super::sndbuf::release_held(x, st);
        }
    }
    if std::mem::take(&mut st.aio.shut_after) {
        st.s.shutdown_write();
        x.flush(st);
    }
}

/// Completes the posted asynchronous sends the engine finished reading,
/// in call order, and — once the connection is over (it failed, or the
/// peer's FIN closed it: nothing more leaves) — every queued one, with the
/// bytes it posted, or if none the error (`EPIPE` after the FIN, as a
/// plain send gets).
fn complete_sends(st: &mut State) {
    let over = st.over();
    let mut posted = st.aio.sends.len() - st.aio.unposted;
    while posted > 0 {
        let a = st.aio.sends.front().expect("a posted send");
        if !over && XSocket::call_busy(st, a.call) {
            return;
        }
        let a = st.aio.sends.pop_front().expect("a posted send");
        posted -= 1;
        XSocket::end_call(st, a.call);
        if let Some(cookie) = a.cookie {
            st.aio.done.push_back(Completion {
                cookie,
                op: AioOp::Send,
                result: Ok(a.off),
                eor: false,
            });
        }
    }
    if !over {
        return;
    }
    let errno = st.error.as_ref().map_or(libc::EPIPE, |(e, _)| *e);
    // (Every posted one completed above: the engine reads no more.)
    st.aio.unposted = 0;
    st.aio.runs = 0;
    // One-sided requests held behind them never go: they fail as the
    // sends do.
    while let Some(h) = st.aio.held.pop_front() {
        let id = h.wr.wr_id & !(0xF << 60);
        match st.aio.rio.remove(&id).map(|op| (op.op, op.cookie)) {
            Some((op, Some(cookie))) => st.aio.done.push_back(Completion {
                cookie,
                op,
                result: Err(errno),
                eor: false,
            }),
            Some((_, None)) => {
                st.aio.sync_done.insert(id, Err(errno));
            }
            None => {}
        }
    }
    if std::mem::take(&mut st.aio.shut_after) {
        st.s.shutdown_write();
    }
    // Buffered bytes are lost with the connection, as a TCP socket's;
    // the next call reports the error.
    let n = st.aio.buf.len();
    super::sndbuf::sub(&mut st.aio.holder, n, true);
    st.aio.buf = VecDeque::new();
    while let Some(a) = st.aio.sends.pop_front() {
        XSocket::end_call(st, a.call);
        if let Some(cookie) = a.cookie {
            st.aio.done.push_back(Completion {
                cookie,
                op: AioOp::Send,
                result: if a.off > 0 { Ok(a.off) } else { Err(errno) },
                eor: false,
            });
        }
    }
}

/// The `n` bytes at `p` (a registered caller buffer, see `pump_sends`).
pub(super) fn raw_slice<'a>(p: *const u8, n: usize) -> &'a [u8] {
    #[allow(unsafe_code)]
    // SAFETY: `p..p+n` lies in a buffer registered for an asynchronous
    // send, which its caller keeps valid until the operation completes.
    unsafe {
        std::slice::from_raw_parts(p, n)
    }
}

fn pump_recvs(x: &XSocket, st: &mut State) {
    while let Some(mut r) = st.aio.recvs.pop_front() {
        if let Some((id, mr)) = r.sink.take() {
            match st.s.sink_state(id) {
                // Not placed as the peer says: the connection failed (the
                // request completes with its error below).
                SinkState::Filled { len, .. } if !x.sink_truly_filled(st, &mr, len) => {
                    st.s.release_sink(id);
                    drop(mr);
                }
                SinkState::Filled { len, .. } => {
                    st.s.release_sink(id);
                    drop(mr);
                    x.count(st, super::settings::Count::RxPlaced, len as usize);
                    st.aio.done.push_back(Completion {
                        cookie: r.cookie,
                        op: AioOp::Recv,
                        result: Ok(len as usize),
                        eor: false,
                    });
                    continue;
                }
                SinkState::Declined => {
                    st.s.release_sink(id);
                    drop(mr);
                }
                _ if st.over() => {
                    st.s.release_sink(id);
                    drop(mr);
                }
                _ => {
                    r.sink = Some((id, mr));
                    st.aio.recvs.push_front(r);
                    return;
                }
            }
        }
        #[allow(unsafe_code)]
        // SAFETY: `aio_recv`'s caller keeps `ptr..ptr+len` valid and
        // untouched until the operation completes.
        let out = unsafe { std::slice::from_raw_parts_mut(r.ptr, r.len) };
        let broke = st
            .error
            .as_ref()
            .filter(|_| st.peer_broke)
            .map(|(errno, _)| *errno);
        let (result, eor) = if let Some((n, eor)) = x.read_now(st, out, false, false) {
            (Ok(n), eor)
        } else if let Some(errno) = broke {
            // Its end of stream, behind the breach, is no clean end.
            (Err(errno), false)
        } else if st.s.eof() {
            (Ok(0), false)
        } else if let Some((errno, _)) = st.error {
            (Err(errno), false)
        } else {
            if r.len >= x.opts.zcopy_min
                && !st.msg_mode
                && st.s.readable() == 0
                && st.zero_copy_idle()
                && st.s.sink_room()
            {
                #[allow(unsafe_code)]
                // SAFETY: as above; the registration is dropped once the
                // sink is final.
                let mr = unsafe {
                    x.pd.register_raw_iova(
                        r.ptr,
                        r.len,
                        super::sink::private_iova(r.len),
                        Access::LOCAL_WRITE | Access::REMOTE_WRITE,
                    )
                };
                let id = st.s.post_sink(
                    mr.rkey(),
                    mr.addr(),
                    r.len.min(u32::MAX as usize) as u32,
                    false,
                );
                x.flush(st);
                r.sink = Some((id, mr));
            }
            st.aio.recvs.push_front(r);
            return;
        };
        st.aio.done.push_back(Completion {
            cookie: r.cookie,
            op: AioOp::Recv,
            result,
            eor,
        });
    }
}

fn map_errno(e: MapError) -> io::Error {
    io::Error::from_raw_os_error(match e {
        MapError::NotMapped => libc::EINVAL,
        MapError::Access => libc::EACCES,
    })
}

impl XSocket {
    /// Most segments of one vectored one-sided write
    /// ([`Self::aio_writev`]; `WARPSOCK_IOV_MAX` in `warpsock_sockets.h`).
    pub const RIO_IOV_MAX: usize = 64;

    /// Posts one one-sided write (`write`) or read to/from the peer's
    /// mapping at `offset`, of the local segments `segs` (`(ptr, len)`,
    /// gathered or scattered in order: one RDMA Write or Read with that
    /// scatter/gather list). Returns the request's id.
    #[allow(unsafe_code)]
    unsafe fn post_rio(
        &self,
        st: &mut State,
        segs: &[(*mut u8, usize)],
        offset: u64,
        write: bool,
        cookie: Option<u64>,
    ) -> io::Result<u64> {
        if let Some((errno, _)) = st.error {
            return Err(io::Error::from_raw_os_error(errno));
        }
        let len: usize = segs.iter().map(|&(_, n)| n).sum();
        let (stag, to) =
            st.s.peer_map(offset, len as u64, write)
                .map_err(map_errno)?;
        let access = if write {
            Access::LOCAL_READ
        } else {
            Access::LOCAL_WRITE
        };
        let mrs: Vec<Mr> = segs
            .iter()
            // SAFETY: forwarded from the callers' contracts.
            .map(|&(p, n)| unsafe { self.pd.register_raw(p, n, access) })
            .collect();
        let id = st.next_id();
        let op = if write {
            SendOp::Write {
                remote_addr: to,
                rkey: stag,
            }
        } else {
            SendOp::Read {
                remote_addr: to,
                rkey: stag,
            }
        };
        let wr = SendWr {
            wr_id: WR_RIO | id,
            op,
            sgl: mrs.iter().map(|m| m.sge(0, m.len() as u32)).collect(),
            signaled: true,
        };
        st.aio.rio.insert(
            id,
            RioOp {
                mrs,
                op: if write { AioOp::Write } else { AioOp::Read },
                len,
                cookie,
            },
        );
        super::sndbuf::post_rio_wr(self, st, wr, write);
        Ok(id)
    }

    /// Asynchronous send of `len` bytes at `ptr`, completing with `cookie`.
    /// Its bytes go after those of every earlier send call and ahead of
    /// every later one (see the module's docs).
    ///
    /// # Safety
    /// The buffer must stay valid and unchanged until the completion is
    /// collected, or the socket's close begins (the send goes on from a
    /// private copy then: `detach_program_memory`).
    #[allow(unsafe_code)]
    pub unsafe fn aio_send(&self, ptr: *const u8, len: usize, cookie: u64) -> io::Result<()> {
        let mut st = self.lock();
        if let Some((errno, _)) = st.error {
            return Err(io::Error::from_raw_os_error(errno));
        }
        // Shut, or closed by the peer's FIN: as a plain send.
        if write_shut(&st) || st.peer_closed {
            return Err(io::Error::from_raw_os_error(libc::EPIPE));
        }
        // SAFETY: forwarded from this function's contract.
        unsafe { self.queue_send(&mut st, ptr, len, cookie) };
        pump(self, &mut st);
        self.flush(&mut st);
        Ok(())
    }

    /// Queues [`Self::aio_send`]'s send, behind those queued: a
    /// zero-length one too, so that it completes in call order, after
    /// the sends before it (review r19-xaio, item 5).
    ///
    /// # Safety
    /// As `aio_send`'s.
    #[allow(unsafe_code)]
    unsafe fn queue_send(&self, st: &mut State, ptr: *const u8, len: usize, cookie: u64) {
        // SAFETY: forwarded from this function's contract.
        let mr = (len > 0).then(|| unsafe {
            self.pd
                .register_raw(ptr.cast_mut(), len, Access::LOCAL_READ)
        });
        let call = st.next_id();
        st.aio.sends.push_back(AioSend {
            mr,
            len,
            off: 0,
            call,
            cookie: Some(cookie),
            end: true,
        });
        st.aio.unposted += 1;
    }

    /// Asynchronous receive into `len` bytes at `ptr`, completing with
    /// `cookie` and the length (0: end of stream) once bytes arrived —
    /// what [`Self::recv`] would return, in message mode with whether they
    /// end a message ([`Completion::eor`], `recv`'s `MSG_EOR`).
    ///
    /// # Safety
    /// The buffer must stay valid and untouched until the completion is
    /// collected, or the socket's close begins (the receive is dropped
    /// then, with no completion: `detach_program_memory`).
    #[allow(unsafe_code)]
    pub unsafe fn aio_recv(&self, ptr: *mut u8, len: usize, cookie: u64) -> io::Result<()> {
        if len == 0 {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        let mut st = self.lock();
        st.aio.recvs.push_back(AioRecv {
            ptr,
            len,
            cookie,
            sink: None,
        });
        pump(self, &mut st);
        Ok(())
    }

    /// Asynchronous one-sided write or read (`write`) of `len` bytes at
    /// `ptr` to/from the peer's mapping at `offset`.
    ///
    /// # Safety
    /// The buffer must stay valid (and, for a write, unchanged; for a read,
    /// untouched) until the completion is collected, or the socket's close
    /// begins (the request goes on with a private copy then:
    /// `detach_program_memory`).
    #[allow(unsafe_code)]
    pub unsafe fn aio_rio(
        &self,
        ptr: *mut u8,
        len: usize,
        offset: u64,
        write: bool,
        cookie: u64,
    ) -> io::Result<()> {
        if len == 0 {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        let mut st = self.lock();
        // SAFETY: forwarded.
        unsafe { self.post_rio(&mut st, &[(ptr, len)], offset, write, Some(cookie)) }.map(|_| ())
    }

    /// Asynchronous vectored one-sided write: the bytes of `segs` (`(ptr,
    /// len)`, in order) into the peer's mapping at `offset` and on, as one
    /// RDMA Write with that gather list — one post, one transmit round and
    /// one completion (`AioOp::Write`, the total length) for the lot, where
    /// a write per segment costs a round each. At most
    /// [`Self::RIO_IOV_MAX`] segments, none empty, each under 4 GiB:
    /// `EINVAL` otherwise.
    ///
    /// # Safety
    /// Every segment must stay valid and unchanged until the completion is
    /// collected.
    #[allow(unsafe_code)]
    pub unsafe fn aio_writev(
        &self,
        segs: &[(*const u8, usize)],
        offset: u64,
        cookie: u64,
    ) -> io::Result<()> {
        let bad = segs.is_empty()
            || segs.len() > Self::RIO_IOV_MAX
            || segs
                .iter()
                .any(|&(p, n)| p.is_null() || n == 0 || n > u32::MAX as usize);
        if bad {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        let segs: Vec<(*mut u8, usize)> = segs.iter().map(|&(p, n)| (p.cast_mut(), n)).collect();
        let mut st = self.lock();
        // SAFETY: forwarded; a write only reads the segments.
        unsafe { self.post_rio(&mut st, &segs, offset, true, Some(cookie)) }.map(|_| ())
    }

    /// Moves up to `max` finished asynchronous operations into `out`
    /// (after a round of progress). Returns how many.
    pub fn aio_poll(&self, out: &mut Vec<Completion>, max: usize) -> usize {
        let mut st = self.lock();
        self.drive_now(&mut st);
        let n = st.aio.done.len().min(max);
        out.extend(st.aio.done.drain(..n));
        n
    }

    /// Asynchronous operations not yet completed.
    pub fn aio_pending(&self) -> usize {
        let st = self.lock();
        st.aio.sends.iter().filter(|a| a.cookie.is_some()).count()
            + st.aio.recvs.len()
            + st.aio.rio.values().filter(|r| r.cookie.is_some()).count()
    }
}

mod maps;
mod sync;
#[cfg(test)]
mod tests;
