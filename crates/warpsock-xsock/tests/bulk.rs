//! The bulk path of DDP-mode sockets over loopback, counted (no timings):
//! FPDU size, system calls, watch changes and copies per MiB.

use std::os::fd::{AsFd, AsRawFd};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;

use warpsock_engine::proto::wire::fpdu::mulpdu_for_mss;
use warpsock_xsock::io::{switch_fd, Options, RecvFlags, XSocket};
use warpsock_xsock::wire::HDR_LEN;

mod net;

use net::{opts, pattern, recv_exact, set_buf, switch_both, tcp_pair, unbuffered, LIMIT};

/// A DDP socket's queue pair is set up by the in-band switch (MPA on the
/// program's own connection), not by the connection manager's `connect`
/// or `accept`, yet it sizes its FPDUs by the same rule: towards a
/// loopback peer as large as MPA allows (64 KiB), never `TCP_MAXSEG` —
/// made 1,200 bytes here before connecting, so FPDUs fitted to segments
/// would be that small.
#[test]
fn the_switch_sizes_fpdus_like_the_connection_manager_over_loopback() {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let c = connect_with_mss(l.local_addr().unwrap(), 1200);
    let (s, _) = l.accept().unwrap();
    let mss = |t: &std::net::TcpStream| {
        let mut v: libc::c_int = 0;
        let mut n = size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: getsockopt writes one int into `v`.
        let r = unsafe {
            libc::getsockopt(
                t.as_raw_fd(),
                libc::IPPROTO_TCP,
                libc::TCP_MAXSEG,
                (&mut v as *mut libc::c_int).cast(),
                &mut n,
            )
        };
        assert_eq!(r, 0);
        v as usize
    };
    assert!(mss(&c) <= 1200, "TCP_MAXSEG {}", mss(&c));
    let (xc, xs) = switch_both(&c, &s, &opts());
    let most = mulpdu_for_mss(1 << 16);
    assert_eq!(xc.mulpdu(), most, "initiator or responder, by address");
    assert_eq!(xs.mulpdu(), most);
}

/// A connected stream whose MSS was capped at `mss` before `connect`.
fn connect_with_mss(to: std::net::SocketAddr, mss: libc::c_int) -> std::net::TcpStream {
    use std::os::fd::FromRawFd;
    let std::net::SocketAddr::V4(v4) = to else {
        panic!("IPv4 only")
    };
    // SAFETY: plain socket calls on a descriptor this function owns until
    // it hands it to the `TcpStream`.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        assert!(fd >= 0);
        let r = libc::setsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_MAXSEG,
            (&mss as *const libc::c_int).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        );
        assert_eq!(r, 0);
        let sa = libc::sockaddr_in {
            sin_family: libc::AF_INET as libc::sa_family_t,
            sin_port: v4.port().to_be(),
            sin_addr: libc::in_addr {
                s_addr: u32::from(*v4.ip()).to_be(),
            },
            sin_zero: [0; 8],
        };
        let r = libc::connect(
            fd,
            (&sa as *const libc::sockaddr_in).cast(),
            size_of::<libc::sockaddr_in>() as libc::socklen_t,
        );
        assert_eq!(r, 0, "{}", std::io::Error::last_os_error());
        std::net::TcpStream::from_raw_fd(fd)
    }
}

/// Large blocking sends into a socket whose send buffer is always full
/// (64 KiB for 1 MiB sends) leave the progress thread's watch alone: the
/// call flushes the engine's backlog itself, in its waits, so nothing
/// watches output space for it meanwhile. Before, every post that filled
/// the buffer armed the watch for output space and the wait right after
/// it disarmed it: two `epoll_ctl` per post (`watch_changes`).
#[test]
fn blocking_bulk_sends_change_no_watch() {
    const MSG: usize = 1 << 20;
    const N: usize = 16;
    let (a, b) = tcp_pair();
    set_buf(&a, libc::SO_SNDBUF, 64 << 10);
    let (xa, xb) = switch_both(&a, &b, &opts());
    let data = Arc::new(pattern(N * MSG, 3));
    let reader = read_all(xb, MSG, Arc::clone(&data));
    let before = xa.stats().watch_changes.load(Ordering::Relaxed);
    for m in data.chunks(MSG) {
        assert_eq!(xa.send(m, false, Some(LIMIT)).unwrap(), MSG);
    }
    let changes = xa.stats().watch_changes.load(Ordering::Relaxed) - before;
    reader.join().unwrap();
    println!("{changes} watch changes for {N} MiB sent");
    // At most the connection's start (established) besides; 170 before.
    assert!(
        changes <= 4,
        "{changes} watch changes for {N} sends of 1 MiB"
    );
}

