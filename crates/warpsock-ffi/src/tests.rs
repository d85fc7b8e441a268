//! Boundary tests: NULL handles give the NULL-parameter code (or a neutral
//! value), out-parameters stay untouched on failure, every result code has
//! a message, panics stop at the boundary.

use std::ffi::{c_char, CStr};
use std::ptr::{null, null_mut, NonNull};

use super::*;
use crate::panic::ffi_panic_boundary;

/// A pointer no call may write: out-parameters start as this.
fn sentinel<T>() -> *mut T {
    NonNull::dangling().as_ptr()
}

fn cstr(p: *const c_char) -> &'static str {
    assert!(!p.is_null());
    // SAFETY: the string functions return static NUL-terminated strings.
    unsafe { CStr::from_ptr(p) }.to_str().unwrap()
}

fn detail() -> String {
    let mut buf = [0 as c_char; 512];
    let mut n = 0;
    assert_eq!(
        warpsock_last_error_detail(buf.as_mut_ptr(), buf.len(), &mut n),
        warpsock_result::Ok
    );
    cstr(buf.as_ptr()).to_owned()
}

struct Objects {
    ctx: *mut warpsock_context,
    pd: *mut warpsock_pd,
    cq: *mut warpsock_cq,
}

impl Objects {
    fn new() -> Self {
        let (mut ctx, mut pd, mut cq) = (null_mut(), null_mut(), null_mut());
        assert_eq!(
            warpsock_context_new(warpsock_progress::Caller as u32, 0, &mut ctx),
            warpsock_result::Ok
        );
        assert_eq!(warpsock_pd_new(ctx, &mut pd), warpsock_result::Ok);
        assert_eq!(warpsock_cq_new(ctx, 4, &mut cq), warpsock_result::Ok);
        Self { ctx, pd, cq }
    }
}

impl Drop for Objects {
    fn drop(&mut self) {
        warpsock_cq_free(self.cq);
        warpsock_pd_free(self.pd);
        warpsock_context_free(self.ctx);
    }
}

#[test]
fn every_result_code_has_a_message() {
    let mut seen = std::collections::HashSet::new();
    for &r in warpsock_result::ALL {
        assert!(seen.insert(r as u32), "duplicate value {}", r as u32);
        assert_eq!(warpsock_result::from_u32(r as u32), Some(r));
        let s = cstr(warpsock_result_str(r as u32));
        assert!(!s.is_empty() && !s.contains("unknown"), "{r:?}: {s:?}");
        let mut buf = [0x55 as c_char; 256];
        let mut n = usize::MAX;
        assert_eq!(
            warpsock_result_message(r as u32, buf.as_mut_ptr(), buf.len(), &mut n),
            warpsock_result::Ok
        );
        assert_eq!(n, s.len());
        assert_eq!(cstr(buf.as_ptr()), s);
    }
    assert_eq!(warpsock_result::Ok as u32, 0);
    for unknown in [5, 99, 103, 299, 7000, u32::MAX] {
        assert_eq!(warpsock_result::from_u32(unknown), None);
        assert_eq!(
            cstr(warpsock_result_str(unknown)),
            "unknown warpsock result code"
        );
    }
}

#[test]
fn result_codes_keep_their_numbers() {
    // The values are ABI: changing one breaks compiled C programs.
    let expect = [
        (warpsock_result::Ok, 0),
        (warpsock_result::NullParameter, 1),
        (warpsock_result::InvalidParameter, 2),
        (warpsock_result::InsufficientSize, 3),
        (warpsock_result::Panic, 4),
        (warpsock_result::Io, 100),
        (warpsock_result::AddressResolve, 101),
        (warpsock_result::AddressInUse, 102),
        (warpsock_result::ConnectionRefused, 200),
        (warpsock_result::Unreachable, 201),
        (warpsock_result::Timeout, 202),
        (warpsock_result::Rejected, 203),
        (warpsock_result::MpaFailed, 204),
        (warpsock_result::PrivateDataTooLong, 205),
        (warpsock_result::ContextMismatch, 206),
        (warpsock_result::QueueFull, 300),
        (warpsock_result::InvalidWorkRequest, 301),
        (warpsock_result::OutOfBounds, 400),
        (warpsock_result::MemoryLock, 401),
        (warpsock_result::PeerClosed, 500),
        (warpsock_result::PeerReset, 501),
        (warpsock_result::ConnectionTimedOut, 502),
        (warpsock_result::TerminateReceived, 503),
        (warpsock_result::TerminateSent, 504),
        (warpsock_result::LocalError, 505),
        (warpsock_result::ClosedLocally, 506),
    ];
    assert_eq!(expect.len(), warpsock_result::ALL.len());
    for (r, v) in expect {
        assert_eq!(r as u32, v, "{r:?}");
    }
}

