//! Checks on `warpsock bench --json` records and the environment switches
//! the tests read (`WARPSOCK_REQUIRE_*`, a font for the figures, a program
//! on `PATH`).

use std::path::{Path, PathBuf};

use serde_json::Value;

use super::{run, tmp, Output};

/// Checks one result: something moved, all of it was verified, counts
/// consistent, percentiles ordered, bandwidth positive.
pub fn check_record(r: &Value) {
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
pub fn check_json(path: &PathBuf, expect_runs: usize) -> Vec<Value> {
    let results = load_results(path);
    let _ = std::fs::remove_file(path);
    assert_eq!(results.len(), expect_runs);
    results
}

pub fn load_results(path: &PathBuf) -> Vec<Value> {
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(path).expect("json file"))
        .expect("valid JSON");
    let results = doc["results"].as_array().expect("results").clone();
    for r in &results {
        check_record(r);
    }
    results
}

pub fn env_flag(k: &str) -> bool {
    std::env::var(k).is_ok_and(|v| v == "1")
}

pub fn font_available() -> bool {
    [
        "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
        "/usr/share/fonts/TTF/DejaVuSans.ttf",
        "/usr/share/fonts/dejavu/DejaVuSans.ttf",
        "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    ]
    .iter()
    .any(|p| Path::new(p).exists())
}

pub fn on_path(prog: &str) -> bool {
    std::env::var("PATH")
        .unwrap_or_default()
        .split(':')
        .any(|d| Path::new(d).join(prog).exists())
}

/// Runs `warpsock report JSON --out DIR` into a fresh temporary directory
/// named `name`; gives the directory and what the command left.
pub fn draw_report(json: &Path, name: &str) -> (PathBuf, Output) {
    let dir = tmp(name);
    let _ = std::fs::remove_dir_all(&dir);
    let out = run(&[
        "report",
        json.to_str().unwrap(),
        "--out",
        dir.to_str().unwrap(),
    ]);
    (dir, out)
}
