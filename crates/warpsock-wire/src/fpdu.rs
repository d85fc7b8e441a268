//! FPDU framing (RFC 5044 §4.2, §4.4).
//!
//! ```text
//! +--------------+------------------+---------+-----------------+
//! | ULPDU length | ULPDU            | pad 0-3 | CRC32c (4)      |
//! | be16         | DDP hdr + payload| zeros   | little-endian   |
//! +--------------+------------------+---------+-----------------+
//! ```
//!
//! The pad brings `2 + ULPDU` to a multiple of four. The CRC covers the
//! length field, the ULPDU and the pad; without negotiated CRC the field is
//! four zero bytes (siw `siw_tx_hdt`) and receivers ignore it.
//!
//! Markers (when negotiated) are inserted into and removed from the byte
//! stream by [`crate::marker`], outside this framing.

use crate::crc::{self, Crc32c};

/// Bytes of the ULPDU length field.
pub const LEN_FIELD: usize = 2;
/// Bytes of the CRC trailer.
pub const CRC_LEN: usize = 4;
/// Largest ULPDU the 16-bit length field can describe.
pub const MAX_ULPDU_LEN: usize = 0xffff;
/// Framing overhead of an FPDU without pad.
pub const OVERHEAD: usize = LEN_FIELD + CRC_LEN;

/// Pad bytes after a ULPDU of `ulpdu_len` bytes.
#[inline]
pub const fn pad_len(ulpdu_len: usize) -> usize {
    (4 - ((LEN_FIELD + ulpdu_len) & 3)) & 3
}

/// Total FPDU length (length field, ULPDU, pad, CRC) for a ULPDU.
#[inline]
pub const fn fpdu_len(ulpdu_len: usize) -> usize {
    LEN_FIELD + ulpdu_len + pad_len(ulpdu_len) + CRC_LEN
}

/// The largest ULPDU that keeps an FPDU within one TCP segment of `mss`
/// bytes, as siw sizes them (`siw_update_tcpseg`: segment length rounded
/// down to a multiple of 8, FPDU fills it exactly, no pad).
///
/// ```
/// // MSS 1448 (MTU 1500 with timestamps): 1442-byte ULPDUs, so a Write
/// // carries 1428 payload bytes and a Send 1424, exactly like siw.
/// assert_eq!(warpsock_wire::fpdu::mulpdu_for_mss(1448), 1442);
/// ```
pub const fn mulpdu_for_mss(mss: usize) -> usize {
    // The largest 8-aligned FPDU the 16-bit length allows is 65536 bytes.
    let seg = if mss > 65536 { 65536 } else { mss & !7 };
    seg.saturating_sub(OVERHEAD)
}

/// The ULPDU length field for `ulpdu_len` (≤ [`MAX_ULPDU_LEN`]).
#[inline]
pub const fn len_field(ulpdu_len: usize) -> [u8; 2] {
    (ulpdu_len as u16).to_be_bytes()
}

/// Once two bytes are available: `(ULPDU length, total FPDU length)`.
#[inline]
pub fn peek_len(buf: &[u8]) -> Option<(usize, usize)> {
    if buf.len() < LEN_FIELD {
        return None;
    }
    let ulpdu = usize::from(u16::from_be_bytes([buf[0], buf[1]]));
    Some((ulpdu, fpdu_len(ulpdu)))
}

/// Appends one FPDU whose ULPDU is the concatenation of `parts`.
/// With `crc` false the trailer is four zero bytes.
pub fn emit(parts: &[&[u8]], crc: bool, out: &mut Vec<u8>) {
    let ulpdu_len: usize = parts.iter().map(|p| p.len()).sum();
    debug_assert!(ulpdu_len <= MAX_ULPDU_LEN);
    let start = out.len();
    out.extend_from_slice(&len_field(ulpdu_len));
    for p in parts {
        out.extend_from_slice(p);
    }
    out.extend_from_slice(&[0u8; 3][..pad_len(ulpdu_len)]);
    let trailer = if crc {
        crc::trailer(crc::crc32c(&out[start..]))
    } else {
        [0; 4]
    };
    out.extend_from_slice(&trailer);
}

