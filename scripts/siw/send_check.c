/*
 * send_check -- verified RDMAP Send at volume over rdma_cm/libibverbs, run
 * inside the siw VM (scripts/test-siw.sh) against warpsock-perftest's
 * `send-check` mode, which speaks the same protocol.
 *
 *   send_check server -p PORT [-a ADDR] -n N -s S [-w W] [-t SECONDS]
 *   send_check client -a ADDR -p PORT -n N -s S [-t SECONDS]
 *
 * Protocol "SCK1" (all integers big-endian; the contract is documented in
 * crates/warpsock-perftest/src/send_check.rs, which must stay in step):
 *
 *  - MPA Request private data (client -> server, 16 bytes):
 *      "SCK1" | u64 N messages | u32 S bytes per message
 *    The server rejects the connection if N/S differ from its own -n/-s.
 *  - The server posts W receives of S bytes BEFORE rdma_accept (iWARP has
 *    no RNR retry: a Send without a posted receive is a DDP Terminate,
 *    RFC 5041 §7.2 / siw 1/2/02), then replies with private data (12 bytes):
 *      "SCK1" | u32 W window | u32 K credit interval
 *  - The client sends message i = 0..N-1, S bytes of pattern(i), as RDMAP
 *    Sends; it may send message i only while i < posted, where posted
 *    starts at W and is raised by credit messages.
 *  - The server verifies every message (byte length == S, every byte ==
 *    pattern(i) for the i-th message in arrival order -- untagged messages
 *    complete in MSN order, RFC 5040 §5.3), re-posts the buffer, and every
 *    K messages (while fewer than N arrived) Sends a credit (16 bytes):
 *      "SCKC" | u32 0 | u64 posted  (cumulative receives posted = count+W)
 *  - After message N the server Sends the result (32 bytes):
 *      "SCKD" | u32 bad messages | u64 messages | u64 bytes | u64 checksum
 *    and both sides disconnect. The client posts W/K + 2 receives of 64
 *    bytes before its first Send: the server can have at most W/K credits
 *    plus the result unconsumed (a credit for count c needs c <= the last
 *    posted value the client has seen).
 *
 * Pattern: 8-byte little-endian words; word k of message i is
 *   (i + 1) * 0x9e3779b97f4a7c15 ^ k * 0xff51afd7ed558ccd   (mod 2^64)
 * truncated at the message end. A dropped, duplicated, reordered or
 * shifted message fails. Checksum: FNV-1a 64 over the messages in order,
 * one step per 8-byte little-endian word (h ^= w; h *= 0x100000001b3), a
 * message's last partial word zero-padded.
 *
 * Output: one line, "send_check server: messages M bytes B bad_messages X
 * first_bad -1|I@OFF checksum 0x... result ok|FAIL" (client: the same with
 * the server's reported numbers), exit status 0 only on a clean run.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <netdb.h>
#include <poll.h>
#include <rdma/rdma_cma.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define REQ_LEN 16
#define REP_LEN 12
#define CREDIT_LEN 16
#define DONE_LEN 32
#define CTL_BUF 64
#define FNV_OFFSET 0xcbf29ce484222325ULL
#define FNV_PRIME 0x100000001b3ULL

static double timeout_s = 60;

static void die(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fprintf(stderr, "send_check: ");
	vfprintf(stderr, fmt, ap);
	fprintf(stderr, "\n");
	va_end(ap);
	exit(2);
}

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static uint64_t pattern_word(uint64_t msg, uint64_t k)
{
	return (msg + 1) * 0x9e3779b97f4a7c15ULL ^ k * 0xff51afd7ed558ccdULL;
}

static void put_le64(uint8_t *p, uint64_t v, size_t n)
{
	for (size_t i = 0; i < n; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t get_le64(const uint8_t *p, size_t n)
{
	uint64_t v = 0;
	for (size_t i = 0; i < n; i++)
		v |= (uint64_t)p[i] << (8 * i);
	return v;
}

static void fill(uint8_t *buf, size_t len, uint64_t msg)
{
	for (size_t off = 0, k = 0; off < len; off += 8, k++)
		put_le64(buf + off, pattern_word(msg, k), len - off < 8 ? len - off : 8);
}

/* Folds msg into *h; returns the first differing byte offset or -1. */
static long check(const uint8_t *buf, size_t len, uint64_t msg, uint64_t *h)
{
	long bad = -1;
	for (size_t off = 0, k = 0; off < len; off += 8, k++) {
		size_t n = len - off < 8 ? len - off : 8;
		uint64_t w = get_le64(buf + off, n);
		uint64_t want = pattern_word(msg, k);
		if (n < 8)
			want &= (1ULL << (8 * n)) - 1;
		if (w != want && bad < 0)
			for (size_t j = 0; j < n; j++)
				if (((w ^ want) >> (8 * j)) & 0xff) {
					bad = (long)(off + j);
					break;
				}
		*h = (*h ^ w) * FNV_PRIME;
	}
	return bad;
}

