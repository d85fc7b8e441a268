//! The threads that run POSIX AIO requests on managed sockets, and their
//! completion: the control block's result, the wake-up of `aio_suspend`
//! and `lio_listio` waiters, the request's notification.
//!
//! As glibc's (`sysdeps/pthread/aio_misc.c`): at most [`WORKERS_MAX`]
//! threads (glibc's default `aio_threads`), each with every asynchronous
//! signal blocked, taking the next request of a descriptor no other runs
//! ([`Queue::take`]), ending after [`IDLE`] with nothing to do. A request
//! is the program's own `read` or `write` on the number, made on the
//! worker's thread: the library's path for a DDP socket, as glibc's helper
//! thread makes the kernel's for a TCP socket (whose `pread` fails with
//! `ESPIPE`, then `read`).

use std::sync::atomic::{fence, AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use libc::{c_int, c_void};
use warpsock_xsock::io::ForkLock;

use super::queue::{Op, Queue, Req};
use super::{Cb, Note, Notify};
use crate::shim::sys;

/// The most worker threads at once.
const WORKERS_MAX: usize = 20;

/// How long a worker with nothing to do waits before it ends.
const IDLE: Duration = Duration::from_secs(1);

#[derive(Default)]
pub(super) struct Pool {
    pub(super) queue: Queue<Note>,
    workers: usize,
    busy: usize,
}

/// The requests and the workers' count. A forked child starts with none
/// (`ForkLock`): the parent's workers are not its threads.
pub(super) static POOL: ForkLock<Pool> = ForkLock::new();

/// A request was ever queued here: until then no control block is ours,
/// and `aio_suspend`/`aio_cancel` of a program that uses glibc's AIO
/// alone pass through with one load (no lock, no list).
pub(super) static SUBMITTED: AtomicBool = AtomicBool::new(false);

/// Moves at every completion: the futex word `aio_suspend` and
/// `lio_listio` wait on ([`wait_for_done`]).
static DONE: AtomicU32 = AtomicU32::new(0);

/// Moves at every request queued or ended: the futex word idle workers
/// wait on.
static WORK: AtomicU32 = AtomicU32::new(0);

/// Queues `req` on `fd` and makes sure a worker will run it: one more
/// thread while fewer workers are idle than descriptors have a request
/// ready (glibc's rule: a request never waits behind another
/// descriptor's, a read that waits for bytes; review 56). `Err(EAGAIN)`
/// and nothing queued if the bound is reached, or no worker exists and
/// none can be started.
pub(super) fn submit(fd: c_int, req: Req<Note>) -> Result<(), c_int> {
    let cb = req.cb;
    SUBMITTED.store(true, Ordering::Release);
    let mut p = POOL.lock();
    if !p.queue.submit(fd, req) {
        return Err(libc::EAGAIN);
    }
    if p.queue.ready() > p.workers - p.busy && p.workers < WORKERS_MAX {
        p.workers += 1;
        if sys::spawn_library_thread("warpsock-aio", work).is_err() {
            p.workers -= 1;
            if p.workers == 0 {
                // Nobody would ever run it.
                p.queue.cancel(fd, Some(cb));
                return Err(libc::EAGAIN);
            }
        }
    }
    drop(p);
    bump(&WORK, 1);
    Ok(())
}

/// A worker's life.
fn work() {
    sys::no_cancel();
    loop {
        let seq = WORK.load(Ordering::SeqCst);
        let job = {
            let mut p = POOL.lock();
            let job = p.queue.take();
            if job.is_some() {
                p.busy += 1;
            }
            job
        };
        let Some((fd, req)) = job else {
            if futex_wait(&WORK, seq, Some(IDLE)) == Err(libc::ETIMEDOUT) {
                let mut p = POOL.lock();
                if p.queue.ready() == 0 {
                    p.workers -= 1;
                    return;
                }
            }
            continue;
        };
        let cb = req.cb as *mut Cb;
        // SAFETY: the program's control block, valid until its request
        // completes (aio_read(3p)); its buffer is the program's for
        // `aio_nbytes` bytes.
        let r = unsafe {
            let (buf, len) = ((*cb).buf, (*cb).nbytes);
            match req.op {
                Op::Read => crate::interpose::io::read(fd, buf, len),
                Op::Write => crate::interpose::io::write(fd, buf.cast_const(), len),
            }
        };
        let e = if r < 0 { sys::errno() } else { 0 };
        // The result and the request's leaving the queue in one step:
        // between the two it was neither (`aio_suspend` passed it to
        // glibc, which returns at once for a request it does not know; an
        // `aio_cancel` of it answered `AIO_NOTCANCELED` after its result;
        // review 56).
        {
            let mut p = POOL.lock();
            publish(req.cb, r, e);
            p.queue.finish(fd);
            p.busy -= 1;
        }
        announce(req.note);
        // The descriptor's next request is ready now.
        bump(&WORK, 1);
    }
}

/// Ends the request of control block `cb` with result `r` and error `e`
/// (0, or the errno; `ECANCELED` for one taken back): the result first,
/// then the code (`aio_error` reads the code, then `aio_return` the
/// result). Made under the pool's lock, with the request's leaving the
/// queue; [`announce`] follows.
pub(super) fn publish(cb: usize, r: isize, e: c_int) {
    let cb = cb as *mut Cb;
    // SAFETY: the program's control block, valid until this completion
    // publishes the error code.
    unsafe {
        std::ptr::addr_of_mut!((*cb).return_value).write_volatile(r);
        fence(Ordering::Release);
        std::ptr::addr_of_mut!((*cb).error_code).write_volatile(e);
    }
}

/// After [`publish`]: wakes the waiters, and notifies as the request
/// asked (and its list, once it is the list's last: `Note::list`).
pub(super) fn announce(note: Note) {
    bump(&DONE, i32::MAX);
    note.each.notify();
    if let Some(list) = note.list {
        list.one_done();
    }
}

/// Waits until `done()`, at most until `deadline` (`None`: no bound),
/// woken by every completion here; `poll_too`: some of what `done` looks
/// at is glibc's (no wake-up here), looked at every millisecond.
/// `Err(EAGAIN)` at the deadline. A signal that ended the sleep (always
/// a timed one, which the kernel never restarts) ends the wait with
/// `Err(EINTR)` as the library's other waits do (`shim::sys::wait_fd`):
/// a `pthread_cancel` this thread acts on now (its entry point acts on
/// it), a `deadline` (glibc's wait has a timeout then, which the kernel
/// does not restart either), or a handler without `SA_RESTART`; the wait
/// goes on for the preload's own cancellation signal to a thread that
/// does not act on it now, and for handlers that all asked for a restart
/// (glibc's unbounded wait is restarted; review 56: `EINTR` came for
/// them). A wait whose slice ended with nothing looks for a cancel too.
pub(super) fn wait_for_done(
    mut done: impl FnMut() -> bool,
    deadline: Option<std::time::Instant>,
    poll_too: bool,
) -> Result<(), c_int> {
    loop {
        let seq = DONE.load(Ordering::SeqCst);
        if done() {
            return Ok(());
        }
        let left = match deadline {
            Some(d) => match d.checked_duration_since(std::time::Instant::now()) {
                Some(left) if !left.is_zero() => Some(left),
                _ => return Err(libc::EAGAIN),
            },
            None => None,
        };
        let most = if poll_too { POLL_SLICE } else { SLICE };
        let slice = left.map_or(most, |l| l.min(most));
        match futex_wait(&DONE, seq, Some(slice)) {
            Err(libc::EINTR) => match warpsock_xsock::cancel::after_signal() {
                Some(true) => return Err(libc::EINTR),
                Some(false) => {}
                None if deadline.is_none() && warpsock_xsock::io::restart_after_signal() => {}
                None => return Err(libc::EINTR),
            },
            Err(libc::ETIMEDOUT)
                if warpsock_xsock::cancel::any() && warpsock_xsock::cancel::pending() =>
            {
                return Err(libc::EINTR);
            }
            _ => {}
        }
    }
}

/// The longest sleep of a wait with no glibc request in it (a cancel
/// noted with no signal is seen at its end).
const SLICE: Duration = Duration::from_secs(1);

/// How often a wait that includes glibc's requests looks at them.
const POLL_SLICE: Duration = Duration::from_millis(1);

/// Moves `word` and wakes up to `n` of its waiters.
fn bump(word: &AtomicU32, n: i32) {
    word.fetch_add(1, Ordering::SeqCst);
    // SAFETY: FUTEX_WAKE on a word of ours; no other pointer.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
            n,
        )
    };
}

