/* Misuse and edge cases of libibverbs/librdmacm on warpsock0, run under
 * `warpsock run` and AddressSanitizer by scripts/test-verbs.sh. Each check
 * prints "ok NAME" or "FAIL NAME: ..."; the exit status is the number of
 * failures. The expected codes are what a real device gives (siw where
 * the devices differ; see crates/warpsock-verbs).
 *
 * Usage: misuse ADDR PORT    (a loopback address and a free port)
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

static int failures;
static const char *addr_s;
static int port;

#define CHECK(name, cond, ...) do { \
	if (cond) printf("ok %s\n", name); \
	else { printf("FAIL %s: ", name); printf(__VA_ARGS__); printf("\n"); failures++; } \
	fflush(stdout); } while (0)

static struct ibv_context *open_warpsock(void)
{
	int n = 0;
	struct ibv_device **l = ibv_get_device_list(&n);
	struct ibv_context *c = NULL;
	for (int i = 0; l && i < n; i++)
		if (!strcmp(ibv_get_device_name(l[i]), "warpsock0")) {
			CHECK("device-iwarp-rnic", l[i]->transport_type == IBV_TRANSPORT_IWARP &&
			      l[i]->node_type == IBV_NODE_RNIC, "transport %d node %d",
			      l[i]->transport_type, l[i]->node_type);
			c = ibv_open_device(l[i]);
		}
	ibv_free_device_list(l);
	return c;
}

/* Waits for the next CM event on ch, checks its type, returns it (acked by caller). */
static struct rdma_cm_event *expect_event(struct rdma_event_channel *ch, enum rdma_cm_event_type t,
					  const char *name)
{
	struct rdma_cm_event *e = NULL;
	if (rdma_get_cm_event(ch, &e)) {
		CHECK(name, 0, "rdma_get_cm_event: %s", strerror(errno));
		return NULL;
	}
	CHECK(name, e->event == t, "got %s (status %d), want %s", rdma_event_str(e->event), e->status,
	      rdma_event_str(t));
	return e;
}

static int poll_one(struct ibv_cq *cq, struct ibv_wc *wc)
{
	for (int i = 0; i < 2000000; i++) {
		int n = ibv_poll_cq(cq, 1, wc);
		if (n)
			return n;
		if (i > 1000)
			usleep(100);
	}
	return 0;
}

/* Polls until the completion of wr_id (others, e.g. flushed receives, are skipped). */
static int poll_wr(struct ibv_cq *cq, uint64_t wr_id, struct ibv_wc *wc)
{
	for (int i = 0; i < 64; i++)
		if (!poll_one(cq, wc) || wc->wr_id == wr_id)
			return wc->wr_id == wr_id;
	return 0;
}