static void be32(uint8_t *p, uint32_t v)
{
	uint32_t n = htonl(v);
	memcpy(p, &n, 4);
}

static void be64(uint8_t *p, uint64_t v)
{
	be32(p, (uint32_t)(v >> 32));
	be32(p + 4, (uint32_t)v);
}

static uint32_t rd32(const uint8_t *p)
{
	uint32_t n;
	memcpy(&n, p, 4);
	return ntohl(n);
}

static uint64_t rd64(const uint8_t *p)
{
	return (uint64_t)rd32(p) << 32 | rd32(p + 4);
}

/* ---- rdma_cm events with a deadline ------------------------------------ */

static struct rdma_cm_event *get_event(struct rdma_event_channel *ch, enum rdma_cm_event_type want,
				       const char *step)
{
	struct pollfd pfd = { .fd = ch->fd, .events = POLLIN };
	int r = poll(&pfd, 1, (int)(timeout_s * 1000));
	if (r <= 0)
		die("%s: no rdma_cm event within %.0f s", step, timeout_s);
	struct rdma_cm_event *ev;
	if (rdma_get_cm_event(ch, &ev))
		die("%s: rdma_get_cm_event: %s", step, strerror(errno));
	if (ev->event != want)
		die("%s: got rdma_cm event %s (status %d), expected %s", step, rdma_event_str(ev->event),
		    ev->status, rdma_event_str(want));
	return ev;
}

/* ---- verbs ------------------------------------------------------------- */

struct conn {
	struct rdma_cm_id *id;
	struct ibv_pd *pd;
	struct ibv_comp_channel *cc;
	struct ibv_cq *cq;
	int cq_armed;
};

static void conn_setup(struct conn *c, struct rdma_cm_id *id, int send_wr, int recv_wr)
{
	c->id = id;
	c->pd = ibv_alloc_pd(id->verbs);
	if (!c->pd)
		die("ibv_alloc_pd: %s", strerror(errno));
	c->cc = ibv_create_comp_channel(id->verbs);
	if (!c->cc)
		die("ibv_create_comp_channel: %s", strerror(errno));
	c->cq = ibv_create_cq(id->verbs, send_wr + recv_wr + 8, NULL, c->cc, 0);
	if (!c->cq)
		die("ibv_create_cq: %s", strerror(errno));
	struct ibv_qp_init_attr a = {
		.send_cq = c->cq,
		.recv_cq = c->cq,
		.qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = send_wr, .max_recv_wr = recv_wr, .max_send_sge = 1, .max_recv_sge = 1 },
	};
	if (rdma_create_qp(id, c->pd, &a))
		die("rdma_create_qp: %s", strerror(errno));
}

/* Waits for at most max completions (sleeping on the completion channel:
 * busy polling would take a vCPU from siw's kernel threads). */
