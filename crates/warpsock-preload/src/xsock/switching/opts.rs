//! The socket options a switching socket keeps (`super`): which the
//! switch moves off the TCP socket, and `SOL_WARPSOCK` on the plain
//! socket a tried switch left.

use libc::{c_int, c_void, socklen_t};

use super::super::{WARPSOCK_CRC, WARPSOCK_DDP_MODE, WARPSOCK_MSG_MODE};
use crate::shim::sys::set_errno;

/// A socket option set while switching.
pub(super) struct Kept {
    pub(super) level: c_int,
    pub(super) name: c_int,
    pub(super) val: Vec<u8>,
    /// Set on the TCP socket already (not one the switch moves).
    pub(super) forwarded: bool,
}

/// Whether the switch moves option `(level, name)` off the TCP socket
/// (`sock::Kept`, the timeouts, `SO_ZEROCOPY`): kept here, not set there.
pub(super) fn moved(level: c_int, name: c_int) -> bool {
    match level {
        libc::SOL_SOCKET => matches!(
            name,
            libc::SO_RCVLOWAT
                | libc::SO_RCVTIMEO
                | libc::SO_SNDTIMEO
                | libc::SO_TIMESTAMP
                | libc::SO_TIMESTAMPNS
                | libc::SO_TIMESTAMP_NEW
                | libc::SO_TIMESTAMPNS_NEW
                | libc::SO_TIMESTAMPING
                | libc::SO_TIMESTAMPING_NEW
                | libc::SO_ZEROCOPY
        ),
        libc::IPPROTO_IP => name == libc::IP_RECVERR,
        libc::IPPROTO_IPV6 => name == libc::IPV6_RECVERR,
        _ => false,
    }
}

/// `setsockopt(SOL_WARPSOCK)` on the plain socket a tried switch left:
/// a switch cannot be asked again (`EALREADY`, as on any connection whose
/// switch was tried); the message mode means nothing on it.
pub(super) fn plain_set(name: c_int, val: *const c_void, len: socklen_t) -> c_int {
    let fail = |e| {
        set_errno(e);
        -1
    };
    match (name, super::super::int_arg(val, len)) {
        (WARPSOCK_DDP_MODE, Some(0)) | (WARPSOCK_MSG_MODE, Some(0 | 1)) => 0,
        (WARPSOCK_DDP_MODE, Some(1)) => fail(libc::EALREADY),
        (WARPSOCK_DDP_MODE | WARPSOCK_MSG_MODE, _) => fail(libc::EINVAL),
        _ => fail(libc::ENOPROTOOPT),
    }
}

/// `getsockopt(SOL_WARPSOCK)` on that plain socket: every mode reads 0.
pub(super) fn plain_get(name: c_int, val: *mut c_void, len: *mut socklen_t) -> c_int {
    match name {
        WARPSOCK_DDP_MODE | WARPSOCK_CRC | WARPSOCK_MSG_MODE => super::super::put_int(val, len, 0),
        _ => {
            set_errno(libc::ENOPROTOOPT);
            -1
        }
    }
}
