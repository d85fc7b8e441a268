//! Helpers of the loopback tests: switched pairs of real TCP connections.
#![allow(dead_code)] // each test crate uses some of them

use std::net::{TcpListener, TcpStream};
use std::os::fd::{AsFd, AsRawFd};
use std::time::{Duration, Instant};

use warpsock_xsock::io::{switch_fd, Options, RecvFlags, XSocket};
use warpsock_xsock::switch::Limits;

pub(crate) const LIMIT: Duration = Duration::from_secs(20);

pub(crate) fn opts() -> Options {
    Options {
        limits: Limits::with_timeout(Duration::from_secs(3)),
        ..Options::default()
    }
}

pub(crate) fn tcp_pair() -> (TcpStream, TcpStream) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let (s, _) = l.accept().unwrap();
    (c, s)
}

pub(crate) fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            (x.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 56) as u8
        })
        .collect()
}

/// Switches both ends at once (each in its own thread).
pub(crate) fn switch_both(a: &TcpStream, b: &TcpStream, o: &Options) -> (XSocket, XSocket) {
    std::thread::scope(|sc| {
        let ta = sc.spawn(|| switch_fd(a.as_fd(), o));
        let tb = sc.spawn(|| switch_fd(b.as_fd(), o));
        let (ra, rb) = (ta.join().unwrap(), tb.join().unwrap());
        match (ra, rb) {
            (Ok(x), Ok(y)) => (x, y),
            (ra, rb) => panic!("switch failed: {:?} / {:?}", ra.err(), rb.err()),
        }
    })
}

pub(crate) fn recv_exact(x: &XSocket, n: usize) -> Vec<u8> {
    let mut out = vec![0; n];
    let mut got = 0;
    let t = Instant::now();
    while got < n {
        assert!(t.elapsed() < LIMIT, "timed out with {got}/{n}");
        let (k, _) = x
            .recv(&mut out[got..], RecvFlags::default(), Some(LIMIT))
            .unwrap();
        assert!(k > 0, "end of stream after {got}/{n}");
        got += k;
    }
    out
}

pub(crate) fn set_buf(s: &TcpStream, opt: libc::c_int, bytes: libc::c_int) {
    // SAFETY: setsockopt reads one int from the stack.
    let r = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            opt,
            (&bytes as *const libc::c_int).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    assert_eq!(r, 0);
}
