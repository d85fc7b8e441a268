//! Results: one [`Record`] per test run (what goes into the JSON file and
//! what `warpsock report` reads back), the terminal tables, the CSV of
//! every sample and the Markdown summary.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::ctl::{SideReport, Tally};
use crate::meter::INTERVAL;
use crate::opts::{fmt_size, Spec, Test, Transport};
use crate::work::{Cpu, Stats};

/// One finished test: what the client measured and what the server
/// reported.
#[derive(Debug, Clone)]
pub(crate) struct RunResult {
    pub(crate) spec: Spec,
    pub(crate) client: Stats,
    pub(crate) client_cpu: Cpu,
    pub(crate) server: SideReport,
}

/// Nearest-rank percentile `q` (0..=1) of sorted values.
pub(crate) fn percentile(sorted: &[u64], q: f64) -> Option<u64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = (q * sorted.len() as f64).ceil().max(1.0) as usize;
    Some(sorted[rank.min(sorted.len()) - 1])
}

/// Percentiles of a set of times, in microseconds.
///
/// The suite's own rows have every field (computed from every sample). An
/// external peer's row has what that tool printed and nothing else: a
/// field the tool does not report is `None` (`null` in the JSON), never
/// filled in (fi_pingpong reports only the mean; ucx_perftest one
/// percentile and the mean).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct Pcts {
    #[serde(default)]
    pub(crate) p50: Option<f64>,
    #[serde(default)]
    pub(crate) p99: Option<f64>,
    #[serde(default)]
    pub(crate) p999: Option<f64>,
    pub(crate) mean: f64,
    #[serde(default)]
    pub(crate) min: Option<f64>,
    #[serde(default)]
    pub(crate) max: Option<f64>,
}

impl Pcts {
    /// Of `ns` values, each divided by `div` (2 for one-way time).
    fn of(ns: &[u64], div: f64) -> Option<Self> {
        let mut v = ns.to_vec();
        v.sort_unstable();
        let us = |x: u64| x as f64 / 1000.0 / div;
        Some(Self {
            p50: Some(us(percentile(&v, 0.5)?)),
            p99: Some(us(percentile(&v, 0.99)?)),
            p999: Some(us(percentile(&v, 0.999)?)),
            mean: v.iter().sum::<u64>() as f64 / v.len() as f64 / 1000.0 / div,
            min: Some(us(v[0])),
            max: Some(us(v[v.len() - 1])),
        })
    }

    /// The typical value: the median, or the mean when the source gave
    /// no median; `true` when it is the median.
    pub(crate) fn typical(&self) -> (f64, bool) {
        self.p50.map_or((self.mean, false), |p| (p, true))
    }
}

/// CPU time of both processes over one test, in seconds.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct CpuRec {
    pub(crate) client_user_s: f64,
    pub(crate) client_sys_s: f64,
    pub(crate) server_user_s: f64,
    pub(crate) server_sys_s: f64,
}

impl CpuRec {
    /// Both sides, user + system.
    pub(crate) fn total_s(&self) -> f64 {
        self.client_user_s + self.client_sys_s + self.server_user_s + self.server_sys_s
    }
}

/// What one side received.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct TallyRec {
    pub(crate) msgs: u64,
    pub(crate) bytes: u64,
    pub(crate) verified: u64,
}

impl From<Tally> for TallyRec {
    fn from(t: Tally) -> Self {
        Self {
            msgs: t.msgs,
            bytes: t.bytes,
            verified: t.verified,
        }
    }
}

/// Every sample of a run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct Samples {
    /// Round-trip times (latency tests) or setup times (connection setup),
    /// in ns: every one, or every `rtt_stride`-th with --max-samples.
    pub(crate) rtt_ns: Vec<u64>,
    /// 1, or the spacing of the kept samples.
    #[serde(default = "one")]
    pub(crate) rtt_stride: u64,
    /// Length of one bandwidth sample.
    pub(crate) interval_s: f64,
    /// Bytes that arrived (both sides) in each interval.
    pub(crate) bytes: Vec<u64>,
}

/// A point of a sweep: test, size, connections, busy polling.
pub(crate) type Point = (String, u64, u64, bool);

fn one() -> u64 {
    1
}

/// Keeps at most `max` evenly spaced round-trip samples per record.
pub(crate) fn thin(records: &mut [Record], max: u64) {
    for r in records {
        let n = r.samples.rtt_ns.len() as u64;
        if n > max {
            let stride = n.div_ceil(max);
            r.samples.rtt_ns = r
                .samples
                .rtt_ns
                .iter()
                .step_by(stride as usize)
                .copied()
                .collect();
            r.samples.rtt_stride = stride;
        }
    }
}

