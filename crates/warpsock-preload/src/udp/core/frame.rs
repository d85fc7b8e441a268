//! Framing of datagrams on an offload connection (see the crate doc for the
//! byte layout). Pure functions: no I/O, no allocation except where noted.

/// Length of the hello the accepting side sends first.
pub(crate) const HELLO_LEN: usize = 8;
/// Length of the preamble the connecting side sends after the hello.
pub(crate) const PREAMBLE_LEN: usize = 8;
/// Length of the per-datagram header.
pub(crate) const HDR_LEN: usize = 4;
/// Largest datagram a frame may carry (an IPv6 UDP payload limit).
pub(crate) const MAX_DGRAM: usize = 65_535;
/// Protocol version spoken.
pub(crate) const VERSION: u8 = 1;

/// Length of the stripe extension that follows a preamble whose flags
/// byte has [`FLAG_STRIPE`] set.
pub(crate) const STRIPE_EXT_LEN: usize = 8;
/// Most connections one destination's datagrams are striped over.
pub(crate) const MAX_STRIPES: usize = 16;
/// Hello capability bit (byte 5): the acceptor understands the stripe
/// extension. Older acceptors send 0 there, and older connectors ignore it.
pub(crate) const CAP_STRIPES: u8 = 1;
/// Hello capability bit: the acceptor requires the source-port proof; a
/// [`NONCE_LEN`]-byte nonce follows the 8 hello bytes.
pub(crate) const CAP_PROOF: u8 = 2;
/// Length of the acceptor's nonce.
pub(crate) const NONCE_LEN: usize = 16;
/// Length of a hello that carries a nonce.
pub(crate) const HELLO_PROOF_LEN: usize = HELLO_LEN + NONCE_LEN;
/// Length of the proof datagram (kernel UDP, connector's port to the
/// acceptor's UDP port): magic, version, 3 reserved bytes, the nonce.
pub(crate) const PROOF_LEN: usize = 8 + NONCE_LEN;
/// Largest UDP payload over IPv4 (65,535 − 20 − 8); IPv6 allows
/// [`MAX_DGRAM`] minus its 8-byte UDP header.
pub(crate) const MAX_DGRAM_V4: usize = 65_507;
/// Largest UDP payload over IPv6 without jumbograms.
pub(crate) const MAX_DGRAM_V6: usize = 65_527;
/// Control frame kind: the acceptor saw the proof (the connector stops
/// re-sending it).
pub(crate) const CTRL_PROVEN: u16 = 1;
/// Bit 31 of a frame header marks a control frame: kind in bits 16..31,
/// payload length in bits 0..16. Only sent to a peer whose hello offered
/// [`CAP_PROOF`].
const CTRL_BIT: u32 = 1 << 31;
/// Preamble flags bit (byte 5): the stripe extension follows.
pub(crate) const FLAG_STRIPE: u8 = 1;

const HELLO_MAGIC: &[u8; 4] = b"WSUA";
const PREAMBLE_MAGIC: &[u8; 4] = b"WSUD";
const PROOF_MAGIC: &[u8; 4] = b"WSUP";

/// Which stripe of which group a connection is: the connections one sender
/// socket opened to one destination share the group (a random non-zero
/// number) and carry distinct indices below `count`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Stripe {
    pub(crate) group: u32,
    pub(crate) index: u8,
    pub(crate) count: u8,
}

/// What a preamble says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Preamble {
    /// The sender's UDP source port.
    pub(crate) port: u16,
    /// Present when the connection is one of several stripes.
    pub(crate) stripe: Option<Stripe>,
}

/// The accepting side's hello: magic, version, capabilities, two reserved
/// zero bytes; with a nonce, [`CAP_PROOF`] set and the nonce after them.
pub(crate) fn hello(nonce: Option<&[u8; NONCE_LEN]>) -> Vec<u8> {
    let mut h = Vec::with_capacity(HELLO_PROOF_LEN);
    h.extend_from_slice(HELLO_MAGIC);
    h.extend_from_slice(&[VERSION, CAP_STRIPES, 0, 0]);
    if let Some(n) = nonce {
        h[5] |= CAP_PROOF;
        h.extend_from_slice(n);
    }
    h
}

/// What a hello says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Hello {
    /// Capability bits.
    pub(crate) caps: u8,
    /// The nonce to prove the source port with (when [`CAP_PROOF`]).
    pub(crate) nonce: Option<[u8; NONCE_LEN]>,
}

