use super::*;
use crate::cq::first::{First, Parked};
use crate::{connect, Access, Listener, QpInit, RecvWr, SendOp, SendWr, Sge};

/// Only `EAGAIN` is a parked read's timeout (a slice slept); a signal
/// ends it early with nothing; `ETIMEDOUT` (a dead connection), other
/// errors, EOF and bytes end it early too (r19-xwake2, item 1).
#[test]
fn only_eagain_is_a_slept_slice() {
    let err = |n| Err(io::Error::from_raw_os_error(n));
    assert_eq!(Woke::of(&err(libc::EAGAIN)), Woke::TimedOut);
    assert_eq!(Woke::of(&err(libc::EINTR)), Woke::Interrupted);
    for e in [libc::ETIMEDOUT, libc::ECONNRESET, libc::EPIPE] {
        assert_eq!(Woke::of(&err(e)), Woke::Read, "errno {e}");
    }
    assert_eq!(Woke::of(&Ok(0)), Woke::Read);
    assert_eq!(Woke::of(&Ok(5)), Woke::Read);
}

/// An interruptible wait past its first empty slice sleeps in `poll`,
/// where a signal cannot be lost to the parked read's timeout (issue
/// 12): a wait that found nothing in its time marks the queue `idle`,
/// and the next one sleeps polled from its first park; `Cq::wait`
/// (not interruptible) keeps the blocking read. Both waits of 30 ms
/// end at their deadline whatever the machine's load: the counts do
/// not depend on how many slices fit.
#[test]
fn an_interruptible_wait_past_its_first_empty_slice_sleeps_in_poll() {
    let limit = Some(Duration::from_secs(20));
    let l = Listener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let peer = std::thread::spawn(move || {
        let ctx = Context::new(Progress::Thread).unwrap();
        let (pd, cq) = (ctx.alloc_pd(), ctx.create_cq(4).unwrap());
        let _qp = l.accept_qp(&QpInit::new(&pd, &cq), b"", limit).unwrap();
        done_rx.recv().unwrap();
    });
    let ctx = Context::new(Progress::Caller).unwrap();
    let (pd, cq) = (ctx.alloc_pd(), ctx.create_cq(4).unwrap());
    let buf = pd.alloc(64, Access::LOCAL_WRITE);
    let mut init = QpInit::new(&pd, &cq);
    init.recvs = vec![RecvWr {
        wr_id: 1,
        sgl: buf.sge(0, 64).into(),
    }];
    let qp = connect(addr, &init).unwrap();
    let mut wc = [Wc::default(); 4];
    let t = Duration::from_millis(30);
    // Not interruptible: the blocking read alone, and no mark.
    assert_eq!(cq.wait(&mut wc, t).unwrap(), 0);
    let s = ctx.wait_stats();
    assert!(s.parked_sleeps > 0, "{s:?}");
    assert_eq!(s.polled_sleeps, 0, "{s:?}");
    assert!(!cq.idle.load(Ordering::Relaxed));
    // Interruptible: ends at its deadline with nothing, marked.
    let (n, _) = cq.wait_news(&mut wc, t, &qp).unwrap();
    assert_eq!(n, 0);
    assert!(cq.idle.load(Ordering::Relaxed));
    // The next one sleeps in poll from its first park: every parked
    // sleep it makes is polled.
    let before = ctx.wait_stats();
    let (n, _) = cq.wait_news(&mut wc, t, &qp).unwrap();
    assert_eq!(n, 0);
    let after = ctx.wait_stats();
    let parked = after.parked_sleeps - before.parked_sleeps;
    let polled = after.polled_sleeps - before.polled_sleeps;
    assert!(parked > 0, "{before:?} -> {after:?}");
    assert_eq!(polled, parked, "{before:?} -> {after:?}");
    // `Cq::wait` again: still the blocking read.
    assert_eq!(cq.wait(&mut wc, t).unwrap(), 0);
    assert_eq!(ctx.wait_stats().polled_sleeps, after.polled_sleeps);
    done_tx.send(()).unwrap();
    drop(qp);
    peer.join().unwrap();
}