/// A 1 MiB write is DATA messages that each fill a slot (two of the
/// default 512 KiB): slots hold a power of two of payload with the message
/// header on top (`Options::slot_size_for`). With 256 KiB slots header
/// included it was five, the fifth carrying the last 32 bytes — a Send,
/// two completions and a credit for 32 bytes. The reader reads less than
/// the sink threshold, so every byte goes as DATA.
#[test]
fn a_1_mib_write_is_full_messages() {
    const MSG: usize = 1 << 20;
    const N: usize = 8;
    let (a, b) = tcp_pair();
    let (xa, xb) = switch_both(&a, &b, &opts());
    let data = Arc::new(pattern(N * MSG, 4));
    let reader = read_all(xb, 32 << 10, Arc::clone(&data));
    let before = xa.stats().tx_msgs.load(Ordering::Relaxed);
    for m in data.chunks(MSG) {
        assert_eq!(xa.send(m, false, Some(LIMIT)).unwrap(), MSG);
    }
    let msgs = xa.stats().tx_msgs.load(Ordering::Relaxed) - before;
    reader.join().unwrap();
    let per_write = (MSG / (opts().slot_size as usize - HDR_LEN)) as u64;
    assert_eq!(
        msgs,
        per_write * N as u64,
        "DATA messages for {N} writes of 1 MiB"
    );
}

/// A blocking write of at least `zcopy_min` bytes that fits one message
/// is sent from the caller's buffer, not copied: the send call's straight
/// path (`XSocket::send_straight`, one small copied message) is not for
/// it. And a write below the threshold is that one copied message.
#[test]
fn a_one_message_write_from_the_threshold_up_is_not_copied() {
    let o = opts();
    assert!(o.zcopy_min < o.slot_size as usize - HDR_LEN, "one message");
    let (a, b) = tcp_pair();
    let (xa, xb) = switch_both(&a, &b, &o);
    let small = 64;
    let data = Arc::new(pattern(o.zcopy_min + small, 5));
    let reader = read_all(xb, 32 << 10, Arc::clone(&data));
    let copied = || xa.stats().tx_copied.load(Ordering::Relaxed);
    let msgs = || xa.stats().tx_msgs.load(Ordering::Relaxed);
    let (c0, m0) = (copied(), msgs());
    // The small one first: the connection is established after it.
    let (first, rest) = data.split_at(small);
    assert_eq!(xa.send(first, false, Some(LIMIT)).unwrap(), small);
    assert_eq!(copied() - c0, small as u64, "a small write is copied");
    assert_eq!(msgs() - m0, 1, "one message");
    assert_eq!(xa.send(rest, false, Some(LIMIT)).unwrap(), o.zcopy_min);
    assert_eq!(
        copied() - c0,
        small as u64,
        "a write of zcopy_min bytes was copied"
    );
    assert_eq!(msgs() - m0, 2, "one message");
    reader.join().unwrap();
}

