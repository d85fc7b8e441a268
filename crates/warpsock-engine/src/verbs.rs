//! The verbs objects: [`Context`], [`Pd`], [`Mr`], [`Cq`], [`Qp`] and the
//! work completion [`Wc`].

use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use warpsock_proto::{
    Access, Connection, Event, Negotiated, PdId, PostError, QpState, RecvWr, Registry, SendWr, Sge,
    Stag, WcOpcode, WcStatus, WorkCompletion,
};

use crate::engine::{CqSlot, ParkedRead, QpSlot, RxPool};
use crate::mem::Mem;
use crate::sys::{self, Epoll, EventFd, Ready};

/// Epoll token of the context's wake-up eventfd.
const WAKE_TOKEN: u64 = u64::MAX;
/// Up to this many queue pairs, caller-driven progress tries each socket
/// directly instead of asking epoll which are ready.
const DIRECT_POLL_MAX: usize = 8;
/// Longest single sleep of a caller parked in a blocking read (see
/// [`Cq::wait`]): it wakes this often to re-check its deadline and
/// anything another thread left it.
const PARK_SLICE: Duration = Duration::from_millis(10);
/// How long a dropped queue pair keeps its socket open, discarding input,
/// waiting for the peer's FIN (see [`Qp`]'s `Drop`).
const LINGER: Duration = Duration::from_secs(2);
/// How often the progress thread looks for lingering sockets to close.
const LINGER_TICK: Duration = Duration::from_millis(50);

/// How a context makes progress.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum Progress {
    /// Progress happens inside the application's calls: posts transmit at
    /// once, [`Cq::poll`] and [`Cq::wait`] receive. Lowest latency; nothing
    /// moves while the application is away computing.
    #[default]
    Caller,
    /// A background thread per context receives and finishes transmits, so
    /// operations complete while the application computes. The application
    /// blocks in [`Cq::wait`] or on [`Cq::notify_fd`].
    Thread,
}

/// Options for [`Context::with_options`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ContextOptions {
    /// Progress mode.
    pub progress: Progress,
    /// Caller-driven mode: how long [`Cq::wait`] spins polling the sockets
    /// before it sleeps in the kernel (zero: sleep at once). Spinning
    /// trades a CPU for latency.
    pub busy_poll: Duration,
}

/// Everything one context owns, behind one lock.
#[derive(Debug)]
pub(crate) struct State {
    pub(crate) reg: Registry<Mem>,
    pub(crate) qps: Vec<Option<QpSlot>>,
    pub(crate) cqs: Vec<Option<CqSlot>>,
    /// Receive staging buffers shared by the queue pairs.
    pub(crate) rx_pool: RxPool,
    next_key: u8,
    /// Dropped queue pairs still lingering (see [`QpSlot::detached`]).
    detached: usize,
    /// Whether the queue pairs' sockets are registered with the context's
    /// epoll. Always in progress-thread mode; in caller-driven mode only
    /// from the first time a caller needs epoll (see [`Self::watch_all`]).
    watching: bool,
}

impl State {
    fn service(&mut self, qi: usize, epoll: &Epoll) -> bool {
        let Self {
            reg,
            qps,
            cqs,
            rx_pool,
            ..
        } = self;
        match qps.get_mut(qi) {
            Some(Some(q)) => {
                q.service(qi as u64, reg, cqs, rx_pool, self.watching.then_some(epoll))
            }
            _ => false,
        }
    }

    /// Registers every queue pair's socket with epoll, from now on.
    ///
    /// A socket in an epoll set costs the kernel a callback on every
    /// segment that arrives (about 220 ns per 8-byte hop on loopback here,
    /// 4% of a TCP ping-pong), so caller-driven contexts leave their
    /// sockets out until a caller is about to sleep in `epoll_wait` or
    /// there are too many queue pairs to try each directly. Once on, it
    /// stays on (registering costs a system call per socket).
    fn watch_all(&mut self, epoll: &Epoll) {
        if self.watching {
            return;
        }
        self.watching = true;
        for (qi, q) in self.qps.iter_mut().enumerate() {
            if let Some(q) = q {
                q.update_interest(qi as u64, Some(epoll));
            }
        }
    }

    fn live_qps(&self) -> usize {
        self.qps.iter().flatten().filter(|q| !q.is_done()).count()
    }

    /// Closes the dropped queue pairs whose linger is over.
    fn reap(&mut self, epoll: &Epoll) {
        if self.detached == 0 {
            return;
        }
        let now = Instant::now();
        for slot in &mut self.qps {
            if slot.as_ref().is_some_and(|q| q.reapable(now)) {
                if let Some(mut q) = slot.take() {
                    q.unregister(epoll);
                }
                self.detached -= 1;
            }
        }
    }