/// Result of looking at the front of an outgoing connection's stream.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum ParsedHello {
    /// A hello of this many bytes.
    Done(Hello, usize),
    /// More bytes are needed.
    Partial,
    /// Not warpsock (or a version we do not speak).
    Invalid,
}

/// Parses the hello at the front of `b`.
pub(crate) fn parse_hello(b: &[u8]) -> ParsedHello {
    if b.len() < HELLO_LEN {
        return ParsedHello::Partial;
    }
    if &b[..4] != HELLO_MAGIC || b[4] != VERSION {
        return ParsedHello::Invalid;
    }
    let caps = b[5];
    if caps & CAP_PROOF == 0 {
        return ParsedHello::Done(Hello { caps, nonce: None }, HELLO_LEN);
    }
    if b.len() < HELLO_PROOF_LEN {
        return ParsedHello::Partial;
    }
    let mut n = [0u8; NONCE_LEN];
    n.copy_from_slice(&b[HELLO_LEN..HELLO_PROOF_LEN]);
    ParsedHello::Done(
        Hello {
            caps,
            nonce: Some(n),
        },
        HELLO_PROOF_LEN,
    )
}

/// The proof datagram for `nonce`.
pub(crate) fn proof(nonce: &[u8; NONCE_LEN]) -> [u8; PROOF_LEN] {
    let mut p = [0u8; PROOF_LEN];
    p[..4].copy_from_slice(PROOF_MAGIC);
    p[4] = VERSION;
    p[8..].copy_from_slice(nonce);
    p
}

/// The nonce of a proof datagram, if `b` is one.
pub(crate) fn parse_proof(b: &[u8]) -> Option<[u8; NONCE_LEN]> {
    if b.len() != PROOF_LEN || &b[..4] != PROOF_MAGIC || b[4] != VERSION {
        return None;
    }
    let mut n = [0u8; NONCE_LEN];
    n.copy_from_slice(&b[8..]);
    Some(n)
}

/// The header of a control frame of `kind` with no payload.
pub(crate) fn control(kind: u16) -> [u8; HDR_LEN] {
    (CTRL_BIT | u32::from(kind) << 16).to_be_bytes()
}

/// The connecting side's preamble: magic, version, flags (0) and the
/// sender's UDP source port (big endian).
pub(crate) fn preamble(src_port: u16) -> [u8; PREAMBLE_LEN] {
    let mut p = [0u8; PREAMBLE_LEN];
    p[..4].copy_from_slice(PREAMBLE_MAGIC);
    p[4] = VERSION;
    p[6..8].copy_from_slice(&src_port.to_be_bytes());
    p
}

/// Turns the preamble at the front of `out` into a striped one: sets the
/// flag and inserts the extension (group, index, count, reserved byte)
/// right after it. Returns the new length of the preamble.
pub(crate) fn extend_preamble(out: &mut Vec<u8>, s: Stripe) -> usize {
    debug_assert!(out.len() >= PREAMBLE_LEN && &out[..4] == PREAMBLE_MAGIC);
    out[5] |= FLAG_STRIPE;
    let mut ext = [0u8; STRIPE_EXT_LEN];
    ext[..4].copy_from_slice(&s.group.to_be_bytes());
    ext[4] = s.index;
    ext[5] = s.count;
    out.splice(PREAMBLE_LEN..PREAMBLE_LEN, ext);
    PREAMBLE_LEN + STRIPE_EXT_LEN
}

/// Result of looking at the front of an accepted connection's stream.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum ParsedPreamble {
    /// A preamble of this many bytes.
    Done(Preamble, usize),
    /// More bytes are needed.
    Partial,
    /// Not a (valid) preamble.
    Invalid,
}

/// Parses the preamble (and its stripe extension) at the front of `b`.
pub(crate) fn parse_preamble(b: &[u8]) -> ParsedPreamble {
    if b.len() < PREAMBLE_LEN {
        return ParsedPreamble::Partial;
    }
    if &b[..4] != PREAMBLE_MAGIC || b[4] != VERSION {
        return ParsedPreamble::Invalid;
    }
    let port = u16::from_be_bytes([b[6], b[7]]);
    if b[5] & FLAG_STRIPE == 0 {
        return ParsedPreamble::Done(Preamble { port, stripe: None }, PREAMBLE_LEN);
    }
    let len = PREAMBLE_LEN + STRIPE_EXT_LEN;
    if b.len() < len {
        return ParsedPreamble::Partial;
    }
    let e = &b[PREAMBLE_LEN..len];
    let s = Stripe {
        group: u32::from_be_bytes([e[0], e[1], e[2], e[3]]),
        index: e[4],
        count: e[5],
    };
    if s.group == 0 || s.count < 2 || usize::from(s.count) > MAX_STRIPES || s.index >= s.count {
        return ParsedPreamble::Invalid;
    }
    ParsedPreamble::Done(
        Preamble {
            port,
            stripe: Some(s),
        },
        len,
    )
}

