//! Look-ups and the map's lock: a look-up whose end runs over its own
//! thread's hold of the lock (a signal or atfork handler) leaves the
//! reclaim to the hold's end; freed entries are dropped under the guard;
//! the reclaim keeps the call's errno (reviews r18-xhaz items 2, 4, 7 and
//! r19).

use std::sync::atomic::AtomicUsize;
use std::sync::mpsc;

use super::super::hazard;
use super::look_ups::serial;
use super::*;
use crate::shim::guard;

/// Waits (bounded) until no scan's freed entries wait for their drop: a
/// scan by another test's thread may take an entry and drop it only after
/// letting the lock go.
pub(super) fn settled() {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while hooks::IN_DROP.load(Ordering::SeqCst) != 0 && std::time::Instant::now() < deadline {
        std::thread::yield_now();
    }
}

/// Runs `f` on a thread of its own and returns its value; a run that has
/// not ended in 60 s (a deadlock on the map's lock, which would hang every
/// later test of the table) ends the test process with `what`.
pub(crate) fn within_a_minute<T: Send + 'static>(
    what: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> T {
    let (tx, rx) = mpsc::channel();
    let t = std::thread::spawn(move || tx.send(f()).unwrap());
    match rx.recv_timeout(std::time::Duration::from_secs(60)) {
        Ok(v) => {
            t.join().unwrap();
            v
        }
        Err(_) => {
            let msg = format!("deadlock: {what}\n");
            // SAFETY: a write of a live buffer to stderr (not captured by
            // the harness, which would never print it).
            unsafe { libc::write(2, msg.as_ptr().cast(), msg.len()) };
            std::process::abort();
        }
    }
}

/// A socket that records, when dropped, whether the guard was set and
/// sets errno (as a drop's `close` may).
struct Recorder;

/// 0: not dropped; 1: dropped outside the guard; 2: under it.
static RECORDED: AtomicUsize = AtomicUsize::new(0);

impl Drop for Recorder {
    fn drop(&mut self) {
        RECORDED.store(1 + usize::from(guard::busy()), Ordering::SeqCst);
        crate::shim::sys::set_errno(libc::EBADF);
    }
}

inert_socket!(Recorder);

/// A look-up that ends over a hold of the map's lock by its own thread (a
/// signal handler that interrupted `close` or `dup2`, another library's
/// atfork handler inside `fork_prepare`'s hold) with its slot nudged
/// leaves the reclaim — taking the lock again would deadlock the thread on
/// itself — and the hold's end runs it: the entry is dropped then, under
/// the guard (review r18-xhaz item 2).
#[test]
fn an_end_over_a_held_map_lock_reclaims_when_the_hold_ends() {
    let _serial = serial();
    let fd = 60_043;
    RECORDED.store(0, Ordering::SeqCst);
    assert!(insert(fd, Arc::new(Recorder)).unwrap().is_none());
    let (under, deferred, after) =
        within_a_minute("an end took the map's lock its thread holds", move || {
            let h = hazard::mine().expect("a slot");
            // Published as a call on `fd`; another thread removes it.
            let p = hazard::protect(h, &LOW[fd as usize]);
            assert!(!p.is_null());
            std::thread::spawn(move || drop(remove(fd))).join().unwrap();
            assert!(hazard::tests::state(h).1, "the removal nudged the slot");
            let held = read_map();
            hazard::end(h);
            // Read under the hold: no other thread can scan meanwhile.
            let under = RECORDED.load(Ordering::SeqCst);
            let deferred = guard::map_held().get();
            let before = hooks::RECLAIMS.with(|r| r.get());
            drop(held);
            let reclaims = hooks::RECLAIMS.with(|r| r.get()) - before;
            settled();
            (under, deferred, (reclaims, RECORDED.load(Ordering::SeqCst)))
        });
    assert_eq!(under, 0, "the entry was freed under the held lock");
    assert_eq!(
        deferred,
        RECLAIM_DEFERRED | HOLD,
        "no reclaim left for the hold's end"
    );
    // The thread's own reclaim, counted: another test's change of the
    // table (not all hold `serial`) scans and frees the entry too.
    assert_eq!(
        after,
        (1, 2),
        "(the hold's end's reclaims, freed under the guard)"
    );
}