/// The idle mark is the queue's, not the last wait's (review r22-d
/// item 1): a completion after a slice slept with nothing keeps it
/// (a blocked call's waits ended by credits or other threads' send
/// completions poll from their first park), one within a wait's first
/// park clears it. Fails with the mark cleared by any completion, or
/// never cleared.
#[test]
fn the_idle_mark_is_cleared_only_by_a_completion_within_a_first_park() {
    let limit = Duration::from_secs(20);
    let pair = SenderPair::new(32, limit);
    let (ctx, cq, qp, go_tx) = (&pair.ctx, &pair.cq, &pair.qp, &pair.go);
    let mut wc = [Wc::default(); 4];
    assert!(!cq.idle.load(Ordering::Relaxed));
    // The message is sent once the wait has slept a slice with
    // nothing: it comes in a later park, and the mark stays.
    let empty = ctx.wait_stats().empty_wakes;
    let n = std::thread::scope(|sc| {
        sc.spawn(|| {
            let t = Instant::now();
            while ctx.wait_stats().empty_wakes == empty {
                assert!(t.elapsed() < limit, "{:?}", ctx.wait_stats());
                std::thread::yield_now();
            }
            go_tx.send(true).unwrap();
        });
        cq.wait_news(&mut wc, limit, qp).unwrap().0
    });
    assert_eq!(n, 1);
    assert!(
        cq.idle.load(Ordering::Relaxed),
        "cleared by a late completion"
    );
    // Sent (and written out) before the wait: it comes within the
    // first park, which clears the mark (tries bounded: a first park
    // that timed out on a loaded machine sets it again).
    let cleared = (0..20).any(|_| {
        go_tx.send(true).unwrap();
        assert_eq!(cq.wait_news(&mut wc, limit, qp).unwrap().0, 1);
        !cq.idle.load(Ordering::Relaxed)
    });
    assert!(cleared, "never cleared: {:?}", ctx.wait_stats());
    pair.end();
}

/// A caller-driven context whose one queue pair (`recvs` receives of 64
/// B posted) is connected to a peer thread that sends one 8 B Send per
/// `true` on `go`, each written out before the next go (its
/// completion), and ends at `false` ([`Self::end`]).
struct SenderPair {
    qp: Qp,
    cq: Cq,
    go: std::sync::mpsc::Sender<bool>,
    peer: std::thread::JoinHandle<()>,
    _buf: crate::Mr,
    ctx: Context,
}

impl SenderPair {
    fn new(recvs: u64, limit: Duration) -> Self {
        let l = Listener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let (go, go_rx) = std::sync::mpsc::channel::<bool>();
        let peer = std::thread::spawn(move || {
            let ctx = Context::new(Progress::Thread).unwrap();
            let (pd, cq) = (ctx.alloc_pd(), ctx.create_cq(64).unwrap());
            let buf = pd.alloc(64, Access::LOCAL_WRITE);
            let qp = l
                .accept_qp(&QpInit::new(&pd, &cq), b"", Some(limit))
                .unwrap();
            let mut wc = [Wc::default(); 4];
            while go_rx.recv().unwrap() {
                qp.post_send(send(9, buf.sge(0, 8))).unwrap();
                assert_eq!(cq.wait(&mut wc, limit).unwrap(), 1);
            }
        });
        let ctx = Context::new(Progress::Caller).unwrap();
        let (pd, cq) = (ctx.alloc_pd(), ctx.create_cq(64).unwrap());
        let buf = pd.alloc(64, Access::LOCAL_WRITE);
        let mut init = QpInit::new(&pd, &cq);
        let recv = |wr_id| RecvWr {
            wr_id,
            sgl: buf.sge(0, 64).into(),
        };
        init.recvs = (0..recvs).map(recv).collect();
        let qp = connect(addr, &init).unwrap();
        Self {
            qp,
            cq,
            go,
            peer,
            _buf: buf,
            ctx,
        }
    }

    /// The peer told to end, and joined (its failure fails the test).
    fn end(self) {
        self.go.send(false).unwrap();
        let Self { peer, qp, .. } = self;
        peer.join().unwrap();
        drop(qp);
    }
}

fn watched(ctx: &Context) -> usize {
    ctx.watched()
}

