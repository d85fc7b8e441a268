//! The control protocol between `warpsock client` (or `bench`) and
//! `warpsock server`: one TCP connection to the server's control port
//! carrying text lines of `verb key=value ...`.
//!
//! ```text
//! C: hello warpsock-bench=2
//! S: hello warpsock-bench=2 data-port=18516 token=5f0e4b1c9a2d7e63 cpus=2 boot=0f1e…
//!    (boot: the server kernel's boot id, optional; equal to the client's
//!    when both run on one machine, e.g. in two network namespaces)
//!    -- then per test:
//! C: test kind=lat transport=send crc=0 size=8 window=1 conns=1 progress=caller busy-poll-us=0 pin=1 verify=0 budget=t:3 rate=0
//! S: ready                                  (or: error <message>)
//!    -- C opens `conns` data connections (one per client thread):
//!    --   tcp:     TCP to the control port; its first 8 bytes are the token
//!    --   udp:     the same TCP connection as a companion (token, then the
//!    --            client's UDP port, 2 bytes BE; the server answers with
//!    --            its UDP port), then datagrams between the two UDP ports
//!    --   iWARP:   connect (TCP + MPA) to the data port; the MPA Request's
//!    --            private data is token(8) addr(8, BE) rkey(4, BE) of the
//!    --            client's region, the Reply's is addr(8) rkey(4) of the
//!    --            server's region and the server's receive credits(4)
//!    -- the test runs and ends on the data connections (see `work`)
//! S: result msgs=N bytes=B verified=V sent=S lost=L elapsed-ns=E rx-ns=R cpu-user-us=U cpu-sys-us=Y intervals=B1,B2,... jitter-ns=J|-
//!                                           (or: error <message>)
//!    -- next test, or:
//! C: bye
//! ```
//!
//! The server serves one client at a time. `pin` is the CPU the server
//! side runs on for that test (`-`: unpinned). The token keeps stray
//! connections from taking the place of the client's. The `result` line
//! is the server side's [`Stats`] and CPU time over the test.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::str::FromStr;
use std::time::{Duration, Instant};

use crate::spec::{Budget, ProgressMode, Spec, Test, MAX_CONNS, MAX_SIZE, MAX_WINDOW};
use crate::stats::{Cpu, Stats, Tally};
use crate::transports;
use crate::Error;

/// Protocol version in the hello lines.
pub(crate) const VERSION: u32 = 2;
/// Longest control line either side accepts (the longest real one, a
/// `result` with a thousand interval samples, is far below).
pub(crate) const MAX_LINE: usize = 64 * 1024;
/// How much of a peer's bad line an error message repeats.
const ECHO: usize = 60;

/// `s` cut to [`ECHO`] characters, control characters escaped: what an
/// error may repeat of what a peer sent.
pub(crate) fn shorten(s: &str) -> String {
    let mut out: String = s
        .chars()
        .take(ECHO)
        .flat_map(char::escape_default)
        .collect();
    if s.chars().count() > ECHO {
        out.push('…');
    }
    out
}

/// One end of the control connection.
pub(crate) struct Ctl {
    s: TcpStream,
    /// Bytes read and not yet taken as a line (at most [`MAX_LINE`]).
    buf: Vec<u8>,
}

/// Why [`Ctl::recv`] returned no line.
#[derive(Debug)]
pub(crate) enum RecvError {
    /// Nothing complete arrived within the time given (what did arrive is
    /// kept for the next call).
    Timeout,
    /// The connection is unusable: closed, reset, an over-long or non-text
    /// line.
    Failed(Error),
}

impl From<RecvError> for Error {
    fn from(e: RecvError) -> Self {
        match e {
            RecvError::Timeout => Self::msg("no answer on the control connection in time"),
            RecvError::Failed(e) => e,
        }
    }
}

/// A received line: its verb and `key=value` arguments (for `error`, the
/// message in `rest`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Line {
    pub(crate) verb: String,
    pub(crate) args: Vec<(String, String)>,
    pub(crate) rest: String,
}

