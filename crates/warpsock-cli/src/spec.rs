//! The domain of a bench run: which test, over which transport, in which
//! role, for how long ([`Spec`], what travels to the server), and the
//! description every transport gives of itself ([`TransportInfo`]).
//!
//! Leaf module: nothing here knows how a transport moves bytes
//! (the `transports` module) or how the plan is built (`opts`).

use std::fmt;
use std::time::Duration;

use clap::ValueEnum;

/// Default control port of `warpsock server` (the data port is one above).
pub(crate) const DEFAULT_PORT: u16 = 18515;
/// Largest message size accepted by `--sizes`.
pub(crate) const MAX_SIZE: usize = 64 << 20;
/// Default per-test duration in seconds.
pub(crate) const DEFAULT_DURATION: f64 = 3.0;
/// Largest UDP datagram payload over IPv4.
pub(crate) const MAX_UDP: usize = 65507;
/// Most connections of one test (`--conns`).
pub(crate) const MAX_CONNS: usize = 64;
/// Most messages in flight per connection (`--window`).
pub(crate) const MAX_WINDOW: usize = 64;

/// How a transport carries messages; decides the rules that differ
/// between byte streams, datagrams and RDMA.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Family {
    /// A reliable byte stream (TCP sockets).
    Stream,
    /// Datagrams: at most [`MAX_UDP`] bytes, loss is counted, no
    /// connection-setup or normalized-CPU row.
    Datagram,
    /// warpsock iWARP queue pairs.
    Rdma,
}

/// Environment variables a transport needs (name, value).
pub(crate) type Vars = &'static [(&'static str, &'static str)];

/// What a transport says of itself: one `static` in its file under
/// `src/transports/`, listed once in the registry there.
#[derive(Debug)]
pub(crate) struct TransportInfo {
    /// Name on the command line, on the wire and in JSON (`udp-offload`).
    pub(crate) name: &'static str,
    /// Name in tables and legends (`UDP offload`).
    pub(crate) label: &'static str,
    /// One line for `--help` and the README.
    pub(crate) help: &'static str,
    pub(crate) family: Family,
    /// Runs with CRC32c off and on as separate rows.
    pub(crate) crc: bool,
    /// The data flows from the passive side (RDMA Read): the sink drives
    /// the test.
    pub(crate) pull: bool,
    /// The transport this one is compared with (`tcp` or `udp`).
    pub(crate) baseline: &'static str,
    /// In the quick suite's default set.
    pub(crate) quick: bool,
    /// Has a connection-setup (`conn`) row.
    pub(crate) setup: bool,
    /// Runs with both processes under `LD_PRELOAD=libwarpsock_preload.so`
    /// and this environment (a separate pass of preloaded child processes
    /// unless this process already runs so).
    pub(crate) preload: Option<Vars>,
}

/// A transport under test: a handle to its [`TransportInfo`]. Compared
/// by name.
#[derive(Clone, Copy)]
pub(crate) struct Transport(pub(crate) &'static TransportInfo);

impl std::ops::Deref for Transport {
    type Target = TransportInfo;
    fn deref(&self) -> &TransportInfo {
        self.0
    }
}

impl PartialEq for Transport {
    fn eq(&self, o: &Self) -> bool {
        self.0.name == o.0.name
    }
}

impl Eq for Transport {}

impl std::hash::Hash for Transport {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        self.0.name.hash(h);
    }
}

impl fmt::Debug for Transport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0.name)
    }
}

impl fmt::Display for Transport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0.name)
    }
}

impl Transport {
    /// Name on the wire and in JSON.
    pub(crate) fn name(self) -> &'static str {
        self.0.name
    }

    /// Name in the table.
    pub(crate) fn label(self) -> &'static str {
        self.0.label
    }

    /// Datagrams (size limit, loss accounting).
    pub(crate) fn is_udp(self) -> bool {
        self.0.family == Family::Datagram
    }

    /// A warpsock iWARP transport (CRC applies, engine progress options).
    pub(crate) fn is_iwarp(self) -> bool {
        self.0.family == Family::Rdma
    }

    /// Whether `test` at `size` has a row over this transport: datagrams
    /// stop at 65507 bytes and have no connection-setup or normalized-CPU
    /// row; connection setup only where the transport has one.
    pub(crate) fn runs(self, test: Test, size: usize) -> bool {
        match test {
            Test::Conn => self.0.setup,
            Test::Cpu => !self.is_udp(),
            _ => !(self.is_udp() && size > MAX_UDP),
        }
    }
}

