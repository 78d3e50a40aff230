#!/usr/bin/env bash
# The TCP addresses the processes of this deployment's containers (label LABEL, sparkbook=<name>)
# listen on, read inside each running container: with host networking its /proc/net/tcp{,6} are the
# node's sockets, and its own /proc maps them to its processes, whatever this SSH user may see of
# root's processes on the node. One line per socket: "LISTEN CONTAINER ADDRESS PORT PROGRAM";
# "LISTEN-ERROR CONTAINER WHY" for a container that could not be read (no python3 in it). Then
# "SECRETS CONTAINER NAME,..." : which of the variables NAME... some process of the container holds
# in its environment (the names only, never a value: the proof that a secret reached it).
# Usage: listeners.sh LABEL [NAME...]
#   e.g. listeners.sh sparkbook=lab HF_TOKEN VLLM_API_KEY
set -euo pipefail
label=$1
shift
# /proc/net/tcp: local address as hex words in host byte order, state 0A = LISTEN, inode 10th
program='import os, socket, sys
found = {}
for table, family in (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6)):
    try:
        rows = open("/proc/net/" + table).read().splitlines()[1:]
    except OSError:
        continue
    for row in rows:
        f = row.split()
        if f[3] != "0A":
            continue
        addr, port = f[1].split(":")
        raw = bytes.fromhex(addr)
        raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
        found[f[9]] = (socket.inet_ntop(family, raw), int(port, 16))
secrets = set(sys.argv[2:])
held = set()
for pid in sorted(filter(str.isdigit, os.listdir("/proc")), key=int):
    try:
        names = {v.split(b"=", 1)[0].decode() for v in open("/proc/%s/environ" % pid, "rb").read().split(b"\0") if b"=" in v}
        held |= names & secrets
    except OSError:
        pass
    try:
        program = open("/proc/%s/comm" % pid).read().strip() or "?"
        fds = os.listdir("/proc/%s/fd" % pid)
    except OSError:
        continue
    for fd in fds:
        try:
            link = os.readlink("/proc/%s/fd/%s" % (pid, fd))
        except OSError:
            continue
        if link.startswith("socket:[") and link[8:-1] in found:
            address, port = found.pop(link[8:-1])
            print("LISTEN", sys.argv[1], address, port, program.replace(" ", "_"))
print("SECRETS", sys.argv[1], ",".join(sorted(held)) or "-")'
docker ps --filter "label=$label" --format '{{.Names}}' 2>/dev/null |
  while read -r name; do
    docker exec "$name" python3 -c "$program" "$name" "$@" 2>/dev/null || echo "LISTEN-ERROR $name cannot run python3 in it"
  done
