//! A forked child's use of the streams' list while a thread of the
//! parent's held it at the fork (review r29-c item 7's class, issue 12).

use super::super::{fork_child, reopen_refused, Stream, STREAMS};
use crate::shim::forktest::child_within;
use libc::FILE;
use std::cell::RefCell;
use std::sync::mpsc;

/// Where a change stops for this thread's hook ([`at`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Point {
    /// The spare changed, not published.
    BeforePublish,
    /// The spare published, the set it replaced not changed yet.
    AfterPublish,
}

/// A hook: where it stops a change, and what it runs there.
type Hook = (Point, Box<dyn FnOnce()>);

thread_local! {
    /// Run by this thread's next change at its point (once).
    static HOOK: RefCell<Option<Hook>> = const { RefCell::new(None) };
}

/// A change at `point`: this thread's hook, if set for it.
pub(super) fn at(point: Point) {
    let hook = HOOK.with(|h| {
        let mut h = h.borrow_mut();
        match h.take() {
            Some((p, f)) if p == point => Some(f),
            other => {
                *h = other;
                None
            }
        }
    });
    if let Some(f) = hook {
        f();
    }
}

/// What a thread of the parent's holds when the process forks.
#[derive(Clone, Copy, Debug)]
enum Held {
    /// The list's lock, as a reader (`freopen`'s look, the exit flush)
    /// or a change holds it.
    Lock,
    /// A record (an `fdopen`'s) stopped at `Point`, the lock held.
    Record(Point),
}

/// A cookie as `fdopen` makes one, for stream `file` (null: none), its
/// descriptor -1 (as a refused stream's: nothing is closed).
fn cookie(file: *mut FILE) -> usize {
    Box::into_raw(Box::new(Stream {
        fd: -1,
        file,
        // SAFETY: getpid has no preconditions.
        pid: unsafe { libc::getpid() },
    })) as usize
}

/// Whether the two sets are alike (the spare made again, or kept).
fn alike() -> bool {
    let _held = STREAMS.locked();
    // SAFETY: the lock is held.
    unsafe { **STREAMS.sets[0].get() == **STREAMS.sets[1].get() }
}

/// A process with a stream of its own listed (a cookie over a
/// `fmemopen` stream, a cookie stream as the library's are) forks while
/// a thread of its holds `held`, from before the fork until the child
/// ended — far past the 2 ms the prepare handler once tried the lock
/// for. The child runs the fork handler's part, then `freopen`'s look
/// for the parent's stream (refused: found in the list), the parent's
/// stream's removal (its `fclose`), a record and a removal of its own,
/// each change's list checked. The child's status: 0; 1 (the parent's
/// stream not found); 2 (a removal or record of the child's not seen in
/// the list); 3 (the parent's
/// record under way at the fork listed when it was not published, or
/// lost when it was); 4 (the two sets differ after the child's changes);
/// -1 (a signal: a torn set read); `None` (hung, killed after `HUNG`).
fn first_list_calls_in_a_child(held: Held) -> Option<i32> {
    let mut buf = [0u8; 16];
    // SAFETY: a memory stream over `buf`, closed below.
    let file = unsafe { libc::fmemopen(buf.as_mut_ptr().cast(), buf.len(), c"w".as_ptr()) };
    assert!(!file.is_null());
    let parents = cookie(file);
    STREAMS.insert(parents);
    let recorded = cookie(std::ptr::null_mut());
    let (say, heard) = mpsc::channel();
    let (go, gone) = mpsc::channel::<()>();
    let holder = std::thread::spawn(move || match held {
        Held::Lock => {
            let g = STREAMS.locked();
            say.send(()).expect("the test waits");
            let _ = gone.recv();
            drop(g);
        }
        Held::Record(point) => {
            let stop: Box<dyn FnOnce()> = Box::new(move || {
                say.send(()).expect("the test waits");
                let _ = gone.recv();
            });
            HOOK.with(|h| *h.borrow_mut() = Some((point, stop)));
            STREAMS.insert(recorded);
        }
    });
    heard.recv().expect("the holder holds");
    let published = matches!(held, Held::Record(Point::AfterPublish));
    let status = child_within(|| {
        fork_child();
        // SAFETY: the child's copy of the open stream.
        if !unsafe { reopen_refused(std::ptr::null(), file) } {
            return 1;
        }
        let mine = cookie(std::ptr::null_mut());
        // The list after each change: the parent's stream and the
        // child's as expected, the parent's record as at the fork.
        let check = |parent_listed: bool, mine_listed: bool| {
            let list = STREAMS.locked();
            if list.contains(&parents) != parent_listed || list.contains(&mine) != mine_listed {
                return Err(2);
            }
            if list.contains(&recorded) != published {
                return Err(3);
            }
            Ok(())
        };
        let changes = || {
            STREAMS.insert(mine);
            check(true, true)?;
            STREAMS.remove(parents);
            check(false, true)?;
            STREAMS.remove(mine);
            check(false, false)?;
            if !alike() {
                return Err(4);
            }
            Ok(())
        };
        changes().err().unwrap_or(0)
    });
    let _ = go.send(());
    holder.join().expect("the holder");
    let after = STREAMS.locked().contains(&recorded);
    for c in [parents, recorded] {
        STREAMS.remove(c);
        // SAFETY: made by `cookie`, no longer listed.
        drop(unsafe { Box::from_raw(c as *mut Stream) });
    }
    // SAFETY: the stream opened above.
    unsafe { libc::fclose(file) };
    assert_eq!(
        after,
        matches!(held, Held::Record(_)),
        "the parent's record under way at the fork"
    );
    assert!(alike(), "the parent's sets after its record");
    status
}

