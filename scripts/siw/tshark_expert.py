"""Wireshark expert info of a capture, judged the way every siw test does.

Nothing from the iWARP dissectors may show up as an error or warning except
the two notes old dissectors print for every MPA rev-2 (RFC 6581) Request
and Reply, and no dissector may report a malformed packet.
"""
import subprocess

# Printed for every rev-2 MPA frame by Wireshark 4.0's rev-1-only checks.
KNOWN_REV2_NOTES = ("Res field is NOT set to zero", "Rev field is NOT set to one")


def expert_problems(tshark_cmd):
    """Runs `tshark_cmd + -q -z expert` and returns one message per problem.

    A display filter in `tshark_cmd` (`-Y F`, e.g. the frames before the one
    where the MPA dissector lost FPDU alignment) becomes the expert tap's own
    filter: tshark's `-z expert` counts every frame, `-Y` or not (CI, session
    16: a Malformed exception at frame 746 failed a case whose reading had
    been cut at frame 394)."""
    cmd, tap = list(tshark_cmd), "expert"
    if "-Y" in cmd:
        i = cmd.index("-Y")
        tap = f"expert,{cmd[i + 1]}"
        del cmd[i:i + 2]
    out = subprocess.run(cmd + ["-q", "-z", tap], capture_output=True, text=True).stdout
    problems, section = [], ""
    for line in out.splitlines():
        s = line.strip()
        if s and s.split(" ")[0] in ("Errors", "Warns", "Notes", "Chats", "Comments"):
            section = s.split(" ")[0]
            continue
        if "IWARP" in s.upper() and section in ("Errors", "Warns"):
            if any(n in s for n in KNOWN_REV2_NOTES):
                continue
            problems.append(f"tshark expert {section}: {s}")
        if section == "Errors" and "Malformed" in s:
            problems.append(f"tshark expert Errors: {s}")
    return problems
