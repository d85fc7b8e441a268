//! The accepted connections `start` leaves plain before any switch.

use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd};
use std::sync::PoisonError;
use std::time::Duration;

use warpsock_xsock::switch::{BUSY, MARK};

use super::super::tests::{accepted_from, SERIAL};
use super::*;

/// Polls `fd` for `events` (at most 20 s): the events seen.
fn poll_for(fd: c_int, events: i16) -> i16 {
    let mut p = libc::pollfd {
        fd,
        events,
        revents: 0,
    };
    // SAFETY: one pollfd on the stack.
    let r = unsafe { libc::poll(&mut p, 1, 20_000) };
    assert!(r >= 0, "poll");
    p.revents
}

/// A program that reads urgent bytes in its stream (`SO_OOBINLINE`, here
/// set on the accepted socket as a listener's would be inherited): its
/// accepted connection is never switched, and the client's mark is
/// answered busy and taken out of the stream — the program's first bytes
/// are the client's. Before, the switch waited for the mark with
/// `MSG_OOB` reads that fail on such a socket (`EINVAL`, read as "not
/// here yet") with `POLLPRI` up: it spun a CPU until its bound, then the
/// program read the mark as data (helper 66's review).
#[test]
fn an_accepted_connection_with_urgent_bytes_inline_is_answered_busy_never_switched() {
    let _serial = SERIAL.lock().unwrap_or_else(PoisonError::into_inner);
    let (fd, mut client) = accepted_from([127, 0, 0, 1]);
    let on: c_int = 1;
    // SAFETY: setsockopt of one int from the stack on our socket.
    let r = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_OOBINLINE,
            (&on as *const c_int).cast(),
            size_of::<c_int>() as libc::socklen_t,
        )
    };
    assert_eq!(r, 0);
    // SAFETY: one byte from the stack.
    let n = unsafe { libc::send(client.as_raw_fd(), [MARK].as_ptr().cast(), 1, libc::MSG_OOB) };
    assert_eq!(n, 1);
    assert_ne!(
        poll_for(fd, libc::POLLPRI) & libc::POLLPRI,
        0,
        "the mark never came"
    );
    let opts: &'static Options = Box::leak(Box::default());
    let mut tried = false;
    let r = start(
        fd,
        opts,
        false,
        (Some(warpsock_xsock::Role::Responder), false),
        |_| {
            tried = true;
            Ok(None)
        },
    );
    assert_eq!(r.err(), Some(libc::EAGAIN));
    assert!(!tried, "a switch was tried");
    assert!(fdtable::get(fd).is_none(), "the connection is managed");
    // The answer, urgent at the client (whose own socket takes it apart).
    assert_ne!(
        poll_for(client.as_raw_fd(), libc::POLLPRI) & libc::POLLPRI,
        0,
        "no answer"
    );
    let mut b = 0u8;
    // SAFETY: one byte into the stack.
    let n = unsafe {
        libc::recv(
            client.as_raw_fd(),
            (&mut b as *mut u8).cast(),
            1,
            libc::MSG_OOB,
        )
    };
    assert_eq!((n, b), (1, BUSY));
    client.write_all(b"request").unwrap();
    // SAFETY: the accepted descriptor, ours, owned by the stream now.
    let mut program = unsafe { std::net::TcpStream::from_raw_fd(fd) };
    program
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let mut got = [0u8; 7];
    program.read_exact(&mut got).unwrap();
    assert_eq!(&got, b"request", "the program's first bytes");
}
