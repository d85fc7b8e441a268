#!/usr/bin/env python3
"""Validate the capture of one rping run between warpsock and siw (test-siw.sh).

Reads the pcap through tshark's iWARP dissectors (PDML) and checks: exactly
one MPA-established TCP stream; MPA revision 2 Request/Reply in the right
directions with the expected CRC negotiation; every byte of the stream
accounted for by MPA frames; Good CRC32 on every FPDU with CRC on (zero
trailers with it off); rping's message sequence with sizes, MSNs and Read
Request/Response matching; the peer-to-peer RTR frame when asked; and no
iWARP expert warnings beyond the known rev-2 notes (tshark_expert.py).
Prints "ok ..." and exits 0, or "FAIL ..." with each problem and exits 1.
"""
import argparse, difflib, subprocess, sys, xml.etree.ElementTree as ET
from tshark_expert import expert_problems

ap = argparse.ArgumentParser()
ap.add_argument("pcap")
ap.add_argument("--port", type=int, required=True, help="responder's TCP port")
ap.add_argument("--iterations", type=int, required=True)
ap.add_argument("--size", type=int, required=True)
ap.add_argument("--crc", type=int, choices=[0, 1], required=True)
ap.add_argument("--rtr", choices=["none", "write", "read"], default="none")
a = ap.parse_args()

OPS = {0: "Write", 1: "ReadReq", 2: "ReadResp", 3: "Send", 4: "SendInv", 5: "SendSE", 6: "SendSEInv", 7: "Terminate"}
TSHARK = ["tshark", "-r", a.pcap, "-o", "tcp.try_heuristic_first:TRUE", "-o", "tcp.reassemble_out_of_order:TRUE"]
problems = []


def fail(msg):
    problems.append(msg)


def fields(el):
    """All fields under el, flattened, in document order: name -> list of (show, showname)."""
    out = {}
    for f in el.iter("field"):
        out.setdefault(f.get("name"), []).append((f.get("show"), f.get("showname") or ""))
    return out


def num(v):
    return int(v, 0) if v.startswith("0x") else int(v)


pdml = subprocess.run(TSHARK + ["-T", "pdml"], capture_output=True, check=True).stdout
streams = {}
for pkt in ET.fromstring(pdml).iter("packet"):
    protos = pkt.findall("proto")
    tcp = next((p for p in protos if p.get("name") == "tcp"), None)
    if tcp is None:
        continue
    tf = fields(tcp)
    sid = int(tf["tcp.stream"][0][0])
    src = int(tf["tcp.srcport"][0][0])
    d = "R" if src == a.port else "I"
    st = streams.setdefault(sid, {"bytes": {"I": 0, "R": 0}, "req": None, "rep": None, "fpdus": []})
    # Stream bytes from relative sequence numbers (retransmissions count once).
    seg = int(tf["tcp.len"][0][0])
    if seg:
        st["bytes"][d] = max(st["bytes"][d], int(tf["tcp.seq"][0][0]) - 1 + seg)
    for p in protos:
        name = p.get("name")
        f = fields(p)
        if name == "iwarp_mpa":
            if "iwarp_mpa.req" in f or "iwarp_mpa.rep" in f:
                key = "req" if "iwarp_mpa.req" in f else "rep"
                st[key] = {
                    "dir": d,
                    "crc": f["iwarp_mpa.crc_flag"][0][0] == "1",
                    "rej": f["iwarp_mpa.rej_flag"][0][0] == "1",
                    "rev": int(f["iwarp_mpa.rev"][0][0]),
                    "pd": int(f["iwarp_mpa.pdlength"][0][0]),
                    "pdata": f.get("iwarp_mpa.privatedata", [("", "")])[0][0],
                }
            if "iwarp_mpa.ulpdulength" in f:
                crc = f.get("iwarp_mpa.crc_check") or f.get("iwarp_mpa.crc") or [("", "")]
                st["fpdus"].append({"dir": d, "ulpdu": int(f["iwarp_mpa.ulpdulength"][0][0]),
                                    "crc_show": crc[0][1], "crc_val": crc[0][0],
                                    "frame": int(pkt.find("proto[@name='frame']/field[@name='frame.number']").get("show"))})
        elif name == "iwarp_ddp_rdmap":
            if not st["fpdus"] or "op" in st["fpdus"][-1]:
                fail(f"stream {sid}: DDP/RDMAP header without its MPA FPDU")
                continue
            g = lambda k: f[k][0][0] if k in f else None
            st["fpdus"][-1].update({
                "op": num(g("iwarp_rdma.opcode")) if g("iwarp_rdma.opcode") else None,
                "tagged": g("iwarp_ddp.tagged_flag") == "1",
                "last": g("iwarp_ddp.last_flag") == "1",
                "qn": g("iwarp_ddp.qn"), "msn": g("iwarp_ddp.msn"), "mo": g("iwarp_ddp.mo"),
                "stag": g("iwarp_ddp.stag"), "to": g("iwarp_ddp.tagged_offset"),
                "rr": {k.split(".")[-1]: g(k) for k in ("iwarp_rdma.sinkstag", "iwarp_rdma.sinkto",
                       "iwarp_rdma.rdmardsz", "iwarp_rdma.srcstag", "iwarp_rdma.srcto")},
            })

