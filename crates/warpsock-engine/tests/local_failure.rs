//! Local failures the core cannot see (a memory region deregistered under
//! an operation in flight) end the connection with a Terminate to the
//! peer, not just a FIN, and fail the request concerned.
//!
//! Both sides are caller-driven and driven from this one thread, so the
//! order of events is fixed: the receiver reads nothing until the test
//! lets it.

mod common;

use std::time::Instant;

use common::{advertise, parse_adverts, send_wr, LIMIT};
use warpsock_engine::proto::wire::terminate::TermCode;
use warpsock_engine::{
    connect, Access, Context, Cq, Event, Listener, Mr, Pd, Progress, Qp, QpInit, RecvWr, SendOp,
    SendWr, Wc, WcStatus,
};

const BIG: usize = 32 << 20;

struct Side {
    _ctx: Context,
    pd: Pd,
    cq: Cq,
    qp: Qp,
    got: Vec<Wc>,
}

/// A connected pair with CRC on; the responder exposes `target` (BIG
/// bytes, remote-writable) and has one receive posted.
fn pair(mulpdu: Option<usize>) -> (Side, Side, Mr, Mr) {
    let l = Listener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let server = std::thread::spawn(move || {
        let ctx = Context::new(Progress::Caller).unwrap();
        let pd = ctx.alloc_pd();
        let cq = ctx.create_cq(64).unwrap();
        let target = pd.alloc(BIG, Access::REMOTE_WRITE);
        let rbuf = pd.alloc(4096, Access::LOCAL_WRITE);
        let mut init = QpInit::new(&pd, &cq);
        init.options.crc = true;
        init.recvs.push(RecvWr {
            wr_id: 70,
            sgl: rbuf.sge(0, 4096).into(),
        });
        let qp = l
            .accept_qp(&init, &advertise(&[&target]), Some(LIMIT))
            .unwrap();
        let side = Side {
            _ctx: ctx,
            pd,
            cq,
            qp,
            got: Vec::new(),
        };
        (side, target, rbuf)
    });
    let ctx = Context::new(Progress::Caller).unwrap();
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq(64).unwrap();
    let mut init = QpInit::new(&pd, &cq);
    init.options.crc = true;
    init.options.mulpdu = mulpdu;
    let qp = connect(addr, &init).unwrap();
    let (s, target, rbuf) = server.join().unwrap();
    let c = Side {
        _ctx: ctx,
        pd,
        cq,
        qp,
        got: Vec::new(),
    };
    (c, s, target, rbuf)
}

/// Drives both sides until `done` holds (bounded).
fn drive(a: &mut Side, b: &mut Side, done: impl Fn(&Side, &Side) -> bool) {
    let deadline = Instant::now() + LIMIT;
    while !done(a, b) {
        assert!(
            Instant::now() < deadline,
            "stuck: {:?} / {:?}",
            a.got,
            b.got
        );
        for s in [&mut *a, &mut *b] {
            let mut w = [Wc::default(); 16];
            let n = s.cq.poll(&mut w);
            s.got.extend_from_slice(&w[..n]);
        }
        std::thread::yield_now();
    }
}

fn events(qp: &Qp) -> Vec<Event> {
    std::iter::from_fn(|| qp.poll_event()).collect()
}

fn terminated(ev: &[Event], by_peer: bool) -> bool {
    ev.iter().any(|e| {
        matches!(e, Event::Terminated { code, by_peer: p }
            if *p == by_peer && *code == TermCode::RDMAP_LOCAL_CATASTROPHIC)
    })
}

