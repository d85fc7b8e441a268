#!/usr/bin/env bash
# Unmodified iperf3 over DDP sockets in policy mode (issue 12, item 5),
# against host TCP in the same rounds: each round runs every row once
# plain and once under each library, the order of the variants rotating
# per round, on 127.0.0.1. Rows (each run a fresh one-shot server; both
# ends preloaded with WARPSOCK_DDP_PORTS set to the run's port, CRC as
# WARPSOCK_CRC says, default on):
#   P8    iperf3 -P 8, SECONDS: received Gbit/s (higher is better)
#   P1    one stream, 128 KiB writes: received Gbit/s
#   P1M   one stream, -l 1M: received Gbit/s
#   RCPU  one stream paced at 10 Gbit/s (-b 10G): the receiver's CPU
#         (iperf3's remote cpu_utilization_percent, user and system) per GB
#         received, in ms (lower is better)
# Prints each run and, per library and row, the median of its ratios to
# the same round's host TCP and the range.
#
#   scripts/bench-iperf3-ddp.sh ROUNDS LIB... [-- SECONDS]
#
# ROUNDS: 1 to 20. LIB: preload libraries (e.g. the A and B of a change).
# SECONDS per run: 1 to 30 (default 3). Measure on a quiet machine: the
# script prints `uptime` before and after. Loopback only; bounded: ROUNDS x
# 4 rows x (1 + libraries) runs, each under `timeout`.
set -euo pipefail
cd "$(dirname "$0")/.."

usage() { sed -n '2,22p' "$0" >&2; exit 2; }
[ $# -ge 2 ] || usage
ROUNDS=$1
shift
LIBS=()
SECS=3
while [ $# -gt 0 ]; do
    case "$1" in
        --) SECS=${2:-}; shift $#; break ;;
        *) [ -f "$1" ] || { echo "bench-iperf3-ddp: $1: no such library" >&2; exit 2; }
           LIBS+=("$(realpath "$1")"); shift ;;
    esac
done
[ ${#LIBS[@]} -ge 1 ] || usage
for v in "$ROUNDS" "$SECS"; do
    case "$v" in
        '' | *[!0-9]*) echo "bench-iperf3-ddp: ROUNDS and SECONDS must be whole numbers" >&2; exit 2 ;;
    esac
done
[ "$ROUNDS" -ge 1 ] && [ "$ROUNDS" -le 20 ] && [ "$SECS" -ge 1 ] && [ "$SECS" -le 30 ] || {
    echo "bench-iperf3-ddp: ROUNDS 1..20, SECONDS 1..30" >&2
    exit 2
}

fail() { echo "bench-iperf3-ddp: $*" >&2; exit 1; }
scripts/ensure-pkgs.sh iperf3 iproute2 >/dev/null

OUT=$(mktemp -d /tmp/warpsock-bench-iperf3.XXXXXX)
SERVER=
cleanup() {
    if [ -n "$SERVER" ]; then
        kill "$SERVER" 2>/dev/null || true
        wait "$SERVER" 2>/dev/null || true
    fi
    rm -rf "$OUT"
}
trap cleanup EXIT

# shellcheck source=scripts/lib/lease-port.sh
. scripts/lib/lease-port.sh
lease_port
IPORT=$PORT
RUN_LIMIT=$((SECS * 3 + 30))

# run LIB ROW: one iperf3 run (LIB empty: host TCP); writes the row's figure
# to $OUT/figure. Run in the script's own shell (not in $(...)), so that
# SERVER is the cleanup's and a failure ends the script.
run() {
    local lib=$1 row=$2 env=(env) args=()
    [ -n "$lib" ] && env=(env LD_PRELOAD="$lib" WARPSOCK_DDP_PORTS="$IPORT" WARPSOCK_DDP_PLAIN_MEMORY_MS=0)
    case "$row" in
        P8) args=(-P 8) ;;
        P1) args=() ;;
        P1M) args=(-l 1M) ;;
        RCPU) args=(-b 10G) ;;
    esac
    "${env[@]}" timeout "$RUN_LIMIT" iperf3 -s -1 -B 127.0.0.1 -p "$IPORT" >"$OUT/server.log" 2>&1 &
    SERVER=$!
    local i
    for i in $(seq 100); do
        ss -Hltn "sport = :$IPORT" 2>/dev/null | grep -q . && break
        kill -0 "$SERVER" 2>/dev/null || { cat "$OUT/server.log" >&2; fail "the server exited"; }
        sleep 0.1
    done
    if ! "${env[@]}" timeout "$RUN_LIMIT" iperf3 -c 127.0.0.1 -p "$IPORT" -t "$SECS" -J "${args[@]}" \
        >"$OUT/client.json" 2>"$OUT/client.err"; then
        cat "$OUT/client.json" "$OUT/client.err" "$OUT/server.log" >&2
        fail "iperf3 $row failed (${lib:-host TCP})"
    fi
    wait "$SERVER" || true
    SERVER=
    python3 - "$OUT/client.json" "$row" >"$OUT/figure" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
e = d["end"]
if sys.argv[2] == "RCPU":
    secs = e["sum_received"]["seconds"]
    gb = e["sum_received"]["bytes"] / 1e9
    print("%.1f" % (e["cpu_utilization_percent"]["remote_total"] / 100 * secs * 1000 / gb))
else:
    print("%.2f" % (e["sum_received"]["bits_per_second"] / 1e9))
PY
}

echo "uptime before: $(uptime)"
echo "runs: ${SECS} s each, 127.0.0.1 port $IPORT; CRC ${WARPSOCK_CRC:-1 (default)}"
VARIANTS=("" "${LIBS[@]}")
NV=${#VARIANTS[@]}
ROWS=(P8 P1 P1M RCPU)
for r in $(seq "$ROUNDS"); do
    for row in "${ROWS[@]}"; do
        declare -A got=()
        for k in $(seq 0 $((NV - 1))); do
            v=$(( (k + r) % NV ))
            run "${VARIANTS[$v]}" "$row"
            got[$v]=$(cat "$OUT/figure")
        done
        line="round $r $row: host ${got[0]}"
        for v in $(seq 1 $((NV - 1))); do
            ratio=$(awk -v a="${got[$v]}" -v h="${got[0]}" 'BEGIN { printf "%.3f", (h > 0 ? a / h : 0) }')
            echo "$ratio" >>"$OUT/ratios.$v.$row"
            line="$line; lib$v ${got[$v]} (${ratio}x)"
        done
        echo "$line"
        unset got
    done
done
for v in $(seq 1 $((NV - 1))); do
    for row in "${ROWS[@]}"; do
        sort -g "$OUT/ratios.$v.$row" | awk -v n="lib$v ${VARIANTS[$v]}" -v row="$row" '
            { x[NR] = $1 }
            END {
                m = (NR % 2) ? x[(NR + 1) / 2] : (x[NR / 2] + x[NR / 2 + 1]) / 2
                printf "%s %s: median %.3fx host TCP (%.3f-%.3f, %d rounds)\n", n, row, m, x[1], x[NR], NR
            }'
    done
done
echo "uptime after: $(uptime)"
