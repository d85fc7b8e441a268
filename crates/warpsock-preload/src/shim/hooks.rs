//! Test hooks, compiled only with the `test-hooks` feature (the shipped
//! library has none): delays that let the integration tests make a race
//! happen in a chosen order, deterministically. The tests build their own
//! copy of the library with the feature (`tests/common`, used by `tests/preload.rs`,
//! `tests/readiness.rs` and the others).

use std::sync::OnceLock;
use std::time::Duration;

fn ms(var: &str) -> Option<Duration> {
    std::env::var(var)
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|&ms| ms > 0)
        .map(Duration::from_millis)
}

/// The DDP kind's `_exit` flush ended, with its bytes gone (`idle`) or
/// given up on: one line on stderr, written with `write` (no allocation:
/// the flush may run in a signal handler).
pub(crate) fn exit_flushed(idle: bool) {
    let line: &[u8] = if idle {
        b"warpsock test: exit flush idle\n"
    } else {
        b"warpsock test: exit flush gave up\n"
    };
    // SAFETY: a write of a static buffer to stderr.
    unsafe { libc::write(2, line.as_ptr().cast(), line.len()) };
}

/// `WARPSOCK_TEST_TIMER_DELAY_MS`: the progress thread waits this long
/// before looking at its timers while any handler has a deadline, as if it
/// had been descheduled between its wait and the timers, so that a set-up
/// answer arrives after the deadline but before the timer runs.
pub(crate) fn timer_delay() -> Option<Duration> {
    static V: OnceLock<Option<Duration>> = OnceLock::new();
    *V.get_or_init(|| ms("WARPSOCK_TEST_TIMER_DELAY_MS"))
}

/// With [`timer_delay`] set, how long (ms) a late timer's look for the
/// answer it awaits may wait for it: 10 s, so that a peer slower than the
/// delay (a loaded machine: the preload test failed at load 13 with the
/// fixed 100 ms alone) still answers before the timer decides, and the
/// test sees the rescue every time. 0 (look, do not wait) otherwise, as in
/// the shipped library.
pub(crate) fn late_timer_answer_wait_ms() -> libc::c_int {
    if timer_delay().is_some() {
        10_000
    } else {
        0
    }
}

/// `WARPSOCK_TEST_UDP_READY_DELAY_MS`: the progress thread waits this long
/// before handling an arrival on a hidden kernel UDP socket, so that a
/// receive call takes the datagram first. `WARPSOCK_TEST_UDP_READY_LATE_MS`
/// likewise, but only on a socket that awaits no proof (`awaiting` false):
/// a connection's set-up runs at full speed (its proof answered before the
/// connector re-sends it), the program's datagrams later find the progress
/// thread late.
pub(crate) fn udp_ready_delay(awaiting: bool) -> Option<Duration> {
    static V: OnceLock<Option<Duration>> = OnceLock::new();
    static LATE: OnceLock<Option<Duration>> = OnceLock::new();
    let late = || *LATE.get_or_init(|| ms("WARPSOCK_TEST_UDP_READY_LATE_MS"));
    V.get_or_init(|| ms("WARPSOCK_TEST_UDP_READY_DELAY_MS"))
        .or_else(|| late().filter(|_| !awaiting))
}

/// `WARPSOCK_TEST_ADOPT_DELAY_MS`: the thread that saw an accepted
/// connection prove its sender waits this long before adopting the route
/// to that sender, as if descheduled there, so that a receive call of the
/// program would take the first datagram first if it could (it cannot:
/// the route is adopted under the connection's `order`).
pub(crate) fn adopt_delay() {
    static V: OnceLock<Option<Duration>> = OnceLock::new();
    if let Some(d) = *V.get_or_init(|| ms("WARPSOCK_TEST_ADOPT_DELAY_MS")) {
        std::thread::sleep(d);
    }
}

/// `WARPSOCK_TEST_PARK_GRACE_MS`: how long a connection may stay parked
/// before the progress thread's timer gives it back (instead of 10 ms), so
/// that a test can turn that safety net off and see that the waits give
/// parked connections back by themselves.
pub(crate) fn park_grace() -> Option<Duration> {
    static V: OnceLock<Option<Duration>> = OnceLock::new();
    *V.get_or_init(|| ms("WARPSOCK_TEST_PARK_GRACE_MS"))
}

/// `WARPSOCK_TEST_EXEC_ARMED_FD`: an exec whose wait gave up, once it has
/// marked the connections it gave up on (`SO_LINGER` {1, 0}), writes a
/// byte to this descriptor and waits for one back before it goes on: a
/// test's other thread closes a socket in that window (review r23-a item
/// 10).
pub(crate) fn exec_armed() {
    let Some(fd) = std::env::var("WARPSOCK_TEST_EXEC_ARMED_FD")
        .ok()
        .and_then(|v| v.trim().parse::<libc::c_int>().ok())
    else {
        return;
    };
    let mut b = [0u8; 1];
    // SAFETY: one-byte transfers on the test's socket, from and into a
    // buffer on the stack.
    unsafe {
        super::real::send(fd, b"!".as_ptr().cast(), 1, libc::MSG_NOSIGNAL);
        super::real::recv(fd, b.as_mut_ptr().cast(), 1, 0);
    }
}

