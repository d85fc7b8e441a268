//! MPA markers (RFC 5044 §4.3, §5; `docs/protocol-notes.md` §1).
//!
//! When a receiver asks for markers (M bit in its Request/Reply), the
//! sender inserts a 4-byte marker every 512 octets of its TCP stream,
//! counted from the first octet after its own MPA Request/Reply, so a
//! marker always precedes the first FPDU:
//!
//! ```text
//! +-------------------+-------------------+
//! | reserved (be16=0) | FPDUPTR (be16)    |
//! +-------------------+-------------------+
//! ```
//!
//! FPDUPTR is the distance back from the marker to the ULPDU Length field
//! of the FPDU the marker sits in; a marker that starts an FPDU has
//! FPDUPTR 0. Markers are not counted in the ULPDU Length and do not change
//! the pad, but the CRC covers them. Each direction has its own positions.
//! Linux siw never negotiates markers.
//!
//! The protocol core inserts and removes markers while it frames and
//! parses FPDUs; this module holds the format.

/// Marker size.
pub const MARKER_LEN: usize = 4;
/// Distance between markers in the TCP stream.
pub const MARKER_SPACING: u64 = 512;

/// A marker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Marker {
    /// Octets back to the ULPDU Length field of the enclosing FPDU.
    pub fpduptr: u16,
}

impl Marker {
    /// The 4 bytes on the wire.
    pub const fn to_bytes(self) -> [u8; MARKER_LEN] {
        let [a, b] = self.fpduptr.to_be_bytes();
        [0, 0, a, b]
    }

    /// Decodes 4 bytes (the reserved half is ignored, as RFC 5044 says).
    pub const fn from_bytes(b: [u8; MARKER_LEN]) -> Self {
        Self {
            fpduptr: u16::from_be_bytes([b[2], b[3]]),
        }
    }
}

/// Whether a marker starts at stream offset `pos` (counted from the first
/// octet after this direction's MPA frame).
pub const fn is_marker_position(pos: u64) -> bool {
    pos.is_multiple_of(MARKER_SPACING)
}

/// Octets from `pos` to the next marker position (512 at a marker position).
pub const fn until_next_marker(pos: u64) -> u64 {
    MARKER_SPACING - pos % MARKER_SPACING
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encode_decode() {
        let m = Marker { fpduptr: 508 };
        assert_eq!(m.to_bytes(), [0, 0, 0x01, 0xfc]);
        assert_eq!(Marker::from_bytes([0xff, 0xff, 0x01, 0xfc]), m);
        assert!(is_marker_position(0) && is_marker_position(1024));
        assert!(!is_marker_position(4));
        assert_eq!(until_next_marker(0), 512);
        assert_eq!(until_next_marker(616), 408);
    }
}
