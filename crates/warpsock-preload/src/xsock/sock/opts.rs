//! A DDP-mode socket's options (`setsockopt`, `getsockopt`): those of the
//! DDP stream and the program's kept here; the rest go to the TCP socket.

use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, AtomicU8, Ordering};
use std::time::Duration;

use libc::{c_int, c_void, socklen_t};

use super::super::{
    int_arg, put_bytes, put_int_as, SOL_WARPSOCK, WARPSOCK_CRC, WARPSOCK_DDP_MODE,
    WARPSOCK_MSG_MODE,
};
use super::DdpSock;
use crate::shim::real;
use crate::shim::sys::{self, set_errno};

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
        if let Some(r) = self.kept.set(self.kfd, level, name, val, len) {
            return r;
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
                let t = t.unwrap_or_default();
                let tv = libc::timeval {
                    tv_sec: t.as_secs() as libc::time_t,
                    tv_usec: t.subsec_micros() as libc::suseconds_t,
                };
                // SAFETY: a timeval is plain data, read as its bytes.
                let b = unsafe {
                    std::slice::from_raw_parts(
                        (&tv as *const libc::timeval).cast::<u8>(),
                        size_of::<libc::timeval>(),
                    )
                };
                // Truncated to a short length, as Linux's.
                return put_bytes(val, len, b);
            }
            // The send buffer's bound (`XSocket::sndbuf`; without one,
            // the credit window, at most `SNDBUF_MAX`: the peer's hello
            // announces it, and may inflate it to ~64 GiB).
            (libc::SOL_SOCKET, libc::SO_SNDBUF) => {
                self.x.sndbuf().min(c_int::MAX as usize) as c_int
            }
            (libc::SOL_SOCKET, libc::SO_ERROR) => self.so_error(),
            // `struct so_timestamping` (`sk_getsockopt`: 8 bytes, flags
            // then `bind_phc`; a shorter length truncates).
            (libc::SOL_SOCKET, libc::SO_TIMESTAMPING | libc::SO_TIMESTAMPING_NEW) => {
                return put_bytes(val, len, &self.kept.stamping_bytes(name));
            }
            _ => match self.kept.get(level, name) {
                Some(v) => v,
                // SAFETY: forwarding the program's arguments to the TCP
                // socket.
                None => return unsafe { real::getsockopt(self.kfd, level, name, val, len) },
            },
        };
        let byte = (level, name) == (libc::IPPROTO_IP, libc::IP_RECVERR);
        put_int_as(val, len, v, byte)
    }
}

/// `SO_TIMESTAMP(NS)`'s state as the kernel's socket flags
/// (`sock_set_timestamp`): `SOCK_RCVTSTAMP`, `SOCK_RCVTSTAMPNS`,
/// `SOCK_TSTAMP_NEW`.
const STAMP: u8 = 1;
const STAMP_NS: u8 = 2;
const STAMP_NEW: u8 = 4;

