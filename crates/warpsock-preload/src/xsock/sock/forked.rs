//! Tests: a forked child's first `select`/`epoll_wait` ([`doorbell_wait`])
//! and its parent's DDP sockets (issue 12).

use std::cell::RefCell;
use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc};
use std::thread::LocalKey;

use libc::c_int;
use warpsock_xsock::io::RecvFlags;

use super::close::tests::switched_pair;
use super::{doorbell_wait, DOORBELL_WAITS, SOCKS};
use crate::shim::forktest::{child_within, within, HUNG};
use crate::shim::{fdtable, reactor, sys};

/// What a `poll` of `fd` shows now (input asked).
fn shown(fd: c_int) -> i16 {
    let mut p = [libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    }];
    assert!(sys::poll(&mut p, 0) >= 0);
    p[0].revents
}

/// What a thread of the parent holds locked when the process forks.
#[derive(Clone, Copy, Debug)]
enum Held {
    /// Nothing.
    Nothing,
    /// The table of DDP sockets ([`SOCKS`]).
    Table,
    /// The socket's doorbell books ([`super::Follow`]).
    Books,
}

/// A process with a DDP socket (readable: a byte arrived, processed, no
/// bell rung — nobody waits in `select` or `epoll_wait`) forks while a
/// thread of its holds `held`; the child runs the fork handlers' work on
/// the sockets, then its first `select` (or `epoll_wait`: the same
/// [`doorbell_wait`]). Returns the child's status (`None`: hung, killed)
/// and whether the parent's doorbell shows input after the child ended.
fn first_wait_in_a_child(held: Held) -> (Option<i32>, bool) {
    let (fd, s, peer) = switched_pair();
    assert!(
        !DOORBELL_WAITS.load(Ordering::SeqCst),
        "a doorbell wait ran in the test process: the child's would be no first"
    );
    let sent = peer.send(b"x", false, None);
    assert!(matches!(sent, Ok(1)), "the peer's send: {sent:?}");
    let mut b = [0u8; 1];
    let peek = RecvFlags {
        peek: true,
        ..RecvFlags::default()
    };
    assert!(
        matches!(s.x.recv(&mut b, peek, Some(HUNG)), Ok((1, _))),
        "the peer's byte"
    );
    assert!(s.x.readiness_now().readable);
    assert_eq!(
        shown(s.bell.app) & libc::POLLIN,
        0,
        "a bell before the fork"
    );
    let (say, heard) = mpsc::channel();
    let (go, gone) = mpsc::channel::<()>();
    let holder = {
        let s = Arc::clone(&s);
        std::thread::spawn(move || {
            let table = matches!(held, Held::Table).then(|| SOCKS.lock());
            let books = matches!(held, Held::Books).then(|| s.inner.lock());
            say.send(()).expect("the test waits");
            let _ = gone.recv();
            drop((table, books));
        })
    };
    heard.recv().expect("the holder holds");
    let status = child_within(|| {
        // The fork handlers' work on the sockets (`init::fork_child`;
        // `demote_all` aside: the table is the test process's).
        reactor::forget_after_fork();
        crate::xsock::after_fork_child();
        doorbell_wait(true);
        0
    });
    go.send(()).expect("the holder waits");
    holder.join().expect("the holder");
    let rung = shown(s.bell.app) & libc::POLLIN != 0;
    let t = fdtable::remove(fd)
        .expect("not over a hold")
        .expect("the socket in the table");
    sys::close(fd);
    t.release();
    drop((t, s, peer));
    (status, rung)
}

/// The test's message for a child's status.
fn said(status: Option<i32>) -> &'static str {
    match status {
        Some(0) => "ended",
        None => "hung in its first select (killed)",
        Some(_) => "failed",
    }
}

