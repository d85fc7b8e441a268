//! stdio streams on a managed socket: `fdopen`, `freopen`, `vdprintf`,
//! `dprintf`.
//!
//! glibc's stdio reads and writes a stream made by the real `fdopen` with
//! its internal `__read`/`__write`, which no preloaded library sees: on a
//! DDP-mode socket the bytes of `fprintf` + `fflush` went to the doorbell
//! socketpair's program end (`shim::doorbell`), never to the peer, and
//! `fgets` read doorbell bytes (issue 12). `fdopen` of a managed socket
//! instead returns a stream made by glibc's `fopencookie`, whose read,
//! write and close callbacks are the interposed `read`, `write` and
//! `close` (the same paths a program's own calls take); every other
//! descriptor gets the real `fdopen`. `vdprintf` and `dprintf` (and their
//! `_FORTIFY_SOURCE` forms) are [`print`]'s. At
//! `exit` the library's streams are flushed before its exit handler closes
//! the sockets (`flush_at_exit`). `freopen` of one of those streams fails,
//! the stream closed (`reopen_refused`): glibc's cannot reopen a
//! `fopencookie` stream.
//!
//! A forked child keeps the list of the streams (`STREAMS`; its copies
//! of the parent's are refused as its copies of their sockets are) whole
//! and usable, its lock started afresh by the child's fork handler
//! (`fork_child`), whatever a thread of the parent's was doing with it
//! at the fork; the list is not held across the fork.
//!
//! A socket switched into DDP mode after its `fdopen` keeps the real
//! stream (README, "stdio streams").

#![allow(clippy::missing_safety_doc)]

use libc::{c_char, c_int, c_void, size_t, ssize_t, FILE};

use crate::shim::fdtable;
use crate::shim::guard::{self, busy, ExitOver};
use crate::shim::real;
use crate::shim::sys::set_errno;
use std::sync::atomic::{AtomicBool, Ordering};

pub mod print;
mod streams;

/// glibc's `cookie_io_functions_t` (`<stdio.h>`, `_GNU_SOURCE`).
#[repr(C)]
struct CookieIo {
    read: Option<unsafe extern "C-unwind" fn(*mut c_void, *mut c_char, size_t) -> ssize_t>,
    write: Option<unsafe extern "C-unwind" fn(*mut c_void, *const c_char, size_t) -> ssize_t>,
    seek: Option<unsafe extern "C" fn(*mut c_void, *mut i64, c_int) -> c_int>,
    close: Option<unsafe extern "C-unwind" fn(*mut c_void) -> c_int>,
}

extern "C" {
    fn fopencookie(cookie: *mut c_void, mode: *const c_char, io: CookieIo) -> *mut FILE;
    fn ftrylockfile(f: *mut FILE) -> c_int;
    fn flockfile(f: *mut FILE);
    fn funlockfile(f: *mut FILE);
    fn __fpurge(f: *mut FILE);
}

/// The head of glibc's public `struct _IO_FILE`
/// (`<bits/types/struct_FILE.h>`): `_flags`, then thirteen pointers
/// (`_IO_read_ptr` ... `_chain`), then `_fileno`, and on to `_wide_data`.
#[repr(C)]
struct IoFileHead {
    flags: c_int,
    pointers: [*mut c_void; 13],
    fileno: c_int,
    _flags2: c_int,
    _old_offset: libc::c_long,
    _cur_column: u16,
    _vtable_offset: i8,
    _shortbuf: [c_char; 1],
    _lock: *mut c_void,
    _offset: i64,
    _codecvt: *mut c_void,
    /// `(void *)-1` in a stream made with no wide orientation (glibc's
    /// `_IO_no_init` with orientation -1): `fopencookie`'s (hence every
    /// stream of [`STREAMS`]), `fmemopen`'s, `open_memstream`'s; a real
    /// file's (`fopen`, `fdopen`, `stdout`) points at its wide buffers.
    wide_data: *mut c_void,
}

#[cfg(target_pointer_width = "64")]
const _: () = assert!(std::mem::offset_of!(IoFileHead, fileno) == 112);
#[cfg(target_pointer_width = "64")]
const _: () = assert!(std::mem::offset_of!(IoFileHead, wide_data) == 160);

