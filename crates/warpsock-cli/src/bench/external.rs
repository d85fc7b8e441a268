//! `--external`: the peers users would pick instead, run on loopback in the
//! same session where installed, as extra rows:
//!
//! - iperf3 for TCP bandwidth (1 MiB writes) and UDP bandwidth (16 KiB
//!   datagrams, unlimited rate);
//! - sockperf for TCP and UDP ping-pong (64 bytes, both sides on the CPU
//!   the latency tests use);
//! - `ucx_perftest` (Debian `ucx-utils`) over UCX's TCP transport
//!   (`UCX_TLS=tcp`, `UCX_NET_DEVICES=lo`): one-sided put latency at 8 B
//!   and bandwidth at 1 MiB (`ucp_put_lat`, `ucp_put_bw`), and
//!   tag-matched messages, UCX's fastest path, at the same points
//!   (`tag_lat`, `tag_bw`);
//! - `fi_pingpong` (Debian `libfabric-bin`) over libfabric's tcp provider
//!   with connected (`FI_EP_MSG`) endpoints on domain `lo`: ping-pong at
//!   8 B and 64 KiB. It has no streaming mode, so libfabric gets no
//!   bandwidth row (fabtests, which has one, is not packaged).
//!
//! Each tool is skipped, with a note, when not installed; a run that fails
//! or does not finish in time (it is then killed by its pid) leaves a note
//! instead of a row. Servers and clients talk over 127.0.0.1 only, on
//! ports found free just before.
//!
//! Their numbers are what the tools report and nothing else: iperf3's
//! receiver bytes and CPU percentages, sockperf's one-way percentiles,
//! ucx_perftest's one-way median of its last 2048 iterations and its
//! overall mean, fi_pingpong's mean one-way time. A number a tool does not
//! report stays empty (`null` in the JSON), and each UCX and libfabric
//! row's `notes` say what its numbers are. The tools check no contents, so
//! their rows count every reported byte as verified. ucx_perftest and
//! fi_pingpong poll without ever sleeping: their latency rows carry
//! [`SPINS`] and so meet the suite's busy-polling rows, with the two sides
//! on two CPUs as the suite places busy-polling latency.

use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;

use crate::child::{self, free_port, installed, pinned, strings, Proc};
use crate::report::{CpuRec, Record, Samples, SPINS};
use crate::stats::Pcts;
use crate::Error;

/// Starts `argv` (program first) with `env` added and waits
/// until it listens on TCP `port` or has bound UDP `port` (10 s: a loaded
/// machine can take seconds to start a program).
fn server(argv: &[String], env: &[(&str, &str)], port: u16, tcp: bool) -> Result<Proc, Error> {
    let (prog, args) = argv.split_first().expect("a program");
    let mut cmd = child::command(&[], prog);
    cmd.args(args)
        .envs(env.iter().copied())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let mut p = Proc::spawn(cmd, prog)?;
    p.await_port(port, tcp, Duration::from_secs(10))?;
    Ok(p)
}

/// How long one external client run may take before it is killed:
/// generous for a loaded machine, but bounded.
fn limit(secs: f64) -> Duration {
    Duration::from_secs_f64(secs.max(1.0) * 6.0 + 20.0)
}

/// Runs `argv` (program first) with `env` added and returns its stdout
/// followed by its stderr. Fails when it exits unsuccessfully, or when it
/// has not finished within `limit` (it is then killed by its pid).
fn output(argv: &[String], env: &[(&str, &str)], limit: Duration) -> Result<String, Error> {
    let (prog, args) = argv.split_first().expect("a program");
    let mut cmd = child::command(&[], prog);
    cmd.args(args).envs(env.iter().copied());
    child::run_ok(cmd, prog, limit)
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
        &strings(&["iperf3", "-s", "-1", "-B", "127.0.0.1", "-p", &p]),
        &[],
        port,
        true,
    )?;
    let t = format!("{}", secs.max(1.0).round());
    let mut args = strings(&["iperf3", "-c", "127.0.0.1", "-p", &p, "-t", &t, "-J"]);
    let size: u64 = if udp { 16 << 10 } else { 1 << 20 };
    if udp {
        args.extend(strings(&["-u", "-b", "0", "-l", "16384"]));
    } else {
        args.extend(strings(&["-l", "1M"]));
    }
    let text = output(&args, &[], limit(secs))?;
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
    let t = format!("{}", secs.max(1.0).round());
    let mut sargs = strings(&["sockperf", "sr", "-i", "127.0.0.1", "-p", &p]);
    let mut cargs = strings(&[
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
    ]);
    if tcp {
        sargs.push("--tcp".into());
        cargs.push("--tcp".into());
    }
    let _s = server(&pinned(cpu, sargs), &[], port, tcp)?;
    let text = output(&pinned(cpu, cargs), &[], limit(secs))?;
    let pct = |q: &str| after(&text, &format!("percentile {q}"));
    let (Some(p50), Some(p99), Some(p999), Some(mean)) = (
        pct("50.000"),
        pct("99.000"),
        pct("99.900"),
        after(&text, "Latency is"),
    ) else {
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
        p50: Some(p50),
        p99: Some(p99),
        p999: Some(p999),
        mean,
        min: after(&text, "<MIN> observation ="),
        max: after(&text, "<MAX> observation ="),
    });
    r.ok = true;
    Ok(r)
}

