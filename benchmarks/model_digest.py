"""What comparing model files by content costs (model.verify: all), side by side in one run on this
machine: the manifest of a model folder by names and sizes only (model.verify: configs), by SHA-256
on one thread, on every thread (what 01 and 03 run), and again with the digest cache filled (the
second 01). The folder is written here first: --gb of shards of --shard-gb each (the lab's own
model is 1 MB, too small to time).

Reading from the page cache, this measures the hashing; a cold read adds the disk. For a DGX Spark
the README states the cost of a 125 GB model from public rates: its NVMe's sequential read and the
Grace cores' SHA-256 (the sources are named there).

    .venv/bin/python benchmarks/model_digest.py [--gb 4] [--shard-gb 0.5]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sparkbook.facts.manifest import bytes_read, manifest_script  # noqa: E402


def timed(script, env=None) -> tuple[float, str]:
    start = time.perf_counter()
    out = subprocess.run(["bash", "-c", script.program()], capture_output=True, text=True, check=True,
                         env={**os.environ, **(env or {})}).stdout
    return time.perf_counter() - start, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gb", type=float, default=4.0)
    ap.add_argument("--shard-gb", type=float, default=0.5)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="sparkbook-digest-") as tmp:
        model, work = Path(tmp) / "model", Path(tmp) / "work" / "deployment"
        model.mkdir()
        work.parent.mkdir(mode=0o700)
        shard, count = int(args.shard_gb * 1e9), max(1, round(args.gb / args.shard_gb))
        block = os.urandom(1 << 20)
        for i in range(count):
            with open(model / f"model-{i + 1:05d}-of-{count:05d}.safetensors", "wb") as f:
                for _ in range(shard >> 20):
                    f.write(block)
        (model / "config.json").write_text("{}")
        size = sum(f.stat().st_size for f in model.iterdir())
        cache = str(work / "digests.json")
        rows = {}
        rows["sizes (configs)"] = timed(manifest_script(str(model), False))
        one = ROOT / "sparkbook" / "scripts" / "model_manifest.py"
        start = time.perf_counter()  # one thread: the script with THREADS forced to 1
        src = one.read_text().replace("THREADS = max(1, min(8, os.cpu_count() or 1))", "THREADS = 1")
        subprocess.run([sys.executable, "-I", "-c", src, str(model), "all", ".sparkbook-partial"],
                       capture_output=True, check=True)
        rows["SHA-256, 1 thread"] = (time.perf_counter() - start, "")
        rows["SHA-256, all threads"] = timed(manifest_script(str(model), True, cache))
        rows["SHA-256, cached"] = timed(manifest_script(str(model), True, cache))
        full = rows["SHA-256, all threads"][0]
        print(f"{count} shards, {size / 1e9:.2f} GB, {os.cpu_count()} CPUs (page cache warm)")
        result = {"gb": size / 1e9, "cpus": os.cpu_count(), "rows": {}}
        for name, (seconds, out) in rows.items():
            read = bytes_read(out) if out else None
            rate = f"{size / seconds / 1e9:6.2f} GB/s" if "SHA" in name and "cached" not in name else " " * 11
            print(f"  {name:22s} {seconds:7.2f} s  {rate}  x{seconds / full:5.2f} of all threads"
                  + (f"  read {read[0] / 1e9:.2f} GB" if read else ""))
            result["rows"][name] = {"seconds": seconds, "read_bytes": read[0] if read else None}
        out_dir = ROOT / "benchmarks" / "results"
        out_dir.mkdir(exist_ok=True)
        (out_dir / f"model_digest-{time.strftime('%Y-%m-%d')}.json").write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
