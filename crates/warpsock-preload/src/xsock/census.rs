//! The exit's census of the live DDP sockets ([`SOCKS`]): their closes
//! at exit ([`ExitCloses`]: a program that exits without closing them),
//! the bytes their engines hold behind full kernel send buffers, which the
//! exit waits for (`linger`), and the reset of those it gave up on (review
//! r21-b #4). Apart from `sock` so that it stays under the size limit;
//! it uses `sock`, which never names it.

use std::cell::Cell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, MutexGuard, Weak};
use std::time::{Duration, Instant};

use libc::{c_int, socklen_t};
use warpsock_xsock::io::{Begun, Closing, ForkList, Phase};

use super::reaper;
use super::sock::{DdpSock, SOCKS, SOCKS_OWNER};
use crate::shim::guard::enter;
use crate::shim::real;
use crate::shim::sys;

/// [`SOCKS`]'s contents.
type Socks = HashMap<usize, Weak<DdpSock>>;

/// At exit (and `exec`, `_exit`): the bytes the process's live DDP
/// sockets' engines hold behind full kernel send buffers, summed, and the
/// bytes their kernels accepted so far
/// ([`warpsock_xsock::io::XSocket::engine_backlog`]; the sum drops when a
/// socket leaves the set). The exit waits for the first
/// (the progress thread writes them as the kernels drain) and resets
/// what it gives up on ([`reset_backlogged`]): else the kernel sends a
/// clean end after a short stream (review r21-b #4). Allocates nothing
/// (an exit handler, other threads still running); holds [`SOCKS`] while
/// it takes each engine's lock, an order nothing reverses (no path holds
/// an engine's lock and then takes `SOCKS`).
pub(crate) fn engine_backlogs() -> (u64, u64) {
    let mut sum = (0, 0);
    each_own_sock(|s| {
        let (held, written) = s.x.engine_backlog();
        sum.0 += held;
        sum.1 += written;
    });
    sum
}

/// At exit, once the wait gave up: resets every live DDP socket of the
/// process whose engine still holds bytes ([`engine_backlogs`]).
pub(crate) fn reset_backlogged() {
    each_own_sock(|s| {
        if s.x.engine_backlog().0 > 0 {
            s.x.reset_now();
        }
    });
}

/// How long an exit tries for a lock that may never come free (a socket's,
/// its engine's, [`SOCKS`], the send buffers' list) before it leaves what
/// that lock guards to the kernel: the exiting thread may hold it itself
/// (a signal handler's `exit` over a call of the library: review r25-c
/// item 3), or another thread stopped inside a call.
const TRY_FOR: Duration = Duration::from_millis(2);

/// `f`, one try of a lock (`None`: taken), again every 100 µs until it
/// answers, [`TRY_FOR`] at most.
pub(crate) fn retry<T>(f: impl FnMut() -> Option<T>) -> Option<T> {
    retry_for(TRY_FOR, f)
}

/// [`retry`] for `bound`: the normal exit's (its own thread holds no
/// lock: a holder is another thread, which a loaded machine may keep off
/// its CPU for milliseconds, and one stopped for good costs one bound;
/// review r26-a item 3).
pub(crate) fn retry_for<T>(bound: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let end = Instant::now() + bound;
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if Instant::now() >= end {
            return None;
        }
        sys::sleep(Duration::from_micros(100));
    }
}

/// [`engine_backlogs`] for an exit entered inside the library
/// (`guard::busy`: a signal handler's `exit` over a call of this thread,
/// which may hold [`SOCKS`] or an engine's lock for good): each lock is
/// tried ([`retry`]); a socket whose engine's lock is not had counts as
/// holding nothing (its bytes are the kernel's, as before the exit's
/// closes), and so does every socket if `SOCKS` is not had.
pub(crate) fn engine_backlogs_trying() -> (u64, u64) {
    let mut sum = (0, 0);
    each_own_sock_trying(|s| {
        if let Some((held, written)) = retry(|| s.x.try_engine_backlog()) {
            sum.0 += held;
            sum.1 += written;
        }
    });
    sum
}

