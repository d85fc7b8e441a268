//! A DDP-mode socket's data calls as the interposed entry points make
//! them: the receive (a quiet socket's spin, else the full call), the
//! send, and how their errors and readiness reach the program (errno,
//! `SO_ERROR`, the doorbell's bells), and `shutdown`. The socket itself:
//! `xsock/sock.rs`.

use std::sync::atomic::Ordering;

use libc::c_int;
use warpsock_xsock::io::{Readiness, RecvFlags, Spun};

use super::{close, DdpSock};
use crate::shim::socket::{WAIT_FAILED, WAIT_HUNG_UP, WAIT_READABLE};
use crate::shim::sys::{set_errno, shutdown_ways};

/// Lock-free `EAGAIN`s of quiet sockets ([`DdpSock::recv_spin`]),
/// counted in builds with the test hooks only (`ddp_quiet_eagains`): the
/// tests see the preload take the fast path (review r22-c item 3).
#[cfg(feature = "test-hooks")]
pub(crate) static QUIET_EAGAINS: std::sync::atomic::AtomicU64 =
    std::sync::atomic::AtomicU64::new(0);

/// Blocking receives of quiet sockets, which spin on the engine's read
/// first when `WARPSOCK_BUSY_POLL_US` is set (`XSocket::recv_busy`),
/// counted in builds with the test hooks only (`ddp_busy_quiet`).
#[cfg(feature = "test-hooks")]
pub(crate) static BUSY_QUIET: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// The bytes a `MSG_TRUNC` receive takes and drops per round
/// ([`DdpSock::recv_discarding`]; on the heap: a program thread's stack
/// may be small).
const DISCARD_CHUNK: usize = 64 * 1024;

impl DdpSock {
    /// A receive with `MSG_TRUNC` (`flags`) of up to `len` bytes, as TCP
    /// answers it (tcp(7)): the bytes are dropped, not copied into the
    /// program's buffers, which may be null (a program drains a
    /// connection with `recv(fd, NULL, n, MSG_TRUNC)`); with `MSG_PEEK`
    /// too, how many of the `len` are there, none taken. Waits as the
    /// socket's receive waits for the first byte (`MSG_WAITALL`: for all
    /// `len`), then takes what is queued without waiting. Before, a null
    /// buffer was no buffer and the call returned 0: the end of stream to
    /// the program. In message mode the flag is the stream's: each
    /// message's bytes are dropped as a stream's.
    pub(super) fn recv_discarding(&self, len: usize, flags: c_int) -> isize {
        let flags = flags & !libc::MSG_TRUNC;
        let mut scratch = vec![0u8; len.clamp(1, DISCARD_CHUNK)];
        let mut eor = false;
        let first = self.recv_bufs(
            &mut [&mut scratch[..len.min(DISCARD_CHUNK)]],
            flags,
            &mut eor,
        );
        if first <= 0 || len <= DISCARD_CHUNK {
            return first;
        }
        if flags & libc::MSG_PEEK != 0 {
            // The queued bytes, without taking or copying them again.
            return len.min((first as usize).max(self.x.readable_bytes())) as isize;
        }
        let mut taken = first as usize;
        let waitall = flags & libc::MSG_WAITALL != 0;
        let more = if waitall {
            flags
        } else {
            flags | libc::MSG_DONTWAIT
        };
        let f = RecvFlags {
            peek: false,
            nonblocking: self.nonblocking_for(more),
            waitall,
        };
        while taken < len {
            let want = (len - taken).min(DISCARD_CHUNK);
            // Not through `recv_done`, which takes a failure's error: an
            // error or the end after some bytes ends the call with those
            // bytes, the error left pending for the next call, as TCP's
            // `sk_err` (`tcp_recvmsg` returns what it copied; diffuzz
            // seed 296: `POLLERR` was gone after such a drain).
            let (r, ready) =
                self.x
                    .recv_vectored_ready(&mut [&mut scratch[..want]], f, self.rcvtimeo.get());
            match r {
                Ok((k, _)) if k > 0 => {
                    self.reflect(ready);
                    taken += k;
                }
                _ if ready.readable => {
                    self.reflect_polled();
                    break;
                }
                _ => {
                    self.reflect(ready);
                    break;
                }
            }
        }
        taken as isize
    }