/// Whether `f` may be a cookie stream, one of [`STREAMS`]' (its
/// `_wide_data` is `(void *)-1`): a look at the stream alone, without
/// the list's lock.
///
/// # Safety
/// `f` is null or a stream the program may use.
unsafe fn maybe_cookie(f: *mut FILE) -> bool {
    // SAFETY: the caller's stream, glibc's `struct _IO_FILE`.
    !f.is_null() && unsafe { (*f.cast::<IoFileHead>()).wide_data } as isize == -1
}

/// A stream's cookie: its descriptor, the stream (set once made), and
/// the process that made it (a forked child's copies are its parent's:
/// [`cookie_write`], [`fork_child`]).
struct Stream {
    fd: c_int,
    file: *mut FILE,
    pid: libc::pid_t,
}

/// The streams `fdopen` made and `fclose` has not closed, as their
/// cookies (`Box<Stream>` pointers): flushed at exit before the sockets
/// close (`flush_at_exit`). A set: `fclose`'s removal is O(log n) under
/// the lock, twice (both copies: [`streams`]; a `Vec`'s `retain` made a
/// server's thousands of streams quadratic: review r26-c item 9), and a
/// forked child's first change copies it once. A forked child keeps it whole and
/// its lock starts afresh, whatever a thread of the parent's was doing
/// with it at the fork ([`streams`], [`fork_child`]).
static STREAMS: streams::Streams = streams::Streams::new();

/// Set once the library's exit handler flushed its streams
/// ([`flush_at_exit`]): the sockets' exit closes follow, and a stream's
/// write after that (glibc's own flush, `_IO_cleanup`, of a stream the
/// library left; a shared library's destructor) meets a socket whose
/// write side is shut.
static LATE: AtomicBool = AtomicBool::new(false);

/// The descriptor a stream's cookie stands for.
fn cookie_fd(cookie: *mut c_void) -> c_int {
    // SAFETY: a cookie is a live `Box<Stream>` until its close.
    unsafe { (*cookie.cast::<Stream>()).fd }
}

