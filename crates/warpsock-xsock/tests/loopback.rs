//! Switching real TCP connections on loopback and using them: bytes
//! written before the switch arrive first, a plain peer leaves the
//! connection intact, stream and message mode, sinks, one-sided and
//! asynchronous operations, a peer that sends garbage.

use std::io::{Read, Write};
use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use warpsock_xsock::io::{
    counters, switch_fd, switch_fd_as, AioOp, Completion, Failure, Options, RecvFlags,
};
use warpsock_xsock::switch::Limits;
use warpsock_xsock::{Role, SwitchError};

mod net;

use net::{
    established, opts, pattern, reads_posted_ahead, recv_exact, rto_min_us, send_mark, switch_both,
    tcp_pair, LIMIT,
};

/// Large reads offer sinks (SDP ZCopy) instead of retargeting receives
/// (`tests/placed.rs` covers those).
fn sink_opts() -> Options {
    Options {
        sinks: true,
        ..opts()
    }
}

#[test]
fn bytes_written_before_the_switch_arrive_first() {
    let (mut a, mut b) = tcp_pair();
    let pre_a = pattern(100_000, 1);
    let pre_b = pattern(3, 2);
    a.write_all(&pre_a).unwrap();
    b.write_all(&pre_b).unwrap();
    let (xa, xb) = switch_both(&a, &b, &opts());
    assert!(xa.crc() && xb.crc(), "CRC on by default");
    let post_a = pattern(300_000, 3);
    let post_b = pattern(5000, 4);
    let mut want_b = pre_a.clone();
    want_b.extend_from_slice(&post_a);
    let mut want_a = pre_b.clone();
    want_a.extend_from_slice(&post_b);
    std::thread::scope(|sc| {
        sc.spawn(|| {
            assert_eq!(xa.send(&post_a, false, None).unwrap(), post_a.len());
        });
        sc.spawn(|| {
            assert_eq!(xb.send(&post_b, false, None).unwrap(), post_b.len());
        });
        let got_b = sc.spawn(|| recv_exact(&xb, want_b.len()));
        let got_a = recv_exact(&xa, want_a.len());
        assert!(got_a == want_a, "a read b's bytes in order");
        assert!(got_b.join().unwrap() == want_b, "b read a's bytes in order");
    });
}

#[test]
fn message_mode_keeps_each_send_whole() {
    let (a, b) = tcp_pair();
    let (xa, xb) = switch_both(&a, &b, &opts());
    xb.set_msg_mode(true);
    let msgs: Vec<Vec<u8>> = [1, 70, 4096, 100_000, 3]
        .iter()
        .enumerate()
        .map(|(i, &n)| pattern(n, 10 + i as u64))
        .collect();
    for m in &msgs {
        xa.send(m, false, None).unwrap();
    }
    for m in &msgs {
        let mut buf = vec![0; 200_000];
        let (n, eor) = xb
            .recv(&mut buf, RecvFlags::default(), Some(LIMIT))
            .unwrap();
        assert!(eor, "one read, one message");
        assert_eq!(&buf[..n], &m[..]);
    }
}

#[test]
fn large_reads_posted_ahead_are_placed_without_a_copy() {
    let (a, b) = tcp_pair();
    let (xa, xb) = switch_both(&a, &b, &sink_opts());
    let xb = Arc::new(xb);
    let t = Instant::now();
    // The reader's sink arrives first (its offer follows the "k").
    let ready = |i, _| {
        while !xa.peer_sink_ready() {
            assert!(t.elapsed() < LIMIT, "no sink offered in round {i}");
            std::thread::yield_now();
        }
    };
    let (rx, copied) = reads_posted_ahead(&xa, Arc::clone(&xb), (1 << 20, 8, 5), false, ready);
    assert!(
        (copied as f64) / (rx as f64) <= 0.05,
        "copied {copied} of {rx} bytes"
    );
    // This socket's own counters: other tests in the process do not count.
    let placed = rx - copied;
    assert!(
        counters()
            .rx_placed
            .load(std::sync::atomic::Ordering::Relaxed)
            >= placed
    );
}

