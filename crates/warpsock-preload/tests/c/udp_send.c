/* udp_send PORT COUNT SIZE [PACE_US]: sends COUNT datagrams of SIZE bytes
 * (sequence number first) to 127.0.0.1:PORT, sleeping PACE_US every 32
 * datagrams. Exits 0 when every sendto succeeded. */
#include "common.h"

int main(int argc, char **argv) {
    int port = port_arg(argc, argv, 1);
    int count = atoi(argv[2]), size = atoi(argv[3]);
    int pace = argc > 4 ? atoi(argv[4]) : 200;
    CHECK(size >= 4 && size <= 65507 && count > 0);
    int s = udp_new();
    static char buf[65507];
    for (int i = 0; i < size; i++) buf[i] = (char)i;
    for (int i = 0; i < count; i++) {
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
