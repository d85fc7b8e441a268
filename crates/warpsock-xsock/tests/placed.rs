//! Zero-copy reads by retargeted receives (`io/placed.rs`): the bytes
//! copied per byte received, from the reading socket's counters, and the
//! hazards of pointing receives at a program's buffer — a read that
//! returns early (partial fill, timeout, shutdown) must leave no receive
//! pointed at its memory, a peek and bytes already queued keep their order.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use warpsock_xsock::io::{RecvFlags, XSocket};

mod net;

use net::{pattern, reads_posted_ahead, switch_both, tcp_pair, LIMIT};

/// Large reads retarget the posted receives (sinks, the default, are
/// covered in `tests/loopback.rs` and `tests/stream.rs`).
fn opts() -> warpsock_xsock::io::Options {
    warpsock_xsock::io::Options {
        sinks: false,
        ..net::opts()
    }
}

fn load(c: &AtomicU64) -> u64 {
    c.load(Ordering::Relaxed)
}

/// (received, copied, placed) by this socket so far.
fn counts(x: &XSocket) -> (u64, u64, u64) {
    let st = x.stats();
    (load(&st.rx_bytes), load(&st.rx_copied), load(&st.rx_placed))
}

const WAITALL: RecvFlags = RecvFlags {
    waitall: true,
    peek: false,
    nonblocking: false,
};

/// 1 MiB reads posted before the data (the reader asks for the next MiB
/// only after the last one arrived), each round's sender waiting until
/// the read waits; `plain`: every other read without `MSG_WAITALL`.
/// (received, copied) by the reader.
fn posted_ahead_rounds(plain: bool) -> (u64, u64) {
    let (a, b) = tcp_pair();
    let (xa, xb) = switch_both(&a, &b, &opts());
    let xb = Arc::new(xb);
    let t = Instant::now();
    // Each chunk is sent once the reader waits for it: its read is posted
    // (the receives retargeted at its buffer) before the bytes come.
    let ready = |i, before| {
        while load(&xb.stats().waits) <= before {
            assert!(t.elapsed() < LIMIT, "round {i}: the read never waited");
            std::thread::yield_now();
        }
    };
    reads_posted_ahead(&xa, Arc::clone(&xb), (1 << 20, 8, 15), plain, ready)
}

/// 1 MiB `MSG_WAITALL` reads posted ahead copy at most 5 % of the bytes
/// (the target; only each message's first 32 bytes are copied).
#[test]
fn blocking_1_mib_reads_posted_ahead_copy_at_most_5_percent() {
    let (rx, copied) = posted_ahead_rounds(false);
    assert!(copied as f64 / rx as f64 <= 0.05, "copied {copied} of {rx}");
}

/// Plain blocking reads among them: each may return once part of its
/// MiB is placed (TCP's read returns what is there), and the chunk's
/// later messages then go to the slots, copied by the next read. How much
/// is the scheduler's (how soon the reader's thread wakes): an idle
/// machine woke it at the first message, 6–25 % of the bytes copied, a
/// busy one later, ~0 % (session 48: with this figure asserted at 5 %,
/// the test failed on an idle machine). Asserted: every byte in order,
/// and most of them placed (the `MSG_WAITALL` half alone places 47.5 %).
#[test]
fn plain_blocking_reads_posted_ahead_are_placed_in_part() {
    let (rx, copied) = posted_ahead_rounds(true);
    assert!(copied * 2 < rx, "copied {copied} of {rx}");
}

/// A reader behind a sender that runs ahead (the bandwidth benchmark):
/// every byte arrives in order whatever the reads' sizes, and most of it
/// is placed (what is copied is printed; the ratio is a benchmark figure,
/// not asserted beyond "placement happens").
#[test]
fn a_reader_behind_the_sender_gets_every_byte_in_order() {
    let (a, b) = tcp_pair();
    let (xa, xb) = switch_both(&a, &b, &opts());
    let total = 12 << 20;
    let data = pattern(total, 16);
    std::thread::scope(|sc| {
        sc.spawn(|| {
            let mut off = 0;
            // Writes of odd sizes: messages do not line up with reads.
            let mut step = 1 << 20;
            while off < total {
                let n = step.min(total - off);
                off += xa.send(&data[off..off + n], false, Some(LIMIT)).unwrap();
                step = if step == 1 << 20 { 300_001 } else { 1 << 20 };
            }
        });
        let mut got = vec![0u8; total];
        let mut off = 0;
        let mut i = 0;
        while off < total {
            let want = [1 << 20, 70_000, 5, 2 << 20][i % 4].min(total - off);
            i += 1;
            let (n, _) = xb
                .recv(&mut got[off..off + want], RecvFlags::default(), Some(LIMIT))
                .unwrap();
            assert!(n > 0);
            off += n;
        }
        assert!(got == data, "bytes out of order or damaged");
    });
    let (rx, copied, placed) = counts(&xb);
    println!("reader behind the sender: {copied} of {rx} copied, {placed} placed");
    assert_eq!(rx, total as u64);
    assert!(placed > 0, "nothing placed");
}

