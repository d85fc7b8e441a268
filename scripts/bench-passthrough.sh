#!/usr/bin/env bash
# Pass-through timing of libwarpsock_preload.so on 127.0.0.1 (issue 12's
# targets): a plain TCP program must not notice the preload. Each round runs
# the client once preloaded and once plain, the order alternating per round,
# against servers that stay plain (started once by the script, on leased
# ports); the server is pinned to CPU 0 and the client to CPU 1, both
# variants alike. Per round, preloaded / plain of:
#   - iperf3 TCP, one stream, SECONDS: received Gbit/s (higher is better;
#     target >= 0.98x);
#   - sockperf TCP ping-pong, 64 B, SECONDS: the p50 of sockperf's one-way
#     latency (half a round trip; lower is better; target <= 1.02x).
# Prints each round's ratios and, per target, the median and range.
#
#   scripts/bench-passthrough.sh LIB ROUNDS [SECONDS]
#
# LIB: the preload library to test (e.g. target/release/libwarpsock_preload.so),
# loaded with LD_PRELOAD in pass-through mode: LD_PRELOAD and every WARPSOCK_*
# variable (WARPSOCK_DDP_*, WARPSOCK_UDP_OFFLOAD, ...) are removed from the
# environment first. ROUNDS: 1 to 100. SECONDS per run: 1 to 60 (default 5).
# Measure on a quiet machine: the script prints `uptime` before and after.
# Loopback only; bounded: ROUNDS x 4 client runs, each under `timeout`.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ $# -lt 2 ] || [ $# -gt 3 ]; then
    sed -n '2,21p' "$0" >&2
    exit 2
fi
LIB=$(realpath "$1")
ROUNDS=$2
SECS=${3:-5}
[ -f "$LIB" ] || { echo "bench-passthrough: $1: no such library" >&2; exit 2; }
# bounded NAME VALUE MIN MAX: VALUE is a whole number from MIN to MAX, or
# the script stops with a message naming NAME.
bounded() {
    case "$2" in
        '' | *[!0-9]*) echo "bench-passthrough: $1 must be a whole number, not '$2'" >&2; exit 2 ;;
    esac
    if [ "$2" -lt "$3" ] || [ "$2" -gt "$4" ]; then
        echo "bench-passthrough: $1 must be $3 to $4" >&2
        exit 2
    fi
}
bounded ROUNDS "$ROUNDS" 1 100
bounded SECONDS "$SECS" 1 60

fail() { echo "bench-passthrough: $*" >&2; exit 1; }

# Pass-through mode only: nothing from the caller's environment may turn on
# a DDP socket, the UDP offload or another preload, in either variant.
CLEARED=()
for v in $(compgen -e); do
    case "$v" in
        WARPSOCK_* | LD_PRELOAD) unset "$v"; CLEARED+=("$v") ;;
    esac
done

OUT=$(mktemp -d /tmp/warpsock-bench-passthrough.XXXXXX)
PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
    rm -rf "$OUT"
}
trap cleanup EXIT

scripts/ensure-pkgs.sh iperf3 sockperf iproute2 >/dev/null
# LD_PRELOAD of a file the loader cannot use only warns, and the run would
# go plain: check that the library is mapped into a process.
env LD_PRELOAD="$LIB" grep -qF "$LIB" /proc/self/maps 2>"$OUT/check.err" \
    || { cat "$OUT/check.err" >&2; fail "$LIB is not loaded by LD_PRELOAD"; }
if ! taskset -c 0 true 2>/dev/null || ! taskset -c 1 true 2>/dev/null; then
    fail "needs CPUs 0 and 1 (the server on 0, the client on 1)"
fi

PLAIN=(env)
PRE=(env LD_PRELOAD="$LIB")
RUN_LIMIT=$((SECS * 3 + 30))                    # one client run
SERVER_LIMIT=$((ROUNDS * 4 * RUN_LIMIT + 120))  # the servers, whatever happens to the script

# Ports below the ephemeral range, locked like warpsock-testkit's leases.
# shellcheck source=scripts/lib/lease-port.sh
. scripts/lib/lease-port.sh
lease_port
IPORT=$PORT
lease_port
SPORT=$PORT

# wait_listen PORT PID LOG: until something listens on TCP PORT (10 s), as
# long as the server PID lives.
wait_listen() {
    for _ in $(seq 100); do
        ss -Hltn "sport = :$1" 2>/dev/null | grep -q . && return 0
        kill -0 "$2" 2>/dev/null || { cat "$3" >&2; fail "the server for port $1 exited"; }
        sleep 0.1
    done
    cat "$3" >&2
    fail "nothing listens on TCP port $1"
}

# The servers, plain, on CPU 0 (each pid is timeout's, which passes the
# cleanup's SIGTERM on).
taskset -c 0 timeout "$SERVER_LIMIT" iperf3 -s -B 127.0.0.1 -p "$IPORT" >"$OUT/iperf3-server.log" 2>&1 &
PIDS+=($!)
wait_listen "$IPORT" "${PIDS[-1]}" "$OUT/iperf3-server.log"
taskset -c 0 timeout "$SERVER_LIMIT" sockperf sr --tcp -i 127.0.0.1 -p "$SPORT" >"$OUT/sockperf-server.log" 2>&1 &
PIDS+=($!)
wait_listen "$SPORT" "${PIDS[-1]}" "$OUT/sockperf-server.log"

