//! `vdprintf` and `dprintf` on a managed socket (and their
//! `_FORTIFY_SOURCE` forms, `__vdprintf_chk` and `__dprintf_chk`): glibc's
//! format into a stream that writes with its internal `__write`, which no
//! preloaded library sees (on a DDP-mode socket the bytes went to the
//! doorbell, issue 12); these format into a buffer of their own and send
//! it with the interposed `write`. Every other descriptor gets glibc's.

#![allow(clippy::missing_safety_doc)]

use libc::{c_char, c_int, c_void};

use crate::interpose::io;
use crate::shim::fdtable;
use crate::shim::guard::busy;
use crate::shim::real;
use crate::shim::sys::{self, set_errno};

extern "C" {
    fn vasprintf(out: *mut *mut c_char, fmt: *const c_char, ap: *mut c_void) -> c_int;
    fn __vasprintf_chk(
        out: *mut *mut c_char,
        flag: c_int,
        fmt: *const c_char,
        ap: *mut c_void,
    ) -> c_int;
}

/// A `vasprintf` buffer, freed when dropped (a cancel acted on in the
/// write unwinds through [`print_to`]: glibc's `vdprintf` leaks its
/// buffer then, this one does not).
struct Formatted(*mut c_char);

impl Drop for Formatted {
    fn drop(&mut self) {
        // SAFETY: vasprintf's buffer (or null), freed once.
        unsafe { libc::free(self.0.cast()) };
    }
}

/// `vdprintf`'s and `__vdprintf_chk`'s body on a managed socket: formatted
/// into a buffer (`vasprintf`, or with `flag` glibc's `__vasprintf_chk`,
/// the checks `_FORTIFY_SOURCE` asked for) and sent with the interposed
/// `write` (glibc's formats into a stream that writes with its internal
/// `__write`). The count written, or -1 (errno the failed call's) if a
/// write failed before every byte was taken.
unsafe fn print_to(fd: c_int, flag: Option<c_int>, fmt: *const c_char, ap: *mut c_void) -> c_int {
    let mut out: *mut c_char = std::ptr::null_mut();
    // SAFETY: the caller's format and arguments (`ap` as the caller
    // passed it: a va_list argument is a pointer on x86-64 and AArch64).
    let n = unsafe {
        match flag {
            None => vasprintf(&mut out, fmt, ap),
            Some(flag) => __vasprintf_chk(&mut out, flag, fmt, ap),
        }
    };
    if n < 0 {
        return -1;
    }
    let out = Formatted(out);
    let mut done = 0usize;
    let r = loop {
        if done == n as usize {
            break n;
        }
        // SAFETY: `out` holds `n` bytes.
        let k = unsafe { io::write(fd, out.0.add(done).cast(), n as usize - done) };
        if k <= 0 {
            break -1;
        }
        done += k as usize;
    };
    let e = sys::errno();
    drop(out);
    set_errno(e);
    r
}

/// Interposed `vdprintf(3)`: on a managed socket, `print_to`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C-unwind" fn vdprintf(fd: c_int, fmt: *const c_char, ap: *mut c_void) -> c_int {
    if busy() || fdtable::get(fd).is_none() {
        // SAFETY: forwarding the caller's arguments.
        return unsafe { real::vdprintf(fd, fmt, ap) };
    }
    // SAFETY: the caller's format and arguments.
    unsafe { print_to(fd, None, fmt, ap) }
}

/// Interposed `__vdprintf_chk`: the `vdprintf` of a program built with
/// `_FORTIFY_SOURCE` (`<bits/stdio2.h>`; review r26-c item 1). glibc's
/// (debug/vdprintf_chk.c) is `vdprintf` with the mode `PRINTF_FORTIFY` if
/// `flag` > 0 (`%n` only in a read-only format, positional arguments
/// checked); `__vasprintf_chk` (debug/vasprintf_chk.c) formats with that
/// same mode for the same `flag`, so the checks are glibc's own.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C-unwind" fn __vdprintf_chk(
    fd: c_int,
    flag: c_int,
    fmt: *const c_char,
    ap: *mut c_void,
) -> c_int {
    if busy() || fdtable::get(fd).is_none() {
        // SAFETY: forwarding the caller's arguments.
        return unsafe { real::__vdprintf_chk(fd, flag, fmt, ap) };
    }
    // SAFETY: the caller's format and arguments.
    unsafe { print_to(fd, Some(flag), fmt, ap) }
}

/// `dprintf`'s body: the naked entry's `va_list` (see [`dprintf`]).
#[cfg(target_arch = "x86_64")]
unsafe extern "C-unwind" fn dprintf_list(fd: c_int, fmt: *const c_char, ap: *mut c_void) -> c_int {
    // SAFETY: the entry's va_list over the caller's arguments.
    unsafe { vdprintf(fd, fmt, ap) }
}

/// `__dprintf_chk`'s body: the naked entry's `va_list`.
#[cfg(target_arch = "x86_64")]
unsafe extern "C-unwind" fn dprintf_chk_list(
    fd: c_int,
    flag: c_int,
    fmt: *const c_char,
    ap: *mut c_void,
) -> c_int {
    // SAFETY: the entry's va_list over the caller's arguments.
    unsafe { __vdprintf_chk(fd, flag, fmt, ap) }
}