/// A test of the suite.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, ValueEnum)]
pub(crate) enum Test {
    /// Ping-pong latency (one-way = round trip / 2).
    Lat,
    /// Unidirectional bandwidth with a window of messages in flight.
    Bw,
    /// Bidirectional bandwidth: both sides send at once.
    Bibw,
    /// Multi-stream bandwidth: N connections, one thread per connection on
    /// each side.
    Multi,
    /// Hot-spot latency: N clients ping-pong one server thread at once.
    Hotspot,
    /// Fan-in bandwidth: N senders to one receiving server thread.
    FanIn,
    /// Fan-out bandwidth: one sending server thread to N receivers.
    FanOut,
    /// Connection setup: connect + accept + an 8-byte exchange, repeated.
    Conn,
    /// Normalized CPU: bandwidth with every transport paced to the rate of
    /// the slowest, so CPU per byte compares at equal load.
    Cpu,
}

impl Test {
    /// Every test, in report order.
    pub(crate) const ALL: [Self; 9] = [
        Self::Lat,
        Self::Bw,
        Self::Bibw,
        Self::Multi,
        Self::Hotspot,
        Self::FanIn,
        Self::FanOut,
        Self::Conn,
        Self::Cpu,
    ];

    /// Name on the wire and in JSON.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Lat => "lat",
            Self::Bw => "bw",
            Self::Bibw => "bibw",
            Self::Multi => "multi",
            Self::Hotspot => "hotspot",
            Self::FanIn => "fan-in",
            Self::FanOut => "fan-out",
            Self::Conn => "conn",
            Self::Cpu => "cpu",
        }
    }

    /// Human name.
    pub(crate) fn title(self) -> &'static str {
        match self {
            Self::Lat => "ping-pong latency",
            Self::Bw => "unidirectional bandwidth",
            Self::Bibw => "bidirectional bandwidth",
            Self::Multi => "multi-stream bandwidth",
            Self::Hotspot => "hot-spot latency",
            Self::FanIn => "fan-in bandwidth",
            Self::FanOut => "fan-out bandwidth",
            Self::Conn => "connection setup",
            Self::Cpu => "normalized CPU",
        }
    }

    pub(crate) fn parse(s: &str) -> Option<Self> {
        <Self as ValueEnum>::from_str(s, false).ok()
    }

    /// Round-trip tests (percentiles of one-way time).
    pub(crate) fn is_latency(self) -> bool {
        matches!(self, Self::Lat | Self::Hotspot)
    }

    /// Tests whose result is a bandwidth.
    pub(crate) fn is_bandwidth(self) -> bool {
        !matches!(self, Self::Lat | Self::Hotspot | Self::Conn)
    }

    /// Tests swept over the number of connections.
    pub(crate) fn is_scaling(self) -> bool {
        matches!(
            self,
            Self::Multi | Self::Hotspot | Self::FanIn | Self::FanOut
        )
    }

    /// (client role, server role).
    pub(crate) fn roles(self) -> (Role, Role) {
        match self {
            Self::Lat | Self::Hotspot | Self::Conn => (Role::Ping, Role::Pong),
            Self::Bw | Self::Multi | Self::FanIn | Self::Cpu => (Role::Source, Role::Sink),
            Self::FanOut => (Role::Sink, Role::Source),
            Self::Bibw => (Role::Both, Role::Both),
        }
    }

    /// How the server spreads `n` connections over threads: one thread per
    /// connection (multi-stream), else one thread for all.
    pub(crate) fn server_threads(self, n: usize) -> usize {
        if self == Self::Multi {
            n
        } else {
            1
        }
    }
}

/// What a side does on each of its connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    /// Sends a message, waits for its echo.
    Ping,
    /// Echoes every message.
    Pong,
    /// The data source.
    Source,
    /// The data sink.
    Sink,
    /// Source and sink at once (bidirectional).
    Both,
}

impl Role {
    /// Whether this side drives the test (runs the budget, originates the
    /// messages) over `t`: senders, except over a pull transport (RDMA
    /// Read), where the sink reads.
    pub(crate) fn active(self, t: Transport) -> bool {
        match self {
            Self::Ping | Self::Both => true,
            Self::Pong => false,
            Self::Source => !t.pull,
            Self::Sink => t.pull,
        }
    }

    /// Whether data arrives at this side.
    pub(crate) fn receives(self) -> bool {
        self != Self::Source
    }
}

/// `--crc`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum CrcMode {
    /// CRC32c on every FPDU.
    On,
    /// No CRC (the trailer is zero).
    Off,
    /// Both, as separate rows.
    Both,
}

/// `--progress`: the engine's progress model (both sides use the same).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum ProgressMode {
    /// Progress inside post/poll/wait calls (lowest latency).
    Caller,
    /// A background progress thread per context.
    Thread,
}

impl ProgressMode {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Caller => "caller",
            Self::Thread => "thread",
        }
    }
}

/// `--suite`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum SuiteKind {
    /// Latency (8 B) and bandwidth (1 MiB) of host TCP next to warpsock
    /// Send / Write / Read, CRC off and on (about a minute).
    Quick,
    /// The Head-to-TOE set: every test, swept over sizes and connection
    /// counts, every transport.
    Full,
    /// Real applications (nginx, redis, memcached, aria2c, iperf3,
    /// GStreamer) over every transport that carries them.
    Apps,
}

