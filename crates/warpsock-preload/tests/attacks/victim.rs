//! The victim program (tests/c/victim.c) under the preload, as the attack
//! tests drive it: start, the lines it printed, its memory and CPU, the
//! legitimate peers it must keep serving, and its quit with its counters
//! (moved out of `attacks.rs`, past 900 lines).

use std::io::{BufRead, Read};
use std::net::UdpSocket;
use std::process::Child;
use std::sync::mpsc::{channel, Receiver};
use std::time::{Duration, Instant};

use super::common::*;

/// How many times (one a second) a legitimate peer sends a datagram before
/// it counts as not served: the plain peer of [`Victim::serves_legit_peers`]
/// and `echo_client` alike. Four times the library's bound on a blocking send
/// to a peer that stopped reading (`STALL`, 5 s: the single-threaded victim
/// legitimately sits in its `sendto` that long once, and a 3 s budget failed
/// on a loaded CI, issue 13), so that only a victim blocked for good, or a
/// peer starved or misrouted, fails the check.
pub(crate) const LEGIT_TRIES: u32 = 20;

/// The victim program, preloaded, and what it printed so far.
pub(crate) struct Victim {
    pub(crate) child: Child,
    pub(crate) port: u16,
    pub(crate) lines: Receiver<String>,
    pub(crate) seen: Vec<String>,
}

impl Victim {
    /// Starts the victim with descriptor limit `nofile` (0: unchanged),
    /// reading only after `sleep_ms`, connected to `connect` if given.
    pub(crate) fn start(
        nofile: u32,
        sleep_ms: u32,
        connect: Option<u16>,
        env: &[(&str, &str)],
    ) -> Self {
        Self::start_on(preload_so(), nofile, sleep_ms, connect, env)
    }

