#!/usr/bin/env bash
# The critical path of an 8-byte ping-pong hop in user-space instructions
# (issue 12's 8 B busy row; BENCHMARKS.md section 6, session 34):
# scripts/critical-path.c single-steps each side of
# crates/warpsock-preload/tests/c/ddp_pingpong.c from the return of the read
# that brought the peer's message to the system call that sends the answer.
# Those instructions delay every round trip in full; what a call does after
# its send system call overlaps the peer's work (the -w row counts it, from
# the send's return to the next system call: the spin's read).
#
#   scripts/bench-critical-path.sh              the table below
#   scripts/bench-critical-path.sh --breakdown  the table, then one DDP
#                                               sample by source file
#   scripts/bench-critical-path.sh --check      the test command: builds with
#                                               -Werror, traces the two busy
#                                               rows briefly (debug library)
#                                               and checks what it followed,
#                                               then one dump through the
#                                               breakdown's script
#
# Rows: host TCP, and the DDP socket (CRC off), both in the busy mode the
# benchmark's busy row uses (O_NONBLOCK readv/writev spin: `vbusy`) and its
# event mode (blocking readv/writev with the timeouts set: `vblock`, TIMEO=1).
# Counts are instructions, not time: the medians do not depend on the
# machine's load, and the same build gives the same medians run after run
# (a ptrace'd run is slow: ~30 s a DDP row). The medians pool both sides'
# hops. Needs a C compiler and ptrace of one's own children; --breakdown
# and --check also python3, readelf and addr2line (binutils). Loopback
# only; every traced run is bounded (timeout; the tracer's end kills what
# it traces).
set -euo pipefail
cd "$(dirname "$0")/.."

MODE=table
case "${1:-}" in
    "") ;;
    --breakdown) MODE=breakdown ;;
    --check) MODE=check ;;
    *) echo "usage: $0 [--breakdown|--check]" >&2; exit 2 ;;
esac
TOOLS=(cc)
[ "$MODE" = table ] || TOOLS+=(python3 readelf addr2line)
for tool in "${TOOLS[@]}"; do
    command -v "$tool" >/dev/null || { echo "critical-path: $tool is needed" >&2; exit 2; }
done

WORK="$(mktemp -d /tmp/warpsock-critical-path.XXXXXX)"
trap 'rm -rf "$WORK"' EXIT
${CC:-cc} -O2 -Wall -Wextra -Werror -o "$WORK/cp" scripts/critical-path.c
${CC:-cc} -O2 -o "$WORK/pp" crates/warpsock-preload/tests/c/ddp_pingpong.c
if [ "$MODE" = check ]; then
    # The debug build the test command has built already; the path's
    # length is not looked at here.
    cargo build --quiet -p warpsock-preload
    PROFILE=debug
    ROUNDS=100 SAMPLES=15 SKIP=5
else
    cargo build --quiet --release -p warpsock-preload
    PROFILE=release
    ROUNDS=800 SAMPLES=500 SKIP=50
fi
TARGET=$(cargo metadata --format-version 1 --no-deps | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
LIB="$TARGET/$PROFILE/libwarpsock_preload.so"
[ -f "$LIB" ] || { echo "critical-path: no $LIB" >&2; exit 1; }

# run LABEL DDP(0|1) MODE [tracer options]: one traced ping-pong; prints
# the row and keeps the tracer's report in $WORK/LABEL.
run() {
    local label=$1 ddp=$2 mode=$3
    shift 3
    local env=(-e WARPSOCK_CRC=0)
    [ "$ddp" = 1 ] && env+=(-e "LD_PRELOAD=$LIB")
    [ "$mode" = vblock ] && env+=(-e TIMEO=1)
    # --foreground: the tracer alone gets the signal (its end kills the
    # traced ping-pong), also when this runs under another timeout.
    timeout --foreground 300 "$WORK/cp" -n "$SAMPLES" -s "$SKIP" -v "$@" "${env[@]}" -- "$WORK/pp" "$ROUNDS" "$ddp" "$mode" \
        >"$WORK/$label" 2>"$WORK/$label.err" || {
        echo "critical-path $label: the traced ping-pong failed" >&2
        cat "$WORK/$label.err" >&2
        exit 1
    }
    local all exe other
    all=$(sed -n 's/^median_all=//p' "$WORK/$label")
    exe=$(sed -n 's/^exe_median_all=\([0-9]*\) .*/\1/p' "$WORK/$label")
    other=$(sed -n 's/.*other_median_all=//p' "$WORK/$label")
    printf '%-22s %8s %10s %10s\n' "$label" "$all" "$exe" "$other"
}

# check LABEL OPENED RETURNED CLOSED: two processes (the ping-pong's
# sides) made samples, and every sample of every task was opened by the
# read OPENED returning RETURNED bytes (one whole message) and closed by
# the send CLOSED (system call numbers; the tracer's "task" lines).
check() {
    local label=$1 f="$WORK/$1"
    if ! awk -v o="$2" -v r="$3" -v c="$4" '
        /^task / && !/ samples=0 / {
            for (i = 2; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
            if (v["opened"] !~ "^" o ":[0-9]+$" || v["returned"] !~ "^" r ":[0-9]+$" ||
                v["closed"] !~ "^" c ":[0-9]+$") bad = 1
            sides[v["tgid"]] = 1
        }
        END { n = 0; for (g in sides) n++; exit (bad || n != 2) }' "$f"; then
        echo "critical-path $label: expected two processes with samples, each opened by $2 returning $3 and closed by $4" >&2
        cat "$f" >&2
        exit 1
    fi
}

[ "$MODE" = check ] || echo "load: $(uptime)"
printf '%-22s %8s %10s %10s\n' "row (median per hop)" "all" "program" "libraries"
run tcp-busy 0 vbusy
run ddp-busy 1 vbusy
if [ "$MODE" = check ]; then
    # Host TCP: readv (19) of the 8 bytes to writev (20); the preload's DDP
    # socket: its own recvfrom (45) of the 40-byte FPDU (CRC off) to its
    # sendto (44) of the answer — the tool follows system calls the library
    # makes itself, not libc's. (The debug library: ~20 s the DDP row; the
    # other rows are the same tracing.)
    check tcp-busy 19 8 20
    check ddp-busy 45 40 44
    # The dump and its script, on host TCP's short path (one sample: the
    # program's instructions and libc's).
    timeout --foreground 120 "$WORK/cp" -n 101 -s 0 -d "$WORK/dump" -- "$WORK/pp" 200 0 vbusy \
        >/dev/null 2>"$WORK/dump.err" || { cat "$WORK/dump.err" >&2; exit 1; }
    out=$(python3 scripts/lib/critical_path.py "$WORK/dump")
    grep -Eq '^one sample: [1-9][0-9]* instructions' <<<"$out" || {
        printf '%s\n' "$out" >&2
        echo "critical-path: the dump's breakdown printed no sample" >&2
        exit 1
    }
    echo "critical-path: both rows ran and followed the data path's system calls; the dump read back"
    exit 0
fi
run tcp-event 0 vblock
run ddp-event 1 vblock
run ddp-busy-after-send 1 vbusy -w
if [ "$MODE" = breakdown ]; then
    timeout --foreground 300 "$WORK/cp" -n 120 -s "$SKIP" -d "$WORK/dump" -e WARPSOCK_CRC=0 -e "LD_PRELOAD=$LIB" \
        -- "$WORK/pp" 400 1 vbusy >/dev/null 2>"$WORK/dump.err" || { cat "$WORK/dump.err" >&2; exit 1; }
    python3 scripts/lib/critical_path.py "$WORK/dump"
fi
