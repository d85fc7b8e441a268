//! The built `warpsock` binary end to end: a quick loopback bench with sane
//! numbers, the full suite in its CI variant (every test, every transport)
//! and the report drawn from it, the namespace pair (when root), server
//! and client as two processes, every bad option value with its message
//! and exit status, and a refused connection. Only 127.0.0.1 and
//! namespaces the run creates itself; every wait is bounded and children
//! are killed by pid.
//!
//! `WARPSOCK_REQUIRE_OFFLOAD=1` makes the UDP offload rows mandatory (the
//! preload library must be built next to the binary);
//! `WARPSOCK_REQUIRE_FONT=1` makes the PNG/SVG figures mandatory (else,
//! without a font, the report's clear error is checked instead);
//! `WARPSOCK_REQUIRE_PEERS=1` makes the external peers' rows mandatory
//! (iperf3, sockperf, ucx_perftest, fi_pingpong must be installed; else
//! each missing one's skip note is checked instead).

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use serde_json::Value;
use warpsock_testkit::{lease_port, loopback_listener};

mod common;

use common::{run, server, text, tmp, wait_exit};

/// Checks one result: something moved, all of it was verified, counts
/// consistent, percentiles ordered, bandwidth positive.
fn check_record(r: &Value) {
    let t = r["transport"].as_str().unwrap();
    if ["iperf3", "sockperf", "ucx-", "libfabric-"]
        .iter()
        .any(|p| t.starts_with(p))
    {
        // External peers: their own numbers, checked in their test.
        return;
    }
    let what = format!(
        "{} {} crc={} size={} N={}",
        r["test"], r["transport"], r["crc"], r["size"], r["conns"]
    );
    let bytes = r["bytes"].as_u64().unwrap();
    assert!(bytes > 0, "{what}: nothing moved");
    assert_eq!(
        bytes,
        r["verified"].as_u64().unwrap(),
        "{what}: bytes != verified"
    );
    assert_eq!(r["ok"], Value::Bool(true), "{what}");
    assert!(r["messages"].as_u64().unwrap() > 0, "{what}");
    let client = r["client"]["bytes"].as_u64().unwrap();
    let server = r["server"]["bytes"].as_u64().unwrap();
    assert_eq!(client + server, bytes, "{what}: sides add up");
    let udp = r["transport"].as_str().unwrap().starts_with("udp");
    let ordered = |p: &Value| {
        let (a, b, c) = (
            p["p50"].as_f64().unwrap(),
            p["p99"].as_f64().unwrap(),
            p["p999"].as_f64().unwrap(),
        );
        assert!(
            a > 0.0 && a <= b && b <= c && p["min"].as_f64().unwrap() <= a,
            "{what}: {a} {b} {c}"
        );
    };
    match r["test"].as_str().unwrap() {
        "lat" | "hotspot" => {
            ordered(&r["one_way_us"]);
            let n = r["samples"]["rtt_ns"].as_array().unwrap().len();
            assert_eq!(n as u64, r["round_trips"].as_u64().unwrap());
            assert!(n > 0, "{what}");
            if !udp {
                assert_eq!(r["lost"], 0, "{what}");
            }
        }
        "conn" => {
            ordered(&r["setup_us"]);
            assert!(r["conns_per_s"].as_f64().unwrap() > 0.0, "{what}");
            assert_eq!(
                r["samples"]["rtt_ns"].as_array().unwrap().len() as u64,
                r["messages"].as_u64().unwrap(),
                "{what}"
            );
        }
        _ => {
            let g = r["gbps"].as_f64().unwrap();
            assert!(g > 0.0 && g < 1000.0, "{what}: {g} GB/s");
            let size = r["size"].as_u64().unwrap();
            let msgs =
                r["client"]["msgs"].as_u64().unwrap() + r["server"]["msgs"].as_u64().unwrap();
            assert_eq!(msgs * size, bytes, "{what}: whole messages only");
            if udp {
                let lost = r["lost"].as_u64().unwrap();
                assert_eq!(
                    msgs + lost,
                    r["messages"].as_u64().unwrap(),
                    "{what}: received + lost = sent"
                );
            } else {
                assert_eq!(
                    bytes,
                    r["messages"].as_u64().unwrap() * size,
                    "{what}: every message arrived"
                );
            }
            let sum: u64 = r["samples"]["bytes"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_u64().unwrap())
                .sum();
            assert_eq!(sum, bytes, "{what}: samples");
            let cpu = &r["cpu"];
            let total: f64 = [
                "client_user_s",
                "client_sys_s",
                "server_user_s",
                "server_sys_s",
            ]
            .iter()
            .map(|k| cpu[k].as_f64().unwrap())
            .sum();
            assert!(total > 0.0, "{what}: CPU time measured");
            assert!(r["cpu_s_per_gb"].as_f64().unwrap() > 0.0, "{what}");
        }
    }
}

