#!/usr/bin/env bash
# Micro-benchmarks of the FPDU hot path (crates/warpsock-wire/benches/fpdu.rs)
# and a GB/s summary with the ratio to a plain memcpy of the same payload.
#
#   scripts/bench-micro.sh            # run the bench, then summarise
#   scripts/bench-micro.sh --no-run   # only summarise the last run
#
# Extra arguments after `--` go to criterion (e.g. `-- fpdu_build`).
# Honours CARGO_TARGET_DIR; criterion writes to $target/criterion.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

run=1
if [[ "${1:-}" == "--no-run" ]]; then
    run=0
    shift
fi
[[ "${1:-}" == "--" ]] && shift

if ((run)); then
    echo "+ cargo bench -p warpsock-wire --bench fpdu -- $*" >&2
    cargo bench -p warpsock-wire --bench fpdu -- "$@"
fi

target="${CARGO_TARGET_DIR:-$root/target}"
python3 - "$target/criterion" <<'PY'
import json, os, sys

base = sys.argv[1]
cases = [
    ("memcpy", "memcpy (copy_from_slice)"),
    ("fpdu_build_crc", "FPDU build, CRC on"),
    ("fpdu_build_nocrc", "FPDU build, CRC off"),
    ("fpdu_gather_crc", "FPDU gather + CRC (tx)"),
    ("fpdu_parse_verify", "FPDU parse + CRC verify"),
    ("crc32c", "crc32c only"),
]
sizes = ["64B", "4KiB", "64KiB"]

def load(group, size):
    d = os.path.join(base, group, size, "new")
    try:
        with open(os.path.join(d, "estimates.json")) as f:
            ns = json.load(f)["mean"]["point_estimate"]
        with open(os.path.join(d, "benchmark.json")) as f:
            tp = json.load(f).get("throughput") or {}
        nbytes = tp.get("Bytes") or tp.get("BytesDecimal")
        return ns, nbytes
    except (OSError, KeyError, ValueError):
        return None

res = {(g, s): load(g, s) for g, _ in cases for s in sizes}
if not any(res.values()):
    sys.exit(f"no criterion results under {base}")

hdr = f"| {'case':<26} | {'size':>6} | {'bytes':>6} | {'mean ns':>10} | {'GB/s':>7} | {'x memcpy':>8} |"
print()
print(hdr)
print("|" + "|".join("-" * (len(c)) for c in hdr.split("|")[1:-1]) + "|")
for s in sizes:
    m = res[("memcpy", s)]
    m_gbs = m[1] / m[0] if m else None
    for g, label in cases:
        r = res[(g, s)]
        if not r:
            print(f"| {label:<26} | {s:>6} | {'-':>6} | {'-':>10} | {'-':>7} | {'-':>8} |")
            continue
        ns, nbytes = r
        gbs = nbytes / ns  # bytes per ns == GB/s (1e9 B/s)
        ratio = f"{gbs / m_gbs:.2f}" if m_gbs else "-"
        print(f"| {label:<26} | {s:>6} | {nbytes:>6} | {ns:>10.1f} | {gbs:>7.2f} | {ratio:>8} |")
print()
print("GB/s = payload bytes / mean time (1 GB = 1e9 B); 'x memcpy' = GB/s ratio to")
print("memcpy of the same payload size (higher is better, 1.00 = memcpy speed).")
PY
