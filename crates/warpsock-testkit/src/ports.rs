//! Loopback ports for tests, without the `free_port()` race.
//!
//! The old fixture bound port 0, read the number, closed the socket and
//! handed the number on: between the close and the real bind any other
//! process (a parallel test, an outgoing connection given that ephemeral
//! port) could take it. Two ways replace it:
//!
//! - When the code under test accepts a socket, bind port 0 here and pass
//!   the socket: [`loopback_listener`], [`loopback_udp`]. No race at all.
//! - When a program must bind the port itself (a server process, an API
//!   that takes `host:port`), [`lease_port`] / [`PortLease`] give a port
//!   that no other user of this crate can be given while the lease lives,
//!   chosen below the kernel's ephemeral range so that no port-0 bind and
//!   no outgoing connection on this machine is handed it either. The
//!   residual race is a foreign program binding that exact port number on
//!   purpose between our check and the program's bind; nothing the tests
//!   start does that.

use std::fs::{File, OpenOptions};
use std::net::{Ipv4Addr, TcpListener, UdpSocket};
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};

/// Lowest port handed out by [`lease_port`].
const FIRST: u16 = 20_000;
/// Upper bound (exclusive) when the ephemeral range cannot be read.
const DEFAULT_END: u16 = 32_768;

/// A TCP listener on 127.0.0.1, port 0, and the port the kernel chose.
pub fn loopback_listener() -> (TcpListener, u16) {
    let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind 127.0.0.1:0");
    let port = l.local_addr().expect("local_addr").port();
    (l, port)
}

/// A UDP socket on 127.0.0.1, port 0, and the port the kernel chose.
pub fn loopback_udp() -> (UdpSocket, u16) {
    let s = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind udp 127.0.0.1:0");
    let port = s.local_addr().expect("local_addr").port();
    (s, port)
}

/// A TCP socket bound to 127.0.0.1, port 0, that does not listen (yet):
/// while it lives a connection to its port is refused, and no other socket
/// can bind the port — unlike a leased port, which a program that does not
/// lease can still take. [`Self::listen`] turns it into a listener later,
/// for a test of a client that retries until its server listens.
#[derive(Debug)]
pub struct RefusingPort {
    fd: std::os::fd::OwnedFd,
    port: u16,
}

impl RefusingPort {
    /// Binds the socket.
    pub fn new() -> std::io::Result<Self> {
        use std::os::fd::FromRawFd;
        // SAFETY: plain socket(2); the descriptor is owned below.
        let raw = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
        if raw < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `raw` is a descriptor this function just opened.
        let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(raw) };
        // SAFETY: an all-zero sockaddr_in is valid; the fields are set next.
        let mut sa: libc::sockaddr_in = unsafe { std::mem::zeroed() };
        sa.sin_family = libc::AF_INET as libc::sa_family_t;
        sa.sin_addr.s_addr = u32::from(Ipv4Addr::LOCALHOST).to_be();
        let mut len = size_of::<libc::sockaddr_in>() as libc::socklen_t;
        // SAFETY: `sa` outlives both calls and `len` is its size.
        let r = unsafe {
            let p = std::ptr::addr_of_mut!(sa).cast::<libc::sockaddr>();
            if libc::bind(fd.as_raw_fd(), p, len) == 0 {
                libc::getsockname(fd.as_raw_fd(), p, &mut len)
            } else {
                -1
            }
        };
        if r != 0 {
            return Err(std::io::Error::last_os_error());
        }
        let port = u16::from_be(sa.sin_port);
        Ok(Self { fd, port })
    }

    /// The bound port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Starts listening on the port: connections are accepted from now on.
    pub fn listen(self) -> std::io::Result<TcpListener> {
        // SAFETY: listen(2) on a socket this value owns.
        if unsafe { libc::listen(self.fd.as_raw_fd(), 128) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(TcpListener::from(self.fd))
    }
}

/// A port reserved for a program that binds it itself; free for both TCP
/// and UDP on 127.0.0.1 when leased. The reservation (an advisory lock on
/// a per-port file in the temporary directory) ends when this drops.
#[derive(Debug)]
pub struct PortLease {
    port: u16,
    _lock: File,
}

