//! `warpsock bench` and `warpsock client`: run the plan of tests against a
//! server — a `warpsock server --once` child process on 127.0.0.1 (same
//! binary), a remote one, or one in a network namespace — and print the
//! comparison.
//!
//! The UDP offload rows need the preload library in both processes, so
//! they run as a second pass: a preloaded server and a preloaded
//! `warpsock client` in child processes, whose JSON is merged in.

mod apps;
mod external;
mod netns;
mod passes;
mod session;

use std::io::IsTerminal;
use std::path::Path;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use serde_json::{json, Value};

use crate::ctl::{encode_spec, SideReport};
use crate::driver::{self, run_threads, Gate, Job, IDLE};
use crate::opts::BenchOpts;
use crate::parse::{parse_host_port, parse_loss, parse_rate};
use crate::report::{self, Record, RunResult};
use crate::spec::{Budget, PinArg, Spec, SuiteKind, Test, DEFAULT_PORT};
use crate::stats::{Cpu, Stats};
use crate::{pin, transports, Error, Run};
use passes::{child_client, preload_env, preload_lib, ChildServer};
use session::{open_session, Session};

/// `warpsock bench` options.
#[derive(Debug, clap::Args)]
pub(crate) struct BenchCmd {
    /// Run against a `warpsock server` at HOST or HOST:PORT instead of a
    /// loopback server in a child process.
    #[arg(long, value_name = "HOST[:PORT]", value_parser = parse_host_port, conflicts_with = "netns")]
    peer: Option<(String, Option<u16>)>,
    /// Control port: of the loopback server (default: a free port; the
    /// data port is the next one), or of --peer when it names none
    /// (default 18515).
    #[arg(long)]
    port: Option<u16>,
    /// Run server and client in two network namespaces joined by a veth
    /// pair (10.x addresses), created for the run and removed afterwards.
    /// Needs root.
    #[arg(long)]
    netns: bool,
    /// With --netns: limit the link to RATE (tc tbf), e.g. 1gbit, 500mbit
    /// (1 mbit to 100 gbit).
    #[arg(long, value_parser = parse_rate, value_name = "RATE", requires = "netns")]
    rate: Option<u64>,
    /// With --netns: drop this percentage of packets each way at random
    /// (nftables numgen), 0 to 50.
    #[arg(long, value_parser = parse_loss, value_name = "PERCENT", requires = "netns")]
    loss: Option<f64>,
    #[command(flatten)]
    opts: BenchOpts,
}

/// `warpsock client` options.
#[derive(Debug, clap::Args)]
pub(crate) struct ClientCmd {
    /// The server: HOST or HOST:PORT (default port 18515; IPv6 with a port
    /// in brackets, e.g. `[::1]:18515`).
    #[arg(value_name = "HOST[:PORT]", value_parser = parse_host_port)]
    server: (String, Option<u16>),
    #[command(flatten)]
    opts: BenchOpts,
}

impl Run for BenchCmd {
    fn run(self) -> Result<(), Error> {
        if self.opts.suite == SuiteKind::Apps {
            if self.peer.is_some() {
                return Err(Error::msg(
                    "--suite apps starts its programs itself: on loopback, or with --netns",
                ));
            }
            return apps::run(&self.opts, self.netns.then_some((self.rate, self.loss)));
        }
        if self.netns {
            return netns::bench(&self.opts, self.rate, self.loss);
        }
        match self.peer {
            Some((host, port)) => {
                let port = port.or(self.port).unwrap_or(DEFAULT_PORT);
                bench(&host, port, &self.opts, Mode::Remote)
            }
            None => {
                let server = ChildServer::start(&[], &[], "127.0.0.1", self.port)?;
                let port = server.addr.port();
                let res = bench("127.0.0.1", port, &self.opts, Mode::Loopback);
                server.finish(res.is_ok());
                res
            }
        }
    }
}

impl Run for ClientCmd {
    fn run(self) -> Result<(), Error> {
        let (host, port) = self.server;
        bench(
            &host,
            port.unwrap_or(DEFAULT_PORT),
            &self.opts,
            Mode::Remote,
        )
    }
}

/// Where the server runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// A child process on 127.0.0.1 (the offload pass can run too).
    Loopback,
    /// Elsewhere.
    Remote,
}

fn placement(plan: &[Spec], f: impl Fn(&Spec) -> bool) -> Option<String> {
    let s = plan.iter().find(|s| f(s))?;
    Some(match (s.client_pin, s.pin) {
        (None, None) => "unpinned".into(),
        (Some(a), Some(b)) if a == b => format!("both sides on CPU {a}"),
        (a, b) => format!(
            "client on {}, server on {}",
            a.map_or("any CPU".into(), |c| format!("CPU {c}")),
            b.map_or("any CPU".into(), |c| format!("CPU {c}"))
        ),
    })
}

