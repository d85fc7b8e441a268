//! POSIX AIO (`aio_read`, `aio_write`, `lio_listio`, `aio_suspend`,
//! `aio_cancel`, and their `64` names) on managed sockets.
//!
//! glibc runs a request on a thread of its own with its internal `pread`,
//! then, a socket failing that with `ESPIPE`, its internal `read`: calls no
//! preloaded library sees. On a DDP socket's number (the doorbell's end)
//! that read the doorbell: an `aio_read` waited for ever, and every later
//! request on the number behind it. A request on a managed socket is
//! therefore run here (`worker`): the program's own `read` or `write` on a
//! thread of the library's, one descriptor's requests in order (`queue`).
//! Its result goes where glibc keeps it, in the control block's
//! `__error_code` and `__return_value` ([`Cb`]), so glibc's `aio_error`
//! and `aio_return`, which read only those, answer for it unchanged.
//! `aio_suspend` and `aio_cancel` over such a request, and `lio_listio`
//! with one, are made here; everything else is glibc's. `aio_fsync` stays
//! glibc's: on a socket it fails with `EINVAL` either way.
//!
//! Differences: the offset is ignored, as glibc's fallback to `read`
//! ignores it for a socket; `aio_reqprio` is checked, not used (one
//! descriptor's requests run in the order queued).

use std::time::{Duration, Instant};

use libc::{c_int, c_void, timespec};

use super::managed;
use crate::shim::guard::busy;
use crate::shim::real;
use crate::shim::sys::set_errno;

mod queue;
mod worker;

/// In a forked child: the parent's requests and workers are not its own
/// (`ForkLock`; its workers are threads the child does not have).
pub(crate) fn forget_after_fork() {
    worker::POOL.forget();
}

use queue::{Op, Req};

/// glibc's `struct aiocb` (aio.h, 64-bit targets), with the two members it
/// keeps a request's result in.
#[repr(C)]
pub struct Cb {
    fildes: c_int,
    opcode: c_int,
    reqprio: c_int,
    buf: *mut c_void,
    nbytes: usize,
    sigev: SigEvent,
    next_prio: *mut c_void,
    abs_prio: c_int,
    policy: c_int,
    error_code: c_int,
    return_value: isize,
    offset: i64,
    reserved: [u8; 32],
}

/// `struct sigevent` with `_sigev_thread`'s members (signal.h): the value
/// (`union sigval`), the signal, how to notify, the function and its
/// thread's attributes.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct SigEvent {
    value: usize,
    signo: c_int,
    notify: c_int,
    function: usize,
    attributes: usize,
    pad: [c_int; 8],
}

const _: () = {
    use std::mem::{offset_of, size_of};
    assert!(size_of::<Cb>() == size_of::<libc::aiocb>());
    assert!(offset_of!(Cb, sigev) == offset_of!(libc::aiocb, aio_sigevent));
    assert!(offset_of!(Cb, offset) == offset_of!(libc::aiocb, aio_offset));
    assert!(size_of::<SigEvent>() == size_of::<libc::sigevent>());
};

/// A request's notification, copied when it is queued (the control block
/// may be reused once its result is published): its `sigevent` and the
/// process that asked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Note {
    sigev: SigEvent,
    pid: libc::pid_t,
}

/// glibc's `AIO_PRIO_DELTA_MAX`: a request's `aio_reqprio` is 0 to this.
const PRIO_DELTA_MAX: c_int = 20;

/// The most `lio_listio(LIO_NOWAIT)` calls over managed sockets whose
/// notification waits at once (a thread each).
const LIST_WAITERS_MAX: usize = 64;

static LIST_WAITERS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// The request's error code, as `aio_error` reads it.
///
/// # Safety
/// `cb` is a valid control block.
unsafe fn error_of(cb: *const Cb) -> c_int {
    // SAFETY: the caller's; a worker writes it concurrently (volatile).
    unsafe { std::ptr::addr_of!((*cb).error_code).read_volatile() }
}

/// Whether the request of control block `cb` (an address from a list the
/// program passed to a call that waits: valid until its request
/// completes, and looked at only until it did) is over.
fn over(cb: usize) -> bool {
    // SAFETY: as said; null entries are skipped.
    cb != 0 && unsafe { error_of(cb as *const Cb) } != libc::EINPROGRESS
}

/// Queues `cb` as an `op` request on its managed socket. 0, or -1 with
/// errno (and the control block's error code) set.
///
/// # Safety
/// `cb` is a valid control block the program leaves alone until its
/// request completes.
unsafe fn enqueue(cb: *mut Cb, op: Op) -> c_int {
    // SAFETY: the caller's.
    let c = unsafe { &mut *cb };
    let fail = |c: &mut Cb, e| {
        c.return_value = -1;
        c.error_code = e;
        set_errno(e);
        -1
    };
    if !(0..=PRIO_DELTA_MAX).contains(&c.reqprio) {
        return fail(c, libc::EINVAL);
    }
    let note = Note {
        sigev: c.sigev,
        // SAFETY: getpid has no preconditions.
        pid: unsafe { libc::getpid() },
    };
    c.return_value = 0;
    c.error_code = libc::EINPROGRESS;
    let req = Req {
        cb: cb as usize,
        op,
        note,
    };
    match worker::submit(c.fildes, req) {
        Ok(()) => 0,
        Err(e) => fail(c, e),
    }
}

