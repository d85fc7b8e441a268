//! One offload connection (`Conn`): the I/O driver of the sans-IO core's
//! [`Setup`], [`TxBuf`] and [`RxBuf`]. It owns the TCP descriptor, carries out
//! the core's steps (connect, retry, give up), writes the send buffer and
//! reads frames. Readiness and timers reach it from the progress thread
//! (`super::sock::ConnEvents`) or, for input, from a blocking receive call that
//! reads the connection itself (`super::recv`); what that does to the
//! socket is in `super::events`. Who watches and reads the descriptor
//! meanwhile (the progress thread, a receive call's claim or glance, a
//! park) is in `watch`.
//!
//! Lock order (see also `super::sock`): `order` first (held from reading
//! the connection until what was read is queued on the socket, so that
//! datagrams of one connection are queued in order), then `st`, then `ev`
//! (a leaf). `st` is never held while taking the socket's lock: work that
//! needs both returns what happened and the caller applies it.

use std::mem::zeroed;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use libc::{c_int, iovec, msghdr, socklen_t};
use warpsock_engine::fds;

use super::config;
use super::core::frame::{self, Parsed, Stripe, CTRL_PROVEN, HDR_LEN, NONCE_LEN};
use super::core::routes::Carrier;
use super::core::rxbuf::{Item, RxBuf};
use super::core::setup::{Phase, Setup, Step};
use super::core::txbuf::TxBuf;
use super::stats::{self, STATS};
use crate::shim::reactor::{self, Reactor};
use crate::shim::sys::{self, errno, lock};
use crate::shim::{iov, real};

mod tx;
mod watch;

#[cfg(test)]
mod tests;

#[cfg(test)]
thread_local! {
    /// Unit tests: the most one `Conn::read_some` reads (a peer's bytes
    /// arriving a few at a time).
    pub(super) static READ_CAP: std::cell::Cell<usize> = const { std::cell::Cell::new(usize::MAX) };
}

pub(super) const EPOLLIN: u32 = libc::EPOLLIN as u32;
pub(super) const EPOLLOUT: u32 = libc::EPOLLOUT as u32;
pub(super) const EPOLLERR: u32 = libc::EPOLLERR as u32;
pub(super) const EPOLLHUP: u32 = libc::EPOLLHUP as u32;
const EPOLLET: u32 = libc::EPOLLET as u32;

/// Sets congestion control, pacing and no-delay on an offload connection
/// (or listener, whose accepted connections inherit them).
pub(super) fn tune(fd: c_int) {
    let cfg = config::get();
    sys::set_int(fd, libc::IPPROTO_TCP, libc::TCP_NODELAY, 1);
    if let Some(cc) = &cfg.congestion {
        // SAFETY: the option value is the name's bytes with the given length.
        let r = unsafe {
            real::setsockopt(
                fd,
                libc::IPPROTO_TCP,
                libc::TCP_CONGESTION,
                cc.as_ptr().cast(),
                cc.len() as socklen_t,
            )
        };
        stats::inc(if r == 0 {
            &STATS.cc_set
        } else {
            &STATS.cc_failed
        });
    }
    if let Some(rate) = cfg.pacing_rate {
        let r64 = rate;
        // SAFETY: a u64 option value of the given length (kernels >= 5.x); the
        // u32 form below for older kernels.
        let mut r = unsafe {
            real::setsockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_MAX_PACING_RATE,
                (&r64 as *const u64).cast(),
                8,
            )
        };
        if r != 0 {
            let r32 = rate.min(u64::from(u32::MAX - 1)) as u32;
            // SAFETY: as above with a u32.
            r = unsafe {
                real::setsockopt(
                    fd,
                    libc::SOL_SOCKET,
                    libc::SO_MAX_PACING_RATE,
                    (&r32 as *const u32).cast(),
                    4,
                )
            };
        }
        if r == 0 {
            stats::inc(&STATS.pacing_set);
        }
    }
}

