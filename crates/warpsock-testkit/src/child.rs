//! Child processes with a time limit, killed by pid, never by name.

use std::io::Read;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::process::{Child, ExitStatus};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// A child process killed (by pid) and reaped when dropped, unless it has
/// exited already.
#[derive(Debug)]
pub struct Guard(pub Child);

impl Guard {
    /// Waits up to `limit` for the child to exit; `None` if it did not.
    pub fn wait_within(&mut self, limit: Duration) -> Option<ExitStatus> {
        wait_exit(&mut self.0, limit)
    }

    /// Takes the child back (it is no longer killed on drop).
    pub fn into_inner(self) -> Child {
        let me = std::mem::ManuallyDrop::new(self);
        // SAFETY: `me` is never used or dropped again, so the child is moved
        // out exactly once.
        unsafe { std::ptr::read(&me.0) }
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// Waits up to `limit` for `child` to exit, on a pidfd (no polling loop);
/// `None` if it is still running then (or cannot be waited for: a child
/// someone else reaped).
pub fn wait_exit(child: &mut Child, limit: Duration) -> Option<ExitStatus> {
    if let Ok(Some(st)) = child.try_wait() {
        return Some(st);
    }
    let end = Instant::now() + limit;
    let pidfd = pidfd(child.id());
    loop {
        let left = end.saturating_duration_since(Instant::now());
        match &pidfd {
            Some(fd) => {
                let mut p = libc::pollfd {
                    fd: fd.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                };
                let ms = left.as_millis().min(i32::MAX as u128) as i32;
                // SAFETY: one valid pollfd for the duration of the call.
                unsafe { libc::poll(&mut p, 1, ms) };
            }
            // Kernels before 5.3 have no pidfd: fall back to short naps.
            None => std::thread::sleep(left.min(Duration::from_millis(10))),
        }
        if let Ok(Some(st)) = child.try_wait() {
            return Some(st);
        }
        if left.is_zero() {
            return None;
        }
    }
}

fn pidfd(pid: u32) -> Option<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor
    // or -1; it touches no memory of ours.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    // SAFETY: a non-negative result is a descriptor we now own.
    (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// What a finished child left.
#[derive(Debug)]
pub struct Finished {
    /// Exit code; `None` when killed (by a signal or by the time limit).
    pub code: Option<i32>,
    /// Whether the time limit killed it.
    pub timed_out: bool,
    /// Everything it wrote to stdout (lossy UTF-8).
    pub stdout: String,
    /// Everything it wrote to stderr (lossy UTF-8).
    pub stderr: String,
}

impl Finished {
    /// Panics with both streams unless the child exited with status 0.
    pub fn assert_ok(&self, what: &str) {
        assert_eq!(
            self.code,
            Some(0),
            "{what} failed{}\nstdout:\n{}\nstderr:\n{}",
            if self.timed_out { " (time limit)" } else { "" },
            self.stdout,
            self.stderr
        );
    }
}

/// Collects a spawned child's piped stdout and stderr (each read on its own
/// thread so neither pipe can fill and stall it), waits up to `limit` and
/// kills it by pid after that.
pub fn finish(mut child: Child, limit: Duration) -> Finished {
    let out = drain(child.stdout.take());
    let err = drain(child.stderr.take());
    let status = wait_exit(&mut child, limit);
    let timed_out = status.is_none();
    let status = status.unwrap_or_else(|| {
        let _ = child.kill();
        child.wait().expect("wait")
    });
    Finished {
        code: status.code(),
        timed_out,
        stdout: out.join().expect("stdout reader"),
        stderr: err.join().expect("stderr reader"),
    }
}

/// The port a server child announces on its standard error in a line
/// ending "listening on ADDR:PORT" (warpsock-rping's server, started with
/// port 0: the child binds it, so no other program can take it first).
/// Reads unbuffered, a byte at a time, so the rest of the stream stays in
/// the pipe for [`finish`]; lines before that one are skipped.
///
/// # Panics
/// When the stream ends (or 20 lines pass) before such a line.
pub fn listening_port(child: &mut Child) -> u16 {
    let err = child.stderr.as_mut().expect("the child's stderr is piped");
    let mut seen = String::new();
    for _ in 0..20 {
        let mut line = Vec::new();
        let mut b = [0u8; 1];
        while err.read(&mut b).unwrap_or(0) == 1 && b[0] != b'\n' {
            line.push(b[0]);
        }
        let line = String::from_utf8_lossy(&line).into_owned();
        if line.contains("listening on ") {
            if let Some(port) = line.rsplit(':').next().and_then(|p| p.trim().parse().ok()) {
                return port;
            }
        }
        if line.is_empty() && b[0] != b'\n' {
            break;
        }
        seen.push_str(&line);
        seen.push('\n');
    }
    panic!("no \"listening on ADDR:PORT\" line from the child: {seen:?}");
}

fn drain(pipe: Option<impl Read + Send + 'static>) -> JoinHandle<String> {
    std::thread::spawn(move || {
        let mut buf = Vec::new();
        if let Some(mut p) = pipe {
            let _ = p.read_to_end(&mut buf);
        }
        String::from_utf8_lossy(&buf).into_owned()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::{Command, Stdio};

    #[test]
    fn a_listening_port_is_read_and_the_rest_left_for_finish() {
        let mut c = Command::new("sh")
            .args([
                "-c",
                "echo noise >&2; echo 'srv: listening on 127.0.0.1:4242' >&2; echo rest >&2",
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        assert_eq!(listening_port(&mut c), 4242);
        let f = finish(c, Duration::from_secs(20));
        assert_eq!(f.stderr, "rest\n");
    }

    #[test]
    fn finish_collects_output_and_code() {
        let c = Command::new("sh")
            .args(["-c", "echo out; echo err >&2; exit 3"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let f = finish(c, Duration::from_secs(20));
        assert_eq!((f.code, f.timed_out), (Some(3), false));
        assert_eq!((f.stdout.as_str(), f.stderr.as_str()), ("out\n", "err\n"));
    }

    #[test]
    fn the_limit_kills_by_pid() {
        let c = Command::new("sleep")
            .arg("30")
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let f = finish(c, Duration::from_millis(100));
        assert!(f.timed_out && f.code.is_none(), "{f:?}");
    }

    #[test]
    fn a_guard_kills_on_drop() {
        let mut g = Guard(Command::new("sleep").arg("30").spawn().unwrap());
        assert!(g.wait_within(Duration::from_millis(50)).is_none());
        let pid = g.0.id();
        drop(g);
        // SAFETY: signal 0 only checks whether the pid exists.
        let alive = unsafe { libc::kill(pid as libc::pid_t, 0) } == 0;
        assert!(!alive, "child {pid} still exists");
    }
}
