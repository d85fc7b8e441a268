//! glibc's exported second names of the interposed calls: `__poll`,
//! `__select`, `__read`, `__write`, `__send`, `__connect`, `__close`,
//! `__fcntl` and `__dup2` are the same functions as `poll`, `select`, …
//! (`nm -D libc.so.6`: `T` or `W` symbols of `GLIBC_2.2.5` at the same
//! addresses, not private), and a program or a library that calls one by
//! that name (`libnsl`'s `__poll`) reached glibc past the interposer. Over
//! a DDP socket that went wrong silently: `__poll` and `__select` waited
//! on a doorbell nobody rang (the call's own sockets' input is taken up
//! only by the interposed wait), `__read` read the carrier's FPDUs,
//! `__write` and `__send` wrote raw bytes into its stream, `__close`
//! closed a number whose socket the library still held open, `__fcntl`'s
//! `O_NONBLOCK` never reached the socket, `__dup2`'s copy named the
//! carrier. Each forwards to the interposed call, whose pass-through is
//! the real one (the same function in glibc: `real::` looks the first
//! names up). glibc's private `__recv` (`GLIBC_PRIVATE`) is not for
//! programs and is left alone.

use libc::{c_int, c_void, size_t, sockaddr, socklen_t, ssize_t};

/// `__poll`: [`super::wait::poll`].
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C-unwind" fn __poll(
    fds: *mut libc::pollfd,
    n: libc::nfds_t,
    timeout: c_int,
) -> c_int {
    // SAFETY: the caller's arguments, as `poll` takes them.
    unsafe { super::wait::poll(fds, n, timeout) }
}

/// `__select`: [`super::wait::select::select`].
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C-unwind" fn __select(
    n: c_int,
    r: *mut libc::fd_set,
    w: *mut libc::fd_set,
    e: *mut libc::fd_set,
    timeout: *mut libc::timeval,
) -> c_int {
    // SAFETY: the caller's arguments, as `select` takes them.
    unsafe { super::wait::select::select(n, r, w, e, timeout) }
}

/// `__read`: [`super::io::read`].
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C-unwind" fn __read(fd: c_int, buf: *mut c_void, len: size_t) -> ssize_t {
    // SAFETY: the caller's arguments, as `read` takes them.
    unsafe { super::io::read(fd, buf, len) }
}

/// `__write`: [`super::io::write`].
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C-unwind" fn __write(fd: c_int, buf: *const c_void, len: size_t) -> ssize_t {
    // SAFETY: the caller's arguments, as `write` takes them.
    unsafe { super::io::write(fd, buf, len) }
}

/// `__send`: [`super::io::send`].
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C-unwind" fn __send(
    fd: c_int,
    buf: *const c_void,
    len: size_t,
    flags: c_int,
) -> ssize_t {
    // SAFETY: the caller's arguments, as `send` takes them.
    unsafe { super::io::send(fd, buf, len, flags) }
}

/// `__connect`: [`super::connect`].
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C-unwind" fn __connect(
    fd: c_int,
    addr: *const sockaddr,
    len: socklen_t,
) -> c_int {
    // SAFETY: the caller's arguments, as `connect` takes them.
    unsafe { super::connect(fd, addr, len) }
}

/// `__close`: [`super::close`].
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C-unwind" fn __close(fd: c_int) -> c_int {
    // SAFETY: as `close`.
    unsafe { super::close(fd) }
}

/// `__fcntl`: [`super::fcntl`] (one integer argument, as it is declared).
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C-unwind" fn __fcntl(fd: c_int, cmd: c_int, arg: usize) -> c_int {
    // SAFETY: the caller's arguments, as `fcntl` takes them.
    unsafe { super::fcntl(fd, cmd, arg) }
}

/// `__dup2`: [`super::dups::dup2`].
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C-unwind" fn __dup2(old: c_int, new: c_int) -> c_int {
    // SAFETY: as `dup2`.
    unsafe { super::dups::dup2(old, new) }
}
