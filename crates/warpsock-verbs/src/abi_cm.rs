//! The librdmacm ABI (rdma-core `librdmacm/rdma_cma.h`, x86-64 Linux),
//! plus the two private fields of rdma-core's `struct cma_id_private` that
//! rdma-core's own rsockets code reads from an id (see [`CmaIdPrivate`]).
//! Checked against the installed header by the unit test in `abi_layout.rs`.
#![allow(non_camel_case_types, missing_docs, clippy::use_self)]

use std::ffi::{c_char, c_int, c_uint, c_void};

use libc::{sockaddr, sockaddr_storage, socklen_t};

use crate::abi::{ibv_comp_channel, ibv_context, ibv_cq, ibv_pd, ibv_qp, ibv_srq};

// enum rdma_cm_event_type
pub const RDMA_CM_EVENT_ADDR_RESOLVED: c_uint = 0;
pub const RDMA_CM_EVENT_ADDR_ERROR: c_uint = 1;
pub const RDMA_CM_EVENT_ROUTE_RESOLVED: c_uint = 2;
pub const RDMA_CM_EVENT_ROUTE_ERROR: c_uint = 3;
pub const RDMA_CM_EVENT_CONNECT_REQUEST: c_uint = 4;
pub const RDMA_CM_EVENT_CONNECT_RESPONSE: c_uint = 5;
pub const RDMA_CM_EVENT_CONNECT_ERROR: c_uint = 6;
pub const RDMA_CM_EVENT_UNREACHABLE: c_uint = 7;
pub const RDMA_CM_EVENT_REJECTED: c_uint = 8;
pub const RDMA_CM_EVENT_ESTABLISHED: c_uint = 9;
pub const RDMA_CM_EVENT_DISCONNECTED: c_uint = 10;
pub const RDMA_CM_EVENT_DEVICE_REMOVAL: c_uint = 11;
pub const RDMA_CM_EVENT_MULTICAST_JOIN: c_uint = 12;
pub const RDMA_CM_EVENT_MULTICAST_ERROR: c_uint = 13;
pub const RDMA_CM_EVENT_ADDR_CHANGE: c_uint = 14;
pub const RDMA_CM_EVENT_TIMEWAIT_EXIT: c_uint = 15;

// enum rdma_port_space
pub const RDMA_PS_IPOIB: c_uint = 0x0002;
pub const RDMA_PS_TCP: c_uint = 0x0106;
pub const RDMA_PS_UDP: c_uint = 0x0111;
pub const RDMA_PS_IB: c_uint = 0x013F;

// rdma_set_option levels and names
pub const RDMA_OPTION_ID: c_int = 0;
pub const RDMA_OPTION_IB: c_int = 1;
pub const RDMA_OPTION_ID_TOS: c_int = 0;
pub const RDMA_OPTION_ID_REUSEADDR: c_int = 1;
pub const RDMA_OPTION_ID_AFONLY: c_int = 2;
pub const RDMA_OPTION_ID_ACK_TIMEOUT: c_int = 3;
pub const RDMA_OPTION_IB_PATH: c_int = 1;

// rdma_addrinfo flags
pub const RAI_PASSIVE: c_int = 1;
pub const RAI_NUMERICHOST: c_int = 2;
pub const RAI_NOROUTE: c_int = 4;
pub const RAI_FAMILY: c_int = 8;

/// `RDMA_MAX_RESP_RES` / `RDMA_MAX_INIT_DEPTH`: "the device's maximum".
pub const RDMA_MAX_DEPTH: u8 = 0xff;

#[repr(C)]
pub struct rdma_event_channel {
    pub fd: c_int,
}

/// `struct rdma_ib_addr` (sgid, dgid, pkey): unused over iWARP.
#[repr(C, align(8))]
#[derive(Clone, Copy)]
pub struct rdma_ib_addr {
    pub raw: [u8; 40],
}

#[repr(C)]
pub struct rdma_addr {
    pub src: sockaddr_storage,
    pub dst: sockaddr_storage,
    pub ibaddr: rdma_ib_addr,
}

#[repr(C)]
pub struct rdma_route {
    pub addr: rdma_addr,
    pub path_rec: *mut c_void,
    pub num_paths: c_int,
}

#[repr(C)]
pub struct rdma_cm_id {
    pub verbs: *mut ibv_context,
    pub channel: *mut rdma_event_channel,
    pub context: *mut c_void,
    pub qp: *mut ibv_qp,
    pub route: rdma_route,
    pub ps: c_uint,
    pub port_num: u8,
    pub event: *mut rdma_cm_event,
    pub send_cq_channel: *mut ibv_comp_channel,
    pub send_cq: *mut ibv_cq,
    pub recv_cq_channel: *mut ibv_comp_channel,
    pub recv_cq: *mut ibv_cq,
    pub srq: *mut ibv_srq,
    pub pd: *mut ibv_pd,
    pub qp_type: c_uint,
}

/// The start of rdma-core's private `struct cma_id_private` (unchanged
/// from rdma-core 17 to 60), which must surround every id this library
/// hands out: rdma-core's rsockets (`rsocket.c`, inside the real
/// librdmacm) calls librdmacm-internal helpers on our ids that read
/// `cma_dev` (`ucma_max_qpsize`: NULL makes it ask every device, through
/// the public calls we interpose) and `sync` (`ucma_complete`: a
/// synchronous id waits for its next event). Nothing else of it is read
/// from outside.
#[repr(C)]
pub struct CmaIdPrivate {
    pub id: rdma_cm_id,
    pub cma_dev: *mut c_void,
    pub connect: *mut c_void,
    pub connect_len: usize,
    pub events_completed: c_int,
    pub connect_error: c_int,
    pub sync: c_int,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct rdma_conn_param {
    pub private_data: *const c_void,
    pub private_data_len: u8,
    pub responder_resources: u8,
    pub initiator_depth: u8,
    pub flow_control: u8,
    pub retry_count: u8,
    pub rnr_retry_count: u8,
    pub srq: u8,
    pub qp_num: u32,
}

/// `param` of `struct rdma_cm_event`: `conn` or `ud` (the larger, 56 bytes).
#[repr(C)]
pub struct rdma_cm_event_param {
    pub conn: rdma_conn_param,
    pub _ud_rest: [u8; 32],
}

#[repr(C)]
pub struct rdma_cm_event {
    pub id: *mut rdma_cm_id,
    pub listen_id: *mut rdma_cm_id,
    pub event: c_uint,
    pub status: c_int,
    pub param: rdma_cm_event_param,
}

#[repr(C)]
pub struct rdma_addrinfo {
    pub ai_flags: c_int,
    pub ai_family: c_int,
    pub ai_qp_type: c_int,
    pub ai_port_space: c_int,
    pub ai_src_len: socklen_t,
    pub ai_dst_len: socklen_t,
    pub ai_src_addr: *mut sockaddr,
    pub ai_dst_addr: *mut sockaddr,
    pub ai_src_canonname: *mut c_char,
    pub ai_dst_canonname: *mut c_char,
    pub ai_route_len: usize,
    pub ai_route: *mut c_void,
    pub ai_connect_len: usize,
    pub ai_connect: *mut c_void,
    pub ai_next: *mut rdma_addrinfo,
}
