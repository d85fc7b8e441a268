#!/usr/bin/env bash
# The apps suite's CI variant (`warpsock bench --suite apps --quick`) with
# nothing optional left out: nginx + wrk, redis, memcached over TCP and UDP,
# aria2c + iperf3 -P 8, GStreamer RTP, each over host TCP/UDP and the UDP
# offload (preload library built next to the binary), every case's checks
# passed, the report drawn; and, as root, the same between two network
# namespaces with rate limit and 0.5 % loss. About two minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/apps-pkgs.sh
scripts/ensure-pkgs.sh "${APPS_PKGS[@]}"
cargo build --quiet -p warpsock-preload -p warpsock-cli
export WARPSOCK_REQUIRE_APPS=1
timeout 600 cargo test --quiet -p warpsock-cli --test apps -- --test-threads=1
