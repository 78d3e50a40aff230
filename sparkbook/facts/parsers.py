"""Parsers of the outputs of node tools, tested on real outputs captured on DGX Spark
(../shared/field-samples, each naming its public source)."""

from __future__ import annotations

import re
from typing import TypedDict

NOT_AVAILABLE = ("[N/A]", "N/A", "[Not Supported]", "Not Supported", "")


def _value(v: str) -> str | None:
    v = v.strip()
    return None if v in NOT_AVAILABLE else v


# One row of ``nvidia-smi --query-gpu`` CSV: the queried fields (as the header names them) -> value.
CsvRow = dict[str, str | None]


def parse_nvidia_smi_csv(text: str, fields: list[str] | None = None) -> list[CsvRow]:
    """Rows of ``nvidia-smi --query-gpu=... --format=csv[,noheader]``.

    With a header line the keys come from it (``memory.total [MiB]`` becomes ``memory.total``);
    without one, ``fields`` names the columns. Repeated headers (several nodes' outputs
    concatenated, as with srun) are skipped. GB10 answers ``[N/A]`` for memory: such values are None.
    """
    keys = fields
    rows = []
    for line in text.splitlines():
        if not line.strip():
            continue
        cols = [c.strip() for c in line.split(",")]
        if cols[0] == "name" or (fields and cols == fields) or cols[0].startswith(("index", "name ")):
            keys = [re.sub(r"\s*\[.*\]$", "", c) for c in cols]
            continue
        if keys is None:
            raise ValueError("nvidia-smi CSV without a header: pass the queried fields")
        if len(cols) != len(keys):
            raise ValueError(f"nvidia-smi CSV row has {len(cols)} columns, expected {len(keys)}: {line!r}")
        rows.append({k: _value(v) for k, v in zip(keys, cols)})
    return rows


def parse_sections(text: str, marker: str = "@@ ") -> dict[str, str]:
    """Split a script's output into named sections: lines ``@@ name`` start each section.

    Lines end at "\n" only (a "\r" before it dropped), not at every break ``str.splitlines``
    knows: a section's text (a log line holding "x\r@@ name", or "\x85", "\u2028") cannot start
    a section of its own."""
    sections: dict[str, list[str]] = {}
    current = None
    for line in text.split("\n"):
        line = line.removesuffix("\r")
        if line.startswith(marker):
            current = line[len(marker):].strip()
            sections[current] = []
        elif current is not None:
            sections[current].append(line)
    return {k: "\n".join(v).strip("\n") for k, v in sections.items()}


def parse_meminfo(text: str) -> dict[str, int]:
    """Lines of ``/proc/meminfo`` (``MemAvailable:  121475891 kB``): key -> bytes (a count such as
    ``HugePages_Total`` stays a count); other lines are skipped."""
    out = {}
    for line in text.splitlines():
        key, sep, rest = line.partition(":")
        words = rest.split()
        if sep and words and words[0].isdigit():
            out[key.strip()] = int(words[0]) * (1024 if words[1:] == ["kB"] else 1)
    return out


def parse_key_values(text: str) -> dict[str, str]:
    """``key=value`` lines (values may hold '=')."""
    out = {}
    for line in text.splitlines():
        if "=" in line:
            k, v = line.split("=", 1)
            out[k.strip()] = v.strip()
    return out


# ---------------------------------------------------------------------------------------------
# nvidia-smi, plain table. Real GB10 tables: ../shared/field-samples/nvidia-smi-{1..6}.txt.

class SmiGpu(TypedDict):
    index: int
    name: str
    bus_id: str
    memory: str | None  # usage as printed ("0MiB / 143771MiB"); None on GB10 (not supported)
    util_percent: int | None


class SmiProcess(TypedDict):
    gpu: int
    pid: int
    type: str  # C (compute), G (graphics), C+G
    name: str
    memory_mib: int


class SmiTable(TypedDict):
    driver: str | None
    cuda: str | None
    gpus: list[SmiGpu]
    processes: list[SmiProcess]


