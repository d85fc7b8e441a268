//! The program's epoll registrations follow its descriptor across a swap.
//!
//! A managed socket changes which open file the program's descriptor number
//! names (`dup3`): at adoption the number comes to name a doorbell end
//! ([`super::doorbell`]), at demotion the kernel socket again. epoll keys a
//! registration on the pair (number, open file) and keeps watching the file
//! it was given (epoll(7), "Questions and answers" 6), so a registration the
//! program made before a swap would go on watching the old file, and the
//! program, which believes its descriptor registered, would never hear of
//! the new one. (A plain client of a preloaded redis-server in policy mode
//! hung on its second request that way: the connection was demoted to the
//! kernel socket after the pre-switch bytes were read, and redis's epoll set
//! still watched the doorbell.)
//!
//! [`dup3_carrying`] therefore finds the registrations of the number in the
//! process's epoll sets, removes them while the number still names the old
//! file, swaps, and adds them again with the same events and data. ADD
//! reports a readiness already present at once (level and edge triggered
//! alike), so nothing that arrived meanwhile is missed; a waiter may see one
//! spurious wake-up, which epoll allows.
//!
//! The epoll sets are the ones the program made through the interposed
//! `epoll_create`/`epoll_create1` ([`created`]); their registrations are read
//! from `/proc/self/fdinfo/<epfd>` (the kernel's `ep_show_fdinfo` lines
//! `tfd: <fd> events: <hex> data: <hex> pos:<n> ino:<hex> sdev:<hex>`), and
//! only those whose file has the inode the number names now are carried.
//! Limits (documented in the crate docs): an epoll set made by a raw
//! `syscall(SYS_epoll_create1)` or inherited across `exec` is not known, and
//! without `/proc` nothing is carried; a swap costs one read of each known
//! set's fdinfo, so it is linear in the registrations of those sets.
//! A forked child keeps the list of sets whole and usable, whatever a
//! thread of the parent's was doing with it at the fork ([`SETS`]).

use std::ptr::null_mut;
use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering};

use libc::c_int;
use warpsock_xsock::io::ForkLock;

use super::real;

mod closing;
#[cfg(test)]
pub(crate) use closing::testing as close_testing;
pub(crate) use closing::{before_close, holds_any, Held};

/// The epoll sets the program made (numbers; a stale one is harmless: its
/// fdinfo then lists nothing of ours, or it is no longer there).
///
/// A forked child keeps the list (it holds the same epoll instances: a
/// pre-fork server's workers switch connections registered in them),
/// unlike the parent's DDP sockets, so it cannot start an empty one; and
/// a thread of the parent's may hold the list's lock at the fork for any
/// time (preempted inside `epoll_create`'s record or a swap's copy of
/// the list), which the child must neither wait for (that thread is not
/// the child's: it hung, issue 12, review r29-c item 7) nor read a list
/// half changed. So a list is never changed in place: a record makes a
/// new one and publishes it with one atomic swap of [`Sets::list`], under
/// a [`ForkLock`] that the child's fork handler forgets ([`fork_child`]).
/// The child's copy of the pointer names a whole list (the one before a
/// record under way at the fork, or the one after it), and its next lock
/// is a new one. The fork handlers take no lock for it, so a signal
/// handler's fork over its own thread's hold waits for nothing.
///
/// Not supported (review r30-c items 1, 2): a child forked by a signal
/// handler over its own thread's record or copy that records a set
/// while still in that handler (`epoll_create` is not async-signal-safe):
/// the new lock lets it free the list the interrupted copy still reads;
/// and another library's child fork handler registered before ours that
/// creates an epoll set while a parent's thread held the lock at the fork
/// waits for that lock (ours has not forgotten it yet).
static SETS: Sets = Sets {
    lock: ForkLock::new(),
    list: AtomicPtr::new(null_mut()),
};

/// [`SETS`]: a list replaced whole, and the lock of its replacements.
struct Sets {
    /// Held by a record across its replacement of [`Sets::list`], and by
    /// a reader across its copy (a record frees the list it replaced).
    lock: ForkLock<()>,
    /// Null (none recorded), or a `Box` of the sets (`Box::into_raw`),
    /// each with the generation ([`GEN`]) of the process that made it (a
    /// forked child's list holds its parent's too: shared), sorted by
    /// number and without duplicates, never changed once published.
    list: AtomicPtr<Vec<(c_int, u64)>>,
}

