//! What callers of a DDP-mode socket configure and observe: its
//! [`Options`], the process-wide byte [`Counters`], the flags of a receive
//! call and the readiness a poll reports. Plain data, no I/O.

use std::sync::atomic::{fence, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::forklist::ForkList;
use super::residue_cap::ResidueBudget;

use crate::switch::Limits;
use crate::wire::{Hello, HDR_LEN};

/// Settings of DDP-mode sockets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    /// Ask for MPA CRC32c (on if either side asks).
    pub crc: bool,
    /// Receive slots posted for the peer (its credits).
    pub slots: u16,
    /// Bytes per slot.
    pub slot_size: u32,
    /// Smallest blocking read (all its buffers together) placed without a
    /// copy when it finds nothing queued, and smallest blocking send sent
    /// from the caller's buffer without a copy.
    pub zcopy_min: usize,
    /// Smallest copied message (a non-blocking send's, or a blocking one's
    /// below `zcopy_min`) written from the caller's buffers in one
    /// gathered `sendmsg` with the FPDUs' framing, when the engine has
    /// nothing queued ahead of it: no copy but of what the socket does not
    /// take at once (`XSocket::send_gathered`). Smaller messages are
    /// copied next to their header (a gather entry costs the kernel about
    /// what a copy of a few hundred bytes costs; a copy of 4 KiB, several
    /// entries). `usize::MAX`: never.
    pub gather_min: usize,
    /// Bytes a socket buffers past its credits (as `SO_SNDBUF`; set with
    /// `WARPSOCK_DDP_SNDBUF` under the preload): a copied send call that
    /// finds too few credits (or no transmit slot) copies what does not
    /// fit into the send buffer and returns, as TCP's send returns with
    /// bytes in the socket buffer; they go out a slot's payload per DATA
    /// message at most and never across a call's end, as credits come
    /// back. A
    /// call that finds the buffer full waits (blocking) or sends part or
    /// `EAGAIN` (non-blocking). 0: no buffer (a send waits for credits).
    /// Zero-copy calls (blocking, at least `zcopy_min`) never buffer.
    /// The socket's starting bound: `SO_SNDBUF` changes it per socket
    /// ([`XSocket::set_sndbuf`](super::XSocket::set_sndbuf), clamped; 0
    /// stays 0). Default: 1 MiB.
    pub sndbuf: usize,
    /// How such a read is placed: `true` (the default) offers the buffer
    /// as a sink (SDP ZCopy: the peer RDMA-Writes into it, only if no byte
    /// is in flight); `false` points our posted receives at its buffers
    /// (`io/placed.rs`: what is already on its way is placed too, but a
    /// quiet run measured it about 20 % slower). See the crate docs
    /// ("Placement").
    pub sinks: bool,
    /// Whether a *timed* read (`SO_RCVTIMEO`) may offer a sink too. Off by
    /// default: a sink withdrawn at the timeout waits for the peer's
    /// answer, and a peer whose program makes no call answers nothing —
    /// the socket then fails with `ETIMEDOUT` after the timeout plus
    /// [`Self::sink_cancel_timeout`], where TCP's read returns `EAGAIN` at
    /// the timeout and the connection lives (session 21). Off, a timed
    /// large read has its posted receives retargeted (undone locally).
    /// The crate's tests turn it on: they bound their reads with a timeout
    /// as a safety net.
    pub sinks_timed: bool,
    /// Switch timeouts and bounds.
    pub limits: Limits,
    /// How long a reader that gave up on a sink (timeout) waits for the
    /// peer to confirm that it will not write into it any more
    /// (SINK_CANCEL answered by SINK_DONE), and how long a placed read
    /// that is done waits for a message already being placed into its
    /// buffer to end. A peer that does not answer in
    /// time — stopped, or not following the protocol — fails the
    /// connection with `ETIMEDOUT`: the buffer is the program's again only
    /// once nothing can be placed into it.
    pub sink_cancel_timeout: Duration,
    /// How long a waiting call spins before it sleeps.
    pub busy_poll: Duration,
    /// The smallest TCP retransmission timeout (`TCP_RTO_MIN_US`, Linux
    /// 6.15; other kernels keep theirs) of a receive-only end: set once the
    /// end has received stream bytes (DATA or a sink Write) while it has
    /// sent none, never at the switch; the kernel's again from its first
    /// DATA, sink Write or one-sided Write on (`RtoMin`). An end that
    /// sends first never has it. `None` leaves the kernel's (200 ms)
    /// throughout. Default: 5 ms.
    ///
    /// A receive-only end sends only credit returns and sink offers, the
    /// work host TCP does with ACKs; but to TCP they are data, each often
    /// alone on its direction, and a lost lone segment waits for a loss
    /// probe at 2 RTT + `tcp_rto_min` (`tcp_schedule_loss_probe`) while the
    /// writer may be waiting for exactly those credits. Stream bytes keep
    /// the kernel's timeout, as host TCP's do: a writer lowered at the
    /// switch and restored at its first DATA kept a smaller RTO anyway
    /// (Linux had already shrunk its RTT variance under the 5 ms floor:
    /// 156 ms instead of 204 in ~70 % of samples, `BENCHMARKS.md` §6,
    /// session 14), so the writer's is never touched.
    pub rto_min: Option<Duration>,
    /// A budget the residues of the switches made with these options
    /// share ([`ResidueBudget`]): each read into a residue is charged to
    /// it first, and a switch that finds it full fails as at its own
    /// bound (`SwitchError::ResidueFull`). `None` (the default): only
    /// `Limits::residue_max` per switch.
    pub residue_budget: Option<&'static ResidueBudget>,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            crc: true,
            slots: 16,
            // 256 KiB: every message costs a Send, a completion, a credit
            // and a socket read per side whatever its size, so larger
            // slots carry a stream with fewer of them (1 MiB messages:
            // about 20-35 % less CPU per GB than 64 KiB slots in
            // interleaved runs, session 14). Past 256 KiB the writer's
            // kernel time grew instead: on a 2 vCPU KVM host (session 29,
            // `BENCHMARKS.md` section 6) the loopback 1 MiB stream was
            // 0.79-0.82x host TCP with 512 KiB slots whatever their count
            // (8, 16 or 32) and 0.78x with 1 MiB, against 0.995-1.03x
            // with 16 x 256 KiB and 0.93-0.97x with 128 KiB (16 or 32),
            // the writer's system time ~0.22 s/GB against ~0.17 (host
            // TCP's ~0.19); with 512 KiB its socket sat at the 4 MiB send
            // buffer with megabytes unsent. 64 KiB was 0.84x. What 512
            // KiB had for it: 1 % loss on the veth pair, 1.23x against
            // 1.07x with 256 KiB in the same session (session 14: 0.87x
            // -> 1.10x against 256 KiB), both above that row's target.
            // Memory: the receive slots are `slots * slot_size` = 4 MiB
            // per socket, the transmit slots (`slots + 4` of them) as
            // much again, but a page is faulted in only when bytes land
            // in it: a socket of small messages touches a page or two per
            // slot, and only a stream that keeps the whole window in
            // flight holds it all (host TCP autotunes to 6 MiB receive +
            // 4 MiB send buffer for the same stream).
            slot_size: Self::slot_size_for(256 << 10),
            zcopy_min: 64 << 10,
            gather_min: 4 << 10,
            // A client's pipelined requests or a server's answers (issue
            // 12: 8 B each took a whole slot of the peer's), not a bulk
            // stream's window: a blocking large write goes from the
            // caller's buffer and never buffers.
            sndbuf: 1 << 20,
            sinks: true,
            sinks_timed: false,
            limits: Limits::default(),
            sink_cancel_timeout: Duration::from_secs(10),
            busy_poll: Duration::ZERO,
            // 5 ms (8 ms at HZ=250): a lost credit return costs a few ms
            // instead of 200. Session 13, 1 % loss on the veth pair, three
            // interleaved 8 s rounds: 0.58x -> 0.86x of host TCP.
            rto_min: Some(Duration::from_millis(5)),
            residue_budget: None,
        }
    }
}

