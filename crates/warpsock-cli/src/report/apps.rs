//! The apps suite's results: the terminal table and the summary (each
//! case over each transport, its ratio to the baseline, the winner of
//! each workload).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::sig;
use crate::apps::AppRecord;

/// The transport's ratio to its protocol's baseline in the same case
/// (`None` when either has no value).
fn ratio(r: &AppRecord, all: &[AppRecord]) -> Option<f64> {
    let base = if r.workload == "memcached-udp" || r.workload == "rtp" {
        "udp"
    } else {
        "tcp"
    };
    let b = all
        .iter()
        .find(|x| x.workload == r.workload && x.case == r.case && x.transport == base)?;
    match (r.value, b.value) {
        (Some(v), Some(b)) if b > 0.0 && r.ok => Some(v / b),
        _ => None,
    }
}

fn ms(v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), |v| format!("{v:.3}"))
}

/// One table for all workloads: case, transport, value, ratio, p50/p99,
/// jitter, lost, CPU, check.
pub(crate) fn table(records: &[AppRecord]) -> String {
    let mut s = String::new();
    let mut last = String::new();
    for r in records {
        if r.workload != last {
            last.clone_from(&r.workload);
            let _ = writeln!(s, "\n{}: {} ({})", r.workload, r.title, r.metric);
            let _ = writeln!(
                s,
                "  {:<40} {:<12} {:>12} {:>7} {:>9} {:>9} {:>8} {:>6} {:>7}  check",
                "case",
                "transport",
                "value",
                "x base",
                "p50 ms",
                "p99 ms",
                "jit ms",
                "lost",
                "CPU s"
            );
        }
        if !r.available {
            let _ = writeln!(s, "  {:<40} {:<12} {}", r.case, r.transport, r.note);
            continue;
        }
        let _ = writeln!(
            s,
            "  {:<40} {:<12} {:>12} {:>7} {:>9} {:>9} {:>8} {:>6} {:>7}  {}",
            r.case,
            r.transport,
            r.value.filter(|_| r.ok).map_or("-".into(), sig),
            ratio(r, records).map_or("-".into(), |x| format!("{x:.2}")),
            ms(r.p50_ms),
            ms(r.p99_ms),
            ms(r.jitter_ms),
            r.lost.map_or("-".into(), |l| l.to_string()),
            r.cpu_s.map_or("-".into(), |c| format!("{c:.2}")),
            if r.ok {
                "ok".to_string()
            } else {
                format!("FAIL: {}", r.note)
            }
        );
    }
    s
}

/// The Markdown section: per workload, the winner of each case and its
/// ratio to the baseline; the transports that were not available.
pub(crate) fn summary(records: &[AppRecord]) -> String {
    if records.is_empty() {
        return String::new();
    }
    let mut s = String::from("\n## Applications (winner of each workload)\n\n");
    let _ = writeln!(
        s,
        "Each case's winner among the transports that ran it, its value and its ratio to host TCP (UDP for UDP programs): above 1 is better for throughput and frames delivered.\n"
    );
    let _ = writeln!(s, "| workload | case | winner | value | ratio | others |");
    let _ = writeln!(s, "|---|---|---|---|---|---|");
    let mut cases: BTreeMap<(usize, &str, &str), Vec<&AppRecord>> = BTreeMap::new();
    let order: Vec<&str> = {
        let mut v: Vec<&str> = Vec::new();
        for r in records {
            if !v.contains(&r.workload.as_str()) {
                v.push(&r.workload);
            }
        }
        v
    };
    for r in records.iter().filter(|r| r.available && r.ok) {
        let i = order.iter().position(|w| *w == r.workload).unwrap_or(0);
        cases.entry((i, &r.workload, &r.case)).or_default().push(r);
    }
    for ((_, w, case), rs) in &cases {
        let better = |a: &AppRecord, b: &AppRecord| {
            let (x, y) = (a.value.unwrap_or(0.0), b.value.unwrap_or(0.0));
            if a.higher_is_better {
                x > y
            } else {
                x < y
            }
        };
        let win = rs
            .iter()
            .copied()
            .reduce(|a, b| if better(b, a) { b } else { a })
            .expect("a case has a record");
        let others: Vec<String> = rs
            .iter()
            .filter(|r| r.transport != win.transport)
            .map(|r| {
                format!(
                    "{} {}{}",
                    r.transport,
                    r.value.map_or("-".into(), sig),
                    ratio(r, records).map_or(String::new(), |x| format!(" ({x:.2})"))
                )
            })
            .collect();
        let _ = writeln!(
            s,
            "| {w} | {case} | {} | {} {} | {} | {} |",
            win.transport,
            win.value.map_or("-".into(), sig),
            win.metric,
            ratio(win, records).map_or("-".into(), |x| format!("{x:.2}")),
            others.join(", ")
        );
    }
    let na: Vec<String> = records
        .iter()
        .filter(|r| !r.available)
        .map(|r| {
            let why = r.note.strip_prefix("not available: ").unwrap_or(&r.note);
            format!("- {} over {}: {why}", r.workload, r.transport)
        })
        .collect();
    if !na.is_empty() {
        let _ = writeln!(s, "\nNot available in this run:\n\n{}", na.join("\n"));
    }
    let failed: Vec<String> = records
        .iter()
        .filter(|r| r.available && !r.ok)
        .map(|r| {
            format!(
                "- {} {} over {}: {}",
                r.workload, r.case, r.transport, r.note
            )
        })
        .collect();
    if !failed.is_empty() {
        let _ = writeln!(s, "\nFailed checks:\n\n{}", failed.join("\n"));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(w: &str, t: &str, v: f64) -> AppRecord {
        AppRecord {
            workload: w.into(),
            case: "GET 16 B".into(),
            transport: t.into(),
            metric: "requests/s".into(),
            higher_is_better: true,
            value: Some(v),
            available: true,
            ok: true,
            ..AppRecord::default()
        }
    }

    #[test]
    fn winners_ratios_and_missing_transports() {
        let mut rs = vec![
            rec("memcached-udp", "udp", 100.0),
            rec("memcached-udp", "udp-offload", 150.0),
        ];
        rs.push(AppRecord {
            available: false,
            note: "not available: the preload does not export warpsock_feature_udp_gso".into(),
            ..rec("memcached-udp", "udp-gso", 0.0)
        });
        let md = summary(&rs);
        assert!(
            md.contains("| memcached-udp | GET 16 B | udp-offload | 150 requests/s | 1.50 |"),
            "{md}"
        );
        assert!(
            md.contains("- memcached-udp over udp-gso: the preload does not export"),
            "{md}"
        );
        let t = table(&rs);
        assert!(t.contains("1.50") && t.contains("not available"), "{t}");
    }
}