/// What the child's status means (for the failures' messages).
const STATUS: &str = "None: hung, killed; -1: the child died of a signal, a torn set read; \
     1: the parent's stream not found; 2: a removal or record of the child's not seen; \
     3: the parent's record under way listed when not published, or lost when published; \
     4: the sets differ after the child's changes";

/// A fork while another thread of the process holds the list's lock for
/// any time (preempted inside an `fdopen`'s record or an `fclose`'s
/// removal; the exit flush across its sends): the child's look, removal
/// and record complete, and the look finds the parent's stream. Before,
/// the prepare handler tried the lock about 2 ms, then forked without
/// it: the child's copy stayed held by a thread the child does not have,
/// and the child hung on its first `fclose` of a stream.
#[test]
fn a_forked_child_uses_the_stream_list_a_parents_thread_holds_across_the_fork() {
    assert_eq!(
        first_list_calls_in_a_child(Held::Lock),
        Some(0),
        "a forked child's stream list calls while a thread of the parent's held the list's \
         lock across the fork ({STATUS})"
    );
}

/// As above, the parent's thread inside a record, its spare changed and
/// not published at the fork: the child has the list before the record,
/// whole; the parent's record then completes.
#[test]
fn a_forked_child_has_the_list_before_a_parents_record_not_published() {
    assert_eq!(
        first_list_calls_in_a_child(Held::Record(Point::BeforePublish)),
        Some(0),
        "a forked child's stream list calls while a thread of the parent's was inside a \
         record, not published, at the fork ({STATUS})"
    );
}

/// As above, the parent's record published and the set it replaced not
/// changed yet at the fork: the child has the list after the record, and
/// its first change makes its spare again from it (else that change
/// would publish the spare without the parent's record).
#[test]
fn a_forked_child_keeps_a_parents_record_published_at_the_fork() {
    assert_eq!(
        first_list_calls_in_a_child(Held::Record(Point::AfterPublish)),
        Some(0),
        "a forked child's stream list calls while a thread of the parent's was inside a \
         record, published, at the fork ({STATUS})"
    );
}

/// A change that unwinds (a panic, which the preload catches at its
/// boundary) leaves the list whole and usable (review r30-d item 1): a
/// record that panicked before its publication is not listed, one that
/// panicked after it is, and the next change makes the spare again from
/// the published set (its `stale` mark, set across the change), so both
/// sets are alike after it.
#[test]
fn a_change_that_unwinds_leaves_the_list_whole() {
    for (point, listed) in [(Point::BeforePublish, false), (Point::AfterPublish, true)] {
        let (a, b) = (cookie(std::ptr::null_mut()), cookie(std::ptr::null_mut()));
        let boom: Box<dyn FnOnce()> = Box::new(|| panic!("test: a change unwinds"));
        HOOK.with(|h| *h.borrow_mut() = Some((point, boom)));
        let r = std::panic::catch_unwind(|| STREAMS.insert(a));
        assert!(r.is_err(), "{point:?}: the hook did not run");
        assert_eq!(
            STREAMS.locked().contains(&a),
            listed,
            "{point:?}: the record"
        );
        STREAMS.insert(b);
        {
            let list = STREAMS.locked();
            assert!(list.contains(&b), "{point:?}: the next record");
            assert_eq!(
                list.contains(&a),
                listed,
                "{point:?}: after the next record"
            );
        }
        assert!(alike(), "{point:?}: the sets after the next record");
        for c in [a, b] {
            STREAMS.remove(c);
            // SAFETY: made by `cookie`, no longer listed.
            drop(unsafe { Box::from_raw(c as *mut Stream) });
        }
    }
}

/// `own` (the exit flush looks for streams only in a process that made
/// one): set by a record, kept by the parent across a fork, cleared in
/// the child by the fork handler and set again by the child's own record.
/// Read directly: `trying` would try the lock, which the fork tests hold
/// in parallel.
#[test]
fn own_streams_are_counted_per_process() {
    let c = cookie(std::ptr::null_mut());
    STREAMS.insert(c);
    assert!(STREAMS.own.load(std::sync::atomic::Ordering::Acquire));
    let status = child_within(|| {
        fork_child();
        if STREAMS.own.load(std::sync::atomic::Ordering::Acquire) {
            return 1;
        }
        let mine = cookie(std::ptr::null_mut());
        STREAMS.insert(mine);
        if !STREAMS.own.load(std::sync::atomic::Ordering::Acquire) {
            return 2;
        }
        0
    });
    assert_eq!(
        status,
        Some(0),
        "1: the child's own set after the fork handler; 2: not set by its record"
    );
    assert!(
        STREAMS.own.load(std::sync::atomic::Ordering::Acquire),
        "the parent's own cleared"
    );
    STREAMS.remove(c);
    // SAFETY: made by `cookie`, no longer listed.
    drop(unsafe { Box::from_raw(c as *mut Stream) });
}
