//! Asynchronous sends and the plain send calls after them, and one-sided
//! requests behind buffered bytes (loopback).

use std::time::Duration;

use crate::io::RecvFlags;

/// An asynchronous send queued and not yet pumped (as a round that
/// processed credits, `reap`, leaves it), with credits and a transmit
/// slot free: a small plain send — the straight path's case — goes behind
/// its bytes, not inline ahead of them; a non-blocking one too, at once
/// (not `EAGAIN` while the asynchronous send is posted but not complete).
///
/// (The lock is let go between the queueing and the send: a progress
/// round in between would pump the queued send and the test would pass
/// without reaching the guards. No progress thread runs here, so none
/// does.)
#[test]
fn a_straight_send_goes_behind_a_queued_asynchronous_send() {
    for nonblocking in [false, true] {
        straight_send_behind_a_queued_asynchronous_send(nonblocking);
    }
}

fn straight_send_behind_a_queued_asynchronous_send(nonblocking: bool) {
    let (xa, xb) = crate::io::test_pair::pair();
    let t = Some(Duration::from_secs(20));
    let mut buf = [0u8; 8];
    assert_eq!(xa.send(&[1; 8], false, t).unwrap(), 8);
    assert_eq!(xb.recv(&mut buf, RecvFlags::default(), t).unwrap().0, 8);
    let queued = [3u8; 8];
    {
        let mut st = xa.lock();
        // SAFETY: `queued` lives until the completion is collected below.
        #[allow(unsafe_code)]
        unsafe {
            xa.queue_send(&mut st, queued.as_ptr(), queued.len(), 9);
        };
        assert!(st.aio.sends_queued());
    }
    assert_eq!(xa.send(&[2; 8], nonblocking, t).unwrap(), 8);
    for want in [[3; 8], [2; 8]] {
        assert_eq!(xb.recv(&mut buf, RecvFlags::default(), t).unwrap().0, 8);
        assert_eq!(buf, want, "in call order");
    }
    assert!(!xa.lock().aio.sends_queued(), "the plain send pumped it");
    let mut done = Vec::new();
    let start = std::time::Instant::now();
    while done.is_empty() {
        assert!(start.elapsed() < Duration::from_secs(20));
        xa.aio_poll(&mut done, 1);
        std::thread::yield_now();
    }
    assert_eq!((done[0].cookie, done[0].result), (9, Ok(8)));
}

/// A reap (the completions the engine queued already, no round) that
/// processes completions pumps the queued sends: the credits or transmit
/// slots it brings are theirs now, not at the next round (review
/// r19-xaio, item 7: `readiness_of` said writable while the bytes waited).
/// Here the completion is a control message's Send, posted from a
/// transmit slot and written at once; the lock is held throughout, so no
/// other round pumps.
#[test]
fn a_reap_that_processes_completions_pumps_queued_sends() {
    let (xa, xb) = crate::io::test_pair::pair();
    let t = Some(Duration::from_secs(20));
    let mut buf = [0u8; 8];
    // Established both ways (a post before waits in the engine).
    assert_eq!(xa.send(&[1; 8], false, t).unwrap(), 8);
    assert_eq!(xb.recv(&mut buf, RecvFlags::default(), t).unwrap().0, 8);
    assert_eq!(xb.send(&[1; 8], false, t).unwrap(), 8);
    assert_eq!(xa.recv(&mut buf, RecvFlags::default(), t).unwrap().0, 8);
    let queued = [5u8; 8];
    {
        let mut st = xa.lock();
        // SAFETY: `queued` lives until the bytes are read below (the
        // completion is collected by the socket's drop at the latest).
        #[allow(unsafe_code)]
        unsafe {
            xa.queue_send(&mut st, queued.as_ptr(), queued.len(), 9);
        };
        // A mapping's end for an offset the peer never heard of: a control
        // message it ignores, posted from a transmit slot.
        st.s.announce_unmap(0x5eed);
        xa.flush(&mut st);
        assert!(st.aio.sends_queued() && st.unreaped);
        xa.reap(&mut st);
        assert!(!st.aio.sends_queued(), "the reap pumped the queued send");
    }
    assert_eq!(xb.recv(&mut buf, RecvFlags::default(), t).unwrap().0, 8);
    assert_eq!(buf, queued);
}

use crate::io::test_pair::{pair_with, small};

/// The byte `i` of pattern `seed`.
fn pat(seed: u8, i: usize) -> u8 {
    (i as u8).wrapping_mul(31).wrapping_add(seed)
}

