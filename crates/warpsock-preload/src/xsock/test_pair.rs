//! Test fixture: a loopback TCP connection switched into DDP mode at both
//! ends, for the unit tests of the close, the reaper and the exit.

use std::net::{TcpListener, TcpStream};
use std::os::fd::AsFd;

use warpsock_xsock::io::{switch_fd, Options, XSocket};

/// A loopback connection switched at both ends, each end's switch in a
/// thread of its own (the handshake needs both at once): our end's
/// socket, the program's stream it was switched from (the engine holds a
/// duplicate of it: the caller drops or keeps it), and the peer's socket.
pub(crate) fn switched() -> (XSocket, TcpStream, XSocket) {
    let l = TcpListener::bind("127.0.0.1:0").expect("a listener");
    let c = TcpStream::connect(l.local_addr().expect("its address")).expect("a connection");
    let (p, _) = l.accept().expect("its peer");
    let o = Options::default();
    let (x, peer) = std::thread::scope(|sc| {
        let a = sc.spawn(|| switch_fd(c.as_fd(), &o).map_err(|e| e.to_string()));
        let b = sc.spawn(|| switch_fd(p.as_fd(), &o).map_err(|e| e.to_string()));
        (a.join().unwrap(), b.join().unwrap())
    });
    let (x, peer) = (x.expect("the switch"), peer.expect("the peer's switch"));
    (x, c, peer)
}
