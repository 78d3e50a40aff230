#!/usr/bin/env bash
# What `sparkbook discover` needs to know of a node before any parameters file exists, each in a
# section "@@ NAME":
#   identity    key=value lines: hostname, os, kernel, arch, bios, product, and mgmt (the address
#               this SSH session arrived at: the third word of $SSH_CONNECTION)
#   gpu         nvidia-smi --query-gpu=name,memory.total,driver_version (csv, no header)
#   meminfo     MemTotal
#   ibdev2netdev  the HCAs' netdevs and their port state; read from sysfs as ibdev2netdev prints
#               it where the tool is missing
#   port NETDEV key=value lines for each netdev of an HCA: firmware and pci (the PCIe function,
#               ethtool -i's bus-info), speed (Mb/s, ethtool), and who persists its addresses:
#               netplan (the files naming it; ?FILE one it cannot read), networkd (.network files naming it), ifupdown
#               (/etc/network/interfaces names it), nm (NetworkManager's profile on it) and
#               nm_method (that profile's ipv4.method; auto is DHCP)
#   links       ip -j addr show: each netdev's state, carrier (LOWER_UP), MTU and addresses, read
#               over netlink (sysfs shows another network namespace's interfaces where a node is one)
# A missing tool says "TOOL unavailable" in its section. Read-only: nothing on the node changes.
set -euo pipefail
export LC_ALL=C
ib_sysfs=${SPARKBOOK_IB_SYSFS:-/sys/class/infiniband}  # tests point it at a tree of their own

value() { cat "$1" 2>/dev/null || true; }
naming() {  # the files among "$@" that name the interface $iface as a word; ?FILE: not readable
  local file
  for file in "$@"; do
    [ -f "$file" ] || continue
    if [ ! -r "$file" ]; then
      printf '?%s ' "$file"  # netplan files are often root's alone (mode 600)
    elif grep -qw -- "$iface" "$file" 2>/dev/null; then
      printf '%s ' "$file"
    fi
  done
  return 0
}

echo "@@ identity"
echo "hostname=$(hostname 2>/dev/null || value /proc/sys/kernel/hostname)"
# shellcheck source=/dev/null  # the node's own file, read for PRETTY_NAME
echo "os=$( (. /etc/os-release 2>/dev/null && echo "${PRETTY_NAME:-}") || true)"
echo "kernel=$(uname -r)"
echo "arch=$(uname -m)"
echo "bios=$(value /sys/class/dmi/id/bios_version)"
echo "product=$(value /sys/class/dmi/id/product_name)"
read -r _ _ mgmt _ <<<"${SSH_CONNECTION:-}" || true
echo "mgmt=${mgmt:-}"

echo "@@ gpu"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null \
  || echo "nvidia-smi unavailable"
echo "@@ meminfo"
grep -E '^MemTotal:' /proc/meminfo || true

map=""
if command -v ibdev2netdev >/dev/null; then
  map=$(ibdev2netdev 2>/dev/null || true)
elif [ -d "$ib_sysfs" ]; then
  for hca in "$ib_sysfs"/*; do
    [ -d "$hca/device/net" ] || continue
    case $(value "$hca/ports/1/state") in *ACTIVE*) up=Up ;; *) up=Down ;; esac
    for net in "$hca"/device/net/*; do
      map+="${hca##*/} port 1 ==> ${net##*/} ($up)"$'\n'
    done
  done
fi
echo "@@ ibdev2netdev"
if [ -n "$map" ]; then printf '%s\n' "$map"; else echo "ibdev2netdev unavailable"; fi
# netdev names as the node printed them: only a name an interface can have goes on (never an option)
sed -n 's/.*==> \([^ ]*\) .*/\1/p' <<<"$map" | sort -u | grep -E '^[A-Za-z0-9_][A-Za-z0-9._-]*$' |
while IFS= read -r iface; do
  echo "@@ port $iface"
  info=$(ethtool -i "$iface" 2>/dev/null || true)
  echo "firmware=$(sed -n 's/^firmware-version: *//p' <<<"$info")"
  echo "pci=$(sed -n 's/^bus-info: *//p' <<<"$info")"
  echo "speed=$(ethtool "$iface" 2>/dev/null | sed -n 's/^[[:space:]]*Speed: *\([0-9][0-9]*\)Mb.*/\1/p' || true)"
  echo "netplan=$(naming /etc/netplan/*.yaml /lib/netplan/*.yaml /run/netplan/*.yaml)"
  echo "networkd=$(naming /etc/systemd/network/*.network /run/systemd/network/*.network)"
  echo "ifupdown=$(naming /etc/network/interfaces /etc/network/interfaces.d/*)"
  if command -v nmcli >/dev/null; then
    # nmcli(1): -g prints the field's value alone (--escape no: a ':' in a name stays as it is);
    # `id NAME` keeps a name from reading as an option
    nm=$(nmcli --escape no -g GENERAL.CONNECTION device show "$iface" 2>/dev/null || true)
    echo "nm=$nm"
    [ -z "$nm" ] || echo "nm_method=$(nmcli --escape no -g ipv4.method connection show id "$nm" 2>/dev/null || true)"
  fi
done

echo "@@ links"
ip -j addr show 2>/dev/null || echo "ip unavailable"
