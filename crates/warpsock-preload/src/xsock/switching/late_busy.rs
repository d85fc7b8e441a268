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
//! client waits at most). Before, such a client waited out its fallback
//! (`WARPSOCK_DDP_FALLBACK_MS`, 1 s) on every connection.
//!
//! Bounds: at most [`WATCHES_MAX`] connections at once (beyond, the client
//! waits its fallback, as before); one thread, made on the first watch and
//! ended when none is left; it looks at new watches at least every
//! [`LOOK`].
//!
//! The program's number is watched, not a duplicate kept: a duplicate
//! would keep the connection open after the program closed it (its FIN
//! late by up to the bound). A `poll` under way holds the sockets it waits
//! on, so a program's close of a watched connection takes effect when the
//! poll returns (at most [`LOOK`] later; a close with `SO_LINGER` set
//! lingers on this thread then). A number closed since reads `POLLNVAL`;
//! one reused by another socket is told by its inode ([`SocketId`]) and
//! dropped. A mark is answered on a duplicate made then and looked at
//! again (the number may have been closed and reused since the poll), and
//! only if nothing follows the mark (`answer_busy`: a client that gave up
//! and went on as TCP is left alone).
//!
//! A program that writes first just as the mark comes (a server that
//! speaks first, and a client that marked late) could see its bytes go
//! out between `answer_busy`'s look and its `BUSY`: the client then finds
//! the bytes first and goes on as TCP, and its program sees an urgent
//! byte. The window is a few system calls.
//!
//! Fork: a child has no watching thread, and a parent's thread may hold
//! the lock at the fork: the watcher is per process ([`forget_after_fork`],
//! and its pid for a raw `fork`), so a child's first watch starts afresh.

use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use libc::c_int;
use warpsock_engine::fds;
use warpsock_xsock::io::{answer_busy, BusyAnswer};

use super::BUSY_ANSWERED;
use crate::shim::guard::enter;
use crate::shim::sys;

/// Most connections watched at once.
pub(super) const WATCHES_MAX: usize = 64;

/// The longest the thread waits before it looks at the watches again (new
/// ones join its `poll` then).
const LOOK: Duration = Duration::from_millis(20);

/// A socket's identity: its device and inode (`fstat`), to tell the
/// watched connection from another socket given its number since.
type SocketId = (u64, u64);

/// One watched connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Watch {
    fd: c_int,
    id: SocketId,
    until: Instant,
}

/// What a poll's look says of a watch ([`Watches::after_poll`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Seen {
    /// Not in this poll (added since), or nothing happened.
    Nothing,
    /// An urgent byte came: answer (`answer_busy` looks at it).
    Urgent,
    /// Not the watched connection any more (closed, or the number
    /// reused), or its peer's bytes or end came first: left alone.
    Done,
}

/// The watches, sans-IO: what to poll, and what a poll's events decide.
#[derive(Debug, Default)]
struct Watches {
    list: Vec<Watch>,
}

impl Watches {
    /// Adds a watch; `false` at [`WATCHES_MAX`] (or the number watched
    /// already, as this socket).
    fn add(&mut self, w: Watch) -> bool {
        if self.list.len() >= WATCHES_MAX || self.list.iter().any(|x| x.fd == w.fd && x.id == w.id)
        {
            return false;
        }
        self.list.push(w);
        true
    }

    fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// The `poll` set: urgent data, bytes, the peer's end.
    fn pollfds(&self) -> Vec<libc::pollfd> {
        self.list
            .iter()
            .map(|w| libc::pollfd {
                fd: w.fd,
                events: libc::POLLPRI | libc::POLLIN | libc::POLLRDHUP,
                revents: 0,
            })
            .collect()
    }

    /// How long the next `poll` may wait: to the nearest bound, at most
    /// [`LOOK`].
    fn wait(&self, now: Instant) -> Duration {
        self.list
            .iter()
            .map(|w| w.until.saturating_duration_since(now))
            .min()
            .unwrap_or(LOOK)
            .min(LOOK)
    }

