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

/// A transport under test.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, ValueEnum)]
pub(crate) enum Transport {
    /// Host TCP through plain `std::net` sockets (the baseline).
    Tcp,
    /// warpsock RDMAP Send into posted receives.
    Send,
    /// warpsock RDMA Write into the peer's registered region.
    Write,
    /// warpsock RDMA Read from the peer's registered region.
    Read,
}

impl Transport {
    /// Name on the wire and in JSON.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Tcp => "tcp",
            Self::Send => "send",
            Self::Write => "write",
            Self::Read => "read",
        }
    }

    /// Name in the table.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Self::Tcp => "host TCP",
            Self::Send => "warpsock Send",
            Self::Write => "warpsock RDMA Write",
            Self::Read => "warpsock RDMA Read",
        }
    }

    pub(crate) fn parse(s: &str) -> Option<Self> {
        <Self as ValueEnum>::from_str(s, false).ok()
    }
}

/// A test kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, ValueEnum)]
pub(crate) enum Test {
    /// Ping-pong latency (one-way = round trip / 2).
    Lat,
    /// Unidirectional bandwidth with a window of messages in flight.
    Bw,
}

impl Test {
    /// Name on the wire and in JSON.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Lat => "lat",
            Self::Bw => "bw",
        }
    }

    pub(crate) fn parse(s: &str) -> Option<Self> {
        <Self as ValueEnum>::from_str(s, false).ok()
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

/// `--pin`: where the two sides run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PinArg {
    /// Latency tests: both sides on one CPU (on two different CPUs with
    /// `--busy-poll`, so the spinning sides do not starve each other);
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
    /// This many measured round trips / messages (latency: plus 5 % warm-up).
    Iters(u64),
}

/// Options of a bench run (`bench` and `client`).
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct BenchOpts {
    /// Tests to run.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "lat,bw")]
    pub(crate) tests: Vec<Test>,
    /// Transports to compare.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "tcp,send,write,read"
    )]
    pub(crate) transports: Vec<Transport>,
    /// Message sizes (B, K/KiB, M/MiB suffixes), 1 B to 64 MiB, for every
    /// test. Default: 8 B for latency, 1 MiB for bandwidth.
    #[arg(long, value_delimiter = ',', value_parser = parse_size, value_name = "SIZE,...")]
    pub(crate) sizes: Vec<usize>,
    /// Seconds per test, 0.1 to 3600 [default: 3].
    #[arg(long, value_parser = parse_duration, value_name = "SECONDS", conflicts_with = "iters")]
    pub(crate) duration: Option<Duration>,
    /// Measured round trips (latency) or messages (bandwidth) per test,
    /// 1 to 1000000000, instead of --duration.
    #[arg(long, value_parser = parse_iters, value_name = "N")]
    pub(crate) iters: Option<u64>,
    /// Run warpsock with CRC32c on, off, or both.
    #[arg(long, value_enum, default_value = "both")]
    pub(crate) crc: CrcMode,
    /// Progress model of the warpsock engine on both sides.
    #[arg(long, value_enum, default_value = "caller")]
    pub(crate) progress: ProgressMode,
    /// Spin this many microseconds (1 to 1000000) polling before sleeping,
    /// on both sides and for every transport (TCP spins on a non-blocking
    /// socket). Without a value: 1000.
    #[arg(long, value_name = "USEC", num_args = 0..=1, default_missing_value = "1000",
          value_parser = parse_busy_poll)]
    pub(crate) busy_poll: Option<u64>,
    /// Bandwidth: messages in flight, 1 to 64.
    #[arg(long, value_parser = parse_window, default_value = "8", value_name = "N")]
    pub(crate) window: usize,
    /// CPU placement: auto (latency tests: both sides on one CPU, or on two
    /// with --busy-poll; bandwidth unpinned), none, or `CLIENT[,SERVER]` CPU
    /// numbers for every test.
    #[arg(long, value_parser = parse_pin, default_value = "auto", value_name = "auto|none|CPU[,CPU]")]
    pub(crate) pin: PinArg,
    /// Check every byte of every message (default: the sequence stamps at
    /// both ends of each message).
    #[arg(long)]
    pub(crate) verify: bool,
    /// Write every sample and result as JSON to FILE.
    #[arg(long, value_name = "FILE")]
    pub(crate) json: Option<PathBuf>,
}

impl BenchOpts {
    pub(crate) fn budget(&self) -> Budget {
        match (self.iters, self.duration) {
            (Some(n), _) => Budget::Iters(n),
            (None, Some(d)) => Budget::Time(d),
            (None, None) => Budget::Time(Duration::from_secs_f64(DEFAULT_DURATION)),
        }
    }

