#!/usr/bin/env bash
# Host UDP vs the UDP offload preload, same run, on 127.0.0.1:
#  1. iperf 2 UDP, 1470-byte datagrams, offered load unlimited (-b 100G):
#     received throughput, loss and sender+receiver CPU seconds per GB received.
#  2. sockperf UDP ping-pong, 64 bytes, server pinned to CPU 0, client to CPU 1
#     (both sides alike: the program and its progress thread share the CPU),
#     RUNS rounds; each round runs every mode once, back to back, so that the
#     machine's drift hits all modes alike. Modes: host UDP (the baseline),
#     offload by default (caller-driven receive), offload with busy-polling
#     receives (WARPSOCK_BUSY_POLL_US=$BUSY_US), and offload with every
#     datagram handed over by the progress thread (WARPSOCK_CALLER_RECV=0,
#     the layer before caller-driven receive). Prints each round's p50 and,
#     per mode, the median p50 and its ratio to host UDP's median.
# Usage: scripts/bench-udp-offload.sh [seconds per run, default 5]
# Environment: RUNS (sockperf rounds, default 5), BUSY_US (default 100),
# ONLY=iperf|sockperf (one part only), BENCH_PORT (default 47001).
set -euo pipefail
cd "$(dirname "$0")/.."
T="${1:-5}"
RUNS="${RUNS:-5}"
BUSY_US="${BUSY_US:-100}"
ONLY="${ONLY:-}"
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

# One sockperf ping-pong; appends "p50 p99 avg" to $WORK/<key>.
sockperf_run() { # key, label, prefix...
    local key=$1 label=$2; shift 2
    taskset -c 0 "$@" sockperf sr -i 127.0.0.1 -p $PORT >"$WORK/ss.out" 2>&1 &
    local sp=$!; PIDS+=("$sp"); sleep 0.5
    taskset -c 1 "$@" sockperf pp -i 127.0.0.1 -p $PORT -m 64 -t "$T" >"$WORK/sc.out" 2>&1 || true
    kill "$sp"; wait "$sp" 2>/dev/null || true; PIDS=()
    local p50 p99 avg
    p50=$(grep -oE 'percentile 50.000 = +[0-9.]+' "$WORK/sc.out" | grep -oE '[0-9.]+$' || true)
    p99=$(grep -oE 'percentile 99.000 = +[0-9.]+' "$WORK/sc.out" | grep -oE '[0-9.]+$' || true)
    avg=$(grep -oE 'Latency is [0-9.]+' "$WORK/sc.out" | grep -oE '[0-9.]+$' || true)
    [ -n "$p50" ] || { cat "$WORK/sc.out" >&2; echo "bench: sockperf ($label) gave no result" >&2; exit 1; }
    echo "$p50 $p99 $avg" >>"$WORK/$key"
    printf '  %-34s p50 %7s  p99 %8s  avg %7s usec\n' "$label" "$p50" "$p99" "$avg"
}

median() { sort -n | awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]; else printf "%.3f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

PRE=(env LD_PRELOAD="$SO" WARPSOCK_UDP_OFFLOAD=1)
if [ "$ONLY" != sockperf ]; then
    echo "== iperf 2 UDP, 1470 B, -b 100G, ${T}s, 127.0.0.1 =="
    iperf_run "host UDP" env
    iperf_run "UDP offload" "${PRE[@]}"
fi
if [ "$ONLY" != iperf ]; then
    echo "== sockperf ping-pong, 64 B, ${T}s, server CPU 0, client CPU 1, $RUNS rounds (half round trip) =="
    MODES=(host offload busy progress)
    declare -A LABEL=([host]="host UDP" [offload]="offload (default)"
        [busy]="offload busy-poll ${BUSY_US} us" [progress]="offload, WARPSOCK_CALLER_RECV=0")
    for r in $(seq "$RUNS"); do
        echo "round $r:"
        sockperf_run host "${LABEL[host]}" env
        sockperf_run offload "${LABEL[offload]}" "${PRE[@]}"
        sockperf_run busy "${LABEL[busy]}" "${PRE[@]}" WARPSOCK_BUSY_POLL_US="$BUSY_US"
        sockperf_run progress "${LABEL[progress]}" "${PRE[@]}" WARPSOCK_CALLER_RECV=0
    done
    HOST50=$(cut -d' ' -f1 "$WORK/host" | median)
    echo "medians over $RUNS rounds (ratio: median p50 / host UDP median p50):"
    for m in "${MODES[@]}"; do
        p50=$(cut -d' ' -f1 "$WORK/$m" | median)
        p99=$(cut -d' ' -f2 "$WORK/$m" | median)
        printf '  %-34s p50 %7s  p99 %8s usec  ratio %5.2fx\n' "${LABEL[$m]}" "$p50" "$p99" \
            "$(awk -v a="$p50" -v b="$HOST50" 'BEGIN { print a / b }')"
    done
fi
