//! A close while the peer still reads what we sent (the benchmark's
//! bidirectional DDP-socket test, `ECONNRESET` at the client about 1 run
//! in 13 in CI; task xclose). Each `XSocket` has a context of its own,
//! driven by its callers: the engine's linger after a disconnect (the
//! socket stays open, its input discarded, until the peer's FIN — a
//! closed TCP socket answers bytes with a reset) ran only while
//! something drove it, and dropping the socket dropped the context with
//! the engine's socket in it at once. The peer's reads of our last
//! messages return credits (every fourth message): they met the closed
//! socket, its reset dropped what our kernel had not sent yet, and the
//! peer's engine failed before it read the rest and our end of stream.
//! `XSocket::linger_after_close` keeps the socket open until the peer's
//! FIN.

use std::os::fd::AsRawFd;
use std::time::Duration;

use warpsock_xsock::io::{Options, RecvFlags};

mod net;

use net::{pattern, recv_exact, set_buf, switch_both, tcp_pair, unbuffered, LIMIT};

const SHORT: Option<Duration> = Some(Duration::from_secs(4));

/// A message's payload: large enough that the engine reads each one's
/// header, then places the payload (not a whole socket buffer's worth
/// at once: the peer's FIN stays unread behind the messages).
const MSG: usize = 16 << 10;

/// 16 slots of [`MSG`]: 12 messages fit the window.
fn window() -> Options {
    Options {
        slots: 16,
        slot_size: Options::slot_size_for(MSG as u32),
        zcopy_min: 1 << 20,
        ..unbuffered()
    }
}

/// B's reads (of [`MSG`] bytes at most each) until its end of stream:
/// every byte read; a read that fails panics with how many of `len` came
/// before it.
fn read_to_end(xb: &warpsock_xsock::io::XSocket, len: usize) -> Vec<u8> {
    let mut got = Vec::new();
    let mut buf = vec![0u8; MSG];
    loop {
        let (k, _) = xb
            .recv(&mut buf, RecvFlags::default(), SHORT)
            .unwrap_or_else(|e| panic!("B's read after {}/{len}: {e}", got.len()));
        if k == 0 {
            return got;
        }
        got.extend_from_slice(&buf[..k]);
    }
}

/// A sends 12 messages of 16 KiB (within B's window: B reads nothing
/// yet), B ends its stream, A reads that end, then in a thread closes,
/// lingers for B's FIN (as the preload's reaper does, in steps: below)
/// and drops. B reads once A's close returned: every byte in 16 KiB
/// reads (credits go back) and A's end of stream, then closes. Fails with the linger a no-op: B's
/// read after 64 KiB fails with `ECONNRESET` (10 runs of 10).
#[test]
fn the_peer_reads_our_last_bytes_after_our_close() {
    const LEN: usize = 12 * MSG;
    let (a, b) = tcp_pair();
    // B's kernel takes a few messages at a time: the rest, and A's FIN
    // behind them, wait in A's kernel (A's send calls and close returned)
    // until B reads — as in the benchmark, whose both ends send at once.
    set_buf(&b, libc::SO_RCVBUF, 16 << 10);
    set_buf(&a, libc::SO_SNDBUF, 1 << 20);
    let (xa, xb) = switch_both(&a, &b, &window());
    // Each XSocket holds a descriptor of its own: with these gone, its
    // drop closes the connection's last one (as the preload's close).
    drop((a, b));
    let ma = pattern(LEN, 7);
    assert_eq!(xa.send(&ma, false, SHORT).unwrap(), LEN);
    xb.shutdown(false, true);
    // Its EOF goes with a round (nothing else drives B here).
    xb.progress();
    let mut one = [0u8; 8];
    let (n, _) = xa.recv(&mut one, RecvFlags::default(), SHORT).unwrap();
    assert_eq!(n, 0, "A reads B's end of stream");
    let (closed, is_closed) = std::sync::mpsc::channel();
    std::thread::scope(|sc| {
        sc.spawn(move || {
            assert!(xa.close(LIMIT), "A's bytes all left");
            closed.send(()).unwrap();
            xa.linger_after_close(LIMIT);
            drop(xa);
        });
        // B reads once A's close has sent its FIN (the benchmark's
        // order: its client still reads as the server's close returns).
        is_closed.recv().unwrap();
        let got = read_to_end(&xb, LEN);
        assert!(got == ma, "B read {} of {LEN} bytes, or others", got.len());
        assert!(xb.close(LIMIT), "B's end of stream left");
    });
}

