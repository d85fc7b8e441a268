#!/usr/bin/env bash
# A long fuzzing campaign (the test command runs only a short smoke run,
# scripts/test-fuzz.sh). Runs each target for FUZZ_HOURS hours (default 2),
# one after the other, at the lowest CPU priority (nice 19) and with
# FUZZ_JOBS libFuzzer workers each (default 1), then minimises the corpus
# into fuzz/corpus/<target>/ (cargo fuzz cmin) so it can be committed.
#
#   scripts/fuzz-campaign.sh                      # 2 h per target
#   FUZZ_HOURS=0.25 scripts/fuzz-campaign.sh rx_stream
#   FUZZ_JOBS=2 FUZZ_HOURS=4 scripts/fuzz-campaign.sh
#
# Each run is bounded by libFuzzer's -max_total_time and, as a backstop, by
# `timeout` (run time + 10 min). A crash leaves its reproducer in
# fuzz/artifacts/<target>/ and makes the script exit non-zero; replay it with
#   cargo +nightly fuzz run --fuzz-dir fuzz <target> fuzz/artifacts/<target>/<file>
# The summary (executions, exec/s, corpus size before and after, peak RSS)
# goes to stdout and to fuzz/campaign-<target>.log (not committed).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
hours="${FUZZ_HOURS:-2}"
jobs="${FUZZ_JOBS:-1}"
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(rx_stream wire_parse)
secs=$(awk -v h="$hours" 'BEGIN { printf "%d", h * 3600 }')
[ "$secs" -gt 0 ] || { echo "fuzz-campaign: FUZZ_HOURS must be > 0" >&2; exit 2; }

if ! cargo +nightly --version >/dev/null 2>&1 || ! cargo fuzz --version >/dev/null 2>&1; then
    echo "fuzz-campaign: needs cargo-fuzz and the nightly toolchain (scripts/test-fuzz.sh installs both)" >&2
    exit 2
fi
unset CARGO_TARGET_DIR
nice -n 19 cargo +nightly fuzz build --fuzz-dir fuzz

status=0
for t in "${targets[@]}"; do
    log="fuzz/campaign-$t.log"
    mkdir -p "fuzz/corpus/$t"
    before=$(ls "fuzz/corpus/$t" | wc -l)
    work=$(mktemp -d)
    echo "fuzz-campaign: $t for ${secs}s (jobs $jobs, nice 19), corpus $before files; log $log"
    # libFuzzer reads the committed corpus and writes new units to $work,
    # so an interrupted run leaves the committed corpus as it was.
    parallel=()
    [ "$jobs" -gt 1 ] && parallel=(-jobs="$jobs" -workers="$jobs")
    if timeout --kill-after=30 $((secs + 600)) nice -n 19 \
        cargo +nightly fuzz run --fuzz-dir fuzz "$t" "$work" "fuzz/corpus/$t" -- \
        -max_total_time="$secs" -rss_limit_mb=2048 -timeout=20 \
        "${parallel[@]}" -print_final_stats=1 >"$log" 2>&1; then
        echo "fuzz-campaign: $t: no crash"
    else
        echo "fuzz-campaign: $t: FAILED (see $log and fuzz/artifacts/$t/)"
        status=1
    fi
    if [ "$jobs" -gt 1 ]; then cat fuzz-*.log >>"$log" 2>/dev/null || true; fi
    grep -hE '^stat::(number_of_executed_units|average_exec_per_sec|peak_rss_mb)' "$log" |
        sed "s/^/  $t: /" || true
    # Merge what was found into a minimal corpus: cmin keeps the smallest
    # set of inputs that covers everything both directories cover.
    merged=$(mktemp -d)
    cp "fuzz/corpus/$t"/* "$work"/ 2>/dev/null || true
    nice -n 19 cargo +nightly fuzz cmin --fuzz-dir fuzz "$t" "$work" -- -rss_limit_mb=2048 -timeout=20 \
        >"$merged.log" 2>&1 || { echo "fuzz-campaign: $t: cmin failed (see $merged.log)"; status=1; continue; }
    # cmin minimised $work in place. The hand-made seeds (seed-*) stay
    # under their names: their content-named copies (libFuzzer names a unit
    # by its SHA-1) are dropped.
    for seed in "fuzz/corpus/$t"/seed-*; do
        [ -e "$seed" ] && rm -f "$work/$(sha1sum "$seed" | cut -d' ' -f1)"
    done
    find "fuzz/corpus/$t" -type f ! -name 'seed-*' -delete
    cp "$work"/* "fuzz/corpus/$t"/
    after=$(ls "fuzz/corpus/$t" | wc -l)
    echo "fuzz-campaign: $t: corpus $before -> $after files after cmin"
    rm -rf "$work" "$merged" "$merged.log" fuzz-*.log
done
exit "$status"
