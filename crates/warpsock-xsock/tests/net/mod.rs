//! Helpers of the loopback tests: switched pairs of real TCP connections.
#![allow(dead_code)] // each test crate uses some of them

use std::net::{TcpListener, TcpStream};
use std::os::fd::{AsFd, AsRawFd};
use std::time::{Duration, Instant};

use warpsock_xsock::io::{switch_fd, Completion, Options, RecvFlags, Spun, XSocket};
use warpsock_xsock::switch::Limits;

pub(crate) const LIMIT: Duration = Duration::from_secs(20);

/// A non-blocking receive that is not a peek.
pub(crate) const NONBLOCKING: RecvFlags = RecvFlags {
    peek: false,
    nonblocking: true,
    waitall: false,
};

/// A non-blocking receive into `bufs` as the preload makes it: a quiet
/// socket's spin first (`XSocket::recv_quiet`: `EAGAIN` when the engine's
/// read found nothing, or the receive made under its lock), else the call.
pub(crate) fn spin_call(
    x: &XSocket,
    bufs: &mut [&mut [u8]],
    flags: RecvFlags,
) -> std::io::Result<(usize, bool)> {
    if x.quiet_now() {
        match x.recv_quiet(bufs, flags) {
            Spun::Empty => return Err(std::io::ErrorKind::WouldBlock.into()),
            Spun::Done(r, _) => return r,
            Spun::Usual => {}
        }
    }
    x.recv_vectored_ready(bufs, flags, None).0
}

/// Whether `x` is quiet and its engine's socket holds nothing: a quiet
/// spin's `EAGAIN` (consumes nothing then; only where nothing is due).
pub(crate) fn quiet_and_empty(x: &XSocket) -> bool {
    x.quiet_now()
        && matches!(
            x.recv_quiet(&mut [&mut [0u8; 8][..]], NONBLOCKING),
            Spun::Empty
        )
}

pub(crate) fn opts() -> Options {
    Options {
        limits: Limits::with_timeout(Duration::from_secs(3)),
        // The tests bound their reads with a timeout as a safety net; the
        // sinks they test are offered by timed reads too (the default
        // keeps timed reads from offering: `Options::sinks_timed`).
        sinks_timed: true,
        ..Options::default()
    }
}

/// 16 slots of 1 KiB payload a side: a window of 16 KiB, and no send
/// buffer past it (its tests are of the credit window itself: a send
/// stops at the last credit).
pub(crate) fn small_window() -> Options {
    Options {
        slots: 16,
        slot_size: Options::slot_size_for(1024),
        zcopy_min: 1 << 20,
        ..unbuffered()
    }
}

/// [`opts`] without a send buffer (`Options::sndbuf` 0): a send that
/// finds no credit waits (or gets `EAGAIN`) — the tests of the credit
/// window itself.
pub(crate) fn unbuffered() -> Options {
    Options {
        sndbuf: 0,
        ..opts()
    }
}

/// One switch mark (the urgent byte) sent on `s`, as a peer's warpsock
/// sends it.
pub(crate) fn send_mark(s: &TcpStream) {
    use std::os::fd::AsRawFd;
    let m = warpsock_xsock::switch::MARK;
    // SAFETY: one byte from the stack.
    let n = unsafe { libc::send(s.as_raw_fd(), (&m as *const u8).cast(), 1, libc::MSG_OOB) };
    assert_eq!(n, 1);
}

pub(crate) fn tcp_pair() -> (TcpStream, TcpStream) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let (s, _) = l.accept().unwrap();
    (c, s)
}

pub(crate) fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            (x.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 56) as u8
        })
        .collect()
}

/// Switches both ends at once (each in its own thread).
pub(crate) fn switch_both(a: &TcpStream, b: &TcpStream, o: &Options) -> (XSocket, XSocket) {
    std::thread::scope(|sc| {
        let ta = sc.spawn(|| switch_fd(a.as_fd(), o));
        let tb = sc.spawn(|| switch_fd(b.as_fd(), o));
        let (ra, rb) = (ta.join().unwrap(), tb.join().unwrap());
        match (ra, rb) {
            (Ok(x), Ok(y)) => (x, y),
            (ra, rb) => panic!("switch failed: {:?} / {:?}", ra.err(), rb.err()),
        }
    })
}

/// A switched pair over a new loopback connection that has carried a
/// byte each way: established both ways (a responder's first message
/// waits for the initiator's first FPDU), every later send goes at once.
#[allow(dead_code)]
pub(crate) fn established(o: &Options) -> (XSocket, XSocket) {
    let (a, b) = tcp_pair();
    let (xa, xb) = switch_both(&a, &b, o);
    xa.send(b"a", false, Some(LIMIT)).unwrap();
    xb.send(b"b", false, Some(LIMIT)).unwrap();
    assert_eq!(recv_exact(&xb, 1), b"a");
    assert_eq!(recv_exact(&xa, 1), b"b");
    (xa, xb)
}

pub(crate) fn recv_exact(x: &XSocket, n: usize) -> Vec<u8> {
    let mut out = vec![0; n];
    let mut got = 0;
    let t = Instant::now();
    while got < n {
        assert!(t.elapsed() < LIMIT, "timed out with {got}/{n}");
        let (k, _) = x
            .recv(&mut out[got..], RecvFlags::default(), Some(LIMIT))
            .unwrap();
        assert!(k > 0, "end of stream after {got}/{n}");
        got += k;
    }
    out
}