/// (client CPU, server CPU) for two polling sides: two different CPUs,
/// the server on the latency CPU and the client on the one below it (as
/// the suite places busy-polling latency), or unpinned.
fn spin_cpus(lat_cpu: Option<usize>) -> (Option<usize>, Option<usize>) {
    match lat_cpu {
        Some(c) if c > 0 => (Some(c - 1), Some(c)),
        Some(c) if crate::pin::cpu_count() > c + 1 => (Some(c + 1), Some(c)),
        _ => (None, None),
    }
}

/// A test of ucx_perftest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ucx {
    /// `ucp_put_lat`, 8 B: put, the peer sees the memory change and puts
    /// back.
    PutLat,
    /// `tag_lat`, 8 B: tag-matched send and receive, ping-pong.
    TagLat,
    /// `ucp_put_bw`, 1 MiB: a stream of puts.
    PutBw,
    /// `tag_bw`, 1 MiB: a stream of tag-matched sends.
    TagBw,
}

impl Ucx {
    const ALL: [Self; 4] = [Self::PutLat, Self::TagLat, Self::PutBw, Self::TagBw];

    /// ucx_perftest's `-t` name.
    fn name(self) -> &'static str {
        match self {
            Self::PutLat => "ucp_put_lat",
            Self::TagLat => "tag_lat",
            Self::PutBw => "ucp_put_bw",
            Self::TagBw => "tag_bw",
        }
    }

    fn latency(self) -> bool {
        matches!(self, Self::PutLat | Self::TagLat)
    }

    fn transport(self) -> &'static str {
        match self {
            Self::PutLat | Self::PutBw => "ucx-put",
            Self::TagLat | Self::TagBw => "ucx-tag",
        }
    }

    fn size(self) -> u64 {
        if self.latency() {
            8
        } else {
            1 << 20
        }
    }

    /// Iterations for about `secs` seconds at the rates this tool reaches
    /// over loopback TCP (ucx_perftest has no time limit), at least 4096
    /// for latency so that its 2048-entry timing queue is full, and at
    /// most ten million.
    fn iters(self, secs: f64) -> u64 {
        let (per_s, min) = match self {
            Self::PutLat | Self::TagLat => (40_000.0, 4096.0),
            Self::PutBw => (600.0, 100.0),
            Self::TagBw => (4000.0, 200.0),
        };
        (secs * per_s).clamp(min, 1e7) as u64
    }
}

/// ucx_perftest's `Final:` line (its last line), in its units.
#[derive(Debug, Clone, Copy, PartialEq)]
struct UcxFinal {
    iters: u64,
    /// The `50.0%ile` column: the median of the last 2048 iterations'
    /// times (one-way for ping-pong tests: round trip / 2), µs.
    median_us: f64,
    /// The `overall` latency column: elapsed / iterations (/ 2 for
    /// ping-pong), µs.
    overall_us: f64,
    /// The `overall` bandwidth column, MB/s with MB = 2^20 bytes.
    overall_mb_s: f64,
    /// The `overall` message rate column, messages/s.
    overall_msg_s: f64,
}

