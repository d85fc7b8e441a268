//! Connection manager over real sockets: clear errors (refused, MPA
//! timeout, malformed reply, reject with private data, oversized private
//! data, context mismatch), private data both ways, graceful disconnect and
//! abortive close as the peer sees them.

mod common;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use common::{pattern, send_wr, wait_n, LIMIT};
use warpsock_engine::proto::ConnectError;
use warpsock_engine::{
    connect, Access, CloseReason, CmError, Context, Event, Listener, Progress, QpInit, QpState,
    RecvWr, SendOp, SendWr, Sgl, TransportError, Wc, WcStatus, MAX_PRIVATE_DATA,
};

fn ctx() -> (Context, warpsock_engine::Pd, warpsock_engine::Cq) {
    let c = Context::new(Progress::Caller).unwrap();
    let pd = c.alloc_pd();
    let cq = c.create_cq(64).unwrap();
    (c, pd, cq)
}

#[test]
fn refused_port_is_a_clear_error() {
    // Bind then drop to get a port nothing listens on.
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let (_c, pd, cq) = ctx();
    for addr in [format!("127.0.0.1:{port}"), format!("[::1]:{port}")] {
        let err = connect(addr.as_str(), &QpInit::new(&pd, &cq)).unwrap_err();
        let CmError::Refused { addr: a } = &err else {
            // ::1 may be absent in some sandboxes.
            if addr.starts_with('[') {
                continue;
            }
            panic!("{err:?}");
        };
        assert_eq!(a.port(), port);
        let msg = err.to_string();
        assert!(
            msg.contains("refused") && msg.contains(&port.to_string()),
            "{msg}"
        );
    }
}

#[test]
fn unresolvable_name_is_a_clear_error() {
    let (_c, pd, cq) = ctx();
    let err = connect("no-such-host.invalid:1", &QpInit::new(&pd, &cq)).unwrap_err();
    assert!(matches!(err, CmError::Resolve(_)), "{err:?}");
}

#[test]
fn silent_server_gives_mpa_reply_timeout() {
    let tcp = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = tcp.local_addr().unwrap();
    let h = std::thread::spawn(move || {
        let (mut s, _) = tcp.accept().unwrap();
        let mut buf = [0u8; 512];
        // Read the MPA Request, never answer; hold until the peer gives up.
        let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
        let n = s.read(&mut buf).unwrap_or(0);
        let _ = s.read(&mut buf);
        n
    });
    let (_c, pd, cq) = ctx();
    let mut init = QpInit::new(&pd, &cq);
    init.options.mpa_timeout = Duration::from_millis(300);
    let t0 = Instant::now();
    let err = connect(addr, &init).unwrap_err();
    let took = t0.elapsed();
    assert!(
        matches!(
            err,
            CmError::Timeout {
                stage: "MPA reply",
                ..
            }
        ),
        "{err:?}"
    );
    assert!(
        took >= Duration::from_millis(300) && took < Duration::from_secs(3),
        "{took:?}"
    );
    assert!(err.to_string().contains("MPA reply"), "{err}");
    assert!(h.join().unwrap() >= 20, "the MPA Request was sent");
}

#[test]
fn garbage_reply_is_malformed() {
    let tcp = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = tcp.local_addr().unwrap();
    let h = std::thread::spawn(move || {
        let (mut s, _) = tcp.accept().unwrap();
        let mut buf = [0u8; 512];
        let _ = s.read(&mut buf);
        s.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n").unwrap();
        let _ = s.read(&mut buf);
    });
    let (_c, pd, cq) = ctx();
    let err = connect(addr, &QpInit::new(&pd, &cq)).unwrap_err();
    assert!(
        matches!(err, CmError::Mpa(ConnectError::Malformed(_))),
        "{err:?}"
    );
    h.join().unwrap();
}

