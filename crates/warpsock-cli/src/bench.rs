//! `warpsock bench` and `warpsock client`: run the plan of tests against a
//! server — a `warpsock server --once` child process on 127.0.0.1 (same
//! binary), a remote one, or one in a network namespace — and print the
//! comparison.
//!
//! The UDP offload rows need the preload library in both processes, so
//! they run as a second pass: a preloaded server and a preloaded
//! `warpsock client` in child processes, whose JSON is merged in.

use std::io::{BufRead, BufReader, IsTerminal};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use serde_json::{json, Value};

use crate::ctl::{encode_spec, Ctl, SideReport, VERSION};
use crate::opts::{parse_host_port, BenchOpts, PinArg, Spec, Test, Transport, DEFAULT_PORT};
use crate::report::{self, Record, RunResult};
use crate::tcp::IDLE;
use crate::work::{run_threads, Cpu, Gate, Job, Stats};
use crate::{external, iwarp, netns, pin, tcp, udp, Error, Run};

/// How long the control connection may take to open.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

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
    #[arg(long, value_parser = netns::parse_rate, value_name = "RATE", requires = "netns")]
    rate: Option<u64>,
    /// With --netns: drop this percentage of packets each way at random
    /// (nftables numgen), 0 to 50.
    #[arg(long, value_parser = netns::parse_loss, value_name = "PERCENT", requires = "netns")]
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

/// A `warpsock server --once` child process; killed by pid if it has not
/// exited when this is dropped.
pub(crate) struct ChildServer {
    child: Child,
    /// Its control address.
    pub(crate) addr: SocketAddr,
}

