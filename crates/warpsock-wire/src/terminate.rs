//! The Terminate message (RFC 5040 §4.8) and its error codes (RFC 5040
//! §7, RFC 5041 §7, RFC 5044 §8 / RFC 6581 for the LLP layer).
//!
//! A Terminate is an untagged message on QN 2 (MSN 1 for the only one a
//! stream ever carries, MO 0, L set). Its body is:
//!
//! ```text
//! Terminate Control (32 bits):
//!   Layer(4) | EType(4) | Error Code(8) | M D R (HdrCt, 3 bits) | reserved(13)
//! DDP Segment Length (16 bits)     present when M is set
//! Terminated DDP header (14/18 B)  present when D is set
//! Terminated RDMAP header (28 B)   present when R is set (Read Request body)
//! ```
//!
//! **Layout quirk** (`siw-compat.md` appendix): Linux siw declares the
//! control word with little-endian C bitfields, so on x86 it puts the layer
//! in the *low* nibble of byte 0 and M/D/R in the *low* bits of byte 2. We
//! emit the RFC layout (Wireshark reads that) and decode leniently:
//! [`TerminateControl::decode`] picks the layout under which the
//! layer/etype/ecode triple is one the RFCs define.

use crate::error::{be16, need};
use crate::WireError;

/// Length of the Terminate Control word.
pub const CONTROL_LEN: usize = 4;

/// Which protocol layer detected the error.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Layer {
    /// RDMAP (RFC 5040).
    Rdmap = 0,
    /// DDP (RFC 5041).
    Ddp = 1,
    /// The lower layer protocol: MPA (RFC 5044).
    Llp = 2,
}

/// A (layer, etype, ecode) triple.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TermCode {
    /// Layer nibble (0 RDMAP, 1 DDP, 2 LLP).
    pub layer: u8,
    /// Error type nibble.
    pub etype: u8,
    /// Error code byte.
    pub ecode: u8,
}

