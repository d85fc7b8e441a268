//! Two processes on 127.0.0.1: every operation with the responder in a
//! child process (this test binary re-run as `peer_main`), and a peer
//! killed with SIGKILL mid-transfer: every outstanding request on the
//! survivor must complete (with an error where it could not finish), in
//! bounded time, in both progress modes.

mod common;

use std::collections::HashSet;
use std::time::{Duration, Instant};

use common::{
    advertise, parse_adverts, peer_listen, peer_role, run_every_op, serve_every_op, wait_n, Peer,
    LIMIT, VERDICT_LEN,
};
use warpsock_engine::{
    connect, Access, CloseReason, Context, Event, Progress, QpInit, RecvWr, SendOp, SendWr,
    TransportError, Wc, WcStatus,
};

fn progress(s: &str) -> Progress {
    match s {
        "thread" => Progress::Thread,
        _ => Progress::Caller,
    }
}

/// The child side. Does nothing unless spawned with `WARPSOCK_PEER`.
#[test]
fn peer_main() {
    let Some(role) = peer_role() else { return };
    let parts: Vec<&str> = role.split(':').collect();
    match parts[..] {
        ["every-op", mode, crc] => {
            let v = serve_every_op(&peer_listen(), progress(mode), crc == "crc");
            assert_eq!(v, vec![1; VERDICT_LEN]);
        }
        ["sink", mode, behaviour] => {
            let l = peer_listen();
            let ctx = Context::new(progress(mode)).unwrap();
            let pd = ctx.alloc_pd();
            let cq = ctx.create_cq(64).unwrap();
            let target = pd.alloc(1 << 20, Access::REMOTE_WRITE);
            let rbuf = pd.alloc(1 << 20, Access::LOCAL_WRITE);
            let mut init = QpInit::new(&pd, &cq);
            init.recvs = (0..64)
                .map(|i| RecvWr {
                    wr_id: i,
                    sgl: rbuf.sge(0, 1 << 20).into(),
                })
                .collect();
            let qp = l
                .accept_qp(&init, &advertise(&[&target]), Some(LIMIT))
                .unwrap();
            // "stalled": never drive progress (caller mode), so the
            // initiator's data piles up unread. "active": keep receiving,
            // reposting each receive a Send took, so the peer never runs
            // out and Terminates (RFC 5040 §7.1: a Send with no receive
            // posted is an error): what is tested is the kill, not that.
            let end = Instant::now() + Duration::from_secs(60);
            while Instant::now() < end {
                if behaviour == "stalled" {
                    std::thread::sleep(Duration::from_millis(100));
                } else {
                    let mut b = [Wc::default(); 64];
                    let n = cq.wait(&mut b, Duration::from_millis(100)).unwrap();
                    for w in &b[..n] {
                        assert!(w.is_ok(), "{w:?}");
                        qp.post_recv(RecvWr {
                            wr_id: w.wr_id,
                            sgl: rbuf.sge(0, 1 << 20).into(),
                        })
                        .unwrap();
                    }
                }
            }
        }
        _ => panic!("unknown peer role {role}"),
    }
}

fn every_op_with_child(mode: &str, crc: bool, client: Progress) {
    let role = format!("every-op:{mode}:{}", if crc { "crc" } else { "nocrc" });
    let peer = Peer::spawn("peer_main", &role);
    run_every_op(peer.addr, client, crc);
    assert!(peer.join(), "peer process reported a failure");
}

#[test]
fn every_op_child_responder_caller_crc_off() {
    every_op_with_child("caller", false, Progress::Caller);
}

#[test]
fn every_op_child_responder_thread_crc_on() {
    every_op_with_child("thread", true, Progress::Thread);
}

