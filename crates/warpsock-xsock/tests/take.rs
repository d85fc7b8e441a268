//! A receive call that waits in the engine takes a DATA message that lands
//! in its wait straight from the slot into its buffer (`XSocket::wait_take`,
//! counted in `Counters::rx_taken`); everything else — a message longer
//! than the buffer, a peek, a message that does not end the peer's call in
//! message mode — goes through the books as before. Every test checks the
//! bytes, in order, and that the credits keep coming back (more messages
//! than the peer has slots).

use std::sync::atomic::Ordering::SeqCst;
use std::time::Instant;

use warpsock_xsock::io::{RecvFlags, XSocket};

mod net;

use net::{opts, pattern, recv_exact, switch_both, tcp_pair, unbuffered, LIMIT};

/// More round trips than either end has slots (16): a taken message's slot
/// must be reposted and its credit returned for the stream to go on.
const ROUNDS: u64 = 100;

fn taken(x: &XSocket) -> u64 {
    x.stats().rx_taken.load(SeqCst)
}

/// `rounds` round trips of `len`-byte messages, the pong end reading with
/// `chunk`-byte buffers (blocking calls). Returns what each end counted
/// as taken.
fn ping_pong(len: usize, chunk: usize, rounds: u64) -> (u64, u64) {
    let (a, b) = tcp_pair();
    let (xa, xb) = switch_both(&a, &b, &opts());
    std::thread::scope(|sc| {
        sc.spawn(|| {
            for _ in 0..rounds {
                let mut m = vec![0u8; len];
                let mut got = 0;
                let t = Instant::now();
                while got < len {
                    assert!(t.elapsed() < LIMIT, "pong timed out with {got}/{len}");
                    let end = (got + chunk).min(len);
                    let (k, _) = xb
                        .recv(&mut m[got..end], RecvFlags::default(), Some(LIMIT))
                        .unwrap();
                    assert!(k > 0, "end of stream after {got}");
                    got += k;
                }
                xb.send(&m, false, Some(LIMIT)).unwrap();
            }
        });
        for i in 0..rounds {
            let m = pattern(len, i);
            xa.send(&m, false, Some(LIMIT)).unwrap();
            assert_eq!(recv_exact(&xa, len), m, "round {i}");
        }
    });
    (taken(&xa), taken(&xb))
}

/// A blocking 8-byte ping-pong: each end's receive waits for the answer
/// and takes it as it lands. A wait that sleeps out its slice on a loaded
/// machine finds the message through the books instead, so the bound
/// leaves room for a few of those, far above none.
#[test]
fn a_waiting_reader_takes_each_small_message_from_its_slot() {
    let (ping, pong) = ping_pong(8, 8, ROUNDS);
    for (who, n) in [("ping", ping), ("pong", pong)] {
        assert!(
            (ROUNDS * 3 / 4..=ROUNDS).contains(&n),
            "{who}: {n} of {ROUNDS} messages taken"
        );
    }
}

/// A reader whose buffer is shorter than the message reads it through the
/// books, in pieces (nothing is taken at that end), bytes in order.
#[test]
fn a_message_longer_than_the_waiting_buffer_is_read_in_pieces() {
    let (_, pong) = ping_pong(8, 3, ROUNDS);
    assert_eq!(pong, 0, "messages taken by a 3-byte reader");
}

/// A peek waits without taking: the bytes stay queued for the read after
/// it, and the stream goes on.
#[test]
fn a_waiting_peek_leaves_the_message_queued() {
    let (a, b) = tcp_pair();
    let (xa, xb) = switch_both(&a, &b, &opts());
    let peek = RecvFlags {
        peek: true,
        ..RecvFlags::default()
    };
    std::thread::scope(|sc| {
        sc.spawn(|| {
            for i in 0..ROUNDS {
                let mut p = [0u8; 8];
                let (k, _) = xb.recv(&mut p, peek, Some(LIMIT)).unwrap();
                assert!(k > 0, "end of stream");
                let m = recv_exact(&xb, 8);
                assert_eq!(&p[..k], &m[..k], "round {i}: the peek saw other bytes");
                xb.send(&m, false, Some(LIMIT)).unwrap();
            }
        });
        for i in 0..ROUNDS {
            let m = pattern(8, i);
            xa.send(&m, false, Some(LIMIT)).unwrap();
            assert_eq!(recv_exact(&xa, 8), m, "round {i}");
        }
    });
}

