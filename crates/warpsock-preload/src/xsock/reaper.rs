//! The reaper: one thread per process that finishes every DDP socket's
//! close in the background ([`hand_over`], from the socket's last drop:
//! `close(2)` returns at once, as TCP's). Each close is the orderly one —
//! every byte sent, then the end of stream, then the linger for the peer's
//! FIN ([`XSocket::linger_after_close`] says why) — made in non-blocking
//! steps ([`XSocket::close_step`]): the thread waits on an epoll set of
//! the engines' sockets of the closes it holds (level-triggered, each
//! added as its close begins, changed as a step changes what it waits
//! for, removed as it drops) and steps each that is ready, or due (its
//! phase's deadline; all of them once per [`SWEEP`]). A slow or silent
//! peer holds up none of the others' closes, and a wake makes no system
//! call per close held (it rebuilt and polled all of them, up to 257:
//! review r25-a item 14).
//!
//! A thread per close (before) made a server that closes many connections
//! whose peers are slow to close hold up to `2 × WARPSOCK_LINGER_MS` of
//! threads, unbounded: a peer that never sends its FIN kept its thread for
//! the whole linger. Here the closes held are bounded too
//! (`WARPSOCK_DDP_CLOSING_MAX`, [`config::Config::closing_max`]): past the
//! bound the oldest lingering close is cut
//! — its engine's socket closed at once, plainly (a FIN, no reset: our
//! FIN went already, so the kernel's close only ends the linger early, as
//! its bound would; the peer loses nothing it has not read unless it
//! sends more, which then meets a reset — what a reset now would do to it
//! for sure). With none lingering, the oldest still sending is given up
//! as at its bound: reset if sends were still queued (the peer must not
//! read a clean end after a short stream), else disconnected. Counted:
//! `ddp_closes_cut`.
//!
//! A close whose socket holds received bytes no read took is a reset
//! instead, as Linux's (`XSocket::unread`, looked at as the reaper takes
//! the close: a signal handler's `close` must not wait for the socket's
//! lock).
//!
//! The exit waits for the closes still sending (`linger::CLOSING`, counted
//! from the hand-over to the end of [`Phase::Sending`]) while bytes leave,
//! then for every close held ([`HELD`]: their linger for the peers' FINs)
//! up to one `WARPSOCK_LINGER_MS` (`census::ExitCloses::linger`). A
//! forked child starts a reaper of its own ([`forget_after_fork`]): the
//! parent's thread is not there, and the parent's closes are the parent's.

mod fd_table;

use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use libc::c_int;
use warpsock_engine::fds;
use warpsock_xsock::io::{Begun, Closing, Phase, XSocket};

use super::config;
use super::linger::{spawn_reaper, CLOSING};
use crate::shim::guard::enter;
use crate::shim::{real, sys};

/// Every close held is stepped at least this often, ready or not: a
/// safety net (as the reactor's sweep), not relied on — input, output
/// space and the deadlines each wake the thread.
pub(super) const SWEEP: Duration = Duration::from_secs(1);

/// Closes cut short by the bound on the closes held
/// (`ddp_closes_cut` of `WARPSOCK_STATS`).
pub(super) static CUT: AtomicU64 = AtomicU64::new(0);

/// Closes the reaper holds, from the hand-over until done or cut (their
/// linger for the peer's FIN included): an exit waits for them too, up to
/// one `WARPSOCK_LINGER_MS` (`census::ExitCloses`) — the process's end
/// closes their engines' sockets, and a peer still reading our last
/// messages would meet a reset (`XSocket::linger_after_close`).
pub(super) static HELD: AtomicUsize = AtomicUsize::new(0);

/// An `_exit`'s looks at the closes held ([`exit_look`]): the last look
/// asked (`ASKED`), the last answered (`LOOKED`), the answer (`UNACKED`),
/// and whether the look is to reset the closes still sending
/// (`RESET_SENDING`).
static ASKED: AtomicU64 = AtomicU64::new(0);
static LOOKED: AtomicU64 = AtomicU64::new(0);
static UNACKED: AtomicUsize = AtomicUsize::new(0);
static RESET_SENDING: AtomicBool = AtomicBool::new(false);

/// How long [`exit_look`] waits for the reaper's answer: a round steps
/// every close held, each a bounded engine round.
const LOOK_WAIT: Duration = Duration::from_secs(1);

