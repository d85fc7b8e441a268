//! Byte-exact iWARP wire formats.
//!
//! This crate holds the bytes-on-the-wire layer of warpsock: views over byte
//! buffers for input and small `Repr`-style structs with `emit` for output,
//! for every message iWARP puts on a TCP stream:
//!
//! * [`mpa`] — MPA Request/Reply frames (RFC 5044 §7.1) with the RFC 6581
//!   enhanced IRD/ORD word;
//! * [`fpdu`] — FPDU framing: ULPDU length, pad, CRC32c trailer (RFC 5044 §4);
//! * [`marker`] — MPA markers every 512 octets (RFC 5044 §4.3, §5);
//! * [`crc`] — hardware-accelerated CRC32c and its on-the-wire encoding;
//! * [`ddp`] — DDP tagged/untagged headers (RFC 5041 §4) with the RDMAP
//!   control byte and opcodes 0–7 (RFC 5040 §4), the Read Request body;
//! * [`terminate`] — the Terminate control word, its error codes, and the
//!   attached headers (RFC 5040 §4.8, §7).
//!
//! # Guarantees
//!
//! * Parsing never panics and never reads out of bounds: a short buffer, an
//!   unknown opcode, a bad version or a bad key is a typed [`WireError`] that
//!   the protocol core maps to the correct Terminate.
//! * Nothing here allocates except `emit` helpers that append to a caller's
//!   `Vec<u8>`; the hot path (FPDU headers, CRC) writes into fixed arrays.
//! * No I/O, no clocks, and no `unsafe` outside the CRC32c folding kernel
//!   (`crc/fold.rs`: SIMD intrinsics behind a run-time CPU feature check).
//!
//! Byte order is network order (big endian) everywhere except the CRC32c
//! trailer, which carries the little-endian bytes of the CRC value as Linux
//! siw and Wireshark expect (see `shared/design/siw-compat.md` §1.5).
//!
//! ```
//! use warpsock_wire::{crc, fpdu};
//! let mut frame = Vec::new();
//! fpdu::emit(&[b"hello"], true, &mut frame);
//! assert_eq!(frame.len(), fpdu::fpdu_len(5));
//! assert_eq!(&frame[..2], &[0, 5]);
//! let (ulpdu_len, total) = fpdu::peek_len(&frame).unwrap();
//! assert_eq!((ulpdu_len, total), (5, 12));
//! assert!(fpdu::check_crc(&frame[..total]));
//! assert_eq!(crc::crc32c(b"123456789"), 0xE306_9283);
//! ```
#![deny(unsafe_code)]

pub mod crc;
pub mod ddp;
mod error;
pub mod fpdu;
pub mod marker;
pub mod mpa;
pub mod terminate;

pub use error::WireError;
