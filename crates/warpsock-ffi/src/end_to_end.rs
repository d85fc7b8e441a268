//! The C ABI end to end, called from Rust as a C program would: connect and
//! accept between two threads, Send, RDMA Write, RDMA Read, events, posting
//! errors and the flush on disconnect. A unit test: the crate builds no
//! rlib (see `Cargo.toml`); `scripts/test-ffi.sh` runs the same calls from
//! C against the built libraries.

use std::ffi::{c_char, CStr, CString};
use std::ptr::{null, null_mut};

use crate::*;

const LIMIT_US: u64 = 10_000_000;

#[track_caller]
fn ok(r: warpsock_result) {
    if r != warpsock_result::Ok {
        let mut buf = [0 as c_char; 512];
        let mut n = 0;
        warpsock_last_error_detail(buf.as_mut_ptr(), buf.len(), &mut n);
        // SAFETY: NUL-terminated by warpsock_last_error_detail.
        let d = unsafe { CStr::from_ptr(buf.as_ptr()) };
        panic!("{r:?}: {d:?}");
    }
}

struct Side {
    ctx: *mut warpsock_context,
    pd: *mut warpsock_pd,
    cq: *mut warpsock_cq,
}

impl Side {
    fn new(progress: warpsock_progress) -> Self {
        let (mut ctx, mut pd, mut cq) = (null_mut(), null_mut(), null_mut());
        ok(warpsock_context_new(progress as u32, 0, &mut ctx));
        ok(warpsock_pd_new(ctx, &mut pd));
        ok(warpsock_cq_new(ctx, 16, &mut cq));
        Self { ctx, pd, cq }
    }

    fn alloc(&self, len: usize, access: u32) -> *mut warpsock_mr {
        let mut mr = null_mut();
        ok(warpsock_mr_alloc(self.pd, len, access, &mut mr));
        mr
    }

    /// Waits (bounded) for one completion.
    fn wait(&self) -> warpsock_wc {
        let mut wc = [warpsock_wc::default()];
        let mut n = 0;
        ok(warpsock_cq_wait(
            self.cq,
            wc.as_mut_ptr(),
            1,
            LIMIT_US,
            &mut n,
        ));
        assert_eq!(n, 1, "no completion in time");
        wc[0]
    }
}

impl Drop for Side {
    fn drop(&mut self) {
        warpsock_cq_free(self.cq);
        warpsock_pd_free(self.pd);
        warpsock_context_free(self.ctx);
    }
}

// SAFETY (for the tests): the handles are used from one thread at a time or
// through the thread-safe (const) functions only.
struct Send<T>(T);
// SAFETY: see above; the engine objects behind the handles are Send + Sync.
unsafe impl<T> std::marker::Send for Send<T> {}

fn sge(mr: *const warpsock_mr, offset: usize, len: u32) -> warpsock_sge {
    let mut s = warpsock_sge::default();
    ok(warpsock_mr_sge(mr, offset, len, &mut s));
    s
}

fn read(mr: *const warpsock_mr, offset: usize, len: usize) -> Vec<u8> {
    let mut v = vec![0; len];
    ok(warpsock_mr_read(mr, offset, v.as_mut_ptr(), len));
    v
}

/// A listener on a free port of 127.0.0.1 (bound to port 0, never a
/// port picked in advance), handed to the accepting thread, and its port.
fn loopback_listener() -> (Send<*mut warpsock_listener>, u16) {
    let mut l = null_mut();
    ok(warpsock_listener_bind(c"127.0.0.1:0".as_ptr(), &mut l));
    let mut port = 0;
    ok(warpsock_listener_port(l, &mut port));
    (Send(l), port)
}

