#!/usr/bin/env bash
# Every operation (Send, RDMA Write, RDMA Read; CRC on; checksums verified
# on both sides) between two network namespaces joined by a veth pair,
# 10.213.0.1 <-> 10.213.0.2, both addresses only inside the namespaces.
# The namespaces are created here and removed on exit by the names created.
# Needs root (CI runs as root): without it this fails rather than pass.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" -ne 0 ]; then
    echo "test-netns: FAILED: needs root to create network namespaces (not run)" >&2
    exit 1
fi
scripts/ensure-pkgs.sh iproute2

cargo build --quiet -p warpsock-engine --example ops
BIN="${CARGO_TARGET_DIR:-target}/debug/examples/ops"
[ -x "$BIN" ] || { echo "test-netns: $BIN not built" >&2; exit 1; }

NSA="wsA-$$"
NSB="wsB-$$"
VA="wsva$$"
VB="wsvb$$"
OUT=$(mktemp)
SERVER_PID=""
cleanup() {
    if [ -n "$SERVER_PID" ] && kill -0 "$SERVER_PID" 2>/dev/null; then
        kill "$SERVER_PID" 2>/dev/null || true
        wait "$SERVER_PID" 2>/dev/null || true
    fi
    ip netns del "$NSA" 2>/dev/null || true
    ip netns del "$NSB" 2>/dev/null || true
    rm -f "$OUT"
}
trap cleanup EXIT

ip netns add "$NSA"
ip netns add "$NSB"
ip link add "$VA" netns "$NSA" type veth peer name "$VB" netns "$NSB"
ip -n "$NSA" addr add 10.213.0.1/24 dev "$VA"
ip -n "$NSB" addr add 10.213.0.2/24 dev "$VB"
for ns in "$NSA" "$NSB"; do ip -n "$ns" link set lo up; done
ip -n "$NSA" link set "$VA" up
ip -n "$NSB" link set "$VB" up

run_once() {
    : >"$OUT"
    timeout 60 ip netns exec "$NSA" "$BIN" server 10.213.0.1:0 >"$OUT" &
    SERVER_PID=$!
    local addr=""
    for _ in $(seq 100); do
        addr=$(sed -n 's/^LISTEN //p' "$OUT")
        [ -n "$addr" ] && break
        sleep 0.1
    done
    [ -n "$addr" ] || { echo "test-netns: server did not start" >&2; return 1; }
    timeout 60 ip netns exec "$NSB" "$BIN" client "$addr"
    wait "$SERVER_PID"
    SERVER_PID=""
    grep -v '^LISTEN' "$OUT"
}

run_once
echo "test-netns: every operation between namespaces $NSA and $NSB passed"