#[test]
fn messages_are_cut_to_fit_and_nul_terminated() {
    let full = cstr(warpsock_result_str(warpsock_result::Rejected as u32));
    let mut buf = [0x55 as c_char; 8];
    let mut n = 0;
    assert_eq!(
        warpsock_result_message(
            warpsock_result::Rejected as u32,
            buf.as_mut_ptr(),
            buf.len(),
            &mut n
        ),
        warpsock_result::Ok
    );
    assert_eq!(n, 7);
    assert_eq!(cstr(buf.as_ptr()), &full[..7]);
    // A zero-length buffer may be NULL: nothing is written but the count.
    n = 99;
    assert_eq!(
        warpsock_result_message(0, null_mut(), 0, &mut n),
        warpsock_result::Ok
    );
    assert_eq!(n, 0);
    assert_eq!(
        warpsock_result_message(0, null_mut(), 4, &mut n),
        warpsock_result::NullParameter
    );
    assert_eq!(
        warpsock_result_message(0, buf.as_mut_ptr(), buf.len(), null_mut()),
        warpsock_result::NullParameter
    );
}

#[test]
fn every_wc_status_has_a_message() {
    for &s in warpsock_wc_status::ALL {
        let m = cstr(warpsock_wc_status_str(s as u32));
        assert!(!m.is_empty() && !m.contains("unknown"), "{s:?}");
    }
    assert_eq!(
        cstr(warpsock_wc_status_str(12345)),
        "unknown completion status"
    );
}

#[test]
fn constants_match_the_engine() {
    assert_eq!(WARPSOCK_MAX_PRIVATE_DATA, warpsock_engine::MAX_PRIVATE_DATA);
    use warpsock_engine::Access;
    assert_eq!(WARPSOCK_ACCESS_LOCAL_READ, u32::from(Access::LOCAL_READ.0));
    assert_eq!(
        WARPSOCK_ACCESS_LOCAL_WRITE,
        u32::from(Access::LOCAL_WRITE.0)
    );
    assert_eq!(
        WARPSOCK_ACCESS_REMOTE_WRITE,
        u32::from(Access::REMOTE_WRITE.0)
    );
    assert_eq!(
        WARPSOCK_ACCESS_REMOTE_READ,
        u32::from(Access::REMOTE_READ.0)
    );
    assert_eq!(
        WARPSOCK_ACCESS_REMOTE_INVALIDATE,
        u32::from(Access::REMOTE_INVALIDATE.0)
    );
    assert!(cstr(warpsock_version()).starts_with(env!("CARGO_PKG_VERSION")));
}

