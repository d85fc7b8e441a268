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
//! The program's number is watched, not a duplicate: a duplicate would
//! keep the connection open after the program closed it (its FIN late by
//! up to the bound). A number closed since reads `POLLNVAL`; one reused by
//! another socket is told by its inode ([`SocketId`]) and dropped. Between
//! that look and the answer the program could still close the number and
//! reuse it for a new connection: `answer_busy` answers only a mark first
//! in a stream our side has not written to — a warpsock client's switch,
//! which that connection's own accept leaves plain or switches (the
//! number then a switching socket's doorbell, no TCP socket).
//!
//! A program that writes first just as the mark comes (a server that
//! speaks first, and a client that marked late) could see its bytes go
//! out between `answer_busy`'s look and its `BUSY`: the client then finds
//! the bytes first and goes on as TCP, and its program sees an urgent
//! byte. The window is a few system calls.
//!
//! Fork: a child has no watching thread; the watches are per process (the
//! state's pid), and a child's first watch starts afresh. The lock is only
//! tried: a fork may leave it held.

use std::os::fd::BorrowedFd;
use std::sync::atomic::Ordering;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use libc::c_int;
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
    /// ones and those past their bound removed. Returns the numbers to
    /// answer.
    fn after_poll(
        &mut self,
        polled: &[libc::pollfd],
        now: Instant,
        same: impl Fn(c_int, SocketId) -> bool,
    ) -> Vec<c_int> {
        let mut answer = Vec::new();
        self.list.retain(|w| {
            let ev = polled
                .iter()
                .find(|p| p.fd == w.fd)
                .map_or(0, |p| p.revents);
            match look(ev, || same(w.fd, w.id)) {
                Seen::Urgent => {
                    answer.push(w.fd);
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

/// The process's watches and its watching thread.
struct Watched {
    pid: libc::pid_t,
    running: bool,
    watches: Watches,
}

static WATCHED: Mutex<Watched> = Mutex::new(Watched {
    pid: 0,
    running: false,
    watches: Watches { list: Vec::new() },
});

/// [`WATCHED`], if its lock is free now (a fork may have left it held;
/// a poisoned one is taken as it is).
fn try_watched() -> Option<std::sync::MutexGuard<'static, Watched>> {
    match WATCHED.try_lock() {
        Ok(g) => Some(g),
        Err(std::sync::TryLockError::Poisoned(p)) => Some(p.into_inner()),
        Err(std::sync::TryLockError::WouldBlock) => None,
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

/// Watches the program's accepted connection `fd`, left plain for want of
/// a place, whose client's mark has not come ([`BusyAnswer::NotYet`]), for
/// up to `bound`. `false`: not watched (at [`WATCHES_MAX`], the lock
/// held, no thread).
pub(super) fn watch(fd: c_int, bound: Duration) -> bool {
    let Some(id) = socket_id(fd) else {
        return false;
    };
    let Some(mut w) = try_watched() else {
        return false;
    };
    let pid = sys::getpid();
    if w.pid != pid {
        // Another process's (a fork's parent): none of its watches are ours.
        *w = Watched {
            pid,
            running: false,
            watches: Watches::default(),
        };
    }
    let until = Instant::now() + bound;
    if !w.watches.add(Watch { fd, id, until }) {
        return false;
    }
    if !w.running {
        if sys::spawn_library_thread("warpsock-busy", run).is_err() {
            w.watches.list.pop();
            return false;
        }
        w.running = true;
    }
    true
}

/// The watching thread: polls the watches, answers the marks, ends when
/// none is left.
fn run() {
    sys::no_cancel();
    enter((), || loop {
        let (mut fds, wait) = {
            let Some(mut w) = watched() else {
                return;
            };
            if w.watches.is_empty() {
                w.running = false;
                return;
            }
            (w.watches.pollfds(), w.watches.wait(Instant::now()))
        };
        let ms = wait.as_millis().max(1) as c_int;
        sys::poll(&mut fds, ms);
        let answer = {
            let Some(mut w) = watched() else {
                return;
            };
            w.watches
                .after_poll(&fds, Instant::now(), |fd, id| socket_id(fd) == Some(id))
        };
        for fd in answer {
            // SAFETY: the program's number, looked at just now (a close
            // since makes the calls fail; a reuse: the module's docs).
            let sock = unsafe { BorrowedFd::borrow_raw(fd) };
            if matches!(answer_busy(sock), Ok(BusyAnswer::Sent)) {
                BUSY_ANSWERED.fetch_add(1, Ordering::Relaxed);
            }
        }
    });
}

/// [`WATCHED`] for the thread: its lock, waited for (held only briefly by
/// the program's accepts), poison ignored.
fn watched() -> Option<std::sync::MutexGuard<'static, Watched>> {
    Some(match WATCHED.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    })
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
        assert_eq!(answer, vec![3]);
        let left: Vec<c_int> = ws.list.iter().map(|w| w.fd).collect();
        assert_eq!(left, vec![8, 9], "10 is past its bound");
        assert!(ws.wait(now) <= LOOK);
        assert_eq!(ws.after_poll(&[], later, |_, _| true), Vec::<c_int>::new());
        assert!(ws.is_empty(), "every bound passed");
    }
}
