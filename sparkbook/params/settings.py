"""The sections of a parameters file that set what the hardware is expected to deliver and how the
steps measure and copy (expectations, collectives, distribution, benchmark, smoke); the deployment
itself (nodes, runtime, model, serving, ports) is in :mod:`sparkbook.params`."""

from __future__ import annotations

from typing import Any, Literal

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from . import profiles
from .fields import DAY

# Upper bounds shared by several fields: far above any deployment, low enough that a typo (an extra
# zero, bytes for megabytes) is an error rather than a run that never ends.
TOKENS = 2**24     # a prompt or an output (the longest contexts served are 10M tokens)
CONTEXT = 2**31 - 1  # serving.max_model_len: a context too long for memory is the memory fit's
                     # to refuse (01, 05), with the numbers and the remedy
COUNT = 100_000    # requests, iterations
PARALLEL = 4096    # requests in flight, threads
GPUS = 64          # per node
SEED = 2**32 - 1   # what every random generator takes


class Section(BaseModel):
    """A section of a parameters file: unknown fields are errors, values never change, and every
    number is finite (YAML's .inf and .nan are floats)."""
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class Expectations(Section):
    gpu_name: str | None = Field(None, description="e.g. 'NVIDIA GB10'; None skips the name check")
    gpus_per_node: int = Field(1, ge=0, le=GPUS)
    mtu: int = Field(9000, ge=576, le=65535)
    link_rate_gbps: float = Field(200, gt=0, le=10_000)
    busbw_gbps: float = Field(21.875, gt=0, le=10_000, description="all-reduce bus bandwidth bar, GB/s")
    min_disk_gb: float = Field(0, ge=0, le=1_000_000)
    driver: str | None = Field(None, description="the NVIDIA driver versions allowed, as PEP 440 "
                               "specifiers (e.g. '>=580.95'); None: any, as long as every node has the same")
    firmware: str | None = Field(None, description="the ConnectX-7 firmware versions allowed, as PEP 440 "
                                 "specifiers (e.g. '>=28.45'); None: any, as long as every node has the same")
    allreduce_latency_us: float | None = Field(None, gt=0, le=1_000_000, description="the small-message "
                                               "all-reduce time bar, microseconds; None: reported, not "
                                               "judged")
    memory_bandwidth_gbs: float | None = Field(None, gt=0, le=100_000, description="each node's memory "
                                               "bandwidth, GB/s (GB10: 273): the ceiling of single-user "
                                               "decode speed (07's plausibility rows); None: not judged")
    rdma_gbps: float | None = Field(None, gt=0, le=10_000, description="each rail's RDMA write "
                                    "bandwidth bar, one direction, Gb/s (ib_write_bw's average, 02); "
                                    "None: reported and compared between directions, not held to a bar")
    rdma_latency_us: float | None = Field(None, gt=0, le=1_000_000, description="each rail's RDMA "
                                          "write latency bar, microseconds (ib_write_lat's typical); "
                                          "None: reported, not judged")
    rdma_source: str = Field("", max_length=500, description="where the RDMA bars come from (a "
                             "measurement, a public source): shown beside them in 02's verdict")
    verdicts_hold_h: float = Field(24, gt=0, le=24 * 365, description="how long a step's verdict holds "
                                   "for the steps that build on it, hours (05 and 07 refuse a preflight "
                                   "older than this); a reboot of a node it read ends it sooner")

    @field_validator("driver", "firmware")
    @classmethod
    def _specifier(cls, v: str | None) -> str | None:
        """A PEP 440 specifier set (``>=580.95,<590``), checked here so that a typo is a parameters
        error naming the field, not a preflight crash."""
        if v is not None:
            try:
                SpecifierSet(v)
            except InvalidSpecifier:
                raise ValueError(f"{v!r} is not a version range: write PEP 440 specifiers such as "
                                 "'>=580.95' or '>=580.95,<590'") from None
        return v


class Rdma(Section):
    """02's measurement of each cable: perftest's ``ib_write_bw`` one way, the other way and both at
    once, and ``ib_write_lat``, between every pair of nodes on every rail (nodes on the rail's subnet),
    disjoint pairs at the same time."""

    run: Literal["auto", "on", "off"] = Field(
        "auto", description="auto: on the rails that name their HCA, where perftest is installed (a "
        "node without it is a SKIP); on: a node without perftest fails; off: not measured")
    duration_s: float = Field(3, gt=0, le=600, description="seconds of each bandwidth test (ib_write_bw -D)")
    size: int = Field(65536, ge=2, le=2**30, description="message size in bytes of the bandwidth "
                      "tests (-s; perftest's default; on GB10 ib_write_bw fails above 64 KiB: "
                      "linux-rdma/perftest#394)")
    qps: int = Field(4, ge=1, le=64, description="queue pairs of each bandwidth test (-q; NVIDIA's "
                     "check-connectx-bandwidth for DGX Spark uses 4)")
    latency_iters: int = Field(1000, ge=5, le=COUNT, description="round trips of the latency test (ib_write_lat -n)")
    port: int = Field(18515, ge=1, le=65535, description="the TCP port perftest's server takes the "
                      "client's connection details on (perftest's default)")


