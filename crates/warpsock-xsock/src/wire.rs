//! Byte formats of the sockets-over-DDP protocol: the hello carried in the
//! MPA private data, and the 8-byte header that starts every RDMAP Send.
//!
//! All integers are big endian. Every message is one RDMAP Send into a
//! receive buffer ("slot") the peer has posted:
//!
//! ```text
//! header (8 bytes): kind u8 | flags u8 | credits returned u16 | 4 reserved (0; an EOF's and a CREDIT's, below)
//! DATA         (1): payload                                   flags: EOM 0x01 (last piece of one send call)
//! CREDIT       (2): -                                          flags: CLOSED 0x04 | RECEIVED 0x08 (both: the
//!                                                                    sender closed after its EOF had left; the
//!                                                                    last 4 bytes as an EOF's RECEIVED)
//! SINK         (3): id u32 | len u32 | rx_seq u64 | stag u32 | reserved u32 | to u64    flags: WAITALL 0x02
//! SINK_DONE    (4): id u32 | len u32                          flags: EOM 0x01
//! SINK_CANCEL  (5): id u32
//! IOMAP        (6): offset u64 | len u64 | to u64 | stag u32 | access u8 | 3 reserved
//! IOUNMAP      (7): offset u64
//! EOF          (8): -                                          flags: CLOSED 0x04 (the sender closed its socket),
//!                                                                    RECEIVED 0x08 (with CLOSED: the header's last
//!                                                                    4 bytes are the low 32 bits of the stream
//!                                                                    bytes it had received then)
//! ```
//!
//! The hello (16 bytes, first in the MPA Request and Reply private data):
//!
//! ```text
//! "WSXS" | version u8 (1) | flags u8 (0) | slots u16 | slot size u32 | 4 reserved (0)
//! ```

use std::fmt;

/// Magic that starts the hello: tells a warpsock peer's MPA private data
/// from anyone else's.
pub const HELLO_MAGIC: [u8; 4] = *b"WSXS";
/// Protocol version this crate speaks.
pub const VERSION: u8 = 1;
/// Length of the hello.
pub const HELLO_LEN: usize = 16;
/// Length of the header that starts every message.
pub const HDR_LEN: usize = 8;
/// Largest message other than DATA (header included): a slot must hold it.
pub const MAX_CONTROL_LEN: usize = HDR_LEN + 32;
/// Smallest slot size a peer may announce.
pub const MIN_SLOT_SIZE: u32 = 256;
/// Largest slot size a peer may announce (one slot per Send; the engine
/// splits a Send into FPDUs).
pub const MAX_SLOT_SIZE: u32 = 1 << 24;
/// Most slots a peer may announce.
pub const MAX_SLOTS: u16 = 4096;
/// Fewest slots a peer may announce: the credit rule needs two to send
/// data, and a third keeps one free for a CREDIT the peer has not yet
/// returned.
pub const MIN_SLOTS: u16 = 3;

/// DATA/SINK_DONE flag: this piece ends one send call (a message in
/// message mode).
pub const FLAG_EOM: u8 = 0x01;
/// SINK flag: fill the whole sink before finishing it.
pub const FLAG_WAITALL: u8 = 0x02;
/// EOF flag: the sender closed its socket, not only shut it for writing
/// ([`Body::Closed`]). A peer that does not know it reads a plain EOF
/// (flags of an EOF were always ignored).
pub const FLAG_CLOSED: u8 = 0x04;
/// EOF flag, with [`FLAG_CLOSED`]: the header's last four bytes are the
/// low 32 bits of the stream bytes the sender had received when it closed
/// ([`Body::Closed`]'s `received`). A peer that does not know it ignores
/// it (and the bytes, reserved before).
pub const FLAG_RECEIVED: u8 = 0x08;
/// [`FLAG_CLOSED`] and [`FLAG_RECEIVED`] on a CREDIT: the sender closed
/// its socket after its end of stream had left ([`Body::ClosedLate`]). A
/// peer that does not know them reads a CREDIT (flags of a CREDIT were
/// always ignored).
pub const FLAGS_CLOSED_LATE: u8 = FLAG_CLOSED | FLAG_RECEIVED;

