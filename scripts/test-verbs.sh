#!/usr/bin/env bash
# Unmodified rdma-core programs on warpsock through `warpsock run` (issue 14;
# the interposer is crates/warpsock-verbs). Every program is the one Debian
# ships (installed here); every case must exit 0 and print sane results:
#
#   * rping -V -C 200, sizes 26 B .. 64 KiB, CRC off and on: server and client
#     both under `warpsock run`, on loopback and between two network
#     namespaces (veth, 10.214.0.1 <-> 10.214.0.2, made and removed here);
#     also rping -q (the program creates its own QP, rdma_init_qp_attr).
#   * perftest -R: ib_write_bw, ib_read_bw, ib_send_bw (1 MiB and default
#     sizes), ib_write_lat, ib_read_lat, ib_send_lat: non-zero results.
#   * libfabric: fi_pingpong -p verbs, msg endpoints and rdm through ofi_rxm.
#   * rsockets: rstream (rdma-core's rsocket() inside the real librdmacm,
#     over our rdma_cm), and librspreload.so under an unmodified TCP program
#     (iperf 2), via `warpsock run --rsockets`.
#   * misuse (scripts/verbs/misuse.c, AddressSanitizer): wrong QP state
#     transitions, posting before RTS / after the peer left, MR bounds and
#     access, a CQ overrun, unsupported opcodes, a peer that disconnects
#     mid-transfer: the codes and completion statuses a device gives.
#
# Bounded: every program runs under `timeout`, with small iteration counts.
# Needs root for the namespace pair (CI runs as root). Runs under the
# machine-wide lock (fixed ports): /work/wt/suite.sh bash scripts/test-verbs.sh
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
T0=$SECONDS

scripts/ensure-pkgs.sh rdmacm-utils perftest libfabric-bin ibverbs-utils iperf iproute2 \
    gcc libc6-dev libibverbs-dev librdmacm-dev >/dev/null

cargo build --quiet -p warpsock-cli -p warpsock-verbs
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
WS=$TARGET/debug/warpsock
[ -x "$WS" ] || { echo "test-verbs: $WS not built" >&2; exit 1; }
[ -f "$TARGET/debug/libwarpsock_verbs.so" ] || { echo "test-verbs: libwarpsock_verbs.so not built" >&2; exit 1; }

