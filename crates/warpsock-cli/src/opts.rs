//! Command-line options shared by `bench` and `client`, their parsers
//! (every bad value is named together with the allowed range), and the
//! description of one test run ([`Spec`]) that travels to the server.

use std::fmt;
use std::path::PathBuf;
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

/// A transport under test.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, ValueEnum)]
pub(crate) enum Transport {
    /// Host TCP through plain sockets (the baseline).
    Tcp,
    /// Host UDP through plain sockets (datagrams; loss is counted).
    Udp,
    /// The host-UDP transport with both sides under the UDP offload layer
    /// (`LD_PRELOAD=libwarpsock_preload.so WARPSOCK_UDP_OFFLOAD=1`).
    UdpOffload,
    /// warpsock RDMAP Send into posted receives.
    Send,
    /// warpsock RDMA Write into the peer's registered region.
    Write,
    /// warpsock RDMA Read from the peer's registered region.
    Read,
}

impl Transport {
    /// Every transport, in table order.
    pub(crate) const ALL: [Self; 6] = [
        Self::Tcp,
        Self::Udp,
        Self::UdpOffload,
        Self::Send,
        Self::Write,
        Self::Read,
    ];

    /// Name on the wire and in JSON.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Tcp => "tcp",
            Self::Udp => "udp",
            Self::UdpOffload => "udp-offload",
            Self::Send => "send",
            Self::Write => "write",
            Self::Read => "read",
        }
    }

    /// Name in the table.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Self::Tcp => "host TCP",
            Self::Udp => "host UDP",
            Self::UdpOffload => "UDP offload",
            Self::Send => "warpsock Send",
            Self::Write => "warpsock RDMA Write",
            Self::Read => "warpsock RDMA Read",
        }
    }

    pub(crate) fn parse(s: &str) -> Option<Self> {
        <Self as ValueEnum>::from_str(s, false).ok()
    }

    /// A warpsock iWARP transport (CRC applies).
    pub(crate) fn is_iwarp(self) -> bool {
        matches!(self, Self::Send | Self::Write | Self::Read)
    }

    /// Datagrams (host UDP, with or without the offload layer).
    pub(crate) fn is_udp(self) -> bool {
        matches!(self, Self::Udp | Self::UdpOffload)
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
    /// Whether this side drives the test (runs the budget) over
    /// `transport`: senders, except for RDMA Read, where the sink reads.
    pub(crate) fn active(self, transport: Transport) -> bool {
        match self {
            Self::Ping | Self::Both => true,
            Self::Pong => false,
            Self::Source => transport != Transport::Read,
            Self::Sink => transport == Transport::Read,
        }
    }
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

/// Options of a bench run (`bench` and `client`).
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct BenchOpts {
    /// Which set of tests: quick (latency and bandwidth of host TCP next to
    /// warpsock) or full (the Head-to-TOE suite).
    #[arg(long, value_enum, default_value = "quick")]
    pub(crate) suite: SuiteKind,
    /// CI variant: tiny durations and short sweeps, every test still run.
    #[arg(long)]
    pub(crate) quick: bool,
    /// Tests to run [default: lat,bw for the quick suite, all for full].
    #[arg(long, value_enum, value_delimiter = ',')]
    pub(crate) tests: Vec<Test>,
    /// Transports to compare [default: tcp,send,write,read for the quick
    /// suite; all for full (udp-offload when the preload library is built)].
    #[arg(long, value_enum, value_delimiter = ',')]
    pub(crate) transports: Vec<Transport>,
    /// Message sizes (B, K/KiB, M/MiB suffixes), 1 B to 64 MiB, for every
    /// test [default: per test and suite].
    #[arg(long, value_delimiter = ',', value_parser = parse_size, value_name = "SIZE,...")]
    pub(crate) sizes: Vec<usize>,
    /// Connection counts of the multi-stream, hot-spot and fan tests, 1 to
    /// 64 [default: 1,2,4,8,16,32,64 (full), 1,4 (--quick)].
    #[arg(long, value_delimiter = ',', value_parser = parse_conns, value_name = "N,...")]
    pub(crate) conns: Vec<usize>,
    /// Seconds per test, 0.01 to 3600 [default: 3 (quick suite), 0.5
    /// (full), 0.05 (--quick)].
    #[arg(long, value_parser = parse_duration, value_name = "SECONDS", conflicts_with = "iters")]
    pub(crate) duration: Option<Duration>,
    /// Measured round trips (latency) or messages (bandwidth) per test and
    /// connection, 1 to 1000000000, instead of --duration.
    #[arg(long, value_parser = parse_iters, value_name = "N")]
    pub(crate) iters: Option<u64>,
    /// Run warpsock with CRC32c on, off, or both.
    #[arg(long, value_enum, default_value = "both")]
    pub(crate) crc: CrcMode,
    /// Progress model of the warpsock engine on both sides.
    #[arg(long, value_enum, default_value = "caller")]
    pub(crate) progress: ProgressMode,
    /// Spin this many microseconds (1 to 1000000) polling before sleeping,
    /// on both sides and for every transport (TCP and UDP spin on
    /// non-blocking sockets). Without a value: 1000. The full suite runs
    /// latency both event-driven and busy-polling (this long, default 1000).
    #[arg(long, value_name = "USEC", num_args = 0..=1, default_missing_value = "1000",
          value_parser = parse_busy_poll)]
    pub(crate) busy_poll: Option<u64>,
    /// Bandwidth: messages in flight per connection, 1 to 64.
    #[arg(long, value_parser = parse_window, default_value = "8", value_name = "N")]
    pub(crate) window: usize,
    /// CPU placement: auto (latency tests: both sides on one CPU, or on two
    /// when busy polling; bandwidth unpinned), none, or `CLIENT[,SERVER]`
    /// CPU numbers for every test.
    #[arg(long, value_parser = parse_pin, default_value = "auto", value_name = "auto|none|CPU[,CPU]")]
    pub(crate) pin: PinArg,
    /// Check every byte of every message (default: the sequence stamps at
    /// both ends of each message).
    #[arg(long)]
    pub(crate) verify: bool,
    /// Write every sample and result as JSON to FILE.
    #[arg(long, value_name = "FILE")]
    pub(crate) json: Option<PathBuf>,
    /// Write every sample as CSV to FILE.
    #[arg(long, value_name = "FILE")]
    pub(crate) csv: Option<PathBuf>,
    /// Keep at most N round-trip samples per run in --json/--csv (evenly
    /// spaced; percentiles still come from all of them), 1 to 1000000000
    /// [default: all].
    #[arg(long, value_parser = parse_iters, value_name = "N")]
    pub(crate) max_samples: Option<u64>,
    /// Run the whole plan this many times (1 to 100), one round after the
    /// other, and keep each test's median run (its spread goes into the
    /// JSON).
    #[arg(long, value_parser = parse_repeat, default_value = "1", value_name = "N")]
    pub(crate) repeat: usize,
    /// Also run the peers users would pick instead, where installed, on
    /// loopback: iperf3 (TCP 1 MiB, UDP 16 KiB), sockperf (TCP and UDP
    /// ping-pong, 64 B), ucx_perftest over UCX's TCP transport (put and
    /// tag latency at 8 B, bandwidth at 1 MiB; package ucx-utils) and
    /// fi_pingpong over libfabric's tcp provider (ping-pong at 8 B and
    /// 64 KiB; package libfabric-bin).
    #[arg(long)]
    pub(crate) external: bool,
}