/* ---- standalone objects: device answers, QP state machine, MR rules ---- */
static void objects(struct ibv_context *ctx)
{
	struct ibv_device_attr da;
	struct ibv_port_attr pa;
	CHECK("query-device", !ibv_query_device(ctx, &da) && da.max_sge_rd == 1 &&
	      da.atomic_cap == IBV_ATOMIC_NONE && da.max_qp_rd_atom == 128 && da.phys_port_cnt == 1,
	      "max_sge_rd %d atomic %d ord %d", da.max_sge_rd, da.atomic_cap, da.max_qp_rd_atom);
	CHECK("query-port", !ibv_query_port(ctx, 1, &pa) && pa.state == IBV_PORT_ACTIVE &&
	      pa.link_layer == IBV_LINK_LAYER_ETHERNET, "state %d", pa.state);
	CHECK("query-port-2", ibv_query_port(ctx, 2, &pa) != 0, "port 2 answered");
	struct ibv_device_attr_ex dax;
	CHECK("query-device-ex-falls-back", !ibv_query_device_ex(ctx, NULL, &dax) &&
	      dax.orig_attr.max_sge_rd == 1, "-");

	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	struct ibv_comp_channel *ch = ibv_create_comp_channel(ctx);
	struct ibv_cq *cq = ibv_create_cq(ctx, 16, NULL, ch, 0);
	CHECK("cq-objects", pd && ch && cq && cq->cqe >= 16, "pd %p ch %p cq %p", pd, ch, cq);
	struct ibv_cq_init_attr_ex cx = { .cqe = 4 };
	errno = 0;
	CHECK("create-cq-ex-unsupported", !ibv_create_cq_ex(ctx, &cx) && errno == EOPNOTSUPP,
	      "errno %d", errno);
	errno = 0;
	CHECK("create-cq-0", !ibv_create_cq(ctx, 0, NULL, NULL, 0) && errno == EINVAL, "errno %d", errno);

	static char buf[8192];
	errno = 0;
	CHECK("mr-remote-write-needs-local-write",
	      !ibv_reg_mr(pd, buf, sizeof buf, IBV_ACCESS_REMOTE_WRITE) && errno == EINVAL, "errno %d", errno);
	errno = 0;
	CHECK("mr-on-demand-unsupported",
	      !ibv_reg_mr(pd, buf, sizeof buf, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_ON_DEMAND) &&
	      errno == EOPNOTSUPP, "errno %d", errno);
	errno = 0;
	CHECK("mr-zero-length", !ibv_reg_mr(pd, buf, 0, IBV_ACCESS_LOCAL_WRITE) && errno == EINVAL,
	      "errno %d", errno);
	void *hole = mmap(NULL, 4096, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	munmap(hole, 4096);
	errno = 0;
	CHECK("mr-unmapped-memory", !ibv_reg_mr(pd, hole, 4096, IBV_ACCESS_LOCAL_WRITE) && errno == EFAULT,
	      "errno %d", errno);
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, sizeof buf, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
	CHECK("mr", mr && mr->lkey == mr->rkey && mr->length == sizeof buf, "-");
	struct ibv_mr *mr2 = ibv_reg_mr_iova2(pd, buf, 4096, 0x10000, IBV_ACCESS_LOCAL_WRITE);
	CHECK("mr-iova2", mr2 != NULL, "errno %d", errno);
	CHECK("dealloc-pd-busy", ibv_dealloc_pd(pd) == EBUSY, "-");

	struct ibv_qp_init_attr ia = { .send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1,
			 .max_inline_data = 1000 } };
	errno = 0;
	CHECK("qp-inline-too-large", !ibv_create_qp(pd, &ia) && errno == EINVAL, "errno %d", errno);
	ia.cap.max_inline_data = 64;
	ia.qp_type = IBV_QPT_UD;
	errno = 0;
	CHECK("qp-ud-unsupported", !ibv_create_qp(pd, &ia) && errno == EOPNOTSUPP, "errno %d", errno);
	ia.qp_type = IBV_QPT_RC;
	struct ibv_srq_init_attr sa = { .attr = { .max_wr = 4, .max_sge = 1 } };
	errno = 0;
	CHECK("srq-unsupported", !ibv_create_srq(pd, &sa) && errno == EOPNOTSUPP, "errno %d", errno);
	struct ibv_qp *qp = ibv_create_qp(pd, &ia);
	CHECK("qp", qp && qp->state == IBV_QPS_RESET, "-");
	CHECK("destroy-cq-busy", ibv_destroy_cq(cq) == EBUSY, "-");

	struct ibv_qp_attr a = { .qp_state = IBV_QPS_RTS };
	CHECK("reset-to-rts", ibv_modify_qp(qp, &a, IBV_QP_STATE) == EINVAL, "-");
	a.qp_state = IBV_QPS_RTR;
	CHECK("reset-to-rtr", ibv_modify_qp(qp, &a, IBV_QP_STATE) == EINVAL, "-");
	struct ibv_sge sge = { .addr = (uintptr_t)buf, .length = 8, .lkey = mr->lkey };
	struct ibv_recv_wr rwr = { .wr_id = 7, .sg_list = &sge, .num_sge = 1 }, *rbad;
	CHECK("recv-in-reset", ibv_post_recv(qp, &rwr, &rbad) == EINVAL && rbad == &rwr, "-");
	a.qp_state = IBV_QPS_INIT;
	a.cur_qp_state = IBV_QPS_RTS;
	CHECK("cur-state-mismatch", ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_CUR_STATE) == EINVAL, "-");
	CHECK("reset-to-init", ibv_modify_qp(qp, &a, IBV_QP_STATE) == 0 && qp->state == IBV_QPS_INIT, "-");
	a.qp_state = IBV_QPS_RTS;
	CHECK("init-to-rts-without-connection", ibv_modify_qp(qp, &a, IBV_QP_STATE) == EINVAL, "-");
	struct ibv_send_wr swr = { .wr_id = 9, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND,
		.send_flags = IBV_SEND_SIGNALED }, *sbad;
	CHECK("send-before-rts", ibv_post_send(qp, &swr, &sbad) == ENOTCONN && sbad == &swr, "-");
	CHECK("recv-in-init", ibv_post_recv(qp, &rwr, &rbad) == 0, "-");
	a.qp_state = IBV_QPS_ERR;
	CHECK("init-to-err", ibv_modify_qp(qp, &a, IBV_QP_STATE) == 0, "-");
	struct ibv_wc wc;
	CHECK("err-flushes-recv", poll_one(cq, &wc) == 1 && wc.wr_id == 7 &&
	      wc.status == IBV_WC_WR_FLUSH_ERR && wc.opcode == IBV_WC_RECV, "status %d", wc.status);
	CHECK("send-in-err-flushes", ibv_post_send(qp, &swr, &sbad) == 0 && poll_one(cq, &wc) == 1 &&
	      wc.wr_id == 9 && wc.status == IBV_WC_WR_FLUSH_ERR, "status %d", wc.status);
	a.qp_state = IBV_QPS_RTS;
	CHECK("err-to-rts", ibv_modify_qp(qp, &a, IBV_QP_STATE) == EINVAL, "-");
	struct ibv_qp_attr qa;
	struct ibv_qp_init_attr qi;
	CHECK("query-qp", !ibv_query_qp(qp, &qa, IBV_QP_STATE, &qi) && qa.qp_state == IBV_QPS_ERR &&
	      qi.cap.max_inline_data == 64, "state %d", qa.qp_state);
	/* Arm, then post to the dead QP: the flush raises a channel event. */
	CHECK("req-notify", ibv_req_notify_cq(cq, 0) == 0, "-");
	ibv_post_recv(qp, &rwr, &rbad);
	struct ibv_cq *ecq;
	void *ectx;
	CHECK("cq-event", ibv_get_cq_event(ch, &ecq, &ectx) == 0 && ecq == cq, "-");
	ibv_ack_cq_events(cq, 1);
	CHECK("destroy-qp", ibv_destroy_qp(qp) == 0, "-");
	CHECK("destroy-channel-busy", ibv_destroy_comp_channel(ch) == EBUSY, "-");
	CHECK("teardown", !ibv_destroy_cq(cq) && !ibv_destroy_comp_channel(ch) && !ibv_dereg_mr(mr) &&
	      !ibv_dereg_mr(mr2) && !ibv_dealloc_pd(pd), "-");
}

