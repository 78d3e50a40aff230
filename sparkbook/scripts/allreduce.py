"""All-reduce sweeps, one process per GPU (or one per CPU node with gloo), started by torchrun on
every node inside the serving image. Copied to the nodes by sparkbook (02_collectives); standard
library and torch only, so it also runs by hand:

    torchrun --nnodes=1 --nproc-per-node=2 allreduce.py --backend nccl --sizes 1048576,2097152 \\
        --latency-sizes 8,16,32,64

Two sweeps in one run of the same ranks: small messages first (``--latency-sizes``: the time of one
all-reduce, which decode at tensor parallel 2 waits on after every layer), then the bandwidth sizes
(``--sizes``). Each size is timed as nccl-tests times it: the ranks start together, the all-reduces
are issued back to back, one sync, the elapsed time divided by their count and averaged over the
ranks. busbw = algbw * 2(n-1)/n, as nccl-tests defines it for all-reduce. Every size is also
checked once: every element must hold the sum of (rank + 1).

Prints `PHASE <name>` lines as it goes, so that a hang can be placed (rendezvous happens in torchrun
before this script starts; then init, first collective, sweep), and rank 0 prints the results as
one `RESULT <json>` line.
"""

import argparse
import datetime
import json
import os
import sys
import time

import torch
import torch.distributed as dist


def phase(name: str) -> None:
    print(f"PHASE {name} rank={os.environ.get('RANK')} t={time.time():.3f}", flush=True)


def sizes(text: str) -> list[int]:
    return [int(s) for s in text.split(",") if s.strip()]


def timed(x: "torch.Tensor", iters: int, sync, world: int) -> float:
    """Seconds per all-reduce of ``x``: ``iters`` issued back to back after a barrier, one sync,
    averaged over the ranks (nccl-tests' timing)."""
    dist.barrier()
    sync()
    start = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(x)
    sync()
    elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64, device=x.device)
    dist.all_reduce(elapsed)
    return elapsed.item() / world / iters


def sweep(label: str, sizes: list[int], iters: int, warmup: int, rank: int, world: int, device,
          sync) -> list[dict]:
    rows = []
    expected = world * (world + 1) / 2  # every rank contributes rank + 1
    for size in sizes:
        n = max(size // 4, 1)
        x = torch.empty(n, dtype=torch.float32, device=device)
        dist.all_reduce(x.fill_(rank + 1))
        sync()
        ok = bool(torch.all(x == expected).item())
        x.zero_()  # timed on zeros: the sums stay zero however many all-reduces run
        for _ in range(warmup):
            dist.all_reduce(x)
        t_op = timed(x, iters, sync, world)
        algbw = n * 4 / t_op / 1e9
        rows.append({"bytes": n * 4, "time_us": t_op * 1e6, "algbw_gbs": algbw,
                     "busbw_gbs": algbw * 2 * (world - 1) / world, "correct": ok})
        phase(f"{label}-{n * 4}-done")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", choices=["nccl", "gloo"], required=True)
    ap.add_argument("--sizes", required=True, help="comma-separated message sizes in bytes")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--latency-sizes", default="", help="comma-separated small sizes in bytes")
    ap.add_argument("--latency-iters", type=int, default=100)
    ap.add_argument("--timeout", type=float, default=300)
    a = ap.parse_args()
    rank, world, local = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ["LOCAL_RANK"])
    phase("started")
    if a.backend == "nccl":
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
        # device_id makes NCCL build its communicator now, not at the first collective
        dist.init_process_group("nccl", timeout=datetime.timedelta(seconds=a.timeout), device_id=device)
        sync = torch.cuda.synchronize
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=a.timeout))
        sync = lambda: None  # noqa: E731
    phase("init-done")
    phase("first-collective")
    probe = torch.ones(1, device=device)
    dist.all_reduce(probe)
    sync()
    phase("first-collective-done")
    latency = sweep("latency", sizes(a.latency_sizes), a.latency_iters, a.warmup, rank, world, device, sync)
    rows = sweep("size", sizes(a.sizes), a.iters, a.warmup, rank, world, device, sync)
    if rank == 0:
        info = {"backend": a.backend, "world_size": world, "torch": torch.__version__,
                "nccl": ".".join(map(str, torch.cuda.nccl.version())) if a.backend == "nccl" else None,
                "iters": a.iters, "latency_iters": a.latency_iters, "rows": rows, "latency": latency}
        print("RESULT " + json.dumps(info), flush=True)
    dist.destroy_process_group()
    phase("done")


if __name__ == "__main__":
    sys.exit(main())
