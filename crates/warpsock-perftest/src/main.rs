//! `warpsock-perftest`: perftest's `ib_write_bw` / `ib_read_bw` /
//! `ib_send_bw` client (`-R` servers) over warpsock, and Terminate probes.

use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};
use warpsock_engine::RtrOffer;
use warpsock_perftest::raw::{self, RawCase};
use warpsock_perftest::send_check;
use warpsock_perftest::term_server::{self, ServerCase};
use warpsock_perftest::{run, Params, Provoke, Test};

#[derive(Parser)]
#[command(about = "perftest -R client over warpsock, and siw Terminate probes")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Clone, Copy, ValueEnum)]
enum TestArg {
    Write,
    Read,
    Send,
}

#[derive(Clone, Copy, ValueEnum)]
enum ProvokeArg {
    WriteBadStag,
    WriteBounds,
    ReadBadStag,
    ReadBounds,
    SendTooLong,
}

#[derive(Clone, Copy, ValueEnum)]
enum RawArg {
    Opcode,
    RdmapVersion,
    DdpVersion,
    Msn,
    Qn,
    Crc,
}

#[derive(Clone, Copy, ValueEnum)]
enum ServerArg {
    /// Post an 8-byte receive for the client's 16-byte Send (DDP 1/2/02).
    ShortRecv,
    /// Ask for CRC, corrupt the client's first CRC on input (LLP 2/0/02).
    Crc,
    /// Take the client's first Send, then fail with --code.
    Local,
}

#[derive(Clone, Copy, ValueEnum)]
enum RoleArg {
    Client,
    Server,
}

#[derive(Clone, Copy, ValueEnum)]
enum P2pArg {
    /// Classic setup: the initiator sends first.
    Off,
    /// Offer a zero-length RDMA Write as ready-to-receive (siw's choice).
    Write,
    /// Offer a zero-length RDMA Read.
    Read,
    /// Offer both (as siw with peer_to_peer=1 does).
    Both,
}

#[derive(Subcommand)]
enum Cmd {
    /// Verified Sends (protocol in the `send_check` module; the peer is
    /// scripts/siw/send_check.c on siw, or this tool): the client Sends N
    /// messages of S bytes under the server's credits, the server checks
    /// every byte and reports back.
    SendCheck {
        /// client or server.
        role: RoleArg,
        /// Server address (client), listen address (server).
        #[arg(short = 'a', long, default_value = "127.0.0.1")]
        host: String,
        /// TCP port (server: 0 picks a free one, printed to stderr as
        /// `listening on ADDR:PORT`).
        #[arg(short = 'p', long)]
        port: u16,
        /// Messages.
        #[arg(short = 'n', long)]
        messages: u64,
        /// Bytes per message.
        #[arg(short = 's', long)]
        size: u32,
        /// Server: receives kept posted (the client's window).
        #[arg(short = 'w', long, default_value_t = 32)]
        window: u32,
        /// Client: outstanding Sends.
        #[arg(short = 't', long, default_value_t = 32)]
        depth: usize,
        /// Ask for MPA CRC.
        #[arg(long)]
        crc: bool,
        /// Client: peer-to-peer setup (RFC 6581) offering this RTR.
        #[arg(long, value_enum, default_value_t = P2pArg::Off)]
        p2p: P2pArg,
        /// Server: as peer-to-peer responder, choose Read RTR (the client
        /// must offer both; the engine's `QpOptions::prefer_read_rtr`).
        #[arg(long)]
        choose_read_rtr: bool,
        /// Bound on the accept/connect and every wait, seconds.
        #[arg(long, default_value_t = 60)]
        timeout: u64,
    },
    /// Run a bandwidth test against `ib_<test>_bw -R` (or provoke a Terminate).
    Bw {
        /// write, read or send.
        test: TestArg,
        /// Server address.
        #[arg(short = 'a', long, default_value = "127.0.0.1")]
        host: String,
        /// Server port.
        #[arg(short = 'p', long, default_value_t = 18515)]
        port: u16,
        /// Message size (the server's -s must be at least this).
        #[arg(short = 's', long, default_value_t = 65536)]
        size: u32,
        /// Iterations (Send: equal to the server's -n).
        #[arg(short = 'n', long, default_value_t = 1000)]
        iters: u64,
        /// Outstanding operations.
        #[arg(short = 't', long, default_value_t = 128)]
        tx_depth: usize,
        /// The server's receive queue depth (Send credits).
        #[arg(short = 'r', long, default_value_t = 512)]
        rx_depth: u32,
        /// Verify the data (Write: read every Write back; Read: compare every Read).
        #[arg(long)]
        verify: bool,
        /// Ask for MPA CRC.
        #[arg(long)]
        crc: bool,
        /// Bound on every wait, seconds.
        #[arg(long, default_value_t = 30)]
        timeout: u64,
        /// Provoke this Terminate after the handshake instead of the test.
        #[arg(long)]
        provoke: Option<ProvokeArg>,
    },
    /// Send one malformed FPDU to an iWARP server (e.g. rping -s) and decode its Terminate.
    Raw {
        /// The fault.
        case: RawArg,
        /// Server address.
        #[arg(short = 'a', long, default_value = "127.0.0.1")]
        host: String,
        /// Server port.
        #[arg(short = 'p', long, default_value_t = 7174)]
        port: u16,
        /// Bound on the wait, seconds.
        #[arg(long, default_value_t = 15)]
        timeout: u64,
    },
    /// Accept one iWARP client (e.g. siw's rping -c) on 127.0.0.1 and end
    /// the connection with a Terminate of ours.
    TerminateServer {
        /// How the Terminate comes about.
        case: ServerArg,
        /// Port to listen on (127.0.0.1; 0 picks a free one, printed to
        /// stderr as `listening on ADDR:PORT`).
        #[arg(short = 'p', long)]
        port: u16,
        /// The code for `local`: LAYER/ETYPE/ECODE, ECODE in hex (0/1/00).
        #[arg(long, default_value = "0/0/00")]
        code: String,
        /// Bound on the accept and every wait, seconds.
        #[arg(long, default_value_t = 30)]
        timeout: u64,
    },
}