    /// With exactly one connection in the context, prepares a blocking read
    /// of it for a caller about to sleep (see [`Cq::wait`]).
    fn park(&mut self, timeout: Duration) -> Option<(usize, ParkedRead)> {
        let mut live = self
            .qps
            .iter()
            .enumerate()
            .filter_map(|(i, q)| q.as_ref().filter(|q| !q.is_done()).map(|_| i));
        let (Some(qi), None) = (live.next(), live.next()) else {
            return None;
        };
        let Self { qps, rx_pool, .. } = self;
        let q = qps[qi].as_mut()?;
        q.park(rx_pool, timeout).map(|p| (qi, p))
    }

    /// Hands a parked read's result back to its queue pair (if that is
    /// still the same one) and services it.
    fn unpark(&mut self, qi: usize, p: ParkedRead, res: io::Result<usize>, epoll: &Epoll) {
        match self.qps.get_mut(qi) {
            Some(Some(q)) if q.id == p.slot_id => {
                q.unpark(p, res);
                self.service(qi, epoll);
                self.reap(epoll);
            }
            _ => p.discard(&mut self.rx_pool),
        }
    }

    fn qp(&mut self, qi: usize) -> &mut QpSlot {
        self.qps[qi]
            .as_mut()
            .expect("queue pair handle outlives its slot")
    }

    pub(crate) fn cq(&mut self, ci: usize) -> &mut CqSlot {
        self.cqs[ci].as_mut().expect("CQ handle outlives its slot")
    }
}

/// The shared part of a context.
#[derive(Debug)]
pub(crate) struct Inner {
    state: Mutex<State>,
    cv: Condvar,
    pub(crate) epoll: Epoll,
    wake: EventFd,
    progress: Progress,
    busy_poll: Duration,
    shutdown: AtomicBool,
}

impl Inner {
    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Caller-driven progress over every queue pair that may have work.
    fn progress_locked(&self, st: &mut State) -> bool {
        let mut changed = false;
        if st.live_qps() <= DIRECT_POLL_MAX {
            for qi in 0..st.qps.len() {
                if st.qps[qi].as_ref().is_some_and(|q| !q.is_done()) {
                    changed |= st.service(qi, &self.epoll);
                }
            }
            st.reap(&self.epoll);
        } else {
            st.watch_all(&self.epoll);
            let mut ready = Vec::new();
            if self.epoll.wait(&mut ready, Some(Duration::ZERO)).is_ok() {
                for r in ready {
                    if r.token != WAKE_TOKEN {
                        changed |= st.service(r.token as usize, &self.epoll);
                    }
                }
            }
            st.reap(&self.epoll);
        }
        changed
    }

    /// Transmit progress for one queue pair right after a post.
    fn kick(&self, st: &mut State, qi: usize) {
        let State {
            reg,
            qps,
            cqs,
            watching,
            ..
        } = st;
        let epoll = watching.then_some(&self.epoll);
        let changed = match qps.get_mut(qi) {
            Some(Some(q)) => q.service_tx(qi as u64, reg, cqs, epoll),
            _ => false,
        };
        if changed && self.progress == Progress::Thread {
            self.cv.notify_all();
        }
    }

    /// Adds an established connection as a queue pair.
    pub(crate) fn add_qp(
        self: &Arc<Self>,
        conn: Connection,
        sock: std::net::TcpStream,
        events: Vec<Event>,
        early: Vec<u8>,
        send_cq: usize,
        recv_cq: usize,
    ) -> io::Result<usize> {
        // The socket is in blocking mode (as connect and accept leave it):
        // the engine's own reads and writes say MSG_DONTWAIT; only a parked
        // caller's read sleeps (see `Cq::wait`).
        let mut st = self.lock();
        let qi = match st.qps.iter().position(Option::is_none) {
            Some(i) => i,
            None => {
                st.qps.push(None);
                st.qps.len() - 1
            }
        };
        let mut slot = QpSlot::new(conn, sock, qi as u32, send_cq, recv_cq);
        slot.events.extend(events);
        slot.update_interest(qi as u64, st.watching.then_some(&self.epoll));
        let staged = !early.is_empty();
        if staged {
            slot.stage(&early, &mut st.rx_pool);
        }
        st.qps[qi] = Some(slot);
        if staged {
            // Consume them now: epoll will not report bytes already read.
            if st.service(qi, &self.epoll) && self.progress == Progress::Thread {
                self.cv.notify_all();
            }
        } else {
            self.kick(&mut st, qi);
        }
        Ok(qi)
    }