/// Closes a connection's socket `fd`, watched by the progress thread: a
/// blocking receive call may be polling the descriptor at this moment, and
/// its reference keeps the file alive until it returns. So the socket
/// leaves the epoll set first (else it would stay there, reporting the
/// `EPOLLHUP` of a closed socket to the progress thread in a loop:
/// [`Reactor::unwatch`]), and is shut down before the close (else the
/// connection would stay open, with no FIN, until that call returns).
fn shut(fd: c_int) {
    if let Some(eng) = reactor::current() {
        eng.unwatch(fd);
    }
    // SAFETY: shutdown on a socket this library owns; no pointers.
    unsafe { libc::shutdown(fd, libc::SHUT_RDWR) };
    sys::close(fd);
}

/// Largest datagram to or from `a` (what kernel UDP allows its family).
pub(super) fn max_dgram(a: &SocketAddr) -> usize {
    match super::core::policy::canonical(a.ip()) {
        std::net::IpAddr::V4(_) => frame::MAX_DGRAM_V4,
        std::net::IpAddr::V6(_) => frame::MAX_DGRAM_V6,
    }
}

/// What became of a datagram a connection accepted from a send call (the
/// call succeeds either way, as kernel UDP's does).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Sent {
    /// Written or buffered: on its way over TCP (`tx_tcp_dgrams`).
    Taken,
    /// Dropped because the connection is full and its peer stalled, or the
    /// socket's stall budget is spent (`core::stall`); counted only as
    /// that drop (`tx_stall_drops`, `tx_stall_budget_drops`).
    Dropped,
}

/// Why a send on a connection did not complete.
pub(super) enum SendErr {
    /// The connection is gone: route again.
    Retry,
    /// The connection broke now; these datagrams still need sending.
    Died(Vec<Vec<u8>>),
    /// Fail the call with this errno.
    Errno(c_int),
    /// The connection is retrying after a failure: use kernel UDP meanwhile.
    Kernel,
}

/// Epoll interest of the connection's descriptor.
pub(super) struct Interest {
    pub(super) fd: c_int,
    /// The progress thread reads the connection (false while set up for
    /// writing only, or paused for a full receive queue).
    pub(super) read: bool,
    write: bool,
    /// Blocking receive calls reading the connection themselves: while
    /// non-zero the progress thread does not watch it for input.
    callers: usize,
    /// On the socket's ready list: the progress thread is told of each new
    /// arrival (edge-triggered) only to ring the doorbell, so that
    /// edge-triggered waiters on the program's descriptor wake per arrival
    /// as with kernel UDP.
    edge: bool,
    /// Parked (`super::park`): the blocking receive call that read the
    /// connection last returned a datagram and left it unwatched by the
    /// progress thread, since when (or since its timer saw it in use); the
    /// next receive call takes it over without telling the progress thread
    /// (no `epoll_ctl` per round trip).
    parked: Option<Instant>,
    /// On `park::LIST` (what the next `park::release_all` gives back): a
    /// connection parked again after each receive call is looked up there
    /// once, not at every park.
    listed: bool,
    /// A receive call or poll took the parked connection over since its
    /// timer last looked: the timer re-arms instead of giving it back (a
    /// take-over leaves the mark as it is, so that it costs no clock
    /// reading; `super::park`).
    used: bool,
    /// Given back to the progress thread (neither claimed nor parked)
    /// while a datagram a poll read was held in its buffer
    /// ([`Conn::held`]), at this time: no readiness event announces bytes
    /// already read, so its timer, due at once, does (`Conn::on_timer`
    /// puts it on the ready list and rings the doorbell).
    handback: Option<Instant>,
    /// Given back by `park::release_all` (a wait in another thread that
    /// sees only the doorbell) while claimed: the claims' end leaves it to
    /// the progress thread instead of parking it again, which left that
    /// wait blind to the connection until the park timer (`super::park`).
    pub(super) given_back: bool,
}