thread_local! {
    /// The cookie whose read or write callback this thread is inside (0:
    /// none): the exit flush ([`flush_streams`]) skips that stream — its
    /// lock is this thread's (`ftrylockfile` succeeds again), and a flush
    /// of its half-written buffer would send its prefix twice (review r27-b
    /// item 1). A `const` `Cell`: a signal handler's access allocates
    /// nothing.
    static IN_COOKIE: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Runs `f` marked as inside `cookie`'s callback ([`IN_COOKIE`]), the
/// previous mark put back after.
fn in_cookie<R>(cookie: *mut c_void, f: impl FnOnce() -> R) -> R {
    let prev = IN_COOKIE.with(|c| c.replace(cookie as usize));
    let r = f();
    IN_COOKIE.with(|c| c.set(prev));
    r
}

/// A stream's read: the interposed `read`.
unsafe extern "C-unwind" fn cookie_read(
    cookie: *mut c_void,
    buf: *mut c_char,
    len: size_t,
) -> ssize_t {
    // SAFETY: glibc's buffer of `len` bytes.
    in_cookie(cookie, || unsafe {
        super::io::read(cookie_fd(cookie), buf.cast(), len)
    })
}

/// A stream's write: the interposed `write` until every byte is taken or
/// one fails, as glibc's `_IO_new_file_write` (libio/fileops.c) loops
/// (its `_IO_cookie_write` marks the stream in error on a short count).
/// The count written.
///
/// After the exit flush ([`LATE`]) a `send` with `MSG_NOSIGNAL`: the
/// socket's write side is shut (the exit's close), and `write`'s `EPIPE`
/// raised `SIGPIPE`, which killed a process that called `exit(0)` (status
/// 141, where over TCP glibc's late flush succeeds: review r26-c item 2).
/// It fails with `EPIPE` quietly: those bytes are lost, the exit status
/// kept.
///
/// A forked child's copy of its parent's stream (its `exit` flushes it,
/// glibc's `_IO_cleanup`): the socket's copy in the child is refused by
/// design (`demote_all`: its reads fail with `ENOTCONN`, its writes with
/// `EPIPE`), so is the stream's, with `EPIPE` and no `SIGPIPE`, without a
/// call (the descriptor may be another by then): the child's `exit(0)`
/// died of `SIGPIPE` (review r26-c item 3).
///
/// Also refused so (`EPIPE`, no call): a write of a stream whose write
/// this thread is inside ([`IN_COOKIE`]: a signal handler's `exit` over
/// that write, whose stream glibc's own exit flush, `_IO_cleanup`,
/// flushes again without its lock) — its buffer's prefix would go out
/// twice — and a late write made inside the library (the guard set: the
/// exit ran over a call of this thread), which the library's `send`
/// would pass to the real one, raw bytes on the DDP connection's TCP
/// socket; a blocking one there hung the exit (review r27-b item 1).
unsafe extern "C-unwind" fn cookie_write(
    cookie: *mut c_void,
    buf: *const c_char,
    len: size_t,
) -> ssize_t {
    // SAFETY: a cookie is a live `Box<Stream>` until its close; getpid
    // has no preconditions.
    if unsafe { (*cookie.cast::<Stream>()).pid != libc::getpid() } {
        set_errno(libc::EPIPE);
        return 0;
    }
    let late = LATE.load(Ordering::Acquire);
    if IN_COOKIE.with(|c| c.get()) == cookie as usize || (late && busy()) {
        set_errno(libc::EPIPE);
        return 0;
    }
    in_cookie(cookie, || {
        // SAFETY: as the caller's.
        unsafe { write_all(cookie, buf, len, late) }
    })
}

/// [`cookie_write`]'s loop: `len` bytes at `buf` to `cookie`'s socket.
///
/// # Safety
/// `cookie` is a live cookie; `buf` holds `len` bytes.
unsafe fn write_all(cookie: *mut c_void, buf: *const c_char, len: size_t, late: bool) -> ssize_t {
    let mut done = 0;
    while done < len {
        let (fd, p) = (cookie_fd(cookie), buf.wrapping_add(done).cast());
        // SAFETY: glibc's `len` bytes at `buf`.
        let n = unsafe {
            if late {
                super::io::send(fd, p, len - done, libc::MSG_NOSIGNAL)
            } else {
                super::io::write(fd, p, len - done)
            }
        };
        if n <= 0 {
            break;
        }
        done += n as usize;
    }
    done as ssize_t
}

/// A stream's seek: a socket has no position (`ESPIPE`, as `lseek`).
unsafe extern "C" fn cookie_seek(_: *mut c_void, _: *mut i64, _: c_int) -> c_int {
    set_errno(libc::ESPIPE);
    -1
}

/// A stream's close (`fclose`): the interposed `close`, an orderly one;
/// the cookie is unlisted and freed. A stream [`reopen_refused`] closed
/// already: -1 (`fclose` returns `EOF`), `errno` left alone, as glibc's
/// `fclose` after a failed `freopen` of a socket's real stream (its
/// `_IO_file_close_it` returns `EOF` at once there).
unsafe extern "C-unwind" fn cookie_close(cookie: *mut c_void) -> c_int {
    STREAMS.remove(cookie as usize);
    // SAFETY: glibc calls this once per stream, the cookie's last use.
    let stream = unsafe { Box::from_raw(cookie.cast::<Stream>()) };
    if stream.fd < 0 {
        return -1;
    }
    // SAFETY: the stream's descriptor.
    unsafe { super::close(stream.fd) }
}

/// `freopen` of one of the library's socket streams ([`STREAMS`]) fails,
/// the stream closed as glibc's failed `freopen` leaves one: its bytes
/// flushed (errors ignored, as glibc's `_IO_SYNC` there), what is left in
/// its buffer dropped (`__fpurge`), the socket closed (the interposed
/// `close`, an orderly one), `fileno` -1 (`EBADF`); the `FILE` stays
/// allocated, its reads and writes failing with `EBADF`, until an `fclose`
/// (which returns `EOF`, as glibc's does then) frees it and, through
/// [`cookie_close`], unlists and frees the cookie. Its `_fileno` is -2,
/// glibc's own for a cookie stream (`_IO_cookie_init`), not -1: glibc's
/// `fclose` and `_IO_new_file_finish` skip the close callback of a
/// stream whose `_fileno` is -1 (`_IO_file_is_open`), and the cookie
/// stayed listed, pointing at the `FILE` `fclose` freed: the exit flush
/// ([`flush_streams`]) then locked whatever the memory held next (a
/// `SIGSEGV`), and a later stream at that address matched the stale
/// cookie here (review r27-a item 1); `fileno` returns -1 for either
/// (libio/fileno.c: `_fileno < 0`). `errno` is `ENXIO` for a `NULL`
/// path (glibc's reopen of a socket: its `/proc/self/fd` link cannot be
/// opened), else `EINVAL`. Why not glibc's: a `fopencookie` stream's
/// `_wide_data` is `(void *)-1`, and glibc's `freopen` writes through it
/// (a `SIGSEGV`, glibc 2.36), and after that it would `dup3` over the
/// socket's descriptor and close it with calls the library does not see,
/// the cookie never closed (review r26-c item 4). A forked child's copy
/// of its parent's stream is one of these ([`fork_child`]): its flush
/// fails quietly ([`cookie_write`]), and the child's copy of the socket
/// is closed. Any other stream: `false`, and a stream that cannot be a
/// cookie stream ([`maybe_cookie`]: `stdout`, any `fopen`'s) without
/// taking [`STREAMS`]' lock: the exit flush holds it across blocking
/// sends, and before a forked child's handler started it afresh
/// ([`fork_child`]) the child could have it held for ever by a thread it
/// lacks, where a daemon's `freopen("/dev/null", "w", stdout)` hung
/// (review r27-a item 2).
///
/// # Safety
/// `f` is null or a stream the program may use (not being closed
/// meanwhile).
unsafe fn reopen_refused(path: *const c_char, f: *mut FILE) -> bool {
    // SAFETY: the caller's stream.
    if !unsafe { maybe_cookie(f) } {
        return false;
    }
    // SAFETY: live cookies (removed from the list, under its lock, before
    // they are freed).
    let found = STREAMS
        .locked()
        .iter()
        .copied()
        .find(|&c| unsafe { (*(c as *const Stream)).file == f });
    let Some(c) = found else {
        return false;
    };
    /// The stream's lock given back, on return and on a cancel's unwind
    /// (`fflush`'s write, `close`).
    struct Locked(*mut FILE);
    impl Drop for Locked {
        fn drop(&mut self) {
            // SAFETY: locked by this thread below.
            unsafe { funlockfile(self.0) };
        }
    }
    // SAFETY: the program's stream, open; its lock is recursive.
    unsafe { flockfile(f) };
    let locked = Locked(f);
    // SAFETY: `f` is open and locked by this thread; the cookie is live
    // until its close, which takes the stream's lock; `_fileno` is in
    // `IoFileHead`.
    let fd = unsafe {
        libc::fflush(f);
        __fpurge(f);
        (*f.cast::<IoFileHead>()).fileno = -2;
        std::mem::replace(&mut (*(c as *mut Stream)).fd, -1)
    };
    drop(locked);
    // -1 on a second `freopen` of a stream refused before: none to close
    // (review r27-c item 8).
    if fd >= 0 {
        // SAFETY: the stream's descriptor, no longer the stream's.
        unsafe { super::close(fd) };
    }
    set_errno(if path.is_null() {
        libc::ENXIO
    } else {
        libc::EINVAL
    });
    true
}

/// Interposed `freopen(3)`: on one of the library's socket streams, it
/// fails, the stream closed as a failed `freopen` leaves one
/// (`reopen_refused`); any other stream's is glibc's.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C-unwind" fn freopen(
    path: *const c_char,
    mode: *const c_char,
    f: *mut FILE,
) -> *mut FILE {
    // SAFETY: the caller's arguments.
    unsafe { reopen(path, f, || real::freopen(path, mode, f)) }
}

