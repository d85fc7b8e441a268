//! No byte the peer sends reaches the program's memory after its close
//! (`XSocket::close_begin`, the preload's reaper's close: `close(2)`
//! returns at once, and the program may free what it handed over): its
//! mappings and the buffers of its asynchronous receives are let go as
//! the close begins. Before, a peer's `riowrite` into a mapping, or its
//! bytes into an asynchronous receive's sink, landed there for as long as
//! the close lasted (up to the linger).

use std::sync::mpsc::channel;
use std::time::{Duration, Instant};

use warpsock_xsock::io::{Phase, RecvFlags, XSocket};

mod net;

use net::{established, opts, pattern, switch_both, tcp_pair, LIMIT, NONBLOCKING};

/// Steps `x`'s close (begun) to its end, driving `peer` too, until
/// `touched` says the program's memory was written or `LIMIT`: whether it
/// was.
fn close_to_end(
    x: &XSocket,
    peer: &XSocket,
    mut c: warpsock_xsock::io::Closing,
    touched: impl Fn() -> bool,
) -> bool {
    let t = Instant::now();
    loop {
        if touched() {
            return true;
        }
        if x.close_step(&mut c, Instant::now()) == Phase::Done || t.elapsed() > LIMIT {
            return touched();
        }
        peer.progress();
        std::thread::yield_now();
    }
}

/// Maps `buf` at `x` (`writable`, `readable` by the peer) and returns
/// its offset once `peer` knows the mapping (it read a byte sent after
/// it).
///
/// # Safety
///
/// `buf` must outlive `x` and `peer` (dropped after them).
#[allow(unsafe_code)]
unsafe fn map_known(
    x: &XSocket,
    peer: &XSocket,
    buf: &mut [u8],
    writable: bool,
    readable: bool,
) -> u64 {
    // SAFETY: the caller's.
    let off =
        unsafe { x.riomap(buf.as_mut_ptr(), buf.len(), writable, readable, None) }.expect("riomap");
    x.send(b"m", false, Some(LIMIT)).unwrap();
    let mut m = [0u8; 1];
    peer.recv(&mut m, RecvFlags::default(), Some(LIMIT))
        .unwrap();
    off
}

/// A peer's one-sided write into a mapping after the close fails (the
/// mapping is gone, or, one the peer may also read, goes on from a copy
/// that is no longer writable: a remote protection error ends the
/// connection, as bytes after a TCP close draw a reset) and writes
/// nothing, into the program's buffer or anywhere (helper 70's review: a
/// read and write mapping took the write into its copy, silently).
#[test]
fn a_mapping_takes_no_write_after_the_close() {
    for readable in [false, true] {
        let (a, b) = tcp_pair();
        let (xa, xb) = switch_both(&a, &b, &opts());
        let mut target = vec![0u8; 64 << 10];
        #[allow(unsafe_code)]
        // SAFETY: `target` outlives both sockets (dropped last).
        let off = unsafe { map_known(&xa, &xb, &mut target, true, readable) };
        let c = xa.close_begin(LIMIT, Instant::now());
        let data = pattern(target.len(), 3);
        // Sent (its completion is local) or refused: either way, not placed.
        let _ = xb.riowrite(&data, off);
        let at = target.as_ptr();
        let touched = || {
            // SAFETY: `target` is alive; the engine writes it only in the
            // steps of this thread, between these reads.
            #[allow(unsafe_code)]
            unsafe { std::slice::from_raw_parts(at, data.len()) }
                .iter()
                .any(|&b| b != 0)
        };
        assert!(
            !close_to_end(&xa, &xb, c, touched),
            "the peer's write landed after the close (readable {readable})"
        );
        let t = Instant::now();
        while xb.error().is_none() {
            assert!(
                t.elapsed() < LIMIT,
                "the write was taken (readable {readable})"
            );
            xb.progress();
            std::thread::yield_now();
        }
        drop((xa, xb));
        drop(target);
    }
}

