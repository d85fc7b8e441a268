//! `--external`: the peers users would pick instead, run on loopback in the
//! same session where installed, as extra rows — iperf3 for TCP bandwidth
//! (1 MiB writes) and UDP bandwidth (16 KiB datagrams, unlimited rate),
//! sockperf for TCP and UDP ping-pong (64 bytes, both sides on the CPU the
//! latency tests use). Each is skipped, with a note, when not installed.
//!
//! Their numbers are what the tools report (iperf3's receiver bytes and
//! CPU percentages, sockperf's one-way percentiles); the tools check no
//! contents, so their rows count every reported byte as verified.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::report::{CpuRec, Pcts, Record, Samples};
use crate::Error;

/// A peer's server process, killed by pid when dropped.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
        }
        let _ = self.0.wait();
    }
}

fn installed(prog: &str) -> bool {
    std::env::var("PATH")
        .unwrap_or_default()
        .split(':')
        .any(|d| std::path::Path::new(d).join(prog).exists())
}

fn free_port() -> Result<u16, Error> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Whether a TCP socket listens on 127.0.0.1:`port` (from /proc/net/tcp).
fn listening(port: u16) -> bool {
    let want = format!(":{port:04X}");
    std::fs::read_to_string("/proc/net/tcp").is_ok_and(|t| {
        t.lines().skip(1).any(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.len() > 3 && f[1].ends_with(&want) && f[3] == "0A"
        })
    })
}