/// One test run, as stored in the JSON file.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct Record {
    pub(crate) test: String,
    pub(crate) transport: String,
    pub(crate) crc: bool,
    pub(crate) size: u64,
    pub(crate) window: u64,
    pub(crate) conns: u64,
    pub(crate) progress: String,
    /// Spin time before sleeping, µs (0: event-driven). External peers
    /// that poll without ever sleeping (ucx_perftest, fi_pingpong) store
    /// [`SPINS`] in their latency rows, so they meet the suite's
    /// busy-polling latency rows at the same point.
    pub(crate) busy_poll_us: u64,
    pub(crate) client_cpu: Option<u64>,
    pub(crate) server_cpu: Option<u64>,
    /// Pacing of the active side, bytes/s (0: none).
    pub(crate) rate_bytes_per_s: u64,
    /// Data messages (pings, Reads, setups) both sides originated.
    pub(crate) messages: u64,
    /// Measured round trips (warm-up excluded).
    pub(crate) round_trips: u64,
    pub(crate) one_way_us: Option<Pcts>,
    /// Connection setup: time of one setup.
    pub(crate) setup_us: Option<Pcts>,
    pub(crate) conns_per_s: Option<f64>,
    /// Bandwidth tests: GB/s (10^9 B/s) that arrived.
    pub(crate) gbps: Option<f64>,
    /// Payload bytes that arrived (both sides).
    pub(crate) data_bytes: u64,
    pub(crate) elapsed_s: f64,
    /// Bytes counted by the receivers.
    pub(crate) bytes: u64,
    /// Bytes whose contents checked out.
    pub(crate) verified: u64,
    /// Datagrams lost (UDP), pings unanswered (UDP ping-pong).
    pub(crate) lost: u64,
    pub(crate) loss_pct: Option<f64>,
    pub(crate) ok: bool,
    pub(crate) cpu: CpuRec,
    pub(crate) cpu_s_per_gb: Option<f64>,
    pub(crate) cpu_us_per_msg: Option<f64>,
    pub(crate) client: TallyRec,
    pub(crate) server: TallyRec,
    pub(crate) samples: Samples,
    /// Runs of this test (`--repeat`); this record is the median one.
    #[serde(default = "one")]
    pub(crate) repeats: u64,
    /// Lowest and highest figure of merit over the repeats.
    #[serde(default)]
    pub(crate) merit_min: Option<f64>,
    #[serde(default)]
    pub(crate) merit_max: Option<f64>,
    /// What a reader must know to compare this row (external peers: what
    /// the tool reported and how it ran).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) notes: Vec<String>,
}

/// `busy_poll_us` of a row whose sides poll without ever sleeping.
pub(crate) const SPINS: u64 = u64::MAX;

/// The external peers' transports and their names in tables, legends
/// and the summary (iperf3, sockperf, ucx_perftest, fi_pingpong rows).
const PEERS: [(&str, &str); 7] = [
    ("iperf3", "iperf3 TCP"),
    ("iperf3-udp", "iperf3 UDP"),
    ("sockperf-tcp", "sockperf TCP"),
    ("sockperf-udp", "sockperf UDP"),
    ("ucx-put", "UCX put (tcp)"),
    ("ucx-tag", "UCX tag (tcp)"),
    ("libfabric-tcp", "libfabric tcp msg"),
];

/// The name of an external peer's transport, if `transport` is one.
pub(crate) fn peer_label(transport: &str) -> Option<&'static str> {
    PEERS.iter().find(|p| p.0 == transport).map(|p| p.1)
}

/// Whether a series name ([`Record::series`]) is an external peer's.
pub(crate) fn is_peer_series(name: &str) -> bool {
    PEERS.iter().any(|p| name.starts_with(p.1))
}