class Collectives(Section):
    """The all-reduce sweeps of 02_collectives: bandwidth (MB sizes) and small messages (latency),
    in one run of the same ranks."""

    min_size_mb: float = Field(1, gt=0, le=65536)
    max_size_mb: float = Field(1024, gt=0, le=65536, description="at most 64 GiB")
    iters: int = Field(20, ge=1, le=COUNT)
    warmup: int = Field(5, ge=0, le=COUNT)
    latency_min_bytes: int = Field(8, ge=1, le=2**30,
                                   description="smallest size of the small-message sweep")
    latency_max_bytes: int = Field(2**20, ge=1, le=2**30,
                                   description="largest size of the small-message sweep")
    latency_iters: int = Field(100, ge=1, le=COUNT, description="all-reduces per small size, issued back to "
                               "back and timed together, as nccl-tests does")
    timeout_s: float = Field(600, gt=0, le=DAY, description="hard limit for the whole sweep")
    backend: Literal["auto", "nccl", "gloo"] = Field("auto", description="auto: nccl with GPUs, else gloo")
    master_port: int | None = Field(None, ge=1, le=65535, description="default: ports.master + 1")
    pairs: Literal["auto", "off"] = Field("auto", description="auto: when the all-reduce across "
                                          "more than two nodes fails or is below its bar, 02 runs it "
                                          "on every pair of nodes and names the node or link at "
                                          "fault; off: never")
    rdma: Rdma = Field(default_factory=Rdma, description="02's measurement of each "
                         "cable: perftest between every pair of nodes on every rail")

    @field_validator("min_size_mb")
    @classmethod
    def _a_byte_at_least(cls, v: float) -> float:
        if v * 2**20 < 1:  # the sweep doubles from its smallest size, and 0 bytes doubles forever
            raise ValueError("must be at least one byte (1/1048576 MB)")
        return v

    @model_validator(mode="after")
    def _ranges(self) -> "Collectives":
        for low, high, unit in (("min_size_mb", "max_size_mb", "MB"),
                                ("latency_min_bytes", "latency_max_bytes", "bytes")):
            if getattr(self, low) > getattr(self, high):
                raise ValueError(f"{low} ({getattr(self, low):g} {unit}) is above {high} "
                                 f"({getattr(self, high):g} {unit}): the sweep would be empty")
        return self

    def sizes(self) -> list[int]:
        """Powers of two from the smallest to the largest size, in bytes."""
        return _doubling(int(self.min_size_mb * 2**20), self.max_size_mb * 2**20)

    def latency_sizes(self) -> list[int]:
        """The small-message sweep's sizes: powers of two, in bytes."""
        return _doubling(self.latency_min_bytes, self.latency_max_bytes)


def _doubling(size: int, top: float) -> list[int]:
    out = []
    while size <= top:
        out.append(size)
        size *= 2
    return out


class Distribution(Section):
    """How 03 gets the image and the model onto every node."""
    source: Literal["head", "registry"] = Field(
        "head", description="head: stream the head's image to the workers over SSH; registry: "
        "`docker pull` on every node")
    compress: Literal["auto", "on", "off"] = Field(
        "auto", description="zstd on the stream; auto: when both ends have zstd and it outruns the pipe")
    reader: Literal["auto", "container", "docker-save"] = Field(
        "auto", description="auto: read the head's layers straight from Docker's layer store "
        "(overlay2), which starts at once, in a throwaway container of the image where the SSH user "
        "cannot read Docker's folder (container: always so); docker-save: always `docker save`, "
        "which first copies the whole image into a temporary folder")
    parallel: int = Field(4, ge=1, le=256, description="workers the head streams the image to itself; beyond "
                          "that, each of those passes the stream on to at most this many more (a "
                          "tree), so one read on the head feeds every worker")
    timeout_s: float = Field(3600, gt=0, le=DAY, description="limit for one image or model copy")
    model_sync: bool = Field(True, description="copy the model from the head where a worker's "
                             "differs; off where the model lives on shared storage (NFS)")
    rails: Literal["all", "first"] = Field(
        "all", description="all: a model copy splits its files over every rail the two nodes share a "
        "network on (a Spark's twins), by size, and a rail that fails hands its files to the first; "
        "first: the first rail only")
    transport: Literal["ssh", "tcp"] = Field(
        "ssh", description="the data path of the image and model copies: ssh (encrypted; rsync resumes "
        "partial model files); tcp: plain TCP on the fabric address (the control and a one-time key "
        "still over SSH), each connection authenticated and every byte checked by digest on arrival, "
        "but readable by anyone on the fabric: only where the fabric is a private cable or network")
    delete_extras: bool = Field(False, description="delete files a worker holds under model.path "
                                "that the head lacks (named in 03's verdict); by default they are "
                                "kept and reported as a WARN")


