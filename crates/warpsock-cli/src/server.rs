//! `warpsock server`: listens on a control port (which also takes the
//! host-TCP baseline's data connections and the UDP flows' companions)
//! and an iWARP data port, and serves bench sessions one client at a time
//! (protocol: [`crate::ctl`]). Each test runs on one thread for all its
//! connections, or one per connection for multi-stream.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::io::Write;
use std::net::{IpAddr, SocketAddr, TcpListener};
use std::time::{Duration, Instant};

use warpsock_engine::Listener;

use crate::ctl::{decode_spec, Ctl, Line, SideReport, VERSION};
use crate::driver::{self, run_threads, Job, Listeners};
use crate::spec::{Spec, Test, DEFAULT_PORT};
use crate::stats::{Cpu, Stats};
use crate::{pin, transports, Error, Run};

/// How long the server waits for the client's next control line.
const SESSION_IDLE: Duration = Duration::from_secs(600);

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
            let (s, peer) = ctl_l.accept()?;
            let res = Ctl::new(s)
                .map_err(Error::from)
                .and_then(|mut ctl| session(&mut ctl, &ctl_l, &data_l, daddr.port()));
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

/// Serves one client until `bye`.
fn session(
    ctl: &mut Ctl,
    ctl_l: &TcpListener,
    data_l: &Listener,
    data_port: u16,
) -> Result<(), Error> {
    let hello = ctl
        .recv(Some(Duration::from_secs(30)))
        .and_then(|l| l.expect("hello"));
    let v = match hello.and_then(|h| h.num::<u32>("warpsock-bench")) {
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
    let token = new_token();
    // `boot`: the kernel's boot id, so that a client in another network
    // namespace of this machine knows it shares the CPUs (placement).
    let boot = pin::boot_id().map_or(String::new(), |b| format!(" boot={b}"));
    ctl.send(&format!(
        "hello warpsock-bench={VERSION} data-port={data_port} token={token:016x} cpus={}{boot}",
        pin::cpu_count()
    ))?;
    loop {
        let line = ctl.recv(Some(SESSION_IDLE))?;
        match line.verb.as_str() {
            "bye" => return Ok(()),
            "test" => serve_test(ctl, &line, ctl_l, data_l, token)?,
            "error" => return Err(Error::msg(format!("the client reports: {}", line.rest))),
            v => {
                ctl.send(&format!("error unknown request '{v}'"))?;
                return Err(Error::msg(format!("unknown request '{v}'")));
            }
        }
    }
}

/// Runs one test; its failure is reported to the client, which decides.
fn serve_test(
    ctl: &mut Ctl,
    line: &Line,
    ctl_l: &TcpListener,
    data_l: &Listener,
    token: u64,
) -> Result<(), Error> {
    let spec = match decode_spec(line) {
        Ok(s) => s,
        Err(e) => return ctl.send(&format!("error {e}")),
    };
    if let Err(e) = pin::pin(spec.pin) {
        return ctl.send(&format!("error server: {e}"));
    }
    let cpu0 = Cpu::now();
    let res = run_test(ctl, &spec, ctl_l, data_l, token);
    let cpu = Cpu::now().since(cpu0);
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
    ctl_l: &TcpListener,
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
        ctl: ctl_l,
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
