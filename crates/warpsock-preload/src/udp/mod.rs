//! The UDP offload: UDP sockets of unmodified programs carried over TCP
//! connections (what the crate documentation describes), one kind of
//! managed socket on the shared infrastructure ([`crate::shim`]).
//!
//! | module | what it does |
//! |---|---|
//! | [`core`] | the sans-IO protocol logic: wire format, connection phases, send and receive buffers, routes, policy |
//! | [`config`], [`stats`] | environment configuration; counters printed with `WARPSOCK_STATS=1` |
//! | [`sock`] | an offloaded socket: hidden kernel UDP socket, doorbell, receive queue, routes; the progress thread's entry points |
//! | [`listen`] | the TCP listener of a bound port, accepting, route adoption |
//! | [`send`], [`recv`], [`serve`] | the send and receive calls; receive calls served from the connections' buffers |
//! | [`gso`] | the GSO send path and the GRO receive path |
//! | [`conn`], [`events`] | one TCP connection: the I/O driver of the core, its readiness and timers |
//! | [`park`] | connections left to the next receive call (no `epoll_ctl` per round trip) |
//!
//! [`UDP`] is the [`Kind`] the interposition layer knows: UDP sockets are
//! candidates from `socket()`, and are adopted when they bind an eligible
//! port or talk to an eligible destination.

pub(crate) mod config;
mod conn;
pub(crate) mod core;
mod events;
#[cfg(test)]
mod forked;
mod gso;
mod listen;
mod park;
mod recv;
mod send;
mod serve;
mod sock;
pub(crate) mod stats;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicI32, Ordering};

use libc::{c_int, c_ulong, c_void, msghdr, sockaddr, socklen_t};

use crate::shim::socket::{Adoption, Kind, Socket, Wait};
use crate::shim::{reactor, sys};
use sock::Sock;

/// In a child made by `fork` (its fork handler, the only thread): the
/// lists of parked connections and of sockets holding datagrams are the
/// parent's; the child starts its own ([`park::forget_after_fork`],
/// `recv::held::forget_after_fork`).
pub(crate) fn after_fork_child() {
    park::forget_after_fork();
    recv::held::forget_after_fork();
}

/// The UDP offload kind.
pub(crate) struct Udp;

/// The UDP offload kind, as the interposition layer lists it.
pub(crate) static UDP: Udp = Udp;

/// The process the library was loaded into (a forked child inherits the
/// value and so can tell it is one): only it prints the counters at
/// `_exit`.
static MAIN_PID: AtomicI32 = AtomicI32::new(0);

impl Kind for Udp {
    fn enabled(&self) -> bool {
        config::get().enabled
    }

    fn wants(&self, domain: c_int, ty: c_int, protocol: c_int) -> bool {
        (domain == libc::AF_INET || domain == libc::AF_INET6)
            && ty & 0xf == libc::SOCK_DGRAM
            && (protocol == 0 || protocol == libc::IPPROTO_UDP)
    }

    fn bound(&self, fd: c_int, addr: SocketAddr) {
        // Port 0 asked the kernel to pick one: the one it picked counts.
        let port = match addr.port() {
            0 => sys::local_addr(fd).map_or(0, |a| a.port()),
            p => p,
        };
        let cfg = config::get();
        if cfg.policy.port_ok(port) {
            if let Ok(s) = Sock::transpose(fd) {
                if cfg.mode.tcp() {
                    s.listen();
                }
            }
        }
    }

    fn adopt(&self, fd: c_int, dest: SocketAddr) -> Adoption {
        let bcast = sys::get_int(fd, libc::SOL_SOCKET, libc::SO_BROADCAST).is_some_and(|v| v != 0);
        if !config::get().policy.dest_ok(&dest, bcast) {
            return Adoption::NotThis;
        }
        match Sock::transpose(fd) {
            Ok(s) => Adoption::Adopted(s),
            Err(_) => Adoption::Never,
        }
    }

    fn needs_hooks(&self) -> bool {
        let cfg = config::get();
        cfg.enabled || cfg.stats
    }

    fn loaded(&self) {
        // SAFETY: getpid has no preconditions.
        MAIN_PID.store(unsafe { libc::getpid() }, Ordering::Relaxed);
    }

    fn before_wait(&self) {
        park::release_all();
        recv::announce_held();
    }

    fn before_exec(&self) {
        reactor::linger(config::get().linger);
    }

