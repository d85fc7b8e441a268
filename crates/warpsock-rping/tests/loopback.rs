//! warpsock rping client against warpsock rping server over 127.0.0.1, and
//! each of them against a deliberately wrong peer built on the engine.

use std::net::TcpListener;

use std::thread;
use std::time::{Duration, Instant};
use warpsock_testkit::RefusingPort;

use clap::Parser;
use warpsock_engine::proto::RtrType;
use warpsock_engine::{
    connect, Access, Context, Listener, Progress, QpInit, RecvWr, SendOp, SendWr, Wc,
};
use warpsock_rping::{ping_pattern, run, serve, Args, Error, P2p, RdmaInfo, Report, INFO_LEN};

#[derive(Parser)]
#[command(disable_version_flag = true)]
struct Cli {
    #[command(flatten)]
    args: Args,
}

fn parse(argv: &[&str]) -> Result<Args, clap::Error> {
    Cli::try_parse_from(std::iter::once("rping").chain(argv.iter().copied())).map(|c| c.args)
}

/// The server's listener: 127.0.0.1, port 0, bound before any client
/// starts, so no other program can take the port in between (a leased
/// port can still be bound by a program that does not lease: CI once saw
/// the client reach a foreign listener there, and the server fail to bind).
fn listener() -> (Listener, u16) {
    let l = Listener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    (l, port)
}

/// Server options for [`serve`] (which ignores the address and port) or,
/// with a port, for [`run`].
fn server_args(port: u16) -> Args {
    let mut a = Args::server("127.0.0.1", port);
    a.accept_timeout = Some(20.0);
    a.timeout = 20.0;
    a
}

fn client_args(port: u16, count: u64, size: u32) -> Args {
    let mut a = Args::client("127.0.0.1", port);
    a.count = count;
    a.size = size;
    a.timeout = 20.0;
    a
}

/// Runs `server` on `listener` in a thread and `client` here; returns both
/// results.
fn pair(
    listener: Listener,
    server: Args,
    client: Args,
) -> (Result<Report, Error>, Result<Report, Error>) {
    let s = thread::spawn(move || serve(&listener, &server));
    let c = run(&client);
    (s.join().unwrap(), c)
}

/// Both reports of a pair that must succeed; a failure names both sides
/// (the server's error is the cause when the client's is a refusal).
fn both_ok(
    what: &str,
    (srv, cli): (Result<Report, Error>, Result<Report, Error>),
) -> (Report, Report) {
    match (srv, cli) {
        (Ok(s), Ok(c)) => (s, c),
        (s, c) => panic!("{what}: client: {c:?}; server: {s:?}"),
    }
}

#[test]
fn pattern_is_rpings() {
    let p = ping_pattern(0, 64);
    assert_eq!(&p[..13], b"rdma-ping-0: ");
    assert_eq!(p[13], b'A');
    assert_eq!(p[14], b'B');
    assert_eq!(p[63], 0);
    assert_eq!(p.len(), 64);
    // The letters run from 'A' + ping % 58 through 'z' (122), then wrap to 'A'.
    let p = ping_pattern(57, 40);
    assert_eq!(&p[..15], b"rdma-ping-57: z");
    assert_eq!(p[15], b'A');
    let p = ping_pattern(58, 30);
    assert_eq!(&p[..15], b"rdma-ping-58: A");
    // Smallest size: the text still fits with its NUL.
    let p = ping_pattern(58 * 17_241_379, 26);
    assert_eq!(&p[..25], b"rdma-ping-999999982: ABCD");
    assert_eq!(p[25], 0);
    // Exactly one NUL, at the end (the server writes strlen + 1 back).
    let p = ping_pattern(7, 65535);
    assert_eq!(p.iter().position(|&b| b == 0), Some(65534));
}

