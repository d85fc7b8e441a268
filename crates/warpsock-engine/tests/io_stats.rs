//! The engine's diagnostic counters (`Qp::io_stats`, `Context::wait_stats`)
//! count what they say: the bytes the socket calls moved on both ends, the
//! Read Requests handed out, the sleeps of a waiting caller.

mod common;

use std::time::Duration;

use common::{pattern, send_wr, wait_n, LIMIT};
use warpsock_engine::{
    connect, Access, Context, ContextOptions, Event, Listener, Progress, QpInit, QpNews, RecvWr,
    SendOp, SendWr,
};

/// Bytes of the Send, several FPDUs.
const LEN: usize = 1 << 20;
/// Bytes of each Read.
const READ_LEN: u32 = 64 << 10;

/// A 1 MiB Send from a caller-driven client to a progress-thread server,
/// then three Reads the other way: the server's read bytes equal what the
/// client's writes put on the wire (nothing else flowed), every call moved
/// bytes or was counted as blocked, and the client handed out exactly its
/// three Read Requests.
#[test]
fn io_stats_count_the_bytes_and_read_requests_of_a_transfer() {
    let l = Listener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let (snap_tx, snap_rx) = std::sync::mpsc::channel();
    let server = std::thread::spawn(move || {
        let c = Context::new(Progress::Thread).unwrap();
        let pd = c.alloc_pd();
        let cq = c.create_cq(8).unwrap();
        let sink = pd.alloc(LEN, Access::LOCAL_WRITE);
        let src = pd.register(pattern(READ_LEN as usize, 5), Access::REMOTE_READ);
        let mut init = QpInit::new(&pd, &cq);
        init.recvs = vec![RecvWr {
            wr_id: 1,
            sgl: sink.sge(0, LEN as u32).into(),
        }];
        let mut pdata = src.addr().to_be_bytes().to_vec();
        pdata.extend_from_slice(&src.rkey().to_be_bytes());
        let qp = l.accept_qp(&init, &pdata, Some(LIMIT)).unwrap();
        let w = wait_n(&cq, 1);
        assert!(w[0].is_ok() && w[0].byte_len as usize == LEN, "{w:?}");
        snap_tx.send(qp.io_stats()).unwrap();
        done_rx.recv_timeout(LIMIT).expect("the client's Reads");
        qp.io_stats()
    });
    let c = Context::new(Progress::Caller).unwrap();
    let pd = c.alloc_pd();
    let cq = c.create_cq(8).unwrap();
    let src = pd.register(pattern(LEN, 7), Access::LOCAL_READ);
    let sink = pd.alloc(3 * READ_LEN as usize, Access::LOCAL_WRITE);
    let qp = connect(addr, &QpInit::new(&pd, &cq)).unwrap();
    let pdata = qp.negotiated().unwrap().peer_private_data;
    let remote_addr = u64::from_be_bytes(pdata[..8].try_into().unwrap());
    let rkey = u32::from_be_bytes(pdata[8..12].try_into().unwrap());
    qp.post_send(send_wr(1, vec![src.sge(0, LEN as u32)]))
        .unwrap();
    assert!(wait_n(&cq, 1)[0].is_ok());
    let sent = qp.io_stats();
    // The server's counts before any Read.
    let srv_send = snap_rx.recv_timeout(LIMIT).unwrap();
    for i in 0..3u32 {
        qp.post_send(SendWr {
            wr_id: 10 + u64::from(i),
            op: SendOp::Read { remote_addr, rkey },
            sgl: sink.sge((i * READ_LEN) as usize, READ_LEN).into(),
            signaled: true,
        })
        .unwrap();
    }
    assert!(wait_n(&cq, 3).iter().all(|w| w.is_ok()));
    let end = qp.io_stats();
    done_tx.send(()).unwrap();
    let srv_end = server.join().unwrap();

    // The Send: at least its payload on the wire, all of it read.
    assert!(sent.write_bytes > LEN as u64, "{sent:?}");
    assert!(
        sent.writes >= 1 && sent.writes_blocked < sent.writes,
        "{sent:?}"
    );
    // The server read what the client's driver wrote, plus the P2P RTR
    // FPDU the connection manager wrote during setup (20 bytes; less if
    // it came in with the MPA frame, which the manager stages).
    let rtr = srv_send.read_bytes.checked_sub(sent.write_bytes);
    assert!(
        srv_send.read_bytes >= LEN as u64 && rtr.is_some_and(|r| r <= 64),
        "{srv_send:?} vs {sent:?}"
    );
    assert!(srv_send.reads >= 1 && srv_send.bytes_per_read() > 0.0);
    assert_eq!((sent.read_requests, srv_send.read_requests), (0, 0));
    // The Reads: three requests from the client, none from the server;
    // the responses' bytes arrive in the client's reads.
    assert_eq!(end.read_requests, 3, "{end:?}");
    assert_eq!(srv_end.read_requests, 0, "{srv_end:?}");
    assert!(end.read_bytes >= 3 * u64::from(READ_LEN), "{end:?}");
    assert!(
        srv_end.write_bytes >= 3 * u64::from(READ_LEN),
        "{srv_end:?}"
    );
    // They were queued one behind the other, with nothing large ahead.
    assert!(end.read_request_wait_bytes < 3 * 128, "{end:?}");
    assert_eq!(end.responses_ahead_of_read, 0, "{end:?}");
}