/// The same close in non-blocking steps (`close_begin`, then `close_step`
/// whenever the engine's socket is ready for `close_events`, as the
/// preload's reaper makes them), with a second stepped close in the same
/// loop whose peer D never reads nor closes: A's close ends — B reads
/// every byte and A's end of stream, then closes, and A's linger sees
/// B's FIN — while C still lingers for D's. One thread drives both and
/// the silent peer holds up nobody. Fails with a step that blocks for its
/// socket's linger (A's close waits behind C's).
#[test]
fn a_stepped_close_ends_while_a_silent_peers_close_lingers() {
    use std::time::Instant;
    use warpsock_xsock::io::Phase;

    const LEN: usize = 12 * MSG;
    let (a, b) = tcp_pair();
    set_buf(&b, libc::SO_RCVBUF, 16 << 10);
    set_buf(&a, libc::SO_SNDBUF, 1 << 20);
    let (xa, xb) = switch_both(&a, &b, &window());
    let (c, d) = tcp_pair();
    let (xc, xd) = switch_both(&c, &d, &window());
    drop((a, b, c));
    let ma = pattern(LEN, 9);
    assert_eq!(xa.send(&ma, false, SHORT).unwrap(), LEN);
    assert_eq!(xc.send(&ma[..MSG], false, SHORT).unwrap(), MSG);
    let (sent, is_sent) = std::sync::mpsc::channel();
    let (done, is_done) = std::sync::mpsc::channel();
    std::thread::scope(|sc| {
        sc.spawn(move || {
            let now = Instant::now();
            let xs = [xa, xc];
            let mut cs = xs.each_ref().map(|x| x.close_begin(LIMIT, now));
            let mut told = false;
            loop {
                let now = Instant::now();
                let phases = [0, 1].map(|i| xs[i].close_step(&mut cs[i], now));
                if phases[0] != Phase::Sending && !told {
                    assert_eq!(cs[0].all_left(), Some(true), "A's bytes all left");
                    sent.send(()).unwrap();
                    told = true;
                }
                if phases[0] == Phase::Done {
                    done.send(phases[1]).unwrap();
                    break;
                }
                let until = cs.iter().map(|c| c.deadline()).min().unwrap();
                let mut fds = [0, 1].map(|i| libc::pollfd {
                    fd: xs[i].tcp_fd(),
                    events: xs[i].close_events(),
                    revents: 0,
                });
                let ms = until.saturating_duration_since(now).as_millis().min(1000) as i32;
                // SAFETY: two pollfds on the stack.
                unsafe { libc::poll(fds.as_mut_ptr(), 2, ms) };
            }
            let [_, xc] = xs;
            xc.close_cut(&mut cs[1]);
        });
        is_sent.recv().unwrap();
        let got = read_to_end(&xb, LEN);
        assert!(got == ma, "B read {} of {LEN} bytes, or others", got.len());
        assert!(xb.close(LIMIT), "B's end of stream left");
        let c_phase = is_done.recv().unwrap();
        assert_eq!(c_phase, Phase::Lingering, "C lingers for D's FIN still");
    });
    drop((d, xd));
}