#[test]
fn rdma_info_wire_bytes() {
    let i = RdmaInfo {
        buf: 0x0000_7f71_ac00_0e00,
        rkey: 0x4a0f_0400,
        size: 64,
    };
    let b = i.encode();
    assert_eq!(
        b,
        [0, 0, 0x7f, 0x71, 0xac, 0, 0x0e, 0, 0x4a, 0x0f, 4, 0, 0, 0, 0, 0x40]
    );
    assert_eq!(RdmaInfo::decode(&b), i);
}

#[test]
fn options_parse_like_rping() {
    let a = parse(&[
        "-c", "-a", "10.0.0.1", "-p", "9999", "-C", "5", "-S", "26", "-V", "-v",
    ])
    .unwrap();
    assert!(a.client && !a.server && a.validate && a.verbose);
    assert_eq!((a.port, a.count, a.size), (9999, 5, 26));
    assert_eq!(a.addr.as_deref(), Some("10.0.0.1"));
    let a = parse(&[
        "-s",
        "-P",
        "--crc",
        "--conns",
        "3",
        "--accept-timeout",
        "2.5",
    ])
    .unwrap();
    assert!(a.server && a.persistent && a.crc);
    assert_eq!((a.port, a.size, a.conns), (7174, 64, Some(3)));
    assert_eq!(a.accept_timeout, Some(2.5));
    assert_eq!(
        parse(&["-c", "-a", "x", "--p2p", "write"]).unwrap().p2p,
        P2p::Write
    );
    assert!(parse(&["-S", "65535", "-s"]).is_ok());
    for bad in [
        &["-s", "-S", "25"][..],
        &["-s", "-S", "65536"],
        &["-s", "-c"],
        &["-C", "3"],
        &["-s", "--timeout", "0"],
        &["-c", "-a", "x", "--p2p", "send"],
    ] {
        assert!(parse(bad).is_err(), "{bad:?} should be rejected");
    }
    // run() itself rejects what the parser cannot express.
    let mut a = Args::client("127.0.0.1", 1);
    a.addr = None;
    assert!(matches!(run(&a), Err(Error::Usage(_))));
    // serve() runs servers only.
    let (l, _) = listener();
    let c = Args::client("127.0.0.1", 1);
    assert!(matches!(serve(&l, &c), Err(Error::Usage(_))));
}

#[test]
fn client_and_server_at_several_sizes() {
    for (size, count) in [(26u32, 40u64), (64, 20), (1500, 10), (65535, 5)] {
        let (l, port) = listener();
        let mut s = server_args(0);
        s.size = 65535;
        s.validate = true;
        let mut c = client_args(port, count, size);
        c.validate = true;
        let (srv, cli) = both_ok(&format!("size {size}"), pair(l, s, c));
        let (c0, s0) = (&cli.connections[0], &srv.connections[0]);
        assert_eq!((c0.iterations, c0.validated), (count, count), "size {size}");
        assert_eq!((s0.iterations, s0.validated), (count, count), "size {size}");
        let data = count * u64::from(size);
        assert_eq!((c0.read_bytes, c0.write_bytes), (data, data));
        assert_eq!((s0.read_bytes, s0.write_bytes), (data, data));
        // Four 16-byte Sends per iteration, counted on both sides.
        assert_eq!(c0.send_bytes, count * 4 * INFO_LEN as u64);
        assert_eq!(s0.send_bytes, c0.send_bytes);
        assert_eq!(c0.peer, s0.local);
        assert_eq!((c0.mpa_revision, c0.crc, c0.rtr), (2, false, None));
    }
}

#[test]
fn crc_asked_by_either_side_is_used_by_both() {
    for (server_crc, client_crc) in [(false, true), (true, false)] {
        let (l, port) = listener();
        let mut s = server_args(0);
        s.crc = server_crc;
        let mut c = client_args(port, 5, 200);
        c.crc = client_crc;
        c.validate = true;
        s.size = 200;
        let (srv, cli) = both_ok("crc", pair(l, s, c));
        assert!(cli.connections[0].crc && srv.connections[0].crc);
        assert_eq!(cli.connections[0].validated, 5);
    }
}

