//! A responder with no room to switch answers the initiator's mark with
//! `BUSY` (`io::answer_busy`, the preload's accepted connections left
//! plain for want of a switching place): the initiator's switch ends at
//! once with `SwitchError::Busy` — its mark timeout here is a minute, so
//! only the answer can end it within the test — and the connection goes
//! on as TCP both ways, every byte in order, with no urgent byte left on
//! either side.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::fd::{AsFd, AsRawFd};
use std::time::Duration;

use warpsock_xsock::io::{answer_busy, switch_fd_as, BusyAnswer, Failure};
use warpsock_xsock::switch::Limits;
use warpsock_xsock::{Role, SwitchError};

mod net;

use net::{opts, send_mark, set_buf, tcp_pair, LIMIT};

/// Polls `s` for `events` for up to `ms`: the events seen.
fn poll_for(s: &TcpStream, events: i16, ms: i32) -> i16 {
    let mut p = libc::pollfd {
        fd: s.as_raw_fd(),
        events,
        revents: 0,
    };
    // SAFETY: one pollfd on the stack.
    let r = unsafe { libc::poll(&mut p, 1, ms) };
    assert!(r >= 0, "poll");
    p.revents
}

/// The initiator's switch on `a` against `b` answered `BUSY`: it ends at
/// once (`SwitchError::Busy`), both marks are consumed (neither program
/// sees an urgent byte), and the connection is TCP both ways, nothing
/// lost or added.
fn busy_exchange(a: TcpStream, b: TcpStream) {
    let mut o = opts();
    o.limits = Limits::with_timeout(Duration::from_secs(60));
    o.limits.at_start = true;
    std::thread::scope(|sc| {
        let initiator = sc.spawn(|| switch_fd_as(a.as_fd(), &o, Some(Role::Initiator)));
        // The initiator's mark arrives first in b's stream.
        let ev = poll_for(&b, libc::POLLPRI, LIMIT.as_millis() as i32);
        assert!(ev & libc::POLLPRI != 0, "the initiator's mark never came");
        assert_eq!(answer_busy(b.as_fd()).unwrap(), BusyAnswer::Sent);
        match initiator.join().unwrap() {
            Err(Failure::Refused { error, residue, .. }) => {
                assert_eq!(error, SwitchError::Busy);
                assert!(residue.is_empty());
            }
            Err(e) => panic!("{e:?}"),
            Ok(_) => panic!("switched against a busy responder"),
        }
    });
    assert_eq!(poll_for(&a, libc::POLLPRI, 0) & libc::POLLPRI, 0);
    assert_eq!(poll_for(&b, libc::POLLPRI, 0) & libc::POLLPRI, 0);
    let (mut a, mut b) = (a, b);
    a.set_read_timeout(Some(LIMIT)).unwrap();
    b.set_read_timeout(Some(LIMIT)).unwrap();
    a.write_all(b"request").unwrap();
    let mut got = [0u8; 7];
    b.read_exact(&mut got).unwrap();
    assert_eq!(&got, b"request", "the responder's first bytes");
    b.write_all(b"reply").unwrap();
    let mut got = [0u8; 5];
    a.read_exact(&mut got).unwrap();
    assert_eq!(&got, b"reply", "the initiator's first bytes");
}

#[test]
fn a_busy_answer_ends_the_initiators_switch_at_once_and_leaves_tcp() {
    let (a, b) = tcp_pair();
    busy_exchange(a, b);
}

/// Where bytes are written around the peer's mark.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Written {
    /// By the peer, before its mark.
    PeerFirst,
    /// By the peer, after its mark: it gave up and went on as TCP.
    PeerAfter,
    /// By us, before the mark came.
    OursFirst,
}

/// With `bytes` written `how`: no answer, ever, and nothing sent to the
/// peer.
fn never_answered(how: Written, bytes: &[u8], what: &str) {
    let (a, b) = tcp_pair();
    match how {
        Written::PeerFirst => (&a).write_all(bytes).unwrap(),
        Written::OursFirst => (&b).write_all(bytes).unwrap(),
        Written::PeerAfter => {}
    }
    send_mark(&a);
    if how == Written::PeerAfter {
        (&a).write_all(bytes).unwrap();
        // Both in: the bytes behind the mark readable.
        let ev = poll_for(&b, libc::POLLIN, LIMIT.as_millis() as i32);
        assert!(ev & libc::POLLIN != 0, "{what}: the bytes never came");
    }
    let ev = poll_for(&b, libc::POLLPRI, LIMIT.as_millis() as i32);
    assert!(ev & libc::POLLPRI != 0, "{what}: the mark never came");
    assert_eq!(answer_busy(b.as_fd()).unwrap(), BusyAnswer::Never, "{what}");
    assert_eq!(
        poll_for(&a, libc::POLLPRI, 0) & libc::POLLPRI,
        0,
        "{what}: nothing sent to the peer"
    );
}

/// No mark yet: nothing sent, a mark may still come. The peer's bytes
/// before its mark or behind it (it went on as TCP), or our own bytes
/// written first: nothing sent, never to answer (`BUSY` would not be
/// first in either stream, or would reach a program).
#[test]
fn no_busy_answer_but_to_a_mark_first_in_both_streams() {
    let (_a, b) = tcp_pair();
    assert_eq!(answer_busy(b.as_fd()).unwrap(), BusyAnswer::NotYet);
    never_answered(Written::PeerFirst, b"x", "a byte before the mark");
    never_answered(Written::PeerAfter, b"GET /", "bytes behind the mark");
    never_answered(Written::OursFirst, b"banner", "we wrote first");
}

/// Both ends read urgent bytes in their streams (`SO_OOBINLINE`): the
/// mark and the answer are taken out of the streams all the same — the
/// busy answer as it is without the option, neither program reads a
/// byte it was not sent. Before, the mark read with `MSG_OOB` failed
/// (`EINVAL`, read as "not here yet") with `POLLPRI` up: the initiator
/// spun on the answer until its bound and the responder's program read
/// the mark as its first byte (helper 66's review).
#[test]
fn a_busy_answer_with_urgent_bytes_inline_takes_both_out_of_the_streams() {
    let (a, b) = tcp_pair();
    set_buf(&a, libc::SO_OOBINLINE, 1);
    set_buf(&b, libc::SO_OOBINLINE, 1);
    busy_exchange(a, b);
}

/// A foreign urgent byte inline is the program's: never answered, left
/// in the stream where the program reads it.
#[test]
fn a_foreign_urgent_byte_inline_is_left_in_the_stream() {
    let (a, b) = tcp_pair();
    set_buf(&b, libc::SO_OOBINLINE, 1);
    let x = [0x21u8];
    // SAFETY: one byte from the stack.
    let n = unsafe { libc::send(a.as_raw_fd(), x.as_ptr().cast(), 1, libc::MSG_OOB) };
    assert_eq!(n, 1);
    let ev = poll_for(&b, libc::POLLPRI, LIMIT.as_millis() as i32);
    assert!(ev & libc::POLLPRI != 0, "the urgent byte never came");
    assert_eq!(answer_busy(b.as_fd()).unwrap(), BusyAnswer::Never);
    let mut b = b;
    b.set_read_timeout(Some(LIMIT)).unwrap();
    let mut got = [0u8; 1];
    b.read_exact(&mut got).unwrap();
    assert_eq!(got, x, "the program's urgent byte, in its stream");
}
