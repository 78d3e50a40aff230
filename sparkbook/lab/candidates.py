"""Cheap upgrade candidates on a lab node, made from the lab image (for the upgrade gate's lab test
and benchmarks/upgrade_versions.py): the same image with one more layer, which must be promoted;
one whose hermes tool parser no longer parses, which must fail 06; and one whose ``vllm`` is a
wrapper that adds an argument, as community images' wrappers and mods do, which must fail 05 (the
configuration that ran). Each failing one must be rolled back."""

from __future__ import annotations

import tempfile
from pathlib import Path

from .nodes import LabError, LabNode, docker

# where the lab image's vLLM keeps the hermes tool parser (Python 3.11 of Debian bookworm)
PARSER = "/opt/venv/lib/python3.11/site-packages/vllm/tool_parsers/hermes_tool_parser.py"
PARSES = "if self.tool_call_start_token not in model_output:"
VLLM = "/opt/venv/bin/vllm"  # the lab image's vllm command, a console script of its venv
# where the wrapper finds the real one: a path whose command line still reads "vllm serve"
REAL_VLLM = "/opt/venv/lib/wrapped/vllm"
ADDED = ("--max-num-seqs", "7")  # what the wrapper adds to vllm serve


def _build(node: LabNode, tag: str, dockerfile: str, files: dict[str, str]) -> str:
    """``docker build`` on ``node`` of a context holding ``files`` (executable, as COPY keeps
    them); the new image's ID."""
    with tempfile.TemporaryDirectory() as tmp:
        ctx = Path(tmp)
        for name, text in files.items():
            (ctx / name).write_text(text)
            (ctx / name).chmod(0o755)
        (ctx / "Dockerfile").write_text(dockerfile)
        docker(node, "build", "-q", "-t", tag, str(ctx), timeout=600)
    return docker(node, "image", "inspect", "--format", "{{.Id}}", tag).stdout.strip()


def layered(node: LabNode, base: str, tag: str) -> str:
    """``base`` with one more layer (a file), as ``tag``: another image that serves alike."""
    return _build(node, tag, f"FROM {base}\nCOPY candidate.txt /etc/sbk-candidate\n",
                  {"candidate.txt": "one more layer\n"})


def _read(node: LabNode, image: str, path: str) -> str:
    """The text of the file ``path`` in ``image`` on ``node``."""
    docker(node, "create", "--name", "sbk-candidate-read", image)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            docker(node, "cp", f"sbk-candidate-read:{path}", f"{tmp}/file")
            return Path(tmp, "file").read_text()
    finally:
        docker(node, "rm", "sbk-candidate-read", check=False)


def broken_parser(node: LabNode, base: str, tag: str) -> str:
    """``base`` whose hermes tool parser finds no tool call in any reply, as ``tag``."""
    text = _read(node, base, PARSER)
    if PARSES not in text:
        raise LabError(f"{PARSER} in {base} no longer has the line a broken candidate changes: {PARSES!r}")
    return _build(node, tag, f"FROM {base}\nCOPY parser.py {PARSER}\n",
                  {"parser.py": text.replace(PARSES, "if True:  # a parser that no longer parses")})


def wrapped(node: LabNode, base: str, tag: str) -> str:
    """``base`` whose ``vllm`` adds ADDED to every vllm serve, as ``tag``: it serves, with a
    configuration nobody asked for."""
    wrapper = (f"#!/bin/sh\n# a wrapper as community images have: one more argument for vllm serve\n"
               f'if [ "$1" = serve ]; then exec {REAL_VLLM} "$@" {" ".join(ADDED)}; fi\n'
               f'exec {REAL_VLLM} "$@"\n')
    return _build(node, tag, f"FROM {base}\nCOPY real {REAL_VLLM}\nCOPY vllm {VLLM}\n",
                  {"real": _read(node, base, VLLM), "vllm": wrapper})
