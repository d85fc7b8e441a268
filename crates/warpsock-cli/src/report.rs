//! Results: statistics, the terminal table and the JSON file.

use std::fmt::Write as _;

use serde_json::{json, Value};

use crate::ctl::Tally;
use crate::meter::{Outcome, INTERVAL};
use crate::opts::{fmt_size, Spec, Test, Transport};

/// One finished test: what the client measured and what the server counted.
#[derive(Debug, Clone)]
pub(crate) struct RunResult {
    pub(crate) spec: Spec,
    pub(crate) out: Outcome,
    pub(crate) server: Tally,
}

/// Nearest-rank percentile `q` (0..=1) of sorted values.
pub(crate) fn percentile(sorted: &[u64], q: f64) -> Option<u64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = (q * sorted.len() as f64).ceil().max(1.0) as usize;
    Some(sorted[rank.min(sorted.len()) - 1])
}

impl RunResult {
    /// Payload bytes that arrived at their destinations (both sides).
    pub(crate) fn bytes(&self) -> u64 {
        self.out.tally.bytes + self.server.bytes
    }

    /// Payload bytes whose contents checked out (both sides).
    pub(crate) fn verified(&self) -> u64 {
        self.out.tally.verified + self.server.verified
    }

    /// Whether anything moved and all of it checked out.
    pub(crate) fn ok(&self) -> bool {
        self.bytes() > 0 && self.bytes() == self.verified()
    }

    fn sorted_rtts(&self) -> Vec<u64> {
        let mut v = self.out.rtts_ns.clone();
        v.sort_unstable();
        v
    }

    /// One-way latency percentile in microseconds (round trip / 2).
    pub(crate) fn one_way_us(&self, q: f64) -> Option<f64> {
        percentile(&self.sorted_rtts(), q).map(|ns| ns as f64 / 2000.0)
    }

    /// Bandwidth in GB/s (10^9 bytes per second).
    pub(crate) fn gbps(&self) -> Option<f64> {
        let s = self.out.elapsed.as_secs_f64();
        (self.spec.test == Test::Bw && s > 0.0).then(|| self.out.data_bytes as f64 / s / 1e9)
    }

    fn crc_label(&self) -> &'static str {
        match (self.spec.transport, self.spec.crc) {
            (Transport::Tcp, _) => "-",
            (_, true) => "on",
            (_, false) => "off",
        }
    }

    fn check_label(&self) -> String {
        if self.ok() {
            "ok".into()
        } else {
            format!("FAIL {}/{} B", self.verified(), self.bytes())
        }
    }

    /// The TCP run this one compares with (same test and size).
    fn baseline<'a>(&self, all: &'a [Self]) -> Option<&'a Self> {
        all.iter().find(|r| {
            r.spec.transport == Transport::Tcp
                && r.spec.test == self.spec.test
                && r.spec.size == self.spec.size
        })
    }

    fn json(&self) -> Value {
        let s = &self.spec;
        let sorted = self.sorted_rtts();
        let us = |q| percentile(&sorted, q).map(|ns| ns as f64 / 2000.0);
        let mean = (!sorted.is_empty())
            .then(|| sorted.iter().sum::<u64>() as f64 / sorted.len() as f64 / 2000.0);
        let tally = |t: &Tally| json!({"msgs": t.msgs, "bytes": t.bytes, "verified": t.verified});
        let samples = match s.test {
            Test::Lat => json!({"rtt_ns": self.out.rtts_ns}),
            Test::Bw => json!({"interval_s": INTERVAL.as_secs_f64(), "bytes": self.out.intervals}),
        };
        json!({
            "test": s.test.name(),
            "transport": s.transport.name(),
            "crc": s.transport != Transport::Tcp && s.crc,
            "size": s.size,
            "window": s.window,
            "progress": s.progress.name(),
            "busy_poll_us": s.busy_poll_us,
            "client_cpu": s.client_pin,
            "server_cpu": s.pin,
            "messages": self.out.sent,
            "round_trips": self.out.rtts_ns.len(),
            "one_way_us": {
                "p50": us(0.5), "p99": us(0.99), "p999": us(0.999), "mean": mean,
                "min": sorted.first().map(|&v| v as f64 / 2000.0),
                "max": sorted.last().map(|&v| v as f64 / 2000.0),
            },
            "gbps": self.gbps(),
            "data_bytes": self.out.data_bytes,
            "elapsed_s": self.out.elapsed.as_secs_f64(),
            "bytes": self.bytes(),
            "verified": self.verified(),
            "ok": self.ok(),
            "client": tally(&self.out.tally),
            "server": tally(&self.server),
            "samples": samples,
        })
    }
}