impl Options {
    /// The slot size whose DATA messages carry `payload` bytes: the
    /// message header comes on top. Payloads a power of two in size let
    /// the writes programs make (64 KiB, 1 MiB) fill whole messages: with
    /// 256 KiB slots header included, a 1 MiB write took four full
    /// messages and a fifth for its last 32 bytes (a Send, a completion
    /// and a credit each).
    pub const fn slot_size_for(payload: u32) -> u32 {
        payload + HDR_LEN as u32
    }

    pub(crate) fn hello(&self) -> Hello {
        Hello {
            slots: self.slots,
            slot_size: self.slot_size,
        }
    }
}

/// Process-wide counters (noise-free evidence): bytes copied per byte
/// received (the zero-copy claims), and the progress thread's work per
/// message (on-demand watching).
#[derive(Debug, Default)]
pub struct Counters {
    /// Stream bytes received (copied or placed).
    pub rx_bytes: AtomicU64,
    /// Of those, bytes copied out of receive slots.
    pub rx_copied: AtomicU64,
    /// Of those, bytes placed straight into the reader's buffer (by the
    /// engine, through a retargeted receive or a sink).
    pub rx_placed: AtomicU64,
    /// DATA messages a waiting receive call took as they landed, copied
    /// into its buffer at once — from the slot, or, taken by the
    /// predicted receive, from where the engine's read put them (no
    /// unread bytes queued and read back: see `XSocket::wait_take`). A
    /// blocking 8-byte ping-pong takes every message this way.
    pub rx_taken: AtomicU64,
    /// Stream bytes sent.
    pub tx_bytes: AtomicU64,
    /// DATA messages sent (each a Send into one of the peer's slots: a
    /// completion on both sides and a credit back).
    pub tx_msgs: AtomicU64,
    /// Of those, bytes copied into transmit slots.
    pub tx_copied: AtomicU64,
    /// Rounds of progress the progress thread ran for an event of its
    /// watch: each is a wake-up of a thread besides the program's own.
    pub bg_rounds: AtomicU64,
    /// Rounds of progress a program's `poll` ran after it saw the engine's
    /// socket ready (the program's own thread: no hand-off).
    pub poll_rounds: AtomicU64,
    /// Changes of the progress thread's watch (each an `epoll_ctl`).
    pub watch_changes: AtomicU64,
    /// Times a call of the program waited in the engine for the peer (a
    /// sleep in, or spin on, the engine's socket): a ping-pong receive
    /// needs one.
    pub waits: AtomicU64,
    /// Sinks offered (each a SINK message and the peer's SINK_DONE).
    pub sink_offers: AtomicU64,
    /// Stand-ins of polls forgotten when their lease lapsed
    /// ([`super::XSocket::stand_lapse`]): polls that never ended theirs.
    pub stand_lapses: AtomicU64,
    /// Times a round for an arrival ([`super::XSocket::progress_if_idle`])
    /// asked the kernel whether bytes were left (`FIONREAD`): its last
    /// read had filled its buffer, or it made none.
    pub rx_looks: AtomicU64,
    /// Rounds the progress thread owed a socket whose lock it could not
    /// take, each try that found it held counted
    /// ([`super::XSocket::progress_round`]).
    pub rounds_owed: AtomicU64,
}

