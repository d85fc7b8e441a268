//! The interposed calls that move bytes between two descriptors inside
//! the kernel, `sendfile(2)` and `splice(2)`, where one end is a managed
//! socket. The number of a DDP-mode socket names a doorbell end (its
//! kernel socket is the library's), so the kernel must neither read nor
//! write it: its `splice` read the doorbell's wake-up bytes as the stream
//! and wrote the program's bytes into the doorbell, lost. Here the bytes
//! go through a buffer of ours and the socket's own calls.
//!
//! Each call answers as Linux's does over TCP (`tests/c/spliceddp.c`
//! passes against both): its errors (a socket end with an offset,
//! neither end a pipe, a file at the other end: `EINVAL`; a socket as
//! `sendfile`'s input: moved as `splice` moves it into a pipe, `EINVAL`
//! into anything else, `ESPIPE` with an offset), its waits
//! (the socket's own blocking mode and timeouts; the pipe's with
//! `SPLICE_F_NONBLOCK` or its `O_NONBLOCK`), its partial counts, end of
//! stream as 0. And it takes from its input no byte its output did not
//! take, as the kernel's moves buffers: `splice` from a socket peeks
//! (`MSG_PEEK`) and receives only what the pipe took; `splice` to a
//! socket copies the pipe's bytes with `tee` (which leaves them in the
//! pipe) and reads from the pipe only what the socket took — a
//! non-blocking socket's `EAGAIN` or a reset leaves them there. Both go
//! through a scratch pipe of the call's own (`Scratch`): `tee` writes only
//! to a pipe, and a pipe-to-pipe `splice` with `SPLICE_F_NONBLOCK` is the
//! one write to the program's pipe that never blocks, whatever its own
//! `O_NONBLOCK`. A call moves at most a scratch pipe's 64 KiB; a program
//! loops over partial counts, as it must with the kernel's.
//!
//! Not atomic against another thread reading the same socket or pipe
//! between the peek and the take (the kernel holds the socket's lock
//! across its `splice`): such a program's bytes were interleaved
//! arbitrarily anyway.

#![allow(clippy::missing_safety_doc)]

use libc::{c_uint, loff_t};

use super::*;

/// The most one `splice` over a managed socket moves: a scratch pipe's
/// default capacity (16 pages).
const CHUNK: usize = 64 * 1024;

/// Interposed `splice(2)`: see the module's docs.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C-unwind" fn splice(
    fd_in: c_int,
    off_in: *mut loff_t,
    fd_out: c_int,
    off_out: *mut loff_t,
    len: size_t,
    flags: c_uint,
) -> ssize_t {
    cancellable(move || {
        let (from, to) = (managed(fd_in), managed(fd_out));
        if from.is_none() && to.is_none() {
            // SAFETY: forwarding the caller's arguments.
            return unsafe { real::splice(fd_in, off_in, fd_out, off_out, len, flags) };
        }
        enter(-1, || {
            let r = if len == 0 {
                // Linux answers a zero length first, whatever the rest.
                Ok(0)
            } else if flags & !SPLICE_F_ALL != 0 {
                Err(libc::EINVAL)
            } else {
                match (from, to) {
                    (Some(s), None) => {
                        from_socket(&*s, off_in.is_null(), fd_out, off_out.is_null(), len, flags)
                    }
                    (None, Some(s)) => {
                        to_socket(fd_in, off_in.is_null(), &*s, off_out.is_null(), len, flags)
                    }
                    // Two sockets: neither end a pipe.
                    _ => Err(libc::EINVAL),
                }
            };
            match r {
                Ok(n) => n as ssize_t,
                Err(e) => {
                    set_errno(e);
                    -1
                }
            }
        })
    })
}

/// Every flag `splice` knows (`SPLICE_F_MOVE`, `_NONBLOCK`, `_MORE`,
/// `_GIFT`; linux/splice.h).
const SPLICE_F_ALL: c_uint =
    libc::SPLICE_F_MOVE | libc::SPLICE_F_NONBLOCK | libc::SPLICE_F_MORE | libc::SPLICE_F_GIFT;

