#!/usr/bin/python3 -IS
"""Simulated host tools for the lab, linked onto a lab node's PATH only while a fault needs them
(sparkbook/lab/faults.py): ``date`` (clock), ``df`` (disk), ``nmcli`` (dhcp) and ``dmesg`` (xid).
Everything else they pass to the real tool. They read the node's state file through simhw.py beside
them, and say on stderr that they are simulated.

Standalone on purpose: it runs with the node's python3 and imports nothing from sparkbook.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
import simhw  # noqa: E402  (beside this file on the node's PATH)

TIME_GIVEN = ("-d", "--date", "-s", "--set", "-r", "--reference", "-f", "--file")


def date(args: list[str], s: dict) -> int:
    """The real date, told that now is ``clock_offset_s`` seconds later (the lab's nodes share
    this machine's clock: a skewed one can only be simulated)."""
    if not any(a.startswith(TIME_GIVEN) for a in args):
        args = ["-d", f"@{time.time() + float(s.get('clock_offset_s', 0)):.9f}", *args]
    os.execv("/bin/date", ["date", *args])


def df(args: list[str], s: dict) -> int:
    """The real df with at most ``disk_free_kb`` available on each filesystem, in 1K blocks (as
    `df -Pk` prints them, which sparkbook's inventory.sh reads); other units pass unchanged."""
    limit = s.get("disk_free_kb")
    if limit is None or any(re.match(r"-[^-]*[hHmB]|--(human|si|block)", a) for a in args):
        os.execv("/bin/df", ["df", *args])
    r = subprocess.run(["/bin/df", *args], capture_output=True, text=True)
    lines = r.stdout.splitlines()
    for i, line in enumerate(lines[1:], 1):
        f = line.split()
        if len(f) >= 6 and f[2].isdigit() and f[3].isdigit():
            used, avail = int(f[2]), min(int(f[3]), int(limit))
            f[3], f[4] = str(avail), f"{-(-100 * used // max(used + avail, 1))}%"
            lines[i] = " ".join(f)
    sys.stdout.write("".join(ln + "\n" for ln in lines))
    sys.stderr.write(r.stderr)
    return r.returncode


def nmcli(args: list[str], s: dict) -> int:
    """NetworkManager as `nmcli [--escape no] -g FIELD device show IF` and `... -g FIELD connection
    show id NAME` answer (nmcli(1): -g prints the value alone): ``nm_dhcp``'s interface on its profile, set
    by DHCP (ipv4.method auto); every other interface unmanaged (an empty connection)."""
    nm = s.get("nm_dhcp") or {}
    if args[:2] == ["--escape", "no"]:
        args = args[2:]
    if args[:1] != ["-g"] or len(args) < 5:
        print("sparkbook lab: this simulated nmcli answers only -g FIELD device|connection show ...", file=sys.stderr)
        return 2
    field, what, target = args[1], args[2], args[-1]
    if what == "device" and field == "GENERAL.CONNECTION":
        print(nm.get("connection", "") if target == nm.get("interface") else "")
    elif what == "connection" and field == "ipv4.method" and target == nm.get("connection"):
        print("auto")
    else:
        print(f"Error: {target!r} not found.", file=sys.stderr)
        return 10
    return 0


def dmesg(args: list[str], s: dict) -> int:
    """The kernel log with the Xid lines of the `xid` fault (state["xid"]: each with its time)
    after it, as the NVIDIA driver prints them (the lab's nodes share this machine's kernel, whose
    GPU has no driver)."""
    real = subprocess.run(["/bin/dmesg", *args], capture_output=True, text=True)
    sys.stdout.write(real.stdout)
    boot = time.time() - time.monotonic()
    for x in s.get("xid") or []:
        if x["at"] <= time.time():
            print(f"[{x['at'] - boot:12.6f}] {x['line']}")
    return 0



TOOLS = {"date": date, "df": df, "nmcli": nmcli, "dmesg": dmesg}


def main(argv: list[str]) -> int:
    tool = os.path.basename(argv[0])
    if tool not in TOOLS:  # called as simhost.py TOOL ARGS...
        tool, argv = argv[1], argv[1:]
    s = simhw.state()
    print(f"[{simhw.MARK} {tool} on {s['node']}]", file=sys.stderr)
    return TOOLS[tool](argv[1:], s)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
