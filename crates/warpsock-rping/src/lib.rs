//! `rping` over warpsock: the RDMA ping-pong of rdma-core's
//! `librdmacm/examples/rping.c`, as client and server, byte-compatible with
//! `rping` on Linux soft-iWARP (siw) and iWARP RNICs.
//!
//! # The exchange
//!
//! Connection parameters are rping's: MPA rev 2 enhanced, IRD = ORD = 1, no
//! private data. Every message is a 16-byte Send carrying
//! `struct rping_rdma_info { be64 buf; be32 rkey; be32 size; }`
//! ([`RdmaInfo`]). One iteration:
//!
//! 1. the client Sends the address/rkey/size of its *start* buffer, which
//!    holds [`ping_pattern`] for this iteration (NUL-terminated);
//! 2. the server RDMA Reads `size` bytes of it into its own buffer and Sends
//!    a 16-byte "go ahead";
//! 3. the client Sends the address/rkey/size of its (cleared) *rdma* buffer;
//! 4. the server RDMA Writes `strlen + 1` bytes of what it read there and
//!    Sends "go ahead" again;
//! 5. with `-V` the client checks its rdma buffer equals its start buffer.
//!
//! The client ends with a graceful disconnect; the server treats the peer's
//! disconnect at an iteration boundary as the normal end (rping's
//! `DISCONNECTED` state).
//!
//! Linux siw (as of 6.1) can leave an initiator's first FPDU unread when it
//! arrives right after the MPA Reply (`siw_accept()` sends the Reply before
//! it attaches the queue pair to the socket). If the answer to its first
//! message takes longer than a second, the client sends a zero-length RDMA
//! Write (STag 1, TO 0, as siw's own RTR frame), whose arrival makes siw
//! process what it left; [`ConnReport::kicks`] counts them.
//!
//! Other extensions over rping (they change nothing on the wire): the client
//! retries its connection with back-off within `--timeout` (a slow server,
//! e.g. one in an emulated VM, may not answer at once), every wait is
//! bounded by `--timeout`, the client clears its rdma buffer before each
//! iteration so `-V` proves this iteration's Write, the server's `-V`
//! checks the data it read against the rping pattern, and the server can
//! stop after `--conns N` connections or an idle `--accept-timeout`.
//!
//! # Using it
//!
//! ```
//! use clap::Parser;
//! use warpsock_rping::{run, serve, Args};
//!
//! #[derive(Parser)]
//! struct Cli {
//!     #[command(flatten)]
//!     args: Args,
//! }
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // Port 0, bound before the client starts: no other program can take it.
//! let listener = warpsock_engine::Listener::bind("127.0.0.1:0")?;
//! let port = listener.local_addr()?.port().to_string();
//! let server = Cli::parse_from(["rping", "-s", "-V"]).args;
//! let client = Cli::parse_from(["rping", "-c", "-a", "127.0.0.1", "-p", &port, "-C", "3", "-V"]).args;
//! let s = std::thread::spawn(move || serve(&listener, &server));
//! let report = run(&client)?;
//! assert_eq!(report.connections[0].iterations, 3);
//! assert_eq!(s.join().unwrap()?.connections[0].iterations, 3);
//! # Ok(()) }
//! ```
//!
//! `Args` uses rping's short options, including `-V` and `-v`: a `clap`
//! parser that flattens it must not add its own `-V`/`--version` flag
//! (`#[command(disable_version_flag = true)]`).

mod client;
mod server;
mod session;

use std::fmt;
use std::net::SocketAddr;
use std::time::Duration;

use warpsock_engine::proto::wire::terminate::TermCode;
use warpsock_engine::proto::RtrType;
use warpsock_engine::{CloseReason, CmError, PostError, WcError};

/// rping's default port.
pub const DEFAULT_PORT: u16 = 7174;
/// Smallest `-S` rping accepts (`sizeof "0x7fffffff"` + `sizeof "rdma-ping-%d: "`).
pub const MIN_SIZE: u32 = 26;
/// Largest `-S` rping accepts (`RPING_BUFSIZE - 1`).
pub const MAX_SIZE: u32 = 65535;
/// Length of every Send rping exchanges (`struct rping_rdma_info`).
pub const INFO_LEN: usize = 16;

