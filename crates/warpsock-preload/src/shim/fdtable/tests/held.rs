//! Calls over the calling thread's own hold of the table's lock (a signal
//! handler that interrupted `close`, `dup2` or a locked look-up; staged
//! here by the thread holding the lock itself): they never wait for it
//! (`held`'s module docs; review r19-lead-haz note 5). Each would deadlock
//! the thread on itself without it (`within_a_minute` then ends the run).

use super::super::hazard;
use super::holds::within_a_minute;
use super::look_ups::serial;
use super::*;
use crate::shim::guard;
use crate::shim::sys::{errno, set_errno};
use std::sync::atomic::AtomicI32;

/// The errno a call left, cleared first.
fn errno_of<T>(f: impl FnOnce() -> T) -> (T, c_int) {
    set_errno(0);
    let r = f();
    (r, errno())
}

/// Whether the slot borrowed first (the last) is free.
fn last_slot_free() -> bool {
    !hazard::tests::state(&hazard::HAZARDS[hazard::SLOTS - 1]).2
}

/// Over the thread's write hold (a handler over `close`'s removal): a
/// look-up of a low descriptor finds its socket with no lock, by the
/// thread's slot or, the slot in use (a call inside a call), a borrowed
/// one, given back after; a high descriptor's gets the socket that
/// refuses (`EDEADLK`); changes are refused; the listing is empty, the
/// demotion's has the low descriptors only (review r20-xhaz3 item 3:
/// `exec`'s demotion); after the hold all is as it was.
#[test]
fn look_ups_over_the_threads_write_hold_take_no_lock() {
    let _serial = serial();
    prepare();
    let (low, high) = (60_071, BITS as c_int + 71);
    let (a, b) = (dummy(), dummy());
    assert!(insert(low, a.clone()).unwrap().is_none());
    assert!(insert(high, b.clone()).unwrap().is_none());
    assert!(last_slot_free());
    let (a2, b2) = (a.clone(), b.clone());
    let r = within_a_minute("a look-up over its thread's write hold", move || {
        let (a, _b) = (a2, b2);
        let held = write_map().expect("not over a hold");
        let by_get = get(low).is_some_and(|s| Arc::ptr_eq(&s, &a));
        // The thread's slot in use: the nested look-up borrows one (for
        // the moment of an `Arc`'s clone).
        let nested = with_marked(
            low,
            || false,
            |_| with_marked(low, || false, |s| Arc::ptr_eq(s, &a)),
        );
        let given_back = last_slot_free();
        let high_refused = errno_of(|| {
            // SAFETY: an empty send to the refusing socket.
            get(high).map(|s| unsafe { s.send_one(std::ptr::null(), 0, 0) })
        });
        let none = all().is_empty();
        let listed = all_to_demote();
        let listed = (
            listed
                .iter()
                .any(|(fd, s)| *fd == low && Arc::ptr_eq(s, &a)),
            listed.iter().any(|(fd, _)| *fd == high),
        );
        let changes = (remove(low).err(), insert(low, dummy()).err(), none, listed);
        drop(held);
        (by_get, nested, given_back, high_refused, changes)
    });
    let (by_get, nested, given_back, high_refused, changes) = r;
    assert!(by_get, "get: not the socket");
    assert!(nested, "a nested look-up: not the socket");
    assert!(given_back, "the borrowed slot was kept");
    assert_eq!(high_refused, (Some(-1), libc::EDEADLK), "a high descriptor");
    assert_eq!(
        changes,
        (Some(libc::EDEADLK), Some(libc::EDEADLK), true, (true, false)),
        "changes, the listing (none), or the demotion's (the low one, not the high one) over the hold"
    );
    assert!(same(&get(low), &a) && same(&get(high), &b), "changed");
    assert!(same(&remove(low).unwrap(), &a));
    assert!(same(&remove(high).unwrap(), &b));
}