/// Options of the program's that a DDP-mode socket keeps and reads back
/// but does not apply, kept off the engine's TCP socket (the same kernel
/// socket): there they changed what the engine's reads and readiness
/// checks see. The exception is `SOF_TIMESTAMPING_OPT_ID` (and
/// `_OPT_ID_TCP`), left on there when the program had it: it makes no
/// entry by itself, and it keeps the stamp key's base (see
/// [`Self::apply`]).
///
/// * `SO_RCVLOWAT` (review r22-c item 1): its blocking reads waited for
///   the mark and its readiness checks reported nothing below it. A
///   DDP-mode read returns what is there and poll reports any readable
///   byte, as TCP with the mark at 1.
/// * `SO_TIMESTAMPING`, `SO_TIMESTAMP(NS)` (`_OLD`/`_NEW`), `IP_RECVERR`,
///   `IPV6_RECVERR` (review r22-e item 2): each puts entries in the
///   engine socket's error queue (transmit stamps and the ICMP errors) or
///   control messages on its reads. Nothing drains that queue, and each
///   entry is charged to the socket's receive space until it fills
///   (`sock_queue_err_skb`): the engine's receive window shrinks. The
///   library makes no stamps, ICMP reports or notices for the program:
///   its error queue is always empty (`MSG_ERRQUEUE` gets `EAGAIN`) and
///   its reads carry no control messages.
/// * What `IP_RECVERR`/`IPV6_RECVERR` off on the engine socket changes
///   (review r28-a item 6): not its error queue — on an established
///   connection `tcp_v4_err`/`tcp_v6_err` queue nothing — but when a hard
///   ICMP error (port or protocol unreachable, ...) fails the connection.
///   With the option on, Linux sets `sk_err` at once; off, only
///   `sk_err_soft`, reported when the retransmissions give up
///   (`tcp_retries2`: about 15 minutes by default). A program that set
///   it to fail fast gets `EHOSTUNREACH`/`ECONNREFUSED` at once over TCP,
///   and over DDP only at the retransmission timeout.
///
/// Kept rather than refused with `ENOPROTOOPT`: a value set before the
/// switch (policy mode switches at `connect`, after the program's
/// options) was accepted already and cannot be refused, so a refusal
/// would cover half the cases and make the answer depend on when the
/// program set the option; and programs that set these options as they
/// set up a socket often treat any failure as fatal, where a stamp or
/// notice that never comes is what they meet over a path that makes
/// none (a device without transmit stamps).
///
/// `SO_ZEROCOPY` is not kept (review r23-a item 1): a program that sets it
/// and sends with `MSG_ZEROCOPY` holds each buffer until the error queue's
/// notice names its send (msg_zerocopy.rst; Linux sends one even when it
/// copied, `SO_EE_CODE_ZEROCOPY_COPIED`, as over loopback always), and a
/// notice that never comes pins every buffer it sent: memory grows, or a
/// bounded pool stops the sends. The stamps' "none comes" is what a path
/// without stamps gives; no path gives that for a notice. So it is refused
/// as Linux refuses it on a socket that cannot do zero copy
/// (`sk_setsockopt`: `EOPNOTSUPP` for any value, before the value is
/// looked at), which such programs handle (they fall back to plain
/// sends), and reads 0 (Linux's read there); a socket that has it on is
/// not switched at all (`xsock::switch`: a value accepted by the kernel
/// before the switch cannot be refused any more, and notices are made only
/// by TCP). Synthesizing the notices instead (counting the calls, a
/// `sock_extended_err` on `MSG_ERRQUEUE`, `POLLERR` while one waits) needs
/// a `POLLERR` the library can raise and clear on the doorbell, a socket
/// pair, and the interposed waits to report it: far more for a program
/// that gains nothing from zero copy's name here (every send copies).
/// The values are checked as Linux's `sk_setsockopt` checks them:
/// `SO_TIMESTAMPING` as `sock_set_timestamping` (Linux 5.15 on: an int or
/// a `struct so_timestamping`, see [`check_stamping`]).
pub(crate) struct Kept {
    rcvlowat: AtomicI32,
    /// `STAMP`, `STAMP_NS`, `STAMP_NEW`.
    stamp: AtomicU8,
    /// `SO_TIMESTAMPING`'s flags.
    stamping: AtomicI32,
    /// `SO_TIMESTAMPING`'s `bind_phc` (`sk_bind_phc`: set with
    /// `SOF_TIMESTAMPING_BIND_PHC`, kept otherwise).
    bind_phc: AtomicI32,
    recverr: AtomicBool,
    recverr6: AtomicBool,
    /// An IPv6 socket (`IPV6_RECVERR` is kept; an IPv4 one's kernel
    /// refuses it, and is asked).
    v6: bool,
}

/// The socket-level options `SO_TIMESTAMP(NS)` old and new: (name, new,
/// ns). The `_OLD` names are the plain ones on 64-bit ports.
const STAMPS: [(c_int, bool, bool); 4] = [
    (libc::SO_TIMESTAMP, false, false),
    (libc::SO_TIMESTAMPNS, false, true),
    (libc::SO_TIMESTAMP_NEW, true, false),
    (libc::SO_TIMESTAMPNS_NEW, true, true),
];