/// Posts many 1 MiB Writes and Sends, kills the peer after `kill_after`
/// completions (or 300 ms), then checks every request completes.
fn peer_killed(peer_behaviour: &str, survivor: Progress, kill_after: usize) {
    // A stalled peer must not have a progress thread: it would keep
    // reading, and with fast enough receive the whole transfer would
    // finish before the kill.
    let mode = if peer_behaviour == "stalled" {
        "caller"
    } else {
        "thread"
    };
    let peer = Peer::spawn("peer_main", &format!("sink:{mode}:{peer_behaviour}"));
    let ctx = Context::new(survivor).unwrap();
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq(1024).unwrap();
    let src = pd.alloc(1 << 20, Access::LOCAL_READ);
    let rbuf = pd.alloc(64, Access::LOCAL_WRITE);
    let mut init = QpInit::new(&pd, &cq);
    init.recvs = vec![RecvWr {
        wr_id: 10_000,
        sgl: rbuf.sge(0, 64).into(),
    }];
    let mut peer = peer;
    let qp = connect(peer.addr, &init).unwrap();
    let [(t_addr, t_key)] = parse_adverts(&qp.negotiated().unwrap().peer_private_data)[..] else {
        panic!("bad private data")
    };
    // Enough that the transfer cannot finish before the kill, even when
    // the test thread is descheduled for a while (1000 MiB).
    const N: u64 = 1000;
    for i in 0..N {
        let op = if i % 8 == 7 {
            SendOp::Send {
                solicited: false,
                invalidate: None,
            }
        } else {
            SendOp::Write {
                remote_addr: t_addr,
                rkey: t_key,
            }
        };
        qp.post_send(SendWr {
            wr_id: i,
            op,
            sgl: src.sge(0, 1 << 20).into(),
            signaled: true,
        })
        .unwrap();
    }
    let mut got: Vec<Wc> = Vec::new();
    let t0 = Instant::now();
    let mut buf = [Wc::default(); 64];
    while got.len() < kill_after && t0.elapsed() < Duration::from_millis(300) {
        let n = cq.wait(&mut buf, Duration::from_millis(10)).unwrap();
        got.extend_from_slice(&buf[..n]);
    }
    assert!(got.iter().all(Wc::is_ok), "errors before the kill: {got:?}");
    let before = got.len();
    peer.child.kill().unwrap(); // SIGKILL by pid
    peer.child.wait().unwrap();
    let killed = Instant::now();
    got.extend(wait_n(&cq, N as usize + 1 - got.len()));
    let flush_time = killed.elapsed();
    let ids: HashSet<u64> = got.iter().map(|w| w.wr_id).collect();
    assert_eq!(
        ids.len(),
        N as usize + 1,
        "every request completes exactly once"
    );
    assert!(ids.contains(&10_000), "the posted receive is flushed too");
    let errors: Vec<&Wc> = got.iter().filter(|w| !w.is_ok()).collect();
    // The posted receive can never complete successfully (the peer sends
    // nothing), so at least it fails; send-queue errors are expected too
    // unless the whole transfer beat the kill.
    assert!(
        !errors.is_empty(),
        "{before} completed before the kill, none failed after"
    );
    assert!(
        errors
            .iter()
            .all(|w| matches!(w.status, WcStatus::WrFlushError | WcStatus::FatalError)),
        "{errors:?}"
    );
    // Send-queue completions stay in posting order, errors after successes.
    let sq: Vec<&Wc> = got.iter().filter(|w| w.wr_id < N).collect();
    assert!(sq.windows(2).all(|p| p[0].wr_id < p[1].wr_id), "order");
    if let Some(first_err) = sq.iter().position(|w| !w.is_ok()) {
        assert!(sq[first_err..].iter().all(|w| !w.is_ok()));
    } else {
        eprintln!("note: all {N} requests completed before the peer died");
    }
    assert!(
        flush_time < Duration::from_secs(5),
        "flush took {flush_time:?}"
    );
    let deadline = Instant::now() + LIMIT;
    while !qp.is_closed() && Instant::now() < deadline {
        ctx.progress();
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(qp.is_closed());
    let mut events = Vec::new();
    while let Some(e) = qp.poll_event() {
        events.push(e);
    }
    // A killed peer's kernel closes its socket: FIN, or a reset when our
    // bytes were still unread there (or the peer's last act was a
    // Terminate: a Send that found no receive it had not reposted). The
    // cause is told, the same in the event, the queue pair and every
    // failed completion.
    let reason = qp.close_reason().expect("closed");
    assert!(
        matches!(
            reason,
            CloseReason::PeerClosed
                | CloseReason::Transport(TransportError::Reset)
                | CloseReason::Terminated { by_peer: true, .. }
        ),
        "{reason:?}"
    );
    assert!(events.contains(&Event::Closed(reason)), "{events:?}");
    assert!(errors.iter().all(|w| w.cause == Some(reason)), "{errors:?}");
    // Posting to the dead queue pair completes at once with a flush error.
    qp.post_send(SendWr {
        wr_id: 77,
        op: SendOp::Write {
            remote_addr: t_addr,
            rkey: t_key,
        },
        sgl: src.sge(0, 8).into(),
        signaled: true,
    })
    .unwrap();
    let w = wait_n(&cq, 1);
    assert_eq!((w[0].wr_id, w[0].status), (77, WcStatus::WrFlushError));
}

#[test]
fn peer_killed_while_stalled_caller_survivor() {
    peer_killed("stalled", Progress::Caller, 1000);
}

#[test]
fn peer_killed_while_receiving_thread_survivor() {
    peer_killed("active", Progress::Thread, 20);
}

#[test]
fn peer_killed_while_receiving_caller_survivor() {
    peer_killed("active", Progress::Caller, 20);
}