impl RunResult {
    /// The record of this run.
    pub(crate) fn record(&self) -> Record {
        let s = &self.spec;
        let (c, sv) = (&self.client, &self.server);
        let bytes = c.rx.bytes + sv.rx.bytes;
        let verified = c.rx.verified + sv.rx.verified;
        let rx_msgs = c.rx.msgs + sv.rx.msgs;
        let messages = c.sent + sv.sent;
        let (crole, srole) = s.roles();
        let t = s.transport;
        let ns = |d: std::time::Duration| d.as_nanos() as u64;
        let active_ns = {
            let a = if crole.active(t) { ns(c.elapsed()) } else { 0 };
            let b = if srole.active(t) { sv.elapsed_ns } else { 0 };
            a.max(b)
        };
        let elapsed_ns = if t.is_udp() && s.test.is_bandwidth() {
            // Datagrams: what arrived over the arrival span, but never
            // over less than the time the senders sent. When nearly all
            // is lost the few that arrive may do so within microseconds,
            // and bytes / that span is no rate the link carried.
            ns(c.rx_elapsed()).max(sv.rx_ns).max(active_ns)
        } else {
            active_ns
        };
        let elapsed_s = elapsed_ns as f64 / 1e9;
        let echoes = s.test.is_latency() || s.test == Test::Conn;
        let expect = if echoes && t != Transport::Read {
            2 * messages
        } else {
            messages
        };
        let lost = if t.is_udp() {
            if echoes {
                c.lost
            } else {
                messages.saturating_sub(rx_msgs)
            }
        } else {
            0
        };
        let counts_ok = if t.is_udp() {
            rx_msgs <= expect
        } else {
            rx_msgs == expect
        };
        let mut intervals = c.intervals.clone();
        if intervals.len() < sv.intervals.len() {
            intervals.resize(sv.intervals.len(), 0);
        }
        for (a, b) in intervals.iter_mut().zip(&sv.intervals) {
            *a += b;
        }
        let cpu = CpuRec {
            client_user_s: self.client_cpu.user_us as f64 / 1e6,
            client_sys_s: self.client_cpu.sys_us as f64 / 1e6,
            server_user_s: sv.cpu.user_us as f64 / 1e6,
            server_sys_s: sv.cpu.sys_us as f64 / 1e6,
        };
        let gbps =
            (s.test.is_bandwidth() && elapsed_s > 0.0).then(|| bytes as f64 / elapsed_s / 1e9);
        let cpu_s_per_gb =
            (s.test.is_bandwidth() && bytes > 0).then(|| cpu.total_s() / (bytes as f64 / 1e9));
        let cpu_us_per_msg = (messages > 0).then(|| cpu.total_s() * 1e6 / messages as f64);
        Record {
            test: s.test.name().into(),
            transport: t.name().into(),
            crc: t.is_iwarp() && s.crc,
            size: s.size as u64,
            window: s.window as u64,
            conns: s.conns as u64,
            progress: s.progress.name().into(),
            busy_poll_us: s.busy_poll_us,
            client_cpu: s.client_pin.map(|v| v as u64),
            server_cpu: s.pin.map(|v| v as u64),
            rate_bytes_per_s: s.rate,
            messages,
            round_trips: if s.test.is_latency() {
                c.rtts_ns.len() as u64
            } else {
                0
            },
            one_way_us: if s.test.is_latency() {
                Pcts::of(&c.rtts_ns, 2.0)
            } else {
                None
            },
            setup_us: if s.test == Test::Conn {
                Pcts::of(&c.rtts_ns, 1.0)
            } else {
                None
            },
            conns_per_s: (s.test == Test::Conn && elapsed_s > 0.0)
                .then(|| c.rtts_ns.len() as f64 / elapsed_s),
            gbps,
            data_bytes: bytes,
            elapsed_s,
            bytes,
            verified,
            lost,
            loss_pct: (t.is_udp() && messages > 0).then(|| lost as f64 * 100.0 / messages as f64),
            ok: bytes > 0 && bytes == verified && counts_ok,
            cpu,
            cpu_s_per_gb,
            cpu_us_per_msg,
            client: c.rx.into(),
            server: sv.rx.into(),
            repeats: 1,
            merit_min: None,
            merit_max: None,
            notes: Vec::new(),
            samples: Samples {
                rtt_ns: c.rtts_ns.clone(),
                rtt_stride: 1,
                interval_s: INTERVAL.as_secs_f64(),
                bytes: intervals,
            },
        }
    }
}

impl Record {
    /// The test kind.
    pub(crate) fn test_kind(&self) -> Option<Test> {
        Test::parse(&self.test)
    }

    /// The transport.
    pub(crate) fn transport_kind(&self) -> Option<Transport> {
        Transport::parse(&self.transport)
    }

    /// Series name: transport plus CRC for warpsock rows; a peer's
    /// latency row that has only a mean says so (` (mean)`).
    pub(crate) fn series(&self) -> String {
        let t = label(self);
        match self.transport_kind() {
            Some(k) if k.is_iwarp() => {
                format!("{t}, CRC {}", if self.crc { "on" } else { "off" })
            }
            _ if self.merit_is_mean() => format!("{t} (mean)"),
            _ => t.to_string(),
        }
    }