/* ---- connected pairs through rdma_cm ----
 * The server thread accepts one connection per scenario; its reply's
 * private data is "server" + its buffer's address (8 bytes) + rkey (4). */
enum scenario { S_DATA, S_REJECT, S_OVERRUN, S_PEER_LEAVES, S_LOCAL_BOUNDS, S_REMOTE_BOUNDS, S_DONE };

struct side {
	struct rdma_cm_id *id;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_mr *mr;
	char *buf;
	uint64_t raddr;
	uint32_t rkey;
};

#define BUF 65536
static pthread_barrier_t bar;

static void make_qp(struct side *s, struct rdma_cm_id *id, int cqe, int sq)
{
	memset(s, 0, sizeof *s);
	s->id = id;
	s->pd = ibv_alloc_pd(id->verbs);
	s->cq = ibv_create_cq(id->verbs, cqe, NULL, NULL, 0);
	s->buf = calloc(1, BUF);
	s->mr = ibv_reg_mr(s->pd, s->buf, BUF, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
			   IBV_ACCESS_REMOTE_READ);
	struct ibv_qp_init_attr ia = { .send_cq = s->cq, .recv_cq = s->cq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = sq, .max_recv_wr = 16, .max_send_sge = 2, .max_recv_sge = 1,
			 .max_inline_data = 64 } };
	if (rdma_create_qp(id, s->pd, &ia))
		CHECK("rdma_create_qp", 0, "%s", strerror(errno));
}

static void free_side(struct side *s)
{
	rdma_destroy_qp(s->id);
	ibv_destroy_cq(s->cq);
	ibv_dereg_mr(s->mr);
	ibv_dealloc_pd(s->pd);
	free(s->buf);
	rdma_destroy_id(s->id);
}

static void post_recvs(struct side *s, int n, uint32_t len)
{
	for (int i = 0; i < n; i++) {
		struct ibv_sge sge = { (uintptr_t)s->buf + i * 64, len, s->mr->lkey };
		struct ibv_recv_wr w = { .wr_id = 100 + i, .sg_list = &sge, .num_sge = 1 }, *bad;
		if (ibv_post_recv(s->id->qp, &w, &bad))
			CHECK("post-recv", 0, "%s", strerror(errno));
	}
}

