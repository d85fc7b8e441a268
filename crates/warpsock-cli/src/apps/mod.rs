//! `warpsock bench --suite apps`: unmodified Debian programs, each over
//! every transport that carries it (see [`env`]), the program's own metric
//! next to host TCP or UDP; the modern analogs of the Head-to-TOE study's
//! application workloads:
//!
//! | workload | programs | metric |
//! |---|---|---|
//! | `http-close` (connection per transaction, 6 KiB replies) | nginx + wrk, `Connection: close` | requests/s, p50/p99 |
//! | `redis` (request/response cache) | redis-server + redis-benchmark: GET/SET, 16 B–64 KiB, pipelined (16) and not, and `-k 0` (a connection per request) | requests/s, p99 |
//! | `memcached-tcp`, `memcached-udp` | memcached + this binary's bounded client (`memcached-load`, hidden): GETs of values it set and checks | requests/s, p99 |
//! | `striped` (parallel transfer) | nginx + aria2c, 8 segments of one file; iperf3 `-P 8` | MB/s, CPU s per GB |
//! | `rtp` (streaming media) | GStreamer `videotestsrc` → raw 1080p RTP over UDP → `udpsrc` | frames lost, frame-arrival jitter, CPU |
//!
//! Every case checks what the program allows: every request answered
//! (the server's own counters where it has them), the bytes compared
//! (aria2c's file, the memcached values), no error in the program's
//! output. A transport that is not built yet is a row that says "not
//! available" and why; nothing stands in for it. A case that fails over a
//! baseline (host TCP/UDP) fails the command; over another transport it
//! is a result, its row saying what went wrong (e.g. librspreload has no
//! epoll, so nginx, redis and memcached cannot start over rsockets).
//!
//! Servers and clients run on 127.0.0.1 in child processes, or with
//! `--netns` in two network namespaces (server, client) joined by veth,
//! with `--rate`/`--loss`. Each program is bounded in time and killed by
//! its pid.

mod env;
mod http;
mod memcached;
mod redis;
mod rtp;
mod striped;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde::{Deserialize, Serialize};

pub(crate) use env::ProbeCmd;
pub(crate) use memcached::LoadCmd;

use crate::child::{self, Proc};
use crate::stats::Cpu;
use crate::Error;
use env::{AppTransport, Launch, Proto, Setup};

/// One case of a workload over one transport, as the JSON file keeps it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct AppRecord {
    /// `http-close`, `redis`, …
    pub(crate) workload: String,
    /// What the workload is, in a line.
    #[serde(default)]
    pub(crate) title: String,
    /// What ran, e.g. `GET 16 B, pipeline 16`.
    pub(crate) case: String,
    /// The transport's name (`tcp`, `udp-offload`, …).
    pub(crate) transport: String,
    /// The figure of merit's name and unit, e.g. `requests/s`.
    pub(crate) metric: String,
    pub(crate) higher_is_better: bool,
    /// The figure of merit (none when not available or failed).
    pub(crate) value: Option<f64>,
    pub(crate) p50_ms: Option<f64>,
    pub(crate) p99_ms: Option<f64>,
    /// Jitter, ms (streaming).
    pub(crate) jitter_ms: Option<f64>,
    /// Frames or messages lost (streaming).
    pub(crate) lost: Option<u64>,
    /// CPU time (user + system) of the server and client programs.
    pub(crate) cpu_s: Option<f64>,
    pub(crate) cpu_s_per_gb: Option<f64>,
    /// Requests the client made (and the server answered).
    pub(crate) requests: Option<u64>,
    /// Bytes whose contents were compared and matched.
    pub(crate) bytes_verified: Option<u64>,
    /// The transport exists and the case ran.
    pub(crate) available: bool,
    /// The case ran and every check passed.
    pub(crate) ok: bool,
    /// Why not available, what failed, or what a reader must know.
    #[serde(default)]
    pub(crate) note: String,
}

impl AppRecord {
    /// A row for a transport that is not available, saying why.
    fn unavailable(w: &dyn Workload, t: &AppTransport, why: &str) -> Self {
        Self {
            workload: w.name().into(),
            title: w.title().into(),
            case: "-".into(),
            transport: t.name.into(),
            metric: w.metric().into(),
            higher_is_better: w.higher_is_better(),
            note: format!("not available: {why}"),
            ..Self::default()
        }
    }
}

/// Where one side's programs run.
#[derive(Debug, Clone)]
pub(crate) struct Host {
    /// `ip netns exec NS`, or nothing.
    pub(crate) prefix: Vec<String>,
    /// The address the server listens on / the client reaches.
    pub(crate) ip: String,
}

