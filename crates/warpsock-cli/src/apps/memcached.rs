//! `memcached-tcp`, `memcached-udp`: memcached, loaded by this binary's
//! own bounded client (`warpsock memcached-load`, hidden; Debian packages
//! no memcached load tool that speaks the UDP protocol). The client first
//! SETs its keys over TCP (values it can check: the message pattern with
//! the key's number stamped in), then GETs them round-robin from several
//! threads over TCP or over memcached's UDP frames, checking every value
//! that comes back. A UDP request unanswered in 500 ms counts as lost.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::time::{Duration, Instant};

use super::env::{Proto, Setup};
use super::{argv, error_lines, number_after, Cx, Measured, Workload};
use crate::child;
use crate::data::{check, fill, stamp};
use crate::spec::fmt_size;
use crate::stats::Pcts;
use crate::Error;

/// The workload over TCP or UDP.
pub(crate) struct Memcached(pub(crate) Proto);

/// Keys the client sets and reads.
const KEYS: u64 = 64;
/// A UDP request unanswered this long is lost.
const UDP_WAIT: Duration = Duration::from_millis(500);
/// A TCP request unanswered this long fails the run.
const TCP_WAIT: Duration = Duration::from_secs(10);

impl Workload for Memcached {
    fn name(&self) -> &'static str {
        match self.0 {
            Proto::Tcp => "memcached-tcp",
            Proto::Udp => "memcached-udp",
        }
    }
    fn title(&self) -> &'static str {
        match self.0 {
            Proto::Tcp => "request/response cache: memcached GETs over TCP",
            Proto::Udp => "request/response cache: memcached GETs over UDP",
        }
    }
    fn proto(&self) -> Proto {
        self.0
    }
    fn needs(&self) -> &'static [(&'static str, &'static str)] {
        &[("memcached", "memcached")]
    }
    fn metric(&self) -> &'static str {
        "requests/s"
    }

    fn run(&self, cx: &Cx, setup: &Setup) -> Result<Vec<Measured>, Error> {
        let (tport, uport) = (child::free_port()?, child::free_port()?);
        let launch = setup.launch(&[tport, uport]);
        let srv = cx.server(
            &launch,
            &argv(&[
                "memcached",
                "-u",
                "root",
                "-l",
                &cx.server.ip,
                "-p",
                &tport.to_string(),
                "-U",
                &uport.to_string(),
                "-m",
                "256",
                "-t",
                "2",
                "-c",
                "1024",
                "-I",
                "2m",
            ]),
            tport,
            true,
        )?;
        let sizes: &[usize] = match (self.0, cx.quick) {
            (Proto::Tcp, true) => &[16, 4096],
            (Proto::Tcp, false) => &[16, 1024, 64 * 1024],
            (Proto::Udp, true) => &[16],
            (Proto::Udp, false) => &[16, 1024],
        };
        let exe = std::env::current_exe()?.display().to_string();
        let n = if cx.quick {
            2_000
        } else {
            cx.link.count(50_000, 2_000)
        };
        let mut out = Vec::new();
        for &size in sizes {
            let mut a = argv(&[
                &exe,
                "memcached-load",
                "--server",
                &cx.server.ip,
                "--tcp-port",
                &tport.to_string(),
                "--udp-port",
                &uport.to_string(),
                "--size",
                &size.to_string(),
                "--requests",
                &n.to_string(),
            ]);
            if self.0 == Proto::Udp {
                a.push("--udp".into());
            }
            let text = cx.client(&launch, &a);
            let mut m = match text {
                Ok(t) => read_load(&t),
                Err(e) => Measured {
                    problems: vec![e.to_string()],
                    ..Measured::default()
                },
            };
            m.case = format!("GET {}", fmt_size(size));
            out.push(m);
        }
        let log = srv.stop()?;
        if let Some(m) = out.first_mut() {
            m.problems.extend(error_lines(&log));
        }
        Ok(out)
    }
}

/// What `memcached-load` printed.
fn read_load(t: &str) -> Measured {
    let num = |k: &str| number_after(t, &format!("{k}="));
    let requests = num("requests").unwrap_or(0.0) as u64;
    let answered = num("answered").unwrap_or(0.0) as u64;
    let lost = num("lost").unwrap_or(0.0) as u64;
    let bad = num("bad").unwrap_or(0.0) as u64;
    let mut problems = Vec::new();
    if answered + lost != requests {
        problems.push(format!(
            "{requests} requests, {answered} answered, {lost} lost"
        ));
    }
    if bad > 0 {
        problems.push(format!("{bad} values did not check out"));
    }
    Measured {
        value: num("rps").unwrap_or(0.0),
        p50_ms: num("p50_us").map(|v| v / 1000.0),
        p99_ms: num("p99_us").map(|v| v / 1000.0),
        lost: Some(lost),
        requests: Some(requests),
        bytes: num("bytes").map(|v| v as u64),
        bytes_verified: num("verified").map(|v| v as u64),
        problems,
        ..Measured::default()
    }
}