/// A caller-driven wait on an idle connection sleeps (in a blocking read
/// of its one socket) and wakes with nothing: both are counted.
#[test]
fn wait_stats_count_a_sleep_that_found_nothing() {
    let l = Listener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let server = std::thread::spawn(move || {
        let c = Context::new(Progress::Thread).unwrap();
        let pd = c.alloc_pd();
        let cq = c.create_cq(4).unwrap();
        let _qp = l
            .accept_qp(&QpInit::new(&pd, &cq), &[], Some(LIMIT))
            .unwrap();
        done_rx.recv_timeout(LIMIT).unwrap();
    });
    let c = Context::new(Progress::Caller).unwrap();
    let pd = c.alloc_pd();
    let cq = c.create_cq(4).unwrap();
    let qp = connect(addr, &QpInit::new(&pd, &cq)).unwrap();
    let before = c.wait_stats();
    let mut wc = [warpsock_engine::Wc::default()];
    assert_eq!(cq.wait(&mut wc, Duration::from_millis(30)).unwrap(), 0);
    let after = c.wait_stats();
    assert!(after.sleeps() > before.sleeps(), "{before:?} -> {after:?}");
    assert!(
        after.empty_wakes > before.empty_wakes,
        "{before:?} -> {after:?}"
    );
    assert!(after.parked_sleeps > before.parked_sleeps, "{after:?}");
    assert!(qp.io_stats().parked_reads >= 1, "{:?}", qp.io_stats());
    done_tx.send(()).unwrap();
    server.join().unwrap();
}

/// An 8-byte ping-pong between two caller-driven ends: each Send is one
/// transmit pass that asks the core for a segment once — the core says
/// "nothing more" with the message's only FPDU, so no pass makes the
/// empty second ask it made before (`IoStats::empty_asks` stays put), and
/// no receive makes a pass at all.
#[test]
fn a_one_fpdu_send_asks_the_core_once() {
    const ROUNDS: u64 = 200;
    let l = Listener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let server = std::thread::spawn(move || {
        let (_c, pd, cq, buf) = end8(Progress::Caller, 8);
        let mut init = QpInit::new(&pd, &cq);
        init.recvs = vec![recv8(&buf)];
        let qp = l.accept_qp(&init, &[], Some(LIMIT)).unwrap();
        pong(&qp, &cq, &buf, ROUNDS, false)
    });
    let (_c, pd, cq, buf) = end8(Progress::Caller, 8);
    let mut init = QpInit::new(&pd, &cq);
    init.recvs = vec![recv8(&buf)];
    let qp = connect(addr, &init).unwrap();
    let (before, after) = pong(&qp, &cq, &buf, ROUNDS, true);
    let (srv_before, srv_after) = server.join().unwrap();
    for (who, b, a) in [("client", before, after), ("server", srv_before, srv_after)] {
        assert_eq!(a.tx_passes - b.tx_passes, ROUNDS, "{who}: {b:?} -> {a:?}");
        assert_eq!(a.empty_asks, b.empty_asks, "{who}: {b:?} -> {a:?}");
    }
}

