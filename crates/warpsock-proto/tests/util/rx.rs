//! Scripted FPDU streams into a responder, for the receive paths'
//! differential tests (`rx_straight.rs`, `rx_predicted.rs`): a responder
//! that accepted a scripted MPA Request, the FPDU kinds and receives a
//! script draws from, and the script built from drawn steps.

use std::time::Instant;

use proptest::prelude::*;
use warpsock_proto::wire::ddp::{Opcode, Placement, ReadRequest, SegmentHeader};
use warpsock_proto::wire::fpdu;
use warpsock_proto::wire::mpa::{EnhancedParams, Flags, FrameKind, RequestReply};
use warpsock_proto::{Access, Config, Connection, Event, PdId, Registry, Role, Sge, Stag};

/// Regions every responder registers, in this order (so both sides of a
/// comparison have the same STags).
pub const REGIONS: [(u64, usize, Access); 4] = [
    (0x1000, 256, Access::LOCAL_WRITE),
    (0x2000, 256, Access::LOCAL_READ),
    (0x3000, 256, Access::REMOTE_WRITE),
    (0x4000, 256, Access::ALL),
];

/// A responder, its regions' STags (in `REGIONS`' order), every byte it
/// sent and how much of the input it consumed.
pub struct Responder {
    pub conn: Connection,
    pub reg: Registry<Vec<u8>>,
    /// The domain of its regions and its queue pair.
    pub pd: PdId,
    pub stags: Vec<Stag>,
    pub sent: Vec<u8>,
    pub consumed: usize,
}

/// A responder that accepted a scripted MPA Request (CRC as `crc`; with
/// `rtr`, peer-to-peer with a zero-length Send as the RTR message).
pub fn responder(now: Instant, crc: bool, rtr: bool) -> Responder {
    responder_with(now, crc, rtr, None)
}

/// [`responder`] with a receive queue of `rq_depth` (else the default).
pub fn responder_with(now: Instant, crc: bool, rtr: bool, rq_depth: Option<usize>) -> Responder {
    let mut reg = Registry::new();
    let pd: PdId = reg.alloc_pd();
    let stags = REGIONS
        .iter()
        .map(|&(iova, len, access)| reg.register(pd, iova, vec![0; len], access, 0x11))
        .collect();
    let mut cfg = Config::new(Role::Responder, pd);
    cfg.ird = 4;
    if let Some(d) = rq_depth {
        cfg.rq_depth = d;
    }
    let mut conn = Connection::new(cfg, now);
    let word = EnhancedParams {
        ird: 4,
        ord: 4,
        peer_to_peer: rtr,
        send_rtr: rtr,
        ..Default::default()
    }
    .to_bytes();
    let mut req = Vec::new();
    RequestReply {
        kind: FrameKind::Request,
        flags: Flags(Flags::ENHANCED).with(Flags::CRC, crc),
        revision: 2,
        private_data: &word,
    }
    .emit(&mut req);
    assert_eq!(conn.handle_input(&req, &mut reg), req.len());
    assert!(matches!(conn.poll_event(), Some(Event::ConnectRequest(_))));
    conn.accept(&[]).unwrap();
    let mut sent = Vec::new();
    conn.poll_transmit(&reg, &mut sent, 1 << 16);
    Responder {
        conn,
        reg,
        pd,
        stags,
        sent,
        consumed: 0,
    }
}

/// One step of a script.
#[derive(Debug, Clone)]
pub enum Action {
    /// Posts a receive: (region index, offset, length) per entry.
    Recv(Vec<(usize, u64, u32)>),
    /// One read's bytes.
    Feed(Vec<u8>),
}

impl Responder {
    /// The scatter list of an `Action::Recv`'s (region index, offset,
    /// length) entries.
    pub fn sgl(&self, entries: &[(usize, u64, u32)]) -> Vec<Sge> {
        entries
            .iter()
            .map(|&(i, off, length)| Sge {
                addr: REGIONS[i].0 + off,
                length,
                lkey: self.stags[i],
            })
            .collect()
    }
}

/// An FPDU with `ulpdu` (header and body) and the trailer: CRC when `crc`
/// (flipped when `bad_crc`), zeros without.
fn frame(ulpdu: &[u8], crc: bool, bad_crc: bool) -> Vec<u8> {
    let mut v = Vec::new();
    fpdu::emit(&[ulpdu], crc, &mut v);
    if bad_crc {
        let n = v.len();
        v[n - 1] ^= 0x5a;
    }
    v
}

fn untagged(op: Opcode, last: bool, qn: u32, msn: u32, mo: u32, inv: u32) -> Vec<u8> {
    let h = SegmentHeader {
        opcode: op,
        last,
        placement: Placement::Untagged {
            inv_stag: inv,
            qn,
            msn,
            mo,
        },
    };
    h.to_bytes()[..h.len()].to_vec()
}

