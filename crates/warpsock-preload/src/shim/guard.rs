//! The per-thread re-entrancy guard and the panic boundary.
//!
//! Library code runs under [`enter`]: while it does, the calling thread's
//! guard is set, and the interposed entry points pass every call straight
//! to the real function (calls the library makes itself, such as `malloc`
//! calling `write` or a kind's own `socket()`, never re-enter a managed
//! path). A panic inside becomes `EIO` and the error value, never an unwind
//! into C.

use std::cell::Cell;
use std::panic::{catch_unwind, AssertUnwindSafe};

use super::sys::set_errno;

thread_local! {
    static BUSY: Cell<bool> = const { Cell::new(false) };
}

/// Whether the calling thread is inside library code.
#[inline]
pub(crate) fn busy() -> bool {
    BUSY.with(Cell::get)
}

/// Runs library code under the guard and the panic boundary: returns `f`'s
/// value, or `err` with errno `EIO` if it panicked.
pub(crate) fn enter<T>(err: T, f: impl FnOnce() -> T) -> T {
    let prev = BUSY.with(|b| b.replace(true));
    #[cfg(feature = "test-hooks")]
    if prev {
        super::hooks::audit::nested();
    }
    let r = catch_unwind(AssertUnwindSafe(f));
    BUSY.with(|b| b.set(prev));
    r.unwrap_or_else(|_| {
        set_errno(libc::EIO);
        err
    })
}