    /// After a `poll` of `polled` (its events, by number): each watch's
    /// look (`same`: whether its number is still its socket), the decided
    /// ones and those past their bound removed. Returns the watches to
    /// answer (number and socket).
    fn after_poll(
        &mut self,
        polled: &[libc::pollfd],
        now: Instant,
        same: impl Fn(c_int, SocketId) -> bool,
    ) -> Vec<(c_int, SocketId)> {
        let mut answer = Vec::new();
        self.list.retain(|w| {
            let ev = polled
                .iter()
                .find(|p| p.fd == w.fd)
                .map_or(0, |p| p.revents);
            match look(ev, || same(w.fd, w.id)) {
                Seen::Urgent => {
                    answer.push((w.fd, w.id));
                    false
                }
                Seen::Done => false,
                Seen::Nothing => now < w.until,
            }
        });
        answer
    }
}

/// One watch's events `ev` from a `poll` (`same`: whether the number is
/// still the watched socket, asked only when something happened).
fn look(ev: i16, same: impl FnOnce() -> bool) -> Seen {
    if ev == 0 {
        return Seen::Nothing;
    }
    if ev & libc::POLLNVAL != 0 || !same() {
        return Seen::Done;
    }
    if ev & libc::POLLPRI != 0 {
        return Seen::Urgent;
    }
    Seen::Done
}

/// The process's watches and whether its watching thread runs.
#[derive(Default)]
struct Inner {
    running: bool,
    watches: Watches,
}

/// A process's watcher (made on first use, leaked: a forked child makes
/// its own, [`forget_after_fork`]).
struct Watcher {
    pid: libc::pid_t,
    st: Mutex<Inner>,
}

static WATCHER: AtomicPtr<Watcher> = AtomicPtr::new(std::ptr::null_mut());

/// This process's watcher (`pid`: this process's id).
fn watcher(pid: libc::pid_t) -> &'static Watcher {
    let p = WATCHER.load(Ordering::Acquire);
    if !p.is_null() {
        // SAFETY: a published watcher is leaked and never freed.
        let w: &'static Watcher = unsafe { &*p };
        if w.pid == pid {
            return w;
        }
    }
    let fresh = Box::into_raw(Box::new(Watcher {
        pid,
        st: Mutex::new(Inner::default()),
    }));
    match WATCHER.compare_exchange(p, fresh, Ordering::AcqRel, Ordering::Acquire) {
        // SAFETY: published now, never freed (the one it replaced, another
        // process's, is leaked).
        Ok(_) => unsafe { &*fresh },
        Err(other) => {
            // SAFETY: ours was never shared.
            drop(unsafe { Box::from_raw(fresh) });
            // SAFETY: as above.
            unsafe { &*other }
        }
    }
}

impl Watcher {
    /// Its state, poison ignored (held only for list work, never across
    /// a system call but the identity looks of a poll's events).
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        sys::lock(&self.st)
    }
}

/// In a forked child (its fork handler, the only thread): the parent's
/// watches and thread are not the child's, and its lock may be held.
pub(super) fn forget_after_fork() {
    WATCHER.store(std::ptr::null_mut(), Ordering::Release);
}

/// The socket `fd` is (device, inode), or `None`.
fn socket_id(fd: c_int) -> Option<SocketId> {
    // SAFETY: an all-zero stat is valid; fstat fills it.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat into a stat on the stack.
    let r = unsafe { libc::fstat(fd, &mut st) };
    (r == 0).then_some((st.st_dev, st.st_ino))
}