/// Message mode: a small message taken in the wait ends the read with
/// `MSG_EOR`; one longer than a slot arrives as several DATA messages,
/// and the first (not ending the peer's call) is not returned alone — the
/// read returns the whole message, with `MSG_EOR`.
#[test]
fn message_mode_takes_only_a_messages_end() {
    let (a, b) = tcp_pair();
    let o = opts();
    let big = o.slot_size as usize + 1000;
    let (xa, xb) = switch_both(&a, &b, &o);
    xb.set_msg_mode(true);
    std::thread::scope(|sc| {
        sc.spawn(|| {
            let mut buf = vec![0u8; 2 * big];
            for i in 0..ROUNDS {
                let (n, eor) = xb
                    .recv(&mut buf, RecvFlags::default(), Some(LIMIT))
                    .unwrap();
                assert!(eor, "round {i}: one read, one message");
                let want = if i % 10 == 9 { big } else { 8 };
                assert_eq!(buf[..n], pattern(want, i)[..], "round {i}");
                xb.send(b"k", false, Some(LIMIT)).unwrap();
            }
        });
        for i in 0..ROUNDS {
            let len = if i % 10 == 9 { big } else { 8 };
            xa.send(&pattern(len, i), false, Some(LIMIT)).unwrap();
            assert_eq!(recv_exact(&xa, 1), b"k", "round {i}");
        }
    });
    assert!(taken(&xb) > 0, "no message taken in message mode");
}

/// `MSG_WAITALL` over two messages: the first taken in the wait, the call
/// waits again for the second.
#[test]
fn waitall_takes_message_after_message() {
    let (a, b) = tcp_pair();
    let (xa, xb) = switch_both(&a, &b, &opts());
    let waitall = RecvFlags {
        waitall: true,
        ..RecvFlags::default()
    };
    std::thread::scope(|sc| {
        sc.spawn(|| {
            for i in 0..ROUNDS {
                let mut m = [0u8; 16];
                let (n, _) = xb.recv(&mut m, waitall, Some(LIMIT)).unwrap();
                assert_eq!(n, 16, "round {i}");
                xb.send(&m, false, Some(LIMIT)).unwrap();
            }
        });
        for i in 0..ROUNDS {
            let m = pattern(16, i);
            xa.send(&m[..8], false, Some(LIMIT)).unwrap();
            xa.send(&m[8..], false, Some(LIMIT)).unwrap();
            assert_eq!(recv_exact(&xa, 16), m, "round {i}");
        }
    });
}

/// Receives exactly `out.len()` bytes by spinning on non-blocking calls
/// (busy polling).
fn spin_into(x: &XSocket, out: &mut [u8]) {
    let flags = RecvFlags {
        nonblocking: true,
        ..RecvFlags::default()
    };
    let mut got = 0;
    let t = Instant::now();
    while got < out.len() {
        assert!(t.elapsed() < LIMIT, "timed out with {got}/{}", out.len());
        match x.recv(&mut out[got..], flags, None) {
            Ok((k, _)) => {
                assert!(k > 0, "end of stream after {got}");
                got += k;
            }
            Err(e) => assert_eq!(e.raw_os_error(), Some(libc::EAGAIN)),
        }
    }
}

/// A busy-polling 8-byte ping-pong (non-blocking receives): the round a
/// receive drives takes the answer in, and the receive takes it from the
/// slot at once. Only a round some other call drove (none here: the
/// sends have their credits) would leave it to the books.
#[test]
fn a_busy_polling_reader_takes_each_small_message_from_its_slot() {
    let (a, b) = tcp_pair();
    let (xa, xb) = switch_both(&a, &b, &opts());
    std::thread::scope(|sc| {
        sc.spawn(|| {
            let mut m = [0u8; 8];
            for _ in 0..ROUNDS {
                spin_into(&xb, &mut m);
                xb.send(&m, false, Some(LIMIT)).unwrap();
            }
        });
        let mut m = [0u8; 8];
        for i in 0..ROUNDS {
            xa.send(&i.to_le_bytes(), false, Some(LIMIT)).unwrap();
            spin_into(&xa, &mut m);
            assert_eq!(m, i.to_le_bytes(), "round {i}");
        }
    });
    for (who, x) in [("ping", &xa), ("pong", &xb)] {
        let n = taken(x);
        assert!(
            (ROUNDS * 3 / 4..=ROUNDS).contains(&n),
            "{who}: {n} of {ROUNDS} messages taken"
        );
    }
}