fn send(wr_id: u64, sge: Sge) -> SendWr {
    SendWr {
        wr_id,
        op: SendOp::Send {
            solicited: false,
            invalidate: None,
        },
        sgl: sge.into(),
        signaled: true,
    }
}

/// Caller-driven contexts keep their sockets out of epoll while callers
/// only poll or spin (each socket in an epoll set costs a kernel
/// callback per arriving segment), and register all of them the
/// moment a caller has to sleep in `epoll_wait` — which must then
/// wake for the completion, not at its timeout.
#[test]
fn caller_driven_sockets_join_epoll_only_to_sleep() {
    let l = Listener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    // The peer: a progress-thread context with two queue pairs; on the
    // second it sends once, after a pause, when told to.
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    let peer = std::thread::spawn(move || {
        let ctx = Context::new(Progress::Thread).unwrap();
        let (pd, cq) = (ctx.alloc_pd(), ctx.create_cq(16).unwrap());
        let buf = pd.alloc(64, Access::LOCAL_WRITE);
        let mut init = QpInit::new(&pd, &cq);
        init.recvs = vec![RecvWr {
            wr_id: 1,
            sgl: buf.sge(0, 64).into(),
        }];
        let limit = Some(Duration::from_secs(10));
        let q1 = l.accept_qp(&init, b"", limit).unwrap();
        init.recvs.clear();
        let q2 = l.accept_qp(&init, b"", limit).unwrap();
        go_rx.recv().unwrap();
        std::thread::sleep(Duration::from_millis(200));
        q2.post_send(send(2, buf.sge(0, 8))).unwrap();
        // Connected until the test has looked (a FIN would take a
        // socket out of epoll).
        go_rx.recv().unwrap();
        drop((q1, q2));
    });
    let ctx = Context::new(Progress::Caller).unwrap();
    let (pd, cq) = (ctx.alloc_pd(), ctx.create_cq(16).unwrap());
    let buf = pd.alloc(64, Access::LOCAL_WRITE);
    let mut init = QpInit::new(&pd, &cq);
    let q1 = connect(addr, &init).unwrap();
    init.recvs = vec![RecvWr {
        wr_id: 7,
        sgl: buf.sge(0, 64).into(),
    }];
    let q2 = connect(addr, &init).unwrap();
    // Spinning on poll: a Send goes out and completes, nothing joins
    // epoll but the context's own wake-up eventfd.
    q1.post_send(send(1, buf.sge(0, 8))).unwrap();
    let mut wc = [Wc::default(); 4];
    let t = Instant::now();
    while cq.poll(&mut wc) == 0 {
        assert!(t.elapsed() < Duration::from_secs(10), "no send completion");
    }
    assert!(wc[0].is_ok(), "{:?}", wc[0]);
    // (A caller-driven context's epoll set starts empty: it makes no
    // wake eventfd, which only a progress thread's ring would use.)
    assert_eq!(watched(&ctx), 0, "sockets registered while only polling");
    // Two live connections: a sleeping wait goes through epoll, which
    // must now watch both sockets and wake when the peer's Send lands.
    go_tx.send(()).unwrap();
    let t = Instant::now();
    let n = cq.wait(&mut wc, Duration::from_secs(20)).unwrap();
    assert_eq!(n, 1);
    assert_eq!((wc[0].wr_id, wc[0].byte_len), (7, 8), "{:?}", wc[0]);
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "the wait slept to its timeout: {:?}",
        t.elapsed()
    );
    assert_eq!(watched(&ctx), 2, "both sockets");
    go_tx.send(()).unwrap();
    drop((q1, q2));
    peer.join().unwrap();
}

