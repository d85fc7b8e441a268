#!/usr/bin/env bash
# Host UDP vs the UDP offload preload, same run, on 127.0.0.1, RUNS rounds;
# each round runs every mode once, back to back, so that the machine's drift
# hits all modes alike; medians and their ratios to host UDP at the end.
#  1. iperf 2 UDP, 1470-byte datagrams, offered load unlimited (-b 100G):
#     received throughput, loss, sender+receiver CPU seconds per GB
#     received, and system calls per datagram on each side (perf
#     tracepoints, when perf can count them). Modes: host UDP (baseline),
#     UDP offload (both preloaded, TCP path), and the GSO path toward a
#     plain receiver (preloaded client with WARPSOCK_UDP_MODE=gso, plain
#     iperf server).
#  2. sockperf UDP ping-pong, 64 bytes, server pinned to CPU 0, client to CPU
#     1 (both sides alike: the program and its progress thread share the
#     CPU). Modes: host UDP (the baseline), offload by default (caller-driven
#     receive), offload with busy-polling receives
#     (WARPSOCK_BUSY_POLL_US=$BUSY_US), and offload with every datagram
#     handed over by the progress thread (WARPSOCK_CALLER_RECV=0); then
#     system calls per round trip per mode (perf, in untimed runs).
#  3. Pass-through: iperf3 TCP, one stream, received throughput with and
#     without the preload on both sides (WARPSOCK_UDP_OFFLOAD=1: a TCP
#     program must not notice the layer; target >= 0.98x).
# Usage: scripts/bench-udp-offload.sh [seconds per run, default 5]
# Environment: RUNS (rounds, default 5), BUSY_US (default 100),
# ONLY=iperf|sockperf|passthrough (one part only), BENCH_PORT (default 47001).
# Check the load first (`uptime`): figures only mean something on a quiet
# machine (1-minute load average < 0.5).
set -euo pipefail
cd "$(dirname "$0")/.."
T="${1:-5}"
RUNS="${RUNS:-5}"
BUSY_US="${BUSY_US:-100}"
ONLY="${ONLY:-}"
scripts/ensure-pkgs.sh iperf iperf3 sockperf >/dev/null
cargo build --release -p warpsock-preload --quiet
SO="${CARGO_TARGET_DIR:-$PWD/target}/release/libwarpsock_preload.so"
WORK="$(mktemp -d /tmp/warpsock-bench-udp.XXXXXX)"
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done; rm -rf "$WORK"; }
trap cleanup EXIT
HZ=$(getconf CLK_TCK)
PORT=${BENCH_PORT:-47001}
echo "load: $(uptime)"

cpu_of() { awk -v hz="$HZ" '{ printf "%.2f", ($14 + $15) / hz }' "/proc/$1/stat"; }

# System calls counted by perf tracepoints (empty when perf cannot).
PERF=()
if perf stat -x, -e raw_syscalls:sys_enter -o /dev/null true 2>/dev/null; then
    PERF=(perf stat -x, -e raw_syscalls:sys_enter -o)
fi
syscalls_in() { [ -s "$1" ] && awk -F, '$1 ~ /^[0-9]+$/ { print $1; exit }' "$1" || echo 0; }

# iperf 2.1.8 passes each datagram's record from its traffic thread to its
# reporter thread through a ring of NUM_REPORT_STRUCTS (10,000) entries; at
# several Gbit/s the reporter can end a whole ring behind, and both sides'
# final reports then miss exactly 10,000 datagrams that did arrive (the
# layer's own counters: tx = rx = iperf's total; issue 13, session 9). A
# deeper ring on both ends, for every mode alike, keeps "lost" honest.
IPERF_RING=(--NUM_REPORT_STRUCTS 200000)