/// A writer whose slots are smaller than its reader's (review r17, item 1):
/// a write that fits the reader's slot but not the writer's goes as
/// messages of the writer's slot, also once the engine holds a backlog (a
/// full send buffer: the inline send refused, each message posted from a
/// transmit slot). One message of the reader's size was copied past the
/// end of a transmit slot (a panic, or the next slot's message overwritten
/// in release builds): the reader gets every byte as written.
#[test]
fn a_writer_with_smaller_slots_sends_a_slots_worth_per_message() {
    let (a, b) = tcp_pair();
    for s in [&a, &b] {
        set_buf(s, libc::SO_SNDBUF, 4096);
        set_buf(s, libc::SO_RCVBUF, 4096);
    }
    // Writes until the credits or the slots run out: no send buffer.
    let small = Options {
        slot_size: Options::slot_size_for(1024),
        ..unbuffered()
    };
    let (xa, xb) = std::thread::scope(|sc| {
        let ta = sc.spawn(|| switch_fd(a.as_fd(), &small).unwrap());
        let tb = sc.spawn(|| switch_fd(b.as_fd(), &opts()).unwrap());
        (ta.join().unwrap(), tb.join().unwrap())
    });
    let payload = small.slot_size as usize - HDR_LEN;
    assert!(xb.peer_hello().slot_size == small.slot_size);
    // Established both ways before the writes.
    assert_eq!(xa.send(&[7], false, Some(LIMIT)).unwrap(), 1);
    assert_eq!(recv_exact(&xb, 1), [7]);
    // Non-blocking writes of 30,000 bytes (over our slot, under the
    // reader's and zcopy_min) until the credits or the slots run out; the
    // reader does not read meanwhile.
    const CALL: usize = 30_000;
    assert!(CALL > payload && CALL < opts().zcopy_min);
    let data = pattern(64 * CALL, 6);
    let mut sent = 0;
    for _ in 0..64 {
        match xa.send(&data[sent..sent + CALL], true, None) {
            Ok(n) => sent += n,
            Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => break,
            Err(e) => panic!("send: {e}"),
        }
    }
    assert!(sent > 0 && sent < data.len(), "{sent} bytes went");
    // The rest of the last byte's call blocks until the reader made room.
    let reader = std::thread::spawn(move || recv_exact(&xb, sent + 1));
    assert_eq!(xa.send(&data[sent..=sent], false, Some(LIMIT)).unwrap(), 1);
    // The call may return with part of the writes still in the engine's
    // backlog (a full send buffer): the writer's end drives its engine (no
    // progress thread here) until the reader has everything.
    let t = std::time::Instant::now();
    while !reader.is_finished() {
        assert!(
            t.elapsed() < LIMIT,
            "the reader did not get {} bytes",
            sent + 1
        );
        xa.progress();
        std::thread::yield_now();
    }
    let got = reader.join().unwrap();
    assert!(
        got == data[..=sent],
        "the reader's bytes differ from the writes"
    );
}

/// One-message writes the straight path takes (`XSocket::send_straight`:
/// below `zcopy_min`, within a slot, a credit), through `send` and through
/// `send_vectored_ready` (the preload's, which tries the straight path in
/// its own frame), while the engine holds a backlog for a 4 KiB send
/// buffer (the reader does not read yet): the inline send is refused and the
/// message goes from a transmit slot instead. Every byte arrives in order,
/// and every message is counted.
#[test]
fn straight_writes_refused_inline_go_from_a_transmit_slot() {
    let (a, b) = tcp_pair();
    set_buf(&a, libc::SO_SNDBUF, 4096);
    // The reader's window closes too, whatever the host's default `tcp_rmem`.
    set_buf(&b, libc::SO_RCVBUF, 4096);
    // Writes until the credits run out: no send buffer.
    let (xa, xb) = switch_both(&a, &b, &unbuffered());
    assert_eq!(xa.send(&[7], false, Some(LIMIT)).unwrap(), 1);
    assert_eq!(recv_exact(&xb, 1), [7]);
    const CALL: usize = 30_000;
    assert!(CALL < opts().zcopy_min);
    let data = pattern(16 * CALL, 8);
    let (m0, i0) = (
        xa.stats().tx_msgs.load(Ordering::Relaxed),
        xa.inline_sends(),
    );
    let mut sent = 0;
    // `send_vectored_ready` calls that went from a slot themselves.
    let mut vectored_refused = 0;
    for k in 0..16 {
        let b = &data[sent..sent + CALL];
        let i = xa.inline_sends();
        let r = if k % 2 == 0 {
            xa.send(b, true, None)
        } else {
            xa.send_vectored_ready(&[b], true, None).0
        };
        match r {
            Ok(n) => {
                assert_eq!(n, CALL, "one message");
                sent += n;
                if k % 2 == 1 && xa.inline_sends() == i {
                    vectored_refused += 1;
                }
            }
            Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => break,
            Err(e) => panic!("send: {e}"),
        }
    }
    let msgs = (sent / CALL) as u64;
    assert!(msgs >= 4, "{msgs} messages went");
    assert_eq!(xa.stats().tx_msgs.load(Ordering::Relaxed) - m0, msgs);
    assert!(
        xa.inline_sends() - i0 < msgs,
        "every message went inline: no backlog"
    );
    assert!(
        vectored_refused > 0,
        "no send_vectored_ready call was refused inline"
    );
    // The writer's end drives its engine (no progress thread here) until
    // the reader has everything.
    let reader = std::thread::spawn(move || recv_exact(&xb, sent));
    let t = std::time::Instant::now();
    while !reader.is_finished() {
        assert!(t.elapsed() < LIMIT, "the reader did not get {sent} bytes");
        xa.progress();
        std::thread::yield_now();
    }
    let got = reader.join().unwrap();
    assert!(
        got == data[..sent],
        "the reader's bytes differ from the writes"
    );
}

