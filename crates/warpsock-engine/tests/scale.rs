//! Scale and data-path tests: 1,000 queue pairs at once in one process, a
//! 1 GiB transfer verified by checksum, caller memory registered raw (and
//! mlocked), small FPDUs with markers and CRC.

mod common;

use std::time::{Duration, Instant};

use common::{advertise, parse_adverts, pattern, send_wr, wait_n, LIMIT};
use warpsock_engine::proto::wire::crc::{self, Crc32c};
use warpsock_engine::{
    connect, Access, Context, Listener, Progress, QpInit, RecvWr, SendOp, SendWr, WcOpcode,
};

/// Resident bytes of this process.
fn rss() -> usize {
    let s = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: usize = s.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4096
}

/// Makes room for `n` descriptors (soft limit raised toward the hard one).
fn allow_fds(n: u64) {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `r` is a valid rlimit for the duration of both calls.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) == 0 && r.rlim_cur < n {
            r.rlim_cur = n.min(r.rlim_max);
            libc::setrlimit(libc::RLIMIT_NOFILE, &r);
        }
    }
}

/// 1,000 connections between two contexts in this process (responder:
/// progress thread, initiator: caller-driven, so the epoll path is used):
/// 2,000 queue pairs at once. Each carries a Send and a Write of its own
/// bytes; all are checked. Prints the resident memory per queue pair
/// (buffers allocated before the first measurement; kernel socket memory
/// is not in RSS): BENCHMARKS.md §3 takes the release build's figure.
#[test]
fn many_queue_pairs_at_once() {
    const QPS: usize = 1000;
    const LEN: usize = 4096;
    allow_fds(4 * QPS as u64 + 256);
    let l = Listener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel::<()>();
    let server = std::thread::spawn(move || {
        let c = Context::new(Progress::Thread).unwrap();
        let pd = c.alloc_pd();
        let cq = c.create_cq(QPS).unwrap();
        let rbuf = pd.alloc(QPS * LEN, Access::LOCAL_WRITE);
        let target = pd.alloc(QPS * LEN, Access::REMOTE_WRITE);
        let mut qps = Vec::new();
        for i in 0..QPS {
            let mut init = QpInit::new(&pd, &cq);
            init.recvs = vec![RecvWr {
                wr_id: i as u64,
                sgl: rbuf.sge(i * LEN, LEN as u32).into(),
            }];
            let req = l.accept(Some(LIMIT)).unwrap();
            let idx = u16::from_be_bytes(req.private_data().try_into().unwrap()) as usize;
            assert_eq!(idx, i);
            qps.push(req.accept(&init, &advertise(&[&target])).unwrap());
        }
        let wcs = wait_n(&cq, QPS);
        let mut seen = vec![false; QPS];
        for w in &wcs {
            assert!(w.is_ok() && w.byte_len as usize == LEN, "{w:?}");
            seen[w.wr_id as usize] = true;
            // The completion names the queue pair it arrived on.
            assert_eq!(w.qp_num, qps[w.wr_id as usize].qp_num());
        }
        assert!(seen.iter().all(|&s| s));
        ready_rx.recv_timeout(LIMIT).unwrap();
        let got = rbuf.to_vec();
        let written = target.to_vec();
        for i in 0..QPS {
            let want = pattern(LEN, i as u64);
            assert!(got[i * LEN..(i + 1) * LEN] == want[..], "Send of QP {i}");
            assert!(
                written[i * LEN..(i + 1) * LEN] == want[..],
                "Write of QP {i}"
            );
        }
        qps.len()
    });
    let c = Context::new(Progress::Caller).unwrap();
    let pd = c.alloc_pd();
    let cq = c.create_cq(2 * QPS).unwrap();
    let src = pd.alloc(QPS * LEN, Access::LOCAL_READ);
    for i in 0..QPS {
        src.write(i * LEN, &pattern(LEN, i as u64));
    }
    // The server allocates its buffers before it accepts (it cannot accept
    // before we connect): both sides' buffers are in this figure.
    let before = rss();
    let mut qps = Vec::new();
    for i in 0..QPS {
        let mut init = QpInit::new(&pd, &cq);
        init.options.private_data = (i as u16).to_be_bytes().to_vec();
        init.options.sq_depth = 4;
        init.options.rq_depth = 4;
        qps.push(connect(addr, &init).unwrap());
    }
    for (i, qp) in qps.iter().enumerate() {
        let (t_addr, t_key) = parse_adverts(&qp.negotiated().unwrap().peer_private_data)[0];
        qp.post_send(send_wr(i as u64, vec![src.sge(i * LEN, LEN as u32)]))
            .unwrap();
        qp.post_send(SendWr {
            wr_id: (QPS + i) as u64,
            op: SendOp::Write {
                remote_addr: t_addr + (i * LEN) as u64,
                rkey: t_key,
            },
            sgl: src.sge(i * LEN, LEN as u32).into(),
            signaled: true,
        })
        .unwrap();
    }
    let wcs = wait_n(&cq, 2 * QPS);
    assert!(wcs.iter().all(|w| w.is_ok()));
    let per_qp = rss().saturating_sub(before) / (2 * QPS);
    println!(
        "RSS per queue pair, {} queue pairs that each moved a Send and a Write: {per_qp} bytes",
        2 * QPS
    );
    ready_tx.send(()).unwrap();
    assert_eq!(server.join().unwrap(), QPS);
    // Generous (debug build, two contexts' staging); the target is 8 KiB.
    assert!(per_qp < 64 * 1024, "{per_qp} bytes per queue pair");
}

