"""Model copy on an N-node lab (4: three workers), in one run: sparkbook against the floor.

- floor: every worker writes the same files from a local copy of its own, all at the same time
  (`cp -a`, the source in the page cache as the head's files are for sparkbook)
- sparkbook, first rail: 03's model sync with distribution.rails first (one rsync over SSH per
  worker, what 03 did before both rails)
- sparkbook, both rails: the default (each worker's files split by size over the twins)
- sparkbook, both rails over tcp: distribution.transport tcp (fabriccopy.py: plain TCP on the rails'
  addresses, each file read and hashed once on the head, checked by digest on every worker)
- each copy's bytes per rail, read where they pass: the head's tx_bytes of each rail interface
- each copy's CPU time, the whole machine's (/proc/stat: every lab node runs on it), beside the
  floor's: what encryption, rsync and the digests cost, where the time goes

The model is made here: SHARDS shards of random bytes and unequal sizes (as a large model's last
shard is smaller), in a folder beside the lab's model on the head, removed at the end. Pairs of
the sparkbook variants alternate. The copy time is rsync's (03's ModelCopy.seconds), without
the manifests hashed before and after. Needs root and `sparkbook lab up --nodes 4`. Prints the
results and writes them to benchmarks/results/model_copy-lab<N>-<date>.txt.

    .venv/bin/python benchmarks/model_copy.py [--gb 2] [--shards 8] [--pairs 2]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import threading
import time
from pathlib import Path

from sparkbook.book.verdict import Verdict
from sparkbook.distribution import model
from sparkbook.distribution.model import model_checks, sync_model
from sparkbook.lab import Lab
from sparkbook.nodes.remote import Cluster
from sparkbook.params import Params

RESULTS = Path(__file__).resolve().parent / "results"
NAME = "sparkbook-bench-shards"
STAGE = ".sparkbook-bench-stage"
BLOCK = 16 << 20


VARIANTS = {"first": ("first", "ssh"), "all": ("all", "ssh"), "tcp": ("all", "tcp")}  # name: rails, transport


def variant(params: Params, path: str, rails: str, transport: str) -> Params:
    return params.model_copy(update={
        "model": params.model.model_copy(update={"path": path}),
        "distribution": params.distribution.model_copy(update={"rails": rails, "transport": transport,
                                                               "parallel": len(params.workers)})})


class ByProcess:
    """CPU seconds by process name while it runs (``with ByProcess() as cpu: ...; cpu.seconds``):
    every process of the machine sampled from /proc each ``every`` seconds, each one's last reading
    less what it had used before; what a process used after its last sample is missed."""

    def __init__(self, every: float = 1.0):
        self.every, self.stop = every, threading.Event()
        self.start: dict[int, float] = {}
        self.last: dict[int, tuple[str, float]] = {}

    @staticmethod
    def read() -> dict[int, tuple[str, float]]:
        out, tick = {}, os.sysconf("SC_CLK_TCK")
        for pid in (int(d) for d in os.listdir("/proc") if d.isdigit()):
            try:
                stat = Path(f"/proc/{pid}/stat").read_text()
            except OSError:
                continue
            comm, rest = stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2:].split()
            out[pid] = (comm, (int(rest[11]) + int(rest[12])) / tick)  # utime, stime
        return out

    def __enter__(self) -> "ByProcess":
        self.start = {pid: used for pid, (_, used) in self.read().items()}
        self.thread = threading.Thread(target=self.sample, daemon=True)
        self.thread.start()
        return self

    def sample(self) -> None:
        while True:
            self.last.update(self.read())
            if self.stop.wait(self.every):
                return

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join()
        self.last.update(self.read())

    @property
    def seconds(self) -> dict[str, float]:
        by: dict[str, float] = {}
        for pid, (comm, used) in self.last.items():
            by[comm] = by.get(comm, 0) + used - self.start.get(pid, 0)
        return dict(sorted(((k, round(v, 1)) for k, v in by.items() if v >= 0.5), key=lambda kv: -kv[1]))


def cpu_s() -> float:
    """CPU seconds this machine has spent busy, all cores (/proc/stat's cpu line, user to steal)."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    busy = [int(v) for i, v in enumerate(fields[:8]) if i not in (3, 4)]  # not idle, not iowait
    return sum(busy) / os.sysconf("SC_CLK_TCK")


def make_shards(folder: Path, total: int, shards: int) -> list[int]:
    """Shards of random bytes, the last ones smaller (sizes fall by a tenth of the first's in all)."""
    folder.mkdir(parents=True, exist_ok=True)
    weights = [1 - 0.1 * i / max(1, shards - 1) for i in range(shards)]
    sizes = [int(total * w / sum(weights)) for w in weights]
    for i, size in enumerate(sizes, 1):
        with (folder / f"model-{i:05d}-of-{shards:05d}.safetensors").open("wb") as f:
            for start in range(0, size, BLOCK):
                f.write(os.urandom(min(BLOCK, size - start)))
    (folder / "config.json").write_text('{"model_type": "qwen3"}\n')
    return sizes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gb", type=float, default=2.0, help="the model's size")
    ap.add_argument("--shards", type=int, default=8)
    ap.add_argument("--pairs", type=int, default=2, help="alternating rounds of the sparkbook variants")
    args = ap.parse_args()
    lab = Lab()
    params = lab.params()
    if not params.workers:
        raise SystemExit("the lab has no worker: `sparkbook lab up --nodes 4`")
    cluster = Cluster.from_params(params)
    nodes = {n.name: n for n in lab.nodes()}
    head, workers = params.head, params.workers
    path = f"{Path(params.model.path).parent}/{NAME}"
    on = lambda name, sub=NAME: nodes[name].dir / "models" / sub  # noqa: E731  the node's folder, from here
    report: list[str] = []

    def say(line: str) -> None:
        print(line, flush=True)
        report.append(line)

    def clear() -> None:
        for w in workers:
            shutil.rmtree(on(w.name), ignore_errors=True)

    def tx() -> dict[str, int]:
        """The head's bytes sent on each rail (its netdevs' counters, `ip -s link`)."""
        res = cluster.run(["ip", "-j", "-s", "link", "show"], [head]).check("ip -s link")
        links = {li["ifname"]: li["stats64"]["tx"]["bytes"] for li in json.loads(res[head.name].stdout)}
        return {r.interface: links[r.interface] for r in head.rails}

    try:
        sizes = make_shards(on(head.name), int(args.gb * 1e9), args.shards)
        total = sum(sizes)
        say(f"model: {args.shards} shards, {total / 1e9:.2f} GB ({min(sizes) / 1e6:.0f}-{max(sizes) / 1e6:.0f} MB); "
            f"head {head.name} -> {len(workers)} workers; rails {', '.join(r.interface for r in head.rails)}")

        for w in workers:  # the floor's local copies, made beforehand
            shutil.copytree(on(head.name), on(w.name, STAGE), dirs_exist_ok=True)
        stage = f"{Path(path).parent}/{STAGE}"
        t, c = time.perf_counter(), cpu_s()
        cluster.run(["cp", "-a", "--", stage, path], workers, timeout=3600).check("the floor's copy")
        floor_s, floor_cpu = time.perf_counter() - t, cpu_s() - c
        for w in workers:
            shutil.rmtree(on(w.name, STAGE), ignore_errors=True)
        say(f"floor: {len(workers)} x cp -a of a local copy, at once: {floor_s:.1f} s, {floor_cpu:.1f} CPU-s")

        runs: dict[str, list[dict]] = {name: [] for name in VARIANTS}
        copy_cpu: dict[str, float] = {}
        copy_files = model.copy_files

        def counted(*args, **kwargs) -> None:  # the copy's CPU, without the manifests' before and after
            c = cpu_s()
            copy_files(*args, **kwargs)
            copy_cpu["s"] = cpu_s() - c

        model.copy_files = counted
        for _ in range(args.pairs):
            for name, (rails, transport) in VARIANTS.items():
                clear()
                p = variant(params, path, rails, transport)
                before = tx()
                t = time.perf_counter()
                out = sync_model(p, cluster, say=lambda *_: None, show=False)
                took = time.perf_counter() - t
                Verdict("model", model_checks(p, out)).raise_for_failures()
                after = tx()
                copy_s = max(c.seconds for c in out.synced.values())
                wire = {i: after[i] - before[i] for i in after}
                runs[name].append({"copy_s": copy_s, "sync_model_s": round(took, 1), "tx_bytes": wire,
                                   "cpu_s": round(copy_cpu.pop("s"), 1),
                                   "per_worker": {w: c.rails for w, c in out.synced.items()}})
                say(f"sparkbook, rails {rails}, transport {transport}: copy {copy_s:.1f} s ({took:.1f} s with "
                    f"the manifests, {runs[name][-1]['cpu_s']} CPU-s); the head sent "
                    + ", ".join(f"{i} {b / 1e9:.2f} GB" for i, b in wire.items()))
    finally:
        clear()
        shutil.rmtree(on(head.name), ignore_errors=True)

    med = {k: statistics.median(r["copy_s"] for r in v) for k, v in runs.items()}
    cpu = {k: statistics.median(r["cpu_s"] for r in v) for k, v in runs.items()}
    say(json.dumps({"workers": len(workers), "model_bytes": total, "shards": sizes, "floor_s": floor_s,
                    "floor_cpu_s": floor_cpu, "runs": runs}, indent=2))
    for name, label in (("first", "ssh, first rail"), ("all", "ssh, both rails"), ("tcp", "tcp, both rails")):
        split = [min(r["tx_bytes"].values()) / max(r["tx_bytes"].values()) for r in runs[name]]
        say(f"{label + ' / floor:':26} {med[name] / floor_s:.2f} (median of {args.pairs}; goal <= 1.2)  "
            f"{total * len(workers) / med[name] / 1e6:.0f} MB/s to all; {cpu[name]:.1f} CPU-s (floor "
            f"{floor_cpu:.1f}); rail split {', '.join(f'{s:.3f}' for s in split)}")
    say(f"tcp / ssh, both rails:     {med['tcp'] / med['all']:.2f} time, {cpu['tcp'] / cpu['all']:.2f} CPU")
    RESULTS.mkdir(exist_ok=True)
    out_file = RESULTS / f"model_copy-lab{len(params.nodes)}-{time.strftime('%Y-%m-%d')}.txt"
    out_file.write_text("\n".join(report) + "\n")
    print(f"written to {out_file}")


if __name__ == "__main__":
    main()
