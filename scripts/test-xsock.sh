#!/usr/bin/env bash
# DDP mode (extended sockets over iWARP, issue 12) under libwarpsock_preload.so:
#   1. tests/c/xsock.c and xsockswitch.c, built with AddressSanitizer +
#      UBSan: every call and flag (switch with pre-switch bytes, options and bad values, the data
#      calls with MSG_PEEK/DONTWAIT/WAITALL, O_NONBLOCK, SO_RCVTIMEO, poll,
#      ppoll, select, pselect, epoll level/edge, shutdown, orderly close,
#      dup/dup2, message mode, riomap/riowrite/rioread, asynchronous
#      operations, a random 1 B..4 MiB stream both ways with a reader that
#      stops for 2 s, a peer killed mid-stream, fork, a peer that never
#      switches, DDP mode requested on the listener and before connect, two
#      threads on one socket: a blocked reader and a polling writer) on
#      loopback with CRC on and off;
#   1b. an 8 B ping-pong (blocking calls, then poll) wakes no progress
#      thread per round trip (ddp_bg_rounds, counted);
#   1c. tests/c/eintr.c under ASan: a signal's handler ends a blocking read,
#      send or poll with EINTR (or a partial count) as over TCP, SA_RESTART
#      goes on (not with SO_RCVTIMEO), a sink read is withdrawn first;
#   1e. tests/c/cancel.c, cancelswitch.c and cancelexit.c under ASan:
#      pthread_cancel of a thread blocked in a read, recv, send or poll
#      ends it with PTHREAD_CANCELED as over TCP;
#   2. the same cases across two network namespaces joined by a veth pair
#      (10.x addresses inside them only), CRC on and off;
#   3. tshark decodes a captured DDP-mode connection as MPA/DDP/RDMAP with
#      zero bad CRCs;
#   3b. re-entrancy audit: the C cases under a build of the library with
#      the `test-hooks` feature, whose counters show that the engine's own
#      system calls reached the interposed entry points only under the
#      per-thread guard (passed straight to libc), never from a library
#      thread without it, and that library code never entered itself;
#   4. unmodified programs in policy mode (WARPSOCK_DDP_PORTS): python
#      http.server + curl of a 100 MiB file (sha256 equal), Ctrl-C of a
#      python client blocked in recv (KeyboardInterrupt), iperf3 TCP both
#      ways, redis-server + redis-benchmark, nginx (a master and forked
#      workers), memcached (worker threads), socat's forking server
#      (accept, then fork); and mixed: preloaded client -> plain server
#      and plain client -> preloaded server over plain TCP.
# Every run is bounded by `timeout`; servers are stopped by pid; the
# namespaces are deleted on exit. Needs root (namespaces, tcpdump).
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR=never
# The whole suite is bounded (its steps take about 3 minutes on 2 cores;
# each program run is bounded too): on SIGTERM the exit trap still cleans up.
if [ -z "${TEST_XSOCK_BOUNDED:-}" ]; then
    TEST_XSOCK_BOUNDED=1 exec timeout 1200 bash "$0" "$@"
fi
trap 'exit 124' TERM

scripts/ensure-pkgs.sh gcc libc6-dev iproute2 tcpdump tshark curl python3 iperf3 redis-server redis-tools nginx memcached socat wrk >/dev/null
NAME=test-xsock
ROOT_WHY="namespaces, capture"
. scripts/lib/preload-suite.sh
# stat FILE NAME: a counter of the WARPSOCK_STATS reports in FILE, summed.
stat() { awk -v k="$2" '$1 == k { s += $2 } END { print s + 0 }' "$1"; }

# xsock.c: the extended calls and the data paths; xsockswitch.c: the switch
# and the sockets semantics around it (their plumbing: xsockcase.h).
for p in xsock xsockswitch; do
    gcc -std=gnu11 -Wall -Wextra -Werror -O1 -g -fsanitize=address,undefined \
        -Icrates/warpsock-preload/include "crates/warpsock-preload/tests/c/$p.c" \
        -o "$WORK/$p" -L"$LIBDIR" -lwarpsock_preload -Wl,-rpath,"$LIBDIR"
done
export ASAN_OPTIONS="verify_asan_link_order=0:detect_leaks=0:halt_on_error=1:exitcode=86"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1"
PRE=(env LD_PRELOAD="$SO")
# PROGRAM:CASE
CASES=(xsockswitch:switch xsockswitch:calls xsockswitch:nbswitch xsock:stream xsock:msgmode xsock:rio xsock:aio xsockswitch:kill xsockswitch:fork xsockswitch:plain xsockswitch:early xsock:threads xsockswitch:epoll xsockswitch:epollplain)

