#!/usr/bin/env bash
# Connection rate of policy mode (issue 12): a one-thread poll-loop echo
# server on a non-blocking listener (tests/c/acceptstall.c) and a client
# (tests/c/connrate.c) that makes COUNT connections one after another —
# connect, 8 bytes each way, close. Each round runs host TCP (neither side
# preloaded) and each library given (both sides preloaded with
# WARPSOCK_DDP_ADDRS=127.0.0.1/32: every connection switches into DDP
# mode), the order rotating; prints each run's connections a second, its
# ratio to the round's host TCP, and per library the median ratio.
#
#   scripts/bench-ddp-accept.sh ROUNDS COUNT A.so [B.so]
#
# SERVER_WAIT=select: the server's loop waits in select(2) instead of
# poll(2) (a select over numbers still switching, `interpose::wait::select`);
# SERVER_WAIT=epoll: in epoll_wait(2), each connection registered as it is
# accepted (redis's and nginx's way).
# SERVER_PLAIN=1: the server runs without the library (a server without
# warpsock): each preloaded client's first switch waits out its fallback
# (WARPSOCK_DDP_FALLBACK_MS), and the process then remembers the server
# (WARPSOCK_DDP_PLAIN_MEMORY_MS at its default, not 0 as in the other runs).
#
# Measure on a quiet machine: `uptime` is printed before and after.
# Loopback only; bounded: each client run stops after 60 s, each server is
# killed by pid.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ $# -lt 3 ]; then
    sed -n '2,18p' "$0" >&2
    exit 2
fi
ROUNDS=$1
COUNT=$2
shift 2
for v in "$ROUNDS" "$COUNT"; do
    case "$v" in
        '' | *[!0-9]*) echo "bench-ddp-accept: ROUNDS and COUNT must be numbers" >&2; exit 2 ;;
    esac
done
[ "$ROUNDS" -ge 1 ] && [ "$ROUNDS" -le 50 ] && [ "$COUNT" -ge 1 ] && [ "$COUNT" -le 100000 ] || {
    echo "bench-ddp-accept: ROUNDS 1..50, COUNT 1..100000" >&2
    exit 2
}
LIBS=()
for f in "$@"; do
    [ -f "$f" ] || { echo "bench-ddp-accept: $f: no such library" >&2; exit 2; }
    LIBS+=("$(realpath "$f")")
done

WORK=$(mktemp -d)
SERVER_PID=
cleanup() {
    if [ -n "$SERVER_PID" ]; then
        kill "$SERVER_PID" 2>/dev/null || true
        wait "$SERVER_PID" 2>/dev/null || true
    fi
    rm -rf "$WORK"
}
trap cleanup EXIT
gcc -O2 -Wall -Wextra -Werror crates/warpsock-preload/tests/c/connrate.c -o "$WORK/conn-rate"
gcc -O2 -Wall -Wextra -Werror -Icrates/warpsock-preload/tests/c \
    crates/warpsock-preload/tests/c/acceptstall.c -o "$WORK/echo"

# run LIB: one run, LIB empty for host TCP; writes the rate to $WORK/rate.
# Run in the script's own shell (not in $(...)), so that SERVER_PID is the
# cleanup's: a failed client run left the server running for good.
run() {
    local lib=$1 env=() server_env=()
    if [ -n "$lib" ]; then
        env=(LD_PRELOAD="$lib" WARPSOCK_DDP_ADDRS=127.0.0.1/32)
        [ "${SERVER_PLAIN:-0}" = 1 ] || env+=(WARPSOCK_DDP_PLAIN_MEMORY_MS=0)
    fi
    [ "${SERVER_PLAIN:-0}" = 1 ] || server_env=("${env[@]}")
    : > "$WORK/ready"
    local wait_args=()
    case "${SERVER_WAIT:-poll}" in
        poll) ;;
        select | epoll) wait_args=("$SERVER_WAIT") ;;
        *) echo "bench-ddp-accept: SERVER_WAIT must be poll, select or epoll" >&2; exit 2 ;;
    esac
    env "${server_env[@]}" "$WORK/echo" "${wait_args[@]}" > "$WORK/ready" 2>/dev/null &
    SERVER_PID=$!
    local port= i
    for i in $(seq 100); do
        port=$(sed -n 's/^ready //p' "$WORK/ready")
        [ -n "$port" ] && break
        sleep 0.1
    done
    [ -n "$port" ] || { echo "bench-ddp-accept: the server did not start" >&2; exit 1; }
    local out
    out=$(env "${env[@]}" "$WORK/conn-rate" "$port" "$COUNT" 60)
    kill "$SERVER_PID" 2>/dev/null || true
    wait "$SERVER_PID" 2>/dev/null || true
    SERVER_PID=
    awk '{ print $6 }' <<< "$out" > "$WORK/rate"
}

# shellcheck source=scripts/lib/median.sh
source scripts/lib/median.sh

echo "load: $(uptime)"
NAMES=(host "${LIBS[@]}")
N=${#NAMES[@]}
for r in $(seq "$ROUNDS"); do
    declare -A rate=()
    for k in $(seq 0 $((N - 1))); do
        i=$(( (k + r) % N ))
        if [ "$i" -eq 0 ]; then run ""; else run "${NAMES[$i]}"; fi
        rate[$i]=$(cat "$WORK/rate")
    done
    line="round $r: host ${rate[0]}/s"
    for i in $(seq 1 $((N - 1))); do
        ratio=$(awk -v a="${rate[$i]}" -v h="${rate[0]}" 'BEGIN { printf "%.3f", a / h }')
        line+="; lib$i ${rate[$i]}/s (${ratio}x)"
        echo "$ratio" >> "$WORK/ratios$i"
    done
    echo "$line"
    unset rate
done
for i in $(seq 1 $((N - 1))); do
    med=$(median "$WORK/ratios$i")
    echo "lib$i ${NAMES[$i]}: median ${med}x host TCP's connection rate over $ROUNDS rounds"
done
echo "load: $(uptime)"
