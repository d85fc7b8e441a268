#!/usr/bin/env bash
# Interoperability with Linux soft-iWARP (siw), proven by the real kernel and
# by Wireshark's dissectors (issue 4; facts in ../shared/design/siw-compat.md).
#
# Boots siw in a qemu VM with ../shared/tools/siw-peer-vm (image cached in
# ${XDG_CACHE_HOME:-~/.cache}/warpsock/siw-vm across runs), then:
#   * warpsock rping client  -> siw `rping -s -P -S 65535` in the VM
#   * siw `rping -c` in the VM -> warpsock rping server on the host
# at several -S sizes, many iterations, -V on both ends, CRC off and on, and
# in siw's peer-to-peer mode (SIW_MODPARAMS, second boot); verified RDMAP
# Sends at volume both ways (send-check: scripts/siw/send_check.c, built
# here against librdmacm and copied into the VM, against
# `warpsock-perftest send-check`; 256 MiB per case, every byte checked by
# the receiver, CRC off in boot 1 and on in boot 2). Every run is
# captured on lo from the SYN and checked with tshark: every TCP payload byte
# decoded as MPA frames / FPDUs, every FPDU as DDP/RDMAP, rping's message
# sequence with sizes, MSNs and Read Request/Response matching, Good CRC32 on
# every FPDU with CRC on (zero trailers with it off), no iWARP expert
# warnings beyond the known rev-2 ones; the VM's kernel log must stay free of
# siw errors.
#
# If the VM cannot be built or booted this FAILS loudly (it never passes
# silently). The VM is stopped by its pid on every exit path.
# Environment: WARPSOCK_SIW_CACHE (image cache dir), SIW_PEER_VM (tool path),
# WARPSOCK_SIW_KEEP=1 (keep the work dir with captures and logs).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
T0=$(date +%s)

VMTOOL=${SIW_PEER_VM:-$ROOT/../shared/tools/siw-peer-vm}
CACHE=${WARPSOCK_SIW_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/warpsock/siw-vm}
WORK=$(mktemp -d /tmp/warpsock-siw.XXXXXX)
VM=$WORK/vm                         # this run's VM (run dir); image shared via symlink
RESULTS=$WORK/results.txt
FAILS=$WORK/failures.txt
: >"$RESULTS"; : >"$FAILS"
VM_UP=0
CAP_PID=
SRV_PID=

loud_fail() {
    printf '\n%s\n' "!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!" >&2
    printf 'test-siw: FAILED: %s\n' "$*" >&2
    printf '%s\n' "!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!" >&2
    exit 1
}

