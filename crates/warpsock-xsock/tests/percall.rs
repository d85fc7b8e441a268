//! The work of one small message on a DDP socket, counted (never timed):
//! heap allocations made by the calling thread, and waits in the engine.
//! An 8-byte ping-pong is the latency path: each round trip is a send
//! and a blocking receive on either end, and neither may allocate; a
//! receive waits in the engine once (for the peer's answer), not also for
//! the completion of its own end's last Send.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::Ordering::SeqCst;
use std::time::Instant;

use warpsock_xsock::io::{RecvFlags, XSocket};

mod net;

use net::{opts, switch_both, tcp_pair, LIMIT};

thread_local! {
    /// Allocations (and reallocations) made by this thread.
    static ALLOCS: Cell<u64> = const { Cell::new(0) };
}

/// The system allocator, counting per thread (other tests of this binary
/// run in threads of their own and do not disturb the count).
struct Counting;

// SAFETY: forwards to the system allocator unchanged.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        ALLOCS.with(|c| c.set(c.get() + 1));
        // SAFETY: the caller's layout.
        unsafe { System.alloc(l) }
    }

    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: `p` came from `alloc` with `l`.
        unsafe { System.dealloc(p, l) }
    }

    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        ALLOCS.with(|c| c.set(c.get() + 1));
        // SAFETY: as in `dealloc`.
        unsafe { System.realloc(p, l, new) }
    }
}

#[global_allocator]
static A: Counting = Counting;

fn allocs() -> u64 {
    ALLOCS.with(Cell::get)
}

/// Receives exactly `out.len()` bytes (blocking calls).
fn recv_into(x: &XSocket, out: &mut [u8]) {
    let mut got = 0;
    let t = Instant::now();
    while got < out.len() {
        assert!(t.elapsed() < LIMIT, "timed out with {got}/{}", out.len());
        let (k, _) = x
            .recv(&mut out[got..], RecvFlags::default(), Some(LIMIT))
            .unwrap();
        assert!(k > 0, "end of stream after {got}");
        got += k;
    }
}

/// One side of `rounds` 8-byte round trips (`ping`: sends first). Returns
/// the allocations its thread made and the waits its socket counted.
fn side(x: &XSocket, ping: bool, rounds: u64) -> (u64, u64) {
    let (a0, w0) = (allocs(), x.stats().waits.load(SeqCst));
    let mut m = [0u8; 8];
    for i in 0..rounds {
        if ping {
            x.send(&i.to_le_bytes(), false, None).unwrap();
            recv_into(x, &mut m);
            assert_eq!(m, i.to_le_bytes());
        } else {
            recv_into(x, &mut m);
            x.send(&m, false, None).unwrap();
        }
    }
    (allocs() - a0, x.stats().waits.load(SeqCst) - w0)
}

/// Round trips measured after the warm-up (the connection's start, the
/// books' first use).
const ROUNDS: u64 = 300;
const WARM: u64 = 20;

/// Runs `side` on a switched pair, the ping end here and the pong end in a
/// thread of its own: [`WARM`] round trips, then [`ROUNDS`] measured.
/// Returns what each end's measured run returned.
fn ping_pong<T: Send>(side: fn(&XSocket, bool, u64) -> T) -> (T, T) {
    let (a, b) = tcp_pair();
    let (xa, xb) = switch_both(&a, &b, &opts());
    std::thread::scope(|sc| {
        let pong = sc.spawn(|| {
            side(&xb, false, WARM);
            side(&xb, false, ROUNDS)
        });
        side(&xa, true, WARM);
        let ping = side(&xa, true, ROUNDS);
        (ping, pong.join().unwrap())
    })
}

/// 300 round trips of 8 bytes, blocking calls on both ends, after a warm-up
/// (the connection's start, the books' first use): no allocation on
/// either end, and one wait per receive. (Before: two allocations per send
/// call — the gather list and the reposted slots — and two waits per
/// receive: the first returned only the completion of this end's Send.)
/// A wait that sleeps out its 50 ms slice counts twice, so the bound
/// leaves room for a few on a loaded machine, far below two per receive.
#[test]
fn an_8_byte_ping_pong_allocates_nothing_and_waits_once_per_receive() {
    let ((pa, pw), (qa, qw)) = ping_pong(side);
    assert_eq!((pa, qa), (0, 0), "allocations in {ROUNDS} round trips");
    for (who, w) in [("ping", pw), ("pong", qw)] {
        assert!(
            (ROUNDS / 2..=ROUNDS + ROUNDS / 4).contains(&w),
            "{who}: {w} waits in the engine for {ROUNDS} receives"
        );
    }
}