    fn run_thread(self: Arc<Self>) {
        let mut ready: Vec<Ready> = Vec::with_capacity(256);
        let mut lingering = false;
        while !self.shutdown.load(Ordering::Acquire) {
            ready.clear();
            let timeout = lingering.then_some(LINGER_TICK);
            if self.epoll.wait(&mut ready, timeout).is_err() {
                std::thread::sleep(Duration::from_millis(1));
                continue;
            }
            let mut changed = false;
            {
                let mut st = self.lock();
                for r in &ready {
                    if r.token == WAKE_TOKEN {
                        self.wake.clear();
                    } else {
                        changed |= st.service(r.token as usize, &self.epoll);
                    }
                }
                st.reap(&self.epoll);
                lingering = st.detached > 0;
            }
            if changed {
                self.cv.notify_all();
            }
        }
    }
}

/// What every handle holds: the context, and (progress-thread mode) the
/// thread, stopped when the last handle goes.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) inner: Arc<Inner>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Drop for Shared {
    fn drop(&mut self) {
        self.inner.shutdown.store(true, Ordering::Release);
        self.inner.wake.notify();
        let t = self
            .thread
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(t) = t {
            let _ = t.join();
        }
    }
}

/// A device context: the unit of progress. Owns the sockets, memory
/// registrations and completion queues of everything created from it.
///
/// Cloning gives another handle on the same context. Objects created from
/// a context keep it alive; its progress thread (if any) stops when the
/// last of them is dropped.
#[derive(Debug, Clone)]
pub struct Context {
    pub(crate) sh: Arc<Shared>,
}

impl Context {
    /// A context with the given progress mode and no busy polling.
    pub fn new(progress: Progress) -> io::Result<Self> {
        Self::with_options(ContextOptions {
            progress,
            ..Default::default()
        })
    }

    /// A context with explicit options.
    pub fn with_options(opts: ContextOptions) -> io::Result<Self> {
        let epoll = Epoll::new()?;
        let wake = EventFd::new()?;
        epoll.add(wake.as_raw_fd(), WAKE_TOKEN, sys::EP_IN)?;
        let inner = Arc::new(Inner {
            state: Mutex::new(State {
                reg: Registry::new(),
                qps: Vec::new(),
                cqs: Vec::new(),
                rx_pool: RxPool::default(),
                next_key: 0,
                detached: 0,
                watching: opts.progress == Progress::Thread,
            }),
            cv: Condvar::new(),
            epoll,
            wake,
            progress: opts.progress,
            busy_poll: opts.busy_poll,
            shutdown: AtomicBool::new(false),
        });
        let thread = match opts.progress {
            Progress::Caller => None,
            Progress::Thread => {
                let i = Arc::clone(&inner);
                Some(
                    std::thread::Builder::new()
                        .name("warpsock-progress".into())
                        .spawn(move || i.run_thread())?,
                )
            }
        };
        Ok(Self {
            sh: Arc::new(Shared {
                inner,
                thread: Mutex::new(thread),
            }),
        })
    }

    /// The progress mode.
    pub fn progress_mode(&self) -> Progress {
        self.sh.inner.progress
    }

    /// Allocates a protection domain.
    pub fn alloc_pd(&self) -> Pd {
        let id = self.sh.inner.lock().reg.alloc_pd();
        Pd {
            sh: Arc::clone(&self.sh),
            id,
        }
    }

    /// Creates a completion queue. `capacity` sizes its initial storage;
    /// completions are never dropped when more arrive.
    pub fn create_cq(&self, capacity: usize) -> io::Result<Cq> {
        let mut slot = CqSlot::new()?;
        slot.entries.reserve(capacity);
        let mut st = self.sh.inner.lock();
        let id = match st.cqs.iter().position(Option::is_none) {
            Some(i) => i,
            None => {
                st.cqs.push(None);
                st.cqs.len() - 1
            }
        };
        st.cqs[id] = Some(slot);
        Ok(Cq {
            sh: Arc::clone(&self.sh),
            id,
        })
    }

    /// Caller-driven mode: one non-blocking round of progress on every
    /// queue pair (receive and transmit). Returns whether anything
    /// completed. A no-op in progress-thread mode.
    pub fn progress(&self) -> bool {
        let inner = &self.sh.inner;
        if inner.progress != Progress::Caller {
            return false;
        }
        let mut st = inner.lock();
        inner.progress_locked(&mut st)
    }
}