    fn crc_label(&self) -> &'static str {
        match self.transport_kind() {
            Some(t) if t.is_iwarp() => {
                if self.crc {
                    "on"
                } else {
                    "off"
                }
            }
            _ => "-",
        }
    }

    fn check_label(&self) -> String {
        if self.ok {
            "ok".into()
        } else {
            format!("FAIL {}/{} B", self.verified, self.bytes)
        }
    }

    /// The main figure of merit and whether higher is better. Latency:
    /// the p50 one-way time, or the mean for a peer that reports no
    /// median (see [`Record::merit_is_mean`]).
    pub(crate) fn merit(&self) -> Option<(f64, bool)> {
        match self.test_kind()? {
            Test::Lat => self.one_way_us.as_ref().map(|p| (p.typical().0, false)),
            Test::Hotspot => self.client_mean_us().map(|v| (v, false)),
            Test::Conn => self
                .setup_us
                .as_ref()
                .and_then(|p| p.p50)
                .map(|v| (v, false)),
            Test::Cpu => self.cpu_s_per_gb.map(|v| (v, false)),
            _ => self.gbps.map(|g| (g, true)),
        }
    }

    /// Whether [`Record::merit`] is a mean standing in for a missing p50.
    pub(crate) fn merit_is_mean(&self) -> bool {
        self.test == "lat" && self.one_way_us.as_ref().is_some_and(|p| p.p50.is_none())
    }

    /// Hot-spot: the one-way latency a client sees on average, N × time /
    /// round trips / 2 (Little's law over the clients' time). The median
    /// and the mean of the samples both lean towards the clients the
    /// scheduler favours, which complete more round trips.
    pub(crate) fn client_mean_us(&self) -> Option<f64> {
        (self.messages > 0 && self.elapsed_s > 0.0)
            .then(|| self.conns as f64 * self.elapsed_s / self.messages as f64 / 2.0 * 1e6)
    }

    /// The point of a sweep this run belongs to (same test, size,
    /// connections and mode).
    pub(crate) fn point(&self) -> Point {
        (
            self.test.clone(),
            self.size,
            self.conns,
            self.busy_poll_us > 0,
        )
    }

    /// The host-TCP run of the same point.
    pub(crate) fn baseline<'a>(&self, all: &'a [Self]) -> Option<&'a Self> {
        self.peer_of(all, "tcp")
    }

    /// The run of `transport` at the same point.
    pub(crate) fn peer_of<'a>(&self, all: &'a [Self], transport: &str) -> Option<&'a Self> {
        all.iter()
            .find(|r| r.transport == transport && r.point() == self.point())
    }

    fn x_of(&self, base: Option<&Self>) -> String {
        match (self.merit(), base.and_then(Self::merit)) {
            (Some((v, _)), Some((b, _))) if b > 0.0 => format!("{:.2}", v / b),
            _ => "-".into(),
        }
    }
}

/// The results of a run as JSON: `meta` plus every record.
pub(crate) fn to_json(meta: Value, records: &[Record]) -> Value {
    serde_json::json!({ "meta": meta, "results": records })
}

/// Reads a results file: (meta, records).
pub(crate) fn from_json(text: &str) -> Result<(Value, Vec<Record>), String> {
    let mut v: Value = serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
    let meta = v.get("meta").cloned().unwrap_or(Value::Null);
    let results = v
        .get_mut("results")
        .map(Value::take)
        .ok_or("no \"results\" array")?;
    let recs: Vec<Record> =
        serde_json::from_value(results).map_err(|e| format!("bad \"results\": {e}"))?;
    Ok((meta, recs))
}

/// Every sample as CSV: one row per round trip, setup or interval.
pub(crate) fn to_csv(records: &[Record]) -> String {
    let mut s = String::from(
        "test,transport,crc,size,conns,busy_poll_us,rate_bytes_per_s,kind,index,value\n",
    );
    for r in records {
        let head = format!(
            "{},{},{},{},{},{},{}",
            r.test,
            r.transport,
            u8::from(r.crc),
            r.size,
            r.conns,
            r.busy_poll_us,
            r.rate_bytes_per_s
        );
        let kind = if r.test == "conn" {
            "setup_ns"
        } else {
            "rtt_ns"
        };
        let stride = r.samples.rtt_stride.max(1) as usize;
        for (i, v) in r.samples.rtt_ns.iter().enumerate() {
            let _ = writeln!(s, "{head},{kind},{},{v}", i * stride);
        }
        for (i, v) in r.samples.bytes.iter().enumerate() {
            let _ = writeln!(s, "{head},interval_bytes,{i},{v}");
        }
    }
    s
}

fn opt(v: Option<f64>, prec: usize) -> String {
    v.map_or_else(|| "-".into(), |v| format!("{v:.prec$}"))
}