/// For `_exit` when the reaper did not answer its look ([`exit_look`]
/// `None`: its thread stuck, in an allocation behind an arena lock the
/// interrupted program holds, or a slow step): the closes it holds that
/// still send are reset by this thread (`SO_LINGER` {1, 0}, set on their
/// engines' sockets, which the process's end then closes with an RST), as
/// the reaper's reset look would. Left alone, the process's end closed
/// them with a FIN, and their peers, whose library reads a FIN without an
/// end-of-stream message as the end, could read a clean end after a short
/// stream (review r28-c item 7). Each place is claimed for its check and
/// reset (`fd_table`'s doc): the reaper, slow rather than stuck, forgets a
/// close before it closes its socket, and its forget waits for a reset
/// under way, so the number cannot name another socket (another thread's
/// `accept`) between the inode check and the `setsockopt` (review r28-e
/// item 1). Returns how many were reset.
pub(super) fn reset_sending_unanswered() -> usize {
    let p = REAPER.load(Ordering::Acquire);
    if p.is_null() {
        return 0;
    }
    // SAFETY: a published reaper is leaked and never freed.
    unsafe { &*p }.sending.reset()
}

/// For `_exit` (`DdpKind::exit_flush`, from outside any call of the
/// library): the reaper's thread steps every close it holds now and
/// answers how many are not yet acknowledged — still sending, or their
/// bytes and end of stream not all acknowledged by the peer's kernel
/// (`sock::close::acknowledged`, the lingering close's test). With
/// `reset`, it first resets those still sending (an RST: the peer reads
/// `ECONNRESET`, not a clean end after a short stream) and counts them
/// acknowledged. `None`: no reaper in this process (none started, or a
/// forked child's), or no answer within [`LOOK_WAIT`].
///
/// `_exit` closes nothing, but the closes the program made before are the
/// reaper's, and the process's end closes their engines' sockets: bytes
/// the library still held were never sent, and bytes in the kernel's
/// queue met the reset the peer's credits then draw from the closed
/// socket (issue 12: `write; close; _exit(0)` left the reader 2 MiB of 4,
/// then `ECONNRESET`). Once acknowledged, the peer has every byte and the
/// end of stream, after which it returns no credit (`Stream::credit_due`).
pub(super) fn exit_look(reset: bool) -> Option<usize> {
    let p = REAPER.load(Ordering::Acquire);
    if p.is_null() {
        return None;
    }
    // SAFETY: a published reaper is leaked and never freed.
    let r: &'static Reaper = unsafe { &*p };
    if r.dead.load(Ordering::Acquire) {
        return None;
    }
    if reset {
        RESET_SENDING.store(true, Ordering::Release);
    }
    let n = ASKED.fetch_add(1, Ordering::AcqRel) + 1;
    r.wake();
    let end = Instant::now() + LOOK_WAIT;
    loop {
        if LOOKED.load(Ordering::Acquire) >= n {
            return Some(UNACKED.load(Ordering::Acquire));
        }
        if Instant::now() >= end {
            return None;
        }
        sys::sleep(Duration::from_micros(200));
    }
}

/// A close counted in [`CLOSING`] while this lives, or in [`HELD`] once
/// its sending ended ([`Self::sent`]): an orderly close is counted from
/// the program's close (`DdpSock::release`, [`Self::release`]), before
/// its socket leaves the census, and the count goes with the close
/// through its last drop, its wait (`SO_LINGER` N: `sock/close.rs`) and
/// its hand-over ([`hand_over`]) — never a moment uncounted between the
/// two (review r27-c item 2: uncounted until the hand-over, an exit in
/// between — while another thread's call held the last reference, or
/// while the first hand-over started the reaper — ignored its bytes).
pub(super) struct Counted {
    held: bool,
}

impl Counted {
    pub(super) fn new() -> Self {
        CLOSING.fetch_add(1, Ordering::AcqRel);
        Self { held: false }
    }

    /// A count in [`CLOSING`] made at the program's close and left there
    /// ([`Self::keep`]) until the socket's last drop, which takes it back
    /// with [`Self::adopt`].
    pub(super) fn release() {
        Self::new().keep();
    }

    /// The count [`Self::release`] left.
    pub(super) fn adopt() -> Self {
        Self { held: false }
    }

    /// The close's sending ended: its count moves to [`HELD`] (first
    /// there, then out of [`CLOSING`]: always in one), as the reaper's
    /// closes leave [`CLOSING`] at that point (`Held::uncount`). An exit
    /// no longer waits for its bytes, only, one bound at most, for its
    /// peer's FIN (review r27-c item 3).
    pub(super) fn sent(&mut self) {
        if !self.held {
            HELD.fetch_add(1, Ordering::AcqRel);
            sub(&CLOSING);
            self.held = true;
        }
    }