_SMI_HEADER = re.compile(r"NVIDIA-SMI\s+(\S+)\s+Driver Version:\s+(\S+)\s+CUDA Version:\s+(\S+)")
_SMI_GPU = re.compile(r"^\|\s+(\d+)\s+(.+?)\s+(On|Off)\s+\|\s+(\S+)\s+(On|Off)\s+\|")
_SMI_MEM = re.compile(r"^\|\s+\S+\s+\S+\s+\S+\s+.*?\|\s+(.+?)\s+\|\s+(\d+)%")
_SMI_PROC = re.compile(r"^\|\s+(\d+)\s+(\S+)\s+(\S+)\s+(\d+)\s+(\S+)\s+(.+?)\s+(\d+)MiB\s+\|$")


def parse_nvidia_smi_table(text: str) -> SmiTable:
    """Driver and CUDA versions, GPUs (index, name, bus id, memory usage as printed, utilisation)
    and processes (gpu, pid, type, name, MiB) of the plain ``nvidia-smi`` table."""
    out: SmiTable = {"driver": None, "cuda": None, "gpus": [], "processes": []}
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if m := _SMI_HEADER.search(line):
            out["driver"], out["cuda"] = m[2], m[3]
        elif m := _SMI_GPU.match(line):
            gpu: SmiGpu = {"index": int(m[1]), "name": m[2], "bus_id": m[4], "memory": None,
                           "util_percent": None}
            if i + 1 < len(lines) and (mm := _SMI_MEM.match(lines[i + 1])):
                gpu["memory"] = _value(mm[1])
                gpu["util_percent"] = int(mm[2])
            out["gpus"].append(gpu)
        elif m := _SMI_PROC.match(line):
            out["processes"].append({"gpu": int(m[1]), "pid": int(m[4]), "type": m[5],
                                     "name": m[6], "memory_mib": int(m[7])})
    return out


# ---------------------------------------------------------------------------------------------
# ibdev2netdev (Mellanox OFED / DOCA). Real Spark outputs: field-samples/ibdev2netdev-*.txt.

_IBDEV = re.compile(r"^(\S+)\s+port\s+(\d+)\s+==>\s+(\S+)\s+\((\w+)\)")


class RailMap(TypedDict):
    """An HCA's port and the netdev it drives (one ibdev2netdev line)."""
    port: int
    netdev: str
    up: bool


def parse_ibdev2netdev(text: str) -> dict[str, RailMap]:
    """``{hca: {"port": 1, "netdev": "enp1s0f1np1", "up": True}}``."""
    out: dict[str, RailMap] = {}
    for line in text.splitlines():
        if m := _IBDEV.match(line.strip()):
            out[m[1]] = {"port": int(m[2]), "netdev": m[3], "up": m[4].lower() == "up"}
    return out


# ---------------------------------------------------------------------------------------------
# HCAs and their ports, as ibv_devinfo and ibstat print them: the fields named here are those
# sparkbook reads; every other field the tool prints is kept too, under its own name.

class IbPort(TypedDict, total=False):
    state: str  # ibv_devinfo: PORT_ACTIVE, PORT_DOWN; ibstat: Active, Down
    phys_state: str  # ibv_devinfo, where it prints one (first word only)
    physical_state: str  # ibstat: LinkUp, Disabled
    rate: int | None  # ibstat, Gb/s
    active_mtu: int  # ibv_devinfo
    max_mtu: int  # ibv_devinfo
    link_layer: str


class IbDevice(TypedDict, total=False):
    ports: dict[int, IbPort]
    fw_ver: str  # ibv_devinfo
    firmware: str  # ibstat
    ca_type: str  # ibstat


# ---------------------------------------------------------------------------------------------
# ibv_devinfo (rdma-core). Real Spark output: field-samples/ibv_devinfo-1.txt.

def parse_ibv_devinfo(text: str) -> dict[str, IbDevice]:
    """``{hca: {"fw_ver": ..., "ports": {1: {"state": "PORT_ACTIVE", "active_mtu": 4096,
    "link_layer": "Ethernet", ...}}}}``."""
    out: dict[str, IbDevice] = {}
    dev = port = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or ":" not in line:
            continue
        key, value = (s.strip() for s in line.split(":", 1))
        if key == "hca_id":
            dev = out.setdefault(value, {"ports": {}})
            port = None
        elif dev is None:
            continue
        elif key == "port":
            port = dev["ports"].setdefault(int(value), {})
        elif port is not None:
            if key in ("state", "phys_state"):
                port[key] = value.split()[0]
            elif key in ("max_mtu", "active_mtu"):
                port[key] = int(value.split()[0])
            else:
                port[key] = value
        else:
            dev[key] = value
    return out