# 1. Loopback.
for crc in 1 0; do
    for pc in "${CASES[@]}"; do
        p=${pc%%:*} c=${pc#*:}
        out="$WORK/$c.$crc.out"
        if ! XSOCK_DEBUG=1 WARPSOCK_CRC=$crc WARPSOCK_SWITCH_TIMEOUT_MS=1000 timeout 120 "${PRE[@]}" "$WORK/$p" "$c" local >"$out" 2>&1 \
            || grep -qE "Sanitizer|runtime error:" "$out"; then
            cat "$out" >&2
            fail "$c on loopback, CRC $crc"
        fi
    done
    pass "${#CASES[@]} C cases on loopback under ASan/UBSan, CRC $crc"
done

# 1a. The stream case again with a 64 KiB send buffer (full often: a send
# that finds it full gates the program's writability): a program that waits
# for POLLOUT alone once its reads are done hung here when the round that
# saw the credits ended the wait for them (session 21: 4 in 22 runs under
# load before the fix, 0 in 90 after with it). Three runs per CRC setting.
for crc in 1 0; do
    for k in 1 2 3; do
        out="$WORK/stream64k.$crc.$k.out"
        if ! WARPSOCK_DDP_SNDBUF=65536 WARPSOCK_CRC=$crc WARPSOCK_SWITCH_TIMEOUT_MS=1000 timeout 120 "${PRE[@]}" "$WORK/xsock" stream local >"$out" 2>&1 \
            || grep -qE "Sanitizer|runtime error:" "$out"; then
            cat "$out" >&2
            fail "stream with a 64 KiB send buffer, CRC $crc, run $k"
        fi
    done
done
pass "stream with a 64 KiB send buffer: 3 runs per CRC setting"

# c_cases PROG CASE...: tests/c/PROG.c built with the threads and under
# ASan/UBSan, then run preloaded once per case (PROG CASE); a failure or a
# sanitizer's report fails the suite.
c_cases() {
    local prog=$1 c out
    shift
    gcc -std=gnu11 -Wall -Wextra -Werror -O1 -g -pthread -fsanitize=address,undefined \
        -Icrates/warpsock-preload/include "crates/warpsock-preload/tests/c/$prog.c" \
        -o "$WORK/$prog" -L"$LIBDIR" -lwarpsock_preload -Wl,-rpath,"$LIBDIR"
    for c in "$@"; do
        out="$WORK/$prog.$c.out"
        if ! WARPSOCK_SWITCH_TIMEOUT_MS=1000 timeout 120 "${PRE[@]}" "$WORK/$prog" "$c" >"$out" 2>&1 \
            || grep -qE "Sanitizer|runtime error:" "$out"; then
            cat "$out" >&2
            fail "$prog $c"
        fi
    done
}

# 1c. Signals interrupt blocking calls on DDP-mode sockets as on TCP
# (tests/c/eintr.c, one case per run, under ASan/UBSan; issue 12).
ECASES=(read restart rcvtimeo waitall sink placed send poll resethand removed errqueue two tworestart tworcvtimeo)
c_cases eintr "${ECASES[@]}"
pass "${#ECASES[@]} signal-interruption cases under ASan/UBSan (EINTR, SA_RESTART, SO_RCVTIMEO, MSG_WAITALL, sink, placed, send, poll, SA_RESETHAND, a handler removed, an error queue entry, two blocked readers)"

# 1c'. select and pselect over a DDP-mode pair answer as over TCP
# (tests/c/selectddp.c, under ASan/UBSan): made as a poll, and through the
# doorbells.
c_cases selectddp polled
WARPSOCK_DDP_SELECT_DIRECT=0 c_cases selectddp doorbells
pass "select and pselect over a DDP pair under ASan/UBSan, made as a poll and through the doorbells (timeout, readable and writable with a pipe, EBADF with the sets untouched, EINTR through pselect's mask, the peer's close)"

# 1c''. glibc's second names of the calls (__poll, __select, __read, __write,
# __send, __connect, __close, __fcntl, __dup2) over DDP sockets act as the first names
# (tests/c/aliasddp.c, under ASan/UBSan); __connect in policy mode on
# 127.0.0.2 alone.
WARPSOCK_DDP_PORTS=1-65535 WARPSOCK_DDP_ADDRS=127.0.0.2/32 c_cases aliasddp aliases
pass "glibc's second names of the calls over a DDP pair under ASan/UBSan (__fcntl's O_NONBLOCK, __send/__write/__read, __poll and __select see arrivals, a __dup2 copy, __close an end of stream, __connect switched in policy mode)"

# 1c'''. splice and sendfile with a DDP-mode socket at one end
# (tests/c/spliceddp.c; interpose/transfer.rs), its descriptor in
# SCM_RIGHTS (tests/c/passfd.c), close_range and closefrom over DDP
# sockets (tests/c/closerange.c; interpose/ranges.rs), preadv2/pwritev2
# (tests/c/positioned.c), recv with MSG_TRUNC (tests/c/truncddp.c),
# signal-driven I/O (tests/c/sigioddp.c; shim/sigio.rs), POSIX AIO
# (tests/c/aioddp.c; interpose/aio.rs), POLLRDHUP (tests/c/rdhupddp.c),
# an epoll wait after a poll (tests/c/pollepoll.c), under ASan/UBSan.
c_cases spliceddp from_socket to_socket refused sendfile
c_cases passfd refused
c_cases closerange ddp
c_cases positioned ddp
c_cases truncddp ddp
c_cases sigioddp ddp
c_cases aioddp ddp
c_cases rdhupddp ddp
c_cases pollepoll ddp
pass "splice and sendfile with a DDP socket at one end under ASan/UBSan (socket to pipe and back, a full pipe, a full socket, end of stream, EAGAIN, EINVAL, ESPIPE; nothing taken that was not moved); a DDP socket in SCM_RIGHTS refused (sendmsg, sendmmsg); close_range and closefrom close DDP sockets as close does and leave the library's own descriptors; preadv2/pwritev2 at -1 are readv/writev; MSG_TRUNC drops the bytes; O_ASYNC/F_SETOWN/F_SETSIG/FIOASYNC signal arrivals, carried through a switch; POSIX AIO requests complete (aio_suspend, aio_cancel, lio_listio, SIGEV_SIGNAL/SIGEV_THREAD); the peer's half-close shows as POLLRDHUP/EPOLLRDHUP; an epoll wait after a poll reports the bytes"

# 1d. Socket options and the busy-polling fast path (tests/c/sockopt.c,
# one case per run, under ASan/UBSan; review r22-c).
OCASES=(rcvlowat soerror soerrpoll soerrrecv soerrhup abort abortdup abortbefore abortunread abortshut abortblocked closeblocked closeunread closeheld blockafter stamps latestamps stampopts stampsbefore stampstruct stampkey errqueueopts zerocopy emfile)
c_cases sockopt "${OCASES[@]}"
pass "${#OCASES[@]} socket-option cases under ASan/UBSan (SO_RCVLOWAT, SO_ERROR and poll after a reset, abortive closes (dup, set before, unread, after shutdown, with a blocked reader), orderly closes with unread bytes (stream, a message's part) resetting, a blocking read after empty spins, stamps and error reports kept, late stamps dropped, SO_TIMESTAMPING's struct form and refusals, its OPT_ID key across a failed switch, the error queue with IP_RECVERR and receive stamps on, SO_ZEROCOPY refused, a switch short of descriptors declined before its handshake, the connection working TCP)"

# 1e. pthread_cancel of a thread blocked in a read, a MSG_WAITALL recv, a
# send on a full window, a poll (standing in for the progress thread) and
# the accepted end's read: the thread ends with PTHREAD_CANCELED as over
# TCP, the socket works after; and of a thread in a switch that completes
# late, in a recvfrom of an offloaded UDP socket (WARPSOCK_UDP_OFFLOAD=1
# here), in a last close made by dup2, in exit, _exit or exec, in a
# sendfile waiting for its pipe, in a read watching for a late MPA Request,
# in a switch that fails; and a residue socket's calls with per-call flags,
# a read of a partial late MPA Request (times out, no spin),
# sendfile of nothing or at a pipe's offset (not cancels: they return at
# once) (one case per run, under ASan/UBSan; issue 12): the calls blocked on
# a switched pair (tests/c/cancel.c), the switches and residue sockets
# (tests/c/cancelswitch.c), exit, _exit and exec (tests/c/cancelexit.c).
KCASES=(read waitall send poll accepted select epoll accept close stream self disabled pending jump udprecv dup2 dup2abort sendfile sendfilezero)
KSCASES=(switch switchpeer watch watchflags watchpartial watchnb watchreq switchfail)
KXCASES=(exit exitnow exec)
WARPSOCK_UDP_OFFLOAD=1 c_cases cancel "${KCASES[@]}"
WARPSOCK_UDP_OFFLOAD=1 c_cases cancelswitch "${KSCASES[@]}"
WARPSOCK_UDP_OFFLOAD=1 c_cases cancelexit "${KXCASES[@]}"
pass "$((${#KCASES[@]} + ${#KSCASES[@]} + ${#KXCASES[@]})) pthread_cancel cases under ASan/UBSan (read, MSG_WAITALL, send, poll, accepted end, select, epoll_wait, accept, close, a flowing writer, a self-cancel, cancellation disabled, a cancel pending before a poll, a switch that completes late (both ends), an offloaded UDP recvfrom, a last close in dup2 (orderly, abortive), exit, _exit, exec, a sendfile from a pipe, a read watching for a late MPA Request, a switch that fails; a residue socket's flags, a partial late Request's read timing out, a non-blocking read beside a watching one, a late MPA Request's reset, sendfile of nothing or at a pipe's offset; and a standing poll left by siglongjmp lapses)"

# A non-blocking connect asked for DDP mode waits in the call for the
# connection: one deadline across the cancel signals it ignores
# (cancellation disabled; review r25-a item 10), 1 s here.
WARPSOCK_CONNECT_TIMEOUT_MS=1000 c_cases cancelswitch connectwait
pass "a non-blocking connect's wait for a DDP switch ends at WARPSOCK_CONNECT_TIMEOUT_MS through ignored cancel signals, EINPROGRESS"

# 1b. Progress-thread wake-ups per round trip, counted (not timed): an 8 B
# ping-pong of 2 x 2000 round trips (blocking calls, then poll before each
# receive) runs no round on the progress thread beyond the connection's
# start and end, in both processes together.
out="$WORK/pingpong.out"
if ! WARPSOCK_STATS=1 WARPSOCK_CRC=0 timeout 120 "${PRE[@]}" "$WORK/xsock" pingpong local >"$out" 2>&1 \
    || grep -qE "Sanitizer|runtime error:" "$out"; then
    cat "$out" >&2
    fail "pingpong on loopback"
fi
bg=$(stat "$out" ddp_bg_rounds)
[ "$(stat "$out" ddp_switched)" -eq 2 ] || { cat "$out" >&2; fail "pingpong: both ends must switch"; }
[ "$bg" -le 8 ] || { cat "$out" >&2; fail "pingpong: $bg progress-thread rounds for 4000 round trips (at most 8: none per round trip)"; }
pass "8 B ping-pong, 4000 round trips: $bg progress-thread rounds, $(stat "$out" ddp_poll_rounds) rounds in the program's own polls"

# 2. Two namespaces joined by a veth pair.
A="wsx-a-$$"
B="wsx-b-$$"
ip netns add "$A"; NETNS+=("$A")
ip netns add "$B"; NETNS+=("$B")
ip link add "wsxa$$" netns "$A" type veth peer name "wsxb$$" netns "$B"
ip -n "$A" addr add 10.77.0.1/24 dev "wsxa$$"
ip -n "$B" addr add 10.77.0.2/24 dev "wsxb$$"
ip -n "$A" link set "wsxa$$" up; ip -n "$A" link set lo up
ip -n "$B" link set "wsxb$$" up; ip -n "$B" link set lo up
for crc in 1 0; do
    for pc in xsockswitch:switch xsockswitch:calls xsock:stream xsock:rio xsock:aio xsockswitch:plain; do
        p=${pc%%:*} c=${pc#*:}
        pf="$WORK/port.$c.$crc"
        rm -f "$pf"
        XSOCK_DEBUG=1 WARPSOCK_CRC=$crc WARPSOCK_SWITCH_TIMEOUT_MS=1000 timeout 120 ip netns exec "$A" "${PRE[@]}" \
            "$WORK/$p" "$c" server 10.77.0.1 "$pf" >"$WORK/ns.s.out" 2>&1 &
        sp=$!; PIDS+=("$sp")
        for _ in $(seq 100); do [ -s "$pf" ] && break; sleep 0.05; done
        [ -s "$pf" ] || fail "$c: the namespace server did not start"
        if ! XSOCK_DEBUG=1 WARPSOCK_CRC=$crc WARPSOCK_SWITCH_TIMEOUT_MS=1000 timeout 120 ip netns exec "$B" "${PRE[@]}" \
            "$WORK/$p" "$c" client 10.77.0.1 "$(cat "$pf")" >"$WORK/ns.c.out" 2>&1; then
            cat "$WORK/ns.c.out" "$WORK/ns.s.out" >&2
            fail "$c across namespaces, CRC $crc (client)"
        fi
        wait "$sp" || { cat "$WORK/ns.s.out" >&2; fail "$c across namespaces, CRC $crc (server)"; }
        PIDS=("${PIDS[@]/$sp}")
        grep -qE "Sanitizer|runtime error:" "$WORK/ns.s.out" "$WORK/ns.c.out" && fail "$c: sanitizer report"
    done
    pass "6 C cases across a veth pair between namespaces, CRC $crc"
done

# 3. tshark reads the DDP-mode part of a connection as MPA/DDP/RDMAP.
pf="$WORK/port.cap"
WARPSOCK_CRC=1 timeout 60 "${PRE[@]}" "$WORK/xsockswitch" switch server 127.0.0.1 "$pf" >"$WORK/cap.s.out" 2>&1 &
sp=$!; PIDS+=("$sp")
for _ in $(seq 100); do [ -s "$pf" ] && break; sleep 0.05; done
port="$(cat "$pf")"
# --immediate-mode: packets reach tcpdump as they come (libpcap otherwise
# hands them over in blocks, up to a second late, and SIGINT drops them).
timeout 60 tcpdump -i lo -U --immediate-mode -s 0 -w "$WORK/x.pcap" "tcp port $port" 2>"$WORK/tcpdump.err" &
tp=$!; PIDS+=("$tp")
for _ in $(seq 100); do grep -q "listening" "$WORK/tcpdump.err" && break; sleep 0.05; done
WARPSOCK_CRC=1 timeout 60 "${PRE[@]}" "$WORK/xsockswitch" switch client 127.0.0.1 "$port" >"$WORK/cap.c.out" 2>&1 \
    || { cat "$WORK/cap.c.out" >&2; fail "capture run"; }
wait "$sp"
# Until the capture stops growing (at most 10 s): a loaded machine may run
# tcpdump behind the programs.
last=-1
for _ in $(seq 40); do
    sz=$(wc -c <"$WORK/x.pcap" 2>/dev/null || echo 0)
    [ "$sz" = "$last" ] && break
    last=$sz; sleep 0.25
done
kill -INT "$tp"; wait "$tp" || true
fpdus=$(tshark -r "$WORK/x.pcap" -Y iwarp_ddp_rdmap -T fields -e frame.number 2>/dev/null | wc -l)
bad=$(tshark -r "$WORK/x.pcap" -V 2>/dev/null | grep -c "Bad CRC32" || true)
good=$(tshark -r "$WORK/x.pcap" -V 2>/dev/null | grep -c "Good CRC32" || true)
req=$(tshark -r "$WORK/x.pcap" -V 2>/dev/null | grep -c "MPA ID Req Frame\|Request frame" || true)
# The switch case moves 100,000 stream bytes each way after the switch: at
# least two frames of FPDUs each way (loopback segments are at most 64 KiB;
# the engine puts several FPDUs in one when it can, so frames are few), and
# every FPDU tshark decoded has a good CRC.
[ "$fpdus" -ge 4 ] && [ "$bad" -eq 0 ] && [ "$good" -ge "$fpdus" ] && [ "$req" -ge 1 ] \
    || { cat "$WORK/tcpdump.err" >&2; fail "tshark: $fpdus DDP/RDMAP frames, $good good and $bad bad CRCs, $req MPA requests"; }
pass "tshark decodes the DDP-mode connection: $fpdus DDP/RDMAP frames, $good good CRCs, 0 bad"

# 3b. Re-entrancy audit (the engine's calls never re-enter the interposer).
cargo build --quiet -p warpsock-preload --features test-hooks --target-dir "$TARGET_DIR/tmp/preload-hooks"
AUDIT_SO="$TARGET_DIR/tmp/preload-hooks/debug/libwarpsock_preload.so"
: >"$WORK/audit.out"
for pc in xsock:stream xsock:rio xsock:aio xsockswitch:kill xsockswitch:fork; do
    p=${pc%%:*} c=${pc#*:}
    WARPSOCK_STATS=1 timeout 120 env LD_PRELOAD="$AUDIT_SO" "$WORK/$p" "$c" local >>"$WORK/audit.out" 2>&1 \
        || { cat "$WORK/audit.out" >&2; fail "audit run of $c"; }
done
guarded=$(stat "$WORK/audit.out" reentry_guarded)
unguarded=$(stat "$WORK/audit.out" reentry_unguarded)
nested=$(stat "$WORK/audit.out" reentry_nested)
[ "$guarded" -gt 100 ] && [ "$unguarded" -eq 0 ] && [ "$nested" -eq 0 ] \
    || fail "re-entrancy audit: $guarded guarded, $unguarded unguarded library calls, $nested nested entries"
pass "re-entrancy audit: $guarded engine/library calls reached the interposer, all under the guard; 0 unguarded, 0 nested"

# 4. Unmodified programs in policy mode.
# Stops a server by pid with SIGINT (python and redis exit through their
# exit handlers, so the preload prints its counters). The servers run under
# `timeout --foreground`: without it timeout passes the SIGINT on twice (to
# the server and to its process group), and a second one during python's
# shutdown kills it before the exit handlers (no counters: 1 run in 6).
stop() {
    kill -INT "$1" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$1" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$1" 2>/dev/null || true
    wait "$1" 2>/dev/null || true
}
wait_port() {
    for _ in $(seq 100); do
        python3 -c "import socket,sys; s=socket.socket(); s.settimeout(0.2); sys.exit(s.connect_ex(('127.0.0.1',$1)))" && return 0
        sleep 0.1
    done
    return 1
}

mkdir -p "$WORK/www"
head -c $((100 << 20)) /dev/urandom >"$WORK/www/big"
want=$(sha256sum <"$WORK/www/big" | cut -d' ' -f1)
http_run() { # SERVER_PRELOAD CLIENT_PRELOAD
    lease_port; local port=$PORT
    local spre=() cpre=()
    [ "$1" = yes ] && spre=(env LD_PRELOAD="$SO" WARPSOCK_DDP_PORTS="$port" WARPSOCK_STATS=1)
    [ "$2" = yes ] && cpre=(env LD_PRELOAD="$SO" WARPSOCK_DDP_PORTS="$port" WARPSOCK_STATS=1)
    (cd "$WORK/www" && exec timeout --foreground 120 "${spre[@]}" python3 -m http.server "$port" --bind 127.0.0.1) \
        >"$WORK/http.s.out" 2>&1 &
    local sp=$!; PIDS+=("$sp")
    wait_port "$port" || fail "http.server did not start"
    got=$(timeout 120 "${cpre[@]}" curl -sS "http://127.0.0.1:$port/big" 2>"$WORK/http.c.err" | sha256sum | cut -d' ' -f1)
    stop "$sp"
    [ "$got" = "$want" ] || { cat "$WORK/http.c.err" >&2; fail "http $1/$2: sha256 differs"; }
}
http_run yes yes
[ "$(stat "$WORK/http.c.err" ddp_switched)" -ge 1 ] || fail "curl -> http.server did not switch"
[ "$(stat "$WORK/http.s.out" ddp_switched)" -ge 1 ] || fail "http.server did not switch"
pass "python http.server + curl, both preloaded: 100 MiB over DDP mode, sha256 equal"
http_run no yes
[ "$(stat "$WORK/http.c.err" ddp_refused)" -ge 1 ] || fail "preloaded curl -> plain server: no fallback counted"
pass "preloaded curl -> plain http.server: falls back to TCP, 100 MiB sha256 equal"
http_run yes no
[ "$(stat "$WORK/http.s.out" ddp_refused)" -ge 1 ] || fail "plain curl -> preloaded server: no fallback counted"
pass "plain curl -> preloaded http.server: falls back to TCP, 100 MiB sha256 equal"

# Ctrl-C stops a python client blocked in sock.recv on a switched socket
# (issue 12: CPython's handlers have no SA_RESTART and it raises
# KeyboardInterrupt on the read's EINTR; the read used to wait on). SIGINT
# is sent only while the client sleeps (after it said so), again until it
# exits: one that lands between the engine's sleeps runs the handler and
# the read goes on, as just before a TCP read's sleep (bounded: 100 tries).
lease_port; port=$PORT
cat >"$WORK/intr_srv.py" <<'EOF2'
import socket, sys
l = socket.socket(); l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(("127.0.0.1", int(sys.argv[1]))); l.listen(1)
while True:  # wait_port's probe first, then the client
    c, _ = l.accept(); c.sendall(b"hello"); c.recv(1); c.close()
EOF2
cat >"$WORK/intr_cli.py" <<'EOF2'
import signal, socket, sys
# A background job of a script starts with SIGINT ignored: CPython's own
# handler (no SA_RESTART) back, as in a terminal.
signal.signal(signal.SIGINT, signal.default_int_handler)
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
assert s.recv(5) == b"hello"
print("waiting", flush=True)
try:
    s.recv(100)
    print("returned", flush=True)
except KeyboardInterrupt:
    print("KeyboardInterrupt", flush=True)
EOF2
PYPRE=(env LD_PRELOAD="$SO" WARPSOCK_DDP_PORTS="$port" WARPSOCK_STATS=1)
timeout 60 "${PYPRE[@]}" python3 "$WORK/intr_srv.py" "$port" >"$WORK/intr.s.out" 2>&1 &
sp=$!; PIDS+=("$sp")
wait_port "$port" || fail "intr_srv.py did not start"
"${PYPRE[@]}" python3 "$WORK/intr_cli.py" "$port" >"$WORK/intr.c.out" 2>"$WORK/intr.c.err" &
pp=$!; PIDS+=("$pp")
for _ in $(seq 100); do grep -q waiting "$WORK/intr.c.out" && break; sleep 0.05; done
for _ in $(seq 100); do
    kill -0 "$pp" 2>/dev/null || break
    [ "$(awk '{print $3}' "/proc/$pp/stat" 2>/dev/null)" = S ] && kill -INT "$pp" 2>/dev/null
    sleep 0.05
done
kill -KILL "$pp" 2>/dev/null || true
wait "$pp" || true
stop "$sp"
grep -q KeyboardInterrupt "$WORK/intr.c.out" \
    || { cat "$WORK/intr.c.out" "$WORK/intr.c.err" >&2; fail "Ctrl-C did not interrupt a python recv on a switched socket"; }
[ "$(stat "$WORK/intr.c.err" ddp_switched)" -ge 1 ] || fail "the python client did not switch"
pass "Ctrl-C (SIGINT) stops a python client blocked in sock.recv on a switched socket (KeyboardInterrupt)"

lease_port; port=$PORT
IPRE=(env LD_PRELOAD="$SO" WARPSOCK_DDP_PORTS="$port" WARPSOCK_STATS=1)
timeout 60 "${IPRE[@]}" iperf3 -s -1 -p "$port" -B 127.0.0.1 >"$WORK/iperf.s.out" 2>&1 &
sp=$!; PIDS+=("$sp")
sleep 0.5
timeout 60 "${IPRE[@]}" iperf3 -c 127.0.0.1 -p "$port" -t 2 -J >"$WORK/iperf.c.json" 2>"$WORK/iperf.c.err" \
    || { cat "$WORK/iperf.c.err" "$WORK/iperf.s.out" >&2; fail "iperf3 under policy mode"; }
wait "$sp" || true
python3 - "$WORK/iperf.c.json" <<'EOF' || fail "iperf3 moved no data"
import json, sys
j = json.load(open(sys.argv[1]))
bps = j["end"]["sum_received"]["bits_per_second"]
print(f"test-xsock: iperf3 over DDP mode: {bps/1e9:.2f} Gbit/s (not a benchmark)")
sys.exit(0 if bps > 0 else 1)
EOF
[ "$(stat "$WORK/iperf.c.err" ddp_switched)" -ge 2 ] || fail "iperf3: control and data connections did not switch"
pass "iperf3 TCP, client and server preloaded in policy mode"

lease_port; port=$PORT
RPRE=(env LD_PRELOAD="$SO" WARPSOCK_DDP_PORTS="$port" WARPSOCK_STATS=1)
timeout --foreground 120 "${RPRE[@]}" redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no \
    >"$WORK/redis.s.out" 2>&1 &
sp=$!; PIDS+=("$sp")
wait_port "$port" || fail "redis-server did not start"
timeout 120 "${RPRE[@]}" redis-benchmark -h 127.0.0.1 -p "$port" -n 3000 -c 10 -t set,get -q \
    >"$WORK/redis.c.out" 2>"$WORK/redis.c.err" || { cat "$WORK/redis.c.err" >&2; fail "redis-benchmark"; }
# Regression (issue 12): without keepalive every request is a new connection
# switched at connect/accept time, and a readiness look applied out of order
# lost a doorbell ring: both ends waited forever with every queue empty.
timeout 120 "${RPRE[@]}" redis-benchmark -h 127.0.0.1 -p "$port" -n 2000 -d 16 -c 8 -k 0 -t set,get -q \
    >"$WORK/redis.k0.out" 2>"$WORK/redis.k0.err" \
    || { tail -c 2000 "$WORK/redis.k0.out" >&2; fail "redis-benchmark -k 0 (a new connection per request) hung or failed"; }
# Regression (issue 12): plain clients of the preloaded server fall back to
# TCP. redis registers an accepted descriptor in its epoll set and then
# reads the request that the switch attempt had read ahead; the demotion to
# the TCP socket after it used to leave that registration on the doorbell,
# so the second request on a connection was never answered (keepalive hung).
for k in 1 0; do
    timeout 120 redis-benchmark -h 127.0.0.1 -p "$port" -n 2000 -d 16 -c 8 -k "$k" -t set,get -q \
        >"$WORK/redis.plain.k$k.out" 2>&1 \
        || { tail -c 2000 "$WORK/redis.plain.k$k.out" >&2; fail "plain redis-benchmark -k $k against the preloaded redis-server hung or failed"; }
    grep -qiE "error|fail" "$WORK/redis.plain.k$k.out" && fail "plain redis-benchmark -k $k reported errors"
    [ "$(grep -c "requests per second" "$WORK/redis.plain.k$k.out")" -ge 2 ] || fail "plain redis-benchmark -k $k gave no results"
done
stop "$sp"
grep -qiE "error|fail" "$WORK/redis.k0.out" && fail "redis-benchmark -k 0 reported errors"
[ "$(grep -c "requests per second" "$WORK/redis.k0.out")" -ge 2 ] || fail "redis-benchmark -k 0 gave no results"
[ "$(stat "$WORK/redis.k0.err" ddp_switched)" -ge 2000 ] || fail "redis-benchmark -k 0: connections did not switch"
grep -qiE "error|fail" "$WORK/redis.c.out" && fail "redis-benchmark reported errors"
grep -q "requests per second" "$WORK/redis.c.out" || fail "redis-benchmark gave no results"
[ "$(stat "$WORK/redis.c.err" ddp_switched)" -ge 10 ] || fail "redis-benchmark connections did not switch"
[ "$(stat "$WORK/redis.s.out" ddp_refused)" -ge 2008 ] || fail "plain redis-benchmark: the preloaded server counted no fallbacks"
pass "redis-server + redis-benchmark (3000 requests, set/get; and 2000 with -k 0, a connection each) in policy mode, no errors"
pass "plain redis-benchmark (keepalive, and -k 0) -> preloaded redis-server in policy mode: falls back to TCP, no errors"

# nginx as Debian ships it: a master that listens and two workers it forks,
# each accepting on the inherited listener (so each switches connections on
# threads of its own, after the fork) in an epoll loop, answering with
# sendfile. `user root` is ignored (with a notice) when not run as root,
# and keeps the workers able to read $WORK when it is.
lease_port; port=$PORT
NG="$WORK/nginx"
mkdir -p "$NG/tmp"
echo hello >"$WORK/www/small"
cat >"$NG/nginx.conf" <<EOF
user root;
worker_processes 2;
daemon off;
pid $NG/nginx.pid;
error_log $NG/error.log notice;
events { worker_connections 256; }
http {
    access_log off;
    sendfile on;
    client_body_temp_path $NG/tmp;
    proxy_temp_path $NG/tmp;
    fastcgi_temp_path $NG/tmp;
    uwsgi_temp_path $NG/tmp;
    scgi_temp_path $NG/tmp;
    server { listen 127.0.0.1:$port; root $WORK/www; }
}
EOF
NPRE=(env LD_PRELOAD="$SO" WARPSOCK_DDP_PORTS="$port" WARPSOCK_STATS=1)
timeout --foreground 600 "${NPRE[@]}" nginx -e "$NG/error.log" -p "$NG" -c "$NG/nginx.conf" \
    >"$NG/s.out" 2>&1 &
sp=$!; PIDS+=("$sp")
wait_port "$port" || { cat "$NG/s.out" "$NG/error.log" >&2; fail "nginx did not start"; }
# The master and its 2 workers, by pid, for the cleanup below (`stop`
# ends the `timeout` that started the master). The port answers before
# the master writes its pid file and forks its workers.
NGPIDS=()
for _ in $(seq 100); do
    if [ -s "$NG/nginx.pid" ]; then
        NGPIDS=("$(cat "$NG/nginx.pid")")
        mapfile -t -O 1 NGPIDS < <(pgrep -P "${NGPIDS[0]}" || true)
        [ "${#NGPIDS[@]}" -ge 3 ] && break
    fi
    sleep 0.1
done
[ "${#NGPIDS[@]}" -ge 3 ] || fail "nginx: no master with 2 workers (${NGPIDS[*]})"
PIDS+=("${NGPIDS[@]}")
got=$(timeout 120 "${NPRE[@]}" curl -sS "http://127.0.0.1:$port/big" 2>"$NG/big.err" | sha256sum | cut -d' ' -f1)
[ "$got" = "$want" ] || { cat "$NG/big.err" >&2; fail "nginx: 100 MiB over DDP mode, sha256 differs"; }
urls=()
for _ in $(seq 50); do urls+=("http://127.0.0.1:$port/small"); done
n=$(timeout 60 "${NPRE[@]}" curl -sS "${urls[@]}" 2>"$NG/keep.err" | grep -c hello || true)
[ "$n" = 50 ] || { cat "$NG/keep.err" >&2; fail "nginx: $n of 50 requests on one connection answered"; }
: >"$NG/each.err"
n=$(for _ in $(seq 50); do timeout 30 "${NPRE[@]}" curl -sS "http://127.0.0.1:$port/small" 2>>"$NG/each.err"; done | grep -c hello || true)
[ "$n" = 50 ] || { cat "$NG/each.err" >&2; fail "nginx: $n of 50 connections answered"; }
got=$(timeout 120 curl -sS "http://127.0.0.1:$port/big" 2>"$NG/plain.err" | sha256sum | cut -d' ' -f1)
[ "$got" = "$want" ] || { cat "$NG/plain.err" >&2; fail "nginx: plain curl's 100 MiB sha256 differs"; }
# wrk as Debian ships it, 20 keep-alive connections for 1 s: its event loop
# holds 10 + 3 x 20 descriptor numbers and counts a connection whose number
# falls past them as a connect error. Each DDP-mode socket holds 7 of the
# library's besides the program's; placed low, they pushed half of wrk's
# numbers out (session 40).
timeout 60 "${NPRE[@]}" wrk -t 2 -c 20 -d 1s "http://127.0.0.1:$port/small" >"$NG/wrk.out" 2>"$NG/wrk.err" \
    || { cat "$NG/wrk.out" "$NG/wrk.err" >&2; fail "wrk failed"; }
grep -q "Socket errors" "$NG/wrk.out" && { cat "$NG/wrk.out" >&2; fail "wrk -> nginx in policy mode: socket errors"; }
grep -q "Requests/sec" "$NG/wrk.out" || { cat "$NG/wrk.out" >&2; fail "wrk gave no result"; }
[ "$(stat "$NG/wrk.err" ddp_switched)" -ge 20 ] || fail "wrk: its connections did not switch"
stop "$sp"
for p in "${NGPIDS[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
grep -E "\[(alert|crit|emerg)\]" "$NG/error.log" && fail "nginx logged alerts"
[ "$(stat "$NG/big.err" ddp_switched)" -ge 1 ] && [ "$(stat "$NG/keep.err" ddp_switched)" -ge 1 ] \
    && [ "$(stat "$NG/each.err" ddp_switched)" -ge 50 ] || fail "nginx: the clients' connections did not switch"
pass "nginx (a master, 2 forked workers, epoll, sendfile) in policy mode: 100 MiB over DDP mode sha256 equal, 50 requests on one connection, 50 connections; plain curl falls back; wrk, 20 connections, no socket errors"

# memcached as Debian ships it: its listener thread accepts and hands each
# connection to one of 4 worker threads (libevent, epoll), which registers
# it in its own event base while the connection may still be switching.
# Clients (python, the text protocol) set and get values of 100 B to 3 KiB
# and check each one; 4 run at once with keys of their own.
cat >"$WORK/mcc.py" <<'EOF2'
import os, socket, sys
port, conns, per = (int(a) for a in sys.argv[1:4])
bad = 0
for c in range(conns):
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    f = s.makefile("rwb")
    for i in range(per):
        key = f"k{os.getpid()}_{c}_{i}".encode()
        val = os.urandom(50 + (i * 37) % 1500).hex().encode()
        f.write(b"set %s 0 0 %d\r\n%s\r\n" % (key, len(val), val))
        f.flush()
        if f.readline() != b"STORED\r\n":
            bad += 1
            continue
        f.write(b"get %s\r\n" % key)
        f.flush()
        hdr = f.readline().split()
        if len(hdr) != 4 or hdr[0] != b"VALUE":
            bad += 1
            continue
        data = f.read(int(hdr[3]) + 2)[:-2]
        if data != val or f.readline() != b"END\r\n":
            bad += 1
    s.close()
print("memcached client: bad", bad)
sys.exit(1 if bad else 0)
EOF2
lease_port; port=$PORT
MPRE=(env LD_PRELOAD="$SO" WARPSOCK_DDP_PORTS="$port" WARPSOCK_STATS=1)
timeout --foreground 600 "${MPRE[@]}" memcached -u root -l 127.0.0.1 -p "$port" -t 4 -U 0 \
    >"$WORK/mc.s.out" 2>&1 &
sp=$!; PIDS+=("$sp")
wait_port "$port" || { cat "$WORK/mc.s.out" >&2; fail "memcached did not start"; }
mcpids=()
for j in 1 2 3 4; do
    timeout 120 "${MPRE[@]}" python3 "$WORK/mcc.py" "$port" 20 20 >"$WORK/mc.$j.out" 2>"$WORK/mc.$j.err" &
    mcpids+=("$!")
    PIDS+=("$!")
done
for j in 1 2 3 4; do
    wait "${mcpids[$((j - 1))]}" || { cat "$WORK/mc.$j.out" "$WORK/mc.$j.err" >&2; fail "memcached client $j failed"; }
    [ "$(stat "$WORK/mc.$j.err" ddp_switched)" -ge 20 ] || fail "memcached client $j: its connections did not switch"
done
timeout 120 python3 "$WORK/mcc.py" "$port" 10 20 >"$WORK/mc.plain.out" 2>&1 \
    || { cat "$WORK/mc.plain.out" >&2; fail "plain memcached client failed"; }
stop "$sp"
pass "memcached (4 worker threads) in policy mode: 4 clients at once, 80 connections over DDP mode, 1,600 values set and read back; a plain client falls back"

# socat's forking server (accept, then fork: the child serves the
# connection, where its copy of a DDP socket would be refused): each
# accepted connection's switch holds its answer until the program uses the
# connection, and socat's fork declines it (an MPA Reject: a preloaded
# client falls back at once), so every child serves a plain connection, to
# preloaded and plain clients alike. (socat forks within microseconds of
# its accept; a server that pauses there — from 200 us on, every child read
# nothing from a preloaded client before session 39 — is
# tests/ddp_accept_stall.rs's forking server with a pause.)
lease_port; port=$PORT
SPRE=(env LD_PRELOAD="$SO" WARPSOCK_DDP_PORTS="$port" WARPSOCK_STATS=1)
timeout --foreground 120 "${SPRE[@]}" socat TCP-LISTEN:"$port",bind=127.0.0.1,reuseaddr,fork EXEC:cat \
    >"$WORK/socat.s.out" 2>&1 &
sp=$!; PIDS+=("$sp")
wait_port "$port" || fail "socat did not start"
for i in $(seq 10); do
    got=$(echo "hello $i" | timeout 20 "${SPRE[@]}" socat -t 5 - TCP:127.0.0.1:"$port" 2>>"$WORK/socat.c.err") \
        || fail "a preloaded client of socat's forking server failed"
    [ "$got" = "hello $i" ] || fail "socat's forking server answered a preloaded client '$got'"
done
for i in $(seq 3); do
    got=$(echo "plain $i" | timeout 20 socat -t 5 - TCP:127.0.0.1:"$port") || fail "a plain client of socat's forking server failed"
    [ "$got" = "plain $i" ] || fail "socat's forking server answered a plain client '$got'"
done
stop "$sp"
# Every process of the server prints its counters (a child's start as
# its parent's at the fork): the parent's alone reach 10.
[ "$(stat "$WORK/socat.s.out" ddp_accept_declined)" -ge 10 ] \
    || { cat "$WORK/socat.s.out" >&2; fail "socat's forks did not decline the held switches"; }
[ "$(stat "$WORK/socat.s.out" ddp_switched)" -eq 0 ] || fail "a socat connection ended in DDP mode"
pass "socat's forking server (EXEC:cat) in policy mode: 10 preloaded clients and 3 plain ones served over plain TCP, each fork declining its connection's held switch"

echo "test-xsock: $PASSED passed"