echo "uptime before: $(uptime)"
echo "library: $LIB (LD_PRELOAD, pass-through; cleared from the environment: ${CLEARED[*]:-none})"
echo "runs: ${SECS} s each, 127.0.0.1, server CPU 0, client CPU 1; iperf3 port $IPORT, sockperf port $SPORT"

# not_preloaded ERRFILE: the loader's warning that it ignored LD_PRELOAD.
not_preloaded() { grep -q 'cannot be preloaded' "$1"; }

# iperf3_run LABEL PREFIX...: one iperf3 TCP run; sets GBPS (received).
iperf3_run() {
    local label=$1
    shift
    if ! timeout "$RUN_LIMIT" taskset -c 1 "$@" iperf3 -c 127.0.0.1 -p "$IPORT" -t "$SECS" -J \
        >"$OUT/iperf3.json" 2>"$OUT/iperf3.err"; then
        cat "$OUT/iperf3.json" "$OUT/iperf3.err" "$OUT/iperf3-server.log" >&2
        fail "iperf3 ($label) failed"
    fi
    ! not_preloaded "$OUT/iperf3.err" || { cat "$OUT/iperf3.err" >&2; fail "iperf3 ($label): the library was not preloaded"; }
    GBPS=$(python3 -c 'import json, sys
b = json.load(open(sys.argv[1]))["end"]["sum_received"]["bits_per_second"]
assert b > 0
print("%.3f" % (b / 1e9))' "$OUT/iperf3.json") || {
        cat "$OUT/iperf3.json" >&2
        fail "iperf3 ($label) gave no received throughput"
    }
}

# sockperf_run LABEL PREFIX...: one 64 B TCP ping-pong; sets P50 (us, one way).
sockperf_run() {
    local label=$1
    shift
    if ! timeout "$RUN_LIMIT" taskset -c 1 "$@" sockperf pp --tcp -i 127.0.0.1 -p "$SPORT" -m 64 -t "$SECS" \
        >"$OUT/sockperf.out" 2>&1; then
        cat "$OUT/sockperf.out" "$OUT/sockperf-server.log" >&2
        fail "sockperf ($label) failed"
    fi
    ! not_preloaded "$OUT/sockperf.out" || { cat "$OUT/sockperf.out" >&2; fail "sockperf ($label): the library was not preloaded"; }
    # "sockperf: ---> percentile 50.000 =   28.811" (sockperf 3.7)
    P50=$(sed -n 's/.*---> percentile 50\.000 = *\([0-9.]*\).*/\1/p' "$OUT/sockperf.out" | head -1)
    [ -n "$P50" ] || { cat "$OUT/sockperf.out" >&2; fail "sockperf ($label) printed no 50th percentile"; }
}

# pair KIND ROUND: the plain and the preloaded run of one tool (iperf3 or
# sockperf), the order alternating with the round; sets PLAIN_V and PRE_V.
pair() {
    local order=(plain pre) v p
    [ $(($2 % 2)) = 1 ] || order=(pre plain)
    for v in "${order[@]}"; do
        if [ "$v" = plain ]; then p=("${PLAIN[@]}"); else p=("${PRE[@]}"); fi
        if [ "$1" = iperf3 ]; then
            iperf3_run "$v" "${p[@]}"
            printf -v "${v^^}_V" '%s' "$GBPS"
        else
            sockperf_run "$v" "${p[@]}"
            printf -v "${v^^}_V" '%s' "$P50"
        fi
    done
}

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.4f", a / b }'; }

for i in $(seq 1 "$ROUNDS"); do
    first="plain first"
    [ $((i % 2)) = 1 ] || first="preloaded first"
    pair iperf3 "$i"
    ir=$(ratio "$PRE_V" "$PLAIN_V")
    echo "round $i ($first): iperf3 TCP plain $PLAIN_V Gbit/s, preloaded $PRE_V Gbit/s: ${ir}x"
    ip=$PLAIN_V iq=$PRE_V
    pair sockperf "$i"
    sr=$(ratio "$PRE_V" "$PLAIN_V")
    echo "round $i ($first): sockperf TCP 64 B p50 plain $PLAIN_V us, preloaded $PRE_V us: ${sr}x"
    printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$ip" "$iq" "$ir" "$PLAIN_V" "$PRE_V" "$sr" >>"$OUT/rounds"
done
echo "uptime after: $(uptime)"
python3 - "$OUT/rounds" <<'PY'
import statistics, sys
rows = [[float(x) for x in l.split("\t")] for l in open(sys.argv[1])]
n = len(rows)
def line(name, col, unit, fmt, target, ok):
    r = [row[col + 2] for row in rows]
    m = statistics.median(r)
    plain = statistics.median(row[col] for row in rows)
    pre = statistics.median(row[col + 1] for row in rows)
    verdict = "met" if ok(m) else "NOT met"
    print(f"{name} preloaded / plain: median {m:.3f}x ({min(r):.3f}-{max(r):.3f}, {n} rounds); "
          f"plain {fmt % plain} {unit}, preloaded {fmt % pre} {unit} (medians); "
          f"target {target}: {verdict} on the median")
line("iperf3 TCP", 0, "Gbit/s", "%.2f", ">= 0.98x", lambda m: m >= 0.98)
line("sockperf TCP 64 B p50", 3, "us", "%.3f", "<= 1.02x", lambda m: m <= 1.02)
PY
