//! A connected pair of DDP sockets on loopback, for the module tests.

use std::net::{TcpListener, TcpStream};
use std::os::fd::AsFd;

use crate::io::{switch_fd, Options, XSocket};

/// Two sockets switched into DDP mode with the default options, each end
/// of one loopback connection (the TCP sockets themselves are dropped:
/// each `XSocket` holds its own descriptor).
pub(crate) fn pair() -> (XSocket, XSocket) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let (s, _) = l.accept().unwrap();
    let o = Options::default();
    std::thread::scope(|sc| {
        let ta = sc.spawn(|| switch_fd(c.as_fd(), &o).unwrap());
        let tb = sc.spawn(|| switch_fd(s.as_fd(), &o).unwrap());
        (ta.join().unwrap(), tb.join().unwrap())
    })
}

/// As [`pair`], both ends switched with `o`.
pub(crate) fn pair_with(o: &Options) -> (XSocket, XSocket) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let (s, _) = l.accept().unwrap();
    std::thread::scope(|sc| {
        let ta = sc.spawn(|| switch_fd(c.as_fd(), o).unwrap());
        let tb = sc.spawn(|| switch_fd(s.as_fd(), o).unwrap());
        (ta.join().unwrap(), tb.join().unwrap())
    })
}

/// Small slots (4 of 1 KiB payload: a window of a few KiB), no zero-copy
/// sends, and a send buffer of `sndbuf` bytes: the send buffer's tests.
pub(crate) fn small(sndbuf: usize) -> Options {
    Options {
        slots: 4,
        slot_size: Options::slot_size_for(1024),
        zcopy_min: 1 << 20,
        sndbuf,
        ..Options::default()
    }
}