/// Parses ucx_perftest's report: the `Final:` row of eight numbers
/// (iterations; latency percentile, average, overall; bandwidth average,
/// overall; message rate average, overall) under a header whose
/// percentile column is `50.0%ile` (the default rank, so it is the
/// median).
fn parse_ucx(text: &str) -> Option<UcxFinal> {
    if !text.contains("50.0%ile") {
        return None;
    }
    let line = text
        .lines()
        .find(|l| l.trim_start().starts_with("Final:"))?;
    let f: Vec<f64> = line
        .split_whitespace()
        .skip(1)
        .map(str::parse)
        .collect::<Result<_, _>>()
        .ok()?;
    if f.len() != 8 || f.iter().any(|v| !v.is_finite() || *v < 0.0) {
        return None;
    }
    Some(UcxFinal {
        iters: f[0] as u64,
        median_us: f[1],
        overall_us: f[3],
        overall_mb_s: f[5],
        overall_msg_s: f[7],
    })
}

/// The environment of both ucx_perftest processes: UCX's TCP transport
/// on the loopback device only.
const UCX_ENV: [(&str, &str); 2] = [("UCX_TLS", "tcp"), ("UCX_NET_DEVICES", "lo")];

/// The record of one ucx_perftest run from its parsed report.
fn ucx_record(t: Ucx, f: &UcxFinal, cpus: (Option<usize>, Option<usize>)) -> Record {
    let size = t.size();
    let placement = match cpus {
        (Some(c), Some(s)) => format!("client on CPU {c}, server on CPU {s}"),
        _ => "unpinned".to_string(),
    };
    if t.latency() {
        let elapsed = f.iters as f64 * f.overall_us * 2.0 / 1e6;
        let mut r = base("lat", t.transport(), size, 2 * f.iters * size, elapsed);
        r.window = 1;
        r.messages = f.iters;
        r.round_trips = f.iters;
        r.busy_poll_us = SPINS;
        r.client_cpu = cpus.0.map(|c| c as u64);
        r.server_cpu = cpus.1.map(|c| c as u64);
        r.one_way_us = Some(Pcts {
            p50: Some(f.median_us),
            p99: None,
            p999: None,
            mean: f.overall_us,
            min: None,
            max: None,
        });
        r.ok = r.ok && f.median_us > 0.0 && f.overall_us > 0.0;
        r.notes = vec![
            format!(
                "ucx_perftest -t {} over UCX_TLS=tcp on lo; one-way = round trip / 2 as it \
                 reports; p50 is the median of its last 2048 iterations (all it keeps), mean \
                 = its overall average over {} iterations; it reports no p99/p99.9/min/max",
                t.name(),
                f.iters
            ),
            format!("both sides poll without sleeping, {placement}; CPU time not measured"),
        ];
        r
    } else {
        let gbps = f.overall_mb_s * (1u64 << 20) as f64 / 1e9;
        let bytes = f.iters * size;
        let elapsed = if gbps > 0.0 {
            bytes as f64 / (gbps * 1e9)
        } else {
            0.0
        };
        let mut r = base("bw", t.transport(), size, bytes, elapsed);
        r.messages = f.iters;
        r.gbps = Some(gbps);
        r.ok = r.ok && gbps > 0.0 && f.overall_msg_s > 0.0;
        r.notes = vec![
            format!(
                "ucx_perftest -t {} over UCX_TLS=tcp on lo: its overall bandwidth over {} \
                 messages ({:.1} MB/s, MB = 2^20 B, shown as GB/s = 10^9 B/s), UCX's own \
                 flow control (no window)",
                t.name(),
                f.iters,
                f.overall_mb_s
            ),
            format!("both sides poll without sleeping, {placement}; CPU time not measured"),
        ];
        r
    }
}

/// One ucx_perftest run: server and client on 127.0.0.1, on two CPUs (see
/// [`spin_cpus`]).
fn ucx(secs: f64, t: Ucx, lat_cpu: Option<usize>) -> Result<Record, Error> {
    let port = free_port()?;
    let p = port.to_string();
    // Both sides spin, in bandwidth tests too: on one CPU they would
    // take turns.
    let cpus = spin_cpus(lat_cpu);
    let _s = server(
        &pinned(cpus.1, strings(&["ucx_perftest", "-p", &p])),
        &UCX_ENV,
        port,
        true,
    )?;
    let n = t.iters(secs);
    let client = strings(&[
        "ucx_perftest",
        "127.0.0.1",
        "-p",
        &p,
        "-t",
        t.name(),
        "-s",
        &t.size().to_string(),
        "-n",
        &n.to_string(),
        "-w",
        &(n / 10).max(1).to_string(),
    ]);
    let text = output(&pinned(cpus.0, client), &UCX_ENV, limit(secs))?;
    let f = parse_ucx(&text).ok_or_else(|| {
        Error::msg(format!(
            "no final report line from ucx_perftest: {}",
            text.lines().last().unwrap_or("")
        ))
    })?;
    Ok(ucx_record(t, &f, cpus))
}

