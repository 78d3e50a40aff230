#!/usr/bin/python3 -IS
"""Simulated DGX Spark hardware tools for the lab: nvidia-smi, ibdev2netdev, ibstat, ibv_devinfo,
ethtool and show_gids, installed on each lab node's PATH under those names (links to this file). The
host's tools a fault changes (date, df, nmcli, dmesg) are simhost.py's; perftest is simperf.py's.

They print the formats that these tools print on a real DGX Spark (GB10 GPU, ConnectX-7 in RoCE
mode; real samples with their sources are in ../shared/field-samples), driven by the node's real
state: the netdevs' link state and MTU come from the node's network namespace (`ip -j link`), the
GPU's processes from the node's processes, the rest from the node's state file (the path in
$SPARKBOOK_LAB_STATE). Each tool says on stderr that it is simulated, and where a format has room
for it (the nvidia-smi table's time line), on stdout too.

Standalone on purpose: it runs with the node's python3 and imports nothing from sparkbook.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

MARK = "sparkbook lab: simulated"


def state() -> dict:
    with open(os.environ["SPARKBOOK_LAB_STATE"]) as f:
        return json.load(f)


def links() -> dict[str, dict]:
    """The node's netdevs by name: operstate, mtu, flags (from the node's own namespace)."""
    out = subprocess.run(["ip", "-j", "link", "show"], capture_output=True, text=True, check=True)
    return {li["ifname"]: li for li in json.loads(out.stdout)}


def is_up(link: dict | None) -> bool:
    return bool(link) and "UP" in link.get("flags", []) and "LOWER_UP" in link.get("flags", [])


# ------------------------------------------------------------------------------------------ GPU

def gpu_processes() -> list[dict]:
    """Processes of this node that would hold GPU memory on a Spark: vLLM engines and Ray workers."""
    procs = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
            with open(f"/proc/{pid}/comm") as f:
                comm = f.read().strip()
            with open(f"/proc/{pid}/status") as f:
                rss = next((int(ln.split()[1]) for ln in f if ln.startswith("VmRSS:")), 0)
        except OSError:
            continue
        words = cmd.split()
        if comm.startswith(("VLLM::", "ray::")) or any("vllm" in w for w in words[:3]):
            name = comm if comm.startswith(("VLLM::", "ray::")) else (words[0] if words else comm)
            procs.append({"pid": int(pid), "name": name, "mib": max(rss // 1024, 1)})
    return sorted(procs, key=lambda p: p["pid"])


def smi_table(s: dict) -> str:
    g = s["gpu"]
    stamp = time.strftime("%a %b %e %H:%M:%S %Y")
    rows = [
        f"{stamp}       ({MARK})",
        "+" + "-" * 89 + "+",
        f"| NVIDIA-SMI {g['driver']:<22} Driver Version: {g['driver']:<14} CUDA Version: {g['cuda']:<9}|",
        "+" + "-" * 41 + "+" + "-" * 24 + "+" + "-" * 22 + "+",
        "| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |",
        "| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage | GPU-Util  Compute M. |",
        "|                                         |                        |               MIG M. |",
        "|" + "=" * 41 + "+" + "=" * 24 + "+" + "=" * 22 + "|",
    ]
    for i in range(g["count"]):
        rows += [
            f"| {i:>3}  {g['name']:<28} On  |   {g['bus_id']} Off |                  N/A |",
            "| N/A   40C    P0             11W /  N/A  | Not Supported          |      0%      Default |",
            "|                                         |                        |                  N/A |",
            "+" + "-" * 41 + "+" + "-" * 24 + "+" + "-" * 22 + "+",
        ]
    rows += [
        "",
        "+" + "-" * 89 + "+",
        "| Processes:" + " " * 78 + "|",
        "|  GPU   GI   CI              PID   Type   Process name                        GPU Memory |",
        "|        ID   ID                                                               Usage      |",
        "|" + "=" * 89 + "|",
    ]
    procs = gpu_processes() if g["count"] else []
    if not procs:
        rows.append("|  No running processes found" + " " * 61 + "|")
    for p in procs:
        name = p["name"] if len(p["name"]) <= 32 else "..." + p["name"][-29:]
        rows.append(f"|    0   N/A  N/A   {p['pid']:>12}      C   {name:<32} {p['mib']:>8}MiB |")
    rows.append("+" + "-" * 89 + "+")
    return "\n".join(rows) + "\n"


# nvidia-smi -q as a GB10 prints it (driver 580: "Clocks Event Reasons", N/A for the memory and
# its clock; real sample: github.com/ollama/ollama/issues/13552). A lab fault (throttle) sets
# state["throttle"] = {"reasons": [...], "mhz": N}: those reasons Active, the clocks held at N MHz.
REASONS = ("Idle", "Applications Clocks Setting", "SW Power Cap", "HW Slowdown", "HW Thermal Slowdown",
           "HW Power Brake Slowdown", "Sync Boost", "SW Thermal Slowdown", "Display Clock Setting")


def smi_query(s: dict) -> str:
    g, held = s["gpu"], s.get("throttle") or {}
    active = set(held.get("reasons", [])) or ({"Idle"} if not gpu_processes() else set())
    mhz = held.get("mhz", g.get("clock_mhz", 2418))
    row = lambda depth, key, value="": (f"{'    ' * depth}{key:<{42 - 4 * depth}}: {value}" if value != ""
                                        else f"{'    ' * depth}{key}")  # noqa: E731
    out = ["", "==============NVSMI LOG==============", "",
           row(0, "Timestamp", f"{time.strftime('%a %b %e %H:%M:%S %Y')} ({MARK})"),
           row(0, "Driver Version", g["driver"]), row(0, "CUDA Version", g["cuda"]), "",
           row(0, "Attached GPUs", g["count"])]
    for i in range(g["count"]):
        out += [f"GPU {g['bus_id'] if i == 0 else f'0000000{i:X}:01:00.0'}",
                row(1, "Product Name", g["name"]), row(1, "Product Architecture", "Blackwell"),
                row(1, "Persistence Mode", "Enabled"), row(1, "Addressing Mode", "ATS"),
                row(1, "GPU UUID", GPU_FIELDS["uuid"](g, i)), row(1, "FB Memory Usage"),
                *(row(2, k, "N/A") for k in ("Total", "Reserved", "Used", "Free")),
                row(1, "Performance State", "P0"), row(1, "Clocks Event Reasons"),
                *(row(3 if r in ("HW Thermal Slowdown", "HW Power Brake Slowdown") else 2, r,
                      "Active" if r in active else "Not Active") for r in REASONS),
                row(1, "Clocks Event Reasons Counters"),
                *(row(2, k, "0 us") for k in ("SW Power Capping", "Sync Boost", "SW Thermal Slowdown",
                                               "HW Thermal Slowdown", "HW Power Braking")),
                row(1, "Temperature"), row(2, "GPU Current Temp", "40 C"),
                row(1, "GPU Power Readings"), row(2, "Instantaneous Power Draw", "11.00 W"),
                row(2, "Current Power Limit", "N/A"),
                row(1, "Clocks"), row(2, "Graphics", f"{mhz} MHz"), row(2, "SM", f"{mhz} MHz"),
                row(2, "Memory", "N/A"), row(2, "Video", f"{min(mhz, 1470)} MHz"),
                row(1, "Max Clocks"), row(2, "Graphics", "3003 MHz"), row(2, "SM", "3003 MHz"),
                row(2, "Memory", "N/A"), row(2, "Video", "3003 MHz"), ""]
    return "\n".join(out) + "\n"


GPU_FIELDS = {
    "index": lambda g, i: str(i),
    "name": lambda g, i: g["name"],
    "driver_version": lambda g, i: g["driver"],
    "compute_cap": lambda g, i: g.get("compute_cap", "12.1"),
    "pci.bus_id": lambda g, i: g["bus_id"],
    "uuid": lambda g, i: f"GPU-5a1be0b0-0000-4000-8000-{i:012d}",
    "memory.total": lambda g, i: "[N/A]",
    "memory.used": lambda g, i: "[N/A]",
    "memory.free": lambda g, i: "[N/A]",
    "temperature.gpu": lambda g, i: "40",
    "utilization.gpu": lambda g, i: "0 %",
    "power.draw": lambda g, i: "11.00 W",
    "clocks.sm": lambda g, i: f"{g.get('clock_mhz', 2418)} MHz",
    "persistence_mode": lambda g, i: "Enabled",
}
HEADERS = {"memory.total": "memory.total [MiB]", "memory.used": "memory.used [MiB]",
           "memory.free": "memory.free [MiB]", "utilization.gpu": "utilization.gpu [%]",
           "power.draw": "power.draw [W]", "clocks.sm": "clocks.current.sm [MHz]"}


def nvidia_smi(args: list[str], s: dict) -> int:
    g = s["gpu"]
    fmt = next((a.split("=", 1)[1] for a in args if a.startswith("--format=")), "")
    noheader = "noheader" in fmt
    query = next((a.split("=", 1)[1] for a in args if a.startswith("--query-gpu=")), None)
    apps = next((a.split("=", 1)[1] for a in args if a.startswith("--query-compute-apps=")), None)
    if not args:
        sys.stdout.write(smi_table(s))
    elif args == ["-L"]:
        for i in range(g["count"]):
            print(f"GPU {i}: {g['name']} (UUID: {GPU_FIELDS['uuid'](g, i)})")
    elif "-q" in args or "--query" in args:
        sys.stdout.write(smi_query(s))
    elif query:
        fields = [f.strip() for f in query.split(",")]
        bad = [f for f in fields if f not in GPU_FIELDS]
        if bad:
            print(f'Field "{bad[0]}" is not a valid field to query.', file=sys.stderr)
            return 2
        if not noheader:
            print(", ".join(HEADERS.get(f, f) for f in fields))
        for i in range(g["count"]):  # nounits: "11.00 W" -> "11.00", as nvidia-smi drops them
            vals = [GPU_FIELDS[f](g, i) for f in fields]
            print(", ".join(re.sub(r" (W|MHz|MiB|%)$", "", v) if "nounits" in fmt else v for v in vals))
    elif apps:
        fields = [f.strip() for f in apps.split(",")]
        if not noheader:
            print(", ".join("used_gpu_memory [MiB]" if f in ("used_memory", "used_gpu_memory")
                            else f for f in fields))
        for p in gpu_processes() if g["count"] else []:
            vals = {"pid": str(p["pid"]), "process_name": p["name"], "used_memory": f"{p['mib']} MiB",
                    "used_gpu_memory": f"{p['mib']} MiB", "gpu_uuid": GPU_FIELDS["uuid"](g, 0)}
            print(", ".join(vals.get(f, "[N/A]") for f in fields))
    else:
        print("Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.")
        return 2
    return 0


# ------------------------------------------------------------------------------------------ RDMA

def ib_mtu(netdev_mtu: int) -> tuple[int, int]:
    """The RoCE path MTU the HCA reports for a netdev MTU, with its enum (IB MTUs 256..4096)."""
    best = (256, 1)
    for value, enum in ((512, 2), (1024, 3), (2048, 4), (4096, 5)):
        if value + 100 <= netdev_mtu:  # room for the RoCE v2 headers
            best = (value, enum)
    return best


def nics(s: dict) -> list[tuple[dict, dict | None]]:
    live = links()
    return [(n, live.get(n["netdev"])) for n in s["nics"]]


def ibdev2netdev(args: list[str], s: dict) -> int:
    for n, link in nics(s):
        print(f"{n['hca']} port 1 ==> {n['netdev']} ({'Up' if is_up(link) else 'Down'})")
    return 0


def ibstat(args: list[str], s: dict) -> int:
    wanted = [a for a in args if not a.startswith("-")]
    found = [(n, link) for n, link in nics(s) if not wanted or n["hca"] == wanted[0]]
    if not found:
        print(f"ibpanic: [{os.getpid()}] main: '{wanted[0]}' IB device can't be found: No such file or directory",
              file=sys.stderr)
        return 255
    for n, link in found:
        up = is_up(link)
        print(f"CA '{n['hca']}'")
        print("\tCA type: MT4129")
        print("\tNumber of ports: 1")
        print(f"\tFirmware version: {s['firmware']}")
        print("\tHardware version: 0")
        print(f"\tNode GUID: 0x{n['guid'].replace(':', '')}")
        print(f"\tSystem image GUID: 0x{s['nics'][0]['guid'].replace(':', '')}")
        print("\tPort 1:")
        print(f"\t\tState: {'Active' if up else 'Down'}")
        print(f"\t\tPhysical state: {'LinkUp' if up else 'Disabled'}")
        print(f"\t\tRate: {s['speed_mbps'] // 1000 if up else 40}")
        print("\t\tBase lid: 0")
        print("\t\tLMC: 0")
        print("\t\tSM lid: 0")
        print("\t\tCapability mask: 0x00010000")
        print(f"\t\tPort GUID: 0x{n['guid'].replace(':', '')}")
        print("\t\tLink layer: Ethernet")
    return 0


def ibv_devinfo(args: list[str], s: dict) -> int:
    dev = args[args.index("-d") + 1] if "-d" in args else None
    blocks = []
    for n, link in nics(s):
        if dev and n["hca"] != dev:
            continue
        up = is_up(link)
        mtu, enum = ib_mtu(link["mtu"] if link else 1500)
        blocks.append("\n".join([
            f"hca_id:\t{n['hca']}",
            "\ttransport:\t\t\tInfiniBand (0)",
            f"\tfw_ver:\t\t\t\t{s['firmware']}",
            f"\tnode_guid:\t\t\t{n['guid']}",
            f"\tsys_image_guid:\t\t\t{s['nics'][0]['guid']}",
            "\tvendor_id:\t\t\t0x02c9",
            "\tvendor_part_id:\t\t\t4129",
            "\thw_ver:\t\t\t\t0x0",
            "\tboard_id:\t\t\tNVD0000000087",
            "\tphys_port_cnt:\t\t\t1",
            "\t\tport:\t1",
            f"\t\t\tstate:\t\t\t{'PORT_ACTIVE (4)' if up else 'PORT_DOWN (1)'}",
            "\t\t\tmax_mtu:\t\t4096 (5)",
            f"\t\t\tactive_mtu:\t\t{mtu} ({enum})",
            "\t\t\tsm_lid:\t\t\t0",
            "\t\t\tport_lid:\t\t0",
            "\t\t\tport_lmc:\t\t0x00",
            "\t\t\tlink_layer:\t\tEthernet",
        ]))
    if dev and not blocks:
        print(f"Failed to get IB device '{dev}'", file=sys.stderr)
        return 255
    print("\n\n".join(blocks) + "\n")
    return 0


def ethtool(args: list[str], s: dict) -> int:
    names = [a for a in args if not a.startswith("-")]
    if len(names) != 1:
        print("ethtool: bad command line argument(s)\nFor more information run ethtool -h", file=sys.stderr)
        return 1
    name = names[0]
    link = links().get(name)
    if link is None:
        print(f"netlink error: no device matches name ({name})", file=sys.stderr)
        return 1
    nic = next((n for n in s["nics"] if n["netdev"] == name), None)
    if "-i" in args:
        print(f"driver: {'mlx5_core' if nic else 'veth'}\nversion: 24.10-1.1.4\n"
              f"firmware-version: {s['firmware'] + ' (NVD0000000087)' if nic else ''}\n"
              f"bus-info: {nic['bus'] if nic else ''}")
        return 0
    if "--show-fec" in args:
        return show_fec(name, nic, link, s, statistics="-I" in args or "--include-statistics" in args)
    if "-S" in args or "--statistics" in args:
        return stats(name, nic, s)
    up = is_up(link)
    speed = f"{s['speed_mbps']}Mb/s" if up and nic else "Unknown!"
    print(f"Settings for {name}:")
    print("\tSupported ports: [ Backplane ]")
    print("\tSupported link modes:   200000baseCR4/Full")
    print("\t                        200000baseCR2/Full")
    print("\tSupported pause frame use: Symmetric")
    print("\tSupports auto-negotiation: Yes")
    print("\tSupported FEC modes: None\t RS\t BASER\t LLRS")
    print("\tAdvertised link modes:  200000baseCR4/Full")
    print("\tAdvertised auto-negotiation: Yes")
    print(f"\tSpeed: {speed}")
    print(f"\tDuplex: {'Full' if up else 'Unknown! (255)'}")
    print("\tAuto-negotiation: on")
    print("\tPort: Direct Attach Copper")
    print("\tPHYAD: 0")
    print("\tTransceiver: internal")
    print(f"\tLink detected: {'yes' if up else 'no'}")
    return 0


# ------------------------------------------------------------------------- FEC and RoCE GIDs

def show_fec(name: str, nic: dict | None, link: dict, s: dict, statistics: bool = False) -> int:
    """`ethtool [-I] --show-fec IF` as ethtool's netlink code prints it: RS on an up CX-7 port, as
    on a healthy Spark at 200G; the state's "fec" (netdev -> mode) overrides it: the `fec` fault sets
    None, what a Spark printed after its cable was moved. With -I, the block counts' totals, as mlx5
    reports them in RS mode (the `link-errors` fault can make uncorrectable_blocks climb)."""
    if nic is None:
        print("netlink error: Operation not supported", file=sys.stderr)
        return 1
    print(f"FEC parameters for {name}:")
    print("Supported/Configured FEC encodings: Auto")
    print(f"Active FEC encoding: {s.get('fec', {}).get(name, 'RS' if is_up(link) else 'None')}")
    if statistics:
        print("Statistics:")
        for counter in ("corrected_blocks", "uncorrectable_blocks"):
            print(f"  {counter}: {climbed(s, name, counter)}")
    return 0


# mlx5's physical port counters of `ethtool -S` (their names as a ConnectX prints them: a real
# output in tests/fixtures/ethtool-S-mlx5-cx4-1.txt; the lanes' raw errors as newer kernels add them)
PHY_COUNTERS = ("rx_crc_errors_phy", "rx_in_range_len_errors_phy", "rx_symbol_err_phy", "rx_discards_phy",
                "tx_discards_phy", "tx_errors_phy", "link_down_events_phy", "rx_pcs_symbol_err_phy",
                "rx_corrected_bits_phy", "rx_err_lane_0_phy", "rx_err_lane_1_phy", "rx_err_lane_2_phy",
                "rx_err_lane_3_phy", "rx_pci_signal_integrity", "tx_pci_signal_integrity")


def climbed(s: dict, netdev: str, counter: str) -> int:
    """A counter's value: 0, or what the `link-errors` fault has added since it began (its
    state["link_errors"]: the netdevs, the counter, when it began, how many a second)."""
    f = s.get("link_errors") or {}
    if counter != f.get("counter") or netdev not in f.get("netdevs", ()):
        return 0
    return int(max(0.0, time.time() - f["since"]) * f["per_s"])


def stats(name: str, nic: dict | None, s: dict) -> int:
    """`ethtool -S IF`: the netdev's real byte and packet counts (`ip -s link`) as mlx5 names them,
    and its physical port counters, clean unless a fault makes one climb."""
    if nic is None:
        print("no stats available", file=sys.stderr)
        return 94
    print("NIC statistics:")
    out = subprocess.run(["ip", "-j", "-s", "link", "show", "dev", name], capture_output=True, text=True)
    counts = json.loads(out.stdout or "[{}]")[0].get("stats64", {})
    for counter in ("rx_packets", "rx_bytes", "tx_packets", "tx_bytes"):
        value = counts.get(counter[:2], {}).get(counter[3:], 0)
        print(f"     {counter}: {value}")
        print(f"     {counter}_phy: {value}")
    for counter in PHY_COUNTERS:
        print(f"     {counter}: {climbed(s, name, counter)}")
    return 0


def addresses() -> dict[str, list[str]]:
    """The node's IPv4 addresses by netdev (from its own namespace)."""
    out = subprocess.run(["ip", "-j", "-4", "addr", "show"], capture_output=True, text=True, check=True)
    return {li["ifname"]: [a["local"] for a in li.get("addr_info", [])] for li in json.loads(out.stdout)}