/// [`reset_backlogged`] as [`engine_backlogs_trying`] looks.
pub(crate) fn reset_backlogged_trying() {
    each_own_sock_trying(|s| {
        if retry(|| s.x.try_engine_backlog()).is_some_and(|b| b.0 > 0) {
            s.x.reset_now();
        }
    });
}

/// The closes an exit makes of the DDP sockets the program left open, as
/// its `close` would: a process's end closes its descriptors, and TCP's
/// kernel then sends every byte and a FIN, which the peer reads to the
/// end (issue 12). A DDP socket's engine socket closed with the process
/// meets the credit returns of a peer still reading our last messages
/// and answers them with a reset: the peer loses what our kernel had not
/// sent yet and our end of stream (`XSocket::linger_after_close`). So the
/// exit closes each socket — orderly (the end of stream after every byte,
/// then the linger for the peer's FIN, the engine's socket kept open and
/// the peer's input discarded), or a reset if received bytes were left
/// unread (`XSocket::unread`, as Linux's `tcp_close`) or the program set
/// `SO_LINGER` {1, 0} (an abortive close) — and waits:
/// while bytes leave, as for the send buffers ([`super::linger`]), then
/// one `WARPSOCK_LINGER_MS` at most, for all of them at once and for the
/// reaper's closes still held ([`reaper::HELD`]), for the peers' FINs.
/// The sockets stay the program's (its descriptors, other threads' calls
/// in flight); their references are kept to the process's end.
pub(crate) struct ExitCloses {
    /// Each socket, its close (`None`: none made), and since when its
    /// steps have not had its lock (`None`: the last did).
    socks: Vec<(Arc<DdpSock>, Option<Closing>, Option<Instant>)>,
    /// `WARPSOCK_LINGER_MS`: the closes' bounds, and the longest a lock
    /// is waited for ([`retry_for`]).
    bound: Duration,
}

impl ExitCloses {
    /// Begins the close of every live DDP socket of this process (none in
    /// a forked or vforked child of one: they are the parent's).
    pub(crate) fn begin(linger: Duration) -> Self {
        // SAFETY: getpid has no preconditions.
        let me = unsafe { libc::getpid() };
        let none = || Self {
            socks: Vec::new(),
            bound: linger,
        };
        if SOCKS_OWNER.load(Ordering::Acquire) != me {
            return none();
        }
        exit_begins();
        enter(none(), || {
            // Taken out of the list first: each close takes its socket's
            // lock, which nothing orders against `SOCKS`.
            let socks: Vec<Arc<DdpSock>> = SOCKS
                .lock()
                .values()
                .filter_map(Weak::upgrade)
                .filter(|s| s.pid == me)
                .collect();
            let socks = socks
                .into_iter()
                .map(|s| {
                    // The program's `SO_LINGER` {1, 0} (its close would
                    // be abortive), or bytes left unread. A socket whose
                    // lock is not had within the bound ([`retry_for`]: a
                    // thread stopped inside a call holds it) is left to
                    // the kernel, as before these closes. The unread
                    // look only for an orderly close (review r26-a item
                    // 7).
                    let abortive = linger_as_set(s.x.tcp_fd())
                        .is_some_and(|l| l.l_onoff != 0 && l.l_linger == 0);
                    let c = if abortive {
                        s.x.reset_now();
                        None
                    } else {
                        // The unread look and the begin in one take of
                        // the lock (`close_begin_or_reset`): a reset
                        // leaves no close to step.
                        match retry_for(linger, || {
                            s.x.try_close_begin_or_reset(linger, Instant::now())
                        }) {
                            Some(Begun::Orderly(c)) => Some(c),
                            Some(Begun::Reset) | None => None,
                        }
                    };
                    (s, c, None)
                })
                .collect();
            Self {
                socks,
                bound: linger,
            }
        })
    }