/// A taken answer's slot left for a batch must not keep back the credit
/// our own sends then need (review of `07d871f`): A takes B's one-byte
/// answer in its wait (the slot left unposted, nothing returned), then
/// sends B, a reader in message mode, one message longer than B's window.
/// A's DATA (inline, no completion to process) spends its credits down to
/// the last, which may go only with a return; B waits for the message's
/// end and holds all of its slots but A's unposted one. Both calls must
/// finish: A posts its left slots once its last credit needs them.
#[test]
fn a_send_past_the_window_after_a_taken_answer_finishes() {
    use warpsock_xsock::io::Options;
    const LEN: usize = 20_000;
    let (a, b) = tcp_pair();
    let o = Options {
        slots: 16,
        slot_size: Options::slot_size_for(1024),
        zcopy_min: 1 << 20,
        // The send waits for the credits (no send buffer to return from).
        ..unbuffered()
    };
    let (xa, xb) = switch_both(&a, &b, &o);
    xb.set_msg_mode(true);
    let short = Some(std::time::Duration::from_secs(4));
    take_answers(&xa, &xb);
    let m = pattern(LEN, 7);
    std::thread::scope(|sc| {
        let s = sc.spawn(|| xa.send(&m, false, short));
        let mut got = Vec::new();
        let mut buf = vec![0u8; 64 << 10];
        let t = Instant::now();
        while got.len() < LEN {
            assert!(t.elapsed() < LIMIT, "B got {}/{LEN}", got.len());
            let (n, _) = xb
                .recv(&mut buf, RecvFlags::default(), short)
                .unwrap_or_else(|e| panic!("B's read with {}/{LEN}: {e}", got.len()));
            assert!(n > 0, "end of stream after {}", got.len());
            got.extend_from_slice(&buf[..n]);
        }
        assert_eq!(s.join().unwrap().unwrap(), LEN, "A's send");
        assert!(got == m, "B's bytes differ");
    });
}

/// Until `xa` took two of `xb`'s one-byte answers in its wait (their
/// slots left for a batch): the first may come before the socket counts
/// as established, which posts every slot; `xb` answers only once `xa`
/// waits (its wait counter moved), and a read that did not wait yet is
/// done again.
fn take_answers(xa: &XSocket, xb: &XSocket) {
    let mut tries = 0;
    while taken(xa) < 2 {
        tries += 1;
        assert!(tries <= 100, "no answer taken in 100 tries");
        std::thread::scope(|sc| {
            let r = sc.spawn(|| recv_exact(xa, 1));
            let w0 = xa.stats().waits.load(SeqCst);
            let t = Instant::now();
            while xa.stats().waits.load(SeqCst) == w0 && !r.is_finished() {
                assert!(t.elapsed() < LIMIT, "A never waited");
                std::hint::spin_loop();
            }
            xb.send(b"k", false, Some(LIMIT)).unwrap();
            assert_eq!(r.join().unwrap(), b"k");
        });
    }
}

/// A control message queued behind the last credit (review r17, item
/// 1's flush half): A takes B's answers (their slots left for a batch),
/// spends its credits down to the last on messages B does not read yet,
/// then shuts its end. The EOF needs two credits, as DATA does (the last
/// one is kept for a CREDIT: review r19-xdead, item 1), so it goes once
/// B reads and returns some; B reads every byte, then 0, each call
/// bounded.
#[test]
fn an_end_of_stream_behind_the_last_credit_after_taken_answers_goes() {
    use warpsock_xsock::io::Options;
    const SLOTS: u16 = 16;
    let (a, b) = tcp_pair();
    let o = Options {
        slots: SLOTS,
        slot_size: Options::slot_size_for(1024),
        ..opts()
    };
    let (xa, xb) = switch_both(&a, &b, &o);
    take_answers(&xa, &xb);
    // A's last credit left: one message each, B not reading.
    let n = usize::from(SLOTS) - 1;
    for i in 0..n {
        assert_eq!(xa.send(&[i as u8], false, Some(LIMIT)).unwrap(), 1);
    }
    xa.shutdown(false, true);
    let short = Some(std::time::Duration::from_secs(4));
    let done = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|sc| {
        // A's program makes no more calls: its rounds here (B's return
        // must be processed for the EOF to go).
        sc.spawn(|| {
            let t = Instant::now();
            while !done.load(SeqCst) && t.elapsed() < LIMIT {
                xa.progress();
                std::thread::yield_now();
            }
        });
        let mut got = Vec::new();
        let mut buf = [0u8; 64];
        loop {
            let r = xb.recv(&mut buf, RecvFlags::default(), short);
            let (k, _) = r.unwrap_or_else(|e| {
                done.store(true, SeqCst);
                panic!("B's read after {} bytes: {e}", got.len())
            });
            if k == 0 {
                break;
            }
            got.extend_from_slice(&buf[..k]);
            assert!(got.len() <= n, "more bytes than sent");
        }
        done.store(true, SeqCst);
        assert_eq!(got, (0..n as u8).collect::<Vec<_>>());
    });
}