/// Over the thread's read hold (a handler over `setsockopt`'s look-up),
/// with no writer queued, a look-up takes the read lock too (free for the
/// asking): a high descriptor's socket is found (review r20-xhaz2b 6a:
/// retried past another test's queued writer).
#[test]
fn a_look_up_over_the_threads_read_hold_reads_too() {
    let _serial = serial();
    prepare();
    let high = BITS as c_int + 73;
    let b = dummy();
    assert!(insert(high, b.clone()).unwrap().is_none());
    // A writer of another test's queued meanwhile makes the read refused
    // (std's lock takes no new reader then): a few tries, one must read.
    let found = within_a_minute("a look-up over its thread's read hold", move || {
        (0..20).any(|_| {
            let held = read_map().expect("not over a hold");
            let found = get(high).is_some_and(|s| Arc::ptr_eq(&s, &b));
            drop(held);
            found
        })
    });
    assert!(found);
    assert!(remove(high).unwrap().is_some());
}

/// The low descriptor of the fork-in-a-wait test (its handler's look-up).
const WAIT_FD: c_int = 60_101;
/// The handler's fork's child, in the parent (0: the handler did not run).
static WAIT_PID: AtomicI32 = AtomicI32::new(0);
/// In the handler: whether its thread's word counted one wait (the
/// signal was handled inside the wait, not over a hold).
static WAIT_OVER: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
/// In the child: whether the handler's look-up found the socket.
static WAIT_CHILD_FOUND: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
/// In the handler that changes the table: whether its insert and removal
/// were made.
static WAIT_CHANGED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether the calling thread's word counts exactly one wait.
fn one_wait() -> bool {
    (guard::map_held().get() / WAIT) % (HOLD / WAIT) == 1
}

/// A handler that forks (the preload's atfork handlers, called as the
/// library registers them) and, in the child, looks `WAIT_FD` up.
extern "C" fn fork_in_handler(_: c_int) {
    WAIT_OVER.store(one_wait(), Ordering::SeqCst);
    fork_prepare();
    // SAFETY: the child returns from the handler into the interrupted
    // wait, then changes the table and `_exit`s (the test's thread).
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        // A child left hanging by a failed run ends with the run.
        // SAFETY: a process attribute of the child's.
        unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) };
        fork_release_child();
        WAIT_CHILD_FOUND.store(get(WAIT_FD).is_some(), Ordering::SeqCst);
        return;
    }
    fork_release();
    WAIT_PID.store(pid, Ordering::SeqCst);
}

/// A handler that changes the table: inserts at a number and removes it.
extern "C" fn change_in_handler(_: c_int) {
    WAIT_OVER.store(one_wait(), Ordering::SeqCst);
    let high = BITS as c_int + 103;
    let changed = insert(high, dummy()).is_ok_and(|old| old.is_none())
        && remove(high).is_ok_and(|s| s.is_some());
    WAIT_CHANGED.store(changed, Ordering::SeqCst);
}

/// Runs `f` on a thread of its own while another holds the table's write
/// lock, with `handler` the handler of `SIGUSR2` (no other test uses it;
/// every test that sets it holds `serial`), raised in `f`'s first wait
/// for the lock. The holder lets the lock go at the next wait after the
/// signal's: the handler's own (its call's, which waits), or, a handler
/// whose call was refused, the interrupted one's again.
fn with_a_signal_in_a_wait<T: Send + 'static>(
    what: &str,
    handler: extern "C" fn(c_int),
    f: impl FnOnce() -> T + Send + 'static,
) -> T {
    let (held_tx, held_rx) = std::sync::mpsc::channel();
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    let holder = std::thread::spawn(move || {
        let h = write_map().expect("not over a hold");
        held_tx.send(()).unwrap();
        go_rx.recv().unwrap();
        drop(h);
    });
    held_rx.recv().unwrap();
    let r = within_a_minute(what, move || {
        // SAFETY: a handler of this test's, the old one restored below;
        // plain data otherwise.
        let old = unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = handler as *const () as usize;
            libc::sigemptyset(&mut sa.sa_mask);
            let mut old: libc::sigaction = std::mem::zeroed();
            assert_eq!(libc::sigaction(libc::SIGUSR2, &sa, &mut old), 0);
            old
        };
        hooks::BEFORE_WAIT.with(|b| {
            *b.borrow_mut() = Some(Box::new(move || {
                // The handler's wait (inside this one) lets the holder go.
                hooks::BEFORE_WAIT.with(|b| {
                    *b.borrow_mut() = Some(Box::new(move || go_tx.send(()).unwrap()));
                });
                // SAFETY: a signal to the calling thread, handled here.
                unsafe { libc::pthread_kill(libc::pthread_self(), libc::SIGUSR2) };
            }));
        });
        let r = f();
        hooks::BEFORE_WAIT.with(|b| b.borrow_mut().take());
        // SAFETY: restores the handler saved above.
        unsafe { libc::sigaction(libc::SIGUSR2, &old, null_mut()) };
        r
    });
    holder.join().unwrap();
    r
}