/// A write of several messages hands them to the engine together
/// (`XSocket::post_deferred`): one transmit pass, so one gathered `sendmsg`
/// for a 1 MiB write where each of its four messages was one, and each
/// ended in a short TCP segment of its own (BENCHMARKS §6, session 14:
/// 20 segments per MiB against host TCP's 17). The send buffer takes each
/// whole write and the reader has credit for it, so nothing is left for a
/// later pass (the reader's credits coming back make none); the bytes
/// arrive intact. The non-blocking (copied) write's four messages go as
/// one gathered list from the caller's buffer (`io/data/listed.rs`), none
/// of its bytes copied: the connection's 16 slots of credit hold the
/// three writes whatever the reader did.
#[test]
fn a_1_mib_write_is_one_transmit_pass() {
    const MSG: usize = 1 << 20;
    let (a, b) = tcp_pair();
    set_buf(&a, libc::SO_SNDBUF, 4 << 20);
    let (xa, xb) = switch_both(&a, &b, &opts());
    let data = Arc::new(pattern(3 * MSG, 6));
    // The first write settles the connection (the peer's first credits).
    // Reads below the sink threshold: every byte goes as DATA.
    let reader = read_all(xb, 32 << 10, Arc::clone(&data));
    assert_eq!(xa.send(&data[..MSG], false, Some(LIMIT)).unwrap(), MSG);
    for (k, m) in data[MSG..].chunks(MSG).enumerate() {
        let p0 = xa.tx_passes();
        let (g0, c0) = (xa.gathered_sends().0, copied(&xa));
        // Blocking (from the caller's buffer) and non-blocking (copied).
        assert_eq!(xa.send(m, k == 1, Some(LIMIT)).unwrap(), MSG);
        let passes = xa.tx_passes() - p0;
        assert_eq!(passes, 1, "transmit passes for write {k} of 1 MiB");
        if k == 1 {
            assert_eq!(xa.gathered_sends().0 - g0, 4, "messages gathered");
            let c = copied(&xa) - c0;
            assert!(c < MSG as u64 / 4, "{c} bytes of a gathered write copied");
        }
    }
    reader.join().unwrap();
}