/// A vectored read that opens with small buffers before a large one (a
/// header, the body, a trailer: the bench's framing) offers the large one
/// as a sink ahead of the stream: only the small buffers' bytes are
/// copied. Counted by the socket's copy counters. A sender whose call
/// stops short of the large buffer still completes the read, as over TCP.
#[test]
fn a_vectored_reads_large_buffer_is_a_sink() {
    let (a, b) = tcp_pair();
    let (xa, xb) = switch_both(&a, &b, &sink_opts());
    let xb = Arc::new(xb);
    let body = 1 << 20;
    let rounds = 6;
    let r = {
        let xb = Arc::clone(&xb);
        std::thread::spawn(move || {
            let mut all = Vec::new();
            let (mut head, mut buf, mut tail) = ([0u8; 8], vec![0; body], [0u8; 8]);
            for _ in 0..rounds {
                let mut got = 0;
                while got < body + 16 {
                    let mut v: Vec<&mut [u8]> = Vec::new();
                    let (h, bd, t) = (head.len(), body, tail.len());
                    let mut skip = got;
                    for (b, n) in [(&mut head[..], h), (&mut buf[..], bd), (&mut tail[..], t)] {
                        if skip >= n {
                            skip -= n;
                        } else {
                            v.push(&mut b[std::mem::take(&mut skip)..]);
                        }
                    }
                    let (n, _) = xb
                        .recv_vectored(&mut v, RecvFlags::default(), Some(LIMIT))
                        .unwrap();
                    assert!(n > 0);
                    got += n;
                }
                all.extend_from_slice(&head);
                all.extend_from_slice(&buf);
                all.extend_from_slice(&tail);
                xb.send(b"k", false, None).unwrap();
            }
            // Short messages into the same framing: the read returns
            // what came (the sink offered ahead is declined).
            let mut v: Vec<&mut [u8]> = vec![&mut head[..], &mut buf[..]];
            let (n, _) = xb
                .recv_vectored(&mut v, RecvFlags::default(), Some(LIMIT))
                .unwrap();
            all.extend_from_slice(&head[..n.min(8)]);
            (all, n)
        })
    };
    let data = pattern((body + 16) * rounds, 6);
    let t = Instant::now();
    for i in 0..rounds {
        // The reader's sink arrives first (its offer follows the "k").
        while !xa.peer_sink_offered() {
            assert!(t.elapsed() < LIMIT, "no sink offered in round {i}");
            std::thread::yield_now();
        }
        let m = &data[i * (body + 16)..(i + 1) * (body + 16)];
        xa.send_vectored(&[&m[..8], &m[8..8 + body], &m[8 + body..]], false, None)
            .unwrap();
        let mut k = [0u8; 1];
        xa.recv(&mut k, RecvFlags::default(), Some(LIMIT)).unwrap();
    }
    while !xa.peer_sink_offered() {
        assert!(t.elapsed() < LIMIT, "no sink offered for the short message");
        std::thread::yield_now();
    }
    xa.send(b"four", false, None).unwrap();
    let (all, n) = r.join().unwrap();
    assert_eq!(n, 4, "a short message is returned, not waited on");
    assert!(all[..data.len()] == data[..]);
    assert_eq!(&all[data.len()..], b"four");
    let load = |c: &std::sync::atomic::AtomicU64| c.load(std::sync::atomic::Ordering::Relaxed);
    let st = xb.stats();
    let (rx, copied) = (load(&st.rx_bytes), load(&st.rx_copied));
    println!("vectored 1 MiB reads: {copied} of {rx} bytes copied");
    assert_eq!(rx, data.len() as u64 + 4);
    assert!(
        (copied as f64) / (rx as f64) <= 0.05,
        "copied {copied} of {rx} bytes"
    );
}