/// A signal raised while its thread waits for the table's lock (another
/// thread holds it) is handled inside the wait, where the thread holds
/// nothing: a handler that forks takes the lock there (waiting for the
/// holder) and the child gets it free; its resumed wait then ends in the
/// child too (review r20-xhaz3 item 1: `fork_prepare` over a wait took
/// nothing and the child got the lock held by a thread it does not have;
/// d935c18 blocked the signals for the wait, review r21-haz items 1, 2;
/// counted as a hold, the handler's `fork_prepare` takes nothing, the
/// holder is never let go and `within_a_minute` ends the run). Here the
/// child's handler finds the socket, its resumed change ends, and it
/// changes the table again and exits 0. The wait is for the write lock:
/// at the fork no other thread (another test's) can hold the lock too,
/// whose hold the child would wait for.
#[test]
fn a_fork_from_a_handler_raised_in_a_wait_leaves_the_child_a_usable_table() {
    let _serial = serial();
    prepare();
    let high = BITS as c_int + 101;
    let a = dummy();
    assert!(insert(WAIT_FD, a.clone()).unwrap().is_none());
    WAIT_PID.store(0, Ordering::SeqCst);
    WAIT_OVER.store(false, Ordering::SeqCst);
    let a2 = a.clone();
    let status = with_a_signal_in_a_wait(
        "a fork from a handler over a wait",
        fork_in_handler,
        move || {
            // SAFETY: reads the process id.
            let parent = unsafe { libc::getpid() };
            let inserted = insert(high, dummy()).is_ok_and(|old| old.is_none());
            // SAFETY: as above.
            if unsafe { libc::getpid() } != parent {
                let found = get(WAIT_FD).is_some_and(|s| Arc::ptr_eq(&s, &a2));
                let changed = inserted && remove(high).is_ok_and(|s| s.is_some());
                let ok = found && changed && WAIT_CHILD_FOUND.load(Ordering::SeqCst);
                // SAFETY: leaves the child at once (no test harness in it).
                unsafe { libc::_exit(if ok { 0 } else { 1 }) };
            }
            let pid = WAIT_PID.load(Ordering::SeqCst);
            let mut status = -1;
            if pid > 0 {
                // SAFETY: our child.
                assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
            }
            (inserted, pid, WAIT_OVER.load(Ordering::SeqCst), status)
        },
    );
    let (inserted, pid, over, status) = status;
    assert!(inserted, "the change after the wait");
    assert!(pid > 0, "the handler did not fork");
    assert!(over, "the handler ran outside the wait");
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "the child (status {status:#x})"
    );
    assert!(same(&remove(WAIT_FD).unwrap(), &a));
    assert!(remove(high).unwrap().is_some());
}

/// A handler raised inside a wait for the table's lock changes the table
/// (an insert and a removal, as its `close` or `dup2` would): it waits
/// for the lock as any thread's call, and then the interrupted wait ends
/// too (review r21-haz item 1: d935c18 blocked the signals for the wait,
/// so a handler that must run before the holder goes on — a collector's
/// stop-the-world acknowledgement — deadlocked the process; counted as a
/// hold, the handler's change is refused and the holder never let go:
/// `within_a_minute` ends the run).
#[test]
fn a_handler_raised_in_a_wait_changes_the_table() {
    let _serial = serial();
    WAIT_OVER.store(false, Ordering::SeqCst);
    WAIT_CHANGED.store(false, Ordering::SeqCst);
    let r = with_a_signal_in_a_wait(
        "a change from a handler over a wait",
        change_in_handler,
        || {
            let g = read_map().is_ok();
            (g, guard::map_held().get())
        },
    );
    assert_eq!(
        r,
        (true, 0),
        "(the interrupted look-up, its thread's word after)"
    );
    assert!(
        WAIT_OVER.load(Ordering::SeqCst),
        "the handler ran outside the wait"
    );
    assert!(WAIT_CHANGED.load(Ordering::SeqCst), "the handler's change");
}