/// A forked child's first `select` while a thread of the parent held the
/// table of DDP sockets at the fork (that thread is not in the child):
/// the child neither walks nor locks the parent's table. Before, it
/// locked its copy, held for good: the child hung.
#[test]
fn a_forked_childs_first_select_never_locks_the_parents_table() {
    let _serial = fdtable::tests::support::serial();
    let (status, _) = first_wait_in_a_child(Held::Table);
    assert_eq!(
        status,
        Some(0),
        "the forked child {} (the parent's thread held SOCKS at the fork)",
        said(status)
    );
}

/// As above, a thread of the parent holding one of its sockets' doorbell
/// books: the child never locks a socket of its parent's. Before, its
/// walk reflected the socket's readiness under that lock: hung.
#[test]
fn a_forked_childs_first_select_never_locks_a_parents_socket() {
    let _serial = fdtable::tests::support::serial();
    let (status, _) = first_wait_in_a_child(Held::Books);
    assert_eq!(
        status,
        Some(0),
        "the forked child {} (the parent's thread held a socket's books at the fork)",
        said(status)
    );
}

/// A forked child's first `select`, no lock held at the fork, rings no
/// bell of its parent's socket (whose doorbell pair the child's copy of
/// the descriptors shares): before, its walk found the parent's readable
/// socket with no bell out and rang one — the parent's doorbell showed
/// input its books did not count (never drained: a level-triggered
/// `epoll` of the parent's woke for it for good once the byte was read).
#[test]
fn a_forked_childs_first_select_rings_no_parent_bell() {
    let _serial = fdtable::tests::support::serial();
    let (status, rung) = first_wait_in_a_child(Held::Nothing);
    assert_eq!(status, Some(0), "the forked child {}", said(status));
    assert!(
        !rung,
        "the parent's doorbell shows input after the forked child's first select: the child \
         rang its parent's bell"
    );
}

/// A hook: run once, on the thread that set it.
type Hook = RefCell<Option<Box<dyn FnOnce()>>>;

thread_local! {
    /// Run in `xsock::switch` once the handshake returned, before the
    /// commit: where a signal handler's `fork` in the handshake's waits
    /// returns.
    pub(in crate::xsock) static AFTER_HANDSHAKE: Hook = const { RefCell::new(None) };
    /// Run in `xsock::switch`'s commit stretch, first.
    pub(in crate::xsock) static IN_COMMIT: Hook = const { RefCell::new(None) };
}

/// Runs the hook `at` of this thread, if set (once).
pub(in crate::xsock) fn hook(at: &'static LocalKey<Hook>) {
    if let Some(f) = at.with(|h| h.borrow_mut().take()) {
        f();
    }
}