/// Watches the program's accepted connection `fd`, left plain for want of
/// a place, whose client's mark has not come ([`BusyAnswer::NotYet`]), for
/// up to `bound`. `false`: not watched (at [`WATCHES_MAX`], or no thread).
pub(super) fn watch(fd: c_int, bound: Duration) -> bool {
    let Some(id) = socket_id(fd) else {
        return false;
    };
    let w = watcher(sys::getpid());
    let start = {
        let mut st = w.lock();
        if !st.watches.add(Watch {
            fd,
            id,
            until: Instant::now() + bound,
        }) {
            return false;
        }
        !std::mem::replace(&mut st.running, true)
    };
    // The thread made outside the lock (a `clone` and the signal masks:
    // the program's accepts do not wait on it).
    if start && sys::spawn_library_thread("warpsock-busy", move || run(w)).is_err() {
        let mut st = w.lock();
        st.running = false;
        st.watches.list.retain(|x| !(x.fd == fd && x.id == id));
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

/// One round: a `poll` of the watches, the marks answered. `false`: none
/// was left (`running` cleared under the lock that saw it).
fn round(w: &Watcher) -> bool {
    let (mut fds, wait) = {
        let mut st = w.lock();
        if st.watches.is_empty() {
            st.running = false;
            return false;
        }
        (st.watches.pollfds(), st.watches.wait(Instant::now()))
    };
    let ms = wait.as_millis().max(1) as c_int;
    if sys::poll(&mut fds, ms) < 0 {
        // EINTR, or no memory for the set: not again at once.
        sys::sleep(Duration::from_millis(1));
    }
    let answer = w
        .lock()
        .watches
        .after_poll(&fds, Instant::now(), |fd, id| socket_id(fd) == Some(id));
    for (fd, id) in answer {
        answer_on(fd, id);
    }
    true
}

/// Answers the watched socket `id` at the program's number `fd` on a
/// duplicate of it, if the duplicate is still that socket (the program may
/// have closed the number and reused it since the poll's look).
fn answer_on(fd: c_int, id: SocketId) {
    // Above the program's numbers, as the library's other descriptors: the
    // program's next socket or accept keeps the lowest free number.
    let dup = fds::dup_lifted(fd);
    if dup < 0 {
        return;
    }
    if socket_id(dup) == Some(id) {
        // SAFETY: our duplicate, open until the close below.
        let sock = unsafe { BorrowedFd::borrow_raw(dup) };
        if matches!(answer_busy(sock), Ok(BusyAnswer::Sent)) {
            BUSY_ANSWERED.fetch_add(1, Ordering::Relaxed);
        }
    }
    sys::close(dup);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(fd: c_int, until: Instant) -> Watch {
        Watch {
            fd,
            id: (1, fd as u64),
            until,
        }
    }

    fn ev(fd: c_int, revents: i16) -> libc::pollfd {
        libc::pollfd {
            fd,
            events: 0,
            revents,
        }
    }

    /// Bounded, and one watch per socket.
    #[test]
    fn the_watches_are_bounded() {
        let t = Instant::now() + Duration::from_secs(1);
        let mut ws = Watches::default();
        for fd in 0..WATCHES_MAX as c_int {
            assert!(ws.add(w(fd, t)));
        }
        assert!(!ws.add(w(1000, t)), "at the bound");
        let mut ws = Watches::default();
        assert!(ws.add(w(3, t)));
        assert!(!ws.add(w(3, t)), "the same socket twice");
    }

    /// An urgent byte is answered; the peer's bytes or end, a closed or
    /// reused number end the watch unanswered; nothing keeps it until its
    /// bound; a watch added after the poll is kept.
    #[test]
    fn a_poll_decides_each_watch() {
        let now = Instant::now();
        let later = now + Duration::from_secs(1);
        let mut ws = Watches::default();
        for fd in 3..=9 {
            ws.add(w(fd, later));
        }
        ws.add(w(10, now));
        let polled = [
            ev(3, libc::POLLPRI),
            ev(4, libc::POLLIN),
            ev(5, libc::POLLRDHUP | libc::POLLIN),
            ev(6, libc::POLLNVAL),
            ev(7, libc::POLLPRI),
            ev(8, 0),
            ev(10, 0),
        ];
        // 7's number is another socket's now; 9 was not in this poll.
        let answer = ws.after_poll(&polled, now, |fd, _| fd != 7);
        assert_eq!(answer, vec![(3, (1, 3))]);
        let left: Vec<c_int> = ws.list.iter().map(|w| w.fd).collect();
        assert_eq!(left, vec![8, 9], "10 is past its bound");
        assert!(ws.wait(now) <= LOOK);
        assert!(ws.after_poll(&[], later, |_, _| true).is_empty());
        assert!(ws.is_empty(), "every bound passed");
    }
}