    /// A step of every close not done ([`warpsock_xsock::io::XSocket::close_step`]);
    /// returns whether one still sends its bytes or end of stream. A close
    /// whose socket's lock is not had ([`retry`]) makes no step this time,
    /// and counts as sending while its steps have missed the lock for
    /// less than the bound (another thread's call holds it, maybe off its
    /// CPU: review r26-a item 3), as not sending after (a thread stopped
    /// inside a call holds it: the wait must not last for it).
    pub(crate) fn step(&mut self) -> bool {
        if self.socks.is_empty() {
            return false;
        }
        let bound = self.bound;
        enter(false, || {
            let now = Instant::now();
            let mut sending = false;
            for (s, c, missed) in &mut self.socks {
                if let Some(c) = c.as_mut().filter(|c| c.phase() != Phase::Done) {
                    match retry(|| s.x.try_close_step(c, now)) {
                        Some(p) => {
                            *missed = None;
                            sending |= p == Phase::Sending;
                        }
                        None => {
                            let since = *missed.get_or_insert(now);
                            sending |= c.phase() == Phase::Sending
                                && now.saturating_duration_since(since) < bound;
                        }
                    }
                }
            }
            sending
        })
    }

    /// After the exit's wait for the bytes (and its resets of those given
    /// up on): the closes still sending give up (a reset if sends were
    /// queued; one whose socket's lock is not had within `bound`, [`retry_for`], is left
    /// as it is), then the exit waits for the peers' FINs — of its closes
    /// and the reaper's — up to `bound` in all, looking every 2 ms.
    pub(crate) fn linger(&mut self, bound: Duration) {
        let deadline = Instant::now() + bound;
        if !self.socks.is_empty() {
            enter((), || {
                for (s, c, _) in &mut self.socks {
                    if let Some(c) = c.as_mut().filter(|c| c.phase() == Phase::Sending) {
                        let _ = retry_for(bound, || s.x.try_close_cut(c).then_some(()));
                    }
                }
            });
        }
        loop {
            self.step();
            let open = self
                .socks
                .iter()
                .any(|(_, c, _)| c.as_ref().is_some_and(|c| c.phase() != Phase::Done));
            if (!open && reaper::HELD.load(Ordering::Acquire) == 0) || Instant::now() >= deadline {
                return;
            }
            sys::sleep(Duration::from_millis(2));
        }
    }
}

impl Drop for ExitCloses {
    /// Never dropped: a socket's last reference would close it again
    /// (`DdpSock`'s drop); the process ends with them.
    fn drop(&mut self) {
        std::mem::forget(std::mem::take(&mut self.socks));
    }
}

/// The exit's closes or resets begin (in the process that switched the
/// sockets: a forked or vforked child's exit is not theirs): from now on
/// the program's other threads' calls that meet them wait for the
/// process's end (`close::EXITING`, `park_if_exiting`).
pub(crate) fn exit_begins() {
    // SAFETY: getpid and gettid have no preconditions.
    let (me, tid) = unsafe { (libc::getpid(), libc::gettid()) };
    if SOCKS_OWNER.load(Ordering::Acquire) == me {
        super::sock::close::EXITING.store(tid, Ordering::Release);
    }
}

/// Whether this process switched the sockets [`SOCKS`] lists (not a forked
/// or vforked child of that process).
pub(crate) fn owns_sockets() -> bool {
    // SAFETY: getpid has no preconditions.
    SOCKS_OWNER.load(Ordering::Acquire) == unsafe { libc::getpid() }
}

/// An exit in a signal handler over a wait of this thread that holds no
/// lock (`slept`: [`warpsock_engine::asleep::abandon`]): the socket it
/// waited on is read and driven again
/// ([`warpsock_xsock::io::XSocket::abandon_wait`]), for its close.
pub(crate) fn abandon_wait(slept: warpsock_engine::asleep::Slept) {
    let mut done = false;
    each_own_sock_trying(|s| {
        if !done {
            done = s.x.abandon_wait(slept);
        }
    });
}

/// Runs `f` on each live DDP socket this process switched, under the
/// guard (a socket whose last reference another thread dropped meanwhile
/// is dropped here: its engine's calls are library calls).
fn each_own_sock(f: impl FnMut(&DdpSock)) {
    each_own_sock_as(false, || Some(SOCKS.lock()), f);
}

