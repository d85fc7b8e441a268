//! The paths a signal handler may run allocate nothing (review r18-xhaz
//! 4a, 4c): a thread's first claim of a slot, and a look-up's end whose
//! reclaim scans the retired list. `malloc` inside a handler that
//! interrupted `malloc` deadlocks.
//!
//! Counted at the C allocator: this test binary's `malloc`, `calloc`,
//! `realloc` and the aligned ones (interposed here, forwarded to glibc's)
//! count the calls the calling thread makes while it counts — Rust's
//! allocations and glibc's own (a thread-local destructor's registration
//! is glibc's `calloc`); `free` is counted apart (a reclaim frees: the
//! module docs of `hazard`).

use std::cell::Cell;

use libc::{c_void, size_t};

use super::super::hazard;
use super::look_ups::serial;
use super::*;

thread_local! {
    /// Whether the thread counts, and its counts of allocations and frees
    /// (const, no destructor: read inside `malloc` with no allocation).
    static COUNTING: Cell<bool> = const { Cell::new(false) };
    static COUNT: Cell<usize> = const { Cell::new(0) };
    static FREES: Cell<usize> = const { Cell::new(0) };
}

extern "C" {
    fn __libc_malloc(n: size_t) -> *mut c_void;
    fn __libc_calloc(n: size_t, m: size_t) -> *mut c_void;
    fn __libc_realloc(p: *mut c_void, n: size_t) -> *mut c_void;
    fn __libc_memalign(a: size_t, n: size_t) -> *mut c_void;
    fn __libc_free(p: *mut c_void);
}

fn counted() {
    if COUNTING.with(Cell::get) {
        COUNT.with(|c| c.set(c.get() + 1));
    }
}

/// glibc's `free`, counted apart.
///
/// # Safety
/// `free(3)`'s contract.
#[no_mangle]
unsafe extern "C" fn free(p: *mut c_void) {
    if !p.is_null() && COUNTING.with(Cell::get) {
        FREES.with(|c| c.set(c.get() + 1));
    }
    // SAFETY: the caller's contract, forwarded.
    unsafe { __libc_free(p) }
}

/// glibc's `memalign`, counted (Rust's allocator takes the aligned calls
/// for alignments above 16).
#[no_mangle]
extern "C" fn memalign(a: size_t, n: size_t) -> *mut c_void {
    counted();
    // SAFETY: glibc's allocator, the caller's arguments.
    unsafe { __libc_memalign(a, n) }
}

/// glibc's `aligned_alloc`, counted.
#[no_mangle]
extern "C" fn aligned_alloc(a: size_t, n: size_t) -> *mut c_void {
    memalign(a, n)
}

/// glibc's `posix_memalign`, counted.
///
/// # Safety
/// `posix_memalign(3)`'s contract.
#[no_mangle]
unsafe extern "C" fn posix_memalign(out: *mut *mut c_void, a: size_t, n: size_t) -> c_int {
    let p = memalign(a, n);
    if p.is_null() {
        return libc::ENOMEM;
    }
    // SAFETY: the caller's out-pointer.
    unsafe { *out = p };
    0
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
    counts(f).0
}

/// The allocations and the frees the calling thread makes in `f`.
fn counts(f: impl FnOnce()) -> (usize, usize) {
    COUNT.with(|c| c.set(0));
    FREES.with(|c| c.set(0));
    COUNTING.with(|c| c.set(true));
    f();
    COUNTING.with(|c| c.set(false));
    (COUNT.with(Cell::get), FREES.with(Cell::get))
}