/// Which process this is, without a system call: 0 in the first, one
/// more in each child the fork handlers ran in ([`fork_child`]). A set
/// is listed with the generation that made it.
static GEN: AtomicU64 = AtomicU64::new(0);

/// The generation that listed a set last (`u64::MAX`: none). A process
/// of another generation has made no set (a forked child's copy names
/// its parent's until it makes one), so it has none to clean
/// ([`Sets::each_own`]) and does not wait for the lock.
static MADE_GEN: AtomicU64 = AtomicU64::new(u64::MAX);

thread_local! {
    /// This thread holds [`SETS`]' lock (a signal handler's `close` over
    /// that hold must not wait for it: `closing::before_close`). No
    /// destructor: read from signal handlers.
    static HOLDING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// [`Sets::lock`] held, and [`HOLDING`] set meanwhile.
struct SetsHeld {
    _g: std::sync::MutexGuard<'static, ()>,
}

impl SetsHeld {
    fn take() -> Self {
        let g = SETS.lock.lock();
        HOLDING.with(|h| h.set(true));
        Self { _g: g }
    }
}

impl Drop for SetsHeld {
    fn drop(&mut self) {
        HOLDING.with(|h| h.set(false));
    }
}

impl Sets {
    /// Adds `epfd`, made by this process (a new list, published; the
    /// old one freed).
    fn insert(&self, epfd: c_int) {
        let _g = SetsHeld::take();
        let me = GEN.load(Ordering::Acquire);
        let old = self.list.load(Ordering::Acquire);
        // SAFETY: a published list is a `Box`'s raw pointer, freed only
        // by a record's replacement, which the lock held keeps out.
        let old_sets = unsafe { old.as_ref() }.map_or(&[][..], Vec::as_slice);
        // A number listed already (a set closed and its number reused)
        // needs no new list, unless another process made it (a forked
        // child's number reused): looked up before the copy (review
        // r30-c item 5).
        let (at, replace) = match old_sets.binary_search_by_key(&epfd, |&(e, _)| e) {
            Ok(i) if old_sets[i].1 == me => return,
            Ok(i) => (i, true),
            Err(i) => (i, false),
        };
        let mut sets = Vec::with_capacity(old_sets.len() + 1);
        sets.extend_from_slice(&old_sets[..at]);
        sets.push((epfd, me));
        sets.extend_from_slice(&old_sets[at + usize::from(replace)..]);
        #[cfg(test)]
        tests::before_publish();
        // Complete before it is published (the swap's release half); the
        // free below uses the swap's result, so it comes after the
        // publication in program order: a fork between them leaves the
        // child the old list whole, or the new one.
        let old = self
            .list
            .swap(Box::into_raw(Box::new(sets)), Ordering::AcqRel);
        MADE_GEN.store(me, Ordering::Release);
        if !old.is_null() {
            // SAFETY: the list replaced, a `Box`'s raw pointer no longer
            // published; a reader reads it only under the lock held here.
            drop(unsafe { Box::from_raw(old) });
        }
    }

    /// A copy of the sets' numbers.
    fn listed(&self) -> Vec<c_int> {
        let _g = SetsHeld::take();
        // SAFETY: as in `insert`: not freed while the lock is held.
        unsafe { self.list.load(Ordering::Acquire).as_ref() }
            .map(|l| l.iter().map(|&(e, _)| e).collect())
            .unwrap_or_default()
    }

    /// `f` of each set this process made, under the lock (no copy); not
    /// at all over this thread's own hold of the lock (a signal
    /// handler's call: [`HOLDING`]), nor before this process listed a
    /// set ([`MADE_GEN`]). No system call (a managed socket's `close`
    /// makes one `getpid`, `fdtable::borrowed`: a child made without the
    /// fork handlers never comes here for one).
    fn each_own(&self, mut f: impl FnMut(c_int)) {
        if HOLDING.with(std::cell::Cell::get) || self.list.load(Ordering::Acquire).is_null() {
            return;
        }
        let me = GEN.load(Ordering::Acquire);
        if MADE_GEN.load(Ordering::Acquire) != me {
            return;
        }
        let _g = SetsHeld::take();
        // SAFETY: as in `insert`: not freed while the lock is held.
        if let Some(l) = unsafe { self.list.load(Ordering::Acquire).as_ref() } {
            l.iter().filter(|&&(_, p)| p == me).for_each(|&(e, _)| f(e));
        }
    }
}

/// The atfork child handler's part: the list's lock, which a thread of
/// the parent's may have held at the fork, starts afresh; the list is
/// kept ([`SETS`]). One store: no lock, no allocation.
pub(crate) fn fork_child() {
    SETS.lock.forget();
    GEN.fetch_add(1, Ordering::AcqRel);
    HOLDING.with(|h| h.set(false));
    closing::fork_child();
}

/// Whether this process made an epoll set (through the interposed
/// `epoll_create`/`epoll_create1`). No lock, no system call: the atfork
/// parent handler asks.
pub(crate) fn made_any() -> bool {
    MADE_GEN.load(Ordering::Acquire) == GEN.load(Ordering::Acquire)
}

/// Whether `epfd` is an epoll set this process made (listed by
/// [`created`] in this process, not a parent's copy).
pub(crate) fn made_here(epfd: c_int) -> bool {
    let _g = SetsHeld::take();
    let me = GEN.load(Ordering::Acquire);
    // SAFETY: as in `Sets::insert`: not freed while the lock is held.
    unsafe { SETS.list.load(Ordering::Acquire).as_ref() }.is_some_and(|l| {
        l.binary_search_by_key(&epfd, |&(e, _)| e)
            .is_ok_and(|i| l[i].1 == me)
    })
}

/// Records an epoll set the program made (`epfd` < 0: a failed call).
pub(crate) fn created(epfd: c_int) {
    if epfd >= 0 {
        SETS.insert(epfd);
    }
}

/// One registration of a descriptor in an epoll set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Registration {
    pub(crate) epfd: c_int,
    pub(crate) events: u32,
    pub(crate) data: u64,
}

