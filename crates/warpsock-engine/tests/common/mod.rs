//! Shared scenarios for the socket tests: a responder that exposes memory
//! and checks what arrives, and an initiator that runs every operation
//! against it. Used between threads and between processes.
#![allow(dead_code, unreachable_pub)]

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use warpsock_engine::{
    connect, Access, Context, Listener, Mr, Progress, Qp, QpInit, RecvWr, SendOp, SendWr, Stag, Wc,
    WcOpcode,
};

pub use warpsock_testkit::{pattern, send_wr, wait_n, LIMIT};

/// Address + rkey of a region, for private data.
pub fn advertise(mrs: &[&Mr]) -> Vec<u8> {
    let mut v = Vec::new();
    for m in mrs {
        v.extend_from_slice(&m.addr().to_be_bytes());
        v.extend_from_slice(&m.rkey().to_be_bytes());
    }
    v
}

/// Parses what [`advertise`] wrote.
pub fn parse_adverts(pd: &[u8]) -> Vec<(u64, Stag)> {
    pd.chunks_exact(12)
        .map(|c| {
            (
                u64::from_be_bytes(c[..8].try_into().unwrap()),
                u32::from_be_bytes(c[8..].try_into().unwrap()),
            )
        })
        .collect()
}

/// Sizes used by the every-operation scenario.
pub const SEND_LEN: usize = 100_000;
pub const WRITE_LEN: usize = 150_000;
pub const WRITE_OFF: u64 = 7;
pub const READ_LEN: usize = 120_000;
pub const READ_OFF: u64 = 3;
/// Responder verdict bytes (all 1 when everything checked out).
pub const VERDICT_LEN: usize = 4;

/// Responder side of the every-operation scenario: exposes a Write
/// target, a Read source and an invalidatable region; pre-posts receives;
/// checks the multi-SGE Send, the Send+SE, the Send+Invalidate and the
/// final Send, then answers with a verdict Send. Returns the verdict.
pub fn serve_every_op(listener: &Listener, progress: Progress, crc: bool) -> Vec<u8> {
    let ctx = Context::new(progress).unwrap();
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq(64).unwrap();
    let target = pd.alloc(WRITE_LEN + 4096, Access::REMOTE_WRITE | Access::REMOTE_READ);
    let source = pd.register(pattern(READ_LEN + 4096, 3), Access::REMOTE_READ);
    let inv = pd.alloc(64, Access::REMOTE_WRITE | Access::REMOTE_INVALIDATE);
    let rbuf = pd.alloc(SEND_LEN + 3 * 64, Access::LOCAL_WRITE);
    let verdict = pd.alloc(VERDICT_LEN, Access::LOCAL_READ);
    let mut init = QpInit::new(&pd, &cq);
    init.options.crc = crc;
    // R1 scatters a 100,000-byte Send over two SGEs; R2..R4 are small.
    init.recvs = vec![
        RecvWr {
            wr_id: 1,
            sgl: [
                rbuf.sge(0, 30_000),
                rbuf.sge(30_000, (SEND_LEN - 30_000) as u32),
            ]
            .into(),
        },
        RecvWr {
            wr_id: 2,
            sgl: rbuf.sge(SEND_LEN, 64).into(),
        },
        RecvWr {
            wr_id: 3,
            sgl: rbuf.sge(SEND_LEN + 64, 64).into(),
        },
        RecvWr {
            wr_id: 4,
            sgl: rbuf.sge(SEND_LEN + 128, 64).into(),
        },
    ];
    let req = listener.accept(Some(LIMIT)).unwrap();
    assert_eq!(req.private_data(), b"every-op");
    let qp = req
        .accept(&init, &advertise(&[&target, &source, &inv]))
        .unwrap();
    let wcs = wait_n(&cq, 4);
    let mut v = vec![0u8; VERDICT_LEN];
    let by_id = |id| wcs.iter().find(|w| w.wr_id == id).copied().unwrap();
    let (r1, r2, r3, r4) = (by_id(1), by_id(2), by_id(3), by_id(4));
    let got = rbuf.to_vec();
    v[0] = u8::from(
        r1.is_ok()
            && r1.opcode == WcOpcode::Recv
            && r1.byte_len as usize == SEND_LEN
            && got[..SEND_LEN] == pattern(SEND_LEN, 1)[..],
    );
    v[1] = u8::from(r2.is_ok() && r2.solicited && r2.byte_len == 10 && !r1.solicited);
    v[2] = u8::from(r3.is_ok() && r3.invalidated == Some(inv.rkey()) && r3.byte_len == 5);
    v[3] = u8::from(r4.is_ok() && &got[SEND_LEN + 128..SEND_LEN + 132] == b"done");
    verdict.write(0, &v);
    assert_eq!(qp.negotiated().unwrap().crc, crc);
    qp.post_send(send_wr(9, vec![verdict.sge(0, VERDICT_LEN as u32)]))
        .unwrap();
    let w = wait_n(&cq, 1);
    assert!(w[0].is_ok(), "{w:?}");
    // Stay until the initiator disconnects (its Reads must be answered).
    let deadline = Instant::now() + LIMIT;
    while !qp.is_closed() && Instant::now() < deadline {
        let mut b = [Wc::default(); 4];
        cq.wait(&mut b, Duration::from_millis(20)).unwrap();
    }
    assert!(qp.is_closed(), "initiator never disconnected");
    v
}

