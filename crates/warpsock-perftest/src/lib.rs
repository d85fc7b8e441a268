//! A perftest client over warpsock: `ib_write_bw`, `ib_read_bw` and
//! `ib_send_bw` against perftest's `-R` (rdma_cm) servers on Linux siw,
//! plus probes that provoke siw's Terminates.
//!
//! # perftest 6.06's `-R` protocol (Debian `perftest 4.5-0.17`)
//!
//! Captured between two real perftest instances on siw (see
//! `scripts/test-siw.sh`); there is **no** out-of-band TCP socket in this
//! version: `-R` also moves perftest's data exchange onto a second rdma_cm
//! connection (`Data ex. method : rdma_cm`). Both connections go to the
//! server's one port, MPA rev 2 enhanced, IRD = ORD = 0 (data connection of
//! a read test: 128/128), no private data.
//!
//! 1. **Control connection.** Lock-step Sends (client first; each side
//!    waits for the other's message before the next): version `"6.06"`
//!    (16 bytes, NUL padded), cycle buffer (be32 4096), cache line (be32
//!    64), MTU (`"3\0"`), then a zeroed `pingpong_dest` (56 bytes).
//! 2. **Data connection** (the test's queue pair), then another zeroed
//!    `pingpong_dest`.
//! 3. `pingpong_dest` exchanges ([`msg::Dest`]: lid, out_reads, qpn, psn,
//!    rkey, vaddr, gid, srqn, gid_index, big-endian): three before a
//!    Write/Read test, four before a Send test. The server's first one names
//!    its buffer (rkey/vaddr).
//! 4. The test on the data connection. Send tests are flow-controlled by
//!    perftest's iWARP credits: the server RDMA Writes its receive count
//!    (`u32`, host order) into the client's credit word every
//!    `rx_depth / 3` receives; the client keeps fewer than `rx_depth` Sends
//!    beyond it.
//! 5. Write/Read: one `pingpong_dest` exchange, the client's report (five
//!    8-byte big-endian messages: size, iterations, peak/average MB/s,
//!    Mpps; the server prints them), and a closing `pingpong_dest`. Send:
//!    only the closing one (the server measures itself).
//!
//! # Verification
//!
//! perftest's servers never look at the data. With [`Params::verify`]:
//! Write tests give every Write its own pattern and RDMA Read the same
//! remote bytes back on the same connection (served after the Write is
//! placed) and compare; Read tests first RDMA Write a pattern into both
//! message-sized halves of the server's buffer and compare every Read.
//! Send data is not checked (the server's receive buffer is not remotely
//! accessible); siw's Terminate would report a Send it could not place.
//!
//! # Verified Sends
//!
//! [`send_check`] closes that gap: its own small protocol (client and
//! server, both directions) against `scripts/siw/send_check.c` on siw,
//! every received byte checked against a pattern of message index and
//! offset, with a checksum compared end to end.
//!
//! # Terminates
//!
//! [`Provoke`] runs the handshake and then makes siw send a Terminate on the
//! data connection (bad STag, bounds, Send too long); [`raw`] probes cover
//! the header faults the engine cannot produce. The other direction,
//! Terminates *we* send and siw decodes, is [`term_server`]: siw's
//! `rping -c` connects to it and is ended with a DDP, LLP/MPA or RDMAP
//! Terminate from warpsock-proto's connection.

mod chan;
mod client;
pub mod msg;
pub mod raw;
pub mod send_check;
pub mod term_server;

use std::fmt;
use std::time::Duration;

use warpsock_engine::proto::wire::terminate::TermCode;
use warpsock_engine::{CloseReason, CmError, PostError, WcError};

/// Which perftest test.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Test {
    /// `ib_write_bw`.
    Write,
    /// `ib_read_bw`.
    Read,
    /// `ib_send_bw`.
    Send,
}

impl fmt::Display for Test {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Write => "write",
            Self::Read => "read",
            Self::Send => "send",
        })
    }
}

/// A fault to provoke on the data connection instead of running the test.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Provoke {
    /// RDMA Write to the server's STag with its key byte changed.
    WriteBadStag,
    /// RDMA Write beyond the end of the server's buffer.
    WriteBounds,
    /// RDMA Read from the server's STag with its key byte changed.
    ReadBadStag,
    /// RDMA Read beyond the end of the server's buffer.
    ReadBounds,
    /// A Send longer than the server's posted receives.
    SendTooLong,
}

impl Provoke {
    /// The code siw's source says it sends (protocol-notes §3, §4).
    pub fn expected(self) -> TermCode {
        match self {
            Self::WriteBadStag => TermCode::DDP_TAGGED_INVALID_STAG,
            Self::WriteBounds => TermCode::DDP_TAGGED_BASE_BOUNDS,
            Self::ReadBadStag => TermCode::RDMAP_INVALID_STAG,
            Self::ReadBounds => TermCode::RDMAP_BASE_BOUNDS,
            Self::SendTooLong => TermCode::DDP_UNTAGGED_NO_BUFFER,
        }
    }
}

