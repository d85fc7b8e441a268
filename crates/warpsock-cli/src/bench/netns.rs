//! `warpsock bench --netns`: two network namespaces joined by a veth pair,
//! the server in one and the client in the other, optionally with a rate
//! limit (tc tbf on both veth ends) and random loss (an nftables rule with
//! `numgen random` on both ends); everything this run created is removed
//! afterwards, by name, also when the run fails or is interrupted. Loss is
//! applied where packets arrive (the input hook of each namespace), so a
//! sender sees no error, as on a lossy wire.
//!
//! Names carry this process's id: namespaces `wsb<pid>s` / `wsb<pid>c`,
//! interfaces `wss<pid>` / `wsc<pid>`, addresses 10.213.N.1 (server) and
//! 10.213.N.2 (client), which exist only inside the two namespaces.

use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};

use super::passes::{self, child_client, preload_env, preload_lib, ChildServer, Env};
use super::{fail_on_bad, write_outputs};
use crate::child;
use crate::opts::BenchOpts;
use crate::report::{self, Record};
use crate::spec::{Transport, DEFAULT_PORT};
use crate::Error;

fn run_cmd(args: &[&str], stdin: Option<&str>) -> Result<(), Error> {
    let mut c = Command::new(args[0]);
    c.args(&args[1..])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        });
    let mut child = c
        .spawn()
        .map_err(|e| Error::msg(format!("cannot run {}: {e} (is it installed?)", args[0])))?;
    if let Some(text) = stdin {
        use std::io::Write;
        if let Some(mut i) = child.stdin.take() {
            i.write_all(text.as_bytes())?;
        }
    }
    let out = child.wait_with_output()?;
    if !out.status.success() {
        return Err(Error::msg(format!(
            "`{}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(())
}

/// Fails unless `prog` is installed.
fn need(prog: &str, package: &str) -> Result<(), Error> {
    if child::installed(prog) {
        Ok(())
    } else {
        Err(Error::msg(format!(
            "{prog} is not installed (Debian package {package}); --netns needs it"
        )))
    }
}

/// The namespaces of one run; removed (by name) when dropped.
pub(crate) struct Pair {
    /// Namespace of the server and of the client.
    pub(crate) ns: [String; 2],
    /// veth ends (server's, client's).
    pub(crate) dev: [String; 2],
    /// Addresses (server's, client's).
    pub(crate) ip: [String; 2],
    created: [bool; 2],
    rate: Option<u64>,
    loss: Option<f64>,
}

impl Pair {
    /// Creates both namespaces and the veth pair, with optional rate limit
    /// (bits/s) and loss (percent of the packets arriving on each side).
    pub(crate) fn create(rate: Option<u64>, loss: Option<f64>) -> Result<Self, Error> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Err(Error::msg(
                "--netns needs root (it creates network namespaces, a veth pair, tc qdiscs and \
                 nftables rules); run it as root, e.g. with sudo",
            ));
        }
        need("ip", "iproute2")?;
        if rate.is_some() {
            need("tc", "iproute2")?;
        }
        if loss.is_some_and(|l| l > 0.0) {
            need("nft", "nftables")?;
        }
        let pid = std::process::id();
        let net = pid % 250;
        let mut p = Self {
            ns: [format!("wsb{pid}s"), format!("wsb{pid}c")],
            dev: [format!("wss{pid}"), format!("wsc{pid}")],
            ip: [format!("10.213.{net}.1"), format!("10.213.{net}.2")],
            created: [false; 2],
            rate,
            loss,
        };
        for i in 0..2 {
            run_cmd(&["ip", "netns", "add", &p.ns[i]], None)?;
            p.created[i] = true;
        }
        run_cmd(
            &[
                "ip", "link", "add", &p.dev[0], "type", "veth", "peer", "name", &p.dev[1],
            ],
            None,
        )?;
        for i in 0..2 {
            let (ns, dev) = (&p.ns[i], &p.dev[i]);
            if let Err(e) = run_cmd(&["ip", "link", "set", dev, "netns", ns], None) {
                let _ = run_cmd(&["ip", "link", "del", &p.dev[0]], None);
                return Err(e);
            }
            run_cmd(
                &[
                    "ip",
                    "-n",
                    ns,
                    "addr",
                    "add",
                    &format!("{}/24", p.ip[i]),
                    "dev",
                    dev,
                ],
                None,
            )?;
            run_cmd(&["ip", "-n", ns, "link", "set", dev, "up"], None)?;
            run_cmd(&["ip", "-n", ns, "link", "set", "lo", "up"], None)?;
            if let Some(r) = rate {
                // Burst: 4 ms worth at the rate, at least 64 KiB.
                let burst = (r / 8 / 250).max(64 * 1024);
                run_cmd(
                    &[
                        "ip",
                        "netns",
                        "exec",
                        ns,
                        "tc",
                        "qdisc",
                        "add",
                        "dev",
                        dev,
                        "root",
                        "tbf",
                        "rate",
                        &format!("{r}bit"),
                        "burst",
                        &burst.to_string(),
                        "latency",
                        "50ms",
                    ],
                    None,
                )?;
            }
            if let Some(l) = loss.filter(|&l| l > 0.0) {
                let per_10k = (l * 100.0).round() as u64;
                let rules = format!(
                    "table inet warpsock_bench {{\n  chain in {{\n    type filter hook input priority 0; policy accept;\n    iifname \"{dev}\" numgen random mod 10000 < {per_10k} drop\n  }}\n}}\n"
                );
                run_cmd(&["ip", "netns", "exec", ns, "nft", "-f", "-"], Some(&rules))?;
            }
        }
        Ok(p)
    }

    /// The pair in one line (namespaces, addresses, rate, loss).
    pub(crate) fn describe(&self) -> String {
        format!(
            "network namespaces {} ({}) and {} ({}) joined by veth{}{}",
            self.ns[0],
            self.ip[0],
            self.ns[1],
            self.ip[1],
            self.rate.map_or(String::new(), |r| format!(
                ", tbf rate {} Mbit/s",
                r / 1_000_000
            )),
            self.loss
                .map_or(String::new(), |l| format!(", {l} % random loss each way")),
        )
    }

    /// `ip netns exec NS` for side `i` (0 server, 1 client).
    pub(crate) fn exec(&self, i: usize) -> Vec<String> {
        vec![
            "ip".into(),
            "netns".into(),
            "exec".into(),
            self.ns[i].clone(),
        ]
    }
}

impl Drop for Pair {
    fn drop(&mut self) {
        for i in 0..2 {
            if self.created[i] {
                let _ = run_cmd(&["ip", "netns", "del", &self.ns[i]], None);
            }
        }
    }
}

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

/// Whether Ctrl-C or SIGTERM arrived (after [`catch_signals`]).
pub(crate) fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::SeqCst)
}

