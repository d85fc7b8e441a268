//! Every operation (Send, RDMA Write, RDMA Read) between two hosts, CRC
//! on, verified by CRC32c checksums on both sides. Used by
//! `scripts/test-netns.sh` between two network namespaces.
//!
//! ```text
//! ops server BIND_ADDR [ROUNDS]   # prints "LISTEN <addr>", serves one client
//! ops client SERVER_ADDR [ROUNDS] # exits 0 iff every check passed on both sides
//! ops stream-server BIND_ADDR     # a Write target that never answers
//! ops stream-client SERVER_ADDR USER_TIMEOUT_MS
//! ```
//!
//! The server exposes a Write target and a Read source (address, rkey and
//! the source's checksum in its MPA private data) and posts receives. Each
//! of ROUNDS rounds (default 1) the client Sends 1 MiB, Writes 4 MiB and
//! Reads 5 MiB (checking the Read's checksum), each round with new bytes,
//! then Sends the checksums of what it sent and wrote; the server checks
//! both and answers with a one-byte verdict. A round moves 5 MiB each way.
//!
//! `stream-client` streams RDMA Writes at a `stream-server` until the
//! connection fails (the test kills the server and drops its traffic),
//! then checks that every posted request completed exactly once — the
//! ones in flight with a flush error — and prints how long after the last
//! success the failure was detected and its cause. Its TCP user timeout
//! is USER_TIMEOUT_MS and its keepalive probes start after 1 s.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use warpsock_engine::proto::wire::crc::crc32c;
use warpsock_engine::{
    connect, Access, Context, Cq, Listener, Progress, QpInit, RecvWr, SendOp, SendWr, Sge, Wc,
};

const SEND_LEN: usize = 1 << 20;
const WRITE_LEN: usize = 4 << 20;
const READ_LEN: usize = 5 << 20;
const LIMIT: Duration = Duration::from_secs(60);

fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        s ^= s >> 12;
        s ^= s << 25;
        s ^= s >> 27;
        out.extend_from_slice(&s.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes());
    }
    out.truncate(len);
    out
}

/// Waits for `n` completions (bounded); all must succeed.
fn wait_n(cq: &Cq, n: usize) -> Result<Vec<Wc>, String> {
    let deadline = Instant::now() + LIMIT;
    let mut got = Vec::new();
    let mut buf = [Wc::default(); 8];
    while got.len() < n {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(format!("timed out with {}/{n} completions", got.len()));
        }
        let k = cq
            .wait(&mut buf[..(n - got.len()).min(8)], left)
            .map_err(|e| e.to_string())?;
        got.extend_from_slice(&buf[..k]);
    }
    match got.iter().find(|w| !w.is_ok()) {
        Some(w) => Err(format!("failed completion: {w:?}")),
        None => Ok(got),
    }
}

fn send(wr_id: u64, sge: Sge) -> SendWr {
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

fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes(b[..4].try_into().unwrap())
}

/// Bytes of round `round` for stream `what` (1 Send, 2 Write).
fn round_pattern(len: usize, round: u64, what: u64) -> Vec<u8> {
    pattern(len, round * 4 + what)
}

