//! How long an exit (or `exec`, `_exit`) waits for the bytes DDP sockets
//! still hold in their send buffers: as `XSocket::close`'s linger, the
//! bound starts again while bytes leave, so a reader slower than the bound
//! still gets everything a writer sent and exited after — with send
//! buffering on by default, up to the bound's worth per socket sits in the
//! process (review r21-send #3: a fixed 2 s lost the tail of an 8 MiB
//! stream to a 300 KB/s reader, then reset it). Progress is the bytes
//! posted out of the buffers, which only grows (`posted_bytes`), not the
//! level of what is buffered, which another thread still writing holds up
//! (review r21-b #4). An overall cap ends a wait that progresses for ever
//! (a trickling reader): [`CAP_ROUNDS`] bounds — for `exec` too.
//!
//! Not covered (stated limit, review r21-b #4): bytes already posted to the
//! engine and held in its backlog behind a full kernel buffer; at exit
//! they are lost.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::shim::sys;

/// The longest wait, in bounds: past it the exit gives up even while
/// bytes still leave (then the peers of what is left are reset).
pub(crate) const CAP_ROUNDS: u32 = 15;

/// What a wait looks at: whether anything is still to leave, and the
/// progress made so far (a count that only grows while bytes leave).
pub(crate) trait Pending {
    fn busy(&self) -> bool;
    fn progress(&self) -> u64;
}

/// Waits while `p` is busy: until `bound` has passed with no progress (no
/// growth of [`Pending::progress`] since the last), or `CAP_ROUNDS` bounds
/// in all. `now` and `pause` are the clock and the wait between looks (a
/// test's fake ones). Returns whether it ended idle.
pub(crate) fn wait(
    p: &impl Pending,
    bound: Duration,
    now: impl Fn() -> Instant,
    pause: impl Fn(),
) -> bool {
    let start = now();
    let cap = start + bound * CAP_ROUNDS;
    let mut deadline = start + bound;
    let mut best = p.progress();
    loop {
        if !p.busy() {
            return true;
        }
        let t = now();
        let made = p.progress();
        if made > best {
            best = made;
            deadline = t + bound;
        }
        if t >= deadline.min(cap) {
            return false;
        }
        pause();
    }
}

/// [`wait`] on the process's send buffers while `busy`, on the real
/// clock, looking every 2 ms.
pub(crate) fn wait_for(bound: Duration, busy: impl Fn() -> bool) -> bool {
    struct P<F>(F);
    impl<F: Fn() -> bool> Pending for P<F> {
        fn busy(&self) -> bool {
            (self.0)()
        }
        fn progress(&self) -> u64 {
            warpsock_xsock::io::posted_bytes()
        }
    }
    wait(&P(busy), bound, Instant::now, || {
        std::thread::sleep(Duration::from_millis(2));
    })
}

/// Sockets whose close is still letting bytes leave.
pub(super) static CLOSING: AtomicUsize = AtomicUsize::new(0);

/// In a forked child: the parent's closes are not the child's to wait for
/// (their threads are the parent's; review r21-send #8).
pub(crate) fn forget_closing_after_fork() {
    CLOSING.store(0, Ordering::Release);
}

/// Waits for closing sockets (exit, exec) — `bound` without progress,
/// restarted while buffered bytes leave (this module) — and for the
/// bytes send calls left in the send buffers of sockets not closed (the
/// progress thread sends them as credits come back; TCP's kernel would
/// send them after the process).
pub(crate) fn linger(bound: Duration) {
    linger_while(bound, || {
        CLOSING.load(Ordering::Acquire) > 0 || warpsock_xsock::io::buffered_bytes() > 0
    });
}

/// [`linger`] for the send buffers' bytes alone (`_exit`).
pub(crate) fn linger_buffered(bound: Duration) {
    linger_while(bound, || warpsock_xsock::io::buffered_bytes() > 0);
}

/// Waits while `busy`, the bound starting again while buffered bytes
/// leave (review r21-send #3).
fn linger_while(bound: Duration, busy: impl Fn() -> bool) {
    wait_for(bound, busy);
}