#[test]
fn silent_client_gives_mpa_request_timeout_then_next_peer_works() {
    let mut l = Listener::bind("127.0.0.1:0").unwrap();
    l.set_mpa_timeout(Duration::from_millis(200));
    let addr = l.local_addr().unwrap();
    let _silent = TcpStream::connect(addr).unwrap();
    let err = l.accept(Some(LIMIT)).unwrap_err();
    assert!(
        matches!(
            err,
            CmError::Timeout {
                stage: "MPA request",
                ..
            }
        ),
        "{err:?}"
    );
    // Nobody else: accept itself times out.
    let err = l.accept(Some(Duration::from_millis(50))).unwrap_err();
    assert!(
        matches!(
            err,
            CmError::Timeout {
                stage: "TCP accept",
                ..
            }
        ),
        "{err:?}"
    );
    let c = std::thread::spawn(move || {
        let (_c, pd, cq) = ctx();
        connect(addr, &QpInit::new(&pd, &cq)).map(|_| ())
    });
    let (_c, pd, cq) = ctx();
    l.accept_qp(&QpInit::new(&pd, &cq), b"", Some(LIMIT))
        .unwrap();
    c.join().unwrap().unwrap();
}

#[test]
fn private_data_both_ways_and_reject() {
    let l = Listener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let max = vec![0xabu8; MAX_PRIVATE_DATA];
    let server = std::thread::spawn(move || {
        let (_c, pd, cq) = ctx();
        // First: reject with a reason.
        let req = l.accept(Some(LIMIT)).unwrap();
        assert_eq!(req.private_data(), b"please");
        assert!(req.request().crc);
        req.reject(b"go away").unwrap();
        // Second: oversized reply private data is refused locally, then
        // the largest allowed is accepted.
        let req = l.accept(Some(LIMIT)).unwrap();
        assert_eq!(req.private_data().len(), MAX_PRIVATE_DATA);
        let init = QpInit::new(&pd, &cq);
        let too_long = vec![1u8; MAX_PRIVATE_DATA + 1];
        let req2 = l.accept(Some(Duration::ZERO));
        assert!(req2.is_err(), "only one peer is waiting");
        let qp = req.accept(&init, &too_long);
        assert!(matches!(
            qp,
            Err(CmError::PrivateDataTooLong { len, max }) if len == MAX_PRIVATE_DATA + 1 && max == MAX_PRIVATE_DATA
        ));
    });
    let (_c, pd, cq) = ctx();
    let mut init = QpInit::new(&pd, &cq);
    init.options.private_data = b"please".to_vec();
    init.options.crc = true;
    let err = connect(addr, &init).unwrap_err();
    match &err {
        CmError::Rejected { private_data, .. } => assert_eq!(private_data, b"go away"),
        e => panic!("{e:?}"),
    }
    assert!(err.to_string().contains("rejected"));
    init.options.private_data = max;
    let err = connect(addr, &init).unwrap_err();
    assert!(
        matches!(
            err,
            CmError::Closed {
                reason: CloseReason::PeerClosed,
                stage: "MPA reply",
                ..
            }
        ),
        "{err:?}"
    );
    assert!(
        err.to_string()
            .starts_with("peer closed the connection while waiting for the MPA reply"),
        "{err}"
    );
    server.join().unwrap();
    // Oversized request private data never leaves the host.
    init.options.private_data = vec![0; MAX_PRIVATE_DATA + 1];
    let err = connect(addr, &init).unwrap_err();
    assert!(matches!(err, CmError::PrivateDataTooLong { .. }), "{err:?}");
}

#[test]
fn accepted_private_data_reaches_the_initiator() {
    let l = Listener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let server = std::thread::spawn(move || {
        let (_c, pd, cq) = ctx();
        let reply = vec![0x5au8; MAX_PRIVATE_DATA];
        let qp = l
            .accept_qp(&QpInit::new(&pd, &cq), &reply, Some(LIMIT))
            .unwrap();
        assert_eq!(qp.negotiated().unwrap().peer_private_data, b"hi");
        let deadline = Instant::now() + LIMIT;
        while !qp.is_closed() && Instant::now() < deadline {
            let mut b = [Wc::default(); 4];
            cq.wait(&mut b, Duration::from_millis(10)).unwrap();
        }
    });
    let (_c, pd, cq) = ctx();
    let mut init = QpInit::new(&pd, &cq);
    init.options.private_data = b"hi".to_vec();
    let qp = connect(addr, &init).unwrap();
    let neg = qp.negotiated().unwrap();
    assert_eq!(neg.peer_private_data, vec![0x5au8; MAX_PRIVATE_DATA]);
    assert!(matches!(qp.poll_event(), Some(Event::Established(_))));
    assert_eq!(qp.state(), QpState::Rts);
    drop(qp);
    server.join().unwrap();
}

