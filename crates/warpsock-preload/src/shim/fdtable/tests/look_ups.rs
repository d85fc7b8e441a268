//! The data calls' look-up: an entry outlives its removal exactly until
//! the call that uses it returns (review r17 of `04ca29a`).

use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU8, AtomicUsize};
use std::sync::mpsc;

use super::super::hazard;
use super::*;
use crate::shim::guard;

/// The tests of this module change the one process-wide table and read
/// every thread's slot: they run one at a time. Run beside each other, one
/// test's reader may publish a stale pointer (an entry another test freed,
/// whose address this test's new entry reuses) for the moment before its
/// re-read: a scan then keeps this test's entry until that reader's call
/// ends, and the "dropped when the call returns" checks see it a moment
/// late (seen once in CI, session 18).
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

pub(crate) fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn count(a: &Arc<dyn Socket>) -> usize {
    Arc::strong_count(a)
}

/// A data call's look-up (`with_marked`) reaches the object without a
/// reference of its own, and a removal inside the call (the last residue
/// byte's `recv` demoting its own descriptor) keeps the table's until the
/// call is over — and not longer: dropped as the call returns, with no
/// other change of the table after it.
#[test]
fn a_socket_removed_inside_its_own_call_is_dropped_when_the_call_returns() {
    let _serial = serial();
    let fd = 60_021;
    let a = dummy();
    assert!(insert(fd, a.clone()).unwrap().is_none());
    assert_eq!(count(&a), 2, "the test's and the table's");
    let seen = with_marked(
        fd,
        || None,
        |s| {
            assert_eq!(count(&a), 2, "a reference taken for the call");
            drop(remove(fd));
            assert_eq!(count(&a), 2, "dropped under the call");
            Some(Arc::ptr_eq(s, &a))
        },
    );
    assert_eq!(seen, Some(true));
    assert_eq!(count(&a), 1, "kept after the call returned");
}

/// Thread A is inside a call on the descriptor, thread B removes it (a
/// `close` while A is blocked in `recv`): the socket stays while A is
/// inside, and is dropped when A's call returns (its kernel descriptors
/// closed then, not at some unrelated later close).
#[test]
fn a_socket_another_thread_removes_is_dropped_when_the_call_returns() {
    let _serial = serial();
    let fd = 60_023;
    let a = dummy();
    assert!(insert(fd, a.clone()).unwrap().is_none());
    let weak = Arc::downgrade(&a);
    let (inside_tx, inside) = mpsc::channel();
    let (go, go_rx) = mpsc::channel::<()>();
    let t = std::thread::spawn(move || {
        let found = with_marked(
            fd,
            || false,
            |_| {
                inside_tx.send(()).unwrap();
                go_rx.recv().unwrap();
                true
            },
        );
        (found, weak.strong_count())
    });
    inside.recv().unwrap();
    drop(remove(fd));
    assert_eq!(count(&a), 2, "dropped while a call is inside");
    go.send(()).unwrap();
    assert_eq!(t.join().unwrap(), (true, 1), "kept after the call returned");
    assert_eq!(count(&a), 1);
}

/// A removal between a look-up's read of the table and its publication
/// (staged): nothing named the entry when it was retired, so it is freed
/// at once, and the look-up, reading the table again after publishing,
/// finds it gone and answers none.
#[test]
fn a_removal_before_the_publication_is_seen() {
    let _serial = serial();
    let fd = 60_031;
    let a = dummy();
    assert!(insert(fd, a.clone()).unwrap().is_none());
    hazard::tests::BETWEEN.with(|b| {
        *b.borrow_mut() = Some(Box::new(move || drop(remove(fd))));
    });
    assert_eq!(with_marked(fd, || "none", |_| "some"), "none");
    assert_eq!(count(&a), 1, "kept though nothing named it");
}