#[test]
fn send_write_read_through_the_c_abi() {
    let (l, port) = loopback_listener();

    let server = std::thread::spawn(move || {
        let l = l;
        let s = Side::new(warpsock_progress::Thread);
        assert_eq!(
            warpsock_context_progress_mode(s.ctx),
            warpsock_progress::Thread as u32
        );
        // Exposed for Write and Read: "remote" bytes in the second half.
        let exposed = s.alloc(
            64,
            WARPSOCK_ACCESS_REMOTE_WRITE | WARPSOCK_ACCESS_REMOTE_READ,
        );
        ok(warpsock_mr_write(exposed, 32, b"read me".as_ptr(), 7));
        let inbox = s.alloc(32, WARPSOCK_ACCESS_LOCAL_WRITE);
        let in_sge = sge(inbox, 0, 32);
        let rwr = warpsock_recv_wr {
            wr_id: 5,
            sg_list: &in_sge,
            num_sge: 1,
        };
        // Both receives are posted before the connection goes live: the
        // client's second Send may arrive before this thread has handled
        // the first, and a Send without a posted receive ends the stream.
        let inbox2 = s.alloc(32, WARPSOCK_ACCESS_LOCAL_WRITE);
        let in_sge2 = sge(inbox2, 0, 32);
        let rwr2 = warpsock_recv_wr {
            wr_id: 6,
            sg_list: &in_sge2,
            num_sge: 1,
        };
        let mut cfg = null_mut();
        ok(warpsock_qp_config_new(&mut cfg));
        ok(warpsock_qp_config_add_recv(cfg, &rwr));
        ok(warpsock_qp_config_add_recv(cfg, &rwr2));

        let mut req = null_mut();
        ok(warpsock_listener_accept(l.0, 10_000, &mut req));
        let mut pdata = [0u8; WARPSOCK_MAX_PRIVATE_DATA];
        let mut n = 0;
        ok(warpsock_conn_request_private_data(
            req,
            pdata.as_mut_ptr(),
            pdata.len(),
            &mut n,
        ));
        assert_eq!(&pdata[..n], b"hi");
        let mut advert = warpsock_mr_addr(exposed).to_be_bytes().to_vec();
        advert.extend_from_slice(&warpsock_mr_rkey(exposed).to_be_bytes());
        let mut qp = null_mut();
        ok(warpsock_conn_request_accept(
            req,
            s.pd,
            s.cq,
            s.cq,
            cfg,
            advert.as_ptr(),
            advert.len(),
            &mut qp,
        ));
        warpsock_qp_config_free(cfg);
        let mut fd = -1;
        ok(warpsock_cq_notify_fd(s.cq, &mut fd));
        assert!(fd >= 0);

        // The Send arrives after the Write: the Write's bytes are in place.
        let wc = s.wait();
        assert_eq!(
            (wc.wr_id, wc.status),
            (5, warpsock_wc_status::Success as u32)
        );
        assert_eq!(wc.opcode, warpsock_wc_opcode::Recv as u32);
        assert_eq!(wc.wc_flags & WARPSOCK_WC_SOLICITED, WARPSOCK_WC_SOLICITED);
        assert_eq!(read(inbox, 0, wc.byte_len as usize), b"wrote it");
        assert_eq!(read(exposed, 0, 5), b"warp!");
        // Second Send: the client is done reading.
        let wc = s.wait();
        assert_eq!(
            (wc.wr_id, wc.status),
            (6, warpsock_wc_status::Success as u32)
        );
        assert_eq!(read(inbox2, 0, wc.byte_len as usize), b"bye");
        let mut ev = warpsock_event::default();
        ok(warpsock_qp_poll_event(qp, &mut ev));
        assert_eq!(ev.kind, warpsock_event_kind::Established as u32);
        warpsock_qp_free(qp);
        warpsock_mr_free(exposed);
        warpsock_mr_free(inbox);
        warpsock_mr_free(inbox2);
        warpsock_listener_free(l.0);
    });

    let c = Side::new(warpsock_progress::Caller);
    let mut cfg = null_mut();
    ok(warpsock_qp_config_new(&mut cfg));
    ok(warpsock_qp_config_set_private_data(cfg, b"hi".as_ptr(), 2));
    ok(warpsock_qp_config_set_depths(cfg, 4, 4));
    let addr = CString::new(format!("127.0.0.1:{port}")).unwrap();
    let mut qp = null_mut();
    ok(warpsock_qp_connect(
        addr.as_ptr(),
        c.pd,
        c.cq,
        c.cq,
        cfg,
        &mut qp,
    ));
    warpsock_qp_config_free(cfg);
    assert_eq!(warpsock_qp_get_state(qp), warpsock_qp_state::Rts as u32);
    assert!(!warpsock_qp_is_closed(qp));

    let mut neg = warpsock_negotiated::default();
    ok(warpsock_qp_negotiated(qp, &mut neg));
    assert_eq!((neg.revision, neg.peer_private_data_len), (2, 12));
    let mut advert = [0u8; 12];
    let mut n = 0;
    let mut tiny = [0u8; 4];
    assert_eq!(
        warpsock_qp_peer_private_data(qp, tiny.as_mut_ptr(), tiny.len(), &mut n),
        warpsock_result::InsufficientSize
    );
    ok(warpsock_qp_peer_private_data(
        qp,
        advert.as_mut_ptr(),
        12,
        &mut n,
    ));
    let raddr = u64::from_be_bytes(advert[..8].try_into().unwrap());
    let rkey = u32::from_be_bytes(advert[8..].try_into().unwrap());
    let mut name = [0 as c_char; 64];
    ok(warpsock_qp_peer_addr(
        qp,
        name.as_mut_ptr(),
        name.len(),
        &mut n,
    ));
    // SAFETY: NUL-terminated by warpsock_qp_peer_addr.
    let peer = unsafe { CStr::from_ptr(name.as_ptr()) };
    assert_eq!(peer.to_str().unwrap(), addr.to_str().unwrap());

    // Caller memory for the Write source.
    let mut src = *b"warp!";
    let mut src_mr = null_mut();
    ok(warpsock_mr_register(
        c.pd,
        src.as_mut_ptr().cast(),
        5,
        0,
        &mut src_mr,
    ));
    let src_sge = sge(src_mr, 0, 5);
    let write = warpsock_send_wr {
        wr_id: 1,
        opcode: warpsock_wr_opcode::RdmaWrite as u32,
        send_flags: WARPSOCK_SEND_SIGNALED,
        sg_list: &src_sge,
        num_sge: 1,
        remote_addr: raddr,
        rkey,
        invalidate_rkey: 0,
    };
    ok(warpsock_qp_post_send(qp, &write));
    let note = c.alloc(16, 0);
    ok(warpsock_mr_write(note, 0, b"wrote it".as_ptr(), 8));
    let note_sge = sge(note, 0, 8);
    let send = warpsock_send_wr {
        wr_id: 2,
        opcode: warpsock_wr_opcode::Send as u32,
        send_flags: WARPSOCK_SEND_SIGNALED | WARPSOCK_SEND_SOLICITED,
        sg_list: &note_sge,
        num_sge: 1,
        ..write
    };
    ok(warpsock_qp_post_send(qp, &send));
    // Malformed requests are refused at post time.
    let bad = warpsock_send_wr { opcode: 42, ..send };
    assert_eq!(
        warpsock_qp_post_send(qp, &bad),
        warpsock_result::InvalidWorkRequest
    );
    let bad = warpsock_send_wr {
        send_flags: 0x80,
        ..send
    };
    assert_eq!(
        warpsock_qp_post_send(qp, &bad),
        warpsock_result::InvalidWorkRequest
    );
    let bad = warpsock_send_wr {
        sg_list: null(),
        num_sge: 1,
        ..send
    };
    assert_eq!(
        warpsock_qp_post_send(qp, &bad),
        warpsock_result::NullParameter
    );
    let mut wcs = [warpsock_wc::default(); 4];
    let mut got = 0;
    while got < 2 {
        let mut k = 0;
        ok(warpsock_cq_wait(
            c.cq,
            wcs[got..].as_mut_ptr(),
            4 - got,
            LIMIT_US,
            &mut k,
        ));
        assert!(k > 0, "no completion in time");
        got += k;
    }
    assert_eq!((wcs[0].wr_id, wcs[1].wr_id), (1, 2));
    assert_eq!(wcs[0].opcode, warpsock_wc_opcode::RdmaWrite as u32);
    assert!(wcs[..2]
        .iter()
        .all(|w| w.status == 0 && w.qp_num == warpsock_qp_num(qp)));

    // RDMA Read of the exposed second half.
    let sink = c.alloc(7, WARPSOCK_ACCESS_LOCAL_WRITE);
    let sink_sge = sge(sink, 0, 7);
    let rd = warpsock_send_wr {
        wr_id: 3,
        opcode: warpsock_wr_opcode::RdmaRead as u32,
        send_flags: WARPSOCK_SEND_SIGNALED,
        sg_list: &sink_sge,
        num_sge: 1,
        remote_addr: raddr + 32,
        ..write
    };
    ok(warpsock_qp_post_send(qp, &rd));
    let wc = c.wait();
    assert_eq!((wc.wr_id, wc.status, wc.byte_len), (3, 0, 7));
    assert_eq!(read(sink, 0, 7), b"read me");

    // A receive left posted is flushed by the disconnect.
    let spare = c.alloc(8, WARPSOCK_ACCESS_LOCAL_WRITE);
    let spare_sge = sge(spare, 0, 8);
    ok(warpsock_qp_post_recv(
        qp,
        &warpsock_recv_wr {
            wr_id: 9,
            sg_list: &spare_sge,
            num_sge: 1,
        },
    ));
    ok(warpsock_mr_write(note, 0, b"bye".as_ptr(), 3));
    let bye_sge = sge(note, 0, 3);
    ok(warpsock_qp_post_send(
        qp,
        &warpsock_send_wr {
            wr_id: 4,
            sg_list: &bye_sge,
            ..send
        },
    ));
    assert_eq!(c.wait().wr_id, 4);
    server.join().unwrap();
    ok(warpsock_qp_disconnect(qp));
    let wc = c.wait();
    assert_eq!(wc.wr_id, 9);
    assert_eq!(wc.status, warpsock_wc_status::WrFlushError as u32);
    // The flushed receive and the queue pair say why: we closed it.
    assert_eq!(wc.cause, warpsock_result::ClosedLocally as u32);
    assert_eq!(
        warpsock_qp_close_reason(qp),
        warpsock_result::ClosedLocally as u32
    );
    // A clean disconnect is no socket error.
    assert_eq!(warpsock_qp_socket_errno(qp), 0);
    assert_eq!(warpsock_qp_socket_errno(null()), 0);
    warpsock_qp_free(qp);
    for mr in [src_mr, note, sink, spare] {
        warpsock_mr_free(mr);
    }
}

