#!/usr/bin/env bash
# The host's own state, for sparkbook's preflight (01), each fact in a section "@@ NAME": the GPU's
# clocks and the reasons that hold them down (smi-q, `nvidia-smi -q`), the memlock limit of this
# SSH user's sessions (memlock: "SOFT HARD", in KiB or "unlimited"), swap (swap, from
# /proc/meminfo), the driver and firmware of each rail interface ("ethtool-i IF", `ethtool -i`) and
# the NetworkManager profile that sets each rail and its IPv4 method ("nm IF": connection=NAME and
# method=auto|manual|...; connection= is empty where NetworkManager does not manage the rail), and
# the files that persist each rail's configuration ("persist IF": files=the netplan, networkd and
# ifupdown files naming it as a word; ?FILE one this user cannot read).
# A missing tool says "TOOL unavailable" in its section.
# Usage: host_state.sh [RAIL_INTERFACE ...]
set -euo pipefail
export LC_ALL=C

naming() {  # the files among "$@" that name $interface as a word; ?FILE: not readable
  local file
  for file in "$@"; do
    [ -f "$file" ] || continue
    if [ ! -r "$file" ]; then
      printf '?%s ' "$file"  # netplan files are often root's alone (mode 600)
    elif grep -qw -- "$interface" "$file" 2>/dev/null; then
      printf '%s ' "$file"
    fi
  done
  return 0
}

echo "@@ smi-q"
nvidia-smi -q 2>/dev/null || echo "nvidia-smi unavailable"
echo "@@ memlock"
echo "$(ulimit -S -l) $(ulimit -H -l)"
echo "@@ swap"
grep -E '^(SwapTotal|SwapFree):' /proc/meminfo || true
for interface in "$@"; do
  echo "@@ ethtool-i $interface"
  ethtool -i "$interface" 2>/dev/null || echo "ethtool unavailable"
  echo "@@ nm $interface"
  if command -v nmcli >/dev/null; then
    # nmcli(1): -g prints the field's value alone (--escape no: a ':' in a name stays as it is);
    # `id NAME` keeps a name from reading as an option
    connection=$(nmcli --escape no -g GENERAL.CONNECTION device show "$interface" 2>/dev/null || true)
    echo "connection=$connection"
    [ -z "$connection" ] || echo "method=$(nmcli --escape no -g ipv4.method connection show id "$connection" 2>/dev/null || true)"
  else
    echo "nmcli unavailable"
  fi
  echo "@@ persist $interface"
  echo "files=$(naming /etc/netplan/*.yaml /lib/netplan/*.yaml /run/netplan/*.yaml /etc/systemd/network/*.network \
    /etc/network/interfaces /etc/network/interfaces.d/*)"
done