    /// Whether it is in [`HELD`] ([`Self::sent`]), not [`CLOSING`].
    pub(super) fn is_held(&self) -> bool {
        self.held
    }

    /// The count goes on without this: the caller's (a [`Held`]'s
    /// `counted`, or its [`HELD`] count) from now on.
    fn keep(self) {
        std::mem::forget(self);
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        sub(if self.held { &HELD } else { &CLOSING });
    }
}

/// One less in `n`, never below 0: a forked child's counts start again
/// from 0 (`linger::forget_closing_after_fork`, [`forget_after_fork`]).
fn sub(n: &AtomicUsize) {
    let _ = n.fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| {
        Some(v.saturating_sub(1))
    });
}

/// A close handed over: its socket, and the close once begun (`None`: an
/// abortive close, reset already, whose socket is only dropped).
struct Held {
    x: XSocket,
    c: Option<Closing>,
    /// Still counted in [`CLOSING`] (until its sending phase ends).
    counted: bool,
    /// Its count in [`HELD`] was made by the hand-over (the close's own,
    /// `Counted::sent`'s, was not: [`forget_foreign`] gives back only
    /// this one).
    added: bool,
    /// Its place in the reaper's table of closes still sending
    /// ([`Reaper::sending`], or one grown after it), noted at the
    /// hand-over while `counted`, the table with it: its `forget` takes
    /// the place, no scan.
    noted: Option<(&'static fd_table::FdTable, usize)>,
    /// The process that switched its socket (`DdpSock::pid`): a close
    /// handed over in another — a child forked between its `close`'s
    /// look at that (`sock/close.rs`'s `forked_copy`) and the hand-over,
    /// whose first hand-over started a reaper of its own — is the
    /// parent's, on the engine socket the two share: the reaper forgets
    /// it ([`forget_foreign`]; review r29-a item 5).
    pid: i32,
    /// Its token in the reaper's epoll set: the closes held are in the
    /// order of their tokens (handed over, oldest first).
    key: u64,
    /// To be stepped this round (ready, or new).
    due: bool,
    /// Its engine's socket's bytes acknowledged at the last exit's look
    /// (`sock::close::exit_acknowledged`).
    acked: Option<u64>,
    /// The epoll set it is in (`epfd`) and the events it is there for.
    watched: Option<(c_int, u32)>,
}

impl Held {
    fn phase(&self) -> Phase {
        self.c.as_ref().map_or(Phase::Done, Closing::phase)
    }

    /// Whether its bytes and end of stream are out and acknowledged by the
    /// peer's kernel, or it is over, or its sending gave up (its end of
    /// stream behind bytes a peer not reading never takes, or reset:
    /// nothing `_exit`'s wait can bring; review r28-c item 6)
    /// ([`exit_look`]).
    fn acknowledged(&mut self) -> bool {
        let fd = self.x.tcp_fd();
        self.c.as_ref().is_none_or(|c| {
            c.phase() == Phase::Done
                || c.all_left() == Some(false)
                || super::sock::close::exit_acknowledged(c, fd, &mut self.acked)
        })
    }

