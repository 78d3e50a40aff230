"""What perftest's ``ib_write_bw`` and ``ib_write_lat`` print (linux-rdma/perftest), parsed: the
header block (device, QPs, MTU, link type, GID index), the result rows and the errors that end a run
before them. Tested on published outputs of DGX Sparks and other ConnectX hosts
(``tests/fixtures/perftest/``, each naming its source).

The numbers, as perftest defines them (its README and ``print_report_bw``): read the client's row;
``BW average`` is the whole run's bytes over its time, in Gb/s with ``--report_gbits`` (10^9 bits)
and otherwise in MiB/s headed "MB/sec"; with ``-b`` the client's row is the sum of both directions
(the server reports its half to the client); in ``-D`` mode perftest prints ``BW peak`` as 0.00. The
latency tests measure a round trip and report half of it; ``t_typical`` is the median.
"""

from __future__ import annotations

import re
import statistics
from typing import TypedDict

MIB_TO_GBIT = 2**20 * 8 / 1e9  # perftest's "MB/sec" is MiB/s (its README: Factor=10^9/(2^20*8))

# A bandwidth row: #bytes #iterations BW-peak BW-average MsgRate (tabs or spaces between)
BW_ROW = re.compile(r"^\s*(\d+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s*$")
# A latency row: #bytes #iterations t_min t_max t_typical t_avg t_stdev p99 p99.9 (microseconds)
LAT_ROW = re.compile(r"^\s*(\d+)\s+(\d+)" + r"\s+([\d.]+)" * 7 + r"\s*$")
# The header's fields, two to a line in places ("Dual-port : OFF   Device : rocep1s0f1")
HEADER = re.compile(r"(?:^|\s)(Device|Number of qps|Mtu|Link type|GID index|Connection type|"
                    r"rdma_cm QPs|Data ex\. method)\s*:\s*(\S+)")

# What ends a run before its rows, as perftest words it (its sources; the fixtures' threads), most
# telling first: (kind, pattern). The kinds are what :mod:`sparkbook.collectives.rdma` names a remedy for.
ERRORS = (
    ("no-device", re.compile(r"Did not detect devices|Unable to find the Infiniband/RoCE device|"
                             r"IB device \S+ not found")),
    ("connect", re.compile(r"Couldn't connect to \S+|Unable to init the socket connection|"
                           r"Unable to open file descriptor for socket connection")),
    ("qp", re.compile(r"Failed to modify QP \S+ to RT[RS]|Unable to Connect the HCA's through the link")),
    ("resources", re.compile(r"Couldn't get device attributes|Couldn't create IB resources|"
                             r"Unable to create QP|Failed to create QP")),
    ("port", re.compile(r"[Pp]ort (?:number \d+ )?state is \S+|Link layer is \S+ and not")),
)


class BwRow(TypedDict):
    bytes: int
    iterations: int
    peak: float
    average: float
    msg_rate_mpps: float


class LatRow(TypedDict):
    bytes: int
    iterations: int
    t_min: float
    t_max: float
    t_typical: float
    t_avg: float
    t_stdev: float
    p99: float
    p999: float


class Perftest(TypedDict):
    """One run's output: the test's title, its header fields, the rows (bandwidth or latency),
    the unit of the bandwidth columns, and the first error line with its kind (None when none)."""
    title: str | None  # e.g. "RDMA_Write BW Test", "RDMA_Write Bidirectional BW Test"
    header: dict[str, str]
    unit: str | None  # "Gb/sec" or "MB/sec" (bandwidth)
    bw: list[BwRow]
    lat: list[LatRow]
    error: str | None
    error_kind: str | None


def parse(text: str) -> Perftest:
    """Any ``ib_*_bw`` or ``ib_*_lat`` output (client or server side). Rows are recognised by their
    shape wherever they stand, so output interleaved with other lines (a CPU-frequency warning, a
    second run printing into the same terminal) still parses."""
    out: Perftest = {"title": None, "header": {}, "unit": None, "bw": [], "lat": [], "error": None,
                     "error_kind": None}
    for line in text.splitlines():
        body = line.strip()
        if out["title"] is None and re.fullmatch(r"\S+ (?:Bidirectional )?(?:BW|Latency) Test", body):
            out["title"] = body
        elif fields := HEADER.findall(line):
            for key, value in fields:
                out["header"].setdefault(key, value)
        elif "BW average[" in body:
            out["unit"] = "MB/sec" if "MB/sec" in body else "Gb/sec"
        elif m := LAT_ROW.match(line):
            v = [float(x) for x in m.groups()[2:]]
            out["lat"].append({"bytes": int(m[1]), "iterations": int(m[2]), "t_min": v[0], "t_max": v[1],
                               "t_typical": v[2], "t_avg": v[3], "t_stdev": v[4], "p99": v[5], "p999": v[6]})
        elif m := BW_ROW.match(line):
            out["bw"].append({"bytes": int(m[1]), "iterations": int(m[2]), "peak": float(m[3]),
                              "average": float(m[4]), "msg_rate_mpps": float(m[5])})
        elif out["error"] is None:
            for kind, pattern in ERRORS:
                if e := pattern.search(body):
                    out["error"], out["error_kind"] = e[0], kind
                    break
    return out


def bidirectional(run: Perftest) -> bool:
    return "Bidirectional" in (run["title"] or "")


def gbps(run: Perftest) -> float | None:
    """The run's bandwidth in Gb/s: the median ``BW average`` of the rows of its largest message
    size (one row normally; several with ``--run_infinitely``; one per size with ``-a``), converted
    from MiB/s where the columns are "MB/sec"; None without a row."""
    if not run["bw"]:
        return None
    top = max(r["bytes"] for r in run["bw"])
    value = statistics.median(r["average"] for r in run["bw"] if r["bytes"] == top)
    return value * MIB_TO_GBIT if run["unit"] == "MB/sec" else value


def latency_us(run: Perftest) -> float | None:
    """The run's one-way latency in microseconds: ``t_typical`` (the median) of its smallest message
    size; None without a row."""
    if not run["lat"]:
        return None
    return min(run["lat"], key=lambda r: r["bytes"])["t_typical"]
