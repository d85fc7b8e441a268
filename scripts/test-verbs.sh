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
#   * qperf -cm1: rc_lat, rc_rdma_read_bw, rc_rdma_read_lat,
#     rc_rdma_write_poll_lat (blocking CQ waits ended by SIGALRM).
#   * rsockets: rstream (rdma-core's rsocket() inside the real librdmacm,
#     over our rdma_cm), and librspreload.so under an unmodified TCP program
#     (iperf 2), via `warpsock run --rsockets`.
#   * against Linux siw in a qemu VM, one VM for all cases (../shared/tools/siw-peer-vm, as
#     scripts/test-siw.sh boots it; our clients with --p2p off, see
#     crates/warpsock-verbs/src/config.rs): rping with siw as server and as
#     client (-V, CRC off and on), perftest -R clients (write/read/send bw,
#     send_lat) under `warpsock run` against siw's servers, rstream against
#     siw's rstream in both roles (our client against siw's server
#     WARPSOCK_VERBS_SIW_RSTREAM_LOOPS times, default 1).
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

scripts/ensure-pkgs.sh rdmacm-utils perftest libfabric-bin ibverbs-utils iperf qperf iproute2 \
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
VM_UP=0
VMTOOL=${SIW_PEER_VM:-$ROOT/../shared/tools/siw-peer-vm}
CACHE=${WARPSOCK_SIW_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/warpsock/siw-vm}
VM=$WORK/vm
PASS=0
cleanup() {
    local rc=$?
    set +e
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
    if [ "$VM_UP" = 1 ] || [ -f "$VM/run/qemu.pid" ]; then
        "$VMTOOL" stop "$VM" >/dev/null 2>&1
    fi
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

# The fixed ports the loopback cases' servers bind (rping 27174, perftest
# 28515, qperf 29765, fi_pingpong 27600/27601, rstream 27500, iperf 27520,
# misuse 27700) lie in warpsock-testkit's lease range (20000 up to the
# ephemeral range): they are leased here, through its lock files, on
# descriptors held until the suite exits, so that no cargo test running
# meanwhile is leased one of them (its server then failed to bind, and its
# client reached ours). A holder is waited for (60 s).
LEASES="${TMPDIR:-/tmp}/warpsock-testkit-ports"
mkdir -p "$LEASES"
for p in 27174 28515 29765 27600 27601 27500 27520 27700; do
    exec {fd}>>"$LEASES/$p"
    flock -w 60 "$fd" || fail "port $p stays leased by another process (lock $LEASES/$p)"
done

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

# try_pair NAME PORT "SERVER CMD" "CLIENT CMD" [NETNS_S NETNS_C]: runs a
# server and its client (each a full command line); returns 0 when both exit
# 0, else 1 with the reason in PAIR_WHY (the server stopped, logs kept).
# rping_exit_race RC LOG: whether an rping server's exit status RC, after a
# client that succeeded, is rping's own exit race and not a failure. rping
# never joins its CM thread: once the test is done, `main` destroys the
# event channel and returns while that thread loops back into
# rdma_get_cm_event. If the thread gets there first, the call fails with
# EBADF (as librdmacm's write to the closed descriptor does; ours answers
# the same since the channel's memory is kept, crates/warpsock-verbs/src/cm/mod.rs)
# and rping exits through perror("rdma_get_cm_event") with status 255.
# Seen 2 runs in 160 against siw under load. Counted at the end.
RPING_RACES=0
rping_exit_race() {
    [ "$1" = 255 ] || return 1
    tail -1 "$2" | grep -qx "rdma_get_cm_event: Bad file descriptor" || return 1
    grep -q "DISCONNECT EVENT" "$2" || return 1
    RPING_RACES=$((RPING_RACES + 1))
}

try_pair() {
    local name=$1 port=$2 scmd=$3 ccmd=$4 nss=${5:-} nsc=${6:-}
    local sin=() cin=()
    [ -n "$nss" ] && sin=(ip netns exec "$nss")
    [ -n "$nsc" ] && cin=(ip netns exec "$nsc")
    local log=$WORK/$name
    PAIR_WHY=
    # shellcheck disable=SC2086
    timeout 90 "${sin[@]}" $scmd >"$log.server" 2>&1 &
    local spid=$!
    PIDS+=("$spid")
    wait_listen "$port" "$nss" || { cat "$log.server" >&2; fail "$name: server did not listen on $port"; }
    # shellcheck disable=SC2086
    if ! timeout 90 "${cin[@]}" $ccmd >"$log.client" 2>&1; then
        kill "$spid" 2>/dev/null
        wait "$spid" 2>/dev/null
        PAIR_WHY="client failed"
        return 1
    fi
    local src=0
    wait "$spid" || src=$?
    if [ "$src" != 0 ] && ! rping_exit_race "$src" "$log.server"; then
        PAIR_WHY="server failed"
        return 1
    fi
    PASS=$((PASS + 1))
}

# pair: as try_pair, and a failure fails the test.
pair() {
    try_pair "$@" && return 0
    cat "$WORK/$1.client" "$WORK/$1.server" >&2
    fail "$1: $PAIR_WHY"
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
pair "rping-lo-no-p2p" 27174 "$RUN --p2p off -- rping -s -a 127.0.0.1 -p 27174 -S 1000 -C 200 -V" \
    "$RUN --p2p off -- rping -c -a 127.0.0.1 -p 27174 -S 1000 -C 200 -V"
echo "--- rping -q (the program's own QP, rdma_init_qp_attr/rdma_establish)"
pair "rping-q" 27174 "$RUN -- rping -s -q -a 127.0.0.1 -p 27174 -C 50 -V" \
    "$RUN -- rping -c -q -a 127.0.0.1 -p 27174 -C 50 -V"

echo "--- perftest -R on loopback"
check_perf() { # log: a result line with a non-zero number in the 4th column (bw) or 3rd (lat)
    awk '/^ *[0-9]+ +[0-9]+ +[0-9.]+/ { if ($4+0 > 0 || $3+0 > 0) ok=1 } END { exit !ok }' "$1"
}
# perftest's -R server accepts its client's first connection, closes its
# listening id and listens again on the same port for the second
# (strace: listen(9), accept4(9), close(9), then socket/bind/listen(11)):
# a client whose second connect comes in between is refused, REJECTED as a
# kernel rdma_cm would report it (CI of 1e5325b: ib_write_lat; by hand 1
# run in 15, every run under strace). That failure, recognised by our
# client's own log line (nothing listening, after the listener was seen),
# and only that one, is run again, as qperf's race below.
PERF_RACES=0
# perftest_clock_refused LOG...: whether a perftest side gave up on its
# report because its own clock calibration failed. perftest's
# sample_get_cpu_mhz (src/get_clock.c) regresses get_cycles() against
# gettimeofday() over 200 short busy waits and refuses a fit with r^2 < 0.9
# ("Correlation coefficient r^2: ... < 0.9", then "Can't produce a report"
# and exit 1) -- after the transfer, which had run. Under TCG emulation on a
# loaded host the guest's cycle counter does fit that badly (CI of ca0ad2f:
# siw's ib_send_bw server, r^2 0.76). That refusal, and only that one, is
# run again; counted at the end.
CLOCK_REFUSALS=0
perftest_clock_refused() {
    local log
    for log in "$@"; do
        grep -q "Correlation coefficient r^2: .* < 0.9" "$log" && grep -q "Can't produce a report" "$log" &&
            { CLOCK_REFUSALS=$((CLOCK_REFUSALS + 1)); return 0; }
    done
    return 1
}
perf_pair() {  # perf_pair NAME SERVER_CMD CLIENT_CMD (port 28515)
    local attempt
    for attempt in 1 2 3 4; do
        try_pair "$1" 28515 "$2" "env WARPSOCK_VERBS_DEBUG=1 $3" && return 0
        if [ "$attempt" -lt 4 ] && grep -q "RDMA_CM_EVENT_REJECTED; error: -111" "$WORK/$1.client" &&
            grep -qE "connect to 127\.0\.0\.1:[0-9]+ failed: connection refused by .*nothing is listening" "$WORK/$1.client"; then
            echo "    $1: the client connected while its server listened again (perftest's race); again"
            PERF_RACES=$((PERF_RACES + 1))
            continue
        fi
        if [ "$attempt" -lt 4 ] && perftest_clock_refused "$WORK/$1.client" "$WORK/$1.server"; then
            echo "    $1: perftest refused its own clock calibration (r^2 < 0.9); again"
            continue
        fi
        cat "$WORK/$1.client" "$WORK/$1.server" >&2
        fail "$1: $PAIR_WHY"
    done
}
for t in ib_write_bw ib_read_bw ib_send_bw; do
    for size in 65536 1048576; do
        perf_pair "$t-$size" "$RUN -- $t -R -p 28515 -s $size -n 500" \
            "$RUN -- $t -R -p 28515 -s $size -n 500 127.0.0.1"
        check_perf "$WORK/$t-$size.client" || fail "$t -s $size: no result line: $(cat "$WORK/$t-$size.client")"
    done
done
for t in ib_write_lat ib_read_lat ib_send_lat; do
    perf_pair "$t" "$RUN -- $t -R -p 28515 -s 8 -n 2000" "$RUN -- $t -R -p 28515 -s 8 -n 2000 127.0.0.1"
    check_perf "$WORK/$t.client" || fail "$t: no result line: $(cat "$WORK/$t.client")"
done

echo "--- qperf -cm1: Send/Recv ping-pong, RDMA Read bw and latency, RDMA Write polling latency"
# qperf waits in ibv_get_cq_event and ends each test with a SIGALRM that
# must interrupt that wait (EINTR). Not run: rc_bw/rc_bi_bw (the sender
# outruns the receiver's reposting, which needs InfiniBand's RNR retry; on
# iWARP, siw included, a Send with no receive posted is a fatal Terminate)
# and rc_rdma_write_lat/bw (RDMA Write with immediate: not in iWARP).
#
# qperf 0.4.11 (Debian 12's) sends its RDMA CM port to the client *before*
# it calls rdma_listen (fixed upstream after 0.4.11: linux-rdma/qperf
# 118a571 "Fix rdmacm race"). A client quicker than the server connects
# before the listen and is refused, REJECTED as a kernel rdma_cm would
# report it (CI 2026-11-23: rc_rdma_read_lat, 1.3 ms after the test's
# control connection; about 1 run in 4 at load 8). That failure, recognised
# by our client's own log line, and only that one, is run again.
qperf_client="env WARPSOCK_VERBS_DEBUG=1 $RUN -- qperf -lp 29765 -to 30 -cm1 -t 1 127.0.0.1 rc_lat rc_rdma_read_bw rc_rdma_read_lat rc_rdma_write_poll_lat quit"
for attempt in 1 2 3 4; do
    try_pair "qperf" 29765 "$RUN -- qperf -lp 29765" "$qperf_client" && break
    if [ "$attempt" -lt 4 ] && grep -q "Event rejected" "$WORK/qperf.client" &&
        grep -qE "connect to 127\.0\.0\.1:[0-9]+ failed: connection refused by .*nothing is listening" "$WORK/qperf.client"; then
        echo "    qperf's client connected before its server's rdma_listen (qperf 0.4.11's race); again"
        continue
    fi
    cat "$WORK/qperf.client" "$WORK/qperf.server" >&2
    fail "qperf: $PAIR_WHY"
done
awk '/^ +(latency|bw) += +[0-9.,]+ / { if ($3+0 > 0) n++ } END { exit n != 4 }' "$WORK/qperf.client" ||
    fail "qperf: not four results: $(cat "$WORK/qperf.client")"

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

echo "--- against Linux siw in a qemu VM"
# siw 6.1's accept race (siw_accept() sends the MPA Reply before it hands
# the socket to the QP, so an initiator's first FPDU can sit unread until
# more data comes) is handled in the interposer: an initiator whose post
# goes unanswered for 1 s sends a zero-length RDMA Write
# (crates/warpsock-verbs/src/kick.rs). siw's listen race (a connection
# made just as siw starts listening stays unaccepted: perftest's second
# connection, once in ~10 CI runs) is handled there too: an initiator whose
# MPA Reply is 2 s late opens a second, idle connection
# (crates/warpsock-verbs/src/cm/poke.rs). Skipped only where the VM tool is
# missing, and never in CI (CI or WARPSOCK_REQUIRE_SIW set: that fails).
if [ ! -x "$VMTOOL" ]; then
    if [ -n "${CI:-}" ] || [ "${WARPSOCK_REQUIRE_SIW:-0}" = 1 ]; then
        fail "siw-peer-vm not found at $VMTOOL (set SIW_PEER_VM); the siw cases are required here"
    fi
    echo "    SKIPPED: siw-peer-vm not found at $VMTOOL (set SIW_PEER_VM to run the siw cases)"
    echo "test-verbs: $PASS cases passed in $((SECONDS - T0)) s (siw interop NOT run: no VM tool)"
    exit 0
fi
T_SIW=$SECONDS
# Our side logs its setup failures, connect retries and kicks (counted at
# the end: how often siw's accept race showed).
export WARPSOCK_VERBS_DEBUG=1
scripts/ensure-pkgs.sh qemu-system-x86 python3 >/dev/null
mkdir -p "$CACHE"
"$VMTOOL" build "$CACHE" >"$WORK/vm-build.log" 2>&1 || { tail -30 "$WORK/vm-build.log" >&2; fail "cannot build the siw VM image"; }
# The per-boot config archive needs a 4-byte aligned image (see test-siw.sh).
IMG_SIZE=$(stat -c %s "$CACHE/image/initramfs.img")
if [ $((IMG_SIZE % 4)) -ne 0 ]; then
    head -c $((4 - IMG_SIZE % 4)) /dev/zero >>"$CACHE/image/initramfs.img"
fi
mkdir -p "$VM"
ln -s "$CACHE/image" "$VM/image"
# A port offset whose forwards are all free on the host (the VM forwards
# host 127.0.0.1:P+OFF to guest P), plus the control port and our own.
. scripts/lib/siw-vm-ports.sh
vm_ports 2 7174 18515 7500 || fail "no free ports for the VM"
OFF=$VM_OFF CTL=${VM_EXTRA[0]} HOSTP=${VM_EXTRA[1]}
vm_exec() { "$VMTOOL" exec "$VM" "$@"; }
# No server at boot: every case starts its own one-shot server in the VM
# and checks its exit status. (A persistent `rping -s -P` at boot, with the
# tool's warm-up probes that leave its children waiting for a Read that
# never comes, once left our client waiting 120 s for an answer.)
vm_boot() {
    SIW_SERVER=none SIW_FWD_PORTS="7174 18515 7500" SIW_PORT_OFFSET=$OFF SIW_CTL_PORT=$CTL \
        SIW_BOOT_TIMEOUT=150 "$VMTOOL" start "$VM" >"$WORK/vm-boot.log" 2>&1
}
# Under TCG on a loaded host the guest kernel occasionally panics in
# early boot ("setup_IO_APIC": the timer check); one more boot, then fail.
if ! vm_boot; then
    VM_UP=1
    grep -q "VM died during boot" "$WORK/vm-boot.log" || { tail -30 "$WORK/vm-boot.log" >&2; fail "the siw VM did not start"; }
    echo "    the VM died during boot; booting again"
    "$VMTOOL" stop "$VM" >/dev/null 2>&1 || true
    vm_boot || { tail -30 "$WORK/vm-boot.log" >&2; fail "the siw VM did not start (twice)"; }
fi
VM_UP=1
grep -q "SIW-VM-READY ip=10.0.2.15 port=none" "$WORK/vm-boot.log" || fail "the siw VM ignored its boot config"
# vm_listen PORT: until something listens on guest TCP PORT (30 s; slirp
# accepts host connects before the guest does, so ask the guest).
vm_listen() {
    for _ in $(seq 150); do
        vm_exec "netstat -ltn 2>/dev/null | grep -q ':$1 '" && return 0
        sleep 0.2
    done
    return 1
}
# vm_pair NAME GUEST_PORT "GUEST SERVER CMD" "HOST CLIENT CMD": a server in the
# VM (its exit status and output collected afterwards), our client on the host.
# vm_server NAME "GUEST SERVER CMD" GUEST_PORT: starts a one-shot server in
# the VM (output and exit status collected by vm_result) and waits until it
# listens. The background job must not hold the command channel's output open.
vm_server() {
    vm_exec "rm -f /tmp/$1.out; ( $2 >/tmp/$1.out 2>&1; echo rc=\$? >>/tmp/$1.out ) </dev/null >/dev/null 2>&1 &" >/dev/null
    vm_listen "$3" || fail "$1: the server in the VM did not listen on $3"
}
# vm_result NAME: the server's output once it has exited (20 s), also kept
# in $WORK/NAME.server.
vm_result() {
    local out=""
    for _ in $(seq 100); do
        out=$(vm_exec "cat /tmp/$1.out")
        case $out in *rc=*) break ;; esac
        sleep 0.2
    done
    printf '%s\n' "$out" | tee "$WORK/$1.server"
}
# vm_try_pair NAME GUEST_PORT "GUEST SERVER CMD" "HOST CLIENT CMD": a server
# in the VM, our client on the host; returns 0 when both succeed, else 1 with
# the reason in PAIR_WHY (logs in $WORK/NAME.client and NAME.server).
vm_try_pair() {
    local name=$1 gport=$2 scmd=$3 ccmd=$4
    PAIR_WHY=
    vm_server "$name" "$scmd" "$gport"
    # shellcheck disable=SC2086
    if ! timeout 120 $ccmd >"$WORK/$name.client" 2>&1; then
        vm_exec "cat /tmp/$name.out" >"$WORK/$name.server" 2>&1 || true
        PAIR_WHY="client failed"
        return 1
    fi
    case $(vm_result "$name") in *rc=0*) ;; *) PAIR_WHY="server in the VM failed"; return 1 ;; esac
    PASS=$((PASS + 1))
}
# vm_pair: as vm_try_pair, and a failure fails the test.
vm_pair() {
    vm_try_pair "$@" && return 0
    cat "$WORK/$1.client" "$WORK/$1.server" >&2
    fail "$1: $PAIR_WHY"
}
# vm_perf_pair: as vm_pair for perftest, whose clock refusal (above) is
# run again, up to 3 attempts.
vm_perf_pair() {
    local attempt
    for attempt in 1 2 3; do
        vm_try_pair "$@" && return 0
        if [ "$attempt" -lt 3 ] && perftest_clock_refused "$WORK/$1.client" "$WORK/$1.server"; then
            echo "    $1: perftest refused its own clock calibration (r^2 < 0.9); again"
            continue
        fi
        break
    done
    cat "$WORK/$1.client" "$WORK/$1.server" >&2
    fail "$1: $PAIR_WHY"
}
# siw_rping_server CRC: siw's rping serves, ours connects (-v: the log shows
# how far a run got).
siw_rping_server() {
    local name=siw-rping-c-$1
    vm_pair "$name" 7174 "rping -s -a 10.0.2.15 -p 7174 -S 1000 -C 50 -V" \
        "$RUN --p2p off --crc $1 -- rping -c -v -a 127.0.0.1 -p $((7174 + OFF)) -S 1000 -C 50 -V"
    grep -q "rdma-ping-49: " "$WORK/$name.client" || fail "$name: not 50 pings: $(cat "$WORK/$name.client")"
}
# host_pair NAME "HOST SERVER CMD" "GUEST CLIENT CMD": our server on the
# host, siw's client in the VM (it reaches the host's 127.0.0.1 as
# 10.0.2.2); both must exit 0.
host_pair() {
    local name=$1 scmd=$2 ccmd=$3
    # shellcheck disable=SC2086
    timeout 120 $scmd >"$WORK/$name.server" 2>&1 &
    local spid=$!
    PIDS+=("$spid")
    wait_listen "$HOSTP" || fail "$name: our server did not listen on $HOSTP"
    vm_exec "$ccmd; echo rc=\$?" >"$WORK/$name.client" 2>&1
    grep -q "rc=0" "$WORK/$name.client" || { cat "$WORK/$name.client" >&2; fail "$name: siw's client failed"; }
    local src=0
    wait "$spid" || src=$?
    if [ "$src" != 0 ] && ! rping_exit_race "$src" "$WORK/$name.server"; then
        cat "$WORK/$name.server" >&2
        fail "$name: our server failed"
    fi
    PASS=$((PASS + 1))
}
for crc in off on; do
    siw_rping_server "$crc"
    host_pair "siw-rping-s-$crc" "$RUN --crc $crc -- rping -s -a 127.0.0.1 -p $HOSTP -S 1000 -C 50 -V" \
        "rping -c -a 10.0.2.2 -p $HOSTP -S 1000 -C 50 -V"
