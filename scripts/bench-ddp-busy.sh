#!/usr/bin/env bash
# A policy-mode client past a busy server's switching places (issue 12):
# how long its connection takes, connect to echo. The server
# (tests/c/acceptstall.c, preloaded, WARPSOCK_DDP_ADDRS=127.0.0.0/8) is
# stopped while 48 connections from 127.0.0.1 connect and mark their
# switch — its share of places for one host, which they then hold — and
# while a preloaded client (tests/c/connrate.c, one connection, its
# fallback WARPSOCK_DDP_FALLBACK_MS at its default) connects and marks;
# the server resumes once the client's mark is in (/proc/net/tcp) and
# accepts them in order. A library with the busy answer tells the client
# at once (`ddp_switch_busy`); one without leaves it to wait out its
# fallback. Each round runs each library given, the order rotating, and
# prints the client's time; then per library the median.
#
#   scripts/bench-ddp-busy.sh ROUNDS A.so [B.so ...]
#
# LATE=1: the server is not stopped: the holders wait until the server
# marked back (their places taken), and the idle server accepts the
# client's connection as it comes, before its mark as a rule — answered
# when the mark comes (`xsock::switching::late_busy`).
#
# Measure on a quiet machine: `uptime` is printed before and after.
# Loopback only; bounded: the client stops after 60 s, the server and the
# holders are killed by pid.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ $# -lt 2 ]; then
    sed -n '2,20p' "$0" >&2
    exit 2
fi
ROUNDS=$1
shift
case "$ROUNDS" in
    '' | *[!0-9]*) echo "bench-ddp-busy: ROUNDS must be a number" >&2; exit 2 ;;
esac
[ "$ROUNDS" -ge 1 ] && [ "$ROUNDS" -le 50 ] || { echo "bench-ddp-busy: ROUNDS 1..50" >&2; exit 2; }
LIBS=()
for f in "$@"; do
    [ -f "$f" ] || { echo "bench-ddp-busy: $f: no such library" >&2; exit 2; }
    LIBS+=("$(realpath "$f")")
done
SHARE=48

WORK=$(mktemp -d)
SERVER_PID=
HOLDERS_PID=
stop() {
    local p
    for p in "$SERVER_PID" "$HOLDERS_PID"; do
        if [ -n "$p" ]; then
            kill -CONT "$p" 2>/dev/null || true
            kill "$p" 2>/dev/null || true
            wait "$p" 2>/dev/null || true
        fi
    done
    SERVER_PID=
    HOLDERS_PID=
}
cleanup() {
    stop
    rm -rf "$WORK"
}
trap cleanup EXIT
gcc -O2 -Wall -Wextra -Werror crates/warpsock-preload/tests/c/connrate.c -o "$WORK/conn-rate"
gcc -O2 -Wall -Wextra -Werror -Icrates/warpsock-preload/tests/c \
    crates/warpsock-preload/tests/c/acceptstall.c -o "$WORK/echo"
# The holders: SHARE connections that mark (one urgent 0xD7) and stay
# open until stdin ends; with a third argument, each waits (up to 30 s)
# for the server's mark back first.
cat > "$WORK/holders.py" <<'EOF'
import select, socket, sys
port, n, answered = int(sys.argv[1]), int(sys.argv[2]), len(sys.argv) > 3
held = []
for _ in range(n):
    s = socket.create_connection(("127.0.0.1", port))
    s.send(b"\xd7", socket.MSG_OOB)
    if answered:
        _, _, x = select.select([], [], [s], 30)
        if not x or s.recv(1, socket.MSG_OOB) != b"\xd7":
            sys.exit("no mark back")
    held.append(s)
print("held", flush=True)
sys.stdin.read()
EOF

# The server's connections on 127.0.0.1:$1 with received bytes unread: the
# marks.
marks_queued() {
    local hex
    hex=$(printf '%04X' "$1")
    awk -v p="0100007F:$hex" 'NR > 1 && $2 == p && $4 == "01" {
        split($5, q, ":"); if (q[2] != "00000000") n++ } END { print n + 0 }' /proc/net/tcp
}

# run LIB: one run; writes the client's seconds to $WORK/secs.
run() {
    local lib=$1
    : > "$WORK/ready"
    env LD_PRELOAD="$lib" WARPSOCK_DDP_ADDRS=127.0.0.0/8 WARPSOCK_DDP_FALLBACK_MS=10000 \
        "$WORK/echo" > "$WORK/ready" 2>/dev/null &
    SERVER_PID=$!
    local port= i
    for i in $(seq 100); do
        port=$(sed -n 's/^ready //p' "$WORK/ready")
        [ -n "$port" ] && break
        sleep 0.1
    done
    [ -n "$port" ] || { echo "bench-ddp-busy: the server did not start" >&2; exit 1; }
    local late=()
    if [ "${LATE:-0}" = 1 ]; then late=(answered); else kill -STOP "$SERVER_PID"; fi
    mkfifo "$WORK/hold"
    python3 "$WORK/holders.py" "$port" "$SHARE" "${late[@]}" < "$WORK/hold" > "$WORK/held" &
    HOLDERS_PID=$!
    exec 4> "$WORK/hold"
    for i in $(seq 600); do
        grep -q held "$WORK/held" && break
        sleep 0.05
    done
    grep -q held "$WORK/held" || { echo "bench-ddp-busy: the holders did not hold" >&2; exit 1; }
    env LD_PRELOAD="$lib" WARPSOCK_DDP_ADDRS=127.0.0.1/32 WARPSOCK_DDP_PLAIN_MEMORY_MS=0 \
        "$WORK/conn-rate" "$port" 1 60 > "$WORK/client" &
    local client=$!
    if [ "${LATE:-0}" != 1 ]; then
        for i in $(seq 2000); do
            [ "$(marks_queued "$port")" -ge $((SHARE + 1)) ] && break
            sleep 0.005
        done
        kill -CONT "$SERVER_PID"
    fi
    wait "$client" || { echo "bench-ddp-busy: the client failed" >&2; exit 1; }
    exec 4>&-
    rm -f "$WORK/hold" "$WORK/held"
    stop
    awk '{ print $4 }' "$WORK/client" > "$WORK/secs"
}

# shellcheck source=scripts/lib/median.sh
source scripts/lib/median.sh

echo "load: $(uptime)"
N=${#LIBS[@]}
for r in $(seq "$ROUNDS"); do
    line="round $r:"
    for k in $(seq 0 $((N - 1))); do
        i=$(( (k + r) % N ))
        run "${LIBS[$i]}"
        secs=$(cat "$WORK/secs")
        echo "$secs" >> "$WORK/secs$i"
    done
    for i in $(seq 0 $((N - 1))); do
        line+=" lib$((i + 1)) $(tail -1 "$WORK/secs$i") s;"
    done
    echo "$line"
done
for i in $(seq 0 $((N - 1))); do
    echo "lib$((i + 1)) ${LIBS[$i]}: median $(median "$WORK/secs$i") s, connect to echo, past the places"
done
echo "load: $(uptime)"