/// Waits (4 s at most) until `x`'s engine socket holds input.
fn input_waits(x: &warpsock_xsock::io::XSocket) {
    let mut p = libc::pollfd {
        fd: x.tcp_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one pollfd on the stack.
    assert_eq!(unsafe { libc::poll(&mut p, 1, 4000) }, 1, "input came");
}

/// A close's look at bytes received and never read (`XSocket::unread`:
/// such a close resets, as TCP's): the peer's credit returns for our own
/// messages, waiting in our engine's socket, are not bytes; the peer's
/// bytes there are, once the look's round takes them in; read, they no
/// longer count.
#[test]
fn unread_counts_the_peers_bytes_not_its_credit_returns() {
    let (a, b) = tcp_pair();
    let (xa, xb) = switch_both(&a, &b, &window());
    assert!(!xa.unread(), "nothing received");
    let m = pattern(8 * MSG, 3);
    assert_eq!(xa.send(&m, false, SHORT).unwrap(), m.len());
    // B's reads return credits (every fourth message).
    assert_eq!(recv_exact(&xb, m.len()), m);
    input_waits(&xa);
    assert!(!xa.unread(), "credit returns are not bytes");
    assert_eq!(xb.send(b"unread!!", false, SHORT).unwrap(), 8);
    input_waits(&xa);
    assert!(xa.unread(), "the peer's 8 B, taken in by the look's round");
    assert_eq!(recv_exact(&xa, 8), b"unread!!");
    assert!(!xa.unread(), "read");
}

/// A program's close as the preload begins it (`close_begin_or_reset`:
/// the unread look and the begin under one take of the lock): with the
/// peer's bytes unread, a reset — B reads `ECONNRESET` once A's socket is
/// dropped, never a clean end; with none, the orderly close, B reading
/// A's end of stream.
#[test]
fn a_close_with_bytes_unread_begins_as_a_reset() {
    use std::time::Instant;
    use warpsock_xsock::io::{Begun, Phase};
    let (a, b) = tcp_pair();
    let (xa, xb) = switch_both(&a, &b, &window());
    drop((a, b));
    assert_eq!(xb.send(b"unread!!", false, SHORT).unwrap(), 8);
    input_waits(&xa);
    let begun = xa.close_begin_or_reset(LIMIT, Instant::now());
    assert!(matches!(begun, Begun::Reset), "{begun:?}");
    drop(xa);
    let mut buf = [0u8; 8];
    let e = xb.recv(&mut buf, RecvFlags::default(), SHORT).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ECONNRESET), "{e}");

    let (c, d) = tcp_pair();
    let (xc, xd) = switch_both(&c, &d, &window());
    drop((c, d));
    let Begun::Orderly(mut cl) = xc.close_begin_or_reset(LIMIT, Instant::now()) else {
        panic!("nothing unread: an orderly close");
    };
    let t = Instant::now();
    while xc.close_step(&mut cl, Instant::now()) == Phase::Sending {
        assert!(t.elapsed() < LIMIT, "C's end of stream left");
    }
    let (k, _) = xd.recv(&mut buf, RecvFlags::default(), SHORT).unwrap();
    assert_eq!(k, 0, "C's end of stream");
    xc.close_cut(&mut cl);
}

/// A stepped close waits for no input once the engine read the peer's
/// FIN: the socket stays readable (EOF) for good, and a stepper that
/// still asked for `POLLIN` woke at once every round, spinning until its
/// backlog drained or the linger ended (review r25-a item 4). Before the
/// FIN it asks for input (credits, the FIN itself). Fails with
/// `close_events` asking for `POLLIN` always.
#[test]
fn a_close_waits_for_no_input_after_the_peers_fin() {
    let (a, b) = tcp_pair();
    let (xa, xb) = switch_both(&a, &b, &window());
    assert_ne!(
        xa.close_events() & libc::POLLIN,
        0,
        "input asked before the FIN"
    );
    assert!(xb.close(LIMIT), "B's end of stream left");
    drop(xb);
    // A reads B's end of stream; the engine has read B's FIN behind it
    // once a read returns 0 and a round saw the socket's EOF.
    let mut buf = [0u8; 8];
    let (k, _) = xa.recv(&mut buf, RecvFlags::default(), SHORT).unwrap();
    assert_eq!(k, 0, "B's end of stream");
    input_waits(&xa);
    let deadline = std::time::Instant::now() + Duration::from_secs(4);
    while !xa.read_closed() {
        assert!(
            std::time::Instant::now() < deadline,
            "A's engine read B's FIN"
        );
        // A round of progress (the look's).
        assert!(!xa.unread());
    }
    assert_eq!(
        xa.close_events() & libc::POLLIN,
        0,
        "no input asked after the FIN"
    );
    drop((a, b));
}