impl Kept {
    /// Takes the options the program set on TCP socket `fd` before the
    /// switch, and turns them off there (the mark back to 1;
    /// `SOF_TIMESTAMPING_OPT_ID` stays, see [`Self::apply`]); the stamps
    /// and errors already queued are dropped (charged to its receive
    /// space, and the engine reads that socket from now on). [`Self::put_back`]
    /// undoes it if the switch fails. A dozen system calls, at a switch.
    pub(crate) fn take(fd: c_int) -> Self {
        let get = |level, name| sys::get_int(fd, level, name).unwrap_or(0);
        let rcvlowat = sys::get_int(fd, libc::SOL_SOCKET, libc::SO_RCVLOWAT).unwrap_or(1);
        if rcvlowat != 1 {
            sys::set_int(fd, libc::SOL_SOCKET, libc::SO_RCVLOWAT, 1);
        }
        let mut stamp = 0;
        for (name, new, ns) in STAMPS {
            if get(libc::SOL_SOCKET, name) != 0 {
                stamp = STAMP | if ns { STAMP_NS } else { 0 } | if new { STAMP_NEW } else { 0 };
            }
        }
        let [stamping, bind_phc] = get_stamping(fd);
        // `SOCK_TSTAMP_NEW` set through `SO_TIMESTAMPING_NEW`, which reads
        // the flags only then (review r23-a item 5: a 32-bit program with
        // 64-bit times read 0 after the switch).
        if stamping != 0 && get(libc::SOL_SOCKET, libc::SO_TIMESTAMPING_NEW) != 0 {
            stamp |= STAMP_NEW;
        }
        let kept = Self {
            rcvlowat: AtomicI32::new(rcvlowat),
            stamp: AtomicU8::new(stamp),
            stamping: AtomicI32::new(stamping),
            bind_phc: AtomicI32::new(bind_phc),
            recverr: AtomicBool::new(get(libc::IPPROTO_IP, libc::IP_RECVERR) != 0),
            recverr6: AtomicBool::new(get(libc::IPPROTO_IPV6, libc::IPV6_RECVERR) != 0),
            v6: get(libc::SOL_SOCKET, libc::SO_DOMAIN) == libc::AF_INET6,
        };
        kept.apply(fd, false);
        // Whatever the options are now: a program that sent with stamps on
        // and turned them off before the switch left its entries too
        // (review r23-a item 2). Those of bytes not yet acknowledged come
        // later, during the switch: its waits and its end drop them
        // (`warpsock_xsock::io::switch_fd_as`).
        drain_error_queue(fd);
        kept
    }

    /// `setsockopt` of a kept option (`None`: not one of them): kept, as
    /// Linux's `sock_setsockopt`/`ip_setsockopt` would set it.
    /// `kfd`: the TCP socket under it (its state and bound device, which
    /// `SO_TIMESTAMPING`'s checks look at).
    pub(super) fn set(
        &self,
        kfd: c_int,
        level: c_int,
        name: c_int,
        val: *const c_void,
        len: socklen_t,
    ) -> Option<c_int> {
        if level == libc::SOL_SOCKET
            && matches!(name, libc::SO_TIMESTAMPING | libc::SO_TIMESTAMPING_NEW)
        {
            return Some(self.set_stamping(kfd, name, val, len));
        }
        let kept = match (level, name) {
            (libc::SOL_SOCKET, _) | (libc::IPPROTO_IPV6, libc::IPV6_RECVERR) => {
                if !self.kept_name(level, name) {
                    return None;
                }
                int_arg(val, len)
            }
            // `ip_setsockopt` takes an int, or a byte when shorter.
            (libc::IPPROTO_IP, libc::IP_RECVERR) if !val.is_null() && len > 0 => {
                int_arg(val, len).or_else(|| {
                    // SAFETY: at least one byte at `val`.
                    Some(c_int::from(unsafe { val.cast::<u8>().read() }))
                })
            }
            (libc::IPPROTO_IP, libc::IP_RECVERR) => None,
            _ => return None,
        };
        let Some(v) = kept else {
            set_errno(libc::EINVAL);
            return Some(-1);
        };
        let on = v != 0;
        match (level, name) {
            (libc::SOL_SOCKET, libc::SO_RCVLOWAT) => {
                // As Linux's `sock_setsockopt`: negative is `INT_MAX`, 0
                // is 1 (TCP's cap at half the receive buffer is not
                // applied).
                let v = if v < 0 { c_int::MAX } else { v.max(1) };
                self.rcvlowat.store(v, Ordering::Relaxed);
            }
            (libc::SOL_SOCKET, libc::SO_ZEROCOPY) => {
                // Refused as on a socket that cannot do zero copy (see
                // `Kept`), whatever the value.
                set_errno(libc::EOPNOTSUPP);
                return Some(-1);
            }
            (libc::SOL_SOCKET, _) => {
                // `__sock_set_timestamps`: on sets the kind; off clears
                // it (not which name set it).
                let (_, new, ns) = STAMPS.into_iter().find(|s| s.0 == name)?;
                let old = self.stamp.load(Ordering::Relaxed);
                let stamp = if on {
                    STAMP | if ns { STAMP_NS } else { 0 } | if new { STAMP_NEW } else { 0 }
                } else {
                    old & STAMP_NEW
                };
                self.stamp.store(stamp, Ordering::Relaxed);
            }
            (libc::IPPROTO_IP, _) => self.recverr.store(on, Ordering::Relaxed),
            _ => self.recverr6.store(on, Ordering::Relaxed),
        }
        Some(0)
    }

