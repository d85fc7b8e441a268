//! The interposed receiving and sending calls (`recv*`, `read*`, `send*`,
//! `write*`, `preadv2`/`pwritev2`; `sendfile` and `splice` are
//! `transfer.rs`'s): a managed descriptor's call goes to its socket
//! object, a candidate's send may adopt it first (its destination is
//! known), everything else to the real function.

#![allow(clippy::missing_safety_doc)]

use super::*;

// ---- receiving -------------------------------------------------------------

/// `UIO_MAXIOV` (linux/uio.h): the most buffers a vector call takes.
const UIO_MAXIOV: usize = 1024;

/// A `readv`/`writev` (and `preadv2`/`pwritev2`) count, as Linux checks
/// it before it reads the vector: `EINVAL` below 0 or above
/// [`UIO_MAXIOV`] (a negative count read as 0 buffers, and one past the
/// bound walked the caller's memory beyond the vector). A message's
/// longer vector is `EMSGSIZE` (`recvmsg`, `sendmsg` and each entry of
/// their `mmsg` forms).
fn vec_count(cnt: c_int) -> Result<usize, c_int> {
    usize::try_from(cnt)
        .ok()
        .filter(|&n| n <= UIO_MAXIOV)
        .ok_or(libc::EINVAL)
}

/// -1 with errno `e`.
fn fail(e: c_int) -> ssize_t {
    set_errno(e);
    -1
}

/// Receives into `iov` with the offload path; fills the name if asked.
unsafe fn recv_common(
    s: &Arc<dyn Socket>,
    iov: *mut iovec,
    iovcnt: usize,
    flags: c_int,
    addr: *mut sockaddr,
    alen: *mut socklen_t,
) -> ssize_t {
    let mut m = empty_msg();
    m.msg_iov = iov;
    m.msg_iovlen = iovcnt;
    if !addr.is_null() && !alen.is_null() {
        m.msg_name = addr.cast();
        // SAFETY: the caller's in/out length.
        m.msg_namelen = unsafe { *alen };
    }
    // SAFETY: `m` describes the caller's writable buffers.
    let r = enter(-1, || unsafe { s.recvmsg(&mut m, flags) });
    if r >= 0 && !addr.is_null() && !alen.is_null() {
        // SAFETY: as above.
        unsafe { *alen = m.msg_namelen };
    }
    r
}

/// A one-buffer receive (`recv`, `recvfrom`, `read` and their
/// `_FORTIFY_SOURCE` forms): the managed socket's, or `real`, the real
/// function with the caller's arguments.
unsafe fn recv_buf(
    fd: c_int,
    buf: *mut c_void,
    len: size_t,
    flags: c_int,
    addr: *mut sockaddr,
    alen: *mut socklen_t,
    real: impl FnOnce() -> ssize_t,
) -> ssize_t {
    dispatch!(fd, real(), move |s| {
        if addr.is_null() || alen.is_null() {
            // SAFETY: the caller's buffer.
            return enter(-1, || unsafe { s.recv_one(buf, len, flags) });
        }
        let mut v = one_iov(buf, len);
        // SAFETY: the caller's buffer and address.
        unsafe { recv_common(s, &mut v, 1, flags, addr, alen) }
    })
}

/// Interposed `recvfrom(2)`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C-unwind" fn recvfrom(
    fd: c_int,
    buf: *mut c_void,
    len: size_t,
    flags: c_int,
    addr: *mut sockaddr,
    alen: *mut socklen_t,
) -> ssize_t {
    cancellable(move || {
        // SAFETY: the caller's arguments, to its socket or the real function.
        unsafe {
            recv_buf(fd, buf, len, flags, addr, alen, move || {
                real::recvfrom(fd, buf, len, flags, addr, alen)
            })
        }
    })
}

/// Interposed `__recvfrom_chk` (the _FORTIFY_SOURCE form of recvfrom).
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C-unwind" fn __recvfrom_chk(
    fd: c_int,
    buf: *mut c_void,
    len: size_t,
    buflen: size_t,
    flags: c_int,
    addr: *mut sockaddr,
    alen: *mut socklen_t,
) -> ssize_t {
    cancellable(move || {
        // SAFETY: as in `recvfrom`.
        unsafe {
            recv_buf(fd, buf, len.min(buflen), flags, addr, alen, move || {
                real::__recvfrom_chk(fd, buf, len, buflen, flags, addr, alen)
            })
        }
    })
}

