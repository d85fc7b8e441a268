/*
 * rdma_demo: RDMA Write, RDMA Read and Send between two threads on
 * 127.0.0.1, each checked byte for byte.
 *
 * The server thread (progress-thread context) exposes one region of its own
 * memory: the first half for the client to RDMA Write into, the second half
 * filled with a pattern for the client to RDMA Read. It advertises the
 * region's address and rkey in its MPA Reply private data. The client
 * (caller-driven context):
 *   0. connects once and is rejected (with private data), then connects again;
 *   1. RDMA Writes pattern A into the first half, then Sends "check write";
 *      the server compares its memory with A and answers with a Send;
 *   2. RDMA Reads the second half into a region warpsock allocated, and
 *      compares it with pattern B;
 *   3. Sends a message gathered from two buffers; the server checks the
 *      bytes, and says goodbye.
 * The server waits on the completion queue's notification fd with poll(2).
 */
#define _POSIX_C_SOURCE 200809L

#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

#define PROG "rdma_demo"
#define HALF 65536
#define MSG 256

enum { WR_WRITE = 10, WR_READ, WR_SEND, WR_RECV };

static unsigned char pattern(size_t i, unsigned seed)
{
    return (unsigned char)((i * 2654435761u) >> 13 ^ seed);
}

/* Big-endian advert of a region: 8-byte address, 4-byte rkey. */
static void put_advert(unsigned char out[12], uint64_t addr, uint32_t rkey)
{
    for (int i = 0; i < 8; i++) {
        out[i] = (unsigned char)(addr >> (56 - 8 * i));
    }
    for (int i = 0; i < 4; i++) {
        out[8 + i] = (unsigned char)(rkey >> (24 - 8 * i));
    }
}

static void get_advert(const unsigned char in[12], uint64_t *addr, uint32_t *rkey)
{
    *addr = 0;
    *rkey = 0;
    for (int i = 0; i < 8; i++) {
        *addr = *addr << 8 | in[i];
    }
    for (int i = 0; i < 4; i++) {
        *rkey = *rkey << 8 | in[8 + i];
    }
}

struct server_args {
    warpsock_listener *listener;
    int ok;
};

/* Waits for one completion the way an event loop would: poll(2) on the
 * CQ's notification fd (readable while completions wait), then poll the CQ. */
static warpsock_wc server_wait(const warpsock_cq *cq)
{
    int fd = -1;
    CHECK(warpsock_cq_notify_fd(cq, &fd));
    struct pollfd p = { .fd = fd, .events = POLLIN };
    int r = poll(&p, 1, WAIT_LIMIT_MS);
    EXPECT(r == 1 && (p.revents & POLLIN), "no completion within %d ms", WAIT_LIMIT_MS);
    warpsock_wc wc;
    size_t n = 0;
    CHECK(warpsock_cq_poll(cq, &wc, 1, &n));
    EXPECT(n == 1, "notify fd readable but the queue is empty");
    EXPECT(wc.status == WARPSOCK_WC_STATUS_SUCCESS, "wr %llu: %s", (unsigned long long)wc.wr_id,
           warpsock_wc_status_str(wc.status));
    return wc;
}

