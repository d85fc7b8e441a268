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
//! `__error_code` and `__return_value` (`Cb`), so glibc's `aio_error`
//! and `aio_return`, which read only those, answer for it unchanged.
//! `aio_suspend` and `aio_cancel` over such a request, and `lio_listio`
//! with one, are made here; everything else is glibc's. `aio_fsync` stays
//! glibc's: on a socket it fails with `EINVAL` either way.
//!
//! Differences: the offset is ignored, as glibc's fallback to `read`
//! ignores it for a socket; `aio_reqprio` is checked, not used (one
//! descriptor's requests run in the order queued).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use libc::{c_int, c_void, timespec};

use crate::shim::guard::busy;
use crate::shim::sys::set_errno;
use crate::shim::{fdtable, real};

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

/// A notification to make: a `sigevent` and the process that asked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Notify {
    sigev: SigEvent,
    pid: libc::pid_t,
}

impl Notify {
    /// `sigev` on behalf of this process.
    fn of(sigev: SigEvent) -> Self {
        Self {
            sigev,
            // SAFETY: getpid has no preconditions.
            pid: unsafe { libc::getpid() },
        }
    }
}

/// A `lio_listio(LIO_NOWAIT)` call's notification, made when the last of
/// its requests completes: counted down by each completion (its own
/// requests', and once for the part glibc runs), never by a look at the
/// program's control blocks, which it may reuse or free once each
/// completed (review 56: the list waited for a reused block's next
/// request).
#[derive(Debug)]
pub(crate) struct List {
    left: AtomicUsize,
    all: Notify,
}

impl List {
    /// One of the list's parts ended; the last makes the notification.
    fn one_done(&self) {
        if self.left.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.all.notify();
        }
    }
}

/// A request's notifications, copied when it is queued (the control block
/// may be reused once its result is published): its own, and its list's.
#[derive(Clone, Debug)]
pub(crate) struct Note {
    each: Notify,
    list: Option<Arc<List>>,
}

/// glibc's `AIO_PRIO_DELTA_MAX`: a request's `aio_reqprio` is 0 to this.
const PRIO_DELTA_MAX: c_int = 20;

/// The request's error code, as `aio_error` reads it.
///
/// # Safety
/// `cb` is a valid control block.
unsafe fn error_of(cb: *const Cb) -> c_int {
    // SAFETY: the caller's; a worker writes it concurrently (volatile).
    unsafe { std::ptr::addr_of!((*cb).error_code).read_volatile() }
}

/// Whether the request of control block `cb` (an address from a list the
/// program passed to a call that waits: valid while that call runs) is
/// over.
fn over(cb: usize) -> bool {
    // SAFETY: as said; null entries are skipped.
    cb != 0 && unsafe { error_of(cb as *const Cb) } != libc::EINPROGRESS
}

/// Whether `fd` is a managed socket, as the submitting calls look: no
/// cancellation point here (glibc's `aio_read`, `aio_write`,
/// `aio_cancel` and `lio_listio` are none; `interpose::managed` acts on a
/// pending cancel: the thread was cancelled inside `aio_read`, nothing
/// queued; review 56), and none inside library code.
fn is_managed(fd: c_int) -> bool {
    !busy() && fdtable::maybe_managed(fd) && fdtable::get(fd).is_some()
}

/// Sets `cb`'s result to a failure with `e` (as glibc leaves a request it
/// did not queue) and errno to `e`; -1.
fn refuse(cb: &mut Cb, e: c_int) -> c_int {
    cb.return_value = -1;
    cb.error_code = e;
    set_errno(e);
    -1
}

/// Queues `cb` as an `op` request on its managed socket, in `list` if
/// given. 0, or -1 with errno (and the control block's error code) set.
///
/// # Safety
/// `cb` is a valid control block the program leaves alone until its
/// request completes.
unsafe fn enqueue(cb: *mut Cb, op: Op, list: Option<Arc<List>>) -> c_int {
    // SAFETY: the caller's.
    let c = unsafe { &mut *cb };
    if !(0..=PRIO_DELTA_MAX).contains(&c.reqprio) {
        return refuse(c, libc::EINVAL);
    }
    let note = Note {
        each: Notify::of(c.sigev),
        list,
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
        Err(e) => refuse(c, e),
    }
}

