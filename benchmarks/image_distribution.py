"""Image distribution on an N-node lab (4: three workers), in one run: sparkbook against the floor.

- floor: every worker loads the same `docker save` archive from a local file, all at the same time
  (on the lab's 2 cores the workers' own `docker load` is the bottleneck)
- sparkbook: the head's image to every worker at once, one read on the head
  (goal: <= 1.3x the floor; the bytes the head's stream process read, its rchar, = one archive)
- sparkbook over tcp: the same with distribution.transport tcp (the stream in plain TCP on the
  fabric, each worker's `docker load` fed by fabriccopy.py pipe), side by side in the same run
- the CPU seconds of the floor and of both copies: the whole machine's (/proc/stat), as every lab
  node runs on it: what SSH's ciphers cost, where the gap to the floor goes
- sparkbook relayed: the same with distribution.parallel 1 (head -> w1 -> w2 -> ...): one read
  whatever the number of workers, the time the relays add
- sparkbook to one worker: what the issue compared against (3 workers took 2.7x this)
- ceiling: the raw SSH pipe head -> worker (2 GiB of zeros into `cat >/dev/null`)
- update: every worker holds the image, the next version adds a top layer (bytes on the wire
  <= 1.2x the new layer); identical: nothing to send (goal <= 3 s)

Uses the lab's serving image (several GB). Needs root and `sparkbook lab up --nodes 4`; leaves
every worker holding the lab image. Prints the results and writes them to
benchmarks/results/image_distribution-lab<N>-<date>.txt.

    .venv/bin/python benchmarks/image_distribution.py [--compress auto|off|on] [--update-mb 64]
"""

from __future__ import annotations

import argparse
import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from sparkbook.distribution.image import ImageOutcome, distribute_image, image_checks
from sparkbook.lab import Lab
from sparkbook.lab.lab import docker
from sparkbook.params import Params
from sparkbook.nodes.remote import Cluster
from sparkbook.nodes.shell import command_line, peer_ssh
from sparkbook.book.verdict import Verdict
from model_copy import ByProcess, cpu_s

RESULTS = Path(__file__).resolve().parent / "results"
ARCHIVE = "/var/tmp/sparkbook-bench-image.tar"


def timed(fn):
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def variant(params: Params, image: str, compress: str, parallel: int | None = None, transport: str = "ssh") -> Params:
    dist = {"compress": compress, "parallel": parallel or params.distribution.parallel, "transport": transport}
    return params.model_copy(update={
        "runtime": params.runtime.model_copy(update={"image": image}),
        "distribution": params.distribution.model_copy(update=dist)})


def copy(params: Params, cluster: Cluster) -> tuple[float, ImageOutcome]:
    """One timed :func:`distribute_image`, which must succeed (its CPU seconds in ``out.cpu_s``)."""
    c = cpu_s()
    with ByProcess() as by:
        took, out = timed(lambda: distribute_image(params, cluster, say=lambda *_: None, show=False))
    out.cpu_s, out.cpu_by = cpu_s() - c, by.seconds
    Verdict("image", image_checks(params, out)).raise_for_failures()
    return took, out


def forget(nodes, image: str) -> None:
    """The workers without the image and without any layer of it."""
    for node in nodes:
        docker(node, "rmi", "-f", image, check=False)
        docker(node, "image", "prune", "-f", check=False)