/// Interposed `freopen64(3)`: as [`freopen`] (glibc's is the same call
/// with `O_LARGEFILE`).
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C-unwind" fn freopen64(
    path: *const c_char,
    mode: *const c_char,
    f: *mut FILE,
) -> *mut FILE {
    // SAFETY: the caller's arguments.
    unsafe { reopen(path, f, || real::freopen64(path, mode, f)) }
}

/// [`freopen`]'s and [`freopen64`]'s body: null if `f` is one of the
/// library's socket streams (refused), else glibc's call (`real`, which
/// forwards the caller's arguments).
unsafe fn reopen(path: *const c_char, f: *mut FILE, real: impl FnOnce() -> *mut FILE) -> *mut FILE {
    // SAFETY: the caller's stream.
    if !busy() && unsafe { reopen_refused(path, f) } {
        return std::ptr::null_mut();
    }
    real()
}

/// At `exit`, before the DDP sockets close (`xsock` `at_exit`): every
/// stream of [`STREAMS`] with bytes in its buffer is flushed. glibc
/// flushes streams after the exit handlers (`_IO_cleanup`, libio/genops.c),
/// when the library has closed the sockets: the tail was lost and the peer
/// read a clean end after a short stream. A stream another thread holds
/// locked (`ftrylockfile`) is left alone (its buffer may be a read's), and
/// so is every stream if the list's lock is not had within about 2 ms
/// (`Streams::trying`: held by this thread, a signal handler's `exit`
/// over its `fdopen` or `fclose`, or by another that long): glibc's flush
/// of those comes after, and fails quietly ([`LATE`], [`cookie_write`]).
///
/// `over`: what the exit runs over (`interpose::exit_over`, found before
/// this flush). Over a stretch of a call that may hold a lock, nothing
/// (the flush's writes would wait on it; left to glibc). Over a call's
/// sleep that holds none (a signal handler's `exit` over a `poll`, a
/// blocking receive past its first slice, a send's wait for credits; its
/// wait given back), the streams are flushed with the guard cleared
/// ([`guard::outside`]), so that their writes reach the library: before,
/// this flush skipped every stream there while the kinds closed the
/// sockets as from outside, and glibc's late flush lost the tails (review
/// r27-b item 1). A stream whose callback this thread is inside
/// ([`IN_COOKIE`]) is skipped.
pub(crate) fn flush_at_exit(over: ExitOver) {
    match over {
        ExitOver::Locks => {}
        ExitOver::Nothing => flush_streams(),
        ExitOver::Sleep(_) => guard::outside(flush_streams),
    }
    LATE.store(true, Ordering::Release);
}