/// The FPDU kinds a script draws from; `msn` is the Send MSN the stream
/// expects next if every Send so far was taken.
pub fn fpdu_of(kind: u8, msn: u32, crc: bool, stags: &[Stag]) -> Vec<u8> {
    let send = |op, last, qn, msn, mo, inv, len: usize| {
        let mut u = untagged(op, last, qn, msn, mo, inv);
        u.extend((0..len).map(|i| (i as u8).wrapping_mul(7).wrapping_add(kind)));
        frame(&u, crc, false)
    };
    match kind {
        // The straight path's case, and its solicited twin.
        0 => send(Opcode::Send, true, 0, msn, 0, 0, 8),
        1 => send(Opcode::SendSe, true, 0, msn, 0, 0, 40),
        2 => send(Opcode::Send, true, 0, msn, 0, 0, 0),
        // A payload that fills the receive (64 bytes) and one past it.
        3 => send(Opcode::Send, true, 0, msn, 0, 0, 64),
        4 => send(Opcode::Send, true, 0, msn, 0, 0, 65),
        // Each header condition broken in turn.
        5 => send(Opcode::Send, false, 0, msn, 0, 0, 8),
        6 => send(Opcode::Send, true, 0, msn, 8, 0, 8),
        7 => send(Opcode::Send, true, 0, msn.wrapping_add(1), 0, 0, 8),
        8 => send(Opcode::Send, true, 1, msn, 0, 0, 8),
        9 => send(Opcode::SendInvalidate, true, 0, msn, 0, stags[3], 8),
        10 => send(Opcode::SendSeInvalidate, true, 0, msn, 0, 0x4242, 8),
        11 => {
            let mut f = send(Opcode::Send, true, 0, msn, 0, 0, 8);
            f.truncate(f.len() - 4);
            let mut u = f[2..].to_vec();
            u.truncate(u.len() - fpdu::pad_len(u.len()));
            frame(&u, crc, true)
        }
        // Control bytes: tagged bit, DDP version, RDMAP version, reserved
        // bits (ignored by both), an undefined opcode.
        12..=16 => {
            let mut u = untagged(Opcode::Send, true, 0, msn, 0, 0);
            match kind {
                12 => u[0] |= 0x80,
                13 => u[0] = (u[0] & !0x03) | 0x02,
                14 => u[1] = (u[1] & 0x3f) | 0x80,
                15 => {
                    u[0] |= 0x3c;
                    u[1] |= 0x30;
                }
                _ => u[1] = (u[1] & 0xf0) | 0x0b,
            }
            u.extend_from_slice(&[1, 2, 3, 4, 5]);
            frame(&u, crc, false)
        }
        // Other messages: an RDMA Write, a Read Request, an unexpected
        // Read Response, a Terminate from the peer.
        17 => {
            let h = SegmentHeader {
                opcode: Opcode::RdmaWrite,
                last: true,
                placement: Placement::Tagged {
                    stag: stags[2],
                    to: 0x3010,
                },
            };
            let mut u = h.to_bytes()[..h.len()].to_vec();
            u.extend_from_slice(&[9; 12]);
            frame(&u, crc, false)
        }
        18 => {
            let mut u = untagged(Opcode::RdmaReadRequest, true, 1, 1, 0, 0);
            u.extend_from_slice(
                &ReadRequest {
                    sink_stag: 0x99,
                    sink_to: 0,
                    size: 16,
                    src_stag: stags[3],
                    src_to: 0x4000,
                }
                .to_bytes(),
            );
            frame(&u, crc, false)
        }
        19 => {
            let h = SegmentHeader {
                opcode: Opcode::RdmaReadResponse,
                last: true,
                placement: Placement::Tagged { stag: 0x99, to: 0 },
            };
            let mut u = h.to_bytes()[..h.len()].to_vec();
            u.extend_from_slice(&[1; 4]);
            frame(&u, crc, false)
        }
        _ => {
            let mut u = untagged(Opcode::Terminate, true, 2, 1, 0, 0);
            u.extend_from_slice(&[0x11, 0x02, 0x00, 0x00]);
            frame(&u, crc, false)
        }
    }
}

pub const KINDS: u8 = 21;

/// Receives a script posts: (region, offset, length) entries.
pub fn recv_of(kind: u8) -> Vec<(usize, u64, u32)> {
    match kind {
        // One buffer of 64 bytes: the straight path's receive.
        0 => vec![(0, 16, 64)],
        // Two buffers, a zero-length one, a region without local write,
        // a range past its region.
        1 => vec![(0, 0, 32), (3, 8, 32)],
        2 => vec![(0, 0, 0)],
        3 => vec![(1, 0, 64)],
        _ => vec![(0, 200, 64)],
    }
}

pub const RECVS: u8 = 5;

/// A script from drawn (receive kind or none, FPDU kind, whole or joined
/// with the next) steps; MSNs follow the Sends drawn.
pub fn script(steps: &[(Option<u8>, u8, bool)], crc: bool) -> Vec<Action> {
    let stags = responder(Instant::now(), crc, false).stags;
    let mut msn = 1u32;
    let mut out = Vec::new();
    let mut pending: Vec<u8> = Vec::new();
    for &(recv, kind, join) in steps {
        if let Some(r) = recv {
            if !pending.is_empty() {
                out.push(Action::Feed(std::mem::take(&mut pending)));
            }
            out.push(Action::Recv(recv_of(r)));
        }
        pending.extend(fpdu_of(kind, msn, crc, &stags));
        if matches!(kind, 0..=4) {
            msn = msn.wrapping_add(1);
        }
        if !join {
            out.push(Action::Feed(std::mem::take(&mut pending)));
        }
    }
    if !pending.is_empty() {
        out.push(Action::Feed(pending));
    }
    out
}

/// Drawn steps for [`script`]: 1 to 9 of (receive kind or none, FPDU
/// kind, joined with the next).
pub fn steps() -> impl Strategy<Value = Vec<(Option<u8>, u8, bool)>> {
    prop::collection::vec((prop::option::of(0..RECVS), 0..KINDS, any::<bool>()), 1..10)
}