/// `xb` maps `region` for the peer's writes (its offset returned) and
/// tells `xa` where, which reads it past the announcement: `xa` knows the
/// mapping then. `region` must outlive `xb`'s use of it.
fn announce_map(xa: &crate::io::XSocket, xb: &crate::io::XSocket, region: &mut [u8]) -> u64 {
    let t = Some(Duration::from_secs(20));
    #[allow(unsafe_code)]
    // SAFETY: the caller keeps `region` alive while `xb` may use it.
    let off = unsafe { xb.riomap(region.as_mut_ptr(), region.len(), true, false, None) }.unwrap();
    // The library's offset tells the peer no address of ours.
    assert_ne!(
        off,
        region.as_ptr() as u64,
        "the buffer's address announced"
    );
    assert_eq!(xb.send(&off.to_le_bytes(), false, t).unwrap(), 8);
    let mut b8 = [0u8; 8];
    assert_eq!(xa.recv(&mut b8, RecvFlags::default(), t).unwrap().0, 8);
    off
}

/// A one-sided write made while the send buffer holds bytes a send call
/// already returned for (the peer's window full, it does not read) goes
/// after them (review r20-xbuf N5; RFC 5040 §5.5 orders a queue pair's
/// Writes and Sends): whenever the peer finds the write's data in its
/// mapping, every stream byte sent before the write has arrived; and the
/// data is in place by the time it reads the message sent after it.
/// Without the hold, the Write goes out at once, ahead of the buffered
/// bytes, and the first round of the peer places it. One thread drives
/// both ends in turn (no progress thread in this crate), so each look at
/// the mapping follows a round of the reader's that processed everything
/// the engine read.
#[test]
fn a_one_sided_write_goes_behind_buffered_stream_bytes() {
    let (xa, xb) = pair_with(&small(64 << 10));
    // The reader maps a region and says where; the writer learns the
    // mapping by reading past its announcement.
    let mut region = vec![0u8; 4096];
    let off = announce_map(&xa, &xb, &mut region);
    // Stream bytes past the window: some of them wait in the send buffer.
    let stream: Vec<u8> = (0..20_000).map(|i| pat(1, i)).collect();
    for c in stream.chunks(1000) {
        assert_eq!(xa.send(c, true, None).unwrap(), c.len());
    }
    assert!(
        !xa.lock().aio.buf.is_empty(),
        "bytes wait in the send buffer"
    );
    let data: Vec<u8> = (0..region.len()).map(|i| pat(2, i)).collect();
    #[allow(unsafe_code)]
    // SAFETY: `data` lives until the completion is collected below.
    unsafe { xa.aio_rio(data.as_ptr().cast_mut(), data.len(), off, true, 7) }.unwrap();
    let after = [9u8; 8];
    assert_eq!(xa.send(&after, true, None).unwrap(), 8);
    let want: Vec<u8> = stream.iter().chain(&after).copied().collect();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let nb = RecvFlags {
        nonblocking: true,
        ..RecvFlags::default()
    };
    let start = std::time::Instant::now();
    while got.len() < want.len() {
        assert!(start.elapsed() < Duration::from_secs(20), "{}", got.len());
        xb.progress();
        #[allow(unsafe_code)]
        // SAFETY: `region` is live; a volatile read sees what the peer's
        // Writes placed in it.
        let placed = unsafe { std::ptr::read_volatile(region.as_ptr()) } != 0;
        if placed {
            let arrived = got.len() + xb.readable_bytes();
            assert!(
                arrived >= stream.len(),
                "the write was placed with {arrived} of the {} stream bytes before it arrived",
                stream.len()
            );
        }
        match xb.recv(&mut buf, nb, None) {
            Ok((n, _)) => got.extend_from_slice(&buf[..n]),
            Err(e) => assert_eq!(e.raw_os_error(), Some(libc::EAGAIN), "{e}"),
        }
        xa.progress();
    }
    assert!(got == want, "the stream in order");
    #[allow(unsafe_code)]
    // SAFETY: as above.
    let placed: Vec<u8> = (0..region.len())
        .map(|i| unsafe { std::ptr::read_volatile(region.as_ptr().add(i)) })
        .collect();
    assert!(
        placed == data,
        "the write's data in place after the message after it"
    );
    let mut done = Vec::new();
    while done.is_empty() {
        assert!(start.elapsed() < Duration::from_secs(20));
        xa.aio_poll(&mut done, 1);
    }
    assert_eq!((done[0].cookie, done[0].result), (7, Ok(data.len())));
    xb.riounmap(region.as_mut_ptr()).unwrap();
}

