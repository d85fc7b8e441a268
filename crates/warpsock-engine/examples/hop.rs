//! The software cost of one message hop, without the scheduler: both ends
//! of a loopback connection live in one thread, which posts on one side
//! and polls on the other in turn. On loopback the kernel delivers a
//! segment during the sender's own `sendmsg`, so no one ever sleeps or
//! wakes: what is timed is the user-space work plus the two system calls
//! of a hop (send, receive). The same loop over two plain `TcpStream`s
//! (write SIZE bytes, read SIZE bytes) is the baseline, measured in the
//! same run, alternating in rounds so that machine phases hit both alike.
//!
//! ```text
//! cargo run --release -p warpsock-engine --example hop [-- ROUNDS HOPS_PER_ROUND SIZE OP CRC]
//! ```
//!
//! OP is `send` (default: a Send into a posted receive) or `write` (an
//! RDMA Write into the peer's buffer followed by a zero-byte Send that
//! notifies it, posted together: what `warpsock bench` times as Write
//! latency); CRC is `off` (default) or `on`.
//!
//! Prints ns per hop for TCP and for warpsock, medians over the rounds,
//! and their difference: the engine's own overhead per message (post,
//! frame, parse, place, complete), the quantity that decides latency once
//! both sides spin.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use warpsock_engine::{
    connect, Access, Context, Cq, Listener, Mr, Progress, Qp, QpInit, RecvWr, SendOp, SendWr, Sgl,
    Wc,
};

const LIMIT: Duration = Duration::from_secs(10);

/// What one hop carries.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Op {
    Send,
    Write,
}

struct Side {
    _ctx: Context,
    cq: Cq,
    qp: Qp,
    /// `[0, size)`: written by the peer's RDMA Writes; `[size, 2 size)`:
    /// the source of our own messages and the target of the peer's Sends.
    buf: Mr,
}

