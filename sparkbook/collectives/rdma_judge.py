"""The verdict on each cable (:mod:`.rdma`'s measurements), its table and its plot.

Each link is held to ``expectations.rdma_gbps`` each way and the faults are told apart by their
public signatures, each with its class of remedy:

- **down**: a rail's link is down at one end (the cable, the port, the address): 01's rail rows;
- **slow both ways, counters clean**: NVIDIA's "degraded ConnectX-7 initialization" of a DGX
  Spark, 8-25 Gb/s per rail with the link at 200 Gb/s, PCIe at Gen5 x4 and clean counters; its
  remedy is a reboot of both ends with the final cabling, then a full power removal
  (NVIDIA/dgx-spark-playbooks nvidia/connect-two-sparks/assets/performance_benchmarking_guide.md;
  reproduced on four Sparks at 13 Gb/s with clean counters in NVIDIA/dgx-spark-playbooks#108);
- **slow with errors**: error counters that rose while the link was measured, or no FEC: the cable
  or transceiver loses traffic (the kernel's mlx5 counters documentation: "You may need to replace
  the cable/transceiver");
- **one way**: one direction slow, the other at rate: the receiving end's port ("an endpoint can be
  degraded in only one direction", the same NVIDIA guide);
- **perftest's own errors**: the client could not connect (a firewall, the address), the queue pairs
  could not connect (the GID index), no such HCA.

Across links: when every slow link of a rail goes through one node and all of that node's links
are slow, the node's own cable (or switch port) is named: one bad link among many.
"""

from __future__ import annotations

from pathlib import Path

from ..book.tables import Table
from ..book.verdict import COLOURS, FAIL, PASS, SKIP, WARN, Check
from ..params import Params
from .rdma import LinkResult, RdmaOutcome

GUIDE = "NVIDIA/dgx-spark-playbooks connect-two-sparks/assets/performance_benchmarking_guide.md"
REBOOT = ("reboot both nodes with the cabling as it will stay; if the rate stays low, shut both down "
          "and remove AC power (the power brick from the wall and from the node) for at least 60 s, "
          "then power up without moving the cable; if it persists, reseat the cable at both ends, "
          f"then try another cable ({GUIDE}: a ConnectX-7 that initialised degraded)")
CABLE = ("reseat the cable at both ends, clean the connectors, then replace the cable or transceiver "
         "(the kernel's mlx5 counters documentation for these counters); `ethtool -S IF` on both ends "
         "shows them")
PERFTEST = "sudo apt install perftest (on every node; it gives ib_write_bw and ib_write_lat)"
ONE_WAY_S = 0.5  # a direction this far below the other is one-way slow, without a bar too
SLOW, ERRORS, ONE_WAY, DOWN, BROKEN, MISSING, OK = ("slow both ways", "slow with errors", "one way",
                                                    "down", "perftest error", "no perftest", "ok")