/// Starts `prog args` and waits (at most 3 s) until TCP `port` accepts,
/// or a short moment for UDP servers.
fn server(prog: &str, args: &[String], port: u16, tcp: bool) -> Result<Server, Error> {
    let child = Command::new(prog)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| Error::msg(format!("cannot start {prog}: {e}")))?;
    let s = Server(child);
    let end = Instant::now() + Duration::from_secs(3);
    loop {
        if !tcp {
            std::thread::sleep(Duration::from_millis(300));
            return Ok(s);
        }
        // Not by connecting: a one-off server would take the probe for
        // its client.
        if listening(port) {
            return Ok(s);
        }
        if Instant::now() >= end {
            return Err(Error::msg(format!("{prog} did not start listening")));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn output(prog: &str, args: &[String]) -> Result<String, Error> {
    let out = Command::new(prog)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| Error::msg(format!("cannot run {prog}: {e}")))?;
    let mut s = String::from_utf8_lossy(&out.stdout).into_owned();
    s.push_str(&String::from_utf8_lossy(&out.stderr));
    if !out.status.success() {
        return Err(Error::msg(format!(
            "{prog} failed ({}): {}",
            out.status,
            s.lines().last().unwrap_or("")
        )));
    }
    Ok(s)
}

fn base(test: &str, transport: &str, size: u64, bytes: u64, elapsed_s: f64) -> Record {
    Record {
        test: test.into(),
        transport: transport.into(),
        size,
        window: 0,
        conns: 1,
        progress: "-".into(),
        data_bytes: bytes,
        bytes,
        verified: bytes,
        elapsed_s,
        ok: bytes > 0,
        samples: Samples {
            rtt_stride: 1,
            interval_s: 0.0,
            ..Samples::default()
        },
        ..Record::default()
    }
}

/// iperf3 one way; `udp`: 16 KiB datagrams at unlimited rate, else TCP
/// with 1 MiB writes.
fn iperf3(secs: f64, udp: bool) -> Result<Record, Error> {
    let port = free_port()?;
    let p = port.to_string();
    let _s = server(
        "iperf3",
        &["-s", "-1", "-B", "127.0.0.1", "-p", &p].map(String::from),
        port,
        true,
    )?;
    let t = format!("{}", secs.max(1.0).round());
    let mut args: Vec<String> = ["-c", "127.0.0.1", "-p", &p, "-t", &t, "-J"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let size: u64 = if udp { 16 << 10 } else { 1 << 20 };
    if udp {
        args.extend(["-u", "-b", "0", "-l", "16384"].map(String::from));
    } else {
        args.extend(["-l", "1M"].map(String::from));
    }
    let text = output("iperf3", &args)?;
    let v: Value = serde_json::from_str(&text)
        .map_err(|e| Error::msg(format!("iperf3 -J output is not JSON: {e}")))?;
    let end = &v["end"];
    let (bytes, seconds, lost, sent) = if udp {
        let s = &end["sum"];
        let packets = s["packets"].as_u64().unwrap_or(0);
        let lost = s["lost_packets"].as_u64().unwrap_or(0);
        (
            packets.saturating_sub(lost) * size,
            s["seconds"].as_f64().unwrap_or(0.0),
            lost,
            packets,
        )
    } else {
        let s = &end["sum_received"];
        let b = s["bytes"].as_u64().unwrap_or(0);
        (b, s["seconds"].as_f64().unwrap_or(0.0), 0, b / size)
    };
    let cpu = &end["cpu_utilization_percent"];
    let pct = |k: &str| cpu[k].as_f64().unwrap_or(0.0) / 100.0 * seconds;
    let mut r = base(
        "bw",
        if udp { "iperf3-udp" } else { "iperf3" },
        size,
        bytes,
        seconds,
    );
    r.messages = sent;
    r.lost = lost;
    r.loss_pct = udp.then(|| lost as f64 * 100.0 / sent.max(1) as f64);
    r.gbps = (seconds > 0.0).then(|| bytes as f64 / seconds / 1e9);
    r.cpu = CpuRec {
        client_user_s: pct("host_user"),
        client_sys_s: pct("host_system"),
        server_user_s: pct("remote_user"),
        server_sys_s: pct("remote_system"),
    };
    r.cpu_s_per_gb = (bytes > 0).then(|| r.cpu.total_s() / (bytes as f64 / 1e9));
    r.cpu_us_per_msg = (sent > 0).then(|| r.cpu.total_s() * 1e6 / sent as f64);
    Ok(r)
}

/// The number after `key` on the first line that has it.
fn after(text: &str, key: &str) -> Option<f64> {
    text.lines().find_map(|l| {
        let i = l.find(key)?;
        l[i + key.len()..]
            .trim_start_matches([' ', '=', ':'])
            .split(|c: char| !(c.is_ascii_digit() || c == '.'))
            .next()?
            .parse()
            .ok()
    })
}

/// sockperf ping-pong of 64 bytes, both sides on `cpu`.
fn sockperf(secs: f64, tcp: bool, cpu: Option<usize>) -> Result<Record, Error> {
    let port = free_port()?;
    let p = port.to_string();
    let pin: Vec<String> = match (cpu, installed("taskset")) {
        (Some(c), true) => vec!["taskset".into(), "-c".into(), c.to_string()],
        _ => Vec::new(),
    };
    let mut sargs = pin.clone();
    sargs.extend(["sockperf", "sr", "-i", "127.0.0.1", "-p", &p].map(String::from));
    let mut cargs = pin;
    let t = format!("{}", secs.max(1.0).round());
    cargs.extend(
        [
            "sockperf",
            "pp",
            "-i",
            "127.0.0.1",
            "-p",
            &p,
            "-m",
            "64",
            "-t",
            &t,
        ]
        .map(String::from),
    );
    if tcp {
        sargs.push("--tcp".into());
        cargs.push("--tcp".into());
    }
    let (sprog, srest) = sargs.split_first().expect("non-empty");
    let _s = server(sprog, srest, port, tcp)?;
    let (cprog, crest) = cargs.split_first().expect("non-empty");
    let text = output(cprog, crest)?;
    let pct = |q: &str| after(&text, &format!("percentile {q}"));
    let (Some(p50), Some(p99), Some(p999)) = (pct("50.000"), pct("99.000"), pct("99.900")) else {
        return Err(Error::msg("sockperf printed no percentiles"));
    };
    let observations = after(&text, "Total").unwrap_or(0.0) as u64;
    let mut r = base(
        "lat",
        if tcp { "sockperf-tcp" } else { "sockperf-udp" },
        64,
        observations * 128,
        secs,
    );
    r.messages = observations;
    r.round_trips = observations;
    r.client_cpu = cpu.map(|c| c as u64);
    r.server_cpu = r.client_cpu;
    r.one_way_us = Some(Pcts {
        p50,
        p99,
        p999,
        mean: after(&text, "Latency is").unwrap_or(p50),
        min: after(&text, "<MIN> observation =").unwrap_or(p50),
        max: after(&text, "<MAX> observation =").unwrap_or(p999),
    });
    r.ok = true;
    Ok(r)
}

/// Runs every external peer that is installed; returns their rows and a
/// note for each one skipped or failed.
pub(crate) fn run(secs: f64, lat_cpu: Option<usize>) -> (Vec<Record>, Vec<String>) {
    let mut recs = Vec::new();
    let mut notes = Vec::new();
    if installed("iperf3") {
        for udp in [false, true] {
            eprintln!("external: iperf3{}", if udp { " -u" } else { "" });
            match iperf3(secs, udp) {
                Ok(r) => recs.push(r),
                Err(e) => notes.push(format!("iperf3{}: {e}", if udp { " -u" } else { "" })),
            }
        }
    } else {
        notes.push("iperf3 is not installed: its rows are skipped".into());
    }
    if installed("sockperf") {
        for tcp in [true, false] {
            eprintln!(
                "external: sockperf ping-pong{}",
                if tcp { " --tcp" } else { "" }
            );
            match sockperf(secs, tcp, lat_cpu) {
                Ok(r) => recs.push(r),
                Err(e) => notes.push(format!("sockperf{}: {e}", if tcp { " --tcp" } else { "" })),
            }
        }
    } else {
        notes.push("sockperf is not installed: its rows are skipped".into());
    }
    (recs, notes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_after_keys() {
        let t = "sockperf: ---> percentile 99.900 =   12.345\nsockperf: ====> avg-latency=5.5 (std-dev=1)\nsockperf: Summary: Latency is 5.432 usec\n";
        assert_eq!(after(t, "percentile 99.900"), Some(12.345));
        assert_eq!(after(t, "Latency is"), Some(5.432));
        assert_eq!(after(t, "percentile 50.000"), None);
    }
}
