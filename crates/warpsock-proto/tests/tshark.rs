//! Wireshark's own iWARP dissectors validate the bytes the core produces:
//! an in-memory session (every operation, a gathered Send among them, CRC
//! on, plus a Terminate) is
//! written to a pcap as a TCP conversation on port 7174 and decoded by
//! tshark. Every FPDU must dissect as MPA/DDP/RDMAP with a good CRC, and
//! the opcode sequence must match what was sent.
//!
//! tshark is installed by `scripts/test.sh`; with `WARPSOCK_REQUIRE_TSHARK=1`
//! (set there) a missing tshark fails the test instead of skipping it.

mod util;

use std::path::Path;
use std::process::Command;

use util::{pattern, recv_wr, Cut, Pair};
use warpsock_proto::conn::pieces_of;
use warpsock_proto::wire::fpdu;
use warpsock_proto::{Access, SendOp, SendWr, Sge, Sgl};

/// Minimal pcap writer: Ethernet/IPv4/TCP, one direction per call.
struct Pcap {
    out: Vec<u8>,
    seq: [u32; 2],
    t: u32,
}

const PORTS: [u16; 2] = [40000, 7174];

impl Pcap {
    fn new() -> Self {
        let mut out = Vec::new();
        for v in [
            0xa1b2_c3d4u32.to_le_bytes().as_slice(),
            &2u16.to_le_bytes(),
            &4u16.to_le_bytes(),
        ] {
            out.extend_from_slice(v);
        }
        out.extend_from_slice(&[0; 8]);
        out.extend_from_slice(&262_144u32.to_le_bytes());
        out.extend_from_slice(&1u32.to_le_bytes());
        Self {
            out,
            seq: [1000, 5000],
            t: 0,
        }
    }

    fn packet(&mut self, dir: usize, flags: u8, payload: &[u8]) {
        let mut p = Vec::new();
        p.extend_from_slice(&[
            2,
            0,
            0,
            0,
            0,
            2 - dir as u8,
            2,
            0,
            0,
            0,
            0,
            1 + dir as u8,
            0x08,
            0x00,
        ]);
        let tot = (20 + 20 + payload.len()) as u16;
        let mut ip = vec![
            0x45,
            0,
            0,
            0,
            0,
            0,
            0x40,
            0,
            64,
            6,
            0,
            0,
            127,
            0,
            0,
            1 + dir as u8,
            127,
            0,
            0,
            2 - dir as u8,
        ];
        ip[2..4].copy_from_slice(&tot.to_be_bytes());
        let sum = ip
            .chunks(2)
            .map(|c| u32::from(u16::from_be_bytes([c[0], c[1]])))
            .sum::<u32>();
        let sum = !(((sum & 0xffff) + (sum >> 16)) as u16);
        ip[10..12].copy_from_slice(&sum.to_be_bytes());
        p.extend_from_slice(&ip);
        let mut tcp = [0u8; 20];
        tcp[0..2].copy_from_slice(&PORTS[dir].to_be_bytes());
        tcp[2..4].copy_from_slice(&PORTS[1 - dir].to_be_bytes());
        tcp[4..8].copy_from_slice(&self.seq[dir].to_be_bytes());
        tcp[8..12].copy_from_slice(&self.seq[1 - dir].to_be_bytes());
        tcp[12] = 5 << 4;
        tcp[13] = flags;
        tcp[14..16].copy_from_slice(&65535u16.to_be_bytes());
        p.extend_from_slice(&tcp);
        p.extend_from_slice(payload);
        self.seq[dir] =
            self.seq[dir].wrapping_add(payload.len() as u32 + u32::from(flags & 0x03 != 0));
        self.t += 1;
        self.out.extend_from_slice(&(self.t / 1000).to_le_bytes());
        self.out.extend_from_slice(&(self.t % 1000).to_le_bytes());
        self.out.extend_from_slice(&(p.len() as u32).to_le_bytes());
        self.out.extend_from_slice(&(p.len() as u32).to_le_bytes());
        self.out.extend_from_slice(&p);
    }

    fn handshake(&mut self) {
        self.packet(0, 0x02, &[]);
        self.packet(1, 0x12, &[]);
        self.packet(0, 0x10, &[]);
    }

