//! DDP segment headers (RFC 5041 §4) with the RDMAP control byte (RFC 5040
//! §4.1–4.4) and the RDMA Read Request body (RFC 5040 §4.4).
//!
//! Every ULPDU starts with two control bytes:
//!
//! ```text
//! byte 0 (DDP):   T(0x80) L(0x40) rsvd(0x3c) DV(0x03, =1)
//! byte 1 (RDMAP): RV(0xc0, =1) rsvd(0x30) opcode(0x0f)
//! ```
//!
//! A tagged segment (T=1: RDMA Write, Read Response) continues with
//! `be32 STag, be64 TO` (14 bytes in all); an untagged one (T=0: Send
//! variants, Read Request, Terminate) with `be32 Invalidate STag (or
//! reserved), be32 QN, be32 MSN, be32 MO` (18 bytes). A Read Request's
//! untagged header is followed by a 28-byte [`ReadRequest`].
//!
//! Checks happen in the order Linux siw applies them (`siw_get_hdr`): DDP
//! version, RDMAP version, opcode, DDP model of the opcode, then length.

use crate::error::{be32, be64, need};
use crate::WireError;

/// DDP version this stack speaks (RFC 5041).
pub const DDP_VERSION: u8 = 1;
/// RDMAP version this stack speaks (RFC 5040).
pub const RDMAP_VERSION: u8 = 1;
/// Tagged header length, control bytes included.
pub const TAGGED_HDR_LEN: usize = 14;
/// Untagged header length, control bytes included.
pub const UNTAGGED_HDR_LEN: usize = 18;
/// Largest header any segment starts with.
pub const MAX_HDR_LEN: usize = UNTAGGED_HDR_LEN;
/// Length of the Read Request body after its untagged header.
pub const READ_REQUEST_LEN: usize = 28;

/// DDP control: tagged-buffer model.
pub const DDP_TAGGED: u8 = 0x80;
/// DDP control: last segment of a message.
pub const DDP_LAST: u8 = 0x40;
/// DDP control: version bits.
pub const DDP_VERSION_MASK: u8 = 0x03;

/// Untagged queue numbers used by RDMAP (RFC 5040 §5.1).
pub mod queue {
    /// Send, Send with Invalidate, Send with SE, Send with SE and Invalidate.
    pub const SEND: u32 = 0;
    /// RDMA Read Request.
    pub const READ_REQUEST: u32 = 1;
    /// Terminate.
    pub const TERMINATE: u32 = 2;
}

/// RDMAP opcodes 0–7 (RFC 5040 §4.2). 8–15 are not defined and are
/// answered with a Terminate (siw does the same; it has no RFC 7306).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum Opcode {
    /// RDMA Write (tagged).
    RdmaWrite = 0,
    /// RDMA Read Request (untagged, QN 1).
    RdmaReadRequest = 1,
    /// RDMA Read Response (tagged).
    RdmaReadResponse = 2,
    /// Send (untagged, QN 0).
    Send = 3,
    /// Send with Invalidate.
    SendInvalidate = 4,
    /// Send with Solicited Event.
    SendSe = 5,
    /// Send with Solicited Event and Invalidate.
    SendSeInvalidate = 6,
    /// Terminate (untagged, QN 2).
    Terminate = 7,
}

impl Opcode {
    /// The opcode for the low four bits, if defined.
    pub const fn from_bits(bits: u8) -> Option<Self> {
        Some(match bits {
            0 => Self::RdmaWrite,
            1 => Self::RdmaReadRequest,
            2 => Self::RdmaReadResponse,
            3 => Self::Send,
            4 => Self::SendInvalidate,
            5 => Self::SendSe,
            6 => Self::SendSeInvalidate,
            7 => Self::Terminate,
            _ => return None,
        })
    }

    /// Whether the opcode travels in tagged DDP segments.
    pub const fn is_tagged(self) -> bool {
        matches!(self, Self::RdmaWrite | Self::RdmaReadResponse)
    }

    /// The untagged queue the opcode uses (`None` for tagged opcodes).
    pub const fn queue(self) -> Option<u32> {
        match self {
            Self::Send | Self::SendInvalidate | Self::SendSe | Self::SendSeInvalidate => {
                Some(queue::SEND)
            }
            Self::RdmaReadRequest => Some(queue::READ_REQUEST),
            Self::Terminate => Some(queue::TERMINATE),
            Self::RdmaWrite | Self::RdmaReadResponse => None,
        }
    }

    /// Whether this is one of the four Send variants.
    pub const fn is_send(self) -> bool {
        matches!(self.queue(), Some(queue::SEND))
    }

    /// Whether the Send carries an STag to invalidate.
    pub const fn invalidates(self) -> bool {
        matches!(self, Self::SendInvalidate | Self::SendSeInvalidate)
    }

    /// Whether the Send asks for a solicited event.
    pub const fn solicited(self) -> bool {
        matches!(self, Self::SendSe | Self::SendSeInvalidate)
    }

    /// DDP header length for this opcode (control bytes included).
    pub const fn header_len(self) -> usize {
        if self.is_tagged() {
            TAGGED_HDR_LEN
        } else {
            UNTAGGED_HDR_LEN
        }
    }
}

