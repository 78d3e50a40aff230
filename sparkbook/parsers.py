"""Parsers of the outputs of node tools, tested on real outputs captured on DGX Spark
(../shared/field-samples, each naming its public source)."""

from __future__ import annotations

import re

NOT_AVAILABLE = ("[N/A]", "N/A", "[Not Supported]", "Not Supported", "")


def _value(v: str) -> str | None:
    v = v.strip()
    return None if v in NOT_AVAILABLE else v


def parse_nvidia_smi_csv(text: str, fields: list[str] | None = None) -> list[dict[str, str | None]]:
    """Rows of ``nvidia-smi --query-gpu=... --format=csv[,noheader]``.

    With a header line the keys come from it (``memory.total [MiB]`` becomes ``memory.total``);
    without one, ``fields`` names the columns. Repeated headers (several nodes' outputs
    concatenated, as with srun) are skipped. GB10 answers ``[N/A]`` for memory: such values are None.
    """
    keys = fields
    rows = []
    for line in text.splitlines():
        if not line.strip():
            continue
        cols = [c.strip() for c in line.split(",")]
        if cols[0] == "name" or (fields and cols == fields) or cols[0].startswith(("index", "name ")):
            keys = [re.sub(r"\s*\[.*\]$", "", c) for c in cols]
            continue
        if keys is None:
            raise ValueError("nvidia-smi CSV without a header: pass the queried fields")
        if len(cols) != len(keys):
            raise ValueError(f"nvidia-smi CSV row has {len(cols)} columns, expected {len(keys)}: {line!r}")
        rows.append({k: _value(v) for k, v in zip(keys, cols)})
    return rows


def parse_sections(text: str, marker: str = "@@ ") -> dict[str, str]:
    """Split a script's output into named sections: lines ``@@ name`` start each section."""
    sections: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        if line.startswith(marker):
            current = line[len(marker):].strip()
            sections[current] = []
        elif current is not None:
            sections[current].append(line)
    return {k: "\n".join(v).strip("\n") for k, v in sections.items()}


def parse_key_values(text: str) -> dict[str, str]:
    """``key=value`` lines (values may hold '=')."""
    out = {}
    for line in text.splitlines():
        if "=" in line:
            k, v = line.split("=", 1)
            out[k.strip()] = v.strip()
    return out
