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

const HELLO_MAGIC: &[u8; 4] = b"WSUA";
const PREAMBLE_MAGIC: &[u8; 4] = b"WSUD";

/// The accepting side's hello: magic, version, three reserved zero bytes.
pub(crate) fn hello() -> [u8; HELLO_LEN] {
    let mut h = [0u8; HELLO_LEN];
    h[..4].copy_from_slice(HELLO_MAGIC);
    h[4] = VERSION;
    h
}

/// Whether `b` (exactly [`HELLO_LEN`] bytes) is a hello we can talk to.
pub(crate) fn check_hello(b: &[u8]) -> bool {
    b.len() == HELLO_LEN && &b[..4] == HELLO_MAGIC && b[4] == VERSION
}

/// The connecting side's preamble: magic, version, a reserved zero byte and
/// the sender's UDP source port (big endian).
pub(crate) fn preamble(src_port: u16) -> [u8; PREAMBLE_LEN] {
    let mut p = [0u8; PREAMBLE_LEN];
    p[..4].copy_from_slice(PREAMBLE_MAGIC);
    p[4] = VERSION;
    p[6..8].copy_from_slice(&src_port.to_be_bytes());
    p
}

/// The sender's UDP port from a preamble, or `None` if it is not one.
pub(crate) fn parse_preamble(b: &[u8]) -> Option<u16> {
    if b.len() != PREAMBLE_LEN || &b[..4] != PREAMBLE_MAGIC || b[4] != VERSION {
        return None;
    }
    Some(u16::from_be_bytes([b[6], b[7]]))
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
    let len = u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
    if len > MAX_DGRAM {
        return Parsed::Invalid;
    }
    if buf.len() < HDR_LEN + len {
        Parsed::Partial
    } else {
        Parsed::Frame(len)
    }
}

/// Walks whole frames in `buf` from offset `from`; returns the offsets at
/// which frames start and that lie at or after `at`, with their lengths.
/// Used to recover unsent datagrams from a send buffer.
pub(crate) fn frames_from(buf: &[u8], mut from: usize, at: usize) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    while let Parsed::Frame(len) = parse(&buf[from..]) {
        if from >= at {
            out.push((from + HDR_LEN, len));
        }
        from += HDR_LEN + len;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hello_and_preamble_round_trip() {
        assert!(check_hello(&hello()));
        assert!(!check_hello(b"WSUA\x02\0\0\0"));
        assert!(!check_hello(b"HTTP/1.1"));
        assert_eq!(parse_preamble(&preamble(40000)), Some(40000));
        assert_eq!(parse_preamble(&hello()), None);
        assert_eq!(&preamble(0x1234)[6..], &[0x12, 0x34]);
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
