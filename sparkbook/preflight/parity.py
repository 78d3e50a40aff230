"""Parity across nodes: one table of what must match on every node, each difference marked, with
what a mismatch does and where that is reported. 01 shows it after the nodes' facts and keeps it as
``parity.csv``; the verdict judges each fact in its own row (``same *`` of
:func:`sparkbook.preflight.nodes.sameness`, ``same driver`` and ``same firmware`` of
:func:`sparkbook.preflight.host.versions`, ``image`` and ``model``), so this table shows and never
judges twice."""

from __future__ import annotations

from typing import Callable

from ..book.tables import Table
from ..facts.identity import ImageIdentity
from ..params import Node, Params
from .collect import NodeReport, Preflight
from .host import driver_of, firmware_of
from .nodes import SAME


def _same(fact: str) -> Callable[[Node, NodeReport], str | None]:
    """The reader of ``same FACT``'s row (nodes.SAME): the table shows what the verdict judges."""
    read = SAME[fact][0]
    return lambda n, d: read(d)


# fact -> (how to read it from a node's report, what a mismatch does, with its source where public)
FACTS: dict[str, tuple[Callable[[Node, NodeReport], str | None], str]] = {
    "OS release": (_same("os"), "other system libraries under the same image"),
    "kernel": (_same("kernel"), "other RDMA and GPU kernel drivers"),
    "arch": (_same("arch"), "an image built for one architecture does not start on the other"),
    "BIOS": (_same("bios"), "other power and PCIe settings"),
    "driver": (lambda n, d: ", ".join(driver_of(d)) or None,
               "ranks on other drivers: a hang traced to a driver mismatch (NVIDIA/nccl#447)"),
    "CUDA (driver's)": (_same("cuda"), "the newest CUDA the driver runs differs"),
    "CX-7 firmware": (lambda n, d: ", ".join(firmware_of(n, d)) or None, "other link behaviour on each end of a cable"),
    "Docker": (_same("docker"), "other container runtime behaviour"),
    "user": (lambda n, d: d["facts"].get("user"), "another login on each node"),
    "UID:GID": (lambda n, d: f"{d['facts']['uid']}:{d['facts']['gid']}" if d["facts"].get("uid") else None,
                "the files one node copies to another belong to someone else there"),
    "image (NCCL with it)": (lambda n, d: (i.id[7:19] if (i := ImageIdentity.of(d.get("image"))) else None),
                             "NCCL ships in the image: ranks on other NCCL versions hang or fail to exchange "
                             "(NVIDIA/nccl#354, NVIDIA/nccl#1328)"),
    "model": (lambda n, d: (f"{len(d['model'])} files, {sum(f['size'] for f in d['model'].values()) / 1e9:.2f} GB"
                            if d.get("model") else None), "ranks load other weights"),
}


def rows(params: Params, pf: Preflight) -> list[dict]:
    """One row per fact: each answering node's value and whether they differ (a node that shows
    no value is left out of the comparison: 01's own rows say why)."""
    up = pf.up(params)
    out = []
    for fact, (read, why) in FACTS.items():
        seen = {n.name: read(n, pf.nodes[n.name]) for n in up}
        differs = len({v for v in seen.values() if v}) > 1
        out.append({"fact": fact, **{k: v or "-" for k, v in seen.items()},
                    "parity": "DIFFERS" if differs else "same", "a mismatch": why})
    return out


def table(params: Params, pf: Preflight) -> Table:
    return Table.from_dicts(rows(params, pf), title="parity across nodes",
                            colour=lambda col, v: "#cf222e" if v == "DIFFERS" else None)
