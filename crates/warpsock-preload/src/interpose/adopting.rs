//! One adoption of a descriptor at a time — per descriptor, not per
//! process (`super::target`).
//!
//! Two threads sending on one new socket would both adopt it, the second
//! taking the first's doorbell for the kernel socket (its send then failed
//! with `EISCONN`): the second waits for the first's adoption to end and
//! then finds the descriptor managed. A process-wide lock did that, and
//! also made every other descriptor's adoption wait — a policy-mode
//! `connect` adopts by switching, which waits for the server for up to the
//! fallback time. A client connecting from several threads at once
//! (iperf 2's `-P 2`) switched one connection at a time: the server's
//! listener, waiting for the data of the connection it had accepted, whose
//! client thread waited for the lock, accepted the other only after the
//! first switch gave up — both fell back to TCP after 1 s each
//! (session 40). (Now the first switches; the others still wait for the
//! server's accept, which comes after the first's data: README.)
//!
//! A claim names its process: a child forked while another thread of the
//! parent held one (a thread the child does not have) ignores it.

use std::sync::{Condvar, Mutex};

use libc::c_int;

use crate::shim::sys::lock;

/// The descriptors being adopted, each with the process adopting it.
static CLAIMS: Mutex<Vec<(libc::pid_t, c_int)>> = Mutex::new(Vec::new());
/// Signalled when a claim ends.
static ENDED: Condvar = Condvar::new();

/// A thread's claim on the adoption of a descriptor; ends when dropped.
pub(super) struct Claim {
    pid: libc::pid_t,
    fd: c_int,
}

impl Claim {
    /// Claims `fd`, waiting while another thread of this process adopts
    /// it (then the caller looks at the descriptor again: it may be
    /// managed now).
    pub(super) fn take(fd: c_int) -> Self {
        // SAFETY: getpid has no preconditions.
        let pid = unsafe { libc::getpid() };
        let mut g = lock(&CLAIMS);
        // Claims of another process: a parent's, copied by a fork.
        g.retain(|&(p, _)| p == pid);
        while g.iter().any(|&(_, f)| f == fd) {
            g = ENDED
                .wait(g)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
        }
        g.push((pid, fd));
        Self { pid, fd }
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        let mut g = lock(&CLAIMS);
        if let Some(i) = g.iter().position(|&c| c == (self.pid, self.fd)) {
            g.swap_remove(i);
        }
        drop(g);
        ENDED.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::mpsc;
    use std::time::Duration;

    use super::Claim;

    /// Another descriptor's claim never waits for a held one; the same
    /// descriptor's waits until it ends.
    #[test]
    fn a_claim_waits_only_for_its_own_descriptors() {
        let first = Claim::take(100_001);
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let _other = Claim::take(100_002);
            tx.send(()).unwrap();
        });
        rx.recv_timeout(Duration::from_secs(30))
            .expect("another descriptor's claim waited for a held one");
        static SECOND: AtomicBool = AtomicBool::new(false);
        let (tx, rx) = mpsc::channel();
        let t = std::thread::spawn(move || {
            let _same = Claim::take(100_001);
            SECOND.store(true, Ordering::SeqCst);
            tx.send(()).unwrap();
        });
        // The same descriptor: not before the first claim ends (a wait
        // that ends by event: the first is dropped below).
        assert!(rx.recv_timeout(Duration::from_millis(50)).is_err());
        assert!(!SECOND.load(Ordering::SeqCst));
        drop(first);
        rx.recv_timeout(Duration::from_secs(30))
            .expect("the claim never ended");
        t.join().unwrap();
    }
}
