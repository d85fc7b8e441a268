//! The extended calls declared in `include/warpsock_sockets.h`, exported by
//! the library. Each one works on a socket in DDP mode and fails with
//! `ENOTSOCK` on anything else (`EBADF` for a closed descriptor).

#![allow(clippy::missing_safety_doc)]

use std::sync::Arc;

use libc::{c_int, c_void, off_t, size_t, ssize_t};
use warpsock_xsock::io::{AioOp, Completion};

use super::sock::{lookup, DdpSock};
use crate::shim::guard::enter;
use crate::shim::socket::Socket;
use crate::shim::sys::set_errno;

/// `warpsock_riomap` `prot` bits (as `PROT_READ`/`PROT_WRITE`).
const PROT_READ: c_int = libc::PROT_READ;
const PROT_WRITE: c_int = libc::PROT_WRITE;

/// `WARPSOCK_AIO_SEND`.
pub const AIO_SEND: i32 = 1;
/// `WARPSOCK_AIO_RECV`.
pub const AIO_RECV: i32 = 2;
/// `WARPSOCK_AIO_WRITE`.
pub const AIO_WRITE: i32 = 3;
/// `WARPSOCK_AIO_READ`.
pub const AIO_READ: i32 = 4;

/// `WARPSOCK_IOV_MAX`: most buffers of one `warpsock_aio_writev`.
pub const IOV_MAX: i32 = 64;

/// `WARPSOCK_SOCKETS_ABI`: the layout of the header's structures. 2:
/// `struct warpsock_aio_completion` grew from 24 to 32 bytes (`flags`,
/// `reserved`; review r20-xdead2b #6). Bumped with every layout change.
pub const SOCKETS_ABI: i32 = 2;

/// `WARPSOCK_SOCKETS_ABI` of this library, for a program to compare with
/// the header it was built against before it collects a completion: a
/// program of ABI 2 under a library of ABI 1 (or the reverse) would read
/// `struct warpsock_aio_completion`s of the other layout silently (the
/// CLI's riowrite saw "a completion with a foreign cookie": BENCHMARKS.md
/// section 6, session 20). Works on no socket; never fails.
#[no_mangle]
pub extern "C" fn warpsock_sockets_abi() -> c_int {
    SOCKETS_ABI
}

/// One completion as `struct warpsock_aio_completion` lays it out.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct WarpsockAioCompletion {
    /// The caller's cookie.
    pub cookie: u64,
    /// `WARPSOCK_AIO_SEND` 1, `_RECV` 2, `_WRITE` 3, `_READ` 4.
    pub op: i32,
    /// 0, or the errno of a failed operation.
    pub error: i32,
    /// Bytes transferred (0 for a receive: end of stream).
    pub result: i64,
    /// A receive: `MSG_EOR` if its bytes end a message (message mode, as
    /// `recvmsg`'s `msg_flags`); else 0.
    pub flags: i32,
    /// 0.
    pub reserved: i32,
}

fn with_or<T: Copy>(fd: c_int, err: T, f: impl FnOnce(&Arc<DdpSock>) -> T) -> T {
    enter(err, || match lookup(fd) {
        Ok(s) => f(&s),
        Err(e) => {
            set_errno(e);
            err
        }
    })
}

fn io_fail<T>(e: &std::io::Error, v: T) -> T {
    set_errno(e.raw_os_error().unwrap_or(libc::EIO));
    v
}

/// `f` on the DDP socket behind `fd`: its value, or `err` with errno set
/// from its error (or `ENOTSOCK`/`EBADF`).
fn io_call<R: Copy>(fd: c_int, err: R, f: impl FnOnce(&Arc<DdpSock>) -> std::io::Result<R>) -> R {
    with_or(fd, err, |s| f(s).unwrap_or_else(|e| io_fail(&e, err)))
}