    /// Its bytes are out of the exit's concern from now on.
    fn uncount(&mut self) {
        if std::mem::take(&mut self.counted) {
            if let Some((table, i)) = self.noted.take() {
                // Before its socket closes (`fd_table`'s claims).
                table.forget(i);
            }
            sub(&CLOSING);
        }
    }
}

/// A close leaves the exit's counts as it goes, however it goes — done,
/// cut, or dropped by a panic's unwind or a reaper that could not start
/// (review r25-a items 6, 7: a count left behind held every exit for its
/// whole bound). And the reaper's epoll set, before its socket closes: an
/// entry outlives the descriptor while another refers to the socket (a
/// forked child's copy), and, level-triggered, would wake the reaper for
/// good with a token no close has.
impl Drop for Held {
    fn drop(&mut self) {
        if let Some((epfd, _)) = self.watched.take() {
            let mut ev = libc::epoll_event { events: 0, u64: 0 };
            // SAFETY: removing our socket from our epoll set.
            unsafe { real::epoll_ctl(epfd, libc::EPOLL_CTL_DEL, self.x.tcp_fd(), &mut ev) };
        }
        self.uncount();
        sub(&HELD);
    }
}

/// A close handed over in a process other than the one that switched
/// its socket ([`Held::pid`]): a forked child's copy of its parent's
/// close, on the engine socket the parent still uses. Forgotten, as
/// `sock/close.rs`'s `forget_forked_copy` forgets one: never stepped (a
/// step of the child's read the parent's credit returns and wrote frames
/// into its stream), never reset, never dropped (`Qp::drop` would send an
/// end of stream); its memory leaked, the child's copies of its
/// descriptors left open. Its place in this process's table is freed (an
/// unanswered `_exit` here must not reset the parent's socket), and the
/// hand-over's count in [`HELD`] given back if the hand-over made it
/// ([`Held::added`]; saturating: made in this process, or a parent's the
/// fork reset to 0), not a close's own (`Counted::sent`'s, the
/// parent's; review r29-c item 5); its [`CLOSING`] count is
/// the parent's, made before the fork (whose handler set this process's
/// to 0), and left.
fn forget_foreign(mut h: Held) {
    if let Some((table, i)) = h.noted.take() {
        table.forget(i);
    }
    if h.added {
        sub(&HELD);
    }
    std::mem::forget(h);
}

/// The epoll events of `poll` events `ev` (those [`XSocket::close_events`]
/// asks for).
fn epoll_events(ev: i16) -> u32 {
    let mut e = 0;
    if ev & libc::POLLIN != 0 {
        e |= libc::EPOLLIN as u32;
    }
    if ev & libc::POLLOUT != 0 {
        e |= libc::EPOLLOUT as u32;
    }
    e
}

/// The reaper's eventfd's token in its epoll set (the closes' count up
/// from 0), "wsreaper": tests/c/ddpreaper.c finds the set by it in
/// `/proc/self/fdinfo` (the engines' sets use all ones).
const WAKE_TOKEN: u64 = u64::from_be_bytes(*b"wsreaper");

/// The closes handed over and not yet taken by the reaper's thread: a
/// stack with no lock, as a hand-over may come from a signal handler's
/// `close` that interrupted another hand-over on the same thread (a lock
/// held there would never be let go).
struct Inbox<T> {
    head: AtomicPtr<Node<T>>,
}

struct Node<T> {
    item: T,
    next: *mut Self,
}

impl<T> Inbox<T> {
    const fn new() -> Self {
        Self {
            head: AtomicPtr::new(std::ptr::null_mut()),
        }
    }

    fn push(&self, item: T) {
        let node = Box::into_raw(Box::new(Node {
            item,
            next: std::ptr::null_mut(),
        }));
        let mut head = self.head.load(Ordering::Acquire);
        loop {
            // SAFETY: `node` is ours until the exchange publishes it.
            unsafe { (*node).next = head };
            match self
                .head
                .compare_exchange_weak(head, node, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return,
                Err(h) => head = h,
            }
        }
    }