/// `YYYY-MM-DD HH:MM:SS UTC` of a Unix time.
pub(crate) fn utc(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Civil from days (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02} UTC",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

/// Orders records as the tables show them.
fn sort_records(r: &mut [Record]) {
    r.sort_by_key(|x| {
        (
            x.test_kind().map_or(99, |t| t as usize),
            x.busy_poll_us > 0,
            x.size,
            x.conns,
            x.transport_kind().map_or(usize::MAX, transports::rank),
            x.crc,
        )
    });
}

/// Runs every planned test against the server at `host:port`, prints the
/// tables and writes the files asked for.
fn bench(host: &str, port: u16, opts: &BenchOpts, mode: Mode) -> Result<(), Error> {
    let mut sess = open_session(host, port, opts.token.as_deref())?;
    let ccpus = pin::cpu_count();
    let lib = preload_lib();
    // One machine when on loopback, or when the server's kernel is ours
    // (another network namespace, e.g. `--netns`): then automatic pinning
    // keeps busy-polling sides on different CPUs.
    let same_host = mode == Mode::Loopback
        || sess.ctl_addr.ip().is_loopback()
        || sess.server_boot.is_some() && sess.server_boot == pin::boot_id();
    let full_plan = opts.plan(
        (ccpus, sess.server_cpus),
        same_host,
        lib.is_some() || passes::running_under(&[]),
    );
    if let PinArg::Cpus(_, b) = opts.pin {
        if b >= sess.server_cpus {
            return Err(Error::msg(format!(
                "--pin: the server has no CPU {b} (it has CPUs 0 to {})",
                sess.server_cpus - 1
            )));
        }
    }
    // Transports that need the preload on both sides run here only if
    // this process has it; else in passes of preloaded child processes.
    let passes = passes::passes_needed(&full_plan);
    let plan: Vec<Spec> = full_plan
        .into_iter()
        .filter(|s| passes::runs_here(s.transport))
        .collect();
    let tty = std::io::stderr().is_terminal();
    let bar = ProgressBar::new(plan.len() as u64 * 1000);
    bar.set_style(
        ProgressStyle::with_template("{prefix:>9} [{bar:32}] {msg}  ({elapsed}, ~{eta} left)")
            .expect("valid template")
            .progress_chars("=> "),
    );
    let started = std::time::SystemTime::now();
    // With --repeat, whole rounds of the plan run one after the other (so
    // slow phases of a shared machine spread over every transport) and
    // each test keeps its median run.
    let rounds = opts.repeat;
    let total = plan.len() * rounds;
    let bar_len = total as u64 * 1000;
    bar.set_length(bar_len);
    let mut runs: Vec<Vec<RunResult>> = vec![Vec::with_capacity(rounds); plan.len()];
    let mut done: Vec<RunResult> = Vec::new();
    for round in 0..rounds {
        for (i, spec) in plan.iter().enumerate() {
            let k = round * plan.len() + i;
            let mut spec = spec.clone();
            if spec.test == Test::Cpu {
                spec.rate = cpu_rate(&done, &spec)?;
            }
            bar.set_prefix(format!("{}/{}", k + 1, total));
            bar.set_message(spec.label());
            bar.set_position(k as u64 * 1000);
            if !tty {
                eprintln!("[{}/{}] {}", k + 1, total, spec.label());
            }
            let tick = |f: f64| bar.set_position(k as u64 * 1000 + (f * 1000.0) as u64);
            let r = run_one(&mut sess, &spec, &tick);
            pin::pin(None)?;
            match r {
                Ok(r) => {
                    if round == 0 {
                        done.push(r.clone());
                    }
                    runs[i].push(r);
                }
                Err(e) => {
                    bar.abandon();
                    return Err(e.context(spec.label()));
                }
            }
        }
    }
    bar.finish_and_clear();
    let _ = sess.ctl.send("bye");
    let mut records: Vec<Record> = runs.iter().map(|rs| median_record(rs)).collect();
    let mut notes = Vec::new();
    for (vars, ts) in passes {
        let names: Vec<&str> = ts.iter().map(|t| t.name()).collect();
        let names = names.join(", ");
        match (&lib, mode) {
            (Some(lib), Mode::Loopback) => {
                eprintln!(
                    "{names} pass: preloaded server and client ({})",
                    lib.display()
                );
                let env = preload_env(lib, vars);
                let server = ChildServer::start(&[], &env, "127.0.0.1", None)?;
                let res = child_client(&[], &env, server.addr, &opts.to_args(&ts), false);
                server.finish(res.is_ok());
                let rows = res?.1;
                let missing = passes::missing_rows(&ts, &rows);
                if !missing.is_empty() {
                    return Err(Error::msg(format!(
                        "the preloaded pass ran no {} test: the client under \
                         LD_PRELOAD={} did not find the preload in its process \
                         (not a libwarpsock_preload.so, or it failed to load; see above)",
                        missing.join(", "),
                        lib.display()
                    )));
                }
                records.extend(rows);
            }
            (None, _) => notes.push(format!(
                "{names} skipped: libwarpsock_preload.so is not built next to this binary \
                 (cargo build --release -p warpsock-preload)"
            )),
            (Some(_), Mode::Remote) => {
                let vars: Vec<String> = vars.iter().map(|(k, v)| format!("{k}={v}")).collect();
                notes.push(format!(
                    "{names} skipped: against a remote server, run server and client under \
                     LD_PRELOAD=libwarpsock_preload.so {} with --transports {names}",
                    vars.join(" ")
                ));
            }
        }
    }
    if opts.external {
        if mode == Mode::Loopback {
            let secs = match opts.budget() {
                Budget::Time(d) => d.as_secs_f64(),
                Budget::Iters(_) => 1.0,
            };
            let lat_cpu = match opts.pin {
                PinArg::Auto => Some(ccpus - 1),
                PinArg::None => None,
                PinArg::Cpus(c, _) => Some(c),
            };
            let (r, n) = external::run(secs, lat_cpu);
            records.extend(r);
            notes.extend(n);
        } else {
            notes.push("--external runs its peers on loopback only".into());
        }
    }
    sort_records(&mut records);

    let target = match mode {
        Mode::Loopback => "loopback 127.0.0.1 (server in a child process)".to_string(),
        Mode::Remote => format!("server {}", sess.ctl_addr),
    };
    let per_test = match opts.budget() {
        Budget::Time(d) => format!("{:.2} s per test", d.as_secs_f64()),
        Budget::Iters(n) => format!("{n} iterations per test and connection"),
    };
    println!(
        "warpsock bench: {target}; {} CPUs ({}); progress={}; {per_test}",
        ccpus,
        pin::cpu_model(),
        opts.progress.name(),
    );
    if let Some(p) = placement(&plan, |s| s.test.is_latency() && s.busy_poll_us == 0) {
        println!("CPU placement, latency: {p}");
    }
    if let Some(p) = placement(&plan, |s| s.test.is_latency() && s.busy_poll_us > 0) {
        println!("CPU placement, latency with busy polling: {p}");
    }
    if let Some(p) = placement(&plan, |s| s.test.is_bandwidth()) {
        println!("CPU placement, bandwidth: {p}");
    }
    println!();
    print!("{}", report::tables(&records));
    println!();
    println!(
        "Write latency is RDMA Write + a zero-byte Send to notify the target. \
         check: every received byte counted and its contents verified."
    );
    for n in &notes {
        println!("note: {n}");
    }
    let meta = json!({
        "tool": "warpsock bench",
        "version": env!("CARGO_PKG_VERSION"),
        "command": std::env::args().collect::<Vec<_>>().join(" "),
        "target": target,
        "server": sess.ctl_addr.to_string(),
        "started_utc": utc(started
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0)),
        "cpus": ccpus,
        "server_cpus": sess.server_cpus,
        "cpu_model": pin::cpu_model(),
        "budget": match opts.budget() {
            Budget::Time(d) => json!({"seconds": d.as_secs_f64()}),
            Budget::Iters(n) => json!({"iterations": n}),
        },
        "progress": opts.progress.name(),
        "busy_poll_us": opts.busy_poll,
        "pin": opts.pin.to_string(),
        "verify_every_byte": opts.verify,
        "repeat": opts.repeat,
        "notes": notes,
    });
    write_outputs(opts, &meta, &records)?;
    fail_on_bad(&records)
}

