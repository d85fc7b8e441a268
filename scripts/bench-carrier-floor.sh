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
#        scripts/bench-carrier-floor.sh --budget [rounds, default 9]
#        scripts/bench-carrier-floor.sh --check   (the test command: builds
#        with -Werror, runs every shape briefly, checks each ran; no timing)
#
# --budget: the library's time budget per hop for the two DDP rows. Each
# round runs the host baseline and the carried shape with the library's
# answer replaced by a spin of PAD ns per hop (carrier-floor.c's PAD_NS:
# between reading a message and sending the next, on both sides), for
# every pad in BUDGET_PADS (default "0 20 40 60 80 100 120 160 200"). It
# prints each pad's ratio, a straight line fitted through them, and the pad
# where the line meets the row's target: what the library's read tail and
# send head together may take per hop. Reading the line the other way gives
# the library's own time: the pad whose ratio is the suite's.
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
BUDGET=0
if [ "${1:-}" = "--check" ]; then
    CHECK=1
    ROUNDS=1
    RT=300
elif [ "${1:-}" = "--budget" ]; then
    BUDGET=1
    ROUNDS="${2:-9}"
    RT="${ROUND_TRIPS:-20000}"
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

# shape SHAPE [PAD_NS]: one run; prints its microseconds per round trip
# after checking what the program printed.
shape() {
    local out name us n
    out=$("$BIN" "$1" "$RT" ${2:+"$2"})
    read -r name us n <<<"$out"
    if [ "$name" != "$1" ] || [ "$n" != "$RT" ] || ! awk -v u="$us" 'BEGIN { exit !(u > 0) }'; then
        echo "carrier-floor $1${2:+ pad $2}: unexpected output '$out'" >&2
        exit 1
    fi
    echo "$us"
}

# shellcheck source=scripts/lib/median.sh
source scripts/lib/median.sh

if [ "$BUDGET" = 1 ]; then
    read -r -a PADS <<<"${BUDGET_PADS:-0 20 40 60 80 100 120 160 200}"
    for p in "${PADS[@]}"; do
        case "$p" in "" | *[!0-9]*) echo "BUDGET_PADS: nanoseconds, ascending" >&2; exit 2 ;; esac
    done
    BPAIRS=("tcp-event ddp-event" "tcp-busy ddp-busy")
    BLABELS=("DDP event" "DDP busy")
    BTARGETS=("1.10" "1.00")
    echo "load: $(uptime)"
    echo "$ROUNDS rounds, $RT round trips per run, pads (ns per hop): ${PADS[*]}"
    for ((r = 1; r <= ROUNDS; r++)); do
        for p in "${BPAIRS[@]}"; do
            read -r base carried <<<"$p"
            # The baseline between the pads, alternating ends by round.
            ((r % 2)) && shape "$base" >>"$WORK/$base"
            for pad in "${PADS[@]}"; do
                shape "$carried" "$pad" >>"$WORK/$carried+$pad"
            done
            ((r % 2)) || shape "$base" >>"$WORK/$base"
        done
        echo "round $r done"
    done
    for i in "${!BPAIRS[@]}"; do
        read -r base carried <<<"${BPAIRS[$i]}"
        mb=$(median "$WORK/$base")
        echo
        printf '%s: %s %.2f us per round trip; target <= %sx\n' "${BLABELS[$i]}" "$base" "$mb" "${BTARGETS[$i]}"
        printf '%10s %10s %8s\n' "pad ns" "us/RT" "ratio"
        : >"$WORK/curve"
        for pad in "${PADS[@]}"; do
            mc=$(median "$WORK/$carried+$pad")
            ratio=$(awk -v a="$mc" -v b="$mb" 'BEGIN { printf "%.3f", a / b }')
            printf '%10s %10.2f %7sx\n' "$pad" "$mc" "$ratio"
            echo "$pad $ratio" >>"$WORK/curve"
        done
        # A straight line through the points (least squares: one round's
        # noise moves a crossing read between two pads by tens of ns), and
        # the pad where it meets the target.
        awk -v t="${BTARGETS[$i]}" '
            { n++; x += $1; y += $2; xx += $1 * $1; xy += $1 * $2; last = $1 }
            END {
                d = n * xx - x * x
                if (n < 2 || d == 0) { print "budget: needs two pads or more"; exit }
                b = (n * xy - x * y) / d; a = (y - b * x) / n
                printf "fit: %.3fx + %.5fx per ns of pad\n", a, b
                if (b <= 0) { print "budget: the ratio did not grow with the pad (a noisy run)"; exit }
                c = (t - a) / b
                if (c < 0) printf "budget: none (the carrier alone is %.3fx by the fit)\n", a
                else printf "budget: %.0f ns per hop%s\n", c, (c > last ? " (beyond the largest pad: extrapolated)" : "")
            }' "$WORK/curve"
    done
    echo "(medians of $ROUNDS rounds; load at the end: $(cut -d' ' -f1-3 /proc/loadavg))"
    exit 0
fi

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
                us=$(WARPSOCK_TCP_CONGESTION="${s#*@}" shape "${s%@*}")
            else
                us=$(shape "$s")
            fi
            echo "$us" >>"$WORK/$s"
            line+=" $s $us"
        done
    done
    [ "$CHECK" = 1 ] || echo "$line"
done
if [ "$CHECK" = 1 ]; then
    # The pad: each carried stream shape with one (the program refuses a
    # pad on a baseline shape, and a bad one).
    shape ddp-busy 200 >/dev/null
    shape ddp-event 200 >/dev/null
    if "$BIN" tcp-busy 10 5 2>/dev/null || "$BIN" ddp-busy 10 x 2>/dev/null; then
        echo "carrier-floor: a pad on a baseline shape, or a bad one, was taken" >&2
        exit 1
    fi
    echo "carrier-floor: every shape ran ($RT round trips each, echoes checked), padded too"
    exit 0
fi
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