/// A one-sided write held behind buffered bytes (as above) when the
/// connection ends: it completes with an error, as the queued sends do —
/// it never goes, and a synchronous `riowrite` waiting on it would
/// otherwise wait for ever.
#[test]
fn a_held_one_sided_write_fails_when_the_connection_ends() {
    let (xa, xb) = pair_with(&small(64 << 10));
    let mut region = vec![0u8; 4096];
    let off = announce_map(&xa, &xb, &mut region);
    for _ in 0..20 {
        assert_eq!(xa.send(&[1; 1000], true, None).unwrap(), 1000);
    }
    assert!(
        !xa.lock().aio.buf.is_empty(),
        "bytes wait in the send buffer"
    );
    let data = [2u8; 64];
    #[allow(unsafe_code)]
    // SAFETY: `data` lives until the completion is collected below.
    unsafe { xa.aio_rio(data.as_ptr().cast_mut(), data.len(), off, true, 7) }.unwrap();
    assert_eq!(xa.lock().aio.held.len(), 1, "held behind the buffer");
    drop(xb);
    let mut done = Vec::new();
    let start = std::time::Instant::now();
    while done.is_empty() {
        assert!(start.elapsed() < Duration::from_secs(20), "no completion");
        xa.aio_poll(&mut done, 1);
        std::thread::yield_now();
    }
    assert_eq!(done[0].cookie, 7);
    assert!(done[0].result.is_err(), "{:?}", done[0]);
    assert!(xa.lock().aio.held.is_empty());
    drop(region);
}

/// A synchronous one-sided write on a non-blocking socket, made while
/// bytes of earlier sends wait in the send buffer (the peer not reading):
/// `EAGAIN` at once, nothing posted or held — it would wait for the peer
/// to read (review r21-send #6). Once those bytes left it goes. (The
/// call runs in a thread of its own: one that blocked fails the test at
/// the bound instead of hanging it.)
#[test]
fn a_nonblocking_riowrite_behind_buffered_bytes_gets_eagain() {
    let (xa, xb) = pair_with(&small(64 << 10));
    let mut region = vec![0u8; 4096];
    let off = announce_map(&xa, &xb, &mut region);
    let stream: Vec<u8> = (0..20_000).map(|i| pat(1, i)).collect();
    for c in stream.chunks(1000) {
        assert_eq!(xa.send(c, true, None).unwrap(), c.len());
    }
    assert!(
        !xa.lock().aio.buf.is_empty(),
        "bytes wait in the send buffer"
    );
    let xa = std::sync::Arc::new(xa);
    let (tx, rx) = std::sync::mpsc::channel();
    let x = std::sync::Arc::clone(&xa);
    std::thread::spawn(move || {
        let r = x.riowrite_as(&[2u8; 64], off, true, None);
        let _ = tx.send(r.map_err(|e| e.raw_os_error()));
    });
    let r = rx
        .recv_timeout(Duration::from_secs(20))
        .expect("the non-blocking riowrite waited for the peer");
    assert_eq!(r, Err(Some(libc::EAGAIN)));
    {
        let st = xa.lock();
        assert!(
            st.aio.held.is_empty() && st.aio.rio.is_empty(),
            "nothing posted"
        );
    }
    // The reader takes the stream; then nothing is queued and it goes.
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let nb = RecvFlags {
        nonblocking: true,
        ..RecvFlags::default()
    };
    let start = std::time::Instant::now();
    while got.len() < stream.len() || !xa.lock().aio.buf.is_empty() {
        assert!(start.elapsed() < Duration::from_secs(20), "{}", got.len());
        match xb.recv(&mut buf, nb, None) {
            Ok((n, _)) => got.extend_from_slice(&buf[..n]),
            Err(e) => assert_eq!(e.raw_os_error(), Some(libc::EAGAIN), "{e}"),
        }
        xa.progress();
    }
    assert!(got == stream);
    assert_eq!(xa.riowrite_as(&[2u8; 64], off, true, None).unwrap(), 64);
    #[allow(unsafe_code)]
    // SAFETY: `region` is live; a volatile read sees what the Write placed.
    while unsafe { std::ptr::read_volatile(region.as_ptr().add(63)) } != 2 {
        assert!(start.elapsed() < Duration::from_secs(20), "never placed");
        xb.progress();
    }
    xb.riounmap(region.as_mut_ptr()).unwrap();
}

