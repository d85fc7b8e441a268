//! Helpers shared by the integration tests: the library under test, the C
//! test programs, running them (with or without the preload) and reading
//! the counters they print at exit.

#![allow(dead_code, unreachable_pub)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

/// The library under test: `cargo build -p warpsock-preload` of this test
/// run's profile, into this run's target directory (a no-op when it is
/// fresh). The package is a cdylib only (BENCHMARKS §6 session 32), so
/// `cargo test` does not build it: [`warpsock_testkit::cdylib`] does.
pub fn preload_so() -> &'static Path {
    static SO: OnceLock<PathBuf> = OnceLock::new();
    SO.get_or_init(|| warpsock_testkit::cdylib("warpsock-preload", "warpsock_preload"))
}

/// A copy of the library built with the `test-hooks` feature (delays that
/// order races deterministically; the shipped library has none), into a
/// target directory of its own, once per test run.
pub fn preload_so_with_hooks() -> &'static Path {
    static SO: OnceLock<PathBuf> = OnceLock::new();
    SO.get_or_init(|| {
        let own = Path::new(env!("CARGO_TARGET_TMPDIR")).join("preload-hooks");
        let st = Command::new(env!("CARGO"))
            .args([
                "build",
                "--quiet",
                "-p",
                "warpsock-preload",
                "--features",
                "test-hooks",
                "--target-dir",
            ])
            .arg(&own)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .status()
            .expect("run cargo build");
        assert!(
            st.success(),
            "cargo build -p warpsock-preload --features test-hooks failed"
        );
        let so = own.join("debug").join("libwarpsock_preload.so");
        assert!(so.exists(), "{} not found", so.display());
        so
    })
}

/// Compiles tests/c/<name>.c once per test run.
pub fn c_program(name: &str) -> PathBuf {
    static BUILT: OnceLock<std::sync::Mutex<HashMap<String, PathBuf>>> = OnceLock::new();
    let mut built = BUILT.get_or_init(Default::default).lock().unwrap();
    if let Some(p) = built.get(name) {
        return p.clone();
    }
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/c")
        .join(format!("{name}.c"));
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("wsp-{name}"));
    // Built under a name of this process's own and renamed into place: a
    // test binary running meanwhile (another target's, or a second copy of
    // this one) may be executing the old file, and `cc` rewriting it in
    // place made that spawn fail with ETXTBSY.
    let tmp = out.with_extension(format!("tmp{}", std::process::id()));
    let st = Command::new("cc")
        .args(["-O1", "-g", "-Wall", "-Wextra", "-Werror", "-pthread", "-o"])
        .arg(&tmp)
        .arg(&src)
        .status()
        .expect("run cc");
    assert!(st.success(), "compiling {} failed", src.display());
    std::fs::rename(&tmp, &out).expect("move the compiled test program into place");
    built.insert(name.to_owned(), out.clone());
    out
}

pub use warpsock_testkit::lease_port;

pub mod policy;

pub struct Run {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    /// Counters from every stats report in stderr, summed by name.
    pub fn stats(&self) -> HashMap<String, u64> {
        let mut m = HashMap::new();
        for line in self.stderr.lines() {
            let mut it = line.split_whitespace();
            if let (Some(k), Some(v), None) = (it.next(), it.next(), it.next()) {
                if let Ok(v) = v.parse::<u64>() {
                    *m.entry(k.to_owned()).or_insert(0) += v;
                }
            }
        }
        m
    }

    pub fn stat(&self, name: &str) -> u64 {
        let s = self.stats();
        *s.get(name)
            .unwrap_or_else(|| panic!("no counter {name} in stderr:\n{}", self.stderr))
    }

    /// A failed count's message: the program's own lines (its failing
    /// step), the route set-up's counters (a set-up that failed under load
    /// sends by kernel UDP meanwhile, which changes every count per path),
    /// then the whole stderr. The first lines say the cause even where a
    /// log keeps only the head of a long message.
    pub fn why(&self) -> String {
        let own: Vec<&str> = self
            .stderr
            .lines()
            .filter(|l| {
                let w: Vec<&str> = l.split_whitespace().collect();
                let counter = w.len() == 2 && w[1].parse::<u64>().is_ok();
                !counter && !l.starts_with("warpsock udp-offload stats")
            })
            .collect();
        let s = self.stats();
        let setup = [
            "connects",
            "connect_ok",
            "connect_failed",
            "connect_retries",
            "hello_failed",
            "fallbacks",
            "tx_kernel_fallback",
            "tx_requeued_udp",
        ]
        .iter()
        .map(|k| format!("{k} {}", s.get(*k).map_or("-".into(), u64::to_string)))
        .collect::<Vec<_>>()
        .join(", ");
        format!(
            "\nprogram: {}\nset-up: {setup}\nstderr:\n{}",
            own.join(" | "),
            self.stderr
        )
    }