# ---------------------------------------------------------------------------------------------
# ibstat (infiniband-diags).

_IBSTAT_CA = re.compile(r"^CA '([^']+)'")
_IBSTAT_PORT = re.compile(r"^Port (\d+):")


def parse_ibstat(text: str) -> dict[str, IbDevice]:
    """``{hca: {"ca_type": ..., "firmware": ..., "ports": {1: {"state": "Active",
    "physical_state": "LinkUp", "rate": 200, "link_layer": "Ethernet"}}}}``."""
    out: dict[str, IbDevice] = {}
    ca = port = None
    for raw in text.splitlines():
        line = raw.strip()
        if m := _IBSTAT_CA.match(line):
            ca, port = out.setdefault(m[1], {"ports": {}}), None
        elif ca is None:
            continue
        elif m := _IBSTAT_PORT.match(line):
            port = ca["ports"].setdefault(int(m[1]), {})
        elif ":" in line:
            key, value = (s.strip() for s in line.split(":", 1))
            key = key.lower().replace(" ", "_")
            target = port if port is not None else ca
            if key == "rate":
                target[key] = int(value) if value.isdigit() else None
            elif key == "firmware_version":
                ca["firmware"] = value
            else:
                target[key] = value
    return out


# ---------------------------------------------------------------------------------------------
# ethtool. Real Spark outputs ('ethtool IF | grep Speed' with the prompt naming the interface):
# field-samples/ethtool-speed-grep-*.txt. Full 'ethtool IF' output starts with 'Settings for IF:'.

_ETHTOOL_IF = re.compile(r"(?:Settings for (\S+):|\bethtool\s+(\S+))")
_ETHTOOL_SPEED = re.compile(r"^\s*Speed:\s*(?:(\d+)Mb/s|(Unknown!?))")
_ETHTOOL_LINK = re.compile(r"^\s*Link detected:\s*(yes|no)")


class LinkSpeed(TypedDict):
    speed_mbps: int | None  # None: unknown (the link is down)
    link: bool | None  # "Link detected"; None where not printed


def parse_ethtool(text: str) -> dict[str | None, LinkSpeed]:
    """``{interface: {"speed_mbps": 200000 or None, "link": True/False/None}}``; the interface is
    taken from 'Settings for IF:' or from a shell prompt running 'ethtool IF', else None."""
    out: dict[str | None, LinkSpeed] = {}
    current: str | None = None
    for line in text.splitlines():
        if m := _ETHTOOL_IF.search(line):
            current = (m[1] or m[2]).rstrip(":")
            out.setdefault(current, {"speed_mbps": None, "link": None})
        elif m := _ETHTOOL_SPEED.match(line):
            out.setdefault(current, {"speed_mbps": None, "link": None})["speed_mbps"] = (
                int(m[1]) if m[1] else None)
        elif m := _ETHTOOL_LINK.match(line):
            out.setdefault(current, {"speed_mbps": None, "link": None})["link"] = m[1] == "yes"
    return out


# ---------------------------------------------------------------------------------------------
# ethtool --show-fec. Real DGX Spark outputs, RS before and None after re-cabling:
# tests/fixtures/ethtool-show-fec-spark-*.txt. The format is ethtool's netlink/fec.c
# ("Supported/Configured FEC encodings"; the older ioctl path prints "Configured FEC encodings").

_FEC_IF = re.compile(r"^FEC parameters for (\S+?):?$")
_FEC_CONFIGURED = re.compile(r"^(?:Supported/)?(?:Configured )?FEC encodings:\s*(.*)$")
_FEC_ACTIVE = re.compile(r"^Active FEC encoding:\s*(.*)$")
# No FEC on the link: "None" (no active mode reported) or "Off" (FEC disabled).
NO_FEC = ("None", "Off")


class Fec(TypedDict):
    configured: list[str]  # Auto, RS, BaseR, LLRS, Off, None
    active: str | None  # RS, BaseR, LLRS, Off, None; None where ethtool printed no such line
    error: str | None  # what ethtool said instead (a driver that reports no FEC: veth, lo)