done
# Small counts: siw runs under TCG emulation here.
for t in ib_write_bw ib_read_bw ib_send_bw ib_send_lat; do
    n=50; [ "$t" = ib_send_lat ] && n=200
    vm_perf_pair "siw-$t" 18515 "$t -R -d siw0 -p 18515 -s 4096 -n $n" \
        "$RUN --p2p off -- $t -R -p $((18515 + OFF)) -s 4096 -n $n 127.0.0.1"
    check_perf "$WORK/siw-$t.client" || fail "$t against siw: no result line: $(cat "$WORK/siw-$t.client")"
done
# Our rstream client against siw's rstream server. It used to stall about 1
# run in 6: siw's accept race left our first messages unread in siw's socket
# (Recv-Q 128 in the guest) while siw's own credit update, sent meanwhile,
# made our kick think it had been answered (kick.rs now restarts its wait on
# such a message). Runs WARPSOCK_VERBS_SIW_RSTREAM_LOOPS times (default 1;
# 12 or more to show it holds).
for i in $(seq "${WARPSOCK_VERBS_SIW_RSTREAM_LOOPS:-1}"); do
    vm_pair "siw-rstream-$i" 7500 "rstream -p 7500 -C 100" "$RUN --p2p off -- rstream -s 127.0.0.1 -p $((7500 + OFF)) -C 100"
done
host_pair "siw-rstream-s" "$RUN -- rstream -p $HOSTP -C 100" "rstream -s 10.0.2.2 -p $HOSTP -C 100"
"$VMTOOL" stop "$VM" >/dev/null 2>&1 || true
VM_UP=0
KICKS=$(cat "$WORK"/siw-*.client "$WORK"/siw-*.server 2>/dev/null | grep -c "siw accept race" || true)
RETRIES=$(cat "$WORK"/siw-*.client 2>/dev/null | grep -c "trying again in" || true)
POKES=$(cat "$WORK"/siw-*.client 2>/dev/null | grep -c "siw listen race" || true)
echo "    siw accept race kicks: $KICKS; connect retries (reset before the MPA Reply): $RETRIES; listen race pokes: $POKES; rping exit races: $RPING_RACES; perftest re-listen races: $PERF_RACES; perftest clock refusals: $CLOCK_REFUSALS"

echo "test-verbs: $PASS cases passed in $((SECONDS - T0)) s (siw section $((SECONDS - T_SIW)) s)"