static void *server(void *arg)
{
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct rdma_cm_id *lid;
	struct sockaddr_in sin = { .sin_family = AF_INET, .sin_port = htons(port) };
	inet_pton(AF_INET, addr_s, &sin.sin_addr);
	rdma_create_id(ch, &lid, NULL, RDMA_PS_TCP);
	CHECK("bind-listen", !rdma_bind_addr(lid, (struct sockaddr *)&sin) && !rdma_listen(lid, 4),
	      "%s", strerror(errno));
	pthread_barrier_wait(&bar);
	for (int sc = S_DATA; sc < S_DONE; sc++) {
		struct rdma_cm_event *e = expect_event(ch, RDMA_CM_EVENT_CONNECT_REQUEST, "connect-request");
		if (!e)
			break;
		struct rdma_cm_id *id = e->id;
		int pd_ok = e->param.conn.private_data_len == 6 &&
			!memcmp(e->param.conn.private_data, "client", 6);
		/* The kernel's iWARP mapping: our initiator_depth = peer IRD. */
		int depth_ok = e->param.conn.initiator_depth == 3 && e->param.conn.responder_resources == 2;
		rdma_ack_cm_event(e);
		if (sc == S_DATA) {
			CHECK("request-private-data", pd_ok, "-");
			CHECK("request-ird-ord", depth_ok, "-");
		}
		if (sc == S_REJECT) {
			CHECK("reject", rdma_reject(id, "nope", 4) == 0, "%s", strerror(errno));
			rdma_destroy_id(id);
			continue;
		}
		struct side s;
		make_qp(&s, id, sc == S_OVERRUN ? 4 : 64, 16);
		post_recvs(&s, sc == S_OVERRUN ? 12 : 16, 64);
		char pd[18] = "server";
		uint64_t a = (uintptr_t)s.buf;
		memcpy(pd + 6, &a, 8);
		memcpy(pd + 14, &s.mr->rkey, 4);
		struct rdma_conn_param cp = { .private_data = pd, .private_data_len = 18,
			.responder_resources = 3, .initiator_depth = 2 };
		memcpy(s.buf + 4096, "read me", 8);
		CHECK("accept", rdma_accept(id, &cp) == 0, "%s", strerror(errno));
		e = expect_event(ch, RDMA_CM_EVENT_ESTABLISHED, "server-established");
		if (e)
			rdma_ack_cm_event(e);
		if (sc == S_DATA) {
			struct ibv_wc wc;
			int got = 0, inv = 0;
			for (int i = 0; i < 3 && poll_one(s.cq, &wc); i++) {
				got += wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RECV;
				inv += (wc.wc_flags & IBV_WC_WITH_INV) && wc.invalidated_rkey == s.mr->rkey;
			}
			CHECK("receives", got == 3, "got %d", got);
			CHECK("send-with-inv-flag", inv == 1, "inv %d", inv);
			CHECK("inline-payload", !memcmp(s.buf + 64, "inline!", 8), "-");
			CHECK("write-landed", !memcmp(s.buf + 8192, "written", 8), "-");
			pthread_barrier_wait(&bar); /* client: done */
		} else if (sc == S_OVERRUN) {
			pthread_barrier_wait(&bar); /* client sent 12 into a 4-entry CQ, then Read */
			struct ibv_wc wc[16];
			int n = 0, k;
			while ((k = ibv_poll_cq(s.cq, 16, wc)) > 0)
				n += k;
			CHECK("overrun-keeps-what-fitted", n == 4, "polled %d", n);
			/* The async fd is non-blocking here: take what is queued. */
			fcntl(id->verbs->async_fd, F_SETFL, O_NONBLOCK);
			struct ibv_async_event ae;
			int cq_err = 0, qp_fatal = 0;
			for (int i = 0; i < 200 && !(cq_err && qp_fatal); i++) {
				if (ibv_get_async_event(id->verbs, &ae)) {
					usleep(10000);
					continue;
				}
				cq_err += ae.event_type == IBV_EVENT_CQ_ERR && ae.element.cq == s.cq;
				qp_fatal += ae.event_type == IBV_EVENT_QP_FATAL && ae.element.qp == id->qp;
				ibv_ack_async_event(&ae);
			}
			CHECK("overrun-async-events", cq_err == 1 && qp_fatal == 1, "cq_err %d qp_fatal %d",
			      cq_err, qp_fatal);
			CHECK("overrun-qp-error", id->qp->state == IBV_QPS_ERR, "state %d", id->qp->state);
		} else if (sc == S_PEER_LEAVES) {
			pthread_barrier_wait(&bar); /* client has posted receives */
			rdma_disconnect(id);
		}
		e = expect_event(ch, RDMA_CM_EVENT_DISCONNECTED, "server-disconnected");
		if (e)
			rdma_ack_cm_event(e);
		free_side(&s);
		pthread_barrier_wait(&bar); /* scenario over on both sides */
	}
	rdma_destroy_id(lid);
	rdma_destroy_event_channel(ch);
	return arg;
}

