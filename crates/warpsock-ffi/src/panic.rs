//! The panic boundary: no Rust panic unwinds into C.
//!
//! Every `extern "C"` body runs inside [`ffi_panic_boundary!`], which
//! catches a panic and returns [`PanicOrDefault::value`] instead: the
//! [`warpsock_result::Panic`](crate::error::warpsock_result::Panic) code for
//! functions that return a result, a neutral value (0, `false`, NULL, an
//! empty struct) for the rest. Modelled on rustls-ffi `panic.rs`.

use crate::error::warpsock_result;

/// What a function returns when its body panicked.
pub(crate) trait PanicOrDefault {
    /// The value handed to C instead of unwinding.
    fn value() -> Self;
}

impl PanicOrDefault for warpsock_result {
    fn value() -> Self {
        Self::Panic
    }
}

macro_rules! panic_default {
    ($($t:ty => $v:expr),* $(,)?) => {
        $(impl PanicOrDefault for $t {
            fn value() -> Self {
                $v
            }
        })*
    };
}

panic_default! {
    () => (),
    bool => false,
    u16 => 0,
    u32 => 0,
    u64 => 0,
    usize => 0,
    i32 => -1,
    *const std::ffi::c_char => std::ptr::null(),
}

/// Runs the body, turning a panic into [`PanicOrDefault::value`].
///
/// The body may `return` early (it runs in a closure), so the NULL-check
/// macros of [`crate::ffi`] work inside it.
macro_rules! ffi_panic_boundary {
    ($($body:tt)*) => {
        match ::std::panic::catch_unwind(::std::panic::AssertUnwindSafe(|| { $($body)* })) {
            Ok(v) => v,
            Err(_) => $crate::panic::PanicOrDefault::value(),
        }
    };
}

pub(crate) use ffi_panic_boundary;