#[test]
fn riomap_riowrite_rioread() {
    let (a, b) = tcp_pair();
    let (xa, xb) = switch_both(&a, &b, &opts());
    let mut target = vec![0u8; 8192];
    #[allow(unsafe_code)]
    // SAFETY: `target` outlives the mapping (unmapped below).
    let off =
        unsafe { xb.riomap(target.as_mut_ptr(), target.len(), true, true, Some(4096)) }.unwrap();
    assert_eq!(off, 4096);
    // The mapping reaches the peer with the stream: tell it through it.
    xb.send(b"mapped", false, None).unwrap();
    let mut m = [0u8; 6];
    xa.recv(&mut m, RecvFlags::default(), Some(LIMIT)).unwrap();
    let src = pattern(1000, 7);
    assert_eq!(xa.riowrite(&src, 4096 + 100).unwrap(), 1000);
    // A Send after the Write arrives after it is placed.
    xa.send(b"done", false, None).unwrap();
    let mut d = [0u8; 4];
    xb.recv(&mut d, RecvFlags::default(), Some(LIMIT)).unwrap();
    assert_eq!(&target[100..1100], &src[..]);
    target[5000..5010].copy_from_slice(b"read me!!!");
    // A one-sided read needs the target's engine to answer it: here b's
    // thread is in a blocking receive (the preload drives idle sockets
    // from its progress thread).
    let mut back = [0u8; 10];
    std::thread::scope(|sc| {
        let t = sc.spawn(|| {
            let mut d = [0u8; 4];
            xb.recv(&mut d, RecvFlags::default(), Some(LIMIT)).unwrap()
        });
        assert_eq!(xa.rioread(&mut back, 4096 + 5000).unwrap(), 10);
        xa.send(b"read", false, None).unwrap();
        t.join().unwrap();
    });
    assert_eq!(&back, b"read me!!!");
    // Outside the mapping: EINVAL.
    let e = xa.riowrite(&src, 4096 + 8000).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EINVAL));
    xb.riounmap(target.as_mut_ptr()).unwrap();
}

#[test]
fn asynchronous_operations_complete_later() {
    let (a, b) = tcp_pair();
    let (xa, xb) = switch_both(&a, &b, &opts());
    let mut rbuf = vec![0u8; 1 << 20];
    let sbuf = pattern(1 << 20, 8);
    #[allow(unsafe_code)]
    // SAFETY: both buffers live until their completions are collected.
    unsafe {
        xb.aio_recv(rbuf.as_mut_ptr(), rbuf.len(), 42).unwrap();
        xa.aio_send(sbuf.as_ptr(), sbuf.len(), 7).unwrap();
    }
    let mut got = Vec::new();
    let mut done: Vec<Completion> = Vec::new();
    let t = Instant::now();
    let mut received = 0;
    while done.iter().filter(|c| c.op == AioOp::Send).count() < 1 || received < sbuf.len() {
        assert!(t.elapsed() < LIMIT, "{done:?}");
        xa.aio_poll(&mut done, 8);
        got.clear();
        xb.aio_poll(&mut got, 8);
        for c in &got {
            assert_eq!(c.cookie, 42);
            let n = c.result.unwrap();
            assert!(rbuf[..n] == sbuf[received..received + n]);
            received += n;
            if received < sbuf.len() {
                #[allow(unsafe_code)]
                // SAFETY: as above.
                unsafe {
                    xb.aio_recv(rbuf.as_mut_ptr(), rbuf.len(), 42).unwrap();
                }
            }
        }
        std::thread::yield_now();
    }
    let s = done.iter().find(|c| c.op == AioOp::Send).unwrap();
    assert_eq!((s.cookie, s.result), (7, Ok(1 << 20)));
}

/// Garbage on the wire after the switch: the receiving engine sends a
/// Terminate and that socket fails with EPROTO; another DDP socket in the
/// same process is unaffected.
#[test]
fn garbage_after_the_switch_fails_that_socket_only() {
    let (mut a, b) = tcp_pair();
    let (c, d) = tcp_pair();
    let (_xa, xb) = switch_both(&a, &b, &opts());
    let (xc, xd) = switch_both(&c, &d, &opts());
    // Behind the engine's back, on a's own descriptor.
    a.write_all(&[0x55; 64]).unwrap();
    let mut buf = [0u8; 16];
    let e = xb
        .recv(&mut buf, RecvFlags::default(), Some(LIMIT))
        .unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EPROTO), "{e}");
    let (errno, what) = xb.error().unwrap();
    assert_eq!(errno, libc::EPROTO);
    assert!(what.contains("terminated"), "{what}");
    xc.send(b"still fine", false, None).unwrap();
    let (n, _) = xd
        .recv(&mut buf, RecvFlags::default(), Some(LIMIT))
        .unwrap();
    assert_eq!(&buf[..n], b"still fine");
}

