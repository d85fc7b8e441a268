//! `warpsock server`: listens on a control port (which also takes the
//! host-TCP baseline's data connections and the UDP flows' companions)
//! and an iWARP data port, and serves bench sessions one client at a time
//! (protocol: the `ctl` module). Each test runs on one thread for all its
//! connections, or one per connection for multi-stream.
//!
//! # What it exposes
//!
//! Anyone who reaches the two ports (no `--token`), or who knows the token,
//! can make the server:
//!
//! - run benchmark tests: for each, register up to `--max-test-memory`
//!   (an upper bound computed from the test's size, window and connection
//!   count, checked before anything is allocated; default 1024 MiB), use
//!   the CPU for the test's duration (at most 3600 s) on up to 64
//!   connections, one thread each at most;
//! - send data back to the client's own address only: every data
//!   connection is opened by the client, and a UDP flow's socket is
//!   connected to the address its TCP companion came from (the client
//!   names only the port);
//! - tell its CPU count and kernel boot id (the `hello` answer).
//!
//! Peers cannot stall it: one thread sorts the control port's connections
//! (`port.rs`): a connection must send its first line within 5 s, lines
//! are at most 64 KiB, at most 64 connections are sorted at once; a
//! session idle for `--idle-timeout` seconds (default 10) is closed, and
//! one idle for a second yields to a client that waits; a client that
//! arrives while a test runs is told `error busy` at once. Errors repeat
//! at most 60 characters of what a peer sent.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::io::Write;
use std::net::{IpAddr, SocketAddr, TcpListener};
use std::time::{Duration, Instant};

use warpsock_engine::Listener;

use crate::ctl::{decode_spec, shorten, Ctl, Line, RecvError, SideReport, VERSION};
use crate::data::gathered;
use crate::driver::{self, run_threads, Job, Listeners};
use crate::parse::{parse_range, parse_secret};
use crate::spec::{Spec, Test, DEFAULT_PORT};
use crate::stats::{Cpu, Stats};
use crate::{pin, transports, Error, Run};
use port::ControlPort;

mod port;

/// How often an idle session looks whether a client waits.
const IDLE_SLICE: Duration = Duration::from_millis(100);

/// `warpsock server` options.
#[derive(Debug, clap::Args)]
pub(crate) struct ServerCmd {
    /// Address to listen on (e.g. 0.0.0.0, ::, 127.0.0.1).
    #[arg(long, default_value = "0.0.0.0", value_name = "ADDR")]
    bind: IpAddr,
    /// Control port (also used by the host-TCP baseline); 0 picks a free
    /// port.
    #[arg(long, default_value_t = DEFAULT_PORT)]
    port: u16,
    /// iWARP data port [default: PORT+1, or a free port when PORT is 0].
    #[arg(long, value_name = "PORT")]
    data_port: Option<u16>,
    /// Serve one client, then exit (status 1 if its session failed).
    #[arg(long)]
    once: bool,
    /// Serve only clients that present this shared secret (`warpsock
    /// client --token`, `bench --peer … --token`).
    #[arg(long, value_name = "SECRET", value_parser = parse_secret)]
    token: Option<String>,
    /// Refuse a test whose memory on this side could exceed this many MiB
    /// (1 to 65536).
    #[arg(long, value_name = "MIB", default_value = "1024", value_parser = parse_mib)]
    max_test_memory: u64,
    /// Close a session whose client sends nothing for this many seconds
    /// between tests (1 to 600).
    #[arg(long, value_name = "SECONDS", default_value = "10", value_parser = parse_idle)]
    idle_timeout: u64,
}

fn parse_mib(s: &str) -> Result<u64, String> {
    parse_range(s, 1, 65_536, " MiB")
}

fn parse_idle(s: &str) -> Result<u64, String> {
    parse_range(s, 1, 600, " seconds")
}

fn listen_error(addr: SocketAddr, e: &std::io::Error) -> Error {
    Error::msg(format!("cannot listen on {addr}: {e}"))
}