    /// Every item pushed so far, oldest first.
    fn take(&self) -> Vec<T> {
        let mut p = self.head.swap(std::ptr::null_mut(), Ordering::AcqRel);
        let mut out = Vec::new();
        while !p.is_null() {
            // SAFETY: the swap made the whole list ours; each node came
            // from `Box::into_raw` in `push` and is taken once.
            let n = unsafe { Box::from_raw(p) };
            p = n.next;
            out.push(n.item);
        }
        out.reverse();
        out
    }
}

/// Which close a reaper over its bound cuts, of those held oldest first:
/// the oldest lingering one, else the oldest.
fn victim(mut phases: impl Iterator<Item = Phase>) -> usize {
    phases.position(|p| p == Phase::Lingering).unwrap_or(0)
}

/// The process's reaper: its inbox, the eventfd that wakes its thread,
/// and the epoll set its thread waits on.
struct Reaper {
    inbox: Inbox<Held>,
    wakefd: c_int,
    epfd: c_int,
    /// Its thread could not start: closes handed to it are dropped (their
    /// engines' sockets closed at once, as a closer thread that could not
    /// start left them), never left in the inbox for no one.
    dead: AtomicBool,
    /// The engines' sockets of the closes held that still send (a
    /// [`Held`] counted in [`CLOSING`]): what an `_exit` whose reaper does
    /// not answer resets itself ([`reset_sending_unanswered`]). As many
    /// places as the closes held (`WARPSOCK_DDP_CLOSING_MAX`, up to
    /// `fd_table::FIRST_MAX`; grown past them as closes need them: a
    /// burst of hand-overs the reaper has not taken yet), allocated here,
    /// before the reaper is published, and leaked with it: a bound
    /// clamped to a fixed table's 256 places gave up (or reset) every
    /// close past them in normal running, a server's closes to slow
    /// clients among them (review r29-a item 1). A hand-over allocates
    /// anyway (its inbox node; the first one this reaper and its thread).
    sending: fd_table::FdTable,
}

static REAPER: AtomicPtr<Reaper> = AtomicPtr::new(std::ptr::null_mut());

/// In a forked child (its fork handler, the only thread): the parent's
/// reaper is not the child's — its thread does not exist here, and the
/// closes it holds are the parent's connections. Its memory is leaked (as
/// before, a closer thread's socket was); the child's first close starts
/// a reaper of its own.
///
/// Its eventfd and epoll descriptors, inherited, are closed here: kept
/// (both are only close-on-exec) they were 2 dead descriptors per fork
/// generation until an exec, counted against `RLIMIT_NOFILE` (review
/// r26-b item 6). Closing the child's copies touches nothing of the
/// parent's: each is the same open file description as the parent's,
/// and a close drops only the child's reference to it (`fput`; the
/// description lives on while the parent holds its own descriptor). The
/// epoll set is the description's, not the descriptor's, so the parent's
/// registrations stay; the engines' sockets in it are the child's copies
/// of the parent's, which the child's close of the epoll descriptor does
/// not close either.
pub(crate) fn forget_after_fork() {
    let old = REAPER.swap(std::ptr::null_mut(), Ordering::AcqRel);
    if !old.is_null() {
        // SAFETY: a published reaper is leaked and never freed; the child
        // has one thread, this one, so nobody else uses it.
        let r = unsafe { &*old };
        sys::close(r.wakefd);
        sys::close(r.epfd);
    }
    HELD.store(0, Ordering::Release);
    // A look the parent's `_exit` asked to reset with: never the child's
    // (its reaper's first look, a plain one, reset the child's closes
    // still sending; review r29-a item 5).
    RESET_SENDING.store(false, Ordering::Release);
    if !old.is_null() {
        // The parent's closes (their sockets shared): never the child's
        // to reset (the table goes with the parent's reaper, unpublished
        // here; cleared all the same).
        // SAFETY: as above.
        unsafe { &*old }.sending.clear();
    }
}

/// A reaper for `max` closes held (its table of closes still sending as
/// many places: [`Reaper::sending`]), its thread not started; `None` if
/// the kernel refused the eventfd or epoll set, or the table's memory
/// could not be had.
fn new_reaper(max: usize) -> Option<Reaper> {
    // SAFETY: plain syscalls creating new descriptors.
    let (wakefd, epfd) = unsafe {
        (
            fds::lift(libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK)),
            // libc's (the interposed one records the program's sets).
            fds::lift(real::epoll_create1(libc::EPOLL_CLOEXEC)),
        )
    };
    let mut ev = libc::epoll_event {
        events: libc::EPOLLIN as u32,
        u64: WAKE_TOKEN,
    };
    let added = wakefd >= 0
        && epfd >= 0
        // SAFETY: our eventfd into our epoll set, with a valid event.
        && unsafe { real::epoll_ctl(epfd, libc::EPOLL_CTL_ADD, wakefd, &mut ev) } == 0;
    if !added {
        sys::close(wakefd);
        sys::close(epfd);
        return None;
    }
    let Some(sending) = fd_table::FdTable::new(max.min(fd_table::FIRST_MAX)) else {
        sys::close(wakefd);
        sys::close(epfd);
        return None;
    };
    Some(Reaper {
        inbox: Inbox::new(),
        wakefd,
        epfd,
        dead: AtomicBool::new(false),
        sending,
    })
}