#[test]
fn eof_timeouts_nonblocking_and_peek() {
    let (a, b) = tcp_pair();
    let (xa, xb) = switch_both(&a, &b, &opts());
    let mut buf = [0u8; 8];
    let nb = RecvFlags {
        nonblocking: true,
        ..RecvFlags::default()
    };
    assert_eq!(
        xb.recv(&mut buf, nb, None).unwrap_err().raw_os_error(),
        Some(libc::EAGAIN)
    );
    let t = Instant::now();
    let e = xb
        .recv(
            &mut buf,
            RecvFlags::default(),
            Some(Duration::from_millis(200)),
        )
        .unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EAGAIN));
    assert!(t.elapsed() >= Duration::from_millis(190));
    xa.send(b"peekaboo", false, None).unwrap();
    let peek = RecvFlags {
        peek: true,
        ..RecvFlags::default()
    };
    let (n, _) = xb.recv(&mut buf[..4], peek, Some(LIMIT)).unwrap();
    assert_eq!(&buf[..n], b"peek");
    let (n, _) = xb
        .recv(&mut buf, RecvFlags::default(), Some(LIMIT))
        .unwrap();
    assert_eq!(&buf[..n], b"peekaboo");
    xa.shutdown(false, true);
    let (n, _) = xb
        .recv(&mut buf, RecvFlags::default(), Some(LIMIT))
        .unwrap();
    assert_eq!(n, 0, "end of stream");
    assert!(xa.send(b"x", false, None).is_err(), "EPIPE after shutdown");
    // The other direction still works.
    xb.send(b"back", false, None).unwrap();
    let (n, _) = xa
        .recv(&mut buf, RecvFlags::default(), Some(LIMIT))
        .unwrap();
    assert_eq!(&buf[..n], b"back");
    assert!(xb.close(Duration::from_secs(2)));
}

/// A peer whose process ends without closing its DDP socket (the kernel
/// sends FIN, not our end-of-stream message): as over TCP, the bytes that
/// arrived are read, then the stream ends (0), and a send is taken and
/// draws the closed peer's reset: the next fails with EPIPE — not a
/// protocol error.
#[test]
fn a_peer_gone_without_closing_is_end_of_stream() {
    let (a, b) = tcp_pair();
    let (xa, xb) = switch_both(&a, &b, &opts());
    xa.send(b"last words", false, None).unwrap();
    // What the kernel does when the process dies with the socket open.
    a.shutdown(std::net::Shutdown::Both).unwrap();
    assert_eq!(recv_exact(&xb, 10), b"last words");
    let mut buf = [0u8; 16];
    let (n, _) = xb
        .recv(&mut buf, RecvFlags::default(), Some(LIMIT))
        .unwrap();
    assert_eq!(n, 0, "end of stream, not {:?}", xb.error());
    // TCP's CLOSE_WAIT: no hang-up while this end may still send.
    let r = xb.readiness();
    assert!(
        r.readable && r.rdhup && !r.hup && r.writable && !r.error,
        "{r:?}"
    );
    assert_eq!(xb.send(b"x", false, None).unwrap(), 1, "TCP takes it");
    let e = xb.send(b"x", false, None).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EPIPE), "{e}");
    assert_eq!(xb.error().map(|(e, _)| e), Some(libc::EPIPE));
    let (n, _) = xb
        .recv(&mut buf, RecvFlags::default(), Some(LIMIT))
        .unwrap();
    assert_eq!(n, 0, "reads end first, as TCP's (`SOCK_DONE`)");
    drop(xa);
}

/// A peer that breaks the sockets protocol (a message of an unknown kind)
/// is answered with a Terminate, not just a FIN: both ends fail with
/// EPROTO, and the breaker is told that its peer terminated.
#[test]
fn a_protocol_breaker_gets_a_terminate() {
    let (a, b) = tcp_pair();
    let (xa, xb) = switch_both(&a, &b, &opts());
    xa.inject_raw_message(&[0x63, 0, 0, 0, 0, 0, 0, 0]);
    // Both ends driven at once (caller-driven engines: the injected Send
    // may wait in a's engine for b's first FPDU, RFC 6581).
    std::thread::scope(|sc| {
        let ta = sc.spawn(|| {
            let mut buf = [0u8; 8];
            xa.recv(&mut buf, RecvFlags::default(), Some(LIMIT))
                .unwrap_err()
        });
        let mut buf = [0u8; 8];
        let e = xb
            .recv(&mut buf, RecvFlags::default(), Some(LIMIT))
            .unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EPROTO), "{e}");
        let (_, what) = xb.error().unwrap();
        assert!(what.contains("broke the protocol"), "{what}");
        let e = ta.join().unwrap();
        assert_eq!(e.raw_os_error(), Some(libc::EPROTO), "{e}");
    });
    let (_, what) = xa.error().unwrap();
    assert!(
        what.contains("the peer terminated") && what.contains("unspecified"),
        "{what}"
    );
}