/// Sleeps while `word` is `seq`, at most `d` (`None`: no bound):
/// `Err(ETIMEDOUT)` at the end of `d`, `Err(EINTR)` for a signal
/// handler; `Ok` if woken or `word` moved.
fn futex_wait(word: &AtomicU32, seq: u32, d: Option<Duration>) -> Result<(), c_int> {
    let ts = d.map(sys::timespec);
    let tsp = ts
        .as_ref()
        .map_or(std::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: FUTEX_WAIT on a word of ours with a relative timeout (or
    // none).
    let r = unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
            seq,
            tsp,
        )
    };
    match (r, sys::errno()) {
        (0, _) | (_, libc::EAGAIN) => Ok(()),
        (_, e) => Err(e),
    }
}

impl Notify {
    /// The notification the request asked for (glibc's
    /// `__aio_notify_only`): `SIGEV_SIGNAL` queues the signal to the
    /// process that made the request, `si_code` `SI_ASYNCIO` with the
    /// value; `SIGEV_THREAD` calls the function with the value on a new
    /// thread (with the attributes given, else detached); anything else,
    /// nothing.
    pub(super) fn notify(&self) {
        match self.sigev.notify {
            libc::SIGEV_SIGNAL => self.queue_signal(),
            libc::SIGEV_THREAD if self.sigev.function != 0 => self.start_thread(),
            _ => {}
        }
    }