/// A replacement between a look-up's publication and its second read of
/// the table (staged): the writer finds the slot naming the old entry and
/// keeps it; the look-up, finding the new entry there, ends its
/// protection of the old one before it publishes the new one, so the old
/// socket is dropped then, not when the call on the new one ends (review
/// r18 item 1).
#[test]
fn a_replacement_after_the_publication_drops_the_old_entry_at_once() {
    let _serial = serial();
    let fd = 60_041;
    let (a, b) = (dummy(), dummy());
    let old = Arc::downgrade(&a);
    assert!(insert(fd, a).unwrap().is_none());
    let b2 = b.clone();
    hazard::tests::AFTER_PUBLISH.with(|h| {
        *h.borrow_mut() = Some(Box::new(move || drop(insert(fd, b2))));
    });
    let seen = with_marked(
        fd,
        || None,
        |s| Some((Arc::ptr_eq(s, &b), old.strong_count())),
    );
    assert_eq!(
        seen,
        Some((true, 0)),
        "the old entry kept under the new call"
    );
    drop(remove(fd));
}

/// A look-up inside another on the same thread (a signal handler that
/// interrupted a call) leaves the outer call's slot alone: it takes the
/// locked look-up, with a reference of its own, and the outer entry stays
/// protected after it, until the outer call returns.
#[test]
fn a_nested_look_up_leaves_the_outer_protection() {
    let _serial = serial();
    let fd = 60_033;
    let a = dummy();
    assert!(insert(fd, a.clone()).unwrap().is_none());
    with_marked(
        fd,
        || panic!("managed"),
        |_| {
            let inner = with_marked(fd, || 0, |_| count(&a));
            assert_eq!(inner, 3, "the nested look-up took no reference");
            drop(remove(fd));
            assert_eq!(count(&a), 2, "the outer entry was dropped");
        },
    );
    assert_eq!(count(&a), 1, "kept after the outer call returned");
}

/// A signal handler that interrupts a thread's first claim of a slot
/// (staged after the claim's registration, before the slot is the
/// thread's) takes the locked look-up: it claims no second slot (one
/// would stay owned for good), and the thread has its slot after.
#[test]
fn a_look_up_inside_the_first_claim_takes_the_locked_path() {
    let _serial = serial();
    let fd = 60_039;
    let a = dummy();
    assert!(insert(fd, a.clone()).unwrap().is_none());
    let a2 = a.clone();
    let t = std::thread::spawn(move || {
        let inner = std::rc::Rc::new(std::cell::Cell::new(None));
        let seen = inner.clone();
        hazard::tests::DURING_CLAIM.with(|b| {
            *b.borrow_mut() = Some(Box::new(move || {
                let n = with_marked(fd, || 0, |_| count(&a2));
                seen.set(Some((n, guard::slot().get())));
            }));
        });
        let outer = with_marked(fd, || false, |_| true);
        let first = hazard::HAZARDS.as_ptr() as usize;
        let slots = first..first + size_of_val(&hazard::HAZARDS);
        (outer, inner.get(), slots.contains(&guard::slot().get()))
    });
    let (outer, inner, slotted) = t.join().unwrap();
    assert!(outer && slotted, "the thread has its slot");
    let (n, during) = inner.expect("the staged handler ran");
    assert_eq!(n, 4, "the nested look-up's reference (locked path)");
    assert_eq!(during, 1, "the handler claimed a slot of its own");
    drop(remove(fd));
}

/// A thread's slot is given back when it exits: more threads than slots,
/// one after the other, each takes the lock-free look-up.
#[test]
fn exiting_threads_give_their_slots_back() {
    let _serial = serial();
    let fd = 60_035;
    assert!(insert(fd, dummy()).unwrap().is_none());
    for n in 0..hazard::SLOTS + 8 {
        let fast = std::thread::spawn(move || {
            let found = with_marked(fd, || false, |_| true);
            let slot = guard::slot().get();
            let first = hazard::HAZARDS.as_ptr() as usize;
            let slots = first..first + size_of_val(&hazard::HAZARDS);
            found && slots.contains(&slot)
        });
        assert!(fast.join().unwrap(), "thread {n} had no slot");
    }
    drop(remove(fd));
}

/// Each slot has its own 128 bytes: threads' slots never share a cache
/// line (nor the adjacent line the prefetcher pairs with it).
#[test]
fn slots_do_not_share_cache_lines() {
    let _serial = serial();
    assert_eq!(align_of::<hazard::Slot>(), 128);
    assert_eq!(size_of::<hazard::Slot>(), 128);
}