macro_rules! term_codes {
    ($($(#[$doc:meta])* $name:ident = ($layer:literal, $etype:literal, $ecode:literal, $desc:literal);)*) => {
        impl TermCode {
            $($(#[$doc])* pub const $name: Self = Self { layer: $layer, etype: $etype, ecode: $ecode };)*

            /// Every code the RFCs define, in table order.
            pub const ALL: &'static [Self] = &[$(Self::$name),*];

            /// What the code means, for codes the RFCs define.
            pub const fn description(&self) -> Option<&'static str> {
                match (self.layer, self.etype, self.ecode) {
                    $(($layer, $etype, $ecode) => Some($desc),)*
                    _ => None,
                }
            }
        }
    };
}

term_codes! {
    /// RDMAP local catastrophic error.
    RDMAP_LOCAL_CATASTROPHIC = (0, 0, 0x00, "RDMAP: local catastrophic error");
    /// Remote protection: invalid STag.
    RDMAP_INVALID_STAG = (0, 1, 0x00, "RDMAP remote protection: invalid STag");
    /// Remote protection: base or bounds violation.
    RDMAP_BASE_BOUNDS = (0, 1, 0x01, "RDMAP remote protection: base or bounds violation");
    /// Remote protection: access rights violation.
    RDMAP_ACCESS = (0, 1, 0x02, "RDMAP remote protection: access rights violation");
    /// Remote protection: STag not associated with this RDMAP stream.
    RDMAP_STAG_NOT_ASSOCIATED = (0, 1, 0x03, "RDMAP remote protection: STag not associated with RDMAP stream");
    /// Remote protection: tagged offset wrap.
    RDMAP_TO_WRAP = (0, 1, 0x04, "RDMAP remote protection: TO wrap");
    /// Remote protection: STag cannot be invalidated.
    RDMAP_PROTECTION_CANNOT_INVALIDATE = (0, 1, 0x09, "RDMAP remote protection: STag cannot be invalidated");
    /// Remote protection: unspecified.
    RDMAP_PROTECTION_UNSPECIFIED = (0, 1, 0xff, "RDMAP remote protection: unspecified error");
    /// Remote operation: invalid RDMAP version.
    RDMAP_INVALID_VERSION = (0, 2, 0x05, "RDMAP remote operation: invalid RDMAP version");
    /// Remote operation: unexpected opcode.
    RDMAP_UNEXPECTED_OPCODE = (0, 2, 0x06, "RDMAP remote operation: unexpected opcode");
    /// Remote operation: catastrophic error localized to this stream.
    RDMAP_CATASTROPHIC_STREAM = (0, 2, 0x07, "RDMAP remote operation: catastrophic error, localized to RDMAP stream");
    /// Remote operation: catastrophic error, global.
    RDMAP_CATASTROPHIC_GLOBAL = (0, 2, 0x08, "RDMAP remote operation: catastrophic error, global");
    /// Remote operation: STag cannot be invalidated.
    RDMAP_OPERATION_CANNOT_INVALIDATE = (0, 2, 0x09, "RDMAP remote operation: STag cannot be invalidated");
    /// Remote operation: unspecified.
    RDMAP_OPERATION_UNSPECIFIED = (0, 2, 0xff, "RDMAP remote operation: unspecified error");
    /// DDP local catastrophic error.
    DDP_LOCAL_CATASTROPHIC = (1, 0, 0x00, "DDP: local catastrophic error");
    /// Tagged buffer: invalid STag.
    DDP_TAGGED_INVALID_STAG = (1, 1, 0x00, "DDP tagged buffer: invalid STag");
    /// Tagged buffer: base or bounds violation.
    DDP_TAGGED_BASE_BOUNDS = (1, 1, 0x01, "DDP tagged buffer: base or bounds violation");
    /// Tagged buffer: STag not associated with this DDP stream.
    DDP_TAGGED_STAG_NOT_ASSOCIATED = (1, 1, 0x02, "DDP tagged buffer: STag not associated with DDP stream");
    /// Tagged buffer: TO wrap.
    DDP_TAGGED_TO_WRAP = (1, 1, 0x03, "DDP tagged buffer: TO wrap");
    /// Tagged buffer: invalid DDP version.
    DDP_TAGGED_INVALID_VERSION = (1, 1, 0x04, "DDP tagged buffer: invalid DDP version");
    /// Untagged buffer: invalid QN.
    DDP_UNTAGGED_INVALID_QN = (1, 2, 0x01, "DDP untagged buffer: invalid QN");
    /// Untagged buffer: invalid MSN, no buffer available (siw also uses it for "too long").
    DDP_UNTAGGED_NO_BUFFER = (1, 2, 0x02, "DDP untagged buffer: invalid MSN - no buffer available");
    /// Untagged buffer: invalid MSN, MSN range not valid.
    DDP_UNTAGGED_MSN_RANGE = (1, 2, 0x03, "DDP untagged buffer: invalid MSN - MSN range is not valid");
    /// Untagged buffer: invalid MO.
    DDP_UNTAGGED_INVALID_MO = (1, 2, 0x04, "DDP untagged buffer: invalid MO");
    /// Untagged buffer: message too long for the available buffer.
    DDP_UNTAGGED_TOO_LONG = (1, 2, 0x05, "DDP untagged buffer: DDP message too long for available buffer");
    /// Untagged buffer: invalid DDP version.
    DDP_UNTAGGED_INVALID_VERSION = (1, 2, 0x06, "DDP untagged buffer: invalid DDP version");
    /// MPA: TCP connection lost / closed.
    MPA_TCP_LOST = (2, 0, 0x01, "MPA: TCP stream lost");
    /// MPA: received CRC does not match.
    MPA_CRC = (2, 0, 0x02, "MPA: received MPA CRC does not match");
    /// MPA: marker and ULPDU length do not agree (FPDU start).
    MPA_MARKER = (2, 0, 0x03, "MPA: received marker and ULPDU length mismatch");
    /// MPA: invalid Request or Reply frame.
    MPA_INVALID_REQ_REP = (2, 0, 0x04, "MPA: invalid MPA Request or Reply frame");
    /// MPA: local catastrophic error (RFC 6581).
    MPA_LOCAL_CATASTROPHIC = (2, 0, 0x05, "MPA: local catastrophic error");
    /// MPA: insufficient IRD resources (RFC 6581).
    MPA_INSUFFICIENT_IRD = (2, 0, 0x06, "MPA: insufficient IRD resources");
    /// MPA: no matching RTR model (RFC 6581).
    MPA_NO_MATCHING_RTR = (2, 0, 0x07, "MPA: no matching RTR model");
}

impl TermCode {
    /// Whether the RFCs define this triple.
    pub const fn is_defined(&self) -> bool {
        self.description().is_some()
    }

    /// The layer as an enum, if it is one of the three defined.
    pub const fn layer(&self) -> Option<Layer> {
        match self.layer {
            0 => Some(Layer::Rdmap),
            1 => Some(Layer::Ddp),
            2 => Some(Layer::Llp),
            _ => None,
        }
    }
}

impl std::fmt::Display for TermCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.description() {
            Some(d) => write!(
                f,
                "{d} (layer {} etype {} ecode {:#04x})",
                self.layer, self.etype, self.ecode
            ),
            None => write!(
                f,
                "undefined terminate code (layer {} etype {} ecode {:#04x})",
                self.layer, self.etype, self.ecode
            ),
        }
    }
}

/// How the control word's bits are laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ControlLayout {
    /// RFC 5040: layer in the high nibble of byte 0, M/D/R = 0x80/0x40/0x20 of byte 2.
    Rfc,
    /// Linux siw on little-endian hosts: layer in the low nibble, M/D/R = 0x01/0x02/0x04.
    SiwLittleEndian,
}