/// Interposed `recv(2)`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C-unwind" fn recv(
    fd: c_int,
    buf: *mut c_void,
    len: size_t,
    flags: c_int,
) -> ssize_t {
    cancellable(move || {
        let no = std::ptr::null_mut();
        // SAFETY: as in `recvfrom`.
        unsafe {
            recv_buf(fd, buf, len, flags, no, no.cast(), move || {
                real::recv(fd, buf, len, flags)
            })
        }
    })
}

/// Interposed `__recv_chk`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C-unwind" fn __recv_chk(
    fd: c_int,
    buf: *mut c_void,
    len: size_t,
    buflen: size_t,
    flags: c_int,
) -> ssize_t {
    cancellable(move || {
        let no = std::ptr::null_mut();
        // SAFETY: as in `recvfrom`.
        unsafe {
            recv_buf(fd, buf, len.min(buflen), flags, no, no.cast(), move || {
                real::__recv_chk(fd, buf, len, buflen, flags)
            })
        }
    })
}

/// Interposed `read(2)`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C-unwind" fn read(fd: c_int, buf: *mut c_void, len: size_t) -> ssize_t {
    cancellable(move || {
        let no = std::ptr::null_mut();
        // SAFETY: as in `recvfrom`.
        unsafe {
            recv_buf(fd, buf, len, 0, no, no.cast(), move || {
                real::read(fd, buf, len)
            })
        }
    })
}

/// Interposed `__read_chk`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C-unwind" fn __read_chk(
    fd: c_int,
    buf: *mut c_void,
    len: size_t,
    buflen: size_t,
) -> ssize_t {
    cancellable(move || {
        let no = std::ptr::null_mut();
        // SAFETY: as in `recvfrom`.
        unsafe {
            recv_buf(fd, buf, len.min(buflen), 0, no, no.cast(), move || {
                real::__read_chk(fd, buf, len, buflen)
            })
        }
    })
}

/// Interposed `readv(2)`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C-unwind" fn readv(fd: c_int, iov: *const iovec, cnt: c_int) -> ssize_t {
    cancellable(move || {
        dispatch!(
            fd,
            // SAFETY: forwarding the caller's arguments.
            unsafe { real::readv(fd, iov, cnt) },
            move |s| {
                if cnt == 1 && !iov.is_null() {
                    // One iovec (a busy-polling program's every spin):
                    // `read`'s call, no message header built and walked
                    // (`iovs`' small vector: ~85 instructions a call,
                    // callgrind; issue 12). The same receive: an empty
                    // buffer is no buffer either way.
                    // SAFETY: the caller's one iovec, readable.
                    let v = unsafe { *iov };
                    // SAFETY: its buffer, writable for its length.
                    return enter(-1, || unsafe { s.recv_one(v.iov_base, v.iov_len, 0) });
                }
                let n = match vec_count(cnt) {
                    Ok(n) => n,
                    Err(e) => return fail(e),
                };
                let no = std::ptr::null_mut();
                // SAFETY: the caller's iovecs.
                unsafe { recv_common(s, iov.cast_mut(), n, 0, no, no.cast()) }
            },
        )
    })
}

/// Interposed `recvmsg(2)`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C-unwind" fn recvmsg(fd: c_int, msg: *mut msghdr, flags: c_int) -> ssize_t {
    cancellable(move || {
        // SAFETY: forwarding the caller's arguments.
        let real = move || unsafe { real::recvmsg(fd, msg, flags) };
        dispatch!(fd, real(), move |s| {
            if msg.is_null() {
                return real();
            }
            // SAFETY: the caller's msghdr.
            let m = unsafe { &mut *msg };
            if m.msg_iovlen > UIO_MAXIOV {
                return fail(libc::EMSGSIZE);
            }
            // SAFETY: its buffers, writable (the caller's contract).
            enter(-1, || unsafe { s.recvmsg(m, flags) })
        })
    })
}

