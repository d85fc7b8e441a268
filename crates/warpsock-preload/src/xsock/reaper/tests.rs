use super::*;

/// `fd`'s `SO_LINGER` as {on, seconds}.
fn linger_of(fd: c_int) -> (c_int, c_int) {
    let mut l = libc::linger {
        l_onoff: 0,
        l_linger: 0,
    };
    let mut len = size_of::<libc::linger>() as libc::socklen_t;
    // SAFETY: a `linger` out of the stack, of the declared size.
    let r = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&mut l as *mut libc::linger).cast(),
            &mut len,
        )
    };
    assert_eq!(r, 0, "{}", std::io::Error::last_os_error());
    (l.l_onoff, l.l_linger)
}

fn tcp_socket() -> c_int {
    // SAFETY: a new socket.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0) };
    assert!(fd >= 0, "{}", std::io::Error::last_os_error());
    fd
}

/// review r28-c item 7: an `_exit` whose reaper does not answer
/// resets the closes still sending from its own thread, through the
/// table their hand-over filled: the sockets noted get `SO_LINGER`
/// {1, 0} (the process's end sends an RST, not a FIN after a short
/// stream); one forgotten (its sending over, or dropped), or whose
/// number now names another socket, is left alone.
#[test]
fn an_unanswered_exit_resets_the_closes_noted_as_sending() {
    let table: &'static fd_table::FdTable =
        Box::leak(Box::new(fd_table::FdTable::new(4).expect("a table")));
    let (a, b, c) = (tcp_socket(), tcp_socket(), tcp_socket());
    table.note(a);
    let (tb, ib) = table.note(b);
    table.note(c);
    tb.forget(ib);
    // c's number taken by another socket since it was noted.
    let other = tcp_socket();
    // SAFETY: our own descriptors; `dup2` replaces c's socket.
    assert_eq!(unsafe { libc::dup2(other, c) }, c);
    assert_eq!(table.reset(), 1);
    assert_eq!(linger_of(a), (1, 0), "the close noted is not reset");
    assert_eq!(linger_of(b).0, 0, "a close forgotten was reset");
    assert_eq!(
        linger_of(c).0,
        0,
        "another socket on a reused number was reset"
    );
    table.clear();
    for fd in [a, b, c, other] {
        sys::close(fd);
    }
}

/// review r28-e item 1: the reaper (slow, not stuck) forgets and
/// closes a noted socket while an unanswered `_exit` resets it, and
/// another socket takes the number: the reset must reach the noted
/// socket, never the one now on its number. The reaper's forget comes
/// between the exiter's inode check and its `setsockopt` (the table's
/// test hook); the exiter goes on once that forget is done, or held
/// off by the exiter's claim on the place.
#[test]
fn a_reset_under_way_holds_off_the_close_of_its_socket() {
    use std::sync::{Arc, Mutex};
    let table: &'static fd_table::FdTable =
        Box::leak(Box::new(fd_table::FdTable::new(4).expect("a table")));
    let a = tcp_socket();
    // a's socket, looked at after its number went to another.
    // SAFETY: our own descriptor.
    let keep = unsafe { libc::dup(a) };
    assert!(keep >= 0);
    let other = tcp_socket();
    let (_, ia) = table.note(a);
    let done = Arc::new(AtomicBool::new(false));
    let reaper: Arc<Mutex<Option<std::thread::JoinHandle<()>>>> = Arc::default();
    let (d, r) = (done.clone(), reaper.clone());
    let hook: Box<dyn Fn(c_int) + Send + Sync> = Box::new(move |fd| {
        let d2 = d.clone();
        // The reaper's end of the close: its forget, then its close,
        // and another socket on the number (`dup2`: both at once).
        let t = std::thread::spawn(move || {
            table.forget(ia);
            // SAFETY: our own descriptors.
            assert_eq!(unsafe { libc::dup2(other, fd) }, fd);
            d2.store(true, Ordering::Release);
        });
        *r.lock().unwrap() = Some(t);
        while !d.load(Ordering::Acquire) && table.waited.load(Ordering::Acquire) == 0 {
            std::thread::yield_now();
        }
    });
    assert!(table.between.set(hook).is_ok());
    assert_eq!(table.reset(), 1);
    let t = reaper.lock().unwrap().take().expect("the hook ran");
    t.join().expect("the reaper's forget and close");
    assert!(done.load(Ordering::Acquire));
    assert_eq!(
        linger_of(a).0,
        0,
        "the socket that took the noted number was reset"
    );
    assert_eq!(linger_of(keep), (1, 0), "the noted socket was not reset");
    for fd in [a, keep, other] {
        sys::close(fd);
    }
}

