//! A busy-polling receive's empty spin without the socket's lock (issue
//! 12): a non-blocking receive that finds nothing costs the preload's entry,
//! one atomic load and one `ppoll` of the engine's TCP socket (~210 user
//! instructions, callgrind), not the short round of `io/wait.rs` (~950:
//! the lock, the engine's lock and its socket read, the watch's rearm).
//! Host TCP's empty spin is the libc call and one system call (~14); every
//! spin longer than that delays seeing the answer by half a spin on
//! average, on each side, every round trip (BENCHMARKS §6, session 22).
//! The first spin after a call that took the lock (a ping-pong's send)
//! still makes its round, which finds the socket quiet.
//!
//! `XSocket::quiet` says that nothing but bytes (EOF, an error) on the
//! engine's TCP socket can make a receive return anything else than
//! `EAGAIN`. It is set by an empty round (`XSocket::set_quiet`) under
//! the socket's lock, when the engine's round was its short empty one
//! ([`warpsock_engine::Cq::poll_news_idle`]: nothing staged, held, reported,
//! queued for output or completed; the queue pair alone in its context),
//! the socket's end of the round was its rearm alone (`settled`: no
//! event, no asynchronous operation in flight, no control message owed)
//! and the books hold nothing for a reader, nor an end, an error or a
//! shut reading side, with no other thread in the engine (`driving`). It
//! is cleared by every take of the lock (`XSocket::lock`, and the
//! condition variable's re-take in `wait_inner`): every writer of what it
//! sums up — a send, a post, a shutdown, a round of the progress thread,
//! a waiting call's engine round — takes the lock first, so no change can
//! happen while it is set. Looks that write nothing (a vectored receive's
//! readiness after its round, `readiness_now`, `readable_bytes`) take it
//! with `XSocket::lock_look`, which leaves the flag (review r22-c item 2).
//!
//! A receive that sees it set polls the engine's socket (`ppoll`, not a
//! peeking `recv`: a peek that meets a reset reports it and clears the
//! socket's error, which the engine's read would then miss) and returns
//! `EAGAIN` when nothing is there; anything there — bytes, EOF, an error
//! — and the call goes the usual way, which reads it. A thread that
//! clears the flag concurrently may be read late (relaxed), but only by a
//! call that overlaps its take of the lock, and that call's `EAGAIN` is
//! then the answer of a receive made before it: whatever the program saw
//! of that thread's work (a bell, a returned read) happens after its
//! clear, so the program's next receive sees the flag down.
//!
//! No bound on the lock-free answers in a row (as `FULL_ROUND` bounds the
//! short rounds): the flag is down whenever any of its inputs may change,
//! and a bound would hide a missing term from the tests, which then pass
//! by waiting (`tests/spin.rs` spins through [`XSocket::recv_would_block`]
//! as the preload does).

use std::sync::atomic::Ordering;

use super::socket::{State, XSocket};
use super::sys;

impl XSocket {
    /// A non-blocking receive's answer without the lock: `true` (the call
    /// returns `EAGAIN`) when the socket is quiet and its engine's TCP
    /// socket has nothing to read, no end and no error. `false`: make the
    /// receive as usual (it may still find nothing). The caller must make
    /// a receive that would not block, into a non-empty buffer.
    #[inline]
    pub fn recv_would_block(&self) -> bool {
        self.quiet.load(Ordering::Acquire) && self.engine_socket_empty()
    }

    /// Whether the socket was quiet at this look (one relaxed load): a
    /// caller's hint that [`Self::recv_would_block`] may say yes, to keep
    /// every other receive's path as it was.
    #[inline(always)]
    pub fn quiet_now(&self) -> bool {
        self.quiet.load(Ordering::Relaxed)
    }

    /// The engine's TCP socket has nothing to read, no end and no error.
    /// Out of line: inlined, the system call's registers and frame cost
    /// every blocking receive of the preload ~9 instructions (callgrind).
    #[inline(never)]
    fn engine_socket_empty(&self) -> bool {
        sys::nothing_to_read(self.tcp_fd)
    }

    /// At the end of an empty round (the call holds the lock `st`, has
    /// just made the round, and it processed nothing): marks the socket
    /// quiet when nothing but the engine's TCP socket can change what a
    /// receive returns (see the module's docs for each term).
    #[inline]
    pub(crate) fn set_quiet(&self, st: &State) {
        let idle = st.news.is_some_and(|n| !n.events && n.backlog == 0);
        if idle
            && st.idle_round
            && !st.driving
            && st.residue_off >= st.residue.len()
            && st.s.readable() == 0
            && !st.s.eof()
            && !st.s.has_output()
            && !st.s.owes_msg()
            && !st.shut_rd
            && st.error.is_none()
            && !st.peer_closed
            && st.retargeted.is_empty()
            && !st.aio.in_flight()
            && st.deferred.is_none()
        {
            self.quiet.store(true, Ordering::Relaxed);
        }
    }
}
