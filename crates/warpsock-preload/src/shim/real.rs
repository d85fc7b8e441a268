//! The real libc entry points, resolved lazily with `dlsym(RTLD_NEXT, ...)`.
//!
//! Every function the library interposes is re-exported here under the same
//! name; the library itself only ever calls these, never the interposed
//! symbols, so its own system calls cannot recurse into the shim.
//!
//! Called as `extern "C-unwind"`: those that are cancellation points (a
//! plain socket's `read`, `poll`, ...) unwind when glibc acts on a
//! `pthread_cancel` in them, through the interposed entry point that
//! passed the call on (itself `extern "C-unwind"` where that can happen,
//! with nothing to drop; `warpsock_xsock::cancel`).

use std::sync::atomic::{AtomicUsize, Ordering};

use libc::{c_char, c_int, c_ulong, c_void, iovec, msghdr, size_t, sockaddr, socklen_t, ssize_t};

/// Looks `name` (NUL-terminated) up in the objects loaded after this one.
/// Aborts the process if libc does not define it: nothing sensible can be done
/// without the real function, and unwinding across C callers is not allowed.
fn resolve(name: &'static str) -> usize {
    // SAFETY: `name` is a NUL-terminated static string; dlsym has no other
    // preconditions.
    let p = unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr().cast::<c_char>()) };
    if p.is_null() {
        let msg = b"warpsock-preload: dlsym(RTLD_NEXT) failed for a libc symbol\n";
        // SAFETY: writing a static buffer to stderr, then aborting.
        unsafe {
            libc::syscall(libc::SYS_write, 2, msg.as_ptr(), msg.len());
            libc::abort();
        }
    }
    p as usize
}

macro_rules! real_fns {
    ($( $name:ident ( $($arg:ident : $ty:ty),* ) -> $ret:ty; )*) => {
        $(
            #[doc = concat!("The real `", stringify!($name), "` from the next object in the lookup order.")]
            ///
            /// # Safety
            /// Same contract as the libc function of that name.
            #[allow(clippy::missing_safety_doc)]
            pub(crate) unsafe fn $name($($arg: $ty),*) -> $ret {
                static PTR: AtomicUsize = AtomicUsize::new(0);
                /// The first call: resolves, then calls (out of line, so
                /// that every later call is a load and a jump, with no
                /// stack frame for the arguments kept across `dlsym`).
                #[cold]
                #[inline(never)]
                unsafe fn first($($arg: $ty),*) -> $ret {
                    let p = resolve(concat!(stringify!($name), "\0"));
                    PTR.store(p, Ordering::Relaxed);
                    // SAFETY: as below.
                    let f: unsafe extern "C-unwind" fn($($ty),*) -> $ret = unsafe { std::mem::transmute(p) };
                    // SAFETY: the caller upholds the libc contract of this function.
                    unsafe { f($($arg),*) }
                }
                let p = PTR.load(Ordering::Relaxed);
                if p == 0 {
                    // SAFETY: the caller's contract.
                    return unsafe { first($($arg),*) };
                }
                // SAFETY: `p` is the address dlsym returned for this libc symbol,
                // whose C prototype is the one spelled out here.
                let f: unsafe extern "C-unwind" fn($($ty),*) -> $ret = unsafe { std::mem::transmute(p) };
                // SAFETY: the caller upholds the libc contract of this function.
                unsafe { f($($arg),*) }
            }
        )*
    };
}

