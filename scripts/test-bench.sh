#!/usr/bin/env bash
# The benchmark suite's tests with nothing optional left out: the UDP offload
# pass (preload library built next to the test binary), the PNG/SVG figures
# (DejaVu font installed), the external peers of `bench --external` (iperf3,
# sockperf, ucx_perftest over UCX's TCP transport, fi_pingpong over
# libfabric's tcp provider) and, when root, the namespace pair with tc rate
# limit and nftables loss. `cargo test` runs the same tests and skips what is
# missing; this script makes each of them mandatory.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/ensure-pkgs.sh fonts-dejavu-core iproute2 nftables iperf3 sockperf ucx-utils libfabric-bin
cargo build --quiet -p warpsock-preload -p warpsock-cli
export WARPSOCK_REQUIRE_OFFLOAD=1 WARPSOCK_REQUIRE_FONT=1 WARPSOCK_REQUIRE_PEERS=1
if [ "$(id -u)" -eq 0 ]; then
    export WARPSOCK_REQUIRE_NFT=1
fi
cargo test --quiet -p warpsock-cli --test cli --test suite --test netns_peers
# The carrier's floor tool (scripts/bench-carrier-floor.sh) compiles with
# -Werror and runs every shape briefly, its echoes checked (no timing).
bash scripts/bench-carrier-floor.sh --check
# The critical-path tool (scripts/bench-critical-path.sh) compiles with
# -Werror, traces host TCP's and the DDP socket's busy ping-pong (debug
# library, ~40 s; each traced run bounded by its own timeout) and checks
# that it followed each side from the read that brought the message to the
# send of the answer (no counts compared).
bash scripts/bench-critical-path.sh --check
# The A/B timing script (scripts/bench-ddp-ab.sh) runs one short round of the
# debug build against itself: its runs under WARPSOCK_PRELOAD_LIB, its reading
# of the bench's JSON and its medians are exercised (no timing).
ab=$(WARPSOCK=target/debug/warpsock bash scripts/bench-ddp-ab.sh \
    target/debug/libwarpsock_preload.so target/debug/libwarpsock_preload.so 1 \
    --tests lat --sizes 8 --transports tcp,ddp-socket --crc off --iters 200)
if ! grep -Eq '^ddp-socket lat 8 B / tcp: A median [0-9.]+x \(.*1 rounds\); B median [0-9.]+x' <<<"$ab"; then
    printf '%s\n' "$ab" >&2
    echo "test-bench: scripts/bench-ddp-ab.sh printed no A/B medians" >&2
    exit 1
fi
# The pass-through timing script (scripts/bench-passthrough.sh) runs one
# round of 1 s runs of the debug build (about 10 s): its plain iperf3 and
# sockperf servers, its preloaded and plain clients, its reading of iperf3's
# JSON and of sockperf's p50, and its medians are exercised (no timing).
pt=$(timeout 120 bash scripts/bench-passthrough.sh target/debug/libwarpsock_preload.so 1 1) || {
    printf '%s\n' "$pt" >&2
    echo "test-bench: scripts/bench-passthrough.sh failed" >&2
    exit 1
}
if ! grep -Eq '^iperf3 TCP preloaded / plain: median [0-9.]+x \(.*1 rounds\)' <<<"$pt" \
    || ! grep -Eq '^sockperf TCP 64 B p50 preloaded / plain: median [0-9.]+x \(.*1 rounds\)' <<<"$pt"; then
    printf '%s\n' "$pt" >&2
    echo "test-bench: scripts/bench-passthrough.sh printed no iperf3 and sockperf medians" >&2
    exit 1
fi
# The splice timing script (scripts/bench-ddp-splice.sh) runs one round of
# 4 MiB runs of the debug build (a few seconds): its program built with
# -Werror, both modes over host TCP and switched, and its medians (no
# timing).
sp=$(timeout 120 bash scripts/bench-ddp-splice.sh 1 4 target/debug/libwarpsock_preload.so) || {
    printf '%s\n' "$sp" >&2
    echo "test-bench: scripts/bench-ddp-splice.sh failed" >&2
    exit 1
}
for mode in read splice; do
    if ! grep -Eq "^lib1 .* $mode: median [0-9.]+x host TCP over 1 rounds" <<<"$sp"; then
        printf '%s\n' "$sp" >&2
        echo "test-bench: scripts/bench-ddp-splice.sh printed no $mode median" >&2
        exit 1
    fi
done