/// What a peer announces in its hello: how many receive slots it posts for
/// us and how large they are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Hello {
    /// Receive slots posted for our messages: the credits we start with.
    pub slots: u16,
    /// Bytes per slot (header included).
    pub slot_size: u32,
}

impl Hello {
    /// The 16 bytes on the wire.
    pub fn encode(&self) -> [u8; HELLO_LEN] {
        let mut b = [0u8; HELLO_LEN];
        b[..4].copy_from_slice(&HELLO_MAGIC);
        b[4] = VERSION;
        b[6..8].copy_from_slice(&self.slots.to_be_bytes());
        b[8..12].copy_from_slice(&self.slot_size.to_be_bytes());
        b
    }

    /// Parses and checks a hello at the start of `b` (MPA private data;
    /// bytes after the hello are ignored, for later versions).
    pub fn parse(b: &[u8]) -> Result<Self, WireError> {
        if b.len() < HELLO_LEN || b[..4] != HELLO_MAGIC {
            return Err(WireError::NotHello);
        }
        if b[4] != VERSION {
            return Err(WireError::Version(b[4]));
        }
        let h = Self {
            slots: u16::from_be_bytes([b[6], b[7]]),
            slot_size: u32::from_be_bytes([b[8], b[9], b[10], b[11]]),
        };
        if h.slots < MIN_SLOTS
            || h.slots > MAX_SLOTS
            || !(MIN_SLOT_SIZE..=MAX_SLOT_SIZE).contains(&h.slot_size)
        {
            return Err(WireError::Limits(h));
        }
        Ok(h)
    }

    /// Payload bytes one DATA message into such a slot can carry.
    pub fn payload(&self) -> usize {
        self.slot_size as usize - HDR_LEN
    }
}

/// A message kind (first header byte).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Kind {
    /// Stream bytes.
    Data = 1,
    /// Credits only.
    Credit = 2,
    /// The receiver offers a buffer for direct placement.
    Sink = 3,
    /// The sender finished (or declined) a sink.
    SinkDone = 4,
    /// The receiver withdraws a sink.
    SinkCancel = 5,
    /// A buffer registered for the peer's one-sided access.
    IoMap = 6,
    /// The end of such a registration.
    IoUnmap = 7,
    /// No more stream bytes (shutdown for writing).
    Eof = 8,
}

impl Kind {
    fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            1 => Self::Data,
            2 => Self::Credit,
            3 => Self::Sink,
            4 => Self::SinkDone,
            5 => Self::SinkCancel,
            6 => Self::IoMap,
            7 => Self::IoUnmap,
            8 => Self::Eof,
            _ => return None,
        })
    }

    fn body_len(self) -> usize {
        match self {
            Self::Data | Self::Credit | Self::Eof => 0,
            Self::Sink | Self::IoMap => 32,
            Self::SinkDone | Self::IoUnmap => 8,
            Self::SinkCancel => 4,
        }
    }
}

/// A sink: where the receiver wants the next stream bytes placed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SinkAd {
    /// The receiver's number for it.
    pub id: u32,
    /// Its length.
    pub len: u32,
    /// Stream position of its first byte (bytes the receiver had received
    /// when it offered the sink).
    pub rx_seq: u64,
    /// STag of the registered buffer.
    pub stag: u32,
    /// Tagged offset of its first byte.
    pub to: u64,
    /// Fill it completely before finishing it.
    pub waitall: bool,
}

/// A buffer the peer may access one-sidedly.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IoMapAd {
    /// Offset the application names it by (`riomap`'s result).
    pub offset: u64,
    /// Length.
    pub len: u64,
    /// Tagged offset of its first byte.
    pub to: u64,
    /// STag.
    pub stag: u32,
    /// [`ACCESS_WRITE`] and/or [`ACCESS_READ`].
    pub access: u8,
}

