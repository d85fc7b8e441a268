//! `warpsock`: measure warpsock iWARP (Send, RDMA Write, RDMA Read, CRC off
//! and on) head to head with the host's own TCP and UDP and the UDP
//! offload layer, with the tests of the Head-to-TOE study, on loopback,
//! between two network namespaces or between two hosts.
//!
//! ```text
//! warpsock bench                      # loopback comparison, about a minute
//! warpsock bench --suite full         # every test, every transport
//! warpsock bench --netns              # server and client in two namespaces (root)
//! warpsock report RESULTS.json --out DIR   # figures and summary.md
//! warpsock server [--once]            # serve bench runs (ports 18515, 18516)
//! warpsock client HOST[:PORT]         # the same tests against that server
//! warpsock bench --peer HOST[:PORT]   # same as `client`
//! ```
//!
//! Exit status: 0 on success, 1 when a run fails (refused or unreachable
//! peer, a transfer error), 2 for a bad command line.
//!
//! How client and server talk is documented in [`ctl`]; the one benchmark
//! loop, roles and how every connection ends in [`driver`]; each
//! transport, and how to add one (a file and a line), in [`transports`];
//! the suite's plan in [`opts`]; the results and their outputs in
//! [`report`].
//!
//! # Adding a subcommand
//!
//! Add `mod foo;` below and one line `Foo(foo::Args),` to `commands!`,
//! where `foo::Args` derives [`clap::Args`] and implements [`Run`].

mod apps;
mod bench;
mod child;
mod ctl;
mod data;
mod driver;
mod error;
mod opts;
mod parse;
mod pin;
mod report;
mod rping;
mod run;
mod server;
mod spec;
mod stats;
mod transports;

use std::process::ExitCode;

use clap::Parser;

pub(crate) use error::Error;

/// A subcommand: parsed arguments that know how to run themselves.
pub(crate) trait Run {
    /// Runs the subcommand. Errors are printed as one line by `main`.
    fn run(self) -> Result<(), Error>;
}

/// Declares the subcommand enum and its dispatch from one list of
/// `Variant(ArgsType)` lines (doc comments become the help text).
macro_rules! commands {
    ($($(#[$meta:meta])* $name:ident($args:ty),)*) => {
        /// The subcommands.
        #[derive(Debug, clap::Subcommand)]
        enum Command {
            $($(#[$meta])* $name($args),)*
        }

        impl Run for Command {
            fn run(self) -> Result<(), Error> {
                match self {
                    $(Self::$name(a) => a.run(),)*
                }
            }
        }
    };
}

commands! {
    /// Latency and bandwidth: host TCP (and, in the full suite, every test
    /// of the Head-to-TOE set over host TCP/UDP and the UDP offload) next to
    /// warpsock Send, RDMA Write and RDMA Read, CRC off and on (loopback
    /// unless --peer or --netns is given); `--suite apps`: unmodified
    /// programs (nginx, redis, memcached, aria2c, iperf3, GStreamer) over
    /// every transport that carries them.
    Bench(bench::BenchCmd),
    /// Serve bench runs from `warpsock client` / `warpsock bench --peer`.
    Server(server::ServerCmd),
    /// Run the bench tests against a `warpsock server` at HOST or HOST:PORT.
    Client(bench::ClientCmd),
    /// Draw the figures (PNG and SVG) and a Markdown summary of a
    /// `bench --json` results file.
    Report(report::ReportCmd),
    /// rdma-core's rping over warpsock (`-s` server, `-c -a HOST -p PORT`
    /// client, `-C`, `-S`, `-V`, `-v`, `-P`), wire-compatible with rping on
    /// Linux siw.
    Rping(rping::RpingCmd),
    /// Run an unmodified libibverbs/librdmacm program (rping, perftest,
    /// fi_pingpong, rstream, …) on warpsock: `warpsock run -- PROGRAM ARGS…`.
    Run(run::RunCmd),
    /// Exit status 0 when a library loaded into this process exports
    /// `warpsock_feature_NAME` (the apps suite's probe).
    #[command(hide = true)]
    ProbeFeature(apps::ProbeCmd),
    /// The apps suite's memcached load client.
    #[command(hide = true)]
    MemcachedLoad(apps::LoadCmd),
}

/// Whether this binary has the subcommand `name` (another issue's
/// subcommand, e.g. `run`, is detected, never assumed).
pub(crate) fn has_subcommand(name: &str) -> bool {
    use clap::CommandFactory;
    Cli::command().find_subcommand(name).is_some()
}

/// warpsock: user-space iWARP (RDMA over TCP), measured against host TCP and UDP.
#[derive(Debug, Parser)]
#[command(
    name = "warpsock",
    version,
    after_help = "Exit status: 0 success, 1 run failed (e.g. connection refused), 2 bad command line."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command.run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("warpsock: error: {e}");
            ExitCode::from(1)
        }
    }
}