    /// `setsockopt(SO_TIMESTAMPING(_NEW))`, as `sk_setsockopt` then
    /// `sock_set_timestamping` (Linux 6.18): shorter than an int is
    /// `EINVAL`; exactly a `struct so_timestamping` (8 bytes) is flags and
    /// `bind_phc`, any other length an int of flags. Kept: the flags, which
    /// name set them (`SOCK_TSTAMP_NEW`), and `bind_phc` when
    /// `SOF_TIMESTAMPING_BIND_PHC` is among them.
    fn set_stamping(&self, kfd: c_int, name: c_int, val: *const c_void, len: socklen_t) -> c_int {
        let Some(flags) = int_arg(val, len) else {
            set_errno(libc::EINVAL);
            return -1;
        };
        let phc = if len as usize == 2 * size_of::<c_int>() {
            // SAFETY: 8 bytes at `val` (its length), the second int.
            unsafe { val.cast::<c_int>().add(1).read_unaligned() }
        } else {
            0
        };
        // The check and the store are one step, as Linux's under
        // `lock_sock` (review r28-a item 15): a set that raced in between
        // (`OPT_ID` turned on or off meanwhile) is checked again against
        // the flags it left. (`bind_phc` is stored after: two racing sets
        // with `BIND_PHC` may pair one's flags with the other's clock.)
        let mut had = self.stamping.load(Ordering::Relaxed);
        loop {
            if let Err(e) = check_stamping(kfd, had, flags, phc) {
                set_errno(e);
                return -1;
            }
            match self
                .stamping
                .compare_exchange(had, flags, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => break,
                Err(now) => had = now,
            }
        }
        if flags & SOF_BIND_PHC != 0 {
            self.bind_phc.store(phc, Ordering::Relaxed);
        }
        let new = name == libc::SO_TIMESTAMPING_NEW;
        let old = self.stamp.load(Ordering::Relaxed) & !STAMP_NEW;
        self.stamp
            .store(old | if new { STAMP_NEW } else { 0 }, Ordering::Relaxed);
        0
    }

    /// `getsockopt(SO_TIMESTAMPING(_NEW))`'s `struct so_timestamping`:
    /// `_NEW` reads the flags only when set through it (zeros otherwise).
    pub(super) fn stamping_bytes(&self, name: c_int) -> [u8; 8] {
        let new = self.stamp.load(Ordering::Relaxed) & STAMP_NEW != 0;
        let mut b = [0u8; 8];
        if name == libc::SO_TIMESTAMPING || new {
            b[..4].copy_from_slice(&self.stamping.load(Ordering::Relaxed).to_ne_bytes());
            b[4..].copy_from_slice(&self.bind_phc.load(Ordering::Relaxed).to_ne_bytes());
        }
        b
    }

    /// Whether `(level, name)` is kept (`SOL_SOCKET`, `IPV6_RECVERR`;
    /// `IP_RECVERR` is matched by the callers).
    fn kept_name(&self, level: c_int, name: c_int) -> bool {
        match level {
            libc::SOL_SOCKET => {
                matches!(
                    name,
                    libc::SO_RCVLOWAT
                        | libc::SO_TIMESTAMPING
                        | libc::SO_TIMESTAMPING_NEW
                        | libc::SO_ZEROCOPY
                ) || STAMPS.iter().any(|s| s.0 == name)
            }
            libc::IPPROTO_IPV6 => name == libc::IPV6_RECVERR && self.v6,
            _ => false,
        }
    }

    /// `getsockopt` of a kept option (`None`: not one of them), as Linux's
    /// `sk_getsockopt` answers it.
    pub(super) fn get(&self, level: c_int, name: c_int) -> Option<c_int> {
        let stamp = self.stamp.load(Ordering::Relaxed);
        let has = |f: u8| stamp & f != 0;
        let v = match (level, name) {
            (libc::IPPROTO_IP, libc::IP_RECVERR) => self.recverr.load(Ordering::Relaxed).into(),
            _ if !self.kept_name(level, name) => return None,
            (libc::IPPROTO_IPV6, _) => self.recverr6.load(Ordering::Relaxed).into(),
            (_, libc::SO_RCVLOWAT) => self.rcvlowat.load(Ordering::Relaxed),
            // Never on: refused here, and a socket with it on before the
            // switch stays TCP.
            (_, libc::SO_ZEROCOPY) => 0,
            // `get_option` answers these with the whole struct first;
            // here its flags, the same answer.
            (_, libc::SO_TIMESTAMPING | libc::SO_TIMESTAMPING_NEW) => {
                let b = self.stamping_bytes(name);
                c_int::from_ne_bytes([b[0], b[1], b[2], b[3]])
            }
            (_, libc::SO_TIMESTAMP) => (has(STAMP) && !has(STAMP_NEW) && !has(STAMP_NS)).into(),
            (_, libc::SO_TIMESTAMPNS) => (has(STAMP_NS) && !has(STAMP_NEW)).into(),
            (_, libc::SO_TIMESTAMP_NEW) => (has(STAMP) && has(STAMP_NEW)).into(),
            _ => (has(STAMP_NS) && has(STAMP_NEW)).into(),
        };
        Some(v)
    }