/* A TCP peer that is not an iWARP responder: it accepts connections,
 * reads each MPA Request (so the initiator is awaiting the Reply) and
 * closes, with a FIN or (rst) a reset, until stopped. (The initiator tries
 * a few times before it reports the failure: see
 * crates/warpsock-verbs/src/cm/outcome.rs.) Listens on port 0 of ADDR. */
struct closer {
	int lfd;
	int port;
	int rst;
	int accepted;
	pthread_t t;
};

static void *closer_run(void *arg)
{
	struct closer *c = arg;
	int fd;
	while ((fd = accept(c->lfd, NULL, NULL)) >= 0) {
		char buf[64];
		ssize_t n = read(fd, buf, sizeof buf); /* the MPA Request's first bytes */
		(void)n;
		if (c->rst) {
			struct linger l = { .l_onoff = 1, .l_linger = 0 };
			setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof l);
		}
		close(fd);
		c->accepted++;
	}
	return NULL;
}

static int closer_start(struct closer *c, int rst)
{
	struct sockaddr_in sin = { .sin_family = AF_INET };
	socklen_t len = sizeof sin;
	inet_pton(AF_INET, addr_s, &sin.sin_addr);
	c->rst = rst;
	c->accepted = 0;
	c->lfd = socket(AF_INET, SOCK_STREAM, 0);
	if (c->lfd < 0 || bind(c->lfd, (struct sockaddr *)&sin, sizeof sin) || listen(c->lfd, 1) ||
	    getsockname(c->lfd, (struct sockaddr *)&sin, &len))
		return -1;
	c->port = ntohs(sin.sin_port);
	return pthread_create(&c->t, NULL, closer_run, c);
}

static void closer_stop(struct closer *c)
{
	shutdown(c->lfd, SHUT_RDWR); /* ends the blocked accept */
	pthread_join(c->t, NULL);
	close(c->lfd);
}

/* Connects; returns the first event after the route (ESTABLISHED or an error). */
static struct rdma_cm_event *client_connect(struct rdma_event_channel *ch, int use_port, struct side *s)
{
	struct rdma_cm_id *id;
	struct sockaddr_in sin = { .sin_family = AF_INET, .sin_port = htons(use_port) };
	inet_pton(AF_INET, addr_s, &sin.sin_addr);
	rdma_create_id(ch, &id, NULL, RDMA_PS_TCP);
	rdma_resolve_addr(id, NULL, (struct sockaddr *)&sin, 2000);
	struct rdma_cm_event *e = expect_event(ch, RDMA_CM_EVENT_ADDR_RESOLVED, "addr-resolved");
	if (e)
		rdma_ack_cm_event(e);
	rdma_resolve_route(id, 2000);
	e = expect_event(ch, RDMA_CM_EVENT_ROUTE_RESOLVED, "route-resolved");
	if (e)
		rdma_ack_cm_event(e);
	make_qp(s, id, 64, 4);
	post_recvs(s, 4, 64);
	struct rdma_conn_param cp = { .private_data = "client", .private_data_len = 6,
		.responder_resources = 3, .initiator_depth = 2 };
	CHECK("connect", rdma_connect(id, &cp) == 0, "%s", strerror(errno));
	if (rdma_get_cm_event(ch, &e))
		return NULL;
	if (e->event == RDMA_CM_EVENT_ESTABLISHED && e->param.conn.private_data_len == 18) {
		memcpy(&s->raddr, (char *)e->param.conn.private_data + 6, 8);
		memcpy(&s->rkey, (char *)e->param.conn.private_data + 14, 4);
	}
	return e;
}

static void expect_established(struct rdma_cm_event *e, struct side *s)
{
	CHECK("established", e && e->event == RDMA_CM_EVENT_ESTABLISHED, "event %s status %d",
	      e ? rdma_event_str(e->event) : "none", e ? e->status : 0);
	if (e) {
		CHECK("reply-private-data", e->param.conn.private_data_len == 18 &&
		      !memcmp(e->param.conn.private_data, "server", 6), "len %d", e->param.conn.private_data_len);
		rdma_ack_cm_event(e);
	}
	CHECK("qp-rts", s->id->qp->state == IBV_QPS_RTS, "state %d", s->id->qp->state);
}