    /// A receive into null buffers only, of a nonzero length, without
    /// `MSG_TRUNC` (`flags`): as TCP's, whose copy into them faults once
    /// there is a byte to copy — it waits as the call's receive waits,
    /// then fails with `EFAULT` if a byte came (none taken), or returns
    /// what the receive returned without one: `EAGAIN`, a timeout, an
    /// error, 0 at the end of the stream. (It failed with `EFAULT` at once,
    /// where TCP's answers `EAGAIN` or 0.)
    pub(super) fn recv_into_null(&self, flags: c_int) -> isize {
        let mut one = [0u8; 1];
        let r = self.recv_bufs(&mut [&mut one[..]], flags | libc::MSG_PEEK, &mut false);
        if r > 0 {
            set_errno(libc::EFAULT);
            return -1;
        }
        r
    }

    pub(super) fn nonblocking_for(&self, flags: c_int) -> bool {
        flags & libc::MSG_DONTWAIT != 0 || self.nonblocking.load(Ordering::Relaxed)
    }

    /// A receive call into the program's non-empty buffers `bufs` (every
    /// form lands here: [`Socket::recvmsg`], [`Socket::recv_one`]); `eor`
    /// is set when it ends a message (message mode).
    ///
    /// A quiet socket's receive that would not block (a busy-polling
    /// program's spin) is the engine's read alone first
    /// ([`Self::recv_spin`]); every other goes straight on: a load and the
    /// mode here (the fast path inlined cost a blocking receive's frame ~9
    /// instructions, callgrind; issue 12). A blocking receive goes on even
    /// when the socket is quiet, which a straight send leaves it (a
    /// blocking ping-pong's every receive): `recv_spin`'s frame, only to
    /// go on, was ~25 instructions a receive.
    #[inline(always)]
    pub(super) fn recv_bufs(&self, bufs: &mut [&mut [u8]], flags: c_int, eor: &mut bool) -> isize {
        if self.x.quiet_now() && self.nonblocking_for(flags) {
            return self.recv_spin(bufs, flags, eor);
        }
        self.recv_full(bufs, flags, eor)
    }

    /// A busy-polling program's spin: a call that would not block
    /// (`recv_bufs` asked), of a quiet socket, is the engine's read alone
    /// ([`XSocket::recv_quiet`]):
    /// `EAGAIN` when it found nothing (no readiness to follow: nothing
    /// changed since the call that found the socket quiet reflected it),
    /// else the receive made under the same lock. (`MSG_OOB` and
    /// `MSG_ERRQUEUE` go on: `EINVAL`, `EAGAIN`.)
    #[inline(never)]
    pub(super) fn recv_spin(&self, bufs: &mut [&mut [u8]], flags: c_int, eor: &mut bool) -> isize {
        debug_assert!(self.nonblocking_for(flags));
        if flags & (libc::MSG_OOB | libc::MSG_ERRQUEUE) == 0 {
            let f = RecvFlags {
                peek: flags & libc::MSG_PEEK != 0,
                nonblocking: true,
                waitall: flags & libc::MSG_WAITALL != 0,
            };
            match self.x.recv_quiet(bufs, f) {
                Spun::Empty => {
                    #[cfg(feature = "test-hooks")]
                    QUIET_EAGAINS.fetch_add(1, Ordering::Relaxed);
                    set_errno(libc::EAGAIN);
                    return -1;
                }
                Spun::Done(r, ready) => return self.recv_done(r, ready, eor),
                Spun::Usual => {}
            }
        }
        self.recv_full(bufs, flags, eor)
    }