/// fi_pingpong's result row.
#[derive(Debug, Clone, Copy, PartialEq)]
struct FiRow {
    /// The `bytes` column (message size).
    size: u64,
    /// `MB/sec`: bytes both ways / elapsed, MB = 10^6 B.
    mb_s: f64,
    /// `usec/xfer`: elapsed / iterations / 2, the mean one-way time.
    usec_per_xfer: f64,
}

/// fi_pingpong's size notation: `8`, `64k`, `1m`, `2g` (powers of 1024).
fn fi_size(s: &str) -> Option<u64> {
    let (num, mult) = match s.chars().last()? {
        'k' => (&s[..s.len() - 1], 1u64 << 10),
        'm' => (&s[..s.len() - 1], 1 << 20),
        'g' => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    num.parse::<u64>().ok()?.checked_mul(mult)
}

/// Parses fi_pingpong's table: the row under the header `bytes #sent #ack
/// total time MB/sec usec/xfer Mxfers/sec`. A row whose `#ack` is not
/// `=`-prefixed (not every message acknowledged) is refused.
fn parse_fi(text: &str) -> Option<FiRow> {
    let mut lines = text.lines();
    lines.find(|l| l.starts_with("bytes") && l.contains("usec/xfer"))?;
    let row = lines.find(|l| !l.trim().is_empty())?;
    let f: Vec<&str> = row.split_whitespace().collect();
    if f.len() < 8 || !f[2].starts_with('=') {
        return None;
    }
    let num = |s: &str| s.parse::<f64>().ok().filter(|v| v.is_finite() && *v >= 0.0);
    Some(FiRow {
        size: fi_size(f[0])?,
        mb_s: num(f[5])?,
        usec_per_xfer: num(f[6])?,
    })
}

/// Iterations of an fi_pingpong run of `size` for about `secs` seconds.
fn fi_iters(size: u64, secs: f64) -> u64 {
    let per_s = if size >= 1 << 16 { 3000.0 } else { 20_000.0 };
    (secs * per_s).clamp(500.0, 1e7) as u64
}

/// The record of one fi_pingpong run of `iters` iterations.
fn fi_record(row: &FiRow, iters: u64, cpus: (Option<usize>, Option<usize>)) -> Record {
    let size = row.size;
    let elapsed = iters as f64 * row.usec_per_xfer * 2.0 / 1e6;
    let mut r = base("lat", "libfabric-tcp", size, 2 * iters * size, elapsed);
    r.window = 1;
    r.messages = iters;
    r.round_trips = iters;
    r.busy_poll_us = SPINS;
    r.client_cpu = cpus.0.map(|c| c as u64);
    r.server_cpu = cpus.1.map(|c| c as u64);
    r.one_way_us = Some(Pcts {
        mean: row.usec_per_xfer,
        ..Pcts::default()
    });
    r.ok = r.ok && row.usec_per_xfer > 0.0;
    let placement = match cpus {
        (Some(c), Some(s)) => format!("client on CPU {c}, server on CPU {s}"),
        _ => "unpinned".to_string(),
    };
    r.notes = vec![
        format!(
            "fi_pingpong -p tcp -e msg -d lo, {iters} iterations: only the mean one-way \
             time (its usec/xfer = elapsed / iterations / 2); it reports no percentiles"
        ),
        format!(
            "completion queues polled without sleeping, {placement}; contents not checked \
             (no -c); CPU time not measured"
        ),
    ];
    r
}

/// One fi_pingpong ping-pong of `size` bytes over the tcp provider's
/// connected endpoints on `lo`, the sides on two CPUs.
fn libfabric(secs: f64, size: u64, lat_cpu: Option<usize>) -> Result<Record, Error> {
    let port = free_port()?;
    let p = port.to_string();
    let cpus = spin_cpus(lat_cpu);
    let n = fi_iters(size, secs);
    let common = |ctl: &str| {
        strings(&[
            "fi_pingpong",
            "-p",
            "tcp",
            "-e",
            "msg",
            "-d",
            "lo",
            ctl,
            &p,
            "-S",
            &size.to_string(),
            "-I",
            &n.to_string(),
        ])
    };
    let _s = server(&pinned(cpus.1, common("-B")), &[], port, true)?;
    let mut client = common("-P");
    client.push("127.0.0.1".into());
    let text = output(&pinned(cpus.0, client), &[], limit(secs))?;
    let row = parse_fi(&text).ok_or_else(|| {
        Error::msg(format!(
            "no result row from fi_pingpong: {}",
            text.lines().last().unwrap_or("")
        ))
    })?;
    if row.size != size {
        return Err(Error::msg(format!(
            "fi_pingpong ran {} B, not {size} B",
            row.size
        )));
    }
    Ok(fi_record(&row, n, cpus))
}

/// Runs every external peer that is installed, each run bounded in time;
/// returns their rows and a note for each one skipped or failed.
/// `lat_cpu`: the CPU of the suite's latency tests.
pub(crate) fn run(secs: f64, lat_cpu: Option<usize>) -> (Vec<Record>, Vec<String>) {
    let mut recs = Vec::new();
    let mut notes = Vec::new();
    let mut keep = |what: String, r: Result<Record, Error>, notes: &mut Vec<String>| match r {
        Ok(r) => recs.push(r),
        Err(e) => notes.push(format!("{what}: {e}")),
    };
    if installed("iperf3") {
        for udp in [false, true] {
            let what = format!("iperf3{}", if udp { " -u" } else { "" });
            eprintln!("external: {what}");
            keep(what, iperf3(secs, udp), &mut notes);
        }
    } else {
        notes.push("iperf3 is not installed: its rows are skipped".into());
    }
    if installed("sockperf") {
        for tcp in [true, false] {
            let what = format!("sockperf ping-pong{}", if tcp { " --tcp" } else { "" });
            eprintln!("external: {what}");
            keep(what, sockperf(secs, tcp, lat_cpu), &mut notes);
        }
    } else {
        notes.push("sockperf is not installed: its rows are skipped".into());
    }
    if installed("ucx_perftest") {
        for t in Ucx::ALL {
            let what = format!("ucx_perftest -t {}", t.name());
            eprintln!("external: {what}");
            keep(what, ucx(secs, t, lat_cpu), &mut notes);
        }
    } else {
        notes.push(
            "ucx_perftest is not installed (Debian package ucx-utils): its rows are skipped".into(),
        );
    }
    if installed("fi_pingpong") {
        for size in [8, 64 << 10] {
            let what = format!("fi_pingpong -p tcp -S {size}");
            eprintln!("external: {what}");
            keep(what, libfabric(secs, size, lat_cpu), &mut notes);
        }
    } else {
        notes.push(
            "fi_pingpong is not installed (Debian package libfabric-bin): its rows are skipped"
                .into(),
        );
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

    /// `UCX_TLS=tcp UCX_NET_DEVICES=lo ucx_perftest 127.0.0.1 -p P -t
    /// ucp_put_lat -s 8 -n 20000 -w 1000` (UCX 1.13.1, Debian 12), with two
    /// progress lines before the final one.
    const UCX_PUT_LAT: &str = "\
+--------------+--------------+------------------------------+---------------------+-----------------------+
|              |              |        latency (usec)        |   bandwidth (MB/s)  |  message rate (msg/s) |
+--------------+--------------+----------+---------+---------+----------+----------+-----------+-----------+
|    Stage     | # iterations | 50.0%ile | average | overall |  average |  overall |  average  |  overall  |
+--------------+--------------+----------+---------+---------+----------+----------+-----------+-----------+
[thread 0]             18558     11.023    26.970    26.970        0.28       0.28       37078       37078
[thread 0]             18677     11.048  4205.026    53.591        0.00       0.14         238       18660
Final:                 20000     11.133   179.423    61.914        0.04       0.12        5573       16151
";

    /// `... -t tag_bw -s 1048576 -n 2000` (same machine).
    const UCX_TAG_BW: &str = "\
+--------------+--------------+------------------------------+---------------------+-----------------------+
|              |              |       overhead (usec)        |   bandwidth (MB/s)  |  message rate (msg/s) |
+--------------+--------------+----------+---------+---------+----------+----------+-----------+-----------+
|    Stage     | # iterations | 50.0%ile | average | overall |  average |  overall |  average  |  overall  |
+--------------+--------------+----------+---------+---------+----------+----------+-----------+-----------+
Final:                  2000      5.039   160.210   160.210     6241.79    6241.79        6242        6242
";

    /// `fi_pingpong -p tcp -e msg -d lo -P P -S 8 -I 5000 127.0.0.1`
    /// (libfabric 1.17.0, Debian 12).
    const FI_8: &str = "\
bytes   #sent   #ack     total       time     MB/sec    usec/xfer   Mxfers/sec
8       5k      =5k      78k         0.05s      1.46       5.47       0.18
";

    /// The same with `-S 65536`.
    const FI_64K: &str = "\
bytes   #sent   #ack     total       time     MB/sec    usec/xfer   Mxfers/sec
64k     5k      =5k      625m        1.05s    622.04     105.36       0.01
";

    #[test]
    fn ucx_final_line() {
        let f = parse_ucx(UCX_PUT_LAT).unwrap();
        assert_eq!(
            f,
            UcxFinal {
                iters: 20000,
                median_us: 11.133,
                overall_us: 61.914,
                overall_mb_s: 0.12,
                overall_msg_s: 16151.0,
            }
        );
        let b = parse_ucx(UCX_TAG_BW).unwrap();
        assert_eq!((b.iters, b.overall_mb_s), (2000, 6241.79));
        // No final line (killed, or an error), or another percentile rank.
        let cut: String = UCX_PUT_LAT.lines().take(7).collect::<Vec<_>>().join("\n");
        assert_eq!(parse_ucx(&cut), None);
        assert_eq!(
            parse_ucx(&UCX_PUT_LAT.replace("50.0%ile", "99.0%ile")),
            None
        );
        assert_eq!(parse_ucx("Final: 1 2 3"), None);
    }

    #[test]
    fn ucx_rows_keep_only_what_the_tool_reports() {
        let f = parse_ucx(UCX_PUT_LAT).unwrap();
        let r = ucx_record(Ucx::PutLat, &f, (Some(0), Some(1)));
        assert_eq!((r.test.as_str(), r.transport.as_str()), ("lat", "ucx-put"));
        assert_eq!((r.size, r.round_trips, r.bytes), (8, 20000, 2 * 20000 * 8));
        assert_eq!(r.busy_poll_us, SPINS);
        let p = r.one_way_us.clone().unwrap();
        assert_eq!((p.p50, p.mean), (Some(11.133), 61.914));
        assert_eq!((p.p99, p.p999, p.min, p.max), (None, None, None, None));
        assert_eq!(r.merit(), Some((11.133, false)));
        assert!(r.ok && r.notes[0].contains("last 2048 iterations"));
        assert!((r.elapsed_s - 20000.0 * 61.914 * 2e-6).abs() < 1e-9);
        let b = ucx_record(Ucx::TagBw, &parse_ucx(UCX_TAG_BW).unwrap(), (None, None));
        assert_eq!(
            (b.test.as_str(), b.size, b.busy_poll_us),
            ("bw", 1 << 20, 0)
        );
        let g = b.gbps.unwrap();
        assert!((g - 6241.79 * 1048576.0 / 1e9).abs() < 1e-9, "{g}");
        assert!(b.ok && b.one_way_us.is_none());
    }

    #[test]
    fn fi_pingpong_rows() {
        assert_eq!(
            parse_fi(FI_8),
            Some(FiRow {
                size: 8,
                mb_s: 1.46,
                usec_per_xfer: 5.47
            })
        );
        let big = parse_fi(FI_64K).unwrap();
        assert_eq!((big.size, big.usec_per_xfer), (65536, 105.36));
        assert_eq!(fi_size("1m"), Some(1 << 20));
        assert_eq!(fi_size("x"), None);
        // Messages not all acknowledged, or no table at all.
        assert_eq!(parse_fi(&FI_8.replace("=5k", "4k")), None);
        assert_eq!(parse_fi("fi_getinfo(): -61 (No data available)\n"), None);
        let r = fi_record(&big, 5000, (Some(0), Some(1)));
        let p = r.one_way_us.clone().unwrap();
        assert_eq!((p.p50, p.p99, p.mean), (None, None, 105.36));
        assert!(r.merit_is_mean() && r.series().ends_with("(mean)"));
        assert_eq!(r.merit(), Some((105.36, false)));
        assert_eq!((r.round_trips, r.busy_poll_us), (5000, SPINS));
        assert!(r.ok && r.notes[0].contains("no percentiles"));
    }

    #[test]
    fn the_environment_reaches_the_peer() {
        let ok = output(
            &strings(&["sh", "-c", "echo \"$UCX_TLS\""]),
            &UCX_ENV,
            limit(1.0),
        )
        .unwrap();
        assert_eq!(ok.trim(), "tcp");
        assert!(Ucx::PutLat.iters(0.05) >= 4096);
        assert_eq!(Ucx::TagBw.iters(1.0), 4000);
    }
}
