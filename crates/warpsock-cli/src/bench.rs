//! `warpsock bench` and `warpsock client`: run the plan of tests against a
//! server — a `warpsock server --once` child process on 127.0.0.1 (same
//! binary), or a remote one — and print the comparison.

use std::io::{BufRead, BufReader, IsTerminal};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use serde_json::json;

use crate::ctl::{encode_spec, Ctl, Tally, VERSION};
use crate::meter::Meter;
use crate::opts::{parse_host_port, BenchOpts, PinArg, Spec, Test, Transport, DEFAULT_PORT};
use crate::report::{self, RunResult};
use crate::tcp::IDLE;
use crate::{iwarp, pin, tcp, Error, Run};

/// How long the control connection may take to open.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// `warpsock bench` options.
#[derive(Debug, clap::Args)]
pub(crate) struct BenchCmd {
    /// Run against a `warpsock server` at HOST or HOST:PORT instead of a
    /// loopback server in a child process.
    #[arg(long, value_name = "HOST[:PORT]", value_parser = parse_host_port)]
    peer: Option<(String, Option<u16>)>,
    /// Control port: of the loopback server (default: a free port; the
    /// data port is the next one), or of --peer when it names none
    /// (default 18515).
    #[arg(long)]
    port: Option<u16>,
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
        match self.peer {
            Some((host, port)) => {
                let port = port.or(self.port).unwrap_or(DEFAULT_PORT);
                bench(&host, port, &self.opts, false)
            }
            None => {
                let server = LoopbackServer::start(self.port)?;
                let port = server.addr.port();
                let res = bench("127.0.0.1", port, &self.opts, true);
                server.finish(res.is_ok());
                res
            }
        }
    }
}

impl Run for ClientCmd {
    fn run(self) -> Result<(), Error> {
        let (host, port) = self.server;
        bench(&host, port.unwrap_or(DEFAULT_PORT), &self.opts, false)
    }
}

/// `warpsock server --once` on 127.0.0.1 in a child process; killed by pid
/// if it has not exited when this is dropped.
struct LoopbackServer {
    child: Child,
    addr: SocketAddr,
}

impl LoopbackServer {
    fn start(port: Option<u16>) -> Result<Self, Error> {
        let exe = std::env::current_exe()?;
        let mut cmd = Command::new(exe);
        cmd.args(["server", "--once", "--bind", "127.0.0.1"]);
        match port {
            Some(p) => cmd.args(["--port", &p.to_string()]),
            None => cmd.args(["--port", "0", "--data-port", "0"]),
        };
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| Error::msg(format!("cannot start the loopback server: {e}")))?;
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
                "the loopback server did not start (see its message above)",
            )),
        }
    }

    /// Waits for the child to exit (briefly if the run failed), then kills
    /// it by pid if it is still there.
    fn finish(mut self, ok: bool) {
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

impl Drop for LoopbackServer {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
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
    })
}

