"""Image distribution on the lab, side by side in one run: the community method against sparkbook.

- ceiling: the raw SSH pipe head -> worker (2 GiB of zeros into `cat >/dev/null`)
- baseline: `docker save -o FILE` on the head, then `cat FILE | ssh worker docker load`
- sparkbook cold: the worker holds no layer of the image (goal <= 0.75x the baseline)
- sparkbook update: the worker holds the previous version, the new one adds a top layer
  (goal <= 0.25x the cold baseline; bytes on the wire <= 1.2x the new layer)
- sparkbook identical: nothing to send (goal <= 3 s)

Uses the lab's serving image (several GB). Needs root and `sparkbook lab up` (2 nodes); leaves the
worker holding the lab image.

    .venv/bin/python benchmarks/image_distribution.py [--compress off|auto|on] [--update-mb 64]
"""

from __future__ import annotations

import argparse
import json
import time

from sparkbook.distribution.image import ImageOutcome, distribute_image, image_checks
from sparkbook.lab import Lab
from sparkbook.lab.lab import docker
from sparkbook.params import Params
from sparkbook.remote import Cluster, command_line, peer_ssh, sh
from sparkbook.verdict import Verdict


def timed(fn):
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def with_image(params: Params, image: str, compress: str) -> Params:
    return params.model_copy(update={
        "runtime": params.runtime.model_copy(update={"image": image}),
        "distribution": params.distribution.model_copy(update={"compress": compress})})


def copy(params: Params, cluster: Cluster) -> tuple[float, ImageOutcome]:
    """One timed :func:`distribute_image`, which must succeed."""
    took, out = timed(lambda: distribute_image(params, cluster, say=lambda *_: None, show=False))
    Verdict("image", image_checks(params, out)).raise_for_failures()
    return took, out


def forget(lab: Lab, node, image: str) -> None:
    """The worker without the image and without any layer of it."""
    docker(node, "rmi", "-f", image, check=False)
    docker(node, "image", "prune", "-f", check=False)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--compress", default="off", choices=("off", "auto", "on"))
    ap.add_argument("--update-mb", type=int, default=64, help="size of the new top layer")
    args = ap.parse_args()
    lab = Lab()
    params = lab.params()
    cluster = Cluster.from_params(params)
    head, worker = params.head, params.workers[0]
    image = params.runtime.image
    nodes = {n.name: n for n in lab.nodes()}
    run = lambda cmd: cluster.run(cmd, [head], timeout=3600).check(command_line(cmd)[:60])
    size_of = lambda i: int(run(["docker", "image", "inspect", "--format", "{{.Size}}", i])[head.name].stdout)
    size = size_of(image)
    print(f"image {image}: {size / 1e9:.2f} GB; head {head.name} -> worker {worker.name}")

    ssh = command_line(peer_ssh(worker))
    pipe_s, _ = timed(lambda: run(f"head -c 2G /dev/zero | {ssh} 'cat >/dev/null'"))
    pipe = 2 * 2**30 / pipe_s / 1e6
    print(f"ceiling: raw SSH pipe {pipe:.0f} MB/s")

    forget(lab, nodes[worker.name], image)
    tar = "/var/tmp/sparkbook-bench-image.tar"
    save_s, _ = timed(lambda: run(["docker", "save", "-o", tar, image]))
    load_s, _ = timed(lambda: run(sh("cat {t} | ", t=tar) + ssh + " docker load"))
    run(["rm", "-f", tar])
    base = save_s + load_s
    print(f"baseline: save -o {save_s:.1f} s + cat | ssh | load {load_s:.1f} s = {base:.1f} s")

    forget(lab, nodes[worker.name], image)
    p = with_image(params, image, args.compress)
    cold_s, cold = copy(p, cluster)
    print(f"sparkbook cold: {cold_s:.1f} s, {cold.transfers[0].wire / 1e9:.2f} GB on the wire "
          f"({cold.probe.get('decision')})")

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
    p = with_image(params, nxt, args.compress)
    upd_s, upd = copy(p, cluster)
    same_s, _ = copy(p, cluster)
    for n in (head, worker):
        docker(nodes[n.name], "rmi", nxt, check=False)
    wire = upd.transfers[0].wire

    results = {
        "image_bytes": size, "pipe_mb_s": pipe, "baseline_s": base, "baseline_save_s": save_s,
        "baseline_load_s": load_s, "cold_s": cold_s, "cold_wire_bytes": cold.transfers[0].wire,
        "compression": cold.probe.get("decision"), "update_s": upd_s, "update_layer_bytes": layer,
        "update_wire_bytes": wire, "identical_s": same_s}
    print(json.dumps(results, indent=2))
    print(f"cold / baseline:            {cold_s / base:.2f} (goal <= 0.75)")
    print(f"update / cold baseline:     {upd_s / base:.2f} (goal <= 0.25)")
    print(f"update wire / new layer:    {wire / layer:.2f} (goal <= 1.2)")
    print(f"identical:                  {same_s:.2f} s (goal <= 3 s)")
    print(f"cold throughput / ceiling:  {size / cold_s / 1e6:.0f} / {pipe:.0f} MB/s = "
          f"{size / cold_s / 1e6 / pipe:.2f}")


if __name__ == "__main__":
    main()