impl Line {
    pub(crate) fn parse(s: &str) -> Self {
        let s = s.trim_end_matches(['\r', '\n']);
        let (verb, rest) = s.split_once(' ').unwrap_or((s, ""));
        let args = rest
            .split_whitespace()
            .filter_map(|kv| kv.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Self {
            verb: verb.to_string(),
            args,
            rest: rest.to_string(),
        }
    }

    pub(crate) fn get(&self, key: &str) -> Result<&str, Error> {
        self.args
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
            .ok_or_else(|| {
                Error::msg(format!(
                    "protocol error: '{}' lacks {key}=",
                    shorten(&self.verb)
                ))
            })
    }

    pub(crate) fn num<T: FromStr>(&self, key: &str) -> Result<T, Error> {
        let v = self.get(key)?;
        v.parse()
            .map_err(|_| Error::msg(format!("protocol error: bad value {key}={}", shorten(v))))
    }

    /// Fails with the peer's message if this is an `error` line, or if the
    /// verb is not `want`.
    pub(crate) fn expect(self, want: &str) -> Result<Self, Error> {
        if self.verb == "error" {
            return Err(Error::msg(format!("the server reports: {}", self.rest)));
        }
        if self.verb != want {
            return Err(Error::msg(format!(
                "protocol error: expected '{want}', got '{}'",
                shorten(&self.verb)
            )));
        }
        Ok(self)
    }
}

impl Ctl {
    pub(crate) fn new(s: TcpStream) -> io::Result<Self> {
        Self::with_prefix(s, Vec::new())
    }

    /// A control connection whose first bytes, `prefix`, were already read
    /// (by the server's dispatcher).
    pub(crate) fn with_prefix(s: TcpStream, prefix: Vec<u8>) -> io::Result<Self> {
        s.set_nodelay(true)?;
        Ok(Self { s, buf: prefix })
    }

    /// The peer's address.
    pub(crate) fn peer(&self) -> io::Result<std::net::SocketAddr> {
        self.s.peer_addr()
    }

    /// Sends one line (a newline is added).
    pub(crate) fn send(&mut self, line: &str) -> Result<(), Error> {
        debug_assert!(!line.contains('\n'));
        let mut b = Vec::with_capacity(line.len() + 1);
        b.extend_from_slice(line.as_bytes());
        b.push(b'\n');
        self.s
            .write_all(&b)
            .map_err(|e| Error::msg(format!("control connection lost: {e}")))
    }

    /// Receives one line, waiting up to `timeout` in all (`None`: forever):
    /// a peer that dribbles bytes gets no more time than a silent one.
    /// Lines are at most [`MAX_LINE`] bytes of UTF-8.
    pub(crate) fn recv_within(&mut self, timeout: Option<Duration>) -> Result<Line, RecvError> {
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut chunk = [0u8; 4096];
        loop {
            if let Some(end) = self.buf.iter().position(|&c| c == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=end).collect();
                return match std::str::from_utf8(&line) {
                    Ok(s) => Ok(Line::parse(s)),
                    Err(_) => Err(RecvError::Failed(Error::msg(
                        "a control line that is not UTF-8 text",
                    ))),
                };
            }
            if self.buf.len() > MAX_LINE {
                return Err(RecvError::Failed(Error::msg(format!(
                    "a control line longer than {MAX_LINE} bytes (the limit)"
                ))));
            }
            let left = match deadline {
                Some(d) => match d.checked_duration_since(Instant::now()) {
                    Some(l) if !l.is_zero() => Some(l),
                    _ => return Err(RecvError::Timeout),
                },
                None => None,
            };
            self.s
                .set_read_timeout(left)
                .map_err(|e| RecvError::Failed(e.into()))?;
            let room = (MAX_LINE + 1 - self.buf.len()).min(chunk.len());
            match self.s.read(&mut chunk[..room]) {
                Ok(0) if self.buf.is_empty() => {
                    return Err(RecvError::Failed(Error::msg(
                        "the peer closed the control connection",
                    )))
                }
                Ok(0) => {
                    return Err(RecvError::Failed(Error::msg(
                        "the peer closed the control connection mid-line",
                    )))
                }
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
                {
                    return Err(RecvError::Timeout)
                }
                Err(e) => {
                    return Err(RecvError::Failed(Error::msg(format!(
                        "control connection lost: {e}"
                    ))))
                }
            }
        }
    }

