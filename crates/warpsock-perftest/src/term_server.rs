//! A Terminate-sending server: Linux siw's `rping -c` (or any iWARP
//! client) connects, warpsock-proto's [`Connection`] answers its MPA
//! Request, and then the connection ends with a Terminate *we* send, so
//! that siw's receive side (`siw_proc_terminate`, which logs
//! `siw: got TERMINATE. layer %d, type %d, code %d`) can be checked.
//!
//! Three ways to get there, each from a different layer:
//!
//! - [`ServerCase::ShortRecv`]: an 8-byte receive is posted; rping's first
//!   message is a 16-byte Send, which the core refuses with its own
//!   receive-path Terminate DDP / untagged / 0x02 (M and D set, the
//!   offending DDP header attached).
//! - [`ServerCase::Crc`]: CRC is asked for; one byte of the CRC of the
//!   client's first FPDU is flipped *before the core sees it* (as a wire
//!   fault would), so the core's CRC check sends LLP / MPA / 0x02.
//! - [`ServerCase::Local`]: a large receive takes the client's first Send;
//!   then [`Connection::fail_local`] sends the given code (e.g. RDMAP
//!   remote protection / invalid STag), nothing attached.
//!
//! The TCP stream is a plain [`TcpStream`]: what goes out is exactly what
//! the core emits, and every byte in both directions is kept for the
//! report.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use warpsock_engine::proto::wire::terminate::{ControlLayout, TermCode, TerminateControl};
use warpsock_engine::proto::{
    Access, Config, Connection, Event, RecvWr, Registry, Role, Sge, WcStatus,
};

use crate::Error;

/// How the server makes its Terminate happen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServerCase {
    /// Post an 8-byte receive; the client's 16-byte Send does not fit.
    ShortRecv,
    /// Ask for CRC and corrupt the CRC of the client's first FPDU on input.
    Crc,
    /// Accept the client's first Send, then fail locally with this code.
    Local(TermCode),
}

impl ServerCase {
    /// The code our Terminate carries.
    pub fn expected(self) -> TermCode {
        match self {
            Self::ShortRecv => TermCode::DDP_UNTAGGED_NO_BUFFER,
            Self::Crc => TermCode::MPA_CRC,
            Self::Local(c) => c,
        }
    }

    /// A short name for reports.
    pub fn name(self) -> String {
        match self {
            Self::ShortRecv => "short-recv".into(),
            Self::Crc => "crc".into(),
            Self::Local(c) => format!("local {}/{}/{:02x}", c.layer, c.etype, c.ecode),
        }
    }
}

/// Receive size of the short-receive case (rping's Sends carry 16 bytes).
pub const SHORT_RECV_LEN: u32 = 8;
/// How long to watch the client after our Terminate (siw closes at once).
const AFTER_TERMINATE: Duration = Duration::from_secs(3);
/// Receive size of the other cases.
const RECV_LEN: u32 = 4096;

/// What the server saw and sent.
#[derive(Debug, Clone)]
pub struct ServerOutcome {
    /// The client's MPA Request (header and private data).
    pub mpa_request: Vec<u8>,
    /// Whether CRC was negotiated.
    pub crc: bool,
    /// The client's first FPDU as it arrived (before any corruption).
    pub first_fpdu: Vec<u8>,
    /// Where the core's Terminate event came from.
    pub event: Option<TermCode>,
    /// Our Terminate FPDU exactly as written to the socket.
    pub terminate: Vec<u8>,
    /// Bytes the client sent after our Terminate went out.
    pub after: Vec<u8>,
    /// Whether the client closed its side within the wait.
    pub peer_closed: bool,
}

impl ServerOutcome {
    /// The Terminate control word (4 bytes after the 2-byte MPA length and
    /// the 18-byte untagged DDP/RDMAP header).
    pub fn control(&self) -> Option<[u8; 4]> {
        self.terminate.get(20..24).map(|c| [c[0], c[1], c[2], c[3]])
    }
}