#[test]
fn null_handles_give_the_null_parameter_code() {
    use warpsock_result::NullParameter as N;
    let o = Objects::new();
    let mut pd = sentinel();
    let mut cq = sentinel();
    let mut mr = sentinel();
    let mut qp = sentinel();
    let mut l = sentinel();
    let mut req = sentinel();
    let mut n = 7usize;
    let mut wc = [warpsock_wc::default(); 2];
    let mut buf = [0u8; 64];
    let addr = c"127.0.0.1:1".as_ptr();

    assert_eq!(warpsock_context_new(0, 0, null_mut()), N);
    assert_eq!(warpsock_pd_new(null(), &mut pd), N);
    assert_eq!(warpsock_pd_new(o.ctx, null_mut()), N);
    assert_eq!(warpsock_cq_new(null(), 1, &mut cq), N);
    assert_eq!(warpsock_cq_poll(null(), wc.as_mut_ptr(), 2, &mut n), N);
    assert_eq!(warpsock_cq_poll(o.cq, null_mut(), 2, &mut n), N);
    assert_eq!(warpsock_cq_poll(o.cq, wc.as_mut_ptr(), 2, null_mut()), N);
    assert_eq!(warpsock_cq_wait(null(), wc.as_mut_ptr(), 2, 0, &mut n), N);
    assert_eq!(warpsock_cq_wait(o.cq, null_mut(), 1, 0, &mut n), N);
    assert_eq!(warpsock_cq_notify_fd(null(), &mut 0), N);
    assert_eq!(warpsock_cq_notify_fd(o.cq, null_mut()), N);
    assert_eq!(
        warpsock_mr_register(null(), buf.as_mut_ptr().cast(), 4, 0, &mut mr),
        N
    );
    assert_eq!(warpsock_mr_register(o.pd, null_mut(), 4, 0, &mut mr), N);
    assert_eq!(
        warpsock_mr_register(o.pd, buf.as_mut_ptr().cast(), 4, 0, null_mut()),
        N
    );
    assert_eq!(warpsock_mr_alloc(null(), 4, 0, &mut mr), N);
    assert_eq!(warpsock_mr_sge(null(), 0, 0, &mut Default::default()), N);
    assert_eq!(warpsock_mr_read(null(), 0, buf.as_mut_ptr(), 1), N);
    assert_eq!(warpsock_mr_write(null(), 0, buf.as_ptr(), 1), N);
    assert_eq!(warpsock_mr_mlock(null()), N);
    assert_eq!(warpsock_qp_config_new(null_mut()), N);
    assert_eq!(warpsock_qp_config_set_depths(null_mut(), 1, 1), N);
    assert_eq!(
        warpsock_qp_config_set_crc_markers(null_mut(), true, true),
        N
    );
    assert_eq!(warpsock_qp_config_set_ird_ord(null_mut(), 1, 1), N);
    assert_eq!(warpsock_qp_config_set_peer_to_peer(null_mut(), true), N);
    assert_eq!(
        warpsock_qp_config_set_private_data(null_mut(), null(), 0),
        N
    );
    assert_eq!(warpsock_qp_config_set_timeouts(null_mut(), 1, 1), N);
    assert_eq!(warpsock_qp_config_set_mulpdu(null_mut(), 0), N);
    assert_eq!(warpsock_qp_config_set_tcp(null_mut(), true, 0, 0, 0), N);
    assert_eq!(warpsock_qp_config_set_keepalive(null_mut(), 0, 0, 0), N);
    assert_eq!(warpsock_qp_config_add_recv(null_mut(), null()), N);
    assert_eq!(warpsock_qp_config_clear_recvs(null_mut()), N);
    assert_eq!(
        warpsock_qp_connect(null(), o.pd, o.cq, o.cq, null(), &mut qp),
        N
    );
    assert_eq!(
        warpsock_qp_connect(addr, null(), o.cq, o.cq, null(), &mut qp),
        N
    );
    assert_eq!(
        warpsock_qp_connect(addr, o.pd, null(), o.cq, null(), &mut qp),
        N
    );
    assert_eq!(
        warpsock_qp_connect(addr, o.pd, o.cq, null(), null(), &mut qp),
        N
    );
    assert_eq!(
        warpsock_qp_connect(addr, o.pd, o.cq, o.cq, null(), null_mut()),
        N
    );
    assert_eq!(warpsock_qp_disconnect(null()), N);
    assert_eq!(warpsock_qp_post_send(null(), null()), N);
    assert_eq!(warpsock_qp_post_recv(null(), null()), N);
    assert_eq!(warpsock_qp_poll_event(null(), &mut Default::default()), N);
    assert_eq!(warpsock_qp_negotiated(null(), &mut Default::default()), N);
    assert_eq!(
        warpsock_qp_peer_private_data(null(), buf.as_mut_ptr(), 64, &mut n),
        N
    );
    assert_eq!(
        warpsock_qp_local_addr(null(), buf.as_mut_ptr().cast(), 64, &mut n),
        N
    );
    assert_eq!(
        warpsock_qp_peer_addr(null(), buf.as_mut_ptr().cast(), 64, &mut n),
        N
    );
    assert_eq!(warpsock_listener_bind(null(), &mut l), N);
    assert_eq!(warpsock_listener_bind(addr, null_mut()), N);
    assert_eq!(
        warpsock_listener_local_addr(null(), buf.as_mut_ptr().cast(), 64, &mut n),
        N
    );
    assert_eq!(warpsock_listener_port(null(), &mut 0), N);
    assert_eq!(warpsock_listener_set_mpa_timeout(null_mut(), 1), N);
    assert_eq!(warpsock_listener_accept(null(), 0, &mut req), N);
    assert_eq!(
        warpsock_conn_request_private_data(null(), buf.as_mut_ptr(), 64, &mut n),
        N
    );
    assert_eq!(
        warpsock_conn_request_peer_addr(null(), buf.as_mut_ptr().cast(), 64, &mut n),
        N
    );
    assert_eq!(
        warpsock_conn_request_accept(null_mut(), o.pd, o.cq, o.cq, null(), null(), 0, &mut qp),
        N
    );
    assert_eq!(warpsock_conn_request_reject(null_mut(), null(), 0), N);
    assert_eq!(warpsock_last_error_detail(null_mut(), 4, &mut n), N);

    // Getters give neutral values; frees ignore NULL.
    assert_eq!(warpsock_context_progress_mode(null()), 0);
    assert!(!warpsock_context_progress(null()));
    assert_eq!(warpsock_cq_len(null()), 0);
    assert_eq!(warpsock_mr_lkey(null()), 0);
    assert_eq!(warpsock_mr_rkey(null()), 0);
    assert_eq!(warpsock_mr_addr(null()), 0);
    assert_eq!(warpsock_mr_len(null()), 0);
    assert_eq!(warpsock_qp_num(null()), 0);
    assert_eq!(
        warpsock_qp_get_state(null()),
        warpsock_qp_state::Error as u32
    );
    assert!(warpsock_qp_is_closed(null()));
    warpsock_context_free(null_mut());
    warpsock_pd_free(null_mut());
    warpsock_cq_free(null_mut());
    warpsock_mr_free(null_mut());
    warpsock_qp_config_free(null_mut());
    warpsock_qp_free(null_mut());
    warpsock_qp_abort(null_mut());
    warpsock_listener_free(null_mut());
    warpsock_conn_request_free(null_mut());

    // Nothing was written through any out-parameter.
    assert_eq!((pd, cq, mr), (sentinel(), sentinel(), sentinel()));
    assert_eq!((qp, l, req), (sentinel(), sentinel(), sentinel()));
    assert_eq!(n, 7);
    assert_eq!(wc, [warpsock_wc::default(); 2]);
}

