//! The built `warpsock` binary end to end: a quick loopback bench with sane
//! numbers, its options (threads, progress, verify, busy poll, the UDP GSO
//! transport), server and client as two processes, every bad option value
//! with its message and exit status, a refused connection and a port in
//! use. Only 127.0.0.1; every wait is bounded and children are killed by
//! pid. The full suite and report are in `suite.rs`, the namespace pair and
//! the external peers in `netns_peers.rs`.
//!
//! `WARPSOCK_REQUIRE_OFFLOAD=1` makes the UDP offload rows mandatory (the
//! preload library must be built next to the binary).

use std::time::Duration;

use warpsock_testkit::{loopback_listener, RefusingPort};

mod common;

use common::records::{check_json, env_flag, load_results};
use common::{run, server, text, tmp, wait_exit};

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
    // Held, not listening: refused, and nobody else can bind it meanwhile.
    let held = RefusingPort::new().unwrap();
    let port = held.port();
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