/// The other end of a `splice` with a managed socket: a pipe open for
/// `access` (`O_RDONLY` or `O_WRONLY`), checked as Linux checks it
/// (`EBADF` for the wrong access, `EINVAL` for a file that is no pipe, an
/// offset on the socket's side; `ESPIPE` for one on the pipe's). Whether
/// the call's pipe operations are non-blocking: its own description's
/// `O_NONBLOCK`, or `SPLICE_F_NONBLOCK` in `flags`.
fn pipe_end(
    fd: c_int,
    access: c_int,
    no_pipe_offset: bool,
    no_socket_offset: bool,
    flags: c_uint,
) -> Result<bool, c_int> {
    // SAFETY: F_GETFL takes no pointer.
    let fl = unsafe { real::fcntl(fd, libc::F_GETFL, 0) };
    if fl < 0 {
        return Err(sys::errno());
    }
    let mode = fl & libc::O_ACCMODE;
    if mode != access && mode != libc::O_RDWR {
        return Err(libc::EBADF);
    }
    if !is_pipe(fd)? {
        return Err(libc::EINVAL);
    }
    if !no_pipe_offset {
        return Err(libc::ESPIPE);
    }
    if !no_socket_offset {
        return Err(libc::EINVAL);
    }
    Ok(fl & libc::O_NONBLOCK != 0 || flags & libc::SPLICE_F_NONBLOCK != 0)
}

/// Whether `fd` is a pipe (or a FIFO); its `fstat`'s errno if it has none.
fn is_pipe(fd: c_int) -> Result<bool, c_int> {
    // SAFETY: fstat into a zeroed stat on the stack.
    let mut st: libc::stat = unsafe { zeroed() };
    // SAFETY: as above.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return Err(sys::errno());
    }
    Ok(st.st_mode & libc::S_IFMT == libc::S_IFIFO)
}

/// A pipe of the call's own, both ends non-blocking, closed on drop.
struct Scratch {
    r: c_int,
    w: c_int,
}

impl Scratch {
    fn new() -> Result<Self, c_int> {
        let mut p = [-1 as c_int; 2];
        // SAFETY: pipe2 writes two descriptors into `p` (raw: libc's
        // `pipe2` is no cancellation point, but the library's own
        // descriptors are made by system calls throughout).
        let r = unsafe {
            libc::syscall(
                libc::SYS_pipe2,
                p.as_mut_ptr(),
                libc::c_long::from(libc::O_CLOEXEC | libc::O_NONBLOCK),
            )
        };
        if r < 0 {
            return Err(sys::errno());
        }
        Ok(Self { r: p[0], w: p[1] })
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        sys::close(self.r);
        sys::close(self.w);
    }
}

/// The raw `splice` system call (the library's own: not the interposed
/// function, nor a cancellation point).
fn splice_raw(fd_in: c_int, fd_out: c_int, len: usize, flags: c_uint) -> isize {
    // SAFETY: no offsets; the descriptors are the caller's and ours.
    unsafe {
        libc::syscall(
            libc::SYS_splice,
            libc::c_long::from(fd_in),
            std::ptr::null_mut::<loff_t>(),
            libc::c_long::from(fd_out),
            std::ptr::null_mut::<loff_t>(),
            len,
            libc::c_long::from(flags as c_int),
        ) as isize
    }
}

/// Bytes queued in pipe `fd` (`FIONREAD`), 0 if it cannot be asked.
fn queued(fd: c_int) -> usize {
    let mut n: c_int = 0;
    // SAFETY: FIONREAD writes one int.
    let r = unsafe {
        libc::syscall(
            libc::SYS_ioctl,
            libc::c_long::from(fd),
            libc::FIONREAD,
            &mut n,
        )
    };
    if r < 0 {
        0
    } else {
        n.max(0) as usize
    }
}

