"""Writes the preload library's hot-functions linker script from callgrind
files (scripts/hot-functions.sh runs the workloads and calls this).

    hot_functions.py WORK LIB OUT

WORK holds `cg.<run>.<rounds>.<pid>` callgrind files (uncompressed strings,
names not demangled) for rounds 2000, 4000 and 6000 of each run, two
processes each, and `symbols` (the library's defined symbols, `nm
--defined-only` lines: address, type, name);
runs are taken in name order (their priority). LIB is the library counted;
OUT the linker script written.
"""

import collections
import glob
import os
import re
import subprocess
import sys

ROUNDS = (2000, 4000, 6000)
HASH = re.compile(r"17h[0-9a-f]{16}E(\.llvm\.\d+)?$")
# A crate's disambiguator in a v0 name (std's, which changes with the
# toolchain; ours, when the toolchain mangles with v0).
CRATE = re.compile(r"Cs[0-9A-Za-z]+_")
# The header line naming the compiler whose symbol names the script holds
# (tests/hot_layout.rs reads it).
GENERATED_BY = "generated with: "


def costs(path, libname, symbols):
    """Instructions per function of the library in one callgrind file.
    Valgrind names the object of a function outside the library's `.text`
    section (in its hot section, when the library counted has one) `???`:
    such functions are the library's when it defines their names."""
    d = collections.Counter()
    ob = fn = None
    skip = False
    with open(path) as f:
        for line in f:
            if line.startswith("ob="):
                ob = line[3:].strip()
            elif line.startswith("fn="):
                name = line[3:].strip()
                ours = ob is not None and (ob.endswith(libname) or ob == "???")
                fn = name if ours and name in symbols else None
            elif line.startswith("calls="):
                skip = True  # the next cost line is the call's inclusive cost
            elif line[:1].isdigit() or line[:1] in "+-*":
                if skip:
                    skip = False
                elif fn:
                    parts = line.split()
                    if len(parts) >= 2:
                        d[fn] += int(parts[1])
    return d


def steady(work, run, libname, symbols):
    """Functions whose instructions grow with each 2000 more round trips,
    by at least one instruction a round trip each time (set-up does not;
    a busy poller's empty spins grow by different amounts, so the two
    steps are not asked to match): name -> instructions a round trip."""
    files = [sorted(glob.glob(f"{work}/cg.{run}.{n}.*")) for n in ROUNDS]
    if any(len(f) != 2 for f in files):
        sys.exit(f"hot-functions: {run}: expected two processes' files at each count")
    got = collections.Counter()
    for proc in range(2):
        c = [costs(f[proc], libname, symbols) for f in files]
        for fn in c[2]:
            d1 = c[1].get(fn, 0) - c[0].get(fn, 0)
            d2 = c[2].get(fn, 0) - c[1].get(fn, 0)
            if min(d1, d2) >= 2000:
                got[fn] += (d1 + d2) / 4000
    return got


def main():
    work, lib, out = sys.argv[1:]
    libname = os.path.basename(lib)
    at = {}
    aliases = collections.defaultdict(list)
    with open(f"{work}/symbols") as f:
        for line in f:
            parts = line.split()
            if len(parts) == 3:
                at[parts[2]] = parts[0]
                aliases[parts[0]].append(parts[2])
    symbols = set(at)
    by_name = collections.Counter(HASH.sub("17h*", s) for s in symbols)

    def patterns(sym):
        """The name without its hash when one function has it; else this
        instance of a generic function, by its hash and those of the
        instances merged with it at the same address (another crate's copy
        of the same code, which may be the one kept when the code
        changes); LTO's suffix left open, v0 names' crate disambiguators
        too."""
        if sym.startswith("_R"):
            return [".text." + CRATE.sub("Cs*_", re.sub(r"\.llvm\.\d+$", "", sym))]
        bare = re.sub(r"\.llvm\.\d+$", "", sym)
        wild = HASH.sub("17h*", bare)
        if wild == bare or by_name[wild] == 1:
            return [".text." + wild]
        names = sorted({re.sub(r"\.llvm\.\d+$", "", a) for a in aliases[at[sym]]})
        return [".text." + n + "*" for n in names if HASH.sub("17h*", n) == wild]

    runs = sorted({os.path.basename(p).split(".")[1] for p in glob.glob(f"{work}/cg.*")})
    pats = []
    for run in runs:
        # Within a run by name: each of its functions runs in every round
        # trip, so their order matters little, and a regenerated script
        # changes only where the code did.
        for fn in sorted(steady(work, run, libname, symbols)):
            for p in patterns(fn):
                if p not in pats:
                    pats.append(p)
    if not pats:
        sys.exit("hot-functions: no steady-state function found")
    rustc = subprocess.run(["rustc", "-V"], capture_output=True, text=True, check=True)
    with open(out, "w") as f:
        f.write(
            "/* The preload library's small-message data path, placed first in its\n"
            " * code (build.rs). Generated by scripts/hot-functions.sh: callgrind's\n"
            " * steady-state functions of tests/c/ddp_pingpong.c's DDP round trips\n"
            " * (the benchmark's event mode, its busy mode, then blocking read/write\n"
            " * and poll; by name within each), then everything else (`.text` stays\n"
            " * one section: valgrind names only `.text`'s functions' objects and\n"
            " * lines). A name without its hash (`17h*`) is one function;\n"
            " * tests/hot_layout.rs checks that each of ours still names one placed\n"
            " * first. A name with its hash is one instance of a generic function: a\n"
            " * build with other crate metadata (features, toolchain) names it\n"
            " * otherwise, and it then stays where it is. Do not edit: regenerate.\n"
            f" * {GENERATED_BY}{rustc.stdout.strip()} */\n"
            "SECTIONS\n{\n  .text :\n  {\n"
        )
        for p in pats:
            f.write(f"    *({p})\n")
        f.write("    *(.text .text.*)\n  }\n}\nINSERT AFTER .init;\n")
    print(f"hot-functions: {len(pats)} patterns written to {out}")


if __name__ == "__main__":
    main()
