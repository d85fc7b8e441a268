//! Loopback bandwidth and latency of warpsock next to plain TCP, measured
//! by one program in one run, each test with a fresh server process.
//!
//! ```text
//! cargo run --release -p warpsock-engine --example bw -- [options]
//!   --gib N            data per bandwidth test (default 4)
//!   --iters N          ping-pong round trips per latency test (default 20000)
//!   --client-cpu N     pin the client process to CPU N
//!   --server-cpu N     pin each server process to CPU N
//!   --only NAME        run only tests whose name contains NAME
//!   --repeat N         run each test N times, report the median (default 3)
//!   --setups N         connections per setup-time test (default 500)
//! ```
//!
//! Bandwidth: 1 MiB messages (TCP: 1 MiB `write`s / `read`s), 64 MiB
//! batches, at most two batches unacknowledged. Latency: 8-byte ping-pong,
//! one-way time = round trip / 2 (median and mean; ratios use the median).
//! Connection setup: TCP connect + accept + one 8-byte exchange (request
//! and answer) next to warpsock connect + MPA exchange + an 8-byte Send
//! answered by an 8-byte Send (the initiator's Send completed and the
//! answer received), fresh connection each time, CRC off, P2P on (the
//! default), caller-driven; median and mean per connection.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use warpsock_engine::{
    connect, Access, Context, ContextOptions, Cq, Listener, Progress, Qp, QpInit, RecvWr, SendOp,
    SendWr, Wc,
};

const MIB: usize = 1 << 20;
const BATCH: usize = 64;
const LONG: Duration = Duration::from_secs(60);

fn pin(cpu: Option<usize>) {
    let Some(cpu) = cpu else { return };
    // SAFETY: a zeroed cpu_set_t is empty; CPU_SET and sched_setaffinity
    // only touch that local set.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set) != 0 {
            eprintln!("warning: cannot pin to CPU {cpu}");
        }
    }
}

fn wait_one(cq: &Cq) -> Wc {
    let mut wc = [Wc::default()];
    let n = cq.wait(&mut wc, LONG).expect("wait");
    assert_eq!(n, 1, "no completion within {LONG:?}");
    assert!(wc[0].is_ok(), "{:?}", wc[0]);
    wc[0]
}

fn ctx(busy: bool) -> Context {
    Context::with_options(ContextOptions {
        progress: Progress::Caller,
        busy_poll: if busy { LONG } else { Duration::ZERO },
        ..ContextOptions::default()
    })
    .expect("context")
}

fn send(wr_id: u64, sge: warpsock_engine::Sge) -> SendWr {
    SendWr {
        wr_id,
        op: SendOp::Send {
            solicited: false,
            invalidate: None,
        },
        sgl: sge.into(),
        signaled: true,
    }
}

// ---------------------------------------------------------------- servers

