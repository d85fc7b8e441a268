#!/usr/bin/env bash
# splice(2) from a DDP-mode socket (issue 12; interpose/transfer.rs)
# against read(2) of it and against host TCP, in the same rounds: a writer
# thread streams MIB MiB through one loopback pair in one process
# (tests/c/splicerate.c), read 64 KiB a call with read (READ) or moved
# socket -> pipe -> /dev/null with splice (SPLICE). Each round runs both
# modes over host TCP and under each library (both ends switched), the
# order rotating; prints each run's MiB/s and, per library and mode, the
# median ratio to the same round's host TCP in the same mode.
#
#   scripts/bench-ddp-splice.sh ROUNDS MIB LIB...
#
# ROUNDS 1..20, MIB 1..4096. Measure on a quiet machine: `uptime` is
# printed before and after. Loopback only; bounded: each run under
# `timeout 120`.
set -euo pipefail
cd "$(dirname "$0")/.."

[ $# -ge 3 ] || { sed -n '2,15p' "$0" >&2; exit 2; }
ROUNDS=$1
MIB=$2
shift 2
for v in "$ROUNDS" "$MIB"; do
    case "$v" in
        '' | *[!0-9]*) echo "bench-ddp-splice: ROUNDS and MIB must be numbers" >&2; exit 2 ;;
    esac
done
[ "$ROUNDS" -ge 1 ] && [ "$ROUNDS" -le 20 ] && [ "$MIB" -ge 1 ] && [ "$MIB" -le 4096 ] || {
    echo "bench-ddp-splice: ROUNDS 1..20, MIB 1..4096" >&2
    exit 2
}
LIBS=()
for f in "$@"; do
    [ -f "$f" ] || { echo "bench-ddp-splice: $f: no such library" >&2; exit 2; }
    LIBS+=("$(realpath "$f")")
done

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
gcc -O2 -Wall -Wextra -Werror -pthread -Icrates/warpsock-preload/include \
    crates/warpsock-preload/tests/c/splicerate.c -o "$WORK/rate"

# rate LIB MODE: one run's MiB/s (LIB empty: host TCP).
rate() {
    local out
    if [ -n "$1" ]; then
        out=$(WARPSOCK_CRC="${WARPSOCK_CRC:-1}" LD_PRELOAD="$1" timeout 120 "$WORK/rate" ddp "$2" "$MIB")
    else
        out=$(timeout 120 "$WORK/rate" plain "$2" "$MIB")
    fi
    sed -n 's/^rate //p' <<< "$out"
}

# shellcheck source=scripts/lib/median.sh
source scripts/lib/median.sh

echo "load: $(uptime)"
NAMES=(host "${LIBS[@]}")
N=${#NAMES[@]}
for r in $(seq "$ROUNDS"); do
    for mode in read splice; do
        declare -A got=()
        for k in $(seq 0 $((N - 1))); do
            i=$(( (k + r) % N ))
            if [ "$i" -eq 0 ]; then got[$i]=$(rate "" "$mode"); else got[$i]=$(rate "${NAMES[$i]}" "$mode"); fi
        done
        line="round $r $mode: host ${got[0]} MiB/s"
        for i in $(seq 1 $((N - 1))); do
            ratio=$(awk -v a="${got[$i]}" -v h="${got[0]}" 'BEGIN { printf "%.3f", a / h }')
            line+="; lib$i ${got[$i]} MiB/s (${ratio}x)"
            echo "$ratio" >> "$WORK/ratios.$i.$mode"
        done
        echo "$line"
        unset got
    done
done
for i in $(seq 1 $((N - 1))); do
    for mode in read splice; do
        med=$(median "$WORK/ratios.$i.$mode")
        echo "lib$i ${NAMES[$i]} $mode: median ${med}x host TCP over $ROUNDS rounds"
    done
done
echo "load: $(uptime)"