/// A protection domain: memory regions and queue pairs in one domain may
/// be used together; the peer's STags are checked against it.
#[derive(Debug)]
pub struct Pd {
    pub(crate) sh: Arc<Shared>,
    pub(crate) id: PdId,
}

impl Pd {
    /// The context this domain belongs to.
    pub fn context(&self) -> Context {
        Context {
            sh: Arc::clone(&self.sh),
        }
    }

    /// Registers an owned buffer. Its bytes are reached through
    /// [`Mr::read`], [`Mr::write`] and [`Mr::with_bytes`]; the buffer is
    /// freed when the `Mr` is dropped.
    pub fn register(&self, buf: Vec<u8>, access: Access) -> Mr {
        self.insert(Mem::Owned(buf.into_boxed_slice()), access)
    }

    /// Registers a zeroed owned buffer of `len` bytes.
    pub fn alloc(&self, len: usize, access: Access) -> Mr {
        self.register(vec![0; len], access)
    }

    pub(crate) fn insert(&self, mem: Mem, access: Access) -> Mr {
        let addr = mem.addr();
        self.insert_at(mem, addr, access)
    }

    /// Registers `mem` with its byte 0 at tagged offset `addr`.
    pub(crate) fn insert_at(&self, mem: Mem, addr: u64, access: Access) -> Mr {
        let base = mem.addr();
        let len = warpsock_proto::Backing::bytes(&mem).len();
        let mut st = self.sh.inner.lock();
        st.next_key = st.next_key.wrapping_add(1);
        let key = st.next_key;
        let stag = st.reg.register(self.id, addr, mem, access, key);
        Mr {
            sh: Arc::clone(&self.sh),
            stag,
            addr,
            base,
            len,
            locked: AtomicBool::new(false),
        }
    }
}

/// A registered memory region. Its STag serves as both lkey and rkey.
/// Dropping it deregisters the region (and frees an owned buffer).
#[derive(Debug)]
pub struct Mr {
    sh: Arc<Shared>,
    stag: Stag,
    /// Tagged offset of byte 0 (the memory's address unless registered
    /// with an iova).
    addr: u64,
    /// Where byte 0 is in this process's memory.
    base: u64,
    len: usize,
    locked: AtomicBool,
}

impl Mr {
    /// The local key (for [`Sge::lkey`]).
    pub fn lkey(&self) -> Stag {
        self.stag
    }

    /// The remote key, to give the peer for RDMA Write/Read.
    pub fn rkey(&self) -> Stag {
        self.stag
    }

    /// The region's first address (the tagged offset of byte 0).
    pub fn addr(&self) -> u64 {
        self.addr
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the region is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// A scatter/gather element for `len` bytes at `offset` into the region.
    pub fn sge(&self, offset: usize, len: u32) -> Sge {
        Sge {
            addr: self.addr + offset as u64,
            length: len,
            lkey: self.stag,
        }
    }

    /// Runs `f` on the region's bytes (under the context lock: keep it short).
    pub fn with_bytes<R>(&self, f: impl FnOnce(&[u8]) -> R) -> R {
        let st = self.sh.inner.lock();
        let b = st
            .reg
            .backing(self.stag)
            .expect("registered while the Mr lives");
        f(warpsock_proto::Backing::bytes(b))
    }

    /// Runs `f` on the region's bytes, writable (under the context lock).
    pub fn with_bytes_mut<R>(&self, f: impl FnOnce(&mut [u8]) -> R) -> R {
        let mut st = self.sh.inner.lock();
        let b = st
            .reg
            .backing_mut(self.stag)
            .expect("registered while the Mr lives");
        f(warpsock_proto::Backing::bytes_mut(b))
    }

    /// Copies `dst.len()` bytes from `offset` into `dst`.
    ///
    /// # Panics
    /// If the range is outside the region.
    pub fn read(&self, offset: usize, dst: &mut [u8]) {
        self.with_bytes(|b| dst.copy_from_slice(&b[offset..offset + dst.len()]));
    }

    /// Copies `src` into the region at `offset`.
    ///
    /// # Panics
    /// If the range is outside the region.
    pub fn write(&self, offset: usize, src: &[u8]) {
        self.with_bytes_mut(|b| b[offset..offset + src.len()].copy_from_slice(src));
    }

    /// A copy of the region's bytes.
    pub fn to_vec(&self) -> Vec<u8> {
        self.with_bytes(<[u8]>::to_vec)
    }

    /// Locks the region's pages in RAM (`mlock`); they are unlocked when the
    /// `Mr` is dropped. Fails like `mlock` (e.g. `RLIMIT_MEMLOCK`).
    pub fn mlock(&self) -> io::Result<()> {
        if self.len == 0 || self.locked.load(Ordering::Relaxed) {
            return Ok(());
        }
        sys::mlock(self.base as *const u8, self.len)?;
        self.locked.store(true, Ordering::Relaxed);
        Ok(())
    }

    /// Whether [`Self::mlock`] succeeded.
    pub fn is_locked(&self) -> bool {
        self.locked.load(Ordering::Relaxed)
    }
}

impl Drop for Mr {
    fn drop(&mut self) {
        if *self.locked.get_mut() {
            sys::munlock(self.base as *const u8, self.len);
        }
        self.sh.inner.lock().reg.deregister(self.stag);
    }
}

/// A work completion (`ibv_wc`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wc {
    /// The request's `wr_id`.
    pub wr_id: u64,
    /// Outcome.
    pub status: WcStatus,
    /// Kind of request.
    pub opcode: WcOpcode,
    /// Bytes transferred (received bytes for a receive; 0 on error).
    pub byte_len: u32,
    /// The queue pair it belongs to ([`Qp::qp_num`]).
    pub qp_num: u32,
    /// Receive of a Send with Invalidate: the local STag the peer invalidated.
    pub invalidated: Option<Stag>,
    /// Receive: the Send asked for a solicited event.
    pub solicited: bool,
}

