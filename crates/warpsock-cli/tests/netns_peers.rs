//! The built `warpsock` binary on the namespace pair it creates itself
//! (when root: rate, loss, pinning, and the pair removed afterwards), and
//! against the external peers where installed. Only namespaces the run
//! creates; every wait is bounded and children are killed by pid.
//!
//! `WARPSOCK_REQUIRE_NFT=1` makes the loss emulation mandatory;
//! `WARPSOCK_REQUIRE_PEERS=1` makes the external peers' rows mandatory
//! (iperf3, sockperf, ucx_perftest, fi_pingpong must be installed; else
//! each missing one's skip note is checked instead);
//! `WARPSOCK_REQUIRE_FONT=1` makes the report's figures mandatory.

use std::process::Command;

use serde_json::Value;

mod common;

use common::records::{draw_report, env_flag, font_available, load_results, on_path};
use common::{run, text, tmp};

/// The `wsb*` namespaces on this machine (other helpers' runs included).
fn namespaces() -> Vec<String> {
    let out = Command::new("ip").args(["netns", "list"]).output();
    out.map(|o| {
        text(&o.stdout)
            .lines()
            .filter_map(|l| l.split_whitespace().next().map(str::to_string))
            .filter(|n| n.starts_with("wsb"))
            .collect()
    })
    .unwrap_or_default()
}

/// Runs `warpsock bench --netns ...` and checks that the two namespaces it
/// named after its own pid (`wsb<pid>s`, `wsb<pid>c`) are gone after it
/// (a snapshot of every `wsb*` namespace would see other runs on a shared
/// machine come and go). Gives the pair's names with the output.
fn run_netns(args: &[&str]) -> ([String; 2], common::Output) {
    let (pid, out) = common::run_with_pid(args);
    let ours = [format!("wsb{pid}s"), format!("wsb{pid}c")];
    let left: Vec<String> = namespaces()
        .into_iter()
        .filter(|n| ours.contains(n))
        .collect();
    assert!(left.is_empty(), "the run left its namespaces {left:?}");
    (ours, out)
}

