#!/usr/bin/env python3
"""Whether siw's bad MPA CRCs in a capture are exactly its double-hashed CRC.

siw 6.1 once sent an FPDU whose CRC field is CRC32c(header || payload ||
payload) (docs/protocol-notes.md §7.13): two contexts in siw_tx_hdt
(drivers/infiniband/sw/siw/siw_qp_tx.c) hashed the same FPDU's payload, the
second on top of the first's CRC state, and the second's final went on the
wire. "header" is the FPDU's MPA length and DDP/RDMAP headers (siw_prepare_fpdu
hashes them once), "payload" its payload and pad bytes as the FPDU carries
them (siw_tx_hdt hashes the pad after the payload).

Given our capture (from the SYN) and the port siw sent to, this walks every
whole FPDU siw sent and checks its CRC. Exit 0 and one line naming the
FPDU(s) when there is at least one bad CRC and every bad CRC is exactly that
double hash; exit 1 and one line saying why not otherwise (no bad CRC, CRC
not in use, or a bad CRC of any other kind; 2: usage).

usage: double_hash_crc.py PCAP PORT
       double_hash_crc.py --self-test   (synthetic FPDUs; no capture, no tshark)
"""
import struct
import sys

sys.dont_write_bytecode = True  # no __pycache__ left next to the scripts
from mpa_stream import crc32c, fpdus, stream_to  # noqa: E402 (scripts/siw/, next to this file)

MPA_REQ = b"MPA ID Req Frame"
MPA_REP = b"MPA ID Rep Frame"
MPA_FLAG_MARKERS, MPA_FLAG_CRC = 0x80, 0x40  # RFC 5044 §7.1


def header_len(fpdu):
    """The MPA length field plus the DDP/RDMAP headers of FPDU (RFC 5041
    §5.2/§5.3: tagged 14 bytes, untagged 18; RFC 5040 §4.4, §4.8: a Read
    Request's 28 more, a Terminate's 4-byte control field)."""
    if fpdu[2] & 0x80:  # DDP T: tagged
        return 2 + 14
    opcode = fpdu[3] & 0x0F
    return 2 + 18 + {1: 28, 7: 4}.get(opcode, 0)


def name(fpdu, at):
    """An FPDU as tshark would name it: tagged by STag/TO, untagged by
    MSN/MO (stream offset and lengths in both)."""
    hl = header_len(fpdu)
    ul = struct.unpack(">H", fpdu[0:2])[0]
    if fpdu[2] & 0x80:
        stag, to = struct.unpack(">IQ", fpdu[4:16])
        where = f"tagged, STag {stag:#x} TO {to}"
    else:
        msn, mo = struct.unpack(">II", fpdu[12:20])
        where = f"untagged, opcode {fpdu[3] & 0x0F}, MSN {msn} MO {mo}"
    return f"stream offset {at} ({where}, {ul + 2 - hl} payload bytes)"


def wire(crc):
    """A CRC32c as its field's bytes read big-endian, as tshark prints it."""
    return f"0x{struct.pack('<I', crc).hex()}"


def check(data):
    """(matches, one line) for the MPA stream DATA (MPA Request or Reply,
    then FPDUs) whose FPDUs carry CRCs."""
    bad, total = [], 0
    for at, ul, pad, tot in fpdus(data):
        total += 1
        fpdu = data[at:at + tot]
        field = struct.unpack("<I", fpdu[-4:])[0]
        body = fpdu[:-4]  # MPA length, ULPDU, pad
        if crc32c(body) == field:
            continue
        hl = header_len(fpdu)
        payload = body[hl:]  # the payload and the pad bytes as carried
        double = crc32c(body[:hl] + payload + payload)
        bad.append((at, fpdu, field, crc32c(body), double))
    if not bad:
        return False, f"no bad CRC in the {total} whole FPDUs captured ({len(data)} stream bytes)"
    for at, fpdu, field, good, double in bad:
        if field != double:
            return False, (f"{len(bad)} bad CRC(s) in {total} FPDUs, not all siw's double hash: "
                           f"{name(fpdu, at)} has CRC {wire(field)}, should be {wire(good)}, "
                           f"double hash {wire(double)}")
    return True, (f"{len(bad)} bad CRC(s) in {total} FPDUs, each siw's double hash "
                  "CRC32c(header || payload || payload): "
                  + "; ".join(f"{name(fpdu, at)}: CRC {wire(field)}, should be {wire(good)}"
                              for at, fpdu, field, good, double in bad))


