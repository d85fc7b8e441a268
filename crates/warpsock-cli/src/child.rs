//! Child processes: programs the bench starts (its own server, external
//! peers, the applications of the apps suite), each bounded in time and
//! killed by its pid — never by name — when it overstays or its guard
//! drops.
//!
//! Leaf module: it knows processes, ports and time, nothing of the bench.

use std::ffi::OsStr;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::Error;

/// Where `prog` is on the PATH (or in /usr/sbin, /sbin), if installed.
pub(crate) fn which(prog: &str) -> Option<PathBuf> {
    let path = std::env::var("PATH").unwrap_or_default();
    let found = path
        .split(':')
        .chain(["/usr/sbin", "/sbin"])
        .map(|d| Path::new(d).join(prog))
        .find(|p| p.is_file());
    found
}

/// Whether `prog` is installed.
pub(crate) fn installed(prog: &str) -> bool {
    which(prog).is_some()
}

/// The preload library: `WARPSOCK_PRELOAD_LIB`, else next to this
/// executable (same target directory), if it was built.
pub(crate) fn preload_lib() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("WARPSOCK_PRELOAD_LIB") {
        return Some(PathBuf::from(p)).filter(|p| p.exists());
    }
    let exe = std::env::current_exe().ok()?;
    let dir = exe.parent()?;
    [
        dir.join("libwarpsock_preload.so"),
        dir.join("deps/libwarpsock_preload.so"),
    ]
    .into_iter()
    .find(|p| p.exists())
}

/// `&["a", "b"]` as owned strings.
pub(crate) fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

/// `argv` (program first) behind `taskset -c CPU` when a CPU is given and
/// taskset is installed (taskset execs the program: same pid).
pub(crate) fn pinned(cpu: Option<usize>, argv: Vec<String>) -> Vec<String> {
    match cpu {
        Some(c) if installed("taskset") => {
            let mut v = strings(&["taskset", "-c"]);
            v.push(c.to_string());
            v.extend(argv);
            v
        }
        _ => argv,
    }
}

/// `[prefix...] program`: a command run through a prefix (e.g. `ip netns
/// exec NS`), stdin closed.
pub(crate) fn command(prefix: &[String], program: impl AsRef<OsStr>) -> Command {
    let mut c = match prefix.split_first() {
        Some((p, rest)) => {
            let mut c = Command::new(p);
            c.args(rest).arg(program);
            c
        }
        None => Command::new(program),
    };
    c.stdin(Stdio::null());
    c
}

/// A TCP port on 127.0.0.1 for a program that must bind it itself (no
/// port-0 option): free for TCP and UDP when chosen, below the kernel's
/// ephemeral range (no port-0 bind or outgoing connection on this machine
/// is handed it meanwhile), and leased for the rest of this process
/// through `warpsock_testkit`'s lock files, so that no test or suite that
/// leases is given it while our program runs (an unleased pick here let a
/// test's leased port be bound by a benchmark's server: the test's own
/// server then failed to bind). The race left is a program that does not
/// lease binding that very number before ours does; the callers check
/// that their program did listen ([`listening`]) and fail clearly if not.
pub(crate) fn free_port() -> Result<u16, Error> {
    warpsock_testkit::try_lease_port()
        .ok_or_else(|| Error::msg("no free port to lease on 127.0.0.1"))
}

/// Whether, in the network namespace of process `pid` (`self`: this
/// one), a TCP socket listens on `port` (`tcp`) or a UDP socket is bound
/// to it (from /proc/PID/net/{tcp,tcp6,udp,udp6}).
fn bound(pid: &str, port: u16, tcp: bool) -> bool {
    let want = format!(":{port:04X}");
    let (tables, state) = if tcp {
        (["tcp", "tcp6"], "0A")
    } else {
        (["udp", "udp6"], "07")
    };
    tables.iter().any(|f| {
        std::fs::read_to_string(format!("/proc/{pid}/net/{f}")).is_ok_and(|t| {
            t.lines().skip(1).any(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                f.len() > 3 && f[1].ends_with(&want) && f[3] == state
            })
        })
    })
}

/// A child process, killed by pid and reaped when dropped unless it has
/// exited.
#[derive(Debug)]
pub(crate) struct Proc {
    pub(crate) child: Child,
    name: String,
}

impl Proc {
    /// Spawns `cmd`, naming it `name` in errors.
    pub(crate) fn spawn(mut cmd: Command, name: &str) -> Result<Self, Error> {
        let child = cmd
            .spawn()
            .map_err(|e| Error::msg(format!("cannot start {name}: {e}")))?;
        Ok(Self {
            child,
            name: name.to_string(),
        })
    }

    /// Waits up to `limit` for it to exit; `None` if it is still running.
    pub(crate) fn wait_within(&mut self, limit: Duration) -> Option<ExitStatus> {
        wait_exit(&mut self.child, limit)
    }

