//! Switches that do not happen, on loopback: a plain peer, a Reject
//! either way, a Request that cannot be refused or answered, a responder
//! that never marks to a plain client (part of `loopback.rs`).

use super::*;

#[test]
fn a_plain_peer_refuses_and_the_connection_stays_intact() {
    let (a, mut b) = tcp_pair();
    let mut o = opts();
    o.limits = Limits::with_timeout(Duration::from_millis(300));
    // The plain peer has written before; it writes and reads after.
    b.write_all(b"before ").unwrap();
    let t = Instant::now();
    let err = switch_fd(a.as_fd(), &o).unwrap_err();
    assert!(t.elapsed() < Duration::from_secs(5));
    let Failure::Refused { error, residue, .. } = &err else {
        panic!("{err}")
    };
    assert!(matches!(error, SwitchError::NoPeer { .. }), "{error}");
    assert_eq!(err.errno(), libc::ECONNREFUSED);
    assert_eq!(
        residue, b"before ",
        "the peer's bytes are kept for the program"
    );
    let mut a = a;
    a.write_all(b"hello plain peer").unwrap();
    b.write_all(b"after").unwrap();
    let mut got = vec![0; 16];
    b.read_exact(&mut got).unwrap();
    assert_eq!(got, b"hello plain peer", "the urgent mark is invisible");
    let mut got = vec![0; 5];
    a.read_exact(&mut got).unwrap();
    assert_eq!(got, b"after");
}

/// Whether `s` has `O_NONBLOCK` (on its open file description).
fn nonblocking(s: &std::net::TcpStream) -> bool {
    use std::os::fd::AsRawFd;
    // SAFETY: F_GETFL on the test's socket.
    let fl = unsafe { libc::fcntl(s.as_raw_fd(), libc::F_GETFL) };
    assert!(fl >= 0);
    fl & libc::O_NONBLOCK != 0
}

/// Reads one MPA frame (header and private data) from `s`: its bytes.
pub(crate) fn read_mpa_frame(mut s: &std::net::TcpStream) -> Vec<u8> {
    let mut f = vec![0u8; 20];
    s.read_exact(&mut f).unwrap();
    let n = usize::from(u16::from_be_bytes([f[18], f[19]]));
    f.resize(20 + n, 0);
    s.read_exact(&mut f[20..]).unwrap();
    f
}

/// A peer whose warpsock cannot serve our hello (another version) answers
/// the MPA Request with a Reject and writes on at once: the switch fails
/// with `ECONNREFUSED` and the connection stays TCP in both directions,
/// no byte lost or reordered — the peer's bytes before its mark, then
/// those behind its Reply (written with it, so read with it by the
/// engine), in the residue; later ones in the socket. Fails with the
/// former handling (the connection reset: `Failure::Broken`), with the
/// bytes read behind the Reply dropped (the residue without them), and
/// with the exchange's `TCP_NODELAY` left on the socket, and with the
/// program's `O_NONBLOCK` (an event loop's socket) left cleared by the
/// engine's blocking mode (review r28-a item 1).
#[test]
fn a_rejected_switch_leaves_the_initiators_connection_intact() {
    let (a, b) = tcp_pair();
    a.set_nonblocking(true).unwrap();
    // What the program reads: the residue, then the socket.
    let mut stream = Vec::new();
    let mut o = opts();
    o.limits = Limits::with_timeout(Duration::from_secs(5));
    std::thread::scope(|sc| {
        let peer = sc.spawn(|| {
            let mut b = &b;
            b.write_all(b"before ").unwrap();
            send_mark(b);
            // The Request (the initiator's mark skipped by the reads).
            let req = read_mpa_frame(b);
            assert_eq!(&req[..16], warpsock_xsock::switch::MPA_REQ_KEY);
            // The Reject as Linux's siw or our engine sends it (Enhanced
            // MPA: IRD/ORD zero), and bytes right behind it.
            let enhanced = req[16] & 0x10;
            let pd: &[u8] = if enhanced != 0 { &[0; 4] } else { &[] };
            let mut r = b"MPA ID Rep Frame".to_vec();
            r.extend_from_slice(&[0x20 | enhanced, req[17], 0, pd.len() as u8]);
            r.extend_from_slice(pd);
            r.extend_from_slice(b"after the reject");
            b.write_all(&r).unwrap();
        });
        let err = switch_fd_as(a.as_fd(), &o, Some(Role::Initiator)).unwrap_err();
        peer.join().unwrap();
        let Failure::Refused { error, residue, .. } = err else {
            panic!("{err}")
        };
        assert!(matches!(error, SwitchError::Rejected), "{error}");
        assert_eq!(error.errno(), libc::ECONNREFUSED);
        stream = residue;
    });
    assert!(
        !a.nodelay().unwrap(),
        "the exchange's TCP_NODELAY is undone"
    );
    assert!(nonblocking(&a), "the program's O_NONBLOCK is put back");
    a.set_nonblocking(false).unwrap();
    let (mut a, mut b) = (a, b);
    b.write_all(b" more").unwrap();
    // The whole stream in order, however the engine's read split it
    // between the residue and the socket (review r28-a item 12).
    let want: &[u8] = b"before after the reject more";
    assert!(
        stream.len() <= want.len(),
        "{:?}",
        String::from_utf8_lossy(&stream)
    );
    a.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut rest = vec![0u8; want.len() - stream.len()];
    a.read_exact(&mut rest)
        .unwrap_or_else(|e| panic!("{e}: read {:?}", String::from_utf8_lossy(&stream)));
    stream.extend_from_slice(&rest);
    assert_eq!(
        String::from_utf8_lossy(&stream),
        String::from_utf8_lossy(want)
    );
    let mut got = [0u8; 4];
    a.write_all(b"back").unwrap();
    b.read_exact(&mut got).unwrap();
    assert_eq!(&got, b"back");
}