#[test]
fn context_mismatch_is_refused() {
    let (_c1, pd, _cq1) = ctx();
    let (_c2, _pd2, cq) = ctx();
    let err = connect("127.0.0.1:1", &QpInit::new(&pd, &cq)).unwrap_err();
    assert!(matches!(err, CmError::ContextMismatch), "{err:?}");
}

/// A responder with receives posted; returns the queue pair's context
/// objects through a closure run on it.
fn with_pair(
    server_mode: Progress,
    client: impl FnOnce(warpsock_engine::Qp, &warpsock_engine::Pd, &warpsock_engine::Cq),
    server: impl FnOnce(warpsock_engine::Qp, &warpsock_engine::Cq, &warpsock_engine::Mr)
        + Send
        + 'static,
) {
    let l = Listener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let s = std::thread::spawn(move || {
        let c = Context::new(server_mode).unwrap();
        let pd = c.alloc_pd();
        let cq = c.create_cq(64).unwrap();
        let buf = pd.alloc(1 << 16, Access::LOCAL_WRITE);
        let mut init = QpInit::new(&pd, &cq);
        init.recvs = (0..4)
            .map(|i| RecvWr {
                wr_id: i,
                sgl: buf.sge(0, 1 << 16).into(),
            })
            .collect();
        let qp = l.accept_qp(&init, b"", Some(LIMIT)).unwrap();
        server(qp, &cq, &buf);
    });
    let (_c, pd, cq) = ctx();
    let qp = connect(addr, &QpInit::new(&pd, &cq)).unwrap();
    client(qp, &pd, &cq);
    s.join().unwrap();
}

#[test]
fn graceful_disconnect_flushes_both_sides() {
    with_pair(
        Progress::Thread,
        |qp, pd, cq| {
            let m = pd.register(b"bye".to_vec(), Access::LOCAL_READ);
            let r = pd.alloc(8, Access::LOCAL_WRITE);
            qp.post_recv(RecvWr {
                wr_id: 50,
                sgl: r.sge(0, 8).into(),
            })
            .unwrap();
            qp.post_send(send_wr(1, vec![m.sge(0, 3)])).unwrap();
            let w = wait_n(cq, 1);
            assert!(w[0].is_ok() && w[0].wr_id == 1);
            qp.disconnect();
            let w = wait_n(cq, 1);
            assert_eq!((w[0].wr_id, w[0].status), (50, WcStatus::WrFlushError));
            let deadline = Instant::now() + LIMIT;
            while !qp.is_closed() && Instant::now() < deadline {
                let mut b = [Wc::default(); 4];
                cq.wait(&mut b, Duration::from_millis(10)).unwrap();
            }
            assert!(qp.is_closed(), "the peer answers FIN with FIN");
        },
        |qp, cq, buf| {
            // One Send arrives, then the peer's FIN flushes the other three.
            let mut w = wait_n(cq, 4);
            w.sort_by_key(|w| w.wr_id);
            assert!(w[0].is_ok() && w[0].byte_len == 3);
            assert_eq!(&buf.to_vec()[..3], b"bye");
            assert!(w[1..].iter().all(|w| w.status == WcStatus::WrFlushError));
            // Each flushed receive says why: the peer closed.
            assert!(
                w[1..]
                    .iter()
                    .all(|w| w.cause == Some(CloseReason::PeerClosed)),
                "{w:?}"
            );
            let mut events = Vec::new();
            while let Some(e) = qp.poll_event() {
                events.push(e);
            }
            assert!(
                events.contains(&Event::Closed(CloseReason::PeerClosed)),
                "{events:?}"
            );
            assert_eq!(qp.close_reason(), Some(CloseReason::PeerClosed));
        },
    );
}