    pub(crate) fn crcs(&self) -> &'static [bool] {
        match self.crc {
            CrcMode::On => &[true],
            CrcMode::Off => &[false],
            CrcMode::Both => &[false, true],
        }
    }

    /// Every test run, in order: per test and size, TCP first, then each
    /// warpsock transport with each CRC setting.
    /// `cpus`: CPUs of the client and of the server machine; `same_host`:
    /// both sides share the machine (auto pinning then keeps spinning
    /// sides apart).
    pub(crate) fn plan(&self, cpus: (usize, usize), same_host: bool) -> Vec<Spec> {
        let mut tests = self.tests.clone();
        tests.dedup();
        let mut out = Vec::new();
        for &test in &tests {
            let sizes = if self.sizes.is_empty() {
                vec![match test {
                    Test::Lat => 8,
                    Test::Bw => 1 << 20,
                }]
            } else {
                self.sizes.clone()
            };
            let (cpin, spin) = self.pins(test, cpus, same_host);
            for &size in &sizes {
                for t in [
                    Transport::Tcp,
                    Transport::Send,
                    Transport::Write,
                    Transport::Read,
                ] {
                    if !self.transports.contains(&t) {
                        continue;
                    }
                    let crcs: &[bool] = if t == Transport::Tcp {
                        &[false]
                    } else {
                        self.crcs()
                    };
                    for &crc in crcs {
                        out.push(Spec {
                            test,
                            transport: t,
                            crc,
                            size,
                            window: if test == Test::Lat { 1 } else { self.window },
                            progress: self.progress,
                            busy_poll_us: self.busy_poll.unwrap_or(0),
                            client_pin: cpin,
                            pin: spin,
                            verify: self.verify,
                        });
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
    ) -> (Option<usize>, Option<usize>) {
        match self.pin {
            PinArg::None => (None, None),
            PinArg::Cpus(a, b) => (Some(a), Some(b)),
            PinArg::Auto if test == Test::Bw => (None, None),
            PinArg::Auto => {
                let (c, s) = (ccpus.saturating_sub(1), scpus.saturating_sub(1));
                if same_host && self.busy_poll.is_some() && c > 0 {
                    (Some(c - 1), Some(s))
                } else {
                    (Some(c), Some(s))
                }
            }
        }
    }
}

/// One test run as the server needs to know it (plus the client's CPU).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Spec {
    pub(crate) test: Test,
    pub(crate) transport: Transport,
    /// CRC32c on (warpsock only).
    pub(crate) crc: bool,
    /// Message size in bytes.
    pub(crate) size: usize,
    /// Messages in flight (1 for latency).
    pub(crate) window: usize,
    pub(crate) progress: ProgressMode,
    /// Spin time before sleeping, 0 = none.
    pub(crate) busy_poll_us: u64,
    /// Client's CPU (not sent to the server).
    pub(crate) client_pin: Option<usize>,
    /// Server's CPU.
    pub(crate) pin: Option<usize>,
    /// Check every byte.
    pub(crate) verify: bool,
}

impl Spec {
    /// Short label for progress and errors.
    pub(crate) fn label(&self) -> String {
        let crc = match (self.transport, self.crc) {
            (Transport::Tcp, _) => "",
            (_, true) => ", CRC on",
            (_, false) => ", CRC off",
        };
        let what = match self.test {
            Test::Lat => "latency",
            Test::Bw => "bandwidth",
        };
        format!(
            "{what} {} {}{crc}",
            fmt_size(self.size),
            self.transport.label()
        )
    }

    pub(crate) fn busy_poll(&self) -> Duration {
        Duration::from_micros(self.busy_poll_us)
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
    let range = "must be between 0.1 and 3600 seconds";
    let v: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("'{s}': not a number of seconds; {range}"))?;
    if !(0.1..=3600.0).contains(&v) {
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
            "0: must be between 0.1 and 3600 seconds"
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

    #[test]
    fn default_plan() {
        let o = BenchOpts {
            tests: vec![Test::Lat, Test::Bw],
            transports: vec![
                Transport::Tcp,
                Transport::Send,
                Transport::Write,
                Transport::Read,
            ],
            sizes: vec![],
            duration: None,
            iters: None,
            crc: CrcMode::Both,
            progress: ProgressMode::Caller,
            busy_poll: None,
            window: 8,
            pin: PinArg::Auto,
            verify: false,
            json: None,
        };
        let p = o.plan((2, 2), true);
        assert_eq!(p.len(), 14);
        assert_eq!(p[0].transport, Transport::Tcp);
        assert_eq!(
            (p[0].size, p[0].pin, p[0].client_pin),
            (8, Some(1), Some(1))
        );
        assert_eq!((p[7].size, p[7].test, p[7].pin), (1 << 20, Test::Bw, None));
    }
}