/// The other end: an initiator whose hello we cannot serve (version 9)
/// gets an MPA Reject, and the connection goes on as TCP: the switch
/// fails with `EPROTO` (the initiator's bytes before its mark in the
/// residue), and the bytes the initiator writes after reading the Reject,
/// and ours after the failure, arrive. Fails with the former handling
/// (the Reject followed by `shutdown(SHUT_WR)`: `Failure::Broken`), and
/// with the program's `O_NONBLOCK` left cleared (review r28-a item 1).
#[test]
fn a_refused_request_leaves_the_responders_connection_intact() {
    let (a, b) = tcp_pair();
    b.set_nonblocking(true).unwrap();
    let mut o = opts();
    o.limits = Limits::with_timeout(Duration::from_secs(5));
    std::thread::scope(|sc| {
        let peer = sc.spawn(|| {
            let mut a = &a;
            send_unservable_request(a, 2);
            // The Reply (the responder's mark skipped): a Reject.
            let rep = read_mpa_frame(a);
            assert_eq!(&rep[..16], b"MPA ID Rep Frame");
            assert_ne!(rep[16] & 0x20, 0, "the Reject bit");
            a.write_all(b"after the reject").unwrap();
        });
        let err = switch_fd_as(b.as_fd(), &o, Some(Role::Responder)).unwrap_err();
        peer.join().unwrap();
        let Failure::Refused { error, residue, .. } = &err else {
            panic!("{err}")
        };
        assert!(matches!(error, SwitchError::Incompatible(_)), "{error}");
        assert_eq!(err.errno(), libc::EPROTO);
        assert_eq!(residue, b"before ");
    });
    assert!(nonblocking(&b), "the program's O_NONBLOCK is put back");
    b.set_nonblocking(false).unwrap();
    let (mut a, mut b) = (a, b);
    let mut got = [0u8; 16];
    b.read_exact(&mut got).unwrap();
    assert_eq!(&got, b"after the reject");
    b.write_all(b"back").unwrap();
    let mut got = [0u8; 4];
    a.read_exact(&mut got).unwrap();
    assert_eq!(&got, b"back");
}

/// A Request whose hello we cannot serve (version 9) and that the engine
/// cannot take either (MPA revision 7, RFC 5044 7.1: only 1 and 2 exist):
/// the Reject cannot be made, the switch fails as `Failure::Broken`, and
/// the connection is reset, as `Broken` promises — the initiator, waiting
/// for its Reply, sees `ECONNRESET` at once. Fails without the reset
/// (review r28-a item 2): the initiator's read then waits out its
/// 5 s bound.
#[test]
fn a_request_that_cannot_be_refused_resets_the_connection() {
    let (a, b) = tcp_pair();
    let mut o = opts();
    o.limits = Limits::with_timeout(Duration::from_secs(5));
    std::thread::scope(|sc| {
        let peer = sc.spawn(|| {
            let mut a = &a;
            // Revision 7: no MPA revision the core takes.
            send_unservable_request(a, 7);
            let mut buf = [0u8; 256];
            loop {
                match a.read(&mut buf) {
                    Ok(0) => panic!("end of stream, not a reset"),
                    Ok(_) => {} // a Reply the core sent before failing
                    Err(e) => return e,
                }
            }
        });
        let err = switch_fd_as(b.as_fd(), &o, Some(Role::Responder)).unwrap_err();
        broken_with_a_reset(&err, libc::EPROTO, peer.join().unwrap());
    });
}

/// The initiator's side up to its Request, which this build cannot serve
/// (its hello's version 9, MPA revision `rev`): bytes before the switch,
/// the mark, the Request; the reads after it bounded by 5 s.
fn send_unservable_request(mut a: &std::net::TcpStream, rev: u8) {
    a.write_all(b"before ").unwrap();
    send_mark(a);
    let mut hello = warpsock_xsock::Hello {
        slots: 16,
        slot_size: 65536,
    }
    .encode();
    hello[4] = 9;
    let mut req = warpsock_xsock::switch::MPA_REQ_KEY.to_vec();
    req.extend_from_slice(&[0x50, rev, 0, 4 + hello.len() as u8, 0, 16, 0, 16]);
    req.extend_from_slice(&hello);
    a.write_all(&req).unwrap();
    a.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
}

