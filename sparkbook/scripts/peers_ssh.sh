#!/usr/bin/env bash
# Whether this node reaches its peers by SSH without a prompt, for sparkbook's preflight (01):
# runs `SSH... -p PORT TARGET true` to every peer at once; prints "NAME TARGET STATUS" per peer,
# STATUS being ssh's exit status (0: answered).
# Usage: peers_ssh.sh NAME TARGET PORT [NAME TARGET PORT ...] -- SSH [OPTION ...]
#   e.g. peers_ssh.sh worker-1 10.0.0.2 22 -- ssh -o BatchMode=yes -o ConnectTimeout=5
set -euo pipefail
peers=()
while [ $# -gt 0 ] && [ "$1" != -- ]; do
  peers+=("$1")
  shift
done
if [ $# -gt 0 ]; then shift; fi
if [ $# -eq 0 ]; then
  echo "usage: peers_ssh.sh NAME TARGET PORT [NAME TARGET PORT ...] -- SSH [OPTION ...]" >&2
  exit 2
fi
for ((i = 0; i + 2 < ${#peers[@]}; i += 3)); do
  name=${peers[i]} target=${peers[i + 1]} port=${peers[i + 2]}
  (
    status=0
    "$@" -p "$port" "$target" true </dev/null >/dev/null 2>&1 || status=$?
    echo "$name $target $status"
  ) &
done
wait
