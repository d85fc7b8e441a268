//! Forwarding to the real rdma-core for objects that are not ours (a real
//! RDMA device next to `warpsock0`): the next definition of a symbol after
//! this library (`dlsym(RTLD_NEXT)`), resolved once and cached.

use std::ffi::c_void;
use std::sync::atomic::{AtomicPtr, Ordering};

/// Sentinel for "looked up, not found".
const MISSING: *mut c_void = std::ptr::dangling_mut::<c_void>();

/// The next definition of `name` (NUL-terminated) after this library, or
/// NULL when no other library defines it (rdma-core not loaded).
pub(crate) fn resolve(cache: &AtomicPtr<c_void>, name: &'static str) -> *mut c_void {
    let p = cache.load(Ordering::Acquire);
    if p == MISSING {
        return std::ptr::null_mut();
    }
    if !p.is_null() {
        return p;
    }
    debug_assert!(name.ends_with('\0'));
    // SAFETY: `name` is NUL-terminated; RTLD_NEXT lookups have no other
    // requirement.
    let f = unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr().cast()) };
    cache.store(if f.is_null() { MISSING } else { f }, Ordering::Release);
    f
}

/// Calls the real rdma-core's `$name` with `$args` (types `$t`, result
/// `$r`), or evaluates `$missing` when no real library defines it.
macro_rules! forward {
    ($name:ident ($($arg:expr),* $(,)?) : fn($($t:ty),*) -> $r:ty, $missing:expr) => {{
        static P: std::sync::atomic::AtomicPtr<std::ffi::c_void> =
            std::sync::atomic::AtomicPtr::new(std::ptr::null_mut());
        let f = $crate::real::resolve(&P, concat!(stringify!($name), "\0"));
        if f.is_null() {
            $missing
        } else {
            #[allow(unused_unsafe)]
            // SAFETY: the real rdma-core defines `$name` with this C
            // signature (libibverbs/librdmacm headers).
            let f: unsafe extern "C" fn($($t),*) -> $r = unsafe { std::mem::transmute(f) };
            // SAFETY: forwarded arguments, as the program passed them.
            #[allow(unused_unsafe)]
            let r = unsafe { f($($arg),*) };
            r
        }
    }};
}
pub(crate) use forward;