    /// [`Self::recv_bufs`]: the call under the socket's lock.
    #[inline(never)]
    pub(super) fn recv_full(&self, bufs: &mut [&mut [u8]], flags: c_int, eor: &mut bool) -> isize {
        if flags & (libc::MSG_OOB | libc::MSG_ERRQUEUE) != 0 {
            // `MSG_ERRQUEUE`: a DDP-mode socket's error queue is always
            // empty to the program (the engine socket's is the library's),
            // so `EAGAIN` as TCP's empty one — not the stream's bytes, which
            // the flag used to read (review r22-e item 2). Nothing is held
            // back: the engine socket's queue gets no entry of the
            // program's once the switch ended (the options that make them
            // are kept off it, `Kept`; the engine's polled reads drop
            // nothing there, `warpsock_engine`'s `read_polled` says why),
            // and `IP_RECVERR` queues none for an established TCP
            // connection either (ICMP errors are queued only while it
            // connects; what its absence there changes is when a hard
            // ICMP error fails the connection, `Kept`). A
            // program with transmit stamps on sees none, as over a device
            // without them (`Kept`).
            let oob = flags & libc::MSG_OOB != 0;
            set_errno(if oob { libc::EINVAL } else { libc::EAGAIN });
            return -1;
        }
        let f = RecvFlags {
            peek: flags & libc::MSG_PEEK != 0,
            nonblocking: self.nonblocking_for(flags),
            waitall: flags & libc::MSG_WAITALL != 0,
        };
        let timeo = self.rcvtimeo.get();
        // Readiness as the call left it, taken under its lock. A blocking
        // receive of a quiet socket spins on the engine's read first when
        // WARPSOCK_BUSY_POLL_US is set (`XSocket::recv_busy`).
        let (r, ready) = if !f.nonblocking && self.x.busy_polls() && self.x.quiet_now() {
            #[cfg(feature = "test-hooks")]
            BUSY_QUIET.fetch_add(1, Ordering::Relaxed);
            self.x.recv_busy(bufs, f, timeo)
        } else {
            self.x.recv_vectored_ready(bufs, f, timeo)
        };
        self.recv_done(r, ready, eor)
    }

    /// A receive's return: its result `r` and the readiness `ready` it
    /// left, followed by the bells.
    #[inline(always)]
    pub(super) fn recv_done(
        &self,
        r: std::io::Result<(usize, bool)>,
        ready: Readiness,
        eor: &mut bool,
    ) -> isize {
        match r {
            Ok((n, end)) => {
                self.reflect(ready);
                if n == 0 {
                    // The end of stream: maybe the peer's answer to the
                    // exit's close (review r25-c item 4).
                    close::park_if_exiting();
                }
                *eor = end;
                n as isize
            }
            Err(e) => {
                // That look counts a message's held part readable (it costs
                // the 8 B path nothing); after a receive that failed
                // (`EAGAIN`), the look a poll is given, which does not: the
                // doorbell is drained, and a level-triggered wait does not
                // wake again for the part (review r19-xdead item 6).
                if ready.readable {
                    self.reflect_polled();
                } else {
                    self.reflect(ready);
                }
                if !matches!(e.raw_os_error(), Some(libc::EAGAIN | libc::EINTR)) {
                    // The connection's end or failure: maybe the peer's
                    // answer to the exit's close (a reset; review r25-c
                    // item 4).
                    close::park_if_exiting();
                }
                if e.raw_os_error() != Some(libc::EAGAIN) && self.error_taken(&e) {
                    // As TCP's read once `sk_err` was reported: the end.
                    return 0;
                }
                Self::fail(&e)
            }
        }
    }

    /// Follows the readiness a poll is given (out of line: the receive's
    /// frame stays as it was on the 8 B path).
    #[cold]
    #[inline(never)]
    pub(super) fn reflect_polled(&self) {
        self.x.show_now(|r| self.reflect(r));
    }

