//! Accepted connections switch in the background: `accept` never waits on
//! the peer. So do a policy-mode client's (session 40): its `connect`
//! returns once the kernel made the connection, as TCP's does, and the
//! switch, the initiator's, runs here as described below (no hold: that
//! is the responder's). Made inside `connect`, it waited for the server
//! program to accept — a client that connects several times before it
//! uses any connection (iperf 2's `-P`) against a server that accepts the
//! next only after reading from the last got one connection in DDP mode
//! and the others in TCP after the fallback each. With no slot free, the
//! switch is made inside `connect` as before (`Ddp::adopt`).
//!
//! A connection a policy-mode listener (or one set to DDP mode) accepts
//! must switch as the responder: wait for the client's mark (up to
//! `WARPSOCK_DDP_FALLBACK_MS`), then for its MPA Request (the request
//! timeout), then answer. Made inside the program's `accept`, as before,
//! every later client waited behind a silent or slow one — 1 s for each
//! that said nothing, 2 s for each that marked and stalled, even on a
//! non-blocking listener (helper 31; `tests/ddp_accept_stall.rs`). As
//! rsockets does its accept's exchange, the switch now runs on a library
//! thread of its own, and `accept` returns at once with a *switching*
//! socket:
//!
//! * Its descriptor is a doorbell from the start ([`Doorbell`]), readable
//!   and writable only when the switch is over, so the program's poll,
//!   select and epoll registrations wait on something the library
//!   controls; at the end the number names the outcome — the DDP socket,
//!   the plain TCP socket, or one delivering the peer's pre-switch bytes
//!   (`residue`) — its epoll registrations carried, and the old doorbell
//!   rung for a `poll` or `select` still waiting on it.
//! * Calls: a blocking receive or send waits for the end and goes on in
//!   the outcome (so do `WARPSOCK_DDP_MODE`, `WARPSOCK_CRC` and the
//!   extended calls' look-up, `sock::lookup`: the mode is known only
//!   then); on a non-blocking socket each fails with `EAGAIN` instead;
//!   `FIONREAD` reads 0.
//!   Socket options an event loop sets right after `accept`
//!   (`TCP_NODELAY`, keep-alives) reach the TCP socket at once and the
//!   outcome after; those the switch moves off the TCP socket
//!   (`SO_RCVLOWAT`, the timeouts, stamps, error queues, `SO_ZEROCOPY`),
//!   `WARPSOCK_MSG_MODE` and `shutdown` are kept here and made on the
//!   outcome — none of them waits for a slow peer (a send after a
//!   `SHUT_WR` kept fails with `EPIPE` at once, as TCP's).
//! * Waits: a `poll` or `select` begun here also watches
//!   [`SwitchingSock::done`] and then waits again through the outcome
//!   (`interpose::wait`, `interpose::wait::select`); epoll registrations
//!   are carried to the outcome's file.
//! * At most [`SWITCHING_MAX`] switches are under way at once, three
//!   quarters of them for one peer (`slot::PEER_SHARE`: an address, or an
//!   IPv6 /64): a
//!   connection accepted beyond them — or beyond the budget of live DDP
//!   sockets (`budget`, `WARPSOCK_DDP_SOCKETS_MAX`) — stays plain TCP
//!   (the client falls back within its own fallback time, nothing
//!   lost), so a flood of
//!   silent clients holds no more than that many threads, each for at
//!   most the fallback and request timeouts; and each reads at most
//!   `config::ACCEPTED_RESIDUE_MAX` of its client's bytes before the mark
//!   (policy mode's switch ends at the first such byte anyway).
//! * A `close` of every descriptor while the switch runs lets the thread
//!   finish; the connection is then closed in order, whatever it became.
//! * A forked child's copy, and the descriptor an `exec` keeps, is a
//!   dead end, as a DDP socket's (the connection is the parent's, its
//!   handshake half made); a `fork` first waits for the switch of the
//!   connection its thread accepted last ([`settle_before_fork`]), in
//!   policy mode declining it if its client's Request is still to be
//!   answered (an MPA Reject: the connection stays plain, which a forking
//!   server's child can serve). A policy-mode switch holds that answer
//!   until the program uses the connection (a call on it, a wait over it,
//!   any `epoll_wait` or `select` of the process) or its bound passes
//!   (`WARPSOCK_DDP_ACCEPT_HOLD_MS`; `slot::hold`), so that a server's
//!   work between `accept` and `fork` does not outrun the decline.
//! * A `dup` of the number (its system call, then its table entry) and
//!   the outcome's installation exclude each other (`Socket::dup_begin`),
//!   so the copy names the outcome too.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use libc::{c_int, c_ulong, c_void, msghdr, socklen_t};
use warpsock_xsock::io::Options;