/// A 4 MiB non-blocking write on a fresh connection: its messages of a
/// slot each that the peer's first credits cover (all but the one kept
/// for control messages) are all gathered from the caller's buffer — more
/// FPDUs than one gathered write takes (64), so in two, the second once
/// the socket took the first whole — none copied; the reader gets every
/// byte.
#[test]
fn a_4_mib_write_goes_gathered_in_two_writes() {
    const LEN: usize = 4 << 20;
    let (a, b) = tcp_pair();
    set_buf(&a, libc::SO_SNDBUF, 16 << 20);
    let (xa, xb) = switch_both(&a, &b, &opts());
    let data = Arc::new(pattern(LEN, 12));
    let (g0, c0) = (xa.gathered_sends().0, copied(&xa));
    assert_eq!(xa.send(&data, true, Some(LIMIT)).unwrap(), LEN);
    let reader = read_all(xb, 32 << 10, Arc::clone(&data));
    // Messages one gathered write takes at most.
    let payload = opts().slot_size as usize - HDR_LEN;
    let per_write = 64 / (payload + HDR_LEN).div_ceil(xa.mulpdu() - 18);
    let gathered = xa.gathered_sends().0 - g0;
    assert!(
        gathered as usize > per_write && gathered as usize >= LEN / payload - 1,
        "{gathered} messages gathered ({per_write} a write)"
    );
    let c = copied(&xa) - c0;
    assert!(c <= payload as u64, "{c} bytes of a gathered write copied");
    let t = std::time::Instant::now();
    while !reader.is_finished() {
        assert!(t.elapsed() < LIMIT, "the reader did not get every byte");
        xa.progress();
        std::thread::yield_now();
    }
    reader.join().unwrap();
}

/// Non-blocking writes of several messages into a connection whose
/// kernel buffers are small (the writer's send buffer and the reader's
/// receive buffer): a gathered list the socket takes in part leaves its
/// rest with the engine (copied), and a list that finds such a rest
/// queued ahead goes from the transmit slots instead, behind it; the
/// reader gets every byte in order.
#[test]
fn gathered_lists_and_their_fallback_keep_the_stream_in_order() {
    const MSG: usize = 1 << 20;
    let (a, b) = tcp_pair();
    set_buf(&a, libc::SO_SNDBUF, 64 << 10);
    set_buf(&b, libc::SO_RCVBUF, 64 << 10);
    let (xa, xb) = switch_both(&a, &b, &opts());
    let data = Arc::new(pattern(8 * MSG, 9));
    let reader = read_all(xb, 32 << 10, Arc::clone(&data));
    let (mut off, t) = (0, std::time::Instant::now());
    while off < data.len() {
        assert!(t.elapsed() < LIMIT, "{off} bytes written");
        // Odd lengths: the last message of a call is short.
        let end = (off + MSG + 4097).min(data.len());
        match xa.send(&data[off..end], true, Some(LIMIT)) {
            Ok(n) => off += n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                xa.progress();
                std::thread::yield_now();
            }
            Err(e) => panic!("write at {off}: {e}"),
        }
    }
    while !reader.is_finished() {
        assert!(t.elapsed() < LIMIT, "the reader did not get every byte");
        xa.progress();
        std::thread::yield_now();
    }
    reader.join().unwrap();
    let (gathered, rest) = xa.gathered_sends();
    assert!(gathered > 0, "no message gathered");
    assert!(
        rest > 0,
        "no gathered list's rest copied: {gathered} gathered"
    );
}

/// Bytes `x` copied into transmit slots or, of gathered sends, that its
/// socket did not take.
fn copied(x: &XSocket) -> u64 {
    x.stats().tx_copied.load(Ordering::Relaxed)
}

/// Reads `want.len()` bytes from `x` in a thread, `chunk` bytes a call at
/// most, and checks them against `want`.
fn read_all(x: XSocket, chunk: usize, want: Arc<Vec<u8>>) -> JoinHandle<()> {
    std::thread::spawn(move || {
        let mut buf = vec![0u8; chunk];
        let mut got = 0;
        while got < want.len() {
            let (n, _) = x.recv(&mut buf, RecvFlags::default(), Some(LIMIT)).unwrap();
            assert!(n > 0, "end of stream after {got}");
            assert!(buf[..n] == want[got..got + n], "bytes {got}..");
            got += n;
        }
    })
}