/// Command-line options, named as rping's.
#[derive(Debug, Clone, PartialEq, clap::Args)]
#[command(group(clap::ArgGroup::new("side").required(true).args(["server", "client"])))]
pub struct Args {
    /// Server side: accept connections and serve rping clients.
    #[arg(short = 's', long = "server")]
    pub server: bool,
    /// Client side: connect to ADDR:PORT and ping.
    #[arg(short = 'c', long = "client")]
    pub client: bool,
    /// Address to connect to (client, required) or to listen on (server,
    /// default 0.0.0.0).
    #[arg(short = 'a', long = "addr", value_name = "ADDR")]
    pub addr: Option<String>,
    /// TCP port (server: 0 picks a free one; the server prints the
    /// address it listens on to stderr, `listening on ADDR:PORT`).
    #[arg(short = 'p', long = "port", default_value_t = DEFAULT_PORT)]
    pub port: u16,
    /// Client: number of pings (0: until interrupted). The server runs
    /// until its client disconnects.
    #[arg(short = 'C', long = "count", default_value_t = 0)]
    pub count: u64,
    /// Ping data size in bytes (26..=65535). The server's buffer must be at
    /// least as large as the client's.
    #[arg(short = 'S', long = "size", default_value_t = 64,
          value_parser = clap::value_parser!(u32).range(MIN_SIZE as i64..=MAX_SIZE as i64))]
    pub size: u32,
    /// Validate ping data (client: the echo equals what was sent; server:
    /// what was read is the rping pattern of that iteration).
    #[arg(short = 'V', long = "validate")]
    pub validate: bool,
    /// Print ping data to stdout.
    #[arg(short = 'v', long = "verbose")]
    pub verbose: bool,
    /// Persistent server: serve any number of connections, concurrently.
    #[arg(short = 'P', long = "persistent")]
    pub persistent: bool,
    /// Ask for MPA CRC32c (used when either side asks).
    #[arg(long = "crc")]
    pub crc: bool,
    /// Client: peer-to-peer setup (RFC 6581) with this ready-to-receive
    /// message. The server follows whatever the client offers.
    #[arg(long = "p2p", value_enum, default_value_t = P2p::Off)]
    pub p2p: P2p,
    /// Longest wait of any one step, in seconds: the client's connection
    /// setup (retried with back-off within this time) and every completion.
    #[arg(long = "timeout", default_value_t = 30.0, value_parser = parse_seconds)]
    pub timeout: f64,
    /// Server: stop when no new connection arrived for this many seconds
    /// (an error if none was served at all). Default: wait forever.
    #[arg(long = "accept-timeout", value_parser = parse_seconds)]
    pub accept_timeout: Option<f64>,
    /// Persistent server: stop after this many connections.
    #[arg(long = "conns", value_name = "N")]
    pub conns: Option<u64>,
    /// Persistent server: most sessions served at once (one thread and
    /// one `-S`-sized buffer each). A connection beyond that is refused
    /// with an MPA reject ("busy") and logged; the server goes on.
    #[arg(long = "max-sessions", value_name = "N", default_value_t = DEFAULT_MAX_SESSIONS,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub max_sessions: u32,
}

/// Default of `--max-sessions`.
pub const DEFAULT_MAX_SESSIONS: u32 = 64;

fn parse_seconds(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 && v < 1e9 => Ok(v),
        _ => Err(format!("{s:?} is not a positive number of seconds")),
    }
}

impl Args {
    /// Client options for `addr:port` with rping's defaults.
    pub fn client(addr: &str, port: u16) -> Self {
        Self {
            server: false,
            client: true,
            addr: Some(addr.to_owned()),
            port,
            count: 0,
            size: 64,
            validate: false,
            verbose: false,
            persistent: false,
            crc: false,
            p2p: P2p::Off,
            timeout: 30.0,
            accept_timeout: None,
            conns: None,
            max_sessions: DEFAULT_MAX_SESSIONS,
        }
    }

    /// Server options listening on `addr:port` with rping's defaults.
    pub fn server(addr: &str, port: u16) -> Self {
        Self {
            server: true,
            client: false,
            ..Self::client(addr, port)
        }
    }