use super::{switch_at, Asked, At, SOL_WARPSOCK, WARPSOCK_MSG_MODE};
use crate::shim::doorbell::Doorbell;
use crate::shim::socket::{Socket, Wait};
use crate::shim::sys::{self, lock, set_errno};
use crate::shim::{epollcarry, epollwatch, fdtable, real};

/// The most switches under way at once ([`start`]).
pub(crate) const SWITCHING_MAX: usize = 64;

/// The most socket options a switching socket keeps (distinct level and
/// name pairs; a program sets a handful).
const OPTS_MAX: usize = 32;

/// The longest option value kept.
const OPT_LEN_MAX: usize = 64;

/// Connections switched in the background, accepted ones and policy-mode
/// clients' (`ddp_switch_bg`).
pub(crate) static STARTED: AtomicU64 = AtomicU64::new(0);
/// Accepted connections left plain TCP: [`SWITCHING_MAX`] were under way
/// (`ddp_switch_over`; those left plain beyond the budget of DDP sockets
/// are `budget::OVER`'s, the same way: [`start`]).
pub(crate) static OVER: AtomicU64 = AtomicU64::new(0);
/// Accepted connections left plain TCP because their peer held its share
/// of the places (`slot::PEER_SHARE`; `ddp_switch_peer_over`).
pub(crate) static PEER_OVER: AtomicU64 = AtomicU64::new(0);
/// Of the accepted connections left plain for want of a place (or beyond
/// the budget), those whose client's mark got our busy answer
/// (`warpsock_xsock::io::answer_busy`; `ddp_switch_busy`), at the accept
/// or when it came (`late_busy`): the client went on as TCP at once
/// instead of after its fallback.
pub(crate) static BUSY_ANSWERED: AtomicU64 = AtomicU64::new(0);

/// What the connection became.
#[derive(Clone)]
enum Outcome {
    /// A managed socket: DDP mode, or the residue's.
    Managed(Arc<dyn Socket>),
    /// The plain TCP socket.
    Plain,
}

struct State {
    outcome: Option<Outcome>,
    opts: Vec<Kept>,
    /// `shutdown`s asked meanwhile (`SHUT_RD` 1, `SHUT_WR` 2, both 3),
    /// made on the outcome.
    shut: c_int,
    /// The message mode asked (the listener's, or set meanwhile).
    msg_mode: bool,
    bells: usize,
    /// The program's epoll registrations of the socket made meanwhile
    /// (set, registration): the sets watch the outcome's connection once
    /// it is installed (`shim::epollwatch`; the carry of the numbers'
    /// registrations may have looked before they were made).
    epoll: Vec<(c_int, epollwatch::Reg)>,
    /// [`Self::epoll`] was given to the outcome (at the end of
    /// [`SwitchingSock::install`], under this lock): changes from now on
    /// go to it directly; before, they amend the list (a `DEL` made after
    /// the outcome was known but before the list was given did not undo
    /// a pending `ADD`: review 43 item 2).
    epoll_given: bool,
}

