//! Making a switching socket and starting its switch on a pool thread
//! ([`start`]), for an accepted connection or a policy-mode client's, and
//! the bound on clients' switches ([`ClientSwitch`]).

use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use libc::c_int;
use warpsock_engine::fds;
use warpsock_xsock::io::{answer_busy, BusyAnswer, Options};

use super::super::budget;
use super::late_busy;
use super::slot::{self, NoPlace, PeerBlock, Slot};
use super::{
    pool, Asked, State, SwitchingSock, BUSY_ANSWERED, OVER, PEER_OVER, STARTED, SWITCHING_MAX,
};
use crate::shim::doorbell::Doorbell;
use crate::shim::guard::enter;
use crate::shim::sys::{self, errno};
use crate::shim::{epollcarry, fdtable, real};
use crate::xsock::urgent_inline;

/// Client switches under way in the background (at most half of
/// [`SWITCHING_MAX`]); a guard gives its place back when dropped.
static CLIENTS: AtomicUsize = AtomicUsize::new(0);

/// A place among [`CLIENTS`].
struct ClientSwitch;

impl ClientSwitch {
    fn take() -> Option<Self> {
        CLIENTS
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < SWITCHING_MAX / 2).then_some(n + 1)
            })
            .ok()
            .map(|_| Self)
    }
}