/// Receives exactly `out.len()` bytes by spinning on non-blocking calls
/// (busy polling). Returns the calls it made.
fn spin_into(x: &XSocket, out: &mut [u8]) -> u64 {
    let flags = RecvFlags {
        nonblocking: true,
        ..RecvFlags::default()
    };
    let (mut got, mut calls) = (0, 0);
    let t = Instant::now();
    while got < out.len() {
        assert!(t.elapsed() < LIMIT, "timed out with {got}/{}", out.len());
        calls += 1;
        match x.recv(&mut out[got..], flags, None) {
            Ok((k, _)) => {
                assert!(k > 0, "end of stream after {got}");
                got += k;
            }
            Err(e) => assert_eq!(e.raw_os_error(), Some(libc::EAGAIN)),
        }
    }
    calls
}

/// One side of `rounds` busy-polled 8-byte round trips. Returns the
/// allocations its thread made, its receive calls and the reads of the
/// engine's socket they made.
fn spin_side(x: &XSocket, ping: bool, rounds: u64) -> (u64, u64, u64) {
    let (a0, r0) = (allocs(), x.socket_reads());
    let mut m = [0u8; 8];
    let mut calls = 0;
    for i in 0..rounds {
        if ping {
            x.send(&i.to_le_bytes(), true, None).unwrap();
            calls += spin_into(x, &mut m);
            assert_eq!(m, i.to_le_bytes());
        } else {
            calls += spin_into(x, &mut m);
            x.send(&m, true, None).unwrap();
        }
    }
    (allocs() - a0, calls, x.socket_reads() - r0)
}

/// Busy polling, 300 round trips of 8 bytes on non-blocking calls: each
/// receive call reads the engine's socket once, whether it finds the
/// message or not (as a TCP `recv` is one system call), and nothing is
/// allocated. (Before: a call that took in a message read the socket
/// again, always empty, before it returned.)
#[test]
fn a_busy_polling_receive_reads_the_socket_once_per_call() {
    let (ping, pong) = ping_pong(spin_side);
    for (who, (allocs, calls, reads)) in [("ping", ping), ("pong", pong)] {
        assert_eq!(allocs, 0, "{who}: allocations in {ROUNDS} round trips");
        assert_eq!(
            reads, calls,
            "{who}: socket reads for {calls} receive calls ({ROUNDS} messages)"
        );
    }
}

/// One side of `rounds` 8-byte round trips through the calls that return
/// the socket's readiness with their result (what the preload reflects on
/// the program's doorbell after every data call). Returns the allocations
/// its thread made, its data calls, its waits in the engine and the times
/// its socket's lock was taken.
fn ready_side(x: &XSocket, ping: bool, rounds: u64) -> (u64, u64, u64, u64) {
    let (a0, w0, l0) = (allocs(), x.stats().waits.load(SeqCst), x.state_locks());
    let mut calls = 0;
    let mut m = [0u8; 8];
    let mut recv = |x: &XSocket, m: &mut [u8; 8]| {
        let mut got = 0;
        let t = Instant::now();
        while got < m.len() {
            assert!(t.elapsed() < LIMIT, "timed out with {got}/8");
            calls += 1;
            let (r, ready) =
                x.recv_vectored_ready(&mut [&mut m[got..]], RecvFlags::default(), Some(LIMIT));
            let (k, _) = r.unwrap();
            assert!(k > 0, "end of stream after {got}");
            got += k;
            if got == m.len() {
                // The peer waits for this side's answer: nothing is left.
                assert!(!ready.readable, "readable after the whole message");
            }
        }
    };
    for i in 0..rounds {
        let send = |x: &XSocket, b: &[u8]| {
            let (r, ready) = x.send_vectored_ready(&[b], false, None);
            assert_eq!(r.unwrap(), 8);
            assert!(!ready.error && !ready.hup, "{ready:?}");
        };
        if ping {
            send(x, &i.to_le_bytes());
            recv(x, &mut m);
            assert_eq!(m, i.to_le_bytes());
        } else {
            recv(x, &mut m);
            send(x, &m);
        }
    }
    let waits = x.stats().waits.load(SeqCst) - w0;
    (allocs() - a0, calls + rounds, waits, x.state_locks() - l0)
}

/// 300 round trips of 8 bytes through the calls that return readiness: the
/// socket's lock is taken once per data call and once more per wait in the
/// engine, never again for the readiness (before: the preload looked it up
/// after every call, `readiness_now`, a second lock per call), and nothing
/// is allocated.
#[test]
fn a_data_call_returns_its_readiness_under_its_own_lock() {
    let (ping, pong) = ping_pong(ready_side);
    for (who, (allocs, calls, waits, locks)) in [("ping", ping), ("pong", pong)] {
        assert_eq!(allocs, 0, "{who}: allocations in {ROUNDS} round trips");
        assert_eq!(
            locks,
            calls + waits,
            "{who}: socket locks for {calls} data calls and {waits} waits"
        );
    }
}