fn server(bind: &str, rounds: u64) -> Result<String, String> {
    let l = Listener::bind(bind).map_err(|e| format!("bind {bind}: {e}"))?;
    println!("LISTEN {}", l.local_addr().unwrap());
    let c = Context::new(Progress::Thread).map_err(|e| e.to_string())?;
    let pd = c.alloc_pd();
    let cq = c.create_cq(16).map_err(|e| e.to_string())?;
    let target = pd.alloc(WRITE_LEN, Access::REMOTE_WRITE);
    let source = pd.register(pattern(READ_LEN, 3), Access::REMOTE_READ);
    let rbuf = pd.alloc(SEND_LEN, Access::LOCAL_WRITE);
    let sums = pd.alloc(8, Access::LOCAL_WRITE);
    let verdict = pd.alloc(1, Access::LOCAL_READ);
    let recvs = [
        RecvWr {
            wr_id: 0,
            sgl: rbuf.sge(0, SEND_LEN as u32).into(),
        },
        RecvWr {
            wr_id: 1,
            sgl: sums.sge(0, 8).into(),
        },
    ];
    let mut init = QpInit::new(&pd, &cq);
    init.options.crc = true;
    init.recvs = recvs.to_vec();
    let mut pdata = Vec::new();
    for m in [&target, &source] {
        pdata.extend_from_slice(&m.addr().to_be_bytes());
        pdata.extend_from_slice(&m.rkey().to_be_bytes());
    }
    pdata.extend_from_slice(&source.with_bytes(crc32c).to_be_bytes());
    let qp = l
        .accept_qp(&init, &pdata, Some(LIMIT))
        .map_err(|e| format!("accept: {e}"))?;
    let (mut send_sum, mut write_sum) = (0, 0);
    for round in 0..rounds {
        let got = wait_n(&cq, 2)?;
        let send_len = got.iter().find(|w| w.wr_id == 0).unwrap().byte_len as usize;
        let s = sums.to_vec();
        send_sum = rbuf.with_bytes(|b| crc32c(&b[..send_len]));
        write_sum = target.with_bytes(crc32c);
        let ok = send_len == SEND_LEN && send_sum == be32(&s[..4]) && write_sum == be32(&s[4..]);
        if !ok {
            return Err(format!(
                "round {round}: Send {send_len} B crc {send_sum:08x} / Write crc {write_sum:08x} do not match the client's {:08x} / {:08x}",
                be32(&s[..4]),
                be32(&s[4..])
            ));
        }
        if round + 1 < rounds {
            for r in &recvs {
                qp.post_recv(r.clone()).map_err(|e| e.to_string())?;
            }
        }
        verdict.write(0, &[1]);
        qp.post_send(send(2, verdict.sge(0, 1)))
            .map_err(|e| e.to_string())?;
        wait_n(&cq, 1)?;
    }
    // Stay until the client has the verdict and disconnects.
    let deadline = Instant::now() + LIMIT;
    while !qp.is_closed() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    Ok(format!(
        "server: {rounds} round(s); last: Send {SEND_LEN} B crc32c {send_sum:08x}, Write {WRITE_LEN} B crc32c {write_sum:08x}: match"
    ))
}

