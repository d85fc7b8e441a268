#!/usr/bin/env bash
# warpsock's main job (README "Run the benchmarks"): `warpsock bench`, built in
# release mode together with the UDP offload preload library (so the full
# suite's udp-offload rows run), then the FPDU micro-benchmarks.
#
#   bash scripts/bench.sh                      # quick: host TCP vs warpsock, about a minute
#   bash scripts/bench.sh --suite full         # the Head-to-TOE suite (about 10 minutes)
#   bash scripts/bench.sh --suite full --max-samples 1000 \
#        --json docs/results/results.json --csv docs/results/samples.csv
#   "${CARGO_TARGET_DIR:-target}"/release/warpsock report docs/results/results.json --out docs/results
#   bash scripts/bench.sh --suite apps          # real programs (nginx, redis, memcached, ...)
#   bash scripts/bench.sh --suite apps --json docs/results/apps/results.json  # with BENCH_REPORT_DIR
#
# Extra arguments go to `warpsock bench`. With BENCH_REPORT_DIR=DIR and a
# --json FILE argument, the report (figures + summary.md) is drawn into DIR.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/ensure-pkgs.sh build-essential pkg-config fonts-dejavu-core
apps=""
prev=""
for a in "$@"; do
    { [ "$prev" = "--suite" ] && [ "$a" = apps ]; } && apps=1
    [ "$a" = "--suite=apps" ] && apps=1
    prev="$a"
done
if [ -n "$apps" ]; then
    . scripts/lib/apps-pkgs.sh
    scripts/ensure-pkgs.sh "${APPS_PKGS[@]}"
fi
echo "+ cargo build --release -p warpsock-cli -p warpsock-preload" >&2
cargo build --release --quiet -p warpsock-cli -p warpsock-preload
WS="${CARGO_TARGET_DIR:-$PWD/target}/release/warpsock"
echo "== warpsock bench $* =="
"$WS" bench "$@"
if [ -n "${BENCH_REPORT_DIR:-}" ]; then
    json=""
    prev=""
    for a in "$@"; do
        [ "$prev" = "--json" ] && json="$a"
        case "$a" in --json=*) json="${a#--json=}" ;; esac
        prev="$a"
    done
    if [ -n "$json" ]; then
        echo "== warpsock report $json --out $BENCH_REPORT_DIR =="
        "$WS" report "$json" --out "$BENCH_REPORT_DIR"
    fi
fi
if [ -e scripts/bench-micro.sh ] && [ -z "${BENCH_SKIP_MICRO:-}" ] && [ -z "$apps" ]; then
    echo
    echo "== FPDU framing + CRC32c vs memcpy (criterion) =="
    bash scripts/bench-micro.sh
fi
