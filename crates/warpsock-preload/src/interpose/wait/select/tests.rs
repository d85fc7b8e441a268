use std::cell::Cell;
use std::time::Duration;

use super::{select_bound, watching_changes};

/// A set of one word (n = 20), the last of a page whose next page is not
/// mapped: a read or write past the set faults. Returns the set and the
/// mapping's base and length (unmapped by the caller).
fn guarded_word() -> (*mut libc::fd_set, *mut libc::c_void, usize) {
    // SAFETY: a private mapping of two pages, the second made
    // inaccessible, unmapped by the caller.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
    // SAFETY: as above.
    let base = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            2 * page,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(base, libc::MAP_FAILED);
    // SAFETY: the second page of our mapping.
    let guarded =
        unsafe { libc::mprotect(base.cast::<u8>().add(page).cast(), page, libc::PROT_NONE) };
    assert_eq!(guarded, 0);
    // SAFETY: the last word of the first page.
    let set = unsafe { base.cast::<u8>().add(page - 8) }.cast::<libc::fd_set>();
    (set, base, 2 * page)
}

fn word(set: *mut libc::fd_set) -> u64 {
    // SAFETY: the test's own word.
    unsafe { set.cast::<u64>().read() }
}

fn set_word(set: *mut libc::fd_set, v: u64) {
    // SAFETY: the test's own word.
    unsafe { set.cast::<u64>().write(v) }
}

/// A `select`'s sets are `n` bits, rounded up to words, as the kernel and
/// the caller size them: a wait restores exactly that much, not a whole
/// `fd_set` (review 36b item 1: libevent's 8-byte sets, and the heap
/// behind them, were read and written 128 bytes over; here a fault). With
/// no number whose file is to change, the caller's sets go to the real
/// call as they are.
#[test]
fn a_select_with_no_switching_number_is_the_real_one() {
    let (set, base, len) = guarded_word();
    set_word(set, 0x0102_0304_0506_0708);
    let mut calls = 0;
    let got = watching_changes::<()>(
        20,
        [set, std::ptr::null_mut(), std::ptr::null_mut()],
        Some(Duration::ZERO),
        None,
        |_| None,
        |n, sets, left, _| {
            calls += 1;
            assert_eq!((n, sets[0], left), (20, set, Some(Duration::ZERO)));
            // Cleared as the kernel does on a timeout.
            set_word(set, 0);
            0
        },
    );
    assert_eq!((got, calls), (0, 1));
    // SAFETY: our mapping.
    unsafe { libc::munmap(base, len) };
    let tv = |tv_sec, tv_usec| libc::timeval { tv_sec, tv_usec };
    assert_eq!(
        select_bound(&tv(1, 2_500_000)),
        Ok(Duration::from_micros(3_500_000))
    );
    assert!(select_bound(&tv(0, -1)).is_err());
}

/// A number whose file is to change (3, its switch's descriptor 100): the
/// wait watches descriptor 100 too, in sets of its own widened to it;
/// when only that one fires (the switch ended) it is not the caller's to
/// see, and the wait goes on from the caller's sets, the number's new
/// file watched now (here no longer changing); what that wait finds is
/// the answer. The caller's word is read and written, nothing past it.
#[test]
fn a_switchs_end_wakes_the_select_which_waits_again_on_the_new_file() {
    let (set, base, len) = guarded_word();
    set_word(set, 1 << 3 | 1 << 7);
    let changing_now = Cell::new(true);
    let mut calls = 0;
    let got = watching_changes(
        20,
        [set, std::ptr::null_mut(), std::ptr::null_mut()],
        None,
        None,
        |fd| (fd == 3 && changing_now.get()).then_some(("held", 100)),
        |n, sets, left, _| {
            calls += 1;
            assert_eq!(left, None);
            assert!(sets[1].is_null() && sets[2].is_null());
            if calls == 1 {
                assert_eq!(n, 101, "widened to the switch's descriptor");
                assert_ne!(sets[0], set, "the wait's own sets");
                // SAFETY: the wait's own sets, 2 words (n = 101).
                let w = unsafe { std::slice::from_raw_parts_mut(sets[0].cast::<u64>(), 2) };
                assert_eq!(w, [1 << 3 | 1 << 7, 1 << 36]);
                // The switch ended: only its descriptor is ready.
                w[0] = 0;
                changing_now.set(false);
                return 1;
            }
            assert_eq!((n, sets[0]), (20, set), "the caller's sets again");
            assert_eq!(word(set), 1 << 3 | 1 << 7, "restored");
            // Input on the new file.
            set_word(set, 1 << 3);
            1
        },
    );
    assert_eq!((got, calls), (1, 2));
    assert_eq!(word(set), 1 << 3);
    // SAFETY: our mapping.
    unsafe { libc::munmap(base, len) };
}

/// What the wait finds of the caller's beside a switch's end is the
/// answer at once, the switch's descriptor out of it and of the count.
#[test]
fn the_callers_own_input_beside_a_switchs_end_is_the_answer() {
    let (set, base, len) = guarded_word();
    set_word(set, 1 << 3 | 1 << 7);
    let mut calls = 0;
    let got = watching_changes(
        20,
        [set, std::ptr::null_mut(), std::ptr::null_mut()],
        Some(Duration::from_secs(5)),
        None,
        |fd| (fd == 3).then_some(((), 64)),
        |n, sets, _, _| {
            calls += 1;
            assert_eq!(n, 65);
            // SAFETY: the wait's own sets, 2 words (n = 65).
            let w = unsafe { std::slice::from_raw_parts_mut(sets[0].cast::<u64>(), 2) };
            w[0] = 1 << 7;
            assert_eq!(w[1], 1);
            2
        },
    );
    assert_eq!((got, calls), (1, 1));
    assert_eq!(word(set), 1 << 7);
    // SAFETY: our mapping.
    unsafe { libc::munmap(base, len) };
}