/// 1 GiB moved as 1 MiB RDMA Writes into a 64 MiB window, 16 rounds; after
/// each round the initiator sends the CRC32c of what it wrote and the
/// responder checks its window against it. CRC off (the data-path check is
/// end to end here).
#[test]
fn one_gib_transfer_verified_by_checksum() {
    const MIB: usize = 1 << 20;
    const WINDOW: usize = 64 * MIB;
    const ROUNDS: usize = 16; // 16 × 64 MiB = 1 GiB
    let l = Listener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let t0 = Instant::now();
    let server = std::thread::spawn(move || {
        let c = Context::new(Progress::Thread).unwrap();
        let pd = c.alloc_pd();
        let cq = c.create_cq(64).unwrap();
        let window = pd.alloc(WINDOW, Access::REMOTE_WRITE);
        let msg = pd.alloc(4, Access::LOCAL_WRITE);
        let ack = pd.register(b"ok".to_vec(), Access::LOCAL_READ);
        let mut init = QpInit::new(&pd, &cq);
        init.recvs = vec![RecvWr {
            wr_id: 0,
            sgl: msg.sge(0, 4).into(),
        }];
        let qp = l
            .accept_qp(&init, &advertise(&[&window]), Some(LIMIT))
            .unwrap();
        let mut total = 0u64;
        for round in 0..ROUNDS {
            let w = wait_n(&cq, 1);
            assert!(w[0].is_ok() && w[0].opcode == WcOpcode::Recv, "{w:?}");
            let mut want = [0u8; 4];
            msg.read(0, &mut want);
            let got = window.with_bytes(crc::crc32c);
            assert_eq!(got, u32::from_be_bytes(want), "round {round} checksum");
            total += WINDOW as u64;
            qp.post_recv(RecvWr {
                wr_id: round as u64 + 1,
                sgl: msg.sge(0, 4).into(),
            })
            .unwrap();
            qp.post_send(send_wr(100 + round as u64, vec![ack.sge(0, 2)]))
                .unwrap();
            assert!(wait_n(&cq, 1)[0].is_ok());
        }
        total
    });
    let c = Context::new(Progress::Caller).unwrap();
    let pd = c.alloc_pd();
    let cq = c.create_cq(256).unwrap();
    // Source: 72 MiB of pseudo-random bytes; round r writes chunk k from a
    // different offset, so every round's window differs.
    let src = pd.register(pattern(WINDOW + 8 * MIB, 42), Access::LOCAL_READ);
    let note = pd.alloc(4, Access::LOCAL_READ);
    let ackbuf = pd.alloc(8, Access::LOCAL_WRITE);
    let mut init = QpInit::new(&pd, &cq);
    init.recvs = (0..ROUNDS as u64)
        .map(|i| RecvWr {
            wr_id: 1000 + i,
            sgl: ackbuf.sge(0, 8).into(),
        })
        .collect();
    let qp = connect(addr, &init).unwrap();
    let (w_addr, w_key) = parse_adverts(&qp.negotiated().unwrap().peer_private_data)[0];
    for round in 0..ROUNDS {
        let shift = round * (MIB / 2 + 8);
        let mut crc = Crc32c::new();
        for k in 0..WINDOW / MIB {
            let off = shift + k * MIB;
            qp.post_send(SendWr {
                wr_id: k as u64,
                op: SendOp::Write {
                    remote_addr: w_addr + (k * MIB) as u64,
                    rkey: w_key,
                },
                sgl: src.sge(off, MIB as u32).into(),
                signaled: k % 16 == 15,
            })
            .unwrap();
            src.with_bytes(|b| crc.update(&b[off..off + MIB]));
        }
        note.write(0, &crc.value().to_be_bytes());
        qp.post_send(send_wr(9999, vec![note.sge(0, 4)])).unwrap();
        // 4 signaled Writes, the note, the responder's ack.
        let w = wait_n(&cq, 6);
        assert!(w.iter().all(|w| w.is_ok()), "{w:?}");
    }
    assert_eq!(server.join().unwrap(), (ROUNDS * WINDOW) as u64);
    let took = t0.elapsed();
    eprintln!(
        "1 GiB verified in {took:?} ({:.2} GB/s incl. checksums)",
        (ROUNDS * WINDOW) as f64 / took.as_secs_f64() / 1e9
    );
    assert!(took < Duration::from_secs(60));
}