/// The Terminate Control word.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TerminateControl {
    /// The error.
    pub code: TermCode,
    /// M: the DDP Segment Length field is valid.
    pub m: bool,
    /// D: the terminated DDP header is attached.
    pub d: bool,
    /// R: the terminated RDMAP header (Read Request body) is attached.
    pub r: bool,
}

impl TerminateControl {
    /// Encodes in `layout`.
    pub const fn to_bytes(&self, layout: ControlLayout) -> [u8; 4] {
        let c = self.code;
        match layout {
            ControlLayout::Rfc => [
                (c.layer << 4) | (c.etype & 0x0f),
                c.ecode,
                ((self.m as u8) << 7) | ((self.d as u8) << 6) | ((self.r as u8) << 5),
                0,
            ],
            ControlLayout::SiwLittleEndian => [
                (c.etype << 4) | (c.layer & 0x0f),
                c.ecode,
                (self.m as u8) | ((self.d as u8) << 1) | ((self.r as u8) << 2),
                0,
            ],
        }
    }

    /// Decodes in a known layout.
    pub const fn decode_as(b: [u8; 4], layout: ControlLayout) -> Self {
        match layout {
            ControlLayout::Rfc => Self {
                code: TermCode {
                    layer: b[0] >> 4,
                    etype: b[0] & 0x0f,
                    ecode: b[1],
                },
                m: b[2] & 0x80 != 0,
                d: b[2] & 0x40 != 0,
                r: b[2] & 0x20 != 0,
            },
            ControlLayout::SiwLittleEndian => Self {
                code: TermCode {
                    layer: b[0] & 0x0f,
                    etype: b[0] >> 4,
                    ecode: b[1],
                },
                m: b[2] & 0x01 != 0,
                d: b[2] & 0x02 != 0,
                r: b[2] & 0x04 != 0,
            },
        }
    }

    /// Decodes leniently: the layout under which the code is defined wins;
    /// when both are defined, the position of the M/D/R bits decides; when
    /// nothing decides, the RFC layout is assumed.
    pub const fn decode(b: [u8; 4]) -> (Self, ControlLayout) {
        Self::decode_preferring(b, ControlLayout::Rfc)
    }

    /// Like [`Self::decode`], but `prefer` settles the cases neither the
    /// codes nor the flag bits decide. Those exist: siw's RDMAP remote
    /// operation errors without attachments (`20 05`, `20 06`, `20 07`:
    /// bad version, unexpected opcode, catastrophic) read in the RFC layout
    /// as the MPA errors local catastrophic / insufficient IRD / no
    /// matching RTR. The MPA ones are only sent by an initiator at
    /// connection setup (as its first FPDU), so a receiver prefers the siw
    /// reading everywhere else.
    pub const fn decode_preferring(b: [u8; 4], prefer: ControlLayout) -> (Self, ControlLayout) {
        let rfc = Self::decode_as(b, ControlLayout::Rfc);
        let siw = Self::decode_as(b, ControlLayout::SiwLittleEndian);
        let layout = match (rfc.code.is_defined(), siw.code.is_defined()) {
            (false, true) => ControlLayout::SiwLittleEndian,
            (true, true) if b[2] & 0xe0 == 0 && b[2] & 0x07 != 0 => ControlLayout::SiwLittleEndian,
            (true, true) if b[2] & 0xe0 != 0 && b[2] & 0x07 == 0 => ControlLayout::Rfc,
            (true, true) if b[0] >> 4 != b[0] & 0x0f => prefer,
            _ => ControlLayout::Rfc,
        };
        match layout {
            ControlLayout::Rfc => (rfc, layout),
            ControlLayout::SiwLittleEndian => (siw, layout),
        }
    }
}

