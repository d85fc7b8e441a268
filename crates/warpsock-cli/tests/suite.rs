//! The built `warpsock` binary's full suite in its CI variant (every test,
//! every transport) and the report drawn from it, and the report's errors
//! on bad input. Only 127.0.0.1; every wait is bounded.
//!
//! `WARPSOCK_REQUIRE_OFFLOAD=1` makes the UDP offload rows mandatory;
//! `WARPSOCK_REQUIRE_FONT=1` makes the PNG/SVG figures mandatory (else,
//! without a font, the report's clear error is checked instead).

use serde_json::Value;

mod common;

use common::records::{draw_report, env_flag, font_available, load_results};
use common::{run, text, tmp};

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
    // Sockets in DDP mode, streams and one-sided Writes: the preloaded
    // pass runs every stream test.
    for transport in ["ddp-socket", "riowrite"] {
        if results.iter().any(|r| r["transport"] == transport) {
            for test in [
                "lat", "bw", "bibw", "multi", "hotspot", "fan-in", "fan-out", "cpu",
            ] {
                assert!(has(test, transport), "{test} over {transport}");
            }
        } else {
            assert!(
                !env_flag("WARPSOCK_REQUIRE_OFFLOAD"),
                "no {transport} rows:\n{stdout}"
            );
            assert!(stdout.contains(&format!("{transport} skipped")), "{stdout}");
        }
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
    // (ddp-socket, riowrite) paces to the slowest of its own (it runs in
    // child processes after this one).
    let preloaded =
        |r: &&Value| ["ddp-socket", "riowrite"].contains(&r["transport"].as_str().unwrap());
    let rates = |pass: bool| -> Vec<u64> {
        results
            .iter()
            .filter(|r| r["test"] == "cpu" && preloaded(r) == pass)
            .map(|r| r["rate_bytes_per_s"].as_u64().unwrap())
            .collect()
    };
    let one_pace = |v: &[u64]| v.iter().all(|&x| x > 0 && x == v[0]);
    let here = rates(false);
    assert!(here.len() >= 4 && one_pace(&here), "{here:?}");
    assert!(one_pace(&rates(true)), "{:?}", rates(true));
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
    let (dir, out) = draw_report(&json, "report");
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