/// Connection being set up (first attempt, or accepted awaiting the preamble).
pub(super) const HINT_SETUP: u8 = 1;
/// Established.
pub(super) const HINT_UP: u8 = super::core::routes::UP;
/// Backing off after a failed attempt.
pub(super) const HINT_RETRY: u8 = 2;
/// Closed.
pub(super) const HINT_DEAD: u8 = 3;

/// One TCP connection carrying datagrams for one (socket, remote) pair.
pub(crate) struct Conn {
    /// Epoll token.
    pub(crate) id: u64,
    /// Accepted (inbound) rather than opened by us.
    pub(super) inbound: bool,
    /// Accepted: the nonce our hello sent, which the proof must echo.
    pub(super) nonce: [u8; NONCE_LEN],
    /// Accepted: a datagram was delivered from it (a reply may go back).
    pub(super) delivered: AtomicBool,
    /// On its socket's ready list (changed under the socket's lock).
    pub(super) ready: AtomicBool,
    /// The program's poll read a whole datagram into the buffer
    /// (`Sock::wait_end`, in place of a peek: the read the receive call
    /// would make): the next receive call that takes the connection over
    /// serves it first, with no system call (`super::recv`). Set only while
    /// the connection is claimed or parked; one given back to the progress
    /// thread with it set is announced by its timer (`Interest::handback`).
    pub(super) held: AtomicBool,
    /// Polls waiting on the connection while it is parked
    /// (`Conn::take_parked`): while non-zero its timer leaves it parked, as
    /// it does a claimed one, with no lock taken to count them.
    pub(super) pollers: AtomicUsize,
    /// Stripe index (0 when not striped), for the per-stripe counters.
    pub(super) stripe: AtomicUsize,
    /// Where the connection stands, readable without `st` (`HINT_*`).
    pub(super) hint: AtomicU8,
    /// Bytes queued in user space (not yet written), readable without
    /// `st`: picks the stripe for the next datagram.
    queued: AtomicUsize,
    pub(super) st: Mutex<ConnSt>,
    /// Held from reading the connection to queueing what was read.
    pub(super) order: Mutex<()>,
    pub(super) cv: Condvar,
    pub(super) ev: Mutex<Interest>,
}

/// The state behind `Conn::st`.
pub(super) struct ConnSt {
    pub(super) fd: c_int,
    pub(super) setup: Setup,
    /// The remote UDP address (outgoing: the destination; accepted: the TCP
    /// peer's address with the port from the preamble).
    pub(super) dest: Option<SocketAddr>,
    /// Accepted: the TCP peer address.
    pub(super) tcp_peer: Option<SocketAddr>,
    pub(super) tx: TxBuf,
    pub(super) rx: RxBuf,
    /// The socket was closed: close once everything is written.
    pub(super) linger: bool,
    /// Outgoing striped connection: announced in the preamble when the
    /// acceptor's hello offers the extension.
    pub(super) stripe: Option<Stripe>,
    /// Outgoing: the acceptor's nonce, proved with (again) until answered.
    pub(super) proof: Option<[u8; NONCE_LEN]>,
    /// Accepted: the source the proof datagram came from.
    pub(super) proved_src: Option<SocketAddr>,
    /// Accepted: the stripe group the preamble named (0: none).
    pub(super) group: u32,
    /// Largest datagram the remote's family allows (65,507 over IPv4).
    pub(super) max_dgram: usize,
    /// When the kernel last took bytes of the send buffer (or it was
    /// empty): a peer that stops reading stalls it (how long a send waits
    /// on it: `super::core::stall`).
    pub(super) progress: Instant,
    /// When the progress thread writes the buffered tail of a batch.
    pub(super) flush_at: Option<Instant>,

    /// When the program last handed a datagram to this connection.
    pub(super) last_send: Option<Instant>,
}

/// A send less than this after the previous one is part of a stream, and
/// is batched (unless the program received in between).
pub(super) const STREAM_GAP: Duration = Duration::from_micros(20);

/// Room left in the socket's receive queue, spent by [`Conn::parse`].
pub(super) struct Room {
    /// Bytes, each datagram charged its payload plus `DGRAM_OVERHEAD`.
    pub(super) bytes: usize,
    /// Datagrams.
    pub(super) dgrams: usize,
}