fn cpu_model() -> String {
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

fn placement(plan: &[Spec], test: Test) -> Option<String> {
    let s = plan.iter().find(|s| s.test == test)?;
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

/// Runs every planned test against the server at `host:port`.
fn bench(host: &str, port: u16, opts: &BenchOpts, loopback: bool) -> Result<(), Error> {
    let mut sess = open_session(host, port)?;
    let ccpus = pin::cpu_count();
    let plan = opts.plan(
        (ccpus, sess.server_cpus),
        loopback || sess.ctl_addr.ip().is_loopback(),
    );
    if let PinArg::Cpus(_, b) = opts.pin {
        if b >= sess.server_cpus {
            return Err(Error::msg(format!(
                "--pin: the server has no CPU {b} (it has CPUs 0 to {})",
                sess.server_cpus - 1
            )));
        }
    }
    let budget = opts.budget();
    let tty = std::io::stderr().is_terminal();
    let bar = ProgressBar::new(plan.len() as u64 * 1000);
    bar.set_style(
        ProgressStyle::with_template("{prefix:>7} [{bar:32}] {msg}  ({elapsed}, ~{eta} left)")
            .expect("valid template")
            .progress_chars("=> "),
    );
    let started = std::time::SystemTime::now();
    let mut results = Vec::with_capacity(plan.len());
    for (i, spec) in plan.iter().enumerate() {
        bar.set_prefix(format!("{}/{}", i + 1, plan.len()));
        bar.set_message(spec.label());
        bar.set_position(i as u64 * 1000);
        if !tty {
            eprintln!("[{}/{}] {}", i + 1, plan.len(), spec.label());
        }
        let tick = |f: f64| bar.set_position(i as u64 * 1000 + (f * 1000.0) as u64);
        let r = run_one(&mut sess, spec, budget, &tick);
        pin::pin(None)?;
        match r {
            Ok(r) => results.push(r),
            Err(e) => {
                bar.abandon();
                return Err(e.context(spec.label()));
            }
        }
    }
    bar.finish_and_clear();
    let _ = sess.ctl.send("bye");

    let target = if loopback {
        "loopback 127.0.0.1 (server in a child process)".to_string()
    } else {
        format!("server {}", sess.ctl_addr)
    };
    let per_test = match budget {
        crate::opts::Budget::Time(d) => format!("{:.1} s per test", d.as_secs_f64()),
        crate::opts::Budget::Iters(n) => format!("{n} iterations per test"),
    };
    println!(
        "warpsock bench: {target}; {} CPUs ({}); progress={}{}; {per_test}",
        ccpus,
        cpu_model(),
        opts.progress.name(),
        opts.busy_poll
            .map_or(String::new(), |us| format!(", busy-poll {us} µs"))
    );
    for (t, name) in [(Test::Lat, "latency"), (Test::Bw, "bandwidth")] {
        if let Some(p) = placement(&plan, t) {
            println!("CPU placement, {name}: {p}");
        }
    }
    println!();
    print!("{}", report::table(&results));
    println!();
    println!(
        "Write latency is RDMA Write + a zero-byte Send to notify the target. \
         check: every received byte counted and its contents verified."
    );

    if let Some(path) = &opts.json {
        let meta = json!({
            "tool": "warpsock bench",
            "version": env!("CARGO_PKG_VERSION"),
            "target": target,
            "server": sess.ctl_addr.to_string(),
            "started_unix_s": started
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0),
            "cpus": ccpus,
            "server_cpus": sess.server_cpus,
            "cpu_model": cpu_model(),
            "budget": match budget {
                crate::opts::Budget::Time(d) => json!({"seconds": d.as_secs_f64()}),
                crate::opts::Budget::Iters(n) => json!({"iterations": n}),
            },
            "progress": opts.progress.name(),
            "busy_poll_us": opts.busy_poll,
            "pin": opts.pin.to_string(),
            "verify_every_byte": opts.verify,
        });
        let doc = report::to_json(meta, &results);
        let text = serde_json::to_string_pretty(&doc).expect("JSON values serialize");
        std::fs::write(path, text + "\n")
            .map_err(|e| Error::msg(format!("cannot write {}: {e}", path.display())))?;
        println!("Every sample and result: {}", path.display());
    }
    let bad: Vec<String> = results
        .iter()
        .filter(|r| !r.ok())
        .map(|r| r.spec.label())
        .collect();
    if !bad.is_empty() {
        return Err(Error::msg(format!(
            "data verification failed: {}",
            bad.join("; ")
        )));
    }
    Ok(())
}

/// One test: announce it, wait for `ready`, run the client side, collect
/// the server's tally.
fn run_one(
    sess: &mut Session,
    spec: &Spec,
    budget: crate::opts::Budget,
    tick: &dyn Fn(f64),
) -> Result<RunResult, Error> {
    pin::pin(spec.client_pin)?;
    sess.ctl.send(&encode_spec(spec))?;
    sess.ctl
        .recv(Some(Duration::from_secs(30)))?
        .expect("ready")?;
    let mut meter = Meter::new(budget, spec.test == Test::Lat, tick);
    let res = match spec.transport {
        Transport::Tcp => tcp::client(sess.ctl_addr, sess.token, spec, &mut meter),
        _ => iwarp::client(sess.data_addr, sess.token, spec, &mut meter),
    };
    let out = match res {
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
    let server = Tally::decode(
        &sess
            .ctl
            .recv(Some(IDLE + Duration::from_secs(10)))?
            .expect("result")?,
    )?;
    Ok(RunResult {
        spec: spec.clone(),
        out,
        server,
    })
}
