"""What each file of a run folder must hold, as far as sparkbook's readers read it (``report``,
``compare``, ``status``): :data:`SHAPES`, by the file's name in the folder. Types are JSON's own (no
text read as a number), numbers finite and within what a page can draw; a field nothing reads is let
be. :func:`check` names the first field that is wrong, in one line (:class:`Unreadable`).
:mod:`sparkbook.record.folder` reads the files and checks them against these.
"""

from __future__ import annotations

import fnmatch
import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, model_validator

from ..bench.records import Results
from ..book.errors import SparkbookError
from ..book.redact import mask
from ..params.fields import field_message, field_path
from .fingerprint import FILE as FINGERPRINT

MAX_WHY = 300  # characters of a reason: one line on a terminal, one cell in a page
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


class Unreadable(SparkbookError):
    """A run folder's file that is there but cannot be believed: ``name`` (relative to the run
    folder) and ``why``, one line."""

    def __init__(self, name: str, why: str):
        self.name, self.why = shown(name), one_line(why)
        super().__init__(f"{self.name}: {self.why}")


def one_line(text: str, limit: int = MAX_WHY) -> str:
    """``text`` masked, as one line (control characters escaped), cut at ``limit``."""
    text = _CONTROL.sub(lambda m: repr(m[0])[1:-1], mask(shown(text)))
    return text if len(text) <= limit else text[: limit - 1] + "…"


def shown(name: str) -> str:
    """A name as it can be printed and written: bytes that were not UTF-8 (a file name's) replaced."""
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


class Shape(BaseModel):
    """Types as JSON gives them (no text read as a number), finite numbers, other fields let be."""

    model_config = ConfigDict(strict=True, allow_inf_nan=False, extra="ignore")


# A measured rate, time or bandwidth: within what a plot's axis can hold (matplotlib overflows
# near 1e308), and what a timedelta can add (a step's duration).
Measured = Annotated[float, Field(ge=0, le=1e12)]
Count = Annotated[int, Field(ge=0, le=2**62)]


def file_name(v: str) -> str:
    if v in ("", ".", "..") or "/" in v or "\\" in v or "\0" in v:
        raise ValueError("must name a file in the run folder itself")
    return v


def _step_id(v: Any) -> Any:
    if isinstance(v, bool) or not isinstance(v, (int, str)):
        raise ValueError("must be a number or a text")
    return v


class Step(Shape):
    step: Annotated[Any, AfterValidator(_step_id)]
    name: str
    notebook: Annotated[str, AfterValidator(file_name)]
    status: str
    duration_s: Annotated[float, Field(ge=0, le=1e9)] = 0.0
    error: str | None = None


class Summary(Shape):
    steps: list[Step]
    deployment: str = ""
    status: str = ""
    started: str = ""
    finished: str | None = None
    params: str = ""


class CheckShape(Shape):
    check: str
    node: str | None = None
    status: Literal["PASS", "WARN", "FAIL", "SKIP"]
    observed: str = ""
    expected: str = ""
    remedy: str = ""
    command: str = ""


class VerdictShape(Shape):
    title: str = ""
    checks: list[CheckShape] = []
    key_numbers: list[Annotated[list[str], Field(min_length=2, max_length=2)]] = []
    taken: str = ""  # ISO 8601; "" in verdicts written before sparkbook kept it
    holds_until: str = ""
    boots: dict[str, str] = {}


class BusbwRow(Shape):
    bytes: Annotated[int, Field(gt=0, le=2**62)]
    busbw_gbs: Measured


class CollectivesResult(Shape):
    rows: list[BusbwRow] = []


class Collectives(Shape):
    result: CollectivesResult | None = None


class Serving(Shape):
    action: str | None = None
    ready: bool = False
    seconds: Measured | None = None


class Stats(Shape):
    p50: Measured | None = None
    p99: Measured | None = None


class Request(Shape):
    index: Any


class Level(Shape):  # LevelResult's fields without a default must be there; what is read, typed
    kind: Any
    label: str
    endpoint: Any
    prompt_tokens: Any
    output_tokens: Any
    concurrency: Annotated[int, Field(gt=0, le=2**31)] | None
    request_rate: Any
    num_requests: Any
    seed: Any
    depth: Count | None = None
    failures: Count = 0
    output_tok_s: Measured = 0.0
    decode_tok_s: Measured | None = None
    prefill_tok_s: Measured | None = None
    ttft_ms: Stats = Stats()
    requests: list[Request] = []


class ResultsShape(Shape):  # Results' fields without a default must be there
    model: Any
    base_url: Any
    endpoint: Any
    started: str
    seed: Any
    benchmark: dict[str, Any]
    depths: list[Level] = []
    concurrency: list[Level] = []
    rates: list[Level] = []


class FpSparkbook(Shape):
    commit: str | None = None


class FpImage(Shape):
    digests: list[Any] = []


class FpModel(Shape):
    commit: str | None = None
    files: int | None = None
    bytes: float = 0.0

    @model_validator(mode="after")
    def _sized(self) -> "FpModel":
        if self.files is not None and "bytes" not in self.model_fields_set:
            raise ValueError("bytes: required where files is given")
        return self


class FpServing(Shape):
    flags: list[str] = []
    env: dict[str, Any] = {}
    ran: dict[str, Any] = {}
    timeline: dict[str, Any] = {}


class FpNode(Shape):
    name: str


class FingerprintShape(Shape):
    sparkbook: FpSparkbook = FpSparkbook()
    created: str = ""
    image: FpImage = FpImage()
    versions: dict[str, Any] = {}
    model: FpModel = FpModel()
    serving: FpServing = FpServing()
    layout: dict[str, Any] = {}
    nodes: list[FpNode] = []
    benchmark: dict[str, Any] = {}
    unread: dict[str, Any] = {}


class NotebookShape(Shape):  # then nbformat's own schema
    nbformat: Literal[4]
    metadata: dict[str, Any] = {}
    cells: list[dict[str, Any]]


class Mapping(Shape):
    """Any JSON object (its fields are read with defaults)."""


# Every JSON file read from a run folder, by its name there (a pattern for the verdicts), and its shape.
SHAPES: dict[str, type[Shape]] = {
    "summary.json": Summary,                  # sparkbook run's: the steps, their status and time
    "verdicts/*.json": VerdictShape,          # each notebook's last cell: its checks, key numbers
    FINGERPRINT: FingerprintShape,            # what ran (sparkbook.record.fingerprint)
    "collectives.json": Collectives,          # 02's all-reduce sweep
    "serving.json": Serving,                  # 05's start (or keep) of vLLM
    Results.FILE: ResultsShape,               # 07's benchmark
    "image_inspection.json": Mapping,         # 04/05's inspection of the serving image
    "*.ipynb": NotebookShape,                 # each step's executed notebook
}


def shape_of(name: str) -> type[Shape]:
    return next(s for pattern, s in SHAPES.items() if fnmatch.fnmatchcase(name, pattern))


def check(name: str, data: dict, shape: type[Shape] | None = None) -> Shape:
    """``data`` (the content of ``name``) validated against its shape; Unreadable naming the first
    field that is wrong."""
    try:
        return (shape or shape_of(name)).model_validate(data)
    except ValidationError as e:
        first = e.errors()[0]
        if first["type"] in ("model_type", "model_attributes_type", "dict_type"):  # not "instance of Step"
            first = {**first, "msg": "Input should be a JSON object"}
        more = f" (and {e.error_count() - 1} more)" if e.error_count() > 1 else ""
        raise Unreadable(name, f"{field_path(first['loc'])}: {field_message(first)}{more}") from None