/// What to run.
#[derive(Debug, Clone)]
pub struct Params {
    /// The test (must match the server's).
    pub test: Test,
    /// Server host.
    pub host: String,
    /// Server port (perftest's `-p`, default 18515).
    pub port: u16,
    /// Message size (`-s`; the server's must be at least as large).
    pub size: u32,
    /// Iterations (`-n`; for Send tests the server's must be equal).
    pub iters: u64,
    /// Outstanding operations (`-t`, perftest's default 128).
    pub tx_depth: usize,
    /// The server's receive queue depth (`-r`, default 512), for Send credits.
    pub rx_depth: u32,
    /// Verify the data (see the crate docs).
    pub verify: bool,
    /// Ask for MPA CRC.
    pub crc: bool,
    /// Bound on every wait.
    pub timeout: Duration,
    /// Provoke a Terminate instead of running the test.
    pub provoke: Option<Provoke>,
}

/// The outcome of a run.
#[derive(Debug, Clone)]
pub struct Report {
    /// The test.
    pub test: Test,
    /// Message size.
    pub size: u32,
    /// Iterations.
    pub iters: u64,
    /// Payload bytes of the test's operations.
    pub bytes: u64,
    /// Time from the first post to the last completion.
    pub elapsed: Duration,
    /// Bytes compared against the expected pattern.
    pub verified_bytes: u64,
    /// Payload bytes moved for verification on top of [`Self::bytes`].
    pub extra_bytes: u64,
    /// The server's version string.
    pub server_version: String,
    /// The server's buffer STag.
    pub server_rkey: u32,
    /// The server's buffer address.
    pub server_vaddr: u64,
    /// Zero-length Writes sent to unstick siw's accept race.
    pub kicks: u32,
    /// CRC in use on the data connection.
    pub crc: bool,
    /// A provoked Terminate: its code and whether the peer sent it.
    pub terminated: Option<(TermCode, bool)>,
}

impl Report {
    /// Average bandwidth in MB/s (MB = 2^20 bytes, as perftest).
    pub fn mb_per_sec(&self) -> f64 {
        self.bytes as f64 / self.elapsed.as_secs_f64().max(1e-9) / (1u64 << 20) as f64
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some((code, by_peer)) = self.terminated {
            return write!(
                f,
                "{} test: Terminate {} by {}: {code}",
                self.test,
                if by_peer { "received" } else { "sent" },
                if by_peer { "the server" } else { "us" }
            );
        }
        write!(
            f,
            "{} test: {} x {} bytes = {} bytes in {:.3} s: {:.2} MB/s ({:.6} Mpps); \
             verified {} bytes (+{} bytes for verification); CRC {}; server perftest {}; kicks {}",
            self.test,
            self.iters,
            self.size,
            self.bytes,
            self.elapsed.as_secs_f64(),
            self.mb_per_sec(),
            self.iters as f64 / self.elapsed.as_secs_f64().max(1e-9) / 1e6,
            self.verified_bytes,
            self.extra_bytes,
            if self.crc { "on" } else { "off" },
            self.server_version,
            self.kicks
        )
    }
}

/// Why a run failed.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// Connection setup failed.
    Cm {
        /// Which connection.
        step: &'static str,
        /// The cause.
        source: CmError,
    },
    /// A work request could not be posted.
    Post {
        /// During what.
        step: &'static str,
        /// The cause.
        source: PostError,
    },
    /// A wait ran out.
    Timeout {
        /// During what.
        step: &'static str,
        /// The limit.
        after: Duration,
    },
    /// A work request failed.
    Completion {
        /// During what.
        step: &'static str,
        /// The failed request: kind, status, cause.
        error: WcError,
    },
    /// A Terminate ended the connection.
    Terminated {
        /// During what.
        step: &'static str,
        /// Its code.
        code: TermCode,
        /// Whether the peer sent it.
        by_peer: bool,
    },
    /// The connection ended.
    Disconnected {
        /// During what.
        step: &'static str,
        /// How (peer closed, peer reset, timed out, ...), when known.
        reason: Option<CloseReason>,
    },
    /// The peer said something perftest would not.
    Protocol {
        /// During what.
        step: &'static str,
        /// What.
        what: String,
    },
    /// Verification found other bytes than written.
    Mismatch {
        /// Operation number.
        iteration: u64,
        /// First differing byte in it.
        offset: usize,
    },
    /// A socket or OS error.
    Io(std::io::Error),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Cm { step, source } => write!(f, "{step}: {source}"),
            Self::Post { step, source } => write!(f, "{step}: cannot post: {source}"),
            Self::Timeout { step, after } => write!(f, "{step}: nothing within {after:?}"),
            Self::Completion { step, error } => write!(f, "{step}: {error}"),
            Self::Terminated {
                step,
                code,
                by_peer,
            } => write!(
                f,
                "{step}: connection terminated by {}: {code}",
                if *by_peer { "the peer" } else { "us" }
            ),
            Self::Disconnected {
                step,
                reason: Some(r),
            } => write!(f, "{step}: {r}"),
            Self::Disconnected { step, reason: None } => {
                write!(f, "{step}: the connection ended")
            }
            Self::Protocol { step, what } => write!(f, "{step}: {what}"),
            Self::Mismatch { iteration, offset } => write!(
                f,
                "data mismatch: operation {iteration}, byte {offset} differs from what was written"
            ),
            Self::Io(e) => write!(f, "I/O error: {e}"),
        }
    }
}

impl std::error::Error for Error {}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        Self::Io(e)
    }
}

impl From<warpsock_engine::Error> for Error {
    fn from(e: warpsock_engine::Error) -> Self {
        Self::Io(e.into())
    }
}

/// Runs one test (or provocation) as a perftest `-R` client.
pub fn run(p: &Params) -> Result<Report, Error> {
    client::run(p)
}