/// review r29-a item 2: a close noted while another's `forget` is
/// under way (the table's test hook runs before forget's last store)
/// is reset by an exit then, and the forgotten one is not. `forget`
/// freed the number while its claim was still held: the note landed
/// in that place, and the reset skipped it as "being forgotten".
#[test]
fn a_close_noted_during_anothers_forget_is_reset() {
    use std::sync::Mutex;
    let table: &'static fd_table::FdTable =
        Box::leak(Box::new(fd_table::FdTable::new(2).expect("a table")));
    let (a, b) = (tcp_socket(), tcp_socket());
    let (_, ia) = table.note(a);
    let reset: &'static Mutex<Option<usize>> = Box::leak(Box::default());
    let hook: Box<dyn Fn() + Send + Sync> = Box::new(move || {
        // Another thread's hand-over, then an unanswered `_exit`.
        table.note(b);
        *reset.lock().unwrap() = Some(table.reset());
    });
    assert!(table.freeing.set(hook).is_ok());
    table.forget(ia);
    let n = reset.lock().unwrap().take().expect("the hook ran");
    assert_eq!(
        linger_of(b),
        (1, 0),
        "the close noted during another's forget was not reset ({n} reset)"
    );
    assert_eq!(linger_of(a).0, 0, "the close forgotten was reset");
    assert_eq!(n, 1);
    table.clear();
    for fd in [a, b] {
        sys::close(fd);
    }
}

/// review r28-e item 2, r29-a item 3: closes handed over past the
/// table's places (a burst the reaper has not taken yet) are noted at
/// once, in a table grown after it, so an unanswered `_exit` resets
/// them too; each is forgotten from its place.
#[test]
fn a_burst_past_the_tables_places_is_noted_whole() {
    let table: &'static fd_table::FdTable =
        Box::leak(Box::new(fd_table::FdTable::new(2).expect("a table")));
    let fds: Vec<c_int> = (0..5).map(|_| tcp_socket()).collect();
    let places: Vec<_> = fds.iter().map(|&fd| table.note(fd)).collect();
    let n = table.reset();
    for (i, &fd) in fds.iter().enumerate() {
        assert_eq!(
            linger_of(fd),
            (1, 0),
            "close {i} of 5 handed over to a table of 2 places is not reset"
        );
    }
    assert_eq!(n, 5, "the closes reset");
    for (t, i) in places {
        t.forget(i);
    }
    assert_eq!(table.reset(), 0, "a close forgotten was reset");
    for fd in fds {
        sys::close(fd);
    }
}

/// review r29-a item 1: the reaper's table of closes still sending
/// has as many places as the closes it holds, a bound past 256
/// included (it was a fixed table of 256, and the bound clamped to
/// it: past it a server's closes to slow clients were given up).
#[test]
fn the_reapers_table_has_a_place_for_every_close_held() {
    for (max, places) in [(300, 300), (1 << 20, fd_table::FIRST_MAX)] {
        let r = new_reaper(max).expect("a reaper");
        assert_eq!(
            r.sending.len(),
            places,
            "places in the table of a reaper holding up to {max} closes"
        );
        for fd in [r.wakefd, r.epfd] {
            sys::close(fd);
        }
    }
}

/// The process's reaper has made a round that took every close handed
/// over before this call: two `_exit` looks answered (the round that
/// answers the first may have taken its inbox before the call; the
/// one that answers the second began after it).
fn a_round_after_the_hand_overs() {
    let end = Instant::now() + Duration::from_secs(30);
    let mut answered = 0;
    while answered < 2 {
        assert!(Instant::now() < end, "the reaper answered no look in 30 s");
        answered += usize::from(exit_look(false).is_some());
    }
}

