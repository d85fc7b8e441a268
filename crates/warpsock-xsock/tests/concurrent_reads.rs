//! Large reads that run at once on one socket — two threads' blocking
//! reads, or an asynchronous receive and a blocking read — each eligible
//! for a zero-copy read (a sink, or retargeted receives): one zero-copy
//! read runs at a time (`State::zero_copy_idle`), the others copy. Every
//! byte of the stream reaches exactly one read, at its place. Before, the
//! second read offered a sink beside the first one's and hit
//! `post_sink_after`'s assertion with the socket's lock held, and a
//! second placed read's receives, retargeted behind the first's, were
//! taken by the first as its own (helper 65's review).

use std::sync::atomic::Ordering;
use std::sync::Mutex;
use std::time::Instant;

use warpsock_xsock::io::{AioOp, Options, RecvFlags, XSocket};

mod net;

use net::{switch_both, tcp_pair, LIMIT};

/// The stream: consecutive little-endian u64 counters, so that a piece
/// of it tells where it came from.
fn stream(len: usize) -> Vec<u8> {
    (0..len / 8)
        .flat_map(|k| (k as u64).to_le_bytes())
        .collect()
}

/// Where `piece` begins in [`stream`], if it is long enough to tell (two
/// whole counters, one after the other).
fn locate(piece: &[u8]) -> Option<usize> {
    let word = |at: usize| u64::from_le_bytes(piece[at..at + 8].try_into().unwrap());
    (0..8).find_map(|a| {
        (piece.len() >= a + 16 && word(a + 8) == word(a).wrapping_add(1))
            .then(|| (word(a) as usize * 8).checked_sub(a))
            .flatten()
    })
}

/// The pieces the reads returned tile the whole stream: each one is the
/// stream's bytes at its place (but for a few too short to tell), none
/// overlaps another, and together they are all of it.
fn assert_tiles(pieces: &[Vec<u8>], whole: &[u8]) {
    let mut placed: Vec<(usize, usize)> = Vec::new();
    let mut unplaced = 0;
    for p in pieces {
        match locate(p) {
            Some(at) => {
                assert!(
                    at + p.len() <= whole.len() && whole[at..at + p.len()] == p[..],
                    "a piece of {} bytes is not the stream's at {at}",
                    p.len()
                );
                placed.push((at, p.len()));
            }
            None => {
                // Any 23 bytes hold two whole counters.
                assert!(
                    p.len() < 23,
                    "a piece of {} bytes is not the stream's",
                    p.len()
                );
                unplaced += p.len();
            }
        }
    }
    placed.sort_unstable();
    let mut end = 0;
    let mut gaps = 0;
    for &(at, len) in &placed {
        assert!(at >= end, "two reads returned the bytes at {at}");
        gaps += at - end;
        end = at + len;
    }
    gaps += whole.len() - end;
    assert_eq!(gaps, unplaced, "bytes lost or read twice");
}

/// Reads on `x` until its end of stream, each into a buffer of `len`
/// bytes; the pieces read.
fn read_to_end(x: &XSocket, len: usize) -> Vec<Vec<u8>> {
    let mut pieces = Vec::new();
    let mut buf = vec![0u8; len];
    let t = Instant::now();
    loop {
        assert!(t.elapsed() < LIMIT, "the reads never ended");
        let (n, _) = x
            .recv(&mut buf, RecvFlags::default(), Some(LIMIT))
            .expect("recv");
        if n == 0 {
            return pieces;
        }
        pieces.push(buf[..n].to_vec());
    }
}

/// Sends all of `whole` on `x`, then its end of stream, and drives `x`'s
/// engine until all of it left (an orderly close; `x` itself lives on,
/// so the peer's credits for the last messages draw no reset). A socket
/// of this library makes progress only in its calls: after a bare
/// `shutdown`, what the engine held for a full kernel send buffer (the
/// readers behind, on a loaded machine) stayed there, and the readers
/// waited for it until their timeouts (1 run in ~14 of the placed case).
fn send_then_end(x: &XSocket, whole: &[u8]) {
    let mut sent = 0;
    while sent < whole.len() {
        sent += x.send(&whole[sent..], false, Some(LIMIT)).expect("send");
    }
    assert!(x.close(LIMIT), "the stream never left");
}

/// Waits until the thread `tid` of this process sleeps (`/proc`'s state
/// `S`): a reader waiting for bytes. (A sleep on a lock would pass too,
/// and the test then only fails to try what it tries: never falsely.)
fn sleeping(tid: libc::pid_t) {
    let t = Instant::now();
    let path = format!("/proc/self/task/{tid}/stat");
    loop {
        let stat = std::fs::read_to_string(&path).expect("the reader's stat");
        // The state follows the name's closing parenthesis.
        if stat
            .rsplit_once(") ")
            .is_some_and(|(_, rest)| rest.starts_with('S'))
        {
            return;
        }
        assert!(t.elapsed() < LIMIT, "the reader never waited");
        std::thread::yield_now();
    }
}

/// A reader thread's body: its thread id sent on `tid`, then its reads.
fn reader(x: &XSocket, tid: std::sync::mpsc::Sender<libc::pid_t>) -> Vec<Vec<u8>> {
    // SAFETY: gettid has no arguments and cannot fail.
    tid.send(unsafe { libc::gettid() }).unwrap();
    read_to_end(x, 1 << 20)
}