/// A connection whose switch is under way in the background (module
/// docs): an accepted one, or a policy-mode client's.
pub(crate) struct SwitchingSock {
    /// Our duplicate of the TCP socket: the switch runs on it.
    kfd: c_int,
    /// `kfd`'s socket, plain to the program once the outcome is
    /// (`epollcarry::Held`; `None` once dropped).
    held: Option<epollcarry::Held>,
    bell: Doorbell,
    /// An eventfd made readable when the switch is over: a `poll` begun
    /// on this socket watches it ([`Socket::wait_begin`]) and goes on
    /// through the outcome. The doorbell cannot wake it: the kernel's
    /// poll looks the program's number up again at each pass, finds the
    /// outcome's file there, and stays queued on the doorbell's alone.
    done: c_int,
    /// [`Self::done`] was written: the outcome names every number it could.
    woken: AtomicBool,
    /// The outcome's installation began ([`Self::install`]): a `dup`
    /// begun now waits for its end ([`Socket::dup_begin`]).
    installing: AtomicBool,
    /// ... and ended.
    installed: AtomicBool,
    /// `dup`s of a number under way ([`Socket::dup_begin`]): the
    /// installation waits for them (each a system call and a table entry).
    dups: AtomicUsize,
    refs: AtomicUsize,
    nonblocking: AtomicBool,
    pid: i32,
    /// Its switch's place and id (`slot`): a fork may decline it.
    slot: (usize, u64),
    /// The program's `connect` that started the switch (a policy-mode
    /// connection's, in the background: `Ddp::adopt`) is still to return:
    /// its `connect` on this socket returns 0, once.
    connecting: AtomicBool,
    st: Mutex<State>,
    settled: Condvar,
}

/// The switching socket started last (the tests' handle on it).
#[cfg(test)]
static STARTED_LAST: Mutex<std::sync::Weak<SwitchingSock>> = Mutex::new(std::sync::Weak::new());