/// A forked child forgets what the parent retired: `Retired::forget`
/// drops no entry (the socket's reference stays), even one no slot names.
#[test]
fn forgotten_entries_are_not_dropped() {
    let _serial = serial();
    let a = dummy();
    let mut r = hazard::Retired::new();
    let p = hazard::Node::new(a.clone());
    let h = hazard::mine().expect("a slot");
    let at = AtomicPtr::new(p);
    assert_eq!(hazard::protect(h, &at), p);
    assert!(r.retire(p).is_empty(), "named by this thread's slot");
    hazard::end(h);
    r.forget();
    assert!(r.scan().is_empty(), "a scan after forget freed the entry");
    assert_eq!(count(&a), 2, "a forgotten entry was dropped");
}

/// A forked child gives back the slots of the threads that did not follow
/// it, cleared (one may name an address freed in the parent, which the
/// child may reuse), and keeps its own thread's (review r18 item 3).
#[test]
fn a_forked_child_gives_back_the_lost_threads_slots() {
    let _serial = serial();
    let own = hazard::mine().expect("a slot");
    let (ready_tx, ready) = mpsc::channel();
    let (go, go_rx) = mpsc::channel::<()>();
    let t = std::thread::spawn(move || {
        let h = hazard::mine().expect("a slot");
        // Published as in a call: an address the child may reuse.
        let at = AtomicPtr::new(0x1000 as *mut hazard::Node);
        assert_eq!(hazard::protect(h, &at) as usize, 0x1000);
        ready_tx.send(h).unwrap();
        go_rx.recv().unwrap();
        hazard::end(h);
    });
    let lost = ready.recv().unwrap();
    assert_eq!(hazard::tests::state(lost), (0x1000, false, true));
    fork_prepare();
    // SAFETY: the child only reads and writes atomics, then `_exit`s.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        fork_release_child();
        let ok = hazard::tests::state(lost) == (0, false, false)
            && hazard::tests::state(own) == (0, false, true);
        // SAFETY: leaves the child at once (no test harness in it).
        unsafe { libc::_exit(if ok { 0 } else { 1 }) };
    }
    fork_release();
    assert!(pid > 0, "fork");
    let mut status = 0;
    // SAFETY: our child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    go.send(()).unwrap();
    t.join().unwrap();
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "the child kept a lost slot (status {status:#x})"
    );
}

/// Objects of the litmus below alive (made minus dropped).
static LITMUS_LIVE: AtomicUsize = AtomicUsize::new(0);
/// Set by a second drop of one of them (checked at the end: a panic in a
/// drop under the guard would be swallowed).
static LITMUS_TWICE: AtomicBool = AtomicBool::new(false);

struct Litmus(AtomicBool);

impl Drop for Litmus {
    fn drop(&mut self) {
        if self.0.swap(true, Ordering::SeqCst) || LITMUS_LIVE.fetch_sub(1, Ordering::SeqCst) == 0 {
            LITMUS_TWICE.store(true, Ordering::SeqCst);
        }
    }
}

inert_socket!(Litmus);

