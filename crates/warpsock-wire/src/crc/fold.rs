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
//! the machines this project first ran on.
//!
//! Where the CPU has AVX-512 as well (AMD Zen 4 and later, Intel Ice Lake
//! and later), [`update_wide`] folds 512 bits per register: four ZMM
//! registers, 256 bytes a round. On an AMD Zen 5 (EPYC, family 26) the
//! 256-bit kernel is bound by the multiplies' throughput, not their
//! latency (eight registers instead of four: 33 GB/s either way), and the
//! 512-bit multiply issues at the same rate, so the wide kernel moves
//! twice the bytes: 64–66 GB/s against 33 over a 64 KiB buffer
//! (`cargo run --release -p warpsock-wire --example crc_rate`). With CRC
//! on (the default) every byte a DDP socket moves is checked once on each
//! side; on a 10 Gbit/s `iperf3` receiver the 256-bit kernel was 16 % of
//! the process's CPU samples.

use std::arch::x86_64::{
    __m128i, __m256i, __m512i, _mm256_castsi256_si128, _mm256_clmulepi64_epi128,
    _mm256_extracti128_si256, _mm256_loadu_si256, _mm256_set_epi64x, _mm256_xor_si256,
    _mm512_castsi512_si256, _mm512_clmulepi64_epi128, _mm512_extracti64x4_epi64,
    _mm512_loadu_si512, _mm512_set_epi64, _mm512_xor_si512, _mm_clmulepi64_si128, _mm_crc32_u64,
    _mm_cvtsi128_si64, _mm_extract_epi64, _mm_set_epi64x, _mm_xor_si128,
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

const K2048: (u64, u64) = fold_pair(POLY, 2048);
const K1024: (u64, u64) = fold_pair(POLY, 1024);
const K512: (u64, u64) = fold_pair(POLY, 512);
const K256: (u64, u64) = fold_pair(POLY, 256);
const K128: (u64, u64) = fold_pair(POLY, 128);

/// Bytes one round folds (four 256-bit registers).
const ROUND: usize = 128;

/// The shortest input [`update`] takes: one round's worth.
pub(super) const MIN_LEN: usize = ROUND;

/// Bytes one round of [`update_wide`] folds (four 512-bit registers), and
/// the shortest input it takes.
pub(super) const WIDE_MIN_LEN: usize = 256;

/// Whether this CPU has what [`update`] needs (checked at run time; the
/// standard library caches the answer).
#[inline]
pub(super) fn available() -> bool {
    std::is_x86_feature_detected!("vpclmulqdq")
        && std::is_x86_feature_detected!("avx2")
        && std::is_x86_feature_detected!("pclmulqdq")
        && std::is_x86_feature_detected!("sse4.2")
}

/// Whether this CPU also has what [`update_wide`] needs.
#[inline]
pub(super) fn wide_available() -> bool {
    std::is_x86_feature_detected!("avx512f") && available()
}

/// Both 128-bit lanes of a register hold the same constant pair.
#[inline]
#[target_feature(enable = "avx2")]
fn splat(k: (u64, u64)) -> __m256i {
    _mm256_set_epi64x(k.1 as i64, k.0 as i64, k.1 as i64, k.0 as i64)
}

/// Folds each 128-bit lane of `acc` forward by the distance `k` was made
/// for, onto `next`.
#[inline]
#[target_feature(enable = "avx2,vpclmulqdq")]
fn fold256(acc: __m256i, k: __m256i, next: __m256i) -> __m256i {
    let lo = _mm256_clmulepi64_epi128(acc, k, 0x00);
    let hi = _mm256_clmulepi64_epi128(acc, k, 0x11);
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
    // Four registers into one (each 256 bits before the next).
    let k = splat(K256);
    x1 = fold256(x0, k, x1);
    x2 = fold256(x1, k, x2);
    let x = fold256(x2, k, x3);
    finish(x, &data[at..])
}

/// The CRC32c after a 256-bit remainder `x` (the data so far, folded)
/// and then `rest` (under 32 bytes): the remaining whole 32-byte blocks
/// folded in, the two lanes folded into one, that reduced by the `crc32`
/// instruction, and the tail through `crc32`.
#[inline]
#[target_feature(enable = "avx2,vpclmulqdq,pclmulqdq,sse4.2")]
fn finish(mut x: __m256i, mut rest: &[u8]) -> u32 {
    let k = splat(K256);
    while rest.len() >= 32 {
        x = fold256(x, k, load(rest, 0));
        rest = &rest[32..];
    }
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
    crc32c::crc32c_append(!reg, rest)
}

/// The four 128-bit lanes of a 512-bit register hold the same pair.
#[inline]
#[target_feature(enable = "avx512f")]
fn splat512(k: (u64, u64)) -> __m512i {
    let (a, b) = (k.0 as i64, k.1 as i64);
    _mm512_set_epi64(b, a, b, a, b, a, b, a)
}

/// [`fold256`] on 512-bit registers.
#[inline]
#[target_feature(enable = "avx512f,vpclmulqdq")]
fn fold512(acc: __m512i, k: __m512i, next: __m512i) -> __m512i {
    let lo = _mm512_clmulepi64_epi128(acc, k, 0x00);
    let hi = _mm512_clmulepi64_epi128(acc, k, 0x11);
    _mm512_xor_si512(_mm512_xor_si512(lo, hi), next)
}

/// Reads 64 bytes at `at`.
#[inline]
#[target_feature(enable = "avx512f")]
fn load512(data: &[u8], at: usize) -> __m512i {
    let block = &data[at..at + 64];
    // SAFETY: `block` is 64 readable bytes; the load is unaligned.
    unsafe { _mm512_loadu_si512(block.as_ptr().cast::<__m512i>()) }
}

/// [`update`] with four 512-bit registers (256 bytes a round); `data` is
/// at least [`WIDE_MIN_LEN`] bytes long. The four registers fold into one,
/// its two 256-bit halves into one, and [`finish`] does the rest.
///
/// # Safety
///
/// The CPU must have what [`wide_available`] checks for.
#[target_feature(enable = "avx512f,avx2,vpclmulqdq,pclmulqdq,sse4.2")]
pub(super) unsafe fn update_wide(crc: u32, data: &[u8]) -> u32 {
    assert!(data.len() >= WIDE_MIN_LEN);
    let init = _mm512_set_epi64(0, 0, 0, 0, 0, 0, 0, i64::from(!crc));
    let mut x0 = _mm512_xor_si512(load512(data, 0), init);
    let mut x1 = load512(data, 64);
    let mut x2 = load512(data, 128);
    let mut x3 = load512(data, 192);
    let k = splat512(K2048);
    let mut at = WIDE_MIN_LEN;
    while data.len() - at >= WIDE_MIN_LEN {
        x0 = fold512(x0, k, load512(data, at));
        x1 = fold512(x1, k, load512(data, at + 64));
        x2 = fold512(x2, k, load512(data, at + 128));
        x3 = fold512(x3, k, load512(data, at + 192));
        at += WIDE_MIN_LEN;
    }
    // Four registers into one (each 512 bits before the next), then its
    // low half 256 bits forward onto its high half.
    let k = splat512(K512);
    x1 = fold512(x0, k, x1);
    x2 = fold512(x1, k, x2);
    let x = fold512(x2, k, x3);
    let x = fold256(
        _mm512_castsi512_si256(x),
        splat(K256),
        _mm512_extracti64x4_epi64(x, 1),
    );
    finish(x, &data[at..])
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

    /// The 512-bit kernel, as [`matches_the_crc32_instruction_loop`]:
    /// every length from its shortest past a few rounds (each count of
    /// trailing 32-byte blocks and bytes), at every alignment of a 64-byte
    /// block.
    #[test]
    fn the_wide_kernel_matches_the_crc32_instruction_loop() {
        if !wide_available() {
            eprintln!("no AVX-512/VPCLMULQDQ on this CPU: wide kernel not exercised");
            return;
        }
        let lens = (WIDE_MIN_LEN..1_100).chain([1_500, 1_936]);
        // SAFETY: `wide_available()` said the CPU has the features.
        super::super::tests::matches_the_crate(
            |crc, piece| unsafe { update_wide(crc, piece) },
            64,
            lens,
        );
    }
}