/// The header in front of a datagram of `len` bytes (`len <= MAX_DGRAM`).
pub(crate) fn header(len: usize) -> [u8; HDR_LEN] {
    debug_assert!(len <= MAX_DGRAM);
    (len as u32).to_be_bytes()
}

/// Result of looking at the front of a receive buffer.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Parsed {
    /// A whole frame: payload at `buf[HDR_LEN..HDR_LEN + len]`.
    Frame(usize),
    /// A whole control frame of this kind, payload as for `Frame`.
    Control(u16, usize),
    /// More bytes are needed.
    Partial,
    /// The stream is not warpsock framing; drop the connection.
    Invalid,
}

/// Looks at the frame at the front of `buf`.
pub(crate) fn parse(buf: &[u8]) -> Parsed {
    if buf.len() < HDR_LEN {
        return Parsed::Partial;
    }
    let v = u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]);
    let (ctrl, len) = if v & CTRL_BIT != 0 {
        (Some((v >> 16) as u16 & 0x7fff), (v & 0xffff) as usize)
    } else {
        (None, v as usize)
    };
    if len > MAX_DGRAM {
        return Parsed::Invalid;
    }
    if buf.len() < HDR_LEN + len {
        return Parsed::Partial;
    }
    match ctrl {
        Some(kind) => Parsed::Control(kind, len),
        None => Parsed::Frame(len),
    }
}

/// Walks whole frames in `buf` from offset `from`; returns the offsets at
/// which frames start and that lie at or after `at`, with their lengths.
/// Used to recover unsent datagrams from a send buffer.
pub(crate) fn frames_from(buf: &[u8], mut from: usize, at: usize) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    loop {
        match parse(&buf[from..]) {
            Parsed::Frame(len) => {
                if from >= at {
                    out.push((from + HDR_LEN, len));
                }
                from += HDR_LEN + len;
            }
            // Control frames are not datagrams: skipped.
            Parsed::Control(_, len) => from += HDR_LEN + len,
            Parsed::Partial | Parsed::Invalid => return out,
        }
    }
}

