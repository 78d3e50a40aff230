"""What a node shows of its health, parsed: its GPU's clocks and the reasons that hold them down
(``nvidia-smi -q``), its rails' error counters (mlx5's ``ethtool -S``) and FEC block counts
(``ethtool -I --show-fec``), and the GPU's Xid events in the kernel log. Read by 01 (the clocks), 02
(the counters around each cable's measurement) and 06/07 (all of them sampled while the model
serves: :mod:`sparkbook.serving.health`).
"""

from __future__ import annotations

import re
from typing import TypedDict

from ..book.verdict import FAIL, WARN
from .parsers import parse_ethtool_fec, parse_sections

class GpuClocks(TypedDict):
    """One GPU of ``nvidia-smi -q``: what GB10 reports as N/A is left out."""
    bus_id: str
    pstate: str | None  # Performance State: P0 .. P12
    reasons: dict[str, bool]  # "Clocks Event Reasons" (formerly "Clocks Throttle Reasons") -> Active
    clocks: dict[str, int]  # "Clocks": Graphics, SM, Memory, Video -> MHz
    max_clocks: dict[str, int]  # "Max Clocks": the same, MHz


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



# Clock event reasons that hold a GPU's clocks down, with the verdict and the remedy. Every other
# reason (Idle, Applications Clocks Setting, Sync Boost, Display Clock Setting) is normal.
POWER_CYCLE = ("power-cycle the Spark fully: shut it down, unplug the power brick from the wall "
               "and from the Spark for 60 s, reconnect (a bad USB-C power negotiation holds the GB10 "
               "at 500-850 MHz); check the brick and its cable; if it persists, RMA")
SLOWDOWNS = {
    "HW Power Brake Slowdown": (FAIL, "the power supply brakes the GPU: " + POWER_CYCLE),
    "HW Thermal Slowdown": (FAIL, "the GPU is too hot: clear the vents, give the Spark room to "
                            "breathe, let it cool before launching"),
    "HW Slowdown": (FAIL, "hardware halves the clocks or worse (power delivery or heat): " + POWER_CYCLE
                    + "; clear the vents"),
    "SW Thermal Slowdown": (WARN, "the driver holds clocks down for heat: improve airflow; if it "
                            "recurs under load, cap the clocks (`sudo nvidia-smi -lgc 0,2400`)"),
    "SW Power Cap": (WARN, "the driver caps power before anything runs: stop what uses the GPU "
                     "(`nvidia-smi`); with nothing running, " + POWER_CYCLE),
}


# ---------------------------------------------------------------------------------- link counters
# mlx5's physical port counters that mean lost or damaged traffic on the wire, with what each
# says: the kernel's mlx5 counter documentation (Documentation/networking/device_drivers/ethernet/
# mellanox/mlx5/counters.rst, "Physical Port Counters"). Those FEC corrected (rx_corrected_bits_phy,
# the lanes' raw rx_err_lane_N_phy) are kept apart: a healthy PAM4 link corrects bits all the time,
# and only their rate tells a failing one; they are reported, not judged.
LINK_ERRORS = {
    "rx_pcs_symbol_err_phy": "symbol errors FEC could not correct (traffic lost: the cable or transceiver)",
    "rx_symbol_err_phy": "packets dropped for physical coding errors",
    "rx_crc_errors_phy": "packets dropped for a bad frame check sequence",
    "link_down_events_phy": "times the link went down (a flapping port)",
    "rx_pci_signal_integrity": "PCIe signal integrity errors on receive (each rail is its own PCIe x4 link on a Spark)",
    "tx_pci_signal_integrity": "PCIe signal integrity errors on transmit",
}
CORRECTED = ("rx_corrected_bits_phy",)  # and every rx_err_lane_N_phy
FEC_BLOCKS = {"uncorrectable_blocks": "FEC blocks that could not be corrected (traffic lost)"}
STAT = re.compile(r"^\s*([A-Za-z0-9_\[\]: .-]+?):\s+(-?\d+)\s*$")
FEC_STAT = re.compile(r"^\s*(corrected_blocks|uncorrectable_blocks|corrected_bits):\s*(\d+)\s*$")


def parse_ethtool_stats(text: str) -> dict[str, int]:
    """``ethtool -S IF``: ``{counter: value}`` (a driver's own names; "NIC statistics:" and any other
    line left out)."""
    return {m[1].strip(): int(m[2]) for line in text.splitlines() if (m := STAT.match(line))}


def parse_fec_stats(text: str) -> dict[str, int]:
    """The totals of ``ethtool -I --show-fec IF``'s "Statistics:" block (``corrected_blocks``,
    ``uncorrectable_blocks``; per-lane lines left out: mlx5 reports totals only in RS mode); empty
    where the driver reports none."""
    return {m[1]: int(m[2]) for line in text.splitlines() if (m := FEC_STAT.match(line))}