fn terminate_server(case: ServerArg, port: u16, code: &str, timeout: u64) -> ExitCode {
    let case = match case {
        ServerArg::ShortRecv => ServerCase::ShortRecv,
        ServerArg::Crc => ServerCase::Crc,
        ServerArg::Local => match term_server::parse_code(code) {
            Some(c) => ServerCase::Local(c),
            None => {
                eprintln!("warpsock-perftest: bad --code {code:?} (want LAYER/ETYPE/ECODE)");
                return ExitCode::FAILURE;
            }
        },
    };
    let o = match term_server::serve(port, case, Duration::from_secs(timeout)) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("warpsock-perftest: {e}");
            return ExitCode::FAILURE;
        }
    };
    let want = case.expected();
    println!(
        "case {}: CRC {}",
        case.name(),
        if o.crc { "on" } else { "off" }
    );
    println!("client MPA request {}", raw::hex(&o.mpa_request));
    println!("client first FPDU {}", raw::hex(&o.first_fpdu));
    println!("sent terminate {}", raw::hex(&o.terminate));
    let Some(ctl) = o.control() else {
        println!("no Terminate FPDU in what we sent");
        return ExitCode::FAILURE;
    };
    let (rfc, siw) = term_server::describe(ctl);
    println!("control word {} rfc layout: {rfc}", raw::hex(&ctl));
    println!("control word {} siw bitfields: {siw}", raw::hex(&ctl));
    println!("expect siw log: {}", term_server::siw_log_line(ctl));
    println!(
        "after our terminate the client sent {} bytes{}; closed: {}",
        o.after.len(),
        if o.after.is_empty() {
            String::new()
        } else {
            format!(" ({})", raw::hex(&o.after))
        },
        o.peer_closed
    );
    let sent_ok = o.event == Some(want)
        && term_server::describe(ctl).0.starts_with(&format!(
            "layer {} etype {} ecode {:#04x}",
            want.layer, want.etype, want.ecode
        ));
    println!(
        "warpsock sent: {}; expected layer {} etype {} ecode {:#04x}: {}",
        o.event
            .map_or_else(|| "no Terminate event".into(), |c| c.to_string()),
        want.layer,
        want.etype,
        want.ecode,
        if sent_ok { "match" } else { "MISMATCH" }
    );
    if sent_ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn send_check_cmd(role: RoleArg, p: &send_check::Params) -> ExitCode {
    let r = match role {
        RoleArg::Client => send_check::client(p),
        RoleArg::Server => send_check::server(p),
    };
    match r {
        Ok(r) => {
            println!(
                "{}",
                match role {
                    RoleArg::Client => r.client_line(),
                    RoleArg::Server => r.server_line(),
                }
            );
            if r.ok() {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            eprintln!("warpsock-perftest send-check: {e}");
            ExitCode::FAILURE
        }
    }
}

fn main() -> ExitCode {
    match Cli::parse().cmd {
        Cmd::SendCheck {
            role,
            host,
            port,
            messages,
            size,
            window,
            depth,
            crc,
            p2p,
            choose_read_rtr,
            timeout,
        } => send_check_cmd(
            role,
            &send_check::Params {
                host,
                port,
                n: messages,
                s: size,
                window,
                depth,
                crc,
                p2p: match p2p {
                    P2pArg::Off => None,
                    P2pArg::Write => Some(RtrOffer {
                        write: true,
                        read: false,
                    }),
                    P2pArg::Read => Some(RtrOffer {
                        write: false,
                        read: true,
                    }),
                    P2pArg::Both => Some(RtrOffer {
                        write: true,
                        read: true,
                    }),
                },
                prefer_read_rtr: choose_read_rtr,
                timeout: Duration::from_secs(timeout),
            },
        ),
        Cmd::TerminateServer {
            case,
            port,
            code,
            timeout,
        } => terminate_server(case, port, &code, timeout),
        Cmd::Bw {
            test,
            host,
            port,
            size,
            iters,
            tx_depth,
            rx_depth,
            verify,
            crc,
            timeout,
            provoke,
        } => {
            let p = Params {
                test: match test {
                    TestArg::Write => Test::Write,
                    TestArg::Read => Test::Read,
                    TestArg::Send => Test::Send,
                },
                host,
                port,
                size,
                iters,
                tx_depth: tx_depth.max(1),
                rx_depth: rx_depth.max(1),
                verify,
                crc,
                timeout: Duration::from_secs(timeout),
                provoke: provoke.map(|v| match v {
                    ProvokeArg::WriteBadStag => Provoke::WriteBadStag,
                    ProvokeArg::WriteBounds => Provoke::WriteBounds,
                    ProvokeArg::ReadBadStag => Provoke::ReadBadStag,
                    ProvokeArg::ReadBounds => Provoke::ReadBounds,
                    ProvokeArg::SendTooLong => Provoke::SendTooLong,
                }),
            };
            match run(&p) {
                Ok(r) => {
                    println!("{r}");
                    if let Some((code, by_peer)) = r.terminated {
                        let want = p.provoke.map(Provoke::expected);
                        println!(
                            "terminate: layer {} etype {} ecode {:#04x} by_peer {by_peer} expected {}",
                            code.layer,
                            code.etype,
                            code.ecode,
                            want.map_or_else(String::new, |w| format!(
                                "layer {} etype {} ecode {:#04x}",
                                w.layer, w.etype, w.ecode
                            ))
                        );
                        if Some(code) != want || !by_peer {
                            return ExitCode::FAILURE;
                        }
                    }
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("warpsock-perftest: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Cmd::Raw {
            case,
            host,
            port,
            timeout,
        } => {
            let case = match case {
                RawArg::Opcode => RawCase::Opcode,
                RawArg::RdmapVersion => RawCase::RdmapVersion,
                RawArg::DdpVersion => RawCase::DdpVersion,
                RawArg::Msn => RawCase::Msn,
                RawArg::Qn => RawCase::Qn,
                RawArg::Crc => RawCase::Crc,
            };
            match raw::probe(&host, port, case, Duration::from_secs(timeout)) {
                Ok(o) => {
                    let want = case.expected();
                    println!("case {}: sent {}", case.name(), raw::hex(&o.sent));
                    println!("received {}", raw::hex(&o.received));
                    println!("terminate body {}", raw::hex(&o.terminate_body));
                    if let Some(s) = o.siw_layout {
                        println!(
                            "siw layout: layer {} etype {} ecode {:#04x} M{} D{} R{}",
                            s.code.layer,
                            s.code.etype,
                            s.code.ecode,
                            s.m as u8,
                            s.d as u8,
                            s.r as u8
                        );
                    }
                    if let Some(r) = o.rfc_layout {
                        println!(
                            "rfc layout: layer {} etype {} ecode {:#04x} M{} D{} R{}",
                            r.code.layer,
                            r.code.etype,
                            r.code.ecode,
                            r.m as u8,
                            r.d as u8,
                            r.r as u8
                        );
                    }
                    let siw_ok = o.siw_layout.is_some_and(|s| s.code == want);
                    match o.decoded {
                        Some((code, by_peer)) => println!(
                            "warpsock decoded: layer {} etype {} ecode {:#04x} by_peer {by_peer} ({code}); expected layer {} etype {} ecode {:#04x}: {}",
                            code.layer, code.etype, code.ecode, want.layer, want.etype, want.ecode,
                            if code == want && by_peer { "match" } else { "MISMATCH" }
                        ),
                        None => println!("warpsock decoded: no Terminate event"),
                    }
                    println!(
                        "siw sent the expected code: {}; kicks {}",
                        if siw_ok { "yes" } else { "NO" },
                        o.kicks
                    );
                    if siw_ok && o.decoded == Some((want, true)) {
                        ExitCode::SUCCESS
                    } else {
                        ExitCode::FAILURE
                    }
                }
                Err(e) => {
                    eprintln!("warpsock-perftest: {e}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}
