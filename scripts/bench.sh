#!/usr/bin/env bash
# warpsock's main job (README "Run the benchmarks"): the benchmark suite on
# loopback, on its defaults. Installs what it needs, builds in release mode.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/ensure-pkgs.sh build-essential pkg-config
echo "== FPDU framing + CRC32c vs memcpy (criterion) =="
bash scripts/bench-micro.sh
