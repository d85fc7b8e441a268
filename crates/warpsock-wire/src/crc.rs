//! CRC32c (Castagnoli) as MPA uses it (RFC 5044 §4.4, RFC 3385).
//!
//! The checksum is the standard CRC32c (reflected, init `0xFFFF_FFFF`, final
//! xor) over the 2-byte ULPDU length, the ULPDU and the pad. On the wire the
//! four trailer bytes are the **little-endian** bytes of that value
//! ([`trailer`]): that is what Linux siw computes (`put_unaligned_le32`) and
//! what Wireshark reports as "Good CRC32" (`siw-compat.md` §1.5, verified).
//!
//! The `crc-fast` crate picks the fastest kernel the CPU has at run time
//! (VPCLMULQDQ/AVX-512 folding, PCLMULQDQ, or the SSE4.2 `crc32`
//! instruction); on this project's EPYC machines it runs at about 55 GB/s
//! for 64 KiB, 2.5x the plain `crc32` instruction loop.

use crc_fast::{CrcAlgorithm, Digest};

/// CRC32c of `data`. `crc32c(b"123456789") == 0xE306_9283`.
#[inline]
pub fn crc32c(data: &[u8]) -> u32 {
    // CRC-32/ISCSI is CRC32c; the result fits 32 bits.
    crc_fast::checksum(CrcAlgorithm::Crc32Iscsi, data) as u32
}

/// Running CRC32c over data that arrives in pieces (e.g. placed payload).
///
/// `Crc32c::new().update(a).update(b).value() == crc32c(a ++ b)`.
#[derive(Clone)]
pub struct Crc32c(Digest);

impl std::fmt::Debug for Crc32c {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Crc32c({:#010x})", self.value())
    }
}

impl Default for Crc32c {
    fn default() -> Self {
        Self::new()
    }
}

impl Crc32c {
    /// A CRC over no bytes yet.
    pub fn new() -> Self {
        Self(Digest::new(CrcAlgorithm::Crc32Iscsi))
    }

    /// Starts over, as if new: much cheaper than [`Self::new`], which
    /// copies the algorithm's parameter table (done once per FPDU).
    #[inline]
    pub fn reset(&mut self) {
        self.0.reset();
    }

    /// Extends the CRC over `data`.
    #[inline]
    pub fn update(&mut self, data: &[u8]) -> &mut Self {
        self.0.update(data);
        self
    }

    /// The CRC of everything seen so far.
    pub fn value(&self) -> u32 {
        self.0.finalize() as u32
    }

    /// The trailer bytes for everything seen so far.
    pub fn trailer(&self) -> [u8; 4] {
        trailer(self.value())
    }
}

/// The four trailer bytes that carry `crc` on the wire (little endian).
#[inline]
pub const fn trailer(crc: u32) -> [u8; 4] {
    crc.to_le_bytes()
}

/// The CRC value carried by four trailer bytes.
#[inline]
pub const fn from_trailer(bytes: [u8; 4]) -> u32 {
    u32::from_le_bytes(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_value() {
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
        assert_eq!(trailer(0xE306_9283), [0x83, 0x92, 0x06, 0xE3]);
        assert_eq!(from_trailer([0x83, 0x92, 0x06, 0xE3]), 0xE306_9283);
    }

    /// RFC 3720 Appendix B.4 test vectors.
    #[test]
    fn rfc3720_vectors() {
        assert_eq!(crc32c(&[0u8; 32]), 0x8A91_36AA);
        assert_eq!(crc32c(&[0xffu8; 32]), 0x62A8_AB43);
        let inc: Vec<u8> = (0u8..32).collect();
        assert_eq!(crc32c(&inc), 0x46DD_794E);
        let dec: Vec<u8> = (0u8..32).rev().collect();
        assert_eq!(crc32c(&dec), 0x113F_DB5C);
        // iSCSI SCSI Read (10) command PDU.
        let mut pdu = [0u8; 48];
        for (at, byte) in [(0, 0x01), (1, 0xc0), (16, 0x14), (22, 0x04), (27, 0x14)] {
            pdu[at] = byte;
        }
        for (at, byte) in [(31, 0x18), (32, 0x28), (40, 0x02)] {
            pdu[at] = byte;
        }
        assert_eq!(crc32c(&pdu), 0xD9963A56);
    }

    #[test]
    fn incremental_equals_oneshot() {
        let data: Vec<u8> = (0..10_000u32).map(|i| (i * 7 + 3) as u8).collect();
        for cut in [0, 1, 3, 4, 511, 4096, 9999, 10_000] {
            let mut c = Crc32c::new();
            c.update(&data[..cut]).update(&data[cut..]);
            assert_eq!(c.value(), crc32c(&data));
        }
    }

    #[test]
    fn reset_starts_over() {
        let mut c = Crc32c::new();
        c.update(b"earlier FPDU");
        c.reset();
        c.update(b"123456789");
        assert_eq!(c.value(), 0xE306_9283);
    }
}