def show_gids(args: list[str], s: dict) -> int:
    """show_gids (mlnx-tools) for the node's HCAs, port 1: the link-local GID (from the netdev's
    MAC, else the HCA's GUID) as RoCE v1 and v2, then each IPv4 address of the netdev as v1 and v2,
    so that a rail's first address is the RoCE v2 GID at index 3, as on DGX OS."""
    import ipaddress
    live, addrs = links(), addresses()
    print("DEV\tPORT\tINDEX\tGID\t\t\t\t\tIPv4  \t\tVER\tDEV")
    print("---\t----\t-----\t---\t\t\t\t\t------------  \t---\t---")
    count = 0
    for n in s["nics"]:
        if args and n["hca"] != args[0]:
            continue
        mac = (live.get(n["netdev"]) or {}).get("address")
        if mac:
            b = [int(x, 16) for x in mac.split(":")]
            eui = [b[0] ^ 2, *b[1:3], 0xFF, 0xFE, *b[3:6]]
            local = ":".join(f"{eui[i]:02x}{eui[i + 1]:02x}" for i in range(0, 8, 2))
        else:
            local = ":".join(f"{int(w, 16):04x}" for w in n["guid"].split(":"))
        entries = [("fe80:0000:0000:0000:" + local, "")] * 2
        entries += [(ipaddress.IPv6Address("::ffff:" + a).exploded, a) for a in addrs.get(n["netdev"], [])
                    for _ in (1, 2)]
        for index, (gid, ipv4) in enumerate(entries):
            ver = f"v{index % 2 + 1}"
            print(f"{n['hca']}\t1\t{index}\t{gid}\t{ipv4}  \t{ver}\t{n['netdev']}" if ipv4
                  else f"{n['hca']}\t1\t{index}\t{gid}\t\t\t{ver}\t{n['netdev']}")
            count += 1
    print(f"n_gids_found={count}")
    return 0


TOOLS = {"nvidia-smi": nvidia_smi, "ibdev2netdev": ibdev2netdev, "ibstat": ibstat,
         "ibv_devinfo": ibv_devinfo, "ethtool": ethtool, "show_gids": show_gids}


def main(argv: list[str]) -> int:
    tool = os.path.basename(argv[0])
    if tool not in TOOLS:  # called as simhw.py TOOL ARGS...
        tool, argv = argv[1], argv[1:]
    s = state()
    if tool == "nvidia-smi" and not s["gpu"]["count"]:
        print("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
              "Make sure that the latest NVIDIA driver is installed and running.")
        return 9
    print(f"[{MARK} {tool} on {s['node']}]", file=sys.stderr)
    return TOOLS[tool](argv[1:], s)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
