//! The per-thread re-entrancy guard and the panic boundary.
//!
//! Library code runs under [`enter`]: while it does, the calling thread's
//! guard is set, and the interposed entry points pass every call straight
//! to the real function (calls the library makes itself, such as `malloc`
//! calling `write` or a kind's own `socket()`, never re-enter a managed
//! path). A panic inside becomes `EIO` and the error value, never an unwind
//! into C.
//!
//! The flag is one byte of thread-local storage that every data call of a
//! managed socket reads and writes three times. A `thread_local!` of a
//! shared library uses the general-dynamic TLS model, a call of
//! `__tls_get_addr` (11 instructions and the call) per access. On x86-64
//! Linux the byte is instead in the static TLS block (the initial-exec
//! model): its offset from the thread pointer is read from the GOT and
//! added to `%fs:0`, two instructions. The library is loaded at start-up
//! (`LD_PRELOAD`), where the static block always has room; the linker
//! marks the object `STATIC_TLS`. Other targets keep the `thread_local!`.

use std::cell::Cell;
use std::panic::{catch_unwind, AssertUnwindSafe};

use super::sys::set_errno;

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
mod flag {
    use std::cell::Cell;

    // One zero-initialised byte of the thread-local (`.tbss`) image,
    // hidden: the library's own, never exported or interposed.
    std::arch::global_asm!(
        ".pushsection .tbss,\"awT\",@nobits",
        ".globl warpsock_guard_busy",
        ".hidden warpsock_guard_busy",
        ".type warpsock_guard_busy,@object",
        ".size warpsock_guard_busy,1",
        "warpsock_guard_busy:",
        ".zero 1",
        // The thread's hazard slot (`fdtable`'s look-up): eight bytes.
        ".globl warpsock_hazard_slot",
        ".hidden warpsock_hazard_slot",
        ".type warpsock_hazard_slot,@object",
        ".size warpsock_hazard_slot,8",
        ".balign 8",
        "warpsock_hazard_slot:",
        ".zero 8",
        // How many holds of `fdtable`'s map lock the thread has (`map_held`).
        ".globl warpsock_map_held",
        ".hidden warpsock_map_held",
        ".type warpsock_map_held,@object",
        ".size warpsock_map_held,4",
        ".balign 4",
        "warpsock_map_held:",
        ".zero 4",
        // The thread's registrations in `fdtable`'s lock wait (`map_waits`).
        ".globl warpsock_map_waits",
        ".hidden warpsock_map_waits",
        ".type warpsock_map_waits,@object",
        ".size warpsock_map_waits,4",
        ".balign 4",
        "warpsock_map_waits:",
        ".zero 4",
        ".popsection",
    );

    /// This thread's copy of the `.tbss` symbol `$sym`, as `&'static $t`.
    macro_rules! tls {
        ($sym:literal, $t:ty) => {{
            let p: *const $t;
            // SAFETY: the x86-64 TLS ABI: `%fs:0` holds the thread pointer,
            // and the GOT entry (R_X86_64_TPOFF64) the symbol's offset from
            // it; the sum is the address of this thread's copy, which lives
            // as long as the thread. The asm reads only the TCB word and the
            // GOT (constant for the thread: `pure`, so repeated calls in one
            // function fold). Each symbol is zero-initialised, sized and
            // aligned for its type (above), where zero is a valid value, and
            // only ever written through its `Cell`, by its own thread
            // (`&Cell` is not `Send`).
            unsafe {
                std::arch::asm!(
                    "mov {p}, qword ptr fs:[0]",
                    concat!("add {p}, qword ptr [rip + ", $sym, "@GOTTPOFF]"),
                    p = out(reg) p,
                    options(pure, readonly, nostack, preserves_flags),
                );
                &*p
            }
        }};
    }