/// The record of the median run (by figure of merit) of one test's
/// repeats, with the spread of the merit over all of them; a failed
/// repeat makes the record fail.
fn median_record(rs: &[RunResult]) -> Record {
    let mut recs: Vec<Record> = rs.iter().map(RunResult::record).collect();
    let all_ok = recs.iter().all(|r| r.ok);
    let merits: Vec<f64> = recs.iter().filter_map(|r| r.merit().map(|m| m.0)).collect();
    recs.sort_by(|a, b| {
        let m = |r: &Record| r.merit().map_or(f64::NAN, |m| m.0);
        m(a).total_cmp(&m(b))
    });
    let mut r = recs.swap_remove(recs.len() / 2);
    r.repeats = rs.len() as u64;
    if merits.len() > 1 {
        r.merit_min = merits.iter().copied().reduce(f64::min);
        r.merit_max = merits.iter().copied().reduce(f64::max);
    }
    r.ok = r.ok && all_ok;
    r
}

/// Writes --json and --csv.
pub(crate) fn write_outputs(
    opts: &BenchOpts,
    meta: &Value,
    records: &[Record],
) -> Result<(), Error> {
    let thinned;
    let records = match opts.max_samples {
        Some(m) => {
            let mut v = records.to_vec();
            report::thin(&mut v, m);
            thinned = v;
            &thinned[..]
        }
        None => records,
    };
    let write = |path: &Path, text: String| {
        std::fs::write(path, text)
            .map_err(|e| Error::msg(format!("cannot write {}: {e}", path.display())))
    };
    if let Some(path) = &opts.json {
        let doc = report::to_json(meta.clone(), records);
        write(
            path,
            serde_json::to_string_pretty(&doc).expect("JSON values serialize") + "\n",
        )?;
        println!("Every sample and result: {}", path.display());
    }
    if let Some(path) = &opts.csv {
        write(path, report::to_csv(records))?;
        println!("Every sample as CSV: {}", path.display());
    }
    Ok(())
}

