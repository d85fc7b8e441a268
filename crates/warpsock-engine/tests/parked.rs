//! Caller-driven waits with one connection sleep in a blocking read of its
//! socket, outside the context lock. Other threads must still be able to
//! post, to wait themselves and to drop the queue pair meanwhile, and the
//! sleeper must honour its timeout and wake for what arrives.

mod common;

use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use common::{pattern, send_wr, wait_n, LIMIT};
use warpsock_engine::{
    connect, Access, Context, Cq, Listener, Mr, Progress, Qp, QpInit, RecvWr, SendOp, SendWr, Wc,
    WcOpcode, WcStatus,
};

/// An echo responder in its own thread: every Send that arrives is sent
/// back (at most `n`); it stays connected until the peer disconnects.
fn echo_server(n: usize) -> (std::net::SocketAddr, std::thread::JoinHandle<()>) {
    let l = Listener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let h = std::thread::spawn(move || {
        let ctx = Context::new(Progress::Caller).unwrap();
        let (pd, cq) = (ctx.alloc_pd(), ctx.create_cq(64).unwrap());
        let buf = pd.alloc(4096 * 8, Access::LOCAL_WRITE);
        let mut init = QpInit::new(&pd, &cq);
        init.recvs = (0..8)
            .map(|i| RecvWr {
                wr_id: i,
                sgl: buf.sge(i as usize * 4096, 4096).into(),
            })
            .collect();
        let qp = l.accept_qp(&init, b"", Some(LIMIT)).unwrap();
        let mut echoed = 0;
        let deadline = Instant::now() + LIMIT;
        while echoed < n && Instant::now() < deadline {
            let mut wc = [Wc::default(); 8];
            let k = cq.wait(&mut wc, Duration::from_millis(50)).unwrap();
            for w in &wc[..k] {
                if w.opcode != WcOpcode::Recv {
                    continue;
                }
                if !w.is_ok() {
                    return;
                }
                let slot = w.wr_id as usize;
                qp.post_send(send_wr(
                    100 + w.wr_id,
                    vec![buf.sge(slot * 4096, w.byte_len)],
                ))
                .unwrap();
                qp.post_recv(RecvWr {
                    wr_id: w.wr_id,
                    sgl: buf.sge(slot * 4096, 4096).into(),
                })
                .unwrap();
                echoed += 1;
            }
        }
        // Stay connected until the peer disconnects.
        while !qp.is_closed() && Instant::now() < deadline {
            let _ = cq.wait(&mut [Wc::default(); 8], Duration::from_millis(10));
        }
    });
    (addr, h)
}

/// A caller-driven client of `addr` with one receive posted (`wr_id` 9,
/// into the 64-byte region returned with it).
fn idle_client(addr: std::net::SocketAddr) -> (Context, Cq, Qp, Mr) {
    let ctx = Context::new(Progress::Caller).unwrap();
    let (pd, cq) = (ctx.alloc_pd(), ctx.create_cq(64).unwrap());
    let inbox = pd.alloc(64, Access::LOCAL_WRITE);
    let mut init = QpInit::new(&pd, &cq);
    init.recvs.push(RecvWr {
        wr_id: 9,
        sgl: inbox.sge(0, 64).into(),
    });
    let qp = connect(addr, &init).unwrap();
    (ctx, cq, qp, inbox)
}

/// Waits on `cq` until a receive completes (at most [`LIMIT`]): every
/// completion up to it.
fn until_recv(cq: &Cq) -> Vec<Wc> {
    let t0 = Instant::now();
    let mut got = Vec::new();
    while !got.iter().any(|w: &Wc| w.opcode == WcOpcode::Recv) {
        assert!(t0.elapsed() < LIMIT, "no echo: {got:?}");
        let mut wc = [Wc::default(); 4];
        let k = cq.wait(&mut wc, LIMIT).unwrap();
        got.extend_from_slice(&wc[..k]);
    }
    got
}