/// The program's close gives its memory back though another thread holds
/// the socket's lock a moment as it begins (the progress thread's round):
/// it waits for the lock, bounded (`detach_program_memory_within`), and
/// the peer's write after it lands nowhere. With one try (`false`), the
/// detach was left to the close's start in the reaper, later, when the
/// program may have freed or unmapped the memory it then copies.
#[test]
fn the_close_detaches_though_another_thread_holds_the_lock() {
    let (a, b) = tcp_pair();
    let (xa, xb) = switch_both(&a, &b, &opts());
    let mut target = vec![0u8; 64 << 10];
    #[allow(unsafe_code)]
    // SAFETY: `target` outlives both sockets (dropped last).
    let off = unsafe { map_known(&xa, &xb, &mut target, true, false) };
    let (held, is_held) = channel();
    let detached = std::thread::scope(|sc| {
        let xa = &xa;
        sc.spawn(move || {
            xa.with_lock_held(|| {
                held.send(()).unwrap();
                // A round's moment (the close waits for it, not on it).
                std::thread::sleep(Duration::from_millis(50));
            });
        });
        is_held.recv().unwrap();
        xa.detach_program_memory_within(LIMIT)
    });
    assert!(detached, "the close gave up on the lock");
    let data = pattern(target.len(), 4);
    let _ = xb.riowrite(&data, off);
    let t = Instant::now();
    while xb.error().is_none() {
        assert!(t.elapsed() < LIMIT, "the write was taken");
        xa.progress();
        xb.progress();
        std::thread::yield_now();
    }
    assert!(
        target.iter().all(|&b| b == 0),
        "the peer's write landed after the close"
    );
    drop((xa, xb));
    drop(target);
}

/// The bytes a peer sends into an asynchronous receive's sink after the
/// close are not placed there (the sink is gone with the receive).
#[test]
fn an_asynchronous_receive_takes_no_byte_after_the_close() {
    let (a, b) = tcp_pair();
    let (xa, xb) = switch_both(&a, &b, &opts());
    let mut buf = vec![0u8; 1 << 20];
    #[allow(unsafe_code)]
    // SAFETY: `buf` outlives both sockets (dropped last).
    unsafe { xa.aio_recv(buf.as_mut_ptr(), buf.len(), 1) }.expect("aio_recv");
    let t = Instant::now();
    while !xb.peer_sink_offered() {
        assert!(t.elapsed() < LIMIT, "the peer never heard of a sink");
        // Both driven: a responder's first message waits for the
        // initiator's first FPDU (RFC 6581).
        xa.progress();
        xb.progress();
        std::thread::yield_now();
    }
    let c = xa.close_begin(LIMIT, Instant::now());
    let data = pattern(buf.len(), 5);
    let at = buf.as_ptr();
    let len = buf.len();
    let touched = || {
        // SAFETY: as in the test above.
        #[allow(unsafe_code)]
        unsafe { std::slice::from_raw_parts(at, len) }
            .iter()
            .any(|&b| b != 0)
    };
    let landed = std::thread::scope(|sc| {
        let sender = sc.spawn(|| {
            // Sent or refused: either way, not placed.
            let _ = xb.send(&data, false, Some(LIMIT));
        });
        let landed = close_to_end(&xa, &xb, c, touched);
        sender.join().unwrap();
        landed
    });
    assert!(
        !landed,
        "the peer's bytes landed in the receive's buffer after the close"
    );
    drop((xa, xb));
    drop(buf);
}

/// Stream bytes the peer sent after our close began, before it took in
/// our end of stream (a small send goes straight, with no round), reached
/// a closed socket: over TCP its kernel answers with a reset. The peer's
/// send fails (`EPIPE`: its end was open) once it reads our EOF, which
/// says what we had received, and the reset ends our close's linger.
/// Before, our engine, disconnected as the sending ended, discarded the
/// bytes and nothing told the peer (diffuzz's close race: its `poll`
/// never showed `POLLERR`).
#[test]
fn bytes_sent_into_a_close_reset_the_connection() {
    sent_into_a_close(false);
}

/// As [`bytes_sent_into_a_close_reset_the_connection`], after our
/// `shutdown(SHUT_WR)`: our end of stream left before the close, plain,
/// and could not say what we had received. The peer has read it (its
/// reads end) when it sends, so nothing tells it but our engine, which
/// takes the bytes in and resets. Before, the engine disconnected as the
/// sending ended (nothing was left to send) and discarded them: the peer
/// saw no error until the linger's end (diffuzz seeds 189 and 465, 1 run
/// in 25, when the reaper's step came before the peer's bytes).
#[test]
fn bytes_sent_into_a_close_after_our_shutdown_reset_the_connection() {
    sent_into_a_close(true);
}