/// Fixed charge per queued datagram on top of its payload: the queue entry
/// and the allocation's own overhead, so that empty or one-byte datagrams
/// cannot queue without bound (`WARPSOCK_RCVBUF`).
pub(super) const DGRAM_OVERHEAD: usize = 128;

/// How [`Conn::parse`] stopped.
#[derive(PartialEq, Eq)]
pub(super) enum Parse {
    /// Every whole frame was taken.
    Done,
    /// The socket's receive queue is full: whole frames are left.
    Full,
    /// Not warpsock framing, an unknown control frame, or a datagram
    /// longer than the remote's family allows.
    Bad,
}

/// What one read from the connection gave.
pub(super) enum Rd {
    Data(usize),
    Again,
    Eof,
    Err,
}

impl Carrier for Arc<Conn> {
    fn rank(&self) -> u8 {
        self.hint.load(Ordering::Relaxed)
    }
    fn queued(&self) -> usize {
        self.queued.load(Ordering::Relaxed)
    }
    fn same(&self, other: &Self) -> bool {
        Self::ptr_eq(self, other)
    }
    fn delivered(&self) -> bool {
        self.delivered.load(Ordering::Relaxed)
    }
}

impl Conn {
    /// An outgoing connection to `dest` (its first attempt is due now).
    pub(super) fn outgoing(id: u64, dest: SocketAddr, port: u16, stripe: Option<Stripe>) -> Self {
        let c = Self::new(
            id,
            -1,
            Setup::outgoing(Instant::now()),
            Some(dest),
            None,
            TxBuf::outgoing(port),
            [0; NONCE_LEN],
        );
        if let Some(x) = stripe {
            c.stripe.store(usize::from(x.index), Ordering::Relaxed);
        }
        lock(&c.st).stripe = stripe;
        c
    }

    /// An accepted connection on descriptor `fd` from `peer`, whose hello
    /// carried `nonce`.
    pub(super) fn accepted(id: u64, fd: c_int, peer: SocketAddr, nonce: [u8; NONCE_LEN]) -> Self {
        let t = &config::get().timing;
        let c = Self::new(
            id,
            fd,
            Setup::accepted(Instant::now(), t),
            None,
            Some(peer),
            TxBuf::default(),
            nonce,
        );
        lock(&c.ev).read = true;
        c
    }

    fn new(
        id: u64,
        fd: c_int,
        setup: Setup,
        dest: Option<SocketAddr>,
        tcp_peer: Option<SocketAddr>,
        tx: TxBuf,
        nonce: [u8; NONCE_LEN],
    ) -> Self {
        Self {
            id,
            inbound: tcp_peer.is_some(),
            nonce,
            delivered: AtomicBool::new(false),
            ready: AtomicBool::new(false),
            held: AtomicBool::new(false),
            pollers: AtomicUsize::new(0),
            stripe: AtomicUsize::new(0),
            hint: AtomicU8::new(HINT_SETUP),
            queued: AtomicUsize::new(0),
            st: Mutex::new(ConnSt {
                fd,
                setup,
                dest,
                tcp_peer,
                tx,
                rx: RxBuf::default(),
                linger: false,
                stripe: None,
                proof: None,
                proved_src: None,
                group: 0,
                max_dgram: dest.map_or(frame::MAX_DGRAM_V6, |d| max_dgram(&d)),
                progress: Instant::now(),
                flush_at: None,
                last_send: None,
            }),
            order: Mutex::new(()),
            cv: Condvar::new(),
            ev: Mutex::new(Interest {
                fd,
                read: false,
                write: false,
                callers: 0,
                edge: false,
                parked: None,
                listed: false,
                used: false,
                handback: None,
                given_back: false,
            }),
        }
    }

