//! `redis`: the request/response cache. redis-server and redis-benchmark
//! (GET and SET of 16 B to 64 KiB values, one request at a time and 16
//! pipelined, and `-k 0`: a new connection per request, the cluster
//! monitor's pattern). redis-benchmark's own requests/s and p50/p99;
//! every request must show in the server's `total_commands_processed`.

use super::env::{Launch, Proto, Setup};
use super::{argv, error_lines, Cx, Measured, Workload};
use crate::child;
use crate::spec::fmt_size;
use crate::Error;

/// The workload.
pub(crate) struct Redis;

impl Workload for Redis {
    fn name(&self) -> &'static str {
        "redis"
    }
    fn title(&self) -> &'static str {
        "request/response cache: redis-server + redis-benchmark"
    }
    fn proto(&self) -> Proto {
        Proto::Tcp
    }
    fn needs(&self) -> &'static [(&'static str, &'static str)] {
        &[
            ("redis-server", "redis-server"),
            ("redis-benchmark", "redis-tools"),
            ("redis-cli", "redis-tools"),
        ]
    }
    fn metric(&self) -> &'static str {
        "requests/s"
    }

    fn run(&self, cx: &Cx, setup: &Setup) -> Result<Vec<Measured>, Error> {
        let port = child::free_port()?;
        let launch = setup.launch(&[port]);
        let p = port.to_string();
        let srv = cx.server(
            &launch,
            &argv(&[
                "redis-server",
                "--port",
                &p,
                "--bind",
                &cx.server.ip,
                "--save",
                "",
                "--appendonly",
                "no",
                "--protected-mode",
                "no",
                "--daemonize",
                "no",
                "--dir",
                &cx.dir.display().to_string(),
            ]),
            port,
            true,
        )?;
        let res = cases(cx, &launch, port);
        let log = srv.stop();
        let mut out = res?;
        let problems = error_lines(&log?);
        if let Some(m) = out.first_mut() {
            m.problems.extend(problems);
        }
        Ok(out)
    }
}

/// (value size, pipeline depth, keep-alive) of each run.
fn runs(quick: bool) -> Vec<(usize, u32, bool)> {
    let sizes: &[usize] = if quick {
        &[16, 4096]
    } else {
        &[16, 1024, 16 * 1024, 64 * 1024]
    };
    let mut v = Vec::new();
    for &s in sizes {
        v.push((s, 1, true));
        v.push((s, 16, true));
    }
    v.push((16, 1, false));
    v
}

fn cases(cx: &Cx, launch: &Launch, port: u16) -> Result<Vec<Measured>, Error> {
    let mut out = Vec::new();
    for (size, pipe, keep) in runs(cx.quick) {
        let n: u64 = match (cx.quick, keep) {
            (true, _) => 2_000,
            (false, false) => cx.link.count(20_000, 2_000),
            (false, true) => cx.link.count(100_000 * u64::from(pipe.min(4)), 2_000),
        };
        let before = processed(cx, launch, port)?;
        let text = cx.client(
            launch,
            &argv(&[
                "redis-benchmark",
                "-h",
                &cx.server.ip,
                "-p",
                &port.to_string(),
                "-t",
                "set,get",
                "-n",
                &n.to_string(),
                "-d",
                &size.to_string(),
                "-P",
                &pipe.to_string(),
                "-c",
                "8",
                "-k",
                if keep { "1" } else { "0" },
                "--csv",
            ]),
        )?;
        let after = processed(cx, launch, port)?;
        let mut rows = read_csv(&text);
        if rows.len() != 2 {
            return Err(Error::msg(format!(
                "redis-benchmark printed no SET and GET rows: {}",
                crate::ctl::shorten(&text)
            )));
        }
        // The CLI's own INFO call counts too.
        let served = after.saturating_sub(before).saturating_sub(1);
        if served < 2 * n {
            rows[0]
                .problems
                .push(format!("redis answered {served} of {} commands", 2 * n));
        }
        for mut m in rows {
            m.case = format!(
                "{} {}{}",
                m.case,
                fmt_size(size),
                match (pipe, keep) {
                    (_, false) => ", a connection per request".to_string(),
                    (1, true) => String::new(),
                    (p, true) => format!(", pipeline {p}"),
                }
            );
            m.requests = Some(n);
            m.bytes = Some(n * size as u64);
            out.push(m);
        }
    }
    Ok(out)
}

/// The server's `total_commands_processed`.
fn processed(cx: &Cx, launch: &Launch, port: u16) -> Result<u64, Error> {
    let text = cx.client(
        launch,
        &argv(&[
            "redis-cli",
            "-h",
            &cx.server.ip,
            "-p",
            &port.to_string(),
            "INFO",
            "stats",
        ]),
    )?;
    text.lines()
        .find_map(|l| l.strip_prefix("total_commands_processed:"))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| Error::msg("redis-cli INFO stats has no total_commands_processed"))
}

/// redis-benchmark's CSV: one row per command with rps, p50 and p99.
fn read_csv(text: &str) -> Vec<Measured> {
    let mut r = csv::ReaderBuilder::new()
        .has_headers(true)
        .from_reader(text.as_bytes());
    let Ok(head) = r.headers().cloned() else {
        return Vec::new();
    };
    let col = |name: &str| head.iter().position(|h| h == name);
    let (Some(t), Some(rps)) = (col("test"), col("rps")) else {
        return Vec::new();
    };
    let (p50, p99) = (col("p50_latency_ms"), col("p99_latency_ms"));
    r.records()
        .filter_map(Result::ok)
        .map(|row| {
            let num = |i: Option<usize>| i.and_then(|i| row.get(i)?.parse::<f64>().ok());
            Measured {
                case: row.get(t).unwrap_or("?").to_string(),
                value: num(Some(rps)).unwrap_or(0.0),
                p50_ms: num(p50),
                p99_ms: num(p99),
                ..Measured::default()
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_rows_are_read() {
        let t = "\"test\",\"rps\",\"avg_latency_ms\",\"min_latency_ms\",\"p50_latency_ms\",\"p95_latency_ms\",\"p99_latency_ms\",\"max_latency_ms\"\n\"SET\",\"50000.00\",\"0.150\",\"0.050\",\"0.143\",\"0.255\",\"0.351\",\"1.031\"\n\"GET\",\"52631.58\",\"0.140\",\"0.040\",\"0.135\",\"0.223\",\"0.311\",\"0.583\"\n";
        let rows = read_csv(t);
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[1].case, "GET");
        assert_eq!(rows[1].value, 52631.58);
        assert_eq!((rows[0].p50_ms, rows[0].p99_ms), (Some(0.143), Some(0.351)));
        assert!(read_csv("nothing").is_empty());
        assert_eq!(runs(true).len(), 5);
    }
}
