//! A DDP-mode socket's options (`setsockopt`, `getsockopt`): those of the
//! DDP stream and the program's kept here; the rest go to the TCP socket.

use std::sync::atomic::Ordering;

use libc::{c_int, c_void, socklen_t};

use super::super::{
    int_arg, put_int, SOL_WARPSOCK, WARPSOCK_CRC, WARPSOCK_DDP_MODE, WARPSOCK_MSG_MODE,
};
use super::{timeval_arg, DdpSock};
use crate::shim::real;
use crate::shim::sys::set_errno;

impl DdpSock {
    /// `setsockopt` on a DDP-mode socket.
    pub(super) fn set_option(
        &self,
        level: c_int,
        name: c_int,
        val: *const c_void,
        len: socklen_t,
    ) -> c_int {
        if level == SOL_WARPSOCK {
            let Some(v) = int_arg(val, len) else {
                set_errno(libc::EINVAL);
                return -1;
            };
            return match (name, v) {
                // Already in DDP mode; there is no way back.
                (WARPSOCK_DDP_MODE, 1) => 0,
                (WARPSOCK_MSG_MODE, 0 | 1) => {
                    self.x.set_msg_mode(v == 1);
                    0
                }
                (WARPSOCK_DDP_MODE | WARPSOCK_MSG_MODE, _) => {
                    set_errno(libc::EINVAL);
                    -1
                }
                _ => {
                    set_errno(libc::ENOPROTOOPT);
                    -1
                }
            };
        }
        if (level, name) == (libc::SOL_SOCKET, libc::SO_SNDBUF) {
            // The DDP stream's send buffer, not the engine's TCP socket
            // (`XSocket::set_sndbuf`: clamped; off stays off). Negative
            // sizes ask for the least, as Linux's.
            let Some(v) = int_arg(val, len) else {
                set_errno(libc::EINVAL);
                return -1;
            };
            self.x.set_sndbuf(v.max(0) as usize);
            return 0;
        }
        if level == libc::SOL_SOCKET && matches!(name, libc::SO_RCVTIMEO | libc::SO_SNDTIMEO) {
            let Some(t) = timeval_arg(val, len) else {
                set_errno(libc::EINVAL);
                return -1;
            };
            if name == libc::SO_RCVTIMEO {
                self.rcvtimeo.set(t);
            } else {
                self.sndtimeo.set(t);
            }
            return 0;
        }
        if (level, name) == (libc::SOL_SOCKET, libc::SO_RCVLOWAT) {
            // Kept here, never on the engine's TCP socket (the same kernel
            // socket: its reads and readiness checks would obey it; review
            // r22-c item 1), read back by `getsockopt`, and not applied:
            // a DDP-mode read returns what is there and poll reports any
            // readable byte, as TCP does with the mark at 1. As Linux's
            // `sock_setsockopt`: negative is `INT_MAX`, 0 is 1 (TCP's cap
            // at half the receive buffer is not applied).
            let Some(v) = int_arg(val, len) else {
                set_errno(libc::EINVAL);
                return -1;
            };
            let v = if v < 0 { c_int::MAX } else { v.max(1) };
            self.rcvlowat.store(v, Ordering::Relaxed);
            return 0;
        }
        // SAFETY: forwarding the program's arguments to the TCP socket.
        unsafe { real::setsockopt(self.kfd, level, name, val, len) }
    }

    /// `getsockopt` on a DDP-mode socket.
    pub(super) fn get_option(
        &self,
        level: c_int,
        name: c_int,
        val: *mut c_void,
        len: *mut socklen_t,
    ) -> c_int {
        let v = match (level, name) {
            (SOL_WARPSOCK, WARPSOCK_DDP_MODE) => 1,
            (SOL_WARPSOCK, WARPSOCK_MSG_MODE) => c_int::from(self.x.msg_mode()),
            (SOL_WARPSOCK, WARPSOCK_CRC) => c_int::from(self.x.crc()),
            (SOL_WARPSOCK, _) => {
                set_errno(libc::ENOPROTOOPT);
                return -1;
            }
            (libc::SOL_SOCKET, libc::SO_RCVTIMEO | libc::SO_SNDTIMEO) => {
                let t = if name == libc::SO_RCVTIMEO {
                    self.rcvtimeo.get()
                } else {
                    self.sndtimeo.get()
                };
                if val.is_null()
                    || len.is_null()
                    // SAFETY: the caller's in/out length, checked non-null.
                    || (unsafe { *len } as usize) < size_of::<libc::timeval>()
                {
                    set_errno(libc::EINVAL);
                    return -1;
                }
                let t = t.unwrap_or_default();
                let tv = libc::timeval {
                    tv_sec: t.as_secs() as libc::time_t,
                    tv_usec: t.subsec_micros() as libc::suseconds_t,
                };
                // SAFETY: a timeval's worth of writable bytes.
                unsafe {
                    val.cast::<libc::timeval>().write_unaligned(tv);
                    *len = size_of::<libc::timeval>() as socklen_t;
                }
                return 0;
            }
            // The send buffer's bound (`XSocket::sndbuf`; without one,
            // the credit window).
            (libc::SOL_SOCKET, libc::SO_SNDBUF) => {
                self.x.sndbuf().min(c_int::MAX as usize) as c_int
            }
            (libc::SOL_SOCKET, libc::SO_RCVLOWAT) => self.rcvlowat.load(Ordering::Relaxed),
            (libc::SOL_SOCKET, libc::SO_ERROR) => self.so_error(),
            // SAFETY: forwarding the program's arguments to the TCP socket.
            _ => return unsafe { real::getsockopt(self.kfd, level, name, val, len) },
        };
        put_int(val, len, v)
    }
}