/// `rounds` 8-byte exchanges on `qp` (`first`: this end sends first),
/// after one warm-up exchange; the queue pair's counts before and after.
fn pong(
    qp: &warpsock_engine::Qp,
    cq: &warpsock_engine::Cq,
    buf: &warpsock_engine::Mr,
    rounds: u64,
    first: bool,
) -> (warpsock_engine::IoStats, warpsock_engine::IoStats) {
    let mut before = None;
    for i in 0..=rounds {
        if i == 1 {
            before = Some(qp.io_stats());
        }
        let send = || {
            qp.post_send(send_wr(1, vec![buf.sge(0, 8)])).unwrap();
        };
        let mut need_recv = true;
        let mut need_send_wc = first;
        if first {
            send();
        }
        while need_recv || need_send_wc {
            for w in wait_n(cq, 1) {
                assert!(w.is_ok(), "{w:?}");
                if w.opcode == warpsock_engine::WcOpcode::Recv {
                    qp.post_recv(recv8(buf)).unwrap();
                    need_recv = false;
                    if !first {
                        send();
                        need_send_wc = true;
                    }
                } else {
                    need_send_wc = false;
                }
            }
        }
    }
    (before.expect("warm-up"), qp.io_stats())
}

/// A blocking wait longer than a park slice sleeps its first slice without
/// reading the clock, and still ends at its timeout, not a slice early nor
/// at the first slice's end.
#[test]
fn a_wait_parked_without_the_clock_still_ends_at_its_timeout() {
    let l = Listener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let server = std::thread::spawn(move || {
        let c = Context::new(Progress::Thread).unwrap();
        let pd = c.alloc_pd();
        let cq = c.create_cq(4).unwrap();
        let _qp = l
            .accept_qp(&QpInit::new(&pd, &cq), &[], Some(LIMIT))
            .unwrap();
        done_rx.recv_timeout(LIMIT).unwrap();
    });
    let c = Context::new(Progress::Caller).unwrap();
    let pd = c.alloc_pd();
    let cq = c.create_cq(4).unwrap();
    let qp = connect(addr, &QpInit::new(&pd, &cq)).unwrap();
    let mut wc = [warpsock_engine::Wc::default()];
    let timeout = Duration::from_millis(60);
    let reads = qp.io_stats().parked_reads;
    let t = std::time::Instant::now();
    assert_eq!(cq.wait(&mut wc, timeout).unwrap(), 0);
    let took = t.elapsed();
    // A slice is 10 ms: the timeout counts from at most a slice's rounding
    // before the first one began.
    assert!(took >= timeout - Duration::from_millis(10), "{took:?}");
    assert!(
        qp.io_stats().parked_reads - reads >= 2,
        "{:?}",
        qp.io_stats()
    );
    done_tx.send(()).unwrap();
    server.join().unwrap();
}

/// Busy polling an idle connection (issue 12): every empty round ends at
/// its one read (`IoStats::idle_reads`, one read per round and no other),
/// and a message that arrives meanwhile is found by such a read and
/// delivered whole; a Send posted after it still completes.
#[test]
fn an_empty_busy_polling_round_ends_at_its_read_and_misses_nothing() {
    const SPINS: u64 = 50;
    let p = PingPair::new();
    let (cq, qp, go_tx) = (&p.cq, &p.qp, &p.go);
    let mut wc = [warpsock_engine::Wc::default()];
    // Whatever the connection's setup left is taken by a first round.
    assert_eq!(cq.poll(&mut wc), 0);
    let before = qp.io_stats();
    for _ in 0..SPINS {
        assert_eq!(cq.poll(&mut wc), 0);
    }
    let idle = qp.io_stats();
    assert_eq!(idle.idle_reads - before.idle_reads, SPINS, "{idle:?}");
    assert_eq!(idle.reads - before.reads, SPINS, "{idle:?}");
    assert_eq!(idle.tx_passes, before.tx_passes, "{idle:?}");
    go_tx.send(()).unwrap();
    let deadline = std::time::Instant::now() + LIMIT;
    while cq.poll(&mut wc) == 0 {
        assert!(std::time::Instant::now() < deadline, "{:?}", qp.io_stats());
    }
    assert_eq!(wc[0].byte_len, 8);
    assert_eq!(p.answer_ping(&wc[0]), b"pong-456");
}