/// Whether `cb` asks for a request on a managed socket.
///
/// # Safety
/// `cb` is null or a valid control block.
unsafe fn on_managed(cb: *const Cb) -> bool {
    // SAFETY: the caller's.
    !cb.is_null() && managed(unsafe { (*cb).fildes }).is_some()
}

/// `aio_read` and `aio_write` (`op`), or glibc's (`real`).
///
/// # Safety
/// As the libc functions'.
unsafe fn submit_one(cb: *mut Cb, op: Op, real: impl FnOnce() -> c_int) -> c_int {
    // SAFETY: the caller's.
    if busy() || !unsafe { on_managed(cb) } {
        return real();
    }
    // SAFETY: as above.
    unsafe { enqueue(cb, op) }
}

/// Interposed `aio_read(3)`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn aio_read(cb: *mut Cb) -> c_int {
    // SAFETY: the caller's contract, passed on.
    unsafe { submit_one(cb, Op::Read, || real::aio_read(cb.cast())) }
}

/// Interposed `aio_read64` (the same on 64-bit targets).
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn aio_read64(cb: *mut Cb) -> c_int {
    // SAFETY: as above.
    unsafe { submit_one(cb, Op::Read, || real::aio_read64(cb.cast())) }
}

/// Interposed `aio_write(3)`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn aio_write(cb: *mut Cb) -> c_int {
    // SAFETY: as above.
    unsafe { submit_one(cb, Op::Write, || real::aio_write(cb.cast())) }
}

/// Interposed `aio_write64`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn aio_write64(cb: *mut Cb) -> c_int {
    // SAFETY: as above.
    unsafe { submit_one(cb, Op::Write, || real::aio_write64(cb.cast())) }
}

/// The non-null entries of a list of `n` control blocks.
///
/// # Safety
/// `list` holds `n` entries (or `n` <= 0).
unsafe fn entries<'a>(list: *const *const Cb, n: c_int) -> &'a [*const Cb] {
    if list.is_null() || n <= 0 {
        return &[];
    }
    // SAFETY: the caller's.
    unsafe { std::slice::from_raw_parts(list, n as usize) }
}

/// Whether any of `list` is a request of ours (queued or running here).
fn any_ours(list: &[*const Cb]) -> bool {
    let p = worker::POOL.lock();
    list.iter()
        .any(|&cb| !cb.is_null() && p.queue.holds(cb as usize))
}

/// The deadline of a relative `timespec` (null: none); `Err(EINVAL)` for
/// one out of range.
///
/// # Safety
/// `t` is null or valid.
unsafe fn deadline(t: *const timespec) -> Result<Option<Instant>, c_int> {
    if t.is_null() {
        return Ok(None);
    }
    // SAFETY: the caller's.
    let t = unsafe { &*t };
    if t.tv_sec < 0 || !(0..1_000_000_000).contains(&t.tv_nsec) {
        return Err(libc::EINVAL);
    }
    let d = Duration::new(t.tv_sec as u64, t.tv_nsec as u32);
    Ok(Some(Instant::now().checked_add(d).unwrap_or_else(|| {
        Instant::now() + Duration::from_secs(100 * 365 * 86400)
    })))
}

/// Interposed `aio_suspend(3)`: made here if one of the requests listed is
/// ours (glibc's finds no such request and returns at once); else glibc's.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn aio_suspend(
    list: *const *const Cb,
    n: c_int,
    t: *const timespec,
) -> c_int {
    // SAFETY: the caller's contract.
    let l = unsafe { entries(list, n) };
    if busy() || !any_ours(l) {
        // SAFETY: forwarding the caller's arguments.
        return unsafe { real::aio_suspend(list.cast(), n, t) };
    }
    super::cancel_first();
    // SAFETY: as above.
    let deadline = match unsafe { deadline(t) } {
        Ok(d) => d,
        Err(e) => {
            set_errno(e);
            return -1;
        }
    };
    // glibc's requests among them complete with no wake-up here.
    let theirs = !l.iter().all(|&cb| cb.is_null() || any_ours(&[cb]));
    let any_done = || l.iter().any(|&cb| over(cb as usize));
    super::cancellable_int(|| match worker::wait_for_done(any_done, deadline, theirs) {
        Ok(()) => 0,
        Err(e) => {
            set_errno(e);
            -1
        }
    })
}

/// Interposed `aio_suspend64`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn aio_suspend64(
    list: *const *const Cb,
    n: c_int,
    t: *const timespec,
) -> c_int {
    // SAFETY: as above.
    unsafe { aio_suspend(list, n, t) }
}