/// Two threads' blocking 1 MiB reads waiting at once on an idle socket,
/// then 4 MiB and the end of stream from the peer.
fn two_blocking_readers(o: &Options) {
    let (a, b) = tcp_pair();
    let (xa, xb) = switch_both(&a, &b, o);
    let whole = stream(4 << 20);
    let pieces = Mutex::new(Vec::new());
    std::thread::scope(|sc| {
        let (tid, tids) = std::sync::mpsc::channel();
        let readers: Vec<_> = (0..2)
            .map(|_| {
                let tid = tid.clone();
                sc.spawn(|| {
                    let got = reader(&xa, tid);
                    pieces.lock().unwrap().extend(got);
                })
            })
            .collect();
        for _ in 0..2 {
            sleeping(tids.recv_timeout(LIMIT).unwrap());
        }
        send_then_end(&xb, &whole);
        for r in readers {
            r.join().expect("a reader panicked");
        }
    });
    assert_tiles(&pieces.into_inner().unwrap(), &whole);
}

/// Sinks (the default): the second read copies while the first's sink is
/// offered.
#[test]
fn two_threads_large_reads_with_sinks() {
    two_blocking_readers(&net::opts());
}

/// Retargeted receives (`Options::sinks` off): the second read copies
/// while the first's receives point at its buffer. (Whether the second
/// would have taken the first's placed bytes before the rule is the
/// scheduler's: the first read, driving the engine, mostly takes them
/// first. Checked here: every byte delivered once, in its place.)
#[test]
fn two_threads_large_reads_placed() {
    two_blocking_readers(&Options {
        sinks: false,
        ..net::opts()
    });
}

/// A vectored read of a 100-byte head and a 1 MiB buffer offers the
/// large one as a sink behind the head (`recv_into_later_sink`); then an
/// asynchronous 1 MiB receive is queued behind it. The head's bytes are
/// the first reader's: the receive, pumped as the bytes land, takes none
/// of them (`reads_reserved`). Before, it copied them, and the first
/// reader, its head short, dropped the bytes the peer had placed in its
/// sink (helper 67's review).
#[test]
fn a_later_sinks_head_is_its_readers() {
    let (a, b) = tcp_pair();
    let (xa, xb) = switch_both(&a, &b, &net::opts());
    let whole = stream(4 << 20);
    let mut abuf = vec![0u8; 1 << 20];
    let mut pieces = std::thread::scope(|sc| {
        let offers = xa.stats().sink_offers.load(Ordering::Relaxed);
        let vectored = sc.spawn(|| {
            let mut pieces = Vec::new();
            let (mut head, mut body) = (vec![0u8; 100], vec![0u8; 1 << 20]);
            let t = Instant::now();
            loop {
                assert!(t.elapsed() < LIMIT, "the reads never ended");
                let (n, _) = xa
                    .recv_vectored(
                        &mut [&mut head, &mut body],
                        RecvFlags::default(),
                        Some(LIMIT),
                    )
                    .expect("recv_vectored");
                if n == 0 {
                    return pieces;
                }
                let mut piece = head[..n.min(100)].to_vec();
                piece.extend_from_slice(&body[..n.saturating_sub(100)]);
                pieces.push(piece);
            }
        });
        let t = Instant::now();
        while xa.stats().sink_offers.load(Ordering::Relaxed) == offers {
            assert!(t.elapsed() < LIMIT, "the later sink was never offered");
            std::thread::yield_now();
        }
        #[allow(unsafe_code)]
        // SAFETY: `abuf` lives, untouched, until the completion is
        // collected below.
        unsafe { xa.aio_recv(abuf.as_mut_ptr(), abuf.len(), 8) }.expect("aio_recv");
        send_then_end(&xb, &whole);
        vectored.join().expect("the vectored reader panicked")
    });
    pieces.push(aio_piece(&xa, &abuf, 8));
    assert_tiles(&pieces, &whole);
}

/// The bytes `x`'s asynchronous receive `cookie` into `buf` completed
/// with.
fn aio_piece(x: &XSocket, buf: &[u8], cookie: u64) -> Vec<u8> {
    let mut done = Vec::new();
    let t = Instant::now();
    while done.is_empty() {
        assert!(
            t.elapsed() < LIMIT,
            "the asynchronous receive never completed"
        );
        x.aio_poll(&mut done, 1);
        std::thread::yield_now();
    }
    assert_eq!((done[0].op, done[0].cookie), (AioOp::Recv, cookie));
    let n = done[0].result.expect("the asynchronous receive");
    buf[..n].to_vec()
}

/// An asynchronous 1 MiB receive offered as a sink on an idle socket,
/// then a blocking 1 MiB read on another thread: the read copies; the
/// two take the stream between them.
#[test]
fn an_asynchronous_receive_and_a_blocking_read() {
    let (a, b) = tcp_pair();
    let (xa, xb) = switch_both(&a, &b, &net::opts());
    let whole = stream(2 << 20);
    let mut abuf = vec![0u8; 1 << 20];
    #[allow(unsafe_code)]
    // SAFETY: `abuf` lives, untouched, until the completion is collected
    // below.
    unsafe { xa.aio_recv(abuf.as_mut_ptr(), abuf.len(), 7) }.expect("aio_recv");
    let mut pieces = std::thread::scope(|sc| {
        let (tid, tids) = std::sync::mpsc::channel();
        let reader = sc.spawn(|| reader(&xa, tid));
        sleeping(tids.recv_timeout(LIMIT).unwrap());
        send_then_end(&xb, &whole);
        reader.join().expect("the blocking read panicked")
    });
    pieces.push(aio_piece(&xa, &abuf, 7));
    assert_tiles(&pieces, &whole);
}
