//! Queue pair configuration: the options and initial receives that
//! `warpsock_qp_connect` and `warpsock_conn_request_accept` read.

use std::time::Duration;

use warpsock_engine::{QpInit, QpOptions, RecvWr, Sge, MAX_PRIVATE_DATA};

use crate::context::warpsock_pd;
use crate::cq::warpsock_cq;
use crate::error::{fail, warpsock_result};
use crate::ffi::{
    to_boxed_mut_ptr, try_from, try_mut_from_ptr, try_out, try_slice, try_take, Castable,
};
use crate::panic::ffi_panic_boundary;
use crate::wr::warpsock_recv_wr;

/// Queue pair options and the receives to post before the connection goes
/// live; passed to `warpsock_qp_connect` and `warpsock_conn_request_accept`
/// and only read by them, so one configuration may serve many queue pairs.
/// Not thread-safe: do not change it while another thread uses it.
pub struct warpsock_qp_config {
    _private: [u8; 0],
}

/// What a `warpsock_qp_config` holds.
#[derive(Debug, Clone, Default)]
pub(crate) struct QpConfig {
    pub(crate) options: QpOptions,
    pub(crate) recvs: Vec<RecvWr>,
}

impl Castable for warpsock_qp_config {
    type RustType = QpConfig;
}

fn ms(v: u64) -> Duration {
    Duration::from_millis(v)
}

/// The body every setter that cannot fail shares: a NULL handle is
/// `WARPSOCK_RESULT_NULL_PARAMETER`, a panic stays inside the boundary,
/// else `set` changes the configuration.
fn update(config: *mut warpsock_qp_config, set: impl FnOnce(&mut QpConfig)) -> warpsock_result {
    ffi_panic_boundary! {
        set(try_mut_from_ptr!(config));
        warpsock_result::Ok
    }
}

/// Creates a queue pair configuration with the defaults: send and receive
/// queues of 1024, CRC off, no markers, IRD = ORD = 16, peer-to-peer RTR
/// offered, no private data, 10 s connect and MPA timeouts, FPDUs sized to
/// the TCP MSS, `TCP_NODELAY`, a 10 s `TCP_USER_TIMEOUT` and keepalive
/// (5 s idle, 1 s interval, 5 probes). Free it with
/// `warpsock_qp_config_free`.
#[no_mangle]
pub extern "C" fn warpsock_qp_config_new(out: *mut *mut warpsock_qp_config) -> warpsock_result {
    ffi_panic_boundary! {
        let out = try_out!(out);
        out.write(to_boxed_mut_ptr(QpConfig::default()));
        warpsock_result::Ok
    }
}

/// Frees a queue pair configuration (NULL is ignored).
#[no_mangle]
pub extern "C" fn warpsock_qp_config_free(config: *mut warpsock_qp_config) {
    ffi_panic_boundary! {
        drop(try_take!(config));
    }
}

/// Sets the send and receive queue depths (outstanding work requests).
///
/// Errors: `WARPSOCK_RESULT_INVALID_PARAMETER` if either is 0.
#[no_mangle]
pub extern "C" fn warpsock_qp_config_set_depths(
    config: *mut warpsock_qp_config,
    sq_depth: usize,
    rq_depth: usize,
) -> warpsock_result {
    ffi_panic_boundary! {
        let c = try_mut_from_ptr!(config);
        if sq_depth == 0 || rq_depth == 0 {
            return fail(warpsock_result::InvalidParameter, "queue depths must be at least 1");
        }
        c.options.sq_depth = sq_depth;
        c.options.rq_depth = rq_depth;
        warpsock_result::Ok
    }
}

/// Asks for CRC32c on every FPDU (it is on if either side asks) and for
/// MPA markers from the peer.
#[no_mangle]
pub extern "C" fn warpsock_qp_config_set_crc_markers(
    config: *mut warpsock_qp_config,
    crc: bool,
    markers: bool,
) -> warpsock_result {
    update(config, |c| {
        c.options.crc = crc;
        c.options.markers = markers;
    })
}

/// Sets the inbound RDMA Read depth offered (`ird`) and the outbound depth
/// wanted (`ord`).
#[no_mangle]
pub extern "C" fn warpsock_qp_config_set_ird_ord(
    config: *mut warpsock_qp_config,
    ird: u16,
    ord: u16,
) -> warpsock_result {
    update(config, |c| {
        c.options.ird = ird;
        c.options.ord = ord;
    })
}

/// Initiator: offer peer-to-peer setup with a zero-length RDMA Write as
/// ready-to-receive (RFC 6581), so the responder may send first (default
/// on).
#[no_mangle]
pub extern "C" fn warpsock_qp_config_set_peer_to_peer(
    config: *mut warpsock_qp_config,
    on: bool,
) -> warpsock_result {
    update(config, |c| c.options.peer_to_peer = on)
}

/// Initiator: private data for the MPA Request (copied; at most
/// `WARPSOCK_MAX_PRIVATE_DATA` bytes; `data` may be NULL when `len` is 0).
///
/// Errors: `WARPSOCK_RESULT_PRIVATE_DATA_TOO_LONG` (nothing changes).
#[no_mangle]
pub extern "C" fn warpsock_qp_config_set_private_data(
    config: *mut warpsock_qp_config,
    data: *const u8,
    len: usize,
) -> warpsock_result {
    ffi_panic_boundary! {
        let c = try_mut_from_ptr!(config);
        let data = try_slice!(data, len);
        if let Err(e) = check_private_data(data) {
            return e;
        }
        c.options.private_data = data.to_vec();
        warpsock_result::Ok
    }
}