fn side(ctx: Context, size: usize, crc: bool, open: impl FnOnce(&QpInit<'_>) -> Qp) -> Side {
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq(64).expect("cq");
    let buf = pd.alloc(2 * size, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    let mut init = QpInit::new(&pd, &cq);
    init.options.crc = crc;
    init.recvs = (0..16)
        .map(|i| RecvWr {
            wr_id: i,
            sgl: buf.sge(size, size as u32).into(),
        })
        .collect();
    let qp = open(&init);
    Side {
        _ctx: ctx,
        cq,
        qp,
        buf,
    }
}

fn pair(size: usize, crc: bool) -> (Side, Side) {
    let l = Listener::bind("127.0.0.1:0").expect("bind");
    let addr = l.local_addr().expect("addr");
    let acceptor = std::thread::spawn(move || {
        let ctx = Context::new(Progress::Caller).expect("context");
        side(ctx, size, crc, |init| {
            l.accept_qp(init, &[], Some(LIMIT)).expect("accept")
        })
    });
    let ctx = Context::new(Progress::Caller).expect("context");
    let a = side(ctx, size, crc, |init| connect(addr, init).expect("connect"));
    (a, acceptor.join().expect("acceptor"))
}

/// One hop a -> b: a posts an unsignaled Send (a ping-pong's sender needs
/// no completion for it; the SQ entry retires when it is written), or an
/// unsignaled RDMA Write into b's buffer and a zero-byte Send behind it;
/// b polls until its receive completes and reposts the buffer.
fn hop(a: &Side, b: &Side, op: Op, size: usize, wcs: &mut [Wc]) {
    let send = |sgl| SendWr {
        wr_id: 100,
        op: SendOp::Send {
            solicited: false,
            invalidate: None,
        },
        sgl,
        signaled: false,
    };
    match op {
        Op::Send => {
            a.qp.post_send(send(a.buf.sge(size, size as u32).into()))
                .expect("post_send");
        }
        Op::Write => {
            let write = SendWr {
                wr_id: 101,
                op: SendOp::Write {
                    remote_addr: b.buf.addr(),
                    rkey: b.buf.rkey(),
                },
                sgl: a.buf.sge(size, size as u32).into(),
                signaled: false,
            };
            a.qp.post_send_batch([write, send(Sgl::new())])
                .expect("post_send_batch");
        }
    }
    // The data is already in b's socket (loopback delivers inside the
    // sender's system call): the first poll finds it. The clock is read
    // only if it does not, so the harness adds no clock read per hop.
    let mut deadline = None;
    loop {
        let n = b.cq.poll(wcs);
        if n > 0 {
            for wc in &wcs[..n] {
                assert!(wc.is_ok(), "failed completion {wc:?}");
                b.qp.post_recv(RecvWr {
                    wr_id: wc.wr_id,
                    sgl: b.buf.sge(size, size as u32).into(),
                })
                .expect("post_recv");
            }
            return;
        }
        let now = Instant::now();
        assert!(
            now < *deadline.get_or_insert(now + LIMIT),
            "no receive completion"
        );
    }
}

fn tcp_pair() -> (TcpStream, TcpStream) {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let a = TcpStream::connect(l.local_addr().expect("addr")).expect("connect");
    let (b, _) = l.accept().expect("accept");
    for s in [&a, &b] {
        s.set_nodelay(true).expect("nodelay");
    }
    (a, b)
}

/// This thread's (user, system) CPU time in ns.
fn cpu_ns() -> (f64, f64) {
    // SAFETY: getrusage writes one rusage into the zeroed value we own.
    let ru = unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_THREAD, &mut ru);
        ru
    };
    let ns = |t: libc::timeval| t.tv_sec as f64 * 1e9 + t.tv_usec as f64 * 1e3;
    (ns(ru.ru_utime), ns(ru.ru_stime))
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Argument `i` (ROUNDS, HOPS_PER_ROUND, SIZE), `default` if absent; a bad
/// value ends the program naming it and the allowed range.
fn arg(i: usize, name: &str, default: usize, range: std::ops::RangeInclusive<usize>) -> usize {
    let Some(text) = std::env::args().nth(i + 1) else {
        return default;
    };
    match text.parse::<usize>() {
        Ok(v) if range.contains(&v) => v,
        _ => {
            eprintln!(
                "hop: {name} must be a whole number in {}..={}, got {text:?}",
                range.start(),
                range.end()
            );
            std::process::exit(2);
        }
    }
}

/// Argument `i`, one of `choices` (the first if absent); a bad value ends
/// the program naming it and the allowed values.
fn choice(i: usize, name: &str, choices: &[&'static str]) -> &'static str {
    let Some(text) = std::env::args().nth(i + 1) else {
        return choices[0];
    };
    match choices.iter().find(|c| **c == text) {
        Some(c) => c,
        None => {
            eprintln!("hop: {name} must be one of {choices:?}, got {text:?}");
            std::process::exit(2);
        }
    }
}

fn main() {
    let rounds = arg(0, "ROUNDS", 15, 1..=1000);
    let hops = arg(1, "HOPS_PER_ROUND", 20_000, 2..=10_000_000);
    let size = arg(2, "SIZE (bytes per message)", 8, 1..=4096);
    let op = match choice(3, "OP", &["send", "write"]) {
        "send" => Op::Send,
        _ => Op::Write,
    };
    let crc = choice(4, "CRC", &["off", "on"]) == "on";
    let (a, b) = pair(size, crc);
    let (mut ta, mut tb) = tcp_pair();
    let mut wcs = [Wc::default(); 16];
    let mut tbuf = vec![0u8; size];
    // Warm up both paths.
    for _ in 0..1000 {
        hop(&a, &b, op, size, &mut wcs);
        hop(&b, &a, op, size, &mut wcs);
        ta.write_all(&tbuf).expect("write");
        tb.read_exact(&mut tbuf).expect("read");
    }
    let n = (hops / 2 * 2) as f64;
    // Per round and path: wall, user and system ns per hop.
    let mut tcp: [Vec<f64>; 3] = Default::default();
    let mut ws: [Vec<f64>; 3] = Default::default();
    let record = |into: &mut [Vec<f64>; 3], t: Instant, c0: (f64, f64)| {
        let c1 = cpu_ns();
        into[0].push(t.elapsed().as_nanos() as f64 / n);
        into[1].push((c1.0 - c0.0) / n);
        into[2].push((c1.1 - c0.1) / n);
    };
    for _ in 0..rounds {
        let (c0, t) = (cpu_ns(), Instant::now());
        for _ in 0..hops / 2 {
            ta.write_all(&tbuf).expect("write");
            tb.read_exact(&mut tbuf).expect("read");
            tb.write_all(&tbuf).expect("write");
            ta.read_exact(&mut tbuf).expect("read");
        }
        record(&mut tcp, t, c0);
        let (c0, t) = (cpu_ns(), Instant::now());
        for _ in 0..hops / 2 {
            hop(&a, &b, op, size, &mut wcs);
            hop(&b, &a, op, size, &mut wcs);
        }
        record(&mut ws, t, c0);
    }
    // The overhead is the median of the per-round differences: a round's
    // two halves run back to back, so a slow phase of the machine hits
    // both.
    let mut diff: [Vec<f64>; 3] = Default::default();
    for k in 0..3 {
        diff[k] = ws[k].iter().zip(&tcp[k]).map(|(w, t)| w - t).collect();
    }
    let mut ratio: Vec<f64> = ws[0].iter().zip(&tcp[0]).map(|(w, t)| w / t).collect();
    let m = |v: &mut [Vec<f64>; 3]| [median(&mut v[0]), median(&mut v[1]), median(&mut v[2])];
    let (tcp, ws, diff) = (m(&mut tcp), m(&mut ws), m(&mut diff));
    let what = format!(
        "{}, CRC {}",
        if op == Op::Send { "Send" } else { "Write+Send" },
        if crc { "on" } else { "off" }
    );
    println!(
        "hop cost, {size} B, one thread, medians of {rounds} rounds x {hops} hops (ns per hop):\n\
         \x20 TCP write+read       {:6.0}  (user {:4.0}, system {:5.0})\n\
         \x20 warpsock {what:<14} {:6.0}  (user {:4.0}, system {:5.0})\n\
         \x20 overhead             {:6.0}  (user {:+4.0}, system {:+5.0}), {:.2}x",
        tcp[0],
        tcp[1],
        tcp[2],
        ws[0],
        ws[1],
        ws[2],
        diff[0],
        diff[1],
        diff[2],
        median(&mut ratio)
    );
}
