//! Results: one [`Record`] per test run (what goes into the JSON file and
//! what `warpsock report` reads back) and how each is named, plus the
//! `report` subcommand. Each output has its file: [`json`] (every sample
//! and result), [`csv`] (every sample), [`tables`] (the terminal),
//! [`markdown`] (`summary.md`), [`figures`] (PNG and SVG).

pub(crate) mod apps;
pub(crate) mod csv;
pub(crate) mod figures;
pub(crate) mod json;
pub(crate) mod markdown;
pub(crate) mod tables;

use serde::{Deserialize, Serialize};

pub(crate) use self::csv::to_csv;
pub(crate) use figures::ReportCmd;
pub(crate) use json::{from_json, thin, to_json};
pub(crate) use markdown::summary;
pub(crate) use tables::tables;

use crate::ctl::SideReport;
use crate::spec::{fmt_size, Spec, Test, Transport};
use crate::stats::{Cpu, Pcts, Stats, Tally, INTERVAL};
use crate::transports;

/// One finished test: what the client measured and what the server
/// reported.
#[derive(Debug, Clone)]
pub(crate) struct RunResult {
    pub(crate) spec: Spec,
    pub(crate) client: Stats,
    pub(crate) client_cpu: Cpu,
    pub(crate) server: SideReport,
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
    /// RFC 3550 interarrival jitter at the receivers, µs (datagram
    /// bandwidth tests of 24 B up to the gather size; the larger side's).
    #[serde(default)]
    pub(crate) jitter_us: Option<f64>,
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
        let expect = if echoes && !t.pull {
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
            crc: t.crc && s.crc,
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
            jitter_us: match (c.jitter_ns, sv.jitter_ns.map(|j| j as f64)) {
                (Some(a), Some(b)) => Some(a.max(b)),
                (a, b) => a.or(b),
            }
            .map(|ns| ns / 1e3),
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

    /// The transport, if the suite has it (external peers' rows: `None`).
    pub(crate) fn transport_kind(&self) -> Option<Transport> {
        transports::find(&self.transport)
    }

    /// Series name: transport plus CRC for warpsock rows; a peer's
    /// latency row that has only a mean says so (` (mean)`).
    pub(crate) fn series(&self) -> String {
        let t = label(self);
        match self.transport_kind() {
            Some(k) if k.crc => {
                format!("{t}, CRC {}", if self.crc { "on" } else { "off" })
            }
            _ if self.merit_is_mean() => format!("{t} (mean)"),
            _ => t.to_string(),
        }
    }

    pub(crate) fn crc_label(&self) -> &'static str {
        match self.transport_kind() {
            Some(t) if t.crc => {
                if self.crc {
                    "on"
                } else {
                    "off"
                }
            }
            _ => "-",
        }
    }

    pub(crate) fn check_label(&self) -> String {
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

    pub(crate) fn x_of(&self, base: Option<&Self>) -> String {
        match (self.merit(), base.and_then(Self::merit)) {
            (Some((v, _)), Some((b, _))) if b > 0.0 => format!("{:.2}", v / b),
            _ => "-".into(),
        }
    }
}

/// The transport's name in tables and legends.
pub(crate) fn label(r: &Record) -> &str {
    match r.transport_kind() {
        Some(t) => t.label(),
        None => peer_label(&r.transport).unwrap_or(r.transport.as_str()),
    }
}

pub(crate) fn title(t: Test) -> String {
    let mut c = t.title().chars();
    c.next()
        .map(|f| f.to_uppercase().collect::<String>() + c.as_str())
        .unwrap_or_default()
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
pub(crate) fn best<'a>(rs: &[&'a Record]) -> Option<&'a Record> {
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

pub(crate) fn unit_of(test: &str) -> &'static str {
    match test {
        "lat" | "hotspot" | "conn" => "µs",
        "cpu" => "s/GB",
        _ => "GB/s",
    }
}

pub(crate) fn point_label(test: &str, size: u64, conns: u64, busy: bool) -> String {
    let mut p = fmt_size(size as usize);
    if matches!(test, "multi" | "hotspot" | "fan-in" | "fan-out") {
        p = format!("N={conns}, {p}");
    }
    if busy {
        p.push_str(", busy-poll");
    }
    p
}