    pub(crate) fn step_timeout(&self) -> Duration {
        Duration::from_secs_f64(self.timeout)
    }

    fn check(&self) -> Result<(), Error> {
        if self.server == self.client {
            return Err(Error::Usage("give exactly one of -s and -c".into()));
        }
        if !(MIN_SIZE..=MAX_SIZE).contains(&self.size) {
            return Err(Error::Usage(format!(
                "invalid size {} (valid range is {MIN_SIZE} to {MAX_SIZE})",
                self.size
            )));
        }
        if self.client && self.addr.is_none() {
            return Err(Error::Usage("the client needs -a ADDR".into()));
        }
        if !(self.timeout.is_finite() && self.timeout > 0.0) {
            return Err(Error::Usage("--timeout must be positive".into()));
        }
        Ok(())
    }
}

/// Peer-to-peer connection setup offered by the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, clap::ValueEnum)]
pub enum P2p {
    /// Classic setup (rping's and siw's default): the initiator sends first.
    #[default]
    Off,
    /// Offer P2P with a zero-length RDMA Write as ready-to-receive.
    Write,
}

/// `struct rping_rdma_info`: what every rping Send carries (big-endian).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RdmaInfo {
    /// Buffer address (tagged offset).
    pub buf: u64,
    /// STag of the buffer.
    pub rkey: u32,
    /// Buffer size in bytes.
    pub size: u32,
}

impl RdmaInfo {
    /// The 16 bytes on the wire.
    pub fn encode(&self) -> [u8; INFO_LEN] {
        let mut b = [0u8; INFO_LEN];
        b[..8].copy_from_slice(&self.buf.to_be_bytes());
        b[8..12].copy_from_slice(&self.rkey.to_be_bytes());
        b[12..].copy_from_slice(&self.size.to_be_bytes());
        b
    }

    /// Parses the 16 bytes of a received Send.
    pub fn decode(b: &[u8; INFO_LEN]) -> Self {
        let (buf, rest) = b.split_at(8);
        let (rkey, size) = rest.split_at(4);
        Self {
            buf: u64::from_be_bytes(buf.try_into().expect("8 bytes")),
            rkey: u32::from_be_bytes(rkey.try_into().expect("4 bytes")),
            size: u32::from_be_bytes(size.try_into().expect("4 bytes")),
        }
    }
}

/// The start buffer rping's client fills for iteration `ping` (counted from
/// 0 on each connection): `"rdma-ping-<ping>: "`, then the letters from
/// `'A' + ping % 58` on, cycling through ASCII 65..=122, with the last byte
/// NUL. Siw's rping server writes back `strlen + 1` bytes, so the NUL is
/// required.
pub fn ping_pattern(ping: u64, size: usize) -> Vec<u8> {
    let mut b = format!("rdma-ping-{ping}: ").into_bytes();
    b.truncate(size.saturating_sub(1));
    let mut c = 65 + (ping % 58) as u8;
    while b.len() < size {
        b.push(c);
        c = if c >= 122 { 65 } else { c + 1 };
    }
    if let Some(last) = b.last_mut() {
        *last = 0;
    }
    b
}

/// The text up to the first NUL, for `-v` output.
pub(crate) fn c_str(b: &[u8]) -> String {
    let end = b.iter().position(|&x| x == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..end]).into_owned()
}

/// Which side ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Side {
    /// `-c`.
    Client,
    /// `-s`.
    Server,
}

/// What one connection did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnReport {
    /// Our address.
    pub local: SocketAddr,
    /// The peer's address.
    pub peer: SocketAddr,
    /// Complete ping iterations.
    pub iterations: u64,
    /// Iterations whose data was checked (`-V`).
    pub validated: u64,
    /// Payload bytes moved by RDMA Read (client start buffer to server).
    pub read_bytes: u64,
    /// Payload bytes moved by RDMA Write (server to client rdma buffer).
    pub write_bytes: u64,
    /// Payload bytes of Sends, both directions.
    pub send_bytes: u64,
    /// MPA revision in use.
    pub mpa_revision: u8,
    /// CRC32c on.
    pub crc: bool,
    /// Peer-to-peer ready-to-receive in use.
    pub rtr: Option<RtrType>,
    /// Connection attempts the client needed (1 for the server).
    pub attempts: u32,
    /// Client: zero-length RDMA Writes sent to wake a peer that left the
    /// first message unprocessed (Linux siw's accept race; see the crate
    /// docs). 0 with a healthy peer.
    pub kicks: u32,
    /// From established to disconnect.
    pub elapsed: Duration,
}