/// A `fork_prepare` from a handler over the instructions before its
/// thread's try (the count raised, nothing held), with the lock another
/// thread's, takes the lock once that thread lets it go, within its
/// bound: the child gets the lock free (review r21-haz item 3: it took
/// nothing at once, and the child got the lock held by a thread it does
/// not have). The holder lets go at the first retry (staged; the handler
/// staged over `read_map`'s pre-try hook).
#[test]
fn a_fork_prepare_over_a_count_takes_the_lock_another_thread_lets_go() {
    let _serial = serial();
    let (held_tx, held_rx) = std::sync::mpsc::channel();
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    let (gone_tx, gone_rx) = std::sync::mpsc::channel::<()>();
    let holder = std::thread::spawn(move || {
        let h = write_map().expect("not over a hold");
        held_tx.send(()).unwrap();
        go_rx.recv().unwrap();
        drop(h);
        gone_tx.send(()).unwrap();
    });
    held_rx.recv().unwrap();
    let go = go_tx.clone();
    let took = within_a_minute("a fork_prepare over a count", move || {
        let go_tx = go_tx;
        let took = std::rc::Rc::new(std::cell::Cell::new(false));
        let t = took.clone();
        hooks::BEFORE_LOCK.with(|b| {
            *b.borrow_mut() = Some(Box::new(move || {
                hooks::BEFORE_FORK_RETRY.with(|b| {
                    *b.borrow_mut() = Some(Box::new(move || {
                        go.send(()).unwrap();
                        gone_rx.recv().unwrap();
                    }));
                });
                fork_prepare();
                t.set(FORK_GUARD.with(|f| f.borrow().is_some()));
                fork_release();
                hooks::BEFORE_FORK_RETRY.with(|b| b.borrow_mut().take());
                // Taken nothing: the holder is let go now (the look-up's
                // own try, after the hook, waits for it).
                let _ = go_tx.send(());
            }));
        });
        drop(read_map());
        took.get()
    });
    holder.join().unwrap();
    assert!(took, "fork_prepare took nothing");
}

/// A socket whose kernel descriptor is `.0` (the one a demotion puts at
/// the program's number).
pub(crate) struct Kernel(pub(crate) c_int);

inert_socket!(Kernel, |s: &Kernel| s.0);

/// The inode of the file `fd` names (0: not open).
pub(crate) fn inode(fd: c_int) -> u64 {
    // SAFETY: fstat into a local.
    unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        if libc::fstat(fd, &mut st) < 0 {
            return 0;
        }
        st.st_ino
    }
}

/// A forked child's removals left to its hold's end (`forget_all`) put
/// each entry's kernel descriptor at its number first, as `demote_all`
/// does: a number the handler's listing missed (at or above `BITS`, or
/// no hazard slot free) was left naming the doorbell's end, unmanaged
/// (review r21-haz item 5). Staged: the child runs the hold's end's work
/// with no listing before it.
#[test]
fn the_childs_forgetting_at_the_holds_end_demotes() {
    let _serial = serial();
    let mut p = [0; 4];
    // SAFETY: new pipes of this test's.
    unsafe {
        assert_eq!(libc::pipe2(p.as_mut_ptr(), libc::O_CLOEXEC), 0);
        assert_eq!(libc::pipe2(p[2..].as_mut_ptr(), libc::O_CLOEXEC), 0);
    }
    let (fd, k) = (p[0], p[2]);
    let s: Arc<dyn Socket> = Arc::new(Kernel(k));
    assert!(insert(fd, s.clone()).unwrap().is_none());
    let want = inode(k);
    fork_prepare();
    // SAFETY: the child forgets, checks, `_exit`s.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        // SAFETY: a process attribute of the child's.
        unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) };
        fork_release_child();
        super::super::held::forget_all();
        let ok = inode(fd) == want && get(fd).is_none();
        // SAFETY: leaves the child at once (no test harness in it).
        unsafe { libc::_exit(if ok { 0 } else { 1 }) };
    }
    fork_release();
    assert!(pid > 0, "fork");
    let mut status = 0;
    // SAFETY: our child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "the child's number not demoted (status {status:#x})"
    );
    assert!(same(&remove(fd).unwrap(), &s));
    for d in p {
        // SAFETY: the test's descriptors.
        unsafe { libc::close(d) };
    }
}