    pub fn assert_ok(&self, what: &str) {
        assert_eq!(
            self.code,
            Some(0),
            "{what} failed\nstdout:\n{}{}",
            self.stdout,
            self.why()
        );
    }
}

pub fn command(prog: &Path, args: &[String], preload: bool) -> Command {
    command_with(prog, args, preload.then(preload_so))
}

/// As `command`, preloading `so` if given.
pub fn command_with(prog: &Path, args: &[String], so: Option<&Path>) -> Command {
    let mut c = Command::new(prog);
    c.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, _) in std::env::vars() {
        if k.starts_with("WARPSOCK_") {
            c.env_remove(k);
        }
    }
    if let Some(so) = so {
        c.env("LD_PRELOAD", so)
            .env("WARPSOCK_UDP_OFFLOAD", "1")
            .env("WARPSOCK_STATS", "1");
    }
    c
}

/// Spawns `cmd` (a test program named `name` that prints "ready PORT"
/// first) and reads that line: the child, its stdout after the line, the
/// port.
pub fn spawn_ready(
    name: &str,
    mut cmd: Command,
) -> (Child, std::io::BufReader<std::process::ChildStdout>, u16) {
    use std::io::BufRead;
    let mut child = cmd.spawn().unwrap_or_else(|e| panic!("spawn {name}: {e}"));
    let mut out = std::io::BufReader::new(child.stdout.take().expect("a piped stdout"));
    let mut first = String::new();
    out.read_line(&mut first).expect("the ready line");
    let port = first
        .strip_prefix("ready ")
        .and_then(|p| p.trim().parse().ok())
        .unwrap_or_else(|| panic!("{name} did not start: {first:?}"));
    (child, out, port)
}

/// Waits for a child (killing it by pid after `limit`) and collects its output.
pub fn finish(child: Child, limit: Duration) -> Run {
    let f = warpsock_testkit::finish(child, limit);
    Run {
        code: f.code,
        stdout: f.stdout,
        stderr: f.stderr,
    }
}

/// Runs case `name` of tests/c/`prog`.c under the preload, or without it
/// with "plain" (both ends stay TCP), the switch's timeout at 2 s; the run
/// must succeed.
pub fn run_case(prog: &str, name: &str, preload: bool) -> Run {
    let mut args = vec![name.to_owned()];
    if !preload {
        args.push("plain".to_owned());
    }
    let child = command(&c_program(prog), &args, preload)
        .env("WARPSOCK_SWITCH_TIMEOUT_MS", "2000")
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {prog}: {e}"));
    let r = finish(child, Duration::from_secs(60));
    r.assert_ok(&format!("{prog} {name} (preload {preload})"));
    r
}

/// Runs case `name` of the one-process DDP-mode program `prog` over
/// plain TCP, then in DDP mode (both ends switched): the lines printed
/// must be the same. Returns the DDP-mode run.
pub fn same_over_tcp_and_ddp(prog: &str, name: &str) -> Run {
    let tcp = run_case(prog, name, false);
    let ddp = run_case(prog, name, true);
    assert_eq!(ddp.stat("ddp_switched"), 2, "{}", ddp.stderr);
    assert_eq!(
        tcp.stdout, ddp.stdout,
        "{prog} {name}: TCP (left) and DDP mode (right) differ"
    );
    ddp
}

/// Runs tests/c/`prog`.c over kernel TCP ("plain", no preload), then
/// preloaded with its `pairs` DDP pairs switched; both must print
/// "`prog`: ok".
pub fn over_tcp_then_ddp(prog: &str, pairs: u64) {
    for (args, preload) in [(vec!["plain".to_owned()], false), (vec![], true)] {
        let child = command(&c_program(prog), &args, preload)
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {prog}: {e}"));
        let r = finish(child, Duration::from_secs(60));
        r.assert_ok(&format!("{prog} (preload {preload})"));
        assert!(r.stdout.contains(&format!("{prog}: ok")), "{}", r.stdout);
        if preload {
            assert_eq!(r.stat("ddp_switched"), 2 * pairs, "{}", r.stderr);
        }
    }
}

pub fn run(name: &str, args: &[String], preload: bool) -> Run {
    let child = command(&c_program(name), args, preload)
        .spawn()
        .expect("spawn test program");
    finish(child, Duration::from_secs(60))
}

/// Runs a semantics program against kernel UDP, then under the preload.
/// No destination may have fallen back to kernel UDP.
pub fn both(name: &str, nports: usize) -> Run {
    let args: Vec<String> = (0..nports).map(|_| lease_port().to_string()).collect();
    run(name, &args, false).assert_ok(&format!("{name} (kernel UDP)"));
    let args: Vec<String> = (0..nports).map(|_| lease_port().to_string()).collect();
    let r = run(name, &args, true);
    r.assert_ok(&format!("{name} (preloaded)"));
    assert_eq!(r.stat("tx_lost"), 0, "{}", r.stderr);
    assert_eq!(
        r.stat("fallbacks"),
        0,
        "offload must not fall back: {}",
        r.stderr
    );
    r
}