def link_errors(stats: dict[str, int], fec: dict[str, int] | None = None) -> dict[str, int]:
    """The counters of :data:`LINK_ERRORS` and :data:`FEC_BLOCKS` a sample holds."""
    out = {k: v for k, v in stats.items() if k in LINK_ERRORS}
    out.update({k: v for k, v in (fec or {}).items() if k in FEC_BLOCKS})
    return out


def corrected(stats: dict[str, int]) -> dict[str, int]:
    """The FEC-corrected counters a sample holds (reported, not judged)."""
    return {k: v for k, v in stats.items() if k in CORRECTED or re.fullmatch(r"rx_err_lane_\d+_phy", k)}


def grown(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    """The counters that rose from ``before`` to ``after``, by how much (one that fell was reset
    meanwhile: its new value is what it counted since)."""
    out = {}
    for name, value in after.items():
        was = before.get(name, 0)
        if (rise := value - was if value >= was else value) > 0:
            out[name] = rise
    return out


# -------------------------------------------------------------------------------------------- Xid
# The NVIDIA driver's Xid lines in the kernel log (NVIDIA's Xid documentation, docs.nvidia.com/deploy/
# xid-errors): "NVRM: Xid (PCI:DDDD:BB:DD): CODE, pid=PID, name=NAME, TEXT" on current drivers,
# "NVRM: Xid (PCI:...): CODE, TEXT" on older ones; real lines of a DGX Spark (its GPU at 000f:01:00)
# and others in tests/fixtures/xid-*.txt.
XID = re.compile(r"NVRM: Xid \(PCI:([0-9A-Fa-f:.]+)\): (\d+),\s*(.*)$")
# What the codes seen most often mean, from NVIDIA's Xid documentation: (meaning, status in a run).
XID_CODES = {
    13: ("graphics engine exception: a fault in the running program or the driver", WARN),
    31: ("GPU memory page fault: a fault in the running program or the driver", WARN),
    43: ("a GPU channel was reset after a fault of its program", WARN),
    45: ("a channel ended by the driver (a process killed or a reset)", WARN),
    48: ("double-bit ECC error: the GPU needs a reset", FAIL),
    63: ("ECC page retirement or row remapping", WARN),
    64: ("ECC page retirement or row remapping failed: the GPU needs a reset", FAIL),
    74: ("NVLink error", FAIL),
    79: ("the GPU has fallen off the bus: power it down and back (a reboot may not recover it)", FAIL),
    94: ("contained ECC error", WARN),
    95: ("uncontained ECC error: the GPU needs a reset", FAIL),
    119: ("GSP firmware did not answer in time", FAIL),
    120: ("GSP firmware error", FAIL),
    154: ("the driver asks for a GPU reset or a reboot", FAIL),
}


class Xid(TypedDict):
    pci: str
    code: int
    text: str
    line: str


def parse_xid(text: str) -> list[Xid]:
    """Every Xid line of a kernel log (dmesg or journalctl -k), in order."""
    return [{"pci": m[1], "code": int(m[2]), "text": m[3].strip(), "line": line.strip()}
            for line in text.splitlines() if (m := XID.search(line))]


def xid_meaning(code: int) -> tuple[str, str]:
    """What an Xid code means and how a run takes it (FAIL where the GPU needs a reset)."""
    return XID_CODES.get(code, ("see NVIDIA's Xid documentation (docs.nvidia.com/deploy/xid-errors)", FAIL))


# ------------------------------------------------------------------------------ link_health.sh
class LinkHealth(TypedDict):
    rails: dict[str, dict]  # interface -> {"oper", "stats", "fec", "fec_mode"} (those it printed)
    gpus: list[GpuClocks]
    xid: list[Xid]


def parse_link_health(text: str) -> LinkHealth:
    """What ``scripts/link_health.sh`` printed, section by section: each rail's operstate, error
    counters and FEC (its blocks and its active mode), the GPUs' clocks (``--gpu``) and the Xid
    lines of the kernel log (``--xid``)."""
    out: LinkHealth = {"rails": {}, "gpus": [], "xid": []}
    for key, body in parse_sections(text).items():
        kind, _, interface = key.partition(" ")
        if kind == "smi-q":
            out["gpus"] = parse_nvidia_smi_q(body)
        elif kind == "xid":
            out["xid"] = parse_xid(body)
        elif kind in ("oper", "stats", "fec"):
            rail = out["rails"].setdefault(interface, {})
            if kind == "oper":
                rail["oper"] = body.split()[0] if body.split() else "absent"
            elif kind == "stats":
                rail["stats"] = parse_ethtool_stats(body)
            else:
                rail["fec"] = parse_fec_stats(body)
                rail["fec_mode"] = next((v["active"] for v in parse_ethtool_fec(body).values() if v["active"]), None)
    return out