WORK=$(mktemp -d /tmp/warpsock-verbs.XXXXXX)
PIDS=()
NSA="wvA-$$"
NSB="wvB-$$"
NETNS_UP=0
PASS=0
cleanup() {
    local rc=$?
    set +e
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
    if [ "$NETNS_UP" = 1 ]; then
        ip netns del "$NSA" 2>/dev/null
        ip netns del "$NSB" 2>/dev/null
    fi
    if [ $rc -ne 0 ]; then
        echo "test-verbs: logs kept in $WORK" >&2
    else
        rm -rf "$WORK"
    fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

fail() { echo "test-verbs: FAILED: $*" >&2; exit 1; }

# wait_listen PORT [NETNS]: until something listens on TCP PORT (10 s).
wait_listen() {
    local in=()
    [ -n "${2:-}" ] && in=(ip netns exec "$2")
    for _ in $(seq 200); do
        "${in[@]}" ss -Hltn "sport = :$1" | grep -q . && return 0
        sleep 0.05
    done
    return 1
}

# pair NAME PORT "SERVER CMD" "CLIENT CMD" [NETNS_S NETNS_C]: runs a server
# and its client (each a full command line), both must exit 0.
pair() {
    local name=$1 port=$2 scmd=$3 ccmd=$4 nss=${5:-} nsc=${6:-}
    local sin=() cin=()
    [ -n "$nss" ] && sin=(ip netns exec "$nss")
    [ -n "$nsc" ] && cin=(ip netns exec "$nsc")
    local log=$WORK/$name
    # shellcheck disable=SC2086
    timeout 90 "${sin[@]}" $scmd >"$log.server" 2>&1 &
    local spid=$!
    PIDS+=("$spid")
    wait_listen "$port" "$nss" || { cat "$log.server" >&2; fail "$name: server did not listen on $port"; }
    # shellcheck disable=SC2086
    if ! timeout 90 "${cin[@]}" $ccmd >"$log.client" 2>&1; then
        cat "$log.client" "$log.server" >&2
        fail "$name: client failed"
    fi
    if ! wait "$spid"; then
        cat "$log.client" "$log.server" >&2
        fail "$name: server failed"
    fi
    PASS=$((PASS + 1))
}

RUN="$WS run"

echo "--- rping on loopback (-V -C 200; CRC off and on)"
for crc in off on; do
    for size in 26 64 1000 65535; do
        pair "rping-lo-$crc-$size" 27174 \
            "$RUN --crc $crc -- rping -s -a 127.0.0.1 -p 27174 -S $size -C 200 -V" \
            "$RUN --crc $crc -- rping -c -a 127.0.0.1 -p 27174 -S $size -C 200 -V"
    done
done
echo "--- rping -q (the program's own QP, rdma_init_qp_attr/rdma_establish)"
pair "rping-q" 27174 "$RUN -- rping -s -q -a 127.0.0.1 -p 27174 -C 50 -V" \
    "$RUN -- rping -c -q -a 127.0.0.1 -p 27174 -C 50 -V"

echo "--- perftest -R on loopback"
check_perf() { # log: a result line with a non-zero number in the 4th column (bw) or 3rd (lat)
    awk '/^ *[0-9]+ +[0-9]+ +[0-9.]+/ { if ($4+0 > 0 || $3+0 > 0) ok=1 } END { exit !ok }' "$1"
}
for t in ib_write_bw ib_read_bw ib_send_bw; do
    for size in 65536 1048576; do
        pair "$t-$size" 28515 "$RUN -- $t -R -p 28515 -s $size -n 500" \
            "$RUN -- $t -R -p 28515 -s $size -n 500 127.0.0.1"
        check_perf "$WORK/$t-$size.client" || fail "$t -s $size: no result line: $(cat "$WORK/$t-$size.client")"
    done
done
for t in ib_write_lat ib_read_lat ib_send_lat; do
    pair "$t" 28515 "$RUN -- $t -R -p 28515 -s 8 -n 2000" "$RUN -- $t -R -p 28515 -s 8 -n 2000 127.0.0.1"
    check_perf "$WORK/$t.client" || fail "$t: no result line: $(cat "$WORK/$t.client")"
done

echo "--- libfabric fi_pingpong -p verbs (msg; rdm over ofi_rxm)"
pair "fi-msg" 27600 "$RUN -- fi_pingpong -p verbs -e msg -B 27600 -I 200" \
    "$RUN -- fi_pingpong -p verbs -e msg -P 27600 -I 200 127.0.0.1"
pair "fi-rdm" 27601 "$RUN -- fi_pingpong -p verbs;ofi_rxm -e rdm -B 27601 -I 200" \
    "$RUN -- fi_pingpong -p verbs;ofi_rxm -e rdm -P 27601 -I 200 127.0.0.1"

echo "--- rsockets: rstream, and iperf under librspreload.so"
pair "rstream" 27500 "$RUN -- rstream -p 27500 -C 200" "$RUN -- rstream -s 127.0.0.1 -p 27500 -C 200"
pair "rstream-blocking" 27500 "$RUN -- rstream -p 27500 -T b -S 65536 -C 100" \
    "$RUN -- rstream -s 127.0.0.1 -p 27500 -T b -S 65536 -C 100"
# iperf (2): its server exits after one client with -P 1.
pair "iperf-rsockets" 27520 "$RUN --rsockets -- iperf -s -P 1 -p 27520 -B 127.0.0.1" \
    "$RUN --rsockets -- iperf -c 127.0.0.1 -p 27520 -t 2 -l 64K"
grep -qE "[0-9.]+ [MG]bits/sec" "$WORK/iperf-rsockets.client" || fail "iperf over rsockets: no result"

echo "--- misuse cases (AddressSanitizer)"
gcc -g -O1 -fsanitize=address -fno-omit-frame-pointer -Wall -Werror -o "$WORK/misuse" \
    scripts/verbs/misuse.c -libverbs -lrdmacm -lpthread
ASAN_OPTIONS=verify_asan_link_order=0:detect_leaks=0 timeout 120 $RUN -- "$WORK/misuse" 127.0.0.1 27700 \
    >"$WORK/misuse.log" 2>&1 || { cat "$WORK/misuse.log" >&2; fail "misuse cases"; }
grep -c '^ok ' "$WORK/misuse.log" | { read -r n; echo "  $n checks"; }
PASS=$((PASS + 1))

echo "--- rping and ib_write_bw between two network namespaces"
if [ "$(id -u)" -ne 0 ]; then
    fail "needs root to create network namespaces (not run)"
fi
ip netns add "$NSA"
ip netns add "$NSB"
NETNS_UP=1
ip link add wv0 netns "$NSA" type veth peer name wv1 netns "$NSB"
ip -n "$NSA" addr add 10.214.0.1/24 dev wv0
ip -n "$NSB" addr add 10.214.0.2/24 dev wv1
for ns in "$NSA" "$NSB"; do ip -n "$ns" link set lo up; done
ip -n "$NSA" link set wv0 up
ip -n "$NSB" link set wv1 up
for crc in off on; do
    for size in 26 65535; do
        pair "rping-ns-$crc-$size" 27174 \
            "$RUN --crc $crc -- rping -s -a 10.214.0.1 -p 27174 -S $size -C 200 -V" \
            "$RUN --crc $crc -- rping -c -a 10.214.0.1 -p 27174 -S $size -C 200 -V" "$NSA" "$NSB"
    done
done
pair "ib_write_bw-ns" 28515 "$RUN -- ib_write_bw -R -p 28515 -n 500" \
    "$RUN -- ib_write_bw -R -p 28515 -n 500 10.214.0.1" "$NSA" "$NSB"

echo "test-verbs: $PASS cases passed in $((SECONDS - T0)) s"