#[test]
fn another_thread_posts_while_one_sleeps_in_wait() {
    let (addr, server) = echo_server(20);
    let ctx = Context::new(Progress::Caller).unwrap();
    let (pd, cq) = (ctx.alloc_pd(), ctx.create_cq(64).unwrap());
    let inbox = pd.alloc(4096, Access::LOCAL_WRITE);
    let out = pd.register(pattern(4096, 3), Access::LOCAL_READ);
    let qp = Arc::new(connect(addr, &QpInit::new(&pd, &cq)).unwrap());
    let cq = Arc::new(cq);
    let barrier = Arc::new(Barrier::new(2));
    for round in 0..20u64 {
        qp.post_recv(RecvWr {
            wr_id: 500 + round,
            sgl: inbox.sge(0, 4096).into(),
        })
        .unwrap();
        // The waiter goes to sleep first (nothing can arrive before the
        // post below), then the poster sends the ping from this thread.
        let (c2, b2) = (Arc::clone(&cq), Arc::clone(&barrier));
        let waiter = std::thread::spawn(move || {
            b2.wait();
            until_recv(&c2)
        });
        barrier.wait();
        std::thread::sleep(Duration::from_millis(2));
        let len = 1 + (round as u32 * 97) % 4096;
        qp.post_send(send_wr(round, vec![out.sge(0, len)])).unwrap();
        let got = waiter.join().unwrap();
        let recv = got.iter().find(|w| w.opcode == WcOpcode::Recv).unwrap();
        assert!(recv.is_ok() && recv.byte_len == len, "{recv:?}");
        let mut echo = vec![0; len as usize];
        inbox.read(0, &mut echo);
        assert_eq!(echo, pattern(4096, 3)[..len as usize]);
    }
    drop(qp);
    server.join().unwrap();
}

#[test]
fn a_sleeping_wait_honours_its_timeout_and_survives_the_qp_being_dropped() {
    let (addr, server) = echo_server(0);
    let (_ctx, cq, qp, _inbox) = idle_client(addr);

    // Nothing arrives: the wait returns empty after its timeout, not much
    // later (the sleep is cut into short slices, each re-checking).
    for t in [Duration::from_millis(3), Duration::from_millis(40)] {
        let t0 = Instant::now();
        let n = cq.wait(&mut [Wc::default(); 4], t).unwrap();
        let took = t0.elapsed();
        assert_eq!(n, 0);
        assert!(took >= t, "{took:?} < {t:?}");
        assert!(took < t + Duration::from_millis(500), "{took:?} for {t:?}");
    }

    // Drop the queue pair from another thread while this one sleeps: the
    // receive is flushed and the sleeper sees it.
    let cq = Arc::new(cq);
    let c2 = Arc::clone(&cq);
    let waiter = std::thread::spawn(move || {
        let t0 = Instant::now();
        let mut wc = [Wc::default(); 4];
        loop {
            let k = c2.wait(&mut wc, LIMIT).unwrap();
            if k > 0 {
                return (wc[0], t0.elapsed());
            }
            assert!(t0.elapsed() < LIMIT);
        }
    });
    std::thread::sleep(Duration::from_millis(30));
    drop(qp);
    let (wc, took) = waiter.join().unwrap();
    assert_eq!((wc.wr_id, wc.status), (9, WcStatus::WrFlushError));
    assert!(took < Duration::from_secs(5), "{took:?}");
    server.join().unwrap();
}

