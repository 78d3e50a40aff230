"""The phases of an engine's start-up, each recognised by the log lines that begin it: vLLM's (05
watches them: sparkbook.serving.startup) and SGLang's (``sparkbook diagnose`` names the phase an
SGLang log reached, as it does vLLM's: no SGLang serving is built here). A hang is told by the
phase its log stopped in (where the last phase line was, and what came after).

SGLang's lines are those its model runner and scheduler write at each step, quoted in public
start-up logs: "Init torch distributed begin." / "Init torch distributed ends." (sglang#15426,
#11716), "Load weight begin." / "Load weight end." (#11716, #15426), "KV Cache is allocated" and
"Memory pool end." (#11716, #11830), "Capture cuda graph begin." / "Capture cuda graph end."
(#11830, #12978), "Uvicorn running on" and "The server is fired up and ready to roll!" (#2468,
#4826). The seed's hang (MiaAI-Lab/Qwen3.8-Flash-Next-Dual-DGX-Sparks#3) stopped in
"distributed init", after "CustomAllreduce is disabled because this process group spans across
nodes" (known_failures.py names it).

Standard library only, like sparkbook.facts.signatures.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable

# Each engine's phases in start-up order: a phase's name (known_failures.PHASES' words) and the
# lines that begin it, case-insensitive.
VLLM: list[tuple[str, str]] = [
    ("ray", r"placement group|Connecting to existing Ray cluster|RayWorkerProc|RayWorkerWrapper"),
    ("distributed init", r"world_size=\d+|init_process_group|NCCL version|distributed_init_method="),
    ("weights", r"Loading weights|Loading safetensors|Starting to load model|Loading model weights"),
    ("compile", r"torch\.compile takes|Compiling a graph|Dynamo bytecode transform|compiled graph"),
    ("kv cache", r"Memory profiling|determine_available_memory|Available KV cache memory|KV cache size|"
                 r"num_gpu_blocks"),
    ("graph capture", r"Capturing CUDA graph|Capturing cudagraph|Graph capturing"),
    ("api", r"Starting vLLM API server|Uvicorn running|Application startup complete|Available routes"),
]
SGLANG: list[tuple[str, str]] = [
    ("distributed init", r"Init torch distributed begin"),
    ("weights", r"Init torch distributed ends|Load weight begin"),
    ("kv cache", r"Load weight end|KV Cache is allocated|Memory pool end|max_total_num_tokens="),
    ("graph capture", r"Capture cuda graph begin"),
    ("api", r"Capture cuda graph end|Uvicorn running on|The server is fired up and ready to roll"),
]
ENGINES = {"vllm": VLLM, "sglang": SGLANG}
_TABLES = {engine: [(name, re.compile(p, re.I)) for name, p in table] for engine, table in ENGINES.items()}
# Lines that only one engine writes: its name in a path or a process, its rank prefix
# ("[2025-10-16 09:06:22 TP5]"), or its own phase lines.
_ENGINE_OF = [("sglang", re.compile(r"sglang|SGLang|\[[\d: -]+ TP\d+|" + "|".join(p for _, p in SGLANG))),
              ("vllm", re.compile(r"vllm|vLLM|VLLM|EngineCore|RayWorkerWrapper"))]


@dataclass
class Reached:
    """The latest phase a log reached (its engine's words), and where (1-based line)."""
    engine: str
    phase: str = ""
    line: int = 0
    text: str = ""


class PhaseScan:
    """Follows a log line by line: which engine wrote it (the first line that says, unless it is
    given), and the latest phase it reached from ``phase`` on. Phases never go back."""

    def __init__(self, engine: str = "", phase: str = ""):
        self.reached = Reached(engine, phase)
        self._lines = 0

    def feed(self, line: str) -> None:
        self._lines += 1
        r = self.reached
        if not r.engine:
            r.engine = next((name for name, rx in _ENGINE_OF if rx.search(line)), "")
            if not r.engine:
                return
        table = _TABLES[r.engine]
        at = next((i for i, (name, _) in enumerate(table) if name == r.phase), -1)
        for i in range(len(table) - 1, at, -1):
            if table[i][1].search(line):
                r.phase, r.line, r.text = table[i][0], self._lines, line.strip()[:300]
                return


def reached(lines: Iterable[str], engine: str = "", phase: str = "") -> Reached:
    """The phase ``lines`` reached from ``phase`` on (``engine`` where it is known, else told from
    the lines)."""
    scan = PhaseScan(engine, phase)
    for line in lines:
        scan.feed(line)
    return scan.reached