/// The process's reaper, started (with its thread) on first use; `None`
/// if the kernel refused the eventfd or the thread.
fn get() -> Option<&'static Reaper> {
    let p = REAPER.load(Ordering::Acquire);
    if !p.is_null() {
        // SAFETY: a published reaper is leaked and never freed.
        return Some(unsafe { &*p });
    }
    let cfg = config::get();
    let raw = Box::into_raw(Box::new(new_reaper(cfg.closing_max)?));
    match REAPER.compare_exchange(
        std::ptr::null_mut(),
        raw,
        Ordering::AcqRel,
        Ordering::Acquire,
    ) {
        Ok(_) => {
            // SAFETY: `raw` is published now and lives for the process.
            let r: &'static Reaper = unsafe { &*raw };
            let (linger, max) = (cfg.linger, cfg.closing_max);
            // With every asynchronous signal blocked (`spawn_reaper`), as
            // the closer threads had.
            if spawn_reaper(move || r.run(linger, max)).is_err() {
                // Left published, marked dead: another thread may have
                // pushed a close since the publish (review r25-a item 6),
                // and every hand-over from now on drops its socket.
                r.dead.store(true, Ordering::Release);
                r.drop_inbox();
                return None;
            }
            Some(r)
        }
        Err(other) => {
            // SAFETY: we lost the race; `raw` was never shared.
            let mine = unsafe { Box::from_raw(raw) };
            sys::close(mine.wakefd);
            sys::close(mine.epfd);
            // SAFETY: the winner's reaper is leaked and never freed.
            Some(unsafe { &*other })
        }
    }
}

/// Hands socket `x`, whose program descriptor is closed, to the reaper,
/// which finishes its close: orderly, or only its drop if `abortive` (the
/// caller reset it). `begun`: the orderly close the caller began and
/// stepped already (`SO_LINGER` N's wait in `close`: `sock/close.rs`),
/// which the reaper steps on from where it stands — no look at unread
/// bytes then (the caller's), no second begin. `counted`: the close's
/// count since the program's close ([`Counted`]), which the reaper
/// takes over (the close stays counted while the reaper starts; given
/// back if none can). Returns at once. Counted in [`CLOSING`] until its
/// bytes and end of stream left (or were given up on), and in [`HELD`]
/// until done. Without a reaper (no thread to be had) the socket is
/// dropped now: its engine's socket closes, as a closer thread that
/// could not start left it. `pid`: the process that switched the socket
/// (`DdpSock::pid`, [`Held::pid`]): the reaper forgets a close handed
/// over in another ([`forget_foreign`]).
pub(super) fn hand_over(
    x: XSocket,
    abortive: bool,
    begun: Option<Closing>,
    counted: Option<Counted>,
    pid: i32,
) {
    // A close of the parent's handed over in a child made by `fork` (a
    // signal handler's, between the close's look and here: its handlers
    // left the census's owner none or the child's own): forgotten at
    // once, as [`forget_foreign`] forgets one, with no system call — no
    // reaper started for it, no place noted in the child's table (an
    // unanswered `_exit` there set `SO_LINGER` {1, 0} on the engine
    // socket the two share, and the parent's orderly close ended in a
    // reset), no count taken: the close's count is the parent's, made
    // before the fork (review r29-c item 4). A child of `_Fork` (no
    // handler: the owner is still the parent's) is told by its reaper's
    // pid check.
    if super::sock::close::forked_away(pid) {
        std::mem::forget(x);
        // (`begun`, a `Closing`, has no drop of its own: its socket is `x`.)
        let _ = begun;
        std::mem::forget(counted);
        return;
    }
    hand_over_to_reaper(x, abortive, begun, counted, pid);
}

/// [`hand_over`] past its forked child's check: to the reaper (whose
/// thread forgets a close of another process's: [`forget_foreign`]).
fn hand_over_to_reaper(
    x: XSocket,
    abortive: bool,
    begun: Option<Closing>,
    counted: Option<Counted>,
    pid: i32,
) {
    #[cfg(feature = "test-hooks")]
    if !abortive {
        handover_gap();
    }
    // (Without a reaper the close's count goes with `counted`'s drop.)
    let Some(r) = get() else {
        drop(x);
        return;
    };
    let sending = match &begun {
        Some(c) => c.phase() == Phase::Sending,
        None => !abortive,
    };
    let k = counted.unwrap_or_else(Counted::new);
    let added = !k.held;
    let counted = if k.held {
        // In HELD already (its sending ended in the caller's wait): the
        // Held's drop gives it back.
        k.keep();
        false
    } else {
        // Held first, then the count kept or let go: the close is in one
        // count or the other all along.
        HELD.fetch_add(1, Ordering::AcqRel);
        if sending {
            k.keep();
        } else {
            drop(k);
        }
        sending
    };
    // Every place taken (a burst of hand-overs the reaper has not taken
    // yet): the table grows (`fd_table::FdTable::note`).
    let noted = counted.then(|| r.sending.note(x.tcp_fd()));
    r.inbox.push(Held {
        x,
        c: begun,
        counted,
        added,
        noted,
        pid,
        key: 0,
        due: true,
        acked: None,
        watched: None,
    });
    if r.dead.load(Ordering::Acquire) {
        // Its thread could not start (marked after this push's look at
        // it, or before): drops what it holds, this close included.
        r.drop_inbox();
    } else {
        r.wake();
    }
}