/// Renders one table per test that ran.
pub(crate) fn tables(records: &[Record]) -> String {
    let mut s = String::new();
    for test in Test::ALL {
        let rs: Vec<&Record> = records
            .iter()
            .filter(|r| r.test_kind() == Some(test))
            .collect();
        if rs.is_empty() {
            continue;
        }
        if !s.is_empty() {
            s.push('\n');
        }
        match test {
            Test::Lat | Test::Hotspot => {
                let _ = writeln!(
                    s,
                    "{}: one-way = round trip / 2, µs (lower is better)",
                    title(test)
                );
                let (mean_head, x_head) = if test == Test::Hotspot {
                    ("client µs", "client x TCP")
                } else {
                    ("mean µs", "p50 x TCP")
                };
                let _ = writeln!(
                    s,
                    "{:>7} {:>3}  {:<20} {:>3} {:>5}  {:>8} {:>8} {:>8} {:>8}  {:>10}  {:>11} {:>5}  check",
                    "size", "N", "transport", "CRC", "mode", "p50 µs", "p99 µs", "p99.9 µs",
                    mean_head, x_head, "round trips", "lost"
                );
                for r in rs {
                    let p = r.one_way_us.clone().unwrap_or_default();
                    let _ = writeln!(
                        s,
                        "{:>7} {:>3}  {:<20} {:>3} {:>5}  {:>8} {:>8} {:>8} {:>8.2}  {:>10}  {:>11} {:>5}  {}",
                        fmt_size(r.size as usize),
                        r.conns,
                        label(r),
                        r.crc_label(),
                        if r.busy_poll_us > 0 { "busy" } else { "event" },
                        opt(p.p50, 2),
                        opt(p.p99, 2),
                        opt(p.p999, 2),
                        if test == Test::Hotspot {
                            r.client_mean_us().unwrap_or(0.0)
                        } else {
                            p.mean
                        },
                        r.x_of(r.baseline(records)),
                        r.round_trips,
                        r.lost,
                        r.check_label()
                    );
                }
            }
            Test::Conn => {
                let _ = writeln!(
                    s,
                    "{}: connect + accept + first 8-byte exchange (TCP) / connect + MPA + first Send (warpsock)",
                    title(test)
                );
                let _ = writeln!(
                    s,
                    "{:<20} {:>3}  {:>10}  {:>8} {:>8}  {:>9}  check",
                    "transport", "CRC", "setups/s", "p50 µs", "p99 µs", "p50 x TCP"
                );
                for r in rs {
                    let p = r.setup_us.clone().unwrap_or_default();
                    let _ = writeln!(
                        s,
                        "{:<20} {:>3}  {:>10.0}  {:>8} {:>8}  {:>9}  {}",
                        if r.transport == "tcp" {
                            "host TCP"
                        } else {
                            "warpsock"
                        },
                        r.crc_label(),
                        r.conns_per_s.unwrap_or(0.0),
                        opt(p.p50, 1),
                        opt(p.p99, 1),
                        r.x_of(r.baseline(records)),
                        r.check_label()
                    );
                }
            }
            _ => {
                let extra = if test == Test::Cpu {
                    format!(
                        ", every transport paced to {}",
                        rs.first()
                            .map(|r| format!("{:.2} GB/s", r.rate_bytes_per_s as f64 / 1e9))
                            .unwrap_or_default()
                    )
                } else {
                    // The suite's window (external peers have their own).
                    let w = rs
                        .iter()
                        .find(|r| r.transport_kind().is_some())
                        .unwrap_or(&rs[0]);
                    format!(", {} in flight per connection", w.window)
                };
                let _ = writeln!(
                    s,
                    "{}: GB/s = 10^9 B/s arrived{extra}; CPU = user + system of both processes",
                    title(test)
                );
                let _ = writeln!(
                    s,
                    "{:>7} {:>3}  {:<20} {:>3}  {:>7}  {:>7}  {:>6}  {:>8}  {:>8}  check",
                    "size",
                    "N",
                    "transport",
                    "CRC",
                    "GB/s",
                    "x TCP",
                    "loss %",
                    "CPU s/GB",
                    "µs/msg"
                );
                for r in rs {
                    let x = if test == Test::Cpu {
                        match (
                            r.cpu_s_per_gb,
                            r.baseline(records).and_then(|b| b.cpu_s_per_gb),
                        ) {
                            (Some(v), Some(b)) if b > 0.0 => format!("{:.2}c", v / b),
                            _ => "-".into(),
                        }
                    } else {
                        r.x_of(r.baseline(records))
                    };
                    let _ = writeln!(
                        s,
                        "{:>7} {:>3}  {:<20} {:>3}  {:>7}  {:>7}  {:>6}  {:>8}  {:>8}  {}",
                        fmt_size(r.size as usize),
                        r.conns,
                        label(r),
                        r.crc_label(),
                        opt(r.gbps, 2),
                        x,
                        opt(r.loss_pct, 1),
                        opt(r.cpu_s_per_gb, 2),
                        opt(r.cpu_us_per_msg, 2),
                        r.check_label()
                    );
                }
                if test == Test::Cpu {
                    let _ = writeln!(
                        s,
                        "(x TCP here: CPU per GB relative to host TCP, lower is better)"
                    );
                }
            }
        }
    }
    let noted: Vec<&Record> = records.iter().filter(|r| !r.notes.is_empty()).collect();
    if !noted.is_empty() {
        s.push_str("\nAbout these rows:\n");
        for r in noted {
            for n in &r.notes {
                let _ = writeln!(
                    s,
                    "  {} {} {}: {n}",
                    label(r),
                    r.test,
                    fmt_size(r.size as usize)
                );
            }
        }
    }
    s
}

