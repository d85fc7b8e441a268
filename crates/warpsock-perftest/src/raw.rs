//! Raw FPDU probes: provoke Linux siw into Terminates the engine never
//! causes (bad opcode, RDMAP/DDP version, MSN, QN, CRC), and decode its
//! answer with warpsock-proto's [`Connection`].
//!
//! The MPA exchange runs through a proto [`Connection`] (initiator); then a
//! hand-made FPDU goes straight onto the TCP stream, and everything siw sends
//! back is fed to the same connection, which reports siw's Terminate as
//! `Event::Terminated { by_peer: true }`.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use warpsock_engine::proto::wire::terminate::{
    ControlLayout, TermCode, Terminate, TerminateControl,
};
use warpsock_engine::proto::{Config, Connection, Event, Registry, Role};

use crate::Error;

/// What a raw probe sends after the MPA exchange.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RawCase {
    /// A 16-byte Send with RDMAP opcode 8 (RFC 7306 Immediate Data; siw
    /// has no RFC 7306): siw answers RDMAP / remote operation / 0x06.
    Opcode,
    /// A Send whose RDMAP version is 0: RDMAP / remote operation / 0x05.
    RdmapVersion,
    /// A Send whose DDP version is 2: DDP untagged / 0x06.
    DdpVersion,
    /// A Send with MSN 5 where 1 is due: DDP untagged / 0x03.
    Msn,
    /// A Send on QN 3: DDP untagged / 0x01.
    Qn,
    /// A Send with a wrong CRC (CRC negotiated): LLP / MPA / 0x02.
    Crc,
}

impl RawCase {
    /// Every case.
    pub const ALL: [Self; 6] = [
        Self::Opcode,
        Self::RdmapVersion,
        Self::DdpVersion,
        Self::Msn,
        Self::Qn,
        Self::Crc,
    ];

    /// The command-line name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Opcode => "opcode",
            Self::RdmapVersion => "rdmap-version",
            Self::DdpVersion => "ddp-version",
            Self::Msn => "msn",
            Self::Qn => "qn",
            Self::Crc => "crc",
        }
    }

    /// The code siw sends for it (from siw's source, `siw_qp_rx.c`).
    pub fn expected(self) -> TermCode {
        match self {
            Self::Opcode => TermCode::RDMAP_UNEXPECTED_OPCODE,
            Self::RdmapVersion => TermCode::RDMAP_INVALID_VERSION,
            Self::DdpVersion => TermCode::DDP_UNTAGGED_INVALID_VERSION,
            Self::Msn => TermCode::DDP_UNTAGGED_MSN_RANGE,
            Self::Qn => TermCode::DDP_UNTAGGED_INVALID_QN,
            Self::Crc => TermCode::MPA_CRC,
        }
    }

    /// The ULPDU (DDP/RDMAP header + 16 bytes of payload) and whether the
    /// CRC must be corrupted.
    fn ulpdu(self) -> (Vec<u8>, bool) {
        let (mut ddp, mut rdmap, mut qn, mut msn) = (0x41u8, 0x43u8, 0u32, 1u32);
        match self {
            Self::Opcode => rdmap = 0x48,
            Self::RdmapVersion => rdmap = 0x03,
            Self::DdpVersion => ddp = 0x42,
            Self::Msn => msn = 5,
            Self::Qn => qn = 3,
            Self::Crc => {}
        }
        let mut u = vec![ddp, rdmap];
        u.extend_from_slice(&0u32.to_be_bytes());
        u.extend_from_slice(&qn.to_be_bytes());
        u.extend_from_slice(&msn.to_be_bytes());
        u.extend_from_slice(&0u32.to_be_bytes());
        u.extend_from_slice(&[0x5a; 16]);
        (u, self == Self::Crc)
    }
}

/// What a raw probe saw.
#[derive(Debug, Clone)]
pub struct RawOutcome {
    /// The FPDU we sent (MPA length .. CRC).
    pub sent: Vec<u8>,
    /// Every byte siw sent after its MPA Reply.
    pub received: Vec<u8>,
    /// The Terminate body (control word onwards) as received, if any.
    pub terminate_body: Vec<u8>,
    /// What warpsock-proto's connection reported.
    pub decoded: Option<(TermCode, bool)>,
    /// The control word read under siw's little-endian bitfield layout.
    pub siw_layout: Option<TerminateControl>,
    /// The control word read under the RFC layout.
    pub rfc_layout: Option<TerminateControl>,
    /// Zero-length Writes sent to unstick siw's accept race.
    pub kicks: u32,
}

const CRC_TABLE: [u32; 256] = {
    let mut t = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u32;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 != 0 {
                (c >> 1) ^ 0x82f6_3b78
            } else {
                c >> 1
            };
            k += 1;
        }
        t[i] = c;
        i += 1;
    }
    t
};

fn crc32c(b: &[u8]) -> u32 {
    let mut c = 0xffff_ffffu32;
    for &x in b {
        c = CRC_TABLE[((c ^ u32::from(x)) & 0xff) as usize] ^ (c >> 8);
    }
    !c
}

