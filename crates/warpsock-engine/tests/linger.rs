//! Dropping a queue pair whose peer is still sending: the socket lingers
//! (input discarded) until the peer's FIN, so what we sent last still
//! arrives. Closing at once would answer the peer's bytes with a reset,
//! and the reset discards our unsent socket buffer — the last Sends would
//! be lost although they had completed locally.

mod common;

use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::{advertise, parse_adverts, pattern, send_wr, wait_n, LIMIT};
use warpsock_engine::{
    connect, Access, Context, Listener, Progress, QpInit, RecvWr, SendOp, SendWr, WcStatus,
};

const MSG: usize = 64 << 10;
const MSGS: usize = 16;

#[test]
fn dropped_qp_delivers_its_last_sends_while_the_peer_still_writes() {
    let listener = Listener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let (dropped_tx, dropped_rx) = mpsc::channel::<()>();
    let (done_tx, done_rx) = mpsc::channel::<()>();

    // The side that drops: sends MSGS messages (all completed, i.e. in its
    // socket buffer — a large one, so most are not delivered yet because
    // the peer is not reading), then drops the queue pair while the peer
    // keeps writing into its region.
    let dropper = std::thread::spawn(move || {
        let ctx = Context::new(Progress::Caller).unwrap();
        let (pd, cq) = (ctx.alloc_pd(), ctx.create_cq(64).unwrap());
        let target = pd.alloc(MSG, Access::REMOTE_WRITE);
        let data = pd.register(pattern(MSG * MSGS, 7), Access::LOCAL_READ);
        let mut init = QpInit::new(&pd, &cq);
        init.options.tcp.send_buffer = Some(8 << 20);
        let qp = listener
            .accept_qp(&init, &advertise(&[&target]), Some(LIMIT))
            .unwrap();
        for i in 0..MSGS {
            qp.post_send(send_wr(i as u64, vec![data.sge(i * MSG, MSG as u32)]))
                .unwrap();
        }
        let w = wait_n(&cq, MSGS);
        assert!(w.iter().all(|w| w.is_ok()), "{w:?}");
        drop(qp);
        dropped_tx.send(()).unwrap();
        // Later calls on the context drive the lingering socket until the
        // peer's FIN.
        let until = Instant::now() + LIMIT;
        while done_rx.try_recv().is_err() && Instant::now() < until {
            ctx.progress();
            std::thread::sleep(Duration::from_millis(1));
        }
    });

    // The peer: small receive buffer, receives posted for every message,
    // streams RDMA Writes at the dropper without reading until after the
    // drop, then reads.
    let ctx = Context::new(Progress::Caller).unwrap();
    let (pd, cq) = (ctx.alloc_pd(), ctx.create_cq(256).unwrap());
    let inbox = pd.alloc(MSG * MSGS, Access::LOCAL_WRITE);
    let src = pd.register(pattern(MSG, 9), Access::LOCAL_READ);
    let mut init = QpInit::new(&pd, &cq);
    init.options.tcp.recv_buffer = Some(64 << 10);
    init.recvs = (0..MSGS)
        .map(|i| RecvWr {
            wr_id: 1000 + i as u64,
            sgl: inbox.sge(i * MSG, MSG as u32).into(),
        })
        .collect();
    let qp = connect(addr, &init).unwrap();
    let (raddr, rkey) = parse_adverts(&qp.negotiated().unwrap().peer_private_data)[0];
    let write = |i: u64| SendWr {
        wr_id: i,
        op: SendOp::Write {
            remote_addr: raddr,
            rkey,
        },
        sgl: src.sge(0, MSG as u32).into(),
        signaled: false,
    };
    let mut after_drop = None;
    for i in 0..2000u64 {
        // A full send queue refuses the post; the next round retries.
        let _ = qp.post_send(write(i));
        if after_drop.is_none() && dropped_rx.try_recv().is_ok() {
            after_drop = Some(i);
        }
        if after_drop.is_some_and(|d| i >= d + 50) {
            break;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(after_drop.is_some(), "the dropper never dropped");

    // Now read: every message the dropper completed must be here, intact.
    let mut got = Vec::new();
    let deadline = Instant::now() + LIMIT;
    while got.len() < MSGS && Instant::now() < deadline {
        let mut wc = [warpsock_engine::Wc::default(); 64];
        let n = cq.wait(&mut wc, Duration::from_millis(100)).unwrap();
        got.extend(wc[..n].iter().filter(|w| w.wr_id >= 1000).copied());
    }
    let ok = got.iter().filter(|w| w.status == WcStatus::Success).count();
    assert_eq!(
        ok,
        MSGS,
        "receives: {:?}, socket error: {:?}",
        got.iter().map(|w| w.status).collect::<Vec<_>>(),
        qp.socket_error()
    );
    assert_eq!(inbox.to_vec(), pattern(MSG * MSGS, 7));
    // The connection then ends with FIN both ways, not with a reset.
    while !qp.is_closed() && Instant::now() < deadline {
        let _ = cq.wait(
            &mut [warpsock_engine::Wc::default(); 8],
            Duration::from_millis(10),
        );
    }
    assert!(qp.is_closed());
    assert!(qp.socket_error().is_none(), "{:?}", qp.socket_error());
    done_tx.send(()).unwrap();
    dropper.join().unwrap();
}
