"""Every notebook in notebooks/ has its text form beside it (jupytext's percent format, NN_name.py),
holding the same cells, so that a change to a notebook reads as a code diff in review.

notebooks/jupytext.toml pairs them; JupyterLab (jupytext's contents manager) writes both on save,
`jupytext --sync` from a shell."""

import os
import shutil
from itertools import zip_longest
from pathlib import Path

import jupytext
import nbformat
from jupytext.cli import jupytext as jupytext_cli
from papermill.iorw import load_notebook_node
from papermill.parameterize import parameterize_notebook

from sparkbook.book.project import discover

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
CONFIG = "jupytext.toml"
# Cell metadata that is not carried by the .py: the UI state jupytext leaves in the .ipynb by default,
# and the layout hints it reads back from a .py (blank lines between cells).
# source: https://github.com/mwouts/jupytext/blob/0a8b1803c3ebe94371ccf32a4d08df4e4a1ff24d/docs/config.md
NOT_CARRIED = {"autoscroll", "collapsed", "scrolled", "trusted", "execution", "ExecuteTime",
               "cell_marker", "lines_to_next_cell", "lines_to_end_of_cell_marker"}


def _shown(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def _cells(nb) -> list[tuple[str, str, dict]]:
    return [(c.cell_type, c.source, {k: v for k, v in c.metadata.items() if k not in NOT_CARRIED})
            for c in nb.cells]


def _first_line_apart(a: str, b: str) -> tuple[str, str]:
    for x, y in zip_longest(a.splitlines(), b.splitlines(), fillvalue="(no line)"):
        if x != y:
            return x, y
    return a, b  # the same lines, told apart by a final newline


def difference(ipynb: Path) -> str | None:
    """How a notebook and its .py differ (the first differing cell) and the command that fixes it;
    None when they hold the same cells."""
    text = ipynb.with_suffix(".py")
    fix = f"fix: .venv/bin/jupytext --sync {_shown(ipynb)}"
    if not text.exists():
        return f"{_shown(ipynb)} has no {text.name} beside it\n{fix}"
    fix += (f" (the more recently modified of the two wins; to choose: .venv/bin/jupytext --to py:percent "
            f"{_shown(ipynb)} takes the notebook's cells, .venv/bin/jupytext --update --to ipynb {_shown(text)} "
            "the text's)")
    ours = _cells(nbformat.read(ipynb, as_version=4))
    theirs = _cells(jupytext.read(text, fmt="py:percent"))
    for n, (a, b) in enumerate(zip_longest(ours, theirs), start=1):
        if a == b:
            continue
        where = f"{_shown(ipynb)} and {text.name} differ at cell {n}"
        if a is None or b is None:
            kind, source, _ = a or b
            first = source.splitlines()[0] if source else ""
            return f"{where}: a {kind} cell only in {ipynb.name if b is None else text.name}: {first!r}\n{fix}"
        if a[0] != b[0]:
            return f"{where}: {a[0]} in the notebook, {b[0]} in {text.name}\n{fix}"
        if a[1] != b[1]:
            x, y = _first_line_apart(a[1], b[1])
            return f"{where} ({a[0]}), source:\n  notebook: {x!r}\n  {text.name}: {y!r}\n{fix}"
        return f"{where} ({a[0]}), metadata: notebook {a[2]}, {text.name} {b[2]}\n{fix}"
    return None


def problems(folder: Path) -> list[str]:
    """Every notebook without its matching .py, and every .py without its notebook."""
    found = [d for nb in sorted(folder.glob("*.ipynb")) if (d := difference(nb))]
    found += [f"{_shown(py)} has no notebook {py.with_suffix('.ipynb').name} beside it: remove it, or make "
              f"the notebook from it: .venv/bin/jupytext --set-kernel python3 --sync {_shown(py)}"
              for py in sorted(folder.glob("*.py")) if not py.with_suffix(".ipynb").exists()]
    return found


def sync(*paths: Path) -> None:
    """`jupytext --sync PATHS`, in this process (a new one takes seconds to import jupytext)."""
    assert jupytext_cli(["--quiet", "--sync", *map(str, paths)]) == 0


def copy_of(tmp_path: Path, *names: str) -> Path:
    """The named pairs, with the pairing configuration, in a folder of their own, synced (whatever the
    state of the repository's pairs: the first test judges that)."""
    folder = tmp_path / "notebooks"
    folder.mkdir()
    for f in [CONFIG, *(f"{n}.{ext}" for n in names for ext in ("ipynb", "py"))]:
        if (NOTEBOOKS / f).exists():
            shutil.copy2(NOTEBOOKS / f, folder / f)
    sync(*sorted(folder.glob("*.ipynb")))
    return folder


def make_newer(*paths: Path) -> None:
    """The given files become the most recently modified of their folder: `jupytext --sync` reads them."""
    t = max(p.stat().st_mtime for p in paths[0].parent.iterdir()) + 10
    for p in paths:
        os.utime(p, (t, t))


def test_every_notebook_has_its_text_form_with_the_same_cells():
    assert len(list(NOTEBOOKS.glob("*.ipynb"))) >= 9
    assert not problems(NOTEBOOKS), "\n\n".join(problems(NOTEBOOKS))


def test_text_forms_have_no_header_and_are_not_steps():
    texts = sorted(NOTEBOOKS.glob("*.py"))
    assert texts
    for py in texts:  # no jupytext version stamp or kernel to churn in diffs (notebook_metadata_filter)
        head = py.read_text()[:400]
        assert not head.startswith("# ---") and "jupytext_version" not in head and "kernelspec" not in head, py
    assert discover(NOTEBOOKS) == sorted(p for p in NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))


