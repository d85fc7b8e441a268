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
//! The wait covers the bytes already posted to the engine too, which it
//! holds in its backlog behind a full kernel send buffer (up to the credit
//! window; `Qp::send_backlog`): the progress thread writes them as the
//! kernel drains, and the kernel would end the stream cleanly after a
//! short one if the process ended first (review r21-b #4). Progress
//! counts those bytes entering the kernel as well ([`Exit`]); once the
//! wait gives up, the exit resets the connections whose engines still
//! hold bytes, as those with buffered bytes (`census::reset_backlogged`).
//! Bytes in the kernel's own send queue are the kernel's to send, as for
//! TCP — but for the closes `_exit` waits for, whose engines' sockets the
//! process's end closes: their bytes the peers' kernels acknowledge, as
//! the exit's looks see them, are progress too ([`moved`]).

use std::cell::Cell;
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

/// The live sockets' engines as an exit sees them (`census::engine_backlogs`):
/// the bytes held behind full kernel send buffers, and the bytes the
/// kernels accepted so far, summed.
pub(crate) type Engines = fn() -> (u64, u64);

/// What an exit waits for: `busy` (the send buffers, closes under way) or
/// bytes in the engines' backlogs; progress is `posted` ([`moved`]: the
/// bytes posted out of the send buffers, and the closes' bytes
/// acknowledged) plus the growth of the bytes the kernels accepted from
/// the engines. That sum drops when a socket leaves the set (closed meanwhile):
/// only growth counts, so a drop is no progress and hides none after it.
struct Exit<B, E> {
    busy: B,
    engines: E,
    posted: fn() -> u64,
    last: Cell<u64>,
    grown: Cell<u64>,
}

impl<B: Fn() -> bool, E: Fn() -> (u64, u64)> Exit<B, E> {
    fn new(busy: B, engines: E, posted: fn() -> u64) -> Self {
        let last = Cell::new(engines().1);
        Self {
            busy,
            engines,
            posted,
            last,
            grown: Cell::new(0),
        }
    }
}

impl<B: Fn() -> bool, E: Fn() -> (u64, u64)> Pending for Exit<B, E> {
    fn busy(&self) -> bool {
        (self.busy)() || (self.engines)().0 > 0
    }
    fn progress(&self) -> u64 {
        let w = (self.engines)().1;
        let last = self.last.replace(w);
        if w > last {
            self.grown.set(self.grown.get() + (w - last));
        }
        (self.posted)() + self.grown.get()
    }
}

/// The exit's progress that only grows, besides the engines' writes: the
/// bytes posted out of the send buffers, and the bytes of the closes
/// waited for that their peers' kernels acknowledged, as the exit's looks
/// see them (`sock::close::acked`). Without the latter, a close's tail
/// acknowledged at a steady pace on a slow link, every byte out of the
/// library, was no progress: `_exit`'s bound ran out and the tail was
/// reset (review r28-e item 3).
pub(crate) fn moved() -> u64 {
    warpsock_xsock::io::posted_bytes() + super::sock::close::acked()
}

/// [`wait`] while `busy` or the engines hold bytes ([`Exit`]), on the real
/// clock, looking every 2 ms.
pub(crate) fn wait_for(bound: Duration, busy: impl Fn() -> bool, engines: Engines) -> bool {
    let p = Exit::new(busy, engines, moved);
    wait(&p, bound, Instant::now, || {
        sys::sleep(Duration::from_millis(2));
    })
}

/// Sockets whose close is still letting bytes leave (`reaper`: from the
/// hand-over to the end of the close's sending phase).
pub(super) static CLOSING: AtomicUsize = AtomicUsize::new(0);

/// In a forked child: the parent's closes are not the child's to wait for
/// (the reaper thread is the parent's; review r21-send #8).
pub(crate) fn forget_closing_after_fork() {
    CLOSING.store(0, Ordering::Release);
}

/// Whether closes are still sending, or send calls left bytes in send
/// buffers (what [`linger`] waits for, the engines' backlogs aside).
pub(crate) fn closing() -> bool {
    CLOSING.load(Ordering::Acquire) > 0 || warpsock_xsock::io::buffered_bytes() > 0
}

/// Waits for closing sockets (exit, exec) — `bound` without progress,
/// restarted while bytes leave (this module) — and for the bytes send
/// calls left in the send buffers of sockets not closed or posted into
/// their engines' backlogs (the progress thread sends them as credits
/// come back and the kernel drains; TCP's kernel would send them after
/// the process). `engines`: `census::engine_backlogs`. Returns whether it
/// ended idle (`false`: it gave up on some bytes).
pub(crate) fn linger(bound: Duration, engines: Engines) -> bool {
    wait_for(bound, closing, engines)
}

