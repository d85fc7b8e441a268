//! Adopting a TCP connection that is already open: the application uses it
//! as a plain byte stream first, then both ends run MPA on the same stream
//! (`connect_stream` / `ConnectRequest::read`) and carry RDMA traffic on it.

mod common;

use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::time::Duration;

use common::{pattern, wait_n, LIMIT};
use warpsock_engine::{
    connect_stream, Access, CmError, ConnectRequest, Context, Progress, QpInit, RecvWr, SendOp,
    SendWr, Wc,
};

fn send_wr(wr_id: u64, sge: warpsock_engine::Sge) -> SendWr {
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

/// Plain bytes both ways, then MPA and a Send each way on the same
/// connection; the plain bytes are read exactly, so the MPA frames are
/// the next bytes on each side.
#[test]
fn mpa_on_a_connection_that_carried_plain_bytes() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let greeting = pattern(10_000, 1);
    let reply = pattern(777, 2);
    let (g2, r2) = (greeting.clone(), reply.clone());
    let server = std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        let mut got = vec![0; g2.len()];
        s.read_exact(&mut got).unwrap();
        assert_eq!(got, g2, "plain bytes before the switch");
        s.write_all(&r2).unwrap();
        let ctx = Context::new(Progress::Thread).unwrap();
        let (pd, cq) = (ctx.alloc_pd(), ctx.create_cq(16).unwrap());
        let buf = pd.alloc(64, Access::LOCAL_WRITE);
        let mut init = QpInit::new(&pd, &cq);
        init.options.crc = true;
        init.recvs.push(RecvWr {
            wr_id: 9,
            sgl: buf.sge(0, 64).into(),
        });
        let req = ConnectRequest::read(s, Duration::from_secs(10)).unwrap();
        let qp = req.accept(&init, b"adopted").unwrap();
        let wc = wait_n(&cq, 1);
        assert!(wc[0].is_ok(), "{:?}", wc[0]);
        let got = buf.to_vec()[..wc[0].byte_len as usize].to_vec();
        let msg = pd.register(b"pong".to_vec(), Access::LOCAL_READ);
        qp.post_send(send_wr(10, msg.sge(0, 4))).unwrap();
        assert!(wait_n(&cq, 1)[0].is_ok());
        got
    });
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(&greeting).unwrap();
    let mut got = vec![0; reply.len()];
    s.read_exact(&mut got).unwrap();
    assert_eq!(got, reply);
    let ctx = Context::new(Progress::Caller).unwrap();
    let (pd, cq) = (ctx.alloc_pd(), ctx.create_cq(16).unwrap());
    let buf = pd.alloc(64, Access::LOCAL_WRITE);
    let mut init = QpInit::new(&pd, &cq);
    init.recvs.push(RecvWr {
        wr_id: 1,
        sgl: buf.sge(0, 64).into(),
    });
    let qp = connect_stream(s, &init).unwrap();
    let n = qp.negotiated().unwrap();
    assert!(n.crc, "CRC is on when either end asks");
    assert_eq!(n.peer_private_data, b"adopted");
    let msg = pd.register(b"ping".to_vec(), Access::LOCAL_READ);
    qp.post_send(send_wr(2, msg.sge(0, 4))).unwrap();
    let mut wcs = wait_n(&cq, 2);
    wcs.sort_by_key(|w| w.wr_id);
    assert!(wcs.iter().all(|w| w.is_ok()), "{wcs:?}");
    assert_eq!(&buf.to_vec()[..wcs[0].byte_len as usize], b"pong");
    assert_eq!(server.join().unwrap(), b"ping");
}

/// A responder whose peer sends application bytes instead of an MPA
/// Request gets an MPA error, not a hang.
#[test]
fn responder_rejects_a_peer_that_is_not_mpa() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let client = std::thread::spawn(move || {
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        let mut sink = Vec::new();
        let _ = s.read_to_end(&mut sink);
    });
    let (s, _) = l.accept().unwrap();
    s.set_read_timeout(Some(LIMIT)).unwrap();
    match ConnectRequest::read(s, Duration::from_secs(10)) {
        Err(CmError::Mpa(_)) => {}
        other => panic!("expected an MPA error, got {other:?}"),
    }
    client.join().unwrap();
}

/// Sockets adopted in non-blocking mode (a program that connected or
/// accepted non-blocking) are put back in blocking mode: an idle 40 ms
/// wait of a caller-driven queue pair sleeps in a few parked reads (each
/// up to a 10 ms slice), not thousands of `recv`s that return at once
/// (one core spinning; review r19-xwake2 note 5). Counts, not times: load
/// only lengthens parks.
#[test]
fn sockets_adopted_non_blocking_wait_without_spinning() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let idle_parks = |cq: &warpsock_engine::Cq, qp: &warpsock_engine::Qp| {
        let _ = cq.wait(&mut [Wc::default(); 4], Duration::from_millis(10));
        let reads = qp.io_stats().parked_reads;
        let n = cq.wait(&mut [Wc::default(); 4], Duration::from_millis(40));
        assert_eq!(n.unwrap(), 0);
        qp.io_stats().parked_reads - reads
    };
    let (done_tx, done) = std::sync::mpsc::channel::<()>();
    let server = std::thread::spawn(move || {
        let (s, _) = l.accept().unwrap();
        s.set_nonblocking(true).unwrap();
        let ctx = Context::new(Progress::Caller).unwrap();
        let (pd, cq) = (ctx.alloc_pd(), ctx.create_cq(16).unwrap());
        let init = QpInit::new(&pd, &cq);
        let req = ConnectRequest::read(s, Duration::from_secs(10)).unwrap();
        let qp = req.accept(&init, b"").unwrap();
        let parks = idle_parks(&cq, &qp);
        done.recv().unwrap();
        parks
    });
    let s = TcpStream::connect(addr).unwrap();
    s.set_nonblocking(true).unwrap();
    let ctx = Context::new(Progress::Caller).unwrap();
    let (pd, cq) = (ctx.alloc_pd(), ctx.create_cq(16).unwrap());
    let init = QpInit::new(&pd, &cq);
    let qp = connect_stream(s, &init).unwrap();
    let parks = idle_parks(&cq, &qp);
    done_tx.send(()).unwrap();
    let server_parks = server.join().unwrap();
    assert!(
        parks <= 8,
        "{parks} parked reads in an idle 40 ms wait (initiator)"
    );
    assert!(
        server_parks <= 8,
        "{server_parks} parked reads in an idle 40 ms wait (responder)"
    );
}

