//! The built `warpsock` binary end to end: a quick loopback bench with sane
//! numbers, server and client as two processes, every bad option value
//! with its message and exit status, and a refused connection. Only
//! 127.0.0.1; every wait is bounded and children are killed by pid.

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

const EXE: &str = env!("CARGO_BIN_EXE_warpsock");
/// Upper bound for any one command.
const LIMIT: Duration = Duration::from_secs(120);

/// A child process killed (by pid) when dropped.
struct Guard(Child);

impl Drop for Guard {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// Runs `warpsock ARGS` to completion within [`LIMIT`].
fn run(args: &[&str]) -> Output {
    let child = Command::new(EXE)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn warpsock");
    let mut g = Guard(child);
    let end = Instant::now() + LIMIT;
    while g.0.try_wait().expect("try_wait").is_none() {
        assert!(
            Instant::now() < end,
            "warpsock {args:?} ran longer than {LIMIT:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let child = std::mem::replace(&mut g.0, Command::new("true").spawn().expect("spawn true"));
    std::mem::forget(g);
    child.wait_with_output().expect("output")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn tmp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("warpsock-cli-{}-{name}", std::process::id()))
}

/// Checks every result in a `--json` file: something moved, all of it was
/// verified, percentiles ordered, bandwidth positive. Returns the results.
fn check_json(path: &PathBuf, expect_runs: usize) -> Vec<Value> {
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(path).expect("json file"))
        .expect("valid JSON");
    let _ = std::fs::remove_file(path);
    let results = doc["results"].as_array().expect("results").clone();
    assert_eq!(results.len(), expect_runs, "{doc:#}");
    for r in &results {
        let what = format!("{} {} crc={}", r["test"], r["transport"], r["crc"]);
        let bytes = r["bytes"].as_u64().unwrap();
        assert!(bytes > 0, "{what}: nothing moved");
        assert_eq!(
            bytes,
            r["verified"].as_u64().unwrap(),
            "{what}: bytes != verified"
        );
        assert_eq!(r["ok"], Value::Bool(true), "{what}");
        assert!(r["messages"].as_u64().unwrap() > 0, "{what}");
        match r["test"].as_str().unwrap() {
            "lat" => {
                let p50 = r["one_way_us"]["p50"].as_f64().unwrap();
                let p99 = r["one_way_us"]["p99"].as_f64().unwrap();
                let p999 = r["one_way_us"]["p999"].as_f64().unwrap();
                assert!(
                    p50 > 0.0 && p50 <= p99 && p99 <= p999,
                    "{what}: {p50} {p99} {p999}"
                );
                let n = r["samples"]["rtt_ns"].as_array().unwrap().len();
                assert_eq!(n as u64, r["round_trips"].as_u64().unwrap());
                assert!(n > 0);
            }
            "bw" => {
                let g = r["gbps"].as_f64().unwrap();
                assert!(g > 0.0 && g < 1000.0, "{what}: {g} GB/s");
                let size = r["size"].as_u64().unwrap();
                assert_eq!(
                    r["data_bytes"].as_u64().unwrap(),
                    r["messages"].as_u64().unwrap() * size,
                    "{what}: every message completed"
                );
                let sum: u64 = r["samples"]["bytes"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|v| v.as_u64().unwrap())
                    .sum();
                assert_eq!(sum, r["data_bytes"].as_u64().unwrap(), "{what}: samples");
            }
            t => panic!("unknown test {t}"),
        }
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

/// Starts `warpsock server` on free ports of 127.0.0.1; returns it and
/// its control port.
fn server(once: bool) -> (Guard, u16) {
    let mut args = vec![
        "server",
        "--bind",
        "127.0.0.1",
        "--port",
        "0",
        "--data-port",
        "0",
    ];
    if once {
        args.push("--once");
    }
    let mut child = Command::new(EXE)
        .args(&args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn server");
    let stdout = child.stdout.take().unwrap();
    let g = Guard(child);
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line).unwrap();
    let port = line
        .split_whitespace()
        .find_map(|w| w.strip_prefix("control="))
        .and_then(|a| a.rsplit_once(':'))
        .and_then(|(_, p)| p.parse().ok())
        .unwrap_or_else(|| panic!("no control port in {line:?}"));
    (g, port)
}

fn wait_exit(g: &mut Guard, limit: Duration) -> std::process::ExitStatus {
    let end = Instant::now() + limit;
    loop {
        if let Some(s) = g.0.try_wait().unwrap() {
            return s;
        }
        assert!(Instant::now() < end, "server did not exit within {limit:?}");
        std::thread::sleep(Duration::from_millis(20));
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
fn server_survives_junk_and_serves_bench_peer() {
    let (mut srv, port) = server(false);
    // A peer that speaks something else, then hangs up.
    {
        use std::io::Write;
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.write_all(b"GET / HTTP/1.0\r\n\r\n").unwrap();
        let mut buf = String::new();
        let _ = BufReader::new(&s).read_line(&mut buf);
        assert!(buf.starts_with("error"), "{buf:?}");
    }
    for _ in 0..2 {
        let out = run(&[
            "bench",
            "--peer",
            &format!("127.0.0.1:{port}"),
            "--iters",
            "20",
            "--transports",
            "send",
            "--crc",
            "on",
        ]);
        assert!(
            out.status.success(),
            "{}\n{}",
            text(&out.stdout),
            text(&out.stderr)
        );
    }
    assert!(
        srv.0.try_wait().unwrap().is_none(),
        "server without --once keeps serving"
    );
    let _ = srv.0.kill();
    let _ = wait_exit(&mut srv, Duration::from_secs(10));
}

#[test]
fn bad_option_values_name_the_value_and_range() {
    let cases: &[(&[&str], &str)] = &[
        (
            &["bench", "--duration", "0"],
            "0: must be between 0.1 and 3600 seconds",
        ),
        (
            &["bench", "--duration", "5000"],
            "5000: must be between 0.1 and 3600 seconds",
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
        (&["bench", "--transports", "tcp,udp"], "invalid value 'udp'"),
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
    let port = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
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
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port().to_string();
    let out = run(&["server", "--bind", "127.0.0.1", "--port", &port, "--once"]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!("cannot listen on 127.0.0.1:{port}")),
        "{err}"
    );
}