/// The whole run as JSON: `meta` (what ran where) plus every result with
/// its samples.
pub(crate) fn to_json(meta: Value, results: &[RunResult]) -> Value {
    json!({
        "meta": meta,
        "results": results.iter().map(RunResult::json).collect::<Vec<_>>(),
    })
}

fn ratio(v: Option<f64>, base: Option<f64>) -> String {
    match (v, base) {
        (Some(v), Some(b)) if b > 0.0 => format!("{:.2}", v / b),
        _ => "-".into(),
    }
}

fn opt(v: Option<f64>, prec: usize) -> String {
    v.map_or_else(|| "-".into(), |v| format!("{v:.prec$}"))
}

/// Renders the tables: one for latency, one for bandwidth.
pub(crate) fn table(results: &[RunResult]) -> String {
    let mut s = String::new();
    let lat: Vec<&RunResult> = results
        .iter()
        .filter(|r| r.spec.test == Test::Lat)
        .collect();
    let bw: Vec<&RunResult> = results.iter().filter(|r| r.spec.test == Test::Bw).collect();
    if !lat.is_empty() {
        let _ = writeln!(
            s,
            "Latency: ping-pong, one-way = round trip / 2, in microseconds (lower is better)"
        );
        let _ = writeln!(
            s,
            "{:>7}  {:<20} {:>3}  {:>8}  {:>8}  {:>9}  {:>11}  check",
            "size", "transport", "CRC", "p50 µs", "p99 µs", "p50 x TCP", "round trips"
        );
        for r in &lat {
            let p50 = r.one_way_us(0.5);
            let base = r.baseline(results).and_then(|b| b.one_way_us(0.5));
            let _ = writeln!(
                s,
                "{:>7}  {:<20} {:>3}  {:>8}  {:>8}  {:>9}  {:>11}  {}",
                fmt_size(r.spec.size),
                r.spec.transport.label(),
                r.crc_label(),
                opt(p50, 2),
                opt(r.one_way_us(0.99), 2),
                ratio(p50, base),
                r.out.rtts_ns.len(),
                r.check_label()
            );
        }
    }
    if !bw.is_empty() {
        if !s.is_empty() {
            s.push('\n');
        }
        let _ = writeln!(
            s,
            "Bandwidth: one direction, {} messages in flight, GB/s = 10^9 bytes/s (higher is better)",
            bw[0].spec.window
        );
        let _ = writeln!(
            s,
            "{:>7}  {:<20} {:>3}  {:>8}  {:>10}  {:>11}  check",
            "size", "transport", "CRC", "GB/s", "GB/s x TCP", "messages"
        );
        for r in &bw {
            let base = r.baseline(results).and_then(RunResult::gbps);
            let _ = writeln!(
                s,
                "{:>7}  {:<20} {:>3}  {:>8}  {:>10}  {:>11}  {}",
                fmt_size(r.spec.size),
                r.spec.transport.label(),
                r.crc_label(),
                opt(r.gbps(), 2),
                ratio(r.gbps(), base),
                r.out.sent,
                r.check_label()
            );
        }
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
    }
}