/// [`flush_at_exit`]'s flushes: this process's streams (a forked child's
/// list holds its parent's too, [`fork_child`]: skipped here), but the
/// one whose callback this thread is inside ([`IN_COOKIE`]).
fn flush_streams() {
    let inside = IN_COOKIE.with(|c| c.get());
    let Some(streams) = STREAMS.trying() else {
        return;
    };
    // SAFETY: getpid has no preconditions.
    let me = unsafe { libc::getpid() };
    for &c in streams.iter() {
        // SAFETY: a live cookie (removed from the list, under its lock,
        // before it is freed).
        let (f, pid) = unsafe { ((*(c as *const Stream)).file, (*(c as *const Stream)).pid) };
        if pid != me || c == inside {
            continue;
        }
        // SAFETY: `f` is open (its close takes the list's lock first).
        if unsafe { ftrylockfile(f) } != 0 {
            continue;
        }
        // SAFETY: glibc's `struct _IO_FILE`; `_IO_write_base` and
        // `_IO_write_ptr` are its 4th and 5th pointers. Flushed with the
        // stream's (recursive) lock held.
        unsafe {
            let head = &*f.cast::<IoFileHead>();
            if head.pointers[4] > head.pointers[3] {
                libc::fflush(f);
            }
            funlockfile(f);
        }
    }
}

/// The atfork child handler's part: [`STREAMS`]' lock, which a thread of
/// the parent's may have held at the fork for any time (inside an
/// `fdopen`'s record or an `fclose`'s removal, preempted; the exit
/// flush), starts afresh, so the child never waits for a thread it does
/// not have (its first `fclose` of a stream blocked for ever: review
/// r26-c item 3, and again with the prepare handler's bounded try of the
/// lock, about 2 ms, before it forked without it: issue 12, as review
/// r29-c item 7 for the epoll sets' list). The list is kept, whole (the
/// one before a record or removal under way at the fork, or the one
/// after it: [`streams`]). Its streams are the parent's (their `pid`;
/// their sockets' copies here are refused by design): the child's `exit`
/// does not flush them ([`flush_at_exit`]), glibc's flush of them fails
/// quietly ([`cookie_write`]), and a `freopen` of one fails as one of the
/// child's own would ([`reopen_refused`], which finds it in the list),
/// where glibc's crashed: so they stay listed (before, the list was
/// emptied here: review r26-c item 4), until the child's `fclose` of one
/// removes it and frees its cookie. No lock, no allocation; the prepare
/// and parent handlers do nothing for the list (a signal handler's
/// `fork` over its own thread's `fdopen` or `fclose` waits for nothing).
pub(crate) fn fork_child() {
    STREAMS.fork_child();
}