impl Counters {
    pub(crate) const fn new() -> Self {
        Self {
            rx_bytes: AtomicU64::new(0),
            rx_copied: AtomicU64::new(0),
            rx_placed: AtomicU64::new(0),
            rx_taken: AtomicU64::new(0),
            tx_bytes: AtomicU64::new(0),
            tx_msgs: AtomicU64::new(0),
            tx_copied: AtomicU64::new(0),
            bg_rounds: AtomicU64::new(0),
            poll_rounds: AtomicU64::new(0),
            watch_changes: AtomicU64::new(0),
            waits: AtomicU64::new(0),
            sink_offers: AtomicU64::new(0),
            stand_lapses: AtomicU64::new(0),
            rx_looks: AtomicU64::new(0),
            rounds_owed: AtomicU64::new(0),
        }
    }
}

impl Counters {
    /// Every counter, in one order (for the process's sums).
    fn each(&self) -> [&AtomicU64; 15] {
        [
            &self.rx_bytes,
            &self.rx_copied,
            &self.rx_placed,
            &self.rx_taken,
            &self.tx_bytes,
            &self.tx_msgs,
            &self.tx_copied,
            &self.bg_rounds,
            &self.poll_rounds,
            &self.watch_changes,
            &self.waits,
            &self.sink_offers,
            &self.stand_lapses,
            &self.rx_looks,
            &self.rounds_owed,
        ]
    }
}

