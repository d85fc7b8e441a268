//! A region's prefix written by the peer (`Registry::remote_written`, what
//! a sink's SINK_DONE is checked against) counts a Write only once its
//! FPDU is whole and its CRC good — not at its header, which a lying peer
//! can send with the payload withheld (issue 12, session 35's review).

mod util;

use std::time::Instant;

use util::rx::{responder, REGIONS};
use warpsock_proto::wire::ddp::{Opcode, Placement, SegmentHeader};
use warpsock_proto::wire::fpdu;

/// A Write of `len` bytes at offset 0 of the responder's remotely
/// writable region, as one FPDU with a CRC (flipped when `bad`).
fn write_fpdu(stag: u32, len: usize, bad: bool) -> Vec<u8> {
    let h = SegmentHeader {
        opcode: Opcode::RdmaWrite,
        last: true,
        placement: Placement::Tagged {
            stag,
            to: REGIONS[2].0,
        },
    };
    let mut u = h.to_bytes()[..h.len()].to_vec();
    u.extend(std::iter::repeat_n(9u8, len));
    let mut v = Vec::new();
    fpdu::emit(&[&u], true, &mut v);
    if bad {
        let n = v.len();
        v[n - 1] ^= 0x5a;
    }
    v
}

#[test]
fn a_write_counts_once_its_fpdu_is_whole() {
    let mut r = responder(Instant::now(), true, false);
    let stag = r.stags[2];
    let f = write_fpdu(stag, 100, false);
    // The header and part of the payload: nothing counted yet.
    let cut = f.len() - 40;
    assert_eq!(r.conn.handle_input(&f[..cut], &mut r.reg), cut);
    assert_eq!(r.reg.remote_written(stag), Some(0), "counted at the header");
    assert_eq!(r.conn.handle_input(&f[cut..], &mut r.reg), f.len() - cut);
    assert_eq!(r.reg.remote_written(stag), Some(100));
}

#[test]
fn a_write_with_a_bad_crc_counts_nothing() {
    let mut r = responder(Instant::now(), true, false);
    let stag = r.stags[2];
    let f = write_fpdu(stag, 100, true);
    r.conn.handle_input(&f, &mut r.reg);
    assert_eq!(r.reg.remote_written(stag), Some(0), "a bad FPDU counted");
}