def self_test():
    """Synthetic streams in memory: the double hash matches, nothing else."""
    failures, streams = [], []

    def expect(what, data, want):
        streams.append(what)
        got, line = check(data)
        if got != want:
            failures.append(f"{what}: expected {'a match' if want else 'no match'}, got: {line}")

    def fpdu(header, payload, crc=None):
        """An FPDU: MPA length, HEADER (DDP/RDMAP), PAYLOAD, zero pad, CRC
        (the right one unless given a function of (header with length,
        payload with pad))."""
        ul = len(header) + len(payload)
        h = struct.pack(">H", ul) + header
        p = payload + bytes((4 - (2 + ul) % 4) % 4)
        c = crc32c(h + p) if crc is None else crc(h, p)
        return h + p + struct.pack("<I", c)

    def send(msn, mo):  # untagged Send, last: DDP ctrl L|DV1, RDMAP ctrl RV1|Send
        return bytes([0x41, 0x43]) + bytes(4) + struct.pack(">III", 0, msn, mo)

    def write(stag, to):  # tagged RDMA Write: DDP ctrl T|L|DV1, RDMAP ctrl RV1|Write
        return bytes([0xC1, 0x40]) + struct.pack(">IQ", stag, to)

    def read_request(msn):  # untagged, QN 1: DDP ctrl L|DV1, RDMAP ctrl RV1|Read Request
        return (bytes([0x41, 0x41]) + bytes(4) + struct.pack(">III", 1, msn, 0)
                + struct.pack(">IQIIQ", 9, 0, 4096, 8, 0))

    if crc32c(b"123456789") != 0xE3069283:  # RFC 3720 B.4's check value
        failures.append("crc32c(b'123456789') is not 0xe3069283")
    req = MPA_REQ + bytes([MPA_FLAG_CRC, 1]) + struct.pack(">H", 4) + b"pd!!"
    pl = bytes(range(7, 207))  # 200 bytes: no pad after an 18-byte header
    odd = b"odd payload"  # 11 bytes: pad 3 after either header

    def dbl(h, p):
        return crc32c(h + p + p)

    good = [fpdu(send(1, 0), pl), fpdu(write(7, 64), odd)]
    expect("every CRC right", req + b"".join(good), False)
    expect("one double-hashed Send", req + good[0] + fpdu(send(1, 200), pl, dbl), True)
    expect("one double-hashed Write, pad hashed twice",
           req + good[1] + fpdu(write(7, 75), odd, dbl), True)
    expect("one double-hashed Send, pad hashed twice", req + fpdu(send(2, 0), odd, dbl), True)
    expect("two double-hashed FPDUs",
           req + fpdu(send(1, 0), pl, dbl) + good[0] + fpdu(write(7, 0), odd, dbl), True)
    expect("another wrong CRC", req + fpdu(send(1, 0), pl, lambda h, p: dbl(h, p) ^ 1), False)
    expect("the pad hashed once",
           req + fpdu(send(2, 0), odd, lambda h, p: crc32c(h + p[:len(odd)] + p)), False)
    expect("the header hashed twice", req + fpdu(send(1, 0), pl, lambda h, p: crc32c(h + p + h + p)), False)
    expect("a Write's CRC taken with an untagged header's length",
           req + fpdu(write(7, 0), pl, lambda h, p: dbl(h + p[:4], p[4:])), False)
    expect("a Read Request's CRC taken with a Send's header length (it has no payload)",
           req + fpdu(read_request(1), b"", lambda h, p: dbl(h[:20], h[20:])), False)
    expect("one double-hashed and one other wrong CRC",
           req + fpdu(send(1, 0), pl, dbl) + fpdu(send(1, 200), pl, lambda h, p: 0), False)
    expect("a double-hashed FPDU cut off by the capture's end", req + good[0] + fpdu(send(1, 200), pl, dbl)[:-1], False)
    for f in failures:
        print(f"double_hash_crc self-test: {f}")
    if not failures:
        print(f"double_hash_crc self-test: {len(streams)} streams and the CRC32c check value as expected")
    return 1 if failures else 0


def main():
    if sys.argv[1:] == ["--self-test"]:
        return self_test()
    if len(sys.argv) != 3:
        print(__doc__.rsplit("usage:", 1)[1].strip())
        return 2
    pcap, port = sys.argv[1], int(sys.argv[2])
    data, back = stream_to(pcap, port), stream_to(pcap, port, "tcp.srcport")
    for what, s in (("to", data), ("from", back)):
        if len(s) < 20 or s[:16] not in (MPA_REQ, MPA_REP):
            print(f"the stream {what} port {port} does not start with an MPA Request or Reply")
            return 1
    # CRCs (markers) are on when either side's MPA frame asks (siw_accept,
    # warpsock's cm.rs).
    flags = data[16] | back[16]
    if flags & MPA_FLAG_MARKERS:
        print("MPA markers in use: not walked")
        return 1
    if not flags & MPA_FLAG_CRC:
        print("neither MPA frame has C set: no CRCs to check")
        return 1
    ok, line = check(data)
    print(line)
    return 0 if ok else 1


sys.exit(main())