def test_a_text_form_edited_alone_is_named_with_its_fix(tmp_path):
    folder = copy_of(tmp_path, "01_preflight")
    nb, py = folder / "01_preflight.ipynb", folder / "01_preflight.py"
    shown = nbformat.read(nb, as_version=4)
    shown.cells[2].metadata.jupyter = {"source_hidden": True}  # set in JupyterLab, say
    nbformat.write(shown, nb)
    sync(nb)
    assert problems(folder) == []
    py.write_text(py.read_text().replace("\nrun_dir = None\n", "\nrun_dir = 'outputs/mine'\n", 1))
    make_newer(py)

    [message] = problems(folder)
    assert "01_preflight.ipynb and 01_preflight.py differ at cell 2 (code), source:" in message
    assert "notebook: 'run_dir = None'" in message and "01_preflight.py: \"run_dir = 'outputs/mine'\"" in message
    assert f"jupytext --sync {nb}" in message

    sync(nb)  # the command the message gives: the .py is newer, so it wins
    assert problems(folder) == []
    after = load_notebook_node(str(nb))  # as papermill reads it
    assert "run_dir = 'outputs/mine'" in after.cells[1].source
    assert after.metadata.kernelspec.name == "python3"  # kept from the .ipynb, not in the .py
    assert after.cells[2].metadata.jupyter == {"source_hidden": True}  # not lost on the way (jupytext.toml)
    # the parameters cell is still tagged, so papermill injects right after it
    injected = parameterize_notebook(after, {"params_file": "parameters/lab.yaml"})
    assert injected.cells[1].metadata.tags == ["parameters"]
    assert injected.cells[2].metadata.tags == ["injected-parameters"]


def test_a_notebook_edited_alone_is_named_with_its_fix(tmp_path):
    folder = copy_of(tmp_path, "08_teardown")
    nb, py = folder / "08_teardown.ipynb", folder / "08_teardown.py"
    edited = nbformat.read(nb, as_version=4)
    edited.cells.append(nbformat.v4.new_markdown_cell("## Next\nNothing: the nodes are clean."))
    edited.cells[1].metadata.tags = []  # papermill would no longer find the parameters cell
    nbformat.write(edited, nb)
    make_newer(nb)

    [message] = problems(folder)
    assert "08_teardown.ipynb and 08_teardown.py differ at cell 2 (code), metadata:" in message
    assert f"jupytext --sync {nb}" in message
    edited.cells[1].metadata.tags = ["parameters"]
    nbformat.write(edited, nb)
    make_newer(nb)
    [message] = problems(folder)
    n = len(edited.cells)
    assert f"differ at cell {n}: a markdown cell only in 08_teardown.ipynb: '## Next'" in message

    sync(nb)  # the notebook is newer: its cells go to the .py
    assert problems(folder) == []
    assert py.read_text().endswith("# ## Next\n# Nothing: the nodes are clean.\n")


def test_saving_in_jupyterlab_writes_both_files(tmp_path):
    """JupyterLab saves through jupytext's contents manager (installed with jupytext): the .py follows
    the notebook on every save, and a save that changes no cell leaves the .py byte for byte."""
    folder = copy_of(tmp_path, "08_teardown")
    nb, py = folder / "08_teardown.ipynb", folder / "08_teardown.py"
    text = py.read_bytes()
    cm = jupytext.TextFileContentsManager(root_dir=str(folder))
    model = cm.get(nb.name)
    cm.save(model, nb.name)
    assert py.read_bytes() == text
    assert _cells(nbformat.read(nb, as_version=4)) == _cells(model["content"])

    model["content"].cells[0].source += "\nEdited in JupyterLab."
    cm.save(model, nb.name)
    assert "# Edited in JupyterLab.\n" in py.read_text()
    assert problems(folder) == []


def test_a_pair_missing_either_file_is_named(tmp_path):
    folder = copy_of(tmp_path, "00_inventory", "01_preflight")
    (folder / "00_inventory.py").unlink()
    (folder / "01_preflight.ipynb").unlink()
    assert problems(folder) == [
        f"{folder / '00_inventory.ipynb'} has no 00_inventory.py beside it\n"
        f"fix: .venv/bin/jupytext --sync {folder / '00_inventory.ipynb'}",
        f"{folder / '01_preflight.py'} has no notebook 01_preflight.ipynb beside it: remove it, or make the "
        f"notebook from it: .venv/bin/jupytext --set-kernel python3 --sync {folder / '01_preflight.py'}",
    ]


def test_sync_rewrites_neither_file(tmp_path):
    """`jupytext --sync` on pairs in step changes no byte, whichever file is newer: the .ipynb is not
    reformatted and the .py gains no header on every sync."""
    notebooks = sorted(NOTEBOOKS.glob("*.ipynb"))
    # in nbformat's own layout, as jupytext (and JupyterLab) write them: a sync that takes a .py's
    # cells rewrites only what changed
    assert [nb.name for nb in notebooks if nbformat.writes(nbformat.read(nb, as_version=4)) + "\n"
            != nb.read_text()] == []
    folder = copy_of(tmp_path, *(nb.stem for nb in notebooks))
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    for newer in ("py", "ipynb"):
        make_newer(*folder.glob(f"*.{newer}"))
        sync(*sorted(folder.glob("*.ipynb")))
        assert {p.name: p.read_bytes() for p in folder.iterdir()} == before, f"after a sync from the .{newer}"