/// Arguments of the one-sided calls: a buffer unless `count` is 0, an
/// offset, no flags. Sets `EINVAL` if not.
fn rio_args(buf_null: bool, count: size_t, offset: off_t, flags: c_int) -> bool {
    let ok = !(buf_null && count > 0) && offset >= 0 && flags == 0;
    if !ok {
        set_errno(libc::EINVAL);
    }
    ok
}

/// Registers `len` bytes at `buf` for the peer's one-sided access and
/// announces them under `offset` (-1: one the library chooses, which is no
/// address of the process's, unlike `rsockets`'). `prot`:
/// `PROT_WRITE` (peer may `warpsock_riowrite`) and/or `PROT_READ` (peer may
/// `warpsock_rioread`). Returns the offset, or -1.
#[no_mangle]
pub unsafe extern "C" fn warpsock_riomap(
    fd: c_int,
    buf: *mut c_void,
    len: size_t,
    prot: c_int,
    flags: c_int,
    offset: off_t,
) -> off_t {
    if buf.is_null() || flags != 0 || prot & !(PROT_READ | PROT_WRITE) != 0 || offset < -1 {
        set_errno(libc::EINVAL);
        return -1;
    }
    io_call(fd, -1, |s| {
        let off = (offset >= 0).then_some(offset as u64);
        // SAFETY: the caller maps memory it keeps valid until riounmap.
        let o = unsafe {
            s.x.riomap(
                buf.cast(),
                len,
                prot & PROT_WRITE != 0,
                prot & PROT_READ != 0,
                off,
            )
        }?;
        Ok(o as off_t)
    })
}

/// Ends the mapping of `buf`. Returns 0 or -1.
#[no_mangle]
pub unsafe extern "C" fn warpsock_riounmap(fd: c_int, buf: *mut c_void, _len: size_t) -> c_int {
    io_call(fd, -1, |s| s.x.riounmap(buf.cast()).map(|()| 0))
}

/// One-sided write of `count` bytes into the peer's mapping at `offset`;
/// returns once sent (the peer is not notified: send a message after it),
/// after the bytes of earlier sends — on a non-blocking socket `EAGAIN`
/// while some of those still wait in the send buffer. `SO_SNDTIMEO`
/// bounds it: past it the connection fails with `ETIMEDOUT` (a Write
/// cannot be withdrawn).
#[no_mangle]
pub unsafe extern "C" fn warpsock_riowrite(
    fd: c_int,
    buf: *const c_void,
    count: size_t,
    offset: off_t,
    flags: c_int,
) -> ssize_t {
    if !rio_args(buf.is_null(), count, offset, flags) {
        return -1;
    }
    let b: &[u8] = if count == 0 {
        &[]
    } else {
        // SAFETY: the caller's buffer of `count` bytes.
        unsafe { std::slice::from_raw_parts(buf.cast(), count) }
    };
    // Non-blocking (`O_NONBLOCK`): `EAGAIN` rather than wait behind bytes
    // of earlier sends that are still in the send buffer.
    io_call(fd, -1, |s| {
        let timeout = s.timeouts().1;
        Ok(s.x.riowrite_as(b, offset as u64, s.nonblocking(), timeout)? as ssize_t)
    })
}

/// One-sided read of `count` bytes from the peer's mapping at `offset`.
/// `SO_RCVTIMEO` bounds it: past it the connection fails with `ETIMEDOUT`
/// (a Read cannot be withdrawn: its Response would land later).
#[no_mangle]
pub unsafe extern "C" fn warpsock_rioread(
    fd: c_int,
    buf: *mut c_void,
    count: size_t,
    offset: off_t,
    flags: c_int,
) -> ssize_t {
    if !rio_args(buf.is_null(), count, offset, flags) {
        return -1;
    }
    let b: &mut [u8] = if count == 0 {
        &mut []
    } else {
        // SAFETY: the caller's buffer of `count` bytes.
        unsafe { std::slice::from_raw_parts_mut(buf.cast(), count) }
    };
    io_call(fd, -1, |s| {
        let timeout = s.timeouts().0;
        Ok(s.x.rioread_as(b, offset as u64, s.nonblocking(), timeout)? as ssize_t)
    })
}

