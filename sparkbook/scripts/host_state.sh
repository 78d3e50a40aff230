#!/usr/bin/env bash
# The host's own state, for sparkbook's preflight (01), each fact in a section "@@ NAME": the GPU's
# clocks and the reasons that hold them down (smi-q, `nvidia-smi -q`), the memlock limit of this
# SSH user's sessions (memlock: "SOFT HARD", in KiB or "unlimited"), swap (swap, from
# /proc/meminfo) and the driver and firmware of each rail interface ("ethtool-i IF", `ethtool -i`).
# A missing tool says "TOOL unavailable" in its section.
# Usage: host_state.sh [RAIL_INTERFACE ...]
set -euo pipefail
export LC_ALL=C

echo "@@ smi-q"
nvidia-smi -q 2>/dev/null || echo "nvidia-smi unavailable"
echo "@@ memlock"
echo "$(ulimit -S -l) $(ulimit -H -l)"
echo "@@ swap"
grep -E '^(SwapTotal|SwapFree):' /proc/meminfo || true
for interface in "$@"; do
  echo "@@ ethtool-i $interface"
  ethtool -i "$interface" 2>/dev/null || echo "ethtool unavailable"
done