/// `Qp::send_backlog` reports what the engine holds for a full send buffer
/// (what a readiness-driven caller must watch output space for), and
/// drops to 0 once rounds of progress after the peer reads sent it all.
#[test]
fn send_backlog_counts_bytes_held_for_a_full_socket_buffer() {
    const LEN: usize = 32 << 20;
    let l = Listener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let go = Arc::new(Barrier::new(2));
    let g2 = Arc::clone(&go);
    let server = std::thread::spawn(move || {
        let ctx = Context::new(Progress::Caller).unwrap();
        let (pd, cq) = (ctx.alloc_pd(), ctx.create_cq(8).unwrap());
        let buf = pd.alloc(LEN, Access::LOCAL_WRITE);
        let mut init = QpInit::new(&pd, &cq);
        init.recvs = vec![RecvWr {
            wr_id: 1,
            sgl: buf.sge(0, LEN as u32).into(),
        }];
        let qp = l.accept_qp(&init, b"", Some(LIMIT)).unwrap();
        // Reads nothing until the sender saw its backlog.
        g2.wait();
        let mut wc = [Wc::default(); 1];
        let t0 = Instant::now();
        while cq.wait(&mut wc, Duration::from_millis(50)).unwrap() == 0 {
            assert!(t0.elapsed() < LIMIT, "the 32 MiB Send never arrived");
        }
        assert!(wc[0].is_ok() && wc[0].byte_len == LEN as u32, "{:?}", wc[0]);
        drop(qp);
    });
    let ctx = Context::new(Progress::Caller).unwrap();
    let (pd, cq) = (ctx.alloc_pd(), ctx.create_cq(8).unwrap());
    let src = pd.register(vec![7u8; LEN], Access::LOCAL_READ);
    let qp = connect(addr, &QpInit::new(&pd, &cq)).unwrap();
    assert_eq!(qp.send_backlog(), 0, "nothing posted yet");
    qp.post_send(send_wr(5, vec![src.sge(0, LEN as u32)]))
        .unwrap();
    // More than loopback's socket buffers hold: the kernel refused some.
    ctx.progress();
    assert!(qp.send_backlog() > 0, "32 MiB to a peer that does not read");
    go.wait();
    let t0 = Instant::now();
    let mut done = false;
    while !done {
        assert!(t0.elapsed() < LIMIT, "the Send never completed");
        let mut wc = [Wc::default(); 4];
        let k = cq.wait(&mut wc, Duration::from_millis(50)).unwrap();
        done = wc[..k].iter().any(|w| w.wr_id == 5 && w.is_ok());
    }
    assert_eq!(qp.send_backlog(), 0, "every byte reached the kernel");
    server.join().unwrap();
    drop(qp);
}