#[test]
fn peer_to_peer_write_rtr() {
    let (l, port) = listener();
    let mut c = client_args(port, 3, 64);
    c.p2p = P2p::Write;
    c.validate = true;
    let (srv, cli) = both_ok("p2p", pair(l, server_args(0), c));
    assert_eq!(cli.connections[0].rtr, Some(RtrType::Write));
    assert_eq!(srv.connections[0].rtr, Some(RtrType::Write));
    assert_eq!(srv.connections[0].iterations, 3);
}

#[test]
fn persistent_server_serves_concurrent_clients() {
    let (l, port) = listener();
    let mut s = server_args(0);
    s.persistent = true;
    s.conns = Some(4);
    s.validate = true;
    s.size = 4096;
    let srv = thread::spawn(move || serve(&l, &s));
    let clients: Vec<_> = (0..4u32)
        .map(|i| {
            let mut c = client_args(port, 10 + u64::from(i), 100 * (i + 1));
            c.validate = true;
            thread::spawn(move || run(&c))
        })
        .collect();
    for c in clients {
        assert!(c.join().unwrap().unwrap().connections[0].validated >= 10);
    }
    let srv = srv.join().unwrap().unwrap();
    assert_eq!(srv.connections.len(), 4);
    assert_eq!(srv.iterations(), 10 + 11 + 12 + 13);
    assert_eq!(srv.connections.iter().map(|c| c.validated).sum::<u64>(), 46);
}

/// `-P --max-sessions 2`: with two sessions open, a third connection is
/// refused with an MPA reject ("busy") and the server goes on; once a
/// session ends, the next client is served. No thread per refused peer.
#[test]
fn persistent_server_caps_its_sessions_and_refuses_the_excess() {
    let (l, port) = listener();
    let mut s = server_args(0);
    s.persistent = true;
    s.max_sessions = 2;
    s.conns = Some(3);
    let srv = thread::spawn(move || serve(&l, &s));
    let ctx = Context::new(Progress::Caller).unwrap();
    let (pd, cq) = (ctx.alloc_pd(), ctx.create_cq(8).unwrap());
    let init = QpInit::new(&pd, &cq);
    let connect_retrying = || {
        let until = Instant::now() + Duration::from_secs(20);
        loop {
            match connect(("127.0.0.1", port), &init) {
                Err(warpsock_engine::CmError::Refused { .. }) if Instant::now() < until => {
                    thread::sleep(Duration::from_millis(20));
                }
                r => return r,
            }
        }
    };
    // Two idle sessions: MPA done, no rping message yet.
    let idle: Vec<_> = (0..2).map(|_| connect_retrying().unwrap()).collect();
    match connect_retrying() {
        Err(warpsock_engine::CmError::Rejected { private_data, .. }) => {
            assert_eq!(private_data, b"busy");
        }
        other => panic!("the third connection was not refused: {other:?}"),
    }
    drop(idle);
    // Sessions end as their clients go; then a real client is served.
    let until = Instant::now() + Duration::from_secs(20);
    let served = loop {
        let c = client_args(port, 3, 64);
        match run(&c) {
            Ok(r) => break r,
            Err(e) if Instant::now() < until => {
                eprintln!("retrying: {e}");
                thread::sleep(Duration::from_millis(50));
            }
            Err(e) => panic!("{e}"),
        }
    };
    assert_eq!(served.iterations(), 3);
    let srv = srv.join().unwrap();
    let report = match srv {
        Ok(r) => r,
        Err(Error::Server(r)) => *r,
        Err(e) => panic!("{e}"),
    };
    assert!(report.refused >= 1, "{report}");
    assert_eq!(
        report.connections.len() + report.failures.len(),
        3,
        "{report}"
    );
}

