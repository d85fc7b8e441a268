//! The blocking receive's straight path (`recv_straight`) on a connected
//! pair (loopback): what it declines, and its decline after an empty wait.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::super::placed::Retargeted;
use crate::io::RecvFlags;

use crate::io::test_pair::pair;

/// Waits (bounded) until `f` holds; fails the test if it never does.
fn until(what: &str, mut f: impl FnMut() -> bool) {
    let end = Instant::now() + Duration::from_secs(20);
    while !f() {
        assert!(Instant::now() < end, "never: {what}");
        std::thread::yield_now();
    }
}

const T: Option<Duration> = Some(Duration::from_secs(20));

/// A connected pair whose `xb` received one message from `xa` (the
/// first FPDU, which makes `xb`'s end established, is behind it).
fn pair_past_a_message() -> (crate::io::XSocket, crate::io::XSocket) {
    let (xa, xb) = pair();
    let mut buf = [0u8; 8];
    xa.send(&[1; 8], false, T).unwrap();
    assert_eq!(xb.recv(&mut buf, RecvFlags::default(), T).unwrap().0, 8);
    (xa, xb)
}

/// Every case the general loop handles otherwise is declined: each term
/// of `recv_straight_fits` made true alone, on an idle established
/// socket that fits otherwise (dropping any term fails this).
#[test]
fn the_straight_receive_declines_each_case_of_the_general_loop() {
    // Established both ways: one round trip.
    let (xa, xb) = pair_past_a_message();
    let mut buf = [0u8; 8];
    xb.send(&[2; 8], false, T).unwrap();
    assert_eq!(xa.recv(&mut buf, RecvFlags::default(), T).unwrap().0, 8);

    let min = xb.opts.zcopy_min;
    let none = RecvFlags::default();
    let fits = |f: RecvFlags, len: usize| {
        let st = xb.lock();
        xb.recv_straight_fits(&st, f, len)
    };
    assert!(fits(none, 8), "a plain small blocking receive fits");
    assert!(fits(none, min - 1));
    // The call's own terms.
    for f in [
        RecvFlags { peek: true, ..none },
        RecvFlags {
            nonblocking: true,
            ..none
        },
        RecvFlags {
            waitall: true,
            ..none
        },
    ] {
        assert!(!fits(f, 8), "{f:?} taken");
    }
    assert!(!fits(none, 0), "an empty buffer taken");
    assert!(!fits(none, min), "a sink's or placed read's buffer taken");
    // The socket's: each set alone, then put back.
    let with = |set: &dyn Fn(&mut super::State), what: &str| {
        let mut st = xb.lock();
        let saved = (
            std::mem::take(&mut st.residue),
            st.shut_rd,
            st.error.take(),
            st.peer_closed,
            st.driving,
        );
        set(&mut st);
        assert!(!xb.recv_straight_fits(&st, none, 8), "{what} taken");
        (st.residue, st.shut_rd, st.error, st.peer_closed, st.driving) = saved;
        st.retargeted.clear();
        assert!(xb.recv_straight_fits(&st, none, 8), "{what} not put back");
    };
    with(&|st| st.residue = vec![7; 3], "unread residue");
    with(&|st| st.shut_rd = true, "a socket shut for reading");
    with(
        &|st| st.error = Some((libc::ECONNRESET, "test".into())),
        "an error",
    );
    with(&|st| st.peer_closed = true, "the peer's FIN");
    with(&|st| st.driving = true, "a second reader");
    with(
        &|st| {
            st.retargeted.push(Retargeted {
                slot: 0,
                pos: 0,
                window: 0,
            });
        },
        "a retargeted receive",
    );
    // Queued bytes: a message processed, not read.
    xa.send(&[3; 8], false, T).unwrap();
    until("queued", || {
        xb.readable_bytes() > 0 || xb.readiness().readable
    });
    assert!(!fits(none, 8), "queued bytes taken");
    assert_eq!(xb.recv(&mut buf, none, T).unwrap(), (8, false));
    assert_eq!(buf, [3; 8]);
    assert!(fits(none, 8));
    // The end of the stream.
    xa.shutdown(false, true);
    until("end of stream", || xb.readiness().rdhup);
    assert!(!fits(none, 8), "the end of the stream taken");
    assert_eq!(xb.recv(&mut buf, none, T).unwrap(), (0, false));
}

/// A straight receive whose wait comes back empty (its slice passed) goes
/// on in the general loop, which waits again: the message sent after that
/// is the call's, not an early empty return.
#[test]
fn a_straight_receive_goes_on_after_an_empty_wait() {
    let (xa, xb) = pair_past_a_message();
    std::thread::scope(|sc| {
        let waits = xb.stats().waits.load(Ordering::Relaxed);
        let r = sc.spawn(|| {
            let mut buf = [0u8; 8];
            let r = xb.recv_vectored_ready(&mut [&mut buf], RecvFlags::default(), None);
            (r.0.unwrap(), buf)
        });
        // The call's second wait began: its first came back empty.
        until("a second wait", || {
            xb.stats().waits.load(Ordering::Relaxed) >= waits + 2
        });
        xa.send(&[5; 8], false, T).unwrap();
        assert_eq!(r.join().unwrap(), ((8, false), [5; 8]));
    });
}

