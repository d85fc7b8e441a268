#!/usr/bin/env python3
"""Explains a siw "crc error" by siw's split-trailer bug, from our capture.

Linux 6.1's siw (drivers/infiniband/sw/siw/siw_qp_rx.c, siw_get_trailer,
since "RDMA/siw: Always consume all skbuf data in sk_data_ready() upcall")
copies each piece of an FPDU trailer (pad + CRC) that arrives split over two
skbs to the *start* of its trailer buffer: the second piece overwrites the
first. It then feeds the wrong pad bytes into its CRC and compares a CRC
field made of the second piece, what is left of the first, and the previous
FPDU's CRC. siw logs `siw: crc error. in: IN, own OWN` (both little-endian
u32 of the bytes).

Given the capture of our stream (host side, from its SYN) and siw's kernel
log line, this walks our FPDUs and finds the FPDU and split point for which
that model reproduces both IN and OWN exactly. Exit 0 and one line saying
which FPDU when it does; exit 1 otherwise (or when the log has no such line:
exit 2).

usage: trailer_split.py PCAP PORT DMESG
"""
import re
import struct
import sys

sys.dont_write_bytecode = True  # no __pycache__ left next to the scripts
from mpa_stream import crc32c, fpdus, stream_to  # noqa: E402 (scripts/siw/, next to this file)


def main():
    pcap, port, dmesg = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    m = re.search(r"siw: crc error\. in: ([0-9a-f]+), own ([0-9a-f]+)", open(dmesg).read())
    if not m:
        print("no 'siw: crc error' line in the kernel log")
        return 2
    inb = struct.pack("<I", int(m.group(1), 16))
    own = int(m.group(2), 16)
    data = stream_to(pcap, port)
    n, prev_crc = 0, b"\0\0\0\0"
    for at, ul, pad, tot in fpdus(data):
        trailer = data[at + tot - 4 - pad:at + tot]
        for split in range(1, len(trailer)):
            rest = len(trailer) - split
            # The buffer: pad bytes, then the CRC field still holding the
            # previous FPDU's CRC; the first piece lands at the start, then
            # the second piece over it.
            tbuf = bytearray(pad) + bytearray(prev_crc)
            tbuf[:split] = trailer[:split]
            tbuf[:rest] = trailer[split:]
            field = bytes(tbuf[pad:pad + 4])
            own_model = crc32c(data[at:at + 2 + ul] + bytes(tbuf[:pad]))
            if field == inb and own_model == own:
                good = crc32c(data[at:at + tot - 4]) == struct.unpack("<I", trailer[-4:])[0]
                print(f"siw's split-trailer bug reproduced: FPDU {n} at stream offset {at} "
                      f"(ULPDU {ul}, pad {pad}): its {len(trailer)}-byte trailer split after "
                      f"{split} bytes gives siw's in {m.group(1)} and own {m.group(2)}; "
                      f"the CRC we sent is {'good' if good else 'BAD'}")
                return 0 if good else 1
        prev_crc = trailer[-4:]
        n += 1
    print(f"no FPDU of the {n} captured ({len(data)} stream bytes) explains "
          f"in {m.group(1)} / own {m.group(2)}")
    return 1


sys.exit(main())
