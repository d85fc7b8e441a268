//! The C functions that give a result code's message and the calling
//! thread's last failure detail (the codes and the detail themselves are
//! in `error`).

use std::ffi::c_char;

use crate::error::{warpsock_result, DETAIL, UNKNOWN};
use crate::ffi::{try_out, try_out_buf, OutBuf};
use crate::panic::ffi_panic_boundary;

/// Copies `text` into a `char` buffer of `len` bytes, cut to fit, always
/// NUL-terminated (if `len > 0`); returns the bytes copied without the NUL.
fn copy_text(text: &str, buf: &mut OutBuf<'_, u8>) -> usize {
    let Some(room) = buf.len().checked_sub(1) else {
        return 0;
    };
    let mut n = text.len().min(room);
    while !text.is_char_boundary(n) {
        n -= 1;
    }
    buf.copy_from(&text.as_bytes()[..n]);
    buf.write(n, 0);
    n
}

/// The message for `result` as a static NUL-terminated string (never
/// NULL; an unknown number gives "unknown warpsock result code"). The
/// string lives as long as the program.
#[no_mangle]
pub extern "C" fn warpsock_result_str(result: u32) -> *const c_char {
    ffi_panic_boundary! {
        warpsock_result::from_u32(result)
            .map_or(UNKNOWN, warpsock_result::message)
            .as_ptr()
    }
}

/// Writes the message for `result` into `buf` (`len` bytes), cut to fit
/// and NUL-terminated, and stores in `*out_n` the number of bytes written
/// before the NUL. An unknown number gives "unknown warpsock result code".
///
/// Returns `WARPSOCK_RESULT_NULL_PARAMETER` if `out_n` is NULL, or `buf` is
/// NULL while `len` is not 0.
#[no_mangle]
pub extern "C" fn warpsock_result_message(
    result: u32,
    buf: *mut c_char,
    len: usize,
    out_n: *mut usize,
) -> warpsock_result {
    ffi_panic_boundary! {
        let mut buf = try_out_buf!(buf.cast::<u8>(), len);
        let out_n = try_out!(out_n);
        let msg = warpsock_result::from_u32(result).map_or(UNKNOWN, warpsock_result::message);
        out_n.write(copy_text(msg.to_str().unwrap_or_default(), &mut buf));
        warpsock_result::Ok
    }
}

/// Writes the detailed text of the last failure on the calling thread
/// (which address, which setup step, the OS error, ...) into `buf` (`len`
/// bytes), cut to fit and NUL-terminated, and stores the bytes written
/// before the NUL in `*out_n`. Successful calls leave the text unchanged;
/// it is empty until something fails. Argument errors (NULL pointers,
/// invalid values) are reported by their code alone.
#[no_mangle]
pub extern "C" fn warpsock_last_error_detail(
    buf: *mut c_char,
    len: usize,
    out_n: *mut usize,
) -> warpsock_result {
    ffi_panic_boundary! {
        let mut buf = try_out_buf!(buf.cast::<u8>(), len);
        let out_n = try_out!(out_n);
        let n = DETAIL.with(|d| copy_text(&d.borrow(), &mut buf));
        out_n.write(n);
        warpsock_result::Ok
    }
}
