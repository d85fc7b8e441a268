# Host ports for a siw VM's port forwards (scripts/test-siw.sh,
# scripts/test-verbs.sh). Source it, then:
#   read -r OFF EXTRA... < <(vm_port_offset N GUEST_PORT...)
# prints an offset OFF such that every forward's host port GUEST_PORT+OFF
# is free on 127.0.0.1, followed by N more free host ports OFF+1000 ..
# OFF+1000+N-1 (the VM's command channel, a host-side server's port).
# Fails when 500 random offsets found none. These ports are checked, not
# held: qemu's hostfwd and the unmodified servers these suites start take
# a port number, not a bound socket (bind port 0 and pass the listener
# wherever the program allows instead).
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
for _ in range(500):
    off = random.randrange(20000, 40000)
    extra = [off + 1000 + i for i in range(n)]
    if all(free(p + off) for p in guest) and all(free(p) for p in extra):
        print(off, *extra); break
else:
    sys.exit("vm_port_offset: no free ports")
PY
}
