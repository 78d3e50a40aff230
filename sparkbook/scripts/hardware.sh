#!/usr/bin/env bash
# The GPU and the RoCE fabric as this node's own tools see them, for sparkbook's preflight (01),
# each in a section "@@ NAME": the nvidia-smi table (smi), ibdev2netdev, the HCAs' ports (ibstat,
# else ibv_devinfo), ethtool of each rail interface ("ethtool IF") and every interface's
# addresses (links, `ip -j addr`). A missing tool says "TOOL unavailable" in its section.
# Usage: hardware.sh [RAIL_INTERFACE ...]
set -euo pipefail
export LC_ALL=C

echo "@@ smi"
nvidia-smi 2>/dev/null || echo "nvidia-smi unavailable"
echo "@@ ibdev2netdev"
ibdev2netdev 2>/dev/null || echo "ibdev2netdev unavailable"
# port states: ibstat (infiniband-diags), else ibv_devinfo (rdma-core)
if command -v ibstat >/dev/null; then
  echo "@@ ibstat"
  ibstat 2>/dev/null || true
else
  echo "@@ ibv_devinfo"
  ibv_devinfo 2>/dev/null || echo "ibv_devinfo unavailable"
fi
for interface in "$@"; do
  echo "@@ ethtool $interface"
  ethtool "$interface" 2>/dev/null || true
done
echo "@@ links"
ip -j addr show 2>/dev/null || echo "[]"
