/*
 * pingpong: N ping-pongs of small Sends between two processes on
 * 127.0.0.1, and the latency they took.
 *
 *   pingpong [-n iterations] [-s bytes] [-b busy_poll_us]
 *
 * The parent listens and echoes; a forked child connects, sends each ping
 * and waits for its pong, checks the bytes, and prints the mean round trip
 * and one-way latency. Both use caller-driven progress (the lowest
 * latency). Every wait is bounded; the parent kills the child by pid if it
 * does not finish in time.
 */
#define _POSIX_C_SOURCE 200809L

#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common.h"

#define PROG "pingpong"
#define HELLO "warpsock pingpong"
#define MAX_SIZE 65536

enum { WR_SEND = 1, WR_RECV = 2 };

/* One side: a context with a protection domain, a completion queue, a
 * send and a receive buffer registered from our own memory. */
struct side {
    warpsock_context *ctx;
    warpsock_pd *pd;
    warpsock_cq *cq;
    unsigned char *tx, *rx;
    warpsock_mr *tx_mr, *rx_mr;
    warpsock_qp *qp;
};

static void side_open(struct side *s, size_t size, uint64_t busy_poll_us)
{
    memset(s, 0, sizeof *s);
    CHECK(warpsock_context_new(WARPSOCK_PROGRESS_CALLER, busy_poll_us, &s->ctx));
    CHECK(warpsock_pd_new(s->ctx, &s->pd));
    CHECK(warpsock_cq_new(s->ctx, 16, &s->cq));
    s->tx = calloc(1, size);
    s->rx = calloc(1, size);
    EXPECT(s->tx && s->rx, "out of memory");
    CHECK(warpsock_mr_register(s->pd, s->tx, size, WARPSOCK_ACCESS_LOCAL_READ, &s->tx_mr));
    CHECK(warpsock_mr_register(s->pd, s->rx, size, WARPSOCK_ACCESS_LOCAL_WRITE, &s->rx_mr));
}

static void side_close(struct side *s)
{
    /* Queue pair first (it flushes to the CQ), regions before their memory. */
    warpsock_qp_free(s->qp);
    warpsock_mr_free(s->tx_mr);
    warpsock_mr_free(s->rx_mr);
    free(s->tx);
    free(s->rx);
    warpsock_cq_free(s->cq);
    warpsock_pd_free(s->pd);
    warpsock_context_free(s->ctx);
}

static warpsock_recv_wr recv_wr(warpsock_sge *sge)
{
    warpsock_recv_wr wr = { .wr_id = WR_RECV, .sg_list = sge, .num_sge = 1 };
    return wr;
}

static void post_send(struct side *s, warpsock_sge *sge)
{
    warpsock_send_wr wr = {
        .wr_id = WR_SEND,
        .opcode = WARPSOCK_WR_OPCODE_SEND,
        .send_flags = WARPSOCK_SEND_SIGNALED,
        .sg_list = sge,
        .num_sge = 1,
    };
    CHECK(warpsock_qp_post_send(s->qp, &wr));
}

/* Waits until both this round's send and receive have completed. */
static void wait_round(struct side *s, size_t size)
{
    int sent = 0, received = 0;
    while (!sent || !received) {
        warpsock_wc wc = wait_one(PROG, s->cq);
        if (wc.wr_id == WR_SEND) {
            EXPECT(wc.opcode == WARPSOCK_WC_OPCODE_SEND, "opcode %u", (unsigned)wc.opcode);
            sent++;
        } else {
            EXPECT(wc.opcode == WARPSOCK_WC_OPCODE_RECV, "opcode %u", (unsigned)wc.opcode);
            EXPECT(wc.byte_len == size, "received %u bytes, not %zu", (unsigned)wc.byte_len, size);
            received++;
        }
        EXPECT(sent <= 1 && received <= 1, "extra completion %llu", (unsigned long long)wc.wr_id);
    }
}

static void fill(unsigned char *buf, size_t size, uint32_t round)
{
    for (size_t i = 0; i < size; i++) {
        buf[i] = (unsigned char)(round * 31u + i);
    }
}

/* The child: connect, then ping and wait for each pong. */
static int client(const char *addr, long iters, size_t size, uint64_t busy_poll_us)
{
    struct side s;
    side_open(&s, size, busy_poll_us);
    warpsock_qp_config *cfg;
    CHECK(warpsock_qp_config_new(&cfg));
    CHECK(warpsock_qp_config_set_private_data(cfg, (const uint8_t *)HELLO, strlen(HELLO)));
    CHECK(warpsock_qp_config_set_timeouts(cfg, WAIT_LIMIT_MS, WAIT_LIMIT_MS));
    warpsock_sge rx_sge, tx_sge;
    CHECK(warpsock_mr_sge(s.rx_mr, 0, (uint32_t)size, &rx_sge));
    CHECK(warpsock_mr_sge(s.tx_mr, 0, (uint32_t)size, &tx_sge));
    /* The first pong's buffer is posted before the connection goes live. */
    warpsock_recv_wr rwr = recv_wr(&rx_sge);
    CHECK(warpsock_qp_config_add_recv(cfg, &rwr));
    CHECK(warpsock_qp_connect(addr, s.pd, s.cq, s.cq, cfg, &s.qp));
    warpsock_qp_config_free(cfg);

    unsigned char reply[WARPSOCK_MAX_PRIVATE_DATA];
    size_t n = 0;
    CHECK(warpsock_qp_peer_private_data(s.qp, reply, sizeof reply, &n));
    EXPECT(n == 2 && memcmp(reply, "ok", 2) == 0, "server replied %zu bytes", n);

    double start = 0;
    for (long i = 0; i < iters; i++) {
        if (i == 1) {
            start = now_ns(); /* the first round warms up */
        }
        fill(s.tx, size, (uint32_t)i);
        post_send(&s, &tx_sge);
        wait_round(&s, size);
        fill(s.tx, size, (uint32_t)i); /* the pong echoes the ping */
        EXPECT(memcmp(s.rx, s.tx, size) == 0, "pong %ld differs from its ping", i);
        if (i + 1 < iters) {
            CHECK(warpsock_qp_post_recv(s.qp, &rwr));
        }
    }
    double rtt_us = iters > 1 ? (now_ns() - start) / 1e3 / (double)(iters - 1) : 0;
    printf("pingpong: %ld round trips of %zu-byte Sends over 127.0.0.1: "
           "%.2f us round trip, %.2f us one way\n",
           iters, size, rtt_us, rtt_us / 2);
    side_close(&s);
    return 0;
}

