//! An RDMA Read's sink that stops being valid while the Read is out: the
//! peer invalidates it with a Send with Invalidate (RFC 5040; the
//! sink granting remote invalidation), the program invalidates it
//! locally, or deregisters it.
//!
//! siw resolves and checks the sink when the Response's first FPDU with
//! payload arrives (`siw_proc_rresp`: `siw_check_sge` over the whole sink
//! with local write, whose `siw_check_mem` fails an STag no longer
//! `stag_valid`), not when the Read is posted: a sink invalid by then
//! ends the stream with Terminate DDP / tagged buffer / invalid STag
//! (`siw_tagged_error`), nothing placed, the Read completing with a local
//! protection error. The Response's later FPDUs are not checked again:
//! siw holds the sink referenced (`wqe->mem[0]`) until the Read ends and
//! places them, so an invalidation between two FPDUs of one Response
//! changes nothing (a deregistration does here: the memory may be gone,
//! and the stream ends as `stale_ranges.rs`'s cases do).

use std::time::Instant;

use warpsock_proto::wire::ddp::{Opcode, Placement, SegmentHeader};
use warpsock_proto::wire::fpdu;
use warpsock_proto::wire::terminate::TermCode;
use warpsock_proto::{
    Access, Event, QpState, RecvWr, SendOp, SendWr, Sge, Stag, WcOpcode, WcStatus, WorkCompletion,
};

mod util;

use util::rx::Responder;

/// The sink's address (its own region of 64 bytes).
const SINK: u64 = 0x8000;

fn frame(hdr: SegmentHeader, body: &[u8]) -> Vec<u8> {
    let mut v = Vec::new();
    fpdu::emit(&[&hdr.to_bytes()[..hdr.len()], body], false, &mut v);
    v
}

/// Feeds `bytes` whole, or one byte a call (the step-by-step path, not
/// `rx_fpdu`'s), and returns what the responder sent then.
fn feed(r: &mut Responder, bytes: &[u8], bytewise: bool) -> Vec<u8> {
    if bytewise {
        for b in bytes.chunks(1) {
            r.conn.handle_input(b, &mut r.reg);
        }
    } else {
        r.conn.handle_input(bytes, &mut r.reg);
    }
    let mut out = Vec::new();
    r.conn.poll_transmit(&r.reg, &mut out, 1 << 16);
    out
}

/// A responder (CRC off) with a Read of 64 bytes out (wr_id 7) into the
/// sink, a region of its own allowing local write and remote
/// invalidation; the sink's STag.
fn reading() -> (Responder, Stag) {
    let mut r = util::rx::responder(Instant::now(), false, false);
    let sink = r.reg.register(
        r.pd,
        SINK,
        vec![0; 64],
        Access::LOCAL_WRITE | Access::REMOTE_INVALIDATE,
        5,
    );
    // The peer's first FPDU (a Write) lets the responder transmit.
    let w = frame(
        SegmentHeader {
            opcode: Opcode::RdmaWrite,
            last: true,
            placement: Placement::Tagged {
                stag: r.stags[2],
                to: 0x3000,
            },
        },
        &[1; 4],
    );
    assert!(feed(&mut r, &w, false).is_empty());
    r.conn
        .post_send(SendWr {
            wr_id: 7,
            op: SendOp::Read {
                remote_addr: 0x10_0000,
                rkey: 0x4242,
            },
            sgl: Sge {
                addr: SINK,
                length: 64,
                lkey: sink,
            }
            .into(),
            signaled: true,
        })
        .unwrap();
    let mut out = Vec::new();
    r.conn.poll_transmit(&r.reg, &mut out, 1 << 16);
    assert_eq!(out[3] & 0x0f, Opcode::RdmaReadRequest as u8, "{out:02x?}");
    while r.conn.poll_event().is_some() {}
    (r, sink)
}