extern "C" fn on_signal(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

/// Keeps this process alive on Ctrl-C / SIGTERM (the children, which
/// get the default action again when they exec, stop; the namespaces are
/// then removed on the way out).
pub(crate) fn catch_signals() {
    let h = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
    // SAFETY: installing an async-signal-safe handler (one atomic store).
    unsafe {
        libc::signal(libc::SIGINT, h);
        libc::signal(libc::SIGTERM, h);
    }
}

/// `warpsock bench --netns`.
pub(crate) fn bench(opts: &BenchOpts, rate: Option<u64>, loss: Option<f64>) -> Result<(), Error> {
    catch_signals();
    let pair = Pair::create(rate, loss)?;
    let lib = preload_lib();
    let transports = opts.transports(lib.is_some());
    // The plain transports in one pass, then one pass per environment the
    // others need (skipped, with a note, without the preload library).
    let plain: Vec<Transport> = transports
        .iter()
        .copied()
        .filter(|t| t.preload.is_none())
        .collect();
    let mut records: Vec<Record> = Vec::new();
    let mut meta = serde_json::Value::Null;
    let mut passes: Vec<(Vec<Transport>, Env)> = Vec::new();
    let mut notes = Vec::new();
    if !plain.is_empty() {
        passes.push((plain, Vec::new()));
    }
    let groups = passes::by_env(transports.iter().copied());
    for (vars, ts) in groups {
        match &lib {
            Some(lib) => passes.push((ts, preload_env(lib, vars))),
            None => notes.push(format!(
                "{} skipped: libwarpsock_preload.so is not built next to this binary",
                ts.iter().map(|t| t.name()).collect::<Vec<_>>().join(", ")
            )),
        }
    }
    for (ts, env) in passes {
        if INTERRUPTED.load(Ordering::SeqCst) {
            return Err(Error::msg("interrupted"));
        }
        let server = ChildServer::start(&pair.exec(0), &env, &pair.ip[0], Some(DEFAULT_PORT))?;
        let addr = SocketAddr::new(
            pair.ip[0].parse().expect("an IPv4 address"),
            server.addr.port(),
        );
        let res = child_client(&pair.exec(1), &env, addr, &opts.to_args(&ts), false);
        server.finish(res.is_ok());
        let (m, r) = res?;
        if meta.is_null() {
            meta = m;
        }
        records.extend(r);
    }
    if INTERRUPTED.load(Ordering::SeqCst) {
        return Err(Error::msg("interrupted"));
    }
    let target = pair.describe();
    if let Some(m) = meta.as_object_mut() {
        m.insert("target".into(), target.clone().into());
        m.insert(
            "command".into(),
            std::env::args().collect::<Vec<_>>().join(" ").into(),
        );
    }
    if opts.external {
        notes.push("--external runs its peers on loopback only; skipped with --netns".into());
    }
    for n in &notes {
        println!("note: {n}");
    }
    println!("warpsock bench: {target}");
    println!();
    print!("{}", report::tables(&records));
    write_outputs(opts, &meta, &records)?;
    drop(pair);
    fail_on_bad(&records)
}
