//! The busy answer to a mark that comes after the accept ([`watch`]).
//!
//! An accepted connection left plain for want of a switching place (or
//! beyond the budget of DDP sockets) is answered at once when its client's
//! mark is there already (`start`, `warpsock_xsock::io::answer_busy`).
//! A server that accepts as connections arrive — an idle event loop, or
//! one whose places slow-loris clients hold — usually takes the
//! connection before the client's mark: with nothing there yet
//! ([`BusyAnswer::NotYet`]) the connection is watched here, on one thread
//! of the process's, until the mark comes (answered then, if our program
//! still wrote nothing), the client's bytes or its end come first (a
//! client without warpsock: left alone), the program closes the number,
//! or the watch's bound (the accepted connections' mark timeout, what a
//! client waits at most: no answer once it passed, the client may have
//! gone on as TCP). Before, such a client waited out its fallback
//! (`WARPSOCK_DDP_FALLBACK_MS`, 1 s) on every connection.
//!
//! Bounds: at most [`WATCHES_MAX`] connections at once, and
//! [`WATCH_PEER_SHARE`] of one peer (beyond, the client waits its
//! fallback, as before; a full list or share first drops the watches
//! whose numbers the program closed, [`Watches::prune`]); one thread, made
//! on the first watch and ended when none is left.
//!
//! The watches are an epoll set's (one per process, made with its first
//! watch), each registered once (`EPOLLONESHOT`: a decided watch never
//! reports again, whether or not its removal could be made). An epoll set
//! holds no reference to the sockets in it: the program's close of a
//! watched connection takes effect at once (its FIN, or its reset with
//! `SO_LINGER`, from the program's own `close`), and the kernel takes the
//! socket out of the set. A `poll` (before) held every socket it waited
//! on until it returned, up to 20 ms, and a close with `SO_LINGER` set
//! lingered on this thread then. Neither is a duplicate kept: a duplicate
//! would keep the connection open after the program closed it (its FIN
//! late by up to the bound).
//!
//! Numbers and sockets: a registration is the socket's under the number
//! it had; the program may close the number and give it to another socket
//! since. A watch is decided only while its number is still its socket
//! (told by its inode, [`SocketId`]); a mark is answered on a duplicate
//! made then and looked at again, and only if nothing follows the mark
//! (`answer_busy`: a client that gave up and went on as TCP is left
//! alone); a watch is taken out of the set only while its number is its
//! socket (the set's key is the socket with its number: the number's new
//! socket, watched too, must keep its registration). A removal skipped
//! leaves a registration that reports at most once more, to no watch, and
//! goes with its socket.
//!
//! A program that writes first just as the mark comes (a server that
//! speaks first, and a client that marked late) could see its bytes go
//! out between `answer_busy`'s look and its `BUSY`: the client then finds
//! the bytes first and goes on as TCP, and its program sees an urgent
//! byte. The window is a few system calls.
//!
//! Fork: a child has no watching thread, and a parent's thread may hold
//! the lock at the fork: the watcher is per process ([`forget_after_fork`]
//! closes the child's copy of the set's descriptor; a raw `fork` is told
//! by the pid, its copy left open), so a child's first watch starts
//! afresh. The set itself is the parent's still (an open file description
//! the child's close does not end). An answer's duplicate (`answer_on`) is
//! never kept by a child: it is recorded before a fork can copy it (a
//! fork's prepare handler, [`hold_answers_for_fork`], waits for a `dup`
//! under way, and none starts until the fork is made), and the child's
//! handler closes the copy ([`forget_after_fork`]). A child that kept it
//! would hold the connection open after the program's close, under a
//! lifted number it never closes (helper 64's review, item 6). The fork
//! does not wait for the answer itself (helper 67's review, item 4: a
//! `SO_LINGER` close inside it held the fork). A raw `fork` (no
//! handlers) is not held, and its child keeps a duplicate open then.

use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicI32, AtomicPtr, AtomicU32, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use libc::c_int;
use warpsock_engine::{fds, rawsys};
use warpsock_xsock::io::{answer_busy, BusyAnswer};

