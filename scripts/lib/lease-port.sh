# shellcheck shell=bash
# lease_port, for the scripts that start servers on a port they pick
# (scripts/lib/preload-suite.sh, scripts/bench-passthrough.sh); the caller
# defines fail MESSAGE. Moved as is from scripts/lib/preload-suite.sh.
#
# A port for a server that binds it itself, without the free_port() race
# (a port-0 probe closed before the server binds can be taken meanwhile):
# leased like warpsock-testkit's PortLease — below the kernel's ephemeral
# range, so no port-0 bind and no outgoing connection is given it, and
# locked through the same per-port lock files, on a descriptor held until
# the suite exits, so no other lease holder gets it — and checked free
# for TCP and UDP on 127.0.0.1. Sets PORT (call it as a statement, not in
# $(...): the lock must stay open in the suite's shell).
lease_port() {
    local dir="${TMPDIR:-/tmp}/warpsock-testkit-ports" eph span p fd
    mkdir -p "$dir"
    eph=$(cut -f1 /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || echo 32768)
    [ "$eph" -ge 21000 ] || eph=21000
    span=$((eph - 20000))
    for _ in $(seq 200); do
        p=$((20000 + (RANDOM * 32768 + RANDOM) % span))
        exec {fd}>"$dir/$p"
        if flock -n "$fd" && python3 -c "
import socket
for k in (socket.SOCK_STREAM, socket.SOCK_DGRAM):
    socket.socket(socket.AF_INET, k).bind(('127.0.0.1', $p))" 2>/dev/null; then
            PORT=$p
            return 0
        fi
        exec {fd}>&-
    done
    fail "no free port to lease below $eph"
}