/// Initiator side of the every-operation scenario. Panics on any mismatch.
pub fn run_every_op(addr: SocketAddr, progress: Progress, crc: bool) {
    let ctx = Context::new(progress).unwrap();
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq(64).unwrap();
    let src = pd.register(pattern(400_000, 1), Access::LOCAL_READ);
    let wsrc = pd.register(pattern(WRITE_LEN, 2), Access::LOCAL_READ);
    let sink = pd.alloc(READ_LEN + WRITE_LEN, Access::LOCAL_WRITE);
    let verdict = pd.alloc(64, Access::LOCAL_WRITE);
    let mut init = QpInit::new(&pd, &cq);
    init.options.private_data = b"every-op".to_vec();
    init.recvs = vec![RecvWr {
        wr_id: 100,
        sgl: verdict.sge(0, 64).into(),
    }];
    let qp = connect(addr, &init).unwrap();
    let neg = qp.negotiated().unwrap();
    assert_eq!(neg.crc, crc);
    let ads = parse_adverts(&neg.peer_private_data);
    let [(t_addr, t_key), (s_addr, s_key), (_, inv_key)] = ads[..] else {
        panic!("bad private data {ads:?}")
    };
    // 1. Send gathered from two SGEs (pattern(SEND_LEN, 1) = src[..SEND_LEN]).
    let wrs = vec![
        send_wr(1, vec![src.sge(0, 60_000), src.sge(60_000, 40_000)]),
        // 2. Send with Solicited Event.
        SendWr {
            wr_id: 2,
            op: SendOp::Send {
                solicited: true,
                invalidate: None,
            },
            sgl: src.sge(0, 10).into(),
            signaled: true,
        },
        // 3. Send with Invalidate of the peer's region.
        SendWr {
            wr_id: 3,
            op: SendOp::Send {
                solicited: false,
                invalidate: Some(inv_key),
            },
            sgl: src.sge(0, 5).into(),
            signaled: true,
        },
        // 4. Write gathered from three SGEs.
        SendWr {
            wr_id: 4,
            op: SendOp::Write {
                remote_addr: t_addr + WRITE_OFF,
                rkey: t_key,
            },
            sgl: [
                wsrc.sge(0, 1_000),
                wsrc.sge(1_000, 99_000),
                wsrc.sge(100_000, (WRITE_LEN - 100_000) as u32),
            ]
            .into(),
            signaled: true,
        },
        // 5. Read of the peer's source.
        SendWr {
            wr_id: 5,
            op: SendOp::Read {
                remote_addr: s_addr + READ_OFF,
                rkey: s_key,
            },
            sgl: sink.sge(0, READ_LEN as u32).into(),
            signaled: true,
        },
        // 6. Read back what the Write put there.
        SendWr {
            wr_id: 6,
            op: SendOp::Read {
                remote_addr: t_addr + WRITE_OFF,
                rkey: t_key,
            },
            sgl: sink.sge(READ_LEN, WRITE_LEN as u32).into(),
            signaled: true,
        },
    ];
    for wr in wrs {
        qp.post_send(wr).unwrap();
    }
    let done = pd.register(b"done".to_vec(), Access::LOCAL_READ);
    qp.post_send(send_wr(7, vec![done.sge(0, 4)])).unwrap();
    let mut wcs = wait_n(&cq, 8);
    wcs.sort_by_key(|w| w.wr_id);
    for (i, w) in wcs[..7].iter().enumerate() {
        assert!(w.is_ok(), "{w:?}");
        assert_eq!(w.wr_id, i as u64 + 1);
    }
    assert_eq!(wcs[3].opcode, WcOpcode::RdmaWrite);
    assert_eq!(wcs[4].opcode, WcOpcode::RdmaRead);
    assert_eq!(wcs[4].byte_len as usize, READ_LEN);
    let got = sink.to_vec();
    let want_read = pattern(READ_LEN + 4096, 3);
    assert!(
        got[..READ_LEN] == want_read[READ_OFF as usize..READ_OFF as usize + READ_LEN],
        "Read data differs"
    );
    assert!(
        got[READ_LEN..] == pattern(WRITE_LEN, 2)[..],
        "Write data differs"
    );
    let v = &wcs[7];
    assert_eq!((v.wr_id, v.byte_len as usize), (100, VERDICT_LEN));
    let mut verdict_bytes = [0u8; VERDICT_LEN];
    verdict.read(0, &mut verdict_bytes);
    assert_eq!(
        verdict_bytes, [1; VERDICT_LEN],
        "responder verdict: [multi-SGE Send, Send+SE, Send+Inv, final Send]"
    );
    qp.disconnect();
}

