//! The threads the background switches run on, kept between switches.
//!
//! A thread made for each accepted connection and ended after its switch
//! cost the server a `clone3`, the new thread's set-up (`rseq`, robust
//! list, name, masks) and, at its end, glibc's `madvise` of its 2 MiB
//! stack — a TLB shoot-down across the process's other threads, a VM
//! exit here (session 38's `strace` of `scripts/bench-ddp-accept.sh`'s
//! server). A switch now goes to a thread waiting for one, and a thread
//! is made only when none waits.
//!
//! Bounds: a thread is made only for a switch no waiting thread takes,
//! and the switches under way are at most `SWITCHING_MAX` (their slots),
//! so the threads are about as many: a switch gives its slot back just
//! before its thread waits again, and a switch started in that gap makes
//! a thread of its own (as many again at most, as with a thread per
//! switch). One that waits [`IDLE_KEEP`] with no switch ends. The queue
//! holds no more switches than threads wait.
//!
//! Fork: the child has none of the parent's threads. Its fork handler
//! forgets the pool ([`forget_after_fork`]); a child made by a raw `fork`
//! (no handlers) finds the pool made by another process ([`Pool::pid`]) and
//! makes its own — never taking a lock a parent's thread may have held
//! at the fork. A forgotten pool is leaked (a few words). A child forked
//! on a pool thread (a fault handler's fork: the asynchronous signals are
//! blocked there) leaves the loop after the switch instead of waiting on
//! its parent's pool. Not covered: a raw fork's child with its parent's
//! pid (pid 1 cloned into a new pid namespace without the handlers), which
//! would hand its switches to threads it does not have.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::Duration;

use crate::shim::sys::{self, lock};

/// A switch to run.
pub(super) type Job = Box<dyn FnOnce() + Send + 'static>;

/// How long a thread with no switch waits for one before it ends.
pub(super) const IDLE_KEEP: Duration = Duration::from_secs(10);

struct Pool {
    /// The process that made the pool.
    pid: libc::pid_t,
    st: Mutex<State>,
    work: Condvar,
}

struct State {
    /// Switches handed to waiting threads, not yet taken.
    jobs: VecDeque<Job>,
    /// Threads waiting for a switch.
    idle: usize,
}

static POOL: AtomicPtr<Pool> = AtomicPtr::new(std::ptr::null_mut());

impl Pool {
    fn new(pid: libc::pid_t) -> Self {
        Self {
            pid,
            st: Mutex::new(State {
                jobs: VecDeque::new(),
                idle: 0,
            }),
            work: Condvar::new(),
        }
    }
}

/// This process's pool in `at` (`pid`: this process's id), made on first
/// use.
fn pool(at: &AtomicPtr<Pool>, pid: libc::pid_t) -> &'static Pool {
    let p = at.load(Ordering::Acquire);
    if !p.is_null() {
        // SAFETY: a published pool is leaked and never freed.
        let p: &'static Pool = unsafe { &*p };
        if p.pid == pid {
            return p;
        }
    }
    let fresh = Box::into_raw(Box::new(Pool::new(pid)));
    match at.compare_exchange(p, fresh, Ordering::AcqRel, Ordering::Acquire) {
        // SAFETY: published now, never freed (the one it replaced, another
        // process's, is leaked).
        Ok(_) => unsafe { &*fresh },
        Err(other) => {
            // SAFETY: ours was never shared.
            drop(unsafe { Box::from_raw(fresh) });
            // Another thread of this process published first (a pool of
            // another process is only ever replaced, by this process).
            // SAFETY: as above.
            unsafe { &*other }
        }
    }
}

/// Runs `job` on a waiting thread, or on a new one (named `warpsock-switch`,
/// every asynchronous signal blocked, as the library's other threads: a
/// signal meant for the program never runs its handler on a switch's
/// thread). `pid`: this process's id. `Err`: no thread could be made (the
/// job dropped, not run).
pub(super) fn run(pid: libc::pid_t, job: Job) -> std::io::Result<()> {
    run_on(pool(&POOL, pid), job)
}

/// [`run`] on `pool`.
fn run_on(pool: &'static Pool, job: Job) -> std::io::Result<()> {
    {
        let mut st = lock(&pool.st);
        // Each queued job has a waiting thread of its own.
        if st.idle > st.jobs.len() {
            st.jobs.push_back(job);
            drop(st);
            pool.work.notify_one();
            return Ok(());
        }
    }
    sys::with_async_signals_blocked(|| {
        std::thread::Builder::new()
            .name("warpsock-switch".into())
            .spawn(move || serve(pool, job))
    })
    .map(drop)
}

/// A thread's life: `first`, then the switches handed to it, until none
/// comes for [`IDLE_KEEP`].
fn serve(pool: &'static Pool, first: Job) {
    // A long-lived library thread: a program's `pthread_cancel` of every
    // thread it finds must not unwind it from a libc call.
    sys::no_cancel();
    let mut job = Some(first);
    while let Some(j) = job.take() {
        // A panic is the switch's (its socket's guard installs an
        // outcome); the thread goes on serving.
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(j));
        if sys::getpid() != pool.pid {
            // A child forked in the switch (see the module's docs).
            return;
        }
        job = next(pool, IDLE_KEEP);
    }
}

/// The next switch handed to this thread, waiting up to `keep` for one.
fn next(pool: &Pool, keep: Duration) -> Option<Job> {
    let mut st = lock(&pool.st);
    let deadline = std::time::Instant::now() + keep;
    loop {
        // Before the deadline's check: a job queued as the wait timed out
        // was counted on this thread.
        if let Some(j) = st.jobs.pop_front() {
            return Some(j);
        }
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return None;
        }
        st.idle += 1;
        st = match pool.work.wait_timeout(st, left) {
            Ok((g, _)) => g,
            Err(p) => p.into_inner().0,
        };
        st.idle -= 1;
    }
}

