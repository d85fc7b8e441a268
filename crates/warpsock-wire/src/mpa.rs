//! MPA Request and Reply frames (RFC 5044 §7.1) and the RFC 6581 enhanced
//! connection-setup word.
//!
//! ```text
//!  0               16      17       18        20
//! +----------------+-------+--------+---------+------------------+
//! | key (16 bytes) | flags | rev    | PD_Len  | private data ... |
//! +----------------+-------+--------+---------+------------------+
//! flags: M=0x80 (markers) C=0x40 (CRC) R=0x20 (reject) S=0x10 (enhanced,
//!        RFC 6581) 0x0f reserved (siw uses 0x08 as its private "GSO" bit)
//! ```
//!
//! With the enhanced bit (revision 2) the first four bytes of private data
//! are `be16 IRD | be16 ORD` with the A/B bits on IRD and C/D bits on ORD
//! ([`EnhancedParams`]); `PD_Length` counts those four bytes.
//!
//! Limits: RFC 5044 allows 512 bytes of private data. **Linux siw drops the
//! connection without a reply above 256 bytes** (`siw_recv_mpa_rr`), and its
//! reply path stores the ULP length in a `u8`, so applications that must
//! talk to siw keep ULP private data at or below 251 bytes
//! ([`SIW_MAX_ULP_PRIVATE_DATA_LEN`]).

use crate::error::{be16, need};
use crate::WireError;

/// Key that starts an MPA Request.
pub const KEY_REQUEST: [u8; 16] = *b"MPA ID Req Frame";
/// Key that starts an MPA Reply.
pub const KEY_REPLY: [u8; 16] = *b"MPA ID Rep Frame";
/// Bytes before the private data.
pub const HEADER_LEN: usize = 20;
/// RFC 5044 §7.1 limit on private data.
pub const MAX_PRIVATE_DATA_LEN: usize = 512;
/// Largest private data (including the enhanced word) Linux siw accepts.
pub const SIW_MAX_PRIVATE_DATA_LEN: usize = 256;
/// Largest ULP private data that fits siw's limits next to the enhanced word.
pub const SIW_MAX_ULP_PRIVATE_DATA_LEN: usize = 251;
/// Highest MPA revision defined (RFC 6581).
pub const MAX_REVISION: u8 = 2;
/// Length of the RFC 6581 IRD/ORD word.
pub const ENHANCED_PARAMS_LEN: usize = 4;

/// Which of the two connection-setup frames.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FrameKind {
    /// Sent by the initiator ("MPA ID Req Frame").
    Request,
    /// Sent by the responder ("MPA ID Rep Frame").
    Reply,
}

impl FrameKind {
    /// The 16-byte key that identifies this frame kind.
    pub const fn key(self) -> &'static [u8; 16] {
        match self {
            Self::Request => &KEY_REQUEST,
            Self::Reply => &KEY_REPLY,
        }
    }
}

/// The flags byte of an MPA Request/Reply.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Flags(pub u8);

impl Flags {
    /// M: the sender wants markers.
    pub const MARKERS: u8 = 0x80;
    /// C: the sender wants CRC.
    pub const CRC: u8 = 0x40;
    /// R: the responder rejects the connection.
    pub const REJECT: u8 = 0x20;
    /// S: RFC 6581 enhanced connection setup (IRD/ORD word present).
    pub const ENHANCED: u8 = 0x10;
    /// Bits RFC 5044 reserves (siw echoes them in its reply).
    pub const RESERVED: u8 = 0x0f;

    /// Whether M is set.
    pub const fn markers(self) -> bool {
        self.0 & Self::MARKERS != 0
    }
    /// Whether C is set.
    pub const fn crc(self) -> bool {
        self.0 & Self::CRC != 0
    }
    /// Whether R is set.
    pub const fn reject(self) -> bool {
        self.0 & Self::REJECT != 0
    }
    /// Whether S (enhanced) is set.
    pub const fn enhanced(self) -> bool {
        self.0 & Self::ENHANCED != 0
    }
    /// The reserved bits.
    pub const fn reserved(self) -> u8 {
        self.0 & Self::RESERVED
    }
    /// These flags with `bit` set or cleared.
    #[must_use]
    pub const fn with(self, bit: u8, on: bool) -> Self {
        if on {
            Self(self.0 | bit)
        } else {
            Self(self.0 & !bit)
        }
    }
}

