//! `warpsock bench --suite apps`: runs the application workloads (see the
//! `apps` module) on loopback or in two network namespaces, prints their
//! table and writes the JSON that `warpsock report` draws.

use serde_json::json;

use super::netns::{catch_signals, interrupted, Pair};
use crate::apps::{self, Cx, Host, Link};
use crate::opts::BenchOpts;
use crate::report;
use crate::{pin, Error};

/// A directory of the run's own, removed when dropped.
struct TempDir(std::path::PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs the apps suite; `netns`: in two namespaces, with rate and loss.
pub(crate) fn run(
    opts: &BenchOpts,
    netns: Option<(Option<u64>, Option<f64>)>,
) -> Result<(), Error> {
    let dir = TempDir(std::env::temp_dir().join(format!("warpsock-apps-{}", std::process::id())));
    std::fs::create_dir_all(&dir.0)
        .map_err(|e| Error::msg(format!("cannot create {}: {e}", dir.0.display())))?;
    let pair = match netns {
        Some((rate, loss)) => {
            catch_signals();
            Some(Pair::create(rate, loss)?)
        }
        None => None,
    };
    let (server, client, target) = match &pair {
        Some(p) => (
            Host {
                prefix: p.exec(0),
                ip: p.ip[0].clone(),
            },
            Host {
                prefix: p.exec(1),
                ip: p.ip[0].clone(),
            },
            p.describe(),
        ),
        None => {
            let lo = Host {
                prefix: Vec::new(),
                ip: "127.0.0.1".into(),
            };
            (lo.clone(), lo, "loopback 127.0.0.1".to_string())
        }
    };
    let secs = match opts.budget() {
        crate::spec::Budget::Time(d) => d.as_secs_f64(),
        crate::spec::Budget::Iters(_) => 1.0,
    };
    // Sampled before the run: the figure says how quiet the machine was
    // when the measurements began, not what the run itself left behind.
    let load_at_start = load_average();
    let cx = Cx {
        server,
        client,
        quick: opts.quick,
        secs: if opts.quick { 1.0 } else { secs },
        dir: dir.0.clone(),
        link: Link {
            rate: netns.and_then(|(rate, _)| rate),
            loss: netns.and_then(|(_, loss)| loss),
        },
    };
    let started = std::time::SystemTime::now();
    let records = apps::run_all(&cx, &opts.workloads, interrupted);
    drop(pair);
    if interrupted() {
        return Err(Error::msg("interrupted"));
    }
    println!(
        "warpsock bench --suite apps: {target}; {} CPUs ({}); {:.0} s per timed case",
        pin::cpu_count(),
        pin::cpu_model(),
        cx.secs
    );
    println!();
    print!("{}", report::apps::table(&records));
    let meta = json!({
        "tool": "warpsock bench",
        "suite": "apps",
        "version": env!("CARGO_PKG_VERSION"),
        "command": std::env::args().collect::<Vec<_>>().join(" "),
        "target": target,
        "started_utc": super::utc(started
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0)),
        "cpus": pin::cpu_count(),
        "cpu_model": pin::cpu_model(),
        "seconds_per_case": cx.secs,
        "quick": opts.quick,
        "load_average": load_at_start,
    });
    if let Some(path) = &opts.json {
        let doc = report::json::to_json_with_apps(meta, &[], &records);
        std::fs::write(
            path,
            serde_json::to_string_pretty(&doc).expect("JSON values serialize") + "\n",
        )
        .map_err(|e| Error::msg(format!("cannot write {}: {e}", path.display())))?;
        println!("Every result: {}", path.display());
    }
    // A baseline that fails is a broken run; another transport that fails
    // a case is a result (in the table, the JSON and the summary).
    let baseline = |t: &str| t == "tcp" || t == "udp";
    for r in records
        .iter()
        .filter(|r| r.available && !r.ok && !baseline(&r.transport))
    {
        println!(
            "note: {} {} over {}: {}",
            r.workload, r.case, r.transport, r.note
        );
    }
    let bad: Vec<String> = records
        .iter()
        .filter(|r| r.available && !r.ok && baseline(&r.transport))
        .map(|r| format!("{} {} over {}: {}", r.workload, r.case, r.transport, r.note))
        .collect();
    if bad.is_empty() {
        Ok(())
    } else {
        Err(Error::msg(format!(
            "application checks failed: {}",
            bad.join("; ")
        )))
    }
}

/// The 1-minute load average when the run started (`/proc/loadavg`).
fn load_average() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}
