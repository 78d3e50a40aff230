"""Standard benchmark profiles: the grid of a public leaderboard, selectable by name
(``benchmark.profile``), so that a run can be set beside published results.

``spark-arena``: the public DGX Spark leaderboard (https://spark-arena.com/leaderboard). Its
results come from llama-benchy driven by sparkrun with the profile ``spark-arena-v1``
(https://github.com/spark-arena/recipe-registry/blob/ff7394d4305cb763c142d2aee0dcdcc0d99f891a/
benchmarking/spark-arena-v1.yaml): every context depth 0, 4096, 8192, 16384, 32768, 65535 and
100000 at every concurrency 1, 2, 5 and 10, a 2048-token prompt and 128 output tokens, three runs
of each cell (llama-benchy's default ``--runs``; sparkrun's ``estimate_test_count``,
https://github.com/spark-arena/sparkrun/blob/1645c135ce241e9f08ba3e12316c7cdf4ec0eb1a/src/sparkrun/
benchmarking/llama_benchy.py). The levels are labelled as llama-benchy names its decode rows
(``tg128 @ d4096 (c2)``; ``tg128 (c1)`` at depth 0), so a row reads against the leaderboard's.

How it compares: the profile's cells are measured as the leaderboard measures them
(:mod:`sparkbook.bench.board`, llama-benchy 0.4.0's procedure and figures): the context loaded
into the prefix cache first and only the new tokens prefilled, the server's sampling with EOS
allowed, its totals; sparkbook's stricter figures of the same requests stay beside them under
their own names. ``benchmarks/bench_vs_llamabenchy.py`` runs both tools on one endpoint.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

GRID_FIELDS = ("context_depths", "concurrency", "prompt_tokens", "output_tokens")


@dataclass(frozen=True)
class Profile:
    name: str
    context_depths: tuple[int, ...]
    concurrency: tuple[int, ...]
    prompt_tokens: int
    output_tokens: int
    source: str

    def fields(self) -> dict[str, Any]:
        """The ``benchmark`` fields the profile sets."""
        return {"context_depths": list(self.context_depths), "concurrency": list(self.concurrency),
                "prompt_tokens": self.prompt_tokens, "output_tokens": self.output_tokens}

    def label(self, depth: int, concurrency: int) -> str:
        """The level's name as llama-benchy names the decode row of the same cell."""
        where = f" @ d{depth}" if depth else ""
        many = f" (c{concurrency})" if max(self.concurrency) > 1 else ""
        return f"tg{self.output_tokens}{where}{many}"


PROFILES = {
    "spark-arena": Profile(
        "spark-arena", (0, 4096, 8192, 16384, 32768, 65535, 100000), (1, 2, 5, 10), 2048, 128,
        "https://github.com/spark-arena/recipe-registry/blob/ff7394d4305cb763c142d2aee0dcdcc0d99f891a/"
        "benchmarking/spark-arena-v1.yaml"),
}


def get(name: str | None) -> Profile | None:
    """The profile of that name; None for None. A KeyError naming the known ones otherwise."""
    if name is None:
        return None
    if name not in PROFILES:
        raise KeyError(f"unknown benchmark profile {name!r}: known are {', '.join(PROFILES)}")
    return PROFILES[name]


def apply(data: dict[str, Any]) -> dict[str, Any]:
    """The ``benchmark`` section with its profile's grid filled in. A field given with another
    value than the profile's is an error that names it (a run that says ``spark-arena`` but ran
    another grid would not compare); the same value is allowed. Other fields (seed, request
    rates, references) stay the caller's."""
    try:
        prof = get(data.get("profile"))
    except KeyError as e:
        raise ValueError(e.args[0]) from None
    if prof is None:
        return data
    grid = prof.fields()
    clash = [f"{k} {data[k]!r} (the profile's: {v!r})" for k, v in grid.items()
             if k in data and _same(data[k]) != _same(v)]
    if clash:
        raise ValueError(f"profile {prof.name!r} sets the grid; remove or match: " + "; ".join(clash))
    return {**data, **grid}


def _same(v: Any) -> Any:
    return [int(x) for x in v] if isinstance(v, (list, tuple)) else v