/// The litmus of a call's end against a removal's keep (store buffering,
/// review r18-xhaz item 5): one reader makes exactly one call per round
/// and the writer removes the entry as that call returns, racing its end
/// (the reader's clear-then-read of the nudge against the writer's
/// nudge-then-read of the slot). Whichever wins, the object is dropped by
/// the time the call has returned: never both missing (an `end` whose
/// clear is a plain store, or a `named` without its second read, would
/// leave it kept until a later change of the table). The reader returns
/// after a delay that sweeps the writer's latency, round by round.
/// Bounded in rounds and time; a round in which the drop is late is
/// counted, and none may be.
#[test]
fn a_removal_racing_a_calls_end_never_leaves_the_object_kept() {
    use std::sync::atomic::Ordering::SeqCst;
    let _serial = serial();
    let fd = 60_049;
    const ROUNDS: usize = 20_000;
    let opened = Arc::new(AtomicUsize::new(0));
    let inside = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let reader = {
        let (opened, inside, done, stop) =
            (opened.clone(), inside.clone(), done.clone(), stop.clone());
        std::thread::spawn(move || {
            for r in 1..=ROUNDS {
                let mut spins = 0u32;
                while opened.load(SeqCst) < r {
                    if stop.load(SeqCst) {
                        return;
                    }
                    spins += 1;
                    if spins < 10_000 {
                        std::hint::spin_loop();
                    } else {
                        std::thread::yield_now();
                    }
                }
                let found = with_marked(
                    fd,
                    || false,
                    |_| {
                        inside.store(r, SeqCst);
                        for _ in 0..r % 128 {
                            std::hint::spin_loop();
                        }
                        true
                    },
                );
                assert!(found, "round {r}: no entry");
                done.store(r, SeqCst);
            }
        })
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(3);
    let (mut rounds, mut late) = (0, 0);
    for r in 1..=ROUNDS {
        if std::time::Instant::now() > deadline {
            break;
        }
        LITMUS_LIVE.fetch_add(1, SeqCst);
        assert!(insert(fd, Arc::new(Litmus(AtomicBool::new(false))))
            .unwrap()
            .is_none());
        opened.store(r, SeqCst);
        // Spins first (the reader is usually on the other core), then
        // yields (on a loaded machine it may need this one).
        let mut spins = 0u32;
        while inside.load(SeqCst) < r {
            assert!(!reader.is_finished(), "round {r}: the reader failed");
            spins += 1;
            if spins < 10_000 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        drop(remove(fd));
        while done.load(SeqCst) < r {
            assert!(!reader.is_finished(), "round {r}: the reader failed");
            std::thread::yield_now();
        }
        // Another test's scan may have taken the object and not dropped
        // it yet (it drops after letting the lock go).
        holds::settled();
        rounds += 1;
        if LITMUS_LIVE.load(SeqCst) != 0 {
            late += 1;
            // The next insert's scan frees it (the slot is clear now).
        }
    }
    stop.store(true, SeqCst);
    reader.join().unwrap();
    // No threshold on the count (a loaded machine runs fewer): shown so
    // that a log says how much the litmus covered.
    eprintln!("litmus: {rounds} rounds");
    // Frees what a late round left (no slot names it any more).
    assert!(insert(fd, dummy()).unwrap().is_none());
    drop(remove(fd));
    assert_eq!(
        late, 0,
        "{late} of {rounds} rounds kept the object past the call's end"
    );
    assert!(!LITMUS_TWICE.load(SeqCst), "an object was dropped twice");
    assert_eq!(LITMUS_LIVE.load(SeqCst), 0);
}

const RACED: usize = 300;
/// Whether each of the race's objects is alive (cleared by its drop).
static ALIVE: [AtomicBool; RACED] = [const { AtomicBool::new(false) }; RACED];
static DROPPED: AtomicUsize = AtomicUsize::new(0);
/// Calls of the race's readers inside their look-up.
static CALLS: AtomicUsize = AtomicUsize::new(0);

/// A socket of the race: its number, and whether it is alive.
struct Live(usize);

/// Set by a second drop of one of the race's objects (checked at the end:
/// a panic in a drop under the guard would be swallowed, review r19 4).
static TWICE: AtomicBool = AtomicBool::new(false);

impl Drop for Live {
    fn drop(&mut self) {
        if !ALIVE[self.0].swap(false, Ordering::SeqCst) {
            TWICE.store(true, Ordering::SeqCst);
        }
        DROPPED.fetch_add(1, Ordering::SeqCst);
    }
}

inert_socket!(Live, |s: &Live| s.0 as c_int);

/// Look-ups in two threads while another replaces and removes the entry
/// (bounded in count and in time); the objects live in the table only.
/// Each call sees an object that is alive from its start to its end (a
/// use after free, or a publication reordered after the table's second
/// read, fails it), and every object is dropped by the time the readers
/// are done: none waits for a later change of the table.
#[test]
fn look_ups_race_replacements() {
    let _serial = serial();
    let fd = 60_037;
    let stop = Arc::new(AtomicBool::new(false));
    let start = Arc::new(std::sync::Barrier::new(3));
    let readers: Vec<_> = (0..2)
        .map(|_| {
            let (stop, start) = (Arc::clone(&stop), Arc::clone(&start));
            std::thread::spawn(move || {
                let mut seen = 0u64;
                start.wait();
                for _ in 0..20_000_000 {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    seen += with_marked(
                        fd,
                        || 0,
                        |s| {
                            let id = s.kernel_fd() as usize;
                            assert!(ALIVE[id].load(Ordering::SeqCst), "used after free");
                            CALLS.fetch_add(1, Ordering::SeqCst);
                            for _ in 0..200 {
                                std::hint::spin_loop();
                            }
                            assert!(ALIVE[id].load(Ordering::SeqCst), "freed under a call");
                            1
                        },
                    );
                }
                seen
            })
        })
        .collect();
    let mut made = 0;
    start.wait();
    // Bounded on a loaded machine: past it, changes go ahead without
    // waiting (the assertions do not depend on the interleavings).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    for (i, alive) in ALIVE.iter().enumerate() {
        // A change only once a reader has been inside a call since the
        // last one (the readers are mostly inside: each call spins). The
        // wait yields: with two cores, the readers need one to get there.
        // Bounded: a reader that failed makes no more calls.
        let calls = CALLS.load(Ordering::SeqCst);
        while i % 3 != 0
            && CALLS.load(Ordering::SeqCst) == calls
            && std::time::Instant::now() < deadline
        {
            std::thread::yield_now();
        }
        if i % 3 == 2 {
            drop(remove(fd));
        } else {
            alive.store(true, Ordering::SeqCst);
            drop(insert(fd, Arc::new(Live(i))));
            made += 1;
        }
    }
    stop.store(true, Ordering::Relaxed);
    for r in readers {
        r.join().unwrap();
    }
    drop(remove(fd));
    holds::settled();
    assert!(!TWICE.load(Ordering::SeqCst), "an object was dropped twice");
    assert_eq!(DROPPED.load(Ordering::SeqCst), made, "objects kept");
    assert!(ALIVE.iter().all(|a| !a.load(Ordering::SeqCst)));
}

/// Which `Panicky` objects were dropped (a bit each).
static PANICKY_DROPPED: AtomicUsize = AtomicUsize::new(0);

/// An object that records its drop, then panics if told to.
struct Panicky(usize, bool);

impl Drop for Panicky {
    fn drop(&mut self) {
        PANICKY_DROPPED.fetch_or(1 << self.0, Ordering::SeqCst);
        assert!(!self.1, "a drop that panics (this test's own panic)");
    }
}

inert_socket!(Panicky);

/// A scan's freed entries are all dropped even if one entry's drop
/// panics (the guard catches the panic): the ones after it too (review
/// r20-xhaz2a item 4).
#[test]
fn a_panicking_drop_leaves_no_freed_entry_undropped() {
    PANICKY_DROPPED.store(0, Ordering::SeqCst);
    let list: Vec<Entry> = vec![
        Arc::new(Panicky(0, false)),
        Arc::new(Panicky(1, true)),
        Arc::new(Panicky(2, false)),
    ];
    let freed = hazard::tests::freed(list);
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || drop(freed)));
    assert!(r.is_err(), "the drop did not panic");
    assert_eq!(
        PANICKY_DROPPED.load(Ordering::SeqCst),
        0b111,
        "left undropped"
    );
}