/// review r29-a item 5: a close handed over in a process other than
/// the one that switched its socket (a child forked between its
/// close's look and its hand-over, whose reaper is its own) is the
/// parent's: the reaper forgets it — no step (its end of stream would
/// reach the peer), no reset, no drop (its engine's socket closed or
/// shut). A loopback pair switched at both ends; the close handed over
/// as another process's (its pid not ours), then two rounds of the
/// reaper: the peer must read nothing, the engine's socket be open,
/// without `SO_LINGER`.
#[test]
fn a_close_handed_over_in_another_process_is_left_alone() {
    use warpsock_xsock::io::RecvFlags;
    let (x, c, peer) = crate::xsock::test_pair::switched();
    // The engine's socket alone holds our end (`switch_fd` dups it).
    drop(c);
    let tfd = x.tcp_fd();
    let quiet = RecvFlags {
        nonblocking: true,
        ..RecvFlags::default()
    };
    let mut buf = [0u8; 16];
    let before = peer.recv(&mut buf, quiet, None);
    assert!(
        before
            .as_ref()
            .is_err_and(|e| e.kind() == std::io::ErrorKind::WouldBlock),
        "the peer read {before:?} before the hand-over"
    );
    // SAFETY: getpid has no preconditions.
    let other = unsafe { libc::getpid() } + 1;
    let held = HELD.load(Ordering::Acquire);
    // As a close's hand-over: orderly, its count made (the parent's).
    // Past `hand_over`'s check (a child of `_Fork`, the census's
    // owner still the parent's): the reaper's pid check.
    hand_over_to_reaper(x, false, None, Some(Counted::new()), other);
    a_round_after_the_hand_overs();
    let after = peer.recv(&mut buf, quiet, None);
    // SAFETY: F_GETFD on a number, open or not.
    let open = unsafe { libc::fcntl(tfd, libc::F_GETFD) } >= 0;
    let lingering = if open { linger_of(tfd) } else { (-1, -1) };
    // The count the test made stands for the parent's: given back.
    sub(&CLOSING);
    assert!(
        after
            .as_ref()
            .is_err_and(|e| e.kind() == std::io::ErrorKind::WouldBlock),
        "the peer read {after:?} once another process's close was handed over: the \
         reaper stepped (or dropped) it"
    );
    assert!(
        open,
        "the engine's socket of another process's close was closed"
    );
    assert_eq!(lingering, (0, 0), "another process's close was reset");
    assert!(
        HELD.load(Ordering::Acquire) <= held,
        "the forgotten close left its count in HELD"
    );
}

