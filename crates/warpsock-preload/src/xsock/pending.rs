//! What the program asked of its sockets before they are in DDP mode, by
//! descriptor: `WARPSOCK_DDP_MODE` and `WARPSOCK_MSG_MODE` set on a plain
//! socket or listener, a switch tried, and an `SO_SNDBUF` the switch
//! carries into the DDP send buffer's bound (`note_sndbuf`,
//! `listeners_sndbuf`).

use std::collections::HashMap;
use std::sync::Mutex;

use libc::{c_int, c_void, socklen_t};

use super::{int_arg, is_tcp};
use crate::shim::sys::{self, lock};

/// What `setsockopt` asked of a socket not yet in DDP mode, by descriptor
/// (with the socket's inode, so a reused number is not mistaken for it).
#[derive(Clone, Copy, Default)]
pub(super) struct Pending {
    /// The socket's inode when noted.
    pub(super) ino: u64,
    /// `WARPSOCK_DDP_MODE` set on it (a switch asked).
    pub(super) ddp: bool,
    /// `WARPSOCK_MSG_MODE` set on it.
    pub(super) msg_mode: bool,
    /// A switch was attempted (a connection gets one: see the crate docs).
    pub(super) tried: bool,
    /// The program's `SO_SNDBUF`, set while the socket was plain TCP (on
    /// it, or on the listener that accepted it): carried into the DDP
    /// send buffer's bound at the switch ([`note_sndbuf`]).
    pub(super) sndbuf: Option<usize>,
}

static PENDING: Mutex<Option<HashMap<c_int, Pending>>> = Mutex::new(None);

/// The inode of the file `fd` names (0: none).
pub(super) fn inode(fd: c_int) -> u64 {
    // SAFETY: fstat into a zeroed stat on the stack.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return 0;
    }
    st.st_ino
}

/// What was noted for `fd` (defaults if nothing, or for another socket
/// under the same number).
pub(super) fn pending(fd: c_int) -> Pending {
    let ino = inode(fd);
    lock(&PENDING)
        .as_ref()
        .and_then(|m| m.get(&fd))
        .filter(|p| p.ino == ino)
        .copied()
        .unwrap_or(Pending {
            ino,
            ..Pending::default()
        })
}

/// Notes `p` for `fd`.
pub(super) fn set_pending(fd: c_int, p: Pending) {
    lock(&PENDING)
        .get_or_insert_with(HashMap::new)
        .insert(fd, p);
}

/// `setsockopt(SOL_SOCKET, SO_SNDBUF, val)` went to the kernel for `fd`,
/// not in DDP mode: remembered if `fd` is a TCP socket, so that the switch
/// makes it the bound of the DDP send buffer too (clamped as a set after
/// the switch, `XSocket::set_sndbuf`) — iperf3 `-w` and many servers set
/// it before connect or on the listener, whose accepted connections
/// inherit it as the kernel's do. The kernel socket keeps it as well (the
/// engine's own buffer then; `riobulk.c` relies on it). Negative sizes
/// ask for the least, as Linux's.
pub(crate) fn note_sndbuf(fd: c_int, val: *const c_void, len: socklen_t) {
    let Some(v) = int_arg(val, len) else {
        return;
    };
    if !is_tcp(fd) {
        return;
    }
    let mut p = pending(fd);
    p.sndbuf = Some(v.max(0) as usize);
    set_pending(fd, p);
}

/// The `SO_SNDBUF` the program set on the plain listener that accepted
/// connection `fd`, which the program switches now with no value of its
/// own: Linux's accepted socket inherits the listener's `sk_sndbuf`, and
/// the switch carries it as it carries one set on the socket (only a
/// candidate listener's accept hook passed it on before: 1ca1adf's known
/// limit). No call passes through to find it (the accept of a plain
/// listener is not hooked): the switch, a request of the program's,
/// looks among the sockets with a noted value for a listener on the
/// connection's local port (its address, or the wildcard) whose kernel
/// `SO_SNDBUF` is still the connection's — set before the connection was
/// made (it inherited it: the value then locks it against the kernel's
/// tuning) and not changed since (a later value, which the connection
/// never had, is not carried). A few syscalls per noted socket, at a
/// switch only.
pub(super) fn listeners_sndbuf(fd: c_int) -> Option<usize> {
    let noted: Vec<(c_int, Pending)> = lock(&PENDING)
        .as_ref()?
        .iter()
        .filter(|(&l, p)| l != fd && p.sndbuf.is_some())
        .map(|(&l, p)| (l, *p))
        .collect();
    if noted.is_empty() {
        return None;
    }
    let local = sys::local_addr(fd)?;
    let kernel = sys::get_int(fd, libc::SOL_SOCKET, libc::SO_SNDBUF)?;
    // (exact address, noted value) of each listener that may have
    // accepted `fd`.
    let mut found: Vec<(bool, usize)> = Vec::new();
    let mut stale = Vec::new();
    for (l, p) in noted {
        if inode(l) != p.ino {
            // Closed, or the number reused: paid for once (review r22-a
            // item 7: every note ever made was scanned at each switch).
            stale.push((l, p.ino));
            continue;
        }
        let listening =
            sys::get_int(l, libc::SOL_SOCKET, libc::SO_ACCEPTCONN).is_some_and(|v| v != 0);
        let Some(at) = sys::local_addr(l).filter(|_| listening) else {
            continue;
        };
        // An accepted socket has its listener's family: a v4 connection
        // taken by a dual-stack `[::]` listener is a v6 socket (a mapped
        // address), so a v6-only listener on the port never matches a v4
        // connection, whatever the kernel values (review r22-a item 6).
        let here = at.port() == local.port()
            && at.is_ipv4() == local.is_ipv4()
            && (at.ip().is_unspecified() || at.ip() == local.ip());
        if here && sys::get_int(l, libc::SOL_SOCKET, libc::SO_SNDBUF) == Some(kernel) {
            found.extend(p.sndbuf.map(|v| (!at.ip().is_unspecified(), v)));
        }
    }
    if !stale.is_empty() {
        if let Some(m) = lock(&PENDING).as_mut() {
            for (l, ino) in stale {
                if m.get(&l).is_some_and(|p| p.ino == ino) {
                    m.remove(&l);
                }
            }
        }
    }
    // A listener on the connection's own address before a wildcard one
    // (as the kernel picks for an incoming connection); listeners left
    // alike (the kernel's value clamps distinct values to one) with
    // different values: none (the order of the notes would decide).
    let exact = found.iter().any(|f| f.0);
    let mut values = found.into_iter().filter(|f| f.0 == exact).map(|f| f.1);
    let v = values.next()?;
    values.all(|w| w == v).then_some(v)
}
