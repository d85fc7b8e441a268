//! What callers of a DDP-mode socket configure and observe: its
//! [`Options`], the process-wide byte [`Counters`], the flags of a receive
//! call and the readiness a poll reports. Plain data, no I/O.

use std::sync::atomic::AtomicU64;
use std::time::Duration;

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
    /// How such a read is placed: `true` (the default) offers the buffer
    /// as a sink (SDP ZCopy: the peer RDMA-Writes into it, only if no byte
    /// is in flight); `false` points our posted receives at its buffers
    /// (`io/placed.rs`: what is already on its way is placed too, but a
    /// quiet run measured it about 20 % slower). See the crate docs
    /// ("Placement").
    pub sinks: bool,
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
    /// 6.15; other kernels keep theirs) of a connection while this end has
    /// sent no stream bytes: set when the switch commits, the kernel's
    /// again from the first DATA, sink Write or one-sided Write on. `None`
    /// leaves the kernel's (200 ms) throughout. Default: 5 ms.
    ///
    /// A receive-only end sends only credit returns and sink offers, the
    /// work host TCP does with ACKs; but to TCP they are data, each often
    /// alone on its direction, and a lost lone segment waits for a loss
    /// probe at 2 RTT + `tcp_rto_min` (`tcp_schedule_loss_probe`) while the
    /// writer may be waiting for exactly those credits. Stream bytes keep
    /// the kernel's timeout, as host TCP's do (`BENCHMARKS.md` §6, session
    /// 13: setting it for the data too is a TCP tuning host TCP gains as
    /// much from).
    pub rto_min: Option<Duration>,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            crc: true,
            slots: 16,
            // 512 KiB: every message costs a Send, a completion, a credit
            // and a socket read per side whatever its size, so larger
            // slots carry a stream with fewer of them (1 MiB messages:
            // about 20-35 % less CPU per GB than 64 KiB slots in
            // interleaved runs; 512 KiB against 256 KiB: about 8 % less,
            // and 1 % loss on the veth pair 0.87x -> 1.10x of host TCP,
            // BENCHMARKS.md section 6, session 14). Memory: the receive
            // slots are `slots * slot_size` = 8 MiB per socket, the
            // transmit slots (`slots + 4` of them) as much again, but a
            // page is faulted in only when bytes land in it: a socket of
            // small messages touches a page or two per slot, and only a
            // stream that keeps the whole window in flight holds it all
            // (host TCP autotunes to 6 MiB receive + 4 MiB send buffer
            // for the same stream).
            slot_size: Self::slot_size_for(512 << 10),
            zcopy_min: 64 << 10,
            sinks: true,
            limits: Limits::default(),
            sink_cancel_timeout: Duration::from_secs(10),
            busy_poll: Duration::ZERO,
            // 5 ms (8 ms at HZ=250): a lost credit return costs a few ms
            // instead of 200. Session 13, 1 % loss on the veth pair, three
            // interleaved 8 s rounds: 0.58x -> 0.86x of host TCP.
            rto_min: Some(Duration::from_millis(5)),
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
}

impl Counters {
    pub(crate) const fn new() -> Self {
        Self {
            rx_bytes: AtomicU64::new(0),
            rx_copied: AtomicU64::new(0),
            rx_placed: AtomicU64::new(0),
            tx_bytes: AtomicU64::new(0),
            tx_msgs: AtomicU64::new(0),
            tx_copied: AtomicU64::new(0),
            bg_rounds: AtomicU64::new(0),
            poll_rounds: AtomicU64::new(0),
            watch_changes: AtomicU64::new(0),
            waits: AtomicU64::new(0),
            sink_offers: AtomicU64::new(0),
        }
    }
}

static COUNTERS: Counters = Counters::new();

/// The process's counters (every socket's, added up).
pub fn counters() -> &'static Counters {
    &COUNTERS
}

/// One of the [`Counters`].
#[derive(Clone, Copy)]
pub(crate) enum Count {
    RxCopied,
    RxPlaced,
    TxBytes,
    TxMsgs,
    TxCopied,
    BgRounds,
    PollRounds,
    WatchChanges,
    Waits,
    SinkOffers,
}

impl Count {
    pub(crate) fn of(self, c: &Counters) -> &AtomicU64 {
        match self {
            Self::RxCopied => &c.rx_copied,
            Self::RxPlaced => &c.rx_placed,
            Self::TxBytes => &c.tx_bytes,
            Self::TxMsgs => &c.tx_msgs,
            Self::TxCopied => &c.tx_copied,
            Self::BgRounds => &c.bg_rounds,
            Self::PollRounds => &c.poll_rounds,
            Self::WatchChanges => &c.watch_changes,
            Self::Waits => &c.waits,
            Self::SinkOffers => &c.sink_offers,
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
    /// The peer ended its stream.
    pub rdhup: bool,
    /// The connection is finished both ways.
    pub hup: bool,
    /// The connection failed.
    pub error: bool,
    /// Completions processed so far (a counter): a change since the last
    /// look means something new arrived, so an edge-triggered waiter needs
    /// a new edge even if the socket was already readable.
    pub arrivals: u64,
}