/// `WARPSOCK_TEST_SERVE_GAP_FD`: the first receive call that serves a
/// connection off the ready list and finds it drained (the read after its
/// datagram said `EAGAIN`) stops there, before it takes the connection off
/// the list, as if descheduled: it writes a byte to this descriptor (the
/// test program's cue to send the connection another datagram), waits for
/// that datagram to reach the connection's socket (at most 5 s), then gives
/// the progress thread up to 500 ms to take it up (it cannot while the call
/// holds the connection's `order` lock: then the wait runs out). The
/// program then sees whether the new datagram is announced.
pub(crate) fn serve_gap(conn_fd: libc::c_int) {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Instant;
    static FD: OnceLock<Option<libc::c_int>> = OnceLock::new();
    static FIRED: AtomicBool = AtomicBool::new(false);
    let fd = *FD.get_or_init(|| {
        std::env::var("WARPSOCK_TEST_SERVE_GAP_FD")
            .ok()
            .and_then(|v| v.trim().parse().ok())
    });
    let Some(fd) = fd else { return };
    if conn_fd < 0 || FIRED.swap(true, Ordering::Relaxed) {
        return;
    }
    // SAFETY: a one-byte write from a static buffer to the test's socket.
    unsafe {
        super::real::send(fd, b"!".as_ptr().cast(), 1, libc::MSG_NOSIGNAL);
    }
    let readable = |ms| {
        let mut p = [libc::pollfd {
            fd: conn_fd,
            events: libc::POLLIN,
            revents: 0,
        }];
        super::sys::poll(&mut p, ms) > 0 && p[0].revents & libc::POLLIN != 0
    };
    if !readable(5000) {
        return;
    }
    let end = Instant::now() + Duration::from_millis(500);
    while readable(0) && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// `WARPSOCK_TEST_NAME_GAP=1`: `getsockname`/`getpeername` of a managed
/// socket, between its look-up and its system call, waits (at most 10 s)
/// while `under_way` (no accepted connection's switch is, the caller's
/// predicate), as if descheduled there while the switch ended and its
/// thread let the socket go.
pub(crate) fn name_gap(under_way: impl Fn() -> bool) {
    static ON: OnceLock<bool> = OnceLock::new();
    if on(&ON, "WARPSOCK_TEST_NAME_GAP") {
        wait_while(under_way);
    }
}

/// Whether the variable `var` is "1" (read once, into `at`).
fn on(at: &OnceLock<bool>, var: &str) -> bool {
    *at.get_or_init(|| std::env::var(var).is_ok_and(|v| v == "1"))
}

/// Waits while `cond()`, at most 10 s, in pauses that grow.
fn wait_while(cond: impl Fn() -> bool) {
    let end = std::time::Instant::now() + Duration::from_secs(10);
    let mut round = 0;
    while cond() && std::time::Instant::now() < end {
        super::sys::pause(round);
        round = round.saturating_add(1);
    }
}

/// `WARPSOCK_TEST_SWITCH_PANIC=1`: an accepted connection's background
/// switch panics as it begins (`xsock::switching`), as a bug in it would.
pub(crate) fn switch_panic() {
    static ON: OnceLock<bool> = OnceLock::new();
    if on(&ON, "WARPSOCK_TEST_SWITCH_PANIC") {
        panic!("WARPSOCK_TEST_SWITCH_PANIC: the switch panics");
    }
}

/// The re-entrancy audit (`scripts/test-xsock.sh` runs DDP-mode programs
/// under this build and reads the counters from the `WARPSOCK_STATS`
/// report): every call that reaches an interposed entry point's dispatch
/// is classified.
pub(crate) mod audit {
    use std::sync::atomic::{AtomicU64, Ordering};

    use crate::shim::guard::busy;

    /// Calls made by library code (the engine's own system calls among
    /// them) that reached an entry point and were passed to the real
    /// function by the guard.
    static GUARDED: AtomicU64 = AtomicU64::new(0);
    /// Calls from the library's own threads (`warpsock-*`) that reached an
    /// entry point without the guard: they could have entered a managed
    /// path. Must stay 0.
    static UNGUARDED: AtomicU64 = AtomicU64::new(0);
    /// Library code entered from library code (`guard::enter` with the
    /// guard already set). Must stay 0.
    static NESTED: AtomicU64 = AtomicU64::new(0);

    /// An interposed call is being dispatched.
    pub(crate) fn call() {
        if busy() {
            GUARDED.fetch_add(1, Ordering::Relaxed);
        } else if std::thread::current()
            .name()
            .is_some_and(|n| n.starts_with("warpsock"))
        {
            UNGUARDED.fetch_add(1, Ordering::Relaxed);
            if std::env::var_os("WARPSOCK_TEST_AUDIT_TRACE").is_some() {
                eprintln!("{}", std::backtrace::Backtrace::force_capture());
            }
        }
    }

    /// Data calls that took the managed path's look-up (`interpose`'s
    /// `dispatch_managed`): a descriptor the library does not manage must
    /// never (its calls cost the one check of the descriptor table).
    static MANAGED_LOOKS: AtomicU64 = AtomicU64::new(0);

    /// A data call takes the managed path's look-up.
    pub(crate) fn managed_look() {
        MANAGED_LOOKS.fetch_add(1, Ordering::Relaxed);
    }

    /// [`managed_look`]'s count.
    pub(crate) fn managed_looks() -> u64 {
        MANAGED_LOOKS.load(Ordering::Relaxed)
    }

    /// `guard::enter` found the guard set.
    pub(crate) fn nested() {
        NESTED.fetch_add(1, Ordering::Relaxed);
    }

    /// The counters' report lines.
    pub(crate) fn report() -> String {
        let v = |a: &AtomicU64| a.load(Ordering::Relaxed);
        format!(
            "reentry_guarded {}\nreentry_unguarded {}\nreentry_nested {}\n",
            v(&GUARDED),
            v(&UNGUARDED),
            v(&NESTED)
        )
    }
}
