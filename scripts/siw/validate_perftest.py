#!/usr/bin/env python3
"""Validate the capture of a warpsock-perftest run against siw (test-siw.sh).

Checks, through tshark's iWARP dissectors, the expected sequence of RDMAP
operations (--expect) of a short captured run or the Terminate siw sent
(TERM=layer/type:code, with --term-detail for its reported detail).
Prints the reason and exits 1 on a mismatch.
"""
import argparse, subprocess, sys
ap = argparse.ArgumentParser()
ap.add_argument("pcap")
ap.add_argument("--port", type=int, required=True)
ap.add_argument("--expect", required=True, help="comma list of DIR:OP=COUNT on the last MPA stream, or TERM=byte0hex:ecodehex")
ap.add_argument("--term-detail", help="ETYPE:M:DLEN: the Terminate's error type, M bit and attached DDP header length (0: none)")
a = ap.parse_args()
OPS = {"0x00": "Write", "0x01": "ReadReq", "0x02": "ReadResp", "0x03": "Send", "0x07": "Terminate"}
T = ["tshark", "-r", a.pcap, "-o", "tcp.try_heuristic_first:TRUE", "-o", "tcp.reassemble_out_of_order:TRUE"]
rows = subprocess.run(T + ["-T", "fields", "-E", "separator=|", "-e", "tcp.stream", "-e", "tcp.srcport",
                           "-e", "tcp.len", "-e", "tcp.seq", "-e", "iwarp_mpa.ulpdulength", "-e", "iwarp_mpa.crc_check",
                           "-e", "iwarp_rdma.opcode", "-e", "iwarp_ddp.last_flag", "-e", "iwarp_mpa.pdlength",
                           "-e", "iwarp_rdma.term_layer", "-e", "iwarp_rdma.term_errcode",
                           "-e", "iwarp_rdma.term_errcode_rdma", "-e", "iwarp_rdma.term_errcode_ddp_tagged",
                           "-e", "iwarp_rdma.term_errcode_ddp_untagged", "-e", "iwarp_rdma.term_errcode_llp",
                           "-e", "iwarp_rdma.term_etype_rdma", "-e", "iwarp_rdma.term_etype_ddp",
                           "-e", "iwarp_rdma.term_etype_llp", "-e", "iwarp_rdma.term_hdrct_m", "-e", "iwarp_rdma.term_ddp_h"],
                      capture_output=True, text=True, check=True).stdout.splitlines()
