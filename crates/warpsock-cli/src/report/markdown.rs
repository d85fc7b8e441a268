//! `summary.md`: the winner of every test point with its ratio to host
//! TCP, the headline ratios of every transport against its baseline, and
//! the external peers next to the suite's rows.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde_json::Value;

use super::{best, label, point_label, sig, unit_of, Point, Record};
use crate::spec::{fmt_size, Test, Transport};
use crate::transports;

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
    if records.is_empty() {
        // An apps-suite file: its section follows.
        return s;
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
        "Each transport ÷ its baseline (host TCP; host UDP where the column says so) at one point per test (latency, setup and CPU: lower is better; bandwidth: higher is better).\n"
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
    // One column per transport that is not a baseline (each CRC setting
    // of those that have one), against its own baseline.
    // Those compared with host TCP first.
    let mut ts: Vec<Transport> = transports::all()
        .filter(|t| t.baseline != t.name())
        .collect();
    ts.sort_by_key(|t| t.baseline != "tcp");
    let mut cols: Vec<(Transport, bool)> = Vec::new();
    for t in ts {
        if t.crc {
            cols.extend([(t, false), (t, true)]);
        } else {
            cols.push((t, false));
        }
    }
    let head: Vec<String> = cols
        .iter()
        .map(|&(t, crc)| {
            let mut h = t.label().trim_start_matches("warpsock ").to_string();
            if crc {
                h.push_str("+CRC");
            }
            if t.baseline != "tcp" {
                let base = transports::find(t.baseline).map_or(t.baseline, |b| b.label());
                h.push_str(&format!(" ÷ {base}"));
            }
            h
        })
        .collect();
    let _ = writeln!(s, "| point | {} |", head.join(" | "));
    let _ = writeln!(s, "|---|{}", "---|".repeat(cols.len()));
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
                .find(|r| r.transport == t && r.crc == crc)
                .and_then(|r| r.merit())
                .map(|(v, _)| v)
        };
        let mut row = format!("| {name} |");
        for &(t, crc) in &cols {
            let cell = match (merit(t.name(), crc), merit(t.baseline, false)) {
                (Some(a), Some(b)) if b > 0.0 => format!("{:.2}", a / b),
                _ => "-".into(),
            };
            let _ = write!(row, " {cell} |");
        }
        let _ = writeln!(s, "{row}");
    }
    s
}