impl Drop for ClientSwitch {
    fn drop(&mut self) {
        CLIENTS.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Starts the switch of the program's accepted connection `fd` — or, with
/// `connecting`, of the connection its `connect` just made (policy mode:
/// that `connect` then returns at once, [`Socket::connect`]) — on a
/// thread of its own, `fd` a switching socket meanwhile: `prepare` notes
/// its one try (and gives the noted `SO_SNDBUF`, or refuses) once a slot
/// is taken. Returns the switching socket (the table may name its outcome
/// already: the switch runs meanwhile). On failure (no slot, or an
/// accepted connection's peer holding its share, `slot::PEER_SHARE`:
/// `EAGAIN`;
/// beyond the budget of DDP sockets: `EAGAIN`, a client's `ENOBUFS`;
/// refused, no descriptor, no thread) `fd` is left, or made again, the
/// plain TCP socket, and the errno returned.
pub(in crate::xsock) fn start(
    fd: c_int,
    opts: &'static Options,
    msg_mode: bool,
    (role, connecting): (Option<warpsock_xsock::Role>, bool),
    prepare: impl FnOnce(c_int) -> Result<Option<usize>, c_int>,
) -> Result<Arc<SwitchingSock>, c_int> {
    // A client's switch takes a slot only while fewer than half are
    // clients': a proxy's slow backends leave room for its accepted
    // connections (review 42 item 2). Given back with the switch.
    let client = if connecting {
        match ClientSwitch::take() {
            Some(c) => Some(c),
            // The caller switches it itself.
            None => return Err(libc::EAGAIN),
        }
    } else {
        None
    };
    // Its place among the live DDP sockets first (`budget`), then among
    // the switches under way. An accepted connection beyond either stays
    // plain TCP, its switch not tried: the client falls back (`OVER`
    // counts the switches', `budget::admit` the budget's). A client's
    // beyond the budget stays plain too (`ENOBUFS`: not switched inside
    // `connect` either); beyond the switches' places it is switched
    // there (`EAGAIN`).
    let left_plain = |over: Option<NoPlace>| {
        if connecting {
            return if over.is_none() {
                libc::ENOBUFS
            } else {
                libc::EAGAIN
            };
        }
        match over {
            Some(NoPlace::Full) => OVER.fetch_add(1, Ordering::Relaxed),
            Some(NoPlace::PeerShare) => PEER_OVER.fetch_add(1, Ordering::Relaxed),
            None => 0,
        };
        // A warpsock client hears at once that we are busy, not after its
        // fallback (`WARPSOCK_DDP_FALLBACK_MS`, 1 s per connection): now if
        // its mark came already (a burst behind the accept backlog), else
        // when it comes (`late_busy`). A failure leaves the connection as
        // it was: plain, its client falling back.
        // SAFETY: the program's accepted socket, open for the call.
        let sock = unsafe { BorrowedFd::borrow_raw(fd) };
        match answer_busy(sock) {
            Ok(BusyAnswer::Sent) => {
                BUSY_ANSWERED.fetch_add(1, Ordering::Relaxed);
            }
            Ok(BusyAnswer::NotYet) => {
                late_busy::watch(fd, opts.limits.mark_timeout);
            }
            Ok(BusyAnswer::Never) | Err(_) => {}
        }
        // This connection is plain: a fork does not wait for an older one.
        slot::accepted_last(0);
        libc::EAGAIN
    };
    // A program that reads urgent bytes in its stream (`SO_OOBINLINE`, its
    // listener's) would read a client's mark as its first byte: its
    // connections are answered busy, the mark taken out of the stream
    // (`answer_busy`), and never switched (`prepare` refuses the option:
    // helper 66's review, where the switch spun on the inline mark until
    // its bound and the program then read it).
    if !connecting && urgent_inline(fd) {
        super::super::REFUSED.fetch_add(1, Ordering::Relaxed);
        return Err(left_plain(None));
    }
    let Some(place) = budget::admit() else {
        return Err(left_plain(None));
    };
    // An accepted connection's peer, for its share of the places (a
    // client's switches are bounded apart: `ClientSwitch`).
    let peer = if connecting {
        None
    } else {
        sys::peer_addr(fd).map(|a| PeerBlock::of(a.ip(), sys::local_addr(fd).map(|l| l.ip())))
    };
    let slot = match Slot::take(peer) {
        Ok(s) => s,
        Err(why) => return Err(left_plain(Some(why))),
    };
    // What a fork of this thread waits for and may decline: the
    // connection it accepted last, not one it connected since (a server
    // thread's lookup between `accept` and `fork` took the place of the
    // accepted one, whose held switch then went undeclined; review 42
    // item 1).
    if !connecting {
        slot::accepted_last(slot.id);
    }
    let asked: Asked = (msg_mode, None, role, prepare(fd)?);
    // SAFETY: fcntl on the program's new socket.
    let (fl, kfd) = unsafe { (real::fcntl(fd, libc::F_GETFL, 0), fds::dup_lifted(fd)) };
    if fl < 0 || kfd < 0 {
        let e = errno();
        if kfd >= 0 {
            sys::close(kfd);
        }
        return Err(e);
    }
    let nonblocking = fl & libc::O_NONBLOCK != 0;
    let bell = match Doorbell::new(nonblocking) {
        Ok(b) => b,
        Err(e) => {
            sys::close(kfd);
            return Err(e);
        }
    };
    // What a forked child's copy and an exec's become (`demote_fd`): the
    // switch's `prepare` made them; a no-op then.
    if let Err(e) = crate::xsock::sock::dead_ends_made() {
        sys::close(kfd);
        return Err(e);
    }
    // Left at the lowest free number, unlike the library's other
    // descriptors (`warpsock_engine::fds`): a `select` over the switching
    // number waits on it too, in sets widened to it (`interpose::wait::
    // select`), which stay within `FD_SETSIZE` and on the stack only while
    // it is low. It lives only while the switch runs.
    // SAFETY: a new eventfd of ours.
    let done = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    if done < 0 {
        let e = errno();
        sys::close(kfd);
        return Err(e);
    }
    // Writable only at the end: a send would fail with `EAGAIN` until then.
    // The doorbell's send buffer at its least first: filled by one or two
    // writes, not ~50 (a tenth of a millisecond per accepted connection).
    sys::set_int(bell.app, libc::SOL_SOCKET, libc::SO_SNDBUF, 1);
    bell.set_writable(false);
    let app = bell.app;
    let s = Arc::new(SwitchingSock {
        kfd,
        held: Some(epollcarry::Held::new(kfd)),
        bell,
        done,
        woken: AtomicBool::new(false),
        installing: AtomicBool::new(false),
        installed: AtomicBool::new(false),
        dups: AtomicUsize::new(0),
        refs: AtomicUsize::new(0),
        nonblocking: AtomicBool::new(nonblocking),
        pid: sys::getpid(),
        slot: (slot.at, slot.id),
        connecting: AtomicBool::new(connecting),
        st: Mutex::new(State {
            outcome: None,
            opts: Vec::new(),
            shut: 0,
            msg_mode,
            bells: 0,
            epoll: Vec::new(),
            epoll_given: false,
        }),
        settled: Condvar::new(),
    });
    fdtable::swap_in(fd, app, s.clone())?;
    #[cfg(test)]
    {
        *sys::lock(&super::STARTED_LAST) = Arc::downgrade(&s);
    }
    let t = Arc::clone(&s);
    let spawned = pool::run(
        s.pid,
        Box::new(move || {
            // The slot is given back after the socket's reference (locals
            // drop in reverse): no switch under way means no switch thread
            // holds a socket any more (`hooks::name_gap`).
            let _slot = slot;
            let _client = client;
            let t = t;
            enter((), || t.run(fd, opts, asked, place));
        }),
    );
    if spawned.is_err() {
        // The number back on the TCP socket, the switch not begun.
        let _ = s.install(kfd, None);
        s.wake_waiters();
        return Err(libc::EAGAIN);
    }
    STARTED.fetch_add(1, Ordering::Relaxed);
    Ok(s)
}

#[cfg(test)]
mod tests;