/// A parsed or to-be-emitted MPA Request/Reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestReply<'a> {
    /// Request or Reply.
    pub kind: FrameKind,
    /// M/C/R/S and reserved bits.
    pub flags: Flags,
    /// MPA revision (0, 1 or 2).
    pub revision: u8,
    /// All private data, including the enhanced word when present.
    pub private_data: &'a [u8],
}

/// Length of the whole frame whose first bytes are in `buf`, once the
/// 20-byte header is available (`None` before that).
pub fn frame_len(buf: &[u8]) -> Option<usize> {
    (buf.len() >= HEADER_LEN).then(|| HEADER_LEN + usize::from(be16(buf, 18)))
}

impl<'a> RequestReply<'a> {
    /// Parses a frame of `kind` from the start of `buf` (which may hold
    /// further bytes; the frame occupies [`Self::buffer_len`] of them).
    ///
    /// Checks, in siw's order (`siw_recv_mpa_rr`, `siw_proc_mpareq`): key,
    /// private data length (≤ 512), completeness, revision (≤ 2), and that
    /// an enhanced revision-2 frame carries the IRD/ORD word.
    pub fn parse(buf: &'a [u8], kind: FrameKind) -> Result<Self, WireError> {
        need(buf, HEADER_LEN)?;
        if &buf[..16] != kind.key() {
            return Err(WireError::BadMpaKey);
        }
        let pd_len = usize::from(be16(buf, 18));
        if pd_len > MAX_PRIVATE_DATA_LEN {
            return Err(WireError::PrivateDataTooLong(pd_len));
        }
        need(buf, HEADER_LEN + pd_len)?;
        let flags = Flags(buf[16]);
        let revision = buf[17];
        if revision > MAX_REVISION {
            return Err(WireError::BadMpaRevision(revision));
        }
        let private_data = &buf[HEADER_LEN..HEADER_LEN + pd_len];
        if revision == 2 && flags.enhanced() && pd_len < ENHANCED_PARAMS_LEN {
            return Err(WireError::MissingEnhancedParams);
        }
        Ok(Self {
            kind,
            flags,
            revision,
            private_data,
        })
    }

    /// Bytes this frame occupies on the wire.
    pub fn buffer_len(&self) -> usize {
        HEADER_LEN + self.private_data.len()
    }

    /// Whether this frame uses RFC 6581 enhanced setup (rev 2 + S bit).
    pub fn is_enhanced(&self) -> bool {
        self.revision == 2 && self.flags.enhanced() && self.private_data.len() >= 4
    }

    /// The IRD/ORD word, when the frame is enhanced.
    pub fn enhanced_params(&self) -> Option<EnhancedParams> {
        self.is_enhanced().then(|| {
            EnhancedParams::from_bytes(self.private_data[..4].try_into().unwrap_or([0; 4]))
        })
    }

    /// Private data meant for the application (without the enhanced word).
    pub fn ulp_private_data(&self) -> &'a [u8] {
        if self.is_enhanced() {
            &self.private_data[ENHANCED_PARAMS_LEN..]
        } else {
            self.private_data
        }
    }

    /// Appends the frame to `out`. The private data length must not exceed
    /// [`MAX_PRIVATE_DATA_LEN`] (callers validate; longer data is truncated
    /// to the 16-bit field and would be a programming error).
    pub fn emit(&self, out: &mut Vec<u8>) {
        debug_assert!(self.private_data.len() <= MAX_PRIVATE_DATA_LEN);
        out.extend_from_slice(self.kind.key());
        out.push(self.flags.0);
        out.push(self.revision);
        out.extend_from_slice(&(self.private_data.len() as u16).to_be_bytes());
        out.extend_from_slice(self.private_data);
    }
}