#[test]
fn netns_pair_with_rate_and_loss_when_root() {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    if !root {
        let out = run(&["bench", "--netns", "--quick"]);
        assert_eq!(out.status.code(), Some(1));
        assert!(
            text(&out.stderr).contains("--netns needs root"),
            "{}",
            text(&out.stderr)
        );
        eprintln!("not root: only the refusal of --netns was checked");
        return;
    }
    let json = tmp("netns.json");
    let has_nft = ["/usr/sbin/nft", "/sbin/nft", "/usr/bin/nft"]
        .iter()
        .any(|p| std::path::Path::new(p).exists());
    if !has_nft {
        assert!(
            !env_flag("WARPSOCK_REQUIRE_NFT"),
            "nft (package nftables) is missing"
        );
        let (_, out) = run_netns(&["bench", "--netns", "--quick", "--loss", "1"]);
        assert!(
            text(&out.stderr).contains("nft is not installed (Debian package nftables)"),
            "{}",
            text(&out.stderr)
        );
        eprintln!("nft missing: --loss refused; running without loss");
    }
    let loss = if has_nft { "0.5" } else { "0" };
    let (ours, out) = run_netns(&[
        "bench",
        "--netns",
        "--quick",
        "--rate",
        "2gbit",
        "--loss",
        loss,
        "--tests",
        "lat,bw,fan-in",
        "--transports",
        "tcp,udp,send,read,ddp-socket",
        "--crc",
        "on",
        "--json",
        json.to_str().unwrap(),
    ]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    assert!(
        stdout.contains(&format!("network namespaces {} (", ours[0]))
            && stdout.contains(&format!(" and {} (", ours[1])),
        "the pair is named after the run's pid: {ours:?}\n{stdout}"
    );
    assert!(stdout.contains("tbf rate 2000 Mbit/s"), "{stdout}");
    let results = load_results(&json);
    let _ = std::fs::remove_file(&json);
    assert!(results.len() >= 12, "{}", results.len());
    assert!(results
        .iter()
        .any(|r| r["transport"] == "udp" && r["test"] == "bw"));
    // The loss comparison of issue 12: host TCP and DDP-mode sockets on
    // the same lossy link (when the preload library is built).
    let ddp = results
        .iter()
        .any(|r| r["transport"] == "ddp-socket" && r["test"] == "bw");
    assert!(
        ddp || (!env_flag("WARPSOCK_REQUIRE_OFFLOAD") && stdout.contains("ddp-socket skipped")),
        "{stdout}"
    );

    // Both namespaces share this machine's CPUs: busy-polling sides must be
    // placed on different ones (the server's boot id tells the client),
    // else each spins away the other's time slice.
    if std::thread::available_parallelism().map_or(1, |n| n.get()) >= 2 {
        let (_, out) = run_netns(&[
            "bench",
            "--netns",
            "--tests",
            "lat",
            "--transports",
            "tcp",
            "--sizes",
            "8",
            "--busy-poll",
            "--iters",
            "200",
            "--json",
            json.to_str().unwrap(),
        ]);
        assert!(out.status.success(), "{}", text(&out.stderr));
        let results = load_results(&json);
        let _ = std::fs::remove_file(&json);
        let r = &results[0];
        assert!(
            r["client_cpu"].is_u64() && r["server_cpu"].is_u64(),
            "pinned: {r}"
        );
        assert_ne!(r["client_cpu"], r["server_cpu"], "{r}");
    }
}

/// Checks an external peer's row: it passed, moved something, and every
/// number it has is finite and positive, percentiles (those the tool
/// reports) ordered; UCX and libfabric rows say what their numbers are.
fn check_peer(r: &Value) {
    let what = format!("{} {} {}", r["transport"], r["test"], r["size"]);
    assert_eq!(r["ok"], true, "{what}: {r}");
    assert!(r["bytes"].as_u64().unwrap() > 0, "{what}");
    let pos = |v: &Value| v.as_f64().is_some_and(|x| x.is_finite() && x > 0.0);
    if r["test"] == "bw" {
        assert!(pos(&r["gbps"]), "{what}: {r}");
        assert!(r["gbps"].as_f64().unwrap() < 1000.0, "{what}");
    } else {
        let p = &r["one_way_us"];
        assert!(pos(&p["mean"]), "{what}: {p}");
        let given: Vec<f64> = ["min", "p50", "p99", "p999", "max"]
            .iter()
            .filter(|k| !p[**k].is_null())
            .map(|k| {
                assert!(pos(&p[*k]), "{what}: {k} = {}", p[*k]);
                p[*k].as_f64().unwrap()
            })
            .collect();
        assert!(given.windows(2).all(|w| w[0] <= w[1]), "{what}: {p}");
        assert!(r["round_trips"].as_u64().unwrap() > 0, "{what}");
    }
    let t = r["transport"].as_str().unwrap();
    if t.starts_with("ucx") || t.starts_with("libfabric") {
        assert!(
            !r["notes"].as_array().expect("notes").is_empty(),
            "{what}: no notes"
        );
    }
}

#[test]
fn external_peers_where_installed() {
    let json = tmp("ext.json");
    let out = run(&[
        "bench",
        "--quick",
        "--tests",
        "lat,bw",
        "--sizes",
        "8",
        "--transports",
        "tcp,send,write",
        "--crc",
        "off",
        "--external",
        "--json",
        json.to_str().unwrap(),
    ]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    let results = load_results(&json);
    let require = env_flag("WARPSOCK_REQUIRE_PEERS");
    let mut ran = 0;
    for (prog, rows, label) in [
        (
            "iperf3",
            &[("iperf3", "bw", 1 << 20), ("iperf3-udp", "bw", 16 << 10)][..],
            "iperf3 TCP",
        ),
        (
            "sockperf",
            &[("sockperf-tcp", "lat", 64), ("sockperf-udp", "lat", 64)][..],
            "sockperf TCP",
        ),
        (
            "ucx_perftest",
            &[
                ("ucx-put", "lat", 8),
                ("ucx-tag", "lat", 8),
                ("ucx-put", "bw", 1 << 20),
                ("ucx-tag", "bw", 1 << 20),
            ][..],
            "UCX put (tcp)",
        ),
        (
            "fi_pingpong",
            &[
                ("libfabric-tcp", "lat", 8),
                ("libfabric-tcp", "lat", 64 << 10),
            ][..],
            "libfabric tcp msg",
        ),
    ] {
        if !on_path(prog) {
            assert!(!require, "{prog} is not installed");
            assert!(
                stdout.contains(&format!("{prog} is not installed")),
                "{stdout}"
            );
            continue;
        }
        // A peer run that outlived one of its bounds (start, finish) said so
        // in a note and was killed: on a
        // loaded machine a spinning peer (UCX) can take that long. Anything
        // else that leaves a row out is a failure.
        let timed_out = stdout
            .lines()
            .any(|l| l.starts_with("note:") && l.contains(prog) && l.contains(" within "));
        let mut rows_seen = 0;
        for (t, test, size) in rows {
            let Some(r) = results
                .iter()
                .find(|r| r["transport"] == *t && r["test"] == *test && r["size"] == *size)
            else {
                assert!(timed_out, "no {t} {test} {size} row:\n{stdout}");
                continue;
            };
            check_peer(r);
            ran += 1;
            rows_seen += 1;
        }
        if rows_seen > 0 {
            assert!(stdout.contains(label), "table row {label}:\n{stdout}");
        }
    }
    // UCX and libfabric: only what the tools report.
    for r in results.iter().filter(|r| r["test"] == "lat") {
        match r["transport"].as_str().unwrap() {
            "ucx-put" | "ucx-tag" => {
                assert!(r["one_way_us"]["p50"].is_f64() && r["one_way_us"]["p99"].is_null());
            }
            "libfabric-tcp" => assert!(r["one_way_us"]["p50"].is_null()),
            _ => {}
        }
    }
    // The report names the peers and their ratios (figures need a font).
    if ran > 0 && (font_available() || env_flag("WARPSOCK_REQUIRE_FONT")) {
        let (dir, out) = draw_report(&json, "ext-report");
        assert!(out.status.success(), "{}", text(&out.stderr));
        let md = std::fs::read_to_string(dir.join("summary.md")).unwrap();
        assert!(md.contains("## External peers"), "{md}");
        for r in &results {
            if let Some(t) = r["transport"].as_str().filter(|t| t.starts_with("ucx")) {
                let label = if t == "ucx-put" {
                    "UCX put (tcp)"
                } else {
                    "UCX tag (tcp)"
                };
                assert!(md.contains(&format!("| {label} |")), "{md}");
            }
        }
        let svg = std::fs::read_to_string(dir.join("bandwidth-vs-size.svg")).unwrap();
        assert!(svg.contains("host TCP"), "bandwidth figure");
        let _ = std::fs::remove_dir_all(&dir);
    }
    let _ = std::fs::remove_file(&json);
}