problems, streams = [], {}
for r in rows:
    sid, sport, tlen, seq, ulp, crc, op, last, pdl, tl, *rest = (r.split("|") + [""] * 20)[:20]
    tes, tets, tm, tdh = rest[:5], rest[5:8], rest[8], rest[9]
    te = next((x for x in tes if x), "")  # the dissector files the code per layer
    tet = next((x for x in tets if x), "")  # ... and the error type
    d = "R" if int(sport) == a.port else "I"
    st = streams.setdefault(sid, {"tcp": {"I": 0, "R": 0}, "mpa": {"I": 0, "R": 0}, "msgs": {}, "term": None})
    if tlen and int(tlen):
        st["tcp"][d] = max(st["tcp"][d], int(seq) - 1 + int(tlen))
    for p in [x for x in pdl.split(",") if x]:
        st["mpa"][d] += 20 + int(p)
    ulps = [int(x) for x in ulp.split(",") if x]
    ops, lasts = op.split(","), last.split(",")
    for i, u in enumerate(ulps):
        st["mpa"][d] += 2 + u + (-(2 + u)) % 4 + 4
        if i < len(ops) and ops[i] and i < len(lasts) and lasts[i] == "1":
            k = f"{d}:{OPS.get(ops[i], ops[i])}"
            st["msgs"][k] = st["msgs"].get(k, 0) + 1
    if "Bad CRC32" in crc:
        problems.append(f"stream {sid}: Bad CRC32 in a frame from {d}")
    if tl:
        st["term"] = (d, tl, te, tet, tm or "0", len(tdh.replace(":", "")) // 2)
live = [s for s in streams if streams[s]["mpa"]["I"]]
if not live:
    print(f"FAIL {a.pcap}: no MPA stream decoded"); sys.exit(1)
for sid in live:
    st = streams[sid]
    for d in "IR":
        if st["mpa"][d] != st["tcp"][d]:
            problems.append(f"stream {sid} {d}->: {st['tcp'][d]} TCP payload bytes, {st['mpa'][d]} decoded as MPA frames/FPDUs")


def crc32c(data, crc=0):
    """CRC32c (Castagnoli, reflected), as MPA's trailer carries it (RFC 5044 §4.3; little endian
    on the wire, as siw and warpsock write it)."""
    crc ^= 0xFFFFFFFF
    t = CRC_TABLE
    for b in data:
        crc = t[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


CRC_TABLE = []
for _i in range(256):
    _c = _i
    for _ in range(8):
        _c = (_c >> 1) ^ (0x82F63B78 if _c & 1 else 0)
    CRC_TABLE.append(_c)


def own_framing(sid):
    """Our own reading of stream `sid` where tshark's MPA dissector lost the FPDU framing
    (tshark 4.0 does on long runs of large FPDUs spanning 64 KiB segments): the stream's
    bytes reassembled by tshark's TCP layer (`-z follow,tcp,raw`), the MPA Request and Reply,
    then every FPDU framed by its length to the stream's last byte, each one's DDP and RDMAP
    version 1 and, with CRC negotiated, its CRC32c checked. Returns (problems, message
    counts) or None when the stream cannot be followed."""
    out = subprocess.run(["tshark", "-r", a.pcap, "-q", "-o", "tcp.reassemble_out_of_order:TRUE",
                          "-z", f"follow,tcp,raw,{sid}"], capture_output=True, text=True).stdout
    nodes, data = {}, {0: bytearray(), 1: bytearray()}
    for line in out.splitlines():
        if line.startswith("Node "):
            n, addr = line[5:].split(": ", 1)
            nodes[int(n)] = int(addr.rsplit(":", 1)[1])
        elif line and not line.startswith(("=", "Follow", "Filter")):
            node = 1 if line.startswith("\t") else 0
            try:
                data[node] += bytes.fromhex(line.strip())
            except ValueError:
                return None
    if len(nodes) != 2:
        return None
    by_dir = {("R" if port == a.port else "I"): data[n] for n, port in nodes.items()}
    if set(by_dir) != {"I", "R"}:
        return None
    keys = {"I": b"MPA ID Req Frame", "R": b"MPA ID Rep Frame"}
    starts, crc_on = {}, False
    for d, b in by_dir.items():
        if b[:16] != keys[d] or len(b) < 20:
            return None
        crc_on |= bool(b[16] & 0x40)
        starts[d] = 20 + int.from_bytes(b[18:20], "big")
    probs, msgs = [], {}
    for d, b in by_dir.items():
        o, n = starts[d], 0
        while o < len(b):
            if o + 2 > len(b):
                probs.append(f"stream {sid} {d}->: {len(b) - o} bytes after the last FPDU (own framing)")
                break
            u = int.from_bytes(b[o:o + 2], "big")
            total = 2 + u + (-(2 + u)) % 4 + 4
            if u < 2 or o + total > len(b):
                probs.append(f"stream {sid} {d}->: FPDU at stream offset {o} (ULPDU {u}) runs past the stream's end (own framing)")
                break
            ctrl, rd = b[o + 2], b[o + 3]
            if ctrl & 3 != 1 or rd >> 6 != 1:
                probs.append(f"stream {sid} {d}->: FPDU at stream offset {o}: DDP/RDMAP version {ctrl & 3}/{rd >> 6} (own framing)")
            if crc_on and crc32c(b[o:o + total - 4]) != int.from_bytes(b[o + total - 4:o + total], "little"):
                probs.append(f"stream {sid} {d}->: bad CRC32c in the FPDU at stream offset {o} (own framing)")
            if ctrl & 0x40:
                k = f"{d}:{OPS.get(f'0x{rd & 15:02x}', f'0x{rd & 15:02x}')}"
                msgs[k] = msgs.get(k, 0) + 1
            o += total
            n += 1
    return probs, msgs


for sid in live:
    st = streams[sid]
    if all(st["mpa"][d] == st["tcp"][d] for d in "IR"):
        continue
    own = own_framing(sid)
    if own is None:
        continue  # tshark's mismatch stands as the problem
    tag = f"stream {sid} "
    problems = [p for p in problems if not p.startswith(tag)] + own[0]
    st["msgs"] = own[1]
    st["own"] = True
st = streams[live[-1]]
for e in a.expect.split(","):
    k, v = e.split("=")
    if k == "TERM":
        b0, ec = v.split(":")
        # Wireshark reads the control word in RFC layout: siw's byte 0
        # (etype<<4 | layer) shows as layer = etype.
        want = (f"0x{int(b0, 16) >> 4:02x}", f"0x{int(ec, 16):02x}")
        if st["term"] is None or st["term"][0] != "R":
            problems.append(f"no Terminate from the responder in the last stream (want byte0 {b0}, ecode {ec})")
        elif (st["term"][1], st["term"][2]) != want:
            problems.append(f"Terminate decoded by tshark as layer {st['term'][1]} ecode {st['term'][2]}, expected {want[0]} / {want[1]}")
        elif a.term_detail:
            et, m, dl = a.term_detail.split(":")
            got = (st["term"][3], st["term"][4], st["term"][5])
            if got != (f"0x{int(et):02x}", m, int(dl)):
                problems.append(f"Terminate decoded by tshark with etype {got[0]}, M {got[1]}, {got[2]}-byte DDP header; expected etype 0x{int(et):02x}, M {m}, {dl}-byte DDP header")
            else:
                summary_term = f"Terminate layer {st['term'][1]} etype {got[0]} ecode {st['term'][2]} M {got[1]} DDP hdr {got[2]} B"
    elif st["msgs"].get(k, 0) != int(v):
        problems.append(f"{k}: {st['msgs'].get(k, 0)} messages in the last stream, expected {v}")
summary = f"{len(live)} MPA stream(s), last: " + " ".join(f"{k}={v}" for k, v in sorted(st["msgs"].items()))
if st.get("own"):
    summary += " (tshark lost the MPA framing: counted by our own framing, every FPDU and CRC checked)"
if "summary_term" in globals():
    summary = summary_term
if problems:
    print(f"FAIL {a.pcap}: {summary}")
    for p in problems:
        print("  - " + p)
    sys.exit(1)
print(f"ok   tshark: {summary}")
