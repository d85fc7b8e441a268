//! The hand-written ABI ([`crate::abi`], [`crate::abi_cm`]) against the
//! installed rdma-core headers: a C program (tests/c/abi_layout.c) prints
//! every size, offset and constant the interposer relies on, compiled
//! against `<infiniband/verbs.h>` and `<rdma/rdma_cma.h>`; each must equal
//! the Rust definition. Needs a C compiler and libibverbs-dev/librdmacm-dev
//! (scripts/test.sh installs them and sets WARPSOCK_REQUIRE_RDMA_HEADERS=1,
//! which turns their absence into a failure instead of a skip).

use std::collections::BTreeMap;
use std::mem::{offset_of, size_of};
use std::process::Command;

use crate::abi::*;
use crate::abi_cm::*;

fn c_layout() -> Option<BTreeMap<String, i64>> {
    let src = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/c/abi_layout.c");
    let exe = std::env::temp_dir().join(format!("warpsock-abi-layout-{}", std::process::id()));
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let out = Command::new(&cc).arg("-o").arg(&exe).arg(src).output();
    let ok = matches!(&out, Ok(o) if o.status.success());
    if !ok {
        let why = match out {
            Ok(o) => String::from_utf8_lossy(&o.stderr).into_owned(),
            Err(e) => e.to_string(),
        };
        assert!(
            std::env::var_os("WARPSOCK_REQUIRE_RDMA_HEADERS").is_none(),
            "cannot build the layout probe with {cc} (install libibverbs-dev librdmacm-dev): {why}"
        );
        eprintln!("skipped: cannot build the layout probe ({why})");
        return None;
    }
    let run = Command::new(&exe).output().expect("run the layout probe");
    let _ = std::fs::remove_file(&exe);
    let text = String::from_utf8(run.stdout).expect("utf-8");
    Some(
        text.lines()
            .map(|l| {
                let mut f = l.split_whitespace();
                let (kind, name, v) = (f.next().unwrap(), f.next().unwrap(), f.next().unwrap());
                (format!("{kind} {name}"), v.parse().unwrap())
            })
            .collect(),
    )
}

macro_rules! expect {
    ($m:ident; $($key:literal => $v:expr,)*) => {
        $( $m.insert($key.to_string(), ($v) as i64); )*
    };
}