/// What every workload gets.
pub(crate) struct Cx {
    pub(crate) server: Host,
    pub(crate) client: Host,
    /// The CI variant: short runs, fewer cases.
    pub(crate) quick: bool,
    /// Seconds per timed case.
    pub(crate) secs: f64,
    /// The emulated link the run crosses (none on loopback): fixed-count
    /// workloads shrink and each program's time bound grows with it.
    pub(crate) link: Link,
    /// A directory of this run's own (config files, documents, logs).
    pub(crate) dir: PathBuf,
}

impl Cx {
    /// `[host prefix] [launch prefix] argv...` with the launch's
    /// environment, stdin closed.
    fn command(&self, host: &Host, launch: &Launch, argv: &[String]) -> Command {
        let mut prefix = host.prefix.clone();
        prefix.extend(launch.prefix.iter().cloned());
        let (prog, args) = argv.split_first().expect("a program");
        let mut c = child::command(&prefix, prog);
        c.args(args).envs(launch.env.iter().map(|(k, v)| (k, v)));
        c
    }

    /// Starts a server program, its output into a log file of its own, and
    /// waits until it listens on TCP `port` (or has bound UDP `port`).
    fn server(
        &self,
        launch: &Launch,
        argv: &[String],
        port: u16,
        tcp: bool,
    ) -> Result<Server, Error> {
        let name = argv[0].clone();
        let log = self
            .dir
            .join(format!("{}-{port}.log", name.replace('/', "_")));
        let f = std::fs::File::create(&log)
            .map_err(|e| Error::msg(format!("cannot create {}: {e}", log.display())))?;
        let mut c = self.command(&self.server, launch, argv);
        c.stdout(Stdio::from(f.try_clone()?)).stderr(Stdio::from(f));
        let mut proc = Proc::spawn(c, &name)?;
        proc.await_port(port, tcp, Duration::from_secs(10))
            .map_err(|e| Error::msg(format!("{e}; its log: {}", tail(&log))))?;
        Ok(Server { proc, log, name })
    }

    /// Runs a client program to completion (bounded by the case's time
    /// plus a margin: 25 s in the quick variant, whose cases take about a
    /// second, so that a program a transport cannot carry fails fast);
    /// fails if it fails.
    fn client(&self, launch: &Launch, argv: &[String]) -> Result<String, Error> {
        let limit = if self.quick {
            Duration::from_secs(25)
        } else {
            self.link.bound(self.secs)
        };
        child::run_ok(self.command(&self.client, launch, argv), &argv[0], limit)
    }
}

/// The link between the two ends, as `warpsock bench --netns` emulates
/// it. The fixed-count workloads (redis-benchmark's requests, memcached's
/// requests, aria2c's file) are sized for loopback; over a slower or lossy
/// link the same count outlasts any fixed bound (the session-7 run: host
/// TCP's redis-benchmark at 1 Gbit/s and 0.5 % loss passed 80 s), so the
/// count shrinks with the rate and the bound grows with the loss.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Link {
    /// Bits per second, if limited.
    pub(crate) rate: Option<u64>,
    /// Percent of packets dropped each way, if any.
    pub(crate) loss: Option<f64>,
}

impl Link {
    /// The rate at which the loopback-sized counts take about the
    /// loopback time: the host moves ~10 Gbit/s through a TCP
    /// connection on loopback (`BENCHMARKS.md`).
    const LOOPBACK_BITS: f64 = 10e9;

    /// How many times slower than loopback the rate makes a transfer,
    /// between 1 and 16.
    fn slowdown(self) -> f64 {
        self.rate.map_or(1.0, |r| {
            (Self::LOOPBACK_BITS / r.max(1) as f64).clamp(1.0, 16.0)
        })
    }

    /// `n` scaled to the link: never below `floor` (the quick variant's
    /// count, which every case still measures meaningfully) nor above `n`.
    pub(crate) fn count(self, n: u64, floor: u64) -> u64 {
        ((n as f64 / self.slowdown()) as u64).clamp(floor.min(n), n)
    }

    /// How long a client program may run: four times the timed case plus
    /// a minute, times one plus the loss in percent (a lost segment costs
    /// TCP a retransmission timeout of 200 ms or more).
    pub(crate) fn bound(self, secs: f64) -> Duration {
        let loss = self.loss.unwrap_or(0.0).max(0.0);
        Duration::from_secs_f64((secs * 4.0 + 60.0) * (1.0 + loss))
    }
}