/// The busy-polling tests' pair (issue 12): a caller-driven client with
/// one 8-byte receive posted, and a progress-thread server that, told to
/// go, sends "ping-123" and waits for the client's Send, and told again
/// (or when the pair finishes), drops its queue pair: the FIN goes out
/// (or aborts it: [`PingPair::ending`]).
struct PingPair {
    go: std::sync::mpsc::Sender<()>,
    server: std::thread::JoinHandle<Vec<u8>>,
    qp: warpsock_engine::Qp,
    cq: warpsock_engine::Cq,
    buf: warpsock_engine::Mr,
    _pd: warpsock_engine::Pd,
    _c: Context,
}

impl PingPair {
    fn new() -> Self {
        Self::ending(false)
    }

    /// [`Self::new`] whose server aborts its queue pair when told again
    /// (`abort`: a reset) instead of dropping it.
    fn ending(abort: bool) -> Self {
        Self::with(abort, Duration::ZERO)
    }

    /// [`Self::new`] whose client's waits spin for `busy_poll` first
    /// ([`warpsock_engine::ContextOptions::busy_poll`]).
    fn spinning(busy_poll: Duration) -> Self {
        Self::with(false, busy_poll)
    }

    /// [`Self::spinning`] for `LIMIT`, settled: whatever the connection's
    /// setup left taken by a first round, its events (established) by the
    /// caller. With a completion array for the waits, and the short rounds
    /// so far.
    fn spinning_settled() -> (Self, [warpsock_engine::Wc; 1], u64) {
        let p = Self::spinning(LIMIT);
        let mut wc = [warpsock_engine::Wc::default()];
        assert_eq!(p.cq.poll_news(&mut wc, &p.qp).0, 0);
        while p.qp.poll_event().is_some() {}
        let before = p.qp.io_stats().short_rounds;
        (p, wc, before)
    }

    fn with(abort: bool, busy_poll: Duration) -> Self {
        let l = Listener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let (go, go_rx) = std::sync::mpsc::channel::<()>();
        let server = std::thread::spawn(move || {
            let (_c, pd, cq, buf) = end8(Progress::Thread, 4);
            let mut init = QpInit::new(&pd, &cq);
            init.recvs = vec![recv8(&buf)];
            let qp = l.accept_qp(&init, &[], Some(LIMIT)).unwrap();
            go_rx.recv_timeout(LIMIT).unwrap();
            buf.write(0, b"ping-123");
            qp.post_send(send_wr(1, vec![buf.sge(0, 8)])).unwrap();
            // The client's Send, then our own Send's completion, in any
            // order.
            let got = wait_n(&cq, 2);
            assert!(got.iter().all(|w| w.is_ok()), "{got:?}");
            // The next go, or the pair's end.
            let _ = go_rx.recv_timeout(LIMIT);
            if abort {
                qp.abort();
            } else {
                drop(qp);
            }
            buf.to_vec()
        });
        let _c = Context::with_options(ContextOptions {
            busy_poll,
            ..ContextOptions::default()
        })
        .unwrap();
        let _pd = _c.alloc_pd();
        let cq = _c.create_cq(4).unwrap();
        let buf = _pd.alloc(8, Access::LOCAL_WRITE | Access::LOCAL_READ);
        let mut init = QpInit::new(&_pd, &cq);
        init.recvs = vec![recv8(&buf)];
        let qp = connect(addr, &init).unwrap();
        Self {
            go,
            server,
            qp,
            cq,
            buf,
            _pd,
            _c,
        }
    }

