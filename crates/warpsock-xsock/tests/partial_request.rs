//! A responder whose peer marked its switch and then sent only part of an
//! MPA Request (`Step::AwaitRequest` undecided): the switch waits for the
//! rest asleep — the socket's low-water mark at the bytes it needs, so the
//! prefix already queued does not end each wait at once — and ends at
//! once when the peer ends its side, not at the Request's deadline.

use std::io::Write;
use std::net::Shutdown;
use std::net::TcpStream;
use std::os::fd::{AsFd, AsRawFd};
use std::time::{Duration, Instant};

use warpsock_xsock::io::{switch_fd_as, Failure};
use warpsock_xsock::switch::{Limits, MPA_REQ_KEY};
use warpsock_xsock::{Role, SwitchError};

mod net;

use net::{opts, send_mark, tcp_pair};

/// The calling thread's CPU time and voluntary context switches (its
/// sleeps).
fn thread_usage() -> (Duration, i64) {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: one timespec on the stack.
    let r = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(r, 0);
    // SAFETY: an all-zero rusage is valid; getrusage fills it.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: one rusage on the stack.
    let r = unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut ru) };
    assert_eq!(r, 0);
    let cpu = Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32);
    (cpu, ru.ru_nvcsw)
}

/// What the peer sends after its mark.
#[derive(Clone, Copy)]
enum After {
    /// 7 bytes of a Request's key, then nothing.
    Prefix,
    /// 7 bytes of a Request's key, then its end.
    PrefixThenEnd,
    /// 10 bytes of a Request's key, an urgent byte, then 20 more bytes
    /// (sent once the responder's own mark came: a second urgent byte
    /// before the first was read would make the first ordinary data). A
    /// peek stops at the urgent byte while `poll` counts the bytes past
    /// it.
    UrgentInside,
}

/// Waits (bounded) for the responder's mark on `a` and reads it.
fn take_mark(a: &TcpStream) {
    let mut p = libc::pollfd {
        fd: a.as_raw_fd(),
        events: libc::POLLPRI,
        revents: 0,
    };
    // SAFETY: one pollfd on the stack.
    let r = unsafe { libc::poll(&mut p, 1, 20_000) };
    assert_eq!(r, 1, "the responder's mark never came");
    let mut m = 0u8;
    // SAFETY: one byte on the stack.
    let n = unsafe { libc::recv(a.as_raw_fd(), (&mut m as *mut u8).cast(), 1, libc::MSG_OOB) };
    assert_eq!(n, 1);
}

/// The responder's switch against a peer that marks and sends `after`:
/// the failure, how long the switch took, and the responder thread's CPU
/// time and sleeps meanwhile.
fn against_a_partial_request(after: After, wait: Duration) -> (Failure, Duration, Duration, i64) {
    let (a, b) = tcp_pair();
    let mut o = opts();
    o.limits = Limits::with_timeout(wait);
    std::thread::scope(|sc| {
        sc.spawn(|| {
            let mut a = &a;
            send_mark(a);
            match after {
                After::Prefix => a.write_all(&MPA_REQ_KEY[..7]).unwrap(),
                After::PrefixThenEnd => {
                    a.write_all(&MPA_REQ_KEY[..7]).unwrap();
                    a.shutdown(Shutdown::Write).unwrap();
                }
                After::UrgentInside => {
                    take_mark(a);
                    a.write_all(&MPA_REQ_KEY[..10]).unwrap();
                    send_mark(a);
                    a.write_all(&[0u8; 20]).unwrap();
                }
            }
        });
        let (cpu0, sleeps0) = thread_usage();
        let t = Instant::now();
        let err = switch_fd_as(b.as_fd(), &o, Some(Role::Responder)).unwrap_err();
        let took = t.elapsed();
        let (cpu1, sleeps1) = thread_usage();
        (err, took, cpu1 - cpu0, sleeps1 - sleeps0)
    })
}

/// A silent peer with half a Request's key: the switch times out
/// (`NoRequest`) having slept through its 2 s wait for the Request (twice
/// the mark's timeout) — a handful of sleeps, next to no CPU. Fails with
/// the wait's plain `POLLIN`, true at once for the queued prefix: 200 µs
/// pauses, 6,626 sleeps and 190 ms of CPU in the 2 s (session 35; fewer
/// on a loaded machine, but far above this bound's 60 sleeps).
#[test]
fn a_partial_request_is_waited_for_asleep() {
    let (err, took, cpu, sleeps) = against_a_partial_request(After::Prefix, Duration::from_secs(1));
    // The Request's wait is the limits' `request_timeout`.
    let Failure::Refused { error, .. } = &err else {
        panic!("{err}")
    };
    assert!(matches!(error, SwitchError::NoRequest { .. }), "{err}");
    assert!(
        took >= Duration::from_secs(1),
        "ended after {took:?}: {err}"
    );
    assert!(
        sleeps < 60,
        "{sleeps} sleeps ({cpu:?} of CPU) in a {took:?} wait for the rest of a Request"
    );
}

/// A peer that ends its side after half a Request's key: the switch ends
/// at once with `PeerClosed`, not at its deadline (40 s here) with
/// `NoRequest` — the prefix it peeks is all there will be. Fails without
/// the end's check (the wait wakes for the end, the peek finds the same
/// prefix, until the deadline).
#[test]
fn a_peer_that_ends_after_a_partial_request_ends_the_switch() {
    let (err, took, _, _) =
        against_a_partial_request(After::PrefixThenEnd, Duration::from_secs(20));
    let Failure::Refused { error, .. } = &err else {
        panic!("{err}")
    };
    assert!(
        matches!(error, SwitchError::PeerClosed),
        "{err} after {took:?}"
    );
}

/// A lying peer puts an urgent byte inside its Request: the peek stops at
/// it (10 bytes) while `poll` counts the bytes past it as queued, so every
/// wait for the rest returns at once. A committed initiator never sends
/// urgent data inside its Request: the switch ends at once with
/// `NotARequest` (the bytes are the program's), not at its deadline (20 s
/// here) with `NoRequest` after pausing between such looks (helper 73;
/// before, helper 32's pauses kept it off the CPU meanwhile).
#[test]
fn an_urgent_byte_inside_the_request_ends_the_wait() {
    let (err, took, cpu, sleeps) =
        against_a_partial_request(After::UrgentInside, Duration::from_secs(10));
    let Failure::Refused { error, .. } = &err else {
        panic!("{err}")
    };
    assert!(
        matches!(error, SwitchError::NotARequest),
        "{err} after {took:?}"
    );
    assert!(
        took < Duration::from_secs(10),
        "ended after {took:?} ({sleeps} sleeps, {cpu:?} of CPU)"
    );
}
