"""All-reduce bandwidth sweep, one process per GPU (or one per CPU node with gloo), started by
torchrun on every node inside the serving image. Copied to the nodes by sparkbook (02_collectives).

Prints `PHASE <name>` lines as it goes, so that a hang can be placed (rendezvous happens in torchrun
before this script starts; then init, first collective, sweep), and rank 0 prints the results as
one `RESULT <json>` line. busbw = algbw * 2(n-1)/n, as nccl-tests defines it for all-reduce.
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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", choices=["nccl", "gloo"], required=True)
    ap.add_argument("--sizes", required=True, help="comma-separated message sizes in bytes")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
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
    rows = []
    expected = world * (world + 1) / 2  # every rank contributes rank + 1
    for size in (int(s) for s in a.sizes.split(",")):
        n = max(size // 4, 1)
        x = torch.empty(n, dtype=torch.float32, device=device)
        for _ in range(a.warmup):
            dist.all_reduce(x.fill_(rank + 1))
        sync()
        elapsed = 0.0
        ok = True
        for _ in range(a.iters):
            x.fill_(rank + 1)
            sync()
            dist.barrier()
            t = time.perf_counter()
            dist.all_reduce(x)
            sync()
            elapsed += time.perf_counter() - t
            ok = ok and bool(torch.all(x == expected).item())
        t_op = elapsed / a.iters
        algbw = n * 4 / t_op / 1e9
        rows.append({"bytes": n * 4, "time_us": t_op * 1e6, "algbw_gbs": algbw,
                     "busbw_gbs": algbw * 2 * (world - 1) / world, "correct": ok})
        phase(f"size-{n * 4}-done")
    if rank == 0:
        info = {"backend": a.backend, "world_size": world, "torch": torch.__version__,
                "nccl": ".".join(map(str, torch.cuda.nccl.version())) if a.backend == "nccl" else None,
                "rows": rows}
        print("RESULT " + json.dumps(info), flush=True)
    dist.destroy_process_group()
    phase("done")


if __name__ == "__main__":
    sys.exit(main())
