//! The public API's guarantees: region closures may call back into the
//! engine, every work request completes exactly once (also when a
//! dropped queue pair's linger ends with bytes unwritten), batch posts
//! say how far they got, STag keys are unpredictable.

mod common;

use std::collections::HashSet;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::{pattern, send_wr, wait_n, LIMIT};
use warpsock_engine::{
    connect, Access, BatchPostError, CloseReason, Context, ContextOptions, Listener, PostError,
    Progress, QpInit, RecvWr, Wc, WcStatus,
};

/// Runs `f` on another thread and fails if it has not returned within
/// `limit` (a deadlock becomes a failure instead of a hung test run).
fn within<T: Send + 'static>(limit: Duration, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(limit)
        .unwrap_or_else(|_| panic!("did not finish within {limit:?} (deadlock?)"))
}

/// A peer that accepts one connection with `n` receives of `len` bytes
/// posted (progress thread), waits for them to complete and returns the
/// completions and what was received.
fn receiving_peer(l: &Listener, n: u64, len: usize) -> (Vec<Wc>, Vec<u8>) {
    let ctx = Context::new(Progress::Thread).unwrap();
    let (pd, cq) = (ctx.alloc_pd(), ctx.create_cq(8).unwrap());
    let buf = pd.alloc(n as usize * len, Access::LOCAL_WRITE);
    let mut init = QpInit::new(&pd, &cq);
    init.recvs = (0..n)
        .map(|i| RecvWr {
            wr_id: i,
            sgl: buf.sge(i as usize * len, len as u32).into(),
        })
        .collect();
    let _qp = l.accept_qp(&init, b"", Some(LIMIT)).unwrap();
    let w = wait_n(&cq, n as usize);
    (w, buf.to_vec())
}

/// `mr.with_bytes(|b| qp.post_send(…))` used to deadlock on the context
/// lock. The closure now runs outside it: posting (and polling) from
/// inside works in both progress modes, for reading and writing closures;
/// a post made while a closure writes region bytes goes out when the
/// closure returns.
#[test]
fn region_closures_may_call_back_into_the_engine() {
    for progress in [Progress::Caller, Progress::Thread] {
        within(LIMIT, move || {
            let l = Listener::bind("127.0.0.1:0").unwrap();
            let addr = l.local_addr().unwrap();
            let peer = std::thread::spawn(move || {
                let (w, bytes) = receiving_peer(&l, 2, 32);
                assert!(w.iter().all(Wc::is_ok), "{w:?}");
                bytes
            });
            let ctx = Context::new(progress).unwrap();
            let (pd, cq) = (ctx.alloc_pd(), ctx.create_cq(8).unwrap());
            let qp = connect(addr, &QpInit::new(&pd, &cq)).unwrap();
            let src = pd.register(pattern(64, 3), Access::LOCAL_READ);
            let mut got = Vec::new();
            // Reading closure: post, then poll, from inside.
            src.with_bytes(|b| {
                assert_eq!(b, &pattern(64, 3)[..]);
                qp.post_send(send_wr(1, vec![src.sge(0, 32)])).unwrap();
                let mut wc = [Wc::default(); 2];
                let n = cq.poll(&mut wc);
                got.extend_from_slice(&wc[..n]);
                // A wait from inside never blocks on the closure itself,
                // whatever its timeout (the Send's completion was polled
                // above: nothing is queued). Caller-driven, it is the
                // blocking wait's first round that must see the borrow.
                let n = cq.wait(&mut wc, Duration::from_secs(3600)).unwrap();
                got.extend_from_slice(&wc[..n]);
            });
            // Writing closure: change the bytes, post them; they leave
            // once the closure is done.
            src.with_bytes_mut(|b| {
                b[32..].fill(0xab);
                qp.post_send(send_wr(2, vec![src.sge(32, 32)])).unwrap();
                // Nor inside a writing closure (whose Send waits for it).
                let mut wc = [Wc::default(); 2];
                let n = cq.wait(&mut wc, Duration::from_secs(3600)).unwrap();
                got.extend_from_slice(&wc[..n]);
            });
            let until = Instant::now() + LIMIT;
            while got.len() < 2 && Instant::now() < until {
                let mut wc = [Wc::default(); 2];
                let n = cq.wait(&mut wc, Duration::from_millis(50)).unwrap();
                got.extend_from_slice(&wc[..n]);
            }
            assert_eq!(got.len(), 2, "{got:?}");
            assert!(got.iter().all(Wc::is_ok), "{got:?}");
            let received = peer.join().unwrap();
            assert_eq!(&received[..32], &pattern(64, 3)[..32]);
            assert!(received[32..].iter().all(|&b| b == 0xab));
        });
    }
}