/// A naked x86-64 entry of a C-variadic function: stable Rust cannot
/// define one, so it builds the `va_list` a variadic callee's prologue
/// would (System V x86-64 ABI §3.5.7) and calls `$body` with the named
/// arguments as they came and the `va_list`'s address in `$ap` (the
/// register after them). The six integer argument registers and, if `al`
/// (the count of vector registers used) is not 0, `xmm0`-`xmm7` go to a
/// register save area; the `va_list`'s `gp_offset` is `$gp` (8 per named
/// argument), `fp_offset` 48, `overflow_arg_area` the caller's stack
/// arguments (above the return address), `reg_save_area` the area.
///
/// With call frame information (a cancel acted on in the write unwinds
/// through this frame: `"C-unwind"`). Frame (rsp 16-aligned after the
/// sub: 8 mod 16 at entry): the va_list at [rsp] (24 bytes), the save
/// area at [rsp+32] (176 bytes: 48 of registers, then 128 of xmm0-xmm7,
/// 16-aligned at [rsp+80]).
#[cfg(target_arch = "x86_64")]
macro_rules! variadic_entry {
    ($body:path, $gp:literal, $ap:literal) => {
        core::arch::naked_asm!(
            ".cfi_startproc",
            "sub rsp, 216",
            ".cfi_adjust_cfa_offset 216",
            "mov [rsp+32], rdi",
            "mov [rsp+40], rsi",
            "mov [rsp+48], rdx",
            "mov [rsp+56], rcx",
            "mov [rsp+64], r8",
            "mov [rsp+72], r9",
            "test al, al",
            "je 2f",
            "movaps [rsp+80], xmm0",
            "movaps [rsp+96], xmm1",
            "movaps [rsp+112], xmm2",
            "movaps [rsp+128], xmm3",
            "movaps [rsp+144], xmm4",
            "movaps [rsp+160], xmm5",
            "movaps [rsp+176], xmm6",
            "movaps [rsp+192], xmm7",
            "2:",
            concat!("mov dword ptr [rsp], ", $gp),
            "mov dword ptr [rsp+4], 48",
            "lea rax, [rsp+224]",
            "mov [rsp+8], rax",
            "lea rax, [rsp+32]",
            "mov [rsp+16], rax",
            concat!("mov ", $ap, ", rsp"),
            "call {body}",
            "add rsp, 216",
            ".cfi_adjust_cfa_offset -216",
            "ret",
            ".cfi_endproc",
            body = sym $body,
        )
    };
}

/// Interposed `dprintf(3)` (x86-64): `vdprintf` over its arguments, by
/// the naked entry of `variadic_entry!` (`gp_offset` 16: `fd` and `fmt`
/// are taken; the `va_list` in `rdx`).
///
/// # Safety
/// As the libc call: a format and its arguments.
#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C-unwind" fn dprintf(fd: c_int, fmt: *const c_char) -> c_int {
    variadic_entry!(dprintf_list, 16, "rdx")
}

/// Interposed `__dprintf_chk` (x86-64): the `dprintf` of a program built
/// with `_FORTIFY_SOURCE`, `__vdprintf_chk` over its arguments by the
/// naked entry of `variadic_entry!` (`gp_offset` 24: `fd`, `flag` and
/// `fmt` are taken; the `va_list` in `rcx`).
///
/// # Safety
/// As the libc call: a format and its arguments.
#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C-unwind" fn __dprintf_chk(fd: c_int, flag: c_int, fmt: *const c_char) -> c_int {
    variadic_entry!(dprintf_chk_list, 24, "rcx")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The naked `dprintf` entry hands `vdprintf` the caller's arguments:
    /// integers in registers and on the stack, doubles (`al` set), mixed.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn dprintf_formats_every_kind_of_argument() {
        type Dprintf = unsafe extern "C" fn(c_int, *const c_char, ...) -> c_int;
        // SAFETY: the entry, called as C callers call it (variadic).
        let dp: Dprintf = unsafe { std::mem::transmute(dprintf as *const ()) };
        let fmt = c"%d %s %ld %d %d %d %d %.2f %.1f %d|";
        // SAFETY: a format and its arguments.
        printed(b"1 two 3 4 5 6 7 8.25 9.5 10|", |fd| unsafe {
            dp(
                fd,
                fmt.as_ptr(),
                1,
                c"two".as_ptr(),
                3i64,
                4,
                5,
                6,
                7,
                8.25f64,
                9.5f64,
                10,
            )
        });
    }

    /// Calls `print` with a pipe's write end and checks that it returned
    /// `want`'s length and wrote `want`.
    fn printed(want: &[u8], print: impl FnOnce(c_int) -> c_int) {
        let mut fds = [0; 2];
        // SAFETY: a pipe into a two-int array.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        let n = print(fds[1]);
        assert_eq!(n, want.len() as c_int);
        let mut got = [0u8; 64];
        // SAFETY: reading the pipe into `got`.
        let k = unsafe { libc::read(fds[0], got.as_mut_ptr().cast(), got.len()) };
        assert_eq!(&got[..k as usize], want);
        // SAFETY: closing the pipe.
        unsafe {
            libc::close(fds[0]);
            libc::close(fds[1]);
        }
    }

    /// The naked `__dprintf_chk` entry (one more named argument: the
    /// `va_list` starts at `gp_offset` 24) hands `__vdprintf_chk` the
    /// caller's arguments, registers, stack and doubles.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn dprintf_chk_formats_every_kind_of_argument() {
        type DprintfChk = unsafe extern "C" fn(c_int, c_int, *const c_char, ...) -> c_int;
        // SAFETY: the entry, called as C callers call it (variadic).
        let dp: DprintfChk = unsafe { std::mem::transmute(__dprintf_chk as *const ()) };
        let fmt = c"%d %s %ld %d %d %d %.2f %.1f %d|";
        // SAFETY: a format and its arguments.
        printed(b"1 two 3 4 5 6 8.25 9.5 10|", |fd| unsafe {
            dp(
                fd,
                1,
                fmt.as_ptr(),
                1,
                c"two".as_ptr(),
                3i64,
                4,
                5,
                6,
                8.25f64,
                9.5f64,
                10,
            )
        });
    }
}
