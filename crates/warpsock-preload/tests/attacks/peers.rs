//! The attacker's and the legitimate peer's side of the offload's wire,
//! spoken by hand: the preamble, frames and proofs (see the crate
//! documentation), a connection that reads the victim's hello, a peer that
//! claims and proves its port, and the socket options the attacks set.

use std::io::{ErrorKind, Read, Write};
use std::net::{TcpStream, UdpSocket};
use std::time::{Duration, Instant};

/// The offload's wire format, by hand.
pub(crate) mod wire {
    pub(crate) const HELLO_PROOF_LEN: usize = 24;

    pub(crate) fn preamble(port: u16) -> Vec<u8> {
        let mut p = b"WSUD\x01\x00".to_vec();
        p.extend_from_slice(&port.to_be_bytes());
        p
    }

    pub(crate) fn frame(payload: &[u8]) -> Vec<u8> {
        let mut f = (payload.len() as u32).to_be_bytes().to_vec();
        f.extend_from_slice(payload);
        f
    }

    pub(crate) fn proof(nonce: &[u8]) -> Vec<u8> {
        let mut p = b"WSUP\x01\x00\x00\x00".to_vec();
        p.extend_from_slice(nonce);
        p
    }

    /// The control frame "proof seen".
    pub(crate) const PROVEN: [u8; 4] = [0x80, 0x01, 0x00, 0x00];
}

/// Connects to the victim's offload listener and reads its hello; returns
/// the stream and the nonce.
pub(crate) fn connect(port: u16) -> (TcpStream, Vec<u8>) {
    let mut t = TcpStream::connect(("127.0.0.1", port)).expect("the victim listens on TCP");
    t.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut hello = [0u8; wire::HELLO_PROOF_LEN];
    t.read_exact(&mut hello).expect("a hello with a nonce");
    assert_eq!(&hello[..5], b"WSUA\x01");
    assert_ne!(hello[5] & 2, 0, "the hello asks for the proof");
    (t, hello[8..].to_vec())
}

/// A peer that does everything right: its own UDP port, claimed and
/// proved. Returns the stream (proved: the victim answered) and the socket.
pub(crate) fn proven_peer(port: u16) -> (TcpStream, UdpSocket) {
    let u = UdpSocket::bind("127.0.0.1:0").unwrap();
    let (mut t, nonce) = connect(port);
    t.write_all(&wire::preamble(u.local_addr().unwrap().port()))
        .unwrap();
    u.send_to(&wire::proof(&nonce), ("127.0.0.1", port))
        .unwrap();
    let mut ans = [0u8; 4];
    t.read_exact(&mut ans)
        .expect("the victim answers the proof");
    assert_eq!(ans, wire::PROVEN);
    (t, u)
}

/// Whether the victim closes `t` within `limit` (EOF or reset).
pub(crate) fn closed_within(t: &mut TcpStream, limit: Duration) -> bool {
    t.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
    let end = Instant::now() + limit;
    let mut buf = [0u8; 4096];
    while Instant::now() < end {
        match t.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(_) => return true,
        }
    }
    false
}

/// Sets the `SOL_SOCKET` option `name` of `t` to the plain-data `v`.
pub(crate) fn set_sockopt<T: Copy>(t: &TcpStream, name: libc::c_int, v: T) {
    use std::os::fd::AsRawFd;
    // SAFETY: setting a plain-data option of the given size on our socket.
    let r = unsafe {
        libc::setsockopt(
            t.as_raw_fd(),
            libc::SOL_SOCKET,
            name,
            (&v as *const T).cast(),
            size_of::<T>() as libc::socklen_t,
        )
    };
    assert_eq!(r, 0, "option {name}: {}", std::io::Error::last_os_error());
}

/// Resets `t` (an RST instead of a FIN): `SO_LINGER` of zero, then close.
pub(crate) fn reset(t: TcpStream) {
    let l = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    set_sockopt(&t, libc::SO_LINGER, l);
    drop(t);
}