/// A non-blocking send (copied through transmit slots) into a sink larger
/// than a slot: the Write goes out slot by slot, every byte in place.
#[test]
fn nonblocking_sends_fill_a_large_sink_slot_by_slot() {
    let (a, b) = tcp_pair();
    let (xa, xb) = switch_both(&a, &b, &sink_opts());
    // Larger than all transmit slots together.
    let data = pattern(4 << 20, 77);
    std::thread::scope(|sc| {
        let r = sc.spawn(|| {
            let mut buf = vec![0u8; 4 << 20];
            let f = RecvFlags {
                waitall: true,
                ..RecvFlags::default()
            };
            let (n, _) = xb.recv(&mut buf, f, Some(LIMIT)).unwrap();
            assert_eq!(n, buf.len());
            buf
        });
        let t = Instant::now();
        while !xa.peer_sink_ready() {
            assert!(t.elapsed() < LIMIT, "no sink offered");
            std::thread::yield_now();
        }
        let mut off = 0;
        while off < data.len() {
            assert!(t.elapsed() < LIMIT, "stuck at {off}");
            match xa.send(&data[off..], true, None) {
                Ok(n) => off += n,
                Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => {
                    xa.progress();
                }
                Err(e) => panic!("{e}"),
            }
        }
        // The engine is driven by its callers: the last Writes complete,
        // and the sink's SINK_DONE goes out, as this side keeps driving.
        while !r.is_finished() {
            assert!(t.elapsed() < LIMIT, "the reader never got the sink");
            xa.progress();
            std::thread::yield_now();
        }
        assert!(r.join().unwrap() == data);
    });
    assert_eq!(
        xb.stats()
            .rx_placed
            .load(std::sync::atomic::Ordering::Relaxed),
        4 << 20
    );
}

/// A reader whose receive timed out withdraws its sink and waits for the
/// peer to confirm; a peer that never answers (here: never driven at all)
/// must not keep the call waiting without bound. The socket then fails
/// with ETIMEDOUT and says why; its buffer is the program's again.
#[test]
fn an_unanswered_sink_cancel_fails_the_socket_in_bounded_time() {
    let (a, b) = tcp_pair();
    let o = Options {
        sink_cancel_timeout: Duration::from_millis(300),
        ..sink_opts()
    };
    let (xa, xb) = switch_both(&a, &b, &o);
    let mut buf = vec![0u8; 1 << 20];
    let t = Instant::now();
    let e = xb
        .recv(
            &mut buf,
            RecvFlags::default(),
            Some(Duration::from_millis(100)),
        )
        .unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ETIMEDOUT), "{e}");
    assert!(t.elapsed() < LIMIT, "took {:?}", t.elapsed());
    let (errno, what) = xb.error().unwrap();
    assert_eq!(errno, libc::ETIMEDOUT);
    assert!(what.contains("sink cancel"), "{what}");
    // Later calls report the same cause.
    let e = xb.send(b"x", false, None).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ETIMEDOUT), "{e}");
    drop(xa);
}

/// `tcpi_rto` of a socket (`TCP_INFO`, µs): the retransmission timeout
/// in force, on every kernel.
fn rto_us(s: &std::net::TcpStream) -> u32 {
    use std::os::fd::AsRawFd;
    // SAFETY: tcp_info is plain integers; all zero is a valid value.
    let mut v: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut n = size_of::<libc::tcp_info>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `n` bytes into `v`.
    let r = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&mut v as *mut libc::tcp_info).cast(),
            &mut n,
        )
    };
    assert_eq!(r, 0, "TCP_INFO: {}", std::io::Error::last_os_error());
    v.tcpi_rto
}