live = [s for s in streams if streams[s]["rep"] is not None]
if len(live) != 1:
    print(f"FAIL {a.pcap}: expected one MPA-established TCP stream, found {len(live)} (streams: {sorted(streams)})")
    sys.exit(1)
sid = live[0]
st = streams[sid]
req, rep, fp = st["req"], st["rep"], st["fpdus"]
if req is None or req["dir"] != "I" or rep["dir"] != "R":
    fail("MPA Request/Reply missing or in the wrong direction")
else:
    if rep["rej"]:
        fail("the MPA Reply rejects the connection")
    if req["rev"] != 2 or rep["rev"] != 2:
        fail(f"MPA revision {req['rev']}/{rep['rev']}, expected 2/2")
    if int(req["crc"] or rep["crc"]) != a.crc:
        fail(f"CRC negotiated {int(req['crc'] or rep['crc'])} (request C={int(req['crc'])}, reply C={int(rep['crc'])}), expected {a.crc}")

# Every byte of the stream is accounted for by MPA frames tshark decoded.
wire = {"I": 0, "R": 0}
for f in fp:
    wire[f["dir"]] += 2 + f["ulpdu"] + (-(2 + f["ulpdu"])) % 4 + 4
if req and rep:
    wire[req["dir"]] += 20 + req["pd"]
    wire[rep["dir"]] += 20 + rep["pd"]
for d in "IR":
    if wire[d] != st["bytes"][d]:
        fail(f"{d}->: {st['bytes'][d]} TCP payload bytes but only {wire[d]} decoded as MPA frames/FPDUs")
undecoded = [f["frame"] for f in fp if f.get("op") is None]
if undecoded:
    fail(f"{len(undecoded)} FPDUs not decoded as DDP/RDMAP (frames {undecoded[:10]})")

# CRC: all good when negotiated; all-zero trailers otherwise.
good = sum("Good CRC32" in f["crc_show"] for f in fp)
bad = [f["frame"] for f in fp if "Bad CRC32" in f["crc_show"]]
if bad:
    fail(f"{len(bad)} FPDUs with Bad CRC32 (frames {bad[:10]})")
if a.crc and good != len(fp):
    fail(f"only {good} of {len(fp)} FPDUs show Good CRC32")
if not a.crc:
    nz = [f["frame"] for f in fp if f["crc_val"] not in ("0x00000000", "0", "")]
    if nz:
        fail(f"CRC off but {len(nz)} FPDUs carry a non-zero CRC field (frames {nz[:10]})")

# Messages (FPDUs with L=1) in order, against rping's exchange.
msgs, cur, sizes = [], {}, []
for f in [f for f in fp if f.get("op") is not None]:
    key = (f["dir"], f["tagged"])
    payload = f["ulpdu"] - (14 if f["tagged"] else 18) - (28 if f["op"] == 1 else 0)
    m = cur.setdefault(key, {"dir": f["dir"], "op": f["op"], "len": 0, "first": f, "n": 0})
    if f["tagged"] and m["n"] and num(f["to"]) != num(m["first"]["to"]) + m["len"]:
        fail(f"frame {f['frame']}: tagged offset {f['to']} does not continue the message")
    if f["tagged"] and f["stag"] != m["first"]["stag"]:
        fail(f"frame {f['frame']}: STag changes within a message")
    if not f["tagged"] and m["n"] and num(f["mo"]) != m["len"]:
        fail(f"frame {f['frame']}: MO {f['mo']} != {m['len']}")
    m["len"] += payload
    m["n"] += 1
    if f["last"]:
        msgs.append(cur.pop(key))