    /// A send call of the program's non-empty buffers `bufs` (every form
    /// lands here: [`Socket::sendmsg`], [`Socket::send_one`]).
    pub(super) fn send_bufs(&self, bufs: &[&[u8]], flags: c_int) -> isize {
        if flags & libc::MSG_OOB != 0 {
            set_errno(libc::EOPNOTSUPP);
            return -1;
        }
        let nonblocking = self.nonblocking_for(flags);
        let timeo = self.sndtimeo.get();
        let (r, ready) = self.x.send_vectored_ready(bufs, nonblocking, timeo);
        // The call may have processed input another thread waits for.
        self.reflect(ready);
        match r {
            Ok(n) => n as isize,
            Err(mut e) => {
                if !matches!(e.raw_os_error(), Some(libc::EAGAIN | libc::EINTR)) {
                    // During the exit's closes, any failure but these
                    // (`EPIPE`, or `ECONNRESET`: the peer's answer to the
                    // close, taken in by the exit's steps) is the exit's
                    // doing, which over TCP no thread of the process sees:
                    // parked before the error is taken or a signal
                    // raised, as receives are (review r26-a item 4).
                    close::park_if_exiting();
                }
                if e.raw_os_error() != Some(libc::EAGAIN) && self.error_taken(&e) {
                    // As TCP's send once `sk_err` was reported.
                    e = std::io::Error::from_raw_os_error(libc::EPIPE);
                }
                match e.raw_os_error() {
                    Some(libc::EAGAIN) if nonblocking => {
                        // No credit: make the program's end unwritable
                        // until credits return (checked again at once, in
                        // case they just did).
                        // The gate and the engine's wait for writability
                        // change together, under the books' lock: the wait
                        // ends only where the gate opens (`Bell for
                        // DdpSock`), so a gate is never shut while nothing
                        // processes the credits that would open it.
                        {
                            // Not once writing is shut: a `shutdown`
                            // between this send's `EAGAIN` and here
                            // opened the gate for good (review r21-b
                            // item 3).
                            let mut g = self.inner.lock();
                            if !g.write_gated && !g.write_shut {
                                self.bell.set_writable(false);
                                g.write_gated = true;
                                self.x.set_writable_wait(true);
                            }
                        }
                        // Credits come back with input: processed while
                        // the program waits for writability (the watch is
                        // on from this round on).
                        self.x.show_after_round(|r| self.reflect(r));
                    }
                    Some(libc::EPIPE) if flags & libc::MSG_NOSIGNAL == 0 => {
                        // Marked as a sleep with no lock held: the
                        // program's handler may call `exit`, which then
                        // closes the sockets as from outside the library
                        // (`at_exit`; TCP raises it outside any lock).
                        // SAFETY: raising SIGPIPE as a TCP send would.
                        warpsock_engine::asleep::unlocked(|| unsafe { libc::raise(libc::SIGPIPE) });
                    }
                    _ => {}
                }
                Self::fail(&e)
            }
        }
    }

    /// Whether a call's failure `e` is the connection's error
    /// ([`XSocket::error`]) reported before; marks it reported. The
    /// library's error stays (the engine's and the extended calls' state),
    /// but TCP reports `sk_err` once, to `SO_ERROR` or the read or send
    /// that meets it (`sock_error` clears it), and then a read returns 0
    /// and a send fails with `EPIPE` (review r22-c item 4). Out of line:
    /// only failures other than `EAGAIN` get here.
    #[cold]
    #[inline(never)]
    pub(super) fn error_taken(&self, e: &std::io::Error) -> bool {
        match self.x.error() {
            Some((errno, _)) if e.raw_os_error() == Some(errno) => self.take_error(),
            _ => false,
        }
    }

    /// Marks the connection's error reported to the program; returns
    /// whether it was before. `POLLERR` goes with it, as TCP's once
    /// `sk_err` was read: under the books' lock, so that a look applied
    /// meanwhile ([`Follow::reflect`], which raises it) cannot raise it
    /// again after this.
    pub(super) fn take_error(&self) -> bool {
        let mut g = self.inner.lock();
        let was = std::mem::replace(&mut g.error_taken, true);
        if !was && g.failed {
            self.bell.clear_error();
        }
        was
    }