/// A running server program.
struct Server {
    proc: Proc,
    log: PathBuf,
    name: String,
}

impl Server {
    /// Stops it (by pid) and returns its log; fails if it had died before.
    fn stop(mut self) -> Result<String, Error> {
        let died = self.proc.wait_within(Duration::ZERO);
        // SAFETY: kill(2) on the pid of our own child, not yet reaped.
        unsafe { libc::kill(self.proc.child.id() as libc::pid_t, libc::SIGTERM) };
        if self.proc.wait_within(Duration::from_secs(5)).is_none() {
            let _ = self.proc.child.kill();
            let _ = self.proc.child.wait();
        }
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        match died {
            // A one-off server (iperf3 -1) ends by itself.
            Some(st) if st.success() => Ok(log),
            Some(st) => Err(Error::msg(format!(
                "{} exited during the run ({st}): {}",
                self.name,
                tail(&self.log)
            ))),
            None => Ok(log),
        }
    }
}

/// The last lines of a log, for an error message.
fn tail(p: &Path) -> String {
    let t = std::fs::read_to_string(p).unwrap_or_default();
    let lines: Vec<&str> = t.lines().rev().take(3).collect();
    let s: Vec<&str> = lines.into_iter().rev().collect();
    crate::ctl::shorten(&s.join(" | "))
}

/// What one case measured (the runner adds the rest of the record).
#[derive(Debug, Clone, Default)]
pub(crate) struct Measured {
    pub(crate) case: String,
    pub(crate) value: f64,
    pub(crate) p50_ms: Option<f64>,
    pub(crate) p99_ms: Option<f64>,
    pub(crate) jitter_ms: Option<f64>,
    pub(crate) lost: Option<u64>,
    pub(crate) requests: Option<u64>,
    pub(crate) bytes: Option<u64>,
    pub(crate) bytes_verified: Option<u64>,
    /// Checks that failed (empty: all passed).
    pub(crate) problems: Vec<String>,
}

/// A workload: programs, cases, and how to read them.
pub(crate) trait Workload: Sync {
    fn name(&self) -> &'static str;
    /// One line for tables and figures.
    fn title(&self) -> &'static str;
    /// Which transports carry it.
    fn proto(&self) -> Proto;
    /// Programs it needs: (binary, Debian package).
    fn needs(&self) -> &'static [(&'static str, &'static str)];
    fn metric(&self) -> &'static str;
    fn higher_is_better(&self) -> bool {
        true
    }
    /// Runs its cases over one transport; `setup` tells how to launch.
    /// A case that fails is returned with its problems, not as an error.
    fn run(&self, cx: &Cx, setup: &Setup) -> Result<Vec<Measured>, Error>;
}

/// Every workload, in report order.
pub(crate) static WORKLOADS: &[&dyn Workload] = &[
    &http::HttpClose,
    &redis::Redis,
    &memcached::Memcached(Proto::Tcp),
    &memcached::Memcached(Proto::Udp),
    &striped::Striped,
    &rtp::Rtp,
];

/// The workload called `name`.
pub(crate) fn parse_workload(s: &str) -> Result<String, String> {
    WORKLOADS
        .iter()
        .find(|w| w.name() == s.trim())
        .map(|w| w.name().to_string())
        .ok_or_else(|| {
            let names: Vec<&str> = WORKLOADS.iter().map(|w| w.name()).collect();
            format!("'{s}': unknown workload (one of {})", names.join(", "))
        })
}

/// Runs `workloads` (all when empty) over every transport of the suite;
/// stops early when `stop()` says so.
pub(crate) fn run_all(cx: &Cx, workloads: &[String], stop: fn() -> bool) -> Vec<AppRecord> {
    let mut out = Vec::new();
    let setups: Vec<(&AppTransport, Result<Setup, String>)> =
        env::ALL.iter().map(|t| (t, t.detect())).collect();
    for w in WORKLOADS
        .iter()
        .filter(|w| workloads.is_empty() || workloads.iter().any(|n| n == w.name()))
    {
        let missing: Vec<String> = w
            .needs()
            .iter()
            .filter(|(b, _)| !child::installed(b))
            .map(|(b, p)| format!("{b} (Debian package {p})"))
            .collect();
        for (t, setup) in setups.iter().filter(|(t, _)| t.proto == w.proto()) {
            let setup = match (setup, missing.is_empty()) {
                (Err(why), _) => {
                    out.push(AppRecord::unavailable(*w, t, why));
                    continue;
                }
                (Ok(_), false) => {
                    // A missing program is a failed run, not a missing
                    // transport.
                    out.push(AppRecord {
                        available: true,
                        note: format!("failed: {} not installed", missing.join(", ")),
                        ..AppRecord::unavailable(*w, t, "")
                    });
                    continue;
                }
                (Ok(s), true) => s,
            };
            if stop() {
                return out;
            }
            eprintln!("[apps] {} over {}", w.name(), t.name);
            let cpu0 = Cpu::children();
            let res = w.run(cx, setup);
            let cpu = Cpu::children().since(cpu0);
            match res {
                Ok(cases) => {
                    let n = cases.len().max(1) as f64;
                    for m in cases {
                        out.push(record(*w, t, m, cpu.total_s() / n));
                    }
                }
                Err(e) => out.push(AppRecord {
                    available: true,
                    ok: false,
                    note: format!("failed: {e}"),
                    ..AppRecord::unavailable(*w, t, "")
                }),
            }
        }
    }
    out
}