def _gb(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


def numbers(res: LinkResult) -> str:
    """``→ 92.6, ← 92.5, both 185.0 Gb/s, 1.5 µs``"""
    lat = f", {res.latency_us:.1f} µs" if res.latency_us is not None else ""
    return f"→ {_gb(res.forward)}, ← {_gb(res.reverse)}, both {_gb(res.both)} Gb/s{lat}"


def classify(params: Params, res: LinkResult) -> tuple[str, str, str]:
    """A link's class (one of the module's kinds), what was seen and the remedy."""
    lk, bar, port = res.link, params.expectations.rdma_gbps, params.collectives.rdma.port
    if res.down:
        return DOWN, f"down: {', '.join(res.down)}", (
            "the rail's link is down at that end: its cable, its port or its address; 01_preflight.ipynb's "
            "rail rows (`ibdev2netdev`, `ip link show`) show which")
    if res.unavailable:
        return MISSING, f"perftest not installed on {', '.join(res.unavailable)}", PERFTEST
    if res.bind_all:
        return MISSING, (f"perftest on {', '.join(res.bind_all)} cannot bind to the rail address (no "
                         "--bind_source_ip): not run, so its port is never opened on every interface"), \
            "perftest 4.5 or later on every node (Ubuntu 24.04's perftest 24.01 has --bind_source_ip)"
    if res.errors:
        kind = next(iter(res.error_kinds.values()))
        seen = "; ".join(f"{k}: {e}" for k, e in res.errors.items())
        remedy = {
            "connect": f"the client could not reach perftest's port {port} on the other end's rail "
                       f"address ({lk.rail_b.ip} / {lk.rail_a.ip}): a firewall on the rail (TCP {port}), "
                       "a wrong rail address, or another perftest holding the port (collectives.rdma.port)",
            "qp": "the queue pairs could not connect: the GID index (runtime.nccl_ib_gid_index, perftest's -x) "
                  "does not hold the rail's RoCE v2 address, or the MTUs differ; `show_gids` on both ends "
                  "(01_preflight.ipynb's rail gid row)",
            "port": "perftest finds the HCA's port down: its cable or port (01_preflight.ipynb's rail rows)",
        }.get(kind, f"the HCA ({lk.rail_a.hca}, {lk.rail_b.hca}) is missing or unusable: `ibv_devinfo`, the rails' hca "
                    "names in the parameters, rdma-core and the driver; rerun the command by hand on both ends")
        return BROKEN, seen, remedy
    ways = {"→": res.forward, "←": res.reverse}
    if bar is not None:
        low = [w for w, v in ways.items() if v is None or v < bar]
    else:
        top = max((v for v in ways.values() if v is not None), default=0)
        low = [w for w, v in ways.items() if v is not None and v < ONE_WAY_S * top]
    if not low:
        return OK, numbers(res), ""
    rose = {end: c for end, c in res.counters.items() if c}
    no_fec = [end for end, mode in res.fec.items() if mode in ("None", "Off")]
    if rose or no_fec:
        seen = "; ".join([f"{end}: " + ", ".join(f"{k} +{v}" for k, v in c.items()) for end, c in rose.items()]
                         + [f"{end}: FEC {res.fec[end]}" for end in no_fec])
        return ERRORS, f"{numbers(res)}; errors while measured: {seen}", CABLE
    if len(low) == 2:
        return SLOW, f"{numbers(res)}; link up, error counters and FEC clean", REBOOT
    frm, to = (lk.a, lk.b) if low == ["→"] else (lk.b, lk.a)
    return ONE_WAY, f"{numbers(res)}: slow from {frm} to {to} only, counters clean", (
        f"the receiving end's port ({to}) or {frm}'s transmit side: reseat the cable at {to}, then at "
        f"{frm}; reboot {to}; if it persists, swap the cable's ends to see whether the fault follows the "
        f"cable; `ethtool -S {lk.interface}` on {to} ({GUIDE}: an endpoint can be degraded in one direction)")


def expected(params: Params) -> str:
    e = params.expectations
    bar = f"≥ {e.rdma_gbps:g} Gb/s each way" if e.rdma_gbps else "both ways alike (no expectations.rdma_gbps)"
    return bar + (f" ({e.rdma_source})" if e.rdma_source else "")


def checks(params: Params, out: RdmaOutcome) -> list[Check]:
    """A row per link that is not at rate, one per rail summing up those that are, the link at
    fault where one node's links alone are slow, and the latency against its bar."""
    found: list[Check] = []
    if out.skipped:
        return [Check("rdma", "all", SKIP, out.skipped + "".join(f"; {n}" for n in out.notes), expected(params))]
    fail_missing = params.collectives.rdma.run == "on"
    kinds = {id(res): classify(params, res) for res in out.results}
    for subnet in dict.fromkeys(res.link.subnet for res in out.results):
        mine = [res for res in out.results if res.link.subnet == subnet]
        interface = mine[0].link.interface
        good = [res for res in mine if kinds[id(res)][0] == OK]
        for res in mine:
            kind, seen, remedy = kinds[id(res)]
            if kind == OK:
                continue
            status = (FAIL if fail_missing else SKIP) if kind == MISSING else FAIL
            found.append(Check("rdma", f"{res.link.a}, {res.link.b}", status, f"{interface}: {kind}: {seen}",
                               expected(params), remedy, " | ".join(res.commands.values())))
        if good:
            found.append(Check("rdma", "all", PASS, f"{interface}: {len(good)} link(s) at rate: "
                               + "; ".join(f"{r.link.label} {numbers(r)}" for r in good[:4])
                               + (f" and {len(good) - 4} more" if len(good) > 4 else ""), expected(params)))
        found += at_fault(params, interface, mine, kinds)
    bar = params.expectations.rdma_latency_us
    for res in out.results:
        if bar and res.latency_us is not None and res.latency_us > bar:
            found.append(Check("rdma latency", f"{res.link.a}, {res.link.b}", WARN,
                               f"{res.link.interface}: {res.latency_us:.1f} µs one way", f"≤ {bar:g} µs",
                               "a switch hop, flow-control pauses (PFC) or power saving: set the CPU governor to "
                               "performance, check the switch's port counters, rerun 02",
                               res.commands.get("latency", "")))
    if unread := list(dict.fromkeys(n for res in out.results for n in res.unread)):
        found.append(Check("rdma", ", ".join(unread), WARN, "the rails' state (link_health.sh) could not be read "
                           "before the tests: whether a rail was down and its counters are not judged",
                           "every node's rail state read", "check SSH to the node and rerun 02"))
    if out.notes:
        found.append(Check("rdma", "all", WARN, "; ".join(out.notes), "every rail measured",
                           "name each rail's HCA (nodes[].rails[].hca; `ibdev2netdev` lists them)"))
    return found


def at_fault(params: Params, interface: str, mine: list[LinkResult], kinds: dict) -> list[Check]:
    """On a rail of three or more nodes: the node all of whose links are slow while every other
    link is at rate (its cable or its switch port); otherwise nothing more than the links' rows."""
    nodes = list(dict.fromkeys(n for res in mine for n in (res.link.a, res.link.b)))
    slow = [res for res in mine if kinds[id(res)][0] in (SLOW, ERRORS, ONE_WAY)]
    ok = [res for res in mine if kinds[id(res)][0] == OK]
    if len(nodes) < 3 or not slow or not ok:
        return []
    for node in nodes:
        through = [res for res in mine if node in (res.link.a, res.link.b)]
        if all(res in slow for res in through) and all(node in (r.link.a, r.link.b) for r in slow):
            kind = kinds[id(slow[0])]
            return [Check("link at fault", node, FAIL,
                          f"{interface}: every link through {node} is slow ({len(through)} of {len(through)}: "
                          + ", ".join(f"{r.link.label} {numbers(r)}" for r in through[:3])
                          + f"), {len(ok)} other(s) at rate",
                          "every node's links at rate",
                          f"{node}'s cable on {interface} (or its switch port): {kind[2]}")]
    return []


def rail_gbps(out: RdmaOutcome | None) -> float | None:
    """What the slowest measured link carries one way, summed over the rails (Gb/s): the RDMA an
    all-reduce across the nodes could use; None without a complete measurement."""
    if not out or not out.results:
        return None
    per_rail: dict[str, float] = {}
    for res in out.results:
        if res.forward is None or res.reverse is None:
            return None
        slower = min(res.forward, res.reverse)
        per_rail[res.link.subnet] = min(per_rail.get(res.link.subnet, slower), slower)
    return sum(per_rail.values())


def table(out: RdmaOutcome | None, params: Params) -> Table:
    rows = []
    for res in (out.results if out else []):
        kind, _, _ = classify(params, res)
        rows.append([res.link.interface, res.link.a, res.link.b, _gb(res.forward), _gb(res.reverse), _gb(res.both),
                     "-" if res.latency_us is None else f"{res.latency_us:.2f}", "PASS" if kind == OK else kind])
    return Table(["rail", "a", "b", "a→b Gb/s", "b→a Gb/s", "both Gb/s", "latency µs", "finding"], rows,
                 title="each cable, both ways (perftest ib_write_bw, ib_write_lat)",
                 colour=lambda col, v: (COLOURS.get(v) or COLOURS["FAIL"]) if col == "finding" else None)


def plot(params: Params, out: RdmaOutcome | None, path: Path | None = None):
    """Per rail, a node × node matrix of the Gb/s each link carried from its row's node to its
    column's, with the bar in the title; nothing without a measurement."""
    if not out or not out.results:
        return None
    import matplotlib.pyplot as plt
    import numpy as np
    rails = list(dict.fromkeys(res.link.subnet for res in out.results))
    nodes = list(dict.fromkeys(n for res in out.results for n in (res.link.a, res.link.b)))
    fig, axes = plt.subplots(1, len(rails), figsize=(1.2 + 3.2 * len(rails) + 0.4 * len(nodes), 1.5 + 0.55 * len(nodes)),
                             squeeze=False)
    bar = params.expectations.rdma_gbps
    top = max([v for r in out.results for v in (r.forward, r.reverse) if v is not None] + [bar or 0, 1e-9])
    for ax, rail in zip(axes[0], rails):
        grid = np.full((len(nodes), len(nodes)), np.nan)
        for res in out.results:
            if res.link.subnet == rail:
                i, j = nodes.index(res.link.a), nodes.index(res.link.b)
                grid[i, j] = np.nan if res.forward is None else res.forward
                grid[j, i] = np.nan if res.reverse is None else res.reverse
        image = ax.imshow(grid, vmin=0, vmax=top, cmap="RdYlGn")
        for (i, j), v in np.ndenumerate(grid):
            if not np.isnan(v):
                ax.text(j, i, f"{v:.0f}" if v >= 10 else f"{v:.1f}", ha="center", va="center", fontsize=8)
        ax.set_xticks(range(len(nodes)), nodes, rotation=45, ha="right")
        ax.set_yticks(range(len(nodes)), nodes)
        ax.set_xlabel("to")
        ax.set_ylabel("from")
        ax.set_title(f"{next(r.link.interface for r in out.results if r.link.subnet == rail)} ({rail})", fontsize=9)
    fig.colorbar(image, ax=axes[0].tolist(), label="RDMA write Gb/s")
    fig.suptitle(f"each cable, one way ({params.name}; bar {bar:g} Gb/s)" if bar else f"each cable, one way ({params.name})",
                 fontsize=10)
    if path is not None:
        fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return fig


NCCL_FRACTION = 0.2  # an all-reduce below this share of what RDMA carries: NCCL uses part of the link


def against_allreduce(params: Params, out: RdmaOutcome | None, busbw_gbs: float | None, backend: str,
                      transports: dict[str, str]) -> list[Check]:
    """NCCL's all-reduce against what RDMA carries on the same rails: with every link at rate and
    NCCL on RDMA on every node, a bus bandwidth far below the links' is NCCL using part of them
    (the DGX Spark NCCL playbook's "~3 GB/s regardless of buffer size"), not the cables."""
    rdma = rail_gbps(out)
    if backend != "nccl" or busbw_gbs is None or rdma is None or set(transports.values()) != {"rdma"} \
            or any(classify(params, res)[0] != OK for res in out.results):
        return []
    ceiling = rdma / 8  # GB/s
    ok = busbw_gbs >= NCCL_FRACTION * ceiling
    return [Check("rdma vs all-reduce", "all", PASS if ok else FAIL,
                  f"all-reduce busbw {busbw_gbs:.2f} GB/s; RDMA carries {ceiling:.2f} GB/s over the rails "
                  f"(each rail's slowest link, one way)", f"busbw ≥ {NCCL_FRACTION:g} × the RDMA rate",
                  "" if ok else "the cables carry RDMA at rate but NCCL uses a fraction: NCCL_IB_HCA must name "
                  "both halves of the port (the NCCL playbook's ~3 GB/s case), an NCCL built from a release tag "
                  "(NVIDIA/dgx-spark-playbooks#103: 3.04 GB/s on a development build, 23.74 GB/s on v2.28.9-1), "
                  "MTU 9000 on every rail; with all that right, power both nodes off fully (AC removed for "
                  f"60 s) and measure again ({GUIDE})")]