/// Starts the thread that finishes a close in the background, with every
/// asynchronous signal blocked (as the reactor's thread): a signal the
/// program directs at the process must reach one of the program's own
/// threads, whose blocked calls it is meant to interrupt — never this
/// library thread, which may linger for seconds.
pub(super) fn spawn_closer(
    f: impl FnOnce() + Send + 'static,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    sys::with_async_signals_blocked(|| {
        std::thread::Builder::new()
            .name("warpsock-close".into())
            .spawn(f)
    })
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::*;

    /// A fake clock and buffer: each pause moves the clock by `step`,
    /// posts `drain` bytes (to the last) and, if `refill`, buffers as many
    /// again (another thread still writing: the level stays).
    struct Fake {
        t: Cell<Instant>,
        left: Cell<usize>,
        posted: Cell<u64>,
        step: Duration,
        drain: usize,
        refill: bool,
        pauses: Cell<u32>,
    }

    impl Pending for Fake {
        fn busy(&self) -> bool {
            self.left.get() > 0
        }
        fn progress(&self) -> u64 {
            self.posted.get()
        }
    }

    fn run(left: usize, drain: usize, step_ms: u64, refill: bool) -> (bool, Duration, u32) {
        let f = Fake {
            t: Cell::new(Instant::now()),
            left: Cell::new(left),
            posted: Cell::new(0),
            step: Duration::from_millis(step_ms),
            drain,
            refill,
            pauses: Cell::new(0),
        };
        let start = f.t.get();
        let idle = wait(
            &f,
            Duration::from_millis(100),
            || f.t.get(),
            || {
                f.t.set(f.t.get() + f.step);
                let n = f.drain.min(f.left.get());
                f.posted.set(f.posted.get() + n as u64);
                if !f.refill {
                    f.left.set(f.left.get() - n);
                }
                f.pauses.set(f.pauses.get() + 1);
            },
        );
        (idle, f.t.get() - start, f.pauses.get())
    }

    /// Bytes leave more slowly than the bound allows in all (10 steps of
    /// 50 ms, a 100 ms bound) but steadily: the wait goes on to the end.
    #[test]
    fn a_wait_while_bytes_leave_starts_the_bound_again() {
        let (idle, took, _) = run(10, 1, 50, false);
        assert!(idle, "every byte left");
        assert_eq!(took, Duration::from_millis(500));
    }

    /// No byte leaves: the wait ends after the bound.
    #[test]
    fn a_wait_without_progress_ends_after_the_bound() {
        let (idle, took, _) = run(10, 0, 10, false);
        assert!(!idle);
        assert_eq!(took, Duration::from_millis(100));
    }

    /// Bytes trickle out for ever (a byte per 10 ms out of very many): the
    /// cap ends the wait.
    #[test]
    fn a_trickle_ends_at_the_cap() {
        let (idle, took, _) = run(usize::MAX, 1, 10, false);
        assert!(!idle);
        assert_eq!(took, Duration::from_millis(100) * CAP_ROUNDS);
    }

    /// Bytes leave while another thread keeps the buffered level where it
    /// was: still progress (a level-based wait gave up after one bound;
    /// review r21-b #4), so the wait goes on to the cap.
    #[test]
    fn bytes_leaving_under_a_level_held_up_is_progress() {
        let (idle, took, _) = run(10, 1, 50, true);
        assert!(!idle);
        assert_eq!(took, Duration::from_millis(100) * CAP_ROUNDS);
    }

    /// Nothing to wait for: no pause.
    #[test]
    fn nothing_buffered_returns_at_once() {
        assert_eq!(run(0, 0, 10, false), (true, Duration::ZERO, 0));
    }
}

#[cfg(test)]
mod closer_tests {
    use super::*;

    fn blocked(sig: libc::c_int) -> bool {
        // SAFETY: reads the calling thread's mask into a zeroed set.
        unsafe {
            let mut cur: libc::sigset_t = std::mem::zeroed();
            libc::pthread_sigmask(libc::SIG_BLOCK, std::ptr::null(), &mut cur);
            libc::sigismember(&cur, sig) == 1
        }
    }

    #[test]
    fn the_close_thread_blocks_asynchronous_signals_and_the_caller_keeps_its_mask() {
        let before = [libc::SIGTERM, libc::SIGINT, libc::SIGALRM].map(blocked);
        let (tx, rx) = std::sync::mpsc::channel();
        let h = spawn_closer(move || {
            let seen = [libc::SIGTERM, libc::SIGINT, libc::SIGALRM, libc::SIGSEGV].map(blocked);
            tx.send(seen).expect("the test waits");
        })
        .expect("a thread");
        h.join().expect("the closer ran");
        let [term, int, alrm, segv] = rx.recv().expect("the closer reported");
        assert!(term && int && alrm, "asynchronous signals blocked");
        assert!(!segv, "faults stay the thread's own");
        assert_eq!(
            [libc::SIGTERM, libc::SIGINT, libc::SIGALRM].map(blocked),
            before
        );
    }
}