/// A Terminate message body (what follows the untagged DDP header).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Terminate<'a> {
    /// The control word.
    pub control: TerminateControl,
    /// DDP Segment Length of the terminated segment (when M is set).
    pub segment_len: Option<u16>,
    /// The terminated DDP header (when D is set; 14 or 18 bytes).
    pub ddp_header: &'a [u8],
    /// The terminated RDMAP header (when R is set; 28 bytes).
    pub rdmap_header: &'a [u8],
}

impl<'a> Terminate<'a> {
    /// Parses a Terminate body, detecting the control word's layout.
    ///
    /// Attached headers that are announced but cut short are returned as
    /// far as present (a Terminate is the last thing a peer says, so we
    /// decode what we can rather than fail).
    pub fn parse(body: &'a [u8]) -> Result<(Self, ControlLayout), WireError> {
        Self::parse_preferring(body, ControlLayout::Rfc)
    }

    /// Like [`Self::parse`], with the layout preference of
    /// [`TerminateControl::decode_preferring`].
    pub fn parse_preferring(
        body: &'a [u8],
        prefer: ControlLayout,
    ) -> Result<(Self, ControlLayout), WireError> {
        need(body, CONTROL_LEN)?;
        let control_bytes = [body[0], body[1], body[2], body[3]];
        let (control, layout) = TerminateControl::decode_preferring(control_bytes, prefer);
        let mut rest = &body[CONTROL_LEN..];
        let mut segment_len = None;
        if control.m && rest.len() >= 2 {
            segment_len = Some(be16(rest, 0));
            rest = &rest[2..];
        }
        let mut ddp_header: &[u8] = &[];
        if control.d && !rest.is_empty() {
            let want = if rest[0] & crate::ddp::DDP_TAGGED != 0 {
                crate::ddp::TAGGED_HDR_LEN
            } else {
                crate::ddp::UNTAGGED_HDR_LEN
            };
            let take = want.min(rest.len());
            ddp_header = &rest[..take];
            rest = &rest[take..];
        }
        let rdmap_header = if control.r {
            &rest[..crate::ddp::READ_REQUEST_LEN.min(rest.len())]
        } else {
            &[]
        };
        Ok((
            Self {
                control,
                segment_len,
                ddp_header,
                rdmap_header,
            },
            layout,
        ))
    }