/// Frames a ULPDU: length, pad, CRC (little-endian on the wire, as siw).
fn fpdu(ulpdu: &[u8], crc: bool, corrupt: bool) -> Vec<u8> {
    let mut f = (ulpdu.len() as u16).to_be_bytes().to_vec();
    f.extend_from_slice(ulpdu);
    f.resize(f.len() + (4 - f.len() % 4) % 4, 0);
    let mut c = if crc { crc32c(&f) } else { 0 };
    if corrupt {
        c ^= 0xdead_beef;
    }
    f.extend_from_slice(&c.to_le_bytes());
    f
}

/// Runs one probe against the iWARP server at `host:port` (rping's server
/// has a 16-byte receive posted, so a well-formed 16-byte Send would be
/// accepted: only the fault causes the Terminate).
pub fn probe(host: &str, port: u16, case: RawCase, timeout: Duration) -> Result<RawOutcome, Error> {
    let addr = (host, port)
        .to_socket_addrs()
        .map_err(Error::Io)?
        .next()
        .ok_or_else(|| Error::Io(std::io::Error::other("address did not resolve")))?;
    let mut sock = TcpStream::connect_timeout(&addr, timeout)?;
    sock.set_nodelay(true)?;
    let mut reg: Registry<Vec<u8>> = Registry::new();
    let mut cfg = Config::new(Role::Initiator, reg.alloc_pd());
    let crc = case == RawCase::Crc;
    cfg.crc = crc;
    cfg.ird = 1;
    cfg.ord = 1;
    cfg.p2p = None;
    cfg.mpa_timeout = timeout;
    let mut conn = Connection::new(cfg, Instant::now());
    let mut out = Vec::new();
    conn.poll_transmit(&reg, &mut out, usize::MAX);
    sock.write_all(&out)?;
    // MPA Reply: 20 bytes + private data, read exactly.
    let mut hdr = [0u8; 20];
    sock.set_read_timeout(Some(timeout))?;
    sock.read_exact(&mut hdr)?;
    let pd_len = usize::from(u16::from_be_bytes([hdr[18], hdr[19]]));
    let mut pd = vec![0u8; pd_len];
    sock.read_exact(&mut pd)?;
    conn.handle_input(&hdr, &mut reg);
    conn.handle_input(&pd, &mut reg);
    let mut established = false;
    while let Some(e) = conn.poll_event() {
        if let Event::Established(_) = e {
            established = true;
        }
    }
    if !established {
        return Err(Error::Protocol {
            step: "raw MPA exchange",
            what: format!("no connection after the reply {}", hex(&hdr)),
        });
    }
    let negotiated_crc = conn.negotiated().is_some_and(|n| n.crc);
    let (ulpdu, corrupt) = case.ulpdu();
    let sent = fpdu(&ulpdu, negotiated_crc, corrupt);
    sock.write_all(&sent)?;

    // Collect until EOF; kick once a second (at most 3) while siw is silent.
    let mut received = Vec::new();
    let mut kicks = 0;
    let start = Instant::now();
    let mut buf = [0u8; 4096];
    sock.set_read_timeout(Some(Duration::from_secs(1)))?;
    loop {
        match sock.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => received.extend_from_slice(&buf[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                if start.elapsed() > timeout {
                    break;
                }
                if received.is_empty() && kicks < 3 {
                    let kick = [0xc1u8, 0x40, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0];
                    let _ = sock.write_all(&fpdu(&kick, negotiated_crc, false));
                    kicks += 1;
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break,
            Err(e) => return Err(Error::Io(e)),
        }
    }
    let _ = sock.shutdown(Shutdown::Both);
    conn.handle_input(&received, &mut reg);
    let mut decoded = None;
    while let Some(e) = conn.poll_event() {
        if let Event::Terminated { code, by_peer } = e {
            decoded.get_or_insert((code, by_peer));
        }
    }
    // The Terminate body: after the 2-byte length and 18-byte untagged header.
    let mut terminate_body = Vec::new();
    if received.len() >= 24 && received[3] & 0x0f == 7 {
        let len = usize::from(u16::from_be_bytes([received[0], received[1]]));
        let end = (2 + len).min(received.len());
        terminate_body = received[20.min(end)..end].to_vec();
    }
    let ctl = (terminate_body.len() >= 4).then(|| {
        [
            terminate_body[0],
            terminate_body[1],
            terminate_body[2],
            terminate_body[3],
        ]
    });
    let _ = Terminate::parse(&terminate_body);
    Ok(RawOutcome {
        sent,
        received,
        decoded,
        siw_layout: ctl.map(|c| TerminateControl::decode_as(c, ControlLayout::SiwLittleEndian)),
        rfc_layout: ctl.map(|c| TerminateControl::decode_as(c, ControlLayout::Rfc)),
        terminate_body,
        kicks,
    })
}

/// Lower-case hex of `b`.
pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32c_check_value() {
        assert_eq!(crc32c(b"123456789"), 0xe306_9283);
    }

    #[test]
    fn frames_are_padded_and_sized() {
        let (u, corrupt) = RawCase::Msn.ulpdu();
        assert!(!corrupt);
        let f = fpdu(&u, false, false);
        assert_eq!(&f[..4], &[0x00, 0x22, 0x41, 0x43]);
        assert_eq!(f.len() % 4, 0);
        assert_eq!(&f[12..16], &5u32.to_be_bytes());
    }
}