/// The Response's FPDU of 32 bytes of `fill` at `at` into the sink.
fn response(sink: Stag, at: u64, last: bool, fill: u8) -> Vec<u8> {
    frame(
        SegmentHeader {
            opcode: Opcode::RdmaReadResponse,
            last,
            placement: Placement::Tagged {
                stag: sink,
                to: SINK + at,
            },
        },
        &[fill; 32],
    )
}

/// The peer's Send with Invalidate of `stag` (Send MSN 1) into a receive
/// posted for it; its completion says the STag was invalidated.
fn peer_invalidates(r: &mut Responder, stag: Stag, bytewise: bool) {
    r.conn
        .post_recv(RecvWr {
            wr_id: 3,
            sgl: Sge {
                addr: 0x1000,
                length: 64,
                lkey: r.stags[0],
            }
            .into(),
        })
        .unwrap();
    let s = frame(
        SegmentHeader {
            opcode: Opcode::SendInvalidate,
            last: true,
            placement: Placement::Untagged {
                inv_stag: stag,
                qn: 0,
                msn: 1,
                mo: 0,
            },
        },
        &[2; 8],
    );
    assert!(feed(r, &s, bytewise).is_empty());
    let wc = r.conn.poll_completion().expect("the receive");
    assert_eq!(
        (wc.wr_id, wc.status, wc.invalidated),
        (3, WcStatus::Success, Some(stag))
    );
}

fn completions(r: &mut Responder) -> Vec<WorkCompletion> {
    std::iter::from_fn(|| r.conn.poll_completion()).collect()
}

/// The stream ended with the Terminate siw sends for a sink that fails
/// its check (DDP / tagged buffer / invalid STag, the Response's DDP
/// header attached), nothing placed, the Read failed as a local
/// protection error.
fn expect_invalid_sink(r: &mut Responder, sink: Stag, out: &[u8], first: &[u8], what: &str) {
    assert!(
        r.reg
            .backing(sink)
            .is_none_or(|m| m.iter().all(|&b| b == 0)),
        "{what}: the Response was placed into the sink"
    );
    assert_eq!(r.conn.state(), QpState::Error, "{what}");
    // Length, DDP/RDMAP control, the untagged header (16), then the
    // Terminate's control: layer/type, code, flags (DDP header
    // attached), and the segment's length and tagged header.
    assert_eq!(&out[..4], &[0x00, 0x26, 0x41, 0x47], "{what}: {out:02x?}");
    assert_eq!(&out[20..22], &[0x11, 0x00], "{what}: {out:02x?}");
    assert_eq!(&out[24..26], &first[..2], "{what}: the segment's length");
    assert_eq!(&out[26..40], &first[2..16], "{what}: the DDP header");
    let mut code = None;
    while let Some(e) = r.conn.poll_event() {
        if let Event::Terminated {
            code: c,
            by_peer: false,
        } = e
        {
            code = Some(c);
        }
    }
    assert_eq!(code, Some(TermCode::DDP_TAGGED_INVALID_STAG), "{what}");
    let wcs = completions(r);
    let read = wcs
        .iter()
        .find(|w| w.wr_id == 7)
        .unwrap_or_else(|| panic!("{what}: the Read's completion: {wcs:?}"));
    assert_eq!(
        (read.opcode, read.status),
        (WcOpcode::RdmaRead, WcStatus::LocalProtectionError),
        "{what}"
    );
}

/// The peer invalidates the sink (Send with Invalidate) after the Read
/// went out and before its Response: the Response's first FPDU is not
/// placed, the stream ends (siw `siw_proc_rresp` → `siw_check_sge` →
/// `siw_check_mem`: `!stag_valid`). Before: the 64 bytes were placed
/// into the invalidated sink and the Read completed successfully.
#[test]
fn a_response_into_a_sink_the_peer_invalidated_is_not_placed() {
    for bytewise in [false, true] {
        let (mut r, sink) = reading();
        peer_invalidates(&mut r, sink, bytewise);
        let mut f = response(sink, 0, false, 0xaa);
        f.extend(response(sink, 32, true, 0xbb));
        let out = feed(&mut r, &f, bytewise);
        expect_invalid_sink(&mut r, sink, &out, &f, &format!("bytewise {bytewise}"));
    }
}

