//! The bulk path of DDP-mode sockets over loopback, counted (no timings):
//! FPDU size, system calls, watch changes and copies per MiB.

use std::os::fd::AsRawFd;

use warpsock_engine::proto::wire::fpdu::mulpdu_for_mss;

mod net;

use net::{opts, switch_both};

/// A DDP socket's queue pair is set up by the in-band switch (MPA on the
/// program's own connection), not by the connection manager's `connect`
/// or `accept`, yet it sizes its FPDUs by the same rule: towards a
/// loopback peer as large as MPA allows (64 KiB), never `TCP_MAXSEG` —
/// made 1,200 bytes here before connecting, so FPDUs fitted to segments
/// would be that small.
#[test]
fn the_switch_sizes_fpdus_like_the_connection_manager_over_loopback() {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let c = connect_with_mss(l.local_addr().unwrap(), 1200);
    let (s, _) = l.accept().unwrap();
    let mss = |t: &std::net::TcpStream| {
        let mut v: libc::c_int = 0;
        let mut n = size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: getsockopt writes one int into `v`.
        let r = unsafe {
            libc::getsockopt(
                t.as_raw_fd(),
                libc::IPPROTO_TCP,
                libc::TCP_MAXSEG,
                (&mut v as *mut libc::c_int).cast(),
                &mut n,
            )
        };
        assert_eq!(r, 0);
        v as usize
    };
    assert!(mss(&c) <= 1200, "TCP_MAXSEG {}", mss(&c));
    let (xc, xs) = switch_both(&c, &s, &opts());
    let most = mulpdu_for_mss(1 << 16);
    assert_eq!(xc.mulpdu(), most, "initiator or responder, by address");
    assert_eq!(xs.mulpdu(), most);
}

/// A connected stream whose MSS was capped at `mss` before `connect`.
fn connect_with_mss(to: std::net::SocketAddr, mss: libc::c_int) -> std::net::TcpStream {
    use std::os::fd::FromRawFd;
    let std::net::SocketAddr::V4(v4) = to else {
        panic!("IPv4 only")
    };
    // SAFETY: plain socket calls on a descriptor this function owns until
    // it hands it to the `TcpStream`.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        assert!(fd >= 0);
        let r = libc::setsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_MAXSEG,
            (&mss as *const libc::c_int).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        );
        assert_eq!(r, 0);
        let sa = libc::sockaddr_in {
            sin_family: libc::AF_INET as libc::sa_family_t,
            sin_port: v4.port().to_be(),
            sin_addr: libc::in_addr {
                s_addr: u32::from(*v4.ip()).to_be(),
            },
            sin_zero: [0; 8],
        };
        let r = libc::connect(
            fd,
            (&sa as *const libc::sockaddr_in).cast(),
            size_of::<libc::sockaddr_in>() as libc::socklen_t,
        );
        assert_eq!(r, 0, "{}", std::io::Error::last_os_error());
        std::net::TcpStream::from_raw_fd(fd)
    }
}