    /// Sends `bytes` as 1448-byte segments.
    fn stream(&mut self, dir: usize, bytes: &[u8]) {
        for c in bytes.chunks(1448) {
            self.packet(dir, 0x18, c);
        }
    }
}

/// Walks an FPDU stream (after the MPA frame) and returns the opcodes.
fn opcodes(stream: &[u8]) -> Vec<u8> {
    let mut v = Vec::new();
    let mut at = 0;
    while let Some((_, total)) = fpdu::peek_len(&stream[at..]) {
        v.push(stream[at + 3] & 0x0f);
        at += total;
    }
    assert_eq!(at, stream.len(), "stream is whole FPDUs");
    v
}

fn tshark_available() -> bool {
    let ok = Command::new("tshark")
        .arg("-v")
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok && std::env::var("WARPSOCK_REQUIRE_TSHARK").as_deref() == Ok("1") {
        panic!("tshark is required (WARPSOCK_REQUIRE_TSHARK=1) but not installed");
    }
    ok
}

fn tshark(cap: &Path, args: &[&str]) -> String {
    let o = Command::new("tshark")
        .arg("-r")
        .arg(cap)
        .args(["-o", "tcp.try_heuristic_first:TRUE"])
        .args(args)
        .output()
        .expect("run tshark");
    assert!(
        o.status.success(),
        "tshark failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout).unwrap()
}

#[test]
fn wireshark_decodes_every_fpdu_with_good_crc() {
    if !tshark_available() {
        eprintln!("tshark not installed: skipped (scripts/test.sh installs it)");
        return;
    }
    let mut p = Pair::new(|c| c.crc = true, |_| {}, Cut::Whole);
    p.establish();
    let src = p.a.region(0, pattern(20_000, 1), Access::LOCAL_READ);
    let sink = p.a.region(0x10000, vec![0; 6000], Access::LOCAL_WRITE);
    let rbuf = p.b.region(0, vec![0; 9000], Access::LOCAL_WRITE);
    let wreg = p.b.region(0x8000, vec![0; 9000], Access::REMOTE_WRITE);
    let rsrc = p.b.region(0x9000, pattern(9000, 2), Access::REMOTE_READ);
    p.b.conn
        .post_recv(recv_wr(
            1,
            Sge {
                addr: 0,
                length: 9000,
                lkey: rbuf,
            }
            .into(),
        ))
        .unwrap();
    // First a Send framed at once with its payload gathered from where it
    // is (`Connection::send_gathered`, the engine's bulk copied sends):
    // several FPDUs, their heads, payload pieces and CRC-bearing trailers
    // put on the wire in order. It takes b's receive posted above; the
    // Send below, this second one.
    let gbuf = p.b.region(0x20000, vec![0; 9000], Access::LOCAL_WRITE);
    p.b.conn
        .post_recv(recv_wr(
            2,
            Sgl::from(Sge {
                addr: 0x20000,
                length: 9000,
                lkey: gbuf,
            }),
        ))
        .unwrap();
    let gdata = pattern(7000, 3);
    let parts = [&gdata[..100], &gdata[100..]];
    let mut frames = Vec::new();
    assert!(p.a.conn.send_gathered(&parts, &mut frames, 64));
    assert!(frames.len() > 2, "{} FPDUs", frames.len());
    let mut wire = Vec::new();
    for f in &frames {
        wire.extend_from_slice(f.head());
        pieces_of(&parts, f.payload(), |b| wire.extend_from_slice(b));
        wire.extend_from_slice(f.trailer());
    }
    assert_eq!(p.b.conn.handle_input(&wire, &mut p.b.reg), wire.len());
    p.a.sent.extend_from_slice(&wire);
    p.run();
    assert!(
        p.b.mem(rbuf)[..7000] == gdata[..],
        "the gathered Send's bytes differ"
    );
    let sge = |addr, length, lkey| Sgl::from(Sge { addr, length, lkey });
    for (id, op, sgl) in [
        (
            1,
            SendOp::Send {
                solicited: true,
                invalidate: None,
            },
            sge(0, 5000, src),
        ),
        (
            2,
            SendOp::Write {
                remote_addr: 0x8000,
                rkey: wreg,
            },
            sge(0, 8000, src),
        ),
        (
            3,
            SendOp::Read {
                remote_addr: 0x9000,
                rkey: rsrc,
            },
            sge(0x10000, 6000, sink),
        ),
    ] {
        p.a.conn
            .post_send(SendWr {
                wr_id: id,
                op,
                sgl,
                signaled: true,
            })
            .unwrap();
    }
    p.run();
    assert_eq!(p.a.mem(sink), &pattern(9000, 2)[..6000]);
    // End with a Terminate from the responder (a Write to a bad STag).
    p.a.conn
        .post_send(SendWr {
            wr_id: 4,
            op: SendOp::Write {
                remote_addr: 0,
                rkey: 0xdead00,
            },
            sgl: sge(0, 10, src),
            signaled: true,
        })
        .unwrap();
    p.run();

    let mut cap = Pcap::new();
    cap.handshake();
    cap.stream(0, &p.a.sent[..24]);
    cap.stream(1, &p.b.sent[..24]);
    cap.stream(0, &p.a.sent[24..]);
    cap.stream(1, &p.b.sent[24..]);
    let dir = std::env::temp_dir().join(format!("warpsock-tshark-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("session.pcap");
    std::fs::write(&file, &cap.out).unwrap();

    let mut want: Vec<u8> = opcodes(&p.a.sent[24..]);
    let b_ops = opcodes(&p.b.sent[24..]);
    let total = want.len() + b_ops.len();
    // The gathered Send (3) segments, Send with SE (5) segments, Write (0)
    // segments, Read Request (1) from a; Read Response (2) segments and
    // the Terminate (7) from b.
    assert!(
        want.contains(&3) && want.contains(&5) && want.contains(&0) && want.contains(&1),
        "{want:?}"
    );
    assert_eq!(b_ops.last(), Some(&7));
    want.extend_from_slice(&b_ops);

    let fields = tshark(
        &file,
        &[
            "-Y",
            "iwarp_rdma",
            "-T",
            "fields",
            "-e",
            "tcp.srcport",
            "-e",
            "iwarp_rdma.opcode",
        ],
    );
    let seen: Vec<(u16, u8)> = fields
        .lines()
        .flat_map(|l| {
            let mut it = l.split('\t');
            let port: u16 = it.next().unwrap().parse().unwrap();
            let ops: Vec<u8> = it
                .next()
                .unwrap()
                .split(',')
                .map(|o| u8::from_str_radix(o.trim_start_matches("0x"), 16).unwrap())
                .collect();
            ops.into_iter().map(move |o| (port, o))
        })
        .collect();
    assert_eq!(
        seen.len(),
        total,
        "every FPDU dissected as RDMAP:\n{fields}"
    );
    let mut a_seen: Vec<u8> = seen
        .iter()
        .filter(|s| s.0 == PORTS[0])
        .map(|s| s.1)
        .collect();
    let b_seen: Vec<u8> = seen
        .iter()
        .filter(|s| s.0 == PORTS[1])
        .map(|s| s.1)
        .collect();
    a_seen.extend_from_slice(&b_seen);
    assert_eq!(a_seen, want);

    let verbose = tshark(&file, &["-V"]);
    assert_eq!(verbose.matches("Bad CRC32").count(), 0);
    assert_eq!(
        verbose.matches("Good CRC32").count(),
        total,
        "one good CRC per FPDU"
    );
    // The Terminate decodes as DDP tagged buffer / invalid STag.
    let term = tshark(
        &file,
        &[
            "-Y",
            "iwarp_rdma.opcode == 7",
            "-T",
            "fields",
            "-e",
            "iwarp_rdma.term_layer",
            "-e",
            "iwarp_rdma.term_etype_ddp",
            "-e",
            "iwarp_rdma.term_errcode_ddp_tagged",
            "-e",
            "iwarp_rdma.term_ddp_seg_len",
        ],
    );
    assert_eq!(
        term.trim(),
        "0x01\t0x01\t0x00\t0018",
        "layer DDP, tagged buffer, invalid STag, segment length 24"
    );
    std::fs::remove_dir_all(&dir).ok();
}
