//! `striped`: the parallel file system's pattern, one file fetched in 8
//! parallel segments (aria2c from nginx; the downloaded file is compared
//! with the served one, byte for byte) and 8 parallel streams (iperf3
//! `-P 8`, its receiver's count). MB/s, and the CPU of both programs per
//! GB moved.

use std::io::Read;
use std::path::Path;
use std::time::Instant;

use super::env::{Proto, Setup};
use super::http::{nginx, write_doc};
use super::{argv, error_lines, Cx, Measured, Workload};
use crate::child;
use crate::Error;

/// The workload.
pub(crate) struct Striped;

impl Workload for Striped {
    fn name(&self) -> &'static str {
        "striped"
    }
    fn title(&self) -> &'static str {
        "striped parallel transfer: aria2c 8 segments from nginx; iperf3 -P 8"
    }
    fn proto(&self) -> Proto {
        Proto::Tcp
    }
    fn needs(&self) -> &'static [(&'static str, &'static str)] {
        &[
            ("nginx", "nginx-light"),
            ("aria2c", "aria2"),
            ("iperf3", "iperf3"),
        ]
    }
    fn metric(&self) -> &'static str {
        "MB/s"
    }

    /// The two cases independently: one failing leaves the other's row.
    fn run(&self, cx: &Cx, setup: &Setup) -> Result<Vec<Measured>, Error> {
        let failed = |case: &str, e: Error| Measured {
            case: case.into(),
            problems: vec![e.to_string()],
            ..Measured::default()
        };
        Ok(vec![
            aria2c(cx, setup).unwrap_or_else(|e| failed("aria2c, 8 segments", e)),
            iperf3(cx, setup).unwrap_or_else(|e| failed("iperf3 -P 8", e)),
        ])
    }
}

/// aria2c fetching one file in 8 segments over 8 connections.
fn aria2c(cx: &Cx, setup: &Setup) -> Result<Measured, Error> {
    let len: u64 = if cx.quick {
        64 << 20
    } else {
        cx.link.count(1 << 30, 64 << 20)
    };
    let root = cx.dir.join("big");
    std::fs::create_dir_all(&root)?;
    let src = root.join("file");
    if std::fs::metadata(&src).map(|m| m.len()).ok() != Some(len) {
        write_doc(&src, len as usize)?;
    }
    let port = child::free_port()?;
    let launch = setup.launch(&[port]);
    let srv = nginx(cx, &launch, &root, port)?;
    let dst_dir = cx.dir.join(format!("got-{port}"));
    std::fs::create_dir_all(&dst_dir)?;
    let t = Instant::now();
    let out = cx.client(
        &launch,
        &argv(&[
            "aria2c",
            "-x",
            "8",
            "-s",
            "8",
            "-k",
            "1M",
            "--min-split-size=1M",
            "-d",
            &dst_dir.display().to_string(),
            "-o",
            "file",
            "--allow-overwrite=true",
            "--auto-file-renaming=false",
            "--file-allocation=none",
            "--console-log-level=error",
            "--summary-interval=0",
            "--download-result=hide",
            &format!("http://{}:{port}/file", cx.server.ip),
        ]),
    );
    let secs = t.elapsed().as_secs_f64();
    let log = srv.stop();
    let mut problems = Vec::new();
    if let Err(e) = &out {
        problems.push(e.to_string());
    }
    problems.extend(error_lines(&log?));
    let got = dst_dir.join("file");
    let same = same_contents(&src, &got)?;
    if !same {
        problems.push("the downloaded file differs from the served one".into());
    }
    let _ = std::fs::remove_file(&got);
    Ok(Measured {
        case: format!("aria2c, 8 segments of {} MiB", len >> 20),
        value: len as f64 / secs / 1e6,
        requests: Some(1),
        bytes: Some(len),
        bytes_verified: same.then_some(len),
        problems,
        ..Measured::default()
    })
}