    /// Waits until TCP `port` listens (`tcp`) or a UDP socket is bound to
    /// it in the program's network namespace, checked in /proc (not by
    /// connecting: a one-off server would take the probe for its client),
    /// at most `limit`; fails, naming the program, if it exits first or
    /// never does.
    pub(crate) fn await_port(
        &mut self,
        port: u16,
        tcp: bool,
        limit: Duration,
    ) -> Result<(), Error> {
        let end = Instant::now() + limit;
        loop {
            if bound(&self.child.id().to_string(), port, tcp) {
                return Ok(());
            }
            if let Some(st) = self.wait_within(Duration::from_millis(20)) {
                return Err(Error::msg(format!(
                    "{} exited ({st}) before listening on port {port}",
                    self.name
                )));
            }
            if Instant::now() >= end {
                return Err(Error::msg(format!(
                    "{} did not listen on port {port} within {:.0} s",
                    self.name,
                    limit.as_secs_f64()
                )));
            }
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

/// Waits up to `limit` for `child` to exit, on a pidfd (no polling
/// loop); `None` if it is still running then. One implementation, shared
/// with the tests' fixtures.
pub(crate) use warpsock_testkit::child::wait_exit;

/// What a finished program printed.
#[derive(Debug, Clone)]
pub(crate) struct Output {
    pub(crate) status: ExitStatus,
    pub(crate) stdout: String,
    pub(crate) stderr: String,
}

impl Output {
    /// stdout followed by stderr.
    pub(crate) fn text(&self) -> String {
        format!("{}{}", self.stdout, self.stderr)
    }
}

fn drain(p: Option<impl Read + Send + 'static>) -> JoinHandle<String> {
    std::thread::spawn(move || {
        let mut v = Vec::new();
        if let Some(mut p) = p {
            let _ = p.read_to_end(&mut v);
        }
        String::from_utf8_lossy(&v).into_owned()
    })
}

/// Runs `cmd` (named `name` in errors) with stdout and stderr captured,
/// each read on its own thread; fails when it has not finished within
/// `limit` (it is then killed by its pid). Any exit status is returned.
pub(crate) fn run(mut cmd: Command, name: &str, limit: Duration) -> Result<Output, Error> {
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut p = Proc::spawn(cmd, name)?;
    let out = drain(p.child.stdout.take());
    let err = drain(p.child.stderr.take());
    let status = p.wait_within(limit);
    let Some(status) = status else {
        drop(p);
        let _ = (out.join(), err.join());
        return Err(Error::msg(format!(
            "{name} did not finish within {:.0} s and was killed",
            limit.as_secs_f64()
        )));
    };
    Ok(Output {
        status,
        stdout: out.join().unwrap_or_default(),
        stderr: err.join().unwrap_or_default(),
    })
}

/// [`run`], failing also when the program exits unsuccessfully (the error
/// names its status and last line of output); its stdout + stderr.
pub(crate) fn run_ok(cmd: Command, name: &str, limit: Duration) -> Result<String, Error> {
    let o = run(cmd, name, limit)?;
    let text = o.text();
    if !o.status.success() {
        return Err(Error::msg(format!(
            "{name} failed ({}): {}",
            o.status,
            text.lines()
                .rev()
                .find(|l| !l.trim().is_empty())
                .unwrap_or("")
        )));
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{Ipv4Addr, TcpListener};

    #[test]
    fn runs_are_bounded_and_failures_named() {
        let mut c = command(&[], "sh");
        c.args(["-c", "echo hi; echo there >&2"]);
        assert_eq!(
            run_ok(c, "sh", Duration::from_secs(20)).unwrap(),
            "hi\nthere\n"
        );
        let mut c = command(&[], "sh");
        c.args(["-c", "echo nope; exit 3"]);
        let e = run_ok(c, "sh", Duration::from_secs(20)).unwrap_err();
        assert!(e.to_string().contains("nope"), "{e}");
        let mut c = command(&[], "sleep");
        c.arg("30");
        let t = Instant::now();
        let e = run(c, "sleep", Duration::from_millis(200)).unwrap_err();
        assert!(e.to_string().contains("killed"), "{e}");
        assert!(t.elapsed() < Duration::from_secs(10));
    }

    #[test]
    fn a_dropped_proc_is_killed() {
        let mut c = command(&[], "sleep");
        c.arg("30");
        let p = Proc::spawn(c, "sleep").unwrap();
        let pid = p.child.id();
        drop(p);
        // SAFETY: signal 0 only checks whether the pid exists.
        assert_ne!(unsafe { libc::kill(pid as libc::pid_t, 0) }, 0);
    }

    #[test]
    fn ports_for_programs_are_free_and_below_the_ephemeral_range() {
        let a = free_port().unwrap();
        let b = free_port().unwrap();
        assert_ne!(a, b);
        assert!(a >= 20_000);
        // Leased: no test or suite that leases is given it.
        assert!(warpsock_testkit::is_leased(a) && warpsock_testkit::is_leased(b));
        let l = TcpListener::bind((Ipv4Addr::LOCALHOST, a)).unwrap();
        assert!(bound("self", a, true));
        drop(l);
        assert!(which("sh").is_some() && !installed("no-such-program-here"));
    }
}
