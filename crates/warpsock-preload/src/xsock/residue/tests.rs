//! `ResidueSock`'s unit tests.

use super::*;
use crate::shim::fdtable::tests::support::serial;

/// The last residue byte's read demotes the program's descriptors of
/// the socket; one closed behind the table meanwhile (a signal
/// handler's `close` over library code passes straight to libc) is
/// forgotten, not opened again on the TCP socket, where the program
/// would never close it and the peer never see its end (review
/// r21-haz item 4). The other is put on the TCP socket.
#[test]
fn a_demotion_does_not_open_a_number_closed_behind_the_table_again() {
    let _serial = serial();
    let mut sp = [0; 2];
    // SAFETY: a new socket pair of this test's.
    let made = unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_STREAM | libc::SOCK_CLOEXEC,
            0,
            sp.as_mut_ptr(),
        )
    };
    assert_eq!(made, 0);
    let [fd, peer] = sp;
    let s = ResidueSock::transpose(super::super::At::own(fd), b"x".to_vec(), false, None)
        .unwrap()
        .expect("wrapped");
    // A number no test opens (near the top of the descriptor limit:
    // no other test's descriptor gets it between its close and the
    // demotion), as the program's `dup` of `fd` would be managed;
    // then closed behind the table.
    // SAFETY: getrlimit into a local.
    let dup = unsafe {
        let mut l: libc::rlimit = std::mem::zeroed();
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut l), 0);
        l.rlim_cur.min(60_000) as c_int - 3
    };
    // SAFETY: on the test's descriptors.
    assert_eq!(unsafe { libc::dup2(fd, dup) }, dup);
    assert!(fdtable::insert(dup, s.clone()).unwrap().is_none());
    // SAFETY: as above.
    assert_eq!(unsafe { libc::close(dup) }, 0);
    let mut b = [0u8; 1];
    let mut iov = libc::iovec {
        iov_base: b.as_mut_ptr().cast(),
        iov_len: 1,
    };
    // SAFETY: msghdr is plain data; all-zero is an empty message.
    let mut msg: msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    // SAFETY: a message of one live local buffer.
    let n = crate::shim::guard::enter(-1, || unsafe { s.recvmsg(&mut msg, 0) });
    assert_eq!((n, b[0]), (1, b'x'), "the residue");
    // SAFETY: queries of the test's descriptors.
    let (dup_fl, fd_ino, k_ino) = unsafe {
        let ino = |d| {
            let mut st: libc::stat = std::mem::zeroed();
            assert_eq!(libc::fstat(d, &mut st), 0);
            st.st_ino
        };
        (libc::fcntl(dup, libc::F_GETFD), ino(fd), ino(s.kfd))
    };
    assert!(dup_fl < 0, "the closed number is open again");
    assert_eq!(fd_ino, k_ino, "the program's descriptor not demoted");
    assert!(fdtable::get(dup).is_none() && fdtable::get(fd).is_none());
    for d in [fd, peer] {
        // SAFETY: the test's descriptors.
        unsafe { libc::close(d) };
    }
}

/// A loopback TCP pair: the accepted end's descriptor (non-blocking, as
/// an event loop's) wrapped as a watching residue socket, and the
/// connecting end.
fn watching_pair() -> (Arc<ResidueSock>, std::net::TcpStream) {
    use std::os::fd::IntoRawFd;
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let peer = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let (mine, _) = l.accept().unwrap();
    mine.set_nonblocking(true).unwrap();
    let fd = mine.into_raw_fd();
    let s = ResidueSock::transpose(super::super::At::own(fd), Vec::new(), true, None)
        .unwrap()
        .expect("wrapped");
    (s, peer)
}

/// A non-blocking read of `s` into `buf`: its count, or the errno.
fn read_now(s: &ResidueSock, buf: &mut [u8]) -> Result<usize, c_int> {
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: msghdr is plain data; all-zero is an empty message.
    let mut msg: msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    // SAFETY: a message of one live local buffer.
    let n = crate::shim::guard::enter(-1, || unsafe { s.recvmsg(&mut msg, 0) });
    if n < 0 {
        Err(errno())
    } else {
        Ok(n as usize)
    }
}