/// [`each_own_sock`] if [`SOCKS`] is had within [`retry`]'s bound, else
/// none. Each socket's reference taken is forgotten, not dropped: a socket
/// whose last other reference went meanwhile would be closed here (its
/// locks, allocation: what an exit interrupted inside the library must not
/// take; review r26-a item 6). A leak at the process's end.
fn each_own_sock_trying(f: impl FnMut(&DdpSock)) {
    each_own_sock_as(true, || retry(|| SOCKS.try_lock()), f);
}

fn each_own_sock_as(
    forget: bool,
    take: impl FnOnce() -> Option<MutexGuard<'static, Socks>>,
    mut f: impl FnMut(&DdpSock),
) {
    // SAFETY: getpid has no preconditions.
    let me = unsafe { libc::getpid() };
    if SOCKS_OWNER.load(Ordering::Acquire) != me {
        return;
    }
    enter((), || {
        let Some(socks) = take() else {
            return;
        };
        // No close made by a last reference this walk holds waits here
        // (review r26-b item 1).
        crate::shim::fdtable::without_close_waits(|| {
            for s in socks.values() {
                if let Some(s) = s.upgrade() {
                    if s.pid == me {
                        f(&s);
                    }
                    if forget {
                        std::mem::forget(s);
                    }
                }
            }
        });
    });
}

/// A connection [`arm_exec_reset`] marked: its engine socket's descriptor,
/// the socket's inode (read while the socket was known alive: its
/// identity at the undo, the number may have been closed and given to
/// another socket meanwhile), and its `SO_LINGER` before (the program's,
/// if it set one: it reaches the same socket).
struct Armed {
    fd: c_int,
    ino: u64,
    was: libc::linger,
}

/// The marks of the execs in flight; a forked child starts a list of its
/// own: the parent's lock may be held by a thread the child does not have
/// (review r22-a item 4; as `sndbuf`'s holders).
static ARMED: ForkList<Armed> = ForkList::new();

/// Execs of this process in flight (between their wait and their return):
/// the marks are taken back when the last fails, not when the first does
/// (review r22-a item 3: two threads' execs undid each other's marks, or
/// left `{1, 0}` on a connection the program keeps).
static EXECS: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// Whether the calling thread's exec in flight is counted in [`EXECS`].
    static COUNTED: Cell<bool> = const { Cell::new(false) };
    /// The calling thread holds [`ARMED`] in [`arm_exec_reset`] (a signal
    /// handler's close there must not take it again: [`linger_as_set`]).
    static ARMING: Cell<bool> = const { Cell::new(false) };
}

/// In a forked child: the parent's execs and marks are not the child's.
pub(crate) fn forget_armed_after_fork() {
    EXECS.store(0, Ordering::Release);
    ARMED.forget();
    COUNTED.with(|c| c.set(false));
}

/// `fd`'s `SO_LINGER`, or `None` if it is not a socket's.
pub(super) fn linger_of(fd: c_int) -> Option<libc::linger> {
    let mut l = libc::linger {
        l_onoff: 0,
        l_linger: 0,
    };
    let mut len = size_of::<libc::linger>() as socklen_t;
    // SAFETY: getsockopt into a `linger` on the stack, its size given.
    let r = unsafe {
        real::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&mut l as *mut libc::linger).cast(),
            &mut len,
        )
    };
    (r == 0).then_some(l)
}

/// Engine socket `fd`'s `SO_LINGER` as the program set it: an exec in
/// flight that gave up on its bytes set {1, 0} on it ([`arm_exec_reset`]),
/// which is the library's, not the program's — its saved value is the
/// answer (review r23-a item 10: a close of that socket by another thread
/// meanwhile took the mark for an abortive close, and reset a connection
/// the program meant to end cleanly if the exec failed). The list is looked
/// at only when the value is {1, 0} with an exec in flight.
pub(super) fn linger_as_set(fd: c_int) -> Option<libc::linger> {
    let l = linger_of(fd)?;
    if l.l_onoff == 0
        || l.l_linger != 0
        || EXECS.load(Ordering::Acquire) == 0
        || ARMING.with(Cell::get)
    {
        return Some(l);
    }
    let ino = super::inode(fd);
    let armed = ARMED.lock();
    Some(
        armed
            .iter()
            .find(|a| a.fd == fd && a.ino == ino)
            .map_or(l, |a| a.was),
    )
}