    /// Appends the body in RFC layout. The M flag is taken from
    /// `segment_len.is_some()`, D and R from the attached headers.
    pub fn emit(&self, out: &mut Vec<u8>) {
        let control = TerminateControl {
            m: self.segment_len.is_some(),
            d: !self.ddp_header.is_empty(),
            r: !self.rdmap_header.is_empty(),
            ..self.control
        };
        out.extend_from_slice(&control.to_bytes(ControlLayout::Rfc));
        if let Some(len) = self.segment_len {
            out.extend_from_slice(&len.to_be_bytes());
        }
        out.extend_from_slice(self.ddp_header);
        out.extend_from_slice(self.rdmap_header);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_is_consistent() {
        for c in TermCode::ALL {
            assert!(c.is_defined(), "{c:?}");
            assert!(c.layer().is_some());
            let ctl = TerminateControl {
                code: *c,
                m: true,
                d: true,
                r: false,
            };
            for layout in [ControlLayout::Rfc, ControlLayout::SiwLittleEndian] {
                assert_eq!(
                    TerminateControl::decode_as(ctl.to_bytes(layout), layout),
                    ctl
                );
            }
            // With M/D set the flag position always disambiguates.
            assert_eq!(
                TerminateControl::decode(ctl.to_bytes(ControlLayout::Rfc)).0,
                ctl
            );
            assert_eq!(
                TerminateControl::decode(ctl.to_bytes(ControlLayout::SiwLittleEndian)).0,
                ctl
            );
        }
        assert!(!TermCode {
            layer: 3,
            etype: 0,
            ecode: 0
        }
        .is_defined());
    }

    /// siw's Terminate for a bad CRC, as captured: `02020000` =
    /// LLP / MPA / CRC in siw's layout.
    #[test]
    fn decode_siw_crc_terminate() {
        let (t, layout) = Terminate::parse(&[0x02, 0x02, 0x00, 0x00]).unwrap();
        assert_eq!(layout, ControlLayout::SiwLittleEndian);
        assert_eq!(t.control.code, TermCode::MPA_CRC);
        assert!(!t.control.m && !t.control.d && !t.control.r);
    }

    /// siw's unexpected-opcode and bad-version Terminates, as captured
    /// against a real siw: ambiguous without context.
    #[test]
    fn siw_remote_operation_terminates_need_context() {
        for (b1, code) in [
            (0x06, TermCode::RDMAP_UNEXPECTED_OPCODE),
            (0x05, TermCode::RDMAP_INVALID_VERSION),
            (0x07, TermCode::RDMAP_CATASTROPHIC_STREAM),
        ] {
            let b = [0x20, b1, 0, 0];
            let (t, _) = Terminate::parse_preferring(&b, ControlLayout::SiwLittleEndian).unwrap();
            assert_eq!(t.control.code, code);
            // At setup the same bytes are the RFC 6581 MPA errors.
            let (t, _) = Terminate::parse(&b).unwrap();
            assert_eq!(t.control.code.layer, 2);
        }
        // Symmetric bytes read the same either way.
        let (t, _) =
            Terminate::parse_preferring(&[0x11, 0x00, 0, 0], ControlLayout::SiwLittleEndian)
                .unwrap();
        assert_eq!(t.control.code, TermCode::DDP_TAGGED_INVALID_STAG);
        // siw's Send-too-long with its header attached (flags in the low bits).
        let (t, l) = Terminate::parse(&[0x21, 0x02, 0x03, 0x00, 0x00, 0x10]).unwrap();
        assert_eq!(
            (t.control.code, l),
            (
                TermCode::DDP_UNTAGGED_NO_BUFFER,
                ControlLayout::SiwLittleEndian
            )
        );
    }

    #[test]
    fn rfc_layout_bytes_and_attached_headers() {
        let hdr = [0x41, 0x43, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0];
        let t = Terminate {
            control: TerminateControl {
                code: TermCode::DDP_UNTAGGED_NO_BUFFER,
                m: false,
                d: false,
                r: false,
            },
            segment_len: Some(0x22),
            ddp_header: &hdr,
            rdmap_header: &[],
        };
        let mut out = Vec::new();
        t.emit(&mut out);
        assert_eq!(&out[..6], &[0x12, 0x02, 0xc0, 0x00, 0x00, 0x22]);
        assert_eq!(&out[6..], &hdr);
        let (p, layout) = Terminate::parse(&out).unwrap();
        assert_eq!(layout, ControlLayout::Rfc);
        assert_eq!(p.segment_len, Some(0x22));
        assert_eq!(p.ddp_header, &hdr);
        assert!(p.rdmap_header.is_empty());
        assert!(p.control.m && p.control.d && !p.control.r);
    }

    #[test]
    fn tagged_header_and_rdmap_header() {
        let tagged = [0xc1, 0x40, 0, 0, 0x12, 0x01, 0, 0, 0, 0, 0, 0, 0x10, 0];
        let rr = [7u8; 28];
        let t = Terminate {
            control: TerminateControl {
                code: TermCode::RDMAP_ACCESS,
                m: true,
                d: true,
                r: true,
            },
            segment_len: Some(100),
            ddp_header: &tagged,
            rdmap_header: &rr,
        };
        let mut out = Vec::new();
        t.emit(&mut out);
        assert_eq!(&out[..4], &[0x01, 0x02, 0xe0, 0x00]);
        let (p, _) = Terminate::parse(&out).unwrap();
        assert_eq!(p.ddp_header, &tagged);
        assert_eq!(p.rdmap_header, &rr);
        // Cut short: decode what is there.
        let (p, _) = Terminate::parse(&out[..12]).unwrap();
        assert_eq!(p.ddp_header.len(), 6);
        assert!(Terminate::parse(&out[..3]).is_err());
    }
}