/// `WARPSOCK_TEST_HANDOVER_GAP_FD`: an orderly close's hand-over (a
/// lingering one's, its `close` waited, or an ordinary one's) writes a byte (`g`) to this descriptor, then waits 1 s
/// before it goes on, as a reaper slow to start, then writes a second
/// (`h`): an exit another thread makes meanwhile must still count the
/// close, the process alive until then (`tests/ddp_linger.rs`'s gap
/// case).
#[cfg(feature = "test-hooks")]
fn handover_gap() {
    if let Some(fd) = config::get().hooks.handover_gap_fd {
        // SAFETY: one byte from the stack to the test's descriptor.
        unsafe { sys::write_raw(fd, b"g".as_ptr().cast(), 1) };
        sys::sleep(Duration::from_secs(1));
        // SAFETY: as above.
        unsafe { sys::write_raw(fd, b"h".as_ptr().cast(), 1) };
    }
}

impl Reaper {
    /// A dead reaper's closes: dropped, each leaving the exit's counts
    /// (one of another process's forgotten: [`forget_foreign`]).
    fn drop_inbox(&self) {
        // SAFETY: getpid has no preconditions.
        let me = unsafe { libc::getpid() };
        for h in self.inbox.take() {
            if h.pid == me {
                drop(h);
            } else {
                forget_foreign(h);
            }
        }
    }

    fn wake(&self) {
        let one: u64 = 1;
        // Raw: a hand-over comes from the program's close (or dup2), where
        // libc's `write`, a cancellation point, acted on a pending cancel
        // inside the library (the process aborted: cancel.c `dup2`).
        // SAFETY: writing 8 bytes to our eventfd.
        unsafe { sys::write_raw(self.wakefd, (&one as *const u64).cast(), 8) };
    }

    /// Puts `h` in the epoll set for what its close waits for now
    /// ([`XSocket::close_events`]; errors and hang-ups whatever it asks),
    /// or changes its entry to it. If the kernel refuses, its deadline
    /// and the sweep step it.
    fn watch(&self, h: &mut Held) {
        let want = epoll_events(h.x.close_events());
        let op = match h.watched {
            Some((_, ev)) if ev == want => return,
            Some(_) => libc::EPOLL_CTL_MOD,
            None => libc::EPOLL_CTL_ADD,
        };
        let mut ev = libc::epoll_event {
            events: want,
            u64: h.key,
        };
        // SAFETY: our socket into our epoll set, with a valid event.
        if unsafe { real::epoll_ctl(self.epfd, op, h.x.tcp_fd(), &mut ev) } == 0 {
            h.watched = Some((self.epfd, want));
        }
    }

