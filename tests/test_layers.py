"""The package's shape: no import cycles, each layer imports only below it, no module too long."""

import ast
import re
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "sparkbook"
MAX_LINES = 500


def module_name(path: Path) -> str:
    parts = path.relative_to(PKG.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def type_only(tree: ast.Module) -> set[ast.AST]:
    """The import statements under ``if TYPE_CHECKING:``: names for annotations, never run."""
    return {n for block in ast.walk(tree) if isinstance(block, ast.If)
            and isinstance(block.test, ast.Name) and block.test.id == "TYPE_CHECKING"
            for stmt in block.body for n in ast.walk(stmt)}


def imports(runtime: bool = False) -> dict[str, set[str]]:
    """Every sparkbook module and the sparkbook modules it imports (at any depth of its code;
    ``runtime``: without the imports only type checkers read)."""
    modules = {module_name(p): p for p in PKG.rglob("*.py")}
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for mod, path in modules.items():
        package = mod if path.name == "__init__.py" else mod.rsplit(".", 1)[0]
        tree = ast.parse(path.read_text())
        skip = type_only(tree) if runtime else set()
        for node in ast.walk(tree):
            if node in skip:
                continue
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(anchor + ([base] if base else []))
                subs = [f"{base}.{a.name}" for a in node.names]
                # ``from PKG import module`` imports the module (and runs PKG's __init__, which
                # is PKG's own); only names defined in PKG are an arrow to it
                targets = subs + ([base] if any(s not in modules for s in subs) else [])
            for t in targets:
                if t in modules and t != mod:
                    graph[mod].add(t)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles():
    # a package's __init__ re-exporting its modules is not a cycle of code
    graph = {m: {t for t in ts if not m.startswith(t + ".")} for m, ts in imports().items()}
    assert cycles(graph) == []


@pytest.mark.parametrize("low", ["sparkbook.nodes.remote", "sparkbook.params", "sparkbook.book.verdict", "sparkbook.facts.signatures",
                                 "sparkbook.facts.parsers", "sparkbook.book.tables"])
def test_low_layers_import_no_steps_notebook_or_lab(low):
    graph = imports()
    bad = [t for t in graph[low] if t.startswith(("sparkbook.lab", "sparkbook.steps", "sparkbook.notebook"))]
    assert not bad, f"{low} imports {bad}"


def test_steps_do_not_import_each_other():
    graph = imports()
    for mod, targets in graph.items():
        if mod.startswith("sparkbook.steps."):
            assert not [t for t in targets if t.startswith("sparkbook.steps.")], (mod, targets)


def test_no_module_over_the_limit():
    long = {module_name(p): n for p in PKG.rglob("*.py") if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines: {long}"


def test_the_top_level_holds_only_the_doors():
    """Everything else lives in a folder of its kind (README's Layout names them)."""
    assert {p.stem for p in PKG.glob("*.py")} == {"__init__", "cli", "notebook", "version"}
    folders = {p.name for p in PKG.iterdir() if p.is_dir() and p.name != "__pycache__"}
    readme = (PKG.parent / "README.md").read_text()
    assert not [f for f in folders if f"  {f}/" not in readme], "a folder missing from README's Layout"


# The folders of sparkbook/, lowest first: each imports only from its own layer or below (at run
# time; annotations may name a higher layer's types). The work folders of one layer do not import
# each other, except what is served (serving/) and the benchmark's client (below).
LAYERS = [{"version", "scripts"}, {"book"}, {"params"}, {"nodes"}, {"facts"},
          {"collectives", "distribution", "preflight", "serving", "smoke", "bench", "setup"},
          {"lab"}, {"notebook"}, {"record"}, {"runbook"}, {"steps"}, {"cli", "__init__"}]
WORK = LAYERS[5]
BENCH_CLIENT = {"sparkbook.bench.client", "sparkbook.bench.load", "sparkbook.bench.prompts",
                "sparkbook.bench.records"}  # requests sent, timed and recorded: 06's soak sends them too


def folder(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def test_every_folder_has_a_layer():
    layered = set().union(*LAYERS)
    assert {folder(m) for m in imports()} <= layered, {folder(m) for m in imports()} - layered


def test_folders_import_only_their_own_layer_or_below():
    rank = {f: i for i, layer in enumerate(LAYERS) for f in layer}
    up = sorted(f"{m} -> {t}" for m, ts in imports(runtime=True).items() for t in ts
                if rank[folder(t)] > rank[folder(m)])
    assert not up, "imports that climb a layer:\n" + "\n".join(up)


def test_work_folders_import_each_other_only_for_what_is_served_and_the_bench_client():
    across = sorted(f"{m} -> {t}" for m, ts in imports(runtime=True).items() for t in ts
                    if folder(m) in WORK and folder(t) in WORK and folder(m) != folder(t)
                    and folder(t) != "serving" and t not in BENCH_CLIENT)
    assert not across, "work folders importing each other:\n" + "\n".join(across)


def test_the_layer_rules_see_a_climbing_import():
    """The rules above read the code as it is: a planted back-up arrow is one."""
    graph = imports(runtime=True)
    rank = {f: i for i, layer in enumerate(LAYERS) for f in layer}
    graph["sparkbook.book.verdict"].add("sparkbook.steps.serve")
    assert [m for m, ts in graph.items() for t in ts if rank[folder(t)] > rank[folder(m)]] == [
        "sparkbook.book.verdict"]
    code = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..params import Params\nimport os\n"
    assert [type(n).__name__ for n in type_only(ast.parse(code)) if isinstance(n, ast.ImportFrom)] == ["ImportFrom"]


# The serving plan's builders (sparkbook/serving/commands.py, and the engine's argv in
# serving/vllm.py): what names, starts or fingerprints a serving container. Only the plan calls
# them; everything else reads the plan.
BUILDERS = {"container_name", "ray_container", "serving_container", "container_command", "ray_serve_command",
            "fingerprint", "serve_args", "ray_args", "watched_nodes", "groups", "held_secrets", "mounts",
            "container_env", "serve_env", "service_command", "service_secrets", "service_env"}
PLANNERS = {"sparkbook.serving.commands", "sparkbook.serving.plan", "sparkbook.serving.vllm"}


def builder_uses(mod: str, source: str) -> list[str]:
    """Where ``source`` (module ``mod``) takes a builder from serving/commands.py or the engine's
    module: imported by name, or read as an attribute of the module (as imported or renamed)."""
    found, tree = [], ast.parse(source)
    aliases = {"commands", *(a.asname or a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
                             for a in n.names if a.name in ("commands", "vllm"))}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[-1] in ("commands", "vllm"):
            found += [f"{mod}: imports {a.name}" for a in node.names if a.name in BUILDERS]
        elif (isinstance(node, ast.Attribute) and node.attr in BUILDERS and isinstance(node.value, ast.Name)
              and node.value.id in aliases):
            found.append(f"{mod}: calls {node.value.id}.{node.attr}")
    return found


def test_only_the_serving_plan_builds_container_names_commands_and_fingerprints():
    found = [u for p in PKG.rglob("*.py") if module_name(p) not in PLANNERS
             for u in builder_uses(module_name(p), p.read_text())]
    assert not found, "read these from sparkbook.serving.plan instead:\n" + "\n".join(found)
    planted = "from ..serving.commands import api_key, container_name\nfrom . import commands\ncommands.serve_args(p, n)\n"
    assert builder_uses("m", planted) == ["m: imports container_name", "m: calls commands.serve_args"]
    planted = "from ..serving import vllm as engine\nengine.serve_args(p, n, b)\nengine.API_KEY\n"
    assert builder_uses("m", planted) == ["m: calls engine.serve_args"]


# vLLM's own names as a program reads them: its environment variables, metrics series, process
# titles and patterns, health path, inspection script and argv. They live in serving/vllm.py (the
# engine seam, selected by serving.engine). Outside the folders that drive the engine they are
# knowledge, not control: params/ checks the names an owner writes (VLLM_API_KEY as the key's
# variable), facts/ holds the field's failure lines and vLLM's memory rule, lab/ builds vLLM for
# CPU, scripts/inspect_vllm.py is the script the engine module names.
ENGINE_NAMES = re.compile(r"VLLM_[A-Z_]+|vllm:[a-z_]+|VLLM::|\[v\]llm|^/health$|inspect_vllm|--tensor-parallel-size")
DRIVERS = ("book", "nodes", "collectives", "distribution", "preflight", "serving", "smoke", "bench",
           "record", "runbook", "steps")


def engine_names(source: str) -> list[str]:
    """The engine's names in ``source``'s string constants, docstrings aside (prose may name vLLM)."""
    tree = ast.parse(source)
    docs = {id(n.body[0].value) for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    return [m.group(0) for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
            and id(n) not in docs for m in ENGINE_NAMES.finditer(n.value)]


def test_vllm_names_live_in_the_engine_module():
    found = [f"{module_name(p)}: {name}" for f in DRIVERS for p in (PKG / f).rglob("*.py")
             if p != PKG / "serving" / "vllm.py" for name in engine_names(p.read_text())]
    assert not found, "read these from sparkbook/serving/vllm.py:\n" + "\n".join(found)
    planted = '"""Says VLLM_API_KEY in prose."""\nKEY = "VLLM_API_KEY"\nseries = f"{x}vllm:num_requests_running"\n'
    assert engine_names(planted) == ["VLLM_API_KEY", "vllm:num_requests_running"]