def per_worker(out: ImageOutcome) -> str:
    return ", ".join(f"{t.node} {t.seconds:.1f} s" + (f" (via {t.via})" if t.via else "") for t in out.transfers)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--compress", default="auto", choices=("auto", "off", "on"),
                    help="distribution.compress for sparkbook's copies (auto: the parameter's default)")
    ap.add_argument("--update-mb", type=int, default=64, help="size of the new top layer")
    ap.add_argument("--copies-only", action="store_true", help="the floor and the two copies to 3 workers "
                    "(ssh, tcp) only, with their CPU by process; results in ...-copies.txt")
    args = ap.parse_args()
    lab = Lab()
    params = lab.params()
    cluster = Cluster.from_params(params)
    head, workers = params.head, params.workers
    if not workers:
        raise SystemExit("the lab has no worker: `sparkbook lab up --nodes 4`")
    image = params.runtime.image
    nodes = {n.name: n for n in lab.nodes()}
    worker_nodes = [nodes[w.name] for w in workers]
    report: list[str] = []

    def say(line: str) -> None:
        print(line, flush=True)
        report.append(line)

    run = lambda cmd: cluster.run(cmd, [head], timeout=3600).check(command_line(cmd)[:60])
    size_of = lambda i: int(run(["docker", "image", "inspect", "--format", "{{.Size}}", i])[head.name].stdout)
    size = size_of(image)
    say(f"image {image}: {size / 1e9:.2f} GB; head {head.name} -> {len(workers)} workers "
        f"({', '.join(w.name for w in workers)}); compression {args.compress}")

    ssh = command_line(peer_ssh(workers[0]))
    pipe_s, _ = timed(lambda: run(f"head -c 2G /dev/zero | {ssh} 'cat >/dev/null'"))
    pipe = 2 * 2**30 / pipe_s / 1e6
    say(f"ceiling: raw SSH pipe {pipe:.0f} MB/s")

    # the floor: every worker loads the same archive from a file at once
    docker(nodes[head.name], "save", "-o", ARCHIVE, image, timeout=3600)
    forget(worker_nodes, image)
    loads: dict[str, float] = {}

    def load(node) -> None:
        loads[node.name], _ = timed(lambda: docker(node, "load", "-i", ARCHIVE, timeout=3600))

    with ThreadPoolExecutor(len(worker_nodes)) as pool, ByProcess() as floor_by:
        c = cpu_s()
        floor_s, _ = timed(lambda: list(pool.map(load, worker_nodes)))
        floor_cpu = cpu_s() - c
    Path(ARCHIVE).unlink()
    say(f"floor: {len(workers)} x docker load -i (same file, at once) {floor_s:.1f} s, {floor_cpu:.0f} CPU-s "
        f"({', '.join(f'{n} {s:.1f} s' for n, s in loads.items())})")

    forget(worker_nodes, image)
    all_s, every = copy(variant(params, image, args.compress), cluster)
    archive = max(t.sent for t in every.transfers)
    stream_s = max(t.seconds for t in every.transfers)  # without the survey, probe and checks
    say(f"sparkbook to {len(workers)} workers: {all_s:.1f} s, the stream {stream_s:.1f} s ({per_worker(every)}); "
        f"{every.cpu_s:.0f} CPU-s; head read {every.read / 1e9:.2f} GB for a {archive / 1e9:.2f} GB archive; "
        f"compression {every.probe.get('decision')}")

    forget(worker_nodes, image)
    tcp_s, tcp = copy(variant(params, image, args.compress, transport="tcp"), cluster)
    tcp_stream_s = max(t.seconds for t in tcp.transfers)
    say(f"sparkbook over tcp to {len(workers)} workers: {tcp_s:.1f} s, the stream {tcp_stream_s:.1f} s "
        f"({per_worker(tcp)}); {tcp.cpu_s:.0f} CPU-s; head read {tcp.read / 1e9:.2f} GB")

    if args.copies_only:
        say(json.dumps({"floor_s": floor_s, "floor_cpu_s": floor_cpu, "sparkbook_s": all_s, "tcp_s": tcp_s,
                        "sparkbook_cpu_s": every.cpu_s, "tcp_cpu_s": tcp.cpu_s,
                        "cpu_by_process": {"floor": floor_by.seconds, "ssh": every.cpu_by, "tcp": tcp.cpu_by}}, indent=2))
        say(f"ssh / floor {all_s / floor_s:.2f}, tcp / floor {tcp_s / floor_s:.2f} (goal <= 1.3)")
        say(f"CPU-s: floor {floor_cpu:.0f}, ssh {every.cpu_s:.0f}, tcp {tcp.cpu_s:.0f}")
        for name, by in (("floor", floor_by.seconds), ("ssh", every.cpu_by), ("tcp", tcp.cpu_by)):
            say(f"  {name:5} by process: " + ", ".join(f"{k} {v:.0f}" for k, v in list(by.items())[:10]))
        out = RESULTS / f"image_distribution-lab{len(params.nodes)}-{time.strftime('%Y-%m-%d')}-copies.txt"
        out.write_text("\n".join(report) + "\n")
        return print(f"written to {out}")

    forget(worker_nodes, image)
    relay_s, relayed = copy(variant(params, image, args.compress, parallel=1), cluster)
    say(f"sparkbook relayed (parallel 1): {relay_s:.1f} s ({per_worker(relayed)}); "
        f"head read {relayed.read / 1e9:.2f} GB")

    forget(worker_nodes[:1], image)
    one_s, one = copy(variant(params, image, args.compress), cluster)
    say(f"sparkbook to 1 worker: {one_s:.1f} s, {one.transfers[0].wire / 1e9:.2f} GB on the wire")

    # the next version: the same image plus a new top layer of random bytes
    nxt = image.rsplit(":", 1)[0] + ":bench-next"
    build = "/var/tmp/sparkbook-bench-next"
    run(["mkdir", "-p", build])
    run(["dd", "if=/dev/urandom", f"of={build}/update.bin", "bs=1M", f"count={args.update_mb}",
         "iflag=fullblock", "status=none"])
    cluster.put_bytes(f"FROM {image}\nCOPY update.bin /opt/update.bin\n".encode(), f"{build}/Dockerfile",
                      [head]).check("write the Dockerfile")
    run(["docker", "build", "-q", "-t", nxt, build])
    run(["rm", "-rf", build])
    layer = size_of(nxt) - size
    p = variant(params, nxt, args.compress)
    upd_s, upd = copy(p, cluster)
    same_s, _ = copy(p, cluster)
    for node in nodes.values():
        docker(node, "rmi", nxt, check=False)
    wire = max(t.wire for t in upd.transfers)

    results = {
        "workers": len(workers), "image_bytes": size, "archive_bytes": archive, "pipe_mb_s": pipe,
        "floor_s": floor_s, "floor_load_s": loads, "sparkbook_s": all_s, "sparkbook_stream_s": stream_s,
        "sparkbook_worker_s": {t.node: t.seconds for t in every.transfers}, "head_read_bytes": every.read,
        "floor_cpu_s": floor_cpu, "sparkbook_cpu_s": every.cpu_s, "tcp_s": tcp_s, "tcp_stream_s": tcp_stream_s,
        "tcp_worker_s": {t.node: t.seconds for t in tcp.transfers}, "tcp_cpu_s": tcp.cpu_s,
        "tcp_head_read_bytes": tcp.read, "cpu_by_process": {"floor": floor_by.seconds, "ssh": every.cpu_by,
                                                             "tcp": tcp.cpu_by},
        "relayed_s": relay_s, "relayed_worker_s": {t.node: t.seconds for t in relayed.transfers},
        "relayed_head_read_bytes": relayed.read, "one_worker_s": one_s,
        "compression": every.probe.get("decision"), "update_s": upd_s, "update_layer_bytes": layer,
        "update_wire_bytes": wire, "identical_s": same_s}
    say(json.dumps(results, indent=2))
    say(f"sparkbook / floor:              {all_s / floor_s:.2f} (goal <= 1.3; the stream alone "
        f"{stream_s / floor_s:.2f})")
    say(f"sparkbook over tcp / floor:     {tcp_s / floor_s:.2f} (goal <= 1.3; the stream alone "
        f"{tcp_stream_s / floor_s:.2f}); head read / archive {tcp.read / archive:.3f}")
    say(f"CPU-s: floor {floor_cpu:.0f}, ssh {every.cpu_s:.0f}, tcp {tcp.cpu_s:.0f}")
    for name, by in (("floor", floor_by.seconds), ("ssh", every.cpu_by), ("tcp", tcp.cpu_by)):
        say(f"  {name:5} by process: " + ", ".join(f"{k} {v:.0f}" for k, v in list(by.items())[:8]))
    say(f"head read / archive:            {every.read / archive:.3f} (goal: 1, one read)")
    say(f"relayed: head read / archive:   {relayed.read / archive:.3f}; time / floor {relay_s / floor_s:.2f}")
    say(f"{len(workers)} workers / 1 worker:          {all_s / one_s:.2f} (the issue saw 2.7)")
    say(f"update wire / new layer:        {wire / layer:.2f} (goal <= 1.2)")
    say(f"identical:                      {same_s:.2f} s (goal <= 3 s)")
    say(f"throughput to all / ceiling:    {size * len(workers) / all_s / 1e6:.0f} / {pipe:.0f} MB/s")
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"image_distribution-lab{len(params.nodes)}-{time.strftime('%Y-%m-%d')}.txt"
    out.write_text("\n".join(report) + "\n")
    print(f"written to {out}")


if __name__ == "__main__":
    main()