    /// The switch failed: the program's values go back on its TCP socket.
    pub(crate) fn put_back(&self, fd: c_int) {
        let rcvlowat = self.rcvlowat.load(Ordering::Relaxed);
        if rcvlowat != 1 {
            sys::set_int(fd, libc::SOL_SOCKET, libc::SO_RCVLOWAT, rcvlowat);
        }
        self.apply(fd, true);
    }

    /// Sets the kept values on `fd` (`on`), or turns them off; only those
    /// that are on here are touched (none: no system call). The stamping
    /// flags go first, through the name that sets `SOCK_TSTAMP_NEW` as it
    /// was (`sock_set_timestamping` sets or clears it), then the
    /// `SO_TIMESTAMP(NS)` name, which sets it too: set after the flags
    /// through the old name, it was cleared, and receives would carry
    /// `SCM_TIMESTAMP_OLD` after a failed switch (review r23-a item 5).
    fn apply(&self, fd: c_int, on: bool) {
        let stamp = self.stamp.load(Ordering::Relaxed);
        let stamping = self.stamping.load(Ordering::Relaxed);
        if stamping != 0 {
            // Off, `SOF_TIMESTAMPING_OPT_ID` (and `_OPT_ID_TCP`) stay on:
            // they make no entry by themselves, and a set that turns
            // `OPT_ID` on starts its key again at `snd_una`, so a failed
            // switch's put-back (`OPT_ID` on all along) keeps the base the
            // program's set gave the key. The key counts sequence space
            // (`seq - sk_tskey`), which the switch's own bytes use too:
            // after a failed switch that sent its urgent mark (1 byte) and
            // MPA frames (a rejected initiator's Request, a refusing
            // responder's Reject), later keys run ahead of TCP's by the
            // bytes it sent; equal only if this end sent none (a responder
            // that failed before marking). The kernel has no way to move
            // `sk_tskey` back (review r28-a item 3; README). On, the
            // struct form when `bind_phc` is in use (the int form would
            // bind clock 0).
            let (name, v) = match on {
                true if stamp & STAMP_NEW != 0 => (libc::SO_TIMESTAMPING_NEW, stamping),
                true => (libc::SO_TIMESTAMPING, stamping),
                false => (
                    libc::SO_TIMESTAMPING,
                    stamping & (SOF_OPT_ID | SOF_OPT_ID_TCP),
                ),
            };
            let st = [v, self.bind_phc.load(Ordering::Relaxed)];
            let n = if v & SOF_BIND_PHC != 0 { 2 } else { 1 };
            // SAFETY: `n` ints at `st`, the length given.
            unsafe {
                real::setsockopt(
                    fd,
                    libc::SOL_SOCKET,
                    name,
                    st.as_ptr().cast(),
                    (n * size_of::<c_int>()) as socklen_t,
                )
            };
        }
        if stamp & STAMP != 0 {
            let name = STAMPS
                .iter()
                .find(|s| s.1 == (stamp & STAMP_NEW != 0) && s.2 == (stamp & STAMP_NS != 0))
                .map_or(libc::SO_TIMESTAMP, |s| s.0);
            sys::set_int(fd, libc::SOL_SOCKET, name, c_int::from(on));
        }
        for (flag, level, name) in [
            (&self.recverr, libc::IPPROTO_IP, libc::IP_RECVERR),
            (&self.recverr6, libc::IPPROTO_IPV6, libc::IPV6_RECVERR),
        ] {
            if flag.load(Ordering::Relaxed) {
                sys::set_int(fd, level, name, c_int::from(on));
            }
        }
    }
}

/// `SOF_TIMESTAMPING_OPT_ID`, `_OPT_ID_TCP`, `_OPT_STATS`, `_OPT_TSONLY`,
/// `_BIND_PHC` (`linux/net_tstamp.h`).
const SOF_OPT_ID: c_int = 1 << 7;
const SOF_OPT_TSONLY: c_int = 1 << 11;
const SOF_OPT_STATS: c_int = 1 << 12;
const SOF_BIND_PHC: c_int = 1 << 15;
const SOF_OPT_ID_TCP: c_int = 1 << 16;

/// `SOF_TIMESTAMPING_MASK` of Linux 6.18 (`..._TX_COMPLETION`, bit 18,
/// the last): the mask when the running kernel's cannot be read.
const SOF_MASK_6_18: c_int = (1 << 19) - 1;

