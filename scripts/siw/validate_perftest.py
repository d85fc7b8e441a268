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
if "summary_term" in globals():
    summary = summary_term
if problems:
    print(f"FAIL {a.pcap}: {summary}")
    for p in problems:
        print("  - " + p)
    sys.exit(1)
print(f"ok   tshark: {summary}")
