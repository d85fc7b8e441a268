#!/usr/bin/env bash
# Bounded fuzzing of the wire parsers and the receive path (cargo-fuzz,
# libFuzzer, nightly). Run by the test command after `cargo test`.
#
#   scripts/test-fuzz.sh                  # rx_stream 60 s, wire_parse 30 s
#   FUZZ_RX_SECS=600 scripts/test-fuzz.sh # longer rx_stream run
#
# The long campaign (hours per target, corpus minimised for committing) is
# scripts/fuzz-campaign.sh.
#
# Fails (non-zero exit) if a target crashes, panics, leaks past the RSS
# limit or hangs on an input; the reproducer is left in
# fuzz/artifacts/<target>/ (replay: cargo +nightly fuzz run --fuzz-dir fuzz
# <target> <file>).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

rx_secs="${FUZZ_RX_SECS:-60}"
wire_secs="${FUZZ_WIRE_SECS:-30}"

if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "+ cargo install cargo-fuzz --locked" >&2
    cargo install cargo-fuzz --locked
fi
if ! cargo +nightly --version >/dev/null 2>&1; then
    echo "+ rustup toolchain install nightly --profile minimal" >&2
    rustup toolchain install nightly --profile minimal
fi
echo "$(cargo fuzz --version), $(cargo +nightly --version)" >&2

# The fuzz crate has its own target dir (fuzz/target); a CARGO_TARGET_DIR
# from the environment would mix sanitizer builds into the workspace's.
unset CARGO_TARGET_DIR

echo "+ cargo +nightly fuzz build --fuzz-dir fuzz" >&2
cargo +nightly fuzz build --fuzz-dir fuzz

logdir="$(mktemp -d)"
trap 'rm -rf "$logdir"' EXIT
status=0

run() {
    local target="$1" secs="$2"
    local log="$logdir/$target.log"
    # Starts from the committed (minimised) corpus; what this short run
    # finds goes to a scratch directory, so the tree stays as committed.
    local scratch="$logdir/$target-new"
    mkdir -p "fuzz/corpus/$target" "$scratch"
    echo "+ cargo +nightly fuzz run --fuzz-dir fuzz $target $scratch fuzz/corpus/$target -- -max_total_time=$secs -rss_limit_mb=2048 -timeout=20" >&2
    if cargo +nightly fuzz run --fuzz-dir fuzz "$target" "$scratch" "fuzz/corpus/$target" -- \
        -max_total_time="$secs" -rss_limit_mb=2048 -timeout=20 \
        -print_final_stats=1 >"$log" 2>&1; then
        grep -E '^stat::(number_of_executed_units|average_exec_per_sec|new_units_added|peak_rss_mb)' "$log" |
            sed "s/^/  $target: /" >&2
        grep -E '^#[0-9]+.*(DONE|pulse)' "$log" | tail -1 | sed "s/^/  $target: /" >&2
        echo "  $target: ok" >&2
    else
        echo "  $target: FAILED (last 80 lines of libFuzzer output follow)" >&2
        tail -n 80 "$log" >&2
        ls -l "fuzz/artifacts/$target/" >&2 2>/dev/null || true
        status=1
    fi
}

run rx_stream "$rx_secs"
run wire_parse "$wire_secs"
exit "$status"
