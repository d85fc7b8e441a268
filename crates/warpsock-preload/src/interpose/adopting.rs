//! One adoption of a socket at a time — per socket, not per process
//! (`super::target`).
//!
//! Two threads sending on one new socket would both adopt it, the second
//! taking the first's doorbell for the kernel socket (its send then failed
//! with `EISCONN`): the second waits for the first's adoption to end and
//! then finds the descriptor managed. A process-wide lock did that, and
//! also made every other socket's adoption wait — a policy-mode `connect`
//! adopts by switching, which waits for the server for up to the fallback
//! time. A client connecting from several threads at once (iperf 2's
//! `-P 2`) switched one connection at a time: the server's listener,
//! waiting for the data of the connection it had accepted, whose client
//! thread waited for the lock, accepted the other only after the first
//! switch gave up — both fell back to TCP after 1 s each (session 40).
//! (A policy-mode client's switch now runs in the background,
//! `xsock::switching`: its `connect` returns at once.)
//!
//! A claim names the socket's file (its inode: numbers that `dup` made of
//! one candidate are one socket), else the number. The list's lock is a
//! [`ForkList`], which a forked child starts afresh ([`fork_child`]: a
//! thread of the parent's may have held it, or a claim, at the fork); a
//! waiter sleeps on a futex word that every claim's end moves, so nothing
//! here is bound to the parent's lock.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use libc::c_int;
use warpsock_engine::rawsys::{futex_wait, futex_wake};
use warpsock_xsock::io::ForkList;

use crate::shim::epollcarry::inode;

/// What a claim names: the socket's inode, or (none) its number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Key {
    File(u64),
    Number(c_int),
}

/// The sockets being adopted.
static CLAIMS: ForkList<Key> = ForkList::new();
/// Moved on by every claim's end; a waiter sleeps on it.
static ENDS: AtomicU32 = AtomicU32::new(0);
/// A waiter looks again after this at the latest (a wake-up is never
/// missed — the word moved before it slept — but a bound costs nothing).
const RELOOK: Duration = Duration::from_millis(100);

/// A thread's claim on the adoption of a socket; ends when dropped.
pub(super) struct Claim(Key);

impl Claim {
    /// Claims the socket `fd` names, waiting while another thread of this
    /// process adopts it (then the caller looks at the descriptor again:
    /// it may be managed now).
    pub(super) fn take(fd: c_int) -> Self {
        let key = inode(fd).map_or(Key::Number(fd), Key::File);
        loop {
            let seen = ENDS.load(Ordering::Acquire);
            {
                let mut g = CLAIMS.lock();
                if !g.contains(&key) {
                    g.push(key);
                    return Self(key);
                }
            }
            futex_wait(&ENDS, seen, RELOOK);
        }
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        {
            let mut g = CLAIMS.lock();
            if let Some(i) = g.iter().position(|&k| k == self.0) {
                g.swap_remove(i);
            }
        }
        ENDS.fetch_add(1, Ordering::Release);
        futex_wake(&ENDS, i32::MAX);
    }
}

/// In a forked child: the parent's claims are its threads', which the
/// child does not have; a fresh, empty list.
pub(crate) fn fork_child() {
    CLAIMS.forget();
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsRawFd;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::mpsc;
    use std::time::Duration;

    use super::Claim;

    /// Another socket's claim never waits for a held one; the same
    /// socket's — under its own number or a duplicate's — waits until it
    /// ends.
    #[test]
    fn a_claim_waits_only_for_its_own_socket() {
        let a = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let b = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let a_dup = a.try_clone().unwrap();
        let (fa, fb, fdup) = (a.as_raw_fd(), b.as_raw_fd(), a_dup.as_raw_fd());
        let first = Claim::take(fa);
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let _other = Claim::take(fb);
            tx.send(()).unwrap();
        });
        rx.recv_timeout(Duration::from_secs(30))
            .expect("another socket's claim waited for a held one");
        static SECOND: AtomicBool = AtomicBool::new(false);
        let (tx, rx) = mpsc::channel();
        let t = std::thread::spawn(move || {
            let _same = Claim::take(fdup);
            SECOND.store(true, Ordering::SeqCst);
            tx.send(()).unwrap();
        });
        // The same socket: not before the first claim ends (a wait that
        // ends by event: the first is dropped below).
        assert!(rx.recv_timeout(Duration::from_millis(50)).is_err());
        assert!(!SECOND.load(Ordering::SeqCst));
        drop(first);
        rx.recv_timeout(Duration::from_secs(30))
            .expect("the claim never ended");
        t.join().unwrap();
    }
}