impl Registration {
    /// As [`super::epollwatch`] follows it, for the program's number `fd`.
    pub(crate) fn watched(&self, fd: c_int) -> super::epollwatch::Reg {
        super::epollwatch::Reg {
            fd,
            events: self.events,
            data: self.data,
        }
    }
}

/// The registrations of descriptor `fd` whose file has inode `ino`, from the
/// text of epoll set `epfd`'s fdinfo. Lines that do not parse are skipped.
pub(crate) fn parse_fdinfo(text: &str, epfd: c_int, fd: c_int, ino: u64) -> Vec<Registration> {
    let mut out = Vec::new();
    for line in text.lines() {
        let mut t = line.split_whitespace();
        if t.next() != Some("tfd:") {
            continue;
        }
        let parsed = (|| {
            let tfd: c_int = t.next()?.parse().ok()?;
            (t.next()? == "events:").then_some(())?;
            let events = u32::from_str_radix(t.next()?, 16).ok()?;
            (t.next()? == "data:").then_some(())?;
            let data = u64::from_str_radix(t.next()?, 16).ok()?;
            let file_ino = t
                .find_map(|w| w.strip_prefix("ino:"))
                .and_then(|h| u64::from_str_radix(h, 16).ok())?;
            Some((tfd, events, data, file_ino))
        })();
        if let Some((tfd, events, data, file_ino)) = parsed {
            if tfd == fd && file_ino == ino {
                out.push(Registration { epfd, events, data });
            }
        }
    }
    out
}

/// The inode of the file descriptor `fd` names, if it names one.
pub(crate) fn inode(fd: c_int) -> Option<u64> {
    // SAFETY: fstat writes into a zeroed local struct.
    unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        (libc::fstat(fd, &mut st) == 0).then_some(st.st_ino)
    }
}

/// The registrations of `fd` (as the file it names now) in the known sets.
fn registrations(fd: c_int) -> Vec<Registration> {
    match inode(fd) {
        Some(ino) => registrations_of(fd, ino),
        None => Vec::new(),
    }
}