#[test]
fn abort_resets_the_peer() {
    with_pair(
        Progress::Caller,
        |qp, pd, cq| {
            let m = pd.register(pattern(100, 1), Access::LOCAL_READ);
            qp.post_send(send_wr(1, vec![m.sge(0, 100)])).unwrap();
            assert!(wait_n(cq, 1)[0].is_ok());
            qp.abort();
        },
        |qp, cq, _buf| {
            let w = wait_n(cq, 4);
            assert_eq!(w.iter().filter(|w| w.is_ok()).count(), 1);
            let deadline = Instant::now() + LIMIT;
            while !qp.is_closed() && Instant::now() < deadline {
                let mut b = [Wc::default(); 4];
                cq.wait(&mut b, Duration::from_millis(10)).unwrap();
            }
            assert!(qp.is_closed());
            let err = qp.socket_error().expect("a reset is a socket error");
            assert_eq!(err.kind(), std::io::ErrorKind::ConnectionReset, "{err}");
            // The cause reaches the completions and the close reason: a
            // reset, not "closed".
            let reset = CloseReason::Transport(TransportError::Reset);
            assert_eq!(qp.close_reason(), Some(reset));
            assert!(
                w.iter()
                    .filter(|w| !w.is_ok())
                    .all(|w| w.cause == Some(reset)),
                "{w:?}"
            );
            let e = w.iter().find(|w| !w.is_ok()).unwrap().result().unwrap_err();
            assert!(e.to_string().ends_with("peer reset the connection"), "{e}");
            // After a reset, posting completes at once with a flush error.
            qp.post_send(SendWr {
                wr_id: 9,
                op: SendOp::Send {
                    solicited: false,
                    invalidate: None,
                },
                sgl: Sgl::new(),
                signaled: true,
            })
            .unwrap();
            let w = wait_n(cq, 1);
            assert_eq!(w[0].status, WcStatus::WrFlushError);
        },
    );
}

#[test]
fn wait_times_out_and_notify_fd_tracks_the_queue() {
    with_pair(
        Progress::Caller,
        |qp, pd, cq| {
            let t0 = Instant::now();
            let mut b = [Wc::default(); 4];
            assert_eq!(cq.wait(&mut b, Duration::from_millis(100)).unwrap(), 0);
            assert!(t0.elapsed() >= Duration::from_millis(100));
            let m = pd.register(b"x".to_vec(), Access::LOCAL_READ);
            qp.post_send(send_wr(1, vec![m.sge(0, 1)])).unwrap();
            assert!(wait_n(cq, 1)[0].is_ok());
        },
        |_qp, cq, _buf| {
            // Stay connected until the Send has arrived.
            assert!(wait_n(cq, 1)[0].is_ok());
        },
    );
    // Thread mode: notify fd.
    let l = Listener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let s = std::thread::spawn(move || {
        let (_c, pd, cq) = ctx();
        let qp = l
            .accept_qp(&QpInit::new(&pd, &cq), b"", Some(LIMIT))
            .unwrap();
        let m = pd.register(b"ping".to_vec(), Access::LOCAL_READ);
        qp.post_send(send_wr(1, vec![m.sge(0, 4)])).unwrap();
        assert!(wait_n(&cq, 1)[0].is_ok());
        std::thread::sleep(Duration::from_millis(200));
    });
    let c = Context::new(Progress::Thread).unwrap();
    let pd = c.alloc_pd();
    let cq = c.create_cq(8).unwrap();
    let buf = pd.alloc(16, Access::LOCAL_WRITE);
    let mut init = QpInit::new(&pd, &cq);
    init.recvs = vec![RecvWr {
        wr_id: 3,
        sgl: buf.sge(0, 16).into(),
    }];
    let _qp = connect(addr, &init).unwrap();
    let fd = cq.notify_fd().unwrap().as_raw_fd();
    let readable = |ms| readable_within(fd, ms);
    assert!(readable(5000), "completion raises the notify fd");
    assert_eq!(cq.len(), 1);
    let mut b = [Wc::default(); 4];
    assert_eq!(cq.poll(&mut b), 1);
    assert_eq!(b[0].wr_id, 3);
    assert!(!readable(0), "an empty queue clears it");
    s.join().unwrap();
}