    /// The calling thread's flag (a zero byte is `false`).
    #[inline(always)]
    pub(super) fn get() -> &'static Cell<bool> {
        tls!("warpsock_guard_busy", Cell<bool>)
    }

    /// The calling thread's hazard slot (see [`super::slot`]).
    #[inline(always)]
    pub(super) fn slot() -> &'static Cell<usize> {
        tls!("warpsock_hazard_slot", Cell<usize>)
    }

    /// The calling thread's count of map-lock holds (see [`super::map_held`]).
    #[inline(always)]
    pub(super) fn map_held() -> &'static Cell<u32> {
        tls!("warpsock_map_held", Cell<u32>)
    }

    /// The calling thread's registrations in the lock's wait (see
    /// [`super::map_waits`]).
    #[inline(always)]
    pub(super) fn map_waits() -> &'static Cell<u32> {
        tls!("warpsock_map_waits", Cell<u32>)
    }

    /// Adds `D` (wrapping) to the thread's count word in one instruction.
    #[inline(always)]
    pub(super) fn map_held_add<const D: u32>(c: &Cell<u32>) {
        let p = c.as_ptr();
        // SAFETY: the thread's own word (`map_held`), written only by its
        // thread; one `add` to memory, which a signal cannot split.
        unsafe {
            std::arch::asm!(
                "add dword ptr [{p}], {d}",
                p = in(reg) p,
                d = const D,
                options(nostack),
            );
        }
    }

    /// Sets bits `B` of the thread's count word in one instruction.
    #[inline(always)]
    pub(super) fn map_held_or<const B: u32>(c: &Cell<u32>) {
        let p = c.as_ptr();
        // SAFETY: as `map_held_add`.
        unsafe {
            std::arch::asm!(
                "or dword ptr [{p}], {b}",
                p = in(reg) p,
                b = const B,
                options(nostack),
            );
        }
    }
}

#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
mod flag {
    use std::cell::Cell;

    thread_local! {
        static BUSY: Cell<bool> = const { Cell::new(false) };
        static SLOT: Cell<usize> = const { Cell::new(0) };
        static MAP_HELD: Cell<u32> = const { Cell::new(0) };
        static MAP_WAITS: Cell<u32> = const { Cell::new(0) };
    }

    /// The calling thread's registrations in the lock's wait (see
    /// [`super::map_waits`]).
    #[inline(always)]
    pub(super) fn map_waits() -> &'static Cell<u32> {
        // SAFETY: as `get`.
        MAP_WAITS.with(|b| unsafe { &*(b as *const Cell<u32>) })
    }

    /// The calling thread's count of map-lock holds (see [`super::map_held`]).
    #[inline(always)]
    pub(super) fn map_held() -> &'static Cell<u32> {
        // SAFETY: as `get`.
        MAP_HELD.with(|b| unsafe { &*(b as *const Cell<u32>) })
    }

    /// The calling thread's hazard slot number (see [`super::slot`]).
    #[inline(always)]
    pub(super) fn slot() -> &'static Cell<usize> {
        // SAFETY: as `get`.
        SLOT.with(|b| unsafe { &*(b as *const Cell<usize>) })
    }

    /// The calling thread's flag.
    #[inline(always)]
    pub(super) fn get() -> &'static Cell<bool> {
        // SAFETY: the reference is used only by this thread, while it
        // runs (`&Cell` is not `Send`).
        BUSY.with(|b| unsafe { &*(b as *const Cell<bool>) })
    }

    /// Adds `D` (wrapping) to the thread's count word: a load and a
    /// store here (a handler between them can lose a bit it sets; the
    /// x86-64 build's is one instruction).
    #[inline(always)]
    pub(super) fn map_held_add<const D: u32>(c: &Cell<u32>) {
        c.set(c.get().wrapping_add(D));
    }

    /// Sets bits `B` of the thread's count word (as `map_held_add`).
    #[inline(always)]
    pub(super) fn map_held_or<const B: u32>(c: &Cell<u32>) {
        c.set(c.get() | B);
    }
}

/// The calling thread's slot in `fdtable`'s hazard table, in the same
/// static TLS block as the guard's flag (two instructions to reach; a
/// `thread_local!` of the library would be a `__tls_get_addr` call per
/// managed data call): 0 while the thread has none, else the slot's
/// address, or 1 once it may take none (the table was full, or the thread
/// is exiting). Only `fdtable::hazard` reads or writes it.
#[inline]
pub(crate) fn slot() -> &'static Cell<usize> {
    flag::slot()
}

/// How many holds of `fdtable`'s map lock the calling thread has now, and
/// the work left to the end of the last (kept by `fdtable` only, which
/// encodes them; raised before the lock's try, a wait for the lock
/// counted apart): a call that a signal handler, or another
/// library's atfork handler, makes over code of this thread holding the
/// lock must not take it again (review r18-xhaz item 2). Static TLS, as
/// the guard's flag: a handler's first read allocates nothing.
#[inline]
pub(crate) fn map_held() -> &'static Cell<u32> {
    flag::map_held()
}