/// After a [`dup3_carrying`] onto `fd` from the file of inode `old` that
/// another thread of the program may have used meanwhile (a switching
/// socket's end, `xsock::switching`): registrations of `fd` as that old
/// file, added between the carry's look and its `dup3`, are added for the
/// file `fd` names now too; the old ones go with the old file's last
/// close. A registration of the new file already there is the newer
/// (the carry's, or the program's own made since the `dup3`) and is kept.
/// `hide`: events the new file's kind never shows, not asked of it
/// ([`super::socket::Socket::never_shows`]).
pub(crate) fn carry_late(fd: c_int, old: u64, hide: u32) -> Vec<Registration> {
    let regs = hidden(registrations_of(fd, old), hide);
    for r in &regs {
        let mut ev = libc::epoll_event {
            events: r.events,
            u64: r.data,
        };
        // SAFETY: ADD with a valid event on the program's epoll set
        // (EEXIST: kept as it is).
        unsafe { real::epoll_ctl(r.epfd, libc::EPOLL_CTL_ADD, fd, &mut ev) };
    }
    regs
}

/// `regs` with the events `hide` taken out.
fn hidden(mut regs: Vec<Registration>, hide: u32) -> Vec<Registration> {
    for r in &mut regs {
        r.events &= !hide;
    }
    regs
}

/// The registrations of `fd` as the file of inode `ino` in the known sets.
fn registrations_of(fd: c_int, ino: u64) -> Vec<Registration> {
    let sets = SETS.listed();
    if sets.is_empty() {
        return Vec::new();
    }
    let mut out = Vec::new();
    for epfd in sets {
        if epfd == fd {
            continue;
        }
        // With cancellation disabled: std's `open` and `read` are libc's
        // cancellation points, and this runs inside a program's call.
        let path = format!("/proc/self/fdinfo/{epfd}");
        if let Ok(text) = super::sys::without_cancel(|| std::fs::read_to_string(path)) {
            out.extend(parse_fdinfo(&text, epfd, fd, ino));
        }
    }
    out
}

/// `dup3(target, fd, flags)`, with the epoll registrations `fd` had, and
/// its signal-driven I/O settings (`super::sigio`), carried over to the
/// file it names afterwards. Returns what `dup3` returned (its errno is
/// kept); on failure both are restored as they were.
pub(crate) fn dup3_carrying(target: c_int, fd: c_int, flags: c_int) -> c_int {
    dup3_carrying_sets(target, fd, flags, 0).0
}