use super::slot::PeerBlock;
use super::BUSY_ANSWERED;
use crate::shim::guard::enter;
use crate::shim::{real, sys};

/// Most connections watched at once.
pub(super) const WATCHES_MAX: usize = 64;

/// The most of them from one peer (`slot::PeerBlock`): three quarters, so
/// that clients from elsewhere find a quarter free whatever one peer's
/// clients that never send their mark hold (each until its bound), as the
/// places of the switches (`slot::PEER_SHARE`; helper 66's review, item
/// 3: one address filled the watches).
pub(super) const WATCH_PEER_SHARE: usize = WATCHES_MAX * 3 / 4;

/// The longest the thread waits between looks at the bounds: a watch
/// added with a nearer bound than the wait under way leaves the list at
/// most this late (and is never answered past its bound,
/// [`Watches::after_wait`]).
const LOOK_MAX: Duration = Duration::from_secs(1);

/// The longest a fork waits for an answer's duplicate being made
/// ([`hold_answers_for_fork`]): a system call and a store, this bound only
/// covers a watcher thread the scheduler put aside; past it the fork goes
/// on (and its child may keep that duplicate).
#[cfg(not(test))]
const FORK_WAIT_MAX: Duration = Duration::from_secs(1);
/// Past any stall of a loaded test machine: a test's fork that ends its
/// wait at this bound fails as one the hold did not hold.
#[cfg(test)]
const FORK_WAIT_MAX: Duration = Duration::from_secs(30);

/// What a watch waits for — urgent data, bytes, the peer's end — reported
/// once: each of them decides it.
const EVENTS: u32 = (libc::EPOLLPRI | libc::EPOLLIN | libc::EPOLLRDHUP | libc::EPOLLONESHOT) as u32;

/// A socket's identity: its device and inode (`fstat`), to tell the
/// watched connection from another socket given its number since.
type SocketId = (u64, u64);

/// One watched connection: the program's number, its socket, its peer
/// (`slot::PeerBlock::key`; 0: not known), its bound and its token in the
/// epoll set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Watch {
    fd: c_int,
    id: SocketId,
    peer: u64,
    until: Instant,
    token: u64,
}

/// The watches, sans-IO: what is registered, and what a wait's events
/// decide.
#[derive(Debug, Default)]
struct Watches {
    list: Vec<Watch>,
    /// The last token given (0: none; tokens are never reused, so a stale
    /// registration's report names no watch).
    last: u64,
}

/// What a wait decided ([`Watches::after_wait`]).
#[derive(Debug, Default, PartialEq, Eq)]
struct Decided {
    /// Marks to answer (`answer_busy` looks at each).
    answer: Vec<Watch>,
    /// Watches over — answered, left alone, or past their bound — to take
    /// out of the set.
    over: Vec<Watch>,
}

impl Watches {
    /// Adds a watch of the number `fd`, socket `id`, from `peer`, until
    /// `until`: its token, or `None` at [`WATCHES_MAX`] or the peer's
    /// [`WATCH_PEER_SHARE`] (or when that socket under that number is
    /// watched already).
    fn add(&mut self, fd: c_int, id: SocketId, peer: u64, until: Instant) -> Option<u64> {
        if self.is_full()
            || self.holds_share(peer)
            || self.list.iter().any(|x| x.fd == fd && x.id == id)
        {
            return None;
        }
        self.last += 1;
        self.list.push(Watch {
            fd,
            id,
            peer,
            until,
            token: self.last,
        });
        Some(self.last)
    }

    /// Takes out the watch `token` (its registration failed).
    fn remove(&mut self, token: u64) {
        self.list.retain(|w| w.token != token);
    }

    fn is_full(&self) -> bool {
        self.list.len() >= WATCHES_MAX
    }

    /// Whether `peer` (known: not 0) holds its [`WATCH_PEER_SHARE`].
    fn holds_share(&self, peer: u64) -> bool {
        peer != 0 && self.list.iter().filter(|w| w.peer == peer).count() >= WATCH_PEER_SHARE
    }

    fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// Drops the watches whose number is not their socket any more
    /// (`same`): the program closed them, and the kernel took their
    /// sockets out of the set, which says nothing of it. Looked at only
    /// when the list, or the new watch's peer's share, is full: otherwise
    /// such a watch waits for its bound.
    fn prune(&mut self, same: impl Fn(c_int, SocketId) -> bool) {
        self.list.retain(|w| same(w.fd, w.id));
    }

    /// How long the next wait may be: to the nearest bound, at most
    /// [`LOOK_MAX`].
    fn wait(&self, now: Instant) -> Duration {
        self.list
            .iter()
            .map(|w| w.until.saturating_duration_since(now))
            .min()
            .unwrap_or(LOOK_MAX)
            .min(LOOK_MAX)
    }

    /// After a wait that reported `events` (each a token and its epoll
    /// events): the watches past their bound are over unanswered (their
    /// clients may have gone on as TCP), and each reported one is decided
    /// (`same`: whether its number is still its socket, asked of reported
    /// watches only). The rest wait on.
    fn after_wait(
        &mut self,
        events: &[(u64, u32)],
        now: Instant,
        same: impl Fn(c_int, SocketId) -> bool,
    ) -> Decided {
        let mut d = Decided::default();
        self.list.retain(|w| {
            let ev = events.iter().find(|e| e.0 == w.token).map(|e| e.1);
            if now < w.until && ev.is_none() {
                return true;
            }
            if now < w.until && ev.is_some_and(|ev| urgent(ev, || same(w.fd, w.id))) {
                d.answer.push(*w);
            }
            d.over.push(*w);
            false
        });
        d
    }
}

/// Whether a watch's reported events `ev` are its mark to answer: urgent
/// data on the watched socket (`same`, asked only then). Anything else —
/// the peer's bytes or end first, or the number another socket's now —
/// ends the watch unanswered.
fn urgent(ev: u32, same: impl FnOnce() -> bool) -> bool {
    ev & libc::EPOLLPRI as u32 != 0 && same()
}

/// The process's watches and whether its watching thread runs.
#[derive(Default)]
struct Inner {
    running: bool,
    watches: Watches,
}

/// A process's watcher: its epoll set (lifted, close-on-exec; the set's
/// identity beside it) and its watches (made on first use, leaked: a
/// forked child makes its own, [`forget_after_fork`]).
struct Watcher {
    pid: libc::pid_t,
    epfd: c_int,
    set: Option<SocketId>,
    st: Mutex<Inner>,
}

static WATCHER: AtomicPtr<Watcher> = AtomicPtr::new(std::ptr::null_mut());

/// This process's watcher (`pid`: this process's id), or `None` if the
/// kernel refused its epoll set.
fn watcher(pid: libc::pid_t) -> Option<&'static Watcher> {
    let p = WATCHER.load(Ordering::Acquire);
    if !p.is_null() {
        // SAFETY: a published watcher is leaked and never freed.
        let w: &'static Watcher = unsafe { &*p };
        if w.pid == pid {
            return Some(w);
        }
    }
    // libc's (the interposed one records the program's sets).
    // SAFETY: a plain system call making a new descriptor.
    let epfd = fds::lift(unsafe { real::epoll_create1(libc::EPOLL_CLOEXEC) });
    if epfd < 0 {
        return None;
    }
    let fresh = Box::into_raw(Box::new(Watcher {
        pid,
        epfd,
        set: socket_id(epfd),
        st: Mutex::new(Inner::default()),
    }));
    match WATCHER.compare_exchange(p, fresh, Ordering::AcqRel, Ordering::Acquire) {
        // SAFETY: published now, never freed (the one it replaced, another
        // process's, is leaked).
        Ok(_) => Some(unsafe { &*fresh }),
        Err(other) => {
            sys::close(epfd);
            // SAFETY: ours was never shared.
            drop(unsafe { Box::from_raw(fresh) });
            // SAFETY: as above.
            Some(unsafe { &*other })
        }
    }
}