    /// The thread: takes the closes handed over, keeps their number to
    /// `max`, steps those that are ready or due, drops those done, and
    /// waits for the next event. Every round runs under the guard (its
    /// calls are the library's) and its panic boundary, each step under a
    /// boundary of its own too: a step that panicked drops its socket.
    fn run(&'static self, linger: Duration, max: usize) {
        // A library thread for good: a program that cancels every thread
        // it finds must not unwind through it (`sys::no_cancel`).
        sys::no_cancel();
        // The process this reaper runs in, for good (a forked child's
        // first hand-over starts its own: `forget_after_fork`).
        // SAFETY: getpid has no preconditions.
        let me = unsafe { libc::getpid() };
        let mut held: VecDeque<Held> = VecDeque::new();
        let mut next_key: u64 = 0;
        let mut events = vec![libc::epoll_event { events: 0, u64: 0 }; 64];
        let mut swept = Instant::now();
        loop {
            enter((), || {
                let now = Instant::now();
                let new = self.inbox.take();
                for mut h in new {
                    if h.pid != me {
                        // Another process's close (a forked child's copy
                        // of its parent's): never stepped nor dropped.
                        forget_foreign(h);
                        continue;
                    }
                    if h.c.is_some() {
                        // Begun by its `close` (`SO_LINGER` N): stepped
                        // on below.
                    } else if h.counted {
                        match h.x.close_begin_or_reset(linger, now) {
                            Begun::Orderly(c) => h.c = Some(c),
                            // Received bytes left unread: a reset, as
                            // Linux's close (`XSocket::unread`), its
                            // socket dropped.
                            Begun::Reset => h.uncount(),
                        }
                    }
                    h.key = next_key;
                    next_key += 1;
                    h.due = true;
                    held.push_back(h);
                }
                while held.len() > max.max(1) {
                    let i = victim(held.iter().map(Held::phase));
                    let mut h = held.remove(i).expect("an index of the queue");
                    if let Some(c) = h.c.as_mut() {
                        h.x.close_cut(c);
                        CUT.fetch_add(1, Ordering::Relaxed);
                    }
                    h.uncount();
                }
                // An `_exit`'s look: every close stepped now, then the answer.
                let asked = ASKED.load(Ordering::Acquire);
                let look = asked != LOOKED.load(Ordering::Acquire);
                if look && RESET_SENDING.swap(false, Ordering::AcqRel) {
                    for h in held.iter_mut().filter(|h| h.phase() == Phase::Sending) {
                        // Given up (the `_exit`'s bound passed): the peer
                        // reads a reset, never a clean end after a short
                        // stream. Over: dropped below.
                        h.x.reset_now();
                        h.c = None;
                        h.uncount();
                    }
                }
                let sweep = look || now >= swept + SWEEP;
                if sweep {
                    swept = now;
                }
                let mut i = 0;
                while i < held.len() {
                    let h = &mut held[i];
                    let step = h.due || sweep || h.c.as_ref().is_some_and(|c| c.deadline() <= now);
                    let phase = if !step {
                        h.phase()
                    } else if let Some(c) = h.c.as_mut() {
                        // A panic in the step: over (the socket dropped),
                        // not again at every round.
                        let x = &h.x;
                        catch_unwind(AssertUnwindSafe(|| x.close_step(c, now)))
                            .unwrap_or(Phase::Done)
                    } else {
                        Phase::Done
                    };
                    if phase != Phase::Sending {
                        h.uncount();
                    }
                    if phase == Phase::Done {
                        let mut h = held.remove(i).expect("an index of the queue");
                        h.uncount();
                        // The engine's socket leaves the epoll set and
                        // closes as it drops (and the close leaves the
                        // exit's counts).
                        drop(h);
                        continue;
                    }
                    h.due = false;
                    if step {
                        // What it waits for may have changed with the step.
                        self.watch(h);
                    }
                    i += 1;
                }
                if look {
                    let n = held
                        .iter_mut()
                        .map(|h| !h.acknowledged())
                        .filter(|&u| u)
                        .count();
                    UNACKED.store(n, Ordering::Release);
                    LOOKED.store(asked, Ordering::Release);
                }
                let timeout = held
                    .iter()
                    .filter_map(|h| h.c.as_ref().map(Closing::deadline))
                    .chain([swept + SWEEP])
                    .min()
                    .filter(|_| !held.is_empty())
                    .map(|t| t.saturating_duration_since(Instant::now()));
                // Rounded up: a wait rounded down woke before the
                // deadline, and stepped nothing, in a loop.
                let ms = timeout.map_or(-1, |d| {
                    d.as_micros().div_ceil(1000).min(c_int::MAX as u128) as c_int
                });
                let n = self.wait(&mut events, ms);
                if n < 0 && sys::errno() != libc::EINTR {
                    // Not expected: no spin meanwhile.
                    sys::sleep(Duration::from_millis(1));
                }
                if n <= 0 {
                    return;
                }
                for ev in &events[..n as usize] {
                    let key = ev.u64;
                    if key == WAKE_TOKEN {
                        let mut v: u64 = 0;
                        // SAFETY: reading 8 bytes from our eventfd into `v`.
                        unsafe { sys::read_raw(self.wakefd, (&mut v as *mut u64).cast(), 8) };
                    } else if let Ok(i) = held.binary_search_by_key(&key, |h| h.key) {
                        held[i].due = true;
                    }
                }
            });
        }
    }

    /// Waits on the epoll set at most `ms` (-1: no limit): the events'
    /// count, or -1 with the errno. Raw `epoll_pwait` with no mask
    /// (libc's `epoll_wait` is a cancellation point, and the preload's
    /// own would take it for the program's).
    fn wait(&self, events: &mut [libc::epoll_event], ms: c_int) -> c_int {
        warpsock_engine::rawsys::epoll_pwait(self.epfd, events, ms)
    }
}

#[cfg(test)]
mod tests;
