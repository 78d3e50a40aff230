#!/usr/bin/env bash
# Path MTU towards the peers, for sparkbook's preflight (01): one don't-fragment ping of SIZE
# bytes out of each INTERFACE to its ADDRESS, all at once; prints "INTERFACE ADDRESS STATUS" per
# pair, STATUS being ping's exit status (0: answered).
# Usage: path_mtu.sh SIZE [INTERFACE ADDRESS ...]
#   SIZE  the MTU less 28 (the IPv4 and ICMP headers): 8972 for MTU 9000
set -euo pipefail
size=${1:?usage: path_mtu.sh SIZE [INTERFACE ADDRESS ...]}
shift
while [ $# -ge 2 ]; do
  interface=$1 address=$2
  shift 2
  # until the first reply, up to 3 s: one lost packet (a first ARP on a busy node) is no verdict
  (
    status=0
    ping -c 1 -i 0.2 -w 3 -M "do" -s "$size" -I "$interface" "$address" >/dev/null 2>&1 || status=$?
    echo "$interface $address $status"
  ) &
done
wait
