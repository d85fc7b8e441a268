//! The variadic execs, `execl(3)`, `execle(3)` and `execlp(3)`, interposed
//! (x86-64 only). glibc's build their argument vector and call its
//! internal `execve`, never the interposed one, so without these an
//! `execl` neither waited for DDP sockets' bytes nor reset what it gave up
//! on nor demoted the offloaded sockets the new image inherits (issue 12;
//! the README's `WARPSOCK_LINGER_MS`).
//!
//! Stable Rust cannot define a C-variadic function, so each is a naked
//! entry that turns its variadic arguments into the vector the `v`
//! variant takes, in place and with no allocation (an `execl` may run in a
//! vforked child, where `malloc` is not safe). In the System V x86-64 ABI
//! the caller of `execl(path, arg0, ...)` puts `path` in `rdi`, the next
//! five pointers in `rsi`, `rdx`, `rcx`, `r8`, `r9` and the rest on its
//! stack, in order, just above the return address (§3.2.3; a variadic
//! callee reads pointer arguments where a fixed one would). The entry
//! takes the return address off, pushes the five registers below the
//! stack arguments — the whole list, `arg0` first, is now one array on the
//! stack, ending at its NULL (and `execle`'s `envp` right after it) — and
//! calls the Rust body with `path` and the array's address; it then drops
//! the five slots and returns to the caller through the same return
//! address (a shadow stack's copy still matches it).

use std::ffi::c_char;

use libc::c_int;

use crate::interpose::{execv, execve, execvp};

/// A naked entry: `path` stays in `rdi`, the argument array's address
/// goes to `rsi`, and `$body(path, args)` is called on a 16-byte aligned
/// stack (at entry `rsp` is 8 mod 16: 8 more after the return address's
/// pop and the five pushes, 0 after its push back).
macro_rules! variadic_exec {
    ($(#[$doc:meta])* $vis:vis $name:ident => $body:path) => {
        $(#[$doc])*
        ///
        /// # Safety
        /// As the libc call: a NULL-terminated list of C strings.
        #[unsafe(naked)]
        #[cfg_attr(not(test), no_mangle)]
        $vis unsafe extern "C" fn $name(path: *const c_char, arg0: *const c_char) -> c_int {
            core::arch::naked_asm!(
                "pop r11",
                "push r9",
                "push r8",
                "push rcx",
                "push rdx",
                "push rsi",
                "mov rsi, rsp",
                "push r11",
                "call {body}",
                "pop r11",
                "add rsp, 40",
                "push r11",
                "ret",
                body = sym $body,
            )
        }
    };
}

variadic_exec!(
    /// Interposed `execl(3)`: as `execv(path, [arg0, ..., NULL])`.
    pub execl => execl_array
);
variadic_exec!(
    /// Interposed `execle(3)`: as `execve(path, [arg0, ..., NULL], envp)`,
    /// `envp` the argument after the list's NULL.
    pub execle => execle_array
);
variadic_exec!(
    /// Interposed `execlp(3)`: as `execvp(file, [arg0, ..., NULL])`.
    pub execlp => execlp_array
);

/// `execl`'s body: `args` is the caller's list, NULL-terminated.
unsafe extern "C" fn execl_array(path: *const c_char, args: *const *const c_char) -> c_int {
    // SAFETY: `args` is the caller's NULL-terminated list (the entry's
    // array); the interposed `execv` checks nothing more than libc's.
    unsafe { execv(path, args) }
}

/// `execle`'s body: the environment is the pointer after the list's NULL.
unsafe extern "C" fn execle_array(path: *const c_char, args: *const *const c_char) -> c_int {
    // SAFETY: as `execl_array`; `execle`'s caller passes `envp` after the
    // NULL, so the slot after it is in the caller's argument area.
    unsafe {
        execve(
            path,
            args,
            *args.add(list_len(args) + 1) as *const *const c_char,
        )
    }
}

/// `execlp`'s body.
unsafe extern "C" fn execlp_array(file: *const c_char, args: *const *const c_char) -> c_int {
    // SAFETY: as `execl_array`.
    unsafe { execvp(file, args) }
}

/// The number of pointers before the list's NULL.
///
/// # Safety
/// `args` is a NULL-terminated array of pointers.
unsafe fn list_len(args: *const *const c_char) -> usize {
    let mut n = 0;
    // SAFETY: the array ends at a NULL, which ends the loop.
    while !unsafe { *args.add(n) }.is_null() {
        n += 1;
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the entry hands its body, seen by a body that records it: the
    /// list as one array in order, however many arguments (fewer than
    /// the five registers, exactly five, and past them onto the stack),
    /// and the pointer after its NULL.
    #[test]
    fn the_entry_hands_its_body_the_whole_list_in_order() {
        use std::cell::RefCell;
        thread_local! {
            static SEEN: RefCell<(usize, Vec<Vec<u8>>, usize)> = const { RefCell::new((0, Vec::new(), 0)) };
        }
        unsafe extern "C" fn record(path: *const c_char, args: *const *const c_char) -> c_int {
            // SAFETY: the entry's array, NULL-terminated; the slot after
            // the NULL is the caller's (each call below passes one).
            unsafe {
                let n = list_len(args);
                let list = (0..n)
                    .map(|i| std::ffi::CStr::from_ptr(*args.add(i)).to_bytes().to_vec())
                    .collect();
                let after = *args.add(n + 1) as usize;
                SEEN.with(|s| *s.borrow_mut() = (path as usize, list, after));
            }
            42
        }
        variadic_exec!(probe => record);
        type Probe = unsafe extern "C" fn(*const c_char, *const c_char, ...) -> c_int;
        // SAFETY: the same entry, called as C callers call it (variadic).
        let probe: Probe = unsafe { std::mem::transmute(probe as *const ()) };
        let words: Vec<std::ffi::CString> = (0..9)
            .map(|i| std::ffi::CString::new(format!("arg{i}")).unwrap())
            .collect();
        let w = |i: usize| words[i].as_ptr();
        let path = c"/the/path".as_ptr();
        let env = 0x5eed_usize as *const c_char;
        let null = std::ptr::null::<c_char>();
        let want = |n: usize| {
            (0..n)
                .map(|i| format!("arg{i}").into_bytes())
                .collect::<Vec<_>>()
        };
        let check = |n: usize, r: c_int| {
            assert_eq!(r, 42);
            SEEN.with(|s| {
                let (p, list, after) = &*s.borrow();
                assert_eq!(*p, path as usize);
                assert_eq!(*list, want(n), "{n} arguments");
                assert_eq!(
                    *after, env as usize,
                    "{n} arguments: the pointer after the NULL"
                );
            });
        };
        let (a, b, c) = (w(0), w(1), w(2));
        let (d, e, f, g, h, i) = (w(3), w(4), w(5), w(6), w(7), w(8));
        // SAFETY: a NULL-terminated list, one pointer after it.
        let r = unsafe { probe(path, a, null, env) };
        check(1, r);
        // SAFETY: as above.
        let r = unsafe { probe(path, a, b, c, d, null, env) };
        check(4, r);
        // SAFETY: as above.
        let r = unsafe { probe(path, a, b, c, d, e, null, env) };
        check(5, r);
        // SAFETY: as above.
        let r = unsafe { probe(path, a, b, c, d, e, f, g, h, i, null, env) };
        check(9, r);
    }
}
