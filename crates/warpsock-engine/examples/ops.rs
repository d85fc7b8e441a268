//! Every operation (Send, RDMA Write, RDMA Read) between two hosts, CRC
//! on, verified by CRC32c checksums on both sides. Used by
//! `scripts/test-netns.sh` between two network namespaces.
//!
//! ```text
//! ops server BIND_ADDR     # prints "LISTEN <addr>", serves one client
//! ops client SERVER_ADDR   # exits 0 iff every check passed on both sides
//! ```
//!
//! The server exposes a Write target and a Read source (address, rkey and
//! the source's checksum in its MPA private data) and posts receives. The
//! client Sends 1 MiB, Writes 4 MiB, Reads 4 MiB (checking the Read's
//! checksum), then Sends the checksums of what it sent and wrote; the
//! server checks both and answers with a one-byte verdict.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use warpsock_engine::proto::wire::crc::crc32c;
use warpsock_engine::{
    connect, Access, Context, Cq, Listener, Progress, QpInit, RecvWr, SendOp, SendWr, Sge, Wc,
};

const SEND_LEN: usize = 1 << 20;
const WRITE_LEN: usize = 4 << 20;
const READ_LEN: usize = 4 << 20;
const LIMIT: Duration = Duration::from_secs(30);

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

fn server(bind: &str) -> Result<String, String> {
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
    let mut init = QpInit::new(&pd, &cq);
    init.options.crc = true;
    init.recvs = vec![
        RecvWr {
            wr_id: 0,
            sgl: rbuf.sge(0, SEND_LEN as u32).into(),
        },
        RecvWr {
            wr_id: 1,
            sgl: sums.sge(0, 8).into(),
        },
    ];
    let mut pdata = Vec::new();
    for m in [&target, &source] {
        pdata.extend_from_slice(&m.addr().to_be_bytes());
        pdata.extend_from_slice(&m.rkey().to_be_bytes());
    }
    pdata.extend_from_slice(&source.with_bytes(crc32c).to_be_bytes());
    let qp = l
        .accept_qp(&init, &pdata, Some(LIMIT))
        .map_err(|e| format!("accept: {e}"))?;
    let got = wait_n(&cq, 2)?;
    let send_len = got.iter().find(|w| w.wr_id == 0).unwrap().byte_len as usize;
    let s = sums.to_vec();
    let send_sum = rbuf.with_bytes(|b| crc32c(&b[..send_len]));
    let write_sum = target.with_bytes(crc32c);
    let ok = send_len == SEND_LEN && send_sum == be32(&s[..4]) && write_sum == be32(&s[4..]);
    verdict.write(0, &[u8::from(ok)]);
    qp.post_send(send(2, verdict.sge(0, 1)))
        .map_err(|e| e.to_string())?;
    wait_n(&cq, 1)?;
    // Stay until the client has the verdict and disconnects.
    let deadline = Instant::now() + LIMIT;
    while !qp.is_closed() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    if !ok {
        return Err(format!(
            "Send {send_len} B crc {send_sum:08x} / Write crc {write_sum:08x} do not match the client's {:08x} / {:08x}",
            be32(&s[..4]),
            be32(&s[4..])
        ));
    }
    Ok(format!(
        "server: Send {send_len} B crc32c {send_sum:08x}, Write {WRITE_LEN} B crc32c {write_sum:08x}: match"
    ))
}

fn client(addr: &str) -> Result<String, String> {
    let c = Context::new(Progress::Caller).map_err(|e| e.to_string())?;
    let pd = c.alloc_pd();
    let cq = c.create_cq(16).map_err(|e| e.to_string())?;
    let sdata = pd.register(pattern(SEND_LEN, 1), Access::LOCAL_READ);
    let wdata = pd.register(pattern(WRITE_LEN, 2), Access::LOCAL_READ);
    let sink = pd.alloc(READ_LEN, Access::LOCAL_WRITE);
    let sums = pd.alloc(8, Access::LOCAL_READ);
    let verdict = pd.alloc(1, Access::LOCAL_WRITE);
    let mut init = QpInit::new(&pd, &cq);
    init.options.crc = true;
    init.recvs.push(RecvWr {
        wr_id: 9,
        sgl: verdict.sge(0, 1).into(),
    });
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
    let read_sum = sink.with_bytes(crc32c);
    if read_sum != r_sum {
        return Err(format!(
            "Read crc32c {read_sum:08x}, server's source {r_sum:08x}"
        ));
    }
    let send_sum = sdata.with_bytes(crc32c);
    let write_sum = wdata.with_bytes(crc32c);
    let mut s = send_sum.to_be_bytes().to_vec();
    s.extend_from_slice(&write_sum.to_be_bytes());
    sums.write(0, &s);
    qp.post_send(send(4, sums.sge(0, 8)))
        .map_err(|e| e.to_string())?;
    wait_n(&cq, 2)?;
    if verdict.to_vec() != [1] {
        return Err("the server's checksums do not match".into());
    }
    qp.disconnect();
    Ok(format!(
        "client {} -> {}: Send {SEND_LEN} B crc32c {send_sum:08x}, Write {WRITE_LEN} B crc32c {write_sum:08x}, Read {READ_LEN} B crc32c {read_sum:08x}; CRC on; all verified",
        qp.local_addr(),
        qp.peer_addr()
    ))
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let res = match (args.get(1).map(String::as_str), args.get(2)) {
        (Some("server"), Some(a)) => server(a),
        (Some("client"), Some(a)) => client(a),
        _ => Err("usage: ops server BIND_ADDR | ops client SERVER_ADDR".into()),
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