/// What a reader's wait processes and does not take — here the credits
/// the peer returns for messages sent until none were left — is told to
/// the socket's other threads (`set_on_progress`: a `poll` may wait for
/// the socket to become writable); only a message the call takes itself
/// is its own, told to no one (issue 12: the call skips the readiness
/// then). B reads, returning the credits, while A's receive waits; B
/// answers only once A's wait has told of them.
#[test]
fn a_waiting_reader_tells_what_it_does_not_take() {
    let (a, b) = tcp_pair();
    // Sends until the credits run out (no send buffer past them).
    let (xa, xb) = switch_both(&a, &b, &unbuffered());
    let (tx, rx) = std::sync::mpsc::channel();
    let tx = std::sync::Mutex::new(tx);
    xa.set_on_progress(Box::new(move |r| {
        let _ = tx.lock().unwrap().send(r.writable);
    }));
    let mut sent = 0u64;
    loop {
        match xa.send(&pattern(8, sent), true, None) {
            Ok(8) => sent += 1,
            Ok(n) => panic!("a short send of {n}"),
            Err(e) => {
                assert_eq!(e.raw_os_error(), Some(libc::EAGAIN), "{e}");
                break;
            }
        }
        assert!(sent < 1000, "credits never ran out");
    }
    assert!(!xa.readiness_now().writable, "A has no credits left");
    std::thread::scope(|sc| {
        let r = sc.spawn(|| recv_exact(&xa, 1));
        for i in 0..sent {
            assert_eq!(recv_exact(&xb, 8), pattern(8, i), "message {i}");
        }
        let t = Instant::now();
        loop {
            let left = LIMIT.saturating_sub(t.elapsed());
            match rx.recv_timeout(left) {
                Ok(true) => break,
                Ok(false) => {}
                Err(e) => panic!("A's wait never told of its credits: {e}"),
            }
        }
        xb.send(b"k", false, Some(LIMIT)).unwrap();
        assert_eq!(r.join().unwrap(), b"k");
    });
    assert!(xa.readiness_now().writable, "A's credits are back");
}

/// The other half: the messages a blocking 8-byte ping-pong's reader takes
/// in its waits are its own, told to no one (a doorbell rung and drained
/// per message before). A few waits may process something else (the
/// connection's first events, a message found through the books on a
/// loaded machine); far fewer than one per round.
#[test]
fn a_waiting_reader_tells_no_one_of_what_it_takes() {
    let (a, b) = tcp_pair();
    let (xa, xb) = switch_both(&a, &b, &opts());
    let told = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let t2 = told.clone();
    xa.set_on_progress(Box::new(move |_| {
        t2.fetch_add(1, SeqCst);
    }));
    std::thread::scope(|sc| {
        sc.spawn(|| {
            for _ in 0..ROUNDS {
                let m = recv_exact(&xb, 8);
                xb.send(&m, false, Some(LIMIT)).unwrap();
            }
        });
        for i in 0..ROUNDS {
            let m = pattern(8, i);
            xa.send(&m, false, Some(LIMIT)).unwrap();
            assert_eq!(recv_exact(&xa, 8), m, "round {i}");
        }
    });
    let (n, took) = (told.load(SeqCst), taken(&xa));
    assert!(took >= ROUNDS * 3 / 4, "{took} of {ROUNDS} taken");
    assert!(
        n <= ROUNDS - took + 4,
        "told {n} times, {took} of {ROUNDS} taken"
    );
}