/// A one-sided write whose post fails (the engine's send queue full: here
/// filled behind the socket's back, no progress thread running to empty
/// it) fails the connection with `ENOBUFS` and completes at once with that
/// error (`rio::post_failed`): no completion would ever come for a request
/// the engine never took, and its caller — an event loop collecting it,
/// or a synchronous `riowrite` — waited for good.
#[test]
fn a_one_sided_write_whose_post_fails_completes_at_once() {
    use warpsock_engine::proto::{SendOp, SendWr};
    let (xa, xb) = crate::io::test_pair::pair();
    let mut region = vec![0u8; 4096];
    let off = announce_map(&xa, &xb, &mut region);
    {
        let st = xa.lock();
        let (rkey, remote_addr) = st.s.peer_map(off, 1, true).unwrap();
        let mut posted = 0;
        while xa
            .qp
            .post_send_news(SendWr {
                wr_id: 0,
                op: SendOp::Write { remote_addr, rkey },
                sgl: Default::default(),
                signaled: false,
            })
            .is_ok()
        {
            posted += 1;
            assert!(posted < 1 << 20, "the send queue never filled");
        }
    }
    let data = [2u8; 64];
    #[allow(unsafe_code)]
    // SAFETY: `data` lives until the completion is collected below.
    unsafe { xa.aio_rio(data.as_ptr().cast_mut(), data.len(), off, true, 7) }.unwrap();
    let mut done = Vec::new();
    xa.aio_poll(&mut done, 1);
    assert_eq!(done.len(), 1, "completed at once");
    assert_eq!((done[0].cookie, done[0].result), (7, Err(libc::ENOBUFS)));
    assert_eq!(xa.lock().error.as_ref().map(|e| e.0), Some(libc::ENOBUFS));
    drop(xb);
    drop(region);
}

/// A synchronous one-sided write bounded by 300 ms against a peer that
/// stopped reading (8 MiB, more than both kernels hold) returns at its
/// timeout (`ETIMEDOUT`: the connection fails, reset, and the flush ends
/// the request), and leaves no record: `sync_done` and `rio` empty, and
/// retries (the connection failed) fail at once, adding none. Before, the
/// graceful disconnect waited for the Write partly in the kernel, which
/// the peer's closed window never let finish: the call blocked for good
/// (helper 68's review). Bounded: a call not back after [`STUCK`] is
/// unblocked by the peer's reads, and the test fails.
#[test]
fn a_timed_out_riowrite_returns_and_leaves_no_record() {
    const STUCK: Duration = Duration::from_secs(20);
    let (xa, xb) = crate::io::test_pair::pair();
    let mut region = vec![0u8; 8 << 20];
    let off = announce_map(&xa, &xb, &mut region);
    let data = vec![5u8; 8 << 20];
    let (tx, rx) = std::sync::mpsc::channel();
    let first = std::thread::scope(|sc| {
        sc.spawn(|| {
            let r = xa.riowrite_as(&data, off, false, Some(Duration::from_millis(300)));
            let _ = tx.send(r.map_err(|e| e.raw_os_error()));
        });
        rx.recv_timeout(STUCK).map_err(|_| {
            // Unblocks the call (bounded), for the scope to end.
            let mut buf = vec![0u8; 1 << 16];
            for _ in 0..400 {
                let _ = xb.recv(
                    &mut buf,
                    RecvFlags::default(),
                    Some(Duration::from_millis(50)),
                );
                if rx.try_recv().is_ok() {
                    break;
                }
            }
        })
    });
    assert_eq!(
        first,
        Ok(Err(Some(libc::ETIMEDOUT))),
        "the timed write (Err(()): still blocked after {STUCK:?})"
    );
    let records = |x: &crate::io::XSocket| {
        let st = x.lock();
        (st.aio.sync_done.len(), st.aio.rio.len())
    };
    assert_eq!(records(&xa), (0, 0), "records left");
    for _ in 0..5 {
        let r = xa.riowrite_as(&data[..4096], off, false, Some(Duration::from_millis(300)));
        assert!(r.is_err(), "a write on the failed connection");
        assert_eq!(records(&xa), (0, 0), "records left by a retry");
    }
    drop(xb);
    drop(region);
}

/// Offsets the program chooses near 2^64: a mapping whose range reaches
/// the top overlaps one that starts inside it (`EEXIST`), with no
/// overflow in the look (helper 68's review: the end's sum overflowed, a
/// panic where overflow is checked).
#[test]
fn mappings_at_the_top_of_the_offsets_overlap_without_overflow() {
    let (xa, _xb) = crate::io::test_pair::pair();
    let mut a = vec![0u8; 64];
    let mut b = vec![0u8; 64];
    let top = u64::MAX - 10;
    #[allow(unsafe_code)]
    // SAFETY: both buffers outlive the socket (dropped after it).
    unsafe {
        assert_eq!(
            xa.riomap(a.as_mut_ptr(), a.len(), true, false, Some(top))
                .unwrap(),
            top
        );
        let e = xa
            .riomap(b.as_mut_ptr(), b.len(), true, false, Some(top + 5))
            .unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EEXIST), "{e}");
    }
    drop((xa, _xb));
    drop((a, b));
}
