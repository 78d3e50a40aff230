"""What a copy of the image records: each worker's transfer, the compression probe, the stream's
result per worker, and the whole copy's outcome (every node's image before and after, by ID and
content), as 03 writes it into the run folder and 02 and 04 read it back. The copy itself is
:mod:`.image`."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TypedDict

from ..facts.identity import ImageIdentity, same_image


class Probe(TypedDict, total=False):
    """The compression choice, and what ``imagestream.py probe`` measured for it."""
    decision: str
    error: str
    pipe_mb_s: dict[str, float]   # worker -> raw SSH pipe throughput
    zstd_mb_s: float
    zstd_ratio: float


class StreamEnd(TypedDict):
    """``imagestream.py stream``'s DONE record of one worker."""
    name: str
    code: int
    sent: int
    wire: int
    skipped: int
    layers_skipped: int
    error: str | None
    output: list[str]
    source: str
    held: int


@dataclass
class Transfer:
    """One worker's copy: what was sent, left out, how fast, and how it ended."""
    node: str
    method: str
    compressed: bool = False
    read_from: str = ""  # what produced the archive: the head's layer store, or docker save
    sent: int = 0        # archive bytes streamed
    wire: int = 0        # bytes through SSH (fewer than sent when compressed)
    skipped: int = 0     # archive bytes left out: layers the worker holds
    layers_held: int = 0  # layers the worker held already: never read, or left out of its stream
    seconds: float = 0.0  # from the start of the copy to the end of this worker's docker load
    via: str = ""        # the worker that relayed the stream to this one ("": the head fed it)
    error: str | None = None
    output: list[str] = field(default_factory=list)
    note: str = ""

    @property
    def rate_mb_s(self) -> float:
        return self.wire / self.seconds / 1e6 if self.seconds else 0.0


@dataclass
class ImageOutcome:
    """What a copy found and did: every node's image before and after (by ID and content), and each
    worker's copy."""
    image: str
    source: str
    head: str
    head_image: ImageIdentity | None
    before: dict[str, ImageIdentity | None]
    after: dict[str, ImageIdentity | None] = field(default_factory=dict)
    transfers: list[Transfer] = field(default_factory=list)
    probe: Probe = field(default_factory=Probe)
    errors: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0
    read: int = 0  # bytes the head's stream process read (rchar): one archive, whatever the workers

    def __post_init__(self) -> None:  # an ID alone stands for an image whose content was not read
        self.head_image = ImageIdentity.of(self.head_image)
        self.before = {n: ImageIdentity.of(i) for n, i in self.before.items()}
        self.after = {n: ImageIdentity.of(i) for n, i in self.after.items()}

    @property
    def reference(self) -> ImageIdentity | None:
        """The image every node must hold: the head's (after a pull, the head's new one)."""
        return self.after.get(self.head) if self.source == "registry" else self.head_image

    @property
    def complete(self) -> bool:
        """Every node holds the reference image (by ID, or by content: :func:`same_image`)."""
        ref = self.reference
        return ref is not None and all(same_image(self.after.get(n), ref)[0] for n in {**self.before, **self.after})

    def to_json(self) -> dict:
        return {**asdict(self), "transfers": [{**asdict(t), "rate_mb_s": round(t.rate_mb_s, 1)}
                                              for t in self.transfers]}