fn client(addr: &str, rounds: u64) -> Result<String, String> {
    let c = Context::new(Progress::Caller).map_err(|e| e.to_string())?;
    let pd = c.alloc_pd();
    let cq = c.create_cq(16).map_err(|e| e.to_string())?;
    let sdata = pd.alloc(SEND_LEN, Access::LOCAL_READ);
    let wdata = pd.alloc(WRITE_LEN, Access::LOCAL_READ);
    let sink = pd.alloc(READ_LEN, Access::LOCAL_WRITE);
    let sums = pd.alloc(8, Access::LOCAL_READ);
    let verdict = pd.alloc(1, Access::LOCAL_WRITE);
    let verdict_recv = RecvWr {
        wr_id: 9,
        sgl: verdict.sge(0, 1).into(),
    };
    let mut init = QpInit::new(&pd, &cq);
    init.options.crc = true;
    init.recvs.push(verdict_recv.clone());
    let qp = connect(addr, &init).map_err(|e| format!("connect {addr}: {e}"))?;
    let neg = qp.negotiated().unwrap();
    if !neg.crc {
        return Err("CRC not negotiated".into());
    }
    let p = &neg.peer_private_data;
    if p.len() != 28 {
        return Err(format!("unexpected private data: {p:?}"));
    }
    let t_addr = u64::from_be_bytes(p[..8].try_into().unwrap());
    let t_key = be32(&p[8..]);
    let r_addr = u64::from_be_bytes(p[12..20].try_into().unwrap());
    let r_key = be32(&p[20..]);
    let r_sum = be32(&p[24..]);
    let t0 = Instant::now();
    let (mut send_sum, mut write_sum, mut read_sum) = (0, 0, 0);
    for round in 0..rounds {
        // New bytes every round (a Write or Send that did not land leaves
        // the last round's there, which no longer matches); the Read sink
        // is cleared so a Read that did not land is seen.
        sdata.write(0, &round_pattern(SEND_LEN, round, 1));
        wdata.write(0, &round_pattern(WRITE_LEN, round, 2));
        sink.with_bytes_mut(|b| b.fill(0));
        let ops = [
            send(1, sdata.sge(0, SEND_LEN as u32)),
            SendWr {
                wr_id: 2,
                op: SendOp::Write {
                    remote_addr: t_addr,
                    rkey: t_key,
                },
                sgl: wdata.sge(0, WRITE_LEN as u32).into(),
                signaled: true,
            },
            SendWr {
                wr_id: 3,
                op: SendOp::Read {
                    remote_addr: r_addr,
                    rkey: r_key,
                },
                sgl: sink.sge(0, READ_LEN as u32).into(),
                signaled: true,
            },
        ];
        qp.post_send_batch(ops).map_err(|e| e.to_string())?;
        wait_n(&cq, 3)?;
        read_sum = sink.with_bytes(crc32c);
        if read_sum != r_sum {
            return Err(format!(
                "round {round}: Read crc32c {read_sum:08x}, server's source {r_sum:08x}"
            ));
        }
        send_sum = sdata.with_bytes(crc32c);
        write_sum = wdata.with_bytes(crc32c);
        let mut s = send_sum.to_be_bytes().to_vec();
        s.extend_from_slice(&write_sum.to_be_bytes());
        sums.write(0, &s);
        verdict.write(0, &[0]);
        qp.post_send(send(4, sums.sge(0, 8)))
            .map_err(|e| e.to_string())?;
        wait_n(&cq, 2)?;
        if verdict.to_vec() != [1] {
            return Err(format!(
                "round {round}: the server's checksums do not match"
            ));
        }
        if round + 1 < rounds {
            qp.post_recv(verdict_recv.clone())
                .map_err(|e| e.to_string())?;
        }
    }
    let secs = t0.elapsed().as_secs_f64();
    qp.disconnect();
    let mib = rounds * 5;
    Ok(format!(
        "client {} -> {}: {rounds} round(s), {mib} MiB each way in {secs:.1} s; last: Send {SEND_LEN} B crc32c {send_sum:08x}, Write {WRITE_LEN} B crc32c {write_sum:08x}, Read {READ_LEN} B crc32c {read_sum:08x}; CRC on; all verified",
        qp.local_addr(),
        qp.peer_addr()
    ))
}

/// A Write target that accepts one connection and then only receives.
fn stream_server(bind: &str) -> Result<String, String> {
    let l = Listener::bind(bind).map_err(|e| format!("bind {bind}: {e}"))?;
    println!("LISTEN {}", l.local_addr().unwrap());
    let c = Context::new(Progress::Thread).map_err(|e| e.to_string())?;
    let pd = c.alloc_pd();
    let cq = c.create_cq(16).map_err(|e| e.to_string())?;
    let target = pd.alloc(STREAM_LEN, Access::REMOTE_WRITE);
    let mut pdata = target.addr().to_be_bytes().to_vec();
    pdata.extend_from_slice(&target.rkey().to_be_bytes());
    let qp = l
        .accept_qp(&QpInit::new(&pd, &cq), &pdata, Some(LIMIT))
        .map_err(|e| format!("accept: {e}"))?;
    // Until the test kills this process.
    let deadline = Instant::now() + 10 * LIMIT;
    while !qp.is_closed() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    Err("the stream ended before the server was killed".into())
}

/// Bytes of each streamed Write.
const STREAM_LEN: usize = 256 << 10;
/// Writes kept outstanding while streaming.
const STREAM_DEPTH: u64 = 16;