/// What the program's end of `s`'s doorbell shows for input within `ms`.
fn shown(s: &ResidueSock, ms: c_int) -> i16 {
    let mut p = [libc::pollfd {
        fd: s.bell.app,
        events: libc::POLLIN,
        revents: 0,
    }];
    assert!(sys::poll(&mut p, ms) >= 0);
    p[0].revents
}

/// The peer sends 13 bytes of a Request's key; once they are queued (a
/// poll of the TCP socket, 10 s at most), a non-blocking read of `s`
/// fails with `EAGAIN`.
fn prefix_read_too_early(s: &ResidueSock, peer: &mut std::net::TcpStream, b: &mut [u8]) {
    std::io::Write::write_all(peer, b"MPA ID Req Fr").unwrap();
    let mut p = [libc::pollfd {
        fd: s.kfd,
        events: libc::POLLIN,
        revents: 0,
    }];
    assert_eq!(sys::poll(&mut p, 10_000), 1);
    assert_eq!(read_now(s, b), Err(libc::EAGAIN));
}

/// A Request's prefix behind the mark, undecided: a non-blocking read
/// fails with `EAGAIN` and the program's descriptor stops showing input
/// (it stayed readable: an event loop read `EAGAIN` for good, at 100 %
/// CPU; review 59); the byte that decides it (no Request) shows input
/// again, and the read returns the whole prefix as data, the program's
/// `SO_RCVLOWAT` (set meanwhile) being the TCP socket's again. Fails
/// with the bell left rung ("readable while undecided") or never rung
/// again.
#[test]
fn an_undecided_prefix_shows_no_input_until_a_byte_decides_it() {
    let _serial = serial();
    let (s, mut peer) = watching_pair();
    let mut b = [0u8; 64];
    prefix_read_too_early(&s, &mut peer, &mut b);
    assert_eq!(shown(&s, 0), 0, "readable while undecided");
    // The program's own option, kept while the watch sets its own.
    assert_eq!(
        s.setsockopt(
            libc::SOL_SOCKET,
            libc::SO_RCVLOWAT,
            (&1 as *const c_int).cast(),
            4
        ),
        0
    );
    assert_eq!(read_now(&s, &mut b), Err(libc::EAGAIN));
    assert_eq!(
        shown(&s, 0),
        0,
        "readable while undecided, after a second look"
    );
    std::io::Write::write_all(&mut peer, b"X").unwrap();
    assert_eq!(
        shown(&s, 10_000) & libc::POLLIN,
        libc::POLLIN,
        "the deciding byte rang nothing"
    );
    assert_eq!(read_now(&s, &mut b), Ok(14));
    assert_eq!(&b[..14], b"MPA ID Req FrX");
    assert_eq!(
        sys::get_int(s.kfd, libc::SOL_SOCKET, libc::SO_RCVLOWAT),
        Some(1)
    );
}

/// An urgent byte behind an undecided prefix decides it: a committed
/// initiator sends its Request whole, with none inside, so the prefix is
/// data — the read returns it (stopping at the mark, as TCP's), and the
/// urgent byte stays out of band. Before, the watch's peek stopped at the
/// mark while `tcp_poll` counted the bytes past it against the watch's
/// `SO_RCVLOWAT`: its wake-up came at once, every time, and an event loop
/// read `EAGAIN` for good at a full CPU (helper 73; fails with `EAGAIN`
/// for the prefix).
#[test]
fn an_urgent_byte_behind_an_undecided_prefix_makes_it_data() {
    use std::os::fd::AsRawFd;
    let _serial = serial();
    let (s, mut peer) = watching_pair();
    let mut b = [0u8; 64];
    prefix_read_too_early(&s, &mut peer, &mut b);
    assert_eq!(shown(&s, 0), 0, "readable while undecided");
    // SAFETY: a one-byte send from a constant.
    let sent = unsafe { libc::send(peer.as_raw_fd(), b"!".as_ptr().cast(), 1, libc::MSG_OOB) };
    assert_eq!(sent, 1);
    assert_eq!(
        shown(&s, 10_000) & libc::POLLIN,
        libc::POLLIN,
        "the urgent byte rang nothing"
    );
    assert_eq!(read_now(&s, &mut b), Ok(13), "the prefix, as data");
    assert_eq!(&b[..13], b"MPA ID Req Fr");
    assert_eq!(read_now(&s, &mut b), Err(libc::EAGAIN), "out of band");
}

