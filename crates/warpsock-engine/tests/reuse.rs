//! A Send's buffer belongs to the application again once its completion
//! is polled (verbs semantics; iWARP completes a Send when its bytes are
//! handed to the transport). The sender here rewrites every buffer the
//! moment its completion arrives, while a slow receiver keeps the sender's
//! socket buffer full, so segments wait in the engine's transmit queue:
//! a completion released before its bytes reached the socket would put
//! the new contents on the wire under the old CRC (the peer terminates)
//! or, with CRC off, deliver the wrong bytes. Messages are odd-sized and
//! span several FPDUs, like `send-check` against siw.

mod common;

use std::time::Duration;

use common::{pattern, send_wr, wait_n, LIMIT};
use warpsock_engine::{
    connect, Access, Context, Listener, Progress, QpInit, RecvWr, WcOpcode, WcStatus,
};

const MSG: usize = 65_537;
const MSGS: usize = 160;
const SLOTS: usize = 4;

fn run(crc: bool) {
    let listener = Listener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let receiver = std::thread::spawn(move || {
        let ctx = Context::new(Progress::Caller).unwrap();
        let (pd, cq) = (ctx.alloc_pd(), ctx.create_cq(MSGS + 8).unwrap());
        let rbuf = pd.alloc(MSG * MSGS, Access::LOCAL_WRITE);
        let mut init = QpInit::new(&pd, &cq);
        init.options.crc = crc;
        init.options.tcp.recv_buffer = Some(64 << 10);
        init.recvs = (0..MSGS)
            .map(|i| RecvWr {
                wr_id: i as u64,
                sgl: rbuf.sge(i * MSG, MSG as u32).into(),
            })
            .collect();
        let qp = listener.accept_qp(&init, &[], Some(LIMIT)).unwrap();
        // Slow at first: the sender's queue fills up behind a full socket.
        std::thread::sleep(Duration::from_millis(300));
        let mut done = 0;
        while done < MSGS {
            let w = wait_n(&cq, 1);
            assert_eq!(
                w[0].status,
                WcStatus::Success,
                "{w:?} after {done} receives"
            );
            assert_eq!(w[0].byte_len as usize, MSG);
            let i = w[0].wr_id as usize;
            let want = pattern(MSG, 1000 + i as u64);
            let got = rbuf.with_bytes(|b| b[i * MSG..(i + 1) * MSG].to_vec());
            assert!(
                got == want,
                "message {i}: contents differ from what was posted"
            );
            done += 1;
            if done % 16 == 0 {
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        drop(qp);
    });

    let ctx = Context::new(Progress::Caller).unwrap();
    let (pd, cq) = (ctx.alloc_pd(), ctx.create_cq(64).unwrap());
    let data = pd.alloc(MSG * SLOTS, Access::LOCAL_READ);
    let mut init = QpInit::new(&pd, &cq);
    init.options.crc = crc;
    init.options.tcp.send_buffer = Some(64 << 10);
    let qp = connect(addr, &init).unwrap();
    let (mut sent, mut completed) = (0usize, 0usize);
    while completed < MSGS {
        while sent < MSGS && sent - completed < SLOTS {
            let slot = sent % SLOTS;
            data.write(slot * MSG, &pattern(MSG, 1000 + sent as u64));
            qp.post_send(send_wr(sent as u64, vec![data.sge(slot * MSG, MSG as u32)]))
                .unwrap();
            sent += 1;
        }
        let w = wait_n(&cq, 1);
        assert_eq!(w[0].opcode, WcOpcode::Send);
        assert_eq!(w[0].status, WcStatus::Success, "{w:?}");
        // The buffer is ours again: spoil it at once.
        let slot = w[0].wr_id as usize % SLOTS;
        data.write(slot * MSG, &vec![0xee; MSG]);
        completed += 1;
    }
    receiver.join().unwrap();
}

#[test]
fn send_buffers_are_reusable_at_completion_crc_on() {
    run(true);
}

#[test]
fn send_buffers_are_reusable_at_completion_crc_off() {
    run(false);
}