impl ConnReport {
    /// Payload bytes moved in total.
    pub fn total_bytes(&self) -> u64 {
        self.read_bytes + self.write_bytes + self.send_bytes
    }
}

impl fmt::Display for ConnReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} <-> {}: {} iterations ({} validated), read {} B, write {} B, send {} B, \
             MPA rev {}, CRC {}, RTR {}, {} attempt(s), {} kick(s), {:.3} s",
            self.local,
            self.peer,
            self.iterations,
            self.validated,
            self.read_bytes,
            self.write_bytes,
            self.send_bytes,
            self.mpa_revision,
            if self.crc { "on" } else { "off" },
            match self.rtr {
                None => "none".to_owned(),
                Some(r) => format!("{r:?}").to_lowercase(),
            },
            self.attempts,
            self.kicks,
            self.elapsed.as_secs_f64()
        )
    }
}

/// A server connection that failed.
#[derive(Debug)]
pub struct Failure {
    /// The peer, when known.
    pub peer: Option<SocketAddr>,
    /// What went wrong.
    pub error: Error,
}

/// What a run did.
#[derive(Debug)]
pub struct Report {
    /// Client or server.
    pub side: Side,
    /// Connections that completed (the client has exactly one).
    pub connections: Vec<ConnReport>,
    /// Server: connections that failed after setup.
    pub failures: Vec<Failure>,
    /// Server: connection attempts that never completed MPA setup.
    pub setup_failures: u64,
    /// Server: connections refused because `--max-sessions` were active
    /// (or a session thread could not be started).
    pub refused: u64,
}

impl Report {
    fn new(side: Side) -> Self {
        Self {
            side,
            connections: Vec::new(),
            failures: Vec::new(),
            setup_failures: 0,
            refused: 0,
        }
    }

    /// Complete iterations over all connections.
    pub fn iterations(&self) -> u64 {
        self.connections.iter().map(|c| c.iterations).sum()
    }

    /// Payload bytes moved over all connections.
    pub fn total_bytes(&self) -> u64 {
        self.connections.iter().map(ConnReport::total_bytes).sum()
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let side = match self.side {
            Side::Client => "client",
            Side::Server => "server",
        };
        write!(
            f,
            "warpsock-rping {side}: {} connection(s), {} iterations, {} payload bytes",
            self.connections.len(),
            self.iterations(),
            self.total_bytes()
        )?;
        if self.refused > 0 {
            write!(f, ", {} refused (busy)", self.refused)?;
        }
        if self.setup_failures > 0 {
            write!(f, ", {} failed setup(s)", self.setup_failures)?;
        }
        for c in &self.connections {
            write!(f, "\n  {c}")?;
        }
        for x in &self.failures {
            match x.peer {
                Some(p) => write!(f, "\n  FAILED {p}: {}", x.error)?,
                None => write!(f, "\n  FAILED: {}", x.error)?,
            }
        }
        Ok(())
    }
}