/// `warpsock memcached-load` (hidden): sets `KEYS` keys over TCP, then GETs
/// them from `--conns` threads over TCP or UDP, checking each value.
#[derive(Debug, clap::Args)]
pub(crate) struct LoadCmd {
    #[arg(long)]
    server: std::net::IpAddr,
    #[arg(long)]
    tcp_port: u16,
    #[arg(long)]
    udp_port: u16,
    /// Use memcached's UDP protocol for the GETs.
    #[arg(long)]
    udp: bool,
    /// Value size, 1 to 1 MiB.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=1 << 20))]
    size: u64,
    /// GETs in all, 1 to 10000000.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    requests: u64,
    /// Client threads, 1 to 64.
    #[arg(long, default_value = "4", value_parser = clap::value_parser!(u64).range(1..=64))]
    conns: u64,
}

/// The value of key `k`: the pattern, `k` stamped in.
fn value(k: u64, size: usize) -> Vec<u8> {
    let mut v = vec![0u8; size];
    fill(&mut v);
    stamp(&mut v, k);
    v
}

/// One thread's counts.
#[derive(Default)]
struct Tally {
    answered: u64,
    lost: u64,
    bad: u64,
    bytes: u64,
    rtts_ns: Vec<u64>,
}

impl crate::Run for LoadCmd {
    fn run(self) -> Result<(), Error> {
        let size = self.size as usize;
        let taddr = SocketAddr::new(self.server, self.tcp_port);
        let mut c = TcpConn::open(taddr)?;
        for k in 0..KEYS {
            c.set(k, &value(k, size))?;
        }
        let per = self.requests.div_ceil(self.conns);
        let t0 = Instant::now();
        let tallies: Vec<Result<Tally, Error>> = std::thread::scope(|sc| {
            let hs: Vec<_> = (0..self.conns)
                .map(|i| {
                    let n = per.min(self.requests.saturating_sub(i * per));
                    sc.spawn(move || {
                        if self.udp {
                            udp_gets(SocketAddr::new(self.server, self.udp_port), i, n, size)
                        } else {
                            tcp_gets(taddr, i, n, size)
                        }
                    })
                })
                .collect();
            hs.into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err(Error::msg("a thread panicked")))
                })
                .collect()
        });
        let secs = t0.elapsed().as_secs_f64();
        let mut all = Tally::default();
        for t in tallies {
            let t = t?;
            all.answered += t.answered;
            all.lost += t.lost;
            all.bad += t.bad;
            all.bytes += t.bytes;
            all.rtts_ns.extend(t.rtts_ns);
        }
        let p = Pcts::of(&all.rtts_ns, 1.0).unwrap_or_default();
        println!(
            "requests={} answered={} lost={} bad={} bytes={} verified={} rps={:.1} p50_us={:.2} p99_us={:.2}",
            self.requests,
            all.answered,
            all.lost,
            all.bad,
            all.bytes,
            all.bytes.saturating_sub(all.bad * self.size),
            all.answered as f64 / secs.max(1e-9),
            p.p50.unwrap_or(0.0),
            p.p99.unwrap_or(0.0),
        );
        Ok(())
    }
}

/// A text-protocol connection.
struct TcpConn {
    r: BufReader<TcpStream>,
    w: TcpStream,
}

impl TcpConn {
    fn open(a: SocketAddr) -> Result<Self, Error> {
        let s = TcpStream::connect_timeout(&a, TCP_WAIT)
            .map_err(|e| Error::msg(format!("memcached at {a}: {e}")))?;
        s.set_nodelay(true)?;
        s.set_read_timeout(Some(TCP_WAIT))?;
        Ok(Self {
            r: BufReader::new(s.try_clone()?),
            w: s,
        })
    }

    fn line(&mut self) -> Result<String, Error> {
        let mut l = String::new();
        (&mut self.r).take(4096).read_line(&mut l)?;
        if !l.ends_with("\r\n") {
            return Err(Error::msg(format!(
                "memcached: a bad line '{}'",
                crate::ctl::shorten(&l)
            )));
        }
        Ok(l)
    }

    fn set(&mut self, k: u64, v: &[u8]) -> Result<(), Error> {
        let mut m = format!("set k{k} 0 0 {}\r\n", v.len()).into_bytes();
        m.extend_from_slice(v);
        m.extend_from_slice(b"\r\n");
        self.w.write_all(&m)?;
        match self.line()?.as_str() {
            "STORED\r\n" => Ok(()),
            l => Err(Error::msg(format!(
                "memcached refused a SET: {}",
                crate::ctl::shorten(l.trim())
            ))),
        }
    }

