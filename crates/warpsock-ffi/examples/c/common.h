/*
 * Helpers shared by the warpsock C examples: error reporting and a clock.
 */
#ifndef WARPSOCK_EXAMPLE_COMMON_H
#define WARPSOCK_EXAMPLE_COMMON_H

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "warpsock.h"

/* Upper bound of every wait in the examples, in milliseconds. */
#define WAIT_LIMIT_MS 10000

/* Prints what failed (code, message and the thread's detail) and exits. */
static inline void die(const char *prog, const char *what, warpsock_result r, int line)
{
    char detail[512];
    size_t n = 0;
    if (warpsock_last_error_detail(detail, sizeof detail, &n) != WARPSOCK_RESULT_OK) {
        n = 0;
    }
    fprintf(stderr, "%s: line %d: %s failed: %s (%u)%s%s\n", prog, line, what,
            warpsock_result_str(r), (unsigned)r, n ? ": " : "", n ? detail : "");
    exit(1);
}

/* Calls a warpsock function and exits with a message unless it returns OK. */
#define CHECK(call)                                                                                \
    do {                                                                                           \
        warpsock_result check_r_ = (call);                                                         \
        if (check_r_ != WARPSOCK_RESULT_OK) {                                                      \
            die(PROG, #call, check_r_, __LINE__);                                                  \
        }                                                                                          \
    } while (0)

/* Exits with a message unless the condition holds. */
#define EXPECT(cond, ...)                                                                          \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "%s: line %d: expected %s: ", PROG, __LINE__, #cond);                  \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fputc('\n', stderr);                                                                   \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

/* Monotonic time in nanoseconds. */
static inline double now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

/* Waits (bounded) for one completion on `cq` and returns it. */
static inline warpsock_wc wait_one(const char *prog, const warpsock_cq *cq)
{
    warpsock_wc wc;
    size_t n = 0;
    warpsock_result r = warpsock_cq_wait(cq, &wc, 1, (uint64_t)WAIT_LIMIT_MS * 1000, &n);
    if (r != WARPSOCK_RESULT_OK) {
        die(prog, "warpsock_cq_wait", r, __LINE__);
    }
    if (n != 1) {
        fprintf(stderr, "%s: no completion within %d ms\n", prog, WAIT_LIMIT_MS);
        exit(1);
    }
    if (wc.status != WARPSOCK_WC_STATUS_SUCCESS) {
        /* wc.cause says why the queue pair failed (peer closed, peer reset,
           timed out, a Terminate), 0 when unknown. */
        fprintf(stderr, "%s: work request %llu failed: %s%s%s\n", prog,
                (unsigned long long)wc.wr_id, warpsock_wc_status_str(wc.status),
                wc.cause ? ": " : "", wc.cause ? warpsock_result_str(wc.cause) : "");
        exit(1);
    }
    return wc;
}

#endif