/// `splice` from managed socket `s` into pipe `fd`: peeks at up to `len`
/// bytes (waiting as the socket's receive waits), moves them into the pipe
/// (waiting for room unless non-blocking), and receives from the socket
/// what the pipe took.
fn from_socket(
    s: &dyn Socket,
    no_socket_offset: bool,
    fd: c_int,
    no_pipe_offset: bool,
    len: usize,
    flags: c_uint,
) -> Result<usize, c_int> {
    let nonblocking = pipe_end(fd, libc::O_WRONLY, no_pipe_offset, no_socket_offset, flags)?;
    // Linux waits for the pipe's room before it reads the socket: a pipe
    // with no reader fails the call with `EPIPE` (and `SIGPIPE`), a full
    // one a non-blocking call with `EAGAIN`, both with nothing to read
    // too (review 55: the peek waited for the socket's bytes first).
    let room = sys::ready_now(fd, libc::POLLOUT);
    if room & libc::POLLERR != 0 {
        // SAFETY: a signal to the calling thread, as the kernel's pipe
        // write sends it.
        unsafe { libc::raise(libc::SIGPIPE) };
        return Err(libc::EPIPE);
    }
    if nonblocking && room == 0 {
        return Err(libc::EAGAIN);
    }
    let mut buf = vec![0u8; len.min(CHUNK)];
    // SAFETY: our own buffer.
    let n = unsafe { s.recv_one(buf.as_mut_ptr().cast(), buf.len(), libc::MSG_PEEK) };
    if n < 0 {
        return Err(sys::errno());
    }
    if n == 0 {
        return Ok(0);
    }
    let scratch = Scratch::new()?;
    // SAFETY: our own buffer's first `n` bytes, into an empty pipe: as
    // many as it holds (64 KiB, or two pages once the user passed
    // `pipe-user-pages-soft`; review 55), the rest left in the socket.
    let n = unsafe { sys::write_raw(scratch.w, buf.as_ptr(), n as usize) };
    if n <= 0 {
        return Err(if n < 0 { sys::errno() } else { libc::EIO });
    }
    let n = n as usize;
    let took = loop {
        let k = splice_raw(scratch.r, fd, n, libc::SPLICE_F_NONBLOCK);
        if k > 0 {
            break k as usize;
        }
        let e = if k < 0 { sys::errno() } else { libc::EIO };
        if e != libc::EAGAIN || nonblocking {
            return Err(e);
        }
        // The pipe full: its room (a pipe with no reader reads as ready,
        // and the next move fails with `EPIPE`).
        sys::wait_fd(fd, libc::POLLOUT, None)?;
    };
    // The peeked bytes are the socket's next: taken at once.
    let mut taken = 0;
    while taken < took {
        // SAFETY: our own buffer.
        let k = unsafe { s.recv_one(buf.as_mut_ptr().cast(), took - taken, libc::MSG_DONTWAIT) };
        if k <= 0 {
            break;
        }
        taken += k as usize;
    }
    Ok(took)
}