/// Interposed `recvmmsg(2)`: one recvmsg per entry; after the first, only
/// what is already there (the timeout argument is not used).
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C-unwind" fn recvmmsg(
    fd: c_int,
    msgs: *mut mmsghdr,
    n: c_uint,
    flags: c_int,
    timeout: *mut libc::timespec,
) -> c_int {
    cancellable_int(move || {
        let Some(s) = managed(fd) else {
            // SAFETY: forwarding the caller's arguments.
            return unsafe { real::recvmmsg(fd, msgs, n, flags, timeout) };
        };
        if msgs.is_null() {
            set_errno(libc::EFAULT);
            return -1;
        }
        let base = flags & !libc::MSG_WAITFORONE;
        let one = |m: &mut mmsghdr, got: u32| {
            // Like the kernel: without MSG_WAITFORONE a blocking call waits for
            // every entry; with it (or with a timeout, which this layer does not
            // apply per entry) only the first one waits.
            let f = if got > 0 && (flags & libc::MSG_WAITFORONE != 0 || !timeout.is_null()) {
                base | libc::MSG_DONTWAIT
            } else {
                base
            };
            if m.msg_hdr.msg_iovlen > UIO_MAXIOV {
                return fail(libc::EMSGSIZE);
            }
            // SAFETY: the caller's msghdr.
            enter(-1, || unsafe { s.recvmsg(&mut m.msg_hdr, f) })
        };
        // SAFETY: `msgs` holds `n` entries (caller's contract).
        unsafe { each_mmsg(msgs, n, one) }
    })
}

/// `recvmmsg`'s and `sendmmsg`'s loop: `one` for each of the `n` entries
/// at `msgs` in turn (with how many went before), its count stored in the
/// entry's `msg_len`, until one fails: the entries done, or -1 (`one`'s
/// errno) if the first failed, as the kernel's calls.
///
/// # Safety
/// `msgs` holds `n` entries.
unsafe fn each_mmsg(
    msgs: *mut mmsghdr,
    n: c_uint,
    mut one: impl FnMut(&mut mmsghdr, u32) -> ssize_t,
) -> c_int {
    let mut done = 0u32;
    while done < n {
        // SAFETY: `msgs` holds `n` entries (the caller's contract).
        let m = unsafe { &mut *msgs.add(done as usize) };
        let r = one(m, done);
        if r < 0 {
            if done == 0 {
                return -1;
            }
            break;
        }
        m.msg_len = r as c_uint;
        done += 1;
    }
    done as c_int
}

// ---- positioned vectors ----------------------------------------------------

/// The `RWF_*` flags Linux takes on a socket (linux/fs.h: `RWF_HIPRI`,
/// `RWF_DSYNC`, `RWF_SYNC`, `RWF_NOWAIT`, `RWF_APPEND`, `RWF_NOAPPEND`):
/// `RWF_NOWAIT` makes the call non-blocking, the others change nothing
/// there.
const RWF_ON_SOCKETS: c_int = 0x3f;
/// `RWF_NOWAIT`.
const RWF_NOWAIT: c_int = 0x8;

/// The socket flags of a `preadv2`/`pwritev2` of a managed socket at
/// `offset` with `flags` and `cnt` buffers, or its errno, as Linux
/// answers: a socket has no position but the current one (-1; `ESPIPE`
/// at any other, `EINVAL` below -1), a negative count is `EINVAL`, and a
/// flag Linux does not take there fails with `EOPNOTSUPP`.
fn positioned(offset: libc::off_t, flags: c_int, cnt: c_int) -> Result<c_int, c_int> {
    if offset < -1 || vec_count(cnt).is_err() {
        return Err(libc::EINVAL);
    }
    if offset != -1 {
        return Err(libc::ESPIPE);
    }
    if flags & !RWF_ON_SOCKETS != 0 {
        return Err(libc::EOPNOTSUPP);
    }
    Ok(if flags & RWF_NOWAIT != 0 {
        libc::MSG_DONTWAIT
    } else {
        0
    })
}

/// A `preadv2`/`pwritev2` (or its 64-bit name) of `fd`: `call` with the
/// socket flags ([`positioned`]) for a managed socket at the current
/// position (-1: the socket's `readv` or `writev`; the kernel's call made
/// it on the file the number names, a DDP socket's doorbell end), its
/// errno at any other; `real` for any other descriptor.
unsafe fn positioned_call(
    fd: c_int,
    offset: libc::off_t,
    flags: c_int,
    cnt: c_int,
    real: impl FnOnce() -> ssize_t,
    call: impl FnOnce(&Arc<dyn Socket>, c_int) -> ssize_t,
) -> ssize_t {
    cancellable(move || {
        dispatch!(fd, real(), move |s| match positioned(offset, flags, cnt) {
            Err(e) => {
                set_errno(e);
                -1
            }
            Ok(f) => call(s, f),
        })
    })
}