/// How many registrations in `fdtable`'s wait for its lock the calling
/// thread has (a wait's, and a handler's over it that waits too): a
/// forked child's count of waiters is its thread's (review r21-c item 2:
/// the wait marks, raised only over the sleeps, missed a registration
/// before or after them). Static TLS, as [`map_held`]: a handler's
/// first read allocates nothing. Changed by [`map_held_add`] (one
/// instruction; a handler's changes are balanced).
#[inline]
pub(crate) fn map_waits() -> &'static Cell<u32> {
    flag::map_waits()
}

/// Adds `D` (wrapping: a negative step as its two's complement) to
/// [`map_held`] (`c`, its cell: the caller reads it after through the
/// same address) in one instruction on x86-64: a signal handler that sets
/// a bit of the word ([`map_held_or`]) between a load and a store of it
/// would have the bit lost (review r21-b item 7; a handler's own changes
/// of the count are balanced, so only its bits are at stake). Also a
/// compiler barrier (the asm may touch memory).
#[inline(always)]
pub(crate) fn map_held_add<const D: u32>(c: &Cell<u32>) {
    flag::map_held_add::<D>(c);
}

/// Sets bits `B` of [`map_held`] in one instruction on x86-64 (as
/// [`map_held_add`]; a handler over a handler's update, too).
#[inline(always)]
pub(crate) fn map_held_or<const B: u32>(c: &Cell<u32>) {
    flag::map_held_or::<B>(c);
}

/// Whether the calling thread is inside library code.
#[inline]
pub(crate) fn busy() -> bool {
    flag::get().get()
}

/// Whether an exit entered now interrupted a stretch of library code that
/// may hold a lock — a signal handler's `exit` over a call of this thread
/// that is not asleep in one of the lock-free sleeps
/// ([`warpsock_engine::asleep`]): the socket locks, the engines', the
/// process's lists, or malloc's own (a library call that was allocating).
/// Such an exit allocates nothing and takes no lock for good: each kind's
/// exit path keeps to its bounded, allocation-free part (review r26-a item
/// 1; the UDP kind's linger allocated, and a SIGTERM that landed in a
/// `malloc` under the library hung the exit: `ddp_exitclose`'s spin case).
/// A marked sleep inside library code nested over a locked stretch
/// ([`enter`]'s nested arm, [`LOCKED_BELOW`]) is such a stretch too: the
/// sleep holds no lock, the frame under it may.
pub(crate) fn exit_over_held_locks() -> bool {
    busy() && (!warpsock_engine::asleep::asleep() || locked_below())
}

/// Whether the calling thread runs nested over a stretch of library code
/// that may hold a lock ([`LOCKED_BELOW`]): a signal handler's call over a
/// call of the library's that was not asleep. Code here must not wait for
/// a lock the frame under it may hold (one try only).
pub(crate) fn locked_below() -> bool {
    LOCKED_BELOW.with(Cell::get) > 0
}

thread_local! {
    /// How many of the calling thread's nested [`enter`]s run over a
    /// stretch that may hold a lock (no sleep marked under them, or its
    /// mark taken by an exit: `ExitOver::now` clears it, so the closes of
    /// an exit over a sleep count here too — safe, a further signal's
    /// exit in them is told `Locks`; review r28-b item 8): while
    /// any does, a marked sleep of the code nested there is no lock-free
    /// sleep for an exit ([`exit_over_held_locks`]). A handler's `exit`
    /// over a locked stretch runs its bytes-only wait nested
    /// (`each_own_sock_trying`, a drop); a further signal's exit over a
    /// marked engine sleep in there was taken as one over a sleep, and
    /// closed or flushed with blocking locks over the interrupted frame,
    /// which may hold them (review r27-b item 5). A `const` thread-local
    /// of a `Copy` type: a handler's first access allocates nothing.
    static LOCKED_BELOW: Cell<u32> = const { Cell::new(0) };
}

/// One count of [`LOCKED_BELOW`], given back at its drop (also by a
/// panic's unwinding).
struct LockedBelow;

