//! Programs that send before they read, over switched sockets (review
//! r19-xdead, item 1): a return needs a credit, and when our own DATA
//! took the last one — into a window whose reader does not read until
//! its own send ends — the slots our reader freed could never go back,
//! and both ends waited for ever where TCP completes. DATA now leaves the
//! last credit to a CREDIT (`Stream::may_send`). Every call is bounded:
//! a hang fails at its timeout.

use std::time::{Duration, Instant};

use warpsock_xsock::io::{Options, RecvFlags, XSocket};

mod net;

use net::{opts, pattern, switch_both, tcp_pair, LIMIT};

const SHORT: Option<Duration> = Some(Duration::from_secs(4));

/// 16 slots of 1 KiB payload a side: a window of 16 KiB.
fn small_window() -> Options {
    Options {
        slots: 16,
        slot_size: Options::slot_size_for(1024),
        ..opts()
    }
}

/// Reads `n` bytes from `x` in reads of at most `chunk`, each bounded.
fn read_n(x: &XSocket, n: usize, chunk: usize, who: &str) -> Vec<u8> {
    let mut got = Vec::new();
    let mut buf = vec![0u8; chunk];
    while got.len() < n {
        let want = chunk.min(n - got.len());
        let (k, _) = x
            .recv(&mut buf[..want], RecvFlags::default(), SHORT)
            .unwrap_or_else(|e| panic!("{who}'s read after {}/{n}: {e}", got.len()));
        assert!(k > 0, "{who}: end of stream after {}/{n}", got.len());
        got.extend_from_slice(&buf[..k]);
    }
    got
}

/// The review's interleaving, staged: A fills B's window with its DATA
/// (down to its last credit, B not reading), then reads B's 8 B greeting
/// (a return to make); A's send goes on, non-blocking — before, that
/// return let its DATA take the last credit. Then B, one thread, sends
/// two windows and only after that reads, while A reads B's bytes as they
/// come: A's returns need a credit, and it must still hold one. B's send
/// must complete (4 s), and every byte arrive both ways.
#[test]
fn a_one_thread_end_that_sends_then_reads_finishes() {
    const LEN: usize = 32 << 10;
    let (a, b) = tcp_pair();
    let (xa, xb) = switch_both(&a, &b, &small_window());
    let ma = pattern(LEN, 1);
    let mb = pattern(LEN, 2);
    // A's DATA until the books block it (B reads nothing yet).
    let mut off = 0;
    let t = Instant::now();
    while off < 15 << 10 {
        assert!(t.elapsed() < LIMIT, "A sent {off}");
        if let Ok(n) = xa.send(&ma[off..], true, None) {
            off += n;
        }
        xa.progress();
    }
    xb.send(b"greeting", false, SHORT).unwrap();
    assert_eq!(read_n(&xa, 8, 8, "A"), b"greeting");
    // With that return to make, A's send goes on if the books let it.
    if let Ok(n) = xa.send(&ma[off..], true, None) {
        off += n;
    }
    std::thread::scope(|sc| {
        let sb = sc.spawn(|| {
            let n = xb
                .send(&mb, false, SHORT)
                .unwrap_or_else(|e| panic!("B's send: {e}"));
            assert_eq!(n, LEN, "B's send stopped short");
            let got = read_n(&xb, LEN, 4096, "B");
            // B's send may have left bytes in its send buffer: the close
            // drives them out (no progress thread here).
            assert!(xb.close(LIMIT), "B's bytes all left");
            got
        });
        assert!(read_n(&xa, LEN, 4096, "A") == mb, "B's bytes differ");
        let n = xa.send(&ma[off..], false, Some(LIMIT)).unwrap();
        assert_eq!(off + n, LEN, "A's send");
        assert!(sb.join().unwrap() == ma, "A's bytes differ");
    });
}

/// A client pipelines 64 requests of 8 B (64 send calls) before it reads
/// any answer; the server, an event loop (as redis), answers each request
/// as it reads it and keeps the answers its socket will not take yet.
/// Over TCP this is nothing; here the answers fill the client's window,
/// and the server's returns of the requests it read must still go — they
/// could not once its answers had taken its last credit (about 30
/// requests in).
#[test]
fn a_pipelining_client_gets_every_answer() {
    const N: u64 = 64;
    let (a, b) = tcp_pair();
    let (server, client) = switch_both(&a, &b, &small_window());
    let nb = RecvFlags {
        nonblocking: true,
        ..RecvFlags::default()
    };
    std::thread::scope(|sc| {
        sc.spawn(|| {
            let (mut req, mut read, mut answered) = (Vec::new(), 0u64, 0u64);
            let mut out: Vec<u8> = Vec::new();
            let t = Instant::now();
            while answered < N {
                assert!(
                    t.elapsed() < LIMIT,
                    "the server read {read} requests, answered {answered}"
                );
                let mut buf = [0u8; 8];
                let want = 8 - req.len();
                if let Ok((k, _)) = server.recv(&mut buf[..want], nb, None) {
                    assert!(k > 0, "the client closed after {read} requests");
                    req.extend_from_slice(&buf[..k]);
                    if req.len() == 8 {
                        assert_eq!(req, pattern(8, read), "request {read}");
                        out.extend_from_slice(&pattern(8, 1000 + read));
                        req.clear();
                        read += 1;
                    }
                }
                if !out.is_empty() {
                    if let Ok(k) = server.send(&out[..8], true, None) {
                        assert_eq!(k, 8, "an 8 B answer in parts");
                        out.drain(..8);
                        answered += 1;
                    }
                }
                std::thread::yield_now();
            }
            // Answers the send buffer took may still wait for credits: the
            // close drives the socket until they left (no progress thread
            // here; over TCP the kernel sends them).
            assert!(server.close(LIMIT), "the server's answers all left");
        });
        for i in 0..N {
            let n = client
                .send(&pattern(8, i), false, SHORT)
                .unwrap_or_else(|e| panic!("the client's request {i}: {e}"));
            assert_eq!(n, 8, "request {i}");
        }
        for i in 0..N {
            assert_eq!(
                read_n(&client, 8, 8, "the client"),
                pattern(8, 1000 + i),
                "answer {i}"
            );
        }
    });
}