/// Sizes swept per test: (quick suite, full suite, --quick).
fn default_sizes(test: Test, suite: SuiteKind, quick: bool) -> Vec<usize> {
    const K: usize = 1 << 10;
    const M: usize = 1 << 20;
    match (test, suite, quick) {
        (Test::Lat, SuiteKind::Quick, false) => vec![8],
        (Test::Lat, _, true) => vec![8, 4 * K],
        (Test::Lat, SuiteKind::Full, false) => {
            vec![1, 8, 64, 256, K, 4 * K, 16 * K, 64 * K]
        }
        (Test::Bw, SuiteKind::Quick, false) => vec![M],
        (Test::Bw, _, true) => vec![64, M],
        (Test::Bw, SuiteKind::Full, false) => {
            vec![1, 16, 256, 4 * K, 16 * K, 64 * K, 256 * K, M, 4 * M]
        }
        (Test::Bibw, _, true) => vec![32 * K],
        (Test::Bibw, _, false) => vec![4 * K, 64 * K, M],
        (Test::Hotspot | Test::Conn, _, _) => vec![8],
        // 32 KiB: a size every transport can carry (UDP up to 65507 B).
        (Test::Multi | Test::FanIn | Test::FanOut, _, _) => vec![32 * K],
        (Test::Cpu, _, _) => vec![M],
    }
}

