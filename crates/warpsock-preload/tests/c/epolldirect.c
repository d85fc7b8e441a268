/* epoll's rules on a connection whose input the program's own sets watch
 * (the preload's shim::epollwatch, issue 12): the wait reports a DDP
 * socket's input itself for a plain input registration and lets the
 * kernel report the others. Each case prints what the waits report; run
 * over plain TCP and in DDP mode, the lines must be the same. Every
 * absence is checked after a witness saw the bytes arrive: a second set
 * (level-triggered) that holds the same descriptor, waited on first.
 * Usage: epolldirect CASE [plain], CASE one of
 *   lt       level-triggered: reported again while bytes are left
 *   et       edge-triggered: one report per arrival
 *   lt1, et1 the same with the set alone (no witness: its own waits are
 *            the synchronisation, and report the input themselves); lt1's
 *            input is reported again while it is left unread
 *   oneshot  EPOLLONESHOT: one report, none until EPOLL_CTL_MOD re-arms
 *   dup      the descriptor and a dup of it in one set: one event each;
 *            the dup's removed, the other's alone
 *   del      EPOLL_CTL_DEL: no reports; ADD again: reported
 *   del1     the set alone: DEL, input sent with no wait in between, ADD
 *            again (its event, with the new data), twice (redis's ae
 *            moves a connection so; the set's watch stays idle from the
 *            DEL to the ADD, shim::epollwatch::Table::uncover)
 *   reopen   the set closed, a new set (the same number) watches
 *   mod      EPOLL_CTL_MOD to EPOLLOUT alone: no input reports; back
 *   mod1     the set alone: input reported by the wait itself, then MOD
 *            away and back, an edge-triggered re-arm, a second set: the
 *            unread input is reported at each (the kernel's look) */
#include "ddppair.h"

#include <sys/epoll.h>

static int plain;

/* A connected pair, switched unless plain. */
static void pair(int *c, int *s) {
    pair_unless_plain(plain, c, s);
}

static int set_with(int fd, uint32_t events, uint64_t data) {
    int ep = epoll_create1(0);
    CHECK(ep >= 0);
    struct epoll_event e = {.events = events, .data.u64 = data};
    CHECK(epoll_ctl(ep, EPOLL_CTL_ADD, fd, &e) == 0);
    return ep;
}

/* One wait of ms on ep: its events, as "what: data:bits ..." ("none"). */
static void show(int ep, int ms, const char *what) {
    struct epoll_event ev[4];
    int n = epoll_wait(ep, ev, 4, ms);
    CHECK(n >= 0);
    printf("%s:", what);
    if (n == 0)
        printf(" none");
    for (int i = 0; i < n; i++)
        printf(" %llu:%s%s%s", (unsigned long long)ev[i].data.u64,
               ev[i].events & EPOLLIN ? "IN" : "", ev[i].events & EPOLLOUT ? "OUT" : "",
               ev[i].events & (EPOLLERR | EPOLLHUP) ? "ERRHUP" : "");
    printf("\n");
}

/* Waits (10 s at most) until the witness set reports input. */
static void witness(int w) {
    struct epoll_event e;
    CHECK(epoll_wait(w, &e, 1, 10000) == 1);
}

static void put(int s, const char *b) {
    CHECK(send(s, b, strlen(b), 0) == (ssize_t)strlen(b));
}

/* Non-blocking read of up to n bytes, printed. */
static void take(int c, size_t n, const char *what) {
    char b[64];
    ssize_t r = recv(c, b, n < sizeof b ? n : sizeof b, MSG_DONTWAIT);
    CHECK(r > 0);
    printf("%s: %.*s\n", what, (int)r, b);
}