/// Splits a stream (no markers) that starts at an FPDU boundary into whole
/// FPDUs (length field .. CRC); a trailing partial FPDU is left out.
pub fn split_fpdus(mut s: &[u8]) -> Vec<&[u8]> {
    let mut v = Vec::new();
    while s.len() >= 2 {
        let len = usize::from(u16::from_be_bytes([s[0], s[1]]));
        let total = (2 + len).div_ceil(4) * 4 + 4;
        if s.len() < total {
            break;
        }
        v.push(&s[..total]);
        s = &s[total..];
    }
    v
}

/// Length of the MPA Request or Reply at the start of `s`, once known.
fn mpa_frame_len(s: &[u8]) -> Option<usize> {
    (s.len() >= 20).then(|| 20 + usize::from(u16::from_be_bytes([s[18], s[19]])))
}

/// Accepts one connection on `127.0.0.1:port` and ends it with the
/// Terminate of `case`. `timeout` bounds the accept and every later wait.
pub fn serve(port: u16, case: ServerCase, timeout: Duration) -> Result<ServerOutcome, Error> {
    let listener = TcpListener::bind(("127.0.0.1", port))?;
    // Scripts that bind port 0 learn the port from this line.
    eprintln!("terminate-server: listening on {}", listener.local_addr()?);
    listener.set_nonblocking(true)?;
    let deadline = Instant::now() + timeout;
    let mut sock = loop {
        match listener.accept() {
            Ok((s, _)) => break s,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if Instant::now() > deadline {
                    return Err(Error::Timeout {
                        step: "a client connection",
                        after: timeout,
                    });
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => return Err(Error::Io(e)),
        }
    };
    drop(listener);
    sock.set_nonblocking(false)?;
    sock.set_nodelay(true)?;
    sock.set_read_timeout(Some(Duration::from_millis(50)))?;
    run(&mut sock, case, Instant::now() + timeout)
}

fn run(sock: &mut TcpStream, case: ServerCase, deadline: Instant) -> Result<ServerOutcome, Error> {
    let mut reg: Registry<Vec<u8>> = Registry::new();
    let pd = reg.alloc_pd();
    let mut cfg = Config::new(Role::Responder, pd);
    cfg.crc = case == ServerCase::Crc;
    let recv_len = if case == ServerCase::ShortRecv {
        SHORT_RECV_LEN
    } else {
        RECV_LEN
    };
    let buf_stag = reg.register(
        pd,
        0x1000,
        vec![0u8; recv_len as usize],
        Access::LOCAL_WRITE,
        0x5a,
    );
    let mut conn = Connection::new(cfg, Instant::now());

    let mut inbound = Vec::new(); // every byte the client sent
    let mut fed = 0; // how much of it the core has taken
    let mut corrupted = false;
    let mut outbound = Vec::new(); // every byte we sent
    let mut out = Vec::new();
    let mut event = None;
    let mut inbound_at_term = 0;
    let mut linger_until = None; // end of the watch after our Terminate
    let mut peer_closed = false;
    let mut buf = [0u8; 65536];

    loop {
        let now = Instant::now();
        if now > deadline {
            break;
        }
        if !peer_closed {
            match sock.read(&mut buf) {
                Ok(0) => peer_closed = true,
                Ok(n) => inbound.extend_from_slice(&buf[..n]),
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) => {}
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => peer_closed = true,
                Err(e) => return Err(Error::Io(e)),
            }
        }
        if let Some(at) = linger_until {
            // Our Terminate is out: only watch what the client does.
            if peer_closed || now > at {
                break;
            }
            continue;
        }
        // Feed the core; in the CRC case hold everything after the MPA
        // Request until the first FPDU is complete and its CRC flipped.
        let mut limit = inbound.len();
        if let Some(req_len) = mpa_frame_len(&inbound) {
            let first = inbound
                .get(req_len..)
                .and_then(|s| split_fpdus(s).first().map(|f| f.len()));
            if case == ServerCase::Crc && !corrupted {
                match first {
                    Some(flen) => {
                        inbound[req_len + flen - 1] ^= 0xff;
                        corrupted = true;
                    }
                    None => limit = req_len.min(limit),
                }
            }
        }
        if fed < limit {
            fed += conn.handle_input(&inbound[fed..limit], &mut reg);
        }
        if peer_closed {
            conn.handle_eof();
        }
        if conn.poll_timeout().is_some_and(|t| t <= now) {
            conn.handle_timeout(now);
        }
        while let Some(e) = conn.poll_event() {
            match e {
                Event::ConnectRequest(_) => {
                    conn.accept(&[]).map_err(|e| Error::Protocol {
                        step: "MPA accept",
                        what: format!("{e:?}"),
                    })?;
                    conn.post_recv(RecvWr {
                        wr_id: 1,
                        sgl: Sge {
                            addr: 0x1000,
                            length: recv_len,
                            lkey: buf_stag,
                        }
                        .into(),
                    })
                    .map_err(|source| Error::Post {
                        step: "the receive",
                        source,
                    })?;
                }
                Event::Terminated { code, by_peer } => {
                    if by_peer {
                        return Err(Error::Terminated {
                            step: "waiting for the client's first Send",
                            code,
                            by_peer,
                        });
                    }
                    event.get_or_insert(code);
                }
                Event::ConnectFailed(e) => {
                    return Err(Error::Protocol {
                        step: "MPA exchange",
                        what: format!("{e:?}"),
                    })
                }
                Event::Closed(reason) if event.is_none() => {
                    return Err(Error::Disconnected {
                        step: "waiting for the client's first Send",
                        reason: Some(reason),
                    })
                }
                _ => {}
            }
        }
        while let Some(wc) = conn.poll_completion() {
            if let ServerCase::Local(code) = case {
                if wc.status == WcStatus::Success && event.is_none() {
                    conn.fail_local(Some(code), false);
                }
            }
        }
        while let Some(e) = conn.poll_event() {
            if let Event::Terminated {
                code,
                by_peer: false,
            } = e
            {
                event.get_or_insert(code);
            }
        }
        out.clear();
        conn.poll_transmit(&reg, &mut out, usize::MAX);
        if !out.is_empty() {
            sock.write_all(&out)?;
            outbound.extend_from_slice(&out);
        }
        if event.is_some() && !conn.has_pending_output() && linger_until.is_none() {
            inbound_at_term = inbound.len();
            linger_until = Some(now + AFTER_TERMINATE);
            let _ = sock.shutdown(Shutdown::Write);
        }
        if peer_closed && linger_until.is_none() {
            return Err(Error::Disconnected {
                step: "waiting for the client's first Send",
                reason: conn.close_reason(),
            });
        }
    }
    let _ = sock.shutdown(Shutdown::Both);

    let Some(req_len) = mpa_frame_len(&inbound) else {
        return Err(Error::Timeout {
            step: "the client's MPA Request",
            after: Duration::ZERO,
        });
    };
    if linger_until.is_none() {
        return Err(Error::Timeout {
            step: "our Terminate",
            after: Duration::ZERO,
        });
    }
    let mut first_fpdu = inbound
        .get(req_len..)
        .and_then(|s| split_fpdus(s).first().map(|f| f.to_vec()))
        .unwrap_or_default();
    if corrupted {
        // Report it as it arrived.
        if let Some(last) = first_fpdu.last_mut() {
            *last ^= 0xff;
        }
    }
    let rep_len = mpa_frame_len(&outbound).unwrap_or(outbound.len());
    let terminate = split_fpdus(&outbound[rep_len.min(outbound.len())..])
        .into_iter()
        .rev()
        .find(|f| f.len() >= 24 && f[3] & 0x0f == 7)
        .map(<[u8]>::to_vec)
        .unwrap_or_default();
    Ok(ServerOutcome {
        mpa_request: inbound[..req_len.min(inbound.len())].to_vec(),
        crc: conn.negotiated().is_some_and(|n| n.crc),
        first_fpdu,
        event,
        terminate,
        after: inbound[inbound_at_term..].to_vec(),
        peer_closed,
    })
}