/// The RFC 6581 enhanced connection-setup word (first 4 bytes of private
/// data): `be16 IRD` with A (peer-to-peer) and B (zero-length Send RTR)
/// flags, `be16 ORD` with C (zero-length Write RTR) and D (zero-length Read
/// RTR) flags. IRD and ORD are 14-bit values.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct EnhancedParams {
    /// Inbound RDMA Read queue depth offered.
    pub ird: u16,
    /// Outbound RDMA Read queue depth wanted.
    pub ord: u16,
    /// A: peer-to-peer mode (a ready-to-receive message follows setup).
    pub peer_to_peer: bool,
    /// B: zero-length Send may be the RTR message.
    pub send_rtr: bool,
    /// C: zero-length RDMA Write may be the RTR message.
    pub write_rtr: bool,
    /// D: zero-length RDMA Read may be the RTR message.
    pub read_rtr: bool,
}

impl EnhancedParams {
    /// Mask of the IRD/ORD value bits.
    pub const VALUE_MASK: u16 = 0x3fff;

    /// Decodes the 4-byte word.
    pub const fn from_bytes(b: [u8; 4]) -> Self {
        let ird = u16::from_be_bytes([b[0], b[1]]);
        let ord = u16::from_be_bytes([b[2], b[3]]);
        Self {
            ird: ird & Self::VALUE_MASK,
            ord: ord & Self::VALUE_MASK,
            peer_to_peer: ird & 0x8000 != 0,
            send_rtr: ird & 0x4000 != 0,
            write_rtr: ord & 0x8000 != 0,
            read_rtr: ord & 0x4000 != 0,
        }
    }