impl BenchOpts {
    pub(crate) fn budget(&self) -> Budget {
        match (self.iters, self.duration) {
            (Some(n), _) => Budget::Iters(n),
            (None, Some(d)) => Budget::Time(d),
            (None, None) => Budget::Time(Duration::from_secs_f64(match (self.quick, self.suite) {
                (true, _) => 0.05,
                (false, SuiteKind::Full) => 0.5,
                (false, SuiteKind::Quick) => DEFAULT_DURATION,
            })),
        }
    }

    /// These options as command-line arguments (for a child `warpsock
    /// client`), without --json/--csv; `transports` replaces the list.
    pub(crate) fn to_args(&self, transports: &[Transport]) -> Vec<String> {
        let join = |v: Vec<String>| v.join(",");
        let mut a = vec![
            "--suite".to_string(),
            match self.suite {
                SuiteKind::Quick => "quick".into(),
                SuiteKind::Full => "full".into(),
            },
        ];
        if self.quick {
            a.push("--quick".into());
        }
        if !self.tests.is_empty() {
            a.push("--tests".into());
            a.push(join(
                self.tests.iter().map(|t| t.name().to_string()).collect(),
            ));
        }
        if !transports.is_empty() {
            a.push("--transports".into());
            a.push(join(
                transports.iter().map(|t| t.name().to_string()).collect(),
            ));
        }
        if !self.sizes.is_empty() {
            a.push("--sizes".into());
            a.push(join(self.sizes.iter().map(usize::to_string).collect()));
        }
        if !self.conns.is_empty() {
            a.push("--conns".into());
            a.push(join(self.conns.iter().map(usize::to_string).collect()));
        }
        if let Some(d) = self.duration {
            a.push("--duration".into());
            a.push(d.as_secs_f64().to_string());
        }
        if let Some(n) = self.iters {
            a.push("--iters".into());
            a.push(n.to_string());
        }
        a.push("--crc".into());
        a.push(
            match self.crc {
                CrcMode::On => "on",
                CrcMode::Off => "off",
                CrcMode::Both => "both",
            }
            .into(),
        );
        a.push("--progress".into());
        a.push(self.progress.name().into());
        if let Some(b) = self.busy_poll {
            a.push(format!("--busy-poll={b}"));
        }
        a.push("--window".into());
        a.push(self.window.to_string());
        a.push("--pin".into());
        a.push(self.pin.to_string());
        if self.verify {
            a.push("--verify".into());
        }
        a.push("--repeat".into());
        a.push(self.repeat.to_string());
        a
    }