/// `preadv2`'s socket call: a receive into the caller's `cnt` iovecs.
unsafe fn preadv2_socket(
    iov: *const iovec,
    cnt: c_int,
) -> impl FnOnce(&Arc<dyn Socket>, c_int) -> ssize_t {
    move |s, f| {
        let no = std::ptr::null_mut();
        // SAFETY: the caller's iovecs (`preadv2`'s contract).
        unsafe { recv_common(s, iov.cast_mut(), cnt as usize, f, no, no.cast()) }
    }
}

/// `pwritev2`'s socket call: a send of the caller's `cnt` iovecs.
unsafe fn pwritev2_socket(
    iov: *const iovec,
    cnt: c_int,
) -> impl FnOnce(&Arc<dyn Socket>, c_int) -> ssize_t {
    move |s, f| {
        // SAFETY: the caller's iovecs (`pwritev2`'s contract).
        unsafe { send_common(s, iov, cnt as usize, f, std::ptr::null(), 0) }
    }
}

/// Interposed `preadv2(2)`: a managed socket's `readv` at the current position (`positioned_call`).
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C-unwind" fn preadv2(
    fd: c_int,
    iov: *const iovec,
    cnt: c_int,
    offset: libc::off_t,
    flags: c_int,
) -> ssize_t {
    // SAFETY: the caller's arguments, to its socket or the real function.
    unsafe {
        positioned_call(
            fd,
            offset,
            flags,
            cnt,
            move || real::preadv2(fd, iov, cnt, offset, flags),
            preadv2_socket(iov, cnt),
        )
    }
}

/// Interposed `preadv64v2` (`preadv2` with a 64-bit offset: the same on
/// 64-bit targets).
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C-unwind" fn preadv64v2(
    fd: c_int,
    iov: *const iovec,
    cnt: c_int,
    offset: libc::off_t,
    flags: c_int,
) -> ssize_t {
    // SAFETY: the caller's arguments, to its socket or the real function.
    unsafe {
        positioned_call(
            fd,
            offset,
            flags,
            cnt,
            move || real::preadv64v2(fd, iov, cnt, offset, flags),
            preadv2_socket(iov, cnt),
        )
    }
}

/// Interposed `pwritev2(2)`: a managed socket's `writev` at the current position (`positioned_call`).
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C-unwind" fn pwritev2(
    fd: c_int,
    iov: *const iovec,
    cnt: c_int,
    offset: libc::off_t,
    flags: c_int,
) -> ssize_t {
    // SAFETY: the caller's arguments, to its socket or the real function.
    unsafe {
        positioned_call(
            fd,
            offset,
            flags,
            cnt,
            move || real::pwritev2(fd, iov, cnt, offset, flags),
            pwritev2_socket(iov, cnt),
        )
    }
}

/// Interposed `pwritev64v2` (as `preadv64v2`).
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C-unwind" fn pwritev64v2(
    fd: c_int,
    iov: *const iovec,
    cnt: c_int,
    offset: libc::off_t,
    flags: c_int,
) -> ssize_t {
    // SAFETY: the caller's arguments, to its socket or the real function.
    unsafe {
        positioned_call(
            fd,
            offset,
            flags,
            cnt,
            move || real::pwritev64v2(fd, iov, cnt, offset, flags),
            pwritev2_socket(iov, cnt),
        )
    }
}

// ---- sending ---------------------------------------------------------------

unsafe fn send_common(
    s: &Arc<dyn Socket>,
    iov: *const iovec,
    iovcnt: usize,
    flags: c_int,
    addr: *const sockaddr,
    alen: socklen_t,
) -> ssize_t {
    let mut m = empty_msg();
    m.msg_iov = iov.cast_mut();
    m.msg_iovlen = iovcnt;
    m.msg_name = addr.cast_mut().cast();
    m.msg_namelen = if addr.is_null() { 0 } else { alen };
    // SAFETY: `m` describes the caller's readable buffers.
    enter(-1, || unsafe { s.sendmsg(&m, flags) })
}