/// `splice` from pipe `fd` to managed socket `s`: waits for the pipe's
/// bytes (unless non-blocking; its end of input is 0), copies up to `len`
/// of them with `tee`, sends them as the socket's send does, and reads
/// from the pipe what the socket took.
fn to_socket(
    fd: c_int,
    no_pipe_offset: bool,
    s: &dyn Socket,
    no_socket_offset: bool,
    len: usize,
    flags: c_uint,
) -> Result<usize, c_int> {
    let nonblocking = pipe_end(fd, libc::O_RDONLY, no_pipe_offset, no_socket_offset, flags)?;
    // The scratch pipe is made once the bytes are there: not held through
    // the wait (review 55).
    let mut scratch = None;
    let copied = loop {
        if queued(fd) > 0 {
            let sc = match &scratch {
                Some(sc) => sc,
                None => scratch.insert(Scratch::new()?),
            };
            let k = splice_tee(fd, sc.w, len.min(CHUNK));
            if k > 0 {
                break k as usize;
            }
            if k < 0 && sys::errno() != libc::EAGAIN {
                return Err(sys::errno());
            }
            // Taken meanwhile by another reader: as empty.
        }
        // Empty: its end (no writer left) is 0, as Linux answers first.
        if sys::ready_now(fd, libc::POLLIN) & libc::POLLHUP != 0 && queued(fd) == 0 {
            return Ok(0);
        }
        if nonblocking {
            return Err(libc::EAGAIN);
        }
        sys::wait_fd(fd, libc::POLLIN, None)?;
    };
    let Some(scratch) = scratch else {
        unreachable!("bytes were copied into the scratch pipe");
    };
    let mut buf = vec![0u8; copied];
    // SAFETY: our own buffer; the scratch pipe holds `copied` bytes.
    let got = unsafe { sys::read_raw(scratch.r, buf.as_mut_ptr(), copied) };
    if got != copied as isize {
        return Err(if got < 0 { sys::errno() } else { libc::EIO });
    }
    let more = if flags & libc::SPLICE_F_MORE != 0 {
        libc::MSG_MORE
    } else {
        0
    };
    // SAFETY: our own buffer.
    let sent = unsafe { s.send_one(buf.as_ptr().cast(), copied, more) };
    if sent < 0 {
        return Err(sys::errno());
    }
    // What the socket took leaves the pipe (the same bytes: `tee` copied
    // the pipe's first ones).
    let sent = sent as usize;
    let mut read = 0;
    while read < sent {
        // SAFETY: our own buffer.
        let k = unsafe { sys::read_raw(fd, buf.as_mut_ptr(), sent - read) };
        if k <= 0 {
            break;
        }
        read += k as usize;
    }
    Ok(sent)
}

/// The raw `tee` system call, non-blocking: copies up to `len` bytes of
/// pipe `fd_in` into pipe `fd_out`, leaving them in `fd_in`.
fn splice_tee(fd_in: c_int, fd_out: c_int, len: usize) -> isize {
    // SAFETY: two pipes; no pointers.
    unsafe {
        libc::syscall(
            libc::SYS_tee,
            libc::c_long::from(fd_in),
            libc::c_long::from(fd_out),
            len,
            libc::c_long::from(libc::SPLICE_F_NONBLOCK as c_int),
        ) as isize
    }
}

