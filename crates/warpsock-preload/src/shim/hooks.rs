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
