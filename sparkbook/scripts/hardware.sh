#!/usr/bin/env bash
# The GPU and the RoCE fabric as this node's own tools see them, for sparkbook's preflight (01),
# each in a section "@@ NAME": the nvidia-smi table (smi), ibdev2netdev, the HCAs' ports (ibstat,
# else ibv_devinfo), ethtool of each rail interface ("ethtool IF") and its FEC mode ("fec IF",
# ethtool --show-fec), the HCAs' RoCE GID tables (gids: show_gids, else the same rows read from
# sysfs) and every interface's addresses (links, `ip -j addr`). A missing tool says
# "TOOL unavailable" in its section.
# Usage: hardware.sh [RAIL_INTERFACE ...]
set -euo pipefail
export LC_ALL=C
ib_sysfs=${SPARKBOOK_IB_SYSFS:-/sys/class/infiniband}  # tests point it at a tree of their own

# The GID tables as show_gids (mlnx-tools) prints them, read from sysfs: DEV PORT INDEX GID, an
# empty IPv4 column, VER (v1, v2: the last word of the type), NDEV.
gids_from_sysfs() {
  local port path gid index kind ndev dev
  printf 'DEV\tPORT\tINDEX\tGID\t\t\t\t\tIPv4  \t\tVER\tDEV\n'
  for port in "$ib_sysfs"/*/ports/*; do
    dev=${port%/ports/*}
    for path in "$port"/gids/*; do
      gid=$(cat "$path" 2>/dev/null) || continue  # unused entries read as an error on new kernels
      case $gid in
        0000:0000:0000:0000:0000:0000:0000:0000 | fe80:0000:0000:0000:0000:0000:0000:0000) continue ;;
      esac
      index=${path##*/}
      kind=$(cat "$port/gid_attrs/types/$index" 2>/dev/null) || kind=""
      ndev=$(cat "$port/gid_attrs/ndevs/$index" 2>/dev/null) || ndev=""
      printf '%s\t%s\t%s\t%s\t\t\t%s\t%s\n' "${dev##*/}" "${port##*/}" "$index" "$gid" "${kind##* }" "$ndev"
    done
  done
}

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
  echo "@@ fec $interface"
  if command -v ethtool >/dev/null; then
    ethtool --show-fec "$interface" 2>&1 || true  # a driver without FEC says so on stderr
  else
    echo "ethtool unavailable"
  fi
done
echo "@@ gids"
if command -v show_gids >/dev/null; then
  show_gids 2>/dev/null || true
elif [ -d "$ib_sysfs" ]; then
  gids_from_sysfs
else
  echo "show_gids unavailable"
fi
echo "@@ links"
ip -j addr show 2>/dev/null || echo "[]"