static int wait_wc(struct conn *c, struct ibv_wc *wc, int max, const char *step)
{
	double deadline = now() + timeout_s;
	for (;;) {
		int n = ibv_poll_cq(c->cq, max, wc);
		if (n < 0)
			die("%s: ibv_poll_cq failed", step);
		if (n > 0) {
			for (int i = 0; i < n; i++)
				if (wc[i].status != IBV_WC_SUCCESS)
					die("%s: work completion %s (opcode %d, wr_id %" PRIu64 ")", step,
					    ibv_wc_status_str(wc[i].status), wc[i].opcode, wc[i].wr_id);
			return n;
		}
		if (!c->cq_armed) {
			if (ibv_req_notify_cq(c->cq, 0))
				die("ibv_req_notify_cq failed");
			c->cq_armed = 1;
			continue; /* poll once more: a completion may have raced the arm */
		}
		struct pollfd pfd = { .fd = c->cc->fd, .events = POLLIN };
		int left = (int)((deadline - now()) * 1000);
		if (left <= 0 || poll(&pfd, 1, left) <= 0)
			die("%s: no completion within %.0f s", step, timeout_s);
		struct ibv_cq *cq;
		void *ctx;
		if (ibv_get_cq_event(c->cc, &cq, &ctx))
			die("ibv_get_cq_event failed");
		ibv_ack_cq_events(cq, 1);
		c->cq_armed = 0;
	}
}

static struct ibv_mr *reg(struct conn *c, size_t len, uint8_t **buf)
{
	*buf = aligned_alloc(4096, (len + 4095) / 4096 * 4096);
	if (!*buf)
		die("out of memory (%zu bytes)", len);
	memset(*buf, 0, len);
	struct ibv_mr *mr = ibv_reg_mr(c->pd, *buf, len, IBV_ACCESS_LOCAL_WRITE);
	if (!mr)
		die("ibv_reg_mr(%zu): %s", len, strerror(errno));
	return mr;
}

static void post_recv(struct conn *c, struct ibv_mr *mr, uint8_t *addr, uint32_t len, uint64_t wr_id)
{
	struct ibv_sge sge = { .addr = (uintptr_t)addr, .length = len, .lkey = mr->lkey };
	struct ibv_recv_wr wr = { .wr_id = wr_id, .sg_list = &sge, .num_sge = 1 }, *bad;
	if (ibv_post_recv(c->id->qp, &wr, &bad))
		die("ibv_post_recv: %s", strerror(errno));
}

static void post_send(struct conn *c, struct ibv_mr *mr, uint8_t *addr, uint32_t len, uint64_t wr_id)
{
	struct ibv_sge sge = { .addr = (uintptr_t)addr, .length = len, .lkey = mr->lkey };
	struct ibv_send_wr wr = { .wr_id = wr_id, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND,
				  .send_flags = IBV_SEND_SIGNALED },
			   *bad;
	if (ibv_post_send(c->id->qp, &wr, &bad))
		die("ibv_post_send: %s", strerror(errno));
}

static struct sockaddr_in resolve(const char *host, const char *port)
{
	struct addrinfo hints = { .ai_family = AF_INET, .ai_socktype = SOCK_STREAM }, *ai;
	int r = getaddrinfo(host, port, &hints, &ai);
	if (r)
		die("cannot resolve %s:%s: %s", host, port, gai_strerror(r));
	struct sockaddr_in sin;
	memcpy(&sin, ai->ai_addr, sizeof(sin));
	freeaddrinfo(ai);
	return sin;
}

/* ---- server ------------------------------------------------------------ */

#define WR_CTL (1ULL << 62)