impl Run for ServerCmd {
    fn run(self) -> Result<(), Error> {
        let caddr = SocketAddr::new(self.bind, self.port);
        let ctl_l = TcpListener::bind(caddr).map_err(|e| listen_error(caddr, &e))?;
        let caddr = ctl_l.local_addr()?;
        let dport = match (self.data_port, self.port) {
            (Some(p), _) => p,
            (None, 0) => 0,
            (None, p) => p
                .checked_add(1)
                .ok_or_else(|| Error::msg("--port 65535 leaves no data port; give --data-port"))?,
        };
        let daddr = SocketAddr::new(self.bind, dport);
        let data_l = Listener::bind(daddr).map_err(|e| listen_error(daddr, &e))?;
        let daddr = data_l.local_addr()?;
        let port = ControlPort::start(ctl_l)?;
        {
            // One line on stdout, read by `warpsock bench` and the tests.
            let mut out = std::io::stdout().lock();
            writeln!(
                out,
                "warpsock server listening: control={caddr} data={daddr}"
            )?;
            out.flush()?;
        }
        loop {
            let (mut ctl, hello) = port.next_client()?;
            let peer = ctl
                .peer()
                .map_or_else(|_| "a client".to_string(), |p| p.to_string());
            let res = session(&mut ctl, &hello, &port, &data_l, daddr.port(), &self);
            port.end();
            pin::pin(None)?;
            match res {
                Ok(()) if self.once => return Ok(()),
                Err(e) if self.once => return Err(e.context(format!("session with {peer}"))),
                Ok(()) => {}
                Err(e) => eprintln!("warpsock server: session with {peer}: {e}"),
            }
        }
    }
}

fn new_token() -> u64 {
    let mut h = RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos(),
    );
    h.finish()
}

/// Serves one client, whose `hello` line is in, until `bye`.
fn session(
    ctl: &mut Ctl,
    hello: &Line,
    port: &ControlPort,
    data_l: &Listener,
    data_port: u16,
    opts: &ServerCmd,
) -> Result<(), Error> {
    let v = match hello.num::<u32>("warpsock-bench") {
        Ok(v) => v,
        Err(e) => {
            let _ = ctl.send(&format!(
                "error this is a warpsock server: expected 'hello warpsock-bench={VERSION}'"
            ));
            return Err(e);
        }
    };
    if v != VERSION {
        let m = format!("protocol version {v} is not supported (this server speaks {VERSION})");
        ctl.send(&format!("error {m}"))?;
        return Err(Error::msg(m));
    }
    if let Some(secret) = &opts.token {
        if hello.get("auth").ok() != Some(secret.as_str()) {
            let m = "this server needs its shared token (--token SECRET)";
            ctl.send(&format!("error {m}"))?;
            return Err(Error::msg(
                "refused: the client did not give the shared token",
            ));
        }
    }
    let token = new_token();
    let peer = ctl.peer()?;
    port.begin(peer, token);
    // `boot`: the kernel's boot id, so that a client in another network
    // namespace of this machine knows it shares the CPUs (placement).
    let boot = pin::boot_id().map_or(String::new(), |b| format!(" boot={b}"));
    ctl.send(&format!(
        "hello warpsock-bench={VERSION} data-port={data_port} token={token:016x} cpus={}{boot}",
        pin::cpu_count()
    ))?;
    let idle = Duration::from_secs(opts.idle_timeout);
    loop {
        port.idle(peer);
        let since = Instant::now();
        let line = loop {
            match ctl.recv_within(Some(IDLE_SLICE)) {
                Ok(l) => break l,
                Err(RecvError::Failed(e)) => return Err(e),
                Err(RecvError::Timeout) => {}
            }
            let waited = since.elapsed();
            if waited >= idle {
                let m = format!("the client sent nothing for {} s", idle.as_secs());
                let _ = ctl.send(&format!("error {m}; closing"));
                return Err(Error::msg(m));
            }
            if waited >= port::YIELD_AFTER && port.someone_waits() {
                let m = format!(
                    "idle for {:.0} s while another client waits",
                    waited.as_secs_f64()
                );
                let _ = ctl.send(&format!("error {m}; closing"));
                return Err(Error::msg(m));
            }
        };
        match line.verb.as_str() {
            "bye" => return Ok(()),
            "test" => serve_test(ctl, &line, port, peer, data_l, token, opts.max_test_memory)?,
            "error" => {
                return Err(Error::msg(format!(
                    "the client reports: {}",
                    shorten(&line.rest)
                )))
            }
            v => {
                let v = shorten(v);
                ctl.send(&format!("error unknown request '{v}'"))?;
                return Err(Error::msg(format!("unknown request '{v}'")));
            }
        }
    }
}

