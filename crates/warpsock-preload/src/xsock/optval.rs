//! Socket option values as `setsockopt`/`getsockopt` pass them: an int
//! read from the caller's bytes, and answers written back as Linux's
//! `sk_getsockopt` copies them (lengths, truncation, errnos).

use libc::{c_int, c_void, socklen_t};

use crate::shim::sys::set_errno;

/// `setsockopt`'s int argument, if at least an int's worth of bytes.
pub(crate) fn int_arg(val: *const c_void, len: socklen_t) -> Option<c_int> {
    if val.is_null() || (len as usize) < size_of::<c_int>() {
        return None;
    }
    // SAFETY: at least an int's worth of bytes at `val`.
    Some(unsafe { val.cast::<c_int>().read_unaligned() })
}

/// `getsockopt`'s answer `v`, an int option's: see [`put_int_as`].
pub(crate) fn put_int(val: *mut c_void, len: *mut socklen_t, v: c_int) -> c_int {
    put_int_as(val, len, v, false)
}

/// `getsockopt`'s answer `v` as Linux's `sk_getsockopt` gives an int
/// ([`put_bytes`]); `byte`: `IP_RECVERR`'s form (`do_ip_getsockopt`): a
/// length of 1 to 3 gets the value as one byte.
pub(crate) fn put_int_as(val: *mut c_void, len: *mut socklen_t, v: c_int, byte: bool) -> c_int {
    // SAFETY: read only if non-null (`put_bytes` answers a null one).
    let want = (!len.is_null()).then(|| unsafe { len.read_unaligned() } as c_int);
    match u8::try_from(v) {
        Ok(b) if byte && want.is_some_and(|w| (1..4).contains(&w)) => put_bytes(val, len, &[b]),
        _ => put_bytes(val, len, &v.to_ne_bytes()),
    }
}

/// `getsockopt`'s answer `v` as Linux's `sk_getsockopt` copies it: the
/// first `min(*len, v.len())` bytes, `*len` set to that — a shorter length
/// truncates, 0 too (review r23-a item 7: it was `EINVAL`); a negative one
/// (as the kernel reads it) is `EINVAL`, a null pointer to write through
/// `EFAULT`.
pub(crate) fn put_bytes(val: *mut c_void, len: *mut socklen_t, v: &[u8]) -> c_int {
    if len.is_null() {
        set_errno(libc::EFAULT);
        return -1;
    }
    // SAFETY: the caller's in/out length, checked non-null.
    let want = unsafe { len.read_unaligned() } as c_int;
    if want < 0 {
        set_errno(libc::EINVAL);
        return -1;
    }
    let n = v.len().min(want as usize);
    if n > 0 && val.is_null() {
        set_errno(libc::EFAULT);
        return -1;
    }
    // SAFETY: `n` writable bytes at `val` (at most the caller's length);
    // the length is the caller's, checked non-null.
    unsafe {
        std::ptr::copy_nonoverlapping(v.as_ptr(), val.cast::<u8>(), n);
        len.write_unaligned(n as socklen_t);
    }
    0
}