/// The same over a hold that is counted but not yet taken: a handler
/// over the instructions between the count's raise and the lock's try
/// (of `setsockopt`'s look-up) ends its look-up there. The reclaim runs
/// when that hold ends, not at some later call (review r19 item 1), by
/// this thread (counted: another test's change of the table, not all
/// holding `serial`, scans and frees the entry too; review r21-haz item
/// 8: named for a wait, which it never staged, and it passed with the
/// deferred reclaim removed when the whole suite ran).
#[test]
fn an_end_before_the_map_locks_try_reclaims_when_the_hold_ends() {
    let _serial = serial();
    let fd = 60_051;
    RECORDED.store(0, Ordering::SeqCst);
    assert!(insert(fd, Arc::new(Recorder)).unwrap().is_none());
    let after = within_a_minute("an end took the map's lock", move || {
        let h = hazard::mine().expect("a slot");
        let p = hazard::protect(h, &LOW[fd as usize]);
        assert!(!p.is_null());
        std::thread::spawn(move || drop(remove(fd))).join().unwrap();
        // Staged: the count is raised as `read_map` begins to try; the
        // "handler" ends its look-up there.
        hooks::BEFORE_LOCK.with(|b| *b.borrow_mut() = Some(Box::new(move || hazard::end(h))));
        let before = hooks::RECLAIMS.with(|r| r.get());
        drop(read_map());
        let reclaims = hooks::RECLAIMS.with(|r| r.get()) - before;
        settled();
        (reclaims, RECORDED.load(Ordering::SeqCst))
    });
    assert_eq!(
        after,
        (1, 2),
        "(the hold's end's reclaims, freed under the guard)"
    );
}

/// Entries a change of the table frees are dropped under the guard, by
/// `insert` and by `remove` alike: an entry kept for a call whose slot is
/// clear now (its end's reclaim lost the race to this scan) is the
/// socket's last reference (review r18-xhaz item 7).
#[test]
fn changes_drop_freed_entries_under_the_guard() {
    let _serial = serial();
    let (fd, other) = (60_053, 60_055);
    for by_insert in [true, false] {
        RECORDED.store(0, Ordering::SeqCst);
        assert!(insert(fd, Arc::new(Recorder)).unwrap().is_none());
        if !by_insert {
            assert!(insert(other, dummy()).unwrap().is_none());
        }
        let recorded = std::thread::spawn(move || {
            let h = hazard::mine().expect("a slot");
            assert!(!hazard::protect(h, &LOW[fd as usize]).is_null());
            std::thread::spawn(move || drop(remove(fd))).join().unwrap();
            hazard::tests::clear(h);
            assert!(!guard::busy());
            if by_insert {
                assert!(insert(other, dummy()).unwrap().is_none());
            }
            drop(remove(other));
            settled();
            RECORDED.load(Ordering::SeqCst)
        })
        .join()
        .unwrap();
        assert_eq!(
            recorded, 2,
            "by_insert {by_insert}: not dropped under the guard"
        );
    }
}

/// `fork_prepare`'s hold is counted (another library's atfork handler
/// runs inside it), and the count is back to 0 after the parent's
/// release and after the child's.
#[test]
fn the_fork_hold_is_counted() {
    let _serial = serial();
    assert_eq!(guard::map_held().get(), 0);
    fork_prepare();
    let during = guard::map_held().get();
    // SAFETY: the child reads its thread-local count and `_exit`s.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        fork_release_child();
        let ok = guard::map_held().get() == 0;
        // SAFETY: leaves the child at once (no test harness in it).
        unsafe { libc::_exit(if ok { 0 } else { 1 }) };
    }
    fork_release();
    assert_eq!(during, HOLD, "fork_prepare's hold is not counted");
    assert_eq!(guard::map_held().get(), 0);
    assert!(pid > 0, "fork");
    let mut status = 0;
    // SAFETY: our child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "the child's count"
    );
}

