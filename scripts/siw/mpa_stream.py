"""One direction of a captured MPA connection, and the FPDUs in it (RFC 5044).

Shared by trailer_split.py and double_hash_crc.py (imported: both run
from this directory). Captures are ours, on lo, from the SYN; without MPA
markers (siw implements none), the stream is the MPA Request or Reply, then
FPDUs back to back: MPA length (2 bytes, big-endian, the ULPDU's length), the
ULPDU (DDP/RDMAP headers and payload), pad to a multiple of 4, the 4-byte CRC.
"""
import struct
import subprocess

# CRC32c (Castagnoli, reflected), as MPA uses it (RFC 5044 §4.3).
TABLE = []
for i in range(256):
    c = i
    for _ in range(8):
        c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
    TABLE.append(c)


def crc32c(b):
    c = 0xFFFFFFFF
    for x in b:
        c = TABLE[(c ^ x) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def stream_to(pcap, port, field="tcp.dstport"):
    """The TCP payload sent to PORT (with field="tcp.srcport": sent from
    it), reassembled by sequence number, up to the first gap."""
    rows = subprocess.run(
        ["tshark", "-r", pcap, "-T", "fields", "-e", field, "-e", "tcp.seq",
         "-e", "tcp.payload"],
        # A prefix capture ends mid-packet: tshark reads it and exits 2.
        capture_output=True, text=True, check=False).stdout.splitlines()
    segments = []
    for r in rows:
        p = r.split("\t")
        if len(p) < 3 or not p[2] or int(p[0]) != port:
            continue
        segments.append((int(p[1]) - 1, bytes.fromhex(p[2].replace(":", ""))))
    # By sequence number, not capture order: a retransmitted segment (qemu's
    # socket dropped a 64 KiB loopback segment) is captured after the ones
    # sent behind it.
    segments.sort(key=lambda s: s[0])
    data = bytearray()
    for off, b in segments:
        if off > len(data):
            break  # a gap: the prefix ends here
        data[off:off + len(b)] = b
    return bytes(data)


def fpdus(data):
    """Each whole FPDU after the stream's MPA Request or Reply (whose private
    data length is at bytes 18-19): (offset, ULPDU length, pad length, total
    length with the CRC). Stops at the first FPDU the stream does not hold
    whole."""
    pd = struct.unpack(">H", data[18:20])[0]
    at = 20 + pd
    while at + 2 <= len(data):
        ul = struct.unpack(">H", data[at:at + 2])[0]
        pad = (4 - (2 + ul) % 4) % 4
        tot = 2 + ul + pad + 4
        if at + tot > len(data):
            return
        yield at, ul, pad, tot
        at += tot