/// A read that returns after a partial fill, or at its timeout, leaves no
/// receive pointed at its buffer: the bytes sent after it go to the next
/// read, and the old buffer is not written again.
#[test]
fn an_early_return_leaves_no_receive_pointed_at_the_buffer() {
    let (a, b) = tcp_pair();
    let (xa, xb) = switch_both(&a, &b, &opts());
    // Timeout with nothing sent.
    let mut old = vec![0xEEu8; 1 << 20];
    let e = xb
        .recv(
            &mut old,
            RecvFlags::default(),
            Some(Duration::from_millis(50)),
        )
        .unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EAGAIN));
    // Partial fill: 100 KiB into a 1 MiB read.
    let first = pattern(100 << 10, 17);
    xa.send(&first, false, None).unwrap();
    let mut got = 0;
    while got < first.len() {
        let (n, _) = xb
            .recv(&mut old[got..], RecvFlags::default(), Some(LIMIT))
            .unwrap();
        got += n;
    }
    assert!(old[..got] == first[..]);
    let snapshot = old.clone();
    // Later bytes: into a new buffer, never into the old one.
    let later = pattern(3 << 20, 18);
    std::thread::scope(|sc| {
        sc.spawn(|| xa.send(&later, false, Some(LIMIT)).unwrap());
        let mut new = vec![0u8; later.len()];
        let (n, _) = xb.recv(&mut new, WAITALL, Some(LIMIT)).unwrap();
        assert_eq!(n, later.len());
        assert!(new == later);
    });
    assert!(old == snapshot, "the old buffer was written after its read");
}

/// A peek on a large buffer copies without consuming; bytes queued before
/// a large read come first; a read shut down while it waits returns, and
/// what is sent after does not reach its buffer.
#[test]
fn peek_queued_bytes_and_shutdown_keep_their_meaning() {
    let (a, b) = tcp_pair();
    let (xa, xb) = switch_both(&a, &b, &opts());
    let small = pattern(1000, 19);
    xa.send(&small, false, None).unwrap();
    let t = Instant::now();
    while xb.readable_bytes() < small.len() {
        assert!(t.elapsed() < LIMIT);
        xb.progress();
    }
    let big = pattern(1 << 20, 20);
    xa.send(&big, false, None).unwrap();
    let mut peek = vec![0u8; 256 << 10];
    let f = RecvFlags {
        peek: true,
        ..RecvFlags::default()
    };
    let (n, _) = xb.recv(&mut peek, f, Some(LIMIT)).unwrap();
    assert!(n >= small.len());
    assert_eq!(&peek[..small.len()], &small[..]);
    let mut all = vec![0u8; small.len() + big.len()];
    let (n, _) = xb.recv(&mut all, WAITALL, Some(LIMIT)).unwrap();
    assert_eq!(n, all.len());
    assert_eq!(&all[..small.len()], &small[..]);
    assert!(all[small.len()..] == big[..]);
    // Shut down while a placed read waits.
    let xb = Arc::new(xb);
    let mut buf = vec![0xEEu8; 1 << 20];
    std::thread::scope(|sc| {
        let xr = Arc::clone(&xb);
        let h = sc.spawn(move || {
            let mut b = vec![0xEEu8; 1 << 20];
            let r = xr.recv(&mut b, RecvFlags::default(), Some(LIMIT)).unwrap();
            (r.0, b)
        });
        std::thread::sleep(Duration::from_millis(30));
        xb.shutdown(true, false);
        let (n, b) = h.join().unwrap();
        assert_eq!(n, 0, "a shut reader reads the end of the stream");
        buf.copy_from_slice(&b);
        xa.send(&pattern(1 << 20, 21), false, Some(LIMIT)).unwrap();
        for _ in 0..20 {
            xb.progress();
        }
        assert!(b.iter().all(|&x| x == 0xEE), "written after the read ended");
    });
    assert!(buf.iter().all(|&x| x == 0xEE));
}

/// The peer closing while a placed read waits ends the read (EOF after
/// every byte sent), and the bytes sent before arrive intact.
#[test]
fn a_close_during_a_placed_read_ends_it_with_every_byte() {
    let (a, b) = tcp_pair();
    let (xa, xb) = switch_both(&a, &b, &opts());
    let data = pattern((1 << 20) + 12345, 22);
    std::thread::scope(|sc| {
        sc.spawn(|| {
            xa.send(&data, false, Some(LIMIT)).unwrap();
            assert!(xa.close(LIMIT));
        });
        let mut got = vec![0u8; 4 << 20];
        let mut off = 0;
        loop {
            let (n, _) = xb
                .recv(&mut got[off..], RecvFlags::default(), Some(LIMIT))
                .unwrap();
            if n == 0 {
                break;
            }
            off += n;
        }
        assert_eq!(off, data.len());
        assert!(got[..off] == data[..]);
    });
}
