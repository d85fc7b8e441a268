//! The listener out of descriptors: a connection the kernel has queued
//! but `accept(2)` cannot take (`EMFILE`) must not stall the handshakes
//! already pending nor make [`Listener::accept`] spin on the listening
//! socket, which stays readable. The scenario lowers `RLIMIT_NOFILE`, so it
//! runs in a child process of its own.

mod common;

use std::io::Write;
use std::net::TcpStream;
use std::os::fd::{AsRawFd, RawFd};
use std::process::Command;
use std::time::{Duration, Instant};

use common::LIMIT;
use warpsock_engine::{CmError, Listener};

const ROLE: &str = "listener-out-of-descriptors";

/// An MPA v1 Request without private data.
const REQUEST: &[u8] = b"MPA ID Req Frame\x00\x01\x00\x00";

/// CPU time this thread has used.
fn thread_cpu() -> Duration {
    // SAFETY: getrusage fills the zeroed struct.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    assert_eq!(unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut u) }, 0);
    let t = |v: libc::timeval| Duration::new(v.tv_sec as u64, v.tv_usec as u32 * 1000);
    t(u.ru_utime) + t(u.ru_stime)
}

/// Duplicates descriptors until none is left; returns them.
fn fill_descriptors(of: RawFd) -> Vec<RawFd> {
    let mut held = Vec::new();
    loop {
        // SAFETY: duplicating a live descriptor.
        let d = unsafe { libc::dup(of) };
        if d < 0 {
            assert_eq!(
                std::io::Error::last_os_error().raw_os_error(),
                Some(libc::EMFILE)
            );
            return held;
        }
        held.push(d);
        assert!(held.len() < 4096, "RLIMIT_NOFILE was not lowered");
    }
}

fn scenario() {
    // A small limit, so filling it is quick.
    let lim = libc::rlimit {
        rlim_cur: 256,
        rlim_max: 256,
    };
    // SAFETY: lowering this process's own limit.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) }, 0);
    let mut l = Listener::bind("127.0.0.1:0").unwrap();
    l.set_mpa_timeout(LIMIT);
    let addr = l.local_addr().unwrap();
    // A good peer, pending (its Request not sent yet).
    let mut good = TcpStream::connect(addr).unwrap();
    let until = Instant::now() + LIMIT;
    while l.pending() == 0 {
        assert!(Instant::now() < until, "the good peer was never taken");
        let _ = l.accept(Some(Duration::ZERO));
    }
    // A second client's socket, made while descriptors remain.
    // SAFETY: a new socket, closed below.
    let late = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0) };
    assert!(late >= 0);
    let held = fill_descriptors(good.as_raw_fd());
    // Its connection is queued in the kernel; the listener cannot take it.
    let std::net::SocketAddr::V4(v4) = addr else {
        unreachable!()
    };
    let sin = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: v4.port().to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from(*v4.ip()).to_be(),
        },
        sin_zero: [0; 8],
    };
    // SAFETY: connecting our socket to a valid address.
    let rc = unsafe {
        libc::connect(
            late,
            (&sin as *const libc::sockaddr_in).cast(),
            size_of::<libc::sockaddr_in>() as u32,
        )
    };
    assert_eq!(rc, 0, "{}", std::io::Error::last_os_error());
    good.write_all(REQUEST).unwrap();
    let me = good.local_addr().unwrap();
    // The good peer's Request comes back, after at most one report of the
    // exhaustion (before: every call returned EMFILE at once, the pending
    // handshake never read).
    let mut reports = Vec::new();
    let req = loop {
        match l.accept(Some(LIMIT)) {
            Ok(r) => break r,
            Err(e) => {
                reports.push(e);
                assert!(
                    reports.len() <= 3,
                    "the pending Request never came back: {reports:?}"
                );
            }
        }
    };
    assert_eq!(req.peer_addr(), me);
    for e in &reports {
        assert!(
            matches!(e, CmError::Io(io) if io.raw_os_error() == Some(libc::EMFILE)),
            "{e:?}"
        );
    }
    // Waiting while the queued connection still cannot be taken does not
    // spin on the readable listening socket (before: one accept(2) after
    // another for the whole wait).
    let wait = Duration::from_millis(600);
    let (c0, t0) = (thread_cpu(), Instant::now());
    loop {
        match l.accept(Some(wait.saturating_sub(t0.elapsed()))) {
            Err(CmError::Timeout {
                stage: "TCP accept",
                ..
            }) => break,
            Err(CmError::Io(io)) if io.raw_os_error() == Some(libc::EMFILE) => {}
            other => panic!("{other:?}"),
        }
    }
    let (cpu, waited) = (thread_cpu() - c0, t0.elapsed());
    assert!(
        cpu < waited / 2,
        "{cpu:?} of CPU in a {waited:?} wait with descriptors exhausted"
    );
    // Descriptors back: the queued connection is taken.
    for d in held {
        // SAFETY: our duplicates.
        unsafe { libc::close(d) };
    }
    let until = Instant::now() + LIMIT;
    while l.pending() == 0 {
        assert!(
            Instant::now() < until,
            "the queued connection was never taken"
        );
        let _ = l.accept(Some(Duration::from_millis(50)));
    }
    drop(req);
    // SAFETY: our socket.
    unsafe { libc::close(late) };
    println!("SCENARIO OK");
}

/// Runs the scenario in a child process (its limit is its own).
#[test]
fn a_connection_accept_cannot_take_neither_stalls_pending_handshakes_nor_spins() {
    if std::env::var("WARPSOCK_PEER").as_deref() == Ok(ROLE) {
        scenario();
        return;
    }
    let exe = std::env::current_exe().unwrap();
    let out = Command::new(exe)
        .args([
            "--exact",
            "a_connection_accept_cannot_take_neither_stalls_pending_handshakes_nor_spins",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("WARPSOCK_PEER", ROLE)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("SCENARIO OK"),
        "{}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}