    /// Encodes the 4-byte word (IRD/ORD saturate at 0x3fff).
    pub fn to_bytes(&self) -> [u8; 4] {
        let mut ird = self.ird.min(Self::VALUE_MASK);
        let mut ord = self.ord.min(Self::VALUE_MASK);
        if self.peer_to_peer {
            ird |= 0x8000;
        }
        if self.send_rtr {
            ird |= 0x4000;
        }
        if self.write_rtr {
            ord |= 0x8000;
        }
        if self.read_rtr {
            ord |= 0x4000;
        }
        let [a, b] = ird.to_be_bytes();
        let [c, d] = ord.to_be_bytes();
        [a, b, c, d]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    /// The request warpsock and the siw-peer-vm probe send by default:
    /// rev 2, enhanced, IRD=1 ORD=1 (siw-compat.md appendix).
    const REQ_V2: &str = "4d504120494420526571204672616d651002000400010001";

    #[test]
    fn parse_siw_v2_request() {
        let b = hex(REQ_V2);
        let f = RequestReply::parse(&b, FrameKind::Request).unwrap();
        assert_eq!(f.revision, 2);
        assert!(f.flags.enhanced() && !f.flags.crc() && !f.flags.markers());
        assert_eq!(f.buffer_len(), 24);
        let p = f.enhanced_params().unwrap();
        assert_eq!((p.ird, p.ord, p.peer_to_peer), (1, 1, false));
        assert!(f.ulp_private_data().is_empty());
        let mut out = Vec::new();
        f.emit(&mut out);
        assert_eq!(out, b);
    }

    #[test]
    fn construct_matches_golden_bytes() {
        // siw-compat.md §3.4: S+C, rev2, IRD=1 ORD=1.
        let word = EnhancedParams {
            ird: 1,
            ord: 1,
            ..Default::default()
        }
        .to_bytes();
        let f = RequestReply {
            kind: FrameKind::Request,
            flags: Flags(Flags::ENHANCED | Flags::CRC),
            revision: 2,
            private_data: &word,
        };
        let mut out = Vec::new();
        f.emit(&mut out);
        let mut golden = b"MPA ID Req Frame".to_vec();
        golden.extend_from_slice(&[0x50, 2, 0, 4, 0, 1, 0, 1]);
        assert_eq!(out, golden);
    }

    #[test]
    fn reject_reply_and_p2p_words() {
        // siw's marker reject: 3002 0004 0000 0000 (R + S, rev 2, IRD/ORD 0).
        let mut b = KEY_REPLY.to_vec();
        b.extend_from_slice(&hex("3002000400000000"));
        let f = RequestReply::parse(&b, FrameKind::Reply).unwrap();
        assert!(f.flags.reject() && f.flags.enhanced() && !f.flags.markers());
        // P2P + write RTR / read RTR words from the appendix.
        let w = EnhancedParams::from_bytes([0x80, 0x01, 0x80, 0x01]);
        assert!(w.peer_to_peer && w.write_rtr && !w.read_rtr && w.ird == 1 && w.ord == 1);
        let r = EnhancedParams::from_bytes([0x80, 0x01, 0xc0, 0x01]);
        assert!(r.write_rtr && r.read_rtr);
        assert_eq!(r.to_bytes(), [0x80, 0x01, 0xc0, 0x01]);
        let b_bit = EnhancedParams::from_bytes([0x40, 0x05, 0x00, 0x07]);
        assert!(b_bit.send_rtr && !b_bit.peer_to_peer && b_bit.ird == 5 && b_bit.ord == 7);
    }

    #[test]
    fn ulp_private_data_after_word() {
        let mut c = KEY_REQUEST.to_vec();
        c.extend_from_slice(&hex("1002000900010001010203040506"));
        let f = RequestReply::parse(&c, FrameKind::Request).unwrap();
        assert_eq!(f.ulp_private_data(), &[1, 2, 3, 4, 5]);
        assert_eq!(frame_len(&c), Some(29));
        assert_eq!(f.buffer_len(), 29);
    }

    #[test]
    fn malformed_frames() {
        let mut bad_key = b"MPA_ID_Req_Frame".to_vec();
        bad_key.extend_from_slice(&[0x10, 2, 0, 4, 0, 1, 0, 1]);
        assert_eq!(
            RequestReply::parse(&bad_key, FrameKind::Request),
            Err(WireError::BadMpaKey)
        );
        let mut reply_as_req = KEY_REPLY.to_vec();
        reply_as_req.extend_from_slice(&[0, 1, 0, 0]);
        assert_eq!(
            RequestReply::parse(&reply_as_req, FrameKind::Request),
            Err(WireError::BadMpaKey)
        );
        let mut rev3 = KEY_REQUEST.to_vec();
        rev3.extend_from_slice(&[0, 3, 0, 0]);
        assert_eq!(
            RequestReply::parse(&rev3, FrameKind::Request),
            Err(WireError::BadMpaRevision(3))
        );
        let mut big = KEY_REQUEST.to_vec();
        big.extend_from_slice(&[0, 1, 0x02, 0x01]);
        big.resize(20 + 513, 0);
        assert_eq!(
            RequestReply::parse(&big, FrameKind::Request),
            Err(WireError::PrivateDataTooLong(513))
        );
        let mut short_enh = KEY_REQUEST.to_vec();
        short_enh.extend_from_slice(&[0x10, 2, 0, 2, 0, 1]);
        assert_eq!(
            RequestReply::parse(&short_enh, FrameKind::Request),
            Err(WireError::MissingEnhancedParams)
        );
        let mut partial = KEY_REQUEST.to_vec();
        partial.extend_from_slice(&[0x10, 2, 0, 4, 0]);
        assert_eq!(
            RequestReply::parse(&partial, FrameKind::Request),
            Err(WireError::Truncated {
                needed: 24,
                available: 21
            })
        );
        assert_eq!(
            RequestReply::parse(&partial[..7], FrameKind::Request),
            Err(WireError::Truncated {
                needed: 20,
                available: 7
            })
        );
        // Rev 2 without S: accepted, no enhanced word (siw treats it as rev 1).
        let mut v2_plain = KEY_REQUEST.to_vec();
        v2_plain.extend_from_slice(&[0, 2, 0, 0]);
        let f = RequestReply::parse(&v2_plain, FrameKind::Request).unwrap();
        assert!(f.enhanced_params().is_none());
    }
}