/// Why a run failed.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// Bad options.
    Usage(String),
    /// A socket or resource error.
    Io(std::io::Error),
    /// The client could not connect.
    Connect {
        /// Attempts made.
        attempts: u32,
        /// The last attempt's error.
        source: CmError,
    },
    /// The server could not accept.
    Accept(CmError),
    /// A step did not finish within `--timeout`.
    Timeout {
        /// What we were waiting for.
        step: &'static str,
        /// The time allowed.
        after: Duration,
    },
    /// A Terminate was sent or received.
    Terminated {
        /// What we were waiting for.
        step: &'static str,
        /// Its error code.
        code: TermCode,
        /// Whether the peer sent it.
        by_peer: bool,
    },
    /// The connection ended in the middle of an iteration.
    Disconnected {
        /// What we were waiting for.
        step: &'static str,
        /// How it ended (peer closed, peer reset, timed out, ...), when
        /// known.
        reason: Option<CloseReason>,
    },
    /// A work request completed with an error.
    Completion {
        /// What we were waiting for.
        step: &'static str,
        /// The failed request: kind, status, cause.
        error: WcError,
    },
    /// A request could not be posted.
    Post(PostError),
    /// A received Send was not 16 bytes (rping: "Received bogus data").
    BogusData {
        /// Bytes received.
        len: u32,
    },
    /// The client advertised more data than the server's buffer holds.
    TooLarge {
        /// Size the client advertised.
        advertised: u32,
        /// The server's `-S`.
        available: u32,
    },
    /// `-V` found different data.
    Mismatch {
        /// Iteration (from 0).
        iteration: u64,
        /// First differing byte.
        offset: usize,
        /// Byte expected there.
        expected: u8,
        /// Byte found there.
        found: u8,
    },
    /// Server: some connections failed (the report lists them).
    Server(Box<Report>),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Usage(m) => write!(f, "usage: {m}"),
            Self::Io(e) => write!(f, "I/O error: {e}"),
            Self::Connect { attempts, source } => {
                write!(f, "cannot connect after {attempts} attempt(s): {source}")
            }
            Self::Accept(e) => write!(f, "cannot accept: {e}"),
            Self::Timeout { step, after } => {
                write!(f, "timed out after {:.1} s waiting for {step}", after.as_secs_f64())
            }
            Self::Terminated {
                step,
                code,
                by_peer,
            } => write!(
                f,
                "{} a Terminate while waiting for {step}: {code}",
                if *by_peer { "the peer sent" } else { "we sent" }
            ),
            Self::Disconnected {
                step,
                reason: Some(r),
            } => write!(f, "{r} while we waited for {step}"),
            Self::Disconnected { step, reason: None } => {
                write!(f, "the connection ended while we waited for {step}")
            }
            Self::Completion { step, error } => write!(f, "{error} during {step}"),
            Self::Post(e) => write!(f, "cannot post a work request: {e}"),
            Self::BogusData { len } => {
                write!(f, "received bogus data, size {len} (rping messages are {INFO_LEN} bytes)")
            }
            Self::TooLarge {
                advertised,
                available,
            } => write!(
                f,
                "the client advertised {advertised} bytes but our buffer (-S) holds {available}"
            ),
            Self::Mismatch {
                iteration,
                offset,
                expected,
                found,
            } => write!(
                f,
                "data mismatch in iteration {iteration} at byte {offset}: expected {expected:#04x}, found {found:#04x}"
            ),
            Self::Server(r) => write!(f, "{} connection(s) failed\n{r}", r.failures.len()),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Io(e) => Some(e),
            Self::Connect { source, .. } | Self::Accept(source) => Some(source),
            _ => None,
        }
    }
}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        Self::Io(e)
    }
}

impl From<PostError> for Error {
    fn from(e: PostError) -> Self {
        Self::Post(e)
    }
}

impl From<warpsock_engine::Error> for Error {
    fn from(e: warpsock_engine::Error) -> Self {
        Self::Io(e.into())
    }
}

/// Runs rping as `args` say (client or server) and reports what moved.
///
/// The client returns after `-C` iterations (or the first error) with a
/// graceful disconnect. The server returns after one connection, or with
/// `-P` after `--conns` connections or an idle `--accept-timeout`; it fails
/// if any served connection failed.
pub fn run(args: &Args) -> Result<Report, Error> {
    args.check()?;
    if args.client {
        client::run(args)
    } else {
        server::run(args)
    }
}

/// Runs the rping server (`args` with `-s`) on `listener`, which the
/// caller bound: bind port 0 and pass the listener, and no other program
/// can take the port between choosing it and listening on it (`args.addr`
/// and `args.port` are not used). Returns as [`run`] does.
pub fn serve(listener: &warpsock_engine::Listener, args: &Args) -> Result<Report, Error> {
    args.check()?;
    if args.client {
        return Err(Error::Usage(
            "serve() runs a server: give -s, not -c".into(),
        ));
    }
    server::run_on(listener, args)
}