/// No sink is offered while the writer's send call is still arriving: a
/// reader of 1 MiB blocking reads (sinks on, the default) behind a 2 MiB
/// send call — eight DATA messages, all within the writer's credits, so
/// it never waits for the reader — waits for the call's DATA instead of
/// offering its buffer, which the writer, past the offer's position,
/// could only decline (a SINK and a SINK_DONE(0) each). The reader's
/// first read takes one byte, so the call's first DATA (not its last) has
/// arrived before any large read; counted by `XSocket::stats`.
#[test]
fn no_sink_is_offered_while_the_writers_call_is_arriving() {
    let (a, b) = tcp_pair();
    let (xa, xb) = switch_both(&a, &b, &opts());
    let total = 2 << 20;
    let data = pattern(total, 41);
    let offers = |x: &XSocket| x.stats().sink_offers.load(Ordering::Relaxed);
    std::thread::scope(|sc| {
        sc.spawn(|| {
            assert_eq!(xa.send(&data, false, Some(LIMIT)).unwrap(), total);
        });
        let mut got = vec![0u8; total];
        let (n, _) = xb
            .recv(&mut got[..1], RecvFlags::default(), Some(LIMIT))
            .unwrap();
        assert_eq!(n, 1);
        let before = offers(&xb);
        let mut off = 1;
        let mut reads = 0;
        while off < total {
            let want = (1 << 20).min(total - off);
            let (n, _) = xb
                .recv(&mut got[off..off + want], RecvFlags::default(), Some(LIMIT))
                .unwrap();
            assert!(n > 0);
            off += n;
            reads += 1;
        }
        assert!(got == data, "bytes out of order or damaged");
        assert_eq!(
            offers(&xb) - before,
            0,
            "sinks offered in {reads} reads of a call still arriving"
        );
    });
    let st = xb.stats();
    assert_eq!(st.rx_copied.load(Ordering::Relaxed), total as u64);
}

/// A reader between the writer's calls still offers its buffer: the
/// writer's last call ended (its last DATA closed it) and no offer was
/// declined yet, so a large read posted before the next call is a sink
/// the writer fills in place.
#[test]
fn a_read_posted_between_calls_is_still_offered_and_filled() {
    let (a, b) = tcp_pair();
    let (xa, xb) = switch_both(&a, &b, &opts());
    let first = pattern(300_000, 42);
    let second = pattern(1 << 20, 43);
    let offers = |x: &XSocket| x.stats().sink_offers.load(Ordering::Relaxed);
    xa.send(&first, false, Some(LIMIT)).unwrap();
    // One byte first (a small read offers nothing), then the rest: the
    // reads after it come while the call arrives, so no sink was offered
    // (and none declined) before the one this test is about.
    let mut head = [0u8; 1];
    xb.recv(&mut head, RecvFlags::default(), Some(LIMIT))
        .unwrap();
    assert_eq!(head[0], first[0]);
    assert!(recv_exact(&xb, first.len() - 1) == first[1..]);
    assert_eq!(offers(&xb), 0);
    let placed_before = xb.stats().rx_placed.load(Ordering::Relaxed);
    let offers_before = offers(&xb);
    let xb = Arc::new(xb);
    let r = {
        let xb = Arc::clone(&xb);
        std::thread::spawn(move || {
            let mut buf = vec![0u8; 1 << 20];
            let f = RecvFlags {
                waitall: true,
                ..RecvFlags::default()
            };
            let (n, _) = xb.recv(&mut buf, f, Some(LIMIT)).unwrap();
            buf.truncate(n);
            buf
        })
    };
    // The writer's next call goes after the offer arrived (it then writes
    // into the sink).
    let t = std::time::Instant::now();
    while !xa.peer_sink_ready() {
        assert!(t.elapsed() < LIMIT, "no sink offered");
        std::thread::yield_now();
    }
    xa.send(&second, false, Some(LIMIT)).unwrap();
    assert!(r.join().unwrap() == second);
    assert_eq!(offers(&xb) - offers_before, 1);
    assert_eq!(
        xb.stats().rx_placed.load(Ordering::Relaxed) - placed_before,
        second.len() as u64
    );
}
