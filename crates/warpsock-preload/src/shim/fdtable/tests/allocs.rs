//! The paths a signal handler may run allocate nothing (review r18-xhaz
//! 4a, 4c): a thread's first claim of a slot, and a look-up's end whose
//! reclaim scans the retired list. `malloc` inside a handler that
//! interrupted `malloc` deadlocks.
//!
//! Counted at the C allocator: this test binary's `malloc`, `calloc` and
//! `realloc` (interposed here, forwarded to glibc's) count the calls the
//! calling thread makes while it counts — Rust's allocations and glibc's
//! own (a thread-local destructor's registration is glibc's `calloc`).

use std::cell::Cell;

use libc::{c_void, size_t};

use super::super::hazard;
use super::look_ups::serial;
use super::*;

thread_local! {
    /// Whether the thread counts, and its count (const, no destructor:
    /// read inside `malloc` with no allocation).
    static COUNTING: Cell<bool> = const { Cell::new(false) };
    static COUNT: Cell<usize> = const { Cell::new(0) };
}

extern "C" {
    fn __libc_malloc(n: size_t) -> *mut c_void;
    fn __libc_calloc(n: size_t, m: size_t) -> *mut c_void;
    fn __libc_realloc(p: *mut c_void, n: size_t) -> *mut c_void;
}

fn counted() {
    if COUNTING.with(Cell::get) {
        COUNT.with(|c| c.set(c.get() + 1));
    }
}

/// glibc's `malloc`, counted.
#[no_mangle]
extern "C" fn malloc(n: size_t) -> *mut c_void {
    counted();
    // SAFETY: glibc's allocator, the caller's arguments.
    unsafe { __libc_malloc(n) }
}

/// glibc's `calloc`, counted.
#[no_mangle]
extern "C" fn calloc(n: size_t, m: size_t) -> *mut c_void {
    counted();
    // SAFETY: as `malloc`.
    unsafe { __libc_calloc(n, m) }
}

/// glibc's `realloc`, counted.
///
/// # Safety
/// `realloc(3)`'s contract.
#[no_mangle]
unsafe extern "C" fn realloc(p: *mut c_void, n: size_t) -> *mut c_void {
    counted();
    // SAFETY: the caller's contract, forwarded.
    unsafe { __libc_realloc(p, n) }
}

/// The allocations the calling thread makes in `f`.
fn allocations(f: impl FnOnce()) -> usize {
    COUNT.with(|c| c.set(0));
    COUNTING.with(|c| c.set(true));
    f();
    COUNTING.with(|c| c.set(false));
    COUNT.with(Cell::get)
}

/// The counter counts: a `Box` is one allocation.
#[test]
fn the_counter_counts() {
    let n = std::thread::spawn(|| allocations(|| drop(std::hint::black_box(Box::new(1u64)))))
        .join()
        .unwrap();
    assert_eq!(n, 1);
}

/// A thread's first managed data call claims its slot (and records it
/// for the thread's exit) with no allocation.
#[test]
fn a_first_claim_allocates_nothing() {
    let _serial = serial();
    let (n, slot) = std::thread::spawn(|| {
        // The test-only hook's own thread-local (a destructor registered:
        // `calloc`), outside the count.
        hazard::tests::DURING_CLAIM.with(|_| ());
        let mut slot = None;
        let n = allocations(|| slot = hazard::mine().map(|h| h as *const hazard::Slot as usize));
        (n, slot)
    })
    .join()
    .unwrap();
    assert!(slot.is_some(), "no slot");
    assert_eq!(n, 0, "the first claim allocated");
}

/// A look-up's end that a removal nudged reclaims — scans the retired
/// list, frees the entry it kept, drops it — with no allocation.
#[test]
fn a_reclaim_allocates_nothing() {
    let _serial = serial();
    let fd = 60_061;
    let a = dummy();
    let weak = Arc::downgrade(&a);
    assert!(insert(fd, a).unwrap().is_none());
    let (n, nudged, left) = std::thread::spawn(move || {
        let h = hazard::mine().expect("a slot");
        assert!(!hazard::protect(h, &LOW[fd as usize]).is_null());
        std::thread::spawn(move || drop(remove(fd))).join().unwrap();
        let nudged = hazard::tests::state(h).1;
        let n = allocations(|| hazard::end(h));
        holds::settled();
        (n, nudged, weak.strong_count())
    })
    .join()
    .unwrap();
    assert!(nudged, "the removal kept nothing for the call");
    assert_eq!(left, 0, "not freed at the end");
    assert_eq!(n, 0, "the reclaim allocated");
}