    /// [`Ctl::recv_within`], a timeout being an error that says how long.
    pub(crate) fn recv(&mut self, timeout: Option<Duration>) -> Result<Line, Error> {
        self.recv_within(timeout).map_err(|e| match e {
            RecvError::Timeout => Error::msg(format!(
                "no answer on the control connection for {:.0} s",
                timeout.unwrap_or_default().as_secs_f64()
            )),
            RecvError::Failed(e) => e,
        })
    }
}

/// The `test` line for a spec.
pub(crate) fn encode_spec(s: &Spec) -> String {
    format!(
        "test kind={} transport={} crc={} size={} window={} conns={} progress={} busy-poll-us={} pin={} verify={} budget={} rate={}",
        s.test.name(),
        s.transport.name(),
        u8::from(s.crc),
        s.size,
        s.window,
        s.conns,
        s.progress.name(),
        s.busy_poll_us,
        s.pin.map_or_else(|| "-".to_string(), |c| c.to_string()),
        u8::from(s.verify),
        s.budget.encode(),
        s.rate,
    )
}

/// Parses a `test` line (the client's CPU is not sent: `client_pin` is
/// `None`).
pub(crate) fn decode_spec(l: &Line) -> Result<Spec, Error> {
    let bad = |k: &str, v: &str| Error::msg(format!("protocol error: bad value {k}={v}"));
    let test = l.get("kind")?;
    let transport = l.get("transport")?;
    let progress = match l.get("progress")? {
        "caller" => ProgressMode::Caller,
        "thread" => ProgressMode::Thread,
        v => return Err(bad("progress", v)),
    };
    let pin = match l.get("pin")? {
        "-" => None,
        v => Some(v.parse().map_err(|_| bad("pin", v))?),
    };
    let size: usize = l.num("size")?;
    let window: usize = l.num("window")?;
    if !(1..=MAX_SIZE).contains(&size) {
        return Err(bad("size", &size.to_string()));
    }
    if !(1..=MAX_WINDOW).contains(&window) {
        return Err(bad("window", &window.to_string()));
    }
    let conns: usize = l.num("conns")?;
    if !(1..=MAX_CONNS).contains(&conns) {
        return Err(bad("conns", &conns.to_string()));
    }
    let budget = l.get("budget")?;
    Ok(Spec {
        test: Test::parse(test).ok_or_else(|| bad("kind", test))?,
        transport: transports::find(transport).ok_or_else(|| bad("transport", transport))?,
        crc: l.num::<u8>("crc")? != 0,
        size,
        window,
        conns,
        progress,
        busy_poll_us: l.num("busy-poll-us")?,
        client_pin: None,
        pin,
        verify: l.num::<u8>("verify")? != 0,
        budget: Budget::decode(budget).ok_or_else(|| bad("budget", budget))?,
        rate: l.num("rate")?,
    })
}

/// What the server reports of one test: its [`Stats`] (without samples of
/// round trips, which the client keeps) and its CPU time.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct SideReport {
    pub(crate) rx: Tally,
    pub(crate) sent: u64,
    pub(crate) lost: u64,
    pub(crate) elapsed_ns: u64,
    pub(crate) rx_ns: u64,
    pub(crate) cpu: Cpu,
    pub(crate) intervals: Vec<u64>,
    /// RFC 3550 interarrival jitter of what arrived at the server, ns.
    pub(crate) jitter_ns: Option<u64>,
}

