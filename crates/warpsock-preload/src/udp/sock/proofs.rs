//! The proofs of accepted connections' source ports on the hidden kernel
//! UDP socket (`Sock::take_proofs_head` and what follows from a proof):
//! split from `sock.rs`, whose module docs give the socket's locks.

use std::mem::size_of;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, MutexGuard};
use std::time::Instant;

use libc::socklen_t;

use super::super::conn::Conn;
use super::super::core::frame::{self, NONCE_LEN, PROOF_LEN};
use super::super::core::setup::PROOF_LINGER;
use super::super::stats::{self, STATS};
use super::{Inner, Sock};
use crate::shim::reactor::Reactor;
use crate::shim::sys::{self, lock};

impl Sock {
    /// Before a look at the hidden UDP socket for the program, by the
    /// receive (`recv_kernel`) and by FIONREAD (`kernel_next`) alike: while
    /// accepted connections await the proof of their port (or re-sent
    /// copies of one are due), the proof datagrams at its head are taken
    /// off into `found` (caller holds `inner`). Returns `proof_lock`, held
    /// so that the head stays the program's, and whether the program's
    /// datagram may be looked at now (`false`: the socket was empty when
    /// looked at, and what arrived since may be a proof, which a read into
    /// the program's buffer or FIONREAD would not recognise). FIONREAD
    /// sized a re-sent copy the receive then discarded (issue 13).
    pub(in crate::udp) fn proofs_off(
        &self,
        g: &mut Inner,
        found: &mut Vec<(SocketAddr, [u8; NONCE_LEN])>,
    ) -> (Option<MutexGuard<'_, ()>>, bool) {
        if self.proofs.load(Ordering::Relaxed) == 0 {
            return (None, true);
        }
        let p = lock(&self.proof_lock);
        let (proofs, head) = self.take_proofs_head();
        found.extend(proofs);
        self.count_proofs(g);
        (Some(p), head)
    }

    /// Takes the proof datagrams at the head of the hidden UDP socket
    /// (caller holds `proof_lock`); stops at the first other datagram,
    /// which is the program's.
    pub(in crate::udp) fn take_proofs(&self) -> Vec<(SocketAddr, [u8; NONCE_LEN])> {
        self.take_proofs_head().0
    }

    /// [`Sock::take_proofs`], and whether a datagram of the program's is at
    /// the head now (`false`: the socket was empty when looked at, and a
    /// datagram that arrived since may be a proof).
    pub(in crate::udp) fn take_proofs_head(&self) -> (Vec<(SocketAddr, [u8; NONCE_LEN])>, bool) {
        let mut found = Vec::new();
        loop {
            if self.udp_error_pending() {
                // The program's: a peek would clear it (`sock_error` in the
                // kernel's `__skb_recv_udp`, `MSG_PEEK` or not), and the
                // program's receive, or its FIONREAD, would not see it.
                return (found, true);
            }
            let mut buf = [0u8; PROOF_LEN + 1];
            // SAFETY: sockaddr_storage is plain data.
            let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
            let mut len = size_of::<libc::sockaddr_storage>() as socklen_t;
            // SAFETY: peeking into a local buffer and address on our socket.
            let n = unsafe {
                sys::recvfrom_raw(
                    self.udp,
                    buf.as_mut_ptr(),
                    buf.len(),
                    libc::MSG_PEEK | libc::MSG_DONTWAIT | libc::MSG_TRUNC,
                    (&mut ss as *mut libc::sockaddr_storage).cast(),
                    &mut len,
                )
            };
            if n != PROOF_LEN as isize {
                return (found, n >= 0);
            }
            let Some(nonce) = frame::parse_proof(&buf[..PROOF_LEN]) else {
                return (found, true);
            };
            // SAFETY: the kernel wrote `len` bytes of address.
            let src =
                unsafe { sys::addr_from_raw((&ss as *const libc::sockaddr_storage).cast(), len) };
            // SAFETY: consuming the datagram just peeked (we hold proof_lock,
            // so it is still the head).
            unsafe { sys::recv_raw(self.udp, buf.as_mut_ptr(), buf.len(), libc::MSG_DONTWAIT) };
            match src {
                Some(src) => found.push((src, nonce)),
                None => stats::inc(&STATS.proofs_bad),
            }
        }
    }

    /// Hands proofs taken off the hidden UDP socket to the accepted
    /// connections whose hello sent their nonce (no lock held).
    pub(in crate::udp) fn proved(
        &self,
        eng: &'static Reactor,
        found: Vec<(SocketAddr, [u8; NONCE_LEN])>,
    ) {
        if found.is_empty() {
            return;
        }
        let me = self.arc();
        for (src, nonce) in found {
            let (conn, again) = {
                let g = lock(&self.inner);
                (
                    g.pending.iter().find(|c| c.nonce == nonce).cloned(),
                    g.recent.iter().any(|(_, n)| *n == nonce),
                )
            };
            match conn {
                Some(c) => c.prove_from(eng, &me, src),
                // A re-sent copy of a proof already seen: dropped.
                None if again => {}
                None => stats::inc(&STATS.proofs_bad),
            }
        }
    }

    /// Counts the connections pending and the proofs remembered (caller
    /// holds `inner`), after forgetting the old ones.
    pub(in crate::udp) fn count_proofs(&self, g: &mut Inner) {
        g.expire_proofs(Instant::now());
        self.proofs
            .store(g.pending.len() + g.recent.len(), Ordering::Relaxed);
    }

    /// An accepted connection's port is proved: it no longer counts as
    /// pending, and re-sent copies of its proof are dropped for a while.
    pub(in crate::udp) fn pending_done(&self, conn: &Arc<Conn>) {
        let mut g = lock(&self.inner);
        g.pending.retain(|c| !Arc::ptr_eq(c, conn));
        g.recent
            .push_back((Instant::now() + PROOF_LINGER, conn.nonce));
        self.count_proofs(&mut g);
    }
}