/// Caller memory registered with `register_raw` (and mlocked) is placed
/// into directly; small FPDUs with markers and CRC on exercise framing
/// that crosses many segments.
#[test]
fn raw_memory_markers_small_fpdus() {
    const LEN: usize = 70_000;
    let l = Listener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let server = std::thread::spawn(move || {
        let c = Context::new(Progress::Caller).unwrap();
        let pd = c.alloc_pd();
        let cq = c.create_cq(8).unwrap();
        let mut mem = vec![0u8; 2 * LEN];
        // SAFETY: `mem` outlives the Mr (dropped at the end of this
        // closure, before `mem`) and is only read after the completion.
        let mr = unsafe {
            pd.register_raw(
                mem.as_mut_ptr(),
                mem.len(),
                Access::LOCAL_WRITE | Access::REMOTE_WRITE,
            )
        };
        assert_eq!(mr.addr(), mem.as_ptr() as u64);
        // mlock may be refused by RLIMIT_MEMLOCK; it must not break anything.
        let locked = mr.mlock().is_ok();
        assert_eq!(mr.is_locked(), locked);
        let mut init = QpInit::new(&pd, &cq);
        init.options.markers = true;
        init.options.crc = true;
        init.options.mulpdu = Some(200);
        init.recvs = vec![RecvWr {
            wr_id: 1,
            sgl: mr.sge(LEN, LEN as u32).into(),
        }];
        let qp = l.accept_qp(&init, &advertise(&[&mr]), Some(LIMIT)).unwrap();
        let w = wait_n(&cq, 1);
        assert!(w[0].is_ok() && w[0].byte_len as usize == LEN);
        let neg = qp.negotiated().unwrap();
        assert!(neg.crc && neg.markers_rx && neg.markers_tx);
        drop(qp);
        drop(mr);
        assert!(mem[..LEN] == pattern(LEN, 5)[..], "Write into raw memory");
        assert!(mem[LEN..] == pattern(LEN, 6)[..], "Send into raw memory");
    });
    let c = Context::new(Progress::Thread).unwrap();
    let pd = c.alloc_pd();
    let cq = c.create_cq(8).unwrap();
    let a = pd.register(pattern(LEN, 5), Access::LOCAL_READ);
    let b = pd.register(pattern(LEN, 6), Access::LOCAL_READ);
    let mut init = QpInit::new(&pd, &cq);
    init.options.markers = true;
    init.options.mulpdu = Some(300);
    let qp = connect(addr, &init).unwrap();
    let (t_addr, t_key) = parse_adverts(&qp.negotiated().unwrap().peer_private_data)[0];
    qp.post_send(SendWr {
        wr_id: 1,
        op: SendOp::Write {
            remote_addr: t_addr,
            rkey: t_key,
        },
        sgl: a.sge(0, LEN as u32).into(),
        signaled: true,
    })
    .unwrap();
    qp.post_send(send_wr(2, vec![b.sge(0, LEN as u32)]))
        .unwrap();
    let w = wait_n(&cq, 2);
    assert!(w.iter().all(|w| w.is_ok()));
    server.join().unwrap();
}
