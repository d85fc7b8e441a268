//! Policy-mode servers and raw clients for the tests of accepted
//! connections' switches: a preloaded `acceptstall` in policy mode, clients
//! from chosen loopback addresses, marks sent and answers read, the
//! server's queue looked at in `/proc/net/tcp`.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::process::Child;
use std::time::{Duration, Instant};

use super::{c_program, command, finish, spawn_ready, Run};

/// [`policy_server`] of the command `cmd` (another library, more
/// variables).
pub fn policy_server_with(
    name: &str,
    fallback_ms: u32,
    mut cmd: std::process::Command,
) -> (Child, BufReader<std::process::ChildStdout>, u16) {
    if !cmd.get_envs().any(|(k, _)| k == "WARPSOCK_DDP_ADDRS") {
        cmd.env("WARPSOCK_DDP_ADDRS", "127.0.0.1/32");
    }
    cmd.env("WARPSOCK_DDP_FALLBACK_MS", fallback_ms.to_string());
    spawn_ready(name, cmd)
}

/// A preloaded policy-mode `connrate` command (not spawned, more
/// variables may be set): `conns` connections to `port` from 127.0.0.1,
/// each echoed back, the whole run bounded by `secs`, a connection whose
/// switch is not answered falling back to TCP after `fallback_ms`.
pub fn connrate_client(
    port: u16,
    conns: u32,
    secs: u32,
    fallback_ms: u32,
) -> std::process::Command {
    let mut cl = command(
        &c_program("connrate"),
        &[port.to_string(), conns.to_string(), secs.to_string()],
        true,
    );
    cl.env("WARPSOCK_DDP_ADDRS", "127.0.0.1/32")
        .env("WARPSOCK_DDP_FALLBACK_MS", fallback_ms.to_string());
    cl
}

/// Sends one urgent byte: a warpsock switch mark.
pub fn mark(t: &TcpStream) {
    let b = [0xD7u8];
    // SAFETY: send of one byte from the stack on an open socket.
    let r = unsafe { libc::send(t.as_raw_fd(), b.as_ptr().cast(), 1, libc::MSG_OOB) };
    assert_eq!(r, 1, "send(MSG_OOB)");
}

/// Asks the `acceptstall` server `child` to quit on its connection `q`
/// and waits for it: its run, once it exited 0 with its report.
pub fn quit_server(
    child: Child,
    out: &mut BufReader<std::process::ChildStdout>,
    mut q: TcpStream,
) -> Run {
    q.write_all(b"quit").unwrap();
    let mut last = String::new();
    let _ = out.read_line(&mut last);
    let run = finish(child, Duration::from_secs(30));
    assert!(
        run.code == Some(0) && last.starts_with("accept_max_ms"),
        "the server: {:?} {last:?} {}",
        run.code,
        run.stderr
    );
    run
}

/// A TCP connection to the server's `port` from the loopback address
/// `src`.
pub fn connect_from(src: [u8; 4], port: u16) -> TcpStream {
    use std::os::fd::FromRawFd;
    let sa = |ip: [u8; 4], port: u16| libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: port.to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from_be_bytes(ip).to_be(),
        },
        sin_zero: [0; 8],
    };
    let (from, to) = (sa(src, 0), sa([127, 0, 0, 1], port));
    let len = size_of::<libc::sockaddr_in>() as libc::socklen_t;
    // SAFETY: a new socket of ours, bound and connected with addresses
    // from the stack, then owned by the stream.
    unsafe {
        let c = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        assert!(c >= 0);
        assert_eq!(
            libc::bind(c, (&from as *const libc::sockaddr_in).cast(), len),
            0
        );
        assert_eq!(
            libc::connect(c, (&to as *const libc::sockaddr_in).cast(), len),
            0
        );
        TcpStream::from_raw_fd(c)
    }
}

/// The urgent byte the server answered `t`'s mark with, read, or `None`
/// if none came by `deadline`.
pub fn urgent_answer(t: &TcpStream, deadline: Instant) -> Option<u8> {
    let mut p = libc::pollfd {
        fd: t.as_raw_fd(),
        events: libc::POLLPRI,
        revents: 0,
    };
    let left = deadline.saturating_duration_since(Instant::now());
    // SAFETY: one pollfd on the stack.
    let r = unsafe { libc::poll(&mut p, 1, left.as_millis() as libc::c_int) };
    if r != 1 {
        return None;
    }
    let mut b = 0u8;
    // SAFETY: one byte on the stack.
    let n = unsafe { libc::recv(t.as_raw_fd(), (&mut b as *mut u8).cast(), 1, libc::MSG_OOB) };
    assert_eq!(n, 1, "recv(MSG_OOB)");
    Some(b)
}

/// The clients' ports of the server's connections on 127.0.0.1:`port`
/// (established: accepted, or still in the listener's queue) that hold
/// received bytes no read took — here, the clients' marks
/// (`/proc/net/tcp`'s `rx_queue`).
pub fn marks_queued(port: u16) -> Vec<u16> {
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap_or_default();
    let local = format!("0100007F:{port:04X}");
    table
        .lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let rx = f.get(4)?.split(':').nth(1)?;
            let queued = u32::from_str_radix(rx, 16).ok()? > 0;
            let from = u16::from_str_radix(f.get(2)?.split(':').nth(1)?, 16).ok()?;
            (f[1] == local && f[3] == "01" && queued).then_some(from)
        })
        .collect()
}

/// Whether the server has accepted the connection of `port` from the
/// client's local port `client_port`: its row in `/proc/net/tcp` names an
/// inode (0 while the connection waits in the listener's queue, no socket
/// of the program's yet).
pub fn accepted(port: u16, client_port: u16) -> bool {
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap_or_default();
    let (local, remote) = (format!(":{port:04X}"), format!(":{client_port:04X}"));
    table.lines().skip(1).any(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        f.len() > 9 && f[1].ends_with(&local) && f[2].ends_with(&remote) && f[9] != "0"
    })
}