    /// The client's answer to the server's ping, whose receive completed
    /// (`recv`): "pong-456" sent from the same buffer and its completion
    /// waited for; then the pair's end ([`Self::finish`]).
    fn answer_ping(self, recv: &warpsock_engine::Wc) -> Vec<u8> {
        assert!(recv.is_ok(), "{recv:?}");
        assert_eq!(recv.opcode, warpsock_engine::WcOpcode::Recv);
        assert_eq!(self.buf.to_vec(), b"ping-123");
        self.buf.write(0, b"pong-456");
        self.qp
            .post_send(send_wr(2, vec![self.buf.sge(0, 8)]))
            .unwrap();
        let sent = wait_n(&self.cq, 1);
        assert!(sent[0].is_ok(), "{:?}", sent[0]);
        self.finish()
    }

    /// What the server received.
    fn finish(self) -> Vec<u8> {
        drop(self.go);
        self.server.join().unwrap()
    }
}

/// A context of `progress` with a protection domain, a completion queue of
/// `cqe` entries and an 8-byte buffer (the context first: it must outlive
/// the rest).
fn end8(
    progress: Progress,
    cqe: usize,
) -> (
    Context,
    warpsock_engine::Pd,
    warpsock_engine::Cq,
    warpsock_engine::Mr,
) {
    let c = Context::new(progress).unwrap();
    let pd = c.alloc_pd();
    let cq = c.create_cq(cqe).unwrap();
    let buf = pd.alloc(8, Access::LOCAL_WRITE | Access::LOCAL_READ);
    (c, pd, cq, buf)
}

/// A receive of 8 bytes into `buf`.
fn recv8(buf: &warpsock_engine::Mr) -> RecvWr {
    RecvWr {
        wr_id: 0,
        sgl: buf.sge(0, 8).into(),
    }
}

/// Polls `cq` with `qp`'s news (busy polling) until `done` says so of a
/// poll's result, for at most `LIMIT`.
fn spin_until(
    cq: &warpsock_engine::Cq,
    qp: &warpsock_engine::Qp,
    wc: &mut [warpsock_engine::Wc],
    mut done: impl FnMut(usize, QpNews) -> bool,
) {
    let deadline = std::time::Instant::now() + LIMIT;
    loop {
        let (n, news) = cq.poll_news(wc, qp);
        if done(n, news) {
            return;
        }
        assert!(std::time::Instant::now() < deadline, "{:?}", qp.io_stats());
    }
}