/// Borrowing a region mutably inside a closure that reads it (same
/// thread) is a bug, reported at once instead of a silent aliasing.
#[test]
#[should_panic(expected = "already borrowed")]
fn nested_conflicting_borrow_of_one_region_panics() {
    let ctx = Context::new(Progress::Caller).unwrap();
    let pd = ctx.alloc_pd();
    let m = pd.alloc(8, Access::LOCAL_WRITE);
    m.with_bytes(|_| m.write(0, &[1]));
}

/// Keys are random (RFC 5042 §5): 64 registrations are not the sequence
/// 0x101, 0x202, ... that made STags guessable, and keep the siw layout
/// `index << 8 | key` with distinct indices.
#[test]
fn stag_keys_are_unpredictable_in_the_siw_layout() {
    let ctx = Context::new(Progress::Caller).unwrap();
    let pd = ctx.alloc_pd();
    let mrs: Vec<_> = (0..64).map(|_| pd.alloc(16, Access::REMOTE_READ)).collect();
    let indices: HashSet<u32> = mrs.iter().map(|m| m.rkey() >> 8).collect();
    assert_eq!(indices.len(), 64, "one index per region");
    assert!(indices.iter().all(|&i| i > 0), "index 0 is never used");
    let keys: Vec<u8> = mrs.iter().map(|m| m.rkey() as u8).collect();
    let sequential = keys
        .windows(2)
        .filter(|w| w[1] == w[0].wrapping_add(1))
        .count();
    assert!(sequential < 8, "keys follow each other: {keys:?}");
    let distinct: HashSet<u8> = keys.iter().copied().collect();
    assert!(distinct.len() >= 16, "keys repeat: {keys:?}");
    assert!(mrs.iter().all(|m| m.lkey() == m.rkey()));
}

/// A batch that overflows the send queue says how many went in; those
/// are sent and complete.
#[test]
fn batch_post_reports_how_many_were_posted() {
    let l = Listener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let peer = std::thread::spawn(move || receiving_peer(&l, 4, 16).0);
    let ctx = Context::new(Progress::Caller).unwrap();
    let (pd, cq) = (ctx.alloc_pd(), ctx.create_cq(8).unwrap());
    let mut init = QpInit::new(&pd, &cq);
    init.options.sq_depth = 4;
    let qp = connect(addr, &init).unwrap();
    let src = pd.register(pattern(16, 1), Access::LOCAL_READ);
    let err = qp
        .post_send_batch((0..6).map(|i| send_wr(i, vec![src.sge(0, 16)])))
        .unwrap_err();
    assert_eq!(
        err,
        BatchPostError {
            posted: 4,
            source: PostError::QueueFull
        }
    );
    assert_eq!(
        err.to_string(),
        "posted 4 work requests, then: work queue full"
    );
    assert!(wait_n(&cq, 4).iter().all(Wc::is_ok));
    assert!(peer.join().unwrap().iter().all(Wc::is_ok));
}