/// The flags every kernel this runs on has, not probed: bits 0..=14,
/// `SOF_TIMESTAMPING_TX_HARDWARE` to `_OPT_TX_SWHW` (Linux 4.13; 5.10 has
/// them all). Bit 15 (`_BIND_PHC`) came in 5.18, 16 (`_OPT_ID_TCP`) in
/// 6.2, 17 (`_OPT_RX_FILTER`) and 18 (`_TX_COMPLETION`) later (6.18 has
/// both).
/// The mask is contiguous (`(..._LAST << 1) - 1`).
const SOF_FLOOR: c_int = (1 << 15) - 1;

/// `SOF_TIMESTAMPING_MASK` of the running kernel (0: not read yet).
static SOF_MASK: AtomicI32 = AtomicI32::new(0);

/// The running kernel's `SOF_TIMESTAMPING_MASK`, learned once per process
/// ([`learn_sof_mask`]) on a UDP socket of its own. Linux 6.18's mask if
/// no socket can be had (`socket()` refused: seccomp, an LSM, `EMFILE`),
/// kept as well: not asked again on every set (review r28-a item 5).
fn sof_mask() -> c_int {
    let m = SOF_MASK.load(Ordering::Relaxed);
    if m != 0 {
        return m;
    }
    // SAFETY: plain socket creation.
    let u = unsafe { real::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    let mask = if u < 0 {
        SOF_MASK_6_18
    } else {
        let m = learn_sof_mask(|f| {
            if sys::set_int(u, libc::SOL_SOCKET, libc::SO_TIMESTAMPING, f) {
                Ok(())
            } else {
                Err(sys::errno())
            }
        });
        sys::close(u);
        m
    };
    SOF_MASK.store(mask, Ordering::Relaxed);
    mask
}

/// The kernel's mask from `set`'s answers to `SO_TIMESTAMPING` with one
/// flag above [`SOF_FLOOR`] at a time (with `OPT_ID` for `OPT_ID_TCP`,
/// which needs it), lowest first: taken (or `EOPNOTSUPP`, `BIND_PHC` on
/// an unbound socket) is a known flag; the first `EINVAL` ends the mask
/// (it is contiguous); any other answer (seccomp's `EPERM`, `ENOSYS`)
/// says nothing of the mask: Linux 6.18's is used (review r28-a item 5;
/// before, every such bit counted as known). The floor's flags are never
/// set: `RX_SOFTWARE` (bit 3) turns on the host-wide receive-stamp static
/// key, flipped on and off for nothing (review r28-a item 4).
fn learn_sof_mask(mut set: impl FnMut(c_int) -> Result<(), c_int>) -> c_int {
    let mut mask = SOF_FLOOR;
    for bit in 15..31 {
        let f = 1 << bit;
        let with = if f == SOF_OPT_ID_TCP { SOF_OPT_ID } else { 0 };
        match set(f | with) {
            Ok(()) | Err(libc::EOPNOTSUPP) => mask |= f,
            Err(libc::EINVAL) => return mask,
            Err(_) => return SOF_MASK_6_18,
        }
    }
    mask
}

/// `sock_set_timestamping`'s checks of `flags` (and `phc`) on a DDP-mode
/// socket whose kept flags are `had`, in its order: a bit beyond the
/// running kernel's mask, `OPT_ID_TCP` without `OPT_ID`, `OPT_ID` turned
/// on while the TCP socket under it (`kfd`) is closed or listening (a
/// reset or ended connection: `tcp_done` leaves it `TCP_CLOSE`), and
/// `OPT_STATS` without `OPT_TSONLY` are `EINVAL`; `BIND_PHC` needs a
/// bound device (`EOPNOTSUPP`) that has PTP virtual clock `phc`, which a
/// UDP socket of its own bound to that device is asked (what Linux
/// answers there; `EINVAL` if none can be had: a device without virtual
/// clocks, nearly all).
fn check_stamping(kfd: c_int, had: c_int, flags: c_int, phc: c_int) -> Result<(), c_int> {
    if flags & !sof_mask() != 0 || flags & SOF_OPT_ID_TCP != 0 && flags & SOF_OPT_ID == 0 {
        return Err(libc::EINVAL);
    }
    if flags & SOF_OPT_ID != 0 && had & SOF_OPT_ID == 0 {
        let state = tcp_state(kfd);
        if state == Some(TCP_CLOSE) || state == Some(TCP_LISTEN) {
            return Err(libc::EINVAL);
        }
    }
    if flags & SOF_OPT_STATS != 0 && flags & SOF_OPT_TSONLY == 0 {
        return Err(libc::EINVAL);
    }
    if flags & SOF_BIND_PHC != 0 {
        let dev = sys::get_int(kfd, libc::SOL_SOCKET, libc::SO_BINDTOIFINDEX).unwrap_or(0);
        if dev == 0 {
            return Err(libc::EOPNOTSUPP);
        }
        return bind_phc_answer(dev, phc);
    }
    Ok(())
}

/// `TCP_CLOSE`, `TCP_LISTEN` (`include/net/tcp_states.h`).
const TCP_CLOSE: u8 = 7;
const TCP_LISTEN: u8 = 10;

/// The TCP state of `fd` (`tcpi_state`), if it can be read: the close's
/// `TCP_INFO` look.
fn tcp_state(fd: c_int) -> Option<u8> {
    super::close::tcp_look(fd).and_then(|(state, _)| u8::try_from(state).ok())
}

/// What Linux answers `SOF_TIMESTAMPING_BIND_PHC` with clock `phc` on a
/// socket bound to device `dev`: asked of a UDP socket of its own bound
/// there (an unbound socket may bind without privilege). Two rare
/// differences (review r28-a item 14): a device gone since the bind
/// (`SO_BINDTOIFINDEX`: `ENODEV`) answers `EINVAL`, where Linux's
/// `dev_get_by_index` failing gives `EOPNOTSUPP`; and the UDP socket is
/// made in the calling thread's network namespace, which after a
/// `setns()` is not the TCP socket's, so `dev` may name another device.
fn bind_phc_answer(dev: c_int, phc: c_int) -> Result<(), c_int> {
    // SAFETY: plain socket creation.
    let u = unsafe { real::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if u < 0 {
        return Err(libc::EINVAL);
    }
    let st = [SOF_BIND_PHC, phc];
    let r = if sys::set_int(u, libc::SOL_SOCKET, libc::SO_BINDTOIFINDEX, dev) {
        // SAFETY: two ints at `st`, the length given.
        let r = unsafe {
            real::setsockopt(
                u,
                libc::SOL_SOCKET,
                libc::SO_TIMESTAMPING,
                st.as_ptr().cast(),
                8,
            )
        };
        if r == 0 {
            Ok(())
        } else {
            Err(sys::errno())
        }
    } else {
        Err(libc::EINVAL)
    };
    sys::close(u);
    r
}

/// `SO_TIMESTAMPING`'s flags and `bind_phc` on TCP socket `fd` (zeros if
/// unread).
fn get_stamping(fd: c_int) -> [c_int; 2] {
    let mut st = [0 as c_int; 2];
    let mut len = size_of_val(&st) as socklen_t;
    // SAFETY: `len` writable bytes at `st`.
    let r = unsafe {
        real::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_TIMESTAMPING,
            st.as_mut_ptr().cast(),
            &mut len,
        )
    };
    if r != 0 {
        return [0, 0];
    }
    st
}

/// Drops what TCP socket `fd`'s error queue holds, until `EAGAIN`: each
/// read takes one entry (truncated: no buffer), and the queue holds far
/// fewer than the bound (each entry is charged to the receive buffer at
/// 576 B or more, `sock_queue_err_skb`; 4096, the bound before, could be
/// fewer, review r23-a item 2).
fn drain_error_queue(fd: c_int) {
    for _ in 0..1 << 20 {
        // SAFETY: zeroed msghdr is valid: no buffer, no control space.
        let mut m: libc::msghdr = unsafe { std::mem::zeroed() };
        // SAFETY: the msghdr names no memory.
        let r = unsafe { sys::recvmsg_raw(fd, &mut m, libc::MSG_ERRQUEUE | libc::MSG_DONTWAIT) };
        if r < 0 && sys::errno() != libc::EINTR {
            return;
        }
    }
}

/// A per-call timeout (`SO_RCVTIMEO`, `SO_SNDTIMEO`): the program's value,
/// from before the switch on (the engine sets `SO_RCVTIMEO` on the TCP
/// socket for its own reads), read by every data call without a lock —
/// nanoseconds, [`Timeout::NONE`] for none.
pub(super) struct Timeout(AtomicU64);

impl Timeout {
    const NONE: u64 = u64::MAX;

    pub(super) fn new(t: Option<Duration>) -> Self {
        let me = Self(AtomicU64::new(Self::NONE));
        me.set(t);
        me
    }

    pub(super) fn get(&self) -> Option<Duration> {
        match self.0.load(Ordering::Relaxed) {
            Self::NONE => None,
            ns => Some(Duration::from_nanos(ns)),
        }
    }

    /// Sets `t` (one beyond 584 years is kept as the longest that fits).
    pub(super) fn set(&self, t: Option<Duration>) {
        let ns = t.map_or(Self::NONE, |t| {
            u64::try_from(t.as_nanos()).map_or(Self::NONE - 1, |n| n.min(Self::NONE - 1))
        });
        self.0.store(ns, Ordering::Relaxed);
    }
}

fn timeval_arg(val: *const c_void, len: socklen_t) -> Option<Option<Duration>> {
    if val.is_null() || (len as usize) < size_of::<libc::timeval>() {
        return None;
    }
    // SAFETY: a timeval's worth of bytes at `val`.
    let tv = unsafe { val.cast::<libc::timeval>().read_unaligned() };
    if tv.tv_sec < 0 || !(0..1_000_000).contains(&tv.tv_usec) {
        return None;
    }
    Some(sys::timeval_to_dur(0, &tv))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A kernel answering `EINVAL` from bit `first_bad` up, `other` for
    /// bit `odd` (if any): the flags `learn_sof_mask` set.
    fn fake(first_bad: u32, odd: Option<(u32, c_int)>) -> (c_int, Vec<c_int>) {
        let mut asked = Vec::new();
        let m = learn_sof_mask(|f| {
            asked.push(f);
            let bit = (f & !SOF_OPT_ID).trailing_zeros();
            match odd {
                Some((b, e)) if b == bit => Err(e),
                _ if bit == 15 && bit < first_bad => Err(libc::EOPNOTSUPP),
                _ if bit >= first_bad => Err(libc::EINVAL),
                _ => Ok(()),
            }
        });
        (m, asked)
    }

    #[test]
    fn the_mask_ends_at_the_first_refused_flag() {
        assert_eq!(fake(19, None).0, SOF_MASK_6_18, "6.18");
        let (m, asked) = fake(15, None);
        assert_eq!(m, SOF_FLOOR, "5.10: nothing above the floor");
        assert_eq!(asked, [1 << 15], "stops at the first EINVAL");
        assert_eq!(fake(17, None).0, (1 << 17) - 1, "6.2: BIND_PHC, OPT_ID_TCP");
        let (_, asked) = fake(19, None);
        assert!(asked.iter().all(|f| f & SOF_FLOOR & !SOF_OPT_ID == 0));
        assert!(asked.contains(&(SOF_OPT_ID_TCP | SOF_OPT_ID)));
        assert_eq!(asked.len(), 5, "bits 15..=19");
    }

    #[test]
    fn an_answer_other_than_einval_gives_the_compiled_in_mask() {
        assert_eq!(fake(17, Some((16, libc::EPERM))).0, SOF_MASK_6_18);
        assert_eq!(fake(31, Some((15, libc::ENOSYS))).0, SOF_MASK_6_18);
    }

    /// The probe on the running kernel, on a UDP socket of the test's:
    /// every flag it sets is above the floor, and on Linux 6.18 (this
    /// project's test hosts) it asks bits 15..=19, the last refused
    /// (`EINVAL`), and learns the compiled-in mask.
    #[test]
    fn the_running_kernels_mask_is_learned() {
        // SAFETY: plain socket creation.
        let u = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
        assert!(u >= 0);
        let mut answers = Vec::new();
        let m = learn_sof_mask(|f| {
            // SAFETY: one int from the stack.
            let r = unsafe {
                libc::setsockopt(
                    u,
                    libc::SOL_SOCKET,
                    libc::SO_TIMESTAMPING,
                    (&f as *const c_int).cast(),
                    size_of::<c_int>() as socklen_t,
                )
            };
            let a = if r == 0 { Ok(()) } else { Err(sys::errno()) };
            answers.push((f, a));
            a
        });
        sys::close(u);
        assert_eq!(m & SOF_FLOOR, SOF_FLOOR);
        assert!(answers
            .iter()
            .all(|(f, _)| f & SOF_FLOOR & !SOF_OPT_ID == 0));
        let release = kernel_release();
        if release.starts_with("6.18.") {
            assert_eq!(m, SOF_MASK_6_18, "{release}");
            assert_eq!(answers.len(), 5, "{answers:?}");
            assert_eq!(answers[4], (1 << 19, Err(libc::EINVAL)));
        }
        assert_eq!(sof_mask(), m, "the preload's own probe agrees");
    }

    fn kernel_release() -> String {
        // SAFETY: utsname is plain data; uname fills it.
        let mut u: libc::utsname = unsafe { std::mem::zeroed() };
        // SAFETY: a utsname on the stack.
        assert_eq!(unsafe { libc::uname(&mut u) }, 0);
        // SAFETY: uname NUL-terminates the release.
        unsafe { std::ffi::CStr::from_ptr(u.release.as_ptr()) }
            .to_string_lossy()
            .into_owned()
    }
}