/// A prefix the peer's end follows can never complete: a non-blocking
/// read returns it, then the end (0). Before, it read `EAGAIN` for good
/// (a peek cannot see the end behind queued bytes): the program never
/// closed the connection (review 59: ~4 descriptors kept a connection).
/// Fails with `EAGAIN` after the end.
#[test]
fn an_undecided_prefix_the_peers_end_follows_is_data_to_a_nonblocking_read() {
    let _serial = serial();
    let (s, mut peer) = watching_pair();
    let mut b = [0u8; 64];
    prefix_read_too_early(&s, &mut peer, &mut b);
    peer.shutdown(std::net::Shutdown::Write).unwrap();
    assert_eq!(
        shown(&s, 10_000) & libc::POLLIN,
        libc::POLLIN,
        "the end rang nothing"
    );
    assert_eq!(read_now(&s, &mut b), Ok(13));
    assert_eq!(&b[..13], b"MPA ID Req Fr");
    assert_eq!(read_now(&s, &mut b), Ok(0));
}

/// In a forked child: lowers the soft descriptor limit to 64 and takes
/// every number left with duplicates of `fd`; returns the last one taken.
fn fill_descriptors(fd: c_int) -> c_int {
    // SAFETY: the child's own limit and descriptors.
    unsafe {
        let mut lim: libc::rlimit = std::mem::zeroed();
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim);
        lim.rlim_cur = lim.rlim_cur.min(64);
        libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        let mut last = -1;
        loop {
            let d = libc::dup(fd);
            if d < 0 {
                return last;
            }
            last = d;
        }
    }
}

/// A residue socket that cannot be made (every descriptor taken: the
/// duplicate and the doorbell's pair find none) resets the connection:
/// the program's next read gets `ECONNRESET`, the peer's too. Before, the
/// residue ("abc", read by the switch) was dropped and the program read
/// on from "def", past bytes it never got, the `EMFILE` it was told the
/// same as a withdrawn switch's, whose connection goes on as TCP (helper
/// 73). Run in a child (its descriptors all taken, under a lowered soft
/// limit); the socket is the parent's too.
#[test]
fn a_residue_that_finds_no_descriptor_resets_the_connection() {
    use std::io::{Read, Write};
    use std::os::fd::IntoRawFd;
    let _serial = serial();
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let mut peer = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let (mine, _) = l.accept().unwrap();
    peer.write_all(b"def").unwrap();
    let fd = mine.into_raw_fd();
    let status = crate::shim::forktest::child_within(|| {
        fill_descriptors(fd);
        let r = ResidueSock::transpose(super::super::At::own(fd), b"abc".to_vec(), false, None);
        if !matches!(r, Err(libc::EMFILE)) {
            return 1;
        }
        let mut b = [0u8; 8];
        // SAFETY: a read into a local.
        let n = unsafe { libc::read(fd, b.as_mut_ptr().cast(), b.len()) };
        match n {
            0 => 2,
            n if n > 0 => 3,
            _ if errno() != libc::ECONNRESET => 4,
            _ => 0,
        }
    });
    assert_eq!(
        status,
        Some(0),
        "1: no EMFILE; 2: a clean end; 3: bytes past the lost residue; 4: another error"
    );
    peer.set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let mut b = [0u8; 8];
    let e = peer.read(&mut b).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ECONNRESET), "{e}");
    sys::close(fd);
}