/// CRC trailer for an FPDU given as length field, ULPDU pieces and pad,
/// without copying them together (the gather-send path).
pub fn trailer_for(parts: &[&[u8]]) -> [u8; 4] {
    let ulpdu_len: usize = parts.iter().map(|p| p.len()).sum();
    let mut c = Crc32c::new();
    c.update(&len_field(ulpdu_len));
    for p in parts {
        c.update(p);
    }
    c.update(&[0u8; 3][..pad_len(ulpdu_len)]);
    c.trailer()
}

/// Whether a complete FPDU (trailer included) carries a correct CRC.
pub fn check_crc(fpdu: &[u8]) -> bool {
    if fpdu.len() < OVERHEAD {
        return false;
    }
    let (body, tail) = fpdu.split_at(fpdu.len() - CRC_LEN);
    crc::trailer(crc::crc32c(body)) == [tail[0], tail[1], tail[2], tail[3]]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pad_and_lengths() {
        assert_eq!(pad_len(0), 2);
        assert_eq!(pad_len(1), 1);
        assert_eq!(pad_len(2), 0);
        assert_eq!(pad_len(34), 0);
        assert_eq!(pad_len(46), 0);
        assert_eq!(pad_len(22), 0);
        assert_eq!(pad_len(23), 3);
        assert_eq!(fpdu_len(34), 40);
        assert_eq!(fpdu_len(0), 8);
        assert_eq!(peek_len(&[0x00, 0x22]), Some((34, 40)));
        assert_eq!(peek_len(&[0x00]), None);
        assert_eq!(mulpdu_for_mss(1448), 1442);
        assert_eq!(mulpdu_for_mss(1460), 1450);
        assert!(fpdu_len(mulpdu_for_mss(65483)) <= 65483);
        let big = mulpdu_for_mss(1 << 20);
        assert!(
            big <= MAX_ULPDU_LEN && fpdu_len(big).is_multiple_of(8),
            "{big}"
        );
    }

    /// siw-compat.md appendix: rping's start message as an RDMAP Send,
    /// accepted by siw with CRC off (zero trailer) and on.
    #[test]
    fn rping_send_golden_frame() {
        let ddp = [0x41, 0x43, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0];
        let payload = [0, 0, 0, 0, 0, 0, 0x10, 0, 0, 0, 0x12, 0x34, 0, 0, 0, 0x40];
        let mut off = Vec::new();
        emit(&[&ddp, &payload], false, &mut off);
        assert_eq!(off.len(), 40);
        assert_eq!(&off[..2], &[0x00, 0x22]);
        assert_eq!(&off[36..], &[0, 0, 0, 0]);
        let mut on = Vec::new();
        emit(&[&ddp, &payload], true, &mut on);
        assert!(check_crc(&on));
        assert_eq!(&on[36..], &trailer_for(&[&ddp, &payload]));
        assert!(!check_crc(&off));
    }

    /// siw's Read Request as captured, with its CRC `8a3521bb`.
    #[test]
    fn siw_read_request_crc() {
        let frame: Vec<u8> = [
            "002e4141000000000000000100000001",
            "000000004a0f040000007f71ac000e00",
            "00000040000012340000000000001000",
            "8a3521bb",
        ]
        .concat()
        .as_bytes()
        .chunks(2)
        .map(|h| u8::from_str_radix(std::str::from_utf8(h).unwrap(), 16).unwrap())
        .collect();
        assert_eq!(frame.len(), fpdu_len(46));
        assert!(check_crc(&frame));
        let mut bad = frame.clone();
        bad[20] ^= 1;
        assert!(!check_crc(&bad));
    }
}
