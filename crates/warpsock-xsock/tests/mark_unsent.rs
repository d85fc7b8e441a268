//! A switch whose own mark cannot be sent — the program filled its send
//! buffer before asking, and the peer reads nothing — gives up at the
//! mark's timeout (`SwitchError::MarkUnsent`), not never: the mark's send
//! waited for room with no bound, and the program's `setsockopt` with it
//! (helper 73). Nothing of the switch entered the stream: once the peer
//! reads, it gets every byte the program wrote, and no urgent byte.

use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd};
use std::time::Duration;

use warpsock_xsock::io::{switch_fd_as, Failure};
use warpsock_xsock::switch::Limits;
use warpsock_xsock::{Role, SwitchError};

mod net;

use net::{opts, set_buf, tcp_pair, LIMIT};

#[test]
fn a_mark_behind_a_full_send_buffer_gives_up_at_its_timeout() {
    let (mut a, mut b) = tcp_pair();
    // Small buffers, fixed (no autotuning): once full, nothing moves
    // until b reads.
    set_buf(&b, libc::SO_RCVBUF, 4096);
    set_buf(&a, libc::SO_SNDBUF, 4096);
    a.set_nonblocking(true).unwrap();
    // Large writes, then single bytes: the send buffer full to the byte
    // (a one-byte mark finds room after the large writes' last refusal).
    let mut written = 0;
    for len in [1 << 16, 1] {
        let chunk = vec![7u8; len];
        loop {
            match a.write(&chunk) {
                Ok(n) => written += n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) => panic!("filling the send buffer: {e}"),
            }
        }
    }
    let mut o = opts();
    o.limits = Limits::with_timeout(Duration::from_millis(300));
    let (tx, rx) = std::sync::mpsc::channel();
    let switcher = std::thread::spawn(move || {
        let r = switch_fd_as(a.as_fd(), &o, Some(Role::Initiator));
        tx.send(()).unwrap();
        (a, r.map(|_| ()))
    });
    // The bound is the test's, far past the mark's 300 ms: before, the
    // switch had not returned at all.
    rx.recv_timeout(LIMIT)
        .expect("the switch gave up at its mark timeout");
    let (a, r) = switcher.join().unwrap();
    match r {
        Err(Failure::Refused { error, residue, .. }) => {
            assert!(matches!(error, SwitchError::MarkUnsent { .. }), "{error:?}");
            assert!(residue.is_empty());
            assert!(error.to_string().contains("could not be sent"), "{error}");
        }
        Err(e) => panic!("{e:?}"),
        Ok(()) => panic!("switched against a peer that reads nothing"),
    }
    a.set_nonblocking(false).unwrap();
    drop(a);
    // Every byte written, in order, then the end: no mark among them.
    b.set_read_timeout(Some(LIMIT)).unwrap();
    let mut got = Vec::new();
    b.read_to_end(&mut got).unwrap();
    assert_eq!(got.len(), written);
    assert!(got.iter().all(|&x| x == 7));
    let mut p = libc::pollfd {
        fd: b.as_raw_fd(),
        events: libc::POLLPRI,
        revents: 0,
    };
    // SAFETY: one pollfd on the stack.
    assert!(unsafe { libc::poll(&mut p, 1, 0) } >= 0);
    assert_eq!(p.revents & libc::POLLPRI, 0, "no urgent byte");
}
