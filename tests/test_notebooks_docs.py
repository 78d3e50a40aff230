"""The numbered notebooks' own help (issue 16): each has a Troubleshooting section (how long the step
takes in the lab, measured; what a hang looks like; where its logs are) and ends, after its verdict,
with what comes next and what to open when it failed; every notebook it names by file exists."""

import re
from pathlib import Path

import nbformat
import pytest

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
STEPS = sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
LINK = re.compile(r"\]\(([^)\s]+\.ipynb)\)")  # a markdown link to a notebook
NAMED = re.compile(r"(?<![\w/.-])\d\d_\w+\.ipynb")  # a step's notebook named in the text
# `sparkbook run` of the two-node lab, 2026-12-01 (and of the four-node lab for the long steps): the
# times each step's Troubleshooting gives
LAB_TIMES = {"00": ["1.3 s"], "01": ["2.1 s"], "02": ["60 s", "133 s"], "03": ["1.6 s", "42.9 s"],
             "04": ["24 s"], "05": ["34 s", "49 s"], "06": ["49 s", "59 s"], "07": ["32 s", "45 s"],
             "08": ["3.5 s"]}


def problems(path: Path, existing: set[str]) -> list[str]:
    """What is missing or wrong in the help of the numbered notebook ``path``."""
    nb = nbformat.read(path, as_version=4)
    md = [c.source for c in nb.cells if c.cell_type == "markdown"]
    found = []
    verdict = max((i for i, c in enumerate(nb.cells) if c.cell_type == "code" and "ctx.conclude(" in c.source),
                  default=None)
    last = nb.cells[-1]
    if verdict is None:
        found.append("no verdict cell (ctx.conclude)")
    elif last.cell_type != "markdown" or verdict > len(nb.cells) - 2:
        found.append("does not end with a markdown cell after the verdict")
    elif not ("## Next" in last.source and "## When it failed" in last.source):
        found.append("the last cell lacks 'Next' or 'When it failed'")
    else:
        failed, step = last.source.split("## When it failed", 1)[1], int(path.stem[:2])
        if f"verdicts/{path.stem}.json" not in failed:
            found.append("'When it failed' does not name the verdict's file")
        if step and not LINK.search(failed):  # 00's usual cause is SSH, which no step fixes
            found.append("'When it failed' links no notebook that fixes the usual causes")
        after = sorted(p for p in existing if p[:2].isdigit() and int(p[:2]) > step)
        wanted = f"]({after[0]})" if after else "](index.ipynb)"
        if wanted not in last.source.split("## When it failed", 1)[0]:
            found.append(f"'Next' does not link {wanted[2:-1]}")
    trouble = next((s for s in md if s.startswith("## Troubleshooting")), None)
    if trouble is None:
        found.append("no Troubleshooting section")
    else:
        for part in ("**How long.**", "**A hang.**", "**Logs and outputs**", "Measured in the lab"):
            if part not in trouble:
                found.append(f"Troubleshooting lacks {part}")
        found += [f"Troubleshooting lacks the lab's {t}" for t in LAB_TIMES.get(path.stem[:2], [])
                  if t not in trouble]
    for text in md:
        for name in LINK.findall(text) + NAMED.findall(text):
            if name not in existing:
                found.append(f"names a notebook that does not exist: {name}")
    return found


def existing() -> set[str]:
    return {p.name for p in NOTEBOOKS.glob("*.ipynb")}


def test_there_are_steps():
    assert [p.name[:2] for p in STEPS] == sorted(LAB_TIMES)


@pytest.mark.parametrize("path", STEPS, ids=lambda p: p.stem)
def test_every_step_says_how_long_what_a_hang_is_what_next_and_what_when_it_failed(path):
    assert problems(path, existing()) == []


def test_the_front_page_links_only_existing_notebooks():
    index = NOTEBOOKS / "index.ipynb"
    if not index.exists():
        pytest.skip("no front page yet")
    nb = nbformat.read(index, as_version=4)
    named = [n for c in nb.cells if c.cell_type == "markdown" for n in LINK.findall(c.source) + NAMED.findall(c.source)]
    assert not [n for n in named if n not in existing()]


def test_the_check_fails_on_a_notebook_without_its_help(tmp_path):
    """Each kind of defect is caught (else the test above could not fail)."""
    names = existing()
    nb = nbformat.read(NOTEBOOKS / "03_distribute_image.ipynb", as_version=4)

    def check(cells) -> list[str]:
        copy = nbformat.from_dict({**nb, "cells": cells})
        path = tmp_path / "03_distribute_image.ipynb"
        nbformat.write(copy, path)
        return problems(path, names)

    assert check(nb.cells) == []
    assert check(nb.cells[:-1]) == ["does not end with a markdown cell after the verdict"]
    assert check([c for c in nb.cells if not c.source.startswith("## Troubleshooting")]) == [
        "no Troubleshooting section"]
    last = nbformat.from_dict({**nb.cells[-1], "source": nb.cells[-1].source.replace(
        "(04_ray_cluster.ipynb)", "(05_serve.ipynb)")})
    assert check(nb.cells[:-1] + [last]) == ["'Next' does not link 04_ray_cluster.ipynb"]
    broken = nbformat.from_dict({**nb.cells[-1], "source": nb.cells[-1].source + "\n\nSee [x](09_gone.ipynb)."})
    assert check(nb.cells[:-1] + [broken]) == ["names a notebook that does not exist: 09_gone.ipynb"] * 2
    slow = [nbformat.from_dict({**c, "source": c.source.replace("1.6 s", "16 s")}) for c in nb.cells]
    assert check(slow) == ["Troubleshooting lacks the lab's 1.6 s"]
    unlinked = nbformat.from_dict({**nb.cells[-1], "source": re.sub(r"\[([^]]+)\]\([^)]+\)", r"\1", nb.cells[-1].source)
                                   .replace("verdicts/03_distribute_image.json", "verdicts/")})
    assert check(nb.cells[:-1] + [unlinked]) == ["'When it failed' does not name the verdict's file",
                                                 "'When it failed' links no notebook that fixes the usual causes",
                                                 "'Next' does not link 04_ray_cluster.ipynb"]
