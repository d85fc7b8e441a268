//! Command-line options shared by `bench` and `client` ([`BenchOpts`]),
//! and the plan of test runs they expand to ([`BenchOpts::plan`], in
//! `plan.rs`). Domain types live in [`crate::spec`], value parsers in
//! [`crate::parse`].

mod plan;

use std::path::PathBuf;
use std::time::Duration;

use crate::parse::{
    parse_busy_poll, parse_conns, parse_duration, parse_iters, parse_pin, parse_repeat,
    parse_secret, parse_size, parse_window,
};
use crate::spec::{
    Budget, CrcMode, PinArg, ProgressMode, SuiteKind, Test, Transport, DEFAULT_DURATION,
};
use crate::transports;

/// Seconds per timed case of the apps suite.
const APPS_DURATION: f64 = 5.0;

fn transports_help() -> String {
    format!(
        "Transports to compare [default: those marked for the quick suite; all \
         for full (those that need the preload library when it is built)]. {}",
        transports::help()
    )
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
    /// suite; all for full (those that need the preload library when it is
    /// built)].
    #[arg(long, value_delimiter = ',', value_parser = transports::parse, value_name = "NAME,...",
          long_help = transports_help())]
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
    /// Apps suite: the workloads to run [default: all]: http-close, redis,
    /// memcached-tcp, memcached-udp, striped, rtp.
    #[arg(long, value_delimiter = ',', value_parser = crate::apps::parse_workload, value_name = "NAME,...")]
    pub(crate) workloads: Vec<String>,
    /// The shared secret of a `warpsock server --token` (not needed on
    /// loopback or with --netns, whose servers this command starts).
    #[arg(long, value_name = "SECRET", value_parser = parse_secret)]
    pub(crate) token: Option<String>,
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
                (false, SuiteKind::Apps) => APPS_DURATION,
            })),
        }
    }

    /// These options as command-line arguments (for a child `warpsock
    /// client`), without --json/--csv; `transports` replaces the list.
    pub(crate) fn to_args(&self, transports: &[Transport]) -> Vec<String> {
        let join = |v: Vec<String>| v.join(",");
        let mut a = vec!["--suite".to_string(), self.suite.name().to_string()];
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
                // The apps suite runs programs, not these tests.
                SuiteKind::Apps => Vec::new(),
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
                SuiteKind::Quick => transports::all().filter(|t| t.quick).collect(),
                SuiteKind::Apps => Vec::new(),
                SuiteKind::Full => transports::all()
                    .filter(|t| offload || t.preload.is_none())
                    .collect(),
            }
        } else {
            self.transports.clone()
        };
        t.sort_by_key(|&t| transports::rank(t));
        t.dedup();
        t
    }
}