/// Interposed `sendfile(2)`: to a managed socket, the file's bytes go
/// through its send path (the program's descriptor is not the kernel
/// socket, so the kernel must not write to it).
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C-unwind" fn sendfile(
    out_fd: c_int,
    in_fd: c_int,
    offset: *mut libc::off_t,
    count: size_t,
) -> ssize_t {
    cancellable(move || {
        if let Some(s) = managed(in_fd) {
            // From a socket: into a pipe, as `splice` moves it (Linux's
            // `sendfile` splices into a pipe output, non-blocking if the
            // socket is); into anything else `EINVAL` (Linux reads only
            // files there); `ESPIPE` first for an offset, which a socket
            // cannot take. The kernel's call would read the doorbell's end
            // the number names; ours below would have read it too, into a
            // managed output.
            let r = if !offset.is_null() {
                Err(libc::ESPIPE)
            } else {
                match is_pipe(out_fd) {
                    Ok(true) => {
                        let nb = if s.nonblocking() {
                            libc::SPLICE_F_NONBLOCK
                        } else {
                            0
                        };
                        enter(Err(libc::EIO), || {
                            from_socket(&*s, true, out_fd, true, count, nb)
                        })
                    }
                    Ok(false) => Err(libc::EINVAL),
                    Err(e) => Err(e),
                }
            };
            return match r {
                Ok(n) => n as ssize_t,
                Err(e) => {
                    set_errno(e);
                    -1
                }
            };
        }
        let Some(s) = managed(out_fd) else {
            // SAFETY: forwarding the caller's arguments.
            return unsafe { real::sendfile(out_fd, in_fd, offset, count) };
        };
        enter(-1, || {
            let mut buf = vec![0u8; count.min(1 << 20)];
            // With no offset, the file position: read at it, and moved only by
            // what was sent, once that is known — Linux's `sendfile` leaves it
            // unchanged on an error, and a program retries after `EAGAIN` or
            // `EINTR` from there (review r22-b item 1: the read moved it by up
            // to 1 MiB before a send that failed, and the retry skipped those
            // bytes: the peer got a file with a hole). A file that cannot seek
            // is read (what a failed send took from it is lost).
            let at = if offset.is_null() {
                // SAFETY: a query of the caller's file position.
                let pos = unsafe { libc::lseek(in_fd, 0, libc::SEEK_CUR) };
                (pos >= 0).then_some(pos)
            } else {
                // SAFETY: the caller's offset.
                Some(unsafe { *offset })
            };
            // Raw reads (libc's are cancellation points, here inside the
            // library: a cancel of a thread blocked in one aborted the
            // process); an input that can block (a pipe: Linux's own
            // sendfile refuses one) is waited for first, so that a pending
            // cancel ends the call (`sys::wait_fd`). Not for a call that
            // reads nothing (`count` 0: Linux returns 0), nor at an offset
            // (`pread` of a pipe fails with `ESPIPE` at once, as Linux's
            // `sendfile`; review r25-a item 8: both waited for the input).
            if count > 0 && at.is_none() {
                if let Err(e) = wait_input(in_fd) {
                    set_errno(e);
                    return -1;
                }
            }
            let n = match at {
                // SAFETY: reading into our own buffer at the position.
                Some(pos) => unsafe { sys::pread_raw(in_fd, buf.as_mut_ptr(), buf.len(), pos) },
                // SAFETY: reading into our own buffer.
                None => unsafe { sys::read_raw(in_fd, buf.as_mut_ptr(), buf.len()) },
            };
            if n <= 0 {
                return n;
            }
            let v = one_iov(buf.as_mut_ptr().cast(), n as size_t);
            let mut m = empty_msg();
            m.msg_iov = (&v as *const iovec).cast_mut();
            m.msg_iovlen = 1;
            // SAFETY: `m` describes our own buffer.
            let sent = unsafe { s.sendmsg(&m, 0) };
            if sent > 0 {
                match at {
                    Some(pos) if offset.is_null() => {
                        // SAFETY: moving the caller's file position past what
                        // was sent.
                        unsafe { libc::lseek(in_fd, pos + sent as libc::off_t, libc::SEEK_SET) };
                    }
                    // SAFETY: the caller's offset.
                    Some(_) => unsafe { *offset += sent as libc::off_t },
                    None => {}
                }
            }
            sent
        })
    })
}

/// Before `sendfile`'s read of `in_fd`: a blocking input that is not a
/// file or a block device (whose reads never wait for a writer) is
/// waited for until readable (raw: see [`sys::wait_fd`]). `Err(errno)`:
/// the wait ended (a pending cancel, a signal).
fn wait_input(in_fd: c_int) -> Result<(), c_int> {
    // SAFETY: fstat into a zeroed stat on the stack.
    let mut st: libc::stat = unsafe { zeroed() };
    // SAFETY: as above.
    if unsafe { libc::fstat(in_fd, &mut st) } != 0 {
        return Ok(());
    }
    let fmt = st.st_mode & libc::S_IFMT;
    if fmt == libc::S_IFREG || fmt == libc::S_IFBLK {
        return Ok(());
    }
    // SAFETY: a query of the caller's descriptor's status flags.
    let fl = unsafe { real::fcntl(in_fd, libc::F_GETFL, 0) };
    if fl < 0 || fl & libc::O_NONBLOCK != 0 {
        return Ok(());
    }
    sys::wait_fd(in_fd, libc::POLLIN, None).map(|_| ())
}

/// Interposed `sendfile64` (same as `sendfile` on 64-bit targets).
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C-unwind" fn sendfile64(
    out_fd: c_int,
    in_fd: c_int,
    offset: *mut libc::off_t,
    count: size_t,
) -> ssize_t {
    cancellable(move || {
        // SAFETY: same contract.
        unsafe { sendfile(out_fd, in_fd, offset, count) }
    })
}
