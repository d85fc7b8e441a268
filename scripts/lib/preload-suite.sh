# The shared opening of the suites that run programs under
# libwarpsock_preload.so (scripts/test-preload.sh, scripts/test-xsock.sh).
# Source it from the repository root with NAME (the suite's name in its
# messages) and ROOT_WHY (why it needs root) set:
#   NAME=test-xsock; ROOT_WHY="namespaces, capture"; . scripts/lib/preload-suite.sh
# (as separate statements: the functions read NAME later).
# It checks for root, builds the library in release (TARGET_DIR, LIBDIR,
# SO), makes a work directory WORK, and on exit stops the processes listed
# in PIDS (by pid), deletes the namespaces listed in NETNS and removes WORK.
# fail MESSAGE ends the suite; pass MESSAGE counts a passed step in PASSED.
[ "$(id -u)" -eq 0 ] || { echo "$NAME: FAIL: must run as root ($ROOT_WHY)" >&2; exit 1; }
cargo build --release -p warpsock-preload --quiet
TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}"
LIBDIR="$TARGET_DIR/release"
SO="$LIBDIR/libwarpsock_preload.so"
[ -f "$SO" ] || { echo "$NAME: $SO not built" >&2; exit 1; }

WORK="$(mktemp -d "/tmp/warpsock-$NAME.XXXXXX")"
PIDS=()
NETNS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
    for ns in "${NETNS[@]}"; do ip netns del "$ns" 2>/dev/null || true; done
    rm -rf "$WORK"
}
trap cleanup EXIT

fail() { echo "$NAME: FAIL: $*" >&2; exit 1; }
pass() { echo "$NAME: ok: $*"; PASSED=$((PASSED + 1)); }
PASSED=0

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