cleanup() {
    local rc=$?
    # No errexit here: a process that already exited must not keep the VM
    # from being stopped (a failed `kill` after `&&` would end the trap).
    set +e
    [ -n "$CAP_PID" ] && kill "$CAP_PID" 2>/dev/null
    [ -n "$SRV_PID" ] && kill "$SRV_PID" 2>/dev/null
    [ -n "${SC_TCPDUMP:-}" ] && kill "$SC_TCPDUMP" 2>/dev/null
    if [ "$VM_UP" = 1 ] || [ -f "$VM/run/qemu.pid" ]; then
        "$VMTOOL" stop "$VM" >/dev/null 2>&1 || true
    fi
    if [ "${WARPSOCK_SIW_KEEP:-0}" = 1 ] || [ $rc -ne 0 ]; then
        echo "test-siw: captures and logs kept in $WORK" >&2
    else
        rm -rf "$WORK"
    fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

[ -x "$VMTOOL" ] || loud_fail "siw-peer-vm not found at $VMTOOL (set SIW_PEER_VM)"

echo "--- tools"
scripts/ensure-pkgs.sh tshark tcpdump python3 qemu-system-x86 iproute2 gcc libc6-dev librdmacm-dev libibverbs-dev
# The capture checkers' own synthetic checks (no VM): a broken one fails here.
python3 scripts/siw/double_hash_crc.py --self-test \
    || loud_fail "scripts/siw/double_hash_crc.py --self-test failed"
cargo build -q -p warpsock-rping
cargo build -q --release -p warpsock-perftest
TARGET=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
BIN=$TARGET/debug/warpsock-rping
[ -x "$BIN" ] || loud_fail "no $BIN after cargo build"
PT=$TARGET/release/warpsock-perftest
[ -x "$PT" ] || loud_fail "no $PT after cargo build"
# send_check runs inside the VM, whose libibverbs/librdmacm come from this
# host's Debian packages: a dynamically linked build from here runs there.
GRO_BIN=$WORK/gro
gcc -O2 -Wall -Wextra -Werror -o "$GRO_BIN" scripts/siw/gro.c || loud_fail "cannot build scripts/siw/gro.c"
SC_BIN=$WORK/send_check
gcc -O2 -Wall -Wextra -Werror -o "$SC_BIN" scripts/siw/send_check.c -lrdmacm -libverbs \
    || loud_fail "cannot build scripts/siw/send_check.c"

echo "--- siw VM image ($CACHE)"
mkdir -p "$CACHE"
"$VMTOOL" build "$CACHE" >"$WORK/build.log" 2>&1 || { tail -30 "$WORK/build.log" >&2; loud_fail "cannot build the siw VM image"; }
[ -f "$CACHE/image/.complete" ] || loud_fail "siw VM image incomplete in $CACHE/image"
# siw-peer-vm passes each boot's configuration (the server command, siw's
# module parameters) as a second cpio archive appended to the image's
# initramfs. The kernel takes an appended archive only at a 4-byte aligned
# offset; after a compressed one of another length it reports "Initramfs
# unpacking failed: invalid magic at start of compressed archive" and boots
# with the defaults (seen here: a 4,582,123-byte image, and every
# peer-to-peer, CRC-required and `-S 65535` case ran against a default
# siw). Zero bytes between archives are skipped, so pad the image to a
# multiple of 4 (idempotent; the image is rebuilt only when missing).
IMG_SIZE=$(stat -c %s "$CACHE/image/initramfs.img")
if [ $((IMG_SIZE % 4)) -ne 0 ]; then
    head -c $((4 - IMG_SIZE % 4)) /dev/zero >>"$CACHE/image/initramfs.img"
    echo "    padded the initramfs from $IMG_SIZE bytes to a multiple of 4 (boot config archive alignment)"
fi
mkdir -p "$VM"
ln -s "$CACHE/image" "$VM/image"

# Free host ports: the VM's forwards (7174/18515 + offset, control port).
. scripts/lib/siw-vm-ports.sh
vm_ports 1 7174 18515 18516 18517 18600 || loud_fail "no free host ports for the VM's forwards"
OFF=$VM_OFF CTL=${VM_EXTRA[0]}
RPING_PORT=$((7174 + OFF))
SC_GUEST_PORT=18600                 # send_check's server in the VM
SC_PORT=$((SC_GUEST_PORT + OFF))
# listen_port FILE PID: the port one of our servers (started with -p 0)
# printed as "listening on ADDR:PORT" in FILE, once it has (10 s; fails
# at once if PID exits first). The server binds port 0 itself: no port is
# picked here and then lost to another process.
listen_port() {
    local i p
    for i in $(seq 200); do
        p=$(sed -n 's/.*listening on .*:\([0-9][0-9]*\)$/\1/p' "$1" 2>/dev/null | head -1)
        [ -n "$p" ] && { echo "$p"; return 0; }
        kill -0 "$2" 2>/dev/null || return 1
        sleep 0.05
    done
    return 1
}

vm_start() {  # vm_start LABEL MODPARAMS
    local label=$1 params=$2 t
    t=$(date +%s)
    echo "--- booting siw VM ($label${params:+, siw $params})"
    if ! SIW_SERVER_CMD="rping -s -P -S 65535 -a 10.0.2.15 -p 7174" SIW_SERVER_PORT=7174 \
        SIW_FWD_PORTS="${SIW_FWD_PORTS:-7174 18515} $SC_GUEST_PORT" SIW_MODPARAMS="$params" SIW_PORT_OFFSET=$OFF SIW_CTL_PORT=$CTL SIW_BOOT_TIMEOUT=150 \
        "$VMTOOL" start "$VM" >"$WORK/boot-$label.log" 2>&1; then
        VM_UP=1
        tail -40 "$WORK/boot-$label.log" >&2
        loud_fail "the siw VM did not start ($label); see above"
    fi
    VM_UP=1
    grep -E "siw params|ready after" "$WORK/boot-$label.log" | sed 's/^ */    /'
    # The boot config must have reached the VM (see the padding above):
    # the server runs our command and siw has every parameter asked for.
    grep -q "server: rping -s -P -S 65535" "$WORK/boot-$label.log" \
        || loud_fail "the siw VM ignored its boot config ($label): $(grep -aE 'Initramfs|server:' "$VM/run/console.log" | tr '\n' ' ')"
    local kv
    for kv in $params; do
        grep -E "siw params:.* ${kv%%=*}=(Y|${kv#*=})( |$)" "$WORK/boot-$label.log" >/dev/null \
            || loud_fail "siw in the VM ($label) does not have $kv: $(grep 'siw params' "$WORK/boot-$label.log")"
    done
    echo "    boot took $(( $(date +%s) - t )) s"
    DMESG_LINES=$(vm_exec "dmesg | wc -l" | tr -dc 0-9)
    # The VM is an initramfs: copy send_check in on every boot (base64
    # through the command channel; busybox has base64 and md5sum).
    local got
    got=$(vm_exec "echo $(base64 -w0 "$SC_BIN") | base64 -d >/tmp/send_check; chmod +x /tmp/send_check; md5sum </tmp/send_check")
    [ "${got%% *}" = "$(md5sum <"$SC_BIN" | cut -d' ' -f1)" ] || loud_fail "send_check did not arrive intact in the VM: $got"
    got=$(vm_exec "echo $(base64 -w0 "$GRO_BIN") | base64 -d >/tmp/gro; chmod +x /tmp/gro; md5sum </tmp/gro")
    [ "${got%% *}" = "$(md5sum <"$GRO_BIN" | cut -d' ' -f1)" ] || loud_fail "gro did not arrive intact in the VM: $got"
}
# GRO on the VM's interface (on|off); prints the state read back.
vm_gro() { vm_exec "/tmp/gro eth0 $1"; }
vm_stop() { "$VMTOOL" stop "$VM" >/dev/null 2>&1 || true; VM_UP=0; }
vm_exec() { "$VMTOOL" exec "$VM" "$@"; }

# New siw lines in the VM's kernel log since the last call go to $1 (empty: fine).
siw_kernel_news() {
    local out n
    out=$(vm_exec "dmesg | tail -n +$((DMESG_LINES + 1))") || true
    n=$(printf '%s\n' "$out" | grep -c . || true)
    DMESG_LINES=$((DMESG_LINES + n))
    printf '%s\n' "$out" | grep -iE 'siw|iw_cm|rdma' | grep -viE 'speed is unknown' >"$1" || true
}

cap_start() {  # cap_start FILE PORT
    rm -f "$1"
    tcpdump -i lo -U --immediate-mode -B 131072 -s 0 -Z root -w "$1" "tcp port $2" 2>"$1.log" &
    CAP_PID=$!
    local i
    for i in $(seq 100); do
        grep -q "listening on" "$1.log" 2>/dev/null && return 0
        sleep 0.05
    done
    loud_fail "tcpdump did not start: $(cat "$1.log")"
}
cap_stop() {
    sleep 1
    kill -INT "$CAP_PID" 2>/dev/null || true
    wait "$CAP_PID" 2>/dev/null || true
    CAP_PID=
}
# Packets the kernel dropped before tcpdump read them (0 if none): a
# capture with drops is misframed from the first gap on and says nothing
# of the bytes on the wire (tcpdump starved of CPU on a loaded host).
cap_drops() {  # cap_drops FILE.pcap
    local d; d=$(sed -n 's/^\([0-9]*\) packets dropped by kernel/\1/p' "$1.log" 2>/dev/null)
    echo "${d:-0}"
}
# Why a case's PASS came from a later run (capture_lost, keep_try).
CASE_NOTE=

VALIDATE=$ROOT/scripts/siw/validate_rping.py

record() {  # record PASS|FAIL NAME DETAIL...
    local st=$1 name=$2; shift 2
    printf '%-4s %-44s %s\n' "$st" "$name" "$*" | tee -a "$RESULTS"
}

# Bytes moved by one rping connection: Read + Write payload + 16-byte Sends.
payload_bytes() { echo $(( $2 * ($1 * 2 + 64) )); }   # payload_bytes SIZE COUNT

# Case: warpsock client -> siw rping server in the VM.
client_case() {  # client_case NAME SIZE COUNT CRC(0|1) RTR(none|write)
    local name=$1 size=$2 count=$3 crc=$4 rtr=$5 cap=$WORK/$1.pcap rc p2p=off attempt
    [ "$rtr" = write ] && p2p=write
    CASE_NOTE=
    for attempt in 1 2 3; do
        rc=0
        cap_start "$cap" "$RPING_PORT"
        "$BIN" -c -a 127.0.0.1 -p "$RPING_PORT" -C "$count" -S "$size" -V --p2p "$p2p" \
            $([ "$crc" = 1 ] && echo --crc) --timeout 90 >"$WORK/$name.out" 2>"$WORK/$name.err" || rc=$?
        cap_stop
        capture_lost "$name" "$attempt" "$rc" || break
    done
    check_case "$name" "$RPING_PORT" "$size" "$count" "$crc" "$rtr" $rc "$WORK/$name.out" ""
    CASE_NOTE=
}

# Case: siw rping client in the VM -> warpsock server on the host.
server_case() {  # server_case NAME SIZE COUNT CRC(0|1: our server asks) EXPECT_CRC RTR
    local name=$1 size=$2 count=$3 crc=$4 ecrc=$5 rtr=$6 cap=$WORK/$1.pcap rc port attempt
    CASE_NOTE=
    for attempt in 1 2 3; do
        rc=0
        "$BIN" -s -a 127.0.0.1 -p 0 -S 65535 -V $([ "$crc" = 1 ] && echo --crc) \
            --accept-timeout 60 --timeout 60 >"$WORK/$name.out" 2>"$WORK/$name.err" &
        SRV_PID=$!
        port=$(listen_port "$WORK/$name.err" "$SRV_PID") || loud_fail "$name: our rping server did not listen: $(cat "$WORK/$name.err")"
        cap_start "$cap" "$port"
        vm_exec "rping -c -a 10.0.2.2 -p $port -C $count -S $size -V -v >/tmp/rping.out 2>/tmp/rping.err; echo rping-rc=\$?;
                 echo pings=\$(grep -c '^ping data: rdma-ping-' /tmp/rping.out);
                 grep -v '^ping data' /tmp/rping.out | head -5; head -20 /tmp/rping.err" >"$WORK/$name.vm" 2>&1 || true
        wait "$SRV_PID" || rc=$?
        SRV_PID=
        cap_stop
        capture_lost "$name" "$attempt" "$rc" || break
    done
    local pings
    pings=$(sed -n 's/^pings=//p' "$WORK/$name.vm")
    local extra=""
    [ "${pings:-0}" = "$count" ] || extra="siw rping -c printed ${pings:-no} of $count pings"
    if grep -qiE 'mismatch|wait for|error|fail|bogus' "$WORK/$name.vm"; then
        extra="${extra:+$extra; }siw rping -c reported: $(grep -iE 'mismatch|wait for|error|fail|bogus' "$WORK/$name.vm" | head -3 | tr '\n' ' ')"
    fi
    check_case "$name" "$port" "$size" "$count" "$ecrc" "$rtr" $rc "$WORK/$name.out" "$extra"
    CASE_NOTE=
}

check_case() {  # NAME PORT SIZE COUNT CRC RTR RC REPORTFILE EXTRA
    local name=$1 port=$2 size=$3 count=$4 crc=$5 rtr=$6 rc=$7 rep=$8 extra=$9 why=() v
    [ "$rc" = 0 ] || why+=("warpsock-rping exited $rc: $(tail -3 "$WORK/$name.err" | tr '\n' ' ')")
    grep -q " $count iterations ($count validated)" "$rep" || why+=("report lacks '$count iterations ($count validated)': $(tail -1 "$rep")")
    grep -q "CRC $([ "$crc" = 1 ] && echo on || echo off)" "$rep" || why+=("CRC state not $crc in report")
    grep -q "RTR $rtr" "$rep" || why+=("RTR not $rtr in report")
    [ -n "$extra" ] && why+=("$extra")
    local drops; drops=$(cap_drops "$WORK/$name.pcap")
    [ "$drops" = 0 ] || why+=("the capture is incomplete: tcpdump lost $drops packets (kernel drops)")
    if v=$(python3 "$VALIDATE" "$WORK/$name.pcap" --port "$port" --iterations "$count" --size "$size" \
            --crc "$crc" --rtr "$rtr" 2>&1); then :; else why+=("$v"); fi
    siw_kernel_news "$WORK/$name.dmesg"
    [ -s "$WORK/$name.dmesg" ] && why+=("siw kernel log: $(head -5 "$WORK/$name.dmesg")")
    local bytes; bytes=$(payload_bytes "$size" "$count")
    if [ ${#why[@]} -eq 0 ]; then
        record PASS "$name" "S=$size C=$count CRC=$crc RTR=$rtr: $bytes payload bytes; ${v#ok   }${CASE_NOTE:+; $CASE_NOTE}"
        TOTAL_BYTES=$((TOTAL_BYTES + bytes))
    else
        record FAIL "$name" "S=$size C=$count CRC=$crc RTR=$rtr"
        { echo "== $name"; printf '  %s\n' "${why[@]}"; } | tee -a "$FAILS" >&2
    fi
}
TOTAL_BYTES=0

# --- send-check: verified RDMAP Sends at volume (scripts/siw/) ------------
# Protocol (crates/warpsock-perftest/src/send_check.rs): N messages of S
# bytes, receives posted before the MPA Reply, credits every K, every byte
# checked by the receiver against a pattern of message index and offset,
# the receiver's counts and FNV-1a checksum sent back and compared. The run
# is captured through `head -c`: tshark and our own parser check the first
# $SC_CAP bytes (MPA setup, every FPDU, MSN/MO, flow control, CRC, the
# payload against the pattern on the wire) without a 256 MiB pcap.
SC_CAP=12000000
SC_VALIDATE=$ROOT/scripts/siw/validate_send_check.py
SC_TCPDUMP=
SC_BYTES=0
SC_BADCRC=
cap_prefix_start() {  # cap_prefix_start FILE PORT BYTES
    rm -f "$1" "$1.pid"
    { tcpdump -i lo -U --immediate-mode -B 131072 -s 0 -w - "tcp port $2" 2>"$1.log" &
      echo $! >"$1.pid"; wait; } | head -c "$3" >"$1" &
    CAP_PID=$!
    local i
    for i in $(seq 100); do
        grep -q "listening on" "$1.log" 2>/dev/null && { SC_TCPDUMP=$(cat "$1.pid"); return 0; }
        sleep 0.05
    done
    loud_fail "tcpdump did not start: $(cat "$1.log")"
}
cap_prefix_stop() {
    sleep 1
    [ -n "$SC_TCPDUMP" ] && kill -INT "$SC_TCPDUMP" 2>/dev/null || true
    wait "$CAP_PID" 2>/dev/null || true
    CAP_PID=; SC_TCPDUMP=
}
# The outcome of a send-check case. Both ends print one line; the receiver's
# must say N messages, N*S bytes, 0 bad, and its checksum must equal the
# sender's; the capture prefix must validate; siw's kernel log stay quiet.
sc_check() {  # sc_check NAME N S CRC RTR PORT RC_WARPSOCK WARPSOCK_OUT VM_OUT
    local name=$1 n=$2 s=$3 crc=$4 rtr=$5 port=$6 rc=$7 wout=$8 vout=$9 why=() v
    local bytes=$((n * s)) srv cli
    [ "$rc" = 0 ] || why+=("warpsock-perftest send-check exited $rc: $(tail -3 "$wout" | tr '\n' ' ')")
    # `|| true`: a side that printed no result is a reason below, not an
    # errexit (pipefail) that ends the whole script without a FAIL line.
    srv=$(grep -h "^send[-_]check server: messages" "$wout" "$vout" | head -1 || true)
    cli=$(grep -h "^send[-_]check client: sent" "$wout" "$vout" | head -1 || true)
    [ -n "$srv" ] || why+=("the receiving end printed no result: $(tail -3 "$vout" | tr '\n' ' ')")
    [ -n "$cli" ] || why+=("the sending end printed no result: $(tail -3 "$vout" | tr '\n' ' ')")
    case "$srv" in *" messages $n bytes $bytes bad_messages 0 "*) ;;
        *) [ -n "$srv" ] && why+=("the receiver did not verify $n x $s = $bytes bytes cleanly: $srv") ;; esac
    local sck cck
    sck=$(sed -n 's/.* checksum \(0x[0-9a-f]*\).*/\1/p' <<<"$srv")
    cck=$(sed -n 's/.*bytes checksum \(0x[0-9a-f]*\).*/\1/p' <<<"$cli")
    [ -n "$sck" ] && [ "$sck" = "$cck" ] || why+=("checksums differ: receiver ${sck:-none}, sender ${cck:-none}")
    grep -q "result ok" <<<"$cli" || why+=("the sender's verdict is not ok: $cli")
    grep -q "CRC $([ "$crc" = 1 ] && echo on || echo off)" "$wout" || why+=("warpsock reports CRC not $crc: $(tail -1 "$wout")")
    grep -q "RTR $rtr" "$wout" || why+=("warpsock reports RTR not $rtr: $(tail -1 "$wout")")
    local drops; drops=$(cap_drops "$WORK/$name.pcap")
    [ "$drops" = 0 ] || why+=("the capture is incomplete: tcpdump lost $drops packets (kernel drops)")
    v=$(python3 "$SC_VALIDATE" "$WORK/$name.pcap" --port "$port" -n "$n" -s "$s" --crc "$crc" \
        --rtr "$rtr" --min-messages 4 2>&1) || why+=("$v")
    siw_kernel_news "$WORK/$name.dmesg"
    [ -s "$WORK/$name.dmesg" ] && why+=("siw kernel log: $(head -5 "$WORK/$name.dmesg")")
    local rate; rate=$(sed -n 's/.* seconds \([0-9.]*\) MBps \([0-9.]*\).*/\1 s, \2 MB\/s/p' <<<"$srv")
    if [ ${#why[@]} -eq 0 ]; then
        record PASS "$name" "N=$n S=$s CRC=$crc RTR=$rtr: $bytes bytes sent and verified ($rate), checksum $sck both ends; ${v#ok   }${CASE_NOTE:+; $CASE_NOTE}"
        SC_BYTES=$((SC_BYTES + bytes))
    else
        record FAIL "$name" "N=$n S=$s CRC=$crc RTR=$rtr (verified Sends)"
        { echo "== $name"; printf '  %s\n' "${why[@]}"; } | tee -a "$FAILS" >&2
    fi
}
# warpsock-perftest send-check client -> send_check server on siw in the VM.
sc_client_case() {  # sc_client_case NAME N S CRC(0|1: we ask) EXPECT_CRC RTR(none|write)
    local name=$1 n=$2 s=$3 crc=$4 ecrc=$5 rtr=$6 rc attempt
    CASE_NOTE=
    for attempt in 1 2 3; do
        rc=0
        vm_exec "ulimit -l unlimited; rm -f /tmp/sc.out; (/tmp/send_check server -p $SC_GUEST_PORT -n $n -s $s -t 120 \
                 >/tmp/sc.out 2>&1 </dev/null &); i=0;
                 while ! grep -q ':$(printf %04X $SC_GUEST_PORT) 00000000:0000 0A' /proc/net/tcp; do
                     i=\$((i+1)); [ \$i -gt 100 ] && break; sleep 0.1; done" >/dev/null
        cap_prefix_start "$WORK/$name.pcap" "$SC_PORT" $SC_CAP
        "$PT" send-check client -p "$SC_PORT" -n "$n" -s "$s" $([ "$crc" = 1 ] && echo --crc) \
            --p2p "$([ "$rtr" = write ] && echo write || echo off)" --timeout 120 >"$WORK/$name.out" 2>&1 || rc=$?
        cap_prefix_stop
        vm_exec "i=0; while ! grep -q result /tmp/sc.out && pidof send_check >/dev/null; do
                     i=\$((i+1)); [ \$i -gt 150 ] && break; sleep 0.1; done; cat /tmp/sc.out" >"$WORK/$name.vm" 2>&1 || true
        capture_lost "$name" "$attempt" "$rc" || break
    done
    sc_check "$name" "$n" "$s" "$ecrc" "$rtr" "$SC_PORT" $rc "$WORK/$name.out" "$WORK/$name.vm"
    CASE_NOTE=
}
# A case's run (rping or send-check) whose transfer went through but whose
# capture tcpdump lost packets of is made again, up to three runs in all
# (as the perftest captured cases): the capture is what the case checks the
# wire with. A run that failed is never made again for its capture. Returns
# 0 when the run is to be made again; the lost run's files are kept as
# *.tryN and CASE_NOTE says so (the PASS line carries it).
capture_lost() {  # capture_lost NAME ATTEMPT RC
    local drops; drops=$(cap_drops "$WORK/$1.pcap")
    [ "$drops" != 0 ] && [ "$3" = 0 ] && [ "$2" -lt 3 ] || return 1
    keep_try "$1" "$2" "tcpdump lost $drops packets (kernel drops)"
}
# Keeps run ATTEMPT's files of case NAME as *.tryATTEMPT (its siw kernel
# news with it) and notes why the case runs again.
keep_try() {  # keep_try NAME ATTEMPT WHY
    local f
    siw_kernel_news "$WORK/$1.dmesg"
    for f in "$WORK/$1".*; do
        case $f in *.try[0-9]) ;; *) mv "$f" "$f.try$2" ;; esac
    done
    CASE_NOTE="${CASE_NOTE:+$CASE_NOTE; }run again: in run $2 $3 ($WORK/$1.pcap.try$2)"
    echo "    $1: run again: in run $2 $3" >&2
}
# warpsock-perftest send-check client -> siw, CRC on, GRO off in the VM: the
# transfer verifies, or siw's CRC-error Terminate is explained by its
# split-trailer bug (scripts/siw/trailer_split.py) and every CRC we sent in
# the capture is good.
sc_siw_trailer_case() {  # sc_siw_trailer_case NAME N S
    local name=$1 n=$2 s=$3 rc=0 v t problems
    echo "    $(vm_gro off)"
    vm_exec "ulimit -l unlimited; rm -f /tmp/sc.out; (/tmp/send_check server -p $SC_GUEST_PORT -n $n -s $s -t 120 \
             >/tmp/sc.out 2>&1 </dev/null &); i=0;
             while ! grep -q ':$(printf %04X $SC_GUEST_PORT) 00000000:0000 0A' /proc/net/tcp; do
                 i=\$((i+1)); [ \$i -gt 100 ] && break; sleep 0.1; done" >/dev/null
    # The whole stream: the FPDU siw chokes on must be in it.
    cap_prefix_start "$WORK/$name.pcap" "$SC_PORT" $((n * s + (n * s) / 8 + 1000000))
    "$PT" send-check client -p "$SC_PORT" -n "$n" -s "$s" --crc --p2p write --timeout 120 \
        >"$WORK/$name.out" 2>&1 || rc=$?
    cap_prefix_stop
    vm_exec "i=0; while ! grep -q result /tmp/sc.out && pidof send_check >/dev/null; do
                 i=\$((i+1)); [ \$i -gt 150 ] && break; sleep 0.1; done; cat /tmp/sc.out" >"$WORK/$name.vm" 2>&1 || true
    echo "    $(vm_gro on)"
    if [ "$rc" = 0 ]; then
        sc_check "$name" "$n" "$s" 1 write "$SC_PORT" 0 "$WORK/$name.out" "$WORK/$name.vm"
        return
    fi
    siw_kernel_news "$WORK/$name.dmesg"
    local why=()
    # siw's answer to a CRC error is a Terminate, or (6.1.192, seen in CI:
    # no Terminate on the wire) a reset of its socket with our bytes unread.
    grep -qE "connection terminated by the peer: MPA: received MPA CRC does not match|peer reset the connection" "$WORK/$name.out" \
        || why+=("warpsock did not report siw's CRC-error Terminate or reset: $(tail -2 "$WORK/$name.out" | tr '\n' ' ')")
    t=$(python3 "$ROOT/scripts/siw/trailer_split.py" "$WORK/$name.pcap" "$SC_PORT" "$WORK/$name.dmesg" 2>&1) \
        || why+=("siw's CRC error is not its split-trailer bug: $t")
    v=$(python3 "$SC_VALIDATE" "$WORK/$name.pcap" --port "$SC_PORT" -n "$n" -s "$s" --crc 1 \
        --rtr write --min-messages 2 2>&1 || true)
    # siw's own Terminate is expected; anything else the validator finds is not.
    problems=$(grep '^  - ' <<<"$v" | grep -v '^  - R:' || true)
    [ -z "$problems" ] || why+=("the capture does not validate: $problems")
    grep -q "Good CRC32" <<<"$v" || why+=("tshark saw no good CRC: $v")
    if [ ${#why[@]} -eq 0 ]; then
        record PASS "$name" "N=$n S=$s CRC=1 RTR=write, GRO off: ${t}; capture: $(head -1 <<<"$v" | sed 's/^[A-Z]* [^:]*: //')"
    else
        record FAIL "$name" "N=$n S=$s CRC=1 RTR=write, GRO off"
        { echo "== $name"; printf '  %s\n' "${why[@]}"; } | tee -a "$FAILS" >&2
    fi
}
# send_check client on siw in the VM -> warpsock-perftest send-check server.
# siw -> warpsock: a run that ended because siw sent an FPDU with siw 6.1's
# double-hashed MPA CRC (docs/protocol-notes.md §7.13: CRC32c(header ||
# payload || payload), two contexts in siw_tx_hdt on one FPDU) is made again
# once, and only that: warpsock's Terminate says MPA CRC error and every
# FPDU with a bad CRC that siw sent in the capture has exactly that CRC
# (scripts/siw/double_hash_crc.py). warpsock detected and reported the
# peer's error as it must; the case is about interop (CI pre-check of
# 9c5ba5c: FPDU MSN 2 MO 21480, every payload byte the expected pattern).
# The first run's files are kept (*.try1) and the PASS line names the FPDU;
# any other failure (any other bad CRC from siw included), or the same one
# twice, fails. A run whose capture lost packets is made again as well
# (capture_lost; CI of 11110b6: 1538 kernel drops, the transfer good).
sc_server_case() {  # sc_server_case NAME N S CRC(0|1: we ask) EXPECT_CRC RTR [SERVER ARGS...]
    local name=$1 attempt hashed=0
    CASE_NOTE=
    for attempt in 1 2 3; do
        sc_server_run "$@"
        if [ "$hashed" = 0 ] && [ "$attempt" -lt 3 ] && siw_sent_double_hash_crc "$name" "$SC_RUN_PORT"; then
            hashed=1
            keep_try "$name" "$attempt" "siw sent its double-hashed MPA CRC: $SC_BADCRC"
        else
            capture_lost "$name" "$attempt" "$SC_RUN_RC" || break
        fi
    done
    sc_check "$name" "$2" "$3" "$5" "$6" "$SC_RUN_PORT" "$SC_RUN_RC" "$WORK/$name.out" "$WORK/$name.vm"
    CASE_NOTE=
}
# Whether warpsock's Terminate says MPA CRC error and every bad CRC siw sent
# in the capture is its double hash; sets SC_BADCRC to the checker's line.
siw_sent_double_hash_crc() {  # siw_sent_double_hash_crc NAME PORT (our server's port)
    SC_BADCRC=
    grep -q "received MPA CRC does not match" "$WORK/$1.out" || return 1
    local rc=0
    SC_BADCRC=$(python3 "$ROOT/scripts/siw/double_hash_crc.py" "$WORK/$1.pcap" "$2" 2>&1) || rc=$?
    [ "$rc" = 0 ] || echo "    $1: not run again (not siw's double-hashed CRC): $SC_BADCRC" >&2
    return "$rc"
}
sc_server_run() {  # the arguments of sc_server_case; sets SC_RUN_PORT, SC_RUN_RC
    local name=$1 n=$2 s=$3 crc=$4 ecrc=$5 rtr=$6 rc=0 port i
    shift 6
    "$PT" send-check server -p 0 -n "$n" -s "$s" $([ "$crc" = 1 ] && echo --crc) --timeout 280 "$@" \
        >"$WORK/$name.out" 2>&1 &
    SRV_PID=$!
    port=$(listen_port "$WORK/$name.out" "$SRV_PID") || loud_fail "$name: our send-check server did not listen: $(cat "$WORK/$name.out")"
    cap_prefix_start "$WORK/$name.pcap" "$port" $SC_CAP
    # In the background (the command channel gives up after 120 s), polled.
    # The background subshell gets no descriptor of the command channel:
    # holding one made the channel wait for the whole transfer (and time
    # out when siw's transmit in the emulated guest is slow, about 2 MB/s
    # on a loaded host).
    vm_exec "ulimit -l unlimited; rm -f /tmp/scc.out; (/tmp/send_check client -a 10.0.2.2 -p $port -n $n -s $s -t 280 \
             >/tmp/scc.out 2>&1 </dev/null; echo send_check-rc=\$? >>/tmp/scc.out) </dev/null >/dev/null 2>&1 &" >/dev/null
    # vm_exec's status is the channel's, not the command's: ask for a word.
    vm_client_done() { [ "$(vm_exec "grep -q send_check-rc /tmp/scc.out && echo done" 2>/dev/null)" = done ]; }
    for i in $(seq 300); do
        vm_client_done && break
        kill -0 "$SRV_PID" 2>/dev/null || { sleep 1; vm_client_done && break; }
        sleep 1
    done
    vm_exec "cat /tmp/scc.out" >"$WORK/$name.vm" 2>&1 || true
    wait "$SRV_PID" || rc=$?
    SRV_PID=
    cap_prefix_stop
    grep -q "send_check-rc=0" "$WORK/$name.vm" || echo "send_check client in the VM: $(grep send_check-rc "$WORK/$name.vm")" >>"$WORK/$name.vm"
    SC_RUN_PORT=$port SC_RUN_RC=$rc
}

# --- The siw CRC anomaly (docs/protocol-notes.md §9) ----------------------
# WARPSOCK_SIW_CRC_TRIALS=N boots only the peer-to-peer + CRC VM and runs the
# warpsock -> siw CRC-on send-check case N times with GRO on and N times with
# GRO off on the VM's interface (alternating), then prints each outcome and
# exits (non-zero if any GRO-off trial failed).
if [ -n "${WARPSOCK_SIW_CRC_TRIALS:-}" ]; then
    vm_start p2p "peer_to_peer=1 mpa_crc_required=1"
    for i in $(seq "$WARPSOCK_SIW_CRC_TRIALS"); do
        for g in on off; do
            echo "    $(vm_gro $g)"
            sc_client_case "crc-trial-$i-gro-$g" "${WARPSOCK_SIW_CRC_MSGS:-1024}" 65537 1 1 write
        done
    done
    vm_stop
    echo "=== CRC trials"
    cat "$RESULTS"
    [ -s "$FAILS" ] && cat "$FAILS"
    for g in on off; do
        echo "GRO $g: $(grep -c "^PASS crc-trial-.*-gro-$g " "$RESULTS") passed, $(grep -c "^FAIL crc-trial-.*-gro-$g " "$RESULTS") failed"
    done
    ! grep -q "^FAIL crc-trial-.*-gro-off " "$RESULTS"
    exit
fi

# --- Boot 1: siw as shipped (MPA rev 2, CRC only if asked, no P2P) ---------
vm_start default ""
client_case client-S26-crc0      26    300 0 none
client_case client-S64-crc1      64    300 1 none
client_case client-S1500-crc0    1500  150 0 none
client_case client-S4096-crc1    4096  100 1 none
client_case client-S65535-crc0   65535 40  0 none
client_case client-S65535-crc1   65535 40  1 none
client_case client-S64-p2p       64    50  0 write
server_case server-S26-crc0      26    300 0 0 none
server_case server-S64-crc1      64    300 1 1 none
server_case server-S1500-crc1    1500  150 1 1 none
server_case server-S65535-crc0   65535 40  0 0 none
server_case server-S65535-crc1   65535 40  1 1 none
sc_client_case sendcheck-warpsock-to-siw-crc0 256 1048576 0 0 none
# siw -> warpsock: siw's transmit in the emulated guest is the bottleneck
# (1.0-2.5 MB/s on a loaded 2-core host), so 64 MiB, not 256, keeps the case
# well within its 280 s limits.
sc_server_case sendcheck-siw-to-warpsock-crc0 64 1048576 0 0 none
vm_stop

# --- Boot 2: siw in peer-to-peer mode, asking for CRC -------------------------
vm_start p2p "peer_to_peer=1 mpa_crc_required=1"
server_case server-p2p-S1000     1000  100 0 1 write
server_case server-p2p-S65535    65535 30  0 1 write
client_case client-p2p-S1000     1000  100 1 write
# warpsock -> siw at volume with CRC on (siw as responder does not force CRC
# on a request without C, protocol-notes §7.9, so the warpsock client asks),
# odd-sized messages. siw 6.1 mangles an FPDU trailer that arrives split over
# two skbs (protocol-notes §7.12): the case runs with GRO off in the VM, where
# that happens within the first thousand messages every time, and passes when
# siw's CRC error is reproduced exactly from our capture by that bug (with
# every CRC we sent good) — or when the whole transfer verifies (a siw without
# the bug). Before it was opt-in: with GRO on it failed in about half the runs.
sc_siw_trailer_case sendcheck-warpsock-to-siw-crc1 1024 65537
sc_server_case sendcheck-siw-to-warpsock-crc1 1024 65537 0 1 write
# warpsock as P2P responder choosing Read RTR: siw offers Write and Read
# (siw_cm.c rtr_type) and sends a zero-length Read Request when the Reply
# names Read; the server picks Read through QpOptions::prefer_read_rtr.
sc_server_case sendcheck-siw-to-warpsock-read-rtr 512 65537 0 1 read --choose-read-rtr
vm_stop

# --- Boot 3: perftest -R servers and Terminate probes (warpsock-perftest) --
# siw's ib_write_bw / ib_read_bw / ib_send_bw -R servers (perftest 6.06: a
# control rdma_cm connection + a data connection, crate docs) against the
# warpsock-perftest client: 256 MiB per operation type with every byte
# verified (Writes read back, Reads compared against patterns we wrote;
# Sends are only placed, perftest keeps no copy), small captured runs of
# each for tshark, then each Terminate siw can be provoked into, decoded
# by warpsock (Event::Terminated) and checked in the capture.
PT_SIZE=1048576
PT_ITERS=256                        # 256 x 1 MiB = 256 MiB per operation type
PT_VALIDATE=$ROOT/scripts/siw/validate_perftest.py

pt_record() {  # pt_record NAME RC OUTFILE DETAIL VALIDATION...
    local name=$1 rc=$2 out=$3 detail=$4 why=()
    shift 4
    [ "$rc" = 0 ] || why+=("warpsock-perftest exited $rc: $(tail -4 "$out" | tr '\n' ' ')")
    [ -n "${1:-}" ] && why+=("$@")
    if [ ${#why[@]} -eq 0 ]; then
        record PASS "$name" "$detail"
    else
        record FAIL "$name" "$detail"
        { echo "== $name"; printf '  %s\n' "${why[@]}"; } | tee -a "$FAILS" >&2
    fi
}

# The perftest servers run in respawn loops (one client per process).
SIW_FWD_PORTS="7174 18515 18516 18517" vm_start perftest ""
vm_exec "for t in write:18515 read:18516; do (while :; do ib_\${t%%:*}_bw -R -d siw0 -p \${t#*:} -s $PT_SIZE; sleep 0.3; done >>/tmp/\${t%%:*}.log 2>&1 </dev/null &) ; done;
         (while :; do ib_send_bw -R -d siw0 -p 18517 -s $PT_SIZE -n $PT_ITERS -r $PT_ITERS; sleep 0.3; done >>/tmp/send.log 2>&1 </dev/null &); sleep 1" >/dev/null
PT_PORT_write=$((18515 + OFF)); PT_PORT_read=$((18516 + OFF)); PT_PORT_send=$((18517 + OFF))

# A run whose siw server in the (emulated, slow) VM ended the control
# connection before its result line — our client's closing or post-test
# hand shake found the peer gone (CI of 90d1aa6: send, 1 run in 3 of the
# session's) — is made again once: the server's log tail is printed and
# kept (pt-T.srv.try1) and the PASS line says so; a second such run fails.
# So is a run whose server refused its own clock calibration (perftest's
# sample_get_cpu_mhz: r^2 < 0.9 of cycles against gettimeofday, "Can't
# produce a report", exit 1 -- under TCG on a loaded host; test-verbs.sh
# met it in the CI of ca0ad2f): the transfer ran, the report did not.
# pt_siw_trailer_bug NAME PORT: whether a failed run ended with siw's
# CRC-error Terminate or reset, and siw's kernel log line is reproduced
# exactly from our captured stream by its split-trailer bug
# (scripts/siw/trailer_split.py, docs/protocol-notes.md §12); sets
# PT_TRAILER to the model's line. siw's log goes to $WORK/NAME.dmesg.
pt_siw_trailer_bug() {
    PT_TRAILER=
    grep -qE "connection terminated by the peer: MPA: received MPA CRC does not match|peer reset the connection" "$WORK/$1.out" || return 1
    siw_kernel_news "$WORK/$1.dmesg"
    PT_TRAILER=$(python3 "$ROOT/scripts/siw/trailer_split.py" "$WORK/$1.pcap" "$2" "$WORK/$1.dmesg" 2>&1) && return 0
    echo "    $1: not run again (siw's CRC error, if any, is not its split-trailer bug): $PT_TRAILER" >&2
    return 1
}
guest_port() { case $1 in write) echo 18515 ;; read) echo 18516 ;; send) echo 18517 ;; esac; }
# pt_relisten TEST: waits (10 s at most) until the VM's perftest server for
# TEST listens again (its respawn loop: 0.3 s, then its start).
pt_relisten() {
    vm_exec "i=0; while ! grep -q ':$(printf %04X "$(guest_port $1)") 00000000:0000 0A' /proc/net/tcp; do
                 i=\$((i+1)); [ \$i -gt 100 ] && break; sleep 0.1; done" >/dev/null || true
}
# pt_server_closed OUTFILE: whether the run ended at a hand shake the siw
# perftest server closed first (it closes early, before its result, on a
# loaded host: its clock calibration refused; not our side's doing).
pt_server_closed() { grep -q "hand shake.*: peer closed the connection" "$1"; }
for t in write read send; do       # 256 MiB each, verified, not captured
    port_var=PT_PORT_$t; again=""
    for attempt in 1 2; do
        rc=0
        seen=$(vm_exec "cat /tmp/$t.log 2>/dev/null | wc -l" | tr -dc 0-9) || true
        "$PT" bw $t -p "${!port_var}" -s $PT_SIZE -n $PT_ITERS -r $PT_ITERS --verify --timeout 60 \
            >"$WORK/pt-$t.out" 2>&1 || rc=$?
        # (The calibration runs after the transfer: ~0.2 s of busy waits.)
        refused=$(vm_exec "sleep 1; tail -n +$((${seen:-0} + 1)) /tmp/$t.log | grep -c 'produce a report' || true" | tr -dc 0-9) || true
        [ "$attempt" = 1 ] || break
        { [ "$rc" != 0 ] && pt_server_closed "$WORK/pt-$t.out"; } ||
            [ "${refused:-0}" -gt 0 ] || break
        vm_exec "tail -15 /tmp/$t.log" >"$WORK/pt-$t.srv.try1" 2>&1 || true
        mv "$WORK/pt-$t.out" "$WORK/pt-$t.out.try1"
        how="closed before its result"
        [ "${refused:-0}" -gt 0 ] && how="refused its clock calibration (r^2 < 0.9)"
        again="run again: in run 1 the siw server $how ($(tail -3 "$WORK/pt-$t.srv.try1" | tr -s ' \n' ' '))"
        echo "    perftest-$t-256MiB: $again" >&2
        pt_relisten $t
    done
    srv=$(vm_exec "grep -A1 '#bytes' /tmp/$t.log | tail -1" | tr -s ' ' | sed 's/^ //')
    why=""
    grep -q "= $((PT_SIZE * PT_ITERS)) bytes" "$WORK/pt-$t.out" || why="report lacks $((PT_SIZE * PT_ITERS)) bytes: $(tail -1 "$WORK/pt-$t.out")"
    [ $t = send ] || grep -q "verified $((PT_SIZE * PT_ITERS)) bytes" "$WORK/pt-$t.out" || why="${why:+$why; }not every byte verified"
    case "$srv" in "$PT_SIZE $PT_ITERS "*) ;; *) why="${why:+$why; }perftest server printed no $PT_SIZE x $PT_ITERS result: '$srv'";; esac
    pt_record "perftest-$t-256MiB" $rc "$WORK/pt-$t.out" \
        "$(sed -n 's/^[a-z]* test: //p' "$WORK/pt-$t.out" | cut -d';' -f1-2); siw perftest server: $srv${again:+; $again}" ${why:+"$why"}
    [ $rc = 0 ] && TOTAL_BYTES=$((TOTAL_BYTES + PT_SIZE * PT_ITERS))