/// A fork from a handler over a wait's registration, outside its sleep
/// (no wait mark), leaves the child a waiter count that the wait's end
/// brings back to 0 (review r21-c item 2: counted from the wait marks,
/// the child's count was 0, the wait's end wrapped it, and the next
/// waiter's registration wrapped it back to 0: its sleeps were never
/// woken). Staged: the fork is made from the wait's first try.
#[test]
fn a_fork_over_a_waits_registration_leaves_the_child_its_count() {
    let _serial = serial();
    let status = within_a_minute("a fork over a wait's registration", || {
        let parent = std::process::id();
        let mut child = 0;
        let waited = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            wait(|| {
                if child != 0 || std::process::id() != parent {
                    return Some(());
                }
                // A handler's fork here (the lock is free: `fork_prepare`
                // takes it, the parent's release wakes this wait).
                fork_prepare();
                // SAFETY: the child ends its wait, reads a static, `_exit`s.
                child = unsafe { libc::fork() };
                if child == 0 {
                    // SAFETY: a process attribute of the child's (its
                    // parent is this thread, which waits for it below).
                    unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) };
                    fork_release_child();
                    return Some(());
                }
                fork_release();
                None
            });
        }));
        if std::process::id() != parent {
            let ok = waited.is_ok() && wait::WAITERS.load(Ordering::SeqCst) == 0;
            // SAFETY: leaves the child at once (no test harness in it).
            unsafe { libc::_exit(if ok { 0 } else { 1 }) };
        }
        waited.unwrap();
        assert!(child > 0, "fork");
        let mut status = 0;
        // SAFETY: our child.
        assert_eq!(unsafe { libc::waitpid(child, &mut status, 0) }, child);
        status
    });
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "the child's waiter count is not 0 after its wait (status {status:#x})"
    );
}

/// A close over the hold made by a nested handler (another signal, over
/// a handler's own close left to the hold's end, inside its update of
/// the list) is made too: each close reserves its slot in one
/// instruction before its look-up and syscalls (review r21-c item 5: the
/// outer close read the list's length before them and stored it after,
/// so it overwrote the nested close's entry; that close, which returned
/// 0, was never made, its number stayed managed and its kept reference
/// leaked). Staged: the nested close runs between the outer's
/// reservation and its fill.
#[test]
fn a_nested_handlers_close_inside_a_closes_update_is_made_too() {
    let _serial = serial();
    prepare();
    let ((fa, a), (fb, b)) = two_managed();
    let r = within_a_minute("a nested close inside a close's update", move || {
        let held = write_map().expect("not over a hold");
        let closes = close_with_a_nested_close(fa, fb);
        drop(held);
        closes
    });
    assert_eq!(r, (Ok(true), Some(Ok(true))), "the closes (outer, nested)");
    // The references first: `made` removes a failure's leftovers.
    let refs = (Arc::strong_count(&a), Arc::strong_count(&b));
    assert_eq!(
        made(&[fa, fb]),
        [true, true],
        "still managed after the hold (outer, nested)"
    );
    assert_eq!(
        refs,
        (1, 1),
        "references kept after the hold (outer, nested)"
    );
}

/// A managed descriptor of a test's and its object.
type Managed = (c_int, Arc<dyn Socket>);

/// Two managed eventfds of a test's, in the table.
fn two_managed() -> (Managed, Managed) {
    // SAFETY: new descriptors of the test's, closed by the deferred
    // closes or by `leftovers`.
    let (fa, fb) = unsafe {
        (
            libc::eventfd(0, libc::EFD_CLOEXEC),
            libc::eventfd(0, libc::EFD_CLOEXEC),
        )
    };
    assert!(fa >= 0 && fb >= 0);
    let (a, b) = (dummy(), dummy());
    assert!(insert(fa, a.clone()).unwrap().is_none());
    assert!(insert(fb, b.clone()).unwrap().is_none());
    ((fa, a), (fb, b))
}

