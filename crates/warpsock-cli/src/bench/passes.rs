//! Passes of child processes: a `warpsock server --once` and a `warpsock
//! client` started by this process (on loopback, or inside network
//! namespaces), for the transports that need an environment this process
//! does not have: both sides under `LD_PRELOAD=libwarpsock_preload.so`
//! plus the transport's variables.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;

pub(crate) use crate::child::preload_lib;
use crate::child::{self, Proc};
use crate::report::{self, Record};
use crate::spec::{Spec, Transport, Vars};
use crate::Error;

/// Extra environment of a child process.
pub(crate) type Env = Vec<(String, String)>;

/// A `warpsock server --once` child process; killed by pid if it has not
/// exited when this is dropped.
pub(crate) struct ChildServer {
    proc: Proc,
    /// Its control address.
    pub(crate) addr: SocketAddr,
}

impl ChildServer {
    /// Starts `[prefix...] warpsock server --once --bind BIND` with extra
    /// environment `env`, on `port` (default: free ports) and reads the
    /// addresses it listens on.
    pub(crate) fn start(
        prefix: &[String],
        env: &[(String, String)],
        bind: &str,
        port: Option<u16>,
    ) -> Result<Self, Error> {
        let exe = std::env::current_exe()?;
        let mut cmd = child::command(prefix, &exe);
        cmd.args(["server", "--once", "--bind", bind]);
        match port {
            Some(p) => cmd.args(["--port", &p.to_string()]),
            None => cmd.args(["--port", "0", "--data-port", "0"]),
        };
        cmd.envs(env.iter().map(|(k, v)| (k, v)))
            .stdout(Stdio::piped());
        let mut proc = Proc::spawn(cmd, "the server")?;
        let stdout = proc.child.stdout.take().expect("piped");
        let mut line = String::new();
        let _ = BufReader::new(stdout).read_line(&mut line);
        let addr = line
            .split_whitespace()
            .find_map(|w| w.strip_prefix("control="))
            .and_then(|a| a.parse().ok())
            .ok_or_else(|| Error::msg("the server did not start (see its message above)"))?;
        Ok(Self { proc, addr })
    }

    /// Waits for the child to exit (briefly if the run failed), then kills
    /// it by pid if it is still there.
    pub(crate) fn finish(mut self, ok: bool) {
        let limit = if ok { 5 } else { 0 };
        self.proc.wait_within(Duration::from_secs(limit));
    }
}

/// Runs `[prefix...] warpsock client ADDR ARGS --json FILE` to completion
/// (its progress on our stderr, its table on our stdout if `show`), and
/// reads its results.
pub(crate) fn child_client(
    prefix: &[String],
    env: &[(String, String)],
    addr: SocketAddr,
    args: &[String],
    show: bool,
) -> Result<(Value, Vec<Record>), Error> {
    let exe = std::env::current_exe()?;
    let json = std::env::temp_dir().join(format!(
        "warpsock-pass-{}-{}.json",
        std::process::id(),
        addr.port()
    ));
    let mut cmd = child::command(prefix, &exe);
    cmd.arg("client")
        .arg(addr.to_string())
        .args(args)
        .arg("--json")
        .arg(&json)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdout(if show {
            Stdio::inherit()
        } else {
            Stdio::null()
        });
    let st = cmd
        .status()
        .map_err(|e| Error::msg(format!("cannot start the client: {e}")))?;
    let text = std::fs::read_to_string(&json);
    let _ = std::fs::remove_file(&json);
    // A pass whose data failed verification still wrote its results: they
    // are kept (marked not ok) and the whole run fails at the end.
    let text = match (text, st.success()) {
        (Ok(t), _) => t,
        (Err(_), false) => {
            return Err(Error::msg(format!(
                "the client pass failed ({st}; see its message above)"
            )))
        }
        (Err(e), true) => return Err(Error::msg(format!("the client pass wrote no results: {e}"))),
    };
    report::from_json(&text).map_err(|e| Error::msg(format!("the client pass's results: {e}")))
}