if cur:
    fail(f"{len(cur)} messages never completed (no FPDU with L=1)")
# Zero-length RDMA Writes from the initiator after the RTR are warpsock's
# "kicks" (siw's accept race, see warpsock-rping); they carry nothing.
rtr_n = {"none": 0, "write": 1, "read": 2}[a.rtr]
kicks = [i for i, m in enumerate(msgs) if i >= rtr_n and m["dir"] == "I" and m["op"] == 0 and m["len"] == 0]
msgs = [m for i, m in enumerate(msgs) if i not in set(kicks)]
if len(kicks) > 3:
    fail(f"{len(kicks)} zero-length kick Writes (at most 3 expected)")
tokens = [f"{m['dir']}:{OPS.get(m['op'], m['op'])}" for m in msgs]
block = ["I:Send", "R:ReadReq", "I:ReadResp", "R:Send", "I:Send", "R:Write", "R:Send"]
prefix = {"none": [], "write": ["I:Write"], "read": ["I:ReadReq", "R:ReadResp"]}[a.rtr]
expect = prefix + block * a.iterations
if tokens != expect:
    diff = list(difflib.unified_diff(expect, tokens, "expected", "captured", lineterm="", n=2))
    fail("message sequence differs from rping's:\n    " + "\n    ".join(diff[:40]))
else:
    # Sizes, MSNs and Read Request/Response matching.
    msn = {}
    body = msgs[len(expect) - len(block) * a.iterations:]
    if a.rtr == "write" and msgs[0]["len"] != 0:
        fail(f"RTR Write carries {msgs[0]['len']} bytes")
    for i, m in enumerate(body):
        op, f0 = m["op"], m["first"]
        if op in (1, 3):
            k = (m["dir"], f0["qn"])
            want = msn.get(k, 1 + (1 if (a.rtr == "read" and op == 1) else 0))
            if num(f0["msn"]) != want:
                fail(f"{m['dir']} {OPS[op]} #{i}: MSN {f0['msn']} on QN {f0['qn']}, expected {want}")
            msn[k] = num(f0["msn"]) + 1
        if op == 3 and m["len"] != 16:
            fail(f"{m['dir']} Send #{i}: {m['len']} bytes, rping Sends are 16")
        if op == 1:
            rr = f0["rr"]
            if num(rr["rdmardsz"]) != a.size:
                fail(f"Read Request #{i} asks {rr['rdmardsz']} bytes, expected {a.size}")
            resp = body[i + 1]
            if (resp["first"]["stag"], num(resp["first"]["to"])) != (rr["sinkstag"], num(rr["sinkto"])):
                fail(f"Read Response #{i+1} goes to {resp['first']['stag']}/{resp['first']['to']}, request named {rr['sinkstag']}/{rr['sinkto']}")
            if resp["len"] != a.size:
                fail(f"Read Response #{i+1} carries {resp['len']} bytes, expected {a.size}")
        if op == 0 and m["len"] != a.size:
            fail(f"Write #{i} carries {m['len']} bytes, expected {a.size} (strlen+1)")

# Wireshark's expert info: nothing from the iWARP dissectors but the known rev-2 notes.
for p in expert_problems(TSHARK):
    fail(p)

fpdu_dir = {d: sum(1 for f in fp if f["dir"] == d) for d in "IR"}
largest = {d: max([f["ulpdu"] for f in fp if f["dir"] == d] or [0]) for d in "IR"}
summary = (f"{len(msgs)} messages in {len(fp)} FPDUs (I->R {fpdu_dir['I']}, R->I {fpdu_dir['R']}, "
           f"largest ULPDU {largest['I']}/{largest['R']}), {st['bytes']['I'] + st['bytes']['R']} TCP payload bytes, "
           f"CRC {'on: ' + str(good) + ' good' if a.crc else 'off'}" + (f", {len(kicks)} kick(s)" if kicks else ""))
if problems:
    print(f"FAIL {a.pcap}: {summary}")
    for p in problems:
        print("  - " + p)
    sys.exit(1)
print(f"ok   tshark: {summary}")
