//! The receive path of an established responder on an arbitrary byte stream,
//! cut at arbitrary points, interleaved with its own transmit path.
//!
//! Input layout:
//!
//! | byte | meaning                                                       |
//! |------|---------------------------------------------------------------|
//! | 0    | bit 0: initiator asks for CRC; bit 1: responder asks for      |
//! |      | markers (the stream must then carry them); bit 2: peer-to-peer|
//! |      | setup with a Write RTR (the stream must start with it); bit 3:|
//! |      | fed as the engine's driver does, with planned reads           |
//! |      | (`rx_plan`/`rx_planned`: every planned range must lie in its  |
//! |      | region), instead of through `handle_input`                    |
//! | 1    | largest chunk handed to `handle_input` (0: all at once)       |
//! | 2, 3 | seed of the chunk-size generator                              |
//! | 4..  | the byte stream "from the initiator" after the MPA Reply      |
//!
//! The responder has three 4 KiB regions (STags 0x111 at iova 0x1000,
//! 0x211 at 0x2000, 0x311 at 0x3000; the first two REMOTE_WRITE |
//! REMOTE_READ | LOCAL_WRITE, the third with every right), four 1 KiB
//! receives in region 0x111, and has posted a 64-byte Send from 0x311 and
//! a 512-byte RDMA Read into 0x211 at 0x2000 (so Read Responses have a
//! sink). CRC checking is compiled out under `cfg(fuzzing)`.
#![no_main]

use std::time::{Duration, Instant};

use libfuzzer_sys::fuzz_target;
use warpsock_proto::{
    Access, Config, Connection, Event, RecvWr, Registry, Role, RtrOffer, RxPiece, RxStep, SendOp,
    SendWr, Sge, WcOpcode, WcStatus, WorkQueue,
};

const HEADER: usize = 4;
const REGION_LEN: usize = 4096;
const KEY: u8 = 0x11;
/// Bound on transmit rounds per chunk, so a bug that keeps producing
/// output shows up as a slow input rather than a hang.
const MAX_TX_ROUNDS: usize = 256;

struct Rng(u32);

impl Rng {
    fn next(&mut self) -> u32 {
        // xorshift32; never zero.
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 17;
        self.0 ^= self.0 << 5;
        self.0
    }
}

fn drain(conn: &mut Connection, next_wr: &mut u64) {
    while conn.poll_event().is_some() {}
    while let Some(wc) = conn.poll_completion() {
        // Keep the receive queue stocked, like an application would (but
        // not on flushes: a dead QP flushes each new receive at once).
        if wc.queue == WorkQueue::Recv
            && wc.opcode == WcOpcode::Recv
            && wc.status == WcStatus::Success
        {
            *next_wr += 1;
            let _ = conn.post_recv(RecvWr {
                wr_id: *next_wr,
                sgl: Sge {
                    addr: 0x1000 + (*next_wr % 4) * 1024,
                    length: 1024,
                    lkey: (1 << 8) | u32::from(KEY),
                }.into(),
            });
        }
    }
}

/// Feeds `data` as the engine's socket driver does: framing step by step,
/// payload placed where `rx_step` says, and where the core plans several
/// FPDUs, the bytes laid over the plan as one `readv` would and handed to
/// `rx_planned`. Returns the bytes consumed.
fn feed_planned(
    conn: &mut Connection,
    data: &[u8],
    reg: &mut Registry<Vec<u8>>,
    plan: &mut Vec<RxPiece>,
    stage: &mut Vec<u8>,
) -> usize {
    let mut off = 0;
    while off < data.len() {
        let rest = &data[off..];
        match conn.rx_step() {
            RxStep::Place(_) if conn.rx_plan(1 << 20, 64, plan) => {
                stage.clear();
                stage.resize(RxPiece::staged(plan), 0);
                let (mut at, mut soff) = (0, 0);
                for p in plan.iter() {
                    let k = match *p {
                        RxPiece::Place(r) => {
                            let k = (r.len as usize).min(rest.len() - at);
                            reg.slice_mut(r.stag, r.offset, k)
                                .expect("a planned range lies inside its region")
                                .copy_from_slice(&rest[at..at + k]);
                            k
                        }
                        RxPiece::Stage(n) => {
                            let k = n.min(rest.len() - at);
                            stage[soff..soff + k].copy_from_slice(&rest[at..at + k]);
                            soff += n;
                            k
                        }
                    };
                    at += k;
                }
                conn.rx_planned(plan, at, stage, reg);
                off += at;
            }
            RxStep::Place(r) => {
                let k = (r.len as usize).min(rest.len());
                let Some(dst) = reg.slice_mut(r.stag, r.offset, k) else {
                    // The driver ends the stream here (fail_local).
                    conn.fail_local(None, false);
                    continue;
                };
                dst.copy_from_slice(&rest[..k]);
                conn.rx_placed(&rest[..k]);
                off += k;
            }
            RxStep::Bytes(_) => {
                let whole = conn.rx_fpdu(rest, reg);
                let k = if whole > 0 { whole } else { conn.rx_bytes(rest, reg) };
                if k == 0 {
                    break;
                }
                off += k;
            }
            RxStep::Closed => off = data.len(),
            RxStep::Blocked => break,
        }
    }
    off
}

