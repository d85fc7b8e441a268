//! Test hooks, compiled only with the `test-hooks` feature (the shipped
//! library has none): delays that let the integration tests make a race
//! happen in a chosen order, deterministically. The tests build their own
//! copy of the library with the feature (`tests/preload.rs`).

use std::sync::OnceLock;
use std::time::Duration;

fn ms(var: &str) -> Option<Duration> {
    std::env::var(var)
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|&ms| ms > 0)
        .map(Duration::from_millis)
}

/// `WARPSOCK_TEST_TIMER_DELAY_MS`: the progress thread waits this long
/// before looking at its timers while any handler has a deadline, as if it
/// had been descheduled between its wait and the timers, so that a set-up
/// answer arrives after the deadline but before the timer runs.
pub(crate) fn timer_delay() -> Option<Duration> {
    static V: OnceLock<Option<Duration>> = OnceLock::new();
    *V.get_or_init(|| ms("WARPSOCK_TEST_TIMER_DELAY_MS"))
}

/// `WARPSOCK_TEST_UDP_READY_DELAY_MS`: the progress thread waits this long
/// before handling an arrival on a hidden kernel UDP socket, so that a
/// receive call takes the datagram first.
pub(crate) fn udp_ready_delay() -> Option<Duration> {
    static V: OnceLock<Option<Duration>> = OnceLock::new();
    *V.get_or_init(|| ms("WARPSOCK_TEST_UDP_READY_DELAY_MS"))
}

/// `WARPSOCK_TEST_PARK_GRACE_MS`: how long a connection may stay parked
/// before the progress thread's timer gives it back (instead of 10 ms), so
/// that a test can turn that safety net off and see that the waits give
/// parked connections back by themselves.
pub(crate) fn park_grace() -> Option<Duration> {
    static V: OnceLock<Option<Duration>> = OnceLock::new();
    *V.get_or_init(|| ms("WARPSOCK_TEST_PARK_GRACE_MS"))
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