/// Whether two files hold the same bytes.
fn same_contents(a: &Path, b: &Path) -> Result<bool, Error> {
    let (Ok(fa), Ok(fb)) = (std::fs::File::open(a), std::fs::File::open(b)) else {
        return Ok(false);
    };
    if fa.metadata()?.len() != fb.metadata()?.len() {
        return Ok(false);
    }
    let (mut ra, mut rb) = (
        std::io::BufReader::with_capacity(1 << 20, fa),
        std::io::BufReader::with_capacity(1 << 20, fb),
    );
    let (mut x, mut y) = (vec![0u8; 1 << 20], vec![0u8; 1 << 20]);
    loop {
        let n = read_full(&mut ra, &mut x)?;
        let m = read_full(&mut rb, &mut y)?;
        if n != m || x[..n] != y[..m] {
            return Ok(false);
        }
        if n == 0 {
            return Ok(true);
        }
    }
}

fn read_full(r: &mut impl Read, b: &mut [u8]) -> Result<usize, Error> {
    let mut n = 0;
    while n < b.len() {
        match r.read(&mut b[n..])? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n)
}

/// iperf3 with 8 parallel streams.
fn iperf3(cx: &Cx, setup: &Setup) -> Result<Measured, Error> {
    let port = child::free_port()?;
    let launch = setup.launch(&[port]);
    let p = port.to_string();
    let srv = cx.server(
        &launch,
        &argv(&["iperf3", "-s", "-1", "-B", &cx.server.ip, "-p", &p]),
        port,
        true,
    )?;
    let secs = format!("{:.0}", cx.secs.max(1.0));
    let out = cx.client(
        &launch,
        &argv(&[
            "iperf3",
            "-c",
            &cx.server.ip,
            "-p",
            &p,
            "-P",
            "8",
            "-t",
            &secs,
            "-J",
        ]),
    );
    let log = srv.stop();
    let mut m = match out {
        Ok(text) => read_iperf3(&text),
        Err(e) => Measured {
            problems: vec![e.to_string()],
            ..Measured::default()
        },
    };
    m.case = "iperf3 -P 8".into();
    m.problems.extend(error_lines(&log?));
    Ok(m)
}

/// iperf3's JSON: what the receiver got.
fn read_iperf3(text: &str) -> Measured {
    let v: serde_json::Value = match serde_json::from_str(text) {
        Ok(v) => v,
        Err(e) => {
            return Measured {
                problems: vec![format!("iperf3 printed no JSON: {e}")],
                ..Measured::default()
            }
        }
    };
    let recv = &v["end"]["sum_received"];
    let bytes = recv["bytes"].as_u64().unwrap_or(0);
    let bps = recv["bits_per_second"].as_f64().unwrap_or(0.0);
    let mut problems = Vec::new();
    if let Some(e) = v["error"].as_str() {
        problems.push(format!("iperf3: {}", crate::ctl::shorten(e)));
    }
    Measured {
        value: bps / 8.0 / 1e6,
        bytes: Some(bytes),
        problems,
        ..Measured::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iperf3_json_and_file_comparison() {
        let m =
            read_iperf3(r#"{"end":{"sum_received":{"bytes":1000000,"bits_per_second":8000000}}}"#);
        assert_eq!((m.value, m.bytes), (1.0, Some(1_000_000)));
        assert!(!read_iperf3("{").problems.is_empty());
        let d = std::env::temp_dir().join(format!("ws-striped-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        let (a, b) = (d.join("a"), d.join("b"));
        write_doc(&a, 3_000_000).unwrap();
        write_doc(&b, 3_000_000).unwrap();
        assert!(same_contents(&a, &b).unwrap());
        let mut x = std::fs::read(&b).unwrap();
        x[2_999_999] ^= 1;
        std::fs::write(&b, x).unwrap();
        assert!(!same_contents(&a, &b).unwrap());
        let _ = std::fs::remove_dir_all(&d);
    }
}