def parse_ethtool_fec(text: str) -> dict[str | None, Fec]:
    """``{interface: {"configured": ["Auto"], "active": "RS", "error": None}}``; the interface is
    taken from 'FEC parameters for IF:', else None."""
    out: dict[str | None, Fec] = {}
    current: str | None = None
    for raw in text.splitlines():
        line = raw.strip()
        if m := _FEC_IF.match(line):
            current = m[1]
        elif not line:
            continue
        fec = out.setdefault(current, {"configured": [], "active": None, "error": None})
        if m := _FEC_ACTIVE.match(line):
            fec["active"] = (m[1].split() or [None])[0]
        elif m := _FEC_CONFIGURED.match(line):
            fec["configured"] = m[1].split()
        elif "error" in line.lower() or line.startswith("Cannot "):
            fec["error"] = line
    return out


def parse_fec_sections(sections: dict[str, str]) -> dict[str, Fec] | None:
    """The sections "fec IF" of hardware.sh, by interface; None where ethtool is unavailable."""
    out: dict[str, Fec] = {}
    for key, text in sections.items():
        if key.startswith("fec "):
            if text.strip() == "ethtool unavailable":
                return None
            out.update({k or key.split()[1]: v for k, v in parse_ethtool_fec(text).items()})
    return out


# ---------------------------------------------------------------------------------------------
# show_gids (mlnx-tools, beside ibdev2netdev on DGX OS): one row per populated GID, tab-separated
# "DEV PORT INDEX GID [IPv4] VER NDEV" (Mellanox/mlnx-tools sbin/show_gids). hardware.sh prints
# the same rows from sysfs where show_gids is absent. A real output, with its source:
# tests/fixtures/show_gids-mlx5-1.txt (tests/test_fabric_field.py).

class Gid(TypedDict):
    port: int
    index: int
    gid: str
    ipv4: str | None  # the address of an IPv4-mapped GID (::ffff:a.b.c.d)
    version: str | None  # RoCE v1 or v2: "v1", "v2"
    netdev: str | None


def parse_show_gids(text: str) -> dict[str, list[Gid]]:
    """``{hca: [{"port": 1, "index": 3, "gid": "0000:...:ffff:0a4d:010b", "ipv4": "10.77.1.11",
    "version": "v2", "netdev": "enp1s0f1np1"}, ...]}``, in the tool's order."""
    import ipaddress
    out: dict[str, list[Gid]] = {}
    for line in text.splitlines():
        cols = line.split()
        if len(cols) < 4 or not (cols[1].isdigit() and cols[2].isdigit()):
            continue  # the header, its underline, n_gids_found=N
        try:
            mapped = ipaddress.IPv6Address(cols[3]).ipv4_mapped
        except ValueError:
            continue
        rest = cols[4:]
        ver = next((i for i, c in enumerate(rest) if re.fullmatch(r"[vV]\d", c)), None)
        out.setdefault(cols[0], []).append({
            "port": int(cols[1]), "index": int(cols[2]), "gid": cols[3].lower(),
            "ipv4": str(mapped) if mapped else None,
            "version": rest[ver].lower() if ver is not None else None,
            "netdev": rest[ver + 1] if ver is not None and ver + 1 < len(rest) else None})
    return out


# ---------------------------------------------------------------------------------------------
# NCCL_DEBUG=INFO logs. Real logs with their sources: tests/fixtures/nccl-*.txt.

_NCCL_NET = re.compile(r"NCCL INFO Using network (\S+)")
_NCCL_IB_USING = re.compile(r"NCCL INFO NET/IB ?: Using (.+?)(?:;|$)")
_NCCL_IB_DEV = re.compile(r"\[\d+\]([^:\s]+):\d+/(RoCE|IB)")
_NCCL_VDEV = re.compile(r"NET/IB ?: Made virtual device \[\d+\] name=(\S+)")
_NCCL_SOCKET = re.compile(r"NCCL INFO NET/Socket ?: Using (.+)$")
_NCCL_CHANNEL = re.compile(r"via (NET/[A-Za-z_0-9]+|P2P/[A-Za-z]+|SHM)")
_NCCL_VERSION = re.compile(r"NCCL version (\S+)")


class NcclLog(TypedDict):
    version: str | None
    network: str | None  # IB, Socket, IBext_v10, ...
    hcas: list[str]
    socket_ifs: list[str]
    channels: dict[str, int]  # transport (NET/IB, P2P/CUMEM, SHM, ...) -> channels using it
    no_ib_device: bool