/// Sets the TCP connect timeout and how long to wait for the peer's MPA
/// Request or Reply, in milliseconds (0 keeps the current value).
#[no_mangle]
pub extern "C" fn warpsock_qp_config_set_timeouts(
    config: *mut warpsock_qp_config,
    connect_ms: u64,
    mpa_ms: u64,
) -> warpsock_result {
    ffi_panic_boundary! {
        let c = try_mut_from_ptr!(config);
        if connect_ms != 0 {
            c.options.connect_timeout = ms(connect_ms);
        }
        if mpa_ms != 0 {
            c.options.mpa_timeout = ms(mpa_ms);
        }
        warpsock_result::Ok
    }
}

/// Sets the largest ULPDU per FPDU in bytes; 0 sizes FPDUs to the TCP MSS
/// (one FPDU per segment, as Linux siw does). Values are clamped to what
/// MPA allows.
#[no_mangle]
pub extern "C" fn warpsock_qp_config_set_mulpdu(
    config: *mut warpsock_qp_config,
    mulpdu: usize,
) -> warpsock_result {
    update(config, |c| {
        c.options.mulpdu = (mulpdu != 0).then_some(mulpdu);
    })
}

/// Sets TCP options: `TCP_NODELAY`, `TCP_USER_TIMEOUT` in milliseconds
/// (unacknowledged data older than this kills the connection, so a dead
/// peer flushes every request in bounded time; 0 leaves the kernel
/// default), and `SO_SNDBUF`/`SO_RCVBUF` in bytes (0: the kernel's
/// autotuning).
#[no_mangle]
pub extern "C" fn warpsock_qp_config_set_tcp(
    config: *mut warpsock_qp_config,
    nodelay: bool,
    user_timeout_ms: u64,
    send_buffer: usize,
    recv_buffer: usize,
) -> warpsock_result {
    update(config, |c| {
        let t = &mut c.options.tcp;
        t.nodelay = nodelay;
        t.user_timeout = ms(user_timeout_ms);
        t.send_buffer = (send_buffer != 0).then_some(send_buffer);
        t.recv_buffer = (recv_buffer != 0).then_some(recv_buffer);
    })
}

/// Sets TCP keepalive: idle time before the first probe and the probe
/// interval in milliseconds, and the unanswered probes before the
/// connection is dropped. `idle_ms` 0 disables keepalive.
#[no_mangle]
pub extern "C" fn warpsock_qp_config_set_keepalive(
    config: *mut warpsock_qp_config,
    idle_ms: u64,
    interval_ms: u64,
    count: u32,
) -> warpsock_result {
    update(config, |c| {
        let t = &mut c.options.tcp;
        t.keepalive_idle = ms(idle_ms);
        t.keepalive_interval = ms(interval_ms);
        t.keepalive_count = count;
    })
}

/// Adds a receive to post on every queue pair made with this configuration
/// before its connection goes live (before the MPA Reply is sent, or before
/// the initiator's first FPDU), so a Send the peer issues right after setup
/// always finds a buffer. The scatter list is copied.
#[no_mangle]
pub extern "C" fn warpsock_qp_config_add_recv(
    config: *mut warpsock_qp_config,
    wr: *const warpsock_recv_wr,
) -> warpsock_result {
    ffi_panic_boundary! {
        let c = try_mut_from_ptr!(config);
        // SAFETY: `wr` is NULL or points to a valid `warpsock_recv_wr`
        // (this function's contract); it is only read.
        let Some(wr) = (unsafe { wr.as_ref() }) else {
            return warpsock_result::NullParameter;
        };
        let sgl = try_slice!(wr.sg_list, wr.num_sge);
        c.recvs.push(RecvWr {
            wr_id: wr.wr_id,
            sgl: sgl.iter().map(Sge::from).collect(),
        });
        warpsock_result::Ok
    }
}

/// Removes every receive added with `warpsock_qp_config_add_recv`.
#[no_mangle]
pub extern "C" fn warpsock_qp_config_clear_recvs(
    config: *mut warpsock_qp_config,
) -> warpsock_result {
    update(config, |c| c.recvs.clear())
}

pub(crate) fn check_private_data(data: &[u8]) -> Result<(), warpsock_result> {
    if data.len() > MAX_PRIVATE_DATA {
        return Err(fail(
            warpsock_result::PrivateDataTooLong,
            format_args!(
                "private data of {} bytes is too long (at most {MAX_PRIVATE_DATA} bytes)",
                data.len()
            ),
        ));
    }
    Ok(())
}

/// The engine's [`QpInit`] from C arguments; `None` when a handle is NULL.
pub(crate) fn qp_init<'a>(
    pd: *const warpsock_pd,
    send_cq: *const warpsock_cq,
    recv_cq: *const warpsock_cq,
    config: *const warpsock_qp_config,
    defaults: &'a QpConfig,
) -> Option<QpInit<'a>> {
    // SAFETY: the calling extern functions document that these handles are
    // NULL or live, and that the configuration is not changed during the
    // call; the borrows end with the call.
    let (pd, send_cq, recv_cq) = unsafe { (try_from(pd)?, try_from(send_cq)?, try_from(recv_cq)?) };
    let cfg = if config.is_null() {
        defaults
    } else {
        // SAFETY: as above.
        unsafe { try_from(config)? }
    };
    Some(QpInit {
        pd,
        send_cq,
        recv_cq,
        options: cfg.options.clone(),
        recvs: cfg.recvs.clone(),
    })
}