/// `fdopen`'s mode as glibc's `_IO_new_fdopen` (libio/iofdopen.c) reads
/// it: `r`, `w` or `a` first (else `None`: `EINVAL`), then up to four
/// more characters, the first `+` making it read-write (`b`, `x`, `m` and
/// the others ignored; `\0` ends it). The mode for `fopencookie`.
fn stream_mode(mode: &[u8]) -> Option<&'static std::ffi::CStr> {
    let rw = mode
        .iter()
        .skip(1)
        .take(4)
        .take_while(|&&c| c != 0)
        .any(|&c| c == b'+');
    Some(match (mode.first()?, rw) {
        (b'r', false) => c"r",
        (b'r', true) => c"r+",
        (b'w', false) => c"w",
        (b'w', true) => c"w+",
        (b'a', false) => c"a",
        (b'a', true) => c"a+",
        _ => return None,
    })
}

/// Interposed `fdopen(3)`: a managed socket's stream reads, writes and
/// closes through the library; any other descriptor's is the real one.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn fdopen(fd: c_int, mode: *const c_char) -> *mut FILE {
    if busy() || fdtable::get(fd).is_none() {
        // SAFETY: forwarding the caller's arguments.
        return unsafe { real::fdopen(fd, mode) };
    }
    // SAFETY: the caller's NUL-terminated mode; at most five bytes are
    // looked at, none past its NUL.
    let head = unsafe { std::slice::from_raw_parts(mode.cast::<u8>(), mode_len(mode)) };
    let Some(m) = stream_mode(head) else {
        set_errno(libc::EINVAL);
        return std::ptr::null_mut();
    };
    // As glibc's: a descriptor opened for reading only cannot be a
    // stream that writes, nor one opened for writing only a stream that
    // reads (a socket is O_RDWR). Not O_APPEND for `a`: it means nothing
    // on a socket.
    // SAFETY: F_GETFL takes no argument.
    let fl = unsafe { real::fcntl(fd, libc::F_GETFL, 0) };
    if fl < 0 {
        return std::ptr::null_mut();
    }
    let (reads, writes) = match m.to_bytes() {
        b"r" => (true, false),
        b"w" | b"a" => (false, true),
        _ => (true, true),
    };
    if (fl & libc::O_ACCMODE == libc::O_RDONLY && writes)
        || (fl & libc::O_ACCMODE == libc::O_WRONLY && reads)
    {
        set_errno(libc::EINVAL);
        return std::ptr::null_mut();
    }
    let io = CookieIo {
        read: Some(cookie_read),
        write: Some(cookie_write),
        seek: Some(cookie_seek),
        close: Some(cookie_close),
    };
    let cookie = Box::into_raw(Box::new(Stream {
        fd,
        file: std::ptr::null_mut(),
        // SAFETY: getpid has no preconditions.
        pid: unsafe { libc::getpid() },
    }));
    // SAFETY: a static mode; the callbacks take the cookie, freed by the
    // close callback.
    let f = unsafe { fopencookie(cookie.cast(), m.as_ptr(), io) };
    if f.is_null() {
        // SAFETY: not given to glibc.
        drop(unsafe { Box::from_raw(cookie) });
    } else {
        // `fileno(f)` is the socket's descriptor, as a real stream's.
        // glibc's `_IO_cookie_init` (libio/iofopncook.c) sets `_fileno`
        // to -2 ("not associated with a real file, but still has to be
        // treated as such"); the stream's vtable stays `_IO_cookie_jumps`
        // whatever `_fileno` is, so reads, writes, seeks and the close
        // still go to the callbacks above. What else reads `_fileno`:
        // `fileno` (libio/fileno.c: `_IO_IS_FILEBUF` set and `_fileno`
        // >= 0, so it returns it), `_IO_file_close_it` (closes a stream
        // whose `_fileno` is not -1: this one, through the vtable's
        // close) and `_IO_file_doallocate` (libio/filedoalloc.c: with
        // `_fileno` >= 0 it asks the vtable's `stat`, the cookie one's
        // `_IO_default_stat`, which fails: a BUFSIZ buffer, full
        // buffering, as for -2).
        // SAFETY: `f` is glibc's `struct _IO_FILE`, whose public head is
        // `IoFileHead`.
        unsafe { (*f.cast::<IoFileHead>()).fileno = fd };
        // SAFETY: the cookie is not shared yet.
        unsafe { (*cookie).file = f };
        STREAMS.insert(cookie as usize);
    }
    f
}

