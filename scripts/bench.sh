#!/usr/bin/env bash
# warpsock's main job (README "Run the benchmarks"): `warpsock bench` on its
# defaults, built in release mode — on loopback, host TCP next to warpsock
# Send, RDMA Write and RDMA Read with CRC off and on: 8-byte ping-pong latency
# (both sides pinned to one CPU) and 1 MiB bandwidth, as a table with the
# ratio to host TCP (about a minute). Then the FPDU micro-benchmarks.
#
#   bash scripts/bench.sh                 # defaults
#   bash scripts/bench.sh --json out.json # extra arguments go to `warpsock bench`
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/ensure-pkgs.sh build-essential pkg-config
echo "+ cargo build --release -p warpsock-cli" >&2
cargo build --release --quiet -p warpsock-cli
echo "== warpsock bench $* =="
cargo run --release --quiet -p warpsock-cli --bin warpsock -- bench "$@"
if [ -e scripts/bench-micro.sh ]; then
    echo
    echo "== FPDU framing + CRC32c vs memcpy (criterion) =="
    bash scripts/bench-micro.sh
fi