impl SuiteKind {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Quick => "quick",
            Self::Full => "full",
            Self::Apps => "apps",
        }
    }
}

/// `--pin`: where the two sides run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PinArg {
    /// Latency tests: both sides on one CPU (on two different CPUs with
    /// busy polling, so the spinning sides do not starve each other);
    /// bandwidth tests: unpinned.
    Auto,
    /// Nothing pinned.
    None,
    /// Client on the first CPU, server on the second, for every test.
    Cpus(usize, usize),
}

impl fmt::Display for PinArg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Auto => f.write_str("auto"),
            Self::None => f.write_str("none"),
            Self::Cpus(a, b) => write!(f, "{a},{b}"),
        }
    }
}

/// How long each test runs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Budget {
    /// For this long (latency: after a warm-up of 5 %, at most 0.5 s).
    Time(Duration),
    /// This many measured round trips / messages per connection (latency:
    /// plus 5 % warm-up).
    Iters(u64),
}

impl Budget {
    /// `t:SECONDS` or `n:COUNT` (control protocol).
    pub(crate) fn encode(self) -> String {
        match self {
            Self::Time(d) => format!("t:{}", d.as_secs_f64()),
            Self::Iters(n) => format!("n:{n}"),
        }
    }

    pub(crate) fn decode(s: &str) -> Option<Self> {
        match s.split_once(':')? {
            ("t", v) => {
                let v: f64 = v.parse().ok()?;
                (v > 0.0 && v <= 3600.0).then(|| Self::Time(Duration::from_secs_f64(v)))
            }
            ("n", v) => v.parse().ok().filter(|&n| n > 0).map(Self::Iters),
            _ => None,
        }
    }
}

/// One test run as the server needs to know it (plus the client's CPU).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Spec {
    pub(crate) test: Test,
    pub(crate) transport: Transport,
    /// CRC32c on (warpsock only).
    pub(crate) crc: bool,
    /// Message size in bytes.
    pub(crate) size: usize,
    /// Messages in flight per connection (1 for latency).
    pub(crate) window: usize,
    /// Connections (clients) of the test.
    pub(crate) conns: usize,
    pub(crate) progress: ProgressMode,
    /// Spin time before sleeping, 0 = none.
    pub(crate) busy_poll_us: u64,
    /// Client's CPU (not sent to the server).
    pub(crate) client_pin: Option<usize>,
    /// Server's CPU.
    pub(crate) pin: Option<usize>,
    /// Check every byte.
    pub(crate) verify: bool,
    /// How long the active side runs.
    pub(crate) budget: Budget,
    /// Pace the active side to this many bytes per second (0: no limit).
    pub(crate) rate: u64,
}

impl Spec {
    /// Short label for progress and errors.
    pub(crate) fn label(&self) -> String {
        let crc = match (self.transport.crc, self.crc) {
            (false, _) => "",
            (_, true) => ", CRC on",
            (_, false) => ", CRC off",
        };
        let n = if self.test.is_scaling() {
            format!(" N={}", self.conns)
        } else {
            String::new()
        };
        let busy = if self.busy_poll_us > 0 && self.test.is_latency() {
            ", busy-poll"
        } else {
            ""
        };
        format!(
            "{} {}{n} {}{crc}{busy}",
            self.test.title(),
            fmt_size(self.size),
            self.transport.label()
        )
    }

    pub(crate) fn busy_poll(&self) -> Duration {
        Duration::from_micros(self.busy_poll_us)
    }

    /// The client's and the server's role.
    pub(crate) fn roles(&self) -> (Role, Role) {
        self.test.roles()
    }
}

/// `8 B`, `64 KiB`, `1 MiB`, `1.5 MiB`.
pub(crate) fn fmt_size(n: usize) -> String {
    if n >= 1 << 20 && n.is_multiple_of(1 << 20) {
        format!("{} MiB", n >> 20)
    } else if n >= 1 << 10 && n.is_multiple_of(1 << 10) {
        format!("{} KiB", n >> 10)
    } else {
        format!("{n} B")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budget_on_the_wire() {
        for b in [Budget::Time(Duration::from_millis(50)), Budget::Iters(7)] {
            assert_eq!(Budget::decode(&b.encode()), Some(b));
        }
        assert_eq!(Budget::decode("t:0"), None);
        assert_eq!(Budget::decode("n:0"), None);
        assert_eq!(Budget::decode("x:1"), None);
    }

    #[test]
    fn sizes_print_in_binary_units() {
        assert_eq!(fmt_size(8), "8 B");
        assert_eq!(fmt_size(65536), "64 KiB");
        assert_eq!(fmt_size(3 << 20), "3 MiB");
        assert_eq!(fmt_size(1500), "1500 B");
    }
}