/// A `fork` made by a signal handler that interrupted a thread's first
/// claim after it owned its slot, before it recorded it (staged there),
/// keeps that slot owned in the child: the claim resumes there and uses
/// it; given back, a thread of the child's could claim it too, and the
/// two would share it (review r20-xhaz2a item 9).
#[test]
fn a_fork_inside_a_claim_keeps_the_claimed_slot_in_the_child() {
    let _serial = serial();
    let status = std::thread::spawn(|| {
        let pid = std::rc::Rc::new(std::cell::Cell::new(0));
        let seen = pid.clone();
        hazard::tests::OWNED_IN_CLAIM.with(|b| {
            *b.borrow_mut() = Some(Box::new(move |i| {
                fork_prepare();
                // SAFETY: the child reads atomics and `_exit`s.
                let p = unsafe { libc::fork() };
                if p == 0 {
                    fork_release_child();
                    let kept = hazard::tests::state(&hazard::HAZARDS[i]).2;
                    // SAFETY: leaves the child at once.
                    unsafe { libc::_exit(if kept { 0 } else { 1 }) };
                }
                fork_release();
                seen.set(p);
            }));
        });
        assert!(hazard::mine().is_some(), "no slot");
        let pid = pid.get();
        assert!(pid > 0, "the staged fork did not run");
        let mut status = 0;
        // SAFETY: our child.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        status
    })
    .join()
    .unwrap();
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "the child gave the slot being claimed back"
    );
}