impl ChildServer {
    /// Starts `[prefix...] warpsock server --once --bind BIND` with extra
    /// environment `env`, on `port` (default: free ports).
    pub(crate) fn start(
        prefix: &[String],
        env: &[(String, String)],
        bind: &str,
        port: Option<u16>,
    ) -> Result<Self, Error> {
        let exe = std::env::current_exe()?;
        let mut cmd = match prefix.split_first() {
            Some((p, rest)) => {
                let mut c = Command::new(p);
                c.args(rest).arg(&exe);
                c
            }
            None => Command::new(&exe),
        };
        cmd.args(["server", "--once", "--bind", bind]);
        match port {
            Some(p) => cmd.args(["--port", &p.to_string()]),
            None => cmd.args(["--port", "0", "--data-port", "0"]),
        };
        cmd.envs(env.iter().map(|(k, v)| (k, v)));
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| Error::msg(format!("cannot start the server: {e}")))?;
        let stdout = child.stdout.take().expect("piped");
        let mut line = String::new();
        let _ = BufReader::new(stdout).read_line(&mut line);
        let addr = line
            .split_whitespace()
            .find_map(|w| w.strip_prefix("control="))
            .and_then(|a| a.parse().ok());
        let mut me = Self {
            child,
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
        };
        match addr {
            Some(a) => {
                me.addr = a;
                Ok(me)
            }
            None => Err(Error::msg(
                "the server did not start (see its message above)",
            )),
        }
    }

    /// Waits for the child to exit (briefly if the run failed), then kills
    /// it by pid if it is still there.
    pub(crate) fn finish(mut self, ok: bool) {
        let limit = if ok { 5 } else { 0 };
        let end = Instant::now() + Duration::from_secs(limit);
        while Instant::now() < end {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for ChildServer {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Runs `[prefix...] warpsock client ADDR ARGS --json FILE` to completion
/// (its progress on our stderr, its table on our stdout if `show`), and
/// reads its results.
pub(crate) fn child_client(
    prefix: &[String],
    env: &[(String, String)],
    addr: SocketAddr,
    args: &[String],
    show: bool,
) -> Result<(Value, Vec<Record>), Error> {
    let exe = std::env::current_exe()?;
    let json = std::env::temp_dir().join(format!(
        "warpsock-pass-{}-{}.json",
        std::process::id(),
        addr.port()
    ));
    let mut cmd = match prefix.split_first() {
        Some((p, rest)) => {
            let mut c = Command::new(p);
            c.args(rest).arg(&exe);
            c
        }
        None => Command::new(&exe),
    };
    cmd.arg("client")
        .arg(addr.to_string())
        .args(args)
        .arg("--json")
        .arg(&json)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(if show {
            Stdio::inherit()
        } else {
            Stdio::null()
        });
    let st = cmd
        .status()
        .map_err(|e| Error::msg(format!("cannot start the client: {e}")))?;
    let text = std::fs::read_to_string(&json);
    let _ = std::fs::remove_file(&json);
    // A pass whose data failed verification still wrote its results: they
    // are kept (marked not ok) and the whole run fails at the end.
    let text = match (text, st.success()) {
        (Ok(t), _) => t,
        (Err(_), false) => {
            return Err(Error::msg(format!(
                "the client pass failed ({st}; see its message above)"
            )))
        }
        (Err(e), true) => return Err(Error::msg(format!("the client pass wrote no results: {e}"))),
    };
    report::from_json(&text).map_err(|e| Error::msg(format!("the client pass's results: {e}")))
}

/// The preload library: `WARPSOCK_PRELOAD_LIB`, else next to this
/// executable (same target directory), if it was built.
pub(crate) fn preload_lib() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("WARPSOCK_PRELOAD_LIB") {
        return Some(PathBuf::from(p)).filter(|p| p.exists());
    }
    let exe = std::env::current_exe().ok()?;
    let dir = exe.parent()?;
    [
        dir.join("libwarpsock_preload.so"),
        dir.join("deps/libwarpsock_preload.so"),
    ]
    .into_iter()
    .find(|p| p.exists())
}

/// Whether this process runs under the UDP offload layer.
fn under_preload() -> bool {
    std::env::var("LD_PRELOAD").is_ok_and(|v| v.contains("warpsock_preload"))
        && std::env::var("WARPSOCK_UDP_OFFLOAD").is_ok_and(|v| v == "1")
}

/// Environment of a preloaded process.
pub(crate) fn preload_env(lib: &Path) -> Vec<(String, String)> {
    vec![
        ("LD_PRELOAD".into(), lib.display().to_string()),
        ("WARPSOCK_UDP_OFFLOAD".into(), "1".into()),
    ]
}

/// Opens the control connection: each resolved address in turn, with a
/// one-line error naming the address and the reason.
fn connect_ctl(host: &str, port: u16) -> Result<TcpStream, Error> {
    let addrs: Vec<SocketAddr> = (host, port)
        .to_socket_addrs()
        .map_err(|e| Error::msg(format!("cannot resolve '{host}': {e}")))?
        .collect();
    let mut last = Error::msg(format!("'{host}' resolves to no address"));
    for a in addrs {
        match TcpStream::connect_timeout(&a, CONNECT_TIMEOUT) {
            Ok(s) => return Ok(s),
            Err(e) => {
                let why = match e.raw_os_error() {
                    Some(libc::ECONNREFUSED) => {
                        "connection refused (is `warpsock server` running there?)".to_string()
                    }
                    Some(libc::EHOSTUNREACH | libc::ENETUNREACH) => format!("unreachable ({e})"),
                    _ if e.kind() == std::io::ErrorKind::TimedOut => {
                        format!("no answer within {} s", CONNECT_TIMEOUT.as_secs())
                    }
                    _ => e.to_string(),
                };
                last = Error::msg(format!("cannot connect to {a}: {why}"));
            }
        }
    }
    Err(last)
}

/// What the server said in its hello.
struct Session {
    ctl: Ctl,
    ctl_addr: SocketAddr,
    data_addr: SocketAddr,
    token: u64,
    server_cpus: usize,
    /// The server kernel's boot id, if it said.
    server_boot: Option<String>,
}

/// This kernel's boot id (`/proc/sys/kernel/random/boot_id`): the same in
/// every network namespace of one machine, different across machines.
pub(crate) fn boot_id() -> Option<String> {
    let id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
    let id = id.trim();
    (!id.is_empty() && id.chars().all(|c| c.is_ascii_hexdigit() || c == '-'))
        .then(|| id.to_string())
}

fn open_session(host: &str, port: u16) -> Result<Session, Error> {
    let s = connect_ctl(host, port)?;
    let ctl_addr = s.peer_addr()?;
    let mut ctl = Ctl::new(s)?;
    ctl.send(&format!("hello warpsock-bench={VERSION}"))?;
    let h = ctl
        .recv(Some(Duration::from_secs(10)))
        .map_err(|e| e.context(format!("{ctl_addr} is not answering as a warpsock server")))?
        .expect("hello")?;
    let token = u64::from_str_radix(h.get("token")?, 16)
        .map_err(|_| Error::msg("protocol error: bad token"))?;
    let data_port: u16 = h.num("data-port")?;
    Ok(Session {
        ctl,
        ctl_addr,
        data_addr: SocketAddr::new(ctl_addr.ip(), data_port),
        token,
        server_cpus: h.num("cpus")?,
        server_boot: h.get("boot").ok().map(str::to_string),
    })
}

pub(crate) fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into())
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
fn utc(secs: u64) -> String {
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
            x.transport_kind().map_or(99, |t| t as usize),
            x.crc,
        )
    });
}