done

# Small captured runs: every byte decoded by tshark, message counts checked.
for t in write read send; do
    # Send: the server's -n is fixed, so smaller messages (16 MiB captured).
    port_var=PT_PORT_$t; rc=0; n=8; sz=$PT_SIZE; [ $t = send ] && { n=$PT_ITERS; sz=65536; }
    cap=$WORK/pt-$t-cap.pcap
    # A capture tcpdump lost packets of (kernel drops: tcpdump starved of
    # CPU on a loaded host) is misframed from the first gap on and says
    # nothing of the bytes on the wire: the run is made again, up to three
    # times, and fails only if every capture was incomplete. So is a run
    # whose siw server closed a hand shake first (as the 256 MiB runs'
    # first attempt, above: the server's, not ours; session 55's CI, the
    # Send run's closing hand shake). And so is a run siw ended with its
    # CRC-error Terminate (or reset) that its split-trailer bug explains
    # exactly from our captured bytes (pt_siw_trailer_bug; session 57's CI,
    # the Send run: siw's "in" CRC wrong, its "own" our good CRC); the
    # capture's validation below still finds any bad CRC of ours.
    trailer_note=""
    for attempt in 1 2 3; do
        rc=0
        cap_start "$cap" "${!port_var}"
        "$PT" bw $t -p "${!port_var}" -s $sz -n $n -r $PT_ITERS --verify --crc --timeout 60 \
            >"$WORK/pt-$t-cap.out" 2>&1 || rc=$?
        cap_stop
        drops=$(cap_drops "$cap")
        if [ "$rc" != 0 ] && pt_server_closed "$WORK/pt-$t-cap.out" && [ $attempt -lt 3 ]; then
            echo "perftest-$t-captured-crc: the siw server closed a hand shake first in attempt $attempt of 3; run again" >&2
            pt_relisten $t
            continue
        fi
        if [ "$rc" != 0 ] && [ $attempt -lt 3 ] && pt_siw_trailer_bug "pt-$t-cap" "${!port_var}"; then
            trailer_note="run again: in run $attempt siw's CRC error was its split-trailer bug ($PT_TRAILER; $cap.try$attempt)"
            echo "perftest-$t-captured-crc: $trailer_note" >&2
            for f in "$WORK/pt-$t-cap".*; do case $f in *.try[0-9]) ;; *) mv "$f" "$f.try$attempt" ;; esac; done
            pt_relisten $t
            continue
        fi
        [ "$drops" = 0 ] && break
        echo "perftest-$t-captured-crc: tcpdump lost $drops packets (kernel drops) in attempt $attempt of 3" >&2
    done
    case $t in
        write) exp="I:Write=$n,I:ReadReq=$n,R:ReadResp=$n" ;;
        # (tshark 4.0 counts only some of the back-to-back 1 MiB Read
        # Responses with L=1 here; every byte is still accounted for.)
        read)  exp="I:ReadReq=$n,I:Write=1" ;;
        send)  exp="I:Send=$n" ;;
    esac
    v=$(python3 "$PT_VALIDATE" "$cap" --port "${!port_var}" --expect "$exp" 2>&1) && why="" || why=$v
    [ "$drops" = 0 ] || why="the capture is incomplete in 3 attempts: tcpdump lost $drops packets (kernel drops); ${why}"
    pt_record "perftest-$t-captured-crc" $rc "$WORK/pt-$t-cap.out" "n=$n s=$sz CRC on; ${v#ok   }${trailer_note:+; $trailer_note}" ${why:+"$why"}