    fn at_exit(&self, over: crate::shim::guard::ExitOver) {
        // An exit over a call of this thread that may hold a lock (a
        // signal handler's `exit`): no linger — its round allocates and
        // takes the reactor's locks, either of which can wait for ever on
        // a lock the interrupted call holds (malloc's, seen). The
        // datagrams still queued are lost, as a UDP socket's at a crash.
        // The report takes neither (`stats::print_report`).
        if over == crate::shim::guard::ExitOver::Locks {
            if config::get_if_read().is_some_and(|c| c.stats) {
                stats::print_report();
            }
            return;
        }
        let cfg = config::get();
        reactor::linger(cfg.linger);
        if cfg.stats {
            stats::print_report();
        }
    }

    /// `_exit`/`_Exit`: the exit handlers do not run, so flush here, briefly
    /// (`WARPSOCK_EXIT_LINGER_MS`), and print the counters; but only in the
    /// process that owns the connections. A forked child has forgotten the
    /// parent's reactor (nothing to flush, and its copies of the queues are
    /// never sent, so nothing is sent twice); a vforked child shares the
    /// parent's memory and is told apart by its pid: it neither waits nor
    /// prints.
    fn exit_flush(&self, over: crate::shim::guard::ExitOver) {
        // SAFETY: getpid has no preconditions.
        let main = MAIN_PID.load(Ordering::Relaxed) == unsafe { libc::getpid() };
        // Over a stretch that may hold a lock: the counters alone (the
        // linger takes the reactor's locks and allocates, as at `exit`).
        if over == crate::shim::guard::ExitOver::Locks {
            if main && config::get_if_read().is_some_and(|c| c.stats) {
                stats::print_report();
            }
            return;
        }
        let cfg = config::get();
        if !cfg.enabled && !cfg.stats {
            return;
        }
        if reactor::current().is_some_and(|e| !e.is_owner()) {
            stats::inc(&stats::STATS.exit_child_skips);
            return;
        }
        if reactor::linger(cfg.exit_linger.min(cfg.linger)) {
            stats::inc(&stats::STATS.exit_flushes);
        }
        if cfg.stats && main {
            stats::print_report();
        }
    }
}

impl Socket for Sock {
    fn owner_pid(&self) -> i32 {
        self.pid
    }

    fn kernel_fd(&self) -> c_int {
        self.udp
    }

    fn add_ref(&self) {
        Self::add_ref(self);
    }

    fn release(&self) {
        Self::release(self);
    }

    fn nonblocking(&self) -> bool {
        self.nonblocking.load(Ordering::Relaxed)
    }

    fn set_nonblocking(&self, on: bool) {
        self.nonblocking.store(on, Ordering::Relaxed);
    }

    unsafe fn recvmsg(&self, msg: &mut msghdr, flags: c_int) -> isize {
        // SAFETY: the caller's contract.
        unsafe { Self::recvmsg(self, msg, flags) }
    }

    unsafe fn sendmsg(&self, msg: &msghdr, flags: c_int) -> isize {
        // SAFETY: the caller's contract.
        unsafe { Self::sendmsg(self, msg, flags) }
    }

    fn connect(&self, addr: *const sockaddr, len: socklen_t) -> c_int {
        Self::connect(self, addr, len)
    }

    fn setsockopt(&self, level: c_int, name: c_int, val: *const c_void, len: socklen_t) -> c_int {
        Self::setsockopt(self, level, name, val, len)
    }

    fn shutdown(&self, how: c_int) -> c_int {
        Self::shutdown(self, how)
    }

    fn wait_begin(&self) -> Option<Wait> {
        Self::wait_begin(self)
    }

    fn wait_end(&self, wait: Wait, revents: &[i16]) -> i16 {
        if Self::wait_end(self, wait, revents) {
            crate::shim::socket::WAIT_READABLE
        } else {
            0
        }
    }

    fn poll_alone(
        &self,
        fds: &mut [libc::pollfd],
        at: usize,
        left: Option<std::time::Duration>,
        wait: crate::shim::socket::PollCall<'_>,
    ) -> Option<c_int> {
        Self::poll_alone(self, fds, at, left, wait)
    }

    fn write_wait(&self) -> Option<c_int> {
        Self::write_wait(self)
    }

    fn ioctl(&self, req: c_ulong, arg: usize) -> c_int {
        match req {
            libc::FIONREAD if arg != 0 => {
                let n = self.next_size();
                // SAFETY: FIONREAD's argument is an int out-pointer.
                unsafe { *(arg as *mut c_int) = n as c_int };
                0
            }
            // SAFETY: forwarding to the kernel socket.
            _ => unsafe { crate::shim::real::ioctl(self.udp, req, arg) },
        }
    }
}