/// Fails when any run's data did not check out.
pub(crate) fn fail_on_bad(records: &[Record]) -> Result<(), Error> {
    let bad: Vec<String> = records
        .iter()
        .filter(|r| !r.ok)
        .map(|r| format!("{} {} {} B N={}", r.test, r.series(), r.size, r.conns))
        .collect();
    if bad.is_empty() {
        Ok(())
    } else {
        Err(Error::msg(format!(
            "data verification failed: {}",
            bad.join("; ")
        )))
    }
}

/// The pace of a normalized-CPU run: 90 % of the slowest reliable
/// transport's unidirectional bandwidth at the same size in this run.
fn cpu_rate(done: &[RunResult], spec: &Spec) -> Result<u64, Error> {
    let min = done
        .iter()
        .filter(|r| {
            r.spec.test == Test::Bw && r.spec.size == spec.size && !r.spec.transport.is_udp()
        })
        .filter_map(|r| r.record().gbps)
        .fold(f64::INFINITY, f64::min);
    if !min.is_finite() || min <= 0.0 {
        return Err(Error::msg(
            "normalized CPU needs the bandwidth of the same size first (run it with --tests bw,cpu)",
        ));
    }
    Ok((min * 0.9 * 1e9) as u64)
}

/// One test: announce it, wait for `ready`, run the client side (one
/// thread per connection), collect the server's report.
fn run_one(
    sess: &mut Session,
    spec: &Spec,
    tick: &(dyn Fn(f64) + Sync),
) -> Result<RunResult, Error> {
    pin::pin(spec.client_pin)?;
    sess.ctl.send(&encode_spec(spec))?;
    sess.ctl
        .recv(Some(Duration::from_secs(30)))?
        .expect("ready")?;
    let cpu0 = Cpu::now();
    let res = client_side(sess, spec, tick);
    let client_cpu = Cpu::now().since(cpu0);
    let client = match res {
        Ok(o) => o,
        Err(e) => {
            // The server's view often says why (e.g. it saw a Terminate).
            let server = sess
                .ctl
                .recv(Some(Duration::from_secs(2)))
                .ok()
                .filter(|l| l.verb == "error")
                .map(|l| format!(" (server: {})", l.rest))
                .unwrap_or_default();
            return Err(Error::msg(format!("{e}{server}")));
        }
    };
    let server = SideReport::decode(
        &sess
            .ctl
            .recv(Some(IDLE + Duration::from_secs(10)))?
            .expect("result")?,
    )?;
    Ok(RunResult {
        spec: spec.clone(),
        client,
        client_cpu,
        server,
    })
}

/// The client's side of one test: one thread per connection (started
/// together), or the connection-setup loop.
fn client_side(sess: &Session, spec: &Spec, tick: &(dyn Fn(f64) + Sync)) -> Result<Stats, Error> {
    let (role, _) = spec.roles();
    let noop = |_: f64| {};
    let job0 = Job {
        spec,
        role,
        epoch: Instant::now(),
        tick,
    };
    let link = transports::link(spec.transport);
    let to = sess.addrs();
    if spec.test == Test::Conn {
        return link.setup_client(&job0, &to);
    }
    let gate = Gate::new(spec.conns);
    let gate = &gate;
    run_threads((0..spec.conns).collect(), |i, _| {
        let job = Job {
            tick: if i == 0 { tick } else { &noop },
            ..job0
        };
        let mut ep = gate.pass(link.connect(&job, &to))?;
        driver::run(&job, ep.as_mut())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_dates() {
        assert_eq!(utc(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(utc(951_782_400), "2000-02-29 00:00:00 UTC");
        assert_eq!(utc(1_700_000_000), "2023-11-14 22:13:20 UTC");
    }
}