/// A lone queue pair's empty busy-polling round is its read alone
/// (`Cq::poll_news`, issue 12: `IoStats::short_rounds`, one read each),
/// and it misses nothing: a message that arrives meanwhile is delivered,
/// the completion of our own Send already queued is returned by the next
/// poll, and the peer's FIN ends the connection. `Cq::poll_news_idle`
/// says so of the empty rounds, and not of the round that returns the
/// Send's completion (the socket's lock-free `EAGAIN` builds on it).
#[test]
fn a_lone_queue_pairs_empty_poll_is_its_read_alone_and_misses_nothing() {
    const SPINS: u64 = 50;
    let p = PingPair::new();
    let (cq, qp, buf, go_tx) = (&p.cq, &p.qp, &p.buf, &p.go);
    let mut wc = [warpsock_engine::Wc::default()];
    // Whatever the connection's setup left is taken by a first round, its
    // events (established) by the caller.
    assert_eq!(cq.poll_news(&mut wc, qp).0, 0);
    while qp.poll_event().is_some() {}
    let before = qp.io_stats();
    // Each empty read found the socket drained (`QpNews::rx_drained`:
    // an edge-triggered caller needs no `FIONREAD` after it).
    let drained = QpNews {
        rx_drained: true,
        ..QpNews::default()
    };
    for _ in 0..SPINS {
        assert_eq!(cq.poll_news_idle(&mut wc, qp), (0, drained, true));
    }
    let idle = qp.io_stats();
    assert_eq!(idle.short_rounds - before.short_rounds, SPINS, "{idle:?}");
    assert_eq!(idle.reads - before.reads, SPINS, "{idle:?}");
    go_tx.send(()).unwrap();
    spin_until(cq, qp, &mut wc, |n, _| n > 0);
    assert!(wc[0].is_ok(), "{:?}", wc[0]);
    assert_eq!(wc[0].opcode, warpsock_engine::WcOpcode::Recv);
    assert_eq!(buf.to_vec(), b"ping-123");
    // The Send is written at once; its completion waits in the queue.
    buf.write(0, b"pong-456");
    qp.post_send(send_wr(2, vec![buf.sge(0, 8)])).unwrap();
    let (n, _, idle) = cq.poll_news_idle(&mut wc, qp);
    assert_eq!((n, idle), (1, false), "{:?}", qp.io_stats());
    assert!(wc[0].is_ok() && wc[0].wr_id == 2, "{:?}", wc[0]);
    // The peer's FIN, read by a busy-polling round, ends the connection.
    go_tx.send(()).unwrap();
    spin_until(cq, qp, &mut wc, |_, news| news.events);
    let closed = std::iter::from_fn(|| qp.poll_event()).any(|e| matches!(e, Event::Closed(_)));
    assert!(closed, "{:?}", qp.io_stats());
    assert_eq!(p.finish(), b"pong-456");
}

/// A busy-polling wait (`ContextOptions::busy_poll`, the preload's
/// WARPSOCK_BUSY_POLL_US under a blocking receive) of a lone queue pair
/// spins in the short empty rounds a poll makes (issue 12:
/// `IoStats::short_rounds`), and misses nothing: the peer's message, sent
/// once the wait has spun 50 of them, ends the wait. Fails with the
/// wait's rounds full ones (the count never comes, nothing is sent).
#[test]
fn a_busy_polling_waits_spins_are_short_rounds_and_miss_nothing() {
    let (p, mut wc, before) = PingPair::spinning_settled();
    let (cq, qp, go) = (&p.cq, &p.qp, &p.go);
    let n = std::thread::scope(|sc| {
        sc.spawn(|| {
            let deadline = std::time::Instant::now() + LIMIT;
            while qp.io_stats().short_rounds < before + 50 {
                assert!(std::time::Instant::now() < deadline, "{:?}", qp.io_stats());
                std::thread::yield_now();
            }
            go.send(()).unwrap();
        });
        cq.wait_news(&mut wc, LIMIT, qp).unwrap().0
    });
    assert_eq!(n, 1, "{:?}", qp.io_stats());
    assert_eq!(p.answer_ping(&wc[0]), b"pong-456");
}

/// A busy-polling wait inside `spun::after_spin` (its caller spun its own
/// way already: a DDP socket's blocking receive, `XSocket::recv_busy`)
/// sleeps at once, as a wait without busy polling does: a 200 ms wait
/// that nothing ends makes no spin of short rounds; the peer's message,
/// sent after it, ends the next such wait from its sleep. Fails with the
/// mark ignored (the wait spins its 200 ms out in short rounds: thousands,
/// with a yield each, even on a loaded machine hundreds).
#[test]
fn a_busy_polling_wait_after_its_callers_spin_sleeps_at_once() {
    let (p, mut wc, before) = PingPair::spinning_settled();
    let (cq, qp, go) = (&p.cq, &p.qp, &p.go);
    let short = Duration::from_millis(200);
    let waited = warpsock_engine::spun::after_spin(|| cq.wait_news(&mut wc, short, qp));
    assert_eq!(waited.unwrap().0, 0);
    let spun = qp.io_stats().short_rounds - before;
    assert!(
        spun <= 3,
        "{spun} short rounds spun by a wait whose spin was spent"
    );
    go.send(()).unwrap();
    let n = warpsock_engine::spun::after_spin(|| cq.wait_news(&mut wc, LIMIT, qp))
        .unwrap()
        .0;
    assert_eq!(n, 1, "{:?}", qp.io_stats());
    assert_eq!(p.answer_ping(&wc[0]), b"pong-456");
}