fn readable_within(fd: i32, ms: i32) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd for the duration of the call.
    unsafe { libc::poll(&mut p, 1, ms) == 1 }
}

/// The initiator's choice of ready-to-receive message (RFC 6581): Write
/// only (the default), Read only, both (the responder takes the Write, or
/// the Read when it prefers Read), or no peer-to-peer setup. In each case the responder sends first, right
/// after accepting, and then the initiator sends and RDMA-Reads back.
#[test]
fn rtr_choice_end_to_end() {
    use warpsock_engine::{RtrOffer, RtrType};
    // (p2p, offer write, offer read, responder prefers Read, chosen)
    let cases = [
        (true, true, false, false, Some(RtrType::Write)),
        (true, false, true, false, Some(RtrType::Read)),
        (true, true, true, false, Some(RtrType::Write)),
        (true, true, true, true, Some(RtrType::Read)),
        (true, true, false, true, Some(RtrType::Write)),
        (true, false, false, false, None),
        (false, true, true, false, None),
    ];
    for (i, (p2p, write, read, prefer_read, want)) in cases.into_iter().enumerate() {
        let l = Listener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let first = pattern(3000, i as u64);
        let answer = pattern(2000, 100 + i as u64);
        let exposed = pattern(5000, 200 + i as u64);
        let (first2, answer2, exposed2) = (first.clone(), answer.clone(), exposed.clone());
        let server = std::thread::spawn(move || {
            let c = Context::new(Progress::Thread).unwrap();
            let pd = c.alloc_pd();
            let cq = c.create_cq(16).unwrap();
            let src = pd.register(first2, Access::LOCAL_READ);
            let rbuf = pd.alloc(4096, Access::LOCAL_WRITE);
            let exp = pd.register(exposed2, Access::REMOTE_READ);
            let mut init = QpInit::new(&pd, &cq);
            init.options.crc = true;
            init.options.prefer_read_rtr = prefer_read;
            init.recvs.push(RecvWr {
                wr_id: 9,
                sgl: rbuf.sge(0, 4096).into(),
            });
            let req = l.accept(Some(LIMIT)).unwrap();
            let qp = req.accept(&init, &common::advertise(&[&exp])).unwrap();
            // Send first, before anything arrived from the initiator.
            qp.post_send(send_wr(1, vec![src.sge(0, 3000)])).unwrap();
            let mut w = wait_n(&cq, 2);
            w.sort_by_key(|w| w.wr_id);
            assert!(w.iter().all(Wc::is_ok), "{w:?}");
            assert_eq!(w[1].byte_len, 2000);
            assert_eq!(&rbuf.to_vec()[..2000], &answer2[..]);
            let rtr = qp.negotiated().unwrap().rtr;
            // Stay connected until the initiator's Read is answered.
            let deadline = Instant::now() + LIMIT;
            while !qp.is_closed() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(2));
            }
            rtr
        });
        let (_c, pd, cq) = ctx();
        let rbuf = pd.alloc(4096, Access::LOCAL_WRITE);
        let src = pd.register(answer.clone(), Access::LOCAL_READ);
        let sink = pd.alloc(5000, Access::LOCAL_WRITE);
        let mut init = QpInit::new(&pd, &cq);
        init.options.peer_to_peer = p2p;
        init.options.rtr = RtrOffer { write, read };
        init.recvs.push(RecvWr {
            wr_id: 5,
            sgl: rbuf.sge(0, 4096).into(),
        });
        let qp = connect(addr, &init).unwrap();
        let neg = qp.negotiated().unwrap();
        assert_eq!(neg.rtr, want, "case {i}");
        assert!(neg.crc);
        let [(r_addr, r_key)] = common::parse_adverts(&neg.peer_private_data)[..] else {
            panic!("bad private data")
        };
        let mut got = Vec::new();
        if want.is_some() {
            // Peer-to-peer: the responder's Send arrives with nothing
            // posted here (without it the responder must wait for the
            // initiator's first FPDU).
            got = wait_n(&cq, 1);
        }
        qp.post_send(send_wr(2, vec![src.sge(0, 2000)])).unwrap();
        qp.post_send(SendWr {
            wr_id: 3,
            op: SendOp::Read {
                remote_addr: r_addr,
                rkey: r_key,
            },
            sgl: sink.sge(0, 5000).into(),
            signaled: true,
        })
        .unwrap();
        got.extend(wait_n(&cq, 3 - got.len()));
        got.sort_by_key(|w| w.wr_id);
        assert!(got.iter().all(Wc::is_ok), "case {i}: {got:?}");
        assert_eq!(got[2].wr_id, 5);
        assert_eq!(got[2].byte_len, 3000);
        assert_eq!(&rbuf.to_vec()[..3000], &first[..]);
        assert_eq!(sink.to_vec(), exposed);
        qp.disconnect();
        drop(qp);
        assert_eq!(server.join().unwrap(), want, "case {i}: responder's view");
    }
}

