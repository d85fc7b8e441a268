#!/usr/bin/env bash
# The TCP carrier's floor (issues 12 and 13): scripts/carrier-floor.c makes
# the system calls of one 8-byte ping-pong round trip with no library at all,
# as the host baseline makes them and as the offloaded path makes them over
# its TCP connection (the shapes and where each call comes from: the C
# file's head). Four pairs, each the suite row it bounds:
#   UDP event    offload-event / udp-event   (suite target <= 1.20x)
#   UDP busy     offload-busy  / udp-busy    (suite target <= 1.00x)
#   DDP event    ddp-event     / tcp-event   (suite target <= 1.10x)
#   DDP busy     ddp-busy      / tcp-busy    (suite target <= 1.00x)
# A ratio here is what the carrier alone costs: the suite's ratio can come
# down to it, not below it, without changing the calls.
#
# Usage: scripts/bench-carrier-floor.sh [rounds, default 9]
#        scripts/bench-carrier-floor.sh --check   (the test command: builds
#        with -Werror, runs every shape briefly, checks each ran; no timing)
# Environment: ROUND_TRIPS per run (default 20000); CC_AB=NAME also runs
# the two offload shapes with congestion control NAME on their connections
# (WARPSOCK_TCP_CONGESTION, default bbr as in the preload) in every round,
# right after the default's, as an A/B of the preload's default.
# Each round runs every shape once, the two of a pair back to back (which
# goes first alternates by round), so that the machine's drift hits both
# alike; medians of the rounds and their ratios at the end. Heavy: run it
# under the machine-wide lock, on a quiet machine (`uptime`: load < 0.5).
set -euo pipefail
cd "$(dirname "$0")/.."
CHECK=0
if [ "${1:-}" = "--check" ]; then
    CHECK=1
    ROUNDS=1
    RT=300
else
    ROUNDS="${1:-9}"
    RT="${ROUND_TRIPS:-20000}"
fi
case "$ROUNDS$RT" in *[!0-9]*) echo "rounds and ROUND_TRIPS are numbers" >&2; exit 2 ;; esac
WORK="$(mktemp -d /tmp/warpsock-carrier-floor.XXXXXX)"
trap 'rm -rf "$WORK"' EXIT
BIN="$WORK/carrier-floor"
${CC:-cc} -O2 -Wall -Wextra -Werror -o "$BIN" scripts/carrier-floor.c

PAIRS=("udp-event offload-event" "udp-busy offload-busy" "tcp-event ddp-event" "tcp-busy ddp-busy")
LABELS=("UDP event" "UDP busy" "DDP event" "DDP busy")
TARGETS=("1.20" "1.00" "1.10" "1.00")

[ "$CHECK" = 1 ] || echo "load: $(uptime)"
[ "$CHECK" = 1 ] || echo "$ROUNDS rounds, $RT round trips per shape and round, $(nproc) CPUs"
for ((r = 1; r <= ROUNDS; r++)); do
    line="round $r:"
    for p in "${PAIRS[@]}"; do
        read -r base carried <<<"$p"
        order=("$base" "$carried")
        ((r % 2 == 0)) && order=("$carried" "$base")
        if [ -n "${CC_AB:-}" ] && [ "${carried#offload}" != "$carried" ]; then
            order+=("$carried@$CC_AB")
        fi
        for s in "${order[@]}"; do
            if [ "${s#*@}" != "$s" ]; then
                out=$(WARPSOCK_TCP_CONGESTION="${s#*@}" "$BIN" "${s%@*}" "$RT")
                out="$s ${out#* }"
            else
                out=$("$BIN" "$s" "$RT")
            fi
            read -r name us n <<<"$out"
            if [ "$name" != "$s" ] || [ "$n" != "$RT" ] || ! awk -v u="$us" 'BEGIN { exit !(u > 0) }'; then
                echo "carrier-floor $s: unexpected output '$out'" >&2
                exit 1
            fi
            echo "$us" >>"$WORK/$s"
            line+=" $s $us"
        done
    done
    [ "$CHECK" = 1 ] || echo "$line"
done
if [ "$CHECK" = 1 ]; then
    echo "carrier-floor: every shape ran ($RT round trips each, echoes checked)"
    exit 0
fi

median() { sort -g "$1" | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
echo
printf '%-10s %14s %10s %14s %10s %8s %8s\n' "pair" "baseline" "us/RT" "carried" "us/RT" "ratio" "target"
for i in "${!PAIRS[@]}"; do
    read -r base carried <<<"${PAIRS[$i]}"
    mb=$(median "$WORK/$base")
    mc=$(median "$WORK/$carried")
    ratio=$(awk -v a="$mc" -v b="$mb" 'BEGIN { printf "%.3f", a / b }')
    printf '%-10s %14s %10.2f %14s %10.2f %7sx %7sx\n' "${LABELS[$i]}" "$base" "$mb" "$carried" "$mc" "$ratio" "<=${TARGETS[$i]}"
    if [ -s "$WORK/$carried@${CC_AB:-}" ]; then
        ma=$(median "$WORK/$carried@$CC_AB")
        ratio=$(awk -v a="$ma" -v b="$mb" 'BEGIN { printf "%.3f", a / b }')
        printf '%-10s %14s %10.2f %14s %10.2f %7sx %7sx\n' "" "" "$mb" "+$CC_AB" "$ma" "$ratio" "<=${TARGETS[$i]}"
    fi
done
echo "(medians of $ROUNDS rounds; us per round trip; load at the end: $(cut -d' ' -f1-3 /proc/loadavg))"