/// A wait's first park, ended early by input that completes nothing, does
/// not cut the wait's timeout (review r18-xwake, finding 1): the peer's
/// RDMA Write into this side's region is read by the first park at once,
/// and the wait still sleeps its whole 10 ms (a lower bound only). One
/// park slice, the shortest wait that parks first: the cut is a slice
/// whatever the timeout (the whole wait here), while each later slice's
/// sleep may overrun by a timer tick or two and hide it.
#[test]
fn a_first_park_woken_by_a_write_keeps_the_whole_timeout() {
    // Rounds: a Write handed to TCP may still miss the first park on a
    // loaded host (loopback's delivery left to ksoftirqd); every round
    // checks the timeout, and one whose first park placed its Write (a
    // second park followed) is the case tested (review r19-xwake2, item 2).
    const ROUNDS: u64 = 20;
    let l = Listener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let (go_tx, go_rx) = std::sync::mpsc::channel::<u64>();
    let (written_tx, written_rx) = std::sync::mpsc::channel::<()>();
    let writer = std::thread::spawn(move || {
        let ctx = Context::new(Progress::Caller).unwrap();
        let (pd, cq) = (ctx.alloc_pd(), ctx.create_cq(4).unwrap());
        let src = pd.alloc(64, Access::LOCAL_READ | Access::LOCAL_WRITE);
        let qp = connect(addr, &QpInit::new(&pd, &cq)).unwrap();
        let pdata = qp.negotiated().unwrap().peer_private_data;
        let remote_addr = u64::from_be_bytes(pdata[..8].try_into().unwrap());
        let rkey = u32::from_be_bytes(pdata[8..12].try_into().unwrap());
        // Connected until the waiter is done (a FIN would end its park too).
        while let Ok(seed) = go_rx.recv_timeout(LIMIT) {
            src.write(0, &pattern(64, seed));
            qp.post_send(SendWr {
                wr_id: seed,
                op: SendOp::Write { remote_addr, rkey },
                sgl: src.sge(0, 64).into(),
                signaled: true,
            })
            .unwrap();
            let w = wait_n(&cq, 1);
            assert!(w[0].is_ok() && w[0].opcode == WcOpcode::RdmaWrite, "{w:?}");
            written_tx.send(()).unwrap();
        }
    });
    let ctx = Context::new(Progress::Caller).unwrap();
    let (pd, cq) = (ctx.alloc_pd(), ctx.create_cq(4).unwrap());
    let target = pd.alloc(64, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    let mut pdata = target.addr().to_be_bytes().to_vec();
    pdata.extend_from_slice(&target.rkey().to_be_bytes());
    let qp = l
        .accept_qp(&QpInit::new(&pd, &cq), &pdata, Some(LIMIT))
        .unwrap();
    let timeout = Duration::from_millis(10);
    let mut tested = None;
    for seed in 1..=ROUNDS {
        go_tx.send(seed).unwrap();
        written_rx.recv_timeout(LIMIT).unwrap();
        // The Write's bytes wait in this side's socket (or are on their
        // way): nothing read them yet.
        let reads = qp.io_stats().parked_reads;
        let t0 = Instant::now();
        assert_eq!(cq.wait(&mut [Wc::default(); 4], timeout).unwrap(), 0);
        let took = t0.elapsed();
        assert!(took >= timeout, "round {seed}: {took:?} < {timeout:?}");
        let mut got = vec![0; 64];
        target.read(0, &mut got);
        if got == pattern(64, seed) && qp.io_stats().parked_reads - reads >= 2 {
            tested = Some(seed);
            break;
        }
    }
    if tested.is_none() {
        eprintln!("no first park placed its Write in {ROUNDS} rounds (a loaded machine)");
    }
    drop(go_tx);
    writer.join().unwrap();
}

/// The same for a signal (EINTR) ending the first park: the waiter's
/// thread is signalled once it sleeps in its first parked `recv` (seen in
/// `/proc/self/task/<tid>/syscall`), and its 10 ms wait (one park slice,
/// as above) still lasts 10 ms.
/// (Should the signal come later than the first park, it ends a later
/// one, which the wait's clock already covers: the test cannot fail by
/// scheduling, only stop testing the first park.)
#[test]
fn a_first_park_ended_by_a_signal_keeps_the_whole_timeout() {
    extern "C" fn on_sigusr1(_: libc::c_int) {}
    // SAFETY: a zeroed sigaction with a plain handler that does nothing
    // (async-signal-safe); no SA_RESTART, though a socket with a receive
    // timeout is never restarted anyway (signal(7)).
    unsafe {
        let mut act: libc::sigaction = std::mem::zeroed();
        act.sa_sigaction = on_sigusr1 as extern "C" fn(libc::c_int) as usize;
        assert_eq!(
            libc::sigaction(libc::SIGUSR1, &act, std::ptr::null_mut()),
            0
        );
    }
    let (addr, server) = echo_server(0);
    let (_ctx, cq, qp, _inbox) = idle_client(addr);
    // SAFETY: plain queries of the calling thread's ids.
    let (tid, me) = unsafe { (libc::gettid(), libc::pthread_self()) };
    let over = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let o2 = Arc::clone(&over);
    let go = Arc::new(Barrier::new(2));
    let g2 = Arc::clone(&go);
    let killer = std::thread::spawn(move || {
        let path = format!("/proc/self/task/{tid}/syscall");
        let recv = format!("{} ", libc::SYS_recvfrom);
        g2.wait();
        let t0 = Instant::now();
        while !o2.load(std::sync::atomic::Ordering::Acquire) && t0.elapsed() < LIMIT {
            let s = std::fs::read_to_string(&path).unwrap_or_default();
            if s.starts_with(&recv) {
                // SAFETY: `me` is the waiting thread, alive until `over`.
                assert_eq!(unsafe { libc::pthread_kill(me, libc::SIGUSR1) }, 0);
                return true;
            }
            std::thread::yield_now();
        }
        false
    });
    let timeout = Duration::from_millis(10);
    go.wait();
    let t0 = Instant::now();
    let n = cq.wait(&mut [Wc::default(); 4], timeout).unwrap();
    let took = t0.elapsed();
    over.store(true, std::sync::atomic::Ordering::Release);
    let signalled = killer.join().unwrap();
    assert_eq!(n, 0);
    if !signalled {
        eprintln!("the killer never saw the wait in a parked recv (a loaded machine)");
    }
    assert!(took >= timeout, "{took:?} < {timeout:?}");
    drop(qp);
    server.join().unwrap();
}

/// A context's lone live queue pair need not be its first: with a closed
/// one before it (its handle kept, so its slot stays), the wait parks in
/// the second's socket, and the read is handed back to that slot, whose
/// echo arrives (a read handed to the wrong slot is discarded: the bytes
/// would be lost and the wait would end at its timeout).
#[test]
fn a_parked_read_of_a_later_slot_is_handed_back_to_it() {
    let (addr0, server0) = echo_server(0);
    let (addr1, server1) = echo_server(1);
    let ctx = Context::new(Progress::Caller).unwrap();
    let (pd, cq0, cq1) = (
        ctx.alloc_pd(),
        ctx.create_cq(8).unwrap(),
        ctx.create_cq(8).unwrap(),
    );
    let first = connect(addr0, &QpInit::new(&pd, &cq0)).unwrap();
    let inbox = pd.alloc(64, Access::LOCAL_WRITE);
    let out = pd.register(pattern(64, 4), Access::LOCAL_READ);
    let mut init = QpInit::new(&pd, &cq1);
    init.recvs.push(RecvWr {
        wr_id: 9,
        sgl: inbox.sge(0, 64).into(),
    });
    let second = connect(addr1, &init).unwrap();
    first.disconnect();
    let t0 = Instant::now();
    while !first.is_closed() {
        assert!(t0.elapsed() < LIMIT, "the first connection never closed");
        let _ = cq0.wait(&mut [Wc::default(); 8], Duration::from_millis(10));
    }
    server0.join().unwrap();
    let reads = second.io_stats().parked_reads;
    second.post_send(send_wr(1, vec![out.sge(0, 8)])).unwrap();
    let got = until_recv(&cq1);
    let recv = got.iter().find(|w| w.opcode == WcOpcode::Recv).unwrap();
    assert!(recv.is_ok() && recv.byte_len == 8, "{recv:?}");
    let mut echo = vec![0; 8];
    inbox.read(0, &mut echo);
    assert_eq!(echo, pattern(64, 4)[..8]);
    assert!(second.io_stats().parked_reads > reads, "the wait parked");
    drop(second);
    server1.join().unwrap();
    drop(first);
}

/// A wait whose first park timed out counts that slice (review
/// r19-xwake2, note 6), by a count, not a time: a 20 ms wait with nothing
/// arriving sleeps in exactly two parks — the first ends after more than
/// its 10 ms, the second's timeout is the rest rounded up — where counting
/// the timeout from after the first slice takes a third (load only
/// lengthens parks, so it cannot add one).
#[test]
fn a_first_park_that_timed_out_counts_its_slice() {
    let (addr, server) = echo_server(0);
    let (_ctx, cq, qp, _inbox) = idle_client(addr);
    // Whatever the set-up left in flight is read first.
    let _ = cq.wait(&mut [Wc::default(); 4], Duration::from_millis(10));
    let reads = qp.io_stats().parked_reads;
    let n = cq.wait(&mut [Wc::default(); 4], Duration::from_millis(20));
    assert_eq!(n.unwrap(), 0);
    assert_eq!(qp.io_stats().parked_reads - reads, 2, "{:?}", qp.io_stats());
    drop(qp);
    server.join().unwrap();
}
