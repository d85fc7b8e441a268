//! The terminal tables: one per test that ran.

use std::fmt::Write as _;

use super::{label, title, Record};
use crate::spec::{fmt_size, Test};

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
                    "{:>7} {:>3}  {:<20} {:>3}  {:>7}  {:>7}  {:>6}  {:>9}  {:>8}  {:>8}  check",
                    "size",
                    "N",
                    "transport",
                    "CRC",
                    "GB/s",
                    "x TCP",
                    "loss %",
                    "jitter µs",
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
                        "{:>7} {:>3}  {:<20} {:>3}  {:>7}  {:>7}  {:>6}  {:>9}  {:>8}  {:>8}  {}",
                        fmt_size(r.size as usize),
                        r.conns,
                        label(r),
                        r.crc_label(),
                        opt(r.gbps, 2),
                        x,
                        opt(r.loss_pct, 1),
                        opt(r.jitter_us, 1),
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