impl SideReport {
    pub(crate) fn new(st: &Stats, cpu: Cpu) -> Self {
        Self {
            rx: st.rx,
            sent: st.sent,
            lost: st.lost,
            elapsed_ns: st.elapsed().as_nanos() as u64,
            rx_ns: st.rx_elapsed().as_nanos() as u64,
            cpu,
            intervals: st.intervals.clone(),
            jitter_ns: st.jitter_ns.map(|j| j.round() as u64),
        }
    }

    pub(crate) fn encode(&self) -> String {
        let iv: Vec<String> = self.intervals.iter().map(u64::to_string).collect();
        format!(
            "result msgs={} bytes={} verified={} sent={} lost={} elapsed-ns={} rx-ns={} cpu-user-us={} cpu-sys-us={} intervals={} jitter-ns={}",
            self.rx.msgs,
            self.rx.bytes,
            self.rx.verified,
            self.sent,
            self.lost,
            self.elapsed_ns,
            self.rx_ns,
            self.cpu.user_us,
            self.cpu.sys_us,
            if iv.is_empty() { "-".to_string() } else { iv.join(",") },
            self.jitter_ns.map_or("-".to_string(), |j| j.to_string()),
        )
    }

    pub(crate) fn decode(l: &Line) -> Result<Self, Error> {
        let iv = l.get("intervals")?;
        let intervals = if iv == "-" {
            Vec::new()
        } else {
            iv.split(',')
                .map(|v| {
                    v.parse()
                        .map_err(|_| Error::msg(format!("protocol error: bad interval {v}")))
                })
                .collect::<Result<_, _>>()?
        };
        Ok(Self {
            rx: Tally {
                msgs: l.num("msgs")?,
                bytes: l.num("bytes")?,
                verified: l.num("verified")?,
            },
            sent: l.num("sent")?,
            lost: l.num("lost")?,
            elapsed_ns: l.num("elapsed-ns")?,
            rx_ns: l.num("rx-ns")?,
            cpu: Cpu {
                user_us: l.num("cpu-user-us")?,
                sys_us: l.num("cpu-sys-us")?,
            },
            intervals,
            // Absent from servers older than the jitter: none.
            jitter_ns: l.get("jitter-ns").ok().and_then(|v| v.parse().ok()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spec_round_trip() {
        let s = Spec {
            test: Test::Bw,
            transport: transports::find("write").unwrap(),
            crc: true,
            size: 1 << 20,
            window: 8,
            conns: 4,
            progress: ProgressMode::Thread,
            busy_poll_us: 50,
            client_pin: None,
            pin: Some(1),
            verify: true,
            budget: Budget::Iters(9),
            rate: 1000,
        };
        assert_eq!(decode_spec(&Line::parse(&encode_spec(&s))).unwrap(), s);
        let mut r = SideReport {
            rx: Tally {
                msgs: 3,
                bytes: 24,
                verified: 24,
            },
            sent: 2,
            lost: 1,
            elapsed_ns: 5,
            rx_ns: 4,
            cpu: Cpu {
                user_us: 7,
                sys_us: 8,
            },
            intervals: vec![1, 2, 3],
            jitter_ns: Some(1234),
        };
        assert_eq!(SideReport::decode(&Line::parse(&r.encode())).unwrap(), r);
        r.intervals.clear();
        r.jitter_ns = None;
        assert_eq!(SideReport::decode(&Line::parse(&r.encode())).unwrap(), r);
    }

    #[test]
    fn bad_lines_are_echoed_short() {
        let long = "x".repeat(10_000);
        let e = Line::parse(&format!("{long}\n"))
            .expect("hello")
            .unwrap_err();
        assert!(e.to_string().len() < 120, "{e}");
        assert_eq!(shorten("a\u{1b}[2Jb"), "a\\u{1b}[2Jb");
    }

    #[test]
    fn errors() {
        let e = Line::parse("error no such thing\n")
            .expect("ready")
            .unwrap_err();
        assert_eq!(e.to_string(), "the server reports: no such thing");
        let l = Line::parse("test kind=lat transport=udp");
        assert!(decode_spec(&l).is_err());
    }
}