    pub(crate) fn crcs(&self) -> &'static [bool] {
        match self.crc {
            CrcMode::On => &[true],
            CrcMode::Off => &[false],
            CrcMode::Both => &[false, true],
        }
    }

    /// The tests asked for, in report order.
    pub(crate) fn tests(&self) -> Vec<Test> {
        let mut t = if self.tests.is_empty() {
            match self.suite {
                SuiteKind::Quick => vec![Test::Lat, Test::Bw],
                SuiteKind::Full => Test::ALL.to_vec(),
            }
        } else {
            self.tests.clone()
        };
        t.sort();
        t.dedup();
        t
    }

    /// The transports asked for; `offload`: the preload library is there
    /// (the full suite's default then includes udp-offload).
    pub(crate) fn transports(&self, offload: bool) -> Vec<Transport> {
        let mut t = if self.transports.is_empty() {
            match self.suite {
                SuiteKind::Quick => vec![
                    Transport::Tcp,
                    Transport::Send,
                    Transport::Write,
                    Transport::Read,
                ],
                SuiteKind::Full => Transport::ALL
                    .into_iter()
                    .filter(|&t| offload || t != Transport::UdpOffload)
                    .collect(),
            }
        } else {
            self.transports.clone()
        };
        t.sort();
        t.dedup();
        t
    }

    fn conn_counts(&self, test: Test) -> Vec<usize> {
        if !test.is_scaling() {
            return vec![1];
        }
        if !self.conns.is_empty() {
            return self.conns.clone();
        }
        if self.quick {
            vec![1, 4]
        } else {
            vec![1, 2, 4, 8, 16, 32, 64]
        }
    }

    /// Every test run, in order: per test, size (or connection count) and
    /// transport, TCP first, each warpsock transport with each CRC
    /// setting. `cpus`: CPUs of the client and of the server machine;
    /// `same_host`: both sides share the machine (auto pinning then keeps
    /// spinning sides apart); `offload`: the preload library is there.
    /// The rate of `cpu` runs is filled in when they run.
    pub(crate) fn plan(&self, cpus: (usize, usize), same_host: bool, offload: bool) -> Vec<Spec> {
        let transports = self.transports(offload);
        let mut out = Vec::new();
        let busy_modes: Vec<u64> = match (self.suite, self.busy_poll) {
            (SuiteKind::Full, b) => vec![0, b.unwrap_or(1000)],
            (SuiteKind::Quick, b) => vec![b.unwrap_or(0)],
        };
        let mut tests = self.tests();
        if tests.contains(&Test::Cpu) && !tests.contains(&Test::Bw) {
            // Normalized CPU paces every transport to the slowest one's
            // bandwidth at the same size: measure it first.
            tests.insert(0, Test::Bw);
        }
        for test in tests {
            let sizes =
                if self.sizes.is_empty() && test == Test::Bw && !self.tests().contains(&Test::Bw) {
                    default_sizes(Test::Cpu, self.suite, self.quick)
                } else if self.sizes.is_empty() {
                    default_sizes(test, self.suite, self.quick)
                } else {
                    self.sizes.clone()
                };
            let modes: &[u64] = match test {
                Test::Lat => &busy_modes,
                _ => &busy_modes[..1],
            };
            for &busy in modes {
                let (cpin, spin) = self.pins(test, cpus, same_host, busy > 0);
                for &size in &sizes {
                    for conns in self.conn_counts(test) {
                        for &t in &transports {
                            if !runs(test, t, size) {
                                continue;
                            }
                            let crcs: &[bool] = if t.is_iwarp() { self.crcs() } else { &[false] };
                            for &crc in crcs {
                                if test == Test::Conn && t != Transport::Tcp && t != Transport::Send
                                {
                                    continue;
                                }
                                out.push(Spec {
                                    test,
                                    transport: t,
                                    crc,
                                    size,
                                    window: if test.is_latency() { 1 } else { self.window },
                                    conns,
                                    progress: self.progress,
                                    busy_poll_us: busy,
                                    client_pin: cpin,
                                    pin: spin,
                                    verify: self.verify,
                                    budget: self.budget(),
                                    rate: 0,
                                });
                            }
                        }
                    }
                }
            }
        }
        out
    }

    /// (client CPU, server CPU) for a test.
    fn pins(
        &self,
        test: Test,
        (ccpus, scpus): (usize, usize),
        same_host: bool,
        busy: bool,
    ) -> (Option<usize>, Option<usize>) {
        match self.pin {
            PinArg::None => (None, None),
            PinArg::Cpus(a, b) => (Some(a), Some(b)),
            PinArg::Auto if !matches!(test, Test::Lat | Test::Hotspot | Test::Conn) => (None, None),
            PinArg::Auto => {
                let (c, s) = (ccpus.saturating_sub(1), scpus.saturating_sub(1));
                if same_host && busy && c > 0 {
                    (Some(c - 1), Some(s))
                } else {
                    (Some(c), Some(s))
                }
            }
        }
    }
}

/// Whether `test` runs over `t` at `size`: datagrams stop at 65507 bytes,
/// and connection setup has no datagram row; normalized CPU compares the
/// reliable transports.
fn runs(test: Test, t: Transport, size: usize) -> bool {
    !(t.is_udp() && (size > MAX_UDP || matches!(test, Test::Conn | Test::Cpu)))
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
        let crc = match (self.transport.is_iwarp(), self.crc) {
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
    if n >= 1 << 20 && n % (1 << 20) == 0 {
        format!("{} MiB", n >> 20)
    } else if n >= 1 << 10 && n % (1 << 10) == 0 {
        format!("{} KiB", n >> 10)
    } else {
        format!("{n} B")
    }
}

/// `--sizes` element: `8`, `8B`, `64K`, `64KiB`, `1M`, `1MiB`.
pub(crate) fn parse_size(s: &str) -> Result<usize, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let mult: usize = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        _ => {
            return Err(format!(
                "'{s}': unknown unit (use B, K or M; 1 B to 64 MiB)"
            ))
        }
    };
    let n: usize = num
        .parse()
        .map_err(|_| format!("'{s}': not a size (e.g. 8, 64K, 1M; 1 B to 64 MiB)"))?;
    match n.checked_mul(mult) {
        Some(v) if (1..=MAX_SIZE).contains(&v) => Ok(v),
        _ => Err(format!("'{s}': must be between 1 B and 64 MiB")),
    }
}

