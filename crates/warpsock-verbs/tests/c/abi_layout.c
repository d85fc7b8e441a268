/* Prints the layout of the libibverbs/librdmacm structures and the values
 * of the constants warpsock-verbs defines by hand, from the installed
 * headers, one "name value" per line; src/abi_layout.rs compares them with the
 * Rust definitions. */
#include <stddef.h>
#include <stdio.h>
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#define SZ(t) printf("sizeof %s %zu\n", #t, sizeof(struct t))
#define OFF(t, f) printf("offsetof %s.%s %zu\n", #t, #f, offsetof(struct t, f))
#define C(n) printf("const %s %lld\n", #n, (long long)(n))

int main(void)
{
	SZ(ibv_device); OFF(ibv_device, node_type); OFF(ibv_device, transport_type);
	OFF(ibv_device, name); OFF(ibv_device, dev_name); OFF(ibv_device, dev_path); OFF(ibv_device, ibdev_path);
	SZ(ibv_context_ops); OFF(ibv_context_ops, poll_cq); OFF(ibv_context_ops, req_notify_cq);
	OFF(ibv_context_ops, post_srq_recv); OFF(ibv_context_ops, post_send); OFF(ibv_context_ops, post_recv);
	SZ(ibv_context); OFF(ibv_context, ops); OFF(ibv_context, cmd_fd); OFF(ibv_context, async_fd);
	OFF(ibv_context, num_comp_vectors); OFF(ibv_context, mutex); OFF(ibv_context, abi_compat);
	SZ(verbs_context); OFF(verbs_context, query_port); OFF(verbs_context, sz); OFF(verbs_context, context);
	OFF(verbs_context, create_cq_ex); OFF(verbs_context, query_device_ex);
	SZ(ibv_pd); SZ(ibv_mr); OFF(ibv_mr, lkey); OFF(ibv_mr, rkey);
	SZ(ibv_comp_channel); OFF(ibv_comp_channel, fd);
	SZ(ibv_cq); OFF(ibv_cq, cqe); OFF(ibv_cq, mutex); OFF(ibv_cq, comp_events_completed);
	SZ(ibv_srq); SZ(ibv_qp); OFF(ibv_qp, qp_num); OFF(ibv_qp, state); OFF(ibv_qp, mutex); OFF(ibv_qp, events_completed);
	SZ(ibv_sge); SZ(ibv_send_wr); OFF(ibv_send_wr, num_sge); OFF(ibv_send_wr, opcode); OFF(ibv_send_wr, send_flags);
	OFF(ibv_send_wr, invalidate_rkey); OFF(ibv_send_wr, wr.rdma.remote_addr); OFF(ibv_send_wr, wr.rdma.rkey);
	OFF(ibv_send_wr, qp_type); OFF(ibv_send_wr, bind_mw);
	SZ(ibv_recv_wr); OFF(ibv_recv_wr, num_sge);
	SZ(ibv_wc); OFF(ibv_wc, status); OFF(ibv_wc, opcode); OFF(ibv_wc, byte_len); OFF(ibv_wc, invalidated_rkey);
	OFF(ibv_wc, qp_num); OFF(ibv_wc, wc_flags); OFF(ibv_wc, sl);
	SZ(ibv_qp_cap); SZ(ibv_qp_init_attr); OFF(ibv_qp_init_attr, cap); OFF(ibv_qp_init_attr, qp_type); OFF(ibv_qp_init_attr, sq_sig_all);
	OFF(ibv_qp_init_attr_ex, comp_mask); OFF(ibv_qp_init_attr_ex, pd);
	SZ(ibv_ah_attr); SZ(ibv_qp_attr); OFF(ibv_qp_attr, qp_access_flags); OFF(ibv_qp_attr, cap); OFF(ibv_qp_attr, ah_attr);
	OFF(ibv_qp_attr, pkey_index); OFF(ibv_qp_attr, max_rd_atomic); OFF(ibv_qp_attr, max_dest_rd_atomic);
	OFF(ibv_qp_attr, port_num); OFF(ibv_qp_attr, rate_limit);
	SZ(ibv_device_attr); OFF(ibv_device_attr, max_qp_wr); OFF(ibv_device_attr, max_sge_rd); OFF(ibv_device_attr, atomic_cap);
	OFF(ibv_device_attr, max_srq); OFF(ibv_device_attr, phys_port_cnt);
	SZ(ibv_port_attr); OFF(ibv_port_attr, link_layer); OFF(ibv_port_attr, flags); OFF(ibv_port_attr, port_cap_flags2);
	SZ(ibv_gid_entry); SZ(ibv_async_event); OFF(ibv_async_event, event_type); SZ(ibv_srq_init_attr);
	SZ(rdma_event_channel); SZ(rdma_addr); SZ(rdma_route); SZ(rdma_cm_id); OFF(rdma_cm_id, route); OFF(rdma_cm_id, ps);
	OFF(rdma_cm_id, event); OFF(rdma_cm_id, pd); OFF(rdma_cm_id, qp_type);
	SZ(rdma_conn_param); OFF(rdma_conn_param, qp_num); SZ(rdma_cm_event); OFF(rdma_cm_event, param);
	SZ(rdma_addrinfo); OFF(rdma_addrinfo, ai_src_addr); OFF(rdma_addrinfo, ai_next);

	C(IBV_NODE_RNIC); C(IBV_TRANSPORT_IWARP); C(IBV_QPS_RESET); C(IBV_QPS_INIT); C(IBV_QPS_RTR); C(IBV_QPS_RTS);
	C(IBV_QPS_SQD); C(IBV_QPS_SQE); C(IBV_QPS_ERR); C(IBV_QPT_RC);
	C(IBV_QP_STATE); C(IBV_QP_CUR_STATE); C(IBV_QP_ACCESS_FLAGS); C(IBV_QP_PORT); C(IBV_QP_MAX_QP_RD_ATOMIC);
	C(IBV_QP_MAX_DEST_RD_ATOMIC); C(IBV_QP_CAP);
	C(IBV_ACCESS_LOCAL_WRITE); C(IBV_ACCESS_REMOTE_WRITE); C(IBV_ACCESS_REMOTE_READ); C(IBV_ACCESS_REMOTE_ATOMIC);
	C(IBV_ACCESS_MW_BIND); C(IBV_ACCESS_ZERO_BASED); C(IBV_ACCESS_ON_DEMAND); C(IBV_ACCESS_HUGETLB);
	C(IBV_ACCESS_OPTIONAL_RANGE);
	C(IBV_WR_RDMA_WRITE); C(IBV_WR_RDMA_WRITE_WITH_IMM); C(IBV_WR_SEND); C(IBV_WR_SEND_WITH_IMM); C(IBV_WR_RDMA_READ);
	C(IBV_WR_SEND_WITH_INV);
	C(IBV_SEND_FENCE); C(IBV_SEND_SIGNALED); C(IBV_SEND_SOLICITED); C(IBV_SEND_INLINE);
	C(IBV_WC_SUCCESS); C(IBV_WC_LOC_LEN_ERR); C(IBV_WC_LOC_QP_OP_ERR); C(IBV_WC_LOC_PROT_ERR); C(IBV_WC_WR_FLUSH_ERR);
	C(IBV_WC_REM_ACCESS_ERR); C(IBV_WC_REM_OP_ERR); C(IBV_WC_FATAL_ERR); C(IBV_WC_GENERAL_ERR);
	C(IBV_WC_SEND); C(IBV_WC_RDMA_WRITE); C(IBV_WC_RDMA_READ); C(IBV_WC_RECV); C(IBV_WC_WITH_INV);
	C(IBV_EVENT_CQ_ERR); C(IBV_EVENT_QP_FATAL); C(IBV_EVENT_COMM_EST);
	C(IBV_PORT_ACTIVE); C(IBV_MTU_1024); C(IBV_MTU_4096); C(IBV_LINK_LAYER_ETHERNET); C(IBV_ATOMIC_NONE);
	C(IBV_GID_TYPE_IB);
	C(RDMA_CM_EVENT_ADDR_RESOLVED); C(RDMA_CM_EVENT_ROUTE_RESOLVED); C(RDMA_CM_EVENT_CONNECT_REQUEST);
	C(RDMA_CM_EVENT_CONNECT_ERROR); C(RDMA_CM_EVENT_UNREACHABLE); C(RDMA_CM_EVENT_REJECTED);
	C(RDMA_CM_EVENT_ESTABLISHED); C(RDMA_CM_EVENT_DISCONNECTED); C(RDMA_CM_EVENT_TIMEWAIT_EXIT);
	C(RDMA_PS_TCP); C(RDMA_PS_UDP); C(RDMA_PS_IB); C(RDMA_OPTION_ID); C(RDMA_OPTION_IB); C(RDMA_OPTION_ID_TOS);
	C(RDMA_OPTION_ID_REUSEADDR); C(RDMA_OPTION_ID_AFONLY); C(RDMA_OPTION_ID_ACK_TIMEOUT); C(RDMA_OPTION_IB_PATH);
	C(RAI_PASSIVE); C(RAI_NUMERICHOST); C(RAI_NOROUTE); C(RAI_FAMILY); C(RDMA_MAX_RESP_RES); C(RDMA_MAX_INIT_DEPTH);
	return 0;
}
