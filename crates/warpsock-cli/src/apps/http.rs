//! `http-close`: the cluster monitor's pattern (a connection per
//! transaction, about 6 KB each) as today's web traffic: nginx serving a
//! 6 KiB file to wrk sending `Connection: close`. Every request wrk counts
//! must be in nginx's access log with status 200.

use std::path::Path;

use super::env::{Launch, Proto, Setup};
use super::{argv, error_lines, number_after, Cx, Measured, Server, Workload};
use crate::child;
use crate::Error;

/// The workload.
pub(crate) struct HttpClose;

/// Size of the document.
const DOC: usize = 6 * 1024;

impl Workload for HttpClose {
    fn name(&self) -> &'static str {
        "http-close"
    }
    fn title(&self) -> &'static str {
        "connection per transaction: nginx + wrk, 6 KiB, Connection: close"
    }
    fn proto(&self) -> Proto {
        Proto::Tcp
    }
    fn needs(&self) -> &'static [(&'static str, &'static str)] {
        &[("nginx", "nginx-light"), ("wrk", "wrk")]
    }
    fn metric(&self) -> &'static str {
        "requests/s"
    }

    fn run(&self, cx: &Cx, setup: &Setup) -> Result<Vec<Measured>, Error> {
        let root = cx.dir.join("www");
        std::fs::create_dir_all(&root)?;
        write_doc(&root.join("f6k"), DOC)?;
        let port = child::free_port()?;
        let launch = setup.launch(&[port]);
        let srv = nginx(cx, &launch, &root, port)?;
        let conns = if cx.quick { "4" } else { "16" };
        let out = cx.client(
            &launch,
            &argv(&[
                "wrk",
                "-t",
                "1",
                "-c",
                conns,
                "-d",
                &format!("{:.0}s", cx.secs.max(1.0)),
                "--latency",
                "-H",
                "Connection: close",
                &format!("http://{}:{port}/f6k", cx.server.ip),
            ]),
        );
        let log = srv.stop();
        let out = out?;
        let served = std::fs::read_to_string(cx.dir.join(format!("access-{port}.log")))
            .unwrap_or_default()
            .lines()
            .filter(|l| l.trim() == "200")
            .count() as u64;
        let mut m = read_wrk(&out);
        m.case = format!("6 KiB, {conns} connections");
        if let Some(n) = m.requests {
            if served < n {
                m.problems
                    .push(format!("wrk counted {n} requests, nginx answered {served}"));
            }
        }
        m.problems.extend(error_lines(&log?));
        Ok(vec![m])
    }
}

/// What wrk printed: requests/s, p50 and p99, requests, errors.
fn read_wrk(out: &str) -> Measured {
    let mut m = Measured {
        value: number_after(out, "Requests/sec:").unwrap_or(0.0),
        p50_ms: latency(out, "50%"),
        p99_ms: latency(out, "99%"),
        requests: out
            .lines()
            .find(|l| l.contains(" requests in "))
            .and_then(|l| l.split_whitespace().next()?.parse().ok()),
        ..Measured::default()
    };
    if let Some(l) = out.lines().find(|l| l.contains("Socket errors:")) {
        // connect, read, write, timeout: a closed connection is wrk's read
        // of the server's close, not an error, with Connection: close.
        let errs: Vec<u64> = l
            .split(',')
            .filter(|p| !p.contains("read"))
            .filter_map(|p| p.split_whitespace().last()?.parse().ok())
            .collect();
        if errs.iter().any(|&e| e > 0) {
            m.problems.push(crate::ctl::shorten(l.trim()));
        }
    }
    if let Some(l) = out.lines().find(|l| l.contains("Non-2xx")) {
        m.problems.push(crate::ctl::shorten(l.trim()));
    }
    m
}

/// A wrk latency percentile line (`99%  1.23ms`), in ms.
fn latency(out: &str, pct: &str) -> Option<f64> {
    let l = out.lines().find(|l| l.trim_start().starts_with(pct))?;
    let v = l.split_whitespace().nth(1)?;
    let split = v.find(|c: char| c.is_ascii_alphabetic())?;
    let (n, unit) = v.split_at(split);
    let n: f64 = n.parse().ok()?;
    Some(match unit {
        "us" => n / 1000.0,
        "ms" => n,
        "s" => n * 1000.0,
        _ => return None,
    })
}

/// A document of `len` bytes whose contents a client can check: byte `i`
/// is `i * 31 + 7` (mod 256), as the micro suite's messages.
pub(super) fn write_doc(path: &Path, len: usize) -> Result<(), Error> {
    use std::io::Write;
    let mut f = std::io::BufWriter::new(std::fs::File::create(path)?);
    let mut block = vec![0u8; 1 << 20];
    crate::data::fill(&mut block);
    let mut left = len;
    while left > 0 {
        let n = left.min(block.len());
        f.write_all(&block[..n])?;
        left -= n;
    }
    f.flush()?;
    Ok(())
}

/// Starts nginx serving `root` on the server's address and `port`, one
/// process, its access log (status codes) in the run's directory.
pub(super) fn nginx(cx: &Cx, launch: &Launch, root: &Path, port: u16) -> Result<Server, Error> {
    let d = &cx.dir;
    let tmp = d.join(format!("nginx-{port}"));
    std::fs::create_dir_all(&tmp)?;
    let conf = d.join(format!("nginx-{port}.conf"));
    let t = tmp.display();
    std::fs::write(
        &conf,
        format!(
            "daemon off;\nmaster_process off;\nworker_processes 1;\npid {t}/nginx.pid;\n\
             error_log stderr warn;\nevents {{ worker_connections 1024; }}\n\
             http {{\n  log_format st '$status';\n  access_log {log} st;\n  sendfile on;\n  \
             keepalive_requests 100000;\n  client_body_temp_path {t}/body;\n  \
             proxy_temp_path {t}/proxy;\n  fastcgi_temp_path {t}/fcgi;\n  \
             uwsgi_temp_path {t}/uwsgi;\n  scgi_temp_path {t}/scgi;\n  \
             server {{ listen {ip}:{port}; root {root}; }}\n}}\n",
            log = d.join(format!("access-{port}.log")).display(),
            ip = cx.server.ip,
            root = root.display(),
        ),
    )?;
    cx.server(
        launch,
        &argv(&[
            "nginx",
            "-p",
            &tmp.display().to_string(),
            "-c",
            &conf.display().to_string(),
            "-e",
            "stderr",
        ]),
        port,
        true,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const WRK: &str = "Running 1s test @ http://127.0.0.1:1/f6k
  1 threads and 4 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency   200.00us   50.00us   1.00ms   90.00%
  Latency Distribution
     50%  180.00us
     75%  220.00us
     90%  300.00us
     99%    1.20ms
  4000 requests in 1.00s, 25.00MB read
  Socket errors: connect 0, read 4000, write 0, timeout 0
Requests/sec:   3999.50
Transfer/sec:     25.00MB
";

    #[test]
    fn wrk_output_is_read() {
        let m = read_wrk(WRK);
        assert_eq!(m.value, 3999.5);
        assert_eq!(m.requests, Some(4000));
        assert_eq!((m.p50_ms, m.p99_ms), (Some(0.18), Some(1.2)));
        assert!(m.problems.is_empty(), "{:?}", m.problems);
        let bad = WRK.replace("timeout 0", "timeout 3") + "  Non-2xx or 3xx responses: 2\n";
        assert_eq!(read_wrk(&bad).problems.len(), 2);
    }
}
