#!/usr/bin/env bash
# What is in use on this node, for sparkbook's preflight (01): the listening TCP sockets
# (section "@@ listeners", `ss -ltnp`, with the processes where this user may see them) and the
# processes whose command line matches PATTERN ("@@ processes": "PID COMMAND LINE").
# Usage: in_use.sh PATTERN
#   PATTERN  an extended regular expression, e.g. 'vllm|VLLM::|raylet|gcs_server|ray::|torchrun'
set -euo pipefail
export LC_ALL=C
pattern=${1:?usage: in_use.sh PATTERN}

echo "@@ listeners"
ss -ltnpH 2>/dev/null || ss -ltnH || true
echo "@@ processes"
# "PID COMMAND LINE", leaving out this script and its pipeline (their command lines hold PATTERN)
# and every line with "grep" (so do the command lines of whatever runs this text: bash -c, timeout)
ps -eo pid=,ppid=,args= |
  awk -v me="$$" '$1 != me && $2 != me { match($0, /^ *[0-9]+ +[0-9]+ /); print $1, substr($0, RLENGTH + 1) }' |
  grep -E -- "$pattern" | grep -v grep || true
