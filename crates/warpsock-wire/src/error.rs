//! Parse errors shared by every wire type.

use std::fmt;

/// Why a byte sequence is not a valid iWARP message.
///
/// Each variant is precise enough for the protocol core to pick the right
/// Terminate (RFC 5040 §7) without looking at the bytes again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum WireError {
    /// The buffer ends before the structure does.
    Truncated {
        /// Bytes the structure needs.
        needed: usize,
        /// Bytes that were available.
        available: usize,
    },
    /// The first 16 bytes are not the expected MPA key.
    BadMpaKey,
    /// MPA revision other than 0, 1 or 2.
    BadMpaRevision(u8),
    /// MPA private data longer than RFC 5044's 512-byte limit.
    PrivateDataTooLong(usize),
    /// Enhanced (RFC 6581) frame whose private data cannot hold IRD/ORD.
    MissingEnhancedParams,
    /// DDP version field (DV) other than 1.
    BadDdpVersion {
        /// Whether the segment was tagged (selects the Terminate etype).
        tagged: bool,
        /// The version found.
        version: u8,
    },
    /// RDMAP version field (RV) other than 1.
    BadRdmapVersion(u8),
    /// RDMAP opcode that RFC 5040 does not define (8–15).
    UnknownOpcode(u8),
    /// A defined opcode carried with the wrong DDP model (e.g. a tagged Send).
    OpcodeModelMismatch {
        /// The opcode.
        opcode: u8,
        /// The T bit found.
        tagged: bool,
    },
}

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::Truncated { needed, available } => {
                write!(f, "truncated: need {needed} bytes, have {available}")
            }
            Self::BadMpaKey => f.write_str("bad MPA key"),
            Self::BadMpaRevision(r) => write!(f, "unsupported MPA revision {r} (allowed 0..=2)"),
            Self::PrivateDataTooLong(n) => {
                write!(
                    f,
                    "MPA private data of {n} bytes exceeds the 512-byte limit"
                )
            }
            Self::MissingEnhancedParams => {
                f.write_str("enhanced MPA frame without the 4-byte IRD/ORD word")
            }
            Self::BadDdpVersion { tagged, version } => write!(
                f,
                "DDP version {version} in {} segment (expected 1)",
                if tagged { "tagged" } else { "untagged" }
            ),
            Self::BadRdmapVersion(v) => write!(f, "RDMAP version {v} (expected 1)"),
            Self::UnknownOpcode(o) => write!(f, "unknown RDMAP opcode {o}"),
            Self::OpcodeModelMismatch { opcode, tagged } => write!(
                f,
                "RDMAP opcode {opcode} carried in a {} DDP segment",
                if tagged { "tagged" } else { "untagged" }
            ),
        }
    }
}

impl std::error::Error for WireError {}

/// Returns `Err(Truncated)` unless `buf` holds at least `needed` bytes.
pub(crate) fn need(buf: &[u8], needed: usize) -> Result<(), WireError> {
    if buf.len() < needed {
        Err(WireError::Truncated {
            needed,
            available: buf.len(),
        })
    } else {
        Ok(())
    }
}

/// Reads a big-endian u16 at `at` (caller checked bounds).
pub(crate) fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

/// Reads a big-endian u32 at `at` (caller checked bounds). One slice
/// bounds check instead of one per byte, and inlined: header parsing
/// calls it four times per FPDU.
#[inline]
pub(crate) fn be32(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_be_bytes(a)
}

/// Reads a big-endian u64 at `at` (caller checked bounds).
#[inline]
pub(crate) fn be64(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_be_bytes(a)
}