#[test]
fn reject_reaches_the_initiator_and_queue_depth_is_enforced() {
    let (l, port) = loopback_listener();
    let server = std::thread::spawn(move || {
        let l = l;
        let s = Side::new(warpsock_progress::Caller);
        let mut req = null_mut();
        ok(warpsock_listener_accept(l.0, 10_000, &mut req));
        let long = [0u8; WARPSOCK_MAX_PRIVATE_DATA + 1];
        // Too long: refused, and the request is consumed (closed) anyway.
        assert_eq!(
            warpsock_conn_request_reject(req, long.as_ptr(), long.len()),
            warpsock_result::PrivateDataTooLong
        );
        ok(warpsock_listener_accept(l.0, 10_000, &mut req));
        ok(warpsock_conn_request_reject(req, b"no".as_ptr(), 2));
        ok(warpsock_listener_accept(l.0, 10_000, &mut req));
        let mut qp = null_mut();
        ok(warpsock_conn_request_accept(
            req,
            s.pd,
            s.cq,
            s.cq,
            null(),
            null(),
            0,
            &mut qp,
        ));
        // Hold the connection until the client has tried its posts.
        let mut wc = [warpsock_wc::default()];
        let mut n = 0;
        for _ in 0..1000 {
            ok(warpsock_cq_wait(s.cq, wc.as_mut_ptr(), 1, 10_000, &mut n));
            if warpsock_qp_is_closed(qp) {
                break;
            }
        }
        // The client aborted: the reset is reported as such, with its
        // errno.
        assert_eq!(warpsock_qp_socket_errno(qp), libc::ECONNRESET);
        assert_eq!(
            warpsock_qp_close_reason(qp),
            warpsock_result::PeerReset as u32
        );
        warpsock_qp_free(qp);
        warpsock_listener_free(l.0);
    });

    let c = Side::new(warpsock_progress::Caller);
    let addr = CString::new(format!("127.0.0.1:{port}")).unwrap();
    let mut qp = null_mut();
    // The first request is closed without a reply: the peer closed the
    // connection during setup.
    let r = warpsock_qp_connect(addr.as_ptr(), c.pd, c.cq, c.cq, null(), &mut qp);
    assert_eq!(r, warpsock_result::PeerClosed);
    let r = warpsock_qp_connect(addr.as_ptr(), c.pd, c.cq, c.cq, null(), &mut qp);
    assert_eq!(r, warpsock_result::Rejected);
    assert!(qp.is_null());

    let mut cfg = null_mut();
    ok(warpsock_qp_config_new(&mut cfg));
    ok(warpsock_qp_config_set_depths(cfg, 1, 1));
    ok(warpsock_qp_connect(
        addr.as_ptr(),
        c.pd,
        c.cq,
        c.cq,
        cfg,
        &mut qp,
    ));
    warpsock_qp_config_free(cfg);
    let buf = c.alloc(8, WARPSOCK_ACCESS_LOCAL_WRITE);
    let s = sge(buf, 0, 8);
    let rwr = warpsock_recv_wr {
        wr_id: 1,
        sg_list: &s,
        num_sge: 1,
    };
    ok(warpsock_qp_post_recv(qp, &rwr));
    assert_eq!(warpsock_qp_post_recv(qp, &rwr), warpsock_result::QueueFull);
    warpsock_qp_abort(qp);
    warpsock_mr_free(buf);
    server.join().unwrap();
}