/// The two readings of a control word, formatted for the report.
pub fn describe(ctl: [u8; 4]) -> (String, String) {
    let f = |c: TerminateControl| {
        format!(
            "layer {} etype {} ecode {:#04x} M{} D{} R{}",
            c.code.layer, c.code.etype, c.code.ecode, c.m as u8, c.d as u8, c.r as u8
        )
    };
    (
        f(TerminateControl::decode_as(ctl, ControlLayout::Rfc)),
        f(TerminateControl::decode_as(
            ctl,
            ControlLayout::SiwLittleEndian,
        )),
    )
}

/// The line siw's `siw_proc_terminate` logs for this control word
/// (`pr_warn`, always on): its little-endian bitfields read the layer from
/// the low nibble of byte 0 and the error type from the high one, in
/// decimal.
pub fn siw_log_line(ctl: [u8; 4]) -> String {
    let c = TerminateControl::decode_as(ctl, ControlLayout::SiwLittleEndian).code;
    format!(
        "siw: got TERMINATE. layer {}, type {}, code {}",
        c.layer, c.etype, c.ecode
    )
}

/// Parses `LAYER/ETYPE/ECODE` (numbers; the code may be hex with 0x or as
/// two hex digits, e.g. `0/1/00`).
pub fn parse_code(s: &str) -> Option<TermCode> {
    let mut it = s.split('/');
    let layer = it.next()?.parse().ok()?;
    let etype = it.next()?.parse().ok()?;
    let e = it.next()?;
    let ecode = u8::from_str_radix(e.trim_start_matches("0x"), 16).ok()?;
    if it.next().is_some() || layer > 15 || etype > 15 {
        return None;
    }
    Some(TermCode {
        layer,
        etype,
        ecode,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_whole_fpdus_only() {
        // 18-byte ULPDU: 2 + 18 = 20, no pad, + CRC = 24; then a partial one.
        let mut s = vec![0u8, 18];
        s.extend_from_slice(&[0xaa; 18]);
        s.extend_from_slice(&[1, 2, 3, 4]);
        s.extend_from_slice(&[0, 34, 0x41]);
        let f = split_fpdus(&s);
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].len(), 24);
        // 34-byte ULPDU: 36 + CRC = 40.
        s.truncate(24);
        s.extend_from_slice(&[0, 34]);
        s.extend_from_slice(&[0; 38]);
        assert_eq!(split_fpdus(&s).len(), 2);
        assert_eq!(split_fpdus(&s)[1].len(), 40);
    }

    #[test]
    fn siw_reads_rfc_control_words_swapped() {
        // Ours for DDP untagged no-buffer, M and D set.
        let ctl = [0x12, 0x02, 0xc0, 0x00];
        assert_eq!(
            siw_log_line(ctl),
            "siw: got TERMINATE. layer 2, type 1, code 2"
        );
        let (rfc, siw) = describe(ctl);
        assert_eq!(rfc, "layer 1 etype 2 ecode 0x02 M1 D1 R0");
        assert_eq!(siw, "layer 2 etype 1 ecode 0x02 M0 D0 R0");
        assert_eq!(
            siw_log_line([0x20, 0x02, 0, 0]),
            "siw: got TERMINATE. layer 0, type 2, code 2"
        );
    }

    #[test]
    fn codes_parse() {
        assert_eq!(parse_code("0/1/00"), Some(TermCode::RDMAP_INVALID_STAG));
        assert_eq!(
            parse_code("0/2/0x06"),
            Some(TermCode::RDMAP_UNEXPECTED_OPCODE)
        );
        assert_eq!(parse_code("2/0/02"), Some(TermCode::MPA_CRC));
        assert_eq!(parse_code("0/1"), None);
        assert_eq!(parse_code("16/0/00"), None);
    }
}