impl Wc {
    pub(crate) fn from_core(wc: WorkCompletion, qp_num: u32) -> Self {
        Self {
            wr_id: wc.wr_id,
            status: wc.status,
            opcode: wc.opcode,
            byte_len: wc.byte_len,
            qp_num,
            invalidated: wc.invalidated,
            solicited: wc.solicited,
        }
    }

    /// Whether the operation succeeded.
    pub fn is_ok(&self) -> bool {
        self.status == WcStatus::Success
    }
}

impl Default for Wc {
    fn default() -> Self {
        Self {
            wr_id: 0,
            status: WcStatus::Success,
            opcode: WcOpcode::Send,
            byte_len: 0,
            qp_num: 0,
            invalidated: None,
            solicited: false,
        }
    }
}

/// A completion queue.
#[derive(Debug)]
pub struct Cq {
    pub(crate) sh: Arc<Shared>,
    pub(crate) id: usize,
}

impl Cq {
    /// Moves up to `out.len()` completions into `out` and returns how many.
    /// In caller-driven mode this first makes one non-blocking round of
    /// progress.
    pub fn poll(&self, out: &mut [Wc]) -> usize {
        let inner = &self.sh.inner;
        let mut st = inner.lock();
        if inner.progress == Progress::Caller {
            inner.progress_locked(&mut st);
        }
        st.cq(self.id).drain_into(out)
    }

