//! CRC32c by carry-less multiplication folding, 256 bits per register
//! (VPCLMULQDQ on AVX2 registers), for x86-64 CPUs that have it (AMD Zen 3
//! and later, Intel Ice Lake and later).
//!
//! The method is the one of Intel's "Fast CRC Computation for Generic
//! Polynomials Using PCLMULQDQ" (Gopal et al., 2009), in its bit-reflected
//! form: eight 128-bit lanes (four 256-bit registers) each hold a running
//! remainder; every round multiplies each lane's two halves by
//! x^(D+32) mod P and x^(D-32) mod P (D = the distance folded, 1,024 bits)
//! and adds the data D bits further on. At the end the lanes fold into
//! one 128-bit value congruent to the message modulo P, and the SSE4.2
//! `crc32` instruction reduces those 16 bytes (from a zero register: it
//! computes (0·x^128 + X·x^32) mod P, the register after the message).
//! Bytes after the last whole 32-byte block go through `crc32` as well.
//!
//! Why not `crc-fast`: it uses VPCLMULQDQ only together with AVX-512, and
//! falls back to 128-bit folding (about 18 GB/s here, below the plain
//! `crc32` loop's 23 GB/s) on CPUs with VPCLMULQDQ and AVX2 but no AVX-512,
//! the machines this project runs on.

use std::arch::asm;
use std::arch::x86_64::{
    __m128i, __m256i, _mm256_castsi256_si128, _mm256_extracti128_si256, _mm256_loadu_si256,
    _mm256_set_epi64x, _mm256_xor_si256, _mm_clmulepi64_si128, _mm_crc32_u64, _mm_cvtsi128_si64,
    _mm_extract_epi64, _mm_set_epi64x, _mm_xor_si128,
};

/// CRC32c's generator polynomial (Castagnoli), x^32 implied, normal order.
const POLY: u32 = 0x1EDC_6F41;

/// x^n mod P, bit-reflected and shifted left by one: the 33-bit operand
/// a reflected carry-less multiplication wants (the product of two
/// reflected operands comes out one bit short of the reflected width).
const fn xpow_mod(poly: u32, n: u32) -> u64 {
    let mut v: u32 = 1;
    let mut i = 0;
    while i < n {
        let carry = v & 0x8000_0000 != 0;
        v <<= 1;
        if carry {
            v ^= poly;
        }
        i += 1;
    }
    (v.reverse_bits() as u64) << 1
}

/// The two constants that fold a 128-bit lane `d` bits forward: for its
/// low (earlier, higher-degree) half and for its high half.
const fn fold_pair(poly: u32, d: u32) -> (u64, u64) {
    (xpow_mod(poly, d + 32), xpow_mod(poly, d - 32))
}

const K1024: (u64, u64) = fold_pair(POLY, 1024);
const K256: (u64, u64) = fold_pair(POLY, 256);
const K128: (u64, u64) = fold_pair(POLY, 128);

/// Bytes one round folds (four 256-bit registers).
const ROUND: usize = 128;

/// The shortest input [`update`] takes: one round's worth.
pub(super) const MIN_LEN: usize = ROUND;

/// Whether this CPU has what [`update`] needs (checked at run time; the
/// standard library caches the answer).
#[inline]
pub(super) fn available() -> bool {
    std::is_x86_feature_detected!("vpclmulqdq")
        && std::is_x86_feature_detected!("avx2")
        && std::is_x86_feature_detected!("pclmulqdq")
        && std::is_x86_feature_detected!("sse4.2")
}

/// Both 128-bit lanes of a register hold the same constant pair.
#[inline]
#[target_feature(enable = "avx2")]
fn splat(k: (u64, u64)) -> __m256i {
    _mm256_set_epi64x(k.1 as i64, k.0 as i64, k.1 as i64, k.0 as i64)
}