/// The process's counters as [`counters`] last summed them.
static COUNTERS: Counters = Counters::new();
/// The counters of the process's sockets ([`socket_counters`]): a socket
/// counts into its own alone, under its lock, with plain loads and stores
/// (`XSocket::count`), and the process's are their sum, made when they
/// are read. Until issue 12 every count also took a locked add on the
/// process's counters, shared by every socket: three per small send,
/// three per predicted take (~20 cycles each on the busy ping-pong's
/// path, where a plain add is one).
static LIVE: ForkList<Arc<Counters>> = ForkList::new();
/// The counts of the dropped sockets (folded in under [`LIVE`]'s
/// lock when their entry is pruned: only the list holds them then).
static GONE: Counters = Counters::new();

/// Drops the entries of sockets that are gone (the list holds the only
/// reference), their counts added to [`GONE`]. Under [`LIVE`]'s lock.
fn prune(live: &mut Vec<Arc<Counters>>) {
    live.retain(|c| {
        if Arc::strong_count(c) > 1 {
            return true;
        }
        // The socket's last counts were stored before its `Arc` was
        // dropped (a release decrement): seen once its count is seen.
        fence(Ordering::Acquire);
        for (g, c) in GONE.each().into_iter().zip(c.each()) {
            let n = c.load(Ordering::Relaxed);
            g.store(g.load(Ordering::Relaxed) + n, Ordering::Relaxed);
        }
        false
    });
}

/// A new socket's counters, in the process's list ([`counters`] sums
/// them). The list is pruned when it is full, and makes room for as many
/// entries again as are left: each prune is followed by at least half
/// its length of pushes, amortised O(1) a socket.
pub(crate) fn socket_counters() -> Arc<Counters> {
    let c = Arc::new(Counters::new());
    let mut live = LIVE.lock();
    if live.len() == live.capacity() {
        prune(&mut live);
        let n = live.len();
        live.reserve(n.max(8));
    }
    live.push(Arc::clone(&c));
    c
}

/// In a child made by `fork`, from its fork handler (the child's only
/// thread): the list is kept (the child's copies of the parent's sockets
/// go on counting into it) unless its lock was held at the fork by a
/// thread the child does not have; then the child starts a list of its
/// own from the counts last summed (the parent's sockets' later counts
/// are not in the child's sums: a lower bound, in that race alone).
pub(crate) fn counters_after_fork() {
    if LIVE.try_lock().is_some() {
        return;
    }
    LIVE.forget();
    // The last sums, or the dropped sockets' counts pruned since.
    for (g, c) in GONE.each().into_iter().zip(COUNTERS.each()) {
        g.store(
            g.load(Ordering::Relaxed).max(c.load(Ordering::Relaxed)),
            Ordering::Relaxed,
        );
    }
}