/// A closes (after its `SHUT_WR` if `shut_first`), its close stepped
/// past its sending; then B sends, and must get TCP's `EPIPE` (its end
/// still open) from the reset before A's close ends.
fn sent_into_a_close(shut_first: bool) {
    let (xa, xb) = established(&opts());
    let mut one = [0u8; 1];
    if shut_first {
        xa.shutdown(false, true);
        let (k, _) = xb
            .recv(&mut one, RecvFlags::default(), Some(LIMIT))
            .unwrap();
        assert_eq!(k, 0, "A's end of stream left before its close");
    }
    let mut c = xa.close_begin(LIMIT, Instant::now());
    let t = Instant::now();
    while xa.close_step(&mut c, Instant::now()) == Phase::Sending {
        assert!(t.elapsed() < LIMIT, "the close never sent its end");
        std::thread::yield_now();
    }
    let _ = xb.send(&pattern(100, 9), false, Some(LIMIT));
    while xb.error().is_none() {
        assert!(t.elapsed() < LIMIT, "no reset while the close lingered");
        xa.close_step(&mut c, Instant::now());
        xb.progress();
        std::thread::yield_now();
    }
    let (errno, why) = xb.error().unwrap();
    assert_eq!(errno, libc::EPIPE, "the peer's error ({why})");
    assert_eq!(
        xb.recv(&mut one, RecvFlags::default(), Some(LIMIT))
            .unwrap()
            .0,
        0,
        "reads end first"
    );
    while xa.close_step(&mut c, Instant::now()) != Phase::Done {
        assert!(t.elapsed() < LIMIT, "the close lingered on past the reset");
        std::thread::yield_now();
    }
}

/// Our close's end of stream leaves in the close's own call
/// (`close_begin`), not at its first step: the peer's bytes sent straight
/// right after our close then meet an end of stream already on its way,
/// and the peer reads it (0) before the reset they draw, as over TCP,
/// where the FIN goes with `close`. Left to the first step — the
/// preload's reaper, later — that step took the peer's bytes in first,
/// reset, and the end of stream never left: the peer read `ECONNRESET`
/// (diffuzz seed 3650). Fails with `ECONNRESET`.
#[test]
fn a_close_sends_its_end_of_stream_in_its_own_call() {
    let (xa, xb) = established(&opts());
    let mut one = [0u8; 1];
    let mut c = xa.close_begin(LIMIT, Instant::now());
    let _ = xb.send(&pattern(100, 9), false, Some(LIMIT));
    let t = Instant::now();
    while xa.close_step(&mut c, Instant::now()) == Phase::Sending {
        assert!(t.elapsed() < LIMIT, "the close never sent its end");
        std::thread::yield_now();
    }
    let r = xb.recv(&mut one, RecvFlags::default(), Some(LIMIT));
    assert_eq!(r.unwrap().0, 0, "the end of stream first");
}

/// A peer whose bytes all reached us before our close takes our close's
/// end of stream as a clean end: no error.
#[test]
fn a_close_after_every_byte_is_a_clean_end() {
    let (a, b) = tcp_pair();
    let (xa, xb) = switch_both(&a, &b, &opts());
    xb.send(&pattern(100, 9), false, Some(LIMIT)).unwrap();
    let mut got = [0u8; 100];
    let mut n = 0;
    while n < got.len() {
        n += xa
            .recv(&mut got[n..], RecvFlags::default(), Some(LIMIT))
            .unwrap()
            .0;
    }
    let mut c = xa.close_begin(LIMIT, Instant::now());
    let t = Instant::now();
    let mut one = [0u8; 1];
    loop {
        assert!(t.elapsed() < LIMIT, "our end of stream never came");
        xa.close_step(&mut c, Instant::now());
        match xb.recv(
            &mut one,
            RecvFlags {
                nonblocking: true,
                ..RecvFlags::default()
            },
            None,
        ) {
            Ok((0, _)) => break,
            Ok(r) => panic!("{r:?}"),
            Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::WouldBlock, "{e}"),
        }
        std::thread::yield_now();
    }
    assert_eq!(xb.error(), None, "a clean end");
}