/// A removal whose scan finds a slot naming the entry, then finds it
/// cleared on its second read (the call ended between the two, before the
/// nudge), frees the entry itself: it is dropped when `remove` returns
/// (staged between the first read and the nudge; a `named` without its
/// second read keeps it).
#[test]
fn a_call_that_ends_between_the_scans_two_reads_leaves_the_entry_to_the_scan() {
    let _serial = serial();
    let fd = 60_057;
    RECORDED.store(0, Ordering::SeqCst);
    assert!(insert(fd, Arc::new(Recorder)).unwrap().is_none());
    let (h_tx, h_rx) = mpsc::channel();
    let (go, go_rx) = mpsc::channel::<()>();
    let t = std::thread::spawn(move || {
        let h = hazard::mine().expect("a slot");
        assert!(!hazard::protect(h, &LOW[fd as usize]).is_null());
        h_tx.send(h).unwrap();
        go_rx.recv().unwrap();
        // The slot is clear (ended by the staged hook; the scan's nudge,
        // raised after, is stale and costs one reclaim).
        hazard::tests::state(h).0
    });
    let h = h_rx.recv().unwrap();
    hazard::tests::IN_NAMED.with(|b| *b.borrow_mut() = Some(Box::new(move || hazard::end(h))));
    drop(remove(fd));
    settled();
    let recorded = RECORDED.load(Ordering::SeqCst);
    go.send(()).unwrap();
    assert_eq!(t.join().unwrap(), 0, "the staged end did not run");
    // Dropped by now (by the scan, or by `remove`'s returned reference).
    assert_ne!(recorded, 0, "kept although the call had ended");
}

/// The reclaim at a call's end keeps the call's errno: a socket's drop
/// there (its `close`) must not change what the call reported.
#[test]
fn a_reclaim_keeps_the_calls_errno() {
    let _serial = serial();
    let fd = 60_047;
    RECORDED.store(0, Ordering::SeqCst);
    assert!(insert(fd, Arc::new(Recorder)).unwrap().is_none());
    with_marked(
        fd,
        || panic!("managed"),
        |_| {
            drop(remove(fd));
            crate::shim::sys::set_errno(libc::EAGAIN);
        },
    );
    let errno = crate::shim::sys::errno();
    settled();
    assert_eq!(RECORDED.load(Ordering::SeqCst), 2, "dropped at the end");
    assert_eq!(errno, libc::EAGAIN);
}

/// A thread whose calls are all on descriptors at or above `BITS` (no
/// index in the table) claims no hazard slot (review r18-xhaz 4b).
#[test]
fn calls_on_high_descriptors_claim_no_slot() {
    let _serial = serial();
    let fd = BITS as c_int + 41;
    assert!(insert(fd, dummy()).unwrap().is_none());
    let (found, slot) = std::thread::spawn(move || {
        let found = with_marked(fd, || false, |_| true);
        (found, guard::slot().get())
    })
    .join()
    .unwrap();
    assert!(found);
    assert_eq!(slot, 0, "a slot was claimed");
    drop(remove(fd));
}

/// A forked child forgets what the parent retired: an entry kept for a
/// thread that did not follow the fork is never dropped in the child, not
/// even by the child's own scans once that thread's slot is given back
/// (its drop may be the socket's last reference, whose state that thread
/// may have held locked); the parent drops it when the call ends.
#[test]
fn a_forked_child_never_drops_what_the_parent_retired() {
    let _serial = serial();
    let (fd, other) = (60_081, 60_083);
    RECORDED.store(0, Ordering::SeqCst);
    assert!(insert(fd, Arc::new(Recorder)).unwrap().is_none());
    let (ready_tx, ready) = mpsc::channel();
    let (go, go_rx) = mpsc::channel::<()>();
    let t = std::thread::spawn(move || {
        let h = hazard::mine().expect("a slot");
        assert!(!hazard::protect(h, &LOW[fd as usize]).is_null());
        ready_tx.send(()).unwrap();
        go_rx.recv().unwrap();
        hazard::end(h);
    });
    ready.recv().unwrap();
    drop(remove(fd).unwrap());
    assert_eq!(RECORDED.load(Ordering::SeqCst), 0, "kept for the call");
    fork_prepare();
    // SAFETY: the child changes the table once, reads a static, `_exit`s.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        fork_release_child();
        // A scan of the child's (the lost thread's slot is clear now).
        let changed = insert(other, dummy()).is_ok() && remove(other).is_ok();
        let kept = RECORDED.load(Ordering::SeqCst) == 0;
        // SAFETY: leaves the child at once (no test harness in it).
        unsafe { libc::_exit(if changed && kept { 0 } else { 1 }) };
    }
    fork_release();
    go.send(()).unwrap();
    t.join().unwrap();
    settled();
    assert!(pid > 0, "fork");
    let mut status = 0;
    // SAFETY: our child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "the child dropped the parent's retired entry"
    );
    assert_eq!(
        RECORDED.load(Ordering::SeqCst),
        2,
        "not dropped in the parent"
    );
}