/// A signal that comes between two waits fails the next one with
/// `EINTR`, its handler run by then and not before (it used to run in the
/// gap, and the wait went on to its bound). The second wait is the real
/// `pselect` with the mask given; the first stands for one that a
/// switch's end woke as the signal came.
#[test]
fn a_signal_between_two_waits_fails_the_next_with_eintr() {
    use std::sync::atomic::{AtomicBool, Ordering};
    static RAN: AtomicBool = AtomicBool::new(false);
    extern "C" fn handler(_: libc::c_int) {
        RAN.store(true, Ordering::SeqCst);
    }
    // A real-time signal no other test uses, sent to this thread only.
    let sig = libc::SIGRTMIN() + 3;
    // SAFETY: a handler that only stores an atomic; no SA_RESTART.
    let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = handler as *const () as usize;
        libc::sigemptyset(&mut sa.sa_mask);
        assert_eq!(libc::sigaction(sig, &sa, &mut old), 0);
    }
    // SAFETY: a zeroed fd_set is an empty one.
    let mut r: libc::fd_set = unsafe { std::mem::zeroed() };
    // SAFETY: a set of our own.
    unsafe { libc::FD_SET(1, &mut r) };
    let changing_now = Cell::new(true);
    let mut calls = 0;
    let mut ran_in_gap = None;
    let got = watching_changes(
        2,
        [&mut r, std::ptr::null_mut(), std::ptr::null_mut()],
        Some(Duration::from_secs(30)),
        None,
        |fd| (fd == 1 && changing_now.get()).then_some(((), 5)),
        |_, sets, left, mask| {
            calls += 1;
            if calls == 1 {
                // SAFETY: a signal to this thread.
                unsafe { libc::pthread_kill(libc::pthread_self(), sig) };
                ran_in_gap = Some(RAN.load(Ordering::SeqCst));
                // Only the switch's descriptor (5) is ready.
                // SAFETY: the wait's own set, 1 word.
                unsafe { sets[0].cast::<u64>().write(1 << 5) };
                changing_now.set(false);
                return 1;
            }
            // No sets: the wait's mask alone decides.
            let nul = std::ptr::null_mut();
            super::real_pselect(0, [nul; 3], left, mask)
        },
    );
    let e = std::io::Error::last_os_error().raw_os_error();
    // SAFETY: the handler before the test's.
    unsafe { libc::sigaction(sig, &old, std::ptr::null_mut()) };
    assert_eq!(ran_in_gap, Some(false), "the handler ran between waits");
    assert_eq!((got, e, calls), (-1, Some(libc::EINTR), 2));
    assert!(RAN.load(Ordering::SeqCst));
}

/// Widened, the caller's sets keep only their `n` bits: a bit past `n`
/// (stale, which the kernel ignores in the caller's sets) would count in
/// the wider ones. A number in two sets, and two numbers of one switching
/// socket, are held once.
#[test]
fn widened_sets_keep_only_the_callers_bits_and_hold_each_socket_once() {
    let (set, base, len) = guarded_word();
    // Numbers 3 and 4 (one switching socket, a dup), and a stale bit 25.
    set_word(set, 1 << 3 | 1 << 4 | 1 << 25);
    // SAFETY: a zeroed fd_set is an empty one.
    let mut w: libc::fd_set = unsafe { std::mem::zeroed() };
    // SAFETY: a set of our own.
    unsafe { libc::FD_SET(3, &mut w) };
    let asked = Cell::new(0);
    let got = watching_changes(
        20,
        [set, &mut w, std::ptr::null_mut()],
        Some(Duration::from_secs(5)),
        None,
        |fd| {
            asked.set(asked.get() + 1);
            (fd == 3 || fd == 4).then_some(((), 70))
        },
        |n, sets, _, _| {
            assert_eq!(n, 71);
            // SAFETY: the wait's own sets, 2 words (n = 71).
            let r = unsafe { std::slice::from_raw_parts_mut(sets[0].cast::<u64>(), 2) };
            assert_eq!(
                r,
                [1 << 3 | 1 << 4, 1 << 6],
                "no bit past n, the switch's once"
            );
            // SAFETY: as above.
            let wr = unsafe { std::slice::from_raw_parts_mut(sets[1].cast::<u64>(), 2) };
            assert_eq!(wr, [1 << 3, 0]);
            r[0] = 1 << 4;
            r[1] = 0;
            wr[0] = 0;
            1
        },
    );
    assert_eq!(got, 1);
    assert_eq!(asked.get(), 2, "numbers 3 and 4, each once");
    assert_eq!(word(set), 1 << 4);
    // SAFETY: our mapping.
    unsafe { libc::munmap(base, len) };
}

/// A count past `FD_SETSIZE` is taken down to the descriptor table's size
/// (`FDSize`), as the kernel takes it; one below is left alone.
#[test]
fn a_count_past_fd_setsize_is_taken_down_to_the_table() {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let size: libc::c_int = status
        .lines()
        .find_map(|l| l.strip_prefix("FDSize:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap();
    assert_eq!(super::clamped(20), 20);
    assert_eq!(super::clamped(libc::FD_SETSIZE as libc::c_int), 1024);
    assert_eq!(super::clamped(libc::c_int::MAX), size);
}