/// Interposed `aio_cancel(3)`: a managed socket's requests, or one of
/// ours, are taken back here if still queued (each completed with
/// `ECANCELED` and notified); one running is not (`AIO_NOTCANCELED`).
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn aio_cancel(fd: c_int, cb: *mut Cb) -> c_int {
    let ours =
        !busy() && (managed(fd).is_some() || (!cb.is_null() && any_ours(&[cb.cast_const()])));
    if !ours {
        // SAFETY: forwarding the caller's arguments.
        return unsafe { real::aio_cancel(fd, cb.cast()) };
    }
    // SAFETY: as glibc's, a control block given names the descriptor.
    if !cb.is_null() && unsafe { (*cb).fildes } != fd {
        set_errno(libc::EINVAL);
        return -1;
    }
    let c = worker::POOL
        .lock()
        .queue
        .cancel(fd, (!cb.is_null()).then_some(cb as usize));
    for req in c.taken {
        worker::complete(req, -1, libc::ECANCELED);
    }
    c.answer
}

/// Interposed `aio_cancel64`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn aio_cancel64(fd: c_int, cb: *mut Cb) -> c_int {
    // SAFETY: as above.
    unsafe { aio_cancel(fd, cb) }
}

/// Interposed `lio_listio(3)`: with an entry on a managed socket, each
/// entry is queued as `aio_read`/`aio_write` queue it (ours here, the
/// others glibc's), then `LIO_WAIT` waits for all (-1 with `EIO` if one
/// failed) and `LIO_NOWAIT` notifies `sig` once all are done (a thread of
/// the library's waits; at most [`LIST_WAITERS_MAX`] at once, `EAGAIN`
/// beyond, before anything is queued); else glibc's.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn lio_listio(
    mode: c_int,
    list: *const *mut Cb,
    n: c_int,
    sig: *mut libc::sigevent,
) -> c_int {
    // SAFETY: the caller's contract.
    let l: Vec<*mut Cb> = unsafe { entries(list.cast(), n) }
        .iter()
        .map(|&cb| cb.cast_mut())
        .filter(|&cb| {
            // SAFETY: each entry is a valid control block.
            !cb.is_null() && unsafe { (*cb).opcode } != libc::LIO_NOP
        })
        .collect();
    // SAFETY: as above.
    if busy() || !l.iter().any(|&cb| unsafe { on_managed(cb) }) {
        // SAFETY: forwarding the caller's arguments.
        return unsafe { real::lio_listio(mode, list.cast(), n, sig) };
    }
    if mode != libc::LIO_WAIT && mode != libc::LIO_NOWAIT {
        set_errno(libc::EINVAL);
        return -1;
    }
    let note = (!sig.is_null()).then(|| Note {
        // SAFETY: `sig` is valid (not null); read as the layout above.
        sigev: unsafe { *sig.cast::<SigEvent>() },
        // SAFETY: getpid has no preconditions.
        pid: unsafe { libc::getpid() },
    });
    let notify =
        mode == libc::LIO_NOWAIT && note.is_some_and(|n| n.sigev.notify != libc::SIGEV_NONE);
    if notify {
        let w = LIST_WAITERS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        if w >= LIST_WAITERS_MAX {
            LIST_WAITERS.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
            set_errno(libc::EAGAIN);
            return -1;
        }
    }
    let mut failed = false;
    for &cb in &l {
        // SAFETY: each entry is a valid control block, the program's
        // until its request completes.
        let r = unsafe {
            match (*cb).opcode {
                libc::LIO_READ => aio_read(cb),
                libc::LIO_WRITE => aio_write(cb),
                _ => {
                    (*cb).return_value = -1;
                    (*cb).error_code = libc::EINVAL;
                    -1
                }
            }
        };
        failed |= r != 0;
    }
    let ours: Vec<usize> = l.iter().map(|&cb| cb as usize).collect();
    let theirs = !l.iter().all(|&cb| any_ours(&[cb.cast_const()]));
    let all_done = move || ours.iter().all(|&cb| over(cb));
    if mode == libc::LIO_WAIT {
        super::cancel_first();
        let r = super::cancellable_int(|| {
            match worker::wait_for_done(all_done.clone(), None, theirs) {
                Ok(()) => 0,
                Err(e) => {
                    set_errno(e);
                    -1
                }
            }
        });
        if r < 0 {
            return r;
        }
        // SAFETY: as above.
        if failed || l.iter().any(|&cb| unsafe { error_of(cb) } != 0) {
            set_errno(libc::EIO);
            return -1;
        }
        return 0;
    }
    if let Some(note) = note.filter(|_| notify) {
        let spawned = crate::shim::sys::spawn_library_thread("warpsock-lio", move || {
            crate::shim::sys::no_cancel();
            while worker::wait_for_done(all_done.clone(), None, theirs).is_err() {}
            note.notify();
            LIST_WAITERS.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
        });
        if spawned.is_err() {
            LIST_WAITERS.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
            failed = true;
        }
    }
    if failed {
        set_errno(libc::EIO);
        return -1;
    }
    0
}

/// Interposed `lio_listio64`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn lio_listio64(
    mode: c_int,
    list: *const *mut Cb,
    n: c_int,
    sig: *mut libc::sigevent,
) -> c_int {
    // SAFETY: as above.
    unsafe { lio_listio(mode, list, n, sig) }
}