static int server(const char *host, const char *port, uint64_t n, uint32_t s, uint32_t w)
{
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct rdma_cm_id *lid;
	if (!ch || rdma_create_id(ch, &lid, NULL, RDMA_PS_TCP))
		die("rdma_create_id: %s", strerror(errno));
	struct sockaddr_in sin = resolve(host, port);
	if (rdma_bind_addr(lid, (struct sockaddr *)&sin) || rdma_listen(lid, 1))
		die("bind/listen on %s:%s: %s", host, port, strerror(errno));
	fprintf(stderr, "send_check server: listening on %s:%s, N=%" PRIu64 " S=%u W=%u\n", host, port, n, s, w);

	struct rdma_cm_event *ev = get_event(ch, RDMA_CM_EVENT_CONNECT_REQUEST, "waiting for a client");
	struct rdma_cm_id *id = ev->id;
	const uint8_t *pd = ev->param.conn.private_data;
	uint8_t plen = ev->param.conn.private_data_len;
	if (plen < REQ_LEN || memcmp(pd, "SCK1", 4) || rd64(pd + 4) != n || rd32(pd + 12) != s) {
		fprintf(stderr, "send_check server: rejecting: private data (%u bytes) is not SCK1 N=%" PRIu64 " S=%u\n",
			plen, n, s);
		rdma_reject(id, NULL, 0);
		rdma_ack_cm_event(ev);
		return 1;
	}
	uint32_t k = w / 4 ? w / 4 : 1;
	struct conn c = { 0 };
	int ring = (int)(w / k) + 2;
	conn_setup(&c, id, ring + 2, w);
	uint8_t *data, *ctl;
	struct ibv_mr *dmr = reg(&c, (size_t)w * s, &data);
	struct ibv_mr *cmr = reg(&c, (size_t)ring * CTL_BUF, &ctl);
	/* Every receive is posted before the MPA Reply leaves (rdma_accept). */
	for (uint32_t i = 0; i < w; i++)
		post_recv(&c, dmr, data + (size_t)i * s, s, i);
	uint8_t rep[REP_LEN];
	memcpy(rep, "SCK1", 4);
	be32(rep + 4, w);
	be32(rep + 8, k);
	struct rdma_conn_param cp = { .private_data = rep, .private_data_len = REP_LEN,
				      .responder_resources = 1, .initiator_depth = 1 };
	if (rdma_accept(id, &cp))
		die("rdma_accept: %s", strerror(errno));
	rdma_ack_cm_event(ev);
	ev = get_event(ch, RDMA_CM_EVENT_ESTABLISHED, "accepting");
	rdma_ack_cm_event(ev);

	uint64_t count = 0, bytes = 0, bad_msgs = 0, h = FNV_OFFSET, first_bad = UINT64_MAX;
	long first_off = -1;
	uint64_t credited = 0;
	int ctl_out = 0; /* credit Sends in flight (Sends complete in order) */
	unsigned ctl_slot = 0;
	double t0 = 0;
	struct ibv_wc wc[32];
	while (count < n) {
		int got = wait_wc(&c, wc, 32, "receiving");
		for (int i = 0; i < got; i++) {
			if (wc[i].wr_id & WR_CTL) {
				ctl_out--;
				continue;
			}
			if (wc[i].opcode != IBV_WC_RECV)
				die("unexpected completion opcode %d", wc[i].opcode);
			if (count == 0)
				t0 = now();
			uint8_t *buf = data + (size_t)wc[i].wr_id * s;
			long off = wc[i].byte_len == s ? check(buf, s, count, &h) : 0;
			if (wc[i].byte_len != s || off >= 0) {
				if (!bad_msgs++) {
					first_bad = count;
					first_off = wc[i].byte_len == s ? off : -2;
				}
				if (wc[i].byte_len != s)
					fprintf(stderr, "send_check server: message %" PRIu64 " has %u bytes, expected %u\n",
						count, wc[i].byte_len, s);
			}
			bytes += wc[i].byte_len;
			count++;
			post_recv(&c, dmr, buf, s, wc[i].wr_id);
		}
		/* Credits are cumulative, so one owed while every credit buffer is in
		 * flight is merged into the next. At most one per K messages. */
		if (count - credited >= k && count < n && ctl_out < ring) {
			uint8_t *m = ctl + CTL_BUF * (ctl_slot++ % ring);
			memcpy(m, "SCKC", 4);
			be32(m + 4, 0);
			be64(m + 8, count + w);
			post_send(&c, cmr, m, CREDIT_LEN, WR_CTL | count);
			ctl_out++;
			credited = count;
		}
	}
	double secs = now() - t0;
	while (ctl_out > 0) {
		struct ibv_wc cw;
		wait_wc(&c, &cw, 1, "credit send");
		if (cw.wr_id & WR_CTL)
			ctl_out--;
	}
	uint8_t *m = ctl + CTL_BUF * (ctl_slot % ring);
	memcpy(m, "SCKD", 4);
	be32(m + 4, (uint32_t)(bad_msgs > UINT32_MAX ? UINT32_MAX : bad_msgs));
	be64(m + 8, count);
	be64(m + 16, bytes);
	be64(m + 24, h);
	post_send(&c, cmr, m, DONE_LEN, WR_CTL);
	struct ibv_wc cw;
	wait_wc(&c, &cw, 1, "result send");
	char fb[48] = "-1";
	if (bad_msgs)
		snprintf(fb, sizeof(fb), "%" PRIu64 "@%ld", first_bad, first_off);
	printf("send_check server: messages %" PRIu64 " bytes %" PRIu64 " bad_messages %" PRIu64
	       " first_bad %s checksum 0x%016" PRIx64 " seconds %.3f MBps %.1f result %s\n",
	       count, bytes, bad_msgs, fb, h, secs, bytes / secs / 1e6, bad_msgs ? "FAIL" : "ok");
	fflush(stdout);
	/* The client disconnects once it has the result (a missing
	 * DISCONNECTED event is only reported: the data is already checked). */
	struct pollfd pfd = { .fd = ch->fd, .events = POLLIN };
	if (poll(&pfd, 1, 10000) == 1 && !rdma_get_cm_event(ch, &ev)) {
		if (ev->event != RDMA_CM_EVENT_DISCONNECTED)
			fprintf(stderr, "send_check server: at the end: rdma_cm event %s\n", rdma_event_str(ev->event));
		rdma_ack_cm_event(ev);
	} else {
		fprintf(stderr, "send_check server: the client did not disconnect within 10 s\n");
	}
	rdma_disconnect(id);
	return bad_msgs ? 1 : 0;
}