/// A peer's read of a mapping whose response our engine is still writing
/// (the peer not reading: its window shut) when we close: the mapping
/// goes on from a copy, so the response, and the bytes we sent after it,
/// queued behind it, still reach the peer, then our end — and the
/// response carries the mapping's bytes as they were at the close, not
/// what the program wrote there after it. Before, the close deregistered
/// the mapping under the queued response, and the peer read a clean end
/// with our last bytes lost (helper 69's review).
#[test]
fn a_read_of_a_mapping_under_way_at_the_close_ends_whole() {
    let (a, b) = tcp_pair();
    let (xa, xb) = switch_both(&a, &b, &opts());
    let big = 16 << 20;
    let mut target = vec![1u8; big];
    #[allow(unsafe_code)]
    // SAFETY: `target` outlives both sockets (dropped last).
    let off = unsafe { map_known(&xa, &xb, &mut target, false, true) };
    let mut m = [0u8; 1];
    xb.send(b"n", false, Some(LIMIT)).unwrap();
    xa.recv(&mut m, RecvFlags::default(), Some(LIMIT)).unwrap();
    let mut local = vec![0u8; big];
    #[allow(unsafe_code)]
    // SAFETY: `local` outlives both sockets (dropped last).
    unsafe { xb.aio_rio(local.as_mut_ptr(), big, off, false, 7) }.expect("aio read");
    // The request reaches us; our engine writes the response until the
    // peer's window shuts (it reads nothing meanwhile).
    let t = Instant::now();
    while xa.engine_backlog().0 == 0 {
        assert!(t.elapsed() < LIMIT, "the response never filled the window");
        xa.progress();
        std::thread::yield_now();
    }
    let last = b"last words before the close";
    assert_eq!(xa.send(last, false, Some(LIMIT)).unwrap(), last.len());
    let mut c = xa.close_begin(LIMIT, Instant::now());
    // The program's memory is its own again.
    target.fill(2);
    let mut got = Vec::new();
    let mut done = Vec::new();
    let end = loop {
        assert!(t.elapsed() < LIMIT, "no end: got {got:?}");
        xa.close_step(&mut c, Instant::now());
        xb.progress();
        xb.aio_poll(&mut done, 4);
        let mut buf = [0u8; 64];
        match xb.recv(&mut buf, NONBLOCKING, None) {
            Ok((0, _)) => break Ok(()),
            Ok((n, _)) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => break Err(e),
        }
        std::thread::yield_now();
    };
    assert_eq!(
        &got[..],
        &last[..],
        "the bytes sent before the close ({end:?})"
    );
    assert!(
        end.is_ok() && xb.error().is_none(),
        "{end:?} {:?}",
        xb.error()
    );
    while done.is_empty() {
        assert!(t.elapsed() < LIMIT, "the read never completed");
        xb.progress();
        xb.aio_poll(&mut done, 4);
    }
    assert_eq!(done[0].result, Ok(big), "the read");
    assert!(
        local.iter().all(|&b| b == 1),
        "the mapping's bytes as at the close"
    );
    drop((xa, xb));
    drop((target, local));
}

/// An asynchronous send larger than the peer's window, and an
/// asynchronous read queued behind it, when we close: both go on from
/// (into) copies — the program changes its buffers after the close, and
/// the peer still gets every byte as it was, then our end, with no error
/// at either end. Before, the send was read from the program's buffer
/// after the close, and the read's registration was gone under it (a
/// local protection error; helper 69's review).
#[test]
fn asynchronous_operations_queued_at_the_close_go_on_from_copies() {
    let (a, b) = tcp_pair();
    let (xa, xb) = switch_both(&a, &b, &opts());
    let mut region = vec![9u8; 1 << 20];
    #[allow(unsafe_code)]
    // SAFETY: `region` outlives both sockets (dropped last).
    let off = unsafe { map_known(&xb, &xa, &mut region, false, true) };
    let mut m = [0u8; 1];
    xa.send(b"n", false, Some(LIMIT)).unwrap();
    xb.recv(&mut m, RecvFlags::default(), Some(LIMIT)).unwrap();
    let want = pattern(16 << 20, 4);
    let mut data = want.clone();
    let mut local = vec![0u8; 1 << 20];
    #[allow(unsafe_code)]
    // SAFETY: both buffers outlive both sockets (dropped last).
    unsafe {
        xa.aio_send(data.as_ptr(), data.len(), 1).expect("aio_send");
        xa.aio_rio(local.as_mut_ptr(), local.len(), off, false, 2)
            .expect("aio read");
    }
    let mut c = xa.close_begin(LIMIT, Instant::now());
    data.fill(0xEE);
    local.fill(0xEE);
    let t = Instant::now();
    let mut got = Vec::with_capacity(want.len());
    let mut buf = vec![0u8; 64 << 10];
    loop {
        assert!(
            t.elapsed() < LIMIT,
            "the peer got {} of {}",
            got.len(),
            want.len()
        );
        xa.close_step(&mut c, Instant::now());
        match xb.recv(&mut buf, NONBLOCKING, None) {
            Ok((0, _)) => break,
            Ok((n, _)) => got.extend_from_slice(&buf[..n]),
            Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::WouldBlock, "{e}"),
        }
        std::thread::yield_now();
    }
    assert!(
        got == want,
        "the peer got {} bytes, not those sent",
        got.len()
    );
    assert_eq!((xa.error(), xb.error()), (None, None));
    assert!(
        local.iter().all(|&b| b == 0xEE),
        "the read wrote the program's buffer after the close"
    );
    drop((xa, xb));
    drop((region, local, data));
}
