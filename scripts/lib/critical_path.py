"""One critical-path sample by source file (scripts/bench-critical-path.sh
--breakdown): reads the instruction list scripts/critical-path.c writes with
-d ("OBJECT-PATH FILE-OFFSET" per instruction, in order), cuts it into runs
by object (the library's tail of the read, the program, the library's head
of the send), and prints each run's instructions by source file, from the
debug information (addr2line). Files of the workspace are named relative to
it; std's, core's and the dependencies' are counted as one line.

    python3 scripts/lib/critical_path.py DUMP
"""

import collections
import os
import subprocess
import sys

WORKSPACE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__))))


def loads(path):
    """The object's LOAD segments: (file offset, virtual address, size)."""
    out = subprocess.run(["readelf", "-lW", path], capture_output=True, text=True, check=True).stdout
    segs = []
    for line in out.splitlines():
        f = line.split()
        if f and f[0] == "LOAD":
            segs.append((int(f[1], 16), int(f[2], 16), int(f[4], 16)))
    return segs


def vaddr(segs, off):
    for foff, va, size in segs:
        if foff <= off < foff + size:
            return va + off - foff
    sys.exit(f"critical_path: file offset {off:#x} is in no LOAD segment")


def source_files(path, offsets):
    """The source file of each instruction at these file offsets."""
    segs = loads(path)
    addrs = [hex(vaddr(segs, o)) for o in offsets]
    out = subprocess.run(["addr2line", "-e", path] + addrs, capture_output=True, text=True, check=True)
    files = []
    for line in out.stdout.splitlines()[: len(addrs)]:
        f = line.rsplit(":", 1)[0]
        if os.path.realpath(f).startswith(WORKSPACE + "/"):
            f = os.path.relpath(os.path.realpath(f), WORKSPACE)
        elif f.startswith("??"):
            f = "(no line information)"
        else:
            f = "(std, core and dependencies)"
        files.append(f)
    return files


def main():
    runs = []
    for line in open(sys.argv[1]):
        # The path may hold spaces; the offset never does.
        obj, off = line.rstrip("\n").rsplit(" ", 1)
        if not runs or runs[-1][0] != obj:
            runs.append((obj, []))
        runs[-1][1].append(int(off, 16))
    total = sum(len(offs) for _, offs in runs)
    print(f"one sample: {total} instructions from the read's return to the send")
    for obj, offs in runs:
        name = os.path.basename(obj)
        print(f"  {len(offs):5d}  {name}")
        # The workspace's libraries only: the program and libc are a few
        # instructions, told apart by the object alone.
        if not name.startswith("libwarpsock"):
            continue
        for f, n in collections.Counter(source_files(obj, offs)).most_common():
            print(f"         {n:5d}  {f}")


if __name__ == "__main__":
    main()