#[test]
fn out_parameters_are_untouched_on_failure() {
    let o = Objects::new();

    let mut ctx = sentinel();
    assert_eq!(
        warpsock_context_new(7, 0, &mut ctx),
        warpsock_result::InvalidParameter
    );
    assert_eq!(ctx, sentinel());
    assert!(detail().contains("progress mode 7"), "{}", detail());

    let mut mr = sentinel();
    assert_eq!(
        warpsock_mr_alloc(o.pd, 16, 0x100, &mut mr),
        warpsock_result::InvalidParameter
    );
    assert_eq!(mr, sentinel());

    assert_eq!(
        warpsock_mr_alloc(o.pd, 16, WARPSOCK_ACCESS_LOCAL_WRITE, &mut mr),
        warpsock_result::Ok
    );
    let mut sge = warpsock_sge {
        addr: 1,
        length: 2,
        lkey: 3,
    };
    assert_eq!(
        warpsock_mr_sge(mr, 8, 9, &mut sge),
        warpsock_result::OutOfBounds
    );
    assert_eq!(
        warpsock_mr_sge(mr, usize::MAX, 1, &mut sge),
        warpsock_result::OutOfBounds
    );
    assert_eq!(
        sge,
        warpsock_sge {
            addr: 1,
            length: 2,
            lkey: 3
        }
    );
    let mut dst = [0xAAu8; 4];
    assert_eq!(
        warpsock_mr_read(mr, 14, dst.as_mut_ptr(), 4),
        warpsock_result::OutOfBounds
    );
    assert_eq!(dst, [0xAA; 4]);
    assert_eq!(
        warpsock_mr_write(mr, 0, b"abcd".as_ptr(), 4),
        warpsock_result::Ok
    );
    assert_eq!(
        warpsock_mr_read(mr, 1, dst.as_mut_ptr(), 3),
        warpsock_result::Ok
    );
    assert_eq!(&dst, b"bcd\xAA");
    assert_eq!(warpsock_mr_sge(mr, 8, 8, &mut sge), warpsock_result::Ok);
    assert_eq!(sge.addr, warpsock_mr_addr(mr) + 8);
    assert_eq!((sge.length, sge.lkey), (8, warpsock_mr_lkey(mr)));
    warpsock_mr_free(mr);

    let mut cfg = null_mut();
    assert_eq!(warpsock_qp_config_new(&mut cfg), warpsock_result::Ok);
    let long = [0u8; WARPSOCK_MAX_PRIVATE_DATA + 1];
    assert_eq!(
        warpsock_qp_config_set_private_data(cfg, long.as_ptr(), long.len()),
        warpsock_result::PrivateDataTooLong
    );
    assert_eq!(
        warpsock_qp_config_set_private_data(cfg, long.as_ptr(), WARPSOCK_MAX_PRIVATE_DATA),
        warpsock_result::Ok
    );
    assert_eq!(
        warpsock_qp_config_set_depths(cfg, 0, 4),
        warpsock_result::InvalidParameter
    );

    // Nothing listens on a port we just closed: refused, out untouched.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = std::ffi::CString::new(format!("127.0.0.1:{port}")).unwrap();
    let mut qp = sentinel();
    assert_eq!(
        warpsock_qp_connect(addr.as_ptr(), o.pd, o.cq, o.cq, cfg, &mut qp),
        warpsock_result::ConnectionRefused
    );
    assert_eq!(qp, sentinel());
    assert!(
        detail().contains(&format!("127.0.0.1:{port}")),
        "{}",
        detail()
    );
    warpsock_qp_config_free(cfg);

    // Bad address strings.
    assert_eq!(
        warpsock_qp_connect(c"no port here".as_ptr(), o.pd, o.cq, o.cq, null(), &mut qp),
        warpsock_result::AddressResolve
    );
    let bad_utf8 = [0xFFu8 as c_char, 0];
    assert_eq!(
        warpsock_qp_connect(bad_utf8.as_ptr(), o.pd, o.cq, o.cq, null(), &mut qp),
        warpsock_result::InvalidParameter
    );
    assert_eq!(qp, sentinel());

    // A CQ of another context.
    let other = Objects::new();
    assert_eq!(
        warpsock_qp_connect(addr.as_ptr(), o.pd, other.cq, o.cq, null(), &mut qp),
        warpsock_result::ContextMismatch
    );
    assert_eq!(qp, sentinel());

    // An address in use; a listener's accept that times out.
    let mut l = null_mut();
    assert_eq!(
        warpsock_listener_bind(c"127.0.0.1:0".as_ptr(), &mut l),
        warpsock_result::Ok
    );
    let mut name = [0 as c_char; 64];
    let mut n = 0;
    assert_eq!(
        warpsock_listener_local_addr(l, name.as_mut_ptr(), name.len(), &mut n),
        warpsock_result::Ok
    );
    assert_eq!(n, cstr(name.as_ptr()).len());
    let mut l2 = sentinel();
    assert_eq!(
        warpsock_listener_bind(name.as_ptr(), &mut l2),
        warpsock_result::AddressInUse
    );
    assert_eq!(l2, sentinel());
    let mut small = [0x55 as c_char; 4];
    n = 99;
    assert_eq!(
        warpsock_listener_local_addr(l, small.as_mut_ptr(), small.len(), &mut n),
        warpsock_result::InsufficientSize
    );
    assert_eq!((n, small), (99, [0x55; 4]));
    let mut req = sentinel();
    assert_eq!(
        warpsock_listener_accept(l, 1, &mut req),
        warpsock_result::Timeout
    );
    assert_eq!(req, sentinel());
    assert_eq!(
        warpsock_listener_set_mpa_timeout(l, 0),
        warpsock_result::InvalidParameter
    );
    warpsock_listener_free(l);

    // Nothing to poll: OK with a count of 0; an empty array is fine too.
    let mut wc = [warpsock_wc::default(); 1];
    n = 5;
    assert_eq!(
        warpsock_cq_poll(o.cq, wc.as_mut_ptr(), 1, &mut n),
        warpsock_result::Ok
    );
    assert_eq!(n, 0);
    assert_eq!(
        warpsock_cq_wait(o.cq, null_mut(), 0, 0, &mut n),
        warpsock_result::Ok
    );
    assert_eq!(
        warpsock_cq_wait(o.cq, wc.as_mut_ptr(), 1, 1000, &mut n),
        warpsock_result::Ok
    );
    assert_eq!(n, 0);
}

#[test]
fn panics_stop_at_the_boundary() {
    fn boom(fail: bool) -> warpsock_result {
        ffi_panic_boundary! {
            if fail {
                panic!("deliberate");
            }
            warpsock_result::Ok
        }
    }
    fn boom_u64() -> u64 {
        ffi_panic_boundary! {
            panic!("deliberate")
        }
    }
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    assert_eq!(boom(true), warpsock_result::Panic);
    assert_eq!(boom_u64(), 0);
    std::panic::set_hook(hook);
    assert_eq!(boom(false), warpsock_result::Ok);
}

#[test]
fn handles_may_cross_threads() {
    // The header promises that const-handle calls are thread-safe.
    fn send_sync<T: Send + Sync>() {}
    send_sync::<warpsock_engine::Context>();
    send_sync::<warpsock_engine::Pd>();
    send_sync::<warpsock_engine::Mr>();
    send_sync::<warpsock_engine::Cq>();
    send_sync::<warpsock_engine::Qp>();
    send_sync::<warpsock_engine::Listener>();
    send_sync::<warpsock_engine::ConnectRequest>();
}
