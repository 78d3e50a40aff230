"""What ``scripts/host_state.sh`` reports, parsed: the GPU's clocks and the reasons that hold them
down (``nvidia-smi -q``), the memlock limit, swap and the rails' firmware (``ethtool -i``). Kept
apart from the checks (:mod:`.host`) so that :mod:`.collect` can parse without importing them."""

from __future__ import annotations

import re
from typing import TypedDict

from ..facts.health import GpuClocks, parse_nvidia_smi_q
from ..facts.parsers import parse_key_values, parse_meminfo


class HostState(TypedDict):
    gpus: list[GpuClocks] | None  # None: nvidia-smi unavailable
    memlock: dict[str, str] | None  # {"soft": ..., "hard": ...}: KiB or "unlimited"
    swap_kb: dict[str, int] | None  # {"total": ..., "free": ...} from /proc/meminfo
    firmware: dict[str, str]  # rail interface -> its firmware version (ethtool -i)
    # rail interface -> the NetworkManager profile that sets it ("" where NetworkManager does not
    # manage it) and the profile's IPv4 method ("auto" is DHCP); None: nmcli unavailable
    nm: dict[str, dict[str, str]] | None
    # rail interface -> the files naming it (netplan, networkd, ifupdown; "?FILE" one not readable)
    persist: dict[str, list[str]]


def parse_host_state(sections: dict[str, str]) -> HostState | None:
    """The host state from a node's parsed sections; None where host_state.sh did not run."""
    if "memlock" not in sections:
        return None
    smi = sections.get("smi-q", "")
    limits = sections["memlock"].split()
    meminfo = parse_meminfo(sections.get("swap", ""))  # bytes
    firmware, nm, persist = {}, {}, {}
    for key, text in sections.items():
        if key.startswith("ethtool-i ") and (m := re.search(r"^firmware-version:\s*(\S+)", text, re.M)):
            firmware[key.split(maxsplit=1)[1]] = m[1]
        elif key.startswith("nm ") and not text.strip().endswith("unavailable"):
            values = parse_key_values(text)
            nm[key.split(maxsplit=1)[1]] = {"connection": values.get("connection", ""),
                                            "method": values.get("method", "")}
        elif key.startswith("persist "):
            persist[key.split(maxsplit=1)[1]] = parse_key_values(text).get("files", "").split()
    return {
        "gpus": None if not smi.strip() or smi.strip().endswith("unavailable") else parse_nvidia_smi_q(smi),
        "memlock": {"soft": limits[0], "hard": limits[1]} if len(limits) == 2 else None,
        "swap_kb": {"total": meminfo["SwapTotal"] // 1024, "free": meminfo["SwapFree"] // 1024}
        if {"SwapTotal", "SwapFree"} <= meminfo.keys() else None,
        "firmware": firmware,
        "nm": nm or None,
        "persist": persist,
    }