/// `aio_read` and `aio_write` (`op`), or glibc's (`real`).
///
/// # Safety
/// As the libc functions'.
unsafe fn submit_one(cb: *mut Cb, op: Op, real: impl FnOnce() -> c_int) -> c_int {
    // SAFETY: the caller's: `cb` is valid (or null, glibc's to answer).
    if cb.is_null() || !is_managed(unsafe { (*cb).fildes }) {
        return real();
    }
    // Not a cancellation point, as glibc's: nor any call inside (the
    // first queue's hash keys came from `getrandom`, one; review 56).
    let _off = crate::shim::sys::CancelOff::new();
    // SAFETY: as above.
    unsafe { enqueue(cb, op, None) }
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

/// Whether control block `cb` is a request of ours (queued or running).
fn ours(cb: *const Cb) -> bool {
    !cb.is_null() && any_ours() && worker::POOL.lock().queue.holds(cb as usize)
}

/// Whether any request was ever queued here (`worker::SUBMITTED`).
fn any_ours() -> bool {
    worker::SUBMITTED.load(Ordering::Acquire)
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
/// A cancellation point, as glibc's (`C-unwind`: a cancel acted on here
/// unwinds through it).
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C-unwind" fn aio_suspend(
    list: *const *const Cb,
    n: c_int,
    t: *const timespec,
) -> c_int {
    // SAFETY: the caller's contract.
    let l = unsafe { entries(list, n) };
    let mine: Vec<bool> = if busy() || !any_ours() {
        Vec::new()
    } else {
        l.iter().map(|&cb| ours(cb)).collect()
    };
    if !mine.contains(&true) {
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
    let theirs = l.iter().zip(&mine).any(|(&cb, &m)| !cb.is_null() && !m);
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
pub unsafe extern "C-unwind" fn aio_suspend64(
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
    if !is_managed(fd) && (busy() || !ours(cb.cast_const())) {
        // SAFETY: forwarding the caller's arguments.
        return unsafe { real::aio_cancel(fd, cb.cast()) };
    }
    let _off = crate::shim::sys::CancelOff::new();
    // SAFETY: as glibc's, a control block given names the descriptor.
    if !cb.is_null() && unsafe { (*cb).fildes } != fd {
        set_errno(libc::EINVAL);
        return -1;
    }
    let c = {
        let mut p = worker::POOL.lock();
        let c = p.queue.cancel(fd, (!cb.is_null()).then_some(cb as usize));
        // Published as they leave the queue (`worker::publish`).
        for req in &c.taken {
            worker::publish(req.cb, -1, libc::ECANCELED);
        }
        c
    };
    for req in c.taken {
        worker::announce(req.note);
    }
    c.answer
}

/// Interposed `aio_cancel64`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn aio_cancel64(fd: c_int, cb: *mut Cb) -> c_int {
    // SAFETY: as above.
    unsafe { aio_cancel(fd, cb) }
}

/// glibc's part of a list ended ([`lio_listio`]'s `SIGEV_THREAD`
/// notification of it): one part of the [`List`] at `v`.
extern "C" fn theirs_done(v: usize) {
    // SAFETY: the reference `lio_listio` gave glibc's notification,
    // taken back once, here.
    let list = unsafe { Arc::from_raw(v as *const List) };
    list.one_done();
}

/// Interposed `lio_listio(3)`: with an entry on a managed socket, those
/// entries are queued here as `aio_read`/`aio_write` queue them, the rest
/// go to glibc's `lio_listio` (the same mode; their notification counts
/// down this list's), and an entry here with an opcode other than
/// `LIO_READ`, `LIO_WRITE` or `LIO_NOP` fails with `EINVAL`, as glibc's
/// does. `LIO_WAIT` returns once all are over (-1 with `EIO` if one
/// failed); `LIO_NOWAIT` notifies `sig` once the last completes
/// (counted down: `List`), -1 with `EIO` if one could not be queued. Not a
/// cancellation point (glibc's turns cancellation off). Else glibc's.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn lio_listio(
    mode: c_int,
    list: *const *mut Cb,
    n: c_int,
    sig: *mut libc::sigevent,
) -> c_int {
    // SAFETY: the caller's contract: `n` entries, each null or valid.
    let all = unsafe { entries(list.cast(), n) };
    let (mut mine, mut theirs) = (Vec::new(), Vec::new());
    for &cb in all {
        let cb = cb.cast_mut();
        // SAFETY: a valid control block (not null: `entries`' filter
        // below).
        if cb.is_null() || unsafe { (*cb).opcode } == libc::LIO_NOP {
            continue;
        }
        // SAFETY: as above.
        if is_managed(unsafe { (*cb).fildes }) {
            mine.push(cb);
        } else {
            theirs.push(cb);
        }
    }
    if mine.is_empty() {
        // SAFETY: forwarding the caller's arguments.
        return unsafe { real::lio_listio(mode, list.cast(), n, sig) };
    }
    if mode != libc::LIO_WAIT && mode != libc::LIO_NOWAIT {
        set_errno(libc::EINVAL);
        return -1;
    }
    let _off = crate::shim::sys::CancelOff::new();
    // The list's notification (`LIO_NOWAIT` with one asked for), counted
    // down by each request here, glibc's part, and this call's end.
    let notify = (mode == libc::LIO_NOWAIT && !sig.is_null())
        // SAFETY: `sig` is valid (not null); read as the layout above.
        .then(|| Notify::of(unsafe { *sig.cast::<SigEvent>() }))
        .filter(|n| n.sigev.notify != libc::SIGEV_NONE);
    let group = notify.map(|all| {
        Arc::new(List {
            left: AtomicUsize::new(mine.len() + usize::from(!theirs.is_empty()) + 1),
            all,
        })
    });
    let mut failed = false;
    for &cb in &mine {
        // SAFETY: each a valid control block, the program's until its
        // request completes.
        let op = match unsafe { (*cb).opcode } {
            libc::LIO_READ => Some(Op::Read),
            libc::LIO_WRITE => Some(Op::Write),
            _ => None,
        };
        let queued = match op {
            // SAFETY: as above.
            Some(op) => unsafe { enqueue(cb, op, group.clone()) == 0 },
            None => {
                // SAFETY: as above.
                refuse(unsafe { &mut *cb }, libc::EINVAL);
                false
            }
        };
        if !queued {
            // An opcode glibc does not know: completed with `EINVAL`, the
            // call failing under `LIO_WAIT` only (review 56).
            failed |= op.is_some() || mode == libc::LIO_WAIT;
            if let Some(g) = &group {
                g.one_done();
            }
        }
    }
    if !theirs.is_empty() {
        let mut ev = SigEvent {
            value: 0,
            signo: 0,
            notify: libc::SIGEV_NONE,
            function: 0,
            attributes: 0,
            pad: [0; 8],
        };
        if let Some(g) = &group {
            ev.notify = libc::SIGEV_THREAD;
            ev.function = theirs_done as *const () as usize;
            ev.value = Arc::into_raw(g.clone()) as usize;
        }
        let evp = (mode == libc::LIO_NOWAIT).then_some(&mut ev as *mut SigEvent);
        // SAFETY: glibc's call over the program's other entries (valid
        // until they complete) and a sigevent of ours.
        let r = unsafe {
            real::lio_listio(
                mode,
                theirs.as_ptr().cast(),
                theirs.len() as c_int,
                evp.map_or(std::ptr::null_mut(), |p| p.cast()),
            )
        };
        if r != 0 {
            let e = crate::shim::sys::errno();
            failed = true;
            // Nothing of glibc's part was queued (`EAGAIN`, `EINVAL`): its
            // notification will not come. (`EIO`: some were; it comes.)
            if e != libc::EIO {
                if let Some(g) = &group {
                    // SAFETY: the reference given to glibc, not used.
                    drop(unsafe { Arc::from_raw(ev.value as *const List) });
                    g.one_done();
                }
            }
            if mode == libc::LIO_WAIT && e == libc::EINTR {
                set_errno(libc::EINTR);
                return -1;
            }
        }
    }
    if let Some(g) = &group {
        g.one_done();
    }
    if mode == libc::LIO_WAIT {
        let addrs: Vec<usize> = mine.iter().map(|&cb| cb as usize).collect();
        if let Err(e) = worker::wait_for_done(|| addrs.iter().all(|&cb| over(cb)), None, false) {
            set_errno(e);
            return -1;
        }
        // SAFETY: the program's blocks, valid while this call runs.
        failed |= mine.iter().any(|&cb| unsafe { error_of(cb) } != 0);
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