class Reference(Section):
    label: str
    single_user_tok_s: float | None = Field(None, gt=0, le=1_000_000)


class Benchmark(Section):
    context_depths: list[int] = Field(default_factory=lambda: [0, 4096, 16384])
    concurrency: list[int] = Field(default_factory=lambda: [1, 2, 4, 8])
    output_tokens: int = Field(256, ge=1, le=TOKENS)
    prompt_tokens: int = Field(512, ge=1, le=TOKENS)
    requests_per_level: int = Field(16, ge=1, le=COUNT)
    request_rates: list[float] = Field(default_factory=list, description="requests per second of the "
                                       "open-loop levels, each above 0 and at most 10000")
    seed: int = Field(0, ge=0, le=SEED)
    references: list[Reference] = Field(default_factory=list)
    profile: str | None = Field(None, description="a standard grid by name (sparkbook.params.profiles: "
                                "'spark-arena'): it sets context_depths × concurrency and the prompt and "
                                "output lengths; None: the fields as given")

    @model_validator(mode="before")
    @classmethod
    def _profile(cls, data: Any) -> Any:
        return profiles.apply(data) if isinstance(data, dict) else data

    @field_validator("concurrency", "context_depths")
    @classmethod
    def _non_negative(cls, v: list[int], info: ValidationInfo) -> list[int]:
        if any(x < 0 for x in v):
            raise ValueError("values must not be negative")
        top = TOKENS if info.field_name == "context_depths" else PARALLEL
        if any(x > top for x in v):
            raise ValueError(f"values must be at most {top}")
        return v

    @field_validator("request_rates")
    @classmethod
    def _rates(cls, v: list[float]) -> list[float]:
        # arrivals come 1/rate seconds apart on average: a rate of 0 divides by zero
        if any(not 0 < r <= 10_000 for r in v):
            raise ValueError("each rate must be above 0 and at most 10000 requests per second")
        return v


class Smoke(Section):
    """06's burn-in (:mod:`sparkbook.smoke.burnin`: sequential requests of mixed lengths, then a soak at
    a set concurrency) and its known answers (:mod:`sparkbook.smoke.known_answers`)."""

    requests: int = Field(20, ge=1, le=COUNT,
                          description="burn-in: sequential requests, lengths drawn from the ranges")
    prompt_tokens: tuple[int, int] = Field((16, 2048), description="burn-in: [smallest, largest] prompt")
    output_tokens: tuple[int, int] = Field((16, 256), description="burn-in: [smallest, largest] output")
    soak_s: float = Field(60, ge=0, le=DAY, description="the soak's length in seconds; 0: no soak")
    soak_concurrency: int = Field(4, ge=1, le=PARALLEL, description="requests in flight during the soak")
    soak_prompt_tokens: int = Field(512, ge=1, le=TOKENS)
    soak_output_tokens: int = Field(128, ge=1, le=TOKENS)
    drift_limit: float = Field(1.5, gt=1, le=100, description="the soak's median end-to-end latency of "
                               "its last third of requests may be at most this many times its first third's "
                               "(a larger slowdown fails only when a rank test finds it consistent)")
    seed: int = Field(0, ge=0, le=SEED)
    known_answer_tokens: int = Field(32, ge=1, le=TOKENS,
                                     description="output tokens of each known answer (greedy)")
    timeout_s: float = Field(120, gt=0, le=DAY, description="limit for one request")

    @field_validator("prompt_tokens", "output_tokens")
    @classmethod
    def _range(cls, v: tuple[int, int]) -> tuple[int, int]:
        if not 1 <= v[0] <= v[1] <= TOKENS:
            raise ValueError(f"a range is [smallest, largest], both at least 1 and at most {TOKENS}")
        return v


def relay_plan(head: str, workers: list[str], parallel: int) -> dict[str, list[str]]:
    """Who feeds whom: the head feeds the first ``parallel`` workers, and every worker at most
    ``parallel`` more (a worker's link is no wider than the head's), level by level, each feeder's
    first before any feeder's second: the shallowest tree, relays evenly loaded. With ``parallel``
    1, a chain. Only feeders appear."""
    plan: dict[str, list[str]] = {}
    level, rest = [head], list(workers)
    while rest:
        fed = []
        for _ in range(parallel):
            for feeder in level:
                if rest:
                    plan.setdefault(feeder, []).append(rest[0])
                    fed.append(rest.pop(0))
        level = fed
    return plan