impl SwitchingSock {
    /// The thread's work: the switch, committed to the numbers naming
    /// this socket (an outcome that wrapped none of them is the plain
    /// socket), then the waits begun on it woken — also if the switch
    /// panicked (caught by the guard's `enter`): its blocked callers wait
    /// for the outcome.
    fn run(&self, fd: c_int, opts: &Options, asked: Asked, place: super::budget::Place) {
        struct Finish<'a>(&'a SwitchingSock);
        impl Drop for Finish<'_> {
            fn drop(&mut self) {
                if lock(&self.0.st).outcome.is_none() {
                    let _ = self.0.install(self.0.kfd, None);
                }
                self.0.wake_waiters();
            }
        }
        let _finish = Finish(self);
        #[cfg(feature = "test-hooks")]
        crate::shim::hooks::switch_panic();
        let at = At {
            fd,
            kernel: self.kfd,
            from: Some(self),
        };
        let _ = switch_at(at, opts, asked, place);
    }

    /// The numbers naming this socket come to name `target` and `sock`
    /// (`None`: the TCP socket, plain), after the options and shutdowns
    /// asked meanwhile are made on it and the outcome is known to calls
    /// under way (one step: an option set meanwhile is kept or made), and
    /// with the `O_NONBLOCK` the program set last. `EBADF`: no number
    /// names it any more (all closed).
    pub(super) fn install(
        &self,
        target: c_int,
        sock: Option<Arc<dyn Socket>>,
    ) -> Result<(), c_int> {
        {
            let mut g = lock(&self.st);
            self.replay(&mut g, sock.as_deref());
            g.outcome = Some(sock.clone().map_or(Outcome::Plain, Outcome::Managed));
            self.settled.notify_all();
        }
        // The `dup`s under way end first: each copy is then in the table,
        // and taken below with the rest.
        self.installing.store(true, Ordering::SeqCst);
        let mut round = 0;
        while self.dups.load(Ordering::SeqCst) > 0 {
            sys::pause(round);
            round = round.saturating_add(1);
        }
        let _installed = Installed(self);
        // The flag as the program set it last, before the numbers move: a
        // change made from now on reaches the outcome
        // ([`Socket::set_nonblocking`] passes it on once it is known).
        let nonblocking = self.nonblocking();
        sys::set_nonblocking(target, nonblocking);
        if let Some(s) = &sock {
            s.set_nonblocking(nonblocking);
        }
        let me = self as *const Self as *const () as usize;
        let (mut any, mut failed) = (false, None);
        for (n, s) in fdtable::all() {
            if Arc::as_ptr(&s).cast::<()>() as usize != me {
                continue;
            }
            drop(s);
            // On through a failure: the other numbers still move.
            match fdtable::replace_if(n, me, self.bell.app, target, sock.clone()) {
                Ok(done) => any |= done,
                Err(e) => failed = Some(e),
            }
        }
        // The registrations made while it switched, given under the lock:
        // those from now on go to the outcome (`Socket::epoll_change`).
        {
            let mut g = lock(&self.st);
            g.epoll_given = true;
            if let Some(s) = &sock {
                for (epfd, reg) in std::mem::take(&mut g.epoll) {
                    epollwatch::follow(epfd, libc::EPOLL_CTL_ADD, reg, s);
                }
            }
        }
        match (any, failed, &sock) {
            (true, _, _) => Ok(()),
            (false, Some(e), _) => Err(e),
            // Every number closed meanwhile, perhaps after calls that went
            // on in the outcome (known to them before the numbers move): it
            // is closed as the program's close closes it, in order — its
            // bytes sent, then the end of the stream — not reset (the peer
            // read a reset where it had the program's answer and a clean
            // end: `ddp_stdio`'s policy case, under load).
            (false, None, Some(s)) => {
                s.add_ref();
                s.release();
                Ok(())
            }
            (false, None, None) => Err(libc::EBADF),
        }
    }

    /// Makes on the outcome what was asked meanwhile (under the state's
    /// lock `g`): every option kept on a managed socket (its own handling
    /// of each), those not forwarded on the plain TCP socket; the
    /// shutdowns.
    fn replay(&self, g: &mut State, sock: Option<&dyn Socket>) {
        for k in std::mem::take(&mut g.opts) {
            let (val, len) = (k.val.as_ptr().cast::<c_void>(), k.val.len() as socklen_t);
            match sock {
                Some(s) => {
                    s.setsockopt(k.level, k.name, val, len);
                }
                None if !k.forwarded && k.level != SOL_WARPSOCK => {
                    // SAFETY: the kept value, `len` bytes.
                    unsafe { real::setsockopt(self.kfd, k.level, k.name, val, len) };
                }
                None => {}
            }
        }
        let how = match std::mem::take(&mut g.shut) {
            1 => libc::SHUT_RD,
            2 => libc::SHUT_WR,
            3 => libc::SHUT_RDWR,
            _ => return,
        };
        match sock {
            Some(s) => {
                s.shutdown(how);
            }
            // SAFETY: shutdown of our own duplicate.
            None => unsafe {
                real::shutdown(self.kfd, how);
            },
        }
    }

    /// The waits begun on this socket end: a `poll` through [`Self::done`]
    /// (the interposer's poll then waits again through the outcome, as its
    /// `select` does: `Socket::file_change`), and a wait on the doorbell
    /// itself (a number the installation missed) finds it readable and
    /// writable.
    fn wake_waiters(&self) {
        // `woken` first: a wait that sees `done` readable then finds the
        // switch over (`Socket::file_change`: a `select` that woke for it
        // waits again through the outcome, not on `done` again); one that
        // looked before still hears the write.
        self.woken.store(true, Ordering::Release);
        let one: u64 = 1;
        // SAFETY: an 8-byte write to our own eventfd.
        unsafe { libc::write(self.done, (&one as *const u64).cast(), 8) };
        let mut g = lock(&self.st);
        self.bell.set_writable(true);
        self.bell.ring(&mut g.bells);
        drop(g);
        self.settled.notify_all();
    }

    /// Holds the switch, its client's Request come and still to be
    /// answered, until the program uses the connection, its process forks
    /// or `bound` passes ([`slot::hold`]); returns whether it was declined
    /// (a fork, or the last close).
    pub(super) fn hold_declined(&self, bound: std::time::Duration) -> bool {
        slot::hold(self.slot.0, self.slot.1, bound)
    }

    /// The program used the connection: a held switch goes on.
    fn used(&self) {
        slot::used(self.slot.0, self.slot.1, false);
    }

    /// Waits until the switch is over and its outcome names the numbers
    /// (the extended calls look the DDP socket up by its number).
    pub(super) fn wait_installed(&self) {
        self.used();
        let mut g = lock(&self.st);
        while !self.woken.load(Ordering::Acquire) {
            g = self
                .settled
                .wait(g)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
        }
    }

    /// `done`, for a wait that looked the program's number up and found
    /// this socket: while the switch runs, and after it if no number names
    /// this socket any more (`refs` 0: the look-up came before the
    /// installation moved them). Readable from the switch's end on: the
    /// wait wakes and looks the number up again, waiting through the
    /// outcome. The program's number alone would be the outcome's file
    /// waited on without the outcome's own wait (a DDP socket's input
    /// wakes a poll through its `wait_begin`): a switch that ended between
    /// the look-up and the wait's start — the one a poll's use of the
    /// connection let go (`Self::used`), at once — left the poll asleep to
    /// its timeout (a 1 s stall in 1 of ~4,000 connections of
    /// `bench-ddp-accept.sh`, session 39). `None` once over with a number
    /// still naming it (one the installation missed, or closed behind the
    /// table and opened again): `done` would wake every wait on that
    /// number at once, for good — a spin (review 40 item 2); the number's
    /// own file is the wait's (the missed doorbell is rung).
    fn change_ahead(&self) -> Option<c_int> {
        (!self.woken.load(Ordering::Acquire) || self.refs.load(Ordering::Acquire) == 0)
            .then_some(self.done)
    }

    /// The outcome, once the switch is over.
    fn outcome(&self) -> Option<Outcome> {
        lock(&self.st).outcome.clone()
    }

    /// The outcome, waited for (the switch ends within its deadlines).
    fn wait(&self) -> Outcome {
        let mut g = lock(&self.st);
        loop {
            if let Some(o) = &g.outcome {
                return o.clone();
            }
            g = self
                .settled
                .wait(g)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
        }
    }

    /// The outcome for `WARPSOCK_DDP_MODE`, `WARPSOCK_CRC` and the
    /// extended calls' look-up: now, or waited for on a blocking socket;
    /// `EAGAIN` on a non-blocking one (an event loop's call never waits
    /// for a slow or silent peer; the descriptor becomes writable when
    /// the switch is over).
    fn for_mode(&self) -> Result<Outcome, c_int> {
        self.used();
        match self.outcome() {
            Some(o) => Ok(o),
            None if self.nonblocking() => Err(libc::EAGAIN),
            None => Ok(self.wait()),
        }
    }

    /// The outcome for a data call: now, or waited for if the call
    /// blocks; `None`: the call fails with `EAGAIN`.
    fn for_data(&self, flags: c_int) -> Option<Outcome> {
        self.used();
        self.outcome().or_else(|| {
            (!self.nonblocking.load(Ordering::Relaxed) && flags & libc::MSG_DONTWAIT == 0)
                .then(|| self.wait())
        })
    }
}