    /// Like [`Self::poll`], but waits up to `timeout` for at least one
    /// completion. Returns 0 if none arrived in time.
    ///
    /// Caller-driven mode: drives progress, spinning for the context's
    /// `busy_poll` time, then sleeping in `epoll_wait` on the context's
    /// sockets. Progress-thread mode: sleeps until the thread delivers.
    pub fn wait(&self, out: &mut [Wc], timeout: Duration) -> io::Result<usize> {
        let inner = &self.sh.inner;
        if inner.progress == Progress::Thread {
            let deadline = Instant::now().checked_add(timeout);
            let left = |now: Instant| deadline.map(|d| d.saturating_duration_since(now));
            let mut st = inner.lock();
            loop {
                let n = st.cq(self.id).drain_into(out);
                if n > 0 || out.is_empty() {
                    return Ok(n);
                }
                let wait = match left(Instant::now()) {
                    Some(d) if d.is_zero() => return Ok(0),
                    Some(d) => d,
                    None => Duration::from_secs(3600),
                };
                st = inner
                    .cv
                    .wait_timeout(st, wait)
                    .unwrap_or_else(PoisonError::into_inner)
                    .0;
            }
        }
        let mut ready = Vec::new();
        // Without busy polling, ask epoll first: every service round leaves
        // nothing behind that epoll would not report (unread input, queued
        // output), so a round now would only cost a futile read.
        let mut drive = !inner.busy_poll.is_zero();
        // The clock is read only once a round has come up empty: a wait
        // that finds its completion at once (the common case in a
        // ping-pong) costs no clock read. The timeout and the spin then
        // count from that first empty round.
        let mut clock: Option<(Option<Instant>, Instant)> = None;
        loop {
            {
                let mut st = inner.lock();
                if drive {
                    inner.progress_locked(&mut st);
                }
                let n = st.cq(self.id).drain_into(out);
                if n > 0 || out.is_empty() {
                    return Ok(n);
                }
            }
            drive = true;
            let now = Instant::now();
            let (deadline, spin_until) =
                *clock.get_or_insert_with(|| (now.checked_add(timeout), now + inner.busy_poll));
            let rest = deadline.map(|d| d.saturating_duration_since(now));
            if rest.is_some_and(|d| d.is_zero()) {
                return Ok(0);
            }
            if now < spin_until {
                // Yield between rounds: free when this CPU has nothing else
                // to run, and lets a peer sharing the CPU answer.
                std::thread::yield_now();
                continue;
            }
            // With one connection, sleep in a blocking read of its socket
            // instead of in epoll: the bytes that wake us are already read
            // (no separate readiness call), and the read's timeout is a
            // timer-wheel timeout, not epoll's high-resolution one — about
            // as cheap as a blocking TCP read. The lock is released while
            // asleep; posts from other threads go on meanwhile.
            let slice = rest.map_or(PARK_SLICE, |d| d.min(PARK_SLICE));
            let parked = inner.lock().park(slice);
            if let Some((qi, mut p)) = parked {
                let res = p.read();
                let mut st = inner.lock();
                st.unpark(qi, p, res, &inner.epoll);
                let n = st.cq(self.id).drain_into(out);
                if n > 0 {
                    return Ok(n);
                }
                // Serviced just now: look again before another round.
                drive = false;
                continue;
            }
            inner.lock().watch_all(&inner.epoll);
            ready.clear();
            inner.epoll.wait(&mut ready, rest)?;
        }
    }

    /// A file descriptor that is readable while completions are waiting
    /// in this queue (it becomes readable when one arrives and unreadable
    /// when [`Self::poll`]/[`Self::wait`] empties the queue). Put it in your
    /// own `poll`/`epoll` set in progress-thread mode. In caller-driven mode
    /// nothing arrives unless the application drives progress. The fd is
    /// maintained from the first call on (it costs two system calls per
    /// completion burst, so it is off until asked for).
    pub fn notify_fd(&self) -> RawFd {
        let mut st = self.sh.inner.lock();
        let cq = st.cq(self.id);
        cq.arm();
        cq.notify.as_raw_fd()
    }

    /// Completions currently queued.
    pub fn len(&self) -> usize {
        self.sh.inner.lock().cq(self.id).entries.len()
    }

    /// Whether no completion is queued.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Drop for Cq {
    fn drop(&mut self) {
        self.sh.inner.lock().cqs[self.id] = None;
    }
}

/// A connected queue pair (one TCP connection). Created by
/// [`crate::connect`] or [`crate::ConnectRequest::accept`].
///
/// Dropping it disconnects gracefully (outstanding requests are flushed,
/// FIN is sent) and closes the socket.
#[derive(Debug)]
pub struct Qp {
    pub(crate) sh: Arc<Shared>,
    pub(crate) qi: usize,
    pub(crate) local: std::net::SocketAddr,
    pub(crate) peer: std::net::SocketAddr,
}

impl Qp {
    fn with<R>(&self, f: impl FnOnce(&mut State, &Inner) -> R) -> R {
        let inner = &self.sh.inner;
        let mut st = inner.lock();
        f(&mut st, inner)
    }

    /// The queue pair number reported in [`Wc::qp_num`].
    pub fn qp_num(&self) -> u32 {
        self.qi as u32
    }

    /// Posts a send-queue request (Send, RDMA Write, RDMA Read) and starts
    /// transmitting it at once. Errors in the request itself (bad local
    /// buffers) and a dead queue pair surface as completions.
    pub fn post_send(&self, wr: SendWr) -> Result<(), PostError> {
        self.with(|st, inner| {
            st.qp(self.qi).conn.post_send(wr)?;
            inner.kick(st, self.qi);
            Ok(())
        })
    }

    /// Posts several send-queue requests, then transmits. Stops at the
    /// first that fails to post, returning how many were posted with the
    /// error.
    pub fn post_send_batch(
        &self,
        wrs: impl IntoIterator<Item = SendWr>,
    ) -> Result<usize, (usize, PostError)> {
        self.with(|st, inner| {
            let mut n = 0;
            let mut res = Ok(());
            for wr in wrs {
                if let Err(e) = st.qp(self.qi).conn.post_send(wr) {
                    res = Err((n, e));
                    break;
                }
                n += 1;
            }
            inner.kick(st, self.qi);
            res.map(|()| n)
        })
    }