/// The same with the sink invalidated by the program (a local
/// invalidate) or deregistered: siw's check fails the same way (an STag
/// not valid; one not found, `siw_mem_id2obj`). Before: placed (local
/// invalidate), or Terminate DDP / catastrophic with nothing attached
/// (deregistered: the region was gone when placing).
#[test]
fn a_response_into_a_sink_gone_locally_is_not_placed() {
    for how in ["invalidated", "deregistered", "reused"] {
        let (mut r, sink) = reading();
        match how {
            "invalidated" => r.reg.invalidate(r.pd, sink, false).unwrap(),
            "deregistered" => assert!(r.reg.deregister(sink).is_some()),
            _ => {
                // Another registration takes the slot and the key: the
                // same STag, not the Read's sink (`Range::serial`).
                assert!(r.reg.deregister(sink).is_some());
                let again = r.reg.register(r.pd, SINK, vec![0; 64], Access::ALL, 5);
                assert_eq!(again, sink);
            }
        }
        let f = response(sink, 0, true, 0xaa);
        let out = feed(&mut r, &f, false);
        expect_invalid_sink(&mut r, sink, &out, &f, how);
    }
}

/// An invalidation between two FPDUs of one Response changes nothing:
/// siw checks the sink once, on the first FPDU with payload, and holds
/// it referenced until the Read ends (`siw_proc_rresp` resolves
/// `wqe->mem[0]` only while it is unset), so the rest is placed and the
/// Read completes.
#[test]
fn a_response_continues_into_a_sink_invalidated_after_its_first_fpdu() {
    for bytewise in [false, true] {
        let (mut r, sink) = reading();
        assert!(feed(&mut r, &response(sink, 0, false, 0xaa), bytewise).is_empty());
        peer_invalidates(&mut r, sink, bytewise);
        assert!(feed(&mut r, &response(sink, 32, true, 0xbb), bytewise).is_empty());
        let m = r.reg.backing(sink).unwrap();
        assert!(m[..32].iter().all(|&b| b == 0xaa) && m[32..].iter().all(|&b| b == 0xbb));
        let wcs = completions(&mut r);
        assert_eq!(wcs.len(), 1, "{wcs:?}");
        assert_eq!(
            (wcs[0].wr_id, wcs[0].status, wcs[0].byte_len),
            (7, WcStatus::Success, 64)
        );
        assert_eq!(r.conn.state(), QpState::Rts);
    }
}

/// A deregistration between two FPDUs of one Response does end the
/// stream, unlike siw (which keeps the pages pinned while it holds the
/// sink referenced): the program may have released the memory. The
/// continuation is not placed anywhere; the Terminate is the one a
/// region gone under a placement gets (DDP / catastrophic, nothing
/// attached).
#[test]
fn a_response_stops_at_a_sink_deregistered_after_its_first_fpdu() {
    let (mut r, sink) = reading();
    assert!(feed(&mut r, &response(sink, 0, false, 0xaa), false).is_empty());
    let m = r.reg.deregister(sink).expect("the sink");
    assert!(m[..32].iter().all(|&b| b == 0xaa) && m[32..].iter().all(|&b| b == 0));
    let out = feed(&mut r, &response(sink, 32, true, 0xbb), false);
    assert_eq!(r.conn.state(), QpState::Error);
    assert_eq!(&out[..4], &[0x00, 0x16, 0x41, 0x47], "{out:02x?}");
    assert_eq!(&out[20..24], &[0x10, 0x00, 0x00, 0x00], "{out:02x?}");
    let wcs = completions(&mut r);
    assert!(
        wcs.iter()
            .any(|w| w.wr_id == 7 && w.status != WcStatus::Success),
        "{wcs:?}"
    );
}
