/* A socket whose lock a thread holds for good must not stop the other
 * sockets' progress.
 *
 *   ddpstuck [plain|late]
 *
 * Two connected pairs, a and b, in this process (DDP mode unless plain).
 * The program waits in select() first, so that every DDP socket is on the
 * library's progress thread's watch (select sees a DDP socket only through
 * the doorbell that thread rings). A second thread then receives on a's
 * client end into a buffer it cannot write (PROT_NONE): in DDP mode the
 * library's copy faults under the socket's lock, and the thread's SIGSEGV
 * handler says so and waits for ever, the lock held (over TCP the kernel
 * returns EFAULT and the thread waits the same way). a's server end then
 * sends more bytes: an event on the stuck socket's connection for the
 * progress thread. Then ROUNDS ping-pongs on b, each end waiting in
 * select() with a bound of LIMIT_MS: the progress thread must still ring
 * b's doorbells. Before, it waited for a's lock on that event, for ever,
 * and the first select on b timed out. Exit 0 if every round came back;
 * then, in DDP mode, the progress thread must not wake more than WAKES_MAX
 * times in an idle second for a's round, still owed. `late`: no select
 * before the fault — the process's first select is b's first hop, after
 * it, whose walk of every socket (the library's doorbell_wait) must not
 * wait for a's lock either (before, it did, for ever); a is then never on
 * the progress thread's watch (the library's walk thread keeps trying its
 * lock), so the idle-second bound checks little there: the default mode
 * covers it. The process ends
 * with _exit (its exit would close a, whose lock is held: ddpexitsig's
 * stopped mode covers that). */
#include "ddppair.h"

#include <dirent.h>
#include <sys/mman.h>

#define ROUNDS 50
#define LIMIT_MS 10000
/* Most wakes of the progress thread in an idle second with a's round owed. */
#define WAKES_MAX 50

static int told_fd = -1;

/* The stuck thread's SIGSEGV handler: says so ('s'), then never returns. */
static void stop_here(int sig) {
    (void)sig;
    char b = 's';
    (void)!write(told_fd, &b, 1);
    for (;;) pause();
}

static void *stuck(void *arg) {
    int c = *(int *)arg;
    long page = sysconf(_SC_PAGESIZE);
    char *b = mmap(NULL, (size_t)page, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(b != MAP_FAILED);
    struct pollfd p = {c, POLLIN, 0};
    CHECK(poll(&p, 1, LIMIT_MS) == 1 && (p.revents & POLLIN));
    ssize_t r = recv(c, b, 8, 0);
    /* Over TCP: EFAULT, no signal; the thread says so ('e') and waits the
     * same way. */
    CHECK(r == -1 && errno == EFAULT);
    char e = 'e';
    CHECK(write(told_fd, &e, 1) == 1);
    for (;;) pause();
    return NULL;
}

/* The voluntary context switches of the library's progress thread (its
 * name "warpsock-progre", as the kernel keeps 15 characters). */
static long progress_wakes(void) {
    DIR *d = opendir("/proc/self/task");
    CHECK(d != NULL);
    long found = -1;
    struct dirent *e;
    while ((e = readdir(d)) != NULL && found < 0) {
        if (e->d_name[0] == '.') continue;
        char path[300], buf[4096];
        snprintf(path, sizeof path, "/proc/self/task/%s/comm", e->d_name);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        int named = fgets(buf, sizeof buf, f) && strncmp(buf, "warpsock-progre", 15) == 0;
        fclose(f);
        if (!named) continue;
        snprintf(path, sizeof path, "/proc/self/task/%s/status", e->d_name);
        f = fopen(path, "r");
        CHECK(f != NULL);
        while (fgets(buf, sizeof buf, f))
            if (sscanf(buf, "voluntary_ctxt_switches: %ld", &found) == 1) break;
        fclose(f);
    }
    closedir(d);
    CHECK(found >= 0);
    return found;
}

/* One hop: a byte sent on from, waited for in select() on to and read. */
static int hop(int from, int to, int round) {
    char x = (char)round, y = 0;
    CHECK(send(from, &x, 1, MSG_NOSIGNAL) == 1);
    if (!select_readable(to, LIMIT_MS)) {
        fprintf(stderr, "ddpstuck: round %d: select saw nothing in %d ms (the progress thread is stopped)\n",
                round, LIMIT_MS);
        return 1;
    }
    CHECK(recv(to, &y, 1, 0) == 1 && y == x);
    return 0;
}

int main(int argc, char **argv) {
    int plain = argc > 1 && strcmp(argv[1], "plain") == 0;
    int late = argc > 1 && strcmp(argv[1], "late") == 0;
    int ac, as, bc, bs;
    if (plain) {
        tcp_pair(&ac, &as);
        tcp_pair(&bc, &bs);
    } else {
        ddp_pair(&ac, &as);
        ddp_pair(&bc, &bs);
    }
    /* A select first: from here on every DDP socket is watched (not
     * `late`: the walk of the first select meets a's lock held). */
    if (!late && hop(bc, bs, 0)) return 1;

    int told[2];
    CHECK(pipe(told) == 0);
    told_fd = told[1];
    on_fault(stop_here);
    pthread_t t;
    CHECK(pthread_create(&t, NULL, stuck, &ac) == 0);
    CHECK(send(as, "8 bytes!", 8, MSG_NOSIGNAL) == 8);
    char s;
    CHECK(read(told[0], &s, 1) == 1);
    /* In DDP mode the library's copy faulted, under the socket's lock. */
    if (s != (plain ? 'e' : 's')) {
        fprintf(stderr, "ddpstuck: the receive %s\n", s == 'e' ? "failed with EFAULT, no fault under the lock" : "faulted over TCP");
        _exit(1);
    }

    /* An event on the stuck socket's connection for the progress thread. */
    CHECK(send(as, "and more", 8, MSG_NOSIGNAL) == 8);
    for (int i = 1; i <= ROUNDS; i++) {
        if (hop(bc, bs, i) || hop(bs, bc, i)) _exit(1);
    }
    if (!plain) {
        /* Idle for a second, the round on a still owed: the progress
         * thread's tries of a's lock back off (1 ms doubling to 128 ms,
         * ~15 wakes in the second); not every 10 ms, the stand-in timer's
         * pace for a held lock (review 47 item 1), nor every 1 ms. */
        long before = progress_wakes();
        struct timespec second = {1, 0};
        while (nanosleep(&second, &second) != 0) CHECK(errno == EINTR);
        long woken = progress_wakes() - before;
        printf("ddpstuck: the progress thread woke %ld times in an idle second\n", woken);
        if (woken > WAKES_MAX) {
            fprintf(stderr, "ddpstuck: the progress thread woke %ld times in an idle second (at most %d)\n",
                    woken, WAKES_MAX);
            _exit(1);
        }
    }
    printf("ddpstuck%s: %d rounds on b with a's lock held\n", plain ? " plain" : late ? " late" : "", ROUNDS);
    fflush(stdout);
    _exit(0);
}