/// [`dup3_carrying`], and the registrations it carried (the caller tells
/// [`super::epollwatch`] of them for the managed socket the number names
/// now). `hide`: events the new file's kind never shows, not asked of it
/// ([`super::socket::Socket::never_shows`]: TCP's `POLLWRBAND`, which a
/// doorbell would show).
pub(crate) fn dup3_carrying_sets(
    target: c_int,
    fd: c_int,
    flags: c_int,
    hide: u32,
) -> (c_int, Vec<Registration>) {
    let regs: Vec<Registration> = registrations(fd)
        .into_iter()
        // SAFETY: EPOLL_CTL_DEL ignores the event argument.
        .filter(|r| unsafe { real::epoll_ctl(r.epfd, libc::EPOLL_CTL_DEL, fd, null_mut()) == 0 })
        .collect();
    // The program's `SIGIO` settings follow the number too (`sigio`).
    let owner = super::sigio::Owner::take(fd);
    // SAFETY: dup3 on descriptors the caller owns (the program's number and
    // one of ours).
    let n = unsafe { real::dup3(target, fd, flags) };
    let e = super::sys::errno();
    // On the new file, or back on the old one if the swap failed.
    if let Some(o) = &owner {
        o.give(fd);
    }
    // As asked of the new file, or as they were on the old one.
    let regs = if n < 0 { regs } else { hidden(regs, hide) };
    for r in &regs {
        let mut ev = libc::epoll_event {
            events: r.events,
            u64: r.data,
        };
        // SAFETY: ADD with a valid event on the program's epoll set.
        unsafe { real::epoll_ctl(r.epfd, libc::EPOLL_CTL_ADD, fd, &mut ev) };
    }
    if n < 0 {
        super::sys::set_errno(e);
    }
    (n, regs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shim::forktest::child_within;
    use std::cell::RefCell;
    use std::sync::mpsc;

    /// review r29-c item 5: the atfork handler's part run from a
    /// thread-local destructor (a fork made there) does not panic: a
    /// panic in an `extern "C"` handler (and in a destructor) aborts the
    /// process. (The part reaches no thread-local now; before, a guard
    /// slot's `with` panicked once the slot was gone.) In a forked child
    /// (an abort there is its status): a thread touches `LATE`, runs the
    /// part, and exits; `LATE`'s destructor runs the part again.
    #[test]
    fn the_fork_handler_from_a_thread_local_destructor_does_not_panic() {
        struct Late;
        impl Drop for Late {
            fn drop(&mut self) {
                fork_child();
            }
        }
        thread_local! {
            static LATE: RefCell<Option<Late>> = const { RefCell::new(None) };
        }
        let status = child_within(|| {
            let t = std::thread::spawn(|| {
                LATE.with(|l| *l.borrow_mut() = Some(Late));
                fork_child();
            });
            i32::from(t.join().is_err())
        });
        assert_eq!(
            status,
            Some(0),
            "the fork handler run from a thread-local destructor \
             (-1: the child aborted: a panic in the handler; 1: the thread panicked; None: hung)"
        );
    }

    thread_local! {
        /// Run by this thread's next record between its new list and
        /// the list's publication (once).
        static BEFORE_PUBLISH: RefCell<Option<Box<dyn FnOnce()>>> = const { RefCell::new(None) };
    }

    /// A record has its new list, not published yet: this thread's
    /// hook, if set.
    pub(super) fn before_publish() {
        if let Some(f) = BEFORE_PUBLISH.with(|h| h.borrow_mut().take()) {
            f();
        }
    }

    /// What a thread of the parent's holds when the process forks.
    #[derive(Clone, Copy, Debug)]
    enum Held {
        /// The list's lock, as a swap's copy of the list holds it.
        Lock,
        /// A record of [`RECORDED`] between its new list and the list's
        /// publication (the lock held).
        Record,
    }

    /// The set the [`Held::Record`] holder records: a number no
    /// descriptor has (above the largest `RLIMIT_NOFILE`), harmless
    /// left listed.
    const RECORDED: c_int = 1 << 20;

    /// A process with an epoll set watching a pipe forks while a thread
    /// of its holds `held`, from before the fork until the child ended —
    /// far past the 2 ms the prepare handler once waited for the lock;
    /// the child runs the fork handler's part, then its first epoll set
    /// record (its `epoll_create`) and its first swap, which reads the
    /// list to carry the pipe's registration, and waits on the set. The
    /// child's status: 0, 1 (the registration did not follow the swap),
    /// 2 (the swap failed), or `None` (hung, killed after `HUNG`).
    fn first_epoll_calls_in_a_child(held: Held) -> Option<i32> {
        // A number listed already makes no new list, so the record would
        // never reach its hook (review r30-c item 3).
        assert!(
            !matches!(held, Held::Record) || !SETS.listed().contains(&RECORDED),
            "RECORDED is listed already: the record under way would make no new list"
        );
        let (ep, a, b) = watched_pipe();
        let (say, heard) = mpsc::channel();
        let (go, gone) = mpsc::channel::<()>();
        let holder = std::thread::spawn(move || match held {
            Held::Lock => {
                let g = SETS.lock.lock();
                say.send(()).expect("the test waits");
                let _ = gone.recv();
                drop(g);
            }
            Held::Record => {
                BEFORE_PUBLISH.with(|h| {
                    *h.borrow_mut() = Some(Box::new(move || {
                        say.send(()).expect("the test waits");
                        let _ = gone.recv();
                    }));
                });
                created(RECORDED);
            }
        });
        heard.recv().expect("the holder holds");
        let status = child_within(|| {
            fork_child();
            // SAFETY: an epoll set of the child's own.
            created(unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) });
            if dup3_carrying(b[0], a[0], 0) != a[0] {
                return 2;
            }
            i32::from(waited(ep) != Some(42))
        });
        let _ = go.send(());
        holder.join().expect("the holder");
        for fd in [ep, a[0], a[1], b[0], b[1]] {
            crate::shim::sys::close(fd);
        }
        status
    }

    /// review r29-c item 7: a fork while another thread of the process
    /// holds the list's lock for any time (preempted inside a swap's copy
    /// of the list): the child's first epoll set record and swap
    /// complete, and the swap finds the parent's set. Before, the prepare
    /// handler tried the lock about 2 ms, then forked without it: the
    /// child's copy stayed held by a thread the child does not have, and
    /// the child hung.
    #[test]
    fn a_forked_child_uses_the_list_a_parents_thread_holds_across_the_fork() {
        let _serial = super::super::fdtable::tests::support::serial();
        assert_eq!(
            first_epoll_calls_in_a_child(Held::Lock),
            Some(0),
            "a forked child's epoll set record and swap while a thread of the parent's held \
             the list's lock across the fork (None: hung, killed; -1: the child died of a \
             signal, a freed or torn list read; 1: the registration did not \
             follow the swap; 2: the swap failed)"
        );
    }

    /// As above, the parent's thread inside a record, its new list made
    /// and not published at the fork: the child has the list before the
    /// record, whole (its swap finds the parent's set); the parent's
    /// record then completes.
    #[test]
    fn a_forked_child_has_a_whole_list_when_a_parents_record_was_under_way() {
        let _serial = super::super::fdtable::tests::support::serial();
        assert_eq!(
            first_epoll_calls_in_a_child(Held::Record),
            Some(0),
            "a forked child's epoll set record and swap while a thread of the parent's was \
             inside a record at the fork (None: hung, killed; -1: the child died of a signal, \
             a freed or torn list read; 1: the registration did not \
             follow the swap; 2: the swap failed)"
        );
        assert!(
            SETS.listed().contains(&RECORDED),
            "the parent's record under way at the fork"
        );
    }

    /// An epoll set (recorded, as the interposed `epoll_create` records
    /// one) watching pipe `a`'s read end for input with data 42, and pipe
    /// `b`, whose read end has a byte waiting.
    fn watched_pipe() -> (c_int, [c_int; 2], [c_int; 2]) {
        // SAFETY: plain descriptor calls on pipes and an epoll set of our own.
        unsafe {
            let ep = libc::epoll_create1(libc::EPOLL_CLOEXEC);
            assert!(ep >= 0);
            created(ep);
            let mut a = [0; 2];
            let mut b = [0; 2];
            assert_eq!(libc::pipe(a.as_mut_ptr()), 0);
            assert_eq!(libc::pipe(b.as_mut_ptr()), 0);
            let mut ev = libc::epoll_event {
                events: libc::EPOLLIN as u32,
                u64: 42,
            };
            assert_eq!(libc::epoll_ctl(ep, libc::EPOLL_CTL_ADD, a[0], &mut ev), 0);
            assert_eq!(libc::write(b[1], b"x".as_ptr().cast(), 1), 1);
            (ep, a, b)
        }
    }

    /// The data of the one event `epoll_wait` on `ep` returns (at most
    /// 5 s: a bound for a broken run), `None` if not one.
    fn waited(ep: c_int) -> Option<u64> {
        let mut out = [libc::epoll_event { events: 0, u64: 0 }; 4];
        // SAFETY: a buffer of 4 events, its length given.
        let n = unsafe { libc::epoll_wait(ep, out.as_mut_ptr(), 4, 5000) };
        let got = out[0];
        (n == 1).then_some(got.u64)
    }

    /// The format of fs/eventpoll.c `ep_show_fdinfo` (Linux 4.x–6.x).
    const FDINFO: &str = "pos:\t0\nflags:\t02000002\nmnt_id:\t15\nino:\t1057\n\
tfd:        8 events:       19 data:                8  pos:0 ino:5a3f1 sdev:8\n\
tfd:        9 events: 80000001 data:     7f00deadbeef  pos:0 ino:5a3f2 sdev:8\n\
tfd:        8 events:        1 data:                2  pos:0 ino:77 sdev:8\n";

    #[test]
    fn only_the_descriptor_naming_that_file_is_carried() {
        assert_eq!(
            parse_fdinfo(FDINFO, 5, 8, 0x5a3f1),
            vec![Registration {
                epfd: 5,
                events: 0x19,
                data: 8
            }]
        );
        // Edge-triggered: EPOLLET is part of the events carried.
        assert_eq!(
            parse_fdinfo(FDINFO, 5, 9, 0x5a3f2),
            vec![Registration {
                epfd: 5,
                events: 0x8000_0001,
                data: 0x7f00_dead_beef
            }]
        );
        assert!(parse_fdinfo(FDINFO, 5, 10, 0x5a3f1).is_empty());
        assert!(parse_fdinfo("tfd: x events: y\n", 5, 8, 1).is_empty());
    }

    /// A registration the program adds between the carry's look and its
    /// `dup3` (another thread's `epoll_ctl`, racing the switch's end) is
    /// made for the new file too (`carry_late`, untested since session
    /// 36). The interleaving is laid out in order: the look (finding
    /// nothing), the program's add, the `dup3`, the late carry. The old
    /// file stays open elsewhere, as the switching socket's end does while
    /// the library holds it. Without `carry_late` no event comes.
    #[test]
    fn a_registration_added_between_the_look_and_the_swap_follows_it() {
        let (ep, a, b) = watched_pipe();
        // SAFETY: plain descriptor calls on the test's pipes and set.
        unsafe {
            // The registration `watched_pipe` made is not this test's.
            libc::epoll_ctl(ep, libc::EPOLL_CTL_DEL, a[0], null_mut());
            let held = libc::dup(a[0]);
            assert!(held >= 0);
            let old = inode(a[0]).unwrap();
            assert!(registrations(a[0]).is_empty(), "the carry's look");
            let mut ev = libc::epoll_event {
                events: libc::EPOLLIN as u32,
                u64: 7,
            };
            assert_eq!(libc::epoll_ctl(ep, libc::EPOLL_CTL_ADD, a[0], &mut ev), 0);
            assert_eq!(real::dup3(b[0], a[0], 0), a[0]);
            carry_late(a[0], old, 0);
            assert_eq!(waited(ep), Some(7), "the late registration was lost");
            for fd in [ep, a[0], a[1], b[0], b[1], held] {
                crate::shim::sys::close(fd);
            }
        }
    }

    /// Carried onto a file that would show what the new socket's kind
    /// never does (a doorbell, a Unix socket: `POLLWRBAND` when writable;
    /// TCP never), a registration asking for it no longer asks: a program
    /// waiting for input and `EPOLLWRBAND` is not woken by the doorbell's
    /// room, only by input, and the events carried say so.
    #[test]
    fn a_registration_carried_leaves_out_what_the_kind_never_shows() {
        let (ep, a, b) = watched_pipe();
        let mut pair = [0; 2];
        // SAFETY: plain descriptor calls on the test's pipes, pair and set.
        unsafe {
            assert_eq!(
                libc::socketpair(libc::AF_UNIX, libc::SOCK_STREAM, 0, pair.as_mut_ptr()),
                0
            );
            let mut ev = libc::epoll_event {
                events: (libc::EPOLLIN | libc::EPOLLWRBAND) as u32,
                u64: 42,
            };
            assert_eq!(libc::epoll_ctl(ep, libc::EPOLL_CTL_MOD, a[0], &mut ev), 0);
            let hide = libc::EPOLLWRBAND as u32;
            let (n, regs) = dup3_carrying_sets(pair[0], a[0], 0, hide);
            assert_eq!(n, a[0]);
            assert_eq!(regs.len(), 1);
            // (The kernel's fdinfo adds `EPOLLERR | EPOLLHUP`, always on.)
            let carried = regs[0].events;
            assert_eq!(
                carried & (libc::EPOLLIN | libc::EPOLLWRBAND) as u32,
                libc::EPOLLIN as u32,
                "carried as asked: {carried:#x}"
            );
            let mut out = [libc::epoll_event { events: 0, u64: 0 }; 4];
            assert_eq!(
                libc::epoll_wait(ep, out.as_mut_ptr(), 4, 0),
                0,
                "woken by the Unix socket's room"
            );
            assert_eq!(libc::write(pair[1], b"x".as_ptr().cast(), 1), 1);
            assert_eq!(libc::epoll_wait(ep, out.as_mut_ptr(), 4, 5000), 1);
            let got = out[0];
            assert_eq!((got.events, got.u64), (libc::EPOLLIN as u32, 42));
            for fd in [ep, a[0], a[1], b[0], b[1], pair[0], pair[1]] {
                crate::shim::sys::close(fd);
            }
        }
    }

    #[test]
    fn a_level_triggered_registration_follows_the_swap() {
        let (ep, a, b) = watched_pipe();
        // a[0] comes to name b's read end, which has a byte waiting.
        assert_eq!(dup3_carrying(b[0], a[0], 0), a[0]);
        assert_eq!(
            waited(ep),
            Some(42),
            "the registration did not follow the swap"
        );
        for fd in [ep, a[0], a[1], b[0], b[1]] {
            crate::shim::sys::close(fd);
        }
    }
}