impl Watcher {
    /// Its state, poison ignored (held for list work, the registrations,
    /// their removals and the identity looks, never across a wait or an
    /// answer).
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        sys::lock(&self.st)
    }

    /// Registers `w`; `false` if the kernel refused.
    fn register(&self, w: &Watch) -> bool {
        let mut ev = libc::epoll_event {
            events: EVENTS,
            u64: w.token,
        };
        // SAFETY: the program's socket into our set, with a valid event.
        unsafe { real::epoll_ctl(self.epfd, libc::EPOLL_CTL_ADD, w.fd, &mut ev) == 0 }
    }

    /// Takes the watch `w` out of the set if its number is still its
    /// socket (the set's key is the socket with its number: a removal
    /// through a number given to another socket would remove that one's,
    /// watched too perhaps). Otherwise the kernel took it out with its
    /// socket, or it stays, reported once at most (to no watch), until its
    /// socket closes. Under the lock (`_held`), as every registration: the
    /// number's next socket is registered only after the look and the
    /// removal, never between them.
    fn unregister(&self, _held: &Inner, w: &Watch) {
        if socket_id(w.fd) == Some(w.id) {
            let mut ev = libc::epoll_event { events: 0, u64: 0 };
            // SAFETY: a removal from our set, with a valid event.
            unsafe { real::epoll_ctl(self.epfd, libc::EPOLL_CTL_DEL, w.fd, &mut ev) };
        }
    }
}

/// In a forked child (its fork handler, the only thread): the parent's
/// watches and thread are not the child's, and its lock may be held. The
/// child's copy of the set's descriptor is closed (the set, an open file
/// description, is the parent's still) if its number is still the set: a
/// watcher inherited by a raw `fork` (a grandparent's) may have seen its
/// number closed and given to another file by the program since.
pub(super) fn forget_after_fork() {
    // No answer is under way in the child (the parent's thread is not
    // the child's), and its fork is made.
    close_copied_duplicate();
    WINDOW.store(0, Ordering::Release);
    let old = WATCHER.swap(std::ptr::null_mut(), Ordering::AcqRel);
    if !old.is_null() {
        // SAFETY: a published watcher is leaked and never freed; the child
        // has one thread, this one.
        let old = unsafe { &*old };
        if old.set.is_some() && socket_id(old.epfd) == old.set {
            sys::close(old.epfd);
        }
    }
}

/// The socket `fd` is (device, inode), or `None`.
fn socket_id(fd: c_int) -> Option<SocketId> {
    // SAFETY: an all-zero stat is valid; fstat fills it.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat into a stat on the stack.
    let r = unsafe { libc::fstat(fd, &mut st) };
    (r == 0).then_some((st.st_dev, st.st_ino))
}

/// Whether `fd` is still the socket `id`.
fn same(fd: c_int, id: SocketId) -> bool {
    socket_id(fd) == Some(id)
}

/// Watches the program's accepted connection `fd`, left plain for want of
/// a place, whose client's mark has not come ([`BusyAnswer::NotYet`]), for
/// up to `bound`. `false`: not watched (at [`WATCHES_MAX`], or its peer at
/// [`WATCH_PEER_SHARE`], once the closed ones are dropped, or no set or
/// thread).
pub(super) fn watch(fd: c_int, bound: Duration) -> bool {
    let Some(id) = socket_id(fd) else {
        return false;
    };
    let Some(w) = watcher(sys::getpid()) else {
        return false;
    };
    let peer = sys::peer_addr(fd).map_or(0, |a| {
        PeerBlock::of(a.ip(), sys::local_addr(fd).map(|l| l.ip())).key()
    });
    let start = {
        let mut st = w.lock();
        if st.watches.is_full() || st.watches.holds_share(peer) {
            st.watches.prune(same);
        }
        let Some(token) = st.watches.add(fd, id, peer, Instant::now() + bound) else {
            return false;
        };
        let added = st.watches.list.last().copied();
        if !added.is_some_and(|a| w.register(&a)) {
            st.watches.remove(token);
            return false;
        }
        !std::mem::replace(&mut st.running, true)
    };
    // The thread made outside the lock (a `clone` and the signal masks:
    // the program's accepts do not wait on it). Its watch, registered,
    // stays until its bound if the thread cannot start (a later watch
    // makes one).
    if start && sys::spawn_library_thread("warpsock-busy", move || run(w)).is_err() {
        w.lock().running = false;
        return false;
    }
    true
}