/// A look-up waiting for the lock behind another thread's write hold is
/// woken when the hold ends (review r21-b item 8: the wait had no
/// wake-up and slept the timer's slack per round). In the tests the
/// sleep has no backstop: a hold's end that wakes no one hangs the run
/// (`within_a_minute` ends it). Two stagings (review r21-c item 3): the
/// holder lets go right after the look-up's failed try (fails with `seen`
/// read after the try: the sleep then waits for a wake-up that came), and
/// once the look-up is asleep in the futex (fails without the wake-up's
/// syscall). The hold's end makes that syscall only with the look-up
/// asleep (review r21-c item 1: a waiter registered but trying, or a
/// registration left by a `siglongjmp`, made every end a syscall). The
/// sleep first: its wake-up clears any sleep bit an earlier test left.
#[test]
fn a_wait_for_the_lock_is_woken_when_the_hold_ends() {
    let _serial = serial();
    assert_eq!(woken_at_the_hold_end(true), 1, "asleep: the syscall");
    assert_eq!(woken_at_the_hold_end(false), 0, "awake: no syscall");
}

/// [`a_wait_for_the_lock_is_woken_when_the_hold_ends`]'s staging: the
/// hold ends once the waiter is `asleep`, or else right after its try.
/// Returns the wake-up syscalls the hold's end made.
fn woken_at_the_hold_end(asleep: bool) -> usize {
    let (held_tx, held_rx) = mpsc::channel();
    // The waiter's thread, if the holder waits for its sleep.
    let (go_tx, go_rx) = mpsc::channel::<Option<i32>>();
    let (gone_tx, gone_rx) = mpsc::channel::<()>();
    let holder = std::thread::spawn(move || {
        let h = write_map().expect("not over a hold");
        held_tx.send(()).unwrap();
        if let Some(tid) = go_rx.recv().unwrap() {
            asleep_on_the_wake_word(tid);
        }
        let before = hooks::WOKE.with(|w| w.get());
        drop(h);
        // The waiter no longer listens if it went to sleep.
        let _ = gone_tx.send(());
        hooks::WOKE.with(|w| w.get()) - before
    });
    held_rx.recv().unwrap();
    let took = within_a_minute("a wait not woken at the hold's end", move || {
        hooks::AFTER_TRY.with(|b| {
            *b.borrow_mut() = Some(Box::new(move || {
                if asleep {
                    // SAFETY: gettid has no arguments and cannot fail.
                    let tid = unsafe { libc::syscall(libc::SYS_gettid) } as i32;
                    go_tx.send(Some(tid)).unwrap();
                } else {
                    go_tx.send(None).unwrap();
                    // The hold has ended (and woken) before this sleeps.
                    gone_rx.recv().unwrap();
                }
            }));
        });
        read_map().is_ok()
    });
    let woke = holder.join().unwrap();
    assert!(took);
    woke
}

/// Returns once thread `tid` is in the futex wait on the table's wake-up
/// word (its `/proc` syscall line: the call's number and first argument).
fn asleep_on_the_wake_word(tid: i32) {
    let want = format!("{} {:#x} ", libc::SYS_futex, wait::releases_addr());
    let path = format!("/proc/self/task/{tid}/syscall");
    // Bounded far above any wait for a thread to run.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while std::time::Instant::now() < deadline {
        if std::fs::read_to_string(&path).is_ok_and(|s| s.starts_with(&want)) {
            return;
        }
        std::thread::yield_now();
    }
    panic!("the waiter never slept on the wake-up word");
}

/// The lock's waiter count, read at every hold's end, and the waiters'
/// futex word are each alone on a cache line and the line paired with it
/// (Intel's L2 prefetcher fetches lines in pairs; r22-a item 13): no other
/// static's write
/// (the hazard table's `OWNED` shared `WAITERS`' line) costs the readers
/// a coherence miss (review r21-c item 7).
#[test]
fn the_waiter_count_and_the_futex_word_have_cache_lines_of_their_own() {
    for (what, at, size) in [
        (
            "WAITERS",
            wait::WAITERS.as_ptr() as usize,
            size_of_val(&wait::WAITERS),
        ),
        (
            "RELEASES",
            wait::releases_addr(),
            size_of_val(&wait::RELEASES),
        ),
    ] {
        assert_eq!(
            (at % 128, size),
            (0, 128),
            "{what}: not alone on its line pair"
        );
    }
}
