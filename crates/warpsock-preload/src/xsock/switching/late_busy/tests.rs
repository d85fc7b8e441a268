//! The watches' decisions (sans-IO), then the watcher on loopback
//! connections: a mark answered, the program's close at once, a number
//! given to another socket, a full list.

use std::io::Read;
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::sync::PoisonError;

use super::super::tests::{accepted_from, SERIAL};
use super::*;

fn at(t: Instant, fd: c_int) -> (c_int, SocketId, u64, Instant) {
    (fd, (1, fd as u64), 0, t)
}

/// Bounded, one watch per socket and number, and a full list takes in
/// a new watch once a closed one is dropped.
#[test]
fn the_watches_are_bounded() {
    let t = Instant::now() + Duration::from_secs(1);
    let mut ws = Watches::default();
    for fd in 0..WATCHES_MAX as c_int {
        let (fd, id, peer, t) = at(t, fd);
        assert!(ws.add(fd, id, peer, t).is_some());
    }
    assert!(ws.is_full());
    assert_eq!(ws.add(1000, (1, 1000), 0, t), None, "at the bound");
    ws.prune(|fd, _| fd != 7);
    assert_eq!(ws.add(1000, (1, 1000), 0, t), Some(WATCHES_MAX as u64 + 1));
    let mut ws = Watches::default();
    assert_eq!(ws.add(3, (1, 3), 0, t), Some(1));
    assert_eq!(ws.add(3, (1, 3), 0, t), None, "the same socket twice");
    assert_eq!(
        ws.add(3, (1, 4), 0, t),
        Some(2),
        "another socket, the number reused"
    );
    ws.remove(2);
    assert_eq!(ws.list.len(), 1);
    assert_eq!(ws.add(4, (1, 4), 0, t), Some(3), "tokens are never reused");
}

/// One peer holds at most its share of the watches; another peer, and
/// watches whose peer is not known, take the rest; a full share takes a
/// new watch once one of the peer's is gone.
#[test]
fn one_peer_holds_at_most_its_share() {
    let t = Instant::now() + Duration::from_secs(1);
    let mut ws = Watches::default();
    for fd in 0..WATCH_PEER_SHARE as c_int {
        assert!(ws.add(fd, (1, fd as u64), 7, t).is_some());
    }
    assert!(ws.holds_share(7) && !ws.holds_share(8) && !ws.holds_share(0));
    assert_eq!(ws.add(100, (1, 100), 7, t), None, "past the share");
    assert!(ws.add(101, (1, 101), 8, t).is_some(), "another peer");
    assert!(ws.add(102, (1, 102), 0, t).is_some(), "a peer not known");
    ws.prune(|fd, _| fd != 5);
    assert!(
        ws.add(100, (1, 100), 7, t).is_some(),
        "a closed one's place"
    );
}

/// An urgent byte on the watched socket is answered; the peer's bytes or
/// end, or a number another socket's now, end the watch unanswered; a
/// watch past its bound is over unanswered, reported or not; one not
/// reported waits on; a report to no watch (a stale registration's) is
/// nothing.
#[test]
fn a_wait_decides_each_watch() {
    let now = Instant::now();
    let later = now + Duration::from_secs(1);
    let mut ws = Watches::default();
    for fd in 3..=8 {
        ws.add(fd, (1, fd as u64), 0, later);
    }
    ws.add(9, (1, 9), 0, now);
    ws.add(10, (1, 10), 0, now);
    let pri = libc::EPOLLPRI as u32;
    let reported = [
        (1, pri),                                                      // 3
        (2, libc::EPOLLIN as u32),                                     // 4
        (3, (libc::EPOLLRDHUP | libc::EPOLLIN) as u32),                // 5
        (4, pri),                                                      // 6: another socket's
        (5, (libc::EPOLLPRI | libc::EPOLLIN | libc::EPOLLERR) as u32), // 7
        (8, pri),                                                      // 10: past its bound
        (99, pri),                                                     // no watch
    ];
    let d = ws.after_wait(&reported, now, |fd, _| fd != 6);
    let fds = |v: &[Watch]| v.iter().map(|w| w.fd).collect::<Vec<_>>();
    assert_eq!(fds(&d.answer), vec![3, 7], "answer_busy looks at 7's bytes");
    assert_eq!(fds(&d.over), vec![3, 4, 5, 6, 7, 9, 10]);
    assert_eq!(fds(&ws.list), vec![8]);
    assert!(ws.wait(now) <= LOOK_MAX);
    assert_eq!(ws.after_wait(&[], later, |_, _| true).over.len(), 1);
    assert!(ws.is_empty(), "every bound passed");
    assert_eq!(ws.wait(now), LOOK_MAX);
}

/// Far past any wait of these tests.
const HUNG: Duration = Duration::from_secs(20);