done

# Terminates siw sends. Byte 0 / ecode as siw puts them on the wire (siw's
# little-endian bitfields: etype<<4 | layer).
pt_term() {  # pt_term NAME BYTE0 ECODE PORT CMD...
    local name=$1 b0=$2 ec=$3 port=$4 rc=0 cap=$WORK/$1.pcap v why=""
    shift 4
    cap_start "$cap" "$port"
    "$PT" "$@" >"$WORK/$name.out" 2>&1 || rc=$?
    cap_stop
    v=$(python3 "$PT_VALIDATE" "$cap" --port "$port" --expect "TERM=$b0:$ec" 2>&1) || why=$v
    pt_record "$name" $rc "$WORK/$name.out" \
        "$(grep -hE '^(terminate:|warpsock decoded:)' "$WORK/$name.out" | head -1 | cut -c1-110)" ${why:+"$why"}
}
pt_term term-write-bad-stag 11 00 $PT_PORT_write bw write -p $PT_PORT_write -s $PT_SIZE --provoke write-bad-stag --timeout 15
pt_term term-write-bounds   11 01 $PT_PORT_write bw write -p $PT_PORT_write -s $PT_SIZE --provoke write-bounds --timeout 15
pt_term term-read-bad-stag  10 00 $PT_PORT_read  bw read  -p $PT_PORT_read  -s $PT_SIZE --provoke read-bad-stag --timeout 15
pt_term term-read-bounds    10 01 $PT_PORT_read  bw read  -p $PT_PORT_read  -s $PT_SIZE --provoke read-bounds --timeout 15
pt_term term-send-too-long  21 02 $PT_PORT_send  bw send  -p $PT_PORT_send  -s $PT_SIZE -n $PT_ITERS -r $PT_ITERS --provoke send-too-long --timeout 15
# Raw FPDUs to rping's server (16-byte receive posted): header faults.
pt_term term-raw-ddp-version 21 06 $RPING_PORT raw ddp-version -p $RPING_PORT
pt_term term-raw-msn         21 03 $RPING_PORT raw msn -p $RPING_PORT
pt_term term-raw-qn          21 01 $RPING_PORT raw qn -p $RPING_PORT
pt_term term-raw-crc         02 02 $RPING_PORT raw crc -p $RPING_PORT
# siw's 20 06 / 20 05 (RDMAP remote operation in siw's little-endian layout)
# read as MPA errors in the RFC layout; the core decodes them by context.
pt_term term-raw-opcode        20 06 $RPING_PORT raw opcode -p $RPING_PORT
pt_term term-raw-rdmap-version 20 05 $RPING_PORT raw rdmap-version -p $RPING_PORT
siw_kernel_news "$WORK/perftest.dmesg"
[ -s "$WORK/perftest.dmesg" ] && echo "    siw kernel log during the perftest/Terminate cases: $(head -3 "$WORK/perftest.dmesg" | tr '\n' ' ')"