/// One side of `rounds` 8-byte round trips (blocking calls, or spinning on
/// non-blocking ones with `spin`). Returns the data calls it made and the
/// times its engine's lock was taken.
fn engine_side(x: &XSocket, ping: bool, rounds: u64, spin: bool) -> (u64, u64) {
    let l0 = x.engine_locks();
    let mut calls = 0;
    let mut m = [0u8; 8];
    let mut recv = |x: &XSocket, m: &mut [u8; 8]| {
        if spin {
            calls += spin_into(x, m);
        } else {
            calls += 1;
            recv_into(x, m);
        }
    };
    for i in 0..rounds {
        if ping {
            x.send(&i.to_le_bytes(), spin, None).unwrap();
            recv(x, &mut m);
        } else {
            recv(x, &mut m);
            x.send(&m, spin, None).unwrap();
        }
    }
    (calls + rounds, x.engine_locks() - l0)
}

/// 300 round trips of 8 bytes, blocking calls: the engine's lock is taken
/// 3 times per round trip and end, and once more per 3 — the send's inline
/// build and write (no completion to reap), the receive's wait (its look
/// and park, its unpark), and the repost of the slots of 3 answers in one
/// batch (`Stream::repost_due`, 16 slots; one repost per answer before,
/// 4 per round trip) — because the send and the polls
/// return the engine's backlog and pending events with their result
/// (`warpsock_engine::QpNews`) and the wait parks under the lock of its
/// look. Before, 11: `rearm` asked for the backlog and `check_events` for
/// events after every post and round, each a take of the lock, a wait's
/// drained queue was polled once more, and the park took the lock again;
/// then 5, while the send was a posted request whose completion the call
/// reaped. The bound leaves room for a few waits that sleep out a slice
/// on a loaded machine.
#[test]
fn an_8_byte_round_trip_takes_the_engine_lock_three_and_a_third_times() {
    let (ping, pong) = ping_pong(|x, p, r| engine_side(x, p, r, false));
    for (who, (_, locks)) in [("ping", ping), ("pong", pong)] {
        assert!(
            (3 * ROUNDS..=3 * ROUNDS + ROUNDS / 3 + ROUNDS / 2).contains(&locks),
            "{who}: {locks} engine locks in {ROUNDS} round trips"
        );
    }
}

/// Busy polling: each non-blocking receive call takes the engine's lock
/// once (its round of progress reports the news with its completions),
/// and every third round trip once more (the repost of the slots of 3
/// answers in one batch; once per round trip before; the send call is
/// counted in `calls` and is one take: its inline write reaps nothing).
/// Before, three times per call: the round, then `send_backlog` and
/// `poll_event`; then a reap per send on top.
#[test]
fn a_busy_polling_receive_takes_the_engine_lock_once_per_call() {
    let (ping, pong) = ping_pong(|x, p, r| engine_side(x, p, r, true));
    for (who, (calls, locks)) in [("ping", ping), ("pong", pong)] {
        assert!(
            locks <= calls + ROUNDS / 3 + ROUNDS / 4,
            "{who}: {locks} engine locks for {calls} data calls ({ROUNDS} round trips)"
        );
    }
}

/// 300 round trips of 8 bytes, blocking calls: every send goes out
/// inline (`XSocket::inline_sends`: the engine built and
/// wrote its one FPDU at once, no send request, no transmit slot, no
/// completion), none through a posted request.
#[test]
fn an_8_byte_send_goes_out_inline() {
    fn inline_side(x: &XSocket, ping: bool, rounds: u64) -> u64 {
        let i0 = x.inline_sends();
        engine_side(x, ping, rounds, false);
        x.inline_sends() - i0
    }
    let (ping, pong) = ping_pong(inline_side);
    assert_eq!((ping, pong), (ROUNDS, ROUNDS), "inline sends (ping, pong)");
}

/// The engine's transmit passes over `rounds` 8-byte round trips (blocking
/// calls, or spinning on non-blocking ones with `spin`).
fn tx_side(x: &XSocket, ping: bool, rounds: u64, spin: bool) -> u64 {
    let t0 = x.tx_passes();
    engine_side(x, ping, rounds, spin);
    x.tx_passes() - t0
}

/// 300 round trips of 8 bytes, blocking calls and busy polling: the engine
/// makes one transmit pass per send (the post's) and none after a receive
/// that left nothing to send, as siw's receive path never transmits.
/// Before, a pass after every receive (2 per round trip and end) and after
/// every empty busy-polling round (one per receive call). Control messages
/// the books owe add a few.
#[test]
fn a_receive_makes_no_transmit_pass() {
    for spin in [false, true] {
        let (ping, pong) = if spin {
            ping_pong(|x, p, r| tx_side(x, p, r, true))
        } else {
            ping_pong(|x, p, r| tx_side(x, p, r, false))
        };
        for (who, passes) in [("ping", ping), ("pong", pong)] {
            assert!(
                (ROUNDS..=ROUNDS + ROUNDS / 4).contains(&passes),
                "{who} (spin {spin}): {passes} transmit passes in {ROUNDS} round trips"
            );
        }
    }
}