impl PortLease {
    /// Leases the next port that is free and not leased by anyone else.
    ///
    /// # Panics
    /// When no port in the range is free ([`Self::try_new`] says `None`).
    pub fn new() -> Self {
        Self::try_new().unwrap_or_else(|| panic!("no free port to lease on 127.0.0.1"))
    }

    /// As [`Self::new`]; `None` when no port in the range is free.
    pub fn try_new() -> Option<Self> {
        static NEXT: AtomicU32 = AtomicU32::new(u32::MAX);
        let end = ephemeral_start().unwrap_or(DEFAULT_END).max(FIRST + 1000);
        let span = u32::from(end - FIRST);
        // Processes start at different points so that they rarely contend.
        let _ = NEXT.compare_exchange(
            u32::MAX,
            std::process::id().wrapping_mul(7919) % span,
            Ordering::SeqCst,
            Ordering::SeqCst,
        );
        let dir = lock_dir();
        for _ in 0..span {
            let port = FIRST + (NEXT.fetch_add(1, Ordering::SeqCst) % span) as u16;
            let Some(lock) = try_lock(&dir, port) else {
                continue;
            };
            if TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_ok()
                && UdpSocket::bind((Ipv4Addr::LOCALHOST, port)).is_ok()
            {
                return Some(Self { port, _lock: lock });
            }
        }
        None
    }

    /// The leased port.
    pub fn port(&self) -> u16 {
        self.port
    }
}

impl Default for PortLease {
    fn default() -> Self {
        Self::new()
    }
}

/// A leased port kept for the rest of this process (the lease is never
/// released, so no later call in this process or in another one can be
/// given it while this process runs). For tests that pass a port number
/// to a program or API that binds it itself.
pub fn lease_port() -> u16 {
    try_lease_port().unwrap_or_else(|| panic!("no free port to lease on 127.0.0.1"))
}

/// As [`lease_port`]; `None` when no port is free.
pub fn try_lease_port() -> Option<u16> {
    let lease = PortLease::try_new()?;
    let port = lease.port();
    std::mem::forget(lease);
    Some(port)
}

/// Whether some process holds a lease on `port` now.
pub fn is_leased(port: u16) -> bool {
    try_lock(&lock_dir(), port).is_none()
}

fn lock_dir() -> PathBuf {
    let dir = std::env::temp_dir().join("warpsock-testkit-ports");
    std::fs::create_dir_all(&dir).expect("create the port lock directory");
    dir
}

/// An exclusive, non-blocking advisory lock on the port's file, or `None`
/// when another lease holds it.
fn try_lock(dir: &std::path::Path, port: u16) -> Option<File> {
    let f = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(dir.join(port.to_string()))
        .ok()?;
    // SAFETY: flock on a descriptor this function owns; no memory is shared.
    let r = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    (r == 0).then_some(f)
}

/// The first port of the kernel's ephemeral range (`ip_local_port_range`).
fn ephemeral_start() -> Option<u16> {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leases_are_distinct_and_bindable() {
        let a = PortLease::new();
        let b = PortLease::new();
        assert_ne!(a.port(), b.port());
        assert!(a.port() >= FIRST);
        // A second lock on a leased port is refused.
        assert!(try_lock(&lock_dir(), a.port()).is_none());
        TcpListener::bind((Ipv4Addr::LOCALHOST, a.port())).unwrap();
        let p = a.port();
        drop(a);
        assert!(try_lock(&lock_dir(), p).is_some(), "released on drop");
        assert!(!is_leased(p));
        let kept = lease_port();
        assert!(is_leased(kept), "kept for the process");
    }

    #[test]
    fn a_refusing_port_refuses_until_it_listens() {
        use std::net::TcpStream;
        let r = RefusingPort::new().unwrap();
        let port = r.port();
        assert_ne!(port, 0);
        let e = TcpStream::connect((Ipv4Addr::LOCALHOST, port)).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::ConnectionRefused);
        // Held: nobody else can bind it.
        assert!(TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_err());
        let l = r.listen().unwrap();
        assert_eq!(l.local_addr().unwrap().port(), port);
        TcpStream::connect((Ipv4Addr::LOCALHOST, port)).unwrap();
        l.accept().unwrap();
    }

    #[test]
    fn listeners_come_bound() {
        let (l, port) = loopback_listener();
        assert_eq!(l.local_addr().unwrap().port(), port);
        let (u, port) = loopback_udp();
        assert_eq!(u.local_addr().unwrap().port(), port);
    }
}