static int post1(struct side *s, enum ibv_wr_opcode op, uint64_t wr_id, void *laddr, uint32_t len,
		 uint32_t lkey, uint64_t raddr, uint32_t flags)
{
	struct ibv_sge sge = { (uintptr_t)laddr, len, lkey };
	struct ibv_send_wr w = { .wr_id = wr_id, .sg_list = &sge, .num_sge = 1, .opcode = op,
		.send_flags = flags, .invalidate_rkey = 0x1234 }, *bad;
	w.wr.rdma.remote_addr = raddr;
	w.wr.rdma.rkey = s->rkey;
	return ibv_post_send(s->id->qp, &w, &bad);
}

static void client(void)
{
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct side s;
	struct ibv_wc wc;
	struct rdma_cm_event *e;
	pthread_barrier_wait(&bar);

	/* S_DATA: every supported operation, then the errors. */
	expect_established(client_connect(ch, port, &s), &s);
	const uint32_t SIG = IBV_SEND_SIGNALED;
	CHECK("send", !post1(&s, IBV_WR_SEND, 1, s.buf, 8, s.mr->lkey, 0, SIG) && poll_one(s.cq, &wc) &&
	      wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_SEND && wc.wr_id == 1, "status %d", wc.status);
	char stack[8] = "inline!";
	CHECK("inline-send", !post1(&s, IBV_WR_SEND, 3, stack, 8, 0, 0, SIG | IBV_SEND_INLINE) &&
	      poll_one(s.cq, &wc) && wc.status == IBV_WC_SUCCESS, "status %d", wc.status);
	memcpy(s.buf + 16, "written", 8);
	CHECK("write", !post1(&s, IBV_WR_RDMA_WRITE, 4, s.buf + 16, 8, s.mr->lkey, s.raddr + 8192, SIG) &&
	      poll_one(s.cq, &wc) && wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RDMA_WRITE,
	      "status %d", wc.status);
	CHECK("read", !post1(&s, IBV_WR_RDMA_READ, 5, s.buf + 512, 8, s.mr->lkey, s.raddr + 4096, SIG) &&
	      poll_one(s.cq, &wc) && wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RDMA_READ &&
	      wc.byte_len == 8 && !memcmp(s.buf + 512, "read me", 8), "status %d", wc.status);
	/* Send with Invalidate of the peer's rkey (last: it retires the peer's region). */
	struct ibv_sge isg = { (uintptr_t)s.buf, 8, s.mr->lkey };
	struct ibv_send_wr iv = { .wr_id = 2, .sg_list = &isg, .num_sge = 1, .opcode = IBV_WR_SEND_WITH_INV,
		.send_flags = SIG, .invalidate_rkey = s.rkey }, *bad;
	CHECK("send-with-inv", !ibv_post_send(s.id->qp, &iv, &bad) && poll_one(s.cq, &wc) &&
	      wc.status == IBV_WC_SUCCESS && wc.wr_id == 2, "status %d", wc.status);
	struct ibv_send_wr uw = { .opcode = IBV_WR_RDMA_WRITE_WITH_IMM };
	CHECK("write-with-imm-unsupported", ibv_post_send(s.id->qp, &uw, &bad) == EINVAL && bad == &uw, "-");
	uw.opcode = IBV_WR_ATOMIC_CMP_AND_SWP;
	CHECK("atomic-unsupported", ibv_post_send(s.id->qp, &uw, &bad) == EINVAL && bad == &uw, "-");
	uw.opcode = IBV_WR_SEND_WITH_IMM;
	CHECK("send-with-imm-unsupported", ibv_post_send(s.id->qp, &uw, &bad) == EINVAL, "-");
	struct ibv_sge two[2] = { { (uintptr_t)s.buf, 8, s.mr->lkey }, { (uintptr_t)s.buf + 8, 8, s.mr->lkey } };
	struct ibv_send_wr rw = { .sg_list = two, .num_sge = 2, .opcode = IBV_WR_RDMA_READ };
	CHECK("read-two-sges", ibv_post_send(s.id->qp, &rw, &bad) == EINVAL, "-");
	/* An SQ of 4: four unsignalled Sends fill it; a fifth is ENOMEM (the
	 * entries leave only with a later signalled completion, polled). */
	int r = 0;
	for (int i = 0; i < 4 && !r; i++)
		r = post1(&s, IBV_WR_SEND, 10 + i, s.buf, 8, s.mr->lkey, 0, 0);
	CHECK("sq-fills", r == 0, "r %d", r);
	CHECK("sq-overflow", post1(&s, IBV_WR_SEND, 14, s.buf, 8, s.mr->lkey, 0, SIG) == ENOMEM, "-");
	pthread_barrier_wait(&bar);
	CHECK("disconnect", rdma_disconnect(s.id) == 0, "%s", strerror(errno));
	e = expect_event(ch, RDMA_CM_EVENT_DISCONNECTED, "disconnected");
	if (e)
		rdma_ack_cm_event(e);
	free_side(&s);
	pthread_barrier_wait(&bar);

	/* S_REJECT */
	e = client_connect(ch, port, &s);
	CHECK("rejected", e && e->event == RDMA_CM_EVENT_REJECTED && e->status == -ECONNRESET &&
	      e->param.conn.private_data_len == 4 && !memcmp(e->param.conn.private_data, "nope", 4),
	      "event %s status %d", e ? rdma_event_str(e->event) : "none", e ? e->status : 0);
	if (e)
		rdma_ack_cm_event(e);
	CHECK("rejected-qp-error", s.id->qp->state == IBV_QPS_ERR, "state %d", s.id->qp->state);
	int flushed = 0;
	while (ibv_poll_cq(s.cq, 1, &wc) == 1)
		flushed += wc.status == IBV_WC_WR_FLUSH_ERR;
	CHECK("rejected-recvs-flushed", flushed == 4, "flushed %d", flushed);
	free_side(&s);

	/* S_OVERRUN: 12 Sends into a 4-entry receive CQ, then Read and bounds. */
	expect_established(client_connect(ch, port, &s), &s);
	int sent = 0;
	for (int i = 0; i < 12; i++) {
		post1(&s, IBV_WR_SEND, 20 + i, s.buf, 8, s.mr->lkey, 0, i % 4 == 3 ? SIG : 0);
		if (i % 4 == 3 && poll_one(s.cq, &wc))
			sent += wc.status == IBV_WC_SUCCESS;
	}
	CHECK("overrun-sends-complete", sent == 3, "sent %d", sent);
	/* The peer answers a Read only after it has placed every Send before
	 * it (RDMAP ordering): then all 12 completions are in its CQ. */
	CHECK("read-after-sends", !post1(&s, IBV_WR_RDMA_READ, 39, s.buf + 512, 8, s.mr->lkey, s.raddr + 4096, SIG) &&
	      poll_one(s.cq, &wc) && wc.status == IBV_WC_SUCCESS, "status %d", wc.status);
	pthread_barrier_wait(&bar);
	e = expect_event(ch, RDMA_CM_EVENT_DISCONNECTED, "overrun-peer-disconnected");
	if (e)
		rdma_ack_cm_event(e);
	free_side(&s);
	pthread_barrier_wait(&bar);

	/* S_PEER_LEAVES: posted receives and a later send are flushed. */
	expect_established(client_connect(ch, port, &s), &s);
	pthread_barrier_wait(&bar);
	e = expect_event(ch, RDMA_CM_EVENT_DISCONNECTED, "peer-disconnected");
	if (e)
		rdma_ack_cm_event(e);
	flushed = 0;
	for (int i = 0; i < 4 && poll_one(s.cq, &wc); i++)
		flushed += wc.status == IBV_WC_WR_FLUSH_ERR && wc.opcode == IBV_WC_RECV;
	CHECK("peer-left-recvs-flushed", flushed == 4, "flushed %d", flushed);
	CHECK("send-after-peer-left", !post1(&s, IBV_WR_SEND, 50, s.buf, 8, s.mr->lkey, 0, SIG) &&
	      poll_one(s.cq, &wc) && wc.wr_id == 50 && wc.status == IBV_WC_WR_FLUSH_ERR, "status %d", wc.status);
	free_side(&s);
	pthread_barrier_wait(&bar);

	/* S_LOCAL_BOUNDS: a gather entry past the end of its region. */
	expect_established(client_connect(ch, port, &s), &s);
	CHECK("local-bounds", !post1(&s, IBV_WR_SEND, 41, s.buf + BUF - 4, 8, s.mr->lkey, 0, SIG) &&
	      poll_wr(s.cq, 41, &wc) && wc.status == IBV_WC_LOC_PROT_ERR, "status %d", wc.status);
	e = expect_event(ch, RDMA_CM_EVENT_DISCONNECTED, "local-bounds-disconnected");
	if (e)
		rdma_ack_cm_event(e);
	free_side(&s);
	pthread_barrier_wait(&bar);

	/* S_REMOTE_BOUNDS: an RDMA Read past the end of the peer's region. */
	expect_established(client_connect(ch, port, &s), &s);
	CHECK("remote-bounds", !post1(&s, IBV_WR_RDMA_READ, 42, s.buf, 8, s.mr->lkey, s.raddr + BUF - 4, SIG) &&
	      poll_wr(s.cq, 42, &wc) && wc.status == IBV_WC_REM_ACCESS_ERR, "status %d", wc.status);
	e = expect_event(ch, RDMA_CM_EVENT_DISCONNECTED, "remote-bounds-disconnected");
	if (e)
		rdma_ack_cm_event(e);
	free_side(&s);
	pthread_barrier_wait(&bar);

	/* Nothing listening: REJECTED with -ECONNREFUSED (an iWARP RNIC's answer). */
	e = client_connect(ch, port + 1, &s);
	CHECK("refused", e && e->event == RDMA_CM_EVENT_REJECTED && e->status == -ECONNREFUSED,
	      "event %s status %d", e ? rdma_event_str(e->event) : "none", e ? e->status : 0);
	if (e)
		rdma_ack_cm_event(e);
	free_side(&s);

	/* The peer closes (FIN) or resets the stream while we await the MPA
	 * Reply: REJECTED with -ECONNRESET, as siw reports it
	 * (SIW_CM_WORK_PEER_CLOSE in AWAIT_MPAREP) and cma.c maps it. */
	for (int rst = 0; rst <= 1; rst++) {
		struct closer c;
		const char *name = rst ? "mpa-peer-reset" : "mpa-peer-closed";
		if (closer_start(&c, rst)) {
			CHECK(name, 0, "cannot listen: %s", strerror(errno));
			continue;
		}
		e = client_connect(ch, c.port, &s);
		CHECK(name, e && e->event == RDMA_CM_EVENT_REJECTED && e->status == -ECONNRESET,
		      "event %s status %d", e ? rdma_event_str(e->event) : "none", e ? e->status : 0);
		if (e)
			rdma_ack_cm_event(e);
		free_side(&s);
		closer_stop(&c);
		/* The initial attempt and 5 more (outcome.rs Backoff). */
		CHECK(rst ? "mpa-peer-reset-attempts" : "mpa-peer-closed-attempts", c.accepted == 6,
		      "%d attempts", c.accepted);
	}
	rdma_destroy_event_channel(ch);
}