#[test]
fn client_larger_than_server_buffer_fails_cleanly_on_both_sides() {
    let (l, port) = listener();
    let mut s = server_args(0);
    s.size = 64;
    let t0 = Instant::now();
    let (srv, cli) = pair(l, s, client_args(port, 3, 65));
    match srv {
        Err(Error::Server(r)) => {
            assert!(matches!(
                r.failures[0].error,
                Error::TooLarge {
                    advertised: 65,
                    available: 64
                }
            ));
        }
        other => panic!("server: {other:?}"),
    }
    // The server hung up: the client hears it at once, not at its timeout.
    assert!(matches!(cli, Err(Error::Disconnected { .. })), "{cli:?}");
    assert!(t0.elapsed() < Duration::from_secs(10));
}

#[test]
fn client_retries_until_the_server_listens() {
    // The port is held, not listening (refused), until the server starts
    // late; nobody else can take it meanwhile.
    let held = RefusingPort::new().unwrap();
    let port = held.port();
    let s = server_args(0);
    let srv = thread::spawn(move || {
        thread::sleep(Duration::from_millis(700));
        serve(&Listener::from_std(held.listen()?)?, &s)
    });
    let cli = run(&client_args(port, 2, 64)).unwrap();
    assert!(cli.connections[0].attempts > 1, "{cli}");
    assert_eq!(srv.join().unwrap().unwrap().iterations(), 2);
}

#[test]
fn client_gives_up_within_its_timeout() {
    let held = RefusingPort::new().unwrap();
    let port = held.port();
    let mut c = client_args(port, 1, 64);
    c.timeout = 1.5;
    let t0 = Instant::now();
    let err = run(&c).unwrap_err();
    let took = t0.elapsed();
    assert!(
        matches!(err, Error::Connect { attempts, .. } if attempts > 1),
        "{err}"
    );
    assert!(took < Duration::from_secs(5), "{took:?}");
    assert!(err.to_string().contains("refused"), "{err}");
}

#[test]
fn idle_server_times_out_with_an_error() {
    let (l, _) = listener();
    let mut s = server_args(0);
    s.accept_timeout = Some(0.3);
    let err = serve(&l, &s).unwrap_err();
    assert!(matches!(err, Error::Timeout { .. }), "{err}");
}