/// `defer_close(outer)` (over a hold), with a nested handler's
/// `defer_close(inner)` staged inside its update of the list, between its
/// reservation and its fill (`hooks::IN_DEFER_CLOSE`): (outer, nested).
fn close_with_a_nested_close(
    outer: c_int,
    inner: c_int,
) -> (Result<bool, c_int>, Option<Result<bool, c_int>>) {
    let (inner_tx, inner_rx) = std::sync::mpsc::channel();
    hooks::IN_DEFER_CLOSE.with(|h| {
        *h.borrow_mut() = Some(Box::new(move || inner_tx.send(defer_close(inner)).unwrap()));
    });
    let outer = defer_close(outer);
    hooks::IN_DEFER_CLOSE.with(|h| h.borrow_mut().take());
    (outer, inner_rx.try_recv().ok())
}

/// After the hold: whether each of `fds` was closed (no longer managed);
/// a failure's leftovers closed.
fn made(fds: &[c_int]) -> Vec<bool> {
    fds.iter()
        .map(|&fd| {
            let gone = get(fd).is_none();
            if !gone {
                let _ = remove(fd);
                // SAFETY: the test's descriptor, left open by the failure.
                unsafe { libc::close(fd) };
            }
            gone
        })
        .collect()
}

/// A close over a hold that is refused or finds nothing managed gives its
/// reserved slot back: nine of them in one hold, then a managed close is
/// still taken (review r22-a item 10: without the give-back the list
/// silted up, and past 8 every close over a hold was refused with
/// `EDEADLK`, its descriptor leaked for good).
#[test]
fn closes_over_a_hold_that_are_not_left_give_their_slots_back() {
    let _serial = serial();
    prepare();
    let ((fa, a), (fb, b)) = two_managed();
    let r = within_a_minute("closes over a hold given back", move || {
        let held = write_map().expect("not over a hold");
        let first = defer_close(fa);
        // A number no test opens (nothing managed there), and `fa` again.
        let unmanaged: Vec<_> = (0..5).map(|_| defer_close(60_211)).collect();
        let again: Vec<_> = (0..4).map(|_| defer_close(fa)).collect();
        let last = defer_close(fb);
        let len = super::super::held::left_len();
        drop(held);
        (
            first,
            unmanaged,
            again,
            last,
            len,
            super::super::held::left_len(),
        )
    });
    let (first, unmanaged, again, last, len, after) = r;
    assert_eq!(first, Ok(true));
    assert!(unmanaged.iter().all(|r| *r == Ok(false)), "{unmanaged:?}");
    assert!(again.iter().all(|r| *r == Err(libc::EBADF)), "{again:?}");
    assert_eq!(last, Ok(true), "the managed close after nine given back");
    assert_eq!(
        (len, after),
        (2, 0),
        "the list's length over and after the hold"
    );
    assert_eq!(made(&[fa, fb]), [true, true], "closes made");
    assert_eq!((Arc::strong_count(&a), Arc::strong_count(&b)), (1, 1));
}

/// A nested handler's close inside a close that is then refused: the
/// nested close is made, the refused one's slot (not the last) is left
/// empty and skipped, and the list is empty after the hold.
#[test]
fn a_nested_close_inside_a_refused_close_is_made() {
    let _serial = serial();
    prepare();
    let ((fa, a), (fb, b)) = two_managed();
    let r = within_a_minute("a nested close inside a refused close", move || {
        let held = write_map().expect("not over a hold");
        let first = defer_close(fa);
        let (outer, inner) = close_with_a_nested_close(fa, fb);
        let len = super::super::held::left_len();
        drop(held);
        (first, outer, inner, len, super::super::held::left_len())
    });
    assert_eq!(
        r,
        (Ok(true), Err(libc::EBADF), Some(Ok(true)), 3, 0),
        "(first, outer, nested, length over and after the hold)"
    );
    assert_eq!(made(&[fa, fb]), [true, true], "closes made");
    assert_eq!((Arc::strong_count(&a), Arc::strong_count(&b)), (1, 1));
}