    /// Posts a receive for an incoming Send.
    pub fn post_recv(&self, wr: RecvWr) -> Result<(), PostError> {
        self.with(|st, inner| {
            let conn = &mut st.qp(self.qi).conn;
            conn.post_recv(wr)?;
            // A receive posted to a QP that is not in RTS completes at once
            // (flushed): deliver that. In RTS a receive produces neither
            // output nor a completion, so no transmit round (a ping-pong
            // reposts a receive per message).
            if conn.state() != QpState::Rts {
                inner.kick(st, self.qi);
            }
            Ok(())
        })
    }

    /// Queue pair state.
    pub fn state(&self) -> QpState {
        self.with(|st, _| st.qp(self.qi).conn.state())
    }

    /// What MPA negotiated (CRC, IRD/ORD, RTR, the peer's private data).
    pub fn negotiated(&self) -> Option<Negotiated> {
        self.with(|st, _| st.qp(self.qi).conn.negotiated().cloned())
    }

    /// The next connection event ([`Event::Established`],
    /// [`Event::Terminated`], [`Event::Closed`], ...), if any.
    pub fn poll_event(&self) -> Option<Event> {
        self.with(|st, _| st.qp(self.qi).events.pop_front())
    }

    /// The socket error that ended the connection (`ECONNRESET`,
    /// `ETIMEDOUT` from `TCP_USER_TIMEOUT`/keepalive, ...), if one did. A
    /// connection that ended with FIN, a Terminate or a local close has
    /// none.
    pub fn socket_error(&self) -> Option<io::Error> {
        self.with(|st, _| st.qp(self.qi).error.map(io::Error::from_raw_os_error))
    }

    /// Whether the TCP connection is finished in both directions (closed,
    /// reset or failed).
    pub fn is_closed(&self) -> bool {
        self.with(|st, _| st.qp(self.qi).is_done())
    }

    /// Local socket address.
    pub fn local_addr(&self) -> std::net::SocketAddr {
        self.local
    }

    /// Peer socket address.
    pub fn peer_addr(&self) -> std::net::SocketAddr {
        self.peer
    }

    /// Graceful disconnect (`rdma_disconnect`): outstanding requests are
    /// flushed with [`WcStatus::WrFlushError`], bytes already handed to the
    /// socket are delivered, then FIN is sent.
    pub fn disconnect(&self) {
        self.with(|st, inner| {
            st.qp(self.qi).conn.close();
            inner.kick(st, self.qi);
        });
    }

    /// Ends the connection with a Terminate carrying `code`, for an upper
    /// layer that found the peer broke *its* protocol (a malformed message
    /// in a receive, a credit overrun): outstanding requests are flushed,
    /// the Terminate goes out (RFC 5040 §7; untagged, QN 2), then FIN. The
    /// peer sees [`Event::Terminated`] with `code`.
    pub fn terminate(&self, code: crate::proto::wire::terminate::TermCode) {
        self.with(|st, inner| {
            st.qp(self.qi).conn.fail_local(Some(code), false);
            inner.kick(st, self.qi);
        });
    }

    /// Abortive close: everything outstanding is flushed and the peer gets
    /// a TCP reset (`SO_LINGER` 0).
    pub fn abort(self) {
        self.with(|st, inner| {
            let State {
                qps,
                cqs,
                reg,
                rx_pool,
                watching,
                ..
            } = st;
            let q = qps[self.qi].as_mut().expect("slot");
            q.abort();
            let epoll = watching.then_some(&inner.epoll);
            q.service(self.qi as u64, reg, cqs, rx_pool, epoll);
            q.unregister(&inner.epoll);
        });
        if self.sh.inner.progress == Progress::Thread {
            self.sh.inner.cv.notify_all();
        }
        // Drop closes the socket, which now resets the connection.
    }
}

