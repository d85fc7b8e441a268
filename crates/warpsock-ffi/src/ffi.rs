//! Turning C pointers into Rust values and back: the only place that
//! dereferences what C hands us. Modelled on rustls-ffi `ffi.rs`.
//!
//! * Every opaque handle type (`warpsock_context`, ...) is [`Castable`]:
//!   C holds a `*mut warpsock_x` that is really a `Box<RustType>`, made by
//!   [`to_boxed_mut_ptr`] in the `_new`-style function and given back to
//!   [`take_box`] by the matching `_free` (or consuming) function.
//! * The `try_*!` macros check for NULL and return early from the extern
//!   function with [`NullParameterOrDefault::value`]: the
//!   `WARPSOCK_RESULT_NULL_PARAMETER` code, or a neutral value for
//!   functions that return no result code.
//! * Out-parameters are [`Out`] (one value) and [`OutBuf`] (a caller
//!   array); they are written only when the function succeeds, never read.

use std::ffi::{c_char, CStr};
use std::marker::PhantomData;
use std::ptr::NonNull;

use crate::error::warpsock_result;

/// An opaque C handle type standing for a boxed Rust value.
pub(crate) trait Castable {
    /// The Rust value behind the handle.
    type RustType;
}

/// Boxes `value` and hands it to C as an opaque handle.
pub(crate) fn to_boxed_mut_ptr<C: Castable>(value: C::RustType) -> *mut C {
    Box::into_raw(Box::new(value)).cast()
}

/// Borrows the value behind a handle, or `None` for NULL.
///
/// # Safety
/// `ptr` is NULL or came from [`to_boxed_mut_ptr`] for the same `C` and has
/// not been freed; the borrow does not outlive the handle.
pub(crate) unsafe fn try_from<'a, C: Castable>(ptr: *const C) -> Option<&'a C::RustType> {
    // SAFETY: per this function's contract the pointer is NULL or points to
    // a live `C::RustType` in a Box, which `as_ref` turns into a borrow.
    unsafe { ptr.cast::<C::RustType>().as_ref() }
}

/// Mutably borrows the value behind a handle, or `None` for NULL.
///
/// # Safety
/// As for [`try_from`], and no other borrow of the value is live.
pub(crate) unsafe fn try_from_mut<'a, C: Castable>(ptr: *mut C) -> Option<&'a mut C::RustType> {
    // SAFETY: per this function's contract the pointer is NULL or points to
    // a live, unaliased `C::RustType` in a Box.
    unsafe { ptr.cast::<C::RustType>().as_mut() }
}

/// Takes back ownership of the value behind a handle, or `None` for NULL.
///
/// # Safety
/// `ptr` is NULL or came from [`to_boxed_mut_ptr`] for the same `C`, has
/// not been freed, and is not used again.
pub(crate) unsafe fn take_box<C: Castable>(ptr: *mut C) -> Option<C::RustType> {
    if ptr.is_null() {
        return None;
    }
    // SAFETY: non-NULL, made by `Box::into_raw` in `to_boxed_mut_ptr` for
    // this type, and (per the contract) not freed or used again.
    Some(*unsafe { Box::from_raw(ptr.cast::<C::RustType>()) })
}

/// Borrows `len` elements at `ptr` (NULL is allowed when `len` is 0).
///
/// # Safety
/// Unless `len` is 0, `ptr` is NULL or valid for reads of `len`
/// initialized `T` that nobody writes during the borrow.
pub(crate) unsafe fn slice_from<'a, T>(ptr: *const T, len: usize) -> Option<&'a [T]> {
    if len == 0 {
        return Some(&[]);
    }
    if ptr.is_null() {
        return None;
    }
    // SAFETY: non-NULL and, per the contract, valid for `len` reads.
    Some(unsafe { std::slice::from_raw_parts(ptr, len) })
}

/// Borrows a NUL-terminated C string.
///
/// # Safety
/// `ptr` is NULL or points to a NUL-terminated string that stays unchanged
/// during the borrow.
pub(crate) unsafe fn cstr_from<'a>(ptr: *const c_char) -> Option<&'a CStr> {
    if ptr.is_null() {
        return None;
    }
    // SAFETY: non-NULL and, per the contract, NUL-terminated.
    Some(unsafe { CStr::from_ptr(ptr) })
}

/// A checked, non-NULL out-parameter for one value: write it with
/// [`Out::write`] once the function has succeeded.
#[derive(Debug)]
pub(crate) struct Out<T>(NonNull<T>);

impl<T> Out<T> {
    /// `None` for NULL.
    pub(crate) fn new(ptr: *mut T) -> Option<Self> {
        NonNull::new(ptr).map(Self)
    }

    /// Stores `value` (without reading or dropping the old contents).
    pub(crate) fn write(self, value: T) {
        // SAFETY: the extern function's contract makes a non-NULL out
        // pointer valid for one aligned write of `T`; `write` does not read
        // the (possibly uninitialized) old value.
        unsafe { self.0.as_ptr().write(value) }
    }
}