/// The peer process: the test binary itself, running one `#[test]` that
/// reads its role from the environment.
pub struct Peer {
    pub child: Child,
    pub addr: SocketAddr,
}

impl Peer {
    /// Spawns `test_name` of this test binary with `WARPSOCK_PEER=role`
    /// and waits for it to print `LISTEN <addr>`.
    pub fn spawn(test_name: &str, role: &str) -> Self {
        let exe = std::env::current_exe().unwrap();
        let mut child = Command::new(exe)
            .args(["--exact", test_name, "--nocapture", "--test-threads=1"])
            .env("WARPSOCK_PEER", role)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let out = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                // The harness may print "test peer_main ... " on the same line.
                if let Some(at) = line.find("LISTEN ") {
                    let _ = tx.send(line[at + 7..].trim().parse::<SocketAddr>().unwrap());
                }
            }
        });
        let Ok(addr) = rx.recv_timeout(LIMIT) else {
            let _ = child.kill();
            panic!("peer process did not start listening");
        };
        Self { child, addr }
    }

    /// Waits (bounded) for the peer to exit and returns whether it succeeded.
    pub fn join(mut self) -> bool {
        let deadline = Instant::now() + LIMIT;
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                return st.success();
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                return false;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// In a peer process: the role it was spawned with.
pub fn peer_role() -> Option<String> {
    std::env::var("WARPSOCK_PEER").ok()
}

/// In a peer process: binds a listener and announces its address.
pub fn peer_listen() -> Listener {
    let l = Listener::bind("127.0.0.1:0").unwrap();
    println!("LISTEN {}", l.local_addr().unwrap());
    l
}

/// Keeps a queue pair referenced (for tests that only need it alive).
pub fn keep(_qp: &Qp) {}
