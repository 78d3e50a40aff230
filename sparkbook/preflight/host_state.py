"""What ``scripts/host_state.sh`` reports, parsed: the GPU's clocks and the reasons that hold them
down (``nvidia-smi -q``), the memlock limit, swap and the rails' firmware (``ethtool -i``). Kept
apart from the checks (:mod:`.host`) so that :mod:`.collect` can parse without importing them."""

from __future__ import annotations

import re
from typing import TypedDict

from ..facts.parsers import parse_key_values, parse_meminfo


class GpuClocks(TypedDict):
    """One GPU of ``nvidia-smi -q``: what GB10 reports as N/A is left out."""
    bus_id: str
    pstate: str | None  # Performance State: P0 .. P12
    reasons: dict[str, bool]  # "Clocks Event Reasons" (formerly "Clocks Throttle Reasons") -> Active
    clocks: dict[str, int]  # "Clocks": Graphics, SM, Memory, Video -> MHz
    max_clocks: dict[str, int]  # "Max Clocks": the same, MHz


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


REASON_HEADERS = ("Clocks Event Reasons", "Clocks Throttle Reasons")  # driver >= 535 / before
GPU_LINE = re.compile(r"^GPU ([0-9A-Fa-f]{4,}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f])\s*$")
MHZ = re.compile(r"^(\d+) MHz$")


def parse_nvidia_smi_q(text: str) -> list[GpuClocks]:
    """The GPUs of ``nvidia-smi -q`` (any ``-d`` selection): a block per ``GPU <bus id>`` line, in
    which a line without a value opens a section its deeper lines belong to. Only the nearest
    section counts, so the "Clocks Event Reasons Counters" (the same names, in microseconds) and
    the application clocks are not mistaken for the reasons and the clocks."""
    gpus: list[GpuClocks] = []
    stack: list[tuple[int, str]] = []  # (indent, section) of the open sections
    for line in text.splitlines():
        body = line.strip()
        if not body:
            continue
        indent = len(line) - len(line.lstrip())
        if m := GPU_LINE.match(body):
            gpus.append({"bus_id": m[1], "pstate": None, "reasons": {}, "clocks": {}, "max_clocks": {}})
            stack = [(indent, "GPU")]
            continue
        while stack and stack[-1][0] >= indent:
            stack.pop()
        key, sep, value = body.partition(":")
        key, value = key.strip(), value.strip()
        if not sep or not value:
            stack.append((indent, key))
            continue
        if not gpus or not stack:
            continue  # the log's header: timestamp, driver, attached GPUs
        gpu, section = gpus[-1], stack[-1][1]
        if key == "Performance State":
            gpu["pstate"] = value
        elif section in REASON_HEADERS and value in ("Active", "Not Active"):
            gpu["reasons"][key] = value == "Active"
        elif section in ("Clocks", "Max Clocks") and (mhz := MHZ.match(value)):
            gpu["clocks" if section == "Clocks" else "max_clocks"][key] = int(mhz[1])
    return gpus


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