/// A timed straight receive (`SO_RCVTIMEO`: the straight path takes it,
/// its wait bounded by the timeout) on an idle socket ends at its
/// deadline with `EAGAIN`, not after a whole wait's slice of its own;
/// and a message sent before a later deadline is the call's.
#[test]
fn a_timed_straight_receive_keeps_its_deadline() {
    let (xa, xb) = pair_past_a_message();
    let mut buf = [0u8; 8];
    let t = Duration::from_millis(30);
    let start = Instant::now();
    let e = xb
        .recv(&mut buf, RecvFlags::default(), Some(t))
        .unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EAGAIN), "{e}");
    assert!(start.elapsed() >= t, "returned before its deadline");
    std::thread::scope(|sc| {
        let waits = xb.stats().waits.load(Ordering::Relaxed);
        let r = sc.spawn(|| {
            let mut buf = [0u8; 8];
            let r = xb.recv(&mut buf, RecvFlags::default(), T);
            (r.unwrap(), buf)
        });
        until("the timed receive waits", || {
            xb.stats().waits.load(Ordering::Relaxed) > waits
        });
        xa.send(&[6; 8], false, T).unwrap();
        assert_eq!(r.join().unwrap(), ((8, false), [6; 8]));
    });
}

/// A long timeout (1 s or more: the straight path reads its deadline only
/// once its wait came back without the bytes) still ends the call: on an
/// idle socket, `EAGAIN` no sooner than the timeout, and (bounded here
/// far above the 50 ms it may be late by) not never.
#[test]
fn a_long_timeout_ends_the_call_after_an_empty_straight_wait() {
    let (_xa, xb) = pair_past_a_message();
    let t = Duration::from_secs(1);
    let (done, result) = std::sync::mpsc::channel();
    // Not scoped: a call that never ends must fail the test, not hang it.
    std::thread::spawn(move || {
        let start = Instant::now();
        let r = xb.recv(&mut [0u8; 8], RecvFlags::default(), Some(t));
        let _ = done.send((r.map(|(n, _)| n), start.elapsed()));
    });
    let (r, took) = result
        .recv_timeout(Duration::from_secs(20))
        .expect("a 1 s receive timeout never ended the call");
    let e = r.unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EAGAIN), "{e}");
    assert!(took >= t, "returned before its deadline: {took:?}");
}

/// A zero timeout (the library's API: the preload maps `SO_RCVTIMEO` 0 to
/// none, as Linux) is a call that expires at once: `EAGAIN` with no wait
/// of the engine's — not the straight path's wait, whose zero-length
/// sleep marked the engine's queue idle (review r30-b item 2).
#[test]
fn a_zero_timeout_receive_makes_no_wait() {
    let (_xa, xb) = pair_past_a_message();
    let waits = xb.stats().waits.load(Ordering::Relaxed);
    let e = xb
        .recv(&mut [0u8; 8], RecvFlags::default(), Some(Duration::ZERO))
        .unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EAGAIN), "{e}");
    assert_eq!(xb.stats().waits.load(Ordering::Relaxed), waits, "it waited");
}

thread_local! {
    /// The next predicted take of this thread panics (`wait/predicted.rs`
    /// calls [`maybe_panic_in_take`] in its take, in tests only).
    static PANIC_IN_TAKE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// A panic in the predicted take, once, if this thread asked for it.
pub(super) fn maybe_panic_in_take() {
    if PANIC_IN_TAKE.with(|c| c.replace(false)) {
        panic!("test: a panic in the predicted take");
    }
}

/// A receive whose driving wait unwinds (a panic, which the preload
/// catches and fails the call with) leaves the socket to the next
/// receive, which drives the engine itself and gets the message whose
/// take panicked (the engine kept it staged): not a socket whose
/// `driving` stays set, where every later receive waits for a driver
/// that never comes back (review r30-b item 3; without the undo the
/// second receive fails with `EAGAIN` at its 20 s timeout).
#[test]
fn a_driving_wait_that_unwinds_leaves_the_socket_to_the_next_receive() {
    let (xa, xb) = pair_past_a_message();
    // A few lone messages until one take panics (a read that brings more
    // than one FPDU is not predicted: the take is not called).
    let panicked = (0..20u8).find(|&i| {
        std::thread::scope(|sc| {
            let r = sc.spawn(|| {
                PANIC_IN_TAKE.with(|c| c.set(true));
                let mut buf = [0u8; 8];
                let res = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    xb.recv(&mut buf, RecvFlags::default(), T)
                }));
                PANIC_IN_TAKE.with(|c| c.set(false));
                match res {
                    Ok(r) => {
                        assert_eq!((r.unwrap(), buf), ((8, false), [i; 8]), "message {i}");
                        false
                    }
                    Err(_) => true,
                }
            });
            until("the receive drives", || xb.parked());
            xa.send(&[i; 8], false, T).unwrap();
            r.join().unwrap()
        })
    });
    let i = panicked.expect("no take panicked in 20 messages");
    assert!(!xb.parked(), "the unwound wait left the socket parked");
    let mut buf = [0u8; 8];
    let got = xb.recv(&mut buf, RecvFlags::default(), T);
    assert_eq!(
        (got.unwrap(), buf),
        ((8, false), [i; 8]),
        "the message whose take panicked"
    );
    // And the stream goes on.
    xa.send(&[99; 8], false, T).unwrap();
    assert_eq!(
        xb.recv(&mut buf, RecvFlags::default(), T).unwrap(),
        (8, false)
    );
    assert_eq!(buf, [99; 8]);
}