static void *server(void *arg)
{
    struct server_args *a = arg;
    warpsock_context *ctx;
    warpsock_pd *pd;
    warpsock_cq *cq;
    CHECK(warpsock_context_new(WARPSOCK_PROGRESS_THREAD, 0, &ctx));
    CHECK(warpsock_pd_new(ctx, &pd));
    CHECK(warpsock_cq_new(ctx, 64, &cq));

    /* The exposed region, in our own memory. */
    unsigned char *mem = calloc(1, 2 * HALF);
    EXPECT(mem != NULL, "out of memory");
    for (size_t i = 0; i < HALF; i++) {
        mem[HALF + i] = pattern(i, 0xB);
    }
    warpsock_mr *exposed;
    CHECK(warpsock_mr_register(pd, mem, 2 * HALF,
                               WARPSOCK_ACCESS_REMOTE_WRITE | WARPSOCK_ACCESS_REMOTE_READ, &exposed));
    /* Messages in and out: buffers warpsock owns. */
    warpsock_mr *in, *out;
    CHECK(warpsock_mr_alloc(pd, MSG, WARPSOCK_ACCESS_LOCAL_WRITE, &in));
    CHECK(warpsock_mr_alloc(pd, MSG, WARPSOCK_ACCESS_LOCAL_READ, &out));
    warpsock_sge in_sge, out_sge;
    CHECK(warpsock_mr_sge(in, 0, MSG, &in_sge));

    /* First request: reject it with a reason. */
    warpsock_conn_request *req;
    CHECK(warpsock_listener_accept(a->listener, WAIT_LIMIT_MS, &req));
    CHECK(warpsock_conn_request_reject(req, (const uint8_t *)"not yet", 7));

    /* Second: accept, advertising the region, with a receive pre-posted. */
    CHECK(warpsock_listener_accept(a->listener, WAIT_LIMIT_MS, &req));
    char peer[64];
    size_t n = 0;
    CHECK(warpsock_conn_request_peer_addr(req, peer, sizeof peer, &n));
    EXPECT(strncmp(peer, "127.0.0.1:", 10) == 0, "peer %s", peer);
    warpsock_qp_config *cfg;
    CHECK(warpsock_qp_config_new(&cfg));
    CHECK(warpsock_qp_config_set_crc_markers(cfg, true, false));
    warpsock_recv_wr rwr = { .wr_id = WR_RECV, .sg_list = &in_sge, .num_sge = 1 };
    CHECK(warpsock_qp_config_add_recv(cfg, &rwr));
    unsigned char advert[12];
    put_advert(advert, warpsock_mr_addr(exposed), warpsock_mr_rkey(exposed));
    warpsock_qp *qp;
    CHECK(warpsock_conn_request_accept(req, pd, cq, cq, cfg, advert, sizeof advert, &qp));
    warpsock_qp_config_free(cfg);

    const char *replies[] = { "write verified", "bye" };
    for (int round = 0; round < 2; round++) {
        warpsock_wc wc = server_wait(cq);
        EXPECT(wc.wr_id == WR_RECV && wc.opcode == WARPSOCK_WC_OPCODE_RECV, "got wr %llu",
               (unsigned long long)wc.wr_id);
        unsigned char msg[MSG] = { 0 };
        CHECK(warpsock_mr_read(in, 0, msg, wc.byte_len));
        if (round == 0) {
            EXPECT(wc.byte_len == 11 && memcmp(msg, "check write", 11) == 0, "round 0 message");
            for (size_t i = 0; i < HALF; i++) {
                EXPECT(mem[i] == pattern(i, 0xA), "written byte %zu is %u", i, mem[i]);
            }
        } else {
            EXPECT(wc.byte_len == MSG, "round 1: %u bytes", (unsigned)wc.byte_len);
            for (size_t i = 0; i < MSG; i++) {
                EXPECT(msg[i] == pattern(i, 0xC), "sent byte %zu is %u", i, msg[i]);
            }
        }
        CHECK(warpsock_qp_post_recv(qp, &rwr));
        size_t len = strlen(replies[round]);
        CHECK(warpsock_mr_write(out, 0, (const uint8_t *)replies[round], len));
        CHECK(warpsock_mr_sge(out, 0, (uint32_t)len, &out_sge));
        warpsock_send_wr swr = {
            .wr_id = WR_SEND,
            .opcode = WARPSOCK_WR_OPCODE_SEND,
            .send_flags = WARPSOCK_SEND_SIGNALED,
            .sg_list = &out_sge,
            .num_sge = 1,
        };
        CHECK(warpsock_qp_post_send(qp, &swr));
        wc = server_wait(cq);
        EXPECT(wc.wr_id == WR_SEND, "send completion, got wr %llu", (unsigned long long)wc.wr_id);
    }

    warpsock_qp_free(qp);
    warpsock_mr_free(exposed);
    warpsock_mr_free(in);
    warpsock_mr_free(out);
    free(mem);
    warpsock_cq_free(cq);
    warpsock_pd_free(pd);
    warpsock_context_free(ctx);
    a->ok = 1;
    return NULL;
}

/* Client: waits for a reply Send and checks its text. */
static void expect_reply(const warpsock_cq *cq, const warpsock_mr *in, const char *text)
{
    warpsock_wc wc = wait_one(PROG, cq);
    EXPECT(wc.wr_id == WR_RECV, "expected the reply, got wr %llu", (unsigned long long)wc.wr_id);
    char got[MSG + 1] = { 0 };
    CHECK(warpsock_mr_read(in, 0, (uint8_t *)got, wc.byte_len));
    EXPECT(strcmp(got, text) == 0, "reply \"%s\", wanted \"%s\"", got, text);
}

