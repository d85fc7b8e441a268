//! `warpsock bench --suite apps --quick`: every workload's programs
//! (nginx, wrk, redis, memcached, aria2c, iperf3, GStreamer) over host TCP
//! and UDP and the UDP offload, each case's own checks passed (every
//! request answered, bytes compared, no error in the programs' output),
//! the transports not built yet reported as not available, and the report
//! drawn with a figure per workload. With `WARPSOCK_REQUIRE_APPS=1`
//! (scripts/test-apps.sh) the programs and the preload library are
//! mandatory and the namespace pair with loss runs too (root); otherwise a
//! machine without the programs only checks that the suite says so.

use serde_json::Value;

mod common;

use common::{run, text, tmp};

fn required() -> bool {
    std::env::var("WARPSOCK_REQUIRE_APPS").is_ok_and(|v| v == "1")
}

const PROGRAMS: [&str; 8] = [
    "nginx",
    "wrk",
    "redis-server",
    "redis-benchmark",
    "memcached",
    "aria2c",
    "iperf3",
    "gst-launch-1.0",
];

fn installed(p: &str) -> bool {
    std::env::var("PATH")
        .unwrap_or_default()
        .split(':')
        .chain(["/usr/sbin", "/sbin"])
        .any(|d| std::path::Path::new(d).join(p).is_file())
}

/// Runs the quick apps suite with `extra` arguments; its records.
fn suite(extra: &[&str], name: &str) -> Vec<Value> {
    let json = tmp(name);
    let mut args = vec![
        "bench",
        "--suite",
        "apps",
        "--quick",
        "--json",
        json.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    let out = run(&args);
    assert!(
        out.status.success(),
        "{}\n{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let _ = std::fs::remove_file(&json);
    assert_eq!(doc["meta"]["suite"], "apps");
    doc["apps"].as_array().expect("an apps array").clone()
}

/// Every workload ran over its baseline and over the UDP offload where
/// it applies, each case ok, with a positive value.
fn check(apps: &[Value], offload: bool) {
    let ran = |w: &str, t: &str| {
        apps.iter()
            .filter(|r| r["workload"] == w && r["transport"] == t && r["available"] == true)
            .collect::<Vec<_>>()
    };
    for (w, base) in [
        ("http-close", "tcp"),
        ("redis", "tcp"),
        ("memcached-tcp", "tcp"),
        ("memcached-udp", "udp"),
        ("striped", "tcp"),
        ("rtp", "udp"),
    ] {
        let mut rows = ran(w, base);
        if offload && base == "udp" {
            rows.extend(ran(w, "udp-offload"));
            assert!(!ran(w, "udp-offload").is_empty(), "{w} over udp-offload");
        }
        assert!(!rows.is_empty(), "{w} over {base}");
        for r in rows {
            assert_eq!(r["ok"], true, "{r}");
            assert!(r["value"].as_f64().unwrap() > 0.0, "{r}");
        }
    }
    // Cases that count requests answered every one of them.
    for r in apps
        .iter()
        .filter(|r| r["workload"] == "memcached-tcp" && r["transport"] == "tcp")
    {
        assert_eq!(r["lost"], 0, "{r}");
        assert!(r["bytes_verified"].as_u64().unwrap() > 0, "{r}");
    }
    // aria2c's file was compared byte for byte.
    assert!(apps.iter().any(|r| r["workload"] == "striped"
        && r["transport"] == "tcp"
        && r["case"].as_str().unwrap().starts_with("aria2c")
        && r["bytes_verified"].as_u64().unwrap_or(0) > 0));
    // Transports not built yet say so, and why.
    for r in apps.iter().filter(|r| r["available"] == false) {
        assert!(
            r["note"].as_str().unwrap().starts_with("not available: "),
            "{r}"
        );
    }
}

#[test]
fn apps_suite_quick_on_loopback_then_report() {
    let missing: Vec<&str> = PROGRAMS.iter().copied().filter(|p| !installed(p)).collect();
    if !missing.is_empty() {
        assert!(
            !required(),
            "missing programs: {missing:?} (scripts/ensure-pkgs.sh)"
        );
        let out = run(&[
            "bench",
            "--suite",
            "apps",
            "--quick",
            "--workloads",
            "redis",
        ]);
        if !installed("redis-server") {
            assert!(!out.status.success());
            assert!(text(&out.stdout)
                .contains("redis-server (Debian package redis-server) not installed"));
        }
        eprintln!("programs missing ({missing:?}): only the suite's own message was checked");
        return;
    }
    let apps = suite(&[], "apps.json");
    let offload = apps
        .iter()
        .any(|r| r["transport"] == "udp-offload" && r["available"] == true);
    assert!(
        offload || !required(),
        "the UDP offload rows are mandatory here"
    );
    check(&apps, offload);
    // The report draws a figure per workload and names each winner.
    let json = tmp("apps-report.json");
    let doc = serde_json::json!({"meta": {"suite": "apps"}, "results": [], "apps": apps});
    std::fs::write(&json, doc.to_string()).unwrap();
    let dir = tmp("apps-report");
    let out = run(&[
        "report",
        json.to_str().unwrap(),
        "--out",
        dir.to_str().unwrap(),
    ]);
    let font = ["/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf"]
        .iter()
        .any(|f| std::path::Path::new(f).exists());
    if font {
        assert!(out.status.success(), "{}", text(&out.stderr));
        let md = std::fs::read_to_string(dir.join("summary.md")).unwrap();
        assert!(
            md.contains("## Applications (winner of each workload)"),
            "{md}"
        );
        for w in ["http-close", "redis", "memcached-udp", "striped", "rtp"] {
            assert!(dir.join(format!("apps-{w}.png")).exists(), "{w}");
            assert!(md.contains(&format!("| {w} |")), "{md}");
        }
    }
    let _ = std::fs::remove_file(&json);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn apps_suite_between_namespaces_with_loss() {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    if !required() || !root {
        eprintln!("the namespace run is scripts/test-apps.sh's (as root)");
        return;
    }
    let apps = suite(
        &[
            "--netns",
            "--rate",
            "2gbit",
            "--loss",
            "0.5",
            "--workloads",
            "memcached-udp,rtp,redis",
        ],
        "apps-netns.json",
    );
    // The baselines and the UDP offload pass every check; another
    // transport's failure is a reported result.
    for r in apps.iter().filter(|r| {
        r["available"] == true
            && ["tcp", "udp", "udp-offload"].contains(&r["transport"].as_str().unwrap())
    }) {
        assert_eq!(r["ok"], true, "{r}");
    }
    assert!(apps.iter().any(|r| r["workload"] == "memcached-udp"
        && r["transport"] == "udp-offload"
        && r["ok"] == true));
}