/// A batch of receives that overflows the receive queue says how many
/// went in (`Qp::post_recv_batch`, one take of the lock: a socket's freed
/// slots posted again together); those take the peer's Sends in order.
#[test]
fn batch_recv_post_reports_how_many_were_posted() {
    const LEN: usize = 16;
    let l = Listener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let peer = std::thread::spawn(move || {
        let ctx = Context::new(Progress::Thread).unwrap();
        let (pd, cq) = (ctx.alloc_pd(), ctx.create_cq(8).unwrap());
        let qp = l
            .accept_qp(&QpInit::new(&pd, &cq), b"", Some(LIMIT))
            .unwrap();
        let src = pd.register(pattern(4 * LEN, 3), Access::LOCAL_READ);
        for i in 0..4 {
            qp.post_send(send_wr(i, vec![src.sge(i as usize * LEN, LEN as u32)]))
                .unwrap();
        }
        assert!(wait_n(&cq, 4).iter().all(Wc::is_ok));
    });
    let ctx = Context::new(Progress::Caller).unwrap();
    let (pd, cq) = (ctx.alloc_pd(), ctx.create_cq(8).unwrap());
    let mut init = QpInit::new(&pd, &cq);
    init.options.rq_depth = 4;
    let qp = connect(addr, &init).unwrap();
    let buf = pd.alloc(6 * LEN, Access::LOCAL_WRITE);
    // Slots 5, 4, .. 0: the Sends fill the first four posted.
    let err = qp
        .post_recv_batch((0..6u64).rev().map(|i| RecvWr {
            wr_id: i,
            sgl: buf.sge(i as usize * LEN, LEN as u32).into(),
        }))
        .unwrap_err();
    assert_eq!(
        err,
        BatchPostError {
            posted: 4,
            source: PostError::QueueFull
        }
    );
    let w = wait_n(&cq, 4);
    assert!(w.iter().all(Wc::is_ok));
    assert_eq!(w.iter().map(|w| w.wr_id).collect::<Vec<_>>(), [5, 4, 3, 2]);
    let got = buf.to_vec();
    let want = pattern(4 * LEN, 3);
    for (k, slot) in [5usize, 4, 3, 2].into_iter().enumerate() {
        assert_eq!(got[slot * LEN..][..LEN], want[k * LEN..][..LEN], "send {k}");
    }
    peer.join().unwrap();
}

/// A queue pair dropped with megabytes queued that its peer never reads:
/// when the (shortened) linger ends, the requests whose bytes never left
/// complete as flushed — every request completes exactly once (they used
/// to vanish with the slot).
#[test]
fn linger_end_flushes_what_never_left() {
    const N: u64 = 32;
    const LEN: usize = 1 << 20;
    let l = Listener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let (done_tx, done_rx) = mpsc::channel::<()>();
    // The peer accepts, then never reads (no progress on its context).
    let peer = std::thread::spawn(move || {
        let ctx = Context::new(Progress::Caller).unwrap();
        let (pd, cq) = (ctx.alloc_pd(), ctx.create_cq(8).unwrap());
        let mut init = QpInit::new(&pd, &cq);
        init.options.tcp.recv_buffer = Some(64 << 10);
        let qp = l.accept_qp(&init, b"", Some(LIMIT)).unwrap();
        let _ = done_rx.recv_timeout(LIMIT);
        drop(qp);
    });
    let linger = Duration::from_millis(300);
    let ctx = Context::with_options(ContextOptions {
        linger,
        ..ContextOptions::default()
    })
    .unwrap();
    let (pd, cq) = (ctx.alloc_pd(), ctx.create_cq(64).unwrap());
    let mut init = QpInit::new(&pd, &cq);
    init.options.tcp.send_buffer = Some(64 << 10);
    let qp = connect(addr, &init).unwrap();
    let src = pd.alloc(LEN, Access::LOCAL_READ);
    for i in 0..N {
        qp.post_send(send_wr(i, vec![src.sge(0, LEN as u32)]))
            .unwrap();
    }
    let mut got = Vec::new();
    let mut wc = [Wc::default(); 64];
    let n = cq.poll(&mut wc);
    got.extend_from_slice(&wc[..n]);
    drop(qp);
    let dropped = Instant::now();
    while (got.len() as u64) < N && dropped.elapsed() < LIMIT {
        let n = cq.wait(&mut wc, Duration::from_millis(20)).unwrap();
        got.extend_from_slice(&wc[..n]);
    }
    let took = dropped.elapsed();
    done_tx.send(()).unwrap();
    peer.join().unwrap();
    let ids: HashSet<u64> = got.iter().map(|w| w.wr_id).collect();
    assert_eq!((got.len(), ids.len()), (N as usize, N as usize), "{got:?}");
    let flushed: Vec<&Wc> = got.iter().filter(|w| !w.is_ok()).collect();
    assert!(!flushed.is_empty(), "64 KiB buffers cannot hold 32 MiB");
    assert!(flushed.iter().all(|w| w.status == WcStatus::WrFlushError));
    assert!(flushed.iter().all(|w| w.cause == Some(CloseReason::Local)));
    assert!(
        took >= linger && took < linger + Duration::from_secs(5),
        "{took:?}"
    );
}