/// Interposed `sendto(2)`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C-unwind" fn sendto(
    fd: c_int,
    buf: *const c_void,
    len: size_t,
    flags: c_int,
    addr: *const sockaddr,
    alen: socklen_t,
) -> ssize_t {
    cancellable(move || {
        let mark = fdtable::mark(fd);
        if mark == 0 {
            // SAFETY: forwarding the caller's arguments.
            return unsafe { real::sendto(fd, buf, len, flags, addr, alen) };
        }
        // SAFETY: the caller's address of `alen` bytes.
        match target(fd, mark, || unsafe { sys::addr_from_raw(addr, alen) }) {
            Some(s) => {
                let v = one_iov(buf.cast_mut(), len);
                // SAFETY: the caller's buffer and address.
                unsafe { send_common(&s, &v, 1, flags, addr, alen) }
            }
            // SAFETY: forwarding the caller's arguments.
            None => unsafe { real::sendto(fd, buf, len, flags, addr, alen) },
        }
    })
}

/// Interposed `send(2)`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C-unwind" fn send(
    fd: c_int,
    buf: *const c_void,
    len: size_t,
    flags: c_int,
) -> ssize_t {
    cancellable(move || {
        dispatch!(
            fd,
            // SAFETY: forwarding the caller's arguments.
            unsafe { real::send(fd, buf, len, flags) },
            // SAFETY: the caller's buffer.
            move |s| enter(-1, || unsafe { s.send_one(buf, len, flags) }),
        )
    })
}

/// Interposed `write(2)`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C-unwind" fn write(fd: c_int, buf: *const c_void, len: size_t) -> ssize_t {
    cancellable(move || {
        dispatch!(
            fd,
            // SAFETY: forwarding the caller's arguments.
            unsafe { real::write(fd, buf, len) },
            // SAFETY: the caller's buffer.
            move |s| enter(-1, || unsafe { s.send_one(buf, len, 0) }),
        )
    })
}

/// Interposed `writev(2)`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C-unwind" fn writev(fd: c_int, iov: *const iovec, cnt: c_int) -> ssize_t {
    cancellable(move || {
        dispatch!(
            fd,
            // SAFETY: forwarding the caller's arguments.
            unsafe { real::writev(fd, iov, cnt) },
            move |s| {
                if cnt == 1 && !iov.is_null() {
                    // One iovec: `write`'s call (as `readv`'s above).
                    // SAFETY: the caller's one iovec, readable.
                    let v = unsafe { *iov };
                    // SAFETY: its buffer, readable for its length.
                    return enter(-1, || unsafe { s.send_one(v.iov_base, v.iov_len, 0) });
                }
                let n = match vec_count(cnt) {
                    Ok(n) => n,
                    Err(e) => return fail(e),
                };
                // SAFETY: the caller's iovecs.
                unsafe { send_common(s, iov, n, 0, std::ptr::null(), 0) }
            },
        )
    })
}

/// Interposed `sendmsg(2)`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C-unwind" fn sendmsg(fd: c_int, msg: *const msghdr, flags: c_int) -> ssize_t {
    cancellable(move || {
        if msg.is_null() {
            // SAFETY: forwarding; the kernel reports EFAULT.
            return unsafe { real::sendmsg(fd, msg, flags) };
        }
        // SAFETY: the caller's msghdr.
        if unsafe { passes_managed(&*msg) } {
            set_errno(libc::EOPNOTSUPP);
            return -1;
        }
        let mark = fdtable::mark(fd);
        if mark == 0 {
            // SAFETY: forwarding the caller's arguments.
            return unsafe { real::sendmsg(fd, msg, flags) };
        }
        // SAFETY: the caller's msghdr and its name.
        let s = target(fd, mark, || unsafe {
            sys::addr_from_raw((*msg).msg_name.cast(), (*msg).msg_namelen)
        });
        match s {
            // SAFETY: the caller's msghdr.
            Some(_) if unsafe { (*msg).msg_iovlen } > UIO_MAXIOV => fail(libc::EMSGSIZE),
            // SAFETY: the caller's msghdr.
            Some(s) => enter(-1, || unsafe { s.sendmsg(&*msg, flags) }),
            // SAFETY: forwarding the caller's arguments.
            None => unsafe { real::sendmsg(fd, msg, flags) },
        }
    })
}