/// The environment of a process under the preload library `lib` with the
/// variables `vars`.
pub(crate) fn preload_env(lib: &Path, vars: &[(&str, &str)]) -> Env {
    let mut env = vec![("LD_PRELOAD".to_string(), lib.display().to_string())];
    env.extend(vars.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    env
}

/// Whether this process already runs under the preload with `vars`.
///
/// The preload is known by a symbol only it exports being present in this
/// process, not by its file's name: a copy under another name (an A/B
/// run's `WARPSOCK_PRELOAD_LIB=/elsewhere/lib-old.so`) is the preload all
/// the same. (Session 13's quiet run: with the name checked, such a
/// child ran none of the preloaded transports and wrote an empty result.)
pub(crate) fn running_under(vars: &[(&str, &str)]) -> bool {
    preload_loaded()
        && vars
            .iter()
            .all(|(k, v)| std::env::var(k).is_ok_and(|x| x == *v))
}

/// Whether the preload library is loaded in this process (it exports
/// `warpsock_riomap`).
fn preload_loaded() -> bool {
    // SAFETY: dlsym with the default handle and a NUL-terminated name only
    // looks the symbol up; nothing is called.
    let p = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"warpsock_riomap".as_ptr()) };
    !p.is_null()
}

/// The transports of a pass (`asked`) that have no row in its results
/// (`got`): the child did not run them — its `LD_PRELOAD` named no
/// working preload (not a warpsock preload, or it failed to load).
pub(crate) fn missing_rows(asked: &[Transport], got: &[Record]) -> Vec<&'static str> {
    asked
        .iter()
        .map(|t| t.name())
        .filter(|n| !got.iter().any(|r| r.transport == *n))
        .collect()
}

/// Whether `t` can run in this process as it is.
pub(crate) fn runs_here(t: Transport) -> bool {
    t.preload.is_none_or(running_under)
}

/// `ts` that need the preload, grouped by the environment they need (a
/// pass each), in order.
pub(crate) fn by_env(ts: impl IntoIterator<Item = Transport>) -> Vec<(Vars, Vec<Transport>)> {
    let mut out: Vec<(Vars, Vec<Transport>)> = Vec::new();
    for t in ts {
        let Some(vars) = t.preload else { continue };
        match out.iter_mut().find(|(v, _)| *v == vars) {
            Some((_, g)) if !g.contains(&t) => g.push(t),
            Some(_) => {}
            None => out.push((vars, vec![t])),
        }
    }
    out
}

/// The transports of `plan` that cannot run in this process, grouped
/// into passes by the environment they need.
pub(crate) fn passes_needed(plan: &[Spec]) -> Vec<(Vars, Vec<Transport>)> {
    by_env(plan.iter().map(|s| s.transport).filter(|&t| !runs_here(t)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pass's transport without a row in the child's results is named
    /// (the bench then fails instead of printing a table without it).
    #[test]
    fn a_pass_without_its_rows_names_the_missing_transports() {
        let ddp = crate::transports::find("ddp-socket").expect("known transport");
        let rio = crate::transports::find("riowrite").expect("known transport");
        let row = |t: &str| Record {
            transport: t.into(),
            ..Record::default()
        };
        assert_eq!(missing_rows(&[ddp, rio], &[]), ["ddp-socket", "riowrite"]);
        assert_eq!(
            missing_rows(&[ddp, rio], &[row("riowrite")]),
            ["ddp-socket"]
        );
        assert!(missing_rows(&[ddp], &[row("tcp"), row("ddp-socket")]).is_empty());
    }

    /// The test binary is not under the preload, whatever `LD_PRELOAD`
    /// says by name: the check looks for the library's symbol.
    #[test]
    fn the_preload_is_known_by_its_symbol_not_its_name() {
        assert!(!preload_loaded());
        assert!(!running_under(&[]));
    }
}