    /// [`Victim::start`] under the library `so`.
    pub(crate) fn start_on(
        so: &std::path::Path,
        nofile: u32,
        sleep_ms: u32,
        connect: Option<u16>,
        env: &[(&str, &str)],
    ) -> Self {
        let mut args = vec![nofile.to_string(), sleep_ms.to_string()];
        args.extend(connect.map(|p| p.to_string()));
        let mut cmd = command_with(&c_program("victim"), &args, Some(so));
        for (k, v) in env {
            cmd.env(k, v);
        }
        let (child, out, port) = spawn_ready("victim", cmd);
        let (tx, lines) = channel();
        std::thread::spawn(move || {
            for l in out.lines() {
                let Ok(l) = l else { break };
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        Self {
            child,
            port,
            lines,
            seen: Vec::new(),
        }
    }

    /// Waits (at most `limit`) for a printed line containing `what`.
    pub(crate) fn wait_line(&mut self, what: &str, limit: Duration) -> bool {
        let end = Instant::now() + limit;
        if self.seen.iter().any(|l| l.contains(what)) {
            return true;
        }
        while let Some(left) = end.checked_duration_since(Instant::now()) {
            match self.lines.recv_timeout(left) {
                Ok(l) => {
                    let hit = l.contains(what);
                    self.seen.push(l);
                    if hit {
                        return true;
                    }
                }
                Err(_) => return false,
            }
        }
        false
    }

    /// Everything printed so far.
    pub(crate) fn drain(&mut self) -> &[String] {
        while let Ok(l) = self.lines.try_recv() {
            self.seen.push(l);
        }
        &self.seen
    }

    pub(crate) fn proc_field(&self, file: &str) -> String {
        std::fs::read_to_string(format!("/proc/{}/{file}", self.child.id())).unwrap_or_default()
    }

    /// Resident memory in KiB.
    pub(crate) fn rss_kib(&self) -> u64 {
        self.proc_field("status")
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or(0)
    }

    /// CPU time used so far (user + system).
    pub(crate) fn cpu(&self) -> Duration {
        let stat = self.proc_field("stat");
        // Fields after the command (which may hold spaces) start at ')'.
        let rest = stat.rsplit_once(')').map_or("", |r| r.1);
        let f: Vec<u64> = rest
            .split_whitespace()
            .map(|v| v.parse().unwrap_or(0))
            .collect();
        // utime and stime are fields 14 and 15, 12 and 13 after ')'.
        let ticks = f.get(11).copied().unwrap_or(0) + f.get(12).copied().unwrap_or(0);
        // SAFETY: sysconf has no preconditions.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
        Duration::from_millis(ticks * 1000 / hz)
    }

    /// A legitimate peer still gets its datagrams echoed: a plain kernel
    /// UDP socket, and a preloaded client (over the offload, or kernel UDP
    /// if the offload refuses it).
    pub(crate) fn serves_legit_peers(&mut self) {
        self.serves_legit_peers_with(20);
    }

    /// [`Victim::serves_legit_peers`], the preloaded client asking for
    /// `count` echoes one after another.
    pub(crate) fn serves_legit_peers_with(&mut self, count: u32) {
        if !self.echoes() {
            let threads = self.threads();
            let seen = self.drain().to_vec();
            let vr = self.take().quit();
            panic!(
                "the plain legitimate peer got no echo ({} lines printed, last: {:?})\n\
                 victim threads:\n{threads}victim exit {:?}:\n{}",
                seen.len(),
                &seen[seen.len().saturating_sub(5)..],
                vr.code,
                vr.stderr
            );
        }
        let started = Instant::now();
        let args = [
            self.port.to_string(),
            count.to_string(),
            LEGIT_TRIES.to_string(),
        ];
        let r = run("echo_client", &args, true);
        if r.code != Some(0) {
            let took = started.elapsed();
            let threads = self.threads();
            let vr = self.take().quit();
            panic!(
                "a preloaded legitimate peer failed after {took:?}:\n{}\n\
                 victim threads then:\n{threads}victim exit {:?}, {}\nvictim stats:\n{}",
                r.stderr,
                vr.code,
                Self::what_it_got(&vr.stdout),
                vr.stderr
            );
        }
    }

    /// The victim's report lines, summed up for a failure message: how
    /// many, every one not from the flood (not "got 60000 ..."), the last.
    pub(crate) fn what_it_got(stdout: &str) -> String {
        let lines: Vec<&str> = stdout.lines().collect();
        let other: Vec<&str> = lines
            .iter()
            .copied()
            .filter(|l| !l.starts_with("got 60000 "))
            .collect();
        format!(
            "{} lines printed; not the flood's: {other:?}; last: {:?}",
            lines.len(),
            lines.last()
        )
    }

    /// Whether a plain kernel UDP peer gets a datagram echoed
    /// ([`LEGIT_TRIES`] tries).
    pub(crate) fn echoes(&self) -> bool {
        let s = UdpSocket::bind("127.0.0.1:0").unwrap();
        s.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
        let mut buf = [0u8; 64];
        (0..LEGIT_TRIES).any(|_| {
            s.send_to(b"hello-legit", ("127.0.0.1", self.port)).unwrap();
            matches!(s.recv_from(&mut buf), Ok((11, _)) if &buf[..11] == b"hello-legit")
        })
    }

    /// Moves the victim out (to end it for its output), leaving a finished
    /// stand-in.
    pub(crate) fn take(&mut self) -> Self {
        let child = std::mem::replace(
            &mut self.child,
            std::process::Command::new("true").spawn().unwrap(),
        );
        Self {
            child,
            port: self.port,
            lines: std::mem::replace(&mut self.lines, channel().1),
            seen: std::mem::take(&mut self.seen),
        }
    }

    /// Where each of the victim's threads is (state, system call, kernel
    /// wait channel): for the message of a failure.
    pub(crate) fn threads(&self) -> String {
        let dir = format!("/proc/{}/task", self.child.id());
        let mut out = String::new();
        for t in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let p = t.path();
            let read = |f: &str| std::fs::read_to_string(p.join(f)).unwrap_or_default();
            let state = read("status")
                .lines()
                .find(|l| l.starts_with("State:"))
                .unwrap_or("")
                .to_owned();
            // utime and stime, fields 14 and 15 (12 and 13 after ')').
            let stat = read("stat");
            let f: Vec<u64> = stat
                .rsplit_once(')')
                .map_or("", |r| r.1)
                .split_whitespace()
                .map(|v| v.parse().unwrap_or(0))
                .collect();
            let ticks = f.get(11).copied().unwrap_or(0) + f.get(12).copied().unwrap_or(0);
            out += &format!(
                "  {:?} {} ticks {ticks} syscall {} wchan {}\n",
                t.file_name(),
                state,
                read("syscall").trim(),
                read("wchan")
            );
        }
        out
    }

    /// Ends the victim ("quit") and returns its output and counters.
    pub(crate) fn quit(mut self) -> Run {
        let s = UdpSocket::bind("127.0.0.1:0").unwrap();
        s.send_to(b"quit", ("127.0.0.1", self.port)).unwrap();
        let mut stderr = String::new();
        let mut err = self.child.stderr.take().unwrap();
        let t = std::thread::spawn(move || {
            let _ = err.read_to_string(&mut stderr);
            stderr
        });
        let end = Instant::now() + Duration::from_secs(30);
        let code = loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                break st.code();
            }
            if Instant::now() > end {
                let _ = self.child.kill();
                let _ = self.child.wait();
                break None;
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        // Every line the victim printed: the reader thread may still be
        // passing the last ones on when the process has ended (a
        // `drain` here lost them under load: `each_echo_counted_once`
        // counted fewer echoes than the victim's counters); it ends at
        // the pipe's end of file (bounded, in case a child holds it).
        let stdout_end = Instant::now() + Duration::from_secs(10);
        while let Some(left) = stdout_end.checked_duration_since(Instant::now()) {
            match self.lines.recv_timeout(left) {
                Ok(l) => self.seen.push(l),
                Err(_) => break,
            }
        }
        let stdout = self.seen.join("\n");
        Run {
            code,
            stdout,
            stderr: t.join().unwrap(),
        }
    }
}

/// A victim never outlives its test: one that failed (or hung) before
/// `quit` is killed by pid.
impl Drop for Victim {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