int main(int argc, char **argv) {
    CHECK(argc >= 2);
    const char *cs = argv[1];
    plain = argc > 2 && !strcmp(argv[2], "plain");
    int c, s;
    pair(&c, &s);
    if (!strcmp(cs, "lt1")) {
        /* The set alone (no witness): its waits report themselves. */
        int ep = set_with(c, EPOLLIN, 14);
        put(s, "abcdef");
        show(ep, 10000, "sent");
        /* Not read: reported again (memcached's worker waited for good
         * when the report came once). */
        show(ep, 0, "unread");
        show(ep, 0, "still unread");
        take(c, 2, "read");
        show(ep, 0, "left");
        take(c, 64, "read");
        show(ep, 0, "drained");
        put(s, "g");
        show(ep, 10000, "sent again");
        take(c, 64, "read");
        close(c);
        close(s);
        return 0;
    }
    if (!strcmp(cs, "et1")) {
        int ep = set_with(c, EPOLLIN | EPOLLET, 15);
        put(s, "ab");
        show(ep, 10000, "sent");
        show(ep, 0, "again");
        take(c, 64, "read");
        put(s, "cd");
        show(ep, 10000, "sent again");
        take(c, 64, "read");
        close(c);
        close(s);
        return 0;
    }
    if (!strcmp(cs, "del1")) {
        int ep = set_with(c, EPOLLIN, 16);
        for (int round = 0; round < 2; round++) {
            CHECK(epoll_ctl(ep, EPOLL_CTL_DEL, c, NULL) == 0);
            put(s, round ? "b" : "a");
            struct epoll_event e = {.events = EPOLLIN, .data.u64 = 17 + round};
            CHECK(epoll_ctl(ep, EPOLL_CTL_ADD, c, &e) == 0);
            show(ep, 10000, "added again");
            take(c, 64, "read");
            show(ep, 0, "drained");
        }
        close(c);
        close(s);
        return 0;
    }
    if (!strcmp(cs, "mod1")) {
        /* The set alone: a report the wait made itself, then MOD away and
         * back (and an edge-triggered re-arm): the kernel looks at
         * readiness on MOD, so the unread input is reported again. */
        int ep = set_with(c, EPOLLIN, 16);
        put(s, "ab");
        show(ep, 10000, "sent");
        struct epoll_event e = {.events = EPOLLOUT, .data.u64 = 17};
        CHECK(epoll_ctl(ep, EPOLL_CTL_MOD, c, &e) == 0);
        show(ep, 0, "output only");
        e.events = EPOLLIN;
        e.data.u64 = 18;
        CHECK(epoll_ctl(ep, EPOLL_CTL_MOD, c, &e) == 0);
        show(ep, 0, "input again");
        e.events = EPOLLIN | EPOLLET;
        e.data.u64 = 19;
        CHECK(epoll_ctl(ep, EPOLL_CTL_MOD, c, &e) == 0);
        show(ep, 0, "edge-triggered");
        show(ep, 0, "no new edge");
        CHECK(epoll_ctl(ep, EPOLL_CTL_MOD, c, &e) == 0);
        show(ep, 0, "re-armed");
        int ep2 = set_with(c, EPOLLIN, 20);
        show(ep2, 0, "a second set");
        take(c, 64, "read");
        close(c);
        close(s);
        return 0;
    }
    int w = set_with(c, EPOLLIN, 99);
    if (!strcmp(cs, "lt")) {
        int ep = set_with(c, EPOLLIN, 1);
        show(ep, 0, "before");
        put(s, "abcdef");
        witness(w);
        show(ep, 10000, "sent");
        take(c, 2, "read");
        show(ep, 0, "left");
        take(c, 64, "read");
        show(ep, 0, "drained");
    } else if (!strcmp(cs, "et")) {
        int ep = set_with(c, EPOLLIN | EPOLLET, 2);
        put(s, "ab");
        witness(w);
        show(ep, 10000, "sent");
        show(ep, 0, "again");
        take(c, 1, "read");
        show(ep, 0, "after a partial read");
        take(c, 64, "read");
        put(s, "cd");
        witness(w);
        show(ep, 10000, "sent again");
        take(c, 64, "read");
    } else if (!strcmp(cs, "oneshot")) {
        int ep = set_with(c, EPOLLIN | EPOLLONESHOT, 3);
        put(s, "a");
        witness(w);
        show(ep, 10000, "sent");
        take(c, 64, "read");
        put(s, "b");
        witness(w);
        show(ep, 0, "disarmed");
        struct epoll_event e = {.events = EPOLLIN | EPOLLONESHOT, .data.u64 = 4};
        CHECK(epoll_ctl(ep, EPOLL_CTL_MOD, c, &e) == 0);
        show(ep, 10000, "re-armed");
        show(ep, 0, "disarmed again");
        take(c, 64, "read");
    } else if (!strcmp(cs, "dup")) {
        int ep = set_with(c, EPOLLIN, 5);
        int d = dup(c);
        CHECK(d >= 0);
        struct epoll_event e = {.events = EPOLLIN, .data.u64 = 6};
        CHECK(epoll_ctl(ep, EPOLL_CTL_ADD, d, &e) == 0);
        put(s, "a");
        witness(w);
        show(ep, 10000, "sent");
        take(c, 64, "read");
        show(ep, 0, "drained");
        /* (Removed, not closed: the kernel keeps a closed number's
         * registration while another number holds the file; the preload
         * takes it out with the number, shim::epollcarry::closing.) */
        CHECK(epoll_ctl(ep, EPOLL_CTL_DEL, d, NULL) == 0);
        put(s, "b");
        witness(w);
        show(ep, 10000, "dup removed");
        CHECK(close(d) == 0);
        take(c, 64, "read");
    } else if (!strcmp(cs, "del")) {
        int ep = set_with(c, EPOLLIN, 7);
        CHECK(epoll_ctl(ep, EPOLL_CTL_DEL, c, NULL) == 0);
        put(s, "a");
        witness(w);
        show(ep, 0, "removed");
        struct epoll_event e = {.events = EPOLLIN, .data.u64 = 8};
        CHECK(epoll_ctl(ep, EPOLL_CTL_ADD, c, &e) == 0);
        show(ep, 10000, "added again");
        take(c, 64, "read");
        put(s, "b");
        witness(w);
        show(ep, 10000, "sent");
        take(c, 64, "read");
    } else if (!strcmp(cs, "reopen")) {
        int ep = set_with(c, EPOLLIN, 9);
        put(s, "a");
        witness(w);
        show(ep, 10000, "sent");
        take(c, 64, "read");
        CHECK(close(ep) == 0);
        int ep2 = set_with(c, EPOLLIN, 10);
        printf("same number: %d\n", ep2 == ep);
        put(s, "b");
        witness(w);
        show(ep2, 10000, "new set");
        take(c, 64, "read");
    } else if (!strcmp(cs, "mod")) {
        int ep = set_with(c, EPOLLIN, 11);
        struct epoll_event e = {.events = EPOLLOUT, .data.u64 = 12};
        CHECK(epoll_ctl(ep, EPOLL_CTL_MOD, c, &e) == 0);
        put(s, "a");
        witness(w);
        show(ep, 10000, "output only");
        e.events = EPOLLIN;
        e.data.u64 = 13;
        CHECK(epoll_ctl(ep, EPOLL_CTL_MOD, c, &e) == 0);
        show(ep, 10000, "input again");
        take(c, 64, "read");
    } else {
        fprintf(stderr, "unknown case %s\n", cs);
        return 2;
    }
    close(c);
    close(s);
    return 0;
}
