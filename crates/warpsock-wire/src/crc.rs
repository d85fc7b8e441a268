//! CRC32c (Castagnoli) as MPA uses it (RFC 5044 §4.4, RFC 3385).
//!
//! The checksum is the standard CRC32c (reflected, init `0xFFFF_FFFF`, final
//! xor) over the 2-byte ULPDU length, the ULPDU and the pad. On the wire the
//! four trailer bytes are the **little-endian** bytes of that value
//! ([`trailer`]): that is what Linux siw computes (`put_unaligned_le32`) and
//! what Wireshark reports as "Good CRC32" (`siw-compat.md` §1.5, verified).
//!
//! Two kernels, picked by size and by what the CPU has (checked at run
//! time):
//!
//! * from [`FOLD_MIN`] bytes up, on CPUs with VPCLMULQDQ and AVX2, the
//!   folding kernel in `crc/fold.rs`: 256 bits per carry-less multiply,
//!   512 where the CPU has AVX-512 too;
//! * pieces under 128 bytes (a small message's whole FPDU), on CPUs with
//!   SSE4.2, the `crc32` instruction in one stream (`crc/short.rs`):
//!   no set-up at all;
//! * everything else goes to the `crc32c` crate: the SSE4.2 `crc32`
//!   instruction in three interleaved streams (about 150 instructions of
//!   set-up and tail per call), or a table on CPUs without SSE4.2.
//!
//! Measured on this project's machines (AMD EPYC with VPCLMULQDQ and AVX2,
//! first without AVX-512, now a Zen 5 with it), CPU time over a 64 KiB buffer (`cargo run --release
//! -p warpsock-wire --example crc_rate`): see BENCHMARKS.md §1.
//!
//! Both compute the same function; the running value is the plain CRC32c
//! of the bytes so far, so either kernel continues where the other stopped.

#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)] // SIMD intrinsics: the crate's only unsafe code.
mod fold;
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)] // The `crc32` instruction, as in `fold`.
mod short;

/// Pieces of at least this many bytes go to the folding kernel (where
/// the CPU has one): below it the `crc32` loop is as fast.
pub const FOLD_MIN: usize = 256;

/// CRC32c of `data`. `crc32c(b"123456789") == 0xE306_9283`.
#[inline]
pub fn crc32c(data: &[u8]) -> u32 {
    Crc32c::new().update(data).value()
}

/// Running CRC32c over data that arrives in pieces (e.g. placed payload).
///
/// `Crc32c::new().update(a).update(b).value() == crc32c(a ++ b)`.
#[derive(Clone, Copy, Default, PartialEq, Eq)]
pub struct Crc32c {
    /// CRC32c of the bytes seen so far (0 for none).
    value: u32,
}

impl std::fmt::Debug for Crc32c {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Crc32c({:#010x})", self.value())
    }
}

impl Crc32c {
    /// A CRC over no bytes yet.
    #[inline]
    pub const fn new() -> Self {
        Self { value: 0 }
    }

    /// Starts over, as if new.
    #[inline]
    pub fn reset(&mut self) {
        self.value = 0;
    }

    /// Extends the CRC over `data`.
    #[inline]
    pub fn update(&mut self, data: &[u8]) -> &mut Self {
        self.value = append(self.value, data);
        self
    }

    /// The CRC of everything seen so far.
    #[inline]
    pub const fn value(&self) -> u32 {
        self.value
    }

    /// The trailer bytes for everything seen so far.
    #[inline]
    pub const fn trailer(&self) -> [u8; 4] {
        trailer(self.value())
    }
}

/// The CRC32c `crc` of some bytes continued over `data`.
#[inline]
fn append(crc: u32, data: &[u8]) -> u32 {
    #[cfg(target_arch = "x86_64")]
    if data.len() >= FOLD_MIN {
        const _: () = assert!(FOLD_MIN >= fold::MIN_LEN && FOLD_MIN >= fold::WIDE_MIN_LEN);
        if fold::wide_available() {
            // SAFETY: `wide_available()` checked the CPU features the
            // kernel is compiled for; the piece is long enough for it.
            #[allow(unsafe_code)]
            return unsafe { fold::update_wide(crc, data) };
        }
        if fold::available() {
            // SAFETY: as above, for `available()`.
            #[allow(unsafe_code)]
            return unsafe { fold::update(crc, data) };
        }
    }
    #[cfg(target_arch = "x86_64")]
    if data.len() < short::SHORT_MAX && short::available() {
        // SAFETY: `available()` checked for SSE4.2.
        #[allow(unsafe_code)]
        return unsafe { short::update(crc, data) };
    }
    crc32c::crc32c_append(crc, data)
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

    /// Checks a kernel (`kernel(crc, piece)`) against the `crc32c` crate:
    /// pieces of every length in `lens` starting at every offset below
    /// `align`, from a zero and a non-zero running value.
    pub(super) fn matches_the_crate(
        kernel: impl Fn(u32, &[u8]) -> u32,
        align: usize,
        lens: impl Iterator<Item = usize>,
    ) {
        let data: Vec<u8> = (0..2_000u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        for len in lens {
            for start in 0..align {
                let piece = &data[start..start + len];
                for crc in [0, 0xDEAD_BEEF] {
                    let want = crc32c::crc32c_append(crc, piece);
                    assert_eq!(kernel(crc, piece), want, "start {start} len {len}");
                }
            }
        }
    }

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

    /// Pieces on either side of [`FOLD_MIN`], in any order, give the CRC
    /// of the whole: the two kernels continue each other's running value.
    /// The reference is a bitwise CRC32c written out here.
    #[test]
    fn kernels_continue_each_other() {
        fn bitwise(data: &[u8]) -> u32 {
            let mut crc = !0u32;
            for &b in data {
                crc ^= u32::from(b);
                for _ in 0..8 {
                    crc = if crc & 1 != 0 {
                        (crc >> 1) ^ 0x82F6_3B78
                    } else {
                        crc >> 1
                    };
                }
            }
            !crc
        }
        let data: Vec<u8> = (0..5_000u32).map(|i| (i * 131 + 7) as u8).collect();
        assert_eq!(crc32c(&data), bitwise(&data));
        for cuts in [
            &[1usize, FOLD_MIN - 1, FOLD_MIN, 3][..],
            &[FOLD_MIN, 2, FOLD_MIN + 1, 0, 17],
            &[4096, 1],
            &[0, 5, 300, 7, 2000],
        ] {
            let mut c = Crc32c::new();
            let mut at = 0;
            for &n in cuts {
                c.update(&data[at..at + n]);
                at += n;
            }
            assert_eq!(c.value(), bitwise(&data[..at]), "cuts {cuts:?}");
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
