#!/usr/bin/python3 -IS
"""`netplan` on a lab node: netplan itself, except that `netplan apply` does what systemd-networkd
would do with netplan's output. A lab-only adaptation: the lab's nodes are network namespaces of one
machine without systemd, so no networkd runs in them.

`netplan apply` here: the node's /etc/netplan (its own folder, bound there by the node's init) is
copied into a scratch root and run through the real `netplan generate --root-dir`, so that netplan's
parser judges every file (its errors and exit status are netplan's); then each interface that a
generated .network file names gets that file's MTU and exactly its addresses (global ones: others
go, missing ones are added) and is set up, as networkd configures a link it manages. Interfaces no
file names are left as they are, as networkd leaves a link it does not manage. Every other
subcommand is the real netplan's.

Fault mgmt-cut (state key ``netplan_cuts_management``): while a file of sparkbook's is among the
node's netplan files, `netplan apply` also takes the management address down, as a renderer
switch or a bad merge does on a real node; with the file gone it comes back.

Standalone on purpose: it runs with the node's python3 and imports nothing from sparkbook.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile

NETPLAN = "/usr/sbin/netplan"
MARK = "sparkbook lab: simulated"


def ip(*args: str) -> str:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=True).stdout


def generated(root: str) -> dict[str, dict]:
    """The interfaces netplan's networkd files configure: {name: {"mtu": int|None, "addresses": [...]}}."""
    out = {}
    for path in sorted(glob.glob(f"{root}/run/systemd/network/*.network")):
        name, mtu, addresses = None, None, []
        with open(path) as f:
            for line in f:
                key, _, value = line.strip().partition("=")
                if key == "Name":
                    name = value
                elif key == "MTUBytes":
                    mtu = int(value)
                elif key == "Address":
                    addresses.append(value)
        if name:
            out[name] = {"mtu": mtu, "addresses": addresses}
    return out


def configure(name: str, want: dict) -> None:
    if want["mtu"]:
        ip("link", "set", "dev", name, "mtu", str(want["mtu"]))
    link = json.loads(ip("-j", "addr", "show", "dev", name))[0]
    have = {f"{a['local']}/{a['prefixlen']}" for a in link.get("addr_info", []) if a.get("scope") == "global"}
    for cidr in sorted(have - set(want["addresses"])):
        ip("addr", "del", cidr, "dev", name)
    for cidr in want["addresses"]:
        if cidr not in have:
            ip("addr", "add", cidr, "dev", name)
    ip("link", "set", "dev", name, "up")


def apply() -> int:
    root = tempfile.mkdtemp(prefix="netplan-apply.")
    try:
        os.makedirs(f"{root}/etc/netplan")
        for f in sorted(glob.glob("/etc/netplan/*.yaml")):
            shutil.copy2(f, f"{root}/etc/netplan/")
        r = subprocess.run([NETPLAN, "generate", "--root-dir", root])
        if r.returncode:
            return r.returncode
        links = {li["ifname"] for li in json.loads(ip("-j", "link", "show"))}
        for name, want in generated(root).items():
            if name in links:
                configure(name, want)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    with open(os.environ["SPARKBOOK_LAB_STATE"]) as f:
        state = json.load(f)
    if state.get("netplan_cuts_management") and glob.glob("/etc/netplan/*sparkbook*"):
        mgmt = state.get("mgmt_if", "enP7s7")
        print(f"{MARK} fault mgmt-cut: netplan apply took {mgmt}'s address down", file=sys.stderr)
        ip("addr", "flush", "dev", mgmt, "scope", "global")
    return 0


def main(argv: list[str]) -> int:
    if argv[1:2] == ["apply"]:
        return apply()
    os.execv(NETPLAN, [NETPLAN, *argv[1:]])
    return 127


if __name__ == "__main__":
    sys.exit(main(sys.argv))