/// A first park in the caller's hands (`Cq::park_first`, issue 12): a
/// lone Send its read brings is taken where the read put it (the take
/// gets the head receive's `wr_id` and the payload); with the queue's
/// notify fd armed since the park (`Cq::notify_fd`: a completion must
/// signal it), the take is declined and the receive completes as usual;
/// and a park dropped unslept gives its read back, so the next wait
/// reads the socket again, as one dropped after its sleep gives back
/// what the read brought.
#[test]
fn a_first_parks_take_predicts_a_lone_send_and_declines_an_armed_queue() {
    let limit = Duration::from_secs(20);
    let pair = SenderPair::new(64, limit);
    let (ctx, cq, qp, go_tx) = (&pair.ctx, &pair.cq, &pair.qp, &pair.go);
    let mut wc = [Wc::default(); 4];
    // The first FPDU makes the connection established: the core's
    // general path.
    go_tx.send(true).unwrap();
    assert_eq!(cq.wait_news(&mut wc, limit, qp).unwrap().0, 1);
    // One message into a first park, through `take`: what it did (a
    // read that timed out first, on a loaded machine, goes on waiting).
    let one = |wc: &mut [Wc]| -> Option<(u64, usize)> {
        let First::Parked(park) = cq.park_first(wc, limit, qp) else {
            panic!("no first park: {:?}", ctx.wait_stats());
        };
        go_tx.send(true).unwrap();
        let woke = park.sleep();
        match woke.take(wc, |wr_id, payload: &[u8]| Some((wr_id, payload.len()))) {
            Ok(Parked::Taken(got, _)) => Some(got),
            Ok(Parked::Completed(n, _)) => {
                assert_eq!((n, wc[0].byte_len), (1, 8), "{:?}", wc[0]);
                None
            }
            Ok(Parked::Nothing(resume)) => {
                assert_eq!(resume.into_wait(wc).unwrap().0, 1);
                None
            }
            Err(woke) => {
                assert_eq!(woke.into_wait(wc).unwrap().0, 1);
                None
            }
        }
    };
    let taken = (0..20).find_map(|_| one(&mut wc));
    let (wr_id, len) = taken.expect("no lone Send predicted in 20 tries");
    assert_eq!(len, 8);
    assert!(wr_id < 64, "not a receive's wr_id: {wr_id}");
    // Dropped unslept: the next wait still reads the socket.
    let First::Parked(park) = cq.park_first(&mut wc, limit, qp) else {
        panic!("no first park");
    };
    drop(park);
    go_tx.send(true).unwrap();
    assert_eq!(cq.wait_news(&mut wc, limit, qp).unwrap().0, 1);
    // Dropped after its sleep: what its read brought is serviced, and
    // the completion waits for the next wait.
    let First::Parked(park) = cq.park_first(&mut wc, limit, qp) else {
        panic!("no first park");
    };
    go_tx.send(true).unwrap();
    drop(park.sleep());
    assert_eq!(cq.wait_news(&mut wc, limit, qp).unwrap().0, 1);
    assert_eq!(wc[0].byte_len, 8, "{:?}", wc[0]);
    // Armed: never predicted.
    cq.notify_fd().unwrap();
    for i in 0..5 {
        assert_eq!(one(&mut wc), None, "predicted with the queue armed ({i})");
    }
    pair.end();
}

/// A queue holds no eventfd until its notify fd is asked for (the
/// preload's DDP sockets never ask: one descriptor each saved); the first
/// call makes it, later calls lend the same one, and a queue armed by it
/// raises it at a completion.
#[test]
fn the_notify_eventfd_is_made_by_the_first_notify_fd() {
    use std::os::fd::AsRawFd;
    let ctx = Context::new(Progress::Caller).unwrap();
    let cq = ctx.create_cq(4).unwrap();
    assert!(cq.notify.get().is_none(), "made before it was asked for");
    let fd = cq.notify_fd().unwrap().as_raw_fd();
    assert!(cq.notify.get().is_some());
    assert_eq!(cq.notify_fd().unwrap().as_raw_fd(), fd, "a second eventfd");
    assert!(ctx.sh.inner.lock().cq(cq.id).armed());
}

/// Only a progress-thread context makes its wake eventfd: a caller-driven
/// one never rings it (one descriptor less for each of the preload's DDP
/// sockets).
#[test]
fn a_caller_driven_context_makes_no_wake_eventfd() {
    let caller = Context::new(Progress::Caller).unwrap();
    assert!(caller.sh.inner.wake_fd().is_none());
    assert_eq!(caller.watched(), 0);
    let thread = Context::new(Progress::Thread).unwrap();
    assert!(thread.sh.inner.wake_fd().is_some());
    assert_eq!(
        thread.watched(),
        1,
        "the wake eventfd in the progress thread's set"
    );
}