/* ---- client ------------------------------------------------------------ */

static int client(const char *host, const char *port, uint64_t n, uint32_t s)
{
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct rdma_cm_id *id;
	if (!ch || rdma_create_id(ch, &id, NULL, RDMA_PS_TCP))
		die("rdma_create_id: %s", strerror(errno));
	struct sockaddr_in sin = resolve(host, port);
	if (rdma_resolve_addr(id, NULL, (struct sockaddr *)&sin, 2000))
		die("rdma_resolve_addr: %s", strerror(errno));
	rdma_ack_cm_event(get_event(ch, RDMA_CM_EVENT_ADDR_RESOLVED, "resolving the address"));
	if (rdma_resolve_route(id, 2000))
		die("rdma_resolve_route: %s", strerror(errno));
	rdma_ack_cm_event(get_event(ch, RDMA_CM_EVENT_ROUTE_RESOLVED, "resolving the route"));

	enum { SQ = 32, RQ = 256 };
	struct conn c = { 0 };
	conn_setup(&c, id, SQ, RQ);
	uint8_t *data, *ctl;
	struct ibv_mr *dmr = reg(&c, (size_t)SQ * s, &data);
	struct ibv_mr *cmr = reg(&c, (size_t)RQ * CTL_BUF, &ctl);
	uint8_t req[REQ_LEN];
	memcpy(req, "SCK1", 4);
	be64(req + 4, n);
	be32(req + 12, s);
	struct rdma_conn_param cp = { .private_data = req, .private_data_len = REQ_LEN,
				      .responder_resources = 1, .initiator_depth = 1 };
	if (rdma_connect(id, &cp))
		die("rdma_connect: %s", strerror(errno));
	struct rdma_cm_event *ev = get_event(ch, RDMA_CM_EVENT_ESTABLISHED, "connecting");
	const uint8_t *pd = ev->param.conn.private_data;
	if (ev->param.conn.private_data_len < REP_LEN || memcmp(pd, "SCK1", 4))
		die("the server's MPA Reply private data is not SCK1 (%u bytes)", ev->param.conn.private_data_len);
	uint32_t w = rd32(pd + 4), k = rd32(pd + 8);
	rdma_ack_cm_event(ev);
	if (!w || !k || k > w)
		die("server window %u / credit interval %u make no sense", w, k);
	uint32_t nrecv = w / k + 2;
	if (nrecv > RQ)
		die("server window %u / credit interval %u need %u receives (max %u)", w, k, nrecv, RQ);
	/* Posted before the first Send: the server answers nothing before it. */
	for (uint32_t i = 0; i < nrecv; i++)
		post_recv(&c, cmr, ctl + (size_t)i * CTL_BUF, CTL_BUF, i);

	uint64_t sent = 0, completed = 0, posted = w, h = FNV_OFFSET;
	int done = 0;
	uint8_t result[DONE_LEN] = { 0 };
	double t0 = now();
	struct ibv_wc wc[32];
	while (!done || completed < n) {
		/* Send while the server has a receive posted and our queue has room. */
		while (sent < n && sent < posted && sent - completed < SQ) {
			uint8_t *buf = data + (size_t)(sent % SQ) * s;
			fill(buf, s, sent);
			check(buf, s, sent, &h); /* checksum of what we send */
			post_send(&c, dmr, buf, s, sent);
			sent++;
		}
		int got = wait_wc(&c, wc, 32, sent < n ? "sending" : "waiting for the result");
		for (int i = 0; i < got; i++) {
			if (wc[i].opcode == IBV_WC_SEND) {
				completed++;
				continue;
			}
			uint8_t *m = ctl + (size_t)wc[i].wr_id * CTL_BUF;
			if (wc[i].byte_len == CREDIT_LEN && !memcmp(m, "SCKC", 4)) {
				uint64_t p = rd64(m + 8);
				if (p > posted)
					posted = p;
				post_recv(&c, cmr, m, CTL_BUF, wc[i].wr_id);
			} else if (wc[i].byte_len == DONE_LEN && !memcmp(m, "SCKD", 4)) {
				memcpy(result, m, DONE_LEN);
				done = 1;
			} else {
				die("unexpected %u-byte message from the server", wc[i].byte_len);
			}
		}
	}
	double secs = now() - t0;
	uint64_t bad = rd32(result + 4), msgs = rd64(result + 8), bytes = rd64(result + 16), sh = rd64(result + 24);
	int ok = !bad && msgs == n && bytes == n * s && sh == h;
	printf("send_check client: sent %" PRIu64 " x %u = %" PRIu64 " bytes checksum 0x%016" PRIx64
	       " seconds %.3f MBps %.1f; server: messages %" PRIu64 " bytes %" PRIu64 " bad_messages %" PRIu64
	       " checksum 0x%016" PRIx64 " result %s\n",
	       n, s, n * s, h, secs, n * s / secs / 1e6, msgs, bytes, bad, sh, ok ? "ok" : "FAIL");
	fflush(stdout);
	rdma_disconnect(id);
	return ok ? 0 : 1;
}