/// The watching thread of `w`: rounds until no watch is left, or a round
/// panics (then `running` is cleared: the next watch makes a thread).
fn run(w: &'static Watcher) {
    sys::no_cancel();
    loop {
        match enter(None, || Some(round(w))) {
            Some(true) => {}
            // None left: `round` cleared `running` under the lock that saw
            // it (a watch added since made a thread of its own).
            Some(false) => return,
            None => {
                w.lock().running = false;
                return;
            }
        }
    }
}

/// One round: a wait on the set, the marks answered, the watches over
/// taken out. `false`: none was left (`running` cleared under the lock
/// that saw it).
fn round(w: &Watcher) -> bool {
    let wait = {
        let mut st = w.lock();
        if st.watches.is_empty() {
            st.running = false;
            return false;
        }
        st.watches.wait(Instant::now())
    };
    // Rounded up: a wait that ends before the nearest bound only makes
    // another round.
    let ms = wait.as_micros().div_ceil(1000).max(1) as c_int;
    let mut events = [libc::epoll_event { events: 0, u64: 0 }; WATCHES_MAX];
    // Raw, with no mask: libc's `epoll_wait` is a cancellation point, and
    // the preload's own would take it for the program's.
    let n = rawsys::epoll_pwait(w.epfd, &mut events, ms);
    if n < 0 {
        // EINTR: not again at once.
        sys::sleep(Duration::from_millis(1));
    }
    let reported: Vec<(u64, u32)> = events[..n.max(0) as usize]
        .iter()
        .map(|e| (e.u64, e.events))
        .collect();
    let answer = {
        let mut st = w.lock();
        let decided = st.watches.after_wait(&reported, Instant::now(), same);
        for o in &decided.over {
            w.unregister(&st, o);
        }
        decided.answer
    };
    for a in &answer {
        answer_on(a.fd, a.id);
    }
    true
}

/// [`WINDOW`]: `answer_on`'s duplicate is being made (its `dup`, then its
/// number's record in [`DUP_FD`]): a fork waits for it.
const DUPLICATING: u32 = 1;
/// [`WINDOW`]: one fork being made (between its prepare handler and its
/// parent's): no duplicate is made until it is.
const FORKING: u32 = 2;

/// The making of the answer's duplicate against forks (`DUPLICATING`,
/// `FORKING`): a fork's child has the duplicate only once [`DUP_FD`] names
/// it, and its fork handler closes it ([`forget_after_fork`]).
/// Forks are counted (in units of [`FORKING`]): of two threads' forks at
/// once, the first's parent handler must not let a duplicate be made while
/// the second is still being made (helper 69's review).
static WINDOW: AtomicU32 = AtomicU32::new(0);

/// The answer's duplicate while it is open (-1: none), and its socket
/// ([`DUP_ID`]; set before the number): what a fork's child closes.
static DUP_FD: AtomicI32 = AtomicI32::new(-1);
/// [`DUP_FD`]'s socket: device, inode.
static DUP_ID: [AtomicU64; 2] = [AtomicU64::new(0), AtomicU64::new(0)];

/// Before a `fork` (the atfork prepare handler): no duplicate is made
/// until [`release_answers_after_fork`], and one being made (a system
/// call and a store) is recorded first (at most [`FORK_WAIT_MAX`]). An
/// answer under way goes on (its duplicate, recorded, is the child's to
/// close): before, a fork waited for the whole answer, and a program's
/// `SO_LINGER` close inside it held the fork (helper 67's review, item
/// 4). Async-signal-safe (a handler's fork): atomics, the clock and
/// `nanosleep`.
pub(in crate::xsock) fn hold_answers_for_fork() {
    if WINDOW.fetch_add(FORKING, Ordering::AcqRel) & DUPLICATING == 0 {
        return;
    }
    let deadline = Instant::now() + FORK_WAIT_MAX;
    while WINDOW.load(Ordering::Acquire) & DUPLICATING != 0 && Instant::now() < deadline {
        sys::sleep(Duration::from_micros(100));
    }
}