/// review r29-c item 4: a close of the parent's handed over in a
/// child made by `fork` (its handlers run: the census's owner none) is
/// forgotten at once: no reaper started, nothing noted in the child's
/// table, so the child's unanswered `_exit` look resets nothing of
/// the engine socket the two share (before: the child started a
/// reaper and noted the close, and a look before the reaper forgot it
/// set `SO_LINGER` {1, 0}: the parent's orderly close ended in a
/// reset). A loopback pair switched at both ends; a fork whose child
/// runs the fork handlers' parts (the reaper's and the census's),
/// hands the parent's end over as the parent's close and makes an
/// unanswered exit's reset; then the parent's own close must read as
/// 0 at the peer.
#[test]
fn a_forked_childs_hand_over_of_its_parents_close_is_forgotten_at_once() {
    use warpsock_xsock::io::RecvFlags;
    let (x, c, peer) = crate::xsock::test_pair::switched();
    drop(c);
    let tfd = x.tcp_fd();
    // SAFETY: getpid has no preconditions.
    let me = unsafe { libc::getpid() };
    // SAFETY: the child runs the fork handlers' parts and the
    // hand-over, then `_exit`s, never returning into the harness.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
    if pid == 0 {
        forget_after_fork();
        super::super::sock::forget_after_fork();
        hand_over(x, false, None, Some(Counted::new()), me);
        let mut bits = 0;
        if !REAPER.load(Ordering::Acquire).is_null() {
            bits |= 1;
        }
        if reset_sending_unanswered() != 0 {
            bits |= 2;
        }
        if linger_of(tfd) != (0, 0) {
            bits |= 4;
        }
        // SAFETY: ends the child, no unwinding into the harness.
        unsafe { libc::_exit(bits) };
    }
    let status = crate::shim::forktest::within(pid);
    let lingering = linger_of(tfd);
    assert_eq!(
        status,
        Some(0),
        "the forked child's hand-over of its parent's close (1: it started a reaper, 2: an \
         unanswered exit's look reset a close, 4: the shared engine socket has SO_LINGER \
         set; None: hung, killed)"
    );
    assert_eq!(
        lingering,
        (0, 0),
        "the parent's engine socket was reset by the child"
    );
    // The parent's own orderly close: the peer reads its end, no reset.
    drop(x);
    let mut buf = [0u8; 16];
    let quiet = RecvFlags {
        nonblocking: true,
        ..RecvFlags::default()
    };
    // The engine socket's readiness may be a frame before the end
    // (its close's): read until something other than WouldBlock,
    // each wait on the socket, 10 s in all.
    let deadline = Instant::now() + Duration::from_secs(10);
    let r = loop {
        let r = peer.recv(&mut buf, quiet, None);
        if !r
            .as_ref()
            .is_err_and(|e| e.kind() == std::io::ErrorKind::WouldBlock)
        {
            break r;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(
            !left.is_zero(),
            "the peer read nothing of the parent's close within 10 s"
        );
        let mut pfd = libc::pollfd {
            fd: peer.tcp_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one pollfd on the stack; bounded by the deadline.
        unsafe { libc::poll(&mut pfd, 1, left.as_millis().max(1) as c_int) };
    };
    assert!(
        matches!(r, Ok((0, _))),
        "the peer read {r:?} at the parent's orderly close, not its end of stream"
    );
}

/// review r29-c item 5: a close of another process's forgotten by
/// the reaper gives back a count in [`HELD`] only if the hand-over
/// made it ([`Held::added`]), not the close's own (`Counted::sent`'s,
/// the other process's). In a forked child (HELD its own), bounded by
/// `forktest::child_within`: HELD at 5, a `Held` not added forgotten,
/// HELD must stay 5; one added, 4; then a `Held`'s drop with HELD and
/// CLOSING at 0 (a fork handler's) leaves both at 0 (saturating).
#[test]
fn a_forgotten_close_gives_back_only_the_count_its_hand_over_made() {
    let (x, _c, peer) = crate::xsock::test_pair::switched();
    let status = crate::shim::forktest::child_within(move || {
        let held = |x, added| Held {
            x,
            c: None,
            counted: added,
            added,
            noted: None,
            pid: 0,
            key: 0,
            due: false,
            acked: None,
            watched: None,
        };
        HELD.store(5, Ordering::Release);
        // The same socket three times: two copies forgotten, never
        // dropped; `x` itself dropped last.
        // SAFETY: bitwise copies of `x`, never dropped (forgotten by
        // `forget_foreign`).
        let (one, two) = unsafe { (std::ptr::read(&x), std::ptr::read(&x)) };
        forget_foreign(held(one, false));
        let not_added = HELD.load(Ordering::Acquire);
        forget_foreign(held(two, true));
        let added = HELD.load(Ordering::Acquire);
        // A drop with both counts at 0 (a fork handler's): never below.
        HELD.store(0, Ordering::Release);
        CLOSING.store(0, Ordering::Release);
        drop(held(x, true));
        let below = HELD.load(Ordering::Acquire) != 0 || CLOSING.load(Ordering::Acquire) != 0;
        i32::from(not_added != 5) | i32::from(added != 4) << 1 | i32::from(below) << 2
    });
    drop(peer);
    assert_eq!(
        status,
        Some(0),
        "forget_foreign's count in HELD (1: it gave back a count its hand-over did not \
         make; 2: not the one it made; 4: a Held's drop took HELD or CLOSING below 0; \
         -1: the child died; None: hung)"
    );
}

/// review r29-a item 5: a forked child's fork handler clears a look's
/// request to reset (an `_exit`'s in the parent): the child's
/// reaper's first look, a plain one, must not reset the child's
/// closes still sending.
#[test]
fn a_forked_child_forgets_the_parents_reset_request() {
    // SAFETY: the child touches atomics and closes descriptors (the
    // fork handler's work), then `_exit`s.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
    if pid == 0 {
        // The parent's `_exit` asked its reaper to reset, at the fork.
        RESET_SENDING.store(true, Ordering::Release);
        forget_after_fork();
        let left = RESET_SENDING.load(Ordering::Acquire);
        // SAFETY: ends the child, no unwinding into the harness.
        unsafe { libc::_exit(i32::from(left)) };
    }
    let mut status = 0;
    // SAFETY: the child just made.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(libc::WIFEXITED(status), "the child: status {status:#x}");
    assert_eq!(
        libc::WEXITSTATUS(status),
        0,
        "RESET_SENDING still set in the forked child after its fork handler"
    );
}

/// Items come out in the order they went in, once.
#[test]
fn the_inbox_gives_the_oldest_first() {
    let b = Inbox::new();
    for i in 0..3 {
        b.push(i);
    }
    assert_eq!(b.take(), [0, 1, 2]);
    b.push(3);
    assert_eq!(b.take(), [3]);
    assert!(b.take().is_empty());
}

/// The oldest lingering close is cut, else the oldest.
#[test]
fn the_bound_cuts_the_oldest_lingering_close() {
    use Phase::{Lingering, Sending};
    assert_eq!(victim([Sending, Lingering, Lingering].into_iter()), 1);
    assert_eq!(victim([Sending, Sending].into_iter()), 0);
}