/// Asynchronous send: returns at once; the completion (cookie, bytes)
/// comes from `warpsock_aio_poll`. The buffer must stay untouched until
/// then.
#[no_mangle]
pub unsafe extern "C" fn warpsock_aio_send(
    fd: c_int,
    buf: *const c_void,
    len: size_t,
    cookie: u64,
) -> c_int {
    if buf.is_null() && len > 0 {
        set_errno(libc::EINVAL);
        return -1;
    }
    io_call(fd, -1, |s| {
        // SAFETY: the caller keeps the buffer until the completion.
        unsafe { s.x.aio_send(buf.cast(), len, cookie) }.map(|()| 0)
    })
}

/// Asynchronous receive into `len` bytes at `buf` (completes with the
/// length received, 0 at end of stream).
#[no_mangle]
pub unsafe extern "C" fn warpsock_aio_recv(
    fd: c_int,
    buf: *mut c_void,
    len: size_t,
    cookie: u64,
) -> c_int {
    if buf.is_null() || len == 0 {
        set_errno(libc::EINVAL);
        return -1;
    }
    io_call(fd, -1, |s| {
        // SAFETY: the caller keeps the buffer until the completion.
        unsafe { s.x.aio_recv(buf.cast(), len, cookie) }.map(|()| 0)
    })
}

unsafe fn aio_rio(
    fd: c_int,
    buf: *mut c_void,
    len: size_t,
    offset: off_t,
    write: bool,
    cookie: u64,
) -> c_int {
    if buf.is_null() || len == 0 || offset < 0 {
        set_errno(libc::EINVAL);
        return -1;
    }
    io_call(fd, -1, |s| {
        // SAFETY: the caller keeps the buffer until the completion.
        unsafe { s.x.aio_rio(buf.cast(), len, offset as u64, write, cookie) }.map(|()| 0)
    })
}

/// Asynchronous one-sided write into the peer's mapping at `offset`.
#[no_mangle]
pub unsafe extern "C" fn warpsock_aio_write(
    fd: c_int,
    buf: *const c_void,
    len: size_t,
    offset: off_t,
    cookie: u64,
) -> c_int {
    // SAFETY: forwarded; a write only reads the buffer.
    unsafe { aio_rio(fd, buf.cast_mut(), len, offset, true, cookie) }
}

/// Asynchronous vectored one-sided write: the `iovcnt` buffers of `iov`,
/// in order, into the peer's mapping at `offset` and on, as one RDMA Write
/// with that gather list — one post and one transmit round for the lot
/// (a `warpsock_aio_write` per buffer transmits each at once), and one
/// completion (`WARPSOCK_AIO_WRITE`, the total length). `EINVAL`: no
/// `iov`, `iovcnt` outside 1..=`WARPSOCK_IOV_MAX`, an empty or NULL
/// buffer, a negative offset; `EINVAL`/`EACCES` as `warpsock_aio_write`
/// for the mapping. The buffers (not `iov` itself) belong to the library
/// until the completion is collected.
#[no_mangle]
pub unsafe extern "C" fn warpsock_aio_writev(
    fd: c_int,
    iov: *const libc::iovec,
    iovcnt: c_int,
    offset: off_t,
    cookie: u64,
) -> c_int {
    if iov.is_null() || iovcnt <= 0 || iovcnt > IOV_MAX || offset < 0 {
        set_errno(libc::EINVAL);
        return -1;
    }
    // SAFETY: the caller's array of `iovcnt` entries, read during the call.
    let iov = unsafe { std::slice::from_raw_parts(iov, iovcnt as usize) };
    let segs: Vec<(*const u8, usize)> = iov
        .iter()
        .map(|v| (v.iov_base.cast_const().cast(), v.iov_len))
        .collect();
    io_call(fd, -1, |s| {
        // SAFETY: the caller keeps the buffers until the completion; the
        // call checks each (NULL, empty, too long: EINVAL).
        unsafe { s.x.aio_writev(&segs, offset as u64, cookie) }.map(|()| 0)
    })
}

