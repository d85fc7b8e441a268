//! rping server (`rping_run_server` / `rping_run_persistent_server` /
//! `rping_test_server`).

use std::sync::Mutex;
use std::time::Duration;

use warpsock_engine::{CmError, ConnectRequest, Listener};

use crate::session::{Bufs, Link};
use crate::{
    c_str, ping_pattern, Args, ConnReport, Error, Failure, RdmaInfo, Report, Side, INFO_LEN,
};

/// The "go ahead" Send: rping sends its never-filled `send_buf` (zeros).
const GO_AHEAD: [u8; INFO_LEN] = [0; INFO_LEN];
/// How long a connected peer may take to send its MPA Request.
const MPA_REQUEST_WAIT: Duration = Duration::from_secs(10);

pub(crate) fn run(args: &Args) -> Result<Report, Error> {
    let host = args.addr.as_deref().unwrap_or("0.0.0.0");
    let mut listener = Listener::bind((host, args.port))?;
    listener.set_mpa_timeout(MPA_REQUEST_WAIT);
    let limit = if args.persistent { args.conns } else { Some(1) };
    let idle = args.accept_timeout.map(Duration::from_secs_f64);
    let report = Mutex::new(Report::new(Side::Server));
    let record = |peer, res: Result<ConnReport, Error>| {
        let mut r = report
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match res {
            Ok(c) => r.connections.push(c),
            Err(error) => {
                eprintln!("warpsock-rping server: connection from {peer} failed: {error}");
                r.failures.push(Failure {
                    peer: Some(peer),
                    error,
                });
            }
        }
    };
    let mut accepted = 0u64;
    let end = std::thread::scope(|scope| -> Result<(), Error> {
        while limit.is_none_or(|l| accepted < l) {
            let req = match listener.accept(idle) {
                Ok(r) => r,
                Err(CmError::Timeout {
                    stage: "TCP accept",
                    ..
                }) => {
                    if accepted == 0 {
                        return Err(Error::Timeout {
                            step: "a connection",
                            after: idle.unwrap_or_default(),
                        });
                    }
                    return Ok(());
                }
                Err(CmError::Io(e)) if accepted == 0 && !is_transient(&e) => {
                    return Err(Error::Accept(CmError::Io(e)))
                }
                Err(e) => {
                    // A peer that connected but never completed MPA: rping
                    // never even hears of it. Note it and go on.
                    eprintln!("warpsock-rping server: connection setup failed: {e}");
                    report
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .setup_failures += 1;
                    continue;
                }
            };
            accepted += 1;
            let peer = req.peer_addr();
            if args.persistent {
                let record = &record;
                std::thread::Builder::new()
                    .name(format!("rping-{peer}"))
                    .spawn_scoped(scope, move || record(peer, serve(args, req)))?;
            } else {
                record(peer, serve(args, req));
            }
        }
        Ok(())
    });
    let report = report
        .into_inner()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    end?;
    if report.failures.is_empty() {
        Ok(report)
    } else {
        Err(Error::Server(Box::new(report)))
    }
}

fn is_transient(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::ConnectionReset
            | std::io::ErrorKind::ConnectionAborted
            | std::io::ErrorKind::BrokenPipe
            | std::io::ErrorKind::UnexpectedEof
    )
}

/// Serves one connection: accept, ping loop until the client disconnects.
fn serve(args: &Args, req: ConnectRequest) -> Result<ConnReport, Error> {
    let bufs = Bufs::new(args.size as usize, false)?;
    let qp = req.accept(&bufs.init(args), b"").map_err(Error::Accept)?;
    let mut link = Link::new(&bufs, qp, args.step_timeout(), 1);
    let res = ping_loop(args, &bufs, &mut link);
    let conn = link.close();
    res.map(|()| conn)
}

fn ping_loop(args: &Args, bufs: &Bufs, link: &mut Link<'_>) -> Result<(), Error> {
    let mut ping = 0u64;
    loop {
        // Between iterations the client may disconnect: that is the end.
        let src = match link.recv_info("the client's start buffer advertisement") {
            Ok(m) => RdmaInfo::decode(&m),
            Err(Error::Disconnected { .. }) => return Ok(()),
            Err(e) => return Err(e),
        };
        if src.size > args.size {
            return Err(Error::TooLarge {
                advertised: src.size,
                available: args.size,
            });
        }
        link.read(&src, src.size, "the RDMA Read of the client's start buffer")?;
        let len = src.size as usize;
        let data = bufs.rdma.with_bytes(|b| b[..len].to_vec());
        if args.validate {
            let want = ping_pattern(ping, len);
            if let Some(offset) = (0..len).find(|&i| data[i] != want[i]) {
                return Err(Error::Mismatch {
                    iteration: ping,
                    offset,
                    expected: want[offset],
                    found: data[offset],
                });
            }
            link.report.validated += 1;
        }
        if args.verbose {
            println!("server ping data: {}", c_str(&data));
        }
        link.send_info(&GO_AHEAD, "the go-ahead after the RDMA Read to go out")?;
        let sink = RdmaInfo::decode(&link.recv_info("the client's rdma buffer advertisement")?);
        // rping writes strlen(rdma_buf) + 1 bytes (the text and its NUL).
        let wlen = data
            .iter()
            .position(|&b| b == 0)
            .map_or(len, |n| n + 1)
            .min(sink.size as usize);
        link.write(&sink, wlen as u32, "the RDMA Write of the echo")?;
        link.send_info(&GO_AHEAD, "the go-ahead after the RDMA Write to go out")?;
        link.report.iterations += 1;
        ping += 1;
    }
}
