//! The two hooks the libibverbs/librdmacm layer (`warpsock-verbs`) builds
//! on: caller memory registered at an iova (`ibv_reg_mr_iova2`), and the
//! responder's MPA exchange run on a TCP connection the caller accepted
//! itself (`ConnectRequest::read`), so a slow peer never holds up a
//! listener's next connection.

mod common;

use std::net::{TcpListener, TcpStream};
use std::time::Duration;

use common::{pattern, wait_n, LIMIT};
use warpsock_engine::{
    connect, Access, CmError, ConnectRequest, Context, Progress, QpInit, RecvWr, SendOp, SendWr,
    Sgl,
};

/// A region registered at iova 0x1000_0000 is addressed by that iova, in
/// local SGEs and by the peer's RDMA Write and Read, while the bytes land
/// in (and come from) the caller's memory.
#[test]
fn raw_region_at_an_iova() {
    const IOVA: u64 = 0x1000_0000;
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let server = std::thread::spawn(move || {
        let ctx = Context::new(Progress::Thread).unwrap();
        let (pd, cq) = (ctx.alloc_pd(), ctx.create_cq(16).unwrap());
        let mut mem = vec![0u8; 4096];
        mem[..16].copy_from_slice(b"readable by iova");
        // SAFETY: `mem` outlives the region (dropped after `mr`) and is not
        // touched while registered until the peer says it is done.
        let mr = unsafe {
            pd.register_raw_iova(
                mem.as_mut_ptr(),
                mem.len(),
                IOVA,
                Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ,
            )
        };
        assert_eq!((mr.addr(), mr.len()), (IOVA, 4096));
        let note = pd.alloc(8, Access::LOCAL_WRITE);
        let mut init = QpInit::new(&pd, &cq);
        init.recvs.push(RecvWr {
            wr_id: 1,
            sgl: note.sge(0, 8).into(),
        });
        let (sock, _) = listener.accept().unwrap();
        let req = ConnectRequest::read(sock, LIMIT).unwrap();
        assert_eq!(req.local_addr(), addr);
        let mut pdata = mr.addr().to_be_bytes().to_vec();
        pdata.extend_from_slice(&mr.rkey().to_be_bytes());
        let _qp = req.accept(&init, &pdata).unwrap();
        let wc = wait_n(&cq, 1);
        assert!(wc[0].is_ok(), "{wc:?}");
        drop(mr);
        mem
    });
    let ctx = Context::new(Progress::Caller).unwrap();
    let (pd, cq) = (ctx.alloc_pd(), ctx.create_cq(16).unwrap());
    let qp = connect(addr, &QpInit::new(&pd, &cq)).unwrap();
    let pdata = qp.negotiated().unwrap().peer_private_data;
    let raddr = u64::from_be_bytes(pdata[..8].try_into().unwrap());
    let rkey = u32::from_be_bytes(pdata[8..12].try_into().unwrap());
    assert_eq!(raddr, IOVA);
    let data = pattern(1000, 7);
    let src = pd.register(data.clone(), Access::LOCAL_READ);
    let sink = pd.alloc(16, Access::LOCAL_WRITE);
    let ops = [
        (
            SendOp::Write {
                remote_addr: IOVA + 100,
                rkey,
            },
            src.sge(0, 1000).into(),
        ),
        (
            SendOp::Read {
                remote_addr: IOVA,
                rkey,
            },
            sink.sge(0, 16).into(),
        ),
        (
            SendOp::Send {
                solicited: false,
                invalidate: None,
            },
            Sgl::new(),
        ),
    ];
    for (i, (op, sgl)) in ops.into_iter().enumerate() {
        qp.post_send(SendWr {
            wr_id: i as u64,
            op,
            sgl,
            signaled: true,
        })
        .unwrap();
    }
    let wc = wait_n(&cq, 3);
    assert!(wc.iter().all(|w| w.is_ok()), "{wc:?}");
    assert_eq!(sink.to_vec(), b"readable by iova");
    let mem = server.join().unwrap();
    assert_eq!(&mem[100..1100], &data[..]);
}

/// `ConnectRequest::read` gives up on a peer that connects and stays
/// silent, after the MPA timeout, naming the stage.
#[test]
fn handshake_on_own_socket_times_out_on_silent_peer() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let _silent = TcpStream::connect(addr).unwrap();
    let (sock, _) = listener.accept().unwrap();
    match ConnectRequest::read(sock, Duration::from_millis(200)) {
        Err(CmError::Timeout { stage, .. }) => assert_eq!(stage, "MPA request"),
        other => panic!("expected a timeout, got {other:?}"),
    }
}