/// The transport's name in tables and legends.
fn label(r: &Record) -> &str {
    match r.transport_kind() {
        Some(t) => t.label(),
        None => peer_label(&r.transport).unwrap_or(r.transport.as_str()),
    }
}

fn title(t: Test) -> String {
    let mut c = t.title().chars();
    c.next()
        .map(|f| f.to_uppercase().collect::<String>() + c.as_str())
        .unwrap_or_default()
}

/// The Markdown summary: per test and point, the winner and its ratio to
/// host TCP (and of the UDP offload to host UDP), then the headline rows.
pub(crate) fn summary(meta: &Value, records: &[Record]) -> String {
    let mut s = String::from("# warpsock bench: summary\n\n");
    if let Some(m) = meta.as_object() {
        for k in ["target", "cpu_model", "cpus", "command", "started_utc"] {
            if let Some(v) = m.get(k) {
                let v = v.as_str().map_or_else(|| v.to_string(), str::to_string);
                let _ = writeln!(s, "- {k}: {v}");
            }
        }
        s.push('\n');
    }
    let bad = records.iter().filter(|r| !r.ok).count();
    let _ = writeln!(
        s,
        "{} runs; every received byte counted and verified: {}.\n",
        records.len(),
        if bad == 0 {
            "yes".to_string()
        } else {
            format!("NO ({bad} runs failed)")
        }
    );
    let _ = writeln!(s, "## Winner of each test point\n");
    let _ = writeln!(
        s,
        "Latency and setup: p50 (an external peer that reports only a mean: its mean, marked); hot-spot: the mean a client sees, N × time / round trips / 2 (lower wins); bandwidth: GB/s (higher wins); normalized CPU: CPU s per GB at equal rate (lower wins). Ratio = winner / host TCP.\n"
    );
    let _ = writeln!(s, "| test | point | winner | value | host TCP | ratio |");
    let _ = writeln!(s, "|---|---|---|---|---|---|");
    let mut points: BTreeMap<(usize, Point), Vec<&Record>> = BTreeMap::new();
    for r in records {
        if let Some(t) = r.test_kind() {
            let i = Test::ALL.iter().position(|&x| x == t).unwrap_or(0);
            points.entry((i, r.point())).or_default().push(r);
        }
    }
    for ((_, (test, size, conns, busy)), rs) in &points {
        let Some(win) = best(rs) else { continue };
        let (v, _) = win.merit().expect("best has a merit");
        let base = win.baseline(records).and_then(Record::merit);
        let unit = unit_of(test);
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} {unit} | {} | {} |",
            Test::parse(test).map_or(test.as_str(), |t| t.title()),
            point_label(test, *size, *conns, *busy),
            win.series(),
            sig(v),
            base.map_or("-".into(), |(b, _)| format!("{} {unit}", sig(b))),
            base.map_or("-".into(), |(b, _)| if b > 0.0 {
                format!("{:.2}", v / b)
            } else {
                "-".into()
            }),
        );
    }
    s.push_str(&headline(records));
    s.push_str(&externals(records));
    s
}

/// Three significant digits (two decimals from 1 up).
pub(crate) fn sig(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 1.0 {
        format!("{v:.2}")
    } else if v >= 0.1 {
        format!("{v:.3}")
    } else if v >= 0.01 {
        format!("{v:.4}")
    } else {
        format!("{v:.2e}")
    }
}

/// The best run of one point.
fn best<'a>(rs: &[&'a Record]) -> Option<&'a Record> {
    rs.iter()
        .filter(|r| r.ok && r.merit().is_some())
        .copied()
        .reduce(|a, b| {
            let (va, hi) = a.merit().expect("filtered");
            let (vb, _) = b.merit().expect("filtered");
            if (hi && vb > va) || (!hi && vb < va) {
                b
            } else {
                a
            }
        })
}

fn unit_of(test: &str) -> &'static str {
    match test {
        "lat" | "hotspot" | "conn" => "µs",
        "cpu" => "s/GB",
        _ => "GB/s",
    }
}

fn point_label(test: &str, size: u64, conns: u64, busy: bool) -> String {
    let mut p = fmt_size(size as usize);
    if matches!(test, "multi" | "hotspot" | "fan-in" | "fan-out") {
        p = format!("N={conns}, {p}");
    }
    if busy {
        p.push_str(", busy-poll");
    }
    p
}

/// The warpsock transport that does what an external peer's test does:
/// RDMA Write for one-sided puts, Send for two-sided messages, the UDP
/// offload for UDP tools.
fn analog(peer: &str) -> &'static str {
    match peer {
        "ucx-put" => "write",
        "iperf3-udp" | "sockperf-udp" => "udp-offload",
        _ => "send",
    }
}