/// The process's counters (every socket's, added up: those of sockets
/// dropped as well), summed now: each grows from one call to the next.
/// A socket's counts made before the call (in the sense of
/// happens-before: a joined thread's, a lock's) are in it.
pub fn counters() -> &'static Counters {
    let mut live = LIVE.lock();
    prune(&mut live);
    for (i, total) in COUNTERS.each().into_iter().enumerate() {
        let gone = GONE.each()[i].load(Ordering::Relaxed);
        let sum = live
            .iter()
            .fold(gone, |s, c| s + c.each()[i].load(Ordering::Relaxed));
        // Under the lock: sums are stored in the order they were made.
        total.store(sum, Ordering::Relaxed);
    }
    &COUNTERS
}

/// One of the [`Counters`].
#[derive(Clone, Copy)]
pub(crate) enum Count {
    RxCopied,
    RxPlaced,
    RxTaken,
    TxBytes,
    TxMsgs,
    TxCopied,
    BgRounds,
    PollRounds,
    WatchChanges,
    Waits,
    SinkOffers,
    StandLapses,
    RxLooks,
}

impl Count {
    pub(crate) fn of(self, c: &Counters) -> &AtomicU64 {
        match self {
            Self::RxCopied => &c.rx_copied,
            Self::RxPlaced => &c.rx_placed,
            Self::RxTaken => &c.rx_taken,
            Self::TxBytes => &c.tx_bytes,
            Self::TxMsgs => &c.tx_msgs,
            Self::TxCopied => &c.tx_copied,
            Self::BgRounds => &c.bg_rounds,
            Self::PollRounds => &c.poll_rounds,
            Self::WatchChanges => &c.watch_changes,
            Self::Waits => &c.waits,
            Self::SinkOffers => &c.sink_offers,
            Self::StandLapses => &c.stand_lapses,
            Self::RxLooks => &c.rx_looks,
        }
    }
}

/// Flags of a receive call.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RecvFlags {
    /// `MSG_PEEK`: leave the bytes queued.
    pub peek: bool,
    /// `MSG_DONTWAIT` or `O_NONBLOCK`.
    pub nonblocking: bool,
    /// `MSG_WAITALL`: fill the buffer (stream mode).
    pub waitall: bool,
}

/// What a socket can do now (for poll/select/epoll).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Readiness {
    /// A read would not block (bytes, end of stream, error, or an
    /// asynchronous completion to collect).
    pub readable: bool,
    /// A send would move bytes now.
    pub writable: bool,
    /// The peer ended its stream, or this end shut its reading (TCP's
    /// `RCV_SHUTDOWN`).
    pub rdhup: bool,
    /// The connection is shut both ways, or failed (TCP's `POLLHUP`: not
    /// for the peer's close alone, TCP's CLOSE_WAIT).
    pub hup: bool,
    /// The connection failed.
    pub error: bool,
    /// Completions processed so far (a counter): a change since the last
    /// look means something new arrived, so an edge-triggered waiter needs
    /// a new edge even if the socket was already readable.
    pub arrivals: u64,
}

/// When an end's `TCP_RTO_MIN_US` is lowered to [`Options::rto_min`] and
/// when it goes back to the kernel's (sans-IO: the socket applies what
/// this returns). Lowered only for an end that has received stream bytes
/// and sent none, so the data direction always keeps host TCP's timeout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RtoMin {
    /// Not yet lowered: `low` µs once stream bytes arrive before we send
    /// any, `kernel` µs to put back after.
    Waiting { low: i32, kernel: i32 },
    /// Lowered: `kernel` µs goes back with our first stream byte.
    Lowered { kernel: i32 },
    /// The kernel's, for good (we sent first, restored it, or nothing was
    /// asked for or the kernel lacks the option).
    Kernel,
}

impl RtoMin {
    /// The plan for a connection whose kernel value is `kernel` µs (`None`:
    /// the kernel lacks the option) when `Options::rto_min` is `want`.
    pub(crate) fn new(want: Option<Duration>, kernel: Option<i32>) -> Self {
        match (want, kernel) {
            (Some(w), Some(kernel)) => Self::Waiting {
                low: i32::try_from(w.as_micros()).unwrap_or(i32::MAX),
                kernel,
            },
            _ => Self::Kernel,
        }
    }