fn set_linger(fd: c_int, l: libc::linger) {
    // SAFETY: setsockopt reading a `linger` on the stack, its size given.
    unsafe {
        real::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&l as *const libc::linger).cast(),
            size_of::<libc::linger>() as socklen_t,
        )
    };
}

/// An exec begins (before its wait): counted if this process switched DDP
/// sockets of its own (a forked or vforked child's copies of its parent's
/// are not; a vforked child shares the parent's memory and must not
/// change its count). Returns whether it is counted.
pub(crate) fn exec_begins() -> bool {
    // SAFETY: getpid has no preconditions.
    let me = unsafe { libc::getpid() };
    let counted = SOCKS_OWNER.load(Ordering::Acquire) == me;
    if counted {
        EXECS.fetch_add(1, Ordering::AcqRel);
    }
    COUNTED.with(|c| c.set(counted));
    counted
}

/// Before an exec whose wait gave up (counted: [`exec_begins`]): each
/// connection of this process that still holds bytes — in its send buffer
/// (`reset_buffered`'s, closes under way included) or in its engine's
/// backlog ([`reset_backlogged`]'s) — is marked to be reset by the
/// kernel's close at the exec (`SO_LINGER` on, 0 s: Linux's `tcp_close`
/// then sends RST, not FIN). The exec closes every descriptor of the
/// library's (close-on-exec) and the program's managed ones
/// (close-on-exec, or demoted to a dead socket), so the peer gets
/// `ECONNRESET`, as at exit, and not a clean end after a short stream (the
/// exec lost those bytes with the process image). Not reset now, as the
/// exit does: an exec that fails returns to a program that keeps its
/// connections ([`exec_failed`] takes the marks back). Each mark is made
/// while its socket is known alive — under the send buffers' list lock
/// (a connection leaves the list before its descriptor is closed:
/// `warpsock_xsock::io::for_each_holder`), or holding the socket — never
/// on a bare number another thread may have closed and reused since
/// (review r22-a item 1). A number marked already (another exec in
/// flight) keeps its first mark and saved value. The socket another
/// process still holds (a child that inherited it) is not closed by this
/// exec: the mark is left to its close (the bytes are lost all the same).
pub(crate) fn arm_exec_reset() {
    let zero = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    ARMING.with(|a| a.set(true));
    let mut list = ARMED.lock();
    let mut mark = |fd: c_int| {
        let ino = super::inode(fd);
        if list.iter().any(|a| a.fd == fd && a.ino == ino) {
            return;
        }
        let Some(was) = linger_of(fd) else {
            return;
        };
        list.push(Armed { fd, ino, was });
        set_linger(fd, zero);
    };
    warpsock_xsock::io::for_each_holder(&mut mark);
    each_own_sock(|s| {
        if s.x.engine_backlog().0 > 0 {
            mark(s.x.tcp_fd());
        }
    });
    drop(list);
    ARMING.with(|a| a.set(false));
}

/// The exec returned (it failed): if it was counted ([`exec_begins`]) and
/// no other exec of the process is in flight, each connection marked gets
/// its `SO_LINGER` back, if its number still names the same socket — a
/// later close ends it cleanly again (or as the program set). An exec not
/// counted (a child's, or a process with no DDP socket) takes no lock.
pub(crate) fn exec_failed() {
    if !COUNTED.with(|c| c.replace(false)) {
        return;
    }
    if EXECS.fetch_sub(1, Ordering::AcqRel) != 1 {
        return;
    }
    for a in ARMED.lock().drain(..) {
        if super::inode(a.fd) == a.ino {
            set_linger(a.fd, a.was);
        }
    }
}
