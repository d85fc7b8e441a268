//! rping server (`rping_run_server` / `rping_run_persistent_server` /
//! `rping_test_server`).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use warpsock_engine::{CmError, ConnectRequest, Listener};

use crate::session::{Bufs, Link};
use crate::{
    c_str, ping_pattern, Args, ConnReport, Error, Failure, RdmaInfo, Report, Side, INFO_LEN,
};

/// The "go ahead" Send: rping sends its never-filled `send_buf` (zeros).
const GO_AHEAD: [u8; INFO_LEN] = [0; INFO_LEN];

pub(crate) fn run(args: &Args) -> Result<Report, Error> {
    let host = args.addr.as_deref().unwrap_or("0.0.0.0");
    run_on(&Listener::bind((host, args.port))?, args)
}

/// The server on a listener already bound (by [`run`], or by the caller of
/// [`crate::serve`]). The listener runs the MPA handshakes of connecting
/// peers side by side, each with the default deadline (5 s, as siw), so a
/// silent or slow peer never delays the next.
pub(crate) fn run_on(listener: &Listener, args: &Args) -> Result<Report, Error> {
    // Scripts that bind port 0 learn the port from this line.
    eprintln!(
        "warpsock-rping server: listening on {}",
        listener.local_addr()?
    );
    let limit = if args.persistent { args.conns } else { Some(1) };
    let idle = args.accept_timeout.map(Duration::from_secs_f64);
    let report = Mutex::new(Report::new(Side::Server));
    let record = |peer, res: Result<ConnReport, Error>| {
        let mut r = report.lock().unwrap_or_else(PoisonError::into_inner);
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
    // Sessions running now (persistent mode); each holds a thread and a
    // `-S`-sized buffer, so there are at most `--max-sessions`.
    let active = AtomicUsize::new(0);
    let max = args.max_sessions as usize;
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
                        .unwrap_or_else(PoisonError::into_inner)
                        .setup_failures += 1;
                    continue;
                }
            };
            let peer = req.peer_addr();
            if !args.persistent {
                accepted += 1;
                record(peer, serve(args, req));
                continue;
            }
            let refuse = |req: ConnectRequest, why: &dyn std::fmt::Display| {
                eprintln!("warpsock-rping server: refused {peer}: {why}");
                let _ = req.reject(b"busy");
                report
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .refused += 1;
            };
            if active.load(Ordering::Acquire) >= max {
                refuse(req, &format_args!("{max} sessions active (--max-sessions)"));
                continue;
            }
            // The request travels to the session thread through a slot
            // this thread can take back if the thread cannot be started.
            let slot = Arc::new(Mutex::new(Some(req)));
            let theirs = Arc::clone(&slot);
            let (record, active) = (&record, &active);
            active.fetch_add(1, Ordering::AcqRel);
            let started = std::thread::Builder::new()
                .name(format!("rping-{peer}"))
                .spawn_scoped(scope, move || {
                    let _session = Session(active);
                    let req = theirs.lock().unwrap_or_else(PoisonError::into_inner).take();
                    if let Some(req) = req {
                        record(peer, serve(args, req));
                    }
                });
            match started {
                Ok(_) => accepted += 1,
                Err(e) => {
                    active.fetch_sub(1, Ordering::AcqRel);
                    let req = slot.lock().unwrap_or_else(PoisonError::into_inner).take();
                    if let Some(req) = req {
                        refuse(req, &format_args!("cannot start a session thread: {e}"));
                    }
                }
            }
        }
        Ok(())
    });
    let report = report.into_inner().unwrap_or_else(PoisonError::into_inner);
    end?;
    if report.failures.is_empty() {
        Ok(report)
    } else {
        Err(Error::Server(Box::new(report)))
    }
}

/// A running session: counted in `active` until it ends (also by panic).
struct Session<'a>(&'a AtomicUsize);

impl Drop for Session<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
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