/// A responder that writes its MPA Reply and three Send FPDUs in one TCP
/// write. RFC 5044 §7.1.2 says a responder waits for the initiator's
/// first FPDU, but an initiator that reads the Reply together with what
/// follows must not lose those bytes: they go to the queue pair, which
/// takes them as the start of its stream.
#[test]
fn fpdus_right_behind_the_reply_reach_the_queue_pair() {
    use warpsock_engine::proto::wire::ddp::{Opcode, Placement, SegmentHeader};
    use warpsock_engine::proto::wire::fpdu;
    use warpsock_engine::proto::{Config, Connection, Registry, Role};

    let msgs: Vec<Vec<u8>> = (0..3)
        .map(|i| pattern(100 + i * 50, 40 + i as u64))
        .collect();
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let to_send = msgs.clone();
    let responder = std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        let mut reg: Registry<Vec<u8>> = Registry::new();
        let pd = reg.alloc_pd();
        let mut conn = Connection::new(Config::new(Role::Responder, pd), Instant::now());
        let mut buf = [0u8; 1024];
        let mut requested = false;
        while !requested {
            let n = s.read(&mut buf).unwrap();
            assert!(n > 0, "initiator closed");
            let mut off = 0;
            while off < n {
                off += conn.rx_bytes(&buf[off..n], &mut reg);
            }
            while let Some(e) = conn.poll_event() {
                requested |= matches!(e, Event::ConnectRequest(_));
            }
        }
        conn.accept(b"").unwrap();
        let mut out = Vec::new();
        conn.poll_transmit(&reg, &mut out, usize::MAX);
        for (i, m) in to_send.iter().enumerate() {
            let hdr = SegmentHeader {
                opcode: Opcode::Send,
                last: true,
                placement: Placement::Untagged {
                    inv_stag: 0,
                    qn: 0,
                    msn: i as u32 + 1,
                    mo: 0,
                },
            };
            let mut h = Vec::new();
            hdr.emit(&mut h);
            fpdu::emit(&[&h, m], false, &mut out);
        }
        s.write_all(&out).unwrap();
        // Stay until the initiator is done.
        let _ = s.read(&mut buf);
    });
    let (_c, pd, cq) = ctx();
    let inbox = pd.alloc(3 * 256, Access::LOCAL_WRITE);
    let mut init = QpInit::new(&pd, &cq);
    // No peer-to-peer mode and no CRC: the hand-built FPDUs carry none.
    init.options.peer_to_peer = false;
    init.options.crc = false;
    init.recvs = (0..3)
        .map(|i| RecvWr {
            wr_id: i,
            sgl: inbox.sge(i as usize * 256, 256).into(),
        })
        .collect();
    let qp = connect(addr, &init).unwrap();
    let mut w = wait_n(&cq, 3);
    w.sort_by_key(|w| w.wr_id);
    drop(qp);
    responder.join().unwrap();
    for (i, m) in msgs.iter().enumerate() {
        assert!(
            w[i].is_ok() && w[i].byte_len as usize == m.len(),
            "{:?}",
            w[i]
        );
        let mut got = vec![0; m.len()];
        inbox.read(i * 256, &mut got);
        assert_eq!(&got, m);
    }
}