/// In a forked child (its fork handler, the only thread): the parent's
/// threads are not the child's.
pub(super) fn forget_after_fork() {
    POOL.store(std::ptr::null_mut(), Ordering::Release);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    fn private_pool() -> &'static Pool {
        Box::leak(Box::new(Pool::new(sys::getpid())))
    }

    fn gettid() -> libc::pid_t {
        // SAFETY: no arguments.
        unsafe { libc::gettid() }
    }

    /// Until a thread of `p` waits for a switch (bounded: a thread that
    /// died never waits).
    fn wait_idle(p: &Pool) {
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while lock(&p.st).idle == 0 {
            assert!(std::time::Instant::now() < deadline, "no thread waits");
            std::thread::yield_now();
        }
    }

    /// A thread that finished a switch takes the next: no second thread.
    #[test]
    fn a_waiting_thread_takes_the_next_switch() {
        let p = private_pool();
        let (tx, rx) = mpsc::channel();
        let t1 = tx.clone();
        run_on(p, Box::new(move || t1.send(gettid()).unwrap())).unwrap();
        let first = rx.recv().unwrap();
        // That thread waits now (it counts itself idle).
        wait_idle(p);
        run_on(p, Box::new(move || tx.send(gettid()).unwrap())).unwrap();
        assert_eq!(rx.recv().unwrap(), first, "the waiting thread ran it");
        assert!(lock(&p.st).jobs.is_empty());
    }

    /// Two switches at once run on two threads (the second is not queued
    /// behind the first, which waits on its peer).
    #[test]
    fn a_switch_under_way_does_not_hold_up_the_next() {
        let p = private_pool();
        let (gate_tx, gate_rx) = mpsc::channel::<()>();
        let (done_tx, done_rx) = mpsc::channel();
        run_on(p, Box::new(move || gate_rx.recv().unwrap())).unwrap();
        run_on(p, Box::new(move || done_tx.send(()).unwrap())).unwrap();
        done_rx
            .recv_timeout(Duration::from_secs(60))
            .expect("the second switch ran while the first waited");
        gate_tx.send(()).unwrap();
    }

    /// A switch that panics leaves its thread serving the next.
    #[test]
    fn a_panicking_switch_keeps_its_thread() {
        let p = private_pool();
        let (tx, rx) = mpsc::channel();
        let t1 = tx.clone();
        run_on(
            p,
            Box::new(move || {
                t1.send(gettid()).unwrap();
                panic!("a switch's panic");
            }),
        )
        .unwrap();
        let first = rx.recv().unwrap();
        wait_idle(p);
        run_on(p, Box::new(move || tx.send(gettid()).unwrap())).unwrap();
        assert_eq!(rx.recv().unwrap(), first);
    }

    /// A thread with no switch for its keep ends; a queued switch is taken
    /// even at the deadline.
    #[test]
    fn next_returns_none_at_the_deadline_and_a_queued_job_before_it() {
        let p = private_pool();
        assert!(next(p, Duration::ZERO).is_none());
        lock(&p.st).jobs.push_back(Box::new(|| {}));
        assert!(next(p, Duration::ZERO).is_some());
        assert_eq!(lock(&p.st).idle, 0);
    }

    /// A pool made by another process (a raw fork's parent) is replaced,
    /// not used; this process's is kept.
    #[test]
    fn another_processs_pool_is_replaced() {
        let at = AtomicPtr::new(std::ptr::null_mut());
        let pid = sys::getpid();
        let parents = pool(&at, pid.wrapping_add(1)) as *const Pool;
        let mine = pool(&at, pid) as *const Pool;
        assert_ne!(mine, parents);
        assert_eq!(pool(&at, pid) as *const Pool, mine);
    }

    /// A child made by a raw `fork` (no handlers: the unit tests register
    /// none) runs its switch on a thread of its own: the parent's waiting
    /// thread, counted in the copied pool, does not exist there.
    #[test]
    fn a_raw_forks_child_runs_its_switch() {
        let pid = sys::getpid();
        let (tx, rx) = mpsc::channel();
        run(pid, Box::new(move || tx.send(()).unwrap())).unwrap();
        rx.recv().unwrap();
        wait_idle(pool(&POOL, pid));
        let mut fds = [-1; 2];
        // SAFETY: a pipe into a local array.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        // SAFETY: the child only runs the switch below and `_exit`s.
        let child = unsafe { libc::fork() };
        assert!(child >= 0);
        if child == 0 {
            let w = fds[1];
            let r = run(
                sys::getpid(),
                Box::new(move || {
                    // SAFETY: one byte from a local into our pipe.
                    unsafe { libc::write(w, b"!".as_ptr().cast(), 1) };
                }),
            );
            let mut p = libc::pollfd {
                fd: fds[0],
                events: 0,
                revents: 0,
            };
            // Until the byte is in the pipe (POLLIN on the read end), 30 s
            // at most.
            p.events = libc::POLLIN;
            // SAFETY: one pollfd on the stack.
            let n = unsafe { libc::poll(&mut p, 1, 30_000) };
            // SAFETY: ends the child without the parent's handlers.
            unsafe { libc::_exit(if r.is_ok() && n == 1 { 0 } else { 1 }) };
        }
        let mut st = 0;
        // SAFETY: our own child.
        assert_eq!(unsafe { libc::waitpid(child, &mut st, 0) }, child);
        sys::close(fds[0]);
        sys::close(fds[1]);
        assert!(
            libc::WIFEXITED(st) && libc::WEXITSTATUS(st) == 0,
            "the child's switch did not run: {st:#x}"
        );
    }
}