static void usage(void)
{
	fprintf(stderr, "usage: send_check server -p PORT [-a ADDR] -n N -s S [-w W] [-t SECONDS]\n"
			"       send_check client -a ADDR -p PORT -n N -s S [-t SECONDS]\n");
	exit(2);
}

int main(int argc, char **argv)
{
	if (argc < 2)
		usage();
	const char *mode = argv[1], *host = NULL, *port = NULL;
	uint64_t n = 0;
	uint32_t s = 0, w = 32;
	int o;
	optind = 2;
	while ((o = getopt(argc, argv, "a:p:n:s:w:t:")) != -1) {
		switch (o) {
		case 'a': host = optarg; break;
		case 'p': port = optarg; break;
		case 'n': n = strtoull(optarg, NULL, 0); break;
		case 's': s = (uint32_t)strtoul(optarg, NULL, 0); break;
		case 'w': w = (uint32_t)strtoul(optarg, NULL, 0); break;
		case 't': timeout_s = strtod(optarg, NULL); break;
		default: usage();
		}
	}
	if (!port || !n || !s || !w)
		usage();
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (!strcmp(mode, "server"))
		return server(host ? host : "0.0.0.0", port, n, s, w);
	if (!strcmp(mode, "client") && host)
		return client(host, port, n, s);
	usage();
	return 2;
}