/// The record of one measured case.
fn record(w: &dyn Workload, t: &AppTransport, m: Measured, cpu_s: f64) -> AppRecord {
    let ok = m.problems.is_empty() && m.value > 0.0;
    let note = if ok {
        String::new()
    } else if m.problems.is_empty() {
        "failed: nothing was measured".into()
    } else {
        format!("failed: {}", m.problems.join("; "))
    };
    AppRecord {
        workload: w.name().into(),
        title: w.title().into(),
        case: m.case,
        transport: t.name.into(),
        metric: w.metric().into(),
        higher_is_better: w.higher_is_better(),
        value: Some(m.value),
        p50_ms: m.p50_ms,
        p99_ms: m.p99_ms,
        jitter_ms: m.jitter_ms,
        lost: m.lost,
        cpu_s: Some(cpu_s),
        cpu_s_per_gb: m.bytes.filter(|&b| b > 0).map(|b| cpu_s / (b as f64 / 1e9)),
        requests: m.requests,
        bytes_verified: m.bytes_verified,
        available: true,
        ok,
        note,
    }
}

/// `s` as owned strings.
pub(crate) fn argv(s: &[&str]) -> Vec<String> {
    child::strings(s)
}

/// The first number after `key` in `text`.
pub(crate) fn number_after(text: &str, key: &str) -> Option<f64> {
    let rest = &text[text.find(key)? + key.len()..];
    let start = rest.find(|c: char| c.is_ascii_digit())?;
    let num: String = rest[start..]
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.')
        .collect();
    num.parse().ok()
}

/// Lines of a program's output that report an error.
pub(crate) fn error_lines(text: &str) -> Vec<String> {
    text.lines()
        .filter(|l| {
            let l = l.to_ascii_lowercase();
            l.contains("error") || l.contains("failed") || l.contains("refused")
        })
        .take(3)
        .map(crate::ctl::shorten)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_and_errors_are_read_from_output() {
        assert_eq!(
            number_after("Requests/sec:  12345.67\n", "Requests/sec:"),
            Some(12345.67)
        );
        assert_eq!(number_after("nothing", "Requests/sec:"), None);
        assert_eq!(error_lines("ok\nSocket errors: connect 3\nfine").len(), 1);
        assert!(parse_workload("redis").is_ok());
        assert!(parse_workload("ftp").unwrap_err().contains("http-close"));
    }

    #[test]
    fn fixed_counts_shrink_and_bounds_grow_with_the_emulated_link() {
        let lo = Link::default();
        assert_eq!(lo.count(400_000, 2_000), 400_000);
        assert_eq!(lo.bound(5.0), Duration::from_secs(80));
        // 1 Gbit/s: a tenth of loopback's count; 0.5 % loss: 1.5× the bound.
        let gbit = Link {
            rate: Some(1_000_000_000),
            loss: Some(0.5),
        };
        assert_eq!(gbit.count(400_000, 2_000), 40_000);
        assert_eq!(gbit.bound(5.0), Duration::from_secs(120));
        // A very slow link stops at the floor and never goes above `n`.
        let slow = Link {
            rate: Some(1_000),
            loss: None,
        };
        assert_eq!(slow.count(20_000, 2_000), 2_000);
        assert_eq!(slow.count(1_000, 2_000), 1_000);
        // Faster than loopback does not grow the count.
        let fast = Link {
            rate: Some(100_000_000_000),
            loss: Some(0.0),
        };
        assert_eq!(fast.count(50_000, 2_000), 50_000);
    }
}