    /// The next timer deadline: set-up, or the flush of a batch's tail.
    pub(super) fn deadline(&self) -> Option<Instant> {
        let st = lock(&self.st);
        let d = match (st.setup.deadline(), st.flush_at) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        drop(st);
        match (d, self.park_deadline()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Whether datagrams handed to this connection are not yet in the kernel.
    pub(super) fn has_pending(&self) -> bool {
        let st = lock(&self.st);
        st.setup.setting_up() || !st.tx.is_idle()
    }

    /// Starts a non-blocking connect (caller holds `st`) from a socket of
    /// `family` whose kernel UDP socket is `udp` (the connection leaves
    /// from the same local address).
    pub(super) fn start_attempt(
        &self,
        st: &mut ConnSt,
        eng: &Reactor,
        family: c_int,
        udp: c_int,
    ) -> Result<(), c_int> {
        let cfg = config::get();
        let dest = st.dest.ok_or(libc::EINVAL)?;
        stats::inc(&STATS.connects);
        let tcp = SocketAddr::new(dest.ip(), cfg.tcp_port(dest.port()));
        // SAFETY: creating a socket we own.
        let fd = unsafe {
            real::socket(
                family,
                libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                0,
            )
        };
        if fd < 0 {
            return Err(errno());
        }
        // Out of the program's numbers, as every library descriptor.
        let fd = fds::lift(fd);
        tune(fd);
        if let Some(local) = sys::local_addr(udp) {
            if !local.ip().is_unspecified() {
                let (ss, len) = sys::addr_to_raw(&SocketAddr::new(local.ip(), 0));
                // SAFETY: binding our own socket to a valid address.
                unsafe { real::bind(fd, (&ss as *const libc::sockaddr_storage).cast(), len) };
            }
        }
        let (ss, len) = sys::addr_to_raw(&tcp);
        // SAFETY: connecting our own socket to a valid address.
        let r = unsafe { sys::connect_raw(fd, (&ss as *const libc::sockaddr_storage).cast(), len) };
        if r != 0 && errno() != libc::EINPROGRESS {
            let e = errno();
            sys::close(fd);
            return Err(e);
        }
        st.fd = fd;
        st.setup.connect_started(Instant::now(), &cfg.timing);
        {
            let mut i = lock(&self.ev);
            i.fd = fd;
            i.read = false;
            i.write = true;
        }
        if !eng.add_fd(fd, self.id, EPOLLOUT) {
            let e = errno();
            sys::close(fd);
            st.fd = -1;
            self.forget_fd();
            return Err(e);
        }
        Ok(())
    }

    /// Records a failed attempt: back off, or give up once the retries are
    /// spent (returns true then). While backing off, the destination is
    /// served by kernel UDP: the datagrams queued so far are taken out
    /// (into `now_udp`) to be sent that way at once, so that a receiver
    /// without the preload never gets a burst of stale datagrams.
    pub(super) fn note_failure(&self, st: &mut ConnSt, now_udp: &mut Vec<Vec<u8>>) -> bool {
        stats::inc(&STATS.connect_failed);
        if st.fd >= 0 {
            shut(st.fd);
            st.fd = -1;
            self.forget_fd();
        }
        let back = st.tx.take_unsent();
        if !back.is_empty() {
            now_udp.extend(back);
            self.note_queued(st);
            self.cv.notify_all();
        }
        match st.setup.failed(Instant::now(), &config::get().timing) {
            Step::Retry => {
                stats::inc(&STATS.connect_retries);
                self.hint.store(HINT_RETRY, Ordering::Relaxed);
                false
            }
            _ => true,
        }
    }

    /// Closes the connection; returns the whole datagrams not yet written.
    pub(super) fn die(&self, st: &mut ConnSt) -> Vec<Vec<u8>> {
        let (frames, lost) = st.tx.die();
        stats::add(&STATS.tx_lost, lost);
        if st.fd >= 0 {
            shut(st.fd);
            st.fd = -1;
        }
        self.forget_fd();
        st.setup.dead();
        self.hint.store(HINT_DEAD, Ordering::Relaxed);
        self.queued.store(0, Ordering::Relaxed);
        st.rx.release();
        self.cv.notify_all();
        frames
    }

    /// The socket was closed: close now if idle, else once drained.
    pub(super) fn close_or_linger(&self) -> Option<(Option<SocketAddr>, Vec<Vec<u8>>)> {
        let mut st = lock(&self.st);
        let phase = st.setup.phase();
        let idle = matches!(phase, Phase::Established | Phase::AwaitPreamble) && st.tx.is_idle();
        if idle || phase == Phase::Dead {
            let dest = st.dest;
            Some((dest, self.die(&mut st)))
        } else {
            st.linger = true;
            None
        }
    }

    /// Writes as much of the send buffer as the socket takes (caller holds
    /// `st`). Returns an errno if the connection broke.
    pub(super) fn flush(&self, st: &mut ConnSt, eng: &Reactor) -> Result<(), c_int> {
        let mut wrote = false;
        while !st.tx.is_idle() {
            let out = st.tx.unsent();
            // SAFETY: writing initialized bytes of our buffer to our socket.
            let n = unsafe {
                sys::send_raw(
                    st.fd,
                    out.as_ptr(),
                    out.len(),
                    libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
                )
            };
            if n > 0 {
                st.tx.written(n as usize);
                st.progress = Instant::now();
                wrote = true;
                stats::inc(&STATS.tx_flush_writes);
                continue;
            }
            let e = errno();
            if n < 0 && e == libc::EINTR {
                continue;
            }
            if n < 0 && e == libc::EAGAIN {
                break;
            }
            return Err(if n == 0 { libc::EPIPE } else { e });
        }
        self.set_interest(eng, None, Some(!st.tx.is_idle()));
        if wrote {
            self.cv.notify_all();
        }
        self.note_queued(st);
        Ok(())
    }

    /// Publishes how much is queued in user space (caller holds `st`).
    pub(super) fn note_queued(&self, st: &ConnSt) {
        self.queued.store(st.tx.queued(), Ordering::Relaxed);
    }

    /// Reads what the socket has into the receive buffer (caller holds
    /// `st`). A buffer without room (whole frames held back) reads nothing.
    pub(super) fn read_some(st: &mut ConnSt) -> Rd {
        let fd = st.fd;
        let room = st.rx.spare();
        #[cfg(test)]
        let room = {
            let n = room.len().min(READ_CAP.with(std::cell::Cell::get));
            &mut room[..n]
        };
        if room.is_empty() {
            return Rd::Again;
        }

        // SAFETY: reading into the unused tail of our buffer.
        let n = unsafe { sys::recv_dontwait(fd, room.as_mut_ptr(), room.len()) };
        if n > 0 {
            stats::inc(&STATS.rx_tcp_reads);
            st.rx.filled(n as usize);
            Rd::Data(n as usize)
        } else if n == 0 {
            Rd::Eof
        } else if matches!(errno(), libc::EAGAIN | libc::EINTR) {
            Rd::Again
        } else {
            Rd::Err
        }
    }

    /// Splits whole frames off the receive buffer into `out`, while `room`
    /// lasts; handles control frames.
    pub(super) fn parse(st: &mut ConnSt, out: &mut Vec<Vec<u8>>, room: &mut Room) -> Parse {
        loop {
            if let Parsed::Frame(len) = st.rx.peek() {
                if room.dgrams == 0 || len + DGRAM_OVERHEAD > room.bytes {
                    return Parse::Full;
                }
            }
            match st.rx.next_frame(st.max_dgram) {
                Ok(Some(Item::Dgram(r))) => {
                    room.bytes -= r.len() + DGRAM_OVERHEAD;
                    room.dgrams -= 1;
                    out.push(st.rx.payload(r).to_vec());
                }
                Ok(Some(Item::Control(CTRL_PROVEN, _))) if st.tcp_peer.is_none() => {
                    st.setup.proven();
                }
                Ok(Some(Item::Control(..))) | Err(_) => return Parse::Bad,
                Ok(None) => return Parse::Done,
            }
        }
    }
}
