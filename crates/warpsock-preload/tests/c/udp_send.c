/* udp_send PORT COUNT SIZE [PACE_US [ACK_AFTER]]: sends COUNT datagrams of
 * SIZE bytes (sequence number first) to 127.0.0.1:PORT, sleeping PACE_US
 * every 32 datagrams. With ACK_AFTER, it waits (20 s at most) after the
 * first ACK_AFTER datagrams for one datagram back (udp_recv's ACK_AT) before
 * it sends the rest: the rest is sent once those have arrived. Exits 0 when
 * every sendto succeeded. */
#include "common.h"

int main(int argc, char **argv) {
    int port = port_arg(argc, argv, 1);
    int count = atoi(argv[2]), size = atoi(argv[3]);
    int pace = argc > 4 ? atoi(argv[4]) : 200;
    int ack_after = argc > 5 ? atoi(argv[5]) : 0;
    CHECK(size >= 4 && size <= 65507 && count > 0 && ack_after >= 0 && ack_after < count);
    int s = udp_new();
    set_rcvtimeo(s, 20000);
    static char buf[65507];
    for (int i = 0; i < size; i++) buf[i] = (char)i;
    for (int i = 0; i < count; i++) {
        if (ack_after > 0 && i == ack_after) {
            char ack[16];
            CHECK(recv(s, ack, sizeof ack, 0) == 3 && memcmp(ack, "ack", 3) == 0);
        }
        memcpy(buf, &i, sizeof i);
        send_to(s, port, buf, (size_t)size);
        if (pace > 0 && i % 32 == 31) {
            struct timespec t = {0, pace * 1000L};
            nanosleep(&t, NULL);
        }
    }
    printf("sent %d\n", count);
    return 0;
}