/// `--duration`.
pub(crate) fn parse_duration(s: &str) -> Result<Duration, String> {
    let range = "must be between 0.01 and 3600 seconds";
    let v: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("'{s}': not a number of seconds; {range}"))?;
    if !(0.01..=3600.0).contains(&v) {
        return Err(format!("{s}: {range}"));
    }
    Ok(Duration::from_secs_f64(v))
}

fn parse_range(s: &str, lo: u64, hi: u64, what: &str) -> Result<u64, String> {
    let range = format!("must be between {lo} and {hi}{what}");
    let v: u64 = s
        .trim()
        .parse()
        .map_err(|_| format!("'{s}': not a whole number; {range}"))?;
    if !(lo..=hi).contains(&v) {
        return Err(format!("{s}: {range}"));
    }
    Ok(v)
}

/// `--iters`.
pub(crate) fn parse_iters(s: &str) -> Result<u64, String> {
    parse_range(s, 1, 1_000_000_000, "")
}

/// `--busy-poll`.
pub(crate) fn parse_busy_poll(s: &str) -> Result<u64, String> {
    parse_range(s, 1, 1_000_000, " microseconds")
}

/// `--conns` element.
pub(crate) fn parse_conns(s: &str) -> Result<usize, String> {
    parse_range(s, 1, MAX_CONNS as u64, " connections").map(|v| v as usize)
}

/// `--repeat`.
pub(crate) fn parse_repeat(s: &str) -> Result<usize, String> {
    parse_range(s, 1, 100, " rounds").map(|v| v as usize)
}

/// `--window`.
pub(crate) fn parse_window(s: &str) -> Result<usize, String> {
    parse_range(s, 1, 64, " messages").map(|v| v as usize)
}

/// `--pin`.
pub(crate) fn parse_pin(s: &str) -> Result<PinArg, String> {
    let cpus = crate::pin::cpu_count();
    let t = s.trim();
    match t {
        "auto" => return Ok(PinArg::Auto),
        "none" => return Ok(PinArg::None),
        _ => {}
    }
    let one = |c: &str| -> Result<usize, String> {
        let v: usize = c.trim().parse().map_err(|_| {
            format!(
                "'{s}': use auto, none, or CPU[,CPU] with CPUs 0 to {}",
                cpus - 1
            )
        })?;
        if v >= cpus {
            return Err(format!(
                "{s}: CPU {v} does not exist; CPUs must be between 0 and {}",
                cpus - 1
            ));
        }
        Ok(v)
    };
    match t.split_once(',') {
        Some((a, b)) => Ok(PinArg::Cpus(one(a)?, one(b)?)),
        None => {
            let a = one(t)?;
            Ok(PinArg::Cpus(a, a))
        }
    }
}