/// Length of the whole frame (data or control) at the front of `buf`.
pub(crate) fn frame_len(buf: &[u8]) -> Option<usize> {
    match parse(buf) {
        Parsed::Frame(len) | Parsed::Control(_, len) => Some(HDR_LEN + len),
        Parsed::Partial | Parsed::Invalid => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hello_and_preamble_round_trip() {
        let plain = hello(None);
        assert_eq!(
            parse_hello(&plain),
            ParsedHello::Done(
                Hello {
                    caps: CAP_STRIPES,
                    nonce: None
                },
                HELLO_LEN
            )
        );
        let n = [7u8; NONCE_LEN];
        let h = hello(Some(&n));
        for cut in 0..h.len() {
            assert_eq!(parse_hello(&h[..cut]), ParsedHello::Partial, "{cut}");
        }
        assert_eq!(
            parse_hello(&h),
            ParsedHello::Done(
                Hello {
                    caps: CAP_STRIPES | CAP_PROOF,
                    nonce: Some(n)
                },
                HELLO_PROOF_LEN
            )
        );
        assert!(
            matches!(parse_hello(b"WSUA\x01\0\0\0"), ParsedHello::Done(_, 8)),
            "an older acceptor's hello"
        );
        assert_eq!(parse_hello(b"WSUA\x02\0\0\0"), ParsedHello::Invalid);
        assert_eq!(parse_hello(b"HTTP/1.1"), ParsedHello::Invalid);
        // K = 1: the preamble is the original 8 bytes, byte for byte.
        assert_eq!(&preamble(0x1234), b"WSUD\x01\0\x12\x34");
        assert_eq!(
            parse_preamble(&preamble(40000)),
            ParsedPreamble::Done(
                Preamble {
                    port: 40000,
                    stripe: None
                },
                PREAMBLE_LEN
            )
        );
        assert_eq!(parse_preamble(&hello(None)), ParsedPreamble::Invalid);
        assert_eq!(parse_preamble(&preamble(1)[..5]), ParsedPreamble::Partial);
    }

    #[test]
    fn striped_preamble_round_trip() {
        let s = Stripe {
            group: 0xdead_beef,
            index: 3,
            count: 4,
        };
        let mut out = preamble(5001).to_vec();
        out.extend_from_slice(&header(2));
        out.extend_from_slice(b"hi");
        assert_eq!(extend_preamble(&mut out, s), 16);
        for cut in 0..16 {
            assert_eq!(
                parse_preamble(&out[..cut]),
                ParsedPreamble::Partial,
                "{cut}"
            );
        }
        let want = Preamble {
            port: 5001,
            stripe: Some(s),
        };
        assert_eq!(parse_preamble(&out), ParsedPreamble::Done(want, 16));
        // The frames follow the extension.
        assert_eq!(frames_from(&out, 16, 0), vec![(20, 2)]);
        for bad in [
            Stripe { group: 0, ..s },
            Stripe { index: 4, ..s },
            Stripe {
                count: 1,
                index: 0,
                ..s
            },
            Stripe { count: 17, ..s },
        ] {
            let mut o = preamble(1).to_vec();
            extend_preamble(&mut o, bad);
            assert_eq!(parse_preamble(&o), ParsedPreamble::Invalid, "{bad:?}");
        }
    }

    #[test]
    fn frames_parse_in_pieces() {
        let mut buf = Vec::new();
        for len in [0usize, 1, 1472, MAX_DGRAM] {
            buf.extend_from_slice(&header(len));
            buf.extend((0..len).map(|i| i as u8));
        }
        // Every prefix that cuts a frame is Partial, never Invalid.
        let mut off = 0;
        let mut lens = Vec::new();
        while off < buf.len() {
            for cut in off..off + HDR_LEN.min(buf.len() - off) {
                assert_eq!(parse(&buf[off..cut]), Parsed::Partial);
            }
            match parse(&buf[off..]) {
                Parsed::Frame(len) => {
                    assert_eq!(
                        parse(&buf[off..off + HDR_LEN + len - usize::from(len > 0)]),
                        if len > 0 {
                            Parsed::Partial
                        } else {
                            Parsed::Frame(0)
                        }
                    );
                    lens.push(len);
                    off += HDR_LEN + len;
                }
                other => panic!("unexpected {other:?}"),
            }
        }
        assert_eq!(lens, vec![0, 1, 1472, MAX_DGRAM]);
        assert_eq!(
            parse(&[0, 1, 0, 0]),
            Parsed::Invalid,
            "65536 bytes is too long"
        );
    }

    #[test]
    fn proof_datagrams_and_control_frames() {
        let n = [0xa5u8; NONCE_LEN];
        let p = proof(&n);
        assert_eq!(&p[..8], b"WSUP\x01\0\0\0");
        assert_eq!(parse_proof(&p), Some(n));
        assert_eq!(parse_proof(&p[..PROOF_LEN - 1]), None);
        assert_eq!(parse_proof(&[p.as_slice(), b"x"].concat()), None);
        assert_eq!(parse_proof(b"WSUQ\x01\0\0\0aaaaaaaaaaaaaaaa"), None);
        let c = control(CTRL_PROVEN);
        assert_eq!(parse(&c), Parsed::Control(CTRL_PROVEN, 0));
        assert_eq!(parse(&c[..3]), Parsed::Partial);
        // A control frame is never mistaken for a (too long) datagram.
        let mut buf = c.to_vec();
        buf.extend_from_slice(&header(1));
        buf.push(9);
        assert_eq!(parse(&buf[4..]), Parsed::Frame(1));
    }

    #[test]
    fn recover_unsent_frames() {
        let mut buf = preamble(7).to_vec();
        for len in [3usize, 5, 2] {
            buf.extend_from_slice(&header(len));
            buf.extend(std::iter::repeat_n(len as u8, len));
        }
        // Frames start at 8, 15, 24; sent up to 16 (inside frame 2): only the
        // third frame is whole and unsent.
        let f = frames_from(&buf, PREAMBLE_LEN, 16);
        assert_eq!(f, vec![(28, 2)]);
        assert_eq!(frames_from(&buf, PREAMBLE_LEN, 0).len(), 3);
    }
}