/// One watcher per process: the socket tests one at a time, and none of
/// the switching tests' meanwhile (a switch left plain is watched too).
fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A warpsock client's mark of its switch.
fn mark(t: &TcpStream) {
    let b = [warpsock_xsock::switch::MARK];
    // SAFETY: send of one byte from the stack on an open socket.
    let r = unsafe { libc::send(t.as_raw_fd(), b.as_ptr().cast(), 1, libc::MSG_OOB) };
    assert_eq!(r, 1, "send(MSG_OOB)");
}

/// The urgent byte `t` gets within [`HUNG`], if any.
fn urgent_answer(t: &TcpStream) -> Option<u8> {
    let mut p = libc::pollfd {
        fd: t.as_raw_fd(),
        events: libc::POLLPRI,
        revents: 0,
    };
    // SAFETY: one pollfd on the stack.
    if unsafe { libc::poll(&mut p, 1, HUNG.as_millis() as c_int) } != 1 {
        return None;
    }
    let mut b = 0u8;
    // SAFETY: one byte into the stack.
    let r = unsafe { libc::recv(t.as_raw_fd(), (&mut b as *mut u8).cast(), 1, libc::MSG_OOB) };
    (r == 1).then_some(b)
}

/// Whether `peer`'s mark, sent now, is answered `BUSY` (within [`HUNG`]).
fn answered_busy(peer: &TcpStream) -> bool {
    mark(peer);
    urgent_answer(peer) == Some(warpsock_xsock::switch::BUSY)
}

/// The TCP state (`/proc/net/tcp`'s hex, "01" established) of the socket
/// from `local` to `remote` on 127.0.0.1, if it is there.
fn tcp_state(local: u16, remote: u16) -> Option<String> {
    let table = std::fs::read_to_string("/proc/net/tcp").expect("/proc/net/tcp");
    let (l, r) = (format!(":{local:04X}"), format!(":{remote:04X}"));
    table.lines().skip(1).find_map(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        (f.len() > 3 && f[1].ends_with(&l) && f[2].ends_with(&r)).then(|| f[3].to_string())
    })
}

/// Waits (at most [`HUNG`]) until the socket `id` is watched no more.
fn wait_unwatched(id: SocketId) {
    let deadline = Instant::now() + HUNG;
    while watched(id) {
        assert!(Instant::now() < deadline, "the watch outlived its bound");
        sys::sleep(Duration::from_millis(5));
    }
}

/// A watched connection's mark is answered `BUSY`; the program's close of
/// another watched connection takes effect in its `close` (its FIN sent
/// then: the set holds no reference to it), not when the watcher next
/// looks. In a forked child, alone with its watcher: a fork of another
/// test's meanwhile would hold the connection open in its child.
#[test]
fn a_mark_is_answered_and_the_programs_close_is_at_once() {
    let _s = serial();
    let status = crate::shim::forktest::child_within(|| {
        let (closed, mut closed_peer) = accepted_from([127, 0, 0, 1]);
        let (marked, marked_peer) = accepted_from([127, 0, 0, 1]);
        if !(watch(closed, HUNG) && watch(marked, HUNG)) {
            return 2;
        }
        // The thread answers, and waits on the set again (`closed` in it).
        if !answered_busy(&marked_peer) {
            return 3;
        }
        let local = sys::local_addr(closed).expect("its address").port();
        let remote = closed_peer.local_addr().unwrap().port();
        if tcp_state(local, remote).as_deref() != Some("01") {
            return 4;
        }
        sys::close(closed);
        if tcp_state(local, remote).as_deref() == Some("01") {
            // Still established after the program's close.
            return 5;
        }
        closed_peer.set_read_timeout(Some(HUNG)).unwrap();
        if !matches!(closed_peer.read(&mut [0u8; 1]), Ok(0)) {
            return 6;
        }
        0
    });
    assert_eq!(
        status,
        Some(0),
        "2: not watched, 3: no BUSY, 4: not established, \
         5: established after the close, 6: no end read"
    );
}

/// A watch whose number the program closed and gave to another watched
/// socket leaves that socket's registration alone when its bound ends it:
/// the new socket's mark is answered after.
#[test]
fn a_number_given_to_another_watched_socket_keeps_its_registration() {
    let _s = serial();
    let (n, _first_peer) = accepted_from([127, 0, 0, 1]);
    let first = socket_id(n).unwrap();
    assert!(watch(n, Duration::from_millis(200)));
    let (b, second_peer) = accepted_from([127, 0, 0, 1]);
    // The number `n` given to the second socket (the first one closed).
    // SAFETY: both numbers are this test's.
    assert_eq!(unsafe { libc::dup2(b, n) }, n);
    sys::close(b);
    assert!(watch(n, HUNG), "the number's new socket");
    wait_unwatched(first);
    assert!(answered_busy(&second_peer), "BUSY");
    sys::close(n);
}