/// Streams Writes until the connection fails; checks that every request
/// completes exactly once and reports how the failure was detected.
fn stream_client(addr: &str, user_timeout_ms: u64) -> Result<String, String> {
    let c = Context::new(Progress::Caller).map_err(|e| e.to_string())?;
    let pd = c.alloc_pd();
    let cq = c.create_cq(64).map_err(|e| e.to_string())?;
    let src = pd.register(pattern(STREAM_LEN, 9), Access::LOCAL_READ);
    let mut init = QpInit::new(&pd, &cq);
    init.options.tcp.user_timeout = Duration::from_millis(user_timeout_ms);
    init.options.tcp.keepalive_idle = Duration::from_secs(1);
    init.options.tcp.keepalive_interval = Duration::from_secs(1);
    init.options.tcp.keepalive_count = 2;
    let qp = connect(addr, &init).map_err(|e| format!("connect {addr}: {e}"))?;
    let p = qp.negotiated().unwrap().peer_private_data;
    let (t_addr, t_key) = (
        u64::from_be_bytes(p[..8].try_into().unwrap()),
        be32(&p[8..]),
    );
    let write = |wr_id| SendWr {
        wr_id,
        op: SendOp::Write {
            remote_addr: t_addr,
            rkey: t_key,
        },
        sgl: src.sge(0, STREAM_LEN as u32).into(),
        signaled: true,
    };
    let mut posted = 0u64;
    let mut done = std::collections::HashMap::<u64, Wc>::new();
    let mut last_ok = Instant::now();
    let mut first_error: Option<Instant> = None;
    let mut announced = false;
    let deadline = Instant::now() + 10 * LIMIT;
    let mut wcs = [Wc::default(); 32];
    loop {
        if Instant::now() > deadline {
            return Err(format!(
                "{} of {posted} requests completed in time",
                done.len()
            ));
        }
        while first_error.is_none() && posted - done.len() as u64 <= STREAM_DEPTH {
            qp.post_send(write(posted)).map_err(|e| e.to_string())?;
            posted += 1;
        }
        let n = cq
            .wait(&mut wcs, Duration::from_millis(100))
            .map_err(|e| e.to_string())?;
        for w in &wcs[..n] {
            if done.insert(w.wr_id, *w).is_some() {
                return Err(format!("request {} completed twice", w.wr_id));
            }
            if w.is_ok() {
                last_ok = Instant::now();
            } else if first_error.is_none() {
                first_error = Some(Instant::now());
            }
        }
        if !announced && done.len() >= 64 {
            // The test kills the server once it sees this.
            println!("STREAMING");
            announced = true;
        }
        if first_error.is_some() && done.len() as u64 == posted {
            break;
        }
    }
    let detected = first_error.unwrap().duration_since(last_ok);
    let failed: Vec<&Wc> = done.values().filter(|w| !w.is_ok()).collect();
    let cause = qp.close_reason();
    if failed.iter().any(|w| w.cause != cause) {
        return Err("failed completions disagree on the cause".into());
    }
    let cause = cause.map_or("unknown".to_string(), |c| c.to_string());
    Ok(format!(
        "FLUSHED {} of {posted} requests, each completed once; failure detected {} ms after the last success; cause: {cause}",
        failed.len(),
        detected.as_millis()
    ))
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let rounds = |i: usize| -> Result<u64, String> {
        args.get(i).map_or(Ok(1), |r| {
            r.parse().map_err(|_| format!("bad ROUNDS {r:?}"))
        })
    };
    let res = match (args.get(1).map(String::as_str), args.get(2)) {
        (Some("server"), Some(a)) => rounds(3).and_then(|r| server(a, r)),
        (Some("client"), Some(a)) => rounds(3).and_then(|r| client(a, r)),
        (Some("stream-server"), Some(a)) => stream_server(a),
        (Some("stream-client"), Some(a)) => match args.get(3).and_then(|t| t.parse().ok()) {
            Some(t) => stream_client(a, t),
            None => Err("stream-client needs USER_TIMEOUT_MS".into()),
        },
        _ => Err("usage: ops server BIND_ADDR [ROUNDS] | ops client SERVER_ADDR [ROUNDS] | ops stream-server BIND_ADDR | ops stream-client SERVER_ADDR USER_TIMEOUT_MS".into()),
    };
    match res {
        Ok(msg) => {
            println!("{msg}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("ops: {e}");
            ExitCode::FAILURE
        }
    }
}