/// `setsockopt` of an `int`.
fn set_int(fd: RawFd, level: libc::c_int, name: libc::c_int, v: libc::c_int) {
    // SAFETY: `v` is a live int of the length passed.
    let r = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            (&v as *const libc::c_int).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    assert_eq!(
        r,
        0,
        "setsockopt {level}/{name}: {}",
        io::Error::last_os_error()
    );
}

/// `SO_MEMINFO` (`asm-generic/socket.h`; not in `libc`).
const SO_MEMINFO: libc::c_int = 55;

/// The socket's receive memory in use and its receive buffer
/// (`SO_MEMINFO`'s `SK_MEMINFO_RMEM_ALLOC`, `SK_MEMINFO_RCVBUF`).
fn rmem(fd: RawFd) -> (u32, u32) {
    let mut m = [0u32; 9];
    let mut len = size_of_val(&m) as libc::socklen_t;
    // SAFETY: `m` is a live, writable array of `len` bytes.
    let r = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            SO_MEMINFO,
            m.as_mut_ptr().cast(),
            &mut len,
        )
    };
    assert_eq!(r, 0, "SO_MEMINFO: {}", io::Error::last_os_error());
    (
        m[libc::SK_MEMINFO_RMEM_ALLOC as usize],
        m[libc::SK_MEMINFO_RCVBUF as usize],
    )
}

/// Transmit stamps in the initiator's error queue during its MPA exchange
/// (a program's `SO_TIMESTAMPING` `TX_ACK` stamps of bytes it sent before
/// the switch, which come as the peer reads them) are charged to its
/// receive buffer (`sock_queue_err_skb`), and nobody read them: once they
/// filled it, a segment that came — the peer's last mark — was taken (the
/// receive queue was empty) but acknowledged with a zero window
/// (`ICSK_ACK_NOMEM`), which nothing reopened, so the peer's MPA Reply
/// was dropped at every retransmission and the exchange failed at its
/// timeout (the preload's `ddp_sockopt` `latestamps`, 2 runs in ~800
/// under load: `ETIMEDOUT` after 4 s, the initiator's kernel socket with
/// 7,616 B of stamps in an 8 KiB buffer, the peer's window 0 and its
/// 40 B Reply retransmitted). Here the same, made deterministic: a few
/// software stamps of 1-byte sends, the buffer then lowered below them
/// (`SO_RCVBUF`'s minimum), the peer's 1-byte mark read. The exchange's
/// waits drop the stamps and it completes. Fails without that: `MPA
/// reply` timeout (5 s).
#[test]
fn stamps_waiting_in_the_error_queue_do_not_stall_the_mpa_exchange() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let mut x = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let (mut y, _) = l.accept().unwrap();
    let fd = x.as_raw_fd();
    x.set_nodelay(true).unwrap();
    let stamps = libc::SOF_TIMESTAMPING_TX_SOFTWARE
        | libc::SOF_TIMESTAMPING_SOFTWARE
        | libc::SOF_TIMESTAMPING_OPT_TSONLY;
    set_int(
        fd,
        libc::SOL_SOCKET,
        libc::SO_TIMESTAMPING,
        stamps as libc::c_int,
    );
    let mut sent = 0;
    while rmem(fd).0 <= 4096 {
        assert!(sent < 10_000, "no stamps queued: {:?}", rmem(fd));
        x.write_all(b"s").unwrap();
        sent += 1;
    }
    set_int(fd, libc::SOL_SOCKET, libc::SO_TIMESTAMPING, 0);
    set_int(fd, libc::SOL_SOCKET, libc::SO_RCVBUF, 1);
    let (stamped, rcvbuf) = rmem(fd);
    assert!(
        stamped > rcvbuf,
        "{stamped} B of stamps, a {rcvbuf} B buffer"
    );
    let mut got = vec![0; sent];
    y.read_exact(&mut got).unwrap();
    y.write_all(b"m").unwrap();
    x.read_exact(&mut got[..1]).unwrap();
    let server = std::thread::spawn(move || {
        let ctx = Context::new(Progress::Caller).unwrap();
        let (pd, cq) = (ctx.alloc_pd(), ctx.create_cq(16).unwrap());
        let init = QpInit::new(&pd, &cq);
        let req = ConnectRequest::read(y, Duration::from_secs(10)).unwrap();
        req.accept(&init, b"stamped").map(drop)
    });
    let ctx = Context::new(Progress::Caller).unwrap();
    let (pd, cq) = (ctx.alloc_pd(), ctx.create_cq(16).unwrap());
    let mut init = QpInit::new(&pd, &cq);
    init.options.mpa_timeout = Duration::from_secs(5);
    let qp = connect_stream(x, &init).unwrap();
    assert_eq!(qp.negotiated().unwrap().peer_private_data, b"stamped");
    server.join().unwrap().unwrap();
}