impl LockedBelow {
    fn raise() -> Self {
        LOCKED_BELOW.with(|c| c.set(c.get() + 1));
        Self
    }
}

impl Drop for LockedBelow {
    fn drop(&mut self) {
        LOCKED_BELOW.with(|c| c.set(c.get() - 1));
    }
}

/// Runs `f` with the guard cleared, set again after (also if `f`
/// panics): `f`'s calls of interposed functions reach the library as the
/// program's would. For an exit over a call's sleep that holds no lock
/// ([`ExitOver::Sleep`], its wait given back): the stdio exit flush's
/// writes (`interpose::stdio::flush_at_exit`; review r27-b item 1).
pub(crate) fn outside<R>(f: impl FnOnce() -> R) -> R {
    struct Set<'a>(&'a Cell<bool>, bool);
    impl Drop for Set<'_> {
        fn drop(&mut self) {
            self.0.set(self.1);
        }
    }
    let flag: &Cell<bool> = flag::get();
    let _set = Set(flag, flag.replace(false));
    f()
}

/// What an exit's handler ran over, found once for every kind before any
/// of them runs ([`ExitOver::now`], `Kind::at_exit`): finding it takes the
/// sleep's mark ([`warpsock_engine::asleep::abandon`]), so a kind that
/// looked after another took it would see a locked stretch, and the
/// exit's behaviour hung on the order of `interpose::KINDS` (review r26-d
/// item 6).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ExitOver {
    /// No call of the library (the guard clear): the program's own code.
    Nothing,
    /// A call's sleep that holds no lock (its mark, now taken): the exit
    /// may close as from outside, the sleep's wait given back first.
    Sleep(warpsock_engine::asleep::Slept),
    /// A stretch of a call that may hold a lock
    /// ([`exit_over_held_locks`]): no lock taken for good, no allocation.
    Locks,
}

impl ExitOver {
    /// What the calling thread's exit runs over; the sleep's mark is taken
    /// (cleared: the sleep never comes back).
    pub(crate) fn now() -> Self {
        Self::of(warpsock_engine::asleep::abandon)
    }

    /// As [`Self::now`], the sleep's mark left as it is (`_exit`'s look:
    /// a child made by `vfork` shares its parent's thread's mark).
    pub(crate) fn seen() -> Self {
        Self::of(warpsock_engine::asleep::slept)
    }

    fn of(sleep: fn() -> Option<warpsock_engine::asleep::Slept>) -> Self {
        if !busy() {
            return Self::Nothing;
        }
        if exit_over_held_locks() {
            return Self::Locks;
        }
        sleep().map_or(Self::Locks, Self::Sleep)
    }
}

/// Runs library code under the guard and the panic boundary: returns `f`'s
/// value, or `err` with errno `EIO` if it panicked.
///
/// Nested (the guard already set), `f` runs marked as in no sleep
/// ([`warpsock_engine::asleep::awake`]): `f` may take locks, and an exit
/// from a signal over it must be taken as over a locked stretch
/// ([`exit_over_held_locks`]), not over the sleep the mark names (review
/// r26-d item 3). Only the library's own entries nest so — an exit's
/// flush or closes from a signal handler over a call of the thread
/// (`_exit`'s flush, `each_own_sock_as`), or after a `siglongjmp` out of
/// one, which left the guard set and, out of a sleep, that sleep's mark;
/// a drop of a socket's last reference there: the interposed functions
/// themselves pass a call made while the guard is set to the real ones
/// (`busy`), so neither a handler's call nor a call after a jump comes
/// here (review r27-b item 6). The mark is put back after: the sleep
/// under a handler goes on; the one a `siglongjmp` left holds no lock
/// either (the program's code runs there now). Nested over a stretch
/// that may hold a lock (no sleep marked under it, or its mark taken by
/// an exit), `f`'s own marked
/// sleeps count as such a stretch too ([`LOCKED_BELOW`]: review r27-b
/// item 5). The outermost entry costs nothing more (no mark can be set
/// without the guard).
pub(crate) fn enter<T>(err: T, f: impl FnOnce() -> T) -> T {
    let flag: &Cell<bool> = flag::get();
    let prev = flag.replace(true);
    let r = if prev {
        nested(f)
    } else {
        catch_unwind(AssertUnwindSafe(f))
    };
    flag.set(prev);
    r.unwrap_or_else(|_| {
        set_errno(libc::EIO);
        err
    })
}