    /// `SO_ERROR`: the connection's error, once (as [`Self::error_taken`]),
    /// after a round that takes in what arrived — never the engine's TCP
    /// socket's (the kernel clears it as it reports it: the engine would
    /// see a reset as a clean end; review r22-c item 4).
    pub(super) fn so_error(&self) -> c_int {
        self.x.show_after_round(|r| self.reflect(r));
        match self.x.error() {
            Some((errno, _)) if !self.take_error() => errno,
            _ => 0,
        }
    }

    /// What a `poll`'s wait shows on the program's descriptor for look
    /// `r` ([`Socket::wait_end`]): readable, or, once the connection is
    /// finished both ways, the hang-up's bits — with `POLLERR` while its
    /// error is pending — which the doorbell shows only from the look
    /// applied here on (the real call saw it before: a reset a direct
    /// `poll`'s round took in showed `POLLIN` alone, where TCP's wake-up
    /// shows `POLLERR`, `POLLHUP` and `POLLRDHUP` too).
    #[inline(always)]
    pub(in crate::xsock) fn shown(&self, r: Readiness) -> i16 {
        if r.hup {
            return self.shown_hung_up(r);
        }
        if r.readable {
            readable_bits(r)
        } else {
            0
        }
    }

    #[cold]
    #[inline(never)]
    pub(super) fn shown_hung_up(&self, r: Readiness) -> i16 {
        // The connection finished both ways (or failed) during the exit:
        // the peer's answer to the exit's close, which TCP's process never
        // sees — the `poll` waits for the process's end instead (review
        // r25-c item 4; the doorbell's waiters see nothing either: `Bell
        // for DdpSock`).
        close::park_if_exiting();
        self.reflect(r);
        let g = self.inner.lock();
        if g.failed && !g.error_taken {
            WAIT_FAILED
        } else if g.hung_up {
            WAIT_HUNG_UP
        } else if r.readable {
            readable_bits(r)
        } else {
            0
        }
    }

    /// `shutdown(2)` ([`Socket::shutdown`]).
    pub(super) fn shutdown_call(&self, how: c_int) -> c_int {
        let Some((rd, wr)) = shutdown_ways(how) else {
            return -1;
        };
        // TCP's CLOSE answers `ENOTCONN`, its shutdown still taken
        // (Linux's `inet_shutdown` sets `sk_shutdown` before it returns
        // the error; a later poll shows `POLLHUP`).
        let closed = self.x.tcp_closed();
        self.x.shutdown(rd, wr);
        if wr {
            // A send now fails at once (`EPIPE`), and TCP's poll reports
            // `POLLOUT` from here on: a gate shut by an earlier `EAGAIN`
            // opens (no writable look would ever open it: writability
            // follows credits, which a shut end no longer spends), and
            // the wait for writability ends with it (review r21-send
            // item 2: left on, the progress thread woke for every arrival
            // of the connection's life).
            let mut g = self.inner.lock();
            g.write_shut = true;
            if g.write_gated {
                crate::xsock::follow::Bell::set_writable(self, true);
                g.write_gated = false;
            }
        }
        self.x.show_after_round(|r| self.reflect(r));
        if closed {
            set_errno(libc::ENOTCONN);
            return -1;
        }
        0
    }

    pub(super) fn fail(e: &std::io::Error) -> isize {
        set_errno(e.raw_os_error().unwrap_or(libc::EIO));
        -1
    }
}

/// A readable socket's poll bits: `POLLIN`, with `POLLRDHUP` once the
/// peer ended its stream (TCP's poll shows it from the FIN on: an event
/// loop's sign of a half-closed connection; it was left out).
#[inline(always)]
fn readable_bits(r: Readiness) -> i16 {
    if r.rdhup {
        WAIT_READABLE | libc::POLLRDNORM | libc::POLLRDHUP
    } else {
        WAIT_READABLE
    }
}
