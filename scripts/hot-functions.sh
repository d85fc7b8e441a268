#!/usr/bin/env bash
# Regenerates crates/warpsock-preload/hot.ld: the preload library's functions
# that a DDP-mode socket's small-message round trip runs, which the linker
# places together at the front of the library's code (build.rs passes the
# script). Why: with both ends of an event-mode ping-pong on one CPU (as the
# benchmark pins them), every round trip runs both libraries' data paths
# after a context switch; the event path's ~35 functions lay scattered over
# ~35 pages of a 1 MiB text and now share ~8 (BENCHMARKS.md section 6,
# session 31).
#
#   scripts/hot-functions.sh            rewrites crates/warpsock-preload/hot.ld
#
# How: callgrind (release library, CRC off) counts the library's functions
# in ddp_pingpong.c's round trips at three round counts; a function whose
# count grows by at least one instruction a round trip in both steps runs
# in the steady state. Modes, in this priority: blocking readv/writev with
# SO_RCVTIMEO/SO_SNDTIMEO (the benchmark's event mode), the O_NONBLOCK
# readv/writev spin (its busy poll), blocking read/write with and without
# the timeouts, poll + read. A function's pattern is its v0 name (the
# workspace mangles with v0: .cargo/config.toml), which says which instance
# of a generic function it is, with the crate hashes, back-references, the
# instantiating crate and LTO's `.llvm.N` suffix left open: another build
# command's crate metadata (`-p warpsock-preload` alone, or with the CLI, as
# scripts/bench.sh builds it) changes those, not the names
# (scripts/lib/hot_functions.py). `tests/hot_layout.rs` fails when a
# pattern no longer names a function placed first (one renamed or
# moved): run this script then, and after changing the data path.
# Needs valgrind, python3, nm and a C compiler; takes ~30 s; loopback only.
set -euo pipefail
cd "$(dirname "$0")/.."

for tool in valgrind python3 cc nm; do
    command -v "$tool" >/dev/null || { echo "hot-functions: $tool is needed" >&2; exit 2; }
done
cargo build --release --quiet -p warpsock-preload
TARGET=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
LIB="$TARGET/release/libwarpsock_preload.so"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
cc -O2 -o "$WORK/pp" crates/warpsock-preload/tests/c/ddp_pingpong.c

# count NAME MODE ENV...: callgrind files for 2000, 4000 and 6000 round trips.
count() {
    local name=$1 mode=$2
    shift 2
    for n in 2000 4000 6000; do
        env "$@" WARPSOCK_CRC=0 LD_PRELOAD="$LIB" timeout 300 valgrind --tool=callgrind \
            --demangle=no --compress-strings=no \
            --callgrind-out-file="$WORK/cg.$name.$n.%p" "$WORK/pp" "$n" 1 "$mode" \
            >/dev/null 2>"$WORK/$name.$n.err" || {
            cat "$WORK/$name.$n.err" >&2
            echo "hot-functions: $name ($mode, $n rounds) failed" >&2
            exit 1
        }
    done
}
# In priority order: the benchmark's event row (blocking readv/writev with
# its timeouts), its busy row, then the other ways programs call.
count 1-vblock vblock TIMEO=1
count 2-vbusy vbusy TIMEO=0
count 3-block-timeo block TIMEO=1
count 4-block block TIMEO=0
count 5-poll poll TIMEO=0
nm --defined-only "$LIB" >"$WORK/symbols"
python3 scripts/lib/hot_functions.py "$WORK" "$LIB" crates/warpsock-preload/hot.ld