/// Interposed `sendmmsg(2)`: one sendmsg per entry.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C-unwind" fn sendmmsg(
    fd: c_int,
    msgs: *mut mmsghdr,
    n: c_uint,
    flags: c_int,
) -> c_int {
    cancellable_int(move || {
        if msgs.is_null() || n == 0 {
            // SAFETY: forwarding the caller's arguments.
            return unsafe { real::sendmmsg(fd, msgs, n, flags) };
        }
        // SAFETY: `msgs` holds `n` entries (caller's contract), of which
        // the kernel reads `UIO_MAXIOV` (1,024) at most.
        let entries = unsafe { std::slice::from_raw_parts(msgs, n.min(1024) as usize) };
        // The first entry that would pass a managed socket ends the call
        // where it stands, as the kernel's failed entry does: the entries
        // before it are sent (their count returned), or the error if it
        // is the first.
        let n = match entries.iter().position(|m| {
            // SAFETY: the caller's msghdr.
            unsafe { passes_managed(&m.msg_hdr) }
        }) {
            Some(0) => {
                set_errno(libc::EOPNOTSUPP);
                return -1;
            }
            Some(k) => k as c_uint,
            None => n,
        };
        let mark = fdtable::mark(fd);
        let s = (mark != 0)
            .then(|| {
                target(fd, mark, || {
                    // SAFETY: the first entry's name.
                    let h = unsafe { &(*msgs).msg_hdr };
                    // SAFETY: as above.
                    unsafe { sys::addr_from_raw(h.msg_name.cast(), h.msg_namelen) }
                })
            })
            .flatten();
        let Some(s) = s else {
            // SAFETY: forwarding the caller's arguments.
            return unsafe { real::sendmmsg(fd, msgs, n, flags) };
        };
        let one = |m: &mut mmsghdr, _| {
            if m.msg_hdr.msg_iovlen > UIO_MAXIOV {
                return fail(libc::EMSGSIZE);
            }
            // SAFETY: the caller's msghdr.
            enter(-1, || unsafe { s.sendmsg(&m.msg_hdr, flags) })
        };
        // SAFETY: `msgs` holds `n` entries (caller's contract).
        unsafe { each_mmsg(msgs, n, one) }
    })
}

/// Whether `m`'s control data passes a managed socket's descriptor to the
/// receiver (`SCM_RIGHTS`): refused with `EOPNOTSUPP`. Its number names a
/// file of the library's (a DDP socket's doorbell end, an offloaded UDP
/// socket's end, a switching connection's TCP socket) and its state is
/// this process's memory: the receiver would read wake-up bytes, or the
/// MPA stream, as data. Looked at only while the process manages a
/// socket and the message has control data; the walk stops at the first
/// header the kernel would refuse (`CMSG_OK`: shorter than a header, or
/// longer than what is left of the control data), whose `EINVAL` the
/// kernel then gives (libc's `CMSG_NXTHDR` does not bound a header's
/// length by the buffer: one claiming 1 MiB before an unmapped page faulted
/// here, review 55).
///
/// # Safety
/// `m`'s control data, if any, must be readable for `msg_controllen`
/// bytes (what the kernel reads).
unsafe fn passes_managed(m: &msghdr) -> bool {
    if fdtable::managed_below() <= 0
        || m.msg_control.is_null()
        || m.msg_controllen < size_of::<libc::cmsghdr>()
    {
        return false;
    }
    let end = m.msg_control as usize + m.msg_controllen;
    // SAFETY: walking the caller's control data within its length: each
    // header is read only when it lies wholly inside the buffer, and its
    // data only as far as its length, itself bounded by the buffer.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(m);
        while !c.is_null() {
            let at = c as usize;
            if at + size_of::<libc::cmsghdr>() > end {
                break;
            }
            let len = (*c).cmsg_len;
            if len < size_of::<libc::cmsghdr>() || len > end - at {
                break;
            }
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(c);
                let bytes = len.saturating_sub(data as usize - at);
                let fds = data.cast::<c_int>();
                for i in 0..bytes / size_of::<c_int>() {
                    if fdtable::get(fds.add(i).read_unaligned()).is_some() {
                        return true;
                    }
                }
            }
            c = libc::CMSG_NXTHDR(m, c);
        }
    }
    false
}