/// [`IoMapAd::access`]: the peer may write (`riowrite`).
pub const ACCESS_WRITE: u8 = 1;
/// [`IoMapAd::access`]: the peer may read (`rioread`).
pub const ACCESS_READ: u8 = 2;

/// One message, parsed. DATA's payload is not copied: it is the bytes of
/// the slot after [`HDR_LEN`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Body {
    /// Stream bytes follow the header.
    Data {
        /// Ends one send call.
        eom: bool,
    },
    /// Credits only.
    Credit,
    /// See [`SinkAd`].
    Sink(SinkAd),
    /// Sink `id` holds `len` bytes now (0: declined).
    SinkDone {
        /// Sink number.
        id: u32,
        /// Bytes placed.
        len: u32,
        /// The bytes end one send call.
        eom: bool,
    },
    /// Withdraw sink `id`.
    SinkCancel {
        /// Sink number.
        id: u32,
    },
    /// See [`IoMapAd`].
    IoMap(IoMapAd),
    /// The registration named `offset` ends.
    IoUnmap {
        /// The registration's offset.
        offset: u64,
    },
    /// End of the stream.
    Eof,
    /// End of the stream, and the sender closed its socket (not only
    /// `SHUT_WR`): stream bytes sent to it now would draw TCP's reset.
    /// Kind EOF with [`FLAG_CLOSED`]. Only an end whose close sends its
    /// EOF says so: one shut for writing before its close said EOF then.
    Closed {
        /// The low 32 bits of the stream bytes the sender had received
        /// when it closed ([`FLAG_RECEIVED`]; `None`: not said): the
        /// peer's bytes past them reached a closed socket.
        received: Option<u32>,
    },
    /// The sender closed its socket after its end of stream had left
    /// (a `shutdown(SHUT_WR)` before the close: that EOF could not say
    /// so), with `received`, the low 32 bits of the stream bytes it had
    /// received then, as [`Body::Closed`]'s. Credits only otherwise:
    /// kind CREDIT with [`FLAGS_CLOSED_LATE`], so that it goes with the
    /// one credit a CREDIT needs.
    ClosedLate {
        /// As [`Body::Closed`]'s.
        received: u32,
    },
}

impl Body {
    /// The kind of message.
    pub fn kind(&self) -> Kind {
        match self {
            Self::Data { .. } => Kind::Data,
            Self::Credit | Self::ClosedLate { .. } => Kind::Credit,
            Self::Sink(_) => Kind::Sink,
            Self::SinkDone { .. } => Kind::SinkDone,
            Self::SinkCancel { .. } => Kind::SinkCancel,
            Self::IoMap(_) => Kind::IoMap,
            Self::IoUnmap { .. } => Kind::IoUnmap,
            Self::Eof | Self::Closed { .. } => Kind::Eof,
        }
    }
}

/// A message header plus body, as parsed from or written to a slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Msg {
    /// Credits (slots freed) the sender returns.
    pub credits: u16,
    /// The message.
    pub body: Body,
}

fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn be64(b: &[u8], at: usize) -> u64 {
    u64::from_be_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

impl Msg {
    /// Writes header and body into `out` (at least [`MAX_CONTROL_LEN`]
    /// bytes) and returns the length written. DATA writes only its header;
    /// the payload follows it in the same Send.
    pub fn encode(&self, out: &mut [u8]) -> usize {
        let kind = self.body.kind();
        let n = HDR_LEN + kind.body_len();
        let b = &mut out[..n];
        // The header alone (DATA, Credit, EOF: every small send's message)
        // is a constant-length fill, not a `memset` call.
        if n == HDR_LEN {
            b[..HDR_LEN].fill(0);
        } else {
            b.fill(0);
        }
        b[0] = kind as u8;
        b[2..4].copy_from_slice(&self.credits.to_be_bytes());
        let body = &mut b[HDR_LEN..];
        match self.body {
            Body::Data { eom } => b[1] = if eom { FLAG_EOM } else { 0 },
            Body::Credit | Body::Eof => {}
            Body::ClosedLate { received } => {
                b[1] = FLAGS_CLOSED_LATE;
                b[4..8].copy_from_slice(&received.to_be_bytes());
            }
            Body::Closed { received } => {
                b[1] = FLAG_CLOSED;
                if let Some(r) = received {
                    b[1] |= FLAG_RECEIVED;
                    b[4..8].copy_from_slice(&r.to_be_bytes());
                }
            }
            Body::Sink(s) => {
                b[1] = if s.waitall { FLAG_WAITALL } else { 0 };
                let body = &mut b[HDR_LEN..];
                body[0..4].copy_from_slice(&s.id.to_be_bytes());
                body[4..8].copy_from_slice(&s.len.to_be_bytes());
                body[8..16].copy_from_slice(&s.rx_seq.to_be_bytes());
                body[16..20].copy_from_slice(&s.stag.to_be_bytes());
                body[24..32].copy_from_slice(&s.to.to_be_bytes());
            }
            Body::SinkDone { id, len, eom } => {
                b[1] = if eom { FLAG_EOM } else { 0 };
                let body = &mut b[HDR_LEN..];
                body[0..4].copy_from_slice(&id.to_be_bytes());
                body[4..8].copy_from_slice(&len.to_be_bytes());
            }
            Body::SinkCancel { id } => {
                body[0..4].copy_from_slice(&id.to_be_bytes());
            }
            Body::IoMap(m) => {
                body[0..8].copy_from_slice(&m.offset.to_be_bytes());
                body[8..16].copy_from_slice(&m.len.to_be_bytes());
                body[16..24].copy_from_slice(&m.to.to_be_bytes());
                body[24..28].copy_from_slice(&m.stag.to_be_bytes());
                body[28] = m.access;
            }
            Body::IoUnmap { offset } => body[0..8].copy_from_slice(&offset.to_be_bytes()),
        }
        n
    }

    /// [`Self::encode`] of a DATA message, as the header's eight bytes
    /// themselves; `None` for any other kind. A send call's straight path
    /// stamps one DATA header per message (issue 12): this is a few stores
    /// in registers, not the kind table, the length check, the fill and
    /// the 40-byte buffer `encode` writes into. `wire.rs`' tests check it
    /// against `encode` for every credit count and flag.
    #[inline]
    pub fn data_header(&self) -> Option<[u8; HDR_LEN]> {
        let Body::Data { eom } = self.body else {
            return None;
        };
        let [c0, c1] = self.credits.to_be_bytes();
        let flags = if eom { FLAG_EOM } else { 0 };
        Some([Kind::Data as u8, flags, c0, c1, 0, 0, 0, 0])
    }

    /// [`Self::parse`] of a DATA message alone: `Some` exactly when
    /// `parse` gives DATA (the same message), `None` for anything else
    /// (another kind, or what `parse` rejects). A waiting reader's take of
    /// a ping-pong's answer asks only this (issue 12: no `Result` of the
    /// full `Msg`, no kind table).
    #[inline]
    pub fn parse_data(b: &[u8]) -> Option<Self> {
        match b {
            [kind, flags, c0, c1, _, _, _, _, ..] if *kind == Kind::Data as u8 => Some(Self {
                credits: u16::from_be_bytes([*c0, *c1]),
                body: Body::Data {
                    eom: flags & FLAG_EOM != 0,
                },
            }),
            _ => None,
        }
    }

    /// Parses the message at the start of a received slot. For DATA the
    /// payload is `b[HDR_LEN..]`; other kinds must have exactly their
    /// length.
    pub fn parse(b: &[u8]) -> Result<Self, WireError> {
        if b.len() < HDR_LEN {
            return Err(WireError::Short {
                kind: b.first().copied().unwrap_or(0),
                len: b.len(),
            });
        }
        let kind = Kind::from_u8(b[0]).ok_or(WireError::UnknownKind(b[0]))?;
        let flags = b[1];
        if kind != Kind::Data && b.len() != HDR_LEN + kind.body_len() {
            return Err(WireError::Short {
                kind: b[0],
                len: b.len(),
            });
        }
        let body = &b[HDR_LEN..];
        let body = match kind {
            Kind::Data => Body::Data {
                eom: flags & FLAG_EOM != 0,
            },
            Kind::Credit if flags & FLAGS_CLOSED_LATE == FLAGS_CLOSED_LATE => Body::ClosedLate {
                received: be32(b, 4),
            },
            Kind::Credit => Body::Credit,
            Kind::Eof if flags & FLAG_CLOSED != 0 => Body::Closed {
                received: (flags & FLAG_RECEIVED != 0).then(|| be32(b, 4)),
            },
            Kind::Eof => Body::Eof,
            Kind::Sink => Body::Sink(SinkAd {
                id: be32(body, 0),
                len: be32(body, 4),
                rx_seq: be64(body, 8),
                stag: be32(body, 16),
                to: be64(body, 24),
                waitall: flags & FLAG_WAITALL != 0,
            }),
            Kind::SinkDone => Body::SinkDone {
                id: be32(body, 0),
                len: be32(body, 4),
                eom: flags & FLAG_EOM != 0,
            },
            Kind::SinkCancel => Body::SinkCancel { id: be32(body, 0) },
            Kind::IoMap => Body::IoMap(IoMapAd {
                offset: be64(body, 0),
                len: be64(body, 8),
                to: be64(body, 16),
                stag: be32(body, 24),
                access: body[28],
            }),
            Kind::IoUnmap => Body::IoUnmap {
                offset: be64(body, 0),
            },
        };
        Ok(Self {
            credits: u16::from_be_bytes([b[2], b[3]]),
            body,
        })
    }
}

/// A malformed hello or message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum WireError {
    /// The private data does not start with a warpsock hello.
    NotHello,
    /// The peer speaks another version.
    Version(u8),
    /// The peer announced limits outside the allowed ranges.
    Limits(Hello),
    /// A message of kind `kind` with the wrong length.
    Short {
        /// Kind byte.
        kind: u8,
        /// Length received.
        len: usize,
    },
    /// An unknown kind byte.
    UnknownKind(u8),
}

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NotHello => f.write_str("the peer's MPA private data is not a warpsock hello"),
            Self::Version(v) => write!(
                f,
                "the peer speaks sockets-over-DDP version {v}, we speak {VERSION}"
            ),
            Self::Limits(h) => write!(
                f,
                "the peer announced unusable limits: {} slots of {} bytes",
                h.slots, h.slot_size
            ),
            Self::Short { kind, len } => {
                write!(f, "message of kind {kind} has a bad length ({len} bytes)")
            }
            Self::UnknownKind(k) => write!(f, "unknown message kind {k}"),
        }
    }
}