/// `HOST[:PORT]` → (host, port if given). IPv6 literals go in brackets
/// when a port follows (`[::1]:18515`); a bare `::1` is taken as a host.
pub(crate) fn parse_host_port(s: &str) -> Result<(String, Option<u16>), String> {
    let t = s.trim();
    if t.is_empty() {
        return Err("empty address: give HOST or HOST:PORT".into());
    }
    let port = |p: &str| -> Result<Option<u16>, String> {
        match p.parse::<u16>() {
            Ok(v) if v > 0 => Ok(Some(v)),
            _ => Err(format!("'{s}': port '{p}' must be between 1 and 65535")),
        }
    };
    if let Some(rest) = t.strip_prefix('[') {
        let (host, after) = rest
            .split_once(']')
            .ok_or_else(|| format!("'{s}': missing ']' after the IPv6 address"))?;
        return match after.strip_prefix(':') {
            Some(p) => Ok((host.to_string(), port(p)?)),
            None if after.is_empty() => Ok((host.to_string(), None)),
            None => Err(format!("'{s}': expected ':PORT' after ']'")),
        };
    }
    if t.parse::<std::net::Ipv6Addr>().is_ok() {
        return Ok((t.to_string(), None));
    }
    match t.rsplit_once(':') {
        Some((h, p)) if !h.contains(':') => Ok((h.to_string(), port(p)?)),
        Some(_) => Err(format!(
            "'{s}': put an IPv6 address in brackets: [ADDR]:PORT"
        )),
        None => Ok((t.to_string(), None)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("8"), Ok(8));
        assert_eq!(parse_size("64K"), Ok(65536));
        assert_eq!(parse_size("1MiB"), Ok(1 << 20));
        assert_eq!(parse_size("64M"), Ok(64 << 20));
        assert!(parse_size("0")
            .unwrap_err()
            .contains("between 1 B and 64 MiB"));
        assert!(parse_size("65M").is_err());
        assert!(parse_size("3G").unwrap_err().contains("unit"));
        assert!(parse_size("x").is_err());
    }

    #[test]
    fn ranges() {
        assert_eq!(
            parse_duration("0").unwrap_err(),
            "0: must be between 0.01 and 3600 seconds"
        );
        assert!(parse_duration("0.1").is_ok());
        assert!(parse_duration("nan").is_err());
        assert!(parse_iters("0").unwrap_err().contains("between 1 and"));
        assert!(parse_window("65").is_err());
        assert_eq!(parse_window("64"), Ok(64));
        assert_eq!(parse_pin("none"), Ok(PinArg::None));
        assert_eq!(parse_pin("0"), Ok(PinArg::Cpus(0, 0)));
        assert!(parse_pin("9999").unwrap_err().contains("does not exist"));
    }

    #[test]
    fn host_port() {
        let hp = |s: &str| parse_host_port(s);
        assert_eq!(hp("127.0.0.1"), Ok(("127.0.0.1".into(), None)));
        assert_eq!(hp("127.0.0.1:9"), Ok(("127.0.0.1".into(), Some(9))));
        assert_eq!(hp("[::1]:9"), Ok(("::1".into(), Some(9))));
        assert_eq!(hp("::1"), Ok(("::1".into(), None)));
        assert_eq!(hp("box"), Ok(("box".into(), None)));
        assert!(hp("box:0").unwrap_err().contains("between 1 and 65535"));
        assert!(hp("box:99999").is_err());
    }

    fn opts(suite: SuiteKind, quick: bool) -> BenchOpts {
        BenchOpts {
            suite,
            quick,
            tests: vec![],
            transports: vec![],
            sizes: vec![],
            conns: vec![],
            duration: None,
            iters: None,
            crc: CrcMode::Both,
            progress: ProgressMode::Caller,
            busy_poll: None,
            window: 8,
            pin: PinArg::Auto,
            verify: false,
            json: None,
            csv: None,
            max_samples: None,
            repeat: 1,
            external: false,
        }
    }

    #[test]
    fn default_plan() {
        let p = opts(SuiteKind::Quick, false).plan((2, 2), true, true);
        assert_eq!(p.len(), 14);
        assert_eq!(p[0].transport, Transport::Tcp);
        assert_eq!(
            (p[0].size, p[0].pin, p[0].client_pin),
            (8, Some(1), Some(1))
        );
        assert_eq!((p[7].size, p[7].test, p[7].pin), (1 << 20, Test::Bw, None));
        assert_eq!(p[0].budget, Budget::Time(Duration::from_secs(3)));
    }

    #[test]
    fn full_plan_covers_every_test_and_transport() {
        for quick in [false, true] {
            let p = opts(SuiteKind::Full, quick).plan((2, 2), true, true);
            for t in Test::ALL {
                assert!(p.iter().any(|s| s.test == t), "{t:?}");
            }
            for t in Transport::ALL {
                assert!(p.iter().any(|s| s.transport == t), "{t:?}");
            }
            // No datagram larger than UDP allows; busy and event latency.
            assert!(p.iter().all(|s| !s.transport.is_udp() || s.size <= MAX_UDP));
            assert!(p.iter().any(|s| s.test == Test::Lat && s.busy_poll_us > 0));
            assert!(p.iter().any(|s| s.test == Test::Lat && s.busy_poll_us == 0));
            let ns: Vec<usize> = p
                .iter()
                .filter(|s| s.test == Test::FanIn && s.transport == Transport::Tcp)
                .map(|s| s.conns)
                .collect();
            assert_eq!(
                ns,
                if quick {
                    vec![1, 4]
                } else {
                    vec![1, 2, 4, 8, 16, 32, 64]
                }
            );
        }
    }

    #[test]
    fn budget_on_the_wire() {
        for b in [Budget::Time(Duration::from_millis(50)), Budget::Iters(7)] {
            assert_eq!(Budget::decode(&b.encode()), Some(b));
        }
        assert_eq!(Budget::decode("t:0"), None);
        assert_eq!(Budget::decode("n:0"), None);
        assert_eq!(Budget::decode("x:1"), None);
    }
}