int main(void)
{
    struct server_args sa = { 0 };
    CHECK(warpsock_listener_bind("127.0.0.1:0", &sa.listener));
    char addr[64];
    size_t n = 0;
    CHECK(warpsock_listener_local_addr(sa.listener, addr, sizeof addr, &n));
    pthread_t th;
    EXPECT(pthread_create(&th, NULL, server, &sa) == 0, "pthread_create");

    warpsock_context *ctx;
    warpsock_pd *pd;
    warpsock_cq *cq;
    CHECK(warpsock_context_new(WARPSOCK_PROGRESS_CALLER, 0, &ctx));
    CHECK(warpsock_pd_new(ctx, &pd));
    CHECK(warpsock_cq_new(ctx, 64, &cq));

    /* 0. Rejected first: the code says so, the detail has the reason's size. */
    warpsock_qp *qp = NULL;
    warpsock_result r = warpsock_qp_connect(addr, pd, cq, cq, NULL, &qp);
    EXPECT(r == WARPSOCK_RESULT_REJECTED, "first connect: %s", warpsock_result_str(r));
    EXPECT(qp == NULL, "out-parameter written on failure");
    char detail[256];
    CHECK(warpsock_last_error_detail(detail, sizeof detail, &n));
    printf("rdma_demo: first connect refused as planned: %s\n", detail);

    /* Buffers: the Write source and the message parts in our memory, the
     * Read sink and the reply buffer allocated by warpsock. */
    unsigned char *src = malloc(HALF);
    unsigned char *part1 = malloc(MSG / 2), *part2 = malloc(MSG / 2);
    EXPECT(src && part1 && part2, "out of memory");
    for (size_t i = 0; i < HALF; i++) {
        src[i] = pattern(i, 0xA);
    }
    for (size_t i = 0; i < MSG; i++) {
        (i < MSG / 2 ? part1 : part2)[i % (MSG / 2)] = pattern(i, 0xC);
    }
    warpsock_mr *src_mr, *p1_mr, *p2_mr, *sink, *in, *note;
    CHECK(warpsock_mr_register(pd, src, HALF, WARPSOCK_ACCESS_LOCAL_READ, &src_mr));
    CHECK(warpsock_mr_register(pd, part1, MSG / 2, WARPSOCK_ACCESS_LOCAL_READ, &p1_mr));
    CHECK(warpsock_mr_register(pd, part2, MSG / 2, WARPSOCK_ACCESS_LOCAL_READ, &p2_mr));
    CHECK(warpsock_mr_alloc(pd, HALF, WARPSOCK_ACCESS_LOCAL_WRITE, &sink));
    CHECK(warpsock_mr_alloc(pd, MSG, WARPSOCK_ACCESS_LOCAL_WRITE, &in));
    CHECK(warpsock_mr_alloc(pd, 16, WARPSOCK_ACCESS_LOCAL_READ, &note));
    CHECK(warpsock_mr_write(note, 0, (const uint8_t *)"check write", 11));

    warpsock_sge in_sge;
    CHECK(warpsock_mr_sge(in, 0, MSG, &in_sge));
    warpsock_recv_wr rwr = { .wr_id = WR_RECV, .sg_list = &in_sge, .num_sge = 1 };
    warpsock_qp_config *cfg;
    CHECK(warpsock_qp_config_new(&cfg));
    CHECK(warpsock_qp_config_add_recv(cfg, &rwr));
    CHECK(warpsock_qp_connect(addr, pd, cq, cq, cfg, &qp));
    warpsock_qp_config_free(cfg);

    warpsock_negotiated neg;
    CHECK(warpsock_qp_negotiated(qp, &neg));
    EXPECT(neg.crc, "the server asked for CRC");
    EXPECT(neg.peer_private_data_len == 12, "advert of %zu bytes", neg.peer_private_data_len);
    unsigned char advert[12];
    CHECK(warpsock_qp_peer_private_data(qp, advert, sizeof advert, &n));
    uint64_t raddr;
    uint32_t rkey;
    get_advert(advert, &raddr, &rkey);

    /* 1. RDMA Write, then a Send to have it checked. */
    warpsock_sge sge;
    CHECK(warpsock_mr_sge(src_mr, 0, HALF, &sge));
    warpsock_send_wr wr = {
        .wr_id = WR_WRITE,
        .opcode = WARPSOCK_WR_OPCODE_RDMA_WRITE,
        .send_flags = WARPSOCK_SEND_SIGNALED,
        .sg_list = &sge,
        .num_sge = 1,
        .remote_addr = raddr,
        .rkey = rkey,
    };
    CHECK(warpsock_qp_post_send(qp, &wr));
    warpsock_wc wc = wait_one(PROG, cq);
    EXPECT(wc.wr_id == WR_WRITE && wc.opcode == WARPSOCK_WC_OPCODE_RDMA_WRITE, "write wc");
    warpsock_sge note_sge;
    CHECK(warpsock_mr_sge(note, 0, 11, &note_sge));
    warpsock_send_wr check = {
        .wr_id = WR_SEND,
        .opcode = WARPSOCK_WR_OPCODE_SEND,
        .send_flags = WARPSOCK_SEND_SIGNALED | WARPSOCK_SEND_SOLICITED,
        .sg_list = &note_sge,
        .num_sge = 1,
    };
    CHECK(warpsock_qp_post_send(qp, &check));
    wc = wait_one(PROG, cq);
    EXPECT(wc.wr_id == WR_SEND, "send wc, got %llu", (unsigned long long)wc.wr_id);
    expect_reply(cq, in, "write verified");
    CHECK(warpsock_qp_post_recv(qp, &rwr));
    printf("rdma_demo: RDMA Write of %d bytes verified by the server\n", HALF);

    /* 2. RDMA Read of the second half. */
    CHECK(warpsock_mr_sge(sink, 0, HALF, &sge));
    warpsock_send_wr rd = {
        .wr_id = WR_READ,
        .opcode = WARPSOCK_WR_OPCODE_RDMA_READ,
        .send_flags = WARPSOCK_SEND_SIGNALED,
        .sg_list = &sge,
        .num_sge = 1,
        .remote_addr = raddr + HALF,
        .rkey = rkey,
    };
    CHECK(warpsock_qp_post_send(qp, &rd));
    wc = wait_one(PROG, cq);
    EXPECT(wc.wr_id == WR_READ && wc.opcode == WARPSOCK_WC_OPCODE_RDMA_READ, "read wc");
    EXPECT(wc.byte_len == HALF, "read %u bytes", (unsigned)wc.byte_len);
    unsigned char *got = malloc(HALF);
    EXPECT(got != NULL, "out of memory");
    CHECK(warpsock_mr_read(sink, 0, got, HALF));
    for (size_t i = 0; i < HALF; i++) {
        EXPECT(got[i] == pattern(i, 0xB), "read byte %zu is %u", i, got[i]);
    }
    free(got);
    printf("rdma_demo: RDMA Read of %d bytes verified\n", HALF);

    /* 3. A Send gathered from two buffers. */
    warpsock_sge parts[2];
    CHECK(warpsock_mr_sge(p1_mr, 0, MSG / 2, &parts[0]));
    CHECK(warpsock_mr_sge(p2_mr, 0, MSG / 2, &parts[1]));
    warpsock_send_wr send = {
        .wr_id = WR_SEND,
        .opcode = WARPSOCK_WR_OPCODE_SEND,
        .send_flags = WARPSOCK_SEND_SIGNALED,
        .sg_list = parts,
        .num_sge = 2,
    };
    CHECK(warpsock_qp_post_send(qp, &send));
    wc = wait_one(PROG, cq);
    EXPECT(wc.wr_id == WR_SEND && wc.byte_len == MSG, "send wc");
    expect_reply(cq, in, "bye");
    printf("rdma_demo: Send of %d bytes from 2 buffers verified by the server\n", MSG);

    /* Out-of-range use is an error code, not a crash. */
    r = warpsock_mr_read(sink, HALF - 1, advert, 2);
    EXPECT(r == WARPSOCK_RESULT_OUT_OF_BOUNDS, "read past the end: %s", warpsock_result_str(r));

    EXPECT(pthread_join(th, NULL) == 0, "pthread_join");
    EXPECT(sa.ok, "server thread failed");
    warpsock_qp_free(qp);
    warpsock_mr_free(src_mr);
    warpsock_mr_free(p1_mr);
    warpsock_mr_free(p2_mr);
    warpsock_mr_free(sink);
    warpsock_mr_free(in);
    warpsock_mr_free(note);
    free(src);
    free(part1);
    free(part2);
    warpsock_cq_free(cq);
    warpsock_pd_free(pd);
    warpsock_context_free(ctx);
    warpsock_listener_free(sa.listener);
    printf("rdma_demo: all checks passed\n");
    return 0;
}