/// The counter counts: a `Box` is one allocation and one free, an aligned
/// one too, and glibc's own `calloc` (a thread-local destructor's
/// registration, the first use of one on a fresh thread) is seen.
#[test]
fn the_counter_counts() {
    #[repr(align(128))]
    struct Aligned(#[allow(dead_code)] u8);
    thread_local! {
        static WITH_DROP: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    let (boxed, aligned, registration) = std::thread::spawn(|| {
        let boxed = counts(|| drop(std::hint::black_box(Box::new(1u64))));
        let aligned = allocations(|| drop(std::hint::black_box(Box::new(Aligned(1)))));
        let registration = allocations(|| WITH_DROP.with(|_| ()));
        (boxed, aligned, registration)
    })
    .join()
    .unwrap();
    assert_eq!(boxed, (1, 1));
    assert_eq!(aligned, 1, "an aligned allocation");
    assert!(registration >= 1, "glibc's own calloc not seen");
}

/// A thread's first managed data call claims its slot (and records it
/// for the thread's exit) with no allocation.
#[test]
fn a_first_claim_allocates_nothing() {
    let _serial = serial();
    let (n, slot) = std::thread::spawn(|| {
        // The test-only hooks' own thread-locals (a destructor registered:
        // `calloc`), outside the count.
        hazard::tests::DURING_CLAIM.with(|_| ());
        hazard::tests::OWNED_IN_CLAIM.with(|_| ());
        let mut slot = None;
        let n = allocations(|| slot = hazard::mine().map(|h| h as *const hazard::Slot as usize));
        (n, slot)
    })
    .join()
    .unwrap();
    assert!(slot.is_some(), "no slot");
    assert_eq!(n, 0, "the first claim allocated");
}

/// The thread that dropped a [`Counted`], and whether it was counting.
static DROPPED_BY: std::sync::atomic::AtomicI64 = std::sync::atomic::AtomicI64::new(0);

/// A socket that records who dropped it ([`DROPPED_BY`]: the thread id,
/// negative if it was not counting).
struct Counted;

impl Drop for Counted {
    fn drop(&mut self) {
        // SAFETY: a plain system call.
        let tid = i64::from(unsafe { libc::gettid() });
        let v = if COUNTING.with(Cell::get) { tid } else { -tid };
        DROPPED_BY.store(v, Ordering::SeqCst);
    }
}

inert_socket!(Counted);

/// A look-up's end that a removal nudged reclaims — scans the retired
/// list, frees the entry it kept, drops it, on this thread while it
/// counts — with no allocation; it frees the node and the socket's last
/// reference (the module docs of `hazard`: a reclaim frees).
#[test]
fn a_reclaim_allocates_nothing() {
    let _serial = serial();
    let fd = 60_061;
    // A scan by a test not serialised with this one (a UDP socket's
    // change of the table) may free the entry between the end's clear and
    // its reclaim: then again, a few times at most (review r20-xhaz2b 6d).
    let mut n = (0, 0);
    let by_the_end = (0..10).any(|_| {
        DROPPED_BY.store(0, Ordering::SeqCst);
        assert!(insert(fd, Arc::new(Counted)).unwrap().is_none());
        let (c, nudged, tid) = std::thread::spawn(move || {
            // The test-only hook's thread-local (a destructor registered:
            // `calloc`), outside the count.
            hazard::tests::AFTER_END.with(|_| ());
            let h = hazard::mine().expect("a slot");
            assert!(!hazard::protect(h, &LOW[fd as usize]).is_null());
            std::thread::spawn(move || drop(remove(fd))).join().unwrap();
            let nudged = hazard::tests::state(h).1;
            let c = counts(|| hazard::end(h));
            // SAFETY: a plain system call.
            (c, nudged, i64::from(unsafe { libc::gettid() }))
        })
        .join()
        .unwrap();
        assert!(nudged, "the removal kept nothing for the call");
        holds::settled();
        n = c;
        // (A scan of T's may also free a node another test's slot kept:
        // more frees then, again.)
        DROPPED_BY.load(Ordering::SeqCst) == tid && c.1 == 2
    });
    assert!(by_the_end, "never dropped by the end, counted");
    assert_eq!(n.0, 0, "the reclaim allocated");
    assert_eq!(n.1, 2, "frees: the node and the socket");
}

/// A thread-specific key of 32 or more (glibc stores its values in a
/// block each thread callocs at its first store) is not used: a claim
/// with it takes no slot, and allocates nothing.
#[test]
fn a_key_of_32_or_more_is_not_used() {
    let _serial = serial();
    let mut made = Vec::new();
    let k = loop {
        let mut k = 0;
        // SAFETY: a key of this test's, no destructor.
        assert_eq!(unsafe { libc::pthread_key_create(&mut k, None) }, 0);
        made.push(k);
        if k >= 32 {
            break k;
        }
        assert!(made.len() < 64, "no key of 32 or more");
    };
    assert!(hazard::usable(31).is_some());
    let (n, slot) = std::thread::spawn(move || {
        hazard::tests::DURING_CLAIM.with(|_| ());
        let mut slot = None;
        let n = allocations(|| slot = hazard::claim_with(hazard::usable(k)).map(|_| ()));
        (n, slot)
    })
    .join()
    .unwrap();
    for k in made {
        // SAFETY: this test's keys.
        unsafe { libc::pthread_key_delete(k) };
    }
    assert_eq!(n, 0, "the claim allocated");
    assert!(slot.is_none(), "a slot claimed with a key of {k}");
}

/// A `close` over the thread's hold (a handler's, left to the hold's
/// end: `held::defer_close`) allocates nothing, even as the thread's
/// first (its list is a constant thread-local with no destructor, whose
/// registration would `calloc`; review r20-xhaz3 item 2).
#[test]
fn a_close_over_a_hold_allocates_nothing() {
    let _serial = serial();
    prepare();
    // SAFETY: a new descriptor of this test's, closed by the deferred close.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
    assert!(fd >= 0);
    assert!(insert(fd, dummy()).unwrap().is_none());
    let (n, deferred, gone) = std::thread::spawn(move || {
        // The test-only hooks' own thread-locals (a destructor registered:
        // `calloc`), outside the count.
        hooks::BEFORE_LOCK.with(|_| ());
        hooks::IN_DEFER_CLOSE.with(|_| ());
        hazard::tests::BETWEEN.with(|_| ());
        hazard::tests::AFTER_PUBLISH.with(|_| ());
        hazard::tests::AFTER_END.with(|_| ());
        let held = write_map().expect("not over a hold");
        let mut r = Ok(false);
        let n = allocations(|| r = defer_close(fd));
        drop(held);
        (n, r, get(fd).is_none())
    })
    .join()
    .unwrap();
    assert_eq!(deferred, Ok(true), "not left to the hold's end");
    assert_eq!(n, 0, "allocations");
    assert!(gone, "not made at the hold's end");
}