/// After a `fork`, in the parent: duplicates are made again. (The child
/// starts afresh: [`forget_after_fork`].)
pub(in crate::xsock) fn release_answers_after_fork() {
    WINDOW.fetch_sub(FORKING, Ordering::AcqRel);
}

/// The answer's duplicate of the program's connection, recorded in
/// [`DUP_FD`] while open; closed when dropped (an unwinding panic's drop
/// too), then no longer recorded. (A fork between the close and the
/// record's end gives the child a number that is not the socket, or not
/// open: its handler's look at the socket leaves it.)
struct Dup(c_int);

impl Dup {
    /// Duplicates `fd`, the socket `id`, once no fork is being made
    /// (waiting for one at most [`FORK_WAIT_MAX`]: `None`, the mark is not
    /// answered and its client falls back), and records the duplicate
    /// before a fork may copy it.
    fn open(fd: c_int, id: SocketId) -> Option<Self> {
        let deadline = Instant::now() + FORK_WAIT_MAX;
        while WINDOW
            .compare_exchange(0, DUPLICATING, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            if Instant::now() >= deadline {
                return None;
            }
            sys::sleep(Duration::from_micros(100));
        }
        // Above the program's numbers, as the library's other descriptors:
        // the program's next socket or accept keeps the lowest free number.
        let dup = fds::dup_lifted(fd);
        if dup >= 0 {
            DUP_ID[0].store(id.0, Ordering::Relaxed);
            DUP_ID[1].store(id.1, Ordering::Relaxed);
            DUP_FD.store(dup, Ordering::Release);
        }
        WINDOW.fetch_and(!DUPLICATING, Ordering::AcqRel);
        (dup >= 0).then_some(Self(dup))
    }
}

impl Drop for Dup {
    fn drop(&mut self) {
        sys::close(self.0);
        let _ = DUP_FD.compare_exchange(self.0, -1, Ordering::AcqRel, Ordering::Relaxed);
    }
}

/// In a fork's child: the answer's duplicate the fork copied, if any, is
/// closed (the parent's thread that would close it is not the child's). A
/// child given it held the connection open after the program's close,
/// under a lifted number it never closes (helper 64's review, item 6).
/// Only while the number is still that socket.
fn close_copied_duplicate() {
    let dup = DUP_FD.swap(-1, Ordering::AcqRel);
    let id = (
        DUP_ID[0].load(Ordering::Relaxed),
        DUP_ID[1].load(Ordering::Relaxed),
    );
    if dup >= 0 && same(dup, id) {
        sys::close(dup);
    }
}

/// A test's pause while the answer's duplicate is open (taken: once).
#[cfg(test)]
type DupHook = Box<dyn FnOnce() + Send>;
#[cfg(test)]
static DUP_HOOK: Mutex<Option<DupHook>> = Mutex::new(None);

/// Answers the watched socket `id` at the program's number `fd` on a
/// duplicate of it, if the duplicate is still that socket (the program may
/// have closed the number and reused it since the wait's look). (A
/// program's close with `SO_LINGER` in those few system calls lingers
/// here, at the duplicate's close, not in the program's call.)
fn answer_on(fd: c_int, id: SocketId) {
    let Some(dup) = Dup::open(fd, id) else {
        return;
    };
    #[cfg(test)]
    {
        let pause = sys::lock(&DUP_HOOK).take();
        if let Some(pause) = pause {
            pause();
        }
    }
    if same(dup.0, id) {
        // SAFETY: our duplicate, open until `dup` drops.
        let sock = unsafe { BorrowedFd::borrow_raw(dup.0) };
        if matches!(answer_busy(sock), Ok(BusyAnswer::Sent)) {
            BUSY_ANSWERED.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Whether this process watches the socket `id` (under any number).
#[cfg(test)]
fn watched(id: SocketId) -> bool {
    watcher(sys::getpid()).is_some_and(|w| w.lock().watches.list.iter().any(|x| x.id == id))
}

#[cfg(test)]
mod tests;