/// The responder's switch failed as `Broken` with `errno`, and the
/// initiator's read (its error `peer`) saw the reset.
fn broken_with_a_reset(err: &Failure, errno: i32, peer: std::io::Error) {
    let Failure::Broken { errno: e, .. } = err else {
        panic!("{err}")
    };
    assert_eq!(*e, errno, "{err}");
    assert_eq!(
        peer.kind(),
        std::io::ErrorKind::ConnectionReset,
        "the initiator sees a reset: {peer}"
    );
}

/// As above, the Reject made impossible earlier: no descriptor is left
/// for the engine's duplicate of the socket (`EMFILE`, `RLIMIT_NOFILE` in
/// a child process of this test's, every lower number taken). The switch
/// fails as `Broken` and resets, as the Accept arm does (review r28-a
/// item 2); fails without the reset (the initiator's read waits out its
/// 5 s bound).
#[test]
fn a_reject_without_a_descriptor_resets_the_connection() {
    const CHILD: &str = "XSOCK_TEST_EMFILE_CHILD";
    // The test's own name as the harness knows it (its module's path
    // past the crate's name).
    let name = format!(
        "{}::a_reject_without_a_descriptor_resets_the_connection",
        module_path!().split_once("::").map_or("", |(_, m)| m)
    );
    if std::env::var_os(CHILD).is_none() {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", &name, "--nocapture", "--test-threads=1"])
            .env(CHILD, "1")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{text}");
        assert!(text.contains("1 passed"), "{text}");
        return;
    }
    let (a, b) = tcp_pair();
    let mut o = opts();
    o.limits = Limits::with_timeout(Duration::from_secs(5));
    std::thread::scope(|sc| {
        let peer = sc.spawn(|| {
            let mut a = &a;
            send_unservable_request(a, 2);
            let mut buf = [0u8; 256];
            match a.read(&mut buf) {
                Ok(n) => panic!("{n} bytes (0: end of stream), not a reset"),
                Err(e) => e,
            }
        });
        // Every descriptor number below a limit taken: the switch's
        // duplicate of `b` gets EMFILE.
        let lim = libc::rlimit {
            rlim_cur: 256,
            rlim_max: 256,
        };
        // SAFETY: setrlimit reads the struct; open takes a C string.
        unsafe {
            assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &lim), 0);
            while libc::open(c"/dev/null".as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) >= 0 {}
        }
        let err = switch_fd_as(b.as_fd(), &o, Some(Role::Responder)).unwrap_err();
        broken_with_a_reset(&err, libc::EMFILE, peer.join().unwrap());
    });
}

/// Policy mode at accept time: the accepting end responds whatever the
/// addresses say, so a client without warpsock never gets an urgent byte —
/// not in its reads, and not as `POLLPRI` either (curl fails a connect that
/// shows it). Checked on a pair where the accepting end's address is the
/// lower one (by addresses it would initiate and mark at once).
#[test]
fn an_accepting_responder_never_marks_to_a_plain_client() {
    use std::os::fd::AsRawFd;
    let (client, server) = (0..200)
        .map(|_| tcp_pair())
        .find(|(c, s)| {
            warpsock_xsock::switch::role(s.local_addr().unwrap(), c.local_addr().unwrap())
                == Some(Role::Initiator)
        })
        .expect("a pair whose accepting end has the lower port");
    let mut o = opts();
    o.limits = Limits::with_timeout(Duration::from_millis(300));
    o.limits.at_start = true;
    // The plain client speaks first (an HTTP request): the switch ends at
    // once, the request left in the socket for the program (no residue:
    // a forking server's child reads it from its copy of the socket).
    let mut client = client;
    client.write_all(b"GET / HTTP/1.0\r\n\r\n").unwrap();
    let err = switch_fd_as(server.as_fd(), &o, Some(Role::Responder)).unwrap_err();
    let Failure::Refused { error, residue, .. } = &err else {
        panic!("{err}")
    };
    assert!(matches!(error, SwitchError::PeerNotSwitching), "{error}");
    assert!(residue.is_empty(), "{residue:?}");
    let mut request = [0u8; 18];
    (&server).read_exact(&mut request).unwrap();
    assert_eq!(&request, b"GET / HTTP/1.0\r\n\r\n");
    let mut p = libc::pollfd {
        fd: client.as_raw_fd(),
        events: libc::POLLPRI | libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one pollfd on the stack.
    let n = unsafe { libc::poll(&mut p, 1, 100) };
    assert_eq!(n, 0, "the client saw {:#x}", p.revents);
    // A silent plain client: the responder gives up at its deadline,
    // having sent nothing.
    let (client, server) = tcp_pair();
    let err = switch_fd_as(server.as_fd(), &o, Some(Role::Responder)).unwrap_err();
    assert_eq!(err.errno(), libc::ECONNREFUSED, "{err}");
    p.fd = client.as_raw_fd();
    // SAFETY: as above.
    let n = unsafe { libc::poll(&mut p, 1, 100) };
    assert_eq!(n, 0, "the client saw {:#x}", p.revents);
}