/// A close cut while its bytes still wait (the reaper's bound on the
/// closes it holds) resets the connection: the caller drops the socket
/// at once, so what was unsent — messages in transmit slots, the end of
/// stream — never leaves, and the kernel's FIN alone would read as a
/// clean end after a short stream (review r25-a item 5). Here A's window
/// is full (B reads nothing): the cut finds messages unsent with no send
/// queued, the case the cut did not reset. B then reads what came and
/// `ECONNRESET`, never a clean end. Fails with the cut resetting only
/// when sends are queued (B reads 0 after a short stream).
#[test]
fn a_close_cut_with_bytes_unsent_resets() {
    use std::time::Instant;
    let (a, b) = tcp_pair();
    set_buf(&b, libc::SO_RCVBUF, 16 << 10);
    set_buf(&a, libc::SO_SNDBUF, 16 << 10);
    let (xa, xb) = switch_both(&a, &b, &window());
    drop((a, b));
    // The whole window: its messages, and the end of stream behind them,
    // cannot all leave while B reads nothing (small kernel buffers).
    let m = pattern(12 * MSG, 5);
    assert_eq!(xa.send(&m, false, SHORT).unwrap(), m.len());
    let mut c = xa.close_begin(LIMIT, Instant::now());
    xa.close_cut(&mut c);
    assert_eq!(c.all_left(), Some(false));
    drop(xa);
    let mut got = 0;
    let mut buf = vec![0u8; MSG];
    let end = loop {
        match xb.recv(&mut buf, RecvFlags::default(), SHORT) {
            Ok((0, _)) => break None,
            Ok((k, _)) => got += k,
            Err(e) => break Some(e),
        }
    };
    let e = end.unwrap_or_else(|| panic!("a clean end after {got} of {} bytes", m.len()));
    assert!(got < m.len(), "the cut lost bytes ({got})");
    assert_eq!(e.raw_os_error(), Some(libc::ECONNRESET), "{e}");
}

/// A writer (32 slots of 4 KiB, as the preload's tests) sends 96 KiB in
/// 4 KiB messages, then (if `close`) closes, and is gone before its
/// reader reads anything (issue 12, task xlate): its engine's socket
/// closed, the kernel's FIN sent behind the bytes. B reads only once its
/// kernel has that FIN, 4 KiB at a time: every byte, then 0, as TCP's
/// reader.
fn read_after_the_writer_is_gone(close: bool) {
    const PART: usize = 4 << 10;
    const LEN: usize = 24 * PART;
    let o = Options {
        slots: 32,
        slot_size: Options::slot_size_for(PART as u32),
        zcopy_min: 1 << 20,
        ..unbuffered()
    };
    let (a, b) = tcp_pair();
    // B's kernel takes every message and A's FIN behind them.
    set_buf(&b, libc::SO_RCVBUF, 1 << 20);
    set_buf(&a, libc::SO_SNDBUF, 1 << 20);
    let (xa, xb) = switch_both(&a, &b, &o);
    drop((a, b));
    let ma = pattern(LEN, 9);
    for c in ma.chunks(PART) {
        assert_eq!(xa.send(c, false, SHORT).unwrap(), PART);
    }
    if close {
        assert!(xa.close(LIMIT), "A's bytes all left");
    }
    drop(xa);
    // B's kernel has A's FIN (behind the bytes) before B reads.
    let fd = xb.tcp_fd();
    let t = std::time::Instant::now();
    loop {
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLRDHUP,
            revents: 0,
        };
        // SAFETY: one pollfd.
        #[allow(unsafe_code)]
        let r = unsafe { libc::poll(&mut p, 1, 1000) };
        if r > 0 && p.revents & libc::POLLRDHUP != 0 {
            break;
        }
        assert!(t.elapsed() < LIMIT, "B's kernel never got A's FIN");
    }
    let mut got = Vec::new();
    let mut buf = vec![0u8; PART];
    loop {
        let (k, _) = xb
            .recv(&mut buf, RecvFlags::default(), SHORT)
            .unwrap_or_else(|e| panic!("B's read after {}/{LEN}: {e}", got.len()));
        if k == 0 {
            break;
        }
        got.extend_from_slice(&buf[..k]);
    }
    assert!(got == ma, "B read {} of {LEN} bytes, or others", got.len());
    let (n, _) = xb.recv(&mut buf, RecvFlags::default(), SHORT).unwrap();
    assert_eq!(n, 0, "B reads 0 again");
}