/* The parent: accept, then echo every ping. */
static int server(warpsock_listener *l, long iters, size_t size, uint64_t busy_poll_us)
{
    struct side s;
    side_open(&s, size, busy_poll_us);
    warpsock_sge rx_sge, tx_sge;
    CHECK(warpsock_mr_sge(s.rx_mr, 0, (uint32_t)size, &rx_sge));
    CHECK(warpsock_mr_sge(s.tx_mr, 0, (uint32_t)size, &tx_sge));
    warpsock_recv_wr rwr = recv_wr(&rx_sge);
    warpsock_qp_config *cfg;
    CHECK(warpsock_qp_config_new(&cfg));
    CHECK(warpsock_qp_config_add_recv(cfg, &rwr));

    warpsock_conn_request *req;
    CHECK(warpsock_listener_accept(l, WAIT_LIMIT_MS, &req));
    unsigned char hello[WARPSOCK_MAX_PRIVATE_DATA];
    size_t n = 0;
    CHECK(warpsock_conn_request_private_data(req, hello, sizeof hello, &n));
    EXPECT(n == strlen(HELLO) && memcmp(hello, HELLO, n) == 0, "client said %zu bytes", n);
    CHECK(warpsock_conn_request_accept(req, s.pd, s.cq, s.cq, cfg, (const uint8_t *)"ok", 2,
                                       &s.qp));
    warpsock_qp_config_free(cfg);

    for (long i = 0; i < iters; i++) {
        warpsock_wc wc = wait_one(PROG, s.cq);
        EXPECT(wc.wr_id == WR_RECV && wc.byte_len == size, "ping %ld: wr %llu, %u bytes", i,
               (unsigned long long)wc.wr_id, (unsigned)wc.byte_len);
        memcpy(s.tx, s.rx, size);
        /* Post the next ping's buffer before the pong lets the client send it. */
        if (i + 1 < iters) {
            CHECK(warpsock_qp_post_recv(s.qp, &rwr));
        }
        post_send(&s, &tx_sge);
        wc = wait_one(PROG, s.cq);
        EXPECT(wc.wr_id == WR_SEND, "pong %ld: completion of wr %llu", i,
               (unsigned long long)wc.wr_id);
    }
    side_close(&s);
    return 0;
}

int main(int argc, char **argv)
{
    long iters = 1000;
    long size = 8;
    long busy = 0;
    int opt;
    while ((opt = getopt(argc, argv, "n:s:b:")) != -1) {
        switch (opt) {
        case 'n': iters = strtol(optarg, NULL, 10); break;
        case 's': size = strtol(optarg, NULL, 10); break;
        case 'b': busy = strtol(optarg, NULL, 10); break;
        default:
            fprintf(stderr, "usage: %s [-n iterations] [-s bytes] [-b busy_poll_us]\n", argv[0]);
            return 2;
        }
    }
    if (iters < 1 || iters > 10000000 || size < 1 || size > MAX_SIZE || busy < 0) {
        fprintf(stderr, "%s: -n must be 1..10000000, -s 1..%d, -b >= 0\n", PROG, MAX_SIZE);
        return 2;
    }

    warpsock_listener *l;
    CHECK(warpsock_listener_bind("127.0.0.1:0", &l));
    char addr[64];
    size_t n = 0;
    CHECK(warpsock_listener_local_addr(l, addr, sizeof addr, &n));

    fflush(stdout);
    pid_t child = fork();
    EXPECT(child >= 0, "fork failed");
    if (child == 0) {
        warpsock_listener_free(l); /* the parent's; closes only our copy */
        return client(addr, iters, (size_t)size, (uint64_t)busy);
    }
    int rc = server(l, iters, (size_t)size, (uint64_t)busy);
    warpsock_listener_free(l);

    /* Reap the child, killing it by pid if it overstays. */
    int status = 0;
    pid_t got = 0;
    for (int k = 0; k < 3000 && (got = waitpid(child, &status, WNOHANG)) == 0; k++) {
        struct timespec ten_ms = { 0, 10000000 };
        nanosleep(&ten_ms, NULL);
    }
    if (got == 0) {
        kill(child, SIGKILL);
        waitpid(child, &status, 0);
        fprintf(stderr, "%s: client did not finish in time\n", PROG);
        return 1;
    }
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fprintf(stderr, "%s: client failed (status %d)\n", PROG, status);
        return 1;
    }
    return rc;
}
