"""Every preflight check, in the order of the verdict table: each group compares what the nodes
reported (:class:`~sparkbook.preflight.collect.Preflight`) with the parameters and with each
other; one row per check, node and thing checked.

:data:`GROUPS` is the one list of them: the verdict runs it, and ``sparkbook preflight --help``,
the first table of ``01_preflight.ipynb`` and README's list (``tests/test_preflight.py`` compares
it with :func:`markdown`) read it."""

from __future__ import annotations

from typing import Callable, Iterable, NamedTuple

from ..book.tables import Table
from ..book.verdict import Check
from ..facts import memfit
from ..params import Params
from . import artifacts, fabric, host, nodes, reach
from .collect import Preflight


def _memory_fit(params: Params, pf: Preflight) -> list[Check]:
    return memfit.checks(params, {n: r["memory"] for n, r in pf.nodes.items() if "memory" in r})


class Group(NamedTuple):
    rows: tuple[str, ...]  # the names of the verdict rows it writes (``*`` stands for a node's name)
    what: str  # what it checks, for people
    run: Callable[[Params, Preflight], Iterable[Check]]


GROUPS = [
    Group(("ssh",), "this machine reaches every node by SSH, host keys checked", reach.ssh),
    Group(("ssh *→worker",), "the head reaches every worker by SSH (the copies of 03), and each worker "
          "that relays the image reaches those it feeds", reach.node_to_node),
    Group(("same os", "same arch", "same kernel", "same bios", "same docker", "same cuda", "same user"),
          "every node runs the same OS, architecture, kernel, BIOS, Docker and the driver's CUDA, and "
          "sparkbook logs in as the same user (name, UID, GID) on each (01's parity table shows them "
          "side by side)", nodes.sameness),
    Group(("gpu", "memory", "stale processes"), "the GPUs the parameters expect, the unified memory (from "
          "/proc/meminfo where nvidia-smi has none), no process or container left holding GPU memory",
          nodes.gpus),
    Group(("docker", "nvidia runtime"), "Docker answers and has the NVIDIA runtime", nodes.runtime),
    Group(("same driver", "same firmware", "driver", "firmware", "gpu clocks", "swap", "rail dhcp",
           "rail persisted"),
          "NVIDIA driver and CX-7 firmware alike and within the parameters' range, GPU clocks "
          "and throttle reasons, swap in use, a rail NetworkManager sets by DHCP (its address changes at "
          "the next reboot), a rail no file persists (set at runtime only: gone at the next reboot)", host.health),
    Group(("fabric layout",), "a direct pair or a switch; a ring of three or more cabled Sparks is named "
          "unsupported", fabric.layout),
    Group(("rail map", "rail port", "rail rate", "rail fec", "rail gid", "rail mtu",
           "rail address", "path mtu"), "each RoCE rail: HCA mapped to its "
          "interface and Up, port ACTIVE, link rate, FEC, RoCE GID index, MTU, address, and the path "
          "MTU by don't-fragment pings to every peer on the rail's subnet", fabric.rails),
    Group(("tcp ports",), "TCP between every pair of nodes on the ports serving needs (Ray, the torch "
          "rendezvous, the API, one port of the ephemeral range): a firewall can pass ping and drop "
          "them", reach.tcp),
    Group(("clock",), "clock skew against this machine, by the shortest of five round trips", nodes.clocks),
    Group(("ports free",), "the head's serving ports are free", nodes.ports),
    Group(("model disk", "docker disk"), "free disk for the model and for Docker's images", nodes.disks),
    Group(("image",), "the image by content: the same ID everywhere, or still to distribute (03)",
          artifacts.image),
    Group(("model", "model extras"), "the model's files alike everywhere, or still to distribute (03)",
          artifacts.model),
    Group(("memory fit", "page cache"), "the model fits each node's memory beside what vLLM and the OS need",
          _memory_fit),
    Group(("hf token",), "the Hugging Face token, where the model needs one (never shown)", artifacts.hf_token),
    Group(("node checks",), "a node that did not answer, named with its SSH error", reach.unreachable),
]


def checks(params: Params, pf: Preflight) -> list[Check]:
    return [c for g in GROUPS for c in g.run(params, pf)]


def table() -> Table:
    """What preflight checks, in the verdict's order."""
    return Table(["rows", "what is checked"], [[", ".join(g.rows), g.what] for g in GROUPS],
                 title="What 01 checks on every node")


def summary() -> str:
    """One line: every row's name (the CLI's help)."""
    return ", ".join(r for g in GROUPS for r in g.rows)


def markdown() -> str:
    """README's list of the checks (a test compares the two)."""
    return "\n".join(f"- {', '.join(f'`{r}`' for r in g.rows)}: {g.what}" for g in GROUPS)