/// [`read_after_the_writer_is_gone`], the writer gone without its close
/// (killed, or ended outside the library: no EOF message, only the
/// kernel's FIN): B's reads free slots and would return them in CREDITs,
/// which reach the closed socket and draw its reset. B sends none once
/// its kernel has the FIN (`Stream::set_peer_fin`, looked at in `flush`
/// before a CREDIT): it reads every byte, then 0, as TCP's reader. Fails
/// without that look: B's read after 96 KiB fails with `ECONNRESET`.
#[test]
fn a_reader_that_reads_after_its_writer_was_killed_gets_every_byte() {
    read_after_the_writer_is_gone(false);
}

/// [`read_after_the_writer_is_gone`], the writer having closed (`write;
/// close; _exit`): every byte, then 0 (B's returns after A's EOF message
/// were already none).
#[test]
fn a_reader_that_reads_after_its_writer_exited_gets_every_byte() {
    read_after_the_writer_is_gone(true);
}

/// A writer (32 slots of 4 KiB) sends 96 KiB in 4 KiB messages, and its
/// connection is reset (`SO_LINGER` {1, 0} and its close) before its
/// reader reads anything (issue 12, task xlate). B reads only once its
/// kernel has the reset, and its engine has placed every byte and seen
/// the reset: as Linux's reader, whose receive queue stays readable after
/// a reset (`tcp_recvmsg` reads the queue before it looks at `sk_err`), B
/// reads every byte, then fails with `ECONNRESET`. Fails with the
/// receive's look at the connection's error moved before its look at the
/// books (`recv_call`): the first read fails.
#[test]
fn a_reader_gets_every_byte_received_before_a_reset_then_the_reset() {
    const PART: usize = 4 << 10;
    const LEN: usize = 24 * PART;
    let o = Options {
        slots: 32,
        slot_size: Options::slot_size_for(PART as u32),
        zcopy_min: 1 << 20,
        ..unbuffered()
    };
    let (a, b) = tcp_pair();
    set_buf(&b, libc::SO_RCVBUF, 1 << 20);
    set_buf(&a, libc::SO_SNDBUF, 1 << 20);
    let (xa, xb) = switch_both(&a, &b, &o);
    drop(b);
    let ma = pattern(LEN, 11);
    for c in ma.chunks(PART) {
        assert_eq!(xa.send(c, false, SHORT).unwrap(), PART);
    }
    // Every byte in B's kernel (A's has none unacknowledged), then the reset.
    let t = std::time::Instant::now();
    while unacked(a.as_raw_fd()) > 0 {
        assert!(t.elapsed() < LIMIT, "A's bytes never reached B's kernel");
        std::thread::yield_now();
    }
    net::reset(a, &xa);
    let fd = xb.tcp_fd();
    loop {
        let mut p = libc::pollfd {
            fd,
            events: 0,
            revents: 0,
        };
        // SAFETY: one pollfd.
        #[allow(unsafe_code)]
        let r = unsafe { libc::poll(&mut p, 1, 1000) };
        if r > 0 && p.revents & (libc::POLLERR | libc::POLLHUP) != 0 {
            break;
        }
        assert!(t.elapsed() < LIMIT, "B's kernel never got A's reset");
    }
    // B's engine reads the bytes and the reset before B reads: the
    // connection has failed with every byte placed and unread.
    while xb.error().is_none() {
        xb.progress();
        assert!(t.elapsed() < LIMIT, "B's engine never saw the reset");
    }
    let mut got = Vec::new();
    let mut buf = vec![0u8; PART];
    let e = loop {
        match xb.recv(&mut buf, RecvFlags::default(), SHORT) {
            Ok((0, _)) => panic!("B's read after {}/{LEN}: 0, not the reset", got.len()),
            Ok((k, _)) => got.extend_from_slice(&buf[..k]),
            Err(e) => break e,
        }
    };
    assert!(
        got == ma,
        "B read {} of {LEN} bytes, or others, then {e}",
        got.len()
    );
    assert_eq!(e.raw_os_error(), Some(libc::ECONNRESET), "{e}");
    drop(xa);
}

/// `TIOCOUTQ`: bytes of `fd`'s send queue not yet acknowledged.
fn unacked(fd: std::os::fd::RawFd) -> libc::c_int {
    let mut v: libc::c_int = 0;
    // SAFETY: TIOCOUTQ writes one int.
    #[allow(unsafe_code)]
    let r = unsafe { libc::ioctl(fd, libc::TIOCOUTQ, &mut v) };
    assert_eq!(r, 0);
    v
}