real_fns! {
    socket(domain: c_int, ty: c_int, protocol: c_int) -> c_int;
    bind(fd: c_int, addr: *const sockaddr, len: socklen_t) -> c_int;
    connect(fd: c_int, addr: *const sockaddr, len: socklen_t) -> c_int;
    accept4(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t, flags: c_int) -> c_int;
    close(fd: c_int) -> c_int;
    dup(fd: c_int) -> c_int;
    dup2(old: c_int, new: c_int) -> c_int;
    dup3(old: c_int, new: c_int, flags: c_int) -> c_int;
    fcntl(fd: c_int, cmd: c_int, arg: usize) -> c_int;
    ioctl(fd: c_int, req: c_ulong, arg: usize) -> c_int;
    read(fd: c_int, buf: *mut c_void, len: size_t) -> ssize_t;
    write(fd: c_int, buf: *const c_void, len: size_t) -> ssize_t;
    readv(fd: c_int, iov: *const iovec, cnt: c_int) -> ssize_t;
    writev(fd: c_int, iov: *const iovec, cnt: c_int) -> ssize_t;
    preadv2(fd: c_int, iov: *const iovec, cnt: c_int, offset: libc::off_t, flags: c_int) -> ssize_t;
    preadv64v2(fd: c_int, iov: *const iovec, cnt: c_int, offset: libc::off_t, flags: c_int) -> ssize_t;
    pwritev2(fd: c_int, iov: *const iovec, cnt: c_int, offset: libc::off_t, flags: c_int) -> ssize_t;
    pwritev64v2(fd: c_int, iov: *const iovec, cnt: c_int, offset: libc::off_t, flags: c_int) -> ssize_t;
    recv(fd: c_int, buf: *mut c_void, len: size_t, flags: c_int) -> ssize_t;
    recvfrom(fd: c_int, buf: *mut c_void, len: size_t, flags: c_int, addr: *mut sockaddr, alen: *mut socklen_t) -> ssize_t;
    recvmsg(fd: c_int, msg: *mut msghdr, flags: c_int) -> ssize_t;
    recvmmsg(fd: c_int, msgs: *mut libc::mmsghdr, n: libc::c_uint, flags: c_int, timeout: *mut libc::timespec) -> c_int;
    send(fd: c_int, buf: *const c_void, len: size_t, flags: c_int) -> ssize_t;
    sendto(fd: c_int, buf: *const c_void, len: size_t, flags: c_int, addr: *const sockaddr, alen: socklen_t) -> ssize_t;
    sendmsg(fd: c_int, msg: *const msghdr, flags: c_int) -> ssize_t;
    sendmmsg(fd: c_int, msgs: *mut libc::mmsghdr, n: libc::c_uint, flags: c_int) -> c_int;
    getsockname(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int;
    getpeername(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int;
    getsockopt(fd: c_int, level: c_int, name: c_int, val: *mut c_void, len: *mut socklen_t) -> c_int;
    setsockopt(fd: c_int, level: c_int, name: c_int, val: *const c_void, len: socklen_t) -> c_int;
    epoll_create(size: c_int) -> c_int;
    epoll_create1(flags: c_int) -> c_int;
    epoll_ctl(epfd: c_int, op: c_int, fd: c_int, ev: *mut libc::epoll_event) -> c_int;
    shutdown(fd: c_int, how: c_int) -> c_int;
    sendfile(out_fd: c_int, in_fd: c_int, offset: *mut libc::off_t, count: size_t) -> ssize_t;
    splice(fd_in: c_int, off_in: *mut libc::loff_t, fd_out: c_int, off_out: *mut libc::loff_t, len: size_t, flags: libc::c_uint) -> ssize_t;
    poll(fds: *mut libc::pollfd, n: libc::nfds_t, timeout: c_int) -> c_int;
    ppoll(fds: *mut libc::pollfd, n: libc::nfds_t, timeout: *const libc::timespec, mask: *const libc::sigset_t) -> c_int;
    select(n: c_int, r: *mut libc::fd_set, w: *mut libc::fd_set, e: *mut libc::fd_set, timeout: *mut libc::timeval) -> c_int;
    pselect(n: c_int, r: *mut libc::fd_set, w: *mut libc::fd_set, e: *mut libc::fd_set, timeout: *const libc::timespec, mask: *const libc::sigset_t) -> c_int;
    epoll_wait(epfd: c_int, events: *mut libc::epoll_event, max: c_int, timeout: c_int) -> c_int;
    epoll_pwait(epfd: c_int, events: *mut libc::epoll_event, max: c_int, timeout: c_int, mask: *const libc::sigset_t) -> c_int;
    epoll_pwait2(epfd: c_int, events: *mut libc::epoll_event, max: c_int, timeout: *const c_void, mask: *const libc::sigset_t) -> c_int;
    __read_chk(fd: c_int, buf: *mut c_void, len: size_t, buflen: size_t) -> ssize_t;
    __poll_chk(fds: *mut libc::pollfd, n: libc::nfds_t, timeout: c_int, fdslen: size_t) -> c_int;
    __ppoll_chk(fds: *mut libc::pollfd, n: libc::nfds_t, timeout: *const libc::timespec, mask: *const libc::sigset_t, fdslen: size_t) -> c_int;
    __recv_chk(fd: c_int, buf: *mut c_void, len: size_t, buflen: size_t, flags: c_int) -> ssize_t;
    __recvfrom_chk(fd: c_int, buf: *mut c_void, len: size_t, buflen: size_t, flags: c_int, addr: *mut sockaddr, alen: *mut socklen_t) -> ssize_t;
    execve(path: *const c_char, argv: *const *const c_char, envp: *const *const c_char) -> c_int;
    execv(path: *const c_char, argv: *const *const c_char) -> c_int;
    execvp(file: *const c_char, argv: *const *const c_char) -> c_int;
    execvpe(file: *const c_char, argv: *const *const c_char, envp: *const *const c_char) -> c_int;
    execveat(dirfd: c_int, path: *const c_char, argv: *const *const c_char, envp: *const *const c_char, flags: c_int) -> c_int;
    fexecve(fd: c_int, argv: *const *const c_char, envp: *const *const c_char) -> c_int;
    pthread_cancel(th: libc::pthread_t) -> c_int;
    fdopen(fd: c_int, mode: *const c_char) -> *mut libc::FILE;
    freopen(path: *const c_char, mode: *const c_char, f: *mut libc::FILE) -> *mut libc::FILE;
    freopen64(path: *const c_char, mode: *const c_char, f: *mut libc::FILE) -> *mut libc::FILE;
    vdprintf(fd: c_int, fmt: *const c_char, ap: *mut c_void) -> c_int;
    __vdprintf_chk(fd: c_int, flag: c_int, fmt: *const c_char, ap: *mut c_void) -> c_int;
    aio_read(cb: *mut c_void) -> c_int;
    aio_read64(cb: *mut c_void) -> c_int;
    aio_write(cb: *mut c_void) -> c_int;
    aio_write64(cb: *mut c_void) -> c_int;
    aio_suspend(list: *const *const c_void, n: c_int, timeout: *const libc::timespec) -> c_int;
    aio_cancel(fd: c_int, cb: *mut c_void) -> c_int;
    lio_listio(mode: c_int, list: *const *mut c_void, n: c_int, sig: *mut libc::sigevent) -> c_int;
}

/// The real `_exit` and `_Exit`, resolved by [`prepare_exit`] at load time.
static EXIT_PTRS: [AtomicUsize; 2] = [AtomicUsize::new(0), AtomicUsize::new(0)];

/// Resolves the real `_exit` and `_Exit` while it is safe to call dlsym.
pub(crate) fn prepare_exit() {
    for (i, name) in ["_exit\0", "_Exit\0"].into_iter().enumerate() {
        // SAFETY: `name` is a NUL-terminated static string.
        let p = unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr().cast::<c_char>()) };
        EXIT_PTRS[i].store(p as usize, Ordering::Relaxed);
    }
}

/// Ends the process through the real `_exit` (`capital`: `_Exit`), or the
/// exit_group system call if it was not resolved.
pub(crate) fn exit_now(capital: bool, status: c_int) -> ! {
    let p = EXIT_PTRS[usize::from(capital)].load(Ordering::Relaxed);
    if p != 0 {
        // SAFETY: dlsym returned this address for `_exit`/`_Exit`, whose C
        // prototype is `void (int)` and which never return.
        let f: unsafe extern "C" fn(c_int) -> ! = unsafe { std::mem::transmute(p) };
        // SAFETY: no preconditions.
        unsafe { f(status) }
    }
    loop {
        // SAFETY: exit_group ends the process; it has no preconditions.
        unsafe { libc::syscall(libc::SYS_exit_group, status) };
    }
}
