//! CRC32c of short pieces with the SSE4.2 `crc32` instruction, one stream,
//! eight bytes per step.
//!
//! An FPDU of a small message (an 8-byte Send is a 44-byte FPDU) is
//! checksummed in one piece on each side. The `crc32c` crate's kernel
//! splits every piece into three interleaved streams and recombines them,
//! about 150 instructions of set-up and tail for such a piece; this loop
//! takes six `crc32` steps and a few loads (BENCHMARKS.md §6, session 12).
//! Pieces of [`SHORT_MAX`] bytes and more go to the three streams, which
//! run faster once there are enough bytes to overlap.

use std::arch::x86_64::{_mm_crc32_u32, _mm_crc32_u64, _mm_crc32_u8};

/// Pieces shorter than this take the one-stream loop.
pub(super) const SHORT_MAX: usize = 128;

/// Whether the CPU has the `crc32` instruction (SSE4.2); `std` caches the
/// answer, so this is a load and a test.
#[inline]
pub(super) fn available() -> bool {
    std::is_x86_feature_detected!("sse4.2")
}

/// The CRC32c `crc` continued over `data`.
///
/// # Safety
///
/// The CPU must have SSE4.2 ([`available`]).
#[target_feature(enable = "sse4.2")]
pub(super) unsafe fn update(crc: u32, data: &[u8]) -> u32 {
    let mut words = data.chunks_exact(8);
    let mut reg = u64::from(!crc);
    for w in &mut words {
        reg = _mm_crc32_u64(reg, u64::from_le_bytes(w.try_into().expect("8 bytes")));
    }
    let mut reg = reg as u32;
    let mut rest = words.remainder();
    if rest.len() >= 4 {
        reg = _mm_crc32_u32(reg, u32::from_le_bytes(rest[..4].try_into().expect("4")));
        rest = &rest[4..];
    }
    for &b in rest {
        reg = _mm_crc32_u8(reg, b);
    }
    !reg
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Against the `crc32c` crate: every length below [`SHORT_MAX`] and a
    /// little past it, at every alignment of an 8-byte word, from a zero
    /// and a non-zero running value.
    #[test]
    fn matches_the_three_stream_kernel() {
        if !available() {
            eprintln!("no SSE4.2 on this CPU: kernel not exercised");
            return;
        }
        // SAFETY: `available()` said the CPU has SSE4.2.
        super::super::tests::matches_the_crate(
            |crc, piece| unsafe { update(crc, piece) },
            8,
            0..SHORT_MAX + 40,
        );
    }
}
