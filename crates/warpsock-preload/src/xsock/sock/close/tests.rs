use super::*;
use std::sync::Arc;
use warpsock_xsock::io::RecvFlags;

/// Forks, runs `child` in the child, which ends with its answer (an
/// exit status of 0 if `true`); the child's state is its own.
fn in_child(child: impl FnOnce() -> bool) -> bool {
    child_status(|| i32::from(!child())) == 0
}

/// Forks, runs `child` in the child, which `_exit`s with the status
/// it returns; that status (-1: the child did not exit, a signal
/// ended it).
fn child_status(child: impl FnOnce() -> i32) -> i32 {
    // SAFETY: the child touches only atomics, thread-locals and
    // descriptors (the fork handler's work), and frees memory (glibc's
    // fork leaves malloc usable in the child), then `_exit`s.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
    if pid == 0 {
        let status = child();
        // SAFETY: ends the child, no unwinding into the harness.
        unsafe { libc::_exit(status) };
    }
    let mut status = 0;
    // SAFETY: the child just made.
    let r = unsafe { libc::waitpid(pid, &mut status, 0) };
    assert_eq!(r, pid, "waitpid: {}", std::io::Error::last_os_error());
    if libc::WIFEXITED(status) {
        libc::WEXITSTATUS(status)
    } else {
        -1
    }
}

/// A loopback connection switched at both ends: the program's end a
/// DDP socket on its descriptor (returned; in the table, as a switch
/// leaves it), and the peer's end.
pub(in crate::xsock::sock) fn switched_pair() -> (c_int, Arc<DdpSock>, XSocket) {
    use std::os::fd::IntoRawFd;
    let (x, c, peer) = crate::xsock::test_pair::switched();
    let fd = c.into_raw_fd();
    let kept = super::super::Kept::take(fd);
    let s = DdpSock::transpose(
        crate::xsock::At::own(fd),
        x,
        false,
        false,
        (None, None),
        kept,
        false,
    )
    .unwrap_or_else(|e| panic!("transpose: errno {e}"));
    (fd, s, peer)
}

/// A DDP socket as the program's `close` finds it (the interposer's
/// test of the close, which reaches the socket through the table): a
/// [`switched_pair`]'s, `SO_LINGER` {1, `linger_s`} if `linger_s` > 0,
/// its only reference the table's (no pass of the progress thread holds
/// one from here on: the close's last reference is dropped in the
/// call); its descriptor, and the peer's end.
pub(crate) fn as_a_close_finds_it(linger_s: c_int) -> (c_int, XSocket) {
    let (fd, s, peer) = switched_pair();
    if linger_s > 0 {
        let l = libc::linger {
            l_onoff: 1,
            l_linger: linger_s,
        };
        // SAFETY: a linger struct of the test's, its size given.
        let r = unsafe {
            libc::setsockopt(
                s.x.tcp_fd(),
                libc::SOL_SOCKET,
                libc::SO_LINGER,
                (&l as *const libc::linger).cast(),
                size_of::<libc::linger>() as socklen_t,
            )
        };
        assert_eq!(r, 0, "SO_LINGER");
    }
    s.pins.close();
    (fd, peer)
}

/// A signal handler's `fork` inside the program's `close` of a DDP
/// socket, after the table let it go and before its release, the child
/// returning into the close (issue 12): the child's release and its
/// last reference's drop leave the parent's socket alone — no count in
/// `linger::CLOSING`, the socket not marked closed (its close is the
/// parent's), and no end of stream on the shared connection (a drop
/// of the socket's `XSocket` shut it: the peer read a clean end) —
/// and the parent's close then goes on: the peer reads what the parent
/// sends after the child ended, then the end of the parent's close.
#[test]
fn a_forked_childs_close_leaves_the_parents_socket() {
    let _serial = fdtable::tests::support::serial();
    let (fd, s, peer) = switched_pair();
    // No pass of the progress thread holds a reference from here on
    // (as a lingering close's release makes sure): the child's copies
    // of `s` and `t` are the last references there.
    s.pins.close();
    // The interposed `close` up to the release: the descriptor out of
    // the table, then closed; the handler's fork comes here.
    let t = fdtable::remove(fd)
        .expect("not over a hold")
        .expect("the socket in the table");
    sys::close(fd);
    let mut refs = Some((t, s));
    let status = child_status(|| {
        // The fork handlers' work on what the socket's close uses.
        reactor::forget_after_fork();
        crate::xsock::after_fork_child();
        let (t, s) = refs.take().expect("the references");
        t.release();
        let mut found = 0;
        if s.counted.load(Ordering::Acquire) {
            found |= 1;
        }
        if s.closing.load(Ordering::Acquire) != 0 {
            found |= 2;
        }
        if crate::xsock::linger::CLOSING.load(Ordering::Acquire) != 0 {
            found |= 4;
        }
        // The last references: the socket's drop, in the child.
        drop((t, s));
        found
    });
    let (t, s) = refs.take().expect("the parent's references");
    assert_eq!(
        status, 0,
        "the forked child's release of its parent's socket (1: it counted the close, 2: it \
         marked the socket closed, 4: linger::CLOSING not 0, -1: killed)"
    );
    let sent = s.x.send(b"after", false, None);
    let mut buf = [0u8; 5];
    let flags = RecvFlags {
        waitall: true,
        ..RecvFlags::default()
    };
    // (A bound for a broken run, not a measure: the bytes are there.)
    let bound = Some(Duration::from_secs(30));
    let got = peer.recv(&mut buf, flags, bound);
    assert!(
        matches!(got, Ok((5, _))) && &buf == b"after",
        "the peer read {got:?} ({:?}) where the parent sent 'after' ({sent:?}) once the \
         forked child dropped its copy of the socket: the child's drop ended the parent's \
         stream",
        String::from_utf8_lossy(&buf)
    );
    // The parent's own close: the reaper sends its end after the bytes.
    t.release();
    drop((t, s));
    let end = peer.recv(&mut buf, RecvFlags::default(), bound);
    assert!(
        matches!(end, Ok((0, _))),
        "after the parent's close: {end:?}"
    );
}

