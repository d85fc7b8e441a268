//! A range the receive or transmit path checked earlier, used after its
//! region was deregistered and the region's slot registered again under
//! the same STag (the engine draws 8-bit keys at random and reuses freed
//! slots last-in first-out, so one registration in 256 repeats the STag
//! of the slot's last one). A hostile peer holds such a range open at
//! will: it sends a Write's header and withholds its payload, or asks a
//! Read and closes its window. The new region — another buffer, perhaps
//! another domain's, with none of the rights the peer was given — must
//! never be written or read through it: the stream ends instead, as it
//! does when the slot is still empty (siw keeps the old memory referenced
//! until the placement ends and never reaches another region).

use std::time::Instant;

use warpsock_proto::wire::ddp::{Opcode, Placement, ReadRequest, SegmentHeader};
use warpsock_proto::wire::fpdu;
use warpsock_proto::{Access, Connection, PdId, QpState, Registry};

mod util;

struct Peer {
    conn: Connection,
    reg: Registry<Vec<u8>>,
    pd: PdId,
    out: Vec<u8>,
}

/// A responder (CRC off, IRD 4) past MPA (its MPA Reply sent; the
/// harness's regions registered first, in slots of their own).
fn responder() -> Peer {
    let r = util::rx::responder(Instant::now(), false, false);
    assert_eq!(r.sent.len(), 24, "MPA reply");
    Peer {
        conn: r.conn,
        reg: r.reg,
        pd: r.pd,
        out: Vec::new(),
    }
}

fn frame(hdr: SegmentHeader, body: &[u8]) -> Vec<u8> {
    let mut v = Vec::new();
    fpdu::emit(&[&hdr.to_bytes()[..hdr.len()], body], false, &mut v);
    v
}

/// Deregisters `old` and registers, in another domain and with local
/// write only, a region that takes its slot and (as one key in 256 does)
/// its key: the same STag.
fn reuse_stag(p: &mut Peer, old: u32, fill: u8) -> u32 {
    assert!(p.reg.deregister(old).is_some());
    let other = p.reg.alloc_pd();
    let new = p.reg.register(
        other,
        0,
        vec![fill; 64],
        Access::LOCAL_WRITE,
        (old & 0xff) as u8,
    );
    assert_eq!(new, old, "the premise: the same STag again");
    new
}

/// The payload of a Write whose header came before the region went is
/// not placed into the region registered in its slot under the same
/// STag: the stream ends (before: the withheld 24 bytes were written into
/// the new region, which grants no remote right and is in another
/// domain).
#[test]
fn a_withheld_write_payload_never_reaches_a_region_reusing_the_stag() {
    let mut p = responder();
    let x = p
        .reg
        .register(p.pd, 0, vec![0; 64], Access::REMOTE_WRITE, 7);
    let f = frame(
        SegmentHeader {
            opcode: Opcode::RdmaWrite,
            last: true,
            placement: Placement::Tagged { stag: x, to: 0 },
        },
        &[0xee; 32],
    );
    // Length, header and 8 payload bytes; the rest withheld.
    let cut = 2 + 14 + 8;
    assert_eq!(p.conn.handle_input(&f[..cut], &mut p.reg), cut);
    let y = reuse_stag(&mut p, x, 0);
    p.conn.handle_input(&f[cut..], &mut p.reg);
    assert!(
        p.reg.backing(y).unwrap().iter().all(|&b| b == 0),
        "the new region was written: {:?}",
        p.reg.backing(y).unwrap()
    );
    p.conn.poll_transmit(&p.reg, &mut p.out, 1 << 16);
    assert_eq!(p.conn.state(), QpState::Error);
    // Terminate DDP/catastrophic, nothing attached (the region gone).
    assert_eq!(&p.out[2..4], &[0x41, 0x47]);
    assert_eq!(&p.out[20..24], &[0x10, 0x00, 0x00, 0x00]);
}

/// A Read Response is not read out of the region registered in the
/// source's slot under the same STag after the source went (before: the
/// new region's bytes, 0x5a, went to the peer).
#[test]
fn a_queued_read_response_never_reads_a_region_reusing_the_stag() {
    let mut p = responder();
    let x = p
        .reg
        .register(p.pd, 0, vec![0x11; 64], Access::REMOTE_READ, 9);
    let body = ReadRequest {
        sink_stag: 0x4242,
        sink_to: 0,
        size: 32,
        src_stag: x,
        src_to: 0,
    };
    let f = frame(
        SegmentHeader {
            opcode: Opcode::RdmaReadRequest,
            last: true,
            placement: Placement::Untagged {
                inv_stag: 0,
                qn: 1,
                msn: 1,
                mo: 0,
            },
        },
        &body.to_bytes(),
    );
    assert_eq!(p.conn.handle_input(&f, &mut p.reg), f.len());
    // The program drops the region (its mapping ends) before the
    // Response went (the peer's window closed, say), and registers
    // another buffer.
    reuse_stag(&mut p, x, 0x5a);
    p.conn.poll_transmit(&p.reg, &mut p.out, 1 << 16);
    assert!(
        !p.out.windows(8).any(|w| w == [0x5a; 8]),
        "the new region's bytes were sent: {:02x?}",
        p.out
    );
    assert_eq!(p.conn.state(), QpState::Error);
}