/// [`linger`] at exit, which makes closes of its own
/// (`census::ExitCloses`): `step` steps them between looks (every 2 ms)
/// and says whether one still sends; the wait lasts while one does too.
pub(crate) fn linger_stepping(
    bound: Duration,
    engines: Engines,
    step: impl FnMut() -> bool,
) -> bool {
    linger_stepping_but(bound, engines, || 0, step)
}

/// [`linger_stepping`], `mine` of the closes counted in [`CLOSING`] not
/// waited for: they are among those `step` steps (an exit over its own
/// thread's lingering close, `exit_interrupted`).
pub(crate) fn linger_stepping_but(
    bound: Duration,
    engines: Engines,
    mine: impl Fn() -> usize,
    mut step: impl FnMut() -> bool,
) -> bool {
    let sending = Cell::new(step());
    let step = std::cell::RefCell::new(step);
    let p = Exit::new(
        || {
            sending.get()
                || CLOSING.load(Ordering::Acquire) > mine()
                || warpsock_xsock::io::buffered_bytes() > 0
        },
        engines,
        moved,
    );
    wait(&p, bound, Instant::now, || {
        sys::sleep(Duration::from_millis(2));
        sending.set((step.borrow_mut())());
    })
}

/// [`linger`] for the send buffers' and engines' bytes alone (`_exit`).
/// Whether it ended with them gone.
pub(crate) fn linger_buffered(bound: Duration, engines: Engines) -> bool {
    wait_for(bound, || warpsock_xsock::io::buffered_bytes() > 0, engines)
}

/// Starts the thread that finishes closes in the background (the
/// process's reaper, `reaper`), with every asynchronous signal blocked (as
/// the reactor's thread): a signal the program directs at the process
/// must reach one of the program's own threads, whose blocked calls it is
/// meant to interrupt — never this library thread, which waits for
/// seconds.
pub(super) fn spawn_reaper(
    f: impl FnOnce() + Send + 'static,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    sys::spawn_library_thread("warpsock-reaper", f)
}

#[cfg(test)]
mod tests {
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

    /// Bytes held in an engine's backlog keep the exit waiting, and their
    /// entering the kernel is progress; a drop of the kernels' sum (a
    /// socket closed meanwhile) is none and hides no later growth (review
    /// r21-b #4: the exit waited for the send buffers alone).
    #[test]
    fn an_engines_backlog_is_waited_for_and_its_writes_are_progress() {
        // (held, written) per look, in the order of the calls below;
        // `posted` stays 0.
        let looks = Cell::new(0usize);
        let seq = [
            (5, 100),
            (5, 100),
            (4, 130),
            (4, 20),
            (3, 50),
            (0, 60),
            (0, 60),
        ];
        let engines = || {
            let i = looks.get().min(seq.len() - 1);
            looks.set(looks.get() + 1);
            seq[i]
        };
        let e = Exit::new(|| false, engines, || 0);
        assert!(e.busy(), "held bytes keep it busy");
        assert_eq!(e.progress(), 30, "100 -> 130");
        assert!(e.busy());
        assert_eq!(e.progress(), 30, "130 -> 50: a socket left, no progress");
        assert_eq!(e.progress(), 40, "50 -> 60 counts");
        assert!(!e.busy(), "nothing held");
    }

    /// Nothing to wait for: no pause.
    #[test]
    fn nothing_buffered_returns_at_once() {
        assert_eq!(run(0, 0, 10, false), (true, Duration::ZERO, 0));
    }
}

#[cfg(test)]
mod reaper_tests {
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
    fn the_reaper_thread_blocks_asynchronous_signals_and_the_caller_keeps_its_mask() {
        let before = [libc::SIGTERM, libc::SIGINT, libc::SIGALRM].map(blocked);
        let (tx, rx) = std::sync::mpsc::channel();
        let h = spawn_reaper(move || {
            let seen = [libc::SIGTERM, libc::SIGINT, libc::SIGALRM, libc::SIGSEGV].map(blocked);
            tx.send(seen).expect("the test waits");
        })
        .expect("a thread");
        h.join().expect("the reaper ran");
        let [term, int, alrm, segv] = rx.recv().expect("the reaper reported");
        assert!(term && int && alrm, "asynchronous signals blocked");
        assert!(!segv, "faults stay the thread's own");
        assert_eq!(
            [libc::SIGTERM, libc::SIGINT, libc::SIGALRM].map(blocked),
            before
        );
    }
}