/// [`enter`]'s nested arm, out of line (the outermost entry's frame and
/// code stay as they were: every data call's).
#[cold]
#[inline(never)]
fn nested<T>(f: impl FnOnce() -> T) -> std::thread::Result<T> {
    #[cfg(feature = "test-hooks")]
    super::hooks::audit::nested();
    // Over a stretch that may hold a lock (no sleep marked under this
    // entry, or one nested over such a stretch already), the code nested
    // here counts as one, its sleeps included (review r27-b item 5).
    let _below = exit_over_held_locks().then(LockedBelow::raise);
    warpsock_engine::asleep::awake(|| catch_unwind(AssertUnwindSafe(f)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The flag is set inside `enter` only, restored after a nested call
    /// and after a panic, and is each thread's own: another thread, and a
    /// thread started while this one is inside, see it clear.
    #[test]
    fn the_guard_is_per_thread_and_restored() {
        assert!(!busy());
        let inner = enter(None, || {
            assert!(busy());
            let other = std::thread::spawn(|| {
                let before = busy();
                (before, enter(false, busy), busy())
            })
            .join()
            .unwrap();
            assert!(busy(), "another thread's enter left this one's set");
            let nested = enter(false, busy);
            Some((other, nested, busy()))
        });
        assert_eq!(inner, Some(((false, true, false), true, true)));
        assert!(!busy());
        let r = enter(-1, || -> i32 { panic!("inside (this test's own panic)") });
        assert_eq!(r, -1);
        assert_eq!(crate::shim::sys::errno(), libc::EIO);
        assert!(!busy(), "a panic left the guard set");
    }

    /// Library code entered over a marked sleep of its thread (an exit's
    /// flush or closes from a handler over the interposed `poll`'s, or
    /// after a `siglongjmp` out of it; the interposed functions pass a
    /// program's call there to the real ones) is code an exit must take
    /// as over held locks; the sleep's mark is back
    /// once it returns, and after a panic in it (review r26-d item 3).
    /// Fails (`false` inside) with the nested entry's mark left as found.
    #[test]
    fn a_call_nested_over_a_marked_sleep_counts_as_holding_locks() {
        use warpsock_engine::asleep::unlocked;
        let seen = enter((false, false, false), || {
            unlocked(|| {
                assert!(!exit_over_held_locks(), "over the sleep itself");
                let nested = enter(false, exit_over_held_locks);
                let after = !exit_over_held_locks();
                enter((), || panic!("nested (this test's own panic)"));
                (nested, after, !exit_over_held_locks())
            })
        });
        assert_eq!(seen, (true, true, true));
        assert!(!busy() && !warpsock_engine::asleep::asleep());
    }

    /// A marked sleep of library code nested over a stretch that may hold
    /// a lock (an exit's bytes-only wait from a handler over a call's
    /// locked stretch) is no lock-free sleep: an exit over it is told
    /// `Locks`, not `Sleep`; the count is given back when the nested code
    /// ends, normally or by a panic, and a nested entry over a real sleep
    /// still sees its own sleeps as such (review r27-b item 5). Fails
    /// (`Sleep` over the nested sleep) without the count.
    #[test]
    fn a_sleep_nested_over_a_locked_stretch_counts_as_holding_locks() {
        use warpsock_engine::asleep::unlocked;
        let sleeping = |o: &ExitOver| matches!(o, ExitOver::Sleep(_));
        let (over_locked, after) = enter((None, false), || {
            let inner = enter(None, || unlocked(|| Some(ExitOver::now())));
            enter((), || unlocked(|| panic!("nested (this test's own panic)")));
            let after = enter(false, || unlocked(exit_over_held_locks));
            (inner, after)
        });
        assert_eq!(over_locked, Some(ExitOver::Locks), "over the nested sleep");
        assert!(after, "after a panic: still over the locked stretch");
        assert_eq!(LOCKED_BELOW.with(Cell::get), 0, "given back");
        let over_sleep = enter(None, || {
            unlocked(|| enter(None, || unlocked(|| Some(ExitOver::now()))))
        });
        assert!(over_sleep.is_some_and(|o| sleeping(&o)), "{over_sleep:?}");
        assert_eq!(LOCKED_BELOW.with(Cell::get), 0);
    }
}