impl Drop for Qp {
    /// Disconnects (flush, FIN) and leaves the socket to linger: it stays
    /// open, its input discarded, until the peer's FIN (or 2 s), and
    /// is closed by later progress (any call on the context in
    /// caller-driven mode, the progress thread otherwise) or when the
    /// context goes. Closing at once would make the kernel answer the
    /// peer's further bytes with a reset, and a reset makes the *peer's*
    /// kernel drop what we sent last and it has not read yet.
    fn drop(&mut self) {
        let inner = &self.sh.inner;
        let mut st = inner.lock();
        if let Some(q) = st.qps[self.qi].as_mut() {
            if !q.is_done() {
                q.conn.close();
            }
        }
        st.service(self.qi, &inner.epoll);
        if let Some(q) = st.qps[self.qi].as_mut() {
            q.detached = Some(Instant::now() + LINGER);
            st.detached += 1;
        }
        st.reap(&inner.epoll);
        drop(st);
        if inner.progress == Progress::Thread {
            inner.cv.notify_all();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{connect, Access, Listener, QpInit, RecvWr, SendOp, SendWr, Sge};

    /// How many descriptors the context's epoll set watches (its
    /// `/proc/self/fdinfo` lists one `tfd:` line per registered fd).
    fn watched(ctx: &Context) -> usize {
        let fd = ctx.sh.inner.epoll.as_raw_fd();
        std::fs::read_to_string(format!("/proc/self/fdinfo/{fd}"))
            .expect("fdinfo of the epoll fd")
            .lines()
            .filter(|l| l.starts_with("tfd:"))
            .count()
    }

    fn send(wr_id: u64, sge: Sge) -> SendWr {
        SendWr {
            wr_id,
            op: SendOp::Send {
                solicited: false,
                invalidate: None,
            },
            sgl: sge.into(),
            signaled: true,
        }
    }

    /// Caller-driven contexts keep their sockets out of epoll while callers
    /// only poll or spin (each socket in an epoll set costs a kernel
    /// callback per arriving segment), and register all of them the
    /// moment a caller has to sleep in `epoll_wait` — which must then
    /// wake for the completion, not at its timeout.
    #[test]
    fn caller_driven_sockets_join_epoll_only_to_sleep() {
        let l = Listener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        // The peer: a progress-thread context with two queue pairs; on the
        // second it sends once, after a pause, when told to.
        let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
        let peer = std::thread::spawn(move || {
            let ctx = Context::new(Progress::Thread).unwrap();
            let (pd, cq) = (ctx.alloc_pd(), ctx.create_cq(16).unwrap());
            let buf = pd.alloc(64, Access::LOCAL_WRITE);
            let mut init = QpInit::new(&pd, &cq);
            init.recvs = vec![RecvWr {
                wr_id: 1,
                sgl: buf.sge(0, 64).into(),
            }];
            let limit = Some(Duration::from_secs(10));
            let q1 = l.accept_qp(&init, b"", limit).unwrap();
            init.recvs.clear();
            let q2 = l.accept_qp(&init, b"", limit).unwrap();
            go_rx.recv().unwrap();
            std::thread::sleep(Duration::from_millis(200));
            q2.post_send(send(2, buf.sge(0, 8))).unwrap();
            // Connected until the test has looked (a FIN would take a
            // socket out of epoll).
            go_rx.recv().unwrap();
            drop((q1, q2));
        });
        let ctx = Context::new(Progress::Caller).unwrap();
        let (pd, cq) = (ctx.alloc_pd(), ctx.create_cq(16).unwrap());
        let buf = pd.alloc(64, Access::LOCAL_WRITE);
        let mut init = QpInit::new(&pd, &cq);
        let q1 = connect(addr, &init).unwrap();
        init.recvs = vec![RecvWr {
            wr_id: 7,
            sgl: buf.sge(0, 64).into(),
        }];
        let q2 = connect(addr, &init).unwrap();
        // Spinning on poll: a Send goes out and completes, nothing joins
        // epoll but the context's own wake-up eventfd.
        q1.post_send(send(1, buf.sge(0, 8))).unwrap();
        let mut wc = [Wc::default(); 4];
        let t = Instant::now();
        while cq.poll(&mut wc) == 0 {
            assert!(t.elapsed() < Duration::from_secs(10), "no send completion");
        }
        assert!(wc[0].is_ok(), "{:?}", wc[0]);
        assert_eq!(watched(&ctx), 1, "sockets registered while only polling");
        // Two live connections: a sleeping wait goes through epoll, which
        // must now watch both sockets and wake when the peer's Send lands.
        go_tx.send(()).unwrap();
        let t = Instant::now();
        let n = cq.wait(&mut wc, Duration::from_secs(20)).unwrap();
        assert_eq!(n, 1);
        assert_eq!((wc[0].wr_id, wc[0].byte_len), (7, 8), "{:?}", wc[0]);
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "the wait slept to its timeout: {:?}",
            t.elapsed()
        );
        assert_eq!(watched(&ctx), 3, "eventfd and both sockets");
        go_tx.send(()).unwrap();
        drop((q1, q2));
        peer.join().unwrap();
    }
}