/* rdma_* calls on ids this library never made (misaligned, inside another
 * object, already destroyed) fail with EINVAL instead of crashing. */
static void bogus_ids(void)
{
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct rdma_cm_id *id = NULL;
	CHECK("id-create", ch && !rdma_create_id(ch, &id, NULL, RDMA_PS_TCP) && id, "errno %d", errno);
	if (!id)
		return;
	struct rdma_cm_id *odd = (struct rdma_cm_id *)((char *)id + 1);
	struct rdma_cm_id *inside = (struct rdma_cm_id *)((char *)id + 64);
	struct sockaddr_in sin = { .sin_family = AF_INET, .sin_port = 0 };
	inet_pton(AF_INET, addr_s, &sin.sin_addr);
	errno = 0;
	CHECK("id-misaligned-bind", rdma_bind_addr(odd, (struct sockaddr *)&sin) == -1 && errno == EINVAL,
	      "errno %d", errno);
	errno = 0;
	CHECK("id-misaligned-listen", rdma_listen(odd, 1) == -1 && errno == EINVAL, "errno %d", errno);
	errno = 0;
	CHECK("id-inside-connect", rdma_connect(inside, NULL) == -1 && errno == EINVAL, "errno %d", errno);
	errno = 0;
	CHECK("id-misaligned-destroy", rdma_destroy_id(odd) == -1 && errno == EINVAL, "errno %d", errno);
	rdma_destroy_qp(odd); /* void: must just return */
	CHECK("id-live-still-works", rdma_bind_addr(id, (struct sockaddr *)&sin) == 0, "errno %d", errno);
	CHECK("id-destroy", rdma_destroy_id(id) == 0, "errno %d", errno);
	errno = 0;
	CHECK("id-destroyed-disconnect", rdma_disconnect(id) == -1 && errno == EINVAL, "errno %d", errno);
	rdma_destroy_event_channel(ch);
}

int main(int argc, char **argv)
{
	if (argc != 3) {
		fprintf(stderr, "usage: misuse ADDR PORT\n");
		return 2;
	}
	addr_s = argv[1];
	port = atoi(argv[2]);
	struct ibv_context *ctx = open_warpsock();
	CHECK("open-device", ctx != NULL, "warpsock0 not found (run under warpsock run)");
	if (!ctx)
		return 1;
	objects(ctx);
	ibv_close_device(ctx);
	bogus_ids();
	pthread_barrier_init(&bar, NULL, 2);
	pthread_t t;
	pthread_create(&t, NULL, server, NULL);
	client();
	pthread_join(t, NULL);
	printf("%d failures\n", failures);
	return failures;
}