fn serve(kind: &str, crc: bool, busy: bool) {
    match kind {
        "tcp-setup" => {
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            println!("LISTEN {}", l.local_addr().unwrap());
            loop {
                let (mut s, _) = l.accept().unwrap();
                s.set_nodelay(true).unwrap();
                let mut b = [0u8; 8];
                if s.read_exact(&mut b).is_ok() {
                    let _ = s.write_all(&b);
                }
            }
        }
        "setup" => {
            let l = Listener::bind("127.0.0.1:0").unwrap();
            println!("LISTEN {}", l.local_addr().unwrap());
            let c = ctx(false);
            let pd = c.alloc_pd();
            let cq = c.create_cq(64).unwrap();
            let buf = pd.alloc(8, Access::LOCAL_WRITE | Access::LOCAL_READ);
            loop {
                let mut init = QpInit::new(&pd, &cq);
                init.recvs.push(RecvWr {
                    wr_id: 0,
                    sgl: buf.sge(0, 8).into(),
                });
                let Ok(qp) = l.accept_qp(&init, b"", None) else {
                    continue;
                };
                let mut wc = [Wc::default(); 4];
                let k = cq.wait(&mut wc[..1], LONG).unwrap();
                if k == 1 && wc[0].is_ok() {
                    let _ = qp.post_send(send(1, buf.sge(0, 8)));
                    // The answer is written before the QP is closed.
                    let _ = cq.wait(&mut wc[..1], LONG);
                }
                drop(qp);
                while cq.poll(&mut wc) > 0 {}
            }
        }
        "tcp-bw" | "tcp-lat" | "tcp-lat-busy" => {
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            println!("LISTEN {}", l.local_addr().unwrap());
            let (mut s, _) = l.accept().unwrap();
            s.set_nodelay(true).unwrap();
            if kind == "tcp-bw" {
                let mut buf = vec![0u8; MIB];
                let mut got = 0usize;
                let mut acked = 0usize;
                loop {
                    let n = s.read(&mut buf).unwrap();
                    if n == 0 {
                        return;
                    }
                    got += n;
                    while got - acked >= BATCH * MIB {
                        acked += BATCH * MIB;
                        s.write_all(&[1]).unwrap();
                    }
                }
            }
            if kind == "tcp-lat-busy" {
                s.set_nonblocking(true).unwrap();
            }
            let mut b = [0u8; 8];
            loop {
                if !read_exact_spin(&mut s, &mut b) {
                    return;
                }
                write_all_spin(&mut s, &b);
            }
        }
        _ => {
            let l = Listener::bind("127.0.0.1:0").unwrap();
            println!("LISTEN {}", l.local_addr().unwrap());
            let c = ctx(busy);
            let pd = c.alloc_pd();
            let cq = c.create_cq(4096).unwrap();
            if kind.ends_with("-bw") {
                let target = pd.alloc(MIB, Access::REMOTE_WRITE | Access::LOCAL_WRITE);
                let note = pd.alloc(8, Access::LOCAL_WRITE);
                let ack = pd.alloc(8, Access::LOCAL_READ);
                let mut init = QpInit::new(&pd, &cq);
                init.options.crc = crc;
                init.options.rq_depth = 4 * BATCH + 8;
                // Send test: 1 MiB receives (all into the same buffer) for
                // two batches and their notes; Write test: notes only.
                let per = if kind == "send-bw" { BATCH + 1 } else { 1 };
                for i in 0..2 * per {
                    init.recvs.push(recv_for(kind, i as u64, &target, &note));
                }
                let mut pdata = target.addr().to_be_bytes().to_vec();
                pdata.extend_from_slice(&target.rkey().to_be_bytes());
                let qp = l.accept_qp(&init, &pdata, None).unwrap();
                let mut n = 2 * per as u64;
                let mut wc = [Wc::default(); 256];
                loop {
                    let k = cq.wait(&mut wc, LONG).unwrap();
                    if k == 0 || qp.is_closed() {
                        return;
                    }
                    for w in &wc[..k] {
                        if !w.is_ok() {
                            return;
                        }
                        if w.opcode != warpsock_engine::WcOpcode::Recv {
                            continue;
                        }
                        let is_note = w.byte_len == 8;
                        let _ = qp.post_recv(recv_for_len(is_note, n, &target, &note));
                        n += 1;
                        if is_note {
                            let _ = qp.post_send(send(0, ack.sge(0, 8)));
                        }
                    }
                }
            } else {
                let buf = pd.alloc(8, Access::LOCAL_WRITE);
                let mut init = QpInit::new(&pd, &cq);
                init.options.crc = crc;
                init.recvs.push(RecvWr {
                    wr_id: 0,
                    sgl: buf.sge(0, 8).into(),
                });
                let qp = l.accept_qp(&init, b"", None).unwrap();
                let mut wc = [Wc::default(); 4];
                loop {
                    let k = cq.wait(&mut wc, LONG).unwrap();
                    if k == 0 || wc[..k].iter().any(|w| !w.is_ok()) {
                        return;
                    }
                    for w in &wc[..k] {
                        if w.opcode == warpsock_engine::WcOpcode::Recv {
                            let _ = qp.post_recv(RecvWr {
                                wr_id: 0,
                                sgl: buf.sge(0, 8).into(),
                            });
                            let mut s = send(1, buf.sge(0, 8));
                            s.signaled = false;
                            let _ = qp.post_send(s);
                        }
                    }
                }
            }
        }
    }
}