impl Socket for SwitchingSock {
    fn kernel_fd(&self) -> c_int {
        self.kfd
    }

    fn never_shows(&self) -> i16 {
        crate::shim::socket::TCP_NEVER_SHOWS
    }

    fn connect(&self, addr: *const libc::sockaddr, len: socklen_t) -> c_int {
        if self.connecting.swap(false, Ordering::AcqRel) {
            return 0;
        }
        // SAFETY: forwarding the program's arguments to the kernel socket
        // (raw: no cancellation point inside the library): `EISCONN`.
        unsafe { sys::connect_raw(self.kfd, addr, len) }
    }

    fn demote_fd(&self) -> c_int {
        super::sock::dead_end(self.nonblocking())
    }

    fn managed_target(&self) -> Option<c_int> {
        Some(self.bell.app)
    }

    fn owner_pid(&self) -> i32 {
        self.pid
    }

    fn add_ref(&self) {
        self.refs.fetch_add(1, Ordering::AcqRel);
    }

    fn release(&self) {
        // The last one: the thread finds no number to install on, and the
        // connection ends with the thread's references; a held switch is
        // declined (nobody will read the connection: it ends plain).
        if self.refs.fetch_sub(1, Ordering::AcqRel) == 1 {
            slot::used(self.slot.0, self.slot.1, true);
        }
    }