/// Resets `s`'s connection, whose other end `x` switched: linger 0, then
/// its last reference closed (the XSocket's descriptor is pointed at
/// /dev/null, so its number stays valid and names nothing of another
/// test's).
pub(crate) fn reset(s: TcpStream, x: &XSocket) {
    let null = std::fs::File::open("/dev/null").unwrap();
    let lin = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: plain system calls on descriptors this test owns.
    unsafe {
        assert_eq!(
            libc::setsockopt(
                s.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_LINGER,
                (&lin as *const libc::linger).cast(),
                size_of::<libc::linger>() as libc::socklen_t,
            ),
            0
        );
        assert!(libc::dup2(null.as_raw_fd(), x.tcp_fd()) >= 0);
    }
    drop(s);
}

pub(crate) fn set_buf(s: &TcpStream, opt: libc::c_int, bytes: libc::c_int) {
    // SAFETY: setsockopt reads one int from the stack.
    let r = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            opt,
            (&bytes as *const libc::c_int).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    assert_eq!(r, 0);
}

/// `rounds` reads of `chunk` bytes posted ahead of the data: `xb` reads a
/// chunk (MSG_WAITALL, or every other round a plain blocking read, if
/// `alternate`) and only then asks for the next one with a 1-byte "k";
/// `xa` runs `ready(round, waits)` before it sends each chunk, `waits`
/// being `xb`'s count of waits in the engine (`Counters::waits`) before
/// that chunk's read began: once the count passes it, the read is posted
/// and waiting (a writer that sent at once after the "k" raced the
/// reader's next read in a release build, and its bytes went to the
/// slots: 6–22 % copied). Checks that every byte arrived in order and
/// returns `xb`'s (received, copied) counters, printing the ratio.
pub(crate) fn reads_posted_ahead(
    xa: &XSocket,
    xb: std::sync::Arc<XSocket>,
    (chunk, rounds, seed): (usize, usize, u64),
    alternate: bool,
    ready: impl Fn(usize, u64),
) -> (u64, u64) {
    use std::sync::atomic::Ordering::Relaxed;
    // `xb`'s waits before each round's read (before its "k" for the next).
    let before = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(
        xb.stats().waits.load(Relaxed),
    ));
    let r = {
        let xb = std::sync::Arc::clone(&xb);
        let before = std::sync::Arc::clone(&before);
        std::thread::spawn(move || {
            let mut all = Vec::new();
            let mut buf = vec![0; chunk];
            for i in 0..rounds {
                let f = RecvFlags {
                    waitall: !alternate || i % 2 == 0,
                    ..RecvFlags::default()
                };
                let mut got = 0;
                while got < chunk {
                    let (n, _) = xb.recv(&mut buf[got..], f, Some(LIMIT)).unwrap();
                    assert!(n > 0);
                    got += n;
                }
                all.extend_from_slice(&buf);
                before.store(xb.stats().waits.load(Relaxed), Relaxed);
                xb.send(b"k", false, None).unwrap();
            }
            all
        })
    };
    let data = pattern(chunk * rounds, seed);
    for i in 0..rounds {
        ready(i, before.load(Relaxed));
        xa.send(&data[i * chunk..(i + 1) * chunk], false, None)
            .unwrap();
        let mut k = [0u8; 1];
        xa.recv(&mut k, RecvFlags::default(), Some(LIMIT)).unwrap();
    }
    assert!(r.join().unwrap() == data);
    let st = xb.stats();
    let (rx, copied, placed) = (
        st.rx_bytes.load(Relaxed),
        st.rx_copied.load(Relaxed),
        st.rx_placed.load(Relaxed),
    );
    assert_eq!(rx, data.len() as u64, "bytes received");
    assert_eq!(rx, copied + placed);
    println!(
        "{chunk} B reads posted ahead: {copied} of {rx} bytes copied ({:.6} per byte received)",
        copied as f64 / rx as f64
    );
    (rx, copied)
}

/// `TCP_RTO_MIN_US` of a socket (Linux 6.15), or `None` where the kernel
/// lacks it.
pub(crate) fn rto_min_us(s: &TcpStream) -> Option<i32> {
    let mut v: libc::c_int = 0;
    let mut n = size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `n` bytes into `v`.
    let r = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::IPPROTO_TCP,
            45,
            (&mut v as *mut libc::c_int).cast(),
            &mut n,
        )
    };
    (r == 0).then_some(v)
}

/// Whether bytes wait on `x`'s engine socket (a `poll` that does not
/// wait).
pub(crate) fn engine_socket_readable(x: &XSocket) -> bool {
    let mut p = libc::pollfd {
        fd: x.tcp_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one pollfd on the stack for the call's duration.
    unsafe { libc::poll(&mut p, 1, 0) == 1 }
}

/// Waits (bounded) until `writer` knows of the sink `reader`'s
/// asynchronous receive offered, `reader`'s completions polled into
/// `done` meanwhile (its socket driven so).
pub(crate) fn await_aio_sink(writer: &XSocket, reader: &XSocket, done: &mut Vec<Completion>) {
    let t = Instant::now();
    while !writer.peer_sink_offered() {
        assert!(t.elapsed() < LIMIT, "the receive offered no sink");
        reader.aio_poll(done, 1);
        std::thread::yield_now();
    }
}