fn recv_for(
    kind: &str,
    i: u64,
    target: &warpsock_engine::Mr,
    note: &warpsock_engine::Mr,
) -> RecvWr {
    // Send test: every (BATCH+1)-th receive is for the note.
    let is_note = kind != "send-bw" || (i as usize % (BATCH + 1)) == BATCH;
    recv_for_len(is_note, i, target, note)
}

fn recv_for_len(
    is_note: bool,
    i: u64,
    target: &warpsock_engine::Mr,
    note: &warpsock_engine::Mr,
) -> RecvWr {
    RecvWr {
        wr_id: i,
        sgl: if is_note {
            note.sge(0, 8)
        } else {
            target.sge(0, MIB as u32)
        }
        .into(),
    }
}

fn read_exact_spin(s: &mut TcpStream, b: &mut [u8]) -> bool {
    let mut off = 0;
    while off < b.len() {
        match s.read(&mut b[off..]) {
            Ok(0) => return false,
            Ok(n) => off += n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => std::hint::spin_loop(),
            Err(_) => return false,
        }
    }
    true
}

fn write_all_spin(s: &mut TcpStream, b: &[u8]) {
    let mut off = 0;
    while off < b.len() {
        match s.write(&b[off..]) {
            Ok(n) => off += n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => std::hint::spin_loop(),
            Err(e) => panic!("{e}"),
        }
    }
}

// ---------------------------------------------------------------- clients

struct Server {
    child: std::process::Child,
    addr: SocketAddr,
}