    /// GETs key `k`; its value, if any.
    fn get(&mut self, k: u64, size: usize) -> Result<Option<Vec<u8>>, Error> {
        self.w.write_all(format!("get k{k}\r\n").as_bytes())?;
        let head = self.line()?;
        if head == "END\r\n" {
            return Ok(None);
        }
        let len: usize = head
            .split_whitespace()
            .nth(3)
            .and_then(|n| n.parse().ok())
            .filter(|&n| n <= size)
            .ok_or_else(|| {
                Error::msg(format!(
                    "memcached: a bad VALUE line '{}'",
                    crate::ctl::shorten(&head)
                ))
            })?;
        let mut v = vec![0u8; len + 2];
        self.r.read_exact(&mut v)?;
        v.truncate(len);
        if self.line()? != "END\r\n" {
            return Err(Error::msg("memcached: no END after the value"));
        }
        Ok(Some(v))
    }
}

fn tcp_gets(a: SocketAddr, thread: u64, n: u64, size: usize) -> Result<Tally, Error> {
    let mut c = TcpConn::open(a)?;
    let mut t = Tally::default();
    for i in 0..n {
        let k = (thread + i) % KEYS;
        let s = Instant::now();
        let v = c.get(k, size)?;
        t.rtts_ns.push(s.elapsed().as_nanos() as u64);
        t.answered += 1;
        let v = v.unwrap_or_default();
        t.bytes += v.len() as u64;
        if v.len() != size || !check(&v, k, true) {
            t.bad += 1;
        }
    }
    Ok(t)
}

/// GETs over memcached's UDP frames: an 8-byte header (request id,
/// sequence number, datagram count, reserved; big-endian) before the text;
/// a reply may span several datagrams.
fn udp_gets(a: SocketAddr, thread: u64, n: u64, size: usize) -> Result<Tally, Error> {
    let bind = if a.is_ipv4() { "0.0.0.0:0" } else { "[::]:0" };
    let u = UdpSocket::bind(bind)?;
    u.connect(a)?;
    let mut t = Tally::default();
    let mut buf = vec![0u8; 65_536];
    for i in 0..n {
        let k = (thread + i) % KEYS;
        let id = (i & 0xffff) as u16;
        let mut req = Vec::with_capacity(32);
        req.extend_from_slice(&id.to_be_bytes());
        req.extend_from_slice(&[0, 0, 0, 1, 0, 0]);
        req.extend_from_slice(format!("get k{k}\r\n").as_bytes());
        let s = Instant::now();
        u.send(&req)?;
        let deadline = s + UDP_WAIT;
        let mut parts: Vec<Option<Vec<u8>>> = Vec::new();
        let reply = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break None;
            }
            u.set_read_timeout(Some(left))?;
            let got = match u.recv(&mut buf) {
                Ok(g) => g,
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    break None
                }
                Err(e) => return Err(e.into()),
            };
            if got < 8 || u16::from_be_bytes([buf[0], buf[1]]) != id {
                continue; // a late reply to an earlier request
            }
            let seq = usize::from(u16::from_be_bytes([buf[2], buf[3]]));
            let total = usize::from(u16::from_be_bytes([buf[4], buf[5]])).max(1);
            if parts.len() != total {
                parts = vec![None; total];
            }
            if seq < total {
                parts[seq] = Some(buf[8..got].to_vec());
            }
            if parts.iter().all(Option::is_some) {
                break Some(
                    parts
                        .iter()
                        .flatten()
                        .flatten()
                        .copied()
                        .collect::<Vec<u8>>(),
                );
            }
        };
        let Some(reply) = reply else {
            t.lost += 1;
            continue;
        };
        t.rtts_ns.push(s.elapsed().as_nanos() as u64);
        t.answered += 1;
        let v = udp_value(&reply).unwrap_or_default();
        t.bytes += v.len() as u64;
        if v.len() != size || !check(&v, k, true) {
            t.bad += 1;
        }
    }
    Ok(t)
}

/// The value in a text-protocol GET reply.
fn udp_value(r: &[u8]) -> Option<Vec<u8>> {
    let end = r.windows(2).position(|w| w == b"\r\n")?;
    let head = std::str::from_utf8(&r[..end]).ok()?;
    let len: usize = head.split_whitespace().nth(3)?.parse().ok()?;
    let body = r.get(end + 2..end + 2 + len)?;
    Some(body.to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_and_reports_are_read() {
        let v = value(5, 100);
        assert!(check(&v, 5, true) && !check(&v, 6, false));
        let mut r = b"VALUE k5 0 100\r\n".to_vec();
        r.extend_from_slice(&v);
        r.extend_from_slice(b"\r\nEND\r\n");
        assert_eq!(udp_value(&r), Some(v));
        let m = read_load("requests=10 answered=9 lost=1 bad=0 bytes=90 verified=90 rps=5.0 p50_us=10.0 p99_us=20.0\n");
        assert!(m.problems.is_empty(), "{:?}", m.problems);
        assert_eq!((m.value, m.lost, m.p99_ms), (5.0, Some(1), Some(0.02)));
        let m = read_load("requests=10 answered=8 lost=1 bad=2 rps=5.0\n");
        assert_eq!(m.problems.len(), 2);
    }
}
