# Host ports for a siw VM's port forwards (scripts/test-siw.sh,
# scripts/test-verbs.sh). Source it, then:
#   read -r OFF EXTRA... < <(vm_port_offset N GUEST_PORT...)
# prints an offset OFF such that every forward's host port GUEST_PORT+OFF
# is free on 127.0.0.1, followed by N more free host ports OFF+1000 ..
# OFF+1000+N-1 (the VM's command channel, a host-side server's port), all
# below the kernel's ephemeral port range when it leaves room.
# Fails when 500 random offsets found none. These ports are checked, not
# held: qemu's hostfwd and the unmodified servers these suites start take
# a port number, not a bound socket (bind port 0 and pass the listener
# wherever the program allows instead). Use vm_ports (below) to also lease
# them.
vm_port_offset() {
    python3 - "$@" <<'PY'
import random, socket, sys
def free(p):
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", p)); return True
    except OSError:
        return False
    finally:
        s.close()
n, guest = int(sys.argv[1]), [int(p) for p in sys.argv[2:]]
# Every host port below the kernel's ephemeral range: a port checked free
# here is bound later (qemu's hostfwd, our servers), and any process's
# outgoing connection could be given one inside that range meanwhile —
# "rdma_bind_addr: Address already in use" for test-verbs.sh's host-side
# server on 34610 while another suite's bench connected (CI, 2026-11-25).
try:
    low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
except (OSError, ValueError, IndexError):
    low = 32768
top = low - max(max(guest, default=0), 1000 + n)
lo, hi = (2000, top) if top > 4000 else (20000, 40000)
for _ in range(500):
    off = random.randrange(lo, hi)
    extra = [off + 1000 + i for i in range(n)]
    if all(free(p + off) for p in guest) and all(free(p) for p in extra):
        print(off, *extra); break
else:
    sys.exit("vm_port_offset: no free ports")
PY
}

# vm_ports N GUEST_PORT...: as vm_port_offset, in the caller's shell: sets
# VM_OFF and VM_EXTRA (an array of the N extra ports), and holds a lease of
# warpsock-testkit (crates/warpsock-testkit/src/ports.rs: an flock on
# $TMPDIR/warpsock-testkit-ports/PORT) on every host port until the shell
# exits (qemu inherits the descriptors). Without it a parallel cargo test
# could be leased a port the VM forwards: its client then reached the
# guest's empty port through qemu (accepted, then reset: seen 2026-11-23,
# warpsock-rping's loopback test, while another engineer's VM ran). Another
# offset is tried when a lease is taken; fails after 20.
vm_ports() {
    local n=$1 try p fd rest ok dir=${TMPDIR:-/tmp}/warpsock-testkit-ports
    local ports=() fds=()
    shift
    mkdir -p "$dir"
    for try in $(seq 20); do
        read -r VM_OFF rest < <(vm_port_offset "$n" "$@")
        [ -n "$VM_OFF" ] || return 1
        read -ra VM_EXTRA <<<"$rest"
        ports=("${VM_EXTRA[@]}")
        for p in "$@"; do ports+=($((p + VM_OFF))); done
        fds=() ok=1
        for p in "${ports[@]}"; do
            exec {fd}>>"$dir/$p"
            fds+=("$fd")
            flock -n "$fd" || { ok=0; break; }
        done
        [ "$ok" = 1 ] && return 0
        for fd in "${fds[@]}"; do exec {fd}>&-; done
    done
    return 1
}