/// A caller array of `len` elements to fill (possibly uninitialized: it is
/// only ever written, element by element).
#[derive(Debug)]
pub(crate) struct OutBuf<'a, T> {
    ptr: *mut T,
    len: usize,
    _life: PhantomData<&'a mut [T]>,
}

impl<T> OutBuf<'_, T> {
    /// `None` for a NULL `ptr` with a non-zero `len`.
    pub(crate) fn new(ptr: *mut T, len: usize) -> Option<Self> {
        (len == 0 || !ptr.is_null()).then_some(Self {
            ptr,
            len,
            _life: PhantomData,
        })
    }

    /// Capacity in elements.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Stores `value` at index `i`.
    ///
    /// # Panics
    /// If `i` is out of bounds.
    pub(crate) fn write(&mut self, i: usize, value: T) {
        assert!(i < self.len, "OutBuf index {i} out of bounds {}", self.len);
        // SAFETY: `i < len`, and the extern function's contract makes the
        // array valid for `len` aligned writes of `T`.
        unsafe { self.ptr.add(i).write(value) }
    }
}

impl OutBuf<'_, u8> {
    /// Copies `src` to the start of the buffer.
    ///
    /// # Panics
    /// If `src` is longer than the buffer.
    pub(crate) fn copy_from(&mut self, src: &[u8]) {
        assert!(src.len() <= self.len, "OutBuf copy past the end");
        // SAFETY: `src.len() <= len` bytes fit in the caller's array (valid
        // for `len` writes per the contract); a Rust slice cannot overlap
        // memory the caller gave us as writable output.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), self.ptr, src.len()) }
    }
}

/// What a function returns when a required pointer is NULL.
pub(crate) trait NullParameterOrDefault {
    /// The value handed to C.
    fn value() -> Self;
}

impl NullParameterOrDefault for warpsock_result {
    fn value() -> Self {
        Self::NullParameter
    }
}

macro_rules! null_default {
    ($($t:ty => $v:expr),* $(,)?) => {
        $(impl NullParameterOrDefault for $t {
            fn value() -> Self {
                $v
            }
        })*
    };
}

null_default! {
    () => (),
    bool => false,
    u16 => 0,
    u32 => 0,
    u64 => 0,
    usize => 0,
    i32 => -1,
}

/// Borrows the Rust value behind a handle; returns early on NULL.
macro_rules! try_ref_from_ptr {
    ($ptr:expr) => {
        // SAFETY: every extern function documents that its handle arguments
        // are NULL or live handles from the matching constructor.
        match unsafe { $crate::ffi::try_from($ptr) } {
            Some(r) => r,
            None => return $crate::ffi::NullParameterOrDefault::value(),
        }
    };
}

/// Mutably borrows the Rust value behind a handle; returns early on NULL.
macro_rules! try_mut_from_ptr {
    ($ptr:expr) => {
        // SAFETY: every extern function that takes a `*mut` handle documents
        // that it is NULL or a live handle not used concurrently.
        match unsafe { $crate::ffi::try_from_mut($ptr) } {
            Some(r) => r,
            None => return $crate::ffi::NullParameterOrDefault::value(),
        }
    };
}

/// Takes ownership of the value behind a handle (consuming functions);
/// returns early on NULL.
macro_rules! try_take {
    ($ptr:expr) => {
        // SAFETY: consuming functions document that the handle is NULL or
        // live, and is not used again after the call.
        match unsafe { $crate::ffi::take_box($ptr) } {
            Some(r) => r,
            None => return $crate::ffi::NullParameterOrDefault::value(),
        }
    };
}

/// Borrows a caller array (`ptr`, `len`); returns early if `ptr` is NULL
/// and `len` is not 0.
macro_rules! try_slice {
    ($ptr:expr, $len:expr) => {
        // SAFETY: every extern function documents that an input array is
        // valid for `len` reads (or NULL with `len` 0).
        match unsafe { $crate::ffi::slice_from($ptr, $len) } {
            Some(r) => r,
            None => return $crate::ffi::NullParameterOrDefault::value(),
        }
    };
}

/// Borrows a NUL-terminated C string; returns early on NULL.
macro_rules! try_cstr {
    ($ptr:expr) => {
        // SAFETY: every extern function documents that a string argument is
        // NULL or NUL-terminated.
        match unsafe { $crate::ffi::cstr_from($ptr) } {
            Some(r) => r,
            None => return $crate::ffi::NullParameterOrDefault::value(),
        }
    };
}

/// Checks a single out-parameter; returns early on NULL.
macro_rules! try_out {
    ($ptr:expr) => {
        match $crate::ffi::Out::new($ptr) {
            Some(o) => o,
            None => return $crate::ffi::NullParameterOrDefault::value(),
        }
    };
}

/// Checks an output array; returns early if `ptr` is NULL and `len` is
/// not 0.
macro_rules! try_out_buf {
    ($ptr:expr, $len:expr) => {
        match $crate::ffi::OutBuf::new($ptr, $len) {
            Some(o) => o,
            None => return $crate::ffi::NullParameterOrDefault::value(),
        }
    };
}

pub(crate) use {
    try_cstr, try_mut_from_ptr, try_out, try_out_buf, try_ref_from_ptr, try_slice, try_take,
};