/// An upper bound of the memory this side registers or allocates for a
/// test: per connection its message slots and (RDMA) its target and sink
/// regions, per thread its shared bodies.
pub(crate) fn test_memory(spec: &Spec) -> u64 {
    let (size, conns, window) = (spec.size as u64, spec.conns as u64, spec.window as u64);
    let per_conn = if gathered(spec.size) {
        2 * size + 64 * window
    } else {
        // tx slots, receive slots (2 windows + control), region, sink.
        (3 * window + 10) * size
    };
    conns * per_conn + conns.min(64) * 2 * size
}

/// Runs one test; its failure is reported to the client, which decides.
///
/// The port shows `peer` as testing only while the test runs: a test
/// refused at once, and one whose answer is on its way, leave the session
/// idle, so that a client starting right after the answer (the same user's
/// next run) waits as the next client instead of being told the server is
/// busy.
fn serve_test(
    ctl: &mut Ctl,
    line: &Line,
    port: &ControlPort,
    peer: SocketAddr,
    data_l: &Listener,
    token: u64,
    max_mib: u64,
) -> Result<(), Error> {
    let spec = match decode_spec(line) {
        Ok(s) => s,
        Err(e) => return ctl.send(&format!("error {e}")),
    };
    let need = test_memory(&spec);
    if need > max_mib << 20 {
        return ctl.send(&format!(
            "error {}: needs up to {} MiB of memory on the server; this server allows {max_mib} MiB per test (--max-test-memory)",
            spec.label(),
            need.div_ceil(1 << 20)
        ));
    }
    if let Err(e) = pin::pin(spec.pin) {
        return ctl.send(&format!("error server: {e}"));
    }
    port.testing(peer);
    let cpu0 = Cpu::now();
    let res = run_test(ctl, &spec, port, data_l, token);
    let cpu = Cpu::now().since(cpu0);
    port.idle(peer);
    match res {
        Ok(st) => ctl.send(&SideReport::new(&st, cpu).encode()),
        Err(e) => ctl.send(&format!("error {}: {e}", spec.label())),
    }
}

/// The server's side of one test: says `ready` once it can take the
/// client's connections, accepts them and runs its role on them.
fn run_test(
    ctl: &mut Ctl,
    spec: &Spec,
    port: &ControlPort,
    data_l: &Listener,
    token: u64,
) -> Result<Stats, Error> {
    let (_, role) = spec.roles();
    let noop = |_: f64| {};
    let job = Job {
        spec,
        role,
        epoch: Instant::now(),
        tick: &noop,
    };
    let at = Listeners {
        ctl: port,
        data: data_l,
        token,
    };
    let link = transports::link(spec.transport);
    let mut ready = || ctl.send("ready");
    if spec.test == Test::Conn {
        return link.setup_serve(&job, &at, &mut ready);
    }
    let threads = spec.test.server_threads(spec.conns);
    let eps = link.accept(&job, &at, threads, &mut ready)?;
    run_threads(eps, |_, mut ep| driver::run(&job, ep.as_mut()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::{Budget, ProgressMode};

    #[test]
    fn memory_bound_covers_the_suite_and_refuses_the_absurd() {
        let spec = |size: usize, conns: usize, window: usize| Spec {
            test: Test::Bw,
            transport: transports::find("write").unwrap(),
            crc: false,
            size,
            window,
            conns,
            progress: ProgressMode::Caller,
            busy_poll_us: 0,
            client_pin: None,
            pin: None,
            verify: false,
            budget: Budget::Iters(1),
            rate: 0,
        };
        let mib = |s: Spec| test_memory(&s) >> 20;
        // The full suite's largest points stay far below the default.
        assert!(mib(spec(4 << 20, 1, 8)) < 64);
        assert!(mib(spec(32 << 10, 64, 8)) < 64);
        assert!(mib(spec(4095, 64, 64)) < 64);
        // 64 connections of 64 MiB: 8 GiB and more.
        assert!(mib(spec(64 << 20, 64, 8)) >= 8192);
    }
}