# Terminates warpsock sends, decoded by siw: siw's `rping -c` in the VM
# connects to `warpsock-perftest terminate-server` on the host (as
# 10.0.2.2:PORT), which ends the connection with a Terminate from the core
# (RFC layout): DDP untagged no-buffer from an 8-byte receive under rping's
# 16-byte Send (M, D and the DDP header attached), LLP/MPA CRC after one
# CRC of siw's first FPDU is flipped on input, and RDMAP codes through
# Connection::fail_local after rping's first Send. siw's
# siw_proc_terminate logs `siw: got TERMINATE. layer %d, type %d, code %d`
# (pr_warn, always on) reading the control word with little-endian
# bitfields: layer = low nibble of byte 0, type = high nibble, i.e. our
# layer and etype swapped; M/D/R from the low bits of byte 2, so our M
# (0x80) reads as 0 and siw stops there (no "TERM reports ... hdr").
# With dynamic debug on it then logs `rx error -104` (ECONNRESET) and drops
# the connection without a Terminate of its own.
vm_exec "echo 'module siw +p' >/sys/kernel/debug/dynamic_debug/control" >/dev/null
siw_kernel_news "$WORK/srvterm-before.dmesg"
srv_term() {  # srv_term NAME BYTE0 ECODE ETYPE:M:DDPHDRLEN SIW_LOG_LINE ARGS...
    local name=$1 b0=$2 ec=$3 det=$4 want=$5 port rc=0 cap=$WORK/$1.pcap v why=() got i
    shift 5
    "$PT" terminate-server "$@" -p 0 --timeout 30 >"$WORK/$name.out" 2>&1 &
    SRV_PID=$!
    port=$(listen_port "$WORK/$name.out" "$SRV_PID") || loud_fail "$name: our terminate-server did not listen: $(cat "$WORK/$name.out")"
    cap_start "$cap" "$port"
    vm_exec "timeout 20 rping -c -a 10.0.2.2 -p $port -C 1 -S 64 -V -v >/tmp/rping.out 2>&1; echo rping-rc=\$?;
             tail -3 /tmp/rping.out" >"$WORK/$name.vm" 2>&1 || true
    wait "$SRV_PID" || rc=$?
    SRV_PID=
    cap_stop
    v=$(python3 "$PT_VALIDATE" "$cap" --port "$port" --expect "TERM=$b0:$ec" --term-detail "$det" 2>&1) || why+=("$v")
    siw_kernel_news "$WORK/$name.dmesg"
    got=$(grep -o 'siw: got TERMINATE.*' "$WORK/$name.dmesg" || true)
    [ "$got" = "$want" ] || why+=("siw logged '${got:-no got TERMINATE line}', expected '$want' (siw reads our RFC byte 0 $b0 as layer = low nibble, type = high nibble)")
    grep -q 'bogus TERM' "$WORK/$name.dmesg" && why+=("siw rejected the carrier: $(grep -o 'siw: rx bogus TERM.*' "$WORK/$name.dmesg")")
    grep -q 'rx error -104' "$WORK/$name.dmesg" || why+=("siw did not end the connection through siw_proc_terminate (no 'rx error -104')")
    grep -q 'TERM reports' "$WORK/$name.dmesg" && why+=("siw parsed the attachment (it reads M from bit 0 of byte 2; our M is 0x80): $(grep -o 'TERM reports.*' "$WORK/$name.dmesg")")
    pt_record "$name" $rc "$WORK/$name.out" \
        "sent ctl $(sed -n 's/^control word \([0-9a-f]*\) rfc layout: \(.*\)/\1 (\2)/p' "$WORK/$name.out"); siw: '${got#siw: got TERMINATE. }'; ${v#ok   }" \
        ${why[@]+"${why[@]}"}
}
srv_term srvterm-ddp-short-recv 12 02 2:1:18 "siw: got TERMINATE. layer 2, type 1, code 2" short-recv
srv_term srvterm-llp-crc        20 02 0:0:0  "siw: got TERMINATE. layer 0, type 2, code 2" crc
srv_term srvterm-rdmap-bad-stag 01 00 1:0:0  "siw: got TERMINATE. layer 1, type 0, code 0" local --code 0/1/00
srv_term srvterm-rdmap-opcode   02 06 2:0:0  "siw: got TERMINATE. layer 2, type 0, code 6" local --code 0/2/06
vm_exec "echo 'module siw -p' >/sys/kernel/debug/dynamic_debug/control" >/dev/null
vm_stop

echo
echo "=== siw interop summary ($(( $(date +%s) - T0 )) s)"
cat "$RESULTS"
echo "total rping/perftest payload moved: $TOTAL_BYTES bytes"
echo "verified Send payload (send-check, both directions): $SC_BYTES bytes"
if [ -s "$FAILS" ]; then
    echo
    echo "=== what went wrong"
    cat "$FAILS"
    loud_fail "$(grep -c '^FAIL' "$RESULTS") siw interop case(s) failed"
fi
echo "test-siw: all $(grep -c '^PASS' "$RESULTS") siw interop cases passed"