/// review r28-e item 3: bytes the peer's kernel acknowledges on a
/// close an exit looks at are progress for the exit's wait
/// (`linger::moved`), counted from the close's first look on. A
/// loopback TCP pair: 64 KiB written after a first look, every byte
/// acknowledged (the send queue empty: `SIOCOUTQ` 0), a second look.
/// The peer reads them all (a thread): 64 KiB are acknowledged only
/// as its receive window takes them, and the window of a peer that
/// never read was smaller than that on hosts whose `tcp_rmem` default
/// is Linux's older 87380 (about 43 KiB): the wait spun for good
/// (review r29-a item 4). The listener's receive buffer is set to
/// that default here, so the test does not depend on the host's; each
/// wait has a deadline that fails.
#[test]
fn bytes_acknowledged_on_a_close_an_exit_looks_at_are_progress() {
    use std::io::{Read, Write};
    use std::os::fd::AsRawFd;
    const N: usize = 64 << 10;
    // (Bounds for a broken run, not measures.)
    const BOUND: Duration = Duration::from_secs(30);
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("a listener");
    // The older default's window: the accepted socket inherits it.
    let rcvbuf: c_int = 87380 / 2;
    // SAFETY: an int from the stack, of the declared size.
    let r = unsafe {
        libc::setsockopt(
            l.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVBUF,
            (&rcvbuf as *const c_int).cast(),
            size_of::<c_int>() as socklen_t,
        )
    };
    assert_eq!(r, 0, "SO_RCVBUF: {}", std::io::Error::last_os_error());
    let mut w =
        std::net::TcpStream::connect(l.local_addr().expect("its address")).expect("a connection");
    w.set_write_timeout(Some(BOUND)).expect("a write timeout");
    let (mut r, _) = l.accept().expect("its peer");
    r.set_read_timeout(Some(BOUND)).expect("a read timeout");
    let reader = std::thread::spawn(move || {
        let mut buf = vec![0u8; N];
        r.read_exact(&mut buf).map(|()| r)
    });
    let fd = w.as_raw_fd();
    let mut seen = None;
    assert!(count_acked(fd, &mut seen).is_some(), "TCP_INFO");
    let (acked0, moved0) = (acked(), crate::xsock::linger::moved());
    w.write_all(&[7u8; N]).expect("64 KiB into the send buffer");
    let end = Instant::now() + BOUND;
    loop {
        let mut q: c_int = 0;
        // SAFETY: SIOCOUTQ into an int on the stack.
        assert_eq!(unsafe { libc::ioctl(fd, libc::TIOCOUTQ, &mut q) }, 0);
        if q == 0 {
            break;
        }
        assert!(
            Instant::now() < end,
            "{q} of 65536 bytes still unacknowledged after {BOUND:?}: the peer's window \
             does not take them"
        );
        std::thread::yield_now();
    }
    let _r = reader
        .join()
        .expect("the reader")
        .expect("the peer read the 64 KiB");
    assert!(count_acked(fd, &mut seen).is_some());
    // Other tests may add to the counts meanwhile, never take away.
    let grown = acked() - acked0;
    assert!(
        grown >= N as u64,
        "{grown} bytes acknowledged counted, of 65536"
    );
    let moved = crate::xsock::linger::moved() - moved0;
    assert!(
        moved >= N as u64,
        "the exit's progress grew {moved} bytes, of 65536 acknowledged"
    );
}

/// A thread whose `OWN` names a lingering close (a handler inside its
/// wait) forks: the child's exit must not find the parent's close,
/// even once the child switched a socket of its own; a vforked child
/// (not the sockets' owner, no fork handler) leaves it named for the
/// parent. The pointer is never dereferenced (a dangling one).
#[test]
fn a_forked_child_forgets_the_parents_lingering_close() {
    let fake = std::ptr::NonNull::<Lingering>::dangling().as_ptr();
    OWN.with(|o| o.set(fake));
    let forked = in_child(|| {
        crate::xsock::after_fork_child();
        // (A switch of the child's own, after its fork handler.)
        // SAFETY: getpid has no preconditions.
        super::super::SOCKS_OWNER.store(unsafe { libc::getpid() }, Ordering::Release);
        OWN.with(Cell::get).is_null() && own_close().is_none()
    });
    let vforked = in_child(|| own_close().is_none() && OWN.with(Cell::get) == fake);
    OWN.with(|o| o.set(std::ptr::null_mut()));
    assert!(forked, "a forked child's exit found the parent's close");
    assert!(vforked, "a child not owning the sockets took the close");
}