/// `Options::rto_min` is for a receive-only end only: an end lowers it
/// once it has received stream bytes while it has sent none (never at the
/// switch) and has the kernel's again from its first sent byte, so the
/// writer's data is always retransmitted on host TCP's timeout.
#[test]
fn only_a_receive_only_end_has_the_smallest_retransmission_timeout_asked_for() {
    let (a, b) = tcp_pair();
    // The kernel's floor (200 ms unless the host tuned it); the writer's RTO
    // in force never goes under it.
    let kernel = rto_min_us(&a);
    let floor = kernel.map_or(200_000, |k| k as u32);
    let writer_kept = |when: &str| {
        assert_eq!(rto_min_us(&a), kernel, "the writer's RTO min {when}");
        assert!(
            rto_us(&a) >= floor,
            "the writer's RTO {when}: {} µs",
            rto_us(&a)
        );
    };
    assert_eq!(
        opts().rto_min,
        Some(Duration::from_millis(5)),
        "the default"
    );
    let (xa, xb) = switch_both(&a, &b, &opts());
    writer_kept("after the switch");
    assert_eq!(
        rto_min_us(&b),
        kernel,
        "the reader's is not lowered at the switch"
    );
    let data = pattern(3 << 20, 7);
    std::thread::scope(|sc| {
        sc.spawn(|| assert_eq!(xa.send(&data, false, None).unwrap(), data.len()));
        assert!(recv_exact(&xb, data.len()) == data, "b read a's bytes");
    });
    writer_kept("after sending");
    let Some(kernel) = kernel else {
        eprintln!("TCP_RTO_MIN_US unsupported here (Linux < 6.15): the reader keeps the kernel's");
        return;
    };
    // Rounded up to whole jiffies (4 ms at HZ=250).
    let low = |v: Option<i32>| v.is_some_and(|v| (5000..=20_000).contains(&v) && v < kernel);
    assert!(
        low(rto_min_us(&b)),
        "the reader after its first received DATA: {:?}",
        rto_min_us(&b)
    );
    // The reader answers: its data keeps the kernel's timeout, and the
    // writer, which sent first, is not lowered by what it receives.
    std::thread::scope(|sc| {
        sc.spawn(|| assert_eq!(xb.send(b"ok", false, None).unwrap(), 2));
        assert!(recv_exact(&xa, 2) == b"ok", "a read b's answer");
    });
    assert_eq!(
        rto_min_us(&b),
        Some(kernel),
        "the reader after its first send"
    );
    writer_kept("after receiving");
    drop((xa, xb));
    // `None`: the kernel's throughout.
    let (c, d) = tcp_pair();
    let none = Options {
        rto_min: None,
        ..opts()
    };
    let (xc, xd) = switch_both(&c, &d, &none);
    std::thread::scope(|sc| {
        sc.spawn(|| assert_eq!(xc.send(&data, false, None).unwrap(), data.len()));
        assert!(recv_exact(&xd, data.len()) == data, "d read c's bytes");
    });
    assert_eq!(rto_min_us(&c), Some(kernel));
    assert_eq!(rto_min_us(&d), Some(kernel));
    drop((xc, xd));
}

/// A socket whose read side is shut becomes readable with no message and
/// counts a new arrival: a look taken after is newer than every look
/// before ([`warpsock_xsock::io::Readiness::arrivals`]), so the preload's
/// doorbell, which skips looks older than the last it applied, never lets
/// a look from before (not readable) drain the bell rung for the end of
/// stream.
#[test]
fn a_shut_read_side_is_a_new_arrival() {
    let (a, b) = tcp_pair();
    let (_xa, xb) = switch_both(&a, &b, &opts());
    let before = xb.readiness_now();
    assert!(!before.readable, "{before:?}");
    xb.shutdown(true, false);
    let after = xb.readiness_now();
    assert!(after.readable, "{after:?}");
    assert!(
        after.arrivals > before.arrivals,
        "{before:?} then {after:?}"
    );
    // Once: a second shutdown changes nothing.
    xb.shutdown(true, false);
    assert_eq!(xb.readiness_now().arrivals, after.arrivals);
}