    /// `rx_seq` stream bytes have been received so far: the value to set
    /// now, if any (once, while we have sent none).
    pub(crate) fn on_received(&mut self, rx_seq: u64) -> Option<i32> {
        match *self {
            Self::Waiting { low, kernel } if rx_seq > 0 => {
                *self = Self::Lowered { kernel };
                Some(low)
            }
            _ => None,
        }
    }

    /// We send stream bytes: the value to set now, if any (the kernel's, if
    /// we had lowered it). Nothing is lowered after this.
    pub(crate) fn on_sent(&mut self) -> Option<i32> {
        let was = std::mem::replace(self, Self::Kernel);
        match was {
            Self::Lowered { kernel } => Some(kernel),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS5: Option<Duration> = Some(Duration::from_millis(5));

    /// The default slot carries 256 KiB of payload, the header on top
    /// (a 1 MiB write is four full DATA messages), 16 of them: a 4 MiB
    /// window. 512 KiB slots made the loopback 1 MiB stream 0.79-0.82x
    /// host TCP, 256 KiB 0.995-1.03x (session 29, see `Options::default`).
    #[test]
    fn default_slots_carry_256_kib_of_payload_each_16_of_them() {
        let o = Options::default();
        assert_eq!(o.slot_size, Options::slot_size_for(256 << 10));
        assert_eq!(o.slot_size as usize - HDR_LEN, 256 << 10);
        assert_eq!((1usize << 20) % (o.slot_size as usize - HDR_LEN), 0);
        assert_eq!(o.slots, 16);
        assert_eq!(o.slots as usize * (o.slot_size as usize - HDR_LEN), 4 << 20);
    }

    #[test]
    fn a_reader_is_lowered_at_its_first_received_bytes_and_restored_at_its_first_sent() {
        let mut r = RtoMin::new(MS5, Some(200_000));
        assert_eq!(r.on_received(0), None, "credits alone lower nothing");
        assert_eq!(r.on_received(1), Some(5_000));
        assert_eq!(r.on_received(9), None, "once");
        assert_eq!(r.on_sent(), Some(200_000));
        assert_eq!(r.on_sent(), None, "once");
        assert_eq!(r.on_received(20), None, "never again");
        assert_eq!(r, RtoMin::Kernel);
    }

    #[test]
    fn an_end_that_sends_first_is_never_lowered() {
        let mut w = RtoMin::new(MS5, Some(200_000));
        assert_eq!(w.on_sent(), None, "nothing to restore");
        assert_eq!(
            w.on_received(1 << 20),
            None,
            "the writer keeps the kernel's"
        );
        assert_eq!(w.on_sent(), None);
    }

    #[test]
    fn nothing_asked_or_no_kernel_option_touches_nothing() {
        for mut r in [RtoMin::new(None, Some(200_000)), RtoMin::new(MS5, None)] {
            assert_eq!(r.on_received(1), None);
            assert_eq!(r.on_sent(), None);
        }
        let mut big = RtoMin::new(Some(Duration::from_secs(1 << 40)), Some(200_000));
        assert_eq!(
            big.on_received(1),
            Some(i32::MAX),
            "clamped; the kernel refuses it"
        );
    }

    /// The process's list of socket counters keeps the dropped ones'
    /// counts and not their entries: pruned as it fills, it stays as long
    /// as the sockets alive at once (the other tests' few), and the sums
    /// keep every count.
    #[test]
    fn dropped_sockets_leave_their_counts_not_their_entries() {
        let before = counters().tx_msgs.load(Ordering::Relaxed);
        for _ in 0..10_000 {
            let c = socket_counters();
            c.tx_msgs.store(1, Ordering::Relaxed);
        }
        assert!(LIVE.lock().len() < 1_000, "{} entries", LIVE.lock().len());
        assert!(counters().tx_msgs.load(Ordering::Relaxed) >= before + 10_000);
    }
}
