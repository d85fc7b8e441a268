//! 1,000 connections (2,000 queue pairs) in one process, each moving data,
//! and the resident memory they take. Alone in its test binary: RSS is per
//! process.

mod common;

use common::{advertise, parse_adverts, pattern, send_wr, wait_n, LIMIT};
use warpsock_engine::{
    connect, Access, Context, Listener, Progress, QpInit, RecvWr, SendOp, SendWr,
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
    // Generous (debug build, both sides, buffers the data was placed in);
    // BENCHMARKS.md has the release figure. This test has a process of its
    // own: RSS is per process, and a test running beside it in the same
    // binary (the 1 GiB transfer) would be counted (76 KB per QP).
    assert!(per_qp < 16 * 1024, "{per_qp} bytes per queue pair");
}