/// A read after `shutdown(SHUT_RD)` returns the bytes that had arrived
/// before it ends (0), as Linux's returns what its socket holds first:
/// the peer's bytes still in the engine's socket had arrived. Before, the
/// read ended at once, with no round, and a later one returned them (0,
/// then data; TCP's gave the data, then 0). Fails with 0 first.
#[test]
fn a_read_after_shut_rd_returns_what_had_arrived() {
    let (xa, xb) = established(&opts());
    let mut buf = [0u8; 64];
    xb.shutdown(true, false);
    assert_eq!(xa.send(b"0123456789", false, Some(LIMIT)).unwrap(), 10);
    // In B's engine socket, not taken in (B makes no round meanwhile).
    let mut p = libc::pollfd {
        fd: xb.tcp_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one pollfd on the stack.
    let ready = unsafe { libc::poll(&mut p, 1, LIMIT.as_millis() as i32) };
    assert_eq!(ready, 1);
    let (n, _) = xb
        .recv(&mut buf, RecvFlags::default(), Some(LIMIT))
        .unwrap();
    assert_eq!(&buf[..n], b"0123456789", "what had arrived, first");
    let nonblocking = RecvFlags {
        nonblocking: true,
        ..RecvFlags::default()
    };
    assert_eq!(
        xb.recv(&mut buf, nonblocking, None).unwrap().0,
        0,
        "then the end"
    );
}

/// An int socket option of `fd`.
fn int_opt(fd: i32, level: i32, name: i32) -> i32 {
    let mut v: i32 = -1;
    let mut l = size_of::<i32>() as libc::socklen_t;
    // SAFETY: an int out-parameter of its size.
    let r = unsafe { libc::getsockopt(fd, level, name, (&mut v as *mut i32).cast(), &mut l) };
    assert_eq!(r, 0, "getsockopt {level}/{name}");
    v
}

/// The switch leaves the connection's TCP options the program's, as over
/// TCP: no user timeout and no keepalive of the engine's. With the
/// engine's 10 s `TCP_USER_TIMEOUT`, a reader that stopped reading for
/// longer killed the writer's connection (zero-window probing ends at the
/// user timeout since Linux 5.1): ETIMEDOUT where TCP blocks the writer.
/// What the program set itself before the switch stays.
#[test]
fn the_switch_keeps_the_programs_tcp_options() {
    let (a, b) = tcp_pair();
    let mine: i32 = 1234;
    // SAFETY: an int option of the test's socket.
    let r = unsafe {
        libc::setsockopt(
            std::os::fd::AsRawFd::as_raw_fd(&a),
            libc::IPPROTO_TCP,
            libc::TCP_USER_TIMEOUT,
            (&mine as *const i32).cast(),
            size_of::<i32>() as libc::socklen_t,
        )
    };
    assert_eq!(r, 0);
    let (xa, xb) = switch_both(&a, &b, &opts());
    assert_eq!(
        int_opt(xa.tcp_fd(), libc::IPPROTO_TCP, libc::TCP_USER_TIMEOUT),
        mine
    );
    assert_eq!(
        int_opt(xb.tcp_fd(), libc::IPPROTO_TCP, libc::TCP_USER_TIMEOUT),
        0,
        "the engine's user timeout"
    );
    for x in [&xa, &xb] {
        assert_eq!(
            int_opt(x.tcp_fd(), libc::SOL_SOCKET, libc::SO_KEEPALIVE),
            0,
            "the engine's keepalive"
        );
    }
}

/// A timed large read (`SO_RCVTIMEO`) on a connection whose peer's
/// program makes no call (its engine is never driven) returns `EAGAIN` at
/// its timeout and the connection lives, as over TCP: by default a timed
/// read offers no sink (`Options::sinks_timed`), whose withdrawal would
/// wait for the idle peer's answer and then fail the socket with
/// ETIMEDOUT (11 s for a 1 s timeout under the preload, session 21).
#[test]
fn a_timed_large_read_of_an_idle_peer_times_out_and_the_connection_lives() {
    let (a, b) = tcp_pair();
    let o = Options {
        sinks_timed: false,
        sink_cancel_timeout: Duration::from_millis(300),
        ..sink_opts()
    };
    let (xa, xb) = switch_both(&a, &b, &o);
    let mut buf = vec![0u8; 1 << 20];
    for _ in 0..3 {
        let e = xb
            .recv(
                &mut buf,
                RecvFlags::default(),
                Some(Duration::from_millis(100)),
            )
            .unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EAGAIN), "{e}");
        assert!(xb.error().is_none(), "{:?}", xb.error());
    }
    assert_eq!(
        xb.stats()
            .sink_offers
            .load(std::sync::atomic::Ordering::Relaxed),
        0
    );
    xa.send(b"later", false, None).unwrap();
    let (n, _) = xb
        .recv(&mut buf, RecvFlags::default(), Some(LIMIT))
        .unwrap();
    assert_eq!(&buf[..n], b"later");
}

#[path = "loopback/refusals.rs"]
mod refusals;
#[path = "loopback/residue_cap.rs"]
mod residue_cap;
#[path = "loopback/window.rs"]
mod window;
