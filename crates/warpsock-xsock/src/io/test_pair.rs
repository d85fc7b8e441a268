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