/// A signal handler's `fork` in a switch's handshake (its waits), the
/// child returning into the switch (issue 12): the child commits nothing
/// to its parent's connection — its call fails, no DDP socket of its own
/// on it, its descriptor a dead end (as the fork handlers make its copies
/// of the parent's DDP sockets) — and the parent's switch, made, carries
/// its stream both ways once the child ended. Before, the child made the
/// switch too (a DDP socket of the child's, with an engine of its own, on
/// the parent's connection). And the commit runs with asynchronous
/// signals blocked: no handler, and so no handler's `fork`, between the
/// child's check and the commit (the child of one there registered the
/// connection in the parent's epoll set, shared: the second registration
/// failed, and its process reset the connection).
#[test]
fn a_forked_child_of_a_switch_commits_nothing_to_its_parents_connection() {
    use std::cell::Cell;
    use std::net::{TcpListener, TcpStream};
    use std::os::fd::{AsFd, IntoRawFd};
    use std::rc::Rc;
    use warpsock_xsock::io::{switch_fd, Options};
    let _serial = fdtable::tests::support::serial();
    let l = TcpListener::bind("127.0.0.1:0").expect("a listener");
    let c = TcpStream::connect(l.local_addr().expect("its address")).expect("a connection");
    let (p, _) = l.accept().expect("its peer");
    let peer = std::thread::spawn(move || {
        let x = switch_fd(p.as_fd(), &Options::default()).map_err(|e| e.to_string());
        (x, p)
    });
    let fd = c.into_raw_fd();
    // 0 in the child, the child's pid in the parent.
    let forked = Rc::new(Cell::new(-1));
    let blocked = Rc::new(Cell::new(None));
    let (f, b) = (forked.clone(), blocked.clone());
    AFTER_HANDSHAKE.with(|h| {
        *h.borrow_mut() = Some(Box::new(move || {
            // SAFETY: the child runs the fork handlers' work on the
            // sockets, returns into the switch and `_exit`s below.
            let pid = unsafe { libc::fork() };
            if pid == 0 {
                reactor::forget_after_fork();
                crate::xsock::after_fork_child();
            }
            f.set(pid);
        }));
    });
    IN_COMMIT.with(|h| {
        *h.borrow_mut() = Some(Box::new(move || {
            // SAFETY: reads the thread's mask into a set on the stack.
            b.set(Some(unsafe {
                let mut set: libc::sigset_t = std::mem::zeroed();
                libc::pthread_sigmask(libc::SIG_BLOCK, std::ptr::null(), &mut set);
                libc::sigismember(&set, libc::SIGTERM) == 1
            }));
        }));
    });
    let r = crate::xsock::switch(fd, &Options::default(), false, None, None);
    if forked.get() == 0 {
        let mut bad = 0;
        if r.is_ok() {
            bad |= 1;
        }
        if fdtable::get(fd).is_some() {
            bad |= 2;
        }
        // A dead end's read fails with `ENOTCONN` at once (a connected
        // TCP socket or a doorbell: `EAGAIN`).
        let mut one = 0u8;
        // SAFETY: a one-byte read into a local.
        let end = unsafe { libc::recv(fd, (&mut one as *mut u8).cast(), 1, libc::MSG_DONTWAIT) };
        if end != -1 || sys::errno() != libc::ENOTCONN {
            bad |= 4;
        }
        // SAFETY: ends the child, no unwinding into the harness.
        unsafe { libc::_exit(bad) };
    }
    assert!(forked.get() > 0, "fork: {}", forked.get());
    let status = within(forked.get());
    let (x, _p) = peer.join().expect("the peer's thread");
    let peer = x.expect("the peer's switch");
    assert_eq!(r, Ok(()), "the parent's switch");
    assert_eq!(
        status,
        Some(0),
        "the forked child's return into the switch (1: its switch succeeded, 2: its table holds a \
         DDP socket on the parent's connection, 4: its descriptor is not a dead end; None: hung, \
         killed)"
    );
    assert_eq!(
        blocked.get(),
        Some(true),
        "the switch's commit ran with SIGTERM not blocked (None: not reached)"
    );
    let s = fdtable::get(fd).expect("the parent's DDP socket");
    // SAFETY: a buffer of the test's, its length given.
    let sent = unsafe { s.send_one(b"after".as_ptr().cast(), 5, 0) };
    let mut buf = [0u8; 5];
    let flags = RecvFlags {
        waitall: true,
        ..RecvFlags::default()
    };
    let got = peer.recv(&mut buf, flags, Some(HUNG));
    assert!(
        matches!(got, Ok((5, _))) && &buf == b"after",
        "the peer read {got:?} ({:?}) where the parent sent 'after' ({sent}) once the forked \
         child ended",
        String::from_utf8_lossy(&buf)
    );
    let back = peer.send(b"back", false, None);
    assert!(matches!(back, Ok(4)), "the peer's send: {back:?}");
    let mut buf = [0u8; 4];
    // SAFETY: a buffer of the test's, its length given.
    let n = unsafe { s.recv_one(buf.as_mut_ptr().cast(), 4, libc::MSG_WAITALL) };
    assert!(
        n == 4 && &buf == b"back",
        "the parent read {n} ({:?}) where the peer sent 'back'",
        String::from_utf8_lossy(&buf)
    );
    drop(s);
    let t = fdtable::remove(fd)
        .expect("not over a hold")
        .expect("the socket in the table");
    sys::close(fd);
    t.release();
    drop((t, peer));
}