    fn nonblocking(&self) -> bool {
        self.nonblocking.load(Ordering::Relaxed)
    }

    fn set_nonblocking(&self, on: bool) {
        self.nonblocking.store(on, Ordering::Relaxed);
        // A change that reached this socket after its outcome took the
        // flag (`install`) is the outcome's.
        match self.outcome() {
            Some(Outcome::Managed(s)) => s.set_nonblocking(on),
            Some(Outcome::Plain) => sys::set_nonblocking(self.kfd, on),
            None => {}
        }
    }

    fn set_async(&self, on: bool) {
        // The flag is on the file the number names (carried to the
        // outcome's by `install`, `shim::sigio`); a change that reached
        // this socket after its outcome was known is the outcome's too.
        if let Some(Outcome::Managed(s)) = self.outcome() {
            s.set_async(on);
        }
    }

    unsafe fn recvmsg(&self, msg: &mut msghdr, flags: c_int) -> isize {
        match self.for_data(flags) {
            // SAFETY: the caller's contract, passed on.
            Some(Outcome::Managed(s)) => unsafe { s.recvmsg(msg, flags) },
            // SAFETY: as above, on the TCP socket.
            Some(Outcome::Plain) => unsafe { sys::recvmsg_raw(self.kfd, msg, flags) },
            None => {
                set_errno(libc::EAGAIN);
                -1
            }
        }
    }

    unsafe fn sendmsg(&self, msg: &msghdr, flags: c_int) -> isize {
        {
            let g = lock(&self.st);
            if g.outcome.is_none() && g.shut & 2 != 0 {
                // The sending side shut meanwhile (made on the outcome):
                // `EPIPE` at once, as TCP's send after `SHUT_WR`, and
                // SIGPIPE unless `MSG_NOSIGNAL`; neither `EAGAIN` nor a
                // wait for the peer's switch.
                drop(g);
                if flags & libc::MSG_NOSIGNAL == 0 {
                    // SAFETY: raising SIGPIPE as a TCP send would (no
                    // lock held: the program's handler may `exit`).
                    warpsock_engine::asleep::unlocked(|| unsafe { libc::raise(libc::SIGPIPE) });
                }
                set_errno(libc::EPIPE);
                return -1;
            }
        }
        match self.for_data(flags) {
            // SAFETY: the caller's contract, passed on.
            Some(Outcome::Managed(s)) => unsafe { s.sendmsg(msg, flags) },
            // SAFETY: as above, on the TCP socket.
            Some(Outcome::Plain) => unsafe { sys::sendmsg_raw(self.kfd, msg, flags) },
            None => {
                set_errno(libc::EAGAIN);
                -1
            }
        }
    }