/// The source region of a Write is deregistered while the Write is being
/// transmitted: the Write and the Send behind it fail, the peer's receive
/// is flushed (by a Terminate if the stream was at an FPDU boundary, else
/// by a reset), nothing hangs.
#[test]
fn write_source_gone_mid_transfer_fails_without_hang() {
    let (mut c, mut s, _target, _rbuf) = pair(None);
    let (t_addr, t_key) = parse_adverts(&c.qp.negotiated().unwrap().peer_private_data)[0];
    let a = c.pd.alloc(BIG, Access::LOCAL_READ);
    let b = c.pd.register(vec![9; 100], Access::LOCAL_READ);
    c.qp.post_send(SendWr {
        wr_id: 1,
        op: SendOp::Write {
            remote_addr: t_addr,
            rkey: t_key,
        },
        sgl: a.sge(0, BIG as u32).into(),
        signaled: true,
    })
    .unwrap();
    c.qp.post_send(send_wr(2, vec![b.sge(0, 100)])).unwrap();
    // The peer has read nothing: the Write is partly queued.
    assert_eq!(c.cq.poll(&mut [Wc::default(); 4]), 0);
    drop(a);
    drive(&mut c, &mut s, |c, s| c.got.len() >= 2 && !s.got.is_empty());
    assert!(c.got.iter().all(|w| !w.is_ok()), "{:?}", c.got);
    assert_eq!(
        (s.got[0].wr_id, s.got[0].status),
        (70, WcStatus::WrFlushError)
    );
    let _ = &s.pd;
}

/// The responder deregisters the region a Write is being placed into,
/// in the middle of an FPDU (64 KiB FPDUs, the responder has read part of
/// the stream): the responder sends a Terminate (local catastrophic
/// error), not just a FIN, so the writer learns why.
#[test]
fn write_target_gone_mid_placement_terminates_the_writer() {
    let (mut c, mut s, target, _rbuf) = pair(Some(65_000));
    let (t_addr, t_key) = parse_adverts(&c.qp.negotiated().unwrap().peer_private_data)[0];
    let a = c.pd.alloc(BIG, Access::LOCAL_READ);
    c.qp.post_send(SendWr {
        wr_id: 1,
        op: SendOp::Write {
            remote_addr: t_addr,
            rkey: t_key,
        },
        sgl: a.sge(0, BIG as u32).into(),
        signaled: true,
    })
    .unwrap();
    c.qp.post_send(send_wr(2, vec![a.sge(0, 8)])).unwrap();
    // The responder reads what is in its socket (placement under way;
    // the read ends wherever the sender's writes did).
    assert_eq!(s.cq.poll(&mut [Wc::default(); 4]), 0);
    drop(target);
    drive(&mut c, &mut s, |c, s| c.got.len() >= 2 && !s.got.is_empty());
    assert_eq!(
        (s.got[0].wr_id, s.got[0].status),
        (70, WcStatus::WrFlushError)
    );
    // The Send behind the Write never got through.
    assert!(
        c.got.iter().any(|w| w.wr_id == 2 && !w.is_ok()),
        "{:?}",
        c.got
    );
    let (ce, se) = (events(&c.qp), events(&s.qp));
    assert!(terminated(&se, false), "{se:?}");
    assert!(terminated(&ce, true), "the writer got a Terminate: {ce:?}");
}

/// An upper layer ends the connection with a Terminate of its choice
/// (`Qp::terminate`): the peer sees that code, its posted receive is
/// flushed, and our own requests after it fail.
#[test]
fn upper_layer_terminate_reaches_the_peer_with_its_code() {
    let (mut c, mut s, _target, _rbuf) = pair(None);
    c.qp.terminate(TermCode::RDMAP_OPERATION_UNSPECIFIED);
    drive(&mut c, &mut s, |_, s| {
        s.got
            .iter()
            .any(|w| w.wr_id == 70 && w.status == WcStatus::WrFlushError)
    });
    let ev = events(&s.qp);
    assert!(
        ev.iter()
            .any(|e| matches!(e, Event::Terminated { code, by_peer: true }
            if *code == TermCode::RDMAP_OPERATION_UNSPECIFIED)),
        "{ev:?}"
    );
    let ev = events(&c.qp);
    assert!(
        ev.iter()
            .any(|e| matches!(e, Event::Terminated { code, by_peer: false }
            if *code == TermCode::RDMAP_OPERATION_UNSPECIFIED)),
        "{ev:?}"
    );
}