/// Asynchronous one-sided read from the peer's mapping at `offset`.
#[no_mangle]
pub unsafe extern "C" fn warpsock_aio_read(
    fd: c_int,
    buf: *mut c_void,
    len: size_t,
    offset: off_t,
    cookie: u64,
) -> c_int {
    // SAFETY: forwarded.
    unsafe { aio_rio(fd, buf, len, offset, false, cookie) }
}

/// Collects up to `max` finished asynchronous operations into `out`;
/// returns how many (0: none yet), or -1. The socket is readable
/// (poll/epoll) while completions wait.
#[no_mangle]
pub unsafe extern "C" fn warpsock_aio_poll(
    fd: c_int,
    out: *mut WarpsockAioCompletion,
    max: c_int,
) -> c_int {
    if out.is_null() || max <= 0 {
        set_errno(libc::EINVAL);
        return -1;
    }
    with_or(fd, -1, |s| {
        let mut v: Vec<Completion> = Vec::new();
        let n = s.x.aio_poll(&mut v, max as usize);
        for (i, c) in v.iter().enumerate() {
            let (error, result) = match c.result {
                Ok(n) => (0, n as i64),
                Err(e) => (e, -1),
            };
            let op = match c.op {
                AioOp::Send => AIO_SEND,
                AioOp::Recv => AIO_RECV,
                AioOp::Write => AIO_WRITE,
                AioOp::Read => AIO_READ,
            };
            // SAFETY: `out` holds `max` >= n entries (caller's contract).
            unsafe {
                out.add(i).write(WarpsockAioCompletion {
                    cookie: c.cookie,
                    op,
                    error,
                    result,
                    flags: if c.eor { libc::MSG_EOR } else { 0 },
                    reserved: 0,
                });
            }
        }
        s.settle_after_aio();
        n as c_int
    })
}

#[cfg(test)]
mod tests {
    use super::WarpsockAioCompletion as C;

    /// `struct warpsock_aio_completion` in the header (also asserted in
    /// tests/c/xsock.c).
    #[test]
    fn the_completion_struct_has_the_c_layout() {
        assert_eq!(
            (super::SOCKETS_ABI, size_of::<C>()),
            (2, 32),
            "a layout change bumps WARPSOCK_SOCKETS_ABI"
        );
        assert_eq!(align_of::<C>(), 8);
        assert_eq!(std::mem::offset_of!(C, cookie), 0);
        assert_eq!(std::mem::offset_of!(C, op), 8);
        assert_eq!(std::mem::offset_of!(C, error), 12);
        assert_eq!(std::mem::offset_of!(C, result), 16);
        assert_eq!(std::mem::offset_of!(C, flags), 24);
        assert_eq!(std::mem::offset_of!(C, reserved), 28);
    }

    /// `warpsock_sockets_abi()` is the header's `WARPSOCK_SOCKETS_ABI`
    /// (`tests/header.rs` checks `SOCKETS_ABI` against the header, and
    /// `tests/c/xsock.c` the call against the macro through the library).
    #[test]
    fn the_exported_abi_is_the_headers() {
        assert_eq!(super::warpsock_sockets_abi(), super::SOCKETS_ABI);
    }

    /// `WARPSOCK_IOV_MAX` is the limit the socket enforces.
    #[test]
    fn the_iov_limit_is_the_sockets() {
        assert_eq!(
            super::IOV_MAX as usize,
            warpsock_xsock::io::XSocket::RIO_IOV_MAX
        );
    }
}