/// Checks every result in a `--json` file (removed afterwards) and
/// returns them.
fn check_json(path: &PathBuf, expect_runs: usize) -> Vec<Value> {
    let results = load_results(path);
    let _ = std::fs::remove_file(path);
    assert_eq!(results.len(), expect_runs);
    results
}

fn load_results(path: &PathBuf) -> Vec<Value> {
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(path).expect("json file"))
        .expect("valid JSON");
    let results = doc["results"].as_array().expect("results").clone();
    for r in &results {
        check_record(r);
    }
    results
}

#[test]
fn bench_defaults_quick_on_loopback() {
    let json = tmp("bench.json");
    let out = run(&[
        "bench",
        "--duration",
        "0.1",
        "--json",
        json.to_str().unwrap(),
    ]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    for row in [
        "host TCP",
        "warpsock Send",
        "warpsock RDMA Write",
        "warpsock RDMA Read",
        "p50 µs",
        "GB/s",
        "x TCP",
        "8 B",
        "1 MiB",
    ] {
        assert!(stdout.contains(row), "table lacks '{row}':\n{stdout}");
    }
    assert!(!stdout.contains("FAIL"), "{stdout}");
    let results = check_json(&json, 14);
    // TCP once per test, each warpsock transport with CRC off and on.
    let crcs: Vec<bool> = results
        .iter()
        .map(|r| r["crc"].as_bool().unwrap())
        .collect();
    assert_eq!(crcs.iter().filter(|&&c| c).count(), 6);
    // Latency runs pinned both sides alike; bandwidth unpinned.
    assert_eq!(results[0]["client_cpu"], results[0]["server_cpu"]);
    assert!(results[0]["client_cpu"].is_u64());
    assert!(results[7]["server_cpu"].is_null());
}

#[test]
fn bench_options_thread_progress_verify_busy_poll() {
    let json = tmp("opts.json");
    let out = run(&[
        "bench",
        "--iters",
        "40",
        "--progress",
        "thread",
        "--verify",
        "--busy-poll",
        "20",
        "--sizes",
        "3,100000",
        "--window",
        "3",
        "--crc",
        "on",
        "--transports",
        "send,write,read,tcp",
        "--pin",
        "none",
        "--repeat",
        "2",
        "--json",
        json.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}\n{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    // 2 tests x 2 sizes x (tcp + 3 transports with CRC on).
    let results = check_json(&json, 16);
    for r in &results {
        assert_eq!(r["repeats"], 2, "median of two rounds");
        let (lo, hi) = (
            r["merit_min"].as_f64().unwrap(),
            r["merit_max"].as_f64().unwrap(),
        );
        assert!(0.0 < lo && lo <= hi, "{r}");
        assert_eq!(r["progress"], "thread");
        assert_eq!(r["busy_poll_us"], 20);
        if r["transport"] != "tcp" {
            assert_eq!(r["crc"], true);
        }
        if r["test"] == "bw" {
            assert_eq!(r["window"], 3);
            assert_eq!(r["messages"], 40);
        }
    }
}

/// The preload's GSO path as a suite transport (`udp-gso`: the host-UDP
/// code with both processes preloaded, `WARPSOCK_UDP_MODE=gso`) beside its
/// baselines, host UDP and host UDP batching with GSO/GRO itself: every row
/// moved and verified data, bandwidth rows with loss and jitter.
#[test]
fn udp_gso_transport_beside_its_baselines() {
    let json = tmp("gso.json");
    let out = run(&[
        "bench",
        "--tests",
        "lat,bw",
        "--transports",
        "udp,udp-host-gso,udp-gso",
        "--sizes",
        "1470",
        "--iters",
        "2000",
        "--verify",
        "--json",
        json.to_str().unwrap(),
    ]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    let results = load_results(&json);
    let _ = std::fs::remove_file(&json);
    let gso = results.iter().any(|r| r["transport"] == "udp-gso");
    if !gso {
        assert!(
            !env_flag("WARPSOCK_REQUIRE_OFFLOAD"),
            "no udp-gso rows:\n{stdout}"
        );
        assert!(stdout.contains("udp-gso skipped"), "{stdout}");
    }
    let transports: &[&str] = if gso {
        &["udp", "udp-host-gso", "udp-gso"]
    } else {
        &["udp", "udp-host-gso"]
    };
    for t in transports {
        for test in ["lat", "bw"] {
            let r = results
                .iter()
                .find(|r| r["transport"] == *t && r["test"] == test)
                .unwrap_or_else(|| panic!("no {test} row over {t}"));
            assert_eq!(r["ok"], true, "{r}");
            assert!(r["bytes"].as_u64().unwrap() > 0, "{r}");
            if test == "bw" {
                assert!(r["loss_pct"].is_f64(), "{r}");
                assert!(r["jitter_us"].is_f64(), "{r}");
            }
        }
    }
}

#[test]
fn server_once_and_client_in_two_processes() {
    let (mut srv, port) = server(true);
    let json = tmp("client.json");
    let addr = format!("127.0.0.1:{port}");
    let out = run(&[
        "client",
        &addr,
        "--iters",
        "100",
        "--crc",
        "off",
        "--json",
        json.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}\n{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    assert!(text(&out.stdout).contains(&format!("server {addr}")));
    check_json(&json, 8);
    assert!(wait_exit(&mut srv, Duration::from_secs(10)).success());
}

#[test]
fn bad_option_values_name_the_value_and_range() {
    let cases: &[(&[&str], &str)] = &[
        (
            &["bench", "--duration", "0"],
            "0: must be between 0.01 and 3600 seconds",
        ),
        (
            &["bench", "--duration", "5000"],
            "5000: must be between 0.01 and 3600 seconds",
        ),
        (
            &["bench", "--duration", "soon"],
            "'soon': not a number of seconds",
        ),
        (
            &["bench", "--iters", "0"],
            "0: must be between 1 and 1000000000",
        ),
        (
            &["bench", "--sizes", "8,0"],
            "'0': must be between 1 B and 64 MiB",
        ),
        (&["bench", "--sizes", "1G"], "'1G': unknown unit"),
        (
            &["bench", "--window", "65"],
            "65: must be between 1 and 64 messages",
        ),
        (
            &["bench", "--busy-poll", "0"],
            "0: must be between 1 and 1000000 microseconds",
        ),
        (&["bench", "--pin", "4096"], "CPU 4096 does not exist"),
        (&["bench", "--crc", "maybe"], "invalid value 'maybe'"),
        (&["bench", "--transports", "tcp,ipx"], "invalid value 'ipx'"),
        (&["bench", "--tests", "lat,pong"], "invalid value 'pong'"),
        (
            &["bench", "--suite", "huge"],
            "[possible values: quick, full, apps]",
        ),
        (
            &["bench", "--conns", "1,65"],
            "65: must be between 1 and 64 connections",
        ),
        (
            &["bench", "--conns", "0"],
            "0: must be between 1 and 64 connections",
        ),
        (
            &["bench", "--netns", "--rate", "10kbit"],
            "'10kbit': must be between 1 mbit and 100 gbit",
        ),
        (
            &["bench", "--netns", "--loss", "60"],
            "60: must be between 0 and 50 percent",
        ),
        (&["bench", "--rate", "1gbit"], "--netns"),
        (&["report"], "required"),
        (
            &["bench", "--repeat", "0"],
            "0: must be between 1 and 100 rounds",
        ),
        (
            &["bench", "--progress", "magic"],
            "[possible values: caller, thread]",
        ),
        (
            &["bench", "--duration", "1", "--iters", "5"],
            "cannot be used with",
        ),
        (
            &["client", "127.0.0.1:0"],
            "port '0' must be between 1 and 65535",
        ),
        (
            &["client", "fe80::1:99999"],
            "put an IPv6 address in brackets",
        ),
        (&["client"], "required"),
        (&["server", "--port", "70000"], "invalid value '70000'"),
    ];
    for (args, want) in cases {
        let out = run(args);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: want '{want}' in:\n{err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
}

#[test]
fn closed_port_gives_connection_refused() {
    // Leased: nothing of ours listens there, and no port-0 bind gets it.
    let port = lease_port();
    for args in [
        vec!["client".to_string(), format!("127.0.0.1:{port}")],
        vec!["bench".into(), "--peer".into(), format!("127.0.0.1:{port}")],
    ] {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = run(&args);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{err}");
        assert_eq!(err.lines().count(), 1, "one line: {err}");
        assert!(
            err.contains(&format!(
                "cannot connect to 127.0.0.1:{port}: connection refused"
            )),
            "{err}"
        );
        assert!(
            !err.contains("panicked") && !err.contains("backtrace"),
            "{err}"
        );
    }
}

#[test]
fn port_in_use_is_a_clear_error() {
    let (_l, port) = loopback_listener();
    let port = port.to_string();
    let out = run(&["server", "--bind", "127.0.0.1", "--port", &port, "--once"]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!("cannot listen on 127.0.0.1:{port}")),
        "{err}"
    );
}

fn env_flag(k: &str) -> bool {
    std::env::var(k).is_ok_and(|v| v == "1")
}

fn font_available() -> bool {
    [
        "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
        "/usr/share/fonts/TTF/DejaVuSans.ttf",
        "/usr/share/fonts/dejavu/DejaVuSans.ttf",
        "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    ]
    .iter()
    .any(|p| std::path::Path::new(p).exists())
}

#[test]
fn full_suite_quick_variant_then_report() {
    let json = tmp("full.json");
    let csv = tmp("full.csv");
    let out = run(&[
        "bench",
        "--suite",
        "full",
        "--quick",
        "--json",
        json.to_str().unwrap(),
        "--csv",
        csv.to_str().unwrap(),
    ]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    for title in [
        "Ping-pong latency",
        "Unidirectional bandwidth",
        "Bidirectional bandwidth",
        "Multi-stream bandwidth",
        "Hot-spot latency",
        "Fan-in bandwidth",
        "Fan-out bandwidth",
        "Connection setup",
        "Normalized CPU",
        "host UDP",
        "busy",
    ] {
        assert!(stdout.contains(title), "no '{title}' in:\n{stdout}");
    }
    let results = load_results(&json);
    let has = |test: &str, transport: &str| {
        results
            .iter()
            .any(|r| r["test"] == test && r["transport"] == transport)
    };
    for test in [
        "lat", "bw", "bibw", "multi", "hotspot", "fan-in", "fan-out", "conn", "cpu",
    ] {
        for transport in ["tcp", "send"] {
            assert!(has(test, transport), "{test} over {transport}");
        }
    }
    for test in ["lat", "bw", "bibw", "multi", "hotspot", "fan-in", "fan-out"] {
        for transport in ["udp", "udp-host-gso", "write", "read"] {
            assert!(has(test, transport), "{test} over {transport}");
        }
    }
    // RFC 3550 jitter next to loss: on the datagram bandwidth rows (each
    // host-UDP flavour has some), never on stream transports.
    for r in &results {
        let j = &r["jitter_us"];
        if j.is_null() {
            continue;
        }
        let t = r["transport"].as_str().unwrap();
        assert!(t.starts_with("udp") && r["test"] != "lat", "jitter on {r}");
        assert!(j.as_f64().is_some_and(|v| v.is_finite() && v >= 0.0), "{r}");
    }
    for transport in ["udp", "udp-host-gso"] {
        assert!(
            results.iter().any(|r| r["test"] == "bw"
                && r["transport"] == transport
                && r["jitter_us"].is_f64()),
            "no jitter on a bw row over {transport}"
        );
    }
    let offload = results.iter().any(|r| r["transport"] == "udp-offload");
    if env_flag("WARPSOCK_REQUIRE_OFFLOAD") {
        assert!(offload, "no udp-offload rows:\n{stdout}");
    } else if !offload {
        assert!(stdout.contains("udp-offload skipped"), "{stdout}");
    }
    // Sockets in DDP mode: the preloaded pass runs every stream test.
    if results.iter().any(|r| r["transport"] == "ddp-socket") {
        for test in [
            "lat", "bw", "bibw", "multi", "hotspot", "fan-in", "fan-out", "cpu",
        ] {
            assert!(has(test, "ddp-socket"), "{test} over ddp-socket");
        }
    } else {
        assert!(
            !env_flag("WARPSOCK_REQUIRE_OFFLOAD"),
            "no ddp-socket rows:\n{stdout}"
        );
        assert!(stdout.contains("ddp-socket skipped"), "{stdout}");
    }
    // Scaling tests ran with N = 1 and 4; normalized CPU at one pace.
    for test in ["multi", "hotspot", "fan-in", "fan-out"] {
        let ns: Vec<u64> = results
            .iter()
            .filter(|r| r["test"] == test && r["transport"] == "tcp")
            .map(|r| r["conns"].as_u64().unwrap())
            .collect();
        assert_eq!(ns, vec![1, 4], "{test}");
    }
    // One pace for the transports of this process; a preloaded pass
    // (ddp-socket) paces to the slowest of its own (it runs in child
    // processes after this one).
    let rates: Vec<u64> = results
        .iter()
        .filter(|r| r["test"] == "cpu" && r["transport"] != "ddp-socket")
        .map(|r| r["rate_bytes_per_s"].as_u64().unwrap())
        .collect();
    assert!(rates.len() >= 4 && rates.iter().all(|&v| v > 0 && v == rates[0]));
    // Event-driven and busy-polling latency rows.
    assert!(results
        .iter()
        .any(|r| r["test"] == "lat" && r["busy_poll_us"].as_u64().unwrap() > 0));
    // CSV: a header and one row per sample.
    let csv_text = std::fs::read_to_string(&csv).unwrap();
    let _ = std::fs::remove_file(&csv);
    let samples: usize = results
        .iter()
        .map(|r| {
            r["samples"]["rtt_ns"].as_array().unwrap().len()
                + r["samples"]["bytes"].as_array().unwrap().len()
        })
        .sum();
    assert_eq!(csv_text.lines().count(), samples + 1);
    assert!(csv_text.starts_with("test,transport,crc,size,conns,"));

    // The report of this run.
    let dir = tmp("report");
    let _ = std::fs::remove_dir_all(&dir);
    let out = run(&[
        "report",
        json.to_str().unwrap(),
        "--out",
        dir.to_str().unwrap(),
    ]);
    let _ = std::fs::remove_file(&json);
    let err = text(&out.stderr);
    if !font_available() && !env_flag("WARPSOCK_REQUIRE_FONT") {
        assert_eq!(out.status.code(), Some(1), "{err}");
        assert!(err.contains("install fonts-dejavu-core"), "{err}");
        return;
    }
    assert!(out.status.success(), "{err}");
    for name in [
        "latency-vs-size",
        "latency-busy-vs-size",
        "bandwidth-vs-size",
        "bibw-vs-size",
        "multi-stream-vs-n",
        "hotspot-vs-n",
        "fan-in-vs-n",
        "fan-out-vs-n",
        "cpu-vs-bandwidth",
        "cpu-vs-size",
        "normalized-cpu",
        "connection-setup",
    ] {
        let png = std::fs::read(dir.join(format!("{name}.png"))).expect(name);
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n", "{name}.png");
        assert!(png.len() > 10_000, "{name}.png has content");
        let svg = std::fs::read_to_string(dir.join(format!("{name}.svg"))).expect(name);
        assert!(svg.contains("<svg") && svg.contains("</svg>"), "{name}.svg");
        assert!(
            svg.contains("host TCP") || name.starts_with("connection"),
            "{name}.svg legend"
        );
    }
    let md = std::fs::read_to_string(dir.join("summary.md")).unwrap();
    for want in [
        "# warpsock bench: summary",
        "## Winner of each test point",
        "## Headline ratios",
        "fan-in bandwidth",
        "connection setup",
        "normalized CPU",
        "every received byte counted and verified: yes",
        "[bandwidth-vs-size.png](bandwidth-vs-size.png)",
    ] {
        assert!(md.contains(want), "summary lacks '{want}':\n{md}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn report_refuses_bad_input() {
    let missing = tmp("missing.json");
    let out = run(&["report", missing.to_str().unwrap(), "--out", "/tmp"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("cannot read"),
        "{}",
        text(&out.stderr)
    );
    let junk = tmp("junk.json");
    std::fs::write(&junk, "not json").unwrap();
    let out = run(&["report", junk.to_str().unwrap(), "--out", "/tmp"]);
    let _ = std::fs::remove_file(&junk);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("not JSON"),
        "{}",
        text(&out.stderr)
    );
}

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

fn on_path(prog: &str) -> bool {
    std::env::var("PATH")
        .unwrap_or_default()
        .split(':')
        .any(|d| std::path::Path::new(d).join(prog).exists())
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
        let dir = tmp("ext-report");
        let _ = std::fs::remove_dir_all(&dir);
        let out = run(&[
            "report",
            json.to_str().unwrap(),
            "--out",
            dir.to_str().unwrap(),
        ]);
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