/// The external peers' rows (transports the suite does not know) next to
/// the suite's rows of the same point in the same run: the host's own
/// socket (TCP, or UDP for UDP tools), the warpsock transport that does
/// the same thing ([`analog`], its better CRC setting) and the best
/// warpsock row. A polling peer's latency row ([`SPINS`]) meets the
/// busy-polling rows; when the run has no row in the peer's mode at that
/// point (the quick suite polls either always or never) it is compared
/// with the rows of the other mode and the table says so. Each row's
/// notes follow the table.
fn externals(records: &[Record]) -> String {
    let ext: Vec<&Record> = records
        .iter()
        .filter(|r| r.transport_kind().is_none())
        .collect();
    if ext.is_empty() {
        return String::new();
    }
    let mut s = String::from("\n## External peers (same run, loopback)\n\n");
    let _ = writeln!(
        s,
        "Ratios are the suite's row ÷ the peer's: above 1 means more bandwidth (better) or a longer latency (worse) than the peer. Latency: one-way p50, or the mean where the tool reports no median (marked).\n"
    );
    let _ = writeln!(
        s,
        "| peer | point | peer's value | host socket | host ÷ peer | warpsock analog | analog ÷ peer | best warpsock | best ÷ peer |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|---|---|---|");
    let mut notes = Vec::new();
    for r in ext {
        let Some((v, _)) = r.merit() else { continue };
        let unit = unit_of(&r.test);
        let suite_at = |busy: bool| -> Vec<&Record> {
            records
                .iter()
                .filter(|x| {
                    x.transport_kind().is_some()
                        && (x.test.as_str(), x.size, x.conns) == (r.test.as_str(), r.size, r.conns)
                        && (x.busy_poll_us > 0) == busy
                })
                .collect()
        };
        let busy = r.busy_poll_us > 0;
        let mut at = suite_at(busy);
        let mut mode = "";
        if at.is_empty() && !suite_at(!busy).is_empty() {
            at = suite_at(!busy);
            mode = if busy {
                " (vs event-driven rows)"
            } else {
                " (vs busy-polling rows)"
            };
        }
        let cell = |x: Option<&Record>| match x.and_then(|x| x.merit().map(|m| (x, m.0))) {
            Some((x, m)) => (
                format!("{} {} {unit}", x.series(), sig(m)),
                if v > 0.0 {
                    format!("{:.2}", m / v)
                } else {
                    "-".into()
                },
            ),
            None => ("-".into(), "-".into()),
        };
        let host = if matches!(analog(&r.transport), "udp-offload") {
            "udp"
        } else {
            "tcp"
        };
        let (h, hx) = cell(at.iter().copied().find(|x| x.transport == host));
        let same: Vec<&Record> = at
            .iter()
            .copied()
            .filter(|x| x.transport == analog(&r.transport))
            .collect();
        let (a, ax) = cell(best(&same));
        let ws: Vec<&Record> = at
            .iter()
            .copied()
            .filter(|x| x.transport_kind().is_some_and(Transport::is_iwarp))
            .collect();
        let (b, bx) = cell(best(&ws));
        let _ = writeln!(
            s,
            "| {} | {} {}{mode} | {} {unit}{} | {h} | {hx} | {a} | {ax} | {b} | {bx} |",
            label(r),
            Test::parse(&r.test).map_or(r.test.as_str(), |t| t.title()),
            point_label(&r.test, r.size, r.conns, r.busy_poll_us > 0),
            sig(v),
            if r.merit_is_mean() { " (mean)" } else { "" },
        );
        for n in &r.notes {
            notes.push(format!(
                "- {} {} {}: {n}",
                label(r),
                r.test,
                fmt_size(r.size as usize)
            ));
        }
    }
    if !notes.is_empty() {
        let _ = writeln!(s, "\nAbout the peers' rows:\n\n{}", notes.join("\n"));
    }
    s
}

/// Selects the records of one headline point.
type Pick = Box<dyn Fn(&Record) -> bool>;