/// The buffer-model part of a DDP header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Placement {
    /// Tagged buffer model: the payload lands at `to` within `stag`.
    Tagged {
        /// Steering tag of the target buffer.
        stag: u32,
        /// Tagged offset of the first payload byte.
        to: u64,
    },
    /// Untagged buffer model: the payload lands in the next buffer of `qn`.
    Untagged {
        /// Invalidate STag for Send with Invalidate; reserved (0) otherwise.
        inv_stag: u32,
        /// Queue number.
        qn: u32,
        /// Message sequence number (starts at 1, wraps at 2^32).
        msn: u32,
        /// Message offset of the first payload byte.
        mo: u32,
    },
}

/// A parsed DDP/RDMAP segment header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SegmentHeader {
    /// RDMAP opcode.
    pub opcode: Opcode,
    /// DDP L bit: last segment of the message.
    pub last: bool,
    /// Tagged or untagged fields.
    pub placement: Placement,
}

impl SegmentHeader {
    /// Parses the header at the start of a ULPDU.
    pub fn parse(ulpdu: &[u8]) -> Result<Self, WireError> {
        need(ulpdu, 2)?;
        let ddp = ulpdu[0];
        let rdmap = ulpdu[1];
        let tagged = ddp & DDP_TAGGED != 0;
        let version = ddp & DDP_VERSION_MASK;
        if version != DDP_VERSION {
            return Err(WireError::BadDdpVersion { tagged, version });
        }
        let rv = rdmap >> 6;
        if rv != RDMAP_VERSION {
            return Err(WireError::BadRdmapVersion(rv));
        }
        let bits = rdmap & 0x0f;
        let opcode = Opcode::from_bits(bits).ok_or(WireError::UnknownOpcode(bits))?;
        if opcode.is_tagged() != tagged {
            return Err(WireError::OpcodeModelMismatch {
                opcode: bits,
                tagged,
            });
        }
        need(ulpdu, opcode.header_len())?;
        let placement = if tagged {
            Placement::Tagged {
                stag: be32(ulpdu, 2),
                to: be64(ulpdu, 6),
            }
        } else {
            Placement::Untagged {
                inv_stag: be32(ulpdu, 2),
                qn: be32(ulpdu, 6),
                msn: be32(ulpdu, 10),
                mo: be32(ulpdu, 14),
            }
        };
        Ok(Self {
            opcode,
            last: ddp & DDP_LAST != 0,
            placement,
        })
    }

    /// Header length on the wire (a header is never empty).
    #[allow(clippy::len_without_is_empty)]
    pub const fn len(&self) -> usize {
        match self.placement {
            Placement::Tagged { .. } => TAGGED_HDR_LEN,
            Placement::Untagged { .. } => UNTAGGED_HDR_LEN,
        }
    }

    /// Whether the header uses the tagged model.
    pub const fn is_tagged(&self) -> bool {
        matches!(self.placement, Placement::Tagged { .. })
    }

    /// The header bytes (first [`Self::len`] bytes of the array are valid).
    #[inline]
    pub fn to_bytes(&self) -> [u8; MAX_HDR_LEN] {
        let mut b = [0u8; MAX_HDR_LEN];
        let mut ddp = DDP_VERSION;
        if self.last {
            ddp |= DDP_LAST;
        }
        match self.placement {
            Placement::Tagged { stag, to } => {
                ddp |= DDP_TAGGED;
                b[2..6].copy_from_slice(&stag.to_be_bytes());
                b[6..14].copy_from_slice(&to.to_be_bytes());
            }
            Placement::Untagged {
                inv_stag,
                qn,
                msn,
                mo,
            } => {
                b[2..6].copy_from_slice(&inv_stag.to_be_bytes());
                b[6..10].copy_from_slice(&qn.to_be_bytes());
                b[10..14].copy_from_slice(&msn.to_be_bytes());
                b[14..18].copy_from_slice(&mo.to_be_bytes());
            }
        }
        b[0] = ddp;
        b[1] = (RDMAP_VERSION << 6) | self.opcode as u8;
        b
    }

    /// Appends the header to `out`.
    pub fn emit(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.to_bytes()[..self.len()]);
    }
}

/// The body of an RDMA Read Request (RFC 5040 §4.4).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct ReadRequest {
    /// Data sink STag (the requester's buffer).
    pub sink_stag: u32,
    /// Data sink tagged offset.
    pub sink_to: u64,
    /// RDMA Read message size in bytes.
    pub size: u32,
    /// Data source STag (the responder's buffer).
    pub src_stag: u32,
    /// Data source tagged offset.
    pub src_to: u64,
}

impl ReadRequest {
    /// Parses the 28-byte body.
    pub fn parse(b: &[u8]) -> Result<Self, WireError> {
        need(b, READ_REQUEST_LEN)?;
        Ok(Self {
            sink_stag: be32(b, 0),
            sink_to: be64(b, 4),
            size: be32(b, 12),
            src_stag: be32(b, 16),
            src_to: be64(b, 20),
        })
    }