    fn queue_signal(&self) {
        // siginfo_t for SI_ASYNCIO (asm-generic siginfo.h: the `_rt`
        // member after signo, errno, code): pid, uid, value.
        #[repr(C)]
        struct Info {
            signo: c_int,
            errno: c_int,
            code: c_int,
            pad0: c_int,
            pid: libc::pid_t,
            uid: libc::uid_t,
            value: usize,
            rest: [u8; 96],
        }
        const _: () = assert!(size_of::<Info>() == size_of::<libc::siginfo_t>());
        let info = Info {
            signo: self.sigev.signo,
            errno: 0,
            code: libc::SI_ASYNCIO,
            pad0: 0,
            pid: self.pid,
            // SAFETY: getuid has no preconditions.
            uid: unsafe { libc::getuid() },
            value: self.sigev.value,
            rest: [0; 96],
        };
        // SAFETY: rt_sigqueueinfo with a siginfo of ours, to the process
        // that asked (as glibc's `__aio_sigqueue`).
        unsafe {
            libc::syscall(
                libc::SYS_rt_sigqueueinfo,
                self.pid,
                self.sigev.signo,
                &info as *const Info,
            )
        };
    }

    fn start_thread(&self) {
        extern "C" fn run(arg: *mut c_void) -> *mut c_void {
            // SAFETY: the box `start_thread` made, given to this thread alone.
            let (f, value) = *unsafe { Box::from_raw(arg.cast::<(usize, usize)>()) };
            // The program's function runs with no signal blocked, as
            // glibc's notification thread (it was made by a worker, whose
            // asynchronous signals are blocked; review 56).
            // SAFETY: an empty set, made and given to pthread_sigmask.
            unsafe {
                let mut none: libc::sigset_t = std::mem::zeroed();
                libc::sigemptyset(&mut none);
                libc::pthread_sigmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
            }
            // SAFETY: the program's `sigev_notify_function`, `void
            // (*)(union sigval)`: a pointer-sized union, passed as a pointer.
            let f: extern "C" fn(usize) = unsafe { std::mem::transmute(f) };
            f(value);
            std::ptr::null_mut()
        }
        let arg = Box::into_raw(Box::new((self.sigev.function, self.sigev.value)));
        // SAFETY: pthread_attr_* on a local attribute object, or the
        // program's own (`sigev_notify_attributes`); pthread_create with
        // `run` and the box, freed by `run` or here if no thread started.
        unsafe {
            let mut own: libc::pthread_attr_t = std::mem::zeroed();
            let attr = if self.sigev.attributes != 0 {
                self.sigev.attributes as *const libc::pthread_attr_t
            } else {
                libc::pthread_attr_init(&mut own);
                libc::pthread_attr_setdetachstate(&mut own, libc::PTHREAD_CREATE_DETACHED);
                &own as *const libc::pthread_attr_t
            };
            let mut th: libc::pthread_t = 0;
            if libc::pthread_create(&mut th, attr, run, arg.cast()) != 0 {
                drop(Box::from_raw(arg));
            }
            if self.sigev.attributes == 0 {
                libc::pthread_attr_destroy(&mut own);
            }
        }
    }
}