# One iperf 2 run; appends "mbps cpu_per_gb lost_pct sys_per_dgram_snd sys_per_dgram_rcv" to $WORK/<key>.
iperf_run() { # key, label, server prefix (array name), client prefix (array name)
    local key=$1 label=$2
    local -n spre=$3 cpre=$4
    local sperf=() cperf=()
    if [ ${#PERF[@]} -gt 0 ]; then sperf=("${PERF[@]}" "$WORK/s.perf"); cperf=("${PERF[@]}" "$WORK/c.perf"); fi
    rm -f "$WORK/s.perf" "$WORK/c.perf"
    "${sperf[@]}" "${spre[@]}" iperf -s -u -B 127.0.0.1 -p "$PORT" -l 1470 "${IPERF_RING[@]}" >"$WORK/s.out" 2>&1 &
    local sp=$!; PIDS+=("$sp"); sleep 0.5
    # The server is iperf itself, or perf's child when counting.
    local srv=$sp
    if [ ${#PERF[@]} -gt 0 ]; then srv=$(pgrep -P "$sp" | head -1); fi
    ( "${cperf[@]}" "${cpre[@]}" iperf -c 127.0.0.1 -u -p "$PORT" -b 100G -l 1470 -t "$T" "${IPERF_RING[@]}" >"$WORK/c.out" 2>&1; times >"$WORK/c.times" )
    sleep 0.5
    local scpu; scpu=$(cpu_of "$srv")
    kill -INT "$srv" 2>/dev/null || true
    wait "$sp" 2>/dev/null || true; PIDS=()
    local ccpu; ccpu=$(awk 'NR==2 { gsub(/[ms]/, " "); u = $1 * 60 + $2; s = $3 * 60 + $4; printf "%.2f", u + s }' "$WORK/c.times")
    local rep; rep=$(awk '/Server Report/ { on = 1 } on && /Mbits|Gbits/ { print; exit }' "$WORK/c.out")
    local sent; sent=$(grep -oE 'Sent [0-9]+ datagrams' "$WORK/c.out" | grep -oE '[0-9]+' || echo 0)
    local lt; lt=$(echo "$rep" | grep -oE '[0-9]+/ *[0-9]+ +\(' | tr -d ' (')
    local lost=${lt%/*} total=${lt#*/}
    [ -n "$total" ] || { cat "$WORK/c.out" >&2; echo "bench: iperf ($label) gave no server report" >&2; exit 1; }
    local recv=$((total - lost))
    local gb; gb=$(awk -v n="$recv" 'BEGIN { printf "%.4f", n * 1470 / 1e9 }')
    local mbps; mbps=$(awk -v n="$recv" -v t="$T" 'BEGIN { printf "%.0f", n * 1470 * 8 / t / 1e6 }')
    local cpg; cpg=$(awk -v c="$ccpu" -v s="$scpu" -v g="$gb" 'BEGIN { printf "%.2f", (g > 0 ? (c + s) / g : 0) }')
    local lpct; lpct=$(awk -v l="$lost" -v t="$total" 'BEGIN { printf "%.2f", t ? 100 * l / t : 0 }')
    local ssys rsys
    ssys=$(awk -v c="$(syscalls_in "$WORK/c.perf")" -v n="$sent" 'BEGIN { printf "%.3f", n ? c / n : 0 }')
    rsys=$(awk -v c="$(syscalls_in "$WORK/s.perf")" -v n="$recv" 'BEGIN { printf "%.3f", n ? c / n : 0 }')
    echo "$mbps $cpg $lpct $ssys $rsys" >>"$WORK/$key"
    printf '  %-28s sent %9s  received %9s  lost %6s%%  %6s Mbit/s  cpu s+r %5.2f+%5.2f s  cpu/GB %6s s  syscalls/dgram snd %s rcv %s\n' \
        "$label" "$sent" "$recv" "$lpct" "$mbps" "$ccpu" "$scpu" "$cpg" "$ssys" "$rsys"
}

# System calls per round trip of a sockperf ping-pong (both sides, their
# threads included), counted in a run of its own (perf slows each call, so
# the timed runs go without it); prints "-" when perf cannot count.
sockperf_syscalls() { # prefix...
    [ ${#PERF[@]} -gt 0 ] || { echo "-"; return; }
    rm -f "$WORK/sps.perf" "$WORK/spc.perf"
    taskset -c 0 "${PERF[@]}" "$WORK/sps.perf" "$@" sockperf sr -i 127.0.0.1 -p "$PORT" >"$WORK/sps.out" 2>&1 &
    local sp=$!; PIDS+=("$sp"); sleep 0.5
    taskset -c 1 "${PERF[@]}" "$WORK/spc.perf" "$@" sockperf pp -i 127.0.0.1 -p "$PORT" -m 64 -t 1 >"$WORK/spc.out" 2>&1 || true
    # SIGINT to sockperf itself (perf's child): perf then writes its count.
    kill -INT "$(pgrep -P "$sp" | head -1)" 2>/dev/null || true
    wait "$sp" 2>/dev/null || true; PIDS=()
    local rts; rts=$(grep -oE 'Total Run\].*ReceivedMessages=[0-9]+' "$WORK/spc.out" | grep -oE '[0-9]+$' || echo 0)
    awk -v s="$(syscalls_in "$WORK/sps.perf")" -v c="$(syscalls_in "$WORK/spc.perf")" -v n="$rts" \
        'BEGIN { if (n > 0) printf "%.2f (client %.2f + server %.2f)", (s + c) / n, c / n, s / n; else print "-" }'
}

# One sockperf ping-pong; appends "p50 p99 avg" to $WORK/<key>.
sockperf_run() { # key, label, prefix...
    local key=$1 label=$2; shift 2
    taskset -c 0 "$@" sockperf sr -i 127.0.0.1 -p "$PORT" >"$WORK/ss.out" 2>&1 &
    local sp=$!; PIDS+=("$sp"); sleep 0.5
    taskset -c 1 "$@" sockperf pp -i 127.0.0.1 -p "$PORT" -m 64 -t "$T" >"$WORK/sc.out" 2>&1 || true
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
col() { cut -d' ' -f"$2" "$WORK/$1" | median; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", (b > 0 ? a / b : 0) }'; }

PRE=(env LD_PRELOAD="$SO" WARPSOCK_UDP_OFFLOAD=1)
PLAIN=(env)
GSO=(env LD_PRELOAD="$SO" WARPSOCK_UDP_OFFLOAD=1 WARPSOCK_UDP_MODE=gso)
part() { [ -z "$ONLY" ] || [ "$ONLY" = "$1" ]; }

# One iperf3 TCP run; appends the received Gbit/s to $WORK/<key>.
iperf3_run() { # key, label, prefix...
    local key=$1 label=$2; shift 2
    "$@" iperf3 -s -1 -B 127.0.0.1 -p "$PORT" >"$WORK/t3s.out" 2>&1 &
    local sp=$!; PIDS+=("$sp"); sleep 0.5
    "$@" iperf3 -c 127.0.0.1 -p "$PORT" -t "$T" -J >"$WORK/t3c.json" 2>"$WORK/t3c.err" || true
    wait "$sp" 2>/dev/null || true; PIDS=()
    local g
    g=$(python3 -c 'import json,sys; print("%.3f" % (json.load(open(sys.argv[1]))["end"]["sum_received"]["bits_per_second"] / 1e9))' \
        "$WORK/t3c.json" 2>/dev/null) || { cat "$WORK/t3c.err" >&2; echo "bench: iperf3 ($label) gave no result" >&2; exit 1; }
    echo "$g" >>"$WORK/$key"
    printf '  %-34s %8s Gbit/s received\n' "$label" "$g"
}

if part iperf; then
    echo "== iperf 2 UDP, 1470 B, -b 100G, ${T}s, 127.0.0.1, $RUNS rounds =="
    IMODES=(host offload gso)
    declare -A ILABEL=([host]="host UDP" [offload]="UDP offload (TCP path)" [gso]="GSO path -> plain receiver")
    for r in $(seq "$RUNS"); do
        echo "round $r:"
        iperf_run host "${ILABEL[host]}" PLAIN PLAIN
        iperf_run offload "${ILABEL[offload]}" PRE PRE
        iperf_run gso "${ILABEL[gso]}" PLAIN GSO
    done
    HM=$(col host 1); HC=$(col host 2)
    echo "medians over $RUNS rounds (ratios to host UDP's medians):"
    for m in "${IMODES[@]}"; do
        mb=$(col "$m" 1); cg=$(col "$m" 2)
        printf '  %-28s %6s Mbit/s (%sx)  lost %6s%%  cpu/GB %6s s (%sx)  syscalls/dgram snd %s rcv %s\n' \
            "${ILABEL[$m]}" "$mb" "$(ratio "$mb" "$HM")" "$(col "$m" 3)" "$cg" "$(ratio "$cg" "$HC")" \
            "$(col "$m" 4)" "$(col "$m" 5)"
    done
fi
if part sockperf; then
    echo "== sockperf ping-pong, 64 B, ${T}s, server CPU 0, client CPU 1, $RUNS rounds (half round trip) =="
    # Keys of their own (sp-*): the iperf part writes $WORK/host and
    # $WORK/offload, and sharing them mixed its rows into these medians.
    MODES=(sp-host sp-offload sp-busy sp-progress)
    declare -A LABEL=([sp-host]="host UDP" [sp-offload]="offload (default)"
        [sp-busy]="offload busy-poll ${BUSY_US} us" [sp-progress]="offload, WARPSOCK_CALLER_RECV=0")
    for r in $(seq "$RUNS"); do
        echo "round $r:"
        sockperf_run sp-host "${LABEL[sp-host]}" env
        sockperf_run sp-offload "${LABEL[sp-offload]}" "${PRE[@]}"
        sockperf_run sp-busy "${LABEL[sp-busy]}" "${PRE[@]}" WARPSOCK_BUSY_POLL_US="$BUSY_US"
        sockperf_run sp-progress "${LABEL[sp-progress]}" "${PRE[@]}" WARPSOCK_CALLER_RECV=0
    done
    HOST50=$(col sp-host 1)
    echo "medians over $RUNS rounds (ratio: median p50 / host UDP median p50):"
    for m in "${MODES[@]}"; do
        p50=$(col "$m" 1)
        p99=$(col "$m" 2)
        printf '  %-34s p50 %7s  p99 %8s usec  ratio %5.2fx\n' "${LABEL[$m]}" "$p50" "$p99" \
            "$(awk -v a="$p50" -v b="$HOST50" 'BEGIN { print a / b }')"
    done
    echo "system calls per round trip (perf raw_syscalls:sys_enter, a 1 s run of its own per mode):"
    printf '  %-34s %s\n' "${LABEL[sp-host]}" "$(sockperf_syscalls env)"
    printf '  %-34s %s\n' "${LABEL[sp-offload]}" "$(sockperf_syscalls "${PRE[@]}")"
    printf '  %-34s %s\n' "${LABEL[sp-busy]}" "$(sockperf_syscalls "${PRE[@]}" WARPSOCK_BUSY_POLL_US="$BUSY_US")"
    printf '  %-34s %s\n' "${LABEL[sp-progress]}" "$(sockperf_syscalls "${PRE[@]}" WARPSOCK_CALLER_RECV=0)"
fi
if part passthrough; then
    echo "== pass-through: iperf3 TCP, one stream, ${T}s, 127.0.0.1, $RUNS rounds =="
    for r in $(seq "$RUNS"); do
        echo "round $r:"
        iperf3_run tplain "host TCP" env
        iperf3_run tpre "host TCP, both sides preloaded" "${PRE[@]}"
    done
    TP=$(col tplain 1); TQ=$(col tpre 1)
    echo "medians over $RUNS rounds: host TCP $TP Gbit/s, preloaded $TQ Gbit/s ($(ratio "$TQ" "$TP")x; target >= 0.98x)"
fi
