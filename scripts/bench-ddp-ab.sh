#!/usr/bin/env bash
# A/B timing of two builds of libwarpsock_preload.so on the DDP-socket rows
# of `warpsock bench` (issue 12's targets), interleaved so that both builds
# see the same machine: each round runs the bench once under A and once
# under B, the order alternating, and every run measures host TCP in the
# same process pair, so each row is a ratio to its own baseline. Prints
# each round's ratio and, per build, the median and range over the rounds.
#
#   scripts/bench-ddp-ab.sh A.so B.so ROUNDS [bench args...]
#
# Default bench args: the 8 B busy-poll row,
#   --tests lat --sizes 8 --transports tcp,ddp-socket --crc off --duration 2 --busy-poll 50
# The `warpsock` binary is $WARPSOCK (default: target/release/warpsock);
# the libraries are handed to it with WARPSOCK_PRELOAD_LIB. Latency rows
# compare one-way p50s (lower is better), bandwidth rows GB/s.
# Measure on a quiet machine: the script prints `uptime` before and after.
# Loopback only (the bench's own default); bounded: ROUNDS x 2 runs.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ $# -lt 3 ]; then
    sed -n '2,17p' "$0" >&2
    exit 2
fi
A=$(realpath "$1")
B=$(realpath "$2")
ROUNDS=$3
shift 3
for f in "$A" "$B"; do
    [ -f "$f" ] || { echo "bench-ddp-ab: $f: no such library" >&2; exit 2; }
done
case "$ROUNDS" in
    '' | *[!0-9]*) echo "bench-ddp-ab: ROUNDS must be a number, not '$ROUNDS'" >&2; exit 2 ;;
esac
[ "$ROUNDS" -ge 1 ] && [ "$ROUNDS" -le 100 ] || {
    echo "bench-ddp-ab: ROUNDS must be 1 to 100" >&2
    exit 2
}
ARGS=("$@")
[ ${#ARGS[@]} -gt 0 ] || ARGS=(--tests lat --sizes 8 --transports tcp,ddp-socket --crc off --duration 2 --busy-poll 50)
W=${WARPSOCK:-target/release/warpsock}
[ -x "$W" ] || { echo "bench-ddp-ab: $W not built (cargo build --release -p warpsock-cli)" >&2; exit 2; }

OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
echo "uptime before: $(uptime)"
echo "bench args: ${ARGS[*]}"

# run LABEL LIB ROUND: one bench run; its ratio rows appended to $OUT/ratios.
run() {
    local js="$OUT/$1.$3.json"
    if ! WARPSOCK_PRELOAD_LIB=$2 timeout 600 "$W" bench "${ARGS[@]}" --json "$js" --max-samples 1 \
        >"$OUT/log" 2>&1; then
        cat "$OUT/log" >&2
        echo "bench-ddp-ab: the bench under $1 ($2) failed in round $3" >&2
        exit 1
    fi
    # Pair each non-TCP row with the host-TCP row of the same test, size,
    # connections and busy poll: the ratio of one-way p50s for latency, of
    # GB/s for bandwidth.
    python3 - "$js" "$1" "$3" >>"$OUT/ratios" <<'PY'
import json, sys
path, label, rnd = sys.argv[1], sys.argv[2], sys.argv[3]
rows = json.load(open(path))["results"]
def key(r):
    return (r["test"], r["size"], r["conns"], r["busy_poll_us"])
base = {key(r): r for r in rows if r["transport"] == "tcp" and r["ok"]}
for r in rows:
    if r["transport"] == "tcp" or key(r) not in base:
        continue
    if not r["ok"]:
        sys.exit(f"bench-ddp-ab: {label} round {rnd}: {r['transport']} {r['test']} {r['size']} failed")
    b = base[key(r)]
    name = f'{r["test"]} {r["size"]} B' + (f' busy {r["busy_poll_us"]}' if r["busy_poll_us"] else "")
    if r.get("one_way_us"):
        x, y = r["one_way_us"]["p50"], b["one_way_us"]["p50"]
        what = f"p50 {x:.2f} us vs tcp {y:.2f}"
    else:
        x, y = r["gbps"], b["gbps"]
        what = f"{x:.3f} GB/s vs tcp {y:.3f}"
    print(f'{label}\t{rnd}\t{r["transport"]}\t{name}\t{x / y:.4f}\t{what}')
PY
}

for i in $(seq 1 "$ROUNDS"); do
    if [ $((i % 2)) = 1 ]; then
        run A "$A" "$i"
        run B "$B" "$i"
    else
        run B "$B" "$i"
        run A "$A" "$i"
    fi
    grep -P "^[AB]\t$i\t" "$OUT/ratios" | cut -f1,2,3,4,5,6
done
echo "uptime after: $(uptime)"
python3 - "$OUT/ratios" <<'PY'
import statistics, sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1])]
groups = {}
for label, rnd, tr, row, ratio, _ in rows:
    groups.setdefault((tr, row), {}).setdefault(label, []).append(float(ratio))
for (tr, row), by in sorted(groups.items()):
    parts = []
    for label in ("A", "B"):
        v = by.get(label, [])
        if v:
            parts.append(f"{label} median {statistics.median(v):.3f}x ({min(v):.3f}-{max(v):.3f}, {len(v)} rounds)")
    print(f"{tr} {row} / tcp: " + "; ".join(parts))
PY
