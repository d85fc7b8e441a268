//! Sockets for this library's own use, made with the `socket` system call
//! itself rather than libc's `socket()`: a program run with rdma-core's
//! `librspreload.so` (rsockets) has every `socket()` in the process turned
//! into an rsocket — which would route our iWARP connections' own TCP
//! sockets back into librdmacm. Everything else on these descriptors
//! (bind, connect, accept, read, write) passes through librspreload
//! untouched, since it only redirects descriptors it made.
//!
//! Also the `sockaddr` conversions every C-facing part uses ([`from_c`],
//! [`to_c`]). This module depends on nothing else in the crate.

use std::io;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::Duration;

use libc::{sockaddr, sockaddr_in, sockaddr_in6, sockaddr_storage, socklen_t};

/// Reads an IPv4/IPv6 `sockaddr` (other families: None).
///
/// # Safety
/// `sa` is NULL or points to a sockaddr of its family's size.
pub unsafe fn from_c(sa: *const sockaddr) -> Option<SocketAddr> {
    if sa.is_null() {
        return None;
    }
    // SAFETY: per the contract; the family says which struct it is.
    unsafe {
        match libc::c_int::from((*sa).sa_family) {
            libc::AF_INET => {
                let s = &*sa.cast::<sockaddr_in>();
                Some(SocketAddr::V4(SocketAddrV4::new(
                    Ipv4Addr::from(u32::from_be(s.sin_addr.s_addr)),
                    u16::from_be(s.sin_port),
                )))
            }
            libc::AF_INET6 => {
                let s = &*sa.cast::<sockaddr_in6>();
                Some(SocketAddr::V6(SocketAddrV6::new(
                    Ipv6Addr::from(s.sin6_addr.s6_addr),
                    u16::from_be(s.sin6_port),
                    s.sin6_flowinfo,
                    s.sin6_scope_id,
                )))
            }
            _ => None,
        }
    }
}

/// Writes `a` into a `sockaddr_storage`; returns its length.
pub fn to_c(a: SocketAddr, out: &mut sockaddr_storage) -> socklen_t {
    // SAFETY: all-zero is a valid sockaddr_storage.
    *out = unsafe { std::mem::zeroed() };
    match a {
        SocketAddr::V4(v) => {
            // SAFETY: sockaddr_storage is large and aligned enough for any
            // sockaddr.
            let s = unsafe { &mut *(out as *mut sockaddr_storage).cast::<sockaddr_in>() };
            s.sin_family = libc::AF_INET as libc::sa_family_t;
            s.sin_port = v.port().to_be();
            s.sin_addr.s_addr = u32::from(*v.ip()).to_be();
            size_of::<sockaddr_in>() as socklen_t
        }
        SocketAddr::V6(v) => {
            // SAFETY: as above.
            let s = unsafe { &mut *(out as *mut sockaddr_storage).cast::<sockaddr_in6>() };
            s.sin6_family = libc::AF_INET6 as libc::sa_family_t;
            s.sin6_port = v.port().to_be();
            s.sin6_addr.s6_addr = v.ip().octets();
            s.sin6_flowinfo = v.flowinfo();
            s.sin6_scope_id = v.scope_id();
            size_of::<sockaddr_in6>() as socklen_t
        }
    }
}

/// `socket(2)` by system call.
pub fn socket(domain: libc::c_int, ty: libc::c_int) -> io::Result<OwnedFd> {
    // SAFETY: a plain system call; the result is checked.
    let fd = unsafe { libc::syscall(libc::SYS_socket, domain, ty | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a descriptor the kernel just gave us.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) })
}

fn family(a: &SocketAddr) -> libc::c_int {
    if a.is_ipv4() {
        libc::AF_INET
    } else {
        libc::AF_INET6
    }
}

fn set_send_timeout(fd: &OwnedFd, t: Duration) -> io::Result<()> {
    let tv = libc::timeval {
        tv_sec: t.as_secs() as libc::time_t,
        tv_usec: t.subsec_micros() as libc::suseconds_t,
    };
    // SAFETY: a live descriptor and a timeval of the right size.
    let r = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_SNDTIMEO,
            (&tv as *const libc::timeval).cast(),
            size_of::<libc::timeval>() as socklen_t,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// A TCP connection to `to`, giving up after `timeout` (the kernel's
/// `SO_SNDTIMEO` bounds a blocking connect).
pub fn tcp_connect(to: SocketAddr, timeout: Duration) -> io::Result<TcpStream> {
    let fd = socket(family(&to), libc::SOCK_STREAM)?;
    set_send_timeout(&fd, timeout)?;
    // SAFETY: all-zero is a valid sockaddr_storage.
    let mut ss: sockaddr_storage = unsafe { std::mem::zeroed() };
    let len = to_c(to, &mut ss);
    loop {
        // SAFETY: a live descriptor and a filled address of `len` bytes.
        let r = unsafe {
            libc::syscall(
                libc::SYS_connect,
                fd.as_raw_fd(),
                (&ss as *const sockaddr_storage).cast::<sockaddr>(),
                len,
            )
        };
        if r == 0 {
            break;
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EINTR) => continue,
            // SO_SNDTIMEO expiry on connect reports EINPROGRESS.
            Some(libc::EINPROGRESS | libc::EAGAIN) => {
                return Err(io::Error::from_raw_os_error(libc::ETIMEDOUT))
            }
            _ => return Err(e),
        }
    }
    set_send_timeout(&fd, Duration::ZERO)?;
    Ok(TcpStream::from(fd))
}

/// The local address the kernel would send from to reach `dst` (a UDP
/// socket's connect: routing only, nothing is sent).
pub fn route_source(dst: SocketAddr) -> io::Result<std::net::IpAddr> {
    let fd = socket(family(&dst), libc::SOCK_DGRAM)?;
    let probe = SocketAddr::new(dst.ip(), if dst.port() == 0 { 9 } else { dst.port() });
    // SAFETY: all-zero is a valid sockaddr_storage.
    let mut ss: sockaddr_storage = unsafe { std::mem::zeroed() };
    let len = to_c(probe, &mut ss);
    // SAFETY: a live descriptor and a filled address.
    let r = unsafe { libc::connect(fd.as_raw_fd(), (&ss as *const sockaddr_storage).cast(), len) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    local_addr(&fd).map(|a| a.ip())
}

/// `getsockname` as a Rust address.
pub fn local_addr(fd: &OwnedFd) -> io::Result<SocketAddr> {
    // SAFETY: all-zero is a valid sockaddr_storage; a live descriptor.
    unsafe {
        let mut ss: sockaddr_storage = std::mem::zeroed();
        let mut len = size_of::<sockaddr_storage>() as socklen_t;
        if libc::getsockname(
            fd.as_raw_fd(),
            (&mut ss as *mut sockaddr_storage).cast(),
            &mut len,
        ) != 0
        {
            return Err(io::Error::last_os_error());
        }
        from_c((&ss as *const sockaddr_storage).cast())
            .ok_or_else(|| io::Error::from_raw_os_error(libc::EAFNOSUPPORT))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connect_refused_and_route() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let a = l.local_addr().unwrap();
        let s = tcp_connect(a, Duration::from_secs(5)).unwrap();
        assert_eq!(s.peer_addr().unwrap(), a);
        drop(l);
        let e = tcp_connect(a, Duration::from_secs(5)).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ECONNREFUSED));
        assert_eq!(route_source(a).unwrap(), a.ip());
    }
}
