#!/usr/bin/env bash
# What a node shows of its health, for sparkbook's 02 (around each cable's measurement) and 06/07
# (sampled while the model serves), each in a section "@@ NAME": each rail's link state ("oper IF":
# its operstate, as `ip -o link` says it: up, down, absent), its counters ("stats IF", `ethtool -S`) and FEC block counts
# ("fec IF", `ethtool -I --show-fec`); with --gpu the GPU's clocks and the reasons that hold them
# down ("smi-q", `nvidia-smi -q -d PERFORMANCE,CLOCK`); with --xid the GPU's Xid lines in the kernel
# log ("xid": dmesg, else `journalctl -k`, which a member of adm or systemd-journal may read where
# kernel.dmesg_restrict keeps dmesg to root). A missing tool says "TOOL unavailable" in its section.
# Usage: link_health.sh [--gpu] [--xid] [RAIL_INTERFACE ...]
set -euo pipefail
export LC_ALL=C
gpu="" xid=""
while [ $# -gt 0 ]; do
  case $1 in
    --gpu) gpu=1 ;;
    --xid) xid=1 ;;
    *) break ;;
  esac
  shift
done
for interface in "$@"; do
  echo "@@ oper $interface"
  # "state UP" of `ip -o link` (iproute2), the kernel's operstate of the netdev
  state=$(ip -o link show dev "$interface" 2>/dev/null | grep -o 'state [A-Z]*' || true)
  echo "${state#state }" | tr '[:upper:]' '[:lower:]' | grep . || echo absent
  echo "@@ stats $interface"
  ethtool -S "$interface" 2>/dev/null || echo "ethtool unavailable"
  echo "@@ fec $interface"
  ethtool -I --show-fec "$interface" 2>/dev/null || echo "ethtool unavailable"
done
if [ -n "$gpu" ]; then
  echo "@@ smi-q"
  nvidia-smi -q -d PERFORMANCE,CLOCK 2>/dev/null || echo "nvidia-smi unavailable"
fi
if [ -n "$xid" ]; then
  echo "@@ xid"
  if log=$(dmesg 2>/dev/null); then
    grep -F 'NVRM: Xid' <<<"$log" || true
  elif log=$(journalctl -k -q --no-pager 2>/dev/null); then
    grep -F 'NVRM: Xid' <<<"$log" || true
  else
    echo "kernel log unavailable"
  fi
fi
