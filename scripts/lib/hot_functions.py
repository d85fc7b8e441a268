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
import fnmatch
import glob
import os
import re
import subprocess
import sys

ROUNDS = (2000, 4000, 6000)
# A crate's disambiguator in a v0 name (a hash of its metadata: the
# toolchain's, and the features the build command unifies).
CRATE = re.compile(r"Cs[0-9A-Za-z]+_")
# A v0 back-reference (`B<offset>_`): an offset into the name, which moves
# when a crate hash before it is shorter (a base-62 number: one in ~20
# is); left open too (an identifier's `B…_` matched by mistake only makes
# the pattern looser).
BACKREF = re.compile(r"B[0-9A-Za-z]{0,3}_")
# The header line naming the compiler whose symbol names the script holds
# (tests/hot_layout.rs reads it).
GENERATED_BY = "generated with: "
# The most functions one pattern may name (tests/hot_layout.rs holds the
# same bound).
MAX_MATCHES = 8


def instantiating_crate_at(name):
    """Where the instantiating crate at the end of a v0 name starts (`_R
    <path> [<crate>]`: `C`, a hash `s…_`, and an identifier that ends the
    name, its length prefix exact), or None when the name has none. The
    crate depends on the build: a debug build shares an upstream crate's
    instance."""
    for m in re.finditer(r"C(?:s[0-9A-Za-z]*_)?(\d+)", name):
        if m.end() + int(m.group(1)) == len(name):
            return m.start()
    return None


def v0_pattern(name):
    """A v0 name as a linker pattern that another build's crate hashes do
    not change: the hashes and back-references left open, the crate that
    instantiated it ([`instantiating_crate_at`]) and LTO's `.llvm.N`
    suffix."""
    at = instantiating_crate_at(name)
    if at is not None:
        name = name[:at]
    p = BACKREF.sub("*", CRATE.sub("Cs*_", name)) + "*"
    return re.sub(r"\*+", "*", p)


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
    if not any(s.startswith("_R") for s in symbols):
        sys.exit(
            "hot-functions: the library's names are not v0-mangled (.cargo/config.toml asks "
            "for symbol-mangling-version=v0; a RUSTFLAGS in the environment overrides it): "
            "unset RUSTFLAGS and run again"
        )

    def patterns(sym):
        """The function's name, and those of the functions merged with it
        at the same address (LTO keeps one body, under one of their
        sections), each with its crates' hashes (`Cs…_`: the crate
        metadata, which the packages a build selects change), its
        back-references and a numeric suffix (LTO's `.llvm.N`, a
        clone's `.N`) left open
        ([`v0_pattern`]). v0 names say which instance of a
        generic function they are, so no hash pins one. A legacy name
        (`readv` and the other `no_mangle` entry points) is taken as it
        is, with the legacy names merged with it (`read` and `__read`)."""
        # LTO's `.llvm.N` and the compiler's `.N` of a local function's
        # clone (a specialised copy: `RxPool::give.1031`), whose number
        # another build command changes: both left open.
        names = {re.sub(r"(\.llvm)?\.\d+$", "", a) for a in aliases[at[sym]]}
        # A legacy name's body may be kept under another legacy name's
        # section (`read` under `__read`, its alias: `interpose/aliases.rs`):
        # both named, as the v0 ones.
        return [
            ".text." + (v0_pattern(n) if n.startswith("_R") else n)
            for n in sorted(names)
            if n.startswith("_R") or not sym.startswith("_R")
        ]

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
    # A pattern left so open that it names other functions too would pull
    # them into the hot pages: each names its function, its merged copies
    # and its instances of other crates, a few at most.
    sections = [".text." + s for s in symbols]
    for p in pats:
        hits = sum(1 for s in sections if fnmatch.fnmatchcase(s, p))
        if hits > MAX_MATCHES:
            sys.exit(f"hot-functions: {p} names {hits} functions (at most {MAX_MATCHES})")
    rustc = subprocess.run(["rustc", "-V"], capture_output=True, text=True, check=True)
    with open(out, "w") as f:
        f.write(
            "/* The preload library's small-message data path, placed first in its\n"
            " * code (build.rs). Generated by scripts/hot-functions.sh: callgrind's\n"
            " * steady-state functions of tests/c/ddp_pingpong.c's DDP round trips\n"
            " * (the benchmark's event mode, its busy mode, then blocking read/write\n"
            " * and poll; by name within each), then everything else (`.text` stays\n"
            " * one section: valgrind names only `.text`'s functions' objects and\n"
            " * lines). Names are v0-mangled (.cargo/config.toml), so each says\n"
            " * which instance of a generic function it is; crate hashes (`Cs*_`),\n"
            " * back-references, the instantiating crate and LTO's suffix are\n"
            " * left open. tests/hot_layout.rs checks that each name still names\n"
            " * a function placed first, and a few at most. Do not edit:\n"
            " * regenerate.\n"
            f" * {GENERATED_BY}{rustc.stdout.strip()} */\n"
            "SECTIONS\n{\n  .text :\n  {\n"
        )
        for p in pats:
            f.write(f"    *({p})\n")
        f.write("    *(.text .text.*)\n  }\n}\nINSERT AFTER .init;\n")
    print(f"hot-functions: {len(pats)} patterns written to {out}")


if __name__ == "__main__":
    main()