impl std::error::Error for WireError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hello_round_trip_and_checks() {
        let h = Hello {
            slots: 16,
            slot_size: 65536,
        };
        let b = h.encode();
        assert_eq!(
            b,
            [b'W', b'S', b'X', b'S', 1, 0, 0, 16, 0, 1, 0, 0, 0, 0, 0, 0]
        );
        assert_eq!(Hello::parse(&b), Ok(h));
        let mut v = b.to_vec();
        v.extend_from_slice(b"later versions' extras");
        assert_eq!(Hello::parse(&v), Ok(h));
        assert_eq!(Hello::parse(&b[..15]), Err(WireError::NotHello));
        assert_eq!(
            Hello::parse(b"GET / HTTP/1.1\r\n"),
            Err(WireError::NotHello)
        );
        let mut bad = b;
        bad[4] = 2;
        assert_eq!(Hello::parse(&bad), Err(WireError::Version(2)));
        for (slots, size) in [(2, 65536), (16, 100), (5000, 4096), (16, 1 << 25)] {
            let h = Hello {
                slots,
                slot_size: size,
            };
            assert_eq!(Hello::parse(&h.encode()), Err(WireError::Limits(h)));
        }
    }

    /// `parse_data` is `parse` for DATA and nothing else: every kind
    /// byte, flags, credits and length around the header's.
    #[test]
    fn parse_data_is_parse_of_data_alone() {
        for kind in 0..=255u8 {
            for len in [0, 1, 4, HDR_LEN - 1, HDR_LEN, HDR_LEN + 1, 40, 64] {
                for flags in [0, FLAG_EOM, 0xfe, 0xff] {
                    let mut b = vec![0x5a; len];
                    if let Some(k) = b.first_mut() {
                        *k = kind;
                    }
                    if len > 1 {
                        b[1] = flags;
                    }
                    let want = Msg::parse(&b)
                        .ok()
                        .filter(|m| matches!(m.body, Body::Data { .. }));
                    assert_eq!(
                        Msg::parse_data(&b),
                        want,
                        "kind {kind} len {len} flags {flags}"
                    );
                }
            }
        }
    }

    /// `data_header` is `encode` for DATA (every credit count, both
    /// flags, into a buffer full of garbage) and `None` for every other
    /// kind.
    #[test]
    fn data_header_is_encode_of_data_alone() {
        for credits in (0..=u16::MAX).step_by(7).chain([1, 255, 256, u16::MAX]) {
            for eom in [false, true] {
                let m = Msg {
                    credits,
                    body: Body::Data { eom },
                };
                let mut buf = [0xa5u8; MAX_CONTROL_LEN];
                let n = m.encode(&mut buf);
                assert_eq!(
                    m.data_header().as_ref().map(|h| &h[..]),
                    Some(&buf[..n]),
                    "credits {credits} eom {eom}"
                );
            }
        }
        for body in every_body() {
            let m = Msg { credits: 3, body };
            assert_eq!(
                m.data_header().is_some(),
                matches!(body, Body::Data { .. }),
                "{body:?}"
            );
        }
    }

    fn every_body() -> Vec<Body> {
        vec![
            Body::Data { eom: true },
            Body::Data { eom: false },
            Body::Credit,
            Body::Eof,
            Body::Closed { received: None },
            Body::Closed {
                received: Some(0xDEAD_BEEF),
            },
            Body::ClosedLate {
                received: 0x0BAD_F00D,
            },
            Body::Sink(SinkAd {
                id: 7,
                len: 1 << 20,
                rx_seq: 0x0102_0304_0506_0708,
                stag: 0x1234_5601,
                to: 0xdead_beef_0000,
                waitall: true,
            }),
            Body::SinkDone {
                id: 7,
                len: 99,
                eom: true,
            },
            Body::SinkCancel { id: 3 },
            Body::IoMap(IoMapAd {
                offset: 4096,
                len: 8192,
                to: 0x7f00_0000_1000,
                stag: 0x42,
                access: ACCESS_WRITE | ACCESS_READ,
            }),
            Body::IoUnmap { offset: 4096 },
        ]
    }

    #[test]
    fn every_message_round_trips_with_its_credits() {
        for body in every_body() {
            let m = Msg { credits: 513, body };
            let mut buf = [0xAAu8; MAX_CONTROL_LEN];
            let n = m.encode(&mut buf);
            assert!(n <= MAX_CONTROL_LEN);
            // Reserved, but for a close's received count.
            let reserved = match body {
                Body::Closed { received: Some(r) } | Body::ClosedLate { received: r } => {
                    r.to_be_bytes()
                }
                _ => [0; 4],
            };
            assert_eq!(&buf[4..8], &reserved, "reserved bytes are zero");
            let mut wire = buf[..n].to_vec();
            if matches!(body, Body::Data { .. }) {
                wire.extend_from_slice(b"payload");
            }
            assert_eq!(Msg::parse(&wire), Ok(m), "{body:?}");
        }
    }

    /// A close's EOF is kind EOF with `FLAG_CLOSED` (a peer that does not
    /// know the flag reads a plain EOF: flags of an EOF other than it are
    /// ignored, as they always were), and with `FLAG_RECEIVED` the
    /// header's last four bytes say what it had received.
    #[test]
    fn a_closed_eof_is_an_eof_with_its_flag() {
        let mut b = [0u8; MAX_CONTROL_LEN];
        let n = Msg {
            credits: 1,
            body: Body::Closed {
                received: Some(0x0102_0304),
            },
        }
        .encode(&mut b);
        assert_eq!(
            &b[..n],
            &[
                Kind::Eof as u8,
                FLAG_CLOSED | FLAG_RECEIVED,
                0,
                1,
                1,
                2,
                3,
                4
            ]
        );
        let closed = |received| Body::Closed { received };
        for (flags, body) in [
            (0, Body::Eof),
            (0xfb, Body::Eof),
            (FLAG_CLOSED, closed(None)),
            (0xf7, closed(None)),
            (0xff, closed(Some(0x0506_0708))),
        ] {
            let m = Msg::parse(&[Kind::Eof as u8, flags, 0, 0, 5, 6, 7, 8]).unwrap();
            assert_eq!(m.body, body, "flags {flags:#x}");
        }
    }

    /// A close after the end of stream had left says so on a CREDIT with
    /// both flags (a peer that does not know them reads a CREDIT, as it
    /// always did whatever its flags), the header's last four bytes what
    /// the closer had received; one flag alone is a CREDIT.
    #[test]
    fn a_late_close_is_a_credit_with_both_flags() {
        let mut b = [0u8; MAX_CONTROL_LEN];
        let n = Msg {
            credits: 3,
            body: Body::ClosedLate {
                received: 0x0a0b_0c0d,
            },
        }
        .encode(&mut b);
        assert_eq!(
            &b[..n],
            &[
                Kind::Credit as u8,
                FLAGS_CLOSED_LATE,
                0,
                3,
                0x0a,
                0x0b,
                0x0c,
                0x0d
            ]
        );
        for (flags, body) in [
            (0, Body::Credit),
            (FLAG_CLOSED, Body::Credit),
            (FLAG_RECEIVED, Body::Credit),
            (
                0xff,
                Body::ClosedLate {
                    received: 0x0506_0708,
                },
            ),
        ] {
            let m = Msg::parse(&[Kind::Credit as u8, flags, 0, 0, 5, 6, 7, 8]).unwrap();
            assert_eq!(m.body, body, "flags {flags:#x}");
        }
    }

    #[test]
    fn a_data_header_is_eight_bytes_before_the_payload() {
        let m = Msg {
            credits: 2,
            body: Body::Data { eom: true },
        };
        let mut buf = [0u8; MAX_CONTROL_LEN];
        assert_eq!(m.encode(&mut buf), HDR_LEN);
        assert_eq!(&buf[..HDR_LEN], &[1, 1, 0, 2, 0, 0, 0, 0]);
    }

    #[test]
    fn malformed_messages_are_errors() {
        assert_eq!(
            Msg::parse(&[1, 0, 0]),
            Err(WireError::Short { kind: 1, len: 3 })
        );
        assert_eq!(Msg::parse(&[0; 8]), Err(WireError::UnknownKind(0)));
        assert_eq!(
            Msg::parse(&[200, 0, 0, 0, 0, 0, 0, 0]),
            Err(WireError::UnknownKind(200))
        );
        // A SINK cut short, a CREDIT with a body.
        assert_eq!(
            Msg::parse(&[3; 20]),
            Err(WireError::Short { kind: 3, len: 20 })
        );
        assert_eq!(
            Msg::parse(&[2, 0, 0, 0, 0, 0, 0, 0, 9]),
            Err(WireError::Short { kind: 2, len: 9 })
        );
    }
}
