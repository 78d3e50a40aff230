"""Cheap upgrade candidates on a lab node, made from the lab image (for the upgrade gate's lab test
and benchmarks/upgrade_versions.py): the same image with one more layer, which must be promoted,
and one whose hermes tool parser no longer parses, which must fail 06 and be rolled back."""

from __future__ import annotations

import tempfile
from pathlib import Path

from .nodes import LabError, LabNode, docker

# where the lab image's vLLM keeps the hermes tool parser (Python 3.11 of Debian bookworm)
PARSER = "/opt/venv/lib/python3.11/site-packages/vllm/tool_parsers/hermes_tool_parser.py"
PARSES = "if self.tool_call_start_token not in model_output:"


def _build(node: LabNode, tag: str, dockerfile: str, files: dict[str, str]) -> str:
    """``docker build`` on ``node`` of a context holding ``files``; the new image's ID."""
    with tempfile.TemporaryDirectory() as tmp:
        ctx = Path(tmp)
        for name, text in files.items():
            (ctx / name).write_text(text)
        (ctx / "Dockerfile").write_text(dockerfile)
        docker(node, "build", "-q", "-t", tag, str(ctx), timeout=600)
    return docker(node, "image", "inspect", "--format", "{{.Id}}", tag).stdout.strip()


def layered(node: LabNode, base: str, tag: str) -> str:
    """``base`` with one more layer (a file), as ``tag``: another image that serves alike."""
    return _build(node, tag, f"FROM {base}\nCOPY candidate.txt /etc/sbk-candidate\n",
                  {"candidate.txt": "one more layer\n"})


def broken_parser(node: LabNode, base: str, tag: str) -> str:
    """``base`` whose hermes tool parser finds no tool call in any reply, as ``tag``."""
    docker(node, "create", "--name", "sbk-parser", base)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            docker(node, "cp", f"sbk-parser:{PARSER}", f"{tmp}/parser.py")
            text = Path(tmp, "parser.py").read_text()
    finally:
        docker(node, "rm", "sbk-parser", check=False)
    if PARSES not in text:
        raise LabError(f"{PARSER} in {base} no longer has the line a broken candidate changes: {PARSES!r}")
    return _build(node, tag, f"FROM {base}\nCOPY parser.py {PARSER}\n",
                  {"parser.py": text.replace(PARSES, "if True:  # a parser that no longer parses")})
