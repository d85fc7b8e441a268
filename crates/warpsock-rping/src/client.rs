//! rping client (`rping_run_client` / `rping_test_client`).

use std::net::{SocketAddr, ToSocketAddrs};
use std::time::{Duration, Instant};

use warpsock_engine::{connect, CmError, Qp};

use crate::session::{Bufs, Link};
use crate::{c_str, ping_pattern, Args, Error, RdmaInfo, Report, Side};

/// First back-off between connection attempts; doubles up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(200);
const MAX_BACKOFF: Duration = Duration::from_secs(2);
/// Longest MPA Reply wait per attempt (siw's own initiator waits 10 s).
const MAX_MPA_WAIT: Duration = Duration::from_secs(10);
const MIN_ATTEMPT: Duration = Duration::from_millis(500);

pub(crate) fn run(args: &Args) -> Result<Report, Error> {
    let host = args.addr.as_deref().expect("checked: client has -a");
    let addrs: Vec<SocketAddr> = (host, args.port)
        .to_socket_addrs()
        .map_err(|e| Error::Connect {
            attempts: 0,
            source: CmError::Resolve(e),
        })?
        .collect();
    let size = args.size as usize;
    let bufs = Bufs::new(size, true)?;
    let (qp, attempts) = connect_with_retry(&bufs, args, &addrs)?;
    let mut link = Link::new(&bufs, qp, args.step_timeout(), attempts);
    let start = bufs.start.as_ref().expect("client has a start buffer");
    let start_info = RdmaInfo {
        buf: start.addr(),
        rkey: start.rkey(),
        size: args.size,
    }
    .encode();
    let rdma_info = RdmaInfo {
        buf: bufs.rdma.addr(),
        rkey: bufs.rdma.rkey(),
        size: args.size,
    }
    .encode();
    let mut ping = 0u64;
    let outcome = loop {
        if args.count != 0 && ping >= args.count {
            break Ok(());
        }
        let pattern = ping_pattern(ping, size);
        start.write(0, &pattern);
        bufs.rdma.with_bytes_mut(|b| b.fill(0));
        let step = (|| {
            link.send_info(&start_info, "the start buffer advertisement to go out")?;
            if ping == 0 {
                link.recv_info_kicking("the server's go-ahead after its RDMA Read")?;
            } else {
                link.recv_info("the server's go-ahead after its RDMA Read")?;
            }
            link.send_info(&rdma_info, "the rdma buffer advertisement to go out")?;
            link.recv_info("the server's go-ahead after its RDMA Write")?;
            if args.validate {
                let echo = bufs.rdma.to_vec();
                if let Some(offset) = (0..size).find(|&i| echo[i] != pattern[i]) {
                    return Err(Error::Mismatch {
                        iteration: ping,
                        offset,
                        expected: pattern[offset],
                        found: echo[offset],
                    });
                }
            }
            Ok(())
        })();
        if let Err(e) = step {
            break Err(e);
        }
        // The server Read our start buffer and Wrote the echo into ours.
        link.report.iterations += 1;
        link.report.read_bytes += size as u64;
        link.report.write_bytes += size as u64;
        if args.validate {
            link.report.validated += 1;
        }
        if args.verbose {
            println!("ping data: {}", bufs.rdma.with_bytes(c_str));
        }
        ping += 1;
    };
    let conn = link.close();
    outcome?;
    let mut report = Report::new(Side::Client);
    report.connections.push(conn);
    Ok(report)
}

/// Connects, retrying with back-off until `--timeout` is used up.
fn connect_with_retry(bufs: &Bufs, args: &Args, addrs: &[SocketAddr]) -> Result<(Qp, u32), Error> {
    let deadline = Instant::now() + args.step_timeout();
    let mut backoff = FIRST_BACKOFF;
    let mut attempts = 0;
    loop {
        attempts += 1;
        let left = deadline.saturating_duration_since(Instant::now());
        let mut init = bufs.init(args);
        init.options.connect_timeout = left.clamp(MIN_ATTEMPT, MAX_MPA_WAIT);
        init.options.mpa_timeout = left.clamp(MIN_ATTEMPT, MAX_MPA_WAIT);
        match connect(addrs, &init) {
            Ok(qp) => return Ok((qp, attempts)),
            Err(e) if e.is_retryable() && Instant::now() + backoff < deadline => {
                eprintln!(
                    "warpsock-rping: attempt {attempts} failed ({e}); retrying in {} ms",
                    backoff.as_millis()
                );
                std::thread::sleep(backoff);
                backoff = (backoff * 2).min(MAX_BACKOFF);
            }
            Err(source) => return Err(Error::Connect { attempts, source }),
        }
    }
}
