//! `warpsock-rping`: rping over warpsock (see the library docs).

use std::process::ExitCode;

use clap::Parser;
use warpsock_rping::{run, Args};

/// RDMA ping-pong over user-space iWARP, compatible with rdma-core's rping.
#[derive(Debug, Parser)]
#[command(name = "warpsock-rping", disable_version_flag = true)]
struct Cli {
    #[command(flatten)]
    args: Args,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(&cli.args) {
        Ok(report) => {
            println!("{report}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("warpsock-rping: {e}");
            ExitCode::FAILURE
        }
    }
}