/// Helper 73 item 4: an explicit switch's responder that finds too few
/// descriptors to finish at its answer (3 free: a Reject's, not an
/// engine's) declines — its Request answered with a Reject, the call
/// failing with `EMFILE` — and both ends go on as TCP, no byte lost.
/// Fails before (it answered, ran out in the engine's setup and reset the
/// connection: the initiator read no Reject, the child's read
/// `ECONNRESET`). The responder runs in a child (its descriptors all
/// taken but 3, under a lowered soft limit); the initiator, by hand, here.
#[test]
fn an_explicit_responder_short_of_descriptors_declines_and_stays_tcp() {
    use std::io::{Read, Write};
    use std::os::fd::{AsRawFd, IntoRawFd};
    use warpsock_xsock::switch::{Limits, Role, MARK, MPA_REQ_KEY};
    let _serial = serial();
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let peer = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let (mine, _) = l.accept().unwrap();
    let fd = mine.into_raw_fd();
    let mut o = super::super::config::get().request.clone();
    o.limits = Limits::with_timeout(Duration::from_secs(10));
    let place = super::super::budget::admit().expect("a place");
    peer.set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let initiator = std::thread::spawn(move || {
        let mut p = &peer;
        // SAFETY: one byte from the stack.
        let n = unsafe { libc::send(p.as_raw_fd(), (&MARK as *const u8).cast(), 1, libc::MSG_OOB) };
        assert_eq!(n, 1);
        let hello = warpsock_xsock::Hello {
            slots: 16,
            slot_size: 65536,
        }
        .encode();
        let mut req = MPA_REQ_KEY.to_vec();
        req.extend_from_slice(&[0x50, 2, 0, 4 + hello.len() as u8, 0, 16, 0, 16]);
        req.extend_from_slice(&hello);
        p.write_all(&req).unwrap();
        // The Reply (the responder's mark skipped by the reads).
        let mut f = [0u8; 20];
        if let Err(e) = p.read_exact(&mut f) {
            return Err(format!("no Reply: {e}"));
        }
        if &f[..16] != b"MPA ID Rep Frame" || f[16] & 0x20 == 0 {
            return Err(format!("not a Reject: {f:?}"));
        }
        let mut pd = vec![0u8; usize::from(u16::from_be_bytes([f[18], f[19]]))];
        p.read_exact(&mut pd).unwrap();
        p.write_all(b"after").unwrap();
        let mut back = [0u8; 4];
        p.read_exact(&mut back).map_err(|e| format!("{e}"))?;
        Ok(back)
    });
    let status = crate::shim::forktest::child_within(|| {
        let last = fill_descriptors(fd);
        for d in last - 2..=last {
            // SAFETY: three of the child's own duplicates, closed.
            unsafe { libc::close(d) };
        }
        let asked = (false, None, Some(Role::Responder), None);
        if super::super::switch_at(super::super::At::own(fd), &o, asked, place) != Err(libc::EMFILE)
        {
            return 1;
        }
        let tv = libc::timeval {
            tv_sec: 20,
            tv_usec: 0,
        };
        // SAFETY: setsockopt reads one timeval from the stack.
        unsafe {
            let tvp = (&tv as *const libc::timeval).cast();
            let len = size_of::<libc::timeval>() as socklen_t;
            libc::setsockopt(fd, libc::SOL_SOCKET, libc::SO_RCVTIMEO, tvp, len);
        }
        let mut b = [0u8; 5];
        // SAFETY: a read into a local.
        let n = unsafe { libc::recv(fd, b.as_mut_ptr().cast(), b.len(), libc::MSG_WAITALL) };
        if n != 5 || &b != b"after" {
            return 2;
        }
        // SAFETY: a write from a constant.
        let n = unsafe { libc::send(fd, b"back".as_ptr().cast(), 4, 0) };
        i32::from(n != 4) * 3
    });
    let seen = initiator.join().unwrap();
    assert_eq!(
        status,
        Some(0),
        "1: not EMFILE; 2: the initiator's bytes after the Reject not read; 3: no write ({seen:?})"
    );
    assert_eq!(seen.as_ref().map(|b| &b[..]), Ok(&b"back"[..]));
    sys::close(fd);
}
