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

# lease_port: a port for a server that binds it itself (scripts/lib/lease-port.sh).
. scripts/lib/lease-port.sh