/// Folds each 128-bit lane of `acc` forward by the distance `k` was made
/// for, onto `next`.
///
/// The two multiplies are written in assembly because their intrinsic
/// (`_mm256_clmulepi64_epi128`) is stable only from Rust 1.89, above the
/// workspace's `rust-version`.
#[inline]
#[target_feature(enable = "avx2,vpclmulqdq")]
fn fold256(acc: __m256i, k: __m256i, next: __m256i) -> __m256i {
    let lo: __m256i;
    let hi: __m256i;
    // SAFETY: register-only instructions (no memory, no stack, no flags);
    // the CPU has VPCLMULQDQ and AVX2 (this function's target features,
    // which its callers checked).
    unsafe {
        asm!(
            "vpclmulqdq {lo}, {acc}, {k}, 0x00",
            "vpclmulqdq {hi}, {acc}, {k}, 0x11",
            acc = in(ymm_reg) acc,
            k = in(ymm_reg) k,
            lo = out(ymm_reg) lo,
            hi = out(ymm_reg) hi,
            options(pure, nomem, nostack, preserves_flags),
        );
    }
    _mm256_xor_si256(_mm256_xor_si256(lo, hi), next)
}

/// Reads 32 bytes at `at`.
#[inline]
#[target_feature(enable = "avx2")]
fn load(data: &[u8], at: usize) -> __m256i {
    let block = &data[at..at + 32];
    // SAFETY: `block` is 32 readable bytes; the load is unaligned.
    unsafe { _mm256_loadu_si256(block.as_ptr().cast::<__m256i>()) }
}

/// The CRC32c of everything before `data` (`crc`, 0 for nothing) continued
/// over `data`, which is at least [`MIN_LEN`] bytes long.
///
/// # Safety
///
/// The CPU must have what [`available`] checks for.
#[target_feature(enable = "avx2,vpclmulqdq,pclmulqdq,sse4.2")]
pub(super) unsafe fn update(crc: u32, data: &[u8]) -> u32 {
    assert!(data.len() >= MIN_LEN);
    // The register before the data (!crc) enters as the first 32 bits of
    // the message (RFC 3385's init, applied by addition).
    let init = _mm256_set_epi64x(0, 0, 0, i64::from(!crc));
    let mut x0 = _mm256_xor_si256(load(data, 0), init);
    let mut x1 = load(data, 32);
    let mut x2 = load(data, 64);
    let mut x3 = load(data, 96);
    let k = splat(K1024);
    let mut at = ROUND;
    while data.len() - at >= ROUND {
        x0 = fold256(x0, k, load(data, at));
        x1 = fold256(x1, k, load(data, at + 32));
        x2 = fold256(x2, k, load(data, at + 64));
        x3 = fold256(x3, k, load(data, at + 96));
        at += ROUND;
    }
    // Four registers into one (each 256 bits before the next), then the
    // remaining whole 32-byte blocks.
    let k = splat(K256);
    x1 = fold256(x0, k, x1);
    x2 = fold256(x1, k, x2);
    let mut x = fold256(x2, k, x3);
    while data.len() - at >= 32 {
        x = fold256(x, k, load(data, at));
        at += 32;
    }
    // Its two lanes into one.
    let lo: __m128i = _mm256_castsi256_si128(x);
    let hi: __m128i = _mm256_extracti128_si256(x, 1);
    let k = _mm_set_epi64x(K128.1 as i64, K128.0 as i64);
    let x = _mm_xor_si128(
        _mm_xor_si128(
            _mm_clmulepi64_si128(lo, k, 0x00),
            _mm_clmulepi64_si128(lo, k, 0x11),
        ),
        hi,
    );
    let reg = _mm_crc32_u64(0, _mm_cvtsi128_si64(x) as u64);
    let reg = _mm_crc32_u64(reg, _mm_extract_epi64(x, 1) as u64) as u32;
    crc32c::crc32c_append(!reg, &data[at..])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The constant generator reproduces zlib's published CRC-32 (IEEE)
    /// folding constants for a 512-bit distance (`k1k2` of zlib's
    /// `crc32_simd.c`), so the exponents and the reflection are right.
    #[test]
    fn constants_match_zlibs_for_crc32() {
        assert_eq!(fold_pair(0x04C1_1DB7, 512), (0x1_5444_2bd4, 0x1_c6e4_1596));
    }

    /// Against the `crc32c` crate, every length from the shortest to a
    /// few rounds past it, at every alignment of a 32-byte block, from a
    /// zero and a non-zero running value.
    #[test]
    fn matches_the_crc32_instruction_loop() {
        if !available() {
            eprintln!("no VPCLMULQDQ/AVX2 on this CPU: kernel not exercised");
            return;
        }
        let lens = (MIN_LEN..700).chain([1_000, 1_500, 1_968]);
        // SAFETY: `available()` said the CPU has the features.
        super::super::tests::matches_the_crate(
            |crc, piece| unsafe { update(crc, piece) },
            32,
            lens,
        );
    }
}
