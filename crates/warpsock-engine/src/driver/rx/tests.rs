//! The socket driver's receive half against real sockets: the parked
//! read's polled sleep (signals, error-queue entries).

use super::{sys, ParkedRead};
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// Whether thread `tid` sleeps in `poll` (libc's: `ppoll` on arm64).
fn in_poll(tid: libc::pid_t) -> bool {
    let path = format!("/proc/self/task/{tid}/syscall");
    let s = std::fs::read_to_string(path).unwrap_or_default();
    let nr = s.split_whitespace().next().unwrap_or("");
    #[cfg(target_arch = "x86_64")]
    if nr == libc::SYS_poll.to_string() {
        return true;
    }
    nr == libc::SYS_ppoll.to_string()
}

/// A connected pair on loopback and a parked read of the first socket.
fn pair() -> (std::net::TcpStream, std::net::TcpStream, ParkedRead) {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let a = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let (b, _) = l.accept().unwrap();
    let pr = ParkedRead {
        qi: 0,
        slot_id: 0,
        fd: a.as_raw_fd(),
        buf: vec![0; 64].into_boxed_slice(),
        cap: 64,
    };
    (a, b, pr)
}

/// `pr.read_polled` (20 s), while another thread waits until this one
/// sleeps as `asleep` tells (or the read returned) and then runs
/// `then` once: what the read's sleep must see (bytes, a signal).
#[allow(unsafe_code)]
fn read_polled_once_asleep(
    pr: &mut ParkedRead,
    asleep: fn(libc::pid_t) -> bool,
    then: impl FnOnce() + Send,
) -> std::io::Result<usize> {
    // SAFETY: gettid has no preconditions.
    let tid = unsafe { libc::gettid() };
    let done = AtomicBool::new(false);
    std::thread::scope(|sc| {
        sc.spawn(|| {
            while !done.load(Ordering::Relaxed) {
                if asleep(tid) {
                    then();
                    return;
                }
                std::thread::yield_now();
            }
        });
        let got = pr.read_polled(Duration::from_secs(20), |f| f());
        done.store(true, Ordering::Relaxed);
        got
    })
}

/// The polled sleep sleeps in `poll`, not in a read bounded by the
/// socket's `SO_RCVTIMEO` (1 ms here), returns what comes, and a
/// signal that ends it is `Interrupted` (review r22-d item 4: the
/// sleep-choice test passed with `read_polled` the blocking read).
/// Fails with the blocking read (`WouldBlock` after 1 ms, and never in
/// `poll`).
#[test]
#[allow(unsafe_code)]
fn a_polled_read_sleeps_in_poll_and_a_signal_ends_it() {
    extern "C" fn nothing(_: libc::c_int) {}
    // SAFETY: a handler that does nothing, without SA_RESTART, for
    // SIGURG, which nothing else in the crate's tests uses.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = nothing as extern "C" fn(libc::c_int) as usize;
        assert_eq!(libc::sigaction(libc::SIGURG, &sa, std::ptr::null_mut()), 0);
    }
    let (a, mut b, mut pr) = pair();
    a.set_read_timeout(Some(Duration::from_millis(1))).unwrap();
    // SAFETY: pthread_self has no preconditions.
    let me = unsafe { libc::pthread_self() };
    for signal in [false, true] {
        let got = read_polled_once_asleep(&mut pr, in_poll, || {
            if signal {
                // SAFETY: the test's thread, alive in its read_polled
                // until this thread is done.
                assert_eq!(unsafe { libc::pthread_kill(me, libc::SIGURG) }, 0);
            } else {
                b.write_all(b"z").unwrap();
            }
        });
        if signal {
            assert_eq!(got.unwrap_err().kind(), std::io::ErrorKind::Interrupted);
        } else {
            assert_eq!(got.unwrap(), 1);
            assert_eq!(pr.buf[0], b'z');
        }
    }
    // SAFETY: the default disposition again.
    unsafe { libc::signal(libc::SIGURG, libc::SIG_DFL) };
}

/// A socket whose error queue holds an entry (a transmit timestamp:
/// `SO_TIMESTAMPING`, set on it) has `poll` report
/// `POLLERR` at once though there is nothing to read: the polled sleep
/// drops the entry and ends as a slice that timed out, and the next one
/// sleeps in `poll` and returns the bytes that come (review r23-a item
/// 2; r22-d item 2: each slice of the wait spun on poll and `EAGAIN`).
/// Fails with the entry left: the queue is not empty after the first
/// slice (with the blocking-read fallback alone, that read then times
/// out at the socket's 1 ms), and the second slice never sleeps in
/// `poll` (it spins to its 20 s end with `WouldBlock`).
#[test]
#[allow(unsafe_code)]
fn a_polled_read_drops_error_queue_entries_and_sleeps_in_poll() {
    let (mut a, mut b, mut pr) = pair();
    let flags = (libc::SOF_TIMESTAMPING_TX_SOFTWARE | libc::SOF_TIMESTAMPING_SOFTWARE) as i32;
    // SAFETY: an int option from a live local, on a live socket.
    let r = unsafe {
        libc::setsockopt(
            a.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_TIMESTAMPING,
            (&flags as *const i32).cast(),
            4,
        )
    };
    assert_eq!(r, 0);
    a.write_all(b"x").unwrap();
    b.read_exact(&mut [0u8; 1]).unwrap();
    // The stamp is queued: poll reports POLLERR alone.
    let revents = sys::poll_readable(a.as_raw_fd(), Duration::from_secs(20)).unwrap();
    assert_eq!(revents, libc::POLLERR);
    a.set_read_timeout(Some(Duration::from_millis(1))).unwrap();
    let first = pr.read_polled(Duration::from_secs(20), |f| f());
    assert_eq!(first.unwrap_err().kind(), std::io::ErrorKind::WouldBlock);
    let left = sys::poll_readable(a.as_raw_fd(), Duration::ZERO).unwrap();
    assert_eq!(left, 0, "the error queue still holds an entry");
    let got = read_polled_once_asleep(&mut pr, in_poll, || b.write_all(b"y").unwrap());
    assert_eq!(got.unwrap(), 1);
    assert_eq!(pr.buf[0], b'y');
}