/// A full list takes in a new watch once the program closed watched
/// numbers (their sockets left the set without a word).
#[test]
fn a_full_list_drops_the_closed_watches() {
    let _s = serial();
    let mut held = Vec::new();
    // From as many addresses as the share takes (each peer's share full
    // in turn): the list's bound.
    let from = |i: usize| [127, 0, 0, 1 + (i / WATCH_PEER_SHARE) as u8];
    loop {
        let (fd, peer) = accepted_from(from(held.len()));
        if !watch(fd, HUNG) {
            sys::close(fd);
            break;
        }
        held.push((fd, peer));
        assert!(held.len() <= WATCHES_MAX, "unbounded");
    }
    assert_eq!(held.len(), WATCHES_MAX, "the list's bound");
    let (fd, peer) = accepted_from([127, 0, 0, 9]);
    assert!(!watch(fd, HUNG), "full");
    for (n, _) in &held {
        sys::close(*n);
    }
    assert!(watch(fd, HUNG), "a closed watch's place");
    assert!(answered_busy(&peer), "BUSY");
    sys::close(fd);
}

/// One address's clients that never send their mark hold at most its
/// share of the watches: a client from another address is still watched
/// and answered (helper 66's review, item 3: one address filled them).
#[test]
fn one_address_leaves_the_others_watches() {
    let _s = serial();
    let mut held = Vec::new();
    loop {
        let (fd, peer) = accepted_from([127, 0, 0, 1]);
        if !watch(fd, HUNG) {
            sys::close(fd);
            break;
        }
        held.push((fd, peer));
        assert!(held.len() <= WATCHES_MAX, "unbounded");
    }
    assert_eq!(held.len(), WATCH_PEER_SHARE, "one address's share");
    let (fd, peer) = accepted_from([127, 0, 0, 2]);
    assert!(watch(fd, HUNG), "another address");
    assert!(answered_busy(&peer), "BUSY");
    sys::close(fd);
    for (n, _) in held {
        sys::close(n);
    }
}

/// A forked child's watches are its own: with its parent's watcher busy
/// (a watch and its thread, which the child does not have), a child made
/// by a raw `fork` (told by the pid) and one whose fork handler ran
/// ([`forget_after_fork`]: the parent's set's descriptor closed) each
/// watch a connection of their own and answer its mark; the parent's
/// watch is answered still, by the parent.
#[test]
fn a_forked_childs_watches_are_its_own() {
    let _s = serial();
    let (parents, parents_peer) = accepted_from([127, 0, 0, 1]);
    assert!(watch(parents, HUNG));
    for handler in [false, true] {
        let status = crate::shim::forktest::child_within(|| {
            if handler {
                forget_after_fork();
            }
            let (fd, peer) = accepted_from([127, 0, 0, 1]);
            if !watch(fd, HUNG) {
                return 2;
            }
            if answered_busy(&peer) {
                0
            } else {
                1
            }
        });
        assert_eq!(
            status,
            Some(0),
            "the child (its fork handler ran: {handler})"
        );
    }
    assert!(answered_busy(&parents_peer), "the parent's watch");
    sys::close(parents);
}

/// How many of this process's descriptors are the socket `id`.
fn holders(id: SocketId) -> usize {
    std::fs::read_dir("/proc/self/fd")
        .expect("/proc/self/fd")
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<c_int>().ok())
        .filter(|&fd| socket_id(fd) == Some(id))
        .count()
}

/// A fork while a busy answer's duplicate of the connection is open does
/// not wait for the answer (a program's `SO_LINGER` close inside it held
/// the fork: helper 67's review, item 4), and its child does not keep the
/// duplicate: its fork handler closes it. A lifted number the child never
/// closes would hold the connection open after the program's close
/// (helper 64's review, item 6).
#[test]
fn a_forks_child_closes_the_answers_duplicate() {
    let _s = serial();
    let (fd, peer) = accepted_from([127, 0, 0, 1]);
    let id = socket_id(fd).expect("the accepted socket");
    let (in_answer, entered) = std::sync::mpsc::channel();
    let (go_on, go) = std::sync::mpsc::channel::<()>();
    *sys::lock(&DUP_HOOK) = Some(Box::new(move || {
        let _ = in_answer.send(());
        let _ = go.recv_timeout(HUNG);
    }));
    assert!(watch(fd, HUNG));
    mark(&peer);
    entered
        .recv_timeout(HUNG)
        .expect("the answer, its duplicate open");
    // The program's fork: its prepare handler does not wait for the
    // answer (it would until `go_on`, past the bound, before).
    let t = Instant::now();
    hold_answers_for_fork();
    assert!(
        t.elapsed() < HUNG,
        "the fork waited for the answer under way"
    );
    let in_child = crate::shim::forktest::child_within(|| {
        let before = holders(id) as i32;
        // The child's fork handler.
        forget_after_fork();
        before * 10 + holders(id) as i32
    });
    release_answers_after_fork();
    assert_eq!(
        in_child,
        Some(21),
        "the child's descriptors of the connection before its fork \
         handler (the program's and the answer's duplicate) and after it \
         (the program's only)"
    );
    go_on.send(()).unwrap();
    assert_eq!(
        urgent_answer(&peer),
        Some(warpsock_xsock::switch::BUSY),
        "the mark answered"
    );
    sys::close(fd);
}