impl Server {
    fn start(kind: &str, crc: bool, busy: bool, cpu: Option<usize>) -> Self {
        let mut cmd = Command::new(std::env::current_exe().unwrap());
        cmd.args(["--serve", kind])
            .arg(if crc { "crc" } else { "nocrc" })
            .arg(if busy { "busy" } else { "block" });
        if let Some(c) = cpu {
            cmd.args(["--server-cpu", &c.to_string()]);
        }
        let mut child = cmd.stdout(Stdio::piped()).spawn().unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let addr = line
            .trim()
            .strip_prefix("LISTEN ")
            .expect("server announces its address")
            .parse()
            .unwrap();
        Self { child, addr }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn tcp_bw(addr: SocketAddr, total: usize) -> f64 {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_nodelay(true).unwrap();
    let buf = vec![7u8; MIB];
    let batches = total / (BATCH * MIB);
    let t0 = Instant::now();
    let mut ack = [0u8; 1];
    for b in 0..batches {
        if b >= 2 {
            s.read_exact(&mut ack).unwrap();
        }
        for _ in 0..BATCH {
            s.write_all(&buf).unwrap();
        }
    }
    for _ in 0..batches.min(2) {
        s.read_exact(&mut ack).unwrap();
    }
    (batches * BATCH * MIB) as f64 / t0.elapsed().as_secs_f64() / 1e9
}

fn iwarp_bw(addr: SocketAddr, total: usize, crc: bool, write: bool) -> f64 {
    let c = ctx(false);
    let pd = c.alloc_pd();
    let cq = c.create_cq(4096).unwrap();
    let src = pd.alloc(MIB, Access::LOCAL_READ);
    let note = pd.alloc(8, Access::LOCAL_READ);
    let acks = pd.alloc(8, Access::LOCAL_WRITE);
    let mut init = QpInit::new(&pd, &cq);
    init.options.crc = crc;
    init.options.sq_depth = 4 * BATCH + 8;
    init.options.rq_depth = 64;
    for i in 0..8 {
        init.recvs.push(RecvWr {
            wr_id: 1_000_000 + i,
            sgl: acks.sge(0, 8).into(),
        });
    }
    let qp = connect(addr, &init).unwrap();
    let pdata = qp.negotiated().unwrap().peer_private_data;
    let t_addr = u64::from_be_bytes(pdata[..8].try_into().unwrap());
    let t_key = u32::from_be_bytes(pdata[8..12].try_into().unwrap());
    let batches = total / (BATCH * MIB);
    let t0 = Instant::now();
    let mut acked = 0;
    let mut wc = [Wc::default(); 256];
    let mut reap = |qp: &Qp, acked: &mut usize, want: usize| {
        while *acked < want {
            let k = cq.wait(&mut wc, LONG).unwrap();
            assert!(k > 0, "stalled");
            for w in &wc[..k] {
                assert!(w.is_ok(), "{w:?}");
                if w.opcode == warpsock_engine::WcOpcode::Recv {
                    *acked += 1;
                    qp.post_recv(RecvWr {
                        wr_id: w.wr_id,
                        sgl: acks.sge(0, 8).into(),
                    })
                    .unwrap();
                }
            }
        }
    };
    for b in 0..batches {
        if b >= 2 {
            reap(&qp, &mut acked, b - 1);
        }
        let wrs = (0..BATCH).map(|i| SendWr {
            wr_id: i as u64,
            op: if write {
                SendOp::Write {
                    remote_addr: t_addr,
                    rkey: t_key,
                }
            } else {
                SendOp::Send {
                    solicited: false,
                    invalidate: None,
                }
            },
            sgl: src.sge(0, MIB as u32).into(),
            signaled: i == BATCH - 1,
        });
        qp.post_send_batch(wrs.chain(std::iter::once(send(9, note.sge(0, 8)))))
            .unwrap();
    }
    reap(&qp, &mut acked, batches);
    (batches * BATCH * MIB) as f64 / t0.elapsed().as_secs_f64() / 1e9
}

/// Returns (mean, median) one-way latency in µs.
fn summarize(mut rtts: Vec<Duration>) -> (f64, f64) {
    rtts.sort();
    let mean = rtts.iter().sum::<Duration>().as_secs_f64() / rtts.len() as f64;
    let med = rtts[rtts.len() / 2].as_secs_f64();
    (mean / 2.0 * 1e6, med / 2.0 * 1e6)
}

fn tcp_lat(addr: SocketAddr, iters: usize, busy: bool) -> (f64, f64) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_nodelay(true).unwrap();
    if busy {
        s.set_nonblocking(true).unwrap();
    }
    let mut b = [0u8; 8];
    let mut rtts = Vec::with_capacity(iters);
    for i in 0..iters + iters / 10 {
        let t = Instant::now();
        write_all_spin(&mut s, &b);
        assert!(read_exact_spin(&mut s, &mut b));
        if i >= iters / 10 {
            rtts.push(t.elapsed());
        }
    }
    summarize(rtts)
}

fn iwarp_lat(addr: SocketAddr, iters: usize, crc: bool, busy: bool) -> (f64, f64) {
    let c = ctx(busy);
    let pd = c.alloc_pd();
    let cq = c.create_cq(64).unwrap();
    let buf = pd.alloc(8, Access::LOCAL_WRITE);
    let mut init = QpInit::new(&pd, &cq);
    init.options.crc = crc;
    init.recvs.push(RecvWr {
        wr_id: 0,
        sgl: buf.sge(0, 8).into(),
    });
    let qp = connect(addr, &init).unwrap();
    let mut rtts = Vec::with_capacity(iters);
    for i in 0..iters + iters / 10 {
        let t = Instant::now();
        let mut s = send(1, buf.sge(0, 8));
        s.signaled = false;
        qp.post_send(s).unwrap();
        let w = wait_one(&cq);
        assert_eq!(w.opcode, warpsock_engine::WcOpcode::Recv);
        qp.post_recv(RecvWr {
            wr_id: 0,
            sgl: buf.sge(0, 8).into(),
        })
        .unwrap();
        if i >= iters / 10 {
            rtts.push(t.elapsed());
        }
    }
    summarize(rtts)
}

/// Returns (mean, median) per connection in µs.
fn tcp_setup(addr: SocketAddr, n: usize) -> (f64, f64) {
    let mut t = Vec::with_capacity(n);
    for i in 0..n + n / 10 {
        let t0 = Instant::now();
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_nodelay(true).unwrap();
        let mut b = [7u8; 8];
        s.write_all(&b).unwrap();
        s.read_exact(&mut b).unwrap();
        let dt = t0.elapsed();
        if i >= n / 10 {
            t.push(dt);
        }
    }
    setup_summary(t)
}

fn iwarp_setup(addr: SocketAddr, n: usize) -> (f64, f64) {
    let c = ctx(false);
    let pd = c.alloc_pd();
    let cq = c.create_cq(64).unwrap();
    let msg = pd.register(vec![7; 8], Access::LOCAL_READ);
    let ans = pd.alloc(8, Access::LOCAL_WRITE);
    let mut t = Vec::with_capacity(n);
    for i in 0..n + n / 10 {
        let t0 = Instant::now();
        let mut init = QpInit::new(&pd, &cq);
        init.recvs.push(RecvWr {
            wr_id: 0,
            sgl: ans.sge(0, 8).into(),
        });
        let qp = connect(addr, &init).unwrap();
        qp.post_send(send(1, msg.sge(0, 8))).unwrap();
        // The Send's completion and the answer's receive.
        wait_one(&cq);
        wait_one(&cq);
        let dt = t0.elapsed();
        drop(qp);
        if i >= n / 10 {
            t.push(dt);
        }
    }
    setup_summary(t)
}

fn setup_summary(mut t: Vec<Duration>) -> (f64, f64) {
    t.sort();
    let mean = t.iter().sum::<Duration>().as_secs_f64() / t.len() as f64;
    (mean * 1e6, t[t.len() / 2].as_secs_f64() * 1e6)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let opt = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1).cloned())
    };
    let server_cpu = opt("--server-cpu").map(|v| v.parse().expect("--server-cpu N"));
    if let Some(kind) = opt("--serve") {
        pin(server_cpu);
        let i = args.iter().position(|a| a == "--serve").unwrap();
        serve(&kind, args[i + 2] == "crc", args[i + 3] == "busy");
        return;
    }
    let client_cpu = opt("--client-cpu").map(|v| v.parse().expect("--client-cpu N"));
    pin(client_cpu);
    let total = opt("--gib").map_or(4.0, |v| v.parse::<f64>().expect("--gib N"));
    let total = ((total * 1024.0) as usize / BATCH).max(1) * BATCH * MIB;
    let iters = opt("--iters").map_or(20_000, |v| v.parse().expect("--iters N"));
    let only = opt("--only").unwrap_or_default();
    let repeat: usize = opt("--repeat").map_or(3, |v| v.parse().expect("--repeat N"));
    let setups: usize = opt("--setups").map_or(500, |v| v.parse().expect("--setups N"));
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let run = |name: &str| name.contains(&only);

    println!(
        "# loopback, client cpu {:?}, server cpu {:?}, {} MiB per bandwidth test, {iters} round trips per latency test",
        client_cpu,
        server_cpu,
        total / MIB
    );
    let bw_tests: Vec<(&str, &str, bool, bool)> = [
        ("tcp 1 MiB write/read", "tcp-bw", false, false),
        ("warpsock RDMA Write, CRC off", "write-bw", false, true),
        ("warpsock RDMA Write, CRC on", "write-bw", true, true),
        ("warpsock Send, CRC off", "send-bw", false, false),
        ("warpsock Send, CRC on", "send-bw", true, false),
    ]
    .into_iter()
    .filter(|t| run(t.0))
    .collect();
    let lat_tests: Vec<(&str, &str, bool, bool)> = [
        ("tcp blocking", "tcp-lat", false, false),
        ("tcp busy-poll", "tcp-lat-busy", false, true),
        ("warpsock Send, blocking wait", "send-lat", false, false),
        ("warpsock Send, busy-poll", "send-lat", false, true),
        ("warpsock Send, busy-poll, CRC on", "send-lat", true, true),
        ("warpsock Send, blocking, CRC on", "send-lat", true, false),
    ]
    .into_iter()
    .filter(|t| run(t.0))
    .collect();
    let setup_tests: Vec<(&str, &str)> = [
        ("tcp connect + 8 B exchange", "tcp-setup"),
        ("warpsock connect + MPA + 8 B Send", "setup"),
    ]
    .into_iter()
    .filter(|t| run(t.0))
    .collect();
    // Rounds interleave the tests, so a burst of background load hits
    // every test alike; each figure is the median over the rounds.
    let mut bw: Vec<Vec<f64>> = vec![Vec::new(); bw_tests.len()];
    let mut lat: Vec<(Vec<f64>, Vec<f64>)> = vec![(Vec::new(), Vec::new()); lat_tests.len()];
    let mut setup: Vec<(Vec<f64>, Vec<f64>)> = vec![(Vec::new(), Vec::new()); setup_tests.len()];
    for _ in 0..repeat.max(1) {
        for (i, &(_, kind, crc, write)) in bw_tests.iter().enumerate() {
            let srv = Server::start(kind, crc, false, server_cpu);
            bw[i].push(if kind == "tcp-bw" {
                tcp_bw(srv.addr, total)
            } else {
                iwarp_bw(srv.addr, total, crc, write)
            });
        }
        for (i, &(_, kind, crc, busy)) in lat_tests.iter().enumerate() {
            let srv = Server::start(kind, crc, busy, server_cpu);
            let (mean, med) = if kind.starts_with("tcp") {
                tcp_lat(srv.addr, iters, busy)
            } else {
                iwarp_lat(srv.addr, iters, crc, busy)
            };
            lat[i].0.push(mean);
            lat[i].1.push(med);
        }
        for (i, &(_, kind)) in setup_tests.iter().enumerate() {
            let srv = Server::start(kind, false, false, server_cpu);
            let (mean, med) = if kind == "tcp-setup" {
                tcp_setup(srv.addr, setups)
            } else {
                iwarp_setup(srv.addr, setups)
            };
            setup[i].0.push(mean);
            setup[i].1.push(med);
        }
    }
    println!(
        "{:<34} {:>10} {:>8}   runs",
        "bandwidth (1 MiB messages)", "GB/s", "x TCP"
    );
    let mut tcp_gbs = None;
    for (i, &(name, kind, _, _)) in bw_tests.iter().enumerate() {
        let gbs = median(bw[i].clone());
        if kind == "tcp-bw" {
            tcp_gbs = Some(gbs);
        }
        let ratio = tcp_gbs.map_or("-".into(), |t| format!("{:.2}", gbs / t));
        let runs: Vec<String> = bw[i].iter().map(|v| format!("{v:.2}")).collect();
        println!("{name:<34} {gbs:>10.2} {ratio:>8}   {}", runs.join(" "));
    }
    println!(
        "{:<34} {:>10} {:>8} {:>8}",
        "latency (8 B ping-pong, one-way)", "median µs", "mean", "x TCP"
    );
    let mut tcp_us = None;
    for (i, &(name, kind, _, _)) in lat_tests.iter().enumerate() {
        let (mean, med) = (median(lat[i].0.clone()), median(lat[i].1.clone()));
        if kind == "tcp-lat" {
            tcp_us = Some(med);
        }
        let ratio = tcp_us.map_or("-".into(), |t| format!("{:.2}", med / t));
        println!("{name:<34} {med:>10.2} {mean:>8.2} {ratio:>8}");
    }
    if !setup_tests.is_empty() {
        println!(
            "{:<34} {:>10} {:>8} {:>8}",
            "connection setup", "median µs", "mean", "x TCP"
        );
    }
    let mut tcp_setup_us = None;
    for (i, &(name, kind)) in setup_tests.iter().enumerate() {
        let (mean, med) = (median(setup[i].0.clone()), median(setup[i].1.clone()));
        if kind == "tcp-setup" {
            tcp_setup_us = Some(med);
        }
        let ratio = tcp_setup_us.map_or("-".into(), |t| format!("{:.2}", med / t));
        println!("{name:<34} {med:>10.2} {mean:>8.2} {ratio:>8}");
    }
}
