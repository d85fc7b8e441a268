//! Helpers shared by the `warpsock` binary's integration tests: run it
//! bounded in time, start a server on port 0 and read its ports.
#![allow(dead_code, unreachable_pub)]

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use warpsock_testkit::{finish, Guard};

pub mod records;

pub const EXE: &str = env!("CARGO_BIN_EXE_warpsock");
/// Upper bound for any one command.
pub const LIMIT: Duration = Duration::from_secs(300);

/// What `warpsock ARGS` left: exit code and both streams.
pub struct Output {
    pub status: Status,
    pub stdout: String,
    pub stderr: String,
}

/// The exit code of a finished command (`None`: killed by a signal).
pub struct Status(pub Option<i32>);

impl Status {
    pub fn code(&self) -> Option<i32> {
        self.0
    }
    pub fn success(&self) -> bool {
        self.0 == Some(0)
    }
}

/// Builds the preload library next to [`EXE`] (once per test process):
/// the preloaded transports (`ddp-socket`, `riowrite`, `udp-offload`) load
/// the one beside the binary, and `cargo test` builds no cdylib, so a
/// plain `cargo test` would otherwise run them with whatever an older
/// build left there, or skip them.
pub fn with_preload() {
    warpsock_testkit::cdylib("warpsock-preload", "warpsock_preload");
}

/// Runs `warpsock ARGS` to completion within [`LIMIT`].
pub fn run(args: &[&str]) -> Output {
    run_with_pid(args).1
}

/// [`run`], also giving the process id the command ran as (names it made
/// from its pid, such as `--netns`'s namespaces, can be checked after).
pub fn run_with_pid(args: &[&str]) -> (u32, Output) {
    with_preload();
    let child = Command::new(EXE)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn warpsock");
    let pid = child.id();
    let f = finish(child, LIMIT);
    assert!(!f.timed_out, "warpsock {args:?} ran longer than {LIMIT:?}");
    let out = Output {
        status: Status(f.code),
        stdout: f.stdout,
        stderr: f.stderr,
    };
    (pid, out)
}

pub fn text(b: impl AsRef<[u8]>) -> String {
    String::from_utf8_lossy(b.as_ref()).into_owned()
}

pub fn tmp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("warpsock-cli-{}-{name}", std::process::id()))
}

/// Starts `warpsock server` on free ports of 127.0.0.1; returns it and
/// its control port.
pub fn server(once: bool) -> (Guard, u16) {
    server_with(once, &[])
}

/// [`server`] with extra arguments.
pub fn server_with(once: bool, extra: &[&str]) -> (Guard, u16) {
    server_logged(once, extra, Stdio::inherit())
}

/// [`server_with`], its stderr going to `stderr`.
pub fn server_logged(once: bool, extra: &[&str], stderr: Stdio) -> (Guard, u16) {
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
    args.extend_from_slice(extra);
    with_preload();
    let mut child = Command::new(EXE)
        .args(&args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(stderr)
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

pub fn wait_exit(g: &mut Guard, limit: Duration) -> std::process::ExitStatus {
    g.wait_within(limit)
        .unwrap_or_else(|| panic!("server did not exit within {limit:?}"))
}