    fn setsockopt(&self, level: c_int, name: c_int, val: *const c_void, len: socklen_t) -> c_int {
        let msg_mode = (level, name) == (SOL_WARPSOCK, WARPSOCK_MSG_MODE);
        if level == SOL_WARPSOCK && !msg_mode {
            return match self.for_mode() {
                Ok(Outcome::Managed(s)) => s.setsockopt(level, name, val, len),
                Ok(Outcome::Plain) => plain_set(name, val, len),
                Err(e) => {
                    set_errno(e);
                    -1
                }
            };
        }
        if msg_mode && self.outcome().is_none() {
            // Kept and set on the outcome: an event loop that sets it
            // right after `accept` does not wait for a slow peer.
            let Some(v @ (0 | 1)) = super::int_arg(val, len) else {
                set_errno(libc::EINVAL);
                return -1;
            };
            lock(&self.st).msg_mode = v == 1;
        }
        let moved = msg_mode || opts::moved(level, name);
        let mut g = lock(&self.st);
        match &g.outcome {
            Some(Outcome::Managed(s)) => {
                let s = s.clone();
                drop(g);
                return s.setsockopt(level, name, val, len);
            }
            Some(Outcome::Plain) if msg_mode => {
                drop(g);
                return plain_set(name, val, len);
            }
            Some(Outcome::Plain) => {
                drop(g);
                // SAFETY: forwarding the program's arguments.
                return unsafe { real::setsockopt(self.kfd, level, name, val, len) };
            }
            None => {}
        }
        let n = len as usize;
        if n > OPT_LEN_MAX || (n > 0 && val.is_null()) {
            // Nothing the switch moves is this long: the TCP socket's own
            // answer for the others.
            drop(g);
            // SAFETY: forwarding the program's arguments.
            return unsafe { real::setsockopt(self.kfd, level, name, val, len) };
        }
        if moved && n < size_of::<c_int>() {
            set_errno(libc::EINVAL);
            return -1;
        }
        if !moved {
            // SAFETY: forwarding the program's arguments.
            let r = unsafe { real::setsockopt(self.kfd, level, name, val, len) };
            if r != 0 {
                return r;
            }
        }
        let bytes = if n == 0 {
            Vec::new()
        } else {
            // SAFETY: the program's value is readable for `len` bytes (not
            // null: checked above).
            unsafe { std::slice::from_raw_parts(val.cast::<u8>(), n) }.to_vec()
        };
        if let Some(k) = g
            .opts
            .iter_mut()
            .find(|k| (k.level, k.name) == (level, name))
        {
            k.val = bytes;
            k.forwarded = !moved;
            return 0;
        }
        if g.opts.len() >= OPTS_MAX {
            if !moved {
                // Set on the TCP socket already; not made again on a DDP
                // outcome.
                return 0;
            }
            drop(g);
            set_errno(libc::ENOBUFS);
            return -1;
        }
        g.opts.push(Kept {
            level,
            name,
            val: bytes,
            forwarded: !moved,
        });
        0
    }

    fn getsockopt(
        &self,
        level: c_int,
        name: c_int,
        val: *mut c_void,
        len: *mut socklen_t,
    ) -> c_int {
        if (level, name) == (SOL_WARPSOCK, WARPSOCK_MSG_MODE) {
            let g = lock(&self.st);
            if g.outcome.is_none() {
                return super::put_int(val, len, c_int::from(g.msg_mode));
            }
        }
        if level == SOL_WARPSOCK {
            return match self.for_mode() {
                Ok(Outcome::Managed(s)) => s.getsockopt(level, name, val, len),
                Ok(Outcome::Plain) => plain_get(name, val, len),
                Err(e) => {
                    set_errno(e);
                    -1
                }
            };
        }
        let g = lock(&self.st);
        match &g.outcome {
            Some(Outcome::Managed(s)) => {
                let s = s.clone();
                drop(g);
                return s.getsockopt(level, name, val, len);
            }
            Some(Outcome::Plain) => {}
            None => {
                let set = g
                    .opts
                    .iter()
                    .find(|k| !k.forwarded && (k.level, k.name) == (level, name));
                if let Some(k) = set {
                    return super::put_bytes(val, len, &k.val);
                }
            }
        }
        drop(g);
        // SAFETY: forwarding the program's arguments.
        unsafe { real::getsockopt(self.kfd, level, name, val, len) }
    }

    fn epoll_change(&self, epfd: c_int, op: c_int, reg: epollwatch::Reg) -> bool {
        let mut g = lock(&self.st);
        if !g.epoll_given {
            g.epoll.retain(|(e, r)| (*e, r.fd) != (epfd, reg.fd));
            if op != libc::EPOLL_CTL_DEL {
                g.epoll.push((epfd, reg));
            }
            return true;
        }
        if let Some(Outcome::Managed(o)) = g.outcome.clone() {
            drop(g);
            epollwatch::follow(epfd, op, reg, &o);
        }
        true
    }

    fn wait_begin(&self) -> Option<Wait> {
        self.used();
        self.change_ahead().map(|done| Wait {
            fds: vec![done],
            claim: Box::new(()),
            chunked: false,
        })
    }