/// A server that echoes one wrong byte: the client's -V must catch it.
#[test]
fn client_validation_catches_a_wrong_echo() {
    let listener = Listener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let fake = thread::spawn(move || {
        let ctx = Context::new(Progress::Thread).unwrap();
        let (pd, cq) = (ctx.alloc_pd(), ctx.create_cq(16).unwrap());
        let recv = pd.alloc(INFO_LEN, Access::LOCAL_WRITE);
        let data = pd.alloc(64, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
        let go = pd.alloc(INFO_LEN, Access::LOCAL_READ);
        let rwr = || RecvWr {
            wr_id: 1,
            sgl: recv.sge(0, INFO_LEN as u32).into(),
        };
        let mut init = QpInit::new(&pd, &cq);
        init.recvs.push(rwr());
        let qp = listener
            .accept_qp(&init, b"", Some(Duration::from_secs(20)))
            .unwrap();
        let mut wc = [Wc::default()];
        let mut next = |want: u64| loop {
            assert_eq!(cq.wait(&mut wc, Duration::from_secs(20)).unwrap(), 1);
            assert!(wc[0].is_ok(), "{:?}", wc[0]);
            if wc[0].wr_id == want {
                break;
            }
        };
        let info = |recv: &warpsock_engine::Mr| {
            let mut b = [0u8; INFO_LEN];
            recv.read(0, &mut b);
            RdmaInfo::decode(&b)
        };
        let send = |id| SendWr {
            wr_id: id,
            op: SendOp::Send {
                solicited: false,
                invalidate: None,
            },
            sgl: go.sge(0, INFO_LEN as u32).into(),
            signaled: true,
        };
        next(1);
        let src = info(&recv);
        qp.post_recv(rwr()).unwrap();
        qp.post_send(SendWr {
            wr_id: 2,
            op: SendOp::Read {
                remote_addr: src.buf,
                rkey: src.rkey,
            },
            sgl: data.sge(0, src.size).into(),
            signaled: true,
        })
        .unwrap();
        next(2);
        qp.post_send(send(3)).unwrap();
        next(1);
        let sink = info(&recv);
        data.write(20, b"!");
        qp.post_send(SendWr {
            wr_id: 4,
            op: SendOp::Write {
                remote_addr: sink.buf,
                rkey: sink.rkey,
            },
            sgl: data.sge(0, sink.size).into(),
            signaled: true,
        })
        .unwrap();
        qp.post_send(send(5)).unwrap();
        next(5);
        // Stay until the client hangs up.
        let deadline = Instant::now() + Duration::from_secs(10);
        while !qp.is_closed() && Instant::now() < deadline {
            let _ = cq.wait(&mut wc, Duration::from_millis(50));
        }
    });
    let mut c = client_args(port, 3, 64);
    c.validate = true;
    let err = run(&c).unwrap_err();
    let want = ping_pattern(0, 64)[20];
    match err {
        Error::Mismatch {
            iteration: 0,
            offset: 20,
            expected,
            found: b'!',
        } => assert_eq!(expected, want),
        other => panic!("{other:?}"),
    }
    fake.join().unwrap();
}

/// A client that does not follow rping's pattern, or sends a short
/// message: the server's -V and its size check must catch them.
#[test]
fn server_catches_bad_data_and_bogus_messages() {
    for bogus in [false, true] {
        let (l, port) = listener();
        let mut s = server_args(0);
        s.validate = true;
        let srv = thread::spawn(move || serve(&l, &s));
        let ctx = Context::new(Progress::Caller).unwrap();
        let (pd, cq) = (ctx.alloc_pd(), ctx.create_cq(16).unwrap());
        let start = pd.register(
            {
                let mut p = ping_pattern(0, 64);
                p[30] ^= 1;
                p
            },
            Access::REMOTE_READ,
        );
        let msg = pd.register(
            RdmaInfo {
                buf: start.addr(),
                rkey: start.rkey(),
                size: 64,
            }
            .encode()
            .to_vec(),
            Access::LOCAL_READ,
        );
        let deadline = Instant::now() + Duration::from_secs(20);
        let qp = loop {
            match connect(("127.0.0.1", port), &QpInit::new(&pd, &cq)) {
                Ok(qp) => break qp,
                Err(e) if Instant::now() < deadline => {
                    let _ = e;
                    thread::sleep(Duration::from_millis(50));
                }
                Err(e) => panic!("{e}"),
            }
        };
        let len = if bogus { 8 } else { INFO_LEN as u32 };
        qp.post_send(SendWr {
            wr_id: 1,
            op: SendOp::Send {
                solicited: false,
                invalidate: None,
            },
            sgl: msg.sge(0, len).into(),
            signaled: true,
        })
        .unwrap();
        // Serve the Read (caller-driven progress) until the server hangs up.
        let mut wc = [Wc::default(); 4];
        while !qp.is_closed() && Instant::now() < deadline {
            let _ = cq.wait(&mut wc, Duration::from_millis(50));
        }
        match srv.join().unwrap() {
            Err(Error::Server(r)) => match (&r.failures[0].error, bogus) {
                (Error::BogusData { len: 8 }, true) => {}
                (
                    Error::Mismatch {
                        iteration: 0,
                        offset: 30,
                        ..
                    },
                    false,
                ) => {}
                (other, _) => panic!("bogus={bogus}: {other}"),
            },
            other => panic!("bogus={bogus}: {other:?}"),
        }
    }
}

/// The binary, as two processes. The server binds port 0 and the client
/// learns the port from the server's "listening on" line (no port race).
#[test]
fn binary_client_and_server() {
    use std::io::{BufRead, BufReader, Read};
    use std::process::{Command, Stdio};
    let exe = env!("CARGO_BIN_EXE_warpsock-rping");
    let mut server = Command::new(exe)
        .args(["-s", "-a", "127.0.0.1", "-p", "0", "-V", "-v", "-S", "100"])
        .args(["--accept-timeout", "20"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = BufReader::new(server.stderr.take().unwrap());
    let mut line = String::new();
    err.read_line(&mut line).unwrap();
    let port = line
        .trim_end()
        .strip_prefix("warpsock-rping server: listening on 127.0.0.1:")
        .unwrap_or_else(|| panic!("no listening line: {line:?}"))
        .to_string();
    let mut sout = server.stdout.take().unwrap();
    let srv = thread::spawn(move || {
        let (mut out, mut rest) = (String::new(), String::new());
        sout.read_to_string(&mut out).unwrap();
        err.read_to_string(&mut rest).unwrap();
        (server.wait().unwrap(), out, rest)
    });
    let out = Command::new(exe)
        .args([
            "-c",
            "-a",
            "127.0.0.1",
            "-p",
            &port,
            "-C",
            "4",
            "-V",
            "-v",
            "-S",
            "100",
        ])
        .output()
        .unwrap();
    let (status, sout, serr) = srv.join().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        stdout.matches("ping data: rdma-ping-").count(),
        4,
        "{stdout}"
    );
    assert!(stdout.contains("ping data: rdma-ping-3: DEFG"), "{stdout}");
    assert!(stdout.contains("4 iterations (4 validated)"), "{stdout}");
    assert!(status.success(), "{sout}{serr}");
    assert_eq!(
        sout.matches("server ping data: rdma-ping-").count(),
        4,
        "{sout}"
    );
    // A usage error exits non-zero with rping's message.
    let bad = Command::new(exe).args(["-s", "-S", "20"]).output().unwrap();
    assert!(!bad.status.success());
}

/// A responder that leaves the first FPDU unanswered (Linux siw's accept
/// race): the client must send a zero-length RDMA Write (STag 1, TO 0)
/// after a second, exactly as siw's own RTR frame.
#[test]
fn client_kicks_a_stalled_responder() {
    use std::io::{Read, Write};
    let tcp = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = tcp.local_addr().unwrap().port();
    let fake = thread::spawn(move || {
        let (mut s, _) = tcp.accept().unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut req = [0u8; 24];
        s.read_exact(&mut req).unwrap();
        assert_eq!(&req[..16], b"MPA ID Req Frame");
        let mut rep = b"MPA ID Rep Frame".to_vec();
        rep.extend_from_slice(&[0x10, 2, 0, 4, 0, 1, 0, 1]);
        s.write_all(&rep).unwrap();
        // rping's first Send: 2 + 18 + 16 bytes, 2 pad, 4 CRC.
        let mut send = [0u8; 40];
        s.read_exact(&mut send).unwrap();
        assert_eq!(&send[..4], &[0x00, 0x22, 0x41, 0x43]);
        let t0 = Instant::now();
        let mut kick = [0u8; 20];
        s.read_exact(&mut kick).unwrap();
        (t0.elapsed(), kick)
    });
    let mut c = client_args(port, 1, 64);
    c.timeout = 2.5;
    let err = run(&c).unwrap_err();
    assert!(
        matches!(err, Error::Timeout { .. } | Error::Disconnected { .. }),
        "{err}"
    );
    let (after, kick) = fake.join().unwrap();
    assert!(after >= Duration::from_millis(900), "{after:?}");
    let mut want = vec![0x00, 0x0e, 0xc1, 0x40, 0, 0, 0, 1];
    want.extend_from_slice(&[0; 12]);
    assert_eq!(kick.to_vec(), want);
}