/// The length of `mode` up to its NUL, at most 5 (all `fdopen` reads).
fn mode_len(mode: *const c_char) -> usize {
    let mut n = 0;
    // SAFETY: a NUL-terminated string: no byte past its NUL is read.
    while n < 5 && unsafe { *mode.add(n) } != 0 {
        n += 1;
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::time::Duration;

    /// `freopen` of a real file's stream (a `tmpfile`, as `stdout`) does
    /// not take [`STREAMS`]' lock: with the lock held elsewhere (as a
    /// forked child may inherit it) `reopen_refused` still answers,
    /// `false`; a `fmemopen` stream (a cookie stream, not the library's)
    /// is looked for in the list once the lock is free, `false` too.
    /// Fails (the first look waits for the lock, 10 s) with every stream
    /// looked for in the list (review r27-a item 2).
    #[test]
    fn a_real_files_freopen_does_not_take_the_streams_lock() {
        let held = STREAMS.locked();
        // SAFETY: tmpfile has no preconditions.
        let file = unsafe { libc::tmpfile() };
        assert!(!file.is_null());
        let mut buf = [0u8; 16];
        // SAFETY: a memory stream over `buf`, closed below.
        let mem = unsafe { libc::fmemopen(buf.as_mut_ptr().cast(), buf.len(), c"w".as_ptr()) };
        assert!(!mem.is_null());
        // SAFETY: both are open streams.
        assert!(unsafe { !maybe_cookie(file) && maybe_cookie(mem) });
        let (file, mem) = (file as usize, mem as usize);
        let (say, hear) = mpsc::channel();
        let looker = std::thread::spawn(move || {
            for f in [file, mem] {
                // SAFETY: an open stream, not closed meanwhile.
                let refused = unsafe { reopen_refused(std::ptr::null(), f as *mut FILE) };
                let _ = say.send(refused);
            }
        });
        let first = hear.recv_timeout(Duration::from_secs(10));
        drop(held);
        let second = hear.recv_timeout(Duration::from_secs(10));
        looker.join().unwrap();
        // SAFETY: closing the two streams.
        unsafe {
            libc::fclose(file as *mut FILE);
            libc::fclose(mem as *mut FILE);
        }
        assert_eq!(first, Ok(false), "the real file's look waited for the lock");
        assert_eq!(second, Ok(false));
    }

    /// fdopen's modes as glibc's: the first letter, then a `+` among the
    /// next four characters (before the NUL) makes it read-write.
    #[test]
    fn modes_read_as_glibc_fdopen_reads_them() {
        let m = |s: &[u8]| stream_mode(s).map(|c| c.to_bytes());
        assert_eq!(m(b"r"), Some(&b"r"[..]));
        assert_eq!(m(b"r+"), Some(&b"r+"[..]));
        assert_eq!(m(b"rb+"), Some(&b"r+"[..]));
        assert_eq!(m(b"wxbm+"), Some(&b"w+"[..]));
        assert_eq!(m(b"wxbmb+"), Some(&b"w"[..]));
        assert_eq!(m(b"a"), Some(&b"a"[..]));
        assert_eq!(m(b"ae"), Some(&b"a"[..]));
        assert_eq!(m(b"a\0+"), Some(&b"a"[..]));
        assert_eq!(m(b"x"), None);
        assert_eq!(m(b"+r"), None);
        assert_eq!(m(b""), None);
    }
}