/// A socket whose drop notes whether a close made there may wait
/// ([`close_may_wait`]: 1 yes, 2 no).
struct Probe(Arc<AtomicU8>);
inert_socket!(Probe);
impl Drop for Probe {
    fn drop(&mut self) {
        self.0
            .store(if close_may_wait() { 1 } else { 2 }, Ordering::SeqCst);
    }
}

/// Runs `attempt` (one staged run, its probe's note) up to 10 times, until
/// it notes `want`: a scan by a test not serialised with these (a UDP
/// socket's change of the table) may free the entry before the staged
/// point, or a stale pointer in another test's slot keep it past it (as
/// `a_reclaim_allocates_nothing` retries, review r20-xhaz2b 6d).
fn noted_within_10(want: u8, attempt: impl Fn(c_int) -> u8) -> u8 {
    let mut last = 0;
    for i in 0..10 {
        last = attempt(60_301 + 4 * i);
        if last == want {
            break;
        }
    }
    last
}

/// Thread B is inside a call on the descriptor when it is removed: the
/// entry kept for B is dropped as B's call ends, in B, a drop of its own
/// (its close may wait, as Linux's last `fput` in the thread whose call
/// held the file: review r26-b item 1).
#[test]
fn the_entry_a_call_kept_drops_in_its_thread_as_its_own() {
    let _serial = serial();
    let noted = noted_within_10(1, |fd| {
        let noted = Arc::new(AtomicU8::new(0));
        let a: Arc<dyn Socket> = Arc::new(Probe(noted.clone()));
        assert!(insert(fd, a).unwrap().is_none());
        let (inside_tx, inside) = mpsc::channel();
        let (go, go_rx) = mpsc::channel::<()>();
        let t = std::thread::spawn(move || {
            with_marked(
                fd,
                || false,
                |_| {
                    inside_tx.send(()).unwrap();
                    go_rx.recv().unwrap();
                    true
                },
            )
        });
        inside.recv().unwrap();
        drop(remove(fd));
        let under = noted.load(Ordering::SeqCst);
        go.send(()).unwrap();
        assert!(t.join().unwrap());
        if under != 0 {
            return 3;
        }
        noted.load(Ordering::SeqCst)
    });
    assert_eq!(
        noted, 1,
        "not B's own drop (0: kept, 3: dropped under the call)"
    );
}

/// The same, but another thread's scan (an unrelated `insert`: an
/// `accept`'s, a `socket`'s) runs after B's call cleared its slot and
/// before B's reclaim (staged), and frees the entry kept for B: dropped
/// there, in a thread that had no call on it, with no close wait (it
/// waited for up to the linger in that thread's `accept`: review r26-b
/// item 1).
#[test]
fn an_entry_another_threads_scan_frees_drops_without_a_close_wait() {
    let _serial = serial();
    let seen = noted_within_10(2, |fd| {
        let other = fd + 2;
        let noted = Arc::new(AtomicU8::new(0));
        let a: Arc<dyn Socket> = Arc::new(Probe(noted.clone()));
        assert!(insert(fd, a).unwrap().is_none());
        let (inside_tx, inside) = mpsc::channel();
        let (go, go_rx) = mpsc::channel::<()>();
        let (ended_tx, ended) = mpsc::channel();
        let (scanned, scanned_rx) = mpsc::channel::<()>();
        let t = std::thread::spawn(move || {
            hazard::tests::AFTER_END.with(|h| {
                *h.borrow_mut() = Some(Box::new(move || {
                    ended_tx.send(()).unwrap();
                    scanned_rx.recv().unwrap();
                }));
            });
            with_marked(
                fd,
                || false,
                |_| {
                    inside_tx.send(()).unwrap();
                    go_rx.recv().unwrap();
                    true
                },
            )
        });
        inside.recv().unwrap();
        drop(remove(fd));
        go.send(()).unwrap();
        ended.recv().unwrap();
        let before = noted.load(Ordering::SeqCst);
        assert!(insert(other, dummy()).unwrap().is_none());
        let seen = noted.load(Ordering::SeqCst);
        scanned.send(()).unwrap();
        assert!(t.join().unwrap());
        drop(remove(other));
        if before != 0 {
            return 3;
        }
        seen
    });
    assert_eq!(
        seen, 2,
        "not freed by the scan (0), free to wait there (1), or before (3)"
    );
    assert!(close_may_wait(), "the flag left set");
}