fn transmit(conn: &mut Connection, reg: &Registry<Vec<u8>>, out: &mut Vec<u8>) {
    for _ in 0..MAX_TX_ROUNDS {
        out.clear();
        if conn.poll_transmit(reg, out, 64 * 1024) == 0 {
            break;
        }
    }
}

fuzz_target!(|data: &[u8]| {
    if data.len() < HEADER {
        return;
    }
    let (head, stream) = data.split_at(HEADER);
    let crc = head[0] & 1 != 0;
    let markers = head[0] & 2 != 0;
    let p2p = head[0] & 4 != 0;
    let planned = head[0] & 8 != 0;
    let max_chunk = usize::from(head[1]);
    let mut rng = Rng(u32::from(u16::from_le_bytes([head[2], head[3]])) | 0x1_0000);

    let now = Instant::now();
    let mut ireg: Registry<Vec<u8>> = Registry::new();
    let ipd = ireg.alloc_pd();
    let mut icfg = Config::new(Role::Initiator, ipd);
    icfg.crc = crc;
    if p2p {
        icfg.p2p = Some(RtrOffer {
            write: true,
            read: false,
        });
    }
    let mut initiator = Connection::new(icfg, now);

    let mut reg: Registry<Vec<u8>> = Registry::new();
    let pd = reg.alloc_pd();
    let mut rcfg = Config::new(Role::Responder, pd);
    rcfg.markers = markers;
    let mut responder = Connection::new(rcfg, now);

    // MPA exchange in memory.
    let mut wire = Vec::new();
    initiator.poll_transmit(&ireg, &mut wire, usize::MAX);
    let n = responder.handle_input(&wire, &mut reg);
    assert_eq!(n, wire.len(), "responder took the whole MPA Request");
    let mut requested = false;
    while let Some(e) = responder.poll_event() {
        if matches!(e, Event::ConnectRequest(_)) {
            requested = true;
        }
    }
    assert!(requested, "MPA Request not delivered");
    responder.accept(&[]).expect("accept");
    wire.clear();
    responder.poll_transmit(&reg, &mut wire, usize::MAX);
    let n = initiator.handle_input(&wire, &mut ireg);
    assert_eq!(n, wire.len(), "initiator took the whole MPA Reply");
    let neg = responder
        .negotiated()
        .expect("responder negotiated")
        .clone();
    assert_eq!(neg.crc, crc);
    assert_eq!(neg.markers_rx, markers);
    drop(initiator);

    // Memory and work requests on the responder.
    let rights = Access::REMOTE_WRITE | Access::REMOTE_READ | Access::LOCAL_WRITE;
    let fill = |b: u8| (0..REGION_LEN).map(|i| (i as u8) ^ b).collect::<Vec<u8>>();
    let r1 = reg.register(pd, 0x1000, fill(0x00), rights, KEY);
    let r2 = reg.register(pd, 0x2000, fill(0x55), rights, KEY);
    let r3 = reg.register(pd, 0x3000, fill(0xaa), Access::ALL, KEY);
    debug_assert_eq!((r1, r2, r3), (0x111, 0x211, 0x311));
    let mut next_wr = 0u64;
    for i in 0..4u64 {
        next_wr += 1;
        responder
            .post_recv(RecvWr {
                wr_id: next_wr,
                sgl: Sge {
                    addr: 0x1000 + i * 1024,
                    length: 1024,
                    lkey: r1,
                }.into(),
            })
            .expect("post_recv");
    }
    responder
        .post_send(SendWr {
            wr_id: 100,
            op: SendOp::Send {
                solicited: false,
                invalidate: None,
            },
            sgl: Sge {
                addr: 0x3000,
                length: 64,
                lkey: r3,
            }.into(),
            signaled: true,
        })
        .expect("post_send");
    responder
        .post_send(SendWr {
            wr_id: 101,
            op: SendOp::Read {
                remote_addr: 0x9000,
                rkey: 0x2233,
            },
            sgl: Sge {
                addr: 0x2000,
                length: 512,
                lkey: r2,
            }.into(),
            signaled: true,
        })
        .expect("post_send read");
    drain(&mut responder, &mut next_wr);

    // The fuzzed stream, cut into chunks; unconsumed bytes are carried over
    // like an engine's receive buffer would.
    let mut out = Vec::new();
    let (mut plan, mut stage) = (Vec::new(), Vec::new());
    let mut pending: Vec<u8> = Vec::new();
    let mut off = 0;
    while off < stream.len() {
        let len = if max_chunk == 0 {
            stream.len() - off
        } else {
            (rng.next() as usize % max_chunk + 1).min(stream.len() - off)
        };
        pending.extend_from_slice(&stream[off..off + len]);
        off += len;
        let took = if planned {
            feed_planned(&mut responder, &pending, &mut reg, &mut plan, &mut stage)
        } else {
            responder.handle_input(&pending, &mut reg)
        };
        assert!(took <= pending.len());
        pending.drain(..took);
        drain(&mut responder, &mut next_wr);
        transmit(&mut responder, &reg, &mut out);
        drain(&mut responder, &mut next_wr);
        if took == 0 && pending.len() > 1 << 20 {
            // Stuck with a backlog: an established responder should never
            // block, but don't spin on it.
            break;
        }
    }

    // Teardown paths.
    responder.handle_timeout(now + Duration::from_secs(3600));
    responder.handle_eof();
    drain(&mut responder, &mut next_wr);
    transmit(&mut responder, &reg, &mut out);
    let _ = responder.is_finished();
});
