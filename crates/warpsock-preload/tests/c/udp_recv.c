/* udp_recv PORT COUNT SIZE TIMEOUT_MS [ACK_AT]: receives on 127.0.0.1:PORT
 * until COUNT distinct datagrams of SIZE bytes have arrived or no datagram
 * came for TIMEOUT_MS. With ACK_AT, it sends "ack" back to the sender once
 * the first ACK_AT datagrams (sequence numbers 0 .. ACK_AT - 1) have all
 * arrived (udp_send's ACK_AFTER), and prints "acked". Prints "received N dup D bad B reordered
 * R" (R: datagrams that arrived after one sent later) and exits 0 iff every
 * datagram arrived exactly once, intact. Prints "ready" once bound. */
#include "common.h"

int main(int argc, char **argv) {
    int port = port_arg(argc, argv, 1);
    int count = atoi(argv[2]), size = atoi(argv[3]), timeout = atoi(argv[4]);
    int ack_at = argc > 5 ? atoi(argv[5]) : 0, first = 0;
    CHECK(ack_at >= 0 && ack_at <= count);
    int r = udp_bound(port);
    /* Room for the whole test burst: on a loaded machine this process may
     * not run for several milliseconds, and kernel UDP drops what overflows
     * its receive buffer (212,992 B by default, about 160 of these
     * datagrams). That loss is UDP's, not the offload layer's, and is not
     * what these tests check. SO_RCVBUFFORCE passes net.core.rmem_max when
     * privileged; otherwise SO_RCVBUF asks for as much as rmem_max allows. */
    int want = 32 << 20;
    if (setsockopt(r, SOL_SOCKET, SO_RCVBUFFORCE, &want, sizeof want) != 0)
        CHECK(setsockopt(r, SOL_SOCKET, SO_RCVBUF, &want, sizeof want) == 0);
    set_rcvtimeo(r, timeout);
    char *seen = calloc((size_t)count, 1);
    static char buf[65536];
    int got = 0, dup = 0, bad = 0, max = -1, reordered = 0;
    printf("ready\n");
    fflush(stdout);
    while (got < count) {
        struct sockaddr_storage from;
        socklen_t fromlen = sizeof from;
        ssize_t k = recvfrom(r, buf, sizeof buf, 0, (struct sockaddr *)&from, &fromlen);
        if (k < 0) break;
        int seq;
        memcpy(&seq, buf, sizeof seq);
        int ok = k == size && seq >= 0 && seq < count;
        for (int i = 4; ok && i < size; i++) ok = buf[i] == (char)i;
        if (!ok) {
            bad++;
            continue;
        }
        if (seen[seq]) {
            dup++;
            continue;
        }
        seen[seq] = 1;
        got++;
        if (seq < ack_at && ++first == ack_at) {
            CHECK(sendto(r, "ack", 3, 0, (struct sockaddr *)&from, fromlen) == 3);
            printf("acked\n");
            fflush(stdout);
        }
        if (seq < max) reordered++;
        if (seq > max) max = seq;
    }
    printf("received %d dup %d bad %d reordered %d\n", got, dup, bad, reordered);
    return got == count && dup == 0 && bad == 0 ? 0 : 1;
}