    fn file_change(&self) -> Option<c_int> {
        self.change_ahead()
    }

    fn write_wait(&self) -> Option<c_int> {
        // A wait for room is a use too (a server that speaks first polls
        // for `POLLOUT` before its first write; review 40 item 3): the
        // doorbell, writable at the switch's end, is the wait's.
        self.used();
        None
    }

    fn wait_end(&self, _wait: Wait, _revents: &[i16]) -> i16 {
        // Nothing of its own to show: a wake-up by `done` is one for
        // nothing here, and the poll waits again through the outcome.
        0
    }

    fn ioctl(&self, req: c_ulong, arg: usize) -> c_int {
        match self.outcome() {
            Some(Outcome::Managed(s)) => s.ioctl(req, arg),
            // The bytes queued on the TCP socket are the switch's, not the
            // program's: nothing to read yet.
            None if req == libc::FIONREAD as c_ulong => {
                if arg == 0 {
                    set_errno(libc::EFAULT);
                    return -1;
                }
                // SAFETY: FIONREAD's argument is the program's int.
                unsafe { (arg as *mut c_int).write_unaligned(0) };
                0
            }
            // SAFETY: forwarding the program's arguments.
            _ => unsafe { real::ioctl(self.kfd, req, arg) },
        }
    }

    fn shutdown(&self, how: c_int) -> c_int {
        let bits = match how {
            libc::SHUT_RD => 1,
            libc::SHUT_WR => 2,
            libc::SHUT_RDWR => 3,
            _ => {
                set_errno(libc::EINVAL);
                return -1;
            }
        };
        let mut g = lock(&self.st);
        match &g.outcome {
            Some(Outcome::Managed(s)) => {
                let s = s.clone();
                drop(g);
                s.shutdown(how)
            }
            // SAFETY: forwarding the program's argument.
            Some(Outcome::Plain) => unsafe { real::shutdown(self.kfd, how) },
            None => {
                // Made on the outcome (`replay`): a shutdown does not wait
                // for a slow peer's switch.
                g.shut |= bits;
                0
            }
        }
    }

    fn settle_wait(&self) -> Result<(), c_int> {
        self.for_mode()?;
        self.wait_installed();
        Ok(())
    }

    fn dup_begin(&self) -> bool {
        let mut round = 0;
        loop {
            if self.installing.load(Ordering::SeqCst) {
                // Being installed (or done): the dup follows it, on the
                // outcome's file, unheld.
                while !self.installed.load(Ordering::SeqCst) {
                    sys::pause(round);
                    round = round.saturating_add(1);
                }
                return false;
            }
            self.dups.fetch_add(1, Ordering::SeqCst);
            if !self.installing.load(Ordering::SeqCst) {
                return true;
            }
            self.dups.fetch_sub(1, Ordering::SeqCst);
        }
    }

    fn dup_end(&self) {
        self.dups.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Marks the installation's end when dropped (its early returns too).
struct Installed<'a>(&'a SwitchingSock);

impl Drop for Installed<'_> {
    fn drop(&mut self) {
        self.0.installed.store(true, Ordering::SeqCst);
    }
}

impl Drop for SwitchingSock {
    fn drop(&mut self) {
        drop(self.held.take());
        sys::close(self.kfd);
        sys::close(self.done);
    }
}

mod late_busy;
mod opts;
mod pool;
mod slot;
mod start;
use opts::{plain_get, plain_set, Kept};
#[cfg(test)]
use slot::room;
pub(super) use slot::{
    settle_before_fork, under_way, used_all, AnswerTurn, DECLINES, HOLDS_LAPSED,
};
pub(super) use start::start;

pub(in crate::xsock) use late_busy::{hold_answers_for_fork, release_answers_after_fork};

/// In a forked child (its fork handler, the only thread): the parent's
/// switches and the threads they ran on are not the child's.
pub(super) fn forget_after_fork() {
    slot::forget_after_fork();
    pool::forget_after_fork();
    late_busy::forget_after_fork();
}

#[cfg(test)]
mod tests;
