#!/usr/bin/env bash
# Host UDP vs the UDP offload preload, same run, on 127.0.0.1:
#  1. iperf 2 UDP, 1470-byte datagrams, offered load unlimited (-b 100G):
#     received throughput, loss and sender+receiver CPU seconds per GB received.
#  2. sockperf UDP ping-pong, 64 bytes, server pinned to CPU 0, client to CPU 1.
# Usage: scripts/bench-udp-offload.sh [seconds per run, default 5]
set -euo pipefail
cd "$(dirname "$0")/.."
T="${1:-5}"
scripts/ensure-pkgs.sh iperf sockperf >/dev/null
cargo build --release -p warpsock-preload --quiet
SO="${CARGO_TARGET_DIR:-$PWD/target}/release/libwarpsock_preload.so"
WORK="$(mktemp -d /tmp/warpsock-bench-udp.XXXXXX)"
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done; rm -rf "$WORK"; }
trap cleanup EXIT
HZ=$(getconf CLK_TCK)
PORT=${BENCH_PORT:-47001}

cpu_of() { awk -v hz="$HZ" '{ printf "%.2f", ($14 + $15) / hz }' "/proc/$1/stat"; }

iperf_run() { # label, prefix...
    local label=$1; shift
    "$@" iperf -s -u -B 127.0.0.1 -p $PORT -l 1470 >"$WORK/s.out" 2>&1 &
    local sp=$!; PIDS+=("$sp"); sleep 0.5
    # The client's CPU: its own user+sys from the subshell's `times`.
    ( "$@" iperf -c 127.0.0.1 -u -p $PORT -b 100G -l 1470 -t "$T" >"$WORK/c.out" 2>&1; times >"$WORK/c.times" )
    sleep 0.5
    local scpu; scpu=$(cpu_of "$sp")
    kill "$sp"; wait "$sp" 2>/dev/null || true; PIDS=()
    local ccpu; ccpu=$(awk 'NR==2 { gsub(/[ms]/, " "); u = $1 * 60 + $2; s = $3 * 60 + $4; printf "%.2f", u + s }' "$WORK/c.times")
    local rep; rep=$(awk '/Server Report/ { on = 1 } on && /Mbits|Gbits/ { print; exit }' "$WORK/c.out")
    local sent; sent=$(grep -oE 'Sent [0-9]+ datagrams' "$WORK/c.out" | grep -oE '[0-9]+')
    local lt; lt=$(echo "$rep" | grep -oE '[0-9]+/ *[0-9]+ +\(' | tr -d ' (')
    local lost=${lt%/*} total=${lt#*/}
    local recv=$((total - lost))
    local gb; gb=$(awk -v n="$recv" 'BEGIN { printf "%.3f", n * 1470 / 1e9 }')
    local mbps; mbps=$(awk -v n="$recv" -v t="$T" 'BEGIN { printf "%.0f", n * 1470 * 8 / t / 1e6 }')
    printf '%-16s sent %9s  received %9s  lost %6.2f%%  recv-throughput %6s Mbit/s  cpu s+r %5.2f+%5.2f s  cpu/GB %6.2f s\n' \
        "$label" "$sent" "$recv" "$(awk -v l="$lost" -v t="$total" 'BEGIN { print (t ? 100 * l / t : 0) }')" \
        "$mbps" "$ccpu" "$scpu" "$(awk -v c="$ccpu" -v s="$scpu" -v g="$gb" 'BEGIN { printf "%.2f", (c + s) / g }')"
}

sockperf_run() { # label, prefix...
    local label=$1; shift
    taskset -c 0 "$@" sockperf sr -i 127.0.0.1 -p $PORT >"$WORK/ss.out" 2>&1 &
    local sp=$!; PIDS+=("$sp"); sleep 0.5
    taskset -c 1 "$@" sockperf pp -i 127.0.0.1 -p $PORT -m 64 -t "$T" >"$WORK/sc.out" 2>&1
    kill "$sp"; wait "$sp" 2>/dev/null || true; PIDS=()
    printf '%-16s %s | %s\n' "$label" "$(grep -oE 'Latency is [0-9.]+ usec' "$WORK/sc.out")" \
        "$(grep -oE 'percentile 50.000 = +[0-9.]+|percentile 99.000 = +[0-9.]+' "$WORK/sc.out" | tr -s ' ' | paste -sd' ')"
}

PRE=(env LD_PRELOAD="$SO" WARPSOCK_UDP_OFFLOAD=1)
echo "== iperf 2 UDP, 1470 B, -b 100G, ${T}s, 127.0.0.1 =="
iperf_run "host UDP" env
iperf_run "UDP offload" "${PRE[@]}"
echo "== sockperf ping-pong, 64 B, ${T}s, server CPU 0, client CPU 1 =="
sockperf_run "host UDP" env
sockperf_run "UDP offload" "${PRE[@]}"
