//! The system calls the I/O side makes on the application's TCP socket
//! during a switch: urgent data, the mark, peeking. The only module of the
//! crate that calls libc directly.
#![allow(unsafe_code)]

use std::io;
use std::os::fd::RawFd;
use std::time::Instant;

fn check(r: isize) -> io::Result<usize> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r as usize)
    }
}

/// Sends one urgent byte (`MSG_OOB`).
pub(crate) fn send_urgent(fd: RawFd, b: u8) -> io::Result<()> {
    loop {
        // SAFETY: a one-byte buffer on the stack.
        let r = unsafe {
            libc::send(
                fd,
                (&b as *const u8).cast(),
                1,
                libc::MSG_OOB | libc::MSG_NOSIGNAL,
            )
        };
        match check(r) {
            Ok(_) => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                wait(fd, libc::POLLOUT, None)?;
            }
            Err(e) => return Err(e),
        }
    }
}

/// `SIOCATMARK` (asm-generic/sockios.h; the libc crate lacks it).
const SIOCATMARK: libc::c_ulong = 0x8905;

/// Whether the read position is at the urgent mark (`SIOCATMARK`).
pub(crate) fn at_mark(fd: RawFd) -> io::Result<bool> {
    let mut v: libc::c_int = 0;
    // SAFETY: SIOCATMARK writes one int.
    let r = unsafe { libc::ioctl(fd, SIOCATMARK, &mut v) };
    check(r as isize).map(|_| v != 0)
}

/// Bytes readable now (`FIONREAD`; the urgent byte is not counted).
pub(crate) fn readable(fd: RawFd) -> io::Result<usize> {
    let mut v: libc::c_int = 0;
    // SAFETY: FIONREAD writes one int.
    let r = unsafe { libc::ioctl(fd, libc::FIONREAD, &mut v) };
    check(r as isize).map(|_| v.max(0) as usize)
}

/// `SIOCOUTQNSD` (linux/sockios.h; the libc crate lacks it).
const SIOCOUTQNSD: libc::c_ulong = 0x894B;

/// The kernel's send queue of a TCP socket: bytes not yet acknowledged
/// (`SIOCOUTQ`), or if `unsent` not yet sent (`SIOCOUTQNSD`). 0 if the
/// socket cannot say (closed under us).
pub(crate) fn out_queue(fd: RawFd, unsent: bool) -> usize {
    let req = if unsent { SIOCOUTQNSD } else { libc::TIOCOUTQ };
    let mut v: libc::c_int = 0;
    // SAFETY: both requests write one int.
    let r = unsafe { libc::ioctl(fd, req, &mut v) };
    if r < 0 {
        0
    } else {
        v.max(0) as usize
    }
}

/// The urgent byte, peeked (left for the application if it is not ours).
/// `None` while it has not arrived.
pub(crate) fn peek_urgent(fd: RawFd) -> io::Result<Option<u8>> {
    let mut b = 0u8;
    // SAFETY: a one-byte buffer on the stack.
    let r = unsafe {
        libc::recv(
            fd,
            (&mut b as *mut u8).cast(),
            1,
            libc::MSG_OOB | libc::MSG_PEEK | libc::MSG_DONTWAIT,
        )
    };
    match check(r) {
        Ok(1) => Ok(Some(b)),
        Ok(_) => Ok(None),
        Err(e)
            if e.kind() == io::ErrorKind::WouldBlock || e.raw_os_error() == Some(libc::EINVAL) =>
        {
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

/// Consumes the urgent byte (so the socket stops reporting `POLLPRI`).
pub(crate) fn take_urgent(fd: RawFd) {
    let mut b = 0u8;
    // SAFETY: a one-byte buffer on the stack.
    unsafe {
        libc::recv(
            fd,
            (&mut b as *mut u8).cast(),
            1,
            libc::MSG_OOB | libc::MSG_DONTWAIT,
        )
    };
}

/// `recv` without blocking; `Ok(0)` is end of stream.
pub(crate) fn recv(fd: RawFd, buf: &mut [u8], peek: bool) -> io::Result<usize> {
    let flags = libc::MSG_DONTWAIT | if peek { libc::MSG_PEEK } else { 0 };
    loop {
        // SAFETY: `buf` is valid for writes of its length.
        let r = unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), flags) };
        match check(r) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            other => return other,
        }
    }
}

/// Waits until `fd` reports one of `events` (or an error/hang-up), or
/// until `deadline`. Returns the events seen (0 on timeout).
pub(crate) fn wait(fd: RawFd, events: i16, deadline: Option<Instant>) -> io::Result<i16> {
    let mut p = libc::pollfd {
        fd,
        events,
        revents: 0,
    };
    let ms = match deadline {
        None => -1,
        Some(d) => {
            let left = d.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(0);
            }
            left.as_millis().clamp(1, i32::MAX as u128) as i32
        }
    };
    // SAFETY: one pollfd on the stack.
    let r = unsafe { libc::poll(&mut p, 1, ms) };
    match check(r as isize) {
        Ok(0) => Ok(0),
        Ok(_) => Ok(p.revents),
        Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(0),
        Err(e) => Err(e),
    }
}
