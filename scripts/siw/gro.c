/* gro -- show or set generic receive offload (GRO) on a network interface
 * through the ethtool ioctl, for the siw test VM, whose busybox has no
 * ethtool. Built static on the host and copied into the VM by
 * scripts/test-siw.sh.
 *
 *   gro IFACE          prints "IFACE gro on|off"
 *   gro IFACE on|off   sets it, then prints the state read back
 */
#include <linux/ethtool.h>
#include <linux/sockios.h>
#include <net/if.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

static int gro_cmd(int fd, const char *ifname, unsigned int cmd, unsigned int *value) {
    struct ethtool_value ev = {.cmd = cmd, .data = *value};
    struct ifreq ifr;
    memset(&ifr, 0, sizeof ifr);
    strncpy(ifr.ifr_name, ifname, IFNAMSIZ - 1);
    ifr.ifr_data = (char *)&ev;
    if (ioctl(fd, SIOCETHTOOL, &ifr) < 0) {
        return -1;
    }
    *value = ev.data;
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2 || argc > 3 || (argc == 3 && strcmp(argv[2], "on") && strcmp(argv[2], "off"))) {
        fprintf(stderr, "usage: gro IFACE [on|off]\n");
        return 2;
    }
    int fd = socket(AF_INET, SOCK_DGRAM, 0);
    if (fd < 0) {
        perror("gro: socket");
        return 1;
    }
    unsigned int v;
    if (argc == 3) {
        v = strcmp(argv[2], "on") == 0;
        if (gro_cmd(fd, argv[1], ETHTOOL_SGRO, &v) < 0) {
            perror("gro: ETHTOOL_SGRO");
            return 1;
        }
    }
    v = 0;
    if (gro_cmd(fd, argv[1], ETHTOOL_GGRO, &v) < 0) {
        perror("gro: ETHTOOL_GGRO");
        return 1;
    }
    printf("%s gro %s\n", argv[1], v ? "on" : "off");
    close(fd);
    return 0;
}