/// Runs every planned test against the server at `host:port`, prints the
/// tables and writes the files asked for.
fn bench(host: &str, port: u16, opts: &BenchOpts, mode: Mode) -> Result<(), Error> {
    let mut sess = open_session(host, port)?;
    let ccpus = pin::cpu_count();
    let lib = preload_lib();
    let offload_here = under_preload();
    // One machine when on loopback, or when the server's kernel is ours
    // (another network namespace, e.g. `--netns`): then automatic pinning
    // keeps busy-polling sides on different CPUs.
    let same_host = mode == Mode::Loopback
        || sess.ctl_addr.ip().is_loopback()
        || sess.server_boot.is_some() && sess.server_boot == boot_id();
    let full_plan = opts.plan(
        (ccpus, sess.server_cpus),
        same_host,
        lib.is_some() || offload_here,
    );
    if let PinArg::Cpus(_, b) = opts.pin {
        if b >= sess.server_cpus {
            return Err(Error::msg(format!(
                "--pin: the server has no CPU {b} (it has CPUs 0 to {})",
                sess.server_cpus - 1
            )));
        }
    }
    // UDP offload rows need the preload on both sides: here only if this
    // process has it; else a second, preloaded pass on loopback.
    let (plan, offload_pass): (Vec<Spec>, bool) = if offload_here {
        (full_plan, false)
    } else {
        let wants = full_plan
            .iter()
            .any(|s| s.transport == Transport::UdpOffload);
        let rest = full_plan
            .into_iter()
            .filter(|s| s.transport != Transport::UdpOffload)
            .collect();
        (rest, wants)
    };
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
    if offload_pass {
        match (&lib, mode) {
            (Some(lib), Mode::Loopback) => {
                eprintln!("UDP offload pass: preloaded server and client ({})", lib.display());
                let env = preload_env(lib);
                let server = ChildServer::start(&[], &env, "127.0.0.1", None)?;
                let res = child_client(
                    &[],
                    &env,
                    server.addr,
                    &opts.to_args(&[Transport::UdpOffload]),
                    false,
                );
                server.finish(res.is_ok());
                records.extend(res?.1);
            }
            (None, _) => notes.push(
                "udp-offload skipped: libwarpsock_preload.so is not built next to this binary \
                 (cargo build --release -p warpsock-preload)"
                    .to_string(),
            ),
            (Some(_), Mode::Remote) => notes.push(
                "udp-offload skipped: against a remote server, run server and client under \
                 LD_PRELOAD=libwarpsock_preload.so WARPSOCK_UDP_OFFLOAD=1 with --transports udp-offload"
                    .to_string(),
            ),
        }
    }
    if opts.external {
        if mode == Mode::Loopback {
            let secs = match opts.budget() {
                crate::opts::Budget::Time(d) => d.as_secs_f64(),
                crate::opts::Budget::Iters(_) => 1.0,
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
        crate::opts::Budget::Time(d) => format!("{:.2} s per test", d.as_secs_f64()),
        crate::opts::Budget::Iters(n) => format!("{n} iterations per test and connection"),
    };
    println!(
        "warpsock bench: {target}; {} CPUs ({}); progress={}; {per_test}",
        ccpus,
        cpu_model(),
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
        "cpu_model": cpu_model(),
        "budget": match opts.budget() {
            crate::opts::Budget::Time(d) => json!({"seconds": d.as_secs_f64()}),
            crate::opts::Budget::Iters(n) => json!({"iterations": n}),
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

fn client_side(sess: &Session, spec: &Spec, tick: &(dyn Fn(f64) + Sync)) -> Result<Stats, Error> {
    let (role, _) = spec.roles();
    let epoch = Instant::now();
    let noop = |_: f64| {};
    let job0 = Job {
        spec,
        role,
        epoch,
        tick,
    };
    let (ctl_addr, data_addr, token) = (sess.ctl_addr, sess.data_addr, sess.token);
    if spec.test == Test::Conn {
        return match spec.transport {
            Transport::Tcp => tcp::conn_client(&job0, ctl_addr, token),
            _ => iwarp::conn_client(&job0, data_addr, token),
        };
    }
    let gate = Gate::new(spec.conns);
    let gate = &gate;
    run_threads((0..spec.conns).collect(), |i, _| {
        let job = Job {
            tick: if i == 0 { tick } else { &noop },
            ..job0
        };
        match spec.transport {
            Transport::Tcp => {
                let s = gate.pass(tcp::connect(ctl_addr, token))?;
                tcp::run(&job, vec![s])
            }
            Transport::Udp | Transport::UdpOffload => {
                let f = gate.pass(udp::connect(ctl_addr, token))?;
                udp::run(&job, vec![f])
            }
            _ => {
                let (mut g, p) = gate.pass(iwarp::connect_one(data_addr, token, spec, role))?;
                iwarp::run(&job, &mut g, vec![p])
            }
        }
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