#[test]
fn rust_layout_matches_the_installed_headers() {
    let Some(c) = c_layout() else { return };
    let mut r: BTreeMap<String, i64> = BTreeMap::new();
    let vp = offset_of!(verbs_context, ops);
    expect! { r;
        "sizeof ibv_device" => size_of::<ibv_device>(),
        "offsetof ibv_device.node_type" => offset_of!(ibv_device, node_type),
        "offsetof ibv_device.transport_type" => offset_of!(ibv_device, transport_type),
        "offsetof ibv_device.name" => offset_of!(ibv_device, name),
        "offsetof ibv_device.dev_name" => offset_of!(ibv_device, dev_name),
        "offsetof ibv_device.dev_path" => offset_of!(ibv_device, dev_path),
        "offsetof ibv_device.ibdev_path" => offset_of!(ibv_device, ibdev_path),
        "sizeof ibv_context_ops" => size_of::<ibv_context_ops>(),
        "offsetof ibv_context_ops.poll_cq" => offset_of!(ibv_context_ops, poll_cq),
        "offsetof ibv_context_ops.req_notify_cq" => offset_of!(ibv_context_ops, req_notify_cq),
        "offsetof ibv_context_ops.post_srq_recv" => offset_of!(ibv_context_ops, post_srq_recv),
        "offsetof ibv_context_ops.post_send" => offset_of!(ibv_context_ops, post_send),
        "offsetof ibv_context_ops.post_recv" => offset_of!(ibv_context_ops, post_recv),
        "sizeof ibv_context" => size_of::<ibv_context>(),
        "offsetof ibv_context.ops" => offset_of!(ibv_context, ops),
        "offsetof ibv_context.cmd_fd" => offset_of!(ibv_context, cmd_fd),
        "offsetof ibv_context.async_fd" => offset_of!(ibv_context, async_fd),
        "offsetof ibv_context.num_comp_vectors" => offset_of!(ibv_context, num_comp_vectors),
        "offsetof ibv_context.mutex" => offset_of!(ibv_context, mutex),
        "offsetof ibv_context.abi_compat" => offset_of!(ibv_context, abi_compat),
        "sizeof verbs_context" => size_of::<verbs_context>(),
        "offsetof verbs_context.query_port" => vp + VCTX_QUERY_PORT * 8,
        "offsetof verbs_context.create_cq_ex" => vp + VCTX_CREATE_CQ_EX * 8,
        "offsetof verbs_context.query_device_ex" => vp + VCTX_QUERY_DEVICE_EX * 8,
        "offsetof verbs_context.sz" => offset_of!(verbs_context, sz),
        "offsetof verbs_context.context" => offset_of!(verbs_context, context),
        "sizeof ibv_pd" => size_of::<ibv_pd>(),
        "sizeof ibv_mr" => size_of::<ibv_mr>(),
        "offsetof ibv_mr.lkey" => offset_of!(ibv_mr, lkey),
        "offsetof ibv_mr.rkey" => offset_of!(ibv_mr, rkey),
        "sizeof ibv_comp_channel" => size_of::<ibv_comp_channel>(),
        "offsetof ibv_comp_channel.fd" => offset_of!(ibv_comp_channel, fd),
        "sizeof ibv_cq" => size_of::<ibv_cq>(),
        "offsetof ibv_cq.cqe" => offset_of!(ibv_cq, cqe),
        "offsetof ibv_cq.mutex" => offset_of!(ibv_cq, mutex),
        "offsetof ibv_cq.comp_events_completed" => offset_of!(ibv_cq, comp_events_completed),
        "sizeof ibv_srq" => size_of::<ibv_srq>(),
        "sizeof ibv_qp" => size_of::<ibv_qp>(),
        "offsetof ibv_qp.qp_num" => offset_of!(ibv_qp, qp_num),
        "offsetof ibv_qp.state" => offset_of!(ibv_qp, state),
        "offsetof ibv_qp.mutex" => offset_of!(ibv_qp, mutex),
        "offsetof ibv_qp.events_completed" => offset_of!(ibv_qp, events_completed),
        "sizeof ibv_sge" => size_of::<ibv_sge>(),
        "sizeof ibv_send_wr" => size_of::<ibv_send_wr>(),
        "offsetof ibv_send_wr.num_sge" => offset_of!(ibv_send_wr, num_sge),
        "offsetof ibv_send_wr.opcode" => offset_of!(ibv_send_wr, opcode),
        "offsetof ibv_send_wr.send_flags" => offset_of!(ibv_send_wr, send_flags),
        "offsetof ibv_send_wr.invalidate_rkey" => offset_of!(ibv_send_wr, invalidate_rkey),
        "offsetof ibv_send_wr.wr.rdma.remote_addr" => offset_of!(ibv_send_wr, rdma.remote_addr),
        "offsetof ibv_send_wr.wr.rdma.rkey" => offset_of!(ibv_send_wr, rdma.rkey),
        "offsetof ibv_send_wr.qp_type" => offset_of!(ibv_send_wr, qp_type),
        "offsetof ibv_send_wr.bind_mw" => offset_of!(ibv_send_wr, bind_mw),
        "sizeof ibv_recv_wr" => size_of::<ibv_recv_wr>(),
        "offsetof ibv_recv_wr.num_sge" => offset_of!(ibv_recv_wr, num_sge),
        "sizeof ibv_wc" => size_of::<ibv_wc>(),
        "offsetof ibv_wc.status" => offset_of!(ibv_wc, status),
        "offsetof ibv_wc.opcode" => offset_of!(ibv_wc, opcode),
        "offsetof ibv_wc.byte_len" => offset_of!(ibv_wc, byte_len),
        "offsetof ibv_wc.invalidated_rkey" => offset_of!(ibv_wc, invalidated_rkey),
        "offsetof ibv_wc.qp_num" => offset_of!(ibv_wc, qp_num),
        "offsetof ibv_wc.wc_flags" => offset_of!(ibv_wc, wc_flags),
        "offsetof ibv_wc.sl" => offset_of!(ibv_wc, sl),
        "sizeof ibv_qp_cap" => size_of::<ibv_qp_cap>(),
        "sizeof ibv_qp_init_attr" => size_of::<ibv_qp_init_attr>(),
        "offsetof ibv_qp_init_attr.cap" => offset_of!(ibv_qp_init_attr, cap),
        "offsetof ibv_qp_init_attr.qp_type" => offset_of!(ibv_qp_init_attr, qp_type),
        "offsetof ibv_qp_init_attr.sq_sig_all" => offset_of!(ibv_qp_init_attr, sq_sig_all),
        "offsetof ibv_qp_init_attr_ex.comp_mask" => QP_INIT_ATTR_EX_COMP_MASK,
        "offsetof ibv_qp_init_attr_ex.pd" => QP_INIT_ATTR_EX_PD,
        "sizeof ibv_ah_attr" => size_of::<ibv_ah_attr>(),
        "sizeof ibv_qp_attr" => size_of::<ibv_qp_attr>(),
        "offsetof ibv_qp_attr.qp_access_flags" => offset_of!(ibv_qp_attr, qp_access_flags),
        "offsetof ibv_qp_attr.cap" => offset_of!(ibv_qp_attr, cap),
        "offsetof ibv_qp_attr.ah_attr" => offset_of!(ibv_qp_attr, ah_attr),
        "offsetof ibv_qp_attr.pkey_index" => offset_of!(ibv_qp_attr, pkey_index),
        "offsetof ibv_qp_attr.max_rd_atomic" => offset_of!(ibv_qp_attr, max_rd_atomic),
        "offsetof ibv_qp_attr.max_dest_rd_atomic" => offset_of!(ibv_qp_attr, max_dest_rd_atomic),
        "offsetof ibv_qp_attr.port_num" => offset_of!(ibv_qp_attr, port_num),
        "offsetof ibv_qp_attr.rate_limit" => offset_of!(ibv_qp_attr, rate_limit),
        "sizeof ibv_device_attr" => size_of::<ibv_device_attr>(),
        "offsetof ibv_device_attr.max_qp_wr" => offset_of!(ibv_device_attr, max_qp_wr),
        "offsetof ibv_device_attr.max_sge_rd" => offset_of!(ibv_device_attr, max_sge_rd),
        "offsetof ibv_device_attr.atomic_cap" => offset_of!(ibv_device_attr, atomic_cap),
        "offsetof ibv_device_attr.max_srq" => offset_of!(ibv_device_attr, max_srq),
        "offsetof ibv_device_attr.phys_port_cnt" => offset_of!(ibv_device_attr, phys_port_cnt),
        "sizeof ibv_port_attr" => size_of::<ibv_port_attr>(),
        "offsetof ibv_port_attr.link_layer" => offset_of!(ibv_port_attr, link_layer),
        "offsetof ibv_port_attr.flags" => offset_of!(ibv_port_attr, flags),
        "offsetof ibv_port_attr.port_cap_flags2" => offset_of!(ibv_port_attr, port_cap_flags2),
        "sizeof ibv_gid_entry" => size_of::<ibv_gid_entry>(),
        "sizeof ibv_async_event" => size_of::<ibv_async_event>(),
        "offsetof ibv_async_event.event_type" => offset_of!(ibv_async_event, event_type),
        "sizeof ibv_srq_init_attr" => size_of::<ibv_srq_init_attr>(),
        "sizeof rdma_event_channel" => size_of::<rdma_event_channel>(),
        "sizeof rdma_addr" => size_of::<rdma_addr>(),
        "sizeof rdma_route" => size_of::<rdma_route>(),
        "sizeof rdma_cm_id" => size_of::<rdma_cm_id>(),
        "offsetof rdma_cm_id.route" => offset_of!(rdma_cm_id, route),
        "offsetof rdma_cm_id.ps" => offset_of!(rdma_cm_id, ps),
        "offsetof rdma_cm_id.event" => offset_of!(rdma_cm_id, event),
        "offsetof rdma_cm_id.pd" => offset_of!(rdma_cm_id, pd),
        "offsetof rdma_cm_id.qp_type" => offset_of!(rdma_cm_id, qp_type),
        "sizeof rdma_conn_param" => size_of::<rdma_conn_param>(),
        "offsetof rdma_conn_param.qp_num" => offset_of!(rdma_conn_param, qp_num),
        "sizeof rdma_cm_event" => size_of::<rdma_cm_event>(),
        "offsetof rdma_cm_event.param" => offset_of!(rdma_cm_event, param),
        "sizeof rdma_addrinfo" => size_of::<rdma_addrinfo>(),
        "offsetof rdma_addrinfo.ai_src_addr" => offset_of!(rdma_addrinfo, ai_src_addr),
        "offsetof rdma_addrinfo.ai_next" => offset_of!(rdma_addrinfo, ai_next),
        "const IBV_NODE_RNIC" => IBV_NODE_RNIC,
        "const IBV_TRANSPORT_IWARP" => IBV_TRANSPORT_IWARP,
        "const IBV_QPS_RESET" => IBV_QPS_RESET,
        "const IBV_QPS_INIT" => IBV_QPS_INIT,
        "const IBV_QPS_RTR" => IBV_QPS_RTR,
        "const IBV_QPS_RTS" => IBV_QPS_RTS,
        "const IBV_QPS_SQD" => IBV_QPS_SQD,
        "const IBV_QPS_SQE" => IBV_QPS_SQE,
        "const IBV_QPS_ERR" => IBV_QPS_ERR,
        "const IBV_QPT_RC" => IBV_QPT_RC,
        "const IBV_QP_STATE" => IBV_QP_STATE,
        "const IBV_QP_CUR_STATE" => IBV_QP_CUR_STATE,
        "const IBV_QP_ACCESS_FLAGS" => IBV_QP_ACCESS_FLAGS,
        "const IBV_QP_PORT" => IBV_QP_PORT,
        "const IBV_QP_MAX_QP_RD_ATOMIC" => IBV_QP_MAX_QP_RD_ATOMIC,
        "const IBV_QP_MAX_DEST_RD_ATOMIC" => IBV_QP_MAX_DEST_RD_ATOMIC,
        "const IBV_QP_CAP" => IBV_QP_CAP,
        "const IBV_ACCESS_LOCAL_WRITE" => IBV_ACCESS_LOCAL_WRITE,
        "const IBV_ACCESS_REMOTE_WRITE" => IBV_ACCESS_REMOTE_WRITE,
        "const IBV_ACCESS_REMOTE_READ" => IBV_ACCESS_REMOTE_READ,
        "const IBV_ACCESS_REMOTE_ATOMIC" => IBV_ACCESS_REMOTE_ATOMIC,
        "const IBV_ACCESS_MW_BIND" => IBV_ACCESS_MW_BIND,
        "const IBV_ACCESS_ZERO_BASED" => IBV_ACCESS_ZERO_BASED,
        "const IBV_ACCESS_ON_DEMAND" => IBV_ACCESS_ON_DEMAND,
        "const IBV_ACCESS_HUGETLB" => IBV_ACCESS_HUGETLB,
        "const IBV_ACCESS_OPTIONAL_RANGE" => IBV_ACCESS_OPTIONAL_RANGE,
        "const IBV_WR_RDMA_WRITE" => IBV_WR_RDMA_WRITE,
        "const IBV_WR_RDMA_WRITE_WITH_IMM" => IBV_WR_RDMA_WRITE_WITH_IMM,
        "const IBV_WR_SEND" => IBV_WR_SEND,
        "const IBV_WR_SEND_WITH_IMM" => IBV_WR_SEND_WITH_IMM,
        "const IBV_WR_RDMA_READ" => IBV_WR_RDMA_READ,
        "const IBV_WR_SEND_WITH_INV" => IBV_WR_SEND_WITH_INV,
        "const IBV_SEND_FENCE" => IBV_SEND_FENCE,
        "const IBV_SEND_SIGNALED" => IBV_SEND_SIGNALED,
        "const IBV_SEND_SOLICITED" => IBV_SEND_SOLICITED,
        "const IBV_SEND_INLINE" => IBV_SEND_INLINE,
        "const IBV_WC_SUCCESS" => IBV_WC_SUCCESS,
        "const IBV_WC_LOC_LEN_ERR" => IBV_WC_LOC_LEN_ERR,
        "const IBV_WC_LOC_QP_OP_ERR" => IBV_WC_LOC_QP_OP_ERR,
        "const IBV_WC_LOC_PROT_ERR" => IBV_WC_LOC_PROT_ERR,
        "const IBV_WC_WR_FLUSH_ERR" => IBV_WC_WR_FLUSH_ERR,
        "const IBV_WC_REM_ACCESS_ERR" => IBV_WC_REM_ACCESS_ERR,
        "const IBV_WC_REM_OP_ERR" => IBV_WC_REM_OP_ERR,
        "const IBV_WC_FATAL_ERR" => IBV_WC_FATAL_ERR,
        "const IBV_WC_GENERAL_ERR" => IBV_WC_GENERAL_ERR,
        "const IBV_WC_SEND" => IBV_WC_SEND,
        "const IBV_WC_RDMA_WRITE" => IBV_WC_RDMA_WRITE,
        "const IBV_WC_RDMA_READ" => IBV_WC_RDMA_READ,
        "const IBV_WC_RECV" => IBV_WC_RECV,
        "const IBV_WC_WITH_INV" => IBV_WC_WITH_INV,
        "const IBV_EVENT_CQ_ERR" => IBV_EVENT_CQ_ERR,
        "const IBV_EVENT_QP_FATAL" => IBV_EVENT_QP_FATAL,
        "const IBV_EVENT_COMM_EST" => IBV_EVENT_COMM_EST,
        "const IBV_PORT_ACTIVE" => IBV_PORT_ACTIVE,
        "const IBV_MTU_1024" => IBV_MTU_1024,
        "const IBV_MTU_4096" => IBV_MTU_4096,
        "const IBV_LINK_LAYER_ETHERNET" => IBV_LINK_LAYER_ETHERNET,
        "const IBV_ATOMIC_NONE" => IBV_ATOMIC_NONE,
        "const IBV_GID_TYPE_IB" => IBV_GID_TYPE_IB,
        "const RDMA_CM_EVENT_ADDR_RESOLVED" => RDMA_CM_EVENT_ADDR_RESOLVED,
        "const RDMA_CM_EVENT_ROUTE_RESOLVED" => RDMA_CM_EVENT_ROUTE_RESOLVED,
        "const RDMA_CM_EVENT_CONNECT_REQUEST" => RDMA_CM_EVENT_CONNECT_REQUEST,
        "const RDMA_CM_EVENT_CONNECT_ERROR" => RDMA_CM_EVENT_CONNECT_ERROR,
        "const RDMA_CM_EVENT_UNREACHABLE" => RDMA_CM_EVENT_UNREACHABLE,
        "const RDMA_CM_EVENT_REJECTED" => RDMA_CM_EVENT_REJECTED,
        "const RDMA_CM_EVENT_ESTABLISHED" => RDMA_CM_EVENT_ESTABLISHED,
        "const RDMA_CM_EVENT_DISCONNECTED" => RDMA_CM_EVENT_DISCONNECTED,
        "const RDMA_CM_EVENT_TIMEWAIT_EXIT" => RDMA_CM_EVENT_TIMEWAIT_EXIT,
        "const RDMA_PS_TCP" => RDMA_PS_TCP,
        "const RDMA_PS_UDP" => RDMA_PS_UDP,
        "const RDMA_PS_IB" => RDMA_PS_IB,
        "const RDMA_OPTION_ID" => RDMA_OPTION_ID,
        "const RDMA_OPTION_IB" => RDMA_OPTION_IB,
        "const RDMA_OPTION_ID_TOS" => RDMA_OPTION_ID_TOS,
        "const RDMA_OPTION_ID_REUSEADDR" => RDMA_OPTION_ID_REUSEADDR,
        "const RDMA_OPTION_ID_AFONLY" => RDMA_OPTION_ID_AFONLY,
        "const RDMA_OPTION_ID_ACK_TIMEOUT" => RDMA_OPTION_ID_ACK_TIMEOUT,
        "const RDMA_OPTION_IB_PATH" => RDMA_OPTION_IB_PATH,
        "const RAI_PASSIVE" => RAI_PASSIVE,
        "const RAI_NUMERICHOST" => RAI_NUMERICHOST,
        "const RAI_NOROUTE" => RAI_NOROUTE,
        "const RAI_FAMILY" => RAI_FAMILY,
        "const RDMA_MAX_RESP_RES" => RDMA_MAX_DEPTH,
        "const RDMA_MAX_INIT_DEPTH" => RDMA_MAX_DEPTH,
    }
    let mut diffs = Vec::new();
    for (k, v) in &c {
        match r.get(k) {
            Some(rv) if rv == v => {}
            Some(rv) => diffs.push(format!("{k}: C {v}, Rust {rv}")),
            None => diffs.push(format!("{k}: printed by the probe, not checked here")),
        }
    }
    for k in r.keys().filter(|k| !c.contains_key(*k)) {
        diffs.push(format!("{k}: checked here, not printed by the probe"));
    }
    assert!(diffs.is_empty(), "ABI differences:\n{}", diffs.join("\n"));
}

/// The `cma_id_private` prefix rdma-core's rsockets reads: `cma_dev` right
/// after the public id, `sync` after two pointers and two ints (rdma-core
/// 17..60 `librdmacm/cma.h`).
#[test]
fn cma_id_private_prefix() {
    assert_eq!(offset_of!(CmaIdPrivate, cma_dev), size_of::<rdma_cm_id>());
    assert_eq!(offset_of!(CmaIdPrivate, sync), size_of::<rdma_cm_id>() + 32);
}