/// With two queue pairs in a caller-driven context, a poll for one of them
/// makes progress on both: a message to the second is found by busy
/// polling with the first one's news (no round is the first one's alone).
#[test]
fn a_poll_with_two_queue_pairs_makes_progress_on_both() {
    let l = Listener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    let server = std::thread::spawn(move || {
        let (_c, pd, cq, buf) = end8(Progress::Thread, 4);
        let init = QpInit::new(&pd, &cq);
        let _first = l.accept_qp(&init, &[], Some(LIMIT)).unwrap();
        let second = l.accept_qp(&init, &[], Some(LIMIT)).unwrap();
        go_rx.recv_timeout(LIMIT).unwrap();
        buf.write(0, b"second-");
        second.post_send(send_wr(1, vec![buf.sge(0, 8)])).unwrap();
        let got = wait_n(&cq, 1);
        assert!(got[0].is_ok(), "{got:?}");
        go_rx.recv_timeout(LIMIT).unwrap();
    });
    let (_c, pd, cq, buf) = end8(Progress::Caller, 4);
    let first = connect(addr, &QpInit::new(&pd, &cq)).unwrap();
    let mut init = QpInit::new(&pd, &cq);
    init.recvs = vec![recv8(&buf)];
    let second = connect(addr, &init).unwrap();
    let mut wc = [warpsock_engine::Wc::default()];
    // Not alone in its context: no round is the short empty one.
    assert!(!cq.poll_news_idle(&mut wc, &first).2);
    go_tx.send(()).unwrap();
    spin_until(&cq, &first, &mut wc, |n, _| n > 0);
    assert!(wc[0].is_ok(), "{:?}", wc[0]);
    assert_eq!(wc[0].qp_num, second.qp_num());
    assert_eq!(&buf.to_vec()[..7], b"second-");
    assert_eq!(first.io_stats().short_rounds, 0);
    go_tx.send(()).unwrap();
    server.join().unwrap();
}

/// The peer resets the connection while a lone queue pair busy-polls: the
/// read that meets the reset ends the connection, and the same poll
/// returns the receive it flushed (the round goes on after such a read).
#[test]
fn a_lone_queue_pairs_busy_poll_sees_a_reset() {
    let p = PingPair::ending(true);
    let (cq, qp, buf) = (&p.cq, &p.qp, &p.buf);
    let mut wc = [warpsock_engine::Wc::default()];
    assert_eq!(cq.poll_news(&mut wc, qp).0, 0);
    while qp.poll_event().is_some() {}
    p.go.send(()).unwrap();
    spin_until(cq, qp, &mut wc, |n, _| n > 0);
    assert!(wc[0].is_ok(), "{:?}", wc[0]);
    buf.write(0, b"pong-456");
    qp.post_send(send_wr(2, vec![buf.sge(0, 8)])).unwrap();
    spin_until(cq, qp, &mut wc, |n, _| n > 0);
    assert!(wc[0].is_ok() && wc[0].wr_id == 2, "{:?}", wc[0]);
    qp.post_recv(recv8(buf)).unwrap();
    let drained = QpNews {
        rx_drained: true,
        ..QpNews::default()
    };
    for _ in 0..50 {
        assert_eq!(cq.poll_news(&mut wc, qp), (0, drained));
    }
    p.go.send(()).unwrap();
    spin_until(cq, qp, &mut wc, |n, _| n > 0);
    assert!(!wc[0].is_ok(), "{:?}", wc[0]);
    assert_eq!(wc[0].opcode, warpsock_engine::WcOpcode::Recv);
    let closed = std::iter::from_fn(|| qp.poll_event()).any(|e| matches!(e, Event::Closed(_)));
    assert!(closed, "{:?}", qp.io_stats());
    assert!(qp.io_stats().short_rounds >= 50, "{:?}", qp.io_stats());
    assert_eq!(p.finish(), b"pong-456");
}