    /// The 28-byte body.
    pub fn to_bytes(&self) -> [u8; READ_REQUEST_LEN] {
        let mut b = [0u8; READ_REQUEST_LEN];
        b[0..4].copy_from_slice(&self.sink_stag.to_be_bytes());
        b[4..12].copy_from_slice(&self.sink_to.to_be_bytes());
        b[12..16].copy_from_slice(&self.size.to_be_bytes());
        b[16..20].copy_from_slice(&self.src_stag.to_be_bytes());
        b[20..28].copy_from_slice(&self.src_to.to_be_bytes());
        b
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// rping's start message as captured against siw (siw-compat.md
    /// appendix): Send, QN 0, MSN 1, MO 0, last.
    const SEND_HDR: [u8; 18] = [0x41, 0x43, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0];
    /// siw's Read Request (QN 1, MSN 1) with its body.
    const READ_REQ: [u8; 46] = [
        0x41, 0x41, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 0, // hdr
        0x4a, 0x0f, 0x04, 0x00, // sink STag
        0x00, 0x00, 0x7f, 0x71, 0xac, 0x00, 0x0e, 0x00, // sink TO
        0x00, 0x00, 0x00, 0x40, // size
        0x00, 0x00, 0x12, 0x34, // src STag
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x10, 0x00, // src TO
    ];

    #[test]
    fn deconstruct_send() {
        let h = SegmentHeader::parse(&SEND_HDR).unwrap();
        assert_eq!(h.opcode, Opcode::Send);
        assert!(h.last);
        assert_eq!(
            h.placement,
            Placement::Untagged {
                inv_stag: 0,
                qn: 0,
                msn: 1,
                mo: 0
            }
        );
        assert_eq!(h.to_bytes()[..h.len()], SEND_HDR);
    }

    #[test]
    fn deconstruct_read_request() {
        let h = SegmentHeader::parse(&READ_REQ).unwrap();
        assert_eq!(h.opcode, Opcode::RdmaReadRequest);
        assert_eq!(h.opcode.queue(), Some(queue::READ_REQUEST));
        let rr = ReadRequest::parse(&READ_REQ[18..]).unwrap();
        assert_eq!(rr.sink_stag, 0x4a0f_0400);
        assert_eq!(rr.sink_to, 0x7f71_ac00_0e00);
        assert_eq!(rr.size, 64);
        assert_eq!(rr.src_stag, 0x1234);
        assert_eq!(rr.src_to, 0x1000);
        let mut out = Vec::new();
        h.emit(&mut out);
        out.extend_from_slice(&rr.to_bytes());
        assert_eq!(out, READ_REQ);
    }

    #[test]
    fn construct_tagged_write_rtr() {
        // siw's P2P write RTR: c1 40, STag 1, TO 0.
        let h = SegmentHeader {
            opcode: Opcode::RdmaWrite,
            last: true,
            placement: Placement::Tagged { stag: 1, to: 0 },
        };
        let b = h.to_bytes();
        assert_eq!(&b[..14], &[0xc1, 0x40, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(SegmentHeader::parse(&b[..14]).unwrap(), h);
        let more = SegmentHeader { last: false, ..h };
        assert_eq!(more.to_bytes()[0], 0x81);
    }

    #[test]
    fn errors_in_siw_order() {
        let mut b = SEND_HDR;
        b[0] = 0x42; // DV = 2
        assert_eq!(
            SegmentHeader::parse(&b),
            Err(WireError::BadDdpVersion {
                tagged: false,
                version: 2
            })
        );
        b[0] = 0xc2;
        assert_eq!(
            SegmentHeader::parse(&b),
            Err(WireError::BadDdpVersion {
                tagged: true,
                version: 2
            })
        );
        let mut b = SEND_HDR;
        b[1] = 0x83; // RV = 2
        assert_eq!(SegmentHeader::parse(&b), Err(WireError::BadRdmapVersion(2)));
        b[1] = 0x48; // opcode 8
        assert_eq!(SegmentHeader::parse(&b), Err(WireError::UnknownOpcode(8)));
        b[1] = 0x40; // Write in an untagged segment
        assert_eq!(
            SegmentHeader::parse(&b),
            Err(WireError::OpcodeModelMismatch {
                opcode: 0,
                tagged: false
            })
        );
        assert_eq!(
            SegmentHeader::parse(&SEND_HDR[..10]),
            Err(WireError::Truncated {
                needed: 18,
                available: 10
            })
        );
        assert!(SegmentHeader::parse(&[0x41]).is_err());
        assert!(ReadRequest::parse(&READ_REQ[18..40]).is_err());
    }

    #[test]
    fn opcode_table() {
        for bits in 0..16u8 {
            match Opcode::from_bits(bits) {
                Some(op) => {
                    assert_eq!(op as u8, bits);
                    assert_eq!(op.is_tagged(), op.queue().is_none());
                }
                None => assert!(bits > 7),
            }
        }
        assert!(Opcode::SendSeInvalidate.solicited() && Opcode::SendSeInvalidate.invalidates());
        assert!(!Opcode::Send.solicited() && Opcode::Send.is_send());
        assert!(!Opcode::Terminate.is_send());
    }
}