/// Headline ratios: each warpsock variant (and the UDP offload) against
/// host TCP (host UDP) at one representative point per test.
fn headline(records: &[Record]) -> String {
    let mut s = String::from("\n## Headline ratios\n\n");
    let _ = writeln!(
        s,
        "warpsock ÷ host TCP at one point per test (latency, setup and CPU: lower is better; bandwidth: higher is better). UDP offload ÷ host UDP in the last column.\n"
    );
    let picks: Vec<(&str, Pick)> = vec![
        (
            "ping-pong latency 8 B, event",
            Box::new(|r| r.test == "lat" && r.size == 8 && r.busy_poll_us == 0),
        ),
        (
            "ping-pong latency 8 B, busy-poll",
            Box::new(|r| r.test == "lat" && r.size == 8 && r.busy_poll_us > 0),
        ),
        (
            "ping-pong latency 64 KiB, event",
            Box::new(|r| r.test == "lat" && r.size == 65536 && r.busy_poll_us == 0),
        ),
        (
            "bandwidth 1 MiB",
            Box::new(|r| r.test == "bw" && r.size == 1 << 20),
        ),
        (
            "bandwidth 64 KiB",
            Box::new(|r| r.test == "bw" && r.size == 65536),
        ),
        (
            "bandwidth 256 B",
            Box::new(|r| r.test == "bw" && r.size == 256),
        ),
        (
            "bidirectional 1 MiB",
            Box::new(|r| r.test == "bibw" && r.size == 1 << 20),
        ),
        (
            "multi-stream N=8",
            Box::new(|r| r.test == "multi" && r.conns == 8),
        ),
        (
            "hot-spot N=8",
            Box::new(|r| r.test == "hotspot" && r.conns == 8),
        ),
        (
            "fan-in N=8",
            Box::new(|r| r.test == "fan-in" && r.conns == 8),
        ),
        (
            "fan-out N=8",
            Box::new(|r| r.test == "fan-out" && r.conns == 8),
        ),
        ("connection setup", Box::new(|r| r.test == "conn")),
        ("normalized CPU (s/GB)", Box::new(|r| r.test == "cpu")),
    ];
    let cols = [
        ("send", false),
        ("send", true),
        ("write", false),
        ("write", true),
        ("read", false),
        ("read", true),
    ];
    let _ = writeln!(
        s,
        "| point | Send | Send+CRC | Write | Write+CRC | Read | Read+CRC | UDP offload ÷ UDP |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|---|---|");
    for (name, f) in &picks {
        // The suite's own rows (external peers have their own table).
        let rs: Vec<&Record> = records
            .iter()
            .filter(|r| r.transport_kind().is_some() && f(r))
            .collect();
        if rs.is_empty() {
            continue;
        }
        let merit = |t: &str, crc: bool| {
            rs.iter()
                .find(|r| {
                    r.transport == t && (r.crc == crc || !matches!(t, "send" | "write" | "read"))
                })
                .and_then(|r| r.merit())
                .map(|(v, _)| v)
        };
        let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
            (Some(a), Some(b)) if b > 0.0 => format!("{:.2}", a / b),
            _ => "-".into(),
        };
        let tcp = merit("tcp", false);
        let mut row = format!("| {name} |");
        for (t, crc) in cols {
            let _ = write!(row, " {} |", ratio(merit(t, crc), tcp));
        }
        let _ = write!(
            row,
            " {} |",
            ratio(merit("udp-offload", false), merit("udp", false))
        );
        let _ = writeln!(s, "{row}");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles() {
        let v: Vec<u64> = (1..=100).collect();
        assert_eq!(percentile(&v, 0.5), Some(50));
        assert_eq!(percentile(&v, 0.99), Some(99));
        assert_eq!(percentile(&v, 1.0), Some(100));
        assert_eq!(percentile(&[7], 0.99), Some(7));
        assert_eq!(percentile(&[], 0.5), None);
        let p = Pcts::of(&[4000, 2000, 6000], 2.0).unwrap();
        assert_eq!(
            (p.p50, p.min, p.max, p.mean),
            (Some(2.0), Some(1.0), Some(3.0), 2.0)
        );
        assert_eq!(p.typical(), (2.0, true));
    }

    #[test]
    fn json_round_trip_and_csv() {
        let r = Record {
            test: "lat".into(),
            transport: "send".into(),
            size: 8,
            conns: 1,
            one_way_us: Pcts::of(&[1000, 3000], 2.0),
            samples: Samples {
                rtt_ns: vec![1000, 3000],
                rtt_stride: 1,
                interval_s: 0.1,
                bytes: vec![16],
            },
            ok: true,
            ..Record::default()
        };
        let doc = to_json(serde_json::json!({"target": "x"}), std::slice::from_ref(&r));
        let (meta, back) = from_json(&doc.to_string()).unwrap();
        assert_eq!(meta["target"], "x");
        assert_eq!(back, vec![r.clone()]);
        let csv = to_csv(&[r]);
        assert_eq!(csv.lines().count(), 4);
        assert!(csv.contains("lat,send,0,8,1,0,0,rtt_ns,1,3000"));
        assert!(from_json("{}").is_err());
        let mut v = back;
        v[0].samples.rtt_ns = (0..10).collect();
        thin(&mut v, 3);
        assert_eq!(v[0].samples.rtt_ns, vec![0, 4, 8]);
        assert_eq!(v[0].samples.rtt_stride, 4);
        assert!(to_csv(&v).contains("rtt_ns,8,8"));
    }
}
