//! A busy 8 B ping-pong of two DDP-mode sockets in one thread, made as
//! the preload makes a busy-polling program's calls (the send, then
//! non-blocking receives that go through the quiet spin first), for
//! counting instructions with callgrind (issue 12). Deterministic: after
//! each send the sender's one spin finds nothing (its peer answers only
//! later, in this same thread): the send left the socket quiet, so that
//! spin is the engine's read alone (`set_quiet_sent`); the receiver waits
//! in `poll` on its engine's socket (outside the library) until the
//! message is there, so its one spin takes it.
//!
//! `cargo run --release -p warpsock-xsock --example quiet_pingpong -- N
//! [crc|nocrc [K]]`: N round trips after 200 of warm-up, CRC off unless
//! `crc`; K more empty spins of the sender after its first (each a quiet
//! spin that finds nothing: the cost of a busy poller's wait), 0 unless
//! given. Per round trip (both sides) =
//! (total at N₂ − total at N₁) / (N₂ − N₁).

use std::io::ErrorKind;
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::time::Duration;

use warpsock_xsock::io::{switch_fd, Options, RecvFlags, Spun, XSocket};
use warpsock_xsock::switch::Limits;

const SPIN: RecvFlags = RecvFlags {
    peek: false,
    nonblocking: true,
    waitall: false,
};

/// One non-blocking receive as the preload makes it: `None` on `EAGAIN`.
fn spin(x: &XSocket, buf: &mut [u8]) -> Option<usize> {
    let mut bufs = [buf];
    let r = if x.quiet_now() {
        match x.recv_quiet(&mut bufs, SPIN) {
            Spun::Empty => return None,
            Spun::Done(r, _) => r,
            Spun::Usual => x.recv_vectored_ready(&mut bufs, SPIN, None).0,
        }
    } else {
        x.recv_vectored_ready(&mut bufs, SPIN, None).0
    };
    match r {
        Ok((n, _)) => Some(n),
        Err(e) if e.kind() == ErrorKind::WouldBlock => None,
        Err(e) => panic!("receive: {e}"),
    }
}

/// Waits (in `poll`) until `x`'s engine socket is readable.
fn wait_readable(x: &XSocket) {
    let mut p = libc::pollfd {
        fd: x.tcp_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one pollfd on the stack for the call's duration.
    let r = unsafe { libc::poll(&mut p, 1, 20_000) };
    assert_eq!(r, 1, "nothing came");
}

/// `from` sends 8 B, spins once (nothing yet: quiet after) and `empty`
/// times more, and `to` spins until it has them.
fn hop(from: &XSocket, to: &XSocket, buf: &mut [u8; 8], empty: usize) {
    let (r, _) = from.send_vectored_ready(&[&buf[..]], true, None);
    assert_eq!(r.expect("send"), 8);
    for _ in 0..=empty {
        assert_eq!(spin(from, buf), None, "an answer before the peer ran");
    }
    loop {
        if let Some(n) = spin(to, buf) {
            assert_eq!(n, 8);
            return;
        }
        wait_readable(to);
    }
}

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .map_or(1000, |s| s.parse().expect("round trips"));
    let empty: usize = std::env::args()
        .nth(3)
        .map_or(0, |s| s.parse().expect("empty spins"));
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let (b, _) = l.accept().unwrap();
    let o = Options {
        limits: Limits::with_timeout(Duration::from_secs(10)),
        crc: std::env::args().nth(2).is_some_and(|s| s == "crc"),
        ..Options::default()
    };
    let (xa, xb) = std::thread::scope(|sc| {
        let ta = sc.spawn(|| switch_fd(a.as_fd(), &o));
        let tb = sc.spawn(|| switch_fd(b.as_fd(), &o));
        (ta.join().unwrap().unwrap(), tb.join().unwrap().unwrap())
    });
    let mut buf = [7u8; 8];
    for _ in 0..200 + n {
        hop(&xa, &xb, &mut buf, empty);
        hop(&xb, &xa, &mut buf, empty);
    }
    println!(
        "{n} round trips; quiet answers {} + {} (predicted {} + {}), locks {} + {}",
        xa.quiet_answers(),
        xb.quiet_answers(),
        xa.predicted_answers(),
        xb.predicted_answers(),
        xa.state_locks(),
        xb.state_locks()
    );
}