def parse_nccl_log(text: str) -> NcclLog:
    """What NCCL chose: ``{"version", "network" (IB, Socket, IBext_v10, ...), "hcas", "socket_ifs",
    "channels": {transport: count}, "no_ib_device": bool}``."""
    out: NcclLog = {"version": None, "network": None, "hcas": [], "socket_ifs": [], "channels": {},
                    "no_ib_device": False}
    for line in text.splitlines():
        if m := _NCCL_VERSION.search(line):
            out["version"] = m[1]
        if m := _NCCL_NET.search(line):
            out["network"] = m[1]
        if m := _NCCL_IB_USING.search(line):
            out["hcas"] += [d for d, _ in _NCCL_IB_DEV.findall(m[1]) if d not in out["hcas"]]
        if m := _NCCL_VDEV.search(line):
            if m[1] not in out["hcas"]:
                out["hcas"].append(m[1])
        if m := _NCCL_SOCKET.search(line):
            out["socket_ifs"] += [s.split(":")[0].split("]")[-1] for s in m[1].split()]
        if "NET/IB : No device found" in line or "Failed to open libibverbs" in line:
            out["no_ib_device"] = True
        if "NCCL INFO" in line and (m := _NCCL_CHANNEL.search(line)):
            kind = m[1]
            out["channels"][kind] = out["channels"].get(kind, 0) + 1
    if out["network"] is None and out["channels"]:
        nets = [k for k in out["channels"] if k.startswith("NET/")]
        if nets:
            out["network"] = nets[0].split("/", 1)[1]
    return out


def nccl_transport(parsed: NcclLog) -> str:
    """'rdma' (NET/IB or an IB plugin), 'socket', 'intra-node' (P2P/SHM only), or 'unknown'.

    The channels decide: NCCL prints 'Using network Socket' when it finds no HCA even if every
    peer is on the same host and no byte goes over the network (tests/fixtures/nccl-p2p-*)."""
    chans = parsed.get("channels", {})
    nets = [k for k in chans if k.startswith("NET/")]
    if any(k.lower().startswith("net/ib") for k in nets):
        return "rdma"
    if any(k == "NET/Socket" for k in nets):
        return "socket"
    if chans:
        return "intra-node"
    net = (parsed.get("network") or "").lower()
    return "rdma" if net.startswith("ib") else "socket" if net == "socket" else "unknown"


class XmlGpu(TypedDict):
    name: str | None
    bus_id: str | None
    memory_total_mib: int | None


class SmiXml(TypedDict):
    driver: str | None
    cuda: str | None
    gpus: list[XmlGpu]


def parse_nvidia_smi_xml(text: str) -> SmiXml:
    """``nvidia-smi -q -x``: driver and CUDA versions, and per GPU its name, bus id and total
    framebuffer memory in MiB (None where the GPU reports none, as GB10 does)."""
    import xml.etree.ElementTree as ET
    root = ET.fromstring(text)
    gpus: list[XmlGpu] = []
    for g in root.findall("gpu"):
        total = (g.findtext("fb_memory_usage/total") or "").split()
        gpus.append({"name": g.findtext("product_name"), "bus_id": g.get("id"),
                     "memory_total_mib": int(total[0]) if total and total[0].isdigit() else None})
    return {"driver": root.findtext("driver_version"), "cuda": root.findtext("cuda_version"), "gpus": gpus}


def listener(ss_lines: list[str], port: int) -> str | None:
    """In ``ss -ltnp`` lines: the local address and process listening on ``port``, if any."""
    for ln in ss_lines:
        cols = ln.split()
        if len(cols) >= 4 and cols[3].rsplit(":", 1)[-1] == str(port):
            proc = next((c for c in cols[4:] if c.startswith("users:")), "")
            return f"{cols[3]} {proc}".strip()
    return None


def ipv4(link: dict | None, scope: str | None = None) -> list[str]:
    """The IPv4 addresses of an interface as ``ip -j addr show`` lists it, as ``ADDRESS/PREFIX``;
    only those of ``scope`` (e.g. "global") when given."""
    return [f"{a['local']}/{a['prefixlen']}" for a in (link or {}).get("addr_info", [])
            if a.get("family") == "inet" and scope in (None, a.get("scope"))]
